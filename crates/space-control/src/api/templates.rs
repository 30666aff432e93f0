//! Templates: list, import (a root filesystem or an OCI image), build a built-in one, delete.

use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use space_api::error::echo;
use space_api::{
    BuildTemplateRequest, ErrorBody, ErrorCode, ImportTemplateRequest, Operation, Template, TemplateDeleted,
    TemplateList, TemplateScope, TemplateSource,
};
use space_node_api::TemplateInfo;
use space_store::{NewOperation, OperationKind, SessionFilter};
use utoipa::IntoParams;

use crate::AppState;
use crate::auth::{Admin, Caller};
use crate::error::{ApiJson, ApiPath, ApiQuery, AppError, AppResult};
use crate::template_work::TemplateInput;

/// `info` as `tenant` sees it (`None`: another tenant's).
pub(crate) fn visible_view(tenant: &space_api::TenantId, info: &TemplateInfo) -> Option<Template> {
    let (name, global) = crate::template_scope::visible(tenant, &info.name)?;
    let scope = if global { TemplateScope::Global } else { TemplateScope::Own };
    Some(Template { name, scope, ..template_view(info) })
}

fn template_view(info: &TemplateInfo) -> Template {
    Template {
        scope: TemplateScope::Global,
        name: info.name.clone(),
        version: info.version as u32,
        created_at: info.created_at_ms as i64,
        size_bytes: info.size_bytes,
        source: info.source.clone(),
        digest: info.digest.clone(),
        defaults: info.defaults.clone(),
    }
}

/// The global templates and the caller's own.
#[utoipa::path(get, path = "/v1/templates", responses((status = 200, body = TemplateList), (status = 503, body = ErrorBody)))]
pub async fn list_templates(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> AppResult<ApiJson<TemplateList>> {
    let templates = crate::placement::first_answer(&state, |node| async move { node.templates().await }).await?;
    Ok(ApiJson(TemplateList {
        templates: templates.iter().filter_map(|t| visible_view(&caller.tenant_id, t)).collect(),
        builtin: state.nodes.first().builtin_templates(),
        default_template: state.default_template.clone(),
        upload_max_bytes: state.http.template_upload_max_bytes,
    }))
}

/// Queues a template operation for the admin `caller`.
pub(crate) async fn queue(
    state: &AppState,
    caller: &Caller,
    kind: OperationKind,
    input: TemplateInput,
) -> AppResult<Operation> {
    queue_as(state, caller, kind, input, None).await
}

/// [`queue`], under operation id `id` when given (one handed out before).
pub(crate) async fn queue_as(
    state: &AppState,
    caller: &Caller,
    kind: OperationKind,
    input: TemplateInput,
    id: Option<space_api::OperationId>,
) -> AppResult<Operation> {
    let new = NewOperation {
        tenant_id: caller.tenant_id.clone(),
        session_id: None,
        kind,
        input: Some(serde_json::to_string(&input).unwrap_or_default()),
    };
    let id = match id {
        Some(id) => state.store.insert_operation_as(&id, &new).await.map(|()| id)?,
        None => state.store.insert_operation(&new).await?,
    };
    state.reconciler.wake();
    // Answer quickly: clients follow long builds through GET /v1/operations/{id}.
    state.reconciler.wait(state, &caller.tenant_id, &id, Duration::from_millis(200)).await
}

pub(crate) fn check_name(name: &str) -> AppResult<()> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
        && !name.contains("..");
    if valid {
        Ok(())
    } else {
        Err(AppError::bad_request(
            "template names are 1-63 characters: lowercase letters, digits, '-', '_', '.' (no '..')",
        ))
    }
}

/// The node name of the template `name` `caller` makes (its own: global for the admin), once
/// `name` is checked.
pub(crate) fn own_name(caller: &Caller, name: &str) -> AppResult<String> {
    check_name(name)?;
    let node_name = crate::template_scope::node_name(caller, name);
    if node_name.len() > 63 {
        let most = 63 - (node_name.len() - name.len());
        return Err(AppError::bad_request(format!("a tenant's template names are at most {most} characters")));
    }
    Ok(node_name)
}

