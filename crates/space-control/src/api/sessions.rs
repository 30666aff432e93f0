//! Sessions: create, list, show, destroy, events.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use space_api::error::echo;
use space_api::{
    CreateSessionRequest, ErrorBody, ErrorCode, EventList, MaxAgeAction, OperationId, OperationState, Resources,
    Session, SessionId, SessionLifetime, SessionList, TenantId, UpdateSessionRequest,
};
use space_node_api::NodeApi;
use space_store::{NewSession, SessionMeta};
use utoipa::IntoParams;

use super::session_meta::{ListParams, check_labels, check_metadata, check_name, list_filter};
use super::{find_session, visible_session};
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, ApiQuery, AppError, AppResult};
use crate::idempotency::RunsUnderKey;

/// Upper bounds on what one session may ask for.
const MAX_CPUS: f64 = 64.0;
const MAX_MEMORY_MIB: u64 = 256 * 1024;
const MAX_PIDS: u32 = 65_536;
/// Disk limits: enough for a few files, at most 64 TiB.
const MIN_DISK_MIB: u64 = 16;
const MAX_DISK_MIB: u64 = 64 << 20;
const MAX_ENV: usize = 256;
/// How long a synchronous call waits for its operation.
const WAIT: Duration = Duration::from_secs(600);

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitParam {
    /// Return at once with 202 instead of waiting for the operation (default: wait).
    #[serde(default = "yes")]
    pub wait: bool,
}

fn yes() -> bool {
    true
}

fn resources(request: &CreateSessionRequest, default_disk_mib: u64) -> AppResult<Resources> {
    let defaults = Resources::default();
    let r = Resources {
        cpus: request.cpus.unwrap_or(defaults.cpus),
        memory_mib: request.memory_mib.unwrap_or(defaults.memory_mib),
        pids: request.pids.unwrap_or(defaults.pids),
        disk_mib: request.disk_mib.unwrap_or(default_disk_mib),
    };
    if r.disk_mib != 0 && !(MIN_DISK_MIB..=MAX_DISK_MIB).contains(&r.disk_mib) {
        return Err(AppError::bad_request(format!(
            "disk_mib must be between {MIN_DISK_MIB} and {MAX_DISK_MIB}, or 0 for no limit"
        )));
    }
    if !(r.cpus.is_finite() && r.cpus >= 0.01 && r.cpus <= MAX_CPUS) {
        return Err(AppError::bad_request(format!("cpus must be between 0.01 and {MAX_CPUS}")));
    }
    if !(16..=MAX_MEMORY_MIB).contains(&r.memory_mib) {
        return Err(AppError::bad_request(format!("memory_mib must be between 16 and {MAX_MEMORY_MIB}")));
    }
    if !(8..=MAX_PIDS).contains(&r.pids) {
        return Err(AppError::bad_request(format!("pids must be between 8 and {MAX_PIDS}")));
    }
    Ok(r)
}

fn check_env(request: &CreateSessionRequest) -> AppResult<()> {
    if request.env.len() > MAX_ENV {
        return Err(AppError::bad_request(format!("at most {MAX_ENV} environment variables")));
    }
    for name in request.env.keys() {
        let valid = !name.is_empty() && !name.contains('=') && !name.contains('\0');
        if !valid {
            return Err(AppError::bad_request(format!("invalid environment variable name {}", echo(name))));
        }
    }
    if request.env.values().any(|v| v.contains('\0')) {
        return Err(AppError::bad_request("environment values must not contain NUL bytes"));
    }
    Ok(())
}

/// A lifetime the session can have: `on_max_age: suspend` needs full snapshots.
fn check_lifetime(state: &AppState, runtime: space_api::RuntimeKind, lifetime: &SessionLifetime) -> AppResult<()> {
    lifetime.validate().map_err(AppError::bad_request)?;
    if lifetime.on_max_age == MaxAgeAction::Suspend {
        super::lifecycle::require_checkpoints(state, runtime)?;
    }
    Ok(())
}

