//! Restoring a dumped sandbox as a new one.
//!
//! Everything that makes a restored copy a sandbox of its own is new: CRIU creates its user,
//! pid, mount, net, ipc, uts and cgroup namespaces, the user namespace in the host id range
//! given as [`RestoreOptions::sandbox_root`] (see userns_image.rs); its root is the given copy of the rootfs
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
//! node to follow: the node hands it back at CRIU's `pre-resume` step (CRIU runs through its
//! RPC, `criu swrk`, and tells the node each step; see rpc.rs). CRIU also re-applies the dumped
//! mount's flags, and atime flags cannot change on such a mount: the directory must be on a
//! filesystem mounted like the dumped sandbox's (in practice: next to it).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use space_sandbox_init::Confinement;

use crate::dump::{AGENT_KEY, SPACED_KEY};
use crate::error::{CriuError, Result, io_err, log_excerpt};
use crate::{Criu, rpc, userns_image};

/// Where a restored tree's cgroups go (CRIU's `cg_root`: `[controller:]path`). Without a
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
    /// CRIU binds the socket, and where the restored user namespace maps id 0 (the image's
    /// map is rewritten, see userns_image.rs: a restore may get another range than the dump).
    pub sandbox_root: (u32, u32),
    /// A detached mount of `root` (idmapped so that the storage's ids show as the new
    /// sandbox's) that CRIU restores onto instead of `root` itself: attached in the restore's
    /// private directory while CRIU runs, detached from the host after.
    pub root_mount: Option<Arc<OwnedFd>>,
    /// How many ids the sandbox's map holds from `sandbox_root`: every restored task is
    /// checked against that map (and the rest of a sandbox's confinement) before it runs.
    pub id_count: u32,
    /// The `spaced` binary the dumped pid 1 ran (mounted at `/dev/.spaced` again). CRIU checks
    /// its build id: a restore needs the very binary the sandbox was started with.
    pub spaced: PathBuf,
    /// Where the new sandbox's cgroups are created (CRIU copies the dumped limits into them).
    pub cgroup_roots: Vec<CgroupRoot>,
    pub tcp_established: bool,
    /// CRIU's log; by default a new `restore-<time>.log` in the images directory.
    pub log_file: Option<PathBuf>,
    /// Name prefix of the restore's private directory in the temp dir, which holds a bind
    /// mount while CRIU runs: unique per node, so [`sweep_leftover_work`] at start-up removes
    /// only what this node's killed restores left.
    pub work_prefix: String,
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
            root_mount: None,
            id_count: 65_536,
            spaced,
            cgroup_roots: Vec::new(),
            tcp_established: true,
            log_file: None,
            work_prefix: WORK_PREFIX.to_owned(),
        }
    }
}

