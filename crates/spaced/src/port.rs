//! The node's channel in a `vm` sandbox: a virtio-serial port (`spaced guest --port NAME`).
//!
//! QEMU exposes the host end of the port as a unix socket; each host connection to that
//! socket is one spaced connection. The guest end is one character device, open once for the
//! VM's whole life, while host connections come and go:
//! - the host being connected is a state of the port, not of the descriptor: `poll(2)` reports
//!   `POLLHUP` while no host is connected, and `read(2)` returns 0 once the data is drained;
//! - tokio never clears the "closed" readiness it derives from `EPOLLHUP`, so each host
//!   connection gets a registration of its own (on a `dup` of the descriptor): one registration
//!   spanning a reconnect would report the port readable and writable for ever;
//! - `POLLHUP` is level-triggered, so waiting for the next host uses a private edge-triggered
//!   epoll instance: the kernel wakes the port's wait queue when the host state changes, which
//!   is the only event while no host is connected.
//!
//! The stream has no marks between host connections, only that flag, so spaced keeps them
//! apart itself: a [`Link`] that has seen a hang-up never writes again (a late frame of the
//! old connection would land in the middle of the next host's handshake), what a host left
//! unread when it hung up is dropped, and a connection begins with the host's first bytes
//! (the node always sends its hello first), so spaced's hello goes to the host that is there.
//! What remains: a host that hangs up and connects again within a few milliseconds may find
//! its handshake unanswered, when the guest sees both changes of the flag at once (measured
//! under TCG: 8 of 400 immediate reconnections, 1 of 400 after 2 ms, none of 600 after
//! 5-20 ms); the node bounds its handshake and connects again.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// Where the kernel lists virtio-serial ports, one directory per port (`vport1p1`).
pub const SYSFS_PORTS: &str = "/sys/class/virtio-ports";
/// Where their device nodes are, under the same names.
pub const DEV: &str = "/dev";

/// How long [`Port::open`] waits for the port: virtio_console adds ports, and names them, from
/// the host's control messages after the module has loaded, i.e. possibly after /init ran.
pub const FIND_TIMEOUT: Duration = Duration::from_secs(10);
const FIND_INTERVAL: Duration = Duration::from_millis(5);

/// How long a wait for the host sleeps at most between checks of the port state. A safety
/// net only: the edge-triggered epoll wakes the wait on every state change.
const WAIT_RECHECK: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("cannot list virtio-serial ports in {0}: {1}")]
    Sysfs(PathBuf, #[source] io::Error),
    #[error("no virtio-serial port named {name:?} appeared within {waited:?}")]
    NotFound { name: String, waited: Duration },
    #[error("cannot open {0}: {1}")]
    Open(PathBuf, #[source] io::Error),
    #[error("cannot watch the port for host connections: {0}")]
    Watch(#[source] io::Error),
}

/// The name of the port directory under `sysfs` whose `name` attribute is `name`, if one
/// is there yet. Directories without a readable name (not named yet) are skipped.
pub fn find_port(sysfs: &Path, name: &str) -> Result<Option<String>, PortError> {
    let entries = match std::fs::read_dir(sysfs) {
        Ok(entries) => entries,
        // No port has been added yet: the class directory appears with the first one.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(PortError::Sysfs(sysfs.to_owned(), e)),
    };
    let mut found: Vec<String> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| PortError::Sysfs(sysfs.to_owned(), e))?;
        let Ok(port_name) = std::fs::read_to_string(entry.path().join("name")) else { continue };
        if port_name.strip_suffix('\n').unwrap_or(&port_name) != name {
            continue;
        }
        // The directory name becomes a path under /dev: only a plain file name will do.
        if let Some(dir) = entry.file_name().to_str().filter(|d| !d.is_empty() && !d.contains('/')) {
            found.push(dir.to_owned());
        }
    }
    // QEMU refuses two ports of one name; should a guest see two, the choice is stable.
    found.sort();
    Ok(found.into_iter().next())
}

/// The open port, for the life of the VM.
pub struct Port {
    fd: OwnedFd,
    path: PathBuf,
    /// Edge-triggered interest in the port, for waiting for the host (see the module docs).
    epoll: Epoll,
    /// [`WAIT_RECHECK`]; shorter in tests, whose stand-in for a port wakes no one on connect.
    recheck: Duration,
}

