//! The `space` command line, in two binaries. `space` is the client of the API; the commands
//! that run a server, a node or link their code (`serve`, `control`, `node run`, `doctor`,
//! `cluster`, `bench`, `mcp`) run in `space-server`, installed beside it, which `space` replaces
//! itself with. A short command such as `space exec` spends much of its life starting up, and a
//! binary's start-up grows with the code it links: relocating it touches every page of its
//! pointers.

mod bench;
mod build_context;
mod client;
mod cluster;
mod credentials;
mod deferred;
mod doctor;
mod errors;
mod exec;
mod files;
mod hint;
mod host;
mod keys;
mod mcp;
mod output;
mod ports;
mod process;
mod roles;
mod serve;
mod sessions;
mod snapshots;
mod template_build;
mod template_upload;
mod templates;
mod tenants;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::client::Client;
use crate::deferred::Deferred;

const DEFAULT_DATA_DIR: &str = "/var/lib/space";
const DEFAULT_URL: &str = "http://127.0.0.1:7070";
/// The heading `--help` lists the flags every command takes under, apart from its own.
const GLOBAL: &str = "Global options";
/// The binary the server commands run in, beside `space`.
const SERVER_BINARY: &str = "space-server";

#[derive(Parser)]
#[command(name = "space", version, about = "Secure, stateful sandboxes for long-running AI agents")]
struct Cli {
    /// API endpoint.
    #[arg(long, global = true, env = "SPACE_URL", help_heading = GLOBAL, default_value = DEFAULT_URL)]
    url: String,
    /// API key; defaults to the local server's admin key (DATA_DIR/admin.key).
    #[arg(long, global = true, env = "SPACE_API_KEY", help_heading = GLOBAL, hide_env_values = true)]
    api_key: Option<String>,
    /// Data directory of the local server (for `serve`, and to find its admin key).
    #[arg(long, global = true, env = "SPACE_DATA_DIR", help_heading = GLOBAL, default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// Print JSON instead of tables, and errors as `{"error":{"code","message","status"}}` on stderr.
    #[arg(long, global = true, help_heading = GLOBAL)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: control plane, node and API in one process.
    Serve(Deferred<Box<serve::ServeArgs>>),
    /// Run a control plane only (API, database, reconciler) over the node at --node.
    Control(Deferred<Box<roles::ControlRoleArgs>>),
    /// Check which runtimes this host can run (as root, no server needed) and what the others lack.
    Doctor(Deferred<doctor::DoctorArgs>),
    /// Create, list, show and destroy sessions.
    #[command(subcommand)]
    Session(Deferred<sessions::SessionCommand>),
    /// Store, list, rotate and delete credentials the gateway injects for sessions.
    #[command(subcommand)]
    Credential(Deferred<credentials::CredentialCommand>),
    /// Run a command in a session: `space exec ID -- CMD ARGS…`.
    Exec(Deferred<exec::ExecArgs>),
    /// Re-attach to a process started with `space exec -d`.
    Attach {
        /// Session id.
        id: String,
        /// Process id, as `space exec -d` printed it.
        pid: u32,
    },
    /// Processes started in a session.
    Ps {
        /// Session id.
        id: String,
    },
    /// Send a signal to a process started in a session (TERM unless `--signal` says otherwise).
    Kill(Deferred<process::KillArgs>),
    /// Copy files into and out of a session.
    #[command(subcommand)]
    Files(Deferred<files::FilesCommand>),
    /// Take, list and delete session snapshots.
    #[command(subcommand)]
    Snapshot(Deferred<snapshots::SnapshotCommand>),
    /// Manage templates.
    #[command(subcommand)]
    Template(Deferred<templates::TemplateCommand>),
    /// Reach servers inside a session: forward a local port, open a port by token or to anyone.
    #[command(subcommand)]
    Port(Deferred<ports::PortCommand>),
    /// Create, list, revoke and rotate API keys.
    #[command(subcommand)]
    Key(Deferred<keys::KeyCommand>),
    /// Tenants' quotas on sessions, CPUs, memory and disk.
    #[command(subcommand)]
    Tenant(Deferred<tenants::TenantCommand>),
    /// Show the server's status.
    Status,
    /// Show or size the warm pool of ready sandboxes.
    #[command(subcommand)]
    Pool(Deferred<PoolCommand>),
    /// The nodes that run sandboxes (needs the admin key).
    #[command(subcommand)]
    Node(Deferred<NodeCommand>),
    /// The blob store durable snapshots are kept in (needs the admin key).
    #[command(subcommand)]
    Blobs(Deferred<BlobsCommand>),
    /// The certificate authority control replicas and nodes authenticate each other with.
    #[command(subcommand)]
    Cluster(Deferred<cluster::ClusterCommand>),
    /// Measure create and exec latency through the API.
    Bench(Deferred<bench::BenchArgs>),
    /// Serve sessions as MCP tools to AI agents (stdio, or streamable HTTP with --listen).
    Mcp(Deferred<mcp::McpArgs>),
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Every node: state (ready while its lease holds, lost after), capacity, sessions, pools.
    List,
    /// Run a node only: sandboxes, warm pool and gateway, driven by `space control` over the
    /// node API (mutual TLS with the cluster's certificates; needs root, no key).
    Run(Box<roles::NodeRoleArgs>),
    /// Stop placing new sessions on NODE; resumes and forks from durable snapshots kept on it
    /// start on another node.
    Cordon {
        /// Node id (`space node list`).
        node: String,
    },
    /// Let NODE take new sessions again.
    Uncordon {
        /// Node id (`space node list`).
        node: String,
    },
    /// Cordon NODE and move every session off it: running and paused ones are suspended into
    /// the blob store and resumed on other nodes, suspended ones are stored there. Lists what
    /// it could not move, and why; run it again to move what is left.
    Drain {
        /// Node id (`space node list`).
        node: String,
    },
}

