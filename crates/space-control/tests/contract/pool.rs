//! The warm pool through the API: creates take ready pods (which then serve their session
//! like any sandbox), and the admin resizes the pool.

use std::collections::BTreeMap;

use serde_json::json;
use space_api::RuntimeKind;
use space_node_sim::SimConfig;

use crate::harness::Server;

async fn busybox_pool(server: &Server) -> serde_json::Value {
    let (status, pool) = server.call("GET", "/v1/pool", None).await;
    assert_eq!(status, 200, "{pool}");
    pool["templates"].as_array().and_then(|t| t.iter().find(|t| t["template"] == "busybox")).cloned().unwrap()
}

#[tokio::test]
async fn creates_take_ready_pods_and_the_admin_resizes_the_pool() {
    let pool = BTreeMap::from([(("busybox".to_owned(), RuntimeKind::Linux), 2)]);
    let server = Server::start_with(SimConfig { pool, ..SimConfig::default() }).await;
    crate::lifecycle::wait_until(|| server.sim.sandboxes().iter().filter(|s| s.pod).count() == 2).await;
    let id = server.session().await;
    let sandbox = server.get(&id).await["sandbox_id"].as_str().unwrap().to_owned();
    let on_node = server.sim.sandboxes().into_iter().find(|s| s.id.as_str() == sandbox).unwrap();
    assert_eq!((on_node.pod, on_node.session.as_ref().map(|s| s.as_str())), (false, Some(id.as_str())), "joined");
    assert_eq!(busybox_pool(&server).await["hits"], 1);
    assert_eq!(server.exec(&id, &["echo", "warm"]).await.1["stdout"], "warm\n");

    let tenant = server.tenant_key("t").await;
    assert_eq!(server.call_as(&tenant, "GET", "/v1/pool", None).await.0, 200, "any key may look");
    let (status, resized) = server.call("PUT", "/v1/pool/busybox", Some(json!({ "size": 0 }))).await;
    assert_eq!(status, 200, "{resized}");
    assert_eq!(
        (busybox_pool(&server).await["size"].as_u64(), busybox_pool(&server).await["ready"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(server.sim.sandboxes().iter().all(|s| !s.pod), "the pods are destroyed");
    let cold = server.session().await;
    assert_eq!(busybox_pool(&server).await["misses"], 1, "{cold} started cold");
}

#[tokio::test]
async fn a_node_that_does_not_say_how_its_pool_is_is_left_out_of_the_sum() {
    let pool = BTreeMap::from([(("busybox".to_owned(), RuntimeKind::Linux), 2)]);
    let node = |id: &str| SimConfig { node_id: id.into(), pool: pool.clone(), ..SimConfig::default() };
    let server = Server::start_with_nodes(vec![node("node-a"), node("node-b")]).await;
    // node-b's next answer never comes: the sum is node-a's alone, not a call that hangs.
    server.sims[1].hang_next(space_node_sim::Op::PoolStatus);
    let (status, pool) = server.call("GET", "/v1/pool", None).await;
    assert_eq!(status, 200, "{pool}");
    let busybox = pool["templates"].as_array().unwrap().iter().find(|p| p["template"] == "busybox").cloned();
    assert_eq!(busybox.map(|p| p["size"].clone()), Some(json!(2)), "{pool}");
    let (status, pool) = server.call("GET", "/v1/pool", None).await;
    assert_eq!(status, 200, "{pool}");
    let busybox = pool["templates"].as_array().unwrap().iter().find(|p| p["template"] == "busybox").cloned();
    assert_eq!(busybox.map(|p| p["size"].clone()), Some(json!(4)), "both nodes again: {pool}");
}
