//! `catchup`: how long a stopped subscriber takes to catch up, and how many rows it
//! writes, with RTL compilation and without (the figures of docs/rtl.md).
//!
//! ```text
//!  load:   n1 (master) + n2 (subscriber of TABLE t) ── preload keys, n2 acks ──►
//!          SIGTERM n2 ──► clients commit --updates single-row upserts on n1 ──►
//!          SIGTERM n1 ──► both data directories kept as the snapshot
//!  per mode (compile, --no-compile), on a copy of the snapshot:
//!          n1 and n2 restarted on their copies and addresses ──► n2's stream connects
//!          ──► poll n2's /replication until it applied n1's whole log (through LSN)
//!          and n1 sees n2's high-water at its own ──► tables compared page by page
//! ```
//!
//! Both modes replay the very same backlog: the load runs once and each mode starts
//! from a copy of the two stopped nodes' data. Catch-up is timed from the moment n2's
//! receiver accepted the stream (so the sender's reconnect backoff and process start
//! do not count; they are reported apart) to the poll that saw it done, so it is
//! precise to the poll interval. The counts are n2's own (`/replication` inbound):
//! transactions and row changes received, rows written, applies compiled and in log
//! order.
//!
//! ```sh
//! cargo build --release -p hawser-cli -p hawser-chaos
//! target/release/hawser-chaos catchup                       # 1,000,000 over 10,000 keys
//! target/release/hawser-chaos catchup --no-repeat           # every update a new key
//! # 100 MiB behind on transactions of 1 MiB (26 rows of 40,000 bytes), then of 10 MiB
//! target/release/hawser-chaos catchup --no-repeat --value-bytes 40000 --per-txn 26 --updates 2600
//! target/release/hawser-chaos catchup --no-repeat --value-bytes 40000 --per-txn 262 --updates 2620
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use hawser_client::{Client, RowOp};
use hawser_core::Value;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value as Json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{wait_for, Proc};

/// How often progress and the subscriber's state are looked at.
const POLL: Duration = Duration::from_millis(10);
/// Rows per page when the tables are compared.
const PAGE: u32 = 10_000;

#[derive(clap::Args, Debug)]
pub struct CatchupArgs {
    /// Single-row updates committed on the master while the subscriber is stopped.
    #[arg(long, default_value_t = 1_000_000)]
    updates: u64,
    /// Keys the updates fall on, chosen at random (a fixed seed, so every invocation
    /// gets the same sequence); ignored with --no-repeat.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Every update writes a key of its own (keys = updates; the table starts empty, so
    /// they are inserts): compilation has nothing to fold.
    #[arg(long)]
    no_repeat: bool,
    /// Single-row updates per transaction, to make the load phase fast (1 = one
    /// transaction per update).
    #[arg(long, default_value_t = 100)]
    per_txn: u64,
    /// Each row's value is text of this many bytes (`v VARCHAR(n)`) instead of a
    /// number: large transactions, `--per-txn` × this many bytes each.
    #[arg(long, default_value_t = 0)]
    value_bytes: u64,
    /// Concurrent load clients.
    #[arg(long, default_value_t = 4)]
    clients: u64,
    /// Longest a catch-up may take before the drill fails.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Passed to the compiling subscriber as --compile-threshold-txns [default: the
    /// node's].
    #[arg(long)]
    compile_threshold_txns: Option<u64>,
    /// Passed to the compiling subscriber as --compile-threshold-bytes [default: the
    /// node's].
    #[arg(long)]
    compile_threshold_bytes: Option<u64>,
    /// The hawser binary [default: `hawser` next to this program].
    #[arg(long)]
    hawser: Option<PathBuf>,
    /// Output: a table for people or one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Runs the drill in a temporary directory, kept (with the nodes' logs) on failure.
pub async fn run(args: CatchupArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.updates > 0, "--updates must be at least 1");
    ensure!(args.per_txn > 0, "--per-txn must be at least 1");
    ensure!(args.clients > 0, "--clients must be at least 1");
    ensure!(args.no_repeat || args.keys > 0, "--keys must be at least 1");
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
        .prefix("hawser-catchup-")
        .tempdir()?;
    let result = drill(&args, &bin, tmp.path()).await;
    if result.is_err() {
        eprintln!("node data and logs kept in {}", tmp.keep().display());
    }
    let report = result?;
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Text => print_text(&report),
    }
    Ok(ExitCode::SUCCESS)
}

