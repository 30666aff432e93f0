//! Pid 1 executes itself again from inside the sandbox, so that CRIU can checkpoint it.
//!
//! `spaced init` is executed on the host, so pid 1's executable is a file on a host mount that
//! the sandbox's mount namespace does not contain, and CRIU records an executable by a mount of
//! the dumped namespace. So once the sandbox is built and confined, pid 1 bind-mounts its own
//! binary read-only at [`SELF_EXE`] and executes that with the same arguments.
//!
//! The new image is dumpable (exec resets the flag) until spaced clears it at the node's first
//! connection; it is dumpable again only while the node takes a full snapshot
//! (`Request::AllowCheckpoint`): CRIU checks a tree's namespaces from a process inside the
//! sandbox's user namespace, which cannot open the namespace files of a non-dumpable pid 1
//! whose memory belongs to the host's user namespace, and a pid 1 CRIU restored always has such
//! memory (CRIU builds it in a process it forked). Sandbox root has pid 1's uid, so outside
//! that window only the flag keeps it from ptracing pid 1.
//!
//! The new image enters [`crate::run_init`] again and recognises itself by being pid 1
//! ([`resume`]): fd 3 is still the sync channel, fd 4 the listener, and fd [`WARNINGS_FD`] a
//! pipe with the warnings collected so far. It reports `Ready` itself, so a failed exec is
//! still reported as an error. A dynamically linked binary cannot be executed from inside a
//! rootfs that lacks its loader (or has a different libc), so it is not re-executed; the
//! sandbox then works as before but cannot be checkpointed, and `Ready` carries a warning.

