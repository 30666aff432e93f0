//! Operations: the durable queue of work the reconciler performs.

use space_api::{ErrorCode, Operation, OperationId, OperationState, Progress, SessionId, TenantId};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{Backend, Result, Store, StoreError, now_ms, parse};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationKind {
    CreateSession,
    DestroySession,
    RestoreSession,
    BuildTemplate,
    ImportTemplate,
    /// A Dockerfile build (`POST /v1/templates/builds`).
    BuildDockerfile,
}

impl OperationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OperationKind::CreateSession => "create_session",
            OperationKind::DestroySession => "destroy_session",
            OperationKind::RestoreSession => "restore_session",
            OperationKind::BuildTemplate => "build_template",
            OperationKind::ImportTemplate => "import_template",
            OperationKind::BuildDockerfile => "build_dockerfile",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "create_session" => OperationKind::CreateSession,
            "destroy_session" => OperationKind::DestroySession,
            "restore_session" => OperationKind::RestoreSession,
            "build_template" => OperationKind::BuildTemplate,
            "import_template" => OperationKind::ImportTemplate,
            "build_dockerfile" => OperationKind::BuildDockerfile,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone)]
pub struct NewOperation {
    pub tenant_id: TenantId,
    pub session_id: Option<SessionId>,
    pub kind: OperationKind,
    /// Kind-specific JSON input.
    pub input: Option<String>,
}

fn state_str(state: OperationState) -> &'static str {
    match state {
        OperationState::Pending => "pending",
        OperationState::Running => "running",
        OperationState::Succeeded => "succeeded",
        OperationState::Failed => "failed",
    }
}

fn parse_state(s: &str) -> Result<OperationState> {
    Ok(match s {
        "pending" => OperationState::Pending,
        "running" => OperationState::Running,
        "succeeded" => OperationState::Succeeded,
        "failed" => OperationState::Failed,
        other => return Err(StoreError::Corrupt(format!("operation state {other}"))),
    })
}

/// Leases renewed by one statement (each id is one of its parameters).
const RENEWED_AT_ONCE: usize = 500;

const OP_COLUMNS: &str =
    "id, kind, state, session_id, error, progress, created_at, updated_at, input, tenant_id, error_code";

/// An operation plus what the reconciler needs to run it.
#[derive(Debug, Clone)]
pub struct OperationRecord {
    pub operation: Operation,
    pub kind: OperationKind,
    pub input: Option<String>,
    pub tenant_id: TenantId,
}

fn op_from_row(row: &AnyRow) -> Result<OperationRecord> {
    let kind: &str = row.get(1);
    let progress: Option<&str> = row.get(5);
    let operation = Operation {
        id: parse("operation id", row.get::<&str, _>(0))?,
        kind: kind.to_owned(),
        state: parse_state(row.get(2))?,
        session_id: row.get::<Option<&str>, _>(3).map(|s| parse("session id", s)).transpose()?,
        error: row.get(4),
        // A code this build does not know reads as none: the message still says what failed.
        error_code: row.get::<Option<&str>, _>(10).and_then(|c| serde_json::from_value(c.into()).ok()),
        progress: progress.and_then(|p| serde_json::from_str::<Progress>(p).ok()),
        created_at: row.get(6),
        updated_at: row.get(7),
    };
    Ok(OperationRecord {
        kind: OperationKind::parse(kind).ok_or_else(|| StoreError::Corrupt(format!("operation kind {kind}")))?,
        operation,
        input: row.get(8),
        tenant_id: parse("tenant id", row.get::<&str, _>(9))?,
    })
}

/// Which replica runs a new operation.
#[derive(Debug, Clone, Copy)]
pub enum Runner<'a> {
    /// The first whose loop claims it.
    AnyReplica,
    /// `replica`, which runs it at once: it is recorded claimed by it, leased until
    /// `lease_until` (another replica takes it over only if that lease runs out).
    Claimed { replica: &'a str, lease_until: i64 },
}

