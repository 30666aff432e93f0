//! Checkpoint and restore of whole sandboxes with CRIU (see the `space-criu` crate for what
//! the sandbox's start sequence does so that CRIU can take it).
//!
//! The node pauses the sandbox (cgroup freezer) and snapshots its root before calling
//! [`checkpoint`]: CRIU is pointed at the frozen freezer cgroup, dumps the tree as it stands
//! and leaves it frozen, so the memory image and the root snapshot show the same instant.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use space_criu::{CgroupRoot, Criu, DumpOptions, ImageStore, RestoreOptions};
use space_runtime::{
    CheckpointArtifacts, CheckpointStats, Runtime, RuntimeError, RuntimeKind, SandboxHandle, SandboxId, SandboxSpec,
    SealedImages,
};

use crate::LinuxRuntime;
use crate::boot::Pid1;
use crate::cgroup::Backend;
use crate::sealed_images::SealedStore;

/// How often [`wait_agent_released`] looks at the sandbox's socket table.
const RELEASE_POLL: Duration = Duration::from_millis(2);

fn criu(rt: &LinuxRuntime) -> Result<&Criu, RuntimeError> {
    rt.criu.as_ref().map_err(|why| RuntimeError::CheckpointUnavailable(why.clone()))
}

/// The host pid of a sandbox this runtime tracks and whose pid 1 runs.
fn running_pid(rt: &LinuxRuntime, id: &SandboxId) -> Result<u32, RuntimeError> {
    rt.running(id).map(|h| h.pid).ok_or_else(|| RuntimeError::NotFound(id.clone()))
}

pub(crate) async fn wait_agent_released(
    rt: &LinuxRuntime,
    id: &SandboxId,
    timeout: Duration,
) -> Result<(), RuntimeError> {
    let pid = running_pid(rt, id)?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let connections = agent_connections(pid)?;
        if connections == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RuntimeError::Checkpoint(format!(
                "the sandbox's agent still holds {connections} connection(s) after {timeout:?}"
            )));
        }
        tokio::time::sleep(RELEASE_POLL).await;
    }
}

/// The socket tables of a network namespace, as `/proc/<pid>/net/<table>` lists them.
const SOCKET_TABLES: &[&str] = &["unix", "netlink", "packet", "tcp", "tcp6", "udp", "udp6", "raw", "raw6"];

/// Sockets pid 1 holds that belong to another network namespace than the sandbox's: the
/// kernel creates the accepted end of a unix connection in the connecting side's namespace,
/// so these are exactly the connections from the host (the node's).
fn agent_connections(pid: u32) -> Result<usize, RuntimeError> {
    let io = |path: String| move |source| RuntimeError::Io { path: path.into(), source };
    let mut local = std::collections::HashSet::new();
    for table in SOCKET_TABLES {
        let path = format!("/proc/{pid}/net/{table}");
        match std::fs::read_to_string(&path) {
            Ok(text) => local.extend(socket_inodes(&text, table)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // protocol not built in
            Err(e) => return Err(io(path)(e)),
        }
    }
    let fd_dir = format!("/proc/{pid}/fd");
    let mut foreign = 0;
    for entry in std::fs::read_dir(&fd_dir).map_err(io(fd_dir.clone()))? {
        let Ok(target) = entry.and_then(|e| std::fs::read_link(e.path())) else { continue }; // closed meanwhile
        let inode = target.to_str().and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']')?.parse::<u64>().ok());
        if inode.is_some_and(|i| !local.contains(&i)) {
            foreign += 1;
        }
    }
    Ok(foreign)
}

/// The inode column of a socket table (`unix` has it 7th, `netlink` and `packet` last, the
/// inet tables 10th).
fn socket_inodes(text: &str, table: &str) -> Vec<u64> {
    let column = match table {
        "unix" => 6,
        "netlink" | "packet" => usize::MAX,
        _ => 9,
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let cell = if column == usize::MAX { cols.last() } else { cols.get(column) };
            cell.and_then(|c| c.parse().ok())
        })
        .collect()
}

/// The CRIU images directory, the `spaced` the tree ran and where the images are sealed, or
/// `WrongKind`.
fn criu_artifacts(artifacts: &CheckpointArtifacts) -> Result<(&Path, &Path, Option<&SealedImages>), RuntimeError> {
    match artifacts {
        CheckpointArtifacts::Criu { images, spaced, sealed } => Ok((images, spaced, sealed.as_ref())),
        _ => Err(RuntimeError::WrongKind { runtime: RuntimeKind::Linux, what: "a VM state checkpoint" }),
    }
}

fn store(sealed: &SealedImages) -> Arc<dyn ImageStore> {
    Arc::new(SealedStore(sealed.clone()))
}

pub(crate) async fn checkpoint(
    rt: &LinuxRuntime,
    id: &SandboxId,
    artifacts: &CheckpointArtifacts,
) -> Result<CheckpointStats, RuntimeError> {
    let (images_dir, _, sealed) = criu_artifacts(artifacts)?;
    let criu = criu(rt)?;
    if let Some(sealed) = sealed {
        std::fs::create_dir_all(&sealed.dir).map_err(|source| RuntimeError::Io { path: sealed.dir.clone(), source })?;
    }
    let pid = running_pid(rt, id)?;
    let name = rt.cgroup_name(id);
    if !rt.cgroups.is_frozen(&name) {
        return Err(RuntimeError::Checkpoint(format!("sandbox {id} must be paused first")));
    }
    let mut opts = DumpOptions::new(pid, images_dir);
    opts.store = sealed.map(store);
    opts.leave_running = true;
    opts.freeze_cgroup = Some(rt.cgroups.freezer_dir(&name));
    opts.cgroup_controllers = dumped_controllers(rt.cgroups.hierarchy_paths(&name));
    opts.ghost_total_limit = rt.opts.ghost_total_limit;
    let stats = criu.dump(&opts).await.map_err(|e| RuntimeError::Checkpoint(e.to_string()))?;
    Ok(CheckpointStats { wall: stats.wall, image_bytes: stats.image_bytes })
}

