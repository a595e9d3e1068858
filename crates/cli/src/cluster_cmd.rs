//! `hawser init`, `hawser node remove` and `hawser receiver`: the cluster commands.
//!
//! `init` bootstraps the Raft group on the node it addresses (run it on one node only;
//! the others `hawser start --join` it). `node remove` takes a member out through the
//! Raft leader, wherever the addressed node is (docs/control.md, "Removing a node"). `receiver` sets a subscriber's receiver
//! state, as TimesTen's `ttRepAdmin -receiver -state`; `return-service` enables or
//! disables a subscriber's return service, as TimesTen's DISABLE RETURN would.

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
    /// Take a node out of the cluster for good: out of the registry, then out of the
    /// Raft membership, through the Raft leader.
    ///
    /// Refused while the node's store is the MASTER or PROPAGATOR of an element (move
    /// the role first: `hawser switchover`), not even --force removes it then. Refused
    /// while any replication scheme names the store as a SUBSCRIBER, unless --force
    /// (take it out of every scheme in the same step, as ALTER REPLICATION ... DROP
    /// SUBSCRIBER would) or --keep-in-schemes (leave it there for a new node under the
    /// same store name).
    ///
    /// The removed node learns it was removed (it applies its removal, a member refuses
    /// its next call, or the leader tells it), says so in its log and `hawser status`,
    /// answers 503 on /readyz, and stops replicating, taking writes and campaigning. It
    /// is never let back in under its id: to bring the machine back, start it on an
    /// empty data directory with --join (a new node).
    #[command(after_help = "\
Examples:
  hawser node remove 1234                      # refused if a scheme names its store
  hawser node remove 1234 --force              # also drops it from every scheme
  hawser node remove --node-id 1234 --keep-in-schemes   # a lost volume: a new node takes the store's name")]
    Remove {
        /// Any member of the cluster; the request goes to the Raft leader.
        #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
        host: String,
        /// Id of the node to remove (as `hawser status` lists it).
        #[arg(
            value_name = "ID",
            required_unless_present = "node_id",
            conflicts_with = "node_id"
        )]
        id: Option<u64>,
        /// The same as ID.
        #[arg(long, value_name = "ID")]
        node_id: Option<u64>,
        /// Take the node's store out of every replication scheme that names it, in the
        /// same Raft entry as the removal (refused where it is an element's last
        /// subscriber: drop the element or the scheme first).
        #[arg(long, conflicts_with = "keep_in_schemes")]
        force: bool,
        /// Leave the schemes naming the store: a new node started under the same store
        /// name (on an empty data directory, with --join) takes its place in them.
        #[arg(long)]
        keep_in_schemes: bool,
    },
}

/// A receiver state the CLI can set.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ReceiverStateArg {
    /// Send updates as soon as possible (the default state).
    Start,
    /// Keep collecting updates but send nothing until set back to start.
    Pause,
    /// Send nothing; commits stop waiting for this subscriber's return service under
    /// RETURN SERVICES OFF WHEN REPLICATION STOPPED.
    Stop,
}

#[derive(Args, Debug)]
pub struct ReceiverArgs {
    /// Any member of the cluster; the change goes through the Raft leader.
    #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
    host: String,
    /// The replication scheme [default: every scheme the subscriber is in].
    #[arg(long, value_name = "NAME")]
    scheme: Option<String>,
    /// The subscriber store whose receiver state to set.
    #[arg(long, value_name = "STORE")]
    subscriber: String,
    /// The new state.
    #[arg(long, value_enum)]
    state: ReceiverStateArg,
}

/// A return service state the CLI can set.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ReturnServiceStateArg {
    /// Commits wait for the subscriber as its RETURN RECEIPT / TWOSAFE says.
    Enabled,
    /// Commits do not wait for it (those waiting are released with 8170); it is sent
    /// to asynchronously, and a failover no longer counts it as holding what was
    /// acknowledged.
    Disabled,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  hawser return-service --subscriber ds2 --state disabled   # stop waiting for a slow subscriber
  hawser return-service --subscriber ds2 --state enabled --scheme repscheme")]
pub struct ReturnServiceArgs {
    /// Any member of the cluster; the change goes through the Raft leader.
    #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
    host: String,
    /// The replication scheme [default: every scheme the subscriber is in].
    #[arg(long, value_name = "NAME")]
    scheme: Option<String>,
    /// The subscriber store whose return service to set.
    #[arg(long, value_name = "STORE")]
    subscriber: String,
    /// The new state.
    #[arg(long, value_enum)]
    state: ReturnServiceStateArg,
}

/// Runs `hawser return-service`.
pub async fn return_service(args: ReturnServiceArgs) -> anyhow::Result<ExitCode> {
    let mut client = hawser_client::Client::connect(&args.host)
        .await
        .with_context(|| format!("connect to {}", args.host))?;
    let state = match args.state {
        ReturnServiceStateArg::Enabled => "enabled",
        ReturnServiceStateArg::Disabled => "disabled",
    };
    let schemes = client
        .set_return_service(args.scheme.as_deref(), &args.subscriber, state)
        .await
        .with_context(|| format!("set the return service of {}", args.subscriber))?;
    println!(
        "return service of {} is {} in {}",
        args.subscriber,
        state.to_uppercase(),
        schemes.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs `hawser receiver`.
pub async fn receiver(args: ReceiverArgs) -> anyhow::Result<ExitCode> {
    let mut client = hawser_client::Client::connect(&args.host)
        .await
        .with_context(|| format!("connect to {}", args.host))?;
    let state = match args.state {
        ReceiverStateArg::Start => "start",
        ReceiverStateArg::Pause => "pause",
        ReceiverStateArg::Stop => "stop",
    };
    let schemes = client
        .set_receiver_state(args.scheme.as_deref(), &args.subscriber, state)
        .await
        .with_context(|| format!("set the receiver state of {}", args.subscriber))?;
    println!(
        "receiver {} is {} in {}",
        args.subscriber,
        state.to_uppercase(),
        schemes.join(", ")
    );
    Ok(ExitCode::SUCCESS)
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
        NodeCommand::Remove {
            host,
            id,
            node_id,
            force,
            keep_in_schemes,
        } => {
            let node_id = id
                .or(node_id)
                .context("give the id of the node to remove")?;
            let mut client = hawser_client::Client::connect(&host)
                .await
                .with_context(|| format!("connect to {host}"))?;
            let reply = client
                .remove_node_with(hawser_proto::v1::RemoveNodeRequest {
                    node_id,
                    force,
                    keep_in_schemes,
                })
                .await
                .with_context(|| format!("remove node {node_id}"))?;
            println!("node {node_id} removed from the cluster");
            for role in &reply.schemes_changed {
                println!("  its store is no longer {role}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
