//! The tools' arguments (their JSON schemas are what a model reads) and how they map onto
//! API requests. Kept free of I/O so the mapping is tested on its own.

use std::collections::BTreeMap;

use rmcp::model::JsonObject;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use space_api::egress::NetworkPolicy;
use space_api::{
    CreateSessionRequest, CreateSnapshotRequest, ExecRequest, ForkRequest, RestoreRequest, RuntimeKind, SessionId,
    SnapshotId, SnapshotKind,
};

use super::api::{CallError, CallResult};
use crate::client::encode;

/// Default kill timeout of `run_command`: a model's call should not hang on a command that
/// waits for input that never comes (E2B's default is 60 s too).
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// Default and largest amount of each output stream `run_command` returns.
pub const DEFAULT_MAX_OUTPUT: usize = 64 * 1024;
pub const MAX_OUTPUT: usize = 1024 * 1024;
/// Default and largest amount of a file `read_file` returns.
pub const DEFAULT_MAX_READ: usize = 1024 * 1024;
pub const MAX_READ: usize = 8 * 1024 * 1024;

/// A tool's arguments as its type. A mismatch is returned to the model as a tool error
/// (code `bad_request`) rather than as a protocol error, so that it can correct the call.
pub fn parse<T: DeserializeOwned>(arguments: JsonObject) -> CallResult<T> {
    serde_json::from_value(serde_json::Value::Object(arguments))
        .map_err(|e| CallError::Invalid(format!("invalid arguments: {e}")))
}

/// `ses_…` as a typed id: anything else never reaches a URL path.
pub fn session_id(id: &str) -> CallResult<SessionId> {
    id.parse().map_err(|e: space_api::IdError| CallError::Invalid(e.to_string()))
}

