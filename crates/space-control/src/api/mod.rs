//! The `/v1` HTTP API and its OpenAPI document.

mod credentials;
mod exec;
pub(crate) use exec::MAX_EXEC_RESPONSE;
mod files;
pub(crate) mod lifecycle;
mod network;
mod nodes;
mod oauth;
mod openapi;
pub(crate) use lifecycle::{invalid_state, note, run_restore, set_frozen, take_snapshot};
pub(crate) use suspend::{resume_suspended, suspend_session};
pub(crate) mod pool;
pub(crate) mod ports;
pub(crate) mod session_meta;
mod session_tokens;
pub(crate) mod sessions;
pub(crate) mod suspend;
mod system;
mod template_builds;
pub(crate) mod template_uploads;
pub(crate) mod templates;
mod tenant_keys;
mod tenants;
pub(crate) mod usage;
mod ws;

use std::collections::HashMap;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{any, get, post};
use axum::{Extension, Router};
use space_api::{ErrorCode, SandboxId, Session, SessionId, SessionState, TenantId};
use space_store::Store;
use utoipa::OpenApi;

use crate::AppState;
use crate::auth::{Admin, Caller, require_key};
use crate::error::{ApiPath, AppError, AppResult, envelope};
use crate::idempotency::idempotency;
use crate::server::limit_request_size;
use openapi::{BearerAuth, Documented};

/// JSON bodies larger than this are refused with 413 (file uploads stream and are exempt).
pub(crate) const JSON_BODY_LIMIT: usize = 1 << 20;

#[derive(OpenApi)]
#[openapi(
    info(title = "space", description = "Secure, stateful sandboxes for long-running AI agents."),
    paths(
        system::health, system::status, system::create_key, system::list_keys, system::revoke_key,
        system::rotate_key, system::get_operation, tenants::set_quota, tenants::get_quota,
        tenant_keys::set_tenant_key, tenant_keys::get_tenant_key, tenant_keys::rotate_tenant_key,
        sessions::create_session, sessions::list_sessions, sessions::get_session,
        sessions::destroy_session, sessions::session_events, sessions::update_session,
        exec::exec, exec::exec_ws, exec::list_processes, exec::signal_process, exec::attach_ws,
        files::download, files::upload, files::list, files::stat, files::mkdir, files::move_path,
        files::remove, files::watch_ws,
        templates::list_templates, templates::import_template, templates::build_template, templates::delete_template,
        template_uploads::upload_template, template_builds::build_dockerfile, template_builds::list_builds,
        system::operation_log,
        pool::get_pool, pool::set_pool_size, nodes::list_nodes, nodes::cordon, nodes::uncordon, nodes::drain, nodes::sweep_blobs,
        lifecycle::pause, lifecycle::resume, lifecycle::create_snapshot, lifecycle::list_snapshots,
        lifecycle::delete_snapshot, usage::get_snapshot, usage::session_stats, lifecycle::restore, lifecycle::fork, suspend::suspend,
        credentials::create_credential, credentials::list_credentials, credentials::get_credential,
        credentials::update_credential, credentials::delete_credential, oauth::login, oauth::callback, session_tokens::create_token,
        network::get_network, network::update_network, network::grant, network::revoke, network::audit,
        ports::open_port, ports::get_port, ports::list_ports, ports::close_port, ports::proxy_path, ports::tunnel,
    ),
    // The WebSocket routes' messages, which no handler signature names.
    components(schemas(
        space_api::ExecStart, space_api::TermSize, space_api::WsClientMessage, space_api::WsServerMessage,
        space_api::WatchEvent, space_api::ErrorBody, space_api::ErrorCode,
    )),
    modifiers(&BearerAuth, &Documented),
    security(("api_key" = []))
)]
pub struct ApiDoc;

/// The OpenAPI document as committed in `docs/openapi.json`.
pub fn openapi_json() -> String {
    let mut json = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
    json.push('\n');
    json
}

