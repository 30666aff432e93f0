//! The control plane's side of the egress gateway: what each session may reach and which
//! credentials it holds, loaded from the store, unsealed, and pushed to the node's gateway;
//! and the writer that stores the gateway's audit events (and deletes them after the
//! retention period).
//!
//! Credential values and CA keys exist in clear only in memory, inside the
//! [`space_gateway::SessionEgress`] handed to the gateway. They are never logged or returned.

use std::collections::BTreeMap;

use space_api::egress::{AuditEvent, CredentialKind, NetworkPolicy};
use space_api::error::echo;
use space_api::{CredentialId, ErrorCode, Session, SessionId, SessionState, TenantId};
use space_gateway::{Grant, SessionCa, SessionEgress, placeholder_for};
use space_node_api::EgressControl;
use space_store::{CredentialRecord, NewSession, NewSessionEgress, OperationRecord, SessionEgressRecord, Store};

use crate::AppState;
use crate::error::{AppError, AppResult};
use crate::keyring::Keyring;

pub mod ca_stock;

/// Audit events written per transaction at most.
const AUDIT_BATCH: usize = 512;
/// Old audit events deleted per transaction at most.
const AUDIT_PRUNE_BATCH: u32 = 5000;
/// How often old audit events are deleted.
const AUDIT_PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);
/// Longest credential name.
pub const MAX_CREDENTIAL_NAME: usize = 64;
/// Longest credential value.
pub const MAX_CREDENTIAL_VALUE: usize = 8 * 1024;
/// Longest header template.
const MAX_HEADER: usize = 8 * 1024;
/// Most hosts per credential and grants per session.
const MAX_HOSTS: usize = space_api::egress::MAX_POLICY_ENTRIES;
/// Headers the gateway must not be asked to set: they frame or route the request.
const RESERVED_HEADERS: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
];

/// What pushing a session's egress needs: the store, the keys and the nodes' gateways.
/// Apart from [`AppState`] so that it works without a node.
#[derive(Clone, Copy)]
pub struct Egress<'a> {
    pub store: &'a Store,
    pub keys: &'a Keyring,
    pub oauth: &'a crate::oauth::Broker,
    pub gateways: &'a dyn Gateways,
    /// Whether an `oauth2` credential without a usable token asks its token endpoint now
    /// (one user's request) or goes out without one until the refresher has it (pushes of
    /// many sessions, which one tenant's slow endpoint must not hold up).
    pub ask: bool,
}

/// Which gateway holds a session's egress: that of the node it is placed on, and no other
/// (a node learns a session's credentials only when it runs the session).
pub trait Gateways: Send + Sync {
    /// The gateway of node `node`, the one a session is placed on; `None` for a session
    /// not placed yet, whose egress is pushed when it is (see [`push_placed`]).
    fn gateway(&self, node: Option<&str>) -> Option<&dyn EgressControl>;
}

impl Gateways for crate::nodes::Nodes {
    /// A control plane with one node places every session there: its gateway gets a new
    /// session's egress at once, off the create's path.
    fn gateway(&self, node: Option<&str>) -> Option<&dyn EgressControl> {
        let node = match node {
            Some(id) => self.find(id)?,
            None if self.len() == 1 => self.first(),
            None => return None,
        };
        Some(node.as_ref())
    }
}

impl AppState {
    pub fn egress(&self) -> Egress<'_> {
        Egress { store: &self.store, keys: &self.keys, oauth: &self.oauth, gateways: &self.nodes, ask: true }
    }

    /// [`AppState::egress`] that never waits for a token endpoint.
    pub fn egress_cached(&self) -> Egress<'_> {
        Egress { ask: false, ..self.egress() }
    }
}

