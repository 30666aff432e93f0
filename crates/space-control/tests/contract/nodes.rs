//! `GET /v1/nodes`: the server's node, with its lease, capacity and sessions; admin only.

use crate::harness::{Server, assert_error};

#[tokio::test]
async fn the_node_is_listed_ready_with_its_capacity_and_sessions_and_only_to_the_admin() {
    let server = Server::start().await;
    let (status, list) = server.call("GET", "/v1/nodes", None).await;
    assert_eq!(status, 200, "{list}");
    let nodes = list["nodes"].as_array().expect("a node list");
    assert_eq!(nodes.len(), 1, "{list}");
    let node = &nodes[0];
    assert_eq!((node["state"].as_str(), node["sessions"].as_u64()), (Some("ready"), Some(0)), "{node}");
    // What the simulated node reports of its host (space_node_sim::SimConfig's default).
    assert_eq!((node["capacity"]["cpus"].as_u64(), node["capacity"]["memory_mib"].as_u64()), (Some(4), Some(8192)));
    assert!(node.get("address").is_none(), "the node runs in the server's process: {node}");
    let (joined, beat, lease) = (
        node["joined_at"].as_i64().unwrap(),
        node["heartbeat_at"].as_i64().unwrap(),
        node["lease_expires_at"].as_i64().unwrap(),
    );
    assert!(joined <= beat && lease == beat + 15_000, "{node}");

    // A session is counted on the node its sandbox runs on.
    let id = server.session().await;
    let (_, list) = server.call("GET", "/v1/nodes", None).await;
    assert_eq!(list["nodes"][0]["sessions"].as_u64(), Some(1), "{list}");
    server.call("DELETE", &format!("/v1/sessions/{id}"), None).await;
    let (_, list) = server.call("GET", "/v1/nodes", None).await;
    assert_eq!(list["nodes"][0]["sessions"].as_u64(), Some(0), "{list}");

    let tenant = server.tenant_key("t-nodes").await;
    assert_error(&server.call_as(&tenant, "GET", "/v1/nodes", None).await, 403, "forbidden");
}
