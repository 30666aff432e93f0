//! Thin wrappers over the raw syscalls the init needs that `nix` does not cover, and the
//! error-context helper every step uses ("mount /proc: EPERM (Operation not permitted)").

use std::ffi::CString;
use std::fmt::Display;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

use crate::InitError;

/// Turns an errno into an [`InitError`] naming the failed step.
pub(crate) fn ctx<D: Display>(what: D) -> impl FnOnce(Errno) -> InitError {
    move |errno| InitError(format!("{what}: {errno:?} ({})", errno.desc()))
}

/// Same for `std::io::Error`.
pub(crate) fn io_ctx<D: Display>(what: D) -> impl FnOnce(std::io::Error) -> InitError {
    move |e| match e.raw_os_error() {
        Some(code) => ctx(what)(Errno::from_raw(code)),
        None => InitError(format!("{what}: {e}")),
    }
}

/// `close_range(first, ~0, 0)`: closes every fd from `first` up.
pub(crate) fn close_from(first: u32) -> Result<(), InitError> {
    // SAFETY: close_range only closes descriptors; this process is single-threaded and holds no
    // owned Rust object on fds >= first (the caller keeps its fds below `first`).
    let rc = unsafe { libc::close_range(first, u32::MAX, 0) };
    Errno::result(rc).map(drop).map_err(ctx(format!("close_range({first}..)")))
}

/// Sets or clears FD_CLOEXEC.
pub(crate) fn set_cloexec(fd: RawFd, on: bool) -> Result<(), InitError> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    // SAFETY: the fd is only borrowed for the duration of the fcntl calls and is open (callers
    // pass the fixed sync/listener fds they validated).
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut flags =
        FdFlag::from_bits_truncate(fcntl(borrowed, FcntlArg::F_GETFD).map_err(ctx(format!("fcntl({fd})")))?);
    flags.set(FdFlag::FD_CLOEXEC, on);
    fcntl(borrowed, FcntlArg::F_SETFD(flags)).map(drop).map_err(ctx(format!("fcntl({fd})")))
}

/// Whether `fd` is a listening socket.
pub(crate) fn is_listening_socket(fd: RawFd) -> bool {
    let mut val: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: val and len are valid for writes of the sizes passed; an invalid fd only yields
    // an error return.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN, (&mut val as *mut libc::c_int).cast(), &mut len)
    };
    rc == 0 && val == 1
}

/// Whether `fd` is an open socket (listening or not).
pub(crate) fn is_socket(fd: RawFd) -> bool {
    nix::sys::stat::fstat(
        // SAFETY: only borrowed for the fstat call; fstat on a closed fd returns EBADF.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
    )
    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFSOCK)
}

/// Takes ownership of an inherited fd.
///
/// # Safety
/// `fd` must be open and not owned by anything else in this process.
pub(crate) unsafe fn adopt(fd: RawFd) -> OwnedFd {
    // SAFETY: guaranteed by the caller.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// open(O_WRONLY) + one write + close, without allocating.
pub(crate) fn write_file_raw(path: &std::ffi::CStr, data: &[u8]) -> std::io::Result<()> {
    // SAFETY: path is NUL-terminated; the returned fd is closed below on every path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: data is valid for data.len() bytes; fd is the one just opened.
    let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    let result = if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
    // SAFETY: fd is open and owned here.
    unsafe { libc::close(fd) };
    result
}

/// `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attaches the detached mount
/// `fd` at `target`.
pub fn attach_mount(fd: RawFd, target: &std::path::Path) -> Result<(), Errno> {
    use std::os::unix::ffi::OsStrExt;
    let target = CString::new(target.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: both strings are NUL-terminated and outlive the call; move_mount reads them only.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    Errno::result(rc).map(drop)
}

/// Sets IFF_UP on a network interface of the current network namespace.
pub(crate) fn link_up(name: &str) -> Result<(), InitError> {
    let what = format!("bring up {name}");
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(ctx(&what))?;
    let mut req = ifreq(name).ok_or_else(|| InitError(format!("{what}: bad interface name")))?;
    // SAFETY: req is a properly initialised ifreq with a NUL-terminated name; SIOCGIFFLAGS
    // writes only ifr_flags inside it.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    Errno::result(rc).map_err(ctx(format!("{what}: SIOCGIFFLAGS")))?;
    // SAFETY: ifr_ifru is a union; SIOCGIFFLAGS just filled its ifru_flags member.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads the request.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    Errno::result(rc).map(drop).map_err(ctx(format!("{what}: SIOCSIFFLAGS")))
}

fn ifreq(name: &str) -> Option<libc::ifreq> {
    let cname = CString::new(name).ok()?;
    let bytes = cname.as_bytes_with_nul();
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if bytes.len() > req.ifr_name.len() {
        return None;
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Some(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_context_names_step_and_errno() {
        let e = ctx("mount /proc")(Errno::EPERM);
        assert_eq!(e.0, "mount /proc: EPERM (Operation not permitted)");
        let e = io_ctx("open x")(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert!(e.0.starts_with("open x: ENOENT"), "{}", e.0);
    }

    #[test]
    fn ifreq_rejects_long_names() {
        assert!(ifreq("lo").is_some());
        assert!(ifreq("a-very-long-interface-name").is_none());
    }
}
