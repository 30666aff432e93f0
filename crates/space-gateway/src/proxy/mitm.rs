//! TLS interception for hosts with a grant: the sandbox's TLS ends here (a leaf certificate
//! from the session CA), every request is checked again with the session's current policy
//! and grants, the credential is injected, and the request goes on over verified TLS to an
//! address the gateway resolved for the name.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use space_api::egress::{AuditDecision, AuditEvent, normalize_host};
use space_api::{CredentialId, SessionId};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::{Grant, SandboxContext};

use super::ambiguity;
use super::audit::{self, Record};
use super::client_hello::HELLO_TIMEOUT;
use super::forward::{Forwarder, Target, outgoing, relay};
use super::policy::{Dest, check_name, check_port, grants_for, refusal, split_authority};
use super::{RespBody, http_server, text};

/// Intercepts the TLS connection `client` (its ClientHello named `sni`), forwarding its
/// requests to `sni` on `port`: at `addrs` when the gateway already resolved the name,
/// else where it resolves when connecting.
///
/// The upstream is always found by the name, never an address the sandbox picked: the
/// upstream's certificate is the only other check between the credential and whoever holds
/// that address, and an allowed range may hold hosts with a certificate for the name
/// (shared front ends, a staging copy of the service).
pub(crate) async fn serve<S>(
    context: Arc<SandboxContext>,
    session: SessionId,
    sni: String,
    port: u16,
    addrs: Option<Vec<SocketAddr>>,
    client: S,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let target = Target { dest: Dest::Name(normalize_host(&sni)), port, tls_name: Some(sni.clone()), addrs };
    let Some((current, egress)) = context.current() else { return };
    if current != session {
        return;
    }
    let config = match context.state().leaves.server_config(&session, &egress.ca, &sni) {
        Ok(config) => config,
        Err(e) => {
            let event = audit::event(&session, "https", &sni, target.port);
            context.audit(audit::denied(event, &format!("no certificate for {sni}: {e}")));
            return;
        }
    };
    let tls = match tokio::time::timeout(HELLO_TIMEOUT, tokio_rustls::TlsAcceptor::from(config).accept(client)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return tracing::debug!("TLS from the sandbox for {sni}: {e}"),
        Err(_) => return tracing::debug!("TLS from the sandbox for {sni}: timed out"),
    };
    let forwarder = Forwarder::new(context.clone());
    let connection = Arc::new(Intercepted { context, session, sni, target, forwarder });
    let service = hyper::service::service_fn(move |request| {
        let connection = connection.clone();
        async move { Ok::<_, Infallible>(connection.handle(request).await) }
    });
    if let Err(e) = http_server().serve_connection(TokioIo::new(tls), service).with_upgrades().await {
        tracing::debug!("intercepted connection: {e}");
    }
}

/// One intercepted client connection.
struct Intercepted {
    context: Arc<SandboxContext>,
    session: SessionId,
    sni: String,
    target: Target,
    forwarder: Forwarder,
}

impl Intercepted {
    fn deny(&self, event: AuditEvent, status: StatusCode, reason: &str) -> Response<RespBody> {
        self.context.audit(audit::denied(event, reason));
        text(status, format!("space gateway: {reason}\n"))
    }