#[derive(Subcommand)]
enum BlobsCommand {
    /// Delete the objects no snapshot names any more (those of deleted snapshots and
    /// destroyed sessions) and at least 15 minutes old. Put off while a snapshot is being
    /// exported; the control plane also sweeps hourly.
    Sweep,
}

#[derive(Subcommand)]
enum PoolCommand {
    /// Per template: size, ready and filling pods, hits and misses.
    Show,
    /// Keep SIZE ready pods of TEMPLATE (needs the admin key; 0 turns the pool off).
    Set {
        /// Template name.
        template: String,
        /// Number of ready pods to keep.
        size: u32,
        /// The pool's runtime: `linux` or `vm` (default: the server's default runtime).
        #[arg(long)]
        runtime: Option<space_api::RuntimeKind>,
    },
}

/// The `space` binary: client commands here, the others in `space-server`.
pub fn client_main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    if runs_in_server(&cli.command) {
        errors::report(&exec_server(), cli.json);
        return ExitCode::FAILURE;
    }
    execute(cli, run_client)
}

/// The `space-server` binary: every command.
pub fn server_main() -> ExitCode {
    match Cli::try_parse() {
        Ok(cli) => execute(cli, run),
        Err(e) => usage_error(e),
    }
}

/// The commands only `space-server` links the code of.
fn runs_in_server(command: &Command) -> bool {
    matches!(
        command,
        Command::Serve(_)
            | Command::Control(_)
            | Command::Node(Deferred(NodeCommand::Run(_)))
            | Command::Doctor(_)
            | Command::Cluster(_)
            | Command::Bench(_)
            | Command::Mcp(_)
    )
}

/// Replaces this process with `space-server` beside it, given the same arguments: the pid,
/// stdio and signals stay the caller's, so whoever started `space serve` still controls the
/// server. Returns only when the exec failed.
fn exec_server() -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let path = host::beside_this_executable(SERVER_BINARY);
    let how =
        "this command runs in the space-server binary, installed beside `space` (scripts/install.sh installs both)";
    if is_this_executable(&path) {
        // A copy or link of `space` in its place would exec itself forever.
        return anyhow::anyhow!("{} is this `space` binary, not space-server: {how}", path.display());
    }
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(&path);
    // Usage lines and `ps` keep saying what the user typed.
    if let Some(arg0) = args.next() {
        command.arg0(arg0);
    }
    let e = command.args(args).exec();
    anyhow::Error::new(e).context(format!("starting {}: {how}", path.display()))
}

