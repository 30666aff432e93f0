//! Against the store scripts/with-s3.sh started (SPACE_TEST_S3_URL) when it is set, a
//! temporary directory otherwise: scripts/test.sh runs them both ways.

use super::*;

struct TestStore {
    blobs: BlobStore,
    _dir: tempfile::TempDir,
}

/// The store under test, with a directory of its own (its blobs, or its prefix in the bucket).
fn test_store() -> TestStore {
    let dir = tempfile::tempdir().unwrap();
    TestStore { blobs: store_under_test(dir.path()), _dir: dir }
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::fill(&mut data[..]);
    data
}

async fn overwrite(blobs: &BlobStore, blob: &BlobRef, data: Vec<u8>) {
    blobs.replace_object(blob, data).await.unwrap();
}

#[tokio::test]
async fn a_file_of_several_chunks_comes_back_whole_under_its_sha256() {
    let t = test_store();
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(CHUNK + (1 << 20) + 7);
    let source = dir.path().join("send-stream");
    std::fs::write(&source, &data).unwrap();

    let blob = t.blobs.put_file(&source).await.unwrap();
    assert_eq!(blob, BlobRef { sha256: hex::encode(Sha256::digest(&data)), size: data.len() as u64 });
    assert!(t.blobs.exists(&blob).await.unwrap());
    let back = dir.path().join("back");
    t.blobs.get_to_file(&blob, &back).await.unwrap();
    assert!(std::fs::read(&back).unwrap() == data, "the bytes read back differ");
    t.blobs.delete(&blob).await.unwrap();
    assert!(!t.blobs.exists(&blob).await.unwrap());
}

#[tokio::test]
async fn the_same_bytes_are_one_object() {
    let t = test_store();
    let data = random_bytes(4096);
    let first = t.blobs.put_bytes(Bytes::from(data.clone())).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("same"), &data).unwrap();
    assert_eq!(t.blobs.put_file(&dir.path().join("same")).await.unwrap(), first);
    assert_eq!(t.blobs.put_bytes(Bytes::from(data.clone())).await.unwrap(), first);
    assert_eq!(t.blobs.get_bytes(&first).await.unwrap(), data);
    t.blobs.delete(&first).await.unwrap();
    // Deleting what is gone is fine.
    t.blobs.delete(&first).await.unwrap();
}

