//! Restoring a dumped sandbox as a new one.
//!
//! Everything that makes a restored copy a sandbox of its own is new: CRIU creates its user,
//! pid, mount, net, ipc, uts and cgroup namespaces; its root is the given copy of the rootfs
//! snapshot; its cgroups are created under the given roots; its agent socket is bound again by
//! CRIU inside its own network namespace, in the host directory given as
//! [`RestoreOptions::agent_dir`] (under the name the dumped sandbox's socket had in the run
//! dir). So restoring one image several times forks it.
//!
//! The agent directory: CRIU mounts it and binds the socket in it from inside the restored
//! sandbox's user namespace, so while CRIU works the directory must belong to sandbox root and
//! be reachable through directories sandbox root may search (the runtime's run dir is 0700:
//! CRIU gets the directory through a bind mount in a private searchable directory instead).
//! Before any restored process runs it must belong to host root again (mode 0700, so no
//! sandbox process can enter it), otherwise the sandbox could plant a symlink there for the
//! node to follow: the `pre-resume` step of the action script ([`RestoreOptions::hook`]) hands
//! it back. CRIU also re-applies the dumped mount's flags, and atime flags cannot change on
//! such a mount: the directory must be on a filesystem mounted like the dumped sandbox's (in
//! practice: next to it).

use std::ffi::OsString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use space_sandbox_init::CRIU_AGENT_DIR_ENV;

use crate::dump::{AGENT_KEY, SPACED_KEY, common_args};
use crate::error::{CriuError, Result, io_err};
use crate::{Criu, flag, run};

/// Where a restored tree's cgroups go: `--cgroup-root [controller:]path`. Without a
/// controller, the root of every controller not named otherwise (cgroup v2: the only one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRoot {
    pub controller: Option<String>,
    /// Absolute in the hierarchy, e.g. `/space/node-1/sbx_...`.
    pub path: String,
}

impl CgroupRoot {
    pub fn new(controller: Option<&str>, path: impl Into<String>) -> Self {
        CgroupRoot { controller: controller.map(str::to_owned), path: path.into() }
    }

    fn arg(&self) -> String {
        match &self.controller {
            Some(controller) => format!("{controller}:{}", self.path),
            None => self.path.clone(),
        }
    }
}

/// What to restore and where.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// A dump's images directory.
    pub images_dir: PathBuf,
    /// The new sandbox's root filesystem: a writable copy of the rootfs snapshot taken while
    /// the dumped tree was frozen. Every parent must be searchable by the sandbox's root.
    pub root: PathBuf,
    /// A host directory for the new sandbox's agent socket; created (its parent must exist),
    /// or an existing empty one. The socket appears in it under the dumped sandbox's socket
    /// name ([`RestoredTree::socket`]). On the run dir's filesystem (see the module docs).
    pub agent_dir: PathBuf,
    /// Host uid and gid of the sandbox's root (the id map's base): owner of `agent_dir` while
    /// CRIU binds the socket.
    pub sandbox_root: (u32, u32),
    /// The `spaced` binary the dumped pid 1 ran (mounted at `/dev/.spaced` again). CRIU checks
    /// its build id: a restore needs the very binary the sandbox was started with.
    pub spaced: PathBuf,
    /// CRIU's action script: the current `spaced` (see `space_sandbox_init::run_criu_hook`),
    /// which may be newer than [`RestoreOptions::spaced`].
    pub hook: PathBuf,
    /// Where the new sandbox's cgroups are created (CRIU copies the dumped limits into them).
    pub cgroup_roots: Vec<CgroupRoot>,
    pub tcp_established: bool,
    /// CRIU's log; by default a new `restore-<time>.log` in the images directory.
    pub log_file: Option<PathBuf>,
}

impl RestoreOptions {
    pub fn new(
        images_dir: impl Into<PathBuf>,
        root: impl Into<PathBuf>,
        agent_dir: impl Into<PathBuf>,
        spaced: impl Into<PathBuf>,
    ) -> Self {
        let spaced = spaced.into();
        RestoreOptions {
            images_dir: images_dir.into(),
            root: root.into(),
            agent_dir: agent_dir.into(),
            sandbox_root: (100_000, 100_000),
            hook: spaced.clone(),
            spaced,
            cgroup_roots: Vec::new(),
            tcp_established: true,
            log_file: None,
        }
    }
}

/// A restored, running tree.
#[derive(Debug)]
pub struct RestoredTree {
    /// Host pid of its root (`spaced`, pid 1 inside). The caller's process is its parent
    /// (CRIU, our child, exits; a child subreaper such as the linux runtime adopts it).
    pub pid: u32,
    /// A pidfd of `pid`, opened while the process could not have been reaped yet.
    pub pidfd: OwnedFd,
    /// The agent's listening socket on the host, in `agent_dir`.
    pub socket: PathBuf,
    /// Wall time of `criu restore`.
    pub wall: Duration,
    pub log: PathBuf,
}

