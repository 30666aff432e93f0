//! What a sandbox cannot see or do: host processes, host files, host network, host uids (or
//! another sandbox's), unbounded memory or processes.

mod common;

use std::net::TcpListener;

use common::{Server, number_after};
use serde_json::json;

#[test]
fn sandbox_sees_only_itself() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));

    let r = server.exec(&id, &["sh", "-c", "ls /proc | grep -c '^[0-9]'"]);
    let visible: u32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(visible < 10, "sandbox sees {visible} processes: host processes leak");
    let r = server.exec(&id, &["cat", "/proc/1/cmdline"]);
    assert!(r["stdout"].as_str().unwrap().contains("spaced"), "pid 1 is spaced: {r}");

    let marker = server.data_dir.join("host-only");
    std::fs::write(&marker, "x").unwrap();
    let r = server.exec(&id, &["ls", marker.to_str().unwrap()]);
    assert_ne!(r["exit_code"], 0, "host file visible: {r}");
    assert!(r["stderr"].as_str().unwrap().contains("No such file or directory"), "ENOENT expected: {r}");

    let r = server.exec(&id, &["hostname"]);
    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    let sandbox = session["sandbox_id"].as_str().unwrap();
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        sandbox.trim_start_matches("sbx_").chars().take(12).collect::<String>()
    );

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = server.exec(&id, &["sh", "-c", &format!("nc -w 2 127.0.0.1 {port} </dev/null && echo connected")]);
    assert!(!r["stdout"].as_str().unwrap().contains("connected"), "reached the host: {r}");
    assert!(listener.accept().is_err(), "the host listener accepted a connection from the sandbox");

    server.exec(&id, &["touch", "/root/made-by-root"]);
    let path = server.data_dir.join(format!("pool/sandboxes/{sandbox}/rootfs/root/made-by-root"));
    let meta = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.gid()), (100_000, 100_000), "sandbox root must map to the unprivileged range");

    let r = server.exec(&id, &["sh", "-c", "cat /proc/self/status | grep -i ^seccomp:"]);
    assert!(r["stdout"].as_str().unwrap().contains('2'), "seccomp filter active: {r}");
    let r = server.exec(&id, &["mount", "-t", "tmpfs", "none", "/mnt"]);
    assert_ne!(r["exit_code"], 0, "mount must be denied: {r}");
}

/// lxcfs (scripts/start-lxcfs.sh) answers a sandbox's `/proc/meminfo` and `/proc/uptime`
/// from its own cgroup and pid namespace: the session's memory and the sandbox's age, not the
/// host's; still so after a suspend and resume (CRIU binds the files again from the host's
/// lxcfs, also for a process that holds one open); nothing else of lxcfs is reachable.
#[test]
fn a_sandbox_sees_its_own_memory_and_age() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({ "memory_mib": 300 }));
    let host_uptime =
        || -> f64 { std::fs::read_to_string("/proc/uptime").unwrap().split(' ').next().unwrap().parse().unwrap() };
    let check = |when: &str| {
        let script = "grep MemTotal /proc/meminfo; echo uptime: $(cut -d' ' -f1 /proc/uptime)";
        let r = server.exec(&id, &["sh", "-c", script]);
        assert_eq!(r["exit_code"], 0, "{when}: {r}");
        let seen = r["stdout"].as_str().unwrap();
        assert_eq!(number_after(seen, "MemTotal:"), 300 << 10, "{when}: /proc/meminfo\n{seen}\n{}", server.log_text());
        let uptime = number_after(seen, "uptime:") as f64;
        assert!(uptime < host_uptime(), "{when}: the sandbox is up {uptime} s, as long as the host");
    };
    check("started");
    // Only those seven files of lxcfs are in the sandbox: its cgroup tree, the rest of its
    // sys tree and its mount point are not.
    let r = server.exec(&id, &["sh", "-c", "grep ' - fuse.lxcfs ' /proc/self/mountinfo | cut -d' ' -f5 | sort"]);
    let mut expected: Vec<String> = ["meminfo", "cpuinfo", "stat", "uptime", "swaps", "diskstats"]
        .iter()
        .map(|f| format!("/proc/{f}"))
        .chain(["/sys/devices/system/cpu/online".to_owned()])
        .collect();
    expected.sort();
    assert_eq!(r["stdout"].as_str().unwrap().lines().collect::<Vec<_>>(), expected, "lxcfs mounts: {r}");
    let r = server.exec(&id, &["ls", "/var/lib/lxcfs"]);
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("No such file or directory"), "ENOENT expected: {r}");
    // A process that holds one of lxcfs's files open is checkpointed and restored with it.
    let body = json!({ "cmd": ["sh", "-c", "exec 3</proc/meminfo; exec sleep 100000"], "background": true });
    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{r}");
    let holder = r["pid"].as_u64().unwrap();
    for step in ["suspend", "resume"] {
        let (status, s) = server.call("POST", &format!("/v1/sessions/{id}/{step}"), None);
        assert_eq!(status, 200, "{step}: {s}\n{}", server.log_text());
    }
    check("resumed");
    let r = server.exec(&id, &["sh", "-c", &format!("head -1 /proc/{holder}/fd/3")]);
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(number_after(r["stdout"].as_str().unwrap(), "MemTotal:"), 300 << 10, "{r}");
}

