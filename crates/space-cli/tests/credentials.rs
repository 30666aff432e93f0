//! Credentials, grants, network policy and audit through the API and the CLI (the traffic
//! itself is tested in egress.rs).

mod common;

use common::Server;
use serde_json::{Value, json};

const SECRET: &str = "ghp_s3cr3t-VALUE-never-shown-0123456789";

fn cli_ok(server: &Server, args: &[&str], stdin: Option<&[u8]>) -> String {
    let out = server.cli_with_stdin(args, stdin);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "space {args:?} failed: {stderr}");
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET), "the value leaked: {stdout}{stderr}");
    stdout.into_owned()
}

fn cli_err(server: &Server, args: &[&str], stdin: Option<&[u8]>) -> String {
    let out = server.cli_with_stdin(args, stdin);
    assert!(!out.status.success(), "space {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The value appears in no file of the database (WAL included).
fn assert_not_in_db(server: &Server, value: &str) {
    for entry in std::fs::read_dir(&server.data_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with("space.db") {
            let data = std::fs::read(&path).unwrap();
            assert!(!data.windows(value.len()).any(|w| w == value.as_bytes()), "{} holds the value", path.display());
        }
    }
}

fn error_of(body: &Value) -> (&str, &str) {
    (body["error"]["code"].as_str().unwrap_or(""), body["error"]["message"].as_str().unwrap_or(""))
}

#[test]
fn credentials_are_sealed_scoped_and_validated() {
    require_root!();
    let server = Server::start_with(&["--allow-wildcard-credential-hosts"]);
    let create = [
        "credential",
        "create",
        "gh",
        "--host",
        "api.github.com",
        "--host",
        "*.githubusercontent.com",
        "--header",
        "Authorization: Bearer {secret}",
        "--expires",
        "30d",
        "--rate-limit",
        "60/min",
        "--placeholder-env",
        "GITHUB_TOKEN",
    ];
    let out = cli_ok(&server, &create, Some(format!("{SECRET}\n").as_bytes()));
    assert!(out.contains("gh") && out.contains("60/min"), "{out}");
    let err = cli_err(&server, &create, Some(b"other\n"));
    assert!(err.contains("exists already") && err.contains("409"), "{err}");
    let err =
        cli_err(&server, &["credential", "create", "empty", "--host", "a.com", "--header", "X: {secret}"], Some(b"\n"));
    assert!(err.contains("no value on stdin"), "{err}");
    // A tenant's token endpoint is kept off the node's own and private networks (the
    // operator lifts this with --gateway-allow-private, as the OAuth tests do).
    for url in ["https://127.0.0.1/token", "https://10.0.0.1/token", "https://[::ffff:169.254.169.254]/token"] {
        let args = [
            "credential",
            "create",
            "o",
            "--host",
            "a.com",
            "--oauth2-token-url",
            url,
            "--client-id",
            "c",
            "--grant",
            "client-credentials",
        ];
        let err = cli_err(&server, &args, Some(b"secret\n"));
        assert!(err.contains("loopback or private network") && err.contains("400"), "{url}: {err}");
    }

    let list: Value = serde_json::from_str(&cli_ok(&server, &["credential", "list", "--json"], None)).unwrap();
    let gh = &list["credentials"][0];
    assert_eq!((gh["name"].as_str(), gh["version"].as_u64()), (Some("gh"), Some(1)));
    assert_eq!(gh["hosts"], json!(["api.github.com", "*.githubusercontent.com"]));
    assert!(gh.get("value").is_none());
    let table = cli_ok(&server, &["credential", "list"], None);
    assert!(table.contains("NAME") && table.contains("api.github.com"), "{table}");
    let (status, body) = server.call("GET", "/v1/credentials/gh", None);
    assert_eq!(status, 200);
    assert!(!body.to_string().contains(SECRET));
    assert_not_in_db(&server, SECRET);

    // Rotation bumps the version; other changes do not.
    let rotated = "rotated-VALUE-987654321";
    let out = cli_ok(&server, &["credential", "rotate", "gh", "--json"], Some(format!("{rotated}\n").as_bytes()));
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["version"], 2);
    let out =
        cli_ok(&server, &["credential", "update", "gh", "--rate-limit", "0", "--expires", "never", "--json"], None);
    let updated: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (updated["version"].as_u64(), &updated["rate_limit_per_min"], &updated["expires_at"]),
        (Some(2), &Value::Null, &Value::Null)
    );
    assert_not_in_db(&server, rotated);

    // Another tenant sees none of it.
    let other = server.tenant_key("other");
    let (status, list) = server.call_as(&other, "GET", "/v1/credentials", None);
    assert_eq!((status, list["credentials"].as_array().map(Vec::len)), (200, Some(0)));
    for (method, body) in [("GET", None), ("PATCH", Some(json!({ "value": "x" }))), ("DELETE", None)] {
        let (status, body) = server.call_as(&other, method, "/v1/credentials/gh", body);
        assert_eq!((status, error_of(&body).0), (404, "credential_not_found"), "{method}: {body}");
    }
    // The same name is free for them.
    let request = json!({ "name": "gh", "hosts": ["a.example.com"], "header": "X-Key: {secret}", "value": "v" });
    assert_eq!(server.call_as(&other, "POST", "/v1/credentials", Some(request)).0, 201);

    // Bad input: 400 with a message that says what is wrong.
    let base =
        json!({ "name": "ok", "hosts": ["api.example.com"], "header": "Authorization: Bearer {secret}", "value": "v" });
    let cases = [
        ("name", json!("bad name!"), "invalid credential name"),
        ("hosts", json!([]), "at least one host"),
        ("hosts", json!(["1.2.3.4"]), "CIDR"),
        ("hosts", json!(["bad host"]), "not a host pattern"),
        ("header", json!("Authorization Bearer {secret}"), "Name: value"),
        ("header", json!("Authorization: Bearer"), "{secret}"),
        ("header", json!("Bad Name: {secret}"), "not a valid header name"),
        ("value", json!(""), "empty"),
        ("value", json!("a\r\nX-Evil: 1"), "line break"),
        ("value", json!("x".repeat(8193)), "at most 8192"),
        ("placeholder_env", json!("1BAD"), "placeholder_env"),
        ("expires_at", json!(1), "in the past"),
    ];
    for (field, value, expected) in cases {
        let mut body = base.clone();
        body[field] = value;
        let (status, response) = server.call("POST", "/v1/credentials", Some(body));
        let (code, message) = error_of(&response);
        assert_eq!((status, code), (400, "bad_request"), "{field}: {response}");
        assert!(message.contains(expected), "{field}: {message:?} should mention {expected:?}");
    }

    let out = cli_ok(&server, &["credential", "delete", "gh"], None);
    assert!(out.contains("deleted gh"), "{out}");
    let (status, body) = server.call("GET", "/v1/credentials/gh", None);
    assert_eq!((status, error_of(&body).0), (404, "credential_not_found"));
    assert!(error_of(&body).1.contains("space credential create"), "{body}");
}

