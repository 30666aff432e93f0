//! More control replicas beside a `split` server's own (`control-1`), over its database and
//! its node: for the tests of replicas sharing a PostgreSQL database (tests/replicas.rs, run
//! under `scripts/with-postgres.sh`).

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::{SPACE, Server, free_port};

/// The PostgreSQL server the test script started (`SPACE_TEST_POSTGRES_URL`); a test that
/// needs it fails without it.
pub fn postgres_server() -> String {
    std::env::var("SPACE_TEST_POSTGRES_URL").ok().filter(|u| !u.is_empty()).expect(
        "SPACE_TEST_POSTGRES_URL is not set: run this test under scripts/with-postgres.sh (scripts/test.sh does)",
    )
}

/// A new database of the test's own on the server, and its URL.
pub fn create_database(server: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let name = format!("replicas_{}_{nanos}", std::process::id());
    psql(server, &format!("CREATE DATABASE {name}"));
    let (base, query) = server.split_once('?').unwrap_or((server, ""));
    let root = &base[..base.rfind('/').expect("a database in the URL")];
    format!("{root}/{name}?{query}")
}

/// Runs `sql` on the database `url` names; returns its output (unaligned, tuples only).
pub fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql").args([url, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql]).output().expect("psql");
    assert!(out.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Another `space control` over a split server's database and nodes (its own and those
/// added), with a data dir and a certificate of its own and the server's key file. Killed
/// when dropped.
pub struct Replica {
    pub name: String,
    pub url: String,
    child: Option<Child>,
}

impl Replica {
    /// Starts replica `name` beside `server` (started with `--database`) and waits until it
    /// answers with `server`'s admin key.
    pub fn start(server: &Server, name: &str, database: &str) -> Replica {
        let cluster = server.cluster_dir();
        let issue = Command::new(SPACE)
            .args(["cluster", "issue", "--dir"])
            .arg(&cluster)
            .args(["--role", "control", name])
            .output()
            .expect("space cluster issue");
        assert!(issue.status.success(), "issuing {name}: {}", String::from_utf8_lossy(&issue.stderr));
        let data_dir: PathBuf = server.data_dir.join(name);
        std::fs::create_dir_all(&data_dir).unwrap();
        let port = free_port();
        let child = server.launch(
            "space control (replica)",
            Command::new(SPACE)
                .args(["control", "--listen", &format!("127.0.0.1:{port}")])
                .args(["--node", &server.node_address(), "--name", name, "--database", database])
                .args(server.extra_nodes.iter().flat_map(|address| ["--node", address]))
                .arg("--cluster-dir")
                .arg(&cluster)
                .arg("--key-file")
                .arg(server.data_dir.join("control/keys/master.key"))
                .args(["--default-template", "busybox", "--prepare-templates", "busybox"])
                .args(["--default-runtime", &super::runtime()])
                .arg("--data-dir")
                .arg(&data_dir),
        );
        let replica = Replica { name: name.into(), url: format!("http://127.0.0.1:{port}"), child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(120);
        while replica.call(server, "GET", "/v1/status", None).0 != 200 {
            assert!(Instant::now() < deadline, "replica {name} not ready; log:\n{}", server.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
        replica
    }

    /// An API call to this replica with `server`'s admin key.
    pub fn call(
        &self,
        server: &Server,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        server.call_at(&self.url, method, path, body)
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill9();
    }
}
