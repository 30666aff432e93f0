//! Deleting templates: the admin's alone, refused while a session uses the version unless
//! forced, and gone from every node afterwards.

use serde_json::json;

use crate::harness::{Server, assert_error, error_of};

#[tokio::test]
async fn a_template_in_use_is_deleted_only_when_forced() {
    let server = Server::start().await;
    server.wait_for_template("busybox").await;
    let tenant = server.tenant_key("acme").await;
    // Authorization before validation: a tenant is refused whatever it names.
    for path in ["/v1/templates/busybox", "/v1/templates/NOPE", "/v1/templates/busybox?version=x"] {
        assert_error(&server.call_as(&tenant, "DELETE", path, None).await, 403, "forbidden");
    }
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
