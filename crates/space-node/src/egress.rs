//! Connecting sandboxes to the node's gateway: its listeners in every sandbox's network
//! namespace, and the files that point the sandbox's clients at it.

use bytes::Bytes;
use space_api::{SandboxId, SessionId};
use space_gateway::{CA_CERT_PATH, GATEWAY_ADDR};
use space_proto::client::AgentClient;
use space_runtime::{RootDiskKind, SandboxHandle};
use space_storage::SandboxIdentity;

use crate::{Node, NodeError, Result, blocking, poisoned};

/// Where Debian-like roots keep their trusted roots; the session bundle starts from them so
/// tunnelled (not intercepted) hosts still verify.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The longest system bundle copied (Debian's is ~220 KiB).
const MAX_SYSTEM_BUNDLE: usize = 4 << 20;
/// `CA_CERT_PATH` and `CA_BUNDLE_PATH` as a directory under `/etc` and names in it.
const CA_DIR: &str = "space";
const CA_CERT_FILE: &str = "ca.crt";
const CA_BUNDLE_FILE: &str = "ca-bundle.crt";

/// The identity files of a new root: its resolver asks the gateway, which answers for the
/// session's allowed names (any address on UDP port 53 reaches it, but not every client
/// tries without a `resolv.conf`). Written with the root, from the host: no round trip to
/// the sandbox on the way to its first command. A root restored from a full snapshot keeps
/// the one it had.
pub(crate) fn sandbox_identity(hostname: &str) -> SandboxIdentity {
    SandboxIdentity { hostname: hostname.to_owned(), nameserver: Some(GATEWAY_ADDR.into()) }
}

impl Node {
    /// Opens the gateway's listeners in a sandbox that just started (or, `restored`, was
    /// restored from a full snapshot). The sandbox serves no session, so it reaches
    /// nothing, until [`Node::join_session_network`]. A sandbox the gateway cannot serve is of
    /// no use: it is destroyed.
    pub(crate) async fn connect_to_gateway_or_destroy(&self, handle: &SandboxHandle, restored: bool) -> Result<()> {
        let connected = self.connect_to_gateway(handle, restored).await;
        if connected.is_err()
            && let Err(e) = self.destroy_sandbox(&handle.id).await
        {
            tracing::warn!(sandbox = %handle.id, error = %e, "destroying a sandbox the gateway could not serve");
        }
        connected
    }

    /// Done when a sandbox starts (for pods: before any session waits for it), so that
    /// joining a session only has to write the session's own files. (The resolver already
    /// points at the gateway: see [`sandbox_identity`].)
    async fn connect_to_gateway(&self, handle: &SandboxHandle, restored: bool) -> Result<()> {
        self.attach_gateway(handle).await?;
        let agent = self.agent(&handle.id).await?;
        // A restored root's certificate (small) tells whether its session files can stay.
        let found = match restored {
            true => RootCerts::Restored(Bytes::from(read_small_file(&agent, CA_CERT_PATH).await.unwrap_or_default())),
            false => RootCerts::System(Bytes::from(read_small_file(&agent, SYSTEM_BUNDLE).await.unwrap_or_default())),
        };
        self.root_certs.lock().map_err(poisoned)?.insert(handle.id.clone(), found);
        Ok(())
    }

    async fn attach_gateway(&self, handle: &SandboxHandle) -> Result<()> {
        let netns = self.runtimes.of_handle(handle)?.network_namespace(handle)?;
        self.gateway.attach(&handle.id, netns).await.map_err(|e| NodeError::Gateway(e.to_string()))
    }

    /// After a server restart: the old process's listeners are gone with it; open new ones in
    /// a sandbox that kept running, serving `session` again.
    pub async fn reattach_gateway(&self, handle: &SandboxHandle, session: &SessionId) -> Result<()> {
        self.attach_gateway(handle).await?;
        self.gateway.assign(&handle.id, session);
        Ok(())
    }

