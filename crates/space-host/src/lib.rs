//! What both runtimes use of the node's host, each behind a small module: cgroups (v1 and
//! v2), CPU masks, the host id ranges sandboxes and VMMs run in, idmapped mounts, and process
//! primitives (pidfds, `/proc`). A runtime is what it builds from these, not these.

pub mod affinity;
pub mod cgroup;
pub mod idmapped;
pub mod lxcfs;
pub mod process;
pub mod ranges;