pub(crate) async fn restore(
    rt: &LinuxRuntime,
    spec: &SandboxSpec,
    artifacts: &CheckpointArtifacts,
) -> Result<SandboxHandle, RuntimeError> {
    let (images_dir, spaced, sealed) = criu_artifacts(artifacts)?;
    if sealed.is_some() {
        // CRIU's RPC, through which restores run, cannot stream: the caller opens them first.
        return Err(RuntimeError::Restore("sealed images must be opened into `images` for a restore".into()));
    }
    let rootfs = crate::rootfs_of(spec)?;
    let criu = criu(rt)?.clone();
    if let Some(handle) = rt.running(&spec.id) {
        return Ok(handle); // a replayed restore
    }
    rt.destroy(&spec.id).await?; // leftovers of an earlier attempt
    // A range of its own, not the dumped sandbox's: every fork and restore of one image runs
    // under different host ids (the image's map is rewritten to it).
    let (map, root) = match rt.range_and_root(&spec.id, rootfs) {
        Ok(taken) => taken,
        Err(e) => {
            cleanup(rt, &spec.id).await;
            return Err(e);
        }
    };
    let mut opts = RestoreOptions::new(images_dir, rootfs, rt.agent_dir(&spec.id), spaced);
    opts.sandbox_root = (map.host_base, map.host_base);
    opts.root_mount = Some(std::sync::Arc::new(root));
    opts.id_count = map.count;
    opts.work_prefix = rt.restore_work_prefix();
    let name = rt.cgroup_name(&spec.id);
    let prepared = name.clone();
    let prepare =
        move |cg: &dyn Backend| cg.prepare_restore(&prepared).map_err(|e| RuntimeError::Cgroup(e.to_string()));
    if let Err(e) = rt.cgroup_step(&spec.id, prepare).await {
        cleanup(rt, &spec.id).await;
        return Err(e);
    }
    opts.cgroup_roots = rt
        .cgroups
        .hierarchy_paths(&name)
        .into_iter()
        .map(|(controller, path)| CgroupRoot::new(controller.as_deref(), path))
        .collect();
    let restored = match criu.restore(&opts).await {
        Ok(tree) => tree,
        Err(e) => {
            cleanup(rt, &spec.id).await;
            return Err(RuntimeError::Restore(e.to_string()));
        }
    };
    let (pid, socket) = (restored.pid, restored.socket.clone());
    rt.track(&spec.id, Pid1 { pid, pidfd: restored.pidfd });
    let adopted = if socket == rt.socket_path(&spec.id) {
        // CRIU restores the freezer state the tree was dumped in (frozen, see the module docs).
        rt.set_limits(&spec.id, &spec.limits).and_then(|()| rt.thaw(&spec.id))
    } else {
        Err(RuntimeError::Restore(format!("the restored agent listens at {}, not at its place", socket.display())))
    };
    match adopted {
        Ok(()) => Ok(rt.handle(&spec.id, pid)),
        Err(e) => {
            cleanup(rt, &spec.id).await;
            Err(e)
        }
    }
}

/// One controller per v1 hierarchy the runtime puts sandboxes in; none (CRIU records every
/// hierarchy) on cgroup v2, which has just one.
fn dumped_controllers(hierarchies: Vec<(Option<String>, String)>) -> Vec<String> {
    let firsts: Option<Vec<String>> = hierarchies
        .into_iter()
        .map(|(controllers, _)| controllers.and_then(|c| c.split(',').next().map(str::to_owned)))
        .collect();
    firsts.unwrap_or_default()
}

async fn cleanup(rt: &LinuxRuntime, id: &SandboxId) {
    if let Err(e) = rt.destroy(id).await {
        tracing::warn!(sandbox = %id, error = %e, "cleanup after a failed restore");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_controller_per_v1_hierarchy_and_none_on_v2() {
        let v1 = vec![(Some("cpu,cpuacct".to_owned()), "/a".to_owned()), (Some("memory".to_owned()), "/a".to_owned())];
        assert_eq!(dumped_controllers(v1), vec!["cpu", "memory"]);
        assert!(dumped_controllers(vec![(None, "/a".to_owned())]).is_empty());
    }

    #[test]
    fn socket_inodes_of_each_table() {
        let unix = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 100 /dev/.spaced-agent/agent.sock\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 101\n";
        assert_eq!(socket_inodes(unix, "unix"), vec![100, 101]);
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:1B58 00000000:0000 0A 00000000:00000000 00:00000000 00000000 100000 0 555 1 0 100 0 0 10 0\n";
        assert_eq!(socket_inodes(tcp, "tcp"), vec![555]);
        let netlink = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
            0000000000000000 0   1          00000000 0        0        0     2        0        777\n";
        assert_eq!(socket_inodes(netlink, "netlink"), vec![777]);
    }
}
