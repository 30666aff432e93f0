//! Disk limits: every sandbox a session gets is charged to it with the session's limit (the
//! server's default unless the request names one), and stats report it.

use serde_json::json;
use space_api::SessionId;

use crate::harness::{DEFAULT_DISK_MIB, Server, assert_error};

fn limit_on_node(server: &Server, id: &str) -> Option<Option<u64>> {
    server.sim.disk_limit(&id.parse::<SessionId>().unwrap())
}

#[tokio::test]
async fn every_sandbox_of_a_session_gets_its_disk_limit() {
    let server = Server::start().await;
    let default = server.session().await;
    assert_eq!(limit_on_node(&server, &default), Some(Some(DEFAULT_DISK_MIB << 20)), "the server's default");
    assert_eq!(server.get(&default).await["resources"]["disk_mib"], DEFAULT_DISK_MIB);

    let (status, body) = server.call("POST", "/v1/sessions", Some(json!({ "disk_mib": 64 }))).await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    assert_eq!(limit_on_node(&server, &id), Some(Some(64 << 20)));

    // A restore starts a new sandbox: it is charged to the same session, with the same limit.
    let snapshot = server.snapshot(&id, "disk").await;
    let before = server.get(&id).await["sandbox_id"].clone();
    let (status, body) = server.act(&id, "restore", json!({ "snapshot": snapshot })).await;
    assert_eq!(status, 200, "{body}");
    assert_ne!(server.get(&id).await["sandbox_id"], before, "a new sandbox");
    assert_eq!(limit_on_node(&server, &id), Some(Some(64 << 20)));

    // Forks are sessions of their own, with the parent's resources.
    let (status, forks) = server.act(&id, "fork", json!({ "count": 1 })).await;
    assert_eq!(status, 201, "{forks}");
    let fork = forks["sessions"][0]["id"].as_str().unwrap();
    assert_eq!(limit_on_node(&server, fork), Some(Some(64 << 20)));
}

#[tokio::test]
async fn disk_limits_out_of_range_are_refused_before_anything_starts() {
    let server = Server::start().await;
    for bad in [0, 15, (64 << 20) + 1] {
        let reply = server.call("POST", "/v1/sessions", Some(json!({ "disk_mib": bad }))).await;
        assert_error(&reply, 400, "bad_request");
        assert!(reply.1["error"]["message"].as_str().unwrap().contains("disk_mib must be between 16 and"), "{bad}");
    }
    assert!(server.sim.sandboxes().is_empty());
}

#[tokio::test]
async fn stats_report_the_sandbox_and_the_disk_limit() {
    let server = Server::start().await;
    let id = server.session().await;
    let (status, stats) = server.call("GET", &format!("/v1/sessions/{id}/stats"), None).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["sandbox"]["pids"], 1);
    assert_eq!(stats["disk"]["limit_bytes"], DEFAULT_DISK_MIB << 20);
    assert_eq!(stats["disk"]["enforced"], false, "the simulated node enforces nothing, and says so");

    let (status, body) = server.act(&id, "suspend", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, stats) = server.call("GET", &format!("/v1/sessions/{id}/stats"), None).await;
    assert_eq!((status, &stats["sandbox"]), (200, &serde_json::Value::Null), "no sandbox while suspended: {stats}");

    let other = server.tenant_key("other").await;
    let reply = server.call_as(&other, "GET", &format!("/v1/sessions/{id}/stats"), None).await;
    assert_error(&reply, 404, "not_found");
}

#[tokio::test]
async fn one_snapshot_reads_with_its_exclusive_bytes_and_lists_without() {
    let server = Server::start().await;
    let id = server.session().await;
    let snapshot = server.snapshot(&id, "disk").await;
    let (status, one) = server.call("GET", &format!("/v1/sessions/{id}/snapshots/{snapshot}"), None).await;
    assert_eq!(status, 200, "{one}");
    assert!(one["exclusive_bytes"].is_u64(), "{one}");
    let (status, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await;
    assert_eq!(status, 200, "{list}");
    assert!(list["snapshots"][0]["exclusive_bytes"].is_null(), "{list}");
    let reply = server.call("GET", &format!("/v1/sessions/{id}/snapshots/snp_nothing"), None).await;
    assert_error(&reply, 404, "snapshot_not_found");
}
