//! Egress: a session's network policy, credentials and their grants, and the gateway's audit
//! records. The matching rules live here so the API, the CLI and the gateway agree on them.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{CredentialId, SessionId};

/// Ports a session may reach when its policy names none.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];
/// Longest host pattern accepted (a DNS name is at most 253 bytes, plus `*.`).
const MAX_PATTERN_LEN: usize = 255;
/// Entries per list of a policy.
pub const MAX_POLICY_ENTRIES: usize = 256;
/// The policy entry that matches every host name. Only a policy's `allow` and `deny` take it:
/// a credential's hosts are checked by [`validate_host_pattern`], which refuses it, and
/// matched by [`host_matches`], which never reads it so; no grant matches every host.
pub const ANY_HOST: &str = "*";

/// Where a session's sandboxes may connect to. Default deny: nothing is reachable until a
/// host is allowed (or a credential granted for it). `deny` wins over `allow`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Host names: `api.github.com` (exactly that name), `*.pypi.org` (any name below
    /// `pypi.org`, not `pypi.org` itself) or `*` (any name; the gateway still refuses names
    /// that resolve to private, loopback or the node's own addresses).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Host patterns refused even when `allow` (or a grant) matches them.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Destination ports; empty means 80 and 443.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Address ranges (`203.0.113.0/24`) that may be reached by address instead of by name.
    #[serde(default)]
    pub cidrs: Vec<String>,
}

/// A change to a session's network policy (`PATCH /v1/sessions/{id}/network`): applied to
/// new connections at once, without restarting anything.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicyUpdate {
    /// Patterns to allow (also removed from `deny`).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Patterns to refuse (also removed from `allow`).
    #[serde(default)]
    pub deny: Vec<String>,
    /// Replaces the port list when given.
    pub ports: Option<Vec<u16>>,
    /// Replaces the address ranges when given.
    pub cidrs: Option<Vec<String>>,
    /// `true` detaches a fork from its parent: the grants it inherited become its own, and
    /// revoking them on the parent no longer reaches it. There is no attaching again.
    #[serde(default)]
    pub detached: bool,
}

impl NetworkPolicy {
    /// Checks every entry; the message names the first bad one and what is expected.
    pub fn validate(&self) -> Result<(), String> {
        for (name, list) in [("allow", &self.allow), ("deny", &self.deny), ("cidrs", &self.cidrs)] {
            if list.len() > MAX_POLICY_ENTRIES {
                return Err(format!("{name} has {} entries; at most {MAX_POLICY_ENTRIES} are allowed", list.len()));
            }
        }
        for pattern in self.allow.iter().chain(&self.deny).filter(|p| *p != ANY_HOST) {
            validate_host_pattern(pattern)?;
        }
        if self.ports.contains(&0) {
            return Err("port 0 is not a valid destination port".into());
        }
        for cidr in &self.cidrs {
            Cidr::parse(cidr)?;
        }
        Ok(())
    }

    /// The policy after `update`, validated. Patterns are stored lower-case.
    pub fn updated(&self, update: &NetworkPolicyUpdate) -> Result<NetworkPolicy, String> {
        let mut next = self.clone();
        for pattern in &update.allow {
            let p = pattern.to_ascii_lowercase();
            next.deny.retain(|d| *d != p);
            if !next.allow.contains(&p) {
                next.allow.push(p);
            }
        }
        for pattern in &update.deny {
            let p = pattern.to_ascii_lowercase();
            next.allow.retain(|a| *a != p);
            if !next.deny.contains(&p) {
                next.deny.push(p);
            }
        }
        if let Some(ports) = &update.ports {
            next.ports = ports.clone();
        }
        if let Some(cidrs) = &update.cidrs {
            next.cidrs = cidrs.clone();
        }
        next.validate()?;
        Ok(next)
    }

    /// Whether `host` (a DNS name, any case, optional trailing dot) may be reached, counting
    /// the hosts of the session's grants as allowed.
    pub fn allows_host<'a>(&'a self, host: &str, granted: impl IntoIterator<Item = &'a str>) -> bool {
        let host = normalize_host(host);
        let listed = |p: &String| p == ANY_HOST || host_matches(p, &host);
        if self.deny.iter().any(listed) {
            return false;
        }
        self.allow.iter().any(listed) || granted.into_iter().any(|p| host_matches(p, &host))
    }

    pub fn allows_port(&self, port: u16) -> bool {
        if self.ports.is_empty() { DEFAULT_PORTS.contains(&port) } else { self.ports.contains(&port) }
    }

    /// Whether `addr` is inside one of the policy's ranges (invalid entries never match).
    pub fn allows_addr(&self, addr: IpAddr) -> bool {
        self.cidrs.iter().filter_map(|c| Cidr::parse(c).ok()).any(|c| c.contains(addr))
    }
}

