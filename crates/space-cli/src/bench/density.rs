//! Density: what an idle sandbox costs the host, beyond the memory of its own processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::api::{create_many, destroy_all};
use super::peers::host_memory_used_bytes;
use super::report::round;
use crate::client::Client;

/// Creates `count` idle sessions and compares the host's used memory before and after with
/// the memory of the sandboxes' own processes (their proportional set size: pages shared
/// between sandboxes, like the text of the static `spaced`, are counted once overall).
pub async fn measure(client: &Client, template: &str, count: usize, cgroup_parent: &str) -> anyhow::Result<Value> {
    let before = host_memory_used_bytes()?;
    let sessions = create_many(client, template, count).await?;
    // Let lazily freed memory (bootstrap processes, page tables) settle before reading.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = host_memory_used_bytes()?;
    let sandboxes: Vec<String> =
        sessions.iter().filter_map(|s| s.sandbox_id.as_ref().map(|id| id.to_string())).collect();
    let (pss, charged) = own_memory(cgroup_parent, &sandboxes);
    let ids: Vec<String> = sessions.iter().map(|s| s.id.to_string()).collect();
    destroy_all(client, &ids).await;
    let mib = |bytes: f64| round(bytes / count as f64 / (1024.0 * 1024.0));
    let host = after.saturating_sub(before) as f64;
    Ok(json!({
        "measure": format!("density_{count}_idle"),
        "n": count,
        "host_mib_per_sandbox": mib(host),
        "own_processes_pss_mib_per_sandbox": mib(pss as f64),
        "cgroup_charged_mib_per_sandbox": mib(charged as f64),
        "overhead_mib_per_sandbox": mib(host - pss as f64),
    }))
}

/// (proportional set size of every process, memory charged to the cgroups) summed over the
/// sandboxes.
fn own_memory(cgroup_parent: &str, sandboxes: &[String]) -> (u64, u64) {
    let (mut pss, mut charged) = (0, 0);
    for id in sandboxes {
        let Some((dir, usage_file)) = memory_cgroup(cgroup_parent, id) else { continue };
        charged += read_u64(&dir.join(usage_file)).unwrap_or(0);
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        pss += procs.lines().filter_map(|pid| pss_bytes(pid.trim())).sum::<u64>();
    }
    (pss, charged)
}

fn memory_cgroup(parent: &str, id: &str) -> Option<(PathBuf, &'static str)> {
    let v1 = Path::new("/sys/fs/cgroup/memory").join(parent).join(id);
    if v1.is_dir() {
        return Some((v1, "memory.usage_in_bytes"));
    }
    let v2 = Path::new("/sys/fs/cgroup").join(parent).join(id);
    v2.is_dir().then_some((v2, "memory.current"))
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn pss_bytes(pid: &str) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    parse_pss(&rollup)
}

fn parse_pss(rollup: &str) -> Option<u64> {
    let line = rollup.lines().find(|l| l.starts_with("Pss:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pss_from_smaps_rollup() {
        let rollup = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss:    2400 kB\nPss:    1234 kB\nPss_Anon: 1000 kB\n";
        assert_eq!(parse_pss(rollup), Some(1234 * 1024));
        assert_eq!(parse_pss("Rss: 1 kB\n"), None);
    }
}
