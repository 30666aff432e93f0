//! Opening a sealed file that is a file (not a pipe): its chunks are found by their offsets,
//! so they are opened on several threads at once, each reading, opening and writing its own
//! run of chunks in place. Opening a large image is bound by the cipher and by copying, both
//! of which a second core halves. Into a stream (a pipe its reader consumes as it comes), the
//! chunks are opened in order on one thread instead.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use aws_lc_rs::aead::{Aad, LessSafeKey};

use super::{CHUNK, HEADER_LEN, begins_sealed, io, nonce, subkey};
use crate::{KeyError, Result, TAG_LEN};

/// A sealed chunk's length, but for the last one's.
const SEALED_CHUNK: u64 = (CHUNK + TAG_LEN) as u64;

/// At most this many threads open one file.
const MAX_THREADS: usize = 4;

/// Where a sealed file's chunks are: how many, and how long its body (all but the header) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    chunks: u64,
    body: u64,
}

impl Layout {
    /// The layout of a sealed file of `len` bytes; `None` if no sealed file is that long
    /// (every file has at least one chunk, which holds at least its tag).
    pub(super) fn of(len: u64) -> Option<Layout> {
        let body = len.checked_sub(HEADER_LEN as u64)?;
        let chunks = body.div_ceil(SEALED_CHUNK);
        let last = body.checked_sub(chunks.checked_sub(1)? * SEALED_CHUNK)?;
        (last >= TAG_LEN as u64).then_some(Layout { chunks, body })
    }

    pub(super) fn plaintext(&self) -> u64 {
        self.body - self.chunks * TAG_LEN as u64
    }

    /// Chunk `index`'s offset in the sealed file and its sealed length.
    fn sealed(&self, index: u64) -> (u64, usize) {
        let start = index * SEALED_CHUNK;
        let len = (self.body - start).min(SEALED_CHUNK);
        (HEADER_LEN as u64 + start, len as usize)
    }
}

/// Opens `input` (named `src` in errors), a whole sealed file, into the file `output` makes
/// (named `dst`), which is only made once the header checks. A file that does not open whole
/// is [`KeyError::Corrupt`]; what was written of the output before that is the caller's to
/// remove.
pub(super) fn open_file(
    data_key: &[u8],
    input: &File,
    src: &Path,
    output: impl FnOnce() -> Result<File>,
    dst: &Path,
) -> Result<File> {
    let cores = || std::thread::available_parallelism().map_or(1, usize::from).clamp(1, MAX_THREADS);
    open_file_on(data_key, input, src, output, dst, cores)
}

/// [`open_file`], on as many threads as `threads` says for a file of several chunks (asked
/// only then: counting the cores reads cgroup files, and most images are one chunk).
fn open_file_on(
    data_key: &[u8],
    input: &File,
    src: &Path,
    output: impl FnOnce() -> Result<File>,
    dst: &Path,
    threads: impl FnOnce() -> usize,
) -> Result<File> {
    let (key, header, layout) = begin(data_key, input, src)?;
    let output = output()?;
    // Sized first: the pages are then taken whole (huge pages on a tmpfs that has them).
    output.set_len(layout.plaintext()).map_err(|e| io(dst, "writing", e))?;
    let threads = if layout.chunks > 1 { threads().max(1) } else { 1 };
    let sealed = Sealed { key: &key, header: &header, layout, input, src };
    let opening = Opening { sealed, output: &output, dst };
    opening.open_on(threads).map(|()| output)
}

/// Opens `input` (named `src` in errors), a whole sealed file, chunk by chunk in order into
/// `output` (named `dst`), which may be a pipe: each chunk is written once it has opened, so
/// a reader never gets a byte that did not; one that does not open ends the output there with
/// [`KeyError::Corrupt`]. Returns the plaintext's length.
pub(super) fn open_in_order(
    data_key: &[u8],
    input: &File,
    src: &Path,
    output: &mut dyn Write,
    dst: &Path,
) -> Result<u64> {
    let (key, header, layout) = begin(data_key, input, src)?;
    let sealed = Sealed { key: &key, header: &header, layout, input, src };
    // Plaintext passes through it: wiped when it is freed.
    let mut buffer = zeroize::Zeroizing::new(vec![0u8; CHUNK + TAG_LEN]);
    for index in 0..layout.chunks {
        let plain = sealed.open(index, &mut buffer)?;
        output.write_all(plain).map_err(|e| io(dst, "writing", e))?;
    }
    Ok(layout.plaintext())
}