impl Port {
    /// Waits up to `timeout` for the port named `name` to appear under `sysfs`, then opens its
    /// node under `dev` (read-write, non-blocking, close-on-exec: no child may inherit it).
    pub fn open(sysfs: &Path, dev: &Path, name: &str, timeout: Duration) -> Result<Port, PortError> {
        let start = Instant::now();
        loop {
            if let Some(dir) = find_port(sysfs, name)? {
                let path = dev.join(&dir);
                match open_nonblocking(&path) {
                    Ok(fd) => return Port::watch(fd, path),
                    // The device node follows the sysfs entry.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(PortError::Open(path, e)),
                }
            }
            if start.elapsed() >= timeout {
                return Err(PortError::NotFound { name: name.to_owned(), waited: start.elapsed() });
            }
            std::thread::sleep(FIND_INTERVAL);
        }
    }

    /// Wraps an already open port descriptor (the tests use a pty master, whose slave side
    /// connects and disconnects like a host).
    pub fn from_fd(fd: OwnedFd, path: PathBuf) -> Result<Port, PortError> {
        set_nonblocking(&fd).map_err(|e| PortError::Open(path.clone(), e))?;
        Port::watch(fd, path)
    }

    fn watch(fd: OwnedFd, path: PathBuf) -> Result<Port, PortError> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| PortError::Watch(e.into()))?;
        let interest = EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT | EpollFlags::EPOLLET;
        epoll.add(&fd, EpollEvent::new(interest, 0)).map_err(|e| PortError::Watch(e.into()))?;
        Ok(Port { fd, path, epoll, recheck: WAIT_RECHECK })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a host is connected now.
    pub fn host_connected(&self) -> io::Result<bool> {
        host_connected(&self.fd)
    }

    /// Returns once a host is connected (at once if one is).
    pub async fn wait_connected(&self) -> io::Result<()> {
        // SAFETY: the descriptor is the epoll instance `self` owns; the registration is local
        // to this call, which borrows `self`, so the descriptor stays open and the same for
        // all of its life.
        let watch = unsafe { AsyncFd::register_with_interest(self.epoll.0.as_fd(), Interest::READABLE)? };
        let mut events = [EpollEvent::empty(); 4];
        loop {
            // Consume the pending edges first: every state change after the check below then
            // makes the epoll descriptor readable again, and the guard taken after the check
            // is cleared only if no event came after it was taken.
            while self.epoll.wait(&mut events, EpollTimeout::ZERO)? == events.len() {}
            if self.host_connected()? {
                return Ok(());
            }
            // What the last host sent and no connection read (its goodbye, typically, when
            // the connection ended on a write) must not become the next one's first bytes.
            drop_leftovers(&self.fd);
            if let Ok(guard) = tokio::time::timeout(self.recheck, watch.readable()).await {
                guard?.clear_ready();
            }
        }
    }

    /// A byte stream for one host connection, with a registration of its own.
    pub fn link(&self) -> io::Result<Link> {
        let fd = crate::fdio::async_fd(self.fd.try_clone()?)?;
        Ok(Link { inner: Arc::new(LinkInner { fd, hung_up: AtomicBool::new(false) }) })
    }
}

