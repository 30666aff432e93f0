//! A policy that allows any host (`allow: ["*"]`, E2B's internet access): names the policy
//! does not list are reached, but `deny` still wins, credentials are injected only for
//! their own hosts, and a name that resolves to a private or loopback address is refused.

use http::StatusCode;
use space_api::egress::{ANY_HOST, AuditDecision, NetworkPolicy};
use tokio::net::TcpStream;

use super::tests::{Setup, egress, get, grant, http_client};

const SECRET: &str = "s3cret-value";

/// A gateway where `unlisted.test` resolves to the plain HTTP test upstream, and whose
/// session's policy is `policy` (with the `api.test` grant of [`Setup`]).
async fn setup(allow_private_upstreams: bool, policy: NetworkPolicy) -> Setup {
    let setup = Setup::with(|config| {
        let plain = config.resolve["plain.test"];
        config.resolve.insert("unlisted.test".into(), plain);
        config.allow_private_upstreams = allow_private_upstreams;
    })
    .await;
    let mut egress = egress(&setup.ca, vec![grant(SECRET)]);
    egress.policy = policy;
    setup.context.set_test_session(&setup.session, egress);
    setup
}

fn any_host(deny: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        allow: vec![ANY_HOST.into()],
        deny: deny.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    }
}

/// `GET http://{host}/` through the explicit proxy.
async fn fetch(setup: &Setup, host: &str) -> (StatusCode, String) {
    let mut sender = http_client(TcpStream::connect(setup.proxy).await.unwrap()).await;
    get(&mut sender, host, &format!("http://{host}/"), &[]).await
}

#[tokio::test]
async fn any_host_reaches_unlisted_names_and_deny_still_wins() {
    let mut listed = setup(true, NetworkPolicy { allow: vec!["plain.test".into()], ..Default::default() }).await;
    assert_eq!(fetch(&listed, "unlisted.test").await.0, StatusCode::FORBIDDEN, "not listed, not reached");
    assert_eq!(listed.event().await.decision, AuditDecision::Denied);

    let mut open = setup(true, any_host(&["denied.test"])).await;
    let (status, body) = fetch(&open, "unlisted.test").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.contains(SECRET), "no credential for a host without a grant: {body}");
    let event = open.event().await;
    assert_eq!((event.decision, event.host.as_str()), (AuditDecision::Allowed, "unlisted.test"));

    let (status, _) = fetch(&open, "denied.test").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let event = open.event().await;
    assert_eq!(event.decision, AuditDecision::Denied);
    assert_eq!(event.reason.as_deref(), Some("name denied.test not allowed"));
}

#[tokio::test]
async fn any_host_over_tls_is_tunnelled_untouched_unless_granted() {
    let mut setup = setup(true, any_host(&[])).await;
    let (status, stream) = setup.connect("other.test:443").await;
    assert_eq!(status, 200);
    // The upstream's own certificate: not intercepted, so nothing is injected.
    let tls = Setup::tls(stream, "other.test", setup.upstream.ca_der.clone()).await.unwrap();
    let mut sender = http_client(tls).await;
    let (status, body) = get(&mut sender, "other.test", "/x", &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!body.contains("authorization") && !body.contains(SECRET), "{body}");
    drop(sender);
    assert_eq!(setup.event().await.decision, AuditDecision::Allowed);
}

#[tokio::test]
async fn any_host_does_not_reach_private_upstreams() {
    let mut setup = setup(false, any_host(&[])).await;
    let (status, _) = fetch(&setup, "unlisted.test").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let event = setup.event().await;
    assert_eq!(event.decision, AuditDecision::Denied);
    assert_eq!(event.reason.as_deref(), Some("private upstream address 127.0.0.1"));
}

#[tokio::test]
async fn any_host_still_injects_a_credential_for_its_own_host_only() {
    let mut setup = setup(true, any_host(&[])).await;
    let (status, stream) = setup.connect("api.test:443").await;
    assert_eq!(status, 200);
    // The session's CA: the granted host is intercepted, as without `*`.
    let root = rustls::pki_types::CertificateDer::from(
        crate::certificates_from_pem(setup.ca.cert_pem.as_bytes()).unwrap().remove(0),
    );
    let tls = Setup::tls(stream, "api.test", root).await.unwrap();
    let mut sender = http_client(tls).await;
    let (status, body) = get(&mut sender, "api.test", "/x", &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains(&format!("authorization: Bearer {SECRET}\n")), "{body}");
    assert_eq!(setup.event().await.decision, AuditDecision::Injected);
}

/// Every address (`cidrs: ["0.0.0.0/0"]`, E2B's internet) is every public one: link-local
/// metadata, Azure's host service and private ranges stay refused.
#[tokio::test]
async fn every_address_leaves_out_metadata_and_private_ranges() {
    let policy = NetworkPolicy { cidrs: vec!["0.0.0.0/0".into()], ..any_host(&[]) };
    let mut setup = setup(false, policy).await;
    for address in ["169.254.169.254", "168.63.129.16", "10.0.0.1", "127.0.0.1"] {
        let (status, _) = setup.connect(&format!("{address}:443")).await;
        assert_eq!(status, 403, "{address}");
        let event = setup.event().await;
        assert_eq!(event.decision, AuditDecision::Denied);
        assert_eq!(event.reason.as_deref(), Some(format!("private upstream address {address}").as_str()));
    }
}
