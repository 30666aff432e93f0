//! Pseudo-terminals for `tty` execs.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use space_proto::PtySize;

use crate::fdio::set_cloexec;

/// Both ends of a fresh terminal; the slave becomes the child's stdin/stdout/stderr.
pub struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

fn winsize(size: PtySize) -> libc::winsize {
    libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 }
}

/// Opens a terminal of `size`. Both descriptors are close-on-exec (`openpty` does not set
/// it): the child gets the slave through dup2 onto 0/1/2, which clears the flag there.
pub fn open(size: PtySize) -> io::Result<Pty> {
    let ws = winsize(size);
    let pair = nix::pty::openpty(Some(&ws), None)?;
    set_cloexec(&pair.master)?;
    set_cloexec(&pair.slave)?;
    Ok(Pty { master: pair.master, slave: pair.slave })
}

/// Changes the terminal size; the kernel sends SIGWINCH to the foreground process group.
pub fn resize(master: &impl AsRawFd, size: PtySize) -> io::Result<()> {
    let ws = winsize(size);
    // SAFETY: TIOCSWINSZ reads one `winsize` through the pointer, which points to a live
    // local for the duration of the call; the descriptor is owned by the caller.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Makes the terminal on stdin the controlling terminal of the calling session leader.
/// Runs in the child between fork and exec: a single async-signal-safe ioctl.
pub fn take_controlling_terminal() -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal from another session);
    // fd 0 is the pty slave that std installed as stdin before pre_exec hooks run.
    let rc = unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_and_resize() {
        let pty = open(PtySize { rows: 24, cols: 80 }).unwrap();
        resize(&pty.master, PtySize { rows: 40, cols: 120 }).unwrap();
        let mut ws = winsize(PtySize { rows: 0, cols: 0 });
        // SAFETY: TIOCGWINSZ writes one `winsize` into the live local.
        let rc = unsafe { libc::ioctl(pty.slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
        assert_eq!(rc, 0);
        assert_eq!((ws.ws_row, ws.ws_col), (40, 120));
    }
}
