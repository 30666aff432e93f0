//! Files read a piece at a time into memory that is used again, and hashed on a thread of
//! their own. A fresh buffer for each piece made every read of a memory image fault in and
//! zero each of its pages and hand them back to the kernel after: more of an export's or an
//! import's time than its hashing. Pieces go back to [`IDLE`] once every holder has dropped
//! them (an upload holds them until they are written), at most [`KEPT`] of them, which is
//! what a node keeps between transfers.

use std::io::Read;
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::BlobRef;

/// Bytes per piece.
pub(crate) const PIECE: usize = 1 << 20;
/// How many idle pieces are kept for the next read: about as many as an upload has in flight
/// (two parts being written and one being filled, of `CHUNK` bytes each, and the pieces
/// queued to it).
const KEPT: usize = 4 * crate::CHUNK / PIECE;

/// What a read that went past its limit reports as its hash: the rest is not read, as the
/// object is corrupt whatever it holds.
pub(crate) const NOT_READ_TO_THE_END: &str = "(not read to the end)";

static IDLE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A poisoned list is as good as any: buffers are pushed and popped whole.
fn idle() -> MutexGuard<'static, Vec<Vec<u8>>> {
    IDLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A piece's memory; back among the idle ones when the last `Bytes` of it is dropped.
struct Piece {
    buf: Vec<u8>,
    len: usize,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        let mut idle = idle();
        if idle.len() < KEPT {
            idle.push(std::mem::take(&mut self.buf));
        }
    }
}

/// The next piece of `source` (up to [`PIECE`] bytes); `None` at its end.
fn next_piece(source: &mut impl Read) -> std::io::Result<Option<Bytes>> {
    // Not allocated under the lock, which every dropped piece takes.
    let reused = idle().pop();
    let buf = reused.unwrap_or_else(|| vec![0; PIECE]);
    let mut piece = Piece { buf, len: 0 };
    piece.len = crate::read_up_to(source, &mut piece.buf)?;
    Ok((piece.len > 0).then(|| Bytes::from_owner(piece)))
}

/// Reads `source` to its end a piece at a time, handing each to `each` while a thread of its
/// own hashes them; what it read. Past `limit` bytes it stops, and the hash says
/// [`NOT_READ_TO_THE_END`]. The first error of `each` ends the read.
pub(crate) fn read_hashed(
    source: &mut impl Read,
    limit: u64,
    mut each: impl FnMut(&Bytes) -> std::io::Result<()>,
) -> std::io::Result<BlobRef> {
    std::thread::scope(|scope| {
        let (pieces, to_hash) = std::sync::mpsc::sync_channel::<Bytes>(2);
        let hashing = scope.spawn(move || {
            let mut hasher = Sha256::new();
            to_hash.iter().for_each(|piece| hasher.update(&piece));
            hex::encode(hasher.finalize())
        });
        let mut size = 0u64;
        while let Some(piece) = next_piece(source)? {
            size += piece.len() as u64;
            if size > limit {
                return Ok(BlobRef { sha256: NOT_READ_TO_THE_END.into(), size });
            }
            // Fails only if the hashing thread panicked, which its join reports.
            let _ = pieces.send(piece.clone());
            each(&piece)?;
        }
        drop(pieces);
        let sha256 = hashing.join().map_err(|_| std::io::Error::other("hashing panicked"))?;
        Ok(BlobRef { sha256, size })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256(data: &[u8]) -> String {
        hex::encode(Sha256::digest(data))
    }

    #[test]
    fn a_read_hands_over_every_byte_in_order_and_hashes_them() {
        let data: Vec<u8> = (0..PIECE * 3 + 17).map(|i| (i % 251) as u8).collect();
        let mut seen = Vec::new();
        let read = read_hashed(&mut data.as_slice(), u64::MAX, |piece| {
            seen.extend_from_slice(piece);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, data);
        assert_eq!(read, BlobRef { sha256: sha256(&data), size: data.len() as u64 });
    }

    #[test]
    fn a_piece_used_again_holds_only_what_was_read_into_it() {
        let data = vec![7u8; PIECE * 2];
        read_hashed(&mut data.as_slice(), u64::MAX, |_| Ok(())).unwrap();
        let short = b"short".to_vec();
        let mut seen = Vec::new();
        let read = read_hashed(&mut short.as_slice(), u64::MAX, |piece| {
            seen.extend_from_slice(piece);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, short);
        assert_eq!(read.sha256, sha256(&short));
    }

    #[test]
    fn a_read_past_its_limit_stops_and_hands_nothing_of_the_piece_that_crossed_it() {
        let data = vec![1u8; PIECE * 2 + 5];
        let mut handed = 0;
        let read = read_hashed(&mut data.as_slice(), PIECE as u64 + 10, |piece| {
            handed += piece.len();
            Ok(())
        })
        .unwrap();
        assert_eq!(read.sha256, NOT_READ_TO_THE_END);
        assert_eq!(read.size, 2 * PIECE as u64);
        assert_eq!(handed, PIECE, "only the piece within the limit is handed over");
    }

    #[test]
    fn pieces_still_held_are_not_read_into_again() {
        // As an upload keeps the pieces of the parts it has not written yet.
        let first: Vec<u8> = (0..PIECE * 3).map(|i| (i % 253) as u8).collect();
        let mut held = Vec::new();
        read_hashed(&mut first.as_slice(), u64::MAX, |piece| {
            held.push(piece.clone());
            Ok(())
        })
        .unwrap();
        let other = vec![0xee; PIECE * 3];
        read_hashed(&mut other.as_slice(), u64::MAX, |_| Ok(())).unwrap();
        assert_eq!(held.concat(), first);
    }

    #[test]
    fn an_error_handing_a_piece_over_ends_the_read() {
        let data = vec![1u8; PIECE * 2];
        let failed = read_hashed(&mut data.as_slice(), u64::MAX, |_| Err(std::io::Error::other("full"))).unwrap_err();
        assert_eq!(failed.to_string(), "full");
    }
}
