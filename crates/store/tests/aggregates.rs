//! BASE AGGREGATE upkeep on real stores: a master commits random inserts, updates
//! (moving rows between groups and keys) and deletes; a subscriber applies them, in
//! batches of one or more transactions, and after every apply its aggregate table holds
//! exactly the aggregates of its copy, computed here independently. Reopening the
//! subscriber and setting the rule again changes nothing; a rule set over rows already
//! there (a duplicate) computes the aggregates at once.

mod common;

use std::collections::BTreeMap;

use common::{col, opts, Fixture};
use hawser_core::{DataType, Epoch, Ident, NodeId, QualName, Row, TableDef, Transaction, Value};
use hawser_scheme::ast::{AggFunc, Aggregate, TargetKind};
use hawser_scheme::route::ResolvedTarget;
use hawser_store::{Database, DbOptions, KeyRange, ReplicatedTxn};
use proptest::prelude::*;

fn source() -> QualName {
    QualName::bare("acct")
}

/// `acct (id BIGINT PRIMARY KEY, grp BIGINT NOT NULL, bal BIGINT)`.
fn def() -> TableDef {
    TableDef {
        name: source(),
        columns: vec![
            col("id", DataType::BigInt, false),
            col("grp", DataType::BigInt, false),
            col("bal", DataType::BigInt, true),
        ],
        primary_key: vec![0],
        explicit_key: true,
    }
}

/// `BASE AGGREGATE (COUNT(*), SUM(bal), MIN(bal), MAX(bal), AVG(bal)) GROUP BY grp INTO agg`.
fn rules() -> Vec<(QualName, ResolvedTarget)> {
    let bal = || Ident::unquoted("bal");
    let agg = |func| Aggregate { func, alias: None };
    vec![(
        source(),
        ResolvedTarget {
            kind: TargetKind::BaseAggregate {
                aggregates: vec![
                    agg(AggFunc::CountStar),
                    agg(AggFunc::Sum(bal())),
                    agg(AggFunc::Min(bal())),
                    agg(AggFunc::Max(bal())),
                    agg(AggFunc::Avg(bal())),
                ],
                group_by: vec![Ident::unquoted("grp")],
            },
            into: QualName::bare("agg"),
        },
    )]
}

fn rows(db: &Database, name: &str) -> Vec<Row> {
    db.begin()
        .scan(&QualName::bare(name), KeyRange::all())
        .unwrap()
}

/// The aggregate rows `copy` gives (without the two commit-time columns), by group.
fn expected(copy: &[Row]) -> Vec<Row> {
    let mut groups: BTreeMap<i64, Vec<Option<i64>>> = BTreeMap::new();
    for r in copy {
        let (Value::Int(g), bal) = (&r[1], &r[2]) else {
            panic!("a row {r:?}");
        };
        groups.entry(*g).or_default().push(match bal {
            Value::Int(b) => Some(*b),
            _ => None,
        });
    }
    groups
        .into_iter()
        .map(|(g, bals)| {
            let set: Vec<i64> = bals.iter().flatten().copied().collect();
            let or_null = |v: Option<Value>| v.unwrap_or(Value::Null);
            vec![
                Value::Int(g),
                Value::Int(bals.len() as i64),
                or_null((!set.is_empty()).then(|| Value::Int(set.iter().sum()))),
                or_null(set.iter().min().map(|v| Value::Int(*v))),
                or_null(set.iter().max().map(|v| Value::Int(*v))),
                or_null(
                    (!set.is_empty())
                        .then(|| Value::Double(set.iter().sum::<i64>() as f64 / set.len() as f64)),
                ),
            ]
        })
        .collect()
}

fn check(db: &Database) {
    let kept: Vec<Row> = rows(db, "agg")
        .into_iter()
        .map(|r| r[2..].to_vec())
        .collect();
    assert_eq!(kept, expected(&rows(db, "acct")));
}

/// One master write: `(id, grp, bal)` upserted, or `id` deleted.
#[derive(Debug, Clone)]
enum Op {
    Put(i64, i64, Option<i64>),
    Delete(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0i64..6, 0i64..3, proptest::option::of(-5i64..20))
            .prop_map(|(id, g, b)| Op::Put(id, g, b)),
        1 => (0i64..6).prop_map(Op::Delete),
    ]
}

