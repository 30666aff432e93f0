//! Connecting sandboxes to the node's gateway: its listeners in every sandbox's network
//! namespace, and the files that point the sandbox's clients at it.

use bytes::Bytes;
use space_api::{SandboxId, SessionId};
use space_gateway::{CA_BUNDLE_PATH, CA_CERT_PATH, GATEWAY_ADDR};
use space_proto::client::AgentClient;
use space_runtime::SandboxHandle;

use crate::{Node, NodeError, Result};

/// Where Debian-like roots keep their trusted roots; the session bundle starts from them so
/// tunnelled (not intercepted) hosts still verify.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The longest system bundle copied (Debian's is ~220 KiB).
const MAX_SYSTEM_BUNDLE: usize = 4 << 20;

impl Node {
    /// Opens the gateway's listeners in a sandbox that just started (or was restored).
    /// The sandbox serves no session, so it reaches nothing, until [`Node::join_session_network`].
    /// A sandbox the gateway cannot serve is of no use: it is destroyed.
    pub(crate) async fn attach_gateway_or_destroy(&self, handle: &SandboxHandle) -> Result<()> {
        let attached = self.attach_gateway(handle).await;
        if attached.is_err()
            && let Err(e) = self.destroy_sandbox(&handle.id).await
        {
            tracing::warn!(sandbox = %handle.id, error = %e, "destroying a sandbox the gateway could not serve");
        }
        attached
    }

    async fn attach_gateway(&self, handle: &SandboxHandle) -> Result<()> {
        self.gateway.attach(&handle.id, handle.pid).await.map_err(|e| NodeError::Gateway(e.to_string()))
    }

    /// After a server restart: the old process's listeners are gone with it; open new ones in
    /// a sandbox that kept running, serving `session` again.
    pub async fn reattach_gateway(&self, handle: &SandboxHandle, session: &SessionId) -> Result<()> {
        self.attach_gateway(handle).await?;
        self.gateway.assign(&handle.id, session);
        Ok(())
    }

    /// From now on `sandbox`'s traffic is decided by `session`'s egress (set beforehand with
    /// `gateway().set_session`). Writes the session CA, a trust bundle holding it and the
    /// resolver setting into the sandbox's root.
    pub async fn join_session_network(&self, sandbox: &SandboxId, session: &SessionId) -> Result<()> {
        let ca_cert_pem = self.gateway.session_ca_cert(session).ok_or_else(|| {
            NodeError::Gateway(format!("the egress of session {session} is not loaded"))
        })?;
        self.gateway.assign(sandbox, session);
        let agent = self.agent(sandbox).await?;
        let failed = |what: &str, e: &dyn std::fmt::Display| NodeError::Agent {
            sandbox: sandbox.clone(),
            reason: format!("{what}: {e}"),
        };
        agent.make_dir("/etc/space").await.map_err(|e| failed("create /etc/space", &e))?;
        let mut bundle = read_small_file(&agent, SYSTEM_BUNDLE).await.unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(ca_cert_pem.as_bytes());
        let resolver = format!("nameserver {GATEWAY_ADDR}\noptions timeout:2 attempts:2\n");
        let files = [
            (CA_CERT_PATH, Bytes::copy_from_slice(ca_cert_pem.as_bytes())),
            (CA_BUNDLE_PATH, Bytes::from(bundle)),
            ("/etc/resolv.conf", Bytes::from(resolver)),
        ];
        for (path, data) in files {
            let chunks = futures::stream::iter([Ok::<_, std::io::Error>(data)]);
            agent.write_file(path, Some(0o644), chunks).await.map_err(|e| failed(&format!("write {path}"), &e))?;
        }
        Ok(())
    }
}

/// A file of the sandbox, if it exists and is small enough to hold in memory.
async fn read_small_file(agent: &AgentClient, path: &str) -> Option<Vec<u8>> {
    use futures::StreamExt;
    let (size, mut chunks) = agent.read_file(path).await.ok()?;
    if size as usize > MAX_SYSTEM_BUNDLE {
        return None;
    }
    let mut data = Vec::with_capacity(size as usize);
    while let Some(chunk) = chunks.next().await {
        data.extend_from_slice(&chunk.ok()?);
        if data.len() > MAX_SYSTEM_BUNDLE {
            return None;
        }
    }
    Some(data)
}
