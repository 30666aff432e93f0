//! The simulated warm pool: pods are sandboxes started ahead of demand, filled at once (no
//! background work to wait for) but only after the node's background work started, as on a
//! real node, whose start-up sweep would otherwise destroy them.

use std::collections::{BTreeMap, VecDeque};

use space_api::{PoolStatus, RuntimeKind, SandboxId, TemplateInfo, TemplatePool};
use space_node_api::{MAX_POOL_SIZE, SandboxHandle};

use crate::State;
use crate::agent::Contents;

#[derive(Debug, Default)]
struct Slot {
    size: u32,
    /// Pods and the template version each was started from.
    ready: VecDeque<(SandboxHandle, u64)>,
    hits: u64,
    misses: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Pool {
    slots: BTreeMap<(String, RuntimeKind), Slot>,
}

impl Pool {
    pub(crate) fn new(sizes: &BTreeMap<(String, RuntimeKind), u32>) -> Pool {
        let slots = sizes.iter().map(|(key, size)| (key.clone(), Slot { size: *size, ..Slot::default() }));
        Pool { slots: slots.collect() }
    }

    pub(crate) fn holds(&self, id: &SandboxId) -> bool {
        self.slots.values().any(|s| s.ready.iter().any(|(pod, _)| &pod.id == id))
    }

    pub(crate) fn forget(&mut self, id: &SandboxId) {
        for slot in self.slots.values_mut() {
            slot.ready.retain(|(pod, _)| &pod.id != id);
        }
    }

    pub(crate) fn status(&self) -> PoolStatus {
        let templates = self.slots.iter().map(|((name, runtime), slot)| TemplatePool {
            template: name.clone(),
            runtime: *runtime,
            size: slot.size,
            ready: slot.ready.len() as u32,
            filling: 0,
            hits: slot.hits,
            misses: slot.misses,
            failures: 0,
            last_error: None,
        });
        PoolStatus { max_filling: 1, templates: templates.collect(), ..PoolStatus::default() }
    }
}

impl State {
    /// Starts the pods every built template's pool lacks.
    pub(crate) fn refill(&mut self) {
        if !self.background {
            return;
        }
        let wanted: Vec<((String, RuntimeKind), u32)> =
            self.pool.slots.iter().map(|(key, slot)| (key.clone(), slot.size)).collect();
        for (key, size) in wanted {
            let Some(template) = self.newest_template(&key.0) else { continue };
            while self.pool.slots.get(&key).is_some_and(|s| (s.ready.len() as u32) < size) {
                let id = SandboxId::generate();
                let contents = Contents::new_root(&format!("{}@{}", key.0, template.version));
                let Ok(pod) = self.boot(&id, key.1, contents) else {
                    break;
                };
                if let Some(slot) = self.pool.slots.get_mut(&key) {
                    slot.ready.push_back((pod, template.version));
                }
            }
        }
    }

    /// A ready pod of exactly `template`'s version; older ones found on the way are destroyed.
    pub(crate) fn take_pod(&mut self, template: &TemplateInfo, runtime: RuntimeKind) -> Option<SandboxHandle> {
        let sandboxes = &self.sandboxes;
        let slot = self.pool.slots.get_mut(&(template.name.clone(), runtime))?;
        let mut found = None;
        let mut stale = Vec::new();
        while let Some((pod, version)) = slot.ready.pop_front() {
            if version == template.version && sandboxes.get(&pod.id).is_some_and(|s| s.alive()) {
                found = Some(pod);
                break;
            }
            stale.push(pod.id);
        }
        match found {
            Some(_) => slot.hits += 1,
            None => slot.misses += 1,
        }
        for id in stale {
            self.destroy(&id);
        }
        self.refill();
        found
    }

    pub(crate) fn resize_pool(&mut self, template: &str, runtime: RuntimeKind, size: u32) {
        let slot = self.pool.slots.entry((template.to_owned(), runtime)).or_default();
        slot.size = size.min(MAX_POOL_SIZE);
        let surplus = slot.ready.len().saturating_sub(slot.size as usize);
        let removed: Vec<SandboxId> = slot.ready.drain(..surplus).map(|(pod, _)| pod.id).collect();
        for id in removed {
            self.destroy(&id);
        }
        self.refill();
    }
}
