//! Ports: the proxy reaches a server "inside" a sandbox (a real HTTP server on loopback that
//! the simulated node connects to), with the API key, a port's token or nothing for a public
//! port, and refuses everyone else the same way.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::extract::ws::{Message as AxumMessage, WebSocketUpgrade};
use axum::http::{HeaderMap, Uri};
use axum::routing::{any, get};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use space_api::SandboxId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::harness::{PREVIEW_DOMAIN, Server, assert_error};

/// A server standing in for one inside a sandbox: `/echo` answers with what it was sent,
/// `/missing` is its own 404, `/ws` echoes WebSocket messages.
async fn upstream() -> SocketAddr {
    async fn echo(uri: Uri, headers: HeaderMap, body: axum::body::Bytes) -> axum::Json<Value> {
        let headers: BTreeMap<String, String> =
            headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect();
        axum::Json(json!({ "uri": uri.to_string(), "headers": headers, "body": String::from_utf8_lossy(&body) }))
    }
    let app = axum::Router::new()
        .route("/echo", any(echo).layer(axum::extract::DefaultBodyLimit::disable()))
        .route("/", get(|| async { "root" }))
        .route(
            "/missing",
            get(|| async { (axum::http::StatusCode::NOT_FOUND, [("content-type", "text/html")], "<p>nope</p>") }),
        )
        .route(
            "/ws",
            get(|ws: WebSocketUpgrade| async move {
                ws.on_upgrade(|mut socket| async move {
                    while let Some(Ok(AxumMessage::Text(text))) = socket.recv().await {
                        let _ = socket.send(AxumMessage::Text(format!("echo {text}").into())).await;
                    }
                })
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A running session whose sandbox serves [`upstream`] on port 8000.
async fn serving_session(server: &Server) -> String {
    let id = server.session().await;
    let sandbox: SandboxId = server.get(&id).await["sandbox_id"].as_str().unwrap().parse().unwrap();
    server.sim.serve_port(&sandbox, 8000, upstream().await);
    id
}

/// A request without the API key: `headers` only.
async fn anonymous(server: &Server, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request = reqwest::Client::new().get(format!("{}{path}", server.url));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test]
async fn the_api_key_reaches_a_port_and_stays_behind() {
    let server = Server::start().await;
    let id = serving_session(&server).await;
    let path = format!("/v1/sessions/{id}/ports/8000/echo?x=1&space_token=pt_no");
    let (status, seen, _) = server.send(&server.admin, "POST", &path, Some("{\"a\":1}".into()), &[]).await;
    assert_eq!(status, 200, "{seen}");
    assert_eq!(seen["uri"], "/echo?x=1", "the prefix and the token query are not forwarded: {seen}");
    assert_eq!(seen["body"], "{\"a\":1}");
    let headers = &seen["headers"];
    assert!(headers.get("authorization").is_none(), "the API key must not reach the sandbox: {headers}");
    assert_eq!(headers["host"], "localhost:8000");
    assert_eq!(headers["x-forwarded-prefix"], format!("/v1/sessions/{id}/ports/8000"));

    let (status, root, _) =
        server.send(&server.admin, "GET", &format!("/v1/sessions/{id}/ports/8000/"), None, &[]).await;
    assert_eq!((status, root), (200, json!("root")));
    // The server's own errors pass through as it sent them, not in the API's envelope.
    let (status, body, headers) =
        server.send(&server.admin, "GET", &format!("/v1/sessions/{id}/ports/8000/missing"), None, &[]).await;
    assert_eq!((status, body), (404, json!("<p>nope</p>")));
    assert_eq!(headers["content-type"], "text/html");
}

#[tokio::test]
async fn without_the_key_a_port_needs_its_token_or_to_be_public() {
    let server = Server::start().await;
    let id = serving_session(&server).await;
    let echo = format!("/v1/sessions/{id}/ports/8000/echo");
    assert_error(&anonymous(&server, &echo, &[]).await, 401, "unauthorized");
    // Another tenant's key: as if the session did not exist.
    let other = server.tenant_key("other").await;
    let (status, body, _) = server.send(&other, "GET", &echo, None, &[]).await;
    assert_error(&(status, body), 404, "not_found");
    // No key and a session that does not exist: the same 401 as a private port.
    let missing = "/v1/sessions/ses_aaaaaaaaaaaaaaaaaaaa/ports/8000/echo";
    assert_error(&anonymous(&server, missing, &[]).await, 401, "unauthorized");

    let (status, opened) = server.call("POST", &format!("/v1/sessions/{id}/ports/8000"), None).await;
    assert_eq!(status, 200, "{opened}");
    let token = opened["token"].as_str().unwrap().to_owned();
    assert_eq!(opened["public"], false);
    assert!(opened["url"].as_str().unwrap().ends_with(&format!("/v1/sessions/{id}/ports/8000/")), "{opened}");
    let (status, seen) = anonymous(&server, &echo, &[("x-space-port-token", &token)]).await;
    assert_eq!(status, 200, "{seen}");
    assert!(seen["headers"].get("x-space-port-token").is_none(), "the token must not reach the sandbox: {seen}");
    let (status, seen) = anonymous(&server, &format!("{echo}?space_token={token}&y=2"), &[]).await;
    assert_eq!((status, seen["uri"].as_str()), (200, Some("/echo?y=2")), "{seen}");
    // The token is for this port only.
    let (status, _) =
        anonymous(&server, &format!("/v1/sessions/{id}/ports/8001/echo"), &[("x-space-port-token", &token)]).await;
    assert_eq!(status, 401);

    // Opening again voids the old token; public needs none; closing undoes both.
    let (_, reopened) =
        server.call("POST", &format!("/v1/sessions/{id}/ports/8000"), Some(json!({"public": true}))).await;
    assert_ne!(reopened["token"], token.as_str());
    assert_eq!(anonymous(&server, &echo, &[]).await.0, 200);
    let (_, list) = server.call("GET", &format!("/v1/sessions/{id}/ports"), None).await;
    assert_eq!(list["ports"][0]["port"], 8000, "{list}");
    assert!(list["ports"][0]["token"].is_null(), "tokens are shown once: {list}");
    let (status, _) = server.call("DELETE", &format!("/v1/sessions/{id}/ports/8000"), None).await;
    assert_eq!(status, 204);
    assert_error(&anonymous(&server, &echo, &[("x-space-port-token", &token)]).await, 401, "unauthorized");
    let closed = server.call("DELETE", &format!("/v1/sessions/{id}/ports/8000"), None).await;
    assert_error(&closed, 404, "not_found");

    let (_, events) = server.call("GET", &format!("/v1/sessions/{id}/events"), None).await;
    let kinds: Vec<&str> = events["events"].as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(kinds.contains(&"port_opened") && kinds.contains(&"port_closed"), "{kinds:?}");
}

#[tokio::test]
async fn preview_hosts_reach_the_port_at_their_root() {
    let server = Server::start().await;
    let id = serving_session(&server).await;
    let (_, opened) = server.call("POST", &format!("/v1/sessions/{id}/ports/8000"), Some(json!({}))).await;
    let preview = opened["preview_url"].as_str().unwrap().to_owned();
    let host = format!("8000-{}.{PREVIEW_DOMAIN}", id.replacen('_', "-", 1));
    assert_eq!(preview, format!("http://{host}/"));
    let token = opened["token"].as_str().unwrap();
    let (status, seen) = anonymous(&server, "/echo?q=1", &[("host", &host), ("x-space-port-token", token)]).await;
    assert_eq!((status, seen["uri"].as_str()), (200, Some("/echo?q=1")), "{seen}");
    assert_eq!(seen["headers"]["x-forwarded-host"], host.as_str());
    // Any path, /v1/... included, is the sandbox server's under a preview host.
    let (status, _) = anonymous(&server, "/v1/health", &[("host", &host)]).await;
    assert_eq!(status, 401, "a private port without credentials");
    let (status, seen) =
        anonymous(&server, "/", &[("host", &format!("{host}:8443")), ("x-space-port-token", token)]).await;
    assert_eq!((status, seen), (200, json!("root")));
}

#[tokio::test]
async fn a_port_nothing_listens_on_is_a_502_and_a_paused_session_a_409() {
    let server = Server::start().await;
    let id = serving_session(&server).await;
    let (status, body, _) =
        server.send(&server.admin, "GET", &format!("/v1/sessions/{id}/ports/9999/"), None, &[]).await;
    assert_error(&(status, body), 502, "port_not_listening");
    let (status, body, _) = server.send(&server.admin, "GET", &format!("/v1/sessions/{id}/ports/0/"), None, &[]).await;
    assert_error(&(status, body), 400, "bad_request");
    assert_eq!(server.act(&id, "pause", json!({})).await.0, 200);
    let (status, body, _) =
        server.send(&server.admin, "GET", &format!("/v1/sessions/{id}/ports/8000/"), None, &[]).await;
    assert_error(&(status, body), 409, "invalid_state");
}

#[tokio::test]
async fn websockets_pass_through_the_proxy_and_tcp_through_the_tunnel() {
    let server = Server::start().await;
    let id = serving_session(&server).await;
    let ws_url = server.url.replacen("http", "ws", 1);
    let mut request = format!("{ws_url}/v1/sessions/{id}/ports/8000/ws").into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {}", server.admin).parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.expect("the upgrade passes through");
    socket.send(Message::Text("hi".into())).await.unwrap();
    assert_eq!(socket.next().await.unwrap().unwrap(), Message::Text("echo hi".into()));

    // The tunnel: raw bytes of an HTTP request in, the server's raw answer out.
    let mut request = format!("{ws_url}/v1/sessions/{id}/tunnel/8000").into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {}", server.admin).parse().unwrap());
    let (mut tunnel, _) = tokio_tungstenite::connect_async(request).await.expect("a tunnel");
    let raw = "GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    tunnel.send(Message::Binary(raw.as_bytes().to_vec().into())).await.unwrap();
    let mut answer = Vec::new();
    while let Some(Ok(Message::Binary(data))) = tunnel.next().await {
        answer.extend_from_slice(&data);
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("root"), "{answer}");
    // A tunnel to a port nothing listens on fails before the upgrade, with the API's error.
    let mut request = format!("{ws_url}/v1/sessions/{id}/tunnel/9999").into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {}", server.admin).parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => assert_eq!(response.status(), 502),
        other => panic!("expected a 502, got {other:?}"),
    }
}

/// A request through the proxy is read from its socket as it streams: a body bigger than the
/// API's JSON limit goes through, and the answer's arrives whole.
#[tokio::test]
async fn large_bodies_stream_both_ways() {
    let server = Server::start().await;
    let id = serving_session(&server).await;
    let body = "x".repeat(3 << 20);
    let (status, seen, _) = server
        .send(&server.admin, "POST", &format!("/v1/sessions/{id}/ports/8000/echo"), Some(body.clone()), &[])
        .await;
    assert_eq!(status, 200);
    assert_eq!(seen["body"].as_str().map(str::len), Some(body.len()));
    // And raw sockets, for completeness: the proxy answers on a kept-alive connection too.
    let mut stream = tokio::net::TcpStream::connect(server.url.trim_start_matches("http://")).await.unwrap();
    let request = format!(
        "GET /v1/sessions/{id}/ports/8000/ HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\r\n",
        server.admin
    );
    for _ in 0..2 {
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut buffer = vec![0u8; 4096];
        while !answer.ends_with(b"root") {
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the connection closed after {:?}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&buffer[..n]);
        }
        assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
    }
}

/// A port call with the API key wakes a suspended `auto_resume` session, as exec does; one
/// by token does not (a shared link must not resume a session), and says how to.
#[tokio::test]
async fn the_api_key_wakes_an_auto_resume_session_and_a_token_does_not() {
    let server = Server::start().await;
    let (status, created) = server.call("POST", "/v1/sessions", Some(json!({ "auto_resume": true }))).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let (_, opened) = server.call("POST", &format!("/v1/sessions/{id}/ports/8000"), None).await;
    let token = opened["token"].as_str().unwrap().to_owned();
    assert_eq!(server.act(&id, "suspend", json!({})).await.0, 200);
    let path = format!("/v1/sessions/{id}/ports/8000/");
    assert_error(&anonymous(&server, &path, &[("x-space-port-token", &token)]).await, 409, "session_suspended");
    assert_eq!(server.get(&id).await["state"], "suspended");
    // The resumed sandbox is a new one that serves nothing: the wake shows as a 502 from it.
    let (status, body, _) = server.send(&server.admin, "GET", &path, None, &[]).await;
    assert_error(&(status, body), 502, "port_not_listening");
    assert_eq!(server.get(&id).await["state"], "running");
}
