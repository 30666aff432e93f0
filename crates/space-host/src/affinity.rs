//! Which CPUs a sandbox's tasks may run on, so that what counts CPUs inside (`nproc`,
//! `os.sched_getaffinity`, a thread pool sizing itself) counts the session's `cpus`, not the
//! host's. The session's share of CPU time stays the CFS quota. A sandbox whose `cpus` rounds
//! up to `n` gets the `n` of the node's CPUs that the fewest other sandboxes hold, so
//! sandboxes spread over the host (as LXD places `limits.cpu`).
//!
//! The mask also bounds where the sandbox runs: two busy sandboxes given one CPU each share
//! it while another CPU may idle (the kernel cannot move them). A task may widen its own
//! mask (no privilege is needed for one's own tasks). It is set on the bootstrap before it
//! forks pid 1 (everything inside inherits it) and on every thread of the sandbox when its
//! limits change or it is restored (CRIU does not restore masks).

use std::hash::{Hash, Hasher};

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// The CPUs this process may run on: those a sandbox's mask is drawn from.
pub fn allowed() -> nix::Result<Vec<usize>> {
    let set = sched_getaffinity(Pid::from_raw(0))?;
    Ok((0..CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false)).collect())
}

/// The CPUs of `allowed` for a sandbox of `millicpus` keyed by `seed`, beside sandboxes that
/// hold the masks `others`: as many as the quota rounds up to (at least one), those the fewest
/// others hold (ties broken from a place the seed picks, so equal loads spread), in order. All
/// of them when it wants as many or more.
pub fn pick<'a>(
    allowed: &[usize],
    millicpus: u32,
    others: impl IntoIterator<Item = &'a [usize]>,
    seed: impl Hash,
) -> Vec<usize> {
    let want = count(allowed.len(), millicpus);
    if want >= allowed.len() {
        return allowed.to_vec();
    }
    let mut held = vec![0usize; allowed.len()];
    for mask in others {
        for cpu in mask {
            if let Some(i) = allowed.iter().position(|a| a == cpu) {
                held[i] += 1;
            }
        }
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    seed.hash(&mut hasher);
    let start = (hasher.finish() % allowed.len() as u64) as usize;
    let mut order: Vec<usize> = (0..allowed.len()).collect();
    order.sort_by_key(|&i| (held[i], (i + allowed.len() - start) % allowed.len()));
    let mut cpus: Vec<usize> = order[..want].iter().map(|&i| allowed[i]).collect();
    // In order, as a mask reads back ([`of`]).
    cpus.sort_unstable();
    cpus
}

/// How many of `allowed` CPUs a sandbox of `millicpus` gets: its quota rounded up, at least
/// one, at most all.
pub fn count(allowed: usize, millicpus: u32) -> usize {
    (millicpus as usize).div_ceil(1000).clamp(1, allowed.max(1))
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
/// meanwhile is skipped; one made meanwhile may keep the mask it had, so callers set masks
/// when nothing forks: a warm pod being claimed (its `spaced` idles), a restored tree before
/// it is thawed.
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
    fn a_sandbox_gets_as_many_cpus_as_its_quota_rounds_up_to_the_least_held_ones() {
        let host = [0, 1, 2, 3];
        let none: [&[usize]; 0] = [];
        assert_eq!(pick(&host, 1000, none, "a").len(), 1);
        assert_eq!(pick(&host, 500, none, "a").len(), 1, "a fraction is one CPU");
        assert_eq!(pick(&host, 1500, none, "a").len(), 2);
        assert_eq!(pick(&host, 4000, none, "a"), host, "all of them");
        assert_eq!(pick(&host, 9000, none, "a"), host);
        assert_eq!(pick(&host, 2000, none, "a"), pick(&host, 2000, none, "a"), "the same id, the same CPUs");
        // Sandboxes placed one after another fill the CPUs evenly.
        let mut masks: Vec<Vec<usize>> = Vec::new();
        for i in 0..8 {
            let mask = pick(&host, 1000, masks.iter().map(Vec::as_slice), i);
            masks.push(mask);
        }
        for cpu in host {
            assert_eq!(masks.iter().filter(|m| m.contains(&cpu)).count(), 2, "{masks:?}");
        }
        let two = pick(&host, 2000, [&[0usize, 1][..], &[1][..]], "b");
        assert_eq!(two, [2, 3], "the two no other sandbox holds");
        // Equal loads: where it starts depends on the id, so sandboxes spread.
        let starts: std::collections::HashSet<Vec<usize>> = (0..64).map(|i| pick(&host, 1000, none, i)).collect();
        assert_eq!(starts.len(), 4);
        assert_eq!(pick(&[5, 7], 1000, none, "x").len(), 1);
    }

    #[test]
    fn this_process_may_run_somewhere_and_its_mask_reads_back() {
        let allowed = allowed().unwrap();
        assert!(!allowed.is_empty());
        assert_eq!(of(std::process::id()).unwrap(), allowed);
    }
}