/// Whether `path` is the file this process runs.
fn is_this_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ours = std::fs::metadata("/proc/self/exe");
    matches!((ours, std::fs::metadata(path)), (Ok(a), Ok(b)) if (a.dev(), a.ino()) == (b.dev(), b.ino()))
}

/// Runs `run` on an async runtime sized for the command, and reports its error.
fn execute<F>(cli: Cli, run: impl FnOnce(Cli) -> F) -> ExitCode
where
    F: Future<Output = anyhow::Result<ExitCode>>,
{
    let json = cli.json;
    let runtime = match runtime_for(&cli.command) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli));
    // A blocking read of an interactive stdin never returns on its own; don't wait for it.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            errors::report(&e, json);
            ExitCode::FAILURE
        }
    }
}

/// Servers and the benchmark get a worker thread per core. A command that makes a request or
/// two and exits gets one worker, which starts faster (one thread, no CPU quota read); one, not
/// none: `exec` writes its output from the main thread, and while a full pipe blocks that
/// write, keep-alives, Ctrl-C and stdin must still go on the worker.
fn runtime_for(command: &Command) -> std::io::Result<tokio::runtime::Runtime> {
    match command {
        Command::Exec(_) | Command::Attach { .. } | Command::Kill(_) | Command::Ps { .. } => {
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()
        }
        _ => tokio::runtime::Runtime::new(),
    }
}

/// Prints clap's message, and how to fix an `exec` whose command is missing its `--`: as one
/// JSON error line when `--json` was asked for (help and `--version` stay text).
fn usage_error(e: clap::Error) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let hint = if e.use_stderr() { hint::missing_double_dash(&args) } else { None };
    if e.use_stderr() && errors::json_requested(&args) {
        eprintln!("{}", errors::usage_json(&e.render().to_string(), hint.as_deref()));
    } else {
        let _ = e.print();
        if let Some(hint) = hint {
            eprintln!("\nhint: {hint}");
        }
    }
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

