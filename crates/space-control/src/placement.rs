//! Which node a new session runs on (docs/control-plane.md, "Placement"). A session stays
//! on the node it was placed on: its snapshots are kept there, so its restores and forks
//! run there too.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use space_api::error::ErrorCode;
use space_api::{NodeCapacity, PoolStatus, Session, TenantId};
use space_node_api::NodeApi;
use space_store::now_ms;

use crate::AppState;
use crate::error::{AppError, AppResult};

/// What placement weighs of one node.
#[derive(Debug, Clone, PartialEq)]
struct Candidate {
    id: String,
    cpus: u32,
    memory_mib: u64,
    /// Sessions placed on it that are not destroyed.
    sessions: u64,
    /// Whether it has a ready pod of the session's template and runtime.
    ready_pod: bool,
}

impl Candidate {
    /// Lower is better: sessions per CPU, counting a missing ready pod as one more session
    /// (so of two nodes about as loaded, the one that starts the session warm wins).
    fn cost(&self) -> f64 {
        let load = self.sessions + u64::from(!self.ready_pod);
        load as f64 / f64::from(self.cpus.max(1))
    }
}

/// The node a new session from a template goes to: one whose lease holds, that is not
/// cordoned, that has the session's template (`tenant`'s own or the global one of that name)
/// or can build it (a built-in), and whose memory fits the session, at the lowest
/// [`Candidate::cost`] (ties: by id). A control plane with one node places there without
/// asking anything.
pub async fn place_from_template(
    state: &AppState,
    session: &Session,
    tenant: &TenantId,
) -> AppResult<Arc<dyn NodeApi>> {
    place_among(state, session, Some(tenant)).await
}

/// The node a session that needs no template (its root comes from a snapshot) goes to: as
/// [`place_from_template`], whatever templates the nodes have.
pub async fn place(state: &AppState, session: &Session) -> AppResult<Arc<dyn NodeApi>> {
    place_among(state, session, None).await
}

async fn place_among(
    state: &AppState,
    session: &Session,
    template_of: Option<&TenantId>,
) -> AppResult<Arc<dyn NodeApi>> {
    if state.nodes.len() == 1 {
        return Ok(state.nodes.first().clone());
    }
    let now = now_ms();
    let records = state.store.nodes().await?;
    let sessions = state.store.sessions_per_node().await?;
    let mut candidates = Vec::new();
    for record in records.iter().filter(|r| !r.lost(now) && !r.cordoned) {
        let Ok(node) = state.nodes.get(&record.heartbeat.id) else { continue };
        candidates.push((record, node));
    }
    let asked =
        candidates.iter().map(|(_, node)| ask(node.as_ref(), template_of.map(|t| (t, session.template.as_str()))));
    let answers = futures::future::join_all(asked).await;
    let answered = answers.iter().filter(|a| a.is_some()).count();
    // The tenant's own template wins over the global one of that name wherever it is: a node
    // that has only the global one (its own never reached it) does not run the session.
    let own_somewhere = answers.iter().flatten().any(|(_, _, has)| *has == Has::Own);
    let weighed: Vec<Candidate> = candidates
        .iter()
        .zip(answers)
        .filter_map(|((record, _), answer)| Some((record, answer?)))
        .filter(|(_, (_, _, has))| *has == Has::Own || (*has == Has::Global && !own_somewhere))
        .map(|(record, (capacity, pool, _))| Candidate {
            id: record.heartbeat.id.clone(),
            cpus: capacity.cpus,
            memory_mib: capacity.memory_mib,
            sessions: sessions.get(&record.heartbeat.id).copied().unwrap_or(0),
            ready_pod: has_ready_pod(&pool, session),
        })
        .collect();
    if answered > 0 && weighed.is_empty() {
        return Err(AppError::new(
            ErrorCode::UnknownTemplate,
            format!(
                "none of the {answered} ready nodes has template {:?}: import or build it again, so every node has it",
                session.template
            ),
        ));
    }
    let chosen = best(&weighed, session.resources.memory_mib).ok_or_else(|| no_node(session, weighed.len()))?;
    state.nodes.get(&chosen.id)
}

/// The nodes whose lease ran out. A control plane with one node never counts it lost: there
/// is nowhere else to go, and its sessions wait for it.
pub async fn lost_nodes(state: &AppState) -> AppResult<HashSet<String>> {
    if state.nodes.len() == 1 {
        return Ok(HashSet::new());
    }
    let now = now_ms();
    Ok(state.store.nodes().await?.into_iter().filter(|r| r.lost(now)).map(|r| r.heartbeat.id).collect())
}

/// The nodes cordoned (`space node cordon`): they take no new sessions.
pub async fn cordoned_nodes(state: &AppState) -> AppResult<HashSet<String>> {
    Ok(state.store.nodes().await?.into_iter().filter(|r| r.cordoned).map(|r| r.heartbeat.id).collect())
}

/// How long placement waits for a node: one that does not answer meanwhile (it stalled, and
/// is not lost yet) is passed over.
pub(crate) const ASK: Duration = Duration::from_secs(2);

