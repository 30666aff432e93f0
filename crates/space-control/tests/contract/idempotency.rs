//! `Idempotency-Key`: a retry replays the first response; the same key on another request
//! is 409 `idempotency_conflict`; keys are per tenant; 5xx answers are not recorded.

use serde_json::Value;
use space_node_sim::Op;

use crate::harness::{Server, assert_error};

/// `POST path` with `body` under `Idempotency-Key: key`: (status, body, replayed).
async fn post(server: &Server, key: &str, path: &str, body: &str, idempotency: &str) -> (u16, Value, bool) {
    let headers = [("idempotency-key", idempotency)];
    let (status, body, headers) = server.send(key, "POST", path, Some(body.to_owned()), &headers).await;
    let replayed = headers.get("idempotent-replayed").is_some_and(|v| v == "true");
    (status, body, replayed)
}

async fn session_count(server: &Server, key: &str) -> usize {
    let (_, list) = server.call_as(key, "GET", "/v1/sessions?all=true", None).await;
    list["sessions"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_retry_replays_the_first_response_and_another_request_conflicts() {
    let server = Server::start().await;
    let admin = server.admin.clone();
    let (status, first, replayed) = post(&server, &admin, "/v1/sessions", "{}", "k1").await;
    assert_eq!((status, replayed), (201, false), "{first}");
    let (status, second, replayed) = post(&server, &admin, "/v1/sessions", "{}", "k1").await;
    assert_eq!((status, replayed), (201, true), "{second}");
    assert_eq!(first, second, "the very first response");

    let (status, other_body, _) = post(&server, &admin, "/v1/sessions", r#"{"cpus":2}"#, "k1").await;
    assert_error(&(status, other_body), 409, "idempotency_conflict");
    let id = first["id"].as_str().unwrap();
    let (status, other_path, _) = post(&server, &admin, &format!("/v1/sessions/{id}/pause"), "{}", "k1").await;
    assert_error(&(status, other_path), 409, "idempotency_conflict");
    assert_eq!(session_count(&server, &admin).await, 1);
    assert_eq!(server.get(id).await["state"], "running", "the conflicting pause did not run");

    let too_long = "k".repeat(300);
    let (status, body, _) = post(&server, &admin, "/v1/sessions", "{}", &too_long).await;
    assert_error(&(status, body), 400, "bad_request");
}

#[tokio::test]
async fn keys_belong_to_their_tenant() {
    let server = Server::start().await;
    let admin = server.admin.clone();
    let other = server.tenant_key("other").await;
    let (_, mine, _) = post(&server, &admin, "/v1/sessions", "{}", "shared").await;
    let (status, theirs, replayed) = post(&server, &other, "/v1/sessions", "{}", "shared").await;
    assert_eq!((status, replayed), (201, false), "{theirs}");
    assert_ne!(mine["id"], theirs["id"], "another tenant never gets the admin's response");
    assert_eq!(session_count(&server, &other).await, 1);
}

#[tokio::test]
async fn concurrent_requests_with_one_key_run_once() {
    let server = Server::start().await;
    let admin = server.admin.clone();
    let replies = futures::future::join_all((0..8).map(|_| post(&server, &admin, "/v1/sessions", "{}", "same"))).await;
    let created: Vec<&Value> = replies.iter().filter(|(status, ..)| *status == 201).map(|(_, body, _)| body).collect();
    for (status, body, _) in &replies {
        assert!(
            *status == 201 || (*status == 409 && body["error"]["code"] == "idempotency_conflict"),
            "{status} {body}"
        );
    }
    assert!(!created.is_empty(), "{replies:?}");
    assert!(created.iter().all(|b| b["id"] == created[0]["id"]), "one session for every 201: {created:?}");
    assert_eq!(session_count(&server, &admin).await, 1);
}

/// A 5xx is not recorded, so the retry runs again (and here succeeds).
#[tokio::test]
async fn a_server_error_is_not_replayed() {
    let server = Server::start().await;
    let admin = server.admin.clone();
    server.sim.fail_next(Op::StartSandbox, 1);
    let (status, failed, _) = post(&server, &admin, "/v1/sessions", "{}", "retry-me").await;
    assert_error(&(status, failed), 503, "sandbox_unavailable");
    let (status, created, replayed) = post(&server, &admin, "/v1/sessions", "{}", "retry-me").await;
    assert_eq!((status, replayed, created["state"].as_str()), (201, false, Some("running")), "{created}");
}

/// A new API key is shown once: a retry does not replay it, nor make another.
#[tokio::test]
async fn a_response_with_a_secret_is_not_replayed() {
    let server = Server::start().await;
    let admin = server.admin.clone();
    let (status, created, _) = post(&server, &admin, "/v1/keys", r#"{"tenant":"t"}"#, "key-once").await;
    assert_eq!(status, 201, "{created}");
    let (status, again, _) = post(&server, &admin, "/v1/keys", r#"{"tenant":"t"}"#, "key-once").await;
    assert_error(&(status, again.clone()), 409, "idempotency_conflict");
    assert!(!again.to_string().contains(created["key"].as_str().unwrap()), "{again}");
    let (status, _) = server.call_as(created["key"].as_str().unwrap(), "GET", "/v1/sessions", None).await;
    assert_eq!(status, 200, "the key the first request made works");
}

#[tokio::test]
async fn lifecycle_calls_replay_too() {
    let server = Server::start().await;
    let admin = server.admin.clone();
    let id = server.session().await;
    let path = format!("/v1/sessions/{id}/snapshots");
    let (status, first, _) = post(&server, &admin, &path, r#"{"kind":"disk"}"#, "snap").await;
    assert_eq!(status, 201, "{first}");
    let (status, second, replayed) = post(&server, &admin, &path, r#"{"kind":"disk"}"#, "snap").await;
    assert_eq!((status, replayed, &second["id"]), (201, true, &first["id"]), "{second}");
    assert_eq!(server.sim.snapshots().len(), 1, "one snapshot taken");

    let headers = [("idempotency-key", "destroy")];
    let (status, first, _) = server.send(&admin, "DELETE", &format!("/v1/sessions/{id}"), None, &headers).await;
    let (again, body, replayed) = server.send(&admin, "DELETE", &format!("/v1/sessions/{id}"), None, &headers).await;
    assert_eq!((status, again), (200, 200), "{first} {body}");
    assert!(replayed.get("idempotent-replayed").is_some(), "{body}");
}

#[tokio::test]
async fn a_create_a_crash_interrupted_is_finished_by_its_retry_not_done_twice() {
    let server = Server::start().await;
    let admin = server.admin.clone();
    server.sim.hang_next(Op::StartSandbox);
    let (url, key) = (format!("{}/v1/sessions", server.url), admin.clone());
    let in_flight = tokio::spawn(async move {
        let request = reqwest::Client::new().post(url).bearer_auth(key).header("idempotency-key", "k-crash");
        let _ = request.header("content-type", "application/json").body("{}").send().await;
    });
    for _ in 0..500 {
        if session_count(&server, &admin).await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (_, list) = server.call("GET", "/v1/sessions", None).await;
    let id = list["sessions"][0]["id"].clone();
    assert_eq!(list["sessions"][0]["state"], "creating", "{list}");

    let server = server.stop().start().await;
    in_flight.abort();
    let (status, body, _) = post(&server, &admin, "/v1/sessions", "{}", "k-crash").await;
    assert_eq!((status, &body["id"], body["state"].as_str()), (201, &id, Some("running")), "{body}");
    assert_eq!(session_count(&server, &admin).await, 1, "the retry did not create a second session");
    let (status, again, replayed) = post(&server, &admin, "/v1/sessions", "{}", "k-crash").await;
    assert_eq!((status, &again["id"], replayed), (201, &id, true), "later retries replay it");
    // Another request under the interrupted key is still refused.
    let (status, other, _) = post(&server, &admin, "/v1/sessions", r#"{"cpus":2}"#, "k-crash").await;
    assert_error(&(status, other), 409, "idempotency_conflict");
}
