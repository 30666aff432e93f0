//! The per-connection and per-request checks against a session's policy and grants.

use std::net::IpAddr;

use space_api::egress::{host_matches, normalize_host};

use crate::{Grant, SessionEgress};

/// What a client named: a DNS name (normalized) or an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dest {
    Name(String),
    Ip(IpAddr),
}

impl Dest {
    /// `host` as found in an authority or a Host header (`[v6]` in brackets).
    pub(crate) fn parse(host: &str) -> Dest {
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        match bare.parse::<IpAddr>() {
            Ok(ip) => Dest::Ip(ip),
            Err(_) => Dest::Name(normalize_host(host)),
        }
    }

    pub(crate) fn text(&self) -> String {
        match self {
            Dest::Name(name) => name.clone(),
            Dest::Ip(ip) => ip.to_string(),
        }
    }
}

/// Splits `host[:port]` (a Host header or an authority); `None` when it is not one.
pub(crate) fn split_authority(text: &str) -> Option<(String, Option<u16>)> {
    let authority: http::uri::Authority = text.parse().ok()?;
    if authority.as_str().contains('@') {
        return None;
    }
    Some((authority.host().to_string(), authority.port_u16()))
}

pub(crate) fn check_name(egress: &SessionEgress, name: &str) -> Result<(), String> {
    if egress.allows_host(name) { Ok(()) } else { Err(format!("name {} not allowed", normalize_host(name))) }
}

pub(crate) fn check_port(egress: &SessionEgress, port: u16) -> Result<(), String> {
    if egress.policy.allows_port(port) { Ok(()) } else { Err(format!("port {port} not allowed")) }
}

pub(crate) fn check_ip(egress: &SessionEgress, ip: IpAddr) -> Result<(), String> {
    if egress.policy.allows_addr(ip) { Ok(()) } else { Err(format!("address {ip} not in an allowed range")) }
}

/// The destination and port, by name or by address.
pub(crate) fn check_dest(egress: &SessionEgress, dest: &Dest, port: u16) -> Result<(), String> {
    match dest {
        Dest::Name(name) => check_name(egress, name)?,
        Dest::Ip(ip) => check_ip(egress, *ip)?,
    }
    check_port(egress, port)
}

/// The grants whose hosts match `host`.
pub(crate) fn grants_for<'a>(egress: &'a SessionEgress, host: &str) -> Vec<&'a Grant> {
    egress.grants.iter().filter(|g| g.hosts.iter().any(|p| host_matches(p, host))).collect()
}

/// Whether some grant names `host`: TLS to it is intercepted when the gateway resolves the
/// name (never when the sandbox picked the address).
pub(crate) fn intercepted(egress: &SessionEgress, host: &str) -> bool {
    !grants_for(egress, host).is_empty()
}

/// The text of a refusal, with how to lift it.
pub(crate) fn refusal(session: &space_api::SessionId, reason: &str, host: &str) -> String {
    format!("space gateway: {reason}\nTo allow it: space session policy {session} --allow {host}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_authorities_parse() {
        assert_eq!(Dest::parse("API.test."), Dest::Name("api.test".into()));
        assert_eq!(Dest::parse("[::1]"), Dest::Ip("::1".parse().unwrap()));
        assert_eq!(Dest::parse("10.0.0.1"), Dest::Ip("10.0.0.1".parse().unwrap()));
        assert_eq!(split_authority("api.test:8443"), Some(("api.test".into(), Some(8443))));
        assert_eq!(split_authority("[::1]:443"), Some(("[::1]".into(), Some(443))));
        assert_eq!(split_authority("api.test"), Some(("api.test".into(), None)));
        assert_eq!(split_authority("user@api.test"), None);
        assert_eq!(split_authority("a b"), None);
    }
}
