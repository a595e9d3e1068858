//! `hawser bench`: the load generator — single-row upserts of random keys from many
//! clients, reporting commit throughput and latency.
//!
//! Each client task has its own write stream — on its own connection, unless
//! `--connections` has the clients share fewer — and does one `Write` at a time, so the
//! number of commits in flight equals `--clients`; how far throughput grows with clients shows how
//! well the node groups commits into flushes. The run has three phases on one clock:
//!
//! ```text
//!   start ── warm-up ──► measure_from ── duration ──► end
//!            (commits       (latency recorded per client in an
//!             not counted)   hdrhistogram, merged at the end)
//! ```
//!
//! A commit counts in the measurement when it was sent after `measure_from`; writes still
//! in flight at `end` are abandoned, so the run never outlasts its duration.
//!
//! By default every client sends its next commit as soon as the last one returns (a closed
//! loop: the load is whatever the server sustains). With `--rate` the clients follow a
//! schedule instead, as pgbench's `--rate` does: each draws the gaps between its commits
//! from an exponential distribution (a Poisson process of `rate / clients` per second),
//! waits for each scheduled time (`crate::schedule`: a timerfd, not tokio's millisecond
//! timer), and counts a commit's latency from that time, not from when it was sent — a
//! commit held back because the one before it was slow is late by the whole wait (no
//! coordinated omission). The time between schedule and send is the schedule lag,
//! reported apart. Two systems measured at the same rate have the same load, so their
//! latencies compare directly.
//!
//! A histogram says how many commits were slow, not when. `--log FILE` keeps every
//! measured commit (when it was sent on the wall clock, its latency, its schedule lag,
//! its return-service outcome) and writes them after the run as CSV, as pgbench's
//! `--log` does, so that slow commits can be lined up with what the nodes did then.
//!
//! An error that carries no SQLSTATE may mean the server is gone: the client then tries a
//! fresh connection, and if that fails too the whole run stops and exits with status 1.
//!
//! With `--follow-master` (for failover drills) the clients write to the node that
//! masters the table, learned from the cluster status, and follow it: a write refused
//! where nothing was committed (`25006` not the master, `57P03` no master lease, a
//! connection refused) is sent again to the master the cluster then names, for up to
//! [`FOLLOW_FOR`]; its latency counts the whole wait, so the longest latencies show the
//! write pause a failover or switchover caused. A write whose outcome is unknown (the
//! connection lost mid-call) is an error, never sent twice.
//!
//! With `--mode`, the master's `/replication` view of the scheme's streams (through the
//! admin `Status` call) is sampled every 250 ms while measuring: replication lag at
//! steady load (mean and max of `lag_micros`, max `lag_records`) and the smoothed ack
//! round trip, per subscriber.
//!
//! On Linux the report also gives the CPU steal of the machine the bench runs on over
//! the measured time (`host_steal_pct`): on a shared virtual machine the hypervisor may
//! run other guests for a third of the time, and throughput falls with it — a run that
//! saw 5 % or more says so, so that its figures are not read as the system's.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hawser_client::cluster::{classify, Retry};
use hawser_client::{Client, ClientError, ClusterClient, RowOp, WriteOutcome, Writer};
use hawser_core::Value;
use hawser_proto::v1;
use hdrhistogram::Histogram;
use rand::distributions::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::output::{connect_error_text, error_text, Format};

/// Arguments of `hawser bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The node to load.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "HAWSER_HOST",
        default_value = "127.0.0.1:7420"
    )]
    pub host: String,
    /// Concurrent clients, each with its own write stream (the `WriteStream` RPC) and
    /// one commit in flight.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub clients: u32,
    /// How long to measure, after the warm-up (`10s`, `1m`, or plain seconds).
    #[arg(long, value_name = "SECS", default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Length of the random text written per row, in bytes.
    #[arg(long, value_name = "B", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub value_size: u32,
    /// Size of the key space: keys are drawn uniformly from [0, N).
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub keys: i64,
    /// Table to write, created as `(k BIGINT PRIMARY KEY, v VARCHAR(B))` if missing.
    #[arg(long, value_name = "NAME", default_value = "bench")]
    pub table: String,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Load applied before measuring starts, not counted.
    #[arg(long, value_name = "SECS", default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Replicate the bench table while measuring: create a scheme (replacing the one
    /// named by --scheme) whose subscribers get this return service. async: none;
    /// receipt: RETURN RECEIPT; twosafe: RETURN TWOSAFE. Needs --subscriber or
    /// --async-subscriber. The report adds, per subscriber, the stream's lag sampled
    /// on the master every 250 ms under load, its ack round trip, and how long the
    /// subscribers took to have everything after the load stopped.
    #[arg(long, value_enum, value_name = "MODE")]
    pub mode: Option<crate::wait_cmd::BenchMode>,
    /// A subscriber store that gets --mode's return service (repeat for several).
    #[arg(long = "subscriber", value_name = "STORE")]
    pub subscribers: Vec<String>,
    /// A subscriber store without a return service (repeat for several).
    #[arg(long = "async-subscriber", value_name = "STORE")]
    pub async_subscribers: Vec<String>,
    /// COMPRESS TRAFFIC ON for the master's streams in the scheme --mode creates.
    #[arg(long)]
    pub compress: bool,
    /// The subscribers' target table in the scheme --mode creates, as the scheme's `AS`
    /// clause says it, e.g. "CCD NONCONDENSED INTO bench_hist" or "POINT IN TIME INTO
    /// bench_pit" (docs/targets.md): the scheme then replicates the bench table as a
    /// TABLE element, and each subscriber creates the target table itself.
    #[arg(long, value_name = "TARGET")]
    pub target: Option<String>,
    /// Make the scheme --mode creates bidirectional: a second TABLE element masters the
    /// bench table on the first subscriber and sends it back to this master (the bench
    /// still writes here only). The table must exist on that subscriber too.
    #[arg(long)]
    pub bidirectional: bool,
    /// Check conflicts by row timestamp in the scheme --mode creates (`CHECK CONFLICTS
    /// BY ROW TIMESTAMP COLUMN ts`, UPDATE BY SYSTEM; docs/conflicts.md): the bench table
    /// has a third column `ts BINARY(8)`, which the stores stamp. With --bidirectional,
    /// its cost on the commit path of a two-master pair.
    #[arg(long)]
    pub check_conflicts: bool,
    /// The scheme --mode creates (an existing one of this name is dropped first).
    #[arg(long, value_name = "NAME", default_value = "bench_repl")]
    pub scheme: String,
    /// Before the load, measure how many write+fdatasync calls per second the disk under
    /// DIR sustains (the physical limit of one commit per flush), for comparison. Only
    /// meaningful when DIR is on the node's disk.
    #[arg(long, value_name = "DIR")]
    pub fsync_probe: Option<std::path::PathBuf>,
    /// Threads the load generator runs on. 0 (the default) picks one per 16 clients, at
    /// most one per CPU core: a thread drives many clients as an event loop, and on a
    /// small machine shared with the nodes every extra thread hands replies between
    /// threads, which costs the CPU being measured
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
    /// Commits per second, all clients together, on a schedule (Poisson arrivals, as
    /// pgbench --rate): latency counts from each commit's scheduled time, so two systems
    /// run at the same rate compare at the same load. Without it every client commits
    /// again as soon as its last commit returns.
    #[arg(long, value_name = "PER_SEC", value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Connections the clients share, HTTP/2 carrying one stream per client on each
    /// (as an application sharing one gRPC channel does): fewer sockets and system
    /// calls on both sides. 0 (the default) gives each client its own, as a
    /// PostgreSQL client has.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub connections: u32,
    /// Write one line per measured commit to FILE, as pgbench --log does, to see *when*
    /// the slow ones happened: CSV with a header — client, sent_unix_us (when it was
    /// sent, µs since the Unix epoch), latency_us (as the report counts it), lag_us
    /// (with --rate, how late it was sent after its scheduled time; else 0) and outcome
    /// (acknowledged, timed_out, disabled, none — no return service — or error), in
    /// the order they were sent. Lines are kept in memory (24 bytes each) and written
    /// after the run, so the file's writing does not load the machine being measured.
    #[arg(long, value_name = "FILE")]
    pub log: Option<std::path::PathBuf>,
    /// Write to the table's master, wherever the cluster says it is, and follow it
    /// through failovers and switchovers: a write refused before it committed (not the
    /// master, no master lease, connection refused) is sent again to the new master,
    /// for up to 30 s, its latency counting the wait; the report counts these retries.
    /// A write whose outcome is unknown (connection lost mid-call) counts as an error.
    #[arg(long)]
    pub follow_master: bool,
}

