//! Files in real sandboxes: streamed round trips, listing, confinement to the sandbox root.

mod common;

use std::io::Write;

use common::Server;
use serde_json::json;
use sha2::{Digest, Sha256};

#[test]
fn large_file_round_trip_keeps_its_checksum() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({ "memory_mib": 256 }));
    let local = server.data_dir.join("upload.bin");
    let mut hash = Sha256::new();
    {
        let mut file = std::fs::File::create(&local).unwrap();
        let mut block = vec![0u8; 1 << 20];
        for i in 0..200u32 {
            for (j, b) in block.iter_mut().enumerate() {
                *b = (j as u32).wrapping_mul(2_654_435_761).wrapping_add(i) as u8;
            }
            hash.update(&block);
            file.write_all(&block).unwrap();
        }
    }
    let expected = hex::encode(hash.finalize());
    let out = server.cli(&["files", "put", &id, local.to_str().unwrap(), "/data/big.bin"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = server.exec(&id, &["sha256sum", "/data/big.bin"]);
    assert!(r["stdout"].as_str().unwrap().starts_with(&expected), "{r}");

    let back = server.data_dir.join("download.bin");
    let out = server.cli(&["files", "get", &id, "/data/big.bin", back.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = hex::encode(Sha256::digest(std::fs::read(&back).unwrap()));
    assert_eq!(got, expected);
}

#[test]
fn file_operations_and_errors() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let base = format!("/v1/sessions/{id}/files");
    let (status, _) = server.call("POST", &format!("{base}/mkdir"), Some(json!({ "path": "/work/a/b" })));
    assert_eq!(status, 204);
    server.exec(&id, &["sh", "-c", "echo hi > /work/a/b/f.txt"]);
    let (status, stat) = server.call("GET", &format!("{base}/stat?path=/work/a/b/f.txt"), None);
    assert_eq!((status, stat["type"].as_str(), stat["size"].as_u64()), (200, Some("file"), Some(3)));
    let (status, _) =
        server.call("POST", &format!("{base}/move"), Some(json!({ "from": "/work/a/b/f.txt", "to": "/work/g.txt" })));
    assert_eq!(status, 204);
    let (_, list) = server.call("GET", &format!("{base}/list?path=/work"), None);
    let names: Vec<&str> = list["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "g.txt"]);
    let (status, err) = server.call("DELETE", &format!("{base}?path=/work/a"), None);
    assert_eq!(status, 400, "non-empty dir without recursive: {err}");
    let (status, _) = server.call("DELETE", &format!("{base}?path=/work/a&recursive=true"), None);
    assert_eq!(status, 204);
    let (status, err) = server.call("GET", &format!("{base}/stat?path=/work/a"), None);
    assert_eq!((status, err["error"]["code"].as_str()), (404, Some("file_not_found")));

    let out = server.cli(&["files", "ls", &id, "/work"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("g.txt"));
}

#[test]
fn paths_resolve_inside_the_sandbox_never_on_the_host() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let marker = server.data_dir.join("host-secret.txt");
    std::fs::write(&marker, "host secret").unwrap();
    let marker = marker.to_str().unwrap().to_owned();
    server.exec(&id, &["ln", "-s", &marker, "/tmp/escape"]);
    let paths = ["/tmp/escape".to_owned(), format!("../../../..{marker}"), marker.clone()];
    for path in &paths {
        let (status, body) = server.call("GET", &format!("/v1/sessions/{id}/files/content?path={path}"), None);
        assert_eq!(status, 404, "{path} must not reach the host: {body}");
    }
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let (status, body) = server.call("GET", &format!("/v1/sessions/{id}/files/content?path=../../etc/passwd"), None);
    assert_eq!(status, 200);
    assert_ne!(body.as_str().unwrap_or_default(), host_passwd);
    assert!(body.as_str().unwrap_or_default().starts_with("root:"), "{body}");
}

#[test]
fn watch_reports_created_files() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    server.exec(&id, &["mkdir", "-p", "/watched"]);
    let mut watcher = std::process::Command::new(common::SPACE)
        .args(["files", "watch", &id, "/watched"])
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.key)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watcher.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    // A new file each round: the watch may start after the first ones, and touching an
    // existing file again would not be a creation.
    for round in 0..100 {
        server.exec(&id, &["touch", &format!("/watched/new-{round}.txt")]);
        if let Ok(line) = rx.recv_timeout(std::time::Duration::from_millis(100)) {
            seen.push(line);
            break;
        }
    }
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(seen.iter().any(|l| l.contains("/watched/new-")), "no watch event: {seen:?}");
}

/// Opens a watch WebSocket by hand (the handshake only; the connection is then held open):
/// the stream and the response's status line.
fn open_watch(server: &Server, id: &str) -> (std::net::TcpStream, String) {
    use std::io::{BufRead, Write};
    let address = server.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    let request = format!(
        "GET /v1/sessions/{id}/watch?path=/ HTTP/1.1\r\nHost: {address}\r\n{}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        server.auth()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut status = String::new();
    std::io::BufReader::new(stream.try_clone().unwrap()).read_line(&mut status).unwrap();
    (stream, status)
}

#[test]
fn watches_per_session_are_limited_and_given_back_when_closed() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let mut open = Vec::new();
    for _ in 0..8 {
        let (stream, status) = open_watch(&server, &id);
        assert!(status.starts_with("HTTP/1.1 101"), "{status}");
        open.push(stream);
    }
    let (_refused, status) = open_watch(&server, &id);
    assert!(status.starts_with("HTTP/1.1 429"), "the ninth watch of a session: {status}");
    drop(open);
    let given_back = (0..100).any(|_| {
        let (_stream, status) = open_watch(&server, &id);
        std::thread::sleep(std::time::Duration::from_millis(50));
        status.starts_with("HTTP/1.1 101")
    });
    assert!(given_back, "closed watches never gave their places back");
}