/// After `session` was placed (its sandbox recorded on a node), pushes its egress to that
/// node's gateway, before its sandbox starts. With one node there is nothing to do: the
/// egress was pushed when the session was recorded. Grants that cannot be unsealed are left
/// out (and logged) as at every push; the sandbox starts without them.
pub async fn push_placed(state: &AppState, session: &SessionId) -> AppResult<()> {
    if state.nodes.len() == 1 {
        return Ok(());
    }
    state.egress().push(session).await.map(drop)
}

/// Associated data that binds a credential's sealed value to its tenant and id.
pub fn credential_owner(tenant: &TenantId, id: &CredentialId) -> String {
    format!("credential/{tenant}/{id}")
}

/// Associated data that binds a session CA's sealed key to its session.
pub fn ca_owner(session: &SessionId) -> String {
    format!("session-ca/{session}")
}

pub fn credential_not_found(name: &str) -> AppError {
    let usable = if validate_credential_name(name).is_ok() { name } else { "NAME" };
    AppError::new(
        ErrorCode::CredentialNotFound,
        format!(
            "credential {} not found; `space credential list` shows yours, and \
             `space credential create {usable} --host HOST --header 'Authorization: Bearer {{secret}}'` \
             (value on stdin) creates one",
            echo(name)
        ),
    )
}

/// Letters, digits, `-`, `_`, `.`; starts with a letter or digit; at most 64.
pub fn validate_credential_name(name: &str) -> AppResult<()> {
    let valid = !name.is_empty()
        && name.len() <= MAX_CREDENTIAL_NAME
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        return Ok(());
    }
    Err(AppError::bad_request(format!(
        "invalid credential name {}: use 1-{MAX_CREDENTIAL_NAME} letters, digits, '-', '_' or '.', starting with a letter or digit",
        echo(name)
    )))
}

/// Lower-cased host patterns, at least one. Wildcards (`*.example.com`) only when the operator
/// allows them (`space serve --allow-wildcard-credential-hosts`): a wildcard sends the value to
/// any name under the domain, including ones a sandbox user can create or take over.
pub fn validate_hosts(hosts: &[String], allow_wildcards: bool) -> AppResult<Vec<String>> {
    if hosts.is_empty() {
        return Err(AppError::bad_request(
            "a credential needs at least one host it may be sent to (e.g. --host api.github.com)",
        ));
    }
    if hosts.len() > MAX_HOSTS {
        return Err(AppError::bad_request(format!("at most {MAX_HOSTS} hosts per credential")));
    }
    let mut out: Vec<String> = Vec::new();
    for host in hosts {
        let host = host.to_ascii_lowercase();
        space_api::egress::validate_host_pattern(&host).map_err(|e| AppError::bad_request(format!("hosts: {e}")))?;
        if host.starts_with("*.") && !allow_wildcards {
            return Err(AppError::bad_request(format!(
                "hosts: {host:?} would send the credential to every name under {}; name each host exactly \
                 (e.g. api.github.com), or have the operator start the server with \
                 --allow-wildcard-credential-hosts",
                &host[2..]
            )));
        }
        if !out.contains(&host) {
            out.push(host);
        }
    }
    Ok(out)
}

