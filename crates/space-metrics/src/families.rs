//! The metric families, their label sets and buckets, registered once.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A family of histograms that all have the buckets its constructor gives.
pub(crate) type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HttpLabels {
    pub method: &'static str,
    /// A route template such as `/v1/sessions/{id}`, or `unmatched`: bounded by the router.
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CreateLabels {
    pub start: &'static str,
    pub runtime: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StartLabels {
    pub start: &'static str,
    pub runtime: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    pub kind: &'static str,
    pub runtime: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindResultLabels {
    pub kind: &'static str,
    pub runtime: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RestoreLabels {
    pub kind: &'static str,
    pub runtime: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RestoreResultLabels {
    pub kind: &'static str,
    pub runtime: &'static str,
    pub reason: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CheckpointLabels {
    pub runtime: &'static str,
    pub step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DecisionLabels {
    pub decision: &'static str,
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BytesLabels {
    pub direction: &'static str,
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProtocolLabels {
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VersionLabels {
    pub version: &'static str,
}

/// API requests: a millisecond to a minute (WebSockets count until the upgrade).
fn request_seconds() -> Histogram {
    Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0])
}

/// Lifecycle work: creates, snapshots, restores (10 ms to 10 minutes).
fn operation_seconds() -> Histogram {
    Histogram::new([0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0])
}

/// Snapshot sizes: 1 MiB to 64 GiB, by fours.
fn snapshot_bytes() -> Histogram {
    Histogram::new((0..9).map(|i| (1u64 << (20 + 2 * i)) as f64))
}

pub(crate) struct Metrics {
    pub registry: Registry,
    pub http_duration: Histograms<HttpLabels>,
    pub creates: Family<CreateLabels, Counter>,
    pub create_duration: Histograms<StartLabels>,
    pub schedule_tick: Histogram,
    pub snapshots: Family<KindResultLabels, Counter>,
    pub snapshot_duration: Histograms<KindLabels>,
    pub snapshot_bytes: Histograms<KindLabels>,
    pub restores: Family<RestoreResultLabels, Counter>,
    pub restore_duration: Histograms<RestoreLabels>,
    pub restore_bytes: Histograms<KindLabels>,
    pub checkpoint_errors: Family<CheckpointLabels, Counter>,
    pub gateway_decisions: Family<DecisionLabels, Counter>,
    pub gateway_bytes: Family<BytesLabels, Counter>,
    pub gateway_errors: Family<ProtocolLabels, Counter>,
}

fn histograms<L: Clone + std::hash::Hash + Eq>(make: fn() -> Histogram) -> Histograms<L> {
    Family::new_with_constructor(make)
}

impl Metrics {
    pub fn new() -> Metrics {
        let metrics = Metrics {
            registry: Registry::default(),
            http_duration: histograms(request_seconds),
            creates: Family::default(),
            create_duration: histograms(operation_seconds),
            schedule_tick: request_seconds(),
            snapshots: Family::default(),
            snapshot_duration: histograms(operation_seconds),
            snapshot_bytes: histograms(snapshot_bytes),
            restores: Family::default(),
            restore_duration: histograms(operation_seconds),
            restore_bytes: histograms(snapshot_bytes),
            checkpoint_errors: Family::default(),
            gateway_decisions: Family::default(),
            gateway_bytes: Family::default(),
            gateway_errors: Family::default(),
        };
        metrics.registered()
    }

    /// Registers every family (names and help as `docs/observability.md` lists them;
    /// counters get `_total` appended by the encoder).
    fn registered(mut self) -> Metrics {
        let r = &mut self.registry;
        let info: Family<VersionLabels, Gauge> = Family::default();
        info.get_or_create(&VersionLabels { version: env!("CARGO_PKG_VERSION") }).set(1);
        r.register("space_build_info", "The server's version (always 1)", info);
        r.register(
            "space_http_request_duration_seconds",
            "API requests by method, route template and HTTP status, and how long they took",
            self.http_duration.clone(),
        );
        r.register("space_session_creates", "Session creates by how they started and result", self.creates.clone());
        r.register(
            "space_session_create_duration_seconds",
            "Successful session creates, from when the reconciler took them up to running",
            self.create_duration.clone(),
        );
        r.register(
            "space_schedule_tick_duration_seconds",
            "How long each run of the session schedule (lifetimes, idle suspends, rolling snapshots) took",
            self.schedule_tick.clone(),
        );
        r.register("space_snapshots", "Snapshots taken, by kind, runtime and result", self.snapshots.clone());
        r.register(
            "space_snapshot_duration_seconds",
            "How long successful snapshots took (a full one includes the checkpoint)",
            self.snapshot_duration.clone(),
        );
        r.register("space_snapshot_size_bytes", "Sizes of snapshots taken", self.snapshot_bytes.clone());
        r.register(
            "space_restores",
            "Sandboxes started from snapshots (restore, resume, fork), by result",
            self.restores.clone(),
        );
        r.register(
            "space_restore_duration_seconds",
            "How long successful starts from a snapshot took",
            self.restore_duration.clone(),
        );
        r.register(
            "space_restore_size_bytes",
            "Sizes of the snapshots sandboxes were started from",
            self.restore_bytes.clone(),
        );
        r.register(
            "space_checkpoint_errors",
            "Failures of the checkpoint tool (CRIU for linux, QEMU migration for vm), by step",
            self.checkpoint_errors.clone(),
        );
        r.register(
            "space_gateway_decisions",
            "Egress gateway decisions by decision and protocol",
            self.gateway_decisions.clone(),
        );
        r.register(
            "space_gateway_bytes",
            "Bytes through the egress gateway: out (sandbox to upstream) and in (upstream to sandbox)",
            self.gateway_bytes.clone(),
        );
        r.register(
            "space_gateway_upstream_errors",
            "Connections the gateway allowed but could not complete upstream (resolution, connect, protocol)",
            self.gateway_errors.clone(),
        );
        self
    }
}
