//! Starting one process from an [`ExecSpec`]: environment, credentials, process group,
//! terminal, working directory.
//!
//! Everything the child does between `fork` and `exec` is in [`child_setup`], which only
//! makes async-signal-safe system calls on data prepared before the fork.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::unistd::{Gid, Pid, Uid};
use space_proto::{EXEC_DEFAULTS_PATH, ExecDefaults, ExecSpec, ExitStatus};
use tokio::sync::oneshot;

use crate::pty;
use crate::reaper::Reaper;

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Larger defaults files are ignored (they are a template's, a few hundred bytes).
const MAX_DEFAULTS: u64 = 64 << 10;

static DEFAULTS: std::sync::OnceLock<ExecDefaults> = std::sync::OnceLock::new();

/// Reads the template's command defaults ([`EXEC_DEFAULTS_PATH`]), once, at start: after
/// that the sandbox's own changes to the file do not matter. A missing file means none; an
/// unusable one is reported and ignored.
pub fn load_defaults() {
    let loaded = match read_defaults(Path::new(EXEC_DEFAULTS_PATH)) {
        Ok(defaults) => defaults,
        Err(e) => {
            eprintln!("spaced: warning: ignoring {EXEC_DEFAULTS_PATH}: {e}");
            ExecDefaults::default()
        }
    };
    let _ = DEFAULTS.set(loaded);
}

fn read_defaults(path: &Path) -> io::Result<ExecDefaults> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking: a FIFO put there must not hang pid 1; then only a regular file is read.
    let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path);
    let file = match opened {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ExecDefaults::default()),
        other => other?,
    };
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut text = Vec::new();
    file.take(MAX_DEFAULTS + 1).read_to_end(&mut text)?;
    if text.len() as u64 > MAX_DEFAULTS {
        return Err(io::Error::other("larger than 64 KiB"));
    }
    serde_json::from_slice(&text).map_err(io::Error::other)
}

fn defaults() -> &'static ExecDefaults {
    DEFAULTS.get_or_init(ExecDefaults::default)
}

/// A started process.
pub struct Spawned {
    pub pid: u32,
    pub exit: oneshot::Receiver<ExitStatus>,
    pub io: ProcessIo,
}

