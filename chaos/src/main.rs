//! `hawser-chaos`: fault-injection drills against a cluster of real `hawser` processes on
//! loopback.
//!
//! `leader-kill` measures how long the control plane is without a leader that accepts
//! replication DDL after the Raft leader is SIGKILLed: start three nodes, then per trial
//! find the leader, `kill -9` it, and time until CREATE REPLICATION through a surviving
//! node commits; restart the killed node on its data directory, wait until it has caught
//! up, and go again. Every wait is bounded; every process is killed on the way out.
//!
//! `catchup` ([`catchup`]) times a stopped subscriber's catch-up with RTL compilation and
//! with `--no-compile`, on the same backlog.
//!
//! `master-kill` ([`master_kill`]) SIGKILLs the master of a replicated table under a
//! write load, times until the promoted subscriber acknowledges a client's write, checks
//! that no acknowledged commit is lost, and rebuilds the deposed node with a duplicate.
//!
//! ```sh
//! cargo build --release -p hawser-cli -p hawser-chaos
//! target/release/hawser-chaos leader-kill --trials 20
//! target/release/hawser-chaos catchup --updates 1000000 --keys 10000
//! target/release/hawser-chaos master-kill --trials 20
//! ```

mod catchup;
mod master_kill;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use hawser_client::Client;

#[derive(Parser, Debug)]
#[command(name = "hawser-chaos", version, about)]
struct Cli {
    #[command(subcommand)]
    drill: Drill,
}

#[derive(Subcommand, Debug)]
enum Drill {
    /// SIGKILL the Raft leader repeatedly; time until DDL is accepted again.
    LeaderKill(LeaderKillArgs),
    /// Stop a subscriber, commit a backlog on the master, time the catch-up with RTL
    /// compilation and without.
    Catchup(catchup::CatchupArgs),
    /// SIGKILL the master of a table under load repeatedly; time until the new master
    /// takes a write, and check that no acknowledged write is lost.
    MasterKill(master_kill::MasterKillArgs),
}

