//! `hawser start`: run one node in the foreground.
//!
//! Settings come from, lowest precedence first: built-in defaults, `--config FILE`
//! (TOML), `HAWSER_*` environment variables, flags. When the node is ready it prints one
//! line to stdout — `ready name=N node_id=I grpc=ADDR http=ADDR` — so scripts and tests
//! that start it on port 0 learn the bound addresses; logs go to stderr.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use hawser_node::{CompressCodec, CpuClass, HugePages, NodeConfig};
use metrics_exporter_prometheus::Matcher;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Bucket bounds, in seconds, of every `*_seconds` histogram on `/metrics` (commit,
/// flush, Raft RPC times). Histograms rather than the exporter's default summaries: a
/// summary's quantiles are one node's, over a sliding window, and cannot be combined,
/// while bucket counts add up across nodes and over any range (`histogram_quantile` in
/// PromQL). From 50 µs to 10 ms, where commits and flushes fall, neighbouring bounds
/// are at most a third apart (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8 per decade), so a
/// p99 read from them is that close too; coarser up to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_06, 0.000_08, //
    0.000_1, 0.000_125, 0.000_15, 0.000_2, 0.000_25, 0.000_3, 0.000_4, 0.000_5, 0.000_6, 0.000_8,
    0.001, 0.001_25, 0.001_5, 0.002, 0.002_5, 0.003, 0.004, 0.005, 0.006, 0.008, //
    0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Args, Debug)]
