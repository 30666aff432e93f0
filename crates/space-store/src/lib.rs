//! Durable state of the control plane.
//!
//! The control plane is stateless: everything it knows lives here, in one of two backends
//! that run the same statements (sqlx's `Any` driver): SQLite (WAL), the embedded default,
//! and PostgreSQL, which control replicas share (see docs/control-plane.md). Only the
//! schema's spelling (`migrations/sqlite`, `migrations/postgres`) and how a write
//! transaction excludes the others ([`Backend`]) differ.

mod audit;
mod auth;
mod credentials;
mod export_chains;
mod idempotency;
mod leases;
mod metrics;
mod network;
mod nodes;
mod oauth;
mod operations;
mod ports;
mod quotas;
mod sealed;
mod sessions;
mod snapshots;
mod templates;
mod tenant_keys;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions, Executor};

pub use auth::{KeyRecord, LAST_USED_RESOLUTION_MS, NewKey, RevokeRefused};
pub use credentials::{CredentialChange, CredentialRecord, NewCredential, PlaceholderEnv};
pub use export_chains::ChainLink;
pub use idempotency::IdempotencyBegin;
pub use leases::replica_lease;
pub use network::{NewSessionEgress, SessionEgressRecord};
pub use nodes::{NodeHeartbeat, NodeRecord};
pub use oauth::{OAuthLogin, OAuthSettings, OAuthTokenState};
pub use operations::{NewOperation, OperationKind, OperationRecord};
pub use ports::PortRecord;
pub use quotas::{Demand, QuotaExceeded, QuotaLimit, counts_sandbox, counts_session};
pub use sealed::{SealedOwner, SealedValue};
pub use sessions::{NewSandbox, NewSession, SandboxRecord, SessionFilter, SessionMeta, SessionRecord};
pub use snapshots::{NewSnapshot, SnapshotPlace};
pub use tenant_keys::TenantKeyRecord;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// A write that would take over a row someone else owns.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The write would take its tenant over a quota; nothing was written.
    #[error("{0}")]
    QuotaExceeded(QuotaExceeded),
    #[error("creating the database {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", not_private_message(.0))]
    NotPrivate(Vec<(PathBuf, u32)>),
}

impl StoreError {
    /// Whether the database could not be reached, or was too busy to answer in time: the
    /// same request may succeed later, unlike one the database refused.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Db(e) => unavailable(e),
            _ => false,
        }
    }
}

/// See [`StoreError::is_unavailable`]: connections that failed, broke off mid-message (a
/// protocol error: a server or proxy that closed the connection during the handshake) or
/// could not be had, SQLite's busy and locked (after its busy timeout), and PostgreSQL's
/// connection exceptions (SQLSTATE class 08), shutdowns and refusals to take a connection
/// (57P01-57P03, 53300).
fn unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                let code = pg.code();
                code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
            } else if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // The primary result code is the low byte of the extended one.
                let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0);
                matches!(code & 0xff, SQLITE_BUSY | SQLITE_LOCKED)
            } else {
                false
            }
        }
        _ => false,
    }
}

const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;

fn not_private_message(files: &[(PathBuf, u32)]) -> String {
    let list = files.iter().map(|(p, mode)| format!("{} (mode {mode:04o})", p.display())).collect::<Vec<_>>();
    let paths = files.iter().map(|(p, _)| p.display().to_string()).collect::<Vec<_>>();
    format!(
        "group or others may access {}, which holds the server's state (credentials' sealed values, \
         sessions' environments, idempotency records): make it private to the server with `chmod 600 {}`",
        list.join(", "),
        paths.join(" ")
    )
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Which database a [`Store`] keeps its state in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// An advisory lock every PostgreSQL write transaction takes first (any number: it names
/// the lock). Holding it makes write transactions one at a time, as SQLite's `BEGIN
/// IMMEDIATE` does, so the checks they make before writing (quotas, the last admin key)
/// hold across replicas. Single statements do not take it: each is atomic on its own.
const PG_WRITE_LOCK: i64 = 0x7370_6163_6501;

/// Handle to the database; cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    /// Readers.
    pool: AnyPool,
    /// Writers: SQLite's only write connection; for PostgreSQL the same pool as `pool`.
    writer: AnyPool,
    backend: Backend,
    /// The control replica this handle acts for: it names the operations it claims, the
    /// leases it holds and the idempotent requests it begins ([`Store::as_replica`]).
    replica: Arc<str>,
}

/// The replica of a handle that was never given one: `space serve`, the only one over its
/// database.
pub const DEFAULT_REPLICA: &str = "local";

/// Unix time in milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Each SQLite connection's settings: WAL (readers beside the writer), fsync at checkpoints
/// only, foreign keys enforced, and a writer that waits for the lock rather than failing.
const SQLITE_PRAGMAS: &str =
    "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000;";