#[derive(clap::Args, Debug)]
struct LeaderKillArgs {
    /// Number of leader kills.
    #[arg(long, default_value_t = 20)]
    trials: u32,
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
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// A `hawser start` child; SIGKILLed on drop.
struct Proc {
    child: Option<Child>,
    name: String,
    data: PathBuf,
    grpc: String,
    http: String,
    node_id: u64,
}

impl Proc {
    /// Runs `cmd` (a `hawser start` with its flags) with its log in `log`, and waits (at
    /// most 60 s) for its ready line, which gives the addresses and the node id.
    fn spawn(
        mut cmd: Command,
        name: &str,
        data: &Path,
        log: std::fs::File,
    ) -> anyhow::Result<Proc> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("start {:?}", cmd.get_program()))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut proc = Proc {
            child: Some(child),
            name: name.into(),
            data: data.into(),
            grpc: String::new(),
            http: String::new(),
            node_id: 0,
        };
        let line = rx.recv_timeout(Duration::from_secs(60)).with_context(|| {
            format!(
                "{name} did not become ready; see {}",
                data.with_extension("log").display()
            )
        })?;
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
        };
        proc.grpc = field("grpc")
            .with_context(|| format!("ready line {line:?}"))?
            .to_string();
        proc.http = field("http").context("http address")?.to_string();
        proc.node_id = field("node_id").context("node id")?.parse()?;
        Ok(proc)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl Proc {
    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Cluster {
    bin: PathBuf,
    args: LeaderKillArgs,
    nodes: Vec<Proc>,
}

impl Cluster {
    /// Starts `name` on `addrs` (gRPC, HTTP; port 0 = any free port) and waits (at most
    /// 60 s) for its ready line.
    fn start(
        &self,
        name: &str,
        data: &Path,
        join: Option<&str>,
        addrs: (&str, &str),
    ) -> anyhow::Result<Proc> {
        let fmt = |d: Duration| format!("{}ms", d.as_millis());
        let mut cmd = crate::node_command(&self.bin, name, data, addrs);
        cmd.args(["--raft-heartbeat", &fmt(self.args.heartbeat)])
            .args(["--raft-election-min", &fmt(self.args.election_min)])
            .args(["--raft-election-max", &fmt(self.args.election_max)]);
        if let Some(j) = join {
            cmd.args(["--join", j]);
        }
        let log = std::fs::File::create(data.with_extension("log"))?;
        Proc::spawn(cmd, name, data, log)
    }

    fn members(&self, except: usize) -> String {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| *i != except && n.child.is_some())
            .map(|(_, n)| n.grpc.clone())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The leader as `addr` sees it, with the cluster state version there.
async fn view(addr: &str) -> Option<(u64, u64)> {
    let mut c = Client::connect_with_timeout(addr, Duration::from_millis(500))
        .await
        .ok()?;
    let s = c.status().await.ok()?;
    let cluster = s.cluster?;
    Some((cluster.leader_id, cluster.state_version))
}

/// Polls `check` every 20 ms until it yields a value or `limit` passes.
async fn wait_for<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn leader_kill(args: LeaderKillArgs) -> anyhow::Result<ExitCode> {
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
    let tmp = tempfile::Builder::new().prefix("hawser-chaos-").tempdir()?;
    let result = drill(args, tmp.path()).await;
    if result.is_err() {
        // Keep the nodes' logs for whoever has to find out what went wrong.
        eprintln!("node logs kept in {}", tmp.keep().display());
    }
    result
}

async fn drill(args: LeaderKillArgs, root: &Path) -> anyhow::Result<ExitCode> {
    let bin = match &args.hawser {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("hawser"),
    };
    let trials = args.trials;
    let mut cluster = Cluster {
        bin,
        args,
        nodes: Vec::new(),
    };
    const ANY: (&str, &str) = ("127.0.0.1:0", "127.0.0.1:0");
    let n1 = cluster.start("n1", &root.join("n1"), None, ANY)?;
    let seed = n1.grpc.clone();
    cluster.nodes.push(n1);
    Client::connect(&seed)
        .await?
        .init()
        .await
        .context("init the cluster")?;
    for name in ["n2", "n3"] {
        let p = cluster.start(name, &root.join(name), Some(&seed), ANY)?;
        cluster.nodes.push(p);
    }
    let addrs: Vec<String> = cluster.nodes.iter().map(|n| n.grpc.clone()).collect();
    wait_for(
        Duration::from_secs(60),
        "three nodes agreeing on a leader",
        || {
            let addrs = addrs.clone();
            async move {
                let mut leaders = Vec::new();
                for a in &addrs {
                    let mut c = Client::connect_with_timeout(a, Duration::from_millis(500))
                        .await
                        .ok()?;
                    let cl = c.status().await.ok()?.cluster?;
                    (cl.nodes.len() == 3 && cl.leader_id != 0).then_some(())?;
                    leaders.push(cl.leader_id);
                }
                leaders.windows(2).all(|w| w[0] == w[1]).then_some(())
            }
        },
    )
    .await?;

    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut samples = Vec::new();
    for trial in 1..=trials {
        let leader_id = view(&cluster.nodes[0].grpc).await.map(|v| v.0).unwrap_or(0);
        let leader_id = if leader_id != 0 {
            leader_id
        } else {
            let mut found = 0;
            for n in &cluster.nodes {
                if let Some((l, _)) = view(&n.grpc).await {
                    if l != 0 {
                        found = l;
                        break;
                    }
                }
            }
            found
        };
        let Some(victim) = cluster.nodes.iter().position(|n| n.node_id == leader_id) else {
            bail!("trial {trial}: no node knows a leader");
        };
        let survivors: Vec<String> = cluster
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != victim)
            .map(|(_, n)| n.grpc.clone())
            .collect();

        // The fault: SIGKILL, no goodbye to the followers.
        let t0 = Instant::now();
        cluster.nodes[victim].kill9();
        let ddl = format!(
            "CREATE REPLICATION drill{trial} ELEMENT e TABLE t MASTER n1 ON \"127.0.0.1\" \
             SUBSCRIBER n2 ON \"127.0.0.1\", n3 ON \"127.0.0.1\""
        );
        let mut attempt = 0usize;
        wait_for(
            Duration::from_secs(60),
            "DDL accepted after the leader kill",
            || {
                attempt += 1;
                let addr = survivors[attempt % survivors.len()].clone();
                let ddl = ddl.clone();
                async move {
                    let mut c = Client::connect_with_timeout(&addr, Duration::from_secs(2))
                        .await
                        .ok()?;
                    let out = c.execute(&ddl).await.ok()?;
                    out.error.is_none().then_some(())
                }
            },
        )
        .await
        .with_context(|| format!("trial {trial}"))?;
        let took = t0.elapsed();
        hist.record(took.as_millis() as u64)?;
        samples.push(took.as_millis() as u64);
        eprintln!(
            "trial {trial:>2}/{trials}: leader {} killed, DDL accepted after {} ms",
            cluster.nodes[victim].name,
            took.as_millis()
        );

        // Bring the victim back on its data directory and its old addresses (the Raft
        // membership names them), and wait until it caught up.
        let old = &cluster.nodes[victim];
        let (name, data) = (old.name.clone(), old.data.clone());
        let (grpc, http) = (old.grpc.clone(), old.http.clone());
        let join = cluster.members(victim);
        let back = cluster.start(&name, &data, Some(&join), (&grpc, &http))?;
        let target = view(&survivors[0]).await.map(|v| v.1).unwrap_or(0);
        let addr = back.grpc.clone();
        cluster.nodes[victim] = back;
        wait_for(
            Duration::from_secs(60),
            "the restarted node to catch up",
            || {
                let addr = addr.clone();
                async move {
                    let (leader, version) = view(&addr).await?;
                    (leader != 0 && version >= target).then_some(())
                }
            },
        )
        .await
        .with_context(|| format!("trial {trial}: restart {name}"))?;
    }

    let q = |p: f64| hist.value_at_quantile(p);
    let settings = serde_json::json!({
        "heartbeat_ms": cluster.args.heartbeat.as_millis() as u64,
        "election_timeout_min_ms": cluster.args.election_min.as_millis() as u64,
        "election_timeout_max_ms": cluster.args.election_max.as_millis() as u64,
    });
    if cluster.args.json {
        println!(
            "{}",
            serde_json::json!({"drill": "leader-kill", "trials": trials, "settings": settings,
                "ms": {"p50": q(0.5), "p99": q(0.99), "max": hist.max(), "min": hist.min(), "mean": hist.mean()},
                "samples_ms": samples})
        );
    } else {
        println!(
            "leader-kill: {trials} trials, SIGKILL of the Raft leader → DDL accepted on a survivor"
        );
        println!(
            "  settings  heartbeat {:?}, election timeout {:?}..{:?}",
            cluster.args.heartbeat, cluster.args.election_min, cluster.args.election_max
        );
        println!(
            "  ms        p50 {}  p99 {}  min {}  max {}  mean {:.0}",
            q(0.5),
            q(0.99),
            hist.min(),
            hist.max(),
            hist.mean()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match cli.drill {
            Drill::LeaderKill(args) => leader_kill(args).await,
            Drill::Catchup(args) => catchup::run(args).await,
            Drill::MasterKill(args) => master_kill::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `BIN start --insecure --name NAME --listen GRPC --http HTTP --data DATA`: a node of
/// the loopback clusters the chaos commands run (without TLS, as the test suite's).
pub(crate) fn node_command(
    bin: impl AsRef<std::ffi::OsStr>,
    name: &str,
    data: &Path,
    addrs: (&str, &str),
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["start", "--insecure", "--name", name])
        .args(["--listen", addrs.0, "--http", addrs.1])
        .arg("--data")
        .arg(data);
    cmd
}