/// How long the fsync probe runs.
const FSYNC_PROBE_TIME: Duration = Duration::from_secs(3);

/// Writes 4 KiB and `fdatasync`s it in a loop in a temporary file under `dir` for
/// `time`; returns syncs per second.
fn fsync_probe(dir: &std::path::Path, time: Duration) -> anyhow::Result<f64> {
    use std::io::{Seek, SeekFrom};
    let mut file = tempfile::tempfile_in(dir)
        .with_context(|| format!("create a probe file in {}", dir.display()))?;
    let block = vec![0xA5u8; 4096];
    let start = Instant::now();
    let mut syncs = 0u64;
    while start.elapsed() < time {
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&block)?;
        file.sync_data().context("fdatasync the probe file")?;
        syncs += 1;
    }
    Ok(syncs as f64 / start.elapsed().as_secs_f64())
}

/// A duration as humantime writes it (`500ms`, `10s`, `1m 30s`) or plain seconds (`10`,
/// `2.5`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.trim().parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"));
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

/// A `--rate`: a finite number of commits per second above zero.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        Ok(_) => Err(format!(
            "{s:?} is not a rate: it must be above 0 commits per second"
        )),
        Err(_) => Err(format!("{s:?} is not a number of commits per second")),
    }
}

/// A gap of a Poisson schedule whose mean gap is `mean`: exponentially distributed.
fn poisson_gap(rng: &mut impl Rng, mean: Duration) -> Duration {
    // 1 - u is in (0, 1]: the logarithm is finite and at most 0.
    let u: f64 = rng.gen();
    mean.mul_f64(-(1.0 - u).ln())
}

/// How many commit errors each client remembers to report.
const ERRORS_KEPT_PER_CLIENT: usize = 3;
/// How many commit errors the report shows.
const ERRORS_REPORTED: usize = 5;
/// How long a client waits for a fresh connection before declaring the server gone.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// With `--follow-master`: how long a write keeps following the table's master, and
/// how long a client looks for a master it can reach before declaring the cluster gone.
const FOLLOW_FOR: Duration = Duration::from_secs(30);
/// With `--follow-master`: the pause between two looks for the master (about one
/// liveness report interval of the nodes).
const FOLLOW_PAUSE: Duration = Duration::from_millis(50);
/// Highest latency the histograms hold exactly (one hour, in µs); higher ones saturate.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// Runs `hawser bench`. Exit status 1 when the server cannot be reached or goes away
/// during the run, or when no commit succeeded.
impl BenchArgs {
    /// The load generator's thread count, `--threads` with 0 resolved.
    pub fn worker_threads(&self) -> usize {
        match self.threads {
            0 => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                auto_threads(self.clients, cores)
            }
            n => n,
        }
    }
}

/// One thread per [`CLIENTS_PER_THREAD`] clients, at least one, at most `cores`.
fn auto_threads(clients: u32, cores: usize) -> usize {
    (clients as usize)
        .div_ceil(CLIENTS_PER_THREAD)
        .clamp(1, cores.max(1))
}

