//! Checkpointing a sandbox's process tree.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{CriuError, Result, io_err};
use crate::streamer::{CaptureError, ImageStore, Streamer};
use crate::{AGENT_DIR, Criu, SELF_EXE, flag, run};

/// The image's names for the two host mounts a restore must provide again (see
/// [`crate::RestoreOptions`]).
pub(crate) const AGENT_KEY: &str = "space-agent";
pub(crate) const SPACED_KEY: &str = "space-spaced";

/// The largest deleted-but-open file a dump copies (CRIU's default is 1 MiB).
const GHOST_LIMIT: &str = "512M";

/// What all of a dump's ghost files may add up to by default: CRIU bounds each file only, and
/// a sandbox holding many deleted files open would otherwise fill the node's disk with them.
pub const GHOST_TOTAL_LIMIT: u64 = 1 << 30;

/// CRIU's name for the image of one ghost file (`ghost-file-<id>.img`).
const GHOST_IMAGE_PREFIX: &str = "ghost-file-";

/// The log file a dump writes in its images directory.
pub const DUMP_LOG: &str = "dump.log";
/// What the tools a dump runs print (a `.log`: not counted as an image).
const DUMP_STDERR: &str = "dump-stderr.log";

/// What to dump and how.
#[derive(Clone)]
pub struct DumpOptions {
    /// Host pid of the sandbox's pid 1.
    pub pid: u32,
    /// Where the images go (created if missing; must not hold another dump), or with `store`
    /// where only the dump's log is.
    pub images_dir: PathBuf,
    /// Where the images go instead, streamed (see streamer.rs): none is ever a file here.
    pub store: Option<Arc<dyn ImageStore>>,
    /// Resume the tree after the dump instead of killing it.
    pub leave_running: bool,
    /// Checkpoint established TCP connections (they are all inside the sandbox's own network
    /// namespace, so both ends are frozen together).
    pub tcp_established: bool,
    /// The tree's freezer cgroup (v1: the freezer hierarchy's directory): CRIU freezes through
    /// it instead of seizing each task, and leaves a tree the caller froze first frozen, so
    /// the caller can snapshot the rootfs in the same frozen state.
    pub freeze_cgroup: Option<PathBuf>,
    /// The cgroup v1 controllers the tree's cgroups are recorded for, one per hierarchy (the
    /// caller's own; the tree stays in CRIU's cgroups for the others). Empty: every hierarchy.
    pub cgroup_controllers: Vec<String>,
    /// The most bytes the dump's ghost files (deleted-but-open files, copied whole) may take
    /// together; a dump over it fails with [`CriuError::GhostsTooLarge`].
    pub ghost_total_limit: u64,
}

impl DumpOptions {
    pub fn new(pid: u32, images_dir: impl Into<PathBuf>) -> Self {
        DumpOptions {
            pid,
            images_dir: images_dir.into(),
            store: None,
            leave_running: false,
            tcp_established: true,
            freeze_cgroup: None,
            cgroup_controllers: Vec::new(),
            ghost_total_limit: GHOST_TOTAL_LIMIT,
        }
    }
}

/// What a dump cost.
#[derive(Debug, Clone, Copy)]
pub struct DumpStats {
    /// Wall time of the whole `criu dump` run (the tree is frozen for most of it).
    pub wall: Duration,
    /// Total size of the image files.
    pub image_bytes: u64,
}

