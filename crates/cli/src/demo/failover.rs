//! `hawser demo --failover`: what hawser exists for, on the demo's cluster.
//!
//! ```text
//!  two writers upserting events under TWOSAFE, every acknowledgement recorded
//!  SIGKILL ds1 (master of every element, Raft leader)
//!    ─► a ClusterClient write to events: refused / unanswered until the Raft leader
//!       elected in ds1's place has promoted ds2 (TWOSAFE, so it holds every commit
//!       ds1 acknowledged) — timed from the kill to the acknowledgement
//!    ─► ds1 started again on its data and address: deposed, it sets aside what only
//!       it had (hawser_lost) and receives from ds2
//!    ─► every table's checksum on every node; every write the writers had
//!       acknowledged with TWOSAFE's promise on the new master
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hawser_client::{ClusterClient, RowOp};
use hawser_core::Value;
use serde::Serialize;

use super::checksum::{self, Checksum};
use super::probe::wait_until;
use super::scheme::{NODES, WORKLOAD_TABLE};
use super::{ChildNode, Demo};

/// How long the cluster may take to fail over, and the old master to rejoin.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline of each call the failover's client makes.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the failover drill did and saw.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FailoverReport {
    pub(crate) killed: String,
    pub(crate) new_master: String,
    /// From the SIGKILL to the first write the new master acknowledged, as the client
    /// library saw it.
    pub(crate) write_after_ms: u64,
    /// From the restart of the killed node to its receiving again.
    pub(crate) rejoined_after_ms: u64,
    /// Changes the old master set aside into `hawser_lost` (what only it had).
    pub(crate) set_aside_changes: u64,
    /// Per table, each node's checksum after the rejoin.
    pub(crate) checksums: Vec<(String, Vec<(String, Checksum)>)>,
    pub(crate) copies_equal: bool,
    /// The writers that ran through the failover.
    pub(crate) load: LoadReport,
}

/// What the writers running through the failover saw, and what the new master holds.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct LoadReport {
    pub(crate) acknowledged: u64,
    /// Acknowledged with TWOSAFE's promise (no 8170).
    pub(crate) promised: u64,
    /// Promised and missing on the new master: must be 0.
    pub(crate) lost_promised: u64,
    /// Acknowledged without the promise and missing (set aside on the old master).
    pub(crate) lost_async: u64,
}

/// Keys of the failover's writers: writer w writes LOAD_BASE + w × 10⁸ + i, far from
/// the demo's own.
const LOAD_BASE: i64 = 1_000_000_000;
const LOAD_WRITERS: i64 = 2;

/// Writers upserting into events through the cluster, following the master.
struct Load {
    /// (key, promised) of every acknowledged write.
    acked: Arc<Mutex<Vec<(i64, bool)>>>,
    stop: Arc<AtomicBool>,
    tasks: tokio::task::JoinSet<()>,
}

impl Load {
    async fn start(seeds: &[String]) -> anyhow::Result<Load> {
        let acked = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..LOAD_WRITERS {
            let mut client = ClusterClient::connect(seeds, CALL_TIMEOUT)
                .await
                .context("connect the failover's writers")?;
            client.retry_for = FAILOVER_TIMEOUT;
            let (acked, stop) = (acked.clone(), stop.clone());
            tasks.spawn(async move {
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = LOAD_BASE + w * 100_000_000 + i;
                    let row = vec![Value::Int(key), Value::Text(format!("writer {w}"))];
                    let op = RowOp::Upsert {
                        table: WORKLOAD_TABLE.into(),
                        row,
                    };
                    if let Ok(o) = client.write(vec![op]).await {
                        let promised = o.return_outcome == "acknowledged";
                        acked.lock().expect("not poisoned").push((key, promised));
                    }
                }
            });
        }
        Ok(Load { acked, stop, tasks })
    }

    fn acknowledged(&self) -> usize {
        self.acked.lock().expect("not poisoned").len()
    }

    async fn finish(mut self) -> Vec<(i64, bool)> {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
        std::mem::take(&mut *self.acked.lock().expect("not poisoned"))
    }
}

/// The tables the demo creates.
const TABLES: [&str; 2] = ["accounts", "events"];

