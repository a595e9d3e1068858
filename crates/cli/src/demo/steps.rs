//! The demo's steps, run in order over one [`Demo`].
//!
//! ```text
//!  StartSeed ─► Bootstrap ─► Join ─► AwaitQuorum ─► CreateTables ─► CreateScheme
//!            ─► AwaitStreams ─► Workload ─► CatchUp ─► Conflict   (then the summary)
//! ```
//!
//! Each step says what it does on stderr before it starts, waits only with deadlines,
//! and leaves what later steps and the summary need in the [`Demo`]. A new step is one
//! more variant here and one more entry in [`STEPS`]; the failover drill
//! (`--failover`, [`super::failover`]) runs after the summary is gathered.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hawser_client::RowOp;
use hawser_core::Value;

use super::probe::{get_json, wait_until};
use super::scheme::{self, NODES, SCHEME, SEED, TABLES, TRANSFER, WORKLOAD_TABLE};
use super::{ChildNode, Demo, Workload};

/// How long the cluster may take to elect a leader with three voters.
const QUORUM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long replication DDL is retried while there is no leader.
const DDL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the scheme's streams may take to connect.
const STREAMS_TIMEOUT: Duration = Duration::from_secs(30);
/// How long subscribers may take to apply everything once writes stop.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// Concurrent writers of the workload.
const WRITERS: u32 = 8;
/// Tries per workload row when the error is retryable.
const WRITE_ATTEMPTS: u32 = 5;
/// Pause before a retry, times the attempt number.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// One step of the demo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Start the first node.
    StartSeed,
    /// `hawser init` on it: a one-voter Raft cluster.
    Bootstrap,
    /// Start the other nodes with `--join`.
    Join,
    /// Wait until every node sees three voters and the same leader.
    AwaitQuorum,
    /// Create the tables on every node, example rows on the master.
    CreateTables,
    /// CREATE REPLICATION through a follower; read back the effective scheme.
    CreateScheme,
    /// Wait until every stream of the scheme is streaming.
    AwaitStreams,
    /// A transfer transaction and the write workload on the master.
    Workload,
    /// Wait until every stream has acknowledged its sender's whole log.
    CatchUp,
    /// Two masters of `branches` update one row while neither hears the other
    /// ([`super::conflict`]).
    Conflict,
}

/// The steps, in the order they run.
pub(crate) const STEPS: &[Step] = &[
    Step::StartSeed,
    Step::Bootstrap,
    Step::Join,
    Step::AwaitQuorum,
    Step::CreateTables,
    Step::CreateScheme,
    Step::AwaitStreams,
    Step::Workload,
    Step::CatchUp,
    Step::Conflict,
];

impl Step {
    /// What the step does, for the progress line.
    pub(crate) fn describe(self, demo: &Demo) -> String {
        match self {
            Step::StartSeed => format!("starting {}…", NODES[0]),
            Step::Bootstrap => format!("forming the Raft cluster: hawser init on {}…", NODES[0]),
            Step::Join => format!("starting {} with --join…", NODES[1..].join(" and ")),
            Step::AwaitQuorum => "waiting for three Raft voters and a leader…".into(),
            Step::CreateTables => format!(
                "creating tables on the nodes that hold them (TABLE DDL is not replicated), \
                 rows on {}…",
                NODES[0]
            ),
            Step::CreateScheme => format!(
                "CREATE REPLICATION through {}: Raft commits it for the whole cluster…",
                NODES[2]
            ),
            Step::AwaitStreams => "waiting for the replication streams to connect…".into(),
            Step::Workload => format!(
                "writing: one transfer transaction, then {} rows into {WORKLOAD_TABLE} \
                 by {WRITERS} writers on {}…",
                demo.writes, NODES[0]
            ),
            Step::CatchUp => "waiting for the subscribers to catch up…".into(),
            Step::Conflict => format!(
                "a conflict: {} and {} both master branches (scheme branches, CHECK \
                 CONFLICTS BY ROW TIMESTAMP) and update one row while paused…",
                NODES[1], NODES[2]
            ),
        }
    }