/// A restored, running tree.
#[derive(Debug)]
pub struct RestoredTree {
    /// Host pid of its root (`spaced`, pid 1 inside). The caller's process is its parent
    /// (CRIU restores it as CRIU's sibling); the caller reaps it.
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
    /// Restores the dump in `opts.images_dir` as a new sandbox. On failure no process
    /// of it keeps running (its cgroups may remain: remove them as for a failed start) and the
    /// error carries the log's excerpt. Dropping the future leaves CRIU to finish on its own
    /// thread: don't.
    pub async fn restore(&self, opts: &RestoreOptions) -> Result<RestoredTree> {
        let log = opts.log_file.clone().unwrap_or_else(|| opts.images_dir.join(default_log_name()));
        let work = work_dir(&opts.work_prefix, opts.sandbox_root)?;
        let images = work.path().join(IMAGES_VIEW);
        std::fs::create_dir(&images).map_err(io_err("create", &images))?;
        let rewritten = work.path().join("userns.img");
        let _view = userns_image::remapped(&opts.images_dir, &images, &rewritten, opts.sandbox_root)?;
        prepare_agent_dir(&opts.agent_dir, opts.sandbox_root)?;
        // Whatever happens from here, the directory must not stay the sandbox's.
        let seal = Seal(&opts.agent_dir);
        let paths = Paths { agent_dir: work.path().join(AGENT_BIND), root: work.path().join(ROOT_ATTACH), images };
        let ran = match (AgentBind::new(&opts.agent_dir, &paths.agent_dir), RootAttach::new(opts, &paths.root)) {
            (Ok(bind), Ok(root)) => {
                let ran = self.run_restore(opts, &paths, &log, work.path()).await;
                drop((bind, root));
                ran
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        let sealed = seal.now();
        let (pid, wall) = ran?;
        // Its parent is this process (CRIU restored it as its sibling) and it has not been
        // reaped yet, so the pidfd names this very process.
        let pidfd = pidfd_open(pid).map_err(|e| CriuError::Restored(format!("pidfd_open({pid}): {e}")))?;
        match sealed.and_then(|()| find_socket(&opts.agent_dir)) {
            Ok(socket) => Ok(RestoredTree { pid, pidfd, socket, wall, log }),
            Err(e) => {
                kill(&pidfd);
                Err(e)
            }
        }
    }

    /// One `criu swrk` restore, answering CRIU's steps (see [`RestoreSteps`]); `work` is a
    /// private directory for the restore's own files.
    async fn run_restore(
        &self,
        opts: &RestoreOptions,
        paths: &Paths,
        log: &Path,
        work: &Path,
    ) -> Result<(u32, Duration)> {
        let images = rpc::open_dir(&paths.images).map_err(io_err("open images dir", &paths.images))?;
        let config = work.join("criu.conf");
        std::fs::write(&config, config_text(log)?).map_err(io_err("write", &config))?;
        let root = if opts.root_mount.is_some() { &paths.root } else { &opts.root };
        let request = restore_opts(opts, &paths.agent_dir, root, &config, images.as_raw_fd())?;
        let (criu, stderr) = (self.clone(), work.join("criu.stderr"));
        let (uid_base, gid_base) = opts.sandbox_root;
        let mut steps = RestoreSteps {
            agent_dir: opts.agent_dir.clone(),
            confinement: Confinement { uid_base, gid_base, count: opts.id_count },
            root: None,
        };
        tracing::debug!(criu = %criu.path.display(), ?request, "running criu swrk restore");
        let started = Instant::now();
        let outcome = tokio::task::spawn_blocking(move || {
            let outcome = rpc::restore(&criu, request, &stderr, |step| steps.on_step(step));
            drop(images); // CRIU opened it through /proc while it ran
            outcome
        })
        .await
        .map_err(|e| CriuError::Restored(format!("restore task: {e}")))?
        .map_err(|source| CriuError::Spawn { path: self.path.clone(), source })?;
        let wall = started.elapsed();
        let reason = match outcome.result {
            Ok(pid) if pid > 0 => return Ok((pid as u32, wall)),
            Ok(_) => "CRIU reported no pid".to_owned(),
            Err(failure) => {
                if let Some(root) = failure.root {
                    reap_failed_root(root).await;
                }
                failure.reason
            }
        };
        let text = tokio::fs::read_to_string(log).await.unwrap_or_default();
        Err(CriuError::Failed {
            action: "restore",
            status: format!("{reason}; {}", outcome.status),
            log: log.to_path_buf(),
            excerpt: log_excerpt(&text, &outcome.stderr),
        })
    }
}

/// Kills (if CRIU did not) and reaps the root of a failed restore: our child, not yet reaped,
/// so its pid cannot name another process.
async fn reap_failed_root(pid: i32) {
    let Ok(pidfd) = pidfd_open(pid as u32) else {
        return;
    };
    kill(&pidfd);
    let reaped = tokio::task::spawn_blocking(move || {
        // SAFETY: waitid on a pidfd we own, into a zeroed siginfo that outlives the call.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; P_PIDFD takes the descriptor as the id.
        unsafe { libc::waitid(libc::P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, libc::WEXITED) }
    })
    .await;
    if !matches!(reaped, Ok(0)) {
        tracing::warn!(pid, "cannot reap the root of a failed restore");
    }
}

/// What the node does at CRIU's restore steps:
/// - `setup-namespaces`: the restored network namespace is created empty (`empty_ns`), so
///   its `lo` is brought up and every address made local to it (the sandbox's one route)
///   before CRIU restores the sockets bound to them. A connection the sandbox held to the
///   gateway has the gateway's address as its own, so without the route CRIU cannot bind it
///   back and the restore fails; with it, the connection is restored and its first segment
///   meets no peer (the gateway's end was never in the dump): the client sees a reset and
///   connects again, as after any proxy restart.
/// - `pre-resume`, before any restored process runs: every task is checked against the
///   sandbox's confinement (`space_sandbox_init::check_restored_tree`: id map, capabilities,
///   no_new_privs, seccomp), and the agent directory goes back to host root, mode 0700 (see
///   the module docs for why).
struct RestoreSteps {
    agent_dir: PathBuf,
    confinement: Confinement,
    /// The restored tree's root, as CRIU names it at `setup-namespaces`.
    root: Option<u32>,
}

impl RestoreSteps {
    fn on_step(&mut self, step: rpc::Step<'_>) -> std::result::Result<(), String> {
        match step.name {
            "setup-namespaces" => {
                let pid = step.pid.and_then(|p| u32::try_from(p).ok()).ok_or("CRIU named no root pid")?;
                self.root = Some(pid);
                // Entering the namespace changes the calling thread for good: use one of its own.
                std::thread::spawn(move || {
                    space_sandbox_init::bring_up_loopback(pid).map_err(|e| e.0)?;
                    space_netns::route_every_address_to_loopback().map_err(|e| e.to_string())
                })
                .join()
                .map_err(|_| "the loopback thread panicked".to_owned())?
            }
            "pre-resume" => {
                let root = self.root.ok_or("CRIU reached pre-resume without naming the tree's root")?;
                space_sandbox_init::check_restored_tree(root, &self.confinement)
                    .map_err(|e| format!("the restored tree is not confined as a sandbox: {}", e.0))?;
                space_sandbox_init::seal_agent_dir(&self.agent_dir).map_err(|e| e.0)
            }
            _ => Ok(()),
        }
    }
}

/// CRIU's settings that must be paths in its own mount namespace (it runs in a private one,
/// see kerndat.rs): its working directory, where it mounts a cgroup yard (a mount there fails
/// on a directory handed over as a descriptor of ours), and the log in it.
fn config_text(log: &Path) -> Result<String> {
    let dir = log.parent().unwrap_or(Path::new("/"));
    let name = log.file_name().map(Path::new).unwrap_or(log);
    Ok(format!("work-dir {}\nlog-file {}\n", config_value(dir)?, config_value(name)?))
}

/// A path as a value in a CRIU configuration file, which splits at white space and quotes.
fn config_value(path: &Path) -> Result<&str> {
    path.to_str()
        .filter(|text| {
            !text.is_empty() && !text.contains(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == '\\')
        })
        .ok_or_else(|| CriuError::Restored(format!("{} cannot be given to CRIU in its configuration", path.display())))
}

/// The options of a `criu swrk` restore, each with the reason it is there; `agent_dir` is
/// where CRIU finds the agent directory, `root` the new sandbox's root, `config` the file
/// [`config_text`] wrote, `images` the open images directory.
pub(crate) fn restore_opts(
    opts: &RestoreOptions,
    agent_dir: &Path,
    root: &Path,
    config: &Path,
    images: RawFd,
) -> Result<rpc::Opts> {
    let text = |path: &Path| {
        path.to_str()
            .map(str::to_owned)
            .ok_or_else(|| CriuError::Restored(format!("{} is not UTF-8, which CRIU's RPC needs", path.display())))
    };
    Ok(rpc::Opts {
        images_dir_fd: images,
        config_file: Some(text(config)?),
        log_level: Some(4),
        // The mount namespace is rebuilt on the new rootfs.
        root: Some(text(root)?),
        // CRIU's steps come to us as messages, not as forks of an action script.
        notify_scripts: Some(true),
        // The tree's root becomes our child, as a started sandbox's pid 1 is.
        rst_sibling: Some(true),
        tcp_established: Some(opts.tcp_established),
        tcp_skip_in_flight: Some(opts.tcp_established),
        // Sandbox processes may hold flock/POSIX locks.
        file_locks: Some(true),
        // The dumped cgroups (with their limits) are created again under these roots.
        manage_cgroups: Some(true),
        manage_cgroups_mode: Some(rpc::CgMode::Soft as i32),
        cg_root: opts
            .cgroup_roots
            .iter()
            .map(|root| rpc::CgroupRootMsg { ctrl: root.controller.clone(), path: root.path.clone() })
            .collect(),
        // A sandbox's network namespace holds only `lo` (see space-gateway): CRIU's restore of
        // its addresses, routes and rules (six `ip` runs, ~30 ms) is replaced by bringing `lo`
        // up at the `setup-namespaces` step; the node adds the gateway's sockets afterwards.
        empty_ns: Some(libc::CLONE_NEWNET as u32),
        external: vec![
            format!("mnt[{AGENT_KEY}]:{}", text(agent_dir)?),
            format!("mnt[{SPACED_KEY}]:{}", text(&opts.spaced)?),
        ],
        // The automatically detected host binds (device nodes, /dev/null masks) come from the
        // same host paths again.
        auto_ext_mnt: Some(true),
    })
}

/// A bind mount of the agent directory at a path sandbox root can reach, for the time of a
/// restore.
/// Prefix of restore work directories when none is given.
pub const WORK_PREFIX: &str = "space-criu-";

/// Where a restore binds the agent dir inside its work directory.
const AGENT_BIND: &str = "agent";

/// Where a restore attaches [`RestoreOptions::root_mount`] inside its work directory.
const ROOT_ATTACH: &str = "root";

/// The images as this restore reads them (see userns_image.rs), in its work directory.
const IMAGES_VIEW: &str = "images";

/// The paths a restore hands CRIU, in its work directory.
struct Paths {
    agent_dir: PathBuf,
    root: PathBuf,
    images: PathBuf,
}

/// Removes the work directories of restores that were killed with their process (named
/// `<prefix>*` in the temp dir): the agent dir's bind is detached first, and a directory
/// whose bind cannot be detached is left alone rather than emptied through it. Never fails:
/// what cannot be removed is logged. Returns how many were removed.
///
/// The temp dir is anyone's to write: only real directories owned by root are considered (a
/// local user could otherwise plant `<prefix>x/agent` as a symlink to a host mount point), and
/// the unmount does not follow a symlink.
pub fn sweep_leftover_work(prefix: &str) -> usize {
    let temp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&temp) else { return 0 };
    let mut removed = 0;
    for dir in entries.filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().starts_with(prefix)) {
        let dir = dir.path();
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() && meta.uid() == 0 => {}
            _ => {
                tracing::warn!(dir = %dir.display(), "not a restore's work directory (not root's, or a symlink); left alone");
                continue;
            }
        }
        let detached = [AGENT_BIND, ROOT_ATTACH, IMAGES_VIEW].iter().try_for_each(|name| detach_all(&dir.join(name)));
        match detached {
            Ok(()) => match std::fs::remove_dir_all(&dir) {
                Ok(()) => removed += 1,
                Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a restore's leftovers"),
            },
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot detach a restore's leftover bind"),
        }
    }
    removed
}

