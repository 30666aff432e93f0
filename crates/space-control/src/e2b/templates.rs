//! E2B's template builds (`Template.build` of its SDKs), as space's Dockerfile builds: a
//! build is requested (`POST /v3/templates`: its template and a build id), the files of its
//! `COPY` steps are uploaded by hash, then the steps are sent
//! (`POST /v2/templates/{id}/builds/{build}`) and become a Dockerfile and a build context
//! ([`super::template_steps`]) queued as the native `POST /v1/templates/builds` queues them.
//! The build's progress and log are its operation's (`…/builds/{build}/status`). The template
//! is the caller's own (a tenant's name, the admin's global), as with the native API.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use space_api::{OperationState, TemplateBuild};
use space_store::OperationKind;
use tokio::io::AsyncWriteExt;

use super::errors::{E2bError, E2bResult};
use super::sandboxes::E2bJson;
use super::template_steps::{self, BuildStart};
use crate::AppState;
use crate::api::template_uploads::upload_dir;
use crate::api::templates::{own_name, queue};
use crate::auth::Caller;
use crate::error::{ApiPath, ApiQuery};
use crate::reconciler::TemplateInput;

/// Builds the status call looks through for a build id (newest first).
const LOOKED_UP: i64 = 100;
/// Uploaded files a tenant may have waiting for their builds.
const MAX_WAITING_UPLOADS: usize = 256;
/// Most entries of a build's uploaded files, all tars together.
const MAX_ENTRIES: usize = 100_000;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates/{id}/files/{hash}", get(upload_link).put(receive_files).layer(DefaultBodyLimit::disable()))
        .route("/v2/templates/{id}/builds/{build}", post(start_build))
        .route("/templates/{id}/builds/{build}/status", get(status))
        .route("/templates", get(super::template_list::list))
        .route("/v2/templates", get(super::template_list::list))
        .route("/templates/aliases/{alias}", get(super::template_list::alias))
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
    let build_id = hex::encode(rand::random::<[u8; 16]>());
    let names = vec![name.to_owned()];
    let answer = BuildRequested {
        template_id: name.to_owned(),
        build_id,
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
    headers: BTreeMap<String, String>,
}

/// `GET /templates/{id}/files/{hash}`: where the SDK puts the tar of a `COPY` step's files.
/// The link is this endpoint, and the SDK sends it the caller's own credentials back.
async fn upload_link(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, hash)): ApiPath<(String, String)>,
    headers: HeaderMap,
) -> E2bResult<(StatusCode, Json<UploadLink>)> {
    own_name(&caller, &id)?;
    let path = uploaded(&state, &caller, &hash)?;
    let present = tokio::fs::try_exists(&path).await.unwrap_or(false);
    let host = headers.get("host").and_then(|v| v.to_str().ok()).unwrap_or("localhost");
    let scheme = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).unwrap_or("http");
    let url = format!("{scheme}://{host}/templates/{id}/files/{hash}");
    let credentials = ["x-api-key", "authorization"]
        .into_iter()
        .filter_map(|name| Some((name.to_owned(), headers.get(name)?.to_str().ok()?.to_owned())))
        .collect();
    Ok((StatusCode::CREATED, Json(UploadLink { present, url, headers: credentials })))
}

/// Where the files of hash `hash` that `caller` uploaded are kept until a build reads them.
fn uploaded(state: &AppState, caller: &Caller, hash: &str) -> E2bResult<PathBuf> {
    template_steps::check_hash(hash).map_err(E2bError::bad_request)?;
    Ok(files_dir(&state.data_dir).join(hex::encode(caller.tenant_id.as_str())).join(hash))
}

/// `<data dir>/uploads/e2b-files`: uploads not yet read by a build (emptied at every start).
pub fn files_dir(data_dir: &Path) -> PathBuf {
    upload_dir(data_dir).join("e2b-files")
}

