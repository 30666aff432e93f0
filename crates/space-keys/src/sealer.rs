//! Envelope encryption of values under one key provider, and the sealed layout.
//!
//! Sealed layout (version 2):
//! `0x02 | key ref length (u8) | key ref | wrapped key length (u16 BE) | wrapped data key |
//! nonce (12) | ciphertext | tag (16)`. The key ref names the key that wrapped the data key
//! (`local`, or a tenant key's id) so that the reader knows whom to ask; it is not
//! authenticated, and needs not be: a value whose ref was changed finds a key that cannot
//! unwrap its data key. Version 1 (`0x01 | wrapped key length | wrapped | body`) was written
//! before there were other keys than the local one, whose ref it implies.
//!
//! The associated data of the body is `0x01 | owner` in both versions, so neither the body
//! nor its owner can be changed without the value failing to open, while the header (which
//! key wraps the data key) can be rewritten without touching the body: that is re-wrapping.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use crate::{KEY_LEN, KeyError, KeyProvider, LocalKeyFile, Result, decrypt, encrypt, random};

/// The sealed-value format this code writes.
pub const SEAL_VERSION: u8 = 2;
/// The key ref of the local key file, and of every value in format version 1.
pub const LOCAL_KEY_REF: &str = "local";
/// The first byte of the body's associated data (it has not changed since version 1).
const BODY_VERSION: u8 = 1;
/// Longest key ref.
const MAX_KEY_REF: usize = 64;
/// Most data keys a sealer keeps unwrapped at once.
const CACHE_ENTRIES: usize = 4096;

/// Envelope encryption of values under a [`KeyProvider`].
///
/// Unwrapped data keys are kept for `cache_ttl` (never longer), so that opening the same
/// value again does not ask the KMS each time; a key revoked in the KMS stops opening data
/// at most that long after. Zero keeps nothing.
#[derive(Clone)]
pub struct Sealer {
    key_ref: String,
    provider: Arc<dyn KeyProvider>,
    cache: Arc<DataKeyCache>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").field("key_ref", &self.key_ref).field("provider", &self.provider.describe()).finish()
    }
}

/// Where a sealed value's parts are.
struct Parsed<'a> {
    key_ref: &'a str,
    wrapped: &'a [u8],
    body: &'a [u8],
}

/// Splits a sealed value; `None` if it is too short for what its header says.
fn parse(sealed: &[u8]) -> Result<Option<Parsed<'_>>> {
    let Some((&version, rest)) = sealed.split_first() else { return Ok(None) };
    let (key_ref, rest) = match version {
        1 => (LOCAL_KEY_REF, rest),
        2 => {
            let Some((&len, rest)) = rest.split_first() else { return Ok(None) };
            let Some((key_ref, rest)) = rest.split_at_checked(usize::from(len)) else { return Ok(None) };
            match std::str::from_utf8(key_ref) {
                Ok(key_ref) => (key_ref, rest),
                Err(_) => return Ok(None),
            }
        }
        other => return Err(KeyError::UnsupportedVersion(other)),
    };
    let Some((len, rest)) = rest.split_at_checked(2) else { return Ok(None) };
    let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
    let Some((wrapped, body)) = rest.split_at_checked(len) else { return Ok(None) };
    Ok(Some(Parsed { key_ref, wrapped, body }))
}

/// The ref of the key that wrapped `sealed`'s data key (see the module's layout).
pub fn key_ref_of(sealed: &[u8]) -> Result<&str> {
    match parse(sealed)? {
        Some(parsed) => Ok(parsed.key_ref),
        None => Err(KeyError::Corrupt { owner: "its owner".into() }),
    }
}

fn assemble(key_ref: &str, wrapped: &[u8], body: &[u8]) -> Result<Vec<u8>> {
    let ref_len =
        u8::try_from(key_ref.len()).map_err(|_| KeyError::Crypto(format!("key ref {key_ref:?} is too long")))?;
    let wrapped_len = u16::try_from(wrapped.len())
        .map_err(|_| KeyError::Crypto(format!("wrapped key of {} bytes is too long", wrapped.len())))?;
    let mut out = Vec::with_capacity(4 + key_ref.len() + wrapped.len() + body.len());
    out.push(SEAL_VERSION);
    out.push(ref_len);
    out.extend_from_slice(key_ref.as_bytes());
    out.extend_from_slice(&wrapped_len.to_be_bytes());
    out.extend_from_slice(wrapped);
    out.extend_from_slice(body);
    Ok(out)
}

impl Sealer {
    /// A sealer whose values name `key_ref` (1-64 printable ASCII bytes) as their key.
    pub fn new(key_ref: &str, provider: Arc<dyn KeyProvider>, cache_ttl: Duration) -> Result<Sealer> {
        let valid =
            !key_ref.is_empty() && key_ref.len() <= MAX_KEY_REF && key_ref.bytes().all(|b| b.is_ascii_graphic());
        if !valid {
            return Err(KeyError::Config(format!("invalid key ref {key_ref:?}")));
        }
        Ok(Sealer { key_ref: key_ref.to_owned(), provider, cache: Arc::new(DataKeyCache::new(cache_ttl)) })
    }

    /// A sealer over the local key file at `path` (created if missing). Nothing is cached:
    /// the key is in memory already.
    pub fn local(path: &std::path::Path) -> Result<Sealer> {
        Sealer::new(LOCAL_KEY_REF, Arc::new(LocalKeyFile::open_or_create(path)?), Duration::ZERO)
    }

