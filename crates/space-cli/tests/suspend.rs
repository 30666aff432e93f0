//! Full snapshots with CRIU: suspend and resume (also across a server restart), memory and
//! loopback TCP kept exactly, forks of a live session, idle timeout and maximum age, a CRIU
//! failure and `kill -9` of the server in the middle of a suspend or resume, and sessions
//! that wake on use (`auto_resume`).
//!
//! Needs CRIU >= 4.2 (scripts/install-criu.sh, which the test command runs).

mod common;

use std::time::{Duration, Instant};

use common::Server;
use serde_json::{Value, json};

const COUNTER: &str = "n=0; while :; do n=$((n+1)); echo $n > /root/c.new; mv /root/c.new /root/c; sleep 0.05; done";

fn post(server: &Server, path: &str) -> (u16, Value) {
    server.call("POST", path, Some(json!({})))
}

fn stdout(server: &Server, id: &str, script: &str) -> String {
    server.exec(id, &["sh", "-c", script])["stdout"].as_str().unwrap().trim().to_owned()
}

fn session(server: &Server, id: &str) -> Value {
    server.call("GET", &format!("/v1/sessions/{id}"), None).1
}

/// Starts the counter in the background; returns its pid inside the sandbox.
fn start_counter(server: &Server, id: &str) -> u64 {
    let body = json!({ "cmd": ["sh", "-c", COUNTER], "background": true });
    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{r}");
    r["pid"].as_u64().unwrap()
}

fn counter(server: &Server, id: &str) -> u64 {
    stdout(server, id, "cat /root/c 2>/dev/null || echo 0").parse().unwrap_or(0)
}

/// Polls `check` until it returns `Some` (a generous bound only keeps a broken run from hanging).
fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn counter_above(server: &Server, id: &str, value: u64) -> u64 {
    eventually(&format!("the counter of {id} passes {value}"), || Some(counter(server, id)).filter(|n| *n > value))
}

fn suspend(server: &Server, id: &str) {
    let (status, s) = post(server, &format!("/v1/sessions/{id}/suspend"));
    assert_eq!((status, s["state"].as_str()), (200, Some("suspended")), "{s}\n{}", server.log_text());
}

fn resume(server: &Server, id: &str) {
    let (status, s) = post(server, &format!("/v1/sessions/{id}/resume"));
    assert_eq!((status, s["state"].as_str()), (200, Some("running")), "{s}\n{}", server.log_text());
}

fn states(server: &Server, id: &str) -> Vec<String> {
    let (_, events) = server.call("GET", &format!("/v1/sessions/{id}/events"), None);
    events["events"].as_array().unwrap().iter().filter_map(|e| e["to_state"].as_str().map(str::to_owned)).collect()
}

/// A suspended `auto_resume` session wakes on use: a JSON exec, and the CLI's streaming exec,
/// run in it once it is resumed, with its files and processes as they were.
#[test]
fn an_exec_resumes_a_suspended_auto_resume_session_and_gets_its_output() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let (_, status) = server.call("GET", "/v1/status", None);
    assert_eq!(status["full_snapshots"]["available"], true, "CRIU is missing: {status}");
    let id = server.create_session(json!({ "auto_resume": true }));
    stdout(&server, &id, "echo kept > /root/state");
    let pid = start_counter(&server, &id);
    let before = counter_above(&server, &id, 3);

    suspend(&server, &id);
    assert!(server.sandbox_pids().is_empty(), "a suspended session keeps processes: {:?}", server.sandbox_pids());
    let script = format!("cat /root/state; kill -0 {pid} && echo alive; cat /root/c");
    let (status, r) =
        server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(json!({ "cmd": ["sh", "-c", script] })));
    assert_eq!(status, 200, "{r}\n{}", server.log_text());
    let out = r["stdout"].as_str().unwrap().to_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["kept", "alive"], "{r}");
    assert!(lines[2].parse::<u64>().unwrap() >= before, "the counter went back: {r}");
    assert_eq!(session(&server, &id)["state"], "running");
    counter_above(&server, &id, before);

    // The CLI's exec (a WebSocket) wakes it the same way.
    suspend(&server, &id);
    let out = server.cli(&["exec", &id, "--", "cat", "/root/state"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n");
    assert!(states(&server, &id).ends_with(&[
        "suspending".into(),
        "suspended".into(),
        "restoring".into(),
        "running".into()
    ]));
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
}

/// A process of another user than the sandbox's root comes back as that user, holding a file
/// in a directory only that user may enter: restores work with the restore's work directory
/// entered only by the sandbox's root (CRIU opens files as that root, and gives each task its
/// own ids back last).
#[test]
fn a_process_of_another_user_is_resumed_as_that_user() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let id = server.create_session(json!({}));
    stdout(&server, &id, "mkdir -p -m 700 /home/u && chown 1000:1000 /home/u");
    let script = "exec 3>/home/u/held; exec sleep 100000";
    let body = json!({ "cmd": ["sh", "-c", script], "uid": 1000, "gid": 1000, "background": true });
    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{r}");
    let held = "for p in /proc/[0-9]*; do [ \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" = 'sleep 100000 ' ] && \
        grep -E '^(Uid|Gid):' $p/status | awk '{print $2}' | tr '\\n' ' '; done; true";
    let before =
        eventually("the other user's process runs", || Some(stdout(&server, &id, held)).filter(|s| !s.is_empty()));
    assert_eq!(before, "1000 1000", "not the other user's: {before}");

    suspend(&server, &id);
    resume(&server, &id);
    assert_eq!(stdout(&server, &id, held), before, "{}", server.log_text());
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
}

