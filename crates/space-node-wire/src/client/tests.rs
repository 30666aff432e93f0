//! Both ends over real TLS on loopback: who may connect, and what a version mismatch says.

use std::sync::Arc;

use rustls::{AlertDescription, CertificateError};
use space_node_sim::{SimConfig, SimNode};

use super::*;
use crate::cluster::{ClusterCa, Identity, Role};
use crate::serve;
use crate::tls::{client_config, server_config};

struct Cluster {
    ca: ClusterCa,
    control: Identity,
    /// Where its nodes keep the files sent to them, each in a directory of its own.
    staging: tempfile::TempDir,
}

impl Cluster {
    fn new() -> Cluster {
        let ca = ClusterCa::generate("test").unwrap();
        let control = ca.issue(Role::Control, "control-1", &[]).unwrap();
        Cluster { ca, control, staging: tempfile::tempdir().unwrap() }
    }

    /// A staging directory for one more node.
    fn node_staging(&self) -> std::path::PathBuf {
        self.staging.path().join(hex::encode(rand::random::<[u8; 4]>()))
    }

    /// A node presenting `identity`, trusting this cluster's authority; its address.
    async fn node(&self, identity: &Identity) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let tls = server_config(identity, &self.ca.cert_pem).unwrap();
        let node: Arc<dyn space_node_api::NodeApi> = SimNode::new(SimConfig::default());
        tokio::spawn(serve(listener, tls, node, self.node_staging(), std::future::pending()));
        address
    }

    /// `sim` served as `node-a` until `shutdown`: the server's task, and the control plane's
    /// [`RemoteNode`] of it.
    async fn serve_sim(
        &self,
        sim: &Arc<SimNode>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> (tokio::task::JoinHandle<std::io::Result<()>>, Arc<crate::RemoteNode>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let identity = self.ca.issue(Role::Node, "node-a", &["127.0.0.1".into()]).unwrap();
        let tls = server_config(&identity, &self.ca.cert_pem).unwrap();
        let server = tokio::spawn(serve(listener, tls, sim.api(), self.node_staging(), shutdown));
        (server, crate::RemoteNode::connect(self.client(&address, &self.control)).await.unwrap())
    }

    async fn good_node(&self) -> String {
        self.node(&self.ca.issue(Role::Node, "node-a", &["127.0.0.1".into()]).unwrap()).await
    }

    fn client(&self, address: &str, identity: &Identity) -> NodeClient {
        NodeClient::new(address, client_config(identity, &self.ca.cert_pem).unwrap()).unwrap()
    }
}

/// The TLS error somewhere in `error`'s sources.
fn tls_error(error: &WireError) -> rustls::Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return tls.clone();
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(tls) = io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return tls.clone();
        }
        source = e.source();
    }
    panic!("no TLS error in {error:?}");
}

#[tokio::test]
async fn a_control_replica_of_the_cluster_learns_what_the_node_is() {
    let cluster = Cluster::new();
    let address = cluster.good_node().await;
    let info = cluster.client(&address, &cluster.control).info().await.unwrap();
    assert_eq!(info.api_version, NODE_API_VERSION);
    assert_eq!(info.runtimes, space_node_api::NodeApi::runtimes(&*SimNode::new(SimConfig::default())));
    assert_eq!(info.checkpoints.len(), space_api::RuntimeKind::ALL.len());
    // It says its clock, which is this one's here: the check lets it in.
    let said = info.now_ms.expect("a node says its clock");
    assert!(crate::clock::check(Some(said), said - 1000, said + 1000).is_ok());
    crate::RemoteNode::connect(cluster.client(&address, &cluster.control)).await.expect("a node on the same clock");
    // The connection is kept and used again.
    let client = cluster.client(&address, &cluster.control);
    for _ in 0..3 {
        client.info().await.unwrap();
    }
}

