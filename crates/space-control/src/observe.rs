//! What every API request leaves behind: an `x-request-id` on its response, a tracing span
//! carrying that id around everything logged while it is handled, and its latency in the
//! metrics by route template (never the raw path, which holds session ids).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The header a request id comes in (optionally) and goes out in (always).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest incoming request id that is kept.
const MAX_ID: usize = 128;

/// The request's id, for handlers that want to name it.
#[derive(Debug, Clone)]
pub struct RequestId(pub Arc<str>);

/// Where the router writes the route template that matched, for [`observe`] (which runs
/// outside the router and so before it matches) to read once the response is made.
#[derive(Clone, Default)]
struct MatchedRoute(Arc<OnceLock<String>>);

/// An incoming id a proxy or client set, if it is sane: 1 to 128 characters of letters,
/// digits and `-_.:`. Anything else is replaced rather than refused: it is only a label.
fn incoming_id(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(&REQUEST_ID)?.to_str().ok()?;
    let sane = !value.is_empty()
        && value.len() <= MAX_ID
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    sane.then(|| value.to_owned())
}

fn generated_id() -> String {
    format!("req_{}", hex::encode(rand::random::<[u8; 12]>()))
}

/// Middleware around the whole API (outside the router and the request-size limits, so
/// every response gets an id, a 414 too).
pub async fn observe(mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = incoming_id(request.headers()).unwrap_or_else(generated_id);
    let route = MatchedRoute::default();
    request.extensions_mut().insert(route.clone());
    request.extensions_mut().insert(RequestId(Arc::from(id.as_str())));
    let method = request.method().clone();
    let path = space_api::error::clip(request.uri().path());
    let span = tracing::info_span!("request", id = %id, method = %method, path = %path);
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    let elapsed = started.elapsed();
    space_metrics::http_request(method.as_str(), route.0.get().map(String::as_str), status.as_u16(), elapsed);
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    let ms = elapsed.as_secs_f64() * 1000.0;
    span.in_scope(|| match status.is_server_error() {
        true => tracing::warn!(status = status.as_u16(), ms, "request failed"),
        false => tracing::debug!(status = status.as_u16(), ms, "request done"),
    });
    response
}

/// Middleware inside the router (a `Router::layer`, so it runs once a route matched): hands
/// the route template to [`observe`].
pub async fn note_route(request: Request, next: Next) -> Response {
    if let (Some(slot), Some(matched)) =
        (request.extensions().get::<MatchedRoute>(), request.extensions().get::<MatchedPath>())
    {
        let _ = slot.0.set(matched.as_str().to_owned());
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::Router;
    use axum::body::Body;
    use axum::middleware::from_fn;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    /// What a subscriber writes, kept for the test to read.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn app() -> Router {
        let handler = || async {
            tracing::info!("inside the handler");
            "ok"
        };
        let app = Router::new().route("/items/{id}", get(handler)).layer(from_fn(note_route));
        Router::new().fallback_service(tower::ServiceBuilder::new().layer(from_fn(observe)).service(app))
    }

    async fn get_with_id(id: &str) -> Response {
        let request = Request::get("/items/7").header(REQUEST_ID, id).body(Body::empty()).unwrap();
        app().oneshot(request).await.unwrap()
    }

    /// In both log formats `space serve` has, a handler's line carries the request's id.
    #[tokio::test(flavor = "current_thread")]
    async fn what_a_handler_logs_carries_the_request_id() {
        let text = Captured::default();
        let writer = text.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
        let response = {
            let _default = tracing::subscriber::set_default(subscriber);
            get_with_id("text-1").await
        };
        assert_eq!(response.headers()[&REQUEST_ID], "text-1");
        let logged = String::from_utf8(text.0.lock().unwrap().clone()).unwrap();
        let line = logged.lines().find(|l| l.contains("inside the handler")).unwrap_or_else(|| panic!("{logged}"));
        assert!(line.contains("id=text-1") && line.contains("method=GET"), "{line}");

        let json = Captured::default();
        let writer = json.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(move || writer.clone())
            .finish();
        {
            let _default = tracing::subscriber::set_default(subscriber);
            get_with_id("json-2").await;
        }
        let logged = String::from_utf8(json.0.lock().unwrap().clone()).unwrap();
        let line = logged.lines().find(|l| l.contains("inside the handler")).unwrap_or_else(|| panic!("{logged}"));
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["span"]["id"], "json-2", "{line}");
    }

    #[tokio::test]
    async fn responses_get_a_generated_id_when_none_came() {
        let response = app().oneshot(Request::get("/items/1").body(Body::empty()).unwrap()).await.unwrap();
        let id = response.headers()[&REQUEST_ID].to_str().unwrap();
        assert!(id.starts_with("req_"), "{id}");
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn sane_incoming_ids_are_kept_and_others_replaced() {
        for kept in ["abc", "0af7651916cd43dd8448eb211c80319c", "trace-1:span_2.x", &"a".repeat(MAX_ID)] {
            assert_eq!(incoming_id(&headers(kept)).as_deref(), Some(kept));
        }
        for refused in ["", "has space", "semi;colon", "quote\"", &"a".repeat(MAX_ID + 1), "ünïcode"] {
            let mut map = HeaderMap::new();
            if let Ok(value) = HeaderValue::from_str(refused) {
                map.insert(REQUEST_ID, value);
            }
            assert_eq!(incoming_id(&map), None, "{refused:?}");
        }
        let (a, b) = (generated_id(), generated_id());
        assert!(a.starts_with("req_") && a.len() == 28 && a != b, "{a} {b}");
    }
}