/// What an import of `request` by `caller` queues. The caller is checked first: what exists on
/// the server's host is the admin's to learn, never a tenant's.
fn import_input(caller: &Caller, request: ImportTemplateRequest) -> AppResult<TemplateInput> {
    if !caller.admin {
        return Err(AppError::new(ErrorCode::Forbidden, "only the admin key can import templates"));
    }
    check_name(&request.name)?;
    let source = TemplateSource::parse(&request.path);
    let Some(path) = source.host_path() else {
        // A registry reference: the node pulls it, so only its form is checked here.
        space_image::RegistryRef::parse(&request.path)
            .map_err(|e| AppError::bad_request(format!("{e}: write docker://HOST[:PORT]/REPOSITORY[:TAG]")))?;
        return Ok(TemplateInput { name: request.name, path: Some(request.path), uploaded: None, build: None });
    };
    if !path.is_absolute() {
        return Err(AppError::bad_request(
            "path must be an absolute path on the server's host, optionally after oci: or docker-archive:",
        ));
    }
    if !path.exists() {
        return Err(AppError::bad_request(format!(
            "{} does not exist on the server's host",
            echo(&path.to_string_lossy())
        )));
    }
    Ok(TemplateInput { name: request.name, path: Some(request.path), uploaded: None, build: None })
}

