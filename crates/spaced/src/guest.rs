//! What pid 1 of a `vm` sandbox does that pid 1 of a process tree on the node's kernel never
//! needs to: after a restore from a memory snapshot, fresh randomness and the host's clock
//! ([`space_proto::Request::Reseed`]).
//!
//! A restored VM resumes with the kernel's RNG state of the instant it was saved: every VM
//! restored from one state would draw the same `/dev/urandom` bytes (measured: identical in
//! two clones), and QEMU has no vmgenid on microvm to tell the guest kernel. Credited bytes
//! alone do not change what the CRNG hands out until its next scheduled reseed, so the
//! request forces one (`RNDRESEEDCRNG`) right after crediting. The guest's clock resumes at
//! the snapshot's time as well: it is set from the node's. A VM restored under a new host
//! name (a warm pod from its template) gets its own `/etc/machine-id` with it.
//!
//! In a `linux` sandbox the request fails with `PermissionDenied` (its root has neither
//! CAP_SYS_ADMIN nor CAP_SYS_TIME in the node's user namespace), which is as it should be:
//! nothing there is restored from a copy of a kernel.

use std::io;
use std::os::fd::AsRawFd;

use space_proto::{ErrorKind, RESEED_MAX_ENTROPY, RESEED_MIN_ENTROPY, Reply};

/// `_IOW('R', 0x03, int[2])` of linux/random.h: add bytes to the input pool and credit them.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the CRNG from the input pool now.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