/// Clients one load-generator thread drives when `--threads` is 0: a client costs its
/// thread a few tens of µs of CPU per commit, so one thread keeps 16 clients going well
/// past the rates one node commits.
const CLIENTS_PER_THREAD: usize = 16;

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if !is_plain_table_name(&args.table) {
        anyhow::bail!(
            "--table {:?} must be a plain name such as bench or owner.bench",
            args.table
        );
    }
    let value_size = args.value_size as usize;
    let mut admin = match Client::connect(&args.host).await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("error: {}", connect_error_text(&args.host, &e));
            return Ok(ExitCode::FAILURE);
        }
    };
    if let Err(problem) =
        prepare_table(&mut admin, &args.table, value_size, args.check_conflicts).await
    {
        eprintln!("error: {problem}");
        return Ok(ExitCode::FAILURE);
    }
    if let Some(mode) = args.mode {
        if args.subscribers.is_empty() && args.async_subscribers.is_empty() {
            eprintln!(
                "error: --mode {} needs subscribers: --subscriber STORE (with the return \
                 service) and/or --async-subscriber STORE",
                mode.name()
            );
            return Ok(ExitCode::FAILURE);
        }
        let master = admin.status().await.context("status of the master")?.name;
        let scheme = crate::wait_cmd::BenchScheme {
            name: &args.scheme,
            master: &master,
            table: &args.table,
            mode,
            subscribers: &args.subscribers,
            async_subscribers: &args.async_subscribers,
            compress: args.compress,
            target: args.target.as_deref(),
            bidirectional: args.bidirectional,
            check_conflicts: args.check_conflicts,
        };
        if let Err(e) = scheme.install(&mut admin).await {
            eprintln!(
                "error: cannot set up replication for --mode {}: {e:#}",
                mode.name()
            );
            return Ok(ExitCode::FAILURE);
        }
        eprintln!("replicating: {}", scheme.ddl());
    }
    let fsyncs_per_sec = match &args.fsync_probe {
        Some(dir) => {
            let dir = dir.clone();
            Some(tokio::task::spawn_blocking(move || fsync_probe(&dir, FSYNC_PROBE_TIME)).await??)
        }
        None => None,
    };
    let before = admin.status().await.context("status before the run")?;
    // The subscribers of the bench scheme, for their CPU time: the master's cluster
    // status knows their addresses.
    let mut nodes = vec![NodeCpu::new(before.name.clone(), None, before.cpu_micros)];
    if args.mode.is_some() {
        for store in args.subscribers.iter().chain(&args.async_subscribers) {
            nodes.push(NodeCpu::connect(store, &before).await);
        }
    }
    // The log file is created before the load, so that a bad path fails at once.
    let log_file = match &args.log {
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Some(std::io::BufWriter::new(f)),
            Err(e) => {
                eprintln!(
                    "error: cannot create the --log file {}: {e}",
                    path.display()
                );
                return Ok(ExitCode::FAILURE);
            }
        },
        None => None,
    };
    // Connections are opened before the clock starts, so their setup is not measured.
    let connections = match args.connections {
        0 => args.clients,
        n => n.min(args.clients),
    };
    // With --follow-master the clients go to the table's master, wherever it is.
    let follow = match args.follow_master {
        true => {
            let cluster = ClusterClient::connect(std::slice::from_ref(&args.host), PROBE_TIMEOUT)
                .await
                .with_context(|| format!("cannot learn the cluster from {}", args.host))?;
            Some(Arc::new(Follow {
                cluster: tokio::sync::Mutex::new(cluster),
                current: std::sync::Mutex::new(String::new()),
            }))
        }
        false => None,
    };
    let target = follow
        .as_ref()
        .and_then(|f| {
            let cluster = f.cluster.try_lock().ok()?;
            cluster.master_of(&args.table).map(String::from)
        })
        .unwrap_or_else(|| args.host.clone());
    if let Some(follow) = &follow {
        eprintln!("writing to {target}, the master of {}", args.table);
        follow
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone_from(&target);
    }
    let mut opened = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        let client = Client::connect(&target)
            .await
            .with_context(|| format!("cannot open client connections to {target}"))?;
        opened.push(client);
    }
    let clients: Vec<Client> = (0..args.clients as usize)
        .map(|i| opened[i % opened.len()].clone())
        .collect();

    let start = Instant::now();
    let workload = Arc::new(Workload {
        host: args.host.clone(),
        table: args.table.clone(),
        keys: args.keys,
        value_size,
        stamped: args.check_conflicts,
        start,
        measure_from: start + args.warmup,
        end: start + args.warmup + args.duration,
        // Each client's share of the rate: the mean gap between its commits.
        mean_gap: args
            .rate
            .map(|rate| Duration::from_secs_f64(f64::from(args.clients) / rate)),
        log: log_file.is_some(),
        follow,
    });
    let start_unix_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let progress = Arc::new(Progress::default());
    let cancel = CancellationToken::new();
    let mut tasks = JoinSet::new();
    for client in clients {
        tasks.spawn(client_loop(
            client,
            workload.clone(),
            progress.clone(),
            cancel.clone(),
        ));
    }

    let show_progress = std::io::stderr().is_terminal();
    let mut ticker =
        tokio::time::interval_at(start + Duration::from_secs(1), Duration::from_secs(1));
    let mut last_tick = (start, 0u64);
    let mut runs = Vec::with_capacity(args.clients as usize);
    // With --mode, the master's view of its streams is sampled while the load is
    // measured: replication lag at steady load, as the issue of a return service asks.
    let mut streams = StreamSamples::default();
    let mut sampler = tokio::time::interval_at(workload.measure_from, STREAM_SAMPLE_EVERY);
    // The host's CPU steal over the measured time (see `HostSteal`).
    let steal_from = tokio::time::sleep_until(workload.measure_from);
    tokio::pin!(steal_from);
    let mut steal_at_start: Option<Option<CpuTicks>> = None;
    loop {
        tokio::select! {
            _ = &mut steal_from, if steal_at_start.is_none() => {
                steal_at_start = Some(CpuTicks::read());
            }
            joined = tasks.join_next() => match joined {
                None => break,
                Some(joined) => {
                    let run = joined.context("a bench client task failed")?;
                    if run.fatal.is_some() {
                        // The server is gone: stop the others instead of letting each
                        // find out on its own.
                        cancel.cancel();
                    }
                    runs.push(run);
                }
            },
            _ = sampler.tick(), if args.mode.is_some() && now_before(workload.end) => {
                if let Ok(s) = admin.status().await {
                    streams.add(s.replication.as_ref(), &args.scheme, now_before(workload.end));
                }
            }
            now = ticker.tick(), if show_progress => {
                let commits = progress.commits.load(Ordering::Relaxed);
                let rate = (commits - last_tick.1) as f64
                    / now.duration_since(last_tick.0).as_secs_f64().max(1e-3);
                last_tick = (now, commits);
                let phase = if now < workload.measure_from { "warm-up" } else { "measuring" };
                let target = args
                    .rate
                    .map_or(String::new(), |r| format!(" of {r:.0} scheduled"));
                eprint!(
                    "\r\x1b[2K{phase} {:>5.1}s  commits {commits}  {rate:.0}/s{target}  errors {}",
                    now.duration_since(start).as_secs_f64(),
                    progress.errors.load(Ordering::Relaxed),
                );
            }
        }
    }
    if show_progress {
        eprint!("\r\x1b[2K");
    }
    let finished = Instant::now().min(workload.end);
    let measured = finished.saturating_duration_since(workload.measure_from);
    let mut report = Report::merge(args.clients, measured, &runs)?;
    report.connections = connections;
    report.retries = workload
        .follow
        .as_ref()
        .map(|_| runs.iter().map(|r| r.retries).sum());
    report.rate = args.rate;
    report.steal_pct = steal_at_start
        .flatten()
        .zip(CpuTicks::read())
        .and_then(|(a, b)| a.steal_pct_until(&b));
    report.fsyncs_per_sec = fsyncs_per_sec;
    report.mode = args.mode.map(|m| m.name());
    report.streams = streams;
    if args.mode.is_some() {
        // How long the subscribers take to have everything once the load stops: an
        // upper bound of the replication lag at the end of the run.
        let drained = Instant::now();
        match crate::wait_cmd::subscriber_wait(&mut admin, Some(&args.scheme), None, 20).await {
            Ok(true) => report.catch_up = Some(drained.elapsed()),
            Ok(false) => eprintln!("warning: the subscribers did not catch up within 20 s"),
            Err(e) => eprintln!("warning: cannot measure the catch-up after the run: {e:#}"),
        }
    }
    if let Ok(after) = admin.status().await {
        let commits = after.commits.saturating_sub(before.commits);
        let flushes = after.flushes.saturating_sub(before.flushes);
        report.server = Some((commits, flushes));
        nodes[0].after = Some(after.cpu_micros);
        for node in &mut nodes[1..] {
            node.read_after().await;
        }
        report.server_cpu = nodes
            .iter()
            .filter_map(|n| Some((n.store.clone(), n.micros_per(commits)?)))
            .collect();
    }

    if let (Some(mut file), Some(path)) = (log_file, &args.log) {
        let lines = write_log(&mut file, start_unix_us, &runs)
            .with_context(|| format!("write the --log file {}", path.display()))?;
        report.log = Some((path.display().to_string(), lines));
    }
    let mut out = std::io::stdout();
    match args.format {
        Format::Json => writeln!(out, "{}", report.json())?,
        Format::Table => write!(out, "{}", report.text(&args.table, value_size, args.keys))?,
    }
    out.flush()?;
    for e in &report.first_errors {
        eprintln!("commit error: {e}");
    }
    if let Some(fatal) = runs.iter().find_map(|r| r.fatal.as_deref()) {
        eprintln!(
            "error: the server at {} stopped answering: {fatal}",
            args.host
        );
        return Ok(ExitCode::FAILURE);
    }
    if report.commits == 0 && report.errors > 0 {
        eprintln!("error: every commit failed");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `name` is `table` or `owner.table` with plain identifiers, so that it can be
/// spliced into the CREATE TABLE statement as is.
fn is_plain_table_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            let mut chars = p.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        })
}

/// Creates the bench table if it does not exist, or checks that the one there fits;
/// `stamped`: with the `ts BINARY(8)` column of --check-conflicts.
async fn prepare_table(
    client: &mut Client,
    table: &str,
    value_size: usize,
    stamped: bool,
) -> Result<(), String> {
    match client.describe(table).await {
        Ok(described) => check_table(&described, value_size, stamped),
        Err(ClientError::Status(s)) if hawser_client::sqlstate(&s) == Some("42P01") => {
            let sql = format!(
                "CREATE TABLE {table} (k BIGINT PRIMARY KEY, v VARCHAR({value_size}){})",
                if stamped { ", ts BINARY(8)" } else { "" }
            );
            let outcome = client
                .execute(&sql)
                .await
                .map_err(|e| format!("cannot create table {table}: {}", error_text(&e)))?;
            match outcome.error {
                Some(e) => Err(format!(
                    "cannot create table {table}: error[{}]: {}",
                    e.code, e.message
                )),
                None => Ok(()),
            }
        }
        Err(e) => Err(format!("cannot describe table {table}: {}", error_text(&e))),
    }
}

/// Checks that an existing table has the shape the workload writes:
/// `(k <integer> PRIMARY KEY, v CHAR/VARCHAR(n ≥ value_size))`, and `ts BINARY(8)` when
/// `stamped`.
fn check_table(d: &v1::DescribeResponse, value_size: usize, stamped: bool) -> Result<(), String> {
    let shape = if stamped {
        "it needs (k BIGINT PRIMARY KEY, v VARCHAR(n), ts BINARY(8)); drop it or pick another --table"
    } else {
        "it needs (k BIGINT PRIMARY KEY, v VARCHAR(n)); drop it or pick another --table"
    };
    let (k, v) = match d.columns.as_slice() {
        [k, v] if !stamped => (k, v),
        [k, v, ts]
            if stamped && ts.name.eq_ignore_ascii_case("ts") && ts.data_type == "BINARY(8)" =>
        {
            (k, v)
        }
        _ => {
            return Err(format!(
                "table {} has {} columns: {shape}",
                d.table,
                d.columns.len()
            ))
        }
    };
    let int_type = ["TINYINT", "SMALLINT", "INTEGER", "BIGINT"].contains(&k.data_type.as_str());
    if !k.name.eq_ignore_ascii_case("k") || !int_type || d.primary_key != ["k"] {
        return Err(format!(
            "table {} does not have k as an integer key: {shape}",
            d.table
        ));
    }
    let width = v
        .data_type
        .strip_prefix("VARCHAR(")
        .or_else(|| v.data_type.strip_prefix("CHAR("))
        .and_then(|rest| rest.strip_suffix(')'))
        .and_then(|n| n.parse::<usize>().ok());
    match width {
        Some(n) if v.name.eq_ignore_ascii_case("v") && n >= value_size => Ok(()),
        Some(n) if v.name.eq_ignore_ascii_case("v") => Err(format!(
            "column v of table {} holds {n} characters, less than --value-size {value_size}",
            d.table
        )),
        _ => Err(format!("table {} has no text column v: {shape}", d.table)),
    }
}

