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
use std::sync::atomic::{AtomicU64, Ordering};
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

/// Why a streamed dump's images were not all kept.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The store could not keep an image (CRIU then fails too, on a broken pipe).
    #[error("image {name} could not be kept: {source}")]
    NotKept {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// The dump's ghost files (deleted files held open, copied whole) went over their limit,
    /// and the dump was cut short there.
    #[error("the dump's ghost files took {taken} bytes, over their limit of {limit}")]
    GhostsOverLimit { taken: u64, limit: u64 },
    /// Talking with CRIU failed (it ended, or sent what it does not send).
    #[error("talking with CRIU: {0}")]
    Protocol(#[from] std::io::Error),
}

/// A streamer listening in an images directory for the one CRIU run that connects to it.
/// Dropped without [`Streamer::finish`] (its caller went away), it lets the images still
/// coming be kept, so that CRIU is never stuck on a pipe nobody reads, and goes once they are.
pub(crate) struct Streamer {
    socket: PathBuf,
    thread: Option<JoinHandle<Result<Captured, CaptureError>>>,
}

impl Streamer {
    /// Takes a dump's images into `store`, its ghost files (images named `ghost_prefix…`) up
    /// to `ghost_limit` bytes together; CRIU is run with `--stream` on `dir`.
    pub(crate) fn capture(
        dir: &Path,
        store: Arc<dyn ImageStore>,
        ghost_prefix: &'static str,
        ghost_limit: u64,
    ) -> std::io::Result<Streamer> {
        let socket = dir.join(CAPTURE_SOCKET);
        let listener = UnixListener::bind(&socket)?;
        let ghosts = Arc::new(Ghosts { prefix: ghost_prefix, limit: ghost_limit, taken: AtomicU64::new(0) });
        let thread = std::thread::Builder::new().name("criu-streamer".into()).spawn(move || {
            let (connection, _) = listener.accept()?;
            drop(listener);
            capture(connection, &store, &ghosts)
        })?;
        Ok(Streamer { socket, thread: Some(thread) })
    }

    /// Once CRIU has ended: waits for every image to be kept, and says what went wrong with
    /// any of them. A CRIU that never connected is stood in for by a connection that sends
    /// nothing.
    pub(crate) fn finish(mut self) -> Result<Captured, CaptureError> {
        self.stop_waiting();
        let Some(thread) = self.thread.take() else { return Ok(Vec::new()) };
        thread.join().map_err(|_| panicked())?
    }

    /// Ends the wait for a CRIU that never connected: a connection of our own, closed at once,
    /// reads as a CRIU that wrote nothing. Refused once the listener is gone (CRIU connected),
    /// which leaves that connection to be served to its end.
    fn stop_waiting(&self) {
        drop(UnixStream::connect(&self.socket));
        let _ = std::fs::remove_file(&self.socket);
    }

    /// [`Streamer::finish`], off the async threads.
    pub(crate) async fn finished(self) -> Result<Captured, CaptureError> {
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

/// The bytes a dump's ghost files may take together, and those taken so far.
struct Ghosts {
    prefix: &'static str,
    limit: u64,
    taken: AtomicU64,
}

/// An image's pipe that counts what it gives against [`Ghosts`], and fails past the limit:
/// the image's thread then drops the pipe, and CRIU stops on it.
struct Counted<'a> {
    pipe: &'a mut File,
    ghosts: &'a Ghosts,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.pipe.read(buf)?;
        let taken = self.ghosts.taken.fetch_add(read as u64, Ordering::Relaxed) + read as u64;
        if taken > self.ghosts.limit {
            return Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, "ghost files over their limit"));
        }
        Ok(read)
    }
}

/// A dump: each image CRIU opens is put into `store` on a thread of its own. Every thread is
/// waited for, whatever fails; an image not kept says more than CRIU's end, which it causes.
fn capture(
    mut connection: UnixStream,
    store: &Arc<dyn ImageStore>,
    ghosts: &Arc<Ghosts>,
) -> Result<Captured, CaptureError> {
    let mut images = Vec::new();
    let asked = take_images(&mut connection, store, ghosts, &mut images);
    // All joined before any error is returned: a caller that cleans up after a failed dump
    // must not race a thread still writing its image.
    let joined: Vec<_> =
        images.into_iter().map(|image| image.join().map_err(|_| panicked()).and_then(|kept| kept)).collect();
    let captured = joined.into_iter().collect::<Result<Vec<_>, _>>()?;
    asked?;
    Ok(captured)
}

type ImageThread = JoinHandle<Result<(String, u64), CaptureError>>;

