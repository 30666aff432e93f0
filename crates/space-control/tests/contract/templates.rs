//! Deleting templates: global ones the admin's alone, a tenant's its own; refused while a
//! session uses the version unless forced, and gone from every node afterwards. Templates of
//! a tenant's own: seen, used and deleted by it alone.

use serde_json::json;

use crate::harness::{Server, assert_error, error_of};

#[tokio::test]
async fn a_template_in_use_is_deleted_only_when_forced() {
    let server = Server::start().await;
    server.wait_for_template("busybox").await;
    let tenant = server.tenant_key("acme").await;
    // A global template is the operator's: a tenant is refused it.
    assert_error(&server.call_as(&tenant, "DELETE", "/v1/templates/busybox", None).await, 403, "forbidden");
    assert_error(&server.call("DELETE", "/v1/templates/Bad%20Name", None).await, 400, "bad_request");
    assert_error(&server.call("DELETE", "/v1/templates/busybox?version=99", None).await, 404, "not_found");

    let id = server.session().await;
    let refused = server.call("DELETE", "/v1/templates/busybox", None).await;
    assert_error(&refused, 409, "conflict");
    let message = error_of(&refused.1).1;
    assert!(message.contains(&id) && message.contains("force"), "{message}");
    let (_, list) = server.call("GET", "/v1/templates", None).await;
    assert!(list["templates"].as_array().unwrap().iter().any(|t| t["name"] == "busybox"), "nothing deleted: {list}");

    let (status, deleted) = server.call("DELETE", "/v1/templates/busybox?force=true", None).await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["versions"], json!([1]), "{deleted}");
    assert_eq!(deleted["in_use_by"], json!([id]), "{deleted}");
    let (_, list) = server.call("GET", "/v1/templates", None).await;
    assert!(!list["templates"].as_array().unwrap().iter().any(|t| t["name"] == "busybox"), "{list}");
    assert_eq!(server.exec(&id, &["echo", "still running"]).await.1["stdout"], "still running\n");
    assert_error(&server.call("DELETE", "/v1/templates/busybox", None).await, 404, "not_found");
}

/// Uploads `name` as `key`'s template and waits for its import.
async fn upload(server: &Server, key: &str, name: &str) {
    use sha2::{Digest, Sha256};
    let body = b"a root filesystem tarball (the simulated node only checks it exists)".to_vec();
    let path = format!("/v1/templates/uploads?name={name}&sha256={}", hex::encode(Sha256::digest(&body)));
    let (status, op) = server.post_bytes(key, &path, body).await;
    assert_eq!(status, 202, "{op}");
    assert_eq!(server.wait_operation_as(key, op["id"].as_str().unwrap()).await["state"], "succeeded");
}

fn names(list: &serde_json::Value) -> Vec<(String, bool)> {
    let templates = list["templates"].as_array().unwrap();
    templates.iter().map(|t| (t["name"].as_str().unwrap().to_owned(), t["scope"] == "global")).collect()
}

