//! The `/v1` HTTP API and its OpenAPI document.

mod credentials;
mod exec;
pub(crate) use exec::MAX_EXEC_RESPONSE;
mod files;
mod lifecycle;
mod network;
pub(crate) use lifecycle::take_snapshot;
pub(crate) use suspend::suspend_session;
mod pool;
mod sessions;
mod suspend;
mod system;
mod templates;
mod ws;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use space_api::{ErrorCode, SandboxId, Session, SessionId, SessionState};
use utoipa::OpenApi;

use crate::AppState;
use crate::auth::{Caller, require_key};
use crate::error::{AppError, AppResult};
use crate::idempotency::idempotency;

/// JSON bodies larger than this are refused with 413 (file uploads stream and are exempt).
const JSON_BODY_LIMIT: usize = 1 << 20;

#[derive(OpenApi)]
#[openapi(
    info(title = "space", description = "Secure, stateful sandboxes for long-running AI agents."),
    paths(
        system::health, system::status, system::create_key, system::get_operation,
        sessions::create_session, sessions::list_sessions, sessions::get_session,
        sessions::destroy_session, sessions::session_events, sessions::update_session,
        exec::exec, exec::exec_ws, exec::list_processes, exec::signal_process, exec::attach_ws,
        files::download, files::upload, files::list, files::stat, files::mkdir, files::move_path,
        files::remove, files::watch_ws,
        templates::list_templates, templates::import_template, templates::build_template,
        pool::get_pool, pool::set_pool_size,
        lifecycle::pause, lifecycle::resume, lifecycle::create_snapshot, lifecycle::list_snapshots,
        lifecycle::delete_snapshot, lifecycle::restore, lifecycle::fork, suspend::suspend,
        credentials::create_credential, credentials::list_credentials, credentials::get_credential,
        credentials::update_credential, credentials::delete_credential,
        network::get_network, network::update_network, network::grant, network::revoke, network::audit,
    ),
    modifiers(&BearerAuth),
    security(("api_key" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document as committed in `docs/openapi.json`.
pub fn openapi_json() -> String {
    let mut json = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
    json.push('\n');
    json
}

pub fn router(state: AppState) -> Router {
    let files = Router::new()
        .route("/content", get(files::download).put(files::upload))
        .layer(DefaultBodyLimit::disable())
        .route("/list", get(files::list))
        .route("/stat", get(files::stat))
        .route("/mkdir", post(files::mkdir))
        .route("/move", post(files::move_path))
        .route("/", axum::routing::delete(files::remove));
    let authed = Router::new()
        .route("/status", get(system::status))
        .route("/keys", post(system::create_key))
        .route("/pool", get(pool::get_pool))
        .route("/pool/{template}", axum::routing::put(pool::set_pool_size))
        .route("/operations/{id}", get(system::get_operation))
        .route("/sessions", post(sessions::create_session).get(sessions::list_sessions))
        .route(
            "/sessions/{id}",
            get(sessions::get_session).delete(sessions::destroy_session).patch(sessions::update_session),
        )
        .route("/sessions/{id}/events", get(sessions::session_events))
        .route("/sessions/{id}/pause", post(lifecycle::pause))
        .route("/sessions/{id}/resume", post(lifecycle::resume))
        .route("/sessions/{id}/suspend", post(suspend::suspend))
        .route("/sessions/{id}/snapshots", post(lifecycle::create_snapshot).get(lifecycle::list_snapshots))
        .route("/sessions/{id}/snapshots/{snapshot}", axum::routing::delete(lifecycle::delete_snapshot))
        .route("/sessions/{id}/restore", post(lifecycle::restore))
        .route("/sessions/{id}/fork", post(lifecycle::fork))
        .route("/sessions/{id}/exec", post(exec::exec))
        .route("/sessions/{id}/exec/ws", get(exec::exec_ws))
        .route("/sessions/{id}/processes", get(exec::list_processes))
        .route("/sessions/{id}/processes/{pid}/signal", post(exec::signal_process))
        .route("/sessions/{id}/processes/{pid}/attach", get(exec::attach_ws))
        .route("/sessions/{id}/watch", get(files::watch_ws))
        .route("/sessions/{id}/network", get(network::get_network).patch(network::update_network))
        .route("/sessions/{id}/grants", post(network::grant))
        .route("/sessions/{id}/grants/{name}", axum::routing::delete(network::revoke))
        .route("/sessions/{id}/audit", get(network::audit))
        .route("/credentials", post(credentials::create_credential).get(credentials::list_credentials))
        .route(
            "/credentials/{name}",
            get(credentials::get_credential)
                .patch(credentials::update_credential)
                .delete(credentials::delete_credential),
        )
        .nest("/sessions/{id}/files", files)
        .route("/templates", get(templates::list_templates))
        .route("/templates/import", post(templates::import_template))
        .route("/templates/build", post(templates::build_template))
        .layer(middleware::from_fn_with_state(state.idempotency.clone(), idempotency))
        .layer(middleware::from_fn_with_state(state.clone(), require_key))
        .layer(DefaultBodyLimit::max(JSON_BODY_LIMIT));
    Router::new()
        .route("/v1/health", get(system::health))
        .route("/v1/openapi.json", get(|| async { ([("content-type", "application/json")], openapi_json()) }))
        .nest("/v1", authed)
        .fallback(|| async { AppError::new(ErrorCode::NotFound, "no such endpoint; see /v1/openapi.json") })
        .with_state(state)
}

/// The caller's session `id`, or 404 (also for malformed ids and other tenants' sessions).
pub(crate) async fn find_session(state: &AppState, caller: &Caller, id: &str) -> AppResult<Session> {
    let parsed: SessionId = id.parse().map_err(|_| AppError::session_not_found(id))?;
    state.store.session(&caller.tenant_id, &parsed).await?.ok_or_else(|| AppError::session_not_found(id))
}

/// The sandbox of a running session, or a 409 that says what state it is in.
pub(crate) async fn running_sandbox(state: &AppState, caller: &Caller, id: &str) -> AppResult<(Session, SandboxId)> {
    let session = find_session(state, caller, id).await?;
    match (session.state, session.sandbox_id.clone()) {
        (SessionState::Running, Some(sandbox)) => {
            state.activity.touch(&session.id);
            Ok((session, sandbox))
        }
        (SessionState::Creating, _) => Err(AppError::new(
            ErrorCode::InvalidState,
            format!("session {id} is still being created; wait until it is running"),
        )),
        (state_now, _) => Err(AppError::new(
            ErrorCode::InvalidState,
            format!("session {id} is {}; only running sessions accept this call", state_now.as_str()),
        )),
    }
}

#[cfg(test)]
mod tests {
    /// The committed OpenAPI document must match the code. Regenerate with
    /// `UPDATE_OPENAPI=1 cargo test -p space-control openapi`.
    #[test]
    fn openapi_document_is_up_to_date() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        let generated = super::openapi_json();
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json is out of date: run `UPDATE_OPENAPI=1 cargo test -p space-control openapi` and commit it"
        );
    }
}