/// What every client does, and when.
struct Workload {
    host: String,
    table: String,
    keys: i64,
    value_size: usize,
    /// Rows carry a third column, the row timestamp the store sets (--check-conflicts).
    stamped: bool,
    start: Instant,
    measure_from: Instant,
    end: Instant,
    /// With `--rate`: the mean gap between one client's scheduled commits.
    mean_gap: Option<Duration>,
    /// With `--log`: every measured commit is kept as a [`LogLine`].
    log: bool,
    /// With `--follow-master`: where the table's master is.
    follow: Option<Arc<Follow>>,
}

/// What `--follow-master` clients share: the cluster's view of who masters what.
struct Follow {
    cluster: tokio::sync::Mutex<ClusterClient>,
    /// The master the clients last went to, to say once when it moves.
    current: std::sync::Mutex<String>,
}

impl Follow {
    /// A connection to the master of `table` as the cluster names it now, looking again
    /// every [`FOLLOW_PAUSE`] until `until`; the last error if none could be had.
    async fn master(&self, table: &str, until: Instant) -> Result<Client, ClientError> {
        loop {
            let addr = {
                let mut cluster = self.cluster.lock().await;
                let learned = cluster.refresh().await;
                match (cluster.master_of(table), learned) {
                    (Some(addr), _) => Ok(addr.to_string()),
                    (None, Err(e)) => Err(e),
                    (None, Ok(())) => Err(ClientError::Status(tonic::Status::unavailable(
                        format!("the cluster names no master of {table}"),
                    ))),
                }
            };
            let err = match addr {
                Ok(addr) => match Client::connect_with_timeout(&addr, PROBE_TIMEOUT).await {
                    Ok(client) => {
                        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
                        if *current != addr {
                            eprintln!("following the master of {table} to {addr}");
                            *current = addr;
                        }
                        return Ok(client);
                    }
                    Err(e) => e,
                },
                Err(e) => e,
            };
            if Instant::now() + FOLLOW_PAUSE >= until {
                return Err(err);
            }
            tokio::time::sleep(FOLLOW_PAUSE).await;
        }
    }
}

/// Live totals over all clients and phases, for the progress line.
#[derive(Default)]
struct Progress {
    commits: AtomicU64,
    errors: AtomicU64,
}

/// What one client measured.
struct ClientRun {
    latency_us: Histogram<u64>,
    /// With `--rate`: how late each measured commit was sent after its scheduled time.
    schedule_lag_us: Histogram<u64>,
    commits: u64,
    errors: u64,
    /// With `--follow-master`: writes sent again after a refusal that proved nothing
    /// was committed (warm-up included).
    retries: u64,
    not_durable: u64,
    /// Measured commits by return-service outcome.
    returns: ReturnCounts,
    first_errors: Vec<String>,
    /// Why the client concluded the server is gone, if it did.
    fatal: Option<String>,
    /// With `--log`: every measured commit, in the order sent.
    log: Vec<LogLine>,
}

/// One measured commit as `--log` writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LogLine {
    /// When it was sent, in µs since the run's start.
    sent_us: u64,
    latency_us: u64,
    /// How late it was sent after its scheduled time (0 without `--rate`).
    lag_us: u64,
    outcome: LogOutcome,
}

/// How a logged commit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogOutcome {
    Acknowledged,
    TimedOut,
    Disabled,
    NoReturn,
    Error,
}

impl LogOutcome {
    fn of(return_outcome: &str) -> Self {
        match return_outcome {
            "acknowledged" => LogOutcome::Acknowledged,
            "timed_out" => LogOutcome::TimedOut,
            "disabled" => LogOutcome::Disabled,
            _ => LogOutcome::NoReturn,
        }
    }

    fn name(self) -> &'static str {
        match self {
            LogOutcome::Acknowledged => "acknowledged",
            LogOutcome::TimedOut => "timed_out",
            LogOutcome::Disabled => "disabled",
            LogOutcome::NoReturn => "none",
            LogOutcome::Error => "error",
        }
    }
}

/// Writes the `--log` file: a header, then every client's lines merged in the order
/// sent (ties by client). `start_unix_us` is the run's start on the wall clock.
fn write_log(out: &mut impl Write, start_unix_us: u64, runs: &[ClientRun]) -> std::io::Result<u64> {
    let mut lines: Vec<(u64, usize, &LogLine)> = runs
        .iter()
        .enumerate()
        .flat_map(|(client, run)| run.log.iter().map(move |l| (l.sent_us, client, l)))
        .collect();
    lines.sort_unstable_by_key(|&(sent, client, _)| (sent, client));
    writeln!(out, "client,sent_unix_us,latency_us,lag_us,outcome")?;
    for (_, client, l) in &lines {
        writeln!(
            out,
            "{client},{},{},{},{}",
            start_unix_us + l.sent_us,
            l.latency_us,
            l.lag_us,
            l.outcome.name()
        )?;
    }
    out.flush()?;
    Ok(lines.len() as u64)
}

/// Commits by how their return service ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ReturnCounts {
    acknowledged: u64,
    timed_out: u64,
    disabled: u64,
    none: u64,
}

impl ReturnCounts {
    fn count(&mut self, outcome: &str) {
        match outcome {
            "acknowledged" => self.acknowledged += 1,
            "timed_out" => self.timed_out += 1,
            "disabled" => self.disabled += 1,
            _ => self.none += 1,
        }
    }

    fn add(&mut self, other: &ReturnCounts) {
        self.acknowledged += other.acknowledged;
        self.timed_out += other.timed_out;
        self.disabled += other.disabled;
        self.none += other.none;
    }
}

fn new_histogram() -> Histogram<u64> {
    // Both bounds are constants within hdrhistogram's limits (low ≥ 1, high ≥ 2·low,
    // sigfig ≤ 5), so creation cannot fail.
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// One client: upsert a random key, wait for the commit, record, repeat until `end`.
async fn client_loop(
    mut client: Client,
    work: Arc<Workload>,
    progress: Arc<Progress>,
    cancel: CancellationToken,
) -> ClientRun {
    let mut rng = StdRng::from_entropy();
    let mut writer: Option<Writer> = None;
    let mut run = ClientRun {
        latency_us: new_histogram(),
        schedule_lag_us: new_histogram(),
        commits: 0,
        errors: 0,
        retries: 0,
        not_durable: 0,
        returns: ReturnCounts::default(),
        first_errors: Vec::new(),
        fatal: None,
        log: Vec::new(),
    };
    // With --rate: when this client's next commit is due, and what waits for it.
    let mut scheduled = work.start;
    let mut sleeper = work.mean_gap.map(|_| crate::schedule::Sleeper::new());
    loop {
        let key = rng.gen_range(0..work.keys);
        let value: String = (&mut rng)
            .sample_iter(&Alphanumeric)
            .take(work.value_size)
            .map(char::from)
            .collect();
        let mut row = vec![Value::Int(key), Value::Text(value)];
        if work.stamped {
            row.push(Value::Null);
        }
        let op = RowOp::Upsert {
            table: work.table.clone(),
            row,
        };
        // The time a commit's latency counts from: when it is sent, or its place in the
        // schedule. Whether it is measured goes by when it is sent: a server that cannot
        // keep up leaves the schedule behind the clock, and its late commits count.
        let (since, sent) = match (work.mean_gap, &mut sleeper) {
            (Some(mean), Some(sleeper)) => {
                scheduled += poisson_gap(&mut rng, mean);
                if scheduled >= work.end {
                    break;
                }
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    () = sleeper.until(scheduled) => {}
                }
                let sent = Instant::now();
                if sent >= work.measure_from {
                    let late = sent.saturating_duration_since(scheduled).as_micros();
                    run.schedule_lag_us
                        .saturating_record(u64::try_from(late).unwrap_or(u64::MAX));
                }
                (scheduled, sent)
            }
            _ => {
                let now = Instant::now();
                (now, now)
            }
        };
        // Each client commits over one write stream (what a continuously writing
        // application uses), opened again after an error closed it. With
        // --follow-master, a write the error proves was not committed goes again to the
        // master the cluster names then.
        let retries = &mut run.retries;
        let commit = async {
            let until = Instant::now() + FOLLOW_FOR;
            loop {
                let result = commit_once(&mut client, &mut writer, op.clone()).await;
                let Some(follow) = &work.follow else {
                    return result;
                };
                match &result {
                    Err(e) if classify(e) != Retry::Never && Instant::now() < until => {}
                    _ => return result,
                }
                *retries += 1;
                writer = None;
                client = follow.master(&work.table, until).await?;
            }
        };
        let result = tokio::select! {
            // Checked first so that a stopped run does not start one more commit.
            biased;
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(work.end) => break,
            result = commit => result,
        };
        let measured = sent >= work.measure_from;
        let latency_us = u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut log = |outcome| {
            if work.log && measured {
                let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                run.log.push(LogLine {
                    sent_us: micros(sent.duration_since(work.start)),
                    latency_us,
                    lag_us: micros(sent.saturating_duration_since(since)),
                    outcome,
                });
            }
        };
        match result {
            Ok(outcome) => {
                log(LogOutcome::of(&outcome.return_outcome));
                progress.commits.fetch_add(1, Ordering::Relaxed);
                if measured {
                    run.latency_us.saturating_record(latency_us.max(1));
                    run.commits += 1;
                    run.not_durable += u64::from(!outcome.durable);
                    run.returns.count(&outcome.return_outcome);
                }
            }
            Err(e) => {
                log(LogOutcome::Error);
                progress.errors.fetch_add(1, Ordering::Relaxed);
                if measured {
                    run.errors += 1;
                }
                if run.first_errors.len() < ERRORS_KEPT_PER_CLIENT {
                    run.first_errors.push(error_text(&e));
                }
                if may_mean_server_gone(&e) {
                    writer = None;
                    let fresh = match &work.follow {
                        Some(follow) => {
                            follow
                                .master(&work.table, Instant::now() + FOLLOW_FOR)
                                .await
                        }
                        None => Client::connect_with_timeout(&work.host, PROBE_TIMEOUT).await,
                    };
                    match fresh {
                        Ok(fresh) => client = fresh,
                        Err(probe) => {
                            run.fatal = Some(error_text(&probe));
                            break;
                        }
                    }
                }
            }
        }
    }
    run
}

