//! Bytes of an earlier connection in front of the agent's hello.
//!
//! virtio-serial has no marks between host connections. What the guest writes after the
//! host end closed, but before the guest has seen it close (the reply to the node's goodbye,
//! typically), QEMU cannot deliver: it keeps it and throttles the port, and hands it to the
//! next client of the socket, in front of everything the guest writes for that client. A
//! checkpoint taken then carries those bytes in the device state, so a restored VM hands them
//! to its first client. They belong to no connection the node knows; the guest answers a
//! new connection with its hello only after it has read the node's, so everything before
//! that hello is stale. [`SkipToHello`] drops it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use space_proto::Hello;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most stale bytes skipped before giving up (a guest that sends garbage is not waited for).
const MAX_SKIP: usize = 64 << 10;
/// A hello frame's header: kind (0, a message), channel (0), payload length (u32, LE).
const HEADER_LEN: usize = 6;
/// Longest hello payload looked for (the handshake refuses longer ones too).
const MAX_HELLO: usize = 4096;

/// A byte stream whose reads start at the peer's hello frame (see the module docs).
pub(crate) struct SkipToHello<S> {
    inner: S,
    /// Bytes read while searching; once found, the hello and what follows it, replayed.
    buf: Vec<u8>,
    /// `Some(pos)`: found, `buf[pos..]` still to be replayed.
    replay: Option<usize>,
}

impl<S> SkipToHello<S> {
    pub(crate) fn new(inner: S) -> SkipToHello<S> {
        SkipToHello { inner, buf: Vec::new(), replay: None }
    }
}

/// Where the first complete frame that decodes as a [`Hello`] starts. A candidate still
/// incomplete is passed over: stale bytes can look like the header of a long frame, and the
/// real hello may follow within what that frame would span.
fn find_hello(buf: &[u8]) -> Option<usize> {
    (0..buf.len().saturating_sub(HEADER_LEN)).find(|&p| {
        if buf[p] != 0 || buf[p + 1] != 0 {
            return false;
        }
        let len = u32::from_le_bytes([buf[p + 2], buf[p + 3], buf[p + 4], buf[p + 5]]) as usize;
        let end = p + HEADER_LEN + len;
        (1..=MAX_HELLO).contains(&len)
            && end <= buf.len()
            && serde_json::from_slice::<Hello>(&buf[p + HEADER_LEN..end]).is_ok()
    })
}

impl<S: AsyncRead + Unpin> AsyncRead for SkipToHello<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if let Some(pos) = this.replay {
                if pos < this.buf.len() {
                    let n = out.remaining().min(this.buf.len() - pos);
                    out.put_slice(&this.buf[pos..pos + n]);
                    this.replay = Some(pos + n);
                    return Poll::Ready(Ok(()));
                }
                this.buf = Vec::new();
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            let mut chunk = [0u8; 4096];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                return Poll::Ready(Ok(())); // end of stream before any hello
            }
            this.buf.extend_from_slice(read.filled());
            if let Some(pos) = find_hello(&this.buf) {
                if pos > 0 {
                    tracing::debug!(skipped = pos, "dropped bytes of an earlier connection before the agent's hello");
                }
                this.replay = Some(pos);
            } else if this.buf.len() > MAX_SKIP {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("no hello frame within the first {MAX_SKIP} bytes"),
                )));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SkipToHello<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use space_proto::PROTOCOL_VERSION;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A message frame as the codec writes it.
    fn message(value: &impl serde::Serialize) -> Vec<u8> {
        let json = serde_json::to_vec(value).unwrap();
        let mut frame = vec![0, 0];
        frame.extend((json.len() as u32).to_le_bytes());
        frame.extend(json);
        frame
    }

    fn hello() -> Vec<u8> {
        message(&Hello { protocol: PROTOCOL_VERSION, agent: "spaced/0.1.0".into() })
    }

    async fn through(input: Vec<u8>) -> io::Result<Vec<u8>> {
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        tx.write_all(&input).await.unwrap();
        drop(tx);
        let mut out = Vec::new();
        SkipToHello::new(rx).read_to_end(&mut out).await.map(|_| out)
    }

    #[tokio::test]
    async fn stale_bytes_before_the_hello_are_dropped() {
        // A yamux header (12 bytes, version 0: it reads like a message frame's header that
        // announces a long payload) left by the earlier connection.
        let stale = [0u8, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let after = b"yamux bytes of this connection";
        let mut input = stale.to_vec();
        input.extend(hello());
        input.extend(after);
        let mut expected = hello();
        expected.extend(after);
        assert_eq!(through(input).await.unwrap(), expected);
        // Nothing stale: everything passes.
        let mut plain = hello();
        plain.extend(after);
        assert_eq!(through(plain.clone()).await.unwrap(), plain);
    }

    #[tokio::test]
    async fn garbage_without_a_hello_ends_or_fails() {
        assert_eq!(through(vec![0, 0, 200, 0, 0, 0, 1, 2]).await.unwrap(), Vec::<u8>::new());
        let err = through(vec![0; MAX_SKIP + 4096]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_frame_that_is_no_hello_is_passed_over() {
        let mut buf = message(&serde_json::json!({ "op": "health" }));
        let at = buf.len();
        buf.extend(hello());
        assert_eq!(find_hello(&buf), Some(at));
    }
}
