//! Content-addressed, checksummed objects: what a snapshot or a template becomes to travel
//! between nodes (the volume manager of docs/storage.md, "Durable snapshots").
//!
//! An object's key is the SHA-256 of its bytes, so the same bytes are stored once however
//! many snapshots hold them, and every read is checked against the key: bytes that do not
//! hash to it are [`BlobError::Corrupt`], never handed back. Objects are written whole or not
//! at all (a multipart upload completes atomically; a local file is renamed into place).
//!
//! One interface over two backends, both `object_store`'s: a local directory (the default)
//! and S3-compatible storage ([`BlobStore::open`]).

mod download;
mod location;
mod pieces;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as Key;
use object_store::{GetResultPayload, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};

/// A multipart upload's part (S3 wants at least 5 MiB but the last), and a remote download's
/// write buffer. Files are read in smaller pieces ([`pieces::PIECE`]), which make up whole
/// parts.
const CHUNK: usize = 8 << 20;
const _: () = assert!(CHUNK.is_multiple_of(pieces::PIECE));

/// Where [`BlobStore::put_file_once`] writes an object before it knows the object's hash,
/// under 32 lower-case hex digits.
const INCOMING: &str = "incoming";

fn is_incoming_name(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// An object by its content: what a snapshot's export records of each of its parts.
pub use space_api::durable::{BlobRef, BlobSweep};

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("{url:?} is not a blob store: {reason}")]
    BadUrl { url: String, reason: String },
    /// The bytes under `key` are not the ones it names.
    #[error(
        "object {key} is corrupt: expected {} bytes with SHA-256 {}, found {actual_size} bytes with SHA-256 {actual_sha256}",
        expected.size, expected.sha256
    )]
    Corrupt { key: String, expected: BlobRef, actual_sha256: String, actual_size: u64 },
    #[error("object {key} is not in the blob store")]
    Missing { key: String },
    /// An export names an object by something that is not a SHA-256 (64 lower-case hex
    /// digits): it names no object, and is never made into a key.
    #[error("{sha256:?} is not a SHA-256 (64 lower-case hex digits), so it names no object")]
    BadRef { sha256: String },
    /// A file changed while it was being stored; nothing was kept.
    #[error("{} changed while it was being stored", path.display())]
    Changed { path: PathBuf },
    #[error("{}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The store could not be reached or refused the call.
    #[error("the blob store")]
    Store(#[from] object_store::Error),
}

pub type Result<T, E = BlobError> = std::result::Result<T, E>;

/// An S3 access key.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("access_key_id", &self.access_key_id).finish_non_exhaustive()
    }
}

impl Credentials {
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, if both are set.
    pub fn from_env() -> Option<Credentials> {
        Some(Credentials {
            access_key_id: std::env::var("AWS_ACCESS_KEY_ID").ok()?,
            secret_access_key: std::env::var("AWS_SECRET_ACCESS_KEY").ok()?,
        })
    }
}

/// Where objects are kept.
#[derive(Debug, Clone)]
pub struct BlobStore {
    store: Arc<dyn ObjectStore>,
    /// A directory: an object is moved by a rename (on S3 it would be copied, and a copy is
    /// one request, bounded in size and time).
    directory: bool,
}

