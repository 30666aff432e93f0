//! E2B's control calls (`/sandboxes…`), each made by the native handler it maps to: an E2B
//! sandbox is a space session, its id the session's id.
//!
//! E2B's `timeout` is an absolute end: the session's maximum age is set so that it ends
//! `timeout` seconds from now, and `on_timeout: pause` (E2B's auto-pause) makes reaching it
//! suspend the session (memory kept) instead of destroying it. A resume or connect sets a new
//! end, so time spent paused never counts against the timeout; an auto-resume sets one too
//! (`auto_resume_max_age_secs`: the create's timeout, at least 5 minutes, as E2B does).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{any, get, post};
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use space_api::{CreateSessionRequest, MaxAgeAction, Session, SessionLifetime, SessionState, UpdateSessionRequest};
use space_store::now_ms;

use super::errors::{E2bError, E2bResult};
use super::{ENVD_VERSION, access_token};
use crate::AppState;
use crate::api::sessions::{self, WaitParam};
use crate::api::{find_session, lifecycle, suspend_session};
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, ApiQuery};

/// E2B's default timeout when a create names none.
pub(super) const DEFAULT_TIMEOUT_SECS: u64 = 15;
/// The shortest timeout an auto-resume gives (E2B's: the create's timeout, at least 5 minutes).
const AUTO_RESUME_MIN_TIMEOUT_SECS: u64 = 300;
/// Most sandboxes one list page holds.
const MAX_PAGE: usize = 100;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/sandboxes", post(create).get(list_v1))
        .route("/v2/sandboxes", post(create).get(list_v2))
        .route("/sandboxes/{id}", get(get_sandbox).delete(kill))
        .route("/sandboxes/{id}/logs", get(super::logs::logs_v1))
        .route("/v2/sandboxes/{id}/logs", get(super::logs::logs_v2))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/fork", post(super::snapshots::fork))
        .route("/sandboxes/{id}/snapshots", post(super::snapshots::create))
        .route("/snapshots", get(super::snapshots::list))
        .route("/templates/{id}", axum::routing::delete(super::snapshots::delete))
        .route("/sandboxes/{id}/network", axum::routing::put(super::network::update))
        .route("/sandboxes/{id}/metrics", get(super::metrics::metrics))
        .route("/volumes", any(|| async { volumes() }))
        .route("/volumes/{*rest}", any(|| async { volumes() }))
}

fn volumes() -> E2bError {
    E2bError::unsupported(
        "E2B volumes",
        "keep data in the sandbox (it lives as long as you need, and survives pause) or fork it",
    )
}

/// A JSON body, refused in E2B's error shape when malformed. Unknown fields are kept by the
/// request types (`other`) so they can be logged, never refused.
pub(super) struct E2bJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for E2bJson<T> {
    type Rejection = E2bError;

    async fn from_request(request: Request, state: &S) -> Result<Self, E2bError> {
        let body = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(|e| E2bError::bad_request(format!("cannot read the body: {e}")))?;
        let body = if body.is_empty() { axum::body::Bytes::from_static(b"{}") } else { body };
        serde_json::from_slice(&body).map(E2bJson).map_err(|e| {
            E2bError::bad_request(format!(
                "the body is not valid JSON for this call: {}",
                space_api::error::clip(&e.to_string())
            ))
        })
    }
}

fn warn_unknown(call: &str, other: &BTreeMap<String, serde_json::Value>) {
    if !other.is_empty() {
        let fields: Vec<&str> = other.keys().map(String::as_str).collect();
        tracing::warn!(call, ?fields, "E2B request fields space does not know were ignored");
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<super::network::NetworkConfig>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    secure: Option<bool>,
    mcp: Option<serde_json::Value>,
    iam: Option<serde_json::Value>,
    volume_mounts: Option<Vec<serde_json::Value>>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct AutoResume {
    #[serde(default)]
    enabled: bool,
}

impl NewSandbox {
    /// A 501 for what the request asks that space cannot do, rather than dropping it.
    fn refuse_unsupported(&self) -> E2bResult<()> {
        if self.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
            return Err(volumes());
        }
        if self.mcp.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(E2bError::unsupported("MCP gateway sandboxes", "run the MCP server in the sandbox yourself"));
        }
        if self.iam.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(E2bError::unsupported(
                "IAM workload tokens",
                "grant credentials to the session with space's API (`POST /v1/credentials`)",
            ));
        }
        if self.auto_pause == Some(true) && self.auto_pause_memory == Some(false) {
            return Err(E2bError::unsupported(
                "pausing without memory (autoPauseMemory: false)",
                "a pause keeps memory and processes",
            ));
        }
        if self.secure == Some(false) {
            tracing::info!("E2B create with secure: false: envd still requires the sandbox's access token");
        }
        Ok(())
    }
}

