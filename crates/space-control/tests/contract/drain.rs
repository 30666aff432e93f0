//! Cordon and drain over two simulated nodes: a cordoned node takes no new sessions, and a
//! drain moves every session off a node with its files and state, or says why it could not.

use serde_json::{Value, json};
use space_node_sim::{Op, SimBlobs, SimConfig};

use crate::harness::{Server, assert_error, error_of};

async fn two_nodes(blobs: Option<SimBlobs>) -> Server {
    let node = |id: &str| SimConfig { node_id: id.into(), blobs: blobs.clone(), ..SimConfig::default() };
    Server::start_with_nodes(vec![node("node-a"), node("node-b")]).await
}

async fn node_call(server: &Server, node: &str, verb: &str) -> (u16, Value) {
    server.call("POST", &format!("/v1/nodes/{node}/{verb}"), Some(json!({}))).await
}

/// A new session, placed on node-a: node-b is cordoned while it is created.
async fn session_on_a(server: &Server) -> String {
    let (status, body) = node_call(server, "node-b", "cordon").await;
    assert_eq!(status, 200, "{body}");
    let id = server.session().await;
    assert_eq!(server.get(&id).await["node"], "node-a");
    let (status, body) = node_call(server, "node-b", "uncordon").await;
    assert_eq!(status, 200, "{body}");
    id
}

/// The sessions a simulated node holds a sandbox of.
fn sessions_held(server: &Server, node: usize) -> Vec<String> {
    server.sims[node].sandboxes().into_iter().filter_map(|s| s.session.map(|id| id.to_string())).collect()
}

#[tokio::test]
async fn a_cordoned_node_takes_no_new_sessions_until_its_cordon_is_lifted() {
    let server = two_nodes(None).await;
    let (status, node) = node_call(&server, "node-a", "cordon").await;
    assert_eq!((status, node["id"].as_str(), node["cordoned"].as_bool()), (200, Some("node-a"), Some(true)), "{node}");
    for _ in 0..3 {
        let id = server.session().await;
        assert_eq!(server.get(&id).await["node"], "node-b", "node-a is cordoned");
    }
    let (_, list) = server.call("GET", "/v1/nodes", None).await;
    assert_eq!(list["nodes"][0]["cordoned"], true, "{list}");
    assert_eq!(list["nodes"][1]["cordoned"], false, "{list}");

    let (status, node) = node_call(&server, "node-a", "uncordon").await;
    assert_eq!((status, node["cordoned"].as_bool()), (200, Some(false)), "{node}");
    let id = server.session().await;
    assert_eq!(server.get(&id).await["node"], "node-a", "the less loaded node takes sessions again");

    // Authorization first: a tenant is refused before the node is looked up.
    let key = server.tenant_key("acme").await;
    for node in ["node-a", "nowhere"] {
        let reply = server.call_as(&key, "POST", &format!("/v1/nodes/{node}/cordon"), Some(json!({}))).await;
        assert_error(&reply, 403, "forbidden");
    }
    let reply = node_call(&server, "nowhere", "drain").await;
    assert_error(&reply, 404, "not_found");
    assert!(error_of(&reply.1).1.contains("space node list"), "{}", reply.1);
}

#[tokio::test]
async fn a_control_plane_with_one_node_refuses_to_cordon_it() {
    let server = Server::start().await;
    let (_, list) = server.call("GET", "/v1/nodes", None).await;
    let only = list["nodes"][0]["id"].as_str().unwrap().to_owned();
    for verb in ["cordon", "drain"] {
        let reply = node_call(&server, &only, verb).await;
        assert_error(&reply, 409, "conflict");
        assert!(error_of(&reply.1).1.contains("only node"), "{}", reply.1);
    }
}

