//! envd's `/files`: downloads, and uploads as `multipart/form-data` (one `file` part per file,
//! named by its path) or as the raw bytes of one file.

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use futures::{Stream, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use space_proto::FileMetadata;

use super::envd::{Envd, EnvdState};
use super::errors::{E2bError, E2bResult};
use crate::AppState;
use crate::error::ApiQuery;

#[derive(Debug, Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    username: Option<String>,
}

/// What an upload answers for each file written.
#[derive(Debug, Serialize)]
pub struct Written {
    name: String,
    path: String,
    #[serde(rename = "type")]
    file_type: &'static str,
    #[serde(skip_serializing_if = "FileMetadata::is_empty")]
    metadata: FileMetadata,
}

/// The agent, and `path` made absolute: relative to the home of `username`.
async fn resolve(
    state: &AppState,
    envd_state: &EnvdState,
    envd: &Envd,
    username: Option<&str>,
    path: &str,
) -> E2bResult<(space_proto::client::AgentClient, String)> {
    if path.is_empty() || path.contains('\0') || path.len() > 4096 {
        return Err(E2bError::bad_request("path must be 1 to 4096 bytes without NUL"));
    }
    super::filesystem::resolve_as(state, envd_state, envd, username, path).await.map_err(rpc_to_rest)
}

/// envd's REST errors carry the HTTP status and `{"code", "message"}` as the control calls do.
fn rpc_to_rest(error: super::connect::RpcError) -> E2bError {
    use super::connect::Code;
    let status = match error.code {
        Code::InvalidArgument => 400,
        Code::Unauthenticated => 401,
        Code::PermissionDenied => 403,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::FailedPrecondition => 409,
        Code::ResourceExhausted => 507,
        Code::Unavailable => 502,
        Code::DeadlineExceeded => 504,
        Code::Unimplemented => 501,
        _ => 500,
    };
    E2bError::new(status, error.message)
}

fn agent_error(error: space_proto::client::AgentError) -> E2bError {
    rpc_to_rest(error.into())
}

pub async fn download(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    ApiQuery(query): ApiQuery<FileQuery>,
) -> E2bResult<Response> {
    let path = query.path.unwrap_or_default();
    let (agent, path) = resolve(&state, &envd_state, &envd, query.username.as_deref(), &path).await?;
    let (size, chunks) = agent.read_file(&path).await.map_err(agent_error)?;
    Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, size)
        .body(Body::from_stream(chunks.map_err(std::io::Error::other)))
        .map_err(|e| E2bError::new(500, e.to_string()))
}

/// The headers an upload's file metadata comes in (`X-Metadata-{key}`; lower-case, as HTTP
/// header names are read).
const METADATA_HEADER: &str = "x-metadata-";

/// Why an upload is refused from its headers alone, if it is; else the metadata its files
/// get (envd's rules: the first of repeated headers counts, keys are the lower-cased rest of
/// the name).
fn from_headers(headers: &HeaderMap) -> E2bResult<FileMetadata> {
    if headers.get(header::CONTENT_ENCODING).is_some_and(|v| v != "identity") {
        return Err(E2bError::bad_request("compressed uploads are not supported; send the file uncompressed"));
    }
    let mut metadata = FileMetadata::new();
    for name in headers.keys() {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER) else { continue };
        let value = headers
            .get(name)
            .map(|v| v.to_str())
            .transpose()
            .map_err(|_| E2bError::bad_request(format!("metadata {key:?}: values must be printable US-ASCII")))?;
        metadata.insert(key.to_owned(), value.unwrap_or_default().to_owned());
    }
    space_proto::file_metadata::check(&metadata).map_err(E2bError::bad_request)?;
    Ok(metadata)
}

pub async fn upload(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    ApiQuery(query): ApiQuery<FileQuery>,
    headers: HeaderMap,
    request: Request,
) -> E2bResult<axum::Json<Vec<Written>>> {
    let is_multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let metadata = match from_headers(&headers) {
        Ok(metadata) => metadata,
        Err(refused) => return Err(super::errors::drained(request.into_body(), refused).await),
    };
    let user = query.username.as_deref();
    if !is_multipart {
        let path = query.path.as_deref().ok_or_else(|| E2bError::bad_request("an upload needs ?path="))?;
        let (agent, path) = resolve(&state, &envd_state, &envd, user, path).await?;
        let body = request.into_body().into_data_stream().map_err(std::io::Error::other);
        return Ok(axum::Json(vec![write(&agent, path, &metadata, body).await?]));
    }
    let request = bounded_preamble(request)?;
    let mut parts = Multipart::from_request(request, &()).await.map_err(|e| E2bError::bad_request(e.body_text()))?;
    let mut written = Vec::new();
    while let Some(field) = parts.next_field().await.map_err(|e| E2bError::bad_request(e.body_text()))? {
        if field.name() != Some("file") {
            continue;
        }
        // The query's path names a lone file; otherwise each part's file name is its path.
        let path = match (&query.path, field.file_name()) {
            (Some(path), _) if written.is_empty() => path.clone(),
            (_, Some(name)) => name.to_owned(),
            _ => return Err(E2bError::bad_request("each file part needs its path as its file name")),
        };
        let (agent, path) = resolve(&state, &envd_state, &envd, user, &path).await?;
        written.push(write_part(&agent, path, &metadata, field).await?);
    }
    if written.is_empty() {
        return Err(E2bError::bad_request("the upload holds no part named \"file\""));
    }
    Ok(axum::Json(written))
}

