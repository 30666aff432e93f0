//! `space files put|get|ls`

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use space_api::{FileList, WriteResult};
use std::io::Write;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::io::ReaderStream;

use crate::client::{Client, WS_KEEPALIVE, encode};
use crate::output::{bytes, print_json, print_table, time};

#[derive(Subcommand)]
pub enum FilesCommand {
    /// Upload LOCAL to REMOTE inside the session.
    Put { id: String, local: PathBuf, remote: String },
    /// Download REMOTE from the session to LOCAL (`-` for stdout).
    Get { id: String, remote: String, local: PathBuf },
    /// List a directory inside the session.
    Ls {
        id: String,
        #[arg(default_value = "/")]
        path: String,
    },
    /// Print changes under a directory as JSON lines until interrupted.
    Watch {
        id: String,
        path: String,
        #[arg(short, long)]
        recursive: bool,
    },
}

pub async fn run(client: &Client, command: FilesCommand, json: bool) -> anyhow::Result<()> {
    match command {
        FilesCommand::Put { id, local, remote } => {
            let file = tokio::fs::File::open(&local).await.with_context(|| format!("opening {}", local.display()))?;
            let body = reqwest::Body::wrap_stream(ReaderStream::with_capacity(file, 256 * 1024));
            let path = format!("/v1/sessions/{id}/files/content?path={}", encode(&remote));
            let request =
                client.request(Method::PUT, &path).header("content-type", "application/octet-stream").body(body);
            let result: WriteResult = client.send(request).await?.json().await?;
            if json {
                print_json(&result)?;
            } else {
                println!("{} ({})", result.path, bytes(result.bytes));
            }
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
                    vec![format!("{:o}", e.mode & 0o7777), bytes(e.size), time(e.modified_ms), name]
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
