//! A server killed at once and started again on the same data dir: recovery brings the
//! node to what the store says (the node's sandboxes outlive the server, as `spaced` does).

use serde_json::json;

use crate::harness::{Server, assert_error};

fn sandbox_of(session: &serde_json::Value) -> String {
    session["sandbox_id"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn sessions_whose_sandboxes_survived_keep_their_state_and_answer() {
    let server = Server::start().await;
    let running = server.session().await;
    let paused = server.session().await;
    server.write_file(&running, "/tmp/f", "kept").await;
    assert_eq!(server.act(&paused, "pause", json!({})).await.0, 200);
    let snap = server.snapshot(&running, "disk").await;
    let sandboxes = (sandbox_of(&server.get(&running).await), sandbox_of(&server.get(&paused).await));

    let server = server.stop().start().await;
    let session = server.get(&running).await;
    assert_eq!((session["state"].as_str(), sandbox_of(&session)), (Some("running"), sandboxes.0), "{session}");
    assert_eq!(server.read_file(&running, "/tmp/f").await, "kept", "the same sandbox answers");
    let session = server.get(&paused).await;
    assert_eq!((session["state"].as_str(), sandbox_of(&session)), (Some("paused"), sandboxes.1.clone()), "{session}");
    assert!(server.sim.sandboxes().iter().any(|s| s.id.as_str() == sandboxes.1 && s.paused), "still frozen");
    assert_eq!(server.act(&paused, "resume", json!({})).await.1["state"], "running");
    assert_eq!(server.sim.snapshots().len(), 1, "the snapshot is kept");
    let (status, _) = server.act(&running, "restore", json!({ "snapshot": snap })).await;
    assert_eq!(status, 200, "and usable");
}

#[tokio::test]
async fn a_session_whose_sandbox_died_meanwhile_fails_and_orphans_are_removed() {
    let server = Server::start().await;
    let id = server.session().await;
    let kept = server.session().await;
    let sandbox = sandbox_of(&server.get(&id).await);
    let stopped = server.stop();
    assert!(stopped.sims[0].kill(&sandbox.parse().unwrap()), "pid 1 dies while no server runs");

    let server = stopped.start().await;
    let session = server.get(&id).await;
    assert_eq!(session["state"], "failed", "{session}");
    assert!(session["error"].as_str().is_some_and(|e| e.contains("while the server was down")), "{session}");
    assert_error(&server.exec(&id, &["true"]).await, 409, "invalid_state");
    let left: Vec<String> = server.sim.sandboxes().iter().map(|s| s.id.to_string()).collect();
    assert_eq!(left, [sandbox_of(&server.get(&kept).await)], "only the kept session's sandbox is left");
    assert_eq!(server.get(&kept).await["state"], "running");
}

/// A suspended session stays suspended across a restart and resumes from its snapshot.
#[tokio::test]
async fn a_suspended_session_resumes_after_a_restart() {
    let server = Server::start().await;
    let id = server.session().await;
    server.write_file(&id, "/tmp/f", "suspended").await;
    assert_eq!(server.act(&id, "suspend", json!({})).await.1["state"], "suspended");
    let server = server.stop().start().await;
    assert_eq!(server.get(&id).await["state"], "suspended");
    assert_eq!(server.act(&id, "resume", json!({})).await.1["state"], "running");
    assert_eq!(server.read_file(&id, "/tmp/f").await, "suspended");
}

/// A suspend whose replica stopped (here: another replica's, begun with the sandbox frozen,
/// whose lease runs out) is finished by a replica that serves: no full snapshot was taken, so
/// the session runs on, thawed. One whose lease is still renewed is left to its replica.
#[tokio::test]
async fn a_suspend_whose_replica_stopped_is_finished_by_one_that_serves() {
    use space_api::{SandboxId, SessionId, SessionState};
    use space_node_api::NodeApi;
    let server = Server::start().await;
    let (abandoned, held) = (server.session().await, server.session().await);
    let now = space_store::now_ms();
    for (id, holder, lease_ms) in [(&abandoned, "control-dead#1", 500), (&held, "control-live#1", 10 * 60 * 1000)] {
        let sandbox: SandboxId = sandbox_of(&server.get(id).await).parse().unwrap();
        server.sim.pause_sandbox(&sandbox).await.unwrap();
        let store = server.store_as(holder).await;
        let session: SessionId = id.parse().unwrap();
        assert!(store.transition(&session, &[SessionState::Running], SessionState::Suspending, None).await.unwrap());
        assert!(store.acquire_lease(&format!("suspend:{id}"), now, lease_ms).await.unwrap());
    }

    let mut session = server.get(&abandoned).await;
    for _ in 0..300 {
        if session["state"] != "suspending" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        session = server.get(&abandoned).await;
    }
    assert_eq!(session["state"], "running", "{session}");
    assert!(session["error"].as_str().is_some_and(|e| e.contains("kept running")), "{session}");
    let sandbox = sandbox_of(&session);
    assert!(server.sim.sandboxes().iter().any(|s| s.id.as_str() == sandbox && !s.paused), "thawed");
    assert_eq!(server.exec(&abandoned, &["echo", "on"]).await.1["stdout"], "on\n");
    assert_eq!(server.get(&held).await["state"], "suspending", "its replica holds the suspend's lease");
}
