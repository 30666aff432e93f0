//! The gateway's sockets inside a sandbox's network namespace.
//!
//! A sandbox's namespace has only `lo`. Here every IPv4 address is made local to it
//! (`local 0.0.0.0/0 dev lo`, "AnyIP"), and the gateway's listeners are bound to the
//! wildcard address from a thread that has entered the namespace: a socket belongs to the
//! namespace it was created in, whichever thread later uses it. So a connection to any
//! address, port 80/443/3128, and a datagram to any address, port 53, reach the gateway,
//! which learns the original destination from the accepted socket's local address.
//! Nothing routes out of the namespace: what the gateway does not serve is refused locally.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};

use nix::sched::{CloneFlags, setns};

use crate::{GatewayError, HTTP_PORT, HTTPS_PORT, PROXY_PORT};

/// Pending connections per listener; a sandbox may open many at once (package installs).
const BACKLOG: i32 = 1024;

pub(crate) struct SandboxSockets {
    pub(crate) proxy: TcpListener,
    pub(crate) http: TcpListener,
    pub(crate) https: TcpListener,
    pub(crate) dns: UdpSocket,
}

/// Makes every address local in the network namespace `netns` and opens the gateway's
/// sockets there. Refuses the node's own namespace: replacing its `local` table would route
/// every address of the host to its loopback. Blocking: call from a blocking thread.
pub(crate) fn open_sandbox_sockets(netns: OwnedFd) -> Result<SandboxSockets, GatewayError> {
    if is_own_namespace(&netns)? {
        return Err(GatewayError::Netns("refusing to attach to the node's own network namespace".into()));
    }
    // A thread of its own: it enters the namespace and ends, leaving the caller's untouched.
    std::thread::Builder::new()
        .name("gateway-netns".into())
        .spawn(move || {
            setns(netns.as_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(|e| GatewayError::Netns(format!("enter the sandbox's network namespace: {e}")))?;
            space_netns::route_every_address_to_loopback().map_err(|e| GatewayError::Netns(e.to_string()))?;
            Ok(SandboxSockets {
                proxy: listen(PROXY_PORT)?,
                http: listen(HTTP_PORT)?,
                https: listen(HTTPS_PORT)?,
                dns: bind_udp(53)?,
            })
        })
        .map_err(|e| GatewayError::Netns(format!("spawn thread: {e}")))?
        .join()
        .map_err(|_| GatewayError::Netns("namespace thread panicked".into()))?
}

/// Whether `netns` is the network namespace this process runs in (same nsfs inode).
fn is_own_namespace(netns: &OwnedFd) -> Result<bool, GatewayError> {
    let failed = |what: &str, e: nix::Error| GatewayError::Netns(format!("{what}: {e}"));
    let theirs = nix::sys::stat::fstat(netns).map_err(|e| failed("stat the sandbox's network namespace", e))?;
    let ours = nix::sys::stat::stat("/proc/self/ns/net").map_err(|e| failed("stat /proc/self/ns/net", e))?;
    Ok((theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino))
}

fn listen(port: u16) -> Result<TcpListener, GatewayError> {
    let failed = |e: std::io::Error| GatewayError::Netns(format!("listen on port {port}: {e}"));
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .map_err(failed)?;
    // After a server restart, connections the old listener accepted may linger in TIME_WAIT.
    socket.set_reuse_address(true).map_err(failed)?;
    socket.set_nonblocking(true).map_err(failed)?;
    socket.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into()).map_err(failed)?;
    socket.listen(BACKLOG).map_err(failed)?;
    Ok(socket.into())
}

fn bind_udp(port: u16) -> Result<UdpSocket, GatewayError> {
    let failed = |e: std::io::Error| GatewayError::Netns(format!("bind udp port {port}: {e}"));
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)).map_err(failed)?;
    socket.set_nonblocking(true).map_err(failed)?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_own_namespace_is_refused_before_anything_changes() {
        let own = std::fs::File::open("/proc/self/ns/net").unwrap();
        let err = open_sandbox_sockets(own.into()).err().expect("attached to the host's namespace");
        assert!(err.to_string().contains("node's own network namespace"), "{err}");
    }
}
