//! The real control plane (HTTP API on a loopback port, SQLite store in a temporary data
//! dir, authentication, idempotency, reconciler, recovery) over a simulated node: no root,
//! no btrfs, no CRIU.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use space_control::{HttpLimits, ServerConfig};
use space_node_sim::{SimConfig, SimNode};

pub struct Server {
    pub url: String,
    /// The operator's metrics listener (`GET /metrics`, no key).
    pub metrics_url: String,
    /// The admin key.
    pub admin: String,
    /// The node the control plane drives (its first, when it drives several); the test
    /// steers and inspects it.
    pub sim: Arc<SimNode>,
    /// Every node it drives, `sim` first.
    pub sims: Vec<Arc<SimNode>>,
    http: reqwest::Client,
    /// Everything the server runs (API, reconciler, the node's agents) runs here: dropping
    /// it stops all of it at once, as `kill -9` would.
    runtime: Option<tokio::runtime::Runtime>,
    /// Cancelling it stops the API gracefully (see [`Server::stop_gracefully`]); `serving`
    /// ends once that stop has finished.
    graceful: tokio_util::sync::CancellationToken,
    serving: Option<tokio::task::JoinHandle<()>>,
    // Last: removed after the server stopped using it.
    dir: Arc<tempfile::TempDir>,
}

/// A server that was stopped: its data dir and its node, to start again.
pub struct Stopped {
    pub sims: Vec<Arc<SimNode>>,
    dir: Arc<tempfile::TempDir>,
}

/// How the control plane reaches the simulated node: `in-process` (the default, as in
/// `space serve`) or `wire` (the node API's network form: mutual TLS on loopback, the
/// control plane holding a `RemoteNode`). The test command runs the suite both ways.
const NODE_VAR: &str = "SPACE_CONTRACT_NODE";

/// `sim` served on a loopback port with a cluster of its own, and the control plane's
/// client of it.
/// `staging` is where the node's server keeps the files sent to it.
async fn over_the_wire(sim: Arc<SimNode>, staging: std::path::PathBuf) -> Arc<dyn space_node_api::NodeApi> {
    use space_node_wire::cluster::{ClusterCa, Role};
    use space_node_wire::tls::{client_config, server_config};
    let ca = ClusterCa::generate("contract").expect("a cluster CA");
    // The node's certificate names it: as the simulated node names itself.
    let name = space_node_api::NodeApi::node_id(sim.as_ref());
    let node = ca.issue(Role::Node, &name, &["127.0.0.1".into()]).expect("a node certificate");
    let control = ca.issue(Role::Control, "control-1", &[]).expect("a control certificate");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let address = listener.local_addr().expect("its address").to_string();
    let tls = server_config(&node, &ca.cert_pem).expect("the node's TLS");
    tokio::spawn(space_node_wire::serve(listener, tls, sim.api(), staging, std::future::pending()));
    let client = space_node_wire::NodeClient::new(&address, client_config(&control, &ca.cert_pem).expect("TLS"))
        .expect("a node client");
    space_node_wire::RemoteNode::connect(client).await.expect("the node answers")
}

/// (status, JSON body) of a response.
pub type Reply = (u16, Value);

impl Server {
    pub async fn start() -> Server {
        Server::start_with(SimConfig::default()).await
    }

    pub async fn start_with(sim: SimConfig) -> Server {
        Server::start_with_nodes(vec![sim]).await
    }

    /// A control plane driving a simulated node of each config (give each its own `node_id`).
    pub async fn start_with_nodes(sims: Vec<SimConfig>) -> Server {
        let dir = Arc::new(tempfile::tempdir().expect("temporary data dir"));
        Server::start_on(dir, sims.into_iter().map(SimNode::new).collect()).await
    }

