//! Template work the reconciler runs: builds and imports on every node, an upload sent to
//! each node that does not share the control plane's host, and built-in templates prepared
//! at start.

use space_api::{OperationId, Progress};
use space_node_api::{NodeApi, ProgressFn, TemplateInfo};
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

/// Builds (or imports) the template on every node, then removes the upload it read, if any.
pub(crate) async fn build_template(state: &AppState, op: &OperationRecord) -> AppResult<()> {
    let input: TemplateInput = serde_json::from_str(op.input.as_deref().unwrap_or(""))
        .map_err(|e| AppError::internal(format!("bad template operation input: {e}")))?;
    let result = build_everywhere(state, op, &input).await;
    if let Some(upload) = &input.uploaded {
        crate::api::template_uploads::remove(upload);
    }
    result
}

/// Builds (or imports) the template on every node, one after the other: a session may be
/// placed on any of them. An upload (or a build's context) is sent to each node that does not
/// share this host, and removed there once its work ends; an import's path is read on each
/// node's host.
async fn build_everywhere(state: &AppState, op: &OperationRecord, input: &TemplateInput) -> AppResult<()> {
    for (_, node) in state.nodes.iter() {
        let staged = match &input.uploaded {
            Some(upload) => Some(node.stage_file(upload).await?),
            None => None,
        };
        let built = build_on(state, node.as_ref(), op, input, staged.as_deref()).await;
        if let Some(staged) = &staged
            && let Err(e) = node.unstage_file(staged).await
        {
            tracing::warn!(node = %node.node_id(), path = %staged.display(), error = %e,
                "could not remove a file sent to a node; it goes at the node's next start");
        }
        built?;
    }
    Ok(())
}

/// Builds (or imports) the template on `node`, reading the upload at `staged` (its path on
/// the node's host).
async fn build_on(
    state: &AppState,
    node: &dyn NodeApi,
    op: &OperationRecord,
    input: &TemplateInput,
    staged: Option<&std::path::Path>,
) -> AppResult<()> {
    if let Some(build) = &input.build {
        let mut build = build.clone();
        if let Some(staged) = staged {
            build.context = Some(staged.to_owned());
        }
        return crate::build_logs::build(state, node, &op.operation.id, &input.name, &build).await;
    }
    let Some(path) = &input.path else {
        return ensure_template(state, node, &op.operation.id, &input.name).await.map(drop);
    };
    let mut source = space_api::TemplateSource::parse(path);
    if let Some(staged) = staged {
        source = source.with_host_path(staged.to_owned());
    }
    node.import_template(&input.name, &source, recorded_progress(state, &op.operation.id)).await?;
    Ok(())
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
