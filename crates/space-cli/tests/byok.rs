//! A tenant's own key (BYOK) end to end, against a real OpenBao server (scripts/with-openbao.sh
//! starts one; scripts/test.sh runs this test under it, and without it the test fails): the
//! tenant's credentials and session CA keys are re-wrapped under its transit key; revoking
//! space's access in the KMS makes creates that must unseal or seal fail with
//! `key_unavailable` naming the key, while running sessions keep their injected credentials;
//! restoring access brings everything back; a rotation in the KMS is followed by re-wrapping
//! (after which the old key version can be retired); going back to the local key needs the
//! KMS no more; a restart opens the tenant's data from the stored key. And a tenant's
//! suspended session in the blob store: encrypted (no plaintext of what its files and memory
//! held), resumed on another node only while the key is usable; on its node's own disk: its
//! process images sealed, resumed only while the key is usable.

mod common;

use std::os::unix::fs::MetadataExt;

use common::Server;
use common::nodes::ExtraNode;
use common::upstream::{Upstream, random_hex};
use serde_json::{Value, json};

/// The server and a root token for it; set up by scripts/with-openbao.sh.
fn openbao() -> (String, String) {
    let var = |name: &str| {
        std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| {
            panic!("{name} is not set: run this test under scripts/with-openbao.sh (scripts/test.sh does)")
        })
    };
    (var("SPACE_TEST_OPENBAO_ADDR"), var("SPACE_TEST_OPENBAO_TOKEN"))
}

