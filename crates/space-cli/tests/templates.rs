//! Templates: import a root filesystem, build the built-in debian one (from the cache after the
//! first build), and start sessions from them.

mod common;

use std::os::unix::fs::symlink;

use common::Server;
use serde_json::json;

#[test]
fn imported_directory_becomes_a_template() {
    require_root!();
    let server = Server::start();
    let root = server.data_dir.join("rootfs-src");
    for dir in ["bin", "etc", "tmp", "proc", "dev", "sys", "root"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in ["sh", "cat", "echo"] {
        symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/motd"), "imported\n").unwrap();
    let out = server.cli(&["template", "import", "mini", root.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = server.cli(&["template", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(list["templates"].as_array().unwrap().iter().any(|t| t["name"] == "mini"), "{list}");

    let id = server.create_session(json!({ "template": "mini" }));
    let r = server.exec(&id, &["cat", "/etc/motd"]);
    assert_eq!(r["stdout"], "imported\n", "{r}");
}

#[test]
fn debian_template_runs_python() {
    require_root!();
    let server = Server::start();
    let out = server.cli(&["template", "build", "debian"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = server.create_session(json!({ "template": "debian", "memory_mib": 400 }));
    let r =
        server.exec(&id, &["python3", "-c", "import hashlib, ssl; print(hashlib.sha256(b'space').hexdigest()[:8])"]);
    assert_eq!(r["stdout"], "3f49dbbf\n", "{r}");
    let r = server.exec(&id, &["sh", "-c", "git --version && curl --version | head -1 && ps -p 1 -o comm="]);
    assert_eq!(r["exit_code"], 0, "{r}");
    // An agent can set up a Python project and build a C extension: venv, pip, a compiler,
    // make, Python's headers; and read and edit files with a pager and an editor.
    let setup = "python3 -m venv /tmp/venv && /tmp/venv/bin/pip --version && \
                 printf '#include <Python.h>\\nint main(void){return 0;}\\n' > /tmp/t.c && \
                 gcc $(python3-config --includes) -o /tmp/t /tmp/t.c && /tmp/t && make --version && \
                 command -v less && command -v nano";
    let r = server.exec(&id, &["sh", "-c", setup]);
    assert_eq!(r["exit_code"], 0, "{r}");
    // procps's free and top read /proc/meminfo, which lxcfs answers from the session's cgroup.
    let r = server.exec(&id, &["sh", "-c", "free -m | awk '/^Mem:/ {print $2}'"]);
    assert_eq!(r["stdout"], "400\n", "free shows the session's memory: {r}");
    let r = server.exec(&id, &["sh", "-c", "nohup sleep 1000 >/dev/null 2>&1 & echo $!"]);
    let pid = r["stdout"].as_str().unwrap_or_default().trim().to_owned();
    assert!(pid.parse::<u32>().is_ok(), "{r}");
    // The exec may end before nohup has become `sleep`: what matters is that it lives on.
    let became_sleep = format!(
        "for i in $(seq 100); do [ \"$(cat /proc/{pid}/comm 2>/dev/null)\" = sleep ] && exit 0; sleep 0.1; done; exit 1"
    );
    let r = server.exec(&id, &["sh", "-c", &became_sleep]);
    assert_eq!(r["exit_code"], 0, "nohup'd process must outlive its exec: {r}");
}
