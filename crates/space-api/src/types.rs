//! Request and response bodies of the `/v1` API.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ids::{OperationId, SandboxId, SessionId, SnapshotId};
use crate::lifetime::{MaxAgeAction, SessionLifetime};

/// Where a session is in its life. Transitional states (`creating`, `destroying`) always end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    Creating,
    Running,
    /// Frozen in place: processes stopped, memory kept on the node.
    Paused,
    /// Going back to a snapshot in a new sandbox (also: resuming a suspended session).
    Restoring,
    /// Taking the full snapshot a suspend keeps, then freeing the sandbox.
    Suspending,
    /// No sandbox: processes, memory and files are kept in a full snapshot; `resume` brings
    /// them back.
    Suspended,
    Destroying,
    Destroyed,
    /// Creation failed, or the sandbox exited on its own; `error` says why. `destroy` is
    /// allowed, and `restore` from one of its snapshots.
    Failed,
    /// Its node was lost while it ran (or was paused); its sandbox may still run there, and
    /// `error` says when its newest durable full snapshot was taken. `resume` continues it:
    /// on its sandbox if the node is back, else from that snapshot on another node.
    Interrupted,
}

impl SessionState {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Creating => "creating",
            SessionState::Running => "running",
            SessionState::Paused => "paused",
            SessionState::Restoring => "restoring",
            SessionState::Suspending => "suspending",
            SessionState::Suspended => "suspended",
            SessionState::Destroying => "destroying",
            SessionState::Destroyed => "destroyed",
            SessionState::Failed => "failed",
            SessionState::Interrupted => "interrupted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => SessionState::Creating,
            "running" => SessionState::Running,
            "paused" => SessionState::Paused,
            "restoring" => SessionState::Restoring,
            "suspending" => SessionState::Suspending,
            "suspended" => SessionState::Suspended,
            "destroying" => SessionState::Destroying,
            "destroyed" => SessionState::Destroyed,
            "failed" => SessionState::Failed,
            "interrupted" => SessionState::Interrupted,
            _ => return None,
        })
    }

    pub fn is_transitional(self) -> bool {
        matches!(
            self,
            SessionState::Creating | SessionState::Restoring | SessionState::Suspending | SessionState::Destroying
        )
    }
}

/// Resources of a session's sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Resources {
    /// CPU cores (fractions allowed), enforced as a CFS quota.
    pub cpus: f64,
    pub memory_mib: u64,
    /// Maximum number of processes and threads.
    pub pids: u32,
    /// Disk the session may use, in MiB: what its sandboxes wrote that still exists, in the
    /// root or in snapshots (the template's files are free). 0: no limit.
    #[serde(default)]
    pub disk_mib: u64,
}

impl Default for Resources {
    fn default() -> Self {
        Resources { cpus: 1.0, memory_mib: 512, pids: 512, disk_mib: 0 }
    }
}

