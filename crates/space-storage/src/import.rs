//! Templates imported from a directory tree or a tarball.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::cmd;
use crate::error::{IoContext, Result, StorageError};
use crate::progress::{Progress, ProgressFn};
use crate::template::{Origin, TemplateInfo, TemplateStore};

const CHUNK: usize = 1 << 20;
const PROGRESS_BYTES: u64 = 8 << 20;

/// How a tarball is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Xz,
    Zstd,
    Bzip2,
}

impl Compression {
    /// Detects the compression from the first bytes of the file.
    pub fn from_magic(head: &[u8]) -> Self {
        match head {
            [0x1f, 0x8b, ..] => Compression::Gzip,
            [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => Compression::Xz,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
            [b'B', b'Z', b'h', ..] => Compression::Bzip2,
            _ => Compression::None,
        }
    }

    fn tar_flag(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Gzip => Some("--gzip"),
            Compression::Xz => Some("--xz"),
            Compression::Zstd => Some("--zstd"),
            Compression::Bzip2 => Some("--bzip2"),
        }
    }
}

impl TemplateStore {
    /// Imports the directory tree `src` (modes, owners, symlinks, hard links and file
    /// capabilities kept) as a new version of template `name`.
    pub fn import_dir(&self, name: &str, src: &Path, progress: ProgressFn) -> Result<TemplateInfo> {
        let meta = std::fs::metadata(src).ctx("stat", src)?;
        if !meta.is_dir() {
            return Err(StorageError::io("import", src, std::io::Error::from(ErrorKind::NotADirectory)));
        }
        let source = format!("directory {}", src.display());
        self.build(name, Origin::described(source), progress, |staging| {
            progress(Progress::new("copying", 0, None));
            let mut cp = Command::new("cp");
            cp.args(["-a", "--reflink=auto"]).arg(src.join(".")).arg(staging.join(""));
            cmd::run(&mut cp, "check the source directory is readable and the pool has free space")?;
            Ok(())
        })
    }

    /// Imports a tarball (plain, gzip, xz, zstd or bzip2; detected from its content) as a new
    /// version of template `name`. Numeric owners and permissions are kept.
    pub fn import_tar(&self, name: &str, tarball: &Path, progress: ProgressFn) -> Result<TemplateInfo> {
        let source = format!("tarball {}", tarball.display());
        self.build(name, Origin::described(source), progress, |staging| extract_tar(tarball, staging, progress))
    }
}

/// Extracts `tarball` into `dest` with GNU tar as root (owners, modes, setuid bits and file
/// capabilities kept; members with `..` or absolute symlink tricks are refused by tar).
/// Progress is reported in bytes of the (compressed) file.
pub fn extract_tar(tarball: &Path, dest: &Path, progress: ProgressFn) -> Result<()> {
    let mut file = File::open(tarball).ctx("open tarball", tarball)?;
    let total = file.metadata().ctx("stat", tarball)?.len();
    let mut head = [0u8; 8];
    let n = file.read(&mut head).ctx("read tarball", tarball)?;
    let compression = Compression::from_magic(&head[..n]);
    let mut tar = Command::new("tar");
    tar.args(["--extract", "--file=-", "--numeric-owner", "--preserve-permissions"])
        .args(["--xattrs", "--xattrs-include=security.capability"])
        .args(compression.tar_flag())
        .arg("--directory")
        .arg(dest)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd::spawn(&mut tar)?;
    let stderr = cmd::drain(child.stderr.take().expect("stderr is piped"));
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let fed = feed(&mut stdin, &head[..n], &mut file, total, progress);
    drop(stdin);
    let status = child.wait().ctx("wait for tar", tarball)?;
    let output = stderr.join().unwrap_or_default();
    if !status.success() {
        let hint =
            "check the file is a tar archive (optionally gzip/xz/zstd/bzip2 compressed) and the pool has free space";
        return Err(cmd::failed(&tar, status, &output, hint));
    }
    fed.ctx("read tarball", tarball)
}

/// Copies the tarball into tar's stdin, reporting progress. A broken pipe means tar stopped
/// early; its exit status tells why.
fn feed(stdin: &mut impl Write, head: &[u8], file: &mut File, total: u64, progress: ProgressFn) -> std::io::Result<()> {
    let report = |done| progress(Progress::new("extracting", done, Some(total)));
    let mut done = head.len() as u64;
    let mut last = 0;
    let mut buf = vec![0u8; CHUNK];
    let write = |stdin: &mut dyn Write, bytes: &[u8]| match stdin.write_all(bytes) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
        Ok(()) => Ok(true),
    };
    report(0);
    if !write(stdin, head)? {
        return Ok(());
    }
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 || !write(stdin, &buf[..n])? {
            break;
        }
        done += n as u64;
        if done - last >= PROGRESS_BYTES {
            report(done);
            last = done;
        }
    }
    report(done);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_compression() {
        assert_eq!(Compression::from_magic(&[0x1f, 0x8b, 8]), Compression::Gzip);
        assert_eq!(Compression::from_magic(b"\xfd7zXZ\x00\x00"), Compression::Xz);
        assert_eq!(Compression::from_magic(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(Compression::from_magic(b"BZh91AY"), Compression::Bzip2);
        assert_eq!(Compression::from_magic(b"./\0\0\0"), Compression::None);
        assert_eq!(Compression::from_magic(b""), Compression::None);
    }

    #[test]
    fn extracts_compressed_tarballs() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("hello"), "hi").unwrap();
        let tarball = dir.path().join("t.tgz");
        let ok = Command::new("tar").arg("-czf").arg(&tarball).arg("-C").arg(&src).arg(".").status().unwrap();
        assert!(ok.success());
        let dest = dir.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        let seen = std::cell::Cell::new(0);
        extract_tar(&tarball, &dest, &|p| seen.set(p.done)).unwrap();
        assert_eq!(std::fs::read_to_string(dest.join("hello")).unwrap(), "hi");
        assert_eq!(seen.get(), std::fs::metadata(&tarball).unwrap().len());
        let err = extract_tar(&src.join("hello"), &dest, &|_| {}).unwrap_err();
        assert!(err.to_string().contains("tar archive"), "{err}");
    }
}
