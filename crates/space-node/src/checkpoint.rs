//! Full snapshots (root + every process, with CRIU) and sandboxes restored from them.
//!
//! A full snapshot: the node closes its connection to the sandbox's `spaced` (a connection to
//! the host cannot be checkpointed; it blocks reconnects meanwhile), freezes the sandbox,
//! checkpoints the process tree (which stays frozen), snapshots the root while still frozen
//! (so files and memory show the same instant), links the `spaced` binary the sandbox runs
//! (the pool's copy, see [`Node::open`]) into it, and thaws.
//! Agent streams open at that moment (attached execs, watches) end; the processes keep
//! running and can be attached to again.
//!
//! Given the snapshot's data key, the process images never reach the node's disk in clear:
//! CRIU streams them through the linux runtime, which seals them into the pool as they come;
//! a VM's state is written to memory only and sealed into the pool after the thaw. A restore
//! unseals CRIU's images into memory (in_memory.rs); a VM's state is opened by its runtime
//! into a pipe QEMU loads it from. Without a key (a caller that predates sealing) they are
//! written to the pool in clear.

use std::time::Duration;

use space_api::RuntimeKind;
use space_api::durable::SnapshotKey;
use space_api::{SandboxId, SessionId, SnapshotId};
use space_metrics::CheckpointStep;
use space_node_api::DiskQuota;
use space_runtime::{CheckpointArtifacts, Limits, SandboxHandle, SandboxSpec, SealedImages};

use crate::in_memory::InMemory;
use crate::{Node, NodeError, Result, blocking, poisoned};

/// How long the sandbox's agent gets to close its ends of the node's connections.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// While alive, [`Node::agent`] waits instead of reconnecting to the sandbox.
pub(crate) struct ConnectGate {
    _open_when_dropped: tokio::sync::watch::Sender<()>,
}

impl Node {
    /// The checkpoint tool `runtime` uses, or why its sandboxes cannot take full snapshots.
    pub fn checkpoint_support(&self, runtime: RuntimeKind) -> std::result::Result<String, String> {
        self.runtimes.get(runtime).map_err(|e| e.to_string())?.checkpoint_support()
    }

    /// Takes a full snapshot of a running (or, `already_paused`, paused) sandbox; it is left
    /// as it was found. Returns its size (root and images). With `key`, the images are sealed
    /// with it. On failure the snapshot directory may hold a partial snapshot: the caller
    /// deletes it.
    pub async fn snapshot_full(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        already_paused: bool,
        key: Option<&SnapshotKey>,
    ) -> Result<u64> {
        let runtime = self.runtimes.of(sandbox)?;
        runtime.checkpoint_support().map_err(space_runtime::RuntimeError::CheckpointUnavailable)?;
        let kept = self.kept_spaced.clone();
        let plain = key.map(|_| self.in_memory(snapshot.as_str())).transpose()?;
        if already_paused {
            // Its agent must run to let CRIU in and to let go of the connection.
            runtime.resume(sandbox).await?;
        }
        self.allow_checkpoint(sandbox).await;
        let gate = self.close_agent(sandbox)?;
        let artifacts = self.checkpoint_artifacts(runtime.kind(), session, snapshot, plain.as_ref(), key);
        let taken = self.checkpoint_frozen(sandbox, session, snapshot, &artifacts).await;
        // As found: a paused sandbox frozen again also when the checkpoint failed early.
        let restored_state = match already_paused {
            true => runtime.pause(sandbox).await,
            false => runtime.resume(sandbox).await,
        };
        drop(gate);
        if !already_paused {
            // Connecting is what makes pid 1 non-dumpable again (a paused sandbox runs nothing
            // until it is resumed, which connects).
            self.reconnect(sandbox).await;
        }
        let image_bytes = taken?;
        restored_state?;
        if let (CheckpointArtifacts::VmState { .. }, Some(key), Some(plain)) = (&artifacts, key, plain) {
            let (key, images) = (key.clone(), self.pool.snapshot_images_dir(session, snapshot));
            blocking(move || Ok(space_volume::sealed::seal_images(&key, plain.path(), &images)?)).await?;
        }
        let pool = self.pool.clone();
        let (ses, snap) = (session.clone(), snapshot.clone());
        blocking(move || Ok(pool.link_snapshot_binary(&ses, &snap, &kept)?)).await?;
        Ok(self.snapshot_disk_size(session, snapshot).await? + image_bytes)
    }

