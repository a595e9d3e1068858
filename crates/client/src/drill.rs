//! Failover drills (`hawser drill KIND`, `Admin.Drill`): a failover drill on a live cluster, with a verifying load, and a
//! report of what clients saw and whether every promise held.
//!
//! ```text
//!  leader's status ─► plan (pure): the element holding --table, its master, the Raft
//!      leader, a subscriber to switch to; every node healthy
//!  writers (ClusterClient, following the master) insert keys of this run, each answer
//!      recorded: sent, answered, acknowledged (origin, epoch, return service kept its
//!      promise?) / refused / unknown
//!  warm-up ─► the fault (Admin.Fault on the node meant, by node id: crash, restarting
//!      after --down; pause for --down) or the switchover and back
//!  ─► watch the statuses: a new master (higher epoch, another store), a new leader
//!  ─► load stops --after past the down time ─► the drilled node back and healthy, the
//!      scheme's receivers in START ─► every copy of the run's keys equal
//!  ─► history::check against the master's keys ─► report; exit 0 only if every
//!      promise held and the copies are equal
//! ```
//!
//! The load writes to a table of its own, which must be a TABLE element of the scheme
//! (`(k BIGINT PRIMARY KEY, v VARCHAR(…))`, `hawser_drill` by default), so that a drill
//! never touches application rows; its element fails over with the master's others.
//!
//! The engine is a client of the cluster, so it runs the same in the CLI and inside a
//! node serving `Admin.Drill`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hawser_core::Value;
use hawser_proto::v1;
use serde_json::{json, Value as Json};

use crate::cluster::ClusterClient;
use crate::history::{self, Op, Outcome, Verdict};
use crate::{sqlstate, Client, ClientError, RowOp};

/// Why a drill could not run or finish (a broken promise is not an error: it is in
/// the [`Report`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DrillError(pub String);

/// How a drill runs: the load, its timing and where it asks.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Any member of the cluster (switchovers are asked there).
    pub host: String,
    /// Concurrent writers of the load.
    pub writers: u32,
    /// How long the drilled node stays down (crash) or stopped (pause).
    pub down: Duration,
    /// Load before the fault.
    pub warmup: Duration,
    /// Load after the down time (and between a switchover and the move back).
    pub after: Duration,
    /// The longest the drill waits for the cluster to recover and the copies to agree.
    pub timeout: Duration,
}

impl Settings {
    /// `hawser drill`'s defaults, asking `host`.
    pub fn new(host: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            writers: 4,
            down: Duration::from_secs(3),
            warmup: Duration::from_secs(1),
            after: Duration::from_secs(2),
            timeout: Duration::from_secs(60),
        }
    }
}

/// The cluster status as the Raft leader sees it (node health is known only there),
/// asked through `host`.
pub async fn leader_status(host: &str) -> Result<v1::ClusterStatus, DrillError> {
    let ask = |addr: String| async move {
        let mut c = Client::connect(&addr)
            .await
            .map_err(|e| DrillError(e.text()))?;
        let status = c
            .status()
            .await
            .map_err(|e| DrillError(format!("read the cluster status at {addr}: {}", e.text())))?;
        status
            .cluster
            .ok_or_else(|| DrillError(format!("{addr} is not in a cluster")))
    };
    let cluster = ask(host.to_string()).await?;
    if cluster.role == "leader" || cluster.leader_addr.is_empty() {
        return Ok(cluster);
    }
    // The leader a member names may be the node a drill just crashed, not replaced yet.
    ask(cluster.leader_addr.clone()).await.map_err(|e| {
        DrillError(format!(
            "the Raft leader {host} names does not answer ({e}): a drill starts from a \
             healthy cluster; try again once it has a leader"
        ))
    })
}

/// What a drill does to the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
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

impl Kind {
    /// Every kind, in the order `--help` lists them.
    pub const ALL: [Kind; 6] = [
        Kind::KillMaster,
        Kind::PauseMaster,
        Kind::IsolateMaster,
        Kind::Switchover,
        Kind::KillLeader,
        Kind::Observe,
    ];

    /// The kind named `name` (`kill-master`, ...).
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(name.trim()))
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::KillMaster => "kill-master",
            Kind::PauseMaster => "pause-master",
            Kind::IsolateMaster => "isolate-master",
            Kind::Switchover => "switchover",
            Kind::KillLeader => "kill-leader",
            Kind::Observe => "observe",
        }
    }
}

