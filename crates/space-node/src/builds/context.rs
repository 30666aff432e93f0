//! `COPY` and `ADD` from the build context. The context is a tar on the node's host; a step
//! picks its sources' entries, renames them under the destination and writes them as a tar
//! of their own, whose digest is the step's cache key. The image unpacker then applies that
//! tar to the layer inside its root (the same hardened path image layers take), so nothing
//! in a context reaches outside the layer being built.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::BuildError;

/// What one `COPY`/`ADD` asks for, variables already substituted.
#[derive(Debug, Clone)]
pub struct CopySpec {
    pub line: usize,
    pub sources: Vec<String>,
    /// Absolute, in the image.
    pub dest: PathBuf,
    /// The destination is a directory the sources go into (it ends with `/`, there are
    /// several sources or a wildcard, or it is a directory in the layer already).
    pub into_dir: bool,
    /// Owner in the sandbox's ids (Docker's default: root).
    pub uid: u32,
    pub gid: u32,
    pub mode: Option<u32>,
}

/// The entries a step copies, as a tar in a file removed on drop.
pub struct Selection {
    pub tar: tempfile::NamedTempFile,
    /// sha256 of that tar: names, owners, modes, times and contents.
    pub digest: String,
}

/// One source: a path of the context (`""` is the whole context), or a wildcard pattern.
enum Source {
    Path(PathBuf),
    Pattern(glob::Pattern),
}

/// Picks what `spec` copies from `context` into a new tar in `scratch`.
pub fn select(context: Option<&Path>, spec: &CopySpec, scratch: &Path) -> Result<Selection, BuildError> {
    let failed = |e: io::Error| BuildError::Context { line: spec.line, source: e };
    let sources = spec.sources.iter().map(|s| source(s, spec.line)).collect::<Result<Vec<_>, _>>()?;
    let out = tempfile::NamedTempFile::new_in(scratch).map_err(failed)?;
    let mut builder = tar::Builder::new(Hashing { inner: out.reopen().map_err(failed)?, hasher: Sha256::new() });
    let mut matched = vec![false; sources.len()];
    if let Some(context) = context {
        let file = std::fs::File::open(context).map_err(failed)?;
        // The guard bounds what the tar parser reads into memory (long names, pax headers).
        let mut archive = tar::Archive::new(space_image::TarGuard::new(file, u64::MAX));
        for entry in archive.entries().map_err(failed)? {
            let mut entry = entry.map_err(failed)?;
            let path = clean(&entry.path().map_err(failed)?);
            if path.starts_with(space_api::BUILD_CONTEXT_PRIVATE_DIR) {
                continue;
            }
            for (i, source) in sources.iter().enumerate() {
                let is_dir = entry.header().entry_type().is_dir();
                let Some(target) = target(source, &path, is_dir, spec) else { continue };
                matched[i] = true;
                append(&mut builder, &mut entry, &target, &sources, spec)?;
                break;
            }
        }
    }
    if let Some(i) = matched.iter().position(|m| !m) {
        let source = &spec.sources[i];
        return Err(BuildError::Step { line: spec.line, message: format!("{source} is not in the build context") });
    }
    let hashing = builder.into_inner().map_err(failed)?;
    let digest = hex::encode(hashing.hasher.finalize());
    Ok(Selection { tar: out, digest })
}

fn source(text: &str, line: usize) -> Result<Source, BuildError> {
    if text.contains(['*', '?', '[']) {
        let pattern = glob::Pattern::new(text.trim_start_matches("./").trim_start_matches('/'))
            .map_err(|e| BuildError::Step { line, message: format!("bad wildcard {text:?}: {e}") })?;
        return Ok(Source::Pattern(pattern));
    }
    let path = clean(Path::new(text));
    if path.components().any(|c| c == Component::ParentDir) {
        let message = format!("{text} is outside the build context");
        return Err(BuildError::Step { line, message });
    }
    Ok(Source::Path(path))
}

/// `./a/b/`, `/a/b` → `a/b`; `.` → ``.
fn clean(path: &Path) -> PathBuf {
    path.components().filter(|c| matches!(c, Component::Normal(_) | Component::ParentDir)).collect()
}

