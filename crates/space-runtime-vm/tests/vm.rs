//! Real VMs (root only; see tests/common): boot, isolation of the VMM, pause, failures,
//! cleanup.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::*;
use space_runtime::Limits;
use space_runtime_vm::{AccelPolicy, VmError, VmRuntime};

fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} in status"));
    line[field.len()..].trim().to_owned()
}

fn ns_inode(path: impl AsRef<Path>) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

#[tokio::test]
async fn a_vm_boots_jailed_and_its_agent_answers() {
    let t = TestRuntime::new("a_vm_boots_jailed_and_its_agent_answers");
    let image = busybox_image(t.dir.path());
    let spec = t.spec(&image, 256);
    let handle = t.rt.start(&spec).await.expect("start");
    let client = t.rt.agent(&spec.id).await.expect("agent");

    // Its own kernel.
    let (release, _) = run(&client, &["uname", "-r"]).await;
    let host_release = nix::sys::utsname::uname().unwrap().release().to_string_lossy().into_owned();
    assert_eq!(release.trim(), t.rt.kernel_version());
    assert_ne!(release.trim(), host_release.trim());
    let (version, _) = run(&client, &["cat", "/proc/version"]).await;
    assert!(version.contains(t.rt.kernel_version()), "{version}");
    // Files stored in the storage range are the guest's 0.. .
    let (owners, _) = run(&client, &["stat", "-c", "%u:%g", "/bin/busybox", "/etc/owned-by-1000", "/"]).await;
    assert_eq!(owners.split_whitespace().collect::<Vec<_>>(), ["0:0", "1000:1000", "0:0"]);
    let (id, _) = run(&client, &["id", "-u"]).await;
    assert_eq!(id.trim(), "0");
    let (hostname, _) = run(&client, &["cat", "/proc/sys/kernel/hostname"]).await;
    assert_eq!(hostname.trim(), "vmbox");

    // The VMM: unprivileged, its own uid, seccomp, no_new_privs, its own namespaces.
    let pid = handle.pid;
    let uid = t.rt.vmm_uid(&spec.id).expect("an id range");
    assert_ne!(uid, 0);
    let uids: Vec<u32> = status_field(pid, "Uid:").split_whitespace().map(|u| u.parse().unwrap()).collect();
    assert_eq!(uids, [uid; 4], "real, effective, saved and fs uid");
    assert_eq!(status_field(pid, "Seccomp:"), "2");
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    assert_eq!(status_field(pid, "CapEff:"), "0000000000000000");
    assert_eq!(status_field(pid, "CapBnd:"), "0000000000000000");
    for ns in ["net", "mnt", "pid", "ipc", "uts"] {
        assert_ne!(ns_inode(format!("/proc/{pid}/ns/{ns}")), ns_inode(format!("/proc/self/ns/{ns}")), "{ns} namespace");
    }
    // The namespace the gateway attaches to is QEMU's, and holds only lo and the tap.
    let netns = t.rt.network_namespace(&handle).expect("netns");
    assert_eq!(std::fs::File::from(netns).metadata().unwrap().ino(), ns_inode(format!("/proc/{pid}/ns/net")));
    let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap();
    let mut links: Vec<&str> = dev.lines().skip(2).filter_map(|l| l.split(':').next()).map(str::trim).collect();
    links.sort();
    assert_eq!(links, ["lo", "tap0"]);
    // Its root is the jail: QEMU's /proc/<pid>/root has no /etc, no /home.
    let root = format!("/proc/{pid}/root");
    assert!(Path::new(&root).join("usr/bin").is_dir());
    assert!(!Path::new(&root).join("etc/passwd").exists() && !Path::new(&root).join("home").exists());
    assert!(
        t.rt.cgroup_dirs(&spec.id)
            .iter()
            .all(|d| std::fs::read_to_string(d.join("cgroup.procs")).unwrap().contains(&pid.to_string()))
    );
    let stats = t.rt.stats(&spec.id).expect("stats");
    assert!(stats.memory_bytes > 0 && stats.pids > 0, "{stats:?}");

    // A reconnect reaches the same agent.
    t.rt.forget_agent(&spec.id);
    assert!(client.health().await.is_err(), "the forgotten connection still works");
    let again = t.rt.agent(&spec.id).await.expect("reconnect");
    assert_eq!(run(&again, &["true"]).await.1, 0);
    assert!(t.rt.is_alive(&handle));
    // A replayed start returns the running VM.
    assert_eq!(t.rt.start(&spec).await.expect("replayed start"), handle);

    t.rt.destroy(&spec.id).await.expect("destroy");
    assert!(!t.rt.is_alive(&handle));
    assert_gone(&t.rt, &spec.id, Some(pid));
    t.rt.destroy(&spec.id).await.expect("destroy is idempotent");
}

