//! The process's Prometheus metrics: one registry for the whole process, so the control
//! plane, the node and the gateway each record a thing where it happens, with no handle
//! passed through the layers between. The control plane serves it (`space serve
//! --metrics-listen`, see `docs/observability.md`).
//!
//! Every label takes values from a set fixed in code (`&'static str`s picked here or by the
//! caller), route templates (never raw paths) or template names (the operator's). No label
//! names a session, sandbox, snapshot or tenant: those would grow without bound.

mod families;
mod scrape;

use std::sync::LazyLock;
use std::time::Duration;

use space_api::egress::AuditDecision;
use space_api::{RuntimeKind, SnapshotKind};

pub use scrape::{PoolSample, Scraped, render};

use families::*;

static METRICS: LazyLock<families::Metrics> = LazyLock::new(families::Metrics::new);

/// The `Content-Type` of [`render`]'s output: the Prometheus text format, which every
/// scraper accepts.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// How a session's first sandbox started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A ready pod of the warm pool was bound to it.
    Warm,
    /// No pod was ready: the sandbox was made from the template on the spot.
    Cold,
    /// From a snapshot (a fork).
    Snapshot,
}

impl Start {
    fn as_str(self) -> &'static str {
        match self {
            Start::Warm => "warm",
            Start::Cold => "cold",
            Start::Snapshot => "snapshot",
        }
    }
}

/// Why a sandbox is started from a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreReason {
    /// `POST /v1/sessions/{id}/restore`.
    Restore,
    /// A suspended session resumed.
    Resume,
    /// A session forked from another's snapshot.
    Fork,
}

impl RestoreReason {
    fn as_str(self) -> &'static str {
        match self {
            RestoreReason::Restore => "restore",
            RestoreReason::Resume => "resume",
            RestoreReason::Fork => "fork",
        }
    }
}

/// Which half of a checkpoint failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointStep {
    Dump,
    Restore,
}

fn result(ok: bool) -> &'static str {
    if ok { "ok" } else { "error" }
}

/// The method as a label value: the standard ones by name, anything else `other`.
fn method_label(method: &str) -> &'static str {
    const KNOWN: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"];
    KNOWN.into_iter().find(|m| *m == method).unwrap_or("other")
}

/// One API request answered: `route` is the route template that matched
/// (`/v1/sessions/{id}`), or `None` when none did; `status` the HTTP status sent.
pub fn http_request(method: &str, route: Option<&str>, status: u16, elapsed: Duration) {
    let labels = HttpLabels { method: method_label(method), route: route.unwrap_or("unmatched").to_owned(), status };
    METRICS.http_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
}

/// A session create finished (`ok`) or failed, started as `start`; `elapsed` from when
/// the reconciler took it up.
pub fn session_created(start: Start, runtime: RuntimeKind, ok: bool, elapsed: Duration) {
    let labels = CreateLabels { start: start.as_str(), runtime: runtime.as_str(), result: result(ok) };
    METRICS.creates.get_or_create(&labels).inc();
    if ok {
        let labels = StartLabels { start: start.as_str(), runtime: runtime.as_str() };
        METRICS.create_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }
}

/// The session schedule ran once (on the replica holding its lease), in `elapsed`.
pub fn schedule_ran(elapsed: Duration) {
    METRICS.schedule_tick.observe(elapsed.as_secs_f64());
}

/// A snapshot was taken (`ok`) or failed after `elapsed`.
pub fn snapshot_taken(kind: SnapshotKind, runtime: RuntimeKind, ok: bool, elapsed: Duration) {
    let labels = KindResultLabels { kind: kind.as_str(), runtime: runtime.as_str(), result: result(ok) };
    METRICS.snapshots.get_or_create(&labels).inc();
    if ok {
        let labels = KindLabels { kind: kind.as_str(), runtime: runtime.as_str() };
        METRICS.snapshot_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }
}

/// A snapshot's size became known (at once for full snapshots, after a walk for disk ones).
pub fn snapshot_size(kind: SnapshotKind, runtime: RuntimeKind, bytes: u64) {
    let labels = KindLabels { kind: kind.as_str(), runtime: runtime.as_str() };
    METRICS.snapshot_bytes.get_or_create(&labels).observe(bytes as f64);
}

