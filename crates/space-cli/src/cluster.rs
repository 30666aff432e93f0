//! `space cluster`: the certificate authority control replicas and nodes authenticate each
//! other with (docs/operator-guide.md, "A cluster").

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use space_node_wire::cluster::{ClusterCa, Role};

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Make the cluster's certificate authority (ca.pem, ca.key) in DIR. Keep ca.key offline
    /// once every member has its identity.
    Init {
        /// Where to write it (default: DATA_DIR/cluster).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The cluster's name, in the authority's certificate.
        #[arg(long, default_value = "space")]
        name: String,
    },
    /// Issue NAME.pem and NAME.key, signed by the authority in DIR, for a node or a control
    /// replica.
    Issue {
        /// Where the authority is, and where the identity is written (default: DATA_DIR/cluster).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// What the holder is: `node` (is connected to) or `control` (connects to nodes).
        #[arg(long, value_enum)]
        role: RoleArg,
        /// The holder's name: a node's id, or a control replica's.
        name: String,
        /// An address or DNS name control planes reach the node by (repeat for several).
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Node,
    Control,
}

pub fn run(command: ClusterCommand, data_dir: &Path) -> anyhow::Result<()> {
    let default_dir = || data_dir.join("cluster");
    match command {
        ClusterCommand::Init { dir, name } => {
            let dir = dir.unwrap_or_else(default_dir);
            ClusterCa::generate(&name)?.write(&dir).context("writing the cluster's authority")?;
            println!("wrote {} and {}", dir.join("ca.pem").display(), dir.join("ca.key").display());
            println!("next: space cluster issue --dir {} --role node NAME --host ADDR", dir.display());
        }
        ClusterCommand::Issue { dir, role, name, hosts } => {
            let dir = dir.unwrap_or_else(default_dir);
            check_name(&name)?;
            let role = match role {
                RoleArg::Node if hosts.is_empty() => {
                    bail!("a node's certificate must name how control planes reach it: add --host ADDR")
                }
                RoleArg::Node => Role::Node,
                RoleArg::Control => Role::Control,
            };
            let ca = ClusterCa::load(&dir).with_context(|| {
                format!("reading the cluster's authority (make one with `space cluster init --dir {}`)", dir.display())
            })?;
            ca.issue(role, &name, &hosts)?.write(&dir, &name).context("writing the identity")?;
            println!(
                "wrote {} and {}",
                dir.join(format!("{name}.pem")).display(),
                dir.join(format!("{name}.key")).display()
            );
        }
    }
    Ok(())
}

/// A name becomes file names: letters, digits, `-`, `_` and `.` only, not starting with `.`.
fn check_name(name: &str) -> anyhow::Result<()> {
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.starts_with('.') || !name.chars().all(fine) || name == "ca" {
        bail!(
            "{name:?} cannot name an identity: use letters, digits, '-', '_' and '.', not starting with '.', and not \"ca\""
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_escape_the_directory_or_replace_the_authority_are_refused() {
        for bad in ["", "../x", "a/b", ".hidden", "ca", "sp ace"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["node-1", "control_a", "n1.example"] {
            check_name(good).unwrap();
        }
    }
}