/// Starts a thread for each image CRIU asks to write, until CRIU is done.
fn take_images(
    connection: &mut UnixStream,
    store: &Arc<dyn ImageStore>,
    ghosts: &Arc<Ghosts>,
    images: &mut Vec<ImageThread>,
) -> std::io::Result<()> {
    while let Some(name) = next_request(connection)? {
        let mut pipe = File::from(receive_fd(connection)?);
        // A pipe of CRIU's default 64 KiB wakes the two sides ~16 times per MiB of memory.
        // Best effort: the system's `pipe-max-size` may be lower.
        let _ = nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        let (store, ghosts) = (store.clone(), ghosts.clone());
        images.push(std::thread::Builder::new().name("criu-image-in".into()).spawn(move || {
            let kept = match name.starts_with(ghosts.prefix) {
                true => store.put(&name, &mut Counted { pipe: &mut pipe, ghosts: &ghosts }),
                false => store.put(&name, &mut pipe),
            };
            match kept {
                Ok(len) => Ok((name, len)),
                Err(_) if ghosts.taken.load(Ordering::Relaxed) > ghosts.limit => Err(CaptureError::GhostsOverLimit {
                    taken: ghosts.taken.load(Ordering::Relaxed),
                    limit: ghosts.limit,
                }),
                Err(source) => Err(CaptureError::NotKept { name, source }),
            }
        })?);
    }
    Ok(())
}

fn panicked() -> CaptureError {
    CaptureError::Protocol(std::io::Error::other("an image streamer's thread panicked"))
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
        let streamer = Streamer::capture(dir.path(), store.clone(), "ghost-file-", u64::MAX).unwrap();
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
        let streamer = Streamer::capture(dir.path(), Arc::new(Memory::default()), "ghost-file-", 0).unwrap();
        assert!(streamer.finish().unwrap().is_empty());

        let streamer = Streamer::capture(dir.path(), Arc::new(Memory::default()), "ghost-file-", 0).unwrap();
        let mut criu = Criu::connect(dir.path());
        let body = Request { filename: "../escape.img".into() }.encode_to_vec();
        criu.0.write_all(&[(body.len() as u32).to_le_bytes().as_slice(), &body].concat()).unwrap();
        drop(criu);
        let failed = streamer.finish().unwrap_err();
        assert!(
            matches!(&failed, CaptureError::Protocol(e) if e.kind() == std::io::ErrorKind::InvalidData),
            "{failed}"
        );
    }

    #[test]
    fn ghost_files_over_their_limit_stop_the_dump_there() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Memory::default());
        let streamer = Streamer::capture(dir.path(), store.clone(), "ghost-file-", 1000).unwrap();
        let mut criu = Criu::connect(dir.path());
        criu.open("pages-1.img").write_all(&[1; 5000]).unwrap();
        criu.open("ghost-file-1.img").write_all(&[2; 600]).unwrap();
        // The streamer stops reading whichever passes the limit (each has a thread of its own,
        // so either may) part way, and CRIU would see a broken pipe.
        let _ = criu.open("ghost-file-2.img").write_all(&[3; 600]);
        drop(criu);
        let failed = streamer.finish().unwrap_err();
        assert!(matches!(failed, CaptureError::GhostsOverLimit { taken, limit: 1000 } if taken > 1000), "{failed}");
        let kept = store.0.lock().unwrap();
        let ghosts: Vec<_> = kept.iter().filter(|(name, _)| name.starts_with("ghost-file-")).collect();
        let bytes: usize = ghosts.iter().map(|(_, bytes)| bytes.len()).sum();
        assert!(ghosts.len() <= 1 && bytes <= 1000, "ghosts over the limit were kept: {bytes} bytes");
    }

    /// A store that keeps nothing.
    struct Full;

    impl ImageStore for Full {
        fn put(&self, _: &str, _: &mut dyn Read) -> std::io::Result<u64> {
            Err(std::io::Error::from(std::io::ErrorKind::StorageFull))
        }
    }

    #[test]
    fn an_image_not_kept_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let streamer = Streamer::capture(dir.path(), Arc::new(Full), "ghost-file-", u64::MAX).unwrap();
        let mut criu = Criu::connect(dir.path());
        let _ = criu.open("core-7.img").write_all(b"registers");
        drop(criu);
        let failed = streamer.finish().unwrap_err();
        assert!(
            matches!(&failed, CaptureError::NotKept { name, source } if name == "core-7.img" && source.kind() == std::io::ErrorKind::StorageFull),
            "{failed}"
        );
    }
}