    /// Waits for the agent to let go, freezes, checkpoints into `artifacts` and snapshots the
    /// root; returns the images' size. Leaves the sandbox frozen.
    async fn checkpoint_frozen(
        &self,
        sandbox: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        artifacts: &CheckpointArtifacts,
    ) -> Result<u64> {
        let runtime = self.runtimes.of(sandbox)?;
        runtime.wait_agent_released(sandbox, RELEASE_TIMEOUT).await?;
        runtime.pause(sandbox).await?;
        let images = self.pool.snapshot_images_dir(session, snapshot);
        if let Some(dir) = images.parent() {
            std::fs::create_dir_all(dir).map_err(|e| NodeError::Internal(format!("create {}: {e}", dir.display())))?;
        }
        let stats = runtime
            .checkpoint(sandbox, artifacts)
            .await
            .inspect_err(|_| space_metrics::checkpoint_error(runtime.kind(), CheckpointStep::Dump))?;
        tracing::debug!(%sandbox, dump = ?stats.wall, image_bytes = stats.image_bytes, "checkpointed");
        let pool = self.pool.clone();
        let (sbx, ses, snap) = (sandbox.clone(), session.clone(), snapshot.clone());
        blocking(move || Ok(pool.snapshot_sandbox_root(&sbx, &ses, &snap)?)).await?;
        Ok(stats.image_bytes)
    }