/// A sandbox was started from a snapshot of `kind` (`ok`) or failed to, after `elapsed`;
/// `bytes` is the snapshot's size when known.
pub fn restored(
    kind: SnapshotKind,
    runtime: RuntimeKind,
    reason: RestoreReason,
    ok: bool,
    elapsed: Duration,
    bytes: Option<u64>,
) {
    let (kind, runtime, reason) = (kind.as_str(), runtime.as_str(), reason.as_str());
    METRICS.restores.get_or_create(&RestoreResultLabels { kind, runtime, reason, result: result(ok) }).inc();
    if !ok {
        return;
    }
    METRICS.restore_duration.get_or_create(&RestoreLabels { kind, runtime, reason }).observe(elapsed.as_secs_f64());
    if let Some(bytes) = bytes {
        METRICS.restore_bytes.get_or_create(&KindLabels { kind, runtime }).observe(bytes as f64);
    }
}

/// The checkpoint tool (CRIU for `linux`, QEMU's migration for `vm`) failed at `step`.
pub fn checkpoint_error(runtime: RuntimeKind, step: CheckpointStep) {
    let step = match step {
        CheckpointStep::Dump => "dump",
        CheckpointStep::Restore => "restore",
    };
    METRICS.checkpoint_errors.get_or_create(&CheckpointLabels { runtime: runtime.as_str(), step }).inc();
}

/// The gateway's protocols as label values; anything unforeseen is `other`.
fn protocol_label(protocol: &str) -> &'static str {
    const KNOWN: [&str; 7] = ["dns", "http", "https", "connect", "tcp", "audit", "limit"];
    KNOWN.into_iter().find(|p| *p == protocol).unwrap_or("other")
}

/// One gateway decision, with the bytes it carried: `sent` from the sandbox out, `received`
/// from the upstream in. Counted when the connection or request is done.
pub fn gateway_decision(decision: AuditDecision, protocol: &str, sent: u64, received: u64) {
    let protocol = protocol_label(protocol);
    METRICS.gateway_decisions.get_or_create(&DecisionLabels { decision: decision.as_str(), protocol }).inc();
    if sent > 0 {
        METRICS.gateway_bytes.get_or_create(&BytesLabels { direction: "out", protocol }).inc_by(sent);
    }
    if received > 0 {
        METRICS.gateway_bytes.get_or_create(&BytesLabels { direction: "in", protocol }).inc_by(received);
    }
}

/// The gateway allowed a connection but could not reach (or talk to) its upstream.
pub fn gateway_upstream_error(protocol: &str) {
    METRICS.gateway_errors.get_or_create(&ProtocolLabels { protocol: protocol_label(protocol) }).inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_form_inputs_map_to_a_fixed_set_of_label_values() {
        assert_eq!(method_label("GET"), "GET");
        assert_eq!(method_label("BREW"), "other");
        assert_eq!(protocol_label("https"), "https");
        assert_eq!(protocol_label("ses_1234"), "other");
    }

    #[test]
    fn recorded_series_are_rendered_with_their_labels() {
        http_request("GET", Some("/v1/sessions/{id}"), 404, Duration::from_millis(3));
        http_request("FROB", None, 400, Duration::from_millis(1));
        session_created(Start::Warm, RuntimeKind::Linux, true, Duration::from_millis(20));
        snapshot_taken(SnapshotKind::Full, RuntimeKind::Linux, false, Duration::from_secs(1));
        gateway_decision(AuditDecision::Denied, "dns", 0, 0);
        gateway_decision(AuditDecision::Allowed, "https", 100, 2000);
        let text = render(&Scraped::default());
        for line in [
            r#"space_http_request_duration_seconds_count{method="GET",route="/v1/sessions/{id}",status="404"} "#,
            r#"space_http_request_duration_seconds_count{method="other",route="unmatched",status="400"} "#,
            r#"space_session_creates_total{start="warm",runtime="linux",result="ok"} "#,
            r#"space_snapshots_total{kind="full",runtime="linux",result="error"} "#,
            r#"space_gateway_decisions_total{decision="denied",protocol="dns"} "#,
            r#"space_gateway_bytes_total{direction="in",protocol="https"} "#,
            r#"space_sessions{state="running"} 0"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
