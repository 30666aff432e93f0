//! envd's calls: who may make them (the sandbox's access token), which sandbox they are for,
//! and as which user inside it they run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{FromRequestParts, Request, State};
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use space_api::{Session, SessionId};
use space_proto::client::AgentClient;

use super::connect::{Code, RpcError};
use super::{access_token, sandbox_caller, sandbox_of_request};
use crate::AppState;
use crate::api::{find_session, woken_sandbox};
use crate::auth::Caller;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/health", get(|| async { axum::http::StatusCode::NO_CONTENT }))
        .route("/envs", get(envs))
        .route(
            "/files",
            get(super::files::download).post(super::files::upload).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .merge(super::process::routes())
        .merge(super::filesystem::routes())
        .fallback(|| async { RpcError::new(Code::NotFound, "no such envd call") })
        .layer(Extension(Arc::new(EnvdState::default())))
}

/// The sandbox an envd call is for and the caller it acts as; put there by
/// [`require_access_token`].
#[derive(Clone)]
pub struct Envd {
    pub caller: Caller,
    pub id: SessionId,
}

impl<S: Send + Sync> FromRequestParts<S> for Envd {
    type Rejection = RpcError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, RpcError> {
        parts
            .extensions
            .get::<Envd>()
            .cloned()
            .ok_or_else(|| RpcError::new(Code::Internal, "envd route without its token check"))
    }
}

impl Envd {
    /// The session's running sandbox's agent (a paused `auto_resume` session is resumed).
    pub async fn agent(&self, state: &AppState) -> Result<(Session, AgentClient), RpcError> {
        let session = find_session(state, &self.caller, self.id.as_str()).await?;
        let (session, sandbox) = woken_sandbox(state, Some(&self.caller), session).await?;
        let agent = state.nodes.of(&session)?.agent(&sandbox).await?;
        Ok((session, agent))
    }
}