pub(crate) async fn insert_operation(conn: &mut sqlx::AnyConnection, new: &NewOperation) -> Result<OperationId> {
    Ok(insert_operation_run_by(conn, new, Runner::AnyReplica).await?.operation.id)
}

/// Records operation `new`, to be run by `runner`; returns it as recorded.
pub(crate) async fn insert_operation_run_by(
    conn: &mut sqlx::AnyConnection,
    new: &NewOperation,
    runner: Runner<'_>,
) -> Result<OperationRecord> {
    insert_operation_with_id(conn, OperationId::generate(), new, runner).await
}

async fn insert_operation_with_id(
    conn: &mut sqlx::AnyConnection,
    id: OperationId,
    new: &NewOperation,
    runner: Runner<'_>,
) -> Result<OperationRecord> {
    let now = now_ms();
    let (state, replica, lease_until) = match runner {
        Runner::AnyReplica => (OperationState::Pending, None, None),
        Runner::Claimed { replica, lease_until } => (OperationState::Running, Some(replica), Some(lease_until)),
    };
    sqlx::query(
        "INSERT INTO operations (id, tenant_id, session_id, kind, state, input, created_at, updated_at, claimed_by, lease_expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9)",
    )
    .bind(id.as_str())
    .bind(new.tenant_id.as_str())
    .bind(new.session_id.as_ref().map(|s| s.as_str()))
    .bind(new.kind.as_str())
    .bind(state_str(state))
    .bind(&new.input)
    .bind(now)
    .bind(replica)
    .bind(lease_until)
    .execute(conn)
    .await?;
    let operation = Operation {
        id,
        kind: new.kind.as_str().to_owned(),
        state,
        session_id: new.session_id.clone(),
        error: None,
        error_code: None,
        progress: None,
        created_at: now,
        updated_at: now,
    };
    Ok(OperationRecord { operation, kind: new.kind, input: new.input.clone(), tenant_id: new.tenant_id.clone() })
}

/// Records operation `id`'s end (failed with `error`, else succeeded) if `replica` still runs
/// it; whether it did.
pub(crate) async fn finish_in(
    conn: &mut sqlx::AnyConnection,
    replica: &str,
    id: &OperationId,
    error: Option<(ErrorCode, &str)>,
) -> Result<bool> {
    let state = if error.is_some() { OperationState::Failed } else { OperationState::Succeeded };
    let code = error.and_then(|(code, _)| serde_json::to_value(code).ok()?.as_str().map(str::to_owned));
    let finished = sqlx::query(
        "UPDATE operations SET state = $1, error = $2, error_code = $5, updated_at = $3
         WHERE id = $4 AND state = 'running' AND claimed_by = $6",
    )
    .bind(state_str(state))
    .bind(error.map(|(_, message)| message))
    .bind(now_ms())
    .bind(id.as_str())
    .bind(code)
    .bind(replica)
    .execute(conn)
    .await?;
    Ok(finished.rows_affected() == 1)
}

impl Store {
    pub async fn insert_operation(&self, new: &NewOperation) -> Result<OperationId> {
        let mut conn = self.pool.acquire().await?;
        insert_operation(&mut conn, new).await
    }

