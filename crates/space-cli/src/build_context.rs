//! The build context as the CLI sends it: the directory as a tar, less what its
//! `.dockerignore` excludes (Docker's rules: patterns anchored at the context's root, `*`
//! and `?` within a name, `**` across directories, a later `!pattern` taking a path back,
//! a directory excluded with everything in it). Symlinks are sent as symlinks.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The rules of a `.dockerignore`, in order.
pub struct Ignore {
    rules: Vec<(glob::Pattern, bool)>,
}

impl Ignore {
    /// The rules of `dir/.dockerignore` (none when there is no such file).
    pub fn of(dir: &Path) -> anyhow::Result<Ignore> {
        let file = dir.join(".dockerignore");
        let text = match std::fs::read_to_string(&file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            other => other.with_context(|| format!("reading {}", file.display()))?,
        };
        Ignore::parse(&text)
    }

    fn parse(text: &str) -> anyhow::Result<Ignore> {
        let mut rules = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let (pattern, keep) = match line.strip_prefix('!') {
                Some(rest) => (rest.trim(), true),
                None => (line, false),
            };
            let clean: PathBuf =
                Path::new(pattern).components().filter(|c| matches!(c, std::path::Component::Normal(_))).collect();
            let glob = glob::Pattern::new(&clean.to_string_lossy())
                .with_context(|| format!(".dockerignore: bad pattern {pattern:?}"))?;
            rules.push((glob, keep));
        }
        Ok(Ignore { rules })
    }

    /// Whether `rel` (a path in the context) is left out: the last rule matching it or one
    /// of the directories above it decides.
    pub fn excludes(&self, rel: &Path) -> bool {
        let options = glob::MatchOptions { require_literal_separator: true, ..glob::MatchOptions::new() };
        let mut excluded = false;
        for (pattern, keep) in &self.rules {
            if rel.ancestors().filter(|a| !a.as_os_str().is_empty()).any(|a| pattern.matches_path_with(a, options)) {
                excluded = !keep;
            }
        }
        excluded
    }

    /// Whether a `!` rule may take back something inside an excluded directory.
    fn has_exceptions(&self) -> bool {
        self.rules.iter().any(|(_, keep)| *keep)
    }
}

/// Packs `dir` into `tar` (a file), leaving out what `ignore` excludes, and `extra` (a file
/// and its name in the tar) if given; returns how many entries it holds.
pub fn pack(dir: &Path, ignore: &Ignore, tar: &Path, extra: Option<(&Path, &str)>) -> anyhow::Result<u64> {
    let file = std::fs::File::create(tar).with_context(|| format!("creating {}", tar.display()))?;
    let mut builder = tar::Builder::new(std::io::BufWriter::new(file));
    builder.follow_symlinks(false);
    if let Some((path, name)) = extra {
        builder.append_path_with_name(path, name).with_context(|| format!("adding {}", path.display()))?;
    }
    let mut count = 0;
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let path = dir.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading {}", path.display()))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let rel = rel.join(entry.file_name());
            let is_dir = entry.file_type().with_context(|| format!("reading {}", rel.display()))?.is_dir();
            let excluded = ignore.excludes(&rel);
            // An excluded directory is walked only when a `!` rule may take back what it holds.
            if is_dir && (!excluded || ignore.has_exceptions()) {
                pending.push(rel.clone());
            }
            if excluded {
                continue;
            }
            builder
                .append_path_with_name(entry.path(), &rel)
                .with_context(|| format!("adding {} to the build context", rel.display()))?;
            count += 1;
        }
    }
    builder.into_inner()?.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_ignore_rules() {
        let ignore =
            Ignore::parse("# comment\nnode_modules\n*.log\n!keep.log\n**/__pycache__\n/build/\ndocs/*.md\n").unwrap();
        for excluded in
            ["node_modules", "node_modules/a/b.js", "x.log", "src/pkg/__pycache__/m.pyc", "build/out", "docs/a.md"]
        {
            assert!(ignore.excludes(Path::new(excluded)), "{excluded}");
        }
        for kept in ["keep.log", "src/x.log", "src/main.py", "docs/sub/a.md", "buildx", "Dockerfile"] {
            assert!(!ignore.excludes(Path::new(kept)), "{kept}");
        }
        assert!(!Ignore::parse("").unwrap().excludes(Path::new("anything")));
    }

    #[test]
    fn packs_what_is_not_ignored_with_symlinks_as_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = dir.path().join("ctx");
        std::fs::create_dir_all(ctx.join("node_modules/dep")).unwrap();
        std::fs::create_dir_all(ctx.join("src")).unwrap();
        std::fs::write(ctx.join("node_modules/dep/index.js"), "x").unwrap();
        std::fs::write(ctx.join("src/app.py"), "x").unwrap();
        std::fs::write(ctx.join(".dockerignore"), "node_modules\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ctx.join("src/link")).unwrap();
        let tar = dir.path().join("ctx.tar");
        pack(&ctx, &Ignore::of(&ctx).unwrap(), &tar, None).unwrap();
        let mut archive = tar::Archive::new(std::fs::File::open(&tar).unwrap());
        let mut names: Vec<(String, tar::EntryType)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.header().entry_type())
            })
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<(&str, tar::EntryType)> = names.iter().map(|(n, k)| (n.as_str(), *k)).collect();
        assert_eq!(
            names,
            [
                (".dockerignore", tar::EntryType::Regular),
                ("src", tar::EntryType::Directory),
                ("src/app.py", tar::EntryType::Regular),
                ("src/link", tar::EntryType::Symlink),
            ]
        );
    }
}