/// Commits `ops` on `db`: the transaction as a receiver gets it (`None`: it wrote
/// nothing).
async fn commit(db: &Database, ops: &[Op], micros: i64) -> Option<ReplicatedTxn> {
    let mut txn = db.begin();
    for op in ops {
        match op {
            Op::Put(id, g, b) => {
                let row = vec![
                    Value::Int(*id),
                    Value::Int(*g),
                    b.map_or(Value::Null, Value::Int),
                ];
                if !txn
                    .update(&source(), &[Value::Int(*id)], row.clone())
                    .await
                    .unwrap()
                {
                    txn.insert(&source(), row).await.unwrap();
                }
            }
            Op::Delete(id) => {
                txn.delete(&source(), &[Value::Int(*id)]).await.unwrap();
            }
        }
    }
    let changes = txn.changes().to_vec();
    if changes.is_empty() {
        txn.rollback();
        return None;
    }
    let info = txn.commit().await.unwrap();
    Some(ReplicatedTxn {
        txn: Transaction {
            gtid: info.gtid,
            commit_micros: micros,
            changes,
        },
        epoch: Epoch(1),
    })
}

async fn subscriber(db: &Database) {
    db.create_table(def()).await.unwrap();
    db.set_aggregates(rules()).await.unwrap();
    assert!(
        db.table(&QualName::bare("agg")).is_some(),
        "the aggregate table is made"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_aggregate_table_always_holds_the_aggregates_of_the_copy(
        txns in proptest::collection::vec(proptest::collection::vec(op(), 1..4), 1..12),
        batch in 1usize..4,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let master = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
            master.create_table(def()).await.unwrap();
            let sub = Database::open_memory(DbOptions::new(NodeId(2))).unwrap();
            subscriber(&sub).await;
            let mut pending = Vec::new();
            for (i, ops) in txns.iter().enumerate() {
                pending.extend(commit(&master, ops, 1_000 * (i as i64 + 1)).await);
                if !pending.is_empty() && (pending.len() == batch || i + 1 == txns.len()) {
                    sub.apply_replicated(std::mem::take(&mut pending)).await.unwrap();
                    check(&sub);
                }
            }
            assert_eq!(rows(&sub, "acct"), rows(&master, "acct"));
        });
    }
}

#[tokio::test]
async fn commit_times_mark_when_a_group_began_and_last_changed() {
    let master = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
    master.create_table(def()).await.unwrap();
    let mut fx = Fixture::sled(opts());
    subscriber(fx.db()).await;
    let steps = [
        vec![Op::Put(1, 0, Some(5)), Op::Put(2, 1, Some(7))],
        vec![Op::Put(3, 0, Some(1))],
        vec![Op::Delete(2)],
        vec![Op::Put(4, 1, None)],
    ];
    for (i, ops) in steps.iter().enumerate() {
        let r = commit(&master, ops, 1_000 * (i as i64 + 1)).await.unwrap();
        fx.db().apply_replicated(vec![r]).await.unwrap();
    }
    check(fx.db());
    let marks: Vec<(Value, Value)> = rows(fx.db(), "agg")
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    // Group 0 began at 1,000 and last changed at 2,000; group 1 emptied at 3,000 and
    // began again at 4,000.
    assert_eq!(
        marks,
        [
            (Value::Timestamp(1_000), Value::Timestamp(2_000)),
            (Value::Timestamp(4_000), Value::Timestamp(4_000)),
        ]
    );
    // A restart sets the rule again: nothing is rewritten.
    let before = rows(fx.db(), "agg");
    let db = fx.reopen();
    db.set_aggregates(rules()).await.unwrap();
    assert_eq!(rows(db, "agg"), before);
}

#[tokio::test]
async fn a_rule_set_over_rows_already_there_computes_their_aggregates() {
    let master = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
    master.create_table(def()).await.unwrap();
    let sub = Database::open_memory(DbOptions::new(NodeId(2))).unwrap();
    sub.create_table(def()).await.unwrap();
    let r = commit(
        &master,
        &[
            Op::Put(1, 0, Some(5)),
            Op::Put(2, 0, Some(9)),
            Op::Put(3, 2, None),
        ],
        1_000,
    )
    .await
    .unwrap();
    sub.apply_replicated(vec![r]).await.unwrap();
    assert!(sub.table(&QualName::bare("agg")).is_none());
    sub.set_aggregates(rules()).await.unwrap();
    check(&sub);
    assert_eq!(rows(&sub, "agg").len(), 2);
}
