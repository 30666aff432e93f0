//! Template names per tenant. A tenant's template `web` is kept on the nodes as
//! `<scope>..web`, where the scope is a digest of the tenant's id; the operator's (the admin
//! key's) templates keep their plain names and are global: every tenant sees and uses them.
//! A name a user gives never holds `..` (see `check_name`), so a node name holds one exactly
//! when it is a tenant's. A tenant's own template comes first: its `busybox` hides the global
//! one from it, and from no one else.

use sha2::{Digest, Sha256};
use space_api::TenantId;
use space_node_api::{NodeApi, TemplateInfo};

use crate::auth::Caller;

/// What separates a tenant's scope from the name it gave.
const SEPARATOR: &str = "..";

/// The scope of `tenant`'s templates: 12 hex digits of its id's digest (short, so that a
/// tenant's names may be nearly as long as the operator's).
fn scope(tenant: &TenantId) -> String {
    hex::encode(&Sha256::digest(tenant.as_str().as_bytes())[..6])
}

/// The node name a template `name` made by `caller` gets: global for the admin, scoped for
/// a tenant.
pub fn node_name(caller: &Caller, name: &str) -> String {
    match caller.admin {
        true => name.to_owned(),
        false => format!("{}{SEPARATOR}{name}", scope(&caller.tenant_id)),
    }
}

/// Whether node template `node_name` is global (the operator's), not a tenant's own.
pub fn is_global(node_name: &str) -> bool {
    !node_name.contains(SEPARATOR)
}

/// The name `tenant` sees for node template `node_name`, and whether it is global; `None`
/// when it is another tenant's.
pub fn visible(tenant: &TenantId, node_name: &str) -> Option<(String, bool)> {
    match node_name.split_once(SEPARATOR) {
        None => Some((node_name.to_owned(), true)),
        Some((owner, name)) if owner == scope(tenant) => Some((name.to_owned(), false)),
        Some(_) => None,
    }
}

/// `tenant`'s own template `name` on `node`, if it has one.
pub async fn own(node: &dyn NodeApi, tenant: &TenantId, name: &str) -> Option<TemplateInfo> {
    node.resolve_template(&format!("{}{SEPARATOR}{name}", scope(tenant))).await
}

/// The template `tenant`'s `name` means on `node`: its own if it has one, else the global one
/// of that name (`None`: neither is there).
pub async fn find(node: &dyn NodeApi, tenant: &TenantId, name: &str) -> Option<TemplateInfo> {
    match own(node, tenant, name).await {
        Some(info) => Some(info),
        None => node.resolve_template(name).await,
    }
}

/// The node name `tenant`'s `name` means on `node`: its own, else the global name (which the
/// caller builds if it is a built-in not built yet). One question to the node.
pub async fn resolve(node: &dyn NodeApi, tenant: &TenantId, name: &str) -> String {
    own(node, tenant, name).await.map_or_else(|| name.to_owned(), |info| info.name)
}

/// The prefix of `caller`'s own node names (none for the admin, whose names are global), for
/// a build's `FROM` to find the caller's templates first.
pub fn prefix(caller: &Caller) -> Option<String> {
    (!caller.admin).then(|| format!("{}{SEPARATOR}", scope(&caller.tenant_id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(id: &str, admin: bool) -> Caller {
        Caller { tenant_id: id.parse().unwrap(), tenant: "t".into(), admin, scope: None }
    }

    #[test]
    fn tenants_see_their_own_and_the_global_templates() {
        let (acme, other) = (caller(&TenantId::generate().to_string(), false), TenantId::generate());
        let own = node_name(&acme, "web");
        assert!(own.ends_with("..web") && own.len() == 12 + 2 + 3, "{own}");
        assert!(space_storage_name_ok(&own), "{own}");
        assert_eq!(visible(&acme.tenant_id, &own), Some(("web".into(), false)));
        assert_eq!(visible(&other, &own), None);
        assert_eq!(visible(&other, "busybox"), Some(("busybox".into(), true)));
        let admin = caller(&TenantId::generate().to_string(), true);
        assert_eq!(node_name(&admin, "web"), "web");
        assert_eq!(prefix(&admin), None);
        assert_eq!(prefix(&acme).map(|p| format!("{p}web")), Some(own));
    }

    /// The node's rule for template names (space-storage): what a scoped name must pass.
    fn space_storage_name_ok(name: &str) -> bool {
        name.len() <= 63
            && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
    }
}
