//! `space exec [-t] ID -- CMD ARGS…` over the exec WebSocket.

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use futures::{SinkExt, StreamExt};
use nix::sys::termios::{self, SetArg, Termios};
use space_api::{ExecRequest, ExecResult, ExecStart, TermSize, WsClientMessage, WsServerMessage};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;

use crate::client::{Client, WS_KEEPALIVE, WsStream};

#[derive(Args)]
pub struct ExecArgs {
    /// Allocate a terminal (interactive: raw mode, resize).
    #[arg(short = 't', long)]
    tty: bool,
    /// Forward stdin even when it is a terminal.
    #[arg(short = 'i', long)]
    interactive: bool,
    /// Environment variable, `K=V` (repeatable).
    #[arg(short = 'e', long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(short = 'w', long)]
    cwd: Option<String>,
    /// Kill the command after this long, e.g. `30s`, `10m`, `500ms` or a number of seconds.
    #[arg(long, value_name = "DURATION", value_parser = crate::units::parse_millis)]
    timeout: Option<u64>,
    /// Start in the background and print its pid; re-attach with `space attach ID PID`.
    #[arg(short = 'd', long, conflicts_with = "tty")]
    detach: bool,
    /// Session id.
    id: String,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    cmd: Vec<String>,
}

/// Restores the terminal when dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).context("reading terminal settings")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).context("setting raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