/// How many CPUs `Cpus_allowed_list` (of `/proc/.../status`) names, as `0-1,4`.
fn cpus_listed(status: &str) -> usize {
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("a Cpus_allowed_list line");
    list.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// `nproc` counts the session's CPUs, not the host's: a quota that rounds up to one CPU sees
/// one, a quota of the host's count sees them all, also in a warm pod (started with one CPU)
/// that a session of more claims; every thread of pid 1 has that mask; still so after a
/// suspend and resume (CRIU does not restore masks: the runtime sets them again). lxcfs's
/// `/proc/cpuinfo` and `/sys/devices/system/cpu/online` (glibc's `_SC_NPROCESSORS_ONLN`)
/// count the same; the sandbox's cpuset cgroup holds the node's CPUs.
#[test]
fn nproc_counts_the_sessions_cpus() {
    require_root!();
    let host = cpus_listed(&std::fs::read_to_string("/proc/self/status").unwrap());
    assert!(host >= 2, "this test needs a host with two CPUs or more, this one has {host}");
    let server = Server::start_with(&["--pool", "busybox=1"]);
    server.wait_pool_ready("busybox", 1);
    let all = server.create_session(json!({ "cpus": host }));
    assert_eq!(server.pool("busybox")["hits"], 1, "a warm pod was claimed: {}", server.pool("busybox"));
    let one = server.create_session(json!({ "cpus": 0.5 }));
    let nproc = |id: &str| server.exec(id, &["nproc"])["stdout"].as_str().unwrap().trim().parse::<usize>().unwrap();
    let threads = |id: &str| {
        let r = server.exec(id, &["sh", "-c", "cat /proc/1/task/*/status"]);
        let text = r["stdout"].as_str().unwrap().to_owned();
        text.split("Name:").skip(1).map(cpus_listed).collect::<Vec<_>>()
    };
    let listed = |id: &str| {
        // Read with read(2), as glibc does: see docs/runtimes.md on sendfile (busybox cat).
        let script = "grep -c ^processor /proc/cpuinfo; head -n1 /sys/devices/system/cpu/online";
        let r = server.exec(id, &["sh", "-c", script]);
        assert_eq!(r["exit_code"], 0, "{r}");
        r["stdout"].as_str().unwrap().to_owned()
    };
    // lxcfs reads the quota through the sandbox's cpuset cgroup, which holds the node's CPUs
    // (the mask does the placing).
    let (_, session) = server.call("GET", &format!("/v1/sessions/{one}"), None);
    let cpuset = server.sandbox_cgroup("cpuset", session["sandbox_id"].as_str().unwrap()).join("cpuset.cpus");
    let node_cpus = std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.cpus").unwrap();
    assert_eq!(std::fs::read_to_string(&cpuset).unwrap(), node_cpus, "{}", cpuset.display());
    assert_eq!((nproc(&one), nproc(&all)), (1, host));
    assert_eq!(listed(&one), "1\n0\n", "cpuinfo's processors, then cpu/online");
    assert_eq!(listed(&all), format!("{host}\n0-{}\n", host - 1), "cpuinfo's processors, then cpu/online");
    assert!(threads(&one).iter().all(|&n| n == 1), "pid 1's threads: {:?}", threads(&one));
    for step in ["suspend", "resume"] {
        let (status, s) = server.call("POST", &format!("/v1/sessions/{one}/{step}"), None);
        assert_eq!(status, 200, "{step}: {s}\n{}", server.log_text());
    }
    assert_eq!(nproc(&one), 1, "after a resume");
    assert_eq!(listed(&one), "1\n0\n", "cpuinfo's processors, then cpu/online, after a resume");
    assert!(threads(&one).iter().all(|&n| n == 1), "pid 1's threads after a resume: {:?}", threads(&one));
}

#[test]
fn memory_bomb_is_killed_inside_its_cgroup() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({ "memory_mib": 64 }));
    let r = server.exec(&id, &["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]);
    assert_eq!(r["signal"], 9, "{r}");
    assert_eq!(r["oom_killed"], true, "{r}");
    let r = server.exec(&id, &["echo", "still alive"]);
    assert_eq!(r["stdout"], "still alive\n");
}

#[test]
fn fork_bomb_hits_the_pids_limit_and_the_node_stays_responsive() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({ "pids": 64 }));
    let other = server.create_session(json!({}));
    let (status, _) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sh", "-c", "while :; do sleep 60 & done"], "background": true, "timeout_ms": 4000 })),
    );
    assert_eq!(status, 200);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let r = server.exec(&other, &["echo", "responsive"]);
    assert_eq!(r["stdout"], "responsive\n");
    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    let sandbox = session["sandbox_id"].as_str().unwrap();
    let cgroup = server.sandbox_cgroup("pids", sandbox);
    let current: u32 = std::fs::read_to_string(cgroup.join("pids.current")).unwrap().trim().parse().unwrap();
    let events = std::fs::read_to_string(cgroup.join("pids.events")).unwrap();
    assert!(current <= 64, "pids.current {current} above the limit");
    assert!(!events.contains("max 0"), "the limit was never hit: {events}");
}

