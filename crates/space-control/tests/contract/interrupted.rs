//! Sessions of a lost node over two simulated nodes: running ones become `interrupted`, and
//! resume from their newest durable full snapshot on the other node (at once with
//! `auto_resume`), or on their own sandbox once the node is back; the node that comes back
//! keeps nothing of the sessions that left it.

use serde_json::{Value, json};
use space_node_sim::{Op, SimBlobs, SimConfig};

use crate::harness::{Server, assert_error, error_of};
use crate::placement::wait_node_state;

async fn two_nodes(blobs: Option<SimBlobs>) -> Server {
    let node = |id: &str| SimConfig { node_id: id.into(), blobs: blobs.clone(), ..SimConfig::default() };
    Server::start_with_nodes(vec![node("node-a"), node("node-b")]).await
}

/// A new session on node-a (node-b cordoned meanwhile), created with `body`.
async fn session_on_a(server: &Server, body: Value) -> String {
    let cordon = |verb: &str| format!("/v1/nodes/node-b/{verb}");
    assert_eq!(server.call("POST", &cordon("cordon"), Some(json!({}))).await.0, 200);
    let (status, session) = server.call("POST", "/v1/sessions", Some(body)).await;
    assert_eq!((status, session["node"].as_str()), (201, Some("node-a")), "{session}");
    assert_eq!(server.call("POST", &cordon("uncordon"), Some(json!({}))).await.0, 200);
    session["id"].as_str().unwrap().to_owned()
}

/// Polls session `id` until `done` holds of it; bounded (a lease is 15 s, its check 5 s).
async fn wait_until(server: &Server, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..360 {
        let session = server.get(id).await;
        if done(&session) {
            return session;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    panic!("session {id} never {what}: {}", server.get(id).await);
}

/// A full snapshot of `id`, waited for until it is durable (exported in the background).
async fn durable_full_snapshot(server: &Server, id: &str) -> String {
    let snapshot = server.snapshot(id, "full").await;
    for _ in 0..200 {
        let (_, shown) = server.call("GET", &format!("/v1/sessions/{id}/snapshots/{snapshot}"), None).await;
        if shown["durable"] == true {
            return snapshot;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("snapshot {snapshot} never became durable");
}

/// The sessions node `index` holds a sandbox of.
fn held(server: &Server, index: usize) -> Vec<String> {
    server.sims[index].sandboxes().into_iter().filter_map(|s| s.session.map(|id| id.to_string())).collect()
}

#[tokio::test]
async fn sessions_of_a_lost_node_are_interrupted_and_resume_elsewhere_from_their_durable_snapshot() {
    let server = two_nodes(Some(SimBlobs::default())).await;
    let manual = session_on_a(&server, json!({})).await;
    let auto = session_on_a(&server, json!({ "auto_resume": true })).await;
    for id in [&manual, &auto] {
        server.write_file(id, "/note", "in the snapshot").await;
        durable_full_snapshot(&server, id).await;
        server.write_file(id, "/note", "after it").await;
    }
    server.sims[0].fail_next(Op::Capacity, u32::MAX);
    wait_node_state(&server, "node-a", "lost").await;

    let interrupted = wait_until(&server, &manual, "was interrupted", |s| s["state"] == "interrupted").await;
    let error = interrupted["error"].as_str().unwrap_or_default();
    assert!(error.contains("node node-a was lost") && error.contains("newest durable snapshot"), "{interrupted}");
    // auto_resume: on node-b without being asked, from its snapshot.
    let resumed = wait_until(&server, &auto, "resumed by itself", |s| s["state"] == "running").await;
    assert_eq!(resumed["node"], "node-b", "{resumed}");
    assert_eq!(server.read_file(&auto, "/note").await, "in the snapshot");

    let (status, resumed) = server.act(&manual, "resume", json!({})).await;
    assert_eq!((status, resumed["state"].as_str(), resumed["node"].as_str()), (200, Some("running"), Some("node-b")));
    assert_eq!(server.read_file(&manual, "/note").await, "in the snapshot");
    let (status, out) = server.exec(&manual, &["true"]).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(held(&server, 0).len(), 2, "their old sandboxes still run on node-a, which cannot be told");

    // node-a answers again: the sandboxes of sessions that left it are removed from it.
    server.sims[0].stop_failing(Op::Capacity);
    wait_node_state(&server, "node-a", "ready").await;
    for _ in 0..200 {
        if held(&server, 0).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(held(&server, 0), Vec::<String>::new(), "node-a keeps nothing of the sessions that moved");
    assert_eq!(server.read_file(&manual, "/note").await, "in the snapshot", "the moved session is untouched");
}

#[tokio::test]
async fn an_interrupted_session_without_a_durable_snapshot_waits_for_its_node_and_runs_on() {
    let server = two_nodes(None).await;
    let id = session_on_a(&server, json!({})).await;
    server.write_file(&id, "/note", "kept").await;
    server.sims[0].fail_next(Op::Capacity, u32::MAX);
    wait_node_state(&server, "node-a", "lost").await;
    let interrupted = wait_until(&server, &id, "was interrupted", |s| s["state"] == "interrupted").await;
    assert!(interrupted["error"].as_str().unwrap_or_default().contains("no durable full snapshot"), "{interrupted}");

    let reply = server.act(&id, "resume", json!({})).await;
    assert_error(&reply, 503, "sandbox_unavailable");
    assert!(error_of(&reply.1).1.contains("once node node-a is back"), "{}", reply.1);
    let reply = server.exec(&id, &["true"]).await;
    assert_eq!(reply.0, 409, "{}", reply.1);

    // Back: it runs on its own sandbox, with everything it had.
    server.sims[0].stop_failing(Op::Capacity);
    let back = wait_until(&server, &id, "ran again", |s| s["state"] == "running").await;
    assert_eq!(back["node"], "node-a", "{back}");
    assert_eq!(server.read_file(&id, "/note").await, "kept");
    let (_, events) = server.call("GET", &format!("/v1/sessions/{id}/events"), None).await;
    assert!(events.to_string().contains("node node-a is back"), "{events}");
}

#[tokio::test]
async fn an_interrupted_session_whose_node_is_back_when_the_server_restarts_runs_on_its_sandbox() {
    let server = two_nodes(None).await;
    let id = session_on_a(&server, json!({})).await;
    server.write_file(&id, "/note", "kept").await;
    let sandbox = server.get(&id).await["sandbox_id"].clone();
    server.sims[0].fail_next(Op::Capacity, u32::MAX);
    wait_node_state(&server, "node-a", "lost").await;
    wait_until(&server, &id, "was interrupted", |s| s["state"] == "interrupted").await;

    // A new server process; node-a answers it (its sandboxes outlived everything).
    let server = server.stop().start().await;
    let session = server.get(&id).await;
    assert_eq!((session["state"].as_str(), session["node"].as_str()), (Some("running"), Some("node-a")));
    assert_eq!(session["sandbox_id"], sandbox, "recovery kept its sandbox");
    assert_eq!(server.read_file(&id, "/note").await, "kept");
}