/// The checks before any chunk: a length some sealed file has, and the header. Returns the
/// file's key, its header and its layout.
fn begin(data_key: &[u8], input: &File, src: &Path) -> Result<(LessSafeKey, [u8; HEADER_LEN], Layout)> {
    let corrupt = || KeyError::Corrupt { owner: src.display().to_string() };
    let len = input.metadata().map_err(|e| io(src, "reading", e))?.len();
    let layout = Layout::of(len).ok_or_else(corrupt)?;
    let mut header = [0u8; HEADER_LEN];
    input.read_exact_at(&mut header, 0).map_err(|e| io(src, "reading", e))?;
    if !begins_sealed(&header) {
        return Err(corrupt());
    }
    let key = subkey(data_key, &header[super::MAGIC.len() + 1..])?;
    Ok((key, header, layout))
}

/// A sealed file whose header checked.
struct Sealed<'a> {
    key: &'a LessSafeKey,
    header: &'a [u8],
    layout: Layout,
    input: &'a File,
    src: &'a Path,
}

impl Sealed<'_> {
    /// Reads chunk `index` into `buffer` (one sealed chunk long) and opens it there; its
    /// plaintext.
    fn open<'b>(&self, index: u64, buffer: &'b mut [u8]) -> Result<&'b [u8]> {
        let (offset, len) = self.layout.sealed(index);
        let chunk = &mut buffer[..len];
        self.input.read_exact_at(chunk, offset).map_err(|e| io(self.src, "reading", e))?;
        let last = index + 1 == self.layout.chunks;
        let corrupt = || KeyError::Corrupt { owner: self.src.display().to_string() };
        let plain = self.key.open_in_place(nonce(index, last), Aad::from(self.header), chunk).map_err(|_| corrupt())?;
        Ok(plain)
    }
}

/// A file being opened into a file, in runs of chunks side by side.
struct Opening<'a> {
    sealed: Sealed<'a>,
    output: &'a File,
    dst: &'a Path,
}

