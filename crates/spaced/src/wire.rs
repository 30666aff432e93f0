//! Small helpers for answering on a stream.

use futures::{Sink, SinkExt};
use space_proto::{DataChannel, Frame, FrameError, FramedStream, Reply};

/// Sends one reply; an error means the peer is gone (or the reply could not be encoded).
pub async fn send<S>(sink: &mut S, reply: &Reply) -> Result<(), FrameError>
where
    S: Sink<Frame, Error = FrameError> + Unpin,
{
    let frame = match Frame::message(reply) {
        Ok(frame) => frame,
        Err(e) => return Err(e),
    };
    sink.send(frame).await
}

/// Sends a data chunk.
pub async fn send_data<S>(sink: &mut S, channel: DataChannel, data: bytes::Bytes) -> Result<(), FrameError>
where
    S: Sink<Frame, Error = FrameError> + Unpin,
{
    sink.send(Frame::Data(channel, data)).await
}

/// Sends a last reply and closes our side of the stream. Closing (FIN) rather than just
/// dropping lets yamux deliver everything sent before; a dropped open stream is reset.
pub async fn finish(mut stream: FramedStream, reply: Reply) {
    if send(&mut stream, &reply).await.is_ok() {
        let _ = stream.close().await;
    }
}

/// Closes our side of the stream.
pub async fn close(mut stream: FramedStream) {
    let _ = stream.close().await;
}
