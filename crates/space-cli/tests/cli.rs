//! The `space` CLI's own conveniences against a real server: recursive and stdin uploads,
//! `files rm|mkdir|mv`, `space kill`, sizes and durations, the `--` hint, errors as JSON.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use common::Server;
use serde_json::{Value, json};

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sh(server: &Server, id: &str, script: &str) -> String {
    let r = server.exec(id, &["sh", "-c", script]);
    assert_eq!(r["exit_code"], 0, "{script}: {r}");
    r["stdout"].as_str().unwrap().to_owned()
}

#[test]
fn files_put_uploads_directories_and_stdin_and_rm_mkdir_mv_change_the_tree() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    // `--json` shows times in RFC 3339, the same Session from `create` as from `show`.
    let created: Value = serde_json::from_str(&ok(&server.cli(&["--json", "session", "create"]))).unwrap();
    let created_id = created["id"].as_str().unwrap();
    let shown: Value = serde_json::from_str(&ok(&server.cli(&["--json", "session", "show", created_id]))).unwrap();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!((keys(&created), &created["created_at"]), (keys(&shown), &shown["created_at"]));
    let at = created["created_at"].as_str().unwrap_or_else(|| panic!("{created}"));
    assert!(time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).is_ok(), "{at}");

    let local = server.data_dir.join("project");
    std::fs::create_dir_all(local.join("src/deep")).unwrap();
    std::fs::create_dir(local.join("empty")).unwrap();
    std::fs::write(local.join("README"), "read me\n").unwrap();
    std::fs::write(local.join("src/deep/run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(local.join("src/deep/run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = server.cli(&["files", "put", &id, local.to_str().unwrap(), "/work/project"]);
    let printed = ok(&out);
    assert!(printed.contains("/work/project/src/deep/run.sh"), "{printed}");
    let tree = sh(&server, &id, "cd /work/project && find . | sort && cat README && ./src/deep/run.sh");
    assert_eq!(tree, ".\n./README\n./empty\n./src\n./src/deep\n./src/deep/run.sh\nread me\nran\n");

    let out = server.cli_with_stdin(&["files", "put", &id, "-", "/work/from-stdin.txt"], Some(b"piped bytes"));
    ok(&out);
    assert_eq!(sh(&server, &id, "cat /work/from-stdin.txt"), "piped bytes");
    let out = server.cli_with_stdin(&["--json", "files", "put", &id, "-", "/work/empty.txt"], Some(b""));
    let written: Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(written, json!([{ "path": "/work/empty.txt", "bytes": 0 }]));

    ok(&server.cli(&["files", "mkdir", &id, "/work/a/b/c"]));
    ok(&server.cli(&["files", "mv", &id, "/work/from-stdin.txt", "/work/a/b/c/moved.txt"]));
    assert_eq!(sh(&server, &id, "cat /work/a/b/c/moved.txt; ls /work"), "piped bytesa\nempty.txt\nproject\n");

    let out = server.cli(&["--json", "files", "rm", &id, "/work/a"]);
    assert!(!out.status.success(), "a non-empty directory needs -r");
    let error: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(error["error"]["status"], 400, "{error}");
    assert!(error["error"]["code"].is_string() && error["error"]["message"].is_string(), "{error}");
    assert!(out.stdout.is_empty(), "errors go to stderr");
    ok(&server.cli(&["files", "rm", "-r", &id, "/work/a"]));
    ok(&server.cli(&["files", "rm", &id, "/work/empty.txt"]));
    assert_eq!(sh(&server, &id, "ls /work"), "project\n");

    let out = server.cli(&["--json", "files", "rm", &id, "/work/missing"]);
    let error: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(
        (error["error"]["code"].as_str(), error["error"]["status"].as_u64()),
        (Some("file_not_found"), Some(404))
    );
}

#[test]
fn kill_signals_a_background_process_and_sizes_and_durations_take_units() {
    require_root!();
    let server = Server::start();
    let out = server.cli(&["session", "create", "--memory", "256m", "--disk", "1g", "--idle-timeout", "10m"]);
    let id = ok(&out).trim().to_owned();
    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(
        (
            &session["resources"]["memory_mib"],
            &session["resources"]["disk_mib"],
            &session["lifetime"]["idle_timeout_secs"]
        ),
        (&json!(256), &json!(1024), &json!(600)),
        "{session}"
    );

    let pid = ok(&server.cli(&["exec", "-d", &id, "--", "sleep", "1000"])).trim().to_owned();
    ok(&server.cli(&["kill", &id, &pid]));
    let out = server.cli(&["attach", &id, &pid]);
    assert_eq!(out.status.code(), Some(128 + 15), "TERM by default: {}", String::from_utf8_lossy(&out.stderr));
    let pid = ok(&server.cli(&["exec", "-d", &id, "--", "sh", "-c", "trap '' TERM; sleep 1000"])).trim().to_owned();
    ok(&server.cli(&["kill", &id, &pid, "--signal", "SIGKILL"]));
    assert_eq!(server.cli(&["attach", &id, &pid]).status.code(), Some(128 + 9));
    let out = server.cli(&["kill", &id, &pid, "--signal", "NOPE"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a signal"), "{out:?}");

    let out = server.cli(&["exec", "--timeout", "500ms", &id, "--", "sleep", "30"]);
    assert_eq!(out.status.code(), Some(124), "timed out: {}", String::from_utf8_lossy(&out.stderr));
    let out = server.cli(&["exec", "--timeout", "1x", &id, "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a duration"), "{out:?}");

    let out = server.cli(&["exec", &id, "ls", "-la"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("put `--` before the command: space exec {id} -- ls -la")), "{stderr}");
}

#[test]
fn help_lists_global_options_apart() {
    let out = std::process::Command::new(common::SPACE).args(["files", "put", "--help"]).output().unwrap();
    let help = ok(&out);
    let (own, global) = help.split_once("Global options:").expect("a Global options heading");
    assert!(own.contains("<LOCAL>") && !own.contains("--url"), "{help}");
    assert!(global.contains("--url") && global.contains("--json"), "{help}");
}

#[test]
fn argument_errors_are_json_under_json() {
    for args in
        [&["--json", "session", "create", "--memory", "1x"][..], &["session", "create", "--no-such-flag", "--json"]]
    {
        let out = std::process::Command::new(common::SPACE).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: stdout carries only results");
        let error: Value = serde_json::from_slice(&out.stderr).unwrap_or_else(|e| panic!("{args:?}: {e}: {out:?}"));
        assert_eq!((&error["error"]["code"], &error["error"]["status"]), (&json!("usage_error"), &Value::Null));
        assert!(error["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{error}");
    }
    // Without --json, and for help, clap's own text.
    let out = std::process::Command::new(common::SPACE).args(["session", "create", "--memory", "1x"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "), "{out:?}");
    let out = std::process::Command::new(common::SPACE).args(["--json", "session", "--help"]).output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Usage:"), "{out:?}");
}

#[test]
fn server_commands_hand_over_to_space_server_beside_space() {
    let dir = tempfile::tempdir().unwrap();
    let space = dir.path().join("space");
    std::fs::copy(common::SPACE, &space).unwrap();
    // Without it: a JSON error that says where it looked and how to install it.
    let out = std::process::Command::new(&space).args(["--json", "doctor"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let error: Value = serde_json::from_slice(&out.stderr).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let message = error["error"]["message"].as_str().unwrap_or_default();
    let wanted = dir.path().join("space-server");
    assert!(message.contains(&*wanted.to_string_lossy()) && message.contains("install.sh"), "{error}");
    assert_eq!(error["error"]["code"], "cli_error", "{error}");
    // With one: the same process (pid) runs it with the same arguments; client commands stay.
    std::fs::write(&wanted, "#!/bin/sh\necho \"$$ $*\"\n").unwrap();
    std::fs::set_permissions(&wanted, std::fs::Permissions::from_mode(0o755)).unwrap();
    let child = std::process::Command::new(&space)
        .args(["serve", "--listen", "127.0.0.1:1", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_eq!(ok(&out), format!("{pid} serve --listen 127.0.0.1:1 --json\n"));
    let status = ["--url", "http://127.0.0.1:1", "--api-key", "k", "status"];
    let out = std::process::Command::new(&space).args(status).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the space server"), "{out:?}");
    // space-server runs the client's commands too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_space-server")).args(status).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the space server"), "{out:?}");
    // A link to `space` in its place is refused, not exec'd forever.
    std::fs::remove_file(&wanted).unwrap();
    std::os::unix::fs::symlink(&space, &wanted).unwrap();
    let out = std::process::Command::new(&space).args(["doctor"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is this `space` binary, not space-server"), "{out:?}");
}

/// Waits for `child` to exit; a CLI that hangs fails the test instead of the whole suite
/// (the deadline is far beyond any healthy run).
fn wait_or_kill(mut child: std::process::Child, what: &str) -> Output {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{what} hung: {:?}", child.wait_with_output().unwrap());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn space(server: &Server, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(common::SPACE);
    command.args(args).env("SPACE_URL", &server.url).env("SPACE_API_KEY", &server.key);
    command
}

#[test]
fn exec_ends_piped_tty_input_and_forwards_ctrl_c() {
    use std::io::{BufRead, Write};
    use std::process::Stdio;
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));

    // The last line has no newline: one Ctrl-D on the terminal would only flush it.
    let mut child = space(&server, &["exec", "-t", &id, "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"line\nno newline").unwrap();
    let out = wait_or_kill(child, "exec -t with piped stdin");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("no newline"), "{out:?}");

    let script = "trap 'echo got-int' INT; echo ready; while :; do sleep 1; done";
    let mut child = space(&server, &["exec", &id, "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "got-int", "the first Ctrl-C reaches the command as SIGINT");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let out = wait_or_kill(child, "exec after a second Ctrl-C");
    assert_eq!(out.status.code(), Some(128 + 9), "the second Ctrl-C kills: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("killing the command"), "{out:?}");
}
