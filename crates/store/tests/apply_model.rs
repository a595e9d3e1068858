//! Property test: bulk apply of a compiled run gives the same tables as log-order
//! apply.
//!
//! A "master" database runs random transactions (upserts, key-changing updates,
//! deletes over a small key space of two tables, one with a composite key); its commit
//! log is shipped to two subscribers. One applies everything in log order, in random
//! chunks; the other applies a random prefix in log order and the rest as one compiled
//! run (`hawser_rtl::compile` + `apply_compiled`), then the same run again. Both must
//! end with the master's tables, the same high-water marks and a record of every
//! transaction with its original Gtid, in log order.

mod common;

use std::sync::Arc;

use common::{col, counters};
use hawser_core::{DataType, Epoch, Lsn, NodeId, QualName, Row, TableDef, Transaction, Value};
use hawser_store::{Database, DbOptions, KeyRange, LogEntry, ReplicatedTxn};
use proptest::prelude::*;

fn pairs() -> TableDef {
    TableDef {
        name: QualName::bare("pairs"),
        columns: vec![
            col("a", DataType::Integer, false),
            col("b", DataType::Varchar(4), false),
            col("v", DataType::Integer, true),
        ],
        primary_key: vec![0, 1],
        explicit_key: true,
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Insert key `k` with `v`, or update it to `v` if it exists.
    Upsert {
        pairs: bool,
        k: i64,
        v: i64,
    },
    /// Move the row at `k` to the free key `to`, setting `v`.
    Move {
        pairs: bool,
        k: i64,
        to: i64,
        v: i64,
    },
    Delete {
        pairs: bool,
        k: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0i64..6;
    prop_oneof![
        4 => (any::<bool>(), k.clone(), -50i64..50).prop_map(|(pairs, k, v)| Op::Upsert { pairs, k, v }),
        2 => (any::<bool>(), k.clone(), k.clone(), -50i64..50)
            .prop_map(|(pairs, k, to, v)| Op::Move { pairs, k, to, v }),
        3 => (any::<bool>(), k).prop_map(|(pairs, k)| Op::Delete { pairs, k }),
    ]
}

/// The table, the key of index `k` and a row with that key and value `v`.
fn target(pairs_table: bool, k: i64, v: i64) -> (QualName, Row, Row) {
    if pairs_table {
        let key = vec![Value::Int(k % 3), Value::Text(format!("b{}", k / 3))];
        let v = if v % 5 == 0 {
            Value::Null
        } else {
            Value::Int(v)
        };
        let mut row = key.clone();
        row.push(v);
        (pairs().name, key, row)
    } else {
        let key = vec![Value::Int(k)];
        (counters().name, key, vec![Value::Int(k), Value::Int(v)])
    }
}

async fn run_on_master(master: &Database, txns: &[Vec<Op>]) {
    for ops in txns {
        let mut txn = master.begin();
        for op in ops {
            match *op {
                Op::Upsert { pairs, k, v } => {
                    let (t, key, row) = target(pairs, k, v);
                    if txn.lock_and_get(&t, &key).await.unwrap().is_some() {
                        txn.update(&t, &key, row).await.unwrap();
                    } else {
                        txn.insert(&t, row).await.unwrap();
                    }
                }
                Op::Move { pairs, k, to, v } => {
                    let (t, key, _) = target(pairs, k, v);
                    let (_, to_key, row) = target(pairs, to, v);
                    if txn.get(&t, &key).unwrap().is_some()
                        && txn.get(&t, &to_key).unwrap().is_none()
                    {
                        txn.update(&t, &key, row).await.unwrap();
                    }
                }
                Op::Delete { pairs, k } => {
                    let (t, key, _) = target(pairs, k, 0);
                    txn.delete(&t, &key).await.unwrap();
                }
            }
        }
        txn.commit().await.unwrap();
    }
}

fn contents(db: &Database) -> Vec<Vec<Row>> {
    [counters().name, pairs().name]
        .iter()
        .map(|t| {
            db.scan(t, KeyRange::all())
                .unwrap()
                .map(Result::unwrap)
                .collect()
        })
        .collect()
}

fn applied_gtids(db: &Database, origin: NodeId) -> Vec<u64> {
    db.log_range(Lsn(1), usize::MAX)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.entry {
            LogEntry::Txn(t) if t.gtid.origin == origin => Some(t.gtid.seq),
            _ => None,
        })
        .collect()
}

async fn subscriber(node: u64, tables: &[Arc<TableDef>]) -> Database {
    let db = Database::open_memory(DbOptions::new(NodeId(node))).unwrap();
    for t in tables {
        db.create_table((**t).clone()).await.unwrap();
    }
    db
}

async fn check(txns: Vec<Vec<Op>>, split: prop::sample::Index, chunk: usize) {
    let master = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
    master.create_table(counters()).await.unwrap();
    master.create_table(pairs()).await.unwrap();
    run_on_master(&master, &txns).await;
    let shipped: Vec<ReplicatedTxn> = master
        .log_range(Lsn(1), usize::MAX)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r.entry {
            LogEntry::Txn(txn) => Some(ReplicatedTxn {
                txn,
                epoch: Epoch(1),
            }),
            _ => None,
        })
        .collect();
    let tables = master.tables();
    let catalog: Vec<TableDef> = tables.iter().map(|t| (**t).clone()).collect();

    let log_order = subscriber(2, &tables).await;
    for part in shipped.chunks(chunk) {
        log_order.apply_replicated(part.to_vec()).await.unwrap();
    }

    let bulk = subscriber(3, &tables).await;
    let at = split.index(shipped.len() + 1);
    let (prefix, run) = shipped.split_at(at);
    bulk.apply_replicated(prefix.to_vec()).await.unwrap();
    let txns_of_run: Vec<Transaction> = run.iter().map(|r| r.txn.clone()).collect();
    let compiled = hawser_rtl::compile(&txns_of_run, &catalog).unwrap();
    // A run the master produced is always a valid sequence per key.
    assert!(compiled.is_compiled(), "{:?}", compiled.outcome);
    let info = bulk.apply_compiled(run, &compiled).await.unwrap();
    assert_eq!(info.applied, run.len() as u64);
    assert_eq!(info.compiled, !run.is_empty());
    assert!(info.rows_written <= compiled.counts.net_operations);
    let again = bulk.apply_compiled(run, &compiled).await.unwrap();
    assert_eq!((again.applied, again.skipped), (0, run.len() as u64));

    let expected = contents(&master);
    assert_eq!(contents(&log_order), expected, "log-order apply");
    assert_eq!(contents(&bulk), expected, "bulk apply");
    let origin = master.node_id();
    let all: Vec<u64> = shipped.iter().map(|r| r.txn.gtid.seq).collect();
    assert_eq!(applied_gtids(&log_order, origin), all);
    assert_eq!(applied_gtids(&bulk, origin), all);
    let mark = all.last().copied().unwrap_or(0);
    assert_eq!(log_order.high_water(origin).unwrap(), mark);
    assert_eq!(bulk.high_water(origin).unwrap(), mark);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn bulk_apply_of_a_compiled_run_equals_log_order_apply(
        txns in prop::collection::vec(prop::collection::vec(op(), 1..5), 0..30),
        split in any::<prop::sample::Index>(),
        chunk in 1usize..8,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(check(txns, split, chunk));
    }
}
