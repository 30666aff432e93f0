//! Pulls from registries (`docker://host/repo:tag`, the registry v2 protocol, with
//! oci-client: token and basic auth, multi-platform indexes). Blobs land in a cache
//! (`<cache>/blobs/sha256/<hex>`, the layout of an OCI layout's blobs), each verified before
//! it is kept, so a blob already there is never downloaded again and the image is then read
//! exactly as a layout is.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_spec::image::{Descriptor, ImageManifest};
use tokio::io::AsyncWriteExt;

use crate::digest::{Digest, Hashing};
use crate::error::{ImageError, IoContext, Result};
use crate::image::Image;
use crate::layout::{Blobs, Files, from_manifest};

const MANIFEST_TYPES: [&str; 2] =
    ["application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"];

/// Called with (phase, done, total) while an image is pulled; it may be called from any thread.
pub type PullReport<'a> = &'a (dyn Fn(String, u64, Option<u64>) + Send + Sync);

/// A parsed `docker://` reference.
#[derive(Debug, Clone)]
pub struct RegistryRef {
    reference: Reference,
}

impl RegistryRef {
    /// Parses `[docker://]host[:port]/repo[:tag][@digest]`.
    pub fn parse(text: &str) -> Result<Self> {
        let bare = text.strip_prefix("docker://").unwrap_or(text);
        let reference: Reference =
            bare.parse().map_err(|e| ImageError::malformed(format!("image reference {bare:?}"), format!("{e}")))?;
        Ok(RegistryRef { reference })
    }

    /// The registry's host (and port).
    pub fn registry(&self) -> &str {
        self.reference.resolve_registry()
    }

    /// Loopback registries are spoken to over plain HTTP (as Docker does for `localhost`),
    /// every other one over HTTPS.
    fn is_loopback(&self) -> bool {
        let host = self.registry().rsplit_once(':').map_or(self.registry(), |(h, _)| h);
        matches!(host, "localhost" | "[::1]") || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
    }
}

/// Where registry logins are read from on the importing host, first found first: the
/// containers auth file (`skopeo login`, `podman login`) and Docker's (`docker login`).
fn auth_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Some(file) = std::env::var_os("REGISTRY_AUTH_FILE") {
        files.push(PathBuf::from(file));
    }
    let uid = nix::unistd::getuid();
    files.push(PathBuf::from(format!("/run/containers/{uid}/auth.json")));
    if let Some(home) = std::env::var_os("HOME") {
        files.push(Path::new(&home).join(".docker/config.json"));
    }
    files
}

/// The login for `registry` in the auth files, if any (`{"auths": {host: {"auth": base64(user:pass)}}}`).
fn login_for(registry: &str, files: &[PathBuf]) -> RegistryAuth {
    for file in files {
        let Ok(text) = std::fs::read(file) else { continue };
        let Ok(config) = serde_json::from_slice::<serde_json::Value>(&text) else {
            tracing::warn!(file = %file.display(), "ignoring an unreadable registry auth file");
            continue;
        };
        let Some(encoded) = config["auths"][registry]["auth"].as_str() else { continue };
        let decoded = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap_or_default();
        if let Some((user, password)) = String::from_utf8_lossy(&decoded).split_once(':') {
            return RegistryAuth::Basic(user.to_owned(), password.to_owned());
        }
    }
    RegistryAuth::Anonymous
}

/// Pulls `reference` into `cache` and returns the image, read from the cache.
pub async fn pull(reference: &RegistryRef, cache: &Path, report: PullReport<'_>) -> Result<Image> {
    let registry = reference.registry().to_owned();
    let failed = |e: oci_client::errors::OciDistributionError| ImageError::Registry {
        registry: registry.clone(),
        reason: format!(
            "{e}; check the registry is reachable and, if it needs a login, that this host has one (skopeo login)"
        ),
    };
    let protocol = if reference.is_loopback() { ClientProtocol::Http } else { ClientProtocol::Https };
    let client = Client::new(ClientConfig { protocol, ..ClientConfig::default() });
    let auth = login_for(&registry, &auth_files());
    let image = &reference.reference;
    report("resolving".into(), 0, None);
    let (_, digest) = client.pull_image_manifest(image, &auth).await.map_err(failed)?;
    let id = Digest::parse(&digest)?;
    let pinned = image.clone_with_digest(digest.clone());
    let (raw, _) = client.pull_manifest_raw(&pinned, &auth, &MANIFEST_TYPES).await.map_err(failed)?;
    id.verify(format!("the manifest of {image}"), &Digest::of(&raw))?;
    let what = format!("image {image}");
    let manifest = ImageManifest::from_reader(&raw[..]).map_err(|e| ImageError::malformed(&what, e.to_string()))?;
    let store = BlobCache { dir: cache.to_path_buf(), client: &client, image: &pinned, registry: &registry };
    store.fetch(manifest.config(), "config", report).await?;
    let count = manifest.layers().len();
    for (index, layer) in manifest.layers().iter().enumerate() {
        store.fetch(layer, &format!("layer {}/{count}", index + 1), report).await?;
    }
    // Reads only the small config from disk: fine on this thread.
    from_manifest(&Blobs { files: Files::Dir(cache), what }, &manifest, id)
}