pub fn router(state: AppState) -> Router {
    let idempotent = || middleware::from_fn_with_state(state.idempotency.clone(), idempotency);
    let files = Router::new()
        .route("/content", get(files::download).put(files::upload))
        .layer(DefaultBodyLimit::disable())
        .route("/list", get(files::list))
        .route("/stat", get(files::stat))
        .route("/mkdir", post(files::mkdir))
        .route("/move", post(files::move_path))
        .route("/", axum::routing::delete(files::remove));
    // Authorization before anything else is read or checked: a layer added later wraps the
    // ones before it, so `require_admin` and `require_session`, added last, run before the
    // idempotency middleware and before any extractor of the handler.
    let admin = Router::new()
        .route("/keys", post(system::create_key))
        .route("/nodes", get(nodes::list_nodes))
        .route("/nodes/{id}/cordon", post(nodes::cordon))
        .route("/nodes/{id}/uncordon", post(nodes::uncordon))
        .route("/nodes/{id}/drain", post(nodes::drain))
        .route("/blobs/sweep", post(nodes::sweep_blobs))
        .route("/tenants/{tenant}/quota", axum::routing::put(tenants::set_quota))
        .route("/pool/{template}", axum::routing::put(pool::set_pool_size))
        .route("/templates/import", post(templates::import_template))
        .route("/templates/build", post(templates::build_template))
        .route_layer(idempotent())
        .route_layer(middleware::from_fn(require_admin));
    // Uploads stream to disk: no body limit, and no idempotency layer (it buffers bodies).
    // Tenants make templates of their own this way; the admin's are global.
    let uploads = Router::new()
        .route("/templates/uploads", post(template_uploads::upload_template))
        .route("/templates/builds", post(template_builds::build_dockerfile).get(template_builds::list_builds))
        .layer(DefaultBodyLimit::disable());
    // The admin may read and destroy any tenant's session; everything else is the owner's.
    let session_root = Router::new()
        .route("/sessions/{id}", get(sessions::get_session).delete(sessions::destroy_session))
        .route_layer(idempotent())
        .route_layer(middleware::from_fn_with_state(state.store.clone(), require_visible_session));
    let sessions = Router::new()
        .route("/sessions/{id}", axum::routing::patch(sessions::update_session))
        .route("/sessions/{id}/events", get(sessions::session_events))
        .route("/sessions/{id}/pause", post(lifecycle::pause))
        .route("/sessions/{id}/resume", post(lifecycle::resume))
        .route("/sessions/{id}/suspend", post(suspend::suspend))
        .route("/sessions/{id}/snapshots", post(lifecycle::create_snapshot).get(lifecycle::list_snapshots))
        .route("/sessions/{id}/snapshots/{snapshot}", get(usage::get_snapshot).delete(lifecycle::delete_snapshot))
        .route("/sessions/{id}/stats", get(usage::session_stats))
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
        .route("/sessions/{id}/ports", get(ports::list_ports))
        .route("/sessions/{id}/ports/{port}", post(ports::open_port).get(ports::get_port).delete(ports::close_port))
        .route("/sessions/{id}/tunnel/{port}", get(ports::tunnel))
        .route("/sessions/{id}/tokens", post(session_tokens::create_token))
        .nest("/sessions/{id}/files", files)
        .route_layer(idempotent())
        .route_layer(middleware::from_fn_with_state(state.store.clone(), require_session));
    let tenant = Router::new()
        .route("/status", get(system::status))
        .route("/pool", get(pool::get_pool))
        .route("/operations/{id}", get(system::get_operation))
        .route("/operations/{id}/logs", get(system::operation_log))
        .route("/sessions", post(sessions::create_session).get(sessions::list_sessions))
        .route("/credentials", post(credentials::create_credential).get(credentials::list_credentials))
        .route(
            "/credentials/{name}",
            get(credentials::get_credential)
                .patch(credentials::update_credential)
                .delete(credentials::delete_credential),
        )
        .route("/credentials/{name}/login", post(oauth::login))
        .route("/templates", get(templates::list_templates))
        .route("/templates/{name}", axum::routing::delete(templates::delete_template))
        .route("/keys", get(system::list_keys))
        .route("/keys/{id}", axum::routing::delete(system::revoke_key))
        .route("/keys/{id}/rotate", post(system::rotate_key))
        .route("/tenants/{tenant}/quota", get(tenants::get_quota))
        .route("/tenants/{tenant}/key", get(tenant_keys::get_tenant_key).put(tenant_keys::set_tenant_key))
        .route("/tenants/{tenant}/key/rotate", post(tenant_keys::rotate_tenant_key))
        .route_layer(idempotent());
    let authed = tenant
        .merge(admin)
        .merge(uploads)
        .merge(session_root)
        .merge(sessions)
        // After the key is known, before anything else: a session-scoped token's limits.
        .layer(middleware::from_fn_with_state(state.clone(), crate::scope::guard))
        .layer(middleware::from_fn_with_state(state.clone(), require_key))
        .layer(DefaultBodyLimit::max(JSON_BODY_LIMIT));
    let app = Router::new()
        .route("/v1/health", get(system::health))
        .route("/v1/openapi.json", get(|| async { ([("content-type", "application/json")], openapi_json()) }))
        // Authorized by the sign-in's single-use state, which a call with an API key made.
        .route(oauth::CALLBACK_PATH, get(oauth::callback))
        // Authorized by the proxy itself: a port's token or public access need no API key.
        .route("/v1/sessions/{id}/ports/{port}/", any(ports::proxy_path))
        .route("/v1/sessions/{id}/ports/{port}/{*path}", any(ports::proxy_path))
        .nest("/v1", authed)
        .fallback(|| async { AppError::new(ErrorCode::NotFound, "no such endpoint; see /v1/openapi.json") })
        .layer(middleware::from_fn_with_state(state.clone(), ports::preview_host))
        .with_state(state)
        .layer(middleware::from_fn(crate::observe::note_route));
    // Outermost: every response, the size limits' too, gets a request id and is counted.
    let service = tower::ServiceBuilder::new().layer(middleware::from_fn(crate::observe::observe)).service(harden(app));
    Router::new().fallback_service(service)
}

