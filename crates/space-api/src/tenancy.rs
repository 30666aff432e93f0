//! Request and response bodies of API keys and tenant quotas.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ids::{KeyId, SessionId, TenantId};

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
    /// For a session-scoped token: what it may touch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<SessionScope>,
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
    /// For a session-scoped token: what it may touch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<SessionScope>,
}

/// What a session-scoped token may do, to which sessions: `session_id` and the sessions forked
/// from it (transitively). Anything else it asks for is refused (403), and other sessions
/// are 404 to it as to another tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionScope {
    pub session_id: SessionId,
    pub scopes: Vec<TokenScope>,
}

/// One thing a session-scoped token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenScope {
    /// Show the sessions, their events, stats, snapshots, processes, network policy, audit
    /// log and ports; follow their operations.
    Read,
    /// Run commands (exec, WebSocket exec, signals, attach) and use files (and watches).
    Exec,
    /// Fork them.
    Fork,
    /// Take, delete and restore snapshots; pause, resume and suspend.
    Snapshot,
    /// Destroy sessions forked from the token's session (never that session itself).
    Destroy,
}

impl TokenScope {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Read => "read",
            TokenScope::Exec => "exec",
            TokenScope::Fork => "fork",
            TokenScope::Snapshot => "snapshot",
            TokenScope::Destroy => "destroy",
        }
    }
}

impl std::str::FromStr for TokenScope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => TokenScope::Read,
            "exec" => TokenScope::Exec,
            "fork" => TokenScope::Fork,
            "snapshot" => TokenScope::Snapshot,
            "destroy" => TokenScope::Destroy,
            other => {
                return Err(format!(
                    "{} is not a token scope: use read, exec, fork, snapshot or destroy",
                    crate::error::echo(other)
                ));
            }
        })
    }
}

/// `POST /v1/sessions/{id}/tokens`: a token for sub-agents, limited to this session and its
/// forks.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionTokenRequest {
    /// At least one.
    pub scopes: Vec<TokenScope>,
    /// How long it works, in seconds: 60 to 604800 (7 days); default 3600.
    pub ttl_secs: Option<u64>,
    /// What it is for (at most 128 characters), shown in `GET /v1/keys`.
    pub name: Option<String>,
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

/// Who holds the key that protects what is sealed for a tenant (its credentials' values and
/// its sessions' CA keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyProviderKind {
    /// The server's local key file (the default).
    Local,
    /// A transit key in the tenant's OpenBao or HashiCorp Vault (BYOK).
    Openbao,
}

/// Sets a tenant's key (`PUT /v1/tenants/{tenant}/key`). For `openbao`, `address` and `key`
/// are required, and `token` must allow `update` (only) on `MOUNT/encrypt/KEY`,
/// `MOUNT/decrypt/KEY` and `MOUNT/rewrap/KEY`; it is stored sealed and never returned. A key
/// a tenant sets (not the admin) must be `https` and not at a loopback or private address.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTenantKeyRequest {
    pub provider: KeyProviderKind,
    /// `http(s)://HOST[:PORT]` of the KMS.
    #[serde(default)]
    pub address: Option<String>,
    /// Where the transit engine is mounted; default `transit`.
    #[serde(default)]
    pub mount: Option<String>,
    /// The transit key's name.
    #[serde(default)]
    pub key: Option<String>,
    /// The token space uses for the key.
    #[serde(default)]
    pub token: Option<String>,
}

impl std::fmt::Debug for SetTenantKeyRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetTenantKeyRequest")
            .field("provider", &self.provider)
            .field("address", &self.address)
            .field("mount", &self.mount)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// A tenant's key (never the token that lets space use it).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantKey {
    pub tenant: String,
    pub tenant_id: TenantId,
    pub provider: KeyProviderKind,
    /// `null` for the local key.
    pub id: Option<crate::TenantKeyId>,
    pub address: Option<String>,
    pub mount: Option<String>,
    pub key: Option<String>,
    /// Unix time in milliseconds the key was set; `null` for the local key.
    pub created_at: Option<i64>,
    /// After a set or a rotation: how many sealed values now have their data keys wrapped
    /// by this key (their data is not re-encrypted).
    pub rewrapped: Option<u64>,
    /// After a set or a rotation: sealed values of the tenant still under another key
    /// (sealed or changed meanwhile, or whose key could not unwrap them): still readable
    /// with that key. Set or rotate again to move them, and keep the old key (or its old
    /// versions) until this is 0.
    pub remaining: Option<u64>,
    /// Why a value could not be moved, when one could not.
    pub note: Option<String>,
}
