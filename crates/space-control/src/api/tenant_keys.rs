//! A tenant's own key (BYOK, docs/byok.md): the admin or the tenant sets it, reads it and
//! re-wraps its data under the key's newest version after a rotation in the KMS.

use axum::Extension;
use axum::extract::State;
use space_api::error::clip;
use space_api::{ErrorBody, ErrorCode, KeyProviderKind, SetTenantKeyRequest, TenantId, TenantKey, TenantKeyId};
use space_keys::{TransitConfig, Zeroizing};
use space_store::TenantKeyRecord;

use super::system::check_tenant_name;
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, AppError, AppResult};
use crate::keyring::{Moved, OPENBAO, key_error, refused_addresses};

/// Where the transit engine is mounted unless the request says.
const DEFAULT_MOUNT: &str = "transit";

/// Whether the caller may manage `tenant`'s key: the admin any tenant's, a tenant its own;
/// any other is 404, as one that does not exist.
fn authorize(caller: &Caller, tenant: &str) -> AppResult<()> {
    if caller.admin {
        return check_tenant_name(tenant);
    }
    if tenant == caller.tenant {
        return Ok(());
    }
    Err(AppError::new(
        ErrorCode::NotFound,
        format!("tenant {} not found; `space key list` names the tenants", clip(tenant)),
    ))
}

/// The tenant's id: the caller's own, or for the admin the named tenant (with `create`,
/// created if it does not exist yet, as for quotas; else 404).
async fn tenant_id(state: &AppState, caller: &Caller, tenant: &str, create: bool) -> AppResult<TenantId> {
    if !caller.admin {
        return Ok(caller.tenant_id.clone());
    }
    if create {
        return Ok(state.store.ensure_tenant(tenant).await?);
    }
    state.store.tenant_named(tenant).await?.ok_or_else(|| {
        AppError::new(
            ErrorCode::NotFound,
            format!("tenant {} not found; `space key list` names the tenants", clip(tenant)),
        )
    })
}

fn view(tenant: &str, tenant_id: &TenantId, key: Option<&TenantKeyRecord>, moved: Option<&Moved>) -> TenantKey {
    TenantKey {
        tenant: tenant.to_owned(),
        tenant_id: tenant_id.clone(),
        provider: if key.is_some() { KeyProviderKind::Openbao } else { KeyProviderKind::Local },
        id: key.map(|k| k.id.clone()),
        address: key.map(|k| k.address.clone()),
        mount: key.map(|k| k.mount.clone()),
        key: key.map(|k| k.key_name.clone()),
        created_at: key.map(|k| k.created_at_ms),
        rewrapped: moved.map(|m| m.rewrapped),
        remaining: moved.map(|m| m.remaining),
        note: moved.and_then(|m| m.failure.as_ref()).map(|e| e.0.message.clone()),
    }
}

/// The transit settings of an `openbao` request, or 400 naming what is missing. A tenant's
/// own request (`public_only`) may not name a loopback or private address.
fn transit_config(request: &SetTenantKeyRequest, public_only: bool) -> AppResult<TransitConfig> {
    let required = |value: &Option<String>, name: &str| {
        value.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned).ok_or_else(|| {
            AppError::bad_request(format!(
                "provider openbao needs `{name}`: give address (http(s)://HOST[:PORT]), key (the transit key's name) \
                 and token (one allowed to update MOUNT/encrypt/KEY, MOUNT/decrypt/KEY and MOUNT/rewrap/KEY)"
            ))
        })
    };
    let config = TransitConfig {
        address: required(&request.address, "address")?.trim_end_matches('/').to_owned(),
        mount: request.mount.as_deref().map(str::trim).unwrap_or(DEFAULT_MOUNT).trim_matches('/').to_owned(),
        key: required(&request.key, "key")?,
        token: Zeroizing::new(required(&request.token, "token")?),
        refused_addresses: refused_addresses(public_only),
    };
    config.validate().map_err(key_error)?;
    Ok(config)
}