/// The addresses the two nodes keep across restarts (the Raft membership names them).
struct Addrs {
    n1: (String, String),
    n2: (String, String),
}

/// What the load phase left behind.
struct Loaded {
    addrs: Addrs,
    /// n1's last log position and its own high-water after the load.
    last_lsn: u64,
    own_seq: u64,
    n1_id: u64,
    transactions: u64,
    seconds: f64,
}

async fn drill(args: &CatchupArgs, bin: &Path, root: &Path) -> anyhow::Result<Json> {
    let snapshot = root.join("snapshot");
    std::fs::create_dir_all(&snapshot)?;
    let loaded = load(args, bin, &snapshot).await?;
    let mut modes = Vec::new();
    for (mode, flags) in [
        ("compiled", compile_flags(args)),
        ("no-compile", vec!["--no-compile".to_string()]),
    ] {
        let dir = root.join(mode);
        copy_dir(&snapshot, &dir).with_context(|| format!("copy the snapshot for {mode}"))?;
        let r = catch_up(args, bin, &dir, &loaded, mode, &flags)
            .await
            .with_context(|| format!("catch-up, {mode}"))?;
        // Each mode's copy is done with: keep the disk use at one copy.
        std::fs::remove_dir_all(&dir)?;
        modes.push(r);
    }
    let ratio = |field: &str| {
        let a = modes[0][field].as_f64().unwrap_or(0.0);
        let b = modes[1][field].as_f64().unwrap_or(0.0);
        (b > 0.0).then(|| a / b)
    };
    let distinct_keys = if args.no_repeat {
        args.updates
    } else {
        args.keys
    };
    Ok(json!({
        "drill": "catchup",
        "settings": {
            "updates": args.updates,
            "keys": distinct_keys,
            "no_repeat": args.no_repeat,
            "per_txn": args.per_txn,
            "clients": args.clients,
            "compile_threshold_txns": args.compile_threshold_txns,
            "compile_threshold_bytes": args.compile_threshold_bytes,
            "write": if args.no_repeat { "inserts of new keys" } else { "updates of existing keys" },
        },
        "load": {
            "transactions": loaded.transactions,
            "seconds": loaded.seconds,
            "updates_per_second": args.updates as f64 / loaded.seconds.max(1e-9),
            "master_last_lsn": loaded.last_lsn,
        },
        "modes": modes,
        "compiled_vs_no_compile": {
            "catch_up_time": ratio("catch_up_seconds"),
            "rows_written": ratio("rows_written"),
        },
    }))
}

fn compile_flags(args: &CatchupArgs) -> Vec<String> {
    let mut f = Vec::new();
    if let Some(n) = args.compile_threshold_txns {
        f.extend(["--compile-threshold-txns".to_string(), n.to_string()]);
    }
    if let Some(n) = args.compile_threshold_bytes {
        f.extend(["--compile-threshold-bytes".to_string(), n.to_string()]);
    }
    f
}

/// Starts `name` on `data` listening on `addrs` (port 0 = any) and waits (at most 60 s)
/// for its ready line.
fn start(
    bin: &Path,
    name: &str,
    data: &Path,
    addrs: (&str, &str),
    extra: &[String],
) -> anyhow::Result<Proc> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.with_extension("log"))?;
    let mut cmd = crate::node_command(bin, name, data, addrs);
    cmd.args(extra);
    Proc::spawn(cmd, name, data, log)
}

impl Proc {
    /// SIGTERM, then wait (at most 120 s: a large database flushes on the way out)
    /// for a clean exit.
    async fn terminate(&mut self) -> anyhow::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        let status = Command::new("kill").arg(child.id().to_string()).status()?;
        ensure!(status.success(), "kill {} failed", self.name);
        let name = self.name.clone();
        let exit = wait_for(Duration::from_secs(120), &format!("{name} to exit"), || {
            let done = child.try_wait().ok().flatten();
            async move { done }
        })
        .await?;
        self.child = None;
        ensure!(exit.success(), "{name} exited with {exit}");
        Ok(())
    }
}

