//! Handshake and yamux multiplexing over one byte stream.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::task::Poll;

use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{Decoder, Encoder, Framed};
use tokio_util::compat::TokioAsyncReadCompatExt;
use tokio_util::sync::CancellationToken;

use crate::codec::{Frame, FrameCodec, FrameError};
use crate::stream::MuxStream;

/// Bumped on every incompatible change to [`crate::messages`] or the framing.
pub const PROTOCOL_VERSION: u16 = 1;

/// A yamux stream carrying [`Frame`]s.
pub type FramedStream = Framed<MuxStream, FrameCodec>;

/// The first frame each side sends on a fresh connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u16,
    pub agent: String,
}

#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    #[error("handshake failed: {0}")]
    Handshake(String),
    #[error("peer speaks protocol {peer}, this side speaks {PROTOCOL_VERSION}")]
    VersionMismatch { peer: u16 },
    #[error("connection to the sandbox agent is closed")]
    Closed,
    #[error("multiplexer: {0}")]
    Yamux(String),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Exchanges [`Hello`] frames; returns the peer's. Reads exactly one frame, so bytes the peer
/// sends after it stay in the socket for the multiplexer.
pub async fn handshake<T>(io: &mut T, agent: &str) -> Result<Hello, MuxError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let ours = Frame::message(&Hello { protocol: PROTOCOL_VERSION, agent: agent.to_owned() })?;
    let mut out = bytes::BytesMut::new();
    FrameCodec.encode(ours, &mut out)?;
    io.write_all(&out).await.map_err(|e| MuxError::Handshake(e.to_string()))?;
    io.flush().await.map_err(|e| MuxError::Handshake(e.to_string()))?;

    let mut header = [0u8; 6];
    io.read_exact(&mut header).await.map_err(|e| MuxError::Handshake(e.to_string()))?;
    let len = u32::from_le_bytes([header[2], header[3], header[4], header[5]]) as usize;
    if len > 4096 {
        return Err(MuxError::Handshake(format!("hello frame of {len} bytes")));
    }
    let mut buf = bytes::BytesMut::from(&header[..]);
    buf.resize(6 + len, 0);
    io.read_exact(&mut buf[6..]).await.map_err(|e| MuxError::Handshake(e.to_string()))?;
    let frame = FrameCodec.decode(&mut buf)?.ok_or_else(|| MuxError::Handshake("truncated hello".into()))?;
    let theirs: Hello = frame.parse()?;
    if theirs.protocol != PROTOCOL_VERSION {
        return Err(MuxError::VersionMismatch { peer: theirs.protocol });
    }
    Ok(theirs)
}

fn config() -> yamux::Config {
    let mut cfg = yamux::Config::default();
    cfg.set_max_num_streams(1024);
    cfg
}

/// `ended`: the connection's end, on the node's side (see [`MuxStream`]).
fn framed(stream: yamux::Stream, ended: Option<CancellationToken>) -> FramedStream {
    Framed::new(MuxStream::new(stream, ended), FrameCodec)
}

type OpenReply = oneshot::Sender<Result<yamux::Stream, MuxError>>;

/// The node's side: opens streams to `spaced`. Cheap to clone.
#[derive(Clone, Debug)]
pub struct MuxClient {
    open_tx: mpsc::UnboundedSender<OpenReply>,
    shutdown: CancellationToken,
    /// Cancelled once the connection has ended, however it ended: ends the reads of its
    /// streams (see [`MuxStream`]).
    ended: CancellationToken,
}

impl MuxClient {
    /// Starts the multiplexer over `io` (after [`handshake`]). The returned future drives the
    /// connection and must be spawned; it ends when the connection closes.
    pub fn new<T>(io: T) -> (Self, impl Future<Output = ()> + Send + 'static)
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (open_tx, open_rx) = mpsc::unbounded_channel();
        let conn = yamux::Connection::new(io.compat(), config(), yamux::Mode::Client);
        let (shutdown, ended) = (CancellationToken::new(), CancellationToken::new());
        let client = MuxClient { open_tx, shutdown: shutdown.clone(), ended: ended.clone() };
        (client, drive_client(conn, open_rx, shutdown, ended))
    }

    /// Closes the connection now, for every clone: streams in use end.
    pub fn close(&self) {
        self.shutdown.cancel();
    }

    /// Opens a stream for one operation.
    pub async fn open(&self) -> Result<FramedStream, MuxError> {
        let (tx, rx) = oneshot::channel();
        self.open_tx.send(tx).map_err(|_| MuxError::Closed)?;
        let stream = rx.await.map_err(|_| MuxError::Closed)??;
        Ok(framed(stream, Some(self.ended.clone())))
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.open_tx.is_closed()
    }

    /// Resolves once the connection has ended, however it ended.
    pub async fn closed(&self) {
        self.ended.cancelled().await
    }
}

