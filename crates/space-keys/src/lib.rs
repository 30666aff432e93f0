//! Keys that protect data at rest.
//!
//! Envelope encryption: every sealed value gets a fresh random 256-bit data key; the value is
//! encrypted with it (AES-256-GCM, with associated data that binds it to its owner, e.g. a
//! tenant and a credential id), and the data key is wrapped by a [`KeyProvider`] holding the
//! key-encryption key. Providers: a local key file ([`LocalKeyFile`], the default) and an
//! OpenBao / HashiCorp Vault Transit key ([`TransitKey`], a key the customer controls).
//! [`stream`] encrypts files of any size in authenticated chunks under a data key.
//! [`Sealer`] describes the sealed layout; it names the key that wrapped the data key, so
//! that a value can be re-wrapped under another key without being re-encrypted.
//!
//! [`DigestKey`] keys digests (HMAC-SHA-256) of data that may hold secrets, so that what is
//! stored of them cannot be used to test guesses offline; it is kept sealed like any secret.

mod digest;
mod local;
mod sealer;
pub mod stream;
mod transit;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
pub use digest::{DIGEST_LEN, DigestKey};
pub use local::LocalKeyFile;
pub use sealer::{LOCAL_KEY_REF, SEAL_VERSION, Sealer, key_ref_of};
pub use transit::{TransitConfig, TransitKey};
pub use zeroize::Zeroizing;

/// Bytes of a key (data key or local key-encryption key).
pub const KEY_LEN: usize = 32;
/// Bytes of an AES-GCM tag (each sealed value and each chunk of a stream carries one).
pub const TAG_LEN: usize = 16;

/// A fresh random data key.
pub fn data_key() -> Result<Zeroizing<[u8; KEY_LEN]>> {
    Ok(Zeroizing::new(random::<KEY_LEN>()?))
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The data was sealed under another key-encryption key.
    #[error(
        "{key} is not the key this data was sealed with; restore the original key file (or key), \
         or re-create what was sealed with it (e.g. the credentials)"
    )]
    WrongKey { key: String },
    /// The key cannot be used now: the KMS refused (the key was disabled, revoked, deleted,
    /// or space's access to it removed) or did not answer. Nothing is lost: the data opens
    /// again once the key is usable.
    #[error(
        "{key} is unavailable: {why}; what was sealed with it cannot be opened (nor new data sealed) until \
         the key is usable again: re-enable it or restore space's access to it in the KMS"
    )]
    Unavailable { key: String, why: String },
    /// The value does not open: damaged, or moved to another owner.
    #[error("a sealed value is damaged or does not belong to {owner}; re-create it (e.g. rotate the credential)")]
    Corrupt { owner: String },
    #[error("sealed data has format version {0}, which this version of space cannot read; upgrade space")]
    UnsupportedVersion(u8),
    /// The key file is not there. Distinct from [`KeyError::KeyFile`] so that a caller can
    /// tell "never created" from "unusable" and decide whether a new key is safe.
    #[error("the key file {path} does not exist")]
    Missing { path: std::path::PathBuf },
    #[error("key file {path}: {why}")]
    KeyFile { path: std::path::PathBuf, why: String },
    /// A key provider's settings are unusable (an address that is not a URL, a bad key name).
    #[error("key provider settings: {0}")]
    Config(String),
    #[error("cryptography failure: {0}")]
    Crypto(String),
}

pub type Result<T> = std::result::Result<T, KeyError>;

/// Holds a key-encryption key and wraps data keys with it. The key itself never leaves the
/// provider (a KMS provider sends data keys to the KMS instead).
#[async_trait::async_trait]
pub trait KeyProvider: Send + Sync {
    /// Encrypts a data key.
    async fn wrap(&self, data_key: &[u8]) -> Result<Vec<u8>>;
    /// Decrypts a data key wrapped by [`KeyProvider::wrap`]; [`KeyError::WrongKey`] if it was
    /// wrapped by another key.
    async fn unwrap(&self, wrapped: &[u8]) -> Result<Zeroizing<Vec<u8>>>;
    /// The data key of `wrapped` wrapped again by this provider's newest key version (after
    /// the key was rotated in the KMS). The data key does not have to leave the KMS for it.
    async fn rewrap(&self, wrapped: &[u8]) -> Result<Vec<u8>> {
        let data_key = self.unwrap(wrapped).await?;
        self.wrap(&data_key).await
    }
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