#[test]
fn suspended_processes_continue_after_a_server_restart() {
    require_root!();
    let mut server = Server::start_with(&["--pool", ""]);
    let (_, status) = server.call("GET", "/v1/status", None);
    assert_eq!(status["full_snapshots"]["available"], true, "CRIU is missing: {status}");
    let id = server.create_session(json!({}));
    let pid = start_counter(&server, &id);
    // A process holding a file it deleted (2 MiB, above CRIU's default limit for copying them).
    let holder = "exec 3<>/root/deleted; head -c 2097152 /dev/urandom >&3; rm /root/deleted; exec sleep 100000";
    let body = json!({ "cmd": ["sh", "-c", holder], "background": true });
    let holder = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body)).1["pid"].as_u64().unwrap();
    let deleted_sum = |server: &Server| stdout(server, &id, &format!("md5sum < /proc/{holder}/fd/3"));
    let sum = eventually("the file is written and deleted", || {
        let gone = stdout(&server, &id, "ls /root/deleted 2>/dev/null || echo gone") == "gone";
        gone.then(|| deleted_sum(&server))
    });
    let before = counter_above(&server, &id, 3);

    suspend(&server, &id);
    assert!(server.sandbox_pids().is_empty(), "a suspended session keeps processes: {:?}", server.sandbox_pids());
    assert!(server.sandbox_roots().is_empty(), "a suspended session keeps its root");
    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(json!({ "cmd": ["true"] })));
    assert_eq!((status, r["error"]["code"].as_str()), (409, Some("session_suspended")), "{r}");
    assert_eq!(post(&server, &format!("/v1/sessions/{id}/suspend")).0, 200, "suspend is idempotent");

    server.kill9();
    server.spawn();
    assert_eq!(session(&server, &id)["state"], "suspended");
    resume(&server, &id);
    let after = counter(&server, &id);
    assert!(after >= before, "the counter went back from {before} to {after}");
    counter_above(&server, &id, after);
    assert_eq!(stdout(&server, &id, &format!("cat /proc/{pid}/cmdline | tr '\\0' ' '")), format!("sh -c {COUNTER}"));
    assert_eq!(deleted_sum(&server), sum, "the deleted file's content changed");
    let states = states(&server, &id);
    assert_eq!(states, ["creating", "running", "suspending", "suspended", "restoring", "running"]);

    // Twice more, from paused too: the state before is kept.
    assert_eq!(post(&server, &format!("/v1/sessions/{id}/pause")).0, 200);
    suspend(&server, &id);
    resume(&server, &id);
    counter_above(&server, &id, counter(&server, &id));
}