/// `PUT /templates/{id}/files/{hash}`: a (gzipped) tar of a step's files, at most the
/// server's template upload limit.
async fn receive_files(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, hash)): ApiPath<(String, String)>,
    body: Body,
) -> E2bResult<StatusCode> {
    own_name(&caller, &id)?;
    let path = uploaded(&state, &caller, &hash)?;
    let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
    let failed = |e: std::io::Error| E2bError::new(500, format!("keeping the upload: {e}"));
    tokio::fs::create_dir_all(&dir).await.map_err(failed)?;
    if waiting(&dir).await? >= MAX_WAITING_UPLOADS {
        return Err(E2bError::new(
            429,
            format!("{MAX_WAITING_UPLOADS} uploaded files wait for their builds already: start those builds first"),
        ));
    }
    let partial = dir.join(format!("{hash}.{}.partial", hex::encode(rand::random::<[u8; 8]>())));
    let written = write_limited(body, &partial, state.http.template_upload_max_bytes).await;
    match written {
        Ok(()) => tokio::fs::rename(&partial, &path).await.map_err(failed)?,
        Err(e) => {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(e);
        }
    }
    Ok(StatusCode::CREATED)
}

/// How many uploads wait in `dir`.
async fn waiting(dir: &Path) -> E2bResult<usize> {
    let mut entries =
        tokio::fs::read_dir(dir).await.map_err(|e| E2bError::new(500, format!("reading uploads: {e}")))?;
    let mut n = 0;
    while entries.next_entry().await.map_err(|e| E2bError::new(500, format!("reading uploads: {e}")))?.is_some() {
        n += 1;
    }
    Ok(n)
}

async fn write_limited(body: Body, path: &Path, limit: u64) -> E2bResult<()> {
    let failed = |e: std::io::Error| E2bError::new(500, format!("writing the upload: {e}"));
    let mut file = tokio::fs::File::create(path).await.map_err(failed)?;
    let mut stream = body.into_data_stream();
    let mut size = 0u64;
    while let Some(chunk) =
        stream.try_next().await.map_err(|e| E2bError::bad_request(format!("the upload could not be read: {e}")))?
    {
        size += chunk.len() as u64;
        if size > limit {
            return Err(E2bError::new(413, space_api::upload_too_large(limit)));
        }
        file.write_all(&chunk).await.map_err(failed)?;
    }
    file.sync_all().await.map_err(failed)
}

/// `POST /v2/templates/{id}/builds/{build}`: the steps, queued as a Dockerfile build.
async fn start_build(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, build_id)): ApiPath<(String, String)>,
    E2bJson(start): E2bJson<BuildStart>,
) -> E2bResult<StatusCode> {
    let name = own_name(&caller, &id)?;
    check_build_id(&build_id)?;
    if find_build(&state, &caller, &build_id).await?.is_some() {
        return Err(E2bError::new(409, format!("build {build_id} was started already: request a new build")));
    }
    if !start.other.is_empty() {
        let fields: Vec<&String> = start.other.keys().collect();
        tracing::info!(?fields, "E2B template build fields space does not know");
    }
    let dockerfile = template_steps::dockerfile(&start, &state.default_template)?;
    space_dockerfile::parse(&dockerfile).map_err(|e| E2bError::bad_request(format!("the steps' Dockerfile {e}")))?;
    let limit = state.http.template_upload_max_bytes;
    let hashes: Vec<PathBuf> = start
        .steps
        .iter()
        .filter_map(|step| step.files_hash.as_deref())
        .map(|hash| uploaded(&state, &caller, hash))
        .collect::<E2bResult<_>>()?;
    let context = upload_dir(&state.data_dir).join(format!("{}.upload", hex::encode(rand::random::<[u8; 12]>())));
    let made = context.clone();
    tokio::task::spawn_blocking(move || build_context(&hashes, &made, limit))
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
    let input = TemplateInput {
        name,
        path: None,
        uploaded: Some(context.clone()),
        build: Some(build),
        e2b_build: Some(build_id),
    };
    if let Err(e) = queue(&state, &caller, OperationKind::BuildDockerfile, input).await {
        crate::api::template_uploads::remove(&context);
        return Err(e.into());
    }
    Ok(StatusCode::ACCEPTED)
}