#[tokio::test]
async fn pause_stops_the_guest_until_resume() {
    let t = TestRuntime::new("pause_stops_the_guest_until_resume");
    let image = busybox_image(t.dir.path());
    let spec = t.spec(&image, 256);
    t.rt.start(&spec).await.expect("start");
    let client = t.rt.agent(&spec.id).await.expect("agent");
    assert_eq!(run(&client, &["true"]).await.1, 0);

    t.rt.pause(&spec.id).await.expect("pause");
    let pending = tokio::spawn({
        let client = client.clone();
        async move { run(&client, &["echo", "after"]).await }
    });
    // Liveness, not timing: a paused guest runs nothing, however long one waits.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!pending.is_finished(), "an exec answered while the VM was paused");
    t.rt.resume(&spec.id).await.expect("resume");
    let (out, code) =
        tokio::time::timeout(Duration::from_secs(30), pending).await.expect("no answer after resume").unwrap();
    assert_eq!((out.trim(), code), ("after", 0));
    // CPU quota changes; guest memory cannot.
    t.rt.set_limits(&spec.id, &Limits { memory_mib: 256, millicpus: 500, pids: 0 }).expect("cpu limit");
    let err = t.rt.set_limits(&spec.id, &Limits { memory_mib: 512, millicpus: 500, pids: 0 }).unwrap_err();
    assert!(matches!(err, VmError::MemoryFixedAtBoot { boot_mib: 256, asked_mib: 512 }), "{err}");
}

#[tokio::test]
async fn a_disk_without_a_root_fails_start_and_leaves_nothing() {
    let t = TestRuntime::new("a_disk_without_a_root_fails_start_and_leaves_nothing");
    let image = t.dir.path().join("zeros.img");
    std::fs::File::create(&image).unwrap().set_len(64 << 20).unwrap();
    let spec = t.spec(&image, 256);
    let err = t.rt.start(&spec).await.expect_err("a VM without a root filesystem started");
    assert!(matches!(err, VmError::VmmExited { .. } | VmError::AgentTimeout { .. }), "{err}");
    assert_gone(&t.rt, &spec.id, None);
}

#[tokio::test]
async fn a_guest_that_does_not_answer_in_time_fails_start_and_leaves_nothing() {
    // Shorter than any boot: the agent cannot have answered by then.
    let t = TestRuntime::with("a_guest_that_does_not_answer_in_time", |o| o.start_timeout = Duration::from_millis(300));
    let image = busybox_image(t.dir.path());
    let spec = t.spec(&image, 256);
    let err = t.rt.start(&spec).await.expect_err("started within 300 ms");
    assert!(matches!(err, VmError::AgentTimeout { .. }), "{err}");
    assert_gone(&t.rt, &spec.id, None);
}

#[tokio::test]
async fn qemu_failing_reports_its_last_stderr_line() {
    // Two tasks are too few for QEMU's threads: it fails creating one and says so.
    let t = TestRuntime::with("qemu_failing_reports_its_last_stderr_line", |o| o.vmm_pids = 2);
    let image = busybox_image(t.dir.path());
    let spec = t.spec(&image, 256);
    match t.rt.start(&spec).await {
        Err(VmError::VmmExited { last_line: Some(line) }) => assert!(line.contains("qemu"), "{line}"),
        other => panic!("expected QEMU to exit with a message, got {other:?}"),
    }
    assert_gone(&t.rt, &spec.id, None);
}