/// Every command: the server's, then the client's.
async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let json = cli.json;
    match cli.command {
        Command::Serve(Deferred(args)) => serve::run(*args, cli.data_dir).await?,
        Command::Node(Deferred(NodeCommand::Run(args))) => roles::run_node(*args, cli.data_dir).await?,
        Command::Control(Deferred(args)) => roles::run_control(*args, cli.data_dir).await?,
        Command::Doctor(Deferred(args)) => return doctor::run(args, json).await,
        // Files only: needs no server.
        Command::Cluster(Deferred(command)) => cluster::run(command, &cli.data_dir)?,
        // Starts a server of its own: needs no key and no running server.
        Command::Bench(Deferred(args)) if args.gateway_only => bench::run_gateway_only(&args).await?,
        Command::Bench(Deferred(args)) => {
            let client = Client::new(&cli.url, cli.api_key.clone(), &cli.data_dir)?;
            bench::run(&client, args, &cli.data_dir).await?
        }
        Command::Mcp(Deferred(args)) => {
            mcp::run(&Client::new(&cli.url, cli.api_key.clone(), &cli.data_dir)?, args).await?
        }
        _ => return run_client(cli).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// The commands of the API's client.
async fn run_client(cli: Cli) -> anyhow::Result<ExitCode> {
    let client = Client::new(&cli.url, cli.api_key.clone(), &cli.data_dir)?;
    let json = cli.json;
    match cli.command {
        Command::Serve(_)
        | Command::Control(_)
        | Command::Node(Deferred(NodeCommand::Run(_)))
        | Command::Doctor(_)
        | Command::Cluster(_)
        | Command::Bench(_)
        | Command::Mcp(_) => unreachable!("`space` hands these to {SERVER_BINARY}, which runs them in `run`"),
        Command::Session(Deferred(cmd)) => sessions::run(&client, cmd, json).await?,
        Command::Credential(Deferred(cmd)) => credentials::run(&client, cmd, json).await?,
        Command::Exec(Deferred(args)) => return exec::run(&client, args).await,
        Command::Attach { id, pid } => return exec::attach(&client, &id, pid).await,
        Command::Kill(Deferred(args)) => process::kill(&client, args).await?,
        Command::Ps { id } => {
            let list: space_api::ProcessList = client.get_json(&format!("/v1/sessions/{id}/processes")).await?;
            output::print_processes(&list, json)?;
        }
        Command::Files(Deferred(cmd)) => files::run(&client, cmd, json).await?,
        Command::Template(Deferred(cmd)) => templates::run(&client, cmd, json).await?,
        Command::Snapshot(Deferred(cmd)) => snapshots::run(&client, cmd, json).await?,
        Command::Port(Deferred(cmd)) => ports::run(&client, cmd, json).await?,
        Command::Key(Deferred(cmd)) => keys::run(&client, cmd, json).await?,
        Command::Tenant(Deferred(cmd)) => tenants::run(&client, cmd, json).await?,
        Command::Pool(Deferred(PoolCommand::Show)) => {
            output::print_pool(&client.get_json("/v1/pool").await?, json)?;
        }
        Command::Pool(Deferred(PoolCommand::Set { template, size, runtime })) => {
            let path = format!("/v1/pool/{}", client::encode(&template));
            let pool = client.put_json(&path, &space_api::SetPoolSizeRequest { size, runtime }).await?;
            output::print_pool(&pool, json)?;
        }
        Command::Node(Deferred(NodeCommand::List)) => {
            output::print_nodes(&client.get_json("/v1/nodes").await?, json)?;
        }
        Command::Node(Deferred(NodeCommand::Cordon { node })) => {
            let path = format!("/v1/nodes/{}/cordon", client::encode(&node));
            output::print_node(&client.post_json(&path, &serde_json::json!({})).await?, json)?;
        }
        Command::Node(Deferred(NodeCommand::Uncordon { node })) => {
            let path = format!("/v1/nodes/{}/uncordon", client::encode(&node));
            output::print_node(&client.post_json(&path, &serde_json::json!({})).await?, json)?;
        }
        Command::Node(Deferred(NodeCommand::Drain { node })) => {
            let path = format!("/v1/nodes/{}/drain", client::encode(&node));
            let report: space_api::DrainReport = client.post_json(&path, &serde_json::json!({})).await?;
            output::print_drain(&report, json)?;
            if !report.failed.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Blobs(Deferred(BlobsCommand::Sweep)) => {
            let report = client.post_json("/v1/blobs/sweep", &serde_json::json!({})).await?;
            output::print_blob_sweep(&report, json)?;
        }
        Command::Status => {
            let status: space_api::Status = client.get_json("/v1/status").await?;
            output::print_status(&status, json)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand, flag and argument of `space` that lacks a help line, by its path.
    fn undocumented(command: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if !arg.is_hide_set() && arg.get_help().is_none() && !matches!(id, "help" | "version") {
                out.push(format!("{path} {id}"));
            }
        }
        for sub in command.get_subcommands() {
            let sub_path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() {
                out.push(sub_path.clone());
            }
            undocumented(sub, &sub_path, out);
        }
    }

    #[test]
    fn every_command_flag_and_argument_has_a_help_line() {
        let mut missing = Vec::new();
        let mut cli = super::Cli::command();
        // Builds the deferred commands' flags too.
        cli.build();
        let serve = cli.find_subcommand("serve").expect("serve");
        assert!(serve.get_arguments().any(|a| a.get_id() == "listen"), "serve's flags were not built");
        undocumented(&cli, "space", &mut missing);
        assert!(missing.is_empty(), "no help line: {missing:#?}");
    }

    #[test]
    fn commands_keep_their_own_description_when_their_flags_are_built() {
        let unbuilt = super::Cli::command();
        let mut built = super::Cli::command();
        built.build();
        for command in unbuilt.get_subcommands() {
            let after = built.find_subcommand(command.get_name()).expect("same commands");
            let about = |c: &clap::Command| c.get_about().map(|a| a.to_string());
            assert_eq!(about(command), about(after), "{}", command.get_name());
        }
    }

    #[test]
    fn the_cli_definition_is_valid() {
        super::Cli::command().debug_assert();
    }
}
