//! A key-encryption key in OpenBao's (or HashiCorp Vault's) Transit secrets engine: data keys
//! are sent to `encrypt`/`decrypt`/`rewrap` of a named transit key, which never leaves the
//! KMS. The customer holds it: disabling space's access (a policy, a revoked token), raising
//! the key's minimum decryption version or deleting it makes what was sealed under it
//! unreadable, and restoring it makes it readable again.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use url::Host;
use zeroize::Zeroizing;

use crate::{KeyError, KeyProvider, Result};

/// How long one call to the KMS may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of a KMS response that are read (a wrapped 32-byte key is ~70).
const MAX_RESPONSE: usize = 64 * 1024;
/// Most bytes of a KMS error quoted in messages.
const MAX_QUOTED: usize = 200;
/// Longest mount path and key name.
const MAX_NAME: usize = 128;

/// Where a transit key is and how to reach it.
#[derive(Clone)]
pub struct TransitConfig {
    /// `http(s)://host:port` of the server.
    pub address: String,
    /// Path the transit engine is mounted at (`transit` by default).
    pub mount: String,
    /// The transit key's name.
    pub key: String,
    /// A token allowed to `update` `MOUNT/encrypt/KEY`, `MOUNT/decrypt/KEY` and
    /// `MOUNT/rewrap/KEY`.
    pub token: Zeroizing<String>,
    /// For a key a tenant set (not the operator): addresses the KMS may not be at (e.g.
    /// loopback and private networks, so that a tenant cannot make the control plane call
    /// its neighbours). With it, the address must be `https`, a literal address it refuses
    /// is refused, names are resolved to allowed addresses only at every connection, and
    /// network failures are reported without detail.
    pub refused_addresses: Option<fn(IpAddr) -> bool>,
}

impl std::fmt::Debug for TransitConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransitConfig")
            .field("address", &self.address)
            .field("mount", &self.mount)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// A transit key as a [`KeyProvider`].
pub struct TransitKey {
    config: TransitConfig,
    base: reqwest::Url,
    client: reqwest::Client,
}

impl std::fmt::Debug for TransitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransitKey").field("config", &self.config).finish_non_exhaustive()
    }
}

fn check_name(what: &str, name: &str, slashes: bool) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('/')
        && !name.ends_with('/')
        && !name.split('/').any(|part| part.is_empty() || part == "." || part == "..")
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') || (slashes && b == b'/'));
    if valid {
        return Ok(());
    }
    Err(KeyError::Config(format!(
        "invalid transit {what} {name:?}: use 1-{MAX_NAME} letters, digits, '-', '_' or '.'{}",
        if slashes { " (path segments separated by '/')" } else { "" }
    )))
}

impl TransitConfig {
    /// Refuses settings that cannot name a transit key: an address that is not an http(s)
    /// URL of a host (no path, query or credentials), a mount or key name with characters
    /// that would change the request's path, an empty token.
    pub fn validate(&self) -> Result<reqwest::Url> {
        let url = reqwest::Url::parse(&self.address)
            .map_err(|e| KeyError::Config(format!("the address {:?} is not a URL: {e}", self.address)))?;
        let plain = matches!(url.scheme(), "http" | "https")
            && url.host().is_some()
            && url.username().is_empty()
            && url.password().is_none()
            && url.path() == "/"
            && url.query().is_none()
            && url.fragment().is_none();
        if !plain {
            return Err(KeyError::Config(format!(
                "the address {:?} must be http(s)://HOST[:PORT] with nothing after it",
                self.address
            )));
        }
        if let Some(refused) = self.refused_addresses {
            if url.scheme() != "https" {
                return Err(KeyError::Config(format!("the address {:?} must be https", self.address)));
            }
            let literal = match url.host() {
                Some(Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
                Some(Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
                _ => None,
            };
            if literal.is_some_and(refused) {
                return Err(KeyError::Config(format!(
                    "the address {:?} is on a loopback or private network, which a tenant's key may not be at",
                    self.address
                )));
            }
        }
        check_name("mount", &self.mount, true)?;
        check_name("key name", &self.key, false)?;
        if self.token.trim().is_empty() || self.token.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(KeyError::Config("the token must be a non-empty printable string".into()));
        }
        Ok(url)
    }
}

impl TransitKey {
    pub fn new(config: TransitConfig) -> Result<TransitKey> {
        let base = config.validate()?;
        let mut builder = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Some(refused) = config.refused_addresses {
            builder = builder.dns_resolver(Arc::new(Allowed(refused)));
        }
        let client = builder.build().map_err(|e| KeyError::Config(format!("cannot make an HTTP client: {e}")))?;
        Ok(TransitKey { config, base, client })
    }

    fn unavailable(&self, why: String) -> KeyError {
        KeyError::Unavailable { key: self.describe(), why }
    }

