//! Session-scoped tokens for sub-agents: a token touches only its session and the sessions
//! forked from it, only as its scopes allow; everything else is refused before the request is
//! looked at (403 for what it may not call, 404 for sessions outside it), it cannot widen its
//! reach (grants, network, ports, new tokens, other endpoints), and revoking it ends it.

use serde_json::{Value, json};

use crate::harness::{Server, assert_error, error_of};

async fn token(server: &Server, key: &str, session: &str, body: Value) -> (String, Value) {
    let (status, created) = server.call_as(key, "POST", &format!("/v1/sessions/{session}/tokens"), Some(body)).await;
    assert_eq!(status, 201, "{created}");
    (created["key"].as_str().unwrap().to_owned(), created)
}

#[tokio::test]
async fn a_token_reaches_its_session_and_forks_as_its_scopes_allow_and_nothing_else() {
    let server = Server::start().await;
    let tenant = server.tenant_key("agents").await;
    let root = server.session_as(&tenant).await;
    let sibling = server.session_as(&tenant).await;
    let body = json!({ "scopes": ["read", "exec", "fork"], "ttl_secs": 600, "name": "orchestrator" });
    let (sub, created) = token(&server, &tenant, &root, body).await;
    assert_eq!(created["scope"], json!({ "session_id": root, "scopes": ["read", "exec", "fork"] }), "{created}");

    // Its session: read and exec.
    assert_eq!(server.call_as(&sub, "GET", &format!("/v1/sessions/{root}"), None).await.0, 200);
    let run = json!({ "cmd": ["echo", "hi"] });
    assert_eq!(server.call_as(&sub, "POST", &format!("/v1/sessions/{root}/exec"), Some(run.clone())).await.0, 200);

    // Forks of it (and theirs), and work in them.
    let (status, forks) =
        server.call_as(&sub, "POST", &format!("/v1/sessions/{root}/fork"), Some(json!({ "count": 2 }))).await;
    assert_eq!(status, 201, "{forks}");
    let fork = forks["sessions"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(server.call_as(&sub, "POST", &format!("/v1/sessions/{fork}/exec"), Some(run.clone())).await.0, 200);
    let (status, grandchildren) =
        server.call_as(&sub, "POST", &format!("/v1/sessions/{fork}/fork"), Some(json!({}))).await;
    assert_eq!(status, 201, "a fork's fork is in scope too: {grandchildren}");

    // The forks stay its own when the snapshots they were made from are gone.
    let (_, snaps) = server.call_as(&tenant, "GET", &format!("/v1/sessions/{root}/snapshots"), None).await;
    for snap in snaps["snapshots"].as_array().unwrap() {
        let path = format!("/v1/sessions/{root}/snapshots/{}", snap["id"].as_str().unwrap());
        assert!(server.call_as(&tenant, "DELETE", &path, None).await.0 < 300);
    }
    let (_, snaps) = server.call_as(&tenant, "GET", &format!("/v1/sessions/{root}/snapshots"), None).await;
    assert_eq!(snaps["snapshots"], json!([]), "{snaps}");
    let grandchild = grandchildren["sessions"][0]["id"].as_str().unwrap();
    assert_eq!(server.call_as(&sub, "GET", &format!("/v1/sessions/{grandchild}"), None).await.0, 200);

    // Another session of the same tenant does not exist for it.
    for (method, path, body) in [
        ("GET", format!("/v1/sessions/{sibling}"), None),
        ("POST", format!("/v1/sessions/{sibling}/exec"), Some(run.clone())),
        ("POST", format!("/v1/sessions/{sibling}/fork"), Some(json!({}))),
    ] {
        assert_error(&server.call_as(&sub, method, &path, body).await, 404, "not_found");
    }

    // Scopes it lacks, named; routes no scope covers, refused before the body is read.
    let reply = server.call_as(&sub, "POST", &format!("/v1/sessions/{root}/snapshots"), Some(json!({}))).await;
    assert_error(&reply, 403, "forbidden");
    assert!(error_of(&reply.1).1.contains("do not include `snapshot`"), "{}", reply.1);
    assert_error(&server.call_as(&sub, "DELETE", &format!("/v1/sessions/{fork}"), None).await, 403, "forbidden");
    for (method, path, body) in [
        ("GET", "/v1/sessions".to_owned(), None),
        ("POST", "/v1/sessions".to_owned(), Some(json!({}))),
        ("GET", "/v1/credentials".to_owned(), None),
        ("GET", "/v1/keys".to_owned(), None),
        ("POST", format!("/v1/sessions/{root}/tokens"), Some(json!({ "scopes": ["destroy"] }))),
        ("POST", format!("/v1/sessions/{root}/grants"), Some(json!({ "credential": "gh" }))),
        ("PATCH", format!("/v1/sessions/{root}/network"), Some(json!({ "allow": ["*"] }))),
        ("POST", format!("/v1/sessions/{root}/ports/8080"), Some(json!({}))),
        ("PATCH", format!("/v1/sessions/{root}"), Some(json!({ "name": "x" }))),
        ("POST", format!("/v1/sessions/{root}/tokens"), Some(json!("{not json"))),
    ] {
        let reply = server.call_as(&sub, method, &path, body).await;
        assert_error(&reply, 403, "forbidden");
        assert!(error_of(&reply.1).1.contains("scoped to session"), "{method} {path}: {}", reply.1);
    }
    // Outside the /v1 API (the port proxy) it is refused too.
    let reply = server.call_as(&sub, "GET", &format!("/v1/sessions/{root}/ports/8080/"), None).await;
    assert_error(&reply, 403, "forbidden");

    // Destroy: its forks, never its own session.
    let (destroyer, _) = token(&server, &tenant, &root, json!({ "scopes": ["destroy"] })).await;
    assert!(server.call_as(&destroyer, "DELETE", &format!("/v1/sessions/{fork}"), None).await.0 < 300);
    let reply = server.call_as(&destroyer, "DELETE", &format!("/v1/sessions/{root}"), None).await;
    assert_error(&reply, 403, "forbidden");
    assert!(error_of(&reply.1).1.contains("never that session itself"), "{}", reply.1);

    // Listed with its scope among the tenant's keys; revoking it ends it at once.
    let (_, keys) = server.call_as(&tenant, "GET", "/v1/keys", None).await;
    let listed = keys["keys"].as_array().unwrap().iter().find(|k| k["id"] == created["id"]).cloned().unwrap();
    assert_eq!(listed["scope"]["session_id"], root);
    assert!(listed["expires_at"].as_i64().unwrap() > listed["created_at"].as_i64().unwrap());
    let id = created["id"].as_str().unwrap();
    assert_eq!(server.call_as(&tenant, "DELETE", &format!("/v1/keys/{id}"), None).await.0, 200);
    assert_error(&server.call_as(&sub, "GET", &format!("/v1/sessions/{root}"), None).await, 401, "key_revoked");
}

#[tokio::test]
async fn token_requests_that_cannot_work_are_refused() {
    let server = Server::start().await;
    let tenant = server.tenant_key("agents").await;
    let root = server.session_as(&tenant).await;
    let path = format!("/v1/sessions/{root}/tokens");
    for (body, why) in [
        (json!({ "scopes": [] }), "at least one scope"),
        (json!({ "scopes": ["read"], "ttl_secs": 5 }), "out of range"),
        (json!({ "scopes": ["read"], "ttl_secs": 8 * 86_400 }), "out of range"),
        (json!({ "scopes": ["root"] }), "scopes"),
    ] {
        let reply = server.call_as(&tenant, "POST", &path, Some(body.clone())).await;
        assert_error(&reply, 400, "bad_request");
        assert!(error_of(&reply.1).1.contains(why), "{body}: {}", reply.1);
    }
    // Another tenant's session: 404, before the body is looked at.
    let other = server.tenant_key("other").await;
    let reply = server.call_as(&other, "POST", &path, Some(json!({ "scopes": [] }))).await;
    assert_error(&reply, 404, "not_found");
}

/// A token's reach ends with its session: a snapshot that outlived it is forked from with a
/// tenant's key only.
#[tokio::test]
async fn a_token_cannot_fork_its_destroyed_session_from_a_snapshot_that_outlived_it() {
    let server = Server::start().await;
    let tenant = server.tenant_key("agents").await;
    let root = server.session_as(&tenant).await;
    let body = json!({ "scopes": ["read", "exec", "snapshot", "fork"], "ttl_secs": 600 });
    let (sub, _) = token(&server, &tenant, &root, body).await;
    let keep = json!({ "kind": "disk", "outlives_session": true });
    let (status, kept) = server.call_as(&sub, "POST", &format!("/v1/sessions/{root}/snapshots"), Some(keep)).await;
    assert_eq!(status, 201, "{kept}");
    assert_eq!(server.call_as(&tenant, "DELETE", &format!("/v1/sessions/{root}"), None).await.0, 200);
    let fork = Some(json!({ "from": kept["id"] }));
    let refused = server.call_as(&sub, "POST", &format!("/v1/sessions/{root}/fork"), fork.clone()).await;
    let (_, message) = error_of(&refused.1);
    assert_error(&refused, 404, "not_found");
    assert!(message.contains("API key"), "{message}");
    let (status, forks) = server.call_as(&tenant, "POST", &format!("/v1/sessions/{root}/fork"), fork).await;
    assert_eq!(status, 201, "the tenant's key can: {forks}");
}