/// `Name: value with {secret}` → (name, value template).
pub fn parse_header(header: &str) -> AppResult<(String, String)> {
    let bad = |why: &str| {
        AppError::bad_request(format!(
            "invalid header {}: {why}; write it like 'Authorization: Bearer {{secret}}'",
            echo(header)
        ))
    };
    if header.len() > MAX_HEADER {
        return Err(bad("too long"));
    }
    let (name, value) = header.split_once(':').ok_or_else(|| bad("expected `Name: value`"))?;
    let name = name.trim();
    if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() || name.is_empty() {
        return Err(bad(&format!("{} is not a valid header name", echo(name))));
    }
    if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(bad(&format!("the gateway does not set the {name} header")));
    }
    let value = value.trim();
    if !value.contains("{secret}") {
        return Err(bad("the value must contain {secret} where the credential goes"));
    }
    if axum::http::HeaderValue::from_str(&value.replace("{secret}", "x")).is_err() {
        return Err(bad("the value has control characters"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// Non-empty, at most 8 KiB, usable in a header.
pub fn validate_value(value: &str) -> AppResult<()> {
    if value.is_empty() {
        return Err(AppError::bad_request("the credential value is empty"));
    }
    if value.len() > MAX_CREDENTIAL_VALUE {
        return Err(AppError::bad_request(format!(
            "the credential value has {} bytes; at most {MAX_CREDENTIAL_VALUE} are allowed",
            value.len()
        )));
    }
    if value.contains(['\r', '\n']) {
        return Err(AppError::bad_request(
            "the credential value contains a line break (CR or LF); a header value cannot hold one",
        ));
    }
    if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(AppError::bad_request("the credential value contains control characters"));
    }
    Ok(())
}

/// Variables a placeholder must not take over, beyond those the gateway sets: what `spaced`
/// sets for every command, and what changes which programs run or what they load and run
/// first (a shell's startup file, an interpreter's module path or options).
const RESERVED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "TERM",
    "SHELL",
    "IFS",
    "ENV",
    "BASH_ENV",
    "CDPATH",
    "GLIBC_TUNABLES",
    "GCONV_PATH",
    "LOCPATH",
    "HOSTALIASES",
    "RESOLV_HOST_CONF",
    "ALL_PROXY",
    "FTP_PROXY",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PERL5LIB",
    "PERL5OPT",
    "RUBYLIB",
    "RUBYOPT",
    "JAVA_TOOL_OPTIONS",
];
/// Prefixes of reserved variables: the dynamic loader's (`LD_PRELOAD`, `LD_LIBRARY_PATH`, …)
/// and bash's exported functions.
const RESERVED_ENV_PREFIXES: &[&str] = &["LD_", "BASH_FUNC_"];

/// A valid environment variable name that changes nothing about how programs in the sandbox
/// run. Compared without regard to case: lowercase `http_proxy` is honoured too, and zsh
/// ties `path` to `PATH`.
pub fn validate_env_name(name: &str) -> AppResult<()> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(AppError::bad_request(format!(
            "invalid placeholder_env {}: use letters, digits and '_', not starting with a digit (e.g. GITHUB_TOKEN)",
            echo(name)
        )));
    }
    let upper = name.to_ascii_uppercase();
    if space_gateway::sandbox_env().keys().any(|set| set.eq_ignore_ascii_case(name)) {
        return Err(AppError::bad_request(format!(
            "placeholder_env {name:?} is set by the gateway (proxy and CA settings); choose another, e.g. GITHUB_TOKEN"
        )));
    }
    if RESERVED_ENV.contains(&upper.as_str()) || RESERVED_ENV_PREFIXES.iter().any(|p| upper.starts_with(p)) {
        return Err(AppError::bad_request(format!(
            "placeholder_env {name:?} would change how programs in the sandbox run (search path, loader, shell or \
             interpreter settings); choose a name of your own, e.g. GITHUB_TOKEN"
        )));
    }
    Ok(())
}

/// Splits a header template and puts the value in.
fn render(credential: &space_api::egress::Credential, secret: &str) -> AppResult<(String, String)> {
    let (name, template) = parse_header(&credential.header)?;
    Ok((name, template.replace("{secret}", secret)))
}

/// `e` with what it was about in front, keeping its code (a key that is unavailable stays
/// `key_unavailable`).
fn about(what: &str, e: AppError) -> AppError {
    AppError::new(e.0.code, format!("{what}: {}", e.0.message))
}

