//! Sessions, their sandboxes and their event history.

use std::collections::BTreeMap;

use space_api::{
    OperationId, Resources, RuntimeKind, SandboxId, Session, SessionEvent, SessionId, SessionLifetime, SessionState,
    SnapshotId, SnapshotPolicy, TenantId,
};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::operations::{Runner, insert_operation, insert_operation_run_by};
use crate::quotas::{Demand, check_quota_tx, counts_sandbox};
use crate::{NewOperation, OperationKind, OperationRecord, Result, Store, StoreError, now_ms, parse};

/// A session as stored, with its owner.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    pub tenant_id: TenantId,
    pub session: Session,
    /// The snapshot a forked session starts from instead of its template.
    pub source_snapshot: Option<SnapshotId>,
}

/// What `create` records before anything is built.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub id: SessionId,
    pub tenant_id: TenantId,
    pub template: String,
    pub runtime: RuntimeKind,
    pub resources: Resources,
    pub env: BTreeMap<String, String>,
    /// Start from this snapshot (a fork) rather than the template.
    pub source_snapshot: Option<SnapshotId>,
    pub template_version: Option<u32>,
    pub snapshot_policy: SnapshotPolicy,
    pub lifetime: SessionLifetime,
    pub meta: SessionMeta,
}

/// What people name and find a session by, and whether it wakes on use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionMeta {
    pub name: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub auto_resume: bool,
}

impl SessionMeta {
    /// The settings `session` has.
    pub fn of(session: &Session) -> SessionMeta {
        SessionMeta {
            name: session.name.clone(),
            labels: session.labels.clone(),
            metadata: session.metadata.clone(),
            auto_resume: session.auto_resume,
        }
    }
}

/// Which sessions [`Store::list_sessions`] returns.
#[derive(Debug, Clone, Default)]
pub struct SessionFilter {
    /// `None`: every tenant's.
    pub tenant: Option<TenantId>,
    pub include_destroyed: bool,
    pub state: Option<SessionState>,
    pub template: Option<String>,
    /// Sessions that have every one of these labels.
    pub labels: Vec<(String, String)>,
}

/// What [`Store::insert_sandbox`] records.
#[derive(Debug, Clone)]
pub struct NewSandbox<'a> {
    pub id: &'a SandboxId,
    pub session: &'a SessionId,
    pub node: &'a str,
    pub template_version: u64,
    /// The pid 1 of a sandbox that already runs (a bound warm pod).
    pub running_pid: Option<u32>,
}

/// A sandbox row: written before the node creates anything for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRecord {
    pub id: SandboxId,
    pub session_id: SessionId,
    pub node_id: String,
    /// `starting`, `running` or `gone`.
    pub state: String,
    pub pid: Option<u32>,
}

const SESSION_COLUMNS: &str = "id, tenant_id, template, template_version, state, resources, env, error, sandbox_id, created_at, updated_at, source_snapshot, snapshot_policy, lifetime, runtime, name, labels, metadata, CASE WHEN auto_resume THEN 1 ELSE 0 END, (SELECT t.name FROM tenants t WHERE t.id = sessions.tenant_id), \
    (SELECT b.node_id FROM sandboxes b WHERE b.session_id = sessions.id ORDER BY b.created_at DESC, b.id DESC LIMIT 1)";

