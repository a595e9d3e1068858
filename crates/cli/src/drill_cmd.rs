//! `hawser drill KIND`: a failover drill on a live cluster, with a verifying load, and a
//! report of what clients saw and whether every promise held. The engine is
//! `hawser_client::drill`; it runs here, or with `--on-node` on the node `--host` names
//! (`Admin.Drill`), which is how a program without this CLI runs one.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use hawser_client::drill::{self, Kind, Settings};
use hawser_client::Client;
use hawser_proto::v1;
use serde_json::json;

use crate::output::{error_text, Format};

/// What a drill does to the cluster.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindArg {
    /// The element's master crashes (as SIGKILL would) and starts again after --down.
    KillMaster,
    /// The element's master stops every thread (SIGSTOP) for --down.
    PauseMaster,
    /// The element's master is cut off from every peer for --down while clients still
    /// reach it (an in-process network partition).
    IsolateMaster,
    /// A planned switchover to a subscriber, and back after --after.
    Switchover,
    /// The Raft leader crashes and starts again after --down.
    KillLeader,
    /// No fault of the drill's own: the load runs --warmup + --down + --after while
    /// something outside strikes (chaos/netns.sh: signals, network partitions), then
    /// the same recovery wait and checks. Needs no --allow-faults.
    Observe,
}

impl KindArg {
    fn kind(self) -> Kind {
        match self {
            KindArg::KillMaster => Kind::KillMaster,
            KindArg::PauseMaster => Kind::PauseMaster,
            KindArg::IsolateMaster => Kind::IsolateMaster,
            KindArg::Switchover => Kind::Switchover,
            KindArg::KillLeader => Kind::KillLeader,
            KindArg::Observe => Kind::Observe,
        }
    }
}

/// `hawser drill`'s arguments.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
The nodes must run with --allow-faults (every kind but switchover and observe). The \
load writes to its own table, a TABLE element of the scheme:
  CREATE TABLE hawser_drill (k BIGINT PRIMARY KEY, v VARCHAR(64));   -- on every node
  ALTER REPLICATION s ADD ELEMENT drill TABLE hawser_drill MASTER ds1 SUBSCRIBER ds2 ...

Examples:
  hawser drill kill-master --scheme repscheme
  hawser drill pause-master --scheme repscheme --down 2s --format json
  hawser drill isolate-master --scheme repscheme --down 3s
  hawser drill switchover --scheme repscheme --dry-run
  hawser drill kill-master --scheme repscheme --on-node   # the load runs in a node
  hawser drill observe --scheme repscheme --down 5s   # while you strike from outside")]