fn terminal_size() -> TermSize {
    let mut ws = nix::libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the valid, exclusively borrowed `ws`.
    let rc = unsafe { nix::libc::ioctl(1, nix::libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_row > 0 {
        TermSize { rows: ws.ws_row, cols: ws.ws_col }
    } else {
        TermSize { rows: 24, cols: 80 }
    }
}

pub async fn run(client: &Client, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let mut env = std::collections::BTreeMap::new();
    for pair in &args.env {
        let Some((k, v)) = pair.split_once('=') else { bail!("--env takes K=V, got {pair:?}") };
        env.insert(k.to_owned(), v.to_owned());
    }
    if args.detach {
        return detach(client, &args, env).await;
    }
    let forward_stdin = args.tty || args.interactive || !std::io::stdin().is_terminal();
    let start = ExecStart {
        cmd: args.cmd.clone(),
        env,
        cwd: args.cwd.clone(),
        uid: None,
        gid: None,
        timeout_ms: args.timeout,
        tty: args.tty.then(terminal_size),
        stdin: forward_stdin,
    };
    let mut socket = client.websocket(&format!("/v1/sessions/{}/exec/ws", args.id)).await?;
    socket.send(Message::Text(serde_json::to_string(&start)?.into())).await?;
    relay(socket, args.tty, forward_stdin).await
}

/// `space attach ID PID`: output of a (background) process, buffered then live, and its exit.
pub async fn attach(client: &Client, id: &str, pid: u32) -> anyhow::Result<ExitCode> {
    let socket = client.websocket(&format!("/v1/sessions/{id}/processes/{pid}/attach")).await?;
    relay(socket, false, false).await
}

async fn detach(
    client: &Client,
    args: &ExecArgs,
    env: std::collections::BTreeMap<String, String>,
) -> anyhow::Result<ExitCode> {
    let request = ExecRequest {
        cmd: args.cmd.clone(),
        env,
        cwd: args.cwd.clone(),
        timeout_ms: args.timeout,
        background: true,
        ..Default::default()
    };
    let result: ExecResult = client.post_json(&format!("/v1/sessions/{}/exec", args.id), &request).await?;
    println!("{}", result.pid);
    Ok(ExitCode::SUCCESS)
}

/// Copies between the terminal and an exec or attach WebSocket; returns the command's exit code.
async fn relay(socket: WsStream, tty: bool, forward_stdin: bool) -> anyhow::Result<ExitCode> {
    let _raw = if tty && std::io::stdin().is_terminal() { Some(RawMode::enter()?) } else { None };
    let (mut sink, mut stream) = socket.split();
    let (input_tx, mut input_rx) = tokio::sync::mpsc::channel::<Message>(16);
    if forward_stdin {
        tokio::spawn(pump_stdin(input_tx.clone(), tty));
    }
    // The handlers are installed here, before any output is shown, not in the tasks: a Ctrl-C
    // right after the first output would otherwise find SIGINT's default and end the CLI.
    use tokio::signal::unix::{SignalKind, signal};
    if tty {
        tokio::spawn(forward_resizes(signal(SignalKind::window_change())?, input_tx.clone()));
    } else {
        // In raw mode a terminal's Ctrl-C reaches the process as a byte; here it is our SIGINT.
        tokio::spawn(forward_interrupts(signal(SignalKind::interrupt())?, input_tx.clone()));
    }
    tokio::spawn(keep_alive(input_tx.clone()));
    drop(input_tx);
    tokio::spawn(async move {
        while let Some(message) = input_rx.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
    });

    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    while let Some(message) = stream.next().await {
        match message? {
            Message::Binary(bytes) if !bytes.is_empty() => {
                let (channel, data) = (bytes[0], &bytes[1..]);
                if channel == 2 {
                    stderr.write_all(data)?;
                    stderr.flush()?;
                } else {
                    stdout.write_all(data)?;
                    stdout.flush()?;
                }
            }
            Message::Text(text) => match serde_json::from_str::<WsServerMessage>(&text)? {
                WsServerMessage::Started { .. } => {}
                WsServerMessage::Exit { exit_code, signal, timed_out, oom_killed } => {
                    drop(_raw);
                    if oom_killed {
                        eprintln!("space: the sandbox ran out of memory and the kernel killed a process");
                    }
                    if timed_out {
                        eprintln!("space: command timed out");
                        return Ok(ExitCode::from(124));
                    }
                    let code = exit_code.unwrap_or_else(|| 128 + signal.unwrap_or(0));
                    return Ok(ExitCode::from(code.clamp(0, 255) as u8));
                }
                WsServerMessage::Error { message, .. } => bail!("{message}"),
            },
            Message::Close(_) => break,
            _ => {}
        }
    }
    bail!("the connection closed before the command finished")
}

/// Pings the server now and then, so that a command that is quiet for long keeps its socket.
async fn keep_alive(tx: tokio::sync::mpsc::Sender<Message>) {
    let mut ticks = tokio::time::interval(WS_KEEPALIVE);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        if tx.send(Message::Ping(Vec::new().into())).await.is_err() {
            return;
        }
    }
}

/// Forwards stdin, then its end. On a terminal the server ends input with a Ctrl-D, which
/// the line discipline reads as end of file only at the start of a line: after a last line
/// with no newline (`printf abc | space exec -t …`) it only flushes that line, and the command
/// would wait forever, so a second end follows.
async fn pump_stdin(tx: tokio::sync::mpsc::Sender<Message>, tty: bool) {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    let mut mid_line = false;
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                mid_line = buf[n - 1] != b'\n';
                if tx.send(Message::Binary(buf[..n].to_vec().into())).await.is_err() {
                    return;
                }
            }
        }
    }
    let eof = serde_json::to_string(&WsClientMessage::Eof).unwrap_or_default();
    for _ in 0..if tty && mid_line { 2 } else { 1 } {
        if tx.send(Message::Text(eof.clone().into())).await.is_err() {
            return;
        }
    }
}

/// The first Ctrl-C sends the command SIGINT, as a local one would get; a second one, for a
/// command that ignores it, kills it; a third one gives up on the server and exits.
async fn forward_interrupts(mut interrupts: tokio::signal::unix::Signal, tx: tokio::sync::mpsc::Sender<Message>) {
    for signal in [2, 9] {
        if interrupts.recv().await.is_none() {
            return;
        }
        if signal == 9 {
            eprintln!("space: killing the command");
        }
        let text = serde_json::to_string(&WsClientMessage::Signal { signal }).unwrap_or_default();
        if tx.send(Message::Text(text.into())).await.is_err() {
            return;
        }
    }
    if interrupts.recv().await.is_some() {
        std::process::exit(130);
    }
}

async fn forward_resizes(mut winch: tokio::signal::unix::Signal, tx: tokio::sync::mpsc::Sender<Message>) {
    while winch.recv().await.is_some() {
        let size = terminal_size();
        let resize = WsClientMessage::Resize { rows: size.rows, cols: size.cols };
        let text = serde_json::to_string(&resize).unwrap_or_default();
        if tx.send(Message::Text(text.into())).await.is_err() {
            return;
        }
    }
}
