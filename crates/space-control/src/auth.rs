//! Bearer API keys. A key is `sk_` + 32 random bytes in hex; only its SHA-256 is stored.

use std::path::Path;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use rand::RngCore;
use sha2::{Digest, Sha256};
use space_api::{ErrorCode, KeyId, TenantId};
use space_store::{KeyRecord, LAST_USED_RESOLUTION_MS, NewKey, Store, now_ms};

use crate::AppState;
use crate::error::AppError;

/// Who is calling; inserted into request extensions by [`require_key`].
#[derive(Debug, Clone)]
pub struct Caller {
    pub tenant_id: TenantId,
    pub tenant: String,
    pub admin: bool,
    /// A session-scoped token's limits (see [`crate::scope`]); `None` for a tenant's key.
    pub scope: Option<space_api::SessionScope>,
}

impl Caller {
    /// The platform acting on a tenant's sessions for the operator (a drain): it sees and
    /// touches what that tenant may, nothing more.
    pub(crate) fn acting_for(tenant_id: TenantId) -> Caller {
        Caller { tenant_id, tenant: "(drain)".into(), admin: false, scope: None }
    }
}

pub const ADMIN_TENANT: &str = "admin";

/// The caller of an admin-only endpoint. Extracting it refuses other callers with 403, and
/// only looks at what [`require_key`] found: nothing of the request is read or checked
/// before it is known that the caller may make it.
#[derive(Debug, Clone)]
pub struct Admin(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Admin {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, AppError> {
        let caller = parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| AppError::internal("an admin-only route is outside the API key middleware"))?;
        if !caller.admin {
            return Err(AppError::new(
                ErrorCode::Forbidden,
                "only the admin key (DATA_DIR/admin.key) can do this: keys, templates and the warm pool are \
                 the operator's; ask the server's operator",
            ));
        }
        Ok(Admin(caller))
    }
}

pub fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("sk_{}", hex::encode(bytes))
}

pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// What a new key is for: its tenant, whether it is an admin key, its name and lifetime.
#[derive(Debug, Clone, Copy)]
pub struct KeySpec<'a> {
    pub tenant: &'a str,
    pub admin: bool,
    pub name: Option<&'a str>,
    /// How long it works, in milliseconds from its creation; `None`: for ever.
    pub lifetime_ms: Option<i64>,
    /// For a session-scoped token: what it may touch.
    pub scope: Option<&'a space_api::SessionScope>,
}

/// Creates a key for `spec.tenant` (creating the tenant if needed); returns the secret and
/// the key as stored.
pub async fn create_key(store: &Store, spec: KeySpec<'_>) -> Result<(String, KeyRecord), AppError> {
    let tenant_id = store.ensure_tenant(spec.tenant).await?;
    let key = generate_key();
    let hash = hash_key(&key);
    let created_at = now_ms();
    let new = NewKey {
        id: KeyId::generate(),
        hash: &hash,
        tenant_id: &tenant_id,
        admin: spec.admin,
        name: spec.name,
        created_at,
        expires_at: spec.lifetime_ms.map(|ms| created_at.saturating_add(ms)),
        scope: spec.scope,
    };
    Ok((key, store.insert_key(&new).await?))
}

/// Replaces key `old` by a new one of the same tenant, name and kind whose lifetime is as
/// long as the old one's was (none if it had none); the old key is revoked in the same
/// transaction. Returns `None` if `old` is already revoked.
pub async fn rotate_key(store: &Store, old: &KeyRecord) -> Result<Option<(String, KeyRecord)>, AppError> {
    let key = generate_key();
    let hash = hash_key(&key);
    let created_at = now_ms();
    let new = NewKey {
        id: KeyId::generate(),
        hash: &hash,
        tenant_id: &old.tenant_id,
        admin: old.admin,
        name: old.name.as_deref(),
        created_at,
        expires_at: old.expires_at.map(|at| created_at + (at - old.created_at).max(0)),
        scope: old.scope.as_ref(),
    };
    Ok(store.rotate_key(&old.id, &new).await?.map(|record| (key, record)))
}

/// On first start, creates the admin key and writes it to `path` (mode 0600).
pub async fn bootstrap_admin_key(store: &Store, path: &Path) -> Result<(), AppError> {
    if store.count_admin_keys().await? > 0 && path.exists() {
        return Ok(());
    }
    let spec = KeySpec { tenant: ADMIN_TENANT, admin: true, name: Some("admin"), lifetime_ms: None, scope: None };
    let (key, _) = create_key(store, spec).await?;
    write_secret(path, &key).map_err(|e| AppError::internal(format!("writing {}: {e}", path.display())))
}

