//! File operations and watches against the real daemon.

mod common;

use bytes::Bytes;
use common::{Daemon, guarded};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use space_proto::{AgentClient, ErrorKind, FileKind, WatchKind};

/// Deterministic pseudo-random bytes (xorshift), so a corrupted byte anywhere shows.
fn pseudo_random(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn kind<T>(result: Result<T, space_proto::AgentError>) -> Option<ErrorKind> {
    result.err().and_then(|e| e.kind())
}

async fn upload(client: &AgentClient, path: &str, mode: Option<u32>, data: &[u8]) -> u64 {
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        data.chunks(1 << 20).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    client.write_file(path, mode, futures::stream::iter(chunks)).await.expect("upload")
}

async fn download(client: &AgentClient, path: &str) -> (u64, Vec<u8>) {
    let (size, mut chunks) = client.read_file(path).await.expect("download");
    let mut data = Vec::new();
    while let Some(chunk) = chunks.next().await {
        data.extend_from_slice(&chunk.expect("chunk"));
    }
    (size, data)
}

#[tokio::test]
async fn large_file_round_trip() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let data = pseudo_random(50 << 20, 0x5eed);
        let digest = Sha256::digest(&data);
        let path = daemon.path("nested/dirs/big.bin");
        assert_eq!(upload(&client, &path, Some(0o600), &data).await, data.len() as u64);
        let stat = client.stat(&path).await.unwrap();
        assert_eq!((stat.kind, stat.size, stat.mode), (FileKind::File, data.len() as u64, 0o600));

        let (size, mut chunks) = client.read_file(&path).await.unwrap();
        assert_eq!(size, data.len() as u64);
        let mut hasher = Sha256::new();
        let mut received = 0usize;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.unwrap();
            received += chunk.len();
            hasher.update(&chunk);
        }
        assert_eq!(received, data.len());
        assert_eq!(hasher.finalize(), digest);
        // No temporary files are left next to the target.
        let names: Vec<_> = client.list_dir(&daemon.path("nested/dirs")).await.unwrap();
        assert_eq!(names.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["big.bin"]);
    })
    .await;
}

#[tokio::test]
async fn overwrite_empty_and_default_mode() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let path = daemon.path("f.txt");
        upload(&client, &path, None, b"first version").await;
        upload(&client, &path, None, b"second").await;
        assert_eq!(download(&client, &path).await, (6, b"second".to_vec()));
        assert_eq!(client.stat(&path).await.unwrap().mode, 0o644);
        let empty = daemon.path("empty");
        assert_eq!(upload(&client, &empty, Some(0o755), b"").await, 0);
        assert_eq!(download(&client, &empty).await, (0, Vec::new()));
        assert_eq!(client.stat(&empty).await.unwrap().mode, 0o755);
    })
    .await;
}

/// Metadata is stored as `user.e2b.*` attributes, shown by stat and listings (including
/// attributes set by anyone else under that prefix, and none outside it), and replaced whole
/// by the next upload.
#[tokio::test]
async fn uploads_keep_their_metadata_as_extended_attributes() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let health = client.health().await.unwrap();
        assert!(health.features.iter().any(|f| f == space_proto::file_metadata::FEATURE), "{health:?}");
        let path = daemon.path("described.txt");
        let metadata = space_proto::FileMetadata::from([("owner".into(), "agent 7".into()), ("n".into(), "1".into())]);
        let data = futures::stream::iter([Ok(Bytes::from_static(b"x"))]);
        assert_eq!(client.write_file_with_metadata(&path, None, metadata.clone(), data).await.unwrap(), 1);
        assert_eq!(xattr::get(&path, "user.e2b.owner").unwrap().as_deref(), Some(&b"agent 7"[..]));
        assert_eq!(client.stat(&path).await.unwrap().metadata, metadata);

        xattr::set(&path, "user.e2b.set_by", b"a program").unwrap();
        xattr::set(&path, "user.other", b"not metadata").unwrap();
        let listed = client.list_dir(&daemon.path("")).await.unwrap();
        let entry = listed.iter().find(|e| e.name == "described.txt").unwrap();
        assert_eq!(entry.metadata.keys().collect::<Vec<_>>(), ["n", "owner", "set_by"]);

        // What a program piles on is shown up to the upload limit, no further (on tmpfs, which
        // holds more attributes per file than ext4's 4 KiB).
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let piled = shm.path().join("piled");
        std::fs::write(&piled, b"x").unwrap();
        for n in 0..8 {
            xattr::set(&piled, format!("user.e2b.big{n}"), &[b'v'; 1024]).unwrap();
        }
        let shown = client.stat(piled.to_str().unwrap()).await.unwrap().metadata;
        let bytes: usize = shown.iter().map(|(k, v)| 9 + k.len() + v.len()).sum();
        assert!(!shown.is_empty() && bytes <= space_proto::file_metadata::MAX_TOTAL, "{bytes} bytes in {shown:?}");

        upload(&client, &path, None, b"replaced").await;
        assert!(client.stat(&path).await.unwrap().metadata.is_empty());
        assert!(xattr::list(&path).unwrap().next().is_none());
    })
    .await;
}

/// Metadata the agent cannot store is refused before anything is written.
#[tokio::test]
async fn unstorable_metadata_writes_nothing() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let path = daemon.path("refused.txt");
        for (key, value) in [("tab\there", "v"), ("k", "caf\u{e9}"), ("", "v")] {
            let metadata = space_proto::FileMetadata::from([(key.to_owned(), value.to_owned())]);
            let data = futures::stream::iter([Ok(Bytes::from_static(b"x"))]);
            let refused = client.write_file_with_metadata(&path, None, metadata, data).await;
            assert_eq!(kind(refused), Some(ErrorKind::InvalidInput), "{key:?}={value:?}");
        }
        assert_eq!(kind(client.stat(&path).await), Some(ErrorKind::NotFound));
    })
    .await;
}

