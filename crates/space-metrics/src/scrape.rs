//! One scrape: the recorded families, and the gauges read at that moment (sessions by state
//! from the store, the warm pool from the node), which nothing needs to keep up to date.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use space_api::{RuntimeKind, SessionState};

use crate::METRICS;

/// Every state but `destroyed` (whose count only grows) is shown, 0 when no session is in it,
/// so each series exists from the first scrape.
const STATES: [SessionState; 9] = [
    SessionState::Creating,
    SessionState::Running,
    SessionState::Paused,
    SessionState::Restoring,
    SessionState::Suspending,
    SessionState::Suspended,
    SessionState::Destroying,
    SessionState::Failed,
    SessionState::Interrupted,
];

/// What the scrape reads from the store and the node.
#[derive(Debug, Clone, Default)]
pub struct Scraped {
    /// Sessions of every tenant, by state (`destroyed` is left out).
    pub sessions: Vec<(SessionState, u64)>,
    pub pools: Vec<PoolSample>,
}

/// One warm pool (template and runtime) as the node reports it.
#[derive(Debug, Clone)]
pub struct PoolSample {
    pub template: String,
    pub runtime: RuntimeKind,
    pub ready: u32,
    /// The size the pool is kept at.
    pub target: u32,
    pub filling: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    template: String,
    runtime: &'static str,
}

/// The whole exposition in the Prometheus text format ([`crate::CONTENT_TYPE`]).
pub fn render(scraped: &Scraped) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail; an encoder error would be a bug in a metric.
    let _ = encode(&mut out, &METRICS.registry);
    let _ = encode(&mut out, &read_now(scraped));
    out
}

fn read_now(scraped: &Scraped) -> Registry {
    let mut registry = Registry::default();
    let sessions: Family<StateLabels, Gauge> = Family::default();
    for state in STATES {
        sessions.get_or_create(&StateLabels { state: state.as_str() }).set(0);
    }
    for &(state, count) in scraped.sessions.iter().filter(|(s, _)| *s != SessionState::Destroyed) {
        sessions.get_or_create(&StateLabels { state: state.as_str() }).set(count as i64);
    }
    registry.register("space_sessions", "Sessions of every tenant by state (destroyed ones are not shown)", sessions);
    let gauges = [
        ("space_pool_ready_pods", "Warm pool: pods ready to be bound, per template and runtime"),
        ("space_pool_target_pods", "Warm pool: the number of ready pods the node keeps, per template and runtime"),
        ("space_pool_filling_pods", "Warm pool: pods being prepared now, per template and runtime"),
    ];
    for (i, (name, help)) in gauges.into_iter().enumerate() {
        let family: Family<PoolLabels, Gauge> = Family::default();
        for pool in &scraped.pools {
            let value = [pool.ready, pool.target, pool.filling][i];
            let labels = PoolLabels { template: pool.template.clone(), runtime: pool.runtime.as_str() };
            family.get_or_create(&labels).set(i64::from(value));
        }
        registry.register(name, help, family);
    }
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_read_at_the_scrape_are_rendered() {
        let scraped = Scraped {
            sessions: vec![(SessionState::Running, 3), (SessionState::Destroyed, 40)],
            pools: vec![PoolSample {
                template: "busybox".into(),
                runtime: RuntimeKind::Linux,
                ready: 2,
                target: 4,
                filling: 1,
            }],
        };
        let text = render(&scraped);
        for line in [
            "space_sessions{state=\"running\"} 3\n",
            "space_sessions{state=\"suspended\"} 0\n",
            "space_pool_ready_pods{template=\"busybox\",runtime=\"linux\"} 2\n",
            "space_pool_target_pods{template=\"busybox\",runtime=\"linux\"} 4\n",
            "space_pool_filling_pods{template=\"busybox\",runtime=\"linux\"} 1\n",
            "space_build_info{version=",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("state=\"destroyed\""), "{text}");
    }
}
