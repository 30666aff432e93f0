//! What the exec, attach and watch WebSockets share: JSON text frames, the closing
//! handshake, and the idle timeout.

use std::pin::Pin;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use space_api::{ErrorCode, WsServerMessage};
use tokio::time::{Instant, Sleep, sleep};
use tracing::Instrument;

use crate::error::AppError;

/// `upgrade.on_upgrade(handle)`, with `handle` in the request's span: what it logs while the
/// socket is open carries the request's id (axum runs it on a task of its own).
pub(crate) fn on_upgrade<F, Fut>(upgrade: WebSocketUpgrade, handle: F) -> Response
where
    F: FnOnce(WebSocket) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let span = tracing::Span::current();
    upgrade.on_upgrade(move |socket| handle(socket).instrument(span))
}

pub(crate) async fn send_json(socket: &mut WebSocket, message: &WsServerMessage) -> Result<(), axum::Error> {
    let text = serde_json::to_string(message).unwrap_or_default();
    socket.send(Message::Text(text.into())).await
}

pub(crate) fn error_message(error: &AppError) -> WsServerMessage {
    WsServerMessage::Error { code: error.0.code, message: error.0.message.clone() }
}

pub(crate) async fn send_error(socket: &mut WebSocket, error: AppError) {
    let _ = send_json(socket, &error_message(&error)).await;
    close_gracefully(socket).await;
}

/// Sends a close frame and reads until the client closes too. Dropping the connection while
/// client frames (stdin, EOF) are still unread would make the kernel reset it, and the client
/// could lose the final `exit` message.
pub(crate) async fn close_gracefully(socket: &mut WebSocket) {
    let _ = socket.send(Message::Close(None)).await;
    let drain = async {
        while let Some(Ok(message)) = socket.recv().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
}

/// The idle timeout of a WebSocket: each socket holds a connection (and, for exec, a
/// process), so one that carries nothing for `timeout` is closed. Whoever sees traffic
/// calls [`Idle::reset`]; pings are traffic, so a client keeps a quiet socket open with them.
pub(crate) struct Idle {
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl Idle {
    pub(crate) fn new(timeout: Duration) -> Idle {
        Idle { timeout, deadline: Box::pin(sleep(timeout)) }
    }

    pub(crate) fn reset(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.timeout);
    }

    /// Resolves once `timeout` has passed since the last reset.
    pub(crate) async fn expired(&mut self) {
        self.deadline.as_mut().await;
    }

    /// What the client is told before the socket closes; `consequence` adds what else ends.
    pub(crate) fn error(&self, consequence: &str) -> AppError {
        AppError::new(
            ErrorCode::Timeout,
            format!(
                "nothing was sent or received on this WebSocket for {} s, so it is closed{consequence}; \
                 send WebSocket pings to keep a quiet socket open",
                self.timeout.as_secs()
            ),
        )
    }
}
