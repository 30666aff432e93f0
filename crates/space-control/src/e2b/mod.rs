//! An E2B-compatible endpoint (`space serve --e2b-listen ADDR`): programs written with E2B's
//! SDKs run unchanged against space with `E2B_API_URL` and `E2B_SANDBOX_URL` pointing here.
//!
//! It is a translation in front of the native API, not a second implementation: the control
//! calls (`/sandboxes…`) become session calls, made through the same handlers, checks and
//! store as `/v1`; envd's calls (Connect RPC `process.Process`, `filesystem.Filesystem`, and
//! `/files`) go to the sandbox's agent, spaced, like the native exec and file calls do. No
//! E2B code runs inside a sandbox.
//!
//! One listener serves both: a request naming a sandbox (E2B's `E2b-Sandbox-Id` header, or
//! the host `49983-{id}.{preview domain}`) is an envd call; any other is a control call.
//! Control calls authenticate with an API key (`X-API-Key`, as E2B's SDKs send it); envd
//! calls with the sandbox's access token (`X-Access-Token`), a keyed digest of its id that
//! the create and connect answers hand out.

mod connect;
mod envd;
mod errors;
mod files;
mod filesystem;
mod logs;
mod messages;
mod metrics;
mod network;
mod process;
mod sandboxes;
mod snapshots;
mod template_context;
mod template_list;
mod template_steps;
mod templates;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use space_api::SessionId;
use tower::ServiceExt;

use crate::AppState;
use crate::auth::Caller;
pub use errors::E2bError;
pub use templates::files_dir;

/// The port envd listens on in an E2B sandbox; its host names start with it.
pub const ENVD_PORT: u16 = 49983;
/// The envd version reported to the SDKs, which enable features by it: every feature up to
/// it is served.
pub const ENVD_VERSION: &str = "0.6.4";
/// What envd access tokens are derived for (see [`crate::idempotency::Idempotency::token`]).
const TOKEN_PURPOSE: &str = "e2b-envd-access-token";

/// The E2B endpoint's routes over the control plane's `state`.
pub fn router(state: AppState) -> Router {
    let control = sandboxes::routes()
        .merge(templates::routes())
        .route_layer(middleware::from_fn(crate::idempotency::changes_to_completion))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .merge(templates::upload_routes())
        .with_state(state.clone());
    let envd = envd::routes()
        .route_layer(middleware::from_fn_with_state(state.clone(), envd::require_access_token))
        .with_state(state.clone());
    let health = Router::new().route("/health", get(|| async { axum::http::StatusCode::NO_CONTENT }));
    let control = health.merge(control).fallback(|| async { E2bError::not_found("no such E2B API endpoint") });
    let app = Router::new()
        .fallback(move |State(state): State<AppState>, request: Request| {
            let (control, envd) = (control.clone(), envd.clone());
            async move {
                let service = if sandbox_of_request(&state, request.headers()).is_some() { envd } else { control };
                service.oneshot(request).await.into_response()
            }
        })
        .layer(middleware::from_fn_with_state(state.clone(), other_ports))
        .with_state(state);
    let service = tower::ServiceBuilder::new()
        .layer(middleware::from_fn(errors::envelope))
        .layer(middleware::from_fn(crate::server::limit_request_size))
        .service(app);
    Router::new().fallback_service(service)
}

/// The id of the sandbox an envd call is for: E2B's `E2b-Sandbox-Id` header, or the host
/// `49983-{id}.{domain}` under the E2B domain (`--e2b-domain`, default `--preview-domain`).
fn sandbox_of_request(state: &AppState, headers: &HeaderMap) -> Option<String> {
    if let Some(id) = headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok()) {
        return Some(id.to_owned());
    }
    match e2b_host(state, headers)? {
        (id, ENVD_PORT) => Some(id.as_str().to_owned()),
        _ => None,
    }
}

