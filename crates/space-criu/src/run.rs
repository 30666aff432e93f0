//! Running one CRIU command and turning its failure into an error with the log's excerpt.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::Criu;
use crate::error::{CriuError, Result, log_excerpt};
use crate::kerndat::PrivateRun;

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
    if let Some(dir) = &criu.private_run {
        let private_run =
            PrivateRun::new(dir).map_err(|source| CriuError::Spawn { path: binary.to_path_buf(), source })?;
        // SAFETY: `enter` only makes syscalls (no allocation, no locks): fit for a forked child.
        unsafe { command.pre_exec(move || private_run.enter()) };
    }
    tracing::debug!(criu = %binary.display(), ?args, "running criu {action}");
    let started = Instant::now();
    let output = command.output().await.map_err(|source| CriuError::Spawn { path: binary.to_path_buf(), source })?;
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
