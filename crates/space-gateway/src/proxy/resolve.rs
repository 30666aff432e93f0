//! Finding an upstream's addresses, and refusing those a sandbox must not reach through the
//! gateway.
//!
//! Order: the operator's overrides (`--gateway-resolve`), then DNS. DNS is the host's resolver
//! configuration (getaddrinfo: `/etc/hosts`, nsswitch, `/etc/resolv.conf`) unless the operator
//! names servers with `--gateway-dns`; then only those are asked, without `/etc/hosts` or
//! search domains, so names that only the node's own network knows (split-horizon) stay
//! unknown to sandboxes. Whatever the answer, an address that is private (DNS rebinding) or
//! one of the node's own (a pivot to the node's services) is refused unless the operator
//! allows private upstreams.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, NameServerConfigGroup, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use space_api::egress::normalize_host;

use crate::{GatewayConfig, GatewayError};

use super::node_addrs::NodeAddrs;
use super::policy::Dest;
use super::upstream::{UpstreamError, is_private};

const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Answers the operator's servers' resolver keeps (for their TTL).
const CACHE_SIZE: usize = 1024;

/// `ADDR` or `ADDR:PORT` (IPv6 in brackets when a port follows): a name server for
/// `--gateway-dns`, port 53 when none is given. An address, not a name: a name would need a
/// resolver to find the resolver.
pub fn parse_dns_server(text: &str) -> Result<SocketAddr, GatewayError> {
    let text = text.trim();
    let bare = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(text);
    let addr = match bare.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, 53),
        Err(_) => text.parse::<SocketAddr>().map_err(|_| {
            GatewayError::Config(format!(
                "DNS server {text:?} is not ADDR or ADDR:PORT (e.g. 192.0.2.53, 192.0.2.53:5353, [2001:db8::53]:53)"
            ))
        })?,
    };
    if addr.port() == 0 {
        return Err(GatewayError::Config(format!("DNS server {text:?}: port 0")));
    }
    Ok(addr)
}

/// Where names are looked up.
enum Dns {
    /// The host's resolver configuration, through getaddrinfo.
    Host,
    /// Only the operator's servers.
    Servers(Box<TokioResolver>),
}

/// Resolves and checks upstream addresses, per the operator's settings.
pub(crate) struct Resolver {
    allow_private: bool,
    overrides: HashMap<String, SocketAddr>,
    override_ips: HashMap<String, IpAddr>,
    dns: Dns,
    node: NodeAddrs,
}

impl Resolver {
    pub(crate) fn new(config: &GatewayConfig) -> Resolver {
        Resolver::with_node_addrs(config, NodeAddrs::host())
    }

    pub(crate) fn with_node_addrs(config: &GatewayConfig, node: NodeAddrs) -> Resolver {
        let dns = if config.dns_servers.is_empty() { Dns::Host } else { Dns::Servers(Box::new(servers(config))) };
        Resolver {
            allow_private: config.allow_private_upstreams,
            overrides: config.resolve.clone(),
            override_ips: config.resolve_ip.clone(),
            dns,
            node,
        }
    }

    /// Refuses an address that is private or the node's own, unless the operator allows
    /// private upstreams (which trusts whatever the names resolve to).
    pub(crate) fn check(&self, ip: IpAddr) -> Result<(), UpstreamError> {
        if self.allow_private {
            return Ok(());
        }
        if is_private(ip) {
            return Err(UpstreamError::Refused(format!("private upstream address {ip}")));
        }
        if self.node.contains(ip) {
            return Err(UpstreamError::Refused(format!("upstream address {ip} is one of this node's own addresses")));
        }
        Ok(())
    }

    /// The addresses to connect to for `dest:port`; refused ones are dropped (and the whole
    /// lookup refused when nothing else remains).
    pub(crate) async fn resolve(&self, dest: &Dest, port: u16) -> Result<Vec<SocketAddr>, UpstreamError> {
        let name = match dest {
            Dest::Ip(ip) => {
                self.check(*ip)?;
                return Ok(vec![SocketAddr::new(*ip, port)]);
            }
            Dest::Name(name) => normalize_host(name),
        };
        let found = if let Some(addr) = self.overrides.get(&name) {
            vec![*addr]
        } else if let Some(ip) = self.override_ips.get(&name) {
            vec![SocketAddr::new(*ip, port)]
        } else {
            match tokio::time::timeout(RESOLVE_TIMEOUT, self.lookup(&name, port)).await {
                Ok(found) => found?,
                Err(_) => return Err(UpstreamError::Failed(format!("resolving {name} timed out"))),
            }
        };
        let mut refused = None;
        let usable: Vec<SocketAddr> = found
            .into_iter()
            .filter(|a| match self.check(a.ip()) {
                Ok(()) => true,
                Err(e) => {
                    refused.get_or_insert(e);
                    false
                }
            })
            .collect();
        match (usable.is_empty(), refused) {
            (false, _) => Ok(usable),
            (true, Some(refused)) => Err(refused),
            (true, None) => Err(UpstreamError::Failed(format!("{name} has no address"))),
        }
    }

