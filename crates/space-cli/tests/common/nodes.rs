//! More nodes beside a `split` server's own: each a `space node run` with a data dir, a pool
//! and a cgroup parent of its own, in the server's cluster, which the server's control plane
//! drives once [`Server::add_node`] restarted it with the node's address.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::{SPACE, Server, free_port, remove_node_leftovers, runtime, spaced_bin};

/// A node process; killed, and everything it left removed, when dropped.
pub struct ExtraNode {
    /// Its name, which is its id: what sessions placed on it name.
    pub name: String,
    pub address: String,
    pub data_dir: PathBuf,
    pub cgroup_parent: String,
    child: Option<Child>,
}

impl ExtraNode {
    /// Starts node `suffix` (named after `server`'s own node) in `server`'s cluster, with the
    /// default warm pool of busybox, and waits until its API listens.
    pub fn start(server: &Server, suffix: &str) -> ExtraNode {
        ExtraNode::start_with(server, suffix, &[])
    }

    /// [`ExtraNode::start`] with more flags of `space node run`.
    pub fn start_with(server: &Server, suffix: &str, extra_args: &[&str]) -> ExtraNode {
        let tag = server.data_dir.file_name().unwrap().to_str().unwrap().trim_start_matches("space-test-");
        let name = format!("node-{tag}-{suffix}");
        let cluster = server.cluster_dir();
        let issue = Command::new(SPACE)
            .args(["cluster", "issue", "--dir"])
            .arg(&cluster)
            .args(["--role", "node", &name, "--host", "127.0.0.1"])
            .output()
            .expect("space cluster issue");
        assert!(issue.status.success(), "issuing {name}: {}", String::from_utf8_lossy(&issue.stderr));
        let data_dir = PathBuf::from(format!("/var/tmp/space-test-{tag}-{suffix}"));
        std::fs::create_dir_all(&data_dir).unwrap();
        let port = free_port();
        let cgroup_parent = format!("space-test-{tag}-{suffix}");
        let child = server.launch(
            "space node run (extra)",
            Command::new(SPACE)
                .args(["node", "run", "--listen", &format!("127.0.0.1:{port}"), "--name", &name])
                .arg("--cluster-dir")
                .arg(&cluster)
                .args(["--default-template", "busybox", "--default-runtime", &runtime()])
                .args(["--cgroup-parent", &cgroup_parent, "--pool-size-gib", "8"])
                .arg("--data-dir")
                .arg(&data_dir)
                .arg("--spaced")
                .arg(spaced_bin())
                .args(extra_args),
        );
        let node =
            ExtraNode { name, address: format!("127.0.0.1:{port}"), data_dir, cgroup_parent, child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::net::TcpStream::connect(&node.address).is_err() {
            assert!(Instant::now() < deadline, "node {} does not listen; log:\n{}", node.name, server.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
        node
    }

    /// The node process's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the node runs").id()
    }

    /// The cgroup (of `controller`) of `sandbox` on this node.
    pub fn sandbox_cgroup(&self, controller: &str, sandbox: &str) -> PathBuf {
        PathBuf::from("/sys/fs/cgroup").join(controller).join(&self.cgroup_parent).join(&self.name).join(sandbox)
    }
}

impl Drop for ExtraNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        remove_node_leftovers(&self.data_dir, &self.cgroup_parent, Some(&self.name));
    }
}

impl Server {
    /// `split`: restarts the control plane (its node keeps running) driving `node` too.
    pub fn add_node(&mut self, node: &ExtraNode) {
        self.extra_nodes.push(node.address.clone());
        self.kill9_control();
        self.spawn();
    }
}