/// Detaches every mount stacked at `at` until it is a plain directory (or missing).
fn detach_all(at: &Path) -> std::result::Result<(), nix::Error> {
    for _ in 0..16 {
        match nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => continue,
            // EINVAL: not a mount point (any more); ENOENT: no such directory.
            Err(nix::Error::EINVAL | nix::Error::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Err(nix::Error::EBUSY)
}

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

/// [`RestoreOptions::root_mount`] attached at a path for the time of a restore (CRIU's root
/// must be a path); nothing when the options have none.
struct RootAttach<'a>(Option<&'a Path>);

impl<'a> RootAttach<'a> {
    fn new(opts: &RestoreOptions, at: &'a Path) -> Result<RootAttach<'a>> {
        let Some(mount) = &opts.root_mount else { return Ok(RootAttach(None)) };
        std::fs::DirBuilder::new().mode(0o755).create(at).map_err(io_err("create", at))?;
        space_sandbox_init::attach_mount(mount.as_raw_fd(), at)
            .map_err(|e| io_err("attach the root mount at", at)(e.into()))?;
        Ok(RootAttach(Some(at)))
    }
}

impl Drop for RootAttach<'_> {
    fn drop(&mut self) {
        // Detached: the restored sandbox's copy of the mount stays.
        if let Some(at) = self.0
            && let Err(e) = nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH)
        {
            tracing::warn!(path = %at.display(), error = %e, "cannot detach the restore's root mount");
        }
    }
}

