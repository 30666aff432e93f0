//! `space credential …`: values the gateway injects into requests; read from stdin, never
//! printed.

use std::io::Read;

use anyhow::{Context, bail};
use clap::Subcommand;
use space_api::egress::{
    CreateCredentialRequest, Credential, CredentialKind, CredentialList, OAuth2ClientAuth, OAuth2GrantType,
    OAuth2Login, OAuth2LoginRequest, OAuth2Request, OAuth2Status, UpdateCredentialRequest,
};

use crate::client::{Client, encode};
use crate::output::{ago, print_json, print_table};

#[derive(Subcommand)]
pub enum CredentialCommand {
    /// Store a credential; its value is read from stdin (one trailing newline is dropped). With
    /// `--oauth2-token-url`, stdin holds the OAuth client secret instead, and the gateway
    /// injects access tokens the server gets and refreshes.
    Create {
        /// Credential name.
        name: String,
        /// Host the value may be sent to, named exactly (repeatable). A `*.suffix` pattern
        /// sends it to every name under the domain, and is refused unless the server runs with
        /// `--allow-wildcard-credential-hosts`.
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// The header to inject, `{secret}` marking where the value goes (OAuth:
        /// `Authorization: Bearer {secret}` unless given).
        #[arg(long, value_name = "'Name: value {secret}'")]
        header: Option<String>,
        #[command(flatten)]
        oauth2: OAuth2Args,
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
        /// An OAuth credential's new client secret (from stdin).
        #[arg(long, conflicts_with = "refresh_token")]
        client_secret: bool,
        /// An OAuth credential's new refresh token (from stdin).
        #[arg(long)]
        refresh_token: bool,
    },
    /// Sign in to an OAuth credential's provider: prints the URL to open, then waits until
    /// the provider has sent the browser back and the server holds the refresh token.
    Login {
        /// Credential name.
        name: String,
        /// The redirect URI registered with the provider (default: the credential's, else this
        /// server's URL followed by /v1/oauth/callback).
        #[arg(long)]
        redirect_uri: Option<String>,
        /// How long to wait for the sign-in, in seconds (0: print the URL and return).
        #[arg(long, default_value_t = 300)]
        wait: u64,
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

/// The settings of an OAuth credential (`--oauth2-token-url` makes one).
#[derive(clap::Args)]
pub struct OAuth2Args {
    /// Makes an OAuth 2.0 credential: the token endpoint (https).
    #[arg(long = "oauth2-token-url", value_name = "URL")]
    token_url: Option<String>,
    /// The OAuth client id.
    #[arg(long, requires = "token_url")]
    client_id: Option<String>,
    /// `client-credentials` (the client's own identity) or `refresh-token` (a user's, from
    /// `space credential login` or `space credential rotate --refresh-token`).
    #[arg(long, requires = "token_url", value_parser = parse_grant)]
    grant: Option<OAuth2GrantType>,
    /// A scope to ask for (repeatable).
    #[arg(long = "scope", requires = "token_url")]
    scopes: Vec<String>,
    /// Where a human signs in, for `space credential login`.
    #[arg(long, requires = "token_url")]
    authorize_url: Option<String>,
    /// The redirect URI registered with the provider (ends in /v1/oauth/callback).
    #[arg(long, requires = "token_url")]
    redirect_uri: Option<String>,
    /// Send the client secret in the form body instead of HTTP Basic.
    #[arg(long, requires = "token_url")]
    client_secret_post: bool,
    /// A public client: no secret on stdin (sign-in with PKCE only).
    #[arg(long, requires = "token_url")]
    public_client: bool,
}

fn parse_grant(text: &str) -> Result<OAuth2GrantType, String> {
    match text {
        "client-credentials" | "client_credentials" => Ok(OAuth2GrantType::ClientCredentials),
        "refresh-token" | "refresh_token" => Ok(OAuth2GrantType::RefreshToken),
        _ => Err(format!("{text:?} is not a grant; use client-credentials or refresh-token")),
    }
}

impl OAuth2Args {
    /// The request's `oauth2` settings, the secret read from stdin; `None` without a token URL.
    fn request(self) -> anyhow::Result<Option<OAuth2Request>> {
        let Some(token_url) = self.token_url else { return Ok(None) };
        let client_id = self.client_id.context("--oauth2-token-url needs --client-id")?;
        let grant_type = self.grant.context("--oauth2-token-url needs --grant client-credentials|refresh-token")?;
        let client_secret = if self.public_client { None } else { Some(read_value("client secret")?) };
        Ok(Some(OAuth2Request {
            token_url,
            client_id,
            client_secret,
            scopes: self.scopes,
            grant_type,
            refresh_token: None,
            authorize_url: self.authorize_url,
            redirect_uri: self.redirect_uri,
            client_auth: if self.client_secret_post { OAuth2ClientAuth::Post } else { OAuth2ClientAuth::Basic },
        }))
    }
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

/// `what` from stdin, without one trailing newline; refuses an empty one.
fn read_value(what: &str) -> anyhow::Result<String> {
    let mut value = String::new();
    std::io::stdin().read_to_string(&mut value).with_context(|| format!("reading the {what} from stdin"))?;
    if let Some(v) = value.strip_suffix('\n') {
        value.truncate(v.strip_suffix('\r').unwrap_or(v).len());
    }
    if value.is_empty() {
        bail!("no {what} on stdin; pipe it in, e.g. `printf %s \"$TOKEN\" | space credential create …`");
    }
    Ok(value)
}

/// `static`, or `oauth2` with its token's status and why it fails.
fn kind(c: &Credential) -> String {
    let Some(o) = &c.oauth2 else { return "static".into() };
    let status = serde_json::to_value(o.status).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
    match &o.reason {
        Some(reason) if o.status != OAuth2Status::Ok => format!("oauth2 {status}: {reason}"),
        _ => format!("oauth2 {status}"),
    }
}

fn row(c: &Credential) -> Vec<String> {
    vec![
        c.name.clone(),
        kind(c),
        c.hosts.join(","),
        c.header.clone(),
        c.expires_at.map(|s| ago(s.saturating_mul(1000))).unwrap_or_else(|| "never".into()),
        c.rate_limit_per_min.map(|n| format!("{n}/min")).unwrap_or_default(),
        c.placeholder_env.clone().unwrap_or_default(),
        c.version.to_string(),
        ago(c.updated_at),
    ]
}

const HEADER: [&str; 9] = ["NAME", "KIND", "HOSTS", "HEADER", "EXPIRES", "RATE", "PLACEHOLDER", "VERSION", "UPDATED"];

fn print_credential(c: &Credential, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(c);
    }
    print_table(&HEADER, &[row(c)]);
    Ok(())
}

pub async fn run(client: &Client, command: CredentialCommand, json: bool) -> anyhow::Result<()> {
    match command {
        CredentialCommand::Create { name, hosts, header, oauth2, expires, rate_limit, placeholder_env } => {
            let oauth2 = oauth2.request()?;
            let (kind, value) = match &oauth2 {
                Some(_) => (CredentialKind::Oauth2, String::new()),
                None => (CredentialKind::Static, read_value("value")?),
            };
            let header = match (header, &oauth2) {
                (Some(header), _) => header,
                (None, Some(_)) => String::new(),
                (None, None) => bail!("--header is needed, e.g. --header 'Authorization: Bearer {{secret}}'"),
            };
            let request = CreateCredentialRequest {
                name,
                hosts,
                header,
                value,
                expires_at: expires,
                rate_limit_per_min: rate_limit,
                placeholder_env,
                kind,
                oauth2,
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
        CredentialCommand::Rotate { name, client_secret, refresh_token } => {
            let request = if client_secret {
                UpdateCredentialRequest { client_secret: Some(read_value("client secret")?), ..Default::default() }
            } else if refresh_token {
                UpdateCredentialRequest { refresh_token: Some(read_value("refresh token")?), ..Default::default() }
            } else {
                UpdateCredentialRequest { value: Some(read_value("value")?), ..Default::default() }
            };
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
                ..Default::default()
            };
            let c: Credential = client.patch_json(&format!("/v1/credentials/{}", encode(&name)), &request).await?;
            print_credential(&c, json)?;
        }
        CredentialCommand::Login { name, redirect_uri, wait } => login(client, &name, redirect_uri, wait, json).await?,
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

/// Starts a sign-in, prints its URL and waits (at most `wait` seconds) for its outcome.
async fn login(client: &Client, name: &str, redirect_uri: Option<String>, wait: u64, json: bool) -> anyhow::Result<()> {
    let path = format!("/v1/credentials/{}", encode(name));
    let before: Credential = client.get_json(&path).await?;
    let configured = before.oauth2.as_ref().and_then(|o| o.redirect_uri.clone());
    let redirect_uri =
        redirect_uri.or_else(|| configured.is_none().then(|| format!("{}/v1/oauth/callback", client.base())));
    let login: OAuth2Login = client.post_json(&format!("{path}/login"), &OAuth2LoginRequest { redirect_uri }).await?;
    if json {
        print_json(&login)?;
    } else {
        println!("Open this URL in a browser and sign in:\n\n  {}\n", login.authorization_url);
    }
    if wait == 0 {
        return Ok(());
    }
    let since = before.oauth2.as_ref().and_then(|o| o.refreshed_at);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait);
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let now: Credential = client.get_json(&path).await?;
        let Some(o) = &now.oauth2 else { bail!("credential {name:?} is no longer an oauth2 credential") };
        if o.status == OAuth2Status::Ok && o.refreshed_at != since {
            if !json {
                println!("signed in: {name} gets its tokens from the provider");
            }
            return Ok(());
        }
        let failed = o.reason.is_some() && o.reason != before.oauth2.as_ref().and_then(|b| b.reason.clone());
        if failed && o.status != OAuth2Status::Ok {
            bail!("the sign-in failed: {}", o.reason.as_deref().unwrap_or_default());
        }
    }
    bail!("no sign-in within {wait}s; run `space credential login {name}` again")
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