/// 100 MiB of random bytes in a Python process keep their SHA-256, and a TCP connection over
/// the sandbox's loopback keeps carrying data, across suspend and resume.
#[test]
fn memory_and_loopback_tcp_survive_suspend() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let out = server.cli(&["template", "build", "debian"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = server.create_session(json!({ "template": "debian", "memory_mib": 1024 }));
    let script = r#"
import hashlib, os, signal, socket, time
data = os.urandom(100 << 20)
open('/root/sha-before', 'w').write(hashlib.sha256(data).hexdigest())
signal.signal(signal.SIGUSR1, lambda *_: open('/root/sha-after', 'w').write(hashlib.sha256(data).hexdigest()))
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(('127.0.0.1', 7000))
server.listen(1)
client = socket.create_connection(('127.0.0.1', 7000))
conn, _ = server.accept()
n = 0
while True:
    n += 1
    client.sendall(b'%08d' % n)
    echoed = conn.recv(8, socket.MSG_WAITALL)
    assert echoed == b'%08d' % n
    open('/root/tcp.new', 'w').write(str(n))
    os.rename('/root/tcp.new', '/root/tcp')
    time.sleep(0.05)
"#;
    let body = json!({ "cmd": ["python3", "-c", script], "background": true });
    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{r}");
    let pid = r["pid"].as_u64().unwrap();
    let tcp = |server: &Server| stdout(server, &id, "cat /root/tcp 2>/dev/null || echo 0").parse::<u64>().unwrap_or(0);
    let lines = eventually("TCP lines flow", || Some(tcp(&server)).filter(|n| *n > 3));
    let sha = stdout(&server, &id, "cat /root/sha-before");
    assert_eq!(sha.len(), 64);

    let ca = stdout(&server, &id, "cat /etc/space/ca.crt /etc/space/ca-bundle.crt");
    suspend(&server, &id);
    resume(&server, &id);
    eventually("TCP lines keep flowing after resume", || Some(tcp(&server)).filter(|n| *n > lines + 5));
    assert_eq!(stdout(&server, &id, "cat /etc/space/ca.crt /etc/space/ca-bundle.crt"), ca, "the session's CA files");
    stdout(&server, &id, &format!("kill -USR1 {pid}"));
    let after = eventually("the process hashes its memory again", || {
        Some(stdout(&server, &id, "cat /root/sha-after 2>/dev/null")).filter(|s| s.len() == 64)
    });
    assert_eq!(after, sha, "the 100 MiB changed across suspend/resume");
}

#[test]
fn forks_of_a_live_session_continue_its_processes_independently() {
    require_root!();
    let server = Server::start();
    let parent = server.create_session(json!({}));
    let pid = start_counter(&server, &parent);
    let at_fork = counter_above(&server, &parent, 3);
    stdout(&server, &parent, "echo shared > /root/history");

    // Without `from`: a full snapshot of the parent as it is now.
    let (status, forks) = server.call("POST", &format!("/v1/sessions/{parent}/fork"), Some(json!({ "count": 3 })));
    assert_eq!(status, 201, "{forks}\n{}", server.log_text());
    let children: Vec<String> =
        forks["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    let (_, list) = server.call("GET", &format!("/v1/sessions/{parent}/snapshots"), None);
    assert_eq!(list["snapshots"][0]["kind"], "full", "{list}");
    for (i, child) in children.iter().enumerate() {
        counter_above(&server, child, at_fork);
        assert_eq!(stdout(&server, child, "cat /root/history"), "shared");
        stdout(&server, child, &format!("echo {i} > /root/mine"));
    }
    for (i, child) in children.iter().enumerate() {
        assert_eq!(stdout(&server, child, "cat /root/mine"), i.to_string(), "another fork's write leaked");
    }
    assert_eq!(stdout(&server, &parent, "cat /root/mine 2>/dev/null || echo none"), "none");
    // Forks trust their parent's gateway CA (docs/egress.md), and their bundles hold it last.
    let parent_ca = stdout(&server, &parent, "cat /etc/space/ca.crt");
    assert!(parent_ca.starts_with("-----BEGIN CERTIFICATE-----"), "{parent_ca}");
    for child in &children {
        assert_eq!(stdout(&server, child, "cat /etc/space/ca.crt"), parent_ca, "fork {child}'s CA");
        assert!(stdout(&server, child, "cat /etc/space/ca-bundle.crt").ends_with(&parent_ca), "fork {child}'s bundle");
    }

    // Stopping the counter in one fork stops it there only.
    stdout(&server, &children[0], &format!("kill {pid}"));
    std::thread::sleep(Duration::from_millis(200));
    let stopped = counter(&server, &children[0]);
    for other in [&children[1], &children[2], &parent] {
        counter_above(&server, other, counter(&server, other));
    }
    assert_eq!(counter(&server, &children[0]), stopped, "the killed counter kept counting");
}

/// A restored root keeps the session's CA files it holds, and gets back those it lost.
#[test]
fn a_resumed_root_gets_its_sessions_ca_files_back() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let files = "cat /etc/space/ca.crt /etc/space/ca-bundle.crt";
    let ca = stdout(&server, &id, files);
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    stdout(&server, &id, "rm /etc/space/ca.crt");
    suspend(&server, &id);
    resume(&server, &id);
    assert_eq!(stdout(&server, &id, files), ca, "the session's CA files after the resume");
}

/// A CRIU that fails: the suspend is refused, the session keeps running with its processes,
/// and the error is recorded.
#[test]
fn a_failed_checkpoint_loses_nothing() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let criu = dir.path().join("criu");
    let script =
        "#!/bin/sh\ncase \"$1\" in --version) echo 'Version: 4.2.1';; *) echo 'injected failure' >&2; exit 1;; esac\n";
    std::fs::write(&criu, script).unwrap();
    std::fs::set_permissions(&criu, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let server = Server::start_with(&["--criu", criu.to_str().unwrap()]);
    let id = server.create_session(json!({}));
    start_counter(&server, &id);
    let before = counter_above(&server, &id, 2);

    let (status, r) = post(&server, &format!("/v1/sessions/{id}/suspend"));
    assert_eq!((status, r["error"]["code"].as_str()), (503, Some("sandbox_unavailable")), "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("injected failure"), "{r}");
    let s = session(&server, &id);
    assert_eq!(s["state"], "running", "{s}");
    assert!(s["error"].as_str().unwrap().contains("suspend failed"), "{s}");
    counter_above(&server, &id, before);
    let (status, _) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "full" })));
    assert_eq!(status, 503);
    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None);
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 0, "a failed snapshot is listed: {list}");
    let kept = server.data_dir.join(format!("pool/snapshots/{id}"));
    let left: Vec<_> = std::fs::read_dir(&kept).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(left.is_empty(), "a failed snapshot left {left:?}");
}