impl Opening<'_> {
    /// Opens every chunk, in `threads` runs side by side (this thread takes the first; a run
    /// whose thread cannot be made is opened here after it).
    fn open_on(&self, threads: usize) -> Result<()> {
        let chunks = self.sealed.layout.chunks;
        let per_thread = chunks.div_ceil(threads as u64).max(1);
        let mut runs = (0..chunks).step_by(per_thread as usize).map(|first| first..(first + per_thread).min(chunks));
        let mine = runs.next().unwrap_or(0..0);
        std::thread::scope(|scope| {
            let mut here = vec![mine];
            let mut spawned = Vec::new();
            for run in runs {
                let thread = std::thread::Builder::new().name("space-keys-open".into());
                let this = run.clone();
                match thread.spawn_scoped(scope, move || self.open(this)) {
                    Ok(handle) => spawned.push(handle),
                    Err(_) => here.push(run),
                }
            }
            let opened = here.into_iter().try_for_each(|run| self.open(run));
            let panicked = || Err(KeyError::Crypto("a thread opening the file panicked".into()));
            spawned.into_iter().map(|thread| thread.join().unwrap_or_else(|_| panicked())).fold(opened, Result::and)
        })
    }

    fn open(&self, chunks: std::ops::Range<u64>) -> Result<()> {
        let mut buffer = vec![0u8; CHUNK + TAG_LEN];
        for index in chunks {
            let plain = self.sealed.open(index, &mut buffer)?;
            self.output.write_all_at(plain, index * CHUNK as u64).map_err(|e| io(self.dst, "writing", e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KEY_LEN, random};

    /// Seals `len` bytes into a file of `dir`; the plaintext and the sealed file's path.
    fn sealed(dir: &Path, key: &[u8], len: usize) -> (Vec<u8>, std::path::PathBuf) {
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + i / 4099) as u8).collect();
        let (plain, sealed) = (dir.join("plain"), dir.join("sealed"));
        std::fs::write(&plain, &data).unwrap();
        super::super::encrypt_file(key, &plain, &sealed).unwrap();
        (data, sealed)
    }

    fn open_on(key: &[u8], sealed: &Path, threads: usize) -> Result<Vec<u8>> {
        let dst = sealed.with_extension("opened");
        let input = File::open(sealed).unwrap();
        let create = || File::create(&dst).map_err(|e| io(&dst, "creating", e));
        open_file_on(key, &input, sealed, create, &dst, || threads)?;
        Ok(std::fs::read(&dst).unwrap())
    }

    /// Opening on one thread and on several: `cargo test --release -p space-keys --lib --
    /// --ignored open_throughput --nocapture`, with `SPACE_STREAM_OUT` naming where the
    /// plaintext goes (a tmpfs, as a node's; `/var/tmp` otherwise).
    #[test]
    #[ignore = "a measurement, not a test"]
    fn open_throughput() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let out = std::env::var("SPACE_STREAM_OUT").unwrap_or_else(|_| "/var/tmp".into());
        let key = random::<KEY_LEN>().unwrap();
        let (_, sealed) = sealed(dir.path(), &key, 100 << 20);
        let dst = Path::new(&out).join(format!("open-throughput-{}", std::process::id()));
        for _ in 0..5 {
            for threads in [1, MAX_THREADS.min(std::thread::available_parallelism().map_or(1, usize::from))] {
                let _ = std::fs::remove_file(&dst);
                let input = File::open(&sealed).unwrap();
                let start = std::time::Instant::now();
                let create = || File::create(&dst).map_err(|e| io(&dst, "creating", e));
                open_file_on(&key, &input, &sealed, create, &dst, || threads).unwrap();
                println!("100 MiB on {threads} thread(s): {:?}", start.elapsed());
            }
        }
        let _ = std::fs::remove_file(&dst);
    }

    #[test]
    fn any_number_of_threads_opens_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let key = random::<KEY_LEN>().unwrap();
        let (data, sealed) = sealed(dir.path(), &key, 7 * CHUNK + 5);
        for threads in [1, 2, 3, 8, 64] {
            assert_eq!(open_on(&key, &sealed, threads).unwrap(), data, "{threads} threads");
        }
    }

    #[test]
    fn a_chunk_altered_in_another_threads_run_fails() {
        let dir = tempfile::tempdir().unwrap();
        let key = random::<KEY_LEN>().unwrap();
        let (_, sealed) = sealed(dir.path(), &key, 7 * CHUNK + 5);
        let layout = Layout::of(std::fs::metadata(&sealed).unwrap().len()).unwrap();
        // Three threads take chunks 0–2, 3–5 and 6–7: alter 4 and, separately, the last.
        for index in [4, 7] {
            let mut bytes = std::fs::read(&sealed).unwrap();
            let (offset, _) = layout.sealed(index);
            bytes[offset as usize + 10] ^= 1;
            let altered = dir.path().join(format!("altered-{index}"));
            std::fs::write(&altered, &bytes).unwrap();
            assert!(matches!(open_on(&key, &altered, 3), Err(KeyError::Corrupt { .. })), "chunk {index}");
        }
    }

    #[test]
    fn layouts_follow_the_format() {
        let header = HEADER_LEN as u64;
        let tag = TAG_LEN as u64;
        // Empty plaintext: one chunk, its tag alone.
        assert_eq!(Layout::of(header + tag), Some(Layout { chunks: 1, body: tag }));
        assert_eq!(Layout::of(header + tag).unwrap().plaintext(), 0);
        // Exactly one full chunk, then one byte more.
        let full = Layout::of(header + SEALED_CHUNK).unwrap();
        assert_eq!((full.chunks, full.plaintext()), (1, CHUNK as u64));
        let more = Layout::of(header + SEALED_CHUNK + tag + 1).unwrap();
        assert_eq!((more.chunks, more.plaintext()), (2, CHUNK as u64 + 1));
        assert_eq!(more.sealed(1), (header + SEALED_CHUNK, TAG_LEN + 1));
        // Shorter than a header and a tag, or a last chunk shorter than a tag: not sealed.
        for len in [0, header - 1, header, header + tag - 1, header + SEALED_CHUNK + tag - 1] {
            assert_eq!(Layout::of(len), None, "{len}");
        }
    }
}