#[test]
fn grants_policies_and_audit_of_sessions() {
    require_root!();
    let mut server = Server::start();
    let create =
        ["credential", "create", "gh", "--host", "api.github.com", "--header", "Authorization: token {secret}"];
    cli_ok(&server, &[&create[..], &["--placeholder-env", "GITHUB_TOKEN"]].concat(), Some(SECRET.as_bytes()));
    cli_ok(
        &server,
        &["credential", "create", "npm", "--host", "registry.npmjs.org", "--header", "X-Token: {secret}"],
        Some(b"npm-value\n"),
    );

    // Unknown grant: 404 that says how to create one; invalid policy: 400.
    let (status, body) = server.call("POST", "/v1/sessions", Some(json!({ "grants": ["nope"] })));
    assert_eq!((status, error_of(&body).0), (404, "credential_not_found"), "{body}");
    assert!(error_of(&body).1.contains("space credential create"), "{body}");
    let (status, body) = server.call("POST", "/v1/sessions", Some(json!({ "network": { "allow": ["1.2.3.4"] } })));
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).1.contains("CIDR"), "{body}");

    let out = cli_ok(
        &server,
        &[
            "session",
            "create",
            "--allow",
            "API.example.com",
            "--allow",
            "*.pypi.org",
            "--deny",
            "bad.pypi.org",
            "--port",
            "443",
            "--grant",
            "gh",
        ],
        None,
    );
    let id = out.trim().to_owned();
    let network: Value = serde_json::from_str(&cli_ok(&server, &["session", "policy", &id, "--json"], None)).unwrap();
    assert_eq!(network["policy"]["allow"], json!(["api.example.com", "*.pypi.org"]));
    assert_eq!(network["policy"]["deny"], json!(["bad.pypi.org"]));
    assert_eq!(network["policy"]["ports"], json!([443]));
    assert_eq!(network["grants"], json!(["gh"]));
    let session = server.call("GET", &format!("/v1/sessions/{id}"), None).1;
    assert_eq!(session["env"]["GITHUB_TOKEN"], "space-placeholder-gh", "{session}");
    let env = server.exec(&id, &["env"]);
    let env = env["stdout"].as_str().unwrap();
    assert!(env.contains("GITHUB_TOKEN=space-placeholder-gh") && !env.contains(SECRET), "{env}");

    // PATCH: allow/deny move patterns between the lists; ports and cidrs are replaced.
    let out = cli_ok(
        &server,
        &["session", "policy", &id, "--deny", "api.example.com", "--allow", "bad.pypi.org", "--cidr", "203.0.113.0/24"],
        None,
    );
    assert!(out.contains("deny     api.example.com") && out.contains("203.0.113.0/24"), "{out}");
    let (status, network) = server.call("GET", &format!("/v1/sessions/{id}/network"), None);
    assert_eq!(status, 200);
    assert_eq!(network["policy"]["allow"], json!(["*.pypi.org", "bad.pypi.org"]));
    assert_eq!(network["policy"]["deny"], json!(["api.example.com"]));
    assert_eq!(network["policy"]["ports"], json!([443]));
    let (status, body) = server.call("PATCH", &format!("/v1/sessions/{id}/network"), Some(json!({ "ports": [0] })));
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.call("PATCH", &format!("/v1/sessions/{id}/network"), Some(json!({ "allow": ["a b"] })));
    assert_eq!(status, 400, "{body}");

    // Grant and revoke, with the placeholder following.
    let out = cli_ok(&server, &["session", "grant", &id, "npm"], None);
    assert!(out.contains("grants   gh npm"), "{out}");
    let out = cli_ok(&server, &["session", "revoke", &id, "gh"], None);
    assert!(out.contains("grants   npm"), "{out}");
    let session = server.call("GET", &format!("/v1/sessions/{id}"), None).1;
    assert!(session["env"].get("GITHUB_TOKEN").is_none(), "{session}");
    let err = cli_err(&server, &["session", "revoke", &id, "gh"], None);
    assert!(err.contains("not granted"), "{err}");
    let err = cli_err(&server, &["session", "grant", &id, "nope"], None);
    assert!(err.contains("credential_not_found"), "{err}");
    cli_ok(&server, &["session", "grant", &id, "gh"], None);

    // Another tenant cannot see or change the session's network.
    let other = server.tenant_key("other");
    for (method, path, body) in [
        ("GET", format!("/v1/sessions/{id}/network"), None),
        ("PATCH", format!("/v1/sessions/{id}/network"), Some(json!({ "allow": ["x.com"] }))),
        ("POST", format!("/v1/sessions/{id}/grants"), Some(json!({ "credential": "gh" }))),
        ("GET", format!("/v1/sessions/{id}/audit"), None),
    ] {
        assert_eq!(server.call_as(&other, method, &path, body).0, 404, "{method} {path}");
    }

    // Audit: a table and JSON, even when empty.
    let audit: Value =
        serde_json::from_str(&cli_ok(&server, &["session", "audit", &id, "--json", "--limit", "5"], None)).unwrap();
    assert!(audit["events"].is_array(), "{audit}");
    assert!(cli_ok(&server, &["session", "audit", &id], None).contains("DECISION"));

    // Forks keep the policy and grants.
    let (status, forked) = server.call("POST", &format!("/v1/sessions/{id}/fork"), Some(json!({})));
    assert_eq!(status, 201, "{forked}");
    let child = forked["sessions"][0]["id"].as_str().unwrap().to_owned();
    let child_network = server.call("GET", &format!("/v1/sessions/{child}/network"), None).1;
    assert_eq!(child_network["policy"], network_policy(&server, &id));
    assert_eq!(child_network["grants"], json!(["gh", "npm"]));

    // After a restart the stored values still decrypt: changing the credential pushes it to
    // the sessions holding it, which needs every value in clear.
    server.kill9();
    server.spawn();
    let out = cli_ok(&server, &["credential", "rotate", "gh", "--json"], Some(b"after-restart\n"));
    let rotated: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(rotated["version"], 2, "created at 1, rotated once: {rotated}");
    // Wildcard hosts need the operator's consent (this server has not given it).
    let (status, body) =
        server.call("PATCH", "/v1/credentials/npm", Some(json!({ "hosts": ["registry.npmjs.org", "*.npmjs.org"] })));
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).1.contains("--allow-wildcard-credential-hosts"), "{body}");
    let (status, body) = server.call(
        "PATCH",
        "/v1/credentials/npm",
        Some(json!({ "hosts": ["registry.npmjs.org", "registry.yarnpkg.com"] })),
    );
    assert_eq!(status, 200, "{body}\n{}", server.log_text());
    // A revoke on the parent reaches the fork, which inherited the grant.
    let (status, body) = server.call("DELETE", &format!("/v1/sessions/{id}/grants/npm"), None);
    assert_eq!(status, 200, "{body}");
    let child_network = server.call("GET", &format!("/v1/sessions/{child}/network"), None).1;
    assert_eq!(child_network["grants"], json!(["gh"]), "{child_network}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(server.data_dir.join("keys/master.key")).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    assert!(!server.log_text().contains(SECRET));

    // Destroyed sessions are gone for these calls too.
    assert_eq!(server.call("DELETE", &format!("/v1/sessions/{id}"), None).0, 200);
    let (status, _) = server.call("GET", &format!("/v1/sessions/{id}/network"), None);
    assert_eq!(status, 404);
    // Deleting a credential removes its grants.
    assert_eq!(server.call("DELETE", "/v1/credentials/gh", None).0, 204);
    let child_network = server.call("GET", &format!("/v1/sessions/{child}/network"), None).1;
    assert_eq!(child_network["grants"], json!([]), "{child_network}");
}

fn network_policy(server: &Server, id: &str) -> Value {
    server.call("GET", &format!("/v1/sessions/{id}/network"), None).1["policy"].clone()
}