    /// Runs the step.
    pub(crate) async fn run(self, demo: &mut Demo) -> anyhow::Result<()> {
        match self {
            Step::StartSeed => start_seed(demo).await,
            Step::Bootstrap => bootstrap(demo).await,
            Step::Join => join(demo).await,
            Step::AwaitQuorum => await_quorum(demo).await,
            Step::CreateTables => create_tables(demo).await,
            Step::CreateScheme => create_scheme(demo).await,
            Step::AwaitStreams => await_streams(demo).await,
            Step::Workload => workload(demo).await,
            Step::CatchUp => catch_up(demo).await,
            Step::Conflict => super::conflict::run(demo).await,
        }
    }
}

async fn start(demo: &mut Demo, name: &str) -> anyhow::Result<()> {
    let join: Vec<String> = demo.nodes.iter().map(|n| n.grpc.clone()).collect();
    let join: Vec<&str> = join.iter().map(String::as_str).collect();
    let node = ChildNode::start(name, &demo.root.join(name), &join).await?;
    demo.progress(&format!(
        "  {name} ready: node id {}, gRPC {}, HTTP {}",
        node.node_id, node.grpc, node.http
    ));
    demo.nodes.push(node);
    Ok(())
}

async fn start_seed(demo: &mut Demo) -> anyhow::Result<()> {
    start(demo, NODES[0]).await
}

async fn bootstrap(demo: &mut Demo) -> anyhow::Result<()> {
    let seed = demo.node(NODES[0])?;
    let reply = seed
        .client
        .clone()
        .init()
        .await
        .with_context(|| format!("hawser init on {}", seed.name))?;
    if !reply.initialized_now {
        bail!(
            "{} was already in a cluster: {} (the demo needs new nodes)",
            seed.name,
            reply.message
        );
    }
    Ok(())
}

async fn join(demo: &mut Demo) -> anyhow::Result<()> {
    for name in &NODES[1..] {
        start(demo, name).await?;
    }
    Ok(())
}

async fn await_quorum(demo: &mut Demo) -> anyhow::Result<()> {
    let nodes = &demo.nodes;
    let leader = wait_until(
        "three voters and one leader seen by every node",
        QUORUM_TIMEOUT,
        async || {
            let mut leaders = Vec::new();
            for n in nodes {
                let status = n.client.clone().status().await.map_err(|e| e.to_string())?;
                let c = status.cluster.unwrap_or_default();
                let voters = c.nodes.iter().filter(|m| m.membership == "voter").count();
                if voters != NODES.len() || c.leader_id == 0 {
                    return Err(format!(
                        "{} sees {voters} voters, leader {}",
                        n.name, c.leader_id
                    ));
                }
                leaders.push((c.leader_id, c.term));
            }
            leaders.dedup();
            match leaders[..] {
                [one] => Ok(one),
                _ => Err(format!("the nodes name different leaders: {leaders:?}")),
            }
        },
    )
    .await?;
    let name = demo
        .nodes
        .iter()
        .find(|n| n.node_id == leader.0)
        .map_or("?", |n| n.name.as_str());
    demo.progress(&format!("  Raft leader: {name} (term {})", leader.1));
    Ok(())
}

/// Runs `sql` on `node`; a statement error is an error.
pub(crate) async fn execute(
    node: &ChildNode,
    sql: &str,
) -> anyhow::Result<hawser_client::ScriptOutcome> {
    let outcome = node
        .client
        .clone()
        .execute(sql)
        .await
        .with_context(|| format!("run SQL on {}", node.name))?;
    if let Some(e) = &outcome.error {
        bail!(
            "on {}, statement {} failed: error[{}]: {}",
            node.name,
            e.statement,
            e.code,
            e.message
        );
    }
    Ok(outcome)
}

async fn create_tables(demo: &mut Demo) -> anyhow::Result<()> {
    for (ddl, nodes) in TABLES {
        for name in nodes {
            execute(demo.node(name)?, ddl).await?;
        }
    }
    execute(demo.node(NODES[0])?, SEED).await?;
    Ok(())
}