impl Criu {
    /// Restores the dump in `opts.images_dir` as a new sandbox, detached. On failure no process
    /// of it keeps running (its cgroups may remain: remove them as for a failed start) and the
    /// error carries the log's excerpt. Dropping the future kills CRIU half-way: don't.
    pub async fn restore(&self, opts: &RestoreOptions) -> Result<RestoredTree> {
        let log = opts.log_file.clone().unwrap_or_else(|| opts.images_dir.join(default_log_name()));
        let work = tempfile::Builder::new()
            .prefix("space-criu-")
            .permissions(std::fs::Permissions::from_mode(0o711))
            .tempdir()
            .map_err(io_err("create a temp dir", &std::env::temp_dir()))?;
        let pidfile = work.path().join("pid");
        prepare_agent_dir(&opts.agent_dir, opts.sandbox_root)?;
        // Whatever happens from here, the directory must not stay the sandbox's.
        let seal = Seal(&opts.agent_dir);
        let reachable = work.path().join("agent");
        let ran = match AgentBind::new(&opts.agent_dir, &reachable) {
            Ok(bind) => {
                let args = restore_args(opts, &reachable, &log, &pidfile);
                let ran = run::criu(self, "restore", &args, &[(CRIU_AGENT_DIR_ENV, &opts.agent_dir)], &log).await;
                drop(bind);
                ran
            }
            Err(e) => Err(e),
        };
        let sealed = seal.now();
        let wall = ran?;
        let pid = read_pid(&pidfile)?;
        // Its parent was CRIU, our child, now gone: a child subreaper (the linux runtime is one)
        // has adopted it and not reaped it yet, so the pidfd names this very process.
        let pidfd = pidfd_open(pid).map_err(|e| CriuError::Restored(format!("pidfd_open({pid}): {e}")))?;
        match sealed.and_then(|()| find_socket(&opts.agent_dir)) {
            Ok(socket) => Ok(RestoredTree { pid, pidfd, socket, wall, log }),
            Err(e) => {
                kill(&pidfd);
                Err(e)
            }
        }
    }
}

/// The arguments of `criu restore`, each with the reason it is there; `agent_dir` is where
/// CRIU finds the agent directory.
pub(crate) fn restore_args(opts: &RestoreOptions, agent_dir: &Path, log: &Path, pidfile: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["restore".into()];
    flag(&mut args, "--images-dir", &opts.images_dir);
    flag(&mut args, "--log-file", log);
    args.push("-v4".into());
    // The mount namespace is rebuilt on the new rootfs.
    flag(&mut args, "--root", &opts.root);
    // CRIU exits once the tree runs; the tree's root is re-parented to our subreaper.
    args.push("--restore-detached".into());
    flag(&mut args, "--pidfile", pidfile);
    common_args(&mut args, opts.tcp_established);
    // A sandbox's network namespace holds only `lo` (see space-gateway): CRIU's restore of
    // its addresses, routes and rules (six `ip` runs, ~30 ms) is replaced by bringing `lo` up
    // in the hook; the node adds its route and the gateway's sockets afterwards, as at boot.
    flag(&mut args, "--empty-ns", "net");
    let mut agent = OsString::from(format!("mnt[{AGENT_KEY}]:"));
    agent.push(agent_dir);
    flag(&mut args, "--external", agent);
    let mut spaced = OsString::from(format!("mnt[{SPACED_KEY}]:"));
    spaced.push(&opts.spaced);
    flag(&mut args, "--external", spaced);
    // The automatically detected host binds (device nodes, /dev/null masks) come from the same
    // host paths again.
    flag(&mut args, "--ext-mount-map", "auto");
    for root in &opts.cgroup_roots {
        flag(&mut args, "--cgroup-root", root.arg());
    }
    flag(&mut args, "--action-script", &opts.hook);
    args
}

/// A bind mount of the agent directory at a path sandbox root can reach, for the time of a
/// restore.
struct AgentBind<'a>(&'a Path);

impl<'a> AgentBind<'a> {
    fn new(agent_dir: &Path, at: &'a Path) -> Result<AgentBind<'a>> {
        std::fs::create_dir(at).map_err(io_err("create", at))?;
        nix::mount::mount(Some(agent_dir), at, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| io_err("bind the agent dir at", at)(e.into()))?;
        Ok(AgentBind(at))
    }
}

impl Drop for AgentBind<'_> {
    fn drop(&mut self) {
        // Detached: the restored sandbox's copy of the mount stays.
        if let Err(e) = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(path = %self.0.display(), error = %e, "cannot unmount the agent dir's bind");
        }
    }
}

