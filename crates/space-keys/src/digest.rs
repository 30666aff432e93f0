//! Keyed digests of data that may hold secrets.

use aws_lc_rs::hmac;
use zeroize::Zeroizing;

use crate::{KEY_LEN, KeyError, Result, Sealer, random};

/// Bytes of a [`DigestKey`] digest.
pub const DIGEST_LEN: usize = 32;

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
    pub async fn seal(&self, sealer: &Sealer, owner: &str) -> Result<Vec<u8>> {
        sealer.seal(&self.bytes[..], owner).await
    }

    /// Opens a key sealed by [`DigestKey::seal`].
    pub async fn open(sealer: &Sealer, sealed: &[u8], owner: &str) -> Result<DigestKey> {
        let plain = sealer.open(sealed, owner).await?;
        let bytes: [u8; KEY_LEN] = plain[..].try_into().map_err(|_| KeyError::Corrupt { owner: owner.to_owned() })?;
        Ok(DigestKey::from_bytes(Zeroizing::new(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn digests_are_keyed_framed_and_survive_sealing() {
        let dir = tempfile::tempdir().unwrap();
        let s = Sealer::local(&dir.path().join("keys/k")).unwrap();
        let key = DigestKey::generate().unwrap();
        let parts: &[&[u8]] = &[b"POST", b"/v1/credentials", b"{\"value\":\"hunter2\"}"];
        let digest = key.digest(parts);
        assert_eq!(digest, key.digest(parts));
        assert_ne!(digest, DigestKey::generate().unwrap().digest(parts), "another key, another digest");
        assert_ne!(key.digest(&[b"ab", b"c"]), key.digest(&[b"a", b"bc"]));
        let plain = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &parts.concat());
        assert_ne!(&digest[..], plain.as_ref());

        let sealed = key.seal(&s, "idempotency-key").await.unwrap();
        assert!(!sealed.windows(KEY_LEN).any(|w| w == &key.bytes[..]));
        assert_eq!(DigestKey::open(&s, &sealed, "idempotency-key").await.unwrap().digest(parts), digest);
        assert!(matches!(DigestKey::open(&s, &sealed, "other").await, Err(KeyError::Corrupt { .. })));
        let short = s.seal(b"short", "idempotency-key").await.unwrap();
        assert!(matches!(DigestKey::open(&s, &short, "idempotency-key").await, Err(KeyError::Corrupt { .. })));
        let other = Sealer::local(&dir.path().join("keys/other.key")).unwrap();
        assert!(matches!(DigestKey::open(&other, &sealed, "idempotency-key").await, Err(KeyError::WrongKey { .. })));
    }
}
