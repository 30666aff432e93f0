//! `space snapshot …`

use clap::{Subcommand, ValueEnum};
use space_api::{CreateSnapshotRequest, Snapshot, SnapshotKind, SnapshotList};

use crate::client::Client;
use crate::output::{self, print_json, print_table};

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot a running or paused session; prints the snapshot id.
    Create {
        /// Session id.
        id: String,
        /// `disk` (files only) or `full` (files and memory).
        #[arg(long, value_enum, default_value_t = Kind::Disk)]
        kind: Kind,
        /// Named snapshots are never pruned by the schedule.
        #[arg(long)]
        name: Option<String>,
        /// Keep it when the session is destroyed, until it is deleted (new sessions can
        /// still be forked from it); never pruned by the schedule.
        #[arg(long)]
        outlive_session: bool,
    },
    /// A session's snapshots, oldest first.
    List {
        /// Session id.
        id: String,
    },
    /// One snapshot, with the bytes only it holds on disk (what deleting it frees).
    Show {
        /// Session id.
        id: String,
        /// Snapshot id.
        snapshot: String,
    },
    /// Delete a snapshot.
    Delete {
        /// Session id.
        id: String,
        /// Snapshot id.
        snapshot: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Kind {
    /// The root filesystem.
    Disk,
    /// Root filesystem and every process's memory (CRIU).
    Full,
}

pub async fn run(client: &Client, command: SnapshotCommand, json: bool) -> anyhow::Result<()> {
    match command {
        SnapshotCommand::Create { id, kind, name, outlive_session } => {
            let kind = match kind {
                Kind::Disk => SnapshotKind::Disk,
                Kind::Full => SnapshotKind::Full,
            };
            let request = CreateSnapshotRequest { kind: Some(kind), name, outlives_session: Some(outlive_session) };
            let snapshot: Snapshot = client.post_json(&format!("/v1/sessions/{id}/snapshots"), &request).await?;
            if json {
                return print_json(&snapshot);
            }
            println!("{}", snapshot.id);
        }
        SnapshotCommand::List { id } => {
            let list: SnapshotList = client.get_json(&format!("/v1/sessions/{id}/snapshots")).await?;
            if json {
                return print_json(&list);
            }
            let rows: Vec<Vec<String>> = list
                .snapshots
                .iter()
                .map(|s| {
                    vec![
                        s.id.to_string(),
                        s.kind.as_str().to_owned(),
                        output::ago(s.created_at),
                        s.size_bytes.map(output::bytes).unwrap_or_else(|| "-".into()),
                        s.parent.as_ref().map(|p| p.to_string()).unwrap_or_default(),
                        s.name.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            print_table(&["ID", "KIND", "CREATED", "SIZE", "PARENT", "NAME"], &rows);
        }
        SnapshotCommand::Show { id, snapshot } => {
            let s: Snapshot = client.get_json(&format!("/v1/sessions/{id}/snapshots/{snapshot}")).await?;
            if json {
                return print_json(&s);
            }
            let size = |n: Option<u64>| n.map(output::bytes).unwrap_or_else(|| "-".into());
            println!("id        {}\nkind      {}\ncreated   {}", s.id, s.kind.as_str(), output::time(s.created_at));
            println!("size      {}\nexclusive {}", size(s.size_bytes), size(s.exclusive_bytes));
        }
        SnapshotCommand::Delete { id, snapshot } => {
            client
                .send(client.request(reqwest::Method::DELETE, &format!("/v1/sessions/{id}/snapshots/{snapshot}")))
                .await?;
        }
    }
    Ok(())
}
