//! Property test: random operation sequences against a `BTreeMap` model.
//!
//! Each case runs inserts, updates (including key changes), deletes, statement
//! savepoints, commits and rollbacks on the memory engine and checks after every step
//! that the transaction sees exactly the model's pending state and everybody else
//! exactly the committed state.

mod common;

use std::collections::BTreeMap;

use common::{counters, opts, Fixture};
use hawser_core::{QualName, Value};
use hawser_store::{KeyRange, Txn};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(i64, i64),
    Update(i64, i64, i64),
    Delete(i64),
    Savepoint,
    RollbackToSavepoint,
    Commit,
    Rollback,
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0i64..6;
    prop_oneof![
        4 => (k.clone(), any::<i64>()).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => (k.clone(), k.clone(), any::<i64>()).prop_map(|(k, nk, v)| Op::Update(k, nk, v)),
        2 => k.prop_map(Op::Delete),
        1 => Just(Op::Savepoint),
        1 => Just(Op::RollbackToSavepoint),
        2 => Just(Op::Commit),
        1 => Just(Op::Rollback),
    ]
}

type Model = BTreeMap<i64, i64>;

fn rows(m: &Model) -> Vec<Vec<Value>> {
    m.iter()
        .map(|(k, v)| vec![Value::Int(*k), Value::Int(*v)])
        .collect()
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let f = Fixture::mem(opts());
        let db = f.db();
        db.create_table(counters()).await.unwrap();
        let t = QualName::bare("counters");
        let mut committed = Model::new();
        let mut pending = committed.clone();
        let mut saved: Option<(hawser_store::Savepoint, Model)> = None;
        let mut txn: Txn = db.begin();
        for op in ops {
            match op {
                Op::Insert(k, v) => {
                    let r = txn.insert(&t, vec![Value::Int(k), Value::Int(v)]).await;
                    match pending.entry(k) {
                        std::collections::btree_map::Entry::Occupied(_) => {
                            prop_assert_eq!(r.unwrap_err().code(), "23505");
                        }
                        std::collections::btree_map::Entry::Vacant(e) => {
                            r.unwrap();
                            e.insert(v);
                        }
                    }
                }
                Op::Update(k, nk, v) => {
                    let r = txn
                        .update(&t, &[Value::Int(k)], vec![Value::Int(nk), Value::Int(v)])
                        .await;
                    match (
                        pending.contains_key(&k),
                        k != nk && pending.contains_key(&nk),
                    ) {
                        (false, _) => prop_assert!(!r.unwrap()),
                        (true, true) => prop_assert_eq!(r.unwrap_err().code(), "23505"),
                        (true, false) => {
                            prop_assert!(r.unwrap());
                            pending.remove(&k);
                            pending.insert(nk, v);
                        }
                    }
                }
                Op::Delete(k) => {
                    let found = txn.delete(&t, &[Value::Int(k)]).await.unwrap();
                    prop_assert_eq!(found, pending.remove(&k).is_some());
                }
                Op::Savepoint => saved = Some((txn.statement_savepoint(), pending.clone())),
                Op::RollbackToSavepoint => {
                    if let Some((sp, m)) = saved.clone() {
                        txn.rollback_to(sp);
                        pending = m;
                    }
                }
                Op::Commit => {
                    std::mem::replace(&mut txn, db.begin())
                        .commit()
                        .await
                        .unwrap();
                    committed = pending.clone();
                    saved = None;
                }
                Op::Rollback => {
                    std::mem::replace(&mut txn, db.begin()).rollback();
                    pending = committed.clone();
                    saved = None;
                }
            }
            prop_assert_eq!(txn.scan(&t, KeyRange::all()).unwrap(), rows(&pending));
            let seen: Vec<_> = db
                .scan(&t, KeyRange::all())
                .unwrap()
                .map(|r| r.unwrap())
                .collect();
            prop_assert_eq!(seen, rows(&committed));
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn transactions_match_a_map_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(ops)?;
    }
}