#[tokio::test]
async fn a_corrupted_object_is_reported_and_never_handed_back() {
    let t = test_store();
    let data = random_bytes(64 << 10);
    let blob = t.blobs.put_bytes(Bytes::from(data.clone())).await.unwrap();
    let mut flipped = data.clone();
    flipped[1000] ^= 0x01;
    overwrite(&t.blobs, &blob, flipped.clone()).await;

    let err = t.blobs.get_bytes(&blob).await.unwrap_err();
    match &err {
        BlobError::Corrupt { expected, actual_sha256, actual_size, .. } => {
            assert_eq!(expected, &blob);
            assert_eq!((actual_sha256.as_str(), *actual_size), (&*hex::encode(Sha256::digest(&flipped)), blob.size));
        }
        other => panic!("{other:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("restored");
    assert!(matches!(t.blobs.get_to_file(&blob, &dest).await, Err(BlobError::Corrupt { .. })));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing of a corrupt object stays");
    t.blobs.delete(&blob).await.unwrap();
}

#[tokio::test]
async fn a_truncated_or_lengthened_object_is_corrupt() {
    let t = test_store();
    let data = random_bytes(10_000);
    let blob = t.blobs.put_bytes(Bytes::from(data.clone())).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (what, replaced) in [("truncated", data[..9_999].to_vec()), ("lengthened", [&data[..], b"x"].concat())] {
        overwrite(&t.blobs, &blob, replaced.clone()).await;
        match t.blobs.get_to_file(&blob, &dir.path().join(what)).await {
            Err(BlobError::Corrupt { actual_size, .. }) => assert_eq!(actual_size, replaced.len() as u64, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
        // An object of another size is not the blob (one of the right size is refused on read).
        assert!(!t.blobs.exists(&blob).await.unwrap(), "{what}");
    }
    t.blobs.delete(&blob).await.unwrap();
}

#[tokio::test]
async fn an_object_that_was_never_stored_is_missing() {
    let t = test_store();
    let blob = BlobRef { sha256: hex::encode(Sha256::digest(b"never stored")), size: 12 };
    assert!(matches!(t.blobs.get_bytes(&blob).await, Err(BlobError::Missing { .. })));
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(t.blobs.get_to_file(&blob, &dir.path().join("x")).await, Err(BlobError::Missing { .. })));
    assert!(!t.blobs.exists(&blob).await.unwrap());
}

#[test]
fn urls_that_name_no_store_are_refused_with_what_to_write() {
    let key = || Some(Credentials { access_key_id: "k".into(), secret_access_key: "s".into() });
    for (url, says) in [
        ("ftp://host/x", "unknown scheme"),
        ("relative/dir", "give a directory"),
        ("s3://?endpoint=http://127.0.0.1:1", "no bucket"),
        ("s3://user:secret@bucket?endpoint=http://127.0.0.1:1", "do not belong in the URL"),
        ("s3://bucket?endpoint=http://127.0.0.1:1&colour=blue", "unknown parameter"),
        ("file://otherhost/dir", "on this host"),
    ] {
        match BlobStore::open_with(url, key()) {
            Err(BlobError::BadUrl { reason, .. }) => assert!(reason.contains(says), "{url}: {reason}"),
            other => panic!("{url}: {other:?}"),
        }
    }
    match BlobStore::open_with("s3://bucket?endpoint=http://127.0.0.1:1", None) {
        Err(BlobError::BadUrl { reason, .. }) => assert!(reason.contains("AWS_ACCESS_KEY_ID"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_store_nobody_answers_for_is_an_error_of_the_store() {
    // A loopback port nothing listens on: refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("s3://bucket?endpoint=http://127.0.0.1:{port}");
    let key = Credentials { access_key_id: "k".into(), secret_access_key: "s".into() };
    let blobs = BlobStore::open_with(&url, Some(key)).unwrap();
    let err = blobs.put_bytes(Bytes::from_static(b"data")).await.unwrap_err();
    assert!(matches!(err, BlobError::Store(_)), "{err:?}");
}

#[tokio::test]
async fn a_hash_that_is_not_64_hex_digits_names_no_object_and_panics_nothing() {
    let t = test_store();
    let dir = tempfile::tempdir().unwrap();
    let too_long = "a".repeat(65);
    // A multi-byte character across the key's two-digit prefix, a path, upper case, short.
    for bad in ["éa", "../../../../etc/passwd", &"A".repeat(64), "ab", "", &too_long] {
        let blob = BlobRef { sha256: bad.into(), size: 1 };
        assert!(matches!(BlobStore::key(&blob), Err(BlobError::BadRef { .. })), "{bad:?}");
        assert!(matches!(t.blobs.exists(&blob).await, Err(BlobError::BadRef { .. })), "{bad:?}");
        let got = t.blobs.get_to_file(&blob, &dir.path().join("x")).await;
        assert!(matches!(got, Err(BlobError::BadRef { .. })), "{bad:?}: {got:?}");
        assert!(matches!(t.blobs.delete(&blob).await, Err(BlobError::BadRef { .. })), "{bad:?}");
    }
}

#[tokio::test]
async fn a_fetched_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let t = test_store();
    let blob = t.blobs.put_bytes(Bytes::from_static(b"memory of a sandbox")).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("pages-1.img");
    // A stale partial download of another mode is not reused.
    std::fs::write(dir.path().join("pages-1.img.partial"), "stale").unwrap();
    std::fs::set_permissions(dir.path().join("pages-1.img.partial"), std::fs::Permissions::from_mode(0o644)).unwrap();
    t.blobs.get_to_file(&blob, &dest).await.unwrap();
    let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(std::fs::read(&dest).unwrap(), b"memory of a sandbox");
    // Files of one stem fetched side by side do not share a partial file.
    let (img, log) = (dir.path().join("dump.img"), dir.path().join("dump.log"));
    let (a, b) = tokio::join!(t.blobs.get_to_file(&blob, &img), t.blobs.get_to_file(&blob, &log));
    a.unwrap();
    b.unwrap();
    let expected = b"memory of a sandbox".to_vec();
    assert_eq!((std::fs::read(&img).unwrap(), std::fs::read(&log).unwrap()), (expected.clone(), expected));
    t.blobs.delete(&blob).await.unwrap();
}

#[tokio::test]
async fn a_sweep_deletes_old_objects_no_export_names_and_keeps_the_rest() {
    let t = test_store();
    let (kept, dropped) = (random_bytes(1000), random_bytes(3000));
    let kept = t.blobs.put_bytes(Bytes::from(kept)).await.unwrap();
    let dropped = t.blobs.put_bytes(Bytes::from(dropped)).await.unwrap();
    let keep: std::collections::HashSet<String> = [kept.sha256.clone()].into();

    // Too young to judge: an export may be storing it and not yet recorded.
    let (hour, zero) = (std::time::Duration::from_secs(3600), std::time::Duration::ZERO);
    let young = t.blobs.sweep(&keep, hour, hour).await.unwrap();
    assert_eq!(young, BlobSweep { deleted_objects: 0, deleted_bytes: 0, kept_objects: 2, complete: true });
    assert!(t.blobs.exists(&dropped).await.unwrap());

    let out_of_time = t.blobs.sweep(&keep, zero, zero).await.unwrap();
    assert_eq!(out_of_time, BlobSweep::default(), "no time: nothing looked at");
    assert!(t.blobs.exists(&dropped).await.unwrap());

    // An object's age is the store's clock against this host's: a store a few seconds ahead
    // must not make the test flaky, so age zero is judged a little later.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let swept = t.blobs.sweep(&keep, zero, hour).await.unwrap();
    assert_eq!(swept, BlobSweep { deleted_objects: 1, deleted_bytes: 3000, kept_objects: 1, complete: true });
    assert!(!t.blobs.exists(&dropped).await.unwrap());
    assert!(t.blobs.exists(&kept).await.unwrap());
    t.blobs.get_bytes(&kept).await.expect("what is kept reads back whole");
    t.blobs.delete(&kept).await.unwrap();
}

/// A file stored in one pass comes back under its hash, leaves nothing in `incoming/`, and
/// may be stored twice; an upload cut short is left in `incoming/` until a sweep finds it old.
#[tokio::test]
async fn a_file_stored_in_one_pass_lands_under_its_hash_and_a_leftover_upload_is_swept() {
    let t = test_store();
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(CHUNK * 2 + 11);
    let source = dir.path().join("sealed");
    std::fs::write(&source, &data).unwrap();

    let blob = t.blobs.put_file_once(&source).await.unwrap();
    assert_eq!(blob, BlobRef { sha256: hex::encode(Sha256::digest(&data)), size: data.len() as u64 });
    assert_eq!(t.blobs.put_file_once(&source).await.unwrap(), blob, "the same bytes again");
    assert_eq!(t.blobs.get_bytes(&blob).await.unwrap(), data);
    let incoming = |blobs: &BlobStore| {
        let blobs = blobs.clone();
        async move {
            futures::TryStreamExt::try_collect::<Vec<_>>(blobs.store.list(Some(&Key::from(INCOMING))))
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(incoming(&t.blobs).await, 0, "nothing stays in incoming/");

    let cut_short = format!("{INCOMING}/{}", "0f".repeat(16));
    t.blobs.store.put(&Key::from(cut_short), PutPayload::from(vec![1u8; 5])).await.unwrap();
    let not_ours = Key::from(format!("{INCOMING}/notes.txt"));
    t.blobs.store.put(&not_ours, PutPayload::from(vec![2u8; 3])).await.unwrap();
    let keep: std::collections::HashSet<String> = [blob.sha256.clone()].into();
    let (hour, zero) = (std::time::Duration::from_secs(3600), std::time::Duration::ZERO);
    let young = t.blobs.sweep(&keep, hour, hour).await.unwrap();
    assert_eq!((young.deleted_objects, young.kept_objects), (0, 2), "an upload may be under way");
    // As in the sweep test above: age zero is judged a little later than the store's clock.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let swept = t.blobs.sweep(&keep, zero, hour).await.unwrap();
    assert_eq!(swept, BlobSweep { deleted_objects: 1, deleted_bytes: 5, kept_objects: 1, complete: true });
    assert_eq!(incoming(&t.blobs).await, 1, "what is not an upload's is left alone");
    t.blobs.store.delete(&not_ours).await.unwrap();
    t.blobs.delete(&blob).await.unwrap();
}
