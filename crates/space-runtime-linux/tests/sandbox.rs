//! Real sandboxes (root only): isolation, limits and cleanup of the linux runtime.

mod common;

use common::*;
use std::path::PathBuf;

use space_runtime::{CheckpointArtifacts, Limits, Runtime, RuntimeError, SealedImages, SnapshotKey};

#[tokio::test]
async fn sandbox_is_isolated_and_destroyed_cleanly() {
    if !require_root("sandbox_is_isolated_and_destroyed_cleanly") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    let spec = spec(rootfs.path(), default_limits());
    let handle = t.rt.start(&spec).await.expect("start");
    assert!(t.rt.is_alive(&handle));
    assert!(t.rt.list().unwrap().contains(&spec.id));
    let client = connect(&t.rt, &handle).await;

    // Its own pid namespace: the agent is pid 1 and no host process is visible.
    let cmdline = sh_ok(&client, "tr '\\0' ' ' < /proc/1/cmdline").await;
    assert!(cmdline.ends_with("init"), "pid 1 is {cmdline:?}");
    let pids = sh_ok(&client, "ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '").await;
    let pids: Vec<u32> = pids.split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.first(), Some(&1), "{pids:?}");
    assert!(pids.len() < 10, "sees more than its own processes: {pids:?}");

    assert_eq!(sh_ok(&client, "hostname").await, "sbx-test");
    assert_eq!(sh_ok(&client, "id -u; id -g").await, "0\n0");
    // In a host id range of its own, after the storage's (which owns the files on disk).
    let range = t.rt.id_range(&spec.id).expect("the sandbox holds a range");
    assert!(range.host_base >= 165_536, "{range:?}");
    let map = sh_ok(&client, "cat /proc/self/uid_map /proc/self/gid_map").await;
    let fields: Vec<&str> = map.split_whitespace().collect();
    let base = range.host_base.to_string();
    assert_eq!(fields, ["0", &base, "65536", "0", &base, "65536"], "{map}");

    // Files made by sandbox root belong to the mapped host uid.
    sh_ok(&client, "echo hi > /root/made-in-sandbox").await;
    let meta = std::fs::metadata(rootfs.path().join("root/made-in-sandbox")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.gid()), (100_000, 100_000));

    let stats = t.rt.stats(&spec.id).unwrap();
    assert_eq!(stats.memory_limit_bytes, 256 << 20);
    assert!(stats.pids >= 1 && stats.memory_bytes > 0, "{stats:?}");

    // A replayed start returns the running sandbox.
    assert_eq!(t.rt.start(&spec).await.unwrap(), handle);

    drop(client);
    t.rt.destroy(&spec.id).await.expect("destroy");
    assert_gone(&t.rt, &handle);
    assert_eq!(t.rt.id_range(&spec.id), None, "destroy frees the range");
    t.rt.destroy(&spec.id).await.expect("second destroy");
    t.rt.wait_exit(&handle).await; // resolves at once for a dead sandbox
    assert!(matches!(t.rt.stats(&spec.id), Err(RuntimeError::NotFound(_))));
}