    /// POSTs `body` to `MOUNT/OP/KEY` and returns the response's `data.FIELD`.
    async fn call(&self, op: &str, body: serde_json::Value, field: &str) -> Result<String> {
        let url = self
            .base
            .join(&format!("v1/{}/{op}/{}", self.config.mount, self.config.key))
            .map_err(|e| KeyError::Config(format!("cannot form the transit URL: {e}")))?;
        let mut token = reqwest::header::HeaderValue::from_str(self.config.token.as_str())
            .map_err(|_| KeyError::Config("the token is not a valid header value".into()))?;
        token.set_sensitive(true);
        let response = self
            .client
            .post(url)
            .header("X-Vault-Token", token)
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| self.unavailable(format!("the KMS did not answer ({})", self.network_error(&e))))?;
        let status = response.status();
        let bytes = read_capped(response).await.map_err(|e| self.unavailable(format!("reading its answer: {e}")))?;
        if !status.is_success() {
            return Err(self.refused(op, status, &bytes));
        }
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| KeyError::Crypto(format!("{}: its {op} answer is not JSON: {e}", self.describe())))?;
        value["data"][field]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| KeyError::Crypto(format!("{}: its {op} answer has no data.{field}", self.describe())))
    }

    /// The error for a KMS that answered `status`: a refusal of the key (403, a key not
    /// found, a version below the key's minimum) makes the key unavailable; a decryption
    /// that fails otherwise means the data key was wrapped by another key.
    fn refused(&self, op: &str, status: reqwest::StatusCode, body: &[u8]) -> KeyError {
        let errors = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| {
                v["errors"].as_array().map(|e| e.iter().filter_map(|s| s.as_str()).collect::<Vec<_>>().join("; "))
            })
            .unwrap_or_default();
        let quoted = printable(&errors);
        let lower = errors.to_ascii_lowercase();
        if status == reqwest::StatusCode::FORBIDDEN {
            return self.unavailable(format!(
                "the KMS refused to {op} (403 {quoted}): the key was revoked or space's access to it removed"
            ));
        }
        // 401: no such token; 404: no transit engine at the mount (or no such route).
        let gone = matches!(status.as_u16(), 401 | 404);
        if gone
            || lower.contains("key not found")
            || lower.contains("too old")
            || lower.contains("not allowed by the policy")
        {
            return self.unavailable(format!("the KMS refused to {op} ({} {quoted})", status.as_u16()));
        }
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return self.unavailable(format!("the KMS failed ({} {quoted}); try again", status.as_u16()));
        }
        if op != "encrypt" && status == reqwest::StatusCode::BAD_REQUEST {
            return KeyError::WrongKey { key: self.describe() };
        }
        KeyError::Crypto(format!("{}: {op} failed ({} {quoted})", self.describe(), status.as_u16()))
    }
}

impl TransitKey {
    /// What went wrong on the network: in full for the operator's keys, only its kind for a
    /// tenant's (whose address could otherwise be used to probe the network).
    fn network_error(&self, e: &reqwest::Error) -> String {
        if self.config.refused_addresses.is_none() {
            return error_chain(e);
        }
        let kind = if e.is_timeout() {
            "timed out"
        } else if e.is_connect() {
            "could not connect"
        } else {
            "the request failed"
        };
        kind.to_owned()
    }
}

/// Resolves names to the addresses a filter allows only, at every connection (so a name
/// that later resolves elsewhere is checked again).
struct Allowed(fn(IpAddr) -> bool);