    /// Starts the control plane on `dir` over `sims`, in a runtime of its own.
    async fn start_on(dir: Arc<tempfile::TempDir>, sims: Vec<Arc<SimNode>>) -> Server {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the server's runtime");
        let mut nodes = Vec::new();
        for (i, sim) in sims.iter().enumerate() {
            let staging = dir.path().join(format!("node-{i}-staged"));
            nodes.push(match std::env::var(NODE_VAR).as_deref() {
                Ok("wire") => {
                    runtime.spawn(over_the_wire(sim.clone(), staging)).await.expect("the node's wire server starts")
                }
                Ok("in-process") | Err(_) => sim.api(),
                Ok(other) => panic!("{NODE_VAR}={other:?}: use \"wire\" or \"in-process\""),
            });
        }
        let data_dir = dir.path().to_owned();
        let graceful = tokio_util::sync::CancellationToken::new();
        let (url, metrics_url, serving) =
            runtime.spawn(serve(data_dir, nodes, graceful.clone())).await.expect("the control plane starts");
        let admin = std::fs::read_to_string(dir.path().join("admin.key")).expect("the admin key").trim().to_owned();
        let http = reqwest::Client::new();
        let sim = sims[0].clone();
        let serving = Some(serving);
        let server =
            Server { url, metrics_url, admin, sim, sims, http, runtime: Some(runtime), graceful, serving, dir };
        server.wait_for_template("busybox").await;
        server
    }

    /// Stops the server as `space serve` does on SIGTERM: the API stops accepting and waits
    /// for its requests and their changes, then the reconciler for its operations. The
    /// handle ends when all of that has.
    pub fn stop_gracefully(&mut self) -> tokio::task::JoinHandle<()> {
        self.graceful.cancel();
        self.serving.take().expect("stopped once")
    }

    /// Stops everything the server runs, at once (no graceful shutdown): the crash that
    /// recovery is for. The node's sandboxes and snapshots stay.
    pub fn stop(mut self) -> Stopped {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        Stopped { sims: self.sims.clone(), dir: self.dir.clone() }
    }

