//! CRIU dumps that outlive a killed server.
//!
//! A dump is left to finish when the server dies: killing CRIU while its parasite runs inside
//! the sandbox's tasks could kill them (the sandbox would be lost, where a finished dump only
//! leaves it frozen). But a dump that finishes after the server has restarted puts the
//! freezer state back as it found it, frozen, after the new server thawed the sandbox: the
//! session would read `running` and answer nothing. So every dump is recorded in a directory
//! while it runs (its pid and start time), and a starting server waits for the recorded dumps
//! that still run before it touches any sandbox.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A running CRIU process, recorded until [`RunRecord::ended`]. Only that removes the record:
/// a wait that is itself cut short (the runtime shutting down) leaves it for the next start.
#[derive(Debug)]
pub(crate) struct RunRecord(PathBuf);

impl RunRecord {
    /// The process ended (it was waited for).
    pub(crate) fn ended(self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Records that CRIU process `pid` runs (best effort: a record that cannot be written only
/// means a restart will not wait for it).
pub(crate) fn record(dir: &Path, pid: u32) -> Option<RunRecord> {
    let start = start_time(pid)?;
    let path = dir.join(format!("criu-{pid}"));
    let written = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, format!("{pid} {start}\n")));
    match written {
        Ok(()) => Some(RunRecord(path)),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot record a running CRIU");
            None
        }
    }
}

/// Waits (at most `timeout` in all) until no CRIU recorded in `dir` runs any more, then removes
/// the records. A record whose pid now belongs to another process (another start time) is
/// stale. Returns how many were still running. Blocking.
pub fn wait_for_survivors(dir: &Path, timeout: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let deadline = Instant::now() + timeout;
    let mut waited = 0;
    for entry in entries.filter_map(|e| e.ok()) {
        let path = entry.path();
        let recorded = std::fs::read_to_string(&path).ok().and_then(|text| parse_record(&text));
        if let Some((pid, start)) = recorded
            && start_time(pid) == Some(start)
        {
            waited += 1;
            tracing::info!(pid, "waiting for a CRIU the previous server left running");
            while start_time(pid) == Some(start) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if start_time(pid) == Some(start) {
                tracing::warn!(pid, "a CRIU the previous server left is still running; going on");
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    waited
}

fn parse_record(text: &str) -> Option<(u32, u64)> {
    let (pid, start) = text.trim().split_once(' ')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// Field 22 of `/proc/PID/stat` (start time in clock ticks since boot): with the pid, it names
/// one process for good. `None` once the process is gone (a zombie counts as gone).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from its end.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_process_is_waited_for_and_a_stale_record_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep").arg("0.3").spawn().unwrap();
        let pid = child.id();
        let record = record(dir.path(), pid).expect("recorded");
        drop(record); // as if the server died: the record stays
        std::fs::write(dir.path().join("criu-1"), "1 1\n").unwrap(); // pid 1 started later than tick 1
        assert_eq!(wait_for_survivors(dir.path(), Duration::from_secs(10)), 1);
        assert_eq!(start_time(pid), None, "returned while the process still ran");
        child.wait().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "records removed");
    }
}
