//! Fixtures of the root-only CRIU tests: a btrfs pool in a temp data dir with a busybox
//! template, a linux runtime with its own cgroup parent and run dir, and guards that remove
//! all of it (sandboxes, cgroups, subvolumes, the loop mount) even when a test fails.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_criu::Criu;
use space_proto::{AgentClient, ExecSpec};
use space_runtime::{Limits, Runtime, SandboxId};
use space_runtime_linux::{LinuxOptions, LinuxRuntime};
use space_storage::{Pool, PoolOptions, SandboxIdentity, TemplateInfo, btrfs};

/// CRIU, or `None` with a message saying why the test is skipped.
pub fn criu_or_skip(test: &str) -> Option<Criu> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED {test}: needs root (namespaces, cgroups, btrfs, CRIU)");
        return None;
    }
    let criu = match Criu::locate(None) {
        Ok(criu) => criu,
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            return None;
        }
    };
    if !spaced_binary().is_file() {
        eprintln!("SKIPPED {test}: no spaced at {} (run `cargo build-spaced`)", spaced_binary().display());
        return None;
    }
    Some(criu)
}

/// The real `spaced` ($SPACED_BIN, as scripts/test.sh sets it, or the `cargo build-spaced`
/// output): the tests need its detached exec, which the runtime crate's stand-in lacks.
pub fn spaced_binary() -> PathBuf {
    match std::env::var_os("SPACED_BIN") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/x86_64-unknown-linux-gnu/release/spaced"),
    }
}

/// A pool (loop-mounted image in a temp data dir) and a runtime whose cgroups and sockets are
/// all named under a unique prefix. Drop destroys every sandbox the runtime can list, then
/// every subvolume, then unmounts the pool.
pub struct Env {
    pub rt: Arc<LinuxRuntime>,
    pool: Option<Pool>,
    template: Option<TemplateInfo>,
    data_dir: Option<tempfile::TempDir>,
    _run_dir: tempfile::TempDir,
}

