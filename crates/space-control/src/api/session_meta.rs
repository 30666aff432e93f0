//! A session's name, labels and metadata: their limits, and the filters of the session list.

use std::collections::BTreeMap;

use serde::Deserialize;
use space_api::SessionState;
use space_api::error::echo;
use space_store::SessionFilter;
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::{AppError, AppResult};

const MAX_NAME: usize = 128;
const MAX_LABELS: usize = 32;
const MAX_LABEL_KEY: usize = 63;
const MAX_LABEL_VALUE: usize = 256;
/// Keys and values of a session's metadata together.
const MAX_METADATA_BYTES: usize = 16 << 10;

pub(crate) fn check_name(name: &str) -> AppResult<()> {
    if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(AppError::bad_request(format!(
            "session names are 1-{MAX_NAME} bytes without control characters, got {}",
            echo(name)
        )));
    }
    Ok(())
}

/// `[a-z0-9][a-z0-9._/-]{0,62}`, as Kubernetes-style label keys are.
fn valid_label_key(key: &str) -> bool {
    let mut bytes = key.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    first_ok
        && key.len() <= MAX_LABEL_KEY
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'/' | b'-'))
}

fn check_label(key: &str, value: &str) -> AppResult<()> {
    if !valid_label_key(key) {
        return Err(AppError::bad_request(format!(
            "label key {} is invalid: keys are 1-{MAX_LABEL_KEY} characters of a-z, 0-9, '.', '_', '/' or '-', \
             starting with a letter or digit",
            echo(key)
        )));
    }
    if value.len() > MAX_LABEL_VALUE || value.contains('\0') {
        return Err(AppError::bad_request(format!(
            "the value of label {key} is invalid: values are at most {MAX_LABEL_VALUE} bytes, without NUL"
        )));
    }
    Ok(())
}

pub(crate) fn check_labels(labels: &BTreeMap<String, String>) -> AppResult<()> {
    if labels.len() > MAX_LABELS {
        return Err(AppError::bad_request(format!("a session has at most {MAX_LABELS} labels, got {}", labels.len())));
    }
    labels.iter().try_for_each(|(k, v)| check_label(k, v))
}

pub(crate) fn check_metadata(metadata: &BTreeMap<String, String>) -> AppResult<()> {
    let size: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_METADATA_BYTES {
        return Err(AppError::bad_request(format!(
            "a session's metadata is at most {} KiB of keys and values together, got {size} bytes; keep larger data \
             in a file of the session",
            MAX_METADATA_BYTES >> 10
        )));
    }
    if metadata.iter().any(|(k, v)| k.is_empty() || k.contains('\0') || v.contains('\0')) {
        return Err(AppError::bad_request("metadata keys must not be empty, and neither keys nor values contain NUL"));
    }
    Ok(())
}

/// The query of `GET /v1/sessions` (documentation: the handler reads the pairs itself, as
/// `label` repeats).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // only documents the query
pub struct ListParams {
    /// Include destroyed sessions.
    #[serde(default)]
    pub all: bool,
    /// Every tenant's sessions (admin key only; 403 otherwise).
    #[serde(default)]
    pub all_tenants: bool,
    /// `KEY=VALUE`: only sessions with this label; repeat it for sessions with all of them.
    #[serde(default)]
    pub label: Vec<String>,
    /// Only sessions in this state (`running`, `suspended`, …).
    pub state: Option<String>,
    /// Only sessions of this template.
    pub template: Option<String>,
}

fn truthy(name: &str, value: &str) -> AppResult<bool> {
    match value {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(AppError::bad_request(format!("{name} takes true or false, got {}", echo(value)))),
    }
}

/// The filter the query `pairs` of `GET /v1/sessions` ask for, as `caller` may see: 403 for
/// `all_tenants` unless the caller is the admin, before anything else is checked.
pub(crate) fn list_filter(caller: &Caller, pairs: &[(String, String)]) -> AppResult<SessionFilter> {
    let wants_all_tenants = pairs.iter().any(|(k, v)| k == "all_tenants" && v != "false" && v != "0");
    if wants_all_tenants && !caller.admin {
        return Err(AppError::new(
            space_api::ErrorCode::Forbidden,
            "all_tenants=true lists every tenant's sessions and needs the admin key; leave it out to list yours",
        ));
    }
    let mut filter = SessionFilter { tenant: Some(caller.tenant_id.clone()), ..SessionFilter::default() };
    for (key, value) in pairs {
        match key.as_str() {
            "all" => filter.include_destroyed = truthy(key, value)?,
            "all_tenants" => {
                if truthy(key, value)? {
                    filter.tenant = None;
                }
            }
            "label" => {
                let Some((k, v)) = value.split_once('=') else {
                    return Err(AppError::bad_request(format!("label takes KEY=VALUE, got {}", echo(value))));
                };
                check_label(k, v)?;
                filter.labels.push((k.to_owned(), v.to_owned()));
            }
            "state" => {
                let state = SessionState::parse(value).ok_or_else(|| {
                    AppError::bad_request(format!(
                        "unknown state {}; states are creating, running, paused, restoring, suspending, suspended, \
                         destroying, destroyed and failed",
                        echo(value)
                    ))
                })?;
                filter.state = Some(state);
                filter.include_destroyed |= state == SessionState::Destroyed;
            }
            "template" => filter.template = Some(value.clone()),
            other => {
                return Err(AppError::bad_request(format!(
                    "unknown query parameter {}; GET /v1/sessions takes all, all_tenants, label, state and template",
                    echo(other)
                )));
            }
        }
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use space_api::TenantId;

    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn label_keys_follow_the_documented_pattern() {
        for good in ["team", "a", "app.kubernetes.io/name", "x-1_2", &"k".repeat(63)] {
            assert!(valid_label_key(good), "{good}");
        }
        for bad in ["", "Team", "-x", ".x", "a b", "ü", &"k".repeat(64)] {
            assert!(!valid_label_key(bad), "{bad}");
        }
    }

    #[test]
    fn all_tenants_is_refused_to_a_tenant_before_the_rest_is_read() {
        let tenant = Caller { tenant_id: TenantId::generate(), tenant: "t".into(), admin: false, scope: None };
        let query = pairs(&[("label", "NOT VALID"), ("all_tenants", "true")]);
        let error = list_filter(&tenant, &query).unwrap_err();
        assert_eq!(error.0.code, space_api::ErrorCode::Forbidden);
        let admin = Caller { admin: true, ..tenant.clone() };
        assert_eq!(list_filter(&admin, &query).unwrap_err().0.code, space_api::ErrorCode::BadRequest);
        let query = pairs(&[("label", "team=x"), ("label", "env=prod"), ("all_tenants", "true"), ("state", "running")]);
        let filter = list_filter(&admin, &query).unwrap();
        assert_eq!((filter.tenant, filter.labels.len(), filter.state), (None, 2, Some(SessionState::Running)));
        assert!(list_filter(&tenant, &pairs(&[("color", "red")])).is_err());
    }
}
