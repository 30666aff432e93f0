//! Egress gateway measures: the latency an HTTPS request gains by going through the gateway
//! with a credential injected (against the same request made straight from the host to the
//! same loopback upstream), the throughput of a large download intercepted by the gateway, and
//! mitmproxy doing the same interception on the same machine in the same run.
//!
//! The gateway only trusts and reaches a test upstream with operator flags, so this section
//! starts its own `space serve` (own data dir, port and cgroup parent) with
//! `--gateway-resolve`, `--gateway-extra-root` and `--gateway-allow-private`, and removes it
//! afterwards. The upstream is an HTTPS server in this process on a loopback address, with a
//! certificate from a throw-away CA; clients are `curl` on the host and in a `debian` sandbox,
//! which reports each request's time itself (`-w %{time_total}`), so process start-up is in no
//! sample.

use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::report::{Report, round, summarize};
use crate::client::Client;

/// The intercepted name (a credential is granted for it) and a tunnelled one.
const INTERCEPTED: &str = "bench.test";
const TUNNELLED: &str = "tunnel.test";
/// Intercepted with an OAuth credential whose token endpoint is the upstream's `/oauth/token`.
const INTERCEPTED_OAUTH: &str = "oauth.bench.test";
const CHUNK: usize = 256 << 10;

pub struct GatewayArgs {
    /// Requests per latency measure.
    pub n: usize,
    /// Bytes of the download measures.
    pub bytes: u64,
    /// Downloads per throughput measure (the median is reported).
    pub runs: usize,
    /// `mitmdump`; its measures are skipped when it does not exist.
    pub mitmdump: PathBuf,
}

pub async fn measure(args: &GatewayArgs, report: &mut Report) -> anyhow::Result<()> {
    let work = std::env::temp_dir().join(format!("space-bench-gateway-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let result = measure_in(args, &work, report).await;
    let _ = std::fs::remove_dir_all(&work);
    result
}

async fn measure_in(args: &GatewayArgs, work: &Path, report: &mut Report) -> anyhow::Result<()> {
    let upstream = Upstream::start(work).await?;
    eprintln!("gateway: upstream at {}:443; starting a server with the gateway flags", upstream.ip);
    let server = BenchServer::start(&upstream, work).await?;
    let result = async {
        let client = Client::new(&server.url, Some(server.key.clone()), &server.data_dir)?;
        let id = prepare_session(&client, &upstream).await?;
        let sandbox = Sandbox { client: &client, id: &id };
        let measured = async {
            latency_measures(args, &upstream, &sandbox, report).await?;
            throughput_measures(args, &upstream, &sandbox, server.child.id(), work, report).await
        }
        .await;
        let _ = client.delete_json::<Value>(&format!("/v1/sessions/{id}?wait=true")).await;
        measured
    }
    .await;
    server.stop().await;
    result
}

/// The session: `bench.test` intercepted with a credential, `tunnel.test` allowed, and the
/// upstream's CA written where curl can be told to trust it for the tunnelled name.
async fn prepare_session(client: &Client, upstream: &Upstream) -> anyhow::Result<String> {
    let credential = json!({
        "name": "bench", "hosts": [INTERCEPTED], "header": "Authorization: Bearer {secret}",
        "value": format!("bench-secret-{}", std::process::id()),
    });
    let _: Value = client.post_json("/v1/credentials", &credential).await.context("creating the credential")?;
    let oauth = json!({
        "name": "bench-oauth", "hosts": [INTERCEPTED_OAUTH], "kind": "oauth2",
        "oauth2": { "token_url": format!("https://{INTERCEPTED}/oauth/token"), "client_id": "bench",
                    "client_secret": "bench-client-secret", "grant_type": "client_credentials" },
    });
    let _: Value = client.post_json("/v1/credentials", &oauth).await.context("creating the OAuth credential")?;
    let body = json!({
        "template": "debian", "memory_mib": 1024,
        "network": { "allow": [TUNNELLED] }, "grants": ["bench", "bench-oauth"],
    });
    let session: Value = client.post_json("/v1/sessions", &body).await.context("creating the session")?;
    let id = session["id"].as_str().context("session without id")?.to_owned();
    let write = json!({ "cmd": ["sh", "-c", "cat > /tmp/upstream-ca.pem"], "stdin": upstream.ca_pem });
    let r: Value = client.post_json(&format!("/v1/sessions/{id}/exec"), &write).await?;
    anyhow::ensure!(r["exit_code"] == 0, "writing the upstream CA: {r}");
    Ok(id)
}

struct Sandbox<'a> {
    client: &'a Client,
    id: &'a str,
}

impl Sandbox<'_> {
    async fn sh(&self, script: &str) -> anyhow::Result<String> {
        let body = json!({ "cmd": ["sh", "-c", script], "timeout_ms": 600_000 });
        let r: Value = self.client.post_json(&format!("/v1/sessions/{}/exec", self.id), &body).await?;
        anyhow::ensure!(r["exit_code"] == 0, "{script}: {r}");
        Ok(r["stdout"].as_str().unwrap_or_default().to_owned())
    }
}

