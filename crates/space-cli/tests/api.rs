//! The API's contract: errors with stable codes, tenant isolation, idempotency.

mod common;

use common::Server;
use serde_json::json;

#[test]
fn bad_input_gets_clear_errors_and_loses_nothing() {
    require_root!();
    let server = Server::start();
    let (status, body) = server.call("GET", "/v1/sessions/ses_aaaaaaaaaaaaaaaaaaaa", None);
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")));
    let (status, _) = server.call("GET", "/v1/sessions/../../etc", None);
    assert_eq!(status, 404);

    let (status, body) = server.call("POST", "/v1/sessions", Some(json!({ "template": "nope" })));
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("unknown_template")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("busybox"), "names the available ones: {body}");

    let (status, body) = server.call("POST", "/v1/sessions", Some(json!({ "memory_mib": 1 })));
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("bad_request")), "{body}");
    let (status, body) = server.call("POST", "/v1/sessions", Some(json!({ "surprise": true })));
    assert_eq!(status, 400, "{body}");

    assert_eq!(server.post_raw("/v1/sessions", &["-d", "{not json"]), 400);

    let big = format!("{{\"cmd\":[\"{}\"]}}", "x".repeat(2 << 20));
    let path = server.data_dir.join("big.json");
    std::fs::write(&path, big).unwrap();
    let body = format!("@{}", path.display());
    assert_eq!(server.post_raw("/v1/sessions", &["--data-binary", &body]), 413);

    let (status, body) = server.call_as("sk_wrong", "GET", "/v1/sessions", None);
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("unauthorized")));

    let id = server.create_session(json!({}));
    let (status, body) = server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(json!({ "cmd": [] })));
    assert_eq!(status, 400, "{body}");
    let r = server.exec(&id, &["echo", "still serving"]);
    assert_eq!(r["stdout"], "still serving\n");
}

#[test]
fn tenants_never_see_each_other() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let out = server.cli(&["key", "create", "--tenant", "other"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let other = String::from_utf8(out.stdout).unwrap().trim().to_owned();

    let (status, list) = server.call_as(&other, "GET", "/v1/sessions", None);
    assert_eq!(status, 200);
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0);
    for (method, path, body) in [
        ("GET", format!("/v1/sessions/{id}"), None),
        ("POST", format!("/v1/sessions/{id}/exec"), Some(json!({ "cmd": ["true"] }))),
        ("GET", format!("/v1/sessions/{id}/files/content?path=/etc/passwd"), None),
        ("DELETE", format!("/v1/sessions/{id}"), None),
    ] {
        let (status, body) = server.call_as(&other, method, &path, body);
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    let (status, _) = server.call_as(&other, "POST", "/v1/keys", Some(json!({ "tenant": "x" })));
    assert_eq!(status, 403);
    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(session["state"], "running");
}

#[test]
fn idempotency_key_replays_the_first_response() {
    require_root!();
    let server = Server::start();
    let create = |key: &str, body: &str| {
        let out = common::curl(&[
            "-s",
            "-X",
            "POST",
            "-H",
            &server.auth(),
            "-H",
            &format!("Idempotency-Key: {key}"),
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &format!("{}/v1/sessions", server.url),
        ]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = create("k1", "{}");
    let second = create("k1", "{}");
    assert_eq!(first["id"], second["id"]);
    let mismatch = create("k1", "{\"cpus\":2}");
    assert_eq!(mismatch["error"]["code"], "idempotency_conflict");
    let (_, list) = server.call("GET", "/v1/sessions", None);
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1);
}

/// Mode of `path` without the file type bits.
fn mode_of(path: &std::path::Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions()) & 0o7777
}

#[test]
fn the_data_dir_is_readable_by_root_only_and_loose_modes_are_fixed_at_start() {
    require_root!();
    let mut server = Server::start();
    let data = server.data_dir.clone();
    let expected = [("", 0o711), ("space.db", 0o600), ("admin.key", 0o600), ("keys", 0o700), ("images", 0o700)];
    let expected = expected.into_iter().chain([("pool/snapshots", 0o700)]);
    for (name, mode) in expected.clone().chain([("keys/master.key", 0o600)]) {
        assert_eq!(mode_of(&data.join(name)), mode, "{name}: {:o}", mode_of(&data.join(name)));
    }
    // Another local user cannot read the database, nor list the data dir.
    for (args, path) in [(["cat"], "space.db"), (["ls"], "")] {
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .arg(data.join(path))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("Permission denied"), "{args:?} {path}: {stderr}");
    }

    server.kill9();
    for (name, _) in expected.clone() {
        let loose = if data.join(name).is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(data.join(name), std::os::unix::fs::PermissionsExt::from_mode(loose)).unwrap();
    }
    server.spawn();
    for (name, mode) in expected {
        assert_eq!(mode_of(&data.join(name)), mode, "{name} was not fixed at start");
    }
    assert!(server.log_text().contains("space.db was mode 0644, readable beyond root; now 0600"), "not said loudly");
}

/// The JSON form's output cap holds for the JSON: 20 MB of NUL bytes would be 120 MB escaped.
#[test]
fn exec_output_is_capped_by_its_size_in_json() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let auth = server.auth();
    let path = server.data_dir.join("nul.json");
    let body = json!({ "cmd": ["head", "-c", "20000000", "/dev/zero"] }).to_string();
    let url = format!("{}/v1/sessions/{id}/exec", server.url);
    let out = common::curl(&[
        "-s",
        "-o",
        path.to_str().unwrap(),
        "-w",
        "%{http_code}",
        "-X",
        "POST",
        "-H",
        &auth,
        "-H",
        "content-type: application/json",
        "-d",
        &body,
        &url,
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size <= (16 << 20) + 4096, "{size} bytes of JSON");
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!((result["exit_code"].as_i64(), result["truncated"].as_bool()), (Some(0), Some(true)));
    assert!(result["stdout"].as_str().unwrap().bytes().all(|b| b == 0));
}

/// Exec WebSockets that carry nothing are closed (and their command killed); output counts
/// as traffic.
#[test]
fn idle_exec_websockets_are_closed() {
    require_root!();
    let server = Server::start_with(&["--ws-idle-timeout", "2s"]);
    let id = server.create_session(json!({}));
    let out = server.cli(&["exec", &id, "--", "sh", "-c", "sleep 1; echo a; sleep 1; echo b; sleep 1; echo c"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a\nb\nc\n");

    let out = server.cli(&["exec", &id, "--", "sleep", "5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("nothing was sent or received"), "{stderr}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let r = server.exec(&id, &["sh", "-c", "pgrep -x sleep || echo none"]);
        if r["stdout"] == "none\n" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the idle command was not killed: {r}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
