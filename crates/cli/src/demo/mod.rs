//! `hawser demo`: hawser's main job on an embedded default — a three-node cluster.
//!
//! Starts three nodes (`ds1`, `ds2`, `ds3`) as child processes of this same binary on
//! free loopback ports, with their data in a temporary directory (or `--data DIR`),
//! forms the Raft cluster, creates example tables and a replication scheme in the
//! TimesTen language, runs a short write workload on the master, waits for the
//! subscribers to catch up, and shows the cluster, the roles, the streams (lag,
//! acknowledged high-water, raw and wire bytes), the return services and a checksum of
//! every table on every node. With `--failover` it then SIGKILLs the master, times the
//! failover as a client sees it, starts the old master again and shows it rejoin
//! ([`failover`]). Then it opens the SQL shell against the master — or, with
//! `--exit-after`, prints the same summary as one JSON object on stdout and stops.
//!
//! ```text
//!   run ─► Demo { nodes, scheme, ... } ─► steps::STEPS in order ─► Summary::gather
//!    │                                                              ├─► tables (stdout)
//!    │                                                              ├─► JSON (--exit-after)
//!    │                                                              └─► SQL shell on ds1
//!    └─ SIGINT / SIGTERM / SIGHUP at any point ─► stop every node ─► exit
//! ```
//!
//! Every node is stopped on every path out: after the shell or the JSON, on an error,
//! on a signal (the nodes run in their own process group, so the demo stops them in
//! order), and — through [`node::ChildNode`]'s `Drop` — on a panic. Every wait has a
//! deadline. The module is split by concern: [`node`] (a child process), [`steps`]
//! (what happens, in order), [`scheme`] (the data and the scheme), [`summary`] (what is
//! shown), [`failover`] (the `--failover` drill), [`checksum`] and [`probe`] (how the
//! nodes are looked at).

mod checksum;
mod conflict;
mod failover;
mod history;
mod node;
mod probe;
mod scheme;
mod steps;
mod summary;

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use node::ChildNode;
use scheme::NODES;
use steps::STEPS;
use summary::Summary;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Keep the demo's data and node logs in DIR (new or empty) instead of a temporary
    /// directory; it is kept afterwards.
    #[arg(long = "data", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Print a JSON summary on stdout and stop instead of opening the SQL shell (the
    /// readable summary then goes to stderr).
    #[arg(long)]
    exit_after: bool,
    /// Commits in the demo write workload (one row each, on the master).
    #[arg(long, default_value_t = 2000)]
    writes: u32,
    /// After the summary, SIGKILL ds1 (the master of every element and the Raft
    /// leader): show how long until ds2 takes a write, start ds1 again and show it
    /// rejoin as a subscriber, and compare every copy. `--drill` says the same; for a
    /// drill under a verifying load on any cluster, see `hawser drill`.
    #[arg(long, alias = "drill")]
    failover: bool,
}

/// How long the nodes get to stop after SIGTERM before they are killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// What the write workload did.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Workload {
    pub(crate) node: String,
    pub(crate) table: String,
    pub(crate) commits: u64,
    pub(crate) writers: u32,
    pub(crate) seconds: f64,
    pub(crate) commits_per_sec: f64,
}

/// The demo's state, shared by the steps: the running nodes and what the steps found.
pub(crate) struct Demo {
    /// Where every node's data directory and log file are.
    pub(crate) root: PathBuf,
    pub(crate) writes: u32,
    /// The running nodes, in the order they started.
    pub(crate) nodes: Vec<ChildNode>,
    /// The scheme: the demo's text until the cluster's effective one is read back.
    pub(crate) scheme: hawser_scheme::Scheme,
    pub(crate) workload: Option<Workload>,
    /// Whether every stream acknowledged its sender's whole log.
    pub(crate) caught_up: bool,
    pub(crate) started: Instant,
    /// The store that masters the demo's tables now (ds1 until a failover).
    pub(crate) master: String,
    /// What the conflict step did.
    pub(crate) conflict: Option<conflict::ConflictReport>,
}

