//! The egress control plane without a node: stores, sealers and a gateway in-process.

use space_gateway::Gateway;
use space_keys::Sealer;

use super::*;

#[test]
fn headers_need_a_name_and_the_secret() {
    let (name, value) = parse_header("Authorization: Bearer {secret}").unwrap();
    assert_eq!((name.as_str(), value.as_str()), ("Authorization", "Bearer {secret}"));
    assert_eq!(parse_header("X-Api-Key:{secret}").unwrap().1, "{secret}");
    for bad in
        ["Authorization Bearer {secret}", "Authorization: Bearer", "Bad Name: {secret}", ": {secret}", "Host: {secret}"]
    {
        let e = parse_header(bad).unwrap_err();
        assert!(e.0.message.contains("Bearer {secret}"), "{bad}: {}", e.0.message);
    }
}

#[test]
fn values_names_and_env_are_checked() {
    assert!(validate_value("ghp_abc").is_ok());
    assert!(validate_value("").is_err());
    assert!(validate_value("a\nb").unwrap_err().0.message.contains("line break"));
    assert!(validate_value(&"x".repeat(MAX_CREDENTIAL_VALUE + 1)).is_err());
    assert!(validate_credential_name("github.token_1").is_ok());
    for bad in ["", ".x", "a b", "a/b", &"x".repeat(65)] {
        assert!(validate_credential_name(bad).is_err(), "{bad}");
    }
    assert!(validate_env_name("GITHUB_TOKEN").is_ok());
    assert!(validate_env_name("1X").is_err());
    assert!(validate_env_name("HTTPS_PROXY").is_err());
    assert!(validate_env_name("NPM_TOKEN").is_ok());
    assert_eq!(validate_hosts(&["API.example.com".into()], false).unwrap(), vec!["api.example.com".to_string()]);
    assert!(validate_hosts(&[], true).is_err());
    assert!(validate_hosts(&["1.2.3.4".into()], true).is_err());
    let wildcard = ["*.example.com".to_string()];
    let refused = validate_hosts(&wildcard, false).unwrap_err();
    assert!(refused.0.message.contains("--allow-wildcard-credential-hosts"), "{}", refused.0.message);
    assert_eq!(validate_hosts(&wildcard, true).unwrap(), wildcard);
}

/// A placeholder replaces the variable's value in every command: it must not be one that
/// decides which programs run, what they load, or where their traffic goes.
#[test]
fn placeholders_cannot_take_over_variables_that_change_how_programs_run() {
    for name in [
        "PATH",
        "path",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "ld_audit",
        "HOME",
        "BASH_ENV",
        "PYTHONPATH",
        "NODE_OPTIONS",
        "ALL_PROXY",
        "https_proxy",
        "Http_Proxy",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "ssl_cert_file",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
    ] {
        let error = validate_env_name(name).expect_err(name);
        assert_eq!(error.0.code, ErrorCode::BadRequest, "{name}");
        assert!(error.0.message.contains("choose"), "{name}: says what to do: {}", error.0.message);
    }
    // Every variable the gateway puts in a sandbox is refused, whatever its case.
    for name in space_gateway::sandbox_env().keys() {
        assert!(validate_env_name(&name.to_ascii_lowercase()).is_err(), "{name}");
    }
    for name in ["GITHUB_TOKEN", "OPENAI_API_KEY", "PATHFINDER_KEY", "MY_LD_TOKEN"] {
        assert!(validate_env_name(name).is_ok(), "{name}");
    }
}

#[test]
fn messages_quote_at_most_a_few_hundred_bytes_of_input() {
    let huge = "x".repeat(1 << 20);
    for error in [
        validate_credential_name(&huge).unwrap_err(),
        parse_header(&format!("{huge}: {{secret}}")).unwrap_err(),
        credential_not_found(&huge),
        validate_env_name(&format!("1{huge}")).unwrap_err(),
    ] {
        assert!(error.0.message.len() < 700, "{} bytes: {}", error.0.message.len(), &error.0.message[..100]);
    }
}

