//! An image reduced to what importing needs: its config and its layers, each a byte range
//! of a file with the digests it must have. Layouts, `docker save` archives and registry
//! pulls all end up here.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use oci_spec::image::ImageConfiguration;
use space_api::TemplateDefaults;

use crate::digest::{Digest, Hashing};
use crate::error::{ImageError, IoContext, Result};
use crate::guard::TarGuard;
use crate::unpack::{Budget, Limits, Unpacker};

/// Largest manifest, index or config read into memory.
pub(crate) const MAX_JSON: u64 = 4 << 20;
const READ_BUFFER: usize = 256 << 10;

/// Where a blob's bytes are: `len` bytes from `offset` of `file`.
#[derive(Debug, Clone)]
pub struct Blob {
    pub file: PathBuf,
    pub offset: u64,
    pub len: u64,
    /// What to call it in messages.
    pub what: String,
}

impl Blob {
    pub fn whole(file: PathBuf, what: String) -> Result<Self> {
        let len = std::fs::metadata(&file).ctx("stat", &file)?.len();
        Ok(Blob { file, offset: 0, len, what })
    }

    /// The blob's bytes (unbuffered: wrap them in what the reader needs).
    pub fn open(&self) -> Result<std::io::Take<File>> {
        let mut file = File::open(&self.file).ctx("open", &self.file)?;
        file.seek(SeekFrom::Start(self.offset)).ctx("seek", &self.file)?;
        Ok(file.take(self.len))
    }

    /// The whole blob (at most [`MAX_JSON`] bytes), checked against `digest` when given.
    pub fn read_small(&self, digest: Option<&Digest>) -> Result<Vec<u8>> {
        if self.len > MAX_JSON {
            return Err(ImageError::malformed(&self.what, format!("{} bytes is too large for metadata", self.len)));
        }
        let mut bytes = Vec::with_capacity(self.len as usize);
        self.open()?.read_to_end(&mut bytes).ctx("read", &self.file)?;
        if let Some(digest) = digest {
            digest.verify(&self.what, &Digest::of(&bytes))?;
        }
        Ok(bytes)
    }
}

/// One layer: its bytes and what they must hash to.
#[derive(Debug, Clone)]
pub struct Layer {
    pub blob: Blob,
    /// Digest of the blob as stored (compressed); layouts and registries have one.
    pub digest: Option<Digest>,
    /// Digest of the uncompressed tar (the config's `rootfs.diff_ids`).
    pub diff_id: Option<Digest>,
}

/// An image ready to unpack.
#[derive(Debug, Clone)]
pub struct Image {
    /// The manifest's digest (or, for archives without one, the config's): the image's identity.
    pub id: Digest,
    pub config: ImageConfiguration,
    pub layers: Vec<Layer>,
}

/// Called with (phase, done, total) while an image unpacks.
pub type Report<'a> = &'a dyn Fn(String, u64, Option<u64>);

impl Image {
    /// Builds the image from its config and layer blobs, checking there is a diff id per layer.
    pub(crate) fn new(id: Digest, config: ImageConfiguration, layers: Vec<(Blob, Option<Digest>)>) -> Result<Self> {
        let diff_ids = config.rootfs().diff_ids();
        if diff_ids.len() != layers.len() {
            let reason = format!("its config lists {} layers but it has {}", diff_ids.len(), layers.len());
            return Err(ImageError::malformed("image", reason));
        }
        let layers = layers
            .into_iter()
            .zip(diff_ids)
            .map(|((blob, digest), diff_id)| Ok(Layer { blob, digest, diff_id: Some(Digest::parse(diff_id)?) }))
            .collect::<Result<Vec<_>>>()?;
        Ok(Image { id, config, layers })
    }