/// `socket(2)` as the probe makes it.
fn socket(server: &Server, id: &str, family: i32, kind: i32, protocol: i32) -> Result<i64, i32> {
    server.syscall(id, libc::SYS_socket, &[family.into(), kind.into(), protocol.into()])
}

#[test]
fn sockets_are_limited_to_the_families_a_sandbox_needs_and_raw_ones_need_a_dropped_capability() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    server.install_probe(&id);
    // vsock's port space is the whole host's, not the network namespace's: refused by seccomp.
    for (family, kind) in [(libc::AF_VSOCK, libc::SOCK_STREAM), (libc::AF_PACKET, libc::SOCK_RAW)] {
        assert_eq!(socket(&server, &id, family, kind, 0), Err(libc::EAFNOSUPPORT), "family {family}");
    }
    assert_eq!(socket(&server, &id, libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_AUDIT), Err(libc::EAFNOSUPPORT));
    // A raw IPv4 socket is an allowed family; it fails on the capability (CAP_NET_RAW is dropped).
    assert_eq!(socket(&server, &id, libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP), Err(libc::EPERM));
    let status = server.exec(&id, &["grep", "^CapBnd", "/proc/self/status"]);
    assert_eq!(status["stdout"], "CapBnd:\t00000000a80405fb\n", "bounding set: {status}");
    // What programs need still works.
    for (family, kind, protocol) in [
        (libc::AF_UNIX, libc::SOCK_STREAM, 0),
        (libc::AF_INET, libc::SOCK_STREAM, 0),
        (libc::AF_INET6, libc::SOCK_DGRAM, 0),
        (libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
    ] {
        assert!(socket(&server, &id, family, kind, protocol).is_ok(), "family {family} protocol {protocol}");
    }
}

