//! A counter process in a session, for tests that move or interrupt it: it writes a number
//! one higher every 50 ms, so a read shows whether it kept counting and never went back.

use std::time::{Duration, Instant};

use serde_json::json;

use super::Server;

/// Counts into `/root/c`, replaced whole each time (a read never sees half a number).
pub const COUNTER: &str =
    "n=0; while :; do n=$((n+1)); echo $n > /root/c.new; mv /root/c.new /root/c; sleep 0.05; done";

/// Starts the counter in session `id` in the background, through the API at `base`.
pub fn start_counter(server: &Server, base: &str, id: &str) {
    let body = json!({ "cmd": ["sh", "-c", COUNTER], "background": true });
    let (status, started) = server.call_at(base, "POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{started}");
}

/// What the counter of `id` says now, read through the API at `base` (0 before it counted).
pub fn counter_at(server: &Server, base: &str, id: &str) -> u64 {
    let body = json!({ "cmd": ["sh", "-c", "cat /root/c 2>/dev/null || echo 0"] });
    let (status, out) = server.call_at(base, "POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{out}");
    out["stdout"].as_str().unwrap().trim().parse().unwrap_or(0)
}

/// Polls the counter of `id` through `base` until it passes `value`; returns what it read.
pub fn counter_above_at(server: &Server, base: &str, id: &str, value: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = counter_at(server, base, id);
        if now > value {
            return now;
        }
        assert!(Instant::now() < deadline, "the counter of {id} stays at {now}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `SIGCONT` to a stopped process when dropped, so a failing test leaves nothing
/// stopped.
pub struct Stopped(pub u32);

impl Stopped {
    /// Stops process `pid` (one the test started: a node) with `SIGSTOP`.
    pub fn stop(pid: u32) -> Stopped {
        // SAFETY: kill(2) of a process this test started.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0, "SIGSTOP {pid}");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the process this test started and stopped.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}