    /// Waits until template `name` is built (the start-up build runs on the reconciler), so
    /// a test's injected failures meet only its own calls.
    pub async fn wait_for_template(&self, name: &str) {
        for _ in 0..500 {
            let (_, list) = self.call("GET", "/v1/templates", None).await;
            if list["templates"].as_array().is_some_and(|t| t.iter().any(|t| t["name"] == name)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("template {name} was never built");
    }

    /// The metrics as a scraper gets them (no key).
    pub async fn scrape(&self) -> String {
        let response = self.http.get(format!("{}/metrics", self.metrics_url)).send().await.expect("a scrape");
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap_or_default().to_owned();
        assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
        response.text().await.expect("the metrics")
    }

    /// A call with `key` and `headers`; `body` is sent as it is, typed as JSON. Returns the
    /// status, the body (JSON, or the text as a string) and the headers.
    pub async fn send(
        &self,
        key: &str,
        method: &str,
        path: &str,
        body: Option<String>,
        headers: &[(&str, &str)],
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut request = self.http.request(method, format!("{}{path}", self.url)).bearer_auth(key);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body);
        }
        let response = request.send().await.expect("the server answers");
        let (status, headers) = (response.status().as_u16(), response.headers().clone());
        let text = response.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)), headers)
    }

    /// `POST path` with `key` and raw `body` (an upload).
    pub async fn post_bytes(&self, key: &str, path: &str, body: Vec<u8>) -> Reply {
        let request = self.http.post(format!("{}{path}", self.url)).bearer_auth(key);
        let response = request.body(body).send().await.expect("the server answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub async fn call_as(&self, key: &str, method: &str, path: &str, body: Option<Value>) -> Reply {
        let (status, body, _) = self.send(key, method, path, body.map(|b| b.to_string()), &[]).await;
        (status, body)
    }

    /// A call with the admin key.
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        self.call_as(&self.admin.clone(), method, path, body).await
    }

    /// The server's data dir.
    pub fn data_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The server's database, as a control replica named `name` sees it: for what another
    /// replica would be doing meanwhile.
    pub async fn store_as(&self, name: &str) -> space_store::Store {
        let store = match std::fs::read_to_string(self.data_dir().join("database-url")) {
            Ok(url) => space_store::Store::open(&url).await,
            Err(_) => space_store::Store::open_sqlite(&self.data_dir().join("space.db")).await,
        };
        store.expect("the server's database").as_replica(name)
    }

    /// A new key of tenant `name`.
    pub async fn tenant_key(&self, name: &str) -> String {
        let (status, body) = self.call("POST", "/v1/keys", Some(json!({ "tenant": name }))).await;
        assert_eq!(status, 201, "{body}");
        body["key"].as_str().expect("a key").to_owned()
    }

    /// A running session of `key`'s tenant; returns its id.
    pub async fn session_as(&self, key: &str) -> String {
        let (status, body) = self.call_as(key, "POST", "/v1/sessions", Some(json!({}))).await;
        assert_eq!((status, body["state"].as_str()), (201, Some("running")), "{body}");
        body["id"].as_str().expect("an id").to_owned()
    }

    pub async fn session(&self) -> String {
        self.session_as(&self.admin.clone()).await
    }

    /// The session as its owner (the admin) sees it.
    pub async fn get(&self, id: &str) -> Value {
        let (status, body) = self.call("GET", &format!("/v1/sessions/{id}"), None).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `POST /v1/sessions/{id}/{action}` as the admin.
    pub async fn act(&self, id: &str, action: &str, body: Value) -> Reply {
        self.call("POST", &format!("/v1/sessions/{id}/{action}"), Some(body)).await
    }

    /// A snapshot of `kind` of session `id`; returns its id.
    pub async fn snapshot(&self, id: &str, kind: &str) -> String {
        let (status, body) = self.act(id, "snapshots", json!({ "kind": kind })).await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().expect("a snapshot id").to_owned()
    }

    /// Runs a command in the session (JSON exec) as the admin.
    pub async fn exec(&self, id: &str, cmd: &[&str]) -> Reply {
        self.act(id, "exec", json!({ "cmd": cmd })).await
    }

    /// Waits for session `id` to reach `state`: for what the reconciler does off the request
    /// (a sandbox whose init died). Bounded so a broken promise fails instead of hanging.
    pub async fn wait_for_state(&self, id: &str, state: &str) -> Value {
        for _ in 0..500 {
            let session = self.get(id).await;
            if session["state"] == state {
                return session;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("session {id} never became {state}: {}", self.get(id).await);
    }
}

impl Server {
    /// Writes `text` to `path` in session `id` (through the files API and the node's agent).
    pub async fn write_file(&self, id: &str, path: &str, text: &str) {
        let uri = format!("/v1/sessions/{id}/files/content?path={path}");
        let (status, body, _) = self.send(&self.admin, "PUT", &uri, Some(text.to_owned()), &[]).await;
        assert!((200..300).contains(&status), "writing {path}: {status} {body}");
    }

    /// The text of `path` in session `id`.
    pub async fn read_file(&self, id: &str, path: &str) -> String {
        let (status, body) = self.call("GET", &format!("/v1/sessions/{id}/files/content?path={path}"), None).await;
        assert_eq!(status, 200, "reading {path}: {body}");
        body.as_str().unwrap_or_else(|| panic!("{path} is not text: {body}")).to_owned()
    }

    /// Waits for operation `id` (the admin's) to finish; returns it.
    pub async fn wait_operation(&self, id: &str) -> Value {
        self.wait_operation_as(&self.admin.clone(), id).await
    }

    /// Waits for operation `id` of `key`'s tenant to end.
    pub async fn wait_operation_as(&self, key: &str, id: &str) -> Value {
        for _ in 0..500 {
            let (status, op) = self.call_as(key, "GET", &format!("/v1/operations/{id}"), None).await;
            assert_eq!(status, 200, "{op}");
            if op["state"] == "succeeded" || op["state"] == "failed" {
                return op;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("operation {id} never finished");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Stopped {
    /// A new server process on the same data dir, over the node as it finds it then.
    pub async fn start(self) -> Server {
        Server::start_on(self.dir, self.sims.iter().map(|sim| sim.restarted()).collect()).await
    }
}

/// The server's preview domain: `{port}-{session}.preview.test` hosts reach ports.
pub const PREVIEW_DOMAIN: &str = "preview.test";

/// The disk limit of sessions created without one.
pub const DEFAULT_DISK_MIB: u64 = 1024;

/// Starts the control plane and serves it, and its metrics, on loopback ports, until
/// `graceful` is cancelled; returns their URLs and the task serving the API.
async fn serve(
    data_dir: std::path::PathBuf,
    nodes: Vec<Arc<dyn space_node_api::NodeApi>>,
    graceful: tokio_util::sync::CancellationToken,
) -> (String, String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let metrics_url = format!("http://{}", metrics.local_addr().expect("the port"));
    let config = ServerConfig {
        key_file: data_dir.join("keys/master.key"),
        key_cache_ttl: std::time::Duration::ZERO,
        database: database(&data_dir).await,
        data_dir,
        listen: listener.local_addr().expect("the port"),
        default_template: "busybox".into(),
        default_runtime: space_api::RuntimeKind::Linux,
        // No scheduled snapshots: each test takes those it counts.
        snapshot_policy: space_api::SnapshotPolicy::off(),
        scheduler_tick: Duration::from_secs(3600),
        prepare_templates: vec!["busybox".into()],
        audit_retention: None,
        allow_wildcard_credential_hosts: false,
        http: HttpLimits::default(),
        default_disk_mib: DEFAULT_DISK_MIB,
        preview_domain: Some(PREVIEW_DOMAIN.into()),
        e2b_domain: None,
        e2b_internet_by_default: false,
        replica: space_store::DEFAULT_REPLICA.into(),
        // Token endpoints anywhere: the contract tests run theirs on loopback.
        oauth: Default::default(),
    };
    let state =
        space_control::start(&config, async |_node_id: &str| Ok(nodes)).await.expect("the control plane starts");
    tokio::spawn(space_control::serve_metrics(state.clone(), metrics, std::future::pending()));
    let reconciler = state.reconciler.clone();
    let serving = tokio::spawn(async move {
        space_control::serve(state, listener, graceful.cancelled_owned()).await.expect("serving the API");
        reconciler.stop().await;
    });
    (format!("http://{}", config.listen), metrics_url, serving)
}

/// The database of the server on `data_dir`: SQLite in it, or, when the tests run under
/// `scripts/with-postgres.sh`, a PostgreSQL database of its own, made at its first start and
/// named in `DATA_DIR/database-url` for the starts after a crash, and reached through a proxy
/// ([`crate::database::Outage`]).
async fn database(data_dir: &std::path::Path) -> Option<String> {
    let server = space_store::testing::postgres_server()?;
    let file = data_dir.join("database-url");
    let url = match std::fs::read_to_string(&file) {
        Ok(url) => url,
        Err(_) => {
            let url = space_store::testing::create_database(&server).await.expect("a database on the test server");
            std::fs::write(&file, &url).expect("writing the database URL");
            url
        }
    };
    // Through a proxy of the test's, which can cut the server off its database.
    Some(crate::database::through_proxy(data_dir, &url))
}

/// (code, message) of an error envelope; panics on anything else.
pub fn error_of(body: &Value) -> (&str, &str) {
    let code = body["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error envelope: {body}"));
    (code, body["error"]["message"].as_str().unwrap_or_default())
}

/// Asserts that `reply` is the error `code` with `status`.
#[track_caller]
pub fn assert_error(reply: &Reply, status: u16, code: &str) {
    assert_eq!((reply.0, error_of(&reply.1).0), (status, code), "{}", reply.1);
}