    async fn handle(&self, mut request: Request<Incoming>) -> Response<RespBody> {
        let mut event = audit::event(&self.session, "https", &self.sni, self.target.port);
        event.method = Some(request.method().to_string());
        event.path = Some(request.uri().path().to_string());
        // Rotation, revocation and policy changes apply to the next request.
        let Some((session, egress)) = self.context.current() else {
            return text(StatusCode::FORBIDDEN, "space gateway: no session is bound to this sandbox\n");
        };
        if session != self.session {
            return self.deny(event, StatusCode::FORBIDDEN, "the sandbox now serves another session");
        }
        let authority = match ambiguity::authority(&request) {
            Ok(Some(authority)) => authority,
            Ok(None) => return self.deny(event, StatusCode::BAD_REQUEST, "request without a Host header"),
            Err(ambiguous) => return self.deny(event, StatusCode::BAD_REQUEST, &ambiguous.to_string()),
        };
        if echoes_request(request.method()) {
            let reason = format!(
                "{} is refused on hosts the gateway adds credentials to: the upstream would echo the credential back",
                request.method()
            );
            return self.deny(event, StatusCode::FORBIDDEN, &reason);
        }
        let host = split_authority(&authority).map(|(host, _)| normalize_host(&host));
        if host.as_deref() != Some(self.sni.as_str()) {
            let reason = format!("Host header {authority} does not match TLS server name {}", self.sni);
            return self.deny(event, StatusCode::MISDIRECTED_REQUEST, &reason);
        }
        if let Err(reason) = check_name(&egress, &self.sni).and_then(|()| check_port(&egress, self.target.port)) {
            self.context.audit(audit::denied(event, &reason));
            return text(StatusCode::FORBIDDEN, refusal(&session, &reason, &self.sni));
        }
        let grants = grants_for(&egress, &self.sni);
        let now = audit::now_millis() / 1000;
        for grant in &grants {
            if let Some(why) = &grant.unavailable {
                let reason = format!("credential {} has no token to inject: {why}", grant.credential);
                return self.deny(event, StatusCode::BAD_GATEWAY, &reason);
            }
            if grant.expires_at.is_some_and(|at| at < now) {
                let reason = format!("credential {} expired", grant.credential);
                return self.deny(event, StatusCode::FORBIDDEN, &reason);
            }
            if let Some(limit) = grant.rate_limit_per_min.filter(|l| *l > 0)
                && !self.context.state().limits.allow(&grant.credential_id, limit)
            {
                let reason = format!("credential {} rate limit of {limit}/min exceeded", grant.credential);
                return self.deny(event, StatusCode::TOO_MANY_REQUESTS, &reason);
            }
        }
        let mut injected = Vec::new();
        for grant in &grants {
            if let Err(reason) = inject(request.headers_mut(), grant) {
                return self.deny(event, StatusCode::INTERNAL_SERVER_ERROR, &reason);
            }
            injected.push(grant.credential.as_str());
        }
        if !injected.is_empty() {
            event.decision = AuditDecision::Injected;
            event.credential = Some(injected.join(","));
        }
        let record = Record::new(self.context.clone(), event);
        let request = outgoing(request, &authority, &record);
        let mut response = relay(&self.forwarder, &self.target, request, record).await;
        // An upstream that echoes request headers back must not hand the value to the sandbox.
        for grant in &grants {
            scrub(response.headers_mut(), grant);
        }
        response
    }
}

/// TRACE and TRACK (IIS's) answer with the request as the upstream received it, injected
/// header included. Compared without case: methods are case-sensitive, upstreams not always.
fn echoes_request(method: &Method) -> bool {
    let name = method.as_str();
    name.eq_ignore_ascii_case("TRACE") || name.eq_ignore_ascii_case("TRACK")
}

/// Replaces the grant's secret in every header value with its placeholder (or a marker).
fn scrub(headers: &mut HeaderMap, grant: &Grant) {
    let shown = grant.placeholder.as_deref().unwrap_or("[credential removed by the space gateway]");
    for value in headers.values_mut() {
        if let Some(scrubbed) = replace_bytes(value.as_bytes(), grant.secret.as_bytes(), shown.as_bytes())
            && let Ok(scrubbed) = HeaderValue::from_bytes(&scrubbed)
        {
            *value = scrubbed;
        }
    }
}

/// Sets the grant's header, replacing whatever the sandbox sent under that name (the
/// placeholder, typically): that is the only place the placeholder becomes the secret. A
/// placeholder in any other header stays as it is: swapped there, the secret would go where
/// the upstream reflects it (`User-Agent` and `Cookie` into logs, error pages, `Set-Cookie`)
/// or under a name the sandbox chose. Errors never contain the secret.
pub(crate) fn inject(headers: &mut HeaderMap, grant: &Grant) -> Result<(), String> {
    let bad = || format!("credential {} makes an invalid header", grant.credential);
    let name = HeaderName::from_bytes(grant.header_name.trim().as_bytes()).map_err(|_| bad())?;
    let mut value = HeaderValue::from_str(&grant.header_value).map_err(|_| bad())?;
    value.set_sensitive(true);
    headers.insert(name, value);
    Ok(())
}

/// `haystack` with every `needle` replaced, or `None` when there is none.
fn replace_bytes(haystack: &[u8], needle: &[u8], replacement: &[u8]) -> Option<Vec<u8>> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    let mut out = Vec::with_capacity(haystack.len() + replacement.len());
    let mut i = 0;
    let mut found = false;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(replacement);
            i += needle.len();
            found = true;
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    found.then_some(out)
}