/// Where entry `path` goes if `source` selects it: a directory's content goes into the
/// destination, a file onto it (or into it, for a destination that is a directory).
fn target(source: &Source, path: &Path, is_dir: bool, spec: &CopySpec) -> Option<PathBuf> {
    let options = glob::MatchOptions { require_literal_separator: true, ..glob::MatchOptions::new() };
    let root = match source {
        Source::Path(root) => root.clone(),
        Source::Pattern(pattern) => {
            path.ancestors().find(|a| !a.as_os_str().is_empty() && pattern.matches_path_with(a, options))?.into()
        }
    };
    if path == root {
        return Some(match root.file_name() {
            Some(name) if spec.into_dir && !is_dir => spec.dest.join(name),
            _ => spec.dest.clone(),
        });
    }
    let rest = path.strip_prefix(&root).ok()?;
    Some(spec.dest.join(rest))
}

/// Adds `entry` at `target`, owned and moded as the step says. A directory selected as a
/// whole lands on the destination: its own entry is then the destination's.
fn append<R: Read>(
    builder: &mut tar::Builder<Hashing>,
    entry: &mut tar::Entry<R>,
    to: &Path,
    sources: &[Source],
    spec: &CopySpec,
) -> Result<(), BuildError> {
    let failed = |e: io::Error| BuildError::Context { line: spec.line, source: e };
    let name = to.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default();
    if name.starts_with(b".wh.") {
        let message = format!("{} is named like an image whiteout (.wh.*): rename it", to.display());
        return Err(BuildError::Step { line: spec.line, message });
    }
    // A header of our own: a context's own (a sparse entry, a pax size that differs from
    // the ustar one) would make what follows it read as something else.
    let kind = entry.header().entry_type();
    let supported = matches!(
        kind,
        tar::EntryType::Regular | tar::EntryType::Directory | tar::EntryType::Symlink | tar::EntryType::Link
    );
    if !supported {
        let message =
            format!("{} is a {:?} tar entry; the build context holds files, directories and links", to.display(), kind);
        return Err(BuildError::Step { line: spec.line, message });
    }
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(if kind == tar::EntryType::Regular { entry.size() } else { 0 });
    header.set_mode(spec.mode.unwrap_or(entry.header().mode().map_err(failed)?) & 0o7777);
    header.set_mtime(entry.header().mtime().unwrap_or(0));
    header.set_uid(u64::from(spec.uid));
    header.set_gid(u64::from(spec.gid));
    let rel = to.strip_prefix("/").unwrap_or(to);
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    match kind {
        tar::EntryType::Symlink => {
            let link = entry.link_name().map_err(failed)?.unwrap_or_default().into_owned();
            builder.append_link(&mut header, rel, link).map_err(failed)
        }
        tar::EntryType::Link => {
            let link = clean(&entry.link_name().map_err(failed)?.unwrap_or_default());
            let Some(linked) = sources.iter().find_map(|s| target(s, &link, false, spec)) else {
                let message =
                    format!("{} is a hard link to {}, which this step does not copy", rel.display(), link.display());
                return Err(BuildError::Step { line: spec.line, message });
            };
            let linked = linked.strip_prefix("/").unwrap_or(&linked).to_path_buf();
            builder.append_link(&mut header, rel, linked).map_err(failed)
        }
        _ => builder.append_data(&mut header, rel, entry).map_err(failed),
    }
}

/// A writer that hashes what passes through it.
struct Hashing {
    inner: std::fs::File,
    hasher: Sha256,
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(sources: &[&str], dest: &str, into_dir: bool) -> CopySpec {
        CopySpec {
            line: 3,
            sources: sources.iter().map(|s| s.to_string()).collect(),
            dest: dest.into(),
            into_dir,
            uid: 0,
            gid: 0,
            mode: None,
        }
    }

    fn context(dir: &Path) -> PathBuf {
        let tar_path = dir.join("context.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&tar_path).unwrap());
        let mut add = |path: &str, data: &[u8], kind: tar::EntryType| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_size(data.len() as u64);
            header.set_mode(if kind == tar::EntryType::Directory { 0o755 } else { 0o644 });
            header.set_uid(1000);
            builder.append_data(&mut header, path, data).unwrap();
        };
        add("./", b"", tar::EntryType::Directory);
        add("./app.py", b"print(1)", tar::EntryType::Regular);
        add("./src/", b"", tar::EntryType::Directory);
        add("./src/a.py", b"a", tar::EntryType::Regular);
        add("./src/lib/b.py", b"b", tar::EntryType::Regular);
        add("./.space-build/Dockerfile", b"FROM x", tar::EntryType::Regular);
        builder.finish().unwrap();
        tar_path
    }

