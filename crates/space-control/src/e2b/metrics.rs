//! E2B's sandbox metrics from the session's usage: one sample, taken now. space keeps no
//! history of samples; the CPU share is averaged since the session last changed (its
//! sandbox started or resumed, or a setting changed).

use axum::extract::State;
use axum::{Extension, Json};
use serde::Serialize;
use space_store::now_ms;

use super::errors::E2bResult;
use super::sandboxes::sandbox;
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    timestamp: String,
    timestamp_unix: i64,
    cpu_count: u32,
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

pub async fn metrics(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> E2bResult<Json<Vec<Metric>>> {
    let session = sandbox(&state, &caller, &id).await?;
    let ApiJson(stats) = crate::api::usage::session_stats(State(state.clone()), Extension(caller), ApiPath(id)).await?;
    let Some(usage) = stats.sandbox else { return Ok(Json(Vec::new())) };
    let now = now_ms();
    let cpus = session.resources.cpus.max(0.01);
    let lived_ns = ((now - session.updated_at).max(1) as f64) * 1e6;
    Ok(Json(vec![Metric {
        timestamp: super::rfc3339(now),
        timestamp_unix: now / 1000,
        cpu_count: cpus.ceil() as u32,
        cpu_used_pct: (usage.cpu_usage_ns as f64 / lived_ns / cpus * 100.0).clamp(0.0, 100.0),
        mem_used: usage.memory_bytes,
        mem_total: usage.memory_limit_bytes,
        mem_cache: 0,
        disk_used: stats.disk.used_bytes,
        disk_total: stats.disk.limit_bytes.unwrap_or(0),
    }]))
}
