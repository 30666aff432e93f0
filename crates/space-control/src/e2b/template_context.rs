//! The build context of an E2B template build: the tars of its `COPY` steps' files, as the
//! SDK uploaded them (gzipped or not), rewritten into one plain tar with each upload under
//! `e2b-files/HASH/`. Every entry gets a header made here (no pax or sparse trickery carries
//! through), only files, directories and links are taken, and nothing may name a place
//! outside its upload's directory. The node's builder reads the result as any context.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use tar::{EntryType, Header};

use super::errors::{E2bError, E2bResult};
use super::template_steps;

/// Most entries of a build's uploaded files, all tars together.
const MAX_ENTRIES: usize = 100_000;

/// What a build's uploaded files may still hold: a gzipped tar is small on the wire only.
struct Budget {
    bytes: u64,
    entries: usize,
}

/// Writes `context` from `uploads` (each named by its hash), at most `limit` bytes of files in
/// all (as an uploaded context may hold). Nothing is left of a context that failed; the
/// uploads stay for other builds until they expire.
pub fn build_context(uploads: &[PathBuf], context: &Path, limit: u64) -> E2bResult<()> {
    let assembled = assemble(uploads, context, limit);
    if assembled.is_err() {
        crate::api::template_uploads::remove(context);
    }
    assembled
}

fn assemble(uploads: &[PathBuf], context: &Path, limit: u64) -> E2bResult<()> {
    let failed = |e: std::io::Error| E2bError::new(500, format!("assembling the build context: {e}"));
    // Root's alone (its directory is too); a fresh name in production, reused by the tests.
    let file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(context);
    let mut out = tar::Builder::new(file.map_err(failed)?);
    let mut budget = Budget { bytes: limit, entries: MAX_ENTRIES };
    for upload in uploads {
        let hash = upload.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let file = std::fs::File::open(upload).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => E2bError::bad_request(format!(
                "the files of hash {hash} were not uploaded, or expired since: build again"
            )),
            _ => failed(e),
        })?;
        append_under(&mut out, file, Path::new(&template_steps::context_dir(hash)), &mut budget, limit)?;
    }
    out.finish().map_err(failed)
}

fn bad(why: impl std::fmt::Display) -> E2bError {
    E2bError::bad_request(format!("an uploaded file tar: {why}"))
}

/// Appends the entries of the tar `file` under `prefix`, within `budget`.
fn append_under(
    out: &mut tar::Builder<std::fs::File>,
    file: std::fs::File,
    prefix: &Path,
    budget: &mut Budget,
    limit: u64,
) -> E2bResult<()> {
    let mut reader = std::io::BufReader::new(file);
    let start = std::io::BufRead::fill_buf(&mut reader).map_err(bad)?;
    let gzipped = start.starts_with(&[0x1f, 0x8b]);
    let input: Box<dyn Read> = if gzipped { Box::new(flate2::read::GzDecoder::new(reader)) } else { Box::new(reader) };
    // The guard bounds what the parser reads into memory (pax headers, long names) and, as
    // the stream is the whole tar, what a decompression bomb can unpack.
    let mut archive = tar::Archive::new(space_image::TarGuard::new(input, limit.saturating_mul(2).max(1 << 20)));
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        budget.entries =
            budget.entries.checked_sub(1).ok_or_else(|| bad(format!("more than {MAX_ENTRIES} entries")))?;
        let name = inside(&entry.path().map_err(bad)?)?;
        let kind = entry.header().entry_type();
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(entry.header().mode().map_err(bad)? & 0o7777);
        header.set_mtime(entry.header().mtime().unwrap_or(0));
        // Owned by root, as Docker's COPY leaves what it copies (`--chown` changes that).
        header.set_uid(0);
        header.set_gid(0);
        header.set_size(0);
        let path = prefix.join(&name);
        if !matches!(kind, EntryType::Regular | EntryType::Continuous) && entry.size() != 0 {
            return Err(bad(format!("{} is a {kind:?} that claims data", name.display())));
        }
        match kind {
            EntryType::Regular | EntryType::Continuous => {
                budget.bytes = budget.bytes.checked_sub(entry.size()).ok_or_else(|| {
                    E2bError::new(
                        413,
                        "the files of the build's COPY steps are larger than the server's template upload limit",
                    )
                })?;
                header.set_entry_type(EntryType::Regular);
                header.set_size(entry.size());
                out.append_data(&mut header, &path, &mut entry)
            }
            EntryType::Directory => out.append_data(&mut header, &path, std::io::empty()),
            EntryType::Symlink => {
                let target = entry.link_name().map_err(bad)?.ok_or_else(|| bad("a symlink without a target"))?;
                out.append_link(&mut header, &path, target)
            }
            EntryType::Link => {
                let target = entry.link_name().map_err(bad)?.ok_or_else(|| bad("a hard link without a target"))?;
                out.append_link(&mut header, &path, prefix.join(inside(&target)?))
            }
            other => return Err(bad(format!("{} is a {other:?}: only files, directories and links", name.display()))),
        }
        .map_err(bad)?;
    }
    Ok(())
}