#[tokio::test]
async fn a_client_certificate_from_another_authority_is_refused_as_unknown() {
    let cluster = Cluster::new();
    let address = cluster.good_node().await;
    let stranger = ClusterCa::generate("other").unwrap().issue(Role::Control, "control-x", &[]).unwrap();
    // It trusts the node (so the handshake gets as far as the node checking it).
    let tls = client_config(&stranger, &cluster.ca.cert_pem).unwrap();
    let err = NodeClient::new(&address, tls).unwrap().info().await.unwrap_err();
    assert_eq!(tls_error(&err), rustls::Error::AlertReceived(AlertDescription::UnknownCA), "{err:?}");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let cluster = Cluster::new();
    let address = cluster.good_node().await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut cluster.ca.cert_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let err = NodeClient::new(&address, Arc::new(tls)).unwrap().info().await.unwrap_err();
    assert_eq!(tls_error(&err), rustls::Error::AlertReceived(AlertDescription::CertificateRequired), "{err:?}");
}

#[tokio::test]
async fn a_nodes_certificate_cannot_drive_another_node() {
    let cluster = Cluster::new();
    let address = cluster.good_node().await;
    let other_node = cluster.ca.issue(Role::Node, "node-b", &["127.0.0.1".into()]).unwrap();
    let err = cluster.client(&address, &other_node).info().await.unwrap_err();
    assert_eq!(tls_error(&err), rustls::Error::AlertReceived(AlertDescription::UnsupportedCertificate), "{err:?}");
}

#[tokio::test]
async fn a_node_whose_certificate_another_authority_signed_is_not_trusted() {
    let cluster = Cluster::new();
    let impostor = ClusterCa::generate("other").unwrap().issue(Role::Node, "node-a", &["127.0.0.1".into()]).unwrap();
    let address = cluster.node(&impostor).await;
    let err = cluster.client(&address, &cluster.control).info().await.unwrap_err();
    assert!(matches!(err, WireError::Connect { .. }), "{err:?}");
    assert_eq!(tls_error(&err), rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer), "{err:?}");
}

