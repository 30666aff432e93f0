//! Choosing the accelerator: KVM only where a bounded probe boots the guest kernel with it.
//!
//! A `/dev/kvm` is not enough: on these hosts it is PVM nesting, under which a stock guest
//! kernel hangs. The probe boots the sandbox kernel without a root (`-kernel` only, a serial
//! console on stdout): a kernel that gets as far as "Kernel panic" (no root to mount) ran
//! its whole early boot under KVM. With `panic=-1` and `-no-reboot` QEMU then exits.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::qemu::AccelKind;

/// How the runtime picks its accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AccelPolicy {
    /// KVM if the probe boots a guest within [`PROBE_TIMEOUT`], else TCG.
    #[default]
    Auto,
    /// TCG without probing.
    Tcg,
}

/// The accelerator in use and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accelerator {
    pub kind: AccelKind,
    pub reason: String,
}

/// Bound on the probe: a working KVM boots to the panic in well under a second.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(4);

/// Picks the accelerator. The probe's answer is kept in `cache` for the rest of the host's
/// boot (keyed by its boot id, QEMU and the kernel): every node start on one host would get
/// the same answer, and a probe of a hanging KVM costs its whole bound.
pub(crate) fn choose(policy: AccelPolicy, qemu: &Path, kernel: &Path, tsc_khz: u64, cache: &Path) -> Accelerator {
    if policy == AccelPolicy::Tcg {
        return Accelerator { kind: AccelKind::Tcg, reason: "TCG chosen by configuration".into() };
    }
    if !Path::new("/dev/kvm").exists() {
        return Accelerator { kind: AccelKind::Tcg, reason: "no /dev/kvm".into() };
    }
    let key = cache_key(qemu, kernel);
    if let Some(known) = key.as_deref().and_then(|key| cached(cache, key)) {
        return known;
    }
    let chosen = match probe(qemu, kernel, tsc_khz, PROBE_TIMEOUT) {
        Ok(elapsed) => Accelerator { kind: AccelKind::Kvm, reason: format!("KVM probe booted a guest in {elapsed:?}") },
        Err(why) => Accelerator { kind: AccelKind::Tcg, reason: format!("KVM probe: {why}") },
    };
    if let Some(key) = key {
        let kind = if chosen.kind == AccelKind::Kvm { "kvm" } else { "tcg" };
        // Best effort: without the file the next start probes again.
        let _ = std::fs::write(cache, format!("{key}\n{kind}\n{}\n", chosen.reason));
    }
    chosen
}

/// What the probe's answer depends on: this boot of the host, QEMU and the guest kernel.
fn cache_key(qemu: &Path, kernel: &Path) -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let stamp = |p: &Path| std::fs::metadata(p).ok().and_then(|m| m.modified().ok());
    Some(format!("{} {} {:?} {} {:?}", boot.trim(), qemu.display(), stamp(qemu)?, kernel.display(), stamp(kernel)?))
}

fn cached(cache: &Path, key: &str) -> Option<Accelerator> {
    let text = std::fs::read_to_string(cache).ok()?;
    let mut lines = text.lines();
    if lines.next()? != key {
        return None;
    }
    let kind = match lines.next()? {
        "kvm" => AccelKind::Kvm,
        "tcg" => AccelKind::Tcg,
        _ => return None,
    };
    Some(Accelerator { kind, reason: format!("{} (probed earlier in this boot)", lines.next()?) })
}

/// Boots `kernel` under KVM; Ok once its console shows the kernel's panic.
fn probe(qemu: &Path, kernel: &Path, tsc_khz: u64, timeout: Duration) -> Result<Duration, String> {
    let cmdline = format!("console=ttyS0 panic=-1 tsc_early_khz={tsc_khz} root=/dev/nonexistent");
    let started = Instant::now();
    let mut child = Command::new(qemu);
    child
        .args(["-M", "microvm,pit=off,pic=off", "-accel", "kvm", "-cpu", "qemu64", "-m", "128M", "-smp", "1"])
        .args(["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio"])
        .args(["-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"])
        .arg("-kernel")
        .arg(kernel)
        .args(["-append", &cmdline])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: prctl is async-signal-safe and allocates nothing. The probe's QEMU must not
    // outlive a node killed while it waits: a guest hanging under KVM never exits.
    unsafe {
        child.pre_exec(|| match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        });
    }
    let mut child = child.spawn().map_err(|e| format!("cannot run {}: {e}", qemu.display()))?;
    let mut stdout = child.stdout.take().expect("piped");
    // The console is read on a thread of its own: the wait below must be bounded even if
    // QEMU never writes or never exits.
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stdout.read_to_end(&mut text);
        String::from_utf8_lossy(&text).into_owned()
    });
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let console = reader.join().unwrap_or_default();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    match status {
        Some(_) if console.contains("Kernel panic") => Ok(started.elapsed()),
        Some(status) => Err(format!("QEMU ended ({status}) before the guest kernel got far: {}", last_line(&stderr))),
        None => Err(format!("no guest boot within {timeout:?} (the kernel hangs under this KVM)")),
    }
}

fn last_line(text: &str) -> &str {
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output")
}
