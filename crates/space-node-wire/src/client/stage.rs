//! Sending a file to a node for its template work (see the server's `stage` module).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use super::NodeClient;
use crate::WireError;
use crate::ops::{StageAnswer, StageCall, paths};

/// Longest answer line a node may send about a staged file.
const MAX_ANSWER_LINE: u64 = 64 << 10;

impl NodeClient {
    /// Sends `file` to the node; where the node keeps it. The node's copy is checked against
    /// the bytes sent ([`WireError::StagedCopyDiffers`]).
    pub async fn stage(&self, file: &Path) -> Result<PathBuf, WireError> {
        let mut source = tokio::fs::File::open(file).await.map_err(WireError::file(file))?;
        let len = source.metadata().await.map_err(WireError::file(file))?.len();
        let mut io = self.upgrade(paths::STAGE, &StageCall { len }).await?;
        let sending = |source| WireError::Send { address: self.address().to_owned(), source };
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
            io.write_all(&buffer[..read]).await.map_err(sending)?;
            left -= read as u64;
        }
        io.flush().await.map_err(sending)?;
        let mut line = String::new();
        let mut answer = tokio::io::BufReader::new(io).take(MAX_ANSWER_LINE);
        answer.read_line(&mut line).await.map_err(sending)?;
        match serde_json::from_str::<StageAnswer>(&line)? {
            StageAnswer::Staged { path, sha256 } if sha256 == hex::encode(hasher.finalize()) => Ok(path),
            StageAnswer::Staged { path, .. } => Err(WireError::StagedCopyDiffers { path }),
            StageAnswer::Failed { message } => Err(WireError::StageFailed { message }),
        }
    }
}
