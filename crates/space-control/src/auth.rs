//! Bearer API keys. A key is `sk_` + 32 random bytes in hex; only its SHA-256 is stored.

use std::path::Path;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use rand::RngCore;
use sha2::{Digest, Sha256};
use space_api::{ErrorCode, TenantId};
use space_store::Store;

use crate::AppState;
use crate::error::AppError;

/// Who is calling; inserted into request extensions by [`require_key`].
#[derive(Debug, Clone)]
pub struct Caller {
    pub tenant_id: TenantId,
    pub tenant: String,
    pub admin: bool,
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

/// Creates a key for `tenant` (creating the tenant if needed).
pub async fn create_key(store: &Store, tenant: &str, admin: bool) -> Result<(String, TenantId), AppError> {
    let tenant_id = store.ensure_tenant(tenant).await?;
    let key = generate_key();
    store.insert_key(&hash_key(&key), &tenant_id, admin).await?;
    Ok((key, tenant_id))
}

/// On first start, creates the admin key and writes it to `path` (mode 0600).
pub async fn bootstrap_admin_key(store: &Store, path: &Path) -> Result<(), AppError> {
    if store.count_admin_keys().await? > 0 && path.exists() {
        return Ok(());
    }
    let (key, _) = create_key(store, ADMIN_TENANT, true).await?;
    write_secret(path, &key).map_err(|e| AppError::internal(format!("writing {}: {e}", path.display())))
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

/// Middleware: resolves the bearer key to a [`Caller`] or answers 401.
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

/// Whose `key` is, or 401.
pub async fn caller_of_key(state: &AppState, key: &str) -> Result<Caller, AppError> {
    let owner = state.store.find_key(&hash_key(key)).await?.ok_or_else(|| {
        AppError::new(ErrorCode::Unauthorized, "unknown API key; create one with `space key create --tenant NAME`")
    })?;
    Ok(Caller { tenant_id: owner.tenant_id, tenant: owner.tenant, admin: owner.admin })
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