    /// [`Self::insert_operation`] under an id the caller chose (and may have handed out
    /// already); an id in use fails.
    pub async fn insert_operation_as(&self, id: &OperationId, new: &NewOperation) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        insert_operation_with_id(&mut conn, id.clone(), new, Runner::AnyReplica).await.map(drop)
    }

    pub async fn operation(&self, tenant: &TenantId, id: &OperationId) -> Result<Option<Operation>> {
        let sql = format!("SELECT {OP_COLUMNS} FROM operations WHERE id = $1 AND tenant_id = $2");
        let row = sqlx::query(&sql).bind(id.as_str()).bind(tenant.as_str()).fetch_optional(&self.pool).await?;
        row.map(|r| op_from_row(&r).map(|o| o.operation)).transpose()
    }

    /// The newest `limit` operations of `kind` that `tenant` made, newest first.
    pub async fn list_operations(
        &self,
        tenant: &TenantId,
        kind: OperationKind,
        limit: i64,
    ) -> Result<Vec<OperationRecord>> {
        let sql = format!(
            "SELECT {OP_COLUMNS} FROM operations WHERE tenant_id = $1 AND kind = $2 ORDER BY created_at DESC, id LIMIT $3"
        );
        let rows =
            sqlx::query(&sql).bind(tenant.as_str()).bind(kind.as_str()).bind(limit).fetch_all(&self.pool).await?;
        rows.iter().map(op_from_row).collect()
    }

    /// Appends `lines` to the log of operation `id`, numbered from `first`.
    pub async fn append_operation_log(&self, id: &OperationId, first: i64, lines: &[String]) -> Result<()> {
        let mut tx = self.writer.begin().await?;
        for (i, line) in lines.iter().enumerate() {
            sqlx::query("INSERT INTO operation_logs (operation_id, seq, line) VALUES ($1, $2, $3)")
                .bind(id.as_str())
                .bind(first + i as i64)
                .bind(line)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The number the next line of operation `id`'s log gets (a re-run appends after the
    /// lines of the run a crash cut short).
    pub async fn next_operation_log_seq(&self, id: &OperationId) -> Result<i64> {
        let row = sqlx::query("SELECT COALESCE(MAX(seq) + 1, 0) FROM operation_logs WHERE operation_id = $1")
            .bind(id.as_str())
            .fetch_one(&self.pool)
            .await?;
        Ok(row.get::<i64, _>(0))
    }

    /// Up to `limit` lines of the log of `tenant`'s operation `id`, from number `after`
    /// on; `None` when the tenant has no such operation.
    pub async fn operation_log(
        &self,
        tenant: &TenantId,
        id: &OperationId,
        after: i64,
        limit: i64,
    ) -> Result<Option<Vec<(i64, String)>>> {
        if self.operation(tenant, id).await?.is_none() {
            return Ok(None);
        }
        let rows = sqlx::query(
            "SELECT seq, line FROM operation_logs WHERE operation_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
        )
        .bind(id.as_str())
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(Some(rows.iter().map(|r| (r.get::<i64, _>(0), r.get::<String, _>(1))).collect()))
    }

    /// Claims the oldest operation that is pending, or running under a lease that ran out at
    /// `now` (its replica died), for this handle's replica, leased until `now + lease_ms`. On
    /// PostgreSQL replicas that claim at once each take a different one: a row another has
    /// locked is skipped, not waited for.
    pub async fn claim_operation(&self, now: i64, lease_ms: i64) -> Result<Option<OperationRecord>> {
        let skip_locked = match self.backend {
            Backend::Postgres => " FOR UPDATE SKIP LOCKED",
            Backend::Sqlite => "",
        };
        let claimable = "(state = 'pending' OR (state = 'running' AND lease_expires_at <= $1))";
        let sql = format!(
            "UPDATE operations SET state = 'running', updated_at = $1, claimed_by = $2, lease_expires_at = $3
             WHERE {claimable} AND id = (SELECT id FROM operations WHERE {claimable} \
             ORDER BY created_at, id LIMIT 1{skip_locked})
             RETURNING {OP_COLUMNS}"
        );
        let row = sqlx::query(&sql)
            .bind(now)
            .bind(&*self.replica)
            .bind(now.saturating_add(lease_ms))
            .fetch_optional(&self.writer)
            .await?;
        row.map(|r| op_from_row(&r)).transpose()
    }

    /// Renews until `until` the leases of operations `ids`, those this handle's replica claimed
    /// and is running. One it claimed but no longer runs (its task was never started, or
    /// panicked) keeps its lease until it runs out, and is then claimed again.
    pub async fn renew_operation_leases(&self, ids: &[OperationId], until: i64) -> Result<u64> {
        let mut renewed = 0;
        for chunk in ids.chunks(RENEWED_AT_ONCE) {
            let list = (0..chunk.len()).map(|i| format!("${}", i + 3)).collect::<Vec<_>>().join(", ");
            let sql = format!(
                "UPDATE operations SET lease_expires_at = $1 WHERE claimed_by = $2 AND state = 'running' AND id IN ({list})"
            );
            let mut query = sqlx::query(&sql).bind(until).bind(&*self.replica);
            for id in chunk {
                query = query.bind(id.as_str());
            }
            renewed += query.execute(&self.writer).await?.rows_affected();
        }
        Ok(renewed)
    }

    /// Records the operation's end: `error` is the failure's (code, message). Only its
    /// claimant's end counts: a replica that lost its lease (it stalled past it, and another
    /// took the operation over) records nothing, and `false` says so.
    pub async fn finish_operation(&self, id: &OperationId, error: Option<(ErrorCode, &str)>) -> Result<bool> {
        let mut conn = self.writer.acquire().await?;
        finish_in(&mut conn, &self.replica, id, error).await
    }

    pub async fn set_operation_progress(&self, id: &OperationId, progress: &Progress) -> Result<()> {
        sqlx::query("UPDATE operations SET progress = $1, updated_at = $2 WHERE id = $3")
            .bind(serde_json::to_string(progress).unwrap_or_default())
            .bind(now_ms())
            .bind(id.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// At a replica's start, the operations its earlier process was running are run again
    /// (every step is idempotent); so are those of no replica (claimed before replicas were
    /// recorded). Other replicas' operations are theirs until their leases run out.
    pub async fn requeue_running_operations(&self) -> Result<u64> {
        Ok(sqlx::query(
            "UPDATE operations SET state = 'pending', claimed_by = NULL, lease_expires_at = NULL
             WHERE state = 'running' AND (claimed_by = $1 OR claimed_by IS NULL)",
        )
        .bind(&*self.replica)
        .execute(&self.writer)
        .await?
        .rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store;

    const LEASE: i64 = 15_000;

    fn build(tenant: &TenantId) -> NewOperation {
        NewOperation { tenant_id: tenant.clone(), session_id: None, kind: OperationKind::BuildTemplate, input: None }
    }

    #[tokio::test]
    async fn claim_runs_each_operation_once() {
        let (store, _dir) = test_store().await;
        let t = store.ensure_tenant("t").await.unwrap();
        let id = store.insert_operation(&build(&t)).await.unwrap();
        let claimed = store.claim_operation(now_ms(), LEASE).await.unwrap().unwrap();
        assert_eq!(claimed.operation.id, id);
        assert!(store.claim_operation(now_ms(), LEASE).await.unwrap().is_none());
        assert_eq!(store.requeue_running_operations().await.unwrap(), 1);
        let again = store.claim_operation(now_ms(), LEASE).await.unwrap().unwrap();
        assert!(store.finish_operation(&again.operation.id, Some((ErrorCode::StorageFull, "boom"))).await.unwrap());
        let op = store.operation(&t, &id).await.unwrap().unwrap();
        assert_eq!(op.state, OperationState::Failed);
        assert_eq!(op.error.as_deref(), Some("boom"));
    }

    #[tokio::test]
    async fn a_create_run_by_the_replica_that_records_it_is_no_other_ones_until_its_lease_runs_out() {
        let (store, _dir) = test_store().await;
        let (a, b) = (store.clone().as_replica("a"), store.as_replica("b"));
        let t = a.ensure_tenant("t").await.unwrap();
        let new = crate::sessions::tests::a_new_session(&t);
        let egress = crate::SessionEgressRecord { policy: Default::default(), ca_cert: None, ca_key_sealed: None };
        let egress = crate::NewSessionEgress { egress, grants: vec![], inherited_from: None, idempotency_key: None };
        let op = a.insert_session_to_run(&new, &egress, LEASE).await.unwrap();
        let now = now_ms();
        assert_eq!((op.kind, op.operation.session_id.as_ref()), (OperationKind::CreateSession, Some(&new.id)));
        // What the caller is handed is what was recorded.
        let stored = a.operation(&t, &op.operation.id).await.unwrap().unwrap();
        assert_eq!((stored.state, stored.created_at), (OperationState::Running, op.operation.created_at));
        assert_eq!(op.operation.state, OperationState::Running);
        // No loop claims it while its lease holds, not even a's own.
        assert!(a.claim_operation(now, LEASE).await.unwrap().is_none());
        assert!(b.claim_operation(now + LEASE - 2_000, LEASE).await.unwrap().is_none());
        // a died before renewing it: at the lease's end b takes the create over.
        let taken = b.claim_operation(now + LEASE, LEASE).await.unwrap().unwrap();
        assert_eq!(taken.operation.id, op.operation.id);
        assert!(!a.finish_operation(&op.operation.id, None).await.unwrap(), "a's end no longer counts");
    }

    #[tokio::test]
    async fn only_the_leases_of_operations_still_running_are_renewed() {
        let (store, _dir) = test_store().await;
        let t = store.ensure_tenant("t").await.unwrap();
        let mut ids = Vec::new();
        for _ in 0..RENEWED_AT_ONCE + 2 {
            ids.push(store.insert_operation(&build(&t)).await.unwrap());
            store.claim_operation(now_ms(), LEASE).await.unwrap().unwrap();
        }
        let now = now_ms();
        // All but the first: its task is gone.
        assert_eq!(store.renew_operation_leases(&ids[1..], now + 2 * LEASE).await.unwrap(), ids.len() as u64 - 1);
        let again = store.claim_operation(now + LEASE, LEASE).await.unwrap().unwrap();
        assert_eq!(again.operation.id, ids[0]);
        assert!(store.claim_operation(now + LEASE, LEASE).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn another_replica_takes_an_operation_over_when_its_lease_runs_out() {
        let (store, _dir) = test_store().await;
        let (a, b) = (store.clone().as_replica("a"), store.as_replica("b"));
        let t = a.ensure_tenant("t").await.unwrap();
        let id = a.insert_operation(&build(&t)).await.unwrap();
        let now = now_ms();
        assert_eq!(a.claim_operation(now, LEASE).await.unwrap().unwrap().operation.id, id);
        // b starting requeues only its own; a's lease holds while a renews it.
        assert_eq!(b.requeue_running_operations().await.unwrap(), 0);
        assert!(b.claim_operation(now + LEASE - 1, LEASE).await.unwrap().is_none());
        assert_eq!(a.renew_operation_leases(std::slice::from_ref(&id), now + 2 * LEASE).await.unwrap(), 1);
        assert!(b.claim_operation(now + 2 * LEASE - 1, LEASE).await.unwrap().is_none());
        // a stopped renewing: at the lease's end b takes the operation over.
        let taken = b.claim_operation(now + 2 * LEASE, LEASE).await.unwrap().unwrap();
        assert_eq!((taken.operation.id.clone(), taken.operation.state), (id.clone(), OperationState::Running));
        // a, late, finishes it: that counts for nothing; b's end does.
        assert!(!a.finish_operation(&id, Some((ErrorCode::Internal, "late"))).await.unwrap());
        assert_eq!(a.renew_operation_leases(std::slice::from_ref(&id), now + 3 * LEASE).await.unwrap(), 0);
        assert!(b.finish_operation(&id, None).await.unwrap());
        let op = b.operation(&t, &id).await.unwrap().unwrap();
        assert_eq!((op.state, op.error), (OperationState::Succeeded, None));
    }
}
