//! `space session …`

use std::collections::BTreeMap;

use anyhow::bail;
use clap::Subcommand;
use space_api::egress::{AuditList, GrantRequest, NetworkPolicy, NetworkPolicyUpdate, SessionNetwork};
use space_api::{
    CreateSessionRequest, EventList, ForkRequest, RestoreRequest, Session, SessionList, SessionStats, SnapshotPolicy,
    UpdateSessionRequest,
};

use crate::client::{Client, encode};
use crate::output::{self, print_json, print_session, print_stats, print_table};
use crate::units;

/// Network policy flags of `create` and `policy`.
#[derive(clap::Args)]
pub struct NetworkFlags {
    /// Host the session may reach: `api.github.com`, `*.pypi.org` or `*` for any public host
    /// (repeatable).
    #[arg(long = "allow", value_name = "PATTERN")]
    allow: Vec<String>,
    /// Host refused even if allowed or granted (repeatable).
    #[arg(long = "deny", value_name = "PATTERN")]
    deny: Vec<String>,
    /// Destination port (repeatable; default 80 and 443). With `policy`, replaces the list.
    #[arg(long = "port", value_name = "N")]
    ports: Vec<u16>,
    /// Address range reachable by address, e.g. 203.0.113.0/24 (repeatable). With `policy`,
    /// replaces the list.
    #[arg(long = "cidr", value_name = "CIDR")]
    cidrs: Vec<String>,
}

impl NetworkFlags {
    fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty() && self.ports.is_empty() && self.cidrs.is_empty()
    }
}

/// What `create` sets and `update` changes.
#[derive(clap::Args)]
pub struct Settings {
    /// Automatic snapshots, e.g. `disk=1m,full=15m,keep=1h,hourly=1d,daily=7d` or `off`
    /// (default at create: the server's).
    #[arg(long)]
    snapshot_policy: Option<SnapshotPolicy>,
    /// Suspend the session after this long without activity, e.g. `10m`, `2h` or a number of
    /// seconds (default: never; `update --idle-timeout 0` turns it off).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_secs)]
    idle_timeout: Option<u64>,
    /// Destroy the session this long after its creation, e.g. `7d`, `12h` or a number of seconds
    /// (default: never; `update --max-age 0` turns it off).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_secs)]
    max_age: Option<u64>,
    /// What reaching the maximum age does: `destroy` (the default) or `suspend` (memory and
    /// files kept; resume it as any suspended session).
    #[arg(long, value_name = "ACTION", value_parser = parse_max_age_action)]
    on_max_age: Option<space_api::MaxAgeAction>,
    /// When a call resumes the suspended session (`--auto-resume`), it ends (or with
    /// `--on-max-age suspend`, suspends again) this long after that resume, e.g. `5m`
    /// (default: the maximum age stays as it is; `update --auto-resume-max-age 0` turns it off).
    #[arg(long, value_name = "DURATION", value_parser = units::parse_secs)]
    auto_resume_max_age: Option<u64>,
    /// A name to recognise the session by (`update --name ''` removes it).
    #[arg(long)]
    name: Option<String>,
    /// A label to find the session by, `K=V` (repeatable; with `update`, replaces them all).
    #[arg(long = "label", value_name = "K=V")]
    labels: Vec<String>,
    /// Free-form data kept with the session, `K=V` (repeatable; with `update`, replaces it all).
    #[arg(long = "metadata", value_name = "K=V")]
    metadata: Vec<String>,
    /// Calls that need the sandbox (exec, files, …) resume the session when it is suspended
    /// (`--auto-resume=false` turns it off).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    auto_resume: Option<bool>,
}