/// One gateway for every session, placed or not.
impl Gateways for Gateway {
    fn gateway(&self, _: Option<&str>) -> Option<&dyn EgressControl> {
        Some(self)
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: Store,
    keys: Keyring,
    /// The server's local key (in `keys`).
    sealer: Sealer,
    /// Another key file: what it sealed the server's key cannot open.
    lost: Sealer,
    gateway: std::sync::Arc<Gateway>,
    oauth: crate::oauth::Broker,
    tenant: TenantId,
}

impl Fixture {
    async fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(&dir.path().join("space.db")).await.unwrap();
        let sealer = Sealer::local(&dir.path().join("keys/master.key")).unwrap();
        let lost = Sealer::local(&dir.path().join("keys/lost.key")).unwrap();
        let (audit, _) = tokio::sync::mpsc::unbounded_channel();
        let gateway = Gateway::new(Default::default(), audit).unwrap();
        let tenant = store.ensure_tenant("t").await.unwrap();
        let keys = Keyring::new(sealer.clone(), store.clone(), std::time::Duration::ZERO);
        let oauth = crate::oauth::Broker::new(&Default::default()).unwrap();
        Fixture { _dir: dir, store, keys, sealer, lost, gateway, oauth, tenant }
    }

    fn egress(&self) -> Egress<'_> {
        Egress { store: &self.store, keys: &self.keys, oauth: &self.oauth, gateways: &*self.gateway, ask: true }
    }

    async fn credential(&self, sealer: &Sealer, name: &str) -> CredentialRecord {
        let id = CredentialId::generate();
        let value_sealed = sealer.seal(b"ghp_secret", &credential_owner(&self.tenant, &id)).await.unwrap();
        let new = space_store::NewCredential {
            id,
            tenant_id: self.tenant.clone(),
            name: name.into(),
            hosts: vec!["api.github.com".into()],
            header: "Authorization: Bearer {secret}".into(),
            value_sealed,
            expires_at: None,
            rate_limit_per_min: None,
            placeholder_env: Some(format!("{}_TOKEN", name.to_uppercase())),
            oauth: None,
        };
        self.store.insert_credential(&new).await.unwrap().unwrap();
        self.store.credential(&self.tenant, name).await.unwrap().unwrap()
    }

    fn new_session(&self) -> NewSession {
        NewSession {
            id: SessionId::generate(),
            tenant_id: self.tenant.clone(),
            template: "busybox".into(),
            runtime: Default::default(),
            resources: Default::default(),
            env: Default::default(),
            source_snapshot: None,
            template_version: None,
            snapshot_policy: space_api::SnapshotPolicy::off(),
            lifetime: Default::default(),
            meta: Default::default(),
        }
    }

    async fn session(&self, ca_sealer: &Sealer) -> SessionId {
        let new = self.new_session();
        let id = new.id.clone();
        let ca = SessionCa::generate(&id).unwrap();
        let ca_key_sealed = ca_sealer.seal(ca.key_pem.as_bytes(), &ca_owner(&id)).await.unwrap();
        let egress = SessionEgressRecord {
            policy: NetworkPolicy::default(),
            ca_cert: Some(ca.cert_pem),
            ca_key_sealed: Some(ca_key_sealed),
        };
        self.store
            .insert_session_with_egress(
                &new,
                &NewSessionEgress { egress, grants: vec![], inherited_from: None, idempotency_key: None },
            )
            .await
            .unwrap();
        id
    }

    async fn fork(&self, parent: &SessionId) -> SessionId {
        let new = self.new_session();
        self.egress().insert_fork(parent, &new).await.unwrap();
        new.id
    }

    async fn granted(&self, session: &SessionId) -> (Vec<String>, Vec<String>) {
        let names = self.store.session_grants(session).await.unwrap().into_iter().map(|r| r.credential.name);
        let env = self.store.session(&self.tenant, session).await.unwrap().unwrap().env;
        (names.collect(), env.into_keys().collect())
    }
}

#[tokio::test]
async fn a_grant_whose_value_cannot_be_unsealed_leaves_nothing_behind() {
    let f = Fixture::new().await;
    let session = f.session(&f.sealer).await;
    let credential = f.credential(&f.lost, "gh").await;
    let err = f.egress().grant(&session, &credential).await.unwrap_err();
    assert!(err.0.message.contains("\"gh\"") && err.0.message.contains("restore"), "{}", err.0.message);
    assert_eq!(f.granted(&session).await, (vec![], vec![]), "no grant row, no placeholder");
}

