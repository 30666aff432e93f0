//! Requests that can be read two ways are refused (400) before anything else looks at them:
//! the gateway would check one reading while the upstream acts on another, with the
//! credential the gateway injected for the first (RFC 9112 §3.2, §6.1).
//!
//! hyper already settles `Content-Length` before a request reaches the gateway, so it is not
//! checked again here: differing values, or a list in one line, are a 400; identical lines
//! are folded into one (RFC 9110 §8.6 allows it); with `Transfer-Encoding` the
//! `Content-Length` is dropped and the connection closed after the response (what RFC 9112
//! §6.3 asks of an intermediary that forwards such a request). A `Transfer-Encoding` whose
//! last coding is not `chunked` is a 400 too. hyper does not look at `Host` at all, nor at
//! codings before the last.

use http::header::{self, HeaderMap};
use http::{Request, Uri, Version};
use space_api::egress::normalize_host;

use super::policy::split_authority;

/// Why a request is ambiguous. The texts go to the sandbox and the audit log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Ambiguous {
    #[error("more than one Host header")]
    DuplicateHost,
    #[error("invalid Host header {0}")]
    InvalidHost(String),
    #[error("HTTP/1.1 request without a Host header")]
    MissingHost,
    #[error("request target {target} does not match the Host header {host}")]
    TargetMismatch { target: String, host: String },
    #[error("Transfer-Encoding applies chunked more than once")]
    ChunkedTwice,
}

/// The one authority `request` names: its `Host` header, or (HTTP/1.0 without `Host`) the
/// authority of its absolute-form target; `None` when it names none. An absolute-form
/// target and `Host` must name the same host and port.
pub(crate) fn authority<B>(request: &Request<B>) -> Result<Option<String>, Ambiguous> {
    check_transfer_encoding(request.headers())?;
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let (host, more) = (hosts.next(), hosts.next());
    if more.is_some() {
        return Err(Ambiguous::DuplicateHost);
    }
    let uri = request.uri();
    let Some(value) = host else {
        if request.version() >= Version::HTTP_11 {
            return Err(Ambiguous::MissingHost);
        }
        return Ok(uri.authority().map(|a| a.to_string()));
    };
    let invalid = || Ambiguous::InvalidHost(String::from_utf8_lossy(value.as_bytes()).into_owned());
    let text = value.to_str().map_err(|_| invalid())?;
    let (host, port) = split_authority(text).ok_or_else(invalid)?;
    if let Some(target) = uri.authority() {
        let default = default_port(uri);
        let same =
            normalize_host(target.host()) == normalize_host(&host) && target.port_u16().or(default) == port.or(default);
        if !same {
            return Err(Ambiguous::TargetMismatch { target: target.to_string(), host: text.to_string() });
        }
    }
    Ok(Some(text.to_string()))
}

/// The port a target's scheme implies.
fn default_port(uri: &Uri) -> Option<u16> {
    match uri.scheme_str() {
        Some(scheme) if scheme.eq_ignore_ascii_case("https") => Some(443),
        Some(scheme) if scheme.eq_ignore_ascii_case("http") => Some(80),
        _ => None,
    }
}

/// `chunked` at most once over all `Transfer-Encoding` lines. hyper checks only that the
/// last line ends in it; "chunked, chunked" or two `chunked` lines would reach the upstream,
/// which may decode the body twice where the gateway decoded it once.
fn check_transfer_encoding(headers: &HeaderMap) -> Result<(), Ambiguous> {
    let chunked = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|b| *b == b','))
        .filter(|coding| coding.trim_ascii().eq_ignore_ascii_case(b"chunked"))
        .count();
    if chunked > 1 { Err(Ambiguous::ChunkedTwice) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::get(uri).version(version);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    fn http11(uri: &str, headers: &[(&str, &str)]) -> Result<Option<String>, Ambiguous> {
        authority(&request(Version::HTTP_11, uri, headers))
    }

    #[test]
    fn one_host_is_required_and_must_be_valid() {
        assert_eq!(http11("/", &[("host", "API.test:8443")]), Ok(Some("API.test:8443".into())));
        assert_eq!(http11("/", &[("host", "a.test"), ("host", "a.test")]), Err(Ambiguous::DuplicateHost));
        assert_eq!(http11("/", &[]), Err(Ambiguous::MissingHost));
        assert_eq!(http11("/", &[("host", "user@a.test")]), Err(Ambiguous::InvalidHost("user@a.test".into())));
        assert_eq!(http11("/", &[("host", "")]), Err(Ambiguous::InvalidHost(String::new())));
        // HTTP/1.0 did not require Host; the target names the host then, or nothing does.
        assert_eq!(authority(&request(Version::HTTP_10, "http://a.test/", &[])), Ok(Some("a.test".into())));
        assert_eq!(authority(&request(Version::HTTP_10, "/", &[])), Ok(None));
    }

    #[test]
    fn an_absolute_target_must_name_what_host_names() {
        assert_eq!(http11("http://A.test./x", &[("host", "a.test:80")]), Ok(Some("a.test:80".into())));
        assert_eq!(http11("https://a.test:443/", &[("host", "a.test")]), Ok(Some("a.test".into())));
        assert_eq!(http11("http://a.test:8080/", &[("host", "a.test:8080")]), Ok(Some("a.test:8080".into())));
        let mismatch =
            |target: &str, host: &str| Ambiguous::TargetMismatch { target: target.into(), host: host.into() };
        assert_eq!(http11("http://b.test/", &[("host", "a.test")]), Err(mismatch("b.test", "a.test")));
        assert_eq!(http11("http://a.test:8080/", &[("host", "a.test")]), Err(mismatch("a.test:8080", "a.test")));
        assert_eq!(http11("https://a.test/", &[("host", "a.test:80")]), Err(mismatch("a.test", "a.test:80")));
    }

    #[test]
    fn chunked_is_applied_at_most_once() {
        let host = ("host", "a.test");
        assert!(http11("/", &[host, ("transfer-encoding", "gzip, chunked")]).is_ok());
        let twice = Err(Ambiguous::ChunkedTwice);
        assert_eq!(http11("/", &[host, ("transfer-encoding", "chunked, Chunked")]), twice);
        assert_eq!(http11("/", &[host, ("transfer-encoding", "chunked"), ("transfer-encoding", "chunked")]), twice);
    }
}
