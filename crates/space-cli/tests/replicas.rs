//! Two control replicas over one PostgreSQL database and one node (`space control` twice,
//! driving one `space node run`): any replica answers for any session, and a replica that
//! dies leaves its operations and its node to the other. Runs under
//! `scripts/with-postgres.sh` (scripts/test.sh), which starts the database server.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Server;
use common::counter::{Stopped, counter_above_at, counter_at, start_counter};
use common::nodes::ExtraNode;
use common::replicas::{Replica, create_database, postgres_server, psql};
use serde_json::{Value, json};

/// Polls `replica` until session `id` is in `state` (the bound only keeps a broken run from
/// hanging: takeovers wait for a lease to run out).
fn wait_state(server: &Server, replica: &Replica, id: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, session) = replica.call(server, "GET", &format!("/v1/sessions/{id}"), None);
        if status == 200 && session["state"] == state {
            return session;
        }
        assert!(Instant::now() < deadline, "session {id} is not {state} through {}: {session}", replica.name);
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The state and claimant of session `id`'s `kind` operation, as the database has them.
fn operation(database: &str, id: &str, kind: &str) -> String {
    psql(
        database,
        &format!(
            "SELECT state || ' ' || COALESCE(claimed_by, '-') FROM operations WHERE session_id = '{id}' AND kind = '{kind}'"
        ),
    )
}

fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) of a process this test started (the node) or found in its server's
    // sandbox cgroup.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "kill({pid}, {signal})");
}

fn pids_in(cgroup: &Path) -> Vec<u32> {
    let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
    procs.lines().filter_map(|l| l.parse().ok()).collect()
}

