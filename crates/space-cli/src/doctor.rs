//! `space doctor`: which runtimes this host can run, and what to do about those it cannot.
//! Runs on the host itself (as root), no server needed: each runtime is opened as `space
//! serve` would open it.

use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use space_node::doctor::HostConfig;

use crate::host::HostArgs;

#[derive(Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    host: HostArgs,
}

pub async fn run(args: DoctorArgs, json: bool) -> anyhow::Result<ExitCode> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("space doctor opens the runtimes as the server does, which needs root: run it as root");
    }
    let host = HostConfig {
        spaced: args.host.spaced()?,
        criu: args.host.criu.clone(),
        id_map: args.host.id_map(),
        vm: args.host.vm(),
    };
    let findings = space_node::doctor::probe(&host).await?;
    if json {
        let list: Vec<_> =
            findings.iter().map(|f| serde_json::json!({ "check": f.what, "ok": f.ok, "detail": f.detail })).collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for f in &findings {
            println!("{:<24} {:<4} {}", f.what, if f.ok { "ok" } else { "OFF" }, f.detail);
        }
    }
    // The linux runtime is what every server needs; the rest are options.
    let linux_ok = findings.first().is_some_and(|f| f.ok);
    Ok(if linux_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
