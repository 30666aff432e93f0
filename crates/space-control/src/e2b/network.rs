//! E2B's network options onto a session's egress policy.
//!
//! space denies a sandbox's egress unless its policy allows it; E2B allows everything unless
//! told otherwise, and an operator chooses which of the two a create that says nothing gets
//! (`--e2b-internet-by-default`). A create's `allowOut` entries become allowed hosts (DNS
//! names) or address ranges (addresses and CIDRs), its `denyOut` names denied hosts; the
//! internet is the policy entry `*`. What cannot be expressed is refused with a message,
//! never dropped.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use space_api::egress::{ANY_HOST, Cidr, NetworkPolicy, host_matches};

use super::errors::{E2bError, E2bResult};
use super::sandboxes::{E2bJson, sandbox};
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiPath, AppError};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    allow_out: Vec<String>,
    #[serde(default)]
    deny_out: Vec<String>,
    allow_public_traffic: Option<bool>,
    #[serde(flatten)]
    other: std::collections::BTreeMap<String, serde_json::Value>,
}

impl NetworkConfig {
    /// Whether the sandbox's ports are open to anyone (E2B's default) rather than to holders
    /// of its traffic token.
    pub fn public_traffic(&self) -> bool {
        self.allow_public_traffic != Some(false)
    }
}