/// Our ends of the child's standard streams.
pub enum ProcessIo {
    Pipes {
        stdin: Option<OwnedFd>,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    /// Output and input both go through the terminal master.
    Pty {
        master: OwnedFd,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The request itself is unusable (empty argv, NUL bytes, ...).
    #[error("{0}")]
    Invalid(String),
    /// The working directory is missing or not a directory.
    #[error("cwd {path}: {source}")]
    Cwd { path: String, source: io::Error },
    /// Pipes or the terminal could not be created.
    #[error("cannot set up the process: {0}")]
    Setup(#[source] io::Error),
    /// The program could not be executed (also covers failures of the child's setup
    /// after fork, which std reports the same way).
    #[error("exec {program}: {source}")]
    Exec { program: String, source: io::Error },
}

/// Starts the process described by `spec`. Blocking (fork + exec).
pub fn spawn(reaper: &Reaper, spec: &ExecSpec) -> Result<Spawned, SpawnError> {
    validate(spec)?;
    let cwd = working_dir(spec.cwd.as_deref().or(defaults().cwd.as_deref()))?;
    let cwd_c =
        CString::new(cwd.as_os_str().as_bytes()).map_err(|_| SpawnError::Invalid("cwd contains a NUL byte".into()))?;
    let mut cmd = command(spec);
    let (io, child_ends) = stdio(spec)?;
    child_ends.install(&mut cmd);
    let creds = Credentials::from_spec(spec, defaults());
    let tty = spec.tty.is_some();
    // SAFETY: the hook runs in the forked child before exec. It only makes
    // async-signal-safe system calls on values captured before the fork (no allocation,
    // no locks), as required in a child of a multi-threaded parent.
    unsafe {
        cmd.pre_exec(move || child_setup(tty, creds, &cwd_c));
    }
    let (child, exit) = reaper
        .spawn(&mut cmd)
        .map_err(|source| SpawnError::Exec { program: spec.argv.first().cloned().unwrap_or_default(), source })?;
    // `cmd` still holds the child's ends (slave / pipe ends): dropping it closes them here,
    // so EOF is seen once the child and its descendants close theirs.
    drop(cmd);
    Ok(Spawned { pid: child.id(), exit, io: io.finish(child)? })
}

fn validate(spec: &ExecSpec) -> Result<(), SpawnError> {
    let invalid = |m: &str| Err(SpawnError::Invalid(m.into()));
    if spec.argv.is_empty() || spec.argv[0].is_empty() {
        return invalid("argv is empty");
    }
    if spec.argv.iter().any(|a| a.contains('\0')) {
        return invalid("argv contains a NUL byte");
    }
    for (key, value) in &spec.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(SpawnError::Invalid(format!("invalid environment variable {key:?}")));
        }
    }
    Ok(())
}

/// The working directory, resolved against "/" and checked up front so that a missing
/// directory is an error reply rather than a confusing exec failure.
fn working_dir(cwd: Option<&str>) -> Result<PathBuf, SpawnError> {
    let path = Path::new("/").join(cwd.unwrap_or("/"));
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => Ok(path),
        Ok(_) => Err(SpawnError::Cwd {
            path: path.display().to_string(),
            source: io::Error::from_raw_os_error(libc::ENOTDIR),
        }),
        Err(source) => Err(SpawnError::Cwd { path: path.display().to_string(), source }),
    }
}

/// Program, arguments and a clean environment. `execvp` in the child searches the PATH
/// of this environment.
fn command(spec: &ExecSpec) -> Command {
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]);
    cmd.env_clear();
    cmd.env("PATH", DEFAULT_PATH);
    cmd.env("HOME", "/root");
    if spec.tty.is_some() {
        cmd.env("TERM", "xterm-256color");
    }
    cmd.envs(&defaults().env);
    cmd.envs(&spec.env);
    cmd
}

/// The child's standard streams, installed into the command.
struct ChildEnds {
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
}

impl ChildEnds {
    fn install(self, cmd: &mut Command) {
        cmd.stdin(self.stdin).stdout(self.stdout).stderr(self.stderr);
    }
}

/// Our ends, before spawning: pipes are created by std and collected from the child.
enum ParentEnds {
    Pipes,
    Pty(OwnedFd),
}

impl ParentEnds {
    fn finish(self, mut child: std::process::Child) -> Result<ProcessIo, SpawnError> {
        // The `Child` is dropped without waiting: the reaper collects the exit status.
        match self {
            ParentEnds::Pty(master) => Ok(ProcessIo::Pty { master }),
            ParentEnds::Pipes => {
                let missing = || SpawnError::Setup(io::Error::other("child pipe missing"));
                let stdout = child.stdout.take().ok_or_else(missing)?;
                let stderr = child.stderr.take().ok_or_else(missing)?;
                Ok(ProcessIo::Pipes {
                    stdin: child.stdin.take().map(OwnedFd::from),
                    stdout: stdout.into(),
                    stderr: stderr.into(),
                })
            }
        }
    }
}

fn stdio(spec: &ExecSpec) -> Result<(ParentEnds, ChildEnds), SpawnError> {
    let Some(size) = spec.tty else {
        let stdin = if spec.stdin { Stdio::piped() } else { Stdio::null() };
        let ends = ChildEnds { stdin, stdout: Stdio::piped(), stderr: Stdio::piped() };
        return Ok((ParentEnds::Pipes, ends));
    };
    let pty = pty::open(size).map_err(SpawnError::Setup)?;
    let dup = |fd: &OwnedFd| fd.try_clone().map(Stdio::from).map_err(SpawnError::Setup);
    let ends = ChildEnds { stdin: dup(&pty.slave)?, stdout: dup(&pty.slave)?, stderr: dup(&pty.slave)? };
    Ok((ParentEnds::Pty(pty.master), ends))
}

