//! Choosing a runtime: a session runs in the runtime it asked for (else the server's
//! default) for its whole life, forks included; a runtime the node cannot run is refused
//! with a 400 that says why, before anything is recorded; pools are per template and runtime.

use std::collections::BTreeMap;

use serde_json::json;
use space_api::RuntimeKind;
use space_node_sim::SimConfig;

use crate::harness::Server;

fn runtime_of_sandbox(server: &Server, session: &serde_json::Value) -> RuntimeKind {
    let sandbox = session["sandbox_id"].as_str().expect("a sandbox");
    server.sim.sandboxes().into_iter().find(|s| s.id.as_str() == sandbox).expect("on the node").runtime
}

#[tokio::test]
async fn a_session_runs_in_the_runtime_it_asked_for_and_its_forks_too() {
    let server = Server::start().await;
    let (status, vm) = server.call("POST", "/v1/sessions", Some(json!({ "runtime": "vm" }))).await;
    assert_eq!(status, 201, "{vm}");
    assert_eq!(vm["runtime"], "vm");
    assert_eq!(runtime_of_sandbox(&server, &vm), RuntimeKind::Vm);

    let linux = server.get(&server.session().await).await;
    assert_eq!(linux["runtime"], "linux", "the server's default");
    assert_eq!(runtime_of_sandbox(&server, &linux), RuntimeKind::Linux);

    let id = vm["id"].as_str().unwrap();
    let (status, forks) = server.act(id, "fork", json!({ "count": 2 })).await;
    assert_eq!(status, 201, "{forks}");
    for fork in forks["sessions"].as_array().expect("the forks") {
        assert_eq!(fork["runtime"], "vm", "{fork}");
        assert_eq!(runtime_of_sandbox(&server, fork), RuntimeKind::Vm);
    }
}

#[tokio::test]
async fn a_runtime_the_node_cannot_run_is_refused_with_its_reason_and_records_nothing() {
    let sim = SimConfig { vm: Err("QEMU is not installed".into()), ..SimConfig::default() };
    let server = Server::start_with(sim).await;
    let (status, body) = server.call("POST", "/v1/sessions", Some(json!({ "runtime": "vm" }))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "runtime_unavailable");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("QEMU is not installed") && message.contains("space doctor"), "{message}");
    let (_, list) = server.call("GET", "/v1/sessions", None).await;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0), "nothing recorded: {list}");
    assert!(server.sim.sandboxes().is_empty());

    let (status, body) = server.call("POST", "/v1/sessions", Some(json!({ "runtime": "docker" }))).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("bad_request")), "{body}");

    let (status, body) = server.call("PUT", "/v1/pool/busybox", Some(json!({ "size": 1, "runtime": "vm" }))).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("runtime_unavailable")), "{body}");

    let (_, status) = server.call("GET", "/v1/status", None).await;
    let vm = status["runtimes"].as_array().unwrap().iter().find(|r| r["runtime"] == "vm").cloned().unwrap();
    assert_eq!((vm["available"].as_bool(), vm["detail"].as_str()), (Some(false), Some("QEMU is not installed")));
}

#[tokio::test]
async fn pools_are_kept_per_runtime_and_a_create_takes_a_pod_of_its_own_runtime() {
    let pool = BTreeMap::from([(("busybox".to_owned(), RuntimeKind::Vm), 1)]);
    let server = Server::start_with(SimConfig { pool, ..SimConfig::default() }).await;
    crate::lifecycle::wait_until(|| server.sim.sandboxes().iter().any(|s| s.pod)).await;

    let linux = server.get(&server.session().await).await;
    assert!(server.sim.sandboxes().iter().any(|s| s.pod), "a linux create leaves the vm pod alone");
    assert_eq!(runtime_of_sandbox(&server, &linux), RuntimeKind::Linux);

    let (status, vm) = server.call("POST", "/v1/sessions", Some(json!({ "runtime": "vm" }))).await;
    assert_eq!(status, 201, "{vm}");
    let (_, pool) = server.call("GET", "/v1/pool", None).await;
    let vm_pool = pool["templates"].as_array().unwrap().iter().find(|t| t["runtime"] == "vm").cloned().unwrap();
    assert_eq!(vm_pool["hits"], 1, "the vm create took the vm pod: {pool}");
    assert_eq!(runtime_of_sandbox(&server, &vm), RuntimeKind::Vm);
}
