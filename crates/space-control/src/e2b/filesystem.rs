//! envd's `filesystem.Filesystem` service over spaced's file calls. Paths are resolved by
//! spaced inside the sandbox; a relative path starts at the user's home, as in envd.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use space_api::SessionId;
use space_proto::client::{AgentClient, WatchEvents};
use space_proto::{FileKind, FileStat, WatchKind};

use super::connect::{Code, Envelopes, Reply, RpcError, StreamError, Unary, UnaryResult, stream_response};
use super::envd::{Envd, EnvdState, username};
use super::messages::{
    CreateWatcherResponse, EVENT_TYPES, Empty, EntryInfo, EntryMessage, FILE_TYPES, FilesystemEvent, ListDirRequest,
    ListDirResponse, MoveRequest, PathRequest, WatchDirRequest, WatchDirResponse, WatcherEvents, WatcherRequest,
};
use crate::AppState;

const SERVICE: &str = "/filesystem.Filesystem/";
/// Most entries one `ListDir` answers, whatever its depth.
const MAX_ENTRIES: usize = 10_000;
/// Deepest a `ListDir` goes.
const MAX_DEPTH: u32 = 64;
/// Events a polled watcher keeps between polls; later ones are dropped.
const MAX_PENDING_EVENTS: usize = 4096;
/// Polled watchers open at once on this server.
const MAX_WATCHERS: usize = 1024;

pub fn routes() -> axum::Router<AppState> {
    let route = |name: &str| format!("{SERVICE}{name}");
    axum::Router::new()
        .route(&route("Stat"), post(stat))
        .route(&route("MakeDir"), post(make_dir))
        .route(&route("Move"), post(move_path))
        .route(&route("ListDir"), post(list_dir))
        .route(&route("Remove"), post(remove))
        .route(&route("WatchDir"), post(watch_dir))
        .route(&route("CreateWatcher"), post(create_watcher))
        .route(&route("GetWatcherEvents"), post(get_watcher_events))
        .route(&route("RemoveWatcher"), post(remove_watcher))
        .layer(Extension(Arc::new(Watchers::default())))
}

/// The sandbox's agent and `path` made absolute (relative to the user's home).
async fn resolve(
    state: &AppState,
    envd_state: &EnvdState,
    envd: &Envd,
    headers: &HeaderMap,
    path: &str,
) -> Result<(AgentClient, String), RpcError> {
    resolve_as(state, envd_state, envd, username(headers).as_deref(), path).await
}

/// [`resolve`] for a user named otherwise than by the request's headers (`/files` takes it in
/// its query).
pub(super) async fn resolve_as(
    state: &AppState,
    envd_state: &EnvdState,
    envd: &Envd,
    username: Option<&str>,
    path: &str,
) -> Result<(AgentClient, String), RpcError> {
    if path.contains('\0') || path.len() > 4096 {
        return Err(RpcError::invalid("path must be at most 4096 bytes without NUL"));
    }
    let (_, agent) = envd.agent(state).await?;
    if path.starts_with('/') {
        return Ok((agent, path.to_owned()));
    }
    let user = envd_state.users.resolve(&envd.id, &agent, username).await?;
    let path = if path.is_empty() { user.home } else { format!("{}/{path}", user.home.trim_end_matches('/')) };
    Ok((agent, path))
}

pub fn entry(stat: FileStat) -> EntryInfo {
    let file_type = match stat.kind {
        FileKind::File => FILE_TYPES[1],
        FileKind::Dir => FILE_TYPES[2],
        FileKind::Symlink => FILE_TYPES[3],
        FileKind::Other => FILE_TYPES[0],
    };
    EntryInfo {
        name: stat.name,
        file_type,
        path: stat.path,
        size: stat.size as i64,
        mode: stat.mode & 0o7777,
        permissions: permissions(stat.kind, stat.mode),
        owner: owner(stat.uid),
        group: owner(stat.gid),
        modified_time: super::rfc3339(stat.modified_ms),
        symlink_target: stat.symlink_target,
        metadata: stat.metadata,
    }
}

fn owner(id: u32) -> String {
    if id == 0 { "root".into() } else { id.to_string() }
}

/// `ls -l`'s mode string, as Go's `FileMode.String` writes it (envd's).
fn permissions(kind: FileKind, mode: u32) -> String {
    let first = match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    };
    let bits = "rwxrwxrwx".chars().enumerate().map(|(i, c)| if mode & (0o400 >> i) != 0 { c } else { '-' });
    std::iter::once(first).chain(bits).collect()
}

async fn stat(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    headers: HeaderMap,
    Unary(request): Unary<PathRequest>,
) -> UnaryResult<EntryMessage> {
    let (agent, path) = resolve(&state, &envd_state, &envd, &headers, &request.path).await?;
    Ok(Reply(EntryMessage { entry: entry(agent.stat(&path).await?) }))
}

