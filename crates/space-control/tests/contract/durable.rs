//! Durable snapshots over two simulated nodes sharing one simulated blob store: a suspend
//! exports its snapshot, and a session whose node is lost resumes on the other one from it.
//! Without a blob store, or with a corrupt export, it does not, and says why.

use serde_json::{Value, json};
use space_node_sim::{Op, SimBlobs, SimConfig};

use crate::harness::{Server, assert_error, error_of};
use crate::placement::wait_node_state;

async fn two_nodes(blobs: Option<SimBlobs>) -> Server {
    let node = |id: &str| SimConfig { node_id: id.into(), blobs: blobs.clone(), ..SimConfig::default() };
    Server::start_with_nodes(vec![node("node-a"), node("node-b")]).await
}

/// A session on node-a with a file in it, suspended.
async fn suspended_on_a(server: &Server) -> String {
    let id = server.session().await;
    assert_eq!(server.get(&id).await["node"], "node-a");
    server.write_file(&id, "/note", "kept").await;
    let (status, body) = server.act(&id, "suspend", json!({})).await;
    assert_eq!(status, 200, "{body}");
    id
}

async fn snapshots(server: &Server, id: &str) -> Vec<Value> {
    let (status, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await;
    assert_eq!(status, 200, "{list}");
    list["snapshots"].as_array().unwrap_or_else(|| panic!("a list: {list}")).clone()
}

/// node-a stops answering until its lease runs out.
async fn lose_node_a(server: &Server) {
    server.sims[0].fail_next(Op::Capacity, u32::MAX);
    wait_node_state(server, "node-a", "lost").await;
}

#[tokio::test]
async fn a_suspended_session_resumes_on_another_node_once_its_own_is_lost() {
    let blobs = SimBlobs::default();
    let server = two_nodes(Some(blobs.clone())).await;
    let id = suspended_on_a(&server).await;
    let taken = snapshots(&server, &id).await;
    assert_eq!(taken.last().unwrap()["durable"], true, "a suspend exports its snapshot: {taken:?}");
    assert_eq!(blobs.len(), 1);
    assert_eq!(server.sims[0].exported_while_running(), [], "the sandbox is frozen while its snapshot is exported");
    lose_node_a(&server).await;

    let (status, resumed) = server.act(&id, "resume", json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!((resumed["state"].as_str(), resumed["node"].as_str()), (Some("running"), Some("node-b")));
    assert_eq!(server.read_file(&id, "/note").await, "kept");
    let snapshot = taken.last().unwrap()["id"].as_str().unwrap();
    assert!(server.sims[1].snapshots().iter().any(|s| s.as_str() == snapshot), "node-b imported it");
    let (status, out) = server.exec(&id, &["true"]).await;
    assert_eq!(status, 200, "{out}");
}

#[tokio::test]
async fn without_a_blob_store_a_session_on_a_lost_node_stays_suspended_and_says_why() {
    let server = two_nodes(None).await;
    let id = suspended_on_a(&server).await;
    assert_eq!(snapshots(&server, &id).await.last().unwrap()["durable"], false);
    lose_node_a(&server).await;

    let reply = server.act(&id, "resume", json!({})).await;
    assert_error(&reply, 503, "sandbox_unavailable");
    let (_, message) = error_of(&reply.1);
    assert!(message.contains("node-a, which is lost") && message.contains("not durable"), "{message}");
    let session = server.get(&id).await;
    assert_eq!((session["state"].as_str(), session["node"].as_str()), (Some("suspended"), Some("node-a")));
}

#[tokio::test]
async fn a_corrupt_export_is_not_restored_and_the_session_stays_suspended() {
    let blobs = SimBlobs::default();
    let server = two_nodes(Some(blobs.clone())).await;
    let id = suspended_on_a(&server).await;
    blobs.corrupt_all();
    lose_node_a(&server).await;

    let reply = server.act(&id, "resume", json!({})).await;
    assert_error(&reply, 409, "snapshot_corrupt");
    let (_, message) = error_of(&reply.1);
    assert!(message.contains("corrupt") && message.contains("no older durable snapshot"), "{message}");
    assert_eq!(server.get(&id).await["state"], "suspended");
    assert!(server.sims[1].snapshots().is_empty(), "nothing of it was imported");
}

/// Three suspends make a chain a ← b ← c. With b's object corrupt, c cannot be imported
/// elsewhere: the refusal names b, and offers a (which does not need b), not b itself.
#[tokio::test]
async fn a_corrupt_link_of_a_chain_is_named_and_an_older_snapshot_without_it_is_offered() {
    let blobs = SimBlobs::default();
    let server = two_nodes(Some(blobs.clone())).await;
    let id = suspended_on_a(&server).await;
    for note in ["b", "c"] {
        let (status, resumed) = server.act(&id, "resume", json!({})).await;
        assert_eq!((status, resumed["node"].as_str()), (200, Some("node-a")), "{resumed}");
        server.write_file(&id, "/note", note).await;
        let (status, body) = server.act(&id, "suspend", json!({})).await;
        assert_eq!(status, 200, "{body}");
    }
    let taken: Vec<String> = snapshots(&server, &id).await.iter().map(|s| s["id"].as_str().unwrap().into()).collect();
    let [a, b, _] = &taken[..] else { panic!("three suspends: {taken:?}") };
    blobs.corrupt_export(1);
    let (status, body) = server.call("POST", "/v1/nodes/node-a/cordon", Some(json!({}))).await;
    assert_eq!(status, 200, "{body}");

    let reply = server.act(&id, "resume", json!({})).await;
    assert_error(&reply, 409, "snapshot_corrupt");
    let (_, message) = error_of(&reply.1);
    assert!(message.contains(&format!("snapshot {b}, whose root")), "names the corrupt link: {message}");
    assert!(message.contains(&format!("restore the older durable snapshot {a} instead")), "{message}");
    assert_eq!(server.get(&id).await["state"], "suspended");
    let (status, restored) = server.act(&id, "restore", json!({ "snapshot": a })).await;
    assert_eq!((status, restored["node"].as_str()), (200, Some("node-b")), "{restored}");
    assert_eq!(server.read_file(&id, "/note").await, "kept");
}

#[tokio::test]
async fn a_suspend_whose_export_fails_keeps_the_session_running_unless_forced() {
    let server = two_nodes(Some(SimBlobs::default())).await;
    let id = server.session().await;
    server.sims[0].fail_next(Op::ExportSnapshot, 2);

    let reply = server.act(&id, "suspend", json!({})).await;
    assert_error(&reply, 503, "blob_store_unavailable");
    let (_, message) = error_of(&reply.1);
    assert!(message.contains("force=true"), "{message}");
    let (status, out) = server.exec(&id, &["true"]).await;
    assert_eq!(status, 200, "the session kept its sandbox: {out}");

    assert!(snapshots(&server, &id).await.is_empty(), "the snapshot taken to suspend is deleted again");
    assert!(server.sims[0].snapshots().is_empty(), "also on the node");

    let (status, body) = server.call("POST", &format!("/v1/sessions/{id}/suspend?force=true"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "suspended");
    assert!(snapshots(&server, &id).await.iter().all(|s| s["durable"] == false));
    let (_, events) = server.call("GET", &format!("/v1/sessions/{id}/events"), None).await;
    assert!(events.to_string().contains("not_durable"), "the forced suspend says so: {events}");
    let (status, resumed) = server.act(&id, "resume", json!({})).await;
    assert_eq!(status, 200, "its own node still resumes it: {resumed}");
}

#[tokio::test]
async fn a_running_session_whose_node_is_lost_is_interrupted_and_started_elsewhere_only_when_asked() {
    let server = two_nodes(Some(SimBlobs::default())).await;
    let id = suspended_on_a(&server).await;
    let (status, resumed) = server.act(&id, "resume", json!({})).await;
    assert_eq!((status, resumed["node"].as_str()), (200, Some("node-a")), "{resumed}");
    let durable = snapshots(&server, &id).await.last().unwrap()["id"].as_str().unwrap().to_owned();
    lose_node_a(&server).await;

    // Its sandbox may still run on node-a: nothing starts elsewhere by itself.
    let mut session = server.get(&id).await;
    for _ in 0..100 {
        if session["state"] == "interrupted" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        session = server.get(&id).await;
    }
    assert_eq!((session["state"].as_str(), session["node"].as_str()), (Some("interrupted"), Some("node-a")));
    assert!(server.sims[1].sandboxes().is_empty(), "nothing started on node-b");

    // Asked to, it restores there from its durable snapshot; a fork from it starts there too.
    let (status, restored) = server.act(&id, "restore", json!({ "snapshot": durable })).await;
    assert_eq!((status, restored["state"].as_str(), restored["node"].as_str()), (200, Some("running"), Some("node-b")));
    assert_eq!(server.read_file(&id, "/note").await, "kept");
    let (status, forks) = server.act(&id, "fork", json!({ "from": durable })).await;
    assert_eq!(status, 201, "{forks}");
    assert_eq!(forks["sessions"][0]["node"], "node-b");
}

#[tokio::test]
async fn a_fork_placed_away_from_its_parents_node_leaves_no_egress_there() {
    let server = two_nodes(Some(SimBlobs::default())).await;
    let id = suspended_on_a(&server).await;
    let durable = snapshots(&server, &id).await.last().unwrap()["id"].as_str().unwrap().to_owned();
    lose_node_a(&server).await;

    let (status, forks) = server.act(&id, "fork", json!({ "from": durable })).await;
    assert_eq!(status, 201, "{forks}");
    let fork: space_api::SessionId = forks["sessions"][0]["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(forks["sessions"][0]["node"], "node-b");
    assert!(server.sims[1].has_egress(&fork), "its egress went with it");
    // Handed to the parent's node before it was placed, then taken back: node-a (lost by its
    // lease, yet answering) holds none of its policy, CA or credentials.
    assert!(!server.sims[0].has_egress(&fork), "node-a forgot it");
}

/// A snapshot taken on node-a and imported by node-b (the session resumed there) is deleted
/// from both: its owner's node is no longer the node it was taken on.
#[tokio::test]
async fn a_deleted_snapshot_goes_from_the_node_it_was_taken_on_and_the_one_that_imported_it() {
    let server = two_nodes(Some(SimBlobs::default())).await;
    let id = suspended_on_a(&server).await;
    let snapshot = snapshots(&server, &id).await.last().unwrap()["id"].as_str().unwrap().to_owned();
    let (status, body) = server.call("POST", "/v1/nodes/node-a/cordon", Some(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    let (status, resumed) = server.act(&id, "resume", json!({})).await;
    assert_eq!((status, resumed["node"].as_str()), (200, Some("node-b")), "{resumed}");
    let holds = |node: usize| server.sims[node].snapshots().iter().any(|s| s.as_str() == snapshot);
    assert!(holds(0) && holds(1), "taken on node-a, imported by node-b");

    let (status, body) = server.call("DELETE", &format!("/v1/sessions/{id}/snapshots/{snapshot}"), None).await;
    assert_eq!(status, 204, "{body}");
    assert!(!holds(0), "gone from node-a, where it was taken");
    assert!(!holds(1), "gone from node-b, which imported it");
}