/// Who the child runs as. A uid without a gid runs with gid = uid, so that dropping to an
/// unprivileged user never keeps root's group.
#[derive(Clone, Copy)]
struct Credentials {
    uid: Option<u32>,
    gid: Option<u32>,
}

impl Credentials {
    /// The request's user, else the template's.
    fn from_spec(spec: &ExecSpec, defaults: &ExecDefaults) -> Self {
        match spec.uid {
            Some(uid) => Credentials { uid: Some(uid), gid: spec.gid.or(Some(uid)) },
            None => Credentials { uid: defaults.uid, gid: spec.gid.or(defaults.gid).or(defaults.uid) },
        }
    }
}

/// Runs in the child between fork and exec; async-signal-safe calls only.
fn child_setup(tty: bool, creds: Credentials, cwd: &CStr) -> io::Result<()> {
    // Before dropping privileges: afterwards /proc/self is no longer writable by us.
    reset_oom_score_adj();
    // Own process group (or session, for a terminal) so that timeouts and abandoned
    // execs can kill everything the command started, and nothing else.
    if tty {
        nix::unistd::setsid()?;
        pty::take_controlling_terminal()?;
    } else {
        nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
    }
    if creds.uid.is_some() || creds.gid.is_some() {
        // EPERM: in a user namespace with setgroups denied, there are none to drop.
        match nix::unistd::setgroups(&[]) {
            Ok(()) | Err(nix::errno::Errno::EPERM) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(gid) = creds.gid {
        nix::unistd::setgid(Gid::from_raw(gid))?;
    }
    if let Some(uid) = creds.uid {
        nix::unistd::setuid(Uid::from_raw(uid))?;
    }
    // After setuid, so access to the directory is checked as the target user.
    nix::unistd::chdir(cwd)?;
    Ok(())
}

/// The node makes pid 1 unkillable by the OOM killer (-1000); children inherit that, but
/// must stay killable so a runaway command hits the memory cgroup limit, not spaced.
fn reset_oom_score_adj() {
    let path = c"/proc/self/oom_score_adj";
    // SAFETY: open/write/close on a static NUL-terminated path and a static buffer;
    // errors are ignored on purpose (e.g. /proc not mounted in host tests).
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
        }
    }
}

/// The exit code a shell would give for a failed exec: 127 for "not found", else 126.
pub fn exec_failure_code(err: &io::Error) -> i32 {
    if err.raw_os_error() == Some(libc::ENOENT) { 127 } else { 126 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_specs_are_rejected_before_forking() {
        let mut spec = ExecSpec::default();
        assert!(matches!(validate(&spec), Err(SpawnError::Invalid(_))));
        spec.argv = vec!["true\0".into()];
        assert!(matches!(validate(&spec), Err(SpawnError::Invalid(_))));
        spec.argv = vec!["true".into()];
        spec.env.insert("A=B".into(), "x".into());
        assert!(matches!(validate(&spec), Err(SpawnError::Invalid(_))));
    }

    #[test]
    fn relative_cwd_is_relative_to_root_and_must_exist() {
        assert_eq!(working_dir(Some("tmp")).unwrap(), Path::new("/tmp"));
        assert!(matches!(working_dir(Some("/nonexistent-dir-xyz")), Err(SpawnError::Cwd { .. })));
    }

    #[test]
    fn exit_codes_for_exec_failures() {
        assert_eq!(exec_failure_code(&io::Error::from_raw_os_error(libc::ENOENT)), 127);
        assert_eq!(exec_failure_code(&io::Error::from_raw_os_error(libc::EACCES)), 126);
    }
}
