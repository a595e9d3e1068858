//! `hawser init` and `hawser node remove`: the cluster membership commands.
//!
//! `init` bootstraps the Raft group on the node it addresses (run it on one node only;
//! the others `hawser start --join` it). `node remove` takes a member out through the
//! Raft leader, wherever the addressed node is.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct InitArgs {
    /// Node to bootstrap the cluster on.
    #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
    host: String,
}

#[derive(Args, Debug)]
pub struct NodeArgs {
    #[command(subcommand)]
    command: NodeCommand,
}

#[derive(Subcommand, Debug)]
enum NodeCommand {
    /// Take a node out of the cluster (Raft membership and registry). Refused while the
    /// node masters an element of a replication scheme: move the role first.
    Remove {
        /// Any member of the cluster; the request goes to the Raft leader.
        #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
        host: String,
        /// Id of the node to remove (as `hawser status` lists it).
        #[arg(long)]
        node_id: u64,
    },
}

pub async fn init(args: InitArgs) -> anyhow::Result<ExitCode> {
    let mut client = hawser_client::Client::connect(&args.host)
        .await
        .with_context(|| format!("connect to {}", args.host))?;
    let reply = client
        .init()
        .await
        .with_context(|| format!("initialize the cluster on {}", args.host))?;
    println!("{}", reply.message);
    Ok(ExitCode::SUCCESS)
}

pub async fn node(args: NodeArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        NodeCommand::Remove { host, node_id } => {
            let mut client = hawser_client::Client::connect(&host)
                .await
                .with_context(|| format!("connect to {host}"))?;
            client
                .remove_node(node_id)
                .await
                .with_context(|| format!("remove node {node_id}"))?;
            println!("node {node_id} removed from the cluster");
            Ok(ExitCode::SUCCESS)
        }
    }
}