#[tokio::test]
async fn tenants_have_templates_of_their_own() {
    let server = Server::start().await;
    server.wait_for_template("busybox").await;
    let (acme, other) = (server.tenant_key("acme").await, server.tenant_key("other").await);
    upload(&server, &acme, "web").await;

    let (_, list) = server.call_as(&acme, "GET", "/v1/templates", None).await;
    assert!(names(&list).contains(&("web".into(), false)), "{list}");
    assert!(names(&list).contains(&("busybox".into(), true)), "{list}");
    for key in [&other, &server.admin] {
        let (_, list) = server.call_as(key, "GET", "/v1/templates", None).await;
        assert!(names(&list).iter().all(|(n, _)| n != "web" && !n.contains("..")), "{list}");
    }

    let (status, session) = server.call_as(&acme, "POST", "/v1/sessions", Some(json!({"template": "web"}))).await;
    assert_eq!(status, 201, "{session}");
    assert_eq!(session["template"], "web");
    let refused = server.call_as(&other, "POST", "/v1/sessions", Some(json!({"template": "web"}))).await;
    assert_error(&refused, 400, "unknown_template");
    assert!(!error_of(&refused.1).1.contains(".."), "another tenant's names stay hidden: {}", refused.1);
    assert_error(&server.call_as(&other, "DELETE", "/v1/templates/web", None).await, 404, "not_found");

    // A tenant's name of a global template is its own, and hides the global one from it alone.
    upload(&server, &acme, "busybox").await;
    let (_, list) = server.call_as(&acme, "GET", "/v1/templates", None).await;
    assert!(names(&list).contains(&("busybox".into(), false)) && names(&list).contains(&("busybox".into(), true)));
    let (_, list) = server.call_as(&other, "GET", "/v1/templates", None).await;
    assert_eq!(names(&list).iter().filter(|(n, _)| n == "busybox").count(), 1, "{list}");

    // Names: no '..' (what marks a tenant's on the nodes), and room for the tenant's scope.
    for (name, says) in [("a..b", "no '..'"), (&*"x".repeat(50), "at most 49 characters")] {
        let body = b"x".to_vec();
        let path = format!("/v1/templates/uploads?name={name}&sha256={}", "0".repeat(64));
        let reply = server.post_bytes(&acme, &path, body).await;
        assert_error(&reply, 400, "bad_request");
        assert!(error_of(&reply.1).1.contains(says), "{}", reply.1);
    }
    // What is on the server's host stays the admin's to import.
    let import = json!({"name": "mine", "path": "/etc"});
    assert_error(&server.call_as(&acme, "POST", "/v1/templates/import", Some(import)).await, 403, "forbidden");

    let in_use = server.call_as(&acme, "DELETE", "/v1/templates/web", None).await;
    assert_error(&in_use, 409, "conflict");
    let (status, deleted) = server.call_as(&acme, "DELETE", "/v1/templates/web?force=true", None).await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["name"], "web", "{deleted}");
    let (_, list) = server.call_as(&acme, "GET", "/v1/templates", None).await;
    assert!(!names(&list).iter().any(|(n, _)| n == "web"), "{list}");
}

/// With a blob store, a global template is made on the first node only, and the others import
/// its export: they read no upload and run the same files. A node that lacks it later (one
/// added after the import) is given it when the control plane starts. A tenant's own template
/// stays out of the blob store: each node makes it from the upload.
#[tokio::test]
async fn global_templates_travel_through_the_blob_store_and_tenants_own_do_not() {
    use space_node_sim::{SimBlobs, SimConfig};
    let blobs = SimBlobs::default();
    let node = |id: &str| SimConfig { node_id: id.into(), blobs: Some(blobs.clone()), ..SimConfig::default() };
    let server = Server::start_with_nodes(vec![node("node-a"), node("node-b")]).await;
    server.wait_for_template("busybox").await;
    upload(&server, &server.admin.clone(), "web").await;
    let (a, b) = (&server.sims[0], &server.sims[1]);
    assert_eq!((a.template_reads().len(), b.template_reads().len()), (1, 0), "only node-a read the upload");
    assert_eq!((a.template_imports(), b.template_imports()), (0, 1), "node-b imported node-a's export");
    assert_eq!(blobs.templates(), 1);
    let web = a.api().resolve_template("web").await.unwrap();
    assert_eq!(b.api().resolve_template("web").await, Some(web.clone()), "the same version on both");

    let acme = server.tenant_key("acme").await;
    upload(&server, &acme, "mine").await;
    assert_eq!((a.template_reads().len(), b.template_reads().len()), (2, 1), "each node read the tenant's upload");
    assert_eq!(blobs.templates(), 1, "a tenant's template is not exported");

    // node-b loses it (as a node added later never had it): the next start gives it back.
    assert!(b.api().delete_template("web", web.version).await.unwrap());
    let server = server.stop().start().await;
    let b = &server.sims[1];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while b.api().resolve_template("web").await.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "node-b never got web back");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(b.api().resolve_template("web").await, Some(web.clone()));
    assert_eq!(b.template_imports(), 1);

    // A delete node-b misses (here: it keeps a copy of the version) is finished at the next
    // start, and the version never comes back to node-a.
    let (status, deleted) = server.call("DELETE", "/v1/templates/web", None).await;
    assert_eq!(status, 200, "{deleted}");
    let source = space_api::TemplateSource::Registry { reference: "r/web".into() };
    let kept = server.sims[1].api().import_template("web", &source, Box::new(|_| {})).await.unwrap();
    assert_eq!(kept.version, web.version, "node-b holds the deleted version again");
    let server = server.stop().start().await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.sims[1].api().resolve_template("web").await.is_some() {
        assert!(tokio::time::Instant::now() < deadline, "node-b kept the deleted version");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(server.sims[0].api().resolve_template("web").await, None, "it never came back to node-a");
}