pub struct DrillArgs {
    /// What to do: kill-master, pause-master, isolate-master, switchover, kill-leader,
    /// or observe (no fault of its own).
    #[arg(value_enum)]
    kind: KindArg,
    /// Any member of the cluster.
    #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
    host: String,
    /// The replication scheme.
    #[arg(long, value_name = "NAME")]
    scheme: String,
    /// The table the verifying load writes to: a TABLE element of the scheme, shaped
    /// (k BIGINT PRIMARY KEY, v VARCHAR). The drilled master is its element's.
    #[arg(long, default_value = "hawser_drill")]
    table: String,
    /// How long the drilled node stays down (crash) or stopped (pause).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    down: Duration,
    /// Concurrent writers of the verifying load.
    #[arg(long, default_value_t = 4)]
    writers: u32,
    /// Load before the fault.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Load after the down time (and, for a switchover, between the move and the move
    /// back).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    after: Duration,
    /// The longest the drill waits for the cluster to recover and the copies to agree.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Say what the drill would do, and do nothing.
    #[arg(long)]
    dry_run: bool,
    /// Run the drill on the node --host names (Admin.Drill) rather than in this
    /// process; a node the fault would strike passes it on to a healthy member.
    #[arg(long)]
    on_node: bool,
    /// Output: a table for a person, or one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Runs `hawser drill`. Exit status 0 when every promise held, 1 otherwise.
pub async fn run(args: DrillArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.writers > 0, "--writers must be at least 1");
    anyhow::ensure!(
        args.down <= hawser_node::fault::MAX_DOWN,
        "--down may be at most {:?}",
        hawser_node::fault::MAX_DOWN
    );
    let report = if args.on_node {
        on_node(&args).await?
    } else {
        here(&args).await?
    };
    let Some(report) = report else {
        return Ok(ExitCode::FAILURE);
    };
    match (args.format, report.dry_run) {
        (Format::Json, true) => println!("{}", json!({"dry_run": true, "plan": report.plan})),
        (Format::Table, true) => println!("would {}", report.plan),
        (Format::Json, false) => println!("{}", report.json),
        (Format::Table, false) => print!("{}", report.text),
    }
    Ok(if report.held {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The drill's settings from the arguments.
fn settings(args: &DrillArgs) -> Settings {
    Settings {
        host: args.host.clone(),
        writers: args.writers,
        down: args.down,
        warmup: args.warmup,
        after: args.after,
        timeout: args.timeout,
    }
}

/// Runs the drill in this process; `None` (said on stderr) when it cannot run.
async fn here(args: &DrillArgs) -> anyhow::Result<Option<v1::DrillReport>> {
    let cluster = drill::leader_status(&args.host).await?;
    let plan = match drill::plan(&cluster, args.kind.kind(), &args.scheme, &args.table) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("error: cannot drill: {why}");
            return Ok(None);
        }
    };
    if args.dry_run {
        return Ok(Some(v1::DrillReport {
            plan: plan.describe(args.down, args.after),
            dry_run: true,
            held: true,
            ..Default::default()
        }));
    }
    let table = args.format == Format::Table;
    let report = drill::run(plan, &settings(args), &|line| {
        if table {
            eprintln!("drill: {line}");
        }
    })
    .await?;
    Ok(Some(report.summary(args.down, args.after)))
}

/// Runs the drill on the node `--host` names (or, when the drill would strike that node,
/// on the member it names instead), printing its progress on stderr.
async fn on_node(args: &DrillArgs) -> anyhow::Result<Option<v1::DrillReport>> {
    let ms = |d: Duration| d.as_millis() as u64;
    let mut request = v1::DrillRequest {
        kind: args.kind.kind().name().into(),
        scheme: args.scheme.clone(),
        table: args.table.clone(),
        down_ms: ms(args.down),
        writers: args.writers,
        warmup_ms: ms(args.warmup),
        after_ms: ms(args.after),
        timeout_ms: ms(args.timeout),
        dry_run: args.dry_run,
        forwarded: false,
    };
    let mut host = args.host.clone();
    loop {
        let mut client = Client::connect(&host)
            .await
            .with_context(|| format!("connect to {host}"))?;
        let mut events = match client.drill(request.clone()).await {
            Ok(e) => e,
            Err(e) => {
                eprintln!("error: cannot drill: {}", error_text(&e));
                return Ok(None);
            }
        };
        loop {
            let event = match events.message().await {
                Ok(Some(e)) => e,
                Ok(None) => anyhow::bail!("the drill's event stream ended without a report"),
                Err(status) => {
                    let e = hawser_client::ClientError::Status(status);
                    eprintln!("error: the drill failed: {}", error_text(&e));
                    return Ok(None);
                }
            };
            match event.event {
                Some(v1::drill_event::Event::Progress(line)) if args.format == Format::Table => {
                    eprintln!("drill on {}: {line}", event.runner);
                }
                Some(v1::drill_event::Event::Report(r)) => return Ok(Some(r)),
                Some(v1::drill_event::Event::RunOn(addr)) if !request.forwarded => {
                    if args.format == Format::Table {
                        eprintln!("drill: it strikes {}, so it runs on {addr}", event.runner);
                    }
                    request.forwarded = true;
                    host = addr;
                    break;
                }
                Some(v1::drill_event::Event::RunOn(addr)) => anyhow::bail!(
                    "{} sent the drill on to {addr} again: the cluster changed, run it again",
                    event.runner
                ),
                _ => {}
            }
        }
    }
}