impl Store {
    /// Opens the database `url` names: `postgres://…` (or `postgresql://…`), or
    /// `sqlite://PATH` / a plain path for SQLite.
    pub async fn open(url: &str) -> Result<Store> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Store::open_postgres(url).await
        } else {
            Store::open_sqlite(Path::new(url.strip_prefix("sqlite://").unwrap_or(url))).await
        }
    }

    /// Opens (creating if needed, mode 0600) the SQLite database at `path` and applies
    /// migrations. Refuses a database whose files group or others may access.
    pub async fn open_sqlite(path: &Path) -> Result<Store> {
        sqlx::any::install_default_drivers();
        create_private(path)?;
        let url = sqlx::sqlite::SqliteConnectOptions::new().filename(path).to_url_lossy();
        let options = AnyConnectOptions::from_url(&url)?;
        // A connection to a local file cannot drop: the ping sqlx sends before handing one out
        // would be a round trip to the connection's worker thread before every query.
        let configure = AnyPoolOptions::new().test_before_acquire(false).after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(SQLITE_PRAGMAS).await?;
                Ok(())
            })
        });
        // SQLite has one writer at a time. Writers that contend for its lock back off by
        // sleeping (1 ms and up), which dominated create latency; one write connection makes
        // them queue in the pool instead. Reads (WAL) run beside it on their own connections.
        let writer = configure.clone().max_connections(1).connect_with(options.clone()).await?;
        sqlx::migrate!("./migrations/sqlite").run(&writer).await?;
        let pool = configure.max_connections(8).connect_with(options).await?;
        Ok(Store { pool, writer, backend: Backend::Sqlite, replica: DEFAULT_REPLICA.into() })
    }

    /// Connects to the PostgreSQL database at `url` and applies migrations (one replica at a
    /// time: the migrator holds a lock while it runs).
    pub async fn open_postgres(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        // A request waits this long for a connection while the server is unreachable, then
        // fails as unavailable (503) instead of hanging.
        let pool = AnyPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect(url)
            .await?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        Ok(Store { writer: pool.clone(), pool, backend: Backend::Postgres, replica: DEFAULT_REPLICA.into() })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// This handle acting for the control replica `name` (unique among the replicas that
    /// share the database; a handle that was never given one acts for [`DEFAULT_REPLICA`]).
    pub fn as_replica(mut self, name: &str) -> Store {
        self.replica = name.into();
        self
    }

    /// The replica this handle acts for.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    pub async fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT value FROM meta WHERE key = $1").bind(key).fetch_optional(&self.pool).await?)
    }

    /// Sets `key` unless it is already set; returns the stored value.
    pub async fn meta_get_or_insert(&self, key: &str, value: &str) -> Result<String> {
        sqlx::query("INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
            .bind(key)
            .bind(value)
            .execute(&self.writer)
            .await?;
        self.meta(key).await?.ok_or_else(|| StoreError::Corrupt(format!("meta {key} vanished")))
    }

    /// A write transaction that takes the write lock up front. (SQLite: a deferred
    /// transaction that reads first and writes later fails at once with SQLITE_BUSY when
    /// another writer committed in between; the busy timeout does not apply to that upgrade.
    /// PostgreSQL: see [`PG_WRITE_LOCK`].)
    async fn write_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>> {
        match self.backend {
            Backend::Sqlite => Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?),
            Backend::Postgres => {
                let mut tx = self.writer.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(PG_WRITE_LOCK).execute(&mut *tx).await?;
                Ok(tx)
            }
        }
    }

    pub async fn close(&self) {
        self.pool.close().await;
        self.writer.close().await;
    }
}

/// The database and the `-wal` and `-shm` files beside it.
fn database_files(path: &Path) -> [PathBuf; 3] {
    let with = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    [path.to_owned(), with("-wal"), with("-shm")]
}

/// Creates the database file, mode 0600, unless it exists, and checks that none of its files
/// is open to group or others (as the key file is checked). Created here because SQLite would
/// create it with the umask's mode (usually 0644); the `-wal` and `-shm` files it creates
/// later take the mode of the database file.
fn create_private(path: &Path) -> Result<()> {
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(StoreError::Create { path: path.to_owned(), source }),
    }
    let open: Vec<(PathBuf, u32)> = database_files(path)
        .into_iter()
        .filter_map(|file| {
            let mode = std::fs::metadata(&file).ok()?.permissions().mode() & 0o777;
            (mode & 0o077 != 0).then_some((file, mode))
        })
        .collect();
    if open.is_empty() { Ok(()) } else { Err(StoreError::NotPrivate(open)) }
}

fn parse<T: FromStr>(what: &str, value: &str) -> Result<T> {
    value.parse().map_err(|_| StoreError::Corrupt(format!("{what}: {value:?}")))
}

