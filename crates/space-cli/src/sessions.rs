//! `space session …`

use std::collections::BTreeMap;

use anyhow::bail;
use clap::Subcommand;
use space_api::{
    CreateSessionRequest, EventList, ForkRequest, RestoreRequest, Session, SessionList, SnapshotPolicy,
    UpdateSessionRequest,
};

use crate::client::Client;
use crate::output::{self, SESSION_HEADER, print_json, print_session, print_table, session_row};

/// What `create` sets and `update` changes.
#[derive(clap::Args)]
pub struct Settings {
    /// Automatic snapshots, e.g. `disk=1m,full=15m,keep=1h,hourly=1d,daily=7d` or `off`
    /// (default at create: the server's).
    #[arg(long)]
    snapshot_policy: Option<SnapshotPolicy>,
    /// Suspend the session after this long without activity, e.g. `10m` (default: never;
    /// `update --idle-timeout 0s` turns it off).
    #[arg(long, value_parser = space_api::policy::parse_duration)]
    idle_timeout: Option<u64>,
    /// Destroy the session this long after its creation, e.g. `7d` (default: never;
    /// `update --max-age 0s` turns it off).
    #[arg(long, value_parser = space_api::policy::parse_duration)]
    max_age: Option<u64>,
}

#[derive(Subcommand)]
pub enum SessionCommand {
    /// Create a session; prints its id.
    Create {
        #[arg(long)]
        template: Option<String>,
        #[arg(long)]
        cpus: Option<f64>,
        /// Memory limit in MiB.
        #[arg(long)]
        memory: Option<u64>,
        /// Process limit.
        #[arg(long)]
        pids: Option<u32>,
        /// Environment variable for every command, `K=V` (repeatable).
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        #[command(flatten)]
        settings: Settings,
    },
    /// Change a session's settings.
    Update {
        id: String,
        #[command(flatten)]
        settings: Settings,
    },
    /// List your sessions.
    List {
        /// Include destroyed sessions.
        #[arg(long)]
        all: bool,
    },
    /// Show one session.
    Show { id: String },
    /// Destroy a session and its sandbox.
    Destroy { id: String },
    /// A session's state transitions and events.
    Events { id: String },
    /// Freeze every process of a session in place (memory stays on the node).
    Pause { id: String },
    /// Continue a paused or suspended session.
    Resume { id: String },
    /// Save the session's processes, memory and files in a full snapshot and free its sandbox
    /// (`resume` brings it back, also after a server restart).
    Suspend { id: String },
    /// Return a session to one of its snapshots.
    Restore { id: String, snapshot: String },
    /// New sessions that continue from a snapshot of this one; prints their ids.
    Fork {
        id: String,
        /// Snapshot to fork from (default: a new disk snapshot of the session as it is now).
        #[arg(long)]
        from: Option<String>,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
}

/// Prints a session's id and state (or the session as JSON).
fn print_state(session: &Session, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(session);
    }
    println!("{} {}", session.id, session.state.as_str());
    Ok(())
}

fn parse_env(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => bail!("--env takes K=V, got {pair:?}"),
        })
        .collect()
}

pub async fn run(client: &Client, command: SessionCommand, json: bool) -> anyhow::Result<()> {
    match command {
        SessionCommand::Create { template, cpus, memory, pids, env, settings } => {
            let env = parse_env(&env)?;
            let request = CreateSessionRequest {
                template,
                cpus,
                memory_mib: memory,
                pids,
                env,
                snapshot_policy: settings.snapshot_policy,
                idle_timeout_secs: settings.idle_timeout,
                max_age_secs: settings.max_age,
            };
            let session: Session = client.post_json("/v1/sessions", &request).await?;
            if json {
                print_json(&serde_json::json!({ "id": session.id, "session": session }))?;
            } else {
                println!("{}", session.id);
            }
        }
        SessionCommand::List { all } => {
            let list: SessionList = client.get_json(&format!("/v1/sessions?all={all}")).await?;
            if json {
                return print_json(&list);
            }
            let rows: Vec<Vec<String>> = list.sessions.iter().map(session_row).collect();
            print_table(&SESSION_HEADER, &rows);
        }
        SessionCommand::Show { id } => {
            let session: Session = client.get_json(&format!("/v1/sessions/{id}")).await?;
            print_session(&session, json)?;
        }
        SessionCommand::Destroy { id } => {
            print_state(&client.delete_json(&format!("/v1/sessions/{id}")).await?, json)?;
        }
        SessionCommand::Update { id, settings } => {
            let request = UpdateSessionRequest {
                snapshot_policy: settings.snapshot_policy,
                idle_timeout_secs: settings.idle_timeout,
                max_age_secs: settings.max_age,
            };
            let session: Session = client.patch_json(&format!("/v1/sessions/{id}"), &request).await?;
            print_session(&session, json)?;
        }
        SessionCommand::Pause { id } => {
            print_state(&client.post_json(&format!("/v1/sessions/{id}/pause"), &()).await?, json)?;
        }
        SessionCommand::Resume { id } => {
            print_state(&client.post_json(&format!("/v1/sessions/{id}/resume"), &()).await?, json)?;
        }
        SessionCommand::Suspend { id } => {
            print_state(&client.post_json(&format!("/v1/sessions/{id}/suspend"), &()).await?, json)?;
        }
        SessionCommand::Restore { id, snapshot } => {
            let request = RestoreRequest { snapshot: snapshot.parse()? };
            print_state(&client.post_json(&format!("/v1/sessions/{id}/restore"), &request).await?, json)?;
        }
        SessionCommand::Fork { id, from, count } => {
            let request = ForkRequest { from: from.map(|f| f.parse()).transpose()?, count: Some(count) };
            let list: SessionList = client.post_json(&format!("/v1/sessions/{id}/fork"), &request).await?;
            if json {
                return print_json(&list);
            }
            for session in &list.sessions {
                println!("{}", session.id);
            }
        }
        SessionCommand::Events { id } => {
            let events: EventList = client.get_json(&format!("/v1/sessions/{id}/events")).await?;
            if json {
                return print_json(&events);
            }
            let rows: Vec<Vec<String>> = events
                .events
                .iter()
                .map(|e| {
                    let change = match (e.from_state, e.to_state) {
                        (Some(f), Some(t)) => format!("{} -> {}", f.as_str(), t.as_str()),
                        (None, Some(t)) => t.as_str().to_owned(),
                        _ => String::new(),
                    };
                    vec![output::time(e.at), e.kind.clone(), change, e.message.clone().unwrap_or_default()]
                })
                .collect();
            print_table(&["TIME", "KIND", "STATE", "MESSAGE"], &rows);
        }
    }
    Ok(())
}