/// Creates a directory and its parents; `already_exists` if it is there (the SDK's `False`).
async fn make_dir(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    headers: HeaderMap,
    Unary(request): Unary<PathRequest>,
) -> UnaryResult<EntryMessage> {
    let (agent, path) = resolve(&state, &envd_state, &envd, &headers, &request.path).await?;
    if agent.stat(&path).await.is_ok() {
        return Err(RpcError::new(Code::AlreadyExists, format!("{} already exists", space_api::error::echo(&path))));
    }
    agent.make_dir(&path).await?;
    Ok(Reply(EntryMessage { entry: entry(agent.stat(&path).await?) }))
}

async fn move_path(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    headers: HeaderMap,
    Unary(request): Unary<MoveRequest>,
) -> UnaryResult<EntryMessage> {
    let (agent, from) = resolve(&state, &envd_state, &envd, &headers, &request.source).await?;
    let (_, to) = resolve(&state, &envd_state, &envd, &headers, &request.destination).await?;
    agent.move_path(&from, &to).await?;
    Ok(Reply(EntryMessage { entry: entry(agent.stat(&to).await?) }))
}

/// Entries under a directory down to `depth` levels (at least 1), at most [`MAX_ENTRIES`].
async fn list_dir(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    headers: HeaderMap,
    Unary(request): Unary<ListDirRequest>,
) -> UnaryResult<ListDirResponse> {
    let (agent, path) = resolve(&state, &envd_state, &envd, &headers, &request.path).await?;
    let mut entries = Vec::new();
    let mut level = vec![path];
    for _ in 0..request.depth.clamp(1, MAX_DEPTH) {
        if level.is_empty() {
            break;
        }
        let mut next = Vec::new();
        for dir in level {
            for stat in agent.list_dir(&dir).await? {
                if stat.kind == FileKind::Dir {
                    next.push(stat.path.clone());
                }
                if entries.len() == MAX_ENTRIES {
                    return Err(RpcError::new(
                        Code::ResourceExhausted,
                        format!("more than {MAX_ENTRIES} entries; list with a smaller depth"),
                    ));
                }
                entries.push(entry(stat));
            }
        }
        level = next;
    }
    Ok(Reply(ListDirResponse { entries }))
}

async fn remove(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    headers: HeaderMap,
    Unary(request): Unary<PathRequest>,
) -> UnaryResult<Empty> {
    let (agent, path) = resolve(&state, &envd_state, &envd, &headers, &request.path).await?;
    agent.remove(&path, true).await?;
    Ok(Reply(Empty {}))
}

/// envd's event for one of spaced's, as envd (fsnotify) names them: a file moved in is
/// created, one moved away renamed. `None` for an overflow, which envd has no word for, and
/// for the temporary file an upload is written to before it is renamed into place.
fn event(watched: &str, event: space_proto::WatchEvent) -> Option<FilesystemEvent> {
    let event_type = match event.kind {
        WatchKind::Create | WatchKind::MovedTo => EVENT_TYPES[1],
        WatchKind::Modify => EVENT_TYPES[2],
        WatchKind::Remove => EVENT_TYPES[3],
        WatchKind::MovedFrom => EVENT_TYPES[4],
        WatchKind::Overflow => return None,
    };
    let name = event.path.strip_prefix(watched).unwrap_or(&event.path).trim_start_matches('/').to_owned();
    let file = name.rsplit('/').next().unwrap_or_default();
    if file.starts_with(space_proto::UPLOAD_TEMP_PREFIX) {
        return None;
    }
    Some(FilesystemEvent { name, event_type, entry: None })
}

/// A watch under way: the directory it reports under, and how to stat what changed when
/// the request asked for each event's entry (`include_entry`).
struct Watching {
    path: String,
    agent: AgentClient,
    include_entry: bool,
}

impl Watching {
    /// envd's event for `change`, with the entry's info when it was asked for and the entry
    /// is there to stat (a removed or renamed-away one is not, as in envd).
    async fn event(&self, change: space_proto::WatchEvent) -> Option<FilesystemEvent> {
        let changed = change.path.clone();
        let mut event = event(&self.path, change)?;
        if self.include_entry && [EVENT_TYPES[1], EVENT_TYPES[2]].contains(&event.event_type) {
            event.entry = self.agent.stat(&changed).await.ok().map(entry);
        }
        Some(event)
    }
}

/// Starts watching the request's directory. `allowNetworkMounts` needs nothing: a sandbox
/// has no network filesystem for envd to refuse by default.
async fn start_watch(
    state: &AppState,
    envd_state: &EnvdState,
    envd: &Envd,
    headers: &HeaderMap,
    request: &WatchDirRequest,
) -> Result<(Arc<Watching>, WatchEvents), RpcError> {
    let (agent, path) = resolve(state, envd_state, envd, headers, &request.path).await?;
    let events = agent.watch(&path, request.recursive).await?;
    Ok((Arc::new(Watching { path, agent, include_entry: request.include_entry }), events))
}