/// One write over the client's write stream, opened first if there is none; an error
/// that closed the stream drops it.
async fn commit_once(
    client: &mut Client,
    writer: &mut Option<Writer>,
    op: RowOp,
) -> Result<WriteOutcome, ClientError> {
    if writer.is_none() {
        *writer = Some(client.writer().await?);
    }
    let w = writer.as_mut().expect("opened above");
    let result = w.write(vec![op]).await;
    if matches!(&result, Err(ClientError::SessionClosed)) {
        *writer = None;
    }
    result
}

/// Errors the server itself reports carry a SQLSTATE; one without may be a dead
/// connection or server.
fn may_mean_server_gone(e: &ClientError) -> bool {
    match e {
        ClientError::Status(s) => hawser_client::sqlstate(s).is_none(),
        ClientError::Connect { .. } | ClientError::SessionClosed => true,
        ClientError::BadAddress { .. } | ClientError::BadToken | ClientError::Convert(_) => false,
    }
}

/// The merged result of a run.
struct Report {
    clients: u32,
    /// Connections the clients shared (`--connections`, 0 resolved).
    connections: u32,
    measured: Duration,
    commits: u64,
    errors: u64,
    /// With `--follow-master`: writes sent again to the master; `None` without.
    retries: Option<u64>,
    not_durable: u64,
    latency_us: Histogram<u64>,
    /// The `--rate` the clients were held to, and how late they sent on its schedule.
    rate: Option<f64>,
    schedule_lag_us: Histogram<u64>,
    first_errors: Vec<String>,
    /// The disk's write+fdatasync rate, when probed.
    fsyncs_per_sec: Option<f64>,
    /// The CPU time the hypervisor gave other guests while this one wanted it, in
    /// percent of this machine's CPU time over the measured seconds (Linux only).
    steal_pct: Option<f64>,
    /// Commits and flushes the server counted over the whole run (warm-up included).
    server: Option<(u64, u64)>,
    /// Per node (the master, then the subscribers), µs of CPU per commit over the same
    /// span as `server` (and the subscribers' catch-up).
    server_cpu: Vec<(String, f64)>,
    returns: ReturnCounts,
    /// The replication mode, with --mode.
    mode: Option<&'static str>,
    /// How long the subscribers took to catch up after the load stopped, with --mode.
    catch_up: Option<Duration>,
    /// The master's streams of the bench scheme, sampled under load, with --mode.
    streams: StreamSamples,
    /// With `--log`: the file and the lines written to it.
    log: Option<(String, u64)>,
}

/// One node's CPU time (`StatusResponse.cpu_micros`) before and after the run.
struct NodeCpu {
    store: String,
    /// A connection to it (none for the master, read through the bench's own).
    client: Option<Client>,
    before: Option<u64>,
    after: Option<u64>,
}

impl NodeCpu {
    fn new(store: String, client: Option<Client>, before: u64) -> Self {
        // 0: a server that predates the field.
        let before = (before > 0).then_some(before);
        NodeCpu {
            store,
            client,
            before,
            after: None,
        }
    }

    /// Reads the CPU time of the node whose store is `store`, found in the master's
    /// cluster status; a node it cannot reach is left out of the report, with a warning.
    async fn connect(store: &str, master: &v1::StatusResponse) -> Self {
        let addr = master.cluster.as_ref().and_then(|c| {
            c.nodes
                .iter()
                .find(|n| n.store.eq_ignore_ascii_case(store))
                .map(|n| n.grpc_addr.clone())
        });
        let Some(addr) = addr else {
            eprintln!("warning: {store} is not in the cluster's status: its CPU is not reported");
            return NodeCpu::new(store.to_string(), None, 0);
        };
        let mut client = match Client::connect(&addr).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("warning: cannot reach {store} at {addr} for its CPU time: {e}");
                return NodeCpu::new(store.to_string(), None, 0);
            }
        };
        let before = client.status().await.map_or(0, |s| s.cpu_micros);
        NodeCpu::new(store.to_string(), Some(client), before)
    }

    async fn read_after(&mut self) {
        if let (Some(client), Some(_)) = (&mut self.client, self.before) {
            self.after = client.status().await.ok().map(|s| s.cpu_micros);
        }
    }

    /// µs of CPU per commit of the master's `commits` between the two readings.
    fn micros_per(&self, commits: u64) -> Option<f64> {
        let used = self.after?.checked_sub(self.before?)?;
        (commits > 0).then(|| used as f64 / commits as f64)
    }
}

/// How often the master's streams are sampled under load.
const STREAM_SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The share of `--rate` below which the report says the rate was not reached (a
/// Poisson schedule's count varies a little by chance).
const RATE_REACHED: f64 = 0.95;

/// Steal at or above which the text report warns that the host, not the system under
/// test, shaped the figures.
const NOISY_STEAL_PCT: f64 = 5.0;

/// The first line of `/proc/stat`: CPU time of all CPUs since boot, in ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
struct CpuTicks {
    /// Time the hypervisor ran other guests while this one had work ("steal").
    steal: u64,
    /// user, nice, system, idle, iowait, irq, softirq and steal together.
    total: u64,
}

impl CpuTicks {
    /// `None` where there is no `/proc/stat` (not Linux) or it has no steal column.
    fn read() -> Option<CpuTicks> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    fn parse(stat: &str) -> Option<CpuTicks> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        Some(CpuTicks {
            steal: *v.get(7)?,
            total: v.iter().sum(),
        })
    }

    fn steal_pct_until(&self, later: &CpuTicks) -> Option<f64> {
        let total = later.total.checked_sub(self.total).filter(|t| *t > 0)?;
        let steal = later.steal.checked_sub(self.steal)?;
        Some(steal as f64 * 100.0 / total as f64)
    }
}

fn now_before(end: Instant) -> bool {
    Instant::now() < end
}

/// Per receiver of the bench scheme, what the master's `/replication` said under load.
#[derive(Default)]
struct StreamSamples {
    by_receiver: BTreeMap<String, StreamSample>,
}

