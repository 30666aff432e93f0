//! Restoring through CRIU's RPC (`criu swrk FD`) instead of its command line.
//!
//! The point is the notifications: with `notify_scripts`, CRIU tells the caller about each
//! step of a restore over the socket and waits for the answer, where the command line's
//! `--action-script` forks CRIU's large process and execs a program for every step (seven per
//! restore, ~3.7 ms each on these hosts). The messages are the subset of CRIU's
//! `images/rpc.proto` this crate uses, with the same field numbers.

use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, recv, send, socketpair};
use prost::Message;

use crate::Criu;
use crate::kerndat::PrivateRun;

/// `criu_req_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum ReqType {
    Empty = 0,
    Restore = 2,
    Notify = 6,
}

/// `criu_cg_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(crate) enum CgMode {
    Ignore = 0,
    Soft = 3,
}

/// `cgroup_root`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CgroupRootMsg {
    #[prost(string, optional, tag = "1")]
    pub ctrl: Option<String>,
    #[prost(string, required, tag = "2")]
    pub path: String,
}

/// `criu_opts`: the fields a restore sets.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Opts {
    #[prost(int32, required, tag = "1")]
    pub images_dir_fd: i32,
    #[prost(bool, optional, tag = "5")]
    pub tcp_established: Option<bool>,
    #[prost(bool, optional, tag = "8")]
    pub file_locks: Option<bool>,
    #[prost(int32, optional, tag = "9")]
    pub log_level: Option<i32>,
    #[prost(bool, optional, tag = "12")]
    pub notify_scripts: Option<bool>,
    #[prost(string, optional, tag = "13")]
    pub root: Option<String>,
    #[prost(bool, optional, tag = "24")]
    pub manage_cgroups: Option<bool>,
    #[prost(message, repeated, tag = "25")]
    pub cg_root: Vec<CgroupRootMsg>,
    /// The restored tree's root becomes the caller's child rather than CRIU's.
    #[prost(bool, optional, tag = "26")]
    pub rst_sibling: Option<bool>,
    #[prost(bool, optional, tag = "28")]
    pub auto_ext_mnt: Option<bool>,
    #[prost(enumeration = "CgMode", optional, tag = "34")]
    pub manage_cgroups_mode: Option<i32>,
    #[prost(string, repeated, tag = "37")]
    pub external: Vec<String>,
    #[prost(uint32, optional, tag = "38")]
    pub empty_ns: Option<u32>,
    #[prost(bool, optional, tag = "46")]
    pub tcp_skip_in_flight: Option<bool>,
    /// A CRIU configuration file whose settings override these.
    #[prost(string, optional, tag = "51")]
    pub config_file: Option<String>,
}

/// `criu_req`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Req {
    #[prost(enumeration = "ReqType", required, tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub opts: Option<Opts>,
    #[prost(bool, optional, tag = "3")]
    pub notify_success: Option<bool>,
}

/// `criu_restore_resp`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RestoreResp {
    #[prost(int32, required, tag = "1")]
    pub pid: i32,
}

/// `criu_notify`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Notify {
    #[prost(string, optional, tag = "1")]
    pub script: Option<String>,
    #[prost(int32, optional, tag = "2")]
    pub pid: Option<i32>,
}

/// `criu_resp`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Resp {
    #[prost(enumeration = "ReqType", required, tag = "1")]
    pub r#type: i32,
    #[prost(bool, required, tag = "2")]
    pub success: bool,
    #[prost(message, optional, tag = "4")]
    pub restore: Option<RestoreResp>,
    #[prost(message, optional, tag = "5")]
    pub notify: Option<Notify>,
    #[prost(int32, optional, tag = "7")]
    pub cr_errno: Option<i32>,
    #[prost(string, optional, tag = "9")]
    pub cr_errmsg: Option<String>,
}

/// The fd number CRIU gets its end of the socket at.
const SWRK_FD: RawFd = 100;
/// CRIU's messages are small; a larger one would be cut (and refused).
const MAX_MESSAGE: usize = 64 * 1024;

/// A step CRIU announced: its name (`CRTOOLS_SCRIPT_ACTION`'s values) and, for some steps,
/// the host pid of the restored tree's root.
pub(crate) struct Step<'a> {
    pub name: &'a str,
    pub pid: Option<i32>,
}

/// How a `criu swrk` conversation ended, CRIU's stderr included.
pub(crate) struct Outcome {
    /// The restored root's pid, or why there is none.
    pub result: Result<i32, Failure>,
    pub stderr: String,
    pub status: std::process::ExitStatus,
}

/// Why a restore failed, and the root CRIU had forked for it if any: our child
/// (`rst_sibling`), killed by CRIU but not reaped by it.
pub(crate) struct Failure {
    pub reason: String,
    pub root: Option<i32>,
}

impl Failure {
    fn before_any_root(reason: String) -> Failure {
        Failure { reason, root: None }
    }
}