/// `curl` arguments fetching `url` `n` times in one process, printing each transfer's total
/// time; `fresh` asks for a new connection per request.
fn curl_loop(n: usize, url: &str, fresh: bool) -> String {
    let close = if fresh { "-H 'Connection: close'" } else { "" };
    // Each URL needs its own `-o`.
    let urls = (0..n).map(|i| format!("-o /dev/null '{url}?{i}'")).collect::<Vec<_>>().join(" ");
    format!("curl -sS --fail {close} -w '%{{time_total}}\\n' {urls}")
}

fn parse_times(text: &str) -> anyhow::Result<Vec<Duration>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Ok(Duration::from_secs_f64(l.trim().parse::<f64>().with_context(|| format!("curl printed {l:?}"))?)))
        .collect()
}

async fn host_sh(script: &str) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("sh").args(["-c", script]).stdin(Stdio::null()).output().await?;
    anyhow::ensure!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn latency_measures(
    args: &GatewayArgs,
    upstream: &Upstream,
    sandbox: &Sandbox<'_>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let n = args.n;
    let direct = format!("--cacert {} --resolve {INTERCEPTED}:443:{}", upstream.ca_file.display(), upstream.ip);
    let url = format!("https://{INTERCEPTED}/small");
    for (mode, fresh) in [("keepalive", false), ("new_connection", true)] {
        eprintln!("gateway: {n} HTTPS requests ({mode}), from the host and through the gateway");
        // Warm-up (connections, certificate cache), untimed.
        // Both sides verify against one certificate: with the whole bundle of
        // `CURL_CA_BUNDLE` curl spends ~45 ms loading it at every new connection here.
        let session_ca = format!("--cacert {}", "/etc/space/ca.crt");
        host_sh(&format!("{} {direct}", curl_loop(5, &url, fresh))).await?;
        sandbox.sh(&format!("{} {session_ca}", curl_loop(5, &url, fresh))).await?;
        let host = parse_times(&host_sh(&format!("{} {direct}", curl_loop(n, &url, fresh))).await?)?;
        let through = parse_times(&sandbox.sh(&format!("{} {session_ca}", curl_loop(n, &url, fresh))).await?)?;
        let direct_name = format!("https_request_direct_{mode}");
        let gateway_name = format!("https_request_gateway_injected_{mode}");
        let (d50, d90) = {
            let m = report.add(summarize(&direct_name, host));
            (m.p50_ms, m.p90_ms)
        };
        let (g50, g90) = {
            let m = report.add(summarize(&gateway_name, through));
            (m.p50_ms, m.p90_ms)
        };
        report.add_value(json!({
            "measure": format!("gateway_added_latency_{mode}"),
            "n": n,
            "added_p50_ms": round(g50 - d50),
            "added_p90_ms": round(g90 - d90),
            "goal_added_p50_ms": 1.0,
            "met": g50 - d50 <= 1.0,
        }));
        oauth_measure(n, mode, fresh, (g50, g90), sandbox, report).await?;
        // For comparison: a tunnelled (not intercepted) allowed host, through the proxy.
        let tunnelled_url = format!("https://{TUNNELLED}/small");
        let tunnelled = format!("{} --cacert /tmp/upstream-ca.pem", curl_loop(n, &tunnelled_url, fresh));
        sandbox.sh(&format!("{} --cacert /tmp/upstream-ca.pem", curl_loop(5, &tunnelled_url, fresh))).await?;
        report.add(summarize(
            &format!("https_request_gateway_tunnelled_{mode}"),
            parse_times(&sandbox.sh(&tunnelled).await?)?,
        ));
    }
    Ok(())
}