#[test]
fn x32_system_calls_are_refused_by_the_filter() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    server.install_probe(&id);
    const X32: i64 = 0x4000_0000;
    assert!(server.syscall(&id, libc::SYS_getpid, &[]).is_ok());
    // EPERM is the filter's answer; a kernel without x32 would say ENOSYS.
    for nr in [libc::SYS_getpid, libc::SYS_bpf, libc::SYS_keyctl, libc::SYS_unshare] {
        assert_eq!(server.syscall(&id, nr | X32, &[]), Err(libc::EPERM), "x32 syscall {nr}");
    }
}

/// What sandbox root can do to pid 1 (`spaced`, which holds the node's connection).
fn assert_pid1_out_of_reach(server: &Server, id: &str, when: &str) {
    const PTRACE_ATTACH: i64 = 16;
    assert_eq!(server.syscall(id, libc::SYS_ptrace, &[PTRACE_ATTACH, 1, 0, 0]), Err(libc::EPERM), "{when}: ptrace");
    let environ = server.exec(id, &["cat", "/proc/1/environ"]);
    assert!(environ["stderr"].as_str().unwrap().contains("Permission denied"), "{when}: {environ}");
}

#[test]
fn sandbox_root_cannot_trace_pid1_before_or_after_a_full_snapshot() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    server.install_probe(&id);
    assert_pid1_out_of_reach(&server, &id, "at start");
    let (status, snap) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "full" })));
    assert_eq!(status, 201, "{snap}");
    assert_pid1_out_of_reach(&server, &id, "after a full snapshot");
    let (status, s) =
        server.call("POST", &format!("/v1/sessions/{id}/restore"), Some(json!({ "snapshot": snap["id"] })));
    assert_eq!(status, 200, "{s}");
    assert_pid1_out_of_reach(&server, &id, "after its restore");
}

/// A sandbox process that manages to trace pid 1 while a full snapshot lets CRIU in does not
/// keep it: the tracer is killed when the node connects again.
#[test]
fn a_tracer_of_pid1_from_the_checkpoint_window_does_not_outlive_it() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    server.install_probe(&id);
    let body = json!({ "cmd": ["sh", "-c", "/probe seize 1 > /root/seized"], "background": true });
    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{r}");
    // The snapshot may fail (CRIU cannot seize a pid 1 someone else traces); either way:
    let _ = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "full" })));
    let seized = server.exec(&id, &["cat", "/root/seized"]);
    assert_eq!(seized["stdout"], "attached\n", "the tracer never got in while pid 1 was dumpable: {seized}");
    let traced = server.exec(&id, &["grep", "TracerPid", "/proc/1/status"]);
    assert_eq!(traced["stdout"], "TracerPid:\t0\n", "pid 1 is still traced: {traced}");
    let gone = (0..100).any(|_| {
        let holders = server.exec(&id, &["sh", "-c", "ps -o pid,args | grep -c '[/]probe seize'"]);
        std::thread::sleep(std::time::Duration::from_millis(50));
        holders["stdout"] == "0\n"
    });
    assert!(gone, "the tracer still runs");
}

/// The host uid of every process in the session's sandbox (read from the host's
/// `/proc/<pid>/status`), which must be one and the same, real, effective, saved and fs.
fn host_uid(server: &Server, session: &str) -> u32 {
    let (_, s) = server.call("GET", &format!("/v1/sessions/{session}"), None);
    let sandbox = s["sandbox_id"].as_str().unwrap_or_else(|| panic!("{session} has no sandbox: {s}"));
    let procs = std::fs::read_to_string(server.sandbox_cgroup("pids", sandbox).join("cgroup.procs")).unwrap();
    let mut uids: Vec<String> = procs
        .lines()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|status| status.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .collect();
    uids.dedup();
    let [line] = &uids[..] else { panic!("{session}: processes with other uids, or none: {uids:?}") };
    let ids: Vec<u32> = line.split_whitespace().skip(1).map(|u| u.parse().unwrap()).collect();
    assert!(ids.iter().all(|u| *u == ids[0]), "{session}: real, effective, saved and fs uid differ: {line}");
    ids[0]
}

