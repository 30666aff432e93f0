//! A session moving between nodes: suspended into the blob store on one node and resumed on
//! another, holding 100 MiB of touched memory, to set beside `suspend_100mib` and
//! `resume_100mib` of one node without a blob store (scripts/bench-move.sh runs both). Needs a control plane with two nodes or
//! more sharing a blob store, and the admin key: each resume is sent elsewhere by cordoning
//! the session's node for it.

use std::time::{Duration, Instant};

use space_api::{NodeList, Session, SessionState, SnapshotKind, SnapshotList};

use super::api::{destroy, run};
use super::lifecycle::{HOLD_100_MIB, delete_full_snapshots, quiet_session};
use super::report::{Report, summarize};
use crate::client::{Client, encode};

pub async fn measure(client: &Client, template: &str, n: usize, report: &mut Report) -> anyhow::Result<()> {
    let nodes: NodeList = client.get_json("/v1/nodes").await?;
    let several = nodes.nodes.len() >= 2;
    let session = quiet_session(client, template).await?;
    let id = session.id.to_string();
    let result = measure_on(client, &id, n, several, report).await;
    destroy(client, &id, true).await?;
    result
}

async fn measure_on(client: &Client, id: &str, n: usize, several: bool, report: &mut Report) -> anyhow::Result<()> {
    let rss = run(client, id, &["sh", "-c", HOLD_100_MIB]).await?;
    eprintln!("  memory holder resident: {} KiB", rss.trim());
    let (mut suspends, mut resumes) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (suspend, resume) = if several { one_move(client, id).await? } else { one_stay(client, id).await? };
        suspends.push(suspend);
        resumes.push(resume);
        delete_full_snapshots(client, id).await?;
    }
    let (suspended, resumed) = match several {
        true => ("suspend_durable_100mib", "resume_elsewhere_100mib"),
        false => ("suspend_local_100mib", "resume_local_100mib"),
    };
    report.add(summarize(suspended, suspends));
    report.add(summarize(resumed, resumes));
    Ok(())
}

/// Suspends the session (timed), checks its snapshot is durable, cordons its node, resumes it
/// (timed) and checks it moved; the node is uncordoned whatever happened.
async fn one_move(client: &Client, id: &str) -> anyhow::Result<(Duration, Duration)> {
    let t0 = Instant::now();
    let suspended: Session = client.post_json(&format!("/v1/sessions/{id}/suspend"), &()).await?;
    let suspend = t0.elapsed();
    let list: SnapshotList = client.get_json(&format!("/v1/sessions/{id}/snapshots")).await?;
    let durable = list.snapshots.iter().rev().find(|s| s.kind == SnapshotKind::Full).is_some_and(|s| s.durable);
    anyhow::ensure!(durable, "the suspend's snapshot is not durable: start every node with the same --blob-store");
    let from = suspended.node.clone().unwrap_or_default();
    let path = |verb: &str| format!("/v1/nodes/{}/{verb}", encode(&from));
    let _: serde_json::Value = client.post_json(&path("cordon"), &()).await?;
    let t0 = Instant::now();
    let resumed = client.post_json::<_, Session>(&format!("/v1/sessions/{id}/resume"), &()).await;
    let resume = t0.elapsed();
    let uncordoned = client.post_json::<_, serde_json::Value>(&path("uncordon"), &()).await;
    let resumed = resumed?;
    uncordoned?;
    anyhow::ensure!(resumed.state == SessionState::Running, "resume left session {id} {:?}", resumed.state);
    anyhow::ensure!(resumed.node.as_deref() != Some(from.as_str()), "session {id} resumed on node {from} again");
    Ok((suspend, resume))
}

/// Suspends the session and resumes it where it was, each timed.
async fn one_stay(client: &Client, id: &str) -> anyhow::Result<(Duration, Duration)> {
    let t0 = Instant::now();
    let _: Session = client.post_json(&format!("/v1/sessions/{id}/suspend"), &()).await?;
    let suspend = t0.elapsed();
    let t0 = Instant::now();
    let resumed: Session = client.post_json(&format!("/v1/sessions/{id}/resume"), &()).await?;
    let resume = t0.elapsed();
    anyhow::ensure!(resumed.state == SessionState::Running, "resume left session {id} {:?}", resumed.state);
    Ok((suspend, resume))
}