fn open_nonblocking(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    // std opens with O_CLOEXEC.
    let file = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    Ok(file.into())
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Reads what a host that has hung up left, up to the end of its stream (call it only while
/// no host is connected). Bounded: should a new host be streaming in meanwhile, this must not
/// keep the runtime's one thread.
fn drop_leftovers(fd: &OwnedFd) {
    let mut scratch = [0u8; 4096];
    for _ in 0..256 {
        if !matches!(retry_eintr(|| nix::unistd::read(fd, &mut scratch)), Ok(1..)) {
            return;
        }
    }
}

/// `POLLHUP` is the port's "no host connected"; `POLLNVAL` and `POLLERR` are errors.
fn host_connected(fd: &impl AsFd) -> io::Result<bool> {
    Ok(port_state(fd)? != State::HungUp)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A host is connected and has sent nothing unread.
    Idle,
    /// A host is connected and there is something to read.
    Data,
    /// No host is connected (possibly with bytes of the last one unread).
    HungUp,
}

fn port_state(fd: &impl AsFd) -> io::Result<State> {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    loop {
        match poll(&mut fds, PollTimeout::ZERO) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => break,
        }
    }
    let revents = fds[0].revents().unwrap_or(PollFlags::empty());
    if revents.intersects(PollFlags::POLLNVAL | PollFlags::POLLERR) {
        return Err(io::Error::other(format!("the port reports {revents:?}")));
    }
    Ok(if revents.contains(PollFlags::POLLHUP) {
        State::HungUp
    } else if revents.contains(PollFlags::POLLIN) {
        State::Data
    } else {
        State::Idle
    })
}

/// One host connection over the port. Clones share the stream and its end: the server keeps
/// one to learn how the connection ended, and to drain it.
#[derive(Clone)]
pub struct Link {
    inner: Arc<LinkInner>,
}

struct LinkInner {
    fd: AsyncFd<OwnedFd>,
    /// Set once the host hung up: the stream stays at its end even if a host connects again
    /// (that is the next connection, on a link of its own).
    hung_up: AtomicBool,
}

impl Link {
    /// Whether the host hung up on this connection.
    pub fn hung_up(&self) -> bool {
        self.inner.hung_up.load(Ordering::Acquire)
    }

    /// Waits for the host's first bytes: true once there is something to read, false if the
    /// host hangs up first (whatever it left unread is dropped).
    pub async fn wait_for_data(&self) -> io::Result<bool> {
        loop {
            let mut guard = self.inner.fd.readable().await?;
            // Readiness may be left over from before; poll(2) tells what is there now.
            match port_state(self.inner.fd.get_ref())? {
                State::Data => return Ok(true),
                State::HungUp => {
                    self.inner.hang_up();
                    drop_leftovers(self.inner.fd.get_ref());
                    return Ok(false);
                }
                State::Idle => guard.clear_ready(),
            }
        }
    }

    /// Reads and drops whatever the host sends until it hangs up: after a connection ended
    /// on this side (garbage, a failed handshake), the next one must start on a fresh stream.
    pub async fn discard_until_hangup(&self) -> io::Result<()> {
        let mut scratch = vec![0u8; 4096];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            std::future::poll_fn(|cx| self.inner.poll_read(cx, &mut buf)).await?;
            if buf.filled().is_empty() {
                return Ok(());
            }
        }
    }
}

impl LinkInner {
    fn hang_up(&self) {
        self.hung_up.store(true, Ordering::Release);
    }

    fn poll_read(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.hung_up.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            // A hang-up this registration saw, and a host connected now: that is a new one,
            // and its bytes belong to the next connection. (While no host is connected,
            // what the last one sent before it hung up is still read, up to the end.)
            if guard.ready().is_read_closed() && port_state(self.fd.get_ref())? != State::HungUp {
                self.hang_up();
                return Poll::Ready(Ok(()));
            }
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| retry_eintr(|| nix::unistd::read(fd.get_ref(), unfilled))) {
                Ok(Ok(0)) => {
                    self.hang_up();
                    return Poll::Ready(Ok(()));
                }
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // What a pty master (the tests' stand-in for a port) reports instead of EOF.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => {
                    self.hang_up();
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // Nothing to read after a hang-up: a host connected again in between.
                Err(_would_block) if guard.ready().is_read_closed() => {
                    self.hang_up();
                    return Poll::Ready(Ok(()));
                }
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        if self.hung_up.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            // Once this registration has seen a hang-up, nothing more is written: a write
            // can only block (no host) or, worse, reach the host that connected since, in
            // the middle of its handshake. The runtime records the hang-up even while no
            // task waits on the port (a connection busy elsewhere, e.g. closing streams).
            if guard.ready().is_write_closed() {
                self.hang_up();
                return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
            }
            match guard.try_io(|fd| retry_eintr(|| nix::unistd::write(fd.get_ref(), data))) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }
}

fn retry_eintr(mut f: impl FnMut() -> nix::Result<usize>) -> io::Result<usize> {
    loop {
        match f() {
            Err(Errno::EINTR) => continue,
            other => return other.map_err(io::Error::from),
        }
    }
}