pub struct StartArgs {
    /// TOML file with node settings (keys as in `NodeConfig`: name, listen, http,
    /// data_dir, durable_commits, lock_timeout, max_message_bytes, max_sessions,
    /// max_requests, statement_timeout, certs_dir, insecure, join, replace, advertise,
    /// raft_heartbeat,
    /// raft_election_min, raft_election_max, raft_snapshot_every,
    /// raft_log_keep, report_interval, master_lease, failover_timeout, auto_failover,
    /// failover_max_lag, compile, compile_threshold_txns, compile_threshold_bytes,
    /// apply_slice, log_file_size, log_keep_bytes, min_free_bytes, compress_codec, threads,
    /// cpu_class, transparent_huge_pages, boot_id).
    #[arg(long, env = "HAWSER_CONFIG")]
    config: Option<PathBuf>,
    /// Store name replication schemes use for this node [default: hawser].
    #[arg(long, env = "HAWSER_NAME")]
    name: Option<String>,
    /// gRPC listen address; port 0 picks a free port [default: 127.0.0.1:7420].
    #[arg(long, env = "HAWSER_LISTEN")]
    listen: Option<SocketAddr>,
    /// HTTP address for /healthz, /readyz, /metrics, /status [default: 127.0.0.1:7421].
    #[arg(long, env = "HAWSER_HTTP")]
    http: Option<SocketAddr>,
    /// Data directory, created if missing [default: ./hawser-data].
    #[arg(long = "data", env = "HAWSER_DATA")]
    data_dir: Option<PathBuf>,
    /// Whether commits wait for their flush to disk (TimesTen's DurableCommits). With
    /// false, a crash of this process can lose the newest commits (up to about a
    /// second), never ones a subscriber already has (they are written to the log before
    /// they are shipped); a crash of the machine can lose shipped ones too, and the node
    /// then pauses its writes until its subscribers are checked (docs/stream.md,
    /// restart fence) [default: true].
    #[arg(long, env = "HAWSER_DURABLE_COMMITS")]
    durable_commits: Option<bool>,
    /// How long a transaction waits for a row lock, e.g. 10s or 500ms [default: 10s].
    #[arg(long, env = "HAWSER_LOCK_TIMEOUT", value_parser = humantime::parse_duration)]
    lock_timeout: Option<Duration>,
    /// Largest gRPC message accepted, in bytes [default: 16777216].
    #[arg(long, env = "HAWSER_MAX_MESSAGE_BYTES")]
    max_message_bytes: Option<usize>,
    /// Interactive sessions (`hawser sql` shells, Client.Session streams) open at once at
    /// most; one more is refused (RESOURCE_EXHAUSTED, SQLSTATE 53300) until one ends
    /// [default: 1000].
    #[arg(long, env = "HAWSER_MAX_SESSIONS")]
    max_sessions: Option<u32>,
    /// Client calls (Execute, Write, Read, Scan, session opens, ...) handled at once at
    /// most; one more is refused at once (RESOURCE_EXHAUSTED, SQLSTATE 53300), not queued.
    /// Admin calls have a bound of their own [default: 1000].
    #[arg(long, env = "HAWSER_MAX_REQUESTS")]
    max_requests: Option<u32>,
    /// Run without TLS and without checking callers: anyone who reaches the gRPC port
    /// may do anything, peer calls included. A node refuses to start without either
    /// this or --certs-dir (ca.crt, node.crt, node.key; see `hawser cert`).
    #[arg(long, env = "HAWSER_INSECURE", value_parser = clap::builder::FalseyValueParser::new())]
    insecure: bool,
    /// How long one SQL statement may run, e.g. 30s; one that runs longer fails with
    /// SQLSTATE 57014 and is undone. 0 sets no bound; a call's gRPC deadline also bounds
    /// its statements [default: 0].
    #[arg(long, env = "HAWSER_STATEMENT_TIMEOUT", value_parser = humantime::parse_duration)]
    statement_timeout: Option<Duration>,
    /// Cluster members to join through, HOST:PORT of their gRPC servers, comma-separated;
    /// the node keeps trying until one admits it. Leave out on the first node and run
    /// `hawser init` on it instead.
    #[arg(long, env = "HAWSER_JOIN", value_delimiter = ',')]
    join: Option<Vec<String>>,
    /// Joining, take the place of a member the cluster registers under this node's
    /// --name once the Raft leader has heard nothing from it for the failover timeout
    /// (at least 10 report intervals): the old node is removed, its store kept in the
    /// schemes, and this one receives the store's data. For a node restarted on an empty
    /// data directory where only one process can hold a name (a StatefulSet pod). Never
    /// replaces a node that still masters or propagates an element: failover moves that
    /// role first.
    #[arg(long, env = "HAWSER_REPLACE", value_parser = clap::builder::FalseyValueParser::new())]
    replace: bool,
    /// The gRPC HOST:PORT peers and clients should use for this node [default: the bound
    /// gRPC address]. Needed when listening on 0.0.0.0 or behind NAT.
    #[arg(long, env = "HAWSER_ADVERTISE")]
    advertise: Option<String>,
    /// Raft leader heartbeat interval, e.g. 100ms [default: 100ms].
    #[arg(long, env = "HAWSER_RAFT_HEARTBEAT", value_parser = humantime::parse_duration)]
    raft_heartbeat: Option<Duration>,
    /// Raft election timeout, lower bound; must exceed the heartbeat [default: 300ms].
    #[arg(long, env = "HAWSER_RAFT_ELECTION_MIN", value_parser = humantime::parse_duration)]
    raft_election_min: Option<Duration>,
    /// Raft election timeout, upper bound [default: 600ms].
    #[arg(long, env = "HAWSER_RAFT_ELECTION_MAX", value_parser = humantime::parse_duration)]
    raft_election_max: Option<Duration>,
    /// Build a Raft snapshot every this many applied entries [default: 1000].
    #[arg(long, env = "HAWSER_RAFT_SNAPSHOT_EVERY")]
    raft_snapshot_every: Option<u64>,
    /// Raft log entries kept behind a snapshot for followers slightly behind; 0 purges
    /// the log at every snapshot [default: 1000].
    #[arg(long, env = "HAWSER_RAFT_LOG_KEEP")]
    raft_log_keep: Option<u64>,
    /// How often this node reports its liveness and high-water marks to the Raft
    /// leader, which renews its master lease in answer [default: 100ms].
    #[arg(long, env = "HAWSER_REPORT_INTERVAL", value_parser = humantime::parse_duration)]
    report_interval: Option<Duration>,
    /// How long a master lease lasts from when the master asked for it: a master cut
    /// off from the Raft leader's quorum stops taking writes (SQLSTATE 57P03) within
    /// this long. At least twice the report interval [default: 500ms].
    #[arg(long, env = "HAWSER_MASTER_LEASE", value_parser = humantime::parse_duration)]
    master_lease: Option<Duration>,
    /// A master the Raft leader has not heard from for this long is failed over to its
    /// most up-to-date live subscriber (RETURN TWOSAFE / RECEIPT subscribers first). At
    /// least the master lease plus the report interval [default: 1s].
    #[arg(long, env = "HAWSER_FAILOVER_TIMEOUT", value_parser = humantime::parse_duration)]
    failover_timeout: Option<Duration>,
    /// Whether this node, while it leads the Raft group, fails silent masters over
    /// automatically; false only reports them (hawser status) [default: true].
    #[arg(long, env = "HAWSER_AUTO_FAILOVER")]
    auto_failover: Option<bool>,
    /// Do not promote a subscriber that trails the silent master by more than this
    /// many of its transactions; 0 sets no limit [default: 0].
    #[arg(long, env = "HAWSER_FAILOVER_MAX_LAG", value_name = "TRANSACTIONS")]
    failover_max_lag: Option<u64>,
    /// TimesTen's LogFileSize, the unit of a scheme's FAILTHRESHOLD: a master marks a
    /// subscriber FAILED once the log it has not acknowledged exceeds FAILTHRESHOLD ×
    /// this many bytes [default: 67108864].
    #[arg(long, env = "HAWSER_LOG_FILE_SIZE", value_name = "BYTES")]
    log_file_size: Option<u64>,
    /// Bytes of commit log kept even when no stream needs them (recent history for a
    /// subscriber added later); older log is released once every receiver in START or
    /// PAUSE state has acknowledged it. Receivers in STOP or FAILED state do not hold
    /// log: one that missed released log needs a duplicate [default: 67108864].
    #[arg(long, env = "HAWSER_LOG_KEEP_BYTES", value_name = "BYTES")]
    log_keep_bytes: Option<u64>,
    /// Free space kept on the data directory's volume: below it the node refuses writes
    /// — its own commits and DDL (SQLSTATE 53100, "disk full") and what its receiver
    /// would apply (the sender retries) — until there is room again; reads go on.
    /// Checked four times a second; 0 turns the check off [default: 67108864].
    #[arg(long, env = "HAWSER_MIN_FREE_BYTES", value_name = "BYTES")]
    min_free_bytes: Option<u64>,
    /// How this node compresses what it sends where a replication scheme says STORE
    /// <this store> COMPRESS TRAFFIC ON: lz4 (fast) or zstd (at level 3, or zstd:LEVEL
    /// from 1 to 19; on hawser bench's rows a third fewer bytes than lz4, for a few µs
    /// more of this node's CPU per commit; for links where bandwidth is dear). Receivers
    /// read either [default: lz4].
    #[arg(long, env = "HAWSER_COMPRESS_CODEC", value_name = "lz4|zstd[:LEVEL]", value_parser = parse_codec)]
    compress_codec: Option<CompressCodec>,
    /// Async worker threads: 0 runs one per CPU core; 1 runs the node on a single
    /// thread, which flushes a receiver's applies inline (fewer thread wake-ups per
    /// replicated commit; suits subscribers and nodes sharing a small machine)
    /// [default: 0].
    #[arg(long, env = "HAWSER_THREADS", value_name = "N")]
    threads: Option<usize>,
    /// CPU scheduling class of the node's threads: normal, or idle (Linux's SCHED_IDLE:
    /// they run only on CPU time that normal-class threads of the same cgroup leave).
    /// For an asynchronous subscriber sharing cores with its master, such as a
    /// reporting replica: the master's commits do not wait for cores it holds, and it
    /// lags while the machine is busy. The kernel weighs it against threads of its own
    /// cgroup only: nodes started from one shell or by `hawser demo` share one, but
    /// separate systemd services or containers do not — make such a node's cgroup idle
    /// instead (systemd CPUWeight=idle, cgroup v2 cpu.idle). Not for a master, a
    /// propagator or a subscriber a return service waits on, whose delays become commit
    /// latency; a node in the idle class stays there until it exits [default: normal].
    #[arg(long, env = "HAWSER_CPU_CLASS", value_name = "normal|idle", value_parser = parse_cpu_class)]
    cpu_class: Option<CpuClass>,
    /// Transparent huge pages for the node's memory: off (the process opts out, as
    /// Redis does by default and Oracle advises) or system (the machine's
    /// /sys/kernel/mm/transparent_hugepage setting applies). A huge page is 2 MiB
    /// zeroed in one page fault — on a virtual machine whose host backs memory lazily,
    /// a fault that stalled a node's thread, and every commit waiting on it, for 5–6 ms
    /// [default: off].
    #[arg(
        long,
        env = "HAWSER_TRANSPARENT_HUGE_PAGES",
        value_name = "off|system",
        value_parser = parse_huge_pages
    )]
    transparent_huge_pages: Option<HugePages>,
    /// Stand in for the machine's boot id, which the store compares at every open to
    /// tell a restart of the process from one of the machine (after which this node's
    /// own writes wait until its return-service subscribers report what they hold).
    /// For drills that rehearse a machine crash; leave unset otherwise.
    #[arg(long, env = "HAWSER_BOOT_ID", hide = true)]
    boot_id: Option<String>,
    /// Open a store whose write-ahead log is damaged (the node refused to start with
    /// XX001 "damaged write-ahead log") by cutting the log before the damage: the
    /// frames from the damage on are copied into db/wal/salvaged-<time>/ and taken out
    /// (the tables keep what was checkpointed before; commits only in those frames are
    /// lost here, and their log records with them), and the node counts as restarted —
    /// a subscriber holding more of its commits is never streamed to again until it is
    /// rebuilt (`hawser duplicate`); rebuild subscribers that were behind, too. Prefer
    /// restoring the directory or rebuilding the node from a peer.
    #[arg(long, env = "HAWSER_SALVAGE", value_parser = clap::builder::FalseyValueParser::new())]
    salvage: bool,
    /// Let `hawser drill` crash or pause this node through the Admin.Fault RPC (off by
    /// default: anyone who reaches the gRPC port could stop the node). A crash re-runs
    /// the node on the same data and arguments after the drill's down time, in the same
    /// process.
    #[arg(long, env = "HAWSER_ALLOW_FAULTS", value_parser = clap::builder::FalseyValueParser::new())]
    allow_faults: bool,
    #[command(flatten)]
    compile: CompileArgs,
    /// Stop cleanly when the process that started this one goes away, even if it was
    /// SIGKILLed (for supervisors such as `hawser demo`; checked twice a second).
    #[arg(long)]
    exit_with_parent: bool,
    /// Log format on stderr.
    #[arg(long, env = "HAWSER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter (tracing env-filter syntax), e.g. info or hawser_store=debug.
    #[arg(long, env = "HAWSER_LOG", default_value = "info")]
    log: String,
}