#[derive(Subcommand)]
pub enum SessionCommand {
    /// Create a session; prints its id.
    Create {
        /// Template to start from (default: the server's `--default-template`).
        #[arg(long)]
        template: Option<String>,
        /// `linux` (namespaces on the host kernel) or `vm` (its own kernel); default: the server's.
        #[arg(long)]
        runtime: Option<space_api::RuntimeKind>,
        /// CPU limit, e.g. `2` or `0.5` (default: the server's).
        #[arg(long)]
        cpus: Option<f64>,
        /// Memory limit, e.g. `512m`, `1g` or a number of MiB (default: the server's).
        #[arg(long, value_name = "SIZE", value_parser = units::parse_mib)]
        memory: Option<u64>,
        /// Process limit.
        #[arg(long)]
        pids: Option<u32>,
        /// Disk limit, e.g. `10g`, `512m` or a number of MiB (what the session writes, snapshots
        /// included; default: the server's).
        #[arg(long, value_name = "SIZE", value_parser = units::parse_mib)]
        disk: Option<u64>,
        /// Environment variable for every command, `K=V` (repeatable).
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        #[command(flatten)]
        settings: Box<Settings>,
        #[command(flatten)]
        network: NetworkFlags,
        /// Credential to grant to the session (repeatable).
        #[arg(long = "grant", value_name = "NAME")]
        grants: Vec<String>,
    },
    /// Show a session's network policy and grants; with flags, change the policy first.
    Policy {
        /// Session id.
        id: String,
        #[command(flatten)]
        network: NetworkFlags,
        /// Detach a fork from its parent: revoking a grant there no longer revokes it here.
        #[arg(long)]
        detach: bool,
    },
    /// Grant a credential to a session (injected from its next request on).
    Grant {
        /// Session id.
        id: String,
        /// Credential name.
        credential: String,
    },
    /// Revoke a credential from a session.
    Revoke {
        /// Session id.
        id: String,
        /// Credential name.
        credential: String,
    },
    /// The gateway's decisions for a session, oldest first.
    Audit {
        /// Session id.
        id: String,
        /// The latest N events.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Change a session's settings.
    Update {
        /// Session id.
        id: String,
        #[command(flatten)]
        settings: Box<Settings>,
    },
    /// List your sessions, newest first.
    List {
        /// Include destroyed sessions.
        #[arg(long)]
        all: bool,
        /// Every tenant's sessions (admin key).
        #[arg(long)]
        all_tenants: bool,
        /// Only sessions with this label, `K=V` (repeatable: all must match).
        #[arg(long = "label", value_name = "K=V")]
        labels: Vec<String>,
        /// Only sessions in this state, e.g. `running` or `suspended`.
        #[arg(long)]
        state: Option<String>,
        /// Only sessions of this template.
        #[arg(long)]
        template: Option<String>,
    },
    /// Show one session.
    Show {
        /// Session id.
        id: String,
    },
    /// What a session uses now: memory, CPU, processes and disk.
    Stats {
        /// Session id.
        id: String,
    },
    /// A token for a sub-agent: it may do `--scope` to this session and the sessions forked
    /// from it, nothing else; prints it once. `space key revoke ID` ends it.
    Token {
        /// Session id.
        id: String,
        /// read, exec, fork, snapshot or destroy (repeatable; destroy: its forks only).
        #[arg(long = "scope", required = true)]
        scopes: Vec<space_api::TokenScope>,
        /// How long it works: a duration (30m, 12h, 7d at most).
        #[arg(long, default_value = "1h", value_parser = units::parse_secs)]
        ttl: u64,
        /// What it is for, shown by `space key list`.
        #[arg(long)]
        name: Option<String>,
    },
    /// Destroy a session and its sandbox.
    Destroy {
        /// Session id.
        id: String,
    },
    /// A session's state transitions and events.
    Events {
        /// Session id.
        id: String,
    },
    /// Freeze every process of a session in place (memory stays on the node).
    Pause {
        /// Session id.
        id: String,
    },
    /// Continue a paused or suspended session.
    Resume {
        /// Session id.
        id: String,
    },
    /// Save the session's processes, memory and files in a full snapshot and free its sandbox
    /// (`resume` brings it back, also after a server restart).
    Suspend {
        /// Session id.
        id: String,
    },
    /// Return a session to one of its snapshots.
    Restore {
        /// Session id.
        id: String,
        /// Snapshot id (see `space snapshot list ID`).
        snapshot: String,
    },
    /// New sessions that continue from a snapshot of this one; prints their ids.
    Fork {
        /// Session id.
        id: String,
        /// Snapshot to fork from (default: a new disk snapshot of the session as it is now).
        #[arg(long)]
        from: Option<String>,
        /// How many forks to make.
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
}

/// Prints a session's id and state (or the session as JSON).
fn print_state(session: &Session, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(session);
    }
    println!("{} {}", session.id, session.state.as_str());
    Ok(())
}

/// `K=V` arguments of `--flag` as a map.
fn parse_pairs(flag: &str, pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => bail!("--{flag} takes K=V, got {pair:?}"),
        })
        .collect()
}

/// The query of `GET /v1/sessions` for `session list`'s flags.
fn list_query(all: bool, all_tenants: bool, labels: &[String], state: Option<&str>, template: Option<&str>) -> String {
    let mut query = vec![format!("all={all}")];
    if all_tenants {
        query.push("all_tenants=true".into());
    }
    query.extend(labels.iter().map(|l| format!("label={}", encode(l))));
    query.extend(state.map(|s| format!("state={}", encode(s))));
    query.extend(template.map(|t| format!("template={}", encode(t))));
    query.join("&")
}