/// What the gateway injects for a credential: a static one's value unsealed, an `oauth2`
/// one's current access token (asked for if needed; without one, the grant says why and its
/// hosts get 502).
async fn grant_of(egress: Egress<'_>, record: &CredentialRecord) -> AppResult<Grant> {
    let c = &record.credential;
    let (secret, unavailable) = match c.kind {
        CredentialKind::Static => (static_value(egress.keys, record).await?, None),
        CredentialKind::Oauth2 => {
            match egress.oauth.access_token(egress.store, egress.keys, record, egress.ask).await {
                Ok(token) => (token.to_string(), None),
                Err(reason) => (String::new(), Some(reason)),
            }
        }
    };
    let (header_name, header_value) = render(c, &secret)?;
    Ok(Grant {
        credential_id: c.id.clone(),
        credential: c.name.clone(),
        hosts: c.hosts.clone(),
        header_name,
        header_value,
        secret,
        placeholder: c.placeholder_env.as_ref().map(|_| placeholder_for(&c.name)),
        expires_at: c.expires_at,
        rate_limit_per_min: c.rate_limit_per_min,
        unavailable,
    })
}

async fn static_value(keys: &Keyring, record: &CredentialRecord) -> AppResult<String> {
    let c = &record.credential;
    let value = keys
        .open(&record.value_sealed, &credential_owner(&record.tenant_id, &c.id))
        .await
        .map_err(|e| about(&format!("credential {:?}", c.name), e))?;
    String::from_utf8(value.to_vec())
        .map_err(|_| AppError::internal(format!("credential {:?}: the stored value is not text", c.name)))
}

/// Unseals every one of `records`, or fails with the first that does not open.
async fn grants_of(egress: Egress<'_>, records: &[CredentialRecord]) -> AppResult<Vec<Grant>> {
    let mut grants = Vec::with_capacity(records.len());
    for record in records {
        grants.push(grant_of(egress, record).await?);
    }
    Ok(grants)
}

/// `session`'s CA key sealed for it with `tenant`'s key.
async fn seal_ca(keys: &Keyring, tenant: &TenantId, session: &SessionId, ca: &SessionCa) -> AppResult<Vec<u8>> {
    keys.seal(tenant, ca.key_pem.as_bytes(), &ca_owner(session)).await
}

async fn open_ca(keys: &Keyring, session: &SessionId, cert: &str, key_sealed: &[u8]) -> AppResult<SessionCa> {
    let key = keys
        .open(key_sealed, &ca_owner(session))
        .await
        .map_err(|e| about(&format!("session {session}'s certificate authority"), e))?;
    let key_pem = String::from_utf8(key.to_vec())
        .map_err(|_| AppError::internal(format!("session {session}'s CA key is not PEM")))?;
    Ok(SessionCa { cert_pem: cert.to_owned(), key_pem })
}

/// The credentials named in a create request, or 404 for the first unknown one.
async fn resolve_grants(state: &AppState, tenant: &TenantId, names: &[String]) -> AppResult<Vec<CredentialRecord>> {
    if names.len() > MAX_HOSTS {
        return Err(AppError::bad_request(format!("at most {MAX_HOSTS} grants")));
    }
    let mut records: Vec<CredentialRecord> = Vec::new();
    for name in names {
        let record = state.store.credential(tenant, name).await?.ok_or_else(|| credential_not_found(name))?;
        if !records.iter().any(|r| r.credential.id == record.credential.id) {
            records.push(record);
        }
    }
    Ok(records)
}

/// Placeholder variables of `grants`, added to `env` unless it sets them already.
fn add_placeholders(env: &mut BTreeMap<String, String>, grants: &[CredentialRecord]) {
    for record in grants {
        if let Some(name) = &record.credential.placeholder_env {
            env.entry(name.clone()).or_insert_with(|| placeholder_for(&record.credential.name));
        }
    }
}

/// A new session's network policy, checked (400) and lowercased, and the credentials its
/// `grants` name, found (404): what [`insert_new_session`] records.
pub struct NewEgress {
    policy: NetworkPolicy,
    grants: Vec<CredentialRecord>,
}