/// Sets up n1 and n2, replicates the preloaded table, stops n2, commits the load on
/// n1 and stops n1; `dir` then holds both nodes' data.
async fn load(args: &CatchupArgs, bin: &Path, dir: &Path) -> anyhow::Result<Loaded> {
    const ANY: (&str, &str) = ("127.0.0.1:0", "127.0.0.1:0");
    let mut n1 = start(bin, "n1", &dir.join("n1"), ANY, &[])?;
    Client::connect(&n1.grpc)
        .await?
        .init()
        .await
        .context("init the cluster")?;
    let join = vec!["--join".to_string(), n1.grpc.clone()];
    let mut n2 = start(bin, "n2", &dir.join("n2"), ANY, &join)?;
    let addrs = Addrs {
        n1: (n1.grpc.clone(), n1.http.clone()),
        n2: (n2.grpc.clone(), n2.http.clone()),
    };
    let mut c1 = Client::connect(&n1.grpc).await?;
    let mut c2 = Client::connect(&n2.grpc).await?;
    let create = match args.value_bytes {
        0 => "create table t (k bigint primary key, v bigint)".to_string(),
        n => format!("create table t (k bigint primary key, v varchar({n}))"),
    };
    for c in [&mut c1, &mut c2] {
        sql(c, &create).await?;
    }
    let value = |i: u64| value_of(args.value_bytes, i);
    if !args.no_repeat {
        eprintln!("preload: {} keys", args.keys);
        let mut k = 0;
        while k < args.keys {
            let end = (k + 1000).min(args.keys);
            let ops = (k..end)
                .map(|k| RowOp::Insert {
                    table: "t".into(),
                    row: vec![Value::Int(k as i64), value(0)],
                })
                .collect();
            c1.write(ops).await.context("preload")?;
            k = end;
        }
    }
    let ddl = "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2";
    let addr = n1.grpc.clone();
    wait_for(
        Duration::from_secs(60),
        "CREATE REPLICATION accepted",
        || {
            let addr = addr.clone();
            async move {
                let mut c = Client::connect(&addr).await.ok()?;
                c.execute(ddl).await.ok()?.error.is_none().then_some(())
            }
        },
    )
    .await?;
    // n1 takes writes to t only under a master lease, which its next report earns.
    let http = n1.http.clone();
    wait_for(Duration::from_secs(60), "n1's master lease", || {
        let http = http.clone();
        async move {
            let v = http_json(&http, "/replication").await.ok()?;
            v["master_lease"]["remaining_ms"].as_u64().map(|_| ())
        }
    })
    .await?;
    let last = c1.status().await?.last_lsn;
    let http = n1.http.clone();
    wait_for(
        Duration::from_secs(120),
        "n2 to acknowledge the preload",
        || {
            let http = http.clone();
            async move {
                let v = http_json(&http, "/replication").await.ok()?;
                let out = v["outbound"].as_array()?.first()?.clone();
                (out["acked_lsn"].as_u64()? >= last).then_some(())
            }
        },
    )
    .await?;
    n2.terminate().await.context("stop n2")?;
    drop(c2);

    let (transactions, own_seq, seconds) = commit_load(args, &n1.grpc).await?;
    let status = c1.status().await?;
    let n1_id = n1.node_id;
    drop(c1);
    n1.terminate().await.context("stop n1")?;
    Ok(Loaded {
        addrs,
        last_lsn: status.last_lsn,
        own_seq,
        n1_id,
        transactions,
        seconds,
    })
}

async fn sql(c: &mut Client, text: &str) -> anyhow::Result<()> {
    if let Some(e) = c.execute(text).await?.error {
        bail!("{text}: {}", e.message);
    }
    Ok(())
}