/// A store and the node serving it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub store: String,
    pub node: u64,
    pub addr: String,
}

/// What a drill will do, from the cluster's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub kind: Kind,
    pub scheme: String,
    pub element: String,
    /// The table as the cluster names it.
    pub table: String,
    pub master: Member,
    pub leader: Member,
    /// The node the fault strikes (kill-master, pause-master, kill-leader).
    pub target: Option<Member>,
    /// Where a switchover drill moves the master role.
    pub switch_to: Option<Member>,
    /// Every store of the element (master first), whose copies must agree.
    pub copies: Vec<Member>,
    pub epoch: u64,
    /// Every node's gRPC address.
    pub addrs: Vec<String>,
}

fn same(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// A table name without its owner.
fn bare(t: &str) -> &str {
    t.rsplit('.').next().unwrap_or(t)
}

/// What drill `kind` of `table`'s element in `scheme` will do, as `cluster` (the Raft
/// leader's status) shows the cluster — or why it cannot run.
pub fn plan(
    cluster: &v1::ClusterStatus,
    kind: Kind,
    scheme: &str,
    table: &str,
) -> Result<Plan, String> {
    let Some(s) = cluster
        .schemes
        .iter()
        .find(|s| same(&s.name, scheme) || same(bare(&s.name), scheme))
    else {
        return Err(format!("no replication scheme {scheme}"));
    };
    let Some(e) = s.elements.iter().find(|e| {
        e.owner_role == "MASTER" && !e.table.is_empty() && same(bare(&e.table), bare(table))
    }) else {
        let master = s
            .elements
            .iter()
            .find(|e| e.owner_role == "MASTER")
            .map(|e| (e.master_store.clone(), e.subscribers.join(", ")))
            .unwrap_or_else(|| ("<master>".into(), "<subscriber>".into()));
        return Err(format!(
            "scheme {} has no TABLE element on {table} for the drill's load to write to. \
             Create the table on every node and add it to the scheme, for example: CREATE \
             TABLE {table} (k BIGINT PRIMARY KEY, v VARCHAR(64)); then ALTER REPLICATION {} \
             ADD ELEMENT drill TABLE {table} MASTER {} SUBSCRIBER {}",
            s.name, s.name, master.0, master.1
        ));
    };
    let node = |store: &str| cluster.nodes.iter().find(|n| same(&n.store, store));
    let member = |store: &str| -> Result<Member, String> {
        let n = node(store).ok_or_else(|| format!("store {store} has not joined the cluster"))?;
        Ok(Member {
            store: n.store.clone(),
            node: n.id,
            addr: n.grpc_addr.clone(),
        })
    };
    for n in &cluster.nodes {
        if n.membership != "none" && n.health != "ok" {
            return Err(format!(
                "node {} ({}) is {}: a drill starts from a healthy cluster",
                n.store, n.id, n.health
            ));
        }
    }
    if !s.receivers.is_empty() {
        return Err(format!(
            "receivers of scheme {} are not all started ({}): a drill starts from a \
             healthy cluster",
            s.name,
            s.receivers.join(", ")
        ));
    }
    let master = member(&e.master_store)?;
    let mut copies = vec![master.clone()];
    for sub in &e.subscribers {
        copies.push(member(sub)?);
    }
    let leader = cluster
        .nodes
        .iter()
        .find(|n| n.id == cluster.leader_id)
        .map(|n| Member {
            store: n.store.clone(),
            node: n.id,
            addr: n.grpc_addr.clone(),
        })
        .ok_or("no Raft leader is known")?;
    let (target, switch_to) = match kind {
        Kind::KillMaster | Kind::PauseMaster | Kind::IsolateMaster => (Some(master.clone()), None),
        Kind::KillLeader => (Some(leader.clone()), None),
        Kind::Observe => (None, None),
        Kind::Switchover => {
            let to = copies
                .get(1)
                .cloned()
                .ok_or_else(|| format!("element {} has no subscriber to switch to", e.name))?;
            (None, Some(to))
        }
    };
    let fails_over = matches!(
        kind,
        Kind::KillMaster | Kind::PauseMaster | Kind::IsolateMaster
    );
    if let Some(f) = cluster.failover.as_ref().filter(|f| f.paused) {
        if fails_over || kind == Kind::KillLeader {
            return Err(format!(
                "automatic failover is paused for the cluster ({}): the master would not \
                 be replaced. Resume it first (hawser failover resume)",
                if f.paused_reason.is_empty() {
                    "no reason given"
                } else {
                    &f.paused_reason
                }
            ));
        }
    }
    if fails_over && copies.len() < 2 {
        return Err(format!(
            "element {} has no subscriber: nothing could take the master role",
            e.name
        ));
    }
    Ok(Plan {
        kind,
        scheme: s.name.clone(),
        element: e.name.clone(),
        table: e.table.clone(),
        master,
        leader,
        target,
        switch_to,
        copies,
        epoch: e.epoch,
        addrs: cluster.nodes.iter().map(|n| n.grpc_addr.clone()).collect(),
    })
}

impl Plan {
    /// What the drill will do, in words (`--dry-run`, and the report's first line).
    pub fn describe(&self, down: Duration, after: Duration) -> String {
        let load = format!(
            "writes to {} (element {} of {}, master {} epoch {})",
            self.table, self.element, self.scheme, self.master.store, self.epoch
        );
        let what = match (self.kind, &self.target, &self.switch_to) {
            (Kind::Switchover, _, Some(to)) => format!(
                "switch the master role over to {}, then after {after:?} back to {}",
                to.store, self.master.store
            ),
            (Kind::PauseMaster, Some(t), _) => {
                format!("pause {} (node {}) for {down:?}", t.store, t.node)
            }
            (Kind::IsolateMaster, Some(t), _) => format!(
                "cut {} (node {}) off from every peer for {down:?}, clients still reaching it",
                t.store, t.node
            ),
            (_, Some(t), _) => format!(
                "crash {} (node {}{}) and start it again after {down:?}",
                t.store,
                t.node,
                if t.node == self.leader.node {
                    ", the Raft leader"
                } else {
                    ""
                }
            ),
            _ => format!(
                "strike nothing itself; load for {down:?} + {after:?} while an outside fault \
                 strikes, then check"
            ),
        };
        format!("{}: {load}; {what}", self.kind.name())
    }
}

/// Microseconds of wall clock: the run's keys start there, so two runs never share one.
fn run_base() -> i64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    secs as i64 * 1_000_000_000
}