/// Checks a new session's `policy` and `grants` of `tenant` before anything is made for it.
pub async fn check_new_egress(
    state: &AppState,
    tenant: &TenantId,
    policy: Option<NetworkPolicy>,
    grants: &[String],
) -> AppResult<NewEgress> {
    let mut policy = policy.unwrap_or_default();
    policy.validate().map_err(|e| AppError::bad_request(format!("network: {e}")))?;
    for list in [&mut policy.allow, &mut policy.deny] {
        for p in list.iter_mut() {
            *p = p.to_ascii_lowercase();
        }
    }
    Ok(NewEgress { policy, grants: resolve_grants(state, tenant, grants).await? })
}

/// Records a new session (see [`space_store::Store::insert_session_with_egress`]) with its CA
/// `ca` (made for `new.id`, see [`ca_stock`]) and `egress`, after pushing its egress to the
/// gateway (so it is there before any sandbox starts). Placeholders of the grants are added
/// to `new.env`. Returns the create operation, claimed by this replica: the caller runs it
/// ([`crate::reconciler::Reconciler::perform_here`]).
pub async fn insert_new_session(
    state: &AppState,
    new: &mut NewSession,
    ca: SessionCa,
    egress: NewEgress,
    idempotency_key: Option<String>,
) -> AppResult<OperationRecord> {
    let NewEgress { policy, grants: records } = egress;
    add_placeholders(&mut new.env, &records);
    let key_sealed = seal_ca(&state.keys, &new.tenant_id, &new.id, &ca).await?;
    let gateway_grants = grants_of(state.egress(), &records).await?;
    let stored = NewSessionEgress {
        egress: SessionEgressRecord {
            policy: policy.clone(),
            ca_cert: Some(ca.cert_pem.clone()),
            ca_key_sealed: Some(key_sealed),
        },
        grants: records.iter().map(|r| r.credential.id.clone()).collect(),
        inherited_from: None,
        idempotency_key,
    };
    state.egress().insert(new, &stored, SessionEgress { policy, ca, grants: gateway_grants }).await
}

/// Records the sessions of a fork of `parent`, all or none: see [`Egress::insert_forks`].
pub async fn insert_forked_sessions(
    state: &AppState,
    parent: &SessionId,
    news: &[NewSession],
) -> AppResult<Vec<space_api::OperationId>> {
    state.egress().insert_forks(parent, news).await
}

/// Loads `session`'s policy, CA and grants from the store, unseals them and hands them to
/// the gateway; a destroyed (or unknown) session is forgotten instead. Call after every
/// change: policy, grant, revoke, and any change of a credential the session holds.
///
/// A grant whose value cannot be unsealed is left out (the rest still applies) and reported
/// as the error.
pub async fn push_session(state: &AppState, session: &SessionId) -> AppResult<()> {
    let left_out = state.egress().push(session).await?;
    left_out.into_iter().next().map_or(Ok(()), |(_, e)| Err(e))
}

/// [`push_session`] for pushes of many sessions: no token endpoint is asked (an OAuth
/// credential without a usable token waits for the refresher).
pub async fn push_session_cached(state: &AppState, session: &SessionId) -> AppResult<()> {
    let left_out = state.egress_cached().push(session).await?;
    left_out.into_iter().next().map_or(Ok(()), |(_, e)| Err(e))
}