#[derive(Default)]
struct StreamSample {
    /// `lag_micros` (age of the oldest unacknowledged transaction sent) per sample.
    lag_us: Vec<u64>,
    lag_records_max: u64,
    /// `ack_micros_mean` at the last sample (0: no ack yet).
    ack_us: u64,
    /// The stream's counters (raw bytes, wire bytes, transactions) at the first and the
    /// last sample under load: what it sent while the load was measured.
    first: Option<[u64; 3]>,
    last: [u64; 3],
    /// The codec the sender reports (`off`, `lz4`, `zstd`).
    compression: String,
}

impl StreamSamples {
    /// Takes one sample from a status response's replication status. Only samples
    /// taken before the load ended (`under_load`) count towards the lag.
    fn add(&mut self, replication: Option<&v1::ReplicationStatus>, scheme: &str, under_load: bool) {
        let Some(r) = replication else {
            return;
        };
        for o in r
            .outbound
            .iter()
            .filter(|o| o.scheme.eq_ignore_ascii_case(scheme))
        {
            let sample = self.by_receiver.entry(o.receiver.clone()).or_default();
            if under_load {
                sample.lag_us.push(o.lag_micros);
                sample.lag_records_max = sample.lag_records_max.max(o.lag_records);
                let counters = [o.raw_bytes, o.wire_bytes, o.transactions];
                sample.first.get_or_insert(counters);
                sample.last = counters;
                sample.compression = o.compression.clone();
            }
            sample.ack_us = o.ack_micros_mean;
        }
    }

    /// Per receiver sampled under load at least once.
    fn summary(&self) -> Vec<StreamSummary> {
        self.by_receiver
            .iter()
            .filter(|(_, s)| !s.lag_us.is_empty())
            .map(|(receiver, s)| {
                let samples = s.lag_us.len();
                let max = s.lag_us.iter().copied().max().unwrap_or(0);
                let first = s.first.unwrap_or(s.last);
                let [raw, wire, txns] = [0, 1, 2].map(|i| s.last[i].saturating_sub(first[i]));
                let per_txn = |bytes: u64| (txns > 0).then(|| bytes as f64 / txns as f64);
                StreamSummary {
                    receiver: receiver.clone(),
                    samples,
                    lag_ms_mean: s.lag_us.iter().sum::<u64>() as f64 / samples as f64 / 1000.0,
                    lag_ms_max: max as f64 / 1000.0,
                    lag_records_max: s.lag_records_max,
                    ack_ms: s.ack_us as f64 / 1000.0,
                    compression: s.compression.clone(),
                    raw_per_txn: per_txn(raw),
                    wire_per_txn: per_txn(wire),
                }
            })
            .collect()
    }
}

/// One stream's samples, summed up.
struct StreamSummary {
    receiver: String,
    samples: usize,
    lag_ms_mean: f64,
    lag_ms_max: f64,
    lag_records_max: u64,
    ack_ms: f64,
    compression: String,
    /// Bytes per transaction the stream encoded and sent between the first and the
    /// last sample (none when it sent no transaction meanwhile).
    raw_per_txn: Option<f64>,
    wire_per_txn: Option<f64>,
}

impl StreamSummary {
    /// `; compression lz4: 262 B per transaction encoded, 175 sent (33 % saved)` (or
    /// `; 262 B per transaction, uncompressed`), or nothing when the stream sent no
    /// transaction between samples.
    fn bytes_text(&self) -> String {
        let (Some(raw), Some(wire)) = (self.raw_per_txn, self.wire_per_txn) else {
            return String::new();
        };
        if self.compression == "off" {
            return format!("; {raw:.0} B per transaction, uncompressed");
        }
        let codec = if self.compression.is_empty() {
            "?"
        } else {
            &self.compression
        };
        let saved = if raw > 0.0 {
            100.0 * (1.0 - wire / raw)
        } else {
            0.0
        };
        format!(
            "; compression {codec}: {raw:.0} B per transaction encoded, {wire:.0} sent \
             ({saved:.0} % saved)"
        )
    }
}

impl Report {
    fn merge(clients: u32, measured: Duration, runs: &[ClientRun]) -> anyhow::Result<Report> {
        let mut report = Report {
            clients,
            connections: clients,
            measured,
            commits: 0,
            errors: 0,
            retries: None,
            not_durable: 0,
            latency_us: new_histogram(),
            rate: None,
            schedule_lag_us: new_histogram(),
            first_errors: Vec::new(),
            fsyncs_per_sec: None,
            steal_pct: None,
            server: None,
            server_cpu: Vec::new(),
            returns: ReturnCounts::default(),
            mode: None,
            catch_up: None,
            streams: StreamSamples::default(),
            log: None,
        };
        for run in runs {
            report.commits += run.commits;
            report.returns.add(&run.returns);
            report.errors += run.errors;
            report.not_durable += run.not_durable;
            report
                .latency_us
                .add(&run.latency_us)
                .context("merge latency histograms")?;
            report
                .schedule_lag_us
                .add(&run.schedule_lag_us)
                .context("merge schedule lag histograms")?;
            for e in &run.first_errors {
                if report.first_errors.len() < ERRORS_REPORTED {
                    report.first_errors.push(e.clone());
                }
            }
        }
        Ok(report)
    }

    fn commits_per_sec(&self) -> f64 {
        let secs = self.measured.as_secs_f64();
        if secs > 0.0 {
            self.commits as f64 / secs
        } else {
            0.0
        }
    }

    /// Latency percentiles in µs: p50, p99, p999, max, mean (all 0 with no commits).
    fn latency(&self) -> (u64, u64, u64, u64, f64) {
        let h = &self.latency_us;
        if h.is_empty() {
            return (0, 0, 0, 0, 0.0);
        }
        (
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max(),
            h.mean(),
        )
    }

    fn json(&self) -> serde_json::Value {
        let (p50, p99, p999, max, mean) = self.latency();
        json!({
            "clients": self.clients,
            "connections": self.connections,
            "duration_s": self.measured.as_secs_f64(),
            "commits": self.commits,
            "errors": self.errors,
            "retries": self.retries,
            "commits_per_sec": self.commits_per_sec(),
            "durable": self.commits > 0 && self.not_durable == 0,
            "latency_us": {"p50": p50, "p99": p99, "p999": p999, "max": max, "mean": mean},
            "rate": self.rate,
            "schedule_lag_us": self.rate.map(|_| {
                let h = &self.schedule_lag_us;
                let (mean, p99, max) = if h.is_empty() {
                    (0.0, 0, 0)
                } else {
                    (h.mean(), h.value_at_quantile(0.99), h.max())
                };
                json!({"mean": mean, "p99": p99, "max": max})
            }),
            "fsyncs_per_sec": self.fsyncs_per_sec,
            "host_steal_pct": self.steal_pct,
            "commits_per_fsync_limit": self.fsyncs_per_sec.map(|f| self.commits_per_sec() / f),
            "server_commits": self.server.map(|s| s.0),
            "server_flushes": self.server.map(|s| s.1),
            "commits_per_flush": self.commits_per_flush(),
            "server_cpu_us_per_commit": self
                .server_cpu
                .iter()
                .map(|(store, us)| (store.clone(), json!((us * 10.0).round() / 10.0)))
                .collect::<serde_json::Map<_, _>>(),
            "mode": self.mode,
            "returns": {
                "acknowledged": self.returns.acknowledged,
                "timed_out": self.returns.timed_out,
                "disabled": self.returns.disabled,
                "none": self.returns.none,
            },
            "catch_up_ms": self.catch_up.map(|d| d.as_secs_f64() * 1000.0),
            "log": self.log.as_ref().map(|(path, lines)| json!({"path": path, "lines": lines})),
            "streams": self.streams.summary().into_iter().map(|s| json!({
                "receiver": s.receiver,
                "samples": s.samples,
                "lag_ms_mean": s.lag_ms_mean,
                "lag_ms_max": s.lag_ms_max,
                "lag_records_max": s.lag_records_max,
                "ack_round_trip_ms": s.ack_ms,
                "compression": s.compression,
                "raw_bytes_per_txn": s.raw_per_txn,
                "wire_bytes_per_txn": s.wire_per_txn,
            })).collect::<Vec<_>>(),
        })
    }

