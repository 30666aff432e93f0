//! Keys that protect data at rest.
//!
//! Envelope encryption: every sealed value gets a fresh random 256-bit data key; the value is
//! encrypted with it (AES-256-GCM, with associated data that binds it to its owner, e.g. a
//! tenant and a credential id), and the data key is wrapped by a [`KeyProvider`] holding the
//! key-encryption key. Providers: a local key file ([`LocalKeyFile`], the default); KMS
//! providers (Vault/OpenBao Transit, AWS-KMS-compatible APIs) come behind the same trait.
//!
//! Sealed layout (version 1):
//! `0x01 | wrapped key length (u16 BE) | wrapped data key | nonce (12) | ciphertext | tag (16)`.
//! The associated data of the value is `0x01 | owner`, so neither the version byte nor the
//! owner can be changed without the value failing to open.
//!
//! [`DigestKey`] keys digests (HMAC-SHA-256) of data that may hold secrets, so that what is
//! stored of them cannot be used to test guesses offline; it is kept sealed like any secret.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hmac;
pub use zeroize::Zeroizing;

/// Bytes of a key (data key or local key-encryption key).
pub const KEY_LEN: usize = 32;
/// The sealed-value format this code writes.
pub const SEAL_VERSION: u8 = 1;
const TAG_LEN: usize = 16;
/// Associated data of a data key wrapped by a local key file.
const LOCAL_WRAP_AAD: &[u8] = b"space-keys/local-wrap/v1";
/// Length of the key fingerprint that prefixes a key wrapped by a local key file.
const FINGERPRINT_LEN: usize = 8;
/// Bytes of a [`DigestKey`] digest.
pub const DIGEST_LEN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The data was sealed under another key-encryption key.
    #[error(
        "{key} is not the key this data was sealed with; restore the original key file (or key), \
         or re-create what was sealed with it (e.g. the credentials)"
    )]
    WrongKey { key: String },
    /// The value does not open: damaged, or moved to another owner.
    #[error("a sealed value is damaged or does not belong to {owner}; re-create it (e.g. rotate the credential)")]
    Corrupt { owner: String },
    #[error("sealed data has format version {0}, which this version of space cannot read; upgrade space")]
    UnsupportedVersion(u8),
    /// The key file is not there. Distinct from [`KeyError::KeyFile`] so that a caller can
    /// tell "never created" from "unusable" and decide whether a new key is safe.
    #[error("the key file {path} does not exist")]
    Missing { path: PathBuf },
    #[error("key file {path}: {why}")]
    KeyFile { path: PathBuf, why: String },
    #[error("cryptography failure: {0}")]
    Crypto(String),
}

pub type Result<T> = std::result::Result<T, KeyError>;

/// Holds a key-encryption key and wraps data keys with it. The key itself never leaves the
/// provider (a KMS provider sends data keys to the KMS instead).
pub trait KeyProvider: Send + Sync {
    /// Encrypts a data key.
    fn wrap(&self, data_key: &[u8]) -> Result<Vec<u8>>;
    /// Decrypts a data key wrapped by [`KeyProvider::wrap`]; [`KeyError::WrongKey`] if it was
    /// wrapped by another key.
    fn unwrap(&self, wrapped: &[u8]) -> Result<Zeroizing<Vec<u8>>>;
    /// Which key this is, for messages (a path, a KMS key name): never key material.
    fn describe(&self) -> String;
}

fn random<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0u8; N];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| KeyError::Crypto("the random number generator failed".into()))?;
    Ok(bytes)
}

fn aead_key(key: &[u8]) -> Result<LessSafeKey> {
    let unbound = UnboundKey::new(&AES_256_GCM, key).map_err(|_| KeyError::Crypto("bad AES-256 key length".into()))?;
    Ok(LessSafeKey::new(unbound))
}

/// `nonce | ciphertext | tag`.
fn encrypt(key: &[u8], plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
    let nonce_bytes = random::<NONCE_LEN>()?;
    let mut in_out = plaintext.to_vec();
    aead_key(key)?
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce_bytes), Aad::from(aad), &mut in_out)
        .map_err(|_| KeyError::Crypto("encryption failed".into()))?;
    let mut out = Vec::with_capacity(NONCE_LEN + in_out.len());
    out.extend_from_slice(&nonce_bytes);
    out.extend_from_slice(&in_out);
    Ok(out)
}