impl Egress<'_> {
    /// Records a session forked from `parent`: see [`Egress::insert_forks`].
    pub async fn insert_fork(self, parent: &SessionId, new: &NewSession) -> AppResult<space_api::OperationId> {
        let mut ops = self.insert_forks(parent, std::slice::from_ref(new)).await?;
        ops.pop().ok_or_else(|| AppError::internal("a fork recorded no operation"))
    }

    /// Records sessions forked from `parent`, in one transaction (so a fork that would go
    /// over the tenant's quota creates none): each keeps the parent's policy, grants and CA
    /// (its processes may already trust that CA). The grants are recorded as inherited from
    /// `parent`, so revoking one there revokes it here too until the fork is detached or
    /// granted that credential itself (see [`Store::revoke`]).
    pub async fn insert_forks(self, parent: &SessionId, news: &[NewSession]) -> AppResult<Vec<space_api::OperationId>> {
        let record =
            self.store.session_egress(parent).await?.ok_or_else(|| AppError::session_not_found(parent.as_str()))?;
        let ca = match (&record.ca_cert, &record.ca_key_sealed) {
            (Some(cert), Some(key)) => open_ca(self.keys, parent, cert, key).await?,
            _ => ca_stock::make_for(parent)?,
        };
        let grants = self.store.session_grants(parent).await?;
        let gateway_grants = grants_of(self, &grants).await?;
        let mut stored = Vec::new();
        for new in news {
            let key_sealed = self.keys.seal(&new.tenant_id, ca.key_pem.as_bytes(), &ca_owner(&new.id)).await?;
            stored.push(NewSessionEgress {
                egress: SessionEgressRecord {
                    policy: record.policy.clone(),
                    ca_cert: Some(ca.cert_pem.clone()),
                    ca_key_sealed: Some(key_sealed),
                },
                grants: grants.iter().map(|r| r.credential.id.clone()).collect(),
                inherited_from: Some(parent.clone()),
                idempotency_key: None,
            });
        }
        // Forks are placed on their parent's node, where its snapshots are.
        let placed = self.store.session_any(parent).await?.and_then(|r| r.session.node);
        let gateway = self.gateways.gateway(placed.as_deref());
        if let Some(gateway) = gateway {
            for new in news {
                let egress =
                    SessionEgress { policy: record.policy.clone(), ca: ca.clone(), grants: gateway_grants.clone() };
                gateway.set_session_egress(&new.id, egress).await?;
            }
        }
        let pairs: Vec<_> = news.iter().zip(&stored).collect();
        match self.store.insert_sessions_with_egress(&pairs).await {
            Ok(ops) => Ok(ops),
            Err(e) => {
                for new in news {
                    forget_quietly(gateway, &new.id).await;
                }
                Err(e.into())
            }
        }
    }

    /// Records `new` with `stored`, after handing `egress` to the gateway of the node it will
    /// be placed on if that is known now (so it is there before any sandbox starts; else
    /// [`push_placed`] does it); the gateway forgets it again if the store refuses. Its create
    /// operation is this replica's to run at once.
    async fn insert(
        self,
        new: &NewSession,
        stored: &NewSessionEgress,
        egress: SessionEgress,
    ) -> AppResult<OperationRecord> {
        let gateway = self.gateways.gateway(None);
        if let Some(gateway) = gateway {
            gateway.set_session_egress(&new.id, egress).await?;
        }
        let lease = crate::replicas::lease_ms(crate::nodes::LEASE);
        match self.store.insert_session_to_run(new, stored, lease).await {
            Ok(op) => Ok(op),
            Err(e) => {
                forget_quietly(gateway, &new.id).await;
                Err(e.into())
            }
        }
    }

    /// Revokes `credential` from `session` and from the forks that inherited the grant from
    /// it (see [`Store::revoke`]), and pushes each of them. Returns those sessions, `session`
    /// first; empty if `session` does not hold the grant. Every session is pushed even when
    /// one push fails; the first failure is returned.
    pub async fn revoke(self, session: &SessionId, credential: &CredentialRecord) -> AppResult<Vec<SessionId>> {
        let revoked = self.store.revoke(session, &credential.credential).await?;
        let mut failure = None;
        for each in &revoked {
            if let Err(e) = self.push(each).await {
                failure.get_or_insert(e);
            }
        }
        failure.map_or(Ok(revoked), Err)
    }

    /// [`push_session`]; returns the grants left out (by credential name) with the reason.
    pub async fn push(self, session: &SessionId) -> AppResult<Vec<(String, AppError)>> {
        // An unknown session was never placed: no gateway knows it.
        let Some(record) = self.store.session_any(session).await? else { return Ok(Vec::new()) };
        let Some(gateway) = self.gateways.gateway(record.session.node.as_deref()) else { return Ok(Vec::new()) };
        if record.session.state == SessionState::Destroyed {
            gateway.forget_session_egress(session).await?;
            return Ok(Vec::new());
        }
        let egress =
            self.store.session_egress(session).await?.ok_or_else(|| AppError::session_not_found(session.as_str()))?;
        let ca = self.ca(&record.tenant_id, session, &egress).await?;
        let mut grants = Vec::new();
        let mut left_out = Vec::new();
        for record in self.store.session_grants(session).await? {
            match grant_of(self, &record).await {
                Ok(grant) => grants.push(grant),
                Err(e) => {
                    tracing::warn!(%session, credential = %record.credential.name, error = %e, "credential left out of the session's egress");
                    left_out.push((record.credential.name, e));
                }
            }
        }
        gateway.set_session_egress(session, SessionEgress { policy: egress.policy, ca, grants }).await?;
        Ok(left_out)
    }

    /// The session's CA, unsealed; sessions made before egress existed get theirs now.
    async fn ca(self, tenant: &TenantId, session: &SessionId, egress: &SessionEgressRecord) -> AppResult<SessionCa> {
        if let (Some(cert), Some(key)) = (&egress.ca_cert, &egress.ca_key_sealed) {
            return open_ca(self.keys, session, cert, key).await;
        }
        let ca = ca_stock::make_for(session)?;
        let sealed = seal_ca(self.keys, tenant, session, &ca).await?;
        match self.store.set_session_ca_if_missing(session, &ca.cert_pem, &sealed).await? {
            Some((cert, key)) if cert != ca.cert_pem => open_ca(self.keys, session, &cert, &key).await,
            _ => Ok(ca),
        }
    }

    /// Grants `record` to `session` and pushes the session's egress. What the push must
    /// unseal for this grant (its value, the session's CA) is opened before the grant is
    /// stored, so a grant the server cannot apply leaves nothing behind. Other grants of the
    /// session that cannot be unsealed are left out as always (and logged): they do not undo
    /// this one, which is in effect.
    pub async fn grant(self, session: &SessionId, record: &CredentialRecord) -> AppResult<()> {
        grant_of(self, record).await?;
        let egress =
            self.store.session_egress(session).await?.ok_or_else(|| AppError::session_not_found(session.as_str()))?;
        self.ca(&record.tenant_id, session, &egress).await?;
        self.store.grant(session, &record.credential).await?;
        self.push(session).await?;
        Ok(())
    }
}