pub async fn run(client: &Client, command: SessionCommand, json: bool) -> anyhow::Result<()> {
    match command {
        SessionCommand::Create { template, runtime, cpus, memory, pids, disk, env, settings, network, grants } => {
            let env = parse_pairs("env", &env)?;
            let request = CreateSessionRequest {
                name: settings.name,
                labels: parse_pairs("label", &settings.labels)?,
                metadata: parse_pairs("metadata", &settings.metadata)?,
                auto_resume: settings.auto_resume.unwrap_or(false),
                template,
                runtime,
                cpus,
                memory_mib: memory,
                pids,
                disk_mib: disk,
                env,
                snapshot_policy: settings.snapshot_policy,
                idle_timeout_secs: settings.idle_timeout,
                max_age_secs: settings.max_age,
                on_max_age: settings.on_max_age,
                auto_resume_max_age_secs: settings.auto_resume_max_age,
                network: (!network.is_empty()).then_some(NetworkPolicy {
                    allow: network.allow,
                    deny: network.deny,
                    ports: network.ports,
                    cidrs: network.cidrs,
                }),
                grants,
            };
            let session: Session = client.post_json("/v1/sessions", &request).await?;
            // The same object `session show --json` prints.
            if json {
                print_json(&session)?;
            } else {
                println!("{}", session.id);
            }
        }
        SessionCommand::List { all, all_tenants, labels, state, template } => {
            let query = list_query(all, all_tenants, &labels, state.as_deref(), template.as_deref());
            let list: SessionList = client.get_json(&format!("/v1/sessions?{query}")).await?;
            if json {
                return print_json(&list);
            }
            output::print_sessions(&list.sessions, all_tenants);
        }
        SessionCommand::Show { id } => {
            let session: Session = client.get_json(&format!("/v1/sessions/{id}")).await?;
            print_session(&session, json)?;
        }
        SessionCommand::Stats { id } => {
            let stats: SessionStats = client.get_json(&format!("/v1/sessions/{id}/stats")).await?;
            print_stats(&stats, json)?;
        }
        SessionCommand::Destroy { id } => {
            print_state(&client.delete_json(&format!("/v1/sessions/{id}")).await?, json)?;
        }
        SessionCommand::Token { id, scopes, ttl, name } => {
            let request = space_api::CreateSessionTokenRequest { scopes, ttl_secs: Some(ttl), name };
            let created: space_api::CreatedKey =
                client.post_json(&format!("/v1/sessions/{id}/tokens"), &request).await?;
            if json {
                print_json(&created)?;
            } else {
                println!("{}", created.key);
                eprintln!(
                    "token {} for session {id} and its forks; shown once, `space key revoke {}` ends it",
                    created.id, created.id
                );
            }
        }
        SessionCommand::Update { id, settings } => {
            let request = UpdateSessionRequest {
                snapshot_policy: settings.snapshot_policy,
                idle_timeout_secs: settings.idle_timeout,
                max_age_secs: settings.max_age,
                on_max_age: settings.on_max_age,
                auto_resume_max_age_secs: settings.auto_resume_max_age,
                labels: (!settings.labels.is_empty()).then(|| parse_pairs("label", &settings.labels)).transpose()?,
                metadata: (!settings.metadata.is_empty())
                    .then(|| parse_pairs("metadata", &settings.metadata))
                    .transpose()?,
                name: settings.name,
                auto_resume: settings.auto_resume,
            };
            let session: Session = client.patch_json(&format!("/v1/sessions/{id}"), &request).await?;
            print_session(&session, json)?;
        }
        SessionCommand::Pause { id } => {
            print_state(&client.post_json(&format!("/v1/sessions/{id}/pause"), &()).await?, json)?;
        }
        SessionCommand::Resume { id } => {
            print_state(&client.post_json(&format!("/v1/sessions/{id}/resume"), &()).await?, json)?;
        }
        SessionCommand::Suspend { id } => {
            print_state(&client.post_json(&format!("/v1/sessions/{id}/suspend"), &()).await?, json)?;
        }
        SessionCommand::Restore { id, snapshot } => {
            let request = RestoreRequest { snapshot: snapshot.parse()? };
            print_state(&client.post_json(&format!("/v1/sessions/{id}/restore"), &request).await?, json)?;
        }
        SessionCommand::Fork { id, from, count } => {
            let request = ForkRequest { from: from.map(|f| f.parse()).transpose()?, count: Some(count) };
            let list: SessionList = client.post_json(&format!("/v1/sessions/{id}/fork"), &request).await?;
            if json {
                return print_json(&list);
            }
            for session in &list.sessions {
                println!("{}", session.id);
            }
        }
        SessionCommand::Policy { id, network, detach } => {
            let path = format!("/v1/sessions/{}/network", encode(&id));
            let result: SessionNetwork = if network.is_empty() && !detach {
                client.get_json(&path).await?
            } else {
                let update = NetworkPolicyUpdate {
                    allow: network.allow,
                    deny: network.deny,
                    ports: (!network.ports.is_empty()).then_some(network.ports),
                    cidrs: (!network.cidrs.is_empty()).then_some(network.cidrs),
                    detached: detach,
                };
                client.patch_json(&path, &update).await?
            };
            print_network(&result, json)?;
        }
        SessionCommand::Grant { id, credential } => {
            let request = GrantRequest { credential };
            let path = format!("/v1/sessions/{}/grants", encode(&id));
            print_network(&client.post_json(&path, &request).await?, json)?;
        }
        SessionCommand::Revoke { id, credential } => {
            let path = format!("/v1/sessions/{}/grants/{}", encode(&id), encode(&credential));
            print_network(&client.delete_json(&path).await?, json)?;
        }
        SessionCommand::Audit { id, limit } => {
            let query = limit.map(|n| format!("?limit={n}")).unwrap_or_default();
            let audit: AuditList = client.get_json(&format!("/v1/sessions/{}/audit{query}", encode(&id))).await?;
            print_audit(&audit, json)?;
        }
        SessionCommand::Events { id } => {
            let events: EventList = client.get_json(&format!("/v1/sessions/{id}/events")).await?;
            if json {
                return print_json(&events);
            }
            let rows: Vec<Vec<String>> = events
                .events
                .iter()
                .map(|e| {
                    let change = match (e.from_state, e.to_state) {
                        (Some(f), Some(t)) => format!("{} -> {}", f.as_str(), t.as_str()),
                        (None, Some(t)) => t.as_str().to_owned(),
                        _ => String::new(),
                    };
                    vec![output::time(e.at), e.kind.clone(), change, e.message.clone().unwrap_or_default()]
                })
                .collect();
            print_table(&["TIME", "KIND", "STATE", "MESSAGE"], &rows);
        }
    }
    Ok(())
}

