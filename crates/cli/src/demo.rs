//! `hawser demo`: hawser's main job on an embedded default.
//!
//! Starts a node as a child process of this same binary on free loopback ports in a
//! temporary directory (or `--data DIR`), loads example tables through SQL, runs a short
//! write workload, shows what the node did, and then opens the SQL shell against it — or,
//! with `--exit-after`, prints a JSON summary and stops. The child is killed on every
//! path out, including errors and Ctrl-C, so nothing is left running or listening.
//!
//! The cluster form (three nodes, Raft, a replication scheme) replaces the single node
//! as the control and data planes land; the steps below are written to grow into it.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use hawser_client::{Client, RowOp};
use hawser_core::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Keep the demo's data in DIR instead of a temporary directory (kept afterwards).
    #[arg(long = "data")]
    data_dir: Option<PathBuf>,
    /// Print a JSON summary and stop instead of opening the SQL shell.
    #[arg(long)]
    exit_after: bool,
    /// Commits in the demo write workload.
    #[arg(long, default_value_t = 2000)]
    writes: u32,
}

/// A node started as a child process; killed when dropped.
pub struct ChildNode {
    child: Child,
    pub grpc: String,
    pub http: String,
    pub node_id: u64,
}

impl ChildNode {
    /// Starts `hawser start` on free ports and waits (bounded) for its ready line.
    pub async fn start(name: &str, data_dir: &Path) -> anyhow::Result<ChildNode> {
        let exe = std::env::current_exe().context("locate the hawser binary")?;
        let log = std::fs::File::create(data_dir.with_extension("log"))
            .with_context(|| format!("create log file for {name}"))?;
        let mut child = Command::new(exe)
            .args([
                "start",
                "--name",
                name,
                "--listen",
                "127.0.0.1:0",
                "--http",
                "127.0.0.1:0",
            ])
            .arg("--data")
            .arg(data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .context("start the demo node")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .context("the demo node did not become ready within 30 s")?
            .context("read the demo node's output")?;
        let Some(line) = line else {
            bail!(
                "the demo node exited before it was ready; see {}",
                data_dir.with_extension("log").display()
            );
        };
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                .map(str::to_string)
        };
        let (Some(grpc), Some(http), Some(node_id)) =
            (field("grpc"), field("http"), field("node_id"))
        else {
            bail!("unexpected ready line from the demo node: {line:?}");
        };
        Ok(ChildNode {
            child,
            grpc,
            http,
            node_id: node_id.parse().context("node id")?,
        })
    }

    /// Asks the node to stop (SIGTERM) and waits a bounded time, then kills it.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

const SCHEMA: &str = "
create table accounts (
    id       integer primary key,
    owner    varchar(40) not null,
    balance  decimal(12,2) not null,
    opened   date
);
create sequence account_ids start with 1000 increment by 1;
insert into accounts values
    (account_ids.nextval, 'Ada',    100.00, date '2026-01-05'),
    (account_ids.nextval, 'Brian',  250.50, date '2026-02-11'),
    (account_ids.nextval, 'Chen',    75.25, null);
create table events (k bigint primary key, payload varchar(200));
";

const SHOWCASE: &str = "
begin;
update accounts set balance = balance - 25 where owner = 'Brian';
update accounts set balance = balance + 25 where owner = 'Ada';
commit;
select id, owner, balance, opened from accounts order by id;
select count(*) as events, min(k) as first_key, max(k) as last_key from events;
";

pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let (_tmp, root) = match &args.data_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            (None, dir.clone())
        }
        None => {
            let tmp = tempfile_dir()?;
            let root = tmp.path().to_path_buf();
            (Some(tmp), root)
        }
    };
    let started = Instant::now();
    eprintln!("hawser demo: starting a node in {}", root.display());
    let node = ChildNode::start("demo", &root.join("demo")).await?;
    let result = drive(&node, &args).await;
    match result {
        Ok(summary) if args.exit_after => {
            let mut summary = summary;
            summary["elapsed_ms"] = serde_json::json!(started.elapsed().as_millis() as u64);
            println!("{summary}");
            node.stop().await;
            Ok(ExitCode::SUCCESS)
        }
        Ok(_) => {
            println!();
            println!("The node keeps running while this shell is open. From another terminal:");
            println!("  hawser sql --host {}", node.grpc);
            println!("  hawser status --host {}", node.grpc);
            println!("  curl http://{}/metrics", node.http);
            println!();
            let cli = <crate::Cli as clap::Parser>::try_parse_from([
                "hawser", "sql", "--host", &node.grpc,
            ])?;
            let code = match cli.command {
                crate::Command::Sql(sql) => crate::sql_cmd::run(sql).await,
                _ => unreachable!("parsed a sql command"),
            };
            node.stop().await;
            code
        }
        Err(e) => {
            node.stop().await;
            Err(e)
        }
    }
}