/// The node runs `runtime`, or a 400 saying why not.
pub(super) fn check_runtime(state: &AppState, runtime: space_api::RuntimeKind) -> AppResult<()> {
    state.nodes.first().runtime_available(runtime).map_err(|why| {
        AppError::new(
            ErrorCode::RuntimeUnavailable,
            format!("the {runtime} runtime is unavailable on this server: {why}; `space doctor` says what it needs"),
        )
    })
}

/// Whether `tenant` has a template `name` (its own, or a global one).
pub(super) async fn check_template(state: &AppState, tenant: &TenantId, name: &str) -> AppResult<()> {
    // A built-in template is known without asking a node (every node builds it on first use).
    if state.nodes.first().is_builtin(name) {
        return Ok(());
    }
    let known = |node: Arc<dyn NodeApi>| async move {
        match crate::template_scope::find(node.as_ref(), tenant, name).await {
            Some(_) => None,
            None => {
                let names = node.available_templates().await.into_iter();
                Some(
                    names
                        .filter_map(|n| crate::template_scope::visible(tenant, &n))
                        .map(|(n, _)| n)
                        .collect::<Vec<_>>(),
                )
            }
        }
    };
    // Known if any node has it: placement then picks one that does.
    let answers = crate::placement::every_answer(state, known).await?;
    let Some(answers) = answers.into_iter().collect::<Option<Vec<Vec<String>>>>() else { return Ok(()) };
    let mut available: Vec<String> = answers.into_iter().flatten().collect();
    available.sort();
    available.dedup();
    Err(AppError::new(
        ErrorCode::UnknownTemplate,
        format!("unknown template {}; available: {}", echo(name), available.join(", ")),
    ))
}

/// Creates a session and its first sandbox. Waits until it is running unless `wait=false`.
#[utoipa::path(post, path = "/v1/sessions", request_body = CreateSessionRequest, params(WaitParam),
    responses((status = 201, body = Session), (status = 202, body = Session), (status = 400, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 507, body = ErrorBody)))]
pub async fn create_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(params): ApiQuery<WaitParam>,
    key: Option<Extension<RunsUnderKey>>,
    ApiJson(request): ApiJson<CreateSessionRequest>,
) -> AppResult<(StatusCode, ApiJson<Session>)> {
    let key = key.map(|Extension(RunsUnderKey(key))| key);
    let wait = params.wait.then(|| tokio::time::Instant::now() + WAIT);
    if let Some(key) = &key
        && let Some((id, op)) = state.store.session_created_under_key(&caller.tenant_id, key).await?
    {
        // A retry of a create a crash interrupted after the session was recorded.
        return created(&state, &caller, &id, op, wait).await;
    }
    let template = request.template.clone().unwrap_or_else(|| state.default_template.clone());
    check_template(&state, &caller.tenant_id, &template).await?;
    let runtime = request.runtime.unwrap_or(state.default_runtime);
    check_runtime(&state, runtime)?;
    let resources = resources(&request, state.default_disk_mib)?;
    check_env(&request)?;
    let snapshot_policy = request.snapshot_policy.clone().unwrap_or_else(|| state.snapshot_policy.clone());
    snapshot_policy.validate().map_err(|e| AppError::bad_request(format!("snapshot_policy: {e}")))?;
    let lifetime = SessionLifetime {
        idle_timeout_secs: request.idle_timeout_secs,
        max_age_secs: request.max_age_secs,
        on_max_age: request.on_max_age.unwrap_or_default(),
        auto_resume_max_age_secs: request.auto_resume_max_age_secs,
    };
    check_lifetime(&state, runtime, &lifetime)?;
    let meta = create_meta(&request)?;
    let egress = crate::egress::check_new_egress(&state, &caller.tenant_id, request.network, &request.grants).await?;
    // Taken once the request is known good: a refused one uses up no CA.
    let (id, ca) = state.session_cas.take()?;
    let mut new = NewSession {
        id,
        tenant_id: caller.tenant_id.clone(),
        template,
        runtime,
        resources,
        env: request.env,
        source_snapshot: None,
        template_version: None,
        snapshot_policy,
        lifetime,
        meta,
    };
    // The session's egress reaches the gateway before any sandbox of it starts.
    let op = crate::egress::insert_new_session(&state, &mut new, ca, egress, key).await?;
    let op_id = op.operation.id.clone();
    // This replica runs it at once: no loop has to claim it, no waiter reads the store for it.
    let running = state.reconciler.perform_here(state.clone(), op);
    let Some(deadline) = wait else { return created(&state, &caller, &new.id, None, None).await };
    match tokio::time::timeout_at(deadline, running).await {
        Ok(Ok(Some(ended))) => {
            answer_created(&state, &caller, &new.id, ended.map_err(|e| (e.0.code, e.0.message))).await
        }
        // Its end was not recorded here (another replica took it over, or recording it
        // failed and it runs again): the store will have it.
        Ok(Ok(None)) => created(&state, &caller, &new.id, Some(op_id), wait).await,
        Ok(Err(e)) => Err(AppError::internal(format!("creating session {} failed: {e}", new.id))),
        Err(_) => created(&state, &caller, &new.id, None, None).await,
    }
}

