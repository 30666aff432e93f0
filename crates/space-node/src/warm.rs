//! The warm pool: per template, sandboxes started ahead of demand ("pods"): root snapshot,
//! namespaces, cgroups and a connected `spaced`, waiting for a session. Binding one to a
//! session is a pop from a queue plus, when the session asked for other limits, a few cgroup
//! writes, so a create does no storage or process work at all.
//!
//! A pod is an ordinary sandbox that no session owns yet: it has its own sandbox id, from
//! which its hostname and machine-id derive, so two sessions never share an identity. Pods
//! are not recorded in the store; after a crash the start-up sweep destroys them like any
//! other sandbox no session owns, and the pool fills again.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use space_api::{PoolStatus, RuntimeKind, SandboxId, TemplatePool};
use space_proto::ExecSpec;
use space_runtime::{Limits, SandboxHandle};
use space_storage::TemplateInfo;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::Node;

pub use space_node_api::MAX_POOL_SIZE;
/// A failed preparation waits this long before the pool tries again, so a broken template
/// does not spin the node.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(2);
/// Bound on the warm-up command of a pod.
const WARM_UP_TIMEOUT_MS: u64 = 10_000;
/// How long a refill waits after a pod was taken (see [`Node::refill_soon`]).
const REFILL_PAUSE: Duration = Duration::from_millis(25);
/// Catches up on work whose wake-up was missed (e.g. a template that got built).
const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// How the warm pool is sized.
#[derive(Debug, Clone)]
pub struct WarmSettings {
    /// Ready pods to keep, per template name and runtime.
    pub sizes: BTreeMap<PoolKey, u32>,
    /// Ceiling on pods prepared at the same time, so refilling never takes every core from
    /// running sandboxes.
    pub max_filling: u32,
    /// Limits pods are started with; a session asking for others gets them at bind time.
    pub pod_limits: Limits,
}

/// One pool: a template's pods of one runtime.
pub type PoolKey = (String, RuntimeKind);

#[derive(Debug)]
struct Pod {
    handle: SandboxHandle,
    version: u64,
}

#[derive(Debug, Default)]
struct Slot {
    size: u32,
    ready: VecDeque<Pod>,
    filling: u32,
    hits: u64,
    misses: u64,
    failures: u64,
    last_error: Option<String>,
}

impl Slot {
    fn wanted(&self) -> u32 {
        self.size.saturating_sub(self.ready.len() as u32 + self.filling)
    }
}

pub(crate) struct WarmPool {
    slots: std::sync::Mutex<BTreeMap<PoolKey, Slot>>,
    permits: Arc<Semaphore>,
    max_filling: u32,
    filling: AtomicU32,
    peak_filling: AtomicU32,
    pub(crate) pod_limits: Limits,
    wake: Notify,
}