#[tokio::test]
async fn sandbox_is_confined() {
    if !require_root("sandbox_is_confined") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    let handle = t.rt.start(&spec(rootfs.path(), default_limits())).await.expect("start");
    let client = connect(&t.rt, &handle).await;

    let status = sh_ok(&client, "grep -E '^(CapBnd|CapEff|NoNewPrivs|Seccomp):' /proc/self/status").await;
    assert!(status.contains("CapBnd:\t00000000a80405fb"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");

    // Kernel attack surface is out of reach.
    for script in ["mount -t tmpfs none /mnt", "unshare -U true", "unshare -m true", "nsenter -t 1 -m true"] {
        let out = sh(&client, script).await;
        assert_ne!(out.status.code, Some(0), "{script:?} succeeded: {out:?}");
        // EPERM or EACCES, as busybox words them ("permission denied (are you root?)" for mount).
        let stderr = out.stderr.to_lowercase();
        let refused = ["operation not permitted", "permission denied"].iter().any(|e| stderr.contains(e));
        assert!(refused, "{script:?} failed for another reason than EPERM/EACCES: {out:?}");
    }
    // Masked files read empty (whichever of them this kernel has).
    let masked = "for f in /proc/kcore /proc/keys /proc/timer_list /proc/interrupts; do [ -e $f ] && wc -c < $f; done";
    let sizes = sh_ok(&client, masked).await;
    assert!(!sizes.is_empty() && sizes.lines().all(|l| l.trim() == "0"), "{sizes:?}");
    assert_eq!(sh_ok(&client, "ls /proc/acpi 2>/dev/null | wc -l").await, "0");
    assert_ne!(sh(&client, "echo 1 > /proc/sys/kernel/panic").await.status.code, Some(0));
    assert_ne!(sh(&client, "echo > /proc/sysrq-trigger").await.status.code, Some(0));

    // A minimal /dev, a working pty multiplexer, and loopback up.
    let dev = sh_ok(&client, "ls /dev | tr '\\n' ' '").await;
    for name in ["null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd", "stdin"] {
        assert!(dev.split_whitespace().any(|d| d == name), "/dev lacks {name}: {dev}");
    }
    assert_eq!(sh_ok(&client, "head -c 4 /dev/zero | wc -c").await, "4");
    assert_eq!(sh_ok(&client, "stat -c %a /dev/shm").await, "1777");
    assert!(sh_ok(&client, "ifconfig lo").await.contains("UP"));
    // The old root is gone: nothing of the host filesystem is reachable.
    assert_ne!(sh(&client, "ls /sys/fs/cgroup/memory/space-test").await.status.code, Some(0));
    drop(client);
    t.rt.destroy(&handle.id).await.unwrap();
    assert_gone(&t.rt, &handle);
}

#[tokio::test]
async fn memory_limit_kills_a_hog() {
    if !require_root("memory_limit_kills_a_hog") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    let limits = Limits { memory_mib: 48, millicpus: 1000, pids: 64 };
    let handle = t.rt.start(&spec(rootfs.path(), limits)).await.expect("start");
    let client = connect(&t.rt, &handle).await;

    // Doubles a shell string until the cgroup's OOM killer ends it.
    let out = sh(&client, "a=x; while true; do a=\"$a$a\"; done").await;
    assert_eq!(out.status.signal, Some(9), "hog was not OOM-killed: {out:?}");
    let stats = t.rt.stats(&handle.id).unwrap();
    assert!(stats.oom_kills >= 1, "{stats:?}");
    assert_eq!(stats.memory_limit_bytes, 48 << 20);
    // The agent survived and still serves.
    assert!(t.rt.is_alive(&handle));
    assert_eq!(sh_ok(&client, "echo alive").await, "alive");
    drop(client);
    t.rt.destroy(&handle.id).await.unwrap();
    assert_gone(&t.rt, &handle);
}

#[tokio::test]
async fn pids_limit_stops_a_fork_bomb() {
    if !require_root("pids_limit_stops_a_fork_bomb") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    let limits = Limits { memory_mib: 256, millicpus: 500, pids: 32 };
    let handle = t.rt.start(&spec(rootfs.path(), limits)).await.expect("start");
    let client = connect(&t.rt, &handle).await;

    // A bounded burst: forks start failing at the limit.
    let out = sh(&client, "i=0; while [ $i -lt 100 ]; do sleep 1000 >/dev/null 2>&1 & i=$((i+1)); done").await;
    assert_ne!(out.status.code, Some(0), "100 forks under pids.max=32 succeeded: {out:?}");
    assert!(out.stderr.contains("fork"), "{out:?}");
    assert!(t.rt.stats(&handle.id).unwrap().pids <= 32);

    // A real fork bomb stays at the limit and destroy still removes all of it.
    let _ = sh(&client, "f() { f | f & }; f >/dev/null 2>&1").await;
    eventually("fork bomb reaches pids.max", || t.rt.stats(&handle.id).is_ok_and(|s| s.pids >= 30)).await;
    assert!(t.rt.stats(&handle.id).unwrap().pids <= 32);
    drop(client);
    t.rt.destroy(&handle.id).await.expect("destroy under a fork bomb");
    assert_gone(&t.rt, &handle);
}

#[tokio::test]
async fn limits_change_while_running() {
    if !require_root("limits_change_while_running") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    let handle = t.rt.start(&spec(rootfs.path(), default_limits())).await.expect("start");
    let dirs = t.rt.cgroup_dirs(&handle.id);
    let read = |file: &str| {
        let dir = dirs.iter().find(|d| d.join(file).exists()).unwrap_or_else(|| panic!("no {file}"));
        std::fs::read_to_string(dir.join(file)).unwrap().trim().to_owned()
    };
    // Up and down: with swap accounting the two memory limits must be written in the order
    // that keeps memsw >= memory at every step.
    for limits in
        [Limits { memory_mib: 1024, millicpus: 2000, pids: 99 }, Limits { memory_mib: 64, millicpus: 250, pids: 20 }]
    {
        t.rt.set_limits(&handle.id, &limits).expect("set limits");
        let bytes = (limits.memory_mib << 20).to_string();
        if t.rt.cgroup_version() == 1 {
            assert_eq!(read("memory.limit_in_bytes"), bytes);
            assert_eq!(read("cpu.cfs_quota_us"), (limits.millicpus * 100).to_string());
        } else {
            assert_eq!(read("memory.max"), bytes);
        }
        assert_eq!(read("pids.max"), limits.pids.to_string());
    }
    t.rt.destroy(&handle.id).await.expect("destroy");
    assert!(matches!(t.rt.set_limits(&handle.id, &default_limits()), Err(RuntimeError::NotFound(_))));
}

#[tokio::test]
async fn failed_start_reports_the_step_and_leaves_nothing() {
    if !require_root("failed_start_reports_the_step_and_leaves_nothing") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    // A rootfs whose /proc is a symlink out of it is refused by the init.
    std::fs::remove_dir(rootfs.path().join("proc")).unwrap();
    std::os::unix::fs::symlink("/", rootfs.path().join("proc")).unwrap();
    let spec = spec(rootfs.path(), default_limits());
    let err = t.rt.start(&spec).await.expect_err("start must fail");
    let msg = err.to_string();
    assert!(msg.contains("/proc in the rootfs is not a directory"), "{msg}");
    assert!(t.rt.list().unwrap().is_empty(), "leftovers: {:?}", t.rt.list());
    for dir in t.rt.cgroup_dirs(&spec.id) {
        assert!(!dir.exists(), "{}", dir.display());
    }
}

#[tokio::test]
async fn a_restarted_node_finds_and_destroys_sandboxes() {
    if !require_root("a_restarted_node_finds_and_destroys_sandboxes") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    let handle = t.rt.start(&spec(rootfs.path(), default_limits())).await.expect("start");
    // A second instance with the same options stands in for the node after a restart.
    let again = space_runtime_linux::LinuxRuntime::new(t.rt.options().clone()).unwrap();
    assert_eq!(again.list().unwrap(), vec![handle.id.clone()]);
    assert!(again.is_alive(&handle));
    let waiter = {
        let rt = t.rt.clone();
        let handle = handle.clone();
        tokio::spawn(async move { rt.wait_exit(&handle).await })
    };
    again.destroy(&handle.id).await.unwrap();
    waiter.await.unwrap(); // the original instance sees the exit (and reaps pid 1)
    assert!(again.list().unwrap().is_empty());
    assert_gone(&t.rt, &handle);
}

#[tokio::test]
async fn a_silent_init_times_out_and_is_cleaned_up() {
    if !require_root("a_silent_init_times_out_and_is_cleaned_up") {
        return;
    }
    let bin = tempfile::tempdir().unwrap();
    // An ELF binary: the runtime executes its init from a sealed memfd, from which a script's
    // interpreter could not read the script.
    let silent = bin.path().join("silent-spaced");
    let source = bin.path().join("silent.c");
    std::fs::write(&source, "#include <unistd.h>\nint main(void) { sleep(600); return 0; }\n").unwrap();
    let built = std::process::Command::new("cc").arg("-o").arg(&silent).arg(&source).output().expect("cc");
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let t = TestRuntime::with(|opts| {
        opts.spaced = silent.clone();
        opts.start_timeout = std::time::Duration::from_millis(300);
    });
    let rootfs = Rootfs::new();
    let spec = spec(rootfs.path(), default_limits());
    let err = t.rt.start(&spec).await.expect_err("a silent init must time out");
    assert!(err.to_string().contains("not ready after"), "{err}");
    assert!(t.rt.list().unwrap().is_empty());
    for dir in t.rt.cgroup_dirs(&spec.id) {
        assert!(!dir.exists(), "{}", dir.display());
    }
}

#[tokio::test]
async fn a_cancelled_start_is_undone_by_destroy() {
    if !require_root("a_cancelled_start_is_undone_by_destroy") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    for delay_us in [0, 500, 1000, 2000, 4000, 8000] {
        let spec = spec(rootfs.path(), default_limits());
        let delay = std::time::Duration::from_micros(delay_us);
        let _ = tokio::time::timeout(delay, t.rt.start(&spec)).await;
        t.rt.destroy(&spec.id).await.expect("destroy after a cancelled start");
        assert!(!t.rt.list().unwrap().contains(&spec.id));
        for dir in t.rt.cgroup_dirs(&spec.id) {
            assert!(!dir.exists(), "{}", dir.display());
        }
    }
}

#[tokio::test]
async fn wait_exit_sees_pid1_die() {
    if !require_root("wait_exit_sees_pid1_die") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    let handle = t.rt.start(&spec(rootfs.path(), default_limits())).await.expect("start");
    let waiter = {
        let (rt, handle) = (t.rt.clone(), handle.clone());
        tokio::spawn(async move { rt.wait_exit(&handle).await })
    };
    // Pid 1 cannot be signalled from inside its namespace; the host can.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(handle.pid as i32), nix::sys::signal::SIGKILL).unwrap();
    waiter.await.unwrap();
    assert!(!t.rt.is_alive(&handle));
    assert!(t.rt.list().unwrap().contains(&handle.id), "resources stay until destroy");
    t.rt.destroy(&handle.id).await.unwrap();
    assert_gone(&t.rt, &handle);
}

/// Informative: `cargo test -p space-runtime-linux --test sandbox -- --ignored --nocapture start_latency`.
#[tokio::test]
#[ignore]
async fn start_latency() {
    if !require_root("start_latency") {
        return;
    }
    let t = TestRuntime::new();
    let rootfs = Rootfs::new();
    let mut starts = Vec::new();
    let mut first_exec = Vec::new();
    for _ in 0..21 {
        let spec = spec(rootfs.path(), default_limits());
        let t0 = std::time::Instant::now();
        let handle = t.rt.start(&spec).await.unwrap();
        starts.push(t0.elapsed());
        let client = connect(&t.rt, &handle).await;
        sh_ok(&client, "true").await;
        first_exec.push(t0.elapsed());
        drop(client);
        t.rt.destroy(&spec.id).await.unwrap();
    }
    starts.sort();
    first_exec.sort();
    let pct = |v: &[std::time::Duration], p: usize| v[(v.len() - 1) * p / 100];
    eprintln!(
        "start(): p50 {:?} p90 {:?}; start + connect + exec `true`: p50 {:?}",
        pct(&starts, 50),
        pct(&starts, 90),
        pct(&first_exec, 50)
    );
}

#[tokio::test]
async fn a_killed_restores_bind_mount_is_removed_when_the_runtime_starts() {
    if !require_root("a_killed_restores_bind_mount_is_removed_when_the_runtime_starts") {
        return;
    }
    let parent = format!("space-test/{}", space_runtime::SandboxId::generate().as_str().trim_start_matches("sbx_"));
    let prefix = format!("{}{}-", space_criu::WORK_PREFIX, parent.replace('/', "_"));
    // What a restore killed mid-way leaves: its work dir, with an agent dir bound into it.
    let agent_dir = tempfile::tempdir().unwrap();
    std::fs::write(agent_dir.path().join("agent.sock"), "").unwrap();
    let work = tempfile::Builder::new().prefix(&prefix).tempdir().unwrap().keep();
    let bind = work.join("agent");
    std::fs::create_dir(&bind).unwrap();
    nix::mount::mount(Some(agent_dir.path()), &bind, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>).unwrap();
    // ... its new sandbox's root attached in it, and its view of the images with the rewritten
    // user namespace image bound over one of them.
    let (root, images) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(root.path().join("kept"), "").unwrap();
    std::fs::write(images.path().join("userns-1.img"), "dumped").unwrap();
    std::fs::write(work.join("userns.img"), "rewritten").unwrap();
    for (from, to) in [
        (root.path().to_path_buf(), work.join("root")),
        (images.path().to_path_buf(), work.join("images")),
        (work.join("userns.img"), work.join("images/userns-1.img")),
    ] {
        if !to.exists() {
            std::fs::create_dir(&to).unwrap();
        }
        nix::mount::mount(Some(&from), &to, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>).unwrap();
    }
    // Another node's leftovers are not this runtime's to remove.
    let other = tempfile::Builder::new().prefix(space_criu::WORK_PREFIX).tempdir().unwrap();
    // Nor is what another local user planted under the name, pointing at a mount of the host.
    let victim = tempfile::tempdir().unwrap();
    let victim_mount = victim.path().join("mounted");
    std::fs::create_dir(&victim_mount).unwrap();
    nix::mount::mount(Some(agent_dir.path()), &victim_mount, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
        .unwrap();
    let planted = tempfile::Builder::new().prefix(&prefix).tempdir().unwrap();
    std::os::unix::fs::symlink(&victim_mount, planted.path().join("agent")).unwrap();
    std::os::unix::fs::chown(planted.path(), Some(65534), Some(65534)).unwrap();

    let t = TestRuntime::with(|opts| opts.cgroup_parent = parent.clone());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(work.to_str().unwrap()), "the bind is still mounted");
    assert!(!work.exists(), "the work dir is still there");
    assert!(agent_dir.path().join("agent.sock").exists(), "the sweep emptied the agent dir through its bind");
    assert!(root.path().join("kept").exists(), "the sweep emptied the root through its mount");
    assert_eq!(std::fs::read_to_string(images.path().join("userns-1.img")).unwrap(), "dumped");
    assert!(other.path().exists());
    assert!(mounts.contains(victim_mount.to_str().unwrap()), "a planted symlink made the sweep unmount a host mount");
    assert!(planted.path().exists());
    nix::mount::umount2(&victim_mount, nix::mount::MntFlags::MNT_DETACH).unwrap();
    drop(t);
}

#[tokio::test]
async fn a_checkpoint_whose_deleted_files_exceed_the_total_ghost_limit_fails() {
    if !require_root("a_checkpoint_whose_deleted_files_exceed_the_total_ghost_limit_fails") {
        return;
    }
    let t = TestRuntime::with(|opts| opts.ghost_total_limit = 1 << 20);
    let rootfs = Rootfs::new();
    let spec = spec(rootfs.path(), default_limits());
    let handle = t.rt.start(&spec).await.expect("start");
    let client = connect(&t.rt, &handle).await;
    // Two deleted files of 1 MiB each, held open: each under CRIU's per-file limit, together over ours.
    let holder = "for f in a b; do exec 3<>/tmp/$f; head -c 1048576 /dev/zero >&3; rm /tmp/$f; \
                  sleep 100000 <&3 >/dev/null 2>&1 & exec 3>&-; done";
    sh_ok(&client, holder).await;
    drop(client);
    t.rt.wait_agent_released(&spec.id, std::time::Duration::from_secs(5)).await.expect("agent released");
    t.rt.pause(&spec.id).await.expect("pause");
    let images = tempfile::tempdir().unwrap();
    // In the images directory, and streamed into sealed images (where the sizes are counted
    // as they come).
    let sealed = SealedImages { dir: images.path().join("sealed"), key: SnapshotKey::new([7; 32]) };
    for (n, sealed) in [None, Some(sealed)].into_iter().enumerate() {
        let work = images.path().join(format!("dump-{n}"));
        let artifacts = CheckpointArtifacts::Criu { images: work.clone(), spaced: PathBuf::new(), sealed };
        let err = t.rt.checkpoint(&spec.id, &artifacts).await.expect_err("over the ghost limit");
        assert!(err.to_string().contains("deleted but still open files"), "{err}");
    }
    let in_clear: Vec<_> = std::fs::read_dir(images.path().join("dump-1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".img"))
        .collect();
    assert!(in_clear.is_empty(), "a streamed dump wrote images in clear: {in_clear:?}");
    let sealed: Vec<_> = std::fs::read_dir(images.path().join("sealed")).unwrap().map(|e| e.unwrap().path()).collect();
    // The streamed dump stops when the ghost files pass the limit, before its last images.
    assert!(sealed.iter().any(|p| p.ends_with("core-1.img")), "the images were not kept: {sealed:?}");
    for path in sealed {
        assert!(std::fs::read(&path).unwrap().starts_with(b"spacekv1"), "{} is not sealed", path.display());
    }
    t.rt.destroy(&spec.id).await.expect("destroy");
}