fn create_meta(request: &CreateSessionRequest) -> AppResult<SessionMeta> {
    if let Some(name) = &request.name {
        check_name(name)?;
    }
    check_labels(&request.labels)?;
    check_metadata(&request.metadata)?;
    Ok(SessionMeta {
        name: request.name.clone(),
        labels: request.labels.clone(),
        metadata: request.metadata.clone(),
        auto_resume: request.auto_resume,
    })
}

/// The session's settings after `request` (`None`: nothing about them changes).
fn updated_meta(session: &Session, request: &UpdateSessionRequest) -> AppResult<Option<SessionMeta>> {
    let mut meta = SessionMeta::of(session);
    if let Some(name) = &request.name {
        if !name.is_empty() {
            check_name(name)?;
        }
        meta.name = (!name.is_empty()).then(|| name.clone());
    }
    if let Some(labels) = &request.labels {
        check_labels(labels)?;
        meta.labels = labels.clone();
    }
    if let Some(metadata) = &request.metadata {
        check_metadata(metadata)?;
        meta.metadata = metadata.clone();
    }
    meta.auto_resume = request.auto_resume.unwrap_or(meta.auto_resume);
    Ok((meta != SessionMeta::of(session)).then_some(meta))
}

/// The answer to a create of session `id` by operation `op`: once the operation has finished,
/// or 202 at once (no `wait` deadline) or when it has not finished by the deadline.
async fn created(
    state: &AppState,
    caller: &Caller,
    id: &SessionId,
    op: Option<OperationId>,
    wait: Option<tokio::time::Instant>,
) -> AppResult<(StatusCode, ApiJson<Session>)> {
    let accepted = async {
        let session = find_session(state, caller, id.as_str()).await?;
        Ok((StatusCode::ACCEPTED, ApiJson(session)))
    };
    let (Some(op), Some(deadline)) = (op, wait) else { return accepted.await };
    let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
    let finished = state.reconciler.wait(state, &caller.tenant_id, &op, timeout).await?;
    let ended = match finished.state {
        OperationState::Succeeded => Ok(()),
        OperationState::Failed => Err((
            finished.error_code.unwrap_or(ErrorCode::SandboxUnavailable),
            finished.error.unwrap_or_else(|| "session creation failed".into()),
        )),
        OperationState::Pending | OperationState::Running => return accepted.await,
    };
    answer_created(state, caller, id, ended).await
}

/// The answer to a create of session `id` whose operation `ended` (with an error's code and
/// message).
async fn answer_created(
    state: &AppState,
    caller: &Caller,
    id: &SessionId,
    ended: Result<(), (ErrorCode, String)>,
) -> AppResult<(StatusCode, ApiJson<Session>)> {
    let session = find_session(state, caller, id.as_str()).await?;
    match ended {
        Ok(()) => Ok((StatusCode::CREATED, ApiJson(session))),
        Err((code, message)) => Err(AppError::new(code, format!("creating session {} failed: {message}", session.id))),
    }
}

