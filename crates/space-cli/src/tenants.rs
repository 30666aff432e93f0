//! `space tenant …`: tenants' quotas.

use clap::Subcommand;
use space_api::{QuotaLimits, TenantQuota};

use crate::client::{Client, encode};
use crate::output::print_json;
use crate::units::parse_mib;

#[derive(Subcommand)]
pub enum TenantCommand {
    /// Show a tenant's quota and use; with flags, change those limits first (admin key).
    /// Each flag takes a value or `unlimited`; limits not named stay as they are.
    Quota {
        /// The tenant's name.
        tenant: String,
        /// Most sessions that are not destroyed (suspended and failed ones count).
        #[arg(long, value_name = "N|unlimited", value_parser = limit_count)]
        max_sessions: Option<Limit<u64>>,
        /// Most CPUs of the sessions that hold a sandbox (suspended ones do not).
        #[arg(long, value_name = "N|unlimited", value_parser = limit_cpus)]
        max_cpus: Option<Limit<f64>>,
        /// Most memory of the sessions that hold a sandbox, e.g. `16G`.
        #[arg(long, value_name = "SIZE|unlimited", value_parser = limit_mib)]
        max_memory: Option<Limit<u64>>,
        /// Most disk of the sessions that are not destroyed (their disk limits added up), e.g. `200G`.
        #[arg(long, value_name = "SIZE|unlimited", value_parser = limit_mib)]
        max_disk: Option<Limit<u64>>,
    },
}

/// A limit given on the command line: a value, or none for `unlimited`.
#[derive(Debug, Clone, Copy)]
pub struct Limit<T>(Option<T>);

fn limit<T>(text: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Limit<T>, String> {
    match text {
        "unlimited" | "none" => Ok(Limit(None)),
        _ => parse(text).map(|v| Limit(Some(v))),
    }
}

fn limit_count(text: &str) -> Result<Limit<u64>, String> {
    limit(text, |t| t.parse().map_err(|_| format!("{t:?} is not a number (or `unlimited`)")))
}

fn limit_cpus(text: &str) -> Result<Limit<f64>, String> {
    limit(text, |t| t.parse().map_err(|_| format!("{t:?} is not a number of CPUs such as 4 or 0.5 (or `unlimited`)")))
}

fn limit_mib(text: &str) -> Result<Limit<u64>, String> {
    limit(text, parse_mib)
}

pub async fn run(client: &Client, command: TenantCommand, json: bool) -> anyhow::Result<()> {
    let TenantCommand::Quota { tenant, max_sessions, max_cpus, max_memory, max_disk } = command;
    let path = format!("/v1/tenants/{}/quota", encode(&tenant));
    let mut quota: TenantQuota = client.get_json(&path).await.or_else(|e| {
        // A tenant without sessions or keys yet: the admin may still set its quota.
        let changes = max_sessions.is_some() || max_cpus.is_some() || max_memory.is_some() || max_disk.is_some();
        if changes { Ok(unlimited(&tenant)) } else { Err(e) }
    })?;
    if max_sessions.is_some() || max_cpus.is_some() || max_memory.is_some() || max_disk.is_some() {
        let current = quota.limits();
        let limits = QuotaLimits {
            max_sessions: max_sessions.map_or(current.max_sessions, |l| l.0),
            max_cpus: max_cpus.map_or(current.max_cpus, |l| l.0),
            max_memory_mib: max_memory.map_or(current.max_memory_mib, |l| l.0),
            max_disk_mib: max_disk.map_or(current.max_disk_mib, |l| l.0),
        };
        quota = client.put_json(&path, &limits).await?;
    }
    print_quota(&quota, json)
}

fn unlimited(tenant: &str) -> TenantQuota {
    TenantQuota {
        tenant: tenant.to_owned(),
        tenant_id: space_api::TenantId::generate(),
        max_sessions: None,
        max_cpus: None,
        max_memory_mib: None,
        max_disk_mib: None,
        usage: Default::default(),
    }
}

fn print_quota(quota: &TenantQuota, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(quota);
    }
    let limit = |max: Option<String>| max.unwrap_or_else(|| "unlimited".into());
    let u = &quota.usage;
    println!("tenant    {}", quota.tenant);
    println!("sessions  {} of {}", u.sessions, limit(quota.max_sessions.map(|n| n.to_string())));
    println!("cpus      {} of {}", u.cpus, limit(quota.max_cpus.map(|n| n.to_string())));
    println!("memory    {} MiB of {}", u.memory_mib, limit(quota.max_memory_mib.map(|n| format!("{n} MiB"))));
    println!("disk      {} MiB of {}", u.disk_mib, limit(quota.max_disk_mib.map(|n| format!("{n} MiB"))));
    Ok(())
}