async fn write(
    agent: &space_proto::client::AgentClient,
    path: String,
    metadata: &FileMetadata,
    data: impl Stream<Item = std::io::Result<bytes::Bytes>> + Send + Unpin + 'static,
) -> E2bResult<Written> {
    agent.write_file_with_metadata(&path, None, metadata.clone(), data).await.map_err(agent_error)?;
    let name = path.rsplit('/').next().unwrap_or_default().to_owned();
    Ok(Written { name, path, file_type: "file", metadata: metadata.clone() })
}

/// A part borrows the whole request's body, so it is handed to the agent through a channel
/// while it is read (never buffered whole).
async fn write_part(
    agent: &space_proto::client::AgentClient,
    path: String,
    metadata: &FileMetadata,
    mut field: axum::extract::multipart::Field<'_>,
) -> E2bResult<Written> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    let feed = async move {
        loop {
            let chunk = match field.chunk().await {
                Ok(Some(chunk)) => Ok(chunk),
                Ok(None) => break,
                Err(e) => Err(std::io::Error::other(e.body_text())),
            };
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
                break;
            }
        }
    };
    let data = tokio_stream_of(rx);
    let (written, ()) = tokio::join!(write(agent, path, metadata, data), feed);
    written
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl Stream<Item = T> + Send + Unpin + 'static {
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

/// How far into a multipart body its first boundary must come: the parser keeps in memory
/// what comes before it.
const MAX_PREAMBLE: usize = 64 << 10;

/// The request, its body failing if no boundary comes within [`MAX_PREAMBLE`] bytes.
fn bounded_preamble(request: Request) -> E2bResult<Request> {
    let boundary = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').find_map(|p| p.trim().strip_prefix("boundary=")))
        .map(|b| b.trim_matches('"').to_owned())
        .filter(|b| !b.is_empty())
        .ok_or_else(|| E2bError::bad_request("a multipart upload needs a boundary in its Content-Type"))?;
    let marker = format!("--{boundary}").into_bytes();
    let (parts, body) = request.into_parts();
    let mut seen = Some(Vec::new());
    let checked = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        if let Some(prefix) = seen.as_mut() {
            prefix.extend_from_slice(&chunk);
            if prefix.windows(marker.len()).any(|w| w == marker.as_slice()) {
                seen = None;
            } else if prefix.len() > MAX_PREAMBLE {
                return Err(std::io::Error::other("no multipart boundary in the upload's first 64 KiB"));
            }
        }
        Ok(chunk)
    });
    Ok(Request::from_parts(parts, Body::from_stream(checked)))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(request: Request) -> Result<Vec<u8>, String> {
        let body = request.into_body();
        axum::body::to_bytes(body, usize::MAX).await.map(|b| b.to_vec()).map_err(|e| e.to_string())
    }

    fn upload(body: Vec<u8>) -> Request {
        Request::post("/files")
            .header(header::CONTENT_TYPE, "multipart/form-data; boundary=XyZ")
            .body(Body::from(body))
            .unwrap()
    }

    #[tokio::test]
    async fn a_multipart_body_must_show_its_boundary_early() {
        let good = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nhi\r\n--XyZ--\r\n".to_vec();
        assert_eq!(read(bounded_preamble(upload(good.clone())).unwrap()).await.unwrap(), good);
        let endless = vec![b'x'; MAX_PREAMBLE + 1];
        assert!(read(bounded_preamble(upload(endless)).unwrap()).await.unwrap_err().contains("boundary"));
        let no_boundary =
            Request::post("/files").header(header::CONTENT_TYPE, "multipart/form-data").body(Body::empty());
        assert!(bounded_preamble(no_boundary.unwrap()).is_err());
    }

    /// envd's header rules: lower-cased keys, the first of repeated headers, printable values.
    #[test]
    fn metadata_comes_from_the_headers_as_envd_reads_them() {
        let mut headers = HeaderMap::new();
        headers.insert("X-Metadata-Owner", "agent 7".parse().unwrap());
        headers.append("x-metadata-n", "1".parse().unwrap());
        headers.append("x-metadata-n", "2".parse().unwrap());
        headers.insert("x-other", "ignored".parse().unwrap());
        let metadata = from_headers(&headers).unwrap();
        assert_eq!(metadata, FileMetadata::from([("n".into(), "1".into()), ("owner".into(), "agent 7".into())]));
        assert!(from_headers(&HeaderMap::new()).unwrap().is_empty());

        let refused = |name: &str, value: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                header::HeaderValue::from_bytes(value).unwrap(),
            );
            let error = from_headers(&headers).unwrap_err();
            assert_eq!(error.code, 400, "{name}: {value:?}");
            error.message
        };
        assert!(refused("x-metadata-k", "caf\u{e9}".as_bytes()).contains("printable"));
        assert!(refused("x-metadata-k", b"a\tb").contains("printable"));
        assert!(refused("x-metadata-k", &[b'v'; 4096]).contains("exceeds 4096"));
        assert!(refused("x-metadata-", b"v").contains("1 to 246"));
        assert!(refused("content-encoding", b"gzip").contains("uncompressed"));
    }
}