/// Middleware of envd's calls: the sandbox must exist and the request carry its access token
/// (`X-Access-Token`), or else an API key of its tenant (`X-API-Key`, `Authorization:
/// Bearer`). Unknown sandboxes and other tenants' are not found; a wrong token is refused.
pub async fn require_access_token(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    match authorize(&state, request.headers()).await {
        Ok(envd) => {
            request.extensions_mut().insert(envd);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

async fn authorize(state: &AppState, headers: &HeaderMap) -> Result<Envd, RpcError> {
    let raw = sandbox_of_request(state, headers).unwrap_or_default();
    let missing = || RpcError::new(Code::NotFound, format!("sandbox {} not found", space_api::error::clip(&raw)));
    let id: SessionId = raw.parse().map_err(|_| missing())?;
    let record = state.store.session_any(&id).await.map_err(crate::error::AppError::from)?.ok_or_else(missing)?;
    let token = headers.get("x-access-token").and_then(|v| v.to_str().ok());
    if let Some(token) = token {
        // A wrong token is answered as an unknown sandbox: nobody learns which ids exist.
        if !constant_time_eq(token.as_bytes(), access_token(state, &id).as_bytes()) {
            return Err(RpcError::new(
                Code::NotFound,
                format!("sandbox {id} not found, or X-Access-Token is not its access token"),
            ));
        }
        return Ok(Envd { caller: sandbox_caller(record.tenant_id), id });
    }
    let key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).or_else(|| crate::auth::bearer_key(headers));
    let Some(key) = key else {
        return Err(RpcError::new(
            Code::Unauthenticated,
            "send the sandbox's access token (X-Access-Token, from the create or connect answer)",
        ));
    };
    let caller = crate::auth::tenant_caller_of_key(state, key).await?;
    if caller.tenant_id != record.tenant_id {
        return Err(missing());
    }
    Ok(Envd { caller, id })
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `GET /envs`: the sandbox's environment variables as the session sets them.
async fn envs(
    State(state): State<AppState>,
    envd: Envd,
) -> Result<Json<std::collections::BTreeMap<String, String>>, RpcError> {
    let session = crate::api::find_session(&state, &envd.caller, envd.id.as_str()).await?;
    Ok(Json(session.env))
}

/// A user inside the sandbox: who runs a command, whose home is its default directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

impl User {
    fn root() -> User {
        User { uid: 0, gid: 0, home: "/root".into() }
    }
}

/// The user a call names (`Authorization: Basic base64("name:")`, as the SDKs send it).
pub fn username(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.strip_prefix("Basic ")?;
    let decoded = STANDARD.decode(value.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let name = text.split(':').next().unwrap_or_default();
    (!name.is_empty()).then(|| name.to_owned())
}

/// Users looked up in sandboxes' `/etc/passwd`, per session (a template's users do not
/// change while it runs).
#[derive(Default)]
pub struct Users(Mutex<HashMap<(SessionId, String), Option<User>>>);

const MAX_CACHED_USERS: usize = 4096;

impl Users {
    /// The user `name` of the sandbox. E2B's default user (`user`) is root where the template
    /// has no such account, so E2B programs run on space's templates as they are; any other
    /// name the template lacks is an error.
    pub async fn resolve(&self, id: &SessionId, agent: &AgentClient, name: Option<&str>) -> Result<User, RpcError> {
        let name = name.unwrap_or("user");
        if name == "root" {
            return Ok(User::root());
        }
        let key = (id.clone(), name.to_owned());
        let cached = self.0.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        let found = match cached {
            Some(found) => found,
            None => {
                let found = lookup(agent, name).await;
                let mut users = self.0.lock().unwrap_or_else(|e| e.into_inner());
                if users.len() >= MAX_CACHED_USERS {
                    users.clear();
                }
                users.insert(key, found.clone());
                found
            }
        };
        match (found, name) {
            (Some(user), _) => Ok(user),
            (None, "user") => Ok(User::root()),
            (None, name) => Err(RpcError::invalid(format!(
                "user {} does not exist in this sandbox; use \"root\" or a user of its template",
                space_api::error::echo(name)
            ))),
        }
    }
}

/// Most of a sandbox's `/etc/passwd` read: the file is the sandbox's to make huge.
const MAX_PASSWD: usize = 1 << 20;

async fn lookup(agent: &AgentClient, name: &str) -> Option<User> {
    let bytes = read_small(agent, "/etc/passwd", MAX_PASSWD).await?;
    passwd_entry(&String::from_utf8_lossy(&bytes), name)
}

/// File `path` of the sandbox, if it is there and at most `max` bytes.
async fn read_small(agent: &AgentClient, path: &str, max: usize) -> Option<Vec<u8>> {
    use futures::StreamExt;
    let (_, mut chunks) = agent.read_file(path).await.ok()?;
    let mut bytes = Vec::new();
    while let Some(chunk) = chunks.next().await {
        bytes.extend_from_slice(&chunk.ok()?);
        if bytes.len() > max {
            return None;
        }
    }
    Some(bytes)
}

/// The working directory the sandbox's template gives commands (a Dockerfile's or an E2B
/// template's `WORKDIR`), per session: commands that name none start there, as in E2B,
/// else in their user's home.
#[derive(Default)]
pub struct Workdirs(Mutex<HashMap<SessionId, Option<String>>>);

impl Workdirs {
    pub async fn of(&self, id: &SessionId, agent: &AgentClient) -> Option<String> {
        if let Some(cached) = self.0.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned() {
            return cached;
        }
        let defaults = read_small(agent, space_proto::EXEC_DEFAULTS_PATH, 64 << 10).await;
        let cwd = defaults.and_then(|d| serde_json::from_slice::<space_proto::ExecDefaults>(&d).ok()?.cwd);
        let mut workdirs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if workdirs.len() >= MAX_CACHED_USERS {
            workdirs.clear();
        }
        workdirs.insert(id.clone(), cwd.clone());
        cwd
    }
}

fn passwd_entry(passwd: &str, name: &str) -> Option<User> {
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 7 || fields[0] != name {
            return None;
        }
        Some(User { uid: fields[2].parse().ok()?, gid: fields[3].parse().ok()?, home: fields[5].to_owned() })
    })
}

/// What envd's calls remember between calls: users looked up, tags of processes.
#[derive(Default)]
pub struct EnvdState {
    pub users: Users,
    pub workdirs: Workdirs,
    pub tags: super::process::Tags,
    pub inputs: super::process::Inputs,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_come_from_passwd_and_basic_auth() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n";
        assert_eq!(passwd_entry(passwd, "user"), Some(User { uid: 1000, gid: 1000, home: "/home/user".into() }));
        assert_eq!(passwd_entry(passwd, "nobody"), None);
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, format!("Basic {}", STANDARD.encode("root:")).parse().unwrap());
        assert_eq!(username(&headers).as_deref(), Some("root"));
    }
}
