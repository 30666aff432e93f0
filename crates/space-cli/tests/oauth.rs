//! OAuth credentials end to end, without the internet: a provider (tests/common/oauth.rs) on
//! the test upstream's HTTPS server at `oauth.test`, an API at `granted.test` that records the
//! headers it gets, and curl inside the `debian` template. Covers: the client-credentials
//! grant injected, cached and refreshed before expiry; the refresh-token grant with rotation;
//! failures (refused, garbage) surfacing on the credential, as 502s and in the audit log,
//! without a retry storm; a sign-in with PKCE through `/v1/oauth/callback`; and no client
//! secret, refresh token or access token anywhere in the sandbox or in the database in clear.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::Server;
use common::upstream::{Upstream, random_hex};
use serde_json::{Value, json};

const NAMES: [&str; 2] = ["granted.test", "oauth.test"];
const TOKEN_URL: &str = "https://oauth.test/oauth/token";
const AUTHORIZE_URL: &str = "https://oauth.test/oauth/authorize";

struct Env {
    // Dropped first: the server (and its sandboxes) before the upstreams.
    server: Server,
    up: Upstream,
}

fn start() -> Env {
    let up = Upstream::start(&NAMES);
    let mut flags = vec!["--pool".to_owned(), String::new()];
    flags.extend(up.serve_flags());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = Server::start_with(&flags);
    let out = server.cli(&["template", "build", "debian"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Env { server, up }
}

impl Env {
    fn credential(&self, name: &str) -> Value {
        let (status, c) = self.server.call("GET", &format!("/v1/credentials/{name}"), None);
        assert_eq!(status, 200, "{c}");
        c
    }

    /// Waits until the credential's OAuth status is `status`.
    fn wait_status(&self, name: &str, status: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = self.credential(name);
            if c["oauth2"]["status"] == status {
                return c;
            }
            assert!(Instant::now() < deadline, "credential {name} never became {status}: {c}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn session(&self, grants: &[&str]) -> String {
        let body = json!({ "template": "debian", "memory_mib": 1024, "grants": grants });
        let id = self.server.create_session(body);
        let r = self.sh(&id, "cat /etc/space/ca-bundle.crt > /tmp/ca.pem");
        assert_eq!(r["exit_code"], 0, "{r}");
        id
    }

    fn sh(&self, id: &str, script: &str) -> Value {
        self.sh_in(id, script, "")
    }

    fn sh_in(&self, id: &str, script: &str, stdin: &str) -> Value {
        let body = json!({ "cmd": ["sh", "-c", script], "stdin": stdin, "timeout_ms": 120_000 });
        let (status, r) = self.server.call("POST", &format!("/v1/sessions/{id}/exec"), Some(body));
        assert_eq!(status, 200, "exec {script}: {r}");
        r
    }

    /// curl in the sandbox to `https://granted.test{path}`: (HTTP status, body).
    fn get(&self, id: &str, path: &str) -> (String, String) {
        let script = format!(
            "curl -sS -o /tmp/body -w '%{{http_code}}' --max-time 20 --cacert /tmp/ca.pem https://granted.test{path}; \
             echo; cat /tmp/body"
        );
        let r = self.sh(id, &script);
        let out = r["stdout"].as_str().unwrap_or_default();
        let (code, body) = out.split_once('\n').unwrap_or((out, ""));
        (code.trim().to_owned(), body.to_owned())
    }

    /// What `granted.test` got as `Authorization` for `path`.
    fn authorization_at(&self, path: &str) -> String {
        self.up.request_to(path).header("authorization").unwrap_or_default().to_owned()
    }

    /// Requests `path{n}` until the upstream gets the token the provider issued last (a pushed
    /// token reaches the gateway a moment after it was issued).
    fn wait_injected(&self, id: &str, path: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in 0.. {
            let path = format!("{path}{n}");
            let (code, body) = self.get(id, &path);
            assert_eq!(code, "200", "{body}");
            let latest = self.up.oauth().issued().last().cloned().unwrap_or_default();
            if self.authorization_at(&path) == format!("Bearer {latest}") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the gateway never injected {latest}: got {}",
                self.authorization_at(&path)
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// None of `secrets` is in the sandbox's files, environments or command lines, nor in the
    /// database's files.
    fn assert_nowhere(&self, id: &str, secrets: &[String]) {
        let known = format!("known-file-marker-{}", random_hex(8));
        self.sh(id, &format!("mkdir -p /root/deep && echo {known} > /root/deep/known.txt"));
        let mut patterns = secrets.join("\n");
        patterns.push_str(&format!("\n{known}\n"));
        let r = self.sh_in(
            id,
            "grep -r -o -a -F -f /dev/stdin --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev / 2>/dev/null; \
             for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f 2>/dev/null; done; env",
            &patterns,
        );
        let out = r["stdout"].as_str().unwrap_or_default();
        assert!(out.contains(&format!("/root/deep/known.txt:{known}")), "the file search does not work: {r}");
        for secret in secrets {
            assert!(!out.contains(secret.as_str()), "{secret} is in the sandbox: {out}");
        }
        for entry in std::fs::read_dir(&self.server.data_dir).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().unwrap().to_string_lossy().starts_with("space.db") {
                let data = std::fs::read(&path).unwrap();
                for secret in secrets {
                    assert!(
                        !data.windows(secret.len()).any(|w| w == secret.as_bytes()),
                        "{} holds {secret}",
                        path.display()
                    );
                }
            }
        }
    }

    /// `space credential create NAME --host granted.test` for the provider's client, with
    /// `args` after, the client secret on stdin.
    fn create_with_cli(&self, name: &str, args: &[&str]) {
        let oauth = self.up.oauth();
        let mut all = vec!["credential", "create", name, "--host", "granted.test", "--oauth2-token-url", TOKEN_URL];
        all.extend(["--client-id", &oauth.client_id]);
        all.extend(args);
        let out = self.server.cli_with_stdin(&all, Some(oauth.client_secret.as_bytes()));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    fn audit_reasons(&self, id: &str) -> Vec<String> {
        let (_, audit) = self.server.call("GET", &format!("/v1/sessions/{id}/audit"), None);
        let events = audit["events"].as_array().cloned().unwrap_or_default();
        events.iter().filter_map(|e| e["reason"].as_str().map(str::to_owned)).collect()
    }
}

/// Client credentials: created with the CLI (secret on stdin), the token injected on the
/// granted host, kept while valid, refreshed before it expires and pushed to the gateway.
#[test]
fn client_credentials_tokens_are_injected_cached_and_refreshed() {
    require_root!();
    let env = start();
    let oauth = env.up.oauth();
    env.create_with_cli("api", &["--grant", "client-credentials", "--scope", "read"]);
    let listed = String::from_utf8_lossy(&env.server.cli(&["credential", "list"]).stdout).into_owned();
    assert!(listed.contains("oauth2 pending") && !listed.contains(&oauth.client_secret), "{listed}");

    let id = env.session(&["api"]);
    let (code, body) = env.get(&id, "/first");
    assert_eq!(code, "200", "{body}");
    let issued = oauth.issued();
    assert_eq!(issued.len(), 1, "one token for the first request");
    assert_eq!(env.authorization_at("/first"), format!("Bearer {}", issued[0]));
    let c = env.wait_status("api", "ok");
    assert!(c["oauth2"]["token_expires_at"].as_i64().unwrap() > 3000 + c["updated_at"].as_i64().unwrap() / 1000);

    // Cached: more requests, no new token.
    for n in 0..3 {
        assert_eq!(env.get(&id, &format!("/cached{n}")).0, "200");
    }
    assert_eq!(oauth.token_requests(), 1, "the token was asked for again while valid");

    // A token about to expire is refreshed ahead of time and the new one injected.
    oauth.set_expires_in(61);
    let (status, r) =
        env.server.call("PATCH", "/v1/credentials/api", Some(json!({ "client_secret": oauth.client_secret })));
    assert_eq!(status, 200, "{r}");
    // (No sooner than 15 s after the last token: a provider is not asked in a loop.)
    let deadline = Instant::now() + Duration::from_secs(60);
    while oauth.issued().len() < 3 {
        assert!(Instant::now() < deadline, "the token was not refreshed before it expired: {:?}", oauth.issued());
        std::thread::sleep(Duration::from_millis(200));
    }
    oauth.set_expires_in(3600);
    env.wait_injected(&id, "/refreshed");

    let mut secrets = oauth.issued();
    secrets.push(oauth.client_secret.clone());
    env.assert_nowhere(&id, &secrets);
}

/// Refresh tokens: rotated by the provider and kept (sealed) by the server; a refused or
/// garbled answer marks the credential failing, answers 502, is audited, and is not retried
/// in a storm; a new refresh token makes it work again.
#[test]
fn refresh_tokens_rotate_and_failures_surface_without_a_storm() {
    require_root!();
    let env = start();
    let oauth = env.up.oauth();
    let first = format!("rt-first-{}", random_hex(8));
    oauth.add_refresh_token(&first);
    let body = json!({
        "name": "gh", "hosts": ["granted.test"], "kind": "oauth2",
        "oauth2": { "token_url": TOKEN_URL, "client_id": oauth.client_id, "client_secret": oauth.client_secret,
                    "grant_type": "refresh_token", "refresh_token": first, "client_auth": "post" }
    });
    let (status, c) = env.server.call("POST", "/v1/credentials", Some(body));
    assert_eq!(status, 201, "{c}");
    assert!(!c.to_string().contains(&first) && !c.to_string().contains(&oauth.client_secret), "{c}");

    let id = env.session(&["gh"]);
    let (code, body) = env.get(&id, "/one");
    assert_eq!(code, "200", "{body}");
    assert_eq!(env.authorization_at("/one"), format!("Bearer {}", oauth.issued()[0]));
    assert!(!oauth.accepts_refresh_token(&first), "the provider rotated the refresh token");
    let rotated = oauth.issued_refresh()[0].clone();

    // The rotated token is the one the server uses next.
    let (status, r) =
        env.server.call("PATCH", "/v1/credentials/gh", Some(json!({ "client_secret": oauth.client_secret })));
    assert_eq!(status, 200, "{r}");
    assert_eq!(oauth.issued().len(), 2, "{r}");
    assert!(!oauth.accepts_refresh_token(&rotated), "the rotated refresh token was not the one used");

    // Refused: failing with the provider's error, 502 in the sandbox, an audit event.
    oauth.set_failure(Some((400, r#"{"error":"invalid_grant","error_description":"token revoked"}"#)));
    let (status, r) = env.server.call("PATCH", "/v1/credentials/gh", Some(json!({ "refresh_token": "rt-revoked" })));
    assert_eq!(status, 200, "{r}");
    let c = env.wait_status("gh", "failing");
    assert!(c["oauth2"]["reason"].as_str().unwrap().contains("invalid_grant (token revoked)"), "{c}");
    let (code, body) = env.get(&id, "/refused");
    assert_eq!(code, "502", "{body}");
    assert!(body.contains("credential gh has no token to inject") && body.contains("invalid_grant"), "{body}");
    assert!(env.up.wait_request_to("/refused").is_none(), "the request went out without a token");
    let reasons = env.audit_reasons(&id);
    assert!(reasons.iter().any(|r| r.contains("token request for credential gh failed")), "{reasons:?}");

    // No retry storm: requests while failing do not ask the endpoint again.
    let asked = oauth.token_requests();
    for n in 0..5 {
        assert_eq!(env.get(&id, &format!("/again{n}")).0, "502");
    }
    assert_eq!(oauth.token_requests(), asked, "requests while failing asked the token endpoint");

    // Garbage is a failure too, with what was wrong.
    oauth.set_failure(Some((200, "<html>login</html>")));
    let (status, r) = env.server.call("PATCH", "/v1/credentials/gh", Some(json!({ "refresh_token": "rt-garbage" })));
    assert_eq!(status, 200, "{r}");
    let c = env.wait_status("gh", "failing");
    assert!(c["oauth2"]["reason"].as_str().unwrap().contains("not a usable token"), "{c}");

    // A good refresh token again: back to work.
    oauth.set_failure(None);
    let good = format!("rt-good-{}", random_hex(8));
    oauth.add_refresh_token(&good);
    let (status, r) = env.server.call("PATCH", "/v1/credentials/gh", Some(json!({ "refresh_token": good })));
    assert_eq!(status, 200, "{r}");
    env.wait_status("gh", "ok");
    env.wait_injected(&id, "/back");

    let mut secrets = oauth.issued();
    secrets.extend(oauth.issued_refresh());
    secrets.extend([first, good, oauth.client_secret.clone()]);
    env.assert_nowhere(&id, &secrets);
}

/// A human's sign-in: `space credential login` prints the provider's URL (with state and a
/// PKCE challenge); the provider sends the browser to `/v1/oauth/callback`, which needs no API
/// key, exchanges the code with the verifier and keeps the refresh token. A state is used once.
#[test]
fn sign_in_with_pkce_through_the_callback() {
    require_root!();
    let env = start();
    let oauth = env.up.oauth();
    env.create_with_cli("slack", &["--grant", "refresh-token", "--authorize-url", AUTHORIZE_URL]);
    assert_eq!(env.credential("slack")["oauth2"]["status"], "needs_login");

    let out = env.server.cli(&["credential", "login", "slack", "--wait", "0", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let login: Value = serde_json::from_slice(&out.stdout).unwrap();
    let url = login["authorization_url"].as_str().unwrap();
    assert!(url.starts_with(AUTHORIZE_URL) && url.contains("code_challenge_method=S256"), "{url}");

    // The browser: the provider redirects it to the callback.
    let resolve = format!("oauth.test:443:{}", env.up.ip);
    let cacert = env.up.ca_file.to_str().unwrap().to_owned();
    let out =
        curl(&["-sS", "-o", "/dev/null", "-w", "%{redirect_url}", "--cacert", &cacert, "--resolve", &resolve, url]);
    let callback = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(callback.starts_with(&format!("{}/v1/oauth/callback?code=", env.server.url)), "{callback}");
    let out = curl(&["-sS", "-w", "\n%{http_code}", &callback]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.ends_with("200") && text.contains("Signed in: credential slack"), "{text}");
    let c = env.wait_status("slack", "ok");
    assert_eq!(oauth.issued().len(), 1, "{c}");

    // Used once; a made-up state is refused the same way.
    for again in [callback.clone(), format!("{}/v1/oauth/callback?code=x&state=made-up", env.server.url)] {
        let out = curl(&["-sS", "-w", "\n%{http_code}", &again]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.ends_with("400") && text.contains("unknown, used already or expired"), "{text}");
    }

    let id = env.session(&["slack"]);
    let (code, body) = env.get(&id, "/signed-in");
    assert_eq!(code, "200", "{body}");
    assert_eq!(env.authorization_at("/signed-in"), format!("Bearer {}", oauth.issued()[0]));
    let mut secrets = oauth.issued();
    secrets.extend(oauth.issued_refresh());
    secrets.push(oauth.client_secret.clone());
    env.assert_nowhere(&id, &secrets);
}

fn curl(args: &[&str]) -> std::process::Output {
    Command::new("curl").args(args).output().expect("running curl")
}
