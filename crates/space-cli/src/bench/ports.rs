//! The port proxy: a request's round trip through `/v1/sessions/{id}/ports/{port}/`, and a
//! large download through it against the same download made inside the sandbox.

use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::Method;
use serde_json::json;

use super::api;
use super::report::{Report, round, summarize};
use crate::client::Client;

const PORT: u16 = 8000;

pub struct PortArgs {
    pub n: usize,
    pub bytes: u64,
    pub runs: usize,
}

pub async fn measure(client: &Client, template: &str, args: &PortArgs, report: &mut Report) -> anyhow::Result<()> {
    let session = api::create(client, template).await?;
    let id = session.id.to_string();
    let result = measure_on(client, &id, args, report).await;
    api::destroy(client, &id, false).await?;
    result
}

async fn measure_on(client: &Client, id: &str, args: &PortArgs, report: &mut Report) -> anyhow::Result<()> {
    let serve = format!(
        "mkdir -p /www && echo ok > /www/index.html && head -c {} /dev/zero > /www/big && \
         exec busybox httpd -f -p 0.0.0.0:{PORT} -h /www",
        args.bytes
    );
    let request = json!({ "cmd": ["sh", "-c", serve], "background": true });
    let _: serde_json::Value = client.post_json(&format!("/v1/sessions/{id}/exec"), &request).await?;
    let small = format!("/v1/sessions/{id}/ports/{PORT}/index.html");
    wait_served(client, &small).await?;
    let mut samples = Vec::with_capacity(args.n);
    for _ in 0..args.n {
        let started = Instant::now();
        get(client, &small).await?;
        samples.push(started.elapsed());
    }
    report.add(summarize("port_proxy_request", samples));

    let big = format!("/v1/sessions/{id}/ports/{PORT}/big");
    let mut proxied = Vec::new();
    let mut inside = Vec::new();
    let exec_true = median(exec_times(client, id, &["true"], 5).await?);
    let wget = format!("http://127.0.0.1:{PORT}/big");
    let download = ["env", "-u", "http_proxy", "busybox", "wget", "-q", "-O", "/dev/null", wget.as_str()];
    for _ in 0..args.runs.max(1) {
        let started = Instant::now();
        let got = get(client, &big).await?;
        anyhow::ensure!(got == args.bytes, "the proxy delivered {got} of {} bytes", args.bytes);
        proxied.push(started.elapsed());
        // Inside, as a direct connection: the exec's own round trip taken off.
        inside.push(median(exec_times(client, id, &download, 1).await?).saturating_sub(exec_true));
    }
    let mib_s = |d: Duration| round(args.bytes as f64 / (1 << 20) as f64 / d.as_secs_f64().max(1e-9));
    let (through, direct) = (mib_s(median(proxied)), mib_s(median(inside)));
    report.add_value(json!({
        "measure": "port_proxy_download",
        "bytes": args.bytes,
        "runs": args.runs,
        "proxy_mib_s": through,
        "inside_sandbox_mib_s": direct,
        "ratio": round(through / direct.max(1e-9)),
    }));
    Ok(())
}

/// Reads the whole body of a GET through the proxy; returns its length.
async fn get(client: &Client, path: &str) -> anyhow::Result<u64> {
    let response = client.send(client.request(Method::GET, path)).await?;
    let mut body = response.bytes_stream();
    let mut total = 0u64;
    while let Some(chunk) = body.next().await {
        total += chunk?.len() as u64;
    }
    Ok(total)
}

async fn wait_served(client: &Client, path: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match get(client, path).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e.context("httpd never answered")),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn exec_times(client: &Client, id: &str, cmd: &[&str], n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        api::run(client, id, cmd).await?;
        times.push(started.elapsed());
    }
    Ok(times)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}
