//! `master-kill`: how long a client is without a master that takes its writes after the
//! master of a replicated table is SIGKILLed, and whether any acknowledged commit is lost.
//!
//! ```text
//!  setup:  n1, n2, n3 (three Raft voters); t on each; scheme r:
//!          MASTER n1, SUBSCRIBER n2 RETURN TWOSAFE, SUBSCRIBER n3
//!  trial:  --writers clients insert distinct keys on the master of e, each recording
//!          the keys it got acknowledged without a warning ──► --warmup acknowledged
//!          ──► SIGKILL the master (t0) ──► poll the survivors' status every 20 ms until
//!          a new store masters e under a higher epoch, and write to it: the first write
//!          it acknowledges without a warning ends the measurement
//!          ──► every acknowledged key must be on the new master
//!  rejoin: the killed node restarted on its data and addresses: deposed, it sets
//!          aside what it alone committed past the fork point (into hawser_lost) and
//!          starts its receiver again by itself ──► wait for three equal copies (the
//!          same keys on every node)
//! ```
//!
//! The roles move with every failover (the new master takes the old one's place in the
//! scheme, the old master the new one's subscriber slot), so each trial reads the
//! current master from the nodes' status. The time is as a client sees it: from just
//! before the SIGKILL to the first write acknowledged without a warning by the new
//! master, so it includes the failover timeout, the Raft commit of the new epoch, the
//! new master learning it, and the return service to the TWOSAFE subscriber; it is
//! precise to the poll interval plus a status round.
//!
//! ```sh
//! cargo build --release -p hawser-cli -p hawser-chaos
//! target/release/hawser-chaos master-kill --trials 20
//! ```

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use hawser_client::{Client, RowOp};
use hawser_core::Value;
use serde_json::{json, Value as Json};

use super::{wait_for, Proc};

/// The longest any one wait of the drill may take.
const WAIT: Duration = Duration::from_secs(60);
/// How often the client side looks for the new master (and other conditions).
const POLL: Duration = Duration::from_millis(20);
/// Keys of trial n are n × TRIAL_KEYS + writer × WRITER_KEYS + i: disjoint between
/// trials and writers, so a trial's keys can be read back by range. Probe writes (to
/// see a master take writes) use negative keys.
const TRIAL_KEYS: i64 = 1_000_000_000;
const WRITER_KEYS: i64 = 10_000_000;
/// Rows per page when a trial's keys are read back.
const PAGE: u32 = 10_000;
/// The scheme and element the drill creates.
const ELEMENT: &str = "e";
const DDL: &str = "CREATE REPLICATION r ELEMENT e TABLE t \
    MASTER n1 SUBSCRIBER n2 RETURN TWOSAFE SUBSCRIBER n3 \
    STORE n1 RETURN WAIT TIME 10";
const NAMES: [&str; 3] = ["n1", "n2", "n3"];

#[derive(clap::Args, Debug)]
pub struct MasterKillArgs {
    /// Number of master kills.
    #[arg(long, default_value_t = 20)]
    trials: u32,
    /// Concurrent writers on the master.
    #[arg(long, default_value_t = 4)]
    writers: u32,
    /// Writes acknowledged in a trial before the master is killed.
    #[arg(long, default_value_t = 200)]
    warmup: u64,
    /// The hawser binary [default: `hawser` next to this program].
    #[arg(long)]
    hawser: Option<PathBuf>,
    /// Raft heartbeat interval passed to every node.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    heartbeat: Duration,
    /// Raft election timeout, lower bound.
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    election_min: Duration,
    /// Raft election timeout, upper bound.
    #[arg(long, default_value = "600ms", value_parser = humantime::parse_duration)]
    election_max: Duration,
    /// How often every node reports to the Raft leader.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    report_interval: Duration,
    /// Master lease passed to every node.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    master_lease: Duration,
    /// Silence of a master after which the Raft leader fails it over.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    failover_timeout: Duration,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs the drill in a temporary directory, kept (with the nodes' logs) on failure.
pub async fn run(args: MasterKillArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.trials > 0, "--trials must be at least 1");
    ensure!(args.writers > 0, "--writers must be at least 1");
    ensure!(
        (args.writers as i64) < TRIAL_KEYS / WRITER_KEYS,
        "--writers must be below {}",
        TRIAL_KEYS / WRITER_KEYS
    );
    let bin = match &args.hawser {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("hawser"),
    };
    if !bin.exists() {
        bail!(
            "{} not found; build it (cargo build --release -p hawser-cli) or pass --hawser",
            bin.display()
        );
    }
    let tmp = tempfile::Builder::new()
        .prefix("hawser-master-kill-")
        .tempdir()?;
    let result = drill(&args, &bin, tmp.path()).await;
    if result.is_err() {
        // The nodes are dead by now (dropped with the drill); their logs tell the rest.
        eprintln!("node data and logs kept in {}", tmp.keep().display());
    }
    let samples = result?;
    report(&args, &samples)?;
    Ok(ExitCode::SUCCESS)
}