fn check_build_id(id: &str) -> E2bResult<()> {
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(E2bError::not_found(format!("no template build {}", space_api::error::clip(id))));
    }
    Ok(())
}

/// The tar a build reads: each uploaded tar's entries under `e2b-files/HASH/`, at most
/// `limit` bytes of files in all (as an uploaded context). The uploads are removed once read;
/// a missing one was not uploaded (or the server started again since).
fn build_context(uploads: &[PathBuf], context: &Path, limit: u64) -> E2bResult<()> {
    let failed = |e: std::io::Error| E2bError::new(500, format!("assembling the build context: {e}"));
    let mut out = tar::Builder::new(std::fs::File::create(context).map_err(failed)?);
    out.follow_symlinks(false);
    let mut budget = Budget { bytes: limit, entries: MAX_ENTRIES };
    let assembled = (|| {
        for upload in uploads {
            let hash = upload.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let file = std::fs::File::open(upload).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => E2bError::bad_request(format!(
                    "the files of hash {hash} were not uploaded (or the server restarted since): build again"
                )),
                _ => failed(e),
            })?;
            append_under(&mut out, file, &template_steps::context_dir(hash), &mut budget)?;
        }
        out.finish().map_err(failed)
    })();
    if assembled.is_err() {
        let _ = std::fs::remove_file(context);
    } else {
        for upload in uploads {
            let _ = std::fs::remove_file(upload);
        }
    }
    assembled
}

/// What a build's uploaded files may still hold: a gzipped tar is small on the wire only.
struct Budget {
    bytes: u64,
    entries: usize,
}

/// Appends every entry of the (gzipped or plain) tar `file` to `out` under `prefix`,
/// refusing absolute names and `..` (the builder checks the rest when it extracts).
fn append_under(
    out: &mut tar::Builder<std::fs::File>,
    file: std::fs::File,
    prefix: &str,
    budget: &mut Budget,
) -> E2bResult<()> {
    let bad = |why: String| E2bError::bad_request(format!("an uploaded file tar: {why}"));
    let mut reader = std::io::BufReader::new(file);
    let gzipped = std::io::BufRead::fill_buf(&mut reader).map(|b| b.starts_with(&[0x1f, 0x8b])).unwrap_or(false);
    let input: Box<dyn Read> = if gzipped { Box::new(flate2::read::GzDecoder::new(reader)) } else { Box::new(reader) };
    let mut archive = tar::Archive::new(input);
    for entry in archive.entries().map_err(|e| bad(e.to_string()))? {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        budget.entries =
            budget.entries.checked_sub(1).ok_or_else(|| bad(format!("more than {MAX_ENTRIES} entries")))?;
        budget.bytes = budget.bytes.checked_sub(entry.size()).ok_or_else(|| {
            E2bError::new(413, "the files of the build's COPY steps are larger than the server's template upload limit")
        })?;
        let path = entry.path().map_err(|e| bad(e.to_string()))?.into_owned();
        if path.is_absolute() || path.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return Err(bad(format!("{} leaves the build context", path.display())));
        }
        let mut header = entry.header().clone();
        let name = Path::new(prefix).join(&path);
        let link = entry.link_name().map_err(|e| bad(e.to_string()))?.map(|l| l.into_owned());
        match link {
            Some(target) if header.entry_type().is_hard_link() => {
                out.append_link(&mut header, &name, Path::new(prefix).join(target))
            }
            Some(target) => out.append_link(&mut header, &name, target),
            None => out.append_data(&mut header, &name, &mut entry),
        }
        .map_err(|e| bad(e.to_string()))?;
    }
    Ok(())
}

