//! Connections from the node to servers listening inside sandboxes (ports and preview URLs).
//!
//! The socket is created by a thread that has entered the sandbox's network namespace, as
//! the gateway's listeners are: a socket belongs to the namespace it was created in, so the
//! connection starts inside the sandbox and nothing gives the sandbox a path out. A linux
//! sandbox's servers are on the namespace's loopback; a VM's on its guest address behind the
//! TAP device.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use space_api::SandboxId;
use space_gateway::{HTTP_PORT, HTTPS_PORT, PROXY_PORT};
use space_runtime::PortAddress;
use tokio::net::{TcpSocket, TcpStream};

use crate::{Node, NodeError, Result};

/// How long a connection to a sandbox's port may take. A linux sandbox refuses at once when
/// nothing listens; a guest that drops SYNs would otherwise hold the caller for minutes.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a port of a sandbox could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("nothing listens on port {port} in the sandbox ({source}); start a server on 0.0.0.0:{port}")]
    NotListening { port: u16, source: std::io::Error },
    #[error(
        "port {port} of the sandbox did not answer within {CONNECT_TIMEOUT:?}; is the server stuck or bound to \
         another address? bind it to 0.0.0.0:{port}"
    )]
    Timeout { port: u16 },
    #[error(
        "port {port} belongs to the node's egress gateway inside a linux sandbox (ports {HTTP_PORT}, {HTTPS_PORT} \
         and {PROXY_PORT}); serve on another port"
    )]
    Reserved { port: u16 },
    #[error("port 0 is not a port")]
    Zero,
}

impl Node {
    /// A TCP connection to `port` of the server inside `sandbox`, made from within the
    /// sandbox's network namespace.
    pub async fn connect_port(&self, sandbox: &SandboxId, port: u16) -> Result<TcpStream> {
        let runtime = self.runtimes.of(sandbox)?;
        let address = target(runtime.port_address(), port)?;
        let handle = runtime.tracked_handle(sandbox).ok_or_else(|| NodeError::NotRunning(sandbox.clone()))?;
        let netns = runtime.network_namespace(&handle)?;
        let socket = socket_in_namespace(netns).await?;
        match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(address)).await {
            Ok(Ok(stream)) => {
                // Proxied requests are small and interactive as often as they are bulk.
                let _ = stream.set_nodelay(true);
                Ok(stream)
            }
            Ok(Err(source)) => Err(PortError::NotListening { port, source }.into()),
            Err(_) => Err(PortError::Timeout { port }.into()),
        }
    }
}

/// Where `port` of a sandbox whose servers are at `address` is connected to.
fn target(address: PortAddress, port: u16) -> std::result::Result<SocketAddr, PortError> {
    match (address, port) {
        (_, 0) => Err(PortError::Zero),
        (PortAddress::SharedLoopback, HTTP_PORT | HTTPS_PORT | PROXY_PORT) => Err(PortError::Reserved { port }),
        (PortAddress::SharedLoopback, _) => Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)),
        (PortAddress::Guest(guest), _) => Ok(SocketAddr::new(IpAddr::V4(guest), port)),
    }
}

/// A TCP socket created inside the network namespace `netns`, not yet connected.
async fn socket_in_namespace(netns: OwnedFd) -> Result<TcpSocket> {
    let failed =
        |e: std::io::Error| NodeError::Internal(format!("open a socket in the sandbox's network namespace: {e}"));
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A thread of its own enters the namespace and ends, leaving every other one (the
    // runtime's pooled threads among them) where they were.
    std::thread::Builder::new()
        .name("port-netns".into())
        .spawn(move || {
            let made = setns(netns.as_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)
                .and_then(|()| TcpSocket::new_v4());
            let _ = tx.send(made);
        })
        .map_err(failed)?;
    rx.await.map_err(|_| NodeError::Internal("the namespace thread ended without a socket".into()))?.map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_sandboxes_share_their_loopback_with_the_gateway() {
        let shared = PortAddress::SharedLoopback;
        assert_eq!(target(shared, 8000).unwrap(), "127.0.0.1:8000".parse().unwrap());
        for port in [80, 443, 3128] {
            assert!(matches!(target(shared, port), Err(PortError::Reserved { port: p }) if p == port));
        }
        assert!(matches!(target(shared, 0), Err(PortError::Zero)));
    }

    #[test]
    fn a_guest_owns_every_port_of_its_address() {
        let guest = PortAddress::Guest(Ipv4Addr::new(10, 254, 254, 2));
        assert_eq!(target(guest, 80).unwrap(), "10.254.254.2:80".parse().unwrap());
        assert!(matches!(target(guest, 0), Err(PortError::Zero)));
    }
}
