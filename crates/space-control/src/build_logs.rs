//! A Dockerfile build run on one node, its log written to the store as it comes: in order,
//! in batches (a step can print thousands of lines), numbered after what an earlier run of
//! the same operation (cut short by a crash) wrote.

use space_api::{OperationId, Progress, TemplateBuild};
use space_node_api::{NodeApi, TemplateInfo};
use space_store::Store;
use tokio::sync::mpsc;

use crate::AppState;
use crate::error::AppResult;

/// Lines kept of one build's log; the rest are counted, not stored.
const MAX_LINES: i64 = 100_000;
/// Lines written in one transaction at most.
const BATCH: usize = 500;

/// Builds `build` as template `name` on `node` for operation `op`.
pub(crate) async fn build(
    state: &AppState,
    node: &dyn NodeApi,
    op: &OperationId,
    name: &str,
    build: &TemplateBuild,
) -> AppResult<TemplateInfo> {
    let first = state.store.next_operation_log_seq(op).await?;
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(write(state.store.clone(), op.clone(), first, rx));
    let store = state.store.clone();
    let id = op.clone();
    let progress = move |p: Progress| {
        let (store, id) = (store.clone(), id.clone());
        tokio::spawn(async move {
            let _ = store.set_operation_progress(&id, &p).await;
        });
    };
    let log = move |line: String| {
        let _ = tx.send(line);
    };
    let built = node.build_template(name, build, Box::new(progress), Box::new(log)).await;
    // The log function is gone with the call: the writer ends once it wrote what is queued,
    // so a client sees every line before the operation ends.
    let _ = writer.await;
    Ok(built?)
}

async fn write(store: Store, op: OperationId, first: i64, mut rx: mpsc::UnboundedReceiver<String>) {
    let mut next = first;
    let mut dropped = 0u64;
    while let Some(line) = rx.recv().await {
        let mut batch = vec![line];
        while batch.len() < BATCH
            && let Ok(line) = rx.try_recv()
        {
            batch.push(line);
        }
        let room = (first + MAX_LINES - next).max(0) as usize;
        if batch.len() > room {
            dropped += (batch.len() - room) as u64;
            batch.truncate(room);
        }
        if batch.is_empty() {
            continue;
        }
        match store.append_operation_log(&op, next, &batch).await {
            Ok(()) => next += batch.len() as i64,
            Err(e) => tracing::warn!(operation = %op, error = %e, "could not keep lines of a build's log"),
        }
    }
    if dropped > 0 {
        let note = format!("({dropped} more lines not kept: a build keeps at most {MAX_LINES})");
        let _ = store.append_operation_log(&op, next, &[note]).await;
    }
}
