//! E2B's network options onto a session's egress policy.
//!
//! space denies a sandbox's egress unless its policy allows it; E2B allows everything unless
//! told otherwise. A create's `allowOut` entries become allowed hosts (DNS names) or address
//! ranges (addresses and CIDRs), its `denyOut` names denied hosts. Denying everything
//! (`0.0.0.0/0`, or `allow_internet_access: false`) is what space does anyway. What cannot
//! be expressed is refused with a message, never dropped.

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use space_api::egress::{Cidr, NetworkPolicy};

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
    let policy = policy(request.allow_internet_access, Some(&request))?.unwrap_or_default();
    let replaced = state.store.update_network_policy(&session.id, |_| Ok(policy)).await.map_err(AppError::from)?;
    replaced.ok_or_else(|| E2bError::no_sandbox(&id))?.map_err(E2bError::bad_request)?;
    crate::egress::push_session(&state, &session.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Ranges meaning "every address".
const EVERYWHERE: [&str; 2] = ["0.0.0.0/0", "::/0"];

/// The native policy for a create's network options (`None`: space's default, deny all).
pub fn policy(allow_internet: Option<bool>, config: Option<&NetworkConfig>) -> E2bResult<Option<NetworkPolicy>> {
    if allow_internet == Some(true) && config.is_none_or(|c| c.allow_out.is_empty()) {
        return Err(everything_refused());
    }
    let Some(config) = config else { return Ok(None) };
    if !config.other.is_empty() {
        let fields: Vec<&str> = config.other.keys().map(String::as_str).collect();
        tracing::warn!(?fields, "E2B network fields space does not know were ignored");
    }
    let mut policy = NetworkPolicy::default();
    for entry in &config.allow_out {
        if EVERYWHERE.contains(&entry.as_str()) {
            return Err(everything_refused());
        }
        if is_address(entry) {
            policy.cidrs.push(as_cidr(entry));
        } else {
            policy.allow.push(entry.clone());
        }
    }
    for entry in &config.deny_out {
        if EVERYWHERE.contains(&entry.as_str()) {
            continue;
        }
        if is_address(entry) {
            return Err(E2bError::bad_request(format!(
                "denyOut {}: space denies every address not allowed, so list what to allow in allowOut instead",
                space_api::error::echo(entry)
            )));
        }
        policy.deny.push(entry.clone());
    }
    policy.validate().map_err(E2bError::bad_request)?;
    Ok(Some(policy))
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

fn everything_refused() -> E2bError {
    E2bError::bad_request(
        "space does not open a sandbox to the whole internet: name the hosts it may reach in network.allowOut \
         (e.g. [\"pypi.org\", \"*.pythonhosted.org\"]); see docs/e2b.md",
    )
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
        let made = policy(None, Some(&config)).unwrap().unwrap();
        assert_eq!(made.allow, ["pypi.org"]);
        assert_eq!(made.cidrs, ["10.1.2.3/32", "192.0.2.0/24"]);
        assert_eq!(made.deny, ["evil.example"]);
        let open = NetworkConfig { allow_out: vec!["0.0.0.0/0".into()], ..NetworkConfig::default() };
        assert!(policy(None, Some(&open)).is_err());
        assert!(policy(Some(true), None).is_err());
        assert!(policy(Some(false), None).unwrap().is_none());
    }
}
