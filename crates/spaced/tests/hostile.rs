//! Malformed input: the stream gets an error or is closed, and the daemon keeps serving.

mod common;

use bytes::Bytes;
use common::{Daemon, guarded};
use futures::{SinkExt, StreamExt};
use space_proto::{AgentClient, DataChannel, ErrorKind, Frame, FramedStream, Reply, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The stream's outcome: `Some(kind)` for an error reply, `None` if closed without one.
async fn outcome(stream: &mut FramedStream) -> Option<ErrorKind> {
    match stream.next().await {
        Some(Ok(frame)) => match frame.parse::<Reply>() {
            Ok(Reply::Error { kind, .. }) => Some(kind),
            other => panic!("unexpected reply {other:?}"),
        },
        Some(Err(_)) | None => None,
    }
}

async fn assert_still_serving(client: &AgentClient) {
    let health = client.health().await.expect("daemon still serving");
    assert!(!health.agent_version.is_empty());
}

#[tokio::test]
async fn malformed_requests_get_invalid_input() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let bad_messages: [&[u8]; 6] = [
            b"{not json",
            b"{\"op\":\"no_such_op\"}",
            b"{\"op\":\"exec\",\"argv\":\"not a list\"}",
            b"{\"op\":\"signal\",\"pid\":-1,\"signal\":9}",
            b"[]",
            b"",
        ];
        for bad in bad_messages {
            let mut stream = client.open_stream().await.unwrap();
            stream.send(Frame::Message(Bytes::from_static(bad))).await.unwrap();
            assert_eq!(outcome(&mut stream).await, Some(ErrorKind::InvalidInput), "{:?}", String::from_utf8_lossy(bad));
        }
        // Data before any request.
        let mut stream = client.open_stream().await.unwrap();
        stream.send(Frame::Data(DataChannel::Stdin, Bytes::from_static(b"x"))).await.unwrap();
        assert_eq!(outcome(&mut stream).await, Some(ErrorKind::InvalidInput));
        assert_still_serving(&client).await;
    })
    .await;
}

#[tokio::test]
async fn malformed_frames_get_an_error_or_closure() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let raw_inputs: [&[u8]; 4] = [
            &[9, 0, 0, 0, 0, 0],                   // unknown frame kind
            &[1, 7, 1, 0, 0, 0, b'x'],             // unknown data channel
            &[0, 0, 0xff, 0xff, 0xff, 0xff],       // a 4 GiB message
            &[1, 1, 0xff, 0xff, 0xff, 0x7f, 1, 2], // a 2 GiB data frame
        ];
        for raw in raw_inputs {
            let mut stream = client.open_stream().await.unwrap();
            stream.get_mut().write_all(raw).await.unwrap();
            stream.get_mut().flush().await.unwrap();
            let result = outcome(&mut stream).await;
            assert!(matches!(result, Some(ErrorKind::InvalidInput) | None), "{raw:?}: {result:?}");
        }
        // A truncated frame followed by the client closing its side.
        let mut stream = client.open_stream().await.unwrap();
        stream.get_mut().write_all(&[0, 0, 100, 0, 0, 0, b'{']).await.unwrap();
        stream.get_mut().shutdown().await.unwrap();
        let result = outcome(&mut stream).await;
        assert!(matches!(result, Some(ErrorKind::InvalidInput) | None), "{result:?}");
        assert_still_serving(&client).await;
    })
    .await;
}

#[tokio::test]
async fn wrong_frames_inside_conversations() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        // An upload that sends stdout data.
        let path = daemon.path("upload.bin");
        let mut stream = client.open_stream().await.unwrap();
        space_proto::send_message(
            &mut stream,
            &Request::WriteFile { path: path.clone(), mode: None, metadata: Default::default() },
        )
        .await
        .unwrap();
        stream.send(Frame::Data(DataChannel::Stdout, Bytes::from_static(b"x"))).await.unwrap();
        assert_eq!(outcome(&mut stream).await, Some(ErrorKind::InvalidInput));
        assert!(!std::path::Path::new(&path).exists());

        // An exec that gets garbage input: error, and the process is killed.
        let mut stream = client.open_stream().await.unwrap();
        let spec = common::spec(&["sleep", "30"]);
        space_proto::send_message(&mut stream, &Request::Exec(spec)).await.unwrap();
        let Some(Ok(frame)) = stream.next().await else { panic!("no reply") };
        let Ok(Reply::Started { pid }) = frame.parse::<Reply>() else { panic!("not started") };
        stream.send(Frame::Message(Bytes::from_static(b"{\"type\":\"bogus\"}"))).await.unwrap();
        assert_eq!(outcome(&mut stream).await, Some(ErrorKind::InvalidInput));
        loop {
            let processes = client.processes().await.unwrap();
            if processes.iter().any(|p| p.pid == pid && p.exit.is_some()) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_still_serving(&client).await;
    })
    .await;
}