    async fn lookup(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, UpstreamError> {
        let failed = |e: &dyn std::fmt::Display| UpstreamError::Failed(format!("cannot resolve {name}: {e}"));
        match &self.dns {
            Dns::Host => Ok(tokio::net::lookup_host((name, port)).await.map_err(|e| failed(&e))?.collect()),
            // Fully qualified: the name the sandbox asked for, never it plus a search domain.
            Dns::Servers(resolver) => {
                let found = resolver.lookup_ip(format!("{name}.")).await.map_err(|e| failed(&e))?;
                Ok(found.iter().map(|ip| SocketAddr::new(ip, port)).collect())
            }
        }
    }
}

/// A resolver that asks only the operator's servers (UDP, and TCP for truncated answers).
fn servers(config: &GatewayConfig) -> TokioResolver {
    let mut group = NameServerConfigGroup::new();
    for server in &config.dns_servers {
        group.push(NameServerConfig::new(*server, Protocol::Udp));
        group.push(NameServerConfig::new(*server, Protocol::Tcp));
    }
    let mut options = ResolverOpts::default();
    // The host's own names are what the operator chose not to use.
    options.use_hosts_file = ResolveHosts::Never;
    // Both families, as getaddrinfo gives them.
    options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    options.cache_size = CACHE_SIZE;
    let config = ResolverConfig::from_parts(None, vec![], group);
    TokioResolver::builder_with_config(config, TokioConnectionProvider::default()).with_options(options).build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, ResponseCode};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{RData, Record, RecordType};
    use std::net::Ipv4Addr;