impl Demo {
    /// The running node named `name`.
    pub(crate) fn node(&self, name: &str) -> anyhow::Result<&ChildNode> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("{name} is not running"))
    }

    /// A progress line for the person watching (stderr, so stdout stays clean).
    pub(crate) fn progress(&self, line: &str) {
        eprintln!("{line}");
    }

    /// Runs the steps and the summary, then the shell or the JSON; returns the exit
    /// status.
    async fn play(&mut self, exit_after: bool, failover: bool) -> anyhow::Result<ExitCode> {
        for step in STEPS {
            self.progress(&step.describe(self));
            if let Err(e) = step.run(self).await {
                return Err(self.explain(e.context(format!("demo step {step:?}"))));
            }
        }
        let mut summary = Summary::gather(self).await;
        if failover {
            let report = failover::drill(self)
                .await
                .map_err(|e| self.explain(e.context("the failover drill")))?;
            summary.all_match &= report.copies_equal && report.load.lost_promised == 0;
            summary.failover = Some(report);
        }
        let text = summary.render();
        if exit_after {
            eprint!("{text}");
            println!(
                "{}",
                serde_json::to_string(&summary).context("serialize the summary")?
            );
            if !summary.all_match {
                bail!("the subscribers' tables differ from the master's (see CHECKSUMS)");
            }
            return Ok(ExitCode::SUCCESS);
        }
        print!("{text}");
        if !summary.all_match {
            eprintln!("warning: the subscribers' tables differ from the master's");
        }
        self.print_commands();
        self.shell().await
    }

    /// The addresses, as commands to run from another terminal.
    fn print_commands(&self) {
        let Ok(master) = self.node(&self.master) else {
            return;
        };
        // The HTTP port is TLS too: curl shows client root's certificate.
        let curl = "curl --cacert $HAWSER_CERTS_DIR/ca.crt --cert \
                    $HAWSER_CERTS_DIR/client.root.crt --key $HAWSER_CERTS_DIR/client.root.key";
        let mut commands = vec![(
            format!("hawser sql --host {}", master.grpc),
            format!("SQL on {}, the master", master.name),
        )];
        for n in &self.nodes {
            commands.push((
                format!("hawser status --host {}", n.grpc),
                format!("{}: members, Raft roles, schemes", n.name),
            ));
        }
        commands.push((
            format!("hawser scheme show --host {}", master.grpc),
            "the effective scheme".to_string(),
        ));
        commands.extend([
            (
                format!("{curl} https://{}/replication", master.http),
                "streams: state, lag, acked, bytes".to_string(),
            ),
            (
                format!("{curl} https://{}/metrics", master.http),
                "Prometheus metrics".to_string(),
            ),
        ]);
        let width = commands
            .iter()
            .filter(|(c, _)| !c.starts_with("curl"))
            .map(|(c, _)| c.len())
            .max()
            .unwrap_or(0);
        println!();
        println!(
            "The cluster runs while this shell is open (\\q or Ctrl-D leaves and stops it). \
             It runs secure: from another terminal, first"
        );
        println!(
            "  export HAWSER_CERTS_DIR={}  # its CA and client root's certificate",
            self.root.join(CERTS).display()
        );
        println!("then:");
        for (command, what) in &commands {
            println!("  {command:<width$}  # {what}");
        }
        println!();
        println!(
            "Write on {}: it masters every table, and the scheme carries what you write \
             to the others.",
            master.name
        );
        println!();
    }

    /// The SQL shell against the master, as `hawser sql --host ...` runs it; when
    /// standard input is not a terminal, the script it carries instead.
    async fn shell(&self) -> anyhow::Result<ExitCode> {
        let master = self.node(&self.master)?;
        let mut argv = vec![
            "hawser".to_string(),
            "sql".into(),
            "--host".into(),
            master.grpc.clone(),
        ];
        if !std::io::stdin().is_terminal() {
            argv.extend(["-e".into(), read_stdin().await?]);
        }
        let cli = <crate::Cli as clap::Parser>::try_parse_from(argv)?;
        match cli.command {
            crate::Command::Sql(sql) => crate::sql_cmd::run(sql).await,
            _ => bail!("internal: `hawser sql` parsed as another command"),
        }
    }

    /// Adds to a step's error the nodes that have exited, which is usually the cause.
    fn explain(&mut self, mut error: anyhow::Error) -> anyhow::Error {
        for n in &mut self.nodes {
            if let Some(status) = n.exit_status() {
                error = error.context(format!(
                    "{} exited ({status}); its log is {}",
                    n.name,
                    n.log.display()
                ));
            }
        }
        error
    }

    /// SIGTERM to every node, then waits (bounded) for each; SIGKILL for any still
    /// running at the deadline.
    async fn stop(&mut self) {
        if self.nodes.is_empty() {
            return;
        }
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        eprintln!("stopping {}…", names.join(", "));
        for n in &self.nodes {
            n.terminate();
        }
        let deadline = tokio::time::Instant::now() + STOP_TIMEOUT;
        for n in &mut self.nodes {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !n.wait_or_kill(left).await {
                eprintln!("  {} did not stop within {STOP_TIMEOUT:?}; killed", n.name);
            }
        }
        self.nodes.clear();
    }
}

/// The demo's certificates directory, in its data directory.
pub(crate) const CERTS: &str = "certs";