impl reqwest::dns::Resolve for Allowed {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let refused = self.0;
        Box::pin(async move {
            let found = tokio::net::lookup_host((name.as_str(), 0)).await?;
            let allowed: Vec<SocketAddr> = found.filter(|a| !refused(a.ip())).collect();
            if allowed.is_empty() {
                let why = format!("{} resolves to no address a tenant's key may be at", name.as_str());
                return Err(why.into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The error and its sources, for "connection refused" and the like.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// At most [`MAX_QUOTED`] printable characters of what a KMS said.
fn printable(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(MAX_QUOTED).collect()
}

async fn read_capped(mut response: reqwest::Response) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| error_chain(&e))? {
        if out.len() + chunk.len() > MAX_RESPONSE {
            return Err(format!("longer than {MAX_RESPONSE} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn ciphertext(wrapped: &[u8]) -> Result<&str> {
    std::str::from_utf8(wrapped).map_err(|_| KeyError::Crypto("a transit-wrapped key is not text".into()))
}

#[async_trait::async_trait]
impl KeyProvider for TransitKey {
    async fn wrap(&self, data_key: &[u8]) -> Result<Vec<u8>> {
        let body = serde_json::json!({ "plaintext": BASE64.encode(data_key) });
        Ok(self.call("encrypt", body, "ciphertext").await?.into_bytes())
    }

    async fn unwrap(&self, wrapped: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
        let body = serde_json::json!({ "ciphertext": ciphertext(wrapped)? });
        let plaintext = Zeroizing::new(self.call("decrypt", body, "plaintext").await?);
        BASE64
            .decode(plaintext.as_bytes())
            .map(Zeroizing::new)
            .map_err(|_| KeyError::Crypto(format!("{}: its decrypt answer is not base64", self.describe())))
    }

    async fn rewrap(&self, wrapped: &[u8]) -> Result<Vec<u8>> {
        let body = serde_json::json!({ "ciphertext": ciphertext(wrapped)? });
        Ok(self.call("rewrap", body, "ciphertext").await?.into_bytes())
    }

    fn describe(&self) -> String {
        format!("the transit key {:?} at {} (mount {:?})", self.config.key, self.config.address, self.config.mount)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(address: &str, mount: &str, key: &str) -> TransitConfig {
        TransitConfig {
            address: address.into(),
            mount: mount.into(),
            key: key.into(),
            token: Zeroizing::new("s.token".into()),
            refused_addresses: None,
        }
    }

    #[test]
    fn settings_that_would_change_the_request_are_refused() {
        assert!(config("http://127.0.0.1:8200", "transit", "tenant-a").validate().is_ok());
        assert!(config("https://kms.example.com", "kms/transit", "k.1").validate().is_ok());
        for (address, mount, key) in [
            ("ftp://127.0.0.1", "transit", "k"),
            ("http://127.0.0.1/v1", "transit", "k"),
            ("http://user:pw@127.0.0.1", "transit", "k"),
            ("http://127.0.0.1?x=1", "transit", "k"),
            ("not a url", "transit", "k"),
            ("http://127.0.0.1", "../sys", "k"),
            ("http://127.0.0.1", "/transit", "k"),
            ("http://127.0.0.1", "transit", "a/b"),
            ("http://127.0.0.1", "transit", ".."),
            ("http://127.0.0.1", "transit", "k?x"),
            ("http://127.0.0.1", "transit", ""),
        ] {
            let err = config(address, mount, key).validate().unwrap_err();
            assert!(matches!(err, KeyError::Config(_)), "{address} {mount} {key}: {err}");
        }
        let mut no_token = config("http://127.0.0.1", "transit", "k");
        no_token.token = Zeroizing::new(" ".into());
        assert!(no_token.validate().is_err());
    }

    /// A tenant's key may not be at a loopback or private address, nor over plain HTTP.
    #[test]
    fn a_tenants_key_is_refused_at_private_addresses() {
        let private = |ip: IpAddr| ip.is_loopback() || matches!(ip, IpAddr::V4(v4) if v4.is_private());
        let tenant =
            |address: &str| TransitConfig { refused_addresses: Some(private), ..config(address, "transit", "k") };
        assert!(tenant("https://kms.example.com").validate().is_ok());
        assert!(tenant("https://8.8.8.8:8200").validate().is_ok());
        for address in ["http://kms.example.com", "https://127.0.0.1:8200", "https://10.1.2.3", "https://[::1]:8200"] {
            let err = tenant(address).validate().unwrap_err();
            assert!(matches!(err, KeyError::Config(_)), "{address}: {err}");
        }
    }

    /// A name resolves to allowed addresses only: `localhost` for a tenant's key finds none.
    #[tokio::test]
    async fn a_tenants_key_does_not_reach_a_name_that_resolves_to_loopback() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let loopback = |ip: IpAddr| ip.is_loopback();
        let config = TransitConfig {
            refused_addresses: Some(loopback),
            ..config(&format!("https://localhost:{port}"), "transit", "k")
        };
        let key = TransitKey::new(config).unwrap();
        let err = key.wrap(&[0; 32]).await.unwrap_err();
        assert!(matches!(err, KeyError::Unavailable { .. }), "{err}");
        assert!(!err.to_string().contains("localhost resolves"), "no detail for a tenant's key: {err}");
        listener.set_nonblocking(true).unwrap();
        assert!(listener.accept().is_err(), "nothing connected");
    }

    #[test]
    fn the_token_is_never_shown() {
        let key = TransitKey::new(config("http://127.0.0.1:8200", "transit", "k")).unwrap();
        assert!(!format!("{key:?}").contains("s.token"));
        assert!(!key.describe().contains("s.token"));
    }

    /// A KMS that is not there is a retryable "unavailable", not a wrong key.
    #[tokio::test]
    async fn an_unreachable_kms_is_unavailable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let key = TransitKey::new(config(&format!("http://127.0.0.1:{port}"), "transit", "k")).unwrap();
        let err = key.wrap(&[0; 32]).await.unwrap_err();
        assert!(matches!(err, KeyError::Unavailable { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("did not answer") && message.contains("\"k\""), "{message}");
    }
}
