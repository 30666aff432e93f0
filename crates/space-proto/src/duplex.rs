//! Using one stream from several tasks: [`duplex`].
//!
//! A yamux stream must only ever be polled by one task. Its reads and writes share one
//! command sender (reads use it to grant the peer more window), and that sender remembers
//! a single waiting task. With the read half in one task and the write half in another, a
//! reader parked on sending a window update can have its wakeup overwritten by the writer
//! and sleep forever, while the peer waits for that window: a deadlock that shows under
//! load. [`duplex`] therefore moves the stream into one pump task and hands out channels.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

use crate::codec::{Frame, FrameError};
use crate::mux::FramedStream;

/// Frames queued per direction (each at most 1 MiB, usually at most 64 KiB).
const QUEUE: usize = 8;

/// Frames to send. Sending fails once the stream can no longer be written.
pub type FrameSender = mpsc::Sender<Frame>;
/// Frames received; `None` once the peer closed the stream (after a decoding error too).
pub type FrameReceiver = mpsc::Receiver<Result<Frame, FrameError>>;

/// What the pump does with our side of the stream once every [`FrameSender`] is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnSendersDropped {
    /// Close our side (FIN): the conversation is over.
    Close,
    /// Only flush: the stream stays open until the receiver is dropped too, and is then
    /// dropped (a reset, if the peer has not finished).
    KeepOpen,
}

/// Moves `stream` into a pump task on the current runtime. The task ends, dropping the
/// stream, once the senders are gone and the receiver is dropped or has seen the end.
pub fn duplex(stream: FramedStream, on_senders_dropped: OnSendersDropped) -> (FrameSender, FrameReceiver) {
    let (out_tx, out_rx) = mpsc::channel(QUEUE);
    let (in_tx, in_rx) = mpsc::channel(QUEUE);
    let receiver_gone = {
        let in_tx = in_tx.clone();
        Box::pin(async move { in_tx.closed().await })
    };
    let mut pump = Pump {
        stream,
        out_rx,
        in_tx: PollSender::new(in_tx),
        receiver_gone,
        out_item: None,
        in_item: None,
        flushing: false,
        write_done: false,
        read_done: false,
        close: on_senders_dropped == OnSendersDropped::Close,
    };
    tokio::spawn(async move { poll_fn(|cx| pump.poll(cx)).await });
    (out_tx, in_rx)
}

struct Pump {
    stream: FramedStream,
    out_rx: mpsc::Receiver<Frame>,
    in_tx: PollSender<Result<Frame, FrameError>>,
    /// Wakes the pump when the receiver is dropped while nothing arrives.
    receiver_gone: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// A frame taken from the channel, waiting for the stream to accept it.
    out_item: Option<Frame>,
    /// A frame read from the stream, waiting for room in the channel.
    in_item: Option<Result<Frame, FrameError>>,
    flushing: bool,
    write_done: bool,
    read_done: bool,
    close: bool,
}

impl Pump {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let written = self.poll_write(cx);
        let read = self.poll_read(cx);
        if written.is_ready() && read.is_ready() { Poll::Ready(()) } else { Poll::Pending }
    }

    /// Moves frames from the channel into the stream; flushes when the channel is empty.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while !self.write_done {
            if let Some(frame) = self.out_item.take() {
                match self.stream.poll_ready_unpin(cx) {
                    Poll::Ready(Ok(())) => match self.stream.start_send_unpin(frame) {
                        Ok(()) => self.flushing = true,
                        Err(_) => self.fail_write(),
                    },
                    Poll::Ready(Err(_)) => self.fail_write(),
                    Poll::Pending => {
                        self.out_item = Some(frame);
                        return Poll::Pending;
                    }
                }
                continue;
            }
            match self.out_rx.poll_recv(cx) {
                Poll::Ready(Some(frame)) => self.out_item = Some(frame),
                Poll::Ready(None) => return self.poll_finish(cx),
                Poll::Pending => {
                    if self.flushing {
                        match self.stream.poll_flush_unpin(cx) {
                            Poll::Ready(Ok(())) => self.flushing = false,
                            Poll::Ready(Err(_)) => self.fail_write(),
                            Poll::Pending => {}
                        }
                    }
                    if !self.write_done {
                        return Poll::Pending;
                    }
                }
            }
        }
        Poll::Ready(())
    }

    /// Every sender is gone: flush, and close our side if asked to.
    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let finished = if self.close { self.stream.poll_close_unpin(cx) } else { self.stream.poll_flush_unpin(cx) };
        if finished.is_pending() {
            return Poll::Pending;
        }
        self.write_done = true;
        Poll::Ready(())
    }

    /// The stream can no longer be written: later sends fail.
    fn fail_write(&mut self) {
        self.write_done = true;
        self.out_rx.close();
    }

    /// Moves frames from the stream into the channel.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while !self.read_done {
            if self.receiver_gone.as_mut().poll(cx).is_ready() {
                self.read_done = true;
                break;
            }
            if let Some(item) = self.in_item.take() {
                match self.in_tx.poll_reserve(cx) {
                    Poll::Ready(Ok(())) => {
                        // After a decoding error the stream is out of step: stop reading.
                        let fatal = item.is_err();
                        if self.in_tx.send_item(item).is_err() || fatal {
                            self.read_done = true;
                        }
                    }
                    Poll::Ready(Err(_)) => self.read_done = true,
                    Poll::Pending => {
                        self.in_item = Some(item);
                        return Poll::Pending;
                    }
                }
                continue;
            }
            match self.stream.poll_next_unpin(cx) {
                Poll::Ready(Some(item)) => self.in_item = Some(item),
                Poll::Ready(None) => self.read_done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        // The receiver sees the end once the frames already queued are taken and every
        // sender is gone, including the clone inside the watcher.
        self.receiver_gone = Box::pin(std::future::ready(()));
        self.in_tx.close();
        Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::DataChannel;
    use crate::mux::{MuxClient, handshake, serve};
    use bytes::Bytes;

    /// Echo server: every data frame comes back; many frames in both directions at once,
    /// from two tasks per side, must neither deadlock nor lose frames.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn full_duplex_from_separate_tasks() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            handshake(&mut b, "echo").await.unwrap();
            serve(b, |stream| async move {
                let (tx, mut rx) = duplex(stream, OnSendersDropped::Close);
                while let Some(Ok(frame)) = rx.recv().await {
                    if tx.send(frame).await.is_err() {
                        break;
                    }
                }
            })
            .await
        });
        handshake(&mut a, "node").await.unwrap();
        let (client, driver) = MuxClient::new(a);
        tokio::spawn(driver);
        let (tx, mut rx) = duplex(client.open().await.unwrap(), OnSendersDropped::KeepOpen);
        const FRAMES: usize = 400;
        let writer = tokio::spawn(async move {
            for i in 0..FRAMES {
                let frame = Frame::Data(DataChannel::Stdin, Bytes::from(vec![(i % 256) as u8; 64 * 1024]));
                tx.send(frame).await.unwrap();
            }
        });
        for i in 0..FRAMES {
            let Some(Ok(Frame::Data(_, data))) = rx.recv().await else { panic!("frame {i} missing") };
            assert_eq!((data.len(), data[0]), (64 * 1024, (i % 256) as u8));
        }
        writer.await.unwrap();
    }
}