/// The same requests to a host whose credential is an OAuth one with its token cached (the
/// first, untimed requests get it), against `static_ms` (p50, p90) of the static credential's.
async fn oauth_measure(
    n: usize,
    mode: &str,
    fresh: bool,
    static_ms: (f64, f64),
    sandbox: &Sandbox<'_>,
    report: &mut Report,
) -> anyhow::Result<()> {
    let url = format!("https://{INTERCEPTED_OAUTH}/small");
    let session_ca = "--cacert /etc/space/ca.crt";
    sandbox.sh(&format!("{} {session_ca}", curl_loop(5, &url, fresh))).await?;
    let times = parse_times(&sandbox.sh(&format!("{} {session_ca}", curl_loop(n, &url, fresh))).await?)?;
    let (o50, o90) = {
        let m = report.add(summarize(&format!("https_request_gateway_injected_oauth_{mode}"), times));
        (m.p50_ms, m.p90_ms)
    };
    report.add_value(json!({
        "measure": format!("oauth_cached_token_added_latency_{mode}"),
        "n": n,
        "added_p50_ms": round(o50 - static_ms.0),
        "added_p90_ms": round(o90 - static_ms.1),
        "goal_added_p50_ms": 0.1,
        "met": o50 - static_ms.0 <= 0.1,
    }));
    Ok(())
}

/// Median MiB/s of `runs` downloads, each timed by curl (`time_total size_download`).
async fn downloads<F, Fut>(runs: usize, mut one: F) -> anyhow::Result<(f64, f64)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    let mut rates = Vec::new();
    let mut seconds = Vec::new();
    for _ in 0..runs.max(1) {
        let out = one().await?;
        let mut fields = out.split_whitespace();
        let (Some(time), Some(size)) = (fields.next(), fields.next()) else { bail!("curl printed {out:?}") };
        let (time, size): (f64, f64) = (time.parse()?, size.parse()?);
        rates.push(size / time / (1 << 20) as f64);
        seconds.push(time);
    }
    rates.sort_by(f64::total_cmp);
    seconds.sort_by(f64::total_cmp);
    Ok((rates[rates.len() / 2], seconds[seconds.len() / 2]))
}

