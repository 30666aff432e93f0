//! Reaching upstreams: which addresses are private, connecting, and the upstream TLS
//! configuration (resolution and the address checks are in `resolve.rs`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::{GatewayConfig, GatewayError};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an upstream could not be used.
#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// Policy: the address may not be reached.
    Refused(String),
    /// The network: resolution or connection failed.
    Failed(String),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Refused(s) | UpstreamError::Failed(s) => f.write_str(s),
        }
    }
}

/// Whether `ip` is loopback, private, shared (CGNAT), link-local, unspecified, multicast or
/// broadcast (or reserved), or a cloud host's own service on a public address: never an
/// upstream unless the operator allows it.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private_v4(v4);
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                // IPv4-compatible (::a.b.c.d) and NAT64 (64:ff9b::/96) embed an IPv4 address.
                || (s[..6] == [0, 0, 0, 0, 0, 0])
                || (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && is_private_v4(embedded_v4(v6)))
        }
    }
}

fn embedded_v4(v6: Ipv6Addr) -> Ipv4Addr {
    let o = v6.octets();
    Ipv4Addr::new(o[12], o[13], o[14], o[15])
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, _, _] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast()
        || a == 0 // "this network"
        || (a == 100 && (b & 0xc0) == 64) // shared address space 100.64/10
        || a >= 240 // reserved
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
        || (a == 198 && (b & 0xfe) == 18) // benchmarking 198.18/15
        // Azure's WireServer: the VM's host answers it (agent, metadata, health), as
        // 169.254.169.254 is answered elsewhere, though the address is public.
        || ip == Ipv4Addr::new(168, 63, 129, 16)
}

/// A TCP connection to the first of `addrs` that answers, with TCP_NODELAY.
pub(crate) async fn connect(addrs: &[SocketAddr]) -> Result<TcpStream, UpstreamError> {
    let mut last = None;
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = Some(format!("connecting to {addr}: {e}")),
            Err(_) => last = Some(format!("connecting to {addr} timed out")),
        }
    }
    Err(UpstreamError::Failed(last.unwrap_or_else(|| "no address to connect to".into())))
}

/// An upstream TCP stream as TLS reads it: rustls asks for 4 KiB at a time, so without a
/// buffer a download costs a `recv` per 4 KiB.
pub(crate) type BufferedTcp = tokio::io::BufReader<TcpStream>;

/// Bytes read from an upstream socket at once.
const READ_BUFFER: usize = 64 << 10;

/// TLS to `name` over `stream`, verified against the built-in roots plus the operator's.
pub(crate) async fn connect_tls(
    config: Arc<rustls::ClientConfig>,
    name: &str,
    stream: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<BufferedTcp>, UpstreamError> {
    let server_name = ServerName::try_from(name.to_string())
        .map_err(|e| UpstreamError::Failed(format!("{name} is not a TLS server name: {e}")))?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let stream = tokio::io::BufReader::with_capacity(READ_BUFFER, stream);
    match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(server_name, stream)).await {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => Err(UpstreamError::Failed(format!("TLS to {name}: {e}"))),
        Err(_) => Err(UpstreamError::Failed(format!("TLS to {name} timed out"))),
    }
}

/// The provider every TLS configuration of the gateway uses.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The shared upstream TLS configuration (ALPN http/1.1); fails on a bad extra root.
pub(crate) fn client_config(
    config: &GatewayConfig,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<rustls::ClientConfig>, GatewayError> {
    let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    for (i, der) in config.extra_roots.iter().enumerate() {
        roots
            .add(der.clone().into())
            .map_err(|e| GatewayError::Config(format!("extra upstream root #{}: {e}", i + 1)))?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| GatewayError::Config(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses_are_recognised() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "ff02::1",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "168.63.129.16",
            "::ffff:168.63.129.16",
        ] {
            assert!(is_private(private.parse().unwrap()), "{private}");
        }
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "203.0.113.5",
            "168.63.129.17",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(!is_private(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn bad_extra_roots_are_rejected() {
        let config = GatewayConfig { extra_roots: vec![b"not a certificate".to_vec()], ..Default::default() };
        assert!(client_config(&config, provider()).is_err());
        assert!(client_config(&GatewayConfig::default(), provider()).is_ok());
    }
}