/// `PUT /sandboxes/{id}/network`: the policy is replaced by what the request says (what it
/// leaves out is cleared, as in E2B), for new connections at once.
pub async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    E2bJson(request): E2bJson<NetworkConfig>,
) -> E2bResult<StatusCode> {
    let session = sandbox(&state, &caller, &id).await?;
    let internet_by_default = state.e2b_internet_by_default;
    let policy = policy(request.allow_internet_access, Some(&request), internet_by_default)?.unwrap_or_default();
    let replaced = state.store.update_network_policy(&session.id, |_| Ok(policy)).await.map_err(AppError::from)?;
    replaced.ok_or_else(|| E2bError::no_sandbox(&id))?.map_err(E2bError::bad_request)?;
    crate::egress::push_session(&state, &session.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Ranges meaning "every address".
const EVERYWHERE: [&str; 2] = ["0.0.0.0/0", "::/0"];

/// The native policy for E2B's network options (`None`: space's default, deny all).
///
/// As in E2B, a sandbox reaches the internet unless `allow_internet_access` is false or
/// `denyOut` holds every address, and `allowOut` wins over `denyOut`; what a create says
/// nothing of is the operator's choice, `internet_by_default` (space's deny by default unless
/// `space serve --e2b-internet-by-default`). The internet is `allow: ["*"]` with every IPv4
/// range: the gateway still refuses private, loopback and the node's own addresses.
pub fn policy(
    allow_internet: Option<bool>,
    config: Option<&NetworkConfig>,
    internet_by_default: bool,
) -> E2bResult<Option<NetworkPolicy>> {
    let empty = NetworkConfig::default();
    let config = config.unwrap_or(&empty);
    refuse_unsupported(config)?;
    if !config.other.is_empty() {
        let fields: Vec<&str> = config.other.keys().map(String::as_str).collect();
        tracing::warn!(?fields, "E2B network fields space does not know were ignored");
    }
    // The create's top-level flag, else the one in its network options (an update's).
    let allow_internet = allow_internet.or(config.allow_internet_access);
    let everything = |list: &[String]| list.iter().any(|e| EVERYWHERE.contains(&e.as_str()));
    let internet = everything(&config.allow_out)
        || (!everything(&config.deny_out) && allow_internet.unwrap_or(internet_by_default));
    let mut policy = NetworkPolicy::default();
    if internet {
        policy.allow.push(ANY_HOST.to_owned());
        policy.cidrs.push(EVERYWHERE[0].to_owned());
    }
    for entry in config.allow_out.iter().filter(|e| !EVERYWHERE.contains(&e.as_str())) {
        match is_address(entry) {
            true => policy.cidrs.push(as_cidr(entry)),
            false => policy.allow.push(entry.clone()),
        }
    }
    for entry in config.deny_out.iter().filter(|e| !EVERYWHERE.contains(&e.as_str())) {
        if is_address(entry) {
            return Err(address_deny_refused(entry, internet));
        }
        policy.deny.push(entry.clone());
    }
    check_allowed_not_denied(&policy)?;
    if policy == NetworkPolicy::default() {
        return Ok(None);
    }
    policy.validate().map_err(E2bError::bad_request)?;
    Ok(Some(policy))
}

/// E2B network features space does not have, each with what to do instead: they change
/// where traffic goes or what it carries, so they are refused rather than ignored.
const UNSUPPORTED: [(&str, &str); 3] = [
    ("egressProxy", "a sandbox's traffic leaves through the node's gateway only; leave egressProxy out"),
    (
        "rules",
        "grant a space credential instead (docs/egress.md): the gateway injects it for its hosts, and the \
         sandbox never sees it",
    ),
    ("maskRequestHost", "leave maskRequestHost out: requests keep the host they name"),
];

/// 501 for a set E2B network feature space does not have (an empty or null one is nothing).
fn refuse_unsupported(config: &NetworkConfig) -> E2bResult<()> {
    for (field, instead) in UNSUPPORTED {
        let set = config.other.get(field).is_some_and(|value| match value {
            serde_json::Value::Null => false,
            serde_json::Value::String(s) => !s.is_empty(),
            serde_json::Value::Object(o) => !o.is_empty(),
            serde_json::Value::Array(a) => !a.is_empty(),
            _ => true,
        });
        if set {
            return Err(E2bError::unsupported(&format!("network.{field}"), instead));
        }
    }
    Ok(())
}

/// E2B's `allowOut` wins over its `denyOut`, space's `deny` over its `allow`: a name both
/// allow and a deny pattern take would be denied, so it is refused rather than turned around.
fn check_allowed_not_denied(policy: &NetworkPolicy) -> E2bResult<()> {
    let named = policy.allow.iter().filter(|a| *a != ANY_HOST);
    for allowed in named {
        let name = allowed.trim_start_matches("*.");
        if let Some(denied) = policy.deny.iter().find(|d| *d == ANY_HOST || host_matches(d, name) || *d == allowed) {
            return Err(E2bError::bad_request(format!(
                "allowOut {} is also denied by denyOut {}: space denies what both name (E2B allows it); leave it \
                 out of denyOut or list the denied names one by one",
                space_api::error::echo(allowed),
                space_api::error::echo(denied)
            )));
        }
    }
    Ok(())
}

/// space denies by name only: an address range can be left out of what is allowed, not
/// denied inside it.
fn address_deny_refused(entry: &str, internet: bool) -> E2bError {
    let entry = space_api::error::echo(entry);
    E2bError::bad_request(match internet {
        true => format!(
            "denyOut {entry}: space cannot deny an address range while the internet is allowed; set \
             allow_internet_access=False and list what to reach in allowOut"
        ),
        false => format!(
            "denyOut {entry}: space denies every address not allowed, so list what to allow in allowOut instead"
        ),
    })
}

fn is_address(entry: &str) -> bool {
    Cidr::parse(entry).is_ok() || entry.parse::<std::net::IpAddr>().is_ok()
}

fn as_cidr(entry: &str) -> String {
    match entry.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => format!("{entry}/32"),
        Ok(std::net::IpAddr::V6(_)) => format!("{entry}/128"),
        Err(_) => entry.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_and_deny_lists_become_the_session_policy() {
        let config = NetworkConfig {
            allow_out: vec!["pypi.org".into(), "10.1.2.3".into(), "192.0.2.0/24".into()],
            deny_out: vec!["0.0.0.0/0".into(), "evil.example".into()],
            ..NetworkConfig::default()
        };
        for by_default in [false, true] {
            let made = policy(None, Some(&config), by_default).unwrap().unwrap();
            assert_eq!(made.allow, ["pypi.org"], "denyOut 0.0.0.0/0 closes the internet");
            assert_eq!(made.cidrs, ["10.1.2.3/32", "192.0.2.0/24"]);
            assert_eq!(made.deny, ["evil.example"]);
        }
        let listed = NetworkConfig { allow_out: vec!["pypi.org".into()], ..NetworkConfig::default() };
        assert_eq!(policy(None, Some(&listed), false).unwrap().unwrap().allow, ["pypi.org"]);
        assert!(policy(Some(false), None, true).unwrap().is_none(), "closed: space's default");
        assert!(policy(None, None, false).unwrap().is_none());
    }

    #[test]
    fn the_internet_is_any_host_and_every_ipv4_range() {
        let open = |made: Option<NetworkPolicy>| {
            let made = made.unwrap();
            made.allow.contains(&ANY_HOST.to_owned()) && made.cidrs.contains(&"0.0.0.0/0".to_owned())
        };
        assert!(open(policy(Some(true), None, false).unwrap()), "asked for");
        assert!(open(policy(None, None, true).unwrap()), "the operator's default");
        let everything = NetworkConfig { allow_out: vec!["0.0.0.0/0".into()], ..NetworkConfig::default() };
        assert!(open(policy(Some(false), Some(&everything), false).unwrap()), "allowOut wins over denyOut");
        let denied = NetworkConfig { deny_out: vec!["evil.example".into()], ..NetworkConfig::default() };
        let made = policy(None, Some(&denied), true).unwrap().unwrap();
        assert_eq!((made.allow, made.deny), (vec![ANY_HOST.to_owned()], vec!["evil.example".to_owned()]));
        let nested = NetworkConfig { allow_internet_access: Some(true), ..NetworkConfig::default() };
        assert!(open(policy(None, Some(&nested), false).unwrap()), "the flag inside the network options");
        let both = NetworkConfig {
            allow_out: vec!["api.x.test".into()],
            deny_out: vec!["*.x.test".into()],
            ..NetworkConfig::default()
        };
        let refused = policy(None, Some(&both), false).unwrap_err();
        assert!(
            refused.message.starts_with(r#"allowOut "api.x.test" is also denied by denyOut "*.x.test""#),
            "{}",
            refused.message
        );
        let proxy = serde_json::json!({ "egressProxy": { "address": "proxy.test:1080" }, "rules": {} });
        let proxied: NetworkConfig = serde_json::from_value(proxy).unwrap();
        let refused = policy(None, Some(&proxied), false).unwrap_err();
        assert_eq!(refused.code, 501);
        assert!(refused.message.starts_with("network.egressProxy is not supported"), "{}", refused.message);
        let empty: NetworkConfig =
            serde_json::from_value(serde_json::json!({ "rules": {}, "egressProxy": null })).unwrap();
        assert!(policy(None, Some(&empty), false).is_ok(), "empty ones are nothing to refuse");
        let range = NetworkConfig { deny_out: vec!["203.0.113.0/24".into()], ..NetworkConfig::default() };
        let refused = policy(Some(true), Some(&range), false).unwrap_err();
        assert!(refused.message.contains("allow_internet_access=False"), "{}", refused.message);
    }
}