/// The build with E2B id `build_id` among `caller`'s newest builds: its operation.
async fn find_build(state: &AppState, caller: &Caller, build_id: &str) -> E2bResult<Option<space_api::Operation>> {
    let records = state.store.list_operations(&caller.tenant_id, OperationKind::BuildDockerfile, LOOKED_UP).await?;
    Ok(records.into_iter().find_map(|record| {
        let input: TemplateInput = serde_json::from_str(record.input.as_deref()?).ok()?;
        (input.e2b_build.as_deref() == Some(build_id)).then_some(record.operation)
    }))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusQuery {
    #[serde(default)]
    logs_offset: usize,
    limit: Option<usize>,
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
/// `building`, `ready` or `error` (with the reason), and the log lines from `logsOffset`.
async fn status(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, build_id)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<StatusQuery>,
) -> E2bResult<Json<BuildStatus>> {
    own_name(&caller, &id)?;
    check_build_id(&build_id)?;
    let mut answer = BuildStatus {
        template_id: id,
        build_id: build_id.clone(),
        status: "waiting",
        logs: Vec::new(),
        log_entries: Vec::new(),
        reason: None,
    };
    let Some(op) = find_build(&state, &caller, &build_id).await? else { return Ok(Json(answer)) };
    let lines = state.store.operation_log(&caller.tenant_id, &op.id, 0, i64::MAX).await?.unwrap_or_default();
    let limit = query.limit.unwrap_or(100).min(100);
    let at = super::rfc3339(op.updated_at);
    let entry = |message: String, level| LogEntry { timestamp: at.clone(), message, level };
    answer.logs = lines.into_iter().skip(query.logs_offset).take(limit).map(|(_, line)| line).collect();
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A tar holding `name` (written raw: the tar crate refuses to write `..` itself) with `data`.
    fn tar_of(name: &str, data: &[u8]) -> Vec<u8> {
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        let mut out = tar::Builder::new(Vec::new());
        out.append(&header, data).unwrap();
        out.into_inner().unwrap()
    }

    fn gzipped(bytes: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    }

    fn assemble(dir: &Path, uploads: &[(&str, Vec<u8>)], limit: u64) -> E2bResult<Vec<String>> {
        let paths: Vec<PathBuf> = uploads
            .iter()
            .map(|(hash, bytes)| {
                std::fs::write(dir.join(hash), bytes).unwrap();
                dir.join(hash)
            })
            .collect();
        let context = dir.join("context.tar");
        build_context(&paths, &context, limit)?;
        let mut archive = tar::Archive::new(std::fs::File::open(&context).unwrap());
        let names = archive.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
        Ok(names)
    }

    #[test]
    fn uploads_land_under_their_hash_and_escapes_and_bombs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let names =
            assemble(dir.path(), &[("aa", gzipped(&tar_of("app/a.txt", b"hi"))), ("bb", tar_of("b", b"x"))], 1 << 20);
        assert_eq!(names.unwrap(), ["e2b-files/aa/app/a.txt", "e2b-files/bb/b"]);
        assert!(!dir.path().join("aa").exists(), "an upload is removed once read");

        let escape = assemble(dir.path(), &[("cc", tar_of("../up", b"x"))], 1 << 20).unwrap_err();
        assert!(escape.message.contains("leaves the build context"), "{}", escape.message);
        assert!(!dir.path().join("context.tar").exists(), "nothing is left of a refused context");
        let bomb = assemble(dir.path(), &[("dd", gzipped(&tar_of("big", &vec![0; 4096])))], 1024).unwrap_err();
        assert_eq!(bomb.code, 413);
        let missing = build_context(&[dir.path().join("ee")], &dir.path().join("c.tar"), 1024).unwrap_err();
        assert!(missing.message.contains("were not uploaded"), "{}", missing.message);
    }
}