fn tempfile_dir() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("hawser-demo-")
        .tempdir()
        .context("create a temporary directory")
}

/// Loads the example data, runs the workload and returns the summary.
async fn drive(node: &ChildNode, args: &DemoArgs) -> anyhow::Result<serde_json::Value> {
    let mut client = Client::connect(&node.grpc).await?;
    check(client.execute(SCHEMA).await?)?;

    // A short write workload through the typed API, 8 writers at once.
    let t0 = Instant::now();
    let writers = 8u32;
    let per = args.writes.div_ceil(writers);
    let mut handles = Vec::new();
    for w in 0..writers {
        let mut c = client.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per {
                let k = i64::from(w * per + i);
                c.write(vec![RowOp::Upsert {
                    table: "events".into(),
                    row: vec![
                        Value::Int(k),
                        Value::Text(format!("event {k} from writer {w}")),
                    ],
                }])
                .await?;
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        h.await.context("writer task")??;
    }
    let write_secs = t0.elapsed().as_secs_f64();
    let commits = u64::from(per * writers);

    let out = check(client.execute(SHOWCASE).await?)?;
    if !args.exit_after {
        for r in &out.results {
            if !r.columns.is_empty() {
                print_rows(r);
            }
        }
    }
    let status = client.status().await?;
    let events = &out.results.last().context("showcase results")?.rows[0][0];
    let accounts = out
        .results
        .iter()
        .find(|r| r.columns.len() == 4)
        .map(|r| r.rows.len())
        .unwrap_or(0);
    if !args.exit_after {
        println!(
            "\nworkload: {commits} commits by {writers} writers in {write_secs:.2} s ({:.0} commits/s), \
             {} flushes in all (group commit shares flushes)",
            commits as f64 / write_secs,
            status.flushes
        );
    }
    Ok(serde_json::json!({
        "node": {"name": status.name, "node_id": node.node_id, "grpc": node.grpc, "http": node.http},
        "accounts": accounts,
        "events": events.to_string().parse::<u64>().unwrap_or(0),
        "workload": {"commits": commits, "writers": writers, "seconds": write_secs,
                     "commits_per_sec": commits as f64 / write_secs},
        "store": {"commits": status.commits, "flushes": status.flushes, "last_lsn": status.last_lsn},
    }))
}

fn check(o: hawser_client::ScriptOutcome) -> anyhow::Result<hawser_client::ScriptOutcome> {
    if let Some(e) = &o.error {
        bail!(
            "demo script failed at statement {}: error[{}]: {}",
            e.statement,
            e.code,
            e.message
        );
    }
    Ok(o)
}

fn print_rows(r: &hawser_client::StatementResult) {
    let header: Vec<&str> = r.columns.iter().map(|c| c.name.as_str()).collect();
    println!("\n{}", header.join(" | "));
    for row in &r.rows {
        let cells: Vec<String> = row.iter().map(|v| v.to_string()).collect();
        println!("{}", cells.join(" | "));
    }
}
