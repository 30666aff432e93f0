//! Commands in real sandboxes: exit codes, signals, streams, stdin, env, cwd, background.

mod common;

use common::Server;
use serde_json::json;

#[test]
fn exec_reports_output_exit_codes_and_signals() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({ "env": { "GREETING": "hello" } }));

    let r = server.exec(&id, &["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(
        (r["stdout"].as_str(), r["stderr"].as_str(), r["exit_code"].as_i64()),
        (Some("out\n"), Some("err\n"), Some(3))
    );

    let r = server.exec(&id, &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(r["signal"], 15, "{r}");
    assert!(r["exit_code"].is_null());

    let r = server.exec(&id, &["no-such-binary"]);
    assert_eq!(r["exit_code"], 127, "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("no-such-binary"), "{r}");

    let (status, r) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sh", "-c", "echo $GREETING $EXTRA; pwd; cat"], "env": { "EXTRA": "world" }, "cwd": "/tmp", "stdin": "from stdin" })),
    );
    assert_eq!(status, 200);
    assert_eq!(r["stdout"], "hello world\n/tmp\nfrom stdin", "{r}");

    let r = server.exec(&id, &["id", "-u"]);
    assert_eq!(r["stdout"], "0\n");
    let (_, r) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["id", "-u"], "uid": 1000, "gid": 1000 })),
    );
    assert_eq!(r["stdout"], "1000\n", "{r}");

    let (_, r) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sleep", "30"], "timeout_ms": 300 })),
    );
    assert_eq!(r["timed_out"], true, "{r}");
}

#[test]
fn background_processes_outlive_the_exec_that_started_them() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    // busybox has no `nohup`; a plain `&` and `setsid` are the same pattern for spaced.
    let r = server.exec(&id, &["sh", "-c", "sleep 1000 >/dev/null 2>&1 & setsid sleep 1001 & echo started"]);
    assert_eq!(r["stdout"], "started\n", "{r}");
    // A background child may not have exec'd `sleep` yet when the first exec returns: look a
    // few times (bounded) rather than once.
    let count = "for _ in $(seq 50); do n=$(ps -o args | grep -c '^sleep 100[01]'); [ \"$n\" = 2 ] && break; \
                 sleep 0.1; done; echo $n";
    let r = server.exec(&id, &["sh", "-c", count]);
    assert_eq!(r["stdout"], "2\n", "the background sleeps should still run: {r}");

    let (status, r) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sh", "-c", "echo detached; sleep 1000"], "background": true })),
    );
    assert_eq!(status, 200, "{r}");
    let pid = r["pid"].as_u64().unwrap();
    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/processes"), None);
    let entry = list["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).cloned().unwrap();
    assert_eq!(entry["running"], true, "{list}");
    let (status, _) =
        server.call("POST", &format!("/v1/sessions/{id}/processes/{pid}/signal"), Some(json!({ "signal": 9 })));
    assert_eq!(status, 204);
}

/// A JSON exec's command ends when its client hangs up (unlike the API's other changes, which
/// run to their end): a command without a time bound would otherwise run for ever.
#[test]
fn a_json_exec_is_killed_when_its_client_hangs_up() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let body = json!({ "cmd": ["sh", "-c", "echo $$ > /tmp/exec.pid; exec sleep 1000"] }).to_string();
    let url = format!("{}/v1/sessions/{id}/exec", server.url);
    let auth = server.auth();
    let out = common::post_json(&url, &auth, &body, &["-m", "1"]);
    assert_eq!(out.status.code(), Some(28), "curl should have given up (exit 28)");
    // Bounded: the command is killed once the server sees the connection closed.
    let gone = "for _ in $(seq 100); do [ -d /proc/$(cat /tmp/exec.pid) ] || { echo gone; exit; }; sleep 0.1; done; \
                echo still running";
    let r = server.exec(&id, &["sh", "-c", gone]);
    assert_eq!(r["stdout"], "gone\n", "{r}");
}

#[test]
fn cli_streams_output_forwards_stdin_and_exits_with_the_command_code() {
    require_root!();
    let server = Server::start();
    let out = server.cli(&["session", "create", "--env", "A=1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();

    let out = server.cli(&["exec", &id, "--", "sh", "-c", "echo $A; echo oops >&2; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");

    let out = server.cli_with_stdin(&["exec", &id, "--", "tr", "a-z", "A-Z"], Some(b"shout\n"));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SHOUT\n");
    // A command that reads much and prints nothing: its input keeps flowing while the
    // server's queue of input frames fills and drains.
    let input = vec![b'x'; 16 << 20];
    let out = server.cli_with_stdin(&["exec", &id, "--", "wc", "-c"], Some(&input));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "16777216", "{}", String::from_utf8_lossy(&out.stderr));

    // A command that prints everything it reads: output flows back while input still
    // streams in, through every hop (and the node's agent relay, split).
    let echoed = echo_through_cat(&server, &id, 8 << 20);
    assert_eq!(echoed, 8 << 20, "cat gave back {echoed} bytes of {}", 8 << 20);

    let out = server.cli(&["exec", &id, "--", "missing-tool"]);
    assert_eq!(out.status.code(), Some(127));

    let out = server.cli(&["exec", "-d", &id, "--", "sh", "-c", "echo bg-out; sleep 1; exit 4"]);
    let pid = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(pid.parse::<u32>().is_ok(), "exec -d prints the pid: {pid:?}");
    let out = server.cli(&["ps", &id]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("echo bg-out"));
    let out = server.cli(&["attach", &id, &pid]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "bg-out\n");
    assert_eq!(out.status.code(), Some(4));

    let out = server.cli(&["session", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["sessions"][0]["id"], id.as_str());
    let out = server.cli(&["session", "destroy", &id]);
    assert!(out.status.success());
    let out = server.cli(&["exec", &id, "--", "true"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("destroyed"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn cli_tty_gives_the_command_a_terminal() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    // `script` gives the CLI a real terminal of its own, as a user's shell would.
    let command = format!("{} exec -t {id} -- sh -c 'tty; stty size'", common::SPACE);
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.key)
        .env("COLUMNS", "100")
        .env("LINES", "30")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/dev/pts/"), "no terminal: {text:?} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{text:?}");
}

/// Pipes `len` bytes through `space exec ID -- cat`, writing them from a thread while the
/// output is read; returns how many bytes came back.
fn echo_through_cat(server: &Server, id: &str, len: usize) -> usize {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(common::SPACE)
        .args(["exec", id, "--", "cat"])
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running space exec");
    let mut input = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || input.write_all(&vec![b'y'; len]));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().expect("writing stdin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out.stdout.len()
}
