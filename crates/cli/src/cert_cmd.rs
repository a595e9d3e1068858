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
  hawser status --certs-dir certs              # as client root (--user names another)
  export HAWSER_TOKEN=$(hawser cert create-token etl --role writer --certs-dir certs \
                          --ca-key safe/ca.key)
  hawser sql -e 'select 1' --certs-dir certs   # with only ca.crt there: as etl, by token
  hawser cert revoke-token 3f9c0a1b22d4e5f6 --certs-dir certs   # then copy revoked-tokens
                                                                 # to every node's directory")]
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
    /// Print a token for a program that cannot hold a certificate: USER with a role,
    /// signed with the CA key, valid --lifetime-days (default 90). The program sends it
    /// as `authorization: Bearer <token>` over TLS (the CLI: --token or HAWSER_TOKEN,
    /// with ca.crt in --certs-dir). Only the token goes to stdout; its id and expiry to
    /// stderr (or everything as JSON with --json). Nothing is written: keep the token
    /// as secret as a key.
    CreateToken {
        /// The user name the token names.
        user: String,
        /// What the user may do.
        #[arg(long, value_parser = ["admin", "writer", "reader"])]
        role: String,
        /// The CA's key [default: ca.key in the certificates directory].
        #[arg(long)]
        ca_key: Option<PathBuf>,
        /// How long the token stays valid, in days.
        #[arg(long, default_value_t = 90)]
        lifetime_days: u32,
        /// Print {"token", "user", "role", "id", "expires"} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its id: add it to revoked-tokens in the certificates
    /// directory. Nodes read that file from their own --certs-dir and notice a change
    /// within a second; copy it to every node (on Kubernetes, into the Secret).
    RevokeToken {
        /// The token's id (printed by create-token).
        id: String,
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
        CertCommand::CreateToken {
            user,
            role,
            ca_key,
            lifetime_days,
            json,
        } => {
            let issue = Issue {
                certs_dir: certs_dir.to_path_buf(),
                ca_key: ca_key
                    .clone()
                    .unwrap_or_else(|| certs_dir.join(hawser_tls::CA_KEY)),
                days: *lifetime_days,
                overwrite: false,
            };
            let (token, claims) = issue.create_token(user, role.parse()?)?;
            let expires = chrono::DateTime::from_timestamp(claims.expires as i64, 0)
                .map(|t| t.to_rfc3339())
                .unwrap_or_default();
            if *json {
                let out = serde_json::json!({
                    "token": token,
                    "user": claims.user,
                    "role": claims.role.as_str(),
                    "id": claims.id,
                    "expires": expires,
                });
                println!("{out}");
            } else {
                println!("{token}");
                eprintln!(
                    "token for {} ({}), id {}, expires {expires}",
                    claims.user, claims.role, claims.id
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        CertCommand::RevokeToken { id } => {
            revoke(certs_dir, id)?;
            return Ok(ExitCode::SUCCESS);
        }
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

/// Adds `id` to the certificates directory's revoked-tokens, once.
fn revoke(certs_dir: &Path, id: &str) -> anyhow::Result<()> {
    use std::io::Write;
    anyhow::ensure!(
        !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "token id {id:?}: the hexadecimal id create-token printed"
    );
    let path = certs_dir.join(hawser_tls::REVOKED_TOKENS);
    let listed = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .lines()
            .any(|l| l.split('#').next().unwrap_or("").trim() == id),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    if listed {
        println!("{id} is already revoked in {}", path.display());
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    writeln!(f, "{id}")
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("revoked {id} in {}", path.display());
    Ok(())
}