#[tokio::test]
async fn a_drain_moves_running_paused_and_suspended_sessions_off_with_their_files() {
    let blobs = SimBlobs::default();
    let server = two_nodes(Some(blobs.clone())).await;
    let running = session_on_a(&server).await;
    server.write_file(&running, "/note", "running").await;
    let paused = session_on_a(&server).await;
    server.write_file(&paused, "/note", "paused").await;
    assert_eq!(server.act(&paused, "pause", json!({})).await.0, 200);
    // Suspended with its snapshot on node-a only: the drain stores it in the blob store.
    let suspended = session_on_a(&server).await;
    server.write_file(&suspended, "/note", "suspended").await;
    server.sims[0].fail_next(Op::ExportSnapshot, 1);
    let (status, body) = server.call("POST", &format!("/v1/sessions/{suspended}/suspend?force=true"), None).await;
    assert_eq!(status, 200, "{body}");

    let (status, report) = node_call(&server, "node-a", "drain").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["failed"], json!([]), "{report}");
    assert_eq!(report["moved"], json!([running, paused]), "{report}");
    assert_eq!(report["durable"], json!([suspended]), "{report}");
    assert_eq!(report["node"]["cordoned"], true, "{report}");
    assert!(sessions_held(&server, 0).is_empty(), "node-a runs none of them: {:?}", sessions_held(&server, 0));

    for (id, state) in [(&running, "running"), (&paused, "paused")] {
        let session = server.get(id).await;
        assert_eq!((session["state"].as_str(), session["node"].as_str()), (Some(state), Some("node-b")));
    }
    assert_eq!(server.read_file(&running, "/note").await, "running");
    let (status, _) = server.act(&paused, "resume", json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(server.read_file(&paused, "/note").await, "paused");
    let (_, events) = server.call("GET", &format!("/v1/sessions/{running}/events"), None).await;
    assert!(events.to_string().contains("moved from node node-a to node node-b"), "{events}");

    let (status, resumed) = server.act(&suspended, "resume", json!({})).await;
    assert_eq!((status, resumed["node"].as_str()), (200, Some("node-b")), "{resumed}");
    assert_eq!(server.read_file(&suspended, "/note").await, "suspended");

    // Cordoned still: a new session goes to node-b; a second drain finds nothing to move.
    let id = server.session().await;
    assert_eq!(server.get(&id).await["node"], "node-b");
    let (status, again) = node_call(&server, "node-a", "drain").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!((again["moved"].as_array().map(Vec::len), again["failed"].as_array().map(Vec::len)), (Some(0), Some(0)));
}

#[tokio::test]
async fn a_drain_without_a_blob_store_leaves_the_sessions_running_where_they_were_and_says_why() {
    let server = two_nodes(None).await;
    let first = session_on_a(&server).await;
    server.write_file(&first, "/note", "kept").await;
    let second = session_on_a(&server).await;

    let (status, report) = node_call(&server, "node-a", "drain").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["moved"], json!([]), "{report}");
    let failed = report["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 2, "{report}");
    assert_eq!(
        (failed[0]["session"].as_str(), failed[0]["code"].as_str()),
        (Some(&*first), Some("feature_unavailable"))
    );
    assert!(failed[0]["message"].as_str().unwrap().contains("no blob store"), "{report}");
    assert!(failed[1]["message"].as_str().unwrap().starts_with("not tried"), "{report}");
    for id in [&first, &second] {
        let session = server.get(id).await;
        assert_eq!((session["state"].as_str(), session["node"].as_str()), (Some("running"), Some("node-a")));
        let (status, out) = server.exec(id, &["true"]).await;
        assert_eq!(status, 200, "{out}");
    }
    assert_eq!(server.read_file(&first, "/note").await, "kept");
}

#[tokio::test]
async fn on_a_cordoned_node_a_restore_stays_and_a_resume_from_a_durable_snapshot_leaves() {
    let server = two_nodes(Some(SimBlobs::default())).await;
    let id = session_on_a(&server).await;
    server.write_file(&id, "/note", "kept").await;
    assert_eq!(server.act(&id, "suspend", json!({})).await.0, 200);
    assert_eq!(server.act(&id, "resume", json!({})).await.0, 200);
    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await;
    let durable = list["snapshots"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(list["snapshots"][0]["durable"], true, "{list}");
    assert_eq!(node_call(&server, "node-a", "cordon").await.0, 200);

    // Its running sandbox is retired where it runs: the restore stays on node-a.
    let (status, restored) = server.act(&id, "restore", json!({ "snapshot": durable })).await;
    assert_eq!((status, restored["node"].as_str()), (200, Some("node-a")), "{restored}");
    // The replaced sandbox is removed after the restore answers.
    crate::lifecycle::wait_until(|| sessions_held(&server, 0).len() == 1).await;
    assert_eq!(sessions_held(&server, 0), std::slice::from_ref(&id), "one sandbox of it, on node-a");

    // Suspended, nothing of it runs: it resumes on node-b from the blob store.
    assert_eq!(server.act(&id, "suspend", json!({})).await.0, 200);
    let (status, resumed) = server.act(&id, "resume", json!({})).await;
    assert_eq!((status, resumed["node"].as_str()), (200, Some("node-b")), "{resumed}");
    assert_eq!(server.read_file(&id, "/note").await, "kept");
    assert!(sessions_held(&server, 0).is_empty());
}
