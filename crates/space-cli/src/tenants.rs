//! `space tenant …`: tenants' quotas and keys.

use std::io::Read as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Subcommand, ValueEnum};
use space_api::{KeyProviderKind, QuotaLimits, SetTenantKeyRequest, TenantKey, TenantQuota};

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
    /// The key that protects what is sealed for a tenant: its credentials' values and its
    /// sessions' CA keys (the admin any tenant's, a tenant its own; docs/byok.md).
    #[command(subcommand)]
    Key(KeyCommand),
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Show the tenant's key (never its token).
    Show {
        /// The tenant's name.
        tenant: String,
    },
    /// Use a key of the tenant's KMS (or go back to the server's local key), and re-wrap the
    /// data keys of everything already sealed for the tenant under it. The token is read from
    /// stdin unless --token-file names a file; it is stored sealed and never shown again.
    Set {
        /// The tenant's name.
        tenant: String,
        /// Who holds the key.
        #[arg(long, value_enum)]
        provider: Provider,
        /// The KMS: http(s)://HOST[:PORT].
        #[arg(long)]
        address: Option<String>,
        /// The transit key's name.
        #[arg(long)]
        key: Option<String>,
        /// Where the transit engine is mounted (default `transit`).
        #[arg(long)]
        mount: Option<String>,
        /// A file holding the token (else stdin).
        #[arg(long)]
        token_file: Option<PathBuf>,
    },
    /// After rotating the key in the KMS: re-wrap every data key of the tenant under the
    /// key's newest version, so that the KMS may retire the old versions.
    Rotate {
        /// The tenant's name.
        tenant: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Provider {
    /// The server's local key file.
    Local,
    /// An OpenBao or HashiCorp Vault transit key.
    Openbao,
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
    let (tenant, max_sessions, max_cpus, max_memory, max_disk) = match command {
        TenantCommand::Quota { tenant, max_sessions, max_cpus, max_memory, max_disk } => {
            (tenant, max_sessions, max_cpus, max_memory, max_disk)
        }
        TenantCommand::Key(command) => return run_key(client, command, json).await,
    };
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

async fn run_key(client: &Client, command: KeyCommand, json: bool) -> anyhow::Result<()> {
    let path = |tenant: &str| format!("/v1/tenants/{}/key", encode(tenant));
    let key: TenantKey = match command {
        KeyCommand::Show { tenant } => client.get_json(&path(&tenant)).await?,
        KeyCommand::Rotate { tenant } => client.post_json(&format!("{}/rotate", path(&tenant)), &()).await?,
        KeyCommand::Set { tenant, provider, address, key, mount, token_file } => {
            let request = match provider {
                Provider::Local => {
                    SetTenantKeyRequest { provider: KeyProviderKind::Local, address, mount, key, token: None }
                }
                Provider::Openbao => {
                    let token = Some(read_token(token_file.as_deref())?);
                    SetTenantKeyRequest { provider: KeyProviderKind::Openbao, address, mount, key, token }
                }
            };
            client.put_json(&path(&tenant), &request).await?
        }
    };
    print_key(&key, json)
}

/// The KMS token from `file` or stdin, trimmed; refuses an empty one.
fn read_token(file: Option<&std::path::Path>) -> anyhow::Result<String> {
    let token = match file {
        Some(file) => {
            std::fs::read_to_string(file).with_context(|| format!("reading the token from {}", file.display()))?
        }
        None => {
            let mut token = String::new();
            std::io::stdin().read_to_string(&mut token).context("reading the token from stdin")?;
            token
        }
    };
    let token = token.trim().to_owned();
    if token.is_empty() {
        bail!("no token: pipe it in (`printf %s \"$TOKEN\" | space tenant key set …`) or give --token-file");
    }
    Ok(token)
}

fn print_key(key: &TenantKey, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(key);
    }
    println!("tenant    {}", key.tenant);
    match key.provider {
        KeyProviderKind::Local => println!("provider  local (the server's key file)"),
        KeyProviderKind::Openbao => {
            println!("provider  openbao");
            let show = |v: &Option<String>| v.clone().unwrap_or_default();
            println!("address   {}", show(&key.address));
            println!("mount     {}", show(&key.mount));
            println!("key       {}", show(&key.key));
        }
    }
    if let Some(n) = key.rewrapped {
        println!("rewrapped {n} sealed value(s)");
    }
    if let Some(n) = key.remaining.filter(|&n| n > 0) {
        println!(
            "remaining {n} value(s) still under another key (still readable with it; run this again, and keep that key until none remain)"
        );
    }
    if let Some(note) = &key.note {
        println!("note      {note}");
    }
    Ok(())
}
