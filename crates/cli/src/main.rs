//! `hawser`: one binary for running a node and for talking to one.
//!
//! Each subcommand lives in its own module; this file only parses the command line,
//! sets up logging, runs the chosen command and turns its outcome into an exit status.

mod bench;
mod cert_cmd;
mod cluster_cmd;
mod demo;
mod drill_cmd;
mod duplicate_cmd;
mod failover_cmd;
mod os;
mod output;
mod rtl_cmd;
mod schedule;
mod scheme_cmd;
mod sql_cmd;
mod start;
mod status;
mod switchover_cmd;
mod wait_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// hawser: a consensus-managed database replication cluster.
///
/// Every node runs `hawser start`: a gRPC agent with an embedded database of typed tables.
/// The other commands talk to a running node (`--host HOST:PORT`, or HAWSER_HOST).
#[derive(Parser, Debug)]
#[command(
    name = "hawser",
    version,
    propagate_version = true,
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The certificates directory (`hawser cert`): a node reads ca.crt, node.crt and
    /// node.key there; a client command ca.crt and client.USER.crt / .key, and connects
    /// with TLS. Without it, clients connect in plain HTTP/2 (to a node started with
    /// --insecure).
    #[arg(long, global = true, env = "HAWSER_CERTS_DIR")]
    certs_dir: Option<std::path::PathBuf>,
    /// The user a client command connects as: its certificate is client.USER.crt in
    /// --certs-dir.
    #[arg(long, global = true, env = "HAWSER_USER", default_value = hawser_tls::DEFAULT_USER)]
    user: String,
    /// A token (`hawser cert create-token`) a client command shows instead of a client
    /// certificate; --certs-dir then needs only ca.crt, to check the node by.
    #[arg(long, global = true, env = "HAWSER_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node in the foreground until SIGTERM or Ctrl-C.
    Start(Box<start::StartArgs>),
    /// Run SQL against a node: statements with -e, a file with -f, or an interactive shell.
    Sql(sql_cmd::SqlArgs),
    /// Show what a node knows about itself and the cluster.
    Status(status::StatusArgs),
    /// Bootstrap the cluster on one node (once; running it again changes nothing).
    Init(cluster_cmd::InitArgs),
    /// Manage cluster members.
    Node(cluster_cmd::NodeArgs),
    /// Set a subscriber's receiver state: start, pause or stop (TimesTen's ttRepAdmin
    /// -receiver -state). Masters send nothing to a paused or stopped subscriber.
    Receiver(cluster_cmd::ReceiverArgs),
    /// Enable or disable a subscriber's return service (RETURN RECEIPT / TWOSAFE):
    /// disabled, commits do not wait for it and it is sent to asynchronously.
    ReturnService(cluster_cmd::ReturnServiceArgs),
    /// Measure commit throughput and latency with a single-row upsert workload.
    Bench(bench::BenchArgs),
    /// Start a local three-node cluster (ds1, ds2, ds3) under a TimesTen replication
    /// scheme, replicate example data, show what happened, open a SQL shell.
    Demo(demo::DemoArgs),
    /// Replication schemes (TimesTen CREATE/ALTER/DROP REPLICATION): check and format
    /// offline, show the cluster's.
    Scheme(scheme_cmd::SchemeArgs),
    /// Sybase RTL net-row compilation of DML runs, offline.
    Rtl(rtl_cmd::RtlArgs),
    /// Rebuild or seed a subscriber from another store: copy the tables and sequences it
    /// receives, then start its receiver again (TimesTen's ttRepAdmin -duplicate).
    ///
    /// For a subscriber whose master released log it still needed (`log_released` in
    /// `hawser status`: it was in STOP or FAILED state, or fell past FAILTHRESHOLD), or
    /// a new one to seed. Its receiver state must be STOP or FAILED; set it with `hawser
    /// receiver ... --state stop` first if it is not. The source decides what is copied:
    /// what the scheme routes to the subscriber as the source plans it (a DATASTORE
    /// element's tables and sequences as the source has them, INCLUDE / EXCLUDE
    /// honoured). The source keeps committing during the copy: the streams resume from
    /// the point the copy began and re-apply what followed, which converges on the
    /// source's rows. The subscriber's rows of those tables become the source's, and only
    /// the rows that differ are written; a table or sequence it lacks is created as the
    /// source has it, and sequences move at least as far ahead as the source's. One
    /// scheme, and a subscriber that relays nothing to others. A failure leaves the
    /// receiver stopped: run it again.
    Duplicate(duplicate_cmd::DuplicateArgs),
    /// Move the master role of every element a store masters in a scheme to one of their
    /// subscribers, losing nothing (a planned switchover: `ALTER REPLICATION s ALTER
    /// ELEMENT * IN from SET MASTER to`): the old master takes no new transaction,
    /// finishes those under way and gives its lease up, the new one gets every commit,
    /// then the role moves. Checked first (the target subscribes to every element and
    /// the Raft leader hears from it); prints how long it took, the bound of the write
    /// pause.
    Switchover(switchover_cmd::SwitchoverArgs),
    /// Run a failover drill on a live cluster: crash or pause an element's master, crash
    /// the Raft leader, or switch over and back, under a verifying load; report the time
    /// to a new master, the write window clients saw, and whether anything acknowledged
    /// was lost or two masters ever took writes. Exit 1 when a promise broke.
    Drill(drill_cmd::DrillArgs),
    /// Pause, resume or show automatic failover for the whole cluster (Patroni's
    /// maintenance mode): paused, silent masters are reported, not replaced.
    Failover(failover_cmd::FailoverArgs),
    /// Make the certificates a secure cluster runs with: its CA, node certificates,
    /// client certificates with a role.
    Cert(cert_cmd::CertArgs),
    /// Wait until subscribers have acknowledged everything a master committed so far
    /// (TimesTen's ttRepAdmin -wait); exit 1 if they do not within --timeout.
    Wait(wait_cmd::WaitArgs),
    /// The restart half of a drill's crash (`Admin.Fault`): waits, then runs the node
    /// again with the arguments after `--`. Run by a node, not by hand.
    #[command(name = "internal-restart", hide = true)]
    InternalRestart(InternalRestartArgs),
    /// The end of a drill's pause (`Admin.Fault`): waits, then continues the paused
    /// node. Run by a node, not by hand.
    #[command(name = "internal-resume", hide = true)]
    InternalResume(InternalResumeArgs),
}

