//! The `debian` built-in: debootstrap bookworm minbase, cached (unshifted) as a tarball so
//! later builds on fresh data dirs extract it in seconds without network.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::cmd::{self, Tail};
use crate::error::{IoContext, Result};
use crate::import::extract_tar;
use crate::progress::{Progress, ProgressFn};
use crate::template::{TemplateInfo, TemplateStore};
use crate::util::ensure_dir;

pub const SUITE: &str = "bookworm";
pub const MIRROR: &str = "http://deb.debian.org/debian";
/// What an agent needs to work on a Python (or C) project: pip and venv, a compiler, git,
/// curl, an editor and a pager.
pub const PACKAGES: &str = "bash,coreutils,python3,python3-pip,python3-venv,python3-dev,build-essential,git,curl,\
                            ca-certificates,procps,less,nano";

/// The cache's file name: `debian-<suite>-<first 8 hex of sha256(PACKAGES)>.tar`, so a
/// change of the package list builds (and caches) afresh instead of reusing an older tree.
pub fn cache_file() -> String {
    use sha2::{Digest, Sha256};
    let hash = hex::encode(Sha256::digest(PACKAGES.as_bytes()));
    format!("debian-{SUITE}-{}.tar", &hash[..8])
}

/// Builds the debian template from the cache if present, else with debootstrap (filling the
/// cache).
pub fn build(store: &TemplateStore, cache_dir: &Path, progress: ProgressFn) -> Result<TemplateInfo> {
    let cache = cache_dir.join(cache_file());
    if cache.is_file() {
        let source = format!("builtin debian {SUITE} minbase (from cache {})", cache.display());
        return store.build("debian", crate::template::Origin::described(source), progress, |staging| {
            extract_tar(&cache, staging, progress)
        });
    }
    let source = format!("builtin debian {SUITE} minbase (debootstrap from {MIRROR})");
    store.build("debian", crate::template::Origin::described(source), progress, |staging| {
        debootstrap(staging, progress)?;
        tidy(staging)?;
        if let Err(e) = write_cache(staging, cache_dir, &cache, progress) {
            tracing::warn!(error = %e, "could not cache the debian tree; the next build will download again");
        }
        Ok(())
    })
}

/// Runs debootstrap into `target`, turning its `I:` lines into progress reports.
fn debootstrap(target: &Path, progress: ProgressFn) -> Result<()> {
    let mut command = Command::new("debootstrap");
    command
        .args(["--variant=minbase", &format!("--include={PACKAGES}"), SUITE])
        .arg(target)
        .arg(MIRROR)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    tracing::info!(command = %cmd::render(&command), "running debootstrap");
    let mut child = cmd::spawn(&mut command)?;
    let lines = cmd::line_channel(&mut child);
    let mut state = DebootstrapProgress::default();
    let mut tail = Tail::default();
    for line in lines {
        if let Some(p) = state.on_line(&line) {
            progress(p);
        }
        tail.push(line);
    }
    let status = child.wait().ctx("wait for debootstrap", target)?;
    // debootstrap mounts /proc and /sys in the target; make sure nothing stays mounted.
    crate::mount::unmount_tree(target)?;
    if !status.success() {
        let hint = "debootstrap needs network access to deb.debian.org; or place a prebuilt tree \
                    at <cache_dir>/debian-bookworm-<hash>.tar (see docs/storage.md)";
        return Err(cmd::failed(&command, status, &tail.text(), hint));
    }
    Ok(())
}

/// Drops host-specific files debootstrap copies in (each sandbox gets its own identity; the
/// runtime writes resolv.conf).
fn tidy(root: &Path) -> Result<()> {
    for file in ["etc/hostname", "etc/resolv.conf"] {
        let path = root.join(file);
        crate::util::remove_any(&path)?;
    }
    let resolv = root.join("etc/resolv.conf");
    std::fs::write(&resolv, "# written by the space runtime\n").ctx("write", &resolv)
}

fn write_cache(root: &Path, cache_dir: &Path, cache: &Path, progress: ProgressFn) -> Result<()> {
    progress(Progress::new("caching", 0, None));
    ensure_dir(cache_dir, 0o755)?;
    let partial = cache.with_extension(format!("tar.partial-{}", std::process::id()));
    let mut tar = Command::new("tar");
    tar.args(["--create", "--numeric-owner", "--one-file-system"])
        .args(["--xattrs", "--xattrs-include=security.capability"])
        .arg("--file")
        .arg(&partial)
        .arg("--directory")
        .arg(root)
        .arg(".");
    let result = cmd::run(&mut tar, "check the cache directory has free space");
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, cache).ctx("rename", cache)?;
    tracing::info!(cache = %cache.display(), "cached debian tree");
    Ok(())
}

/// Turns debootstrap's `I: Retrieving|Extracting|Unpacking|Configuring <pkg>` lines into
/// progress. The package count is known once downloads finish.
#[derive(Debug, Default)]
pub struct DebootstrapProgress {
    packages: u64,
    phase: &'static str,
    done: u64,
}

impl DebootstrapProgress {
    pub fn on_line(&mut self, line: &str) -> Option<Progress> {
        let rest = line.trim().strip_prefix("I: ")?;
        let (verb, object) = rest.split_once(' ')?;
        let (phase, is_package) = match verb {
            // "Retrieving adduser 3.134" is a package; "Retrieving Packages" is an index.
            "Retrieving" => ("downloading packages", object.split(' ').count() == 2),
            // "Unpacking adduser..." is a package; "Unpacking the base system..." is not.
            "Extracting" => ("extracting packages", !object.contains(' ')),
            "Unpacking" => ("unpacking packages", !object.contains(' ')),
            "Configuring" => ("configuring packages", !object.contains(' ')),
            _ => return None,
        };
        if !is_package {
            return None;
        }
        if phase != self.phase {
            self.phase = phase;
            self.done = 0;
        }
        self.done += 1;
        let total = if phase == "downloading packages" {
            self.packages = self.done;
            None
        } else {
            Some(self.packages.max(self.done))
        };
        Some(Progress::new(phase, self.done, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_debootstrap_output() {
        let mut p = DebootstrapProgress::default();
        let lines = [
            "I: Retrieving InRelease",
            "I: Retrieving Packages",
            "I: Validating Packages",
            "I: Resolving dependencies of required packages...",
            "I: Retrieving adduser 3.134",
            "I: Validating adduser 3.134",
            "I: Retrieving apt 2.6.1",
            "I: Retrieving bash 5.2.15-2+b2",
            "I: Extracting adduser...",
            "I: Installing required packages...",
            "I: Unpacking required packages...",
            "I: Unpacking adduser...",
            "I: Configuring adduser...",
            "I: Configuring apt...",
            "I: Configuring the base system...",
            "W: something",
        ];
        let seen: Vec<Progress> = lines.iter().filter_map(|l| p.on_line(l)).collect();
        let expect = [
            ("downloading packages", 1, None),
            ("downloading packages", 2, None),
            ("downloading packages", 3, None),
            ("extracting packages", 1, Some(3)),
            ("unpacking packages", 1, Some(3)),
            ("configuring packages", 1, Some(3)),
            ("configuring packages", 2, Some(3)),
        ];
        let expect: Vec<Progress> =
            expect.iter().map(|(phase, done, total)| Progress::new(*phase, *done, *total)).collect();
        assert_eq!(seen, expect);
    }
}
