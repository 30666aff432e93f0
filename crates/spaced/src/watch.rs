//! `Request::Watch`: inotify events for a path (and, recursively, its subdirectories,
//! including ones created later) until the client closes the stream.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use space_proto::{ErrorKind, FramedStream, Reply, WatchEvent, WatchKind};

use crate::error::io_reply;
use crate::files::resolve;
use crate::wire;

/// Directories watched per request at most; beyond it subdirectories are skipped (the
/// kernel's `max_user_watches` is the hard limit anyway).
const MAX_WATCHES: usize = 8192;

fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::DELETE
        | WatchMask::DELETE_SELF
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
}

/// Which path each watch descriptor stands for.
struct Tree {
    root: PathBuf,
    recursive: bool,
    watches: Watches,
    paths: HashMap<WatchDescriptor, PathBuf>,
    root_wd: Option<WatchDescriptor>,
}

impl Tree {
    /// Watches `dir` and, when recursive, every directory below it. Returns the entries
    /// found below `dir` (for the `Create` events of a directory that appeared with
    /// contents already in it).
    fn add(&mut self, dir: &Path) -> Vec<(PathBuf, bool)> {
        let mut found = Vec::new();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(dir) = pending.pop() {
            if self.paths.len() >= MAX_WATCHES {
                break;
            }
            let Ok(wd) = self.watches.add(&dir, mask() | WatchMask::ONLYDIR) else {
                continue;
            };
            self.paths.insert(wd, dir.clone());
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if is_dir {
                    pending.push(entry.path());
                }
                found.push((entry.path(), is_dir));
            }
        }
        found
    }

    /// Stops watching `dir` and everything below it (it moved away: the paths are stale).
    fn forget(&mut self, dir: &Path) {
        let stale: Vec<_> = self.paths.iter().filter(|(_, p)| p.starts_with(dir)).map(|(wd, _)| wd.clone()).collect();
        for wd in stale {
            self.paths.remove(&wd);
            let _ = self.watches.remove(wd);
        }
    }

    fn translate(&mut self, event: inotify::Event<std::ffi::OsString>) -> Vec<WatchEvent> {
        if event.mask.contains(EventMask::Q_OVERFLOW) {
            return vec![self.event(WatchKind::Overflow, self.root.clone(), false)];
        }
        if event.mask.contains(EventMask::IGNORED) {
            self.paths.remove(&event.wd);
            return Vec::new();
        }
        let Some(dir) = self.paths.get(&event.wd) else {
            return Vec::new();
        };
        let path = match &event.name {
            Some(name) => dir.join(name),
            None => dir.clone(),
        };
        let is_dir = event.mask.contains(EventMask::ISDIR);
        let Some(kind) = kind_of(event.mask, Some(&event.wd) == self.root_wd.as_ref()) else {
            return Vec::new();
        };
        let mut events = vec![self.event(kind, path.clone(), is_dir)];
        if self.recursive && is_dir {
            match kind {
                WatchKind::Create | WatchKind::MovedTo => {
                    let found = self.add(&path);
                    events.extend(found.into_iter().map(|(p, d)| self.event(WatchKind::Create, p, d)));
                }
                WatchKind::MovedFrom => self.forget(&path),
                _ => {}
            }
        }
        events
    }

    fn event(&self, kind: WatchKind, path: PathBuf, is_dir: bool) -> WatchEvent {
        WatchEvent { kind, path: path.to_string_lossy().into_owned(), is_dir }
    }
}

/// The protocol kind of an event. `DELETE_SELF` only counts for the watched root: for a
/// subdirectory its parent already reported the removal.
fn kind_of(mask: EventMask, is_root: bool) -> Option<WatchKind> {
    if mask.contains(EventMask::CREATE) {
        Some(WatchKind::Create)
    } else if mask.contains(EventMask::MODIFY) {
        Some(WatchKind::Modify)
    } else if mask.contains(EventMask::DELETE) || (is_root && mask.contains(EventMask::DELETE_SELF)) {
        Some(WatchKind::Remove)
    } else if mask.contains(EventMask::MOVED_FROM) {
        Some(WatchKind::MovedFrom)
    } else if mask.contains(EventMask::MOVED_TO) {
        Some(WatchKind::MovedTo)
    } else {
        None
    }
}

/// `inotify_add_watch` says `ENOSPC` when the user's watches are used up, which is no full
/// disk: say what it is.
fn watch_error(path: &std::path::Path, err: &std::io::Error) -> Reply {
    match err.raw_os_error() {
        Some(libc::ENOSPC) => crate::error::invalid(format!(
            "{}: too many watched files or directories (the kernel's inotify limit); watch less, or not recursively",
            path.display()
        )),
        _ => io_reply(&path.display().to_string(), err),
    }
}

/// Sets up the watches; blocking (walks the tree).
fn setup(root: PathBuf, recursive: bool, watches: Watches) -> Result<Tree, Reply> {
    let mut tree = Tree { root: root.clone(), recursive, watches, paths: HashMap::new(), root_wd: None };
    // The root may be a file; only subdirectories are restricted to directories.
    let wd = tree.watches.add(&root, mask()).map_err(|e| watch_error(&root, &e))?;
    tree.paths.insert(wd.clone(), root.clone());
    tree.root_wd = Some(wd);
    if recursive && root.is_dir() {
        let subdirs: Vec<PathBuf> = std::fs::read_dir(&root)
            .map(|rd| rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect())
            .unwrap_or_default();
        for dir in subdirs {
            tree.add(&dir);
        }
    }
    Ok(tree)
}

pub async fn watch(mut stream: FramedStream, path: String, recursive: bool) {
    let root = match resolve(&path) {
        Ok(root) => root,
        Err(reply) => return wire::finish(stream, reply).await,
    };
    let inotify = match Inotify::init() {
        Ok(inotify) => inotify,
        Err(e) => return wire::finish(stream, io_reply("inotify", &e)).await,
    };
    let watches = inotify.watches();
    let tree = tokio::task::spawn_blocking(move || setup(root, recursive, watches)).await;
    let mut tree = match tree {
        Ok(Ok(tree)) => tree,
        Ok(Err(reply)) => return wire::finish(stream, reply).await,
        Err(e) => return wire::finish(stream, Reply::error(ErrorKind::Other, e.to_string())).await,
    };
    let mut events = match inotify.into_event_stream(vec![0u8; 64 * 1024]) {
        Ok(events) => events,
        Err(e) => return wire::finish(stream, io_reply("inotify", &e)).await,
    };
    if wire::send(&mut stream, &Reply::Watching).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => {
                    for event in tree.translate(event) {
                        if wire::send(&mut stream, &Reply::Event { event }).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Err(e)) => return wire::finish(stream, io_reply("inotify", &e)).await,
                None => return wire::close(stream).await,
            },
            // The client sends nothing on a watch stream; it ends by closing it.
            frame = stream.next() => if !matches!(frame, Some(Ok(_))) {
                return;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        assert_eq!(kind_of(EventMask::CREATE | EventMask::ISDIR, false), Some(WatchKind::Create));
        assert_eq!(kind_of(EventMask::DELETE_SELF, false), None);
        assert_eq!(kind_of(EventMask::DELETE_SELF, true), Some(WatchKind::Remove));
        assert_eq!(kind_of(EventMask::MOVED_TO, false), Some(WatchKind::MovedTo));
        assert_eq!(kind_of(EventMask::ACCESS, false), None);
    }
}