impl Env {
    pub fn new(test: &str) -> Env {
        let data_dir = tempfile::Builder::new().prefix(&format!("space-criu-{test}-")).tempdir().expect("tempdir");
        // The mapped root binds the rootfs from inside its user namespace: it must be able to
        // traverse every parent directory.
        std::fs::set_permissions(data_dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let run_dir = tempfile::Builder::new().prefix("space-criu-run-").tempdir_in("/tmp").unwrap();
        // As the runtime makes its run dir: nothing of a sandbox may reach it.
        std::fs::set_permissions(run_dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let parent = format!("space-test/{}", SandboxId::generate().as_str().trim_start_matches("sbx_"));
        let rt =
            Arc::new(LinuxRuntime::new(LinuxOptions::new(spaced_binary(), run_dir.path(), parent)).expect("runtime"));
        let options = PoolOptions { nobarrier: true, ..PoolOptions::default() };
        let mut env = Env { rt, pool: None, template: None, data_dir: Some(data_dir), _run_dir: run_dir };
        // From here on Drop cleans up whatever fails below.
        env.pool = Some(Pool::open(env.data_dir(), options).expect("open pool"));
        let template = env.pool().templates().build_builtin("busybox", None, &space_storage::no_progress);
        env.template = Some(template.expect("busybox template"));
        env
    }

    pub fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("pool")
    }

    fn data_dir(&self) -> PathBuf {
        self.data_dir.as_ref().expect("data dir").path().to_path_buf()
    }

    /// A fresh writable root for sandbox `id`.
    pub fn new_root(&self, id: &SandboxId) -> PathBuf {
        let identity = SandboxIdentity { hostname: "criu-test".into() };
        let template = self.template.as_ref().expect("template");
        self.pool().create_sandbox_root(id, template, identity).expect("sandbox root")
    }

    /// `<pool>/snapshots/<name>`: a directory for one snapshot (its rootfs and criu images).
    pub fn snapshot_dir(&self, name: &str) -> PathBuf {
        let dir = self.pool().snapshots_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A writable root for sandbox `id` made from a (read-only) snapshot.
    pub fn root_from_snapshot(&self, id: &SandboxId, snapshot: &Path) -> PathBuf {
        let dir = self.pool().sandbox_dir(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        let root = dir.join("rootfs");
        btrfs::snapshot(snapshot, &root, false).expect("snapshot of the snapshot");
        root
    }
}

impl Drop for Env {
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
        if let Some(pool) = self.pool.take() {
            for id in pool.list_sandbox_roots().unwrap_or_default() {
                let _ = pool.delete_sandbox_root(&id);
            }
            let snapshots = pool.snapshots_dir();
            for entry in std::fs::read_dir(&snapshots).into_iter().flatten().flatten() {
                delete_subvolumes_in(&entry.path());
                let _ = std::fs::remove_dir_all(entry.path());
            }
            for t in pool.templates().list().unwrap_or_default() {
                let _ = pool.templates().delete(&t.name, t.version);
            }
        }
        if let Some(dir) = self.data_dir.take() {
            if let Err(e) = Pool::unmount(dir.path()) {
                eprintln!("cleanup: unmount of the pool failed: {e}");
            }
            drop(dir);
        }
    }
}

/// Deletes the subvolumes directly in `dir`.
pub fn delete_subvolumes_in(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if btrfs::is_subvolume(&entry.path()).unwrap_or(false) {
            let _ = btrfs::set_readonly(&entry.path(), false);
            let _ = btrfs::delete_subvolume(&entry.path());
        }
    }
}

pub fn limits() -> Limits {
    Limits { memory_mib: 512, millicpus: 1000, pids: 256 }
}

/// Runs `sh -c script` in the sandbox; panics unless it exits 0. Returns trimmed stdout.
pub async fn sh_ok(client: &AgentClient, script: &str) -> String {
    let spec = ExecSpec { argv: vec!["/bin/sh".into(), "-c".into(), script.into()], ..Default::default() };
    let session = client.exec(spec).await.unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    let out = session.wait_with_output(1 << 20).await.unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(out.status.code, Some(0), "{script:?} failed: {out:?}");
    stdout
}

/// Starts `sh -c script` detached: it keeps running after this returns.
pub async fn spawn_detached(client: &AgentClient, script: &str) -> u32 {
    let spec =
        ExecSpec { argv: vec!["/bin/sh".into(), "-c".into(), script.into()], detached: true, ..Default::default() };
    let session = client.exec(spec).await.unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    session.pid()
}

/// Polls `check` until it returns `Some` (or panics after a generous bound that only keeps a
/// broken run from hanging).
pub async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `--cgroup-root` arguments that put a restored tree where the runtime keeps sandbox
/// `id`'s cgroups (what a runtime "adopt" would provide).
pub fn cgroup_roots(rt: &LinuxRuntime, id: &SandboxId) -> Vec<space_criu::CgroupRoot> {
    let name = Path::new(&rt.options().cgroup_parent).join(id.as_str());
    rt.cgroup_dirs(id)
        .iter()
        .map(|dir| {
            let mount = dir.to_str().unwrap().strip_suffix(name.to_str().unwrap()).unwrap().trim_end_matches('/');
            let path = format!("/{}", name.display());
            match Path::new(mount) {
                m if m == Path::new("/sys/fs/cgroup") => space_criu::CgroupRoot::new(None, path),
                m => space_criu::CgroupRoot::new(m.file_name().and_then(|n| n.to_str()), path),
            }
        })
        .collect()
}

/// Waits until the sandbox's agent holds no connection any more (the node's side is closed
/// by a task of the client's, after the client is dropped): a connection to the host is a
/// socket CRIU cannot take along.
pub async fn wait_disconnected(pid: u32) {
    let dir = format!("{}/", space_criu::AGENT_DIR);
    eventually("the agent's connections are closed", async || {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).ok()?;
        // Accepted connections carry the listener's path and state 03 (connected).
        let connected = table.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() >= 8 && cols[5] == "03" && cols[7].starts_with(&dir)
        });
        (!connected).then_some(())
    })
    .await;
}

/// An action script that snapshots `rootfs` read-only to `dest` at `post-dump`, while the
/// dumped tree is frozen.
pub fn snapshot_hook(dir: &Path, rootfs: &Path, dest: &Path) -> PathBuf {
    let hook = dir.join("post-dump.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\nexec btrfs subvolume snapshot -r '{}' '{}' >/dev/null\n",
            rootfs.display(),
            dest.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    hook
}

/// Reaps a restored tree's root after it was killed: the test process adopted it.
pub fn reap(pidfd: &std::os::fd::OwnedFd) {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    use std::os::fd::AsFd;
    let _ = waitid(Id::PIDFd(pidfd.as_fd()), WaitPidFlag::WEXITED);
}
