//! A session's egress settings: network policy and certificate authority.

use space_api::egress::NetworkPolicy;
use space_api::{CredentialId, OperationId, SessionId};
use sqlx::Row;

use crate::operations::Runner;
use crate::sessions::insert_session_tx;
use crate::{NewSession, OperationRecord, Result, Store, StoreError, now_ms};

/// A session's stored egress settings.
#[derive(Clone)]
pub struct SessionEgressRecord {
    pub policy: NetworkPolicy,
    /// The session CA's certificate (PEM); `None` for sessions made before egress existed.
    pub ca_cert: Option<String>,
    /// The CA's private key (PEM), sealed by space-keys.
    pub ca_key_sealed: Option<Vec<u8>>,
}

impl std::fmt::Debug for SessionEgressRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEgressRecord").field("policy", &self.policy).finish_non_exhaustive()
    }
}

/// What a new session starts with.
#[derive(Debug, Clone)]
pub struct NewSessionEgress {
    pub egress: SessionEgressRecord,
    pub grants: Vec<CredentialId>,
    /// The session a fork's `grants` were copied from: they follow its revocations (see
    /// [`Store::revoke`]). `None` for a new session: its grants are its own.
    pub inherited_from: Option<SessionId>,
    /// The Idempotency-Key of the request that creates it, if it had one (see
    /// [`Store::session_created_under_key`]).
    pub idempotency_key: Option<String>,
}

fn policy_from(json: &str) -> Result<NetworkPolicy> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("network policy: {e}")))
}

impl Store {
    /// [`Store::insert_session`] plus the session's egress settings and grants, atomically.
    pub async fn insert_session_with_egress(&self, new: &NewSession, egress: &NewSessionEgress) -> Result<OperationId> {
        let ops = self.insert_sessions_run_by(&[(new, egress)], Runner::AnyReplica).await?;
        Ok(one_operation(ops)?.operation.id)
    }

    /// [`Store::insert_session_with_egress`], its operation claimed by this handle's replica
    /// under a lease of `lease_ms`: the caller runs it at once, no loop needs to claim it.
    pub async fn insert_session_to_run(
        &self,
        new: &NewSession,
        egress: &NewSessionEgress,
        lease_ms: i64,
    ) -> Result<OperationRecord> {
        let runner = Runner::Claimed { replica: &self.replica, lease_until: now_ms().saturating_add(lease_ms) };
        one_operation(self.insert_sessions_run_by(&[(new, egress)], runner).await?)
    }

    /// Several sessions (the children of a fork) in one transaction: all are recorded, or,
    /// when one would go over the tenant's quota, none.
    pub async fn insert_sessions_with_egress(
        &self,
        sessions: &[(&NewSession, &NewSessionEgress)],
    ) -> Result<Vec<OperationId>> {
        let ops = self.insert_sessions_run_by(sessions, Runner::AnyReplica).await?;
        Ok(ops.into_iter().map(|op| op.operation.id).collect())
    }

    /// [`Store::insert_sessions_with_egress`], each operation to be run by `runner`; one
    /// operation per session, in their order.
    async fn insert_sessions_run_by(
        &self,
        sessions: &[(&NewSession, &NewSessionEgress)],
        runner: Runner<'_>,
    ) -> Result<Vec<OperationRecord>> {
        let mut tx = self.write_tx().await?;
        let mut ops = Vec::new();
        for (new, egress) in sessions {
            ops.push(insert_with_egress_tx(&mut tx, new, egress, runner).await?);
        }
        tx.commit().await?;
        Ok(ops)
    }

    /// The session's egress settings; `None` if there is no such session.
    pub async fn session_egress(&self, session: &SessionId) -> Result<Option<SessionEgressRecord>> {
        let row = sqlx::query("SELECT network_policy, ca_cert, ca_key_sealed FROM sessions WHERE id = $1")
            .bind(session.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(SessionEgressRecord { policy: policy_from(r.get(0))?, ca_cert: r.get(1), ca_key_sealed: r.get(2) })
        })
        .transpose()
    }

    /// Sets the CA of a session that has none yet (sessions made before egress existed);
    /// returns the CA it has afterwards (another caller's, if it won the race).
    pub async fn set_session_ca_if_missing(
        &self,
        session: &SessionId,
        cert: &str,
        key_sealed: &[u8],
    ) -> Result<Option<(String, Vec<u8>)>> {
        let mut tx = self.write_tx().await?;
        sqlx::query("UPDATE sessions SET ca_cert = $1, ca_key_sealed = $2 WHERE id = $3 AND ca_cert IS NULL")
            .bind(cert)
            .bind(key_sealed)
            .bind(session.as_str())
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query("SELECT ca_cert, ca_key_sealed FROM sessions WHERE id = $1")
            .bind(session.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(row.and_then(|r| Some((r.get::<Option<String>, _>(0)?, r.get::<Option<Vec<u8>>, _>(1)?))))
    }

    /// Read-modify-write of the session's network policy in one transaction (under the
    /// writer). `change` returns the new policy or a validation message, which is passed back
    /// as `Ok(Err(message))` with nothing written. `None` if there is no such session.
    pub async fn update_network_policy(
        &self,
        session: &SessionId,
        change: impl FnOnce(&NetworkPolicy) -> std::result::Result<NetworkPolicy, String>,
    ) -> Result<Option<std::result::Result<NetworkPolicy, String>>> {
        let mut tx = self.write_tx().await?;
        let current: Option<String> = sqlx::query_scalar("SELECT network_policy FROM sessions WHERE id = $1")
            .bind(session.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let Some(current) = current else { return Ok(None) };
        let next = match change(&policy_from(&current)?) {
            Ok(next) => next,
            Err(message) => return Ok(Some(Err(message))),
        };
        sqlx::query("UPDATE sessions SET network_policy = $1, updated_at = $2 WHERE id = $3")
            .bind(serde_json::to_string(&next).unwrap_or_default())
            .bind(now_ms())
            .bind(session.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(Ok(next)))
    }
}

/// The operation of an insert of one session.
fn one_operation(mut ops: Vec<OperationRecord>) -> Result<OperationRecord> {
    ops.pop().ok_or_else(|| StoreError::Corrupt("no operation recorded".into()))
}

/// The rows of one session of [`Store::insert_sessions_with_egress`], in its transaction.
async fn insert_with_egress_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    new: &NewSession,
    egress: &NewSessionEgress,
    runner: Runner<'_>,
) -> Result<OperationRecord> {
    let op = insert_session_tx(tx, new, Some(egress), runner).await?;
    for credential in &egress.grants {
        sqlx::query(
            "INSERT INTO grants (session_id, credential_id, created_at, inherited_from) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        )
        .bind(new.id.as_str())
        .bind(credential.as_str())
        .bind(now_ms())
        .bind(egress.inherited_from.as_ref().map(SessionId::as_str))
        .execute(&mut **tx)
        .await?;
    }
    Ok(op)
}
