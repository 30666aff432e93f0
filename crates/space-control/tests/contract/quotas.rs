//! Per-tenant quotas on sessions, CPUs, memory and disk: the next create (fork, resume) that
//! would go over is refused with 429 naming the limit, the use and the request; concurrent
//! creates never overshoot; suspended sessions free their CPUs and memory, not their disk.

use serde_json::{Value, json};

use crate::harness::{DEFAULT_DISK_MIB, Server, assert_error, error_of};

async fn set_quota(server: &Server, tenant: &str, limits: Value) -> Value {
    let (status, quota) = server.call("PUT", &format!("/v1/tenants/{tenant}/quota"), Some(limits)).await;
    assert_eq!(status, 200, "{quota}");
    quota
}

async fn create(server: &Server, key: &str, body: Value) -> (u16, Value) {
    server.call_as(key, "POST", "/v1/sessions", Some(body)).await
}

async fn count_sessions(server: &Server, key: &str) -> usize {
    let (_, list) = server.call_as(key, "GET", "/v1/sessions", None).await;
    list["sessions"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_session_quota_refuses_the_next_create_and_names_limit_use_and_request() {
    let server = Server::start().await;
    let key = server.tenant_key("acme").await;
    let quota = set_quota(&server, "acme", json!({ "max_sessions": 2 })).await;
    assert_eq!((&quota["max_sessions"], &quota["max_cpus"]), (&json!(2), &Value::Null), "{quota}");
    let first = server.session_as(&key).await;
    server.session_as(&key).await;

    let refused = create(&server, &key, json!({})).await;
    assert_error(&refused, 429, "quota_exceeded");
    let message = error_of(&refused.1).1;
    for part in ["max_sessions = 2", "2 in use", "asks for 1 more", "acme"] {
        assert!(message.contains(part), "{part:?} missing: {message}");
    }
    assert_eq!(count_sessions(&server, &key).await, 2, "nothing was recorded");
    // The tenant reads its own quota and use; another tenant's is not found.
    let (status, own) = server.call_as(&key, "GET", "/v1/tenants/acme/quota", None).await;
    assert_eq!((status, &own["usage"]["sessions"]), (200, &json!(2)), "{own}");
    let other = server.tenant_key("other").await;
    assert_error(&server.call_as(&other, "GET", "/v1/tenants/acme/quota", None).await, 404, "not_found");
    // A tenant cannot set quotas, whatever it sends.
    for body in [Some("{not json".to_owned()), Some(r#"{"max_sessions":100}"#.to_owned())] {
        let (status, reply, _) = server.send(&key, "PUT", "/v1/tenants/acme/quota", body, &[]).await;
        assert_error(&(status, reply), 403, "forbidden");
    }

    // A destroyed session gives its place back.
    assert_eq!(server.call_as(&key, "DELETE", &format!("/v1/sessions/{first}"), None).await.0, 200);
    server.session_as(&key).await;
    // Other tenants are not limited by it.
    server.session_as(&other).await;
    server.session_as(&other).await;
    server.session_as(&other).await;
}

#[tokio::test]
async fn suspended_sessions_free_cpus_and_memory_and_a_resume_is_checked() {
    let server = Server::start().await;
    let key = server.tenant_key("acme").await;
    set_quota(&server, "acme", json!({ "max_cpus": 2, "max_memory_mib": 4096 })).await;
    let one = server.session_as(&key).await;
    let memory = create(&server, &key, json!({ "memory_mib": 4096 })).await;
    assert_error(&memory, 429, "quota_exceeded");
    assert!(error_of(&memory.1).1.contains("max_memory_mib = 4096 MiB: 512 MiB in use"), "{}", memory.1);
    let (status, body) = create(&server, &key, json!({ "cpus": 1.0 })).await;
    assert_eq!(status, 201, "{body}");
    let refused = create(&server, &key, json!({ "cpus": 0.5 })).await;
    assert_error(&refused, 429, "quota_exceeded");
    assert!(error_of(&refused.1).1.contains("max_cpus = 2: 2 in use, this request asks for 0.5 more"), "{}", refused.1);

    // Suspended: its CPUs are free for another session, and then it cannot come back.
    let suspend = server.call_as(&key, "POST", &format!("/v1/sessions/{one}/suspend"), None).await;
    assert_eq!(suspend.0, 200, "{}", suspend.1);
    let (status, _) = create(&server, &key, json!({ "cpus": 1.0 })).await;
    assert_eq!(status, 201);
    let resume = server.call_as(&key, "POST", &format!("/v1/sessions/{one}/resume"), None).await;
    assert_error(&resume, 429, "quota_exceeded");
    let (_, session) = server.call_as(&key, "GET", &format!("/v1/sessions/{one}"), None).await;
    assert_eq!(session["state"], "suspended", "a refused resume leaves it suspended: {session}");
    let (_, quota) = server.call_as(&key, "GET", "/v1/tenants/acme/quota", None).await;
    assert_eq!(
        quota["usage"],
        json!({ "sessions": 3, "cpus": 2.0, "memory_mib": 1024, "disk_mib": 3 * DEFAULT_DISK_MIB })
    );
}

#[tokio::test]
async fn a_fork_over_the_quota_creates_none_of_its_sessions() {
    let server = Server::start().await;
    let key = server.tenant_key("acme").await;
    set_quota(&server, "acme", json!({ "max_sessions": 3 })).await;
    let parent = server.session_as(&key).await;
    let fork = |count: u32| {
        let path = format!("/v1/sessions/{parent}/fork");
        let key = key.clone();
        let server = &server;
        async move { server.call_as(&key, "POST", &path, Some(json!({ "count": count }))).await }
    };
    let refused = fork(3).await;
    assert_error(&refused, 429, "quota_exceeded");
    assert!(error_of(&refused.1).1.contains("asks for 3 more"), "{}", refused.1);
    assert_eq!(count_sessions(&server, &key).await, 1, "no fork was recorded");
    let (status, forks) = fork(2).await;
    assert_eq!((status, forks["sessions"].as_array().map(Vec::len)), (201, Some(2)), "{forks}");
}

#[tokio::test]
async fn a_disk_quota_counts_every_live_session_and_needs_a_disk_limit() {
    let server = Server::start().await;
    let key = server.tenant_key("acme").await;
    set_quota(&server, "acme", json!({ "max_disk_mib": 2 * DEFAULT_DISK_MIB })).await;
    let one = server.session_as(&key).await;
    let unlimited = create(&server, &key, json!({ "disk_mib": 0 })).await;
    assert_error(&unlimited, 429, "quota_exceeded");
    assert!(error_of(&unlimited.1).1.contains("disk_mib"), "{}", unlimited.1);
    server.session_as(&key).await;
    // Suspended sessions keep their disk.
    assert_eq!(server.call_as(&key, "POST", &format!("/v1/sessions/{one}/suspend"), None).await.0, 200);
    assert_error(&create(&server, &key, json!({})).await, 429, "quota_exceeded");
    let (status, _) = create(&server, &key, json!({ "disk_mib": 16 })).await;
    assert_eq!(status, 429, "the quota is used up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_never_overshoot_the_quota() {
    let server = Server::start().await;
    let key = server.tenant_key("acme").await;
    set_quota(&server, "acme", json!({ "max_sessions": 3 })).await;
    let creates = (0..10).map(|_| create(&server, &key, json!({})));
    let replies = futures::future::join_all(creates).await;
    let created = replies.iter().filter(|(status, _)| *status == 201).count();
    for reply in replies.iter().filter(|(status, _)| *status != 201) {
        assert_error(reply, 429, "quota_exceeded");
    }
    assert_eq!(created, 3, "{replies:?}");
    assert_eq!(count_sessions(&server, &key).await, 3);
}

#[tokio::test]
async fn quotas_are_validated_and_unknown_tenants_are_not_found() {
    let server = Server::start().await;
    for bad in [json!({ "max_cpus": -1 }), json!({ "max_sessions": "many" }), json!({ "surprise": 1 })] {
        let reply = server.call("PUT", "/v1/tenants/acme/quota", Some(bad.clone())).await;
        assert_error(&reply, 400, "bad_request");
    }
    assert_error(&server.call("PUT", "/v1/tenants/BAD%20NAME/quota", Some(json!({}))).await, 400, "bad_request");
    assert_error(&server.call("GET", "/v1/tenants/nobody/quota", None).await, 404, "not_found");
    // Setting a quota makes the tenant, so it can be set before its first key.
    set_quota(&server, "later", json!({ "max_sessions": 1 })).await;
    let key = server.tenant_key("later").await;
    server.session_as(&key).await;
    assert_error(&create(&server, &key, json!({})).await, 429, "quota_exceeded");
    // null is unlimited again.
    set_quota(&server, "later", json!({ "max_sessions": null })).await;
    server.session_as(&key).await;
}