#[derive(clap::Args, Debug)]
struct InternalRestartArgs {
    #[arg(long)]
    after_ms: u64,
    /// The node's own arguments.
    #[arg(last = true)]
    node_args: Vec<std::ffi::OsString>,
}

#[derive(clap::Args, Debug)]
struct InternalResumeArgs {
    #[arg(long)]
    pid: i32,
    #[arg(long)]
    after_ms: u64,
}

/// mimalloc instead of glibc's malloc: a node allocates and frees small buffers on
/// every commit on several threads (decoded requests, batches, log records), and
/// glibc's arenas cost a measurable share of its CPU there (docs/performance.md,
/// "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The async runtime: `threads` workers, 0 = one per CPU core, 1 = the calling thread
/// alone (tokio's current-thread scheduler: no hand-offs between workers at all).
fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        0 => tokio::runtime::Builder::new_multi_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    builder.enable_all().build()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A drill's fault helpers: no runtime, nothing else.
    match &cli.command {
        Command::InternalRestart(a) => {
            let after = std::time::Duration::from_millis(a.after_ms);
            let e = hawser_node::fault::restart_after(after, &a.node_args);
            eprintln!("error: cannot start the node again after a drill's crash: {e}");
            return ExitCode::FAILURE;
        }
        Command::InternalResume(a) => {
            let after = std::time::Duration::from_millis(a.after_ms);
            return match hawser_node::fault::resume_after(a.pid, after) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    // A node's configuration says how many threads its runtime has, so it is read
    // before the runtime starts, and so is bench's; every other command runs one per
    // core.
    let (threads, start_config) = match &cli.command {
        Command::Start(args) => match args.config(cli.certs_dir.as_deref()) {
            Ok(c) => (c.threads, Some(c)),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::FAILURE;
            }
        },
        // The load generator: few threads, so that it takes little of the CPU the
        // nodes it measures share on a small machine (see `bench --threads`).
        Command::Bench(args) => (args.worker_threads(), None),
        _ => (0, None),
    };
    // A client command piped into a reader that stops early ends quietly; a node (and
    // the demo, which supervises nodes) must outlive any one reader.
    if !matches!(cli.command, Command::Start(_) | Command::Demo(_)) {
        os::end_quietly_when_stdout_closes();
    }
    // Before any thread starts, so that every thread of the node inherits the class.
    if start_config
        .as_ref()
        .is_some_and(|c| c.cpu_class == hawser_node::CpuClass::Idle)
    {
        if let Err(e) = os::enter_idle_class() {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    // Before the runtime and the store allocate, so that none of the node's memory
    // comes in huge pages. A kernel without the setting still runs the node.
    if start_config
        .as_ref()
        .is_some_and(|c| c.transparent_huge_pages == hawser_node::HugePages::Off)
    {
        if let Err(e) = os::disable_transparent_huge_pages() {
            eprintln!("warning: {e}; the machine's setting applies");
        }
    }
    // Every connection a client command makes, however deep in a library, shows the
    // user's certificate (a node loads its own; the demo makes its own CA).
    if !matches!(
        cli.command,
        Command::Start(_) | Command::Demo(_) | Command::Cert(_)
    ) {
        if let Some(token) = &cli.token {
            let Some(dir) = &cli.certs_dir else {
                eprintln!(
                    "error: --token goes over TLS only: give --certs-dir with the cluster's ca.crt"
                );
                return ExitCode::FAILURE;
            };
            let loaded = hawser_tls::load_token_client(dir).map_err(|e| e.to_string());
            let set = loaded.and_then(|tls| {
                hawser_client::set_default_tls(Some(tls));
                hawser_client::set_default_token(Some(token.trim().to_string()))
                    .map_err(|e| e.to_string())
            });
            if let Err(e) = set {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        } else if let Some(dir) = &cli.certs_dir {
            match hawser_tls::load_client(dir, &cli.user) {
                Ok(tls) => hawser_client::set_default_tls(Some(tls)),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    if let Command::Cert(args) = cli.command {
        return match cert_cmd::run(args, cli.certs_dir.as_deref()) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match runtime(threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Start(args) => {
                let config = start_config.expect("read above for start");
                start::run(*args, config).await
            }
            Command::Sql(args) => sql_cmd::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Init(args) => cluster_cmd::init(args).await,
            Command::Node(args) => cluster_cmd::node(args).await,
            Command::Receiver(args) => cluster_cmd::receiver(args).await,
            Command::ReturnService(args) => cluster_cmd::return_service(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Scheme(args) => scheme_cmd::run(args).await,
            Command::Rtl(args) => rtl_cmd::run(args).await,
            Command::Wait(args) => wait_cmd::run(args).await,
            Command::Duplicate(args) => duplicate_cmd::run(args).await,
            Command::Switchover(args) => switchover_cmd::run(args).await,
            Command::Drill(args) => drill_cmd::run(args).await,
            Command::Failover(args) => failover_cmd::run(args).await,
            Command::InternalRestart(_) | Command::InternalResume(_) | Command::Cert(_) => {
                unreachable!("run before the runtime")
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) if os::is_closed_stdout(&e) => os::die_of_sigpipe(),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
