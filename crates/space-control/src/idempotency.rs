//! `Idempotency-Key` middleware for mutating calls: a retried call gets the first call's
//! response back; the same key on a different request is refused.
//!
//! Nothing stored here may reveal a secret. Request bodies can hold one (a credential's
//! value), so the fingerprint that tells a retry from another request is keyed (HMAC) with
//! a server key kept sealed in the database: a plain hash would let whoever reads the
//! database test guesses of the value offline. Responses can hold one (a new API key): a
//! handler marks those with [`CarriesSecret`], and they are never recorded; a retry learns
//! that the first request succeeded, not what it answered.
//!
//! Every change (any method but GET, HEAD and OPTIONS), with a key or without, runs to its
//! end on a task of its own: a client that hangs up does not cancel it half-way. An exec
//! without a key is the exception ([`CANCELLABLE`]).

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use space_api::{ErrorCode, TenantId};
use space_keys::{DigestKey, KeyError, Sealer};
use space_store::{IdempotencyBegin, Store, StoreError};

use crate::auth::Caller;
use crate::error::{AppError, unreadable_body};
use crate::server::Detached;

pub const HEADER: &str = "idempotency-key";
/// How long a key is remembered (records older are deleted at start-up), as Stripe does.
pub const RETENTION_MS: i64 = 24 * 3600 * 1000;
const MAX_KEY_LEN: usize = 255;
const MAX_REQUEST_BODY: usize = crate::api::JSON_BODY_LIMIT;
/// The largest JSON response a handler gives, an exec's, still fits.
const MAX_RECORDED_RESPONSE: usize = crate::api::MAX_EXEC_RESPONSE;
/// The owner the fingerprint key is sealed for.
const KEY_OWNER: &str = "idempotency-fingerprint-key";

/// Request extension: the Idempotency-Key the request runs under. A handler that records it
/// with what it creates, in the same transaction, can be run again safely after a crash
/// interrupted it (see [`RESUMABLE`]).
#[derive(Debug, Clone)]
pub struct RunsUnderKey(pub String);

/// Routes whose handler records their key with what they create (`POST /v1/sessions`: the
/// session row), so a retry after a crash finds it instead of creating it twice.
const RESUMABLE: &[(Method, &str)] = &[(Method::POST, "/v1/sessions")];

/// Changes that end with their client when it sends no key: an exec the client waits for is
/// killed when it hangs up (the agent kills the process group of an exec whose stream is
/// dropped), as a terminal's command ends with the terminal; one without a time bound would
/// otherwise run for ever. An exec that should outlive its client asks for `background`. (With
/// a key, an exec runs to its end like any change: its record must be finished.)
const CANCELLABLE: &[(Method, &str)] = &[(Method::POST, "/v1/sessions/{id}/exec")];

/// Whether the request of `method` to `route` is one of `list`'s.
fn listed(list: &[(Method, &str)], method: &Method, route: Option<&MatchedPath>) -> bool {
    route.is_some_and(|r| list.iter().any(|(m, p)| m == method && *p == r.as_str()))
}

/// Response extension of a response that carries a secret: it is not recorded for replay.
#[derive(Debug, Clone, Copy)]
pub struct CarriesSecret;

#[derive(Debug, thiserror::Error)]
pub enum IdempotencyKeyError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The middleware's state: the store and the key of fingerprints.
#[derive(Clone)]
pub struct Idempotency {
    store: Store,
    key: Arc<DigestKey>,
}

