//! `space port`: reach servers inside a session (forward, open, list, close).

use std::net::SocketAddr;

use anyhow::Context;
use clap::Subcommand;
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use space_api::{OpenPortRequest, PortAccess, PortList};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use crate::client::{Client, WS_KEEPALIVE};
use crate::output;

/// Bytes of a local connection read per WebSocket message.
const CHUNK: usize = 64 << 10;

#[derive(Subcommand)]
pub enum PortCommand {
    /// Forward a local TCP port to PORT inside the session, like `kubectl port-forward`:
    /// runs until interrupted; each local connection is one connection inside.
    Forward {
        /// Session id.
        id: String,
        /// Port a server listens on inside the session.
        port: u16,
        /// Local address to listen on (default: 127.0.0.1 and the same port).
        #[arg(long, value_name = "ADDR")]
        local: Option<String>,
    },
    /// Give PORT a token (printed, with its URLs) that reaches it without the API key; with
    /// `--public`, anyone reaches it. Any token it had stops working.
    Open {
        /// Session id.
        id: String,
        /// Port a server listens on inside the session.
        port: u16,
        /// No key or token needed.
        #[arg(long)]
        public: bool,
    },
    /// Ports of the session opened by `space port open`.
    List {
        /// Session id.
        id: String,
    },
    /// Undo `space port open`: only the API key reaches PORT again.
    Close {
        /// Session id.
        id: String,
        /// Port a server listens on inside the session.
        port: u16,
    },
}

pub async fn run(client: &Client, command: PortCommand, json: bool) -> anyhow::Result<()> {
    match command {
        PortCommand::Forward { id, port, local } => forward(client, &id, port, local.as_deref()).await,
        PortCommand::Open { id, port, public } => {
            let access: PortAccess =
                client.post_json(&format!("/v1/sessions/{id}/ports/{port}"), &OpenPortRequest { public }).await?;
            output::print_port_access(&access, json)
        }
        PortCommand::List { id } => {
            let list: PortList = client.get_json(&format!("/v1/sessions/{id}/ports")).await?;
            output::print_ports(&list, json)
        }
        PortCommand::Close { id, port } => {
            client.send(client.request(Method::DELETE, &format!("/v1/sessions/{id}/ports/{port}"))).await?;
            Ok(())
        }
    }
}

async fn forward(client: &Client, id: &str, port: u16, local: Option<&str>) -> anyhow::Result<()> {
    let local = local_address(local, port)?;
    // Fail now, not at the first connection, if the session or port is wrong.
    let probe = client.websocket(&format!("/v1/sessions/{id}/tunnel/{port}")).await?;
    drop(probe);
    let listener = TcpListener::bind(local).await.with_context(|| format!("listening on {local}"))?;
    eprintln!("Forwarding {} -> port {port} of {id} (Ctrl-C to stop)", listener.local_addr()?);
    loop {
        let (connection, peer) = listener.accept().await?;
        let (client, path) = (client.clone(), format!("/v1/sessions/{id}/tunnel/{port}"));
        tokio::spawn(async move {
            if let Err(e) = tunnel(&client, &path, connection).await {
                eprintln!("connection from {peer}: {e:#}");
            }
        });
    }
}

/// `ADDR`, `HOST:PORT` or `PORT`; default `127.0.0.1:<port>`.
fn local_address(local: Option<&str>, port: u16) -> anyhow::Result<SocketAddr> {
    let value = local.map(str::to_owned).unwrap_or_else(|| port.to_string());
    if let Ok(only_port) = value.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], only_port)));
    }
    value.parse().with_context(|| format!("--local {value:?}: expected PORT or ADDRESS:PORT (e.g. 127.0.0.1:8000)"))
}

/// Carries one local connection over its own WebSocket tunnel.
async fn tunnel(client: &Client, path: &str, connection: TcpStream) -> anyhow::Result<()> {
    let socket = client.websocket(path).await?;
    let (mut ws_tx, mut ws_rx) = socket.split();
    let (mut read, mut write) = connection.into_split();
    let mut buffer = vec![0u8; CHUNK];
    let mut keepalive = tokio::time::interval(WS_KEEPALIVE);
    loop {
        tokio::select! {
            n = read.read(&mut buffer) => match n? {
                0 => break,
                n => ws_tx.send(Message::Binary(buffer[..n].to_vec().into())).await?,
            },
            message = ws_rx.next() => match message.transpose()? {
                Some(Message::Binary(data)) => write.write_all(&data).await?,
                Some(Message::Close(_)) | None => return Ok(()),
                Some(_) => {}
            },
            _ = keepalive.tick() => ws_tx.send(Message::Ping(Default::default())).await?,
        }
    }
    ws_tx.send(Message::Close(None)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_addresses() {
        assert_eq!(local_address(None, 8000).unwrap(), "127.0.0.1:8000".parse().unwrap());
        assert_eq!(local_address(Some("9000"), 8000).unwrap(), "127.0.0.1:9000".parse().unwrap());
        assert_eq!(local_address(Some("0.0.0.0:1"), 8000).unwrap(), "0.0.0.0:1".parse().unwrap());
        assert!(local_address(Some("nope"), 8000).is_err());
    }
}