    pub fn describe(&self) -> String {
        self.provider.describe()
    }

    pub fn key_ref(&self) -> &str {
        &self.key_ref
    }

    /// Encrypts `plaintext` under a fresh data key, bound to `owner` (which must be given
    /// again to open it: e.g. `tenant/credential-id`).
    pub async fn seal(&self, plaintext: &[u8], owner: &str) -> Result<Vec<u8>> {
        let data_key = Zeroizing::new(random::<KEY_LEN>()?);
        let wrapped = self.provider.wrap(&data_key[..]).await?;
        let body = encrypt(&data_key[..], plaintext, &aad(owner))?;
        assemble(&self.key_ref, &wrapped, &body)
    }

    /// Decrypts a value sealed by [`Sealer::seal`] for the same `owner`.
    pub async fn open(&self, sealed: &[u8], owner: &str) -> Result<Zeroizing<Vec<u8>>> {
        let corrupt = || KeyError::Corrupt { owner: owner.to_owned() };
        let parsed = parse(sealed)?.ok_or_else(corrupt)?;
        if parsed.key_ref != self.key_ref {
            return Err(KeyError::WrongKey { key: self.describe() });
        }
        let data_key = self.unwrap(parsed.wrapped).await?;
        decrypt(&data_key, parsed.body, &aad(owner))?.ok_or_else(corrupt)
    }

    /// `sealed` (whose data key this sealer wraps) with its data key wrapped by `to` instead,
    /// the body unchanged. With `to` this sealer's own key, the data key is wrapped again by
    /// the key's newest version (after a rotation in the KMS).
    pub async fn rewrap(&self, sealed: &[u8], to: &Sealer) -> Result<Vec<u8>> {
        let parsed = parse(sealed)?.ok_or_else(|| KeyError::Corrupt { owner: "its owner".into() })?;
        if parsed.key_ref != self.key_ref {
            return Err(KeyError::WrongKey { key: self.describe() });
        }
        let wrapped = if to.key_ref == self.key_ref {
            self.provider.rewrap(parsed.wrapped).await?
        } else {
            let data_key = self.unwrap(parsed.wrapped).await?;
            to.provider.wrap(&data_key).await?
        };
        assemble(&to.key_ref, &wrapped, parsed.body)
    }

    /// Wraps and unwraps a fresh data key: the key is usable (reachable, permitted, the
    /// right kind) for both directions.
    pub async fn check(&self) -> Result<()> {
        let data_key = Zeroizing::new(random::<KEY_LEN>()?);
        let wrapped = self.provider.wrap(&data_key[..]).await?;
        let back = self.provider.unwrap(&wrapped).await?;
        if back[..] != data_key[..] {
            return Err(KeyError::Crypto(format!("{} returned another key than it was given", self.describe())));
        }
        Ok(())
    }

    /// Drops the data keys kept longer than the cache's TTL. Called by every use of the
    /// cache; call it periodically too, so that none outlives the TTL while the sealer idles.
    pub fn forget_expired(&self) {
        DataKeyCache::forget_expired(&mut self.cache.lock(), self.cache.ttl);
    }

    async fn unwrap(&self, wrapped: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
        if let Some(key) = self.cache.get(wrapped) {
            return Ok(key);
        }
        let key = self.provider.unwrap(wrapped).await?;
        self.cache.put(wrapped, &key);
        Ok(key)
    }
}

fn aad(owner: &str) -> Vec<u8> {
    let mut aad = vec![BODY_VERSION];
    aad.extend_from_slice(owner.as_bytes());
    aad
}

/// Unwrapped data keys by their wrapped form, with when each was unwrapped.
type Entries = HashMap<Vec<u8>, (Instant, Zeroizing<Vec<u8>>)>;

/// Data keys unwrapped recently, by their wrapped form, each kept for at most the TTL (an
/// expired key is dropped at the next use of the cache: see [`Sealer::forget_expired`]).
struct DataKeyCache {
    ttl: Duration,
    entries: Mutex<Entries>,
}

impl DataKeyCache {
    fn new(ttl: Duration) -> DataKeyCache {
        DataKeyCache { ttl, entries: Mutex::new(HashMap::new()) }
    }

    /// The cache's map. A panic while it was held leaves at worst a missing entry: the
    /// poisoned map is as good as any.
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn get(&self, wrapped: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        if self.ttl.is_zero() {
            return None;
        }
        let mut entries = self.lock();
        Self::forget_expired(&mut entries, self.ttl);
        entries.get(wrapped).map(|(_, key)| key.clone())
    }

    /// Drops (and zeroes) every key older than `ttl`: none is kept in memory longer.
    fn forget_expired(entries: &mut Entries, ttl: Duration) {
        entries.retain(|_, (at, _)| at.elapsed() < ttl);
    }

    fn put(&self, wrapped: &[u8], key: &Zeroizing<Vec<u8>>) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.lock();
        Self::forget_expired(&mut entries, self.ttl);
        if entries.len() >= CACHE_ENTRIES {
            entries.clear();
        }
        entries.insert(wrapped.to_vec(), (Instant::now(), key.clone()));
    }
}

#[cfg(test)]
#[path = "sealer_tests.rs"]
mod tests;
