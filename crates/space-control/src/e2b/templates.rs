//! E2B's template builds (`Template.build` of its SDKs), as space's Dockerfile builds: a
//! build is requested (`POST /v3/templates`: its template and a build id, which is the id of
//! the operation the build will be), the files of its `COPY` steps are uploaded by hash, then
//! the steps are sent (`POST /v2/templates/{id}/builds/{build}`) and become a Dockerfile
//! ([`super::template_steps`]) and a build context ([`super::template_context`]) queued as
//! the native `POST /v1/templates/builds` queues them. The build's progress and log are its
//! operation's (`…/builds/{build}/status`). The template is the caller's own (a tenant's name,
//! the admin's global), as with the native API.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};
use space_api::{OperationId, OperationState, TemplateBuild, TenantId};
use space_store::OperationKind;

use super::errors::{E2bError, E2bResult};
use super::sandboxes::E2bJson;
use super::template_steps::{self, BuildStart};
use crate::AppState;
use crate::api::template_uploads::{Removal, private_dir, receive, remove, upload_dir};
use crate::api::templates::{own_name, queue_as};
use crate::auth::Caller;
use crate::error::{ApiPath, ApiQuery};
use crate::template_work::TemplateInput;

/// How long an uploaded file waits for builds that use it.
const UPLOAD_TTL: Duration = Duration::from_secs(3600);
/// How long an upload link works.
const LINK_TTL_MS: i64 = 3_600_000;
/// What upload links are keyed for.
const LINK_PURPOSE: &str = "e2b-template-upload";
/// How long an upload waits for the tenant's upload before it.
const TURN_WAIT: Duration = Duration::from_secs(600);
/// A tenant's template builds queued or running at once (their contexts are on disk).
const MAX_ACTIVE_BUILDS: usize = 2;

/// The calls that take the caller's API key.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates/{id}/files/{hash}", get(upload_link))
        .route("/v2/templates/{id}/builds/{build}", post(start_build))
        .route("/templates/{id}/builds/{build}/status", get(status))
        .route("/templates", get(super::template_list::list))
        .route("/v2/templates", get(super::template_list::list))
        .route("/templates/aliases/{alias}", get(super::template_list::alias))
}

