//! The key provider at start: the key must open what the database holds sealed.
//!
//! A missing key file used to be replaced by a new key without a word. Whatever was sealed
//! under the old one then failed to open, one request at a time, and whatever was sealed
//! meanwhile could not be opened once the old key came back. So a new key is created only
//! when nothing sealed exists, and the server refuses to start when its key opens none of it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use space_keys::{KeyError, LOCAL_KEY_REF, LocalKeyFile, Sealer, key_ref_of};
use space_store::{SealedOwner, SealedValue, Store, StoreError};

use crate::egress::{ca_owner, credential_owner};

/// How much sealed data the database holds, for messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SealedCount {
    pub credentials: usize,
    pub session_cas: usize,
}

impl fmt::Display for SealedCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} credential value(s) and {} session CA key(s)", self.credentials, self.session_cas)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyCheckError {
    #[error(
        "the key file {path} is missing, but the database was set up with a key (it holds {sealed} sealed \
         with it); restore that key file to {path}, or point --key-file at it (every control replica over \
         one database uses the same key file): a new key cannot open what it sealed, so none is created"
    )]
    Missing { path: PathBuf, sealed: SealedCount },
    #[error(
        "{key} opens none of the {sealed} the database holds sealed; it is not the key they were sealed \
         with: restore that key file (or point --key-file at it)"
    )]
    WrongKey { key: String, sealed: SealedCount },
    #[error(
        "{key} is not the key this database was set up with: every control replica over one database \
         must use the same key file; copy the first replica's (its DATA_DIR/keys/master.key) and point \
         --key-file at it"
    )]
    NotTheDatabasesKey { key: String },
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("reading the sealed data: {0}")]
    Store(#[from] StoreError),
}

/// What the database's key canary is stored under in `meta`: a value sealed by the first key
/// the database was opened with, which every later key must open. Without it, replicas that
/// start over a new database before anything is sealed would each make a key of their own.
const CANARY: &str = "key_canary";
/// The owner the canary is sealed for.
const CANARY_OWNER: &str = "key-canary";

/// The sealer over the key file at `path`, checked against what `store` holds sealed.
///
/// With nothing sealed the key file is created if missing. With sealed data the key file
/// must exist and open at least one value; values it cannot open (e.g. sealed while another
/// key was in place) are logged and reported by each request that needs them. Either way the
/// key must open the database's canary, which the first key to open the database sealed.
///
/// Values sealed with a tenant's own key (BYOK) are not the local key's to open: they are
/// left out here, and the server starts without asking any tenant's KMS.
pub async fn open_sealer(path: &Path, store: &Store) -> Result<Sealer, KeyCheckError> {
    let mut values = store.sealed_values().await?;
    values.retain(|value| key_ref_of(&value.sealed).map_or(true, |key_ref| key_ref == LOCAL_KEY_REF));
    let sealed = count(&values);
    let canary = store.meta(CANARY).await?;
    let key = if values.is_empty() && canary.is_none() {
        LocalKeyFile::open_or_create(path)?
    } else {
        match LocalKeyFile::open(path) {
            Ok(key) => key,
            Err(KeyError::Missing { path }) => return Err(KeyCheckError::Missing { path, sealed }),
            Err(e) => return Err(e.into()),
        }
    };
    let sealer = Sealer::new(LOCAL_KEY_REF, Arc::new(key), std::time::Duration::ZERO)?;
    let mut opened = 0;
    let mut unreadable = Vec::new();
    for value in &values {
        match sealer.open(&value.sealed, &owner(&value.owner)).await {
            Ok(_) => opened += 1,
            // The key unwrapped the value's data key: it is the right key, the value is damaged.
            Err(e @ KeyError::Corrupt { .. }) => {
                opened += 1;
                unreadable.push((value, e));
            }
            Err(e) => unreadable.push((value, e)),
        }
    }
    if opened == 0 && !values.is_empty() {
        return Err(KeyCheckError::WrongKey { key: sealer.describe(), sealed });
    }
    for (value, e) in unreadable {
        tracing::warn!(sealed = %describe(&value.owner), error = %e, "sealed data the key cannot open");
    }
    check_canary(&sealer, store).await?;
    Ok(sealer)
}

/// The database's canary, sealed by `sealer` if the database has none yet, must open.
async fn check_canary(sealer: &Sealer, store: &Store) -> Result<(), KeyCheckError> {
    let ours = hex::encode(sealer.seal(b"space", CANARY_OWNER).await?);
    let stored = store.meta_get_or_insert(CANARY, &ours).await?;
    let opened = match hex::decode(&stored) {
        Ok(sealed) => Ok(sealer.open(&sealed, CANARY_OWNER).await),
        Err(e) => Err(e),
    };
    match opened {
        // The key unwrapped the canary's data key: it is the right key, the canary is damaged.
        Ok(Ok(_) | Err(KeyError::Corrupt { .. })) => Ok(()),
        Ok(Err(_)) | Err(_) => Err(KeyCheckError::NotTheDatabasesKey { key: sealer.describe() }),
    }
}

fn count(values: &[SealedValue]) -> SealedCount {
    let mut count = SealedCount::default();
    for value in values {
        match value.owner {
            SealedOwner::Credential { .. } => count.credentials += 1,
            SealedOwner::SessionCa { .. } => count.session_cas += 1,
            SealedOwner::SnapshotKey { .. } => {}
        }
    }
    count
}

