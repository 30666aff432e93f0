//! Answers the operations that answer once.

use std::sync::Arc;
use std::time::Duration;

use hyper::{Response, StatusCode};
use serde::Serialize;
use space_node_api::NodeError;

use super::{Body, Served, json};
use crate::ops::{Call, NodeFailure};

/// The status of an answer that carries a [`NodeFailure`]: the node did what it was asked
/// and it failed, which tells it from a refusal of the request itself.
pub(crate) const FAILED: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;

/// Answers `call`. A call that may change something runs on a task of its own: a control plane
/// that goes away (it crashed, or cancelled its request) must not cancel the node's work
/// half-way, leaving a sandbox frozen or a CRIU dump unwaited; a graceful stop waits for it
/// (see [`super::serve`]). One that only reads or waits is
/// answered inline, so a control plane that gives up on it (a heartbeat's or placement's time
/// bound) ends it.
pub(super) async fn answer(served: Arc<Served>, call: Call) -> Response<Body> {
    if only_reads(&call) {
        return perform(&served, call).await;
    }
    // Counted before the stop is checked: a stop that begins after the check waits for it.
    let counted = served.changes.token();
    if served.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        let message = "the node is stopping; try again once it is back".to_owned();
        return super::refuse(StatusCode::SERVICE_UNAVAILABLE, "node_stopping", message);
    }
    let task = tokio::spawn(async move {
        let _counted = counted;
        perform(&served, call).await
    });
    match task.await {
        Ok(response) => response,
        Err(e) => result::<()>(Err(NodeError::Failed(Box::new(e)))),
    }
}

/// Whether `call` only reads or waits (a call added later is taken to change something).
fn only_reads(call: &Call) -> bool {
    matches!(
        call,
        Call::Templates
            | Call::ResolveTemplate { .. }
            | Call::Capacity
            | Call::PoolStatus
            | Call::WaitExit { .. }
            | Call::ExitReason { .. }
            | Call::OomKills { .. }
            | Call::SandboxStats { .. }
            | Call::SnapshotDiskSize { .. }
            | Call::DiskUsage { .. }
            | Call::SnapshotExclusiveSize { .. }
            | Call::SessionTraffic { .. }
    )
}

async fn perform(served: &Served, call: Call) -> Response<Body> {
    let node = served.node.clone();
    match call {
        Call::StartBackground => {
            // Once per node, whichever control plane asks first (and however often).
            served.background.call_once(|| node.clone().start_background());
            ok(&())
        }
        Call::Templates => ok(&node.templates().await),
        Call::ResolveTemplate { name } => ok(&node.resolve_template(&name).await),
        Call::Capacity => result(node.capacity().await),
        Call::BindPod { template, runtime, limits } => ok(&node.bind_pod(&template, runtime, limits).await),
        Call::SetPoolSize { template, runtime, size } => ok(&node.set_pool_size(&template, runtime, size).await),
        Call::PoolStatus => ok(&node.pool_status().await),
        Call::StartSandbox { id, template, runtime, limits, disk } => {
            result(node.start_sandbox(&id, &template, runtime, limits, &disk).await)
        }
        Call::StartSandboxFromSnapshot { id, session, snapshot, runtime, limits, disk, key } => result(
            node.start_sandbox_from_snapshot(&id, &session, &snapshot, runtime, limits, &disk, key.as_ref()).await,
        ),
        Call::DestroySandbox { id } => result(node.destroy_sandbox(&id).await),
        Call::PauseSandbox { id } => result(node.pause_sandbox(&id).await),
        Call::ResumeSandbox { id } => result(node.resume_sandbox(&id).await),
        Call::Adopt { id, pid } => ok(&node.adopt(&id, pid).await),
        Call::WaitExit { handle } => ok(&node.wait_exit(&handle).await),
        Call::ExitReason { id } => ok(&node.exit_reason(&id).await),
        Call::OomKills { id } => result(node.oom_kills(&id).await),
        Call::SandboxStats { id } => result(node.sandbox_stats(&id).await),
        Call::Sweep { keep } => result(node.sweep(&keep.into_iter().collect()).await),
        Call::SnapshotDisk { sandbox, session, snapshot, already_paused } => {
            result(node.snapshot_disk(&sandbox, &session, &snapshot, already_paused).await)
        }
        Call::SnapshotFull { sandbox, session, snapshot, already_paused, key } => {
            result(node.snapshot_full(&sandbox, &session, &snapshot, already_paused, key.as_ref()).await)
        }
        Call::SnapshotDiskSize { session, snapshot } => result(node.snapshot_disk_size(&session, &snapshot).await),
        Call::DeleteSnapshot { session, snapshot } => result(node.delete_snapshot(&session, &snapshot).await),
        Call::DeleteTemplate { name, version } => result(node.delete_template(&name, version).await),
        Call::SweepSnapshots { keep } => result(node.sweep_snapshots(&keep.into_iter().collect()).await),
        Call::ExportSnapshot { session, snapshot, parent, key } => {
            result(node.export_snapshot(&session, &snapshot, parent.as_ref(), key.as_ref()).await)
        }
        Call::ImportSnapshot { session, snapshot, export, key, parents } => {
            result(node.import_snapshot(&session, &snapshot, &export, key.as_ref(), &parents).await)
        }
        Call::SweepBlobs { keep, min_age_ms, budget_ms } => {
            let (min_age, budget) = (Duration::from_millis(min_age_ms), Duration::from_millis(budget_ms));
            result(node.sweep_blobs(&keep.into_iter().collect(), min_age, budget).await)
        }
        Call::LimitDisk { sandbox, disk } => result(node.limit_disk(&sandbox, &disk).await),
        Call::DiskUsage { session } => result(node.disk_usage(&session).await),
        Call::SnapshotExclusiveSize { session, snapshot } => {
            result(node.snapshot_exclusive_size(&session, &snapshot).await)
        }
        Call::JoinSessionNetwork { sandbox, session } => result(node.join_session_network(&sandbox, &session).await),
        Call::ReattachGateway { handle, session } => result(node.reattach_gateway(&handle, &session).await),
        Call::SetSessionEgress { session, egress } => result(node.set_session_egress(&session, egress).await),
        Call::ForgetSessionEgress { session } => result(node.forget_session_egress(&session).await),
        Call::SessionTraffic { session } => ok(&node.session_traffic(&session).await),
        Call::ExportTemplate { name, version } => result(node.export_template(&name, version).await),
        Call::ImportTemplateExport { export } => result(node.import_template_export(&export).await),
        Call::Unstage { path } => result(served.staging.unstage(&path)),
    }
}

fn ok(value: &impl Serialize) -> Response<Body> {
    json(StatusCode::OK, value)
}

/// A node's answer: the value, or its failure in the wire's form.
pub(crate) fn result<T: Serialize>(result: Result<T, NodeError>) -> Response<Body> {
    match result {
        Ok(value) => ok(&value),
        Err(e) => json(FAILED, &NodeFailure::from(&e)),
    }
}
