//! What a restore hands QEMU to load: the state file itself, or, for a state sealed with its
//! snapshot's key, a pipe a thread of the node opens the sealed file into as QEMU reads
//! (`migrate-incoming fd:` reads a stream). So a sealed state is never written anywhere in
//! clear, and opening it runs beside QEMU's start and its load instead of before them.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use space_keys::KeyError;
use space_runtime::SnapshotKey;
use tokio::sync::oneshot;

use crate::VmError;
use crate::checkpoint::{STATE_FILE, StateRecord};

/// A pipe this large lets the opener run ahead of QEMU while it starts (best effort: the
/// kernel's `pipe-max-size` may refuse it, and the default 64 KiB works too).
const PIPE_SIZE: i32 = 1 << 20;

/// The state a restore loads.
pub(crate) enum StateInput {
    File(File),
    /// The read end of the pipe, and the opener's result (the plaintext's length) once it ends.
    Opening {
        pipe: OwnedFd,
        opened: oneshot::Receiver<Result<u64, VmError>>,
    },
}

impl StateInput {
    /// The state of the checkpoint in `dir`, whose record is `record`; `sealed` with that key.
    pub(crate) fn open(dir: &Path, record: &StateRecord, sealed: Option<&SnapshotKey>) -> Result<StateInput, VmError> {
        let path = dir.join(STATE_FILE);
        let Some(key) = sealed else {
            let file = File::open(&path).map_err(VmError::io("open", &path))?;
            let found = file.metadata().map_err(VmError::io("stat", &path))?.len();
            if found != record.state_bytes {
                return Err(VmError::StateTruncated { path, recorded: record.state_bytes, found });
            }
            return Ok(StateInput::File(file));
        };
        let (pipe, write_end) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| VmError::io("pipe", &path)(e.into()))?;
        let _ = nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        let (done, opened) = oneshot::channel();
        let (key, recorded) = (key.clone(), record.state_bytes);
        std::thread::Builder::new()
            .name("space-vm-state".into())
            .spawn(move || {
                // The write end closes when this returns: QEMU then reads the end of the stream.
                let _ = done.send(open_into(&key, &path, File::from(write_end), recorded));
            })
            .map_err(VmError::io("spawn a thread to open", dir.join(STATE_FILE)))?;
        Ok(StateInput::Opening { pipe, opened })
    }

    /// The descriptor QEMU is given.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            StateInput::File(file) => file.as_fd(),
            StateInput::Opening { pipe, .. } => pipe.as_fd(),
        }
    }

    /// After a load that failed: why, if the opener failed (a state that does not open, not
    /// QEMU's view of a stream that ended early). Waits at most `grace` for the opener, which
    /// stops when it fails and closes the stream, so QEMU has seen that end by then.
    pub(crate) async fn failure(self, grace: Duration) -> Option<VmError> {
        let StateInput::Opening { opened, .. } = self else { return None };
        // Not a write that failed because QEMU had stopped reading: QEMU's reason is the one.
        tokio::time::timeout(grace, opened).await.ok()?.ok()?.err().filter(|e| {
            matches!(e, VmError::StateSealed { source: KeyError::Corrupt { .. }, .. } | VmError::StateTruncated { .. })
        })
    }

    /// After a load that completed: the opener's error if it failed after all (QEMU read a
    /// whole state, so it has ended by now or ends within `grace`).
    pub(crate) async fn finish(self, grace: Duration) -> Result<(), VmError> {
        let StateInput::Opening { opened, .. } = self else { return Ok(()) };
        match tokio::time::timeout(grace, opened).await {
            Ok(Ok(result)) => result.map(drop),
            Ok(Err(_)) => Err(VmError::StateSealed {
                path: PathBuf::from(STATE_FILE),
                source: KeyError::Crypto("the thread opening it ended without a result".into()),
            }),
            Err(_) => Err(VmError::MigrationTimeout { bound: grace }),
        }
    }
}

/// Opens the sealed `path` into `pipe`; the plaintext must be `recorded` bytes long.
fn open_into(key: &SnapshotKey, path: &Path, mut pipe: File, recorded: u64) -> Result<u64, VmError> {
    let sealed = |source| VmError::StateSealed { path: PathBuf::from(path), source };
    let found =
        space_keys::stream::decrypt_to(key.bytes(), path, &mut pipe, Path::new("QEMU's state pipe")).map_err(sealed)?;
    if found != recorded {
        return Err(VmError::StateTruncated { path: path.to_owned(), recorded, found });
    }
    Ok(found)
}

impl StateRecord {
    /// The record of the checkpoint in `dir`, sealed with `key` if given.
    pub(crate) fn read_maybe_sealed(dir: &Path, sealed: Option<&SnapshotKey>) -> Result<StateRecord, VmError> {
        let Some(key) = sealed else { return StateRecord::read(dir) };
        let path = dir.join(crate::checkpoint::STATE_RECORD);
        let mut text = Vec::new();
        space_keys::stream::decrypt_to(key.bytes(), &path, &mut text, Path::new("memory"))
            .map_err(|source| VmError::StateSealed { path: path.clone(), source })?;
        StateRecord::parse(&path, &text)
    }
}