/// The owner a value was sealed for (the associated data that binds it).
fn owner(owner: &SealedOwner) -> String {
    match owner {
        SealedOwner::Credential { tenant_id, id, .. } => credential_owner(tenant_id, id),
        SealedOwner::SessionCa { session } => ca_owner(session),
        SealedOwner::SnapshotKey { session, snapshot } => crate::durable::snapshot_key_owner(session, snapshot),
    }
}

fn describe(owner: &SealedOwner) -> String {
    match owner {
        SealedOwner::Credential { tenant_id, name, .. } => format!("credential {name:?} of tenant {tenant_id}"),
        SealedOwner::SessionCa { session } => format!("the CA key of session {session}"),
        SealedOwner::SnapshotKey { snapshot, .. } => format!("the key of snapshot {snapshot}"),
    }
}

#[cfg(test)]
mod tests {
    use space_api::{CredentialId, TenantId};
    use space_store::NewCredential;

    use super::*;

    async fn store(dir: &Path) -> Store {
        Store::open_sqlite(&dir.join("space.db")).await.unwrap()
    }

    /// Stores a credential whose value is sealed by `sealer`.
    async fn credential(store: &Store, sealer: &Sealer, name: &str) {
        let tenant: TenantId = store.ensure_tenant("t").await.unwrap();
        let id = CredentialId::generate();
        let value_sealed = sealer.seal(b"ghp_secret", &credential_owner(&tenant, &id)).await.unwrap();
        let new = NewCredential {
            id,
            tenant_id: tenant,
            name: name.into(),
            hosts: vec!["api.github.com".into()],
            header: "Authorization: Bearer {secret}".into(),
            value_sealed,
            expires_at: None,
            rate_limit_per_min: None,
            placeholder_env: None,
            oauth: None,
        };
        store.insert_credential(&new).await.unwrap().unwrap();
    }

    /// Two replicas started over a new database before anything is sealed: the second, with a
    /// key of its own, is refused; with the first's key it starts.
    #[tokio::test]
    async fn a_second_replica_with_another_key_is_refused_even_before_anything_is_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let (first, second) = (dir.path().join("a/master.key"), dir.path().join("b/master.key"));
        open_sealer(&first, &store).await.unwrap();
        assert!(store.sealed_values().await.unwrap().is_empty(), "nothing sealed but the canary");
        // Without a key file, none is made.
        let err = open_sealer(&second, &store).await.unwrap_err();
        assert!(matches!(err, KeyCheckError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("every control replica over one database"), "{err}");
        assert!(!second.exists());
        // A key of its own (made over another database) does not open the canary.
        let other = tempfile::tempdir().unwrap();
        open_sealer(&second, &self::store(other.path()).await).await.unwrap();
        let err = open_sealer(&second, &store).await.unwrap_err();
        assert!(matches!(err, KeyCheckError::NotTheDatabasesKey { .. }), "{err}");
        assert!(err.to_string().contains("--key-file"), "{err}");
        open_sealer(&first, &store).await.unwrap();
    }

    #[tokio::test]
    async fn a_fresh_data_dir_gets_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/master.key");
        let store = store(dir.path()).await;
        let sealer = open_sealer(&path, &store).await.unwrap();
        assert!(path.exists());
        credential(&store, &sealer, "gh").await;
        // The same key again at the next start.
        open_sealer(&path, &store).await.unwrap();
    }

    #[tokio::test]
    async fn a_missing_key_file_is_not_replaced_when_data_is_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/master.key");
        let store = store(dir.path()).await;
        let sealer = open_sealer(&path, &store).await.unwrap();
        credential(&store, &sealer, "gh").await;
        let original = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();

        let err = open_sealer(&path, &store).await.unwrap_err();
        assert!(matches!(err, KeyCheckError::Missing { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("1 credential value(s)") && message.contains("restore"), "{message}");
        assert!(!path.exists(), "no new key was created");

        // Restoring the original brings everything back.
        std::fs::write(&path, original).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        open_sealer(&path, &store).await.unwrap();
    }

    #[tokio::test]
    async fn another_key_file_is_refused_when_it_opens_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/master.key");
        let store = store(dir.path()).await;
        let sealer = open_sealer(&path, &store).await.unwrap();
        credential(&store, &sealer, "gh").await;
        std::fs::remove_file(&path).unwrap();
        LocalKeyFile::open_or_create(&path).unwrap();

        let err = open_sealer(&path, &store).await.unwrap_err();
        assert!(matches!(err, KeyCheckError::WrongKey { .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()) && message.contains("sealed with"), "{message}");
    }

    /// Data sealed under two keys (as the old silent replacement left it): the key that opens
    /// some of it is accepted, so the rest can be re-created through the API.
    #[tokio::test]
    async fn a_key_that_opens_part_of_the_data_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/master.key");
        let store = store(dir.path()).await;
        let sealer = open_sealer(&path, &store).await.unwrap();
        credential(&store, &sealer, "gh").await;
        let other = Sealer::local(&dir.path().join("other.key")).unwrap();
        credential(&store, &other, "npm").await;
        open_sealer(&path, &store).await.unwrap();
    }
}