/// Keys of writer w are base + w × WRITER_KEYS + i.
const WRITER_KEYS: i64 = 10_000_000;
const POLL: Duration = Duration::from_millis(50);

/// The element as one node's status shows it: its master, epoch, and the leader.
#[derive(Debug, Clone)]
struct View {
    master_store: String,
    master_addr: String,
    epoch: u64,
    leader: u64,
    receivers: Vec<String>,
    healthy: bool,
}

async fn view_at(addr: &str, plan: &Plan) -> Option<View> {
    let mut c = Client::connect_with_timeout(addr, Duration::from_millis(500))
        .await
        .ok()?;
    let cluster = c.status().await.ok()?.cluster?;
    let s = cluster
        .schemes
        .iter()
        .find(|s| same(&s.name, &plan.scheme))?;
    let e = s.elements.iter().find(|e| same(&e.name, &plan.element))?;
    Some(View {
        master_store: e.master_store.clone(),
        master_addr: e.master_addr.clone(),
        epoch: e.epoch,
        leader: cluster.leader_id,
        receivers: s.receivers.clone(),
        healthy: cluster.role == "leader"
            && cluster
                .nodes
                .iter()
                .all(|n| n.membership == "none" || n.health == "ok"),
    })
}

/// The newest view among the nodes that answer (highest epoch), and whether the Raft
/// leader, among them, says every node is healthy.
async fn newest(plan: &Plan) -> Option<View> {
    let mut best: Option<View> = None;
    let mut healthy = false;
    for a in &plan.addrs {
        let Some(v) = view_at(a, plan).await else {
            continue;
        };
        healthy |= v.healthy;
        if best.as_ref().is_none_or(|b| v.epoch > b.epoch) {
            best = Some(v);
        }
    }
    best.map(|mut v| {
        v.healthy = healthy;
        v
    })
}

/// The answer to one write, for the history.
fn outcome(r: &Result<crate::WriteOutcome, ClientError>) -> Outcome {
    match r {
        Ok(o) => Outcome::Acked {
            origin: o.origin,
            epoch: o.epoch,
            promised: o.return_outcome == "acknowledged",
        },
        Err(e) => {
            let refused = match e {
                ClientError::Connect { .. } => true,
                ClientError::Status(s) => {
                    matches!(sqlstate(s), Some(c) if c != "08007")
                        || matches!(crate::cluster::classify(e), crate::cluster::Retry::Later)
                }
                _ => false,
            };
            if refused {
                Outcome::Refused
            } else {
                Outcome::Unknown
            }
        }
    }
}

