//! What a node needs of its host, named by the same flags for `space serve` and `space
//! doctor`: the binaries it runs and the id range it uses.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use space_node::VmConfig;
use space_storage::IdMap;

#[derive(Args, Clone)]
pub struct HostArgs {
    /// The static `spaced` binary (default: next to this executable).
    #[arg(long, env = "SPACED_BIN")]
    pub spaced: Option<PathBuf>,
    /// CRIU (>= 4.2) for full snapshots, suspend and resume (default:
    /// /var/cache/space/criu/bin/criu, as scripts/install-criu.sh installs it, else `criu` on
    /// PATH).
    #[arg(long, env = "SPACE_CRIU")]
    pub criu: Option<PathBuf>,
    /// QEMU for the vm runtime.
    #[arg(long, default_value = "/usr/bin/qemu-system-x86_64")]
    pub qemu: PathBuf,
    /// The jailer every VMM starts under (default: `space-vm-jailer` next to this executable).
    #[arg(long, env = "SPACE_VM_JAILER")]
    pub vm_jailer: Option<PathBuf>,
    /// Guest kernel and initramfs of the vm runtime, as scripts/install-vm.sh makes them.
    #[arg(long, default_value = "/var/cache/space/vm")]
    pub vm_guest_dir: PathBuf,
    /// First host uid/gid of the storage range: files on disk are stored with ids 0..65536 of a
    /// sandbox shifted to it. Each sandbox runs in a range of its own after it (4096 ranges of
    /// 65536 ids): nodes sharing a host need bases that far apart.
    #[arg(long, default_value_t = 100_000)]
    pub uid_base: u32,
}

impl HostArgs {
    pub fn spaced(&self) -> anyhow::Result<PathBuf> {
        find_spaced(self.spaced.clone())
    }

    pub fn id_map(&self) -> IdMap {
        IdMap { host_base: self.uid_base, count: 65_536 }
    }

    pub fn vm(&self) -> VmConfig {
        VmConfig {
            qemu: self.qemu.clone(),
            jailer: self.vm_jailer.clone().unwrap_or_else(|| beside_this_executable("space-vm-jailer")),
            guest_dir: self.vm_guest_dir.clone(),
        }
    }
}

/// `name` in this executable's directory.
pub(crate) fn beside_this_executable(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().unwrap_or(Path::new("/")).join(name)
}

/// Finds `spaced`: the flag, then beside this executable, then cargo's static-build output.
fn find_spaced(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(path) = flag {
        return Ok(path);
    }
    let exe = std::env::current_exe().context("locating the space executable")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join("spaced"), dir.join("../x86_64-unknown-linux-gnu/release/spaced")];
    for candidate in &candidates {
        if candidate.is_file() {
            return Ok(candidate.clone());
        }
    }
    bail!(
        "cannot find the spaced binary next to {}; build it with `cargo build-spaced` or pass --spaced",
        exe.display()
    )
}