/// The caller's sessions, newest first, filtered by the query: `label=KEY=VALUE` (repeat it:
/// all must match), `state`, `template`, `all` (destroyed ones too) and `all_tenants`
/// (every tenant's; admin key only).
#[utoipa::path(get, path = "/v1/sessions", params(ListParams),
    responses((status = 200, body = SessionList), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_sessions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(pairs): ApiQuery<Vec<(String, String)>>,
) -> AppResult<ApiJson<SessionList>> {
    let filter = list_filter(&caller, &pairs)?;
    let sessions = state.store.list_sessions(&filter).await?;
    Ok(ApiJson(SessionList { sessions }))
}

/// A session. The admin may read any tenant's.
#[utoipa::path(get, path = "/v1/sessions/{id}", params(("id" = String, Path)),
    responses((status = 200, body = Session), (status = 404, body = ErrorBody)))]
pub async fn get_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<Session>> {
    Ok(ApiJson(visible_session(&state, &caller, &id).await?.1))
}

/// Changes a session's settings: its snapshot policy, idle timeout and maximum age, its name,
/// labels and metadata (each replaced whole), and `auto_resume`.
#[utoipa::path(patch, path = "/v1/sessions/{id}", params(("id" = String, Path)), request_body = UpdateSessionRequest,
    responses((status = 200, body = Session), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn update_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<UpdateSessionRequest>,
) -> AppResult<ApiJson<Session>> {
    let session = find_session(&state, &caller, &id).await?;
    let lifetime = session.lifetime.updated(&request);
    if lifetime != session.lifetime {
        check_lifetime(&state, session.runtime, &lifetime)?;
    }
    if let Some(policy) = &request.snapshot_policy {
        policy.validate().map_err(|e| AppError::bad_request(format!("snapshot_policy: {e}")))?;
    }
    let meta = updated_meta(&session, &request)?;
    if request.snapshot_policy.is_some() || lifetime != session.lifetime {
        let policy = request.snapshot_policy.as_ref().unwrap_or(&session.snapshot_policy);
        state.store.set_settings(&session.id, policy, &lifetime).await?;
    }
    if let Some(meta) = meta {
        state.store.set_meta(&session.id, &meta).await?;
    }
    Ok(ApiJson(find_session(&state, &caller, &id).await?))
}

/// Destroys a session and its sandbox. Idempotent: destroying a destroyed session is a no-op.
/// The admin may destroy any tenant's.
#[utoipa::path(delete, path = "/v1/sessions/{id}", params(("id" = String, Path), WaitParam),
    responses((status = 200, body = Session), (status = 202, body = Session), (status = 404, body = ErrorBody)))]
pub async fn destroy_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<WaitParam>,
) -> AppResult<(StatusCode, ApiJson<Session>)> {
    let (tenant, session) = visible_session(&state, &caller, &id).await?;
    if let Some(op) = state.store.begin_destroy(&tenant, &session.id).await? {
        state.reconciler.wake();
        if !params.wait {
            return Ok((StatusCode::ACCEPTED, ApiJson(visible_session(&state, &caller, &id).await?.1)));
        }
        state.reconciler.wait(&state, &tenant, &op, WAIT).await?;
    }
    Ok((StatusCode::OK, ApiJson(visible_session(&state, &caller, &id).await?.1)))
}

/// Every state transition and notable event of a session, oldest first.
#[utoipa::path(get, path = "/v1/sessions/{id}/events", params(("id" = String, Path)),
    responses((status = 200, body = EventList), (status = 404, body = ErrorBody)))]
pub async fn session_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> AppResult<ApiJson<EventList>> {
    let session = find_session(&state, &caller, &id).await?;
    Ok(ApiJson(EventList { events: state.store.events(&session.id).await? }))
}