/// The verifying load: writers inserting this run's keys until `stop`.
struct Load {
    ops: Arc<Mutex<Vec<Op>>>,
    last_error: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    tasks: tokio::task::JoinSet<()>,
}

impl Load {
    async fn start(plan: &Plan, writers: u32, base: i64, t0: Instant) -> Result<Load, DrillError> {
        let ops = Arc::new(Mutex::new(Vec::new()));
        let last_error = Arc::new(Mutex::new(String::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..writers {
            let mut cc = ClusterClient::connect(&plan.addrs, Duration::from_secs(15))
                .await
                .map_err(|e| DrillError(format!("connect the load's clients: {}", e.text())))?;
            cc.retry_for = Duration::from_secs(30);
            let (ops, last_error, stop) = (ops.clone(), last_error.clone(), stop.clone());
            let table = plan.table.clone();
            tasks.spawn(async move {
                let ms = |at: Instant| at.duration_since(t0).as_millis() as u64;
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = base + i64::from(w) * WRITER_KEYS + i;
                    let op = RowOp::Insert {
                        table: table.clone(),
                        row: vec![Value::Int(key), Value::Text(format!("drill w{w}"))],
                    };
                    let sent = Instant::now();
                    let r = cc.write(vec![op]).await;
                    let done = Instant::now();
                    if let Err(e) = &r {
                        *last_error.lock().expect("not poisoned") = e.text();
                    }
                    ops.lock().expect("not poisoned").push(Op {
                        writer: w,
                        key,
                        sent_ms: ms(sent),
                        done_ms: ms(done),
                        outcome: outcome(&r),
                    });
                }
            });
        }
        Ok(Load {
            ops,
            last_error,
            stop,
            tasks,
        })
    }

    fn acked(&self) -> usize {
        self.ops
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Acked { .. }))
            .count()
    }

    async fn finish(mut self) -> Vec<Op> {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
        std::mem::take(&mut *self.ops.lock().expect("not poisoned"))
    }
}

/// The run's keys on `addr`.
async fn keys_at(
    addr: &str,
    table: &str,
    base: i64,
    writers: u32,
) -> Result<HashSet<i64>, ClientError> {
    let mut c = Client::connect_with_timeout(addr, Duration::from_secs(5)).await?;
    let mut keys = HashSet::new();
    let mut start = base;
    let end = [Value::Int(base + i64::from(writers) * WRITER_KEYS)];
    loop {
        let (rows, more) = c.scan(table, &[Value::Int(start)], &end, 10_000).await?;
        for r in &rows {
            if let Some(&Value::Int(k)) = r.first() {
                keys.insert(k);
                start = k + 1;
            }
        }
        if !more || rows.is_empty() {
            return Ok(keys);
        }
    }
}

/// Keys of `table` kept in `addr`'s lost table (set aside by a failover).
async fn set_aside_at(addr: &str, table: &str) -> HashSet<i64> {
    let Ok(mut c) = Client::connect_with_timeout(addr, Duration::from_secs(5)).await else {
        return HashSet::new();
    };
    let Ok(out) = c
        .execute("SELECT table_name, row_key FROM hawser_lost")
        .await
    else {
        return HashSet::new();
    };
    out.results
        .iter()
        .flat_map(|r| &r.rows)
        .filter_map(|row| match (row.first(), row.get(1)) {
            (Some(Value::Text(t)), Some(Value::Text(k))) if same(bare(t), bare(table)) => {
                k.trim().parse().ok()
            }
            _ => None,
        })
        .collect()
}

/// What one drill found.
pub struct Report {
    plan: Plan,
    fault: String,
    fault_ms: u64,
    new_master: Option<(String, u64, u64)>,
    new_leader_ms: Option<u64>,
    switch_ms: Vec<u64>,
    rejoined_ms: Option<u64>,
    copies: Result<(), String>,
    verdict: Verdict,
    set_aside: usize,
    final_master: String,
}

