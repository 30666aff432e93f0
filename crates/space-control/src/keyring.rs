//! Which key seals what: the server's local key file, and each tenant's own key in its KMS
//! (BYOK, docs/byok.md). A sealed value names the key that wraps its data key (see
//! [`space_keys::Sealer`]), so it is opened by that key whatever the tenant uses now; new
//! values are sealed with the tenant's current key. Changing or rotating a tenant's key
//! re-wraps the data keys of what is sealed for it, without re-encrypting the data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use space_api::{ErrorCode, TenantId, TenantKeyId};
use space_keys::{KeyError, LOCAL_KEY_REF, Sealer, TransitConfig, TransitKey, Zeroizing, key_ref_of};
use space_store::{Store, TenantKeyRecord};

use crate::error::{AppError, AppResult};

/// The one provider tenant keys have so far.
pub const OPENBAO: &str = "openbao";

/// The local key and the tenants' keys, with their data-key caches.
pub struct Keyring {
    local: Sealer,
    store: Store,
    /// How long an unwrapped data key of a tenant key is kept (`space serve --key-cache-ttl`).
    cache_ttl: Duration,
    /// Sealers of tenant keys used so far, by id (a stored key never changes).
    tenant_sealers: Mutex<HashMap<TenantKeyId, Sealer>>,
    /// Held by each change of a tenant's key (set, rotate), so that two in this replica do
    /// not move the tenant's values to two keys at once.
    changes: Mutex<HashMap<TenantId, Arc<tokio::sync::Mutex<()>>>>,
}

/// What moving a tenant's values to a key did.
#[derive(Debug, Default)]
pub struct Moved {
    /// Values whose data keys are now wrapped by the key.
    pub rewrapped: u64,
    /// Values of the tenant still under another key afterwards (sealed meanwhile, changed
    /// while being moved, or whose key could not unwrap them).
    pub remaining: u64,
    /// Why the first value that could not be moved was not.
    pub failure: Option<AppError>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("local", &self.local)
            .field("cache_ttl", &self.cache_ttl)
            .finish_non_exhaustive()
    }
}

/// The API error for a key that fails: an unusable key is `key_unavailable` (503), a bad
/// setting 400, anything else a fault of the server.
pub fn key_error(e: KeyError) -> AppError {
    match e {
        KeyError::Unavailable { .. } => AppError::new(ErrorCode::KeyUnavailable, e.to_string()),
        KeyError::Config(_) => AppError::bad_request(e.to_string()),
        e => AppError::internal(e.to_string()),
    }
}

/// The addresses a tenant's endpoint (a key it set, an OAuth token endpoint) may not be at:
/// none when `public_only` is off (the operator's choice), else what the gateway refuses for
/// upstreams: loopback, private, link-local and reserved ranges and this host's own addresses.
pub fn refused_addresses(public_only: bool) -> Option<fn(std::net::IpAddr) -> bool> {
    public_only.then_some(refused_for_tenants as fn(std::net::IpAddr) -> bool)
}

fn refused_for_tenants(ip: std::net::IpAddr) -> bool {
    space_gateway::is_private(ip) || space_gateway::is_host_address(ip)
}

/// Associated data that binds a tenant key's sealed token to it.
fn token_owner(key: &TenantKeyRecord) -> String {
    format!("tenant-key-token/{}/{}", key.tenant_id, key.id)
}

impl Keyring {
    pub fn new(local: Sealer, store: Store, cache_ttl: Duration) -> Keyring {
        Keyring { local, store, cache_ttl, tenant_sealers: Mutex::default(), changes: Mutex::default() }
    }

    /// The server's local key: what is not a tenant's (the database's canary, the
    /// idempotency digest key, tenant keys' tokens) and tenants without a key of their own.
    pub fn local(&self) -> &Sealer {
        &self.local
    }

