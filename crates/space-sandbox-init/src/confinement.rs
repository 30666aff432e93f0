//! What every process of a sandbox must be, checked on a restored tree before it runs.
//!
//! A CRIU image is data the sandbox produced (its memory, its files) read back by a tool that
//! runs as host root. Whatever went wrong in between — a tampered image, a CRIU bug — must not
//! resume a process with more than a sandbox has. So before the restored tree is resumed the
//! node reads, for every task: its user namespace (the sandbox's, mapping exactly the
//! sandbox's id range), its capability sets (within [`crate::KEPT_CAPABILITIES`]),
//! `NoNewPrivs` (1), its seccomp mode (2, filtering) and at least as many filters as a
//! sandbox installs. The filters' content is not read: a tampered image could carry filters
//! of its own in their place.

use std::path::Path;

use crate::InitError;
use crate::security::kept_mask;

/// The id range a sandbox's root maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confinement {
    pub uid_base: u32,
    pub gid_base: u32,
    pub count: u32,
}

/// Checks the process tree rooted at host pid `root` (every thread of every task). Errors name
/// the task and what was wrong.
pub fn check_tree(root: u32, expected: &Confinement) -> Result<(), InitError> {
    let proc_dir = |pid: u32| format!("/proc/{pid}");
    let user_ns = |pid: u32| std::fs::metadata(format!("/proc/{pid}/ns/user")).map(|m| ino(&m));
    let root_ns = user_ns(root).map_err(|e| InitError(format!("task {root}: user namespace: {e}")))?;
    check_map(&format!("{}/uid_map", proc_dir(root)), expected.uid_base, expected.count)?;
    check_map(&format!("{}/gid_map", proc_dir(root)), expected.gid_base, expected.count)?;
    for pid in tree(root)? {
        match user_ns(pid) {
            Ok(ns) if ns == root_ns => {}
            Ok(_) => return Err(InitError(format!("task {pid} is not in the sandbox's user namespace"))),
            Err(e) if vanished(&e) => continue,
            Err(e) => return Err(InitError(format!("task {pid}: user namespace: {e}"))),
        }
        for tid in threads(pid)? {
            match std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) {
                Ok(status) => check_status(&status).map_err(|why| InitError(format!("task {pid}/{tid}: {why}")))?,
                Err(e) if vanished(&e) => {}
                Err(e) => return Err(InitError(format!("task {pid}/{tid}: status: {e}"))),
            }
        }
    }
    Ok(())
}

/// A task that has exited meanwhile will not run again. (CRIU keeps a restored tree stopped
/// while it is checked, so there this does not happen.)
fn vanished(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH))
}

fn ino(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// The map must be exactly `0 <base> <count>`.
fn check_map(path: &str, base: u32, count: u32) -> Result<(), InitError> {
    let text = std::fs::read_to_string(path).map_err(|e| InitError(format!("{path}: {e}")))?;
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    let expected = [0.to_string(), base.to_string(), count.to_string()];
    if lines.len() != 1 || lines[0] != expected {
        return Err(InitError(format!("{path} is {:?}, not \"0 {base} {count}\"", text.trim())));
    }
    Ok(())
}

/// `status` of one thread: capabilities within the kept set, NoNewPrivs 1, seccomp 2.
fn check_status(status: &str) -> Result<(), String> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
            .map(str::trim)
            .ok_or_else(|| format!("no {name} in status"))
    };
    let kept = kept_mask();
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let value = u64::from_str_radix(field(set)?, 16).map_err(|e| format!("{set}: {e}"))?;
        if value & !kept != 0 {
            return Err(format!("{set} {value:016x} holds capabilities beyond {kept:016x}"));
        }
    }
    for (name, required) in [("NoNewPrivs", "1"), ("Seccomp", "2")] {
        let value = field(name)?;
        if value != required {
            return Err(format!("{name} is {value}, must be {required}"));
        }
    }
    // At least the sandbox's own filters (a tree without them, or with fewer, was not
    // confined as a sandbox is). Their content is not compared: a count cannot tell a
    // tampered filter from ours.
    let filters: usize = field("Seccomp_filters")?.parse().map_err(|e| format!("Seccomp_filters: {e}"))?;
    let ours = crate::security::seccomp_programs().map(|p| p.len()).unwrap_or(0);
    if filters < ours {
        return Err(format!("Seccomp_filters is {filters}, a sandbox has at least {ours}"));
    }
    Ok(())
}

/// `root` and every descendant (through each thread's `children`).
fn tree(root: u32) -> Result<Vec<u32>, InitError> {
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let pid = found[next];
        next += 1;
        for tid in threads(pid)? {
            let path = format!("/proc/{pid}/task/{tid}/children");
            match std::fs::read_to_string(&path) {
                Ok(children) => found.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok())),
                Err(e) if vanished(&e) => {}
                Err(e) => return Err(InitError(format!("{path}: {e}"))),
            }
        }
        if found.len() > 1 << 20 {
            return Err(InitError("the restored tree has more tasks than any sandbox may".into()));
        }
    }
    Ok(found)
}

fn threads(pid: u32) -> Result<Vec<u32>, InitError> {
    let dir = format!("/proc/{pid}/task");
    let entries = match std::fs::read_dir(Path::new(&dir)) {
        Ok(entries) => entries,
        Err(e) if vanished(&e) => return Ok(Vec::new()),
        Err(e) => return Err(InitError(format!("{dir}: {e}"))),
    };
    Ok(entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFINED: &str = "CapInh:\t0000000000000000\nCapPrm:\t00000000a80405fb\nCapEff:\t00000000a80405fb\n\
        CapBnd:\t00000000a80405fb\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t4\n";

    #[test]
    fn a_confined_status_passes_and_each_escape_is_named() {
        assert_eq!(check_status(CONFINED), Ok(()));
        let with_net_raw = CONFINED.replace("CapEff:\t00000000a80405fb", "CapEff:\t00000000a80425fb");
        assert!(check_status(&with_net_raw).unwrap_err().starts_with("CapEff"));
        let full = CONFINED.replace("CapBnd:\t00000000a80405fb", "CapBnd:\t000001ffffffffff");
        assert!(check_status(&full).unwrap_err().starts_with("CapBnd"));
        assert!(
            check_status(&CONFINED.replace("NoNewPrivs:\t1", "NoNewPrivs:\t0")).unwrap_err().contains("NoNewPrivs")
        );
        assert!(check_status(&CONFINED.replace("Seccomp:\t2", "Seccomp:\t0")).unwrap_err().contains("Seccomp"));
        let one_filter = CONFINED.replace("Seccomp_filters:\t4", "Seccomp_filters:\t1");
        assert!(check_status(&one_filter).unwrap_err().contains("Seccomp_filters"));
        assert!(check_status("CapInh:\t0\n").unwrap_err().contains("no CapPrm"));
    }

    #[test]
    fn this_unconfined_test_process_fails_the_check() {
        let me = std::process::id();
        let any = Confinement { uid_base: 0, gid_base: 0, count: 4_294_967_295 };
        let err = check_tree(me, &any).unwrap_err();
        assert!(err.0.contains("NoNewPrivs") || err.0.contains("Cap") || err.0.contains("uid_map"), "{err}");
    }
}
