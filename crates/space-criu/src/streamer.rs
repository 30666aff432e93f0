//! CRIU's image streamer for dumps (`criu dump --stream`, CRIU's `img-streamer.c`): instead
//! of writing its images into the images directory, CRIU hands each one to us through a pipe,
//! so a caller's [`ImageStore`] can keep them where and how it wants (sealed, for one) without
//! their ever being a file in clear. (Restores are not streamed: CRIU's RPC, which restores
//! use, refuses to stream.)
//!
//! The protocol: CRIU connects to `streamer-capture.sock` in its images directory. For every
//! image it writes it sends the image's name (a little-endian `u32` length and an
//! `img_streamer_request_entry`), then passes the read end of a pipe (`SCM_RIGHTS`, with one
//! byte of data) and writes the image into it to the end. Several images are open at once (a
//! task's page map and its pages are written side by side), so each is kept on a thread of its
//! own.

use std::fs::File;
use std::io::{IoSliceMut, Read};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use prost::Message;

/// Where a streamed dump's images go. Names are plain file names (`pages-1.img`), checked
/// before they are handed over.
pub trait ImageStore: Send + Sync {
    /// Keeps image `name`, read from `from` to its end; the image's length.
    fn put(&self, name: &str, from: &mut dyn Read) -> std::io::Result<u64>;
}

const CAPTURE_SOCKET: &str = "streamer-capture.sock";

/// `img_streamer_request_entry`.
#[derive(Clone, PartialEq, prost::Message)]
struct Request {
    #[prost(string, required, tag = "1")]
    filename: String,
}

/// The room asked for in each image's pipe (Linux's default most a user may ask for).
const PIPE_SIZE: nix::libc::c_int = 1 << 20;

/// What a dump wrote: each image's name and length.
pub(crate) type Captured = Vec<(String, u64)>;

/// A streamer listening in an images directory for the one CRIU run that connects to it.
/// Dropped without [`Streamer::finish`] (its caller went away), it lets the images still
/// coming be kept, so that CRIU is never stuck on a pipe nobody reads, and goes once they are.
pub(crate) struct Streamer {
    socket: PathBuf,
    thread: Option<JoinHandle<std::io::Result<Captured>>>,
}

impl Streamer {
    /// Takes a dump's images into `store`; CRIU is run with `--stream` on `dir`.
    pub(crate) fn capture(dir: &Path, store: Arc<dyn ImageStore>) -> std::io::Result<Streamer> {
        let socket = dir.join(CAPTURE_SOCKET);
        let listener = UnixListener::bind(&socket)?;
        let thread = std::thread::Builder::new().name("criu-streamer".into()).spawn(move || {
            let (connection, _) = listener.accept()?;
            drop(listener);
            capture(connection, store)
        })?;
        Ok(Streamer { socket, thread: Some(thread) })
    }

    /// Once CRIU has ended: waits for every image to be kept, and says what went wrong with
    /// any of them. A CRIU that never connected is stood in for by a connection
    /// that sends nothing.
    pub(crate) fn finish(mut self) -> std::io::Result<Captured> {
        self.stop_waiting();
        let Some(thread) = self.thread.take() else { return Ok(Vec::new()) };
        thread.join().map_err(|_| std::io::Error::other("the image streamer panicked"))?
    }

    /// Ends the wait for a CRIU that never connected: a connection of our own, closed at once,
    /// reads as a CRIU that wrote nothing. Refused once the listener is gone (CRIU connected),
    /// which leaves that connection to be served to its end.
    fn stop_waiting(&self) {
        drop(UnixStream::connect(&self.socket));
        let _ = std::fs::remove_file(&self.socket);
    }

    /// [`Streamer::finish`], off the async threads.
    pub(crate) async fn finished(self) -> std::io::Result<Captured> {
        tokio::task::spawn_blocking(move || self.finish()).await.map_err(std::io::Error::other)?
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_waiting();
        }
    }
}

pub(crate) fn streamer_err(source: std::io::Error) -> crate::CriuError {
    crate::CriuError::Streamer { source }
}

/// A dump: each image CRIU opens is put into `store` on a thread of its own.
fn capture(mut connection: UnixStream, store: Arc<dyn ImageStore>) -> std::io::Result<Captured> {
    let mut images = Vec::new();
    while let Some(name) = next_request(&mut connection)? {
        let mut pipe = File::from(receive_fd(&connection)?);
        // A pipe of CRIU's default 64 KiB wakes the two sides ~16 times per MiB of memory.
        // Best effort: the system's `pipe-max-size` may be lower.
        let _ = nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        let store = store.clone();
        images.push(std::thread::Builder::new().name("criu-image-in".into()).spawn(move || {
            let len = store.put(&name, &mut pipe).map_err(|e| in_image(&name, e))?;
            Ok((name, len))
        })?);
    }
    images.into_iter().map(|thread| thread.join().map_err(|_| panicked())?).collect()
}

fn panicked() -> std::io::Error {
    std::io::Error::other("an image's thread panicked")
}

fn in_image(name: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("image {name}: {e}"))
}