/// The blob cache and what fills it.
struct BlobCache<'a> {
    dir: PathBuf,
    client: &'a Client,
    image: &'a Reference,
    registry: &'a str,
}

impl BlobCache<'_> {
    /// Downloads the blob `descriptor` names unless the cache has it; a download is verified
    /// (size and sha256) before it is renamed into the cache.
    async fn fetch(&self, descriptor: &Descriptor, what: &str, report: PullReport<'_>) -> Result<()> {
        let digest = Digest::parse(descriptor.digest().as_ref())?;
        let dir = self.dir.join("blobs/sha256");
        let path = dir.join(digest.hex());
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == descriptor.size()) {
            tracing::debug!(%digest, "blob already cached");
            return Ok(());
        }
        tokio::fs::create_dir_all(&dir).await.ctx("create", &dir)?;
        // Unique: imports run side by side and may fetch the same blob.
        let nonce: u64 = rand::random();
        let partial = dir.join(format!("{}.partial-{}-{nonce:016x}", digest.hex(), std::process::id()));
        let phase = format!("downloading {what}");
        report(phase.clone(), 0, Some(descriptor.size()));
        let result = match self.download(&digest, &partial, descriptor.size()).await {
            Ok(()) => {
                let (file, digest, size) = (partial.clone(), digest.clone(), descriptor.size());
                let verified = tokio::task::spawn_blocking(move || verify_file(&file, &digest, size)).await;
                verified.unwrap_or_else(|e| Err(ImageError::io("verify", &partial, std::io::Error::other(e))))
            }
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        std::fs::rename(&partial, &path).ctx("rename", &path)?;
        report(phase, descriptor.size(), Some(descriptor.size()));
        Ok(())
    }

    /// Downloads the blob into `partial`, refusing more than `size` bytes (a registry that
    /// sends more is not allowed to fill the disk).
    async fn download(&self, digest: &Digest, partial: &Path, size: u64) -> Result<()> {
        let file =
            tokio::fs::OpenOptions::new().write(true).create_new(true).open(partial).await.ctx("create", partial)?;
        let mut out = Bounded { inner: tokio::io::BufWriter::with_capacity(1 << 20, file), left: size };
        let name = digest.to_string();
        self.client.pull_blob(self.image, name.as_str(), &mut out).await.map_err(|e| ImageError::Registry {
            registry: self.registry.to_owned(),
            reason: format!("downloading {digest}: {e}"),
        })?;
        out.inner.flush().await.ctx("write", partial)?;
        out.inner.into_inner().sync_all().await.ctx("sync", partial)
    }
}

/// A writer that fails once more than `left` bytes were written.
struct Bounded<W> {
    inner: W,
    left: u64,
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Bounded<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            let error = std::io::Error::other("the registry sent more bytes than the blob's descriptor says");
            return std::task::Poll::Ready(Err(error));
        }
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            self.left -= *n as u64;
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn verify_file(path: &Path, digest: &Digest, size: u64) -> Result<()> {
    let file = std::fs::File::open(path).ctx("open", path)?;
    let (actual, len) = Hashing::new(std::io::BufReader::with_capacity(1 << 20, file)).finish().ctx("read", path)?;
    if len != size {
        return Err(ImageError::malformed(
            format!("blob {digest}"),
            format!("{len} bytes downloaded, {size} expected"),
        ));
    }
    digest.verify(format!("downloaded blob {digest}"), &actual)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_logins() {
        let local = RegistryRef::parse("docker://127.0.0.1:5000/space/test:v1").unwrap();
        assert_eq!(local.registry(), "127.0.0.1:5000");
        assert!(local.is_loopback());
        assert!(RegistryRef::parse("localhost:5000/a").unwrap().is_loopback());
        assert!(!RegistryRef::parse("docker://ghcr.io/org/img:1").unwrap().is_loopback());
        assert!(RegistryRef::parse("docker://host/Repo:tag").is_err());
        assert!(RegistryRef::parse("docker://").is_err());

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("auth.json");
        std::fs::write(&file, r#"{"auths":{"127.0.0.1:5000":{"auth":"dXNlcjpwYTpzcw=="}}}"#).unwrap();
        let auth = login_for("127.0.0.1:5000", std::slice::from_ref(&file));
        assert!(matches!(auth, RegistryAuth::Basic(u, p) if u == "user" && p == "pa:ss"));
        assert!(matches!(login_for("other:1", &[file]), RegistryAuth::Anonymous));
    }
}