/// Pushes every session holding a grant of `credential` (after it changed or was deleted).
pub async fn push_credential_sessions(state: &AppState, sessions: &[SessionId]) -> AppResult<()> {
    let mut failure = None;
    for session in sessions {
        if let Err(e) = push_session(state, session).await {
            failure.get_or_insert(e);
        }
    }
    failure.map_or(Ok(()), Err)
}

/// The gateway of `session`'s node stops knowing it (destroyed).
pub async fn forget_session(state: &AppState, session: &Session) {
    if session.node.is_none() && state.nodes.len() > 1 {
        // A fork's egress goes to its parent's node before the fork is placed; one that
        // never was (it failed first) is forgotten wherever that may have been.
        for (_, node) in state.nodes.iter() {
            forget_quietly(Some(node.as_ref()), &session.id).await;
        }
        return;
    }
    forget_quietly(state.nodes.gateway(session.node.as_deref()), &session.id).await;
}

/// Tells node `node`'s gateway to forget `session`, which has moved to another node. That
/// node may be lost (its lease ran out, yet it may still run): it is told all the same, for a
/// bounded time; one that does not hear it forgets the session when it restarts.
pub async fn forget_on(state: &AppState, node: &str, session: &SessionId) {
    let told = tokio::time::timeout(FORGET_ELSEWHERE, forget_quietly(state.nodes.gateway(Some(node)), session));
    if told.await.is_err() {
        tracing::warn!(%session, node, "a node the session moved away from did not answer; it keeps the session's egress until it restarts");
    }
}

