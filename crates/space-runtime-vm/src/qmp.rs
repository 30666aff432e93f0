//! A small QMP client: JSON lines over QEMU's monitor socket.
//!
//! Hand-written rather than the `qapi` crate: the node needs a dozen commands, and one of
//! them (`getfd`) must carry a descriptor as SCM_RIGHTS ancillary data on the very write that
//! holds the command, which `qapi`'s stream types do not offer. Snapshots go through it:
//! under `-sandbox spawn=deny` QEMU cannot run `exec:` migrations, so the node hands it a
//! file with `getfd` and migrates to `fd:<name>`.
//!
//! QEMU is untrusted here (it runs what the guest makes it run): replies are bounded in size
//! and everything unexpected is an error, never a panic.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;

/// Longest line accepted from QEMU (a `query-migrate` reply is a few hundred bytes).
const MAX_LINE: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("connect to {path}: {source}")]
    Connect { path: String, source: io::Error },
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("QEMU closed the monitor connection")]
    Closed,
    #[error("QEMU broke the protocol: {0}")]
    Protocol(String),
    #[error("{command}: {class}: {desc}")]
    Command { command: String, class: String, desc: String },
}

/// What `query-status` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmStatus {
    pub running: bool,
    /// QEMU's run state: `running`, `paused`, `inmigrate`, `postmigrate`, `shutdown`, ...
    pub status: String,
}

