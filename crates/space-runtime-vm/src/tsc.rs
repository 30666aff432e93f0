//! The host's TSC frequency, for the guest's `tsc_early_khz=`: a PVH boot without it can
//! hang calibrating against timers that microvm does not have (no PIT).
//!
//! Sources, most exact first: the kernel's sysfs value (only some kernels export it), the
//! kernel's own calibration in its log, the hypervisor's timing leaf (the host itself is a
//! VM here), then `/proc/cpuinfo`'s "cpu MHz".

use std::path::Path;

/// A frequency and where it came from (shown by `VmRuntime::support`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TscFrequency {
    pub khz: u64,
    pub source: &'static str,
}

pub(crate) fn host_tsc() -> Option<TscFrequency> {
    let sysfs = || {
        let text = std::fs::read_to_string(Path::new("/sys/devices/system/cpu/cpu0/tsc_freq_khz")).ok()?;
        text.trim().parse::<u64>().ok().filter(|k| *k > 0)
    };
    if let Some(khz) = sysfs() {
        return Some(TscFrequency { khz, source: "sysfs tsc_freq_khz" });
    }
    if let Some(khz) = read_kmsg().as_deref().and_then(from_kernel_log) {
        return Some(TscFrequency { khz, source: "kernel log" });
    }
    if let Some(khz) = hypervisor_leaf() {
        return Some(TscFrequency { khz, source: "CPUID 0x40000010" });
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    from_cpuinfo(&cpuinfo).map(|khz| TscFrequency { khz, source: "/proc/cpuinfo cpu MHz" })
}

/// The kernel's log records as far back as its ring buffer still holds them (non-blocking).
fn read_kmsg() -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg").ok()?;
    let mut text = String::new();
    let mut record = [0u8; 8192];
    // One record per read; EAGAIN at the end, EPIPE when a record was overwritten meanwhile.
    for _ in 0..100_000 {
        match file.read(&mut record) {
            Ok(0) => break,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&record[..n])),
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    Some(text)
}

/// "tsc: Refined TSC clocksource calibration: 2596.123 MHz" wins over "tsc: Detected 2596.120
/// MHz processor" (the refined one is measured against a reference clock).
fn from_kernel_log(log: &str) -> Option<u64> {
    let find = |marker: &str| {
        log.lines().rev().find_map(|line| {
            let rest = &line[line.find(marker)? + marker.len()..];
            mhz_to_khz(rest.split_whitespace().next()?)
        })
    };
    find("Refined TSC clocksource calibration:").or_else(|| find("tsc: Detected"))
}

fn from_cpuinfo(cpuinfo: &str) -> Option<u64> {
    cpuinfo.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == "cpu MHz").then(|| mhz_to_khz(value.trim()))?
    })
}

/// "2596.123" MHz → 2596123 kHz, without going through floating point.
fn mhz_to_khz(text: &str) -> Option<u64> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let mut frac: String = frac.chars().take(3).collect();
    while frac.len() < 3 {
        frac.push('0');
    }
    let khz = int.parse::<u64>().ok()? * 1000 + frac.parse::<u64>().ok()?;
    (khz > 0).then_some(khz)
}

/// KVM and VMware's timing leaf: EAX of CPUID 0x40000010 is the TSC frequency in kHz, when
/// the hypervisor's maximum leaf reaches it.
fn hypervisor_leaf() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        let hypervisor = __cpuid(1).ecx & (1 << 31) != 0;
        if !hypervisor {
            return None;
        }
        // Leaves 0x4000_0000.. are the hypervisor's; elsewhere they read as zeros or as the
        // highest basic leaf, which the range check rejects.
        let max = __cpuid(0x4000_0000).eax;
        if !(0x4000_0010..0x4001_0000).contains(&max) {
            return None;
        }
        let khz = __cpuid(0x4000_0010).eax;
        (khz > 0).then_some(u64::from(khz))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_source() {
        assert_eq!(mhz_to_khz("2596.12"), Some(2_596_120));
        assert_eq!(mhz_to_khz("3000"), Some(3_000_000));
        assert_eq!(mhz_to_khz("x"), None);
        let log = "6,1,0,-;tsc: Detected 2596.120 MHz processor\n\
                   6,300,0,-;clocksource: tsc: mask\n\
                   6,301,0,-;tsc: Refined TSC clocksource calibration: 2596.993 MHz\n";
        assert_eq!(from_kernel_log(log), Some(2_596_993));
        assert_eq!(from_kernel_log("6,1,0,-;tsc: Detected 2596.120 MHz processor"), Some(2_596_120));
        assert_eq!(from_cpuinfo("processor\t: 0\ncpu MHz\t\t: 2596.120\n"), Some(2_596_120));
    }

    #[test]
    fn this_host_has_one() {
        let tsc = host_tsc().expect("no TSC frequency found");
        assert!(tsc.khz > 100_000, "{tsc:?}");
    }
}
