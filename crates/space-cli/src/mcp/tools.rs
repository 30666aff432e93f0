//! The MCP tools: one per thing an agent does with a session, each a call or two of the API.

use rmcp::handler::server::common::schema_for_type;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, Implementation, JsonObject, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use serde_json::Value;
use space_api::ExecResult;

use super::api::{CallResult, SpaceApi};
use super::params::{
    CreateSessionParams, ExposePortParams, ForkParams, ListFilesParams, ListSessionsParams, ReadFileParams,
    RestoreParams, RunCommandParams, SessionParams, SnapshotParams, WriteFileParams, parse, session_path,
};
use super::results::{background_result, exec_result, file_content, file_list, tool_result};

const INSTRUCTIONS: &str = "Sandboxes (sessions) of a space server: isolated Linux machines with \
their own filesystem, processes and network policy. Typical use: create_session, then run_command \
and read_file/write_file/list_files with its session_id; snapshot before a risky step and restore \
to go back; fork to try alternatives side by side; destroy_session when done (sessions keep \
running and using resources until destroyed). A sandbox reaches no network host unless \
create_session's `allow` lists it. Failed calls return isError with the API's error code.";

/// The MCP server: a client of one space API endpoint, with its key's authority.
#[derive(Clone)]
pub struct SpaceTools {
    api: SpaceApi,
    tool_router: ToolRouter<SpaceTools>,
}

impl SpaceTools {
    pub fn new(api: SpaceApi) -> SpaceTools {
        SpaceTools { api, tool_router: Self::tool_router() }
    }
}

/// Runs a tool body on parsed arguments; bad arguments and API errors become tool errors.
async fn call<T, F, Fut>(arguments: JsonObject, body: F) -> CallToolResult
where
    T: serde::de::DeserializeOwned,
    F: FnOnce(T) -> Fut,
    Fut: Future<Output = CallResult<Value>>,
{
    match parse::<T>(arguments) {
        Ok(params) => tool_result(body(params).await),
        Err(e) => tool_result(Err(e)),
    }
}

#[tool_router]
impl SpaceTools {
    #[tool(
        description = "Create a new sandbox session and wait until it runs. Returns the session \
            (its `id` is the session_id the other tools take). By default the sandbox has no \
            network access: list the hosts it needs in `allow`.",
        input_schema = schema_for_type::<CreateSessionParams>(),
        annotations(title = "Create a sandbox session", read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn create_session(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: CreateSessionParams| async move { self.api.post("/v1/sessions", &p.request()).await }).await
    }

    #[tool(
        description = "List your sessions (newest first) with their ids, states and templates.",
        input_schema = schema_for_type::<ListSessionsParams>(),
        annotations(title = "List sessions", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_sessions(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: ListSessionsParams| async move { self.api.get(&p.path()).await }).await
    }

    #[tool(
        description = "Run a command in a session and wait for it to exit. Returns exit_code, \
            stdout, stderr (each cut to max_output_bytes, with stdout_truncated / \
            stderr_truncated), timed_out and duration_ms. A non-zero exit code is a normal \
            result, not an error. With background=true it returns the pid at once.",
        input_schema = schema_for_type::<RunCommandParams>(),
        annotations(title = "Run a command", read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn run_command(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: RunCommandParams| async move {
            let background = p.background;
            let (path, request, max) = p.request()?;
            let result: ExecResult = self.api.post(&path, &request).await?;
            Ok(if background { background_result(result) } else { exec_result(result, max) })
        })
        .await
    }

    #[tool(
        description = "Read a file from a session. Returns its content as text (encoding \
            `utf-8`) or, for binary files, base64 (encoding `base64`), and whether it was cut \
            at max_bytes.",
        input_schema = schema_for_type::<ReadFileParams>(),
        annotations(title = "Read a file", read_only_hint = true, open_world_hint = false)
    )]
    async fn read_file(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: ReadFileParams| async move {
            let (path, max) = p.request()?;
            let (data, truncated) = self.api.get_bytes(&path, max).await?;
            Ok(file_content(&p.path, &data, truncated))
        })
        .await
    }

    #[tool(
        description = "Write a file in a session (created, or replaced whole), creating missing \
            parent directories. Returns its path and size in bytes.",
        input_schema = schema_for_type::<WriteFileParams>(),
        annotations(title = "Write a file", read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn write_file(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: WriteFileParams| async move {
            let (path, body) = p.request()?;
            self.api.put_bytes(&path, body).await
        })
        .await
    }

    #[tool(
        description = "List a directory in a session: each entry's name, path, type (file, dir, \
            symlink, other), size, octal mode and modification time (Unix ms).",
        input_schema = schema_for_type::<ListFilesParams>(),
        annotations(title = "List files", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_files(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: ListFilesParams| async move { Ok(file_list(self.api.get(&p.request()?).await?)) }).await
    }

    #[tool(
        description = "Snapshot a session: `disk` (the filesystem) or `full` (filesystem and \
            process memory). Returns the snapshot; pass its `id` to restore or fork.",
        input_schema = schema_for_type::<SnapshotParams>(),
        annotations(title = "Snapshot a session", read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn snapshot(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: SnapshotParams| async move {
            let (path, request) = p.request()?;
            self.api.post(&path, &request).await
        })
        .await
    }

    #[tool(
        description = "Return a session to one of its snapshots: files (and, for a full \
            snapshot, processes) become what they were; what changed since is lost. Returns \
            the session.",
        input_schema = schema_for_type::<RestoreParams>(),
        annotations(title = "Restore a snapshot", read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn restore(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: RestoreParams| async move {
            let (path, request) = p.request()?;
            self.api.post(&path, &request).await
        })
        .await
    }

    #[tool(
        description = "Fork a session: new, independent sessions that start as copies of it \
            (of its current filesystem, or of a snapshot). Returns the new sessions under \
            `sessions`.",
        input_schema = schema_for_type::<ForkParams>(),
        annotations(title = "Fork a session", read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn fork(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: ForkParams| async move {
            let (path, request) = p.request()?;
            self.api.post(&path, &request).await
        })
        .await
    }

    #[tool(
        description = "Make a TCP port of a session reachable over HTTP from outside the \
            sandbox (start the server first, e.g. run_command with background=true). Returns \
            `url`, `preview_url` (when the server has a preview domain) and the `token` that \
            private URLs need.",
        input_schema = schema_for_type::<ExposePortParams>(),
        annotations(title = "Expose a port", read_only_hint = false, destructive_hint = false, open_world_hint = true)
    )]
    async fn expose_port(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: ExposePortParams| async move {
            let (path, request) = p.request()?;
            self.api.post(&path, &request).await
        })
        .await
    }

    #[tool(
        description = "Destroy a session: its sandbox, files and snapshots are deleted for good. \
            Returns the session in state `destroyed`.",
        input_schema = schema_for_type::<SessionParams>(),
        annotations(title = "Destroy a session", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn destroy_session(&self, Parameters(arguments): Parameters<JsonObject>) -> CallToolResult {
        call(arguments, |p: SessionParams| async move { self.api.delete(&session_path(&p.session_id, "")?).await })
            .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SpaceTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("space", env!("CARGO_PKG_VERSION")).with_title("space sandboxes"))
            .with_instructions(INSTRUCTIONS)
    }
}