    /// A poisoned map is as good as any: entries are only inserted whole.
    fn sealers(&self) -> std::sync::MutexGuard<'_, HashMap<TenantKeyId, Sealer>> {
        self.tenant_sealers.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Held while the tenant's key changes (see [`Keyring::move_tenant`]).
    pub async fn lock_tenant(&self, tenant: &TenantId) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut changes = self.changes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            changes.entry(tenant.clone()).or_default().clone()
        };
        lock.lock_owned().await
    }

    /// A sealer for a new tenant key (not stored yet): its transit settings and token.
    pub fn transit_sealer(&self, id: &TenantKeyId, config: TransitConfig) -> AppResult<Sealer> {
        let provider = TransitKey::new(config).map_err(key_error)?;
        Sealer::new(id.as_str(), Arc::new(provider), self.cache_ttl).map_err(key_error)
    }

    /// `key` with its token sealed by the local key, to be stored.
    pub async fn seal_token(&self, key: &TenantKeyRecord, token: &str) -> AppResult<Vec<u8>> {
        self.local.seal(token.as_bytes(), &token_owner(key)).await.map_err(key_error)
    }

    async fn stored_sealer(&self, key: &TenantKeyRecord) -> AppResult<Sealer> {
        if let Some(sealer) = self.sealers().get(&key.id) {
            return Ok(sealer.clone());
        }
        let token = self.local.open(&key.token_sealed, &token_owner(key)).await.map_err(key_error)?;
        let token = String::from_utf8(token.to_vec())
            .map_err(|_| AppError::internal(format!("tenant key {}: its stored token is not text", key.id)))?;
        let config = TransitConfig {
            address: key.address.clone(),
            mount: key.mount.clone(),
            key: key.key_name.clone(),
            token: Zeroizing::new(token),
            refused_addresses: refused_addresses(key.public_only),
        };
        let sealer = self.transit_sealer(&key.id, config)?;
        self.sealers().insert(key.id.clone(), sealer.clone());
        Ok(sealer)
    }

    /// The sealer of the key named `key_ref` (a sealed value's).
    async fn by_ref(&self, key_ref: &str) -> AppResult<Sealer> {
        if key_ref == LOCAL_KEY_REF {
            return Ok(self.local.clone());
        }
        let id: TenantKeyId = key_ref
            .parse()
            .map_err(|_| AppError::internal(format!("a sealed value names an unknown key {key_ref:?}")))?;
        if let Some(sealer) = self.sealers().get(&id) {
            return Ok(sealer.clone());
        }
        let key = self
            .store
            .tenant_key(&id)
            .await?
            .ok_or_else(|| AppError::internal(format!("a sealed value names the key {id}, which is not stored")))?;
        self.stored_sealer(&key).await
    }

    /// What new values of `tenant` are sealed with.
    pub async fn sealer_for(&self, tenant: &TenantId) -> AppResult<Sealer> {
        match self.store.current_tenant_key(tenant).await? {
            Some(key) => self.stored_sealer(&key).await,
            None => Ok(self.local.clone()),
        }
    }

    /// Seals `plaintext` for `owner` with `tenant`'s key.
    pub async fn seal(&self, tenant: &TenantId, plaintext: &[u8], owner: &str) -> AppResult<Vec<u8>> {
        self.sealer_for(tenant).await?.seal(plaintext, owner).await.map_err(key_error)
    }

    /// Opens a value sealed by [`Keyring::seal`] (with whichever key it names).
    pub async fn open(&self, sealed: &[u8], owner: &str) -> AppResult<Zeroizing<Vec<u8>>> {
        let key_ref = key_ref_of(sealed).map_err(key_error)?;
        self.by_ref(key_ref).await?.open(sealed, owner).await.map_err(key_error)
    }

    /// Re-wraps the data keys of what is sealed for `tenant` under `to`: those under other
    /// keys, and with `rotate` those under `to` already (to its newest version). A value
    /// that cannot be moved (its key unavailable, or changed meanwhile) is left as it is,
    /// still readable with its key, and counted in [`Moved::remaining`].
    pub async fn rewrap_tenant(&self, tenant: &TenantId, to: &Sealer, rotate: bool) -> AppResult<Moved> {
        let mut moved = Moved::default();
        for value in self.store.tenant_sealed_values(tenant).await? {
            let key_ref = key_ref_of(&value.sealed).map_err(key_error)?;
            if key_ref == to.key_ref() && !rotate {
                continue;
            }
            let new = match self.by_ref(key_ref).await {
                Ok(from) => from.rewrap(&value.sealed, to).await.map_err(key_error),
                Err(e) => Err(e),
            };
            match new {
                Ok(new) if self.store.replace_sealed(&value.owner, &value.sealed, &new).await? => moved.rewrapped += 1,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(%tenant, error = %e.0.message, "a sealed value stays under its key");
                    moved.failure.get_or_insert(e);
                }
            }
        }
        for value in self.store.tenant_sealed_values(tenant).await? {
            if key_ref_of(&value.sealed).map_or(true, |r| r != to.key_ref()) {
                moved.remaining += 1;
            }
        }
        Ok(moved)
    }

    /// Moves everything sealed for `tenant` to `to` and makes `to` (`None`: the local key)
    /// the key new values are sealed with: values are re-wrapped before the switch (so a
    /// failure leaves them readable), then once more for those sealed meanwhile under the
    /// old key. Once nothing names the tenant's older keys, they are deleted, but for the
    /// one just replaced: a seal that read it as current before the switch may still be
    /// storing a value under it. Call with [`Keyring::lock_tenant`] held.
    pub async fn move_tenant(&self, tenant: &TenantId, to: &Sealer, key: Option<&TenantKeyId>) -> AppResult<Moved> {
        let replaced = self.store.current_tenant_key(tenant).await?.map(|k| k.id);
        let before = self.rewrap_tenant(tenant, to, false).await?;
        self.store.set_tenant_key_ref(tenant, key).await?;
        let mut after = self.rewrap_tenant(tenant, to, false).await?;
        after.rewrapped += before.rewrapped;
        after.failure = after.failure.or(before.failure);
        if after.remaining == 0 {
            self.store.delete_tenant_keys_except(tenant, &[key, replaced.as_ref()]).await?;
        }
        Ok(after)
    }

    /// Drops every data key kept longer than the cache's TTL (see [`Sealer::forget_expired`]).
    pub fn forget_expired(&self) {
        for sealer in self.sealers().values() {
            sealer.forget_expired();
        }
    }
}

