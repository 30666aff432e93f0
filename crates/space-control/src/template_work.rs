//! Template work the reconciler runs: builds and imports on every node, an upload sent to
//! each node that does not share the control plane's host, and built-in templates prepared
//! at start.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use space_api::{OperationId, Progress};
use space_node_api::{NodeApi, NodeError, ProgressFn, TemplateExport, TemplateInfo};
use space_store::{NewOperation, OperationKind, OperationRecord};

use crate::AppState;
use crate::auth::ADMIN_TENANT;
use crate::error::{AppError, AppResult};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct TemplateInput {
    pub name: String,
    pub path: Option<String>,
    /// An upload the import reads (`POST /v1/templates/uploads`), removed once the operation
    /// ends, however it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploaded: Option<std::path::PathBuf>,
    /// A Dockerfile build (its context is the upload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<space_api::TemplateBuild>,
}

/// Builds (or imports) the template on every node, then removes the upload it read, if any
/// (also when the work panicked).
pub(crate) async fn build_template(state: &AppState, op: &OperationRecord) -> AppResult<()> {
    let input: TemplateInput = serde_json::from_str(op.input.as_deref().unwrap_or(""))
        .map_err(|e| AppError::internal(format!("bad template operation input: {e}")))?;
    let _upload = input.uploaded.clone().map(crate::api::template_uploads::Removal::new);
    build_everywhere(state, op, &input).await
}

/// Builds (or imports) the template on every node, one after the other: a session may be
/// placed on any of them. A global template imported or built from a Dockerfile is made on
/// the first node only when the nodes have a blob store: the others import that node's
/// export of it, so every node runs the same files (a tenant's own templates stay out of the
/// blob store, and are built on each node). An upload (or a build's context) is sent to each
/// node that builds and does not share this host, and removed there once its work ends; an
/// import's path is read on each node's host.
async fn build_everywhere(state: &AppState, op: &OperationRecord, input: &TemplateInput) -> AppResult<()> {
    // A built-in (neither imported nor built from a Dockerfile) each node builds itself.
    let made = input.path.is_some() || input.build.is_some();
    let travels = made && state.nodes.len() > 1 && crate::template_scope::is_global(&input.name);
    let mut export: Option<TemplateExport> = None;
    for (i, (id, node)) in state.nodes.iter().enumerate() {
        if let Some(export) = &export {
            match node.import_template_export(export).await {
                Ok(_) => continue,
                Err(e) => tracing::warn!(node = %id, error = %e,
                    "could not import the template from the blob store; building it on the node"),
            }
        }
        let built = build_staged(state, node, op, input).await?;
        if i == 0 {
            // A version deleted before and made again is no longer deleted.
            state.store.forget_template_deleted(&built.name, built.version).await?;
            if travels {
                export = export_built(node.as_ref(), &built).await;
            }
        }
    }
    Ok(())
}

/// Builds (or imports) the template on `node`, with the upload sent there first.
async fn build_staged(
    state: &AppState,
    node: &Arc<dyn NodeApi>,
    op: &OperationRecord,
    input: &TemplateInput,
) -> AppResult<TemplateInfo> {
    let staged = match &input.uploaded {
        Some(upload) => Some(Staged { node: node.clone(), path: Some(node.stage_file(upload).await?) }),
        None => None,
    };
    let built = build_on(state, node.as_ref(), op, input, staged.as_ref().and_then(|s| s.path.as_deref())).await;
    if let Some(staged) = staged {
        staged.remove().await;
    }
    built
}

/// A file sent to a node for its template work: removed there by [`Staged::remove`], or, if
/// the work panicked first, when dropped.
struct Staged {
    node: Arc<dyn NodeApi>,
    path: Option<PathBuf>,
}

impl Staged {
    async fn remove(mut self) {
        if let Some(path) = self.path.take() {
            unstage(self.node.as_ref(), &path).await;
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let node = self.node.clone();
            tokio::spawn(async move { unstage(node.as_ref(), &path).await });
        }
    }
}

async fn unstage(node: &dyn NodeApi, path: &std::path::Path) {
    if let Err(e) = node.unstage_file(path).await {
        tracing::warn!(node = %node.node_id(), path = %path.display(), error = %e,
            "could not remove a file sent to a node; the node removes it within a day, or at its next start");
    }
}

/// The blob store's copy of template `built`, just made on `node`; `None` when the node has
/// no blob store or the export failed (logged): each node then builds the template itself.
async fn export_built(node: &dyn NodeApi, built: &TemplateInfo) -> Option<TemplateExport> {
    if !crate::template_scope::is_global(&built.name) {
        return None;
    }
    match node.export_template(&built.name, built.version).await {
        Ok(export) => Some(export),
        Err(NodeError::NoBlobStore) => None,
        Err(e) => {
            tracing::warn!(template = %format!("{}@{}", built.name, built.version), error = %e,
                "could not export the template to the blob store; each node builds it");
            None
        }
    }
}

/// Builds (or imports) the template on `node`, reading the upload at `staged` (its path on
/// the node's host); what it made.
async fn build_on(
    state: &AppState,
    node: &dyn NodeApi,
    op: &OperationRecord,
    input: &TemplateInput,
    staged: Option<&std::path::Path>,
) -> AppResult<TemplateInfo> {
    if let Some(build) = &input.build {
        let mut build = build.clone();
        if let Some(staged) = staged {
            build.context = Some(staged.to_owned());
        }
        return crate::build_logs::build(state, node, &op.operation.id, &input.name, &build).await;
    }
    let Some(path) = &input.path else {
        return ensure_template(state, node, &op.operation.id, &input.name).await;
    };
    let mut source = space_api::TemplateSource::parse(path);
    if let Some(staged) = staged {
        source = source.with_host_path(staged.to_owned());
    }
    Ok(node.import_template(&input.name, &source, recorded_progress(state, &op.operation.id)).await?)
}

