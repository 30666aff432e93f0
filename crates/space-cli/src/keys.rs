//! `space key …`: API keys.

use clap::Subcommand;
use space_api::{ApiKey, CreateKeyRequest, CreatedKey, KeyList};

use crate::client::{Client, encode};
use crate::output::{ago, print_json, print_table};

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Create an API key for a tenant (needs the admin key); prints the key, shown once.
    Create {
        /// The tenant the key belongs to (created if it does not exist).
        #[arg(long)]
        tenant: String,
        /// What the key is for, shown by `space key list`.
        #[arg(long)]
        name: Option<String>,
        /// The key stops working after this long, e.g. `30d`, `12h` or a number of seconds (default: never).
        #[arg(long, value_name = "DURATION", value_parser = crate::units::parse_secs)]
        expires_in: Option<u64>,
    },
    /// List API keys (never their secrets): every tenant's with the admin key, else yours.
    List,
    /// Revoke an API key: the next request made with it fails.
    Revoke {
        /// The key's id (`key_…`, see `space key list`).
        id: String,
    },
    /// Replace an API key by a new one (same tenant and name) and revoke the old one; prints
    /// the new key. Rotating the admin key also writes the new one to DATA_DIR/admin.key.
    Rotate {
        /// The key's id (`key_…`, see `space key list`).
        id: String,
    },
}

pub async fn run(client: &Client, command: KeyCommand, json: bool) -> anyhow::Result<()> {
    match command {
        KeyCommand::Create { tenant, name, expires_in } => {
            let request = CreateKeyRequest { tenant, name, expires_in_secs: expires_in };
            print_created(&client.post_json("/v1/keys", &request).await?, json)
        }
        KeyCommand::List => {
            let list: KeyList = client.get_json("/v1/keys").await?;
            if json {
                return print_json(&list);
            }
            let rows: Vec<Vec<String>> = list.keys.iter().map(key_row).collect();
            print_table(&["ID", "NAME", "TENANT", "CREATED", "LAST USED", "EXPIRES", "REVOKED"], &rows);
            Ok(())
        }
        KeyCommand::Revoke { id } => {
            let key: ApiKey = client.delete_json(&format!("/v1/keys/{}", encode(&id))).await?;
            if json {
                return print_json(&key);
            }
            println!("{} revoked", key.id);
            Ok(())
        }
        KeyCommand::Rotate { id } => {
            let path = format!("/v1/keys/{}/rotate", encode(&id));
            print_created(&client.post_json(&path, &()).await?, json)
        }
    }
}

fn print_created(key: &CreatedKey, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(key);
    }
    println!("{}", key.key);
    Ok(())
}

fn key_row(key: &ApiKey) -> Vec<String> {
    let when = |at: Option<i64>, none: &str| at.map(ago).unwrap_or_else(|| none.to_owned());
    vec![
        key.id.to_string(),
        key.name.clone().unwrap_or_default(),
        key.tenant.clone(),
        ago(key.created_at),
        when(key.last_used_at, "never"),
        when(key.expires_at, "never"),
        when(key.revoked_at, "-"),
    ]
}