async fn throughput_measures(
    args: &GatewayArgs,
    upstream: &Upstream,
    sandbox: &Sandbox<'_>,
    server_pid: Option<u32>,
    work: &Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    let bytes = args.bytes;
    let label = if bytes == 1 << 30 { "1gib".to_owned() } else { format!("{}mib", bytes >> 20) };
    let fetch = "curl -sS --fail -o /dev/null -w '%{time_total} %{size_download}'";
    let ca = upstream.ca_file.display();
    let add = |report: &mut Report, name: String, (rate, secs): (f64, f64)| {
        report.add_value(json!({
            "measure": name, "runs": args.runs, "bytes": bytes,
            "mib_per_s": round(rate), "seconds": round(secs),
        }));
        rate
    };
    eprintln!("gateway: {label} downloads ({} each): direct, intercepted, tunnelled, mitmproxy", args.runs);
    let script = format!(
        "{fetch} --cacert {ca} --resolve {INTERCEPTED}:443:{} https://{INTERCEPTED}/bytes/{bytes}",
        upstream.ip
    );
    let direct = downloads(args.runs, || host_sh(&script)).await?;
    add(report, format!("download_{label}_direct"), direct);
    let script = format!("{fetch} --cacert /etc/space/ca.crt https://{INTERCEPTED}/bytes/{bytes}");
    let before = server_pid.map(CpuMark::take).transpose()?;
    let intercepted = downloads(args.runs, || sandbox.sh(&script)).await?;
    let after_intercepted = server_pid.map(CpuMark::take).transpose()?;
    let ours = add(report, format!("download_{label}_gateway_intercepted"), intercepted);
    let script = format!("{fetch} --cacert /tmp/upstream-ca.pem https://{TUNNELLED}/bytes/{bytes}");
    let tunnelled = downloads(args.runs, || sandbox.sh(&script)).await?;
    let after_tunnelled = server_pid.map(CpuMark::take).transpose()?;
    add(report, format!("download_{label}_gateway_tunnelled"), tunnelled);
    report.add_value(json!({
        "measure": format!("ratio:download_{label}_gateway_intercepted/direct"),
        "ratio": round(ours / direct.0),
        "goal": 0.8,
        "met": ours / direct.0 >= 0.8,
    }));
    if let (Some(a), Some(b), Some(c)) = (before, after_intercepted, after_tunnelled) {
        let gib = (args.runs.max(1) as u64 * bytes) as f64 / (1u64 << 30) as f64;
        let per_gib = |d: Duration| d.as_secs_f64() / gib;
        let gateway = per_gib(b.server.saturating_sub(a.server));
        let busy = per_gib(b.machine_busy.saturating_sub(a.machine_busy));
        // Intercepting decrypts and encrypts every byte once: the least any gateway spends.
        let floor = aes_gcm_seconds_per_gib().await.map(|s| 2.0 * s);
        // Had the gateway spent only that, and everything else the same CPU, the download
        // could at best have run on all cores at once: the ratio this machine allows.
        let cores = crate::serve::host_cpus() as f64;
        let best_ratio = floor
            .map(|floor| (busy - gateway + floor) / cores)
            .filter(|seconds_per_gib| *seconds_per_gib > 0.0)
            .map(|seconds_per_gib| round(1024.0 / seconds_per_gib / direct.0));
        report.add_value(json!({
            "measure": "gateway_cpu_seconds_per_gib",
            "intercepted": round(gateway),
            "tunnelled": round(per_gib(c.server.saturating_sub(b.server))),
            "aes_256_gcm_floor": floor.map(round),
            "machine_busy_intercepted": round(busy),
            "best_ratio_intercepted_over_direct_at_floor": best_ratio,
        }));
    }

    if !args.mitmdump.exists() {
        eprintln!(
            "warning: {} not found (scripts/bench.sh installs it): mitmproxy measures skipped",
            args.mitmdump.display()
        );
        return Ok(());
    }
    let mitm = Mitmproxy::start(&args.mitmdump, upstream, work).await?;
    let result = async {
        let proxy = format!("-x http://127.0.0.1:{} --cacert {}", mitm.port, mitm.ca.display());
        let url = format!("https://{INTERCEPTED}/bytes/{bytes}");
        let script = format!("{fetch} {proxy} {url}");
        let theirs =
            add(report, format!("download_{label}_mitmproxy"), downloads(args.runs, || host_sh(&script)).await?);
        report.add_value(json!({
            "measure": format!("ratio:download_{label}_gateway_intercepted/mitmproxy"),
            "ratio": round(ours / theirs),
            "goal": 10.0,
            "met": ours / theirs >= 10.0,
            // No proxy can beat the direct download: the best ratio this machine allows.
            "ceiling_direct_over_mitmproxy": round(direct.0 / theirs),
        }));
        // mitmproxy's latency the same way (keep-alive), for the table.
        let url = format!("https://{INTERCEPTED}/small");
        let n = args.n.min(200);
        host_sh(&format!("{} {proxy}", curl_loop(5, &url, false))).await?;
        for (mode, fresh) in [("keepalive", false), ("new_connection", true)] {
            let times = parse_times(&host_sh(&format!("{} {proxy}", curl_loop(n, &url, fresh))).await?)?;
            report.add(summarize(&format!("https_request_mitmproxy_{mode}"), times));
        }
        anyhow::Ok(())
    }
    .await;
    mitm.stop().await;
    result
}