/// `/v1/sessions/{id}{rest}`.
pub fn session_path(id: &str, rest: &str) -> CallResult<String> {
    Ok(format!("/v1/sessions/{}{rest}", session_id(id)?))
}

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Runtime {
    /// Namespaces, seccomp and cgroups on the host kernel: starts fastest.
    Linux,
    /// A virtual machine with its own kernel: the stronger isolation.
    Vm,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionParams {
    /// Template (root filesystem) to start from, e.g. `debian` or `busybox`. Default: the
    /// server's default template.
    pub template: Option<String>,
    /// `linux` or `vm`. Default: the server's default runtime.
    pub runtime: Option<Runtime>,
    /// Host names the sandbox may connect to on ports 80 and 443, e.g. `pypi.org`,
    /// `files.pythonhosted.org`, `*.github.com` (any name below github.com) or `*` (any public
    /// host). Default: none, the sandbox has no network access.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Environment variables set for every command in the session.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Suspend the session after this many seconds without activity; its files and
    /// processes are kept and it can be resumed. Default: never.
    pub idle_timeout_secs: Option<u64>,
    /// CPU cores (fractions allowed). Default: the server's (1).
    pub cpus: Option<f64>,
    /// Memory limit in MiB. Default: the server's (512).
    pub memory_mib: Option<u64>,
}

impl CreateSessionParams {
    pub fn request(self) -> CreateSessionRequest {
        CreateSessionRequest {
            template: self.template,
            runtime: self.runtime.map(|r| match r {
                Runtime::Linux => RuntimeKind::Linux,
                Runtime::Vm => RuntimeKind::Vm,
            }),
            cpus: self.cpus,
            memory_mib: self.memory_mib,
            env: self.env,
            idle_timeout_secs: self.idle_timeout_secs,
            network: (!self.allow.is_empty()).then(|| NetworkPolicy { allow: self.allow, ..Default::default() }),
            ..Default::default()
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSessionsParams {
    /// Also list destroyed sessions. Default: false.
    #[serde(default)]
    pub include_destroyed: bool,
}

impl ListSessionsParams {
    pub fn path(&self) -> String {
        format!("/v1/sessions?all={}", self.include_destroyed)
    }
}

/// A command line: a string for the shell, or an argv.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(inline)]
pub enum CommandLine {
    /// Run by `sh -c`: pipes, redirections, `&&` and globs work.
    Shell(String),
    /// Run directly without a shell: the program (looked up in PATH) and its arguments.
    Argv(Vec<String>),
}

impl CommandLine {
    pub fn argv(self) -> CallResult<Vec<String>> {
        let argv = match self {
            CommandLine::Shell(line) if !line.trim().is_empty() => vec!["sh".into(), "-c".into(), line],
            CommandLine::Argv(argv) if argv.first().is_some_and(|p| !p.is_empty()) => argv,
            _ => return Err(CallError::Invalid("command is empty: give a shell command line or an argv".into())),
        };
        Ok(argv)
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandParams {
    /// The session's id (`ses_…`), from create_session or list_sessions.
    pub session_id: String,
    /// A string is run by `sh -c` (e.g. `"ls -la /tmp | head"`); an array is run without a
    /// shell (e.g. `["python3", "-c", "print(1)"]`).
    pub command: CommandLine,
    /// Working directory. Default: `/`.
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Text written to the command's standard input (then closed). Default: empty.
    pub stdin: Option<String>,
    /// Kill the command after this many seconds; the result then has `timed_out: true`.
    /// Default: 60 (no limit for a background command). 0: no limit.
    pub timeout_secs: Option<u64>,
    /// Start the command in the background (e.g. a web server) and return its pid at once
    /// instead of waiting for its exit. Default: false.
    #[serde(default)]
    pub background: bool,
    /// Most bytes of stdout and of stderr each to return; a longer output keeps its beginning
    /// and its end. Default: 65536; at most 1048576.
    pub max_output_bytes: Option<usize>,
}

impl RunCommandParams {
    pub fn request(self) -> CallResult<(String, ExecRequest, usize)> {
        let path = session_path(&self.session_id, "/exec")?;
        let request = ExecRequest {
            cmd: self.command.argv()?,
            env: self.env,
            cwd: self.cwd,
            stdin: self.stdin,
            timeout_ms: timeout_ms(self.timeout_secs, self.background),
            background: self.background,
            ..Default::default()
        };
        Ok((path, request, self.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT).min(MAX_OUTPUT)))
    }
}

/// The exec's kill timeout: the default for a foreground command, none for a background one
/// (it outlives the call) unless asked for, and none when asked for 0.
fn timeout_ms(timeout_secs: Option<u64>, background: bool) -> Option<u64> {
    let secs = match (timeout_secs, background) {
        (Some(secs), _) => secs,
        (None, true) => 0,
        (None, false) => DEFAULT_TIMEOUT_SECS,
    };
    (secs > 0).then(|| secs.saturating_mul(1000))
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileParams {
    /// The session's id (`ses_…`).
    pub session_id: String,
    /// File path inside the sandbox; a relative path starts at `/`.
    pub path: String,
    /// Most bytes to return (the result says `truncated` when the file is longer). Default:
    /// 1048576; at most 8388608.
    pub max_bytes: Option<usize>,
}

impl ReadFileParams {
    pub fn request(&self) -> CallResult<(String, usize)> {
        let path = session_path(&self.session_id, &format!("/files/content?path={}", encode(&self.path)))?;
        Ok((path, self.max_bytes.unwrap_or(DEFAULT_MAX_READ).min(MAX_READ)))
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[schemars(inline)]
pub enum Encoding {
    /// Text, written as UTF-8.
    #[default]
    #[serde(rename = "utf-8")]
    Utf8,
    /// Binary data, base64-encoded (standard alphabet, with padding).
    #[serde(rename = "base64")]
    Base64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileParams {
    /// The session's id (`ses_…`).
    pub session_id: String,
    /// File path inside the sandbox; missing parent directories are created, an existing
    /// file is replaced.
    pub path: String,
    /// The file's whole content.
    pub content: String,
    /// How `content` is encoded: `utf-8` (default) or `base64` for binary data.
    #[serde(default)]
    pub encoding: Encoding,
    /// Octal permission bits of a new file, e.g. `755` for a script. Default: `644`.
    pub mode: Option<String>,
}

impl WriteFileParams {
    pub fn request(self) -> CallResult<(String, Vec<u8>)> {
        let mut query = format!("/files/content?path={}", encode(&self.path));
        if let Some(mode) = &self.mode {
            query.push_str(&format!("&mode={}", encode(mode)));
        }
        let path = session_path(&self.session_id, &query)?;
        let body = match self.encoding {
            Encoding::Utf8 => self.content.into_bytes(),
            Encoding::Base64 => {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD
                    .decode(self.content.trim())
                    .map_err(|e| CallError::Invalid(format!("content is not valid base64: {e}")))?
            }
        };
        Ok((path, body))
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesParams {
    /// The session's id (`ses_…`).
    pub session_id: String,
    /// Directory inside the sandbox. Default: `/`.
    pub path: Option<String>,
}

impl ListFilesParams {
    pub fn request(&self) -> CallResult<String> {
        let dir = self.path.as_deref().unwrap_or("/");
        session_path(&self.session_id, &format!("/files/list?path={}", encode(dir)))
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Kind {
    /// The root filesystem only: fast, and running processes keep running.
    #[default]
    Disk,
    /// The filesystem plus the memory of every process (needs CRIU on the server).
    Full,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotParams {
    /// The session's id (`ses_…`).
    pub session_id: String,
    /// `disk` (default) or `full`.
    #[serde(default)]
    pub kind: Kind,
    /// A name to remember it by; named snapshots are never pruned automatically.
    pub name: Option<String>,
}

impl SnapshotParams {
    pub fn request(self) -> CallResult<(String, CreateSnapshotRequest)> {
        let kind = match self.kind {
            Kind::Disk => SnapshotKind::Disk,
            Kind::Full => SnapshotKind::Full,
        };
        Ok((
            session_path(&self.session_id, "/snapshots")?,
            CreateSnapshotRequest { kind: Some(kind), name: self.name, outlives_session: None },
        ))
    }
}

fn snapshot_id(id: &str) -> CallResult<SnapshotId> {
    id.parse().map_err(|e: space_api::IdError| CallError::Invalid(e.to_string()))
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreParams {
    /// The session's id (`ses_…`).
    pub session_id: String,
    /// The snapshot to go back to (`snap_…`, from `snapshot`).
    pub snapshot_id: String,
}

impl RestoreParams {
    pub fn request(&self) -> CallResult<(String, RestoreRequest)> {
        let snapshot = snapshot_id(&self.snapshot_id)?;
        Ok((session_path(&self.session_id, "/restore")?, RestoreRequest { snapshot }))
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkParams {
    /// The session to fork (`ses_…`).
    pub session_id: String,
    /// How many new sessions to create. Default: 1.
    pub count: Option<u32>,
    /// Fork from this snapshot (`snap_…`). Default: a new disk snapshot of the session as it
    /// is now.
    pub from_snapshot_id: Option<String>,
}

impl ForkParams {
    pub fn request(&self) -> CallResult<(String, ForkRequest)> {
        let from = self.from_snapshot_id.as_deref().map(snapshot_id).transpose()?;
        Ok((session_path(&self.session_id, "/fork")?, ForkRequest { from, count: Some(self.count.unwrap_or(1)) }))
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposePortParams {
    /// The session's id (`ses_…`).
    pub session_id: String,
    /// The TCP port a server inside the sandbox listens on, e.g. 8000.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u32,
    /// `true`: anyone with the URL can reach it. Default `false`: requests need the returned
    /// token (header `X-Space-Port-Token` or query `space_token=`) or an API key.
    #[serde(default)]
    pub public: bool,
}

/// Body of `POST /v1/sessions/{id}/ports/{port}` (the ports contract of issue 15).
#[derive(Debug, serde::Serialize, PartialEq, Eq)]
pub struct ExposePortRequest {
    pub public: bool,
}

impl ExposePortParams {
    pub fn request(&self) -> CallResult<(String, ExposePortRequest)> {
        if !(1..=65535).contains(&self.port) {
            return Err(CallError::Invalid(format!("port {} is not a TCP port (1-65535)", self.port)));
        }
        let path = session_path(&self.session_id, &format!("/ports/{}", self.port))?;
        Ok((path, ExposePortRequest { public: self.public }))
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionParams {
    /// The session's id (`ses_…`).
    pub session_id: String,
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