/// The template a create names: E2B's `base` is the server's default template.
fn template_of(state: &AppState, name: &str) -> String {
    match name {
        "" | "base" => state.default_template.clone(),
        name => name.to_owned(),
    }
}

fn check_timeout(timeout: u64) -> E2bResult<u64> {
    if timeout == 0 || timeout > SessionLifetime::MAX_SECS {
        return Err(E2bError::bad_request(format!(
            "timeout must be between 1 and {} seconds",
            SessionLifetime::MAX_SECS
        )));
    }
    Ok(timeout)
}

async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    E2bJson(request): E2bJson<NewSandbox>,
) -> E2bResult<(StatusCode, Json<SandboxOut>)> {
    warn_unknown("create", &request.other);
    request.refuse_unsupported()?;
    let timeout = check_timeout(request.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?;
    let internet_by_default = state.e2b_internet_by_default;
    let network = super::network::policy(request.allow_internet_access, request.network.as_ref(), internet_by_default)?;
    let public = request.network.as_ref().is_none_or(|n| n.public_traffic());
    let traffic = if public { super::TRAFFIC_PUBLIC } else { super::TRAFFIC_TOKEN };
    let auto_resume = request.auto_resume.is_some_and(|a| a.enabled);
    let native = CreateSessionRequest {
        labels: BTreeMap::from([(super::TRAFFIC_LABEL.to_owned(), traffic.to_owned())]),
        template: Some(template_of(&state, &request.template_id)),
        env: request.env_vars.unwrap_or_default(),
        metadata: request.metadata.unwrap_or_default(),
        max_age_secs: Some(timeout),
        on_max_age: (request.auto_pause == Some(true)).then_some(MaxAgeAction::Suspend),
        auto_resume,
        auto_resume_max_age_secs: auto_resume.then(|| timeout.max(AUTO_RESUME_MIN_TIMEOUT_SECS)),
        network,
        ..CreateSessionRequest::default()
    };
    if let Some(snapshot) = super::snapshots::as_template(&state, &caller, &request.template_id).await? {
        // What the request itself says: the operator's internet default is no network option,
        // and neither is `allow_internet_access: true`, E2B's default, which SDKs before 2.x
        // send with every create.
        let network_asked = request.network.is_some() || request.allow_internet_access == Some(false);
        if !native.env.is_empty() || network_asked || native.on_max_age.is_some() || native.auto_resume {
            return Err(E2bError::bad_request(
                "a sandbox from a snapshot keeps its source's envVars, network, lifecycle and autoResume; \
                 send only timeout and metadata",
            ));
        }
        let session = super::snapshots::create_from(&state, &caller, snapshot, timeout, native.metadata).await?;
        return Ok((StatusCode::CREATED, Json(SandboxOut::of(&state, &session, &request.template_id))));
    }
    let wait = ApiQuery(WaitParam { wait: true });
    let (_, ApiJson(session)) =
        sessions::create_session(State(state.clone()), Extension(caller), wait, None, ApiJson(native)).await?;
    Ok((StatusCode::CREATED, Json(SandboxOut::of(&state, &session, &request.template_id))))
}

/// E2B's `Sandbox`: what a create, resume and connect answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SandboxOut {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    alias: Option<String>,
    #[serde(rename = "clientID")]
    client_id: String,
    envd_version: &'static str,
    envd_access_token: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    traffic_access_token: Option<String>,
    domain: Option<String>,
}

