//! `space template import NAME IMAGE --upload`: sends a root filesystem or an image on this
//! machine to the server (`POST /v1/templates/uploads`), for servers whose host does not
//! have the file. Directories (a root filesystem, an OCI layout) are sent as a tar (an OCI
//! layout's is an `oci-archive`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::Method;
use sha2::{Digest, Sha256};
use space_api::{Operation, TemplateList, TemplateSource};
use tokio_util::io::ReaderStream;

use crate::client::{Client, encode};

const CHUNK: usize = 1 << 20;

/// A tar this command made, removed when it is dropped.
pub struct MadeTar(pub PathBuf);

impl Drop for MadeTar {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Packs directory `dir` into a tar next to the system's temporary files.
pub fn pack(dir: &Path) -> anyhow::Result<MadeTar> {
    let tar = MadeTar(std::env::temp_dir().join(format!("space-upload-{}.tar", std::process::id())));
    let status = std::process::Command::new("tar")
        .args(["--create", "--numeric-owner", "--xattrs", "--file"])
        .arg(&tar.0)
        .arg("--directory")
        .arg(dir)
        .arg(".")
        .status()
        .context("running tar")?;
    if !status.success() {
        bail!("tar could not pack {} ({status})", dir.display());
    }
    Ok(tar)
}

fn sha256_of(path: &Path) -> anyhow::Result<String> {
    let mut file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(hasher.finalize()))
}

/// Uploads `source` as template `name`; returns the import's operation.
pub async fn upload(client: &Client, name: &str, source: TemplateSource, quiet: bool) -> anyhow::Result<Operation> {
    let mut made = None;
    let (file, format, tag) = match source {
        TemplateSource::Path { path } if path.is_dir() => (made.insert(pack(&path)?).0.clone(), "rootfs", None),
        TemplateSource::Path { path } => (path, "rootfs", None),
        TemplateSource::DockerArchive { file } => (file, "docker-archive", None),
        TemplateSource::OciArchive { file, tag } => (file, "oci-archive", tag),
        TemplateSource::OciLayout { dir, tag } => (made.insert(pack(&dir)?).0.clone(), "oci-archive", tag),
        TemplateSource::Registry { .. } => {
            bail!(
                "--upload sends a file or directory of this machine; the server pulls registry images itself: drop --upload"
            )
        }
    };
    let mut path = format!("/v1/templates/uploads?name={}&format={format}", encode(name));
    if let Some(tag) = tag {
        path.push_str(&format!("&tag={}", encode(&tag)));
    }
    let op = send_file(client, &file, &path, quiet).await;
    drop(made);
    op
}

/// Sends `file` as the body of `POST path` (which gets `&sha256=` added) with a progress
/// bar; returns the operation the server answers with. A file past the server's upload
/// limit is refused before anything is sent.
pub async fn send_file(client: &Client, file: &Path, path: &str, quiet: bool) -> anyhow::Result<Operation> {
    let size = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?.len();
    let limit = client.get_json::<TemplateList>("/v1/templates").await?.upload_max_bytes;
    if size > limit {
        bail!("{}", space_api::upload_too_large(limit));
    }
    let hashed = file.to_path_buf();
    let sha256 = tokio::task::spawn_blocking(move || sha256_of(&hashed)).await??;
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(size) };
    bar.set_style(ProgressStyle::with_template("uploading [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")?);
    let opened = tokio::fs::File::open(file).await.with_context(|| format!("opening {}", file.display()))?;
    let counted = bar.clone();
    let stream = ReaderStream::with_capacity(opened, CHUNK).inspect(move |chunk| {
        if let Ok(chunk) = chunk {
            counted.inc(chunk.len() as u64);
        }
    });
    let request = client
        .request(Method::POST, &format!("{path}&sha256={sha256}"))
        .header("content-type", "application/octet-stream")
        .body(reqwest::Body::wrap_stream(stream));
    let response = client.send(request).await.with_context(|| format!("uploading {}", file.display()));
    bar.finish_and_clear();
    Ok(response?.json().await?)
}
