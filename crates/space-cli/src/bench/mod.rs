//! `space bench`: latency of the platform's hot paths through the HTTP API, as a user sees
//! them. Prints a table and one JSON object per measure, and saves them under `bench/results/`.

use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use space_api::{CreateSessionRequest, ExecRequest, ExecResult, Session};

use crate::client::Client;
use crate::output::print_table;

#[derive(Args)]
pub struct BenchArgs {
    /// Samples per measure.
    #[arg(long, default_value_t = 100)]
    n: usize,
    /// Template the sessions start from.
    #[arg(long, default_value = "busybox")]
    template: String,
    /// Directory the JSON results are written to.
    #[arg(long, default_value = "bench/results")]
    out: std::path::PathBuf,
}

#[derive(Debug, Serialize)]
struct Measure {
    measure: String,
    n: usize,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
}

fn summarize(name: &str, mut samples: Vec<Duration>) -> Measure {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let pick = |q: f64| ms(samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1]);
    Measure {
        measure: name.to_owned(),
        n: samples.len(),
        p50_ms: pick(0.50),
        p90_ms: pick(0.90),
        p99_ms: pick(0.99),
        mean_ms: samples.iter().map(|d| ms(*d)).sum::<f64>() / samples.len() as f64,
    }
}

async fn create(client: &Client, template: &str) -> anyhow::Result<Session> {
    let request = CreateSessionRequest { template: Some(template.to_owned()), ..Default::default() };
    client.post_json("/v1/sessions", &request).await
}

async fn run_true(client: &Client, id: &str) -> anyhow::Result<()> {
    let request = ExecRequest { cmd: vec!["true".into()], ..Default::default() };
    let result: ExecResult = client.post_json(&format!("/v1/sessions/{id}/exec"), &request).await?;
    anyhow::ensure!(result.exit_code == Some(0), "true exited with {:?}", result.exit_code);
    Ok(())
}

async fn destroy(client: &Client, id: &str) {
    let _ = client.delete_json::<Session>(&format!("/v1/sessions/{id}?wait=false")).await;
}

pub async fn run(client: &Client, args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.n > 0, "--n must be at least 1");
    let (mut create_only, mut create_and_true) = (Vec::new(), Vec::new());
    for _ in 0..args.n {
        let t0 = Instant::now();
        let session = create(client, &args.template).await?;
        let t1 = Instant::now();
        run_true(client, session.id.as_str()).await?;
        let t2 = Instant::now();
        create_only.push(t1 - t0);
        create_and_true.push(t2 - t0);
        destroy(client, session.id.as_str()).await;
    }
    let session = create(client, &args.template).await?;
    let mut exec_rtt = Vec::new();
    for _ in 0..args.n {
        let t0 = Instant::now();
        run_true(client, session.id.as_str()).await?;
        exec_rtt.push(t0.elapsed());
    }
    destroy(client, session.id.as_str()).await;

    let measures = [
        summarize("cold_create_api", create_only),
        summarize("cold_create_until_true_exited", create_and_true),
        summarize("exec_true_round_trip", exec_rtt),
    ];
    let rows: Vec<Vec<String>> = measures
        .iter()
        .map(|m| {
            vec![
                m.measure.clone(),
                m.n.to_string(),
                format!("{:.2}", m.p50_ms),
                format!("{:.2}", m.p90_ms),
                format!("{:.2}", m.p99_ms),
            ]
        })
        .collect();
    print_table(&["MEASURE", "N", "P50 MS", "P90 MS", "P99 MS"], &rows);
    let mut lines = String::new();
    for m in &measures {
        let line = serde_json::to_string(m)?;
        println!("{line}");
        lines.push_str(&line);
        lines.push('\n');
    }
    save(&args.out, &lines)
}

fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let memory = read("/proc/meminfo").lines().next().unwrap_or_default().to_owned();
    let model = read("/proc/cpuinfo").lines().find(|l| l.starts_with("model name")).unwrap_or_default().to_owned();
    serde_json::json!({ "cpus": cpus, "kernel": read("/proc/sys/kernel/osrelease").trim(), "memory": memory, "cpu": model })
}

fn save(dir: &std::path::Path, lines: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let path = dir.join(format!("{stamp}.jsonl"));
    let header = serde_json::json!({ "machine": machine(), "at": stamp });
    std::fs::write(&path, format!("{header}\n{lines}"))?;
    eprintln!("saved {}", path.display());
    Ok(())
}