/// The placeholder a sandbox sees for a credential's `placeholder_env`: set in the session's
/// environment by the control plane, swapped for the value by the gateway.
pub fn placeholder_for(credential: &str) -> String {
    format!("space-placeholder-{credential}")
}

/// Lower-case, without a trailing dot.
pub fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// `pattern` is `name` or `*.suffix`; matching ignores case.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let host = normalize_host(host);
    let pattern = pattern.to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1 && host.ends_with(suffix) && {
                let cut = host.len() - suffix.len();
                host.as_bytes()[cut - 1] == b'.'
            }
        }
        None => host == pattern,
    }
}

/// A DNS name of letters, digits and hyphens (or `*.` then one), not an address.
pub fn validate_host_pattern(pattern: &str) -> Result<(), String> {
    let name = pattern.strip_prefix("*.").unwrap_or(pattern);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let valid = !name.is_empty() && pattern.len() <= MAX_PATTERN_LEN && name.split('.').all(label_ok);
    if !valid {
        return Err(format!(
            "{} is not a host pattern: use a DNS name like api.github.com or *.pypi.org",
            crate::error::echo(pattern)
        ));
    }
    if name.parse::<IpAddr>().is_ok() || name.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("{pattern:?} is an address; allow addresses with a CIDR (--cidr {pattern}/32)"));
    }
    Ok(())
}

/// An address range, `addr/len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub len: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let bad = || {
            format!("{} is not an address range: use e.g. 203.0.113.0/24 or 2001:db8::/32", crate::error::echo(text))
        };
        let (addr, len) = text.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let len: u8 = len.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(bad());
        }
        Ok(Cidr { addr, len })
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        fn prefix(bits: u128, len: u8, width: u8) -> u128 {
            if len == 0 { 0 } else { bits >> (width - len) }
        }
        match (self.addr, addr) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                prefix(u32::from(net) as u128, self.len, 32) == prefix(u32::from(a) as u128, self.len, 32)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                prefix(u128::from(net), self.len, 128) == prefix(u128::from(a), self.len, 128)
            }
            _ => false,
        }
    }
}

/// `POST /v1/credentials`: the value is sent once and never returned.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCredentialRequest {
    /// Unique per tenant: letters, digits, `-`, `_`, `.`; at most 64.
    pub name: String,
    /// Host patterns (as in a network policy) the value may be sent to.
    pub hosts: Vec<String>,
    /// The header to inject, with `{secret}` where the value goes: `Authorization: Bearer {secret}`.
    /// May be left out for an `oauth2` credential, which then uses exactly that.
    #[serde(default)]
    pub header: String,
    /// The value of a `static` credential; left out for an `oauth2` one.
    #[serde(default)]
    pub value: String,
    /// Unix time in seconds after which the gateway stops injecting it.
    pub expires_at: Option<i64>,
    /// Injections per minute of this credential, shared by every session it is granted to;
    /// beyond it the gateway answers 429.
    pub rate_limit_per_min: Option<u32>,
    /// An environment variable the sandbox sees holding a placeholder; the gateway swaps the
    /// placeholder for the value in requests to the credential's hosts only.
    pub placeholder_env: Option<String>,
    /// `static` (the default) or `oauth2`.
    #[serde(default)]
    pub kind: CredentialKind,
    /// How the platform gets access tokens for an `oauth2` credential.
    pub oauth2: Option<OAuth2Request>,
}

/// How a credential gets what the gateway injects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKind {
    /// A value given once, injected as it is.
    #[default]
    Static,
    /// Access tokens the control plane gets from an OAuth 2.0 token endpoint and refreshes;
    /// the gateway injects the current one.
    Oauth2,
}

/// The OAuth 2.0 grant used for access tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OAuth2GrantType {
    /// The client's own identity (machine to machine).
    ClientCredentials,
    /// A user's refresh token: given at creation, or obtained by `space credential login`.
    RefreshToken,
}

/// How the client authenticates at the token endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OAuth2ClientAuth {
    /// HTTP Basic (`client_secret_basic`).
    #[default]
    Basic,
    /// In the form body (`client_secret_post`).
    Post,
}