/// Finishes the template deletes a node missed (it was down), then gives every node the newest
/// version of each global template that another node has and it lacks (a node added after
/// that template was made), through the blob store: one export per template, one import per
/// node that lacks it. Nodes whose lease ran out are left out; built-ins are left to each
/// node, which builds them; without a blob store nothing moves, and placement passes such a
/// node over for those templates.
pub async fn share_templates(state: AppState) {
    if state.nodes.len() < 2 {
        return;
    }
    let (Ok(deleted), Ok(lost)) = (state.store.deleted_templates().await, crate::placement::lost_nodes(&state).await)
    else {
        return tracing::warn!("could not read the deleted templates or the nodes: templates are not shared now");
    };
    let deleted: HashSet<(String, u64)> = deleted.into_iter().collect();
    let mut held = Vec::new();
    for (id, node) in state.nodes.iter().filter(|(id, _)| !lost.contains(*id)) {
        let templates = node.templates().await;
        finish_deletes(id, node.as_ref(), &templates, &deleted).await;
        let newest = newest_global(node.as_ref(), templates, &deleted);
        held.push((id.to_owned(), node.clone(), newest));
    }
    let mut wanted: BTreeMap<String, (TemplateInfo, Arc<dyn NodeApi>)> = BTreeMap::new();
    for (_, node, newest) in &held {
        for info in newest.values() {
            if wanted.get(&info.name).is_none_or(|(w, _)| w.version < info.version) {
                wanted.insert(info.name.clone(), (info.clone(), node.clone()));
            }
        }
    }
    for (name, (info, holder)) in wanted {
        let lacking: Vec<_> =
            held.iter().filter(|(_, _, newest)| newest.get(&name).is_none_or(|t| t.version < info.version)).collect();
        if lacking.is_empty() {
            continue;
        }
        let Some(export) = export_built(holder.as_ref(), &info).await else { continue };
        for (id, node, _) in lacking {
            match node.import_template_export(&export).await {
                Ok(_) => tracing::info!(node = %id, template = %format!("{name}@{}", info.version),
                    "gave the node a template another node has"),
                Err(e) => tracing::warn!(node = %id, template = %name, error = %e,
                    "could not give the node a template another node has"),
            }
        }
    }
}

/// Deletes from `node` (which has `templates`) the template versions deleted through the API
/// while it was down.
async fn finish_deletes(id: &str, node: &dyn NodeApi, templates: &[TemplateInfo], deleted: &HashSet<(String, u64)>) {
    for info in templates {
        if deleted.contains(&(info.name.clone(), info.version)) {
            match node.delete_template(&info.name, info.version).await {
                Ok(_) => tracing::info!(node = %id, template = %format!("{}@{}", info.name, info.version),
                    "finished a template delete the node missed"),
                Err(e) => tracing::warn!(node = %id, template = %info.name, error = %e,
                    "could not finish a template delete the node missed"),
            }
        }
    }
}

/// The newest version of each global template of `templates` (`node`'s) that is not a
/// built-in nor deleted, by name.
fn newest_global(
    node: &dyn NodeApi,
    templates: Vec<TemplateInfo>,
    deleted: &HashSet<(String, u64)>,
) -> BTreeMap<String, TemplateInfo> {
    let mut newest = BTreeMap::new();
    for info in templates {
        if deleted.contains(&(info.name.clone(), info.version)) {
            continue;
        }
        let newer = newest.get(&info.name).is_none_or(|t: &TemplateInfo| t.version < info.version);
        if newer && crate::template_scope::is_global(&info.name) && !node.is_builtin(&info.name) {
            newest.insert(info.name.clone(), info);
        }
    }
    newest
}

/// Queues builds of built-in templates that some node misses.
pub async fn prepare_templates(state: &AppState, names: &[String]) -> AppResult<()> {
    let tenant = state.store.ensure_tenant(ADMIN_TENANT).await?;
    for name in names {
        if missing_nowhere(state, name).await {
            continue;
        }
        let input = TemplateInput { name: name.clone(), path: None, uploaded: None, build: None };
        let input = serde_json::to_string(&input).unwrap_or_default();
        let new = NewOperation {
            tenant_id: tenant.clone(),
            session_id: None,
            kind: OperationKind::BuildTemplate,
            input: Some(input),
        };
        state.store.insert_operation(&new).await?;
    }
    state.reconciler.wake();
    Ok(())
}

/// Whether every node has template `name`.
async fn missing_nowhere(state: &AppState, name: &str) -> bool {
    for (_, node) in state.nodes.iter() {
        if node.resolve_template(name).await.is_none() {
            return false;
        }
    }
    true
}

pub(crate) async fn ensure_template(
    state: &AppState,
    node: &dyn NodeApi,
    op: &OperationId,
    name: &str,
) -> AppResult<TemplateInfo> {
    Ok(node.ensure_template(name, recorded_progress(state, op)).await?)
}

/// Records a template operation's progress as the node reports it.
fn recorded_progress(state: &AppState, op: &OperationId) -> ProgressFn {
    let store = state.store.clone();
    let op = op.clone();
    Box::new(move |p: Progress| {
        let store = store.clone();
        let op = op.clone();
        tokio::spawn(async move {
            let _ = store.set_operation_progress(&op, &p).await;
        });
    })
}
