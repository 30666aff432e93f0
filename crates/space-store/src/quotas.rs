//! Per-tenant quotas, checked inside the transaction that would go over them.
//!
//! What counts (docs/tenancy.md): every session that is not destroyed (or being destroyed)
//! counts one session and its disk limit, whatever its state, since its root and snapshots
//! stay on disk; only those that hold a sandbox, or are getting one (creating, running,
//! paused, restoring, suspending), count their CPUs and memory, as E2B and Daytona count
//! running sandboxes only. Suspending a session frees its CPUs and memory.
//!
//! Atomic against concurrent creates: the check reads the usage in the write transaction
//! that inserts the session (or moves it to `restoring`), so two creates cannot both see
//! room for one: write transactions run one at a time (SQLite's `BEGIN IMMEDIATE`, and on
//! PostgreSQL the advisory lock `Store::write_tx` takes).

use std::fmt;

use space_api::{QuotaLimits, QuotaUsage, Resources, SessionState, TenantId};
use sqlx::Row;

use crate::{Result, Store, StoreError, now_ms};

/// What an operation adds to its tenant's usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Demand {
    pub sessions: u64,
    pub cpu_millis: u64,
    pub memory_mib: u64,
    /// `None`: a session without a disk limit, which no disk quota can allow.
    pub disk_mib: Option<u64>,
}

impl Demand {
    /// A new session that will get a sandbox.
    pub fn new_session(resources: &Resources) -> Demand {
        Demand {
            sessions: 1,
            cpu_millis: cpu_millis(resources.cpus),
            memory_mib: resources.memory_mib,
            disk_mib: disk_of(resources),
        }
    }

    /// A session that gets a sandbox again (resumed or restored from `suspended` or `failed`).
    pub fn sandbox(resources: &Resources) -> Demand {
        Demand { cpu_millis: cpu_millis(resources.cpus), memory_mib: resources.memory_mib, ..Demand::default() }
    }
}

fn cpu_millis(cpus: f64) -> u64 {
    (cpus * 1000.0).round().max(0.0) as u64
}

fn disk_of(resources: &Resources) -> Option<u64> {
    (resources.disk_mib > 0).then_some(resources.disk_mib)
}

/// Whether a session in `state` counts at all (one session, its disk).
pub fn counts_session(state: SessionState) -> bool {
    !matches!(state, SessionState::Destroyed | SessionState::Destroying)
}

/// Whether a session in `state` counts its CPUs and memory: it holds a sandbox or is getting one.
pub fn counts_sandbox(state: SessionState) -> bool {
    matches!(
        state,
        SessionState::Creating
            | SessionState::Running
            | SessionState::Paused
            | SessionState::Restoring
            | SessionState::Suspending
    )
}

/// The limit a request would go over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaLimit {
    Sessions,
    Cpus,
    MemoryMib,
    DiskMib,
    /// A disk quota is set and the session asks for no disk limit.
    UnlimitedDisk,
    /// Snapshots that outlive their sessions: a bound of the server's, not a tenant setting.
    KeptSnapshots,
}

/// A request that would take its tenant over a quota: which limit, what is in use, what the
/// request asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub tenant: String,
    pub limit: QuotaLimit,
    /// In the limit's unit (CPUs in thousandths).
    pub max: u64,
    pub in_use: u64,
    pub requested: u64,
}

impl fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpus = |millis: u64| format!("{}", millis as f64 / 1000.0);
        let (name, max, in_use, requested) = match self.limit {
            QuotaLimit::Sessions => {
                ("max_sessions", self.max.to_string(), self.in_use.to_string(), self.requested.to_string())
            }
            QuotaLimit::Cpus => ("max_cpus", cpus(self.max), cpus(self.in_use), cpus(self.requested)),
            QuotaLimit::MemoryMib => (
                "max_memory_mib",
                format!("{} MiB", self.max),
                format!("{} MiB", self.in_use),
                format!("{} MiB", self.requested),
            ),
            QuotaLimit::DiskMib => (
                "max_disk_mib",
                format!("{} MiB", self.max),
                format!("{} MiB", self.in_use),
                format!("{} MiB", self.requested),
            ),
            QuotaLimit::KeptSnapshots => {
                return write!(
                    f,
                    "tenant {:?} has {} snapshots that outlive their sessions, the most it may keep ({})",
                    self.tenant, self.in_use, self.max
                );
            }
            QuotaLimit::UnlimitedDisk => {
                return write!(
                    f,
                    "tenant {:?} has a disk quota (max_disk_mib {} MiB, {} MiB in use) and this session asks for no \
                     disk limit: give it a disk_mib",
                    self.tenant, self.max, self.in_use
                );
            }
        };
        write!(
            f,
            "tenant {:?} would exceed its quota {name} = {max}: {in_use} in use, this request asks for {requested} more",
            self.tenant
        )
    }
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Any>;