/// The upload itself, authorised by its link (the SDK sends no API key with it).
pub fn upload_routes() -> Router<AppState> {
    Router::new().route("/e2b-template-files/{tenant}/{hash}", put(receive_files)).layer(DefaultBodyLimit::disable())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildRequest {
    name: Option<String>,
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildRequested {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    names: Vec<String>,
    aliases: Vec<String>,
    tags: Vec<String>,
}

/// `POST /v3/templates`: a build id for template `name` (`name:tag` only with the tag
/// `latest`: space numbers a template's versions itself).
async fn request_build(
    Extension(caller): Extension<Caller>,
    E2bJson(request): E2bJson<BuildRequest>,
) -> E2bResult<(StatusCode, Json<BuildRequested>)> {
    let named = request.name.or(request.alias).ok_or_else(|| E2bError::bad_request("a template build needs a name"))?;
    let (name, tag) = named.split_once(':').map_or((named.as_str(), None), |(n, t)| (n, Some(t)));
    if tag.into_iter().chain(request.tags.iter().map(String::as_str)).any(|t| t != "latest") {
        return Err(E2bError::unsupported(
            "template tags",
            "space numbers each build of a name as a new version: give each variant a name of its own",
        ));
    }
    own_name(&caller, name)?;
    if !request.other.is_empty() {
        let fields: Vec<&String> = request.other.keys().collect();
        tracing::info!(
            ?fields,
            "E2B template build fields space does not use (cpuCount and memoryMB are the session's)"
        );
    }
    let names = vec![name.to_owned()];
    let answer = BuildRequested {
        template_id: name.to_owned(),
        build_id: OperationId::generate().to_string(),
        public: false,
        aliases: names.clone(),
        names,
        tags: vec!["latest".into()],
    };
    Ok((StatusCode::ACCEPTED, Json(answer)))
}

#[derive(Debug, Serialize)]
pub struct UploadLink {
    present: bool,
    url: String,
}

/// `GET /templates/{id}/files/{hash}`: whether the tar of a `COPY` step's files is here, and
/// where to put it: a link of this endpoint, keyed to the caller's tenant and the hash, that
/// works for an hour.
async fn upload_link(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, hash)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> E2bResult<(StatusCode, Json<UploadLink>)> {
    own_name(&caller, &id)?;
    let path = uploaded(&state, &caller.tenant_id, &hash)?;
    expire_uploads(path.parent().unwrap_or(Path::new("/")));
    let present = tokio::fs::try_exists(&path).await.map_err(|e| E2bError::new(500, format!("uploads: {e}")))?;
    let (scheme, host) = crate::api::ports::origin(&headers);
    let tenant = &caller.tenant_id;
    let expires = space_store::now_ms().saturating_add(LINK_TTL_MS);
    let token = link_token(&state, tenant, &hash, expires);
    let url = format!("{scheme}://{host}/e2b-template-files/{tenant}/{hash}?expires={expires}&token={token}");
    Ok((StatusCode::CREATED, Json(UploadLink { present, url })))
}

fn link_token(state: &AppState, tenant: &TenantId, hash: &str, expires: i64) -> String {
    state.idempotency.token(LINK_PURPOSE, &format!("{tenant}/{hash}/{expires}"))
}

/// Where the files of hash `hash` that `tenant` uploaded wait for builds.
fn uploaded(state: &AppState, tenant: &TenantId, hash: &str) -> E2bResult<PathBuf> {
    template_steps::check_hash(hash).map_err(E2bError::bad_request)?;
    Ok(files_dir(&state.data_dir).join(hex::encode(tenant.as_str())).join(hash))
}

/// `<data dir>/uploads/e2b-files`: uploads waiting for builds (emptied at every start).
pub fn files_dir(data_dir: &Path) -> PathBuf {
    upload_dir(data_dir).join("e2b-files")
}

/// Removes the uploads in `dir` older than [`UPLOAD_TTL`].
fn expire_uploads(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let modified = entry.metadata().and_then(|m| m.modified()).unwrap_or(now);
        if now.duration_since(modified).unwrap_or_default() > UPLOAD_TTL {
            remove(&entry.path());
        }
    }
}

/// The bytes of the uploads waiting in `dir`.
fn waiting_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()
}

#[derive(Debug, Deserialize)]
pub struct LinkQuery {
    expires: i64,
    token: String,
}

/// Each tenant's uploads go one at a time (its SDK may send several at once), so what waits
/// for builds is counted before each is taken in.
static TURNS: LazyLock<Mutex<HashMap<TenantId, Arc<tokio::sync::Mutex<()>>>>> = LazyLock::new(Mutex::default);

async fn turn_of(tenant: &TenantId) -> E2bResult<tokio::sync::OwnedMutexGuard<()>> {
    let turn = TURNS.lock().unwrap_or_else(|e| e.into_inner()).entry(tenant.clone()).or_default().clone();
    tokio::time::timeout(TURN_WAIT, turn.lock_owned())
        .await
        .map_err(|_| E2bError::new(429, "this tenant's uploads before this one take too long: try again"))
}

