//! One control plane, two nodes: new sessions are spread over them, and each session, its
//! sandboxes, snapshots, forks and egress stay on the node it was placed on.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use space_api::SessionId;
use space_node_sim::SimConfig;

use crate::harness::Server;

fn node(id: &str) -> SimConfig {
    SimConfig { node_id: id.into(), ..SimConfig::default() }
}

async fn two_nodes() -> Server {
    Server::start_with_nodes(vec![node("node-a"), node("node-b")]).await
}

/// The sessions (by id) each node (by index in `server.sims`) holds a sandbox of.
fn held(server: &Server) -> Vec<Vec<String>> {
    let session_of = |s: space_node_sim::SimSandbox| s.session.map(|id| id.to_string());
    server.sims.iter().map(|sim| sim.sandboxes().into_iter().filter_map(session_of).collect()).collect()
}

fn node_of(session: &Value) -> String {
    session["node"].as_str().unwrap_or_else(|| panic!("a placed session names its node: {session}")).to_owned()
}

#[tokio::test]
async fn new_sessions_spread_over_the_nodes_and_run_on_the_one_they_name() {
    let server = two_nodes().await;
    let mut placed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for _ in 0..4 {
        let id = server.session().await;
        placed.entry(node_of(&server.get(&id).await)).or_default().push(id);
    }
    // Equal nodes, no pools: the least loaded wins each time, so they alternate.
    assert_eq!(placed.keys().collect::<Vec<_>>(), ["node-a", "node-b"], "{placed:?}");
    assert!(placed.values().all(|ids| ids.len() == 2), "{placed:?}");
    let held = held(&server);
    for (index, name) in ["node-a", "node-b"].iter().enumerate() {
        for id in &placed[*name] {
            assert!(held[index].contains(id), "{id} is placed on {name}, whose sandboxes are {:?}", held[index]);
            assert!(!held[1 - index].contains(id), "{id} runs on one node only");
            let (status, out) = server.exec(id, &["echo", "hi"]).await;
            assert_eq!(status, 200, "{out}");
        }
    }
    let (_, list) = server.call("GET", "/v1/nodes", None).await;
    let sessions: Vec<(&str, u64)> = list["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n["sessions"].as_u64().unwrap()))
        .collect();
    assert_eq!(sessions, [("node-a", 2), ("node-b", 2)], "{list}");
}

#[tokio::test]
async fn forks_restores_and_destroys_stay_on_the_sessions_node() {
    let server = two_nodes().await;
    let first = server.session().await;
    let on_b = server.session().await;
    assert_eq!(
        (node_of(&server.get(&first).await).as_str(), node_of(&server.get(&on_b).await).as_str()),
        ("node-a", "node-b")
    );

    let snapshot = server.snapshot(&on_b, "disk").await;
    assert!(server.sims[1].snapshots().iter().any(|s| s.as_str() == snapshot), "the snapshot is kept on node-b");
    assert!(server.sims[0].snapshots().is_empty(), "and nowhere else");
    let (status, forks) = server.act(&on_b, "fork", json!({ "count": 2 })).await;
    assert_eq!(status, 201, "{forks}");
    for fork in forks["sessions"].as_array().unwrap() {
        let id = fork["id"].as_str().unwrap();
        // node-a has fewer sessions, but the snapshot forked is on node-b.
        assert_eq!(node_of(&server.get(id).await), "node-b", "{fork}");
        assert!(held(&server)[1].contains(&id.to_owned()));
    }
    let (status, restored) = server.act(&on_b, "restore", json!({ "snapshot": snapshot })).await;
    assert_eq!(status, 200, "{restored}");
    assert_eq!(node_of(&restored), "node-b");

    let (status, _) = server.call("DELETE", &format!("/v1/sessions/{on_b}"), None).await;
    assert!(status < 300);
    server.wait_for_state(&on_b, "destroyed").await;
    assert!(!held(&server)[1].contains(&on_b), "its sandbox is gone from node-b");
    assert!(server.sims[1].snapshots().iter().all(|s| s.as_str() != snapshot), "and its snapshot");
}

#[tokio::test]
async fn a_sessions_egress_reaches_only_its_nodes_gateway() {
    let server = two_nodes().await;
    let on_a = server.session().await;
    let on_b = server.session().await;
    let (a, b): (SessionId, SessionId) = (on_a.parse().unwrap(), on_b.parse().unwrap());
    assert!(server.sims[0].has_egress(&a) && !server.sims[1].has_egress(&a), "{on_a} is on node-a");
    assert!(server.sims[1].has_egress(&b) && !server.sims[0].has_egress(&b), "{on_b} is on node-b");
    let credential =
        json!({ "name": "gh", "hosts": ["api.example.com"], "header": "Authorization: Bearer {secret}", "value": "v" });
    assert_eq!(server.call("POST", "/v1/credentials", Some(credential)).await.0, 201);
    let grant = server.call("POST", &format!("/v1/sessions/{on_b}/grants"), Some(json!({ "credential": "gh" }))).await;
    assert!(grant.0 < 300, "{grant:?}");
    assert!(!server.sims[0].has_egress(&b), "a grant is pushed to the session's node only");
    server.call("DELETE", &format!("/v1/sessions/{on_b}"), None).await;
    server.wait_for_state(&on_b, "destroyed").await;
    assert!(!server.sims[1].has_egress(&b), "node-b forgets a destroyed session");
}

#[tokio::test]
async fn a_restart_recovers_the_sessions_of_every_node() {
    let server = two_nodes().await;
    let on_a = server.session().await;
    let on_b = server.session().await;
    let server = server.stop().start().await;
    for id in [&on_a, &on_b] {
        assert_eq!(server.get(id).await["state"], "running");
        let (status, out) = server.exec(id, &["true"]).await;
        assert_eq!(status, 200, "{out}");
    }
    assert_eq!(held(&server), [vec![on_a], vec![on_b]], "each kept on its node, nothing else left");
}

/// Polls `GET /v1/nodes` until node `id` is in `state` (lost: its lease of 15 s ran out,
/// which heartbeats every 5 s renew). The bound only keeps a broken run from hanging.
pub(crate) async fn wait_node_state(server: &Server, id: &str, state: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let (_, list) = server.call("GET", "/v1/nodes", None).await;
        let node = list["nodes"].as_array().unwrap().iter().find(|n| n["id"] == id).cloned().unwrap();
        if node["state"] == state {
            return list;
        }
        assert!(std::time::Instant::now() < deadline, "node {id} is not {state}: {list}");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn a_node_that_stops_answering_is_lost_and_new_sessions_go_to_the_others() {
    let server = two_nodes().await;
    server.sims[0].fail_next(space_node_sim::Op::Capacity, u32::MAX);
    // Not lost yet, but placement asks it and passes it over (it would win the tie by id).
    let id = server.session().await;
    assert_eq!(node_of(&server.get(&id).await), "node-b");
    let list = wait_node_state(&server, "node-a", "lost").await;
    let states: Vec<&str> = list["nodes"].as_array().unwrap().iter().map(|n| n["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["lost", "ready"], "node-b still beats: {list}");
    for _ in 0..3 {
        let id = server.session().await;
        assert_eq!(node_of(&server.get(&id).await), "node-b", "nothing is placed on a lost node");
    }
    // Answering again, it is ready again, and the least loaded by far.
    server.sims[0].stop_failing(space_node_sim::Op::Capacity);
    wait_node_state(&server, "node-a", "ready").await;
    let id = server.session().await;
    assert_eq!(node_of(&server.get(&id).await), "node-a");
}

/// A node that lacks a template (it joined after the template was imported) takes no session
/// from it: they go to the nodes that have it, whichever node is asked first; with no node
/// left that has it, the create is refused as an unknown template.
#[tokio::test]
async fn sessions_from_a_template_go_only_to_the_nodes_that_have_it() {
    use sha2::{Digest, Sha256};
    let server = two_nodes().await;
    server.wait_for_template("busybox").await;
    let body = b"a root filesystem tarball".to_vec();
    let path = format!("/v1/templates/uploads?name=web&sha256={}", hex::encode(Sha256::digest(&body)));
    let (status, op) = server.post_bytes(&server.admin, &path, body).await;
    assert_eq!(status, 202, "{op}");
    assert_eq!(server.wait_operation(op["id"].as_str().unwrap()).await["state"], "succeeded");

    for (lacking, having) in [(1, "node-a"), (0, "node-b")] {
        for sim in &server.sims {
            if sim.api().resolve_template("web").await.is_none() {
                sim.api()
                    .import_template(
                        "web",
                        &space_api::TemplateSource::Registry { reference: "r/web".into() },
                        Box::new(|_| {}),
                    )
                    .await
                    .unwrap();
            }
        }
        let removed = server.sims[lacking].api().resolve_template("web").await.unwrap();
        assert!(server.sims[lacking].api().delete_template("web", removed.version).await.unwrap());
        for _ in 0..3 {
            let (status, session) = server.call("POST", "/v1/sessions", Some(json!({"template": "web"}))).await;
            assert_eq!(status, 201, "{session}");
            assert_eq!(node_of(&session), having, "{session}");
        }
    }
    let removed = server.sims[1].api().resolve_template("web").await.unwrap();
    assert!(server.sims[1].api().delete_template("web", removed.version).await.unwrap());
    let refused = server.call("POST", "/v1/sessions", Some(json!({"template": "web"}))).await;
    crate::harness::assert_error(&refused, 400, "unknown_template");
}

/// A tenant's own template wins over the global one of that name on every node: a node that
/// has only the global one (the tenant's never reached it) takes none of the tenant's
/// sessions from that name, while other tenants' sessions go anywhere.
#[tokio::test]
async fn a_tenants_own_template_is_not_swapped_for_the_global_one_on_a_node_that_lacks_it() {
    use sha2::{Digest, Sha256};
    let server = two_nodes().await;
    server.wait_for_template("busybox").await;
    let acme = server.tenant_key("acme").await;
    for key in [&server.admin, &acme] {
        let body = format!("a root filesystem tarball of {key}").into_bytes();
        let path = format!("/v1/templates/uploads?name=web&sha256={}", hex::encode(Sha256::digest(&body)));
        let (status, op) = server.post_bytes(key, &path, body).await;
        assert_eq!(status, 202, "{op}");
        assert_eq!(server.wait_operation_as(key, op["id"].as_str().unwrap()).await["state"], "succeeded");
    }
    let owns = server.sims[1].api().templates().await.into_iter().find(|t| t.name.ends_with("..web")).unwrap();
    assert!(server.sims[1].api().delete_template(&owns.name, owns.version).await.unwrap());
    for _ in 0..3 {
        let (status, session) = server.call_as(&acme, "POST", "/v1/sessions", Some(json!({"template": "web"}))).await;
        assert_eq!(status, 201, "{session}");
        assert_eq!(node_of(&session), "node-a", "{session}");
    }
    let other = server.tenant_key("other").await;
    let mut nodes = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let (status, session) = server.call_as(&other, "POST", "/v1/sessions", Some(json!({"template": "web"}))).await;
        assert_eq!(status, 201, "{session}");
        nodes.insert(node_of(&session));
    }
    assert_eq!(nodes.len(), 2, "another tenant's sessions of the global template go to both nodes: {nodes:?}");
}
