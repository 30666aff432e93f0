//! Retention in the blob store: a sweep deletes the objects no recorded export names (those
//! of deleted snapshots), never one an export under way may come to name.

use std::time::Duration;

use serde_json::{Value, json};
use space_node_sim::{SimBlobs, SimConfig};

use crate::harness::{Server, assert_error};

async fn two_nodes(blobs: &SimBlobs) -> Server {
    let node = |id: &str| SimConfig { node_id: id.into(), blobs: Some(blobs.clone()), ..SimConfig::default() };
    Server::start_with_nodes(vec![node("node-a"), node("node-b")]).await
}

async fn sweep(server: &Server) -> Value {
    let (status, report) = server.call("POST", "/v1/blobs/sweep", None).await;
    assert_eq!(status, 200, "{report}");
    report
}

async fn suspended(server: &Server) -> String {
    let id = server.session().await;
    server.write_file(&id, "/note", "kept").await;
    let (status, body) = server.act(&id, "suspend", json!({})).await;
    assert_eq!(status, 200, "{body}");
    id
}

async fn destroy(server: &Server, id: &str) {
    let (status, body) = server.call("DELETE", &format!("/v1/sessions/{id}"), None).await;
    assert_eq!(status, 200, "{body}");
    server.wait_for_state(id, "destroyed").await;
}

#[tokio::test]
async fn a_sweep_frees_what_only_deleted_snapshots_named_and_keeps_the_rest() {
    let blobs = SimBlobs::default();
    let server = two_nodes(&blobs).await;
    let (gone, kept) = (suspended(&server).await, suspended(&server).await);
    assert_eq!(blobs.len(), 2, "each suspend exported its snapshot");
    destroy(&server, &gone).await;

    let report = sweep(&server).await;
    assert_eq!(report["swept"], true, "{report}");
    assert_eq!(
        (report["objects"]["deleted_objects"].as_u64(), report["objects"]["kept_objects"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(blobs.len(), 1);
    // What is kept still brings the other session back, on either node.
    let (status, resumed) = server.act(&kept, "resume", json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(server.read_file(&kept, "/note").await, "kept");
    assert_eq!(sweep(&server).await["objects"]["deleted_objects"], 0, "nothing more to free");
}

#[tokio::test]
async fn a_sweep_is_put_off_while_an_export_is_under_way_and_an_export_waits_for_a_sweep() {
    let blobs = SimBlobs::default();
    let server = two_nodes(&blobs).await;
    let gone = suspended(&server).await;
    destroy(&server, &gone).await;

    // Another replica exports a snapshot: whatever it will name must not be deleted.
    let other = server.store_as("replica-2").await;
    let now = space_store::now_ms();
    assert!(other.acquire_lease("blob-export:snap_other", now, 60_000).await.unwrap());
    let report = sweep(&server).await;
    assert_eq!(report["swept"], false, "{report}");
    assert!(report["put_off"].as_str().unwrap().contains("export"), "{report}");
    assert_eq!(blobs.len(), 1, "nothing deleted");
    other.release_lease("blob-export:snap_other").await.unwrap();

    // Another replica sweeps: a suspend's export waits for it, then completes.
    assert!(other.acquire_lease("blob-sweep", space_store::now_ms(), 60_000).await.unwrap());
    assert_eq!(sweep(&server).await["put_off"], "another sweep of the blob store is under way");
    let id = server.session().await;
    let url = format!("{}/v1/sessions/{id}/suspend", server.url);
    let admin = server.admin.clone();
    let suspend = tokio::spawn(async move {
        reqwest::Client::new().post(url).bearer_auth(admin).json(&json!({})).send().await.unwrap().status()
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!suspend.is_finished(), "the export waits while the sweep holds its lease");
    assert_eq!(blobs.len(), 1, "and stored nothing yet");
    let exports = other.leases_held("blob-export:", space_store::now_ms()).await.unwrap();
    assert_eq!(exports, 1, "it took its own lease before it looked for the sweep's");
    other.release_lease("blob-sweep").await.unwrap();
    assert_eq!(suspend.await.unwrap(), 200);
    assert_eq!(blobs.len(), 2);
    assert_eq!(sweep(&server).await["objects"]["deleted_objects"], 1, "the destroyed session's object");
    let now = space_store::now_ms();
    assert_eq!(other.leases_held("blob-", now).await.unwrap(), 0, "every export and sweep gave its lease up");
}

#[tokio::test]
async fn only_the_admin_sweeps_and_without_a_blob_store_there_is_nothing_to_sweep() {
    let server = Server::start().await;
    let tenant = server.tenant_key("acme").await;
    assert_error(&server.call_as(&tenant, "POST", "/v1/blobs/sweep", None).await, 403, "forbidden");
    let report = sweep(&server).await;
    assert_eq!(report["swept"], false, "{report}");
    assert!(report["put_off"].as_str().unwrap().ends_with("has no blob store (--blob-store)"), "{report}");
}

/// A suspend exports against the session's last durable snapshot when the node holds it.
/// That parent's object is kept while the export needs it, also once the parent is deleted
/// (it is hidden then, not gone), and a node that holds neither receives the parent's root
/// first. Destroying the session frees both.
#[tokio::test]
async fn an_export_goes_against_the_last_durable_snapshot_which_stays_while_it_is_needed() {
    let blobs = SimBlobs::default();
    let server = two_nodes(&blobs).await;
    let id = suspended(&server).await;
    let (status, resumed) = server.act(&id, "resume", json!({})).await;
    assert_eq!((status, resumed["node"].as_str()), (200, Some("node-a")), "{resumed}");
    server.write_file(&id, "/note", "changed").await;
    let (status, body) = server.act(&id, "suspend", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let list = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await.1;
    let ids: Vec<String> =
        list["snapshots"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().into()).collect();
    let [first, second] = &ids[..] else { panic!("two suspends, two snapshots: {list}") };
    assert_eq!(blobs.len(), 2);

    let (status, body) = server.call("DELETE", &format!("/v1/sessions/{id}/snapshots/{first}"), None).await;
    assert_eq!(status, 204, "{body}");
    let list = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await.1;
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 1, "the deleted one is not listed: {list}");
    assert!(server.sims[0].snapshots().iter().all(|s| s.as_str() != first), "nor kept on its node");
    assert_error(
        &server.call("GET", &format!("/v1/sessions/{id}/snapshots/{first}"), None).await,
        404,
        "snapshot_not_found",
    );
    assert_eq!(sweep(&server).await["objects"]["deleted_objects"], 0, "the second's export needs the first's");

    let (status, body) = server.call("POST", "/v1/nodes/node-a/cordon", Some(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    let (status, resumed) = server.act(&id, "resume", json!({})).await;
    assert_eq!((status, resumed["node"].as_str()), (200, Some("node-b")), "{resumed}");
    assert_eq!(server.read_file(&id, "/note").await, "changed");
    let received: Vec<String> = server.sims[1].parents_imported().iter().map(|s| s.to_string()).collect();
    assert_eq!(received, [first.as_str()], "node-b received the parent's root first");
    assert!(server.sims[1].snapshots().iter().any(|s| s.as_str() == second));

    destroy(&server, &id).await;
    assert_eq!(sweep(&server).await["objects"]["deleted_objects"], 2, "nothing needs either any more");
    assert_eq!(blobs.len(), 0);
}