/// Runs replication DDL `ddl` through `via`, retrying while there is no leader (the
/// retryable 57P03); any other error is final.
pub(crate) async fn replication_ddl(via: &ChildNode, ddl: &str) -> anyhow::Result<()> {
    wait_until("replication DDL accepted", DDL_TIMEOUT, async || {
        let outcome = via
            .client
            .clone()
            .execute(ddl)
            .await
            .map_err(|e| e.to_string())?;
        match outcome.error {
            None => Ok(Ok(())),
            Some(e) if e.code == "57P03" => Err(format!("error[57P03]: {}", e.message)),
            Some(e) => Ok(Err(anyhow::anyhow!(
                "replication DDL on {}: error[{}]: {}",
                via.name,
                e.code,
                e.message
            ))),
        }
    })
    .await?
}

async fn create_scheme(demo: &mut Demo) -> anyhow::Result<()> {
    replication_ddl(demo.node(NODES[2])?, SCHEME).await?;
    // Read it back from the master: it is there once Raft has applied it on that node.
    let master = demo.node(NODES[0])?;
    let ddl = wait_until(
        "the scheme applied on the master",
        DDL_TIMEOUT,
        async || {
            let shown = master
                .client
                .clone()
                .show_schemes(None)
                .await
                .map_err(|e| e.to_string())?;
            shown
                .schemes
                .into_iter()
                .next()
                .map(|s| s.ddl)
                .ok_or_else(|| "no scheme yet".to_string())
        },
    )
    .await?;
    demo.scheme = parse_scheme(&ddl)?;
    demo.progress(&format!(
        "  scheme {} holds {} elements",
        demo.scheme.name,
        demo.scheme.elements.len()
    ));
    Ok(())
}

/// Parses the canonical DDL a node shows for a scheme.
pub(crate) fn parse_scheme(ddl: &str) -> anyhow::Result<hawser_scheme::Scheme> {
    let statement = hawser_scheme::parse(ddl)
        .map_err(|e| anyhow::anyhow!("the scheme a node shows does not parse: {}", e.message))?
        .into_iter()
        .next()
        .context("the node shows an empty scheme")?;
    match statement {
        hawser_scheme::Statement::Create(s) => Ok(s),
        _ => bail!("the node shows something else than CREATE REPLICATION"),
    }
}

/// A stream of scheme `scheme` as the sender's `/replication` shows it.
pub(crate) fn outbound<'a>(
    replication: &'a serde_json::Value,
    scheme: &str,
    receiver: &str,
) -> Option<&'a serde_json::Value> {
    replication["outbound"]
        .as_array()?
        .iter()
        .find(|s| s["receiver"] == receiver && s["scheme"] == scheme)
}

async fn await_streams(demo: &mut Demo) -> anyhow::Result<()> {
    let links = scheme::links(&demo.scheme);
    await_links(demo, &demo.scheme.name.to_string(), &links).await?;
    let shown: Vec<String> = links.iter().map(|(s, r)| format!("{s} → {r}")).collect();
    demo.progress(&format!("  streaming: {}", shown.join(", ")));
    Ok(())
}

/// Waits until every stream `links` names of scheme `scheme` is streaming.
pub(crate) async fn await_links(
    demo: &Demo,
    scheme: &str,
    links: &[(String, String)],
) -> anyhow::Result<()> {
    wait_until("every stream streaming", STREAMS_TIMEOUT, async || {
        for (sender, receiver) in links {
            let node = demo.node(sender).map_err(|e| e.to_string())?;
            let replication = get_json(&node.http, "/replication")
                .await
                .map_err(|e| e.to_string())?;
            let Some(stream) = outbound(&replication, scheme, receiver) else {
                return Err(format!("no stream {sender} → {receiver} of {scheme} yet"));
            };
            if stream["state"] != "streaming" {
                return Err(format!(
                    "{sender} → {receiver} is {} ({})",
                    stream["state"], stream["reason"]
                ));
            }
        }
        Ok(())
    })
    .await
}