impl Idempotency {
    /// Loads the fingerprint key from the store, creating it on first start. It is kept
    /// (sealed) in the database so fingerprints survive restarts and replicas share it.
    ///
    /// A key sealed under a key-encryption key that is gone (the key check at start lets
    /// that through only when nothing else sealed needed the old key) is replaced, and the
    /// records made with it are dropped: they could never match again.
    pub async fn load(store: Store, sealer: &Sealer) -> Result<Idempotency, IdempotencyKeyError> {
        let candidate = DigestKey::generate()?;
        let sealed = store.idempotency_key_sealed(&candidate.seal(sealer, KEY_OWNER).await?).await?;
        let key = match DigestKey::open(sealer, &sealed, KEY_OWNER).await {
            Ok(key) => key,
            Err(KeyError::WrongKey { .. }) => {
                if store.idempotency_replace_key(&sealed, &candidate.seal(sealer, KEY_OWNER).await?).await? {
                    tracing::warn!(
                        "the key of idempotency fingerprints was sealed with another key file; replaced it \
                         and dropped the idempotency records"
                    );
                    candidate
                } else {
                    // Another replica replaced it first.
                    let sealed = store.idempotency_key_sealed(&candidate.seal(sealer, KEY_OWNER).await?).await?;
                    DigestKey::open(sealer, &sealed, KEY_OWNER).await?
                }
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Idempotency { store, key: Arc::new(key) })
    }

    /// A keyed token for `subject` under `purpose` (an E2B sandbox's envd access token):
    /// every replica derives the same one; nobody without the database's key can. Two parts
    /// where fingerprints have three, so a token is never some request's fingerprint.
    pub(crate) fn token(&self, purpose: &str, subject: &str) -> String {
        hex::encode(self.key.digest(&[purpose.as_bytes(), subject.as_bytes()]))
    }

    /// Keyed fingerprint of a request.
    fn fingerprint(&self, method: &Method, path: &str, body: &[u8]) -> String {
        hex::encode(self.key.digest(&[method.as_str().as_bytes(), path.as_bytes(), body]))
    }
}

pub async fn idempotency(State(state): State<Idempotency>, request: Request, next: Next) -> Result<Response, AppError> {
    if !changes(request.method()) {
        return Ok(next.run(request).await);
    }
    let detached = request.extensions().get::<Detached>().cloned();
    let keyed = matches!(*request.method(), Method::POST | Method::DELETE);
    let Some(key) = request.headers().get(HEADER).filter(|_| keyed).cloned() else {
        if listed(CANCELLABLE, request.method(), request.extensions().get::<MatchedPath>()) {
            return Ok(next.run(request).await);
        }
        return to_completion(detached, next.run(request)).await;
    };
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
    let body = to_bytes(body, MAX_REQUEST_BODY).await.map_err(|e| unreadable_body(&e))?;
    let fingerprint =
        state.fingerprint(&parts.method, parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or(""), &body);

    match state.store.idempotency_begin(&caller.tenant_id, &key, &fingerprint).await? {
        IdempotencyBegin::New => {}
        IdempotencyBegin::Replay { status, body } => return Ok(replay(status, body)),
        IdempotencyBegin::Withheld { status } => {
            return Err(AppError::new(
                ErrorCode::IdempotencyConflict,
                format!(
                    "the request with this Idempotency-Key already succeeded ({status}), but its response held a \
                     secret (such as a new API key), which is shown once and never stored, so it cannot be \
                     replayed; if that response was lost, send the request again with a new Idempotency-Key"
                ),
            ));
        }
        IdempotencyBegin::Interrupted
            if listed(RESUMABLE, &parts.method, parts.extensions.get::<MatchedPath>())
                && state.store.idempotency_resume(&caller.tenant_id, &key).await? => {}
        IdempotencyBegin::Interrupted => {
            return Err(AppError::new(
                ErrorCode::IdempotencyConflict,
                "the request with this Idempotency-Key was interrupted by a server restart and may have taken \
                 effect; it is not run again under this key: look (for example GET /v1/sessions) before sending \
                 it again with a new Idempotency-Key",
            ));
        }
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

    // To completion: a request cancelled half-way would also leave its key in progress; the
    // task runs it to the end and records the response.
    let mut request = Request::from_parts(parts, Body::from(body));
    request.extensions_mut().insert(RunsUnderKey(key.clone()));
    let run = async move { run_and_record(&state, &caller.tenant_id, &key, next, request).await };
    to_completion(detached, run).await?
}

/// Whether a request of `method` may change something (and so runs to completion).
fn changes(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Middleware of routes without the idempotency layer (the E2B endpoint's): every change runs
/// to its end, as [`idempotency`] runs those it sees.
pub async fn changes_to_completion(request: Request, next: Next) -> Response {
    if !changes(request.method()) {
        return next.run(request).await;
    }
    let detached = request.extensions().get::<Detached>().cloned();
    to_completion(detached, next.run(request)).await.unwrap_or_else(IntoResponse::into_response)
}

/// Runs a change on a task of its own, to its end: a client that goes away must not cancel it
/// half-way (a sandbox left frozen, a snapshot row left `creating`, a CRIU dump cut short).
/// The server's [`Detached`] tracks it, so a graceful stop waits for it (a router called
/// without the server, as in tests, has none). In the request's span, so what it logs carries
/// the request id.
async fn to_completion<T: Send + 'static>(
    detached: Option<Detached>,
    run: impl Future<Output = T> + Send + 'static,
) -> Result<T, AppError> {
    let run = tracing::Instrument::in_current_span(run);
    let task = match detached {
        Some(detached) => detached.spawn(run),
        None => tokio::spawn(run),
    };
    task.await.map_err(|e| {
        // A panic's message is the server's, not the client's.
        tracing::error!(error = %e, "a request's task failed");
        AppError::internal("the request failed inside the server (it is logged); try again")
    })
}

/// Runs the request and records its response under `key` (see the module docs for what is
/// recorded).
async fn run_and_record(
    state: &Idempotency,
    tenant: &TenantId,
    key: &str,
    next: Next,
    request: Request,
) -> Result<Response, AppError> {
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    if parts.status.is_server_error() {
        // Let the client retry a failure the server may not repeat.
        state.store.idempotency_abandon(tenant, key).await?;
        return Ok(Response::from_parts(parts, body));
    }
    if parts.extensions.get::<CarriesSecret>().is_some() {
        state.store.idempotency_withhold(tenant, key, parts.status.as_u16()).await?;
        return Ok(Response::from_parts(parts, body));
    }
    let Ok(bytes) = to_bytes(body, MAX_RECORDED_RESPONSE).await else {
        state.store.idempotency_abandon(tenant, key).await?;
        return Err(AppError::internal("response too large to record for Idempotency-Key"));
    };
    let text = String::from_utf8_lossy(&bytes);
    state.store.idempotency_finish(tenant, key, parts.status.as_u16(), &text).await?;
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

fn replay(status: u16, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

/// On a router of stand-in handlers: no node needed.
#[cfg(test)]
mod tests {
    use std::path::Path;

    use axum::Router;
    use axum::body::Body;
    use axum::http::Request;
    use axum::middleware::{self, Next};
    use axum::routing::post;
    use sha2::{Digest, Sha256};
    use space_api::TenantId;
    use tower::ServiceExt;

    use super::*;

    const CREDENTIAL_VALUE: &str = "ghp_the-credential-value";
    const API_KEY: &str = "sk_the-new-api-key";

    /// Stands in for `POST /v1/credentials`: the request holds a secret, the response does not.
    async fn create_credential() -> (StatusCode, &'static str) {
        (StatusCode::CREATED, r#"{"name":"gh","version":1}"#)
    }

    /// Stands in for `POST /v1/keys`: the response holds a secret.
    async fn create_key() -> impl IntoResponse {
        (StatusCode::CREATED, axum::Extension(CarriesSecret), format!(r#"{{"key":"{API_KEY}"}}"#))
    }

    /// How many times [`create_session`] ran.
    static SESSIONS_CREATED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// Stands in for `POST /v1/sessions`: slow, and counts its effects.
    async fn create_session() -> (StatusCode, &'static str) {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        SESSIONS_CREATED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (StatusCode::CREATED, r#"{"id":"ses_1"}"#)
    }

    /// How many times [`fork_session`] ran.
    static FORKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// Stands in for `POST /v1/sessions/{id}/fork`, counting its effects.
    async fn fork_session() -> (StatusCode, &'static str) {
        FORKS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (StatusCode::CREATED, r#"{"sessions":[]}"#)
    }

    async fn router(state: Idempotency, tenant: TenantId) -> Router {
        let caller = Caller { tenant_id: tenant, tenant: "t".into(), admin: true, scope: None };
        Router::new()
            .route("/v1/credentials", post(create_credential))
            .route("/v1/keys", post(create_key))
            .route("/v1/sessions", post(create_session))
            .route("/v1/sessions/ses_1/fork", post(fork_session))
            .layer(middleware::from_fn_with_state(state, idempotency))
            .layer(middleware::from_fn(move |mut request: Request<Body>, next: Next| {
                request.extensions_mut().insert(caller.clone());
                next.run(request)
            }))
    }

    async fn call(router: &Router, path: &str, key: &str, body: &str) -> (StatusCode, bool, String) {
        let request = Request::post(path).header(HEADER, key).body(Body::from(body.to_owned())).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let status = response.status();
        let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, replayed, String::from_utf8(bytes.to_vec()).unwrap())
    }

    struct Server {
        dir: tempfile::TempDir,
        store: Store,
        sealer: Sealer,
        tenant: TenantId,
    }

    async fn server() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(&dir.path().join("space.db")).await.unwrap();
        let sealer = Sealer::local(&dir.path().join("keys/master.key")).unwrap();
        let tenant = store.ensure_tenant("t").await.unwrap();
        Server { dir, store, sealer, tenant }
    }

    /// Every byte of the database files (the WAL holds what is not checkpointed yet).
    fn database_bytes(dir: &Path) -> Vec<u8> {
        ["space.db", "space.db-wal"].iter().filter_map(|name| std::fs::read(dir.join(name)).ok()).flatten().collect()
    }

    fn contains(haystack: &[u8], needle: &str) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
    }

    #[tokio::test]
    async fn fingerprints_are_keyed_so_the_database_is_no_guessing_oracle() {
        let s = server().await;
        let app = router(Idempotency::load(s.store.clone(), &s.sealer).await.unwrap(), s.tenant.clone()).await;
        let body = format!(r#"{{"name":"gh","value":"{CREDENTIAL_VALUE}"}}"#);
        let first = call(&app, "/v1/credentials", "k1", &body).await;
        assert_eq!((first.0, first.1), (StatusCode::CREATED, false));
        let retry = call(&app, "/v1/credentials", "k1", &body).await;
        assert_eq!(retry, (StatusCode::CREATED, true, first.2), "the retry is replayed");
        let other = call(&app, "/v1/credentials", "k1", &body.replace("gh", "npm")).await;
        assert_eq!(other.0, StatusCode::CONFLICT);

        // A plain hash of the request would let anyone with the database confirm a guessed value.
        let mut plain = Sha256::new();
        for part in ["POST", "/v1/credentials"] {
            plain.update(part);
            plain.update([0]);
        }
        plain.update(&body);
        let stored = database_bytes(s.dir.path());
        assert!(!contains(&stored, &hex::encode(plain.finalize())), "the plain SHA-256 of the request is stored");
        assert!(!contains(&stored, CREDENTIAL_VALUE));
    }

    #[tokio::test]
    async fn responses_that_carry_a_secret_are_never_recorded_or_replayed() {
        let s = server().await;
        let app = router(Idempotency::load(s.store.clone(), &s.sealer).await.unwrap(), s.tenant.clone()).await;
        let (status, replayed, body) = call(&app, "/v1/keys", "k2", r#"{"tenant":"a"}"#).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, false));
        assert!(body.contains(API_KEY), "the first caller gets the secret");
        assert!(!contains(&database_bytes(s.dir.path()), API_KEY), "the secret is in the database");

        let (status, replayed, body) = call(&app, "/v1/keys", "k2", r#"{"tenant":"a"}"#).await;
        assert_eq!((status, replayed), (StatusCode::CONFLICT, false), "{body}");
        assert!(!body.contains(API_KEY));
        assert!(body.contains("idempotency_conflict") && body.contains("cannot be replayed"), "{body}");
        // The record survives a restart's cleanup: the request is not run twice.
        s.store.idempotency_interrupt_unfinished(true, space_store::now_ms()).await.unwrap();
        assert_eq!(call(&app, "/v1/keys", "k2", r#"{"tenant":"a"}"#).await.0, StatusCode::CONFLICT);
    }

    /// The body is read here before any handler: a stalled one is a 408 and a malformed one
    /// a 400, as in handlers, not a 413 "too large".
    #[tokio::test]
    async fn bodies_that_cannot_be_read_say_why() {
        let s = server().await;
        let app = router(Idempotency::load(s.store.clone(), &s.sealer).await.unwrap(), s.tenant.clone()).await;
        let stalled = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        let body =
            tower_http::timeout::TimeoutBody::new(std::time::Duration::from_millis(50), Body::from_stream(stalled));
        let broken = futures::stream::iter([Err::<bytes::Bytes, _>(std::io::Error::other("invalid chunk size"))]);
        for (body, status, code) in [
            (Body::new(body), StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            (Body::from_stream(broken), StatusCode::BAD_REQUEST, "bad_request"),
            (Body::from(vec![b'x'; MAX_REQUEST_BODY + 1]), StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
        ] {
            let request = Request::post("/v1/credentials").header(HEADER, "k").body(body).unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), status);
            let text = to_bytes(response.into_body(), usize::MAX).await.unwrap();
            assert!(String::from_utf8_lossy(&text).contains(code), "{text:?}");
        }
    }

    #[tokio::test]
    async fn a_client_that_goes_away_neither_cancels_the_request_nor_leaves_its_key_in_progress() {
        let s = server().await;
        let app = router(Idempotency::load(s.store.clone(), &s.sealer).await.unwrap(), s.tenant.clone()).await;
        let before = SESSIONS_CREATED.load(std::sync::atomic::Ordering::SeqCst);
        let gone = tokio::time::timeout(std::time::Duration::from_millis(50), call(&app, "/v1/sessions", "d", "{}"));
        assert!(gone.await.is_err(), "the client gave up before the response");
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        assert_eq!(
            SESSIONS_CREATED.load(std::sync::atomic::Ordering::SeqCst),
            before + 1,
            "the request ran to the end"
        );
        let (status, replayed, body) = call(&app, "/v1/sessions", "d", "{}").await;
        assert_eq!((status, replayed, body.as_str()), (StatusCode::CREATED, true, r#"{"id":"ses_1"}"#));
    }

    #[tokio::test]
    async fn a_request_a_restart_interrupted_is_not_run_again_under_its_key() {
        let s = server().await;
        let app = router(Idempotency::load(s.store.clone(), &s.sealer).await.unwrap(), s.tenant.clone()).await;
        // The server died while the first request ran (its session may exist).
        let path = "/v1/sessions/ses_1/fork";
        let fingerprint = app_fingerprint(&s, path, "{}").await;
        assert_eq!(s.store.idempotency_begin(&s.tenant, "c", &fingerprint).await.unwrap(), IdempotencyBegin::New);
        s.store.idempotency_interrupt_unfinished(true, space_store::now_ms()).await.unwrap();
        let (status, _, body) = call(&app, path, "c", "{}").await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(body.contains("interrupted by a server restart"), "{body}");
        assert_eq!(FORKS.load(std::sync::atomic::Ordering::SeqCst), 0, "run again under the same key");
    }

    /// The fingerprint the middleware computes for a POST of `body` to `path`.
    async fn app_fingerprint(s: &Server, path: &str, body: &str) -> String {
        let state = Idempotency::load(s.store.clone(), &s.sealer).await.unwrap();
        state.fingerprint(&Method::POST, path, body.as_bytes())
    }

    #[tokio::test]
    async fn the_fingerprint_key_survives_a_restart() {
        let s = server().await;
        let body = r#"{"name":"gh"}"#;
        let app = router(Idempotency::load(s.store.clone(), &s.sealer).await.unwrap(), s.tenant.clone()).await;
        assert!(!call(&app, "/v1/credentials", "k", body).await.1);
        s.store.close().await;

        let store = Store::open_sqlite(&s.dir.path().join("space.db")).await.unwrap();
        let sealer = Sealer::local(&s.dir.path().join("keys/master.key")).unwrap();
        let app = router(Idempotency::load(store, &sealer).await.unwrap(), s.tenant.clone()).await;
        assert_eq!(call(&app, "/v1/credentials", "k", body).await.0, StatusCode::CREATED);
        assert!(call(&app, "/v1/credentials", "k", body).await.1, "replayed after the restart");
    }

    #[tokio::test]
    async fn a_fingerprint_key_sealed_by_a_lost_key_is_replaced_with_its_records() {
        let s = server().await;
        let body = r#"{"name":"gh"}"#;
        let app = router(Idempotency::load(s.store.clone(), &s.sealer).await.unwrap(), s.tenant.clone()).await;
        call(&app, "/v1/credentials", "k", body).await;

        let other = Sealer::local(&s.dir.path().join("keys/other.key")).unwrap();
        let app = router(Idempotency::load(s.store.clone(), &other).await.unwrap(), s.tenant.clone()).await;
        let (status, replayed, _) = call(&app, "/v1/credentials", "k", body).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, false), "a new record, not a false mismatch");
        assert!(call(&app, "/v1/credentials", "k", body).await.1);
    }

    /// A graceful stop waits for a change whose client has gone, instead of ending it with
    /// the process.
    #[tokio::test]
    async fn a_graceful_stop_waits_for_a_change_whose_client_has_gone() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::AsyncWriteExt;
        let (started, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
        let done = Arc::new(AtomicBool::new(false));
        let change = {
            let (started, release, done) = (started.clone(), release.clone(), done.clone());
            move || async move {
                started.notify_one();
                release.notified().await;
                done.store(true, Ordering::SeqCst);
                StatusCode::NO_CONTENT
            }
        };
        let app = Router::new().route("/change", post(change)).layer(middleware::from_fn(changes_to_completion));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let limits = crate::server::testing::patient();
        let server =
            tokio::spawn(crate::server::serve_router(app, listener, limits, async move { drop(stopped.await) }));

        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client.write_all(b"POST /change HTTP/1.1\r\nHost: x\r\ncontent-length: 0\r\n\r\n").await.unwrap();
        started.notified().await;
        drop(client);
        stop.send(()).unwrap();
        // No connection is left and nothing is accepted: only the change holds the server.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!server.is_finished(), "the server stopped before the change it ran had finished");
        release.notify_one();
        tokio::time::timeout(std::time::Duration::from_secs(10), server).await.unwrap().unwrap().unwrap();
        assert!(done.load(Ordering::SeqCst), "the change was cut short");
    }
}