async fn drive_client<T>(
    mut conn: yamux::Connection<T>,
    mut open_rx: mpsc::UnboundedReceiver<OpenReply>,
    shutdown: CancellationToken,
    connection_ended: CancellationToken,
) where
    T: futures::AsyncRead + futures::AsyncWrite + Unpin,
{
    let mut waiting: VecDeque<OpenReply> = VecDeque::new();
    let mut handles_gone = false;
    let closing = shutdown.cancelled();
    let mut closing = std::pin::pin!(closing);
    let ended = poll_fn(|cx| {
        if closing.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        while !handles_gone {
            match open_rx.poll_recv(cx) {
                Poll::Ready(Some(reply)) => waiting.push_back(reply),
                Poll::Ready(None) => handles_gone = true,
                Poll::Pending => break,
            }
        }
        while !waiting.is_empty() {
            match conn.poll_new_outbound(cx) {
                Poll::Ready(Ok(stream)) => {
                    if let Some(reply) = waiting.pop_front() {
                        let _ = reply.send(Ok(stream));
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Some(e.to_string())),
                Poll::Pending => break,
            }
        }
        if handles_gone && waiting.is_empty() {
            return Poll::Ready(None);
        }
        loop {
            match conn.poll_next_inbound(cx) {
                // The node never accepts streams from a sandbox: drop them.
                Poll::Ready(Some(Ok(stream))) => drop(stream),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(e.to_string())),
                Poll::Ready(None) => return Poll::Ready(Some("closed by peer".into())),
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await;
    for reply in waiting.drain(..) {
        let _ = reply.send(Err(MuxError::Closed));
    }
    open_rx.close();
    while let Ok(reply) = open_rx.try_recv() {
        let _ = reply.send(Err(MuxError::Closed));
    }
    if let Some(reason) = ended {
        tracing::debug!(%reason, "agent connection ended");
    } else {
        let _ = poll_fn(|cx| conn.poll_close(cx)).await;
    }
    drop(conn);
    connection_ended.cancel();
}

/// The agent's side: accepts streams and runs `handler` on each until the connection ends.
pub async fn serve<T, F, Fut>(io: T, handler: F) -> Result<(), MuxError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(FramedStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut conn = yamux::Connection::new(io.compat(), config(), yamux::Mode::Server);
    loop {
        match poll_fn(|cx| conn.poll_next_inbound(cx)).await {
            Some(Ok(stream)) => {
                tokio::spawn(handler(framed(stream, None)));
            }
            Some(Err(e)) => return Err(MuxError::Yamux(e.to_string())),
            None => return Ok(()),
        }
    }
}

/// Sends one message frame.
pub async fn send_message<T: Serialize>(stream: &mut FramedStream, value: &T) -> Result<(), FrameError> {
    stream.send(Frame::message(value)?).await
}

/// Receives the next frame; `None` when the peer closed the stream.
pub async fn next_frame(stream: &mut FramedStream) -> Result<Option<Frame>, FrameError> {
    stream.next().await.transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{Reply, Request};

    #[tokio::test]
    async fn request_reply_over_mux() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move {
            handshake(&mut b, "spaced-test").await.unwrap();
            serve(b, |mut s| async move {
                let req: Request = next_frame(&mut s).await.unwrap().unwrap().parse().unwrap();
                assert_eq!(req, Request::Health);
                send_message(&mut s, &Reply::Ok).await.unwrap();
            })
            .await
        });
        let hello = handshake(&mut a, "node-test").await.unwrap();
        assert_eq!(hello.agent, "spaced-test");
        let (client, driver) = MuxClient::new(a);
        tokio::spawn(driver);
        for _ in 0..3 {
            let mut s = client.open().await.unwrap();
            send_message(&mut s, &Request::Health).await.unwrap();
            let reply: Reply = next_frame(&mut s).await.unwrap().unwrap().parse().unwrap();
            assert_eq!(reply, Reply::Ok);
        }
        drop(client);
        server.await.unwrap().unwrap();
    }

    /// A stream waiting for a reply when its connection is closed (the node letting go of a
    /// sandbox before a checkpoint) sees its end instead of waiting for ever, even while the
    /// agent keeps its end of the socket open (as spaced in a frozen sandbox does); so does
    /// one waiting when every client handle goes.
    #[tokio::test]
    async fn streams_in_use_end_with_their_connection() {
        for close in [true, false] {
            let (mut a, mut b) = tokio::io::duplex(1 << 16);
            let agent = tokio::spawn(async move {
                handshake(&mut b, "spaced-test").await.unwrap();
                // Reads everything, answers nothing, never lets go of the socket.
                let mut sink = Vec::new();
                let _ = b.read_to_end(&mut sink).await;
                std::future::pending::<()>().await;
            });
            handshake(&mut a, "node-test").await.unwrap();
            let (client, driver) = MuxClient::new(a);
            tokio::spawn(driver);
            let mut s = client.open().await.unwrap();
            send_message(&mut s, &Request::Health).await.unwrap();
            if close {
                client.close();
            } else {
                drop(client);
            }
            // Not a timing assertion: the bound only turns a hang into a failure. Biased, so
            // that the bound firing does not poll the read once more: what is checked is that
            // the end wakes the read.
            let read = tokio::select! {
                biased;
                () = tokio::time::sleep(std::time::Duration::from_secs(5)) => None,
                read = next_frame(&mut s) => Some(read),
            };
            assert!(matches!(read, Some(Ok(None) | Err(_))), "close {close}: {read:?}");
            agent.abort();
        }
    }

    #[tokio::test]
    async fn version_mismatch_is_reported() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let mut out = bytes::BytesMut::new();
        let bad = Frame::message(&Hello { protocol: 99, agent: "x".into() }).unwrap();
        FrameCodec.encode(bad, &mut out).unwrap();
        b.write_all(&out).await.unwrap();
        let err = handshake(&mut a, "node").await.unwrap_err();
        assert!(matches!(err, MuxError::VersionMismatch { peer: 99 }));
    }
}