/// After admin key `old` was rotated to `new`: if `path` (DATA_DIR/admin.key) held `old`,
/// writes `new` there, so the CLI, which reads that file, keeps working. Returns whether it
/// did; a file holding another key is left alone.
pub async fn follow_admin_rotation(store: &Store, path: &Path, old: &KeyId, new: &str) -> Result<bool, AppError> {
    let current = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(AppError::internal(format!("reading {}: {e}", path.display()))),
    };
    let held = store.find_key(&hash_key(current.trim())).await?;
    if held.is_none_or(|k| k.id != *old) {
        return Ok(false);
    }
    write_secret(path, new).map_err(|e| AppError::internal(format!("writing {}: {e}", path.display())))?;
    Ok(true)
}

fn write_secret(path: &Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(format!("{secret}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Middleware: resolves the bearer key to a [`Caller`] or answers 401: `unauthorized` for
/// a missing or unknown key, `key_revoked` and `key_expired` for keys that no longer work.
/// Keys are looked up on every request (nothing caches them), so a revocation takes effect
/// on the very next request. The key's last use is written at most once a minute.
pub async fn require_key(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, AppError> {
    let key = bearer_key(request.headers()).ok_or_else(|| {
        AppError::new(
            ErrorCode::Unauthorized,
            "missing API key: send `Authorization: Bearer <key>` (the admin key is in DATA_DIR/admin.key)",
        )
    })?;
    let caller = caller_of_key(&state, key).await?;
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

/// The key of an `Authorization: Bearer <key>` header, if the request has one.
pub fn bearer_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    let header = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    header.and_then(|h| h.strip_prefix("Bearer ")).map(str::trim)
}

/// Whose `key` is, or 401 (unknown, revoked or expired).
pub async fn caller_of_key(state: &AppState, key: &str) -> Result<Caller, AppError> {
    let found = state.store.find_key(&hash_key(key)).await?.ok_or_else(|| {
        AppError::new(ErrorCode::Unauthorized, "unknown API key; create one with `space key create --tenant NAME`")
    })?;
    let now = now_ms();
    check_in_effect(&found, now)?;
    if found.last_used_at.is_none_or(|at| at <= now - LAST_USED_RESOLUTION_MS) {
        state.store.touch_key(&found.id, now).await?;
    }
    Ok(Caller { tenant_id: found.tenant_id, tenant: found.tenant, admin: found.admin, scope: found.scope })
}

/// [`caller_of_key`] for the endpoints outside the `/v1` API (E2B's, envd's, the port
/// proxy): a session-scoped token is refused there (403), its scope being checked on `/v1`
/// routes only.
pub async fn tenant_caller_of_key(state: &AppState, key: &str) -> Result<Caller, AppError> {
    let caller = caller_of_key(state, key).await?;
    if caller.scope.is_some() {
        return Err(AppError::new(
            ErrorCode::Forbidden,
            "a session-scoped token works on the space API (/v1/sessions/…) within its scope only; use a tenant's \
             API key here",
        ));
    }
    Ok(caller)
}

/// 401 for a key that was revoked or has expired.
fn check_in_effect(key: &KeyRecord, now: i64) -> Result<(), AppError> {
    if key.revoked_at.is_some() {
        return Err(AppError::new(
            ErrorCode::KeyRevoked,
            format!(
                "API key {} was revoked; use another key of tenant {} (a rotation prints the key that replaces \
                 the one it revokes), or ask the admin for a new one (`space key create --tenant {}`)",
                key.id, key.tenant, key.tenant
            ),
        ));
    }
    if key.expired_at(now) {
        return Err(AppError::new(
            ErrorCode::KeyExpired,
            format!(
                "API key {} has expired; ask the admin to rotate it (`space key rotate {}`) or to create a new one \
                 (`space key create --tenant {}`)",
                key.id, key.id, key.tenant
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_hashed() {
        let a = generate_key();
        assert!(a.starts_with("sk_") && a.len() == 67);
        assert_ne!(a, generate_key());
        assert_eq!(hash_key(&a), hash_key(&a));
        assert_ne!(hash_key(&a), a);
    }
}