impl Criu {
    /// Checkpoints the tree of `opts.pid`. The caller must have closed its connections to the
    /// sandbox's agent first. On failure the tree keeps running and the error carries the
    /// log's excerpt (the whole log is `<images_dir>/dump.log`).
    pub async fn dump(&self, opts: &DumpOptions) -> Result<DumpStats> {
        tokio::fs::create_dir_all(&opts.images_dir).await.map_err(io_err("create images dir", &opts.images_dir))?;
        let log = opts.images_dir.join(DUMP_LOG);
        let stderr = opts.images_dir.join(DUMP_STDERR);
        let streamer = match &opts.store {
            Some(store) => Some(
                Streamer::capture(&opts.images_dir, store.clone(), GHOST_IMAGE_PREFIX, opts.ghost_total_limit)
                    .map_err(CaptureError::from)?,
            ),
            None => None,
        };
        let ran = run::criu(self, "dump", &dump_args(opts), &[], &log, &stderr).await;
        let sizes = match streamer {
            Some(streamer) => ImageSizes::of(&streamed(ran.as_ref().err(), streamer.finished().await)?),
            None => images_size(&opts.images_dir).await?,
        };
        let wall = ran?;
        if sizes.ghosts > opts.ghost_total_limit {
            return Err(CriuError::GhostsTooLarge { bytes: sizes.ghosts, limit: opts.ghost_total_limit });
        }
        Ok(DumpStats { wall, image_bytes: sizes.total })
    }
}

/// What a streamed dump kept, or why it failed: an image not kept or ghost files over their
/// limit cut CRIU short (which then only reports a broken pipe), so they say why; otherwise
/// CRIU's own failure (`criu_failed`) does, ahead of the streamer's.
fn streamed(
    criu_failed: Option<&CriuError>,
    captured: std::result::Result<Vec<(String, u64)>, CaptureError>,
) -> Result<Vec<(String, u64)>> {
    match captured {
        Ok(captured) => Ok(captured),
        Err(CaptureError::GhostsOverLimit { taken, limit }) => Err(CriuError::GhostsTooLarge { bytes: taken, limit }),
        Err(e @ CaptureError::NotKept { .. }) => Err(e.into()),
        Err(e) if criu_failed.is_none() => Err(e.into()),
        Err(_) => Ok(Vec::new()),
    }
}

/// The arguments of `criu dump`, each with the reason it is there.
pub(crate) fn dump_args(opts: &DumpOptions) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["dump".into()];
    flag(&mut args, "--tree", opts.pid.to_string());
    flag(&mut args, "--images-dir", &opts.images_dir);
    flag(&mut args, "--log-file", DUMP_LOG);
    args.push("-v4".into()); // full detail: the log is what explains a failure
    common_args(&mut args, opts.tcp_established);
    // These hosts have no iptables; CRIU's nftables support is built in. The sandbox's network
    // namespace only has lo, but locking keeps TCP state still while the tree is frozen.
    flag(&mut args, "--network-lock", "nftables");
    // The sandbox's only host mounts are binds of single host files or directories
    // (space-sandbox-init): the directory of the agent's socket (`<run dir>/<id>.d`) and pid 1's
    // executable get names the restore maps to new host paths; the device nodes and the
    // /dev/null masks over /proc files are found automatically and bound from the same host
    // paths again.
    flag(&mut args, "--external", format!("mnt[{AGENT_DIR}]:{AGENT_KEY}"));
    flag(&mut args, "--external", format!("mnt[{SELF_EXE}]:{SPACED_KEY}"));
    flag(&mut args, "--external", "mnt[]");
    // Files that are open but deleted (temporary files, O_TMPFILE) are copied into the image
    // ("ghost files"). Not --link-remap: that links them into the live root, and CRIU removes
    // the links again before the root is snapshotted after a dump that leaves the tree alive.
    flag(&mut args, "--ghost-limit", GHOST_LIMIT);
    if opts.leave_running {
        args.push("--leave-running".into());
    }
    if opts.store.is_some() {
        args.push("--stream".into());
    }
    if let Some(cgroup) = &opts.freeze_cgroup {
        flag(&mut args, "--freeze-cgroup", cgroup);
    }
    // Only hierarchies that are recorded are mounted again at restore: mounting the (here
    // empty) cgroup2 hierarchy alone took ~12 ms of every restore.
    for controller in &opts.cgroup_controllers {
        flag(&mut args, "--cgroup-dump-controller", controller);
    }
    args
}