/// An `oauth2` credential's settings; the client secret and refresh token are sent once and
/// never returned.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OAuth2Request {
    /// The token endpoint (`https`).
    pub token_url: String,
    pub client_id: String,
    /// Left out for a public client (sign-in with PKCE only).
    pub client_secret: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    pub grant_type: OAuth2GrantType,
    /// For `refresh_token`: a refresh token to start from (else `space credential login`).
    pub refresh_token: Option<String>,
    /// Where a human signs in (`https`), for `space credential login`.
    pub authorize_url: Option<String>,
    /// The redirect URI registered with the provider; it must lead to this control plane's
    /// `/v1/oauth/callback`. Defaults to the one the CLI reaches the control plane at.
    pub redirect_uri: Option<String>,
    #[serde(default)]
    pub client_auth: OAuth2ClientAuth,
}

/// Whether an `oauth2` credential has a usable access token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OAuth2Status {
    /// No token asked for yet.
    Pending,
    /// A `refresh_token` credential without a refresh token: `space credential login NAME`.
    NeedsLogin,
    Ok,
    /// The last attempt failed (see `reason`); requests to its hosts get 502 until one succeeds.
    Failing,
}

/// An `oauth2` credential as listed: settings and state, never a secret or token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OAuth2Info {
    pub token_url: String,
    pub client_id: String,
    pub scopes: Vec<String>,
    pub grant_type: OAuth2GrantType,
    pub authorize_url: Option<String>,
    pub redirect_uri: Option<String>,
    pub client_auth: OAuth2ClientAuth,
    pub status: OAuth2Status,
    /// Why it is failing (the token endpoint's error, or what was wrong with its answer).
    pub reason: Option<String>,
    /// Unix time in milliseconds of the last token obtained.
    pub refreshed_at: Option<i64>,
    /// Unix time in seconds at which the current access token expires.
    pub token_expires_at: Option<i64>,
}

/// `POST /v1/credentials/{name}/login`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OAuth2LoginRequest {
    /// Overrides the credential's `redirect_uri` for this sign-in.
    pub redirect_uri: Option<String>,
}

/// Where the human signs in; the provider then redirects to `/v1/oauth/callback`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OAuth2Login {
    pub authorization_url: String,
    /// Unix time in seconds after which the sign-in must be started again.
    pub expires_at: i64,
}

/// `PATCH /v1/credentials/{name}`: rotation and changes, effective on the next request.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateCredentialRequest {
    pub value: Option<String>,
    pub hosts: Option<Vec<String>>,
    pub header: Option<String>,
    /// 0 removes the expiry.
    pub expires_at: Option<i64>,
    /// 0 removes the limit.
    pub rate_limit_per_min: Option<u32>,
    /// A new client secret of an `oauth2` credential.
    pub client_secret: Option<String>,
    /// A new refresh token of an `oauth2` credential (`refresh_token` grant).
    pub refresh_token: Option<String>,
}

/// A credential as listed: never its value.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Credential {
    pub id: CredentialId,
    pub name: String,
    pub hosts: Vec<String>,
    pub header: String,
    pub expires_at: Option<i64>,
    pub rate_limit_per_min: Option<u32>,
    pub placeholder_env: Option<String>,
    #[serde(default)]
    pub kind: CredentialKind,
    /// Settings and state of an `oauth2` credential.
    #[serde(default)]
    pub oauth2: Option<OAuth2Info>,
    /// Increases with every change of the value.
    pub version: u32,
    /// Unix time in milliseconds.
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CredentialList {
    pub credentials: Vec<Credential>,
}

/// `POST /v1/sessions/{id}/grants`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    pub credential: String,
}

/// A session's network policy and the credentials granted to it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionNetwork {
    pub session_id: SessionId,
    pub policy: NetworkPolicy,
    /// Names of granted credentials.
    pub grants: Vec<String>,
    /// Those of `grants` inherited from the session this one was forked from: revoking one
    /// there revokes it here too. Empty once detached; a grant made on this session is its own.
    #[serde(default)]
    pub inherited: Vec<String>,
}

/// What the gateway decided about one connection or request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditDecision {
    Allowed,
    Denied,
    /// Allowed, with a credential injected.
    Injected,
}

impl AuditDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditDecision::Allowed => "allowed",
            AuditDecision::Denied => "denied",
            AuditDecision::Injected => "injected",
        }
    }
}

impl std::str::FromStr for AuditDecision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "allowed" => Ok(AuditDecision::Allowed),
            "denied" => Ok(AuditDecision::Denied),
            "injected" => Ok(AuditDecision::Injected),
            other => Err(format!("unknown audit decision {}", crate::error::echo(other))),
        }
    }
}

