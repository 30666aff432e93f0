//! `space files put`: one file, stdin (`-`), or a directory tree, each file streamed.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use reqwest::Method;
use space_api::{PathRequest, WriteResult};
use tokio_util::io::ReaderStream;

use crate::client::{Client, encode};

const CHUNK: usize = 256 * 1024;

/// Uploads `local` (a file, a directory or `-`) to `remote`; returns what was written.
pub async fn put(client: &Client, id: &str, local: &Path, remote: &str) -> anyhow::Result<Vec<WriteResult>> {
    if local.as_os_str() == "-" {
        let body = reqwest::Body::wrap_stream(ReaderStream::with_capacity(tokio::io::stdin(), CHUNK));
        return Ok(vec![write(client, id, remote, body, None).await?]);
    }
    let meta = std::fs::metadata(local).with_context(|| format!("reading {}", local.display()))?;
    if !meta.is_dir() {
        return Ok(vec![put_file(client, id, local, remote, None).await?]);
    }
    let tree = walk(local)?;
    check_names(&tree)?;
    mkdir(client, id, remote).await?;
    for dir in &tree.dirs {
        mkdir(client, id, &join(remote, dir)).await?;
    }
    let mut results = Vec::with_capacity(tree.files.len());
    for (relative, mode) in &tree.files {
        // Keep the executable bits of scripts, as `cp -r` and `docker cp` do.
        results.push(put_file(client, id, &local.join(relative), &join(remote, relative), Some(*mode)).await?);
    }
    Ok(results)
}

/// `POST /files/mkdir`: makes `path` and its missing parents.
pub async fn mkdir(client: &Client, id: &str, path: &str) -> anyhow::Result<()> {
    let request = client
        .request(Method::POST, &format!("/v1/sessions/{id}/files/mkdir"))
        .json(&PathRequest { path: path.to_owned() });
    client.send(request).await.with_context(|| format!("making directory {path}"))?;
    Ok(())
}

async fn put_file(
    client: &Client,
    id: &str,
    local: &Path,
    remote: &str,
    mode: Option<u32>,
) -> anyhow::Result<WriteResult> {
    let file = tokio::fs::File::open(local).await.with_context(|| format!("opening {}", local.display()))?;
    let body = reqwest::Body::wrap_stream(ReaderStream::with_capacity(file, CHUNK));
    write(client, id, remote, body, mode).await
}

async fn write(
    client: &Client,
    id: &str,
    remote: &str,
    body: reqwest::Body,
    mode: Option<u32>,
) -> anyhow::Result<WriteResult> {
    let mut path = format!("/v1/sessions/{id}/files/content?path={}", encode(remote));
    if let Some(mode) = mode {
        path.push_str(&format!("&mode={:o}", mode & 0o7777));
    }
    let request = client.request(Method::PUT, &path).header("content-type", "application/octet-stream").body(body);
    let response = client.send(request).await.with_context(|| format!("uploading {remote}"))?;
    Ok(response.json().await?)
}

/// A local directory tree: its subdirectories and files, relative to its root, parents first.
#[derive(Debug, Default, PartialEq)]
struct Tree {
    dirs: Vec<PathBuf>,
    files: Vec<(PathBuf, u32)>,
}

/// Walks `root` without following symlinks (a link could leave the tree or loop); they are
/// skipped with a warning, like other entries that are neither files nor directories.
fn walk(root: &Path) -> anyhow::Result<Tree> {
    let mut tree = Tree::default();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let dir = root.join(&relative);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading {}", dir.display()))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = relative.join(entry.file_name());
            let meta = entry.metadata().with_context(|| format!("reading {}", root.join(&path).display()))?;
            if meta.is_dir() {
                tree.dirs.push(path.clone());
                pending.push(path);
            } else if meta.is_file() {
                tree.files.push((path, meta.permissions().mode()));
            } else {
                eprintln!("space: skipping {} (not a file or directory)", root.join(&path).display());
            }
        }
    }
    Ok(tree)
}

/// `remote/relative` with `/` separators (`check_names` made sure `relative` is UTF-8).
fn join(remote: &str, relative: &Path) -> String {
    let relative = relative.to_string_lossy();
    format!("{}/{relative}", remote.trim_end_matches('/'))
}

/// Refuses names the API could not carry faithfully.
fn check_names(tree: &Tree) -> anyhow::Result<()> {
    for path in tree.dirs.iter().chain(tree.files.iter().map(|(p, _)| p)) {
        if path.to_str().is_none() {
            bail!("{} is not valid UTF-8: rename it to upload it", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_a_tree_parents_first_without_following_links() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::create_dir(r.join("empty")).unwrap();
        std::fs::write(r.join("top.txt"), "1").unwrap();
        std::fs::write(r.join("a/b/deep.sh"), "2").unwrap();
        std::fs::set_permissions(r.join("a/b/deep.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("/etc", r.join("link")).unwrap();
        let tree = walk(r).unwrap();
        let dirs: Vec<_> = tree.dirs.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(dirs, ["a", "empty", "a/b"]);
        let files: Vec<_> = tree.files.iter().map(|(p, _)| p.to_str().unwrap()).collect();
        assert_eq!(files, ["top.txt", "a/b/deep.sh"]);
        assert_eq!(tree.files[1].1 & 0o777, 0o755);
        check_names(&tree).unwrap();
    }

    #[test]
    fn joins_remote_paths() {
        assert_eq!(join("/", Path::new("a/b")), "/a/b");
        assert_eq!(join("/work/", Path::new("f")), "/work/f");
        assert_eq!(join("/work", Path::new("f")), "/work/f");
    }
}