impl Store {
    /// Replaces `tenant`'s quota (all four limits; `None` is unlimited).
    pub async fn set_quota(&self, tenant: &TenantId, limits: &QuotaLimits) -> Result<()> {
        sqlx::query(
            "INSERT INTO tenant_quotas (tenant_id, max_sessions, max_cpu_millis, max_memory_mib, max_disk_mib, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (tenant_id) DO UPDATE SET max_sessions = excluded.max_sessions,
                 max_cpu_millis = excluded.max_cpu_millis, max_memory_mib = excluded.max_memory_mib,
                 max_disk_mib = excluded.max_disk_mib, updated_at = excluded.updated_at",
        )
        .bind(tenant.as_str())
        .bind(limits.max_sessions.map(to_i64))
        .bind(limits.max_cpus.map(|c| to_i64(cpu_millis(c))))
        .bind(limits.max_memory_mib.map(to_i64))
        .bind(limits.max_disk_mib.map(to_i64))
        .bind(now_ms())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Whether `demand` fits in `tenant`'s quota now, for a request to fail early, before
    /// work it would waste (a fork's snapshot); the write that follows checks again.
    pub async fn check_quota(&self, tenant: &TenantId, demand: &Demand) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        check_quota_tx(&mut tx, tenant, demand).await
    }

    /// `tenant`'s quota (all unlimited if none was set) and what it uses of it.
    pub async fn quota(&self, tenant: &TenantId) -> Result<(QuotaLimits, QuotaUsage)> {
        let mut conn = self.pool.acquire().await?;
        let limits = limits_of(&mut conn, tenant).await?.unwrap_or_default();
        let usage = usage_of(&mut conn, tenant).await?;
        let usage = QuotaUsage {
            sessions: usage.sessions,
            cpus: usage.cpu_millis as f64 / 1000.0,
            memory_mib: usage.memory_mib,
            disk_mib: usage.disk_mib.unwrap_or(0),
        };
        Ok((limits.into_api(), usage))
    }
}

/// Limits as stored: CPUs in thousandths.
#[derive(Debug, Clone, Copy, Default)]
struct StoredLimits {
    sessions: Option<u64>,
    cpu_millis: Option<u64>,
    memory_mib: Option<u64>,
    disk_mib: Option<u64>,
}