/// Token buckets per credential (by id): `limit` injections per minute, refilled evenly. The
/// limit is the credential's, not a session's: keyed by session, every fork (or any other
/// session granted it) would get a fresh allowance and multiply the rate the upstream sees.
#[derive(Default)]
pub(crate) struct RateLimits {
    buckets: Mutex<HashMap<CredentialId, Bucket>>,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Buckets kept before idle (full) ones are dropped.
const MAX_BUCKETS: usize = 16 * 1024;

impl RateLimits {
    pub(crate) fn allow(&self, credential: &CredentialId, limit: u32) -> bool {
        self.allow_at(credential, limit, Instant::now())
    }

    fn allow_at(&self, credential: &CredentialId, limit: u32, now: Instant) -> bool {
        let Ok(mut buckets) = self.buckets.lock() else { return false };
        let capacity = f64::from(limit);
        if buckets.len() >= MAX_BUCKETS {
            buckets.retain(|_, b| now.saturating_duration_since(b.last).as_secs() < 60);
        }
        let bucket = buckets.entry(credential.clone()).or_insert(Bucket { tokens: capacity, last: now });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * capacity / 60.0).min(capacity);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn grant() -> Grant {
        Grant {
            credential_id: CredentialId::generate(),
            credential: "gh".into(),
            hosts: vec!["api.test".into()],
            header_name: "Authorization".into(),
            header_value: "Bearer s3cret".into(),
            secret: "s3cret".into(),
            placeholder: Some("space-placeholder-gh".into()),
            expires_at: None,
            rate_limit_per_min: None,
            unavailable: None,
        }
    }

    #[test]
    fn the_header_is_set_and_placeholders_swapped() {
        // The credential's own header is set whatever the sandbox sent there (the placeholder
        // or anything else), once.
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("token space-placeholder-gh"));
        headers.append("authorization", HeaderValue::from_static("token mine"));
        inject(&mut headers, &grant()).unwrap();
        assert_eq!(headers.get_all("authorization").iter().count(), 1);
        assert_eq!(headers["authorization"], "Bearer s3cret");
        assert!(headers["authorization"].is_sensitive());

        let mut bad = grant();
        bad.header_value = "line\nbreak".into();
        let err = inject(&mut HeaderMap::new(), &bad).unwrap_err();
        assert!(!err.contains("s3cret"));
    }

    #[test]
    fn placeholders_outside_the_credentials_header_are_left_alone() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("user-agent", "tool/1 space-placeholder-gh"),
            ("cookie", "t=space-placeholder-gh"),
            ("content-type", "text/space-placeholder-gh"),
            ("x-token", "space-placeholder-gh"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        let sent = headers.clone();
        inject(&mut headers, &grant()).unwrap();
        for (name, value) in &sent {
            assert_eq!(&headers[name], value, "{name}");
        }
        let with_secret: Vec<_> = headers.iter().filter(|(_, v)| v.as_bytes().ends_with(b"s3cret")).collect();
        assert_eq!(with_secret.len(), 1);
        assert_eq!(with_secret[0].0, "authorization");
    }

    #[test]
    fn secrets_echoed_in_response_headers_are_scrubbed() {
        let mut headers = HeaderMap::new();
        headers.insert("x-echo", HeaderValue::from_static("Bearer s3cret"));
        scrub(&mut headers, &grant());
        assert_eq!(headers["x-echo"], "Bearer space-placeholder-gh");
    }

    #[test]
    fn replacing_bytes() {
        assert_eq!(replace_bytes(b"xPHy", b"PH", b"secret"), Some(b"xsecrety".to_vec()));
        assert_eq!(replace_bytes(b"abc", b"PH", b"s"), None);
        assert_eq!(replace_bytes(b"abc", b"", b"s"), None);
    }

    #[test]
    fn rate_limits_refill_over_time() {
        let limits = RateLimits::default();
        let gh = CredentialId::generate();
        let start = Instant::now();
        assert!(limits.allow_at(&gh, 2, start));
        assert!(limits.allow_at(&gh, 2, start));
        assert!(!limits.allow_at(&gh, 2, start));
        // Another credential has its own bucket, even under the same name in another tenant.
        assert!(limits.allow_at(&CredentialId::generate(), 2, start));
        // 2/min: one token every 30 s.
        assert!(!limits.allow_at(&gh, 2, start + Duration::from_secs(10)));
        assert!(limits.allow_at(&gh, 2, start + Duration::from_secs(31)));
        assert!(!limits.allow_at(&gh, 2, start + Duration::from_secs(32)));
    }
}
