//! A database that cannot answer: the API says so (503 `database_unavailable`, with
//! `Retry-After`) instead of failing as an internal error or hanging, changes nothing, and
//! serves again once the database is back.
//!
//! How the database goes away depends on the backend the tests run on. SQLite: another
//! connection holds the database's exclusive lock, so the server's writes find it busy (after
//! its busy timeout). PostgreSQL: the server reaches its database through a TCP proxy of the
//! test's, which drops every connection and refuses new ones, as a network outage would.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use sqlx::Connection;
use tokio::sync::watch;

use crate::harness::{Server, assert_error};

#[tokio::test]
async fn a_database_that_cannot_answer_gets_503_with_retry_after_and_the_api_recovers() {
    let server = Server::start().await;
    let (status, before) = server.call("GET", "/v1/sessions", None).await;
    assert_eq!(status, 200, "{before}");

    let outage = Outage::begin(&server).await;
    let (status, body, headers) = server.send(&server.admin, "POST", "/v1/sessions", Some("{}".into()), &[]).await;
    assert_error(&(status, body.clone()), 503, "database_unavailable");
    assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("2"), "{headers:?}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("retry in a few seconds"), "{message}");
    outage.end().await;

    // Nothing was made by the refused create, and the same call now works.
    let (status, after) = server.call("GET", "/v1/sessions", None).await;
    assert_eq!((status, &after["sessions"]), (200, &before["sessions"]), "{after}");
    let created = server.session().await;
    assert_eq!(server.get(&created).await["state"], "running");
}

/// The database made unreachable for the server, until [`Outage::end`].
enum Outage {
    /// An open `BEGIN EXCLUSIVE` on the server's SQLite database.
    Locked(sqlx::SqliteConnection),
    /// The server's PostgreSQL proxy, cut.
    Cut(Arc<Proxy>),
}

impl Outage {
    async fn begin(server: &Server) -> Outage {
        match proxy_of(server.data_dir()) {
            Some(proxy) => {
                proxy.cut(true);
                Outage::Cut(proxy)
            }
            None => {
                let path = server.data_dir().join("space.db");
                let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                    .await
                    .expect("a connection to the server's database");
                sqlx::query("BEGIN EXCLUSIVE").execute(&mut conn).await.expect("the exclusive lock");
                Outage::Locked(conn)
            }
        }
    }

    async fn end(self) {
        match self {
            Outage::Cut(proxy) => proxy.cut(false),
            Outage::Locked(mut conn) => {
                sqlx::query("ROLLBACK").execute(&mut conn).await.expect("releasing the lock");
                conn.close().await.expect("closing the connection");
            }
        }
    }
}

/// A TCP proxy in front of a PostgreSQL server, on a thread of its own, so it outlives the
/// runtimes of the servers that use it.
pub struct Proxy {
    pub addr: SocketAddr,
    cut: watch::Sender<bool>,
}

impl Proxy {
    /// While cut, every connection through it is dropped and new ones are closed at once.
    fn cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    fn start(target: SocketAddr) -> Arc<Proxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the proxy's address");
        let (cut, watching) = watch::channel(false);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                // Registered with the reactor of this thread's runtime, so made inside it.
                let listener = tokio::net::TcpListener::from_std(listener).expect("the listener");
                serve(listener, target, watching).await;
            });
        });
        Arc::new(Proxy { addr, cut })
    }
}

async fn serve(listener: tokio::net::TcpListener, target: SocketAddr, cut: watch::Receiver<bool>) {
    while let Ok((mut client, _)) = listener.accept().await {
        if *cut.borrow() {
            continue; // dropped: closed at once
        }
        let mut cut = cut.clone();
        tokio::spawn(async move {
            let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await else { return };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                _ = cut.wait_for(|cut| *cut) => {}
            }
        });
    }
}

/// The proxy of each server on PostgreSQL, by its data dir.
type Proxies = Mutex<Vec<(std::path::PathBuf, Arc<Proxy>)>>;

fn proxies() -> &'static Proxies {
    static PROXIES: OnceLock<Proxies> = OnceLock::new();
    PROXIES.get_or_init(Default::default)
}

fn proxy_of(data_dir: &std::path::Path) -> Option<Arc<Proxy>> {
    let proxies = proxies().lock().unwrap_or_else(|e| e.into_inner());
    proxies.iter().find(|(dir, _)| dir == data_dir).map(|(_, proxy)| proxy.clone())
}

/// `url` (a PostgreSQL database on a loopback port) reached through a new proxy, which the
/// server on `data_dir` uses from now on.
pub fn through_proxy(data_dir: &std::path::Path, url: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let (user, host_port) = authority.rsplit_once('@').map_or((None, authority), |(u, h)| (Some(u), h));
    let target: SocketAddr = host_port.parse().expect("the test server's loopback address");
    let proxy = Proxy::start(target);
    let address = proxy.addr;
    let mut proxies = proxies().lock().unwrap_or_else(|e| e.into_inner());
    proxies.retain(|(dir, _)| dir != data_dir);
    proxies.push((data_dir.to_owned(), proxy));
    let user = user.map(|u| format!("{u}@")).unwrap_or_default();
    format!("{scheme}://{user}{address}/{tail}")
}

#[test]
fn a_url_through_the_proxy_keeps_its_user_database_and_options() {
    let dir = std::path::Path::new("/nonexistent/proxy-url-test");
    let url = through_proxy(dir, "postgres://postgres@127.0.0.1:5432/test_1?sslmode=disable");
    let proxy = proxy_of(dir).expect("the proxy");
    assert_eq!(url, format!("postgres://postgres@{}/test_1?sslmode=disable", proxy.addr));
}
