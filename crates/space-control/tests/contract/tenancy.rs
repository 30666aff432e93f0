//! A tenant sees and touches only its own sessions, snapshots and credentials; another
//! tenant's are indistinguishable from missing ones. Admin-only calls refuse a tenant (403)
//! before anything about the request is validated.

use serde_json::{Value, json};

use crate::harness::{Server, assert_error};

fn credential(name: &str) -> Value {
    json!({ "name": name, "hosts": ["api.example.com"], "header": "Authorization: Bearer {secret}", "value": "v" })
}

/// (method, path) of every route under `/v1/sessions/{id}` in the OpenAPI document.
fn session_routes() -> Vec<(String, String)> {
    let document: Value = serde_json::from_str(&space_control::api::openapi_json()).expect("the OpenAPI document");
    let paths = document["paths"].as_object().expect("paths");
    let session_paths = paths.iter().filter(|(path, _)| path.starts_with("/v1/sessions/{id}"));
    let routes = session_paths.flat_map(|(path, item)| {
        let methods = item.as_object().into_iter().flat_map(|m| m.keys());
        methods.map(|method| (method.to_uppercase(), path.clone())).collect::<Vec<_>>()
    });
    routes.collect()
}

#[tokio::test]
async fn tenants_never_see_or_touch_each_others_sessions() {
    let server = Server::start().await;
    let id = server.session().await;
    let snap = server.snapshot(&id, "disk").await;
    let other = server.tenant_key("other").await;

    let (status, list) = server.call_as(&other, "GET", "/v1/sessions?all=true", None).await;
    assert_eq!((status, list["sessions"].as_array().map(Vec::len)), (200, Some(0)), "{list}");
    // Every route about a session, as the OpenAPI document lists them (so a new route is
    // covered without being added here), with a body that is valid or not: 404 for all.
    let routes = session_routes();
    assert!(routes.len() >= 30, "{routes:?}");
    for (method, route) in &routes {
        let path =
            route.replace("{id}", &id).replace("{snapshot}", &snap).replace("{pid}", "1").replace("{name}", "gh");
        let path = path.replace("{port}", "8000").replace("{path}", "x");
        for body in [None, Some("{}".to_owned()), Some("{not json".to_owned())] {
            let (status, reply, _) = server.send(&other, method, &path, body, &[]).await;
            assert_error(&(status, reply), 404, "not_found");
        }
    }
    // Nor can its own session restore or fork from another tenant's snapshot, or delete it.
    let own = server.session_as(&other).await;
    for (path, body) in [("restore", json!({ "snapshot": snap })), ("fork", json!({ "from": snap }))] {
        let reply = server.call_as(&other, "POST", &format!("/v1/sessions/{own}/{path}"), Some(body)).await;
        assert_error(&reply, 404, "snapshot_not_found");
    }
    let delete = server.call_as(&other, "DELETE", &format!("/v1/sessions/{own}/snapshots/{snap}"), None).await;
    assert_error(&delete, 404, "snapshot_not_found");

    let session = server.get(&id).await;
    assert_eq!(session["state"], "running", "{session}");
    let (_, snapshots) = server.call("GET", &format!("/v1/sessions/{id}/snapshots"), None).await;
    assert_eq!(snapshots["snapshots"][0]["id"], snap.as_str(), "the snapshot is still there: {snapshots}");
    let (_, list) = server.call("GET", "/v1/sessions", None).await;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(1), "the admin does not see the tenant's: {list}");
}

#[tokio::test]
async fn tenants_never_see_or_use_each_others_credentials() {
    let server = Server::start().await;
    let (status, body) = server.call("POST", "/v1/credentials", Some(credential("gh"))).await;
    assert_eq!(status, 201, "{body}");
    let other = server.tenant_key("other").await;

    let (_, list) = server.call_as(&other, "GET", "/v1/credentials", None).await;
    assert_eq!(list["credentials"].as_array().map(Vec::len), Some(0), "{list}");
    for (method, body) in [("GET", None), ("PATCH", Some(json!({ "value": "stolen" }))), ("DELETE", None)] {
        let reply = server.call_as(&other, method, "/v1/credentials/gh", body).await;
        assert_error(&reply, 404, "credential_not_found");
    }
    // Granting it to its own session, at create or after, finds nothing either.
    let own = server.session_as(&other).await;
    let grants = format!("/v1/sessions/{own}/grants");
    let grant = server.call_as(&other, "POST", &grants, Some(json!({ "credential": "gh" }))).await;
    assert_error(&grant, 404, "credential_not_found");
    let create = server.call_as(&other, "POST", "/v1/sessions", Some(json!({ "grants": ["gh"] }))).await;
    assert_error(&create, 404, "credential_not_found");
    // The same name is its own, and the admin's stays as it was.
    let (status, body) = server.call_as(&other, "POST", "/v1/credentials", Some(credential("gh"))).await;
    assert_eq!(status, 201, "{body}");
    let (status, mine) = server.call("GET", "/v1/credentials/gh", None).await;
    assert_eq!((status, mine["version"].as_u64()), (200, Some(1)), "{mine}");
}

#[tokio::test]
async fn admin_only_calls_refuse_a_tenant_before_reading_the_request() {
    let server = Server::start().await;
    let other = server.tenant_key("other").await;
    let host_dir = std::env::temp_dir().display().to_string();
    let refused = [
        ("POST", "/v1/keys", Some(r#"{"tenant":"x"}"#.to_owned())),
        ("POST", "/v1/keys", Some("{not json".into())),
        ("POST", "/v1/templates/import", Some(json!({ "name": "t", "path": host_dir }).to_string())),
        ("POST", "/v1/templates/import", Some(json!({ "name": "t", "path": "/nonexistent-space" }).to_string())),
        ("POST", "/v1/templates/import", Some(json!({ "name": "BAD NAME", "path": "relative" }).to_string())),
        ("POST", "/v1/templates/build", Some(r#"{"name":"nope"}"#.into())),
        ("PUT", "/v1/pool/nope", Some(r#"{"size":99999}"#.into())),
        ("PUT", "/v1/pool/busybox", Some("{not json".into())),
        ("PUT", "/v1/tenants/other/quota", Some(r#"{"max_sessions":-1}"#.into())),
        ("PUT", "/v1/tenants/BAD%20NAME/quota", Some("{not json".into())),
    ];
    for (method, path, body) in refused {
        let too_long = "k".repeat(300);
        for headers in [&[][..], &[("idempotency-key", "k")][..], &[("idempotency-key", too_long.as_str())][..]] {
            let (status, reply, _) = server.send(&other, method, path, body.clone(), headers).await;
            assert_error(&(status, reply), 403, "forbidden");
        }
    }
    // The admin is told what is wrong, and its import runs on the node.
    let missing = json!({ "name": "t", "path": "/nonexistent-space" });
    assert_error(&server.call("POST", "/v1/templates/import", Some(missing)).await, 400, "bad_request");
    let (status, op) =
        server.call("POST", "/v1/templates/import", Some(json!({ "name": "t", "path": host_dir }))).await;
    assert_eq!(status, 202, "{op}");
    let id = op["id"].as_str().unwrap().to_owned();
    let op = server.wait_operation(&id).await;
    assert_eq!(op["state"], "succeeded", "{op}");
    assert_error(&server.call_as(&other, "GET", &format!("/v1/operations/{id}"), None).await, 404, "not_found");
    let (_, templates) = server.call_as(&other, "GET", "/v1/templates", None).await;
    assert!(templates["templates"].as_array().unwrap().iter().any(|t| t["name"] == "t"), "{templates}");
}
