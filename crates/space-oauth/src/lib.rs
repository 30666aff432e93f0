//! The client side of OAuth 2.0 (RFC 6749) for credentials the platform brokers: token
//! requests with the client-credentials, refresh-token and authorization-code grants, and the
//! pieces of a sign-in by a human (PKCE, RFC 7636; `state`).
//!
//! Endpoints are chosen by tenants, so the HTTP client is guarded: `https` only, no
//! redirects, no proxy, answers capped, and (unless the operator allows it) no loopback,
//! private, link-local or reserved address, checked at every connection. What an endpoint
//! answers is hostile input: tokens are checked before anything uses them, and errors quote
//! at most a short printable excerpt.

mod pkce;
mod resolve;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use url::{Host, Url};
use zeroize::Zeroizing;

pub use pkce::{Pkce, authorization_url, random_state};

/// Whole request, connection included.
const TIMEOUT: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest answer read from a token endpoint.
const MAX_RESPONSE: usize = 64 * 1024;
/// Longest token accepted (it goes into a header).
pub const MAX_TOKEN: usize = 8 * 1024;
/// Characters of an endpoint's error quoted at most.
const MAX_QUOTED: usize = 200;

#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// A setting that cannot work (bad URL, private address): the caller's to fix.
    #[error("{0}")]
    Config(String),
    /// The endpoint answered with an OAuth error (RFC 6749 section 5.2), e.g. `invalid_grant`.
    #[error("the token endpoint refused: {error}{}", description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused { error: String, description: Option<String> },
    /// No usable answer: the network, an HTTP error status or an answer that is not a token.
    #[error("{0}")]
    Failed(String),
}

pub type Result<T> = std::result::Result<T, OAuthError>;

/// Where the client may connect.
#[derive(Debug, Clone, Default)]
pub struct NetConfig {
    /// Addresses endpoints may not be at (`None`: anywhere, as an operator may allow).
    pub refused_addresses: Option<fn(IpAddr) -> bool>,
    /// The operator's name overrides, consulted before DNS and not filtered.
    pub resolve: Vec<(String, SocketAddr)>,
    /// Trust roots in addition to the built-in ones, DER-encoded.
    pub extra_roots: Vec<Vec<u8>>,
}

/// How the client proves who it is at the token endpoint (RFC 6749 section 2.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// HTTP Basic with the form-encoded id and secret: what every server must support.
    #[default]
    Basic,
    /// `client_id` and `client_secret` in the form body.
    Post,
}

/// The grant a token request uses.
pub enum Grant<'a> {
    ClientCredentials,
    RefreshToken(&'a str),
    AuthorizationCode { code: &'a str, redirect_uri: &'a str, verifier: &'a str },
}

/// One token request.
pub struct TokenRequest<'a> {
    pub token_url: &'a Url,
    pub client_id: &'a str,
    /// `None` for a public client (PKCE alone).
    pub client_secret: Option<&'a str>,
    pub auth: ClientAuth,
    pub scopes: &'a [String],
    pub grant: Grant<'a>,
}

/// An access token, with a new refresh token when the endpoint rotated it.
pub struct Token {
    pub access_token: Zeroizing<String>,
    /// Seconds from now, when the endpoint said.
    pub expires_in: Option<u64>,
    pub refresh_token: Option<Zeroizing<String>>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("expires_in", &self.expires_in)
            .field("refresh_token", &self.refresh_token.is_some())
            .finish_non_exhaustive()
    }
}

/// A guarded HTTP client for token endpoints.
#[derive(Clone)]
pub struct OAuthClient {
    http: reqwest::Client,
    refused: Option<fn(IpAddr) -> bool>,
}

impl OAuthClient {
    pub fn new(net: &NetConfig) -> Result<OAuthClient> {
        let mut builder = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Some(refused) = net.refused_addresses {
            builder = builder.dns_resolver(Arc::new(resolve::Allowed(refused)));
        }
        for (name, addr) in &net.resolve {
            builder = builder.resolve(name, *addr);
        }
        for der in &net.extra_roots {
            let cert = reqwest::Certificate::from_der(der)
                .map_err(|e| OAuthError::Config(format!("an extra trust root is not a certificate: {e}")))?;
            builder = builder.tls_certs_merge([cert]);
        }
        let http = builder.build().map_err(|e| OAuthError::Config(format!("cannot make an HTTP client: {e}")))?;
        Ok(OAuthClient { http, refused: net.refused_addresses })
    }

    /// `text` as an endpoint: an absolute `https` URL without credentials or fragment, not
    /// at a refused literal address. `what` names it in errors.
    pub fn check_url(&self, what: &str, text: &str) -> Result<Url> {
        let bad = |why: &str| OAuthError::Config(format!("{what} {}: {why}", quote(text)));
        let url = Url::parse(text).map_err(|_| bad("not an absolute URL"))?;
        if url.scheme() != "https" {
            return Err(bad("must be https"));
        }
        if !url.username().is_empty() || url.password().is_some() || url.fragment().is_some() {
            return Err(bad("must have no user name, password or #fragment"));
        }
        let literal = match url.host() {
            Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
            Some(Host::Domain(_)) => return Ok(url),
            None => return Err(bad("has no host")),
        };
        if self.refused.is_some_and(|refused| refused(literal)) {
            return Err(bad("is on a loopback or private network, which the operator does not allow"));
        }
        Ok(url)
    }

