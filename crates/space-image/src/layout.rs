//! OCI image layouts (`oci:DIR[:TAG]`): `oci-layout`, `index.json`, `blobs/sha256/<hex>`; as a
//! directory, or as the members of a tar of one (`oci-archive:FILE[:TAG]`), read in place.

use std::collections::HashMap;
use std::path::Path;

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType};

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::image::{Blob, Image};

const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// The platform this node runs, in OCI's words.
pub(crate) fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    ("linux", arch)
}

/// Where a layout's files are.
pub(crate) enum Files<'a> {
    /// A directory.
    Dir(&'a Path),
    /// Members of a tar, by their path in it.
    Members(&'a HashMap<String, Blob>),
}

/// The files of a layout, and what to call it in messages.
pub(crate) struct Blobs<'a> {
    pub files: Files<'a>,
    pub what: String,
}

impl Blobs<'_> {
    /// File `rel` of the layout (`index.json`, `blobs/sha256/<hex>`).
    fn file(&self, rel: &str) -> Result<Blob> {
        match &self.files {
            Files::Dir(dir) => Blob::whole(dir.join(rel), format!("{} {rel}", self.what)),
            Files::Members(members) => {
                members.get(rel).cloned().ok_or_else(|| ImageError::malformed(&self.what, format!("it has no {rel}")))
            }
        }
    }

    /// The blob a descriptor points at, its size checked against the descriptor's.
    pub fn get(&self, descriptor: &Descriptor) -> Result<(Blob, Digest)> {
        let digest = Digest::parse(descriptor.digest().as_ref())?;
        let blob = self.file(&format!("blobs/sha256/{}", digest.hex()))?;
        if blob.len != descriptor.size() {
            let reason = format!("blob {digest} has {} bytes, its descriptor says {}", blob.len, descriptor.size());
            return Err(ImageError::malformed(&self.what, reason));
        }
        Ok((blob, digest))
    }

    fn json<T>(&self, descriptor: &Descriptor, parse: fn(&[u8]) -> oci_spec::Result<T>) -> Result<(T, Digest)> {
        let (blob, digest) = self.get(descriptor)?;
        let bytes = blob.read_small(Some(&digest))?;
        let value = parse(&bytes).map_err(|e| ImageError::malformed(&blob.what, e.to_string()))?;
        Ok((value, digest))
    }
}

fn parse_index(bytes: &[u8]) -> oci_spec::Result<ImageIndex> {
    ImageIndex::from_reader(bytes)
}
fn parse_manifest(bytes: &[u8]) -> oci_spec::Result<ImageManifest> {
    ImageManifest::from_reader(bytes)
}
fn parse_config(bytes: &[u8]) -> oci_spec::Result<ImageConfiguration> {
    ImageConfiguration::from_reader(bytes)
}

/// Opens the image tagged `tag` in the layout at `dir` (the only image when `tag` is `None`).
pub fn open_layout(dir: &Path, tag: Option<&str>) -> Result<Image> {
    open_index(&Blobs { files: Files::Dir(dir), what: format!("OCI layout {}", dir.display()) }, tag)
}

/// Opens the image tagged `tag` (or the only one) of a layout's files.
pub(crate) fn open_index(blobs: &Blobs<'_>, tag: Option<&str>) -> Result<Image> {
    let what = &blobs.what;
    if blobs.file("oci-layout").is_err() {
        return Err(ImageError::malformed(what, "it has no oci-layout file"));
    }
    let index = blobs.file("index.json")?.read_small(None)?;
    let index = parse_index(&index).map_err(|e| ImageError::malformed(what, format!("index.json: {e}")))?;
    let descriptor = pick_tag(&index, tag, what)?;
    let (manifest, id) = resolve_manifest(blobs, descriptor, what)?;
    from_manifest(blobs, &manifest, id)
}

/// Builds the image a manifest describes, its blobs from `blobs`.
pub(crate) fn from_manifest(blobs: &Blobs<'_>, manifest: &ImageManifest, id: Digest) -> Result<Image> {
    let (config, _) = blobs.json(manifest.config(), parse_config)?;
    let layers = manifest
        .layers()
        .iter()
        .map(|descriptor| {
            check_layer_type(descriptor.media_type(), &blobs.what)?;
            let (blob, digest) = blobs.get(descriptor)?;
            Ok((blob, Some(digest)))
        })
        .collect::<Result<Vec<_>>>()?;
    Image::new(id, config, layers)
}

fn check_layer_type(media_type: &MediaType, what: &str) -> Result<()> {
    let name = media_type.to_string();
    let layer = name.starts_with("application/vnd.oci.image.layer.")
        || name.starts_with("application/vnd.docker.image.rootfs.");
    if layer && !name.contains("foreign") {
        return Ok(());
    }
    Err(ImageError::Unsupported { what: what.to_owned(), kind: "layer media type", value: name })
}

fn tag_of(descriptor: &Descriptor) -> Option<&str> {
    descriptor.annotations().as_ref()?.get(REF_NAME).map(String::as_str)
}

/// The index entry tagged `tag`, or the only entry.
fn pick_tag<'i>(index: &'i ImageIndex, tag: Option<&str>, what: &str) -> Result<&'i Descriptor> {
    let manifests = index.manifests();
    let tags = || manifests.iter().filter_map(tag_of).collect::<Vec<_>>().join(", ");
    match tag {
        Some(tag) => manifests.iter().find(|d| tag_of(d) == Some(tag)).ok_or_else(|| ImageError::NoSuchTag {
            what: what.to_owned(),
            tag: tag.to_owned(),
            available: tags(),
        }),
        None if manifests.len() == 1 => Ok(&manifests[0]),
        None if manifests.is_empty() => Err(ImageError::malformed(what, "its index.json lists no image")),
        None => Err(ImageError::malformed(what, format!("it holds several images: name one with :TAG ({})", tags()))),
    }
}

/// Follows an index (a multi-platform image) to this platform's manifest.
pub(crate) fn resolve_manifest(
    blobs: &Blobs<'_>,
    descriptor: &Descriptor,
    what: &str,
) -> Result<(ImageManifest, Digest)> {
    let mut descriptor = descriptor.clone();
    for _ in 0..4 {
        match descriptor.media_type() {
            MediaType::ImageIndex => {
                let (index, _) = blobs.json(&descriptor, parse_index)?;
                descriptor = pick_platform(&index, what)?.clone();
            }
            MediaType::Other(t) if t == "application/vnd.docker.distribution.manifest.list.v2+json" => {
                let (index, _) = blobs.json(&descriptor, parse_index)?;
                descriptor = pick_platform(&index, what)?.clone();
            }
            _ => return blobs.json(&descriptor, parse_manifest),
        }
    }
    Err(ImageError::malformed(what, "its indexes nest too deeply"))
}

pub(crate) fn pick_platform<'i>(index: &'i ImageIndex, what: &str) -> Result<&'i Descriptor> {
    let (os, arch) = host_platform();
    index
        .manifests()
        .iter()
        .find(|d| {
            d.platform().as_ref().is_some_and(|p| p.os().to_string() == os && p.architecture().to_string() == arch)
        })
        .ok_or_else(|| ImageError::Unsupported {
            what: what.to_owned(),
            kind: "platform list without",
            value: format!("{os}/{arch}"),
        })
}
