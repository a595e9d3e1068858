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
//!
//! Submodules: `args` holds the command line, `setup` the bench table and the fsync
//! probe, `client` the workload and the client loop, `measure` what is sampled beside
//! the commits (node CPU, host steal, the master's streams), `report` the merged
//! result and its output.
//!
//! [`FOLLOW_FOR`]: client::FOLLOW_FOR

mod args;
mod client;
mod measure;
mod report;
mod setup;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hawser_client::{Client, ClusterClient};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use self::args::BenchArgs;
use self::client::{client_loop, Follow, Progress, Workload, PROBE_TIMEOUT};
use self::measure::{now_before, CpuTicks, NodeCpu, StreamSamples, STREAM_SAMPLE_EVERY};
use self::report::{write_log, Report};
use self::setup::{fsync_probe, is_plain_table_name, prepare_table, FSYNC_PROBE_TIME};
use crate::output::{connect_error_text, Format};

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
