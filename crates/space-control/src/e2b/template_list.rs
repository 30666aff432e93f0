//! E2B's calls about existing templates: list them, check a name, delete one. What they
//! see is what `GET /v1/templates` shows the caller (the global templates and its own),
//! one entry per name, its versions counted as builds.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Serialize;
use space_api::{Resources, Template, TemplateScope};

use super::errors::{E2bError, E2bResult};
use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiPath, ApiQuery};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateOut {
    #[serde(rename = "templateID")]
    template_id: String,
    /// Its newest version.
    #[serde(rename = "buildID")]
    build_id: String,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    public: bool,
    aliases: Vec<String>,
    names: Vec<String>,
    created_at: String,
    updated_at: String,
    created_by: Option<()>,
    last_spawned_at: Option<String>,
    spawn_count: u64,
    build_count: u32,
    envd_version: &'static str,
    build_status: &'static str,
}

/// The templates the caller may start from, each name once (newest version).
async fn visible(state: &AppState, caller: &Caller) -> E2bResult<BTreeMap<String, Vec<Template>>> {
    let all = crate::placement::first_answer(state, |node| async move { node.templates().await }).await?;
    let mut named: BTreeMap<String, Vec<Template>> = BTreeMap::new();
    for template in all.iter().filter_map(|t| crate::api::templates::visible_view(&caller.tenant_id, t)) {
        named.entry(template.name.clone()).or_default().push(template);
    }
    // A tenant's own template of a name is the one its creates start from: the global one of
    // that name is not the caller's to see through it.
    for versions in named.values_mut() {
        if versions.iter().any(|t| t.scope == TemplateScope::Own) {
            versions.retain(|t| t.scope == TemplateScope::Own);
        }
    }
    Ok(named)
}

/// `GET /templates`, `GET /v2/templates`.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> E2bResult<Json<Vec<TemplateOut>>> {
    let defaults = Resources::default();
    let out = visible(&state, &caller)
        .await?
        .into_iter()
        .filter_map(|(name, versions)| {
            let newest = versions.iter().max_by_key(|t| t.version)?;
            let oldest = versions.iter().map(|t| t.created_at).min().unwrap_or(newest.created_at);
            Some(TemplateOut {
                template_id: name.clone(),
                build_id: newest.version.to_string(),
                cpu_count: defaults.cpus.ceil() as u32,
                memory_mb: defaults.memory_mib,
                disk_size_mb: newest.size_bytes.div_ceil(1 << 20),
                public: newest.scope == TemplateScope::Global,
                aliases: vec![name.clone()],
                names: vec![name],
                created_at: super::rfc3339(oldest),
                updated_at: super::rfc3339(newest.created_at),
                created_by: None,
                last_spawned_at: None,
                spawn_count: 0,
                build_count: versions.len() as u32,
                envd_version: super::ENVD_VERSION,
                build_status: "ready",
            })
        })
        .collect();
    Ok(Json(out))
}

#[derive(Debug, Serialize)]
pub struct AliasOut {
    #[serde(rename = "templateID")]
    template_id: String,
    public: bool,
}

/// `GET /templates/aliases/{alias}` (the SDK's `Template.exists`).
pub async fn alias(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(alias): ApiPath<String>,
) -> E2bResult<Json<AliasOut>> {
    let named = visible(&state, &caller).await?;
    let versions = named.get(&alias).ok_or_else(|| {
        E2bError::not_found(format!("no template {}: `space template list` shows them", space_api::error::clip(&alias)))
    })?;
    let public = versions.iter().any(|t| t.scope == TemplateScope::Global);
    Ok(Json(AliasOut { template_id: alias, public }))
}

/// `DELETE /templates/{id}` of a template (a snapshot's id deletes the snapshot, see
/// [`super::snapshots::delete`]): every version of the caller's own template of that name,
/// refused (409) while sessions use it.
pub async fn delete_template(state: AppState, caller: Caller, name: String) -> E2bResult<StatusCode> {
    let params = crate::api::templates::DeleteParams { version: None, force: false };
    crate::api::templates::delete_template(State(state), Extension(caller), ApiPath(name), ApiQuery(params)).await?;
    Ok(StatusCode::NO_CONTENT)
}