    /// The group-commit factor the server saw: commits per disk flush.
    fn commits_per_flush(&self) -> Option<f64> {
        self.server
            .filter(|s| s.1 > 0)
            .map(|(c, f)| c as f64 / f as f64)
    }

    fn extra_text(&self) -> String {
        let mut out = String::new();
        if let Some(rate) = self.rate {
            let h = &self.schedule_lag_us;
            let (mean, max) = if h.is_empty() {
                (0.0, 0)
            } else {
                (h.mean(), h.max())
            };
            let short = if self.commits_per_sec() < RATE_REACHED * rate {
                " — the rate was not reached: the server (or this machine) could not keep up"
            } else {
                ""
            };
            out.push_str(&format!(
                "rate           {rate:.0} commits/s scheduled (Poisson); latency counts from each \
                 commit's scheduled time; sent late by {mean:.0} µs mean, {max} µs max{short}\n"
            ));
        }
        if let Some((commits, flushes)) = self.server {
            let factor = self
                .commits_per_flush()
                .map_or("-".into(), |f| format!("{f:.1}"));
            out.push_str(&format!(
                "server         {commits} commits in {flushes} flushes ({factor} commits per flush)\n"
            ));
        }
        if !self.server_cpu.is_empty() {
            let per: Vec<String> = self
                .server_cpu
                .iter()
                .map(|(store, us)| format!("{store} {us:.1}"))
                .collect();
            out.push_str(&format!(
                "server cpu     {} µs per commit (user + system, warm-up and catch-up included)\n",
                per.join(", ")
            ));
        }
        if let Some(mode) = self.mode {
            let r = &self.returns;
            out.push_str(&format!(
                "replication    {mode}: {} acknowledged, {} timed out (TT8170), {} with the \
                 service disabled, {} without one\n",
                r.acknowledged, r.timed_out, r.disabled, r.none
            ));
            for s in self.streams.summary() {
                out.push_str(&format!(
                    "stream {:<8} lag mean {:.1} ms, max {:.1} ms, at most {} log records \
                     behind ({} samples); ack round trip {:.2} ms{}\n",
                    s.receiver,
                    s.lag_ms_mean,
                    s.lag_ms_max,
                    s.lag_records_max,
                    s.samples,
                    s.ack_ms,
                    s.bytes_text()
                ));
            }
            if let Some(d) = self.catch_up {
                out.push_str(&format!(
                    "catch-up       subscribers had everything {:.1} ms after the load stopped\n",
                    d.as_secs_f64() * 1000.0
                ));
            }
        }
        if let Some(f) = self.fsyncs_per_sec {
            out.push_str(&format!(
                "disk           {f:.0} fsyncs/s; commits/s is {:.2}x that limit\n",
                self.commits_per_sec() / f
            ));
        }
        if let Some((path, lines)) = &self.log {
            out.push_str(&format!(
                "log            {lines} commits, one per line, in {path}\n"
            ));
        }
        if let Some(steal) = self.steal_pct {
            out.push_str(&format!(
                "host           {steal:.1} % CPU steal on this machine while measuring{}\n",
                if steal >= NOISY_STEAL_PCT {
                    " (the hypervisor ran other guests: figures are low and noisy)"
                } else {
                    ""
                }
            ));
        }
        out
    }

