//! Files encrypted in authenticated chunks, so that one of any size is encrypted as it streams
//! and checked chunk by chunk, never held in memory (snapshot streams and process images on
//! their way to the blob store, and process images at rest on their node).
//!
//! Layout: `MAGIC (8) | version (1) | salt (32) | chunk 0 | chunk 1 | … | chunk n`. Each chunk
//! is [`CHUNK`] bytes of plaintext (the last one fewer, possibly none) sealed with AES-256-GCM
//! under a key derived from the data key and the file's random salt (HKDF-SHA-256), with the
//! nonce `chunk index (u64 BE) | 0 0 0 | last (0 or 1)` and the header as associated data (the
//! STREAM construction, as age and Tink use). A chunk moved, repeated, dropped, altered, or a
//! file cut at a chunk boundary fails to open, and so does the same file under another key.

mod open;
mod writer;

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce};
use aws_lc_rs::hkdf;

use writer::Writer;

use crate::{KEY_LEN, KeyError, Result, TAG_LEN, aead_key, random};

/// The first bytes of an encrypted file.
pub const MAGIC: &[u8; 8] = b"spacekv1";
const VERSION: u8 = 1;
const SALT_LEN: usize = 32;
/// The header's length: the magic, the version and the salt.
pub const HEADER_LEN: usize = MAGIC.len() + 1 + SALT_LEN;
/// Plaintext bytes per chunk.
pub const CHUNK: usize = 1 << 20;
const INFO: &[u8] = b"space-keys/stream/v1";

fn subkey(data_key: &[u8], salt: &[u8]) -> Result<LessSafeKey> {
    if data_key.len() != KEY_LEN {
        return Err(KeyError::Crypto(format!("a stream key is {KEY_LEN} bytes, not {}", data_key.len())));
    }
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(data_key);
    let mut key = zeroize::Zeroizing::new([0u8; KEY_LEN]);
    prk.expand(&[INFO], hkdf::HKDF_SHA256)
        .and_then(|okm| okm.fill(&mut key[..]))
        .map_err(|_| KeyError::Crypto("deriving the stream key failed".into()))?;
    aead_key(&key[..])
}

fn nonce(index: u64, last: bool) -> Nonce {
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&index.to_be_bytes());
    bytes[11] = u8::from(last);
    Nonce::assume_unique_for_key(bytes)
}

