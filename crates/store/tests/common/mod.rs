//! Shared fixtures: a database on either engine that a test can reopen, and tables.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use hawser_core::{ColumnDef, DataType, Ident, NodeId, QualName, TableDef, Value};
use hawser_store::{Database, DbOptions, KvEngine, MemEngine, SledEngine};
use tempfile::TempDir;

pub enum Kind {
    Mem(Arc<MemEngine>),
    Sled(TempDir),
}

/// A database plus what is needed to reopen it on the same data.
pub struct Fixture {
    pub db: Option<Database>,
    pub kind: Kind,
    pub opts: DbOptions,
}

pub fn opts() -> DbOptions {
    let mut o = DbOptions::new(NodeId(7));
    o.lock_timeout = Duration::from_secs(20);
    o
}

impl Fixture {
    pub fn mem(opts: DbOptions) -> Self {
        let engine = Arc::new(MemEngine::new());
        let db = Database::open(engine.clone() as Arc<dyn KvEngine>, opts.clone()).unwrap();
        Self {
            db: Some(db),
            kind: Kind::Mem(engine),
            opts,
        }
    }

    pub fn sled(opts: DbOptions) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open_sled(dir.path(), opts.clone()).unwrap();
        Self {
            db: Some(db),
            kind: Kind::Sled(dir),
            opts,
        }
    }

    pub fn db(&self) -> &Database {
        self.db.as_ref().unwrap()
    }

    /// Closes the database (every clone must be gone) and opens it again on the same data.
    pub fn reopen(&mut self) -> &Database {
        self.db = None;
        let db = match &self.kind {
            Kind::Mem(engine) => {
                Database::open(engine.clone() as Arc<dyn KvEngine>, self.opts.clone()).unwrap()
            }
            Kind::Sled(dir) => {
                // The open waits (boundedly) for sled's directory lock, which sled's own
                // I/O threads may hold a moment after the last handle is dropped.
                let engine = SledEngine::open(dir.path())
                    .unwrap_or_else(|e| panic!("reopen of {}: {e}", dir.path().display()));
                Database::open(Arc::new(engine), self.opts.clone()).unwrap()
            }
        };
        self.db = Some(db);
        self.db()
    }
}

pub fn col(name: &str, ty: DataType, nullable: bool) -> ColumnDef {
    ColumnDef {
        name: Ident::unquoted(name),
        data_type: ty,
        nullable,
        default: None,
    }
}

/// `accounts(id INTEGER PRIMARY KEY, name VARCHAR(10) NOT NULL, balance DECIMAL(10,2))`.
pub fn accounts() -> TableDef {
    TableDef {
        name: QualName::bare("accounts"),
        columns: vec![
            col("id", DataType::Integer, false),
            col("name", DataType::Varchar(10), false),
            col(
                "balance",
                DataType::Decimal {
                    precision: Some(10),
                    scale: 2,
                },
                true,
            ),
        ],
        primary_key: vec![0],
        explicit_key: true,
    }
}

pub fn accounts_name() -> QualName {
    QualName::bare("accounts")
}

pub fn account(id: i64, name: &str, balance: &str) -> Vec<Value> {
    vec![
        Value::Int(id),
        Value::Text(name.into()),
        Value::Decimal(balance.parse().unwrap()),
    ]
}

/// `counters(k INTEGER PRIMARY KEY, n BIGINT NOT NULL)`.
pub fn counters() -> TableDef {
    TableDef {
        name: QualName::bare("counters"),
        columns: vec![
            col("k", DataType::Integer, false),
            col("n", DataType::BigInt, false),
        ],
        primary_key: vec![0],
        explicit_key: true,
    }
}

/// Crash tests: re-runs this test binary as a child that executes only the ignored test
/// `child_test` with `env_var` = `dir`, collects what it prints after `marker` on each
/// line until `acks` such lines arrived (each within `per_ack`), then kills it with
/// SIGKILL — no destructor, no flush, no goodbye — and returns every payload printed,
/// including those still in the pipe at the kill.
pub fn run_child_and_kill(
    child_test: &str,
    env_var: &str,
    dir: &std::path::Path,
    marker: &'static str,
    acks: usize,
    per_ack: Duration,
) -> Vec<String> {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            child_test,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env_var, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may print "test NAME ... " on the same line first.
            if let Some((_, payload)) = line.split_once(marker) {
                if tx.send(payload.trim().to_string()).is_err() {
                    break;
                }
            }
        }
    });
    let mut seen = Vec::new();
    while seen.len() < acks {
        match rx.recv_timeout(per_ack) {
            Ok(p) => seen.push(p),
            Err(e) => {
                let _ = child.kill();
                panic!("child stopped acknowledging after {}: {e}", seen.len());
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    seen.extend(rx.try_iter());
    seen
}
