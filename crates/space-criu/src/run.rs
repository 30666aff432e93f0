//! Running one CRIU command and turning its failure into an error with the log's excerpt.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::Criu;
use crate::error::{CriuError, Result, log_excerpt};
use crate::kerndat::PrivateRun;

/// In a forked child that will exec CRIU for a restore: SIGKILL when the server dies
/// (`PR_SET_PDEATHSIG`, kept across exec). A half-made restore belongs to nothing once the
/// server is gone (the restarted server removes its tree by its cgroups). Dumps are not killed
/// (see `survivors.rs`). The signal comes when the thread that forked the child ends: CRIU is
/// spawned from threads that wait for it. Checks the parent afterwards, in case the server
/// died before the call.
pub(crate) fn die_with(server: u32) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if std::os::unix::process::parent_id() != server {
        return Err(std::io::Error::other("the server died before CRIU started"));
    }
    Ok(())
}

/// Runs `criu <args>` (environment: ours plus `env`) to completion. CRIU writes its real log
/// to `log`; its stdout and stderr only carry what the tools it runs print.
pub(crate) async fn criu(
    criu: &Criu,
    action: &'static str,
    args: &[OsString],
    env: &[(&str, &Path)],
    log: &Path,
) -> Result<Duration> {
    let binary = criu.path.as_path();
    let mut command = tokio::process::Command::new(binary);
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let private_run = criu
        .private_run
        .as_deref()
        .map(PrivateRun::new)
        .transpose()
        .map_err(|source| CriuError::Spawn { path: binary.to_path_buf(), source })?;
    // SAFETY: `enter` only makes syscalls (no allocation, no locks): fit for a forked child.
    unsafe { command.pre_exec(move || private_run.as_ref().map_or(Ok(()), PrivateRun::enter)) };
    tracing::debug!(criu = %binary.display(), ?args, "running criu {action}");
    let started = Instant::now();
    let spawn_err = |source| CriuError::Spawn { path: binary.to_path_buf(), source };
    let child = command.spawn().map_err(spawn_err)?;
    let record = criu.records.as_deref().zip(child.id()).and_then(|(dir, pid)| crate::survivors::record(dir, pid));
    let output = child.wait_with_output().await.map_err(spawn_err)?;
    drop(record);
    let wall = started.elapsed();
    if output.status.success() {
        return Ok(wall);
    }
    let text = tokio::fs::read_to_string(log).await.unwrap_or_default();
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(CriuError::Failed {
        action,
        status: output.status.to_string(),
        log: log.to_path_buf(),
        excerpt: log_excerpt(&text, &stderr),
    })
}