/// CPU time used so far by the server (user and system, all its threads: its node runs the
/// gateway) and by the whole machine (every core's time not idle).
#[derive(Clone, Copy)]
struct CpuMark {
    server: Duration,
    machine_busy: Duration,
}

impl CpuMark {
    fn take(server_pid: u32) -> anyhow::Result<CpuMark> {
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
        let ticks = |t: u64| Duration::from_secs_f64(t as f64 / hz);
        let path = format!("/proc/{server_pid}/stat");
        let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let server = process_cpu_ticks(&stat).with_context(|| format!("{path}: {stat}"))?;
        let all = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let busy = machine_busy_ticks(&all).with_context(|| format!("/proc/stat: {all}"))?;
        Ok(CpuMark { server: ticks(server), machine_busy: ticks(busy) })
    }
}

/// utime + stime from a `/proc/PID/stat` line. The command name, in parentheses, may hold
/// spaces; utime and stime are fields 14 and 15 of proc(5), the 12th and 13th after it.
fn process_cpu_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Every core's time not idle, from `/proc/stat`'s first line (`cpu  user nice system idle
/// iowait irq softirq steal …`): all but idle and iowait.
fn machine_busy_ticks(proc_stat: &str) -> Option<u64> {
    let line = proc_stat.lines().next()?.strip_prefix("cpu ")?;
    let cpu: Vec<u64> = line.split_whitespace().map_while(|f| f.parse().ok()).collect();
    let first = cpu.get(..8)?;
    Some(first.iter().sum::<u64>() - first[3] - first[4])
}

/// CPU seconds one pass of AES-256-GCM (the suite curl and the upstream settle on with the
/// gateway) takes over 1 GiB on one core here, from `openssl speed`; `None` without openssl.
async fn aes_gcm_seconds_per_gib() -> Option<f64> {
    let out = tokio::process::Command::new("openssl")
        .args(["speed", "-seconds", "1", "-bytes", "16384", "-evp", "aes-256-gcm"])
        .stderr(Stdio::null())
        .output()
        .await
        .ok()?;
    // The last line: `AES-256-GCM  3447465.29k`, thousands of bytes per second.
    let text = String::from_utf8_lossy(&out.stdout);
    let rate = text.lines().last()?.split_whitespace().last()?.strip_suffix('k')?.parse::<f64>().ok()? * 1000.0;
    Some((1u64 << 30) as f64 / rate)
}

/// `mitmdump` on the host with its own CA, verifying the upstream with the test CA, injecting
/// the same header, streaming bodies (not buffering 1 GiB), and sending `bench.test` to the
/// upstream's address.
struct Mitmproxy {
    child: tokio::process::Child,
    port: u16,
    ca: PathBuf,
}

