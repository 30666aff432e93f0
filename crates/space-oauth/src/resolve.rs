//! Name resolution that keeps a tenant's endpoint off the networks the operator refuses.

use std::net::{IpAddr, SocketAddr};

/// Resolves names to the addresses a filter allows only, at every connection (so a name
/// that later resolves elsewhere is checked again).
pub(crate) struct Allowed(pub(crate) fn(IpAddr) -> bool);

impl reqwest::dns::Resolve for Allowed {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let refused = self.0;
        Box::pin(async move {
            let found = tokio::net::lookup_host((name.as_str(), 0)).await?;
            let allowed: Vec<SocketAddr> = found.filter(|a| !refused(a.ip())).collect();
            if allowed.is_empty() {
                return Err(format!("{} resolves to no address a token endpoint may be at", name.as_str()).into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}
