//! The `spaced` that host root executes, as a sealed in-memory copy.
//!
//! Every sandbox's pid 1 re-executes `spaced` from a read-only bind of the pool's copy
//! (see `space_sandbox_init`'s reexec). If host root executed that same file to start the
//! next sandbox, a sandbox able to change it, through any slip of the bind or the file's
//! permissions, would run code as host root (the class of runc's CVE-2019-5736). So the node
//! reads the binary once into a memfd, seals it against every change, and executes that:
//! no path in any sandbox leads to it. As runc does.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Seals that make the memfd's content immutable for ever (`F_SEAL_SEAL` last: no one can
/// lift them).
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;

/// A binary held in a sealed memfd.
#[derive(Debug)]
pub(crate) struct SealedBinary {
    fd: OwnedFd,
}

impl SealedBinary {
    /// Copies `path` into a new memfd and seals it.
    pub(crate) fn load(path: &Path) -> io::Result<SealedBinary> {
        let content = std::fs::read(path)?;
        let name = CString::new("spaced").expect("no NUL");
        // SAFETY: memfd_create takes a NUL-terminated name and flags; returns a new fd or -1.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone()?).write_all(&content)?;
        // SAFETY: F_ADD_SEALS on our own memfd with a constant seal mask.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // Above the descriptors a spawn sets up (stdio, 3 and 4), which would replace it
        // before its path is executed.
        // SAFETY: F_DUPFD_CLOEXEC on our own fd returns a new fd or -1.
        let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
        if high < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd; nothing else owns it.
        Ok(SealedBinary { fd: unsafe { OwnedFd::from_raw_fd(high) } })
    }

    /// The path that executes it from this process (the fd is close-on-exec, which the
    /// kernel allows for an ELF binary: it is opened before the descriptors are closed).
    pub(crate) fn exec_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    #[cfg(test)]
    fn seals(&self) -> libc::c_int {
        // SAFETY: F_GET_SEALS on our own fd.
        unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_GET_SEALS) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_is_sealed_executable_and_not_a_path_on_disk() {
        let sealed = SealedBinary::load(Path::new("/bin/true")).unwrap();
        assert!(sealed.fd.as_raw_fd() >= 10, "a spawn's dup2 onto 3 or 4 would replace it");
        assert_eq!(sealed.seals() & SEALS, SEALS);
        let opened = std::fs::OpenOptions::new().write(true).open(sealed.exec_path());
        let err = opened.and_then(|mut file| file.write_all(b"#!")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM), "a sealed memfd refuses writes: {err}");
        let status = std::process::Command::new(sealed.exec_path()).status().unwrap();
        assert!(status.success());
        let target = std::fs::read_link(sealed.exec_path()).unwrap();
        assert!(target.to_string_lossy().starts_with("/memfd:spaced"), "{}", target.display());
    }
}
