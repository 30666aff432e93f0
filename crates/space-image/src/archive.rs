//! Images in one tar file, read in place (an index of member offsets), never copied out:
//! `docker save` archives (`docker-archive:FILE`: `manifest.json`, the config, a tar per
//! layer) and tars of OCI image layouts (`oci-archive:FILE[:TAG]`, what
//! `skopeo copy … oci-archive:` writes).

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use oci_spec::image::ImageConfiguration;
use serde::Deserialize;

use crate::digest::Digest;
use crate::error::{ImageError, IoContext, Result};
use crate::image::{Blob, Image};
use crate::layout::{Blobs, Files, open_index};

/// More members than any real archive has.
const MAX_MEMBERS: usize = 100_000;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// Opens the (first) image of the archive at `file`.
pub fn open_docker_archive(file: &Path) -> Result<Image> {
    let what = format!("docker archive {}", file.display());
    let members = index(file, &what)?;
    let member = |name: &str| {
        let name = name.trim_start_matches("./");
        members.get(name).cloned().ok_or_else(|| ImageError::malformed(&what, format!("it has no member {name:?}")))
    };
    let manifest = member("manifest.json")?.read_small(None)?;
    let entries: Vec<Entry> =
        serde_json::from_slice(&manifest).map_err(|e| ImageError::malformed(&what, format!("manifest.json: {e}")))?;
    let Some(entry) = entries.into_iter().next() else {
        return Err(ImageError::malformed(&what, "its manifest.json lists no image"));
    };
    tracing::debug!(tags = ?entry.repo_tags, "reading docker archive");
    let config_blob = member(&entry.config)?;
    let config_digest = digest_in_name(&entry.config);
    let config = config_blob.read_small(config_digest.as_ref())?;
    let id = config_digest.unwrap_or_else(|| Digest::of(&config));
    let config = ImageConfiguration::from_reader(&config[..])
        .map_err(|e| ImageError::malformed(&config_blob.what, e.to_string()))?;
    let layers = entry.layers.iter().map(|name| Ok((member(name)?, None))).collect::<Result<Vec<_>>>()?;
    Image::new(id, config, layers)
}

/// Opens the image tagged `tag` (or the only one) of the tar of an OCI layout at `file`.
pub fn open_oci_archive(file: &Path, tag: Option<&str>) -> Result<Image> {
    let what = format!("OCI archive {}", file.display());
    let members = index(file, &what)?;
    open_index(&Blobs { files: Files::Members(&members), what }, tag)
}

/// The digest a member's name carries (`<hex>.json`, `blobs/sha256/<hex>`), if any.
fn digest_in_name(name: &str) -> Option<Digest> {
    let base = name.rsplit('/').next()?;
    Digest::from_hex(base.strip_suffix(".json").unwrap_or(base))
}

/// Where each regular member's data is in the archive.
fn index(file: &Path, what: &str) -> Result<HashMap<String, Blob>> {
    let reader = BufReader::new(File::open(file).ctx("open", file)?);
    let mut archive = tar::Archive::new(reader);
    let bad = |e: std::io::Error| ImageError::malformed(what, format!("unreadable tar: {e}"));
    let mut members = HashMap::new();
    for entry in archive.entries().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        if members.len() == MAX_MEMBERS {
            return Err(ImageError::TooLarge { what: "archive members", limit: MAX_MEMBERS as u64 });
        }
        let name = entry.path().map_err(bad)?.to_string_lossy().trim_start_matches("./").to_owned();
        let blob = Blob {
            file: file.to_path_buf(),
            offset: entry.raw_file_position(),
            len: entry.size(),
            what: format!("{what} member {name}"),
        };
        members.insert(name, blob);
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_in_member_names() {
        let hex = "a".repeat(64);
        assert_eq!(digest_in_name(&format!("{hex}.json")).unwrap().hex(), hex);
        assert_eq!(digest_in_name(&format!("blobs/sha256/{hex}")).unwrap().hex(), hex);
        assert!(digest_in_name("config.json").is_none());
    }
}