pub(crate) async fn drill(demo: &mut Demo) -> anyhow::Result<FailoverReport> {
    let killed = NODES[0];
    let seeds: Vec<String> = demo.nodes.iter().map(|n| n.grpc.clone()).collect();
    let mut client = ClusterClient::connect(&seeds, CALL_TIMEOUT)
        .await
        .context("connect the cluster client")?;
    client.retry_for = FAILOVER_TIMEOUT;
    let index = demo
        .nodes
        .iter()
        .position(|n| n.name == killed)
        .with_context(|| format!("{killed} is not running"))?;
    let (old_grpc, old_dir) = (demo.nodes[index].grpc.clone(), demo.root.join(killed));

    let load = Load::start(&seeds).await?;
    wait_until(
        "the failover's writers to get going",
        FAILOVER_TIMEOUT,
        async || {
            if load.acknowledged() >= 50 {
                Ok(())
            } else {
                Err(format!("{} writes acknowledged", load.acknowledged()))
            }
        },
    )
    .await?;
    demo.progress(&format!(
        "failover: SIGKILL of {killed}, the master of every element and the Raft leader, \
         under {LOAD_WRITERS} writers…"
    ));
    demo.nodes[index].kill().await;
    let t0 = Instant::now();
    let key = i64::from(demo.writes) + 1;
    let row = vec![
        Value::Int(key),
        Value::Text(format!("written after {killed} was killed")),
    ];
    client
        .write(vec![RowOp::Upsert {
            table: WORKLOAD_TABLE.into(),
            row,
        }])
        .await
        .context("a write after the kill, following the master")?;
    let write_after = t0.elapsed();
    let master_addr = client
        .master_of(WORKLOAD_TABLE)
        .unwrap_or_default()
        .to_string();
    let new_master = demo
        .nodes
        .iter()
        .find(|n| n.grpc == master_addr)
        .map_or_else(|| master_addr.clone(), |n| n.name.clone());
    demo.progress(&format!(
        "  {new_master} took a write {:.2} s after the kill",
        write_after.as_secs_f64()
    ));
    // The writers go on a little under the new master, then stop.
    let before = load.acknowledged();
    wait_until(
        "the writers to go on under the new master",
        FAILOVER_TIMEOUT,
        async || {
            if load.acknowledged() >= before + 50 {
                Ok(())
            } else {
                Err(format!("{} writes acknowledged", load.acknowledged()))
            }
        },
    )
    .await?;
    let acked = load.finish().await;

    demo.progress(&format!("starting {killed} again on its data…"));
    let join: Vec<String> = demo
        .nodes
        .iter()
        .filter(|n| n.name != killed)
        .map(|n| n.grpc.clone())
        .collect();
    let join: Vec<&str> = join.iter().map(String::as_str).collect();
    let restarted = Instant::now();
    let node = start_again(killed, &old_dir, &join, &old_grpc).await?;
    demo.nodes[index] = node;
    demo.master = new_master.clone();

    // Rejoined: no longer STOPPED as a receiver, and holding what the new master has.
    let master = demo.node(&new_master)?.client.clone();
    let old = demo.node(killed)?.client.clone();
    wait_until("the old master rejoining", FAILOVER_TIMEOUT, async || {
        let status = master.clone().status().await.map_err(|e| e.to_string())?;
        let cluster = status.cluster.ok_or("no cluster status")?;
        let stopped = cluster
            .schemes
            .iter()
            .flat_map(|s| s.receivers.iter())
            .any(|r| r.starts_with(&format!("{killed}=")));
        if stopped {
            return Err(format!("{killed}'s receiver is not started yet"));
        }
        for table in TABLES {
            let want = checksum::of_table(&master, table)
                .await
                .map_err(|e| e.to_string())?;
            let have = checksum::of_table(&old, table)
                .await
                .map_err(|e| e.to_string())?;
            if want != have {
                return Err(format!("{table}: {killed} {have}, {new_master} {want}"));
            }
        }
        Ok(())
    })
    .await?;
    let rejoined_after = restarted.elapsed();
    demo.progress(&format!(
        "  {killed} rejoined as a subscriber in {:.2} s",
        rejoined_after.as_secs_f64()
    ));

    let set_aside_changes = match old
        .clone()
        .execute("select count(*) from hawser_lost")
        .await
    {
        Ok(out) => out
            .results
            .first()
            .and_then(|r| r.rows.first())
            .and_then(|r| r.first())
            .and_then(|v| match v {
                Value::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            })
            .unwrap_or(0),
        // No table: nothing was set aside.
        Err(_) => 0,
    };

    // Every write acknowledged with TWOSAFE's promise is on the new master.
    let held = load_keys(&master).await?;
    let missing = |promised: bool| {
        acked
            .iter()
            .filter(|(k, p)| *p == promised && !held.contains(k))
            .count() as u64
    };
    let load = LoadReport {
        acknowledged: acked.len() as u64,
        promised: acked.iter().filter(|(_, p)| *p).count() as u64,
        lost_promised: missing(true),
        lost_async: missing(false),
    };

    let mut checksums = Vec::new();
    let mut copies_equal = true;
    let holders = super::scheme::table_holders(&demo.scheme);
    for table in TABLES {
        let mut per_node = Vec::new();
        let holds = |name: &str| {
            holders
                .get(table)
                .is_some_and(|h| h.iter().any(|s| s == name))
        };
        for n in demo.nodes.iter().filter(|n| holds(&n.name)) {
            let sum = checksum::of_table(&n.client, table)
                .await
                .with_context(|| format!("checksum {table} on {}", n.name))?;
            per_node.push((n.name.clone(), sum));
        }
        copies_equal &= per_node.windows(2).all(|w| w[0].1 == w[1].1);
        checksums.push((table.to_string(), per_node));
    }
    Ok(FailoverReport {
        killed: killed.to_string(),
        new_master,
        write_after_ms: write_after.as_millis() as u64,
        rejoined_after_ms: rejoined_after.as_millis() as u64,
        set_aside_changes,
        checksums,
        copies_equal,
        load,
    })
}

