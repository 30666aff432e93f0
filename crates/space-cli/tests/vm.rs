//! The `vm` runtime end to end, through the API: a session's sandbox is a QEMU microvm with
//! a kernel of its own, whose VMM runs unprivileged in namespaces of its own under seccomp;
//! the guest sees none of the host; disk snapshots hold what the guest wrote; a VM the
//! host cannot run is refused with its reason; warm pods are restored from a template whose
//! memory they map copy-on-write. (The exec, files, egress and pool suites run
//! against `vm` too: `SPACE_TEST_RUNTIME=vm` in scripts/test.sh.)

mod common;

use std::path::Path;

use common::{Server, number_after};
use serde_json::{Value, json};

fn vm_session(server: &Server) -> (String, String) {
    let (status, session) = server.call("POST", "/v1/sessions", Some(json!({ "runtime": "vm" })));
    assert_eq!(status, 201, "create failed: {session}\n{}", server.log_text());
    assert_eq!(session["runtime"], "vm");
    let sandbox = session["sandbox_id"].as_str().expect("a sandbox").to_owned();
    (session["id"].as_str().unwrap().to_owned(), sandbox)
}

fn sh(server: &Server, id: &str, script: &str) -> Value {
    server.exec(id, &["sh", "-c", script])
}

fn stdout(result: &Value) -> String {
    assert_eq!(result["exit_code"], 0, "{result}");
    result["stdout"].as_str().unwrap_or_default().to_owned()
}

/// The host pid of the sandbox's VMM: the one process of its cgroup.
fn vmm_pid(server: &Server, sandbox: &str) -> u32 {
    let dir =
        Path::new("/sys/fs/cgroup/pids").join(&server.cgroup_parent).join(server.node_id()).join("vm").join(sandbox);
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).expect("the VMM's cgroup");
    let pids: Vec<u32> = procs.lines().filter_map(|l| l.parse().ok()).collect();
    assert_eq!(pids.len(), 1, "one process (QEMU) in {}: {pids:?}", dir.display());
    pids[0]
}

fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix(&format!("{field}:"))).unwrap_or_default().trim().to_owned()
}

#[test]
fn a_vm_has_a_kernel_of_its_own_and_sees_nothing_of_the_host() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let (id, _) = vm_session(&server);
    let host = nix::sys::utsname::uname().unwrap();
    let guest_release = stdout(&sh(&server, &id, "uname -r"));
    assert_ne!(guest_release.trim(), host.release().to_str().unwrap(), "the guest runs the host's kernel");
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    let guest_version = stdout(&sh(&server, &id, "cat /proc/version"));
    assert_ne!(guest_version, host_version);
    assert!(guest_version.contains(guest_release.trim()), "{guest_version}");

    // Processes: only the guest's own (spaced is its pid 1); the host's server is not there.
    let comm = stdout(&sh(&server, &id, "cat /proc/1/comm"));
    assert_eq!(comm.trim(), "spaced");
    let server_pid = server.pid();
    let seen = sh(&server, &id, &format!("test -e /proc/{server_pid}/status && cat /proc/{server_pid}/comm"));
    assert!(
        seen["exit_code"] != 0 || !seen["stdout"].as_str().unwrap_or_default().contains("space"),
        "the host's server is visible: {seen}"
    );
    // Devices: the guest's own virtio disk, no host block device, no /dev/kvm, no vsock.
    let blocks = stdout(&sh(&server, &id, "ls /sys/block"));
    assert_eq!(blocks.split_whitespace().collect::<Vec<_>>(), ["vda"], "block devices: {blocks}");
    let absent = sh(&server, &id, "ls /dev/kvm /dev/vsock /dev/loop0 2>&1");
    assert_ne!(absent["exit_code"], 0, "{absent}");
    for dev in ["/dev/kvm", "/dev/vsock", "/dev/loop0"] {
        assert!(absent["stdout"].as_str().unwrap().contains(&format!("{dev}: No such file")), "{absent}");
    }
}