fn default_log_name() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("restore-{nanos}.log")
}

/// Creates the agent directory (or accepts an empty one) and gives it to sandbox root.
fn prepare_agent_dir(dir: &Path, (uid, gid): (u32, u32)) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(dir).map_err(io_err("stat", dir))?;
            let empty = meta.is_dir() && std::fs::read_dir(dir).map_err(io_err("read", dir))?.next().is_none();
            if !empty {
                return Err(CriuError::Restored(format!("agent dir {} exists and is not empty", dir.display())));
            }
        }
        Err(e) => return Err(io_err("create agent dir", dir)(e)),
    }
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid)).map_err(io_err("chown agent dir", dir))
}

/// Seals the agent directory when dropped, unless [`Seal::now`] did.
struct Seal<'a>(&'a Path);

impl Seal<'_> {
    fn now(self) -> Result<()> {
        let result = seal_agent_dir(self.0);
        std::mem::forget(self);
        result
    }
}

impl Drop for Seal<'_> {
    fn drop(&mut self) {
        let _ = seal_agent_dir(self.0);
    }
}

/// Gives the agent directory back to host root, mode 0700 (the hook normally did already),
/// the way the hook does.
fn seal_agent_dir(dir: &Path) -> Result<()> {
    space_sandbox_init::seal_agent_dir(dir).map_err(|e| CriuError::Restored(e.0))
}

/// The restored listener: the agent dir's only entry, a socket (not something else the
/// sandbox could have put there).
fn find_socket(dir: &Path) -> Result<PathBuf> {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err("read agent dir", dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(io_err("read agent dir", dir))?;
    let [socket] = &entries[..] else {
        return Err(CriuError::Restored(format!("agent dir {} holds {} entries, not 1", dir.display(), entries.len())));
    };
    let meta = std::fs::symlink_metadata(socket).map_err(io_err("stat", socket))?;
    if meta.file_type().is_socket() && meta.nlink() == 1 {
        Ok(socket.clone())
    } else {
        Err(CriuError::Restored(format!("{} is not the agent's socket", socket.display())))
    }
}

fn read_pid(pidfile: &Path) -> Result<u32> {
    let text = std::fs::read_to_string(pidfile).map_err(io_err("read pidfile", pidfile))?;
    text.trim().parse().map_err(|_| CriuError::Restored(format!("pidfile holds {:?}", text.trim())))
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// SIGKILLs the tree's root; its pid namespace dies with it.
fn kill(pidfd: &OwnedFd) {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal with a valid pidfd, a signal number and no siginfo.
    unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGKILL, 0usize, 0u32) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_arguments() {
        let mut opts =
            RestoreOptions::new("/snap/criu", "/pool/sbx_b/rootfs", "/run/space/sbx_b.sock.d", "/bin/spaced");
        opts.cgroup_roots =
            vec![CgroupRoot::new(Some("memory"), "/space/sbx_b"), CgroupRoot::new(None, "/space/sbx_b")];
        let (agent, log) = (Path::new("/t/agent"), Path::new("/snap/criu/r.log"));
        let args = restore_args(&opts, agent, log, Path::new("/t/pid"));
        let joined = args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        assert!(joined.starts_with("restore --images-dir /snap/criu --log-file /snap/criu/r.log -v4"), "{joined}");
        for expected in [
            "--root /pool/sbx_b/rootfs",
            "--restore-detached",
            "--pidfile /t/pid",
            "--tcp-established",
            "--manage-cgroups=soft",
            "--external mnt[space-agent]:/t/agent",
            "--external mnt[space-spaced]:/bin/spaced",
            "--ext-mount-map auto",
            "--empty-ns net",
            "--cgroup-root memory:/space/sbx_b",
            "--cgroup-root /space/sbx_b",
            "--action-script /bin/spaced",
        ] {
            assert!(joined.contains(expected), "{expected} missing in {joined}");
        }
    }

    #[test]
    fn agent_dir_is_prepared_and_sealed() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("a.sock.d");
        let me = (nix_ids().0, nix_ids().1);
        prepare_agent_dir(&dir, me).unwrap();
        prepare_agent_dir(&dir, me).unwrap(); // empty: accepted again
        std::fs::write(dir.join("x"), "").unwrap();
        assert!(prepare_agent_dir(&dir, me).is_err());
        if me.0 == 0 {
            seal_agent_dir(&dir).unwrap();
            let meta = std::fs::metadata(&dir).unwrap();
            assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
        }
        assert!(find_socket(&dir).is_err(), "a plain file is no socket");
    }

    fn nix_ids() -> (u32, u32) {
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        unsafe { (libc::getuid(), libc::getgid()) }
    }
}
