//! `space credential …`: values the gateway injects into requests; read from stdin, never
//! printed.

use std::io::Read;

use anyhow::{Context, bail};
use clap::Subcommand;
use space_api::egress::{CreateCredentialRequest, Credential, CredentialList, UpdateCredentialRequest};

use crate::client::{Client, encode};
use crate::output::{ago, print_json, print_table};

#[derive(Subcommand)]
pub enum CredentialCommand {
    /// Store a credential; its value is read from stdin (one trailing newline is dropped).
    Create {
        /// Credential name.
        name: String,
        /// Host the value may be sent to, named exactly (repeatable). A `*.suffix` pattern
        /// sends it to every name under the domain, and is refused unless the server runs with
        /// `--allow-wildcard-credential-hosts`.
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// The header to inject, `{secret}` marking where the value goes.
        #[arg(long, value_name = "'Name: value {secret}'")]
        header: String,
        /// When it stops being injected: RFC 3339 time (2030-01-01T00:00:00Z) or a duration
        /// from now (30d, 12h).
        #[arg(long, value_parser = parse_expiry)]
        expires: Option<i64>,
        /// Injections per minute per session, `N/min` or `N`.
        #[arg(long, value_parser = parse_rate)]
        rate_limit: Option<u32>,
        /// Environment variable the sandbox sees holding a placeholder for the value.
        #[arg(long)]
        placeholder_env: Option<String>,
    },
    /// Your credentials (never their values).
    List,
    /// One credential (never its value).
    Show {
        /// Credential name.
        name: String,
    },
    /// Give a credential a new value, read from stdin; sessions use it from their next request.
    Rotate {
        /// Credential name.
        name: String,
    },
    /// Change a credential's hosts, header, expiry or rate limit.
    Update {
        /// Credential name.
        name: String,
        /// Replaces the hosts (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Header to inject, with `{secret}` where the secret goes.
        #[arg(long)]
        header: Option<String>,
        /// As at create, or `never`.
        #[arg(long, value_parser = parse_expiry_or_never)]
        expires: Option<i64>,
        /// As at create; 0 removes the limit.
        #[arg(long, value_parser = parse_rate)]
        rate_limit: Option<u32>,
    },
    /// Delete a credential and every grant of it.
    Delete {
        /// Credential name.
        name: String,
    },
}

/// `N/min` or `N`.
fn parse_rate(text: &str) -> Result<u32, String> {
    let n = text.strip_suffix("/min").unwrap_or(text);
    n.trim().parse().map_err(|_| format!("{text:?} is not a rate; use e.g. 60/min"))
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// A duration from now (`30d`) or an RFC 3339 time, as Unix seconds.
fn parse_expiry(text: &str) -> Result<i64, String> {
    if let Ok(secs) = space_api::policy::parse_duration(text) {
        return Ok(now_secs().saturating_add(secs as i64));
    }
    parse_rfc3339(text)
        .ok_or_else(|| format!("{text:?} is neither a duration (30d, 12h) nor an RFC 3339 time (2030-01-01T00:00:00Z)"))
}

fn parse_expiry_or_never(text: &str) -> Result<i64, String> {
    if text == "never" { Ok(0) } else { parse_expiry(text) }
}

/// An RFC 3339 time (`2030-01-01T00:00:00Z`, `…T01:00:00.5+01:00`) → Unix seconds.
fn parse_rfc3339(text: &str) -> Option<i64> {
    let time = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    Some(time.unix_timestamp())
}

/// The value from stdin, without one trailing newline; refuses an empty one.
fn read_value() -> anyhow::Result<String> {
    let mut value = String::new();
    std::io::stdin().read_to_string(&mut value).context("reading the credential value from stdin")?;
    if let Some(v) = value.strip_suffix('\n') {
        value.truncate(v.strip_suffix('\r').unwrap_or(v).len());
    }
    if value.is_empty() {
        bail!("no value on stdin; pipe it in, e.g. `printf %s \"$TOKEN\" | space credential create …`");
    }
    Ok(value)
}

fn row(c: &Credential) -> Vec<String> {
    vec![
        c.name.clone(),
        c.hosts.join(","),
        c.header.clone(),
        c.expires_at.map(|s| ago(s.saturating_mul(1000))).unwrap_or_else(|| "never".into()),
        c.rate_limit_per_min.map(|n| format!("{n}/min")).unwrap_or_default(),
        c.placeholder_env.clone().unwrap_or_default(),
        c.version.to_string(),
        ago(c.updated_at),
    ]
}

const HEADER: [&str; 8] = ["NAME", "HOSTS", "HEADER", "EXPIRES", "RATE", "PLACEHOLDER", "VERSION", "UPDATED"];

fn print_credential(c: &Credential, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(c);
    }
    print_table(&HEADER, &[row(c)]);
    Ok(())
}

pub async fn run(client: &Client, command: CredentialCommand, json: bool) -> anyhow::Result<()> {
    match command {
        CredentialCommand::Create { name, hosts, header, expires, rate_limit, placeholder_env } => {
            let value = read_value()?;
            let request = CreateCredentialRequest {
                name,
                hosts,
                header,
                value,
                expires_at: expires,
                rate_limit_per_min: rate_limit,
                placeholder_env,
            };
            let created: Credential = client.post_json("/v1/credentials", &request).await?;
            print_credential(&created, json)?;
        }
        CredentialCommand::List => {
            let list: CredentialList = client.get_json("/v1/credentials").await?;
            if json {
                return print_json(&list);
            }
            print_table(&HEADER, &list.credentials.iter().map(row).collect::<Vec<_>>());
        }
        CredentialCommand::Show { name } => {
            let c: Credential = client.get_json(&format!("/v1/credentials/{}", encode(&name))).await?;
            print_credential(&c, json)?;
        }
        CredentialCommand::Rotate { name } => {
            let request = UpdateCredentialRequest { value: Some(read_value()?), ..Default::default() };
            let c: Credential = client.patch_json(&format!("/v1/credentials/{}", encode(&name)), &request).await?;
            print_credential(&c, json)?;
        }
        CredentialCommand::Update { name, hosts, header, expires, rate_limit } => {
            let request = UpdateCredentialRequest {
                value: None,
                hosts: (!hosts.is_empty()).then_some(hosts),
                header,
                expires_at: expires,
                rate_limit_per_min: rate_limit,
            };
            let c: Credential = client.patch_json(&format!("/v1/credentials/{}", encode(&name)), &request).await?;
            print_credential(&c, json)?;
        }
        CredentialCommand::Delete { name } => {
            let path = format!("/v1/credentials/{}", encode(&name));
            client.send(client.request(reqwest::Method::DELETE, &path)).await?;
            if json {
                print_json(&serde_json::json!({ "deleted": name }))?;
            } else {
                println!("deleted {name}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates_and_expiries() {
        assert_eq!(parse_rate("60/min"), Ok(60));
        assert_eq!(parse_rate("5"), Ok(5));
        assert!(parse_rate("x/min").is_err());
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2024-11-29T17:06:40Z"), Some(1_732_900_000));
        assert_eq!(parse_rfc3339("2024-11-29T18:06:40.5+01:00"), Some(1_732_900_000));
        assert!(parse_rfc3339("2024-13-01T00:00:00Z").is_none());
        let in_30d = parse_expiry("30d").unwrap() - now_secs();
        assert!((30 * 86_400 - 5..=30 * 86_400).contains(&in_30d));
        assert_eq!(parse_expiry_or_never("never"), Ok(0));
        assert!(parse_expiry("soon").is_err());
    }
}
