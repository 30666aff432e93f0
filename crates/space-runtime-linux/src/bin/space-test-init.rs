//! A stand-in for `spaced` used by this crate's integration tests: `space-test-init init` runs
//! [`space_sandbox_init::run_init`] exactly as spaced does, then serves a minimal agent on the
//! listener over the real protocol (handshake + yamux): `Health`, and `Exec` collecting the
//! whole output (no stdin, tty or detach). Everything else is answered `Unsupported`.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use futures::SinkExt;
use space_proto::{
    DataChannel, ErrorKind, ExecSpec, ExitStatus, Frame, FramedStream, Reply, Request, codec::DATA_CHUNK, handshake,
    next_frame, send_message, serve,
};

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() != Some("init") {
        eprintln!("usage: space-test-init init (started by the linux runtime)");
        return ExitCode::from(2);
    }
    let outcome = match space_sandbox_init::run_init() {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(accept_loop(outcome.listener)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serve: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn accept_loop(listener: std::os::unix::net::UnixListener) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let started = Instant::now();
    loop {
        let (mut conn, _) = listener.accept().await?;
        tokio::spawn(async move {
            if handshake(&mut conn, "space-test-init").await.is_ok() {
                let _ = serve(conn, move |stream| handle(stream, started)).await;
            }
        });
    }
}

async fn handle(mut stream: FramedStream, started: Instant) {
    let Ok(Some(frame)) = next_frame(&mut stream).await else {
        return;
    };
    let reply = match frame.parse::<Request>() {
        Ok(Request::Health) => Reply::Health {
            agent_version: env!("CARGO_PKG_VERSION").into(),
            uptime_ms: started.elapsed().as_millis() as u64,
            processes: 0,
            features: Vec::new(),
        },
        Ok(Request::Exec(spec)) => return exec(stream, spec).await,
        Ok(_) => Reply::error(ErrorKind::Unsupported, "space-test-init serves only health and exec"),
        Err(e) => Reply::error(ErrorKind::InvalidInput, e.to_string()),
    };
    let _ = send_message(&mut stream, &reply).await;
}

async fn exec(mut stream: FramedStream, spec: ExecSpec) {
    let Some((program, args)) = spec.argv.split_first() else {
        let _ = send_message(&mut stream, &Reply::error(ErrorKind::InvalidInput, "empty argv")).await;
        return;
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .envs(&spec.env)
        .current_dir(spec.cwd.as_deref().unwrap_or("/"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: reset_oom_score_adj is async-signal-safe (open/write/close, no allocation).
    unsafe {
        cmd.pre_exec(|| {
            let _ = space_sandbox_init::reset_oom_score_adj();
            Ok(())
        })
    };
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = send_message(&mut stream, &Reply::error(ErrorKind::Other, format!("spawn: {e}"))).await;
            return;
        }
    };
    let _ = send_message(&mut stream, &Reply::Started { pid: child.id().unwrap_or(0) }).await;
    let limit = spec.timeout_ms.map(Duration::from_millis).unwrap_or(Duration::from_secs(3600));
    let (output, timed_out) = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(output)) => (output, false),
        Ok(Err(e)) => {
            let _ = send_message(&mut stream, &Reply::error(ErrorKind::Other, format!("wait: {e}"))).await;
            return;
        }
        Err(_) => {
            let status = ExitStatus { code: None, signal: Some(9), timed_out: true };
            let _ = send_message(&mut stream, &Reply::Exited { status }).await;
            return;
        }
    };
    for (channel, bytes) in [(DataChannel::Stdout, output.stdout), (DataChannel::Stderr, output.stderr)] {
        for chunk in bytes.chunks(DATA_CHUNK) {
            let _ = stream.send(Frame::Data(channel, bytes::Bytes::copy_from_slice(chunk))).await;
        }
    }
    let status = ExitStatus { code: output.status.code(), signal: output.status.signal(), timed_out };
    let _ = send_message(&mut stream, &Reply::Exited { status }).await;
}
