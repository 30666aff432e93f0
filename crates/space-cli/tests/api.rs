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
    let other = server.tenant_key("other");

    let (status, list) = server.call_as(&other, "GET", "/v1/sessions", None);
    assert_eq!(status, 200);
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0);
    let (status, snap) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({})));
    assert_eq!(status, 201, "{snap}");
    let snap = snap["id"].as_str().unwrap().to_owned();
    for (method, path, body) in [
        ("GET", format!("/v1/sessions/{id}"), None),
        ("PATCH", format!("/v1/sessions/{id}"), Some(json!({ "idle_timeout_secs": 60 }))),
        ("POST", format!("/v1/sessions/{id}/exec"), Some(json!({ "cmd": ["true"] }))),
        ("GET", format!("/v1/sessions/{id}/files/content?path=/etc/passwd"), None),
        ("GET", format!("/v1/sessions/{id}/files/list?path=/"), None),
        ("GET", format!("/v1/sessions/{id}/events"), None),
        ("GET", format!("/v1/sessions/{id}/snapshots"), None),
        ("POST", format!("/v1/sessions/{id}/snapshots"), Some(json!({}))),
        ("DELETE", format!("/v1/sessions/{id}/snapshots/{snap}"), None),
        ("POST", format!("/v1/sessions/{id}/restore"), Some(json!({ "snapshot": snap }))),
        ("POST", format!("/v1/sessions/{id}/fork"), Some(json!({}))),
        ("POST", format!("/v1/sessions/{id}/pause"), Some(json!({}))),
        ("POST", format!("/v1/sessions/{id}/suspend"), Some(json!({}))),
        ("GET", format!("/v1/sessions/{id}/network"), None),
        ("PATCH", format!("/v1/sessions/{id}/network"), Some(json!({ "allow": ["example.com"] }))),
        ("GET", format!("/v1/sessions/{id}/audit"), None),
        ("GET", format!("/v1/sessions/{id}/processes"), None),
        ("POST", format!("/v1/sessions/{id}/processes/1/signal"), Some(json!({ "signal": 15 }))),
        ("POST", format!("/v1/sessions/{id}/grants"), Some(json!({ "credential": "gh" }))),
        ("DELETE", format!("/v1/sessions/{id}"), None),
    ] {
        let (status, body) = server.call_as(&other, method, &path, body);
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    // Nor can another tenant's snapshot be restored into, or forked from by, its own session.
    let (status, own) = server.call_as(&other, "POST", "/v1/sessions", Some(json!({})));
    assert_eq!(status, 201, "{own}");
    let own = own["id"].as_str().unwrap();
    for (path, body) in [("restore", json!({ "snapshot": snap })), ("fork", json!({ "from": snap }))] {
        let (status, body) = server.call_as(&other, "POST", &format!("/v1/sessions/{own}/{path}"), Some(body));
        assert_eq!(status, 404, "{path} from another tenant's snapshot: {body}");
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
        let header = format!("Idempotency-Key: {key}");
        let out = common::post_json(&format!("{}/v1/sessions", server.url), &server.auth(), body, &["-H", &header]);
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
    let expected = expected.into_iter().chain([("pool/snapshots", 0o711), ("pool/trash", 0o700)]);
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

/// (code, message) of an error envelope.
fn error_of(body: &serde_json::Value) -> (&str, &str) {
    (body["error"]["code"].as_str().unwrap_or("?"), body["error"]["message"].as_str().unwrap_or("?"))
}

/// Sends `request` raw to the server and reads the response until it closes the connection.
fn raw_http(server: &Server, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let addr = server.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    stream.write_all(request).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

/// Mistakes of the client are 4xx in the JSON envelope, never 5xx, and leave the session fine.
#[test]
fn client_mistakes_are_4xx_in_the_envelope() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));

    // A mount point cannot be replaced or removed; that is the request's fault.
    let auth = server.auth();
    let url = format!("{}/v1/sessions/{id}/files/content?path=/dev/null", server.url);
    let out = common::curl(&["-s", "-X", "PUT", "-H", &auth, "--data-binary", "x", "-w", "\n%{http_code}", &url]);
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap();
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!((code, error_of(&body).0), ("400", "bad_request"), "PUT /dev/null: {body}");
    assert!(error_of(&body).1.contains("mount point"), "{body}");
    let (status, body) = server.call("DELETE", &format!("/v1/sessions/{id}/files?path=/dev/null"), None);
    assert_eq!((status, error_of(&body).0), (400, "bad_request"), "DELETE /dev/null: {body}");

    // Broken chunked encoding is a bad request, not a sandbox in trouble.
    let request = format!(
        "PUT /v1/sessions/{id}/files/content?path=/tmp/chunked HTTP/1.1\r\nHost: x\r\n{auth}\r\n\
         transfer-encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n"
    );
    let response = raw_http(&server, request.as_bytes());
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    assert!(response.contains("\"bad_request\"") && !response.contains("destroy"), "{response}");
    assert_eq!(
        server.exec(&id, &["sh", "-c", "ls /tmp/chunked 2>&1; echo ok"])["stdout"].as_str().unwrap().lines().last(),
        Some("ok")
    );

    // What the framework answers carries the envelope too.
    let (status, body) =
        server.call("POST", &format!("/v1/sessions/{id}/processes/abc/signal"), Some(json!({"signal": 15})));
    assert_eq!((status, error_of(&body).0), (400, "bad_request"), "{body}");
    let (status, body) = server.call("PUT", "/v1/sessions", None);
    assert_eq!((status, error_of(&body).0), (405, "method_not_allowed"), "{body}");
    let (status, body) = server.call("GET", &format!("/v1/sessions?all={}", "1".repeat(20 << 10)), None);
    assert_eq!((status, error_of(&body).0), (414, "uri_too_long"), "{body}");
    let mut args = vec!["-s".to_owned(), "-w".into(), "\n%{http_code}".into(), "-H".into(), auth.clone()];
    for i in 0..150 {
        args.extend(["-H".into(), format!("x-filler-{i}: v")]);
    }
    args.push(format!("{}/v1/sessions", server.url));
    let out = common::curl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n431") && text.contains("\"headers_too_large\""), "{text}");
    let (status, body) = server.call("GET", &format!("/v1/sessions/{id}/exec/ws"), None);
    assert_eq!((status, error_of(&body).0), (400, "bad_request"), "a plain GET of a WebSocket: {body}");

    // placeholder_env must not take over variables that change how programs run.
    let credential =
        json!({ "name": "c", "hosts": ["api.example.com"], "header": "Authorization: Bearer {secret}", "value": "v" });
    for env in ["PATH", "LD_PRELOAD", "HTTPS_PROXY", "no_proxy", "SSL_CERT_FILE"] {
        let mut body = credential.clone();
        body["placeholder_env"] = json!(env);
        let (status, body) = server.call("POST", "/v1/credentials", Some(body));
        assert_eq!((status, error_of(&body).0), (400, "bad_request"), "{env}: {body}");
    }

    let (_, session) = server.call("GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(session["state"], "running");
}

