//! Which CPUs a sandbox's tasks may run on, so that what counts CPUs inside (`nproc`,
//! `os.sched_getaffinity`, a thread pool sizing itself) counts the session's `cpus`, not the
//! host's. The session's share of CPU time stays the CFS quota; the mask only says how many
//! CPUs, and which. A sandbox whose `cpus` rounds up to `n` gets `n` of the CPUs the node may
//! use, consecutive from a place its id picks, so sandboxes spread over the host.
//!
//! A mask is advice, not a bound: a task may widen its own (the quota still holds it). It is
//! set on the bootstrap before it forks pid 1 (everything inside inherits it) and on every
//! thread of the sandbox when its limits change or it is restored (CRIU does not restore
//! masks).

use std::hash::{Hash, Hasher};

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// The CPUs this process may run on: those a sandbox's mask is drawn from.
pub fn allowed() -> nix::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false)).collect())
}

/// The CPUs of `allowed` for a sandbox of `millicpus` keyed by `seed`: as many as the quota
/// rounds up to (at least one), consecutive (wrapping) from the seed's place. All of them
/// when it wants as many or more.
pub fn pick(allowed: &[usize], millicpus: u32, seed: impl Hash) -> Vec<usize> {
    let want = (millicpus as usize).div_ceil(1000).max(1);
    if want >= allowed.len() {
        return allowed.to_vec();
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    seed.hash(&mut hasher);
    let start = (hasher.finish() % allowed.len() as u64) as usize;
    let mut cpus: Vec<usize> = (0..want).map(|i| allowed[(start + i) % allowed.len()]).collect();
    // In order, as a mask reads back ([`of`]).
    cpus.sort_unstable();
    cpus
}

/// Sets the mask of task `tid` (a thread, or a single-threaded process) to `cpus`.
pub fn set(tid: u32, cpus: &[usize]) -> nix::Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)?;
    }
    sched_setaffinity(Pid::from_raw(tid as i32), &set)
}

/// Sets the mask of every thread of every process in `pids`. A process or thread that exits
/// meanwhile is skipped; one made meanwhile inherits its parent's mask, set here or about to be.
pub fn set_all(pids: &[u32], cpus: &[usize]) -> nix::Result<()> {
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for tid in tasks.flatten().filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok()) {
            match set(tid, cpus) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The mask of task `tid`.
pub fn of(tid: u32) -> nix::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(tid as i32))?;
    Ok((0..CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_gets_as_many_cpus_as_its_quota_rounds_up_to_spread_by_its_id() {
        let host = [0, 1, 2, 3];
        assert_eq!(pick(&host, 1000, "a").len(), 1);
        assert_eq!(pick(&host, 500, "a").len(), 1, "a fraction is one CPU");
        assert_eq!(pick(&host, 1500, "a").len(), 2);
        assert_eq!(pick(&host, 4000, "a"), host, "all of them");
        assert_eq!(pick(&host, 9000, "a"), host);
        assert_eq!(pick(&host, 2000, "a"), pick(&host, 2000, "a"), "the same id, the same CPUs");
        let pairs: std::collections::HashSet<Vec<usize>> = (0..64).map(|i| pick(&host, 2000, i)).collect();
        let wrapped = vec![0, 3];
        assert_eq!(pairs, [vec![0, 1], vec![1, 2], vec![2, 3], wrapped].into(), "consecutive, wrapping, in order");
        let starts: std::collections::HashSet<usize> = (0..64).map(|i| pick(&host, 1000, i)[0]).collect();
        assert_eq!(starts.len(), 4, "sandboxes spread over every CPU");
        assert_eq!(pick(&[5, 7], 1000, "x").len(), 1);
    }

    #[test]
    fn this_process_may_run_somewhere_and_its_mask_reads_back() {
        let allowed = allowed().unwrap();
        assert!(!allowed.is_empty());
        assert_eq!(of(std::process::id()).unwrap(), allowed);
    }
}