/// The layers every response passes through: the limits on a request's size, answered in the
/// API's envelope, and [`envelope`] for errors the framework answers itself. They wrap the
/// whole router rather than each route, so they also see what routing adds (a 405's `Allow`).
pub fn harden(app: Router) -> Router {
    let service = tower::ServiceBuilder::new()
        .layer(middleware::from_fn(limit_request_size))
        .layer(middleware::from_fn(envelope))
        .service(app);
    Router::new().fallback_service(service)
}

/// Middleware of the `/v1/sessions/{id}…` routes: the session must be the caller's (404
/// otherwise, as for one that does not exist) before anything else about the request is
/// looked at, so a caller learns nothing from how requests about others' sessions fail.
/// Handlers take the session it found ([`FoundSession`]) rather than read it again.
async fn require_session(
    State(store): State<Store>,
    Extension(caller): Extension<Caller>,
    ApiPath(params): ApiPath<HashMap<String, String>>,
    mut request: Request,
    next: Next,
) -> Result<Response, AppError> {
    let id = params.get("id").map(String::as_str).unwrap_or_default();
    let session = find_session_in(&store, &caller, id).await?;
    request.extensions_mut().insert(FoundSession(session));
    Ok(next.run(request).await)
}

/// The caller's session of a `/v1/sessions/{id}…` request, as [`require_session`] read it
/// before the handler ran.
#[derive(Clone)]
pub(crate) struct FoundSession(pub Session);