impl AsyncRead for Link {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_read(cx, buf)
    }
}

impl AsyncWrite for Link {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.inner.poll_write(cx, data)
    }

    /// Nothing is buffered here: every write is a `write(2)` on the port.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// The port cannot be half-closed; the connection ends when the host hangs up.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use space_proto::AgentClient;
    use tokio::io::AsyncWriteExt;

    use super::*;

    fn named_port(sysfs: &Path, dir: &str, name: Option<&str>) {
        std::fs::create_dir_all(sysfs.join(dir)).unwrap();
        if let Some(name) = name {
            std::fs::write(sysfs.join(dir).join("name"), format!("{name}\n")).unwrap();
        }
    }

    #[test]
    fn finds_the_port_by_its_name() {
        let tmp = tempfile::tempdir().unwrap();
        let sysfs = tmp.path().join("virtio-ports");
        assert_eq!(find_port(&sysfs, "agent").unwrap(), None, "no class directory yet");
        named_port(&sysfs, "vport0p0", Some("org.qemu.console"));
        named_port(&sysfs, "vport1p1", None);
        named_port(&sysfs, "vport1p2", Some("agent2"));
        assert_eq!(find_port(&sysfs, "agent").unwrap(), None, "unnamed and other names do not match");
        named_port(&sysfs, "vport1p3", Some("agent"));
        assert_eq!(find_port(&sysfs, "agent").unwrap().as_deref(), Some("vport1p3"));
        // A name arriving later (the host's PORT_NAME message) is found on the next look.
        std::fs::write(sysfs.join("vport1p1/name"), "agent\n").unwrap();
        assert_eq!(find_port(&sysfs, "agent").unwrap().as_deref(), Some("vport1p1"));
    }

    #[test]
    fn opens_the_node_once_it_appears_and_gives_up_in_time() {
        let tmp = tempfile::tempdir().unwrap();
        let (sysfs, dev) = (tmp.path().join("sys"), tmp.path().join("dev"));
        std::fs::create_dir_all(&dev).unwrap();
        let missing = Port::open(&sysfs, &dev, "agent", Duration::from_millis(30));
        assert!(matches!(missing, Err(PortError::NotFound { .. })), "{:?}", missing.err());

        named_port(&sysfs, "vport2p1", Some("agent"));
        let node = dev.join("vport2p1");
        // The sysfs entry comes first and the device node a little later.
        let later = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            nix::unistd::mkfifo(&node, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        });
        let port = Port::open(&sysfs, &dev, "agent", Duration::from_secs(10)).unwrap();
        later.join().unwrap();
        assert_eq!(port.path(), dev.join("vport2p1"));
        let flags = nix::fcntl::fcntl(&port.fd, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert_ne!(flags & libc::O_NONBLOCK, 0);
        let fd_flags = nix::fcntl::fcntl(&port.fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(fd_flags & libc::FD_CLOEXEC, 0, "children must not inherit the port");
    }

    /// The pty stands in for the port: its slave side is the host. Closing every slave
    /// descriptor makes the master report POLLHUP, reopening it clears that, as a host
    /// connecting to QEMU's socket does for the port.
    struct FakeHost {
        slave_path: PathBuf,
    }

    impl FakeHost {
        fn new() -> (FakeHost, Port) {
            let pty = nix::pty::openpty(None, None).unwrap();
            let slave_path = std::fs::read_link(format!("/proc/self/fd/{}", pty.slave.as_raw_fd())).unwrap();
            // Raw (byte-transparent, no echo) for good, before the agent can see a host: the
            // settings stay with the pair while the slave side is closed and opened again.
            let mut termios = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
            nix::sys::termios::cfmakeraw(&mut termios);
            nix::sys::termios::tcsetattr(&pty.slave, nix::sys::termios::SetArg::TCSANOW, &termios).unwrap();
            let mut port = Port::from_fd(pty.master, "pty".into()).unwrap();
            // A pty master is not woken when its slave is opened again: recheck often.
            port.recheck = Duration::from_millis(5);
            // Dropping the only slave descriptor: no host is connected at first.
            drop(pty.slave);
            (FakeHost { slave_path }, port)
        }

        /// A host connection: a slave descriptor.
        fn connect(&self) -> Link {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
                .open(&self.slave_path)
                .unwrap();
            // What the agent wrote for an earlier host and no one read stays queued in the
            // pty; a new socket connection to QEMU starts empty. The agent (a task on this
            // same thread) cannot write in between.
            nix::sys::termios::tcflush(&file, nix::sys::termios::FlushArg::TCIFLUSH).unwrap();
            let fd = crate::fdio::async_fd(file.into()).unwrap();
            Link { inner: Arc::new(LinkInner { fd, hung_up: AtomicBool::new(false) }) }
        }

        /// What the node must do: a connection that fails to answer (the agent had not seen
        /// the previous hang-up yet) is closed and made again.
        async fn client(&self) -> (AgentClient, Link) {
            for _ in 0..20 {
                let link = self.connect();
                let attempt = async {
                    let client = AgentClient::connect(link.clone()).await.ok()?;
                    client.health().await.ok()?;
                    Some(client)
                };
                match tokio::time::timeout(Duration::from_secs(2), attempt).await {
                    Ok(Some(client)) => return (client, link),
                    _ => hang_up(None, link).await,
                }
            }
            panic!("the agent does not answer");
        }
    }

    /// Closes a host connection for good. All slave descriptors feed the one master, so the
    /// next connection may open only once the client's driver task has let go of its clone.
    async fn hang_up(client: Option<AgentClient>, link: Link) {
        if let Some(client) = client {
            client.close();
        }
        while Arc::strong_count(&link.inner) > 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(link);
        // Give the agent the moment to see the hang-up that QEMU's socket would give it
        // too; were it missed, the next `client()` retries.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn serves_one_host_connection_after_another() {
        let (host, port) = FakeHost::new();
        let server = tokio::spawn(crate::server::run_port(port, crate::Mode::Init));
        let guard = async {
            // A first connection, then the host goes away and comes back.
            let (client, link) = host.client().await;
            let first = client.health().await.unwrap().uptime_ms;
            hang_up(Some(client), link).await;
            let (client, link) = host.client().await;
            let health = client.health().await.unwrap();
            assert!(health.uptime_ms >= first, "the same agent serves the second connection");
            hang_up(Some(client), link).await;

            // Garbage instead of a hello, then garbage after one: each ends that connection
            // only, and the agent serves the next host.
            let mut garbage = host.connect();
            garbage.write_all(&[0xff; 64]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            garbage.write_all(&[0xff; 64]).await.unwrap();
            hang_up(None, garbage).await;
            let mut after_hello = host.connect();
            space_proto::handshake(&mut after_hello, "fake-node").await.unwrap();
            after_hello.write_all(b"\x07 not a yamux frame \x00\x00\x00\x00\xff\xff\xff\xff").await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            hang_up(None, after_hello).await;
            let (client, _link) = host.client().await;
            client.health().await.unwrap();
        };
        tokio::time::timeout(Duration::from_secs(60), guard).await.expect("test timed out");
        assert!(!server.is_finished(), "the agent keeps running");
        server.abort();
    }

    #[tokio::test]
    async fn a_link_ends_for_good_at_the_hang_up() {
        let (host, port) = FakeHost::new();
        let host_end = host.connect();
        assert!(port.host_connected().unwrap());
        port.wait_connected().await.unwrap();
        let mut link = port.link().unwrap();
        drop(host_end);
        let mut buf = [0u8; 16];
        assert_eq!(tokio::io::AsyncReadExt::read(&mut link, &mut buf).await.unwrap(), 0);
        assert!(link.hung_up() && !port.host_connected().unwrap());
        // A new host does not revive the old link: its bytes are for the next one.
        let mut again = host.connect();
        again.write_all(b"next").await.unwrap();
        assert_eq!(tokio::io::AsyncReadExt::read(&mut link, &mut buf).await.unwrap(), 0);
        let write = link.write_all(b"late").await.unwrap_err();
        assert_eq!(write.kind(), io::ErrorKind::BrokenPipe);
        port.wait_connected().await.unwrap();
        let mut next = port.link().unwrap();
        let n = tokio::io::AsyncReadExt::read(&mut next, &mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"next");
    }
}
