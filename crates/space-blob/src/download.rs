//! An object's bytes into a file, hashed on the way, in large pieces. `object_store` hands a
//! local object back as its open file and streams it 8 KiB at a time, each piece a trip to
//! the blocking pool (and tokio's file writes are another each): for a memory image of
//! hundreds of megabytes that was most of an import. A local object is copied in one
//! blocking task instead, and a remote stream is written through a large buffer.

use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::pieces::{self, NOT_READ_TO_THE_END};
use crate::{BlobError, BlobRef, CHUNK, Result, io};

/// Makes the file a download goes to anew, readable by its owner only, so it gets that mode
/// whatever a stale one had.
pub(crate) async fn create(partial: &Path) -> Result<std::fs::File> {
    match tokio::fs::remove_file(partial).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(partial)(e)),
        _ => {}
    }
    let path = partial.to_owned();
    let opened = tokio::task::spawn_blocking(move || {
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)
    })
    .await
    .map_err(|e| io(partial)(std::io::Error::other(e)))?;
    opened.map_err(io(partial))
}

/// Copies `range` of the local object's `source` into `dest`, hashing it (and with `sync`,
/// syncing it); reads no further than one byte past `expected` bytes.
pub(crate) async fn copy_file(
    mut source: std::fs::File,
    range: Range<u64>,
    mut dest: std::fs::File,
    expected: u64,
    partial: &Path,
    sync: bool,
) -> Result<BlobRef> {
    let path = partial.to_owned();
    let copied = tokio::task::spawn_blocking(move || -> std::io::Result<BlobRef> {
        source.seek(SeekFrom::Start(range.start))?;
        let len = range.end.saturating_sub(range.start).min(expected + 1);
        let mut written = 0u64;
        let copied = pieces::read_hashed(&mut source.take(len), expected, |piece| {
            dest.write_all(piece)?;
            if sync {
                start_writeback(&dest, written, piece.len());
            }
            written += piece.len() as u64;
            Ok(())
        })?;
        // One of another size is corrupt, and removed: not worth a sync.
        if sync && copied.size == expected {
            dest.sync_all()?;
        }
        Ok(copied)
    })
    .await
    .map_err(|e| io(&path)(std::io::Error::other(e)))?;
    copied.map_err(io(partial))
}

/// Starts the disk writes of `len` bytes of `file` at `offset`, just written, without waiting
/// for them: the device writes while the copy goes on, and the sync at the end waits for the
/// last pieces only instead of the whole file. Best effort: a refusal leaves it to the sync.
fn start_writeback(file: &std::fs::File, offset: u64, len: usize) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else { return };
    // SAFETY: sync_file_range only reads its integer arguments; `file` stays open throughout.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
}

/// Writes `stream` into `dest` through a buffer of [`CHUNK`] bytes, hashing it (and with
/// `sync`, syncing it); stops at the first piece past `expected` bytes.
pub(crate) async fn copy_stream(
    mut stream: BoxStream<'static, object_store::Result<Bytes>>,
    dest: std::fs::File,
    expected: u64,
    partial: &Path,
    sync: bool,
) -> Result<BlobRef> {
    let mut file = tokio::io::BufWriter::with_capacity(CHUNK, tokio::fs::File::from_std(dest));
    let (mut hasher, mut size) = (Sha256::new(), 0u64);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BlobError::from)?;
        size += chunk.len() as u64;
        if size > expected {
            return Ok(BlobRef { sha256: NOT_READ_TO_THE_END.into(), size });
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(io(partial))?;
    }
    file.flush().await.map_err(io(partial))?;
    if sync {
        file.get_ref().sync_all().await.map_err(io(partial))?;
    }
    Ok(BlobRef { sha256: hex::encode(hasher.finalize()), size })
}
