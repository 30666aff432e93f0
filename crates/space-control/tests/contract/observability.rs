//! What an operator observes: the metrics listener (series, labels that never name a
//! session, robustness against bad scrapes), request ids, usage stats and the events of
//! snapshots, forks and restores.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use space_api::RuntimeKind;
use space_api::egress::AuditEvent;
use space_node_sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::Server;

/// The value of the series `line` (name and labels exactly), if the scrape has it.
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[track_caller]
fn at_least(metrics: &str, series: &str, min: f64) {
    match value(metrics, series) {
        Some(v) if v >= min => {}
        other => panic!("{series} is {other:?}, expected at least {min}; metrics:\n{metrics}"),
    }
}

async fn pooled_server() -> Server {
    let pool = BTreeMap::from([(("busybox".to_owned(), RuntimeKind::Linux), 1)]);
    let server = Server::start_with(SimConfig { pool, ..SimConfig::default() }).await;
    crate::lifecycle::wait_until(|| server.sim.sandboxes().iter().any(|s| s.pod)).await;
    server
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_lifecycle_work_without_naming_sessions() {
    let server = pooled_server().await;
    let warm = server.session().await;
    // With no pods the next create is cold (the pool would refill meanwhile otherwise).
    assert_eq!(server.call("PUT", "/v1/pool/busybox", Some(json!({ "size": 0 }))).await.0, 200);
    let cold = server.session().await;
    assert_eq!(server.exec(&warm, &["true"]).await.0, 200);
    let snapshot = server.snapshot(&warm, "full").await;
    let (status, body) = server.act(&warm, "restore", json!({ "snapshot": snapshot })).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.act(&warm, "fork", json!({ "from": snapshot, "count": 2 })).await;
    assert_eq!(status, 201, "{body}");
    let children: Vec<String> = body["sessions"].as_array().unwrap().iter().map(|s| s["id"].to_string()).collect();
    assert_eq!(server.call("GET", "/v1/sessions/ses_00000000000000000000", None).await.0, 404);
    assert_eq!(server.call("GET", &format!("/v1/sessions/{cold}/no-such-thing"), None).await.0, 404);

    let metrics = server.scrape().await;
    for (series, min) in [
        (
            r#"space_http_request_duration_seconds_count{method="POST",route="/v1/sessions/{id}/exec",status="200"}"#,
            1.0,
        ),
        (r#"space_http_request_duration_seconds_count{method="GET",route="/v1/sessions/{id}",status="404"}"#, 1.0),
        (r#"space_http_request_duration_seconds_count{method="GET",route="unmatched",status="404"}"#, 1.0),
        (r#"space_session_creates_total{start="warm",runtime="linux",result="ok"}"#, 1.0),
        (r#"space_session_creates_total{start="cold",runtime="linux",result="ok"}"#, 1.0),
        (r#"space_session_creates_total{start="snapshot",runtime="linux",result="ok"}"#, 2.0),
        (r#"space_session_create_duration_seconds_count{start="warm",runtime="linux"}"#, 1.0),
        (r#"space_snapshots_total{kind="full",runtime="linux",result="ok"}"#, 1.0),
        (r#"space_snapshot_duration_seconds_count{kind="full",runtime="linux"}"#, 1.0),
        (r#"space_snapshot_size_bytes_count{kind="full",runtime="linux"}"#, 1.0),
        (r#"space_restores_total{kind="full",runtime="linux",reason="restore",result="ok"}"#, 1.0),
        (r#"space_restores_total{kind="full",runtime="linux",reason="fork",result="ok"}"#, 2.0),
        (r#"space_restore_duration_seconds_count{kind="full",runtime="linux",reason="restore"}"#, 1.0),
        // Registered from the start (this server's schedule runs hourly).
        ("space_schedule_tick_duration_seconds_count", 0.0),
        // Read from this server's store and node at the scrape: exact.
        (r#"space_sessions{state="running"}"#, 4.0),
    ] {
        at_least(&metrics, series, min);
    }
    assert_eq!(value(&metrics, r#"space_sessions{state="running"}"#), Some(4.0), "{metrics}");
    let target = value(&metrics, r#"space_pool_target_pods{template="busybox",runtime="linux"}"#);
    assert_eq!(target, Some(0.0), "resized to 0: {metrics}");
    assert!(value(&metrics, r#"space_pool_ready_pods{template="busybox",runtime="linux"}"#).is_some(), "{metrics}");
    // No label names a session, sandbox or snapshot (of this or any other test's server).
    for id in [&warm, &cold, &snapshot].into_iter().chain(&children) {
        assert!(!metrics.contains(id.trim_matches('"')), "{id} is in the metrics");
    }
    for prefix in ["ses_", "sbx_", "snap_", "ten_", "node_"] {
        assert!(!metrics.contains(prefix), "an id ({prefix}…) is in the metrics:\n{metrics}");
    }
}

#[tokio::test]
async fn a_failed_snapshot_is_counted_as_an_error() {
    let server = Server::start().await;
    let id = server.session().await;
    server.sim.fail_next(space_node_sim::Op::SnapshotDisk, 1);
    let (status, body) = server.act(&id, "snapshots", json!({ "kind": "disk" })).await;
    assert_eq!(status, 503, "{body}");
    at_least(&server.scrape().await, r#"space_snapshots_total{kind="disk",runtime="linux",result="error"}"#, 1.0);
}

/// Sends `request` to `addr` as it is and returns what comes back before the server closes
/// (or 5 s pass).
async fn raw(url: &str, request: &[u8]) -> String {
    let addr = url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(request).await;
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response)).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn bad_scrapes_are_refused_and_affect_neither_the_metrics_nor_the_api() {
    let server = Server::start().await;
    let url = server.metrics_url.clone();
    let garbage = raw(&url, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n").await;
    assert!(garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"), "{garbage}");
    let huge = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n", "b".repeat(200 << 10));
    let answer = raw(&url, huge.as_bytes()).await;
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431"), "{answer}");
    let long = format!("GET /metrics?{} HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n", "q".repeat(20 << 10));
    assert!(raw(&url, long.as_bytes()).await.starts_with("HTTP/1.1 414"));
    let post =
        raw(&url, b"POST /metrics HTTP/1.1\r\nHost: x\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc").await;
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    let other = raw(&url, b"GET /v1/sessions HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n").await;
    assert!(other.starts_with("HTTP/1.1 404") && other.contains("only GET /metrics"), "{other}");
    // A scraper that connects and says nothing does not hold the others up.
    let _silent = tokio::net::TcpStream::connect(url.trim_start_matches("http://")).await.unwrap();

    assert!(server.scrape().await.contains("space_build_info"));
    assert_eq!(server.call("GET", "/v1/status", None).await.0, 200);
    // The API's listener has no /metrics: it is the operator's alone.
    assert_eq!(server.call("GET", "/metrics", None).await.0, 404);
}

#[tokio::test]
async fn every_response_has_a_request_id_and_a_sane_one_is_kept() {
    let server = Server::start().await;
    let id_of = |headers: &reqwest::header::HeaderMap| headers["x-request-id"].to_str().unwrap().to_owned();
    let (status, _, first) = server.send(&server.admin, "GET", "/v1/status", None, &[]).await;
    let (_, _, second) = server.send(&server.admin, "GET", "/v1/status", None, &[]).await;
    assert_eq!(status, 200);
    for id in [id_of(&first), id_of(&second)] {
        assert!(id.starts_with("req_") && id.len() == 28, "{id}");
    }
    assert_ne!(id_of(&first), id_of(&second));

    let kept = [("x-request-id", "trace-0af7651916cd43dd:1")];
    let (_, _, headers) = server.send(&server.admin, "GET", "/v1/status", None, &kept).await;
    assert_eq!(id_of(&headers), "trace-0af7651916cd43dd:1");
    let refused = [("x-request-id", "no spaces; or semicolons")];
    let (_, _, headers) = server.send(&server.admin, "GET", "/v1/status", None, &refused).await;
    assert!(id_of(&headers).starts_with("req_"), "{headers:?}");

    // Errors too: one the framework answers, one of authentication, one of the size limits.
    let (status, _, headers) = server.send("sk_wrong", "GET", "/v1/status", None, &[]).await;
    assert_eq!(status, 401);
    assert!(id_of(&headers).starts_with("req_"));
    let (status, _, headers) = server.send(&server.admin, "DELETE", "/v1/status", None, &[]).await;
    assert_eq!(status, 405);
    assert!(id_of(&headers).starts_with("req_"));
    let long = format!("/v1/status?q={}", "a".repeat(20 << 10));
    let (status, _, headers) = server.send(&server.admin, "GET", &long, None, &[]).await;
    assert_eq!(status, 414);
    assert!(id_of(&headers).starts_with("req_"));
}

fn traffic(session: &str, sent: u64, received: u64) -> AuditEvent {
    let mut event = AuditEvent::allowed(session.parse().unwrap(), 0, "https", "api.example.com", 443);
    (event.bytes_sent, event.bytes_received) = (sent, received);
    event
}

#[tokio::test]
async fn stats_report_memory_disk_snapshots_and_gateway_bytes() {
    let server = Server::start().await;
    let id = server.session().await;
    server.sim.emit_audit(traffic(&id, 300, 5000));
    server.sim.emit_audit(traffic(&id, 20, 0));
    server.snapshot(&id, "disk").await;
    server.snapshot(&id, "full").await;
    let (status, stats) = server.call("GET", &format!("/v1/sessions/{id}/stats"), None).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["network"], json!({ "bytes_out": 320, "bytes_in": 5000 }), "{stats}");
    assert_eq!(stats["disk"]["snapshots"], 2, "{stats}");
    assert!(stats["disk"]["snapshot_bytes"].is_u64() && stats["disk"]["used_bytes"].is_u64(), "{stats}");
    let sandbox = &stats["sandbox"];
    for field in ["memory_bytes", "memory_limit_bytes", "cpu_usage_ns", "pids", "oom_kills"] {
        assert!(sandbox[field].is_u64(), "{field}: {stats}");
    }
    assert!(sandbox.get("memory_peak_bytes").is_some(), "{stats}");

    // Destroyed: the gateway forgets the session and its counters.
    let (status, _) = server.call("DELETE", &format!("/v1/sessions/{id}"), None).await;
    assert_eq!(status, 200);
    assert!(!server.sim.has_egress(&id.parse().unwrap()));
}

/// The session's events other than state transitions.
async fn events(server: &Server, id: &str) -> Vec<Value> {
    let (status, body) = server.call("GET", &format!("/v1/sessions/{id}/events"), None).await;
    assert_eq!(status, 200, "{body}");
    body["events"].as_array().unwrap().iter().filter(|e| e["kind"] != "state").cloned().collect()
}

/// The events of a session's snapshots, forks and restores name what they made or used.
#[tokio::test]
async fn events_of_snapshots_forks_and_restores_name_their_snapshot_and_children() {
    let server = Server::start().await;
    let id = server.session().await;
    let (status, named) = server.act(&id, "snapshots", json!({ "kind": "disk", "name": "v1" })).await;
    assert_eq!(status, 201, "{named}");
    let snapshot = named["id"].as_str().unwrap().to_owned();
    assert_eq!(server.act(&id, "restore", json!({ "snapshot": snapshot })).await.0, 200);
    let (status, forked) = server.act(&id, "fork", json!({ "count": 2 })).await;
    assert_eq!(status, 201, "{forked}");
    let children: Vec<&str> =
        forked["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(server.act(&id, "suspend", json!({})).await.0, 200);
    assert_eq!(server.act(&id, "resume", json!({})).await.0, 200);

    let of_parent = events(&server, &id).await;
    let messages: Vec<(&str, &str)> =
        of_parent.iter().map(|e| (e["kind"].as_str().unwrap(), e["message"].as_str().unwrap_or_default())).collect();
    let find = |kind: &str| messages.iter().filter(move |(k, _)| *k == kind).map(|(_, m)| *m).collect::<Vec<_>>();
    assert_eq!(find("snapshot")[0], format!("snapshot {snapshot} (disk) named \"v1\" taken"), "{messages:?}");
    assert_eq!(find("restore"), [format!("restored from snapshot {snapshot}")], "{messages:?}");
    let fork = find("fork");
    assert!(fork.len() == 1 && children.iter().all(|c| fork[0].contains(c)), "{messages:?}");
    let fork_snapshot = fork[0].rsplit(' ').next().unwrap();
    assert!(find("snapshot").iter().any(|m| m.contains(fork_snapshot) && m.ends_with("taken to fork")), "{messages:?}");
    let suspended = find("snapshot").into_iter().find(|m| m.ends_with("taken to suspend"));
    let suspended = suspended.unwrap_or_else(|| panic!("no snapshot event of the suspend: {messages:?}"));
    let suspend_snapshot = suspended.split(' ').nth(1).unwrap();
    assert_eq!(find("resume"), [format!("resumed from snapshot {suspend_snapshot}")], "{messages:?}");
    for child in &children {
        let of_child = events(&server, child).await;
        let expected = format!("forked from session {id} at snapshot {fork_snapshot}");
        assert!(
            of_child.iter().any(|e| e["kind"] == "forked_from" && e["message"] == expected.as_str()),
            "{of_child:?}"
        );
    }
}