impl Report {
    /// The promises that broke, in words; empty when every one held.
    pub fn problems(&self) -> Vec<String> {
        let v = &self.verdict;
        let mut out = Vec::new();
        if !v.lost_promised.is_empty() {
            out.push(format!(
                "{} writes acknowledged by a return service are missing (first {:?})",
                v.lost_promised.len(),
                &v.lost_promised[..v.lost_promised.len().min(5)]
            ));
        }
        if !v.refused_present.is_empty() {
            out.push(format!(
                "{} writes refused as not committed were committed (first {:?})",
                v.refused_present.len(),
                &v.refused_present[..v.refused_present.len().min(5)]
            ));
        }
        if !v.overlaps.is_empty() {
            let o = &v.overlaps[0];
            out.push(format!(
                "two masters: {} writes acknowledged by an older master after a newer one \
                 had acknowledged (first: key {} by node {} epoch {}, sent at {} ms, after \
                 node {} epoch {} answered at {} ms)",
                v.overlaps.len(),
                o.key,
                o.origin,
                o.epoch,
                o.sent_ms,
                o.newer_origin,
                o.newer_epoch,
                o.newer_first_ms
            ));
        }
        if self.rejoined_ms.is_none() {
            out.push("the cluster did not become healthy again within --timeout".into());
        }
        if let Err(e) = &self.copies {
            out.push(format!("the copies differ: {e}"));
        }
        if v.acked == 0 {
            out.push("no write was acknowledged at all".into());
        }
        out
    }

    /// The report as `hawser drill --format json` prints it.
    pub fn json(&self) -> Json {
        let v = &self.verdict;
        let problems = self.problems();
        json!({
            "drill": self.plan.kind.name(),
            "scheme": self.plan.scheme,
            "element": self.plan.element,
            "table": self.plan.table,
            "master_before": {"store": self.plan.master.store, "node": self.plan.master.node, "epoch": self.plan.epoch},
            "target": self.plan.target.as_ref().map(|t| json!({"store": t.store, "node": t.node})),
            "fault": self.fault,
            "fault_at_ms": self.fault_ms,
            "new_master": self.new_master.as_ref().map(|(s, e, ms)| json!({"store": s, "epoch": e, "after_ms": ms})),
            "time_to_new_master_ms": self.new_master.as_ref().map(|m| m.2),
            "time_to_new_leader_ms": self.new_leader_ms,
            "switchover_ms": self.switch_ms,
            "write_window_ms": v.window_ms,
            "write_window_from_fault_ms": v.window_from_ms as i64 - self.fault_ms as i64,
            "writes": v.writes,
            "acknowledged": v.acked,
            "acknowledged_promised": v.promised,
            "refused": v.refused,
            "unknown": v.unknown,
            "lost_promised": v.lost_promised.len(),
            "lost_async": v.lost_async.len(),
            "lost_async_set_aside": self.set_aside,
            "refused_but_committed": v.refused_present.len(),
            "two_masters": v.overlaps.len(),
            "masters": v.masters.iter().map(|(o, e)| json!({"node": o, "epoch": e})).collect::<Vec<_>>(),
            "rejoined_ms": self.rejoined_ms,
            "copies_equal": self.copies.is_ok(),
            "final_master": self.final_master,
            "held": problems.is_empty(),
            "problems": problems,
        })
    }

    /// The report for a person, one finding a line.
    pub fn text(&self, down: Duration, after: Duration) -> String {
        let v = &self.verdict;
        let mut out = vec![
            self.plan.describe(down, after),
            format!("  fault          {} (at {} ms)", self.fault, self.fault_ms),
        ];
        match &self.new_master {
            _ if self.plan.kind == Kind::Switchover => {}
            Some((store, epoch, ms)) => out.push(format!(
                "  new master     {store} (epoch {epoch}) {ms} ms after the fault"
            )),
            None => out.push(format!(
                "  new master     none: {} kept the role",
                self.plan.master.store
            )),
        }
        if let Some(ms) = self.new_leader_ms {
            out.push(format!("  new leader     {ms} ms after the fault"));
        }
        if !self.switch_ms.is_empty() {
            let list: Vec<String> = self.switch_ms.iter().map(|m| format!("{m} ms")).collect();
            out.push(format!("  switchovers    {}", list.join(", then back ")));
        }
        out.push(format!(
            "  write window   {} ms without an acknowledged write (from {:+} ms of the fault)",
            v.window_ms,
            v.window_from_ms as i64 - self.fault_ms as i64
        ));
        out.push(format!(
            "  writes         {} sent: {} acknowledged ({} with a return service's \
             promise), {} refused, {} outcome unknown",
            v.writes, v.acked, v.promised, v.refused, v.unknown
        ));
        out.push(format!(
            "  lost           {} promised (must be 0), {} asynchronous ({} of them set \
             aside in hawser_lost)",
            v.lost_promised.len(),
            v.lost_async.len(),
            self.set_aside
        ));
        out.push(format!(
            "  two masters    {} (must be 0); masters seen: {}",
            v.overlaps.len(),
            v.masters
                .iter()
                .map(|(o, e)| format!("node {o} epoch {e}"))
                .collect::<Vec<_>>()
                .join(" → ")
        ));
        out.push(format!(
            "  recovery       {}; copies {}",
            self.rejoined_ms
                .map_or("not healthy within --timeout".to_string(), |ms| format!(
                    "healthy {ms} ms after the fault"
                )),
            match &self.copies {
                Ok(()) => "equal".to_string(),
                Err(e) => format!("differ: {e}"),
            }
        ));
        let problems = self.problems();
        if problems.is_empty() {
            out.push("every promise held".into());
        } else {
            out.extend(problems.into_iter().map(|p| format!("PROBLEM: {p}")));
        }
        out.join("\n") + "\n"
    }

