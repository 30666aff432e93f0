//! Session-scoped tokens (for sub-agents): an API key limited to one session, the sessions
//! forked from it, and what its scopes allow. [`guard`] runs on every `/v1` route right after
//! the key is known and before anything else of the request is read: a route no scope covers
//! is 403, a session outside the token's is 404 (as another tenant's), a scope the token lacks
//! is 403 naming it. (Forks answer with running sessions, so a token needs no operation to
//! follow.)

use std::collections::HashMap;

use axum::extract::rejection::PathRejection;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use axum::{Extension, extract::Path};
use space_api::{ErrorCode, SessionId, SessionScope, TokenScope};

use crate::AppState;
use crate::auth::Caller;
use crate::error::{AppError, AppResult};

/// The scope `method` on the route `path` (as matched, `{id}` for the session) needs on the
/// session it names; `None` for routes no scoped token may call.
fn need(method: &Method, path: &str) -> Option<TokenScope> {
    use TokenScope::*;
    let rest = path.strip_prefix("/v1/sessions/{id}")?;
    let scope = match (method.as_str(), rest) {
        ("GET", "" | "/events" | "/stats" | "/snapshots" | "/snapshots/{snapshot}" | "/processes" | "/network")
        | ("GET", "/audit" | "/ports" | "/ports/{port}") => Read,
        ("POST", "/exec" | "/processes/{pid}/signal") | ("GET", "/exec/ws" | "/processes/{pid}/attach" | "/watch") => {
            Exec
        }
        (_, files) if files.starts_with("/files") => Exec,
        ("POST", "/fork") => Fork,
        ("POST", "/snapshots" | "/restore" | "/pause" | "/resume" | "/suspend")
        | ("DELETE", "/snapshots/{snapshot}") => Snapshot,
        ("DELETE", "") => Destroy,
        _ => return None,
    };
    Some(scope)
}

/// Middleware: lets a session-scoped token through only where its scope allows (see the
/// module doc); any other caller passes untouched.
pub async fn guard(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    matched: Option<MatchedPath>,
    params: Result<Path<HashMap<String, String>>, PathRejection>,
    request: Request,
    next: Next,
) -> AppResult<Response> {
    let Some(scope) = &caller.scope else { return Ok(next.run(request).await) };
    let path = matched.as_ref().map(MatchedPath::as_str).unwrap_or_default();
    let params = params.map(|Path(p)| p).unwrap_or_default();
    let id = params.get("id").map(String::as_str).unwrap_or_default();
    let Some(needed) = need(request.method(), path) else {
        return Err(refused(scope, request.method(), path));
    };
    session_in_scope(&state, scope, id, needed).await?;
    Ok(next.run(request).await)
}

async fn session_in_scope(state: &AppState, scope: &SessionScope, id: &str, needed: TokenScope) -> AppResult<()> {
    let not_found = || AppError::session_not_found(id);
    let session: SessionId = id.parse().map_err(|_| not_found())?;
    if !state.store.session_descends_from(&session, &scope.session_id).await? {
        return Err(not_found());
    }
    if !scope.scopes.contains(&needed) {
        return Err(AppError::new(
            ErrorCode::Forbidden,
            format!(
                "this token's scopes ({}) do not include `{}`; create a token with it \
                 (`space session token {} --scope {}`)",
                names(scope),
                needed.as_str(),
                scope.session_id,
                needed.as_str()
            ),
        ));
    }
    if needed == TokenScope::Destroy && session == scope.session_id {
        return Err(AppError::new(
            ErrorCode::Forbidden,
            format!("a token scoped to session {session} destroys its forks, never that session itself"),
        ));
    }
    Ok(())
}

fn names(scope: &SessionScope) -> String {
    scope.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
}

fn refused(scope: &SessionScope, method: &Method, path: &str) -> AppError {
    AppError::new(
        ErrorCode::Forbidden,
        format!(
            "this token is scoped to session {} and its forks ({}); it cannot call {method} {path}: use a tenant's API \
             key for that",
            scope.session_id,
            names(scope)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_a_token_may_call_needs_one_scope() {
        let session = |m: Method, p: &str| need(&m, &format!("/v1/sessions/{{id}}{p}"));
        assert_eq!(session(Method::GET, ""), Some(TokenScope::Read));
        assert_eq!(session(Method::POST, "/exec"), Some(TokenScope::Exec));
        assert_eq!(session(Method::PUT, "/files/content"), Some(TokenScope::Exec));
        assert_eq!(session(Method::POST, "/fork"), Some(TokenScope::Fork));
        assert_eq!(session(Method::POST, "/restore"), Some(TokenScope::Snapshot));
        assert_eq!(session(Method::DELETE, ""), Some(TokenScope::Destroy));
        // What a token never does: widen its own reach, make tokens, change the network, open ports.
        for (m, p) in [
            (Method::POST, "/grants"),
            (Method::DELETE, "/grants/{name}"),
            (Method::PATCH, "/network"),
            (Method::PATCH, ""),
            (Method::POST, "/tokens"),
            (Method::POST, "/ports/{port}"),
            (Method::GET, "/tunnel/{port}"),
        ] {
            assert_eq!(session(m.clone(), p), None, "{m} {p}");
        }
        for p in ["/v1/sessions", "/v1/credentials", "/v1/keys", "/v1/status", "/v1/templates", "/v1/operations/{id}"] {
            assert_eq!(need(&Method::GET, p), None, "{p}");
            assert_eq!(need(&Method::POST, p), None, "{p}");
        }
    }
}
