//! Exec, stdin, terminals, detached processes, attach and signals, against the real daemon.

mod common;

use bytes::Bytes;
use common::{Daemon, guarded, run, sh, spec, text};
use space_proto::{AgentError, ErrorKind, ExecEvent, ExecSession, PtySize};

#[tokio::test]
async fn exec_reports_output_and_exit_code() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let out = run(&client, sh("echo out; echo err >&2; exit 3")).await;
        assert_eq!(text(&out.stdout), "out\n");
        assert_eq!(text(&out.stderr), "err\n");
        assert_eq!(out.status.code, Some(3));
        assert_eq!(out.status.signal, None);
        assert!(!out.status.timed_out);
    })
    .await;
}

#[tokio::test]
async fn exec_killed_by_a_signal_reports_the_signal() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let out = run(&client, sh("kill -TERM $$")).await;
        assert_eq!(out.status.code, None);
        assert_eq!(out.status.signal, Some(libc::SIGTERM));
    })
    .await;
}

#[tokio::test]
async fn large_output_arrives_complete() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let out = run(&client, sh("head -c 3000000 /dev/zero")).await;
        assert_eq!(out.stdout.len(), 3_000_000);
        assert!(out.status.success());
    })
    .await;
}

#[tokio::test]
async fn stdin_round_trip() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let mut cat = spec(&["cat"]);
        cat.stdin = true;
        let session = client.exec(cat).await.unwrap();
        let input = session.input();
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        // Concurrently with reading, as a WebSocket bridge would.
        let writer = {
            let payload = Bytes::from(payload.clone());
            tokio::spawn(async move {
                input.send_stdin(payload).await.unwrap();
                input.close_stdin().await.unwrap();
            })
        };
        let out = session.wait_with_output(1 << 20).await.unwrap();
        writer.await.unwrap();
        assert_eq!(out.stdout, payload);
        assert!(out.status.success());
    })
    .await;
}

#[tokio::test]
async fn env_and_cwd() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let mut env_spec = sh("echo \"$FOO|$HOME|$PATH|${TERM:-none}\"; pwd");
        env_spec.env.insert("FOO".into(), "bar baz".into());
        env_spec.cwd = Some(daemon.dir().to_string_lossy().into_owned());
        let out = run(&client, env_spec).await;
        let expected_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        let canonical = std::fs::canonicalize(daemon.dir()).unwrap();
        assert_eq!(text(&out.stdout), format!("bar baz|/root|{expected_path}|none\n{}\n", canonical.display()));
        // The daemon's own environment does not leak into commands.
        let out = run(&client, spec(&["env"])).await;
        assert!(!text(&out.stdout).contains("CARGO"), "{}", text(&out.stdout));
    })
    .await;
}

#[tokio::test]
async fn bad_cwd_and_empty_argv_are_errors() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let mut missing = spec(&["true"]);
        missing.cwd = Some("/definitely/not/here".into());
        let err = client.exec(missing).await.err().expect("missing cwd is an error");
        assert_eq!(err.kind(), Some(ErrorKind::NotFound));
        let err = client.exec(spec(&[])).await.err().expect("empty argv is an error");
        assert_eq!(err.kind(), Some(ErrorKind::InvalidInput));
    })
    .await;
}

#[tokio::test]
async fn missing_binary_exits_127_and_non_executable_126() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let session = client.exec(spec(&["definitely-not-a-command-xyz", "arg"])).await.unwrap();
        assert_eq!(session.pid(), 0);
        let out = session.wait_with_output(4096).await.unwrap();
        assert_eq!(out.status.code, Some(127));
        assert_eq!(text(&out.stderr), "spaced: exec: definitely-not-a-command-xyz: No such file or directory\n");

        let script = daemon.dir().join("not-executable.sh");
        std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
        let out = run(&client, spec(&[script.to_str().unwrap()])).await;
        assert_eq!(out.status.code, Some(126));
        assert!(text(&out.stderr).contains("Permission denied"), "{}", text(&out.stderr));
    })
    .await;
}

#[tokio::test]
async fn timeout_kills_the_process_group() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let mut slow = sh("sleep 30; echo never");
        slow.timeout_ms = Some(200);
        let out = run(&client, slow).await;
        assert!(out.status.timed_out);
        assert_eq!(out.status.signal, Some(libc::SIGKILL));
        assert!(out.stdout.is_empty());
    })
    .await;
}

#[tokio::test]
async fn background_children_do_not_hold_the_exec_open() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let out = run(&client, sh("sleep 30 & echo started")).await;
        assert_eq!(text(&out.stdout), "started\n");
        assert!(out.status.success());
        // Same with a nohup'd child that keeps stdout and stderr.
        let out = run(&client, sh("nohup sleep 30 >/dev/stdout 2>&1 & echo again")).await;
        assert_eq!(text(&out.stdout), "again\n");
    })
    .await;
}

async fn next_stdout(session: &mut ExecSession, acc: &mut String, until: &str) {
    while !acc.contains(until) {
        match session.next_event().await.unwrap() {
            Some(ExecEvent::Stdout(data)) => acc.push_str(&text(&data)),
            Some(other) => panic!("unexpected {other:?} while waiting for {until:?} in {acc:?}"),
            None => panic!("stream ended while waiting for {until:?} in {acc:?}"),
        }
    }
}

