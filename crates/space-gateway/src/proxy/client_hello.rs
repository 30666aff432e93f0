//! Reading a TLS ClientHello without answering it, to learn the server name (SNI) while
//! keeping the raw bytes, so they can be replayed upstream (tunnel) or to our own TLS server
//! (interception). Parsing is rustls's (`Acceptor`), never ours.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Most bytes read while looking for a complete ClientHello.
pub(crate) const MAX_HELLO: usize = 16 * 1024;
/// How long a client may take to send it.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// What the first bytes of a connection were.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// A TLS ClientHello, with its server name if any (lower-case).
    Tls { sni: Option<String> },
    /// Not TLS (the first byte is not a handshake record).
    NotTls,
}

/// Reads from `stream` into `buf` until a ClientHello is complete (or the first byte shows it
/// is not TLS). `buf` keeps every byte read.
pub(crate) async fn read_client_hello<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
) -> Result<Hello, String> {
    match tokio::time::timeout(HELLO_TIMEOUT, read_inner(stream, buf)).await {
        Ok(result) => result,
        Err(_) => Err("timed out waiting for the TLS ClientHello".into()),
    }
}

async fn read_inner<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut Vec<u8>) -> Result<Hello, String> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut fed = 0;
    let mut chunk = [0u8; 4096];
    loop {
        if buf.first().is_some_and(|b| *b != 0x16) {
            return Ok(Hello::NotTls);
        }
        if fed < buf.len() {
            match parse(&mut acceptor, &buf[fed..])? {
                Some(hello) => return Ok(hello),
                None => fed = buf.len(),
            }
        }
        if buf.len() >= MAX_HELLO {
            return Err(format!("no complete TLS ClientHello in the first {MAX_HELLO} bytes"));
        }
        let want = chunk.len().min(MAX_HELLO - buf.len());
        let n = stream.read(&mut chunk[..want]).await.map_err(|e| format!("reading the ClientHello: {e}"))?;
        if n == 0 {
            return Err("connection closed before a complete TLS ClientHello".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Feeds `new` bytes to `acceptor`: `Some` once the ClientHello is complete.
fn parse(acceptor: &mut rustls::server::Acceptor, new: &[u8]) -> Result<Option<Hello>, String> {
    let mut rest = new;
    while !rest.is_empty() {
        let n = acceptor.read_tls(&mut rest).map_err(|e| format!("bad TLS record: {e}"))?;
        if n == 0 {
            break;
        }
    }
    match acceptor.accept() {
        Ok(None) => Ok(None),
        Ok(Some(accepted)) => {
            let sni = accepted.client_hello().server_name().map(|s| s.to_ascii_lowercase());
            Ok(Some(Hello::Tls { sni }))
        }
        Err((e, _alert)) => Err(format!("bad TLS ClientHello: {e}")),
    }
}

/// Parses a complete ClientHello held in `bytes` (for tests and callers with a buffer).
#[cfg(test)]
pub(crate) fn parse_client_hello(bytes: &[u8]) -> Result<Option<Hello>, String> {
    parse(&mut rustls::server::Acceptor::default(), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The first flight of a real rustls client for `name`.
    pub(crate) fn client_hello_for(name: &str) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    #[test]
    fn sni_is_read_from_a_real_client_hello() {
        let hello = client_hello_for("API.Example.com");
        assert_eq!(parse_client_hello(&hello).unwrap(), Some(Hello::Tls { sni: Some("api.example.com".into()) }));
        // Incomplete: more is needed.
        assert_eq!(parse_client_hello(&hello[..hello.len() / 2]).unwrap(), None);
        // An IP literal sends no SNI.
        let hello = client_hello_for("192.0.2.1");
        assert_eq!(parse_client_hello(&hello).unwrap(), Some(Hello::Tls { sni: None }));
    }

    #[tokio::test]
    async fn peeking_keeps_the_bytes_and_handles_garbage() {
        let hello = client_hello_for("api.test");
        let mut buf = Vec::new();
        let mut stream = &hello[..];
        assert_eq!(
            read_client_hello(&mut stream, &mut buf).await.unwrap(),
            Hello::Tls { sni: Some("api.test".into()) }
        );
        assert_eq!(buf, hello);

        let mut buf = Vec::new();
        let mut stream = &b"GET / HTTP/1.1\r\n\r\n"[..];
        assert_eq!(read_client_hello(&mut stream, &mut buf).await.unwrap(), Hello::NotTls);
        assert_eq!(buf[0], b'G');

        // A handshake record header with junk inside.
        let mut buf = Vec::new();
        let junk = [0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5];
        let mut stream = &junk[..];
        assert!(read_client_hello(&mut stream, &mut buf).await.is_err());

        // Truncated.
        let mut buf = Vec::new();
        let mut stream = &hello[..20];
        assert!(read_client_hello(&mut stream, &mut buf).await.is_err());
    }
}
