//! The session state machine: every allowed transition works and leaves the node as it says;
//! every disallowed one answers the documented code (409 `invalid_state`, 404 once
//! destroyed); fork, restore, suspend and resume keep their books.

use serde_json::{Value, json};

use crate::harness::{Server, assert_error, error_of};

const LIFECYCLE: [&str; 4] = ["pause", "resume", "suspend", "snapshots"];

fn sandbox_of(session: &Value) -> String {
    session["sandbox_id"].as_str().unwrap_or_else(|| panic!("no sandbox: {session}")).to_owned()
}

/// The node's view of a sandbox: (alive, paused), or `None` if it has none of that id.
fn on_node(server: &Server, sandbox: &str) -> Option<(bool, bool)> {
    server.sim.sandboxes().into_iter().find(|s| s.id.as_str() == sandbox).map(|s| (s.alive, s.paused))
}

#[tokio::test]
async fn pause_and_resume_freeze_and_thaw_in_place() {
    let server = Server::start().await;
    let id = server.session().await;
    let sandbox = sandbox_of(&server.get(&id).await);
    for _ in 0..2 {
        let (status, session) = server.act(&id, "pause", json!({})).await;
        assert_eq!((status, session["state"].as_str()), (200, Some("paused")), "idempotent: {session}");
        assert_eq!(on_node(&server, &sandbox), Some((true, true)));
    }
    assert_error(&server.exec(&id, &["true"]).await, 409, "invalid_state");
    for _ in 0..2 {
        let (status, session) = server.act(&id, "resume", json!({})).await;
        assert_eq!((status, session["state"].as_str()), (200, Some("running")), "idempotent: {session}");
        assert_eq!(sandbox_of(&session), sandbox, "the same sandbox");
        assert_eq!(on_node(&server, &sandbox), Some((true, false)));
    }
    let (_, events) = server.call("GET", &format!("/v1/sessions/{id}/events"), None).await;
    let states: Vec<&str> =
        events["events"].as_array().unwrap().iter().filter_map(|e| e["to_state"].as_str()).collect();
    assert_eq!(states, ["creating", "running", "paused", "running"], "{events}");
}

#[tokio::test]
async fn snapshots_of_running_and_paused_sessions_leave_them_as_they_were() {
    let server = Server::start().await;
    let id = server.session().await;
    let disk = server.snapshot(&id, "disk").await;
    server.act(&id, "pause", json!({})).await;
    server.snapshot(&id, "disk").await;
    server.snapshot(&id, "full").await;
    let sandbox = sandbox_of(&server.get(&id).await);
    assert_eq!(
        (server.get(&id).await["state"].as_str(), on_node(&server, &sandbox)),
        (Some("paused"), Some((true, true)))
    );

    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await;
    let kinds: Vec<&str> = list["snapshots"].as_array().unwrap().iter().filter_map(|s| s["kind"].as_str()).collect();
    assert_eq!(kinds, ["disk", "disk", "full"], "{list}");
    let path = format!("/v1/sessions/{id}/snapshots/{disk}");
    assert_eq!(server.call("DELETE", &path, None).await.0, 204);
    assert_error(&server.call("DELETE", &path, None).await, 404, "snapshot_not_found");
    assert_eq!(server.sim.snapshots().len(), 2, "deleted on the node too");
}

#[tokio::test]
async fn suspend_frees_the_sandbox_and_resume_brings_the_session_back() {
    let server = Server::start().await;
    let id = server.session().await;
    server.write_file(&id, "/tmp/kept", "before suspend").await;
    let old = sandbox_of(&server.get(&id).await);
    for _ in 0..2 {
        let (status, session) = server.act(&id, "suspend", json!({})).await;
        assert_eq!((status, session["state"].as_str()), (200, Some("suspended")), "idempotent: {session}");
    }
    assert_eq!(on_node(&server, &old), None, "the sandbox is gone from the node");
    for action in ["pause", "snapshots", "fork"] {
        assert_error(&server.act(&id, action, json!({})).await, 409, "invalid_state");
    }
    // Created without auto_resume: the call says how to resume it (auto_resume.rs).
    assert_error(&server.exec(&id, &["true"]).await, 409, "session_suspended");
    let (status, session) = server.act(&id, "resume", json!({})).await;
    assert_eq!((status, session["state"].as_str()), (200, Some("running")), "{session}");
    assert_ne!(sandbox_of(&session), old, "a new sandbox");
    assert_eq!(server.read_file(&id, "/tmp/kept").await, "before suspend");

    // A paused session suspends too, and comes back running.
    server.act(&id, "pause", json!({})).await;
    assert_eq!(server.act(&id, "suspend", json!({})).await.1["state"], "suspended");
    assert_eq!(server.act(&id, "resume", json!({})).await.1["state"], "running");
    let full = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await.1;
    assert_eq!(full["snapshots"].as_array().map(Vec::len), Some(2), "one full snapshot per suspend: {full}");
}

