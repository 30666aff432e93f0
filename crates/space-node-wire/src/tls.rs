//! TLS configurations for both ends, from a cluster identity and the cluster authority.
//! The webpki verifiers check the peer's chain to the authority and its extended key usage,
//! which is how a certificate's role is enforced ([`crate::cluster`]).

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::WireError;
use crate::cluster::Identity;

const ALPN: &[u8] = b"http/1.1";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn pem(what: &'static str, source: std::io::Error) -> WireError {
    WireError::Pem { what, source: Some(source) }
}

fn chain(identity: &Identity) -> Result<Vec<CertificateDer<'static>>, WireError> {
    let certs = rustls_pemfile::certs(&mut identity.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem("the identity's certificate", e))?;
    if certs.is_empty() {
        return Err(WireError::Pem { what: "the identity's certificate", source: None });
    }
    Ok(certs)
}

fn key(identity: &Identity) -> Result<PrivateKeyDer<'static>, WireError> {
    rustls_pemfile::private_key(&mut identity.key_pem.as_bytes())
        .map_err(|e| pem("the identity's key", e))?
        .ok_or(WireError::Pem { what: "the identity's key", source: None })
}

fn roots(ca_pem: &str) -> Result<Arc<RootCertStore>, WireError> {
    let mut roots = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.map_err(|e| pem("the cluster authority", e))?)?;
    }
    if roots.is_empty() {
        return Err(WireError::Pem { what: "the cluster authority", source: None });
    }
    Ok(Arc::new(roots))
}

/// A node's end: presents `identity`, and accepts only clients whose certificate the
/// authority `ca_pem` signed for client authentication.
pub fn server_config(identity: &Identity, ca_pem: &str) -> Result<Arc<ServerConfig>, WireError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider()).build()?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain(identity)?, key(identity)?)?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Arc::new(config))
}

/// A control replica's end: presents `identity`, and trusts only nodes whose certificate the
/// authority `ca_pem` signed for server authentication.
pub fn client_config(identity: &Identity, ca_pem: &str) -> Result<Arc<ClientConfig>, WireError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(chain(identity)?, key(identity)?)?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Arc::new(config))
}