#[tokio::test]
async fn pty_exec_has_a_terminal_and_resizes() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let mut tty = spec(&["tty"]);
        tty.tty = Some(PtySize { rows: 24, cols: 80 });
        let out = run(&client, tty).await;
        assert!(text(&out.stdout).starts_with("/dev/pts/"), "{}", text(&out.stdout));
        assert!(out.status.success());

        let mut resize = sh("stty size; read line; stty size; echo \"$TERM\"");
        resize.tty = Some(PtySize { rows: 24, cols: 80 });
        let mut session = client.exec(resize).await.unwrap();
        let mut seen = String::new();
        next_stdout(&mut session, &mut seen, "24 80").await;
        let input = session.input();
        input.resize(PtySize { rows: 40, cols: 100 }).await.unwrap();
        input.send_stdin(Bytes::from_static(b"go\n")).await.unwrap();
        next_stdout(&mut session, &mut seen, "xterm-256color").await;
        assert!(seen.contains("40 100"), "{seen:?}");
        let out = session.wait_with_output(4096).await.unwrap();
        assert!(out.status.success());
    })
    .await;
}

#[tokio::test]
async fn detached_exec_can_be_attached_before_and_after_exit() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let mut detached = sh("echo early; echo warn >&2; read line; echo \"got $line\"");
        detached.detached = true;
        detached.stdin = true;
        let mut session = client.exec(detached).await.unwrap();
        let pid = session.pid();
        assert!(pid > 0);
        assert_eq!(session.next_event().await.unwrap(), None, "a detached exec ends after Started");
        drop(session);

        // From another connection, as a restarted node would.
        let other = daemon.client().await;
        let attached = other.attach(pid).await.unwrap();
        attached.input().send_stdin(Bytes::from_static(b"hello\n")).await.unwrap();
        let out = attached.wait_with_output(4096).await.unwrap();
        assert_eq!(text(&out.stdout), "early\ngot hello\n");
        assert_eq!(text(&out.stderr), "warn\n");
        assert!(out.status.success());

        // After the exit: the buffered output and the status.
        let out = other.attach(pid).await.unwrap().wait_with_output(4096).await.unwrap();
        assert_eq!(text(&out.stdout), "early\ngot hello\n");
        assert!(out.status.success());

        let listed = other.processes().await.unwrap();
        let entry = listed.iter().find(|p| p.pid == pid).expect("listed");
        assert!(entry.detached);
        assert_eq!(entry.exit.map(|s| s.code), Some(Some(0)));
    })
    .await;
}

#[tokio::test]
async fn forgetting_exited_processes_keeps_running_ones() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let done = client.exec(sh("true")).await.unwrap();
        let done_pid = done.pid();
        assert!(done.wait_with_output(0).await.unwrap().status.success());
        let mut running = sh("sleep 100");
        running.detached = true;
        let running_pid = client.exec(running).await.unwrap().pid();

        client.forget_exited().await.unwrap();
        let pids: Vec<u32> = client.processes().await.unwrap().iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![running_pid], "exited {done_pid} still listed or running one lost");
        assert!(client.attach(done_pid).await.is_err(), "a forgotten process can still be attached");
        client.signal(running_pid, libc::SIGKILL).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn signals_reach_processes_started_by_spaced_only() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let mut sleeper = spec(&["sleep", "30"]);
        sleeper.detached = true;
        let pid = client.exec(sleeper).await.unwrap().pid();
        let health = client.health().await.unwrap();
        assert!(health.processes >= 1);
        client.signal(pid, libc::SIGTERM).await.unwrap();
        let out = client.attach(pid).await.unwrap().wait_with_output(4096).await.unwrap();
        assert_eq!(out.status.signal, Some(libc::SIGTERM));

        let err = client.signal(pid, libc::SIGTERM).await.unwrap_err();
        assert_eq!(err.kind(), Some(ErrorKind::NoSuchProcess));
        let err = client.signal(daemon.pid(), libc::SIGTERM).await.unwrap_err();
        assert_eq!(err.kind(), Some(ErrorKind::NoSuchProcess));
        let err = client.attach(999_999).await.err().expect("attach to nothing");
        assert_eq!(err.kind(), Some(ErrorKind::NoSuchProcess));

        // Through the exec stream itself.
        let session = client.exec(spec(&["sleep", "30"])).await.unwrap();
        session.input().signal(libc::SIGINT).await.unwrap();
        let out = session.wait_with_output(4096).await.unwrap();
        assert_eq!(out.status.signal, Some(libc::SIGINT));
    })
    .await;
}

#[tokio::test]
async fn abandoned_exec_is_killed() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let session = client.exec(spec(&["sleep", "30"])).await.unwrap();
        let pid = session.pid();
        drop(session);
        // Poll the process list until the kill shows (readiness loop, bounded by GUARD).
        loop {
            let listed = client.processes().await.unwrap();
            let entry = listed.iter().find(|p| p.pid == pid).expect("listed");
            if let Some(status) = entry.exit {
                assert_eq!(status.signal, Some(libc::SIGKILL));
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn connection_loss_is_closed_not_a_panic() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let mut session = client.exec(spec(&["sleep", "30"])).await.unwrap();
        drop(daemon);
        match session.next_event().await {
            Err(AgentError::Closed) => {}
            Ok(Some(ExecEvent::Exit(_))) => {} // the shutdown killed it first
            other => panic!("unexpected {other:?}"),
        }
    })
    .await;
}
