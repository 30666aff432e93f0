//! Sending a file to a node for its template work (see the server's `stage` module).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};

use super::{NodeClient, Upgraded};
use crate::WireError;
use crate::ops::{Call, StageAnswer, StageCall, paths};

/// Longest answer line a node may send about a staged file.
const MAX_ANSWER_LINE: u64 = 64 << 10;
/// How long one write of the file, or the wait for the node's answer, may take: a node whose
/// host vanished without closing the connection does not hold the call for ever.
const IDLE: Duration = Duration::from_secs(60);
/// How long the node's own reason is waited for once a write failed.
const REASON_WAIT: Duration = Duration::from_secs(1);

impl NodeClient {
    /// Sends `file` to the node; where the node keeps it. The node answers the SHA-256 of
    /// what it received: a copy that differs from what was sent is removed there and is
    /// [`WireError::StagedCopyDiffers`].
    pub async fn stage(&self, file: &Path) -> Result<PathBuf, WireError> {
        let source = tokio::fs::File::open(file).await.map_err(WireError::file(file))?;
        let len = source.metadata().await.map_err(WireError::file(file))?.len();
        let io = self.upgrade(paths::STAGE, &StageCall { len }).await?;
        let (answer, sent) = self.while_answering(self.send(file, source, len, io)).await?;
        match answer {
            StageAnswer::Staged { path, sha256 } if sha256 == sent => Ok(path),
            StageAnswer::Staged { path, .. } => {
                let _ = self.post::<()>(paths::CALL, &Call::Unstage { path: path.clone() }).await;
                Err(WireError::StagedCopyDiffers { path })
            }
            StageAnswer::Failed { message } => Err(WireError::StageFailed { message }),
        }
    }

    /// Copies `len` bytes of `source` to `io` and reads the node's answer; with the SHA-256
    /// of what was sent.
    async fn send(
        &self,
        file: &Path,
        mut source: tokio::fs::File,
        len: u64,
        io: Upgraded,
    ) -> Result<(StageAnswer, String), WireError> {
        let sending = |source| WireError::Send { address: self.address().to_owned(), source };
        let timed_out = || sending(std::io::ErrorKind::TimedOut.into());
        let mut io = BufReader::new(io);
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 256 << 10];
        let mut left = len;
        while left > 0 {
            let want = buffer.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let read = source.read(&mut buffer[..want]).await.map_err(WireError::file(file))?;
            if read == 0 {
                let source =
                    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file shrank while it was sent");
                return Err(WireError::File { path: file.to_owned(), source });
            }
            hasher.update(&buffer[..read]);
            let written = tokio::time::timeout(IDLE, io.get_mut().write_all(&buffer[..read])).await;
            match written {
                Ok(Ok(())) => {}
                // The node may have said why it stopped reading (its disk filled, say).
                Ok(Err(e)) => {
                    return Err(match answer_within(&mut io, REASON_WAIT).await {
                        Some(Ok(Ok(StageAnswer::Failed { message }))) => WireError::StageFailed { message },
                        _ => sending(e),
                    });
                }
                Err(_) => return Err(timed_out()),
            }
            left -= read as u64;
        }
        tokio::time::timeout(IDLE, io.get_mut().flush()).await.map_err(|_| timed_out())?.map_err(sending)?;
        let answer = answer_within(&mut io, IDLE).await.ok_or_else(timed_out)?.map_err(sending)?;
        Ok((answer?, hex::encode(hasher.finalize())))
    }
}

/// The node's answer line, if one comes within `wait`.
async fn answer_within(
    io: &mut (impl AsyncRead + Unpin),
    wait: Duration,
) -> Option<std::io::Result<Result<StageAnswer, WireError>>> {
    let mut line = String::new();
    let mut limited = BufReader::new(io).take(MAX_ANSWER_LINE);
    match tokio::time::timeout(wait, limited.read_line(&mut line)).await {
        Ok(Ok(_)) => Some(Ok(serde_json::from_str::<StageAnswer>(&line).map_err(WireError::from))),
        Ok(Err(e)) => Some(Err(e)),
        Err(_) => None,
    }
}
