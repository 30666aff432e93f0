//! Session lifecycle: pause and resume in place, disk snapshots, restore and fork.

mod common;

use std::time::Duration;

use common::Server;
use serde_json::{Value, json};

const COUNTER: &str = "n=0; while :; do n=$((n+1)); echo $n > /root/c.new; mv /root/c.new /root/c; sleep 0.05; done";

fn start_counter(server: &Server, id: &str) {
    let body = json!({ "cmd": ["sh", "-c", COUNTER], "background": true });
    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{r}");
}

/// The counter as the host sees it in the session's current root (works while paused).
fn counter(server: &Server, id: &str) -> u64 {
    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    let sandbox = session["sandbox_id"].as_str().expect("sandbox");
    let path = server.data_dir.join(format!("pool/sandboxes/{sandbox}/rootfs/root/c"));
    std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

fn wait_counter_above(server: &Server, id: &str, value: u64) -> u64 {
    for _ in 0..200 {
        let now = counter(server, id);
        if now > value {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the counter of {id} never passed {value}");
}

fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    server.call("POST", path, Some(body))
}

fn stdout(server: &Server, id: &str, script: &str) -> String {
    server.exec(id, &["sh", "-c", script])["stdout"].as_str().unwrap().to_owned()
}

#[test]
fn pause_stops_processes_and_resume_continues_them() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    start_counter(&server, &id);
    let running = wait_counter_above(&server, &id, 2);

    let (status, s) = post(&server, &format!("/v1/sessions/{id}/pause"), json!(null));
    assert_eq!((status, s["state"].as_str()), (200, Some("paused")), "{s}");
    let frozen = counter(&server, &id);
    assert!(frozen >= running);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(counter(&server, &id), frozen, "the counter moved while paused");
    let (status, r) = post(&server, &format!("/v1/sessions/{id}/exec"), json!({ "cmd": ["true"] }));
    assert_eq!((status, r["error"]["code"].as_str()), (409, Some("invalid_state")), "{r}");
    assert_eq!(post(&server, &format!("/v1/sessions/{id}/pause"), json!(null)).0, 200, "pause is idempotent");

    let (status, s) = post(&server, &format!("/v1/sessions/{id}/resume"), json!(null));
    assert_eq!((status, s["state"].as_str()), (200, Some("running")), "{s}");
    wait_counter_above(&server, &id, frozen);
    let (_, events) = server.call("GET", &format!("/v1/sessions/{id}/events"), None);
    let states: Vec<&str> =
        events["events"].as_array().unwrap().iter().filter_map(|e| e["to_state"].as_str()).collect();
    assert_eq!(states, ["creating", "running", "paused", "running"]);
}

#[test]
fn restore_brings_back_a_disk_snapshot() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    stdout(&server, &id, "echo v1 > /root/file");
    let (status, snap) = post(&server, &format!("/v1/sessions/{id}/snapshots"), json!({ "name": "v1" }));
    assert_eq!(status, 201, "{snap}");
    assert_eq!((snap["kind"].as_str(), snap["name"].as_str()), (Some("disk"), Some("v1")));
    let measured = (0..100).find_map(|_| {
        let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None);
        let size = list["snapshots"].as_array()?.iter().find(|s| s["id"] == snap["id"])?["size_bytes"].as_u64();
        if size.is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        size
    });
    assert!(measured.is_some_and(|s| s > 0), "the disk snapshot's size is never measured: {snap}");
    stdout(&server, &id, "echo v2 > /root/file; touch /root/later");
    let (_, second) = post(&server, &format!("/v1/sessions/{id}/snapshots"), json!({}));
    assert_eq!(second["parent"], snap["id"], "snapshots chain: {second}");

    let (_, before) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    let (status, s) = post(&server, &format!("/v1/sessions/{id}/restore"), json!({ "snapshot": snap["id"] }));
    assert_eq!((status, s["state"].as_str()), (200, Some("running")), "{s}");
    assert_ne!(s["sandbox_id"], before["sandbox_id"], "restore runs in a new sandbox");
    assert_eq!(stdout(&server, &id, "cat /root/file; ls /root"), "v1\nfile\n");
    // The replaced sandbox's root is removed in the background after the restore answers.
    let old = server.data_dir.join(format!("pool/sandboxes/{}", before["sandbox_id"].as_str().unwrap()));
    for _ in 0..250 {
        if !old.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!old.exists(), "the replaced sandbox's root is still there 5 s after the restore");

    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None);
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 2);
    let path = format!("/v1/sessions/{id}/snapshots/{}", second["id"].as_str().unwrap());
    assert_eq!(server.call("DELETE", &path, None).0, 204);
    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None);
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 1);
    let (status, r) = post(&server, &format!("/v1/sessions/{id}/restore"), json!({ "snapshot": second["id"] }));
    assert_eq!((status, r["error"]["code"].as_str()), (404, Some("snapshot_not_found")), "{r}");
}

