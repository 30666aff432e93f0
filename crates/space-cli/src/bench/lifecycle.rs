//! Lifecycle measures through the API: pause and resume, disk snapshots of a small and of a
//! 1 GiB root (the ratio shows whether the cost depends on the root's size), restore, fork;
//! then, when the node has CRIU, full snapshots, restore, fork and suspend/resume of a
//! session whose process holds 100 MiB of touched memory.

use std::time::{Duration, Instant};

use serde_json::json;
use space_api::{
    CreateSessionRequest, CreateSnapshotRequest, ForkRequest, RestoreRequest, Session, SessionList, SessionState,
    Snapshot, SnapshotKind, SnapshotList, SnapshotPolicy, Status,
};

use super::api::{destroy, destroy_all, run};
use super::report::{Report, round, summarize};
use crate::client::Client;

/// Starts a process holding 100 MiB of touched, anonymous memory (a string of spaces in awk:
/// busybox has no python) and waits until it is built, which is when awk starts its `sleep`
/// child (its resident size passes 100 MiB earlier, while the string is still being copied,
/// and a snapshot then holds up to 185 MiB); prints the resident size in KiB.
pub(super) const HOLD_100_MIB: &str = r#"
awk 'BEGIN { s = sprintf("%104857600s", ""); while (1) system("sleep 100000") }' >/dev/null 2>&1 &
pid=$!
for _ in $(seq 200); do
    if [ -n "$(cat /proc/$pid/task/$pid/children 2>/dev/null)" ]; then
        awk '/^VmRSS/ { print $2 }' /proc/$pid/status
        exit 0
    fi
    sleep 0.05
done
echo "the memory holder did not finish building its 100 MiB in 10 s" >&2
exit 1
"#;

pub(super) async fn quiet_session(client: &Client, template: &str) -> anyhow::Result<Session> {
    let request = CreateSessionRequest {
        template: Some(template.to_owned()),
        snapshot_policy: Some(SnapshotPolicy::off()),
        ..Default::default()
    };
    client.post_json("/v1/sessions", &request).await
}

async fn snapshot(client: &Client, id: &str, kind: SnapshotKind) -> anyhow::Result<Snapshot> {
    let request = CreateSnapshotRequest { kind: Some(kind), ..Default::default() };
    client.post_json(&format!("/v1/sessions/{id}/snapshots"), &request).await
}

async fn delete_snapshot(client: &Client, id: &str, snapshot: &Snapshot) -> anyhow::Result<()> {
    let path = format!("/v1/sessions/{id}/snapshots/{}", snapshot.id);
    client.send(client.request(reqwest::Method::DELETE, &path)).await?;
    Ok(())
}

/// Times `n` snapshots of session `id`, deleting each (untimed) before the next.
async fn snapshots(client: &Client, id: &str, kind: SnapshotKind, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let taken = snapshot(client, id, kind).await?;
        samples.push(t0.elapsed());
        delete_snapshot(client, id, &taken).await?;
    }
    Ok(samples)
}

/// Times `n` restores of session `id` to `base`.
async fn restores(client: &Client, id: &str, base: &Snapshot, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let request = RestoreRequest { snapshot: base.id.clone() };
        let _: Session = client.post_json(&format!("/v1/sessions/{id}/restore"), &request).await?;
        samples.push(t0.elapsed());
    }
    Ok(samples)
}

/// Times `rounds` forks of four sessions from `base`, destroying them (untimed) after each.
async fn forks(client: &Client, id: &str, base: &Snapshot, rounds: usize) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t0 = Instant::now();
        let request = ForkRequest { from: Some(base.id.clone()), count: Some(4) };
        let children: SessionList = client.post_json(&format!("/v1/sessions/{id}/fork"), &request).await?;
        samples.push(t0.elapsed());
        let ids: Vec<String> = children.sessions.iter().map(|s| s.id.to_string()).collect();
        destroy_all(client, &ids).await;
    }
    Ok(samples)
}

/// Times `n` rounds of `first` then `second` (pause/resume, suspend/resume), each call apart.
/// With `full`, the full snapshots the suspends leave are deleted (untimed) after each round.
async fn round_trips(
    client: &Client,
    id: &str,
    (first, second): (&str, &str),
    n: usize,
    full: bool,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut firsts, mut seconds) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t0 = Instant::now();
        let _: Session = client.post_json(&format!("/v1/sessions/{id}/{first}"), &()).await?;
        firsts.push(t0.elapsed());
        let t0 = Instant::now();
        let resumed: Session = client.post_json(&format!("/v1/sessions/{id}/{second}"), &()).await?;
        seconds.push(t0.elapsed());
        anyhow::ensure!(resumed.state == SessionState::Running, "{second} left session {id} {:?}", resumed.state);
        if full {
            delete_full_snapshots(client, id).await?;
        }
    }
    Ok((firsts, seconds))
}