/// `path` as a relative path that stays where it is put: no root, no `..`.
fn inside(path: &Path) -> E2bResult<PathBuf> {
    let escapes =
        path.components().any(|c| matches!(c, Component::ParentDir | Component::RootDir | Component::Prefix(_)));
    if escapes || path.as_os_str().is_empty() {
        return Err(bad(format!("{} leaves the build context", path.display())));
    }
    Ok(path.components().filter(|c| !matches!(c, Component::CurDir)).collect())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A tar holding `name` (written raw: the tar crate refuses to write `..` itself) with `data`.
    fn tar_of(name: &str, kind: EntryType, data: &[u8]) -> Vec<u8> {
        let mut header = Header::new_old();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        let mut out = tar::Builder::new(Vec::new());
        out.append(&header, data).unwrap();
        out.into_inner().unwrap()
    }

    fn gzipped(bytes: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    }

    fn assemble_in(dir: &Path, uploads: &[(&str, Vec<u8>)], limit: u64) -> E2bResult<Vec<String>> {
        let paths: Vec<PathBuf> = uploads
            .iter()
            .map(|(hash, bytes)| {
                std::fs::write(dir.join(hash), bytes).unwrap();
                dir.join(hash)
            })
            .collect();
        let context = dir.join("context.tar");
        build_context(&paths, &context, limit)?;
        let mut archive = tar::Archive::new(std::fs::File::open(&context).unwrap());
        let names = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                // Every header field a reader parses is a number.
                let h = e.header();
                let fields =
                    (h.uid().unwrap(), h.gid().unwrap(), h.mode().unwrap(), h.mtime().unwrap(), h.size().unwrap());
                assert_eq!((fields.0, fields.1), (0, 0));
                e.path().unwrap().display().to_string()
            })
            .collect();
        Ok(names)
    }

    #[test]
    fn uploads_land_under_their_hash_and_escapes_and_bombs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (file, fifo) = (EntryType::Regular, EntryType::Fifo);
        let uploads = [("aa", gzipped(&tar_of("./app/a.txt", file, b"hi"))), ("bb", tar_of("b", file, b"x"))];
        assert_eq!(assemble_in(dir.path(), &uploads, 1 << 20).unwrap(), ["e2b-files/aa/app/a.txt", "e2b-files/bb/b"]);
        assert!(dir.path().join("aa").exists(), "uploads stay for other builds");

        for (name, kind) in [("../up", file), ("/etc/x", file)] {
            let escape = assemble_in(dir.path(), &[("cc", tar_of(name, kind, b"x"))], 1 << 20).unwrap_err();
            assert!(escape.message.contains("leaves the build context"), "{}", escape.message);
            assert!(!dir.path().join("context.tar").exists(), "nothing is left of a refused context");
        }
        let special = assemble_in(dir.path(), &[("dd", tar_of("pipe", fifo, b""))], 1 << 20).unwrap_err();
        assert!(special.message.contains("only files, directories and links"), "{}", special.message);
        let bomb = assemble_in(dir.path(), &[("ee", gzipped(&tar_of("big", file, &[0; 4096])))], 1024).unwrap_err();
        assert_eq!(bomb.code, 413);
        let missing = build_context(&[dir.path().join("ff")], &dir.path().join("c.tar"), 1024).unwrap_err();
        assert!(missing.message.contains("were not uploaded"), "{}", missing.message);
    }

    #[test]
    fn a_hard_link_stays_inside_its_upload() {
        let dir = tempfile::tempdir().unwrap();
        let mut header = Header::new_gnu();
        header.set_entry_type(EntryType::Link);
        header.set_size(0);
        header.set_mode(0o644);
        let mut out = tar::Builder::new(Vec::new());
        out.append_link(&mut header, "l", "a/../../../etc/passwd").unwrap();
        let refused = assemble_in(dir.path(), &[("aa", out.into_inner().unwrap())], 1 << 20).unwrap_err();
        assert!(refused.message.contains("leaves the build context"), "{}", refused.message);
    }
}
