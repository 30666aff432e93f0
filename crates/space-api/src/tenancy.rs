//! Request and response bodies of API keys and tenant quotas.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ids::{KeyId, TenantId};

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyRequest {
    /// Tenant name; created if it does not exist.
    pub tenant: String,
    /// What the key is for (at most 128 characters), shown in `GET /v1/keys`.
    pub name: Option<String>,
    /// The key stops working this many seconds from now (401 `key_expired`). Default: never.
    pub expires_in_secs: Option<u64>,
}

/// A new API key (`POST /v1/keys`, `POST /v1/keys/{id}/rotate`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedKey {
    /// The secret; shown once.
    pub key: String,
    pub id: KeyId,
    pub name: Option<String>,
    pub tenant: String,
    pub tenant_id: TenantId,
    /// Unix time in milliseconds.
    pub created_at: i64,
    /// Unix time in milliseconds; `null`: never.
    pub expires_at: Option<i64>,
}

/// An API key as listed: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiKey {
    pub id: KeyId,
    pub name: Option<String>,
    pub tenant: String,
    pub tenant_id: TenantId,
    /// Whether it is an admin key (tenant `admin`).
    pub admin: bool,
    /// Unix time in milliseconds, as every time below.
    pub created_at: i64,
    /// When it last authenticated a request, to the minute (it is recorded at most once a
    /// minute); `null`: never.
    pub last_used_at: Option<i64>,
    /// `null`: never.
    pub expires_at: Option<i64>,
    /// `null`: in effect.
    pub revoked_at: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KeyList {
    pub keys: Vec<ApiKey>,
}

/// A tenant's limits (`PUT /v1/tenants/{tenant}/quota`). Each is optional; absent or `null`
/// means unlimited. A PUT replaces all four.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// Sessions that are not destroyed (suspended and failed ones included).
    pub max_sessions: Option<u64>,
    /// CPUs of the sessions that hold a sandbox (running, paused, or on their way there).
    pub max_cpus: Option<f64>,
    /// Memory, in MiB, of the sessions that hold a sandbox.
    pub max_memory_mib: Option<u64>,
    /// Disk limits, in MiB, of the sessions that are not destroyed (their snapshots stay).
    pub max_disk_mib: Option<u64>,
}

/// What a tenant's sessions count against its quota now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaUsage {
    pub sessions: u64,
    pub cpus: f64,
    pub memory_mib: u64,
    pub disk_mib: u64,
}

/// A tenant's quota and what it uses of it (`GET /v1/tenants/{tenant}/quota`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantQuota {
    pub tenant: String,
    pub tenant_id: TenantId,
    /// As in [`QuotaLimits`]; `null`: unlimited.
    pub max_sessions: Option<u64>,
    pub max_cpus: Option<f64>,
    pub max_memory_mib: Option<u64>,
    pub max_disk_mib: Option<u64>,
    pub usage: QuotaUsage,
}

impl TenantQuota {
    pub fn limits(&self) -> QuotaLimits {
        QuotaLimits {
            max_sessions: self.max_sessions,
            max_cpus: self.max_cpus,
            max_memory_mib: self.max_memory_mib,
            max_disk_mib: self.max_disk_mib,
        }
    }
}
