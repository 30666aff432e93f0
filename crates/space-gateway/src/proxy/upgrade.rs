//! WebSocket through the gateway: the handshake is an ordinary request (checked, and given
//! its credential when intercepted); once the upstream answers 101, both connections are
//! handed over and spliced until either side closes.
//!
//! WebSocket is the only upgrade relayed. After it the connection carries frames, never
//! another HTTP request; an `h2c` upgrade would carry requests (each with its own
//! `:authority`) that the gateway could no longer check one by one.

use std::sync::Arc;

use http::HeaderValue;
use http::header::{self, HeaderMap};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::audit::{Direction, Record};
use super::forward::connection_tokens;
use super::io::Counting;

/// Whether `headers` ask to switch (or, in a 101, have switched) to WebSocket:
/// `Connection` names `upgrade` and `Upgrade` is `websocket`.
pub(crate) fn is_websocket(headers: &HeaderMap) -> bool {
    let connection_upgrade = connection_tokens(headers).any(|token| token.eq_ignore_ascii_case("upgrade"));
    let to_websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"));
    connection_upgrade && to_websocket
}

/// Puts back the two hop-by-hop headers of a WebSocket handshake (after they were removed
/// with the others).
pub(crate) fn set_websocket_headers(headers: &mut HeaderMap) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
}

/// Splices the sandbox's side and the upstream's side once both have switched, counting
/// into `record` (whose event is sent when the WebSocket closes).
pub(crate) async fn splice(client: OnUpgrade, upstream: OnUpgrade, record: Arc<Record>) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(both) => both,
        Err(e) => return tracing::debug!("WebSocket upgrade: {e}"),
    };
    let mut client = Counting::new(TokioIo::new(client));
    let mut upstream = TokioIo::new(upstream);
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        tracing::debug!("WebSocket: {e}");
    }
    record.count(Direction::Sent, client.read);
    record.count(Direction::Received, client.written);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(header::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn only_a_websocket_handshake_counts() {
        assert!(is_websocket(&headers(&[("connection", "Upgrade"), ("upgrade", "websocket")])));
        assert!(is_websocket(&headers(&[("connection", "keep-alive, upgrade"), ("upgrade", "WebSocket")])));
        assert!(is_websocket(&headers(&[
            ("connection", "close"),
            ("connection", "Upgrade"),
            ("upgrade", "websocket")
        ])));
        assert!(!is_websocket(&headers(&[("upgrade", "websocket")])));
        assert!(!is_websocket(&headers(&[("connection", "upgrade"), ("upgrade", "h2c")])));
        assert!(!is_websocket(&headers(&[("connection", "upgrade-me"), ("upgrade", "websocket")])));
        let mut put_back = HeaderMap::new();
        set_websocket_headers(&mut put_back);
        assert!(is_websocket(&put_back));
    }
}
