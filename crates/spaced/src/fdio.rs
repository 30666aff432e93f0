//! Non-blocking reads and writes on raw descriptors (pipes and pty masters).
//!
//! One code path for both: a pty master reports the end of output with EIO instead of
//! EOF, and after a process exits its pipes are drained without waiting (a background
//! child may keep them open forever), which needs direct `read(2)` calls rather than
//! tokio's readiness-cached `try_read`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use bytes::Bytes;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use tokio::io::unix::AsyncFd;

/// Largest chunk read at once, and the size of data frames sent to the node.
pub const CHUNK: usize = space_proto::codec::DATA_CHUNK;

/// Marks `fd` non-blocking and registers it with the runtime.
pub fn async_fd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    let flags = OFlag::from_bits_retain(fcntl(&fd, FcntlArg::F_GETFL)?);
    fcntl(&fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    // SAFETY: `OwnedFd` owns a valid open descriptor; the `AsyncFd` owns the `OwnedFd`,
    // which never closes or replaces it while registered.
    Ok(unsafe { AsyncFd::register(fd)? })
}

/// Sets close-on-exec, so descriptors never leak into other children.
pub fn set_cloexec(fd: &impl AsFd) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(())
}

/// A readable descriptor with its read buffer.
pub struct Reader {
    fd: AsyncFdRef,
    buf: Vec<u8>,
}

/// Readers own their pipe, but share a pty master with the stdin writer.
enum AsyncFdRef {
    Owned(AsyncFd<OwnedFd>),
    Shared(std::sync::Arc<AsyncFd<OwnedFd>>),
}

impl AsyncFdRef {
    fn get(&self) -> &AsyncFd<OwnedFd> {
        match self {
            AsyncFdRef::Owned(fd) => fd,
            AsyncFdRef::Shared(fd) => fd,
        }
    }
}

impl Reader {
    pub fn new(fd: AsyncFd<OwnedFd>) -> Self {
        Reader { fd: AsyncFdRef::Owned(fd), buf: vec![0; CHUNK] }
    }

    pub fn shared(fd: std::sync::Arc<AsyncFd<OwnedFd>>) -> Self {
        Reader { fd: AsyncFdRef::Shared(fd), buf: vec![0; CHUNK] }
    }

    /// The next chunk; `None` at the end of the stream.
    pub async fn read(&mut self) -> io::Result<Option<Bytes>> {
        loop {
            let mut guard = self.fd.get().readable().await?;
            let buf = &mut self.buf;
            match guard.try_io(|fd| read_once(fd.get_ref(), buf)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Whatever is buffered right now, without waiting; at most `limit` chunks so a
    /// writer that never stops cannot keep us here.
    pub fn drain_now(&mut self, limit: usize) -> Vec<Bytes> {
        let mut chunks = Vec::new();
        while chunks.len() < limit {
            match read_once(self.fd.get().get_ref(), &mut self.buf) {
                Ok(Some(chunk)) => chunks.push(chunk),
                Ok(None) | Err(_) => break,
            }
        }
        chunks
    }
}

/// One `read(2)`. Copies out of the reusable buffer so that small reads do not pin a
/// whole chunk of memory (output is kept in ring buffers).
fn read_once(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<Bytes>> {
    loop {
        return match nix::unistd::read(fd, buf) {
            Ok(0) => Ok(None),
            Ok(n) => Ok(Some(Bytes::copy_from_slice(&buf[..n]))),
            // A pty master whose slave side is closed by everyone.
            Err(Errno::EIO) => Ok(None),
            Err(Errno::EINTR) => continue,
            Err(e) => Err(e.into()),
        };
    }
}

/// Writes all of `data`, waiting for the descriptor to become writable as needed.
pub async fn write_all(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let mut guard = fd.writable().await?;
        let result = guard.try_io(|fd| {
            loop {
                match nix::unistd::write(fd.get_ref(), data) {
                    Err(Errno::EINTR) => continue,
                    other => return other.map_err(io::Error::from),
                }
            }
        });
        match result {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_drains_and_sees_eof() {
        let (rx, tx) = nix::unistd::pipe().unwrap();
        let mut reader = Reader::new(async_fd(rx).unwrap());
        let writer = async_fd(tx).unwrap();
        write_all(&writer, b"hello").await.unwrap();
        assert_eq!(reader.read().await.unwrap().as_deref(), Some(&b"hello"[..]));
        assert!(reader.drain_now(4).is_empty());
        write_all(&writer, b"more").await.unwrap();
        assert_eq!(reader.drain_now(4), vec![Bytes::from_static(b"more")]);
        drop(writer);
        assert_eq!(reader.read().await.unwrap(), None);
    }
}
