//! The per-session certificate authority and the leaf certificates it signs for the hosts the
//! gateway intercepts. Leaves are made on demand and cached per (session, host); a new CA for
//! the session (its certificate changes) makes new leaves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SerialNumber,
};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use space_api::SessionId;

use crate::{GatewayError, SessionCa, certificates_from_pem};

/// How long a leaf is used before a fresh one is made (its validity is longer).
const LEAF_REFRESH: Duration = Duration::from_secs(7 * 24 * 3600);
/// Entries kept before the cache is emptied (a crude bound; leaves are cheap to remake).
const MAX_LEAVES: usize = 4096;

fn ca_error(e: impl std::fmt::Display) -> GatewayError {
    GatewayError::Ca(e.to_string())
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // positive
    SerialNumber::from_slice(&bytes)
}

impl SessionCa {
    /// A new CA for `session`: ECDSA P-256, valid ten years. Only its certificate may enter a
    /// sandbox.
    pub fn generate(session: &SessionId) -> Result<SessionCa, GatewayError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(ca_error)?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, format!("space session {session} CA"));
        params.distinguished_name.push(DnType::OrganizationName, "space");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(3650);
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key).map_err(ca_error)?;
        Ok(SessionCa { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// A leaf certificate for `host` signed by `ca`, with the chain (leaf, CA) and its key.
pub(crate) fn issue_leaf(
    ca: &SessionCa,
    host: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), GatewayError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(ca_error)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(ca_error)?;
    let ca_der = certificates_from_pem(ca.cert_pem.as_bytes())?.into_iter().next().map(CertificateDer::from);
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(ca_error)?;
    // `new` makes an IP SAN for an address and a DNS SAN otherwise.
    let mut params = CertificateParams::new(vec![host.to_string()]).map_err(ca_error)?;
    params.distinguished_name.push(DnType::CommonName, host);
    params.is_ca = IsCa::NoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(30);
    params.serial_number = Some(random_serial());
    let cert = params.signed_by(&key, &issuer).map_err(ca_error)?;
    let mut chain = vec![cert.der().clone()];
    chain.extend(ca_der);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok((chain, key))
}

struct Leaf {
    ca_cert_pem: Arc<str>,
    config: Arc<ServerConfig>,
    made: Instant,
}

/// TLS server configurations (leaf certificate, ALPN http/1.1) per (session, host).
pub(crate) struct LeafCache {
    provider: Arc<rustls::crypto::CryptoProvider>,
    leaves: Mutex<HashMap<(SessionId, String), Leaf>>,
}

impl LeafCache {
    pub(crate) fn new(provider: Arc<rustls::crypto::CryptoProvider>) -> LeafCache {
        LeafCache { provider, leaves: Mutex::new(HashMap::new()) }
    }

    /// The server configuration presenting a certificate for `host` signed by `ca`.
    pub(crate) fn server_config(
        &self,
        session: &SessionId,
        ca: &SessionCa,
        host: &str,
    ) -> Result<Arc<ServerConfig>, GatewayError> {
        let key = (session.clone(), host.to_string());
        if let Ok(leaves) = self.leaves.lock()
            && let Some(leaf) = leaves.get(&key)
            && *leaf.ca_cert_pem == *ca.cert_pem
            && leaf.made.elapsed() < LEAF_REFRESH
        {
            return Ok(leaf.config.clone());
        }
        let (chain, private_key) = issue_leaf(ca, host)?;
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(ca_error)?
            .with_no_client_auth()
            .with_single_cert(chain, private_key)
            .map_err(ca_error)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if let Ok(mut leaves) = self.leaves.lock() {
            if leaves.len() >= MAX_LEAVES {
                leaves.clear();
            }
            leaves.insert(
                key,
                Leaf { ca_cert_pem: ca.cert_pem.as_str().into(), config: config.clone(), made: Instant::now() },
            );
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn leaf_chain_verifies_against_the_session_ca() {
        let session = SessionId::generate();
        let ca = SessionCa::generate(&session).unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem.contains("PRIVATE KEY"));
        // ECDSA P-256, the session's id in its name (docs/egress.md).
        assert_eq!(KeyPair::from_pem(&ca.key_pem).unwrap().algorithm(), &PKCS_ECDSA_P256_SHA256);
        let der: CertificateDer = certificates_from_pem(ca.cert_pem.as_bytes()).unwrap().remove(0).into();
        let common_name = format!("space session {session} CA");
        assert!(der.windows(common_name.len()).any(|w| w == common_name.as_bytes()), "its name is not in it");
        let (chain, _key) = issue_leaf(&ca, "api.test").unwrap();
        assert_eq!(chain.len(), 2);

        let mut roots = rustls::RootCertStore::empty();
        roots.add(chain[1].clone()).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build().unwrap();
        let now = rustls::pki_types::UnixTime::now();
        let name = rustls::pki_types::ServerName::try_from("api.test").unwrap();
        verifier.verify_server_cert(&chain[0], &chain[1..], &name, &[], now).unwrap();
        let other = rustls::pki_types::ServerName::try_from("other.test").unwrap();
        assert!(verifier.verify_server_cert(&chain[0], &chain[1..], &other, &[], now).is_err());

        // Another session's CA does not vouch for it.
        let stranger = SessionCa::generate(&SessionId::generate()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(certificates_from_pem(stranger.cert_pem.as_bytes()).unwrap().remove(0).into()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        )
        .build()
        .unwrap();
        assert!(verifier.verify_server_cert(&chain[0], &[], &name, &[], now).is_err());
    }

    #[test]
    fn leaves_are_cached_per_session_host_and_ca() {
        let session = SessionId::generate();
        let ca = SessionCa::generate(&session).unwrap();
        let cache = LeafCache::new(Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        let a = cache.server_config(&session, &ca, "api.test").unwrap();
        let b = cache.server_config(&session, &ca, "api.test").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let rotated = SessionCa::generate(&session).unwrap();
        let c = cache.server_config(&session, &rotated, "api.test").unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(c.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