/// `PUT /e2b-template-files/{tenant}/{hash}?expires&token`: a (gzipped) tar of a step's
/// files. What a tenant's uploads hold in all is at most the server's template upload limit.
async fn receive_files(
    State(state): State<AppState>,
    ApiPath((tenant, hash)): ApiPath<(String, String)>,
    ApiQuery(link): ApiQuery<LinkQuery>,
    body: Body,
) -> E2bResult<StatusCode> {
    let admitted = admit_upload(&state, &tenant, &hash, &link);
    let (path, tenant) = match admitted {
        Ok(admitted) => admitted,
        Err(refused) => return Err(super::errors::drained(body, refused).await),
    };
    let _turn = turn_of(&tenant).await?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    expire_uploads(dir);
    let limit = state.http.template_upload_max_bytes;
    let room = limit.saturating_sub(waiting_bytes(dir));
    if room == 0 {
        let full =
            format!("uploads waiting for builds hold {limit} bytes already: start those builds, or wait an hour");
        return Err(super::errors::drained(body, E2bError::new(507, full)).await);
    }
    store_upload(&state, &path, body, room).await.map(|()| StatusCode::CREATED)
}

/// The upload's path and tenant, if the link holds.
fn admit_upload(state: &AppState, tenant: &str, hash: &str, link: &LinkQuery) -> E2bResult<(PathBuf, TenantId)> {
    let refused = || E2bError::new(403, "this upload link is not valid (or expired): ask for a new one");
    let tenant: TenantId = tenant.parse().map_err(|_| refused())?;
    let expected = link_token(state, &tenant, hash, link.expires);
    let valid = super::envd::constant_time_eq(link.token.as_bytes(), expected.as_bytes());
    if !valid || link.expires < space_store::now_ms() {
        return Err(refused());
    }
    Ok((uploaded(state, &tenant, hash)?, tenant))
}

/// Streams the upload into the tenant's directory, at most `room` bytes; nothing is left of
/// one that fails or whose client goes away.
async fn store_upload(state: &AppState, path: &Path, body: Body, room: u64) -> E2bResult<()> {
    let failed = |e: std::io::Error| E2bError::new(500, format!("keeping the upload: {e}"));
    let dir = path.parent().unwrap_or(Path::new("/"));
    private_dir(dir).await.map_err(failed)?;
    let partial = upload_dir(&state.data_dir).join(format!("{}.partial", hex::encode(rand::random::<[u8; 12]>())));
    let removal = Removal::new(partial.clone());
    receive(body, &partial, room, None).await?;
    tokio::fs::rename(&partial, path).await.map_err(failed)?;
    removal.keep();
    Ok(())
}

/// `POST /v2/templates/{id}/builds/{build}`: the steps, queued as a Dockerfile build whose
/// operation id is the build id.
async fn start_build(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, build_id)): ApiPath<(String, String)>,
    E2bJson(start): E2bJson<BuildStart>,
) -> E2bResult<StatusCode> {
    let name = own_name(&caller, &id)?;
    let build_id = parse_build_id(&build_id)?;
    if state.store.operation(&caller.tenant_id, &build_id).await?.is_some() {
        return Err(E2bError::new(409, format!("build {build_id} was started already: request a new build")));
    }
    if !start.other.is_empty() {
        let fields: Vec<&String> = start.other.keys().collect();
        tracing::info!(?fields, "E2B template build fields space does not know");
    }
    let builds = state.store.list_operations(&caller.tenant_id, OperationKind::BuildDockerfile, 100).await?;
    let active =
        builds.iter().filter(|b| matches!(b.operation.state, OperationState::Pending | OperationState::Running));
    if active.count() >= MAX_ACTIVE_BUILDS {
        return Err(E2bError::new(
            429,
            format!("{MAX_ACTIVE_BUILDS} template builds of yours are under way: wait for one to end"),
        ));
    }
    if template_steps::pulls_an_image(&start) && !caller.admin {
        return Err(E2bError::new(
            403,
            "a build from an image pulls through the node's network, which only the operator's builds may: \
             build from a template (from_template), or ask the operator to import the image",
        ));
    }
    let dockerfile = template_steps::dockerfile(&start, &state.default_template)?;
    space_dockerfile::parse(&dockerfile).map_err(|e| E2bError::bad_request(format!("the steps' Dockerfile {e}")))?;
    let mut hashes: Vec<&str> = start.steps.iter().filter_map(|step| step.files_hash.as_deref()).collect();
    hashes.sort_unstable();
    hashes.dedup();
    let uploads: Vec<PathBuf> =
        hashes.iter().map(|h| uploaded(&state, &caller.tenant_id, h)).collect::<E2bResult<_>>()?;
    let context = upload_dir(&state.data_dir).join(format!("{}.upload", hex::encode(rand::random::<[u8; 12]>())));
    let (made, limit) = (context.clone(), state.http.template_upload_max_bytes);
    tokio::task::spawn_blocking(move || super::template_context::build_context(&uploads, &made, limit))
        .await
        .map_err(|e| E2bError::new(500, format!("assembling the build context: {e}")))??;
    let build = TemplateBuild {
        dockerfile,
        context: Some(context.clone()),
        // E2B's builds reach the internet; here only where the operator lets E2B sandboxes.
        allow: if state.e2b_internet_by_default { vec![space_api::egress::ANY_HOST.into()] } else { Vec::new() },
        args: BTreeMap::new(),
        no_cache: start.force || start.steps.iter().any(|s| s.force),
        own_prefix: crate::template_scope::prefix(&caller),
        registry: caller.admin,
    };
    let input = TemplateInput { name, path: None, uploaded: Some(context.clone()), build: Some(build) };
    if let Err(e) = queue_as(&state, &caller, OperationKind::BuildDockerfile, input, Some(build_id)).await {
        remove(&context);
        return Err(e.into());
    }
    Ok(StatusCode::ACCEPTED)
}