#[tokio::test]
async fn failed_upload_leaves_no_file() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let path = daemon.path("partial.bin");
        let chunks = vec![Ok(Bytes::from_static(b"some data")), Err(std::io::Error::other("source failed"))];
        let err = client.write_file(&path, None, futures::stream::iter(chunks)).await.unwrap_err();
        assert!(matches!(err, space_proto::AgentError::Io(_)), "{err:?}");
        // The daemon notices the abandoned stream asynchronously: wait for the temp file to go.
        loop {
            let entries = client.list_dir(&daemon.path("")).await.unwrap();
            if entries.iter().all(|e| !e.name.starts_with(".spaced-upload")) {
                assert!(entries.iter().all(|e| e.name != "partial.bin"));
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // Writing over a directory is refused before any data is sent.
        let err = client.write_file(&daemon.path(""), None, futures::stream::empty()).await.unwrap_err();
        assert_eq!(err.kind(), Some(ErrorKind::IsADirectory));
    })
    .await;
}

#[tokio::test]
async fn directory_operations_and_error_kinds() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let p = |name: &str| daemon.path(name);
        client.make_dir(&p("a/b/c")).await.unwrap();
        client.make_dir(&p("a/b/c")).await.unwrap(); // mkdir -p: existing is fine
        upload(&client, &p("a/z.txt"), None, b"z").await;
        upload(&client, &p("a/m.txt"), None, b"mm").await;
        std::os::unix::fs::symlink("m.txt", daemon.dir().join("a/link")).unwrap();

        let entries = client.list_dir(&p("a")).await.unwrap();
        let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["b", "link", "m.txt", "z.txt"]);
        assert_eq!(entries[0].kind, FileKind::Dir);
        assert_eq!(entries[1].kind, FileKind::Symlink);
        assert_eq!(entries[1].symlink_target.as_deref(), Some("m.txt"));
        assert_eq!(entries[2].size, 2);

        client.move_path(&p("a/z.txt"), &p("a/b/c/moved.txt")).await.unwrap();
        assert_eq!(download(&client, &p("a/b/c/moved.txt")).await.1, b"z");

        assert_eq!(kind(client.stat(&p("a/z.txt")).await), Some(ErrorKind::NotFound));
        assert_eq!(kind(client.read_file(&p("a")).await), Some(ErrorKind::IsADirectory));
        assert_eq!(kind(client.list_dir(&p("a/m.txt")).await), Some(ErrorKind::NotADirectory));
        assert_eq!(kind(client.make_dir(&p("a/m.txt")).await), Some(ErrorKind::AlreadyExists));
        assert_eq!(kind(client.remove(&p("a"), false).await), Some(ErrorKind::DirectoryNotEmpty));
        assert_eq!(kind(client.remove("/", true).await), Some(ErrorKind::InvalidInput));
        assert_eq!(kind(client.remove("/tmp/..", true).await), Some(ErrorKind::InvalidInput));
        assert_eq!(kind(client.stat("").await), Some(ErrorKind::InvalidInput));
        assert_eq!(kind(client.move_path(&p("nope"), &p("x")).await), Some(ErrorKind::NotFound));

        client.remove(&p("a/link"), false).await.unwrap();
        assert_eq!(download(&client, &p("a/m.txt")).await.1, b"mm", "removing a link keeps its target");
        client.remove(&p("a"), true).await.unwrap();
        assert_eq!(kind(client.stat(&p("a")).await), Some(ErrorKind::NotFound));
    })
    .await;
}

#[tokio::test]
async fn relative_paths_are_relative_to_root() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let relative = daemon.path("rel.txt").trim_start_matches('/').to_owned();
        upload(&client, &relative, None, b"rel").await;
        assert_eq!(download(&client, &daemon.path("rel.txt")).await.1, b"rel");
        let root = client.stat("/").await.unwrap();
        assert_eq!((root.kind, root.name.as_str()), (FileKind::Dir, "/"));
    })
    .await;
}

#[tokio::test]
async fn watch_sees_changes_including_new_subdirectories() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let root = daemon.path("watched");
        client.make_dir(&root).await.unwrap();
        let mut events = client.watch(&root, true).await.unwrap();

        upload(&client, &format!("{root}/hello.txt"), None, b"hi").await;
        client.make_dir(&format!("{root}/sub")).await.unwrap();
        // Wait for the subdirectory event, so its watch exists before the next write.
        let mut seen = Vec::new();
        while !seen.iter().any(|(k, p): &(WatchKind, String)| *k == WatchKind::Create && p.ends_with("/sub")) {
            let event = events.next().await.expect("watch ended").expect("watch event");
            seen.push((event.kind, event.path));
        }
        upload(&client, &format!("{root}/sub/deep.txt"), None, b"deep").await;
        client.remove(&format!("{root}/hello.txt"), false).await.unwrap();
        let wanted = [
            (WatchKind::MovedTo, format!("{root}/hello.txt")),
            (WatchKind::MovedTo, format!("{root}/sub/deep.txt")),
            (WatchKind::Remove, format!("{root}/hello.txt")),
        ];
        while !wanted.iter().all(|w| seen.contains(w)) {
            let event = events.next().await.expect("watch ended").expect("watch event");
            seen.push((event.kind, event.path));
        }
    })
    .await;
}