/// Reads until `buf` is full or the input ends; how many bytes were read.
fn fill(input: &mut (impl Read + ?Sized), buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn io(path: &Path, what: &str, e: std::io::Error) -> KeyError {
    KeyError::Crypto(format!("{what} {}: {e}", path.display()))
}

/// Encrypts `src` into `dst` (created or truncated) under `data_key`. Not synced: `dst` is
/// a file on its way elsewhere (the blob store syncs its own copy), or one whose copy in the
/// pool the filesystem commits.
pub fn encrypt_file(data_key: &[u8], src: &Path, dst: &Path) -> Result<()> {
    let mut input = File::open(src).map_err(|e| io(src, "opening", e))?;
    let output = File::create(dst).map_err(|e| io(dst, "creating", e))?;
    seal_into(data_key, &mut input, src, output, dst).map(drop)
}

/// Encrypts what `input` (named `src` in errors) holds up to its end into `output` (named
/// `dst`), which must be empty; the plaintext's length. `input` may be a pipe: it is read
/// once, in order.
pub fn seal_into(data_key: &[u8], input: &mut dyn Read, src: &Path, output: File, dst: &Path) -> Result<u64> {
    let mut output = output;
    let salt = random::<SALT_LEN>()?;
    let mut header = MAGIC.to_vec();
    header.push(VERSION);
    header.extend_from_slice(&salt);
    output.write_all(&header).map_err(|e| io(dst, "writing", e))?;
    let key = subkey(data_key, &salt)?;
    let writer = Writer::start(output, CHUNK + TAG_LEN).map_err(|e| io(dst, "writing", e))?;
    let sealed = seal_chunks(&key, &header, input, &writer, src);
    let written = writer.finish().map_err(|e| io(dst, "writing", e));
    let len = sealed?;
    written.map(|_| len)
}

/// Seals `input` chunk by chunk and hands the chunks to `writer`; the plaintext's length.
fn seal_chunks(key: &LessSafeKey, header: &[u8], input: &mut dyn Read, writer: &Writer, src: &Path) -> Result<u64> {
    let mut total = 0;
    each_chunk(input, CHUNK, writer, src, |chunk, index, last| {
        total += chunk.len() as u64;
        let tag = key
            .seal_in_place_separate_tag(nonce(index, last), Aad::from(header), chunk)
            .map_err(|_| KeyError::Crypto("encryption failed".into()))?;
        chunk.extend_from_slice(tag.as_ref());
        Ok(())
    })?;
    Ok(total)
}

/// Reads `input` in pieces of `piece` bytes into buffers of `writer`, one piece read ahead
/// so that the last one is known (a piece is the last if the one after it is empty), lets
/// `each` turn each piece (with its index and whether it is the last) into what is written,
/// and hands it over. Stops early (`Ok`) if the writer fails, which [`Writer::finish`] then
/// reports.
fn each_chunk(
    input: &mut dyn Read,
    piece: usize,
    writer: &Writer,
    src: &Path,
    mut each: impl FnMut(&mut Vec<u8>, u64, bool) -> Result<()>,
) -> Result<()> {
    let mut read = |buffer: &mut Vec<u8>| {
        // Into the buffer's spare room, which is not zeroed first: most images are small.
        Read::take(&mut *input, piece as u64).read_to_end(buffer).map_err(|e| io(src, "reading", e))
    };
    let Some(mut current) = writer.buffer() else { return Ok(()) };
    let mut len = read(&mut current)?;
    let mut index = 0u64;
    loop {
        let mut next = None;
        if len == piece {
            let Some(mut buffer) = writer.buffer() else { return Ok(()) };
            let more = read(&mut buffer)?;
            next = Some((buffer, more)).filter(|(_, more)| *more > 0);
        }
        each(&mut current, index, next.is_none())?;
        if !writer.write(current) {
            return Ok(());
        }
        let Some((buffer, more)) = next else { return Ok(()) };
        (current, len) = (buffer, more);
        index += 1;
    }
}

/// Whether `head` begins as [`encrypt_file`] begins what it writes: its magic and version.
fn begins_sealed(head: &[u8]) -> bool {
    head.len() > MAGIC.len() && &head[..MAGIC.len()] == MAGIC && head[MAGIC.len()] == VERSION
}

/// Whether `path` begins as [`encrypt_file`] begins what it writes (its magic and version).
/// Says nothing of whether it opens: [`decrypt_file`] checks that.
pub fn is_sealed(path: &Path) -> std::io::Result<bool> {
    let mut head = [0u8; MAGIC.len() + 1];
    let read = fill(&mut File::open(path)?, &mut head)?;
    Ok(begins_sealed(&head[..read]))
}

/// Decrypts `src` (written by [`encrypt_file`]) into `dst` (created or truncated), synced
/// with `sync` (not for a scratch file). A file that does not open whole is
/// [`KeyError::Corrupt`], and what was written of `dst` is removed (a `dst` that was never
/// created is left alone).
pub fn decrypt_file(data_key: &[u8], src: &Path, dst: &Path, sync: bool) -> Result<()> {
    let input = File::open(src).map_err(|e| io(src, "opening", e))?;
    let mut created = false;
    let create = || {
        let file = File::create(dst).map_err(|e| io(dst, "creating", e))?;
        created = true;
        Ok(file)
    };
    let result = open::open_file(data_key, &input, src, create, dst).and_then(|file| match sync {
        true => file.sync_all().map_err(|e| io(dst, "syncing", e)),
        false => Ok(()),
    });
    if result.is_err() && created {
        let _ = std::fs::remove_file(dst);
    }
    result
}

/// The length of the plaintext a sealed file of `sealed_len` bytes holds; `None` if no sealed
/// file is that long.
pub fn plaintext_len(sealed_len: u64) -> Option<u64> {
    open::Layout::of(sealed_len).map(|layout| layout.plaintext())
}

/// Decrypts `src` (written by [`encrypt_file`]) chunk by chunk, in order, into `output` (named
/// `dst` in errors), e.g. a pipe another process reads as it comes: nothing is written that has
/// not been authenticated, and a file that does not open whole is [`KeyError::Corrupt`] at
/// its first bad chunk (a reader has then had the chunks before it). Returns the plaintext's
/// length.
pub fn decrypt_to(data_key: &[u8], src: &Path, output: &mut dyn Write, dst: &Path) -> Result<u64> {
    let input = File::open(src).map_err(|e| io(src, "opening", e))?;
    open::open_in_order(data_key, &input, src, output, dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> [u8; KEY_LEN] {
        random::<KEY_LEN>().unwrap()
    }

    fn plaintext(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn round_trip(key: &[u8], data: &[u8]) -> (Vec<u8>, Result<Vec<u8>>) {
        let dir = tempfile::tempdir().unwrap();
        let (plain, sealed, back) = (dir.path().join("p"), dir.path().join("s"), dir.path().join("b"));
        std::fs::write(&plain, data).unwrap();
        encrypt_file(key, &plain, &sealed).unwrap();
        let encrypted = std::fs::read(&sealed).unwrap();
        let opened = decrypt_file(key, &sealed, &back, true).map(|()| std::fs::read(&back).unwrap());
        (encrypted, opened)
    }

    /// Opens `encrypted` into a file and, in order, into a stream: both must agree.
    fn open(key: &[u8], encrypted: &[u8]) -> Result<Vec<u8>> {
        let dir = tempfile::tempdir().unwrap();
        let (sealed, back) = (dir.path().join("s"), dir.path().join("b"));
        std::fs::write(&sealed, encrypted).unwrap();
        let opened = decrypt_file(key, &sealed, &back, true).map(|()| std::fs::read(&back).unwrap());
        if opened.is_err() {
            assert!(!back.exists(), "a file that does not open leaves nothing");
        }
        let mut streamed = Vec::new();
        let in_order = decrypt_to(key, &sealed, &mut streamed, Path::new("stream"));
        match (&opened, in_order) {
            (Ok(data), Ok(len)) => assert_eq!((&streamed, len), (data, data.len() as u64)),
            (Err(KeyError::Corrupt { .. }), Err(KeyError::Corrupt { .. })) => {}
            (file, stream) => panic!("opened into a file: {file:?}, into a stream: {stream:?}"),
        }
        opened
    }

    /// In order, a reader gets the chunks before the first bad one, and nothing of it.
    #[test]
    fn a_stream_ends_before_the_first_chunk_that_does_not_open() {
        let key = key();
        let data = plaintext(4 * CHUNK + 5);
        let (encrypted, _) = round_trip(&key, &data);
        let dir = tempfile::tempdir().unwrap();
        for bad in [1, 2, 4] {
            let mut altered = encrypted.clone();
            altered[HEADER_LEN + bad * (CHUNK + TAG_LEN) + 7] ^= 1;
            let sealed = dir.path().join(format!("s{bad}"));
            std::fs::write(&sealed, &altered).unwrap();
            let mut streamed = Vec::new();
            let result = decrypt_to(&key, &sealed, &mut streamed, Path::new("stream"));
            assert!(matches!(result, Err(KeyError::Corrupt { .. })), "chunk {bad}: {result:?}");
            assert!(streamed == data[..bad * CHUNK], "chunk {bad}: {} bytes streamed", streamed.len());
        }
    }

    #[test]
    fn sealed_files_are_told_from_others() {
        let dir = tempfile::tempdir().unwrap();
        let (plain, sealed, short) = (dir.path().join("p"), dir.path().join("s"), dir.path().join("t"));
        std::fs::write(&plain, plaintext(100)).unwrap();
        std::fs::write(&short, &MAGIC[..4]).unwrap();
        encrypt_file(&key(), &plain, &sealed).unwrap();
        assert!(is_sealed(&sealed).unwrap());
        assert!(!is_sealed(&plain).unwrap());
        assert!(!is_sealed(&short).unwrap());
        assert!(is_sealed(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn files_of_every_size_round_trip() {
        let key = key();
        for len in [0, 1, 100, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17] {
            let data = plaintext(len);
            let (encrypted, opened) = round_trip(&key, &data);
            assert_eq!(opened.unwrap(), data, "{len} bytes");
            let chunks = len.div_ceil(CHUNK).max(1);
            assert_eq!(encrypted.len(), HEADER_LEN + len + chunks * TAG_LEN, "{len} bytes");
            assert_eq!(plaintext_len(encrypted.len() as u64), Some(len as u64), "{len} bytes");
            if len >= 64 {
                assert!(!encrypted.windows(64).any(|w| w == &data[..64]), "plaintext in the output");
            }
        }
    }

    #[test]
    fn moved_dropped_cut_altered_or_foreign_chunks_fail() {
        let key = key();
        let data = plaintext(3 * CHUNK + 5);
        let (encrypted, _) = round_trip(&key, &data);
        let sealed_chunk = CHUNK + TAG_LEN;
        let chunk = |i: usize| {
            &encrypted[HEADER_LEN + i * sealed_chunk..(HEADER_LEN + (i + 1) * sealed_chunk).min(encrypted.len())]
        };
        let header = &encrypted[..HEADER_LEN];
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("swapped", [header, chunk(1), chunk(0), chunk(2), chunk(3)].concat()),
            ("dropped", [header, chunk(0), chunk(2), chunk(3)].concat()),
            ("repeated", [header, chunk(0), chunk(0), chunk(1), chunk(2), chunk(3)].concat()),
            ("cut at a chunk boundary", [header, chunk(0), chunk(1)].concat()),
            ("cut inside a chunk", encrypted[..encrypted.len() - 3].to_vec()),
            ("header only", header.to_vec()),
            ("empty", Vec::new()),
        ];
        for (what, bad) in cases {
            assert!(matches!(open(&key, &bad), Err(KeyError::Corrupt { .. })), "{what}");
        }
        for at in [3, MAGIC.len() + 5, HEADER_LEN + 10, encrypted.len() - 1] {
            let mut bad = encrypted.clone();
            bad[at] ^= 1;
            assert!(matches!(open(&key, &bad), Err(KeyError::Corrupt { .. })), "flipped byte {at}");
        }
        assert!(matches!(open(&self::key(), &encrypted), Err(KeyError::Corrupt { .. })), "another key");
        assert_eq!(open(&key, &encrypted).unwrap(), data);
    }

    /// A file refused on its header never touches the destination.
    #[test]
    fn a_file_that_is_not_ours_leaves_the_destination_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("s"), dir.path().join("d"));
        std::fs::write(&src, b"not an encrypted file at all, but long enough").unwrap();
        std::fs::write(&dst, b"kept").unwrap();
        assert!(matches!(decrypt_file(&key(), &src, &dst, true), Err(KeyError::Corrupt { .. })));
        assert_eq!(std::fs::read(&dst).unwrap(), b"kept");
    }

    #[test]
    fn the_same_file_twice_encrypts_differently() {
        let key = key();
        let data = plaintext(1000);
        assert_ne!(round_trip(&key, &data).0, round_trip(&key, &data).0, "a fresh salt each time");
        // Into a file of the test's own, never a device: the output is made (or truncated)
        // before the key is looked at, and the tests run as root.
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        assert!(encrypt_file(&[0; 16], Path::new("/dev/null"), &out).is_err(), "a short key");
    }
}

/// Throughput of the format on this machine: `cargo test --release -p space-keys --lib --
/// --ignored stream_throughput --nocapture` with `SPACE_STREAM_FILE` naming a large file.
#[cfg(test)]
#[test]
#[ignore = "a measurement, not a test"]
fn stream_throughput() {
    let src = std::path::PathBuf::from(std::env::var("SPACE_STREAM_FILE").expect("SPACE_STREAM_FILE"));
    let key = random::<KEY_LEN>().unwrap();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let (sealed, back) = (dir.path().join("s"), dir.path().join("b"));
    let size = std::fs::metadata(&src).unwrap().len() as f64 / (1 << 20) as f64;
    for _ in 0..3 {
        let start = std::time::Instant::now();
        encrypt_file(&key, &src, &sealed).unwrap();
        let encrypt = start.elapsed();
        let start = std::time::Instant::now();
        decrypt_file(&key, &sealed, &back, false).unwrap();
        let decrypt = start.elapsed();
        println!("{size:.0} MiB: encrypt {encrypt:?} ({:.0} MiB/s), decrypt {decrypt:?}", size / encrypt.as_secs_f64());
    }
}
