//! A control plane and its node in processes of their own (`space control` driving `space
//! node run` over the node API's mutual TLS): what only that topology has. The suites that
//! hold for both topologies run again split (scripts/test.sh, `SPACE_TEST_TOPOLOGY=split`).

mod common;

use std::time::{Duration, Instant};

use common::Server;
use serde_json::json;

const COUNTER: &str = "n=0; while :; do n=$((n+1)); echo $n > /root/c.new; mv /root/c.new /root/c; sleep 0.05; done";

/// The counter as the node's disk has it: readable while no control plane runs.
fn counter_on_disk(server: &Server, sandbox: &str) -> u64 {
    let path = server.data_dir.join(format!("pool/sandboxes/{sandbox}/rootfs/root/c"));
    std::fs::read_to_string(path).ok().and_then(|c| c.trim().parse().ok()).unwrap_or(0)
}

/// Polls until the on-disk counter passes `value` (the bound only keeps a broken run from
/// hanging).
fn counter_passes(server: &Server, sandbox: &str, value: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = counter_on_disk(server, sandbox);
        if now > value {
            return now;
        }
        assert!(Instant::now() < deadline, "the counter of {sandbox} stayed at {now}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `kill -9` of the control plane alone: the node and its sandboxes run on (a process inside
/// keeps counting while no control plane exists), and the control plane that starts again
/// takes the session back from the node and runs commands in it, leaves the node's warm pool
/// alone, and leaves nothing over.
#[test]
fn a_control_plane_killed_leaves_the_nodes_sandboxes_running_and_takes_them_back() {
    require_root!();
    let mut server = Server::start_split(&[]);
    let id = server.create_session(json!({}));
    let (status, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(status, 200, "{session}");
    let sandbox = session["sandbox_id"].as_str().unwrap().to_owned();
    let (status, r) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sh", "-c", COUNTER], "background": true })),
    );
    assert_eq!(status, 200, "{r}");
    let counter_pid = r["pid"].as_u64().unwrap().to_string();
    let before = counter_passes(&server, &sandbox, 3);

    // The node's warm pool, full: its pods are the node's own.
    server.wait_pool_ready("busybox", 4);
    let pods: Vec<_> = server.sandbox_cgroups().into_iter().filter(|c| !c.ends_with(&sandbox)).collect();
    assert!(pods.len() >= 4, "{pods:?}");

    server.kill9_control();
    let meanwhile = counter_passes(&server, &sandbox, before);

    server.spawn();
    let (status, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!((status, session["state"].as_str()), (200, Some("running")), "{session}");
    assert_eq!(session["sandbox_id"].as_str(), Some(sandbox.as_str()), "the session moved to another sandbox");
    // The control plane that started sweeps what it does not know, but not the node's pool.
    let gone: Vec<_> = pods.iter().filter(|pod| !pod.exists()).collect();
    assert!(gone.is_empty(), "the restarted control plane swept the node's ready pods: {gone:?}");
    let seen: u64 = server.exec(&id, &["cat", "/root/c"])["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(seen >= meanwhile, "the counter went back from {meanwhile} to {seen}");
    let alive = server.exec(&id, &["kill", "-0", &counter_pid]);
    assert_eq!(alive["exit_code"], 0, "the counting process is not the one started before: {alive}");

    let (status, _) = server.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(status, 200);
    let remaining: Vec<_> = server.sandbox_cgroups().into_iter().filter(|c| c.ends_with(&sandbox)).collect();
    assert!(remaining.is_empty(), "the destroyed sandbox's cgroups remain: {remaining:?}");
}

/// Runs `cmd` in session `id` until it answers 200 (the control plane takes a restarted node
/// back at a heartbeat); its output. The bound only keeps a broken run from hanging.
fn exec_once_back(server: &Server, id: &str, cmd: &[&str]) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, out) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(json!({ "cmd": cmd })));
        if status == 200 {
            return out;
        }
        assert!(Instant::now() < deadline, "session {id} does not answer after its node restarted: {out}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `kill -9` of the node process alone, then the node started again on its data dir: its
/// sandboxes ran on meanwhile (`spaced` outlives it), and the control plane, which ran all
/// along, takes them back without being restarted itself: commands run in the session, the
/// process counting inside is the one started before, and the node's warm pool is kept again.
#[test]
fn a_node_process_killed_and_started_again_is_taken_back_by_the_running_control_plane() {
    require_root!();
    let mut server = Server::start_split(&[]);
    let id = server.create_session(json!({}));
    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    let sandbox = session["sandbox_id"].as_str().unwrap().to_owned();
    let body = json!({ "cmd": ["sh", "-c", COUNTER], "background": true });
    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{r}");
    let counter_pid = r["pid"].as_u64().unwrap().to_string();
    let before = counter_passes(&server, &sandbox, 3);

    server.restart_node();
    let meanwhile = counter_passes(&server, &sandbox, before);
    let seen: u64 =
        exec_once_back(&server, &id, &["cat", "/root/c"])["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(seen >= meanwhile, "the counter went back from {meanwhile} to {seen}");
    let alive = server.exec(&id, &["kill", "-0", &counter_pid]);
    assert_eq!(alive["exit_code"], 0, "the counting process is not the one started before: {alive}");
    let (status, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!((status, session["sandbox_id"].as_str()), (200, Some(sandbox.as_str())), "{session}");
    // The warm pool is kept by the restarted node: a larger size fills.
    let (status, pool) = server.call("PUT", "/v1/pool/busybox", Some(json!({ "size": 6 })));
    assert_eq!(status, 200, "{pool}");
    server.wait_pool_ready("busybox", 6);

    let (status, _) = server.call("DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(status, 200);
    let remaining: Vec<_> = server.sandbox_cgroups().into_iter().filter(|c| c.ends_with(&sandbox)).collect();
    assert!(remaining.is_empty(), "the destroyed sandbox's cgroups remain: {remaining:?}");
}
