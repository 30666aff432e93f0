//! Dockerfile builds over the API. The body is a tar of the build context, as Docker's
//! `/build` takes it, streamed to the data dir like a template upload; the Dockerfile is an
//! entry of it. The Dockerfile is parsed before anything is queued, so a bad one is a 400
//! naming its line, and the build itself runs as an operation on every node, its log kept
//! in the store (`GET /v1/operations/{id}/logs`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use space_api::egress::NetworkPolicy;
use space_api::{ErrorBody, Operation, TemplateBuild, TemplateBuildList, TemplateBuildView};
use space_store::OperationKind;
use utoipa::IntoParams;

use crate::AppState;
use crate::api::template_uploads::receive_upload;
use crate::api::templates::{own_name, queue};
use crate::auth::Caller;
use crate::error::{ApiJson, ApiQuery, AppError, AppResult};
use crate::template_work::TemplateInput;

/// Largest Dockerfile read from a context.
const MAX_DOCKERFILE: u64 = 1 << 20;
/// Builds `GET /v1/templates/builds` lists.
const LISTED: i64 = 100;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BuildParams {
    /// The template's name.
    pub name: String,
    /// The Dockerfile's path in the context (default `Dockerfile`).
    pub dockerfile: Option<String>,
    /// Host patterns `RUN` steps may reach through the gateway, comma-separated (as a
    /// session's `allow`); none: no network.
    pub allow: Option<String>,
    /// Values of the Dockerfile's `ARG`s, as a JSON object of strings.
    pub build_args: Option<String>,
    /// Run every step again instead of reusing cached layers.
    #[serde(default)]
    pub no_cache: bool,
    /// The body's sha256 (64 hex digits).
    pub sha256: String,
}

/// Builds a template from a Dockerfile; returns the build's operation (follow it with
/// `GET /v1/operations/{id}` and its log with `GET /v1/operations/{id}/logs`).
#[utoipa::path(post, path = "/v1/templates/builds", params(BuildParams),
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 202, body = Operation), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody)))]
pub async fn build_dockerfile(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(params): ApiQuery<BuildParams>,
    body: Body,
) -> AppResult<(StatusCode, ApiJson<Operation>)> {
    let name = own_name(&caller, &params.name)?;
    let allow = allow_list(params.allow.as_deref())?;
    let args: BTreeMap<String, String> = match &params.build_args {
        Some(json) => serde_json::from_str(json)
            .map_err(|e| AppError::bad_request(format!("build_args must be a JSON object of strings: {e}")))?,
        None => BTreeMap::new(),
    };
    let upload = receive_upload(&state, body, &params.sha256).await?;
    let context = upload.path().to_path_buf();
    let entry = params.dockerfile.unwrap_or_else(|| "Dockerfile".into());
    let (tar, wanted) = (context.clone(), entry.clone());
    let dockerfile = tokio::task::spawn_blocking(move || read_entry(&tar, &wanted))
        .await
        .map_err(|e| AppError::internal(format!("reading the context: {e}")))??
        .ok_or_else(|| AppError::bad_request(format!("the build context has no {entry}: name it with dockerfile=")))?;
    if dockerfile.contains('\0') {
        return Err(AppError::bad_request("the Dockerfile contains a NUL byte"));
    }
    space_dockerfile::parse(&dockerfile).map_err(|e| AppError::bad_request(format!("Dockerfile {e}")))?;
    let build = TemplateBuild {
        dockerfile,
        context: Some(context.clone()),
        allow,
        args,
        no_cache: params.no_cache,
        own_prefix: crate::template_scope::prefix(&caller),
        // A pull reaches whatever the node's network does: the operator's to allow.
        registry: caller.admin,
    };
    let input = TemplateInput { name, path: None, uploaded: Some(context), build: Some(build) };
    let op = queue(&state, &caller, OperationKind::BuildDockerfile, input).await?;
    // The build owns the context now, and removes it when it ends.
    upload.keep();
    Ok((StatusCode::ACCEPTED, ApiJson(op)))
}

/// The caller's Dockerfile builds, newest first, with their state.
#[utoipa::path(get, path = "/v1/templates/builds",
    responses((status = 200, body = TemplateBuildList), (status = 403, body = ErrorBody)))]
pub async fn list_builds(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> AppResult<ApiJson<TemplateBuildList>> {
    let records = state.store.list_operations(&caller.tenant_id, OperationKind::BuildDockerfile, LISTED).await?;
    let builds = records
        .into_iter()
        .map(|record| {
            let input: Option<TemplateInput> = record.input.as_deref().and_then(|i| serde_json::from_str(i).ok());
            let op = record.operation;
            TemplateBuildView {
                id: op.id,
                name: input
                    .and_then(|i| crate::template_scope::visible(&caller.tenant_id, &i.name))
                    .map(|(name, _)| name)
                    .unwrap_or_default(),
                state: op.state,
                error: op.error,
                progress: op.progress,
                created_at: op.created_at,
                updated_at: op.updated_at,
            }
        })
        .collect();
    Ok(ApiJson(TemplateBuildList { builds }))
}

fn allow_list(text: Option<&str>) -> AppResult<Vec<String>> {
    let allow: Vec<String> =
        text.unwrap_or_default().split(',').map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect();
    let policy = NetworkPolicy { allow: allow.clone(), ..NetworkPolicy::default() };
    policy.validate().map_err(|e| AppError::bad_request(format!("allow: {e}")))?;
    Ok(allow)
}

/// The text of entry `wanted` of the tar `file` (`./` prefixes ignored), at most 1 MiB.
fn read_entry(file: &Path, wanted: &str) -> AppResult<Option<String>> {
    let bad = |e: std::io::Error| AppError::bad_request(format!("the build context is not a readable tar: {e}"));
    let wanted = clean(Path::new(wanted));
    let file = std::fs::File::open(file).map_err(bad)?;
    // The guard bounds what the tar parser reads into memory (long names, pax headers).
    let mut archive = tar::Archive::new(space_image::TarGuard::new(file, u64::MAX));
    for entry in archive.entries().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        if clean(&entry.path().map_err(bad)?) != wanted || !entry.header().entry_type().is_file() {
            continue;
        }
        let mut text = String::new();
        entry.take(MAX_DOCKERFILE + 1).read_to_string(&mut text).map_err(bad)?;
        if text.len() as u64 > MAX_DOCKERFILE {
            return Err(AppError::bad_request("the Dockerfile is larger than 1 MiB"));
        }
        return Ok(Some(text));
    }
    Ok(None)
}

fn clean(path: &Path) -> PathBuf {
    path.components().filter(|c| matches!(c, std::path::Component::Normal(_))).collect()
}
