//! `space`: one binary for the server and the client.

mod bench;
mod build_context;
mod client;
mod cluster;
mod credentials;
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

const DEFAULT_DATA_DIR: &str = "/var/lib/space";
const DEFAULT_URL: &str = "http://127.0.0.1:7070";
/// The heading `--help` lists the flags every command takes under, apart from its own.
const GLOBAL: &str = "Global options";

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
    Serve(Box<serve::ServeArgs>),
    /// Run a control plane only (API, database, reconciler) over the node at --node.
    Control(Box<roles::ControlRoleArgs>),
    /// Check which runtimes this host can run (as root, no server needed) and what the others lack.
    Doctor(doctor::DoctorArgs),
    /// Create, list, show and destroy sessions.
    #[command(subcommand)]
    Session(sessions::SessionCommand),
    /// Store, list, rotate and delete credentials the gateway injects for sessions.
    #[command(subcommand)]
    Credential(credentials::CredentialCommand),
    /// Run a command in a session: `space exec ID -- CMD ARGS…`.
    Exec(exec::ExecArgs),
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
    Kill(process::KillArgs),
    /// Copy files into and out of a session.
    #[command(subcommand)]
    Files(files::FilesCommand),
    /// Take, list and delete session snapshots.
    #[command(subcommand)]
    Snapshot(snapshots::SnapshotCommand),
    /// Manage templates.
    #[command(subcommand)]
    Template(templates::TemplateCommand),
    /// Reach servers inside a session: forward a local port, open a port by token or to anyone.
    #[command(subcommand)]
    Port(ports::PortCommand),
    /// Create, list, revoke and rotate API keys.
    #[command(subcommand)]
    Key(keys::KeyCommand),
    /// Tenants' quotas on sessions, CPUs, memory and disk.
    #[command(subcommand)]
    Tenant(tenants::TenantCommand),
    /// Show the server's status.
    Status,
    /// Show or size the warm pool of ready sandboxes.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// The nodes that run sandboxes (needs the admin key).
    #[command(subcommand)]
    Node(NodeCommand),
    /// The blob store durable snapshots are kept in (needs the admin key).
    #[command(subcommand)]
    Blobs(BlobsCommand),
    /// The certificate authority control replicas and nodes authenticate each other with.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Measure create and exec latency through the API.
    Bench(bench::BenchArgs),
    /// Serve sessions as MCP tools to AI agents (stdio, or streamable HTTP with --listen).
    Mcp(mcp::McpArgs),
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

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
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

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Serve(args) = cli.command {
        serve::run(*args, cli.data_dir).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Node(NodeCommand::Run(args)) = cli.command {
        roles::run_node(*args, cli.data_dir).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Control(args) = cli.command {
        roles::run_control(*args, cli.data_dir).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Doctor(args) = cli.command {
        return doctor::run(args, cli.json).await;
    }
    if let Command::Cluster(command) = cli.command {
        // Files only: needs no server.
        cluster::run(command, &cli.data_dir)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Bench(args) = &cli.command
        && args.gateway_only
    {
        // Starts a server of its own: needs no key and no running server.
        bench::run_gateway_only(args).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let client = Client::new(&cli.url, cli.api_key.clone(), &cli.data_dir)?;
    let json = cli.json;
    match cli.command {
        Command::Serve(_)
        | Command::Node(NodeCommand::Run(_))
        | Command::Control(_)
        | Command::Doctor(_)
        | Command::Cluster(_) => unreachable!("handled above"),
        Command::Session(cmd) => sessions::run(&client, cmd, json).await?,
        Command::Credential(cmd) => credentials::run(&client, cmd, json).await?,
        Command::Exec(args) => return exec::run(&client, args).await,
        Command::Attach { id, pid } => return exec::attach(&client, &id, pid).await,
        Command::Kill(args) => process::kill(&client, args).await?,
        Command::Ps { id } => {
            let list: space_api::ProcessList = client.get_json(&format!("/v1/sessions/{id}/processes")).await?;
            output::print_processes(&list, json)?;
        }
        Command::Files(cmd) => files::run(&client, cmd, json).await?,
        Command::Template(cmd) => templates::run(&client, cmd, json).await?,
        Command::Snapshot(cmd) => snapshots::run(&client, cmd, json).await?,
        Command::Port(cmd) => ports::run(&client, cmd, json).await?,
        Command::Key(cmd) => keys::run(&client, cmd, json).await?,
        Command::Tenant(cmd) => tenants::run(&client, cmd, json).await?,
        Command::Bench(args) => bench::run(&client, args, &cli.data_dir).await?,
        Command::Mcp(args) => mcp::run(&client, args).await?,
        Command::Pool(PoolCommand::Show) => {
            output::print_pool(&client.get_json("/v1/pool").await?, json)?;
        }
        Command::Pool(PoolCommand::Set { template, size, runtime }) => {
            let path = format!("/v1/pool/{}", client::encode(&template));
            let pool = client.put_json(&path, &space_api::SetPoolSizeRequest { size, runtime }).await?;
            output::print_pool(&pool, json)?;
        }
        Command::Node(NodeCommand::List) => {
            output::print_nodes(&client.get_json("/v1/nodes").await?, json)?;
        }
        Command::Node(NodeCommand::Cordon { node }) => {
            let path = format!("/v1/nodes/{}/cordon", client::encode(&node));
            output::print_node(&client.post_json(&path, &serde_json::json!({})).await?, json)?;
        }
        Command::Node(NodeCommand::Uncordon { node }) => {
            let path = format!("/v1/nodes/{}/uncordon", client::encode(&node));
            output::print_node(&client.post_json(&path, &serde_json::json!({})).await?, json)?;
        }
        Command::Node(NodeCommand::Drain { node }) => {
            let path = format!("/v1/nodes/{}/drain", client::encode(&node));
            let report: space_api::DrainReport = client.post_json(&path, &serde_json::json!({})).await?;
            output::print_drain(&report, json)?;
            if !report.failed.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Blobs(BlobsCommand::Sweep) => {
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
        undocumented(&super::Cli::command(), "space", &mut missing);
        assert!(missing.is_empty(), "no help line: {missing:#?}");
    }

    #[test]
    fn the_cli_definition_is_valid() {
        super::Cli::command().debug_assert();
    }
}