#[tokio::test]
async fn garbage_connections_do_not_stop_the_daemon() {
    let daemon = Daemon::start();
    guarded(async {
        let socket = daemon.dir().join("spaced.sock");
        // A bad hello.
        let mut conn = tokio::net::UnixStream::connect(&socket).await.unwrap();
        conn.write_all(&[0, 0, 0xff, 0xff, 0, 0]).await.unwrap();
        let mut sink = Vec::new();
        let _ = conn.read_to_end(&mut sink).await; // the daemon hangs up
        // A valid hello followed by garbage instead of yamux.
        let mut conn = tokio::net::UnixStream::connect(&socket).await.unwrap();
        space_proto::handshake(&mut conn, "fuzzer").await.unwrap();
        conn.write_all(&[0xde; 4096]).await.unwrap();
        let _ = conn.read_to_end(&mut sink).await;
        // A connection that goes away mid-way.
        drop(tokio::net::UnixStream::connect(&socket).await.unwrap());

        let client = daemon.client().await;
        assert_still_serving(&client).await;
        let out = common::run(&client, common::spec(&["echo", "alive"])).await;
        assert_eq!(common::text(&out.stdout), "alive\n");
    })
    .await;
}

#[tokio::test]
async fn many_concurrent_streams_and_connections() {
    let daemon = Daemon::start();
    guarded(async {
        let clients = [daemon.client().await, daemon.client().await];
        let mut tasks = Vec::new();
        for i in 0..40 {
            let client = clients[i % 2].clone();
            tasks.push(tokio::spawn(async move {
                let out = common::run(&client, common::sh(&format!("echo {i}"))).await;
                assert_eq!(common::text(&out.stdout), format!("{i}\n"));
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
}

/// Descriptors the daemon holds, by target (pipes, ptys, files...).
fn open_fds(pid: u32) -> Vec<String> {
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|t| t.to_string_lossy().into_owned())
        .collect();
    fds.sort();
    fds
}

#[tokio::test]
async fn no_descriptor_leaks() {
    let daemon = Daemon::start();
    guarded(async {
        let client = daemon.client().await;
        let round = || async {
            common::run(&client, common::sh("echo hi; echo err >&2")).await;
            common::run(&client, common::spec(&["no-such-binary"])).await;
            let mut tty = common::spec(&["true"]);
            tty.tty = Some(space_proto::PtySize { rows: 2, cols: 2 });
            common::run(&client, tty).await;
            let mut stdin = common::spec(&["cat"]);
            stdin.stdin = true;
            let session = client.exec(stdin).await.unwrap();
            session.input().close_stdin().await.unwrap();
            session.wait_with_output(16).await.unwrap();
            let path = daemon.path("f");
            let data = futures::stream::iter([Ok(Bytes::from_static(b"x"))]);
            client.write_file(&path, None, data).await.unwrap();
            let (_, chunks) = client.read_file(&path).await.unwrap();
            let _: Vec<_> = chunks.collect().await;
            drop(client.watch(&daemon.path(""), true).await.unwrap());
        };
        round().await;
        let before = open_fds(daemon.pid());
        for _ in 0..10 {
            round().await;
        }
        // Streams end asynchronously: give them a moment to settle (a readiness wait).
        let mut after = open_fds(daemon.pid());
        for _ in 0..500 {
            if after.len() <= before.len() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            after = open_fds(daemon.pid());
        }
        assert!(after.len() <= before.len(), "descriptors leaked:\nbefore {before:?}\nafter {after:?}");
    })
    .await;
}
