//! E2B's sandbox logs (`/sandboxes/{id}/logs`, `/v2/sandboxes/{id}/logs`) from the session's
//! events: what happened to the sandbox (created, paused, resumed, forked, failed, why), each
//! a log entry. space keeps no log of the sandbox's own output: a command's output goes to its
//! caller (`commands.run`).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use space_api::{SessionEvent, SessionState};

use super::errors::{E2bError, E2bResult};
use super::sandboxes::any_sandbox;
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiPath, ApiQuery};

/// E2B's default and largest page.
const MAX_LIMIT: usize = 1000;
/// E2B's bound on `search`.
const MAX_SEARCH: usize = 256;

#[derive(Debug, Default, Deserialize)]
pub struct LogsQuery {
    /// v1's first timestamp (Unix ms).
    start: Option<String>,
    /// v2's first (forward) or last (backward) timestamp (Unix ms).
    cursor: Option<String>,
    limit: Option<String>,
    direction: Option<String>,
    level: Option<String>,
    search: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Debug, Serialize)]
pub struct Entry {
    timestamp: String,
    level: Level,
    message: String,
    fields: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
pub struct Line {
    timestamp: String,
    line: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Logs {
    logs: Vec<Line>,
    log_entries: Vec<Entry>,
}

#[derive(Debug, Serialize)]
pub struct LogsV2 {
    logs: Vec<Entry>,
}

/// What a page asks for, checked.
#[derive(Debug, PartialEq)]
struct Page {
    cursor: Option<i64>,
    limit: usize,
    backward: bool,
    level: Level,
    search: Option<String>,
}

/// `GET /sandboxes/{id}/logs`: the oldest events from `start` on, as lines and entries.
pub async fn logs_v1(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<LogsQuery>,
) -> E2bResult<Json<Logs>> {
    let v1 = LogsQuery { cursor: query.start, limit: query.limit, ..LogsQuery::default() };
    let entries = entries(&state, &caller, &id, v1).await?;
    let logs = entries.iter().map(|e| Line { timestamp: e.timestamp.clone(), line: e.message.clone() }).collect();
    Ok(Json(Logs { logs, log_entries: entries }))
}

/// `GET /v2/sandboxes/{id}/logs`: events from `cursor` on (or, `direction=backward`, up to
/// it, newest first), at `level` or above, containing `search`.
pub async fn logs_v2(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<LogsQuery>,
) -> E2bResult<Json<LogsV2>> {
    Ok(Json(LogsV2 { logs: entries(&state, &caller, &id, query).await? }))
}

/// The page `query` asks for of sandbox `id`'s events, once the sandbox is found the
/// caller's (authorization before validation).
async fn entries(state: &AppState, caller: &Caller, id: &str, query: LogsQuery) -> E2bResult<Vec<Entry>> {
    let session = any_sandbox(state, caller, id).await?;
    let page = Page::of(query)?;
    Ok(page.select(state.store.events(&session.id).await.map_err(crate::error::AppError::from)?))
}

impl Page {
    fn of(query: LogsQuery) -> E2bResult<Page> {
        let number = |name: &str, value: Option<String>| -> E2bResult<Option<u64>> {
            value
                .map(|v| v.parse::<u64>().map_err(|_| E2bError::bad_request(format!("{name} must be a whole number"))))
                .transpose()
        };
        let cursor = number("cursor", query.cursor)?.map(|c| i64::try_from(c).unwrap_or(i64::MAX));
        let limit = number("limit", query.limit)?.map_or(MAX_LIMIT, |l| l.min(MAX_LIMIT as u64) as usize);
        let backward = match query.direction.as_deref() {
            None | Some("forward") => false,
            Some("backward") => true,
            Some(_) => return Err(E2bError::bad_request("direction must be forward or backward")),
        };
        let level = match query.level.as_deref() {
            None | Some("debug") => Level::Debug,
            Some("info") => Level::Info,
            Some("warn") => Level::Warn,
            Some("error") => Level::Error,
            Some(_) => return Err(E2bError::bad_request("level must be debug, info, warn or error")),
        };
        if query.search.as_ref().is_some_and(|s| s.len() > MAX_SEARCH) {
            return Err(E2bError::bad_request(format!("search is at most {MAX_SEARCH} bytes")));
        }
        Ok(Page { cursor, limit, backward, level, search: query.search })
    }