    fn text(&self, table: &str, value_size: usize, keys: i64) -> String {
        let (p50, p99, p999, max, mean) = self.latency();
        let durable = match (self.commits, self.not_durable) {
            (0, _) => "-".to_string(),
            (_, 0) => "all".to_string(),
            (_, n) => format!("{} of {}", self.commits - n, self.commits),
        };
        format!(
            "bench: {clients} clients{shared}, {secs:.1} s, table {table}, {value_size} B values, \
             {keys} keys\n\
             commits        {commits}\n\
             commits/s      {rate:.1}\n\
             errors         {errors}{retries}\n\
             durable        {durable}\n\
             latency (µs)   p50 {p50}  p99 {p99}  p999 {p999}  max {max}  mean {mean:.0}\n\
             {extra}",
            extra = self.extra_text(),
            clients = self.clients,
            shared = if self.connections < self.clients {
                let s = if self.connections == 1 { "" } else { "s" };
                format!(" on {} connection{s}", self.connections)
            } else {
                String::new()
            },
            secs = self.measured.as_secs_f64(),
            commits = self.commits,
            rate = self.commits_per_sec(),
            errors = self.errors,
            retries = self
                .retries
                .map_or(String::new(), |r| format!("  (retried at the master: {r})")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_read_from_proc_stat_as_a_share_of_all_cpu_time() {
        let at = |steal: u64, idle: u64| {
            format!("cpu  100 0 50 {idle} 5 0 2 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 9\n")
        };
        let a = CpuTicks::parse(&at(10, 1000)).unwrap();
        assert_eq!(
            a,
            CpuTicks {
                steal: 10,
                total: 1167
            }
        );
        let b = CpuTicks::parse(&at(40, 1270)).unwrap();
        // 300 ticks later, 30 of them stolen.
        assert_eq!(a.steal_pct_until(&b), Some(10.0));
        assert_eq!(b.steal_pct_until(&a), None, "counters only grow");
        assert_eq!(a.steal_pct_until(&a), None, "no time passed");
        // An old kernel's line without the steal column.
        assert_eq!(CpuTicks::parse("cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(CpuTicks::parse("intr 1\n"), None);
    }

    #[test]
    fn the_log_merges_the_clients_lines_in_the_order_sent() {
        let line = |sent_us, latency_us, lag_us, outcome| LogLine {
            sent_us,
            latency_us,
            lag_us,
            outcome,
        };
        let runs = [
            logged(vec![
                line(10, 500, 0, LogOutcome::Acknowledged),
                line(900, 7000, 40, LogOutcome::TimedOut),
            ]),
            logged(vec![]),
            logged(vec![
                line(10, 300, 2, LogOutcome::NoReturn),
                line(450, 1200, 0, LogOutcome::Error),
                line(2000, 80, 1, LogOutcome::Disabled),
            ]),
        ];
        let mut out = Vec::new();
        assert_eq!(write_log(&mut out, 1_000_000, &runs).unwrap(), 5);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "client,sent_unix_us,latency_us,lag_us,outcome\n\
             0,1000010,500,0,acknowledged\n\
             2,1000010,300,2,none\n\
             2,1000450,1200,0,error\n\
             0,1000900,7000,40,timed_out\n\
             2,1002000,80,1,disabled\n"
        );
        for outcome in ["acknowledged", "timed_out", "disabled"] {
            assert_eq!(LogOutcome::of(outcome).name(), outcome);
        }
        assert_eq!(LogOutcome::of("").name(), "none");
    }

    #[test]
    fn threads_default_to_one_per_sixteen_clients_within_the_cores() {
        assert_eq!(auto_threads(1, 2), 1);
        assert_eq!(auto_threads(16, 2), 1);
        assert_eq!(auto_threads(17, 2), 2);
        assert_eq!(auto_threads(200, 2), 2);
        assert_eq!(auto_threads(64, 32), 4);
        assert_eq!(auto_threads(0, 8), 1);
        assert_eq!(auto_threads(40, 0), 1);
    }

    #[test]
    fn durations_accept_humantime_and_plain_seconds() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn table_names_must_be_plain() {
        assert!(is_plain_table_name("bench"));
        assert!(is_plain_table_name("app.bench_2"));
        assert!(!is_plain_table_name(""));
        assert!(!is_plain_table_name("1bench"));
        assert!(!is_plain_table_name("a.b.c"));
        assert!(!is_plain_table_name("bench; drop table x"));
    }

    fn described(columns: &[(&str, &str)], key: &[&str]) -> v1::DescribeResponse {
        v1::DescribeResponse {
            table: "bench".into(),
            columns: columns
                .iter()
                .map(|(name, ty)| v1::Column {
                    name: name.to_string(),
                    data_type: ty.to_string(),
                    nullable: true,
                })
                .collect(),
            primary_key: key.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn an_existing_table_must_fit_the_workload() {
        let good = described(&[("k", "BIGINT"), ("v", "VARCHAR(100)")], &["k"]);
        assert_eq!(check_table(&good, 100, false), Ok(()));
        assert!(check_table(&good, 100, true).is_err());
        let stamped = described(
            &[("k", "BIGINT"), ("v", "VARCHAR(100)"), ("ts", "BINARY(8)")],
            &["k"],
        );
        assert_eq!(check_table(&stamped, 100, true), Ok(()));
        assert!(check_table(&stamped, 100, false).is_err());
        assert!(check_table(&good, 101, false)
            .unwrap_err()
            .contains("less than --value-size 101"));
        let three = described(
            &[("k", "BIGINT"), ("v", "VARCHAR(9)"), ("w", "DATE")],
            &["k"],
        );
        assert!(check_table(&three, 1, false)
            .unwrap_err()
            .contains("3 columns"));
        let keyed_on_v = described(&[("k", "BIGINT"), ("v", "VARCHAR(100)")], &["v"]);
        assert!(check_table(&keyed_on_v, 1, false).is_err());
        let not_text = described(&[("k", "BIGINT"), ("v", "DATE")], &["k"]);
        assert!(check_table(&not_text, 1, false)
            .unwrap_err()
            .contains("no text column v"));
    }

    fn client_run(latencies: &[u64], errors: u64, not_durable: u64) -> ClientRun {
        let mut latency_us = new_histogram();
        for &l in latencies {
            latency_us.saturating_record(l);
        }
        ClientRun {
            latency_us,
            schedule_lag_us: new_histogram(),
            commits: latencies.len() as u64,
            errors,
            retries: 0,
            not_durable,
            returns: ReturnCounts::default(),
            first_errors: (0..errors).map(|i| format!("e{i}")).collect(),
            fatal: None,
            log: Vec::new(),
        }
    }

    fn logged(log: Vec<LogLine>) -> ClientRun {
        ClientRun {
            log,
            ..client_run(&[], 0, 0)
        }
    }

    #[test]
    fn a_rate_is_a_number_of_commits_per_second_above_zero() {
        assert_eq!(parse_rate("5000"), Ok(5000.0));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        for bad in ["0", "-1", "inf", "NaN", "fast", ""] {
            assert!(parse_rate(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn poisson_gaps_average_their_mean_and_vary_as_exponential_ones_do() {
        let mut rng = StdRng::seed_from_u64(7);
        let mean = Duration::from_micros(400);
        let gaps: Vec<f64> = (0..100_000)
            .map(|_| poisson_gap(&mut rng, mean).as_secs_f64() * 1e6)
            .collect();
        let avg = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((avg - 400.0).abs() < 8.0, "mean gap {avg} µs");
        // An exponential distribution's median is ln 2 of its mean, and its standard
        // deviation equals the mean.
        let mut sorted = gaps.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        assert!(
            (median - 400.0 * 2f64.ln()).abs() < 10.0,
            "median {median} µs"
        );
        let sd = (gaps.iter().map(|g| (g - avg).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd - 400.0).abs() < 12.0, "standard deviation {sd} µs");
        assert!(gaps.iter().all(|g| g.is_finite() && *g >= 0.0));
    }

    #[test]
    fn report_merges_clients_and_computes_rate_and_percentiles() {
        let a = client_run(&(1..=500).collect::<Vec<_>>(), 4, 0);
        let b = client_run(&(501..=1000).collect::<Vec<_>>(), 3, 0);
        let report = Report::merge(2, Duration::from_secs(2), &[a, b]).unwrap();
        assert_eq!(report.commits, 1000);
        assert_eq!(report.errors, 7);
        assert_eq!(report.first_errors.len(), ERRORS_REPORTED);
        assert_eq!(report.commits_per_sec(), 500.0);
        let (p50, p99, p999, max, mean) = report.latency();
        assert_eq!(p50, 500);
        assert_eq!(p99, 990);
        assert_eq!(p999, 999);
        assert_eq!(max, 1000);
        assert!((mean - 500.5).abs() < 1.0);

        let j = report.json();
        assert_eq!(j["clients"], 2);
        assert_eq!(j["commits"], 1000);
        assert_eq!(j["commits_per_sec"], 500.0);
        assert_eq!(j["durable"], true);
        assert_eq!(j["latency_us"]["p99"], 990);
        assert!(report
            .text("bench", 100, 10)
            .contains("commits/s      500.0\n"));
    }

    #[test]
    fn stream_samples_give_the_bytes_per_transaction_sent_while_measured() {
        let sample = |raw: u64, wire: u64, txns: u64| v1::ReplicationStatus {
            outbound: vec![
                v1::OutboundStream {
                    scheme: "bench_repl".into(),
                    receiver: "ds2".into(),
                    lag_micros: 900,
                    lag_records: 3,
                    ack_micros_mean: 400,
                    compression: "lz4".into(),
                    raw_bytes: raw,
                    wire_bytes: wire,
                    transactions: txns,
                    ..Default::default()
                },
                v1::OutboundStream {
                    scheme: "other".into(),
                    receiver: "ds9".into(),
                    lag_micros: 1,
                    lag_records: 1,
                    raw_bytes: 1,
                    wire_bytes: 1,
                    transactions: 1,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let mut samples = StreamSamples::default();
        samples.add(Some(&sample(1_000, 1_000, 4)), "BENCH_REPL", true);
        samples.add(Some(&sample(27_000, 14_000, 104)), "bench_repl", true);
        // After the load: not counted.
        samples.add(Some(&sample(99_000, 99_000, 200)), "bench_repl", false);
        let summary = samples.summary();
        assert_eq!(summary.len(), 1);
        let s = &summary[0];
        assert_eq!(
            (s.receiver.as_str(), s.compression.as_str()),
            ("ds2", "lz4")
        );
        assert_eq!((s.raw_per_txn, s.wire_per_txn), (Some(260.0), Some(130.0)));
        assert!(
            s.bytes_text()
                .contains("lz4: 260 B per transaction encoded, 130 sent (50 % saved)"),
            "{}",
            s.bytes_text()
        );

        // A stream that sent nothing between its samples has no per-transaction figure.
        let mut idle = StreamSamples::default();
        idle.add(Some(&sample(5, 5, 1)), "bench_repl", true);
        idle.add(Some(&sample(5, 5, 1)), "bench_repl", true);
        let s = &idle.summary()[0];
        assert_eq!((s.raw_per_txn, s.bytes_text()), (None, String::new()));

        // An uncompressed stream says so rather than "0 % saved".
        let plain = StreamSummary {
            receiver: "ds3".into(),
            samples: 2,
            lag_ms_mean: 0.0,
            lag_ms_max: 0.0,
            lag_records_max: 0,
            ack_ms: 0.0,
            compression: "off".into(),
            raw_per_txn: Some(249.4),
            wire_per_txn: Some(249.4),
        };
        assert_eq!(plain.bytes_text(), "; 249 B per transaction, uncompressed");
    }

    #[test]
    fn an_empty_run_reports_zeros_not_nan() {
        let report = Report::merge(1, Duration::ZERO, &[client_run(&[], 2, 0)]).unwrap();
        assert_eq!(report.commits_per_sec(), 0.0);
        assert_eq!(report.latency(), (0, 0, 0, 0, 0.0));
        assert_eq!(report.json()["durable"], false);
        assert!(report.text("bench", 1, 1).contains("durable        -\n"));
    }

    #[test]
    fn non_durable_commits_are_reported() {
        let report =
            Report::merge(1, Duration::from_secs(1), &[client_run(&[5, 6], 0, 1)]).unwrap();
        assert_eq!(report.json()["durable"], false);
        assert!(report
            .text("bench", 1, 1)
            .contains("durable        1 of 2\n"));
    }

    #[test]
    fn only_errors_without_sqlstate_suggest_a_dead_server() {
        let mut status = tonic_status_with_sqlstate("23505");
        assert!(!may_mean_server_gone(&ClientError::Status(status.clone())));
        status.metadata_mut().remove("hawser-sqlstate");
        assert!(may_mean_server_gone(&ClientError::Status(status)));
        assert!(may_mean_server_gone(&ClientError::SessionClosed));
    }

    fn tonic_status_with_sqlstate(code: &str) -> tonic::Status {
        let mut status = tonic::Status::invalid_argument("duplicate key");
        status
            .metadata_mut()
            .insert("hawser-sqlstate", code.parse().unwrap());
        status
    }
}
