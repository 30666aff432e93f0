//! A node that fails: each failure is mapped to the API's error (503 `sandbox_unavailable`
//! with the node's reason) and the session goes back to where it was, or fails with a
//! recorded reason; nothing is left behind on the node.

use serde_json::json;
use space_node_sim::{Op, SimConfig};

use crate::harness::{Server, assert_error, error_of};

fn sandbox_of(server_session: &serde_json::Value) -> String {
    server_session["sandbox_id"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_create_the_node_cannot_start_fails_the_session_and_leaves_nothing() {
    let server = Server::start().await;
    server.sim.fail_next(Op::StartSandbox, 1);
    let reply = server.call("POST", "/v1/sessions", Some(json!({}))).await;
    assert_error(&reply, 503, "sandbox_unavailable");
    assert!(error_of(&reply.1).1.contains("simulated failure of StartSandbox"), "says why: {}", reply.1);
    let (_, list) = server.call("GET", "/v1/sessions", None).await;
    let failed = &list["sessions"][0];
    assert_eq!(failed["state"], "failed", "{list}");
    assert!(failed["error"].as_str().is_some_and(|e| e.contains("StartSandbox")), "{failed}");
    assert!(server.sim.sandboxes().is_empty(), "{:?}", server.sim.sandboxes());
    server.session().await;
}

/// A node call that panics (a bug) fails its operation once: the create's session fails
/// saying why, instead of staying `creating` while the operation is claimed again and again.
/// Over the network the panic is the node's: its connection drops and the create fails too.
#[tokio::test]
async fn an_operation_that_panics_fails_its_session_and_is_not_retried() {
    let server = Server::start().await;
    server.sim.panic_next(Op::StartSandbox);
    let reply = server.call("POST", "/v1/sessions", Some(json!({}))).await;
    assert!(matches!(reply.0, 500 | 503), "{reply:?}");
    let (_, list) = server.call("GET", "/v1/sessions", None).await;
    let failed = &list["sessions"][0];
    assert_eq!(failed["state"], "failed", "{list}");
    assert!(failed["error"].as_str().is_some_and(|e| !e.is_empty()), "{failed}");
    server.session().await;
}

/// A built-in built on first use: a failed build fails that create, and the next one builds.
#[tokio::test]
async fn a_failed_template_build_fails_the_create_and_a_retry_builds_it() {
    let builtins = vec!["busybox".into(), "debian".into()];
    let server = Server::start_with(SimConfig { builtins, ..SimConfig::default() }).await;
    server.sim.fail_next(Op::EnsureTemplate, 1);
    let create = || server.call("POST", "/v1/sessions", Some(json!({ "template": "debian" })));
    let failed = create().await;
    assert_error(&failed, 503, "sandbox_unavailable");
    assert!(error_of(&failed.1).1.contains("EnsureTemplate"), "{}", failed.1);
    let (status, created) = create().await;
    assert_eq!((status, created["template_version"].as_u64()), (201, Some(1)), "{created}");
}

#[tokio::test]
async fn a_failed_suspend_keeps_the_session_running_on_its_sandbox() {
    let server = Server::start().await;
    let id = server.session().await;
    let sandbox = sandbox_of(&server.get(&id).await);
    server.sim.fail_next(Op::SnapshotFull, 1);
    assert_error(&server.act(&id, "suspend", json!({})).await, 503, "sandbox_unavailable");
    let session = server.get(&id).await;
    assert_eq!((session["state"].as_str(), sandbox_of(&session)), (Some("running"), sandbox), "{session}");
    assert!(session["error"].as_str().is_some_and(|e| e.contains("suspend failed")), "{session}");
    let (_, snapshots) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await;
    assert_eq!(snapshots["snapshots"].as_array().map(Vec::len), Some(0), "{snapshots}");
    assert!(server.sim.snapshots().is_empty());
    assert_eq!(server.exec(&id, &["echo", "ok"]).await.1["stdout"], "ok\n");
}

#[tokio::test]
async fn a_failed_restore_returns_to_the_sandbox_the_session_had() {
    let server = Server::start().await;
    let id = server.session().await;
    let snap = server.snapshot(&id, "disk").await;
    server.write_file(&id, "/tmp/f", "after the snapshot").await;
    let sandbox = sandbox_of(&server.get(&id).await);
    server.sim.fail_next(Op::StartFromSnapshot, 1);
    assert_error(&server.act(&id, "restore", json!({ "snapshot": snap })).await, 503, "sandbox_unavailable");
    let session = server.get(&id).await;
    assert_eq!((session["state"].as_str(), sandbox_of(&session)), (Some("running"), sandbox.clone()), "{session}");
    assert_eq!(server.read_file(&id, "/tmp/f").await, "after the snapshot");
    let live: Vec<_> = server.sim.sandboxes().into_iter().filter(|s| s.session.is_some()).collect();
    assert_eq!(live.len(), 1, "the half-made sandbox is gone: {live:?}");

    // Paused before: back to running (thawed) on the same sandbox.
    server.act(&id, "pause", json!({})).await;
    server.sim.fail_next(Op::StartFromSnapshot, 1);
    assert_error(&server.act(&id, "restore", json!({ "snapshot": snap })).await, 503, "sandbox_unavailable");
    assert_eq!(server.get(&id).await["state"], "running");
    assert_eq!(server.exec(&id, &["true"]).await.1["exit_code"], 0, "it answers");
}

#[tokio::test]
async fn a_failed_resume_of_a_suspended_session_leaves_it_suspended() {
    let server = Server::start().await;
    let id = server.session().await;
    server.act(&id, "suspend", json!({})).await;
    server.sim.fail_next(Op::StartFromSnapshot, 1);
    assert_error(&server.act(&id, "resume", json!({})).await, 503, "sandbox_unavailable");
    let session = server.get(&id).await;
    assert_eq!(session["state"], "suspended", "{session}");
    assert!(session["error"].as_str().is_some_and(|e| e.contains("resume failed")), "{session}");
    assert_eq!(server.act(&id, "resume", json!({})).await.1["state"], "running", "a retry works");
}

#[tokio::test]
async fn failed_pause_snapshot_and_agent_calls_change_nothing() {
    let server = Server::start().await;
    let id = server.session().await;
    for (op, action, body) in [
        (Op::PauseSandbox, "pause", json!({})),
        (Op::SnapshotDisk, "snapshots", json!({ "kind": "disk" })),
        (Op::Agent, "exec", json!({ "cmd": ["true"] })),
    ] {
        server.sim.fail_next(op, 1);
        assert_error(&server.act(&id, action, body).await, 503, "sandbox_unavailable");
        assert_eq!(server.get(&id).await["state"], "running", "after {op:?}");
    }
    let (_, snapshots) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await;
    assert_eq!(snapshots["snapshots"].as_array().map(Vec::len), Some(0), "no half snapshot listed: {snapshots}");
    assert!(server.sim.snapshots().is_empty());
}

/// A snapshot that fails is answered with its own error even when removing what it left fails
/// too: the left copy has no row, so it is an orphan for the node's sweep.
#[tokio::test]
async fn a_failed_snapshot_whose_clean_up_fails_answers_its_own_error() {
    let server = Server::start().await;
    let id = server.session().await;
    server.sim.fail_next(Op::SnapshotDisk, 1);
    server.sim.fail_next(Op::DeleteSnapshot, 1);
    let reply = server.act(&id, "snapshots", json!({ "kind": "disk" })).await;
    assert_error(&reply, 503, "sandbox_unavailable");
    assert!(error_of(&reply.1).1.contains("SnapshotDisk"), "{}", reply.1);
    let (_, snapshots) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await;
    assert_eq!(snapshots["snapshots"].as_array().map(Vec::len), Some(0), "{snapshots}");
    let taken = server.act(&id, "snapshots", json!({ "kind": "disk" })).await;
    assert_eq!(taken.0, 201, "{}", taken.1);
}

/// A destroy whose node cleanup fails still ends the session (with the error recorded); a
/// second destroy finds nothing to do.
#[tokio::test]
async fn a_destroy_the_node_fails_still_ends_the_session() {
    let server = Server::start().await;
    let id = server.session().await;
    server.sim.fail_next(Op::DestroySandbox, 1);
    let (status, session) = server.call("DELETE", &format!("/v1/sessions/{id}"), None).await;
    assert_eq!((status, session["state"].as_str()), (200, Some("destroyed")), "{session}");
    assert!(session["error"].as_str().is_some_and(|e| e.contains("DestroySandbox")), "{session}");
}
