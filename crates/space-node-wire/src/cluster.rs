//! The cluster's certificate authority and the identities it issues.
//!
//! `space cluster init` makes the authority once; every control replica and node then gets
//! an identity signed by it. The role is in the certificate's extended key usage: a node's
//! certificate is for server authentication only (control planes connect to nodes), a
//! control replica's for client authentication only. TLS verification enforces it, so a
//! node's key cannot drive another node, nor a control replica's key pose as a node.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SerialNumber,
};

use crate::WireError;

/// How long the authority is valid.
const CA_DAYS: i64 = 3650;
/// How long an identity is valid before it must be issued again.
const IDENTITY_DAYS: i64 = 825;

/// What a certificate lets its holder be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A control replica: connects to nodes.
    Control,
    /// A node: is connected to.
    Node,
}

/// A certificate chain (the holder's, then the authority's) and its private key, in PEM.
#[derive(Clone)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

impl Identity {
    /// Reads `NAME.pem` and `NAME.key` from `dir`.
    pub fn load(dir: &Path, name: &str) -> Result<Identity, WireError> {
        let (cert, key) = identity_paths(dir, name);
        Ok(Identity { cert_pem: read(&cert)?, key_pem: read(&key)? })
    }

    /// Writes `NAME.pem` and `NAME.key` (readable by the owner only) into `dir`; refuses to
    /// replace either.
    pub fn write(&self, dir: &Path, name: &str) -> Result<(), WireError> {
        let (cert, key) = identity_paths(dir, name);
        write_new(&key, &self.key_pem, "a private key")?;
        write_new(&cert, &self.cert_pem, "a certificate")
    }
}

/// The cluster's certificate authority.
#[derive(Clone)]
pub struct ClusterCa {
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

/// The authority's certificate in `dir`: what every member trusts.
pub fn trust_path(dir: &Path) -> PathBuf {
    dir.join("ca.pem")
}

impl ClusterCa {
    /// A new authority named after `cluster`: ECDSA P-256, may sign identities only.
    pub fn generate(cluster: &str) -> Result<ClusterCa, WireError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, format!("space cluster {cluster} CA"));
        params.distinguished_name.push(DnType::OrganizationName, "space");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params, CA_DAYS);
        let cert = params.self_signed(&key)?;
        Ok(ClusterCa { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// Reads `ca.pem` and `ca.key` from `dir`.
    pub fn load(dir: &Path) -> Result<ClusterCa, WireError> {
        Ok(ClusterCa { cert_pem: read(&trust_path(dir))?, key_pem: read(&dir.join("ca.key"))? })
    }

    /// Writes `ca.pem` and `ca.key` into `dir` (made if missing); refuses to replace an
    /// authority already there, whose members would all stop being trusted.
    pub fn write(&self, dir: &Path) -> Result<(), WireError> {
        std::fs::create_dir_all(dir).map_err(WireError::file(dir))?;
        write_new(&dir.join("ca.key"), &self.key_pem, "a cluster authority's key")?;
        write_new(&trust_path(dir), &self.cert_pem, "a cluster authority")
    }

    /// An identity for `name` in `role`. A node's certificate names `hosts` (addresses or
    /// DNS names control planes reach it by); a control replica's names only itself.
    pub fn issue(&self, role: Role, name: &str, hosts: &[String]) -> Result<Identity, WireError> {
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, KeyPair::from_pem(&self.key_pem)?)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(hosts.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.distinguished_name.push(DnType::OrganizationalUnitName, role.unit());
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![role.purpose()];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, IDENTITY_DAYS);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Identity { cert_pem: format!("{}{}", cert.pem(), self.cert_pem), key_pem: key.serialize_pem() })
    }
}

impl Role {
    fn unit(self) -> &'static str {
        match self {
            Role::Control => "control",
            Role::Node => "node",
        }
    }

    fn purpose(self) -> ExtendedKeyUsagePurpose {
        match self {
            Role::Control => ExtendedKeyUsagePurpose::ClientAuth,
            Role::Node => ExtendedKeyUsagePurpose::ServerAuth,
        }
    }
}

fn set_validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    // A day's slack for members whose clocks run a little behind.
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(days);
    let mut serial: [u8; 16] = rand::random();
    serial[0] &= 0x7f; // positive
    params.serial_number = Some(SerialNumber::from_slice(&serial));
}

fn identity_paths(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")))
}

fn read(path: &Path) -> Result<String, WireError> {
    std::fs::read_to_string(path).map_err(WireError::file(path))
}

fn write_new(path: &Path, contents: &str, what: &'static str) -> Result<(), WireError> {
    let mut file = match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(WireError::Exists { what, path: path.to_owned() });
        }
        Err(e) => return Err(WireError::File { path: path.to_owned(), source: e }),
    };
    file.write_all(contents.as_bytes()).map_err(WireError::file(path))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn an_authority_and_identities_survive_a_round_trip_through_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::generate("test").unwrap();
        ca.write(dir.path()).unwrap();
        let node = ca.issue(Role::Node, "node-a", &["127.0.0.1".into()]).unwrap();
        node.write(dir.path(), "node-a").unwrap();

        let loaded = ClusterCa::load(dir.path()).unwrap();
        assert_eq!(loaded.cert_pem, ca.cert_pem);
        assert_eq!(Identity::load(dir.path(), "node-a").unwrap().cert_pem, node.cert_pem);
        for key in ["ca.key", "node-a.key"] {
            let mode = std::fs::metadata(dir.path().join(key)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }
    }

    #[test]
    fn an_existing_authority_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        ClusterCa::generate("one").unwrap().write(dir.path()).unwrap();
        let before = std::fs::read_to_string(dir.path().join("ca.key")).unwrap();
        let err = ClusterCa::generate("two").unwrap().write(dir.path()).unwrap_err();
        assert!(matches!(err, WireError::Exists { .. }), "{err:?}");
        assert_eq!(std::fs::read_to_string(dir.path().join("ca.key")).unwrap(), before);
    }
}