fn json_map(text: &str) -> Result<BTreeMap<String, String>> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn session_from_row(row: &AnyRow) -> Result<SessionRecord> {
    let state: &str = row.get(4);
    let resources: &str = row.get(5);
    let env: &str = row.get(6);
    let sandbox: Option<&str> = row.get(8);
    let runtime: &str = row.get(14);
    let session = Session {
        runtime: RuntimeKind::parse(runtime).ok_or_else(|| StoreError::Corrupt(format!("runtime {runtime}")))?,
        id: parse("session id", row.get::<&str, _>(0))?,
        template: row.get(2),
        template_version: row.get::<Option<i64>, _>(3).map(|v| v as u32),
        state: SessionState::parse(state).ok_or_else(|| StoreError::Corrupt(format!("state {state}")))?,
        resources: serde_json::from_str(resources).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        env: serde_json::from_str(env).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        error: row.get(7),
        snapshot_policy: match row.get::<Option<&str>, _>(12) {
            Some(json) => serde_json::from_str(json).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            None => SnapshotPolicy::off(),
        },
        lifetime: match row.get::<Option<&str>, _>(13) {
            Some(json) => serde_json::from_str(json).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            None => SessionLifetime::default(),
        },
        sandbox_id: sandbox.map(|s| parse("sandbox id", s)).transpose()?,
        created_at: row.get(9),
        updated_at: row.get(10),
        name: row.get(15),
        labels: json_map(row.get(16))?,
        metadata: json_map(row.get(17))?,
        auto_resume: row.get::<i64, _>(18) != 0,
        tenant: row.get::<Option<String>, _>(19).unwrap_or_default(),
        node: row.get(20),
    };
    let source: Option<&str> = row.get(11);
    Ok(SessionRecord {
        tenant_id: parse("tenant id", row.get::<&str, _>(1))?,
        session,
        source_snapshot: source.map(|s| parse("snapshot id", s)).transpose()?,
    })
}

impl Store {
    /// Records a new session in `creating`, its first event and the operation that will build
    /// it, atomically: a crash never leaves a session without the work that finishes it.
    pub async fn insert_session(&self, new: &NewSession) -> Result<OperationId> {
        let mut tx = self.write_tx().await?;
        let op = insert_session_tx(&mut tx, new, None, Runner::AnyReplica).await?;
        tx.commit().await?;
        Ok(op.operation.id)
    }

