//! The operator's metrics listener (`space serve --metrics-listen ADDR`): `GET /metrics` in
//! the Prometheus text format, without authentication, on an address of its own (as
//! Prometheus scrapes, and as an operator keeps apart from the public API; see
//! `docs/observability.md`).
//!
//! A scrape cannot hurt the API: the listener has its own connection cap and short
//! timeouts, the request-size limits and error envelope of the API, and one scrape runs at
//! a time (each reads the store once).

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use space_api::{ErrorCode, SessionState};
use space_metrics::{PoolSample, Scraped};
use tokio::net::TcpListener;

use crate::error::{AppError, AppResult};
use crate::{AppState, HttpLimits};

/// Scrapes are answered one after another: a flood of them queues here instead of
/// running the store's count many times at once.
static SCRAPES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The metrics listener's limits: a few scrapers, nothing long-lived.
fn limits() -> HttpLimits {
    HttpLimits {
        max_connections: 16,
        header_read_timeout: Duration::from_secs(10),
        body_idle_timeout: Duration::from_secs(10),
        ws_idle_timeout: Duration::from_secs(10),
        template_upload_max_bytes: 0,
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve_metrics(
    state: AppState,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::server::serve_router(router(state), listener, limits(), shutdown).await
}

pub fn router(state: AppState) -> Router {
    let app = Router::new()
        .route("/metrics", get(scrape))
        .fallback(|| async { AppError::new(ErrorCode::NotFound, "this listener serves only GET /metrics") })
        .with_state(state);
    crate::api::harden(app)
}

async fn scrape(State(state): State<AppState>) -> AppResult<Response> {
    let _one_at_a_time = SCRAPES.lock().await;
    let scraped = read_now(&state).await?;
    Ok(([(CONTENT_TYPE, space_metrics::CONTENT_TYPE)], space_metrics::render(&scraped)).into_response())
}

/// The gauges read at each scrape: sessions by state (the store) and the warm pools (the
/// node).
async fn read_now(state: &AppState) -> AppResult<Scraped> {
    let counts = state.store.count_all_sessions_by_state().await?;
    let sessions = counts
        .into_iter()
        .filter_map(|(name, count)| Some((SessionState::parse(&name)?, u64::try_from(count).ok()?)))
        .collect();
    let pools = crate::api::pool::pool_status(state)
        .await
        .templates
        .into_iter()
        .map(|p| PoolSample {
            template: p.template,
            runtime: p.runtime,
            ready: p.ready,
            target: p.size,
            filling: p.filling,
        })
        .collect();
    Ok(Scraped { sessions, pools })
}