/// A CA, a node certificate for localhost and client root's, in `certs`.
fn make_certs(certs: &Path) -> anyhow::Result<()> {
    let issue = hawser_tls::Issue {
        certs_dir: certs.to_path_buf(),
        ca_key: certs.join(hawser_tls::CA_KEY),
        days: 30,
        overwrite: false,
    };
    issue.create_ca().context("make the demo's CA")?;
    issue
        .create_node("demo", &["localhost".into(), "127.0.0.1".into()])
        .context("make the demo's node certificate")?;
    issue
        .create_client(hawser_tls::DEFAULT_USER, hawser_tls::Role::Admin)
        .context("make the demo's client certificate")?;
    Ok(())
}

/// Runs `hawser demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let (mut tmp, root) = match &args.data_dir {
        Some(dir) => {
            prepare_data_dir(dir)?;
            (None, dir.clone())
        }
        None => {
            let tmp = tempfile::Builder::new()
                .prefix("hawser-demo-")
                .tempdir()
                .context("create a temporary directory")?;
            let root = tmp.path().to_path_buf();
            (Some(tmp), root)
        }
    };
    // The demo runs secure, as a real cluster should: a CA of its own, one node
    // certificate for its three nodes on loopback, and client root (admin), whose
    // certificate every connection of this process shows.
    let certs = root.join(CERTS);
    make_certs(&certs)?;
    hawser_client::set_default_tls(Some(
        hawser_tls::load_client(&certs, hawser_tls::DEFAULT_USER)
            .context("load the demo's client certificate")?,
    ));
    probe::use_tls(
        hawser_tls::http_client_config(&certs, Some(hawser_tls::DEFAULT_USER))
            .context("load the demo's client certificate")?,
    );
    // Listen for signals before any child exists, so none can be missed.
    let mut interrupts = Interrupts::new()?;
    eprintln!(
        "hawser demo: three nodes on loopback, data in {}",
        root.display()
    );
    let mut demo = Demo {
        root,
        writes: args.writes,
        nodes: Vec::new(),
        scheme: steps::parse_scheme(scheme::SCHEME)?,
        workload: None,
        caught_up: false,
        started,
        master: NODES[0].to_string(),
        conflict: None,
    };
    let outcome = tokio::select! {
        biased;
        signal = interrupts.recv() => Err(Stop::Signal(signal)),
        outcome = demo.play(args.exit_after, args.failover) => outcome.map_err(Stop::Failed),
    };
    demo.stop().await;
    match outcome {
        Ok(code) => Ok(code),
        Err(Stop::Signal(signal)) => {
            eprintln!("hawser demo: stopped by {signal}");
            Ok(ExitCode::from(130))
        }
        Err(Stop::Failed(e)) => {
            // Keep the logs for a look at what went wrong.
            if let Some(tmp) = &mut tmp {
                tmp.disable_cleanup(true);
            }
            eprintln!("the nodes' logs are in {}", demo.root.display());
            Err(e)
        }
    }
}

/// Why the demo ended early.
enum Stop {
    Signal(&'static str),
    Failed(anyhow::Error),
}

/// All of standard input. The read blocks, so it runs on a thread of its own that is
/// never joined: a signal must still end the demo while a pipe stays open, and neither
/// an async task nor tokio's blocking pool would let the runtime shut down under a read
/// that never returns.
async fn read_stdin() -> anyhow::Result<String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("demo-stdin".into())
        .spawn(move || {
            let mut script = String::new();
            let read = std::io::stdin().read_to_string(&mut script).map(|_| script);
            // The demo may have stopped waiting; then nobody needs the script.
            let _ = tx.send(read);
        })
        .context("start the thread reading standard input")?;
    rx.await
        .context("the thread reading standard input ended")?
        .context("read standard input")
}

/// `--data DIR` must be new or empty: the demo builds a new cluster on fresh ports, and
/// nodes restarted on old data would look for their old addresses.
fn prepare_data_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut entries = std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))?;
    if entries.next().is_some() {
        bail!(
            "--data {} is not empty; give the demo a new or empty directory",
            dir.display()
        );
    }
    Ok(())
}

/// The signals that stop the demo: SIGINT (Ctrl-C), SIGTERM and SIGHUP.
#[cfg(unix)]
struct Interrupts {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Interrupts {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Interrupts {
            interrupt: signal(SignalKind::interrupt()).context("listen for SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("listen for SIGTERM")?,
            hangup: signal(SignalKind::hangup()).context("listen for SIGHUP")?,
        })
    }

    /// Waits for the first of the signals; returns its name.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT (Ctrl-C)",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

/// Ctrl-C stops the demo.
#[cfg(not(unix))]
struct Interrupts;

#[cfg(not(unix))]
impl Interrupts {
    fn new() -> anyhow::Result<Self> {
        Ok(Interrupts)
    }

    async fn recv(&mut self) -> &'static str {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}
