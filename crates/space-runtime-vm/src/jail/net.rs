//! The VMM's network namespace: `lo` and `tap0`, nothing that leaves it (HOST-FACTS, "A VM
//! behind the same gateway design"). Every IPv4 address is local (the AnyIP route the
//! gateway's listeners rely on), and the guest's own address is routed to the tap in table
//! `local`, which AnyIP would otherwise deliver locally: replies to the guest would never
//! reach it. The tap holds the gateway's address: a reply from a socket bound to the
//! wildcard (the gateway's DNS) takes the outgoing interface's address as its source, and a
//! guest drops an answer from any address but the one it asked.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use netlink_packet_route::route::{RouteProtocol, RouteScope, RouteType};
use rtnetlink::{LinkUnspec, RouteMessageBuilder};

/// The tap's name in the namespace.
pub(crate) const TAP_NAME: &str = "tap0";
/// The tap's MAC, the same in every VMM's namespace: a guest restored from a memory image
/// keeps the gateway's MAC in its ARP cache, and a tap of another MAC would drop its frames
/// (they are for another host) until that entry expires.
const TAP_MAC: [u8; 6] = [0x02, 0x00, 0x0a, 0xfe, 0xfe, 0x01];
/// The loopback's index in every namespace.
const LOOPBACK_INDEX: u32 = 1;
/// The kernel's `local` routing table.
const LOCAL_TABLE: u32 = 255;

/// Configures the calling process's (fresh) network namespace; returns the tap's descriptor.
pub(crate) fn setup(guest: Ipv4Addr, gateway: Ipv4Addr) -> Result<OwnedFd, String> {
    space_netns::route_every_address_to_loopback().map_err(|e| e.to_string())?;
    let tap = open_tap(TAP_NAME).map_err(|e| format!("create {TAP_NAME}: {e}"))?;
    let index = if_index(TAP_NAME).map_err(|e| format!("index of {TAP_NAME}: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(|e| format!("netlink: {e}"))?;
        let driver = tokio::spawn(connection);
        let result = async {
            handle
                .link()
                .set(LinkUnspec::new_with_index(LOOPBACK_INDEX).up().build())
                .execute()
                .await
                .map_err(|e| format!("lo up: {e}"))?;
            handle
                .link()
                .set(LinkUnspec::new_with_index(index).address(TAP_MAC.to_vec()).up().build())
                .execute()
                .await
                .map_err(|e| format!("{TAP_NAME} up: {e}"))?;
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(guest, 32)
                .output_interface(index)
                .table_id(LOCAL_TABLE)
                .kind(RouteType::Unicast)
                .scope(RouteScope::Link)
                .protocol(RouteProtocol::Static)
                .build();
            handle.route().add(route).replace().execute().await.map_err(|e| format!("route {guest}/32 to tap: {e}"))?;
            handle
                .address()
                .add(index, gateway.into(), 32)
                .replace()
                .execute()
                .await
                .map_err(|e| format!("address {gateway}/32 on {TAP_NAME}: {e}"))
        }
        .await;
        driver.abort();
        result
    })?;
    Ok(tap)
}

fn if_index(name: &str) -> io::Result<u32> {
    let cname = std::ffi::CString::new(name)?;
    // SAFETY: cname is a NUL-terminated string that outlives the call.
    match unsafe { libc::if_nametoindex(cname.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        index => Ok(index),
    }
}

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags (the union's first short).
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// `_IOW('T', 202, int)` of linux/if_tun.h.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// Opens /dev/net/tun and attaches a new tap `name` to the descriptor. The device lives as
/// long as a descriptor does (not persistent): it goes with QEMU.
fn open_tap(name: &str) -> io::Result<OwnedFd> {
    let tun = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open("/dev/net/tun")?;
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: 0, _pad: [0; 22] };
    for (dst, src) in req.name.iter_mut().zip(name.bytes().take(libc::IFNAMSIZ - 1)) {
        *dst = src as libc::c_char;
    }
    req.flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
    // SAFETY: TUNSETIFF reads (and writes back the name into) an ifreq; `req` is laid out as
    // one and lives across the call.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &raw mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(tun.into())
}
