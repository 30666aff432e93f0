//! A call waiting on a node that goes quiet fails; one waiting on a slow node that still
//! answers does not. The node goes quiet behind a relay that stops passing bytes, as a stopped
//! process (or a cut link) does: the connections stay open and nothing comes back.

use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::*;

/// A TCP relay to a node whose connections can be frozen: bytes stop crossing them, both ways.
struct Relay {
    address: String,
    /// Connections accepted so far.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    /// One per connection, `true` while frozen; and whether connections to come start frozen.
    connections: Arc<Mutex<(Vec<watch::Sender<bool>>, bool)>>,
}

impl Relay {
    async fn to(target: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let connections: Arc<Mutex<(Vec<watch::Sender<bool>>, bool)>> = Arc::default();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (shared, counted) = (connections.clone(), accepted.clone());
        tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let node = TcpStream::connect(&target).await.unwrap();
                let thawed = {
                    let mut connections = shared.lock().unwrap();
                    let (frozen, thawed) = watch::channel(connections.1);
                    connections.0.push(frozen);
                    thawed
                };
                let (client_read, client_write) = client.into_split();
                let (node_read, node_write) = node.into_split();
                tokio::spawn(pump(client_read, node_write, thawed.clone()));
                tokio::spawn(pump(node_read, client_write, thawed));
            }
        });
        Relay { address, accepted, connections }
    }

    /// Freezes the connections open now; `new`: those to come too.
    fn freeze(&self, new: bool) {
        let mut connections = self.connections.lock().unwrap();
        for connection in &connections.0 {
            connection.send_replace(true);
        }
        connections.1 = new;
    }

    fn thaw(&self) {
        let mut connections = self.connections.lock().unwrap();
        for connection in &connections.0 {
            connection.send_replace(false);
        }
        connections.1 = false;
    }
}

/// Copies `from` to `to`, holding what it read while the connection is frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buffer = vec![0; 1 << 16];
    loop {
        let Ok(n @ 1..) = from.read(&mut buffer).await else { return };
        if frozen.wait_for(|frozen| !frozen).await.is_err() || to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// A client of a node behind a relay, watching quickly; the relay.
async fn client_behind_relay() -> (NodeClient, Relay) {
    let cluster = Cluster::new();
    let relay = Relay::to(cluster.good_node().await).await;
    let mut client = cluster.client(&relay.address, &cluster.control);
    client.connect_timeout = Duration::from_millis(200);
    client.watch = Watch { every: Duration::from_millis(50), within: Duration::from_millis(200), misses: 3 };
    // One connection, kept: the call below goes over it.
    client.info().await.unwrap();
    (client, relay)
}

#[tokio::test]
async fn a_call_to_a_node_gone_quiet_fails_saying_so() {
    let (client, relay) = client_behind_relay().await;
    relay.freeze(true);
    let call = tokio::time::timeout(Duration::from_secs(30), client.info());
    match call.await.expect("the call ends without the node's answer").unwrap_err() {
        WireError::Unresponsive { address, quiet } => {
            assert_eq!(address, relay.address);
            assert!(quiet >= Duration::from_millis(150), "three asks 50 ms apart went unanswered: {quiet:?}");
        }
        other => panic!("{other:?}"),
    }
    // Once it answers again, so do calls.
    relay.thaw();
    client.info().await.unwrap();
}

#[tokio::test]
async fn a_call_to_a_slow_node_that_still_answers_waits_for_its_answer() {
    let (client, relay) = client_behind_relay().await;
    // The call's connection holds its answer; the asks go over new connections, which pass.
    relay.freeze(false);
    let thaw = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        relay.thaw();
    };
    let (answer, ()) = tokio::join!(client.info(), thaw);
    answer.expect("the node answered every ask meanwhile");
}

#[tokio::test]
async fn calls_waiting_on_a_node_gone_quiet_share_their_asks() {
    let (client, relay) = client_behind_relay().await;
    // Ten kept connections: the ten calls below go over them, and every connection opened
    // after the freeze is an ask.
    for answer in futures::future::join_all((0..10).map(|_| client.info())).await {
        answer.unwrap();
    }
    relay.freeze(true);
    let before = relay.accepted.load(std::sync::atomic::Ordering::SeqCst);
    let calls = (0..10).map(|_| tokio::time::timeout(Duration::from_secs(60), client.info()));
    for call in futures::future::join_all(calls).await {
        let error = call.expect("the call ends without the node's answer").unwrap_err();
        assert!(matches!(error, WireError::Unresponsive { .. }), "{error:?}");
    }
    // One ask per check for all ten calls (three checks), with room for a check or two more;
    // ten calls asking for themselves would open thirty.
    let asks = relay.accepted.load(std::sync::atomic::Ordering::SeqCst) - before;
    assert!((3..=6).contains(&asks), "{asks} asks for ten calls");
}