/// How this node's receiver applies what it receives: when it compiles it (RTL net
/// rows), and how it paces it.
#[derive(Args, Debug)]
#[command(next_help_heading = "Receiver apply")]
struct CompileArgs {
    /// A receiver that is behind compiles its backlog (the batch it read plus those
    /// queued behind it) into RTL net row operations, written as one batch, once the
    /// backlog holds this many transactions (one full sender batch: a receiver that is
    /// current gets smaller ones, which log order applies with less CPU) [default: 512].
    #[arg(long, env = "HAWSER_COMPILE_THRESHOLD_TXNS", value_name = "N")]
    compile_threshold_txns: Option<u64>,
    /// A receiver's backlog of this many bytes (uncompressed) is compiled too, however
    /// few transactions it holds [default: 1048576, one full sender batch].
    #[arg(long, env = "HAWSER_COMPILE_THRESHOLD_BYTES", value_name = "BYTES")]
    compile_threshold_bytes: Option<u64>,
    /// Never compile: this node's receiver applies every batch in log order, however
    /// far behind it is (TOML: compile = false) [default: compile].
    #[arg(long, env = "HAWSER_NO_COMPILE", value_parser = clap::builder::FalseyValueParser::new())]
    no_compile: bool,
    /// A receiver applying a stream no return service waits on, while it is not behind,
    /// sleeps briefly (~50-70 µs) after about this much time of apply work, so that
    /// work woken on its core (the master or clients on the same host) runs without
    /// waiting for the whole batch; 0s applies in one go. A catch-up is never paced
    /// [default: 60us].
    #[arg(long, env = "HAWSER_APPLY_SLICE", value_parser = humantime::parse_duration, value_name = "DURATION")]
    apply_slice: Option<Duration>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl StartArgs {
    /// Layers file, environment and flags over the defaults.
    /// The node's configuration; `certs_dir` is the global `--certs-dir`.
    pub fn config(&self, certs_dir: Option<&std::path::Path>) -> anyhow::Result<NodeConfig> {
        let mut c = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("read config file {}", path.display()))?;
                NodeConfig::from_toml(&text)
                    .with_context(|| format!("config file {}", path.display()))?
            }
            None => NodeConfig::default(),
        };
        if let Some(v) = &self.name {
            c.name = v.clone();
        }
        if let Some(v) = self.listen {
            c.listen = v;
        }
        if let Some(v) = self.http {
            c.http = v;
        }
        if let Some(v) = &self.data_dir {
            c.data_dir = v.clone();
        }
        if let Some(v) = self.durable_commits {
            c.durable_commits = v;
        }
        if let Some(v) = self.lock_timeout {
            c.lock_timeout = v;
        }
        if let Some(v) = self.max_message_bytes {
            c.max_message_bytes = v;
        }
        if let Some(v) = self.max_sessions {
            c.max_sessions = v;
        }
        if let Some(v) = self.max_requests {
            c.max_requests = v;
        }
        c.insecure |= self.insecure;
        c.replace |= self.replace;
        if let Some(v) = self.statement_timeout {
            c.statement_timeout = v;
        }
        if let Some(v) = &self.join {
            c.join = v
                .iter()
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty())
                .collect();
        }
        if let Some(v) = &self.advertise {
            c.advertise = Some(v.clone());
        }
        if let Some(v) = self.raft_heartbeat {
            c.raft_heartbeat = v;
        }
        if let Some(v) = self.raft_election_min {
            c.raft_election_min = v;
        }
        if let Some(v) = self.raft_election_max {
            c.raft_election_max = v;
        }
        if let Some(v) = self.raft_snapshot_every {
            c.raft_snapshot_every = v;
        }
        if let Some(v) = self.raft_log_keep {
            c.raft_log_keep = v;
        }
        if let Some(v) = self.report_interval {
            c.report_interval = v;
        }
        if let Some(v) = self.master_lease {
            c.master_lease = v;
        }
        if let Some(v) = self.failover_timeout {
            c.failover_timeout = v;
        }
        if let Some(v) = self.auto_failover {
            c.auto_failover = v;
        }
        if let Some(v) = self.failover_max_lag {
            c.failover_max_lag = v;
        }
        if let Some(v) = self.compile.compile_threshold_txns {
            c.compile_threshold_txns = v;
        }
        if let Some(v) = self.compile.compile_threshold_bytes {
            c.compile_threshold_bytes = v;
        }
        if self.compile.no_compile {
            c.compile = false;
        }
        if let Some(v) = self.compile.apply_slice {
            c.apply_slice = v;
        }
        if let Some(v) = self.log_file_size {
            c.log_file_size = v;
        }
        if let Some(v) = self.log_keep_bytes {
            c.log_keep_bytes = v;
        }
        if let Some(v) = self.min_free_bytes {
            c.min_free_bytes = v;
        }
        if let Some(v) = self.compress_codec {
            c.compress_codec = v;
        }
        if let Some(v) = self.threads {
            c.threads = v;
        }
        if let Some(v) = self.cpu_class {
            c.cpu_class = v;
        }
        if let Some(v) = self.transparent_huge_pages {
            c.transparent_huge_pages = v;
        }
        if let Some(v) = &self.boot_id {
            c.boot_id = Some(v.clone());
        }
        if self.salvage {
            c.salvage = true;
        }
        c.allow_faults = self.allow_faults;
        if let Some(dir) = certs_dir {
            c.certs_dir = Some(dir.to_path_buf());
        }
        c.validate()?;
        Ok(c)
    }
}