    /// The session created under Idempotency-Key `key`, and its create operation.
    pub async fn session_created_under_key(
        &self,
        tenant: &TenantId,
        key: &str,
    ) -> Result<Option<(SessionId, Option<OperationId>)>> {
        let row = sqlx::query(
            "SELECT s.id, o.id FROM sessions s LEFT JOIN operations o ON o.session_id = s.id AND o.kind = $3
             WHERE s.tenant_id = $1 AND s.idempotency_key = $2",
        )
        .bind(tenant.as_str())
        .bind(key)
        .bind(OperationKind::CreateSession.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let op = r.get::<Option<&str>, _>(1).map(|o| parse("operation id", o)).transpose()?;
            Ok((parse("session id", r.get::<&str, _>(0))?, op))
        })
        .transpose()
    }

    /// Moves a session in one of the states `from` into `restoring` and queues the operation
    /// that restores it (`input` says from what). Returns `None` if it is in another state.
    pub async fn begin_restore(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        input: &str,
        from: &[SessionState],
    ) -> Result<Option<OperationId>> {
        let allowed = |s: SessionState| from.contains(&s);
        let op = (OperationKind::RestoreSession, Some(input.to_owned()));
        self.begin_operation(tenant, id, allowed, SessionState::Restoring, op).await
    }

    /// Moves a session into `destroying` and queues the operation that finishes the job.
    /// Returns `None` if the session is already destroyed or being destroyed.
    pub async fn begin_destroy(&self, tenant: &TenantId, id: &SessionId) -> Result<Option<OperationId>> {
        let allowed = |s: SessionState| !matches!(s, SessionState::Destroyed | SessionState::Destroying);
        self.begin_operation(tenant, id, allowed, SessionState::Destroying, (OperationKind::DestroySession, None)).await
    }

    /// In one transaction: if the tenant's session is in a state `allowed` accepts, moves it to
    /// `to`, records the event and queues the operation.
    async fn begin_operation(
        &self,
        tenant: &TenantId,
        id: &SessionId,
        allowed: impl Fn(SessionState) -> bool,
        to: SessionState,
        (kind, input): (OperationKind, Option<String>),
    ) -> Result<Option<OperationId>> {
        let mut tx = self.write_tx().await?;
        let row = sqlx::query("SELECT state, resources FROM sessions WHERE id = $1 AND tenant_id = $2")
            .bind(id.as_str())
            .bind(tenant.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let Some(current) = SessionState::parse(row.get(0)).filter(|s| allowed(*s)) else {
            return Ok(None);
        };
        // A session that gets a sandbox back (resume, restore of a suspended or failed one)
        // takes CPUs and memory again.
        if counts_sandbox(to) && !counts_sandbox(current) {
            let resources: Resources =
                serde_json::from_str(row.get(1)).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            check_quota_tx(&mut tx, tenant, &Demand::sandbox(&resources)).await?;
        }
        sqlx::query("UPDATE sessions SET state = $1, updated_at = $2 WHERE id = $3")
            .bind(to.as_str())
            .bind(now_ms())
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        insert_event(&mut tx, id, "state", Some(current), Some(to), None).await?;
        let op = NewOperation { tenant_id: tenant.clone(), session_id: Some(id.clone()), kind, input };
        let op_id = insert_operation(&mut tx, &op).await?;
        tx.commit().await?;
        Ok(Some(op_id))
    }

    /// A session of `tenant`; `None` if it does not exist or belongs to someone else.
    pub async fn session(&self, tenant: &TenantId, id: &SessionId) -> Result<Option<Session>> {
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1 AND tenant_id = $2");
        let row = sqlx::query(&sql).bind(id.as_str()).bind(tenant.as_str()).fetch_optional(&self.pool).await?;
        row.map(|r| session_from_row(&r).map(|rec| rec.session)).transpose()
    }

    /// Any tenant's session (for the reconciler).
    pub async fn session_any(&self, id: &SessionId) -> Result<Option<SessionRecord>> {
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1");
        let row = sqlx::query(&sql).bind(id.as_str()).fetch_optional(&self.pool).await?;
        row.map(|r| session_from_row(&r)).transpose()
    }

    /// The sessions `filter` picks, newest first.
    pub async fn list_sessions(&self, filter: &SessionFilter) -> Result<Vec<Session>> {
        let mut conditions = Vec::new();
        let mut binds: Vec<String> = Vec::new();
        let mut param = |value: &str| {
            binds.push(value.to_owned());
            format!("${}", binds.len())
        };
        if let Some(tenant) = &filter.tenant {
            conditions.push(format!("tenant_id = {}", param(tenant.as_str())));
        }
        if !filter.include_destroyed {
            conditions.push("state <> 'destroyed'".to_owned());
        }
        if let Some(state) = filter.state {
            conditions.push(format!("state = {}", param(state.as_str())));
        }
        if let Some(template) = &filter.template {
            conditions.push(format!("template = {}", param(template)));
        }
        for (key, value) in &filter.labels {
            let (k, v) = (param(key), param(value));
            conditions.push(format!("id IN (SELECT session_id FROM session_labels WHERE key = {k} AND value = {v})"));
        }
        let clause = if conditions.is_empty() { String::new() } else { format!(" WHERE {}", conditions.join(" AND ")) };
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions{clause} ORDER BY created_at DESC, id");
        let mut query = sqlx::query(&sql);
        for value in &binds {
            query = query.bind(value.as_str());
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(|r| session_from_row(r).map(|rec| rec.session)).collect()
    }

    /// Replaces the session's name, labels, metadata and `auto_resume`, in one transaction.
    pub async fn set_meta(&self, id: &SessionId, meta: &SessionMeta) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query("UPDATE sessions SET name = $1, labels = $2, metadata = $3, auto_resume = $4, updated_at = $5 WHERE id = $6")
            .bind(meta.name.as_deref())
            .bind(serde_json::to_string(&meta.labels).unwrap_or_default())
            .bind(serde_json::to_string(&meta.metadata).unwrap_or_default())
            .bind(meta.auto_resume)
            .bind(now_ms())
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM session_labels WHERE session_id = $1").bind(id.as_str()).execute(&mut *tx).await?;
        insert_labels(&mut tx, id, &meta.labels).await?;
        tx.commit().await?;
        Ok(())
    }

    /// All sessions in one of `states`, any tenant (for recovery).
    pub async fn sessions_in_states(&self, states: &[SessionState]) -> Result<Vec<SessionRecord>> {
        let list = states.iter().map(|s| format!("'{}'", s.as_str())).collect::<Vec<_>>().join(",");
        let sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE state IN ({list}) ORDER BY created_at");
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        rows.iter().map(session_from_row).collect()
    }

    pub async fn count_sessions_by_state(&self, tenant: &TenantId) -> Result<Vec<(String, i64)>> {
        let rows = sqlx::query("SELECT state, COUNT(*) FROM sessions WHERE tenant_id = $1 GROUP BY state")
            .bind(tenant.as_str())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Moves a session from `from` to `to` if it is still in `from`, recording an event.
    /// Returns false when another actor moved it first.
    pub async fn transition(
        &self,
        id: &SessionId,
        from: &[SessionState],
        to: SessionState,
        error: Option<&str>,
    ) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let moved = transition_in(&mut tx, id, from, to, error).await?;
        tx.commit().await?;
        Ok(moved)
    }

    /// [`Store::transition`] without error, and operation `op` of this replica succeeds in the
    /// same transaction if the session moved (one commit where a create ends).
    pub async fn transition_finishing(
        &self,
        id: &SessionId,
        from: &[SessionState],
        to: SessionState,
        op: &OperationId,
    ) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let moved = transition_in(&mut tx, id, from, to, None).await?;
        if moved {
            crate::operations::finish_in(&mut tx, &self.replica, op, None).await?;
        }
        tx.commit().await?;
        Ok(moved)
    }

    pub async fn record_event(&self, id: &SessionId, kind: &str, message: &str) -> Result<()> {
        let mut tx = self.write_tx().await?;
        insert_event(&mut tx, id, kind, None, None, Some(message)).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn events(&self, id: &SessionId) -> Result<Vec<SessionEvent>> {
        let rows = sqlx::query(
            "SELECT seq, session_id, at, kind, from_state, to_state, message FROM events WHERE session_id = $1 ORDER BY seq",
        )
        .bind(id.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SessionEvent {
                    seq: r.get(0),
                    session_id: parse("session id", r.get::<&str, _>(1))?,
                    at: r.get(2),
                    kind: r.get(3),
                    from_state: r.get::<Option<&str>, _>(4).and_then(SessionState::parse),
                    to_state: r.get::<Option<&str>, _>(5).and_then(SessionState::parse),
                    message: r.get(6),
                })
            })
            .collect()
    }

    /// Records that `sandbox` belongs to its session (and which template version it runs),
    /// before anything is started for it. A sandbox that is already running (a warm pod) is
    /// recorded as running in the same transaction.
    ///
    /// An operation re-run after a crash names the same sandbox again (restores name theirs up
    /// front): a row of the same session is its own half-made attempt and is taken over, back
    /// to `starting`. A row of another session is refused.
    pub async fn insert_sandbox(&self, new: &NewSandbox<'_>) -> Result<()> {
        let now = now_ms();
        let (state, pid) = match new.running_pid {
            Some(pid) => ("running", Some(i64::from(pid))),
            None => ("starting", None),
        };
        let mut tx = self.write_tx().await?;
        let inserted = sqlx::query(
            "INSERT INTO sandboxes (id, session_id, node_id, state, pid, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $6) \
             ON CONFLICT (id) DO UPDATE SET node_id = excluded.node_id, state = excluded.state, pid = excluded.pid, \
             updated_at = excluded.updated_at WHERE sandboxes.session_id = excluded.session_id",
        )
        .bind(new.id.as_str())
        .bind(new.session.as_str())
        .bind(new.node)
        .bind(state)
        .bind(pid)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() != 1 {
            return Err(StoreError::Conflict(format!("sandbox {} belongs to another session", new.id)));
        }
        sqlx::query("UPDATE sessions SET sandbox_id = $1, template_version = $2, updated_at = $3 WHERE id = $4")
            .bind(new.id.as_str())
            .bind(new.template_version as i64)
            .bind(now)
            .bind(new.session.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Replaces the session's settings (`PATCH /v1/sessions/{id}`) in one write.
    pub async fn set_settings(
        &self,
        id: &SessionId,
        policy: &SnapshotPolicy,
        lifetime: &SessionLifetime,
    ) -> Result<()> {
        sqlx::query("UPDATE sessions SET snapshot_policy = $1, lifetime = $2, updated_at = $3 WHERE id = $4")
            .bind(serde_json::to_string(policy).unwrap_or_default())
            .bind(serde_json::to_string(lifetime).unwrap_or_default())
            .bind(now_ms())
            .bind(id.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Points the session back at `sandbox` (a restore that failed returns to the old one).
    pub async fn set_session_sandbox(&self, session: &SessionId, sandbox: &SandboxId) -> Result<()> {
        sqlx::query("UPDATE sessions SET sandbox_id = $1, updated_at = $2 WHERE id = $3")
            .bind(sandbox.as_str())
            .bind(now_ms())
            .bind(session.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub async fn set_sandbox_running(&self, sandbox: &SandboxId, pid: u32) -> Result<()> {
        sqlx::query("UPDATE sandboxes SET state = 'running', pid = $1, updated_at = $2 WHERE id = $3")
            .bind(pid as i64)
            .bind(now_ms())
            .bind(sandbox.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// Marks a sandbox destroyed and detaches it from its session.
    pub async fn set_sandbox_gone(&self, sandbox: &SandboxId) -> Result<()> {
        let now = now_ms();
        let mut tx = self.write_tx().await?;
        sqlx::query("UPDATE sandboxes SET state = 'gone', updated_at = $1 WHERE id = $2")
            .bind(now)
            .bind(sandbox.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE sessions SET sandbox_id = NULL, updated_at = $1 WHERE sandbox_id = $2")
            .bind(now)
            .bind(sandbox.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Sandboxes of `node` that are not known to be gone.
    pub async fn live_sandboxes(&self, node: &str) -> Result<Vec<SandboxRecord>> {
        let rows = sqlx::query(
            "SELECT id, session_id, node_id, state, pid FROM sandboxes WHERE node_id = $1 AND state <> 'gone'",
        )
        .bind(node)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SandboxRecord {
                    id: parse("sandbox id", r.get::<&str, _>(0))?,
                    session_id: parse("session id", r.get::<&str, _>(1))?,
                    node_id: r.get(2),
                    state: r.get(3),
                    pid: r.get::<Option<i64>, _>(4).map(|p| p as u32),
                })
            })
            .collect()
    }
}

/// The rows of [`Store::insert_session`], inside the caller's transaction, its operation to be
/// run by `runner`.
pub(crate) async fn insert_session_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    new: &NewSession,
    egress: Option<&crate::NewSessionEgress>,
    runner: Runner<'_>,
) -> Result<OperationRecord> {
    check_quota_tx(tx, &new.tenant_id, &Demand::new_session(&new.resources)).await?;
    let now = now_ms();
    let policy = egress.map(|e| serde_json::to_string(&e.egress.policy).unwrap_or_default());
    sqlx::query(
        "INSERT INTO sessions (id, tenant_id, template, state, resources, env, created_at, updated_at, source_snapshot, template_version, snapshot_policy, lifetime, runtime, name, labels, metadata, auto_resume, forked_from, network_policy, ca_cert, ca_key_sealed, idempotency_key)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                 (SELECT session_id FROM snapshots WHERE id = $8), COALESCE($17, '{}'), $18, $19, $20)",
    )
    .bind(new.id.as_str())
    .bind(new.tenant_id.as_str())
    .bind(&new.template)
    .bind(SessionState::Creating.as_str())
    .bind(serde_json::to_string(&new.resources).unwrap_or_default())
    .bind(serde_json::to_string(&new.env).unwrap_or_default())
    .bind(now)
    .bind(new.source_snapshot.as_ref().map(|s| s.as_str().to_owned()))
    .bind(new.template_version.map(i64::from))
    .bind(serde_json::to_string(&new.snapshot_policy).unwrap_or_default())
    .bind(serde_json::to_string(&new.lifetime).unwrap_or_default())
    .bind(new.runtime.as_str())
    .bind(new.meta.name.as_deref())
    .bind(serde_json::to_string(&new.meta.labels).unwrap_or_default())
    .bind(serde_json::to_string(&new.meta.metadata).unwrap_or_default())
    .bind(new.meta.auto_resume)
    .bind(policy)
    .bind(egress.and_then(|e| e.egress.ca_cert.clone()))
    .bind(egress.and_then(|e| e.egress.ca_key_sealed.clone()))
    .bind(egress.and_then(|e| e.idempotency_key.clone()))
    .execute(&mut **tx)
    .await?;
    insert_labels(tx, &new.id, &new.meta.labels).await?;
    insert_event(tx, &new.id, "created", None, Some(SessionState::Creating), None).await?;
    let op = NewOperation {
        tenant_id: new.tenant_id.clone(),
        session_id: Some(new.id.clone()),
        kind: OperationKind::CreateSession,
        input: None,
    };
    insert_operation_run_by(tx, &op, runner).await
}

async fn insert_labels(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &SessionId,
    labels: &BTreeMap<String, String>,
) -> Result<()> {
    for (key, value) in labels {
        sqlx::query("INSERT INTO session_labels (session_id, key, value) VALUES ($1, $2, $3)")
            .bind(id.as_str())
            .bind(key)
            .bind(value)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// Moves session `id` to `to` if it is in one of `from` (recording the event); whether it moved.
async fn transition_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &SessionId,
    from: &[SessionState],
    to: SessionState,
    error: Option<&str>,
) -> Result<bool> {
    let current: Option<String> = sqlx::query_scalar("SELECT state FROM sessions WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(&mut **tx)
        .await?;
    let Some(current) = current.as_deref().and_then(SessionState::parse) else {
        return Ok(false);
    };
    if !from.contains(&current) {
        return Ok(false);
    }
    sqlx::query("UPDATE sessions SET state = $1, error = $2, updated_at = $3 WHERE id = $4")
        .bind(to.as_str())
        .bind(error)
        .bind(now_ms())
        .bind(id.as_str())
        .execute(&mut **tx)
        .await?;
    insert_event(tx, id, "state", Some(current), Some(to), error).await?;
    Ok(true)
}

pub(crate) async fn insert_event(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    id: &SessionId,
    kind: &str,
    from: Option<SessionState>,
    to: Option<SessionState>,
    message: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO events (session_id, at, kind, from_state, to_state, message) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id.as_str())
    .bind(now_ms())
    .bind(kind)
    .bind(from.map(SessionState::as_str))
    .bind(to.map(SessionState::as_str))
    .bind(message)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::test_store;

    pub(crate) async fn new_session(store: &Store, tenant: &str) -> (TenantId, SessionId) {
        let tenant_id = store.ensure_tenant(tenant).await.unwrap();
        let new = a_new_session(&tenant_id);
        store.insert_session(&new).await.unwrap();
        (tenant_id, new.id)
    }

    /// A session of `tenant_id` with the defaults, to be inserted.
    pub(crate) fn a_new_session(tenant_id: &TenantId) -> NewSession {
        NewSession {
            id: SessionId::generate(),
            tenant_id: tenant_id.clone(),
            template: "busybox".into(),
            runtime: Default::default(),
            resources: Resources::default(),
            env: BTreeMap::new(),
            source_snapshot: None,
            template_version: None,
            snapshot_policy: SnapshotPolicy::off(),
            lifetime: Default::default(),
            meta: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_rerun_takes_over_its_own_sandbox_row_but_not_another_sessions() {
        let (store, _dir) = test_store().await;
        let (_, id) = new_session(&store, "a").await;
        let (_, other) = new_session(&store, "a").await;
        let sandbox = SandboxId::generate();
        let new = NewSandbox { id: &sandbox, session: &id, node: "n", template_version: 1, running_pid: None };
        store.insert_sandbox(&new).await.unwrap();
        store.set_sandbox_running(&sandbox, 42).await.unwrap();
        store.set_sandbox_gone(&sandbox).await.unwrap();
        // The re-run of a restore after a crash: same id, same session.
        store.insert_sandbox(&new).await.expect("a re-run must adopt its own attempt");
        let live = store.live_sandboxes("n").await.unwrap();
        let row = live.iter().find(|s| s.id == sandbox).expect("the row is live again");
        assert_eq!((row.state.as_str(), row.pid), ("starting", None));
        let theirs = NewSandbox { session: &other, ..new };
        assert!(matches!(store.insert_sandbox(&theirs).await, Err(StoreError::Conflict(_))));
    }

    #[tokio::test]
    async fn sessions_are_tenant_scoped() {
        let (store, _dir) = test_store().await;
        let (a, id) = new_session(&store, "a").await;
        let b = store.ensure_tenant("b").await.unwrap();
        assert!(store.session(&a, &id).await.unwrap().is_some());
        assert!(store.session(&b, &id).await.unwrap().is_none());
        let filter = SessionFilter { tenant: Some(b.clone()), include_destroyed: true, ..Default::default() };
        assert!(store.list_sessions(&filter).await.unwrap().is_empty());
        assert!(store.begin_destroy(&b, &id).await.unwrap().is_none());
        assert!(store.begin_destroy(&a, &id).await.unwrap().is_some());
        assert!(store.begin_destroy(&a, &id).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn sessions_are_found_by_all_their_labels_and_labels_are_replaced_whole() {
        let (store, _dir) = test_store().await;
        let (tenant, a) = new_session(&store, "a").await;
        let (_, b) = new_session(&store, "a").await;
        let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let meta = |pairs: &[(&str, &str)]| SessionMeta { labels: labels(pairs), ..SessionMeta::default() };
        store.set_meta(&a, &meta(&[("team", "x"), ("env", "prod")])).await.unwrap();
        store.set_meta(&b, &meta(&[("team", "x")])).await.unwrap();
        let find = |pairs: &[(&str, &str)]| SessionFilter {
            tenant: Some(tenant.clone()),
            labels: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..SessionFilter::default()
        };
        let ids = |list: Vec<Session>| list.into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(store.list_sessions(&find(&[("team", "x"), ("env", "prod")])).await.unwrap()), vec![a.clone()]);
        assert_eq!(store.list_sessions(&find(&[("team", "x")])).await.unwrap().len(), 2);
        store.set_meta(&a, &meta(&[("team", "y")])).await.unwrap();
        assert!(store.list_sessions(&find(&[("env", "prod")])).await.unwrap().is_empty(), "the old labels are gone");
        let session = store.session(&tenant, &a).await.unwrap().unwrap();
        assert_eq!((session.labels, session.tenant.as_str()), (labels(&[("team", "y")]), "a"));
    }

    #[tokio::test]
    async fn transitions_are_compare_and_set_and_recorded() {
        let (store, _dir) = test_store().await;
        let (_, id) = new_session(&store, "a").await;
        assert!(store.transition(&id, &[SessionState::Creating], SessionState::Running, None).await.unwrap());
        assert!(!store.transition(&id, &[SessionState::Creating], SessionState::Failed, None).await.unwrap());
        let events = store.events(&id).await.unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].to_state, Some(SessionState::Running));
    }

    #[tokio::test]
    async fn a_create_ends_with_its_session_running_and_its_operation_done_together() {
        let (store, _dir) = test_store().await;
        let (tenant, id) = new_session(&store, "a").await;
        let (_, gone) = new_session(&store, "a").await;
        let (creating, running) = (&[SessionState::Creating], SessionState::Running);
        let mut ended = 0;
        while ended < 2 {
            let op = store.claim_operation(now_ms(), 60_000).await.unwrap().expect("a create to run");
            // The destroy below queues an operation that may be claimed first when it was made
            // in the same millisecond as the other create (ties go by random id).
            if op.kind != OperationKind::CreateSession {
                continue;
            }
            ended += 1;
            let session = op.operation.session_id.clone().unwrap();
            if session == gone {
                // Destroyed while it was being created: neither moves.
                store.begin_destroy(&tenant, &gone).await.unwrap().unwrap();
                assert!(!store.transition_finishing(&gone, creating, running, &op.operation.id).await.unwrap());
                let op = store.operation(&tenant, &op.operation.id).await.unwrap().unwrap();
                assert_eq!(op.state, space_api::OperationState::Running);
            } else {
                assert!(store.transition_finishing(&id, creating, running, &op.operation.id).await.unwrap());
                let op = store.operation(&tenant, &op.operation.id).await.unwrap().unwrap();
                assert_eq!(op.state, space_api::OperationState::Succeeded);
                let session = store.session(&tenant, &id).await.unwrap().unwrap();
                assert_eq!(session.state, SessionState::Running);
            }
        }
    }

    /// Many concurrent writers (creates racing destroys) must wait for the lock, not fail.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writers_do_not_fail_with_busy() {
        let (store, _dir) = test_store().await;
        let mut tasks = Vec::new();
        for i in 0..40 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let (tenant, id) = new_session(&store, &format!("t{}", i % 4)).await;
                let to = SessionState::Running;
                assert!(store.transition(&id, &[SessionState::Creating], to, None).await.unwrap());
                assert!(store.begin_destroy(&tenant, &id).await.unwrap().is_some());
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    }

    #[tokio::test]
    async fn sandbox_intent_is_recorded_before_running() {
        let (store, _dir) = test_store().await;
        let (_, id) = new_session(&store, "a").await;
        let sbx = SandboxId::generate();
        let new = NewSandbox { id: &sbx, session: &id, node: "node_x", template_version: 3, running_pid: None };
        store.insert_sandbox(&new).await.unwrap();
        let live = store.live_sandboxes("node_x").await.unwrap();
        assert_eq!(live[0].state, "starting");
        assert_eq!(store.session_any(&id).await.unwrap().unwrap().session.template_version, Some(3));
        store.set_sandbox_gone(&sbx).await.unwrap();
        assert!(store.live_sandboxes("node_x").await.unwrap().is_empty());
        assert!(store.session_any(&id).await.unwrap().unwrap().session.sandbox_id.is_none());
    }

    #[tokio::test]
    async fn a_bound_pod_is_recorded_running() {
        let (store, _dir) = test_store().await;
        let (_, id) = new_session(&store, "a").await;
        let sbx = SandboxId::generate();
        let new = NewSandbox { id: &sbx, session: &id, node: "node_x", template_version: 1, running_pid: Some(42) };
        store.insert_sandbox(&new).await.unwrap();
        let live = store.live_sandboxes("node_x").await.unwrap();
        assert_eq!((live[0].state.as_str(), live[0].pid), ("running", Some(42)));
        assert_eq!(store.session_any(&id).await.unwrap().unwrap().session.sandbox_id, Some(sbx));
    }
}