impl SandboxOut {
    pub(super) fn of(state: &AppState, session: &Session, alias: &str) -> SandboxOut {
        SandboxOut {
            sandbox_id: session.id.to_string(),
            template_id: session.template.clone(),
            alias: (!alias.is_empty()).then(|| alias.to_owned()),
            client_id: client_id(session),
            envd_version: ENVD_VERSION,
            envd_access_token: access_token(state, &session.id),
            traffic_access_token: (session.labels.get(super::TRAFFIC_LABEL).map(String::as_str)
                == Some(super::TRAFFIC_TOKEN))
            .then(|| super::traffic_token(state, &session.id)),
            domain: state.e2b_domain.clone(),
        }
    }
}

fn client_id(session: &Session) -> String {
    session.node.clone().unwrap_or_else(|| "space".into())
}

/// E2B's sandbox states: a suspended (or suspending) session is `paused`, as E2B's pause
/// keeps memory as a suspend does; a paused (frozen) one too.
fn e2b_state(state: SessionState) -> &'static str {
    match state {
        SessionState::Paused | SessionState::Suspended | SessionState::Suspending => "paused",
        _ => "running",
    }
}

/// When the session ends (or pauses) on its own: creation plus its maximum age.
fn end_at(session: &Session) -> i64 {
    let age = session.lifetime.max_age_secs.unwrap_or(SessionLifetime::MAX_SECS);
    session.created_at.saturating_add((age as i64).saturating_mul(1000))
}

/// E2B's `ListedSandbox`, and with `detail` its `SandboxDetail`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Listed {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "templateID")]
    template_id: String,
    alias: String,
    #[serde(rename = "clientID")]
    client_id: String,
    started_at: String,
    end_at: String,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    metadata: BTreeMap<String, String>,
    state: &'static str,
    envd_version: &'static str,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    detail: Option<Detail>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Detail {
    envd_access_token: String,
    domain: Option<String>,
    lifecycle: Lifecycle,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Lifecycle {
    auto_resume: bool,
    on_timeout: &'static str,
}

impl Listed {
    fn of(state: &AppState, session: &Session, detail: bool) -> Listed {
        let resources = &session.resources;
        Listed {
            sandbox_id: session.id.to_string(),
            template_id: session.template.clone(),
            alias: session.template.clone(),
            client_id: client_id(session),
            started_at: super::rfc3339(session.created_at),
            end_at: super::rfc3339(end_at(session)),
            cpu_count: resources.cpus.ceil().max(1.0) as u32,
            memory_mb: resources.memory_mib,
            disk_size_mb: resources.disk_mib,
            metadata: session.metadata.clone(),
            state: e2b_state(session.state),
            envd_version: ENVD_VERSION,
            detail: detail.then(|| Detail {
                envd_access_token: access_token(state, &session.id),
                domain: state.e2b_domain.clone(),
                lifecycle: Lifecycle {
                    auto_resume: session.auto_resume,
                    on_timeout: match session.lifetime.on_max_age {
                        MaxAgeAction::Suspend => "pause",
                        MaxAgeAction::Destroy => "kill",
                    },
                },
            }),
        }
    }
}

/// A session of the caller that E2B would call a sandbox: not destroyed, not being destroyed.
pub(super) async fn sandbox(state: &AppState, caller: &Caller, id: &str) -> E2bResult<Session> {
    let session = any_sandbox(state, caller, id).await?;
    match session.state {
        SessionState::Destroyed | SessionState::Destroying => Err(E2bError::no_sandbox(id)),
        _ => Ok(session),
    }
}

/// The caller's session `id`, also one killed (destroyed) or being killed.
pub(super) async fn any_sandbox(state: &AppState, caller: &Caller, id: &str) -> E2bResult<Session> {
    // Only "not found" is E2B's 404: a database that is down must not read as a sandbox gone.
    find_session(state, caller, id).await.map_err(|e| match e.0.code {
        space_api::ErrorCode::NotFound => E2bError::no_sandbox(id),
        _ => E2bError::from(e),
    })
}