/// Unmounts a test filesystem when dropped (also when the test fails).
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A full disk where the images go: the snapshot fails with an error, the session keeps
/// running and the earlier snapshots stay restorable.
#[test]
fn a_full_disk_fails_the_snapshot_and_keeps_the_earlier_ones() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    // The data dir's filesystem, as the images see it: a small one of its own.
    let images = server.data_dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    nix::mount::mount(Some("tmpfs"), &images, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=48m"))
        .expect("mount a small tmpfs");
    let _unmount = Mounted(images.clone());
    let id = server.create_session(json!({}));
    start_counter(&server, &id);
    counter_above(&server, &id, 2);
    let full = json!({ "kind": "full" });
    let (status, earlier) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(full.clone()));
    assert_eq!(status, 201, "{earlier}");
    let filler = images.join("filler");
    let _ = std::process::Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", filler.display()))
        .arg("bs=1M")
        .output();

    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(full));
    assert_eq!((status, r["error"]["code"].as_str()), (503, Some("sandbox_unavailable")), "{r}");
    assert_eq!(session(&server, &id)["state"], "running");
    counter_above(&server, &id, counter(&server, &id));
    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None);
    assert_eq!(list["snapshots"].as_array().unwrap().len(), 1, "{list}");

    std::fs::remove_file(&filler).unwrap();
    let body = json!({ "snapshot": earlier["id"] });
    let (status, s) = server.call("POST", &format!("/v1/sessions/{id}/restore"), Some(body));
    assert_eq!((status, s["state"].as_str()), (200, Some("running")), "{s}");
    counter_above(&server, &id, counter(&server, &id));
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
}

