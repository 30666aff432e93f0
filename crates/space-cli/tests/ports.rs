//! Ports of real sandboxes: a server started inside (busybox `httpd`) is reached through the
//! API's proxy, a preview host and `space port forward`, while the sandbox gains no path out.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, curl};
use serde_json::json;

/// The preview domain the test server is started with.
const PREVIEW: &str = "preview.test";

/// A session serving `/www` (an index page and a 32 MiB file) with busybox httpd on
/// `address:8000`.
fn serving(server: &Server, address: &str) -> String {
    let id = server.create_session(json!({}));
    let script = format!(
        "mkdir -p /www && echo hello-from-inside > /www/index.html && \
         head -c 33554432 /dev/zero > /www/big && exec busybox httpd -f -p {address}:8000 -h /www"
    );
    let (status, body) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sh", "-c", script], "background": true })),
    );
    assert_eq!(status, 200, "{body}");
    wait_until_served(server, &id);
    id
}

fn wait_until_served(server: &Server, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = server.call("GET", &format!("/v1/sessions/{id}/ports/8000/index.html"), None);
        if status == 200 {
            assert_eq!(body, json!("hello-from-inside\n"));
            return;
        }
        assert!(Instant::now() < deadline, "httpd never answered: {status} {body}\n{}", server.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_server_inside_is_reached_through_the_proxy() {
    let server = Server::start_with(&["--preview-domain", PREVIEW]);
    let id = serving(&server, "0.0.0.0");
    // Streams: a 32 MiB body arrives whole.
    let auth = server.auth();
    let url = format!("{}/v1/sessions/{id}/ports/8000/big", server.url);
    let out = curl(&["-sf", "-H", &auth, "-o", "/dev/null", "-w", "%{size_download}", &url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "33554432");

    // Nothing listens on 9000: 502 with the API's error, at once.
    let (status, body) = server.call("GET", &format!("/v1/sessions/{id}/ports/9000/"), None);
    assert_eq!((status, body["error"]["code"].as_str()), (502, Some("port_not_listening")), "{body}");
    if common::runtime() == "linux" {
        // The gateway's ports in the sandbox's namespace are not the sandbox's to serve.
        let (status, body) = server.call("GET", &format!("/v1/sessions/{id}/ports/80/"), None);
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("port_reserved")), "{body}");
    }

    // A public port through its preview host, with no credentials at all.
    let (status, opened) = server.call("POST", &format!("/v1/sessions/{id}/ports/8000"), Some(json!({"public": true})));
    assert_eq!(status, 200, "{opened}");
    let host = format!("8000-{}.{PREVIEW}", id.replacen('_', "-", 1));
    assert_eq!(opened["preview_url"], format!("http://{host}/"));
    let out = curl(&["-s", "-H", &format!("Host: {host}"), &format!("{}/index.html", server.url)]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello-from-inside\n");
    let (status, _) = server.call("DELETE", &format!("/v1/sessions/{id}/ports/8000"), None);
    assert_eq!(status, 204);
    let out = curl(&["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", &format!("Host: {host}"), &server.url]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "401", "closed again");
}

/// A server bound to the sandbox's loopback only: in a linux sandbox the node connects from
/// inside its namespace, where 127.0.0.1 is the sandbox's own, so it is reached; a VM's
/// loopback is its guest kernel's, beyond the TAP device, so it is not (docs/ports.md).
#[test]
fn a_loopback_only_server_is_reached_in_linux_and_not_in_a_vm() {
    let server = Server::start();
    let id = server.create_session(json!({}));
    let script = "mkdir -p /www && echo loopback > /www/index.html && exec busybox httpd -f -p 127.0.0.1:8000 -h /www";
    let (status, body) = server.call(
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(json!({ "cmd": ["sh", "-c", script], "background": true })),
    );
    assert_eq!(status, 200, "{body}");
    // Served inside before anything is asked from outside.
    // (Without the environment's proxy: the gateway's, which reaches no loopback.)
    let wait = "unset http_proxy HTTP_PROXY; for i in $(seq 100); do busybox wget -q -O - http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1";
    assert_eq!(server.exec(&id, &["sh", "-c", wait])["stdout"], "loopback\n");
    let (status, body) = server.call("GET", &format!("/v1/sessions/{id}/ports/8000/"), None);
    if common::runtime() == "linux" {
        assert_eq!((status, body), (200, json!("loopback\n")));
    } else {
        assert_eq!((status, body["error"]["code"].as_str()), (502, Some("port_not_listening")), "{body}");
    }
}

/// `space port forward` listens locally and carries each connection to the port inside.
#[test]
fn port_forward_carries_local_connections_inside() {
    let server = Server::start();
    let id = serving(&server, "0.0.0.0");
    let local = free_port();
    let mut forward = Forward::start(&server, &["port", "forward", &id, "8000", "--local", &local.to_string()]);
    let out = curl(&["-sf", &format!("http://127.0.0.1:{local}/index.html")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello-from-inside\n", "{}", forward.stderr());
    let out = curl(&["-sf", "-o", "/dev/null", "-w", "%{size_download}", &format!("http://127.0.0.1:{local}/big")]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "33554432");
    forward.stop();
    // A port nothing listens on: refused before it starts listening, with the reason.
    let out = server.cli(&["port", "forward", &id, "9000"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing listens on port 9000"), "{out:?}");
}

/// A running `space port forward`, stopped (by pid) when dropped.
struct Forward {
    child: Child,
    stderr: String,
}

impl Forward {
    fn start(server: &Server, args: &[&str]) -> Forward {
        let mut child = Command::new(env!("CARGO_BIN_EXE_space"))
            .args(args)
            .env("SPACE_URL", &server.url)
            .env("SPACE_API_KEY", &server.key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("space port forward");
        // It says so once it listens.
        let mut line = String::new();
        BufReader::new(child.stderr.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("Forwarding"), "{line}");
        Forward { child, stderr: line }
    }

    fn stderr(&self) -> &str {
        &self.stderr
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
