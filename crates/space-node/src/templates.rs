//! Template management: resolve, build built-ins on first use (once, even when many sessions
//! ask at the same time), import.

use space_api::{Progress, TemplateSource};
use space_storage::{BUILTINS, TemplateInfo};

use crate::{Node, NodeError, Result, blocking, progress_channel};

fn to_api(p: space_storage::Progress) -> Progress {
    Progress { phase: p.phase, done: p.done, total: p.total }
}

impl Node {
    pub fn templates(&self) -> Vec<TemplateInfo> {
        self.pool.templates().list().unwrap_or_default()
    }

    /// Newest version of template `name`, if built.
    pub fn resolve_template(&self, name: &str) -> Option<TemplateInfo> {
        self.pool.templates().resolve(name).ok().flatten()
    }

    pub fn builtin_names(&self) -> &'static [&'static str] {
        &BUILTINS
    }

    /// Names a session can ask for: built templates and built-ins, sorted, without repeats.
    pub fn available_templates(&self) -> Vec<String> {
        let mut available: Vec<String> = self.templates().into_iter().map(|t| t.name).collect();
        available.extend(BUILTINS.iter().map(|s| s.to_string()));
        available.sort();
        available.dedup();
        available
    }

    pub fn is_builtin(&self, name: &str) -> bool {
        BUILTINS.contains(&name)
    }

    /// The newest version of `name`, building it first if it is a built-in not built yet.
    pub async fn ensure_template(
        &self,
        name: &str,
        report: impl Fn(Progress) + Send + 'static,
    ) -> Result<TemplateInfo> {
        if let Some(info) = self.resolve_template(name) {
            return Ok(info);
        }
        if !self.is_builtin(name) {
            return Err(NodeError::UnknownTemplate {
                name: name.to_owned(),
                available: self.available_templates().join(", "),
            });
        }
        let lock = self.template_builds.lock().await.entry(name.to_owned()).or_default().clone();
        let _guard = lock.lock().await;
        if let Some(info) = self.resolve_template(name) {
            return Ok(info);
        }
        let pool = self.pool.clone();
        let cache = self.config.template_cache_dir.clone();
        let name = name.to_owned();
        let tx = progress_channel(report);
        blocking(move || {
            let progress = move |p: space_storage::Progress| {
                let _ = tx.send(to_api(p));
            };
            Ok(pool.templates().build_builtin(&name, Some(&cache), &progress)?)
        })
        .await
    }

    /// Deletes one version of template `name`; whether it existed.
    pub async fn delete_template(&self, name: &str, version: u64) -> Result<bool> {
        let pool = self.pool.clone();
        let name = name.to_owned();
        blocking(move || Ok(pool.templates().delete(&name, version)?)).await
    }

    /// Imports a root filesystem or an OCI image on this host as a new version of template
    /// `name`.
    pub async fn import_template(
        &self,
        name: &str,
        source: &TemplateSource,
        report: impl Fn(Progress) + Send + 'static,
    ) -> Result<TemplateInfo> {
        let pool = self.pool.clone();
        let (name, source) = (name.to_owned(), source.clone());
        let tx = progress_channel(report);
        let pulled = match &source {
            TemplateSource::Registry { reference } => {
                let sender = tx.clone();
                let report = move |phase: String, done, total| {
                    let _ = sender.send(Progress { phase, done, total });
                };
                Some(self.pull_image(reference, report).await?)
            }
            _ => None,
        };
        blocking(move || {
            let progress = move |p: space_storage::Progress| {
                let _ = tx.send(to_api(p));
            };
            let store = pool.templates();
            Ok(match pulled {
                Some(image) => store.import_image(&name, &image, &source, &progress)?,
                None => store.import(&name, &source, &progress)?,
            })
        })
        .await
    }

    /// The image `reference` names in a registry, pulled (blobs cached by digest).
    pub(crate) async fn pull_image(
        &self,
        reference: &str,
        report: impl Fn(String, u64, Option<u64>) + Send + Sync,
    ) -> Result<space_image::Image> {
        let reference = space_image::RegistryRef::parse(reference).map_err(space_storage::StorageError::from)?;
        let cache = self.config.template_cache_dir.join("images");
        Ok(space_image::pull(&reference, &cache, &report).await.map_err(space_storage::StorageError::from)?)
    }
}
