//! Suspended sessions wake on use when created with `auto_resume`: exec, files, processes
//! and watch resume them first, once however many calls arrive together. Without it such a
//! call answers 409 `session_suspended`, saying how to resume.

use serde_json::json;

use crate::harness::{Server, assert_error, error_of};

async fn suspended_session(server: &Server, auto_resume: bool) -> String {
    let (status, session) = server.call("POST", "/v1/sessions", Some(json!({ "auto_resume": auto_resume }))).await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    server.write_file(&id, "/tmp/kept", "from before").await;
    let (status, suspended) = server.act(&id, "suspend", json!({})).await;
    assert_eq!((status, suspended["state"].as_str()), (200, Some("suspended")), "{suspended}");
    id
}

/// How many times the session was moved into `restoring`.
async fn restores(server: &Server, id: &str) -> usize {
    let (_, events) = server.call("GET", &format!("/v1/sessions/{id}/events"), None).await;
    events["events"].as_array().unwrap().iter().filter(|e| e["to_state"] == "restoring").count()
}

#[tokio::test]
async fn an_exec_on_a_suspended_auto_resume_session_resumes_it_and_runs() {
    let server = Server::start().await;
    let id = suspended_session(&server, true).await;
    let old_sandboxes = server.sim.sandboxes().len();
    let (status, ran) = server.exec(&id, &["cat", "/tmp/kept"]).await;
    assert_eq!((status, ran["stdout"].as_str()), (200, Some("from before")), "{ran}");
    let session = server.get(&id).await;
    assert_eq!(session["state"], "running", "{session}");
    assert_eq!(server.sim.sandboxes().len(), old_sandboxes + 1, "a new sandbox");
    let (_, events) = server.call("GET", &format!("/v1/sessions/{id}/events"), None).await;
    assert!(events["events"].as_array().unwrap().iter().any(|e| e["kind"] == "auto_resume"), "{events}");
}

