//! `oauth2` credentials through the API: settings that cannot work are refused with what to
//! do, secrets are never returned, a sign-in is the tenant's own, and its callback (which
//! needs no API key) refuses a state it did not issue and reports a token endpoint that does
//! not answer as `oauth_failed`.

use serde_json::{Value, json};

use crate::harness::{Server, assert_error, error_of};

/// A closed loopback port: nothing answers there.
const TOKEN_URL: &str = "https://127.0.0.1:1/token";

fn oauth(name: &str, settings: Value) -> Value {
    json!({ "name": name, "hosts": ["api.example.com"], "kind": "oauth2", "oauth2": settings })
}

fn settings() -> Value {
    json!({ "token_url": TOKEN_URL, "client_id": "cid", "client_secret": "cs-secret-1", "grant_type": "refresh_token",
            "authorize_url": "https://auth.example.com/authorize",
            "redirect_uri": "http://127.0.0.1:9/v1/oauth/callback" })
}

#[tokio::test]
async fn settings_that_cannot_work_are_refused_and_secrets_never_returned() {
    let server = Server::start().await;
    let with = |changes: Value| {
        let mut s = settings();
        for (k, v) in changes.as_object().unwrap() {
            s[k] = v.clone();
        }
        s
    };
    let refused = [
        (oauth("a", with(json!({ "token_url": "http://auth.example.com/token" }))), "must be https"),
        (oauth("a", with(json!({ "token_url": "https://u:p@auth.example.com/token" }))), "no user name"),
        (oauth("a", with(json!({ "authorize_url": "ftp://x/" }))), "must be https"),
        (oauth("a", with(json!({ "redirect_uri": "https://space.example.com/elsewhere" }))), "/v1/oauth/callback"),
        (oauth("a", with(json!({ "client_id": "" }))), "client_id"),
        (oauth("a", with(json!({ "client_secret": "a b" }))), "client_secret has characters"),
        (oauth("a", with(json!({ "scopes": ["two words"] }))), "is not a scope"),
        (
            oauth(
                "a",
                with(json!({ "grant_type": "client_credentials", "authorize_url": null, "client_secret": null })),
            ),
            "needs oauth2.client_secret",
        ),
        (
            oauth(
                "a",
                with(json!({ "grant_type": "client_credentials", "authorize_url": null, "refresh_token": "rt" })),
            ),
            "uses none",
        ),
        (
            oauth("a", with(json!({ "grant_type": "client_credentials" }))),
            "authorize_url is for grant_type refresh_token",
        ),
        (oauth("a", with(json!({ "authorize_url": null }))), "needs oauth2.refresh_token, or oauth2.authorize_url"),
        (json!({ "name": "a", "hosts": ["api.example.com"], "kind": "oauth2" }), "needs oauth2 settings"),
        (
            json!({ "name": "a", "hosts": ["h.example.com"], "header": "A: {secret}", "value": "v", "oauth2": settings() }),
            "\"kind\": \"oauth2\"",
        ),
        (
            {
                let mut b = oauth("a", settings());
                b["value"] = json!("v");
                b
            },
            "has no value",
        ),
        (
            {
                let mut b = oauth("a", settings());
                b["header"] = json!("X-Token: plain");
                b
            },
            "must contain {secret}",
        ),
    ];
    for (body, why) in refused {
        let reply = server.call("POST", "/v1/credentials", Some(body.clone())).await;
        assert_error(&reply, 400, "bad_request");
        assert!(error_of(&reply.1).1.contains(why), "{body}: {}", reply.1);
    }
    assert_eq!(server.call("GET", "/v1/credentials", None).await.1["credentials"], json!([]), "nothing was stored");

    let (status, created) = server.call("POST", "/v1/credentials", Some(oauth("gh", settings()))).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["kind"], "oauth2");
    assert_eq!(created["header"], "Authorization: Bearer {secret}", "the default header");
    assert_eq!(created["oauth2"]["status"], "needs_login");
    assert!(!created.to_string().contains("cs-secret-1"), "{created}");
    // Static fields and OAuth fields are not mixed up on update.
    let reply = server.call("PATCH", "/v1/credentials/gh", Some(json!({ "value": "v" }))).await;
    assert!(error_of(&reply.1).1.contains("change its client_secret or refresh_token"), "{}", reply.1);
    let body = json!({ "name": "plain", "hosts": ["h.example.com"], "header": "A: {secret}", "value": "v" });
    assert_eq!(server.call("POST", "/v1/credentials", Some(body)).await.0, 201);
    let reply = server.call("PATCH", "/v1/credentials/plain", Some(json!({ "refresh_token": "rt" }))).await;
    assert!(error_of(&reply.1).1.contains("is static"), "{}", reply.1);
    let reply = server.call("POST", "/v1/credentials/plain/login", Some(json!({}))).await;
    assert!(error_of(&reply.1).1.contains("only oauth2 credentials sign in"), "{}", reply.1);
    let machine =
        json!({ "token_url": TOKEN_URL, "client_id": "m", "client_secret": "s", "grant_type": "client_credentials" });
    assert_eq!(server.call("POST", "/v1/credentials", Some(oauth("machine", machine))).await.0, 201);
    let reply = server.call("POST", "/v1/credentials/machine/login", Some(json!({}))).await;
    assert!(error_of(&reply.1).1.contains("signs in as the client, not as a user"), "{}", reply.1);
    let listed = server.call("GET", "/v1/credentials", None).await.1;
    assert!(!listed.to_string().contains("cs-secret-1"), "{listed}");
}