    /// Asks the token endpoint for a token.
    pub async fn token(&self, request: &TokenRequest<'_>) -> Result<Token> {
        let mut form: Vec<(&str, &str)> = Vec::new();
        match &request.grant {
            Grant::ClientCredentials => form.push(("grant_type", "client_credentials")),
            Grant::RefreshToken(token) => form.extend([("grant_type", "refresh_token"), ("refresh_token", *token)]),
            Grant::AuthorizationCode { code, redirect_uri, verifier } => form.extend([
                ("grant_type", "authorization_code"),
                ("code", *code),
                ("redirect_uri", *redirect_uri),
                ("code_verifier", *verifier),
            ]),
        }
        let scope = request.scopes.join(" ");
        if !scope.is_empty() && !matches!(request.grant, Grant::AuthorizationCode { .. }) {
            form.push(("scope", &scope));
        }
        let mut builder = self.http.post(request.token_url.clone()).header("accept", "application/json");
        match (request.auth, request.client_secret) {
            (ClientAuth::Basic, Some(secret)) => {
                builder = builder.header("authorization", basic(request.client_id, secret)?)
            }
            (ClientAuth::Post, Some(secret)) => {
                form.extend([("client_id", request.client_id), ("client_secret", secret)])
            }
            (_, None) => form.push(("client_id", request.client_id)),
        }
        let response = builder.form(&form).send().await.map_err(|e| {
            OAuthError::Failed(format!(
                "the token endpoint did not answer ({})",
                if e.is_timeout() { "timed out" } else { "connection failed" }
            ))
        })?;
        let status = response.status();
        let body = read_capped(response).await?;
        parse_answer(status.as_u16(), &body)
    }
}

/// `Basic base64(urlencode(id):urlencode(secret))`, marked sensitive.
fn basic(id: &str, secret: &str) -> Result<reqwest::header::HeaderValue> {
    let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let encoded =
        Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", enc(id), enc(secret))));
    let mut value = reqwest::header::HeaderValue::from_str(&format!("Basic {}", encoded.as_str()))
        .map_err(|_| OAuthError::Config("the client id or secret cannot go in a header".into()))?;
    value.set_sensitive(true);
    Ok(value)
}

async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let chunk = response
            .chunk()
            .await
            .map_err(|_| OAuthError::Failed("the token endpoint's answer was cut short".into()))?;
        let Some(chunk) = chunk else { return Ok(out) };
        if out.len() + chunk.len() > MAX_RESPONSE {
            return Err(OAuthError::Failed(format!("the token endpoint's answer is longer than {MAX_RESPONSE} bytes")));
        }
        out.extend_from_slice(&chunk);
    }
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: String,
    error_description: Option<String>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: Zeroizing<String>,
    token_type: Option<String>,
    expires_in: Option<serde_json::Value>,
    refresh_token: Option<Zeroizing<String>>,
}

/// A token endpoint's answer (status and body) as a token or an error.
pub fn parse_answer(status: u16, body: &[u8]) -> Result<Token> {
    if !(200..300).contains(&status) {
        if let Ok(answer) = serde_json::from_slice::<ErrorAnswer>(body) {
            return Err(OAuthError::Refused {
                error: printable(&answer.error),
                description: answer.error_description.as_deref().map(printable),
            });
        }
        return Err(OAuthError::Failed(format!("the token endpoint answered HTTP {status}")));
    }
    let garbage = |why: &str| OAuthError::Failed(format!("the token endpoint's answer is not a usable token: {why}"));
    let answer: TokenAnswer = serde_json::from_slice(body).map_err(|_| garbage("not a JSON token response"))?;
    if let Some(kind) = &answer.token_type
        && !kind.eq_ignore_ascii_case("bearer")
    {
        return Err(garbage(&format!("token_type {} is not bearer", quote(kind))));
    }
    check_token(&answer.access_token).map_err(|why| garbage(&format!("access_token {why}")))?;
    if let Some(refresh) = &answer.refresh_token {
        check_token(refresh).map_err(|why| garbage(&format!("refresh_token {why}")))?;
    }
    let expires_in = match &answer.expires_in {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(n)) => {
            Some(n.as_u64().ok_or_else(|| garbage("expires_in is not a whole number of seconds"))?)
        }
        // Some servers send it as a string.
        Some(serde_json::Value::String(s)) => Some(s.parse().map_err(|_| garbage("expires_in is not a number"))?),
        Some(_) => return Err(garbage("expires_in is not a number")),
    };
    Ok(Token { access_token: answer.access_token, expires_in, refresh_token: answer.refresh_token })
}

/// Non-empty, at most [`MAX_TOKEN`] bytes, visible ASCII only (it goes into a header).
pub fn check_token(token: &str) -> std::result::Result<(), &'static str> {
    if token.is_empty() {
        return Err("is empty");
    }
    if token.len() > MAX_TOKEN {
        return Err("is too long");
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("has characters a header cannot hold");
    }
    Ok(())
}

/// At most [`MAX_QUOTED`] printable characters.
fn printable(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(MAX_QUOTED).collect()
}

fn quote(s: &str) -> String {
    format!("{:?}", printable(s))
}

#[cfg(test)]
mod tests;
