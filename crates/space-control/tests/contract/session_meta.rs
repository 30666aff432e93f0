//! Sessions' names, labels and metadata, the list's filters, and what the admin may do
//! with other tenants' sessions.

use serde_json::{Value, json};

use crate::harness::{Server, assert_error};

async fn created(server: &Server, key: &str, body: Value) -> Value {
    let (status, session) = server.call_as(key, "POST", "/v1/sessions", Some(body)).await;
    assert_eq!(status, 201, "{session}");
    session
}

async fn ids(server: &Server, key: &str, query: &str) -> Vec<String> {
    let (status, list) = server.call_as(key, "GET", &format!("/v1/sessions?{query}"), None).await;
    assert_eq!(status, 200, "{query}: {list}");
    let mut ids: Vec<String> =
        list["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<&Value>) -> Vec<String> {
    let mut ids: Vec<String> = ids.drain(..).map(|v| v["id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn sessions_carry_a_name_labels_and_metadata_and_are_found_by_them() {
    let server = Server::start().await;
    let key = server.tenant_key("acme").await;
    let body = json!({
        "name": "review bot",
        "labels": { "team": "x", "env": "prod" },
        "metadata": { "ticket": "OPS-1", "notes": "anything: at all" },
    });
    let a = created(&server, &key, body).await;
    assert_eq!((&a["name"], &a["tenant"], &a["auto_resume"]), (&json!("review bot"), &json!("acme"), &json!(false)));
    assert_eq!(a["labels"], json!({ "team": "x", "env": "prod" }), "{a}");
    assert_eq!(a["metadata"]["ticket"], "OPS-1", "{a}");
    let (_, shown) = server.call_as(&key, "GET", &format!("/v1/sessions/{}", a["id"].as_str().unwrap()), None).await;
    assert_eq!(shown, a, "a create answers with the session as GET shows it");

    let b = created(&server, &key, json!({ "labels": { "team": "x", "env": "dev" } })).await;
    let c = created(&server, &key, json!({ "labels": { "team": "y" } })).await;
    assert_eq!(ids(&server, &key, "label=team=x").await, sorted(vec![&a, &b]));
    assert_eq!(ids(&server, &key, "label=team=x&label=env=prod").await, sorted(vec![&a]), "labels are ANDed");
    assert_eq!(ids(&server, &key, "label=team=z").await, Vec::<String>::new());
    assert_eq!(ids(&server, &key, "template=busybox&state=running").await, sorted(vec![&a, &b, &c]));
    assert_eq!(ids(&server, &key, "template=debian").await, Vec::<String>::new());
    let c_id = c["id"].as_str().unwrap();
    assert_eq!(server.call_as(&key, "POST", &format!("/v1/sessions/{c_id}/pause"), None).await.0, 200);
    assert_eq!(ids(&server, &key, "state=paused").await, sorted(vec![&c]));

    // PATCH replaces them whole; "" removes the name.
    let patch = json!({ "labels": { "team": "z" }, "metadata": {}, "name": "", "auto_resume": true });
    let (status, patched) = server.call_as(&key, "PATCH", &format!("/v1/sessions/{c_id}"), Some(patch)).await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!((&patched["labels"], &patched["metadata"]), (&json!({ "team": "z" }), &json!({})), "{patched}");
    assert_eq!((&patched["name"], &patched["auto_resume"]), (&Value::Null, &json!(true)), "{patched}");
    assert_eq!(ids(&server, &key, "label=team=z").await, sorted(vec![&c]));
    assert_eq!(ids(&server, &key, "label=team=y").await, Vec::<String>::new());
}

#[tokio::test]
async fn names_labels_metadata_and_filters_are_validated() {
    let server = Server::start().await;
    let many: serde_json::Map<String, Value> = (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    for body in [
        json!({ "name": "" }),
        json!({ "name": "x".repeat(129) }),
        json!({ "labels": { "Team": "x" } }),
        json!({ "labels": { "-team": "x" } }),
        json!({ "labels": { "team": "v".repeat(257) } }),
        json!({ "labels": many }),
        json!({ "metadata": { "big": "m".repeat(16 << 10) } }),
    ] {
        let reply = server.call("POST", "/v1/sessions", Some(body.clone())).await;
        assert_error(&reply, 400, "bad_request");
    }
    for query in ["label=team", "label=Bad=x", "state=sleeping", "colour=red", "all=maybe"] {
        assert_error(&server.call("GET", &format!("/v1/sessions?{query}"), None).await, 400, "bad_request");
    }
    let id = server.session().await;
    let reply = server.call("PATCH", &format!("/v1/sessions/{id}"), Some(json!({ "labels": { "A": "b" } }))).await;
    assert_error(&reply, 400, "bad_request");
    assert_eq!(server.get(&id).await["labels"], json!({}), "a refused PATCH changes nothing");
}

#[tokio::test]
async fn forks_keep_labels_metadata_and_auto_resume_but_not_the_name() {
    let server = Server::start().await;
    let body = json!({ "name": "parent", "labels": { "team": "x" }, "metadata": { "m": "1" }, "auto_resume": true });
    let parent = created(&server, &server.admin.clone(), body).await;
    let (status, forks) = server.act(parent["id"].as_str().unwrap(), "fork", json!({ "count": 2 })).await;
    assert_eq!(status, 201, "{forks}");
    for fork in forks["sessions"].as_array().unwrap() {
        assert_eq!((&fork["labels"], &fork["metadata"]), (&parent["labels"], &parent["metadata"]), "{fork}");
        assert_eq!((&fork["auto_resume"], &fork["name"]), (&json!(true), &Value::Null), "{fork}");
    }
    assert_eq!(ids(&server, &server.admin, "label=team=x").await.len(), 3);
}

#[tokio::test]
async fn the_admin_lists_shows_and_destroys_any_tenants_sessions_but_does_nothing_else_with_them() {
    let server = Server::start().await;
    let (acme, other) = (server.tenant_key("acme").await, server.tenant_key("other").await);
    let a = server.session_as(&acme).await;
    let b = server.session_as(&other).await;
    let own = server.session().await;

    assert_eq!(ids(&server, &server.admin, "").await, vec![own.clone()], "without all_tenants, the admin's own");
    let mut all = vec![a.clone(), b.clone(), own.clone()];
    all.sort();
    assert_eq!(ids(&server, &server.admin, "all_tenants=true").await, all);
    let (_, list) = server.call("GET", "/v1/sessions?all_tenants=true&label=x=y", None).await;
    assert_eq!(list["sessions"], json!([]), "filters apply across tenants too");
    for query in ["all_tenants=true", "all_tenants=true&label=NOT%20VALID"] {
        let reply = server.call_as(&acme, "GET", &format!("/v1/sessions?{query}"), None).await;
        assert_error(&reply, 403, "forbidden");
    }

    let (status, shown) = server.call("GET", &format!("/v1/sessions/{a}"), None).await;
    assert_eq!((status, &shown["tenant"]), (200, &json!("acme")), "{shown}");
    // Only show and destroy: exec, lifecycle and settings stay the owner's.
    assert_error(&server.exec(&a, &["true"]).await, 404, "not_found");
    assert_error(&server.act(&a, "pause", json!({})).await, 404, "not_found");
    let patch = server.call("PATCH", &format!("/v1/sessions/{a}"), Some(json!({ "name": "mine" }))).await;
    assert_error(&patch, 404, "not_found");
    assert_error(&server.call_as(&other, "GET", &format!("/v1/sessions/{a}"), None).await, 404, "not_found");
    assert_error(&server.call_as(&other, "DELETE", &format!("/v1/sessions/{a}"), None).await, 404, "not_found");

    let (status, destroyed) = server.call("DELETE", &format!("/v1/sessions/{a}"), None).await;
    assert_eq!((status, destroyed["state"].as_str()), (200, Some("destroyed")), "{destroyed}");
    let (_, seen) = server.call_as(&acme, "GET", &format!("/v1/sessions/{a}"), None).await;
    assert_eq!(seen["state"], "destroyed", "the owner sees it destroyed: {seen}");
    assert_eq!(server.call_as(&other, "GET", &format!("/v1/sessions/{b}"), None).await.1["state"], "running");
}
