//! Fixtures of the root-only VM tests: a runtime with its own run dir and cgroup parent that
//! destroys every VM on drop (even when a test fails), a small busybox root image, and an
//! agent client helper.
//!
//! Needs: root, the guest artifacts (`scripts/install-vm.sh` → /var/cache/space/vm/READY),
//! and `SPACED_BIN`: a static spaced with guest mode. A missing piece fails the test.

#![allow(dead_code)]

use std::os::unix::fs::{PermissionsExt, lchown, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use space_proto::{AgentClient, ExecSpec, ExitStatus};
use space_runtime::{Limits, SandboxId};
use space_runtime_vm::{AccelPolicy, IdMap, VmHandle, VmOptions, VmRuntime, VmSpec, make_root_image};

pub const GUEST_DIR: &str = "/var/cache/space/vm";

/// Fails (never skips) when something the tests need is missing.
pub fn require_host(test: &str) {
    assert!(nix::unistd::geteuid().is_root(), "{test}: the vm runtime tests need root (jail, cgroups): run as root");
    let ready = Path::new(GUEST_DIR).join("READY");
    assert!(ready.exists(), "{test}: {} is missing: build the guest with scripts/install-vm.sh", ready.display());
    let spaced = spaced_binary();
    assert!(spaced.is_file(), "{test}: SPACED_BIN={} is not a file", spaced.display());
}

/// The static spaced with guest mode: $SPACED_BIN.
pub fn spaced_binary() -> PathBuf {
    match std::env::var_os("SPACED_BIN") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!("SPACED_BIN is not set: point it at a static spaced with guest mode (cargo build-spaced)"),
    }
}

/// A runtime with its own run dir and cgroup parent, everything removed on drop.
pub struct TestRuntime {
    pub rt: Arc<VmRuntime>,
    pub dir: tempfile::TempDir,
}

impl TestRuntime {
    pub fn new(test: &str) -> TestRuntime {
        Self::with(test, |_| {})
    }

    pub fn with(test: &str, adjust: impl FnOnce(&mut VmOptions)) -> TestRuntime {
        require_host(test);
        let dir = tempfile::Builder::new().prefix("space-vm-").tempdir_in("/tmp").unwrap();
        let parent = format!("space-test-vm/{}", SandboxId::generate().as_str().trim_start_matches("sbx_"));
        let mut opts =
            VmOptions::new(env!("CARGO_BIN_EXE_space-vm-jailer"), spaced_binary(), dir.path().join("run"), parent);
        opts.accel = AccelPolicy::Tcg;
        opts.id_map = IdMap::default();
        adjust(&mut opts);
        let rt = Arc::new(VmRuntime::new(opts).expect("vm runtime"));
        TestRuntime { rt, dir }
    }

    /// A spec for a fresh VM on a copy of `image`.
    pub fn spec(&self, image: &Path, memory_mib: u64) -> VmSpec {
        let id = SandboxId::generate();
        let disk = self.dir.path().join(format!("{id}.img"));
        std::fs::copy(image, &disk).unwrap();
        VmSpec { id, disk, hostname: "vmbox".into(), limits: Limits { memory_mib, millicpus: 1000, pids: 256 } }
    }
}

impl Drop for TestRuntime {
    fn drop(&mut self) {
        let rt = self.rt.clone();
        // Drop may run inside a test's tokio runtime: destroy from a thread of its own.
        std::thread::spawn(move || {
            let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            for id in rt.list().unwrap_or_default() {
                if let Err(e) = tokio.block_on(rt.destroy(&id)) {
                    eprintln!("cleanup of {id}: {e}");
                }
            }
            for dir in rt.cgroup_dirs(&SandboxId::generate()) {
                if let Some(parent) = dir.parent() {
                    let _ = std::fs::remove_dir(parent);
                }
            }
        })
        .join()
        .unwrap();
    }
}