use std::ffi::{CString, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::{UnixListener, UnixStream};

use nix::fcntl::OFlag;

use crate::sync::{self, FromInit};
use crate::sys::{self, ctx, io_ctx};
use crate::{InitError, InitOutcome};

/// Where pid 1's own binary is bind-mounted inside the sandbox (on the sandbox's /dev tmpfs,
/// which init owns, so nothing in the rootfs changes).
pub const SELF_EXE: &str = "/dev/.spaced";

/// The pipe carrying the warnings across the exec.
const WARNINGS_FD: RawFd = 5;

/// Warnings are a handful of short lines; bounded so the pipe write can never block.
const MAX_WARNINGS_LEN: usize = 16 * 1024;

/// Whether the running binary is statically linked (no `PT_INTERP`), i.e. can run from inside
/// any rootfs.
pub(crate) fn self_is_static() -> bool {
    let mut head = vec![0u8; 64 * 1024];
    let n = std::fs::File::open("/proc/self/exe").and_then(|mut f| read_up_to(&mut f, &mut head)).unwrap_or(0);
    head.truncate(n);
    elf_is_static(&head)
}

fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// A 64-bit little-endian ELF whose program headers (all within `elf`) have no `PT_INTERP`.
/// Anything else, including a truncated header, counts as not static.
fn elf_is_static(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| elf.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |at: usize| elf.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let u64_at = |at: usize| elf.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    (0..phnum).all(|i| {
        let at = (phoff as usize).saturating_add(i * phentsize);
        matches!(u32_at(at), Some(kind) if kind != PT_INTERP)
    })
}

/// Executes [`SELF_EXE`] with this process's arguments, handing over the sync channel, the
/// listener and `warnings`. Returns only on failure.
pub(crate) fn exec_self(warnings: &[String]) -> InitError {
    match try_exec_self(warnings) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

fn try_exec_self(warnings: &[String]) -> Result<std::convert::Infallible, InitError> {
    let json = serde_json::to_vec(warnings).map_err(|e| InitError(format!("encode warnings: {e}")))?;
    if json.len() > MAX_WARNINGS_LEN {
        return Err(InitError(format!("{} bytes of warnings", json.len())));
    }
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(ctx("pipe for warnings"))?;
    std::fs::File::from(write).write_all(&json).map_err(io_ctx("write warnings"))?;
    if read.as_raw_fd() != WARNINGS_FD {
        // SAFETY: dup2 onto fd 5, which pid 1 closed (close_from) and no Rust object owns; the
        // duplicate lives on past exec on purpose and `read` is closed on return.
        let rc = unsafe { libc::dup2(read.as_raw_fd(), WARNINGS_FD) };
        nix::errno::Errno::result(rc).map_err(ctx("dup2 warnings pipe"))?;
    } else {
        std::mem::forget(read); // already at fd 5; it must stay open across the exec
    }
    for fd in [sync::SYNC_FD, sync::LISTENER_FD, WARNINGS_FD] {
        sys::set_cloexec(fd, false)?;
    }
    let path = CString::new(SELF_EXE).expect("no NUL");
    let args: Vec<CString> = std::env::args_os()
        .map(|a: OsString| CString::new(a.into_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| InitError(format!("argument with NUL: {e}")))?;
    let err = nix::unistd::execv(&path, &args).map_err(ctx(format!("exec {SELF_EXE}")));
    // Still this image: no fd may leak into what it starts later.
    for fd in [sync::SYNC_FD, sync::LISTENER_FD] {
        let _ = sys::set_cloexec(fd, true);
    }
    // SAFETY: fd 5 is the pipe duplicate made above; nothing else owns it.
    drop(unsafe { OwnedFd::from_raw_fd(WARNINGS_FD) });
    err
}

/// The re-executed pid 1: confirms the inherited fds, reports `Ready` with the warnings of the
/// first image and returns the listener.
pub(crate) fn resume(channel: &UnixStream) -> Result<InitOutcome, InitError> {
    if !sys::is_listening_socket(sync::LISTENER_FD) {
        return Err(InitError(format!("re-executed pid 1: fd {} is not a listening socket", sync::LISTENER_FD)));
    }
    let mut warnings = read_warnings()?;
    sys::set_cloexec(sync::LISTENER_FD, true)?;
    warnings.retain(|w| !w.is_empty());
    sync::send(channel, &FromInit::Ready { warnings }).map_err(io_ctx("send ready"))?;
    // SAFETY: fd 4 is the inherited listening socket (checked above); nothing else in this
    // process owns it.
    let listener = UnixListener::from(unsafe { sys::adopt(sync::LISTENER_FD) });
    Ok(InitOutcome { listener })
}

fn read_warnings() -> Result<Vec<String>, InitError> {
    let is_pipe = nix::sys::stat::fstat(
        // SAFETY: only borrowed for the fstat call; fstat on a closed fd returns EBADF.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(WARNINGS_FD) },
    )
    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFIFO);
    if !is_pipe {
        return Err(InitError(format!("re-executed pid 1: fd {WARNINGS_FD} is not the warnings pipe")));
    }
    // SAFETY: fd 5 is the inherited pipe (checked above); nothing else owns it.
    let mut pipe = std::fs::File::from(unsafe { sys::adopt(WARNINGS_FD) });
    let mut json = Vec::new();
    // The writer closed its end before the exec: this reads what is buffered, then EOF.
    (&mut pipe).take(MAX_WARNINGS_LEN as u64 + 1).read_to_end(&mut json).map_err(io_ctx("read warnings"))?;
    serde_json::from_slice(&json).map_err(|e| InitError(format!("decode warnings: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf_with(program_headers: &[u32]) -> Vec<u8> {
        let mut elf = vec![0u8; 0x40 + program_headers.len() * 0x38];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&(program_headers.len() as u16).to_le_bytes());
        for (i, kind) in program_headers.iter().enumerate() {
            let at = 0x40 + i * 0x38;
            elf[at..at + 4].copy_from_slice(&kind.to_le_bytes());
        }
        elf
    }

    #[test]
    fn static_means_no_interpreter() {
        assert!(elf_is_static(&elf_with(&[6, 1, 1])));
        assert!(!elf_is_static(&elf_with(&[6, 3, 1])));
        let mut truncated = elf_with(&[1, 1]);
        truncated.truncate(0x50);
        assert!(!elf_is_static(&truncated));
        assert!(!elf_is_static(b"#!/bin/sh\n"));
    }

    #[test]
    fn this_test_binary_is_dynamic() {
        // cargo test binaries link glibc dynamically unless built with crt-static.
        let linked_statically = cfg!(target_feature = "crt-static");
        assert_eq!(self_is_static(), linked_statically);
    }
}