/// The next image CRIU asks for; `None` once CRIU has closed its end.
fn next_request(connection: &mut UnixStream) -> std::io::Result<Option<String>> {
    let mut len = [0u8; 4];
    match connection.read_exact(&mut len) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_REQUEST {
        return Err(bad(format!("a request of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    connection.read_exact(&mut body)?;
    let name = Request::decode(body.as_slice()).map_err(|e| bad(e.to_string()))?.filename;
    if !plain_name(&name) {
        return Err(bad(format!("an image named {name:?}")));
    }
    Ok(Some(name))
}

/// More than any image name needs (a file name is at most 255 bytes).
const MAX_REQUEST: usize = 512;

/// A name that stays in the directory it is joined to.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && name != "." && name != ".." && !name.contains(['/', '\0'])
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("CRIU's image streamer request: {what}"))
}

/// The pipe end CRIU passes with one byte of data.
fn receive_fd(connection: &UnixStream) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let message = recvmsg::<()>(connection.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for control in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = control {
            // SAFETY: the kernel just installed these descriptors in this process; nothing
            // else owns them.
            fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    match <[OwnedFd; 1]>::try_from(fds) {
        Ok([fd]) if message.bytes == 1 => Ok(fd),
        _ => Err(bad("an image's pipe was not passed".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::Write;
    use std::sync::Mutex;

    #[test]
    fn requests_are_decoded_as_criu_encodes_them() {
        let encoded = Request { filename: "pages-1.img".into() }.encode_to_vec();
        assert_eq!(encoded[..2], [0x0a, 11], "field 1, a string of 11 bytes");
    }

    #[test]
    fn names_that_leave_the_directory_are_refused() {
        for name in ["pages-1.img", "ghost-file-1a.img", "stats-dump"] {
            assert!(plain_name(name), "{name}");
        }
        for name in ["", ".", "..", "../x", "a/b", "a\0b"] {
            assert!(!plain_name(name), "{name:?}");
        }
    }

    /// Images in memory.
    #[derive(Default)]
    struct Memory(Mutex<HashMap<String, Vec<u8>>>);

    impl ImageStore for Memory {
        fn put(&self, name: &str, from: &mut dyn Read) -> std::io::Result<u64> {
            let mut bytes = Vec::new();
            from.read_to_end(&mut bytes)?;
            let len = bytes.len() as u64;
            self.0.lock().unwrap().insert(name.to_owned(), bytes);
            Ok(len)
        }
    }

    /// CRIU's side of the protocol, as img-streamer.c speaks it.
    struct Criu(UnixStream);

    impl Criu {
        fn connect(dir: &Path) -> Criu {
            Criu(UnixStream::connect(dir.join(CAPTURE_SOCKET)).unwrap())
        }

        /// Asks to write `name`; the pipe to write it into.
        fn open(&mut self, name: &str) -> File {
            use std::os::fd::AsRawFd;
            let body = Request { filename: name.into() }.encode_to_vec();
            self.0.write_all(&[(body.len() as u32).to_le_bytes().as_slice(), &body].concat()).unwrap();
            let (read, write) = nix::unistd::pipe().unwrap();
            let fds = [read.as_raw_fd()];
            let iov = [std::io::IoSlice::new(&[0])];
            let control = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
            nix::sys::socket::sendmsg::<()>(self.0.as_raw_fd(), &iov, &control, MsgFlags::empty(), None).unwrap();
            File::from(write)
        }
    }

    #[test]
    fn a_dump_is_kept_with_images_written_side_by_side() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Memory::default());
        let streamer = Streamer::capture(dir.path(), store.clone()).unwrap();
        let mut criu = Criu::connect(dir.path());
        let mut pagemap = criu.open("pagemap-1.img");
        let mut pages = criu.open("pages-1.img");
        pagemap.write_all(b"map ").unwrap();
        // More than a pipe holds: the pages are read while the page map is still open.
        pages.write_all(&vec![7u8; 300_000]).unwrap();
        pagemap.write_all(b"more").unwrap();
        drop((pagemap, pages, criu));
        let mut captured = streamer.finish().unwrap();
        captured.sort();
        assert_eq!(captured, [("pagemap-1.img".to_owned(), 8), ("pages-1.img".to_owned(), 300_000)]);
        let kept = store.0.lock().unwrap();
        assert_eq!((kept["pagemap-1.img"].as_slice(), kept["pages-1.img"].len()), (b"map more".as_slice(), 300_000));
        assert!(!dir.path().join(CAPTURE_SOCKET).exists());
    }

    #[test]
    fn a_criu_that_never_connects_ends_the_streamer_and_a_bad_name_fails_it() {
        let dir = tempfile::tempdir().unwrap();
        let streamer = Streamer::capture(dir.path(), Arc::new(Memory::default())).unwrap();
        assert!(streamer.finish().unwrap().is_empty());

        let streamer = Streamer::capture(dir.path(), Arc::new(Memory::default())).unwrap();
        let mut criu = Criu::connect(dir.path());
        let body = Request { filename: "../escape.img".into() }.encode_to_vec();
        criu.0.write_all(&[(body.len() as u32).to_le_bytes().as_slice(), &body].concat()).unwrap();
        drop(criu);
        let failed = streamer.finish().unwrap_err();
        assert_eq!(failed.kind(), std::io::ErrorKind::InvalidData, "{failed}");
    }
}