/// Sets the key that protects what is sealed for a tenant (its credentials' values, its
/// sessions' CA keys and its snapshots' keys in the blob store) and re-wraps the data keys of
/// everything already sealed under it (`remaining` says what is still under another key). An
/// `openbao` key is tried (a data key wrapped and unwrapped) before anything changes: 503
/// `key_unavailable` if the KMS refuses or does not answer, 400 for settings that cannot name
/// a key. `local` goes back to the server's key.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/key", params(("tenant" = String, Path)), request_body = SetTenantKeyRequest,
    responses((status = 200, body = TenantKey), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn set_tenant_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(request): ApiJson<SetTenantKeyRequest>,
) -> AppResult<ApiJson<TenantKey>> {
    authorize(&caller, &tenant)?;
    let new = match request.provider {
        KeyProviderKind::Local => {
            if request.address.is_some() || request.key.is_some() || request.token.is_some() || request.mount.is_some()
            {
                return Err(AppError::bad_request("provider local takes no address, mount, key or token"));
            }
            None
        }
        KeyProviderKind::Openbao => {
            let config = transit_config(&request, !caller.admin)?;
            let id = TenantKeyId::generate();
            let sealer = state.keys.transit_sealer(&id, config.clone())?;
            sealer.check().await.map_err(key_error)?;
            Some((id, config, sealer))
        }
    };
    let tenant_id = tenant_id(&state, &caller, &tenant, true).await?;
    let _changing = state.keys.lock_tenant(&tenant_id).await;
    let (record, sealer) = match new {
        None => (None, state.keys.local().clone()),
        Some((id, config, sealer)) => (Some(store_key(&state, &tenant_id, id, &config).await?), sealer),
    };
    let moved = state.keys.move_tenant(&tenant_id, &sealer, record.as_ref().map(|r| &r.id)).await?;
    tracing::info!(tenant = %tenant, key = %sealer.describe(), rewrapped = moved.rewrapped, remaining = moved.remaining, "tenant key set");
    Ok(ApiJson(view(&tenant, &tenant_id, record.as_ref(), Some(&moved))))
}

/// Stores a tried key (not yet the tenant's current key), its token sealed.
async fn store_key(
    state: &AppState,
    tenant: &TenantId,
    id: TenantKeyId,
    config: &TransitConfig,
) -> AppResult<TenantKeyRecord> {
    let mut record = TenantKeyRecord {
        id,
        tenant_id: tenant.clone(),
        provider: OPENBAO.into(),
        address: config.address.clone(),
        mount: config.mount.clone(),
        key_name: config.key.clone(),
        token_sealed: Vec::new(),
        public_only: config.refused_addresses.is_some(),
        created_at_ms: space_store::now_ms(),
    };
    record.token_sealed = state.keys.seal_token(&record, &config.token).await?;
    state.store.insert_tenant_key(&record).await?;
    Ok(record)
}

/// A tenant's key: the admin may read any tenant's, a tenant its own. Never the token.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/key", params(("tenant" = String, Path)),
    responses((status = 200, body = TenantKey), (status = 404, body = ErrorBody)))]
pub async fn get_tenant_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(tenant): ApiPath<String>,
) -> AppResult<ApiJson<TenantKey>> {
    authorize(&caller, &tenant)?;
    let tenant_id = tenant_id(&state, &caller, &tenant, false).await?;
    let key = state.store.current_tenant_key(&tenant_id).await?;
    Ok(ApiJson(view(&tenant, &tenant_id, key.as_ref(), None)))
}

/// After the tenant's key was rotated in its KMS: re-wraps the data key of everything sealed
/// for the tenant under the key's newest version (the data is not re-encrypted), and moves
/// what is still under an older key of the tenant's to the current one. Once `remaining` is
/// 0, the KMS may retire the old versions (`min_decryption_version`).
#[utoipa::path(post, path = "/v1/tenants/{tenant}/key/rotate", params(("tenant" = String, Path)),
    responses((status = 200, body = TenantKey), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn rotate_tenant_key(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(tenant): ApiPath<String>,
) -> AppResult<ApiJson<TenantKey>> {
    authorize(&caller, &tenant)?;
    let tenant_id = tenant_id(&state, &caller, &tenant, false).await?;
    let _changing = state.keys.lock_tenant(&tenant_id).await;
    let key = state.store.current_tenant_key(&tenant_id).await?;
    let sealer = state.keys.sealer_for(&tenant_id).await?;
    let moved = state.keys.rewrap_tenant(&tenant_id, &sealer, true).await?;
    tracing::info!(tenant = %tenant, key = %sealer.describe(), rewrapped = moved.rewrapped, remaining = moved.remaining, "tenant key rotated");
    Ok(ApiJson(view(&tenant, &tenant_id, key.as_ref(), Some(&moved))))
}