#[test]
fn idle_sessions_are_suspended_and_old_ones_destroyed() {
    require_root!();
    let server = Server::start_with(&["--snapshot-tick-ms", "100", "--snapshot-policy", "off"]);
    let idle = server.create_session(json!({ "idle_timeout_secs": 2 }));
    let old = server.create_session(json!({ "max_age_secs": 3 }));
    start_counter(&server, &idle);
    let (status, r) = server.call("POST", "/v1/sessions", Some(json!({ "idle_timeout_secs": 0 })));
    assert_eq!((status, r["error"]["code"].as_str()), (400, Some("bad_request")), "{r}");

    eventually("the idle session is suspended", || (session(&server, &idle)["state"] == "suspended").then_some(()));
    let (_, events) = server.call("GET", &format!("/v1/sessions/{idle}/events"), None);
    assert!(events["events"].as_array().unwrap().iter().any(|e| e["kind"] == "idle_timeout"), "{events}");
    resume(&server, &idle);
    counter_above(&server, &idle, counter(&server, &idle));
    let out = server.cli(&["session", "update", &idle, "--idle-timeout", "0s"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(session(&server, &idle)["lifetime"]["idle_timeout_secs"], Value::Null);

    eventually("the old session is destroyed", || (session(&server, &old)["state"] == "destroyed").then_some(()));
    let (_, events) = server.call("GET", &format!("/v1/sessions/{old}/events"), None);
    assert!(events["events"].as_array().unwrap().iter().any(|e| e["kind"] == "max_age"), "{events}");
    assert_eq!(session(&server, &idle)["state"], "running", "the idle timeout was turned off");
}

/// `kill -9` of the server while a suspend or a resume runs: after the restart every session
/// is running or suspended, and every full snapshot listed restores.
#[test]
fn kill9_during_suspend_or_resume_leaves_stable_sessions() {
    require_root!();
    let mut server = Server::start_with(&["--pool", ""]);
    let id = server.create_session(json!({}));
    start_counter(&server, &id);
    counter_above(&server, &id, 2);
    for round in 0..6u64 {
        let state = session(&server, &id)["state"].as_str().unwrap().to_owned();
        let call = if state == "suspended" { "resume" } else { "suspend" };
        let (url, auth) = (format!("{}/v1/sessions/{id}/{call}", server.url), server.auth());
        let request = std::thread::spawn(move || common::curl(&["-s", "-X", "POST", "-H", &auth, &url]));
        std::thread::sleep(Duration::from_millis(40 + round * 45));
        server.kill9();
        let _ = request.join();
        server.spawn();
        let settled = eventually("the session settles", || {
            let state = session(&server, &id)["state"].as_str().unwrap_or_default().to_owned();
            matches!(state.as_str(), "running" | "suspended").then_some(state)
        });
        if settled == "running" {
            counter_above(&server, &id, counter(&server, &id));
        }
    }
    if session(&server, &id)["state"] == "suspended" {
        resume(&server, &id);
    }
    counter_above(&server, &id, counter(&server, &id));
    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None);
    for snapshot in list["snapshots"].as_array().unwrap().iter().filter(|s| s["kind"] == "full") {
        let body = json!({ "snapshot": snapshot["id"] });
        let (status, s) = server.call("POST", &format!("/v1/sessions/{id}/restore"), Some(body));
        assert_eq!((status, s["state"].as_str()), (200, Some("running")), "{snapshot}: {s}");
        counter_above(&server, &id, counter(&server, &id));
    }
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
    assert!(server.sandbox_pids().is_empty(), "processes left: {:?}", server.sandbox_pids());
    assert!(server.sockets().is_empty(), "agent directories left: {:?}", server.sockets());
}

/// Whether an exec in session `id` answers within `secs` (a frozen sandbox never does).
fn answers_within(server: &Server, id: &str, secs: u32) -> bool {
    let url = format!("{}/v1/sessions/{id}/exec", server.url);
    let body = json!({ "cmd": ["echo", "answering"] }).to_string();
    let secs = secs.to_string();
    let auth = server.auth();
    String::from_utf8_lossy(&common::post_json(&url, &auth, &body, &["-m", &secs]).stdout).contains("answering\\n")
}

/// A live session with a counter and 64 MiB of memory for CRIU to copy (so that what
/// interrupts a full snapshot or a fork lands while CRIU works); returns its id.
fn session_for_checkpoints(server: &Server) -> String {
    let id = server.create_session(json!({ "memory_mib": 512 }));
    start_counter(server, &id);
    let holder = r#"awk 'BEGIN { s = sprintf("%67108864s", ""); while (1) system("sleep 100000") }'"#;
    let (status, r) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sh", "-c", holder], "background": true })),
    );
    assert_eq!(status, 200, "{r}");
    counter_above(server, &id, 2);
    id
}

