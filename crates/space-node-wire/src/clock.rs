//! The node's clock against the control plane's, checked when a control plane connects. Both
//! sides' certificates are checked against their clocks, and what a node records (snapshot
//! times, audit events) is read beside what the control plane records, so a node whose clock
//! is far off is refused with both clocks named rather than half working.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::WireError;

/// How far a node's clock may be from the control plane's. Leases are kept on the control
/// plane's clock alone, so a few seconds of drift harm nothing; minutes are a host to fix.
pub const MAX_SKEW: Duration = Duration::from_secs(30);

/// Milliseconds since the Unix epoch on this host's clock.
pub fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Checks the node's clock `node_ms`, read while this side's clock went from `before_ms` to
/// `after_ms` (the request's round trip), against [`MAX_SKEW`]. A node that did not say
/// (an older release) is not checked.
pub fn check(node_ms: Option<i64>, before_ms: i64, after_ms: i64) -> Result<(), WireError> {
    let Some(node_ms) = node_ms else { return Ok(()) };
    let max = i64::try_from(MAX_SKEW.as_millis()).unwrap_or(i64::MAX);
    // Anywhere within the round trip is the node's "now": only what lies beyond it is skew.
    let skew_ms = if node_ms < before_ms {
        node_ms - before_ms
    } else if node_ms > after_ms {
        node_ms - after_ms
    } else {
        0
    };
    if skew_ms.abs() <= max {
        return Ok(());
    }
    Err(WireError::ClockSkew { skew_ms, max_s: MAX_SKEW.as_secs() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_within_the_bound_is_taken_and_one_beyond_it_is_refused_naming_the_skew() {
        let (before, after) = (1_000_000, 1_000_200);
        for fine in [Some(1_000_100), Some(before - 30_000), Some(after + 30_000), None] {
            assert!(check(fine, before, after).is_ok(), "{fine:?}");
        }
        for (node, skew) in [(after + 30_001, 30_001), (before - 90_000, -90_000)] {
            match check(Some(node), before, after) {
                Err(WireError::ClockSkew { skew_ms, max_s }) => assert_eq!((skew_ms, max_s), (skew, 30)),
                other => panic!("{node}: {other:?}"),
            }
        }
        let message = check(Some(after + 120_000), before, after).unwrap_err().to_string();
        assert!(message.contains("120 s ahead") && message.contains("NTP"), "{message}");
    }
}
