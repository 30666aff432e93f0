//! Dockerfile builds over the API: a bad Dockerfile or bad parameters refused with what to
//! fix before anything is queued, and a good one built on the node, its log readable page by
//! page and the build listed; a tenant's build is its own template, and its own to list.

use sha2::{Digest, Sha256};

use crate::harness::{Server, assert_error, error_of};

/// A tar holding `files` (name, text).
fn context(files: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, text) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, name, text.as_bytes()).unwrap();
    }
    builder.into_inner().unwrap()
}

fn path(query: &str, body: &[u8]) -> String {
    format!("/v1/templates/builds?name=web&sha256={}{query}", hex::encode(Sha256::digest(body)))
}

#[tokio::test]
async fn builds_are_checked_then_run_with_their_log_kept() {
    let server = Server::start().await;
    server.wait_for_template("busybox").await;
    let good = context(&[("Dockerfile", "FROM busybox\nRUN echo hi\n"), ("app.txt", "x")]);
    let tenant = server.tenant_key("acme").await;
    let admin = server.admin.clone();
    for (files, query, says) in [
        (vec![("Dockerfile", "FROM busybox\n\nEXPOSE 80\n")], "", "line 3: EXPOSE is not supported"),
        (vec![("other", "FROM busybox\n")], "", "the build context has no Dockerfile"),
        (vec![("Dockerfile", "FROM busybox\n")], "&allow=bad%20host", "allow:"),
        (vec![("Dockerfile", "FROM busybox\n")], "&build_args=%5B1%5D", "build_args must be a JSON object"),
    ] {
        let body = context(&files);
        let reply = server.post_bytes(&admin, &path(query, &body), body).await;
        assert_error(&reply, 400, "bad_request");
        assert!(error_of(&reply.1).1.contains(says), "{}", reply.1);
    }
    let wrong = format!("/v1/templates/builds?name=web&sha256={}", "0".repeat(64));
    assert_error(&server.post_bytes(&admin, &wrong, good.clone()).await, 400, "bad_request");
    let (_, list) = server.call("GET", "/v1/templates/builds", None).await;
    assert_eq!(list["builds"], serde_json::json!([]), "nothing refused was queued: {list}");

    let (status, op) = server.post_bytes(&admin, &path("&allow=pypi.org", &good), good.clone()).await;
    assert_eq!(status, 202, "{op}");
    let id = op["id"].as_str().unwrap().to_owned();
    assert_eq!(server.wait_operation(&id).await["state"], "succeeded");
    let (status, log) = server.call("GET", &format!("/v1/operations/{id}/logs"), None).await;
    assert_eq!(status, 200, "{log}");
    assert_eq!(log["lines"][0], "Step 1/2 : FROM busybox (simulated)", "{log}");
    let (_, page) = server.call("GET", &format!("/v1/operations/{id}/logs?after=1&limit=1"), None).await;
    assert_eq!(page["lines"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["next"], 2, "{page}");
    let (_, list) = server.call("GET", "/v1/templates/builds", None).await;
    assert_eq!(list["builds"][0]["id"], id.as_str(), "{list}");
    assert_eq!(list["builds"][0]["name"], "web", "{list}");
    // Another tenant cannot read the log of the admin's build.
    let unknown = server.call_as(&tenant, "GET", &format!("/v1/operations/{id}/logs"), None).await;
    assert_error(&unknown, 404, "not_found");
    let (_, templates) = server.call("GET", "/v1/templates", None).await;
    assert!(templates["templates"].as_array().unwrap().iter().any(|t| t["name"] == "web"), "{templates}");

    // A tenant's build: its own template `web`, its own build to list.
    let (status, op) = server.post_bytes(&tenant, &path("", &good), good.clone()).await;
    assert_eq!(status, 202, "{op}");
    let mine = op["id"].as_str().unwrap().to_owned();
    assert_eq!(server.wait_operation_as(&tenant, &mine).await["state"], "succeeded");
    let (_, list) = server.call_as(&tenant, "GET", "/v1/templates/builds", None).await;
    assert_eq!(list["builds"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!((list["builds"][0]["id"].as_str(), list["builds"][0]["name"].as_str()), (Some(&*mine), Some("web")));
    let (_, list) = server.call("GET", "/v1/templates/builds", None).await;
    assert!(list["builds"].as_array().unwrap().iter().all(|b| b["id"] != mine.as_str()), "{list}");
    let (_, templates) = server.call_as(&tenant, "GET", "/v1/templates", None).await;
    let webs: Vec<&str> = templates["templates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == "web")
        .map(|t| t["scope"].as_str().unwrap())
        .collect();
    assert_eq!(webs, ["global", "own"], "the admin's global web and the tenant's own: {templates}");
}

/// Where each node read `bytes` from, checked against how it is reached: a node over the
/// network (`SPACE_CONTRACT_NODE=wire`) reads a copy its server kept, never the control
/// plane's file; one in the same process reads the control plane's file. Either way nothing
/// read is left once the work ended.
fn read_from_its_own_copy(server: &Server, bytes: &[u8]) {
    let uploads = server.data_dir().join("uploads");
    let wire = std::env::var("SPACE_CONTRACT_NODE").as_deref() == Ok("wire");
    for (i, sim) in server.sims.iter().enumerate() {
        let reads = sim.template_reads();
        let (path, read) = reads.last().expect("the node read the upload");
        assert_eq!(read, bytes, "node {i} read what was uploaded");
        match wire {
            true => assert!(path.starts_with(server.data_dir().join(format!("node-{i}-staged"))), "{}", path.display()),
            false => assert!(path.starts_with(&uploads), "{}", path.display()),
        }
        assert!(!path.exists(), "{} is removed once the work ended", path.display());
    }
    let left: Vec<_> = std::fs::read_dir(&uploads).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.iter().all(|p| p.ends_with("e2b-files")), "{left:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&uploads).unwrap().permissions().mode() & 0o777, 0o700, "uploads are root's alone");
}

#[tokio::test]
async fn every_node_reads_an_upload_and_a_build_context_from_a_file_on_its_own_host() {
    let node = |id: &str| space_node_sim::SimConfig { node_id: id.into(), ..Default::default() };
    let server = Server::start_with_nodes(vec![node("node-a"), node("node-b")]).await;
    server.wait_for_template("busybox").await;
    let admin = server.admin.clone();

    let tarball = b"a root filesystem tarball, as the simulated node reads it".to_vec();
    let upload = format!("/v1/templates/uploads?name=rootfs&sha256={}", hex::encode(Sha256::digest(&tarball)));
    let (status, op) = server.post_bytes(&admin, &upload, tarball.clone()).await;
    assert_eq!(status, 202, "{op}");
    assert_eq!(server.wait_operation(op["id"].as_str().unwrap()).await["state"], "succeeded");
    read_from_its_own_copy(&server, &tarball);

    let build = context(&[("Dockerfile", "FROM busybox\nCOPY app.txt /\n"), ("app.txt", "x")]);
    let (status, op) = server.post_bytes(&admin, &path("", &build), build.clone()).await;
    assert_eq!(status, 202, "{op}");
    assert_eq!(server.wait_operation(op["id"].as_str().unwrap()).await["state"], "succeeded");
    read_from_its_own_copy(&server, &build);
}
