//! Fixtures for the root-only sandbox tests: a busybox rootfs, a runtime with a unique cgroup
//! parent and run dir, guards that destroy everything even when a test fails, and a tiny
//! client for the agent protocol.

#![allow(dead_code)]

use std::os::unix::fs::{PermissionsExt, lchown, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use space_proto::{AgentClient, ExecSpec, ExitStatus};
use space_runtime::{Limits, RootDisk, Runtime, SandboxHandle, SandboxId, SandboxSpec};
use space_runtime_linux::{IdMap, LinuxOptions, LinuxRuntime};

/// Fails the test when not root (a skipped test would pass without testing anything); returns
/// `true` so callers keep their early return.
pub fn require_root(test: &str) -> bool {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{test}: the linux runtime tests need root (namespaces, cgroups): run them as root (scripts/test.sh)"
    );
    true
}

/// The binary started as `<it> init`: $SPACED_BIN (the real static spaced, as
/// scripts/test.sh sets it) or this crate's stand-in.
pub fn spaced_binary() -> PathBuf {
    match std::env::var_os("SPACED_BIN") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_space-test-init")),
    }
}

/// A runtime with its own cgroup parent and run dir, removed on drop.
pub struct TestRuntime {
    pub rt: Arc<LinuxRuntime>,
    _run_dir: tempfile::TempDir,
}

impl TestRuntime {
    pub fn new() -> TestRuntime {
        Self::with(|_| {})
    }

    /// A runtime whose options `adjust` changes first.
    pub fn with(adjust: impl FnOnce(&mut LinuxOptions)) -> TestRuntime {
        let run_dir = tempfile::Builder::new().prefix("space-rl-").tempdir_in("/tmp").unwrap();
        let parent = format!("space-test/{}", SandboxId::generate().as_str().trim_start_matches("sbx_"));
        let mut opts = LinuxOptions::new(spaced_binary(), run_dir.path(), parent);
        opts.id_map = IdMap::default();
        adjust(&mut opts);
        let rt = Arc::new(LinuxRuntime::new(opts).expect("runtime"));
        TestRuntime { rt, _run_dir: run_dir }
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
            if let Err(e) = rt.remove_cgroup_parent() {
                eprintln!("cleanup of cgroup parent: {e}");
            }
        })
        .join()
        .unwrap();
    }
}

/// A plain-directory rootfs with busybox, owned by the mapped root.
pub struct Rootfs {
    dir: tempfile::TempDir,
}

impl Rootfs {
    pub fn new() -> Rootfs {
        let dir = tempfile::Builder::new().prefix("space-rootfs-").tempdir_in("/tmp").unwrap();
        let root = dir.path();
        // The mapped root must be able to reach the rootfs.
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        for d in ["bin", "proc", "sys", "dev", "tmp", "etc", "root", "mnt"] {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
        let list = std::process::Command::new("/bin/busybox").arg("--list").output().unwrap();
        for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|a| *a != "busybox" && !a.contains('/')) {
            symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\ntty:x:5:\n").unwrap();
        chown_tree(root, IdMap::default().host_base);
        Rootfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn chown_tree(path: &Path, id: u32) {
    lchown(path, Some(id), Some(id)).unwrap();
    let meta = std::fs::symlink_metadata(path).unwrap();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), id);
        }
    }
}

pub fn spec(rootfs: &Path, limits: Limits) -> SandboxSpec {
    SandboxSpec {
        id: SandboxId::generate(),
        root: RootDisk::Directory(rootfs.to_path_buf()),
        hostname: "sbx-test".into(),
        limits,
    }
}

pub fn default_limits() -> Limits {
    Limits { memory_mib: 256, millicpus: 1000, pids: 256 }
}

/// What one exec produced.
#[derive(Debug, Default)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Connects to the sandbox's agent.
pub async fn connect(rt: &LinuxRuntime, handle: &SandboxHandle) -> AgentClient {
    AgentClient::connect_unix(&rt.socket_path(&handle.id)).await.expect("connect to the agent socket")
}

/// How long [`sh`] waits for a script before it fails the test.
const EXEC_BOUND: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs `sh -c script` in the sandbox and collects its output.
pub async fn sh(client: &AgentClient, script: &str) -> Output {
    let spec = ExecSpec { argv: vec!["/bin/sh".into(), "-c".into(), script.into()], ..Default::default() };
    let exec = async {
        let session = client.exec(spec).await.unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
        session.wait_with_output(1 << 20).await.unwrap_or_else(|e| panic!("exec {script:?}: {e}"))
    };
    // Not a timing assertion: a bound far above any exec's time keeps a lost reply from
    // hanging the suite, and names the script.
    let out = tokio::time::timeout(EXEC_BOUND, exec)
        .await
        .unwrap_or_else(|_| panic!("{script:?}: no answer in {EXEC_BOUND:?}"));
    Output {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `sh` that must exit 0; returns trimmed stdout.
pub async fn sh_ok(client: &AgentClient, script: &str) -> String {
    let out = sh(client, script).await;
    assert_eq!(out.status.code, Some(0), "{script:?} failed: {out:?}");
    out.stdout.trim().to_string()
}

/// Polls `check` until it holds (or panics after a generous bound). Not a timing assertion:
/// the bound only keeps a broken run from hanging forever.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Asserts that nothing of the sandbox is left on the host.
pub fn assert_gone(rt: &LinuxRuntime, handle: &SandboxHandle) {
    assert!(!rt.is_alive(handle), "pid 1 still alive");
    for dir in rt.cgroup_dirs(&handle.id) {
        assert!(!dir.exists(), "cgroup {} left behind", dir.display());
    }
    assert!(!rt.socket_path(&handle.id).exists(), "socket left behind");
    assert!(!rt.list().unwrap().contains(&handle.id), "still listed");
    let status = std::fs::read_to_string(format!("/proc/{}/status", handle.pid)).unwrap_or_default();
    let nspid_is_1 = status.lines().any(|l| l.starts_with("NSpid:") && l.trim_end().ends_with("\t1"));
    assert!(!nspid_is_1, "pid {} still exists (zombie or alive): {status}", handle.pid);
}
