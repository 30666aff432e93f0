//! The route every sandbox network namespace holds: `local 0.0.0.0/0 dev lo table local`
//! ("AnyIP"). It makes every IPv4 address local to the namespace's only interface, so a
//! connection to any address reaches the gateway's listeners there and nothing routes out
//! (see `space-gateway`). Two callers need it: the gateway when it attaches to a sandbox, and
//! a CRIU restore before it restores sockets: a socket connected to any address has that
//! address as its own, which can only be bound again once the address is local.

use std::net::Ipv4Addr;

use netlink_packet_route::route::{RouteProtocol, RouteScope, RouteType};
use rtnetlink::RouteMessageBuilder;

/// Every namespace's loopback interface has index 1.
const LOOPBACK_INDEX: u32 = 1;
/// The kernel's `local` routing table.
const LOCAL_TABLE: u32 = 255;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("netlink runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("route every address to lo: {0}")]
    Route(#[from] rtnetlink::Error),
}

/// `ip route replace local 0.0.0.0/0 dev lo table local` in the calling thread's network
/// namespace (idempotent). Blocking.
pub fn route_every_address_to_loopback() -> Result<(), NetnsError> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().map_err(NetnsError::Runtime)?;
    runtime.block_on(async {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(NetnsError::Socket)?;
        let driver = tokio::spawn(connection);
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
            .output_interface(LOOPBACK_INDEX)
            .table_id(LOCAL_TABLE)
            .kind(RouteType::Local)
            .scope(RouteScope::Host)
            .protocol(RouteProtocol::Static)
            .build();
        let added = handle.route().add(route).replace().execute().await;
        driver.abort();
        Ok(added?)
    })
}