#[tokio::test]
async fn restore_returns_to_the_snapshot_in_a_new_sandbox_from_any_live_state() {
    let server = Server::start().await;
    let id = server.session().await;
    server.write_file(&id, "/tmp/f", "one").await;
    let snap = server.snapshot(&id, "disk").await;
    for before in ["running", "paused", "suspended"] {
        server.write_file(&id, "/tmp/f", "two").await;
        match before {
            "paused" => assert_eq!(server.act(&id, "pause", json!({})).await.0, 200),
            "suspended" => assert_eq!(server.act(&id, "suspend", json!({})).await.0, 200),
            _ => {}
        }
        let old = server.get(&id).await["sandbox_id"].as_str().map(str::to_owned);
        let (status, session) = server.act(&id, "restore", json!({ "snapshot": snap })).await;
        assert_eq!((status, session["state"].as_str()), (200, Some("running")), "from {before}: {session}");
        assert_ne!(session["sandbox_id"].as_str().map(str::to_owned), old, "from {before}");
        assert_eq!(server.read_file(&id, "/tmp/f").await, "one", "from {before}");
    }
    // The sandboxes it replaced are removed (off the request's path).
    wait_until(|| server.sim.sandboxes().iter().filter(|s| s.session.is_some()).count() == 1).await;
}