fn parse_build_id(id: &str) -> E2bResult<OperationId> {
    id.parse().map_err(|_| E2bError::not_found(format!("no template build {}", space_api::error::clip(id))))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusQuery {
    #[serde(default)]
    logs_offset: u32,
    limit: Option<u32>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildStatus {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    status: &'static str,
    logs: Vec<String>,
    log_entries: Vec<LogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    timestamp: String,
    message: String,
    level: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reason {
    message: String,
    log_entries: Vec<LogEntry>,
}

/// `GET /templates/{id}/builds/{build}/status`: `waiting` until the steps are sent, then
/// `building`, `ready` or `error` (with the reason), and up to 100 log lines from `logsOffset`.
async fn status(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, build_id)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<StatusQuery>,
) -> E2bResult<Json<BuildStatus>> {
    own_name(&caller, &id)?;
    let op_id = parse_build_id(&build_id)?;
    let mut answer = BuildStatus {
        template_id: id,
        build_id,
        status: "waiting",
        logs: Vec::new(),
        log_entries: Vec::new(),
        reason: None,
    };
    let Some(op) = state.store.operation(&caller.tenant_id, &op_id).await? else { return Ok(Json(answer)) };
    if op.kind != OperationKind::BuildDockerfile.as_str() {
        return Err(E2bError::not_found(format!("no template build {}", answer.build_id)));
    }
    let limit = query.limit.unwrap_or(100).min(100);
    let lines = state.store.operation_log(&caller.tenant_id, &op.id, query.logs_offset.into(), limit.into()).await?;
    let at = super::rfc3339(op.updated_at);
    let entry = |message: String, level| LogEntry { timestamp: at.clone(), message, level };
    answer.logs = lines.unwrap_or_default().into_iter().map(|(_, line)| line).collect();
    answer.log_entries = answer.logs.iter().map(|line| entry(line.clone(), "info")).collect();
    answer.status = match op.state {
        OperationState::Pending | OperationState::Running => "building",
        OperationState::Succeeded => "ready",
        OperationState::Failed => "error",
    };
    if op.state == OperationState::Failed {
        let message = op.error.unwrap_or_else(|| "the build failed".into());
        answer.reason = Some(Reason { log_entries: vec![entry(message.clone(), "error")], message });
    }
    Ok(Json(answer))
}