/// One trial's outcome.
struct Sample {
    trial: u32,
    old_master: String,
    was_raft_leader: bool,
    new_master: String,
    epoch: u64,
    failover_ms: u64,
    acked: usize,
    missing: usize,
    /// From the restart of the killed node to three equal copies.
    rejoin_ms: u64,
}

/// The element's placement as one node's status shows it.
#[derive(Debug, Clone)]
struct View {
    master_store: String,
    master_node: u64,
    epoch: u64,
    leader_id: u64,
    /// The scheme's receivers not in START, as "STORE=STATE".
    receivers: Vec<String>,
}

/// What `addr` says about element `e`, if it answers and knows the scheme.
async fn view(addr: &str) -> Option<View> {
    let mut c = Client::connect_with_timeout(addr, Duration::from_millis(500))
        .await
        .ok()?;
    let cluster = c.status().await.ok()?.cluster?;
    cluster.schemes.iter().find_map(|s| {
        let e = s
            .elements
            .iter()
            .find(|e| e.name.eq_ignore_ascii_case(ELEMENT))?;
        Some(View {
            master_store: e.master_store.clone(),
            master_node: e.master_node,
            epoch: e.epoch,
            leader_id: cluster.leader_id,
            receivers: s.receivers.clone(),
        })
    })
}

/// The newest view (highest epoch) among `addrs`, with a leader filled in from any of
/// them when the newest does not know one.
async fn newest_view(addrs: &[String]) -> Option<View> {
    let mut best: Option<View> = None;
    let mut leader = 0;
    for a in addrs {
        let Some(v) = view(a).await else { continue };
        if leader == 0 {
            leader = v.leader_id;
        }
        if best.as_ref().is_none_or(|b| v.epoch > b.epoch) {
            best = Some(v);
        }
    }
    best.map(|mut v| {
        if v.leader_id == 0 {
            v.leader_id = leader;
        }
        v
    })
}

/// The receiver state `store` has in `v` ("START" when not listed).
fn receiver_state(v: &View, store: &str) -> String {
    v.receivers
        .iter()
        .find_map(|r| {
            let (s, state) = r.split_once('=')?;
            s.eq_ignore_ascii_case(store)
                .then(|| state.to_ascii_uppercase())
        })
        .unwrap_or_else(|| "START".into())
}

struct Drill<'a> {
    args: &'a MasterKillArgs,
    bin: &'a Path,
    nodes: Vec<Proc>,
    /// Probe keys count down from -1.
    next_probe: i64,
    /// Every key acknowledged without a warning so far, to tell them from the others
    /// when copies differ.
    acked_all: HashSet<i64>,
}

