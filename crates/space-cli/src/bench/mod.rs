//! `space bench`: the platform's hot paths through the HTTP API, side by side with peer
//! runtimes (`runc run`, `bwrap`) on the same machine and the same root filesystem. Prints a
//! table and one JSON object per measure, and saves them under `bench/results/`. Run it on
//! the server's machine: the peers need the template's files.

mod api;
mod density;
mod gateway;
mod lifecycle;
mod moves;
mod peers;
mod ports;
mod report;
mod scale;
mod spread;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use clap::Args;
use serde_json::json;

use crate::client::Client;
use report::{Report, round, summarize};

#[derive(Args)]
pub struct BenchArgs {
    /// Creates per mode (warm pool, cold).
    #[arg(long, default_value_t = 200)]
    n: usize,
    /// Exec round trips on one session.
    #[arg(long, default_value_t = 1000)]
    exec_n: usize,
    /// Runs of `space exec ID -- true` as a whole process, timed from spawn to exit (0 skips
    /// them).
    #[arg(long, default_value_t = 100)]
    cli_exec_n: usize,
    /// Runs of each peer runtime.
    #[arg(long, default_value_t = 100)]
    peer_n: usize,
    /// Concurrent creates of the burst measure (0 skips it).
    #[arg(long, default_value_t = 100)]
    burst: usize,
    /// Idle sessions of the density measure (0 skips it).
    #[arg(long, default_value_t = 500)]
    density: usize,
    /// Samples of the lifecycle measures (0 skips them).
    #[arg(long, default_value_t = 50)]
    lifecycle_n: usize,
    /// Suspend-to-the-blob-store and resume-on-another-node rounds of a session holding 100
    /// MiB (0 skips them; needs two nodes or more sharing a blob store, and the admin key).
    #[arg(long, default_value_t = 0)]
    move_n: usize,
    /// Creates of the spread measure: through this replica, then through it and every
    /// `--spread-via` replica in turn (0 skips it).
    #[arg(long, default_value_t = 0)]
    spread: usize,
    /// Another control replica (its URL) over the same database, for the spread measure.
    #[arg(long)]
    spread_via: Vec<String>,
    /// Creates of the spread measure in flight at once.
    #[arg(long, default_value_t = 32)]
    spread_concurrency: usize,
    /// Only the spread measure.
    #[arg(long)]
    spread_only: bool,
    /// Sessions in the database at the end of the scale measure, most of them destroyed (0
    /// skips it; needs `--metrics-url`).
    #[arg(long, default_value_t = 0)]
    scale: usize,
    /// Live sessions at the end of the scale measure.
    #[arg(long, default_value_t = 500)]
    scale_live: usize,
    /// Lists and creates timed in each phase of the scale measure.
    #[arg(long, default_value_t = 100)]
    scale_samples: usize,
    /// Only the scale measure.
    #[arg(long)]
    scale_only: bool,
    /// The server's metrics listener (`space serve --metrics-listen`), e.g.
    /// `http://127.0.0.1:9464`: the scale measure times the session schedule there.
    #[arg(long)]
    metrics_url: Option<String>,
    /// Template the sessions and the peers start from.
    #[arg(long, default_value = "busybox")]
    template: String,
    /// Warm pool size during the warm measures.
    #[arg(long, default_value_t = 8)]
    pool: u32,
    /// The server's `--cgroup-parent` (density reads the sandboxes' memory there).
    #[arg(long, default_value = "space")]
    cgroup_parent: String,
    /// Skip `runc` and `bwrap`.
    #[arg(long)]
    no_peers: bool,
    /// HTTPS requests per gateway latency measure (0 skips the gateway measures, which start
    /// a server of their own with the gateway's test flags).
    #[arg(long, default_value_t = 500)]
    gateway_n: usize,
    /// Bytes of the gateway download measures.
    #[arg(long, default_value_t = 1 << 30)]
    gateway_bytes: u64,
    /// Downloads per gateway throughput measure (the median is reported).
    #[arg(long, default_value_t = 3)]
    gateway_runs: usize,
    /// mitmproxy's `mitmdump`, measured side by side with the gateway (as scripts/bench.sh
    /// installs it; skipped when missing).
    #[arg(long, default_value = "/var/cache/space/mitmproxy/bin/mitmdump")]
    mitmdump: PathBuf,
    /// Requests through the port proxy (0 skips the port measures).
    #[arg(long, default_value_t = 200)]
    ports_n: usize,
    /// Bytes of the port proxy's download measure.
    #[arg(long, default_value_t = 100 << 20)]
    ports_bytes: u64,
    /// Only the gateway measures (they need no running server).
    #[arg(long)]
    pub gateway_only: bool,
    /// Directory the JSON results are written to.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
}