impl StoredLimits {
    fn into_api(self) -> QuotaLimits {
        QuotaLimits {
            max_sessions: self.sessions,
            max_cpus: self.cpu_millis.map(|m| m as f64 / 1000.0),
            max_memory_mib: self.memory_mib,
            max_disk_mib: self.disk_mib,
        }
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

async fn limits_of(conn: &mut sqlx::AnyConnection, tenant: &TenantId) -> Result<Option<StoredLimits>> {
    let row = sqlx::query(
        "SELECT max_sessions, max_cpu_millis, max_memory_mib, max_disk_mib FROM tenant_quotas WHERE tenant_id = $1",
    )
    .bind(tenant.as_str())
    .fetch_optional(&mut *conn)
    .await?;
    let get = |row: &sqlx::any::AnyRow, i| row.get::<Option<i64>, _>(i).map(|n| n.max(0) as u64);
    Ok(row.map(|r| StoredLimits {
        sessions: get(&r, 0),
        cpu_millis: get(&r, 1),
        memory_mib: get(&r, 2),
        disk_mib: get(&r, 3),
    }))
}

/// What `tenant`'s sessions count now (`disk_mib` is `Some` even when some have no limit:
/// those count 0).
async fn usage_of(conn: &mut sqlx::AnyConnection, tenant: &TenantId) -> Result<Demand> {
    let rows = sqlx::query("SELECT state, resources FROM sessions WHERE tenant_id = $1 AND state <> 'destroyed'")
        .bind(tenant.as_str())
        .fetch_all(&mut *conn)
        .await?;
    let mut usage = Demand { disk_mib: Some(0), ..Demand::default() };
    for row in rows {
        let state: &str = row.get(0);
        let state = SessionState::parse(state).ok_or_else(|| StoreError::Corrupt(format!("state {state}")))?;
        if !counts_session(state) {
            continue;
        }
        let resources: Resources =
            serde_json::from_str(row.get(1)).map_err(|e| StoreError::Corrupt(format!("resources: {e}")))?;
        usage.sessions += 1;
        usage.disk_mib = Some(usage.disk_mib.unwrap_or(0) + resources.disk_mib);
        if counts_sandbox(state) {
            usage.cpu_millis += cpu_millis(resources.cpus);
            usage.memory_mib += resources.memory_mib;
        }
    }
    Ok(usage)
}

/// Fails with [`StoreError::QuotaExceeded`] if `demand` would take `tenant` over its quota,
/// counting what the transaction `tx` wrote so far (the sessions of a fork, one by one).
pub(crate) async fn check_quota_tx(tx: &mut Tx<'_>, tenant: &TenantId, demand: &Demand) -> Result<()> {
    let Some(limits) = limits_of(&mut *tx, tenant).await? else {
        return Ok(());
    };
    let usage = usage_of(&mut *tx, tenant).await?;
    let Some(limit) = first_exceeded(&limits, &usage, demand) else {
        return Ok(());
    };
    let name: String =
        sqlx::query_scalar("SELECT name FROM tenants WHERE id = $1").bind(tenant.as_str()).fetch_one(&mut **tx).await?;
    Err(StoreError::QuotaExceeded(QuotaExceeded { tenant: name, ..limit }))
}

/// The first limit `demand` goes over, if any (with the tenant left blank).
fn first_exceeded(limits: &StoredLimits, usage: &Demand, demand: &Demand) -> Option<QuotaExceeded> {
    let over = |limit, max: Option<u64>, in_use: u64, requested: u64| {
        let max = max?;
        (requested > 0 && in_use.saturating_add(requested) > max).then_some(QuotaExceeded {
            tenant: String::new(),
            limit,
            max,
            in_use,
            requested,
        })
    };
    let used_disk = usage.disk_mib.unwrap_or(0);
    if let (Some(max), true, None) = (limits.disk_mib, demand.sessions > 0, demand.disk_mib) {
        return Some(QuotaExceeded {
            tenant: String::new(),
            limit: QuotaLimit::UnlimitedDisk,
            max,
            in_use: used_disk,
            requested: 0,
        });
    }
    over(QuotaLimit::Sessions, limits.sessions, usage.sessions, demand.sessions)
        .or_else(|| over(QuotaLimit::Cpus, limits.cpu_millis, usage.cpu_millis, demand.cpu_millis))
        .or_else(|| over(QuotaLimit::MemoryMib, limits.memory_mib, usage.memory_mib, demand.memory_mib))
        .or_else(|| over(QuotaLimit::DiskMib, limits.disk_mib, used_disk, demand.disk_mib.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(sessions: u64, cpus: u64, memory: u64, disk: Option<u64>) -> StoredLimits {
        StoredLimits { sessions: Some(sessions), cpu_millis: Some(cpus), memory_mib: Some(memory), disk_mib: disk }
    }

    #[test]
    fn the_first_limit_gone_over_is_named_with_use_and_request() {
        let usage = Demand { sessions: 1, cpu_millis: 1500, memory_mib: 512, disk_mib: Some(1024) };
        let one = Demand::new_session(&Resources { cpus: 1.0, memory_mib: 512, pids: 64, disk_mib: 1024 });
        assert_eq!(first_exceeded(&limits(2, 4000, 2048, Some(4096)), &usage, &one), None);
        let over = first_exceeded(&limits(2, 2000, 2048, None), &usage, &one).unwrap();
        assert_eq!((over.limit, over.max, over.in_use, over.requested), (QuotaLimit::Cpus, 2000, 1500, 1000));
        let message = QuotaExceeded { tenant: "t".into(), ..over }.to_string();
        assert!(
            message.contains("max_cpus = 2") && message.contains("1.5 in use") && message.contains("1 more"),
            "{message}"
        );
        assert_eq!(first_exceeded(&limits(1, 9000, 9000, None), &usage, &one).unwrap().limit, QuotaLimit::Sessions);
        let no_disk_limit = Demand { disk_mib: None, ..one };
        let over = first_exceeded(&limits(9, 9000, 9000, Some(1 << 20)), &usage, &no_disk_limit).unwrap();
        assert_eq!(over.limit, QuotaLimit::UnlimitedDisk);
        // A resume asks for no session and no disk: only CPUs and memory are checked.
        let resume = Demand::sandbox(&Resources { cpus: 1.0, memory_mib: 512, pids: 64, disk_mib: 0 });
        assert_eq!(first_exceeded(&limits(1, 9000, 9000, Some(1024)), &usage, &resume), None);
    }
}