/// Replica A (`control-1`, the split server's own) keeps the node; B (`control-2`) starts
/// beside it. Both answer for sessions either created. A is killed while it runs a destroy
/// that its node cannot answer yet: B takes the destroy over once A's lease ran out and
/// finishes it, and takes the node over, so that a sandbox that dies afterwards is noticed
/// (only the node's keeper watches its sandboxes).
#[test]
fn a_replica_killed_mid_operation_leaves_it_and_its_node_to_the_other() {
    require_root!();
    let database = create_database(&postgres_server());
    let mut server = Server::start_split(&["--database", &database, "--pool", "busybox=0"]);
    let first = server.create_session(json!({}));
    let mut b = Replica::start(&server, "control-2", &database);

    // Any replica serves any session.
    let (status, session) = b.call(&server, "GET", &format!("/v1/sessions/{first}"), None);
    assert_eq!((status, session["state"].as_str()), (200, Some("running")), "{session}");
    let first_sandbox = session["sandbox_id"].as_str().unwrap().to_owned();
    let (status, out) =
        b.call(&server, "POST", &format!("/v1/sessions/{first}/exec"), Some(json!({ "cmd": ["echo", "via b"] })));
    assert_eq!((status, out["stdout"].as_str()), (200, Some("via b\n")), "{out}");
    let (status, second) = b.call(&server, "POST", "/v1/sessions", Some(json!({})));
    assert_eq!(status, 201, "{second}");
    let second = second["id"].as_str().unwrap().to_owned();
    assert_eq!(server.exec(&second, &["echo", "via a"])["stdout"], "via a\n");
    let second_cgroup =
        server.sandbox_cgroup("pids", wait_state(&server, &b, &second, "running")["sandbox_id"].as_str().unwrap());
    let first_cgroup = server.sandbox_cgroup("pids", &first_sandbox);
    assert!(second_cgroup.exists() && first_cgroup.exists());

    // A claims a destroy its node does not answer (the node is stopped), and dies with it.
    signal(server.node_pid(), libc::SIGSTOP);
    let (status, body) = server.call("DELETE", &format!("/v1/sessions/{second}?wait=false"), None);
    assert_eq!(status, 202, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while operation(&database, &second, "destroy_session") != "running control-1" {
        assert!(
            Instant::now() < deadline,
            "A did not claim the destroy: {}",
            operation(&database, &second, "destroy_session")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill9_control();
    signal(server.node_pid(), libc::SIGCONT);

    // B, which was running all along, finishes it once A's lease ran out.
    wait_state(&server, &b, &second, "destroyed");
    assert_eq!(operation(&database, &second, "destroy_session"), "succeeded control-2");
    assert!(!second_cgroup.exists(), "the destroyed sandbox's cgroup remains");

    // B keeps the node now: the first session's sandbox dying is noticed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while psql(&database, "SELECT holder FROM leases WHERE name LIKE 'node:%'") != "control-2" {
        assert!(Instant::now() < deadline, "B did not take the node over");
        std::thread::sleep(Duration::from_millis(200));
    }
    for pid in pids_in(&first_cgroup) {
        signal(pid, libc::SIGKILL);
    }
    let failed = wait_state(&server, &b, &first, "failed");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("sandbox_exited:"), "{failed}");
    let (status, body) = b.call(&server, "DELETE", &format!("/v1/sessions/{first}"), None);
    assert_eq!(status, 200, "{body}");
    assert!(!first_cgroup.exists(), "the failed session's cgroup remains");
    b.kill9();
}

/// The state of session `id` as the database has it.
fn session_state(database: &str, id: &str) -> String {
    psql(database, &format!("SELECT state FROM sessions WHERE id = '{id}'"))
}

/// Polls the database until `what` says `expected`.
fn wait_db(what: impl Fn() -> String, expected: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = what();
        if now == expected {
            return;
        }
        assert!(Instant::now() < deadline, "the database says {now:?}, not {expected:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `POST`s `body` to `path` on replica A on a thread of its own: A blocks on its stopped
/// node, and is killed before it answers.
fn call_a_in_background(server: &Server, path: String, body: String) -> std::thread::JoinHandle<()> {
    let (url, auth) = (server.url.clone(), server.auth());
    std::thread::spawn(move || {
        let _ = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-X", "POST", "-H", &auth, "-H", "Content-Type: application/json"])
            .args(["-d", &body, &format!("{url}{path}")])
            .output();
    })
}

/// A is killed in the middle of a suspend, then of a resume, each waiting on the node
/// (stopped meanwhile); B, which runs all along, finishes each: the suspend is given up once
/// its lease runs out (no full snapshot was taken: the session runs on, thawed), and the
/// resume is B's operation once A's lease ran out. A counter process in the session counts
/// on through both and never goes back.
#[test]
fn a_replica_killed_mid_suspend_or_resume_leaves_it_to_the_other() {
    require_root!();
    let database = create_database(&postgres_server());
    let mut server = Server::start_split(&["--database", &database, "--pool", "busybox=0"]);
    let id = server.create_session(json!({}));
    let mut b = Replica::start(&server, "control-2", &database);
    start_counter(&server, &b.url, &id);
    let before = counter_above_at(&server, &b.url, &id, 3);

    // The suspend: A freezes the sandbox's processes through its node, which is stopped.
    let stopped = Stopped::stop(server.node_pid());
    let call = call_a_in_background(&server, format!("/v1/sessions/{id}/suspend"), "{}".into());
    wait_db(|| session_state(&database, &id), "suspending");
    server.kill9_control();
    call.join().unwrap();
    drop(stopped);
    let session = wait_state(&server, &b, &id, "running");
    assert!(session["error"].as_str().is_some_and(|e| e.contains("kept running")), "{session}");
    let after = counter_above_at(&server, &b.url, &id, before);

    // The resume: A's restore waits on the stopped node.
    server.spawn();
    let (status, suspended) = b.call(&server, "POST", &format!("/v1/sessions/{id}/suspend"), None);
    assert_eq!((status, suspended["state"].as_str()), (200, Some("suspended")), "{suspended}");
    let stopped = Stopped::stop(server.node_pid());
    let call = call_a_in_background(&server, format!("/v1/sessions/{id}/resume"), "{}".into());
    wait_db(|| operation(&database, &id, "restore_session"), "running control-1");
    server.kill9_control();
    call.join().unwrap();
    drop(stopped);
    wait_state(&server, &b, &id, "running");
    assert_eq!(operation(&database, &id, "restore_session"), "succeeded control-2");
    let resumed = counter_at(&server, &b.url, &id);
    assert!(resumed >= after, "the counter went back from {after} to {resumed}");
    counter_above_at(&server, &b.url, &id, resumed);

    let (status, body) = b.call(&server, "DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(status, 200, "{body}");
    assert!(server.sandbox_cgroups().is_empty(), "nothing is left on the node: {:?}", server.sandbox_cgroups());
    b.kill9();
}

/// The newest operation of `kind`: its session, state and claimant.
fn newest_operation(database: &str, kind: &str) -> Option<(String, String)> {
    let row = psql(
        database,
        &format!(
            "SELECT session_id || ' ' || state || ' ' || COALESCE(claimed_by, '-') FROM operations \
             WHERE kind = '{kind}' ORDER BY created_at DESC, id DESC LIMIT 1"
        ),
    );
    row.split_once(' ').map(|(session, rest)| (session.to_owned(), rest.to_owned()))
}

/// Runs `start` (it queues a `create_session` operation through A) and stops the node as soon
/// as the operation is recorded; returns its session and the stopped node once A holds the
/// operation, running, waiting on the node. The stop races the operation: one that finished
/// first (or that B claimed) is left to end, and `start` runs again.
fn caught_mid_create(server: &Server, database: &str, start: &dyn Fn() -> Option<String>) -> (String, Stopped) {
    for _ in 0..10 {
        let before = newest_operation(database, "create_session").map(|(session, _)| session);
        let known = start();
        let deadline = Instant::now() + Duration::from_secs(30);
        let session = loop {
            if let Some(id) = &known {
                break id.clone();
            }
            match newest_operation(database, "create_session") {
                Some((session, _)) if Some(&session) != before.as_ref() => break session,
                _ => assert!(Instant::now() < deadline, "no create was recorded"),
            }
        };
        let stopped = Stopped::stop(server.node_pid());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match operation(database, &session, "create_session").as_str() {
                "running control-1" => return (session, stopped),
                state if state.starts_with("pending") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => break,
            }
        }
        drop(stopped);
        eprintln!(
            "the create of {session} was not caught held by A: {}",
            operation(database, &session, "create_session")
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while !operation(database, &session, "create_session").starts_with("succeeded") {
            assert!(Instant::now() < deadline, "the create of {session} did not end");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("the node never stopped while A held a create");
}

/// A is killed while it runs a create, then while it runs the start of a fork, each waiting
/// on the node (stopped just after the operation was recorded): B completes each once A's
/// lease ran out. The fork is a real one (from a full snapshot: its counter counts on from
/// where the snapshot had it). Once every session is destroyed, nothing is left on the node.
#[test]
fn a_replica_killed_mid_create_or_fork_leaves_it_to_the_other() {
    require_root!();
    let database = create_database(&postgres_server());
    let mut server = Server::start_split(&["--database", &database, "--pool", "busybox=0"]);
    let mut b = Replica::start(&server, "control-2", &database);

    let create = || {
        let (status, body) = server.call("POST", "/v1/sessions?wait=false", Some(json!({})));
        assert_eq!(status, 202, "{body}");
        body["id"].as_str().map(str::to_owned)
    };
    let (created, stopped) = caught_mid_create(&server, &database, &create);
    server.kill9_control();
    drop(stopped);
    wait_state(&server, &b, &created, "running");
    assert_eq!(operation(&database, &created, "create_session"), "succeeded control-2");
    let (status, out) =
        b.call(&server, "POST", &format!("/v1/sessions/{created}/exec"), Some(json!({ "cmd": ["echo", "made"] })));
    assert_eq!((status, out["stdout"].as_str()), (200, Some("made\n")), "{out}");

    server.spawn();
    start_counter(&server, &b.url, &created);
    let at_snapshot = counter_above_at(&server, &b.url, &created, 3);
    let (status, snapshot) =
        b.call(&server, "POST", &format!("/v1/sessions/{created}/snapshots"), Some(json!({ "kind": "full" })));
    assert_eq!(status, 201, "{snapshot}");
    let fork_path = format!("/v1/sessions/{created}/fork");
    let body = json!({ "from": snapshot["id"] }).to_string();
    let fork = || {
        call_a_in_background(&server, fork_path.clone(), body.clone());
        None
    };
    let (forked, stopped) = caught_mid_create(&server, &database, &fork);
    server.kill9_control();
    drop(stopped);
    wait_state(&server, &b, &forked, "running");
    assert_eq!(operation(&database, &forked, "create_session"), "succeeded control-2");
    let resumed = counter_at(&server, &b.url, &forked);
    assert!(resumed >= at_snapshot, "the fork's counter went back from {at_snapshot} to {resumed}");
    counter_above_at(&server, &b.url, &forked, resumed);

    let (_, list) = b.call(&server, "GET", "/v1/sessions", None);
    for session in list["sessions"].as_array().unwrap() {
        let id = session["id"].as_str().unwrap();
        let (status, body) = b.call(&server, "DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 200, "{body}");
    }
    assert!(server.sandbox_cgroups().is_empty(), "nothing is left on the node: {:?}", server.sandbox_cgroups());
    b.kill9();
}

/// Two replicas over three nodes: sessions created through either are spread over all three,
/// and each answers for every session, wherever it was created and whichever node runs it.
#[test]
fn two_replicas_over_three_nodes_spread_sessions_and_answer_for_all() {
    require_root!();
    let database = create_database(&postgres_server());
    let mut server = Server::start_split(&["--database", &database, "--pool", "busybox=1"]);
    let (second, third) = (ExtraNode::start(&server, "2"), ExtraNode::start(&server, "3"));
    server.add_node(&second);
    server.add_node(&third);
    let b = Replica::start(&server, "control-2", &database);
    let replicas = [server.url.clone(), b.url.clone()];

    let mut sessions = Vec::new();
    for i in 0..6 {
        let (status, session) = server.call_at(&replicas[i % 2], "POST", "/v1/sessions", Some(json!({})));
        assert_eq!(status, 201, "{session}");
        sessions.push((session["id"].as_str().unwrap().to_owned(), session["node"].as_str().unwrap().to_owned()));
    }
    let nodes: std::collections::BTreeSet<&str> = sessions.iter().map(|(_, node)| node.as_str()).collect();
    let all = [server.node_id(), second.name.clone(), third.name.clone()];
    assert_eq!(nodes, all.iter().map(String::as_str).collect(), "sessions on every node: {sessions:?}");
    for (i, (id, node)) in sessions.iter().enumerate() {
        // Through the replica that did not create it.
        let base = &replicas[(i + 1) % 2];
        let cmd = json!({ "cmd": ["sh", "-c", "echo $HOSTNAME-ok"] });
        let (status, out) = server.call_at(base, "POST", &format!("/v1/sessions/{id}/exec"), Some(cmd));
        assert_eq!(status, 200, "{out}");
        assert!(out["stdout"].as_str().unwrap().ends_with("-ok\n"), "{out}");
        let (_, session) = server.call_at(base, "GET", &format!("/v1/sessions/{id}"), None);
        assert_eq!(session["node"], node.as_str(), "{session}");
        let (status, body) = server.call_at(base, "DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 200, "{body}");
    }
}