#[test]
fn the_vmm_runs_unprivileged_in_namespaces_of_its_own_under_seccomp() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let (_, sandbox) = vm_session(&server);
    let (_, other_sandbox) = vm_session(&server);
    let pid = vmm_pid(&server, &sandbox);
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert!(comm.starts_with("qemu-system"), "{comm}");
    let uid = status_field(pid, "Uid");
    let ids: Vec<u32> = uid.split_whitespace().map(|u| u.parse().unwrap()).collect();
    assert!(ids.iter().all(|&u| u != 0 && u == ids[0]), "real, effective, saved, fs uid: {uid}");
    assert_eq!(status_field(pid, "Seccomp"), "2", "QEMU's own filter");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(status_field(pid, "CapBnd"), "0000000000000000");
    for ns in ["net", "mnt", "pid", "ipc", "uts"] {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        assert_ne!(theirs, ours, "the VMM shares the host's {ns} namespace");
    }
    // No two VMMs share a uid: one cannot signal or trace the other.
    let other = vmm_pid(&server, &other_sandbox);
    assert_ne!(status_field(other, "Uid"), uid);
}

/// A VM's own kernel answers `free`, `nproc`, `/proc/meminfo`, `/proc/cpuinfo`,
/// `/proc/uptime` and `df /` from the session's memory, vCPUs, age and root disk: the host's
/// figures (24 GiB, 2 CPUs, up for longer, a far larger disk) are nowhere to be seen.
#[test]
fn a_vm_sees_its_own_memory_cpus_age_and_disk() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let body = json!({ "runtime": "vm", "memory_mib": 384, "cpus": 1 });
    let (status, session) = server.call("POST", "/v1/sessions", Some(body));
    assert_eq!(status, 201, "create failed: {session}\n{}", server.log_text());
    let id = session["id"].as_str().unwrap();
    let script = "cat /proc/meminfo; echo nproc: $(nproc); echo processors: $(grep -c ^processor /proc/cpuinfo); \
                  echo uptime: $(cut -d' ' -f1 /proc/uptime); free -k | sed -n 's/^Mem:/free:/p'; \
                  df -k / | awk 'NR==2 {print \"df: \" $2}'";
    let seen = stdout(&sh(&server, id, script));

    // The guest's RAM is the session's, less what its kernel keeps for itself.
    let mem_total_kib = number_after(&seen, "MemTotal:");
    assert!((256 << 10..=384 << 10).contains(&mem_total_kib), "MemTotal {mem_total_kib} kB:\n{seen}");
    assert_eq!(number_after(&seen, "free:"), mem_total_kib, "free reads the guest's meminfo:\n{seen}");
    assert_eq!(number_after(&seen, "nproc:"), 1, "{seen}");
    assert_eq!(number_after(&seen, "processors:"), 1, "{seen}");
    let host = std::thread::available_parallelism().unwrap().get();
    assert!(host > 1, "the host must have more CPUs than the session for this test to tell them apart");
    // Its clock of uptime started with it, not with the host.
    let host_uptime: f64 = std::fs::read_to_string("/proc/uptime").unwrap().split(' ').next().unwrap().parse().unwrap();
    let guest_uptime = number_after(&seen, "uptime:") as f64;
    assert!(guest_uptime < host_uptime, "guest up {guest_uptime} s, host {host_uptime} s");
    // `df /` is the VM's own root disk.
    let root_kib = number_after(&seen, "df:");
    assert!(root_kib <= space_node::ROOT_IMAGE_BYTES >> 10, "df / says {root_kib} KiB:\n{seen}");
    let host_root = nix::sys::statvfs::statvfs("/").unwrap();
    let host_root_kib = host_root.blocks() * host_root.fragment_size() / 1024;
    assert_ne!(root_kib, host_root_kib, "the guest's / is the host's");
}

#[test]
fn a_disk_snapshot_of_a_vm_holds_what_the_guest_wrote_before_it() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let (id, _) = vm_session(&server);
    // Not synced: the data sits in the guest's page cache until the snapshot freezes the
    // filesystem.
    sh(&server, &id, "echo before > /root/f");
    let (status, snap) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "disk" })));
    assert_eq!(status, 201, "{snap}");
    sh(&server, &id, "echo after > /root/f; touch /root/later");
    let writes = stdout(&sh(&server, &id, "echo still > /root/g && cat /root/g"));
    assert_eq!(writes.trim(), "still", "the guest's filesystem is thawed after the snapshot");
    let body = json!({ "snapshot": snap["id"] });
    let (status, restored) = server.call("POST", &format!("/v1/sessions/{id}/restore"), Some(body));
    assert_eq!(status, 200, "{restored}");
    assert_eq!(stdout(&sh(&server, &id, "cat /root/f")).trim(), "before");
    assert_ne!(sh(&server, &id, "test -e /root/later")["exit_code"], 0, "a file from after the snapshot");
}