impl Mitmproxy {
    async fn start(mitmdump: &Path, upstream: &Upstream, work: &Path) -> anyhow::Result<Mitmproxy> {
        let confdir = work.join("mitmproxy");
        std::fs::create_dir_all(&confdir)?;
        let addon = work.join("bench_addon.py");
        std::fs::write(
            &addon,
            format!(
                "def server_connect(data):\n    if data.server.address and data.server.address[0] == {INTERCEPTED:?}:\n        \
                 data.server.address = ({ip:?}, 443)\n\n\
                 def request(flow):\n    flow.request.headers['Authorization'] = 'Bearer bench-secret'\n",
                ip = upstream.ip.to_string()
            ),
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = tokio::process::Command::new(mitmdump)
            .args(["--listen-host", "127.0.0.1", "--listen-port", &port.to_string(), "-q"])
            .args(["--set", &format!("confdir={}", confdir.display())])
            .args(["--set", &format!("ssl_verify_upstream_trusted_ca={}", upstream.ca_file.display())])
            .args(["--set", "stream_large_bodies=1m", "--set", "flow_detail=0"])
            .arg("-s")
            .arg(&addon)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", mitmdump.display()))?;
        let ca = confdir.join("mitmproxy-ca-cert.pem");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(ca.exists() && tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()) {
            anyhow::ensure!(Instant::now() < deadline, "mitmdump did not start listening on {port}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Mitmproxy { child, port, ca })
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A `space serve` of its own for this section.
struct BenchServer {
    child: tokio::process::Child,
    url: String,
    key: String,
    data_dir: PathBuf,
    cgroup_parent: String,
}

impl BenchServer {
    async fn start(upstream: &Upstream, work: &Path) -> anyhow::Result<BenchServer> {
        let tag = format!("space-bench-gateway-{}", std::process::id());
        let data_dir = PathBuf::from("/var/tmp").join(&tag);
        std::fs::create_dir_all(&data_dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = std::fs::File::create(work.join("server.log"))?;
        let mut command = tokio::process::Command::new(std::env::current_exe()?);
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--pool", ""])
            .args(["--default-template", "debian", "--prepare-templates", "debian"])
            .args(["--cgroup-parent", &tag, "--pool-size-gib", "8", "--gateway-allow-private"])
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--gateway-extra-root")
            .arg(&upstream.ca_file);
        for name in [INTERCEPTED, TUNNELLED, INTERCEPTED_OAUTH] {
            command.args(["--gateway-resolve", &format!("{name}={}", upstream.ip)]);
        }
        let child = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).kill_on_drop(true).spawn()?;
        let mut server = BenchServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
            key: String::new(),
            data_dir,
            cgroup_parent: tag,
        };
        if let Err(e) = server.wait_ready(work).await {
            server.stop().await;
            return Err(e);
        }
        Ok(server)
    }

    async fn wait_ready(&mut self, work: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log = std::fs::read_to_string(work.join("server.log")).unwrap_or_default();
                bail!("the gateway bench's server exited with {status}:\n{log}");
            }
            if let Ok(key) = std::fs::read_to_string(self.data_dir.join("admin.key")) {
                self.key = key.trim().to_owned();
                let client = Client::new(&self.url, Some(self.key.clone()), &self.data_dir)?;
                if let Ok(list) = client.get_json::<space_api::TemplateList>("/v1/templates").await
                    && list.templates.iter().any(|t| t.name == "debian")
                {
                    return Ok(());
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "the gateway bench's server was not ready in 10 minutes");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the server, then removes whatever it left: cgroups, the pool mount, the data dir.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGTERM);
            if tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.is_err() {
                let _ = self.child.kill().await;
            }
        }
        // Killed processes leave their cgroups a moment later: retry until all are gone.
        for _ in 0..100 {
            let mut left = false;
            for controller in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
                let parent = controller.path().join(&self.cgroup_parent);
                for child in std::fs::read_dir(&parent).into_iter().flatten().flatten().filter(|e| e.path().is_dir()) {
                    let procs = std::fs::read_to_string(child.path().join("cgroup.procs")).unwrap_or_default();
                    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
                    }
                    let _ = std::fs::write(child.path().join("freezer.state"), "THAWED");
                    let _ = std::fs::remove_dir(child.path());
                }
                let _ = std::fs::remove_dir(&parent);
                left |= parent.exists();
            }
            if !left {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for mounted in [self.data_dir.join("pool"), space_node::in_memory_root(&self.data_dir)] {
            let _ = tokio::process::Command::new("umount").arg("-l").arg(&mounted).output().await;
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// The HTTPS upstream: `/bytes/N` streams N bytes, `/oauth/token` answers a token request,
/// anything else a short body.
struct Upstream {
    ip: Ipv4Addr,
    ca_pem: String,
    ca_file: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    async fn start(work: &Path) -> anyhow::Result<Upstream> {
        let (ca_pem, cert_pem, key_pem) = pki(&[INTERCEPTED, TUNNELLED, INTERCEPTED_OAUTH])?;
        let ca_file = work.join("upstream-ca.pem");
        std::fs::write(&ca_file, &ca_pem)?;
        let acceptor = acceptor(&cert_pem, &key_pem)?;
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos() ^ std::process::id();
        let mut listener = None;
        for i in 0..50u32 {
            let x = seed.wrapping_mul(2_654_435_761).wrapping_add(i.wrapping_mul(40_503));
            let ip = Ipv4Addr::new(127, 1 + (x % 254) as u8, 1 + ((x >> 8) % 254) as u8, 2 + ((x >> 16) % 250) as u8);
            if let Ok(l) = TcpListener::bind((ip, 443)).await {
                listener = Some((ip, l));
                break;
            }
        }
        let (ip, listener) = listener.context("cannot bind port 443 on a loopback address (needs root)")?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let _ = stream.set_nodelay(true);
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                        Ok::<_, Infallible>(respond(request).await)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Upstream { ip, ca_pem, ca_file, task })
    }
}

async fn respond(request: Request<Incoming>) -> Response<BoxBody<Bytes, Infallible>> {
    let path = request.uri().path().to_owned();
    let _ = request.into_body().collect().await;
    if let Some(n) = path.strip_prefix("/bytes/").and_then(|n| n.parse::<u64>().ok()) {
        let chunk = Bytes::from(vec![b'x'; CHUNK]);
        let frames = (0..n.div_ceil(CHUNK as u64)).map(move |i| {
            let len = (n - i * CHUNK as u64).min(CHUNK as u64) as usize;
            Ok::<_, Infallible>(Frame::data(chunk.slice(..len)))
        });
        let body = StreamBody::new(futures::stream::iter(frames));
        return Response::builder().header("content-length", n).body(BodyExt::boxed(body)).expect("valid response");
    }
    if path == "/oauth/token" {
        let token = json!({ "access_token": format!("bench-oauth-{}", std::process::id()), "token_type": "Bearer",
                            "expires_in": 3600 });
        return Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(token.to_string())).boxed())
            .expect("valid response");
    }
    Response::builder()
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(b"ok\n")).boxed())
        .expect("valid response")
}