#[test]
fn forks_diverge_independently() {
    require_root!();
    let server = Server::start();
    let parent = server.create_session(json!({ "env": { "WHO": "parent" } }));
    stdout(&server, &parent, "echo shared > /root/history");
    // From a disk snapshot: each fork boots afresh, with an identity of its own (forks of a
    // full snapshot continue its processes, hostname included: tests/suspend.rs).
    let (status, snap) = post(&server, &format!("/v1/sessions/{parent}/snapshots"), json!({ "kind": "disk" }));
    assert_eq!(status, 201, "{snap}");
    let body = json!({ "count": 3, "from": snap["id"] });
    let (status, forks) = post(&server, &format!("/v1/sessions/{parent}/fork"), body);
    assert_eq!(status, 201, "{forks}");
    let children: Vec<String> =
        forks["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(children.len(), 3);
    for (i, child) in children.iter().enumerate() {
        assert_eq!(stdout(&server, child, "cat /root/history; echo $WHO"), "shared\nparent\n");
        stdout(&server, child, &format!("echo {i} > /root/mine"));
    }
    for (i, child) in children.iter().enumerate() {
        assert_eq!(stdout(&server, child, "cat /root/mine"), format!("{i}\n"), "another fork's write leaked");
    }
    assert_eq!(stdout(&server, &parent, "cat /root/mine 2>/dev/null || echo none"), "none\n");
    let hostnames: std::collections::HashSet<String> =
        children.iter().map(|c| stdout(&server, c, "hostname")).collect();
    assert_eq!(hostnames.len(), 3, "forks share a hostname");
    // The parent keeps running and has the snapshot the forks came from.
    let (_, list) = server.call("GET", &format!("/v1/sessions/{parent}/snapshots"), None);
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 1);
}

#[test]
fn bad_lifecycle_requests_get_clear_errors() {
    require_root!();
    // Without CRIU: full snapshots are refused with a clear error, everything else works.
    let server = Server::start_with(&["--criu", "/nonexistent/criu"]);
    let id = server.create_session(json!({}));
    for count in [0, 17] {
        let (status, r) = post(&server, &format!("/v1/sessions/{id}/fork"), json!({ "count": count }));
        assert_eq!((status, r["error"]["code"].as_str()), (400, Some("bad_request")), "count {count}: {r}");
    }
    let missing = "snap_00000000000000000000";
    let (status, r) = post(&server, &format!("/v1/sessions/{id}/restore"), json!({ "snapshot": missing }));
    assert_eq!((status, r["error"]["code"].as_str()), (404, Some("snapshot_not_found")), "{r}");
    for call in ["snapshots", "suspend"] {
        let (status, r) = post(&server, &format!("/v1/sessions/{id}/{call}"), json!({ "kind": "full" }));
        assert_eq!((status, r["error"]["code"].as_str()), (501, Some("feature_unavailable")), "{call}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("install-criu.sh"), "{r}");
    }
    let (_, status) = server.call("GET", "/v1/status", None);
    assert_eq!(status["full_snapshots"]["available"], false, "{status}");

    // Another tenant can neither see nor use this session's snapshots.
    let (_, snap) = post(&server, &format!("/v1/sessions/{id}/snapshots"), json!({}));
    let other_key = server.tenant_key("other");
    let theirs = server.call_as(&other_key, "POST", "/v1/sessions", Some(json!({}))).1;
    let theirs = theirs["id"].as_str().unwrap();
    let body = json!({ "snapshot": snap["id"] });
    let (status, _) = server.call_as(&other_key, "POST", &format!("/v1/sessions/{theirs}/restore"), Some(body));
    assert_eq!(status, 404);
    let (status, _) = server.call_as(&other_key, "GET", &format!("/v1/sessions/{id}/snapshots"), None);
    assert_eq!(status, 404);

    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
    let (status, r) = post(&server, &format!("/v1/sessions/{id}/resume"), json!(null));
    assert_eq!((status, r["error"]["code"].as_str()), (404, Some("not_found")), "{r}");
    let snapshots = server.data_dir.join(format!("pool/snapshots/{id}"));
    let left: Vec<_> = std::fs::read_dir(&snapshots).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(left.is_empty(), "a destroyed session's snapshots are left: {left:?}");
}

#[test]
fn the_schedule_takes_and_prunes_snapshots_while_running() {
    require_root!();
    let server = Server::start_with(&["--snapshot-tick-ms", "100", "--snapshot-policy", "off"]);
    let (status, r) = post(&server, "/v1/sessions", json!({ "snapshot_policy": { "disk_every_s": 0 } }));
    assert_eq!((status, r["error"]["code"].as_str()), (400, Some("bad_request")), "{r}");
    let id = server.create_session(json!({}));
    let (_, s) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(s["snapshot_policy"]["disk_every_s"], Value::Null, "the server default (off) applies: {s}");

    // Every second, keep everything for 3 s, nothing older (but the newest).
    let out =
        server.cli(&["session", "update", &id, "--snapshot-policy", "disk=1s,full=off,keep=3s,hourly=off,daily=off"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list = |server: &Server| -> Vec<String> {
        let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None);
        list["snapshots"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect()
    };
    let mut seen = std::collections::HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < 7 {
        assert!(std::time::Instant::now() < deadline, "only {} scheduled snapshots in 60 s", seen.len());
        let now = list(&server);
        assert!(now.len() <= 5, "retention did not prune: {} snapshots", now.len());
        seen.extend(now);
        std::thread::sleep(Duration::from_millis(200));
    }
    // Paused sessions are not snapshotted.
    post(&server, &format!("/v1/sessions/{id}/pause"), json!(null));
    std::thread::sleep(Duration::from_millis(300));
    let before = list(&server);
    std::thread::sleep(Duration::from_millis(2500));
    let after = list(&server);
    assert!(after.iter().all(|s| before.contains(s)), "a snapshot was taken while paused");
}