#[tokio::test]
async fn wait_exit_resolves_when_the_guest_powers_off() {
    let t = TestRuntime::new("wait_exit_resolves_when_the_guest_powers_off");
    let image = busybox_image(t.dir.path());
    let spec = t.spec(&image, 256);
    let handle = t.rt.start(&spec).await.expect("start");
    let client = t.rt.agent(&spec.id).await.expect("agent");
    let spec_off = space_proto::ExecSpec {
        argv: vec!["/bin/busybox".into(), "poweroff".into(), "-f".into()],
        detached: true,
        ..Default::default()
    };
    let _ = client.exec(spec_off).await;
    tokio::time::timeout(Duration::from_secs(30), t.rt.wait_exit(&handle)).await.expect("the VMM did not exit");
    assert!(!t.rt.is_alive(&handle));
    assert!(matches!(t.rt.network_namespace(&handle), Err(VmError::NotFound(_))));
    t.rt.destroy(&spec.id).await.expect("destroy");
    assert_gone(&t.rt, &spec.id, Some(handle.pid));
}

#[test]
fn the_accelerator_choice_is_bounded_and_explained() {
    let t = TestRuntime::with("the_accelerator_choice_is_bounded_and_explained", |o| o.accel = AccelPolicy::Auto);
    let accel = t.rt.accelerator();
    assert!(!accel.reason.is_empty());
    let support = t.rt.support().expect("support");
    assert!(support.starts_with("QEMU ") && support.contains(&accel.reason), "{support}");
    eprintln!("{support}");
}

/// A listener the node opens in the VMM's namespace (as the gateway does) answers the guest
/// at the gateway's address and at any other address; a port nobody listens on refuses.
#[tokio::test]
async fn the_guest_reaches_listeners_in_the_vmm_namespace_and_nothing_else() {
    use std::io::{BufRead, Write};
    let t = TestRuntime::new("the_guest_reaches_listeners_in_the_vmm_namespace_and_nothing_else");
    let image = busybox_image(t.dir.path());
    let spec = t.spec(&image, 256);
    let handle = t.rt.start(&spec).await.expect("start");
    let netns = t.rt.network_namespace(&handle).expect("netns");
    let listener = std::thread::spawn(move || {
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        std::net::TcpListener::bind("0.0.0.0:7000").unwrap()
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(2) {
            let mut stream = stream.unwrap();
            let mut line = String::new();
            std::io::BufReader::new(&stream).read_line(&mut line).unwrap();
            let local = stream.local_addr().unwrap();
            writeln!(stream, "pong {} {local}", line.trim()).unwrap();
        }
    });
    let client = t.rt.agent(&spec.id).await.expect("agent");
    for addr in ["10.254.254.1", "203.0.113.7"] {
        let script = format!("echo ping | nc {addr} 7000");
        let (out, code) = run(&client, &["sh", "-c", &script]).await;
        assert_eq!((out.trim(), code), (format!("pong ping {addr}:7000").as_str(), 0), "via {addr}");
    }
    let (_, code) = run(&client, &["sh", "-c", "echo ping | nc 10.254.254.1 7001"]).await;
    assert_ne!(code, 0, "a port nobody listens on answered");
}

/// A new runtime instance (a restarted node) adopts a running VM, reaches its agent and
/// destroys it.
#[tokio::test]
async fn a_restarted_runtime_adopts_and_destroys_a_running_vm() {
    let t = TestRuntime::new("a_restarted_runtime_adopts_and_destroys_a_running_vm");
    let image = busybox_image(t.dir.path());
    let spec = t.spec(&image, 256);
    let handle = t.rt.start(&spec).await.expect("start");
    // The old instance's connection ends with it; QEMU serves one at a time.
    t.rt.forget_agent(&spec.id);
    let restarted = VmRuntime::new(t.rt.options().clone()).expect("second instance");
    assert_eq!(restarted.list().unwrap(), vec![spec.id.clone()]);
    assert_eq!(restarted.vmm_uid(&spec.id), t.rt.vmm_uid(&spec.id), "the id range survived the sweep");
    assert!(restarted.adopt(&handle));
    let client = restarted.agent(&spec.id).await.expect("agent after adoption");
    assert_eq!(run(&client, &["true"]).await.1, 0);
    restarted.destroy(&spec.id).await.expect("destroy");
    assert_gone(&restarted, &spec.id, Some(handle.pid));
    let stale = space_runtime_vm::VmHandle { pid: std::process::id(), ..handle };
    assert!(!restarted.adopt(&stale), "adopted a process outside the VM's cgroup");
}