/// A CA and a certificate it signed for `names`: (CA PEM, certificate PEM, key PEM).
fn pki(names: &[&str]) -> anyhow::Result<(String, String, String)> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "space bench upstream CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let cert =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?.signed_by(&key, &issuer)?;
    Ok((ca_cert.pem(), cert.pem(), key.serialize_pem()))
}

fn acceptor(cert_pem: &str, key_pem: &str) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    let certs = rustls_pemfile::certs(&mut cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())?.context("no key")?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_past_a_command_name_with_spaces_and_negative_fields() {
        let stat = "4242 (tokio rt) x) S 1 4242 4242 0 -1 4194560 900 0 3 0 250 75 0 0 20 0 9 0 100 0 0";
        assert_eq!(process_cpu_ticks(stat), Some(325));
        assert_eq!(process_cpu_ticks("4242 (space) S 1 2"), None);
    }

    #[test]
    fn machine_busy_leaves_out_idle_and_iowait() {
        let proc_stat = "cpu  10 1 5 1000 70 2 3 4 0 0\ncpu0 5 0 2 500 35 1 1 2 0 0\n";
        assert_eq!(machine_busy_ticks(proc_stat), Some(25));
        assert_eq!(machine_busy_ticks("cpu  10 1 5\n"), None);
    }
}