    /// Starts sandbox `id` by restoring a full snapshot: its processes continue where they
    /// were, with the snapshot's hostname and files. Sealed images need the snapshot's `key`.
    #[allow(clippy::too_many_arguments)] // the node API's call, plus the key
    pub async fn restore_sandbox(
        &self,
        id: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        runtime: RuntimeKind,
        limits: Limits,
        disk: &DiskQuota,
        key: Option<&SnapshotKey>,
    ) -> Result<SandboxHandle> {
        let rt = self.runtimes.get(runtime)?;
        let began = std::time::Instant::now();
        // Side by side: CRIU's images are opened while the root is copied. Both run to their
        // end, and images that do not open leave no root behind (a VM's state opens as QEMU
        // reads it: the root of a restore that fails then goes with its sandbox, as after any
        // failed restore). The root is charged before a single process is restored: they
        // continue at once.
        let (opened, root) = tokio::join!(
            self.unseal(id, session, snapshot, runtime, key),
            self.root_from_snapshot(id, session, snapshot, rt.root_disk(), None, disk)
        );
        let (plain, streamed) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                if root.is_ok()
                    && let Err(left) = self.destroy_sandbox(id).await
                {
                    tracing::warn!(sandbox = %id, error = %left, "cannot remove the root of a restore that failed");
                }
                return Err(e);
            }
        };
        let root = match root {
            Ok(root) => root,
            Err(e) => {
                tokio::task::spawn_blocking(move || drop(plain));
                return Err(e);
            }
        };
        let spec = SandboxSpec { id: id.clone(), root, hostname: String::new(), limits };
        let artifacts = match self.checkpoint_artifacts(runtime, session, snapshot, plain.as_ref(), None) {
            CheckpointArtifacts::Criu { images, spaced, sealed } => {
                CheckpointArtifacts::Criu { images, spaced: self.restore_binary(spaced).await?, sealed }
            }
            CheckpointArtifacts::VmState { state, .. } => CheckpointArtifacts::VmState { state, sealed: streamed },
        };
        self.runtimes.record(id, runtime);
        let prepared = began.elapsed();
        let handle = rt
            .restore(&spec, &artifacts)
            .await
            .inspect_err(|_| space_metrics::checkpoint_error(runtime, CheckpointStep::Restore))?;
        let restored = began.elapsed();
        // Freeing the images' memory takes a few milliseconds the resumed sandbox need not wait.
        tokio::task::spawn_blocking(move || drop(plain));
        let agent = self.connect(id).await?;
        self.agents.lock().map_err(poisoned)?.insert(id.clone(), agent);
        let connected = began.elapsed();
        self.connect_to_gateway_or_destroy(&handle, true).await?;
        tracing::debug!(sandbox = %id, ?prepared, ?restored, ?connected, gateway = ?began.elapsed(),
            "restored; each part since the start");
        Ok(handle)
    }

    /// The `spaced` a restore binds at `/dev/.spaced`: the pool's kept copy that the snapshot's
    /// `link` is a hard link of, never the link itself. A bind mount holds the path it was made
    /// from; once the snapshot is deleted and its trash reclaimed that path is gone, and the
    /// restored sandbox's next checkpoint would fail (CRIU finds `/dev/.spaced` deleted and
    /// asks for a link remap). The node's own binary is known by its inode; another (an older
    /// build's snapshot) is found by its content.
    async fn restore_binary(&self, link: std::path::PathBuf) -> Result<std::path::PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let inode = |path: &std::path::Path| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
        if inode(&link).is_some() && inode(&link) == inode(&self.kept_spaced) {
            return Ok(self.kept_spaced.clone());
        }
        let pool = self.pool.clone();
        blocking(move || Ok(pool.keep_binary(&link)?)).await
    }

    /// The images of `snapshot` opened into memory if they are sealed (with `key`, which they
    /// then need), or, for a VM's state, which QEMU reads as a stream, that key for its
    /// runtime to open the state with as QEMU reads it; neither for images kept in clear.
    async fn unseal(
        &self,
        id: &SandboxId,
        session: &SessionId,
        snapshot: &SnapshotId,
        runtime: RuntimeKind,
        key: Option<&SnapshotKey>,
    ) -> Result<(Option<InMemory>, Option<SnapshotKey>)> {
        let images = self.pool.snapshot_images_dir(session, snapshot);
        let dir = images.clone();
        if !blocking(move || Ok(space_volume::sealed::images_sealed(&dir)?)).await? {
            return Ok((None, None));
        }
        let key = key.ok_or(space_volume::VolumeError::SealedWithoutKey)?.clone();
        if runtime == RuntimeKind::Vm {
            return Ok((None, Some(key)));
        }
        let plain = self.in_memory(id.as_str())?;
        let dst = plain.path().to_owned();
        let start = std::time::Instant::now();
        blocking(move || Ok(space_volume::sealed::unseal_images(&key, &images, &dst)?)).await?;
        tracing::debug!(sandbox = %id, opened = ?start.elapsed(), "images opened into memory");
        Ok((Some(plain), None))
    }

    /// `runtime`'s checkpoint of `snapshot`: in the pool, or in `plain` (a directory in
    /// memory), and with `key` (a checkpoint's) sealed as it is written (see the module docs).
    fn checkpoint_artifacts(
        &self,
        runtime: RuntimeKind,
        session: &SessionId,
        snapshot: &SnapshotId,
        plain: Option<&InMemory>,
        key: Option<&SnapshotKey>,
    ) -> CheckpointArtifacts {
        let pool_images = self.pool.snapshot_images_dir(session, snapshot);
        let images = plain.map_or_else(|| pool_images.clone(), |plain| plain.path().to_owned());
        match runtime {
            RuntimeKind::Linux => CheckpointArtifacts::Criu {
                images,
                spaced: self.pool.snapshot_binary(session, snapshot),
                sealed: plain.zip(key).map(|(_, key)| SealedImages { dir: pool_images, key: key.clone() }),
            },
            RuntimeKind::Vm => CheckpointArtifacts::VmState { state: images, sealed: None },
        }
    }

    /// Asks pid 1 to let CRIU in (see `Request::AllowCheckpoint`). A `spaced` too old to know
    /// the request is dumpable already; one that fails makes the dump fail, which loses
    /// nothing.
    async fn allow_checkpoint(&self, sandbox: &SandboxId) {
        let allowed = match self.agent(sandbox).await {
            Ok(agent) => agent.allow_checkpoint().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = allowed {
            tracing::warn!(%sandbox, error = %e, "cannot ask pid 1 to allow the checkpoint");
        }
    }

    /// Connects to the sandbox's agent again (best effort: the next call would anyway).
    pub async fn reconnect(&self, sandbox: &SandboxId) {
        if let Err(e) = self.agent(sandbox).await {
            tracing::warn!(%sandbox, error = %e, "cannot connect to the agent again");
        }
    }

    /// Whether a snapshot holds processes (was taken as a full snapshot).
    pub fn snapshot_is_full(&self, session: &SessionId, snapshot: &SnapshotId) -> bool {
        self.pool.snapshot_has_images(session, snapshot)
    }

    /// Closes every connection to the sandbox's agent and keeps new ones from being made
    /// until the returned gate is dropped.
    fn close_agent(&self, sandbox: &SandboxId) -> Result<ConnectGate> {
        let (tx, rx) = tokio::sync::watch::channel(());
        self.connect_gates.lock().map_err(poisoned)?.insert(sandbox.clone(), rx);
        if let Some(agent) = self.agents.lock().map_err(poisoned)?.remove(sandbox) {
            agent.close();
        }
        Ok(ConnectGate { _open_when_dropped: tx })
    }

    /// Waits while a full snapshot of the sandbox is being taken.
    pub(crate) async fn pass_connect_gate(&self, sandbox: &SandboxId) -> Result<()> {
        let gate = {
            let mut gates = self.connect_gates.lock().map_err(poisoned)?;
            match gates.get(sandbox) {
                // A dropped sender means the gate is open again.
                Some(rx) if rx.has_changed().is_err() => {
                    gates.remove(sandbox);
                    None
                }
                other => other.cloned(),
            }
        };
        if let Some(mut rx) = gate {
            // Returns once the sender is dropped.
            while rx.changed().await.is_ok() {}
        }
        Ok(())
    }
}
