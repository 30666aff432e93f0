//! `space template list|import|delete|build|builds`

use std::time::Duration;

use anyhow::bail;
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use space_api::{
    BuildTemplateRequest, ImportTemplateRequest, Operation, OperationState, TemplateDeleted, TemplateList,
    TemplateScope, TemplateSource,
};

use crate::client::Client;
use crate::output::{ago, bytes, print_json, print_table};
use crate::template_build::BuildArgs;

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// List templates.
    List,
    /// Import a root filesystem or an OCI image on the server's host as NAME.
    Import {
        /// Template name.
        name: String,
        /// What to import: on the server's host, a directory or tarball of a root filesystem,
        /// an OCI image layout (`oci:DIR[:TAG]`) or a `docker save` archive
        /// (`docker-archive:FILE`); or an image in a registry (`docker://HOST/REPO:TAG`, pulled
        /// by the server with the logins of its host's `skopeo login`/`docker login`).
        image: String,
        /// IMAGE is on this machine, not the server's host: send it to the server.
        #[arg(long)]
        upload: bool,
    },
    /// Delete a template's version (NAME@VERSION) or all its versions (NAME).
    Delete {
        /// NAME or NAME@VERSION.
        template: String,
        /// Delete even while sessions use it (they keep running, but one that must start afresh
        /// from its template can no longer).
        #[arg(long)]
        force: bool,
    },
    /// Build a template from a Dockerfile (`-f`, or a CONTEXT holding a `Dockerfile`), or
    /// build a built-in template (`debian`, `busybox`) when given neither.
    Build {
        /// The template to make a version of (or the built-in to build).
        name: String,
        /// The Dockerfile (default: CONTEXT/Dockerfile).
        #[arg(short = 'f', long = "file")]
        file: Option<std::path::PathBuf>,
        /// The directory COPY and ADD read from (sent to the server as a tar; default: `.`).
        context: Option<std::path::PathBuf>,
        /// A host RUN steps may reach (repeatable; `*.example.com` for a domain's hosts).
        /// Without any, RUN steps have no network.
        #[arg(long)]
        allow: Vec<String>,
        /// NAME=VALUE for an ARG of the Dockerfile (repeatable).
        #[arg(long = "build-arg")]
        build_arg: Vec<String>,
        /// Run every step again instead of reusing cached layers.
        #[arg(long)]
        no_cache: bool,
    },
    /// List Dockerfile builds, newest first.
    Builds,
}

pub async fn run(client: &Client, command: TemplateCommand, json: bool) -> anyhow::Result<()> {
    match command {
        TemplateCommand::List => {
            let list: TemplateList = client.get_json("/v1/templates").await?;
            if json {
                return print_json(&list);
            }
            let rows: Vec<Vec<String>> = list
                .templates
                .iter()
                .map(|t| {
                    vec![
                        t.name.clone(),
                        if t.scope == TemplateScope::Global { "global" } else { "own" }.to_owned(),
                        t.version.to_string(),
                        bytes(t.size_bytes),
                        ago(t.created_at),
                        t.source.clone(),
                    ]
                })
                .collect();
            print_table(&["NAME", "SCOPE", "VERSION", "SIZE", "CREATED", "SOURCE"], &rows);
            println!("built-in: {} (default: {})", list.builtin.join(", "), list.default_template);
        }
        TemplateCommand::Import { name, image, upload: true } => {
            let op = crate::template_upload::upload(client, &name, TemplateSource::parse(&image), json).await?;
            follow(client, op, json).await?;
        }
        TemplateCommand::Import { name, image, upload: false } => {
            let mut source = TemplateSource::parse(&image);
            if let Some(path) = source.host_path().map(std::path::Path::to_path_buf) {
                source = source.with_host_path(std::fs::canonicalize(&path).unwrap_or(path));
            }
            let request = ImportTemplateRequest { name, path: source.to_string() };
            let op: Operation = client.post_json("/v1/templates/import", &request).await?;
            follow(client, op, json).await?;
        }
        TemplateCommand::Delete { template, force } => {
            let (name, version) = match template.split_once('@') {
                Some((name, version)) => (name.to_owned(), Some(version.parse::<u32>()?)),
                None => (template, None),
            };
            let mut path = format!("/v1/templates/{name}?force={force}");
            if let Some(version) = version {
                path.push_str(&format!("&version={version}"));
            }
            let deleted: TemplateDeleted = client.delete_json(&path).await?;
            if json {
                return print_json(&deleted);
            }
            let versions: Vec<String> = deleted.versions.iter().map(|v| format!("{}@{v}", deleted.name)).collect();
            println!("deleted {}", versions.join(", "));
            if !deleted.in_use_by.is_empty() {
                println!("still used by: {}", deleted.in_use_by.join(", "));
            }
        }
        TemplateCommand::Build { name, file: None, context: None, .. } => {
            let op: Operation = client.post_json("/v1/templates/build", &BuildTemplateRequest { name }).await?;
            follow(client, op, json).await?;
        }
        TemplateCommand::Build { name, file, context, allow, build_arg, no_cache } => {
            let args = BuildArgs { name, file, context, allow, build_args: build_arg, no_cache };
            crate::template_build::build(client, args, json).await?;
        }
        TemplateCommand::Builds => crate::template_build::list(client, json).await?,
    }
    Ok(())
}

/// Polls an operation to its end, drawing its progress.
async fn follow(client: &Client, mut op: Operation, json: bool) -> anyhow::Result<()> {
    let bar = if json { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    let spinner = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_msg}")?;
    let bytes_bar =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg} [{bar:30}] {bytes}/{total_bytes}")?;
    bar.set_style(spinner.clone());
    bar.enable_steady_tick(Duration::from_millis(120));
    while matches!(op.state, OperationState::Pending | OperationState::Running) {
        if let Some(p) = &op.progress {
            // Phases that count bytes of a known total get a bar; the rest a spinner and a count.
            let in_bytes = p.phase.starts_with("extracting") || p.phase.starts_with("downloading");
            match p.total {
                Some(total) if in_bytes => {
                    bar.set_style(bytes_bar.clone());
                    bar.set_length(total);
                    bar.set_position(p.done);
                    bar.set_message(p.phase.clone());
                }
                total => {
                    let count = match total {
                        Some(total) => format!(" ({}/{total})", p.done),
                        None if p.done > 0 => format!(" ({})", p.done),
                        None => String::new(),
                    };
                    bar.set_style(spinner.clone());
                    bar.set_message(format!("{}{count}", p.phase));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        op = client.get_json(&format!("/v1/operations/{}", op.id)).await?;
    }
    bar.finish_and_clear();
    if json {
        print_json(&op)?;
    }
    if op.state == OperationState::Failed {
        bail!("{}", op.error.unwrap_or_else(|| "template operation failed".into()));
    }
    if !json {
        println!("done");
    }
    Ok(())
}
