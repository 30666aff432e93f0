//! Templates uploaded over the API, so a remote CLI can make them: a root filesystem tarball,
//! a `docker save` archive or a tar of an OCI image layout, streamed into the control plane's
//! data dir (bounded in size, checked against the sha256 the client sends), then imported by
//! each node as a file on its host is (archives are read in place; a node on another host gets
//! a copy, see `template_work`), and removed once the import ends. An upload the client
//! abandons is removed with the request.

use std::path::{Path, PathBuf};

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use futures::TryStreamExt;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use space_api::{ErrorBody, ErrorCode, Operation, TemplateSource};
use space_store::OperationKind;
use tokio::io::AsyncWriteExt;
use utoipa::{IntoParams, ToSchema};

use crate::AppState;
use crate::api::templates::{own_name, queue};
use crate::auth::Caller;
use crate::error::{ApiJson, ApiQuery, AppError, AppResult, body_timeout, is_body_timeout};
use crate::template_work::TemplateInput;

const PARTIAL: &str = "partial";

/// What an upload holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum UploadFormat {
    /// A root filesystem tarball (plain, gzip, xz, zstd or bzip2).
    #[default]
    Rootfs,
    /// What `docker save` writes.
    DockerArchive,
    /// A tar of an OCI image layout directory (what `skopeo copy … oci-archive:` writes).
    OciArchive,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadParams {
    /// The template's name.
    pub name: String,
    #[serde(default)]
    #[param(inline)]
    pub format: UploadFormat,
    /// For `oci-archive`: the tag of the image in the layout (needed when it holds several).
    pub tag: Option<String>,
    /// The body's sha256 (64 hex digits): an upload that does not match is refused.
    pub sha256: String,
}

/// Where uploads wait for their import: `<data dir>/uploads`.
pub fn upload_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("uploads")
}

/// A file removed when this is dropped (a request that fails or is abandoned), unless kept.
pub(crate) struct Removal(Option<PathBuf>);

impl Removal {
    pub(crate) fn new(path: PathBuf) -> Self {
        Removal(Some(path))
    }

    pub(crate) fn keep(mut self) {
        self.0 = None;
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }
}

impl Drop for Removal {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            remove(&path);
        }
    }
}

/// Makes `dir` and the directories above it that are missing, root's alone: uploads are
/// tenants' files, and the data dir above them is traversable (0711).
pub(crate) async fn private_dir(dir: &Path) -> std::io::Result<()> {
    tokio::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).await
}

/// Removes uploads a crash cut short (`*.partial`); the others belong to queued imports.
pub fn remove_partial_uploads(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.path().extension().is_some_and(|e| e == PARTIAL) {
            remove(&entry.path());
        }
    }
}

/// Removes an upload (always a file: archives are imported in place).
pub fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "could not remove a template upload");
    }
}

/// Uploads a template and imports it; returns the import's operation (follow it with
/// `GET /v1/operations/{id}`). A tenant's upload is its own template; the admin's is global.
/// Each node on another host imports a copy the control plane sends it.
#[utoipa::path(post, path = "/v1/templates/uploads", params(UploadParams),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 202, body = Operation), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody)))]
pub async fn upload_template(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(params): ApiQuery<UploadParams>,
    body: Body,
) -> AppResult<(StatusCode, ApiJson<Operation>)> {
    let name = own_name(&caller, &params.name)?;
    let upload = receive_upload(&state, body, &params.sha256).await?;
    let file = upload.path().to_path_buf();
    let source = match params.format {
        UploadFormat::Rootfs => TemplateSource::Path { path: file.clone() },
        UploadFormat::DockerArchive => TemplateSource::DockerArchive { file: file.clone() },
        UploadFormat::OciArchive => TemplateSource::OciArchive { file: file.clone(), tag: params.tag },
    };
    let input = TemplateInput { name, path: Some(source.to_string()), uploaded: Some(file), build: None };
    let op = queue(&state, &caller, OperationKind::ImportTemplate, input).await?;
    // The import owns the upload now, and removes it when it ends.
    upload.keep();
    Ok((StatusCode::ACCEPTED, ApiJson(op)))
}

/// Streams an upload into `<data dir>/uploads` (bounded by `--template-upload-max-gib`,
/// checked against `sha256`); the file is removed when the guard drops, unless kept.
pub(crate) async fn receive_upload(state: &AppState, body: Body, sha256: &str) -> AppResult<Removal> {
    let expected = sha256.to_ascii_lowercase();
    if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(AppError::bad_request("sha256 must be the body's sha256 as 64 hex digits"));
    }
    let dir = upload_dir(&state.data_dir);
    private_dir(&dir).await.map_err(|e| AppError::internal(format!("creating {}: {e}", dir.display())))?;
    let id = hex::encode(rand::random::<[u8; 12]>());
    let partial_path = dir.join(format!("{id}.{PARTIAL}"));
    let partial = Removal(Some(partial_path.clone()));
    receive(body, &partial_path, state.http.template_upload_max_bytes, Some(&expected)).await?;
    let file = dir.join(format!("{id}.upload"));
    tokio::fs::rename(&partial_path, &file)
        .await
        .map_err(|e| AppError::internal(format!("keeping the upload: {e}")))?;
    partial.keep();
    Ok(Removal(Some(file)))
}

/// An upload past the server's limit. The connection closes with this answer while the client
/// may still be sending, so a client can see a reset instead: the CLI checks the size first
/// (`upload_max_bytes` in `GET /v1/templates`).
fn too_large(limit: u64) -> AppError {
    AppError::new(ErrorCode::PayloadTooLarge, space_api::upload_too_large(limit))
}

/// Streams `body` into `path`, at most `limit` bytes, and checks its sha256 when one is
/// expected.
pub(crate) async fn receive(body: Body, path: &Path, limit: u64, expected: Option<&str>) -> AppResult<()> {
    let internal = |e: std::io::Error| AppError::internal(format!("writing the upload {}: {e}", path.display()));
    // A fresh random name: never an existing file, never through a link; root's alone.
    let open = tokio::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).await;
    let mut file = open.map_err(internal)?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    loop {
        let chunk = match stream.try_next().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) if is_body_timeout(&e) => return Err(body_timeout()),
            Err(e) => {
                return Err(AppError::bad_request(format!("the upload's body could not be read ({e}); send it again")));
            }
        };
        size += chunk.len() as u64;
        if size > limit {
            return Err(too_large(limit));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(internal)?;
    }
    file.sync_all().await.map_err(internal)?;
    let actual = hex::encode(hasher.finalize());
    if let Some(expected) = expected
        && actual != expected
    {
        return Err(AppError::bad_request(format!(
            "the upload's sha256 is {actual}, not {expected}: it was cut short or altered on the way; send it again"
        )));
    }
    Ok(())
}