/// `--gateway-only`: the gateway measures alone.
pub async fn run_gateway_only(args: &BenchArgs) -> anyhow::Result<()> {
    let mut report = Report::default();
    gateway::measure(&gateway_args(args), &mut report).await?;
    report.print();
    report.save(&args.out)
}

pub async fn run(client: &Client, args: BenchArgs, data_dir: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(args.n >= 2 && args.exec_n > 0, "--n must be at least 2 and --exec-n at least 1");
    let initial = api::pool(client).await?;
    let size_before = initial.templates.iter().find(|t| t.template == args.template).map_or(0, |t| t.size);
    let mut report = Report::default();
    let result = match (args.spread_only, args.scale_only) {
        (true, _) => spread_measure(client, &args, &mut report).await,
        (false, true) => scale_measure(client, &args, data_dir, &mut report).await,
        (false, false) => measure_all(client, &args, data_dir, &mut report).await,
    };
    if let Err(e) = api::set_pool(client, &args.template, size_before).await {
        eprintln!("warning: restoring the pool size of {}: {e:#}", args.template);
    }
    result?;
    report.print();
    report.save(&args.out)
}

async fn measure_all(client: &Client, args: &BenchArgs, data_dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let template = args.template.as_str();
    eprintln!("creates: warm pool of {} ({} samples)", args.pool, args.n);
    api::set_pool(client, template, args.pool).await?;
    let warm = api::creates(client, template, args.n, true).await?;
    eprintln!("creates: cold ({} samples)", args.n);
    api::set_pool(client, template, 0).await?;
    let cold = api::creates(client, template, args.n, false).await?;
    for (mode, samples) in [("warm", warm), ("cold", cold)] {
        report.add(summarize(&format!("create_api_{mode}"), samples.create));
        report.add(summarize(&format!("create_true_exited_{mode}"), samples.create_true));
        report.add(summarize(&format!("time_to_first_output_{mode}"), samples.first_output));
    }
    eprintln!("exec round trips ({} through the API, {} with the CLI)", args.exec_n, args.cli_exec_n);
    let (through_api, with_cli) = api::exec_round_trips(client, template, args.exec_n, args.cli_exec_n).await?;
    let api_p50 = report.add(summarize("exec_true_round_trip", through_api)).p50_ms;
    if !with_cli.is_empty() {
        let cli_p50 = report.add(summarize("exec_cli_true", with_cli)).p50_ms;
        report.add_value(json!({
            "measure": "exec_cli_over_api_p50",
            "ms": round(cli_p50 - api_p50),
            "goal_ms": 2.0,
            "met": cli_p50 - api_p50 <= 2.0,
        }));
    }
    if !args.no_peers {
        peer_measures(client, args, data_dir, report).await?;
    }
    if args.lifecycle_n > 0 {
        eprintln!("lifecycle: pause/resume, snapshots, restore, fork, full snapshots ({} samples)", args.lifecycle_n);
        api::set_pool(client, template, 0).await?;
        lifecycle::measure(client, template, args.lifecycle_n, report).await?;
    }
    if args.move_n > 0 {
        eprintln!("moves: suspend to the blob store, resume on another node ({} samples)", args.move_n);
        api::set_pool(client, template, 0).await?;
        moves::measure(client, template, args.move_n, report).await?;
    }
    if args.burst > 0 {
        burst_measures(client, args, report).await?;
    }
    if args.spread > 0 {
        spread_measure(client, args, report).await?;
    }
    if args.scale > 0 {
        scale_measure(client, args, data_dir, report).await?;
    }
    if args.density > 0 {
        eprintln!("density: {} idle sessions", args.density);
        api::set_pool(client, template, 0).await?;
        report.add_value(density::measure(client, template, args.density, &args.cgroup_parent).await?);
    }
    if args.ports_n > 0 {
        eprintln!("ports: {} requests and a {} MiB download through the proxy", args.ports_n, args.ports_bytes >> 20);
        let ports_args = ports::PortArgs { n: args.ports_n, bytes: args.ports_bytes, runs: 3 };
        ports::measure(client, template, &ports_args, report).await?;
    }
    if args.gateway_n > 0 {
        gateway::measure(&gateway_args(args), report).await?;
    }
    Ok(())
}

fn gateway_args(args: &BenchArgs) -> gateway::GatewayArgs {
    gateway::GatewayArgs {
        n: args.gateway_n.max(1),
        bytes: args.gateway_bytes,
        runs: args.gateway_runs,
        mitmdump: args.mitmdump.clone(),
    }
}