    /// The page of `events` (oldest first) it asks for, as log entries.
    fn select(&self, events: Vec<SessionEvent>) -> Vec<Entry> {
        let wanted = |e: &SessionEvent| match (self.cursor, self.backward) {
            (None, _) => true,
            (Some(cursor), false) => e.at >= cursor,
            (Some(cursor), true) => e.at <= cursor,
        };
        let entries = events.iter().filter(|e| wanted(e)).map(entry).filter(|entry| {
            entry.level >= self.level && self.search.as_ref().is_none_or(|s| entry.message.contains(s.as_str()))
        });
        match self.backward {
            false => entries.take(self.limit).collect(),
            true => {
                let mut newest: Vec<Entry> = entries.collect();
                newest.reverse();
                newest.truncate(self.limit);
                newest
            }
        }
    }
}

/// A session event as E2B's log entry: its message (or its change of state), at `error` when
/// it failed the session, `warn` when it says something was lost or refused.
fn entry(event: &SessionEvent) -> Entry {
    let states = |s: Option<SessionState>| s.map(|s| s.as_str().to_owned());
    let message = match (&event.message, states(event.from_state), states(event.to_state)) {
        (Some(message), _, _) => message.clone(),
        (None, Some(from), Some(to)) => format!("{from} -> {to}"),
        (None, _, Some(to)) => to,
        (None, _, None) => event.kind.clone(),
    };
    let level = match event.to_state {
        Some(SessionState::Failed) => Level::Error,
        _ if event.kind.contains("fail") || event.kind.starts_with("not_") => Level::Warn,
        _ => Level::Info,
    };
    let mut fields = BTreeMap::from([("kind".to_owned(), event.kind.clone())]);
    fields.extend(states(event.from_state).map(|s| ("from".to_owned(), s)));
    fields.extend(states(event.to_state).map(|s| ("to".to_owned(), s)));
    Entry { timestamp: super::rfc3339(event.at), level, message, fields }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(at: i64, kind: &str, to: Option<SessionState>, message: Option<&str>) -> SessionEvent {
        SessionEvent {
            seq: at,
            session_id: space_api::SessionId::generate(),
            at,
            kind: kind.into(),
            from_state: None,
            to_state: to,
            message: message.map(str::to_owned),
        }
    }

    fn events() -> Vec<SessionEvent> {
        vec![
            event(1, "state", Some(SessionState::Running), None),
            event(2, "not_durable", None, Some("kept on node-a only")),
            event(3, "state", Some(SessionState::Failed), Some("the sandbox exited")),
        ]
    }

    fn query(pairs: &[(&str, &str)]) -> LogsQuery {
        let get = |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
        LogsQuery {
            start: None,
            cursor: get("cursor"),
            limit: get("limit"),
            direction: get("direction"),
            level: get("level"),
            search: get("search"),
        }
    }

    fn messages(pairs: &[(&str, &str)]) -> Vec<String> {
        Page::of(query(pairs)).unwrap().select(events()).into_iter().map(|e| e.message).collect()
    }

    #[test]
    fn events_are_paged_forward_and_backward_from_the_cursor() {
        assert_eq!(messages(&[]), ["running", "kept on node-a only", "the sandbox exited"]);
        assert_eq!(messages(&[("cursor", "2"), ("limit", "1")]), ["kept on node-a only"]);
        assert_eq!(messages(&[("cursor", "2"), ("direction", "backward")]), ["kept on node-a only", "running"]);
        assert_eq!(messages(&[("direction", "backward"), ("limit", "1")]), ["the sandbox exited"]);
    }

    #[test]
    fn levels_and_search_filter() {
        assert_eq!(messages(&[("level", "warn")]), ["kept on node-a only", "the sandbox exited"]);
        assert_eq!(messages(&[("level", "error")]), ["the sandbox exited"]);
        assert_eq!(messages(&[("search", "node-a")]), ["kept on node-a only"]);
    }

    #[test]
    fn bad_pages_are_refused_saying_what_is_expected() {
        for (pairs, expected) in [
            (vec![("direction", "sideways")], "direction must be forward or backward"),
            (vec![("level", "loud")], "level must be debug"),
            (vec![("cursor", "-1")], "cursor must be a whole number"),
            (vec![("limit", "x")], "limit must be a whole number"),
        ] {
            let refused = Page::of(query(&pairs)).unwrap_err();
            assert_eq!(refused.code, 400);
            assert!(refused.message.starts_with(expected), "{}", refused.message);
        }
        let long = "x".repeat(MAX_SEARCH + 1);
        assert!(Page::of(query(&[("search", &long)])).is_err());
    }
}
