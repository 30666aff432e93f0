//! Crash safety: `kill -9` of the server at any moment leaves nothing orphaned and no session
//! stuck in a transitional state; sandboxes that survive are picked up again.

mod common;

use std::time::Duration;

use common::Server;
use serde_json::json;

fn settled(server: &Server, id: &str) -> String {
    for _ in 0..600 {
        let (_, s) = server.call("GET", &format!("/v1/sessions/{id}"), None);
        let state = s["state"].as_str().unwrap_or_default().to_owned();
        if !matches!(state.as_str(), "creating" | "restoring" | "suspending" | "destroying") {
            return state;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("session {id} stuck in a transitional state");
}

#[test]
fn kill9_during_create_leaves_nothing_orphaned() {
    require_root!();
    // Cold creates (no pool): the path with the most steps a crash can interrupt.
    let mut server = Server::start_with(&["--pool", ""]);
    let mut ids = Vec::new();
    for round in 0..12u64 {
        let (status, s) = server.call("POST", "/v1/sessions?wait=false", Some(json!({})));
        assert_eq!(status, 202, "{s}");
        ids.push(s["id"].as_str().unwrap().to_owned());
        std::thread::sleep(Duration::from_millis((round * 5) % 40));
        server.kill9();
        server.spawn();
        for id in &ids {
            let state = settled(&server, id);
            assert!(matches!(state.as_str(), "running" | "failed"), "{id}: {state}");
        }
    }
    for id in &ids {
        let (status, _) = server.call("DELETE", &format!("/v1/sessions/{id}"), None);
        assert_eq!(status, 200);
        assert_eq!(settled(&server, id), "destroyed");
    }
    assert!(server.sandbox_pids().is_empty(), "processes left: {:?}", server.sandbox_pids());
    assert!(server.sandbox_cgroups().is_empty(), "cgroups left: {:?}", server.sandbox_cgroups());
    assert!(server.sandbox_roots().is_empty(), "subvolumes left: {:?}", server.sandbox_roots());
    assert!(server.sockets().is_empty(), "sockets left: {:?}", server.sockets());
}

/// `curl` arguments of a create under `Idempotency-Key: key`, printing the status last.
fn keyed_create(auth: &str, header: &str, url: &str) -> Vec<String> {
    common::post_json_args(url, auth, "{}", &["-H", header, "-w", "\n%{http_code}"])
}

#[test]
fn a_create_retried_under_its_key_after_kill9_makes_one_session() {
    require_root!();
    let mut server = Server::start_with(&["--pool", ""]);
    let (auth, url) = (server.auth(), format!("{}/v1/sessions", server.url));
    let rounds = 6u64;
    for round in 0..rounds {
        let header = format!("Idempotency-Key: crash-{round}");
        // The first attempt, cut off by the kill at some point of its create.
        let mut first = std::process::Command::new("curl")
            .args(keyed_create(&auth, &header, &url))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(20 + (round * 13) % 60));
        server.kill9();
        let _ = first.kill();
        let _ = first.wait();
        server.spawn();
        let args = keyed_create(&auth, &header, &url);
        let out = common::curl(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap();
        assert_eq!(status, "201", "round {round}: {body}");
        let session: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(session["state"], "running", "round {round}: {body}");
    }
    let (_, list) = server.call("GET", "/v1/sessions?all=true", None);
    let sessions = list["sessions"].as_array().unwrap();
    assert_eq!(sessions.len() as u64, rounds, "one session per key: {list}");
    for s in sessions {
        let id = s["id"].as_str().unwrap();
        assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
        assert_eq!(settled(&server, id), "destroyed");
    }
}

#[test]
fn kill9_during_destroy_finishes_the_destroy() {
    require_root!();
    let mut server = Server::start_with(&["--pool", ""]);
    let id = server.create_session(json!({}));
    let (status, _) = server.call("DELETE", &format!("/v1/sessions/{id}?wait=false"), None);
    assert_eq!(status, 202);
    server.kill9();
    server.spawn();
    assert_eq!(settled(&server, &id), "destroyed");
    assert!(server.sandbox_cgroups().is_empty());
    assert!(server.sandbox_roots().is_empty());
}

#[test]
fn running_sandboxes_survive_a_server_restart() {
    require_root!();
    let mut server = Server::start();
    let id = server.create_session(json!({}));
    server.exec(&id, &["sh", "-c", "echo before > /tmp/state"]);
    server.kill9();
    server.spawn();
    let r = server.exec(&id, &["cat", "/tmp/state"]);
    assert_eq!(r["stdout"], "before\n", "{r}");
    let out = server.cli(&["session", "events", &id, "--json"]);
    let events: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(events["events"].as_array().unwrap().len() >= 2);
}

#[test]
fn kill9_during_restore_and_fork_leaves_stable_sessions_and_usable_snapshots() {
    require_root!();
    let mut server = Server::start_with(&["--pool", ""]);
    let id = server.create_session(json!({}));
    server.exec(&id, &["sh", "-c", "echo kept > /root/f"]);
    let (status, snap) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({})));
    assert_eq!(status, 201, "{snap}");
    let snapshot = snap["id"].as_str().unwrap().to_owned();
    for round in 0..6u64 {
        let (url, key) = (server.url.clone(), server.key.clone());
        let path =
            if round % 2 == 0 { format!("/v1/sessions/{id}/restore") } else { format!("/v1/sessions/{id}/fork") };
        let body =
            if round % 2 == 0 { json!({ "snapshot": snapshot }) } else { json!({ "from": snapshot, "count": 2 }) };
        let call = std::thread::spawn(move || {
            let auth = format!("Authorization: Bearer {key}");
            let url = format!("{url}{path}");
            common::post_json(&url, &auth, &body.to_string(), &["-m", "5"]);
        });
        std::thread::sleep(Duration::from_millis(2 + round * 7));
        server.kill9();
        let _ = call.join();
        server.spawn();
        let (_, list) = server.call("GET", "/v1/sessions", None);
        for s in list["sessions"].as_array().unwrap() {
            let state = settled(&server, s["id"].as_str().unwrap());
            assert!(matches!(state.as_str(), "running" | "failed"), "{}: {state}", s["id"]);
        }
        if settled(&server, &id) == "failed" {
            break;
        }
    }
    // The snapshot is still usable: a fresh fork from it has the file.
    let (status, forks) =
        server.call("POST", &format!("/v1/sessions/{id}/fork"), Some(json!({ "from": snapshot, "count": 1 })));
    assert_eq!(status, 201, "{forks}");
    let child = forks["sessions"][0]["id"].as_str().unwrap();
    assert_eq!(server.exec(child, &["cat", "/root/f"])["stdout"], "kept\n");
}

