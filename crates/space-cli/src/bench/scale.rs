//! Scale of the control plane: listing sessions, a warm create and one run of the session
//! schedule, with few sessions in the database and then with many, most of them destroyed
//! (their rows, events and sandboxes are kept). What must not grow is the cost of history: the
//! first two phases have the same live sessions, the second thousands of destroyed ones more.
//! The third adds live sessions, whose cost is linear by nature (they are listed, and the
//! schedule looks at each).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use space_api::SessionList;

use super::api::{create, create_many, destroy, destroy_all, set_pool, wait_pool_ready};
use super::report::{Report, round, summarize};
use crate::client::Client;

/// Live sessions of the first two phases.
const BASE_LIVE: usize = 100;
/// The warm pool's size during the measure: each timed create waits until it is full again,
/// so no refill competes with it (a refill's cost is the node's, not the control plane's).
const POOL: u32 = 16;
/// Creates and destroys in flight at once while history is made.
const CHURN_CONCURRENCY: usize = 4;
/// Runs of the schedule each phase waits for.
const TICKS: u64 = 20;

pub struct ScaleArgs {
    /// Sessions in the database in the last phase.
    pub total: usize,
    /// Live sessions in the last phase.
    pub live: usize,
    /// Samples of list and create per phase.
    pub samples: usize,
    /// The server's metrics listener (`http://HOST:PORT`), where the schedule's runs are timed.
    pub metrics: String,
    /// The server's pool (on this machine), whose subvolume deletions a phase waits out.
    pub pool: PathBuf,
}

pub async fn measure(client: &Client, template: &str, args: &ScaleArgs, report: &mut Report) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.live >= BASE_LIVE && args.total > args.live,
        "--scale must exceed --scale-live, itself at least {BASE_LIVE}"
    );
    set_pool(client, template, POOL).await?;
    let mut live: Vec<String> = Vec::new();
    let result = phases(client, template, args, report, &mut live).await;
    destroy_all(client, &live).await;
    result
}

async fn phases(
    client: &Client,
    template: &str,
    args: &ScaleArgs,
    report: &mut Report,
    live: &mut Vec<String>,
) -> anyhow::Result<()> {
    eprintln!("scale: {BASE_LIVE} live sessions");
    live.extend(ids(create_many(client, template, BASE_LIVE).await?));
    let few = phase(client, template, args, report, "few").await?;
    let destroyed = args.total - args.live;
    eprintln!("scale: {destroyed} sessions created and destroyed");
    churn(client, template, destroyed).await?;
    settle(&args.pool).await?;
    let history = phase(client, template, args, report, "history").await?;
    eprintln!("scale: {} more live sessions", args.live - BASE_LIVE);
    live.extend(ids(create_many(client, template, args.live - BASE_LIVE).await?));
    phase(client, template, args, report, "history_and_live").await?;
    let ratio = |a: f64, b: f64| round(b / a);
    report.add_value(json!({
        "measure": "scale:history/few",
        "list_p50": ratio(few.list, history.list),
        "create_p50": ratio(few.create, history.create),
        "schedule_mean": ratio(few.tick, history.tick),
    }));
    Ok(())
}

/// What one phase measured (milliseconds).
struct Phase {
    list: f64,
    create: f64,
    tick: f64,
}

async fn phase(
    client: &Client,
    template: &str,
    args: &ScaleArgs,
    report: &mut Report,
    name: &str,
) -> anyhow::Result<Phase> {
    let all: SessionList = client.get_json("/v1/sessions?all=true").await?;
    let running = all.sessions.iter().filter(|s| s.state != space_api::SessionState::Destroyed).count();
    report.add_value(json!({"measure": format!("scale_{name}"), "sessions": all.sessions.len(), "live": running}));
    let mut lists = Vec::with_capacity(args.samples);
    for _ in 0..args.samples {
        let t0 = Instant::now();
        let _: SessionList = client.get_json("/v1/sessions").await?;
        lists.push(t0.elapsed());
    }
    let list = report.add(summarize(&format!("scale_list_sessions_{name}"), lists)).p50_ms;
    let mut creates = Vec::with_capacity(args.samples);
    for _ in 0..args.samples {
        wait_pool_ready(client, template, POOL).await?;
        let t0 = Instant::now();
        let session = create(client, template).await?;
        creates.push(t0.elapsed());
        destroy(client, session.id.as_str(), true).await?;
    }
    let create = report.add(summarize(&format!("scale_create_api_warm_{name}"), creates)).p50_ms;
    // A server from before the schedule was timed has no such metric.
    let tick = schedule_mean_ms(&args.metrics).await.unwrap_or_else(|e| {
        eprintln!("warning: the session schedule is not timed: {e:#}");
        f64::NAN
    });
    report.add_value(json!({"measure": format!("scale_schedule_run_{name}"), "runs": TICKS, "mean_ms": round(tick)}));
    Ok(Phase { list, create, tick })
}

/// Creates and destroys `count` sessions, a few at a time.
async fn churn(client: &Client, template: &str, count: usize) -> anyhow::Result<()> {
    let per_task = count.div_ceil(CHURN_CONCURRENCY);
    let tasks: Vec<_> = (0..CHURN_CONCURRENCY)
        .map(|i| {
            let (client, template) = (client.clone(), template.to_owned());
            let n = per_task.min(count.saturating_sub(i * per_task));
            tokio::spawn(async move {
                for _ in 0..n {
                    let session = create(&client, &template).await?;
                    destroy(&client, session.id.as_str(), true).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Waits (untimed) until the kernel has cleaned the subvolumes the destroyed sessions left,
/// so the next phase measures the control plane, not a node busy deleting.
async fn settle(pool: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let pool = pool.to_owned();
        let pending = tokio::task::spawn_blocking(move || space_storage::btrfs::pending_deletions(&pool)).await??;
        if pending.is_none_or(|n| n == 0) {
            // The one being cleaned is not counted.
            tokio::time::sleep(Duration::from_secs(3)).await;
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{pending:?} subvolume deletions still pending after 15 minutes");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The mean time of the next [`TICKS`] runs of the session schedule, from the server's
/// `space_schedule_tick_duration_seconds` histogram.
async fn schedule_mean_ms(metrics: &str) -> anyhow::Result<f64> {
    let (sum0, count0) = schedule_totals(metrics).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (sum, count) = schedule_totals(metrics).await?;
        if count >= count0 + TICKS as f64 {
            return Ok((sum - sum0) / (count - count0) * 1000.0);
        }
        anyhow::ensure!(Instant::now() < deadline, "the session schedule did not run {TICKS} times in 2 minutes");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (sum of seconds, count) of the schedule's runs so far.
async fn schedule_totals(metrics: &str) -> anyhow::Result<(f64, f64)> {
    let url = format!("{}/metrics", metrics.trim_end_matches('/'));
    let text = reqwest::get(&url).await?.error_for_status()?.text().await.with_context(|| format!("reading {url}"))?;
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
            .with_context(|| format!("{url} has no {name}"))
    };
    Ok((value("space_schedule_tick_duration_seconds_sum")?, value("space_schedule_tick_duration_seconds_count")?))
}

fn ids(sessions: Vec<space_api::Session>) -> Vec<String> {
    sessions.into_iter().map(|s| s.id.to_string()).collect()
}