    /// What the image's config gives the commands run in it.
    pub fn defaults(&self) -> TemplateDefaults {
        let Some(config) = self.config.config() else { return TemplateDefaults::default() };
        TemplateDefaults {
            env: config.env().clone().unwrap_or_default(),
            working_dir: config.working_dir().clone().filter(|d| !d.is_empty()),
            user: config.user().clone().filter(|u| !u.is_empty()),
            entrypoint: config.entrypoint().clone().unwrap_or_default(),
            cmd: config.cmd().clone().unwrap_or_default(),
        }
    }

    /// Total bytes of the layer blobs.
    pub fn size(&self) -> u64 {
        self.layers.iter().map(|l| l.blob.len).sum()
    }

    /// Applies every layer, in order, to the empty directory `root`, verifying each layer's
    /// digests as it streams. On error `root` is left half-filled for the caller to remove.
    pub fn unpack(&self, root: &Path, limits: Limits, report: Report<'_>) -> Result<Budget> {
        let mut budget = Budget::new(limits);
        let mut streamed = 0u64;
        let count = self.layers.len();
        for (index, layer) in self.layers.iter().enumerate() {
            let phase = format!("extracting layer {}/{count}", index + 1);
            let read = Progressing { inner: layer.blob.open()?, done: 0, phase: &phase, total: layer.blob.len, report };
            let stored = BufReader::with_capacity(READ_BUFFER, Hashing::new(read));
            let decoder = Decoder::new(stored).ctx("read", &layer.blob.file)?;
            let guard = TarGuard::new(decoder, budget.stream_limit().saturating_sub(streamed));
            let mut plain = Hashing::new(guard);
            Unpacker::new(root, &mut budget)?.apply(index + 1, &mut plain)?;
            let (guard, diff_id, _) = plain
                .finish_into()
                .map_err(|e| ImageError::malformed(format!("layer {}", index + 1), e.to_string()))?;
            streamed += guard.passed();
            let (digest, len) = guard.into_inner().into_inner().into_inner().finish().ctx("read", &layer.blob.file)?;
            let what = format!("layer {} of the image ({})", index + 1, layer.blob.what);
            if let Some(expected) = &layer.diff_id {
                expected.verify(format!("{what}, uncompressed"), &diff_id)?;
            }
            if let Some(expected) = &layer.digest {
                expected.verify(what, &digest)?;
            }
            report(phase, len, Some(layer.blob.len));
        }
        Ok(budget)
    }
}

/// Reports progress in bytes of the stored blob.
struct Progressing<'a, R> {
    inner: R,
    done: u64,
    phase: &'a str,
    total: u64,
    report: Report<'a>,
}

const REPORT_EVERY: u64 = 8 << 20;

impl<R: Read> Read for Progressing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let before = self.done;
        self.done += n as u64;
        if before == 0 || before / REPORT_EVERY != self.done / REPORT_EVERY {
            (self.report)(self.phase.to_owned(), self.done, Some(self.total));
        }
        Ok(n)
    }
}

/// A layer's decompressor, chosen from the stream's first bytes (media types lie more
/// often than magic numbers do).
enum Decoder<R: BufRead> {
    Plain(R),
    Gzip(flate2::bufread::MultiGzDecoder<R>),
    Zstd(zstd::stream::read::Decoder<'static, R>),
}

impl<R: BufRead> Decoder<R> {
    fn new(mut stored: R) -> std::io::Result<Self> {
        let head = stored.fill_buf()?;
        Ok(match head {
            [0x1f, 0x8b, ..] => Decoder::Gzip(flate2::bufread::MultiGzDecoder::new(stored)),
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Decoder::Zstd(zstd::stream::read::Decoder::with_buffer(stored)?),
            _ => Decoder::Plain(stored),
        })
    }

    fn into_inner(self) -> R {
        match self {
            Decoder::Plain(r) => r,
            Decoder::Gzip(d) => d.into_inner(),
            Decoder::Zstd(d) => d.finish(),
        }
    }
}

impl<R: BufRead> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(d) => d.read(buf),
            Decoder::Zstd(d) => d.read(buf),
        }
    }
}