/// Runs one restore through `criu swrk`, answering each step with `on_step` (an `Err` aborts
/// the restore); CRIU's stderr goes to the new file `stderr`. Blocking: call it on a blocking
/// thread. Returns the restored root's pid.
pub(crate) fn restore(
    criu: &Criu,
    opts: Opts,
    stderr: &Path,
    mut on_step: impl FnMut(Step<'_>) -> Result<(), String>,
) -> std::io::Result<Outcome> {
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?;
    let mut child = spawn(criu, &theirs, File::create(stderr)?)?;
    drop(theirs); // EOF once CRIU is gone
    let result = converse(ours.as_raw_fd(), opts, &mut on_step);
    drop(ours);
    let status = child.wait()?;
    let stderr = std::fs::read_to_string(stderr).unwrap_or_default();
    Ok(Outcome { result, stderr, status })
}

fn spawn(criu: &Criu, theirs: &OwnedFd, stderr: File) -> std::io::Result<std::process::Child> {
    let mut command = Command::new(&criu.path);
    command.arg("swrk").arg(SWRK_FD.to_string()).stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr);
    let private_run = criu.private_run.as_deref().map(PrivateRun::new).transpose()?;
    let fd = theirs.as_raw_fd();
    let server = std::process::id();
    // SAFETY: only syscalls (prctl, dup2, fcntl, and `enter`'s unshare/mount) between fork and
    // exec.
    unsafe {
        command.pre_exec(move || {
            crate::run::die_with(server)?;
            if let Some(run) = &private_run {
                run.enter()?;
            }
            give_fd(fd, SWRK_FD)
        });
    }
    command.spawn()
}

/// Makes `fd` available to the exec'd program as `at` (not close-on-exec).
fn give_fd(fd: RawFd, at: RawFd) -> std::io::Result<()> {
    // SAFETY: dup2 and fcntl on plain integers; errors come back as -1.
    let ret = unsafe { if fd == at { libc::fcntl(at, libc::F_SETFD, 0) } else { libc::dup2(fd, at) } };
    if ret < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// The restored root's pid, or why the restore failed.
fn converse(sock: RawFd, opts: Opts, on_step: &mut impl FnMut(Step<'_>) -> Result<(), String>) -> Result<i32, Failure> {
    // SAFETY: `sock` stays open (owned by `restore`) for the whole conversation.
    let sock = unsafe { BorrowedFd::borrow_raw(sock) };
    let request = Req { r#type: ReqType::Restore as i32, opts: Some(opts), notify_success: None };
    send_message(sock, &request).map_err(Failure::before_any_root)?;
    let mut step_error = None;
    loop {
        let resp = recv_message(sock).map_err(Failure::before_any_root)?;
        match ReqType::try_from(resp.r#type) {
            Ok(ReqType::Notify) => {
                let notify = resp.notify.unwrap_or_default();
                let name = notify.script.as_deref().unwrap_or("");
                let answer = on_step(Step { name, pid: notify.pid });
                if let Err(e) = &answer {
                    step_error = Some(format!("step {name}: {e}"));
                }
                let reply = Req { r#type: ReqType::Notify as i32, opts: None, notify_success: Some(answer.is_ok()) };
                send_message(sock, &reply).map_err(Failure::before_any_root)?;
            }
            Ok(ReqType::Restore) => {
                let pid = resp.restore.map(|restored| restored.pid);
                return match (resp.success, pid) {
                    (true, Some(pid)) => Ok(pid),
                    _ => Err(Failure {
                        reason: step_error.unwrap_or_else(|| describe_failure(&resp.cr_errmsg, resp.cr_errno)),
                        root: pid.filter(|&pid| pid > 0),
                    }),
                };
            }
            _ => return Err(Failure::before_any_root(format!("unexpected CRIU message of type {}", resp.r#type))),
        }
    }
}

fn describe_failure(message: &Option<String>, errno: Option<i32>) -> String {
    match (message, errno) {
        (Some(message), _) => message.clone(),
        (None, Some(errno)) => format!("CRIU failed: {}", std::io::Error::from_raw_os_error(errno)),
        (None, None) => "CRIU failed".to_owned(),
    }
}

fn send_message(sock: BorrowedFd<'_>, message: &Req) -> Result<(), String> {
    send(sock.as_raw_fd(), &message.encode_to_vec(), MsgFlags::MSG_NOSIGNAL)
        .map(drop)
        .map_err(|e| format!("send to CRIU: {e}"))
}

fn recv_message(sock: BorrowedFd<'_>) -> Result<Resp, String> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let n = recv(sock.as_raw_fd(), &mut buf, MsgFlags::MSG_TRUNC).map_err(|e| format!("receive from CRIU: {e}"))?;
    if n == 0 {
        return Err("CRIU ended without an answer".to_owned());
    }
    if n > buf.len() {
        return Err(format!("CRIU sent a message of {n} bytes, more than {MAX_MESSAGE}"));
    }
    Resp::decode(&buf[..n]).map_err(|e| format!("bad message from CRIU: {e}"))
}

/// A directory opened for CRIU, which finds it through `/proc/<our pid>/fd/<fd>`.
pub(crate) fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    let fd = nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_use_criu_field_numbers() {
        let req = Req { r#type: ReqType::Notify as i32, opts: None, notify_success: Some(true) };
        // type = 6 (field 1, varint), notify_success = true (field 3, varint)
        assert_eq!(req.encode_to_vec(), vec![0x08, 6, 0x18, 1]);
        // type = RESTORE, success, restore { pid = 42 }
        let resp = Resp::decode(&[0x08, 2, 0x10, 1, 0x22, 2, 0x08, 42][..]).unwrap();
        assert_eq!((resp.r#type, resp.success, resp.restore.map(|r| r.pid)), (2, true, Some(42)));
        let notify = Resp::decode(&[0x08, 6, 0x10, 1, 0x2a, 7, 0x0a, 3, b'a', b'b', b'c', 0x10, 9][..]).unwrap();
        let notify = notify.notify.unwrap();
        assert_eq!((notify.script.as_deref(), notify.pid), (Some("abc"), Some(9)));
    }
}