/// What the first node to answer says to `question`: the nodes whose lease holds are asked in
/// turn by id, each for at most [`ASK`], so one that stalled (and is not lost yet) costs a
/// caller seconds, not its request. For what every node answers alike (its templates).
pub(crate) async fn first_answer<T, F>(state: &AppState, question: impl Fn(Arc<dyn NodeApi>) -> F) -> AppResult<T>
where
    F: std::future::Future<Output = T>,
{
    let lost = lost_nodes(state).await?;
    for (id, node) in state.nodes.iter().filter(|(id, _)| !lost.contains(*id)) {
        match tokio::time::timeout(ASK, question(node.clone())).await {
            Ok(answer) => return Ok(answer),
            Err(_) => tracing::warn!(node = %id, "the node did not answer within {} s: asking the next", ASK.as_secs()),
        }
    }
    Err(none_answered(state))
}

fn none_answered(state: &AppState) -> AppError {
    AppError::new(
        ErrorCode::SandboxUnavailable,
        format!(
            "none of this control plane's {} nodes answered within {} s: `space node list` shows them; try again",
            state.nodes.len(),
            ASK.as_secs()
        ),
    )
}

/// Which template of a session's name a node has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Has {
    /// The tenant's own (also: no template is needed).
    Own,
    /// Only the global one (or it is a built-in, which every node builds).
    Global,
    Neither,
}

/// A node's capacity and pool now, and which `template` (a tenant's name; `None`: none is
/// needed) it has, if it answers: one that died since its last heartbeat fails the capacity
/// call and is passed over.
async fn ask(node: &dyn NodeApi, template: Option<(&TenantId, &str)>) -> Option<(NodeCapacity, PoolStatus, Has)> {
    let has_template = async {
        let Some((tenant, name)) = template else { return Has::Own };
        if crate::template_scope::own(node, tenant, name).await.is_some() {
            Has::Own
        } else if node.is_builtin(name) || node.resolve_template(name).await.is_some() {
            Has::Global
        } else {
            Has::Neither
        }
    };
    let answer = async { tokio::join!(node.capacity(), node.pool_status(), has_template) };
    match tokio::time::timeout(ASK, answer).await {
        Ok((Ok(capacity), pool, has_template)) => Some((capacity, pool, has_template)),
        _ => None,
    }
}

/// What each node whose lease holds says to `question`, asked at once, each for at most
/// [`ASK`] (one that does not answer meanwhile is left out); an error if none answers.
pub(crate) async fn every_answer<T, F>(state: &AppState, question: impl Fn(Arc<dyn NodeApi>) -> F) -> AppResult<Vec<T>>
where
    F: std::future::Future<Output = T>,
{
    let lost = lost_nodes(state).await?;
    let asked = state
        .nodes
        .iter()
        .filter(|(id, _)| !lost.contains(*id))
        .map(|(_, node)| tokio::time::timeout(ASK, question(node.clone())));
    let answers: Vec<T> = futures::future::join_all(asked).await.into_iter().filter_map(Result::ok).collect();
    if answers.is_empty() {
        return Err(none_answered(state));
    }
    Ok(answers)
}

fn has_ready_pod(pool: &PoolStatus, session: &Session) -> bool {
    pool.templates.iter().any(|p| p.template == session.template && p.runtime == session.runtime && p.ready > 0)
}

fn best(candidates: &[Candidate], memory_mib: u64) -> Option<&Candidate> {
    candidates
        .iter()
        .filter(|c| c.memory_mib >= memory_mib)
        .min_by(|a, b| a.cost().total_cmp(&b.cost()).then_with(|| a.id.cmp(&b.id)))
}

fn no_node(session: &Session, ready: usize) -> AppError {
    let why = if ready == 0 {
        "no node is ready (each node's lease ran out, it is cordoned, or it did not answer): `space node list` \
         shows them"
            .to_owned()
    } else {
        format!(
            "none of the {ready} ready nodes has {} MiB of memory: ask for less memory, or add a larger node",
            session.resources.memory_mib
        )
    };
    AppError::new(ErrorCode::SandboxUnavailable, format!("cannot place session {}: {why}", session.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, cpus: u32, sessions: u64, ready_pod: bool) -> Candidate {
        Candidate { id: id.into(), cpus, memory_mib: 4096, sessions, ready_pod }
    }

    #[test]
    fn the_least_loaded_node_per_cpu_wins() {
        let nodes = [node("a", 2, 4, true), node("b", 4, 4, true)];
        assert_eq!(best(&nodes, 512).unwrap().id, "b");
    }

    #[test]
    fn a_ready_pod_wins_among_nodes_about_as_loaded() {
        let nodes = [node("a", 2, 1, false), node("b", 2, 1, true)];
        assert_eq!(best(&nodes, 512).unwrap().id, "b");
        // But not against a node with far fewer sessions.
        let nodes = [node("a", 2, 0, false), node("b", 2, 6, true)];
        assert_eq!(best(&nodes, 512).unwrap().id, "a");
    }

    #[test]
    fn ties_go_by_id_and_a_node_too_small_is_skipped() {
        let nodes = [node("b", 2, 0, true), node("a", 2, 0, true)];
        assert_eq!(best(&nodes, 512).unwrap().id, "a");
        assert_eq!(best(&nodes, 8192), None);
        let small = Candidate { memory_mib: 256, ..node("a", 2, 0, true) };
        assert_eq!(best(&[small, node("b", 2, 9, false)], 512).unwrap().id, "b");
    }
}