/// [`require_session`] for `GET` and `DELETE /v1/sessions/{id}`, which the admin may call
/// for any tenant's session.
async fn require_visible_session(
    State(store): State<Store>,
    Extension(caller): Extension<Caller>,
    ApiPath(params): ApiPath<HashMap<String, String>>,
    request: Request,
    next: Next,
) -> Result<Response, AppError> {
    let id = params.get("id").map(String::as_str).unwrap_or_default();
    visible_session_in(&store, &caller, id).await?;
    Ok(next.run(request).await)
}

/// Middleware of the admin-only routes: 403 before idempotency or any extractor runs (an
/// import must not tell a tenant which paths exist on the server's host).
async fn require_admin(_admin: Admin, request: Request, next: Next) -> Response {
    next.run(request).await
}

/// The caller's session `id`, or 404 (also for malformed ids and other tenants' sessions).
pub(crate) async fn find_session(state: &AppState, caller: &Caller, id: &str) -> AppResult<Session> {
    find_session_in(&state.store, caller, id).await
}

async fn find_session_in(store: &Store, caller: &Caller, id: &str) -> AppResult<Session> {
    let parsed: SessionId = id.parse().map_err(|_| AppError::session_not_found(id))?;
    store.session(&caller.tenant_id, &parsed).await?.ok_or_else(|| AppError::session_not_found(id))
}

/// The session `id` with its tenant: the caller's, or for the admin any tenant's (404
/// otherwise). For the calls the admin may make across tenants: show and destroy.
pub(crate) async fn visible_session(state: &AppState, caller: &Caller, id: &str) -> AppResult<(TenantId, Session)> {
    visible_session_in(&state.store, caller, id).await
}

async fn visible_session_in(store: &Store, caller: &Caller, id: &str) -> AppResult<(TenantId, Session)> {
    if !caller.admin {
        return Ok((caller.tenant_id.clone(), find_session_in(store, caller, id).await?));
    }
    let parsed: SessionId = id.parse().map_err(|_| AppError::session_not_found(id))?;
    let record = store.session_any(&parsed).await?.ok_or_else(|| AppError::session_not_found(id))?;
    Ok((record.tenant_id, record.session))
}

/// The sandbox of a running session, or a 409 that says what state it is in. Every call
/// that needs a session's sandbox (exec, files, processes, watch, ports) finds it here: a
/// suspended session created with `auto_resume` is resumed first (once, however many calls
/// arrive together), one without answers 409 `session_suspended` saying how to resume it.
pub(crate) async fn running_sandbox(
    state: &AppState,
    caller: &Caller,
    found: FoundSession,
) -> AppResult<(Session, SandboxId)> {
    woken_sandbox(state, Some(caller), found.0).await
}