/// Inverse of [`encrypt`]; `None` if it does not authenticate.
fn decrypt(key: &[u8], data: &[u8], aad: &[u8]) -> Result<Option<Zeroizing<Vec<u8>>>> {
    if data.len() < NONCE_LEN + TAG_LEN {
        return Ok(None);
    }
    let (nonce, ciphertext) = data.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| KeyError::Crypto("bad nonce".into()))?;
    let mut in_out = Zeroizing::new(ciphertext.to_vec());
    let len = match aead_key(key)?.open_in_place(nonce, Aad::from(aad), &mut in_out) {
        Ok(plain) => plain.len(),
        Err(_) => return Ok(None),
    };
    in_out.truncate(len);
    Ok(Some(in_out))
}

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

impl KeyProvider for LocalKeyFile {
    /// `fingerprint (8) | nonce | wrapped key | tag`.
    fn wrap(&self, data_key: &[u8]) -> Result<Vec<u8>> {
        let mut out = self.fingerprint.to_vec();
        out.extend(encrypt(&self.key[..], data_key, LOCAL_WRAP_AAD)?);
        Ok(out)
    }

    fn unwrap(&self, wrapped: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
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

/// Envelope encryption of values under a [`KeyProvider`].
#[derive(Clone)]
pub struct Sealer {
    provider: Arc<dyn KeyProvider>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").field("provider", &self.provider.describe()).finish()
    }
}

impl Sealer {
    pub fn new(provider: Arc<dyn KeyProvider>) -> Sealer {
        Sealer { provider }
    }

    /// A sealer over the local key file at `path` (created if missing).
    pub fn local(path: &Path) -> Result<Sealer> {
        Ok(Sealer::new(Arc::new(LocalKeyFile::open_or_create(path)?)))
    }

    pub fn describe(&self) -> String {
        self.provider.describe()
    }

    /// Encrypts `plaintext` under a fresh data key, bound to `owner` (which must be given
    /// again to open it: e.g. `tenant/credential-id`).
    pub fn seal(&self, plaintext: &[u8], owner: &str) -> Result<Vec<u8>> {
        let data_key = Zeroizing::new(random::<KEY_LEN>()?);
        let wrapped = self.provider.wrap(&data_key[..])?;
        let wrapped_len = u16::try_from(wrapped.len())
            .map_err(|_| KeyError::Crypto(format!("wrapped key of {} bytes is too long", wrapped.len())))?;
        let body = encrypt(&data_key[..], plaintext, &aad(owner))?;
        let mut out = Vec::with_capacity(3 + wrapped.len() + body.len());
        out.push(SEAL_VERSION);
        out.extend_from_slice(&wrapped_len.to_be_bytes());
        out.extend_from_slice(&wrapped);
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Decrypts a value sealed by [`Sealer::seal`] for the same `owner`.
    pub fn open(&self, sealed: &[u8], owner: &str) -> Result<Zeroizing<Vec<u8>>> {
        let corrupt = || KeyError::Corrupt { owner: owner.to_owned() };
        let (&version, rest) = sealed.split_first().ok_or_else(corrupt)?;
        if version != SEAL_VERSION {
            return Err(KeyError::UnsupportedVersion(version));
        }
        if rest.len() < 2 {
            return Err(corrupt());
        }
        let (len, rest) = rest.split_at(2);
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        if rest.len() < len {
            return Err(corrupt());
        }
        let (wrapped, body) = rest.split_at(len);
        let data_key = self.provider.unwrap(wrapped)?;
        decrypt(&data_key, body, &aad(owner))?.ok_or_else(corrupt)
    }
}

fn aad(owner: &str) -> Vec<u8> {
    let mut aad = vec![SEAL_VERSION];
    aad.extend_from_slice(owner.as_bytes());
    aad
}

/// A secret key for digests (HMAC-SHA-256) of data that may hold secrets, such as the request
/// bodies behind idempotency fingerprints. A plain hash of such data, stored at rest, lets
/// whoever reads it test guesses of the data offline; a keyed digest does not without the key.
pub struct DigestKey {
    bytes: Zeroizing<[u8; KEY_LEN]>,
    key: hmac::Key,
}

impl std::fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DigestKey").finish_non_exhaustive()
    }
}

impl DigestKey {
    /// A new random key.
    pub fn generate() -> Result<DigestKey> {
        Ok(DigestKey::from_bytes(Zeroizing::new(random::<KEY_LEN>()?)))
    }

