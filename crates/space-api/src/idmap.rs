//! A uid/gid range: sandbox id `n` is host id `host_base + n`. The storage pool's range owns
//! the files on disk (templates are shifted into it); the linux runtime runs each sandbox in a
//! range of its own after it and maps the storage range onto that one with an idmapped mount.

use serde::{Deserialize, Serialize};

/// The overflow ("nobody") id inside a sandbox.
pub const NOBODY: u32 = 65534;

/// Maps sandbox ids `0..count` to host ids `host_base..host_base + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub host_base: u32,
    pub count: u32,
}

impl Default for IdMap {
    fn default() -> Self {
        IdMap { host_base: 100_000, count: 65_536 }
    }
}

impl IdMap {
    /// Checks the map is usable: non-empty, not mapping to host root, no overflow. The error
    /// says which rule it breaks.
    pub fn validate(&self) -> Result<(), &'static str> {
        let reason = if self.count == 0 {
            "count must be at least 1"
        } else if self.host_base == 0 {
            "host_base must not be 0 (sandbox root would be host root)"
        } else if self.host_base.checked_add(self.count).is_none() {
            "host_base + count overflows 32 bits"
        } else {
            return Ok(());
        };
        Err(reason)
    }

    /// The in-sandbox id that ids outside the range collapse to (65534, or the last id of a
    /// smaller range).
    pub fn overflow_id(&self) -> u32 {
        NOBODY.min(self.count.saturating_sub(1))
    }

    /// Host id for sandbox id `id`; ids `>= count` map to the overflow id.
    pub fn to_host(&self, id: u32) -> u32 {
        let inner = if id < self.count { id } else { self.overflow_id() };
        self.host_base + inner
    }

    /// The host id of the sandbox's root user.
    pub fn root(&self) -> u32 {
        self.host_base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifting_math() {
        let m = IdMap::default();
        assert_eq!(m.to_host(0), 100_000);
        assert_eq!(m.to_host(1000), 101_000);
        assert_eq!(m.to_host(65_535), 165_535);
        assert_eq!(m.to_host(65_536), 165_534);
        assert_eq!(m.to_host(u32::MAX), 165_534);
        assert_eq!(m.root(), 100_000);
    }

    #[test]
    fn small_ranges_overflow_to_their_last_id() {
        let m = IdMap { host_base: 200_000, count: 1000 };
        assert_eq!(m.to_host(999), 200_999);
        assert_eq!(m.to_host(1000), 200_999);
        assert_eq!(m.to_host(65_534), 200_999);
    }

    #[test]
    fn validation() {
        assert!(IdMap::default().validate().is_ok());
        for (host_base, count) in [(0, 10), (10, 0), (u32::MAX - 5, 10)] {
            assert!(IdMap { host_base, count }.validate().is_err());
        }
    }
}
