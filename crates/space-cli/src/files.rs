//! `space files put|get|ls|rm|mkdir|mv|watch`

mod upload;

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use space_api::{FileList, MoveRequest};
use std::io::Write;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;

use crate::client::{Client, WS_KEEPALIVE, encode};
use crate::output::{ago, bytes, print_json, print_table};

#[derive(Subcommand)]
pub enum FilesCommand {
    /// Upload LOCAL to REMOTE: a file, a directory (recursively, REMOTE becomes that directory) or `-` (stdin).
    Put {
        /// Session id.
        id: String,
        /// Local file or directory, or `-` to stream stdin.
        local: PathBuf,
        /// Path inside the session (a directory's contents go under it; it is made if missing).
        remote: String,
    },
    /// Download REMOTE from the session to LOCAL (`-` for stdout).
    Get {
        /// Session id.
        id: String,
        /// File inside the session.
        remote: String,
        /// Local file to write, or `-` for stdout.
        local: PathBuf,
    },
    /// List a directory inside the session.
    Ls {
        /// Session id.
        id: String,
        /// Directory inside the session.
        #[arg(default_value = "/")]
        path: String,
    },
    /// Remove a file, or a directory with `-r`.
    Rm {
        /// Session id.
        id: String,
        /// Path inside the session.
        path: String,
        /// Remove a directory and everything under it.
        #[arg(short, long)]
        recursive: bool,
    },
    /// Make a directory and its missing parents (like `mkdir -p`).
    Mkdir {
        /// Session id.
        id: String,
        /// Directory to make inside the session.
        path: String,
    },
    /// Move or rename a file or directory inside the session.
    Mv {
        /// Session id.
        id: String,
        /// Path to move.
        from: String,
        /// Its new path.
        to: String,
    },
    /// Print changes under a directory as JSON lines until interrupted.
    Watch {
        /// Session id.
        id: String,
        /// Directory to watch inside the session.
        path: String,
        /// Also watch its subdirectories.
        #[arg(short, long)]
        recursive: bool,
    },
}

pub async fn run(client: &Client, command: FilesCommand, json: bool) -> anyhow::Result<()> {
    match command {
        FilesCommand::Put { id, local, remote } => {
            let results = upload::put(client, &id, &local, &remote).await?;
            if json {
                print_json(&results)?;
            } else {
                for result in &results {
                    println!("{} ({})", result.path, bytes(result.bytes));
                }
            }
        }
        FilesCommand::Rm { id, path, recursive } => {
            let path = format!("/v1/sessions/{id}/files?path={}&recursive={recursive}", encode(&path));
            client.send(client.request(Method::DELETE, &path)).await?;
        }
        FilesCommand::Mkdir { id, path } => upload::mkdir(client, &id, &path).await?,
        FilesCommand::Mv { id, from, to } => {
            let path = format!("/v1/sessions/{id}/files/move");
            client.send(client.request(Method::POST, &path).json(&MoveRequest { from, to })).await?;
        }
        FilesCommand::Get { id, remote, local } => {
            let path = format!("/v1/sessions/{id}/files/content?path={}", encode(&remote));
            let response = client.send(client.request(Method::GET, &path)).await?;
            let mut stream = response.bytes_stream();
            let mut out: Box<dyn tokio::io::AsyncWrite + Unpin> = if local.as_os_str() == "-" {
                Box::new(tokio::io::stdout())
            } else {
                Box::new(
                    tokio::fs::File::create(&local).await.with_context(|| format!("creating {}", local.display()))?,
                )
            };
            while let Some(chunk) = stream.next().await {
                out.write_all(&chunk?).await?;
            }
            out.flush().await?;
        }
        FilesCommand::Ls { id, path } => {
            let list: FileList =
                client.get_json(&format!("/v1/sessions/{id}/files/list?path={}", encode(&path))).await?;
            if json {
                return print_json(&list);
            }
            let rows: Vec<Vec<String>> = list
                .entries
                .iter()
                .map(|e| {
                    let name = match &e.symlink_target {
                        Some(target) => format!("{} -> {target}", e.name),
                        None => e.name.clone(),
                    };
                    vec![format!("{:o}", e.mode & 0o7777), bytes(e.size), ago(e.modified_ms), name]
                })
                .collect();
            print_table(&["MODE", "SIZE", "MODIFIED", "NAME"], &rows);
        }
        FilesCommand::Watch { id, path, recursive } => {
            let url = format!("/v1/sessions/{id}/watch?path={}&recursive={recursive}", encode(&path));
            let mut socket = client.websocket(&url).await?;
            // Pings keep a watch on a quiet directory open (the server closes idle sockets).
            let mut keep_alive = tokio::time::interval(WS_KEEPALIVE);
            keep_alive.tick().await;
            loop {
                let message = tokio::select! {
                    message = socket.next() => message,
                    _ = keep_alive.tick() => {
                        socket.send(Message::Ping(Vec::new().into())).await?;
                        continue;
                    }
                };
                let Some(message) = message else { break };
                match message? {
                    Message::Text(text) => {
                        let mut stdout = std::io::stdout();
                        writeln!(stdout, "{text}")?;
                        stdout.flush()?;
                    }
                    Message::Close(_) => break,
                    _ => {}
                }
            }
        }
    }
    Ok(())
}
