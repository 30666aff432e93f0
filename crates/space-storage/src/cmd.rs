//! Running the few external tools this crate uses (mkfs.btrfs, mount, cp, tar, debootstrap)
//! with errors that say what to install or check.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;

use crate::error::{Result, StorageError};

const TAIL_LINES: usize = 15;

/// The Debian package that provides `program`, for "not installed" errors.
fn package_of(program: &str) -> &'static str {
    match program {
        "mkfs.btrfs" | "btrfs" => "btrfs-progs",
        "debootstrap" => "debootstrap",
        "busybox" => "busybox-static",
        "tar" => "tar",
        "mount" | "umount" => "mount",
        _ => "coreutils",
    }
}

/// `cmd` rendered for messages.
pub fn render(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Starts `cmd`, mapping "not found" to an install hint.
pub fn spawn(cmd: &mut Command) -> Result<Child> {
    cmd.spawn().map_err(|e| spawn_error(cmd, e))
}

fn spawn_error(cmd: &Command, e: std::io::Error) -> StorageError {
    let program = cmd.get_program().to_string_lossy().into_owned();
    if e.kind() == std::io::ErrorKind::NotFound {
        let package = package_of(&program);
        StorageError::MissingTool { program, package }
    } else {
        StorageError::io("run", program, e)
    }
}

/// An error for a command that exited unsuccessfully.
pub fn failed(cmd: &Command, status: ExitStatus, output: &str, hint: &'static str) -> StorageError {
    StorageError::Command { command: render(cmd), status: status.to_string(), output: output.trim().to_string(), hint }
}

/// Runs `cmd` to completion; on failure the error carries its output and `hint`.
pub fn run(cmd: &mut Command, hint: &'static str) -> Result<String> {
    tracing::debug!(command = %render(cmd), "running");
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| spawn_error(cmd, e))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(failed(cmd, out.status, &tail(&text), hint));
    }
    Ok(text)
}

/// The last lines of `text`.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

/// Reads `reader` to the end on a thread and returns its text (bounded to the last lines).
pub fn drain<R: Read + Send + 'static>(reader: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut tail = Tail::default();
        for line in BufReader::new(reader).lines().map_while(|l| l.ok()) {
            tail.push(line);
        }
        tail.text()
    })
}

/// Streams the lines of a child's stdout and stderr into one channel, in arrival order.
pub fn line_channel(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        forward_lines(out, tx.clone());
    }
    if let Some(err) = child.stderr.take() {
        forward_lines(err, tx);
    }
    rx
}

fn forward_lines<R: Read + Send + 'static>(reader: R, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
}

/// The last few lines of a stream, for error messages.
#[derive(Default)]
pub struct Tail(VecDeque<String>);

impl Tail {
    pub fn push(&mut self, line: String) {
        if self.0.len() == TAIL_LINES {
            self.0.pop_front();
        }
        self.0.push_back(line);
    }

    pub fn text(&self) -> String {
        Vec::from(self.0.clone()).join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tools_say_what_to_install() {
        let err = run(&mut Command::new("mkfs.nonexistent-tool"), "").unwrap_err();
        assert!(matches!(err, StorageError::MissingTool { .. }), "{err}");
        assert!(err.to_string().contains("apt-get install"));
    }

    #[test]
    fn failures_carry_output_and_hint() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo boom >&2; exit 3"]);
        let err = run(&mut cmd, "check the thing").unwrap_err().to_string();
        assert!(err.contains("boom") && err.contains("check the thing"), "{err}");
    }

    #[test]
    fn tail_keeps_last_lines() {
        let mut t = Tail::default();
        for i in 0..20 {
            t.push(i.to_string());
        }
        assert!(t.text().starts_with("5\n") && t.text().ends_with("19"));
    }
}