/// [`running_sandbox`] of a session already found (and authorized). A suspended
/// `auto_resume` session is resumed first when the caller's key is known (`caller`); one
/// reached by a port token or publicly is not.
pub(crate) async fn woken_sandbox(
    state: &AppState,
    caller: Option<&Caller>,
    mut session: Session,
) -> AppResult<(Session, SandboxId)> {
    if let Some(caller) = caller
        && session.auto_resume
        && suspend::wakes_on_use(session.state)
    {
        session = suspend::wake(state, caller, &session).await?;
    }
    let id = session.id.clone();
    match (session.state, session.sandbox_id.clone()) {
        (SessionState::Running, Some(sandbox)) => {
            state.activity.touch(&session.id);
            Ok((session, sandbox))
        }
        (SessionState::Creating, _) => Err(AppError::new(
            ErrorCode::InvalidState,
            format!("session {id} is still being created; wait until it is running"),
        )),
        (SessionState::Suspended, _) => Err(suspend::suspended(&session.id)),
        (SessionState::Paused, _) => Err(AppError::new(
            ErrorCode::InvalidState,
            format!(
                "session {id} is paused; resume it first: `POST /v1/sessions/{id}/resume` (`space session resume {id}`)"
            ),
        )),
        (state_now, _) => Err(AppError::new(
            ErrorCode::InvalidState,
            format!("session {id} is {}; only running sessions accept this call", state_now.as_str()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, to_bytes};
    use axum::http::StatusCode;
    use space_api::{ExecRequest, ImportTemplateRequest};
    use space_store::NewSession;
    use tower::ServiceExt;

    use super::*;
    use crate::error::ApiJson;

    /// Stands in for `require_key`: every request comes from `caller`.
    fn as_caller(router: Router, caller: Caller) -> Router {
        router.layer(middleware::from_fn(move |mut request: Request, next: Next| {
            request.extensions_mut().insert(caller.clone());
            next.run(request)
        }))
    }

    fn caller(tenant: &TenantId, admin: bool) -> Caller {
        Caller { tenant_id: tenant.clone(), tenant: "t".into(), admin, scope: None }
    }

    async fn send(router: &Router, uri: &str, body: &str) -> (StatusCode, String) {
        let request = axum::http::Request::post(uri)
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A request about another tenant's session fails as one about no session does, whatever
    /// is wrong with the rest of it: the session is checked before the body is read.
    #[tokio::test]
    async fn sessions_are_authorized_before_the_request_is_validated() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(&dir.path().join("space.db")).await.unwrap();
        let (owner, other) = (store.ensure_tenant("owner").await.unwrap(), store.ensure_tenant("other").await.unwrap());
        let id = SessionId::generate();
        let new = NewSession {
            id: id.clone(),
            tenant_id: owner.clone(),
            template: "busybox".into(),
            runtime: Default::default(),
            resources: Default::default(),
            env: Default::default(),
            source_snapshot: None,
            template_version: None,
            snapshot_policy: space_api::SnapshotPolicy::off(),
            lifetime: Default::default(),
            meta: Default::default(),
        };
        store.insert_session(&new).await.unwrap();
        let routes = Router::new()
            .route("/v1/sessions/{id}/exec", post(|ApiJson(_): ApiJson<ExecRequest>| async { "ran" }))
            .route_layer(middleware::from_fn_with_state(store.clone(), require_session));
        let uri = format!("/v1/sessions/{id}/exec");

        let stranger = as_caller(routes.clone(), caller(&other, false));
        for body in ["{not json", r#"{"cmd":["true"]}"#, r#"{"surprise":1}"#] {
            let (status, text) = send(&stranger, &uri, body).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{body}: {text}");
        }
        let (status, _) = send(&stranger, "/v1/sessions/ses_nonexistent/exec", "{not json").await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        let owner = as_caller(routes, caller(&owner, false));
        assert_eq!(send(&owner, &uri, "{not json").await.0, StatusCode::BAD_REQUEST);
        assert_eq!(send(&owner, &uri, r#"{"cmd":["true"]}"#).await, (StatusCode::OK, "ran".into()));
    }

    /// An admin-only endpoint answers a tenant 403 before it reads the request: the same
    /// answer whether the body is malformed or names a host path that exists.
    #[tokio::test]
    async fn admin_routes_are_authorized_before_the_request_is_validated() {
        let tenant = TenantId::generate();
        let routes = Router::new()
            .route("/v1/templates/import", post(|ApiJson(_): ApiJson<ImportTemplateRequest>| async { "queued" }))
            .route_layer(middleware::from_fn(require_admin));
        let stranger = as_caller(routes.clone(), caller(&tenant, false));
        for body in ["{not json", r#"{"name":"t","path":"/etc"}"#, r#"{"name":"t","path":"/nonexistent"}"#] {
            let (status, text) = send(&stranger, "/v1/templates/import", body).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{body}: {text}");
            assert!(text.contains("\"forbidden\""), "{text}");
        }
        let admin = as_caller(routes, caller(&tenant, true));
        assert_eq!(send(&admin, "/v1/templates/import", "{not json").await.0, StatusCode::BAD_REQUEST);
        assert_eq!(send(&admin, "/v1/templates/import", r#"{"name":"t","path":"/etc"}"#).await.0, StatusCode::OK);
    }

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