impl Drill<'_> {
    /// Starts `name` on `addrs` (gRPC, HTTP; port 0 = any free port), its log appended
    /// to, and waits (at most 60 s) for its ready line. A restart on a fixed port is
    /// tried again for up to 30 s while the port is taken: while the node was down an
    /// outgoing connection may have got it from the ephemeral range.
    fn start(
        &self,
        name: &str,
        data: &Path,
        join: Option<&str>,
        addrs: (&str, &str),
    ) -> anyhow::Result<Proc> {
        let fmt = |d: Duration| format!("{}ms", d.as_millis());
        let a = self.args;
        let log_path = data.with_extension("log");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut cmd = crate::node_command(self.bin, name, data, addrs);
            cmd.args(["--raft-heartbeat", &fmt(a.heartbeat)])
                .args(["--raft-election-min", &fmt(a.election_min)])
                .args(["--raft-election-max", &fmt(a.election_max)])
                .args(["--report-interval", &fmt(a.report_interval)])
                .args(["--master-lease", &fmt(a.master_lease)])
                .args(["--failover-timeout", &fmt(a.failover_timeout)]);
            if let Some(j) = join {
                cmd.args(["--join", j]);
            }
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)?;
            let before = log.metadata()?.len();
            match Proc::spawn(cmd, name, data, log) {
                Ok(p) => return Ok(p),
                Err(e) => {
                    let fixed = !addrs.0.ends_with(":0") || !addrs.1.ends_with(":0");
                    let text = std::fs::read(&log_path).unwrap_or_default();
                    let new = String::from_utf8_lossy(text.get(before as usize..).unwrap_or(&[]));
                    if fixed && new.contains("Address already in use") && Instant::now() < deadline
                    {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    fn live_addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.grpc.clone())
            .collect()
    }

    /// The index of the node that `v` names master.
    fn index_of(&self, v: &View) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| v.master_node != 0 && n.node_id == v.master_node)
            .or_else(|| {
                self.nodes
                    .iter()
                    .position(|n| n.name.eq_ignore_ascii_case(&v.master_store))
            })
    }

    fn probe_key(&mut self) -> i64 {
        self.next_probe -= 1;
        self.next_probe
    }
}

async fn drill(args: &MasterKillArgs, bin: &Path, root: &Path) -> anyhow::Result<Vec<Sample>> {
    let mut d = Drill {
        args,
        bin,
        nodes: Vec::new(),
        next_probe: 0,
        acked_all: HashSet::new(),
    };
    setup(&mut d, root).await?;
    let mut samples = Vec::new();
    for trial in 1..=args.trials {
        let s = trial_once(&mut d, trial)
            .await
            .with_context(|| format!("trial {trial}"))?;
        eprintln!(
            "trial {trial:>2}/{}: master {}{} killed → {} (epoch {}) took a write after {} ms; \
             {} acknowledged, {} missing; rejoined in {} ms",
            args.trials,
            s.old_master,
            if s.was_raft_leader {
                " (Raft leader)"
            } else {
                ""
            },
            s.new_master,
            s.epoch,
            s.failover_ms,
            s.acked,
            s.missing,
            s.rejoin_ms
        );
        samples.push(s);
    }
    Ok(samples)
}