#[derive(Debug, thiserror::Error)]
pub enum ReseedError {
    #[error("{0} bytes of entropy; a reseed takes {RESEED_MIN_ENTROPY} to {RESEED_MAX_ENTROPY}")]
    EntropyLength(usize),
    #[error("host name {0:?} is not 1 to 64 characters of [A-Za-z0-9.-]")]
    Hostname(String),
    #[error("cannot open /dev/urandom: {0}")]
    Open(#[source] io::Error),
    #[error("RNDADDENTROPY: {0}")]
    AddEntropy(#[source] io::Error),
    #[error("RNDRESEEDCRNG: {0}")]
    ReseedCrng(#[source] io::Error),
    #[error("clock_settime(CLOCK_REALTIME): {0}")]
    SetClock(#[source] io::Error),
    #[error("sethostname: {0}")]
    SetHostname(#[source] io::Error),
    #[error("machine id {0:?} is not 32 lowercase hex digits")]
    MachineId(String),
    #[error("writing {MACHINE_ID}: {0}")]
    WriteMachineId(#[source] io::Error),
}

/// The machine id of the guest's root (machine-id(5)).
const MACHINE_ID: &str = "/etc/machine-id";

impl ReseedError {
    fn kind(&self) -> ErrorKind {
        match self {
            ReseedError::EntropyLength(_) | ReseedError::Hostname(_) | ReseedError::MachineId(_) => {
                ErrorKind::InvalidInput
            }
            ReseedError::Open(e)
            | ReseedError::AddEntropy(e)
            | ReseedError::ReseedCrng(e)
            | ReseedError::SetClock(e)
            | ReseedError::SetHostname(e)
            | ReseedError::WriteMachineId(e) => crate::error::io_kind(e),
        }
    }
}

/// Handles `Request::Reseed`: `Ok`, or an error reply saying which step failed.
pub fn reseed_reply(entropy: &[u8], unix_time_ns: u64, hostname: Option<&str>, machine_id: Option<&str>) -> Reply {
    match reseed(entropy, unix_time_ns, hostname, machine_id) {
        Ok(()) => Reply::Ok,
        Err(e) => {
            tracing::warn!(error = %e, "reseed failed");
            Reply::error(e.kind(), e.to_string())
        }
    }
}

/// Credits `entropy` to the kernel's input pool, reseeds the CRNG from it, sets the clock
/// and, if given, the host name and machine id. Everything is checked before anything changes.
pub fn reseed(
    entropy: &[u8],
    unix_time_ns: u64,
    hostname: Option<&str>,
    machine_id: Option<&str>,
) -> Result<(), ReseedError> {
    if !(RESEED_MIN_ENTROPY..=RESEED_MAX_ENTROPY).contains(&entropy.len()) {
        return Err(ReseedError::EntropyLength(entropy.len()));
    }
    if let Some(name) = hostname
        && !valid_hostname(name)
    {
        return Err(ReseedError::Hostname(name.to_owned()));
    }
    if let Some(id) = machine_id
        && !valid_machine_id(id)
    {
        return Err(ReseedError::MachineId(id.to_owned()));
    }
    let urandom = std::fs::OpenOptions::new().write(true).open("/dev/urandom").map_err(ReseedError::Open)?;
    let info = rand_pool_info(entropy);
    // SAFETY: RNDADDENTROPY reads a `struct rand_pool_info` (two ints, then `buf_size`
    // bytes); `info` holds exactly that and outlives the call.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) } < 0 {
        return Err(ReseedError::AddEntropy(io::Error::last_os_error()));
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG) } < 0 {
        return Err(ReseedError::ReseedCrng(io::Error::last_os_error()));
    }
    let now = libc::timespec {
        tv_sec: (unix_time_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (unix_time_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `now` is a valid timespec that lives across the call.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &now) } < 0 {
        return Err(ReseedError::SetClock(io::Error::last_os_error()));
    }
    if let Some(name) = hostname {
        nix::unistd::sethostname(name).map_err(|e| ReseedError::SetHostname(e.into()))?;
    }
    if let Some(id) = machine_id {
        write_machine_id(id).map_err(ReseedError::WriteMachineId)?;
    }
    Ok(())
}

/// Replaces `/etc/machine-id` whole (written aside, then renamed over it): a reader sees the
/// old id or the new one.
fn write_machine_id(id: &str) -> io::Result<()> {
    let partial = format!("{MACHINE_ID}.new");
    std::fs::write(&partial, format!("{id}\n"))?;
    std::fs::rename(&partial, MACHINE_ID)
}

fn valid_machine_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }` with every
/// byte credited as 8 bits (they come from the host's getrandom). Built in u32s: the kernel
/// reads the header as ints.
fn rand_pool_info(entropy: &[u8]) -> Vec<u32> {
    let mut words = vec![0u32; 2 + entropy.len().div_ceil(4)];
    words[0] = (entropy.len() * 8) as u32;
    words[1] = entropy.len() as u32;
    for (i, byte) in entropy.iter().enumerate() {
        let word = &mut words[2 + i / 4];
        let mut bytes = word.to_ne_bytes();
        bytes[i % 4] = *byte;
        *word = u32::from_ne_bytes(bytes);
    }
    words
}

fn valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_info_layout() {
        let entropy: Vec<u8> = (1..=33).collect();
        let words = rand_pool_info(&entropy);
        assert_eq!(words.len(), 2 + 9);
        assert_eq!((words[0], words[1]), (33 * 8, 33));
        let bytes: Vec<u8> = words[2..].iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(&bytes[..33], &entropy[..]);
        assert!(bytes[33..].iter().all(|b| *b == 0));
    }

    /// Refused before anything in the kernel changes (these never reach an ioctl).
    #[test]
    fn bad_requests_are_refused_up_front() {
        assert!(matches!(reseed(&[0; 31], 0, None, None), Err(ReseedError::EntropyLength(31))));
        assert!(matches!(reseed(&[0; 513], 0, None, None), Err(ReseedError::EntropyLength(513))));
        let err = reseed(&[0; 32], 0, Some("bad name"), None).unwrap_err();
        assert!(matches!(err, ReseedError::Hostname(_)));
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(valid_hostname("box-2.local") && !valid_hostname("-x") && !valid_hostname(&"a".repeat(65)));
        let err = reseed(&[0; 32], 0, None, Some("../../etc/shadow")).unwrap_err();
        assert!(matches!(err, ReseedError::MachineId(_)));
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(valid_machine_id("0123456789abcdef0123456789abcdef"));
        assert!(!valid_machine_id("0123456789ABCDEF0123456789abcdef") && !valid_machine_id(&"a".repeat(33)));
    }
}
