use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

fn sealer(dir: &Path, name: &str) -> Sealer {
    Sealer::local(&dir.join("keys").join(name)).unwrap()
}

/// A provider that counts its unwraps and can be switched off, as a revoked KMS key.
struct Counting {
    inner: LocalKeyFile,
    unwraps: AtomicUsize,
    revoked: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl KeyProvider for Counting {
    async fn wrap(&self, data_key: &[u8]) -> Result<Vec<u8>> {
        self.inner.wrap(data_key).await
    }
    async fn unwrap(&self, wrapped: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
        if self.revoked.load(Ordering::SeqCst) {
            return Err(KeyError::Unavailable { key: self.describe(), why: "revoked".into() });
        }
        self.unwraps.fetch_add(1, Ordering::SeqCst);
        self.inner.unwrap(wrapped).await
    }
    fn describe(&self) -> String {
        "the counting key".into()
    }
}

fn counting(dir: &Path) -> Arc<Counting> {
    let inner = LocalKeyFile::open_or_create(&dir.join("counting.key")).unwrap();
    Arc::new(Counting { inner, unwraps: AtomicUsize::new(0), revoked: false.into() })
}

#[tokio::test]
async fn round_trip_with_fresh_data_keys() {
    let dir = tempfile::tempdir().unwrap();
    let s = sealer(dir.path(), "master.key");
    let a = s.seal(b"hunter2", "ten_1/cred_1").await.unwrap();
    let b = s.seal(b"hunter2", "ten_1/cred_1").await.unwrap();
    assert_ne!(a, b, "every seal uses a fresh data key and nonce");
    assert!(!a.windows(7).any(|w| w == b"hunter2"));
    assert_eq!(key_ref_of(&a).unwrap(), LOCAL_KEY_REF);
    assert_eq!(&s.open(&a, "ten_1/cred_1").await.unwrap()[..], b"hunter2");
    assert_eq!(&s.open(&s.seal(b"", "o").await.unwrap(), "o").await.unwrap()[..], b"");
    // Reopening the same file gives the same key.
    let again = sealer(dir.path(), "master.key");
    assert_eq!(&again.open(&a, "ten_1/cred_1").await.unwrap()[..], b"hunter2");
}

/// A value written in version 1 (before key refs) opens, as the local key's.
#[tokio::test]
async fn version_one_values_are_the_local_keys() {
    let dir = tempfile::tempdir().unwrap();
    let s = sealer(dir.path(), "master.key");
    let v2 = s.seal(b"old secret", "o").await.unwrap();
    let parsed = parse(&v2).unwrap().unwrap();
    let mut v1 = vec![1u8];
    v1.extend_from_slice(&(parsed.wrapped.len() as u16).to_be_bytes());
    v1.extend_from_slice(parsed.wrapped);
    v1.extend_from_slice(parsed.body);
    assert_eq!(key_ref_of(&v1).unwrap(), LOCAL_KEY_REF);
    assert_eq!(&s.open(&v1, "o").await.unwrap()[..], b"old secret");
}

#[tokio::test]
async fn wrong_key_says_which_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let sealed = sealer(dir.path(), "a.key").seal(b"v", "o").await.unwrap();
    let err = sealer(dir.path(), "b.key").open(&sealed, "o").await.unwrap_err();
    assert!(matches!(err, KeyError::WrongKey { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("b.key") && message.contains("restore"), "{message}");
    // A value that names another key ref is refused without asking the provider.
    let other = Sealer::new("tk_other", counting(dir.path()), Duration::ZERO).unwrap();
    let err = other.open(&sealed, "o").await.unwrap_err();
    assert!(matches!(err, KeyError::WrongKey { .. }), "{err}");
}

#[tokio::test]
async fn tampering_and_wrong_owner_fail() {
    let dir = tempfile::tempdir().unwrap();
    let s = sealer(dir.path(), "k");
    let sealed = s.seal(b"secret value", "ten_1/cred_1").await.unwrap();
    let header = 2 + LOCAL_KEY_REF.len() + 2;
    for i in [sealed.len() - 1, sealed.len() - 20, header + 8 + 5] {
        let mut bad = sealed.clone();
        bad[i] ^= 1;
        assert!(s.open(&bad, "ten_1/cred_1").await.is_err(), "flipped byte {i}");
    }
    assert!(matches!(s.open(&sealed, "ten_2/cred_1").await, Err(KeyError::Corrupt { .. })));
    for len in [0, 1, 3, 10] {
        assert!(s.open(&sealed[..len], "ten_1/cred_1").await.is_err(), "cut to {len}");
    }
    let mut other_version = sealed.clone();
    other_version[0] = 9;
    assert!(matches!(s.open(&other_version, "ten_1/cred_1").await, Err(KeyError::UnsupportedVersion(9))));
}

/// Re-wrapping moves a value to another key without touching its body; the old key no longer
/// opens it, and the new one does.
#[tokio::test]
async fn rewrap_moves_the_data_key_and_keeps_the_body() {
    let dir = tempfile::tempdir().unwrap();
    let local = sealer(dir.path(), "master.key");
    let tenant = Sealer::new("tk_1", counting(dir.path()), Duration::ZERO).unwrap();
    let sealed = local.seal(b"ghp_secret", "credential/t/c").await.unwrap();
    let moved = local.rewrap(&sealed, &tenant).await.unwrap();
    assert_eq!(key_ref_of(&moved).unwrap(), "tk_1");
    assert!(moved.ends_with(parse(&sealed).unwrap().unwrap().body), "the body is not re-encrypted");
    assert_eq!(&tenant.open(&moved, "credential/t/c").await.unwrap()[..], b"ghp_secret");
    assert!(matches!(local.open(&moved, "credential/t/c").await, Err(KeyError::WrongKey { .. })));
    // Rewrapping under the same key (a rotation) keeps it openable.
    let again = tenant.rewrap(&moved, &tenant).await.unwrap();
    assert_eq!(&tenant.open(&again, "credential/t/c").await.unwrap()[..], b"ghp_secret");
    // Only the key that wraps it can move it.
    assert!(matches!(local.rewrap(&moved, &tenant).await, Err(KeyError::WrongKey { .. })));
}

/// Unwrapped data keys are kept for the TTL and no longer: a revoked key still opens what
/// was opened within the TTL, and nothing after it.
#[tokio::test]
async fn data_keys_are_cached_for_the_ttl_only() {
    let dir = tempfile::tempdir().unwrap();
    let provider = counting(dir.path());
    let cached = Sealer::new("tk_1", provider.clone(), Duration::from_secs(3600)).unwrap();
    let sealed = cached.seal(b"v", "o").await.unwrap();
    cached.open(&sealed, "o").await.unwrap();
    cached.open(&sealed, "o").await.unwrap();
    assert_eq!(provider.unwraps.load(Ordering::SeqCst), 1, "the second open used the cached key");
    provider.revoked.store(true, Ordering::SeqCst);
    cached.open(&sealed, "o").await.unwrap();

    let short = Sealer::new("tk_1", provider.clone(), Duration::from_millis(1)).unwrap();
    provider.revoked.store(false, Ordering::SeqCst);
    short.open(&sealed, "o").await.unwrap();
    provider.revoked.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(5));
    short.forget_expired();
    assert!(short.cache.lock().is_empty(), "an expired key is dropped");
    let err = short.open(&sealed, "o").await.unwrap_err();
    assert!(matches!(err, KeyError::Unavailable { .. }), "{err}");

    let uncached = Sealer::new("tk_1", provider.clone(), Duration::ZERO).unwrap();
    provider.revoked.store(false, Ordering::SeqCst);
    uncached.open(&sealed, "o").await.unwrap();
    assert!(uncached.cache.lock().is_empty(), "a zero TTL keeps nothing");
}

#[tokio::test]
async fn check_round_trips_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let provider = counting(dir.path());
    let s = Sealer::new("tk_1", provider.clone(), Duration::ZERO).unwrap();
    s.check().await.unwrap();
    provider.revoked.store(true, Ordering::SeqCst);
    assert!(matches!(s.check().await, Err(KeyError::Unavailable { .. })));
    for bad in ["", "a b", &"x".repeat(65)] {
        assert!(matches!(Sealer::new(bad, provider.clone(), Duration::ZERO), Err(KeyError::Config(_))), "{bad:?}");
    }
}