/// n1 (init), n2, n3 joined; `t` on each; the scheme; a master that takes writes.
async fn setup(d: &mut Drill<'_>, root: &Path) -> anyhow::Result<()> {
    const ANY: (&str, &str) = ("127.0.0.1:0", "127.0.0.1:0");
    let n1 = d.start(NAMES[0], &root.join(NAMES[0]), None, ANY)?;
    let seed = n1.grpc.clone();
    d.nodes.push(n1);
    Client::connect(&seed)
        .await?
        .init()
        .await
        .context("init the cluster")?;
    for name in &NAMES[1..] {
        let p = d.start(name, &root.join(name), Some(&seed), ANY)?;
        d.nodes.push(p);
    }
    let addrs = d.live_addrs();
    wait_for(WAIT, "three voters agreeing on a leader", || {
        let addrs = addrs.clone();
        async move {
            let mut leaders = Vec::new();
            for a in &addrs {
                let mut c = Client::connect_with_timeout(a, Duration::from_millis(500))
                    .await
                    .ok()?;
                let cl = c.status().await.ok()?.cluster?;
                let voters = cl.nodes.iter().filter(|n| n.membership == "voter").count();
                (voters == 3 && cl.leader_id != 0).then_some(())?;
                leaders.push(cl.leader_id);
            }
            leaders.windows(2).all(|w| w[0] == w[1]).then_some(())
        }
    })
    .await?;
    // Table DDL is not replicated: every node creates t itself.
    for n in &d.nodes {
        let mut c = Client::connect(&n.grpc).await?;
        sql(
            &mut c,
            "create table t (k bigint primary key, v varchar(40))",
        )
        .await
        .with_context(|| format!("create t on {}", n.name))?;
    }
    // Through n1, tried again while the control plane settles (a leader just elected
    // may not take proposals yet). A try whose answer was lost may have committed: the
    // scheme in a node's status counts as done.
    let deadline = Instant::now() + WAIT;
    loop {
        let tried = async {
            let mut c = Client::connect(&seed).await?;
            sql(&mut c, DDL).await
        }
        .await;
        let Err(e) = tried else { return Ok(()) };
        if newest_view(&d.live_addrs()).await.is_some() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("CREATE REPLICATION not accepted within {WAIT:?}: {e:#}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Runs `text` and fails on a statement error.
async fn sql(c: &mut Client, text: &str) -> anyhow::Result<()> {
    if let Some(e) = c.execute(text).await?.error {
        bail!("{text}: {}", e.message);
    }
    Ok(())
}

/// One insert of `k` into t on `addr`: Ok when acknowledged without a warning.
async fn insert(addr: &str, k: i64, timeout: Duration) -> Result<(), String> {
    let mut c = Client::connect_with_timeout(addr, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let op = RowOp::Insert {
        table: "t".into(),
        row: vec![Value::Int(k), Value::Text("probe".into())],
    };
    let out = c.write(vec![op]).await.map_err(|e| e.to_string())?;
    if !out.warnings.is_empty() {
        return Err(format!("acknowledged with warnings {:?}", out.warnings));
    }
    Ok(())
}

/// The current master of e (from the live nodes' newest view), once it takes a write
/// without a warning.
async fn ready_master(d: &mut Drill<'_>) -> anyhow::Result<(View, usize)> {
    let deadline = Instant::now() + WAIT;
    let mut last = String::from("no live node knows the scheme");
    loop {
        let addrs = d.live_addrs();
        if let Some(v) = newest_view(&addrs).await {
            match d.index_of(&v) {
                Some(i) if v.master_node != 0 && d.nodes[i].child.is_some() => {
                    let k = d.probe_key();
                    match insert(&d.nodes[i].grpc, k, Duration::from_secs(15)).await {
                        Ok(()) => return Ok((v, i)),
                        Err(e) => last = format!("{} refused a write: {e}", v.master_store),
                    }
                }
                _ => {
                    last = format!(
                        "master {} (node {}) is not up",
                        v.master_store, v.master_node
                    )
                }
            }
        }
        if Instant::now() > deadline {
            bail!("timed out after {WAIT:?} waiting for the master of {ELEMENT} to take writes ({last})");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn trial_once(d: &mut Drill<'_>, trial: u32) -> anyhow::Result<Sample> {
    let (old, victim) = ready_master(d).await?;
    let was_raft_leader = old.leader_id == old.master_node;
    let old_name = d.nodes[victim].name.clone();
    let master_addr = d.nodes[victim].grpc.clone();
    let base = trial as i64 * TRIAL_KEYS;

    // The load: each writer stops at its first error (or warning) and hands back the
    // keys acknowledged without one and why it stopped.
    let acked_count = Arc::new(AtomicU64::new(0));
    let stopped = Arc::new(AtomicU64::new(0));
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..d.args.writers {
        let (addr, acked_count, stopped) =
            (master_addr.clone(), acked_count.clone(), stopped.clone());
        writers.spawn(async move {
            let mut acked = Vec::new();
            let why = async {
                let mut c = Client::connect(&addr).await.map_err(|e| e.to_string())?;
                for i in 0.. {
                    let k = base + w as i64 * WRITER_KEYS + i;
                    let op = RowOp::Insert {
                        table: "t".into(),
                        row: vec![Value::Int(k), Value::Text(format!("w{w}"))],
                    };
                    let out = c.write(vec![op]).await.map_err(|e| e.to_string())?;
                    if !out.warnings.is_empty() {
                        return Err(format!("warned: {:?}", out.warnings));
                    }
                    acked.push(k);
                    acked_count.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), String>(())
            }
            .await
            .err()
            .unwrap_or_default();
            stopped.fetch_add(1, Ordering::Relaxed);
            (acked, why)
        });
    }
    let writers_n = u64::from(d.args.writers);
    let warm = {
        let (acked_count, stopped, warmup) = (acked_count.clone(), stopped.clone(), d.args.warmup);
        wait_for(WAIT, "the warm-up writes", || {
            let (a, s) = (
                acked_count.load(Ordering::Relaxed),
                stopped.load(Ordering::Relaxed),
            );
            async move {
                if a >= warmup {
                    Some(true)
                } else {
                    (s == writers_n).then_some(false)
                }
            }
        })
        .await?
    };
    if !warm {
        let mut why = Vec::new();
        while let Some(r) = writers.join_next().await {
            why.push(r.map(|(_, w)| w).unwrap_or_else(|e| e.to_string()));
        }
        bail!(
            "every writer stopped before {} writes were acknowledged on {old_name}: {why:?}",
            d.args.warmup
        );
    }

    // The fault: SIGKILL, no goodbye to anyone.
    let t0 = Instant::now();
    d.nodes[victim].kill9();

    // The client's side: look for a new master among the survivors and write to it.
    let survivors = d.live_addrs();
    let deadline = t0 + WAIT;
    let mut last = format!(
        "the survivors still name {} epoch {}",
        old.master_store, old.epoch
    );
    let (new, new_i) = loop {
        if let Some(v) = newest_view(&survivors).await {
            if v.epoch > old.epoch && !v.master_store.eq_ignore_ascii_case(&old.master_store) {
                match d.index_of(&v) {
                    Some(i) if d.nodes[i].child.is_some() => {
                        let k = d.probe_key();
                        match insert(&d.nodes[i].grpc, k, Duration::from_secs(15)).await {
                            Ok(()) => break (v, i),
                            Err(e) => {
                                last = format!(
                                    "{} (epoch {}) refused a write: {e}",
                                    v.master_store, v.epoch
                                )
                            }
                        }
                    }
                    _ => {
                        last = format!(
                            "the new master {} (node {}) is not a live node",
                            v.master_store, v.master_node
                        )
                    }
                }
            } else {
                last = format!("the survivors name {} epoch {}", v.master_store, v.epoch);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "no new master of {ELEMENT} acknowledged a write within {WAIT:?} of the SIGKILL of {old_name} ({last})"
            );
        }
        tokio::time::sleep(POLL).await;
    };
    let failover = t0.elapsed();
    let new_name = d.nodes[new_i].name.clone();

    // Every writer has seen its error by now (the master is dead); bounded all the same.
    let mut acked = Vec::new();
    let joined = tokio::time::timeout(WAIT, async {
        while let Some(r) = writers.join_next().await {
            let (keys, _) = r.context("a writer panicked")?;
            acked.extend(keys);
        }
        anyhow::Ok(())
    })
    .await;
    match joined {
        Ok(r) => r?,
        Err(_) => bail!("the writers did not stop within {WAIT:?} of the SIGKILL"),
    }

    // Zero loss: every key acknowledged without a warning is on the new master.
    let new_addr = d.nodes[new_i].grpc.clone();
    let range = (base, base + TRIAL_KEYS);
    let there = keys_in(&new_addr, range).await?;
    let missing: Vec<i64> = acked
        .iter()
        .copied()
        .filter(|k| !there.contains(k))
        .collect();
    if !missing.is_empty() {
        // Tell lost from late: wait (at most 5 s) for the missing keys to arrive.
        let deadline = Instant::now() + Duration::from_secs(5);
        let still = loop {
            let later = keys_in(&new_addr, range).await?;
            let still = missing.iter().filter(|k| !later.contains(k)).count();
            if still == 0 || Instant::now() >= deadline {
                break still;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        bail!(
            "{} of {} acknowledged keys were not on the new master {new_name} when it took \
             its first write ({} still missing 5 s later); first missing: {:?}",
            missing.len(),
            acked.len(),
            still,
            &missing[..missing.len().min(10)]
        );
    }

    d.acked_all.extend(acked.iter().copied());

    let rejoined = Instant::now();
    rejoin(d, victim, &new, &new_name)
        .await
        .with_context(|| format!("{old_name} rejoining under {new_name}"))?;
    Ok(Sample {
        trial,
        old_master: old_name,
        was_raft_leader,
        new_master: new_name,
        epoch: new.epoch,
        failover_ms: failover.as_millis() as u64,
        acked: acked.len(),
        missing: missing.len(),
        rejoin_ms: rejoined.elapsed().as_millis() as u64,
    })
}

/// The keys of t in `range` on `addr`.
async fn keys_in(addr: &str, range: (i64, i64)) -> anyhow::Result<HashSet<i64>> {
    let mut c = Client::connect(addr).await?;
    let mut keys = HashSet::new();
    let mut start = range.0;
    let end = [Value::Int(range.1)];
    loop {
        let (rows, more) = c.scan("t", &[Value::Int(start)], &end, PAGE).await?;
        for r in &rows {
            match r.first() {
                Some(&Value::Int(k)) => {
                    keys.insert(k);
                    start = k + 1;
                }
                other => bail!("unexpected key {other:?} in t on {addr}"),
            }
        }
        if !more || rows.is_empty() {
            return Ok(keys);
        }
    }
}

/// Key `k` with where it came from: which trial's writer wrote it and whether it was
/// acknowledged, or a probe.
fn describe(k: i64, acked: &HashSet<i64>) -> String {
    if k < 0 {
        return format!("{k} (probe)");
    }
    format!(
        "{k} (trial {} writer {} write {}, {})",
        k / TRIAL_KEYS,
        k % TRIAL_KEYS / WRITER_KEYS,
        k % WRITER_KEYS,
        if acked.contains(&k) {
            "acknowledged"
        } else {
            "not acknowledged"
        }
    )
}

/// Restarts the killed node `victim` on its data and addresses, sees it rejoin (its
/// receiver in START again, with nothing a command did), and waits for three equal
/// copies: the same keys on every node. A copy with keys the master does not have never
/// gets equal: the drill fails and names them.
async fn rejoin(
    d: &mut Drill<'_>,
    victim: usize,
    new: &View,
    new_name: &str,
) -> anyhow::Result<()> {
    let old = &d.nodes[victim];
    let (name, data) = (old.name.clone(), old.data.clone());
    let (grpc, http) = (old.grpc.clone(), old.http.clone());
    let join = d.live_addrs().join(",");
    // A mark in the log, which gets every incarnation of the node.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .open(data.with_extension("log"))
    {
        let _ = writeln!(
            f,
            "---- hawser-chaos: restarting {name} after a failover to {new_name} ----"
        );
    }
    let back = d.start(&name, &data, Some(&join), (&grpc, &http))?;
    d.nodes[victim] = back;

    // It learns from Raft that it is deposed, sets aside what it alone committed past
    // the fork point, and starts its receiver again by itself (the failover stopped it).
    let addr = grpc.clone();
    let (store, epoch) = (new.master_store.clone(), new.epoch);
    wait_for(WAIT, "the restarted node to see the new master", || {
        let (addr, store) = (addr.clone(), store.clone());
        async move {
            let v = view(&addr).await?;
            (v.leader_id != 0 && v.epoch >= epoch && v.master_store.eq_ignore_ascii_case(&store))
                .then_some(v)
        }
    })
    .await?;
    let addrs = d.live_addrs();
    wait_for(WAIT, "the deposed node's receiver in START again", || {
        let (addrs, name) = (addrs.clone(), name.clone());
        async move {
            let v = newest_view(&addrs).await?;
            (receiver_state(&v, &name) == "START").then_some(())
        }
    })
    .await?;

    // Three equal copies before the next kill: the same keys everywhere (a stronger
    // check than the row count).
    let master_addr = d
        .index_of(new)
        .map(|i| d.nodes[i].grpc.clone())
        .context("the new master is not one of the nodes")?;
    let deadline = Instant::now() + WAIT;
    loop {
        let want = keys_in(&master_addr, (i64::MIN, i64::MAX)).await?;
        let mut diffs = Vec::new();
        for n in d.nodes.iter().filter(|n| n.child.is_some()) {
            if n.grpc == master_addr {
                continue;
            }
            match keys_in(&n.grpc, (i64::MIN, i64::MAX)).await {
                Ok(have) if have == want => {}
                Ok(have) => {
                    let mut extra: Vec<i64> = have.difference(&want).copied().collect();
                    let mut missing: Vec<i64> = want.difference(&have).copied().collect();
                    extra.sort_unstable();
                    missing.sort_unstable();
                    let show = |keys: &[i64]| {
                        keys.iter()
                            .take(10)
                            .map(|&k| describe(k, &d.acked_all))
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    diffs.push(format!(
                        "{} has {} rows, {} not on the master [{}], {} of the master's missing [{}]",
                        n.name,
                        have.len(),
                        extra.len(),
                        show(&extra),
                        missing.len(),
                        show(&missing)
                    ));
                }
                Err(e) => diffs.push(format!("{}: {e:#}", n.name)),
            }
        }
        if diffs.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "timed out after {WAIT:?} waiting for three equal copies; the master {new_name} \
                 has {} rows; {}",
                want.len(),
                diffs.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// p50 / p99 / min / max / mean of `ms`, or nulls when there are none.
fn summary(ms: &[u64]) -> anyhow::Result<Json> {
    if ms.is_empty() {
        return Ok(
            json!({"count": 0, "p50": null, "p99": null, "min": null, "max": null, "mean": null}),
        );
    }
    let mut h = hdrhistogram::Histogram::<u64>::new(3)?;
    for &v in ms {
        h.record(v)?;
    }
    // Quantiles from the histogram; min, max and mean exact (the histogram rounds to
    // three significant digits, which would show one sample as two values).
    Ok(json!({
        "count": ms.len(),
        "p50": h.value_at_quantile(0.5),
        "p99": h.value_at_quantile(0.99),
        "min": ms.iter().min(),
        "max": ms.iter().max(),
        "mean": ms.iter().sum::<u64>() as f64 / ms.len() as f64,
    }))
}

fn report(args: &MasterKillArgs, samples: &[Sample]) -> anyhow::Result<()> {
    let ms = |f: &dyn Fn(&Sample) -> bool| -> Vec<u64> {
        samples
            .iter()
            .filter(|s| f(s))
            .map(|s| s.failover_ms)
            .collect()
    };
    let all = summary(&ms(&|_| true))?;
    let leader = summary(&ms(&|s| s.was_raft_leader))?;
    let not_leader = summary(&ms(&|s| !s.was_raft_leader))?;
    let ms_of = |d: Duration| d.as_millis() as u64;
    if args.json {
        let rows: Vec<Json> = samples
            .iter()
            .map(|s| {
                json!({
                    "trial": s.trial,
                    "old_master": s.old_master,
                    "old_master_was_raft_leader": s.was_raft_leader,
                    "new_master": s.new_master,
                    "epoch": s.epoch,
                    "failover_ms": s.failover_ms,
                    "acknowledged": s.acked,
                    "missing": s.missing,
                    "rejoin_ms": s.rejoin_ms,
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "drill": "master-kill",
                "trials": args.trials,
                "settings": {
                    "writers": args.writers,
                    "warmup": args.warmup,
                    "heartbeat_ms": ms_of(args.heartbeat),
                    "election_timeout_min_ms": ms_of(args.election_min),
                    "election_timeout_max_ms": ms_of(args.election_max),
                    "report_interval_ms": ms_of(args.report_interval),
                    "master_lease_ms": ms_of(args.master_lease),
                    "failover_timeout_ms": ms_of(args.failover_timeout),
                    "poll_ms": ms_of(POLL),
                },
                "ms": all,
                "master_was_raft_leader": leader,
                "master_not_raft_leader": not_leader,
                "samples": rows,
            })
        );
        return Ok(());
    }
    println!(
        "master-kill: {} trials, SIGKILL of the master of {ELEMENT} → first write acknowledged \
         without warning by the new master",
        args.trials
    );
    println!(
        "  settings  heartbeat {:?}, election timeout {:?}..{:?}, report interval {:?}, \
         master lease {:?}, failover timeout {:?}; {} writers, warm-up {}",
        args.heartbeat,
        args.election_min,
        args.election_max,
        args.report_interval,
        args.master_lease,
        args.failover_timeout,
        args.writers,
        args.warmup
    );
    println!(
        "  {:>5}  {:<10} {:<11} {:<10} {:>5} {:>11} {:>6} {:>7} {:>10}",
        "trial",
        "old master",
        "raft leader",
        "new master",
        "epoch",
        "failover ms",
        "acked",
        "missing",
        "rejoin ms"
    );
    for s in samples {
        println!(
            "  {:>5}  {:<10} {:<11} {:<10} {:>5} {:>11} {:>6} {:>7} {:>10}",
            s.trial,
            s.old_master,
            if s.was_raft_leader { "yes" } else { "no" },
            s.new_master,
            s.epoch,
            s.failover_ms,
            s.acked,
            s.missing,
            s.rejoin_ms
        );
    }
    let line = |what: &str, j: &Json| {
        if j["count"] == 0 {
            println!("  {what:<26} -");
        } else {
            println!(
                "  {what:<26} ms  p50 {}  p99 {}  min {}  max {}  mean {:.0}",
                j["p50"],
                j["p99"],
                j["min"],
                j["max"],
                j["mean"].as_f64().unwrap_or(0.0)
            );
        }
    };
    line(&format!("all ({})", all["count"]), &all);
    line(&format!("master was leader ({})", leader["count"]), &leader);
    line(
        &format!("master not leader ({})", not_leader["count"]),
        &not_leader,
    );
    println!("  acknowledged writes missing on the new master: 0 in every trial");
    Ok(())
}