/// One monitor connection, past the capabilities negotiation. QEMU serves one client per
/// monitor at a time: a second connection waits until this one is dropped.
#[derive(Debug)]
pub struct Qmp {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Qmp {
    /// Connects, reads the greeting and leaves negotiation mode.
    pub async fn connect(path: &Path) -> Result<Qmp, QmpError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| QmpError::Connect { path: path.display().to_string(), source })?;
        let mut qmp = Qmp { stream, buf: Vec::new() };
        let greeting = qmp.read_message().await?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol(format!("expected the greeting, got {}", short(&greeting))));
        }
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    /// Runs a command and returns its `return` value; events that arrive meanwhile are
    /// dropped (nothing here subscribes to them).
    pub async fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let line = request(command, arguments)?;
        self.stream.write_all(line.as_bytes()).await?;
        self.reply(command).await
    }

    /// Runs a command whose write carries `fd` as SCM_RIGHTS (QEMU takes descriptors only
    /// with the data they arrive with).
    pub async fn execute_with_fd(
        &mut self,
        command: &str,
        arguments: Option<Value>,
        fd: BorrowedFd<'_>,
    ) -> Result<Value, QmpError> {
        let line = request(command, arguments)?;
        let fds = [fd.as_raw_fd()];
        let mut sent = 0;
        // The descriptor goes with the first byte; the rest of the line, if the socket took
        // only part of it, follows as plain data.
        while sent == 0 {
            let raw = self.stream.as_raw_fd();
            sent = self
                .stream
                .async_io(Interest::WRITABLE, || {
                    let iov = [IoSlice::new(line.as_bytes())];
                    let cmsg = [ControlMessage::ScmRights(&fds)];
                    sendmsg::<()>(raw, &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
                })
                .await?;
        }
        self.stream.write_all(&line.as_bytes()[sent..]).await?;
        self.reply(command).await
    }

    pub async fn stop(&mut self) -> Result<(), QmpError> {
        self.execute("stop", None).await.map(drop)
    }

    pub async fn cont(&mut self) -> Result<(), QmpError> {
        self.execute("cont", None).await.map(drop)
    }

    pub async fn query_status(&mut self) -> Result<VmStatus, QmpError> {
        let value = self.execute("query-status", None).await?;
        let running = value.get("running").and_then(Value::as_bool);
        let status = value.get("status").and_then(Value::as_str);
        match (running, status) {
            (Some(running), Some(status)) => Ok(VmStatus { running, status: status.to_owned() }),
            _ => Err(QmpError::Protocol(format!("query-status returned {}", short(&value)))),
        }
    }

    /// Hands QEMU a descriptor under `name` (for `migrate fd:<name>`, `add-fd`, ...).
    pub async fn getfd(&mut self, name: &str, fd: BorrowedFd<'_>) -> Result<(), QmpError> {
        self.execute_with_fd("getfd", Some(json!({ "fdname": name })), fd).await.map(drop)
    }

    /// Starts an outgoing migration; it runs in the background (see [`Qmp::query_migrate`]).
    pub async fn migrate(&mut self, uri: &str) -> Result<(), QmpError> {
        self.execute("migrate", Some(json!({ "uri": uri }))).await.map(drop)
    }

    /// Starts an incoming migration of a QEMU started with `-incoming defer`.
    pub async fn migrate_incoming(&mut self, uri: &str) -> Result<(), QmpError> {
        self.execute("migrate-incoming", Some(json!({ "uri": uri }))).await.map(drop)
    }

    /// `query-migrate`'s reply as QEMU sends it; `status` is `completed` once the stream is
    /// whole (also `active`, `failed`, `cancelled`, or absent before any migration).
    pub async fn query_migrate(&mut self) -> Result<Value, QmpError> {
        self.execute("query-migrate", None).await
    }

    /// Stops an outgoing migration that has not completed.
    pub async fn migrate_cancel(&mut self) -> Result<(), QmpError> {
        self.execute("migrate_cancel", None).await.map(drop)
    }

    /// Whether a client is connected to the socket chardev `label` (QEMU names a server
    /// socket without one `disconnected:...` in `query-chardev`).
    pub async fn chardev_connected(&mut self, label: &str) -> Result<bool, QmpError> {
        let value = self.execute("query-chardev", None).await?;
        let devices =
            value.as_array().ok_or_else(|| QmpError::Protocol(format!("query-chardev: {}", short(&value))))?;
        let device = devices
            .iter()
            .find(|d| d.get("label").and_then(Value::as_str) == Some(label))
            .ok_or_else(|| QmpError::Protocol(format!("no chardev {label:?}")))?;
        let filename = device.get("filename").and_then(Value::as_str).unwrap_or_default();
        Ok(!filename.starts_with("disconnected:"))
    }

    /// Asks QEMU to exit. It may close the connection before answering.
    pub async fn quit(&mut self) -> Result<(), QmpError> {
        match self.execute("quit", None).await {
            Ok(_) | Err(QmpError::Closed) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn reply(&mut self, command: &str) -> Result<Value, QmpError> {
        loop {
            let message = self.read_message().await?;
            if let Some(value) = message.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = message.get("error") {
                let field = |key: &str| error.get(key).and_then(Value::as_str).unwrap_or("?").to_owned();
                return Err(QmpError::Command {
                    command: command.to_owned(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            if message.get("event").is_none() {
                return Err(QmpError::Protocol(format!("unexpected message {}", short(&message))));
            }
        }
    }

    async fn read_message(&mut self) -> Result<Value, QmpError> {
        loop {
            if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line).map_err(|e| QmpError::Protocol(format!("bad JSON: {e}")));
            }
            if self.buf.len() > MAX_LINE {
                return Err(QmpError::Protocol(format!("a line longer than {MAX_LINE} bytes")));
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk).await? {
                0 => return Err(QmpError::Closed),
                n => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

fn request(command: &str, arguments: Option<Value>) -> Result<String, QmpError> {
    let mut message = json!({ "execute": command });
    if let Some(arguments) = arguments {
        message["arguments"] = arguments;
    }
    let mut line = serde_json::to_string(&message).map_err(|e| QmpError::Protocol(e.to_string()))?;
    line.push('\n');
    Ok(line)
}

/// A message, cut for an error text.
fn short(value: &Value) -> String {
    let mut text = value.to_string();
    if text.len() > 200 {
        let mut end = 200;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use nix::sys::socket::{ControlMessageOwned, recvmsg};
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::net::UnixListener;

    use super::*;

    /// A fake QEMU: greets, accepts capabilities, answers `stop` after an event, fails `cont`,
    /// and checks that `getfd` arrives with a descriptor.
    #[tokio::test]
    async fn commands_events_errors_and_fd_passing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        // A blocking server on a thread of its own: the test's runtime has one thread.
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (std, _) = listener.accept().unwrap();
            let mut writer = std.try_clone().unwrap();
            use std::io::Write;
            writeln!(writer, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
            let mut got_fd = false;
            for _ in 0..4 {
                // getfd's line comes with a descriptor: read it with recvmsg.
                let mut space = nix::cmsg_space!([i32; 1]);
                let mut data = [0u8; 512];
                let mut iov = [std::io::IoSliceMut::new(&mut data)];
                let msg = recvmsg::<()>(std.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::empty()).unwrap();
                for cmsg in msg.cmsgs().unwrap() {
                    if let ControlMessageOwned::ScmRights(fds) = cmsg {
                        got_fd = !fds.is_empty();
                    }
                }
                let n = msg.bytes;
                let line = String::from_utf8_lossy(&data[..n]).into_owned();
                let reply = if line.contains("qmp_capabilities") {
                    r#"{"return": {}}"#.to_string()
                } else if line.contains("\"stop\"") {
                    r#"{"event": "STOP"}
{"return": {}}"#
                        .to_string()
                } else if line.contains("\"cont\"") {
                    r#"{"error": {"class": "GenericError", "desc": "nope"}}"#.to_string()
                } else if line.contains("getfd") {
                    format!(r#"{{"return": {{}}, "fd": {got_fd}}}"#)
                } else {
                    r#"{"return": {}}"#.to_string()
                };
                writeln!(writer, "{reply}").unwrap();
            }
            got_fd
        });
        let mut qmp = Qmp::connect(&path).await.unwrap();
        qmp.stop().await.unwrap();
        let err = qmp.cont().await.unwrap_err();
        assert!(matches!(&err, QmpError::Command { class, desc, .. } if class == "GenericError" && desc == "nope"));
        let file = std::fs::File::open("/dev/null").unwrap();
        qmp.getfd("snap", file.as_fd()).await.unwrap();
        assert!(server.join().unwrap(), "the descriptor did not arrive");
    }

    #[tokio::test]
    async fn a_closed_connection_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut lines = BufReader::new(stream);
            lines.get_mut().write_all(b"{\"QMP\": {}}\n").await.unwrap();
            let mut line = String::new();
            lines.read_line(&mut line).await.unwrap();
        });
        assert!(matches!(Qmp::connect(&path).await, Err(QmpError::Closed)));
    }
}
