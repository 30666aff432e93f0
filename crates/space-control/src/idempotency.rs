//! `Idempotency-Key` middleware for mutating calls: a retried call gets the first call's
//! response back; the same key on a different request is refused.

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use space_api::ErrorCode;
use space_store::IdempotencyBegin;

use crate::AppState;
use crate::auth::Caller;
use crate::error::AppError;

pub const HEADER: &str = "idempotency-key";
const MAX_KEY_LEN: usize = 255;
const MAX_REQUEST_BODY: usize = 1 << 20;
const MAX_RECORDED_RESPONSE: usize = 32 << 20;

pub async fn idempotency(State(state): State<AppState>, request: Request, next: Next) -> Result<Response, AppError> {
    let Some(key) = request.headers().get(HEADER).cloned() else {
        return Ok(next.run(request).await);
    };
    if !matches!(*request.method(), Method::POST | Method::DELETE) {
        return Ok(next.run(request).await);
    }
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_LEN)
        .ok_or_else(|| AppError::bad_request("Idempotency-Key must be 1 to 255 visible ASCII characters"))?
        .to_owned();
    let caller = request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| AppError::internal("idempotency middleware ran before authentication"))?;
    let (parts, body) = request.into_parts();
    let body = to_bytes(body, MAX_REQUEST_BODY)
        .await
        .map_err(|_| AppError::new(ErrorCode::PayloadTooLarge, "request body too large (limit 1 MiB)"))?;
    let fingerprint = fingerprint(&parts.method, parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or(""), &body);

    match state.store.idempotency_begin(&caller.tenant_id, &key, &fingerprint).await? {
        IdempotencyBegin::New => {}
        IdempotencyBegin::Replay { status, body } => return Ok(replay(status, body)),
        IdempotencyBegin::InProgress => {
            return Err(AppError::new(
                ErrorCode::IdempotencyConflict,
                "a request with this Idempotency-Key is still in progress; retry it later",
            ));
        }
        IdempotencyBegin::Mismatch => {
            return Err(AppError::new(
                ErrorCode::IdempotencyConflict,
                "this Idempotency-Key was already used for a different request; use a new key",
            ));
        }
    }

    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    let (parts, body) = response.into_parts();
    let Ok(bytes) = to_bytes(body, MAX_RECORDED_RESPONSE).await else {
        state.store.idempotency_abandon(&caller.tenant_id, &key).await?;
        return Err(AppError::internal("response too large to record for Idempotency-Key"));
    };
    if parts.status.is_server_error() {
        // Let the client retry a failure the server may not repeat.
        state.store.idempotency_abandon(&caller.tenant_id, &key).await?;
    } else {
        let text = String::from_utf8_lossy(&bytes);
        state.store.idempotency_finish(&caller.tenant_id, &key, parts.status.as_u16(), &text).await?;
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

fn fingerprint(method: &Method, path: &str, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(method.as_str());
    hash.update([0]);
    hash.update(path);
    hash.update([0]);
    hash.update(body);
    hex::encode(hash.finalize())
}

fn replay(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}
