//! Answers that stream, one JSON value per line: template work with its progress, and the
//! gateway's audit events.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Response, StatusCode};
use space_api::egress::AuditEvent;
use space_node_api::NodeApi;
use tokio::sync::{Mutex, mpsc};

use super::{Body, refuse, respond};
use crate::ops::{NodeFailure, TemplateCall, TemplateLine};

/// Runs `call` on the node and streams its progress, then its outcome. The work goes on if
/// the caller goes away: a template half built is the node's to finish, as it is in-process.
pub(super) fn template(node: Arc<dyn NodeApi>, call: TemplateCall) -> Response<Body> {
    let (tx, rx) = mpsc::unbounded_channel::<TemplateLine>();
    let progress = tx.clone();
    let report = Box::new(move |p| {
        let _ = progress.send(TemplateLine::Progress(p));
    });
    let logged = tx.clone();
    let log = Box::new(move |line| {
        let _ = logged.send(TemplateLine::Log(line));
    });
    tokio::spawn(async move {
        let outcome = match call {
            TemplateCall::Ensure { name } => node.ensure_template(&name, report).await,
            TemplateCall::Import { name, source } => node.import_template(&name, &source, report).await,
            TemplateCall::Build { name, build } => node.build_template(&name, &build, report, log).await,
        };
        let _ = tx.send(TemplateLine::Done(outcome.map_err(|e| NodeFailure::from(&e))));
    });
    lines(tokio_stream_of(rx))
}

/// The gateway's audit events, for one reader at a time. A reader that goes away lets go
/// of them, so the next one (the same control plane reconnecting, or another replica) gets
/// those queued meanwhile.
pub(super) struct AuditSlot(Option<Arc<Mutex<mpsc::UnboundedReceiver<AuditEvent>>>>);

impl AuditSlot {
    pub(super) fn new(events: Option<mpsc::UnboundedReceiver<AuditEvent>>) -> AuditSlot {
        AuditSlot(events.map(|e| Arc::new(Mutex::new(e))))
    }

    pub(super) fn stream(&self) -> Response<Body> {
        let Some(Ok(events)) = self.0.clone().map(Mutex::try_lock_owned) else {
            return refuse(
                StatusCode::CONFLICT,
                crate::codes::AUDIT_TAKEN,
                "another reader has this node's audit events; they are handed on when it stops".into(),
            );
        };
        let stream = futures::stream::unfold(events, |mut events| async move {
            let event = events.recv().await?;
            Some((event, events))
        });
        lines(stream)
    }
}

fn tokio_stream_of<T: Send + 'static>(mut rx: mpsc::UnboundedReceiver<T>) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// A response streaming each item of `items` as one line of JSON.
fn lines<T: serde::Serialize>(items: impl futures::Stream<Item = T> + Send + 'static) -> Response<Body> {
    let frames = items.map(|item| {
        let mut line = serde_json::to_vec(&item).unwrap_or_else(|_| b"null".to_vec());
        line.push(b'\n');
        Ok(Frame::data(Bytes::from(line)))
    });
    respond(StatusCode::OK, "application/x-ndjson", StreamBody::new(frames).boxed_unsync())
}