#[test]
fn pausing_a_vm_stops_its_guest_until_it_is_resumed() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let (id, _) = vm_session(&server);
    sh(&server, &id, "date +%s > /root/t0");
    let (status, body) = server.call("POST", &format!("/v1/sessions/{id}/pause"), Some(json!({})));
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(json!({ "cmd": ["true"] })));
    assert_eq!(status, 409, "an exec in a paused session: {body}");
    let (status, body) = server.call("POST", &format!("/v1/sessions/{id}/resume"), Some(json!({})));
    assert_eq!(status, 200, "{body}");
    assert_eq!(stdout(&sh(&server, &id, "cat /root/t0 >/dev/null && echo alive")).trim(), "alive");
}

#[test]
fn a_vm_session_forks_into_vms_of_their_own() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let (id, _) = vm_session(&server);
    sh(&server, &id, "echo parent > /root/f");
    let ca_files = "cat /etc/space/ca.crt /etc/space/ca-bundle.crt";
    let parent_ca = stdout(&sh(&server, &id, ca_files));
    assert!(parent_ca.contains("-----BEGIN CERTIFICATE-----"), "{parent_ca}");
    let (status, forks) = server.call("POST", &format!("/v1/sessions/{id}/fork"), Some(json!({ "count": 2 })));
    assert_eq!(status, 201, "{forks}");
    let forks: Vec<String> =
        forks["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().into()).collect();
    for fork in &forks {
        let (_, session) = server.call("GET", &format!("/v1/sessions/{fork}"), None);
        assert_eq!(session["runtime"], "vm", "{session}");
        assert_eq!(stdout(&sh(&server, fork, "cat /root/f")).trim(), "parent");
        // Forks trust their parent's gateway CA (docs/egress.md): the files their root holds.
        assert_eq!(stdout(&sh(&server, fork, ca_files)), parent_ca, "fork {fork}'s CA files");
        sh(&server, fork, &format!("echo {fork} > /root/f"));
    }
    assert_eq!(stdout(&sh(&server, &id, "cat /root/f")).trim(), "parent", "a fork wrote into its parent");
    let files: std::collections::HashSet<String> =
        forks.iter().map(|f| stdout(&sh(&server, f, "cat /root/f"))).collect();
    assert_eq!(files.len(), 2, "two forks share a disk");
}

