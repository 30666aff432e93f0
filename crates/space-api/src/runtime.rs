//! Which runtime a session's sandboxes run in, and what a node can run.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How a session's sandboxes are isolated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// Namespaces, seccomp and cgroups on the node's kernel: the fast one.
    #[default]
    Linux,
    /// A virtual machine with its own guest kernel (QEMU microvm): the strong one.
    Vm,
}

impl RuntimeKind {
    pub const ALL: [RuntimeKind; 2] = [RuntimeKind::Linux, RuntimeKind::Vm];

    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Linux => "linux",
            RuntimeKind::Vm => "vm",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        RuntimeKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl std::fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RuntimeKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RuntimeKind::parse(s).ok_or_else(|| format!("unknown runtime {s:?}: expected linux or vm"))
    }
}

/// Whether a node can run sandboxes of one runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RuntimeSupport {
    pub runtime: RuntimeKind,
    pub available: bool,
    /// What runs it (e.g. `QEMU 7.2.19, TCG`), or what is missing and how to fix it.
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for kind in RuntimeKind::ALL {
            assert_eq!(kind.as_str().parse::<RuntimeKind>(), Ok(kind));
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{kind}\""));
        }
        assert!("docker".parse::<RuntimeKind>().unwrap_err().contains("linux or vm"));
    }
}