#[tokio::test]
async fn a_sign_in_is_the_tenants_own_and_its_callback_trusts_only_its_state() {
    let server = Server::start().await;
    let (status, body) = server.call("POST", "/v1/credentials", Some(oauth("gh", settings()))).await;
    assert_eq!(status, 201, "{body}");
    let other = server.tenant_key("other").await;
    let reply = server.call_as(&other, "POST", "/v1/credentials/gh/login", Some(json!({}))).await;
    assert_error(&reply, 404, "credential_not_found");

    // A sign-in the provider refused: recorded, and its state is spent.
    let state_of = |login: &Value| {
        let url = login["authorization_url"].as_str().unwrap().to_owned();
        (url.clone(), url.split("state=").nth(1).unwrap().split('&').next().unwrap().to_owned())
    };
    let (status, denied) = server.call("POST", "/v1/credentials/gh/login", Some(json!({}))).await;
    assert_eq!(status, 200, "{denied}");
    let (_, denied_state) = state_of(&denied);
    let path = format!("/v1/oauth/callback?state={denied_state}&error=access_denied");
    let reply = server.call_as("", "GET", &path, None).await;
    assert!(error_of(&reply.1).1.contains("the sign-in was refused: \"access_denied\""), "{}", reply.1);
    assert_error(&server.call_as("", "GET", &path, None).await, 400, "bad_request");
    let c = server.call("GET", "/v1/credentials/gh", None).await.1;
    assert_eq!(c["oauth2"]["status"], "needs_login", "{c}");

    // A new sign-in replaces the one before it.
    let (status, replaced) = server.call("POST", "/v1/credentials/gh/login", Some(json!({}))).await;
    assert_eq!(status, 200, "{replaced}");
    let (status, login) = server.call("POST", "/v1/credentials/gh/login", Some(json!({}))).await;
    assert_eq!(status, 200, "{login}");
    let (url, state) = state_of(&login);
    assert!(url.starts_with("https://auth.example.com/authorize?response_type=code&client_id=cid&"), "{url}");
    assert!(url.contains("code_challenge_method=S256") && state.len() >= 43, "{url}");
    let path = format!("/v1/oauth/callback?state={}&code=c", state_of(&replaced).1);
    assert_error(&server.call_as("", "GET", &path, None).await, 400, "bad_request");

    // No API key needed, and a state the server did not issue is refused.
    for query in ["state=forged&code=c", "code=c", "state=&code=c"] {
        let reply = server.call_as("", "GET", &format!("/v1/oauth/callback?{query}"), None).await;
        assert_error(&reply, 400, "bad_request");
        assert!(error_of(&reply.1).1.contains("unknown, used already or expired"), "{}", reply.1);
    }
    // The first sign-in's code, with a token endpoint that does not answer: 502 oauth_failed.
    let reply = server.call_as("", "GET", &format!("/v1/oauth/callback?state={state}&code=c"), None).await;
    assert_error(&reply, 502, "oauth_failed");
    assert!(error_of(&reply.1).1.contains("did not answer"), "{}", reply.1);
    let c = server.call("GET", "/v1/credentials/gh", None).await.1;
    assert!(c["oauth2"]["reason"].as_str().unwrap().contains("code exchange failed"), "{c}");
}
