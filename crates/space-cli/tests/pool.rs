//! The warm pool: pods serve one session each, pooled sessions are indistinguishable from cold
//! ones, a crash leaves no pods behind and refilling respects its concurrency ceiling.

mod common;

use std::collections::HashSet;

use common::Server;
use serde_json::{Value, json};

fn sandbox_of(server: &Server, id: &str) -> String {
    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    session["sandbox_id"].as_str().expect("running session has a sandbox").to_owned()
}

fn stdout(server: &Server, id: &str, script: &str) -> String {
    let r = server.exec(id, &["sh", "-c", script]);
    assert_eq!(r["exit_code"], 0, "{script}: {r}");
    r["stdout"].as_str().unwrap().to_owned()
}

fn hits(server: &Server) -> u64 {
    server.pool("busybox")["hits"].as_u64().unwrap()
}

#[test]
fn a_pod_serves_exactly_one_session() {
    require_root!();
    let server = Server::start_with(&["--pool", "busybox=3"]);
    server.wait_pool_ready("busybox", 3);
    let ids: Vec<String> = std::thread::scope(|scope| {
        let tasks: Vec<_> = (0..6).map(|_| scope.spawn(|| server.create_session(json!({})))).collect();
        tasks.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(hits(&server) >= 3, "the ready pods were not used: {}", server.pool("busybox"));
    let sandboxes: HashSet<String> = ids.iter().map(|id| sandbox_of(&server, id)).collect();
    assert_eq!(sandboxes.len(), ids.len(), "two sessions share a sandbox");
    let mut identities = HashSet::new();
    for id in &ids {
        stdout(&server, id, &format!("echo {id} > /root/owner"));
    }
    for id in &ids {
        assert_eq!(stdout(&server, id, "cat /root/owner"), format!("{id}\n"), "another session wrote here");
        identities.insert(stdout(&server, id, "hostname; cat /etc/machine-id"));
    }
    assert_eq!(identities.len(), ids.len(), "hostname or machine-id repeated: {identities:?}");

    // A destroyed session's pod never comes back: the next sessions get fresh ones.
    for id in &ids {
        assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
    }
    server.wait_pool_ready("busybox", 3);
    let before = hits(&server);
    let next = server.create_session(json!({}));
    assert_eq!(hits(&server), before + 1, "create did not take a pod");
    assert!(!sandboxes.contains(&sandbox_of(&server, &next)), "a destroyed sandbox was handed out again");
    assert_eq!(stdout(&server, &next, "cat /root/owner 2>/dev/null || echo clean"), "clean\n");
}

/// What a session can observe about its own confinement, minus its identity.
fn confinement(server: &Server, id: &str) -> String {
    stdout(
        server,
        id,
        "cat /proc/self/uid_map /proc/self/gid_map; \
         grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status; \
         cat /proc/1/cmdline; echo; ls -a / /dev; echo A=$A; id; ulimit -n",
    )
}

/// The host id sandbox root maps to, from the first line of [`confinement`] (its uid_map).
fn host_range(confinement: &str) -> String {
    let map = confinement.lines().next().unwrap_or_default();
    let fields: Vec<&str> = map.split_whitespace().collect();
    assert_eq!((fields.len(), fields.first()), (3, Some(&"0")), "uid_map {map:?}");
    format!(" {} ", fields[1])
}

fn host_limits(server: &Server, sandbox: &str) -> Vec<String> {
    [("memory", "memory.limit_in_bytes"), ("cpu", "cpu.cfs_quota_us"), ("pids", "pids.max")]
        .iter()
        .map(|(controller, file)| {
            let path = server.sandbox_cgroup(controller, sandbox).join(file);
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_owned()
        })
        .collect()
}

#[test]
fn a_pooled_session_is_indistinguishable_from_a_cold_one() {
    require_root!();
    let server = Server::start_with(&["--pool", "busybox=1"]);
    server.wait_pool_ready("busybox", 1);
    let request = json!({ "memory_mib": 300, "cpus": 0.5, "pids": 64, "env": { "A": "from-session" } });

    let warm = server.create_session(request.clone());
    assert_eq!(hits(&server), 1, "the first create did not come from the pool");
    let (status, _) = server.call("PUT", "/v1/pool/busybox", Some(json!({ "size": 0 })));
    assert_eq!(status, 200);
    let misses = server.pool("busybox")["misses"].as_u64().unwrap();
    let cold = server.create_session(request);
    assert_eq!(server.pool("busybox")["misses"].as_u64().unwrap(), misses + 1, "the second create was not cold");

    let (warm_sbx, cold_sbx) = (sandbox_of(&server, &warm), sandbox_of(&server, &cold));
    let (warm_seen, cold_seen) = (confinement(&server, &warm), confinement(&server, &cold));
    assert!(warm_seen.contains("A=from-session"));
    // A VM's confinement is its VMM's, and its guest RAM is fixed at boot (a pod of other
    // memory is not used): tests/vm.rs checks those.
    if common::runtime() == "linux" {
        // The same confinement, in host id ranges of their own (a pod's is taken when it starts).
        let (warm_range, cold_range) = (host_range(&warm_seen), host_range(&cold_seen));
        assert_ne!(warm_range, cold_range, "the pod and the cold sandbox share host ids");
        assert_eq!(warm_seen.replace(&warm_range, "R"), cold_seen.replace(&cold_range, "R"));
        let expected = vec![(300u64 << 20).to_string(), "50000".to_string(), "64".to_string()];
        assert_eq!(host_limits(&server, &warm_sbx), expected, "the pod did not get the session's limits");
        assert_eq!(host_limits(&server, &cold_sbx), expected);
    }
    for (id, sbx) in [(&warm, &warm_sbx), (&cold, &cold_sbx)] {
        let hostname = sbx.trim_start_matches("sbx_").chars().take(12).collect::<String>();
        assert_eq!(stdout(&server, id, "hostname"), format!("{hostname}\n"));
    }
    let machine_id = |id: &str| stdout(&server, id, "cat /etc/machine-id");
    assert_ne!(machine_id(&warm), machine_id(&cold));
}

#[test]
fn kill9_with_a_full_pool_leaves_no_orphan_pods() {
    require_root!();
    let mut server = Server::start_with(&["--pool", "busybox=4"]);
    server.wait_pool_ready("busybox", 4);
    assert_eq!(server.sandbox_roots().len(), 4, "the pool's roots: {:?}", server.sandbox_roots());
    assert!(!server.sandbox_pids().is_empty());
    server.kill9();
    server.extra_args = vec!["--pool".into(), String::new()];
    server.spawn();
    assert!(server.sandbox_pids().is_empty(), "pod processes left: {:?}", server.sandbox_pids());
    assert!(server.sandbox_cgroups().is_empty(), "pod cgroups left: {:?}", server.sandbox_cgroups());
    assert!(server.sandbox_roots().is_empty(), "pod roots left: {:?}", server.sandbox_roots());
    assert!(server.sockets().is_empty(), "pod sockets left: {:?}", server.sockets());
    // The pool comes back when sized again.
    assert_eq!(server.call("PUT", "/v1/pool/busybox", Some(json!({ "size": 2 }))).0, 200);
    server.wait_pool_ready("busybox", 2);
}

#[test]
fn refilling_respects_the_ceiling_of_concurrent_preparations() {
    require_root!();
    let server = Server::start_with(&["--pool", "busybox=6", "--pool-fill-concurrency", "2"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut seen = 0;
    loop {
        assert!(std::time::Instant::now() < deadline, "the pool never filled: {}", server.log_text());
        let (_, pool) = server.call("GET", "/v1/pool", None);
        assert_eq!(pool["max_filling"], 2, "{pool}");
        let filling = pool["filling"].as_u64().unwrap();
        assert!(filling <= 2, "{filling} pods prepared at once: {pool}");
        seen = seen.max(filling);
        if pool["templates"][0]["ready"] == 6 {
            assert_eq!(pool["peak_filling"], 2, "the ceiling was never used or exceeded: {pool}");
            break;
        }
    }
    assert!(seen <= 2);
    // Shrinking destroys the extra pods; growing refills under the same ceiling.
    assert_eq!(server.call("PUT", "/v1/pool/busybox", Some(json!({ "size": 1 }))).0, 200);
    assert_eq!(server.pool("busybox")["ready"], 1);
    assert_eq!(server.call("PUT", "/v1/pool/busybox", Some(json!({ "size": 5 }))).0, 200);
    server.wait_pool_ready("busybox", 5);
    let (_, pool) = server.call("GET", "/v1/pool", None);
    assert_eq!(pool["peak_filling"], 2, "{pool}");
}

#[test]
fn pool_sizing_is_validated_and_admin_only() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let set = |key: &str, template: &str, body: Value| {
        server.call_as(key, "PUT", &format!("/v1/pool/{template}"), Some(body))
    };
    let (status, body) = set(&server.key, "nope", json!({ "size": 1 }));
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("unknown_template")), "{body}");
    let (status, body) = set(&server.key, "busybox", json!({ "size": 100000 }));
    assert_eq!(status, 400, "{body}");
    let (status, body) = set(&server.key, "busybox", json!({ "size": "many" }));
    assert_eq!(status, 400, "{body}");

    let tenant_key = server.tenant_key("acme");
    let (status, body) = set(&tenant_key, "busybox", json!({ "size": 1 }));
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")), "{body}");
    let (status, _) = server.call_as(&tenant_key, "GET", "/v1/pool", None);
    assert_eq!(status, 200);

    let out = server.cli(&["pool", "set", "busybox", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    server.wait_pool_ready("busybox", 2);
    // The fields themselves: " 2 " in the printed table would also match another column.
    let out = server.cli(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let busybox = status["pool"]["templates"].as_array().and_then(|t| t.iter().find(|t| t["template"] == "busybox"));
    assert_eq!(busybox.map(|t| (t["size"].clone(), t["ready"].clone())), Some((json!(2), json!(2))), "{status}");
}

#[test]
fn cold_creates_beyond_the_start_concurrency_wait_their_turn() {
    require_root!();
    let server = Server::start_with(&["--pool", "", "--start-concurrency", "1"]);
    let ids: Vec<String> = std::thread::scope(|s| {
        let creates: Vec<_> = (0..4).map(|_| s.spawn(|| server.create_session(json!({})))).collect();
        creates.into_iter().map(|c| c.join().expect("a create panicked")).collect()
    });
    for id in &ids {
        let out = server.exec(id, &["echo", "hi"]);
        assert_eq!(out["stdout"], "hi\n", "{out}");
    }
}