    fn copied(selection: &Selection) -> Vec<(String, u64)> {
        let mut archive = tar::Archive::new(std::fs::File::open(selection.tar.path()).unwrap());
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.header().uid().unwrap())
            })
            .collect()
    }

    #[test]
    fn sources_land_where_docker_puts_them() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let one = select(Some(&ctx), &spec(&["app.py"], "/srv/main.py", false), dir.path()).unwrap();
        assert_eq!(copied(&one), vec![("srv/main.py".into(), 0)]);
        let into = select(Some(&ctx), &spec(&["./app.py"], "/srv", true), dir.path()).unwrap();
        assert_eq!(copied(&into), vec![("srv/app.py".into(), 0)]);
        let tree = select(Some(&ctx), &spec(&["src/"], "/app", false), dir.path()).unwrap();
        let paths: Vec<String> = copied(&tree).into_iter().map(|(p, _)| p).collect();
        assert_eq!(paths, ["app", "app/a.py", "app/lib/b.py"]);
        let all = select(Some(&ctx), &spec(&["."], "/w", true), dir.path()).unwrap();
        let paths: Vec<String> = copied(&all).into_iter().map(|(p, _)| p).collect();
        assert_eq!(paths, ["w", "w/app.py", "w/src", "w/src/a.py", "w/src/lib/b.py"], "the CLI's own entries stay out");
        let glob = select(Some(&ctx), &spec(&["src/*.py"], "/g/", true), dir.path()).unwrap();
        assert_eq!(copied(&glob), vec![("g/a.py".into(), 0)]);
    }

    #[test]
    fn only_files_directories_and_links_are_copied() {
        let dir = tempfile::tempdir().unwrap();
        for kind in [tar::EntryType::Fifo, tar::EntryType::Char, tar::EntryType::GNUSparse] {
            let ctx = dir.path().join("odd.tar");
            let mut builder = tar::Builder::new(std::fs::File::create(&ctx).unwrap());
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_size(0);
            builder.append_data(&mut header, "odd", std::io::empty()).unwrap();
            builder.finish().unwrap();
            let err = select(Some(&ctx), &spec(&["."], "/x", true), dir.path()).err().unwrap().to_string();
            // A sparse entry (which would expand to its declared size) is refused by the tar
            // reader already, or else here.
            let refused = err.contains("the build context holds files, directories and links")
                || (kind == tar::EntryType::GNUSparse && err.contains("reading the build context"));
            assert!(refused, "{kind:?}: {err}");
        }
    }

    #[test]
    fn a_long_name_is_refused_before_the_tar_reader_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = dir.path().join("long.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&ctx).unwrap());
        let mut header = tar::Header::new_gnu();
        header.set_size(0);
        // A GNU long-name entry of 2 MiB, which the tar reader would read whole into memory.
        let name = format!("{}/f", "d".repeat(2 << 20));
        builder.append_data(&mut header, &name, std::io::empty()).unwrap();
        builder.finish().unwrap();
        let err = select(Some(&ctx), &spec(&["."], "/x", true), dir.path()).err().unwrap();
        let chain = format!("{err}: {}", std::error::Error::source(&err).map(|s| s.to_string()).unwrap_or_default());
        assert!(chain.contains("reading the build context") && chain.contains("a tar metadata entry (L)"), "{chain}");
    }

    #[test]
    fn same_selection_same_digest_and_missing_sources_named() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let a = select(Some(&ctx), &spec(&["src"], "/app", false), dir.path()).unwrap();
        let b = select(Some(&ctx), &spec(&["src"], "/app", false), dir.path()).unwrap();
        let c = select(Some(&ctx), &spec(&["src"], "/other", false), dir.path()).unwrap();
        assert_eq!(a.digest, b.digest);
        assert_ne!(a.digest, c.digest);
        let missing = select(Some(&ctx), &spec(&["nope.txt"], "/x", false), dir.path()).err().unwrap();
        assert!(missing.to_string().contains("line 3: nope.txt is not in the build context"), "{missing}");
        let outside = select(Some(&ctx), &spec(&["../etc/passwd"], "/x", false), dir.path()).err().unwrap();
        assert!(outside.to_string().contains("outside the build context"), "{outside}");
        let empty = select(None, &spec(&["app.py"], "/x", false), dir.path()).err().unwrap();
        assert!(empty.to_string().contains("not in the build context"), "{empty}");
    }
}