#[tokio::test]
async fn a_grant_to_a_session_whose_ca_cannot_be_opened_leaves_nothing_behind() {
    let f = Fixture::new().await;
    let session = f.session(&f.lost).await;
    let credential = f.credential(&f.sealer, "gh").await;
    let err = f.egress().grant(&session, &credential).await.unwrap_err();
    assert!(err.0.message.contains("certificate authority"), "{}", err.0.message);
    assert_eq!(f.granted(&session).await, (vec![], vec![]));
    assert!(f.gateway.session_ca_cert(&session).is_none());
}

/// Another grant the key cannot open is left out, as in every push; it does not turn a
/// grant that is in effect into an error.
#[tokio::test]
async fn a_grant_beside_an_unreadable_one_succeeds() {
    let f = Fixture::new().await;
    let session = f.session(&f.sealer).await;
    let broken = f.credential(&f.lost, "old").await;
    f.store.grant(&session, &broken.credential).await.unwrap();
    let credential = f.credential(&f.sealer, "gh").await;
    f.egress().grant(&session, &credential).await.unwrap();
    let names = vec!["gh".to_string(), "old".to_string()];
    assert_eq!(f.granted(&session).await, (names, vec!["GH_TOKEN".to_string(), "OLD_TOKEN".to_string()]));
    assert!(f.gateway.session_ca_cert(&session).is_some(), "the egress was pushed");
}

/// A fork's grants follow its parent's: a revoke there reaches the forks (transitively) in
/// the store and in the gateway, but not a detached fork, nor one granted the credential
/// itself.
#[tokio::test]
async fn revoking_a_parents_grant_revokes_it_from_its_forks_unless_detached() {
    let f = Fixture::new().await;
    let parent = f.session(&f.sealer).await;
    let gh = f.credential(&f.sealer, "gh").await;
    f.egress().grant(&parent, &gh).await.unwrap();
    let child = f.fork(&parent).await;
    let grandchild = f.fork(&child).await;
    let detached = f.fork(&parent).await;
    f.store.detach_grants(&detached).await.unwrap();
    let own = f.fork(&parent).await;
    f.egress().grant(&own, &gh).await.unwrap();
    for session in [&parent, &child, &grandchild, &detached, &own] {
        assert_eq!(f.gateway.session_grants(session), Some(vec!["gh".to_string()]), "{session}");
    }

    let revoked = f.egress().revoke(&parent, &gh).await.unwrap();
    assert_eq!(revoked.len(), 3, "{revoked:?}");
    for session in [&parent, &child, &grandchild] {
        assert!(revoked.contains(session));
        assert_eq!(f.gateway.session_grants(session), Some(vec![]), "{session} keeps the grant in the gateway");
        assert_eq!(f.granted(session).await, (vec![], vec![]), "{session}: no grant row, no placeholder");
    }
    for session in [&detached, &own] {
        assert_eq!(f.gateway.session_grants(session), Some(vec!["gh".to_string()]), "{session}");
        assert_eq!(f.granted(session).await.0, vec!["gh".to_string()]);
    }
    assert!(f.egress().revoke(&parent, &gh).await.unwrap().is_empty(), "no longer granted");
}

/// The gateway gets the credential's id: what its rate limit is counted by.
#[tokio::test]
async fn the_gateway_grant_carries_the_credential_id() {
    let f = Fixture::new().await;
    let record = f.credential(&f.sealer, "gh").await;
    assert_eq!(grant_of(f.egress(), &record).await.unwrap().credential_id, record.credential.id);
}

#[tokio::test]
async fn retention_deletes_every_old_event_batch_after_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = space_store::Store::open_sqlite(&dir.path().join("space.db")).await.unwrap();
    let session = SessionId::generate();
    let event = |time| AuditEvent::allowed(session.clone(), time, "https", "h.com", 443);
    let old = 2 * AUDIT_PRUNE_BATCH as i64 + 7;
    let events: Vec<_> = (0..old).map(event).chain([event(old + 1000)]).collect();
    store.insert_audit_events(&events).await.unwrap();
    assert_eq!(prune_audit(&store, old + 500).await.unwrap(), old as u64);
    let left = store.audit_events(&session, 10).await.unwrap();
    assert_eq!(left.iter().map(|e| e.time).collect::<Vec<_>>(), vec![old + 1000]);
}
