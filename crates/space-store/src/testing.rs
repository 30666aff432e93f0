//! For tests that run against PostgreSQL: the server a test script started, and a database of
//! the test's own on it.

use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::Connection;

/// The environment variable that names a PostgreSQL server to test against (a URL whose
/// database the tests may create others beside).
pub const POSTGRES_URL_VAR: &str = "SPACE_TEST_POSTGRES_URL";

/// The server `SPACE_TEST_POSTGRES_URL` names, if set.
pub fn postgres_server() -> Option<String> {
    std::env::var(POSTGRES_URL_VAR).ok().filter(|url| !url.is_empty())
}

/// Creates a new, empty database on `server` and returns its URL. Its name is unique to this
/// process and call, so tests running at once, and runs one after another, never share one.
/// Nothing drops it: the server is the test script's, and goes with its data.
pub async fn create_database(server: &str) -> Result<String, sqlx::Error> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let name = format!("test_{}_{}_{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let mut admin = sqlx::PgConnection::connect(server).await?;
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await?;
    admin.close().await?;
    Ok(with_database(server, &name))
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let root = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{root}/{name}?{query}"),
        None => format!("{root}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn a_database_url_gets_the_new_name_and_keeps_its_options() {
        assert_eq!(
            with_database("postgres://u@127.0.0.1:5432/postgres?sslmode=disable", "t1"),
            "postgres://u@127.0.0.1:5432/t1?sslmode=disable"
        );
        assert_eq!(with_database("postgres://u@h:1", "t2"), "postgres://u@h:1/t2");
        assert_eq!(with_database("postgres://u@h/db", "t3"), "postgres://u@h/t3");
    }
}