#[test]
fn a_vm_whose_vmm_dies_fails_with_the_reason_and_comes_back_from_a_snapshot() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let (id, sandbox) = vm_session(&server);
    sh(&server, &id, "echo kept > /root/f");
    let (status, snap) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "disk" })));
    assert_eq!(status, 201, "{snap}");
    // SAFETY: kill(2) of the VMM this test's server started, found in its cgroup.
    assert_eq!(unsafe { libc::kill(vmm_pid(&server, &sandbox) as i32, libc::SIGKILL) }, 0);
    let mut session = Value::Null;
    for _ in 0..500 {
        session = server.call("GET", &format!("/v1/sessions/{id}"), None).1;
        if session["state"] == "failed" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(session["state"], "failed", "{session}");
    let error = session["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("sandbox_exited:") && error.contains("restore"), "{error}");
    let (status, restored) =
        server.call("POST", &format!("/v1/sessions/{id}/restore"), Some(json!({ "snapshot": snap["id"] })));
    assert_eq!((status, restored["state"].as_str()), (200, Some("running")), "{restored}");
    assert_eq!(stdout(&sh(&server, &id, "cat /root/f")).trim(), "kept");
}

/// The value a counter loop in the guest last wrote.
fn counter(server: &Server, id: &str) -> u64 {
    stdout(&sh(server, id, "cat /root/c")).trim().parse().expect("a number")
}

#[test]
fn a_suspended_vm_resumes_its_processes_also_after_a_server_restart() {
    require_root!();
    let mut server = Server::start_with(&["--pool", ""]);
    let (id, _) = vm_session(&server);
    // Each value is renamed into place: a read (or a suspend) between a truncate and its write
    // would find the file empty.
    let count = "n=0; while :; do n=$((n+1)); echo $n > /root/c.new; mv /root/c.new /root/c; sleep 0.05; done";
    let body = json!({ "cmd": ["sh", "-c", count], "background": true });
    let (status, r) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    assert_eq!(status, 200, "{r}");
    // 320 MiB of the guest's 512 held in its memory (a tmpfs file). The state is written into
    // the node's memory to be sealed: charged to the VM's cgroup, whose limit leaves room for
    // one copy of its RAM only, QEMU would be killed mid-suspend.
    sh(
        &server,
        &id,
        "mkdir -p /mnt/m && mount -t tmpfs -o size=400m tmpfs /mnt/m && head -c 335544320 /dev/urandom > /mnt/m/blob && md5sum /mnt/m/blob > /root/sum",
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let ca_files = "cat /etc/space/ca.crt /etc/space/ca-bundle.crt";
    let ca = stdout(&sh(&server, &id, ca_files));
    let before = counter(&server, &id);
    assert!(before > 0);
    let (status, s) = server.call("POST", &format!("/v1/sessions/{id}/suspend"), Some(json!({})));
    assert_eq!((status, s["state"].as_str()), (200, Some("suspended")), "{s}");
    assert!(vmm_pids(&server).is_empty(), "a suspended session keeps no VMM: {:?}", vmm_pids(&server));
    server.kill9();
    server.spawn();
    let (status, s) = server.call("POST", &format!("/v1/sessions/{id}/resume"), Some(json!({})));
    assert_eq!((status, s["state"].as_str()), (200, Some("running")), "{s}");
    let resumed = counter(&server, &id);
    assert!(resumed >= before, "the counter went back: {before} -> {resumed}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(counter(&server, &id) > resumed, "the counter stopped after the resume");
    assert_eq!(stdout(&sh(&server, &id, "md5sum /mnt/m/blob")), stdout(&sh(&server, &id, "cat /root/sum")));
    assert_eq!(stdout(&sh(&server, &id, ca_files)), ca, "the session's CA files");
}

#[test]
fn vms_restored_from_one_snapshot_draw_different_random_bytes() {
    require_root!();
    let server = Server::start_with(&["--pool", ""]);
    let (id, _) = vm_session(&server);
    let (status, snap) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "full" })));
    assert_eq!(status, 201, "{snap}");
    let body = json!({ "count": 2, "from": snap["id"] });
    let (status, forks) = server.call("POST", &format!("/v1/sessions/{id}/fork"), Some(body));
    assert_eq!(status, 201, "{forks}");
    let bytes: Vec<String> = forks["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| stdout(&sh(&server, f["id"].as_str().unwrap(), "head -c 32 /dev/urandom | od -An -tx1")))
        .collect();
    assert_ne!(bytes[0], bytes[1], "two restores of one memory image read the same random bytes");
    // And the clock is the host's, not the snapshot's.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    for fork in forks["sessions"].as_array().unwrap() {
        let guest: u64 = stdout(&sh(&server, fork["id"].as_str().unwrap(), "date +%s")).trim().parse().unwrap();
        assert!(guest.abs_diff(now) < 60, "guest clock {guest}, host {now}");
    }
}

#[test]
fn vm_pods_are_restored_from_their_template_and_map_its_memory_copy_on_write() {
    require_root!();
    let server = Server::start_with(&["--pool", "busybox:vm=2"]);
    server.wait_pool_ready("busybox", 2);
    let sessions: Vec<(String, String)> = (0..2).map(|_| vm_session(&server)).collect();
    assert_eq!(server.pool("busybox")["hits"], 2, "the creates did not take pods: {}", server.pool("busybox"));
    for (_, sandbox) in &sessions {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", vmm_pid(&server, sandbox))).unwrap();
        let ram = maps.lines().find(|l| l.contains("memfd:space-vm-template"));
        let ram = ram.unwrap_or_else(|| panic!("{sandbox}: the guest's RAM is not the template's memory:\n{maps}"));
        // `rw-p`: a private mapping, whose writes are the pod's own copies.
        assert_eq!(ram.split_whitespace().nth(1), Some("rw-p"), "{ram}");
    }
    // Restored from one memory image, and still each its own: random bytes, host name and
    // machine id (given by the node after the restore).
    let script = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' '; hostname; cat /etc/machine-id";
    let seen: Vec<Vec<String>> =
        sessions.iter().map(|(id, _)| stdout(&sh(&server, id, script)).lines().map(str::to_owned).collect()).collect();
    for (what, i) in [("random bytes", 0), ("host name", 1), ("machine id", 2)] {
        assert_ne!(seen[0][i], seen[1][i], "two pods share their {what}: {seen:?}");
    }
    for ((_, sandbox), seen) in sessions.iter().zip(&seen) {
        let hostname: String = sandbox.trim_start_matches("sbx_").chars().take(12).collect();
        assert_eq!(seen[1], hostname, "{seen:?}");
    }
}

fn vmm_pids(server: &Server) -> Vec<u32> {
    let dir = Path::new("/sys/fs/cgroup/pids").join(&server.cgroup_parent).join(server.node_id()).join("vm");
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .flat_map(|e| {
            std::fs::read_to_string(e.path().join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}