/// The store a test runs against: SQLite in a temporary directory, or, when
/// `SPACE_TEST_POSTGRES_URL` names a PostgreSQL server, a new database on it
/// (`scripts/with-postgres.sh` starts one and runs the store's tests under it).
#[cfg(test)]
pub(crate) async fn test_store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = match testing::postgres_server() {
        Some(server) => Store::open_postgres(&testing::create_database(&server).await.unwrap()).await.unwrap(),
        None => Store::open_sqlite(&dir.path().join("space.db")).await.unwrap(),
    };
    (store, dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[tokio::test]
    async fn database_files_are_private_to_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("space.db");
        let store = Store::open_sqlite(&path).await.unwrap();
        store.ensure_tenant("t").await.unwrap();
        let [db, wal, shm] = database_files(&path);
        for file in [&db, &wal, &shm] {
            assert_eq!(mode(file), 0o600, "{}", file.display());
        }
        store.close().await;

        // A database left open to others (e.g. created by an older version) is refused, with
        // the command that fixes it.
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Store::open_sqlite(&path).await.unwrap_err().to_string();
        assert!(err.contains("mode 0644") && err.contains(&format!("chmod 600 {}", db.display())), "{err}");
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Created if gone, never truncated: an emptied WAL beside a `-shm` that still counts its
        // frames is a short read (SQLITE_IOERR_SHORT_READ), not what this checks.
        std::fs::OpenOptions::new().create(true).append(true).open(&wal).unwrap();
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = Store::open_sqlite(&path).await.unwrap_err().to_string();
        assert!(err.contains(&format!("{}-wal (mode 0640)", db.display())), "{err}");
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o600)).unwrap();
        Store::open_sqlite(&path).await.unwrap().close().await;
    }

    /// A PostgreSQL URL with `sslmode=verify-full` checks the server's certificate against
    /// its `sslrootcert`: a server whose certificate another CA signed is refused. On the
    /// PostgreSQL pass only (scripts/with-postgres.sh, whose server takes TLS connections
    /// only and names a second CA); SQLite has no connection to secure.
    #[tokio::test]
    async fn a_postgres_server_whose_certificate_the_url_does_not_trust_is_refused() {
        let (Some(server), Ok(other_ca)) = (testing::postgres_server(), std::env::var("SPACE_TEST_POSTGRES_OTHER_CA"))
        else {
            return;
        };
        let (before, after) = server.split_once("sslrootcert=").expect("the test server's URL names its CA");
        let rest = after.split_once('&').map(|(_, rest)| format!("&{rest}")).unwrap_or_default();
        let err = Store::open_postgres(&format!("{before}sslrootcert={other_ca}{rest}")).await.unwrap_err();
        // rustls's verdict, as sqlx reports it (an I/O error of kind InvalidData).
        assert!(matches!(&err, StoreError::Db(sqlx::Error::Io(_) | sqlx::Error::Tls(_))), "{err:?}");
        assert!(err.to_string().contains("invalid peer certificate: UnknownIssuer"), "{err}");
        // The right CA still connects.
        Store::open_postgres(&server).await.unwrap().close().await;
    }

    /// Keys from before they had ids get one from their hash, and their tenant's name.
    #[tokio::test]
    async fn keys_made_before_ids_get_one_from_their_hash() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("migrations");
        std::fs::create_dir(&old).unwrap();
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
        for entry in std::fs::read_dir(&source).unwrap() {
            let name = entry.unwrap().file_name();
            if name.to_string_lossy().as_ref() < "0012" {
                std::fs::copy(source.join(&name), old.join(&name)).unwrap();
            }
        }
        let path = dir.path().join("space.db");
        let options = SqliteConnectOptions::from_str("sqlite:").unwrap().filename(&path).create_if_missing(true);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path()).await.unwrap().run(&pool).await.unwrap();
        sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ('ten_aaaaaaaaaaaaaaaaaaaa', 'admin', 0)")
            .execute(&pool)
            .await
            .unwrap();
        let hash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        sqlx::query("INSERT INTO api_keys (hash, tenant_id, admin, created_at) VALUES ($1, 'ten_aaaaaaaaaaaaaaaaaaaa', TRUE, 5)")
            .bind(hash)
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

        let store = Store::open_sqlite(&path).await.unwrap();
        let key = store.find_key(hash).await.unwrap().unwrap();
        assert_eq!((key.id.as_str(), key.name.as_deref()), ("key_0123456789abcdef0123", Some("admin")));
        assert_eq!((key.created_at, key.revoked_at, key.tenant.as_str()), (5, None, "admin"));
    }

    /// Records of the plain-hash era (fingerprints that are SHA-256 of the body, plaintext
    /// API keys in responses) do not survive the upgrade.
    #[tokio::test]
    async fn upgrading_drops_idempotency_records_made_before_keyed_fingerprints() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("migrations");
        std::fs::create_dir(&old).unwrap();
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
        for name in
            ["0001_init.sql", "0002_snapshots.sql", "0003_lifetime.sql", "0004_egress.sql", "0005_audit_time.sql"]
        {
            std::fs::copy(source.join(name), old.join(name)).unwrap();
        }
        let path = dir.path().join("space.db");
        let options = SqliteConnectOptions::from_str("sqlite:").unwrap().filename(&path).create_if_missing(true);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path()).await.unwrap().run(&pool).await.unwrap();
        sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ('ten_1', 'admin', 0)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO idempotency (tenant_id, key, fingerprint, status, body, created_at)
             VALUES ('ten_1', 'k', 'plain-sha256', 201, '{\"key\":\"sk_secret\"}', 0)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

        let store = Store::open_sqlite(&path).await.unwrap();
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idempotency").fetch_one(&store.pool).await.unwrap();
        assert_eq!(left, 0);
    }
}
