//! One control plane driving two real nodes (`space control --node A --node B`, each node a
//! `space node run` with its own data dir, pool and cgroup parent): new sessions are spread
//! over both, each runs on the node it names, and its forks stay there with its snapshots.

mod common;

use std::collections::BTreeMap;

use common::Server;
use common::counter::{Stopped, counter_above_at, counter_at, start_counter};
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

/// A node that stops answering (its process is stopped: `SIGSTOP`) is passed over at once by
/// what asks any node (the templates, the check of a new session's template) and by
/// placement; it gets no heartbeat and is `lost` when its lease runs out, and no session is
/// placed on it; once it answers again it is `ready` again. The node stopped is the first by
/// id, the one asked first.
#[test]
fn a_node_that_stops_answering_is_passed_over_then_lost() {
    require_root!();
    let mut server = Server::start_split(&[]);
    let second = ExtraNode::start(&server, "2");
    server.add_node(&second);
    let first = server.node_id();
    assert!(first < second.name, "{first} is asked first");

    let stopped = Stopped::stop(server.node_pid());
    let (status, templates) = server.call("GET", "/v1/templates", None);
    assert_eq!(status, 200, "the other node answers: {templates}");
    let built = templates["templates"].as_array().unwrap();
    assert!(built.iter().any(|t| t["name"] == "busybox"), "the other node's built templates: {templates}");
    let (status, unknown) = server.call("POST", "/v1/sessions", Some(json!({"template": "no-such"})));
    assert_eq!((status, unknown["error"]["code"].as_str()), (400, Some("unknown_template")), "{unknown}");
    let mut placed = vec![server.create_session(json!({}))];
    wait_node_state(&server, &first, "lost");
    placed.push(server.create_session(json!({})));
    for id in &placed {
        let session = get(&server, id);
        assert_eq!(session["node"], second.name.as_str(), "nothing is placed on a stopped node: {session}");
        assert_eq!(server.exec(id, &["echo", "ok"])["stdout"], "ok\n");
    }

    drop(stopped);
    wait_node_state(&server, &first, "ready");
    // The least loaded now by far: the next session goes there.
    let id = server.create_session(json!({}));
    assert_eq!(get(&server, &id)["node"], first.as_str());
    assert_eq!(server.exec(&id, &["echo", "back"])["stdout"], "back\n");
}

fn counter(server: &Server, id: &str) -> u64 {
    counter_at(server, &server.url, id)
}

fn counter_above(server: &Server, id: &str, value: u64) -> u64 {
    counter_above_at(server, &server.url, id, value)
}

/// Two nodes sharing a blob store (a directory), and a session running the counter on one of
/// them (`placed`, whose process is `pid`; the other is `other`). Fields drop in this order:
/// the servers before the store's directory.
struct Counting {
    server: Server,
    second: ExtraNode,
    id: String,
    placed: String,
    other: String,
    pid: u32,
    blobs: tempfile::TempDir,
}

impl Counting {
    fn start() -> Counting {
        let blobs = tempfile::Builder::new().prefix("space-test-blobs-").tempdir_in("/var/tmp").unwrap();
        let store = blobs.path().to_str().unwrap().to_owned();
        let mut server = Server::start_split(&["--blob-store", &store]);
        let second = ExtraNode::start_with(&server, "2", &["--blob-store", &store]);
        server.add_node(&second);
        let id = server.create_session(json!({}));
        let placed = get(&server, &id)["node"].as_str().unwrap().to_owned();
        let (pid, other) = match placed == second.name {
            true => (second.pid(), server.node_id()),
            false => (server.node_pid(), second.name.clone()),
        };
        start_counter(&server, &server.url, &id);
        Counting { server, second, id, placed, other, pid, blobs }
    }
}

/// Two nodes sharing a blob store (a directory): a session suspended on one is exported, its
/// node is lost (stopped), and it resumes on the other from the blob store (its root
/// received, its process images checked and restored by CRIU), its counter process counting
/// on from where it was.
#[test]
fn a_counter_suspended_on_a_lost_node_resumes_on_the_other_and_keeps_counting() {
    require_root!();
    let c = Counting::start();
    let (server, id, placed, other, pid) = (&c.server, &c.id, &c.placed, &c.other, c.pid);
    let before = counter_above(server, id, 3);

    let (status, suspended) = server.call("POST", &format!("/v1/sessions/{id}/suspend"), Some(json!({})));
    assert_eq!((status, suspended["state"].as_str()), (200, Some("suspended")), "{suspended}");
    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None);
    let snapshot = list["snapshots"].as_array().unwrap().last().cloned().unwrap();
    assert_eq!((snapshot["kind"].as_str(), snapshot["durable"].as_bool()), (Some("full"), Some(true)), "{list}");

    let stopped = Stopped::stop(pid);
    wait_node_state(server, placed, "lost");
    let (status, resumed) = server.call("POST", &format!("/v1/sessions/{id}/resume"), Some(json!({})));
    assert_eq!(status, 200, "{resumed}\n{}", server.log_text());
    assert_eq!((resumed["state"].as_str(), resumed["node"].as_str()), (Some("running"), Some(other.as_str())));
    let at_resume = counter(server, id);
    assert!(at_resume >= before, "the counter went back from {before} to {at_resume}");
    counter_above(server, id, at_resume);

    drop(stopped);
    wait_node_state(server, placed, "ready");
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
}

