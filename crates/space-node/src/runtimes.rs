//! The runtimes a node holds: every one available on its host, as `dyn Runtime`, and which
//! of them runs each sandbox. Sandboxes are found again after a restart by asking each
//! runtime what it has ([`Runtime::list`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use space_api::{RuntimeKind, RuntimeSupport, SandboxId};
use space_runtime::{Runtime, RuntimeError, SandboxHandle};

use crate::{NodeError, Result};

pub(crate) struct Runtimes {
    available: Vec<Arc<dyn Runtime>>,
    /// Runtimes this host cannot run, and why.
    unavailable: Vec<(RuntimeKind, String)>,
    owners: Mutex<HashMap<SandboxId, RuntimeKind>>,
}

impl Runtimes {
    /// `runtimes` are those that started; `unavailable` says why each other one did not.
    /// Learns which runtime holds each sandbox already on the node.
    pub(crate) fn new(available: Vec<Arc<dyn Runtime>>, unavailable: Vec<(RuntimeKind, String)>) -> Result<Runtimes> {
        let mut owners = HashMap::new();
        for runtime in &available {
            for id in runtime.list()? {
                owners.insert(id, runtime.kind());
            }
        }
        Ok(Runtimes { available, unavailable, owners: Mutex::new(owners) })
    }

    fn owners(&self) -> MutexGuard<'_, HashMap<SandboxId, RuntimeKind>> {
        // Entries are inserted and removed whole: a panic elsewhere cannot leave one torn.
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The runtime of this kind, or why this host has none.
    pub(crate) fn get(&self, kind: RuntimeKind) -> Result<&Arc<dyn Runtime>> {
        if let Some(runtime) = self.available.iter().find(|r| r.kind() == kind) {
            return Ok(runtime);
        }
        let reason = self.unavailable.iter().find(|(k, _)| *k == kind).map(|(_, why)| why.clone());
        Err(NodeError::RuntimeUnavailable { runtime: kind, reason: reason.unwrap_or_else(|| "not built in".into()) })
    }

    /// The runtime that runs sandbox `id`.
    pub(crate) fn of(&self, id: &SandboxId) -> Result<&Arc<dyn Runtime>> {
        let kind = self.owners().get(id).copied();
        match kind {
            Some(kind) => self.get(kind),
            None => Err(NodeError::Runtime(RuntimeError::NotFound(id.clone()))),
        }
    }

    /// The runtime of a handle the node gave out.
    pub(crate) fn of_handle(&self, handle: &SandboxHandle) -> Result<&Arc<dyn Runtime>> {
        self.get(handle.runtime)
    }

    /// From now on sandbox `id` is `kind`'s (recorded before it starts, so a failed start is
    /// cleaned up by the right runtime).
    pub(crate) fn record(&self, id: &SandboxId, kind: RuntimeKind) {
        self.owners().insert(id.clone(), kind);
    }

    pub(crate) fn forget(&self, id: &SandboxId) {
        self.owners().remove(id);
    }

    pub(crate) fn kind_of(&self, id: &SandboxId) -> Option<RuntimeKind> {
        self.owners().get(id).copied()
    }

    pub(crate) fn all(&self) -> &[Arc<dyn Runtime>] {
        &self.available
    }

    /// Every runtime and whether it works here.
    pub(crate) fn support(&self) -> Vec<RuntimeSupport> {
        let mut support: Vec<RuntimeSupport> = self
            .available
            .iter()
            .map(|r| RuntimeSupport { runtime: r.kind(), available: true, detail: r.describe() })
            .collect();
        support.extend(self.unavailable.iter().map(|(kind, why)| RuntimeSupport {
            runtime: *kind,
            available: false,
            detail: why.clone(),
        }));
        support.sort_by_key(|s| s.runtime);
        support
    }
}