/// Deletes the full snapshots each suspend leaves behind, so they do not pile up.
pub(super) async fn delete_full_snapshots(client: &Client, id: &str) -> anyhow::Result<()> {
    let list: SnapshotList = client.get_json(&format!("/v1/sessions/{id}/snapshots")).await?;
    for snapshot in list.snapshots.iter().filter(|s| s.kind == SnapshotKind::Full) {
        delete_snapshot(client, id, snapshot).await?;
    }
    Ok(())
}

pub async fn measure(client: &Client, template: &str, n: usize, report: &mut Report) -> anyhow::Result<()> {
    let session = quiet_session(client, template).await?;
    let id = session.id.to_string();
    let result = measure_on(client, &id, n, report).await;
    destroy(client, &id, true).await?;
    result?;
    measure_full(client, template, n, report).await
}

async fn measure_on(client: &Client, id: &str, n: usize, report: &mut Report) -> anyhow::Result<()> {
    run(client, id, &["sh", "-c", "n=0; while :; do n=$((n+1)); sleep 0.1; done &"]).await?;
    let (pauses, resumes) = round_trips(client, id, ("pause", "resume"), n, false).await?;
    report.add(summarize("pause_api", pauses));
    report.add(summarize("resume_api", resumes));
    let small = snapshots(client, id, SnapshotKind::Disk, n).await?;
    report.add(summarize("snapshot_disk_small_root", small));
    run(client, id, &["sh", "-c", "head -c 1073741824 /dev/urandom > /root/big && sync"]).await?;
    report.add(summarize("snapshot_disk_1gib_root", snapshots(client, id, SnapshotKind::Disk, n).await?));
    report.add_ratio("snapshot_disk_1gib_root", "snapshot_disk_small_root");

    let base = snapshot(client, id, SnapshotKind::Disk).await?;
    report.add(summarize("restore_disk_1gib_root", restores(client, id, &base, n.min(30)).await?));
    report.add(summarize("fork_4_from_disk_snapshot", forks(client, id, &base, n.min(10)).await?));
    Ok(())
}

/// The full-snapshot measures on a session of their own, or a note when the node cannot
/// take full snapshots (the API would answer 501 `feature_unavailable`).
async fn measure_full(client: &Client, template: &str, n: usize, report: &mut Report) -> anyhow::Result<()> {
    let status: Status = client.get_json("/v1/status").await?;
    if !status.full_snapshots.available {
        eprintln!("  full snapshots unavailable, their measures skipped: {}", status.full_snapshots.detail);
        return Ok(());
    }
    let session = quiet_session(client, template).await?;
    let id = session.id.to_string();
    let result = measure_full_on(client, &id, n, report).await;
    destroy(client, &id, true).await?;
    result
}

async fn measure_full_on(client: &Client, id: &str, n: usize, report: &mut Report) -> anyhow::Result<()> {
    // The fixed cost of a restore (a few MiB of memory: spaced and the shell), next to the
    // 100 MiB one below.
    let idle = snapshot(client, id, SnapshotKind::Full).await?;
    report.add(summarize("restore_full_idle", restores(client, id, &idle, n).await?));
    delete_snapshot(client, id, &idle).await?;

    let rss = run(client, id, &["sh", "-c", HOLD_100_MIB]).await?;
    eprintln!("  memory holder resident: {} KiB", rss.trim());
    report.add(summarize("snapshot_full_100mib", snapshots(client, id, SnapshotKind::Full, n).await?));
    report.add_goal("snapshot_full_100mib", 400.0);

    let base = snapshot(client, id, SnapshotKind::Full).await?;
    // What a restore reads back: the memory images and the root's changes.
    let size_mib = base.size_bytes.map(|b| round(b as f64 / f64::from(1 << 20)));
    report.add_value(json!({ "measure": "snapshot_full_100mib_size", "mib": size_mib }));
    report.add(summarize("restore_full_100mib", restores(client, id, &base, n).await?));
    report.add_goal("restore_full_100mib", 150.0);
    report.add(summarize("fork_4_from_full_100mib", forks(client, id, &base, (n / 5).max(3)).await?));
    report.add_goal("fork_4_from_full_100mib", 1000.0);
    delete_snapshot(client, id, &base).await?;

    let (suspends, resumes) = round_trips(client, id, ("suspend", "resume"), n, true).await?;
    report.add(summarize("suspend_100mib", suspends));
    report.add(summarize("resume_100mib", resumes));
    Ok(())
}