/// Commits the updates from `--clients` concurrent clients, `--per-txn` per
/// transaction, with a progress line a second. Returns the transactions committed,
/// the highest seq they got and the seconds it took.
async fn commit_load(args: &CatchupArgs, addr: &str) -> anyhow::Result<(u64, u64, f64)> {
    let done = Arc::new(AtomicU64::new(0));
    let seq = Arc::new(AtomicU64::new(0));
    let txns = Arc::new(AtomicU64::new(0));
    let what = if args.no_repeat {
        format!("inserts of {} new keys", args.updates)
    } else {
        format!("updates over {} keys", args.keys)
    };
    eprintln!(
        "load: {} single-row {what}, {} per transaction, {} clients",
        args.updates, args.per_txn, args.clients
    );
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..args.clients {
        // Client c takes updates c, c + clients, c + 2 clients, ...
        let mine: Vec<u64> = (c..args.updates).step_by(args.clients as usize).collect();
        let mut client = Client::connect(addr).await?;
        let (done, seq, txns) = (done.clone(), seq.clone(), txns.clone());
        let (keys, no_repeat, per_txn) = (args.keys, args.no_repeat, args.per_txn as usize);
        let value_bytes = args.value_bytes;
        clients.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(c);
            for chunk in mine.chunks(per_txn) {
                let mut writes: Vec<(u64, u64)> = chunk
                    .iter()
                    .map(|&i| (if no_repeat { i } else { rng.gen_range(0..keys) }, i))
                    .collect();
                // Rows are locked as a transaction writes them: in key order, so that
                // concurrent clients cannot deadlock (the store only times lock waits out).
                writes.sort_by_key(|&(k, _)| k);
                let ops = writes
                    .into_iter()
                    .map(|(k, i)| RowOp::Upsert {
                        table: "t".into(),
                        row: vec![Value::Int(k as i64), value_of(value_bytes, i + 1)],
                    })
                    .collect();
                let out = client.write(ops).await.context("load write")?;
                seq.fetch_max(out.seq, Ordering::Relaxed);
                txns.fetch_add(1, Ordering::Relaxed);
                done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        });
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tokio::select! {
            joined = clients.join_next() => match joined {
                None => break,
                Some(r) => r.context("a load client panicked")??,
            },
            _ = tick.tick() => {
                let n = done.load(Ordering::Relaxed);
                let secs = started.elapsed().as_secs_f64();
                eprintln!(
                    "load: {n}/{} ({:.0}%), {:.0} updates/s",
                    args.updates,
                    100.0 * n as f64 / args.updates as f64,
                    n as f64 / secs
                );
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "load: done, {} updates in {} transactions, {secs:.1} s",
        done.load(Ordering::Relaxed),
        txns.load(Ordering::Relaxed)
    );
    Ok((
        txns.load(Ordering::Relaxed),
        seq.load(Ordering::Relaxed),
        secs,
    ))
}

/// One catch-up on the copy in `dir`: restart n1 and n2 (with `flags`), wait until n2
/// has n1's whole log, compare the tables.
async fn catch_up(
    args: &CatchupArgs,
    bin: &Path,
    dir: &Path,
    loaded: &Loaded,
    mode: &str,
    flags: &[String],
) -> anyhow::Result<Json> {
    let a = &loaded.addrs;
    let mut n1 = start(bin, "n1", &dir.join("n1"), (&a.n1.0, &a.n1.1), &[])?;
    let mut n2_args = vec!["--join".to_string(), n1.grpc.clone()];
    n2_args.extend(flags.iter().cloned());
    let launched = Instant::now();
    let mut n2 = start(bin, "n2", &dir.join("n2"), (&a.n2.0, &a.n2.1), &n2_args)?;
    let ready = launched.elapsed();
    eprintln!(
        "catch-up [{mode}]: n2 restarted ({} ms to ready)",
        ready.as_millis()
    );

    // Poll n2's view of its inbound stream. The receiver stamps when it accepted the
    // stream; "done" is the first poll that finds n1's last LSN applied.
    let deadline = Instant::now() + args.timeout;
    let mut connected: Option<Instant> = None;
    let mut last_progress = Instant::now();
    let (inbound, done_at) = loop {
        ensure!(
            Instant::now() < deadline,
            "n2 did not catch up within {:?}",
            args.timeout
        );
        let polled = Instant::now();
        if let Some(s) = inbound(&n2.http).await {
            if connected.is_none() && s["connected"] == true {
                let ago = s["millis_since_connect"].as_u64().unwrap_or(0);
                connected = Some(polled - Duration::from_millis(ago));
            }
            let through = s["through_lsn"].as_u64().unwrap_or(0);
            if through >= loaded.last_lsn {
                break (s, polled);
            }
            if last_progress.elapsed() >= Duration::from_secs(1) {
                last_progress = Instant::now();
                eprintln!(
                    "catch-up [{mode}]: through LSN {through}/{}, {} transactions received",
                    loaded.last_lsn, s["transactions"]
                );
            }
        }
        tokio::time::sleep(POLL).await;
    };
    let connected = connected.context("n2 never reported its inbound stream connected")?;
    let catch_up = done_at.saturating_duration_since(connected);
    // The master's side: n2's acknowledged high-water for n1 reaches n1's own.
    let (http, origin, own) = (n1.http.clone(), loaded.n1_id.to_string(), loaded.own_seq);
    wait_for(
        Duration::from_secs(60),
        "n1 to see n2's high-water at its own",
        || {
            let (http, origin) = (http.clone(), origin.clone());
            async move {
                let v = http_json(&http, "/replication").await.ok()?;
                let out = v["outbound"].as_array()?.first()?.clone();
                (out["acked_applied"][&origin].as_u64()? >= own).then_some(())
            }
        },
    )
    .await?;
    let compare_started = Instant::now();
    let rows = compare_tables(&n1.grpc, &n2.grpc, args.value_bytes).await?;
    let compare = compare_started.elapsed();
    eprintln!(
        "catch-up [{mode}]: done in {:.3} s; tables equal ({rows} rows, compared in {:.1} s)",
        catch_up.as_secs_f64(),
        compare.as_secs_f64()
    );
    n2.terminate().await.context("stop n2")?;
    n1.terminate().await.context("stop n1")?;
    let n = |f: &str| inbound[f].as_u64().unwrap_or(0);
    Ok(json!({
        "mode": mode,
        "catch_up_seconds": catch_up.as_secs_f64(),
        "subscriber_start_to_caught_up_seconds": done_at.saturating_duration_since(launched).as_secs_f64(),
        "subscriber_ready_seconds": ready.as_secs_f64(),
        "poll_interval_ms": POLL.as_millis() as u64,
        "transactions_received": n("transactions"),
        "transactions_skipped": n("transactions_skipped"),
        "row_changes_received": n("row_changes"),
        "rows_written": n("rows_written"),
        "rows_written_compiled": n("rows_written_compiled"),
        "batches": n("batches"),
        "runs_compiled": n("runs_compiled"),
        "runs_in_order": n("runs_in_order"),
        "raw_bytes": n("raw_bytes"),
        "table_rows": rows,
        "tables_equal": true,
        "compare_seconds": compare.as_secs_f64(),
    }))
}

/// n2's inbound stream from n1, if n2 answers and has one.
async fn inbound(http: &str) -> Option<Json> {
    let v = http_json(http, "/replication").await.ok()?;
    v["inbound"].as_array()?.first().cloned()
}

/// The value an update writes: `i` as a number, or with `bytes` > 0, text of that many
/// bytes that starts with `i`.
fn value_of(bytes: u64, i: u64) -> Value {
    if bytes == 0 {
        return Value::Int(i as i64);
    }
    let mut text = i.to_string();
    text.extend(std::iter::repeat_n(
        'x',
        (bytes as usize).saturating_sub(text.len()),
    ));
    Value::Text(text)
}

/// Compares table t on both nodes page by page (pages of at most about 4 MiB when rows
/// are `value_bytes` long); returns the row count.
async fn compare_tables(a: &str, b: &str, value_bytes: u64) -> anyhow::Result<u64> {
    let page_rows = match value_bytes {
        0 => PAGE,
        n => ((4u64 << 20) / n).clamp(1, u64::from(PAGE)) as u32,
    };
    let mut ca = Client::connect(a).await?;
    let mut cb = Client::connect(b).await?;
    let mut start: Vec<Value> = Vec::new();
    let mut rows = 0u64;
    loop {
        let (page, _) = ca.scan("t", &start, &[], page_rows).await?;
        let Some(last) = page.last() else {
            let (rest, _) = cb.scan("t", &start, &[], 1).await?;
            ensure!(
                rest.is_empty(),
                "n2 has rows from {start:?} on that n1 has not: {:?}",
                rest.first()
            );
            return Ok(rows);
        };
        let Some(&Value::Int(k)) = last.first() else {
            bail!("unexpected key in {last:?}");
        };
        let end = vec![Value::Int(k + 1)];
        let (other, _) = cb.scan("t", &start, &end, page_rows + 1).await?;
        if other != page {
            let diff = page
                .iter()
                .zip(&other)
                .find(|(x, y)| x != y)
                .map(|(x, y)| format!("n1 {x:?}, n2 {y:?}"))
                .unwrap_or_else(|| format!("n1 {} rows, n2 {} rows", page.len(), other.len()));
            bail!("tables differ in keys {start:?}..={k}: {diff}");
        }
        rows += page.len() as u64;
        start = end;
    }
}

/// GET `path` on `addr` and parse the body as JSON (HTTP/1.0, connection closed by the
/// server), with a 10 s deadline.
async fn http_json(addr: &str, path: &str) -> anyhow::Result<Json> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(10), get)
        .await
        .context("HTTP deadline")??;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP body")?;
    ensure!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "GET {path}: {head}"
    );
    Ok(serde_json::from_str(body)?)
}

