//! Lifecycle measures through the API: pause and resume, disk snapshots of a small and of a
//! 1 GiB root (the ratio shows whether the cost depends on the root's size), restore, fork.

use std::time::{Duration, Instant};

use space_api::{
    CreateSessionRequest, CreateSnapshotRequest, ForkRequest, RestoreRequest, Session, SessionList, Snapshot,
    SnapshotPolicy,
};

use super::api::{destroy, destroy_all, run};
use super::report::{Report, summarize};
use crate::client::Client;

async fn quiet_session(client: &Client, template: &str) -> anyhow::Result<Session> {
    let request = CreateSessionRequest {
        template: Some(template.to_owned()),
        snapshot_policy: Some(SnapshotPolicy::off()),
        ..Default::default()
    };
    client.post_json("/v1/sessions", &request).await
}

async fn snapshot(client: &Client, id: &str) -> anyhow::Result<Snapshot> {
    client.post_json(&format!("/v1/sessions/{id}/snapshots"), &CreateSnapshotRequest::default()).await
}

async fn delete_snapshot(client: &Client, id: &str, snapshot: &Snapshot) -> anyhow::Result<()> {
    let path = format!("/v1/sessions/{id}/snapshots/{}", snapshot.id);
    client.send(client.request(reqwest::Method::DELETE, &path)).await?;
    Ok(())
}

/// Times `n` disk snapshots of session `id`, deleting each (untimed) before the next.
async fn snapshots(client: &Client, id: &str, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let taken = snapshot(client, id).await?;
        samples.push(t0.elapsed());
        delete_snapshot(client, id, &taken).await?;
    }
    Ok(samples)
}

async fn pause_resume(client: &Client, id: &str, n: usize) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut pauses, mut resumes) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t0 = Instant::now();
        let _: Session = client.post_json(&format!("/v1/sessions/{id}/pause"), &()).await?;
        pauses.push(t0.elapsed());
        let t0 = Instant::now();
        let _: Session = client.post_json(&format!("/v1/sessions/{id}/resume"), &()).await?;
        resumes.push(t0.elapsed());
    }
    Ok((pauses, resumes))
}

pub async fn measure(client: &Client, template: &str, n: usize, report: &mut Report) -> anyhow::Result<()> {
    let session = quiet_session(client, template).await?;
    let id = session.id.to_string();
    let result = measure_on(client, &id, n, report).await;
    destroy(client, &id, true).await?;
    result
}

async fn measure_on(client: &Client, id: &str, n: usize, report: &mut Report) -> anyhow::Result<()> {
    run(client, id, &["sh", "-c", "n=0; while :; do n=$((n+1)); sleep 0.1; done &"]).await?;
    let (pauses, resumes) = pause_resume(client, id, n).await?;
    report.add(summarize("pause_api", pauses));
    report.add(summarize("resume_api", resumes));
    report.add(summarize("snapshot_disk_small_root", snapshots(client, id, n).await?));
    run(client, id, &["sh", "-c", "head -c 1073741824 /dev/urandom > /root/big && sync"]).await?;
    report.add(summarize("snapshot_disk_1gib_root", snapshots(client, id, n).await?));
    report.add_ratio("snapshot_disk_1gib_root", "snapshot_disk_small_root");

    let base = snapshot(client, id).await?;
    let mut restores = Vec::new();
    for _ in 0..n.min(30) {
        let t0 = Instant::now();
        let request = RestoreRequest { snapshot: base.id.clone() };
        let _: Session = client.post_json(&format!("/v1/sessions/{id}/restore"), &request).await?;
        restores.push(t0.elapsed());
    }
    report.add(summarize("restore_disk_1gib_root", restores));
    let mut forks = Vec::new();
    for _ in 0..n.min(10) {
        let t0 = Instant::now();
        let request = ForkRequest { from: Some(base.id.clone()), count: Some(4) };
        let children: SessionList = client.post_json(&format!("/v1/sessions/{id}/fork"), &request).await?;
        forks.push(t0.elapsed());
        let ids: Vec<String> = children.sessions.iter().map(|s| s.id.to_string()).collect();
        destroy_all(client, &ids).await;
    }
    report.add(summarize("fork_4_from_disk_snapshot", forks));
    Ok(())
}