    #[test]
    fn dns_servers_parse() {
        for (text, addr) in [
            ("192.0.2.53", "192.0.2.53:53"),
            ("192.0.2.53:5353", "192.0.2.53:5353"),
            (" 127.0.0.1:1053 ", "127.0.0.1:1053"),
            ("2001:db8::53", "[2001:db8::53]:53"),
            ("[2001:db8::53]", "[2001:db8::53]:53"),
            ("[::1]:5353", "[::1]:5353"),
        ] {
            assert_eq!(parse_dns_server(text).unwrap(), addr.parse::<SocketAddr>().unwrap(), "{text}");
        }
        for bad in ["", "dns.example", "dns.example:53", "192.0.2.53:", "192.0.2.53:0", "192.0.2.53:99999", "::1:53]"] {
            assert!(parse_dns_server(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[tokio::test]
    async fn overrides_come_first_and_private_results_are_refused() {
        let mut config = GatewayConfig::default();
        config.resolve.insert("api.test".into(), "127.0.0.1:8443".parse().unwrap());
        config.resolve_ip.insert("ip.test".into(), "127.0.0.2".parse().unwrap());
        config.resolve_ip.insert("public.test".into(), "203.0.113.7".parse().unwrap());
        let resolver = Resolver::new(&config);
        let refused = resolver.resolve(&Dest::Name("API.test.".into()), 443).await.unwrap_err();
        assert_eq!(refused.to_string(), "private upstream address 127.0.0.1");
        assert!(matches!(refused, UpstreamError::Refused(_)));
        assert_eq!(
            resolver.resolve(&Dest::Name("public.test".into()), 443).await.unwrap(),
            vec!["203.0.113.7:443".parse().unwrap()]
        );
        assert!(resolver.resolve(&Dest::Ip("10.0.0.1".parse().unwrap()), 80).await.is_err());

        config.allow_private_upstreams = true;
        let resolver = Resolver::new(&config);
        assert_eq!(
            resolver.resolve(&Dest::Name("api.test".into()), 443).await.unwrap(),
            vec!["127.0.0.1:8443".parse().unwrap()]
        );
        assert_eq!(
            resolver.resolve(&Dest::Name("ip.test".into()), 80).await.unwrap(),
            vec!["127.0.0.2:80".parse().unwrap()]
        );
    }

    #[tokio::test]
    async fn the_nodes_own_addresses_are_refused_like_private_ones() {
        let own: IpAddr = "203.0.113.7".parse().unwrap();
        let mut config = GatewayConfig::default();
        config.resolve_ip.insert("node.example.com".into(), own);
        config.resolve_ip.insert("mapped.example.com".into(), "::ffff:203.0.113.7".parse().unwrap());
        config.resolve_ip.insert("other.example.com".into(), "203.0.113.8".parse().unwrap());
        let resolver = Resolver::with_node_addrs(&config, NodeAddrs::fixed([own]));
        let refused = resolver.resolve(&Dest::Name("node.example.com".into()), 443).await.unwrap_err();
        assert!(matches!(refused, UpstreamError::Refused(_)));
        assert_eq!(refused.to_string(), "upstream address 203.0.113.7 is one of this node's own addresses");
        assert!(matches!(resolver.resolve(&Dest::Ip(own), 443).await, Err(UpstreamError::Refused(_))));
        assert!(matches!(
            resolver.resolve(&Dest::Name("mapped.example.com".into()), 443).await,
            Err(UpstreamError::Refused(_))
        ));
        assert!(resolver.resolve(&Dest::Name("other.example.com".into()), 443).await.is_ok());
        // The operator who allows private upstreams trusts what names resolve to.
        config.allow_private_upstreams = true;
        let resolver = Resolver::with_node_addrs(&config, NodeAddrs::fixed([own]));
        assert!(resolver.resolve(&Dest::Name("node.example.com".into()), 443).await.is_ok());
    }

    #[tokio::test]
    async fn the_hosts_real_addresses_are_refused() {
        let resolver = Resolver::new(&GatewayConfig::default());
        for ip in super::super::node_addrs::collect().unwrap() {
            // Checked, never connected to.
            let refused = resolver.resolve(&Dest::Ip(ip), 443).await.unwrap_err();
            assert!(matches!(refused, UpstreamError::Refused(_)), "{ip}: {refused}");
            if !is_private(ip) {
                assert!(refused.to_string().contains("this node's own addresses"), "{refused}");
            }
        }
    }

    /// A DNS server on loopback that answers every A query with `answer` and every other
    /// query with no data; the names it was asked, as it was asked them.
    async fn dns_server(answer: Ipv4Addr) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let (asked, names) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut packet = [0u8; 4096];
            while let Ok((len, peer)) = socket.recv_from(&mut packet).await {
                let Ok(query) = Message::from_vec(&packet[..len]) else { continue };
                let mut reply = Message::new();
                reply
                    .set_id(query.id())
                    .set_message_type(MessageType::Response)
                    .set_response_code(ResponseCode::NoError);
                for question in query.queries() {
                    let _ = asked.send(question.name().to_ascii());
                    reply.add_query(question.clone());
                    if question.query_type() == RecordType::A {
                        reply.add_answer(Record::from_rdata(question.name().clone(), 60, RData::A(A(answer))));
                    }
                }
                let _ = socket.send_to(&reply.to_vec().unwrap(), peer).await;
            }
        });
        (addr, names)
    }

    #[tokio::test]
    async fn names_resolve_through_the_operators_dns_servers() {
        let answer = Ipv4Addr::new(203, 0, 113, 9);
        let (server, mut asked) = dns_server(answer).await;
        let config = GatewayConfig { dns_servers: vec![server], ..Default::default() };
        let resolver = Resolver::new(&config);
        // A name no public resolver and no /etc/hosts knows.
        let found = resolver.resolve(&Dest::Name("Internal.Split-Horizon.test".into()), 443).await.unwrap();
        assert_eq!(found, vec![SocketAddr::from((answer, 443))]);
        assert_eq!(asked.recv().await.unwrap().to_ascii_lowercase(), "internal.split-horizon.test.");
        // Its answers are checked like any other.
        let config = GatewayConfig { dns_servers: vec![server], ..Default::default() };
        let resolver = Resolver::with_node_addrs(&config, NodeAddrs::fixed([IpAddr::V4(answer)]));
        let refused = resolver.resolve(&Dest::Name("node.split-horizon.test".into()), 443).await.unwrap_err();
        assert!(refused.to_string().contains("this node's own addresses"), "{refused}");
    }
}