    /// The report as `Admin.Drill`'s last event carries it.
    pub fn summary(&self, down: Duration, after: Duration) -> v1::DrillReport {
        let v = &self.verdict;
        let problems = self.problems();
        v1::DrillReport {
            kind: self.plan.kind.name().into(),
            scheme: self.plan.scheme.clone(),
            element: self.plan.element.clone(),
            table: self.plan.table.clone(),
            plan: self.plan.describe(down, after),
            dry_run: false,
            held: problems.is_empty(),
            problems,
            new_master: self.new_master.as_ref().map(|m| m.0.clone()),
            time_to_new_master_ms: self.new_master.as_ref().map(|m| m.2),
            time_to_new_leader_ms: self.new_leader_ms,
            switchover_ms: self.switch_ms.clone(),
            write_window_ms: v.window_ms,
            writes: v.writes as u64,
            acknowledged: v.acked as u64,
            acknowledged_promised: v.promised as u64,
            refused: v.refused as u64,
            unknown: v.unknown as u64,
            lost_promised: v.lost_promised.len() as u64,
            lost_async: v.lost_async.len() as u64,
            lost_async_set_aside: self.set_aside as u64,
            two_masters: v.overlaps.len() as u64,
            copies_equal: self.copies.is_ok(),
            rejoined_ms: self.rejoined_ms,
            json: self.json().to_string(),
            text: self.text(down, after),
        }
    }
}