async fn peer_measures(client: &Client, args: &BenchArgs, data_dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let rootfs = template_rootfs(client, &args.template, data_dir).await?;
    let n = args.peer_n;
    eprintln!("peers on {} ({n} runs each)", rootfs.display());
    let work = std::env::temp_dir().join(format!("space-bench-{}", std::process::id()));
    let (root, bundles) = (rootfs.clone(), work.clone());
    let runc = tokio::task::spawn_blocking(move || peers::runc_true(&root, &bundles, n)).await;
    // The bundle inside went with its run; the directory that held it goes too.
    let _ = std::fs::remove_dir(&work);
    let runc = runc??;
    report.add(summarize("runc_run_true", runc));
    let bwrap = tokio::task::spawn_blocking(move || peers::bwrap_true(&rootfs, n)).await??;
    report.add(summarize("bwrap_true", bwrap));
    for peer in ["runc_run_true", "bwrap_true"] {
        for ours in ["create_true_exited_warm", "create_true_exited_cold"] {
            report.add_ratio(peer, ours);
        }
    }
    Ok(())
}

/// The template's files in the pool: the same root filesystem the peers run from.
async fn template_rootfs(client: &Client, template: &str, data_dir: &Path) -> anyhow::Result<PathBuf> {
    let list: space_api::TemplateList = client.get_json("/v1/templates").await?;
    let version = list
        .templates
        .iter()
        .filter(|t| t.name == template)
        .map(|t| t.version)
        .max()
        .with_context(|| format!("template {template} is not built"))?;
    let path = data_dir.join(format!("pool/templates/{template}@{version}"));
    anyhow::ensure!(
        path.is_dir(),
        "{} does not exist: run the benchmark on the server's machine with its --data-dir, or pass --no-peers",
        path.display()
    );
    Ok(path)
}

async fn scale_measure(client: &Client, args: &BenchArgs, data_dir: &Path, report: &mut Report) -> anyhow::Result<()> {
    let metrics = args.metrics_url.clone().context("the scale measure needs --metrics-url")?;
    let scale_args = scale::ScaleArgs {
        total: args.scale,
        live: args.scale_live,
        samples: args.scale_samples.max(1),
        metrics,
        pool: data_dir.join("pool"),
    };
    scale::measure(client, &args.template, &scale_args, report).await
}

async fn spread_measure(client: &Client, args: &BenchArgs, report: &mut Report) -> anyhow::Result<()> {
    anyhow::ensure!(args.spread > 0, "--spread-only needs --spread N");
    let mut replicas = vec![client.clone()];
    replicas.extend(args.spread_via.iter().map(|url| client.at(url)));
    spread::measure(&replicas, &args.template, args.spread, args.spread_concurrency, report).await
}

async fn burst_measures(client: &Client, args: &BenchArgs, report: &mut Report) -> anyhow::Result<()> {
    let (template, count) = (args.template.as_str(), args.burst);
    // Another user's session, created before the burst: its exec round trips during the burst.
    let bystander = api::create(client, template).await?.id.to_string();
    let result = async {
        for (mode, pool) in [("warm", count as u32), ("cold", 0)] {
            eprintln!("burst: {count} concurrent creates, pool {pool}, another session's execs meanwhile");
            api::set_pool(client, template, pool).await?;
            api::wait_pool_ready(client, template, pool).await?;
            let stop = Arc::new(AtomicBool::new(false));
            let others = tokio::spawn(api::exec_until(client.clone(), bystander.clone(), stop.clone()));
            let burst = api::burst(client, template, count).await;
            stop.store(true, Ordering::Relaxed);
            let others = others.await;
            let (latencies, all, ids) = burst?;
            api::destroy_all(client, &ids).await;
            report.add(summarize(&format!("burst_{count}_create_{mode}"), latencies));
            report.add_value(json!({
                "measure": format!("burst_{count}_all_running_{mode}"),
                "n": count,
                "total_ms": round(all.as_secs_f64() * 1000.0),
            }));
            let others = report.add(summarize(&format!("burst_{count}_other_session_exec_{mode}"), others??));
            let p99 = others.p99_ms;
            report.add_value(json!({
                "measure": format!("goal:burst_{count}_other_session_exec_{mode}_p99"),
                "p99_ms": round(p99),
                "goal_ms": 20.0,
                "met": p99 <= 20.0,
            }));
        }
        anyhow::Ok(())
    }
    .await;
    let destroyed = api::destroy(client, &bystander, true).await;
    result?;
    destroyed
}
