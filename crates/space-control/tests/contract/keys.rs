//! API keys: ids and names, revocation that takes effect on the very next request, expiry,
//! rotation, when each was last used, and who may manage which.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Server, assert_error, error_of};

/// A new key of `tenant` with `extra` fields in the request; returns the whole response.
async fn create_key(server: &Server, tenant: &str, extra: Value) -> Value {
    let mut body = json!({ "tenant": tenant });
    body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let (status, created) = server.call("POST", "/v1/keys", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    created
}

fn secret(created: &Value) -> String {
    created["key"].as_str().expect("a secret").to_owned()
}

/// The key `id` as `key` lists it.
async fn listed(server: &Server, key: &str, id: &str) -> Value {
    let (status, list) = server.call_as(key, "GET", "/v1/keys", None).await;
    assert_eq!(status, 200, "{list}");
    list["keys"].as_array().unwrap().iter().find(|k| k["id"] == id).cloned().unwrap_or_else(|| panic!("{id}: {list}"))
}

#[tokio::test]
async fn a_revoked_key_fails_on_its_very_next_request() {
    let server = Server::start().await;
    let created = create_key(&server, "acme", json!({ "name": "ci" })).await;
    let (key, id) = (secret(&created), created["id"].as_str().unwrap().to_owned());
    assert!(id.starts_with("key_") && created["name"] == "ci" && created["tenant"] == "acme", "{created}");
    let session = server.session_as(&key).await;
    assert_eq!(server.call_as(&key, "GET", &format!("/v1/sessions/{session}"), None).await.0, 200);

    let (status, revoked) = server.call("DELETE", &format!("/v1/keys/{id}"), None).await;
    assert_eq!(status, 200, "{revoked}");
    assert!(revoked["revoked_at"].as_i64().is_some(), "{revoked}");
    let refused = server.call_as(&key, "GET", &format!("/v1/sessions/{session}"), None).await;
    assert_error(&refused, 401, "key_revoked");
    assert!(error_of(&refused.1).1.contains(&id), "the message names the key: {}", refused.1);
    // On every route, before anything about the request is looked at.
    assert_error(&server.call_as(&key, "POST", "/v1/sessions", Some(json!({ "bad": 1 }))).await, 401, "key_revoked");
    // Revoking again changes nothing; the key stays listed, revoked.
    let again = server.call("DELETE", &format!("/v1/keys/{id}"), None).await;
    assert_eq!((again.0, &again.1["revoked_at"]), (200, &revoked["revoked_at"]), "{}", again.1);
    assert_eq!(listed(&server, &server.admin, &id).await["revoked_at"], revoked["revoked_at"]);
    // The session it made is untouched.
    assert_eq!(server.get(&session).await["state"], "running");
}

#[tokio::test]
async fn an_expired_key_fails_with_key_expired() {
    let server = Server::start().await;
    let created = create_key(&server, "acme", json!({ "expires_in_secs": 1 })).await;
    let expires = created["expires_at"].as_i64().expect("an expiry");
    assert_eq!(expires - created["created_at"].as_i64().unwrap(), 1000, "{created}");
    let key = secret(&created);
    for _ in 0..200 {
        let (status, body) = server.call_as(&key, "GET", "/v1/sessions", None).await;
        if status == 401 {
            assert_error(&(status, body), 401, "key_expired");
            let listed = listed(&server, &server.admin, created["id"].as_str().unwrap()).await;
            assert_eq!((&listed["expires_at"], &listed["revoked_at"]), (&json!(expires), &Value::Null), "{listed}");
            return;
        }
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the key never expired");
}

#[tokio::test]
async fn rotation_gives_a_new_key_of_the_same_tenant_and_name_and_revokes_the_old() {
    let server = Server::start().await;
    let created = create_key(&server, "acme", json!({ "name": "deploy", "expires_in_secs": 3600 })).await;
    let (old, id) = (secret(&created), created["id"].as_str().unwrap().to_owned());
    let session = server.session_as(&old).await;

    let (status, rotated) = server.call_as(&old, "POST", &format!("/v1/keys/{id}/rotate"), None).await;
    assert_eq!(status, 201, "a tenant rotates its own key: {rotated}");
    assert_ne!(rotated["id"], id.as_str());
    assert_eq!((&rotated["name"], &rotated["tenant"]), (&json!("deploy"), &json!("acme")), "{rotated}");
    let lifetime = rotated["expires_at"].as_i64().unwrap() - rotated["created_at"].as_i64().unwrap();
    assert_eq!(lifetime, 3_600_000, "as long a lifetime as the old one: {rotated}");
    let new = secret(&rotated);
    assert_eq!(server.call_as(&new, "GET", &format!("/v1/sessions/{session}"), None).await.0, 200);
    assert_error(&server.call_as(&old, "GET", "/v1/sessions", None).await, 401, "key_revoked");
    let twice = server.call("POST", &format!("/v1/keys/{id}/rotate"), None).await;
    assert_error(&twice, 409, "conflict");
}

#[tokio::test]
async fn the_admin_key_rotates_into_its_file_and_the_last_one_is_not_revoked() {
    let server = Server::start().await;
    let (_, list) = server.call("GET", "/v1/keys", None).await;
    let admin = list["keys"].as_array().unwrap().iter().find(|k| k["admin"] == true).unwrap().clone();
    let id = admin["id"].as_str().unwrap().to_owned();
    assert_error(&server.call("DELETE", &format!("/v1/keys/{id}"), None).await, 409, "conflict");

    let (status, rotated) = server.call("POST", &format!("/v1/keys/{id}/rotate"), None).await;
    assert_eq!(status, 201, "{rotated}");
    let file = std::fs::read_to_string(server.data_dir().join("admin.key")).unwrap();
    assert_eq!(file.trim(), rotated["key"], "DATA_DIR/admin.key holds the new key");
    assert_error(&server.call("GET", "/v1/keys", None).await, 401, "key_revoked");
    let (status, _) = server.call_as(rotated["key"].as_str().unwrap(), "GET", "/v1/keys", None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn last_use_is_recorded_at_most_once_a_minute() {
    let server = Server::start().await;
    let created = create_key(&server, "acme", json!({})).await;
    let (key, id) = (secret(&created), created["id"].as_str().unwrap().to_owned());
    assert_eq!(listed(&server, &server.admin, &id).await["last_used_at"], Value::Null, "not used yet");
    assert_eq!(server.call_as(&key, "GET", "/v1/status", None).await.0, 200);
    let first = listed(&server, &server.admin, &id).await["last_used_at"].as_i64().expect("recorded");
    assert!(first >= created["created_at"].as_i64().unwrap());
    for _ in 0..3 {
        assert_eq!(server.call_as(&key, "GET", "/v1/status", None).await.0, 200);
    }
    // Well within a minute of the first use: not written again.
    assert_eq!(listed(&server, &key, &id).await["last_used_at"], first);
}

#[tokio::test]
async fn tenants_see_and_manage_only_their_own_keys_and_never_a_secret() {
    let server = Server::start().await;
    let (one, two) = (create_key(&server, "acme", json!({})).await, create_key(&server, "acme", json!({})).await);
    let other = create_key(&server, "other", json!({})).await;
    let (acme, stranger) = (secret(&one), secret(&other));

    let (_, list) = server.call_as(&acme, "GET", "/v1/keys", None).await;
    let tenants: Vec<&str> = list["keys"].as_array().unwrap().iter().filter_map(|k| k["tenant"].as_str()).collect();
    assert_eq!(tenants, ["acme", "acme"], "{list}");
    let (_, all) = server.call("GET", "/v1/keys", None).await;
    assert_eq!(all["keys"].as_array().map(Vec::len), Some(4), "the admin sees every key: {all}");
    for secret in [&acme, &stranger, &server.admin] {
        assert!(!all.to_string().contains(secret.as_str()), "a secret is listed: {all}");
    }

    // Another tenant's key is not found, whatever is asked of it.
    let two_id = two["id"].as_str().unwrap();
    for (method, path) in [("DELETE", format!("/v1/keys/{two_id}")), ("POST", format!("/v1/keys/{two_id}/rotate"))] {
        assert_error(&server.call_as(&stranger, method, &path, None).await, 404, "not_found");
    }
    assert_error(&server.call_as(&acme, "DELETE", "/v1/keys/not-a-key", None).await, 404, "not_found");
    assert_eq!(server.call_as(&acme, "DELETE", &format!("/v1/keys/{two_id}"), None).await.0, 200);
    assert_error(&server.call_as(&secret(&two), "GET", "/v1/keys", None).await, 401, "key_revoked");
    // Creating keys stays the admin's.
    let create = server.call_as(&acme, "POST", "/v1/keys", Some(json!({ "tenant": "acme" }))).await;
    assert_error(&create, 403, "forbidden");
    for bad in [json!({ "tenant": "acme", "expires_in_secs": 0 }), json!({ "tenant": "acme", "name": "" })] {
        assert_error(&server.call("POST", "/v1/keys", Some(bad)).await, 400, "bad_request");
    }
}
