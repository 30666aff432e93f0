//! Measures through the HTTP API, as a user sees them: create (warm pool and cold), time to
//! first output, exec round trip, a burst of concurrent creates and idle density.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use space_api::{CreateSessionRequest, ExecRequest, ExecResult, PoolStatus, Session, SetPoolSizeRequest};

use crate::client::{Client, encode};

pub async fn create(client: &Client, template: &str) -> anyhow::Result<Session> {
    let request = CreateSessionRequest { template: Some(template.to_owned()), ..Default::default() };
    let session: Session = client.post_json("/v1/sessions", &request).await?;
    anyhow::ensure!(session.state == space_api::SessionState::Running, "session {} is {:?}", session.id, session.state);
    Ok(session)
}

/// Runs `cmd` and returns its stdout, failing unless it exits 0.
pub async fn run(client: &Client, id: &str, cmd: &[&str]) -> anyhow::Result<String> {
    let request = ExecRequest { cmd: cmd.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    let result: ExecResult = client.post_json(&format!("/v1/sessions/{id}/exec"), &request).await?;
    anyhow::ensure!(result.exit_code == Some(0), "{cmd:?} exited with {:?}: {}", result.exit_code, result.stderr);
    Ok(result.stdout)
}

pub async fn destroy(client: &Client, id: &str, wait: bool) -> anyhow::Result<()> {
    client.delete_json::<Session>(&format!("/v1/sessions/{id}?wait={wait}")).await?;
    Ok(())
}

pub async fn pool(client: &Client) -> anyhow::Result<PoolStatus> {
    client.get_json("/v1/pool").await
}

pub async fn set_pool(client: &Client, template: &str, size: u32) -> anyhow::Result<()> {
    let path = format!("/v1/pool/{}", encode(template));
    let _: PoolStatus =
        client.put_json(&path, &SetPoolSizeRequest { size, runtime: None }).await.context("sizing the warm pool")?;
    Ok(())
}

/// Waits (untimed) until the template's pool has `ready` pods.
pub async fn wait_pool_ready(client: &Client, template: &str, ready: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let status = pool(client).await?;
        let slot = status.templates.iter().find(|t| t.template == template);
        if slot.is_some_and(|s| s.ready >= ready) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the warm pool of {template} did not reach {ready} ready pods: {:?}",
            slot.and_then(|s| s.last_error.clone())
        );
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// Samples of one create mode.
#[derive(Default)]
pub struct CreateSamples {
    /// POST /v1/sessions until it answers `running` (spaced connected: commands can run).
    pub create: Vec<Duration>,
    /// Create, then `true` through the API until it exited.
    pub create_true: Vec<Duration>,
    /// Create, then `echo hi` until its output arrived (time to interactive).
    pub first_output: Vec<Duration>,
}

/// `n` creates, each followed by `true` and `echo hi`; `warm` waits for a ready pod before
/// each (untimed) so every sample measures a pool hit.
pub async fn creates(client: &Client, template: &str, n: usize, warm: bool) -> anyhow::Result<CreateSamples> {
    let mut samples = CreateSamples::default();
    for i in 0..n {
        if warm {
            wait_pool_ready(client, template, 1).await?;
        }
        let t0 = Instant::now();
        let session = create(client, template).await?;
        let created = t0.elapsed();
        let id = session.id.as_str();
        // Alternate which command runs first so neither benefits from the other's warm-up.
        if i % 2 == 0 {
            run(client, id, &["true"]).await?;
            samples.create_true.push(t0.elapsed());
        } else {
            let out = run(client, id, &["echo", "hi"]).await?;
            anyhow::ensure!(out == "hi\n", "echo hi printed {out:?}");
            samples.first_output.push(t0.elapsed());
        }
        samples.create.push(created);
        // Untimed, and finished before the next sample: each create is measured on a quiet
        // node rather than racing the previous sandbox's teardown for the CPU.
        destroy(client, id, true).await?;
    }
    Ok(samples)
}

/// Exec round trips of `true` on one session: `n` through the API, then `cli_n` runs of
/// `space exec ID -- true` as a whole process (its start-up, connection and exit included).
pub async fn exec_round_trips(
    client: &Client,
    template: &str,
    n: usize,
    cli_n: usize,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let session = create(client, template).await?;
    let id = session.id.to_string();
    let result = async {
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            samples.push(timed_true(client, &id).await?);
        }
        let cli = cli_exec_round_trips(client, &id, cli_n).await?;
        anyhow::Ok((samples, cli))
    }
    .await;
    let destroyed = destroy(client, &id, false).await;
    let samples = result?;
    destroyed?;
    Ok(samples)
}