#[tokio::test]
async fn files_and_processes_wake_it_too() {
    let server = Server::start().await;
    let id = suspended_session(&server, true).await;
    assert_eq!(server.read_file(&id, "/tmp/kept").await, "from before");
    server.act(&id, "suspend", json!({})).await;
    let (status, processes) = server.call("GET", &format!("/v1/sessions/{id}/processes"), None).await;
    assert_eq!(status, 200, "{processes}");
    assert_eq!(server.get(&id).await["state"], "running");
    assert_eq!(restores(&server, &id).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_resume_it_once() {
    let server = Server::start().await;
    let id = suspended_session(&server, true).await;
    let calls = (0..8).map(|i| {
        let (server, id) = (&server, id.clone());
        async move {
            if i % 2 == 0 {
                server.exec(&id, &["echo", "woke"]).await
            } else {
                server.call("GET", &format!("/v1/sessions/{id}/files/content?path=/tmp/kept"), None).await
            }
        }
    });
    for (status, reply) in futures::future::join_all(calls).await {
        assert_eq!(status, 200, "{reply}");
        assert!(reply["stdout"] == "woke\n" || reply == "from before", "{reply}");
    }
    assert_eq!(restores(&server, &id).await, 1, "resumed once");
}

#[tokio::test]
async fn without_auto_resume_calls_answer_session_suspended_saying_how_to_resume() {
    let server = Server::start().await;
    let id = suspended_session(&server, false).await;
    let calls = [
        server.exec(&id, &["true"]).await,
        server.call("GET", &format!("/v1/sessions/{id}/files/content?path=/tmp/kept"), None).await,
        server.call("GET", &format!("/v1/sessions/{id}/processes"), None).await,
    ];
    for reply in &calls {
        assert_error(reply, 409, "session_suspended");
        let message = error_of(&reply.1).1;
        assert!(message.contains(&format!("POST /v1/sessions/{id}/resume")), "{message}");
        assert!(message.contains(&format!("space session resume {id}")), "{message}");
    }
    assert_eq!(server.get(&id).await["state"], "suspended", "nothing resumed it");
    // Turned on later, it applies from the next call.
    let (status, _) = server.call("PATCH", &format!("/v1/sessions/{id}"), Some(json!({ "auto_resume": true }))).await;
    assert_eq!(status, 200);
    assert_eq!(server.exec(&id, &["cat", "/tmp/kept"]).await.1["stdout"], "from before");
}

#[tokio::test]
async fn a_paused_session_is_not_resumed_and_says_how() {
    let server = Server::start().await;
    let (_, session) = server.call("POST", "/v1/sessions", Some(json!({ "auto_resume": true }))).await;
    let id = session["id"].as_str().unwrap().to_owned();
    server.act(&id, "pause", json!({})).await;
    let reply = server.exec(&id, &["true"]).await;
    assert_error(&reply, 409, "invalid_state");
    assert!(error_of(&reply.1).1.contains("resume"), "{}", reply.1);
    assert_eq!(server.get(&id).await["state"], "paused", "a pause is the user's: it stays");
}

#[tokio::test]
async fn a_wake_over_the_tenants_quota_is_refused_and_leaves_it_suspended() {
    let server = Server::start().await;
    let key = server.tenant_key("acme").await;
    let (status, _) = server.call("PUT", "/v1/tenants/acme/quota", Some(json!({ "max_cpus": 1 }))).await;
    assert_eq!(status, 200);
    let (_, session) = server.call_as(&key, "POST", "/v1/sessions", Some(json!({ "auto_resume": true }))).await;
    let id = session["id"].as_str().unwrap().to_owned();
    assert_eq!(server.call_as(&key, "POST", &format!("/v1/sessions/{id}/suspend"), None).await.0, 200);
    server.session_as(&key).await;

    let body = json!({ "cmd": ["true"] });
    let reply = server.call_as(&key, "POST", &format!("/v1/sessions/{id}/exec"), Some(body)).await;
    assert_error(&reply, 429, "quota_exceeded");
    let (_, session) = server.call_as(&key, "GET", &format!("/v1/sessions/{id}"), None).await;
    assert_eq!(session["state"], "suspended", "{session}");
    let (_, events) = server.call_as(&key, "GET", &format!("/v1/sessions/{id}/events"), None).await;
    assert!(!events["events"].as_array().unwrap().iter().any(|e| e["kind"] == "auto_resume"), "{events}");
}

/// `auto_resume_max_age_secs`: an auto-resume sets the session to end that long after it (E2B's
/// timeout after an auto-resume); without it the maximum age stays as it was.
#[tokio::test]
async fn an_auto_resume_sets_the_maximum_age_it_was_asked_to() {
    let server = Server::start().await;
    let lifetime = json!({ "auto_resume": true, "max_age_secs": 3600, "on_max_age": "suspend" });
    let mut renewing = lifetime.clone();
    renewing["auto_resume_max_age_secs"] = json!(900);
    for (body, expected) in [(renewing, 900), (lifetime, 3600)] {
        let (status, session) = server.call("POST", "/v1/sessions", Some(body)).await;
        assert_eq!(status, 201, "{session}");
        let id = session["id"].as_str().unwrap();
        server.act(id, "suspend", json!({})).await;
        let (status, ran) = server.exec(id, &["true"]).await;
        assert_eq!(status, 200, "{ran}");
        let session = server.get(id).await;
        let max_age = session["lifetime"]["max_age_secs"].as_u64().unwrap();
        // Counted from creation: the seconds the session has lived are added (a test runs
        // far under a minute).
        assert!((expected..expected + 60).contains(&max_age), "{expected}: {session}");
        assert_eq!(session["state"], "running", "{session}");
    }
}

#[tokio::test]
async fn auto_resume_max_age_is_changed_turned_off_and_checked_like_the_others() {
    let server = Server::start().await;
    let (_, session) = server.call("POST", "/v1/sessions", Some(json!({ "auto_resume_max_age_secs": 300 }))).await;
    let id = session["id"].as_str().unwrap();
    assert_eq!(session["lifetime"]["auto_resume_max_age_secs"], 300, "{session}");
    let path = format!("/v1/sessions/{id}");
    let (status, patched) = server.call("PATCH", &path, Some(json!({ "auto_resume_max_age_secs": 0 }))).await;
    assert_eq!(status, 200, "{patched}");
    assert!(patched["lifetime"].get("auto_resume_max_age_secs").is_none(), "turned off: {patched}");
    let too_long = json!({ "auto_resume_max_age_secs": 400 * 24 * 3600 });
    let reply = server.call("PATCH", &path, Some(too_long)).await;
    assert_error(&reply, 400, "bad_request");
    assert!(error_of(&reply.1).1.contains("auto_resume_max_age_secs must be between 1 and"), "{}", reply.1);
}