#[tokio::test]
async fn fork_makes_independent_sessions_from_now_or_a_snapshot() {
    let server = Server::start().await;
    let parent = server.session().await;
    server.write_file(&parent, "/tmp/f", "parent").await;
    let (status, forks) = server.act(&parent, "fork", json!({ "count": 3 })).await;
    assert_eq!(status, 201, "{forks}");
    let forks: Vec<String> =
        forks["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().into()).collect();
    assert_eq!(forks.len(), 3);
    let mut sandboxes = vec![sandbox_of(&server.get(&parent).await)];
    for fork in &forks {
        let session = server.get(fork).await;
        assert_eq!(session["state"], "running", "{session}");
        sandboxes.push(sandbox_of(&session));
        assert_eq!(server.read_file(fork, "/tmp/f").await, "parent");
    }
    sandboxes.sort();
    sandboxes.dedup();
    assert_eq!(sandboxes.len(), 4, "each its own sandbox");
    server.write_file(&forks[0], "/tmp/f", "fork").await;
    assert_eq!(server.read_file(&parent, "/tmp/f").await, "parent", "a fork's writes stay in it");

    // From a named snapshot, also while the parent is suspended (which cannot snapshot now).
    let snap = server.snapshot(&parent, "disk").await;
    assert_eq!(server.act(&parent, "suspend", json!({})).await.0, 200);
    assert_error(&server.act(&parent, "fork", json!({})).await, 409, "invalid_state");
    let (status, from) = server.act(&parent, "fork", json!({ "from": snap })).await;
    assert_eq!((status, from["sessions"][0]["state"].as_str()), (201, Some("running")), "{from}");
}

/// A snapshot taken with `outlives_session` stays when its session is destroyed (the others
/// go with it): it is listed, new sessions are forked from it, and deleting it ends it.
#[tokio::test]
async fn a_snapshot_that_outlives_its_session_is_forked_from_after_it_until_deleted() {
    let server = Server::start().await;
    let id = server.session().await;
    server.write_file(&id, "/tmp/f", "kept").await;
    let (status, kept) = server.act(&id, "snapshots", json!({ "kind": "disk", "outlives_session": true })).await;
    assert_eq!((status, kept["outlives_session"].as_bool()), (201, Some(true)), "{kept}");
    let kept = kept["id"].as_str().unwrap().to_owned();
    let other = server.snapshot(&id, "disk").await;
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).await.0, 200);

    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await;
    let listed: Vec<&str> = list["snapshots"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(listed, [kept.as_str()], "{list}");
    let on_node: Vec<String> = server.sim.snapshots().iter().map(|s| s.as_str().to_owned()).collect();
    assert_eq!(on_node, [kept.as_str()], "only the kept snapshot is left on the node");
    assert_error(&server.act(&id, "fork", json!({ "from": other })).await, 404, "snapshot_not_found");
    assert_error(&server.act(&id, "fork", json!({})).await, 404, "not_found");

    let (status, forks) = server.act(&id, "fork", json!({ "from": kept })).await;
    assert_eq!((status, forks["sessions"][0]["state"].as_str()), (201, Some("running")), "{forks}");
    let child = forks["sessions"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(server.read_file(&child, "/tmp/f").await, "kept");

    let path = format!("/v1/sessions/{id}/snapshots/{kept}");
    assert_eq!(server.call("DELETE", &path, None).await.0, 204);
    assert!(server.sim.snapshots().is_empty(), "{:?}", server.sim.snapshots());
    assert_error(&server.act(&id, "fork", json!({ "from": kept })).await, 404, "snapshot_not_found");
    assert_eq!(server.read_file(&child, "/tmp/f").await, "kept", "the fork does not depend on it");
}

/// Snapshots that outlive their sessions count against no session's disk limit once it is
/// gone, so a tenant keeps a bounded number of them.
#[tokio::test]
async fn a_tenant_keeps_a_bounded_number_of_snapshots_beyond_their_sessions() {
    let server = Server::start().await;
    let id = server.session().await;
    let keep = json!({ "kind": "disk", "outlives_session": true });
    for n in 0..100 {
        let (status, body) = server.act(&id, "snapshots", keep.clone()).await;
        assert_eq!(status, 201, "snapshot {n}: {body}");
    }
    let refused = server.act(&id, "snapshots", keep).await;
    assert_error(&refused, 429, "quota_exceeded");
    let message = error_of(&refused.1).1;
    assert!(message.contains("100 snapshots that outlive their sessions") && message.contains("DELETE"), "{message}");
    assert_eq!(server.act(&id, "snapshots", json!({ "kind": "disk" })).await.0, 201, "others are not bounded");
}

#[tokio::test]
async fn destroy_works_from_every_state_and_ends_everything() {
    let server = Server::start().await;
    let mut sessions = Vec::new();
    for state in ["running", "paused", "suspended", "failed"] {
        let id = server.session().await;
        server.snapshot(&id, "disk").await;
        match state {
            "paused" => assert_eq!(server.act(&id, "pause", json!({})).await.0, 200),
            "suspended" => assert_eq!(server.act(&id, "suspend", json!({})).await.0, 200),
            "failed" => {
                let sandbox = sandbox_of(&server.get(&id).await);
                assert!(server.sim.kill(&sandbox.parse().unwrap()));
                server.wait_for_state(&id, "failed").await;
            }
            _ => {}
        }
        sessions.push(id);
    }
    for id in &sessions {
        for _ in 0..2 {
            let (status, session) = server.call("DELETE", &format!("/v1/sessions/{id}"), None).await;
            assert_eq!((status, session["state"].as_str()), (200, Some("destroyed")), "idempotent: {session}");
        }
        for action in LIFECYCLE.into_iter().chain(["restore", "fork"]) {
            let body = match action {
                "restore" => json!({ "snapshot": "snap_aaaaaaaaaaaaaaaaaaaa" }),
                _ => json!({}),
            };
            assert_error(&server.act(id, action, body).await, 404, "not_found");
        }
        // Exec says what state the session is in instead (docs/api.md promises 404 only
        // for the lifecycle calls).
        assert_error(&server.exec(id, &["true"]).await, 409, "invalid_state");
        let (status, session) = server.call("GET", &format!("/v1/sessions/{id}"), None).await;
        assert_eq!((status, session["state"].as_str()), (200, Some("destroyed")), "still readable: {session}");
    }
    assert!(server.sim.sandboxes().is_empty(), "no sandbox left: {:?}", server.sim.sandboxes());
    assert!(server.sim.snapshots().is_empty(), "no snapshot left: {:?}", server.sim.snapshots());
    for id in &sessions {
        assert!(!server.sim.has_egress(&id.parse().unwrap()), "the gateway forgot {id}");
    }
}

/// A session whose init process died has failed: it takes destroy, and a restore from its
/// snapshots, nothing else.
#[tokio::test]
async fn a_failed_session_refuses_every_lifecycle_call_but_a_restore() {
    let server = Server::start().await;
    let id = server.session().await;
    let snap = server.snapshot(&id, "disk").await;
    assert!(server.sim.kill(&sandbox_of(&server.get(&id).await).parse().unwrap()));
    let session = server.wait_for_state(&id, "failed").await;
    assert!(session["error"].as_str().is_some_and(|e| e.starts_with("sandbox_exited:")), "{session}");
    for action in LIFECYCLE.into_iter().chain(["exec", "fork"]) {
        let body = if action == "exec" { json!({ "cmd": ["true"] }) } else { json!({}) };
        assert_error(&server.act(&id, action, body).await, 409, "invalid_state");
    }
    // Its snapshots bring it back.
    let (status, restored) = server.act(&id, "restore", json!({ "snapshot": snap })).await;
    assert_eq!((status, restored["state"].as_str()), (200, Some("running")), "{restored}");
    assert_eq!(server.exec(&id, &["echo", "back"]).await.1["stdout"], "back\n");
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).await.0, 200);
}

/// Waits for `done` to hold: for work the control plane does off the request. Bounded.
pub async fn wait_until(done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the condition never held");
}

/// A graceful stop (SIGTERM) waits for the operations under way: a create answered 202 is
/// finished before the server ends, not left for recovery at the next start.
#[tokio::test]
async fn a_graceful_stop_finishes_the_operations_under_way() {
    let mut server = Server::start().await;
    let held = server.sim.hold_next(space_node_sim::Op::StartSandbox);
    let (status, created) = server.call("POST", "/v1/sessions?wait=false", Some(json!({}))).await;
    assert_eq!(status, 202, "{created}");
    let id: space_api::SessionId = created["id"].as_str().unwrap().parse().unwrap();
    held.began().await;
    let stopping = server.stop_gracefully();
    // The API has nothing open (the create was answered): only the operation holds the stop.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!stopping.is_finished(), "the server stopped before the create under way had finished");
    held.release();
    stopping.await.unwrap();
    let record = server.store_as("test").await.session_any(&id).await.unwrap().unwrap();
    assert_eq!(record.session.state, space_api::SessionState::Running, "finished before the stop ended");
}
