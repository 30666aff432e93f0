//! Tenants' quotas: the admin sets them, a tenant reads its own (docs/tenancy.md).

use axum::Extension;
use axum::extract::State;
use space_api::error::clip;
use space_api::{ErrorBody, ErrorCode, QuotaLimits, TenantId, TenantQuota};

use super::system::check_tenant_name;
use crate::AppState;
use crate::auth::{Admin, Caller};
use crate::error::{ApiJson, ApiPath, AppError, AppResult};

/// Most CPUs a quota may name (more than any node has: a quota is not a node's size).
const MAX_QUOTA_CPUS: f64 = 1e6;

fn check_limits(limits: &QuotaLimits) -> AppResult<()> {
    if limits.max_cpus.is_some_and(|c| !(c.is_finite() && (0.0..=MAX_QUOTA_CPUS).contains(&c))) {
        return Err(AppError::bad_request(format!(
            "max_cpus must be a number between 0 and {MAX_QUOTA_CPUS}, or null for no limit"
        )));
    }
    let too_large = [limits.max_sessions, limits.max_memory_mib, limits.max_disk_mib];
    if too_large.iter().flatten().any(|&n| n > i64::MAX as u64) {
        return Err(AppError::bad_request("quota limits must be at most 2^63-1, or null for no limit"));
    }
    Ok(())
}

async fn view(state: &AppState, tenant: &str, id: &TenantId) -> AppResult<TenantQuota> {
    let (limits, usage) = state.store.quota(id).await?;
    Ok(TenantQuota {
        tenant: tenant.to_owned(),
        tenant_id: id.clone(),
        max_sessions: limits.max_sessions,
        max_cpus: limits.max_cpus,
        max_memory_mib: limits.max_memory_mib,
        max_disk_mib: limits.max_disk_mib,
        usage,
    })
}

/// Sets a tenant's quota (admin only), replacing all four limits; a limit left out or
/// `null` is unlimited. Creates the tenant if it does not exist, so a quota can be set
/// before its first key. Sessions it has already are kept even when over the new limits;
/// creates, forks and resumes are refused until it is back under them.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/quota", params(("tenant" = String, Path)), request_body = QuotaLimits,
    responses((status = 200, body = TenantQuota), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn set_quota(
    State(state): State<AppState>,
    _admin: Admin,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(limits): ApiJson<QuotaLimits>,
) -> AppResult<ApiJson<TenantQuota>> {
    check_tenant_name(&tenant)?;
    check_limits(&limits)?;
    let id = state.store.ensure_tenant(&tenant).await?;
    state.store.set_quota(&id, &limits).await?;
    Ok(ApiJson(view(&state, &tenant, &id).await?))
}

/// A tenant's quota and its use: the admin may read any tenant's, a tenant its own (404
/// otherwise, as for a tenant that does not exist).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/quota", params(("tenant" = String, Path)),
    responses((status = 200, body = TenantQuota), (status = 404, body = ErrorBody)))]
pub async fn get_quota(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(tenant): ApiPath<String>,
) -> AppResult<ApiJson<TenantQuota>> {
    let not_found = || {
        AppError::new(
            ErrorCode::NotFound,
            format!("tenant {} not found; `space key list` names the tenants", clip(&tenant)),
        )
    };
    if !caller.admin && tenant != caller.tenant {
        return Err(not_found());
    }
    let id = state.store.tenant_named(&tenant).await?.ok_or_else(not_found)?;
    Ok(ApiJson(view(&state, &tenant, &id).await?))
}
