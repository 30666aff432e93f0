//! Harness for the root-only integration tests: a real `space serve` on a private data dir
//! (its own loop-mounted btrfs pool and cgroup parent), torn down even when a test fails.
#![allow(dead_code)]

pub mod counter;
pub mod nodes;
pub mod oauth;
pub mod replicas;
pub mod upstream;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{Value, json};

pub const SPACE: &str = env!("CARGO_BIN_EXE_space");

/// Fails a test that cannot run because it is not root: sandboxes need it, and a skipped
/// test would pass without testing anything.
#[macro_export]
macro_rules! require_root {
    () => {
        assert!(
            nix::unistd::Uid::effective().is_root(),
            "this test creates real sandboxes and needs root: run it as root (scripts/test.sh)"
        );
    };
}

pub fn spaced_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SPACED_BIN") {
        return p.into();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/x86_64-unknown-linux-gnu/release/spaced")
}

/// The runtime sessions of the test servers run in by default: `SPACE_TEST_RUNTIME`
/// (`linux` when unset). The suites that hold for both runtimes run once per runtime
/// (scripts/test.sh); anything else fails loudly rather than testing the wrong thing.
pub fn runtime() -> String {
    let runtime = std::env::var("SPACE_TEST_RUNTIME").unwrap_or_else(|_| "linux".into());
    assert!(matches!(runtime.as_str(), "linux" | "vm"), "SPACE_TEST_RUNTIME={runtime:?}: expected linux or vm");
    runtime
}

/// How the test servers run: `serve` (one `space serve`, the default) or `split` (a `space
/// node run` and a `space control` driving it over the node API's mutual TLS on loopback,
/// with data dirs of their own). The suites that hold for both run once per topology
/// (scripts/test.sh).
pub fn topology() -> Topology {
    match std::env::var("SPACE_TEST_TOPOLOGY").as_deref() {
        Ok("serve") | Err(_) => Topology::Serve,
        Ok("split") => Topology::Split,
        Ok(other) => panic!("SPACE_TEST_TOPOLOGY={other:?}: expected serve or split"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    Serve,
    Split,
}

/// Flags of `space serve` that are the node's (`space node run` takes them); the others are
/// the control plane's.
const NODE_FLAGS: &[&str] = &[
    "--pool",
    "--pool-size-gib",
    "--pool-fill-concurrency",
    "--build-step-disk",
    "--build-cache-max-age",
    "--start-concurrency",
    "--template-cache",
    "--cgroup-parent",
    "--spaced",
    "--criu",
    "--qemu",
    "--vm-jailer",
    "--vm-guest-dir",
    "--uid-base",
    "--blob-store",
];

/// `sh -c` script that mounts a tmpfs of its own over `$1/uploads`, then runs the rest of its
/// arguments (in the mount namespace `unshare` made, so only that process sees the mount).
const HIDE_UPLOADS: &str = r#"dir=$1; shift; mkdir -p "$dir/uploads" && mount -t tmpfs -o mode=0700,size=2g space-uploads "$dir/uploads" && exec "$@""#;

/// `args` split into the node's flags and the control plane's, each flag with its value.
fn split_flags(args: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut node, mut control) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].split('=').next().unwrap_or_default();
        let takes_value = !args[i].contains('=') && args.get(i + 1).is_some_and(|v| !v.starts_with("--"));
        let end = if takes_value { i + 2 } else { i + 1 };
        let to = if NODE_FLAGS.contains(&flag) || flag.starts_with("--gateway-") { &mut node } else { &mut control };
        to.extend_from_slice(&args[i..end]);
        i = end;
    }
    (node, control)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

pub struct Server {
    pub data_dir: PathBuf,
    pub url: String,
    pub key: String,
    pub cgroup_parent: String,
    /// Extra `space serve` flags, used by every (re)start.
    pub extra_args: Vec<String>,
    port: u16,
    child: Option<Child>,
    /// `split`: the node's process, and the port of its node API.
    node_child: Option<Child>,
    node_port: u16,
    pub topology: Topology,
    log: PathBuf,
    /// Known once the server answered: its sandboxes' cgroups are below
    /// `<cgroup_parent>/<node id>`, and only those are removed on drop.
    node: Option<String>,
    /// `split`: the addresses of more nodes its control plane drives ([`nodes::ExtraNode`]).
    pub(crate) extra_nodes: Vec<String>,
}