    /// From now on `sandbox`'s traffic is decided by `session`'s egress (set beforehand with
    /// `gateway().set_session`). Writes the session CA and a trust bundle holding it (after
    /// the template's roots, so tunnelled hosts still verify) into the sandbox's root: from the
    /// host, without a round trip to the sandbox, as this is on the path of every create.
    /// A root restored from a full snapshot that holds this CA's certificate keeps its files
    /// (the same session, or a fork of it: forks share their parent's CA, docs/egress.md):
    /// each write would be a round trip to a VM's agent. The certificate is written after
    /// the bundle, so a root that holds it holds the bundle made with it.
    pub async fn join_session_network(&self, sandbox: &SandboxId, session: &SessionId) -> Result<()> {
        let ca_cert_pem = self
            .gateway
            .session_ca_cert(session)
            .ok_or_else(|| NodeError::Gateway(format!("the egress of session {session} is not loaded")))?;
        self.gateway.assign(sandbox, session);
        let found = self.root_certs.lock().map_err(poisoned)?.remove(sandbox);
        let system = match found {
            Some(RootCerts::Restored(held)) if held == ca_cert_pem.as_bytes() => return Ok(()),
            Some(RootCerts::System(bundle)) => bundle,
            Some(RootCerts::Restored(_)) | None => {
                let agent = self.agent(sandbox).await?;
                Bytes::from(read_small_file(&agent, SYSTEM_BUNDLE).await.unwrap_or_default())
            }
        };
        let mut bundle = system.to_vec();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(ca_cert_pem.as_bytes());
        let files = [(CA_BUNDLE_FILE, Bytes::from(bundle)), (CA_CERT_FILE, Bytes::from(ca_cert_pem.into_bytes()))];
        self.write_etc_files(sandbox, CA_DIR, files).await
    }

    /// Writes `files` into the sandbox's `/etc/<dir>`: from the host into a root directory,
    /// through the agent into a disk image (a guest's filesystem is the guest kernel's).
    async fn write_etc_files(
        &self,
        sandbox: &SandboxId,
        dir: &'static str,
        files: [(&'static str, Bytes); 2],
    ) -> Result<()> {
        if self.runtimes.of(sandbox)?.root_disk() == RootDiskKind::Image {
            let agent = self.agent(sandbox).await?;
            let agent_error = |e: space_proto::client::AgentError| NodeError::Agent {
                sandbox: sandbox.clone(),
                reason: format!("writing /etc/{dir}: {e}"),
            };
            agent.make_dir(&format!("/etc/{dir}")).await.map_err(agent_error)?;
            for (name, data) in files {
                let chunks = futures::stream::iter([Ok::<_, std::io::Error>(data)]);
                agent.write_file(&format!("/etc/{dir}/{name}"), Some(0o644), chunks).await.map_err(agent_error)?;
            }
            return Ok(());
        }
        let (pool, sbx) = (self.pool.clone(), sandbox.clone());
        blocking(move || {
            let files: Vec<(&str, &[u8])> = files.iter().map(|(name, data)| (*name, data.as_ref())).collect();
            Ok(pool.write_sandbox_etc_files(&sbx, dir, &files)?)
        })
        .await
    }

    /// Forgets what [`Node::connect_to_gateway`] kept for a sandbox that goes away.
    pub(crate) fn disconnect_from_gateway(&self, sandbox: &SandboxId) {
        self.gateway.detach(sandbox);
        if let Ok(mut found) = self.root_certs.lock() {
            found.remove(sandbox);
        }
    }
}

/// What a started sandbox's root holds that joining a session needs, read while it starts.
pub(crate) enum RootCerts {
    /// A new root: the template's trusted roots, which the session bundle starts from.
    System(Bytes),
    /// A root restored from a full snapshot: the session CA certificate it holds (empty if
    /// none).
    Restored(Bytes),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_written_are_those_the_sandbox_is_told_about() {
        assert_eq!(space_gateway::CA_CERT_PATH, format!("/etc/{CA_DIR}/{CA_CERT_FILE}"));
        assert_eq!(space_gateway::CA_BUNDLE_PATH, format!("/etc/{CA_DIR}/{CA_BUNDLE_FILE}"));
    }

    #[test]
    fn guests_are_told_the_gateways_address() {
        assert_eq!(space_runtime_vm::GATEWAY_ADDR, GATEWAY_ADDR);
    }
}