/// Two nodes sharing a blob store: `space node drain` of the node a counter session runs on
/// moves it to the other (suspended into the blob store, resumed there by CRIU), its counter
/// counting on; the drained node is cordoned and runs nothing of it, and new sessions go to
/// the other node until `space node uncordon`.
#[test]
fn a_drain_moves_a_counting_session_to_the_other_node_and_nothing_is_lost() {
    require_root!();
    let c = Counting::start();
    let (server, second, id, placed, other) = (&c.server, &c.second, &c.id, &c.placed, &c.other);
    let old_cgroup = cgroup_of(server, second, &get(server, id));
    server.exec(id, &["sh", "-c", "echo kept > /root/note"]);
    let before = counter_above(server, id, 3);

    let out = server.cli(&["--json", "node", "drain", placed]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(out.status.success(), "{report}\n{}\n{}", String::from_utf8_lossy(&out.stderr), server.log_text());
    assert_eq!((report["moved"].clone(), report["failed"].clone()), (json!([id]), json!([])), "{report}");
    assert_eq!(report["node"]["cordoned"], true, "{report}");

    let moved = get(server, id);
    assert_eq!((moved["state"].as_str(), moved["node"].as_str()), (Some("running"), Some(other.as_str())));
    assert!(!old_cgroup.exists(), "nothing of it runs on the drained node: {}", old_cgroup.display());
    assert!(cgroup_of(server, second, &moved).exists());
    let after = counter(server, id);
    assert!(after >= before, "the counter went back from {before} to {after}");
    counter_above(server, id, after);
    assert_eq!(server.exec(id, &["cat", "/root/note"])["stdout"], "kept\n");

    // Cordoned: new sessions go to the other node, until the cordon is lifted.
    let next = server.create_session(json!({}));
    assert_eq!(get(server, &next)["node"], other.as_str());
    let out = server.cli(&["node", "uncordon", placed]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = server.cli(&["node", "list"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(!table.contains("cordoned"), "{table}");
    for id in [id, &next] {
        assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
    }

    // The drain's export is no snapshot's any more, but its objects are too young to judge.
    let out = server.cli(&["--json", "blobs", "sweep"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(out.status.success(), "{report}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        (report["swept"].as_bool(), report["objects"]["deleted_objects"].as_u64()),
        (Some(true), Some(0)),
        "{report}"
    );
    assert!(report["objects"]["kept_objects"].as_u64() >= Some(3), "root stream, images, spaced: {report}");
}

/// Two nodes sharing a blob store: a counting session with a durable full snapshot, then
/// `kill -9` of its node's process and of its sandbox's processes. The node is lost, the
/// session `interrupted`; resumed, it runs on the other node from that snapshot (CRIU), its
/// counter going on from where the snapshot had it, and what it wrote after is gone.
#[test]
fn a_session_whose_node_is_killed_resumes_on_the_other_from_its_durable_snapshot() {
    require_root!();
    let c = Counting::start();
    let (server, second, id, placed, other, pid) = (&c.server, &c.second, &c.id, &c.placed, &c.other, c.pid);
    let session = get(server, id);
    counter_above(server, id, 3);

    let (status, snapshot) =
        server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "full" })));
    assert_eq!(status, 201, "{snapshot}");
    let snapshot = snapshot["id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, shown) = server.call("GET", &format!("/v1/sessions/{id}/snapshots/{snapshot}"), None);
        if shown["durable"] == true {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never durable: {shown}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    server.exec(id, &["sh", "-c", "echo after > /root/after"]);

    // The node and everything of the sandbox, as a machine that dies.
    let procs = cgroup_of(server, second, &session).join("cgroup.procs");
    signal(pid, libc::SIGKILL);
    for line in std::fs::read_to_string(&procs).unwrap_or_default().lines() {
        if let Ok(sandboxed) = line.trim().parse::<u32>() {
            // SAFETY: kill(2) of a process of the sandbox this test made.
            unsafe { libc::kill(sandboxed as i32, libc::SIGKILL) };
        }
    }
    wait_node_state(server, placed, "lost");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let interrupted = loop {
        let session = get(server, id);
        if session["state"] == "interrupted" {
            break session;
        }
        assert!(std::time::Instant::now() < deadline, "never interrupted: {session}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert!(interrupted["error"].as_str().unwrap().contains(&snapshot), "{interrupted}");

    let (status, resumed) = server.call("POST", &format!("/v1/sessions/{id}/resume"), Some(json!({})));
    assert_eq!(status, 200, "{resumed}\n{}", server.log_text());
    assert_eq!((resumed["state"].as_str(), resumed["node"].as_str()), (Some("running"), Some(other.as_str())));
    // The counting process itself came back (it goes on from its count, not from 0).
    let at_resume = counter(server, id);
    assert!(at_resume > 3, "the counter started again: {at_resume}");
    counter_above(server, id, at_resume);
    let after = server.exec(id, &["sh", "-c", "cat /root/after 2>/dev/null || echo gone"]);
    assert_eq!(after["stdout"], "gone\n", "written after the snapshot: lost with the node");
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
}

/// Bytes of every file under `dir`.
fn bytes_under(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() { bytes_under(&entry.path()) } else { meta.len() };
    }
    total
}

/// Two nodes sharing a blob store: a session's second suspend sends its root against the
/// first's, which the store holds already, so the 16 MiB written before the first does not
/// travel again. With the first snapshot deleted, the session still resumes on the other
/// node, which receives the first's root, then the second's, and has every byte.
#[test]
fn a_second_suspend_sends_only_what_changed_and_resumes_elsewhere_with_its_parent() {
    require_root!();
    let c = Counting::start();
    let (server, id, placed, other) = (&c.server, &c.id, &c.placed, &c.other);
    let sum = |server: &Server| server.exec(id, &["md5sum", "/root/big"])["stdout"].as_str().unwrap().to_owned();
    server.exec(id, &["sh", "-c", "head -c 16777216 /dev/urandom > /root/big"]);
    let written = sum(server);
    let suspend = |server: &Server| {
        let (status, body) = server.call("POST", &format!("/v1/sessions/{id}/suspend"), Some(json!({})));
        assert_eq!((status, body["state"].as_str()), (200, Some("suspended")), "{body}\n{}", server.log_text());
    };
    suspend(server);
    let (status, resumed) = server.call("POST", &format!("/v1/sessions/{id}/resume"), Some(json!({})));
    assert_eq!((status, resumed["node"].as_str()), (200, Some(placed.as_str())), "{resumed}");
    let first_export = bytes_under(c.blobs.path());
    assert!(first_export > 16 << 20, "the first export holds the file whole: {first_export} bytes");
    server.exec(id, &["sh", "-c", "echo changed > /root/note"]);
    suspend(server);
    let grew = bytes_under(c.blobs.path()) - first_export;
    assert!(grew < 8 << 20, "the second export sent the file again: {grew} bytes more");

    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None);
    let first = list["snapshots"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}/snapshots/{first}"), None).0, 204);
    let (status, body) = server.call("POST", &format!("/v1/nodes/{placed}/cordon"), Some(json!({})));
    assert_eq!(status, 200, "{body}");
    let (status, resumed) = server.call("POST", &format!("/v1/sessions/{id}/resume"), Some(json!({})));
    assert_eq!(status, 200, "{resumed}\n{}", server.log_text());
    assert_eq!(resumed["node"].as_str(), Some(other.as_str()), "{resumed}");
    assert_eq!(sum(server), written);
    assert_eq!(server.exec(id, &["cat", "/root/note"])["stdout"], "changed\n");
    let at_resume = counter(server, id);
    counter_above(server, id, at_resume);
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
}

/// Builds template `name` from a Dockerfile whose `RUN` writes a fresh UUID to `/made`: two
/// nodes that each ran the step would hold different ones.
fn build_unique(server: &Server, name: &str) {
    let dir = server.data_dir.join(format!("ctx-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Dockerfile"), "FROM busybox\nRUN cat /proc/sys/kernel/random/uuid > /made\n").unwrap();
    let out = server.cli(&["template", "build", name, dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), server.log_text());
}

/// What `/made` holds in a session of `template` on each node, by node id (new sessions go
/// to the less loaded of two equal nodes, so they alternate while they live).
fn made_on_each_node(server: &Server, template: &str) -> BTreeMap<String, String> {
    let (mut made, mut ids) = (BTreeMap::new(), Vec::new());
    for _ in 0..6 {
        let id = server.create_session(json!({ "template": template }));
        let node = get(server, &id)["node"].as_str().unwrap().to_owned();
        made.insert(node, server.exec(&id, &["cat", "/made"])["stdout"].as_str().unwrap().to_owned());
        ids.push(id);
        if made.len() == 2 {
            break;
        }
    }
    for id in ids {
        assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
    }
    made
}

/// Nodes sharing a blob store: a template built before a node joined reaches it when the
/// control plane starts with it, and one built with both nodes is built once and imported by
/// the other; either way both nodes run the very same files (the UUID its one `RUN` wrote).
#[test]
fn templates_travel_to_every_node_through_the_blob_store() {
    require_root!();
    let blobs = tempfile::Builder::new().prefix("space-test-blobs-").tempdir_in("/var/tmp").unwrap();
    let store = blobs.path().to_str().unwrap().to_owned();
    let mut server = Server::start_split(&["--blob-store", &store]);
    build_unique(&server, "before");
    let second = ExtraNode::start_with(&server, "2", &["--blob-store", &store]);
    server.add_node(&second);
    let given = second.data_dir.join("pool/templates/before@1.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !given.exists() {
        assert!(std::time::Instant::now() < deadline, "the new node never got `before`:\n{}", server.log_text());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    build_unique(&server, "after");
    for template in ["before", "after"] {
        let made = made_on_each_node(&server, template);
        assert_eq!(made.len(), 2, "{template}: sessions on both nodes: {made:?}");
        let uuids: Vec<&String> = made.values().collect();
        assert_eq!(uuids[0], uuids[1], "{template}: one build, the same files on both nodes: {made:?}");
    }
    drop(second);
    drop(server);
}

/// A cpuset cgroup made for this test, removed again when it ends (the node's own cleanup
/// removes it too once the node is gone).
struct Cpuset(std::path::PathBuf);

impl Drop for Cpuset {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A restore makes the sandbox's cpuset cgroup with its own node's CPUs, not with those CRIU
/// recorded where the image was dumped: a session suspended on a node that may use every CPU
/// resumes on a node whose cgroup parent is confined to CPU 0 (where CRIU could not make a
/// cgroup of more CPUs), and sees one CPU there.
#[test]
fn a_session_resumes_on_a_node_with_fewer_cpus() {
    require_root!();
    let root = std::path::Path::new("/sys/fs/cgroup/cpuset");
    let all = std::fs::read_to_string(root.join("cpuset.cpus")).expect("this test needs cgroup v1's cpuset");
    assert_ne!(all.trim(), "0", "this test needs a host with two CPUs or more");
    let blobs = tempfile::Builder::new().prefix("space-test-blobs-").tempdir_in("/var/tmp").unwrap();
    let store = blobs.path().to_str().unwrap().to_owned();
    let mut server = Server::start_split(&["--blob-store", &store]);
    // The second node's cgroup parent (as ExtraNode names it), confined before it starts.
    let tag = server.data_dir.file_name().unwrap().to_str().unwrap().trim_start_matches("space-test-").to_owned();
    let confined = Cpuset(root.join(format!("space-test-{tag}-2")));
    std::fs::create_dir(&confined.0).unwrap();
    std::fs::write(confined.0.join("cpuset.cpus"), "0").unwrap();
    std::fs::write(confined.0.join("cpuset.mems"), std::fs::read_to_string(root.join("cpuset.mems")).unwrap()).unwrap();
    let second = ExtraNode::start_with(&server, "2", &["--blob-store", &store]);
    server.add_node(&second);
    let cordon = |node: &str, how: &str| {
        let (status, body) = server.call("POST", &format!("/v1/nodes/{node}/{how}"), Some(json!({})));
        assert_eq!(status, 200, "{body}");
    };
    cordon(&second.name, "cordon");
    let id = server.create_session(json!({}));
    assert_eq!(get(&server, &id)["node"].as_str(), Some(server.node_id().as_str()));
    let (status, body) = server.call("POST", &format!("/v1/sessions/{id}/suspend"), Some(json!({})));
    assert_eq!((status, body["state"].as_str()), (200, Some("suspended")), "{body}");
    cordon(&second.name, "uncordon");
    cordon(&server.node_id(), "cordon");
    let (status, resumed) = server.call("POST", &format!("/v1/sessions/{id}/resume"), Some(json!({})));
    assert_eq!(status, 200, "{resumed}\n{}", server.log_text());
    assert_eq!(resumed["node"].as_str(), Some(second.name.as_str()), "{resumed}");
    let sandbox = get(&server, &id)["sandbox_id"].as_str().unwrap().to_owned();
    let cpus = std::fs::read_to_string(second.sandbox_cgroup("cpuset", &sandbox).join("cpuset.cpus")).unwrap();
    assert_eq!(cpus.trim(), "0", "the restored sandbox's cpuset is its node's");
    let r = server.exec(&id, &["sh", "-c", "nproc; grep -c ^processor /proc/cpuinfo"]);
    assert_eq!(r["stdout"], "1\n1\n", "{r}");
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
}