/// The failover writers' keys `node` holds.
async fn load_keys(node: &hawser_client::Client) -> anyhow::Result<std::collections::HashSet<i64>> {
    let out = node
        .clone()
        .execute(&format!(
            "select k from {WORKLOAD_TABLE} where k >= {LOAD_BASE}"
        ))
        .await
        .context("read the writers' rows on the new master")?;
    if let Some(e) = out.error {
        anyhow::bail!("read the writers' rows on the new master: {}", e.message);
    }
    Ok(out
        .results
        .iter()
        .flat_map(|r| &r.rows)
        .filter_map(|row| match row.first() {
            Some(Value::Int(k)) => Some(*k),
            _ => None,
        })
        .collect())
}

/// Starts `name` again on its data and gRPC address. The kernel may have handed the
/// freed port to an outgoing connection meanwhile: tried again for a few seconds.
async fn start_again(
    name: &str,
    data: &std::path::Path,
    join: &[&str],
    listen: &str,
) -> anyhow::Result<ChildNode> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ChildNode::start_at(name, data, join, listen).await {
            Ok(node) => return Ok(node),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "starting {name} again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

impl FailoverReport {
    /// The FAILOVER section of the summary.
    pub(crate) fn render(&self) -> String {
        let mut out = format!(
            "\nFAILOVER — SIGKILL of {} (master of every element, Raft leader)\n{} took a \
             write {:.2} s after the kill, as the client library saw it\n{} rejoined as a \
             subscriber {:.2} s after it was started again; {} change(s) only it had set \
             aside into hawser_lost\n",
            self.killed,
            self.new_master,
            self.write_after_ms as f64 / 1000.0,
            self.killed,
            self.rejoined_after_ms as f64 / 1000.0,
            self.set_aside_changes,
        );
        let l = &self.load;
        out.push_str(&format!(
            "under load: {} writes acknowledged through the failover, {} with TWOSAFE's \
             promise: {} of those lost{}\n",
            l.acknowledged,
            l.promised,
            l.lost_promised,
            if l.lost_async > 0 {
                format!(", {} asynchronous ones set aside", l.lost_async)
            } else {
                String::new()
            }
        ));
        for (table, per_node) in &self.checksums {
            let cells: Vec<String> = per_node.iter().map(|(n, c)| format!("{n} {c}")).collect();
            out.push_str(&format!("  {table:<9} {}\n", cells.join(" | ")));
        }
        out.push_str(if self.copies_equal {
            "  every copy equal\n"
        } else {
            "  copies DIFFERENT\n"
        });
        out
    }
}