async fn workload(demo: &mut Demo) -> anyhow::Result<()> {
    let master = demo.node(NODES[0])?;
    execute(master, TRANSFER).await?;

    // Exactly `writes` single-row transactions, spread over the writers.
    let writes = demo.writes;
    let started = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let mut client = master.client.clone();
        let mine: Vec<u32> = (0..writes).filter(|k| k % WRITERS == w).collect();
        writers.spawn(async move {
            for k in mine {
                let k = i64::from(k);
                let row = vec![
                    Value::Int(k),
                    Value::Text(format!("event {k} from writer {w}")),
                ];
                write_row(&mut client, row)
                    .await
                    .with_context(|| format!("write {k} to {WORKLOAD_TABLE}"))?;
            }
            anyhow::Ok(())
        });
    }
    // The first failure ends the step; dropping the set aborts the other writers.
    while let Some(done) = writers.join_next().await {
        done.context("a writer task failed")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    demo.workload = Some(Workload {
        node: NODES[0].to_string(),
        table: WORKLOAD_TABLE.to_string(),
        commits: u64::from(writes),
        writers: WRITERS,
        seconds,
        commits_per_sec: if seconds > 0.0 {
            f64::from(writes) / seconds
        } else {
            0.0
        },
    });
    demo.progress(&format!(
        "  {writes} commits in {seconds:.2} s ({:.0} commits/s)",
        f64::from(writes) / seconds.max(f64::EPSILON)
    ));
    Ok(())
}

/// Upserts one row into the workload table, retrying a few times on errors that say
/// a retry may succeed (a connection lost or refused for a moment). An upsert of the
/// same row is idempotent, so a retry of a commit whose answer was lost changes nothing.
async fn write_row(client: &mut hawser_client::Client, row: Vec<Value>) -> anyhow::Result<()> {
    let mut attempt = 1;
    loop {
        let op = RowOp::Upsert {
            table: WORKLOAD_TABLE.into(),
            row: row.clone(),
        };
        match client.write(vec![op]).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_retryable() && attempt < WRITE_ATTEMPTS => {
                tokio::time::sleep(RETRY_PAUSE * attempt).await;
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Caught up: every stream has acknowledged its sender's log up to the last LSN.
/// Senders are checked in the order the nodes started — a propagator after the
/// master — so a propagator's log is read only once everything it relays has reached
/// it.
async fn catch_up(demo: &mut Demo) -> anyhow::Result<()> {
    let links = scheme::links(&demo.scheme);
    let name = demo.scheme.name.to_string();
    let started = Instant::now();
    let demo_ref = &*demo;
    let result = wait_until("subscribers caught up", CATCH_UP_TIMEOUT, async || {
        for node in &demo_ref.nodes {
            let receivers: Vec<&String> = links
                .iter()
                .filter(|(s, _)| *s == node.name)
                .map(|(_, r)| r)
                .collect();
            if receivers.is_empty() {
                continue;
            }
            let last_lsn = node
                .client
                .clone()
                .status()
                .await
                .map_err(|e| e.to_string())?
                .last_lsn;
            let replication = get_json(&node.http, "/replication")
                .await
                .map_err(|e| e.to_string())?;
            for receiver in receivers {
                let acked = outbound(&replication, &name, receiver)
                    .and_then(|s| s["acked_lsn"].as_u64())
                    .unwrap_or(0);
                if acked < last_lsn {
                    return Err(format!(
                        "{} → {receiver} acknowledged LSN {acked} of {last_lsn}",
                        node.name
                    ));
                }
            }
        }
        Ok(())
    })
    .await;
    match result {
        Ok(()) => {
            demo.caught_up = true;
            demo.progress(&format!(
                "  caught up in {:.2} s",
                started.elapsed().as_secs_f64()
            ));
        }
        Err(e) => {
            // Not fatal: the checksums will show what differs.
            demo.caught_up = false;
            demo.progress(&format!("  warning: {e:#}"));
        }
    }
    Ok(())
}