impl WarmPool {
    pub(crate) fn new(settings: &WarmSettings) -> WarmPool {
        let max_filling = settings.max_filling.max(1);
        let slots = settings.sizes.iter().map(|(key, size)| (key.clone(), Slot { size: *size, ..Slot::default() }));
        WarmPool {
            slots: std::sync::Mutex::new(slots.collect()),
            permits: Arc::new(Semaphore::new(max_filling as usize)),
            max_filling,
            filling: AtomicU32::new(0),
            peak_filling: AtomicU32::new(0),
            pod_limits: settings.pod_limits,
            wake: Notify::new(),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, BTreeMap<PoolKey, Slot>> {
        // A panic while holding the lock leaves counters, never a half-moved pod: keep going.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sandboxes the pool holds ready: the node's own, which no sweep by a control plane
    /// may take (one that restarts while the node runs sweeps a node with a full pool).
    pub(crate) fn ready_ids(&self) -> HashSet<SandboxId> {
        self.slots().values().flat_map(|slot| slot.ready.iter().map(|pod| pod.handle.id.clone())).collect()
    }

    /// Takes a ready pod of exactly this template version and runtime, if there is one. Pods
    /// of older versions found on the way are returned for destruction.
    fn take(
        &self,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        alive: impl Fn(&SandboxHandle) -> bool,
    ) -> (Option<Pod>, Vec<Pod>) {
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(&(template.name.clone(), runtime)) else {
            return (None, Vec::new());
        };
        let mut discard = Vec::new();
        while let Some(pod) = slot.ready.pop_front() {
            if pod.version == template.version && alive(&pod.handle) {
                slot.hits += 1;
                return (Some(pod), discard);
            }
            discard.push(pod);
        }
        slot.misses += 1;
        (None, discard)
    }

    /// Reserves a preparation for the built template that needs one most, with a permit.
    fn next_job(&self, built: &HashSet<String>) -> Option<(PoolKey, OwnedSemaphorePermit)> {
        let mut slots = self.slots();
        let (key, slot) = slots
            .iter_mut()
            .filter(|((name, _), s)| s.wanted() > 0 && built.contains(name))
            .max_by_key(|(_, s)| s.wanted())?;
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        slot.filling += 1;
        let now = self.filling.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_filling.fetch_max(now, Ordering::SeqCst);
        Some((key.clone(), permit))
    }

    /// Ends a preparation; returns the pod back if the pool no longer wants it.
    fn finish_job(&self, key: &PoolKey, outcome: Result<Pod, String>) -> Option<Pod> {
        self.filling.fetch_sub(1, Ordering::SeqCst);
        let mut slots = self.slots();
        let slot = slots.entry(key.clone()).or_default();
        slot.filling -= 1;
        match outcome {
            Ok(pod) if (slot.ready.len() as u32) < slot.size => {
                slot.last_error = None;
                slot.ready.push_back(pod);
                None
            }
            Ok(pod) => Some(pod),
            Err(message) => {
                slot.failures += 1;
                slot.last_error = Some(message);
                None
            }
        }
    }

    /// Sets a template's pool size; returns the ready pods beyond it, for destruction.
    fn resize(&self, template: &str, runtime: RuntimeKind, size: u32) -> Vec<Pod> {
        let mut slots = self.slots();
        let slot = slots.entry((template.to_owned(), runtime)).or_default();
        slot.size = size;
        let keep = (size as usize).min(slot.ready.len());
        slot.ready.drain(keep..).collect()
    }

    /// Notes pools that cannot fill because their template does not exist (yet).
    fn mark_unbuilt(&self, built: &HashSet<String>) {
        for ((name, _), slot) in self.slots().iter_mut().filter(|((n, _), s)| s.size > 0 && !built.contains(n)) {
            slot.last_error = Some(format!("template {name:?} is not built; build or import it to fill this pool"));
        }
    }

    fn status(&self) -> PoolStatus {
        let templates = self
            .slots()
            .iter()
            .map(|((name, runtime), s)| TemplatePool {
                template: name.clone(),
                runtime: *runtime,
                size: s.size,
                ready: s.ready.len() as u32,
                filling: s.filling,
                hits: s.hits,
                misses: s.misses,
                failures: s.failures,
                last_error: s.last_error.clone(),
            })
            .collect();
        PoolStatus {
            max_filling: self.max_filling,
            filling: self.filling.load(Ordering::SeqCst),
            peak_filling: self.peak_filling.load(Ordering::SeqCst),
            pending_deletions: 0,
            templates,
        }
    }
}

impl Node {
    /// Starts the loop that keeps the warm pool filled.
    pub(crate) fn start_warm_pool(self: &Arc<Self>) {
        let node = self.clone();
        tokio::spawn(async move {
            loop {
                node.fill_pool();
                // `notify_one` keeps a permit when nobody waits, so no wake-up is lost.
                let _ = tokio::time::timeout(IDLE_RECHECK, node.warm.wake.notified()).await;
            }
        });
    }

    /// Starts as many preparations as the pool wants and its ceiling allows.
    fn fill_pool(self: &Arc<Self>) {
        let built: HashSet<String> = self.templates().into_iter().map(|t| t.name).collect();
        self.warm.mark_unbuilt(&built);
        while let Some((key, permit)) = self.warm.next_job(&built) {
            let node = self.clone();
            tokio::spawn(async move {
                let (name, runtime) = &key;
                let outcome = match node.resolve_template(name) {
                    Some(template) => node.prepare_pod(&template, *runtime).await,
                    None => Err(format!("template {name:?} disappeared")),
                };
                let failed = outcome.is_err();
                if let Some(pod) = node.warm.finish_job(&key, outcome) {
                    node.discard_pod(pod);
                }
                if failed {
                    tokio::time::sleep(RETRY_AFTER_FAILURE).await;
                }
                drop(permit);
                node.warm.wake.notify_one();
            });
        }
    }

    async fn prepare_pod(&self, template: &TemplateInfo, runtime: RuntimeKind) -> Result<Pod, String> {
        let id = SandboxId::generate();
        match self.start_pod(&id, template, runtime).await {
            Ok(handle) => {
                self.warm_up(&id).await;
                Ok(Pod { handle, version: template.version })
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, template = %template.name, error = %e, "preparing a pod failed");
                if let Err(e) = self.destroy_sandbox(&id).await {
                    tracing::warn!(sandbox = %id, error = %e, "cleaning up a failed pod");
                }
                Err(format!("preparing a {runtime} pod of {}: {e}", template.name))
            }
        }
    }

    /// Runs a shell once in the pod. A new root is a new btrfs subvolume whose files share
    /// no page cache or dentries with the template's, and a new `spaced` has never forked:
    /// without this, the session's first command pays for all of it (~3 ms here). The
    /// process is then forgotten, so the session's process list starts empty.
    async fn warm_up(&self, id: &SandboxId) {
        let spec = ExecSpec {
            argv: ["/bin/sh", "-c", "true"].map(String::from).to_vec(),
            timeout_ms: Some(WARM_UP_TIMEOUT_MS),
            ..ExecSpec::default()
        };
        let result = async {
            let agent = self.agent(id).await.map_err(|e| e.to_string())?;
            let ran = match agent.exec(spec).await {
                Ok(session) => session.wait_with_output(0).await.map(drop),
                Err(e) => Err(e),
            };
            agent.forget_exited().await.map_err(|e| e.to_string())?;
            ran.map_err(|e| e.to_string())
        };
        if let Err(e) = result.await {
            // A template without /bin/sh still makes a working pod, just a colder one.
            tracing::debug!(sandbox = %id, error = %e, "warming up a pod");
        }
    }

    fn discard_pod(self: &Arc<Self>, pod: Pod) {
        let node = self.clone();
        tokio::spawn(async move {
            if let Err(e) = node.destroy_sandbox(&pod.handle.id).await {
                tracing::warn!(sandbox = %pod.handle.id, error = %e, "destroying a discarded pod");
            }
        });
    }

    /// Binds a ready pod of `template` to a caller, applying `limits`. `None` means the pool
    /// had none (or could not fit the limits): take the cold path.
    pub fn bind_pod(
        self: &Arc<Self>,
        template: &TemplateInfo,
        runtime: RuntimeKind,
        limits: Limits,
    ) -> Option<SandboxHandle> {
        let (pod, stale) = self.warm.take(template, runtime, |h| self.is_alive(h));
        for pod in stale {
            self.discard_pod(pod);
        }
        self.refill_soon();
        let pod = pod?;
        if limits != self.warm.pod_limits
            && let Err(e) =
                self.runtimes.of_handle(&pod.handle).and_then(|r| Ok(r.set_limits(&pod.handle.id, &limits)?))
        {
            tracing::warn!(sandbox = %pod.handle.id, error = %e, "cannot apply limits to a pod; starting cold");
            self.discard_pod(pod);
            return None;
        }
        Some(pod.handle)
    }

    /// Refills after a short pause: the caller that just took a pod is about to run its first
    /// commands, and a preparation (snapshot, process start) competing with them for the CPU
    /// would cost them more than the pause costs the pool.
    fn refill_soon(self: &Arc<Self>) {
        let node = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REFILL_PAUSE).await;
            node.warm.wake.notify_one();
        });
    }

    /// Changes how many ready pods of `runtime` the node keeps for `template`.
    pub fn set_pool_size(self: &Arc<Self>, template: &str, runtime: RuntimeKind, size: u32) {
        for pod in self.warm.resize(template, runtime, size.min(MAX_POOL_SIZE)) {
            self.discard_pod(pod);
        }
        self.warm.wake.notify_one();
    }

    pub fn pool_status(&self) -> PoolStatus {
        PoolStatus { pending_deletions: self.pending_deletions(), ..self.warm.status() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(sizes: &[(&str, u32)], max_filling: u32) -> WarmSettings {
        WarmSettings {
            sizes: sizes.iter().map(|(n, s)| ((n.to_string(), RuntimeKind::Linux), *s)).collect(),
            max_filling,
            pod_limits: Limits { memory_mib: 512, millicpus: 1000, pids: 512 },
        }
    }

    fn pod(version: u64) -> Pod {
        let id = SandboxId::generate();
        Pod { handle: SandboxHandle { id, runtime: RuntimeKind::Linux, pid: 1 }, version }
    }

    fn template(name: &str, version: u64) -> TemplateInfo {
        TemplateInfo {
            name: name.into(),
            version,
            created_at_ms: 0,
            source: String::new(),
            size_bytes: 0,
            digest: None,
            defaults: None,
        }
    }

    fn built(names: &[&str]) -> HashSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn jobs_respect_the_ceiling_and_the_sizes() {
        let pool = WarmPool::new(&settings(&[("a", 3), ("b", 1), ("unbuilt", 5)], 2));
        let built = built(&["a", "b"]);
        let first = pool.next_job(&built).unwrap();
        let second = pool.next_job(&built).unwrap();
        assert!(pool.next_job(&built).is_none(), "a third job ran past the ceiling of 2");
        assert_eq!(first.0.0, "a", "the template missing most pods goes first");
        drop(first.1);
        assert!(pool.finish_job(&first.0, Ok(pod(1))).is_none());
        drop(second.1);
        assert!(pool.finish_job(&second.0, Ok(pod(1))).is_none());
        let status = pool.status();
        assert_eq!(status.peak_filling, 2);
        assert_eq!(status.filling, 0);
        let ready: u32 = status.templates.iter().map(|t| t.ready).sum();
        assert_eq!(ready, 2);
    }

    #[test]
    fn a_pod_is_taken_once() {
        let pool = WarmPool::new(&settings(&[("a", 2)], 1));
        pool.resize("a", RuntimeKind::Linux, 2);
        for _ in 0..2 {
            let (name, permit) = pool.next_job(&built(&["a"])).unwrap();
            drop(permit);
            pool.finish_job(&name, Ok(pod(1)));
        }
        let t = template("a", 1);
        let (one, _) = pool.take(&t, RuntimeKind::Linux, |_| true);
        let (two, _) = pool.take(&t, RuntimeKind::Linux, |_| true);
        let (three, _) = pool.take(&t, RuntimeKind::Linux, |_| true);
        assert_ne!(one.unwrap().handle.id, two.unwrap().handle.id);
        assert!(three.is_none());
        let status = &pool.status().templates[0];
        assert_eq!((status.hits, status.misses), (2, 1));
    }

    #[test]
    fn stale_and_dead_pods_are_discarded() {
        let pool = WarmPool::new(&settings(&[("a", 3)], 3));
        for version in [1, 2, 2] {
            let (name, permit) = pool.next_job(&built(&["a"])).unwrap();
            drop(permit);
            pool.finish_job(&name, Ok(pod(version)));
        }
        let (taken, stale) = pool.take(&template("a", 2), RuntimeKind::Linux, |_| true);
        assert_eq!(taken.unwrap().version, 2);
        assert_eq!(stale.len(), 1);
        let (taken, dead) = pool.take(&template("a", 2), RuntimeKind::Linux, |_| false);
        assert!(taken.is_none());
        assert_eq!(dead.len(), 1);
    }

    #[test]
    fn shrinking_returns_the_extra_pods_and_full_pools_refuse_more() {
        let pool = WarmPool::new(&settings(&[("a", 2)], 2));
        let jobs: Vec<_> = (0..2).map(|_| pool.next_job(&built(&["a"])).unwrap()).collect();
        pool.resize("a", RuntimeKind::Linux, 1);
        let mut returned = 0;
        for (name, permit) in jobs {
            drop(permit);
            returned += usize::from(pool.finish_job(&name, Ok(pod(1))).is_some());
        }
        assert_eq!(returned, 1, "the second pod exceeds the new size");
        pool.resize("a", RuntimeKind::Linux, 3);
        assert_eq!(pool.resize("a", RuntimeKind::Linux, 0).len(), 1);
        assert!(pool.next_job(&built(&["a"])).is_none());
    }

    #[test]
    fn failures_are_counted_with_their_reason() {
        let pool = WarmPool::new(&settings(&[("a", 1)], 1));
        let (name, _permit) = pool.next_job(&built(&["a"])).unwrap();
        pool.finish_job(&name, Err("boom".into()));
        let status = &pool.status().templates[0];
        assert_eq!(status.failures, 1);
        assert_eq!(status.last_error.as_deref(), Some("boom"));
    }

    #[test]
    fn pools_of_unbuilt_templates_say_so() {
        let pool = WarmPool::new(&settings(&[("later", 1)], 1));
        assert!(pool.next_job(&built(&[])).is_none());
        pool.mark_unbuilt(&built(&[]));
        assert!(pool.status().templates[0].last_error.as_deref().unwrap().contains("not built"));
    }
}