impl BlobStore {
    /// Opens `url`: a directory (`/path` or `file:///path`, made if missing) or a bucket
    /// (`s3://BUCKET[/PREFIX]?endpoint=URL[&region=REGION]`, credentials from the usual
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, never from the URL).
    pub fn open(url: &str) -> Result<BlobStore> {
        BlobStore::open_with(url, Credentials::from_env())
    }

    /// Opens `url` with these S3 credentials (ignored for a directory).
    pub fn open_with(url: &str, credentials: Option<Credentials>) -> Result<BlobStore> {
        let (store, directory) = location::open(url, credentials)?;
        Ok(BlobStore { store, directory })
    }

    /// Where the object of `blob` lives in the store. The hash comes from a recorded export,
    /// so it is checked before it becomes part of a key.
    pub fn key(blob: &BlobRef) -> Result<Key> {
        let hex = &blob.sha256;
        if !space_api::durable::is_sha256(hex) {
            return Err(BlobError::BadRef { sha256: space_api::error::clip(hex) });
        }
        Ok(Key::from(format!("sha256/{}/{hex}", &hex[..2])))
    }

    /// Stores `data`; already stored bytes are not sent again.
    pub async fn put_bytes(&self, data: Bytes) -> Result<BlobRef> {
        let blob = BlobRef { sha256: hex::encode(Sha256::digest(&data)), size: data.len() as u64 };
        if !self.exists(&blob).await? {
            self.store.put(&Self::key(&blob)?, PutPayload::from(data)).await?;
        }
        Ok(blob)
    }

    /// Stores the file at `path`, read in chunks; already stored bytes are not sent again.
    pub async fn put_file(&self, path: &Path) -> Result<BlobRef> {
        let blob = hash_file(path).await?;
        if self.exists(&blob).await? {
            return Ok(blob);
        }
        let key = Self::key(&blob)?;
        let mut upload = WriteMultipart::new_with_chunk_size(self.store.put_multipart(&key).await?, CHUNK);
        let sent = read_hashed(path, Some(&mut upload)).await;
        if !matches!(&sent, Ok(sent) if *sent == blob) {
            upload.abort().await?;
            return Err(sent.err().unwrap_or(BlobError::Changed { path: path.to_owned() }));
        }
        upload.finish().await?;
        Ok(blob)
    }

    /// Stores the file at `path`, which no stored object can equal (fresh random bytes: it is
    /// encrypted under a nonce of its own). In a directory, in one pass: read, hashed and
    /// written at once under a name of its own in `incoming/`, then renamed to its hash's key.
    /// [`BlobStore::put_file`] reads a file twice, to learn its hash and then to send it
    /// unless it is stored; for bytes that cannot be stored already, the first read is waste.
    /// On S3 it is [`BlobStore::put_file`]: a move there is a copy in one request, which S3
    /// refuses past 5 GiB. One cut short leaves an object in `incoming/`, which a sweep
    /// deletes once old enough.
    pub async fn put_file_once(&self, path: &Path) -> Result<BlobRef> {
        if !self.directory {
            return self.put_file(path).await;
        }
        let incoming = Key::from(format!("{INCOMING}/{}", hex::encode(rand::random::<[u8; 16]>())));
        let mut upload = WriteMultipart::new_with_chunk_size(self.store.put_multipart(&incoming).await?, CHUNK);
        let blob = match read_hashed(path, Some(&mut upload)).await {
            Ok(blob) => blob,
            Err(e) => {
                let _ = upload.abort().await;
                return Err(e);
            }
        };
        let moved = match upload.finish().await {
            Ok(_) => self.store.rename(&incoming, &Self::key(&blob)?).await,
            Err(e) => Err(e),
        };
        if let Err(e) = moved {
            let _ = self.store.delete(&incoming).await;
            return Err(e.into());
        }
        Ok(blob)
    }

    /// Whether the store holds `blob` (an object of its key and size; its bytes are checked
    /// when read).
    pub async fn exists(&self, blob: &BlobRef) -> Result<bool> {
        match self.store.head(&Self::key(blob)?).await {
            Ok(meta) => Ok(meta.size == blob.size),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The bytes of `blob`, checked.
    pub async fn get_bytes(&self, blob: &BlobRef) -> Result<Bytes> {
        let key = Self::key(blob)?;
        let data = self.store.get(&key).await.map_err(|e| missing(e, &key))?.bytes().await?;
        let actual = BlobRef { sha256: hex::encode(Sha256::digest(&data)), size: data.len() as u64 };
        check(&key, blob, actual)?;
        Ok(data)
    }

    /// Writes the bytes of `blob` to `dest`, which appears only once they are checked, readable
    /// by its owner only (an object may hold a sandbox's memory).
    pub async fn get_to_file(&self, blob: &BlobRef, dest: &Path) -> Result<()> {
        self.get_to(blob, dest, true).await
    }

    /// [`BlobStore::get_to_file`] for a scratch file that is read once and removed (an
    /// encrypted object on its way to being decrypted): not synced to disk, which a crash
    /// would only make the caller fetch again.
    pub async fn get_to_scratch(&self, blob: &BlobRef, dest: &Path) -> Result<()> {
        self.get_to(blob, dest, false).await
    }

    async fn get_to(&self, blob: &BlobRef, dest: &Path, sync: bool) -> Result<()> {
        // Beside `dest`, named after all of it: images fetched side by side may share a stem.
        let mut partial = dest.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let result = self.download(blob, &partial, sync).await;
        match result {
            Ok(()) => tokio::fs::rename(&partial, dest).await.map_err(io(dest)),
            Err(e) => {
                let _ = tokio::fs::remove_file(&partial).await;
                Err(e)
            }
        }
    }

    async fn download(&self, blob: &BlobRef, partial: &Path, sync: bool) -> Result<()> {
        let key = Self::key(blob)?;
        let got = self.store.get(&key).await.map_err(|e| missing(e, &key))?;
        let file = download::create(partial).await?;
        let actual = match got.payload {
            GetResultPayload::File(source, _) => {
                download::copy_file(source, got.range, file, blob.size, partial, sync).await?
            }
            GetResultPayload::Stream(stream) => download::copy_stream(stream, file, blob.size, partial, sync).await?,
        };
        check(&key, blob, actual)
    }

    /// Puts `data` under `blob`'s key whatever it hashes to, as a disk fault or an intruder
    /// would: for tests of what reads then do.
    #[cfg(any(test, feature = "testing"))]
    pub async fn replace_object(&self, blob: &BlobRef, data: Vec<u8>) -> Result<()> {
        self.store.put(&Self::key(blob)?, PutPayload::from(data)).await?;
        Ok(())
    }

    /// Deletes every object not named in `keep` (SHA-256s) that is at least `min_age` old.
    /// A younger one may belong to an export not yet recorded; the next sweep judges it.
    /// Only keys of this layout (`sha256/XX/` and a SHA-256, and uploads cut short in
    /// `incoming/`) are deleted. Stops deleting once
    /// `budget` has passed (`complete: false`).
    pub async fn sweep(&self, keep: &HashSet<String>, min_age: Duration, budget: Duration) -> Result<BlobSweep> {
        let started = std::time::Instant::now();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64;
        let cutoff = now.saturating_sub(min_age.as_millis() as i64);
        let mut report = BlobSweep::default();
        // Objects by their hash; then uploads cut short, which no export names.
        for prefix in ["sha256", INCOMING] {
            let mut listed = self.store.list(Some(&Key::from(prefix)));
            while let Some(meta) = listed.next().await.transpose()? {
                if started.elapsed() > budget {
                    return Ok(report);
                }
                let Some(name) = meta.location.filename().map(str::to_owned) else { continue };
                let ours = match prefix {
                    INCOMING => Key::from(format!("{INCOMING}/{name}")) == meta.location && is_incoming_name(&name),
                    _ => BlobStore::key(&BlobRef { sha256: name.clone(), size: meta.size })
                        .is_ok_and(|k| k == meta.location),
                };
                if !ours {
                    continue;
                }
                if keep.contains(&name) || meta.last_modified.timestamp_millis() > cutoff {
                    report.kept_objects += 1;
                    continue;
                }
                match self.store.delete(&meta.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                report.deleted_objects += 1;
                report.deleted_bytes += meta.size;
            }
        }
        report.complete = true;
        Ok(report)
    }

    /// Deletes `blob`'s object; one already gone is fine.
    pub async fn delete(&self, blob: &BlobRef) -> Result<()> {
        match self.store.delete(&Self::key(blob)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn check(key: &Key, expected: &BlobRef, actual: BlobRef) -> Result<()> {
    if actual == *expected {
        return Ok(());
    }
    Err(BlobError::Corrupt {
        key: key.to_string(),
        expected: expected.clone(),
        actual_sha256: actual.sha256,
        actual_size: actual.size,
    })
}

fn missing(e: object_store::Error, key: &Key) -> BlobError {
    match e {
        object_store::Error::NotFound { .. } => BlobError::Missing { key: key.to_string() },
        e => e.into(),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BlobError + '_ {
    move |source| BlobError::Io { path: path.to_owned(), source }
}

async fn hash_file(path: &Path) -> Result<BlobRef> {
    read_hashed(path, None).await
}

/// Reads the file at `path` a piece at a time, hashing it, and sends every piece to `upload`
/// if given. One blocking task reads (and a thread beside it hashes) while the pieces it read
/// before are sent. (A plain parameter, not a closure: an async closure's future is not
/// `Send` for every lifetime, which callers behind `async_trait` need.)
async fn read_hashed(path: &Path, upload: Option<&mut WriteMultipart>) -> Result<BlobRef> {
    let (chunks, mut to_send) = tokio::sync::mpsc::channel::<Bytes>(2);
    let chunks = upload.is_some().then_some(chunks);
    let source = path.to_owned();
    let reader = tokio::task::spawn_blocking(move || read_and_hash(&source, chunks));
    if let Some(upload) = upload {
        while let Some(chunk) = to_send.recv().await {
            upload.wait_for_capacity(2).await?;
            upload.put(chunk);
        }
    }
    reader.await.map_err(|e| io(path)(std::io::Error::other(e)))?.map_err(io(path))
}

/// [`read_hashed`]'s blocking part: each piece goes to `chunks` (until nobody takes them).
fn read_and_hash(path: &Path, chunks: Option<tokio::sync::mpsc::Sender<Bytes>>) -> std::io::Result<BlobRef> {
    let mut file = std::fs::File::open(path)?;
    pieces::read_hashed(&mut file, u64::MAX, |piece| match &chunks {
        Some(chunks) => chunks.blocking_send(piece.clone()).map_err(|_| std::io::Error::other("the upload stopped")),
        None => Ok(()),
    })
}

/// Reads until `buf` is full or the source ends; how many bytes it read.
pub(crate) fn read_up_to(file: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match std::io::Read::read(file, &mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The store a test runs against: the bucket scripts/with-s3.sh started (SPACE_TEST_S3_URL),
/// under a prefix named after `dir`, when it is set; the directory `dir/blobs` otherwise.
#[cfg(any(test, feature = "testing"))]
pub fn store_under_test(dir: &Path) -> BlobStore {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("test").to_owned();
    match std::env::var("SPACE_TEST_S3_URL") {
        Ok(url) => {
            let mut url = url::Url::parse(&url).expect("SPACE_TEST_S3_URL is a URL");
            url.set_path(&name);
            BlobStore::open(url.as_str()).expect("open the test bucket")
        }
        Err(_) => BlobStore::open(dir.join("blobs").to_str().expect("a UTF-8 path")).expect("open a test directory"),
    }
}

#[cfg(test)]
mod tests;
