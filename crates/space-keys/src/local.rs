//! The default key provider: a key-encryption key in a local file.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::{KEY_LEN, KeyError, KeyProvider, Result, decrypt, encrypt, random};

/// Associated data of a data key wrapped by a local key file.
const LOCAL_WRAP_AAD: &[u8] = b"space-keys/local-wrap/v1";
/// Length of the key fingerprint that prefixes a key wrapped by a local key file.
const FINGERPRINT_LEN: usize = 8;

/// A key-encryption key in a local file: exactly 32 random bytes, mode 0600.
pub struct LocalKeyFile {
    path: PathBuf,
    key: Zeroizing<[u8; KEY_LEN]>,
    fingerprint: [u8; FINGERPRINT_LEN],
}

impl std::fmt::Debug for LocalKeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalKeyFile").field("path", &self.path).finish_non_exhaustive()
    }
}

impl LocalKeyFile {
    /// Opens the key file at `path`, creating it (32 random bytes, mode 0600, in a directory
    /// created with mode 0700) if it does not exist. Refuses a file of the wrong size or one
    /// that group or others may read.
    pub fn open_or_create(path: &Path) -> Result<LocalKeyFile> {
        let fail = |why: String| KeyError::KeyFile { path: path.to_owned(), why };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| fail(format!("cannot create its directory {}: {e}", dir.display())))?;
        }
        match OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
            Ok(mut file) => {
                let key = Zeroizing::new(random::<KEY_LEN>()?);
                file.write_all(&key[..]).and_then(|()| file.sync_all()).map_err(|e| {
                    let _ = std::fs::remove_file(path);
                    fail(format!("cannot write a new key: {e}"))
                })?;
                Ok(LocalKeyFile::from_key(path, key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => LocalKeyFile::open(path),
            Err(e) => Err(fail(format!("cannot create it: {e}"))),
        }
    }

    /// Opens an existing key file (see [`LocalKeyFile::open_or_create`] for the checks).
    pub fn open(path: &Path) -> Result<LocalKeyFile> {
        let fail = |why: String| KeyError::KeyFile { path: path.to_owned(), why };
        let mut file = std::fs::File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => KeyError::Missing { path: path.to_owned() },
            _ => fail(format!("cannot open it: {e}")),
        })?;
        let meta = file.metadata().map_err(|e| fail(format!("cannot stat it: {e}")))?;
        if !meta.is_file() {
            return Err(fail("not a regular file".into()));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(fail(format!(
                "group or others may access it (mode {mode:04o}); it must be private to the server: run `chmod 600 {}`",
                path.display()
            )));
        }
        if meta.len() != KEY_LEN as u64 {
            return Err(fail(format!(
                "it holds {} bytes, but a key file holds exactly {KEY_LEN} random bytes; restore the right file, \
                 or (only if nothing was sealed with it) delete it so a new one is created",
                meta.len()
            )));
        }
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        file.read_exact(&mut key[..]).map_err(|e| fail(format!("cannot read it: {e}")))?;
        Ok(LocalKeyFile::from_key(path, key))
    }

    fn from_key(path: &Path, key: Zeroizing<[u8; KEY_LEN]>) -> LocalKeyFile {
        let mut input = b"space-keys/fingerprint/v1".to_vec();
        input.extend_from_slice(&key[..]);
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &input);
        let mut fingerprint = [0u8; FINGERPRINT_LEN];
        fingerprint.copy_from_slice(&digest.as_ref()[..FINGERPRINT_LEN]);
        LocalKeyFile { path: path.to_owned(), key, fingerprint }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[async_trait::async_trait]
impl KeyProvider for LocalKeyFile {
    /// `fingerprint (8) | nonce | wrapped key | tag`.
    async fn wrap(&self, data_key: &[u8]) -> Result<Vec<u8>> {
        let mut out = self.fingerprint.to_vec();
        out.extend(encrypt(&self.key[..], data_key, LOCAL_WRAP_AAD)?);
        Ok(out)
    }

    async fn unwrap(&self, wrapped: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
        let wrong = || KeyError::WrongKey { key: self.describe() };
        if wrapped.len() < FINGERPRINT_LEN || wrapped[..FINGERPRINT_LEN] != self.fingerprint {
            return Err(wrong());
        }
        decrypt(&self.key[..], &wrapped[FINGERPRINT_LEN..], LOCAL_WRAP_AAD)?.ok_or_else(wrong)
    }

    fn describe(&self) -> String {
        format!("the key file {}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_is_private_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/master.key");
        let key = LocalKeyFile::open_or_create(&path).unwrap();
        assert!(!format!("{key:?}").contains(&format!("{:?}", &key.key[..4])));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 32);

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = LocalKeyFile::open_or_create(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600") && err.contains("0644"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

        std::fs::write(&path, b"short").unwrap();
        let err = LocalKeyFile::open_or_create(&path).unwrap_err().to_string();
        assert!(err.contains("5 bytes") && err.contains("exactly 32"), "{err}");
    }

    #[test]
    fn a_missing_key_file_is_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/master.key");
        let err = LocalKeyFile::open(&path).unwrap_err();
        assert!(matches!(&err, KeyError::Missing { path: p } if *p == path), "{err}");
        assert!(!path.exists(), "open never creates");
    }
}
