//! What a node reports to the control plane that is not itself part of the HTTP API.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A template: a named, versioned, read-only root filesystem. Built and kept by a node's
/// storage pool; the API shows it as a [`crate::Template`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateInfo {
    pub name: String,
    /// Increases by one with every build of the same name, starting at 1.
    pub version: u64,
    /// Unix time in milliseconds when the build finished.
    pub created_at_ms: u64,
    /// Where the content came from, for humans.
    pub source: String,
    /// Apparent size of the template's regular files (hard links counted once).
    pub size_bytes: u64,
    /// The image's digest, for templates imported from an OCI image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// What the image's config says commands run with, for templates imported from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<crate::types::TemplateDefaults>,
}

/// Entries of a build context under this directory are the CLI's, not the user's (a
/// Dockerfile from outside the context): `COPY`/`ADD` never see them.
pub const BUILD_CONTEXT_PRIVATE_DIR: &str = ".space-build";

/// A Dockerfile build (`POST /v1/templates/builds`), as a node runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateBuild {
    /// The Dockerfile's text.
    pub dockerfile: String,
    /// A tar of the build context on the node's host, which `COPY`/`ADD` read; none: empty.
    #[serde(default)]
    pub context: Option<PathBuf>,
    /// Host patterns `RUN` steps may reach through the gateway (as a session's `allow`).
    #[serde(default)]
    pub allow: Vec<String>,
    /// `--build-arg NAME=value`: values of the Dockerfile's `ARG`s.
    #[serde(default)]
    pub args: std::collections::BTreeMap<String, String>,
    /// Run every step again instead of reusing cached layers.
    #[serde(default)]
    pub no_cache: bool,
    /// The prefix of the builder's own template names on the node (a tenant's): `FROM NAME`
    /// takes the builder's own `NAME` before the global one.
    #[serde(default)]
    pub own_prefix: Option<String>,
    /// Whether `FROM docker://…` may pull from a registry (through the node's network).
    #[serde(default)]
    pub registry: bool,
}

/// Where a template import reads from: a path on the importing node's host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TemplateSource {
    /// A directory tree or a (plain, gzip, xz, zstd or bzip2) tarball of a root filesystem.
    Path { path: PathBuf },
    /// An OCI image layout directory, and the tag of the image in it (needed when it holds several).
    OciLayout { dir: PathBuf, tag: Option<String> },
    /// A `docker save` archive.
    DockerArchive { file: PathBuf },
    /// A tar of an OCI image layout, and the tag of the image in it.
    OciArchive { file: PathBuf, tag: Option<String> },
    /// An image in a registry (`host[:port]/repo[:tag][@digest]`), pulled by the node.
    Registry { reference: String },
}

impl TemplateSource {
    /// Parses `oci:DIR[:TAG]`, `docker-archive:FILE`, `docker://REFERENCE` or a plain path.
    pub fn parse(text: &str) -> Self {
        if let Some(reference) = text.strip_prefix("docker://") {
            return TemplateSource::Registry { reference: reference.to_owned() };
        }
        if let Some(rest) = text.strip_prefix("oci:") {
            let (dir, tag) = path_and_tag(rest);
            return TemplateSource::OciLayout { dir, tag };
        }
        if let Some(rest) = text.strip_prefix("oci-archive:") {
            let (file, tag) = path_and_tag(rest);
            return TemplateSource::OciArchive { file, tag };
        }
        if let Some(file) = text.strip_prefix("docker-archive:") {
            return TemplateSource::DockerArchive { file: file.into() };
        }
        TemplateSource::Path { path: text.into() }
    }

    /// The file or directory on the host it reads (none for a registry).
    pub fn host_path(&self) -> Option<&Path> {
        match self {
            TemplateSource::Path { path } => Some(path),
            TemplateSource::OciLayout { dir, .. } => Some(dir),
            TemplateSource::DockerArchive { file } | TemplateSource::OciArchive { file, .. } => Some(file),
            TemplateSource::Registry { .. } => None,
        }
    }

    /// The same source with its host path replaced (a CLI makes relative paths absolute).
    pub fn with_host_path(self, path: PathBuf) -> Self {
        match self {
            TemplateSource::Path { .. } => TemplateSource::Path { path },
            TemplateSource::OciLayout { tag, .. } => TemplateSource::OciLayout { dir: path, tag },
            TemplateSource::DockerArchive { .. } => TemplateSource::DockerArchive { file: path },
            TemplateSource::OciArchive { tag, .. } => TemplateSource::OciArchive { file: path, tag },
            registry @ TemplateSource::Registry { .. } => registry,
        }
    }
}

/// `PATH[:TAG]`: a last `:` followed by something without `/` is a tag.
fn path_and_tag(text: &str) -> (PathBuf, Option<String>) {
    match text.rsplit_once(':') {
        Some((path, tag)) if !tag.contains('/') => (path.into(), Some(tag.to_owned())),
        _ => (text.into(), None),
    }
}

impl std::fmt::Display for TemplateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TemplateSource::Path { path } => write!(f, "{}", path.display()),
            TemplateSource::OciLayout { dir, tag: Some(tag) } => write!(f, "oci:{}:{tag}", dir.display()),
            TemplateSource::OciLayout { dir, tag: None } => write!(f, "oci:{}", dir.display()),
            TemplateSource::DockerArchive { file } => write!(f, "docker-archive:{}", file.display()),
            TemplateSource::OciArchive { file, tag: Some(tag) } => write!(f, "oci-archive:{}:{tag}", file.display()),
            TemplateSource::OciArchive { file, tag: None } => write!(f, "oci-archive:{}", file.display()),
            TemplateSource::Registry { reference } => write!(f, "docker://{reference}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_and_print_back() {
        let texts = [
            "/srv/root.tar",
            "oci:/srv/img:v1",
            "oci:/srv/img",
            "oci-archive:/srv/i.tar:v2",
            "docker-archive:/srv/img.tar",
            "rel/dir",
            "docker://h:5000/r:t",
        ];
        for text in texts {
            assert_eq!(TemplateSource::parse(text).to_string(), text);
        }
        assert_eq!(
            TemplateSource::parse("oci:/srv/img:latest"),
            TemplateSource::OciLayout { dir: "/srv/img".into(), tag: Some("latest".into()) }
        );
        assert_eq!(TemplateSource::parse("oci:a:b/c"), TemplateSource::OciLayout { dir: "a:b/c".into(), tag: None });
    }
}