/// One gateway decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditEvent {
    pub session_id: SessionId,
    /// Unix time in milliseconds.
    pub time: i64,
    pub decision: AuditDecision,
    /// Why it was denied (or what was notable).
    pub reason: Option<String>,
    /// `dns`, `http`, `https`, `connect` or `tcp`; the gateway's own notices are `audit`
    /// (events left out over the budget) and `limit` (connections refused at the limit).
    pub protocol: String,
    /// The name (or address) asked for.
    pub host: String,
    pub port: u16,
    /// HTTP method when the request was seen, else the TLS SNI if any.
    pub method: Option<String>,
    /// For HTTP requests seen in clear (or intercepted): the path.
    pub path: Option<String>,
    /// The credential injected (its name, never its value).
    pub credential: Option<String>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

impl AuditEvent {
    /// An allowed connection to `host:port` at `time`, with nothing else known yet.
    pub fn allowed(session_id: SessionId, time: i64, protocol: &str, host: &str, port: u16) -> AuditEvent {
        AuditEvent {
            session_id,
            time,
            decision: AuditDecision::Allowed,
            reason: None,
            protocol: protocol.to_string(),
            host: host.to_string(),
            port,
            method: None,
            path: None,
            credential: None,
            bytes_sent: 0,
            bytes_received: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    pub events: Vec<AuditEvent>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_exact_names_and_strict_suffixes() {
        assert!(host_matches("api.github.com", "API.GitHub.com."));
        assert!(!host_matches("api.github.com", "github.com"));
        assert!(host_matches("*.pypi.org", "files.pypi.org"));
        assert!(host_matches("*.pypi.org", "a.b.pypi.org"));
        assert!(!host_matches("*.pypi.org", "pypi.org"));
        assert!(!host_matches("*.pypi.org", "evilpypi.org"));
    }

    #[test]
    fn deny_wins_and_grants_count_as_allowed() {
        let policy = NetworkPolicy {
            allow: vec!["*.example.com".into()],
            deny: vec!["secret.example.com".into()],
            ..Default::default()
        };
        assert!(policy.allows_host("www.example.com", []));
        assert!(!policy.allows_host("secret.example.com", ["secret.example.com"]));
        assert!(policy.allows_host("api.other.org", ["api.other.org"]));
        assert!(!policy.allows_host("api.other.org", []));
    }

    #[test]
    fn any_host_is_a_policy_entry_only_and_deny_still_wins() {
        let policy =
            NetworkPolicy { allow: vec![ANY_HOST.into()], deny: vec!["*.corp.test".into()], ..Default::default() };
        assert_eq!(policy.validate(), Ok(()));
        assert!(policy.allows_host("pypi.org", []) && policy.allows_host("a.b.example.com", []));
        assert!(!policy.allows_host("git.corp.test", []), "deny wins over *");
        let deny_all =
            NetworkPolicy { allow: vec![ANY_HOST.into()], deny: vec![ANY_HOST.into()], ..Default::default() };
        assert!(!deny_all.allows_host("pypi.org", []));
        // A credential's hosts never match every name: `*` is not a host pattern, and a grant
        // that held one anyway would match only a host named `*`.
        assert!(
            validate_host_pattern(ANY_HOST)
                .unwrap_err()
                .ends_with("is not a host pattern: use a DNS name like api.github.com or *.pypi.org")
        );
        assert!(!host_matches(ANY_HOST, "pypi.org"));
        assert!(!NetworkPolicy::default().allows_host("pypi.org", [ANY_HOST]));
    }

    #[test]
    fn updates_move_patterns_between_lists_and_validate() {
        let policy = NetworkPolicy { allow: vec!["a.com".into()], ..Default::default() };
        let update =
            NetworkPolicyUpdate { deny: vec!["A.com".into()], allow: vec!["b.com".into()], ..Default::default() };
        let next = policy.updated(&update).unwrap();
        assert_eq!(next.allow, vec!["b.com".to_string()]);
        assert_eq!(next.deny, vec!["a.com".to_string()]);
        let bad = NetworkPolicyUpdate { allow: vec!["1.2.3.4".into()], ..Default::default() };
        assert!(policy.updated(&bad).unwrap_err().contains("CIDR"));
        assert!(policy.updated(&NetworkPolicyUpdate { allow: vec!["a b".into()], ..Default::default() }).is_err());
    }

    #[test]
    fn ports_default_to_web_and_cidrs_contain_addresses() {
        let mut policy = NetworkPolicy::default();
        assert!(policy.allows_port(443) && !policy.allows_port(22));
        policy.ports = vec![22];
        assert!(policy.allows_port(22) && !policy.allows_port(443));
        policy.cidrs = vec!["203.0.113.0/24".into(), "2001:db8::/32".into()];
        assert!(policy.allows_addr("203.0.113.9".parse().unwrap()));
        assert!(!policy.allows_addr("203.0.114.1".parse().unwrap()));
        assert!(policy.allows_addr("2001:db8::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("1.2.3.4/33").is_err());
    }
}
