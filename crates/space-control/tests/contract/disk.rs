//! Disk limits: every sandbox a session gets is charged to it with the session's limit (the
//! server's default unless the request names one), running out of disk is a 507 with its own
//! code, and stats report the limit.

use serde_json::{Value, json};
use space_api::SandboxId;
use space_node_api::{DiskQuota, OutOfSpace};
use space_node_sim::Op;

use crate::harness::{DEFAULT_DISK_MIB, Server, assert_error};

/// The session and cap the node charges the session's current sandbox to.
async fn charged_to(server: &Server, id: &str) -> (String, Option<u64>) {
    let sandbox: SandboxId = server.get(id).await["sandbox_id"].as_str().unwrap().parse().unwrap();
    let DiskQuota { session, limit_bytes } = server.sim.disk_quota(&sandbox).expect("charged to a session");
    (session.to_string(), limit_bytes)
}

async fn create(server: &Server, body: Value) -> String {
    let (status, body) = server.call("POST", "/v1/sessions", Some(body)).await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn every_sandbox_of_a_session_is_charged_to_it_with_its_limit() {
    let server = Server::start().await;
    let default = server.session().await;
    assert_eq!(charged_to(&server, &default).await, (default.clone(), Some(DEFAULT_DISK_MIB << 20)));
    assert_eq!(server.get(&default).await["resources"]["disk_mib"], DEFAULT_DISK_MIB);
    let unlimited = create(&server, json!({ "disk_mib": 0 })).await;
    assert_eq!(charged_to(&server, &unlimited).await, (unlimited.clone(), None), "0 opts out of the default");

    let id = create(&server, json!({ "disk_mib": 64 })).await;
    assert_eq!(charged_to(&server, &id).await, (id.clone(), Some(64 << 20)));
    // A restore starts a new sandbox, charged to the same session with the same limit.
    let snapshot = server.snapshot(&id, "disk").await;
    let before = server.get(&id).await["sandbox_id"].clone();
    let (status, body) = server.act(&id, "restore", json!({ "snapshot": snapshot })).await;
    assert_eq!(status, 200, "{body}");
    assert_ne!(server.get(&id).await["sandbox_id"], before, "a new sandbox");
    assert_eq!(charged_to(&server, &id).await, (id.clone(), Some(64 << 20)));
    // A fork is a session of its own, with the parent's resources.
    let (status, forks) = server.act(&id, "fork", json!({ "count": 1 })).await;
    assert_eq!(status, 201, "{forks}");
    let fork = forks["sessions"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(charged_to(&server, &fork).await, (fork.clone(), Some(64 << 20)));
}

#[tokio::test]
async fn disk_limits_out_of_range_are_refused_before_anything_starts() {
    let server = Server::start().await;
    for bad in [1, 15, (64 << 20) + 1] {
        let reply = server.call("POST", "/v1/sessions", Some(json!({ "disk_mib": bad }))).await;
        assert_error(&reply, 400, "bad_request");
        assert!(reply.1["error"]["message"].as_str().unwrap().contains("disk_mib must be between 16 and"), "{bad}");
    }
    assert!(server.sim.sandboxes().is_empty());
}

#[tokio::test]
async fn running_out_of_disk_is_a_507_naming_whose_disk() {
    let server = Server::start().await;
    server.sim.fail_next_out_of_space(Op::StartSandbox, OutOfSpace::Pool);
    let reply = server.call("POST", "/v1/sessions", Some(json!({}))).await;
    assert_error(&reply, 507, "storage_full");
    assert!(reply.1["error"]["message"].as_str().unwrap().contains("pool is full"), "{}", reply.1);

    let id = server.session().await;
    let snapshot = server.snapshot(&id, "disk").await;
    server.sim.fail_next_out_of_space(Op::StartFromSnapshot, OutOfSpace::Quota);
    let reply = server.act(&id, "restore", json!({ "snapshot": snapshot })).await;
    assert_error(&reply, 507, "disk_quota_exceeded");
    assert_eq!(server.get(&id).await["state"], "running", "the session kept its sandbox");
    server.sim.fail_next_out_of_space(Op::SnapshotDisk, OutOfSpace::Quota);
    assert_error(&server.act(&id, "snapshots", json!({})).await, 507, "disk_quota_exceeded");
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
    assert_eq!((status, &stats["sandbox"]), (200, &Value::Null), "no sandbox while suspended: {stats}");

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
