//! QEMU's command line: a microvm with only the devices a sandbox needs (root disk, network
//! on the jail's tap, the agent's virtio-serial port, QMP), as fast a guest boot under TCG
//! as HOST-FACTS measured, and QEMU's own seccomp filter.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::jail::{DISK_FD, DISK_RO_FD, MEMORY_FD, TAP_FD};

/// Paths inside the jail.
pub(crate) const JAIL_KERNEL: &str = "/vm/vmlinux";
pub(crate) const JAIL_INITRD: &str = "/vm/initrd";
pub(crate) const JAIL_AGENT_SOCKET: &str = "/run/agent.sock";
pub(crate) const JAIL_QMP_SOCKET: &str = "/run/qmp.sock";
/// The agent socket's chardev.
pub(crate) const AGENT_CHARDEV: &str = "ag";

/// The guest's address behind the tap, and the gateway's (the node's listeners in the VMM's
/// network namespace answer at every address; this one is what the guest routes through).
pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 254, 254, 2);
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(10, 254, 254, 1);

/// The kernel command line HOST-FACTS measured fastest under TCG: no self-tests, no
/// calibration the microvm cannot do (`tsc_early_khz`: a PVH boot can hang without it), no
/// legacy devices probed, and initcalls skipped that cost time and serve no sandbox.
const BASE_CMDLINE: &str = "quiet panic=-1 cryptomgr.notests tsc=reliable no_timer_check mitigations=off audit=0 \
8250.nr_uarts=1 i8042.noaux i8042.nomux i8042.nopnp i8042.nokbd pci=lastbus=0 \
initcall_blacklist=init_kprobe_trace,load_system_certificate_list,crypto_kdf108_init,\
init_trace_printk_function_export,slab_sysfs_init";

/// Which accelerator QEMU uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccelKind {
    Kvm,
    Tcg,
}

/// Everything QEMU's command line is made of, recorded with a VM (`vm.json` in its
/// directory) and with each of its checkpoints: a restore runs the very same machine (devices,
/// RAM size, vCPUs, the kernel and its command line, whose bytes QEMU keeps in fw_cfg), with
/// only the incoming state added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub memory_mib: u64,
    pub vcpus: u32,
    // Absent in the records of a runtime that did not keep them (it recorded RAM and vCPUs
    // only): such a VM cannot be checkpointed, see `Machine::is_complete`.
    #[serde(default = "default_accel")]
    pub accel: AccelKind,
    /// TCG's translation cache in MiB (part of the VMM's memory overhead).
    #[serde(default)]
    pub tb_size_mib: u64,
    #[serde(default)]
    pub tsc_khz: u64,
    #[serde(default)]
    pub hostname: String,
    /// Extra kernel parameters (tests, debugging).
    #[serde(default)]
    pub extra_cmdline: Vec<String>,
    /// Whether the guest console goes to `/run/console.log` (off by default: a guest could
    /// fill the node's disk through it).
    #[serde(default)]
    pub console_log: bool,
    /// Guest RAM is a memory backend object (`mem0`) instead of QEMU's own: that of a
    /// template and of the pods made from it (see [`Ram`]).
    #[serde(default)]
    pub memory_backend: bool,
}

fn default_accel() -> AccelKind {
    AccelKind::Tcg
}

impl Machine {
    /// Whether the record holds the whole command line (see the field comments).
    pub(crate) fn is_complete(&self) -> bool {
        self.tsc_khz != 0 && !self.hostname.is_empty()
    }
}

/// Where a machine with [`Machine::memory_backend`] has its RAM (the backend's RAM block is
/// `mem0` in all three, so a state saved from one loads into another).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ram {
    /// QEMU's own anonymous memory (a machine without a backend, or a pod restored from a
    /// checkpoint of its own, whose state holds all its RAM).
    Own,
    /// The file at [`MEMORY_FD`], mapped shared (a template writes its RAM there) or private
    /// (a pod reads the template's pages and copies those it writes).
    File { shared: bool },
}