fn parse_cpu_class(s: &str) -> Result<CpuClass, String> {
    s.parse().map_err(|e: hawser_node::ConfigError| e.0)
}

fn parse_huge_pages(s: &str) -> Result<HugePages, String> {
    s.parse().map_err(|e: hawser_node::ConfigError| e.0)
}

fn parse_codec(s: &str) -> Result<CompressCodec, String> {
    s.parse().map_err(|e: hawser_node::ConfigError| e.0)
}

fn init_logging(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .with_context(|| format!("bad log filter {filter:?}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// Runs the node of `config` (from [`StartArgs::config`]; the runtime it runs on was
/// built for its `threads`).
pub async fn run(args: StartArgs, config: NodeConfig) -> anyhow::Result<ExitCode> {
    init_logging(args.log_format, &args.log)?;
    info!(
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        cpu_class = config.cpu_class.as_str(),
        transparent_huge_pages = config.transparent_huge_pages.as_str(),
        "async runtime started"
    );
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .context("set the latency histogram buckets")?
        .install_recorder()
        .context("install the metrics recorder")?;
    let grpc = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("bind gRPC address {}", config.listen))?;
    let http = TcpListener::bind(config.http)
        .await
        .with_context(|| format!("bind HTTP address {}", config.http))?;
    let (grpc_addr, http_addr) = (grpc.local_addr()?, http.local_addr()?);

    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutdown requested");
        signals.cancel();
    });

    if args.exit_with_parent {
        tokio::spawn(exit_with_parent(shutdown.clone()));
    }

    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let name = config.name.clone();
    tokio::spawn(async move {
        if let Ok(node_id) = ready_rx.await {
            // Whoever read the first start's line may be gone (a drill's crash restarts
            // the node in the same process, on the same stdout): a closed stdout must
            // not stop the node, so the error is ignored.
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "ready name={name} node_id={node_id} grpc={grpc_addr} http={http_addr}"
            )
            .and_then(|()| out.flush());
        }
    });
    // What this process connects to through the client library on its own (a drill's
    // calls to other nodes) it does as this node.
    if let Some(dir) = &config.certs_dir {
        let tls = hawser_tls::load_node(dir).context("certificates")?;
        hawser_client::set_default_tls(Some(tls.peer));
    }
    hawser_node::run(config, grpc, http, Some(metrics), shutdown, Some(ready_tx)).await?;
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
/// Cancels `shutdown` once this process's parent has gone: an orphan is adopted by
/// init or a subreaper, so its parent id changes.
#[cfg(unix)]
async fn exit_with_parent(shutdown: CancellationToken) {
    let parent = std::os::unix::process::parent_id();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if std::os::unix::process::parent_id() != parent {
            info!(parent, "the parent process is gone; shutting down");
            shutdown.cancel();
            return;
        }
    }
}

#[cfg(not(unix))]
async fn exit_with_parent(_shutdown: CancellationToken) {
    tracing::warn!("--exit-with-parent is only supported on Unix; ignored");
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