/// Drops expired data keys every half TTL, so that none stays in memory much longer than the
/// TTL while nothing uses the cache.
pub fn spawn_forgetting(keys: &Arc<Keyring>) {
    if keys.cache_ttl.is_zero() {
        return;
    }
    let keys = Arc::downgrade(keys);
    tokio::spawn(async move {
        loop {
            let Some(keys) = keys.upgrade() else { return };
            let every = (keys.cache_ttl / 2).max(Duration::from_millis(100));
            keys.forget_expired();
            drop(keys);
            tokio::time::sleep(every).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_endpoints_are_kept_off_private_ranges_and_this_hosts_addresses() {
        let refused = refused_addresses(true).unwrap();
        for ip in ["127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "::ffff:192.168.0.1"] {
            assert!(refused(ip.parse().unwrap()), "{ip}");
        }
        assert!(!refused("203.0.113.7".parse().unwrap()), "a public address elsewhere");
        // Every address of this host, public ones too (a node's API or sshd on its public address).
        let mut seen = 0;
        for interface in nix::ifaddrs::getifaddrs().unwrap() {
            let Some(address) = interface.address else { continue };
            let ip: std::net::IpAddr = match (address.as_sockaddr_in(), address.as_sockaddr_in6()) {
                (Some(v4), _) => v4.ip().into(),
                (_, Some(v6)) => v6.ip().into(),
                _ => continue,
            };
            assert!(refused(ip), "{ip} is this host's");
            assert!(space_gateway::is_host_address(ip), "{ip} is this host's");
            seen += 1;
        }
        assert!(seen > 0, "no address of this host was checked");
        assert!(refused_addresses(false).is_none(), "the operator's own choice");
    }
}