/// `n` runs of the `space` binary beside this one as `space exec ID -- true`, each timed from
/// spawn to exit.
async fn cli_exec_round_trips(client: &Client, id: &str, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut command = std::process::Command::new(crate::host::beside_this_executable("space"));
    command
        .args(["exec", id, "--", "true"])
        .env("SPACE_URL", client.base())
        .env("SPACE_API_KEY", client.key())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    tokio::task::spawn_blocking(move || {
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            let status = command.status().context("running space exec")?;
            samples.push(t0.elapsed());
            anyhow::ensure!(status.success(), "space exec -- true exited with {status}");
        }
        Ok(samples)
    })
    .await?
}

/// Exec round trips of `true` on `id`, one after another until `stop` is set (at least one):
/// what the user of another session sees while a burst loads the server.
pub async fn exec_until(client: Client, id: String, stop: Arc<AtomicBool>) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::new();
    loop {
        samples.push(timed_true(&client, &id).await?);
        if stop.load(Ordering::Relaxed) {
            return Ok(samples);
        }
    }
}

/// One exec round trip of `true` on `id` through the API.
async fn timed_true(client: &Client, id: &str) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    run(client, id, &["true"]).await?;
    Ok(t0.elapsed())
}

/// `count` creates issued at once. Returns each create's latency, the time until the last
/// was running, and the sessions (for the caller to destroy).
pub async fn burst(
    client: &Client,
    template: &str,
    count: usize,
) -> anyhow::Result<(Vec<Duration>, Duration, Vec<String>)> {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..count)
        .map(|_| {
            let (client, template) = (client.clone(), template.to_owned());
            tokio::spawn(async move {
                let session = create(&client, &template).await?;
                anyhow::Ok((t0.elapsed(), session.id.to_string()))
            })
        })
        .collect();
    let (mut latencies, mut ids) = (Vec::new(), Vec::new());
    let mut failure = None;
    for task in tasks {
        match task.await? {
            Ok((latency, id)) => {
                latencies.push(latency);
                ids.push(id);
            }
            Err(e) => failure = Some(e),
        }
    }
    let all = t0.elapsed();
    if let Some(e) = failure {
        destroy_all(client, &ids).await;
        return Err(e.context("a create of the burst failed"));
    }
    Ok((latencies, all, ids))
}

/// Destroys sessions a few at a time, waiting for each.
pub async fn destroy_all(client: &Client, ids: &[String]) {
    for chunk in ids.chunks(8) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|id| {
                let (client, id) = (client.clone(), id.clone());
                tokio::spawn(async move { destroy(&client, &id, true).await })
            })
            .collect();
        for task in tasks {
            if let Ok(Err(e)) = task.await {
                eprintln!("warning: destroying a benchmark session: {e:#}");
            }
        }
    }
}

/// Creates `count` sessions, a few at a time; returns their ids and sandbox ids.
pub async fn create_many(client: &Client, template: &str, count: usize) -> anyhow::Result<Vec<Session>> {
    let mut sessions = Vec::with_capacity(count);
    while sessions.len() < count {
        let batch = (count - sessions.len()).min(4);
        let tasks: Vec<_> = (0..batch)
            .map(|_| {
                let (client, template) = (client.clone(), template.to_owned());
                tokio::spawn(async move { create(&client, &template).await })
            })
            .collect();
        for task in tasks {
            match task.await? {
                Ok(s) => sessions.push(s),
                Err(e) => {
                    let ids: Vec<String> = sessions.iter().map(|s| s.id.to_string()).collect();
                    destroy_all(client, &ids).await;
                    return Err(e.context(format!("creating idle session {} of {count}", sessions.len() + 1)));
                }
            }
        }
    }
    Ok(sessions)
}
