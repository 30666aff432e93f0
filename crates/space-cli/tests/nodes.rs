//! One control plane driving two real nodes (`space control --node A --node B`, each node a
//! `space node run` with its own data dir, pool and cgroup parent): new sessions are spread
//! over both, each runs on the node it names, and its forks stay there with its snapshots.

mod common;

use std::collections::BTreeMap;

use common::Server;
use common::nodes::ExtraNode;
use serde_json::{Value, json};

fn get(server: &Server, id: &str) -> Value {
    let (status, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(status, 200, "{session}");
    session
}

/// The cgroup (pids) of session `id`'s sandbox on the node it names.
fn cgroup_of(server: &Server, second: &ExtraNode, session: &Value) -> std::path::PathBuf {
    let sandbox = session["sandbox_id"].as_str().expect("a running session's sandbox");
    match session["node"].as_str() {
        Some(node) if node == second.name => second.sandbox_cgroup("pids", sandbox),
        Some(_) => server.sandbox_cgroup("pids", sandbox),
        None => panic!("a running session names its node: {session}"),
    }
}

#[test]
fn sessions_spread_over_two_nodes_and_each_stays_on_its_own() {
    require_root!();
    let mut server = Server::start_split(&[]);
    let second = ExtraNode::start(&server, "2");
    server.add_node(&second);
    let first = server.node_id();
    assert_ne!(first, second.name);

    let mut placed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in 0..4 {
        let id = server.create_session(json!({}));
        let session = get(&server, &id);
        // Its sandbox runs on that node: in that node's cgroups, not the other's.
        assert!(cgroup_of(&server, &second, &session).exists(), "{session}");
        let out = server.exec(&id, &["sh", "-c", &format!("echo {n} > /tmp/n; cat /tmp/n")]);
        assert_eq!(out["stdout"], format!("{n}\n"), "{out}");
        placed.entry(session["node"].as_str().unwrap().to_owned()).or_default().push(id);
    }
    assert_eq!(placed.len(), 2, "both nodes have sessions: {placed:?}");

    let (_, list) = server.call("GET", "/v1/nodes", None);
    let nodes: BTreeMap<&str, (&str, u64)> = list["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), (n["state"].as_str().unwrap(), n["sessions"].as_u64().unwrap())))
        .collect();
    assert_eq!(nodes.len(), 2, "{list}");
    for (node, ids) in &placed {
        assert_eq!(nodes[node.as_str()], ("ready", ids.len() as u64), "{list}");
    }

    // A fork of a session on the second node runs there, from the parent's files.
    let parent = &placed[&second.name][0];
    let (status, forks) = server.call("POST", &format!("/v1/sessions/{parent}/fork"), Some(json!({})));
    assert_eq!(status, 201, "{forks}");
    let fork = forks["sessions"][0]["id"].as_str().unwrap().to_owned();
    let forked = get(&server, &fork);
    assert_eq!(forked["node"], second.name.as_str(), "{forked}");
    assert!(second.sandbox_cgroup("pids", forked["sandbox_id"].as_str().unwrap()).exists());
    let parent_n = server.exec(parent, &["cat", "/tmp/n"])["stdout"].clone();
    assert_eq!(server.exec(&fork, &["cat", "/tmp/n"])["stdout"], parent_n);

    // Destroyed, every session's sandbox leaves its node.
    let mut cgroups = vec![cgroup_of(&server, &second, &forked)];
    for id in placed.values().flatten().chain([&fork]) {
        cgroups.push(cgroup_of(&server, &second, &get(&server, id)));
        let (status, body) = server.call("DELETE", &format!("/v1/sessions/{id}"), None);
        assert!(status < 300, "{body}");
    }
    for cgroup in cgroups {
        assert!(!cgroup.exists(), "{} is gone", cgroup.display());
    }
}

fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) of the node process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "kill({pid}, {signal})");
}

/// Polls until node `id` is in `state`: lost once its lease (15 s, renewed every 5 s by a
/// heartbeat that asks the node) runs out. The bound only keeps a broken run from hanging.
fn wait_node_state(server: &Server, id: &str, state: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let (_, list) = server.call("GET", "/v1/nodes", None);
        let nodes = list["nodes"].as_array().cloned().unwrap_or_default();
        if nodes.iter().any(|n| n["id"] == id && n["state"] == state) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "node {id} is not {state}: {list}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// A node that stops answering (its process is stopped: `SIGSTOP`) gets no heartbeat, is
/// `lost` when its lease runs out, and no session is placed on it; once it answers again it
/// is `ready` again.
#[test]
fn a_node_that_stops_answering_is_lost_and_passed_over() {
    require_root!();
    let mut server = Server::start_split(&[]);
    let second = ExtraNode::start(&server, "2");
    server.add_node(&second);
    let first = server.node_id();

    signal(second.pid(), libc::SIGSTOP);
    wait_node_state(&server, &second.name, "lost");
    let (_, list) = server.call("GET", "/v1/nodes", None);
    assert!(list["nodes"].as_array().unwrap().iter().any(|n| n["id"] == first.as_str() && n["state"] == "ready"));
    let mut placed = Vec::new();
    for _ in 0..3 {
        let id = server.create_session(json!({}));
        let session = get(&server, &id);
        assert_eq!(session["node"], first.as_str(), "nothing is placed on a lost node: {session}");
        assert_eq!(server.exec(&id, &["echo", "ok"])["stdout"], "ok\n");
        placed.push(id);
    }

    signal(second.pid(), libc::SIGCONT);
    wait_node_state(&server, &second.name, "ready");
    // The least loaded now by far: the next session goes there.
    let id = server.create_session(json!({}));
    assert_eq!(get(&server, &id)["node"], second.name.as_str());
    assert_eq!(server.exec(&id, &["echo", "back"])["stdout"], "back\n");
}
