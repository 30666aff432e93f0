//! Templates from OCI images made by real tools: umoci builds a two-layer image (the second
//! layer deletes a file, so it holds a whiteout) with an Env, WorkingDir and User in its
//! config; skopeo converts it to a `docker save` archive. Both import, sessions from them run
//! with the image's defaults, a repeated import is not unpacked again, and a hostile image
//! fails leaving nothing behind. A registry (Debian's `docker-registry`, on loopback) serves
//! the same image to `docker://` imports, with and without a login.

mod common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::Server;
use serde_json::{Value, json};

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (scripts/install-deps.sh installs it)"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A busybox root with an account `app` (1000:1000) and files the second layer changes.
fn fill_rootfs(rootfs: &Path) {
    for dir in ["bin", "etc", "tmp", "proc", "dev", "sys", "root", "srv", "home/app", "a"] {
        std::fs::create_dir_all(rootfs.join(dir)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for applet in ["sh", "cat", "echo", "id", "pwd", "test", "ls"] {
        symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
        .unwrap();
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\napp:x:1000:\n").unwrap();
    std::fs::write(rootfs.join("a/gone"), "lower layer\n").unwrap();
    std::fs::write(rootfs.join("a/kept"), "lower layer\n").unwrap();
}

/// Makes `oci:<dir>/oci:v1` with umoci and `<dir>/image.tar` from it with skopeo.
fn make_image(dir: &Path) {
    let layout = dir.join("oci");
    let (image, bundle) = (format!("{}:v1", layout.display()), dir.join("bundle"));
    run("umoci", &["init", "--layout", layout.to_str().unwrap()]);
    run("umoci", &["new", "--image", &image]);
    run("umoci", &["unpack", "--image", &image, bundle.to_str().unwrap()]);
    fill_rootfs(&bundle.join("rootfs"));
    run("umoci", &["repack", "--refresh-bundle", "--image", &image, bundle.to_str().unwrap()]);
    std::fs::remove_file(bundle.join("rootfs/a/gone")).unwrap();
    std::fs::write(bundle.join("rootfs/srv/upper"), "upper layer\n").unwrap();
    run("umoci", &["repack", "--image", &image, bundle.to_str().unwrap()]);
    let config =
        ["--config.env", "GREETING=hello from the image", "--config.workingdir", "/srv", "--config.user", "app"];
    run("umoci", &[&["config", "--image", &image][..], &config, &["--config.cmd", "sh"]].concat());
    let archive = format!("docker-archive:{}:space/test:v1", dir.join("image.tar").display());
    run("skopeo", &["copy", "--quiet", &format!("oci:{image}"), &archive]);
}

fn import(server: &Server, name: &str, image: &str) -> std::process::Output {
    server.cli(&["template", "import", name, image])
}

fn templates(server: &Server, name: &str) -> Vec<Value> {
    let out = server.cli(&["template", "list", "--json"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list["templates"].as_array().unwrap().iter().filter(|t| t["name"] == name).cloned().collect()
}

/// A server, and the test image (made under its data dir) as an OCI layout reference and a
/// `docker save` archive reference.
fn server_with_image() -> (Server, String, String) {
    let server = Server::start();
    let dir = server.data_dir.join("image-src");
    make_image(&dir);
    let layout = format!("oci:{}:v1", dir.join("oci").display());
    let archive = format!("docker-archive:{}", dir.join("image.tar").display());
    (server, layout, archive)
}

/// Starts a session from template `name` and checks its commands get the image's config.
fn session_runs_with_image_config(server: &Server, name: &str) -> String {
    let id = server.create_session(json!({ "template": name }));
    let r = server.exec(&id, &["sh", "-c", "echo $GREETING; pwd; id -u; id -g; echo $HOME"]);
    assert_eq!(r["stdout"], "hello from the image\n/srv\n1000\n1000\n/home/app\n", "{name}: {r}");
    id
}

#[test]
fn images_from_a_layout_and_a_docker_archive_run_with_their_config() {
    require_root!();
    let (server, layout, archive) = server_with_image();
    for (name, image) in [("from-layout", &layout), ("from-archive", &archive)] {
        let out = import(&server, name, image);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let id = session_runs_with_image_config(&server, name);
        let r = server.exec(&id, &["sh", "-c", "cat /a/kept /srv/upper; test -e /a/gone || echo whited out"]);
        assert_eq!(r["stdout"], "lower layer\nupper layer\nwhited out\n", "{name}: {r}");
        // What the request says wins over the image's defaults.
        let (status, r) = server.call(
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(json!({"cmd": ["sh", "-c", "pwd; id -u"], "cwd": "/tmp", "uid": 0})),
        );
        assert_eq!((status, r["stdout"].as_str()), (200, Some("/tmp\n0\n")), "{name}: {r}");
        let versions = templates(&server, name);
        assert_eq!(versions.len(), 1, "{versions:?}");
        let t = &versions[0];
        assert!(t["digest"].as_str().unwrap().starts_with("sha256:"), "{t}");
        assert_eq!(t["defaults"]["user"], "app", "{t}");
        assert_eq!(t["defaults"]["cmd"], json!(["sh"]), "{t}");
    }
    // The same image again is not unpacked again: no new version.
    let out = import(&server, "from-layout", &layout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(templates(&server, "from-layout").len(), 1);

    // Deleting a version a session uses is refused, unless forced; the session keeps working.
    let out = server.cli(&["template", "delete", "from-archive@1"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("session(s) use this template"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = server.cli(&["template", "delete", "--force", "from-archive@1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(templates(&server, "from-archive").is_empty());
    assert!(!server.data_dir.join("pool/templates/from-archive@1").exists());
}

#[test]
fn a_hostile_image_fails_and_leaves_nothing_behind() {
    require_root!();
    let server = Server::start();
    let dir = server.data_dir.join("image-src");
    make_image(&dir);
    // Replace the archive's second layer with one that climbs out of the root: the digests
    // in the manifest no longer hold, and the path would escape even if they did.
    let archive = dir.join("image.tar");
    let bad = dir.join("bad.tar");
    let unpacked = dir.join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    run("tar", &["-xf", archive.to_str().unwrap(), "-C", unpacked.to_str().unwrap()]);
    let manifest: Value = serde_json::from_slice(&std::fs::read(unpacked.join("manifest.json")).unwrap()).unwrap();
    let layer = unpacked.join(manifest[0]["Layers"][1].as_str().unwrap());
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..9].copy_from_slice(b"../escape");
    header.set_size(0);
    header.set_mode(0o644);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, &[][..]).unwrap();
    std::fs::write(&layer, builder.into_inner().unwrap()).unwrap();
    run("tar", &["-cf", bad.to_str().unwrap(), "-C", unpacked.to_str().unwrap(), "."]);

    let out = import(&server, "hostile", &format!("docker-archive:{}", bad.display()));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not match its digest") || stderr.contains("escape the root"), "{stderr}");
    assert!(templates(&server, "hostile").is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(server.data_dir.join("pool/templates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".staging-") || n.starts_with("hostile"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A `docker-registry` of its own on a loopback port, storing under `dir`, stopped on drop.
struct Registry {
    child: Child,
    address: String,
}

impl Registry {
    /// Starts it; with `htpasswd`, every request needs that login (basic auth).
    fn start(dir: &Path, htpasswd: Option<&Path>) -> Registry {
        std::fs::create_dir_all(dir).unwrap();
        let address = format!("127.0.0.1:{}", common::free_port());
        let auth = htpasswd
            .map(|f| format!("auth:\n  htpasswd:\n    realm: space-test\n    path: {}\n", f.display()))
            .unwrap_or_default();
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {address}\n{auth}",
            dir.join("storage").display()
        );
        std::fs::write(dir.join("config.yml"), config).unwrap();
        let log = std::fs::File::create(dir.join("registry.log")).unwrap();
        // The registry reads REGISTRY_* variables as settings: REGISTRY_AUTH_FILE is not one.
        let child = Command::new("docker-registry")
            .env_remove("REGISTRY_AUTH_FILE")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry (scripts/install-deps.sh installs it)");
        let registry = Registry { child, address };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&registry.address).is_err() {
            assert!(Instant::now() < deadline, "docker-registry did not listen on {}", registry.address);
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    /// Pushes the image of `make_image(dir)` as `space/test:v1`, with `creds` if given.
    fn push(&self, dir: &Path, creds: Option<&str>) -> String {
        let target = format!("docker://{}/space/test:v1", self.address);
        let mut args = vec!["copy", "--quiet", "--dest-tls-verify=false"];
        if let Some(creds) = creds {
            args.extend(["--dest-creds", creds]);
        }
        let source = format!("oci:{}:v1", dir.join("oci").display());
        args.extend([source.as_str(), target.as_str()]);
        run("skopeo", &args);
        target
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn images_pull_from_a_registry_with_and_without_a_login() {
    require_root!();
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    // The server reads registry logins from this file (as `skopeo login --authfile` writes it).
    let auth_file: PathBuf = work.path().join("auth.json");
    // SAFETY: nextest runs this test alone in its process, before any thread of ours reads
    // the environment; the server started below inherits it.
    unsafe { std::env::set_var("REGISTRY_AUTH_FILE", &auth_file) };
    let server = Server::start();
    let dir = server.data_dir.join("image-src");
    make_image(&dir);

    let open = Registry::start(&work.path().join("open"), None);
    let reference = open.push(&dir, None);
    let out = import(&server, "pulled", &reference);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = server.create_session(json!({ "template": "pulled" }));
    let r = server.exec(&id, &["sh", "-c", "echo $GREETING; cat /srv/upper"]);
    assert_eq!(r["stdout"], "hello from the image\nupper layer\n", "{r}");
    // Pulled again: the same digest, so no new version (and no blob downloaded again).
    let out = import(&server, "pulled", &reference);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(templates(&server, "pulled").len(), 1);

    let htpasswd = work.path().join("htpasswd");
    run("htpasswd", &["-Bbc", htpasswd.to_str().unwrap(), "agent", "s3cret"]);
    let locked = Registry::start(&work.path().join("locked"), Some(&htpasswd));
    let reference = locked.push(&dir, Some("agent:s3cret"));
    let out = import(&server, "locked", &reference);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("registry {}", locked.address)), "the error names the registry: {stderr}");
    assert!(templates(&server, "locked").is_empty());

    let login = json!({"auths": {&locked.address: {"auth": "YWdlbnQ6czNjcmV0"}}});
    std::fs::write(&auth_file, login.to_string()).unwrap();
    let out = import(&server, "locked", &reference);
    assert!(out.status.success(), "with a login: {}", String::from_utf8_lossy(&out.stderr));

    let out = import(&server, "nowhere", &format!("docker://127.0.0.1:{}/space/test:v1", common::free_port()));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("registry 127.0.0.1:"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Files in the server's upload directory (imports remove theirs when they end).
fn uploads_left(server: &Server) -> Vec<String> {
    match std::fs::read_dir(server.data_dir.join("uploads")) {
        Ok(entries) => entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn images_upload_over_the_api_checked_and_bounded() {
    require_root!();
    let (server, layout, archive) = server_with_image();
    let dir = server.data_dir.join("image-src");
    for (name, image) in [("up-archive", &archive), ("up-layout", &layout)] {
        let out = server.cli(&["template", "import", "--upload", name, image]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        session_runs_with_image_config(&server, name);
    }
    assert!(uploads_left(&server).is_empty(), "{:?}", uploads_left(&server));

    // A body that does not match its checksum is refused, and nothing is kept.
    let data = format!("@{}", dir.join("image.tar").display());
    let wrong = "0".repeat(64);
    let path = format!("/v1/templates/uploads?name=bad&format=docker-archive&sha256={wrong}");
    assert_eq!(server.post_raw(&path, &["--data-binary", &data]), 400);
    assert!(templates(&server, "bad").is_empty());
    assert!(uploads_left(&server).is_empty(), "{:?}", uploads_left(&server));
    // A tenant's upload (its own template: tests/builds.rs, contract templates.rs) is checked
    // the same way.
    let tenant = server.tenant_key("acme");
    let (status, _) = server.call_as(&tenant, "POST", &format!("/v1/templates/uploads?name=t&sha256={wrong}"), None);
    assert_eq!(status, 400);

    let small = Server::start_with(&["--template-upload-max-gib", "0"]);
    let out = small.cli(&["template", "import", "--upload", "too-big", &archive]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("larger than 0 bytes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Other clients get the server's own 413 (a small body: sent whole before the answer).
    let path = format!("/v1/templates/uploads?name=too-big&sha256={wrong}");
    assert_eq!(small.post_raw(&path, &["--data-binary", "x"]), 413);
    assert!(uploads_left(&small).is_empty(), "{:?}", uploads_left(&small));
}

/// A node on another host cannot read the control plane's disk: an upload and a build's
/// context reach it as copies of their own, removed once its work ends. (The harness runs a
/// split server's control plane in a mount namespace of its own, its uploads on a tmpfs that
/// the node does not see.)
#[test]
fn uploads_and_build_contexts_reach_a_node_that_cannot_read_the_control_planes_disk() {
    require_root!();
    let server = Server::start_split(&[]);
    let dir = server.data_dir.join("image-src");
    make_image(&dir);
    let archive = format!("docker-archive:{}", dir.join("image.tar").display());
    let out = server.cli(&["template", "import", "--upload", "uploaded", &archive]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    session_runs_with_image_config(&server, "uploaded");

    let ctx = server.data_dir.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(ctx.join("Dockerfile"), "FROM uploaded\nCOPY note.txt /srv/\n").unwrap();
    std::fs::write(ctx.join("note.txt"), "from the context\n").unwrap();
    let out = server.cli(&["template", "build", "built", ctx.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = session_runs_with_image_config(&server, "built");
    assert_eq!(server.exec(&id, &["cat", "/srv/note.txt"])["stdout"], "from the context\n");

    // The node keeps nothing it was sent; the control plane's uploads were never on this
    // mount namespace's disk.
    let staged: Vec<_> = std::fs::read_dir(server.data_dir.join("staged")).unwrap().flatten().collect();
    assert!(staged.is_empty(), "{staged:?}");
    let hidden: Vec<_> = std::fs::read_dir(server.data_dir.join("control/uploads")).unwrap().flatten().collect();
    assert!(hidden.is_empty(), "{hidden:?}");
}

/// An image in a registry serves as a Dockerfile's base: its layers, and its config as the
/// starting point of the build's environment, working directory and user. An image on the
/// server's host does not: that is the admin's to import.
#[test]
fn registry_images_serve_as_the_base_of_a_dockerfile_build() {
    require_root!();
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let (server, layout, _) = server_with_image();
    let registry = Registry::start(&work.path().join("open"), None);
    let reference = registry.push(&server.data_dir.join("image-src"), None);
    let dir = server.data_dir.join("ctx");
    std::fs::create_dir_all(&dir).unwrap();
    let dockerfile = format!(
        "FROM {reference}\nUSER root\nRUN cat /a/kept > kept && echo \"$GREETING\" > greeting && id -u > built-by\nUSER app\n"
    );
    std::fs::write(dir.join("Dockerfile"), dockerfile).unwrap();
    let out = server.cli(&["template", "build", "on-image", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = session_runs_with_image_config(&server, "on-image");
    let r = server.exec(&id, &["sh", "-c", "cat kept greeting built-by; test -e /a/gone || echo whited out"]);
    assert_eq!(r["stdout"], "lower layer\nhello from the image\n0\nwhited out\n", "{r}");

    std::fs::write(dir.join("Dockerfile"), format!("FROM {layout}\n")).unwrap();
    let out = server.cli(&["template", "build", "on-host", dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("line 1: FROM takes a template name"), "{stderr}");
    assert!(templates(&server, "on-host").is_empty());
}