/// Copies a directory tree (the stopped nodes' data and logs).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

fn print_text(r: &Json) {
    let s = &r["settings"];
    let l = &r["load"];
    println!(
        "catchup: {} single-row {} ({} distinct keys), committed on the master while the subscriber was stopped",
        s["updates"],
        s["write"].as_str().unwrap_or(""),
        s["keys"]
    );
    println!(
        "  load      {} per transaction ({} transactions), {} clients, typed writes: {:.1} s, {:.0} updates/s",
        s["per_txn"],
        l["transactions"],
        s["clients"],
        l["seconds"].as_f64().unwrap_or(0.0),
        l["updates_per_second"].as_f64().unwrap_or(0.0)
    );
    println!(
        "  {:<11} {:>10} {:>9} {:>12} {:>12} {:>12} {:>9} {:>10}",
        "mode",
        "catch-up s",
        "txns",
        "row changes",
        "rows written",
        "written/chg",
        "batches",
        "runs c/o"
    );
    for m in r["modes"].as_array().into_iter().flatten() {
        let n = |f: &str| m[f].as_u64().unwrap_or(0);
        let (changes, written) = (n("row_changes_received"), n("rows_written"));
        println!(
            "  {:<11} {:>10.3} {:>9} {:>12} {:>12} {:>12.3} {:>9} {:>10}",
            m["mode"].as_str().unwrap_or(""),
            m["catch_up_seconds"].as_f64().unwrap_or(0.0),
            n("transactions_received"),
            changes,
            written,
            if changes > 0 {
                written as f64 / changes as f64
            } else {
                0.0
            },
            n("batches"),
            format!("{}/{}", n("runs_compiled"), n("runs_in_order")),
        );
    }
    let ratio = |f: &str| {
        r["compiled_vs_no_compile"][f]
            .as_f64()
            .map_or("-".to_string(), |v| format!("{v:.3}"))
    };
    println!(
        "  compiled / no-compile: catch-up time {}, rows written {}",
        ratio("catch_up_time"),
        ratio("rows_written")
    );
    println!(
        "  catch-up is timed from the subscriber accepting the stream to the first poll ({} ms) \
         that found the master's last LSN applied; tables compared equal in both modes",
        r["modes"][0]["poll_interval_ms"]
    );
}
