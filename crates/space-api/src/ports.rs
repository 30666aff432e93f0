//! Reaching servers that run inside a session's sandbox: the port proxy and preview URLs.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Body of `POST /v1/sessions/{id}/ports/{port}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"public": false}))]
pub struct OpenPortRequest {
    /// Reachable by anyone who knows the URL, with no key or token. Default: only with the
    /// session tenant's API key or this port's token.
    #[serde(default)]
    pub public: bool,
}

/// How a port of a session is reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PortAccess {
    pub port: u16,
    /// Whether anyone may connect, without key or token.
    pub public: bool,
    /// The path-based URL on this server: `{server}/v1/sessions/{id}/ports/{port}/`.
    pub url: String,
    /// `{port}-{session id with '-' for '_'}.{preview domain}` when the server has one
    /// (`space serve --preview-domain`), else null.
    pub preview_url: Option<String>,
    /// The port's token (header `X-Space-Port-Token` or query `space_token`), shown only in
    /// the answer that made it; opening the port again makes a new one and voids the old.
    pub token: Option<String>,
    /// Unix time in milliseconds; null for a port not opened (reachable with the API key).
    pub opened_at: Option<i64>,
}

/// Body of `GET /v1/sessions/{id}/ports`: the session's opened ports.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PortList {
    pub ports: Vec<PortAccess>,
}

/// The host label of a session's port under a preview domain: `8000-ses-abc…` (DNS names
/// cannot hold the id's `_`).
pub fn preview_label(session: &crate::SessionId, port: u16) -> String {
    format!("{port}-{}", session.as_str().replacen('_', "-", 1))
}

/// The session and port a preview host label names, if it names one.
pub fn parse_preview_label(label: &str) -> Option<(crate::SessionId, u16)> {
    let (port, id) = label.split_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let id = id.replacen('-', "_", 1).parse().ok()?;
    Some((id, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SessionId;

    #[test]
    fn preview_labels_round_trip_and_reject_junk() {
        let id = SessionId::generate();
        let label = preview_label(&id, 8000);
        assert!(!label.contains('_') && label.starts_with("8000-ses-"), "{label}");
        assert_eq!(parse_preview_label(&label), Some((id.clone(), 8000)));
        for junk in [
            "",
            "8000",
            "0-ses-aaaaaaaaaaaaaaaaaaaa",
            "x-ses-aaaaaaaaaaaaaaaaaaaa",
            "8000-ses-short",
            "70000-ses-aaaaaaaaaaaaaaaaaaaa",
            "8000-snap-aaaaaaaaaaaaaaaaaaaa",
        ] {
            assert_eq!(parse_preview_label(junk), None, "{junk}");
        }
    }
}