/// Inside: root, and a file root made is root's. On disk: the storage range's root (100000),
/// whichever range the sandbox runs in.
fn assert_root_inside_and_storage_owned_on_disk(server: &Server, session: &str, file: &str) {
    let r = server.exec(session, &["sh", "-c", &format!("touch {file}; id -u; stat -c %u:%g {file} /etc/passwd")]);
    assert_eq!(r["stdout"], "0\n0:0\n0:0\n", "{session}: {r}");
    let (_, s) = server.call("GET", &format!("/v1/sessions/{session}"), None);
    let sandbox = s["sandbox_id"].as_str().unwrap();
    let on_disk = server.data_dir.join(format!("pool/sandboxes/{sandbox}/rootfs{file}"));
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&on_disk).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (100_000, 100_000), "{}", on_disk.display());
}

/// Hardening item 5: no two sandboxes share host uids, a fork or a resume (restores of a full
/// snapshot) gets a range of its own too, none runs as the storage range (100000..165535)
/// that owns the files on disk, and a server restart hands out no range that is still in use.
#[test]
fn every_sandbox_and_every_fork_runs_as_host_uids_of_its_own() {
    require_root!();
    let mut server = Server::start();
    let (a, b) = (server.create_session(json!({})), server.create_session(json!({})));
    let (ua, ub) = (host_uid(&server, &a), host_uid(&server, &b));
    assert_ne!(ua, ub, "two sandboxes run as the same host uid");
    for uid in [ua, ub] {
        assert!(uid >= 165_536 && (uid - 100_000) % 65_536 == 0, "uid {uid} is not a range of its own");
    }
    assert_root_inside_and_storage_owned_on_disk(&server, &a, "/root/made-in-a");

    let (status, forks) = server.call("POST", &format!("/v1/sessions/{a}/fork"), Some(json!({ "count": 2 })));
    assert_eq!(status, 201, "{forks}\n{}", server.log_text());
    let forks: Vec<String> =
        forks["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    let mut seen = vec![ua, ub];
    for fork in &forks {
        let uid = host_uid(&server, fork);
        assert!(!seen.contains(&uid), "fork {fork} runs as {uid}, already in use by {seen:?}");
        seen.push(uid);
        let r = server.exec(fork, &["stat", "-c", "%u:%g", "/root/made-in-a"]);
        assert_eq!(r["stdout"], "0:0\n", "the parent's file in the fork: {r}");
        assert_root_inside_and_storage_owned_on_disk(&server, fork, "/root/made-in-fork");
    }
    assert_eq!(host_uid(&server, &a), ua, "the parent keeps its range");

    // Suspend frees a's range; resumed (a restore), a runs in one no other live sandbox holds.
    for verb in ["suspend", "resume"] {
        let (status, r) = server.call("POST", &format!("/v1/sessions/{a}/{verb}"), None);
        assert_eq!(status, 200, "{verb}: {r}\n{}", server.log_text());
    }
    seen.retain(|uid| *uid != ua);
    let resumed = host_uid(&server, &a);
    assert!(!seen.contains(&resumed), "resumed a runs as {resumed}, in use by {seen:?}");
    seen.push(resumed);
    assert_root_inside_and_storage_owned_on_disk(&server, &a, "/root/made-after-resume");

    // The ranges are recorded: after a restart new sandboxes get others.
    server.kill9();
    server.spawn();
    let c = server.create_session(json!({}));
    let uc = host_uid(&server, &c);
    assert!(!seen.contains(&uc), "a new sandbox after a restart runs as {uc}, in use by {seen:?}");
    assert_eq!(host_uid(&server, &b), ub, "b survived the restart in its range");
}
