//! `space template build NAME -f Dockerfile [CONTEXT]` and `space template builds`: the
//! context is sent as a tar less what its `.dockerignore` excludes (a Dockerfile from outside
//! it, or one it excludes, rides along under `.space-build/`), and the build's log is printed
//! as the server writes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use space_api::{BUILD_CONTEXT_PRIVATE_DIR, Operation, OperationLog, OperationState, TemplateBuildList};

use crate::build_context::{Ignore, pack};
use crate::client::{Client, encode};
use crate::output::{ago, print_json, print_table};
use crate::template_upload::{MadeTar, send_file};

/// What `space template build` was asked for.
pub struct BuildArgs {
    pub name: String,
    pub file: Option<PathBuf>,
    pub context: Option<PathBuf>,
    pub allow: Vec<String>,
    pub build_args: Vec<String>,
    pub no_cache: bool,
}

pub async fn build(client: &Client, args: BuildArgs, json: bool) -> anyhow::Result<()> {
    let context = args.context.unwrap_or_else(|| PathBuf::from("."));
    let context =
        std::fs::canonicalize(&context).with_context(|| format!("the build context {}", context.display()))?;
    if !context.is_dir() {
        bail!("the build context {} is not a directory", context.display());
    }
    let file = args.file.unwrap_or_else(|| context.join("Dockerfile"));
    let file = std::fs::canonicalize(&file).with_context(|| format!("the Dockerfile {}", file.display()))?;
    let ignore = Ignore::of(&context)?;
    // A Dockerfile outside the context, or one it ignores, rides along where COPY never looks.
    let (entry, extra) = match file.strip_prefix(&context) {
        Ok(inside) if !ignore.excludes(inside) => (inside.display().to_string(), None),
        _ => (format!("{BUILD_CONTEXT_PRIVATE_DIR}/Dockerfile"), Some(file.as_path())),
    };
    let tar = MadeTar(std::env::temp_dir().join(format!("space-build-{}.tar", std::process::id())));
    let packing = (context.clone(), tar.0.clone(), entry.clone(), extra.map(Path::to_path_buf));
    tokio::task::spawn_blocking(move || {
        let (context, tar, entry, extra) = packing;
        pack(&context, &ignore, &tar, extra.as_deref().map(|p| (p, entry.as_str())))
    })
    .await??;
    let mut values = serde_json::Map::new();
    for arg in &args.build_args {
        let Some((name, value)) = arg.split_once('=') else {
            bail!("--build-arg takes NAME=VALUE, not {arg:?}");
        };
        values.insert(name.to_owned(), value.into());
    }
    let mut path = format!("/v1/templates/builds?name={}&dockerfile={}", encode(&args.name), encode(&entry));
    if !args.allow.is_empty() {
        path.push_str(&format!("&allow={}", encode(&args.allow.join(","))));
    }
    if !values.is_empty() {
        path.push_str(&format!("&build_args={}", encode(&serde_json::Value::Object(values).to_string())));
    }
    if args.no_cache {
        path.push_str("&no_cache=true");
    }
    let op = send_file(client, &tar.0, &path, json).await?;
    drop(tar);
    follow(client, op, json).await
}

/// Prints the build's log as it grows, until the build ends.
async fn follow(client: &Client, mut op: Operation, json: bool) -> anyhow::Result<()> {
    let mut next = 0;
    loop {
        let done = !matches!(op.state, OperationState::Pending | OperationState::Running);
        let log: OperationLog = client.get_json(&format!("/v1/operations/{}/logs?after={next}", op.id)).await?;
        if !json {
            for line in &log.lines {
                println!("{line}");
            }
        }
        next = log.next;
        if done && log.lines.is_empty() {
            break;
        }
        if log.lines.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        op = client.get_json(&format!("/v1/operations/{}", op.id)).await?;
    }
    if json {
        print_json(&op)?;
    }
    if op.state == OperationState::Failed {
        bail!("{}", op.error.unwrap_or_else(|| "the build failed".into()));
    }
    Ok(())
}

/// `space template builds`.
pub async fn list(client: &Client, json: bool) -> anyhow::Result<()> {
    let list: TemplateBuildList = client.get_json("/v1/templates/builds").await?;
    if json {
        return print_json(&list);
    }
    let rows: Vec<Vec<String>> = list
        .builds
        .iter()
        .map(|b| {
            let state = serde_json::to_value(b.state).ok().and_then(|v| v.as_str().map(str::to_owned));
            let error = b.error.as_deref().and_then(|e| e.lines().next()).unwrap_or("").to_owned();
            vec![b.id.to_string(), b.name.clone(), state.unwrap_or_default(), ago(b.created_at), error]
        })
        .collect();
    print_table(&["ID", "NAME", "STATE", "STARTED", "ERROR"], &rows);
    Ok(())
}