/// A tiny root: static busybox with the applets the tests run, files owned on disk by the
/// storage range (100000 = the guest's root), as templates are stored.
pub fn busybox_tree(dir: &Path) {
    let storage = IdMap::default().host_base;
    for sub in ["bin", "etc", "tmp", "proc", "sys", "dev", "run", "root"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::copy("/usr/bin/busybox", dir.join("bin/busybox")).unwrap();
    let applets = [
        "sh", "uname", "cat", "true", "stat", "id", "ls", "sleep", "readlink", "echo", "nc", "mount", "dd", "md5sum",
        "od", "date", "sync", "mkdir",
    ];
    for applet in applets {
        symlink("busybox", dir.join("bin").join(applet)).unwrap();
    }
    std::fs::write(dir.join("etc/owned-by-1000"), "x").unwrap();
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let walk = walk(dir);
    for path in walk {
        lchown(&path, Some(storage), Some(storage)).unwrap();
    }
    lchown(dir.join("etc/owned-by-1000"), Some(storage + 1000), Some(storage + 1000)).unwrap();
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// A 64 MiB root image of [`busybox_tree`], in `dir`.
pub fn busybox_image(dir: &Path) -> PathBuf {
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    busybox_tree(&tree);
    let image = dir.join("root.img");
    make_root_image(&tree, &image, 64 << 20, IdMap::default()).expect("make_root_image");
    image
}

pub async fn connect(handle: &VmHandle) -> AgentClient {
    tokio::time::timeout(Duration::from_secs(30), AgentClient::connect_unix(&handle.agent_socket))
        .await
        .expect("agent connect timed out")
        .expect("agent connect")
}

/// How long [`run`] waits for a command before it fails the test.
const EXEC_BOUND: Duration = Duration::from_secs(300);

/// Runs `argv` in the guest; returns (stdout, exit code).
pub async fn run(client: &AgentClient, argv: &[&str]) -> (String, i32) {
    let spec = ExecSpec { argv: argv.iter().map(|a| a.to_string()).collect(), ..Default::default() };
    let exec = async { client.exec(spec).await.expect("exec").wait_with_output(1 << 20).await.expect("exec output") };
    // Not a timing assertion: a bound far above any exec's time keeps a lost reply from
    // hanging the suite, and names the command.
    let out = tokio::time::timeout(EXEC_BOUND, exec)
        .await
        .unwrap_or_else(|_| panic!("{argv:?}: no answer in {EXEC_BOUND:?}"));
    let code = match out.status {
        ExitStatus { code: Some(code), .. } => code,
        other => panic!("{argv:?} ended with {other:?}: {}", String::from_utf8_lossy(&out.stderr)),
    };
    (String::from_utf8_lossy(&out.stdout).into_owned(), code)
}

/// Nothing of the VM is left: no VMM, cgroup, directory or id range.
pub fn assert_gone(rt: &VmRuntime, id: &SandboxId, pid: Option<u32>) {
    if let Some(pid) = pid {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .is_ok_and(|s| !s.lines().any(|l| l.starts_with("State:") && (l.contains('Z') || l.contains('X'))));
        assert!(!alive, "the VMM {pid} still runs");
    }
    for dir in rt.cgroup_dirs(id) {
        assert!(!dir.exists(), "cgroup {} left behind", dir.display());
    }
    let vm_dir = rt.agent_socket(id).parent().unwrap().parent().unwrap().to_path_buf();
    assert!(!vm_dir.exists(), "{} left behind", vm_dir.display());
    assert_eq!(rt.vmm_uid(id), None, "id range still held");
    assert!(!rt.list().unwrap().contains(id), "still listed");
}

/// Runs a shell script in the guest and returns its stdout; a failure fails the test.
pub async fn sh(client: &AgentClient, script: &str) -> String {
    let spec = ExecSpec { argv: vec!["sh".into(), "-c".into(), script.into()], ..Default::default() };
    let out = client.exec(spec).await.expect("exec").wait_with_output(1 << 20).await.expect("exec output");
    assert!(out.status.success(), "{script:?} ended with {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Starts `argv` detached in the guest; returns its pid.
pub async fn spawn_detached(client: &AgentClient, argv: &[&str]) -> u32 {
    let spec = ExecSpec { argv: argv.iter().map(|a| a.to_string()).collect(), detached: true, ..Default::default() };
    let session = client.exec(spec).await.expect("detached exec");
    assert_ne!(session.pid(), 0, "{argv:?} did not start");
    session.pid()
}

/// A full snapshot as the node takes it: the agent connection let go while the VM runs,
/// then pause and checkpoint (the VM stays paused).
pub async fn checkpoint_as_the_node(rt: &VmRuntime, id: &SandboxId, state: &Path) -> space_runtime::CheckpointStats {
    rt.release_agent(id, Duration::from_secs(5)).await.expect("release the agent");
    rt.pause(id).await.expect("pause");
    rt.checkpoint(id, state).await.expect("checkpoint")
}

/// Polls `probe` (at most 30 s) until it returns `Some`.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