fn default_log_name() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("restore-{nanos}.log")
}

/// The restore's work directory in the temp dir, which anyone can list: entered only by root
/// and by the sandbox's root (its group), which CRIU's restored root task is when it reaches
/// the new root and the agent dir's bind in it by path. Nobody else: the images' view in it
/// holds images anyone may read (restored tasks read them as the sandbox's root), in clear.
fn work_dir(prefix: &str, (_, gid): (u32, u32)) -> Result<tempfile::TempDir> {
    let temp = std::env::temp_dir();
    let work = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .map_err(io_err("create a temp dir", &temp))?;
    nix::unistd::chown(work.path(), None, Some(nix::unistd::Gid::from_raw(gid)))
        .map_err(|e| io_err("chown", work.path())(e.into()))?;
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o710))
        .map_err(io_err("chmod", work.path()))?;
    Ok(work)
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

/// Gives the agent directory back to host root, mode 0700 (normally done at `pre-resume`
/// already).
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
    fn restore_options() {
        let mut opts =
            RestoreOptions::new("/snap/criu", "/pool/sbx_b/rootfs", "/run/space/sbx_b.sock.d", "/bin/spaced");
        opts.cgroup_roots =
            vec![CgroupRoot::new(Some("memory"), "/space/sbx_b"), CgroupRoot::new(None, "/space/sbx_b")];
        let request = restore_opts(&opts, Path::new("/t/agent"), &opts.root, Path::new("/t/criu.conf"), 7).unwrap();
        assert_eq!((request.images_dir_fd, request.config_file.as_deref()), (7, Some("/t/criu.conf")));
        assert_eq!(request.root.as_deref(), Some("/pool/sbx_b/rootfs"));
        assert_eq!(
            (request.notify_scripts, request.rst_sibling, request.tcp_established),
            (Some(true), Some(true), Some(true))
        );
        assert_eq!(request.manage_cgroups_mode, Some(rpc::CgMode::Soft as i32));
        assert_eq!(request.external, vec!["mnt[space-agent]:/t/agent", "mnt[space-spaced]:/bin/spaced"]);
        assert_eq!(request.empty_ns, Some(libc::CLONE_NEWNET as u32));
        let roots: Vec<_> = request.cg_root.iter().map(|r| (r.ctrl.as_deref(), r.path.as_str())).collect();
        assert_eq!(roots, vec![(Some("memory"), "/space/sbx_b"), (None, "/space/sbx_b")]);
    }

    #[test]
    fn a_path_criu_cannot_be_given_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let root = std::ffi::OsStr::from_bytes(b"/pool/\xff/rootfs");
        let opts = RestoreOptions::new("/snap/criu", root, "/run/a.d", "/bin/spaced");
        assert!(restore_opts(&opts, Path::new("/t/agent"), &opts.root, Path::new("/t/criu.conf"), 7).is_err());
    }

    #[test]
    fn the_configuration_names_the_work_dir_and_log() {
        let text = config_text(Path::new("/snap/criu/restore-1.log")).unwrap();
        assert_eq!(text, "work-dir /snap/criu\nlog-file restore-1.log\n");
        assert!(config_text(Path::new("/snap/my criu/r.log")).is_err());
        assert!(config_text(Path::new("/snap/criu/r\".log")).is_err());
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

    /// Files in a restore's work directory (the images' view) are reached by root and the
    /// sandbox's root alone: another user is refused at the directory (EACCES), the sandbox's
    /// root gets through.
    #[test]
    fn a_restores_work_dir_is_entered_only_by_the_sandboxs_root() {
        assert_eq!(nix_ids().0, 0, "needs root: it runs a command as other users");
        let sandbox_root = (100_000, 100_000);
        let work = work_dir("space-criu-test-", sandbox_root).unwrap();
        let image = work.path().join("pages-1.img");
        std::fs::write(&image, "in clear").unwrap();
        std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644)).unwrap();
        let read_as = |(uid, gid): (u32, u32)| {
            use std::os::unix::process::CommandExt;
            let mut cat = std::process::Command::new("cat");
            let out = cat.arg(&image).env("LC_ALL", "C").uid(uid).gid(gid).output().unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let (read, _, error) = read_as((65_534, 65_534));
        assert!(!read && error.contains("Permission denied"), "another user read it: {error}");
        assert_eq!(read_as(sandbox_root), (true, "in clear".to_owned(), String::new()));
    }

    fn nix_ids() -> (u32, u32) {
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        unsafe { (libc::getuid(), libc::getgid()) }
    }
}