/// A tenant learns nothing from admin-only calls but 403, and nothing about others'
/// sessions but 404, however wrong the rest of the request is.
#[test]
fn authorization_comes_before_validation() {
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let other = server.tenant_key("other");

    for path in ["/etc", "/nonexistent-space-test", "relative"] {
        let body = json!({ "name": "imported", "path": path });
        let (status, body) = server.call_as(&other, "POST", "/v1/templates/import", Some(body));
        assert_eq!((status, error_of(&body).0), (403, "forbidden"), "{path}: {body}");
    }
    let (status, _) = server.call_as(&other, "POST", "/v1/templates/build", Some(json!({ "name": "nope" })));
    assert_eq!(status, 403);
    let (status, _) = server.call_as(&other, "PUT", "/v1/pool/nope", Some(json!({ "size": 99999 })));
    assert_eq!(status, 403);
    let (status, _) =
        server.call("POST", "/v1/templates/import", Some(json!({ "name": "x", "path": "/nonexistent-space-test" })));
    assert_eq!(status, 400, "the admin is told what is wrong");

    for (method, path, body) in [
        ("POST", format!("/v1/sessions/{id}/exec"), Some(json!({ "cmd": [] }))),
        ("POST", format!("/v1/sessions/{id}/processes/1/signal"), Some(json!({ "signal": 999 }))),
        ("GET", format!("/v1/sessions/{id}/files/content?nopath=1"), None),
        ("POST", format!("/v1/sessions/{id}/fork"), Some(json!({ "count": 0 }))),
    ] {
        let (status, body) = server.call_as(&other, method, &path, body);
        assert_eq!((status, error_of(&body).0), (404, "not_found"), "{method} {path}: {body}");
    }
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
    let out = common::post_json(&url, &auth, &body, &["-o", path.to_str().unwrap(), "-w", "%{http_code}"]);
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

/// A full snapshot closes the node's connection to the sandbox's agent: an exec stream open
/// then ends with an error (docs/lifecycle.md), its process keeps running and can be attached
/// to again, rather than the client waiting for output that can no longer come.
#[test]
fn an_exec_stream_open_across_a_full_snapshot_ends_and_its_process_survives() {
    use std::process::{Command, Stdio};
    require_root!();
    let server = Server::start();
    let id = server.create_session(json!({}));
    let mut exec = Command::new(common::SPACE)
        .args(["exec", &id, "--", "sh", "-c", "echo started; exec sleep 1000"])
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(exec.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "started\n");
    let (status, snap) = server.call("POST", &format!("/v1/sessions/{id}/snapshots"), Some(json!({ "kind": "full" })));
    assert_eq!(status, 201, "{snap}");
    // Not a timing assertion: the bound only keeps a stream that never ends from hanging.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while exec.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            exec.kill().unwrap();
            panic!("the exec stream outlived the connection it ran on");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = exec.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("the sandbox agent closed the stream"), "{stderr}");
    let (_, processes) = server.call("GET", &format!("/v1/sessions/{id}/processes"), None);
    assert!(processes.to_string().contains("sleep"), "the command did not survive: {processes}");
}