/// How long [`forget_on`] waits for a node the session left.
const FORGET_ELSEWHERE: std::time::Duration = std::time::Duration::from_secs(2);

/// Tells `gateway` to forget `session` where nothing can be done if it cannot be told (the
/// session is gone either way): logged. A remote node that did not hear it keeps the
/// session's egress until it restarts.
async fn forget_quietly(gateway: Option<&dyn EgressControl>, session: &SessionId) {
    let Some(gateway) = gateway else { return };
    if let Err(e) = gateway.forget_session_egress(session).await {
        tracing::warn!(%session, error = %e, "the node's gateway could not be told to forget a session");
    }
}

/// At server start: pushes every session that is not destroyed. Failures are logged; such
/// a session reaches nothing until its egress is pushed again.
pub async fn push_all(state: &AppState) {
    let states = [
        SessionState::Creating,
        SessionState::Running,
        SessionState::Paused,
        SessionState::Suspended,
        SessionState::Restoring,
        SessionState::Destroying,
        SessionState::Failed,
        SessionState::Interrupted,
    ];
    let sessions = match state.store.sessions_in_states(&states).await {
        Ok(sessions) => sessions,
        Err(e) => {
            tracing::error!(error = %e, "cannot load sessions to push their egress");
            return;
        }
    };
    for record in sessions {
        if let Err(e) = push_session_cached(state, &record.session.id).await {
            tracing::warn!(session = %record.session.id, error = %e, "cannot load the session's egress");
        }
    }
}

/// Stores each node's gateway's audit events: whatever is queued, up to [`AUDIT_BATCH`] per
/// transaction. Runs until the gateway goes away.
pub fn spawn_audit_writers(state: &AppState) {
    for (id, node) in state.nodes.iter() {
        match node.take_audit_events() {
            Some(events) => spawn_audit_writer(state, events),
            None => tracing::warn!(node = %id, "the node's audit writer already runs"),
        }
    }
}

fn spawn_audit_writer(state: &AppState, mut events: tokio::sync::mpsc::UnboundedReceiver<AuditEvent>) {
    let store = state.store.clone();
    tokio::spawn(async move {
        let mut batch: Vec<AuditEvent> = Vec::with_capacity(AUDIT_BATCH);
        while let Some(first) = events.recv().await {
            batch.push(first);
            while batch.len() < AUDIT_BATCH {
                match events.try_recv() {
                    Ok(event) => batch.push(event),
                    Err(_) => break,
                }
            }
            let mut attempt = 0;
            while let Err(e) = store.insert_audit_events(&batch).await {
                attempt += 1;
                if attempt >= 3 {
                    tracing::error!(error = %e, events = batch.len(), "audit events lost");
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100 * attempt)).await;
            }
            batch.clear();
        }
    });
}

/// Deletes audit events older than `retention` now, then every hour.
pub fn spawn_audit_retention(state: &AppState, retention: std::time::Duration) {
    let store = state.store.clone();
    tokio::spawn(async move {
        loop {
            let before = space_store::now_ms().saturating_sub(retention.as_millis().min(i64::MAX as u128) as i64);
            match prune_audit(&store, before).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "audit events past their retention deleted"),
                Err(e) => tracing::warn!(error = %e, "deleting old audit events"),
            }
            tokio::time::sleep(AUDIT_PRUNE_EVERY).await;
        }
    });
}

/// Deletes every audit event older than `before`, in batches so that the audit writer and
/// the API get the database in between.
async fn prune_audit(store: &space_store::Store, before: i64) -> Result<u64, space_store::StoreError> {
    let mut total = 0;
    loop {
        let deleted = store.prune_audit_events(before, AUDIT_PRUNE_BATCH).await?;
        total += deleted;
        if deleted < u64::from(AUDIT_PRUNE_BATCH) {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests;
