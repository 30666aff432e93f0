//! What an operator sees of a real server: per-session usage (the gateway's bytes, memory,
//! CPU, disk and snapshots), the Prometheus metrics of snapshots, restores and the gateway
//! (`--metrics-listen`), and JSON logs (`--log-format json`) without colour codes.

mod common;

use std::time::{Duration, Instant};

use common::Server;
use common::upstream::Upstream;
use serde_json::{Value, json};

/// The upstream answers for this name; the session may reach it.
const NAME: &str = "metrics.test";
/// Bytes the sandbox downloads through the gateway.
const DOWNLOAD: u64 = 300_000;
/// Bytes it uploads.
const UPLOAD: u64 = 1_000;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn scrape(port: u16) -> String {
    let out = common::curl(&["-sS", "-f", &format!("http://127.0.0.1:{port}/metrics")]);
    assert!(out.status.success(), "scrape: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The value of `series` (name and labels exactly) in a scrape.
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

fn stats(server: &Server, id: &str) -> Value {
    let (status, stats) = server.call("GET", &format!("/v1/sessions/{id}/stats"), None);
    assert_eq!(status, 200, "{stats}");
    stats
}

/// Waits until the session's stats satisfy `done` (the gateway counts a connection's bytes
/// when it ends, a moment after the client saw the response).
fn wait_stats(server: &Server, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = stats(server, id);
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "stats never got there: {stats}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn usage_metrics_and_logs_of_a_real_session() {
    require_root!();
    let up = Upstream::start(&[NAME]);
    let port = free_port();
    let mut flags = up.serve_flags();
    flags.extend(["--metrics-listen".into(), format!("127.0.0.1:{port}"), "--log-format".into(), "json".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = Server::start_with(&flags);
    let runtime = common::runtime();
    let id = server.create_session(json!({ "network": { "allow": [NAME] } }));

    // Traffic through the gateway, counted for the session in both directions.
    // (HTTP the gateway forwards counts its bodies; tunnels count every byte.)
    let fetch = format!(
        "wget -q -O /dev/null --post-data \"$(head -c {UPLOAD} /dev/zero | tr '\\0' x)\" http://{NAME}/upload; \
         wget -q -O /tmp/got http://{NAME}/bytes/{DOWNLOAD} && wc -c < /tmp/got"
    );
    let r = server.exec(&id, &["sh", "-c", &fetch]);
    assert_eq!((r["exit_code"].as_i64(), r["stdout"].as_str().map(str::trim)), (Some(0), Some("300000")), "{r}");
    // Refused: a name the session may not reach does not resolve.
    let unresolved = server.exec(&id, &["nslookup", "denied.test"]);
    assert_ne!(unresolved["exit_code"], 0, "{unresolved}");
    let before = wait_stats(&server, &id, |s| {
        s["network"]["bytes_in"].as_u64().unwrap_or(0) >= DOWNLOAD && s["network"]["bytes_out"].as_u64() >= Some(UPLOAD)
    });
    assert_eq!(before["network"]["bytes_out"], UPLOAD, "{before}");
    let sandbox = &before["sandbox"];
    let (memory, peak) = (sandbox["memory_bytes"].as_u64().unwrap(), sandbox["memory_peak_bytes"].as_u64());
    assert!(memory > 0 && peak.is_some_and(|p| p >= memory), "{before}");
    assert!(sandbox["cpu_usage_ns"].as_u64().unwrap() > 0, "{before}");

    // Snapshots and a restore, counted with their kind; their usage shows in the stats.
    let (status, disk) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "disk" })));
    assert_eq!(status, 201, "{disk}");
    let (status, full) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "full" })));
    assert_eq!(status, 201, "full snapshots need CRIU (scripts/install-criu.sh): {full}");
    let full_id = full["id"].as_str().unwrap();
    let (status, restored) =
        server.call("POST", &format!("/v1/sessions/{id}/restore"), Some(json!({ "snapshot": full_id })));
    assert_eq!(status, 200, "{restored}");
    let after = wait_stats(&server, &id, |s| s["disk"]["snapshot_bytes"].as_u64().unwrap_or(0) > 0);
    assert_eq!(after["disk"]["snapshots"], 2, "{after}");
    assert_eq!(after["network"], before["network"], "the counters outlive the sandbox: {after}");

    let metrics = scrape(port);
    for (series, min) in [
        (format!(r#"space_snapshots_total{{kind="disk",runtime="{runtime}",result="ok"}}"#), 1.0),
        (format!(r#"space_snapshots_total{{kind="full",runtime="{runtime}",result="ok"}}"#), 1.0),
        (format!(r#"space_snapshot_duration_seconds_count{{kind="full",runtime="{runtime}"}}"#), 1.0),
        (format!(r#"space_snapshot_size_bytes_count{{kind="full",runtime="{runtime}"}}"#), 1.0),
        (format!(r#"space_restores_total{{kind="full",runtime="{runtime}",reason="restore",result="ok"}}"#), 1.0),
        (format!(r#"space_restore_duration_seconds_count{{kind="full",runtime="{runtime}",reason="restore"}}"#), 1.0),
        (format!(r#"space_restore_size_bytes_count{{kind="full",runtime="{runtime}"}}"#), 1.0),
        (r#"space_gateway_bytes_total{direction="in",protocol="http"}"#.to_owned(), DOWNLOAD as f64),
        (r#"space_gateway_decisions_total{decision="allowed",protocol="http"}"#.to_owned(), 1.0),
        (r#"space_gateway_decisions_total{decision="denied",protocol="dns"}"#.to_owned(), 1.0),
        (r#"space_sessions{state="running"}"#.to_owned(), 1.0),
        (format!(r#"space_pool_target_pods{{template="busybox",runtime="{runtime}"}}"#), 1.0),
    ] {
        at_least(&metrics, &series, min);
    }
    assert!(!metrics.contains(&id) && !metrics.contains(full_id) && !metrics.contains("ses_"), "{metrics}");
    assert!(value(&metrics, r#"space_checkpoint_errors_total{runtime="linux",step="dump"}"#).is_none(), "{metrics}");

    // The log: JSON lines, no colour codes (stderr is a file here).
    let log = server.log_text();
    assert!(!log.contains('\u{1b}'), "colour codes in the log:\n{log}");
    let serving = log.lines().find(|l| l.contains("space is serving")).unwrap_or_else(|| panic!("{log}"));
    let line: Value = serde_json::from_str(serving).unwrap_or_else(|e| panic!("{e}: {serving}"));
    assert_eq!(line["level"], "INFO", "{line}");
    drop(server);
}