/// How QEMU starts the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Boot {
    /// From its kernel.
    Fresh,
    /// Paused, waiting for a state given later (`migrate-incoming`), which replaces RAM and
    /// every device's state.
    Incoming,
}

/// The kernel command line of a sandbox guest.
pub(crate) fn kernel_cmdline(machine: &Machine) -> String {
    let mut line = format!(
        "{BASE_CMDLINE} tsc_early_khz={} space.addr={GUEST_ADDR} space.gw={GATEWAY_ADDR} space.hostname={}",
        machine.tsc_khz, machine.hostname
    );
    if machine.console_log {
        line.push_str(" console=hvc0");
    }
    for extra in &machine.extra_cmdline {
        line.push(' ');
        line.push_str(extra);
    }
    line
}

/// The full argv (argv[0] included).
pub(crate) fn argv(args: &Machine, boot: Boot, ram: Ram) -> Vec<String> {
    let accel = match args.accel {
        AccelKind::Kvm => "kvm".to_string(),
        AccelKind::Tcg => format!("tcg,tb-size={}", args.tb_size_mib),
    };
    let mut argv: Vec<String> = [
        "qemu-system-x86_64",
        "-M",
        if args.memory_backend {
            "microvm,isa-serial=off,pit=off,pic=off,memory-backend=mem0"
        } else {
            "microvm,isa-serial=off,pit=off,pic=off"
        },
        "-accel",
        &accel,
        "-cpu",
        "qemu64",
        "-smp",
        &args.vcpus.to_string(),
        "-m",
        &format!("{}M", args.memory_mib),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        "-kernel",
        JAIL_KERNEL,
        "-initrd",
        JAIL_INITRD,
        "-append",
        &kernel_cmdline(args),
        // The disk image is a descriptor the jailer opened: its path is not in the jail.
        "-add-fd",
        &format!("fd={DISK_FD},set=1"),
        "-add-fd",
        &format!("fd={DISK_RO_FD},set=1"),
        "-drive",
        "id=root,if=none,format=raw,file=/dev/fdset/1,discard=unmap,file.locking=off",
        "-device",
        "virtio-blk-device,drive=root",
        "-netdev",
        &format!("tap,id=net0,fd={TAP_FD}"),
        "-device",
        "virtio-net-device,netdev=net0",
        // Entropy from the host (QEMU's built-in backend, getrandom): without it the guest's
        // getrandom blocks until the kernel has gathered entropy itself, which under TCG
        // takes longer than any start bound (and the agent needs random bytes early).
        "-device",
        "virtio-rng-device",
        "-device",
        "virtio-serial-device,id=vs0",
        "-chardev",
        &format!("socket,id={AGENT_CHARDEV},path={JAIL_AGENT_SOCKET},server=on,wait=off"),
        "-device",
        &format!("virtserialport,bus=vs0.0,chardev={AGENT_CHARDEV},name=agent"),
        "-chardev",
        &format!("socket,id=qmp,path={JAIL_QMP_SOCKET},server=on,wait=off"),
        "-mon",
        "chardev=qmp,mode=control",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    if args.console_log {
        argv.extend(
            ["-chardev", "file,id=con,path=/run/console.log", "-device", "virtconsole,bus=vs0.0,chardev=con"]
                .map(str::to_owned),
        );
    }
    if args.memory_backend {
        let object = match ram {
            Ram::Own => format!("memory-backend-ram,id=mem0,size={}M", args.memory_mib),
            Ram::File { shared } => format!(
                "memory-backend-file,id=mem0,size={}M,mem-path=/proc/self/fd/{MEMORY_FD},share={}",
                args.memory_mib,
                if shared { "on" } else { "off" }
            ),
        };
        argv.extend(["-object".to_owned(), object]);
    }
    if boot == Boot::Incoming {
        // `-S` as well: the guest runs only once the node says so (`cont`), after it has
        // seen the state loaded.
        argv.extend(["-incoming", "defer", "-S"].map(str::to_owned));
    }
    argv
}

/// vCPUs for a CPU limit in thousandths of a core: rounded up, at least one.
pub(crate) fn vcpus(millicpus: u32) -> u32 {
    millicpus.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Machine {
        Machine {
            accel: AccelKind::Tcg,
            tb_size_mib: 64,
            vcpus: 2,
            memory_mib: 256,
            tsc_khz: 2_596_120,
            hostname: "box".into(),
            extra_cmdline: Vec::new(),
            console_log: false,
            memory_backend: false,
        }
    }

    #[test]
    fn command_line_has_the_devices_and_the_sandbox() {
        let argv = argv(&args(), Boot::Fresh, Ram::Own);
        let joined = argv.join(" ");
        assert!(joined.contains("-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"));
        assert!(joined.contains("-accel tcg,tb-size=64 "));
        assert!(joined.contains("-smp 2 -m 256M"));
        assert!(joined.contains("-netdev tap,id=net0,fd=3"));
        assert!(joined.contains("-add-fd fd=4,set=1"));
        assert!(!joined.contains("virtconsole"));
        let cmdline = &argv[argv.iter().position(|a| a == "-append").unwrap() + 1];
        assert!(cmdline.starts_with("quiet panic=-1 "), "{cmdline}");
        assert!(cmdline.contains(" tsc_early_khz=2596120 "), "{cmdline}");
        assert!(cmdline.ends_with("space.addr=10.254.254.2 space.gw=10.254.254.1 space.hostname=box"), "{cmdline}");
        assert!(!joined.contains("-incoming"));
    }

    #[test]
    fn an_incoming_machine_is_the_same_machine_waiting_for_its_state() {
        let fresh = argv(&args(), Boot::Fresh, Ram::Own);
        let incoming = argv(&args(), Boot::Incoming, Ram::Own);
        assert_eq!(&incoming[..fresh.len()], &fresh[..]);
        assert_eq!(&incoming[fresh.len()..], ["-incoming", "defer", "-S"]);
    }

    #[test]
    fn template_memory_is_a_backend_shared_or_private() {
        let machine = Machine { memory_backend: true, ..args() };
        let template = argv(&machine, Boot::Fresh, Ram::File { shared: true }).join(" ");
        assert!(template.contains("-M microvm,isa-serial=off,pit=off,pic=off,memory-backend=mem0 "), "{template}");
        assert!(template.contains("-object memory-backend-file,id=mem0,size=256M,mem-path=/proc/self/fd/6,share=on"));
        let pod = argv(&machine, Boot::Incoming, Ram::File { shared: false }).join(" ");
        assert!(pod.contains(",share=off") && pod.contains("-incoming defer"), "{pod}");
        let own = argv(&machine, Boot::Incoming, Ram::Own).join(" ");
        assert!(own.contains("-object memory-backend-ram,id=mem0,size=256M"), "{own}");
        assert!(!argv(&args(), Boot::Fresh, Ram::Own).join(" ").contains("-object"));
    }

    /// A record of an older runtime (RAM and vCPUs only) still reads, and says it is not
    /// enough to restore from.
    #[test]
    fn machine_records() {
        let old: Machine = serde_json::from_str(r#"{"pid": 7, "memory_mib": 256, "vcpus": 1}"#).unwrap();
        assert_eq!((old.memory_mib, old.vcpus, old.accel), (256, 1, AccelKind::Tcg));
        assert!(!old.is_complete());
        let text = serde_json::to_string(&args()).unwrap();
        assert_eq!(serde_json::from_str::<Machine>(&text).unwrap(), args());
        assert!(args().is_complete());
    }

    #[test]
    fn vcpus_round_up() {
        assert_eq!(vcpus(0), 1);
        assert_eq!(vcpus(500), 1);
        assert_eq!(vcpus(1000), 1);
        assert_eq!(vcpus(1001), 2);
        assert_eq!(vcpus(2500), 3);
    }
}