/// A host `{port}-{id}.{domain}` for any port but envd's is the session's port (E2B's
/// `get_host(port)`): open to anyone for a sandbox made public by its create, to holders of
/// its traffic token for one made with `allowPublicTraffic: false`, and otherwise as the
/// native listener serves ports (a port's token, or the tenant's key).
async fn other_ports(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some((id, port)) = e2b_host(&state, request.headers()).filter(|(_, port)| *port != ENVD_PORT) else {
        return next.run(request).await;
    };
    let session = admitted(&state, &id, request.headers()).await;
    // E2B's credentials are for space, never for the sandbox's servers.
    let mut request = request;
    for name in ["x-access-token", "e2b-traffic-access-token", "e2b-sandbox-id", "e2b-sandbox-port"] {
        request.headers_mut().remove(name);
    }
    match session {
        Some(session) => crate::api::ports::preview_admitted(state, session, port, request).await,
        None => crate::api::ports::preview_named(state, id, port, request).await,
    }
}

/// The session and port a host `{port}-{id}.{E2B domain}` names.
fn e2b_host(state: &AppState, headers: &HeaderMap) -> Option<(SessionId, u16)> {
    crate::api::ports::host_target(state.e2b_domain.as_deref()?, headers)
}

/// The label an E2B create puts on its session: how its ports may be reached.
pub(crate) const TRAFFIC_LABEL: &str = "e2b/traffic";
/// Its values: anyone, or holders of the sandbox's traffic token.
pub(crate) const TRAFFIC_PUBLIC: &str = "public";
pub(crate) const TRAFFIC_TOKEN: &str = "token";
const TRAFFIC_TOKEN_PURPOSE: &str = "e2b-traffic-access-token";

/// The session, if its E2B traffic rule lets this request in.
async fn admitted(state: &AppState, id: &SessionId, headers: &HeaderMap) -> Option<space_api::Session> {
    let record = state.store.session_any(id).await.ok()??;
    let rule = record.session.labels.get(TRAFFIC_LABEL)?;
    let token = headers.get("e2b-traffic-access-token").and_then(|v| v.to_str().ok());
    let allowed = match rule.as_str() {
        TRAFFIC_PUBLIC => true,
        TRAFFIC_TOKEN => {
            token.is_some_and(|t| envd::constant_time_eq(t.as_bytes(), traffic_token(state, id).as_bytes()))
        }
        _ => false,
    };
    allowed.then_some(record.session)
}

/// The token that reaches the ports of a sandbox made with `allowPublicTraffic: false`.
pub(crate) fn traffic_token(state: &AppState, id: &SessionId) -> String {
    state.idempotency.token(TRAFFIC_TOKEN_PURPOSE, id.as_str())
}

/// Middleware of the control calls: `X-API-Key` (E2B's header) or `Authorization: Bearer`
/// names a space API key.
async fn require_api_key(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, E2bError> {
    let key = request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .or_else(|| crate::auth::bearer_key(request.headers()))
        .ok_or_else(|| {
            E2bError::new(401, "missing API key: set E2B_API_KEY to a space API key (`space key create --tenant NAME`)")
        })?
        .to_owned();
    let caller = crate::auth::tenant_caller_of_key(&state, &key).await?;
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

/// The access token of sandbox `id`'s envd.
pub(crate) fn access_token(state: &AppState, id: &SessionId) -> String {
    state.idempotency.token(TOKEN_PURPOSE, id.as_str())
}

/// A time (Unix milliseconds) as RFC 3339, clamped to what it can write (years 1970-9999):
/// file times come from the sandbox.
pub(crate) fn rfc3339(ms: i64) -> String {
    const LAST_MS: i64 = 253_402_300_799_999;
    let ms = ms.clamp(0, LAST_MS) as u64;
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
}

/// The caller an envd call acts as: the sandbox's tenant, no more.
fn sandbox_caller(tenant_id: space_api::TenantId) -> Caller {
    Caller { tenant_id, tenant: "(e2b sandbox token)".into(), admin: false, scope: None }
}
