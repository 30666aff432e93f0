//! What a restore hands QEMU to load: the state file itself, or, for a state sealed with its
//! snapshot's key, a pipe a thread of the node opens the sealed file into as QEMU reads
//! (`migrate-incoming fd:` reads a stream). So a sealed state is never a file in clear, and
//! the node holds no second copy of it.

use std::fs::File;
use std::io::Write;
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
    /// The node's read end of the pipe (QEMU is given its own), and the opener's result.
    Opening {
        pipe: OwnedFd,
        opened: oneshot::Receiver<Result<(), VmError>>,
    },
}

impl StateInput {
    /// The state of the checkpoint in `dir`, whose record is `record`; `sealed` with that key.
    pub(crate) fn open(dir: &Path, record: &StateRecord, sealed: Option<&SnapshotKey>) -> Result<StateInput, VmError> {
        let path = dir.join(STATE_FILE);
        let file = File::open(&path).map_err(VmError::io("open", &path))?;
        let found = file.metadata().map_err(VmError::io("stat", &path))?.len();
        let Some(key) = sealed else {
            if found != record.state_bytes {
                return Err(VmError::StateTruncated { path, recorded: record.state_bytes, found });
            }
            return Ok(StateInput::File(file));
        };
        // The record opened with the key, so a length that disagrees is the state's damage,
        // found before QEMU loads any of it.
        if space_keys::stream::plaintext_len(found) != Some(record.state_bytes) {
            return Err(VmError::StateSealed { source: KeyError::Corrupt { owner: path.display().to_string() }, path });
        }
        let (pipe, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| VmError::io("make a pipe for", &path)(e.into()))?;
        let _ = nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        let (done, opened) = oneshot::channel();
        let key = key.clone();
        std::thread::Builder::new()
            .name("space-vm-state".into())
            .spawn(move || {
                // The write end closes when this returns: QEMU then reads the end of the stream.
                let _ = done.send(open_into(&key, &path, PipeEnd { file: File::from(write_end), broken: None }));
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

    /// After a load that failed: why, if the state did not open (not QEMU's view of a stream
    /// that ended early). Waits at most `grace` for the opener, which closes the stream when
    /// it fails, so it has ended by the time QEMU's load fails for that.
    pub(crate) async fn failure(self, grace: Duration) -> Option<VmError> {
        let StateInput::Opening { pipe, opened } = self else { return None };
        drop(pipe); // so that an opener writing into a pipe QEMU left is not kept waiting
        let failed = tokio::time::timeout(grace, opened).await.ok()?.ok()?.err()?;
        // QEMU stopped reading for a reason of its own: that reason is the one.
        (!matches!(failed, VmError::StateUnread(_))).then_some(failed)
    }

    /// After a load that completed: the opener's result (QEMU read the whole stream, so the
    /// opener ends within `grace`).
    pub(crate) async fn finish(self, grace: Duration) -> Result<(), VmError> {
        let StateInput::Opening { pipe, opened } = self else { return Ok(()) };
        drop(pipe);
        match tokio::time::timeout(grace, opened).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(VmError::StateOpener("its thread ended without a result")),
            Err(_) => Err(VmError::StateOpener("its thread did not end once QEMU had loaded the state")),
        }
    }
}

/// The write end of the pipe, which remembers a failed write: QEMU stopped reading.
struct PipeEnd {
    file: File,
    broken: Option<std::io::Error>,
}

impl Write for PipeEnd {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf).inspect_err(|e| {
            // `write_all` tries an interrupted write again.
            if e.kind() != std::io::ErrorKind::Interrupted {
                self.broken = Some(std::io::Error::new(e.kind(), e.to_string()));
            }
        })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Opens the sealed `path` into the pipe.
fn open_into(key: &SnapshotKey, path: &Path, mut pipe: PipeEnd) -> Result<(), VmError> {
    let opened = space_keys::stream::decrypt_to(key.bytes(), path, &mut pipe, Path::new("QEMU's state pipe"));
    match (opened, pipe.broken) {
        (Ok(_), _) => Ok(()),
        (Err(_), Some(broken)) => Err(VmError::StateUnread(broken)),
        (Err(source), None) => Err(VmError::StateSealed { path: PathBuf::from(path), source }),
    }
}