impl Resources {
    /// The disk limit in bytes, if there is one.
    pub fn disk_limit_bytes(&self) -> Option<u64> {
        (self.disk_mib > 0).then(|| self.disk_mib.saturating_mul(1 << 20))
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// Template name; defaults to the server's default template (`debian`).
    pub template: Option<String>,
    /// `linux` or `vm`; default: the server's (`space serve --default-runtime`).
    pub runtime: Option<crate::RuntimeKind>,
    pub cpus: Option<f64>,
    pub memory_mib: Option<u64>,
    pub pids: Option<u32>,
    /// Disk limit in MiB (see [`Resources::disk_mib`]), 0 for none; default: the server's.
    pub disk_mib: Option<u64>,
    /// Environment variables set for every command in the session.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Automatic snapshots and their retention; default: the server's policy.
    pub snapshot_policy: Option<crate::policy::SnapshotPolicy>,
    /// Suspend the session after this many seconds without activity (no exec, file, process
    /// or watch call, and no such stream open). Default: never.
    pub idle_timeout_secs: Option<u64>,
    /// Destroy the session this many seconds after it was created. Default: never.
    pub max_age_secs: Option<u64>,
    /// `suspend`: reaching `max_age_secs` suspends the session instead of destroying it.
    pub on_max_age: Option<MaxAgeAction>,
    /// When a call resumes the suspended session (`auto_resume`), it ends (or, with
    /// `on_max_age: suspend`, suspends again) this many seconds after that resume. Default:
    /// an auto-resume leaves the maximum age as it is.
    pub auto_resume_max_age_secs: Option<u64>,
    /// Where the session may connect to; default: nowhere (deny all).
    pub network: Option<crate::egress::NetworkPolicy>,
    /// Names of credentials to grant to the session (see `POST /v1/credentials`).
    #[serde(default)]
    pub grants: Vec<String>,
    /// A name for people to recognise it by (at most 128 characters; need not be unique).
    pub name: Option<String>,
    /// Labels to find it by (`GET /v1/sessions?label=team=x`): at most 32; keys match
    /// `[a-z0-9][a-z0-9._/-]{0,62}`, values are at most 256 bytes.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Free-form data kept with the session (at most 16 KiB of keys and values together).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Exec, file, process, watch and port calls on the session while it is suspended resume
    /// it first (otherwise they answer 409 `session_suspended`). Default: false.
    #[serde(default)]
    pub auto_resume: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSessionRequest {
    pub snapshot_policy: Option<crate::policy::SnapshotPolicy>,
    /// As at creation; 0 turns it off.
    pub idle_timeout_secs: Option<u64>,
    /// As at creation; 0 turns it off.
    pub max_age_secs: Option<u64>,
    pub on_max_age: Option<MaxAgeAction>,
    /// As at creation; 0 turns it off.
    pub auto_resume_max_age_secs: Option<u64>,
    /// A new name; `""` removes it.
    pub name: Option<String>,
    /// Replaces all the labels (`{}` removes them).
    pub labels: Option<BTreeMap<String, String>>,
    /// Replaces all the metadata (`{}` removes it).
    pub metadata: Option<BTreeMap<String, String>>,
    pub auto_resume: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub id: SessionId,
    /// The name of the tenant it belongs to.
    #[serde(default)]
    pub tenant: String,
    pub name: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Whether calls that need its sandbox resume it when it is suspended.
    #[serde(default)]
    pub auto_resume: bool,
    pub template: String,
    pub template_version: Option<u32>,
    /// How its sandboxes are isolated.
    #[serde(default)]
    pub runtime: crate::RuntimeKind,
    pub state: SessionState,
    pub resources: Resources,
    pub env: BTreeMap<String, String>,
    pub snapshot_policy: crate::policy::SnapshotPolicy,
    #[serde(default)]
    pub lifetime: SessionLifetime,
    /// Why the last operation failed, if it did.
    pub error: Option<String>,
    pub sandbox_id: Option<SandboxId>,
    /// The node its sandboxes run on and its snapshots are kept on (`None` until it is first
    /// placed): see docs/control-plane.md, "Placement".
    #[serde(default)]
    pub node: Option<String>,
    /// Unix time in milliseconds.
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<Session>,
}

/// A state transition or notable thing that happened to a session.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionEvent {
    pub seq: i64,
    pub session_id: SessionId,
    pub at: i64,
    pub kind: String,
    pub from_state: Option<SessionState>,
    pub to_state: Option<SessionState>,
    pub message: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventList {
    pub events: Vec<SessionEvent>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperationState {
    Pending,
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Operation {
    pub id: OperationId,
    pub kind: String,
    pub state: OperationState,
    pub session_id: Option<SessionId>,
    pub error: Option<String>,
    /// The API error code of `error`, for operations that failed.
    #[serde(default)]
    pub error_code: Option<crate::ErrorCode>,
    /// Human-readable progress of long operations (template builds).
    pub progress: Option<Progress>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Progress {
    pub phase: String,
    pub done: u64,
    pub total: Option<u64>,
}

/// A command to run to completion and collect (`POST /v1/sessions/{id}/exec`).
/// For streaming, interactive or long commands use the WebSocket form.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// argv; the first element is looked up in `PATH`.
    pub cmd: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Bytes fed to stdin (UTF-8); stdin is empty otherwise.
    pub stdin: Option<String>,
    /// Kill the command after this many milliseconds.
    pub timeout_ms: Option<u64>,
    /// Start in the background and return its pid at once (JSON form only).
    #[serde(default)]
    pub background: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    pub pid: u32,
    /// Exit code; absent when the process was killed by a signal or is still running.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// The sandbox hit its memory limit and the kernel killed a process during this command.
    pub oom_killed: bool,
    /// Output as UTF-8 (lossy: invalid bytes become U+FFFD), cut to 16 MiB per stream as it
    /// is sent, in JSON, escapes included (a NUL byte takes 6); see `truncated`.
    pub stdout: String,
    pub stderr: String,
    pub truncated: bool,
    pub duration_ms: u64,
}

/// First text message of an exec WebSocket (`GET /v1/sessions/{id}/exec/ws`).
///
/// Then the client sends binary frames (stdin bytes) and text frames with
/// [`WsClientMessage`]; the server sends binary frames whose first byte is the channel
/// (1 = stdout, 2 = stderr) followed by the bytes, and text frames with [`WsServerMessage`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecStart {
    pub cmd: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub timeout_ms: Option<u64>,
    /// Allocate a pseudo-terminal of this size.
    pub tty: Option<TermSize>,
    /// Whether the client will send stdin (otherwise stdin is empty).
    #[serde(default)]
    pub stdin: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TermSize {
    pub rows: u16,
    pub cols: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WsClientMessage {
    /// No more stdin.
    Eof,
    /// Signals the process; `signal` is a standard Linux signal number, 1-31 (others are
    /// answered with an `error` message and not sent).
    Signal {
        signal: i32,
    },
    Resize {
        rows: u16,
        cols: u16,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WsServerMessage {
    Started { pid: u32 },
    Exit { exit_code: Option<i32>, signal: Option<i32>, timed_out: bool, oom_killed: bool },
    Error { code: crate::ErrorCode, message: String },
}

/// A process started by `spaced` in a session.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessInfo {
    pub pid: u32,
    pub cmd: Vec<String>,
    pub tty: bool,
    pub background: bool,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<ProcessInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// A standard Linux signal number, 1-31 (see [`signal_name`]).
    pub signal: i32,
}

/// The signals a process in a session can be sent: the standard Linux ones, by number (the
/// numbering of x86-64 and arm64). Real-time signals are not offered.
const SIGNALS: [&str; 31] = [
    "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2", "PIPE", "ALRM", "TERM",
    "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO",
    "PWR", "SYS",
];

/// The name of signal number `signal` (`TERM` for 15), or `None` if a process cannot be sent it.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    usize::try_from(signal).ok()?.checked_sub(1).and_then(|i| SIGNALS.get(i)).copied()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileInfo {
    pub name: String,
    pub path: String,
    #[serde(rename = "type")]
    pub file_type: FileType,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub modified_ms: i64,
    pub symlink_target: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    pub entries: Vec<FileInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WriteResult {
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PathRequest {
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub from: String,
    pub to: String,
}

/// One filesystem change, sent as a text frame on `GET /v1/sessions/{id}/watch`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WatchEvent {
    /// create, modify, remove, moved_from, moved_to or overflow.
    pub kind: String,
    pub path: String,
    pub is_dir: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Template {
    pub name: String,
    pub scope: TemplateScope,
    pub version: u32,
    pub created_at: i64,
    pub size_bytes: u64,
    pub source: String,
    /// The image's digest, for templates imported from an OCI image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The image config's defaults, for templates imported from an OCI image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<TemplateDefaults>,
}

/// What an image's config gives the commands run from a template. `env`, `working_dir` and
/// `user` apply to every command of every session (under the session's and the request's
/// own); `entrypoint` and `cmd` are recorded for the caller to run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplateDefaults {
    /// `NAME=value` entries, in the image's order.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// As the image gives it: `user`, `uid`, `user:group` or `uid:gid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
}

/// Whose a template is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TemplateScope {
    /// The operator's (made with the admin key): every tenant sees and uses it.
    Global,
    /// The caller's own, which no other tenant sees; it comes before a global template of the
    /// same name.
    Own,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateList {
    pub templates: Vec<Template>,
    /// Built-in templates that can be built on demand.
    pub builtin: Vec<String>,
    pub default_template: String,
    /// Largest upload `POST /v1/templates/uploads` accepts, in bytes (`space serve
    /// --template-upload-max-gib`): a client checks its file against it before sending.
    pub upload_max_bytes: u64,
}

/// A Dockerfile build (`POST /v1/templates/builds`): an operation that makes a template.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateBuildView {
    /// The build's operation (`GET /v1/operations/{id}`, its log at `…/logs`).
    pub id: OperationId,
    /// The template it makes a version of.
    pub name: String,
    pub state: OperationState,
    pub error: Option<String>,
    pub progress: Option<Progress>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateBuildList {
    /// Newest first.
    pub builds: Vec<TemplateBuildView>,
}

/// Lines of an operation's log (a Dockerfile build's steps and their output).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OperationLog {
    pub lines: Vec<String>,
    /// Pass as `after` to read the lines that follow.
    pub next: i64,
}

/// What a client is told when its template upload is past the server's limit.
pub fn upload_too_large(limit: u64) -> String {
    format!("the upload is larger than {limit} bytes (space serve --template-upload-max-gib)")
}

/// Import a template: a root filesystem (directory or tarball) or an OCI image
/// (`oci:DIR[:TAG]`, `docker-archive:FILE`) on the server's host, or an image in a registry
/// (`docker://HOST[:PORT]/REPOSITORY[:TAG]`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportTemplateRequest {
    pub name: String,
    /// An absolute path, optionally after `oci:` or `docker-archive:`; or `docker://` and a
    /// registry reference.
    pub path: String,
}

/// What `DELETE /v1/templates/{name}` removed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateDeleted {
    pub name: String,
    /// The versions deleted.
    pub versions: Vec<u32>,
    /// Sessions that still used one of them (only when forced): they keep running, but one
    /// that must start afresh from its template (it has no snapshot) can no longer.
    pub in_use_by: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildTemplateRequest {
    /// A built-in template: `debian` or `busybox`.
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Status {
    pub version: String,
    pub node_id: String,
    pub sessions: BTreeMap<String, u64>,
    pub templates: Vec<Template>,
    pub pool: PoolStatus,
    /// Full snapshots (suspend, resume, fork with processes): the checkpoint tool in use, or
    /// why they are unavailable on this node.
    pub full_snapshots: FullSnapshotSupport,
    /// Which runtimes this node can run, and why not.
    #[serde(default)]
    pub runtimes: Vec<crate::RuntimeSupport>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct FullSnapshotSupport {
    pub available: bool,
    /// E.g. `CRIU 4.2.1`, or what is missing and how to fix it.
    pub detail: String,
}

/// The node's warm pool: sandboxes started ahead of demand ("pods"), per template.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct PoolStatus {
    /// Ceiling on pods being prepared at the same time (all templates together).
    pub max_filling: u32,
    /// Pods being prepared right now.
    pub filling: u32,
    /// The most pods ever prepared at the same time since the server started.
    pub peak_filling: u32,
    /// Destroyed sandbox roots whose deletion is still queued.
    pub pending_deletions: u64,
    pub templates: Vec<TemplatePool>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TemplatePool {
    pub template: String,
    /// The runtime its pods run in.
    #[serde(default)]
    pub runtime: crate::RuntimeKind,
    /// How many ready pods the node keeps.
    pub size: u32,
    pub ready: u32,
    pub filling: u32,
    /// Creates served by a ready pod.
    pub hits: u64,
    /// Creates that found no ready pod and took the cold path.
    pub misses: u64,
    /// Pod preparations that failed.
    pub failures: u64,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPoolSizeRequest {
    /// Ready pods to keep for the template (0 turns its pool off).
    pub size: u32,
    /// The runtime of the pool's pods; default: the server's default runtime.
    #[serde(default)]
    pub runtime: Option<crate::RuntimeKind>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// A read-only copy of the root filesystem, taken while the sandbox is frozen.
    Disk,
    /// Disk plus the memory and state of every process (CRIU).
    Full,
}

impl SnapshotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Disk => "disk",
            SnapshotKind::Full => "full",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "disk" => Some(SnapshotKind::Disk),
            "full" => Some(SnapshotKind::Full),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    pub id: SnapshotId,
    pub session_id: SessionId,
    pub kind: SnapshotKind,
    /// Given by the user; named snapshots are never pruned by the schedule.
    pub name: Option<String>,
    /// The session's previous snapshot, if any.
    pub parent: Option<SnapshotId>,
    /// Apparent size of the files (and of the process image, for full snapshots). `null`
    /// for a moment after a disk snapshot is taken: its files are measured in the
    /// background, so taking it costs no walk of the tree (the snapshot is usable at once).
    pub size_bytes: Option<u64>,
    /// Bytes on disk that only this snapshot holds: what deleting it frees (files the session
    /// deleted since stay here). Measured when one snapshot is read
    /// (`GET /v1/sessions/{id}/snapshots/{snapshot}`); `null` in lists.
    #[serde(default)]
    pub exclusive_bytes: Option<u64>,
    /// Unix time in milliseconds.
    pub created_at: i64,
    /// Every part of it is in the blob store, so any node can restore it, also once the node
    /// it was taken on is gone. `false`: it lives on that node's disk only (no blob store is
    /// configured, or exporting it failed).
    #[serde(default)]
    pub durable: bool,
    /// Kept when its session is destroyed, until it is deleted, and never pruned by the
    /// snapshot schedule: new sessions can still be forked from it (as E2B's snapshots,
    /// which the E2B endpoint takes so).
    #[serde(default)]
    pub outlives_session: bool,
}

/// What a session uses now (`GET /v1/sessions/{id}/stats`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionStats {
    /// Of its running sandbox; `null` while it has none (suspended, stopped).
    pub sandbox: Option<SandboxUsage>,
    pub disk: DiskStats,
    /// What it sent and received through the egress gateway.
    #[serde(default)]
    pub network: NetworkUsage,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxUsage {
    /// Memory in use now (the sandbox's cgroup: processes, page cache, kernel memory).
    pub memory_bytes: u64,
    /// The most memory the sandbox used at once since it started; `null` where the kernel
    /// does not report it (cgroup v2 before Linux 5.19). A restored sandbox starts anew.
    #[serde(default)]
    pub memory_peak_bytes: Option<u64>,
    pub memory_limit_bytes: u64,
    /// Processes the kernel killed because the sandbox hit its memory limit.
    pub oom_kills: u64,
    pub pids: u64,
    /// CPU time its processes used since the sandbox started, user and system together.
    pub cpu_usage_ns: u64,
}

/// Bytes through the egress gateway since the session's egress was set on this node (its
/// creation, or the server's start: the counters are kept in memory), counted as each
/// connection or request ends, DNS excepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NetworkUsage {
    /// From the sandbox to upstreams (request headers and bodies, or a tunnel's bytes).
    pub bytes_out: u64,
    /// From upstreams to the sandbox.
    pub bytes_in: u64,
}

/// A session's disk usage: what its sandboxes wrote that still exists anywhere on the node
/// (its root, its snapshots, and forks made from them), as of the filesystem's last commit
/// (a few seconds behind writes).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DiskStats {
    /// What the session is charged for: its root and its snapshots together, data they share
    /// counted once.
    pub used_bytes: u64,
    /// `null`: no limit.
    pub limit_bytes: Option<u64>,
    /// Whether the node enforces the limit (btrfs simple quotas on its pool).
    pub enforced: bool,
    /// How many snapshots the session has.
    #[serde(default)]
    pub snapshots: u64,
    /// The sum of its snapshots' `size_bytes` (apparent sizes: data a snapshot shares with
    /// the root or another snapshot counts in each; a disk snapshot still being measured
    /// counts 0). What deleting one frees is its `exclusive_bytes`.
    #[serde(default)]
    pub snapshot_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    /// `disk` (default) or `full`.
    pub kind: Option<SnapshotKind>,
    pub name: Option<String>,
    /// Keep it when the session is destroyed (default `false`: a session's snapshots go with
    /// it). It is never pruned by the schedule either; delete it when it is no longer needed.
    pub outlives_session: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    pub snapshot: SnapshotId,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// Snapshot to fork from; default: a new snapshot of the session as it is now.
    pub from: Option<SnapshotId>,
    /// How many sessions to create (default 1).
    pub count: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_named_by_their_linux_numbers() {
        assert_eq!(
            (signal_name(1), signal_name(9), signal_name(15), signal_name(31)),
            (Some("HUP"), Some("KILL"), Some("TERM"), Some("SYS"))
        );
        for n in [0, 32, 34, 64, -15, i32::MIN, i32::MAX] {
            assert_eq!(signal_name(n), None, "{n}");
        }
    }
}
