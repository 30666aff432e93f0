//! A yamux stream whose reads also end when its connection ends.
//!
//! yamux wakes a connection's streams only when the connection fails or is dropped while
//! still active. A graceful close (the node's goodbye, e.g. when it lets go of a sandbox
//! before a full snapshot) hands the socket to the closing task and leaves every stream still
//! in use parked in its read, waiting for data that can no longer come: an exec's output
//! bridged to a client would then never end. The node's streams therefore also watch their
//! connection's end: once it has ended, a read that finds nothing buffered sees the end of
//! the stream.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// One yamux stream; on the node's side, with its connection's end.
pub struct MuxStream {
    inner: Compat<yamux::Stream>,
    ended: Option<ConnectionEnd>,
}

struct ConnectionEnd {
    token: CancellationToken,
    wait: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl MuxStream {
    /// `ended`, if given, is cancelled once the stream's connection has ended.
    pub(crate) fn new(stream: yamux::Stream, ended: Option<CancellationToken>) -> MuxStream {
        let ended = ended.map(|token| ConnectionEnd { wait: Box::pin(token.clone().cancelled_owned()), token });
        MuxStream { inner: stream.compat(), ended }
    }

    /// Whether the connection has ended (registering the task to be woken when it does).
    fn connection_ended(&mut self, cx: &mut Context<'_>) -> bool {
        match &mut self.ended {
            Some(end) => end.token.is_cancelled() || end.wait.as_mut().poll(cx).is_ready(),
            None => false,
        }
    }
}

impl AsyncRead for MuxStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Pending if self.connection_ended(cx) => Poll::Ready(Ok(())), // nothing read: the end
            other => other,
        }
    }
}

impl AsyncWrite for MuxStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending if self.connection_ended(cx) => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
