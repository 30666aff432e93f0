//! Built-in templates: `busybox` (from the host's static busybox, seconds, offline) and
//! `debian` (debootstrap bookworm minbase, cached as a tarball).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd;
use crate::error::{IoContext, Result, StorageError};
use crate::progress::{Progress, ProgressFn};
use crate::template::{Origin, TemplateInfo, TemplateStore};

/// Where finished built-in trees are cached unless told otherwise.
pub const DEFAULT_TEMPLATE_CACHE_DIR: &str = "/var/cache/space/templates";
/// The names `build_builtin` accepts.
pub const BUILTINS: [&str; 2] = ["busybox", "debian"];

const BUSYBOX: &str = "/bin/busybox";
const PT_INTERP: u32 = 3;

const BUSYBOX_DIRS: [(&str, u32); 13] = [
    ("bin", 0o755),
    ("sbin", 0o755),
    ("usr/bin", 0o755),
    ("usr/sbin", 0o755),
    ("etc", 0o755),
    ("root", 0o700),
    ("tmp", 0o1777),
    ("proc", 0o555),
    ("sys", 0o555),
    ("dev", 0o755),
    ("home", 0o755),
    ("var", 0o755),
    ("var/tmp", 0o1777),
];

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";
const PROFILE: &str = "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
export HOME=\"${HOME:-/root}\"\nPS1='\\h:\\w\\$ '\n";

impl TemplateStore {
    /// Builds a built-in template (`busybox` or `debian`) as a new version. `cache_dir`
    /// (default [`DEFAULT_TEMPLATE_CACHE_DIR`]) keeps the finished debian tree so later builds
    /// only extract it.
    pub fn build_builtin(&self, name: &str, cache_dir: Option<&Path>, progress: ProgressFn) -> Result<TemplateInfo> {
        let cache_dir = cache_dir.map_or_else(|| PathBuf::from(DEFAULT_TEMPLATE_CACHE_DIR), Path::to_path_buf);
        match name {
            "busybox" => {
                let source = busybox_source()?;
                self.build(name, Origin::described(source), progress, |staging| fill_busybox(staging, progress))
            }
            "debian" => crate::debian::build(self, &cache_dir, progress),
            _ => Err(StorageError::UnknownBuiltin { name: name.to_owned() }),
        }
    }
}

/// Checks the host busybox exists and is static; returns its version line.
fn busybox_source() -> Result<String> {
    let missing = || StorageError::MissingTool { program: BUSYBOX.into(), package: "busybox-static" };
    let elf = std::fs::read(BUSYBOX).map_err(|_| missing())?;
    if has_interpreter(&elf) {
        return Err(StorageError::BadTemplateContent {
            path: BUSYBOX.into(),
            reason: "is dynamically linked: run `apt-get install busybox-static`".into(),
        });
    }
    let banner = cmd::run(&mut Command::new(BUSYBOX), "").or_else(|e| match e {
        StorageError::Command { output, .. } => Ok(output),
        other => Err(other),
    })?;
    let version = banner.lines().next().unwrap_or("BusyBox").trim().to_owned();
    Ok(format!("builtin busybox: {version}"))
}

/// Does this 64-bit little-endian ELF file ask for a dynamic loader (PT_INTERP)?
pub fn has_interpreter(elf: &[u8]) -> bool {
    let u16_at = |at: usize| elf.get(at..at + 2).map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64_at =
        |at: usize| elf.get(at..at + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize);
    if !elf.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        elf.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])) == Some(PT_INTERP)
    })
}

fn fill_busybox(root: &Path, progress: ProgressFn) -> Result<()> {
    progress(Progress::new("installing busybox", 0, None));
    for (dir, mode) in BUSYBOX_DIRS {
        let path = root.join(dir);
        std::fs::create_dir_all(&path).ctx("create directory", &path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).ctx("chmod", &path)?;
    }
    let target = root.join("bin/busybox");
    std::fs::copy(BUSYBOX, &target).ctx("copy busybox", &target)?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).ctx("chmod", &target)?;
    let list = cmd::run(Command::new(BUSYBOX).arg("--list-full"), "")?;
    let applets = applet_paths(&list);
    let total = applets.len() as u64;
    for (i, applet) in applets.iter().enumerate() {
        link_applet(root, applet)?;
        progress(Progress::new("linking applets", i as u64 + 1, Some(total)));
    }
    link_applet(root, "bin/sh")?;
    for (file, text) in [("etc/passwd", PASSWD), ("etc/group", GROUP), ("etc/profile", PROFILE)] {
        let path = root.join(file);
        std::fs::write(&path, text).ctx("write", &path)?;
    }
    Ok(())
}

/// The applet paths of `busybox --list-full` that are safe relative paths under a known
/// directory (so `linuxrc` and anything odd is skipped).
pub fn applet_paths(list: &str) -> Vec<&str> {
    list.lines()
        .map(str::trim)
        .filter(|p| {
            let (dir, name) = p.rsplit_once('/').unwrap_or(("", p));
            ["bin", "sbin", "usr/bin", "usr/sbin"].contains(&dir)
                && !name.is_empty()
                && name != "busybox"
                && !name.starts_with('.')
        })
        .collect()
}

fn link_applet(root: &Path, applet: &str) -> Result<()> {
    let link = root.join(applet);
    match std::os::unix::fs::symlink("/bin/busybox", &link) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other.ctx("create symlink", &link),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applet_list_is_filtered() {
        let list = "usr/bin/[\nbin/sh\nlinuxrc\nsbin/ifconfig\nbin/busybox\netc/evil\nbin/../x\n\n";
        assert_eq!(applet_paths(list), vec!["usr/bin/[", "bin/sh", "sbin/ifconfig"]);
    }

    #[test]
    fn detects_dynamic_elf() {
        // The test binary itself is dynamically linked (Rust's default on glibc).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(has_interpreter(&me));
        assert!(!has_interpreter(b"not an elf"));
        if let Ok(busybox) = std::fs::read(BUSYBOX) {
            assert!(!has_interpreter(&busybox), "host busybox should be static");
        }
    }
}
