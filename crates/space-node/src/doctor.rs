//! What this host can run, found the way a node finds it (for `space doctor`): each runtime
//! is opened on a scratch run directory, so what it reports is what `space serve` would.

use std::sync::Arc;

use space_api::{RuntimeKind, RuntimeSupport};
use space_runtime::Runtime;
use space_runtime_linux::{LinuxOptions, LinuxRuntime};

use crate::{HostParts, VmConfig, open_vm};

/// One line of the report: a runtime, or full snapshots.
#[derive(Debug, Clone)]
pub struct Finding {
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

/// What the host runs sandboxes with: the node's flags of the same names.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub spaced: std::path::PathBuf,
    pub criu: Option<std::path::PathBuf>,
    pub id_map: space_storage::IdMap,
    pub vm: VmConfig,
}

/// Opens every runtime as a node with `host` would, on a scratch directory that is removed
/// again, and says what works and why not. Needs root, like the node.
pub async fn probe(host: &HostConfig) -> std::io::Result<Vec<Finding>> {
    let scratch = tempfile::Builder::new().prefix("space-doctor-").tempdir()?;
    let run_dir = scratch.path().join("run");
    let cgroup_parent = format!("space-doctor-{}", std::process::id());
    let mut options = LinuxOptions::new(&host.spaced, &run_dir, &cgroup_parent);
    options.id_map = host.id_map;
    options.criu = host.criu.clone();
    let mut findings = Vec::new();
    let linux = LinuxRuntime::new(options).map(|rt| Arc::new(rt) as Arc<dyn Runtime>);
    findings.push(finding(RuntimeKind::Linux, linux.as_ref().map(|r| r.describe()).map_err(|e| e.to_string())));
    if let Ok(linux) = &linux {
        let full = linux.checkpoint_support();
        findings.push(Finding {
            what: "full snapshots (linux)".into(),
            ok: full.is_ok(),
            detail: full.unwrap_or_else(|why| format!("{why}; run scripts/install-criu.sh")),
        });
    }
    findings.push(own_proc_figures());
    let parts =
        HostParts { spaced: &host.spaced, run_dir: &run_dir, cgroup_parent: &cgroup_parent, id_map: host.id_map };
    let vm = open_vm(&parts, &host.vm).await.map(|rt| rt.describe());
    findings.push(finding(RuntimeKind::Vm, vm.map_err(|why| format!("{why}; run scripts/install-vm.sh"))));
    Ok(findings)
}

/// Whether linux sandboxes get lxcfs's `/proc` files (their own memory and uptime).
fn own_proc_figures() -> Finding {
    let dir = std::path::Path::new(space_host::lxcfs::DEFAULT_DIR);
    let lxcfs = space_host::lxcfs::Lxcfs::at(dir).filter(|l| !l.files.is_empty());
    let detail = match &lxcfs {
        None => format!(
            "no working lxcfs at {}: sandboxes see the host's memory and uptime; run scripts/start-lxcfs.sh",
            dir.display()
        ),
        Some(l) if !l.flagged => format!(
            "lxcfs at {} runs without {}: sandboxes see the host's CPU count; run scripts/start-lxcfs.sh",
            dir.display(),
            space_host::lxcfs::FLAGS.join(" ")
        ),
        Some(l) => {
            let names: Vec<String> = l.files.iter().map(|f| format!("/{}", f.display())).collect();
            format!("lxcfs at {}: {}", dir.display(), names.join(", "))
        }
    };
    Finding { what: "own /proc (linux)".into(), ok: lxcfs.is_some_and(|l| l.flagged), detail }
}

fn finding(runtime: RuntimeKind, support: Result<String, String>) -> Finding {
    let RuntimeSupport { runtime, available, detail } = match support {
        Ok(detail) => RuntimeSupport { runtime, available: true, detail },
        Err(detail) => RuntimeSupport { runtime, available: false, detail },
    };
    Finding { what: format!("runtime {runtime}"), ok: available, detail }
}
