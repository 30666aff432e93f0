//! What can go wrong between a control plane and a node.

use std::path::PathBuf;

/// Why a call to a node, or setting up the cluster's certificates, failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("making a certificate")]
    Certificate(#[from] rcgen::Error),
    #[error("setting up TLS")]
    Tls(#[from] rustls::Error),
    #[error("{}", path.display())]
    File { path: PathBuf, source: std::io::Error },
    /// A PEM text that holds none of what it should, or cannot be parsed.
    #[error("{what} holds no usable PEM block")]
    Pem { what: &'static str, source: Option<std::io::Error> },
    #[error("building the verifier of client certificates")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("{what} already exists at {}: remove it first, or keep using it", path.display())]
    Exists { what: &'static str, path: PathBuf },
    #[error("connecting to node {address}")]
    Connect { address: String, source: std::io::Error },
    /// A call waited on a node that stopped answering (see the client's `WATCH`).
    #[error(
        "node {address} stopped answering (nothing for about {} s) while a call waited on it: \
         `space node list` shows whether its lease ran out",
        quiet.as_secs()
    )]
    Unresponsive { address: String, quiet: std::time::Duration },
    /// A file could not be sent to the node (see [`crate::NodeClient::stage`]).
    #[error("sending a file to node {address}")]
    Send { address: String, source: std::io::Error },
    #[error("the node could not keep the file sent to it: {message}")]
    StageFailed { message: String },
    #[error("the node's copy of the file sent to it ({}) differs from what was sent", path.display())]
    StagedCopyDiffers { path: PathBuf },
    #[error("talking HTTP to the node")]
    Http(#[from] hyper::Error),
    #[error("building a request to the node")]
    Request(#[from] hyper::http::Error),
    /// The peer speaks another node API version (`None`: it named none).
    #[error(
        "the node speaks node API version {}, this control plane version {ours}: \
         run the same space release on both",
        theirs.map_or("(none given)".to_string(), |v| v.to_string())
    )]
    VersionMismatch { ours: u32, theirs: Option<u32> },
    /// The node's clock is further from this side's than [`crate::clock::MAX_SKEW`].
    #[error(
        "the node's clock is {} s {} this control plane's (at most {max_s} s apart are taken): \
         set both clocks right (NTP) and start the node again",
        skew_ms.unsigned_abs() / 1000,
        if *skew_ms > 0 { "ahead of" } else { "behind" }
    )]
    ClockSkew { skew_ms: i64, max_s: u64 },
    /// The node refused the call.
    #[error("the node refused the call ({status}, {code}): {message}")]
    Refused { status: u16, code: String, message: String },
    /// The node did what it was asked, and it failed.
    #[error("{}", space_node_api::NodeError::from(.0.clone()))]
    Failed(crate::ops::NodeFailure),
    #[error("the node sent an answer larger than 64 MiB")]
    AnswerTooLarge,
    #[error("the node sent a line longer than 16 MiB")]
    LineTooLong,
    #[error("reading the node's answer")]
    Decode(#[from] serde_json::Error),
}

impl WireError {
    pub(crate) fn file(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> WireError {
        let path = path.into();
        move |source| WireError::File { path, source }
    }
}