    fn from_bytes(bytes: Zeroizing<[u8; KEY_LEN]>) -> DigestKey {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &bytes[..]);
        DigestKey { bytes, key }
    }

    /// The digest of `parts`. Each part is length-prefixed, so no two different lists of
    /// parts digest the same input (`["ab", "c"]` is not `["a", "bc"]`).
    pub fn digest(&self, parts: &[&[u8]]) -> [u8; DIGEST_LEN] {
        let mut context = hmac::Context::with_key(&self.key);
        for part in parts {
            context.update(&(part.len() as u64).to_be_bytes());
            context.update(part);
        }
        let mut out = [0u8; DIGEST_LEN];
        out.copy_from_slice(context.sign().as_ref());
        out
    }

    /// This key sealed by `sealer` for `owner`, to be stored.
    pub fn seal(&self, sealer: &Sealer, owner: &str) -> Result<Vec<u8>> {
        sealer.seal(&self.bytes[..], owner)
    }

    /// Opens a key sealed by [`DigestKey::seal`].
    pub fn open(sealer: &Sealer, sealed: &[u8], owner: &str) -> Result<DigestKey> {
        let plain = sealer.open(sealed, owner)?;
        let bytes: [u8; KEY_LEN] = plain[..].try_into().map_err(|_| KeyError::Corrupt { owner: owner.to_owned() })?;
        Ok(DigestKey::from_bytes(Zeroizing::new(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(dir: &Path, name: &str) -> Sealer {
        Sealer::local(&dir.join("keys").join(name)).unwrap()
    }

    #[test]
    fn round_trip_with_fresh_data_keys() {
        let dir = tempfile::tempdir().unwrap();
        let s = sealer(dir.path(), "master.key");
        let a = s.seal(b"hunter2", "ten_1/cred_1").unwrap();
        let b = s.seal(b"hunter2", "ten_1/cred_1").unwrap();
        assert_ne!(a, b, "every seal uses a fresh data key and nonce");
        assert!(!a.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(&s.open(&a, "ten_1/cred_1").unwrap()[..], b"hunter2");
        assert_eq!(&s.open(&s.seal(b"", "o").unwrap(), "o").unwrap()[..], b"");
        // Reopening the same file gives the same key.
        let again = sealer(dir.path(), "master.key");
        assert_eq!(&again.open(&a, "ten_1/cred_1").unwrap()[..], b"hunter2");
    }

    #[test]
    fn wrong_key_says_which_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let sealed = sealer(dir.path(), "a.key").seal(b"v", "o").unwrap();
        let err = sealer(dir.path(), "b.key").open(&sealed, "o").unwrap_err();
        assert!(matches!(err, KeyError::WrongKey { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("b.key") && message.contains("restore"), "{message}");
    }

    #[test]
    fn tampering_and_wrong_owner_fail() {
        let dir = tempfile::tempdir().unwrap();
        let s = sealer(dir.path(), "k");
        let sealed = s.seal(b"secret value", "ten_1/cred_1").unwrap();
        for i in [sealed.len() - 1, sealed.len() - 20, 3 + 8 + 5] {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(s.open(&bad, "ten_1/cred_1").is_err(), "flipped byte {i}");
        }
        assert!(matches!(s.open(&sealed, "ten_2/cred_1"), Err(KeyError::Corrupt { .. })));
        assert!(s.open(&sealed[..10], "ten_1/cred_1").is_err());
        assert!(s.open(&[], "o").is_err());
        let mut other_version = sealed.clone();
        other_version[0] = 9;
        assert!(matches!(s.open(&other_version, "ten_1/cred_1"), Err(KeyError::UnsupportedVersion(9))));
    }

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

    #[test]
    fn digests_are_keyed_framed_and_survive_sealing() {
        let dir = tempfile::tempdir().unwrap();
        let s = sealer(dir.path(), "k");
        let key = DigestKey::generate().unwrap();
        let parts: &[&[u8]] = &[b"POST", b"/v1/credentials", b"{\"value\":\"hunter2\"}"];
        let digest = key.digest(parts);
        assert_eq!(digest, key.digest(parts));
        assert_ne!(digest, DigestKey::generate().unwrap().digest(parts), "another key, another digest");
        assert_ne!(key.digest(&[b"ab", b"c"]), key.digest(&[b"a", b"bc"]));
        let plain = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &parts.concat());
        assert_ne!(&digest[..], plain.as_ref());

        let sealed = key.seal(&s, "idempotency-key").unwrap();
        assert!(!sealed.windows(KEY_LEN).any(|w| w == &key.bytes[..]));
        assert_eq!(DigestKey::open(&s, &sealed, "idempotency-key").unwrap().digest(parts), digest);
        assert!(matches!(DigestKey::open(&s, &sealed, "other"), Err(KeyError::Corrupt { .. })));
        let short = s.seal(b"short", "idempotency-key").unwrap();
        assert!(matches!(DigestKey::open(&s, &short, "idempotency-key"), Err(KeyError::Corrupt { .. })));
        let other = sealer(dir.path(), "other.key");
        assert!(matches!(DigestKey::open(&other, &sealed, "idempotency-key"), Err(KeyError::WrongKey { .. })));
    }
}