async fn get_sandbox(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> E2bResult<Json<Listed>> {
    let session = sandbox(&state, &caller, &id).await?;
    Ok(Json(Listed::of(&state, &session, true)))
}

async fn kill(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> E2bResult<StatusCode> {
    sandbox(&state, &caller, &id).await?;
    let wait = ApiQuery(WaitParam { wait: false });
    sessions::destroy_session(State(state), Extension(caller), ApiPath(id), wait).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct TimeoutRequest {
    timeout: u64,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// Sets the session to end `timeout` seconds from now (its maximum age counts from creation).
pub(super) async fn end_in(state: &AppState, caller: &Caller, session: &Session, timeout: u64) -> E2bResult<Session> {
    let timeout = check_timeout(timeout)?;
    let max_age = SessionLifetime::max_age_ending_in(session.created_at, now_ms(), timeout);
    let update = UpdateSessionRequest { max_age_secs: Some(max_age), ..UpdateSessionRequest::default() };
    let path = ApiPath(session.id.to_string());
    let ApiJson(session) =
        sessions::update_session(State(state.clone()), Extension(caller.clone()), path, ApiJson(update)).await?;
    Ok(session)
}

async fn set_timeout(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    E2bJson(request): E2bJson<TimeoutRequest>,
) -> E2bResult<StatusCode> {
    warn_unknown("timeout", &request.other);
    let session = sandbox(&state, &caller, &id).await?;
    end_in(&state, &caller, &session, request.timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
struct RefreshRequest {
    duration: Option<u64>,
}

/// Extends the sandbox's life: `duration` seconds from now (E2B's default 60), never less
/// than it had.
async fn refresh(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    E2bJson(request): E2bJson<RefreshRequest>,
) -> E2bResult<StatusCode> {
    let duration = check_timeout(request.duration.unwrap_or(60))?;
    let session = sandbox(&state, &caller, &id).await?;
    if now_ms().saturating_add(duration as i64 * 1000) > end_at(&session) {
        end_in(&state, &caller, &session, duration).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
struct PauseRequest {
    memory: Option<bool>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// E2B's pause keeps memory and processes: a suspend.
async fn pause(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    E2bJson(request): E2bJson<PauseRequest>,
) -> E2bResult<StatusCode> {
    warn_unknown("pause", &request.other);
    let session = sandbox(&state, &caller, &id).await?;
    if request.memory == Some(false) {
        return Err(E2bError::unsupported(
            "pausing without memory (mode=\"filesystem\")",
            "a pause keeps memory and processes; snapshot with mode=\"filesystem\" and kill the sandbox instead",
        ));
    }
    if e2b_state(session.state) == "paused" {
        return Err(E2bError::new(409, format!("sandbox {id} is already paused")));
    }
    suspend_session(&state, &caller.tenant_id, &session.id, false).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResumeRequest {
    timeout: Option<u64>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// Resumes a paused sandbox (409 if it is running, as E2B answers) with a new end.
async fn resume(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    E2bJson(request): E2bJson<ResumeRequest>,
) -> E2bResult<(StatusCode, Json<SandboxOut>)> {
    warn_unknown("resume", &request.other);
    let session = sandbox(&state, &caller, &id).await?;
    if e2b_state(session.state) != "paused" {
        return Err(E2bError::new(409, format!("sandbox {id} is already running")));
    }
    let session = wake(&state, &caller, &session, request.timeout).await?;
    Ok((StatusCode::CREATED, Json(SandboxOut::of(&state, &session, ""))))
}

/// Connects to a sandbox: a paused one is resumed (201), a running one answered as it is
/// (200); either way it ends `timeout` seconds from now.
async fn connect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    E2bJson(request): E2bJson<ResumeRequest>,
) -> E2bResult<(StatusCode, Json<SandboxOut>)> {
    warn_unknown("connect", &request.other);
    let session = sandbox(&state, &caller, &id).await?;
    if e2b_state(session.state) == "paused" {
        let session = wake(&state, &caller, &session, request.timeout).await?;
        return Ok((StatusCode::CREATED, Json(SandboxOut::of(&state, &session, ""))));
    }
    let session = match request.timeout {
        Some(timeout) => end_in(&state, &caller, &session, timeout).await?,
        None => session,
    };
    Ok((StatusCode::OK, Json(SandboxOut::of(&state, &session, ""))))
}

/// The session once a suspend under way has finished: E2B calls it paused already, so a
/// resume may come while it runs.
async fn settled(state: &AppState, caller: &Caller, mut session: Session) -> E2bResult<Session> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while session.state == SessionState::Suspending && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        session = sandbox(state, caller, session.id.as_str()).await?;
    }
    Ok(session)
}

/// Resumes the session and sets its end; the end is set first, so a session whose maximum
/// age already passed is not suspended again at the next tick.
async fn wake(state: &AppState, caller: &Caller, session: &Session, timeout: Option<u64>) -> E2bResult<Session> {
    let session = &settled(state, caller, session.clone()).await?;
    end_in(state, caller, session, timeout.unwrap_or(DEFAULT_TIMEOUT_SECS)).await?;
    let path = ApiPath(session.id.to_string());
    let ApiJson(session) = lifecycle::resume(State(state.clone()), Extension(caller.clone()), path).await?;
    Ok(session)
}

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

/// The metadata filter `k1=v1&k2=v2`, each key and value percent-encoded within it (so
/// encoded twice in the URL, as the SDKs send it).
fn metadata_filter(query: Option<&str>) -> Vec<(String, String)> {
    let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
    let pairs = query.unwrap_or_default().split('&').filter(|p| !p.is_empty());
    pairs.map(|pair| pair.split_once('=').unwrap_or((pair, ""))).map(|(k, v)| (decode(k), decode(v))).collect()
}

/// The caller's sandboxes in `states` whose metadata has every pair of the `metadata` filter,
/// newest first.
pub(super) async fn matching(
    state: &AppState,
    caller: &Caller,
    metadata: Option<&str>,
    states: &[&str],
) -> E2bResult<Vec<Session>> {
    let filter = crate::api::session_meta::list_filter(caller, &[])?;
    let wanted = metadata_filter(metadata);
    let mut sessions: Vec<Session> = state
        .store
        .list_sessions(&filter)
        .await
        .map_err(crate::error::AppError::from)?
        .into_iter()
        .filter(|s| !matches!(s.state, SessionState::Destroyed | SessionState::Destroying))
        .filter(|s| states.contains(&e2b_state(s.state)))
        .filter(|s| wanted.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .collect();
    sessions.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.as_str().cmp(a.id.as_str())));
    Ok(sessions)
}

/// The deprecated list: running sandboxes only, no pages.
async fn list_v1(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> E2bResult<Json<Vec<Listed>>> {
    let sessions = matching(&state, &caller, query.metadata.as_deref(), &["running"]).await?;
    Ok(Json(sessions.iter().map(|s| Listed::of(&state, s, false)).collect()))
}

/// Sandboxes in the states asked (default: running and paused), newest first, a page at a
/// time: `X-Next-Token` names the next page's first sandbox.
async fn list_v2(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> E2bResult<(HeaderMap, Json<Vec<Listed>>)> {
    let states: Vec<&str> = match query.state.as_deref() {
        None | Some("") => vec!["running", "paused"],
        Some(list) => list.split(',').map(str::trim).collect(),
    };
    if let Some(bad) = states.iter().find(|s| !["running", "paused"].contains(s)) {
        return Err(E2bError::bad_request(format!("state {} is not running or paused", space_api::error::echo(bad))));
    }
    let sessions = matching(&state, &caller, query.metadata.as_deref(), &states).await?;
    let start = match &query.next_token {
        Some(token) => sessions.iter().position(|s| s.id.as_str() == token).ok_or_else(|| {
            E2bError::bad_request("nextToken names no sandbox of this list; start from the first page")
        })?,
        None => 0,
    };
    let limit = query.limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let page = &sessions[start..sessions.len().min(start + limit)];
    let mut headers = HeaderMap::new();
    if let Some(next) = sessions.get(start + limit)
        && let Ok(value) = HeaderValue::from_str(next.id.as_str())
    {
        headers.insert("x-next-token", value);
    }
    Ok((headers, Json(page.iter().map(|s| Listed::of(&state, s, false)).collect())))
}