/// Round `round`'s call on session `id`: a full snapshot (even rounds) or a fork, as a curl
/// that gives up after `max_secs` (if given), on a thread of its own.
fn checkpoint_call(server: &Server, id: &str, round: u64, max_secs: Option<f64>) -> std::thread::JoinHandle<()> {
    let (call, body) = if round.is_multiple_of(2) {
        ("snapshots", json!({ "kind": "full" }))
    } else {
        ("fork", json!({ "count": 1 }))
    };
    let (url, auth) = (format!("{}/v1/sessions/{id}/{call}", server.url), server.auth());
    std::thread::spawn(move || {
        let secs = max_secs.map(|secs| format!("{secs:.2}"));
        let bound: Vec<&str> = secs.iter().flat_map(|secs| ["-m", secs.as_str()]).collect();
        common::post_json(&url, &auth, &body.to_string(), &bound);
    })
}

/// `kill -9` of the server while a full snapshot or a fork of the live session runs: after
/// the restart the session is running and answers, its processes too. (CRIU used to outlive
/// the server and, at the end of its dump, freeze again the sandbox the new server had
/// thawed; and split, the node cancelled the call of the control plane killed first, and
/// CRIU with it, its parasite inside the sandbox's processes.)
#[test]
fn kill9_during_full_snapshots_and_forks_leaves_a_session_that_answers() {
    require_root!();
    let mut server = Server::start_with(&["--pool", ""]);
    let id = session_for_checkpoints(&server);
    for round in 0..6u64 {
        let request = checkpoint_call(&server, &id, round, None);
        std::thread::sleep(Duration::from_millis(60 + round * 40));
        server.kill9();
        let _ = request.join();
        server.spawn();
        running_again(&server, &id, round);
        assert!(answers_within(&server, &id, 30), "round {round}: the session is running but does not answer");
        counter_above(&server, &id, counter(&server, &id));
    }
}

/// A client that hangs up while a full snapshot or a fork of the live session is taken does
/// not cut it short: it is finished (the snapshot is listed, the fork made), and the session
/// runs on and answers, its processes too. (The request was cancelled with its client, and
/// with it CRIU, killed with its parasite inside the sandbox's processes.)
#[test]
fn a_client_that_hangs_up_does_not_cut_full_snapshots_and_forks_short() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let id = session_for_checkpoints(&server);
    let sessions_before = server.call("GET", "/v1/sessions", None).1["sessions"].as_array().map_or(0, Vec::len);
    for round in 0..4u64 {
        checkpoint_call(&server, &id, round, Some(0.05 + round as f64 * 0.05)).join().unwrap();
        running_again(&server, &id, round);
        assert!(answers_within(&server, &id, 30), "round {round}: the session is running but does not answer");
        counter_above(&server, &id, counter(&server, &id));
    }
    // Two asked for, and one for each fork.
    let full = eventually("four full snapshots are taken", || {
        let listed = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).1;
        let snapshots = listed["snapshots"].as_array().cloned().unwrap_or_default();
        (snapshots.iter().filter(|s| s["kind"] == "full").count() == 4).then_some(snapshots)
    });
    assert_eq!(full.len(), 4, "{full:?}");
    let forks = eventually("both forks are made", || {
        let listed = server.call("GET", "/v1/sessions", None).1;
        let all = listed["sessions"].as_array().cloned().unwrap_or_default();
        (all.len() == sessions_before + 2).then_some(all)
    });
    for fork in forks.iter().filter(|s| s["id"] != id.as_str()) {
        let fork_id = fork["id"].as_str().unwrap();
        running_again(&server, fork_id, 0);
        assert!(answers_within(&server, fork_id, 30), "the fork {fork_id} does not answer");
    }
}

