//! `hawser cert`: the cluster's CA, node certificates and client certificates, written
//! into a certificates directory (`--certs-dir`) as nodes and clients read them
//! (`hawser_tls`; docs/security.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use hawser_tls::{Issue, Role};

#[derive(Args, Debug)]
#[command(after_help = "\
Examples (one machine; on several, copy ca.crt and each node's pair to it, and keep ca.key
elsewhere):
  hawser cert create-ca     --certs-dir certs --ca-key safe/ca.key
  hawser cert create-node   ds1 localhost 127.0.0.1 --certs-dir certs --ca-key safe/ca.key
  hawser cert create-client root --role admin --certs-dir certs --ca-key safe/ca.key
  hawser start --name ds1 --certs-dir certs
  hawser status --certs-dir certs              # as client root (--user names another)")]
pub struct CertArgs {
    #[command(subcommand)]
    command: CertCommand,
}

// The variants are the commands' names (cockroach's `cert create-*`).
#[allow(clippy::enum_variant_names)]
#[derive(Subcommand, Debug)]
enum CertCommand {
    /// Make the cluster's certificate authority: ca.crt in the certificates directory,
    /// and its key (--ca-key). Every node and client certificate is signed with it; a
    /// node accepts only callers with a certificate of this CA.
    CreateCa {
        #[command(flatten)]
        issue: IssueArgs,
    },
    /// Make node.crt and node.key for a node: both ends of every call between nodes.
    /// HOSTS are every name and address peers and clients reach the node by (they are
    /// checked against the address dialled).
    CreateNode {
        /// The node's store name (`hawser start --name`).
        name: String,
        /// Host names and IP addresses the certificate is valid for.
        #[arg(required = true)]
        hosts: Vec<String>,
        #[command(flatten)]
        issue: IssueArgs,
    },
    /// Make client.USER.crt and client.USER.key for a client with a role: admin
    /// (everything), writer (SQL and typed reads and writes) or reader (reads only).
    CreateClient {
        /// The user name the certificate names.
        user: String,
        /// What the user may do.
        #[arg(long, value_parser = ["admin", "writer", "reader"])]
        role: String,
        #[command(flatten)]
        issue: IssueArgs,
    },
}

#[derive(Args, Debug)]
struct IssueArgs {
    /// The CA's key [default: ca.key in the certificates directory]. Keep it off the
    /// nodes: only `hawser cert` needs it.
    #[arg(long)]
    ca_key: Option<PathBuf>,
    /// How long what is made stays valid, in days [default: 3650 for a CA, 1825 for
    /// the others].
    #[arg(long)]
    lifetime_days: Option<u32>,
    /// Replace files that exist.
    #[arg(long)]
    overwrite: bool,
}

impl IssueArgs {
    fn issue(&self, certs_dir: &Path, default_days: u32) -> Issue {
        Issue {
            certs_dir: certs_dir.to_path_buf(),
            ca_key: self
                .ca_key
                .clone()
                .unwrap_or_else(|| certs_dir.join(hawser_tls::CA_KEY)),
            days: self.lifetime_days.unwrap_or(default_days),
            overwrite: self.overwrite,
        }
    }
}

pub fn run(args: CertArgs, certs_dir: Option<&Path>) -> anyhow::Result<ExitCode> {
    let certs_dir = certs_dir.context(
        "give the certificates directory: --certs-dir DIR (or HAWSER_CERTS_DIR); it is \
         created if missing",
    )?;
    let written = match &args.command {
        CertCommand::CreateCa { issue } => issue.issue(certs_dir, 3650).create_ca()?,
        CertCommand::CreateNode { name, hosts, issue } => {
            issue.issue(certs_dir, 1825).create_node(name, hosts)?
        }
        CertCommand::CreateClient { user, role, issue } => {
            let role: Role = role.parse()?;
            issue.issue(certs_dir, 1825).create_client(user, role)?
        }
    };
    for path in written {
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