/// Imports a root filesystem (directory or tarball) or an OCI image (`oci:DIR[:TAG]`,
/// `docker-archive:FILE` on the server's host, or `docker://REFERENCE` pulled from a registry)
/// as a new template version. Returns the operation; follow it with `GET /v1/operations/{id}`.
#[utoipa::path(post, path = "/v1/templates/import", request_body = ImportTemplateRequest,
    responses((status = 202, body = Operation), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn import_template(
    State(state): State<AppState>,
    Admin(caller): Admin,
    ApiJson(request): ApiJson<ImportTemplateRequest>,
) -> AppResult<(StatusCode, ApiJson<Operation>)> {
    let input = import_input(&caller, request)?;
    let op = queue(&state, &caller, OperationKind::ImportTemplate, input).await?;
    Ok((StatusCode::ACCEPTED, ApiJson(op)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteParams {
    /// The version to delete; every version when absent.
    pub version: Option<u32>,
    /// Delete even while sessions use it.
    #[serde(default)]
    pub force: bool,
}

/// The sessions (not destroyed) that use one of `versions` of `name`: placed on one of them,
/// or not placed yet when the newest is among them (they would take it). A tenant's template
/// is only its own sessions'.
async fn sessions_using(
    state: &AppState,
    caller: &Caller,
    name: &str,
    versions: &[u32],
    newest: u32,
) -> AppResult<Vec<String>> {
    let tenant = (!caller.admin).then(|| caller.tenant_id.clone());
    let filter = SessionFilter { tenant, template: Some(name.to_owned()), ..SessionFilter::default() };
    let sessions = state.store.list_sessions(&filter).await?;
    let uses = |v: Option<u32>| v.map_or(versions.contains(&newest), |v| versions.contains(&v));
    Ok(sessions.into_iter().filter(|s| uses(s.template_version)).map(|s| s.id.to_string()).collect())
}

/// Deletes a template's version (or all its versions) on every node: a tenant its own, the
/// admin the global ones. Refused with 409 while sessions use it, unless `force`.
#[utoipa::path(delete, path = "/v1/templates/{name}", params(("name" = String, Path), DeleteParams),
    responses((status = 200, body = TemplateDeleted), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn delete_template(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<DeleteParams>,
) -> AppResult<ApiJson<TemplateDeleted>> {
    let node_name = own_name(&caller, &name)?;
    let all = crate::placement::first_answer(&state, |node| async move { node.templates().await }).await?;
    let existing: Vec<u32> = all.iter().filter(|t| t.name == node_name).map(|t| t.version as u32).collect();
    if existing.is_empty() && !caller.admin && all.iter().any(|t| t.name == name) {
        return Err(AppError::new(
            ErrorCode::Forbidden,
            format!("{} is a global template: only the operator (the admin key) deletes it", echo(&name)),
        ));
    }
    let versions: Vec<u32> = existing.iter().copied().filter(|v| params.version.is_none_or(|w| w == *v)).collect();
    let Some(&newest) = existing.iter().max().filter(|_| !versions.is_empty()) else {
        let which = params.version.map(|v| format!("{name}@{v}")).unwrap_or_else(|| name.clone());
        return Err(AppError::new(
            ErrorCode::NotFound,
            format!("there is no template {}: `space template list` shows them", echo(&which)),
        ));
    };
    let in_use_by = sessions_using(&state, &caller, &name, &versions, newest).await?;
    if !in_use_by.is_empty() && !params.force {
        let shown: Vec<&str> = in_use_by.iter().take(5).map(String::as_str).collect();
        return Err(AppError::new(
            ErrorCode::Conflict,
            format!(
                "{} session(s) use this template ({}{}): destroy them first, or pass force=true \
                 (`space template delete --force`); they keep running, but one that must start afresh \
                 from its template can no longer",
                in_use_by.len(),
                shown.join(", "),
                if in_use_by.len() > shown.len() { ", ..." } else { "" }
            ),
        ));
    }
    // Recorded first: a node that misses the delete (it is down) has it finished when a
    // control plane starts, and never gives the version back to the others.
    for version in &versions {
        state.store.record_template_deleted(&node_name, u64::from(*version)).await?;
    }
    let mut failed = None;
    for (_, node) in state.nodes.iter() {
        for version in &versions {
            if let Err(e) = node.delete_template(&node_name, u64::from(*version)).await {
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    tracing::info!(template = %node_name, ?versions, forced = !in_use_by.is_empty(), "deleted template");
    Ok(ApiJson(TemplateDeleted { name, versions, in_use_by }))
}

/// Builds (or rebuilds from cache) a built-in template.
#[utoipa::path(post, path = "/v1/templates/build", request_body = BuildTemplateRequest,
    responses((status = 202, body = Operation), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn build_template(
    State(state): State<AppState>,
    Admin(caller): Admin,
    ApiJson(request): ApiJson<BuildTemplateRequest>,
) -> AppResult<(StatusCode, ApiJson<Operation>)> {
    if !state.nodes.first().is_builtin(&request.name) {
        return Err(AppError::new(
            ErrorCode::UnknownTemplate,
            format!(
                "{} is not a built-in template; built-ins: {}",
                echo(&request.name),
                state.nodes.first().builtin_templates().join(", ")
            ),
        ));
    }
    let input = TemplateInput { name: request.name, path: None, uploaded: None, build: None };
    let op = queue(&state, &caller, OperationKind::BuildTemplate, input).await?;
    Ok((StatusCode::ACCEPTED, ApiJson(op)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(admin: bool) -> Caller {
        Caller { tenant_id: space_api::TenantId::generate(), tenant: "t".into(), admin, scope: None }
    }

    /// A tenant learns nothing about the host's files: the same 403 whether the path exists.
    #[test]
    fn imports_check_the_caller_before_the_host_path() {
        for path in ["/nonexistent-space-test", "/etc", "relative", ""] {
            let request = ImportTemplateRequest { name: "BAD NAME".into(), path: path.into() };
            let error = import_input(&caller(false), request).unwrap_err();
            assert_eq!(error.0.code, ErrorCode::Forbidden, "{path}: {}", error.0.message);
        }
        let request = ImportTemplateRequest { name: "t".into(), path: "/nonexistent-space-test".into() };
        let error = import_input(&caller(true), request).unwrap_err();
        assert!(error.0.message.contains("does not exist"), "the admin is told: {}", error.0.message);
    }
}