/// Waits for session `id` to read `running` after a restart; a failure says what it reads
/// instead, its events and the server's log.
fn running_again(server: &Server, id: &str, round: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while session(server, id)["state"] != "running" {
        if Instant::now() > deadline {
            let events = server.call("GET", &format!("/v1/sessions/{id}/events"), None).1;
            panic!(
                "round {round}: the session is not running again: {}\nevents: {events}\n{}",
                session(server, id),
                server.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether a process of session `id` holds an established TCP connection to port 3128 (the
/// gateway's proxy): `/proc/net/tcp`'s remote port 0C38, state 01.
fn holds_gateway_connection(server: &Server, id: &str) -> bool {
    let table = stdout(server, id, "cat /proc/net/tcp");
    table.lines().skip(1).any(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        fields.len() > 3 && fields[2].ends_with(":0C38") && fields[3] == "01"
    })
}

/// A process that keeps a connection to the gateway open (any keep-alive HTTP client: pip,
/// `requests.Session`) across suspend/resume and fork: the sandbox comes back, the old
/// connection is reset (its gateway end was not in the dump), and new ones work.
#[test]
fn a_connection_to_the_gateway_does_not_stop_suspend_resume_or_fork() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let id = server.create_session(json!({}));
    // The client sends what arrives on a fifo; a second process keeps the fifo open.
    let client = "mkfifo /root/f; nc 10.254.254.1 3128 < /root/f > /root/nc.out 2>&1; echo $? > /root/nc.exit";
    for script in [client, "sleep 0.2; exec 3>/root/f; exec sleep 100000"] {
        let body = json!({ "cmd": ["sh", "-c", script], "background": true });
        let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
        assert_eq!(status, 200, "{r}");
    }
    eventually("the client holds its connection", || holds_gateway_connection(&server, &id).then_some(()));

    suspend(&server, &id);
    resume(&server, &id);
    // The restored connection meets no peer: the client's next bytes are answered with a
    // reset, and it ends (if it has not already: then nobody reads the fifo, hence `timeout`).
    stdout(&server, &id, "timeout 5 sh -c 'echo next-request > /root/f'; true");
    eventually("the old connection is reset", || {
        (!stdout(&server, &id, "cat /root/nc.exit 2>/dev/null").is_empty()).then_some(())
    });
    // A new connection reaches the gateway, which answers a request it cannot parse.
    let answer = stdout(&server, &id, "printf 'nonsense\\r\\n\\r\\n' | nc -w 5 10.254.254.1 3128 | head -n 1");
    assert!(answer.starts_with("HTTP/1.1 400"), "the gateway did not answer: {answer:?}");

    // A fork of a session holding such a connection.
    let (status, r) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sh", "-c", "sleep 100000 | nc 10.254.254.1 3128"], "background": true })),
    );
    assert_eq!(status, 200, "{r}");
    eventually("the second client holds its connection", || holds_gateway_connection(&server, &id).then_some(()));
    let (status, forked) = server.call("POST", &format!("/v1/sessions/{id}/fork"), Some(json!({ "count": 1 })));
    assert_eq!(status, 201, "fork: {forked}\n{}", server.log_text());
    let child = forked["sessions"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(stdout(&server, &child, "echo forked"), "forked");
}

/// A session restored from a full snapshot that is deleted after (and its trash reclaimed)
/// is checkpointed again: its `/dev/.spaced` is bound from the pool's kept binary, not from the
/// snapshot's own link, whose path the reclaim removes (CRIU would then find the binary
/// deleted and refuse the dump: "Can't create link remap for /dev/.spaced").
#[test]
fn a_session_restored_from_a_full_snapshot_deleted_since_is_checkpointed_again() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let full = json!({ "kind": "full" });
    let (status, snapshot) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(full.clone()));
    assert_eq!(status, 201, "{snapshot}");
    let snapshot = snapshot["id"].as_str().unwrap().to_owned();
    let (status, restored) =
        server.call("POST", &format!("/v1/sessions/{id}/restore"), Some(json!({ "snapshot": snapshot })));
    assert_eq!(status, 200, "{restored}");
    let (status, body) = server.call("DELETE", &format!("/v1/sessions/{id}/snapshots/{snapshot}"), None);
    assert_eq!(status, 204, "{body}");
    eventually("the deleted snapshot's trash is reclaimed", || {
        let (_, status) = server.call("GET", "/v1/status", None);
        (status["pool"]["pending_deletions"] == 0).then_some(())
    });
    let (status, again) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(full));
    assert_eq!(status, 201, "{again}\n{}", server.log_text());
    assert_eq!(server.exec(&id, &["echo", "ok"])["stdout"], "ok\n");
}
