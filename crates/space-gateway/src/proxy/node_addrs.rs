//! The node's own addresses. An upstream at one of them is the node itself: a sandbox whose
//! allowed name (`*.example.com`) points at the node's public address would reach the node's
//! own services (the API, sshd, anything listening on it) through the gateway. The private
//! ranges already cover loopback and the usual LAN addresses; this covers the rest, public
//! ones included. The gateway runs in the host's network namespace, so the addresses to
//! refuse are the host's interface addresses.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a collected set is used before `getifaddrs` runs again. The node's addresses
/// change rarely (DHCP, an operator adding one) and no sandbox can change them, so one
/// collection per interval instead of one per upstream connection loses nothing that a
/// sandbox could use.
const REFRESH: Duration = Duration::from_secs(1);

/// The node's addresses (the interfaces of the namespace the gateway runs in, the host's),
/// collected again when older than [`REFRESH`].
pub(crate) struct NodeAddrs {
    cached: Mutex<Option<(Instant, Arc<HashSet<IpAddr>>)>>,
    /// A set given by a test instead, so that a public-looking address can stand for the
    /// node's.
    #[cfg(test)]
    fixed: Option<Arc<HashSet<IpAddr>>>,
}

impl NodeAddrs {
    pub(crate) fn host() -> NodeAddrs {
        NodeAddrs {
            cached: Mutex::new(None),
            #[cfg(test)]
            fixed: None,
        }
    }

    #[cfg(test)]
    pub(crate) fn fixed(addrs: impl IntoIterator<Item = IpAddr>) -> NodeAddrs {
        NodeAddrs { cached: Mutex::new(None), fixed: Some(Arc::new(addrs.into_iter().collect())) }
    }

    /// Whether `ip` is one of the node's addresses, also when written as an IPv4-mapped or
    /// NAT64 (`64:ff9b::/96`) IPv6 address, which reach the same IPv4 host.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let addrs = self.current();
        addrs.contains(&ip) || embedded_v4(ip).is_some_and(|v4| addrs.contains(&IpAddr::V4(v4)))
    }

    fn current(&self) -> Arc<HashSet<IpAddr>> {
        #[cfg(test)]
        if let Some(addrs) = &self.fixed {
            return addrs.clone();
        }
        let Ok(mut cached) = self.cached.lock() else { return Arc::default() };
        let now = Instant::now();
        if let Some((at, addrs)) = cached.as_ref()
            && now.saturating_duration_since(*at) < REFRESH
        {
            return addrs.clone();
        }
        match collect() {
            Ok(addrs) => {
                let addrs = Arc::new(addrs);
                *cached = Some((now, addrs.clone()));
                addrs
            }
            Err(e) => {
                // Keep what was known (an interface going away mid-dump can fail it); the
                // private ranges still apply.
                tracing::warn!("cannot list the node's addresses: {e}");
                let known = cached.as_ref().map(|(_, addrs)| addrs.clone()).unwrap_or_default();
                *cached = Some((now, known.clone()));
                known
            }
        }
    }
}

/// Whether `ip` is one of this host's own addresses (any interface of this process's network
/// namespace, public ones included), as the gateway refuses them for upstreams: for the other
/// places a tenant chooses an address this host dials (a token endpoint, a KMS).
pub fn is_host_address(ip: IpAddr) -> bool {
    static HOST: std::sync::OnceLock<NodeAddrs> = std::sync::OnceLock::new();
    HOST.get_or_init(NodeAddrs::host).contains(ip)
}

/// The IPv4 address an IPv6 address stands for, when it is IPv4-mapped or NAT64.
fn embedded_v4(ip: IpAddr) -> Option<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return None };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]).then(|| {
        let o = v6.octets();
        Ipv4Addr::new(o[12], o[13], o[14], o[15])
    })
}

/// Every address of every interface in this process's network namespace.
pub(crate) fn collect() -> nix::Result<HashSet<IpAddr>> {
    let mut addrs = HashSet::new();
    for interface in nix::ifaddrs::getifaddrs()? {
        let Some(address) = interface.address else { continue };
        if let Some(v4) = address.as_sockaddr_in() {
            addrs.insert(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = address.as_sockaddr_in6() {
            addrs.insert(IpAddr::V6(v6.ip()));
        }
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 addresses local to this namespace as the kernel's routing tables list them
    /// (`/32 host LOCAL` entries), and its IPv6 addresses: a view independent of getifaddrs.
    fn kernel_view() -> HashSet<IpAddr> {
        let mut addrs = HashSet::new();
        let trie = std::fs::read_to_string("/proc/net/fib_trie").unwrap();
        let lines: Vec<&str> = trie.lines().collect();
        for pair in lines.windows(2) {
            if pair[1].trim() == "/32 host LOCAL"
                && let Some(ip) = pair[0].trim().strip_prefix("|-- ").and_then(|ip| ip.parse().ok())
            {
                addrs.insert(IpAddr::V4(ip));
            }
        }
        // Absent when the kernel has no IPv6.
        if let Ok(inet6) = std::fs::read_to_string("/proc/net/if_inet6") {
            for line in inet6.lines() {
                let hex = line.split_whitespace().next().unwrap();
                addrs.insert(IpAddr::V6(u128::from_str_radix(hex, 16).unwrap().into()));
            }
        }
        addrs
    }

    #[test]
    fn the_collection_is_the_hosts_real_addresses() {
        let collected = collect().unwrap();
        assert!(collected.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{collected:?}");
        assert_eq!(collected, kernel_view());
        // Each IPv4 one can be bound to, as only a local address can.
        for ip in collected.iter().filter(|ip| ip.is_ipv4()) {
            std::net::TcpListener::bind((*ip, 0)).unwrap_or_else(|e| panic!("{ip} is not local: {e}"));
        }
        let node = NodeAddrs::host();
        for ip in &collected {
            assert!(node.contains(*ip), "{ip}");
        }
    }

    #[test]
    fn other_spellings_of_a_node_address_count() {
        let node = NodeAddrs::fixed(["203.0.113.7".parse().unwrap()]);
        for same in ["203.0.113.7", "::ffff:203.0.113.7", "64:ff9b::cb00:7107"] {
            assert!(node.contains(same.parse().unwrap()), "{same}");
        }
        for other in ["203.0.113.8", "2001:db8::cb00:7107", "::ffff:203.0.113.8"] {
            assert!(!node.contains(other.parse().unwrap()), "{other}");
        }
    }
}
