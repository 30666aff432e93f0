//! Building audit events, and sending one per request once its bodies are done (so the byte
//! counts are known).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use space_api::SessionId;
use space_api::egress::{AuditDecision, AuditEvent};

use crate::SandboxContext;

pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// An event for `host:port` over `protocol`, allowed until said otherwise.
pub(crate) fn event(session: &SessionId, protocol: &str, host: &str, port: u16) -> AuditEvent {
    AuditEvent::allowed(session.clone(), now_millis(), protocol, host, port)
}

/// `event`, denied for `reason`.
pub(crate) fn denied(mut event: AuditEvent, reason: &str) -> AuditEvent {
    event.decision = AuditDecision::Denied;
    event.reason = Some(reason.to_string());
    event
}

/// One request's event, sent when the last of its bodies is dropped.
pub(crate) struct Record {
    context: Arc<SandboxContext>,
    event: Mutex<Option<AuditEvent>>,
    sent: AtomicU64,
    received: AtomicU64,
}

impl Record {
    pub(crate) fn new(context: Arc<SandboxContext>, event: AuditEvent) -> Arc<Record> {
        Arc::new(Record {
            context,
            event: Mutex::new(Some(event)),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
        })
    }

    /// Adds `bytes` that went `direction`.
    pub(crate) fn count(&self, direction: Direction, bytes: u64) {
        let counter = match direction {
            Direction::Sent => &self.sent,
            Direction::Received => &self.received,
        };
        counter.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Changes the event before it is sent.
    pub(crate) fn update(&self, change: impl FnOnce(&mut AuditEvent)) {
        if let Ok(mut event) = self.event.lock()
            && let Some(event) = event.as_mut()
        {
            change(event);
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let event = self.event.get_mut().ok().and_then(|e| e.take());
        if let Some(mut event) = event {
            event.bytes_sent = self.sent.load(Ordering::Relaxed);
            event.bytes_received = self.received.load(Ordering::Relaxed);
            self.context.audit(event);
        }
    }
}

/// Which way a body goes.
#[derive(Clone, Copy)]
pub(crate) enum Direction {
    /// From the sandbox to the upstream.
    Sent,
    /// From the upstream to the sandbox.
    Received,
}

/// A body that adds the data it passes to a record's count.
pub(crate) struct Counted<B> {
    inner: B,
    record: Arc<Record>,
    direction: Direction,
}

impl<B> Counted<B> {
    pub(crate) fn new(inner: B, record: Arc<Record>, direction: Direction) -> Counted<B> {
        Counted { inner, record, direction }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &poll
            && let Some(data) = frame.data_ref()
        {
            this.record.count(this.direction, data.len() as u64);
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
