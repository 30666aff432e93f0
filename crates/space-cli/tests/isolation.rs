//! What a sandbox cannot see or do: host processes, host files, host network, host uids,
//! unbounded memory or processes.

mod common;

use std::net::TcpListener;

use common::Server;
use serde_json::json;

#[test]
fn sandbox_sees_only_itself() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));

    let r = server.exec(&id, &["sh", "-c", "ls /proc | grep -c '^[0-9]'"]);
    let visible: u32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(visible < 10, "sandbox sees {visible} processes: host processes leak");
    let r = server.exec(&id, &["cat", "/proc/1/cmdline"]);
    assert!(r["stdout"].as_str().unwrap().contains("spaced"), "pid 1 is spaced: {r}");

    let marker = server.data_dir.join("host-only");
    std::fs::write(&marker, "x").unwrap();
    let r = server.exec(&id, &["ls", marker.to_str().unwrap()]);
    assert_ne!(r["exit_code"], 0, "host file visible: {r}");

    let r = server.exec(&id, &["hostname"]);
    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    let sandbox = session["sandbox_id"].as_str().unwrap();
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        sandbox.trim_start_matches("sbx_").chars().take(12).collect::<String>()
    );

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = server.exec(&id, &["sh", "-c", &format!("nc -w 2 127.0.0.1 {port} </dev/null && echo connected")]);
    assert!(!r["stdout"].as_str().unwrap().contains("connected"), "reached the host: {r}");
    assert!(listener.accept().is_err(), "the host listener accepted a connection from the sandbox");

    server.exec(&id, &["touch", "/root/made-by-root"]);
    let path = server.data_dir.join(format!("pool/sandboxes/{sandbox}/rootfs/root/made-by-root"));
    let meta = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.gid()), (100_000, 100_000), "sandbox root must map to the unprivileged range");

    let r = server.exec(&id, &["sh", "-c", "cat /proc/self/status | grep -i ^seccomp:"]);
    assert!(r["stdout"].as_str().unwrap().contains('2'), "seccomp filter active: {r}");
    let r = server.exec(&id, &["mount", "-t", "tmpfs", "none", "/mnt"]);
    assert_ne!(r["exit_code"], 0, "mount must be denied: {r}");
}

#[test]
fn memory_bomb_is_killed_inside_its_cgroup() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({ "memory_mib": 64 }));
    let r = server.exec(&id, &["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]);
    assert_eq!(r["signal"], 9, "{r}");
    assert_eq!(r["oom_killed"], true, "{r}");
    let r = server.exec(&id, &["echo", "still alive"]);
    assert_eq!(r["stdout"], "still alive\n");
}

#[test]
fn fork_bomb_hits_the_pids_limit_and_the_node_stays_responsive() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({ "pids": 64 }));
    let other = server.create_session(json!({}));
    let (status, _) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sh", "-c", "while :; do sleep 60 & done"], "background": true, "timeout_ms": 4000 })),
    );
    assert_eq!(status, 200);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let r = server.exec(&other, &["echo", "responsive"]);
    assert_eq!(r["stdout"], "responsive\n");
    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    let sandbox = session["sandbox_id"].as_str().unwrap();
    let cgroup = format!("/sys/fs/cgroup/pids/{}/{sandbox}", server.cgroup_parent);
    let current: u32 = std::fs::read_to_string(format!("{cgroup}/pids.current")).unwrap().trim().parse().unwrap();
    let events = std::fs::read_to_string(format!("{cgroup}/pids.events")).unwrap();
    assert!(current <= 64, "pids.current {current} above the limit");
    assert!(!events.contains("max 0"), "the limit was never hit: {events}");
}