/// Streams a directory's changes: a `start` message, then one per change.
async fn watch_dir(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    envd: Envd,
    headers: HeaderMap,
    mut request: Envelopes,
) -> Response {
    let started = async {
        let request: WatchDirRequest = request.first().await?;
        let slot = state.watches.acquire(&envd.caller.tenant_id, &envd.id)?;
        Ok::<_, RpcError>((slot, start_watch(&state, &envd_state, &envd, &headers, &request).await?))
    };
    let (slot, (watching, events)) = match started.await {
        Ok(watch) => watch,
        Err(error) => return StreamError(error).into_response(),
    };
    let busy = (state.activity.busy(&envd.id), slot);
    let changes = events
        .take_while(|e| std::future::ready(e.is_ok()))
        .filter_map(move |e| {
            let watching = watching.clone();
            async move { watching.event(e.ok()?).await }
        })
        .map(move |e| {
            let _ = &busy;
            Ok(WatchDirResponse::Filesystem(Box::new(e)))
        });
    let messages = futures::stream::once(async { Ok(WatchDirResponse::Start {}) }).chain(changes);
    stream_response(messages, Some((std::time::Duration::from_secs(50), WatchDirResponse::Keepalive {})))
}

/// Watchers polled by `GetWatcherEvents`: events gathered by a task until removed.
#[derive(Default)]
pub struct Watchers(Mutex<HashMap<String, Watcher>>);

struct Watcher {
    session: SessionId,
    events: Arc<Mutex<Vec<FilesystemEvent>>>,
    task: tokio::task::JoinHandle<()>,
    /// Counts against the session's and tenant's watch limits, as a native watch does.
    _slot: crate::watches::WatchSlot,
    polled: std::time::Instant,
}

/// A watcher nobody polled for this long is removed (its client went away).
const WATCHER_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn create_watcher(
    State(state): State<AppState>,
    Extension(envd_state): Extension<Arc<EnvdState>>,
    Extension(watchers): Extension<Arc<Watchers>>,
    envd: Envd,
    headers: HeaderMap,
    Unary(request): Unary<WatchDirRequest>,
) -> UnaryResult<CreateWatcherResponse> {
    {
        let mut all = watchers.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, w| w.polled.elapsed() < WATCHER_IDLE);
        if all.len() >= MAX_WATCHERS {
            return Err(RpcError::new(Code::ResourceExhausted, "too many watchers; remove some first"));
        }
    }
    let slot = state.watches.acquire(&envd.caller.tenant_id, &envd.id)?;
    let (watching, mut events) = start_watch(&state, &envd_state, &envd, &headers, &request).await?;
    let pending = Arc::new(Mutex::new(Vec::new()));
    let sink = pending.clone();
    let task = tokio::spawn(async move {
        while let Some(Ok(change)) = events.next().await {
            let Some(change) = watching.event(change).await else { continue };
            let mut sink = sink.lock().unwrap_or_else(|e| e.into_inner());
            if sink.len() < MAX_PENDING_EVENTS {
                sink.push(change);
            }
        }
    });
    let id = format!("w{}", hex::encode(rand::random::<[u8; 12]>()));
    let polled = std::time::Instant::now();
    let watcher = Watcher { session: envd.id.clone(), events: pending, task, _slot: slot, polled };
    watchers.0.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone(), watcher);
    Ok(Reply(CreateWatcherResponse { watcher_id: id }))
}

fn no_watcher(id: &str) -> RpcError {
    RpcError::new(Code::NotFound, format!("watcher {} not found", space_api::error::echo(id)))
}

async fn get_watcher_events(
    Extension(watchers): Extension<Arc<Watchers>>,
    envd: Envd,
    Unary(request): Unary<WatcherRequest>,
) -> UnaryResult<WatcherEvents> {
    let mut all = watchers.0.lock().unwrap_or_else(|e| e.into_inner());
    let watcher = all
        .get_mut(&request.watcher_id)
        .filter(|w| w.session == envd.id)
        .ok_or_else(|| no_watcher(&request.watcher_id))?;
    watcher.polled = std::time::Instant::now();
    let events = std::mem::take(&mut *watcher.events.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(Reply(WatcherEvents { events }))
}

async fn remove_watcher(
    Extension(watchers): Extension<Arc<Watchers>>,
    envd: Envd,
    Unary(request): Unary<WatcherRequest>,
) -> UnaryResult<Empty> {
    let mut all = watchers.0.lock().unwrap_or_else(|e| e.into_inner());
    match all.get(&request.watcher_id) {
        Some(w) if w.session == envd.id => {
            all.remove(&request.watcher_id);
            Ok(Reply(Empty {}))
        }
        _ => Err(no_watcher(&request.watcher_id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_written_as_envd_writes_them() {
        assert_eq!(permissions(FileKind::File, 0o100644), "-rw-r--r--");
        assert_eq!(permissions(FileKind::Dir, 0o40755), "drwxr-xr-x");
        let change = space_proto::WatchEvent { kind: WatchKind::Create, path: "/home/a/b.txt".into(), is_dir: false };
        assert_eq!(event("/home/a", change).unwrap().name, "b.txt");
    }
}
