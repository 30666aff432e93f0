//! Booted templates that warm-pool pods start from, for the runtimes that keep them
//! ([`Runtime::keeps_pod_templates`]): a VM's saved memory, which every pod maps copy-on-write,
//! so that a pod starts by a restore instead of a boot and an idle one holds only the pages it
//! changed.
//!
//! One per template name and runtime, of the version pods are asked for: made on that
//! version's first pod (one boot and save), replaced when a newer version's pod is prepared.
//! Its disk is a file beside the template images (`<name>@<version>.<runtime>-pod.img`);
//! every pod's disk is a reflink of it, as the saved memory (the guest's page cache) expects.
//! Not kept across node restarts, since the memory lives in this process: the first pod
//! afterwards makes the template again, over what the last one left.

use std::path::PathBuf;
use std::sync::Arc;

use space_api::{RuntimeKind, SandboxId};
use space_runtime::{PodTemplate, RootDisk, Runtime, SandboxHandle, SandboxSpec};
use space_storage::TemplateInfo;

use crate::warm::PoolKey;
use crate::{Node, NodeError, Result, blocking, hostname_for};

/// What was made for the pods of one template version.
pub(crate) struct Made {
    version: u64,
    /// The disk every pod's is a copy of.
    disk: PathBuf,
    /// `None`: making it failed, and this version's pods boot like any sandbox.
    template: Option<PodTemplate>,
}

pub(crate) type PodTemplates = tokio::sync::Mutex<std::collections::HashMap<PoolKey, Arc<Made>>>;

impl Node {
    /// Starts pod `id` of `template` in `runtime`: from the version's pod template where the
    /// runtime keeps them (made now if there is none yet), else like any sandbox.
    pub(crate) async fn start_pod(
        &self,
        id: &SandboxId,
        template: &TemplateInfo,
        runtime: RuntimeKind,
    ) -> Result<SandboxHandle> {
        let limits = self.warm.pod_limits;
        let made = match self.pod_template(template, runtime).await? {
            Some(made) if made.template.is_some() => made,
            _ => return self.start_sandbox(id, template, runtime, limits, &hostname_for(id), None).await,
        };
        let (pool, pod, disk) = (self.pool.clone(), id.clone(), made.disk.clone());
        let root = blocking(move || Ok(pool.create_sandbox_image_root(&pod, &disk)?)).await?;
        self.boot(id, runtime, RootDisk::Image(root), limits, &hostname_for(id), made.template.as_ref()).await
    }

    /// The pod template of `template` for `runtime`, made if there is none of its version;
    /// `None` when the runtime keeps none.
    async fn pod_template(&self, template: &TemplateInfo, runtime: RuntimeKind) -> Result<Option<Arc<Made>>> {
        let rt = self.runtimes.get(runtime)?.clone();
        if !rt.keeps_pod_templates() {
            return Ok(None);
        }
        let mut made = self.pod_templates.lock().await;
        let key = (template.name.clone(), runtime);
        if let Some(current) = made.get(&key).filter(|m| m.version == template.version) {
            return Ok(Some(current.clone()));
        }
        let fresh = Arc::new(self.make_pod_template(template, runtime, &*rt).await?);
        if let Some(old) = made.insert(key, fresh.clone()) {
            self.retire_pod_template(&old).await;
        }
        Ok(Some(fresh))
    }

    async fn make_pod_template(&self, template: &TemplateInfo, runtime: RuntimeKind, rt: &dyn Runtime) -> Result<Made> {
        let image = self.template_image(template).await?;
        let name = format!("{}@{}.{runtime}-pod.img", template.name, template.version);
        let disk = image.with_file_name(name);
        let (source, target) = (image.clone(), disk.clone());
        blocking(move || {
            remove_if_there(&target)?; // what a template of an earlier run left
            Ok(space_storage::reflink(&source, &target)?)
        })
        .await?;
        let id = SandboxId::generate();
        let spec = SandboxSpec {
            id: id.clone(),
            root: RootDisk::Image(disk.clone()),
            hostname: hostname_for(&id),
            limits: self.warm.pod_limits,
        };
        let started = std::time::Instant::now();
        let made = match rt.make_pod_template(&spec).await {
            Ok(made) => {
                tracing::info!(template = %template.name, version = template.version, %runtime,
                    took_ms = started.elapsed().as_millis() as u64, "made a pod template");
                Some(made)
            }
            Err(e) => {
                tracing::warn!(template = %template.name, version = template.version, %runtime, error = %e,
                    "cannot make a pod template; this version's pods boot like any sandbox");
                None
            }
        };
        Ok(Made { version: template.version, disk, template: made })
    }

    /// Removes an older version's template disk (its memory goes with the last pod start
    /// that still holds it).
    async fn retire_pod_template(&self, old: &Made) {
        let disk = old.disk.clone();
        if let Err(e) = blocking(move || remove_if_there(&disk)).await {
            tracing::warn!(disk = %old.disk.display(), error = %e, "removing an old pod template's disk");
        }
    }
}

fn remove_if_there(path: &std::path::Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(NodeError::Internal(format!("remove {}: {e}", path.display())))
        }
        _ => Ok(()),
    }
}
