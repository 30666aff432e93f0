//! Harness: runs the real `spaced serve --socket` binary and connects an `AgentClient`.

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use space_proto::{AgentClient, ExecOutput, ExecSpec};

/// Upper bound for any single test, so that a bug hangs nothing forever. Not a timing
/// assertion: everything here normally finishes in well under a second.
pub const GUARD: Duration = Duration::from_secs(60);

/// A running daemon; killed (by pid) and its temp dir removed on drop, even on failure.
pub struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Daemon {
    pub fn start() -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("spaced.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_spaced"))
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .spawn()
            .expect("start spaced");
        let daemon = Daemon { child, dir, socket };
        // Readiness, not timing: wait until the socket accepts connections.
        for _ in 0..1000 {
            if std::os::unix::net::UnixStream::connect(&daemon.socket).is_ok() {
                return daemon;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("spaced does not accept connections");
    }

    /// A scratch directory for file tests (inside the daemon's temp dir).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    pub async fn client(&self) -> AgentClient {
        AgentClient::connect_unix(&self.socket).await.expect("connect to spaced")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = Pid::from_raw(self.child.id() as i32);
        // SIGTERM lets spaced kill the process groups it started; SIGKILL if it lingers.
        let _ = kill(pid, Signal::SIGTERM);
        for _ in 0..300 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = kill(pid, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Runs a test body under [`GUARD`].
pub async fn guarded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(GUARD, body).await.expect("test exceeded its guard timeout");
}

pub fn spec(argv: &[&str]) -> ExecSpec {
    ExecSpec { argv: argv.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

pub fn sh(script: &str) -> ExecSpec {
    spec(&["sh", "-c", script])
}

/// Runs to completion and collects output.
pub async fn run(client: &AgentClient, spec: ExecSpec) -> ExecOutput {
    let session = client.exec(spec).await.expect("exec");
    session.wait_with_output(16 << 20).await.expect("exec output")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