impl Server {
    /// Starts a server whose default template is `busybox` (built at start), with the default
    /// warm pool (4 busybox pods).
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Like [`Server::start`], with extra `space serve` flags (e.g. `--pool`).
    pub fn start_with(extra_args: &[&str]) -> Server {
        Server::start_in(None, extra_args)
    }

    /// Like [`Server::start`], but with the cgroup parent of `other` (as two servers on one
    /// host with the default `--cgroup-parent` have).
    pub fn start_sharing_cgroup_parent(other: &Server) -> Server {
        Server::start_in(Some(&other.cgroup_parent), &[])
    }

    /// A `split` server whatever `SPACE_TEST_TOPOLOGY` says, for what only it has.
    pub fn start_split(extra_args: &[&str]) -> Server {
        Server::start_as(Topology::Split, None, extra_args)
    }

    fn start_in(cgroup_parent: Option<&str>, extra_args: &[&str]) -> Server {
        Server::start_as(topology(), cgroup_parent, extra_args)
    }

    fn start_as(topology: Topology, cgroup_parent: Option<&str>, extra_args: &[&str]) -> Server {
        let tag: String = (0..8).map(|_| rand::rng().random_range(b'a'..=b'z') as char).collect();
        let data_dir = PathBuf::from(format!("/var/tmp/space-test-{tag}"));
        std::fs::create_dir_all(&data_dir).unwrap();
        let port = free_port();
        let mut server = Server {
            log: data_dir.with_extension("log"),
            data_dir,
            url: format!("http://127.0.0.1:{port}"),
            key: String::new(),
            cgroup_parent: cgroup_parent.map_or_else(|| format!("space-test-{tag}"), str::to_owned),
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            port,
            child: None,
            node_child: None,
            node_port: free_port(),
            topology,
            node: None,
            extra_nodes: Vec::new(),
        };
        // Another test's server may bind the free port first: then take another (only at the
        // first start, before any test has the URL).
        for _ in 0..5 {
            match server.try_spawn() {
                Ok(()) => return server,
                Err(e) if e.contains("Address already in use") => {
                    server.port = free_port();
                    server.node_port = free_port();
                    server.url = format!("http://127.0.0.1:{}", server.port);
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("no free port for space serve in 5 tries; log:\n{}", server.log_text())
    }

    /// (Re)starts the server process on the same data dir and port. While the server was
    /// down, a short-lived connection of another test may have taken the port as its local
    /// one: then the bind fails for a moment, and the start is tried again.
    pub fn spawn(&mut self) {
        for _ in 0..10 {
            match self.try_spawn() {
                Ok(()) => return,
                Err(e) if e.contains("Address already in use") => std::thread::sleep(Duration::from_millis(300)),
                Err(e) => panic!("{e}"),
            }
        }
        panic!("port {} stayed in use; log:\n{}", self.port, self.log_text());
    }

    /// Starts the server process; `Err` (with its log) if it exited before it was ready.
    fn try_spawn(&mut self) -> Result<(), String> {
        if self.topology == Topology::Split {
            return self.try_spawn_split();
        }
        let child = self.launch(
            "space serve",
            Command::new(SPACE)
                .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
                .args(["--default-template", "busybox", "--prepare-templates", "busybox"])
                .args(["--default-runtime", &runtime()])
                .args(["--cgroup-parent", &self.cgroup_parent])
                .args(
                    if self.extra_args.iter().any(|a| a == "--pool-size-gib") {
                        None
                    } else {
                        Some(["--pool-size-gib", "8"])
                    }
                    .into_iter()
                    .flatten(),
                )
                .arg("--data-dir")
                .arg(&self.data_dir)
                .arg("--spaced")
                .arg(spaced_bin())
                .args(&self.extra_args),
        );
        self.child = Some(child);
        self.wait_ready()
    }

    /// Starts `command` with its output appended to the server's log.
    pub fn launch(&self, what: &str, command: &mut Command) -> Child {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        command.spawn().unwrap_or_else(|e| panic!("starting {what}: {e}"))
    }

    /// Where the admin key is: the control plane's data dir.
    fn control_dir(&self) -> PathBuf {
        match self.topology {
            Topology::Serve => self.data_dir.clone(),
            Topology::Split => self.data_dir.join("control"),
        }
    }

    /// `split`: a cluster of its own (made at the first start), the node, then the control
    /// plane over it.
    fn try_spawn_split(&mut self) -> Result<(), String> {
        let cluster = self.cluster_dir();
        // The node's name is its id, which names its cgroups: unique, as servers may share
        // a cgroup parent.
        let tag = self.data_dir.file_name().unwrap().to_str().unwrap().trim_start_matches("space-test-");
        let name = format!("node-{tag}");
        if !cluster.join("ca.pem").exists() {
            let dir = cluster.to_str().unwrap();
            for args in [
                vec!["cluster", "init", "--dir", dir],
                vec!["cluster", "issue", "--dir", dir, "--role", "node", &name, "--host", "127.0.0.1"],
                vec!["cluster", "issue", "--dir", dir, "--role", "control", "control-1"],
            ] {
                let out = Command::new(SPACE).args(&args).output().expect("space cluster");
                assert!(out.status.success(), "space {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let (node_flags, control_flags) = split_flags(&self.extra_args);
        // A node left running (only the control plane was killed) is not started again.
        if self.node_child.is_none() {
            self.spawn_node(&cluster, &name, &node_flags);
        }
        // A control plane left running (only the node was killed) is not started again.
        if self.child.is_some() {
            return Ok(());
        }
        // The control plane keeps its uploads where its node cannot read them, as on a host of
        // its own: a mount of its own, in a mount namespace of its own.
        let control = self.launch(
            "space control",
            Command::new("unshare")
                .args(["--mount", "--propagation", "private", "--", "sh", "-c", HIDE_UPLOADS, "sh"])
                .arg(self.control_dir())
                .arg(SPACE)
                .args(["control", "--listen", &format!("127.0.0.1:{}", self.port)])
                .args(["--node", &format!("127.0.0.1:{}", self.node_port), "--name", "control-1"])
                .args(self.extra_nodes.iter().flat_map(|address| ["--node", address]))
                .arg("--cluster-dir")
                .arg(&cluster)
                .args(["--default-template", "busybox", "--prepare-templates", "busybox"])
                .args(["--default-runtime", &runtime()])
                .arg("--data-dir")
                .arg(self.control_dir())
                .args(&control_flags),
        );
        self.child = Some(control);
        self.wait_ready()
    }

    fn spawn_node(&mut self, cluster: &Path, name: &str, node_flags: &[String]) {
        let node = self.launch(
            "space node run",
            Command::new(SPACE)
                .args(["node", "run", "--listen", &format!("127.0.0.1:{}", self.node_port), "--name", name])
                .arg("--cluster-dir")
                .arg(cluster)
                .args(["--default-template", "busybox", "--default-runtime", &runtime()])
                .args(["--cgroup-parent", &self.cgroup_parent])
                .args(
                    if node_flags.iter().any(|a| a == "--pool-size-gib") {
                        None
                    } else {
                        Some(["--pool-size-gib", "8"])
                    }
                    .into_iter()
                    .flatten(),
                )
                .arg("--data-dir")
                .arg(&self.data_dir)
                .arg("--spaced")
                .arg(spaced_bin())
                .args(node_flags),
        );
        self.node_child = Some(node);
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let exited = |child: &mut Option<Child>| child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited(&mut self.child).or_else(|| exited(&mut self.node_child)) {
                self.kill9();
                return Err(format!("the server exited with {status}; log:\n{}", self.log_text()));
            }
            if let Ok(key) = std::fs::read_to_string(self.control_dir().join("admin.key")) {
                self.key = key.trim().to_owned();
                let templates = self.try_get("/v1/templates");
                let ready = templates
                    .as_ref()
                    .and_then(|t| t["templates"].as_array())
                    .is_some_and(|list| list.iter().any(|t| t["name"] == "busybox"));
                if ready {
                    self.node = Some(self.node_id());
                    return Ok(());
                }
            }
            assert!(Instant::now() < deadline, "server not ready in time; log:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: the crash the recovery tests simulate.
    /// The server process's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server runs").id()
    }

    /// Both processes in `split`: the node's host going down with its control plane, as a
    /// `space serve` does.
    pub fn kill9(&mut self) {
        for mut child in [self.child.take(), self.node_child.take()].into_iter().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `split`: `kill -9` of the node process alone (its sandboxes' `spaced` run on), then
    /// the node started again on its data dir; the control plane keeps running.
    pub fn restart_node(&mut self) {
        assert_eq!(self.topology, Topology::Split, "only a split server has a node process of its own");
        if let Some(mut child) = self.node_child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.try_spawn_split().unwrap_or_else(|e| panic!("{e}"));
    }

    /// `split`: the node's process id.
    pub fn node_pid(&self) -> u32 {
        self.node_child.as_ref().expect("a split server's node runs").id()
    }

    /// `split`: the cluster's directory (its CA and members' certificates).
    pub fn cluster_dir(&self) -> PathBuf {
        self.data_dir.join("cluster")
    }

    /// `split`: the node API's address.
    pub fn node_address(&self) -> String {
        format!("127.0.0.1:{}", self.node_port)
    }

    /// `split`: SIGKILL of the control plane alone; the node and its sandboxes keep running.
    pub fn kill9_control(&mut self) {
        assert_eq!(self.topology, Topology::Split, "only a split server has a control plane of its own");
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn try_get(&self, path: &str) -> Option<Value> {
        let out = curl(&["-sf", "-H", &self.auth(), &format!("{}{path}", self.url)]);
        out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
    }

    pub fn auth(&self) -> String {
        format!("Authorization: Bearer {}", self.key)
    }

    /// An HTTP call with the admin key; returns (status, JSON body or string).
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&self.key, method, path, body)
    }

    pub fn call_as(&self, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        request(&self.url, key, method, path, body)
    }

    /// An HTTP call with the admin key to another control replica at `base`.
    pub fn call_at(&self, base: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        request(base, &self.key, method, path, body)
    }

    /// POSTs a raw JSON body (curl data arguments) with the admin key; returns the status.
    pub fn post_raw(&self, path: &str, data: &[&str]) -> u16 {
        let auth = self.auth();
        let url = format!("{}{path}", self.url);
        let mut args = vec!["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-H", &auth];
        args.extend(["-H", "content-type: application/json"]);
        args.extend(data);
        args.push(&url);
        String::from_utf8_lossy(&curl(&args).stdout).parse().unwrap_or(0)
    }

    /// Runs the `space` CLI against this server.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_with_stdin(args, None)
    }

    pub fn cli_with_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        use std::io::Write;
        let mut child = Command::new(SPACE)
            .args(args)
            .env("SPACE_URL", &self.url)
            .env("SPACE_API_KEY", &self.key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running space");
        let mut input = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            input.write_all(bytes).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    }

    pub fn create_session(&self, body: Value) -> String {
        let (status, session) = self.call("POST", "/v1/sessions", Some(body));
        assert_eq!(status, 201, "create failed: {session}\n{}", self.log_text());
        session["id"].as_str().unwrap().to_owned()
    }

    pub fn exec(&self, id: &str, cmd: &[&str]) -> Value {
        let (status, result) = self.call("POST", &format!("/v1/sessions/{id}/exec"), Some(json!({ "cmd": cmd })));
        assert_eq!(status, 200, "exec {cmd:?} failed: {result}");
        result
    }

    /// A new API key of `tenant` (`space key create`).
    pub fn tenant_key(&self, tenant: &str) -> String {
        let out = self.cli(&["key", "create", "--tenant", tenant]);
        assert!(out.status.success(), "key create: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// This server's node id (`GET /v1/status`).
    pub fn node_id(&self) -> String {
        let (status, body) = self.call("GET", "/v1/status", None);
        assert_eq!(status, 200, "{body}");
        body["node_id"].as_str().expect("node_id in status").to_owned()
    }

    /// The cgroup of `sandbox` in `controller` (sandboxes sit in a directory named by their
    /// node's id below the cgroup parent).
    pub fn sandbox_cgroup(&self, controller: &str, sandbox: &str) -> PathBuf {
        Path::new("/sys/fs/cgroup").join(controller).join(&self.cgroup_parent).join(self.node_id()).join(sandbox)
    }

    /// Host pids of processes inside this server's sandbox cgroups.
    pub fn sandbox_pids(&self) -> Vec<u32> {
        cgroup_dirs(&self.cgroup_parent).iter().flat_map(|d| read_pids(&d.join("cgroup.procs"))).collect()
    }

    /// Sandbox cgroups that still exist under this server's parent.
    pub fn sandbox_cgroups(&self) -> Vec<PathBuf> {
        cgroup_dirs(&self.cgroup_parent)
    }

    /// The warm pool's state for `template`.
    pub fn pool(&self, template: &str) -> Value {
        let (status, pool) = self.call("GET", "/v1/pool", None);
        assert_eq!(status, 200, "{pool}");
        let templates = pool["templates"].as_array().cloned().unwrap_or_default();
        templates.into_iter().find(|t| t["template"] == template).unwrap_or(Value::Null)
    }

    /// Waits until `template`'s pool has at least `ready` pods.
    pub fn wait_pool_ready(&self, template: &str, ready: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let pool = self.pool(template);
            if pool["ready"].as_u64().unwrap_or(0) >= ready {
                return pool;
            }
            assert!(Instant::now() < deadline, "pool never reached {ready} ready: {pool}\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn sandbox_roots(&self) -> Vec<String> {
        list_names(&self.data_dir.join("pool/sandboxes"))
    }

    /// The sandboxes' agent directories (`run/<id>.d`) on the host.
    pub fn sockets(&self) -> Vec<String> {
        list_names(&self.data_dir.join("run")).into_iter().filter(|n| n.ends_with(".d")).collect()
    }
}

/// `common/probe.c` compiled statically, once per test binary.
fn probe_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/probe.c");
            let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("syscall-probe-{}", std::process::id()));
            let built = Command::new("cc").args(["-static", "-O1", "-o"]).arg(&out).arg(&source).output();
            let built = built.expect("running cc (scripts/install-deps.sh installs gcc)");
            assert!(built.status.success(), "cc probe.c: {}", String::from_utf8_lossy(&built.stderr));
            out
        })
        .clone()
}

impl Server {
    /// Puts the syscall probe at `/probe` in session `id`.
    pub fn install_probe(&self, id: &str) {
        let out = self.cli(&["files", "put", id, probe_binary().to_str().unwrap(), "/probe"]);
        assert!(out.status.success(), "files put probe: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(self.exec(id, &["chmod", "755", "/probe"])["exit_code"], 0);
    }

    /// Makes one raw system call in session `id` through `/probe` ([`Server::install_probe`]):
    /// `Ok(return value)` or `Err(errno)`.
    pub fn syscall(&self, id: &str, nr: i64, args: &[i64]) -> Result<i64, i32> {
        let mut cmd = vec!["/probe".to_owned(), nr.to_string()];
        cmd.extend(args.iter().map(i64::to_string));
        let r = self.exec(id, &cmd.iter().map(String::as_str).collect::<Vec<_>>());
        let out = r["stdout"].as_str().unwrap_or_default().trim().to_owned();
        match out.split_once(' ') {
            Some(("ok", n)) => Ok(n.parse().unwrap()),
            Some(("errno", n)) => Err(n.parse().unwrap()),
            _ => panic!("probe {nr} {args:?}: {r}"),
        }
    }
}

fn list_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// An HTTP call to the API at `base` with `key`; returns (status, JSON body or string).
fn request(base: &str, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut args = vec!["-s".to_owned(), "-X".into(), method.into(), "-w".into(), "\n%{http_code}".into()];
    args.extend(["-H".into(), format!("Authorization: Bearer {key}")]);
    if let Some(body) = body {
        args.extend(["-H".into(), "content-type: application/json".into(), "-d".into(), body.to_string()]);
    }
    args.push(format!("{base}{path}"));
    let out = curl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    (code.trim().parse().unwrap_or(0), value)
}

pub fn curl(args: &[&str]) -> Output {
    Command::new("curl").args(args).output().expect("curl")
}

/// curl's arguments for a JSON POST of `body` to `url` with `auth` (an `Authorization:`
/// header line); `extra` (more headers, `-m`, `-o`, `-w`) go before the URL.
pub fn post_json_args(url: &str, auth: &str, body: &str, extra: &[&str]) -> Vec<String> {
    let head = ["-s", "-X", "POST", "-H", auth, "-H", "content-type: application/json", "-d", body];
    head.iter().chain(extra).chain([&url]).map(|a| a.to_string()).collect()
}

/// Runs curl with [`post_json_args`].
pub fn post_json(url: &str, auth: &str, body: &str, extra: &[&str]) -> Output {
    Command::new("curl").args(post_json_args(url, auth, body, extra)).output().expect("curl")
}

fn read_pids(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// The subdirectories of `dir`.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(children) = std::fs::read_dir(dir) else { return Vec::new() };
    children.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()).collect()
}

/// Every node directory below `parent` in any v1 controller (or v2).
fn node_dirs(parent: &str) -> Vec<PathBuf> {
    subdirs(Path::new("/sys/fs/cgroup")).iter().flat_map(|controller| subdirs(&controller.join(parent))).collect()
}

/// Every sandbox cgroup below `parent` (in its node directories, and their `vm` directory
/// for VMMs) in any controller, deepest first.
fn cgroup_dirs(parent: &str) -> Vec<PathBuf> {
    node_dirs(parent)
        .iter()
        .flat_map(|node| {
            let mut dirs = subdirs(&node.join(VM_CGROUPS));
            dirs.extend(subdirs(node).into_iter().filter(|d| !d.ends_with(VM_CGROUPS)));
            dirs
        })
        .collect()
}

/// The directory of a node's cgroups that holds its VMMs'.
const VM_CGROUPS: &str = "vm";

/// Kills every process in the test's cgroups and removes them: nothing may outlive a test.
/// With `node`, only that node's (another server may share the parent).
fn remove_cgroups(parent: &str, node: Option<&str>) {
    let scope = |dirs: Vec<PathBuf>| -> Vec<PathBuf> {
        dirs.into_iter().filter(|d| node.is_none_or(|n| d.ancestors().any(|a| a.ends_with(n)))).collect()
    };
    for _ in 0..50 {
        let dirs = scope(cgroup_dirs(parent));
        let mut busy = false;
        for dir in &dirs {
            for pid in read_pids(&dir.join("cgroup.procs")) {
                busy = true;
                // SAFETY: kill(2) with a pid read from the test's own cgroup.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
            let _ = std::fs::remove_dir(dir);
        }
        if dirs.is_empty() && !busy {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for dir in scope(node_dirs(parent)) {
        let _ = std::fs::remove_dir(dir.join(VM_CGROUPS));
        let _ = std::fs::remove_dir(dir);
    }
    for controller in subdirs(Path::new("/sys/fs/cgroup")) {
        let _ = std::fs::remove_dir(controller.join(parent));
    }
}

/// What a restore the final kill interrupted left in the temp dir: its work directory with
/// mounts in it (a server that starts again removes its own; this one will not start again).
fn remove_restore_leftovers(cgroup_parent: &str, node: Option<&str>) {
    let Some(node) = node else { return };
    let prefix = format!("space-criu-{}_{node}-", cgroup_parent.replace('/', "_"));
    for name in list_names(&std::env::temp_dir()).into_iter().filter(|n| n.starts_with(&prefix)) {
        let dir = std::env::temp_dir().join(name);
        // The agent dir's bind, the new root's mount and the view of the images (see
        // space-criu's restore.rs): detached before anything is removed, never emptied.
        let detached = ["agent", "root", "images"].iter().all(|mounted| {
            let at = dir.join(mounted);
            let _ = nix::mount::umount2(&at, nix::mount::MntFlags::MNT_DETACH);
            std::fs::remove_dir(&at).is_ok() || !at.exists()
        });
        if detached {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            eprintln!("{} is still mounted or not empty: left alone", dir.display());
        }
    }
}

/// Removes what a node left once its process is gone: its sandboxes' cgroups (below
/// `cgroup_parent`, only node `node`'s when known), its pool and its data dir.
fn remove_node_leftovers(data_dir: &Path, cgroup_parent: &str, node: Option<&str>) {
    remove_cgroups(cgroup_parent, node);
    remove_restore_leftovers(cgroup_parent, node);
    let pool = data_dir.join("pool");
    let sandboxes = pool.join("sandboxes");
    for name in list_names(&sandboxes) {
        let _ = Command::new("btrfs")
            .args(["subvolume", "delete", "-c"])
            .arg(sandboxes.join(&name).join("rootfs"))
            .output();
    }
    let _ = Command::new("umount").arg("-l").arg(&pool).output();
    // The node's tmpfs for images in clear.
    let _ = Command::new("umount").arg("-l").arg(space_node::in_memory_root(data_dir)).output();
    let _ = std::fs::remove_dir_all(data_dir);
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        remove_node_leftovers(&self.data_dir, &self.cgroup_parent, self.node.as_deref());
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        } else {
            eprintln!("server log kept at {}", self.log.display());
        }
    }
}

/// The whole part of the first number after `label` on the first line of `text` that starts
/// with it (`MemTotal:       376808 kB`, `uptime: 12.5`).
pub fn number_after(text: &str, label: &str) -> u64 {
    let line = text.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label} in {text}"));
    line[label.len()..].split_whitespace().next().and_then(|n| n.split('.').next()?.parse().ok()).expect(line)
}