fn print_network(network: &SessionNetwork, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(network);
    }
    let p = &network.policy;
    let list = |items: &[String]| if items.is_empty() { "-".to_owned() } else { items.join(" ") };
    let ports = if p.ports.is_empty() {
        "80 443 (default)".to_owned()
    } else {
        p.ports.iter().map(u16::to_string).collect::<Vec<_>>().join(" ")
    };
    println!("session  {}", network.session_id);
    println!("allow    {}", list(&p.allow));
    println!("deny     {}", list(&p.deny));
    println!("ports    {ports}");
    println!("cidrs    {}", list(&p.cidrs));
    println!("grants   {}", list(&network.grants));
    if !network.inherited.is_empty() {
        println!("inherited {} (revoked with the parent's; `--detach` keeps them)", network.inherited.join(" "));
    }
    Ok(())
}

fn print_audit(audit: &AuditList, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(audit);
    }
    let rows: Vec<Vec<String>> = audit
        .events
        .iter()
        .map(|e| {
            vec![
                output::time(e.time),
                e.decision.as_str().to_owned(),
                e.protocol.clone(),
                format!("{}:{}", e.host, e.port),
                e.method.clone().unwrap_or_default(),
                e.path.clone().unwrap_or_default(),
                e.credential.clone().unwrap_or_default(),
                format!("{}/{}", output::bytes(e.bytes_sent), output::bytes(e.bytes_received)),
                e.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let header =
        ["TIME", "DECISION", "PROTOCOL", "DESTINATION", "METHOD", "PATH", "CREDENTIAL", "SENT/RECEIVED", "REASON"];
    print_table(&header, &rows);
    Ok(())
}

fn parse_max_age_action(value: &str) -> Result<space_api::MaxAgeAction, String> {
    match value {
        "destroy" => Ok(space_api::MaxAgeAction::Destroy),
        "suspend" => Ok(space_api::MaxAgeAction::Suspend),
        other => Err(format!("{other:?} is not destroy or suspend")),
    }
}