#[test]
fn servers_sharing_a_cgroup_parent_never_sweep_each_others_sandboxes() {
    require_root!();
    let first = Server::start();
    let kept = first.create_session(json!({}));
    let mut second = Server::start_sharing_cgroup_parent(&first);
    let own = second.create_session(json!({}));
    assert_ne!(first.node_id(), second.node_id());
    // The second server's start-up sweep destroys every sandbox it finds that none of its
    // sessions owns: the first server's must not be among them.
    second.kill9();
    second.spawn();
    assert_eq!(settled(&second, &own), "running");
    assert_eq!(first.exec(&kept, &["echo", "still here"])["stdout"], "still here\n");
    assert_eq!(second.exec(&own, &["echo", "mine too"])["stdout"], "mine too\n");
    drop(second);
    assert_eq!(first.exec(&kept, &["echo", "after the other left"])["stdout"], "after the other left\n");
}

/// Something on the node that cannot be removed (here an immutable file in an orphaned
/// snapshot) is logged at start-up, and the server starts and serves anyway.
#[test]
fn a_leftover_that_cannot_be_removed_never_stops_the_server_from_starting() {
    require_root!();
    let mut server = Server::start_with(&["--pool", ""]);
    server.kill9();
    let orphan = server.data_dir.join("images/ses_aaaaaaaaaaaaaaaaaaaa/snap_aaaaaaaaaaaaaaaaaaaa");
    std::fs::create_dir_all(&orphan).unwrap();
    let stuck = orphan.join("stuck");
    std::fs::write(&stuck, "x").unwrap();
    let chattr = |flag: &str| std::process::Command::new("chattr").arg(flag).arg(&stuck).status().unwrap();
    assert!(chattr("+i").success());
    struct Mutable<F: Fn(&str) -> std::process::ExitStatus>(F);
    impl<F: Fn(&str) -> std::process::ExitStatus> Drop for Mutable<F> {
        fn drop(&mut self) {
            (self.0)("-i");
        }
    }
    let _mutable = Mutable(chattr);
    server.spawn();
    assert!(server.log_text().contains("cannot remove an orphaned snapshot"), "{}", server.log_text());
    let id = server.create_session(json!({}));
    assert_eq!(server.exec(&id, &["echo", "serving"])["stdout"], "serving\n");
}
