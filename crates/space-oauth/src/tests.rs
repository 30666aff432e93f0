use super::*;
use sha2::Digest as _;

fn client(refused: Option<fn(IpAddr) -> bool>) -> OAuthClient {
    OAuthClient::new(&NetConfig { refused_addresses: refused, ..Default::default() }).unwrap()
}

/// A client-credentials request for `url`.
fn client_credentials(url: &Url) -> TokenRequest<'_> {
    TokenRequest {
        token_url: url,
        client_id: "c",
        client_secret: Some("s"),
        auth: ClientAuth::Basic,
        scopes: &[],
        grant: Grant::ClientCredentials,
    }
}

fn loopback(ip: IpAddr) -> bool {
    ip.is_loopback()
}

#[test]
fn a_token_answer_is_checked_before_use() {
    let token =
        parse_answer(200, br#"{"access_token":"at-1","token_type":"Bearer","expires_in":3600,"refresh_token":"rt-2"}"#)
            .unwrap();
    assert_eq!(token.access_token.as_str(), "at-1");
    assert_eq!(token.expires_in, Some(3600));
    assert_eq!(token.refresh_token.as_deref().map(String::as_str), Some("rt-2"));
    let token = parse_answer(200, br#"{"access_token":"at","expires_in":"60"}"#).unwrap();
    assert_eq!(token.expires_in, Some(60), "a string expires_in is read too");

    for (body, why) in [
        (&br#"<html>hi</html>"#[..], "not a JSON token response"),
        (br#"{"token_type":"bearer"}"#, "not a JSON token response"),
        (br#"{"access_token":"","token_type":"bearer"}"#, "access_token is empty"),
        (br#"{"access_token":"a b","token_type":"bearer"}"#, "access_token has characters"),
        (b"{\"access_token\":\"a\\r\\nX-Evil: 1\"}", "access_token has characters"),
        (br#"{"access_token":"a","token_type":"mac"}"#, "is not bearer"),
        (br#"{"access_token":"a","expires_in":-5}"#, "expires_in is not a whole number"),
        (br#"{"access_token":"a","refresh_token":"r\u0000"}"#, "refresh_token has characters"),
    ] {
        let e = parse_answer(200, body).unwrap_err();
        assert!(matches!(&e, OAuthError::Failed(m) if m.contains(why)), "{}: {e}", String::from_utf8_lossy(body));
    }
    let long = format!(r#"{{"access_token":"{}"}}"#, "a".repeat(MAX_TOKEN + 1));
    assert!(parse_answer(200, long.as_bytes()).unwrap_err().to_string().contains("too long"));
}

#[test]
fn an_error_answer_is_reported_by_its_oauth_code_or_status() {
    let e = parse_answer(400, br#"{"error":"invalid_grant","error_description":"refresh token revoked"}"#).unwrap_err();
    assert!(matches!(&e, OAuthError::Refused { error, .. } if error == "invalid_grant"), "{e:?}");
    assert_eq!(e.to_string(), "the token endpoint refused: invalid_grant (refresh token revoked)");
    let e = parse_answer(503, b"upstream connect error").unwrap_err();
    assert!(matches!(&e, OAuthError::Failed(m) if m == "the token endpoint answered HTTP 503"), "{e:?}");
    let noisy = format!(r#"{{"error":"x\u001b[31m{}"}}"#, "y".repeat(1000));
    let e = parse_answer(401, noisy.as_bytes()).unwrap_err().to_string();
    assert!(!e.contains('\u{1b}') && e.len() < 300, "quoted in full: {e}");
}

#[test]
fn endpoints_must_be_https_and_may_be_kept_off_private_addresses() {
    let open = client(None);
    assert!(open.check_url("token_url", "https://127.0.0.1/token").is_ok(), "the operator allows private");
    let guarded = client(Some(loopback));
    for (url, why) in [
        ("http://auth.example.com/token", "must be https"),
        ("https://user:pw@auth.example.com/token", "no user name"),
        ("https://auth.example.com/token#x", "no user name"),
        ("/token", "not an absolute URL"),
        ("https://127.0.0.1:8443/token", "loopback or private"),
        ("https://[::1]/token", "loopback or private"),
    ] {
        let e = guarded.check_url("token_url", url).unwrap_err();
        assert!(matches!(&e, OAuthError::Config(m) if m.contains(why)), "{url}: {e}");
    }
    assert!(guarded.check_url("token_url", "https://auth.example.com/oauth/token?x=1").is_ok());
}

#[tokio::test]
async fn a_name_that_resolves_to_a_refused_address_is_not_dialled() {
    // Something listens there: a connection would be accepted, so only the filter stops it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let guarded = client(Some(loopback));
    let url = guarded.check_url("token_url", &format!("https://localhost:{port}/token")).unwrap();
    let request = client_credentials(&url);
    let e = guarded.token(&request).await.unwrap_err();
    assert!(matches!(&e, OAuthError::Failed(m) if m.contains("did not answer")), "{e:?}");
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the refused address was dialled: {accepted:?}"
    );
    // Control: without the filter the same name is dialled (and the listener sees it).
    let dialled = tokio::spawn(async move {
        let request = client_credentials(&url);
        let _ = client(None).token(&request).await;
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Ok((stream, _)) = listener.accept() {
            drop(stream);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the unguarded client never connected: the test proves nothing");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    dialled.await.unwrap();
}

#[test]
fn pkce_follows_rfc_7636() {
    // RFC 7636 appendix B.
    let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier));
    assert_eq!(challenge, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
    let pkce = Pkce::generate();
    assert_eq!(pkce.verifier.len(), 43);
    assert_eq!(
        pkce.challenge,
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(pkce.verifier.as_bytes()))
    );
    assert_ne!(random_state(), random_state());
    let url = authorization_url(
        &Url::parse("https://auth.example.com/authorize?tenant=1").unwrap(),
        "client one",
        "https://space.example.com/v1/oauth/callback",
        &["repo".into(), "read:user".into()],
        "st",
        &pkce.challenge,
    );
    let pairs: Vec<(String, String)> = url.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("tenant"), Some("1"), "the endpoint's own parameters are kept");
    assert_eq!(get("client_id"), Some("client one"));
    assert_eq!(get("code_challenge_method"), Some("S256"));
    assert_eq!(get("scope"), Some("repo read:user"));
    assert_eq!(get("state"), Some("st"));
}
