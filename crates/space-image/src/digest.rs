//! Content digests (`sha256:<hex>`) and a reader that computes one while data passes.

use std::fmt;
use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use crate::error::{ImageError, Result};

/// A sha256 content digest. Parsing checks the hex, so a digest is safe to use in a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`; other algorithms are refused.
    pub fn parse(text: &str) -> Result<Self> {
        let unsupported = |value: &str| ImageError::Unsupported {
            what: "digest".into(),
            kind: "algorithm",
            value: format!("{value:?} (only sha256 is supported)"),
        };
        let Some((algorithm, hex)) = text.split_once(':') else {
            return Err(ImageError::malformed("digest", format!("{text:?} is not <algorithm>:<hex>")));
        };
        if algorithm != "sha256" {
            return Err(unsupported(algorithm));
        }
        Self::from_hex(hex).ok_or_else(|| ImageError::malformed("digest", format!("{text:?} is not a sha256 digest")))
    }

    /// A digest from 64 lowercase hex digits.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let valid = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        valid.then(|| Digest { hex: hex.to_owned() })
    }

    pub fn of(bytes: &[u8]) -> Self {
        Digest { hex: hex::encode(Sha256::digest(bytes)) }
    }

    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Fails unless `actual` is this digest.
    pub fn verify(&self, what: impl Into<String>, actual: &Digest) -> Result<()> {
        if self == actual {
            return Ok(());
        }
        Err(ImageError::DigestMismatch { what: what.into(), expected: self.to_string(), actual: actual.to_string() })
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// Hashes everything read through it.
pub struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> Hashing<R> {
    pub fn new(inner: R) -> Self {
        Hashing { inner, hasher: Sha256::new(), count: 0 }
    }

    /// Bytes read so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Reads what is left (so the digest covers the whole stream), then returns it.
    pub fn finish(self) -> io::Result<(Digest, u64)> {
        let (_, digest, count) = self.finish_into()?;
        Ok((digest, count))
    }

    /// Like [`Hashing::finish`], also giving back the reader.
    pub fn finish_into(mut self) -> io::Result<(R, Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((self.inner, Digest { hex: hex::encode(self.hasher.finalize()) }, self.count))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_sha256_hex() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Digest::parse(empty).unwrap(), Digest::of(b""));
        assert_eq!(Digest::parse(empty).unwrap().to_string(), empty);
        for bad in ["sha256:../../etc", "sha256:E3B0", "e3b0", "sha512:00", &format!("{empty}0")] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hashing_reads_to_the_end() {
        let mut reader = Hashing::new(&b"hello world"[..]);
        let mut first = [0u8; 5];
        reader.read_exact(&mut first).unwrap();
        let (digest, count) = reader.finish().unwrap();
        assert_eq!((digest, count), (Digest::of(b"hello world"), 11));
    }
}
