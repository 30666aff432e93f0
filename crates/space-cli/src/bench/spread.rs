//! Many creates spread over a cluster's nodes, through one control replica and then through
//! several (`--spread N --spread-via URL`): the throughput each achieves, each create's
//! latency, the errors, and how the sessions fell on the nodes. The sessions of each run are
//! destroyed (untimed) before the next.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Semaphore;

use super::api;
use super::report::{Report, round, summarize};
use crate::client::Client;

/// What one run of `count` creates gave.
struct Run {
    latencies: Vec<Duration>,
    elapsed: Duration,
    errors: Vec<String>,
    /// Sessions created, by node.
    per_node: BTreeMap<String, usize>,
    ids: Vec<String>,
}

/// `count` creates through the first replica alone, then through all of `replicas` in turn
/// (request i goes to replica i mod len), `concurrency` at a time.
pub async fn measure(
    replicas: &[Client],
    template: &str,
    count: usize,
    concurrency: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let mut throughputs = Vec::new();
    for used in [1, replicas.len()] {
        eprintln!("spread: {count} creates through {used} replica(s), {concurrency} at a time");
        let run = creates(&replicas[..used], template, count, concurrency).await;
        api::destroy_all(&replicas[0], &run.ids).await;
        let throughput = run.ids.len() as f64 / run.elapsed.as_secs_f64();
        throughputs.push(throughput);
        report.add(summarize(&format!("spread_{count}_create_{used}_replicas"), run.latencies));
        report.add_value(json!({
            "measure": format!("spread_{count}_throughput_{used}_replicas"),
            "n": count,
            "created": run.ids.len(),
            "errors": run.errors.len(),
            "first_errors": run.errors.iter().take(3).collect::<Vec<_>>(),
            "total_ms": round(run.elapsed.as_secs_f64() * 1000.0),
            "creates_per_s": round(throughput),
            "per_node": run.per_node,
        }));
    }
    if let [one, all] = throughputs[..] {
        report.add_value(json!({
            "measure": format!("spread_{count}_throughput_ratio"),
            "replicas": replicas.len(),
            "ratio": round(all / one),
        }));
    }
    Ok(())
}

async fn creates(replicas: &[Client], template: &str, count: usize, concurrency: usize) -> Run {
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let (client, template, slots) = (replicas[i % replicas.len()].clone(), template.to_owned(), slots.clone());
            tokio::spawn(async move {
                let _slot = slots.acquire_owned().await?;
                let start = Instant::now();
                let session = api::create(&client, &template).await?;
                anyhow::Ok((start.elapsed(), session))
            })
        })
        .collect();
    let mut run = Run {
        latencies: Vec::new(),
        elapsed: Duration::ZERO,
        errors: Vec::new(),
        per_node: BTreeMap::new(),
        ids: Vec::new(),
    };
    for task in tasks {
        match task.await {
            Ok(Ok((latency, session))) => {
                run.latencies.push(latency);
                *run.per_node.entry(session.node.unwrap_or_default()).or_default() += 1;
                run.ids.push(session.id.to_string());
            }
            Ok(Err(e)) => run.errors.push(format!("{e:#}")),
            Err(e) => run.errors.push(e.to_string()),
        }
    }
    run.elapsed = t0.elapsed();
    run
}
