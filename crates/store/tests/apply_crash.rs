//! Crash test for bulk apply: a child process applies large compiled runs in a loop and
//! prints every run it has applied durably; it is killed with SIGKILL mid-load and the
//! database reopened. Either the whole of a run is there or none of it: the origin's
//! high-water is a run boundary, the table equals the origin's state at that seq, the
//! log holds exactly one record per transaction up to it, and nothing acknowledged is
//! missing.
//!
//! The run is generated deterministically from the seq and the table state, so the
//! test can rebuild what the table must hold at any seq. The child is this test binary
//! re-executed to run the ignored `bulk_apply_child` test.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{counters, opts};
use hawser_core::{ChangeOp, Epoch, Gtid, Lsn, NodeId, RowChange, TableDef, Transaction, Value};
use hawser_store::{Database, KeyRange, LogEntry, ReplicatedTxn};

const CHILD_DIR_ENV: &str = "HAWSER_STORE_APPLY_CRASH_CHILD_DIR";
const ORIGIN: NodeId = NodeId(100);
/// Transactions per compiled run.
const RUN: u64 = 1_000;
const CHANGES_PER_TXN: u64 = 4;
const KEYS: u64 = 5_000;

/// splitmix64: a well-mixed, deterministic function of its input.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Transaction `seq` of the origin, made against `state` (key → value), which it
/// updates: each change inserts an absent key, or updates or deletes a present one.
fn next_txn(seq: u64, state: &mut BTreeMap<i64, i64>) -> Transaction {
    let t = counters().name;
    let mut changes = Vec::new();
    for j in 0..CHANGES_PER_TXN {
        let h = mix(seq * CHANGES_PER_TXN + j);
        let k = (h % KEYS) as i64;
        let v = (seq * 10 + j) as i64;
        let row = |v: i64| vec![Value::Int(k), Value::Int(v)];
        let change = match state.get(&k).copied() {
            None => {
                state.insert(k, v);
                RowChange {
                    table: t.clone(),
                    op: ChangeOp::Insert,
                    key: vec![Value::Int(k)],
                    before: None,
                    after: Some(row(v)),
                }
            }
            Some(old) if (h >> 32).is_multiple_of(4) => {
                state.remove(&k);
                RowChange {
                    table: t.clone(),
                    op: ChangeOp::Delete,
                    key: vec![Value::Int(k)],
                    before: Some(row(old)),
                    after: None,
                }
            }
            Some(old) => {
                state.insert(k, v);
                RowChange {
                    table: t.clone(),
                    op: ChangeOp::Update,
                    key: vec![Value::Int(k)],
                    before: Some(row(old)),
                    after: Some(row(v)),
                }
            }
        };
        changes.push(change);
    }
    Transaction {
        gtid: Gtid::new(ORIGIN, seq),
        commit_micros: seq as i64,
        changes,
    }
}

/// The origin's state after transactions `1..=seq`.
fn state_at(seq: u64) -> BTreeMap<i64, i64> {
    let mut state = BTreeMap::new();
    for s in 1..=seq {
        next_txn(s, &mut state);
    }
    state
}

fn table_state(db: &Database) -> BTreeMap<i64, i64> {
    db.scan(&counters().name, KeyRange::all())
        .unwrap()
        .map(|r| match r.unwrap().as_slice() {
            [Value::Int(k), Value::Int(v)] => (*k, *v),
            other => panic!("unexpected row {other:?}"),
        })
        .collect()
}

#[test]
#[ignore = "run by bulk_apply_survives_sigkill as a child process"]
fn bulk_apply_child() {
    let dir = std::env::var(CHILD_DIR_ENV).expect("run only by the crash test");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let db = Database::open_sled(Path::new(&dir), opts()).unwrap();
        if db.table(&counters().name).is_none() {
            db.create_table(counters()).await.unwrap();
        }
        let catalog: Vec<TableDef> = vec![counters()];
        let mut seq = db.high_water(ORIGIN).unwrap();
        assert_eq!(seq % RUN, 0, "a run was applied in part");
        // The table is the origin's state at the high-water, so generation resumes.
        let mut state = table_state(&db);
        loop {
            let run: Vec<ReplicatedTxn> = (seq + 1..=seq + RUN)
                .map(|s| ReplicatedTxn {
                    txn: next_txn(s, &mut state),
                    epoch: Epoch(1),
                })
                .collect();
            let txns: Vec<Transaction> = run.iter().map(|r| r.txn.clone()).collect();
            let compiled = hawser_rtl::compile(&txns, &catalog).unwrap();
            let info = db.apply_compiled(&run, &compiled).await.unwrap();
            assert!(info.compiled && info.durable);
            assert_eq!(info.applied, RUN);
            seq += RUN;
            // Acknowledged only after the apply returned durable.
            println!("APPLIED {seq}");
        }
    });
}

/// Runs the child until it has acknowledged `acks` runs, kills it with SIGKILL and
/// returns the highest seq it acknowledged.
fn run_child_and_kill(dir: &Path, acks: usize) -> u64 {
    common::run_child_and_kill(
        "bulk_apply_child",
        CHILD_DIR_ENV,
        dir,
        "APPLIED ",
        acks,
        Duration::from_secs(120),
    )
    .iter()
    .map(|seq| seq.parse::<u64>().expect("the child prints numeric seqs"))
    .max()
    .unwrap_or(0)
}

/// Reopens the database and checks that it holds whole runs only, everything
/// acknowledged, and the origin's exact state at its high-water. Returns the mark.
fn verify(dir: &Path, acked: u64) -> u64 {
    let db = Database::open_sled(dir, opts()).unwrap();
    let mark = db.high_water(ORIGIN).unwrap();
    assert_eq!(mark % RUN, 0, "high-water {mark} is inside a run");
    // At most the run in flight when the kill came is there unacknowledged.
    assert!(
        (acked..=acked + RUN).contains(&mark),
        "high-water {mark}, acknowledged {acked}"
    );
    assert_eq!(
        table_state(&db),
        state_at(mark),
        "table at high-water {mark}"
    );
    let seqs: Vec<u64> = db
        .log_range(Lsn(1), usize::MAX)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.entry {
            LogEntry::Txn(t) => Some(t.gtid.seq),
            _ => None,
        })
        .collect();
    assert_eq!(
        seqs,
        (1..=mark).collect::<Vec<_>>(),
        "one record per transaction"
    );
    mark
}

#[test]
fn bulk_apply_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let first = run_child_and_kill(dir.path(), 8);
    let mark = verify(dir.path(), first);
    // Recovery must leave a receiver that resumes from its mark: crash it again.
    let second = run_child_and_kill(dir.path(), 8);
    assert!(second >= mark + 8 * RUN);
    verify(dir.path(), second);
}
