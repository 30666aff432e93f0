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
/// (see [`criu`]). The signal comes when the thread that forked the child ends: CRIU is
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
/// to `log`; its stderr (what the tools it runs print) goes to `stderr`.
///
/// The run does not depend on its caller: CRIU's output goes to a file (a pipe to the server
/// would end with the server, and CRIU with SIGPIPE), and it is waited for, its record held, on
/// a task of its own. A caller that goes away (a request cancelled, the server dying) leaves
/// the dump to finish: killing CRIU while its parasite runs inside the sandbox's tasks kills
/// them (see `survivors.rs`).
pub(crate) async fn criu(
    criu: &Criu,
    action: &'static str,
    args: &[OsString],
    env: &[(&str, &Path)],
    log: &Path,
    stderr: &Path,
) -> Result<Duration> {
    let binary = criu.path.as_path();
    let spawn_err = |source| CriuError::Spawn { path: binary.to_path_buf(), source };
    let stderr_file = std::fs::File::create(stderr).map_err(spawn_err)?;
    let mut command = tokio::process::Command::new(binary);
    command.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr_file);
    for (key, value) in env {
        command.env(key, value);
    }
    let private_run = criu.private_run.as_deref().map(PrivateRun::new).transpose().map_err(spawn_err)?;
    // SAFETY: `enter` only makes syscalls (no allocation, no locks): fit for a forked child.
    unsafe { command.pre_exec(move || private_run.as_ref().map_or(Ok(()), PrivateRun::enter)) };
    tracing::debug!(criu = %binary.display(), ?args, "running criu {action}");
    let started = Instant::now();
    let mut child = command.spawn().map_err(spawn_err)?;
    let record = criu.records.as_deref().zip(child.id()).and_then(|(dir, pid)| crate::survivors::record(dir, pid));
    let waited = tokio::spawn(async move {
        let status = child.wait().await;
        if let Some(record) = record {
            record.ended();
        }
        status
    });
    let status = waited.await.map_err(|e| spawn_err(std::io::Error::other(e)))?.map_err(spawn_err)?;
    let wall = started.elapsed();
    if status.success() {
        return Ok(wall);
    }
    let text = tokio::fs::read_to_string(log).await.unwrap_or_default();
    let stderr_text = tokio::fs::read_to_string(stderr).await.unwrap_or_default();
    Err(CriuError::Failed {
        action,
        status: status.to_string(),
        log: log.to_path_buf(),
        excerpt: log_excerpt(&text, &stderr_text),
    })
}