/// Calls the OpenBao API as root with curl (the KMS's operator, not space).
fn bao(method: &str, path: &str, body: Value) -> Value {
    let (address, root) = openbao();
    let out = common::curl(&[
        "-sS",
        "-X",
        method,
        "-H",
        &format!("X-Vault-Token: {root}"),
        "-d",
        &body.to_string(),
        "-w",
        "\n%{http_code}",
        &format!("{address}/v1/{path}"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    assert!(code.starts_with('2'), "{method} {path}: {code} {body}");
    serde_json::from_str(body).unwrap_or(Value::Null)
}

/// Lets the token's policy use the key, or takes that away (the customer revoking space).
fn allow(key: &str, allowed: bool) {
    let rules = if allowed {
        ["encrypt", "decrypt", "rewrap"]
            .map(|op| format!("path \"transit/{op}/{key}\" {{ capabilities = [\"update\"] }}\n"))
            .concat()
    } else {
        "path \"nothing\" { capabilities = [\"deny\"] }".to_owned()
    };
    bao("PUT", &format!("sys/policies/acl/{key}"), json!({ "policy": rules }));
}

/// A new transit key and a token of a policy that may use it: what a customer hands space.
fn customer_key() -> (String, String) {
    let key = format!("space-byok-{}", random_hex(6));
    bao("POST", &format!("transit/keys/{key}"), json!({}));
    allow(&key, true);
    let token = bao("POST", "auth/token/create", json!({ "policies": [key], "ttl": "2h" }))["auth"]["client_token"]
        .as_str()
        .unwrap()
        .to_owned();
    (key, token)
}

/// `space tenant key set TENANT --provider openbao …` with `token` on stdin.
fn set_key(server: &Server, tenant: &str, key: &str, token: &str) -> Value {
    let (address, _) = openbao();
    let set = ["tenant", "key", "set", tenant, "--provider", "openbao", "--address", &address, "--key", key, "--json"];
    let out = server.cli_with_stdin(&set, Some(token.as_bytes()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn assert_key_unavailable((status, r): (u16, Value), key: &str) {
    assert_eq!(status, 503, "{r}");
    assert_eq!(r["error"]["code"], "key_unavailable", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains(key) && message.contains("403") && message.contains("re-enable"), "{message}");
}

struct Env {
    server: Server,
    up: Upstream,
    /// The tenant's API key.
    tenant: String,
}

impl Env {
    /// A server (data keys not cached) whose gateway reaches test upstreams for `names`, with
    /// the `debian` template and a tenant `acme`.
    fn start(names: &[&str]) -> Env {
        let up = Upstream::start(names);
        let mut flags = vec!["--pool".to_owned(), String::new(), "--key-cache-ttl".into(), "0".into()];
        flags.extend(up.serve_flags());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let server = Server::start_with(&flags);
        let out = server.cli(&["template", "build", "debian"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let tenant = server.tenant_key("acme");
        Env { server, up, tenant }
    }

    fn create_session(&self, grants: &[&str]) -> (u16, Value) {
        let body = json!({ "template": "debian", "memory_mib": 512, "grants": grants });
        self.server.call_as(&self.tenant, "POST", "/v1/sessions", Some(body))
    }

    fn session(&self, grants: &[&str]) -> String {
        let (status, r) = self.create_session(grants);
        assert_eq!(status, 201, "{r}");
        r["id"].as_str().unwrap().to_owned()
    }

    /// The `Authorization` header the upstream got for a request to `path` from `id`.
    fn injected(&self, id: &str, path: &str) -> Option<String> {
        let script = format!("curl -sS -o /dev/null -w '%{{http_code}}' --max-time 15 https://granted.test{path}");
        let body = json!({ "cmd": ["sh", "-c", script], "timeout_ms": 60_000 });
        let (status, r) = self.server.call_as(&self.tenant, "POST", &format!("/v1/sessions/{id}/exec"), Some(body));
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["stdout"], "200", "{r}");
        self.up.request_to(path).header("authorization").map(str::to_owned)
    }

    /// The key refs the tenant's sealed values name, from the database.
    fn sealed_refs(&self) -> String {
        let script = "import sqlite3, sys\n\
            db = sqlite3.connect(sys.argv[1])\n\
            rows = db.execute('SELECT value_sealed FROM credentials').fetchall()\n\
            rows += db.execute(\"SELECT ca_key_sealed FROM sessions WHERE ca_key_sealed IS NOT NULL AND state <> 'destroyed'\").fetchall()\n\
            print(' '.join(bytes(r[0][2:2 + r[0][1]]).decode() for r in rows))";
        let db = self.server.data_dir.join("space.db");
        let out = std::process::Command::new("python3").args(["-c", script]).arg(&db).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

#[test]
fn a_tenants_own_key_seals_its_secrets_and_revoking_it_stops_their_use() {
    require_root!();
    let (key, token) = customer_key();

    let env = Env::start(&["granted.test"]);

    // A credential and a session made under the local key, then the tenant's key set: both
    // are re-wrapped (the admin sets it; the token comes on stdin and is never shown).
    let secret = format!("sk-byok-{}", random_hex(16));
    let body =
        json!({ "name": "gh", "hosts": ["granted.test"], "header": "Authorization: Bearer {secret}", "value": secret });
    let (status, r) = env.server.call_as(&env.tenant, "POST", "/v1/credentials", Some(body.clone()));
    assert_eq!(status, 201, "{r}");
    let before = env.session(&["gh"]);
    assert_eq!(env.sealed_refs().split_whitespace().collect::<Vec<_>>(), ["local", "local"]);
    let shown = set_key(&env.server, "acme", &key, &token);
    assert_eq!((shown["provider"].as_str(), shown["rewrapped"].as_u64()), (Some("openbao"), Some(2)), "{shown}");
    assert_eq!(shown["remaining"], 0, "{shown}");
    let key_id = shown["id"].as_str().unwrap().to_owned();
    let (status, r) = env.server.call_as(&env.tenant, "GET", "/v1/tenants/acme/key", None);
    assert_eq!((status, r["key"].as_str()), (200, Some(key.as_str())), "{r}");
    assert!(!r.to_string().contains(&token) && !shown.to_string().contains(&token), "the token was returned");
    assert_eq!(env.sealed_refs().split_whitespace().collect::<Vec<_>>(), [key_id.as_str(), key_id.as_str()]);
    let (status, r) = env.server.call_as(&env.server.tenant_key("other"), "GET", "/v1/tenants/acme/key", None);
    assert_eq!((status, r["error"]["code"].as_str()), (404, Some("not_found")), "another tenant: {r}");

    // In use: the re-wrapped value is injected, for the old session and a new one.
    assert_eq!(env.injected(&before, "/before").as_deref(), Some(format!("Bearer {secret}").as_str()));
    let running = env.session(&["gh"]);
    assert_eq!(env.injected(&running, "/running").as_deref(), Some(format!("Bearer {secret}").as_str()));

    // Revoked: nothing new is sealed or opened, each refusal naming the key; the running
    // session keeps its credential (docs/byok.md: running sandboxes keep running).
    allow(&key, false);
    assert_key_unavailable(env.create_session(&["gh"]), &key);
    assert_key_unavailable(env.create_session(&[]), &key);
    let mut other = body.clone();
    other["name"] = json!("npm");
    assert_key_unavailable(env.server.call_as(&env.tenant, "POST", "/v1/credentials", Some(other)), &key);
    assert_eq!(env.injected(&running, "/still").as_deref(), Some(format!("Bearer {secret}").as_str()));

    // Restored: everything works again, also after a restart (the token is read back).
    allow(&key, true);
    let mut env = env;
    env.server.kill9();
    env.server.spawn();
    let after = env.session(&["gh"]);
    assert_eq!(env.injected(&after, "/after").as_deref(), Some(format!("Bearer {secret}").as_str()));

    // Rotated in the KMS, then re-wrapped: the old version can be retired.
    bao("POST", &format!("transit/keys/{key}/rotate"), json!({}));
    let out = env.server.cli(&["tenant", "key", "rotate", "acme", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rotated: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(rotated["rewrapped"].as_u64() >= Some(4), "the credential and three sessions' CA keys: {rotated}");
    bao("POST", &format!("transit/keys/{key}/config"), json!({ "min_decryption_version": 2 }));
    let rotated_session = env.session(&["gh"]);
    assert_eq!(env.injected(&rotated_session, "/rotated").as_deref(), Some(format!("Bearer {secret}").as_str()));

    // Back to the local key: the KMS is needed no more.
    let out = env.server.cli(&["tenant", "key", "set", "acme", "--provider", "local"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    allow(&key, false);
    let local = env.session(&["gh"]);
    assert_eq!(env.injected(&local, "/local").as_deref(), Some(format!("Bearer {secret}").as_str()));
    assert!(env.sealed_refs().split_whitespace().all(|r| r == "local"), "{}", env.sealed_refs());
}

/// Bad settings are refused before anything changes: 400 for what cannot name a key, 503
/// `key_unavailable` for a key the KMS refuses; the tenant stays on its key.
#[test]
fn unusable_key_settings_are_refused_and_change_nothing() {
    require_root!();
    let (address, _) = openbao();
    let server = Server::start_with(&["--pool", ""]);
    let tenant = server.tenant_key("acme");
    let put = |body: Value| server.call_as(&tenant, "PUT", "/v1/tenants/acme/key", Some(body));
    for body in [
        json!({ "provider": "openbao", "address": address, "key": "k" }),
        json!({ "provider": "openbao", "address": "ftp://x", "key": "k", "token": "t" }),
        json!({ "provider": "openbao", "address": address, "key": "../sys", "token": "t" }),
        json!({ "provider": "local", "token": "t" }),
        json!({ "provider": "kms" }),
    ] {
        let (status, r) = put(body.clone());
        assert_eq!((status, r["error"]["code"].as_str()), (400, Some("bad_request")), "{body}: {r}");
    }
    // A tenant's own key may not be at a loopback address, nor over plain HTTP.
    for address in [address.clone(), address.replace("http://", "https://")] {
        let (status, r) = put(json!({ "provider": "openbao", "address": address, "key": "k", "token": "t" }));
        assert_eq!((status, r["error"]["code"].as_str()), (400, Some("bad_request")), "{address}: {r}");
    }
    // The admin's may (an operator's KMS): a key that does not exist, with a token the KMS does
    // not know, is refused by the KMS, and a tenant the admin named is not created for it.
    let body = json!({ "provider": "openbao", "address": address, "key": "missing", "token": "s.bogus" });
    let (status, r) = server.call("PUT", "/v1/tenants/acme/key", Some(body.clone()));
    assert_eq!((status, r["error"]["code"].as_str()), (503, Some("key_unavailable")), "{r}");
    let (status, r) = server.call("PUT", "/v1/tenants/ghost/key", Some(body));
    assert_eq!((status, r["error"]["code"].as_str()), (503, Some("key_unavailable")), "{r}");
    let (status, r) = server.call("GET", "/v1/tenants/ghost/key", None);
    assert_eq!(
        (status, r["error"]["code"].as_str()),
        (404, Some("not_found")),
        "a refused key created its tenant: {r}"
    );
    let (status, r) = server.call_as(&tenant, "GET", "/v1/tenants/acme/key", None);
    assert_eq!((status, r["provider"].as_str()), (200, Some("local")), "{r}");
}

/// Every file under `dir` that holds `marker`.
fn files_holding(dir: &std::path::Path, marker: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let (path, kind) = (entry.path(), entry.file_type().unwrap());
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() && std::fs::read(&path).unwrap().windows(marker.len()).any(|w| w == marker) {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

/// Resumes suspended session `id` with `key` revoked (503 `key_unavailable`, the session
/// still suspended), then with it allowed again; the resumed session.
fn resume_only_with_key(server: &Server, tenant: &str, id: &str, key: &str) -> Value {
    allow(key, false);
    let resume = || server.call_as(tenant, "POST", &format!("/v1/sessions/{id}/resume"), Some(json!({})));
    assert_key_unavailable(resume(), key);
    let (_, r) = server.call_as(tenant, "GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(r["state"], "suspended", "a refused resume leaves the session as it was: {r}");
    allow(key, true);
    let (status, r) = resume();
    assert_eq!((status, r["state"].as_str()), (200, Some("running")), "{r}\n{}", server.log_text());
    r
}

/// Two nodes sharing a blob store (a directory): a tenant's session with a marker in a file
/// and in a process's memory is suspended into the blob store, where no object holds the
/// marker; its node cordoned, it resumes on the other node only while the tenant's key is
/// usable (503 `key_unavailable` while it is revoked, the session still suspended), with its
/// file and its process there.
#[test]
fn a_tenants_suspended_session_is_encrypted_in_the_blob_store_and_moves_only_with_its_key() {
    require_root!();
    let (key, token) = customer_key();
    let blobs = tempfile::Builder::new().prefix("space-test-blobs-").tempdir_in("/var/tmp").unwrap();
    let store = blobs.path().to_str().unwrap().to_owned();
    let mut server = Server::start_split(&["--blob-store", &store, "--key-cache-ttl", "0"]);
    let second = ExtraNode::start_with(&server, "2", &["--blob-store", &store]);
    server.add_node(&second);
    let tenant = server.tenant_key("acme");
    set_key(&server, "acme", &key, &token);

    let marker = format!("byok-marker-{}", random_hex(12));
    let (status, r) = server.call_as(&tenant, "POST", "/v1/sessions", Some(json!({})));
    assert_eq!(status, 201, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let exec = |body: Value| server.call_as(&tenant, "POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    // In a file, and in the memory of a process (its environment), never on a command line
    // of the host: the value comes on stdin.
    let script = "read m; echo $m > /root/marker; M=$m exec sleep 100000 < /dev/null > /dev/null 2>&1 &";
    let (status, r) = exec(json!({ "cmd": ["sh", "-c", script], "stdin": format!("{marker}\n") }));
    assert_eq!((status, r["exit_code"].as_i64()), (200, Some(0)), "{r}");
    let (status, r) = server.call_as(&tenant, "POST", &format!("/v1/sessions/{id}/suspend"), Some(json!({})));
    assert_eq!((status, r["state"].as_str()), (200, Some("suspended")), "{r}");
    let placed = r["node"].as_str().map(str::to_owned);
    let (_, list) = server.call_as(&tenant, "GET", &format!("/v1/sessions/{id}/snapshots"), None);
    let snapshot = list["snapshots"].as_array().unwrap().last().cloned().unwrap();
    assert_eq!((snapshot["kind"].as_str(), snapshot["durable"].as_bool()), (Some("full"), Some(true)), "{list}");
    let holding = files_holding(blobs.path(), marker.as_bytes());
    assert!(holding.is_empty(), "the blob store holds the marker in clear: {holding:?}");
    // The search finds the marker where it is.
    let known = tempfile::tempdir().unwrap();
    std::fs::create_dir(known.path().join("deep")).unwrap();
    std::fs::write(known.path().join("deep/known"), format!("before {marker} after")).unwrap();
    assert_eq!(files_holding(known.path(), marker.as_bytes()).len(), 1, "the search does not work");
    let placed = placed.unwrap_or_else(|| server.node_id());

    let out = server.cli(&["node", "cordon", &placed]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = resume_only_with_key(&server, &tenant, &id, &key);
    assert_ne!(r["node"].as_str(), Some(placed.as_str()), "it moved off the cordoned node: {r}");
    let (status, r) = exec(
        json!({ "cmd": ["sh", "-c", "cat /root/marker; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c byok-marker"] }),
    );
    assert_eq!(status, 200, "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(out.starts_with(&format!("{marker}\n")) && !out.ends_with("\n0\n"), "file and process came back: {r}");
}

/// One node without a blob store: a tenant's session suspended onto the node's own disk has
/// its process images sealed there (no file of the node's images holds a marker a process
/// kept in memory, and nothing stays in memory after), and it resumes only while the
/// tenant's key is usable (503 `key_unavailable` while revoked, the session still suspended).
#[test]
fn a_tenants_suspended_session_is_sealed_on_its_nodes_disk_and_resumes_only_with_its_key() {
    require_root!();
    let (key, token) = customer_key();
    let server = Server::start_with(&["--key-cache-ttl", "0"]);
    let tenant = server.tenant_key("acme");
    set_key(&server, "acme", &key, &token);
    let (status, r) = server.call_as(&tenant, "POST", "/v1/sessions", Some(json!({})));
    assert_eq!(status, 201, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let exec = |body: Value| server.call_as(&tenant, "POST", &format!("/v1/sessions/{id}/exec"), Some(body));
    // Only in a process's memory (its environment): a file would be in the snapshot's root,
    // which is a btrfs subvolume like the running sandbox's (docs/byok.md).
    let marker = format!("byok-memory-{}", random_hex(12));
    let script = "read m; M=$m exec sleep 100000 < /dev/null > /dev/null 2>&1 &";
    let (status, r) = exec(json!({ "cmd": ["sh", "-c", script], "stdin": format!("{marker}\n") }));
    assert_eq!((status, r["exit_code"].as_i64()), (200, Some(0)), "{r}");
    let (status, r) = server.call_as(&tenant, "POST", &format!("/v1/sessions/{id}/suspend"), Some(json!({})));
    assert_eq!((status, r["state"].as_str()), (200, Some("suspended")), "{r}");
    let images = server.data_dir.join("images");
    let held: Vec<_> = std::fs::read_dir(images.join(&id)).unwrap().flatten().collect();
    assert!(!held.is_empty(), "no images of the session under {}", images.display());
    let holding = files_holding(&images, marker.as_bytes());
    assert!(holding.is_empty(), "the node's images hold the marker in clear: {holding:?}");
    // The node's tmpfs (docs/operator-guide.md): mounted there, the node's alone.
    let own = space_node::in_memory_root(&server.data_dir);
    let tmpfs = nix::sys::statfs::statfs(&own).unwrap().filesystem_type() == nix::sys::statfs::TMPFS_MAGIC;
    let (meta, data) = (std::fs::metadata(&own).unwrap(), std::fs::metadata(&server.data_dir).unwrap());
    assert!(tmpfs && meta.dev() != data.dev(), "the node mounted no tmpfs at {}", own.display());
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o700), "{}", own.display());
    let in_memory = files_holding(&own, marker.as_bytes());
    assert!(in_memory.is_empty(), "images left in clear in memory: {in_memory:?}");

    resume_only_with_key(&server, &tenant, &id, &key);
    let (status, r) = exec(
        json!({ "cmd": ["sh", "-c", "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c byok-memory"] }),
    );
    assert_eq!(status, 200, "{r}");
    assert_ne!(r["stdout"].as_str(), Some("0\n"), "the process came back: {r}");
}

/// An OAuth credential under the tenant's key: its client secret is sealed with it, so while
/// the key is revoked no token can be asked for (the credential says `failing` with the key's
/// `key_unavailable` message), and once it is back the refresher gets tokens again.
#[test]
fn an_oauth_credentials_tokens_need_the_tenants_key() {
    require_root!();
    let (key, token) = customer_key();
    let env = Env::start(&["granted.test", "oauth.test"]);
    set_key(&env.server, "acme", &key, &token);

    let oauth = env.up.oauth();
    oauth.set_expires_in(61);
    let body = json!({
        "name": "api", "hosts": ["granted.test"], "kind": "oauth2",
        "oauth2": { "token_url": "https://oauth.test/oauth/token", "client_id": oauth.client_id,
                    "client_secret": oauth.client_secret, "grant_type": "client_credentials" }
    });
    let (status, r) = env.server.call_as(&env.tenant, "POST", "/v1/credentials", Some(body));
    assert_eq!(status, 201, "{r}");
    let id = env.session(&["api"]);
    assert_eq!(env.injected(&id, "/first"), Some(format!("Bearer {}", oauth.issued()[0])));

    let status_of = |want: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        loop {
            let (_, c) = env.server.call_as(&env.tenant, "GET", "/v1/credentials/api", None);
            if c["oauth2"]["status"] == want {
                return c;
            }
            assert!(std::time::Instant::now() < deadline, "never {want}: {c}");
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    };
    allow(&key, false);
    let c = status_of("failing");
    let reason = c["oauth2"]["reason"].as_str().unwrap();
    assert!(reason.contains(&key) && reason.contains("403"), "{reason}");
    let asked = oauth.token_requests();

    allow(&key, true);
    status_of("ok");
    assert!(oauth.token_requests() > asked, "no new token after the key came back");
}