/// Flags dump and restore share.
pub(crate) fn common_args(args: &mut Vec<OsString>, tcp_established: bool) {
    if tcp_established {
        args.push("--tcp-established".into());
        // A connection still in a listener's accept queue cannot be dumped: let its client
        // retry rather than failing the snapshot.
        args.push("--skip-in-flight".into());
    }
    // Sandbox processes may hold flock/POSIX locks.
    args.push("--file-locks".into());
    // The sandbox's cgroups are recorded (with their limits) and re-created on restore under
    // the roots given there.
    // (Its argument is optional, so it must be attached with `=`.)
    args.push("--manage-cgroups=soft".into());
}

/// The bytes of a dump's image files, and of its ghost files among them.
#[derive(Debug, Default, PartialEq, Eq)]
struct ImageSizes {
    total: u64,
    ghosts: u64,
}

impl ImageSizes {
    /// The sizes of the images named, with their lengths.
    fn of(images: &[(String, u64)]) -> ImageSizes {
        let mut sizes = ImageSizes::default();
        for (name, len) in images {
            sizes.total += len;
            if name.starts_with(GHOST_IMAGE_PREFIX) {
                sizes.ghosts += len;
            }
        }
        sizes
    }
}

async fn images_size(dir: &Path) -> Result<ImageSizes> {
    let mut images = Vec::new();
    let mut entries = tokio::fs::read_dir(dir).await.map_err(io_err("read images dir", dir))?;
    while let Some(entry) = entries.next_entry().await.map_err(io_err("read images dir", dir))? {
        let name = entry.file_name().to_string_lossy().into_owned();
        match entry.metadata().await {
            Ok(meta) if meta.is_file() && !name.ends_with(".log") => images.push((name, meta.len())),
            _ => {}
        }
    }
    Ok(ImageSizes::of(&images))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nowhere;

    impl ImageStore for Nowhere {
        fn put(&self, _: &str, _: &mut dyn std::io::Read) -> std::io::Result<u64> {
            Ok(0)
        }
    }

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[tokio::test]
    async fn ghost_files_are_added_up_apart() {
        let dir = tempfile::tempdir().unwrap();
        for (name, len) in
            [("pages-1.img", 4096), ("ghost-file-1.img", 100), ("ghost-file-2a.img", 50), ("dump.log", 9)]
        {
            std::fs::write(dir.path().join(name), vec![0u8; len]).unwrap();
        }
        assert_eq!(images_size(dir.path()).await.unwrap(), ImageSizes { total: 4246, ghosts: 150 });
    }

    #[test]
    fn dump_arguments() {
        let mut opts = DumpOptions::new(42, "/snap/criu");
        let args = strings(&dump_args(&opts));
        let joined = args.join(" ");
        assert!(joined.starts_with("dump --tree 42 --images-dir /snap/criu --log-file dump.log -v4"), "{joined}");
        for expected in [
            "--tcp-established",
            "--skip-in-flight",
            "--file-locks",
            "--ghost-limit 512M",
            "--manage-cgroups=soft",
            "--network-lock nftables",
            "--external mnt[/dev/.spaced-agent]:space-agent",
            "--external mnt[/dev/.spaced]:space-spaced",
            "--external mnt[]",
        ] {
            assert!(joined.contains(expected), "{expected} missing in {joined}");
        }
        assert!(!joined.contains("--leave-running") && !joined.contains("--cgroup-dump-controller"));
        opts.leave_running = true;
        opts.tcp_established = false;
        opts.cgroup_controllers = vec!["cpu".into(), "memory".into()];
        let joined = strings(&dump_args(&opts)).join(" ");
        assert!(joined.contains("--leave-running") && !joined.contains("--tcp-established"));
        assert!(!joined.contains("--stream"));
        opts.store = Some(Arc::new(Nowhere));
        assert!(strings(&dump_args(&opts)).contains(&"--stream".to_owned()), "a dump into a store is streamed");
        assert!(joined.contains("--cgroup-dump-controller cpu --cgroup-dump-controller memory"), "{joined}");
    }
}