#[tokio::test]
async fn a_control_replicas_certificate_cannot_pose_as_a_node() {
    let cluster = Cluster::new();
    let posing = cluster.ca.issue(Role::Control, "control-2", &["127.0.0.1".into()]).unwrap();
    let address = cluster.node(&posing).await;
    let err = cluster.client(&address, &cluster.control).info().await.unwrap_err();
    let tls = tls_error(&err);
    assert!(
        matches!(tls, rustls::Error::InvalidCertificate(CertificateError::InvalidPurposeContext { .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_node_certificate_for_another_address_is_not_trusted() {
    let cluster = Cluster::new();
    let elsewhere = cluster.ca.issue(Role::Node, "node-c", &["10.9.9.9".into()]).unwrap();
    let address = cluster.node(&elsewhere).await;
    let err = cluster.client(&address, &cluster.control).info().await.unwrap_err();
    assert!(
        matches!(tls_error(&err), rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_caller_of_another_api_version_is_refused_with_both_versions_named() {
    let cluster = Cluster::new();
    let address = cluster.good_node().await;
    let mut client = cluster.client(&address, &cluster.control);
    client.api_version = NODE_API_VERSION + 1;
    let err = client.info().await.unwrap_err();
    match &err {
        WireError::VersionMismatch { ours, theirs } => {
            assert_eq!((*ours, *theirs), (NODE_API_VERSION + 1, Some(NODE_API_VERSION)));
        }
        other => panic!("{other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains(&format!("version {NODE_API_VERSION}")), "{message}");
    assert!(message.contains(&format!("version {}", NODE_API_VERSION + 1)), "{message}");
}

#[tokio::test]
async fn an_unknown_operation_is_refused_with_its_code() {
    let cluster = Cluster::new();
    let address = cluster.good_node().await;
    let client = cluster.client(&address, &cluster.control);
    let err = client.call(Method::POST, "/v1/no-such-thing", Bytes::new()).await.unwrap_err();
    match err {
        WireError::Refused { status, code, .. } => assert_eq!((status, code.as_str()), (404, codes::UNKNOWN_OPERATION)),
        other => panic!("{other:?}"),
    }
}

/// A node served on loopback and the control plane's [`RemoteNode`] of it, with one
/// running sandbox.
async fn remote_with_sandbox() -> (Arc<SimNode>, Arc<crate::RemoteNode>, space_api::SandboxId) {
    use space_node_api::NodeApi;
    let sim = SimNode::new(SimConfig::default());
    let (_, remote) = Cluster::new().serve_sim(&sim, std::future::pending()).await;
    let template = remote.ensure_template("busybox", Box::new(|_| {})).await.unwrap();
    let id = space_api::SandboxId::generate();
    let disk = space_node_api::DiskQuota { session: space_api::SessionId::generate(), limit_bytes: None };
    let limits = space_node_api::Limits { memory_mib: 256, millicpus: 1000, pids: 128 };
    remote.start_sandbox(&id, &template, space_api::RuntimeKind::Linux, limits, &disk).await.unwrap();
    (sim, remote, id)
}

/// The control plane reaches a sandbox's agent for what the public API offers, never for
/// what steers the sandbox's life: those requests are answered by the node, refused.
#[tokio::test]
async fn the_agent_relay_refuses_what_only_the_node_may_ask() {
    use space_node_api::NodeApi;
    use space_proto::{ErrorKind, Reply, Request};
    let (_sim, remote, id) = remote_with_sandbox().await;
    let agent = remote.agent(&id).await.unwrap();
    assert!(agent.health().await.is_ok());
    for request in [Request::AllowCheckpoint, Request::FreezeRoot { frozen: true }, Request::ForgetExited] {
        let mut stream = agent.open_stream().await.unwrap();
        space_proto::send_message(&mut stream, &request).await.unwrap();
        let reply: Reply = space_proto::next_frame(&mut stream).await.unwrap().unwrap().parse().unwrap();
        match reply {
            Reply::Error { kind, .. } => assert_eq!(kind, ErrorKind::PermissionDenied, "{request:?}"),
            other => panic!("{request:?} was answered {other:?}"),
        }
    }
    // The connection still serves what it may.
    assert!(agent.health().await.is_ok());
}

/// A file sent to a node arrives whole in the node's staging directory, and goes when the
/// control plane says; nothing else can be removed that way.
#[tokio::test]
async fn a_file_sent_to_a_node_arrives_whole_and_goes_when_unstaged() {
    use space_node_api::NodeApi;
    let cluster = Cluster::new();
    let sim = SimNode::new(SimConfig::default());
    let (_, remote) = cluster.serve_sim(&sim, std::future::pending()).await;
    let dir = tempfile::tempdir().unwrap();
    for len in [0usize, 1, (3 << 20) + 17] {
        let file = dir.path().join(format!("upload-{len}"));
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 + i / 7919) as u8).collect();
        std::fs::write(&file, &bytes).unwrap();
        let staged = remote.stage_file(&file).await.unwrap();
        assert!(staged.starts_with(cluster.staging.path()), "{}", staged.display());
        assert_eq!(std::fs::read(&staged).unwrap(), bytes, "{len} bytes");
        remote.unstage_file(&staged).await.unwrap();
        assert!(!staged.exists());
        // Only what the node staged: the control plane's own file is not the node's to remove.
        let err = remote.unstage_file(&file).await.unwrap_err();
        assert!(err.to_string().contains("not a file this node staged"), "{err}");
        assert!(file.exists());
    }
    let err = remote.stage_file(&dir.path().join("missing")).await.unwrap_err();
    assert!(format!("{:?}", err).contains("NotFound"), "{err:?}");
}

/// A node's failure reaches the control plane as the class it had on the node.
#[tokio::test]
async fn a_remote_nodes_failures_keep_their_class() {
    use space_node_api::{NodeApi, NodeError, OutOfSpace};
    let (sim, remote, id) = remote_with_sandbox().await;
    let err = remote.ensure_template("no-such-template", Box::new(|_| {})).await.unwrap_err();
    assert!(matches!(err, NodeError::UnknownTemplate { ref name, .. } if name == "no-such-template"), "{err:?}");
    sim.fail_next_out_of_space(space_node_sim::Op::SnapshotDisk, OutOfSpace::Quota);
    let session = space_api::SessionId::generate();
    let err = remote.snapshot_disk(&id, &session, &space_api::SnapshotId::generate(), false).await.unwrap_err();
    assert!(matches!(err, NodeError::OutOfSpace { which: OutOfSpace::Quota, .. }), "{err:?}");
    let err = remote.sandbox_stats(&space_api::SandboxId::generate()).await.unwrap_err();
    assert!(matches!(err, NodeError::Failed(_)), "{err:?}");
}

/// A node that accepts the connection and then says nothing fails the call once the connect
/// timeout passes, instead of holding it for ever.
#[tokio::test]
async fn a_node_that_never_completes_the_handshake_fails_the_call() {
    let cluster = Cluster::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        let (_socket, _) = listener.accept().await.unwrap();
        std::future::pending::<()>().await;
    });
    let mut client = cluster.client(&address, &cluster.control);
    client.connect_timeout = std::time::Duration::from_millis(200);
    match client.info().await.unwrap_err() {
        WireError::Connect { source, .. } => assert_eq!(source.kind(), std::io::ErrorKind::TimedOut),
        other => panic!("{other:?}"),
    }
    held.abort();
}

/// A node (or whatever answers for it) that sends an endless answer fails the call; the
/// control plane does not read it into memory.
#[tokio::test]
async fn an_endless_answer_fails_the_call() {
    use http_body_util::StreamBody;
    let cluster = Cluster::new();
    let identity = cluster.ca.issue(Role::Node, "node-a", &["127.0.0.1".into()]).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(&identity, &cluster.ca.cert_pem).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = acceptor.accept(tcp).await.unwrap();
        let service = hyper::service::service_fn(|_request| async {
            let zeros = futures::stream::repeat_with(|| {
                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(Bytes::from(vec![b'0'; 1 << 16])))
            });
            let mut response = hyper::Response::new(StreamBody::new(zeros));
            response.headers_mut().insert(VERSION_HEADER, NODE_API_VERSION.into());
            Ok::<_, std::convert::Infallible>(response)
        });
        let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).await;
    });
    let err = cluster.client(&address, &cluster.control).info().await.unwrap_err();
    assert!(matches!(err, WireError::AnswerTooLarge), "{err:?}");
}

#[path = "watch_tests.rs"]
mod watch_tests;

/// A node that is stopped waits for a call that changes something, also one whose caller has
/// gone, instead of ending it with the process.
#[tokio::test]
async fn a_stopping_node_finishes_the_changes_its_callers_left() {
    use space_node_api::NodeApi;
    let sim = SimNode::new(SimConfig::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (server, remote) = Cluster::new().serve_sim(&sim, async move { drop(stopped.await) }).await;
    let template = remote.ensure_template("busybox", Box::new(|_| {})).await.unwrap();

    // Two connections open (and idle) now: one is cut with the held call, one stays.
    let (a, b) = tokio::join!(remote.capacity(), remote.capacity());
    a.unwrap();
    b.unwrap();
    let held = sim.hold_next(space_node_sim::Op::StartSandbox);
    let id = space_api::SandboxId::generate();
    let call = {
        let (id, remote) = (id.clone(), remote.clone());
        let disk = space_node_api::DiskQuota { session: space_api::SessionId::generate(), limit_bytes: None };
        let limits = space_node_api::Limits { memory_mib: 256, millicpus: 1000, pids: 128 };
        tokio::spawn(async move {
            let _ = remote.start_sandbox(&id, &template, space_api::RuntimeKind::Linux, limits, &disk).await;
        })
    };
    held.began().await;
    call.abort();
    stop.send(()).unwrap();
    // Nothing is accepted any more, and a connection still open is refused new changes: only
    // the held call keeps the server.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let refused = remote.destroy_sandbox(&space_api::SandboxId::generate()).await.unwrap_err();
    assert!(refused.to_string().contains("node_stopping"), "{refused}");
    assert!(!server.is_finished(), "the node stopped before the call it was running had finished");
    drop(remote);
    held.release();
    tokio::time::timeout(std::time::Duration::from_secs(10), server).await.unwrap().unwrap().unwrap();
    assert!(sim.sandboxes().iter().any(|s| s.id == id && s.alive), "the sandbox was never started");
}