/// Runs drill `plan` with `settings`, telling `progress` each step in a line.
pub async fn run(
    plan: Plan,
    settings: &Settings,
    progress: &(dyn Fn(String) + Send + Sync),
) -> Result<Report, DrillError> {
    let args = settings;
    let t0 = Instant::now();
    let ms = |at: Instant| at.duration_since(t0).as_millis() as u64;
    let base = run_base();
    progress(format!("load: {} writers to {}", args.writers, plan.table));
    let load = Load::start(&plan, args.writers, base, t0).await?;
    // Warm-up: at least its time, and a write acknowledged.
    let deadline = t0 + args.timeout;
    loop {
        tokio::time::sleep(POLL).await;
        if t0.elapsed() >= args.warmup && load.acked() > 0 {
            break;
        }
        if Instant::now() > deadline {
            let why = load.last_error.lock().expect("not poisoned").clone();
            load.finish().await;
            return Err(DrillError(format!(
                "no write of the load was acknowledged within {:?} ({why}); the table must \
                 be (k BIGINT PRIMARY KEY, v VARCHAR(64)) on every node",
                args.timeout
            )));
        }
    }
    progress(format!(
        "warm-up done: {} writes acknowledged",
        load.acked()
    ));
    // The fault.
    let fault_at = Instant::now();
    let mut switch_ms = Vec::new();
    let fault = match (&plan.target, &plan.switch_to) {
        (Some(t), _) => {
            let kind = match plan.kind {
                Kind::PauseMaster => "pause",
                Kind::IsolateMaster => "isolate",
                _ => "crash",
            };
            let mut c = Client::connect_with_timeout(&t.addr, Duration::from_secs(5))
                .await
                .map_err(|e| {
                    DrillError(format!(
                        "connect to {} at {}: {}",
                        t.store,
                        t.addr,
                        e.text()
                    ))
                })?;
            match c.fault(t.node, kind, args.down).await {
                Ok(m) => format!("{}: {m}", t.store),
                Err(e) => {
                    load.finish().await;
                    return Err(DrillError(format!(
                        "{} refused the fault: {}",
                        t.store,
                        e.text()
                    )));
                }
            }
        }
        (None, Some(to)) => {
            for (from, to) in [(&plan.master, to), (to, &plan.master)] {
                if !switch_ms.is_empty() {
                    tokio::time::sleep(args.after).await;
                }
                let mut c = Client::connect(&args.host)
                    .await
                    .map_err(|e| DrillError(e.text()))?;
                match c
                    .switchover(&plan.scheme, &to.store, Some(&from.store))
                    .await
                {
                    Ok(done) => switch_ms.push(done.millis),
                    Err(e) => {
                        load.finish().await;
                        return Err(DrillError(format!(
                            "switchover {} → {} refused: {}",
                            from.store,
                            to.store,
                            e.text()
                        )));
                    }
                }
            }
            format!("switched over to {} and back", to.store)
        }
        (None, None) => "none of the drill's own (observed an outside fault)".to_string(),
    };
    progress(format!("fault: {fault}"));
    // Watch: a new master, a new leader, until the load's end.
    let load_until = fault_at + args.down + args.after;
    let mut new_master = None;
    let mut new_leader_ms = None;
    while Instant::now() < load_until {
        if let Some(v) = newest(&plan).await {
            if new_master.is_none()
                && v.epoch > plan.epoch
                && !same(&v.master_store, &plan.master.store)
            {
                let after = ms(Instant::now()) - ms(fault_at);
                progress(format!(
                    "new master: {} (epoch {}) {after} ms after the fault",
                    v.master_store, v.epoch
                ));
                new_master = Some((v.master_store.clone(), v.epoch, after));
            }
            if new_leader_ms.is_none() && v.leader != 0 && v.leader != plan.leader.node {
                let after = ms(Instant::now()) - ms(fault_at);
                progress(format!(
                    "new Raft leader: node {} {after} ms after the fault",
                    v.leader
                ));
                new_leader_ms = Some(after);
            }
        }
        tokio::time::sleep(POLL).await;
    }
    let ops = load.finish().await;
    progress(format!(
        "load stopped: {} writes; waiting for the cluster to recover",
        ops.len()
    ));
    let end_ms = ms(Instant::now());
    // Recovery: the Raft leader says every node is healthy and the receivers started.
    let mut rejoined_ms = None;
    let mut last = None;
    while Instant::now() < fault_at + args.down + args.timeout {
        if let Some(v) = newest(&plan).await {
            if v.healthy && v.receivers.is_empty() && !v.master_addr.is_empty() {
                rejoined_ms = Some(ms(Instant::now()) - ms(fault_at));
                last = Some(v);
                break;
            }
            last = Some(v);
        }
        tokio::time::sleep(POLL).await;
    }
    match rejoined_ms {
        Some(at) => progress(format!(
            "healthy again {at} ms after the fault; comparing copies"
        )),
        None => progress("not healthy within the timeout; comparing copies".into()),
    }
    let final_view = last.ok_or_else(|| DrillError("no node answers any more".into()))?;
    // Every copy of the run's keys equal to the master's.
    let master_keys;
    let copies = {
        let deadline = Instant::now() + args.timeout;
        loop {
            let want = keys_at(&final_view.master_addr, &plan.table, base, args.writers)
                .await
                .map_err(|e| DrillError(format!("read the master's rows: {}", e.text())))?;
            let mut diffs = Vec::new();
            for m in &plan.copies {
                if m.addr == final_view.master_addr {
                    continue;
                }
                match keys_at(&m.addr, &plan.table, base, args.writers).await {
                    Ok(have) if have == want => {}
                    Ok(have) => diffs.push(format!(
                        "{} has {} of the run's rows, the master {}",
                        m.store,
                        have.len(),
                        want.len()
                    )),
                    Err(e) => diffs.push(format!("{}: {}", m.store, e.text())),
                }
            }
            if diffs.is_empty() {
                master_keys = want;
                break Ok(());
            }
            if Instant::now() > deadline {
                master_keys = want;
                break Err(diffs.join("; "));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let verdict = history::check(&ops, &master_keys, end_ms);
    let mut aside = HashSet::new();
    for a in &plan.addrs {
        aside.extend(set_aside_at(a, &plan.table).await);
    }
    let set_aside = verdict
        .lost_async
        .iter()
        .filter(|k| aside.contains(k))
        .count();
    Ok(Report {
        fault,
        fault_ms: ms(fault_at),
        new_master,
        new_leader_ms,
        switch_ms,
        rejoined_ms,
        copies,
        verdict,
        set_aside,
        final_master: final_view.master_store,
        plan,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> v1::ClusterStatus {
        let node = |id: u64, store: &str| v1::ClusterNode {
            id,
            store: store.into(),
            grpc_addr: format!("{store}:7420"),
            membership: "voter".into(),
            health: "ok".into(),
            ..Default::default()
        };
        v1::ClusterStatus {
            leader_id: 2,
            nodes: vec![node(1, "ds1"), node(2, "ds2"), node(3, "ds3")],
            schemes: vec![v1::SchemeStatus {
                name: "app.rep".into(),
                elements: vec![
                    v1::ElementStatus {
                        name: "e".into(),
                        kind: "TABLE".into(),
                        owner_role: "MASTER".into(),
                        master_store: "ds1".into(),
                        subscribers: vec!["ds2".into(), "ds3".into()],
                        table: "app.accounts".into(),
                        epoch: 4,
                        ..Default::default()
                    },
                    v1::ElementStatus {
                        name: "drill".into(),
                        kind: "TABLE".into(),
                        owner_role: "MASTER".into(),
                        master_store: "ds1".into(),
                        subscribers: vec!["ds2".into(), "ds3".into()],
                        table: "app.hawser_drill".into(),
                        epoch: 4,
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_drill_strikes_the_master_of_its_tables_element_or_the_leader() {
        let c = cluster();
        let p = plan(&c, Kind::KillMaster, "rep", "hawser_drill").unwrap();
        assert_eq!(p.element, "drill");
        assert_eq!(p.target.as_ref().unwrap().store, "ds1");
        assert_eq!(
            p.copies
                .iter()
                .map(|m| m.store.as_str())
                .collect::<Vec<_>>(),
            ["ds1", "ds2", "ds3"]
        );
        assert!(p
            .describe(Duration::from_secs(3), Duration::from_secs(2))
            .contains("crash ds1 (node 1)"));
        let p = plan(&c, Kind::KillLeader, "app.rep", "HAWSER_DRILL").unwrap();
        assert_eq!(p.target.as_ref().unwrap().store, "ds2");
        assert!(p
            .describe(Duration::from_secs(3), Duration::from_secs(2))
            .contains("the Raft leader"));
        let p = plan(&c, Kind::Switchover, "rep", "hawser_drill").unwrap();
        assert_eq!(p.switch_to.as_ref().unwrap().store, "ds2");
        assert!(p.target.is_none());
        // Observe strikes nothing: the copies are still every store of the element.
        let p = plan(&c, Kind::Observe, "rep", "hawser_drill").unwrap();
        assert!(p.target.is_none() && p.switch_to.is_none());
        assert_eq!(p.copies.len(), 3);
        assert!(p
            .describe(Duration::from_secs(3), Duration::from_secs(2))
            .contains("outside fault"));
    }

    #[test]
    fn a_drill_that_cannot_run_says_why() {
        let c = cluster();
        let why = |c: &v1::ClusterStatus, table: &str| {
            plan(c, Kind::KillMaster, "rep", table).unwrap_err()
        };
        assert!(why(&c, "t9").contains("ADD ELEMENT drill TABLE t9 MASTER ds1 SUBSCRIBER ds2, ds3"));
        assert!(plan(&c, Kind::KillMaster, "nope", "hawser_drill")
            .unwrap_err()
            .contains("no replication scheme nope"));
        let mut late = c.clone();
        late.nodes[2].health = "late".into();
        assert!(why(&late, "hawser_drill").contains("ds3 (3) is late"));
        let mut stopped = c.clone();
        stopped.schemes[0].receivers = vec!["ds3=STOP".into()];
        assert!(why(&stopped, "hawser_drill").contains("ds3=STOP"));
        let mut alone = c.clone();
        alone.schemes[0].elements[1].subscribers.clear();
        assert!(why(&alone, "hawser_drill").contains("no subscriber"));
        let mut paused = c.clone();
        paused.failover = Some(v1::FailoverStatus {
            paused: true,
            paused_reason: "upgrade".into(),
            ..Default::default()
        });
        assert!(why(&paused, "hawser_drill").contains("paused for the cluster (upgrade)"));
        // A planned move needs no automatic failover.
        assert!(plan(&paused, Kind::Switchover, "rep", "hawser_drill").is_ok());
    }
}
