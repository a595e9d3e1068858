//! The store's behaviour, run once against each engine (memory and sled).

mod common;

use std::ops::Bound;
use std::time::Duration;

use common::{account, accounts, accounts_name, col, counters, opts, Fixture};
use hawser_core::{ChangeOp, DataType, Lsn, NodeId, QualName, TableDef, Value};
use hawser_store::{DdlOp, KeyRange, LogEntry, Position, SequenceDef, StoreError};

/// Generates one test per engine for each named scenario.
macro_rules! on_both_engines {
    ($($name:ident),* $(,)?) => {
        mod mem_engine {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Fixture::mem(super::opts())).await;
                }
            )*
        }
        mod sled_engine {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Fixture::sled(super::opts())).await;
                }
            )*
        }
    };
}

on_both_engines!(
    rows_come_back_in_key_order_and_ranges_use_the_key,
    bad_input_gets_a_precise_error_and_changes_nothing,
    a_transaction_sees_its_own_writes_and_rollback_discards_them,
    a_savepoint_undoes_a_failed_statement_only,
    concurrent_increments_never_lose_an_update,
    a_lock_wait_past_the_timeout_fails_retryably,
    the_log_records_images_with_dense_gtids,
    drop_and_recreate_never_mixes_rows,
    add_column_fills_old_rows_with_the_default,
    sequences_step_cycle_and_run_out,
    a_reopened_database_has_everything_committed,
    a_reopened_sequence_resumes_at_the_next_block,
    a_table_without_primary_key_keys_on_all_columns,
    a_hiding_commit_is_invisible_and_blocks_writers_until_its_hold_ends,
    a_received_table_refuses_client_writes_naming_why,
    released_log_is_gone_and_stays_gone_after_reopening,
    stream_positions_persist_until_forgotten,
    the_log_tail_serves_recent_records_as_the_log_has_them,
    ddl_records_are_found_from_any_lsn_before_and_after_reopening,
);

fn code<T: std::fmt::Debug>(r: Result<T, StoreError>) -> &'static str {
    r.unwrap_err().code()
}

async fn rows_come_back_in_key_order_and_ranges_use_the_key(f: Fixture) {
    let db = f.db();
    db.create_table(accounts()).await.unwrap();
    let t = accounts_name();
    let mut txn = db.begin();
    for id in [5, -3, 12, 0, 7] {
        txn.insert(&t, account(id, &format!("n{id}"), "1.5"))
            .await
            .unwrap();
    }
    txn.commit().await.unwrap();
    let ids = |range: KeyRange| -> Vec<i64> {
        db.scan(&t, range)
            .unwrap()
            .map(|r| match r.unwrap()[0] {
                Value::Int(i) => i,
                ref v => panic!("unexpected {v:?}"),
            })
            .collect()
    };
    assert_eq!(ids(KeyRange::all()), vec![-3, 0, 5, 7, 12]);
    assert_eq!(
        ids(KeyRange::new(
            Bound::Excluded(vec![Value::Int(0)]),
            Bound::Included(vec![Value::Int(7)])
        )),
        vec![5, 7]
    );
    assert_eq!(ids(KeyRange::point(vec![Value::Int(12)])), vec![12]);
    // Key values are coerced to the key column's type: a decimal 7.0 finds id 7.
    let row = db
        .get(&t, &[Value::Decimal("7.0".parse().unwrap())])
        .unwrap()
        .unwrap();
    assert_eq!(row, account(7, "n7", "1.50"));
    assert_eq!(db.get(&t, &[Value::Int(8)]).unwrap(), None);

    // A composite key: prefix scans return one group in order.
    let def = TableDef {
        name: QualName::bare("pairs"),
        columns: vec![
            col("a", DataType::Varchar(5), false),
            col("b", DataType::Integer, false),
        ],
        primary_key: vec![0, 1],
        explicit_key: true,
    };
    db.create_table(def).await.unwrap();
    let p = QualName::bare("pairs");
    let mut txn = db.begin();
    for (a, b) in [("y", 2), ("x", 3), ("x", 1), ("z", 0), ("x", 2)] {
        txn.insert(&p, vec![Value::Text(a.into()), Value::Int(b)])
            .await
            .unwrap();
    }
    txn.commit().await.unwrap();
    let xs: Vec<_> = db
        .scan(&p, KeyRange::prefix(vec![Value::Text("x".into())]))
        .unwrap()
        .map(|r| r.unwrap()[1].clone())
        .collect();
    assert_eq!(xs, vec![Value::Int(1), Value::Int(2), Value::Int(3)]);
}

async fn bad_input_gets_a_precise_error_and_changes_nothing(f: Fixture) {
    let db = f.db();
    db.create_table(accounts()).await.unwrap();
    let t = accounts_name();
    let mut txn = db.begin();
    txn.insert(&t, account(1, "ann", "10")).await.unwrap();
    txn.commit().await.unwrap();
    let lsn = db.last_lsn();

    let mut txn = db.begin();
    let dup = txn.insert(&t, account(1, "bob", "1")).await.unwrap_err();
    assert_eq!(dup.code(), "23505");
    assert!(
        dup.to_string().contains("accounts") && dup.to_string().contains('1'),
        "{dup}"
    );
    let null = txn
        .insert(&t, vec![Value::Int(2), Value::Null, Value::Null])
        .await
        .unwrap_err();
    assert_eq!(null.code(), "23502");
    assert!(null.to_string().contains("name"), "{null}");
    let long = txn
        .insert(&t, account(3, "much too long", "1"))
        .await
        .unwrap_err();
    assert_eq!(long.code(), "22001");
    assert!(long.to_string().contains("name"), "{long}");
    let range = txn
        .insert(&t, account(4, "d", "123456789"))
        .await
        .unwrap_err();
    assert_eq!(range.code(), "22003");
    assert!(range.to_string().contains("balance"), "{range}");
    let mismatch = txn
        .insert(
            &t,
            vec![Value::Bool(true), Value::Text("e".into()), Value::Null],
        )
        .await;
    assert_eq!(code(mismatch), "42804");
    assert_eq!(code(txn.insert(&t, vec![Value::Int(5)]).await), "42601");
    assert_eq!(
        code(txn.insert(&QualName::bare("nope"), vec![]).await),
        "42P01"
    );
    assert!(!txn.has_writes());
    txn.commit().await.unwrap();
    assert_eq!(code(db.create_table(accounts()).await), "42P07");
    let mut bad = accounts();
    bad.name = QualName::bare("bad");
    bad.primary_key = vec![9];
    assert_eq!(code(db.create_table(bad).await), "42P16");
    assert_eq!(code(db.drop_table(&QualName::bare("nope")).await), "42P01");
    assert_eq!(
        code(
            db.add_column(&t, col("name", DataType::Integer, true))
                .await
        ),
        "42701"
    );
    assert_eq!(db.last_lsn(), lsn, "no failed operation wrote a log record");
    let all: Vec<_> = db.scan(&t, KeyRange::all()).unwrap().collect();
    assert_eq!(all.len(), 1);
}

async fn a_transaction_sees_its_own_writes_and_rollback_discards_them(f: Fixture) {
    let db = f.db();
    db.create_table(accounts()).await.unwrap();
    let t = accounts_name();
    let mut txn = db.begin();
    txn.insert(&t, account(1, "ann", "1")).await.unwrap();
    txn.insert(&t, account(2, "bob", "2")).await.unwrap();
    txn.commit().await.unwrap();

    let mut txn = db.begin();
    txn.insert(&t, account(3, "cat", "3")).await.unwrap();
    assert!(txn.delete(&t, &[Value::Int(1)]).await.unwrap());
    assert!(!txn.delete(&t, &[Value::Int(99)]).await.unwrap());
    // Moving a row to a new key: the old key disappears, the new one appears.
    assert!(txn
        .update(&t, &[Value::Int(2)], account(20, "bob", "2"))
        .await
        .unwrap());
    assert!(!txn
        .update(&t, &[Value::Int(99)], account(99, "x", "0"))
        .await
        .unwrap());
    let seen: Vec<_> = txn
        .scan(&t, KeyRange::all())
        .unwrap()
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    assert_eq!(seen, vec![Value::Int(3), Value::Int(20)]);
    assert_eq!(txn.get(&t, &[Value::Int(1)]).unwrap(), None);
    assert!(
        db.get(&t, &[Value::Int(1)]).unwrap().is_some(),
        "others still see it"
    );
    assert!(
        db.get(&t, &[Value::Int(3)]).unwrap().is_none(),
        "nobody else sees it"
    );
    // Updating onto an existing key is a duplicate.
    assert_eq!(
        code(
            txn.update(&t, &[Value::Int(3)], account(20, "x", "0"))
                .await
        ),
        "23505"
    );
    txn.rollback();
    let ids: Vec<_> = db
        .scan(&t, KeyRange::all())
        .unwrap()
        .map(|r| r.unwrap()[0].clone())
        .collect();
    assert_eq!(ids, vec![Value::Int(1), Value::Int(2)]);

    {
        let mut dropped = db.begin();
        dropped.delete(&t, &[Value::Int(1)]).await.unwrap();
    }
    assert_eq!(db.stats().locks_held, 0, "drop released the locks");
    assert!(db.get(&t, &[Value::Int(1)]).unwrap().is_some());

    let mut txn = db.begin();
    txn.update(&t, &[Value::Int(2)], account(20, "bob", "2.5"))
        .await
        .unwrap();
    let info = txn.commit().await.unwrap();
    assert!(info.durable && !info.is_empty());
    assert_eq!(db.get(&t, &[Value::Int(2)]).unwrap(), None);
    assert_eq!(
        db.get(&t, &[Value::Int(20)]).unwrap(),
        Some(account(20, "bob", "2.50"))
    );
    let empty = db.begin().commit().await.unwrap();
    assert!(empty.is_empty());
}

async fn a_savepoint_undoes_a_failed_statement_only(f: Fixture) {
    let db = f.db();
    db.create_table(accounts()).await.unwrap();
    let t = accounts_name();
    let mut txn = db.begin();
    txn.insert(&t, account(1, "ann", "1")).await.unwrap();
    // A two-row statement whose second row fails: the first row must not stay.
    let sp = txn.statement_savepoint();
    txn.insert(&t, account(2, "bob", "2")).await.unwrap();
    txn.update(&t, &[Value::Int(1)], account(10, "ann", "1"))
        .await
        .unwrap();
    assert!(txn.insert(&t, account(2, "dup", "0")).await.is_err());
    txn.rollback_to(sp);
    assert_eq!(txn.get(&t, &[Value::Int(2)]).unwrap(), None);
    assert_eq!(txn.get(&t, &[Value::Int(10)]).unwrap(), None);
    assert!(txn.get(&t, &[Value::Int(1)]).unwrap().is_some());
    assert_eq!(txn.changes().len(), 1);
    txn.commit().await.unwrap();
    let all: Vec<_> = db
        .scan(&t, KeyRange::all())
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(all, vec![account(1, "ann", "1")]);
    let last = db.log_range(db.last_lsn(), 1).unwrap();
    let LogEntry::Txn(tx) = &last[0].entry else {
        panic!("expected a transaction record")
    };
    assert_eq!(tx.changes.len(), 1, "the log holds only what survived");
}

async fn concurrent_increments_never_lose_an_update(f: Fixture) {
    let db = f.db().clone();
    db.create_table(counters()).await.unwrap();
    let t = QualName::bare("counters");
    let mut txn = db.begin();
    txn.insert(&t, vec![Value::Int(1), Value::Int(0)])
        .await
        .unwrap();
    txn.commit().await.unwrap();
    const TASKS: i64 = 8;
    const EACH: i64 = 25;
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let db = db.clone();
        let t = t.clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..EACH {
                let mut txn = db.begin();
                let row = txn
                    .lock_and_get(&t, &[Value::Int(1)])
                    .await
                    .unwrap()
                    .unwrap();
                let Value::Int(n) = row[1] else {
                    panic!("n is an integer")
                };
                txn.update(&t, &[Value::Int(1)], vec![Value::Int(1), Value::Int(n + 1)])
                    .await
                    .unwrap();
                txn.commit().await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(
        db.get(&t, &[Value::Int(1)]).unwrap(),
        Some(vec![Value::Int(1), Value::Int(TASKS * EACH)])
    );
    assert_eq!(db.stats().locks_held, 0);
}

async fn a_lock_wait_past_the_timeout_fails_retryably(mut f: Fixture) {
    f.opts.lock_timeout = Duration::from_millis(100);
    let db = f.reopen().clone();
    db.create_table(counters()).await.unwrap();
    let t = QualName::bare("counters");
    let mut a = db.begin();
    a.insert(&t, vec![Value::Int(1), Value::Int(0)])
        .await
        .unwrap();
    let mut b = db.begin();
    let err = b.lock_and_get(&t, &[Value::Int(1)]).await.unwrap_err();
    assert_eq!(err.code(), "55P03");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("counters"), "{err}");
    a.commit().await.unwrap();
    let row = b.lock_and_get(&t, &[Value::Int(1)]).await.unwrap();
    assert_eq!(row, Some(vec![Value::Int(1), Value::Int(0)]));
}

async fn the_log_records_images_with_dense_gtids(f: Fixture) {
    let db = f.db();
    db.create_table(accounts()).await.unwrap();
    let t = accounts_name();
    let mut txn = db.begin();
    txn.insert(&t, account(1, "ann", "1")).await.unwrap();
    let c1 = txn.commit().await.unwrap();
    let mut txn = db.begin();
    txn.update(&t, &[Value::Int(1)], account(1, "ann", "2"))
        .await
        .unwrap();
    txn.delete(&t, &[Value::Int(1)]).await.unwrap();
    let c2 = txn.commit().await.unwrap();
    assert_eq!(c2.gtid.seq, c1.gtid.seq + 1);
    assert_eq!(c2.lsn, c1.lsn.next());
    assert_eq!(c1.gtid.origin, db.node_id());

    let log = db.log_range(Lsn(1), 100).unwrap();
    assert_eq!(log.len(), 3);
    let seqs: Vec<_> = log.iter().map(|r| r.gtid().seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert!(
        matches!(&log[0].entry, LogEntry::Ddl { op: DdlOp::CreateTable(d), .. } if d.name == t)
    );
    let LogEntry::Txn(tx) = &log[2].entry else {
        panic!("expected a transaction")
    };
    assert_eq!(tx.gtid, c2.gtid);
    let ops: Vec<_> = tx.changes.iter().map(|c| c.op).collect();
    assert_eq!(ops, vec![ChangeOp::Update, ChangeOp::Delete]);
    assert_eq!(tx.changes[0].before, Some(account(1, "ann", "1")));
    assert_eq!(tx.changes[0].after, Some(account(1, "ann", "2")));
    assert_eq!(tx.changes[1].before, Some(account(1, "ann", "2")));
    assert_eq!(tx.changes[1].after, None);
    assert_eq!(db.log_range(Lsn(3), 100).unwrap().len(), 1);
    assert_eq!(db.high_water(db.node_id()).unwrap(), 3);
    let s = db.stats();
    assert_eq!(s.commits, 3);
    assert!(s.flushes >= 1 && s.flushes <= 3);
    assert_eq!(s.flushed_lsn, Lsn(3));
}

async fn drop_and_recreate_never_mixes_rows(f: Fixture) {
    let db = f.db();
    let t = accounts_name();
    db.create_table(accounts()).await.unwrap();
    let mut txn = db.begin();
    txn.insert(&t, account(1, "old", "1")).await.unwrap();
    txn.commit().await.unwrap();
    // A transaction that wrote the table before DROP cannot commit after it.
    let mut late = db.begin();
    late.insert(&t, account(2, "late", "1")).await.unwrap();
    db.drop_table(&t).await.unwrap();
    assert!(db.table(&t).is_none());
    assert_eq!(code(db.get(&t, &[Value::Int(1)])), "42P01");
    db.create_table(accounts()).await.unwrap();
    let err = late.commit().await.unwrap_err();
    assert_eq!(err.code(), "40001");
    assert_eq!(db.scan(&t, KeyRange::all()).unwrap().count(), 0);
}

async fn add_column_fills_old_rows_with_the_default(f: Fixture) {
    let db = f.db();
    let t = accounts_name();
    db.create_table(accounts()).await.unwrap();
    let mut txn = db.begin();
    txn.insert(&t, account(1, "ann", "1")).await.unwrap();
    txn.commit().await.unwrap();
    let mut flag = col("vip", DataType::Boolean, false);
    assert_eq!(code(db.add_column(&t, flag.clone()).await), "42P16");
    flag.default = Some(Value::Text("false".into()));
    db.add_column(&t, flag).await.unwrap();
    let def = db.table(&t).unwrap();
    assert_eq!(def.columns.len(), 4);
    assert_eq!(
        def.columns[3].default,
        Some(Value::Bool(false)),
        "default coerced"
    );
    let mut row = account(1, "ann", "1");
    row.push(Value::Bool(false));
    assert_eq!(db.get(&t, &[Value::Int(1)]).unwrap(), Some(row));
    let mut txn = db.begin();
    let mut new = account(2, "bob", "1");
    new.push(Value::Bool(true));
    txn.insert(&t, new.clone()).await.unwrap();
    txn.commit().await.unwrap();
    assert_eq!(db.get(&t, &[Value::Int(2)]).unwrap(), Some(new));
}

async fn sequences_step_cycle_and_run_out(f: Fixture) {
    let db = f.db();
    let s = QualName::bare("s");
    db.create_sequence(SequenceDef::with_defaults(
        s.clone(),
        Some(5),
        None,
        Some(12),
        Some(2),
        false,
    ))
    .await
    .unwrap();
    let vals: Vec<_> = (0..3).map(|_| db.next_val(&s).unwrap()).collect();
    assert_eq!(vals, vec![2, 7, 12]);
    let err = db.next_val(&s).unwrap_err();
    assert_eq!(err.code(), "2200H");
    assert!(err.to_string().contains('s'));

    let c = QualName::bare("c");
    db.create_sequence(SequenceDef::with_defaults(
        c.clone(),
        Some(-1),
        Some(-2),
        Some(0),
        None,
        true,
    ))
    .await
    .unwrap();
    let vals: Vec<_> = (0..5).map(|_| db.next_val(&c).unwrap()).collect();
    assert_eq!(vals, vec![0, -1, -2, 0, -1]);

    assert_eq!(code(db.next_val(&QualName::bare("nope"))), "42P01");
    assert_eq!(
        code(
            db.create_sequence(SequenceDef::with_defaults(
                c.clone(),
                None,
                None,
                None,
                None,
                false
            ))
            .await
        ),
        "42P07"
    );
    db.drop_sequence(&c).await.unwrap();
    assert!(db.sequence(&c).is_none());
    assert_eq!(db.sequences().len(), 1);
    let blocks = db
        .log_range(Lsn(1), 100)
        .unwrap()
        .into_iter()
        .filter(|r| matches!(r.entry, LogEntry::SequenceBlock { .. }))
        .count();
    assert_eq!(blocks, 2, "one block reservation per sequence so far");
}

async fn a_reopened_database_has_everything_committed(mut f: Fixture) {
    let t = accounts_name();
    {
        let db = f.db();
        db.create_table(accounts()).await.unwrap();
        for i in 0..30 {
            let mut txn = db.begin();
            txn.insert(&t, account(i, "x", "1")).await.unwrap();
            txn.commit().await.unwrap();
        }
        let mut open = db.begin();
        open.insert(&t, account(100, "pending", "1")).await.unwrap();
        // Dropped without commit.
    }
    let before = f.db().last_lsn();
    let db = f.reopen();
    assert_eq!(db.last_lsn(), before);
    assert_eq!(db.table(&t).unwrap().columns.len(), 3);
    assert_eq!(db.scan(&t, KeyRange::all()).unwrap().count(), 30);
    assert_eq!(db.get(&t, &[Value::Int(100)]).unwrap(), None);
    let mut txn = db.begin();
    txn.insert(&t, account(31, "y", "1")).await.unwrap();
    let info = txn.commit().await.unwrap();
    assert_eq!(info.lsn, before.next());
    assert_eq!(info.gtid.seq, 32, "seq continues after 1 DDL + 30 commits");
}

async fn a_reopened_sequence_resumes_at_the_next_block(mut f: Fixture) {
    let s = QualName::bare("s");
    f.db()
        .create_sequence(SequenceDef::with_defaults(
            s.clone(),
            None,
            None,
            None,
            None,
            false,
        ))
        .await
        .unwrap();
    for i in 1..=3 {
        assert_eq!(f.db().next_val(&s).unwrap(), i);
    }
    let db = f.reopen();
    // The rest of the first block (4..=20) is skipped, never handed out twice.
    assert_eq!(db.next_val(&s).unwrap(), 21);
    assert_eq!(db.next_val(&s).unwrap(), 22);
}

async fn a_table_without_primary_key_keys_on_all_columns(f: Fixture) {
    let db = f.db();
    let def = TableDef {
        name: QualName::bare("bag"),
        columns: vec![
            col("a", DataType::Integer, true),
            col("b", DataType::Char(3), true),
        ],
        primary_key: vec![],
        explicit_key: false,
    };
    db.create_table(def).await.unwrap();
    let t = QualName::bare("bag");
    assert_eq!(db.table(&t).unwrap().primary_key, vec![0, 1]);
    let mut txn = db.begin();
    txn.insert(&t, vec![Value::Int(1), Value::Text("x".into())])
        .await
        .unwrap();
    txn.insert(&t, vec![Value::Null, Value::Text("x".into())])
        .await
        .unwrap();
    txn.insert(&t, vec![Value::Int(1), Value::Null])
        .await
        .unwrap();
    let dup = txn
        .insert(&t, vec![Value::Int(1), Value::Text("x  ".into())])
        .await
        .unwrap_err();
    assert_eq!(
        dup.code(),
        "23505",
        "CHAR pads, so 'x' and 'x  ' are the same row"
    );
    txn.commit().await.unwrap();
    let rows: Vec<_> = db
        .scan(&t, KeyRange::all())
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(
        rows,
        vec![
            vec![Value::Null, Value::Text("x  ".into())],
            vec![Value::Int(1), Value::Null],
            vec![Value::Int(1), Value::Text("x  ".into())],
        ]
    );
    assert_eq!(
        code(db.add_column(&t, col("c", DataType::Integer, true)).await),
        "0A000"
    );
}

async fn a_hiding_commit_is_invisible_and_blocks_writers_until_its_hold_ends(f: Fixture) {
    let db = f.db();
    db.create_table(counters()).await.unwrap();
    let t = QualName::bare("counters");
    let mut setup = db.begin();
    for k in [1, 2] {
        setup
            .insert(&t, vec![Value::Int(k), Value::Int(0)])
            .await
            .unwrap();
    }
    setup.commit().await.unwrap();

    // Update 1, delete 2, insert 3: held until `go` fires.
    let mut txn = db.begin();
    txn.update(&t, &[Value::Int(1)], vec![Value::Int(1), Value::Int(10)])
        .await
        .unwrap();
    txn.delete(&t, &[Value::Int(2)]).await.unwrap();
    txn.insert(&t, vec![Value::Int(3), Value::Int(30)])
        .await
        .unwrap();
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let (flushed_tx, flushed) = tokio::sync::oneshot::channel();
    let committing = tokio::spawn(async move {
        let committed = txn.commit_held(true).await?;
        flushed_tx.send(committed.info()).unwrap();
        wait.await.unwrap();
        Ok::<_, hawser_store::StoreError>(committed.info())
    });
    let info = flushed.await.unwrap();
    assert!(!info.is_empty());
    // The commit is in the log, yet readers see the rows as they were.
    assert_eq!(db.last_lsn(), info.lsn);
    let all = |db: &hawser_store::Database| -> Vec<Vec<Value>> {
        db.scan(&t, KeyRange::all())
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    };
    let before = vec![
        vec![Value::Int(1), Value::Int(0)],
        vec![Value::Int(2), Value::Int(0)],
    ];
    assert_eq!(all(db), before);
    assert_eq!(db.get(&t, &[Value::Int(3)]).unwrap(), None);
    assert_eq!(db.held_rows(), 3);
    let reader = db.begin();
    assert_eq!(reader.scan(&t, KeyRange::all()).unwrap(), before);

    // A writer of a held row waits for the hold and then builds on the commit.
    let writer_db = db.clone();
    let writer_t = t.clone();
    let writer = tokio::spawn(async move {
        let mut w = writer_db.begin();
        let row = w.lock_and_get(&writer_t, &[Value::Int(1)]).await.unwrap();
        w.rollback();
        row
    });
    tokio::task::yield_now().await;
    assert!(!writer.is_finished());

    go.send(()).unwrap();
    let info2 = committing.await.unwrap().unwrap();
    assert_eq!(info2, info);
    assert_eq!(
        writer.await.unwrap(),
        Some(vec![Value::Int(1), Value::Int(10)])
    );
    assert_eq!(
        all(db),
        vec![
            vec![Value::Int(1), Value::Int(10)],
            vec![Value::Int(3), Value::Int(30)],
        ]
    );
    assert_eq!(db.held_rows(), 0);

    // A holding commit whose caller goes away mid-hold: committed, shown, unlocked.
    let mut txn = db.begin();
    txn.update(&t, &[Value::Int(1)], vec![Value::Int(1), Value::Int(11)])
        .await
        .unwrap();
    let (flushed_tx, flushed) = tokio::sync::oneshot::channel();
    let abandoned = tokio::spawn(async move {
        let _committed = txn.commit_held(true).await;
        flushed_tx.send(()).unwrap();
        std::future::pending::<()>().await
    });
    flushed.await.unwrap();
    assert_eq!(db.held_rows(), 1);
    abandoned.abort();
    assert!(abandoned.await.unwrap_err().is_cancelled());
    assert_eq!(db.held_rows(), 0);
    assert_eq!(
        db.get(&t, &[Value::Int(1)]).unwrap(),
        Some(vec![Value::Int(1), Value::Int(11)])
    );
    let mut w = db.begin();
    assert!(w
        .lock_and_get(&t, &[Value::Int(1)])
        .await
        .unwrap()
        .is_some());
}

async fn a_received_table_refuses_client_writes_naming_why(f: Fixture) {
    let db = f.db();
    db.create_table(counters()).await.unwrap();
    let t = QualName::bare("counters");
    let reason = "it is replicated here from master ds1 (scheme r1); write on ds1".to_string();
    db.set_write_refusals([(t.clone(), reason)].into_iter().collect(), 0);
    let mut txn = db.begin();
    let err = txn
        .insert(&t, vec![Value::Int(1), Value::Int(0)])
        .await
        .unwrap_err();
    assert_eq!(err.code(), "25006");
    assert!(err.to_string().contains("master ds1"), "{err}");
    drop(txn);
    db.set_write_refusals(Default::default(), 0);
    let mut txn = db.begin();
    txn.insert(&t, vec![Value::Int(1), Value::Int(0)])
        .await
        .unwrap();
    txn.commit().await.unwrap();
}

async fn released_log_is_gone_and_stays_gone_after_reopening(mut f: Fixture) {
    let db = f.db();
    db.create_table(accounts()).await.unwrap();
    let t = accounts_name();
    for i in 1..=9 {
        let mut txn = db.begin();
        txn.insert(&t, account(i, "ann", "1")).await.unwrap();
        txn.commit().await.unwrap();
    }
    // LSN 1 is the CREATE TABLE, 2..=10 the inserts.
    assert_eq!((db.log_start(), db.last_lsn()), (Lsn(1), Lsn(10)));
    let full = db.log_retained_bytes();
    assert!(full > 0);
    assert_log_bytes_add_up(db);
    // Nothing goes while the log is no bigger than what is kept.
    assert_eq!(db.release_log(Lsn(5), full).unwrap(), 0);
    assert_eq!(db.log_start(), Lsn(1));

    assert_eq!(db.release_log(Lsn(4), 0).unwrap(), 4);
    assert_eq!(db.log_start(), Lsn(5));
    assert!(db.log_retained_bytes() < full);
    assert_log_bytes_add_up(db);
    let first = db.log_range(Lsn(1), 100).unwrap();
    assert_eq!(first.first().map(|r| r.lsn), Some(Lsn(5)));
    assert_eq!(first.len(), 6);
    // Releasing less than is already gone changes nothing.
    assert_eq!(db.release_log(Lsn(3), 0).unwrap(), 0);
    // `keep_bytes` keeps the newest records: at least that many bytes stay.
    let keep = db.log_retained_bytes() / 2;
    let released = db.release_log(Lsn(100), keep).unwrap();
    assert!(released > 0 && db.log_retained_bytes() >= keep);
    // The last record is never released: the next LSN is read from it.
    db.release_log(Lsn(100), 0).unwrap();
    assert_eq!(db.log_start(), Lsn(10));
    assert_eq!(db.log_range(Lsn(1), 100).unwrap().len(), 1);
    let retained = db.log_retained_bytes();
    // Rows are untouched by a release.
    assert_eq!(db.scan(&t, KeyRange::all()).unwrap().count(), 9);

    let db = f.reopen();
    assert_eq!((db.log_start(), db.last_lsn()), (Lsn(10), Lsn(10)));
    assert_eq!(db.log_retained_bytes(), retained);
    assert_eq!(db.high_water(db.node_id()).unwrap(), 10);
    assert_log_bytes_add_up(db);
    let mut txn = db.begin();
    txn.insert(&t, account(10, "bob", "1")).await.unwrap();
    let c = txn.commit().await.unwrap();
    assert_eq!((c.lsn, c.gtid.seq), (Lsn(11), 11));
    assert_log_bytes_add_up(db);
}

/// `ddl_from` finds the DDL records of the log from an LSN on (by LSNs kept in memory,
/// rebuilt when the store opens), and none that were released.
async fn ddl_records_are_found_from_any_lsn_before_and_after_reopening(mut f: Fixture) {
    let db = f.db();
    let t = accounts_name();
    db.create_table(accounts()).await.unwrap();
    for i in 1..=3 {
        let mut txn = db.begin();
        txn.insert(&t, account(i, "ann", "1")).await.unwrap();
        txn.commit().await.unwrap();
    }
    db.drop_table(&t).await.unwrap();
    db.create_table(accounts()).await.unwrap();
    let mut txn = db.begin();
    txn.insert(&t, account(4, "bob", "1")).await.unwrap();
    txn.commit().await.unwrap();
    // LSN 1 CREATE, 2..=4 inserts, 5 DROP, 6 CREATE, 7 insert.
    let ddl = |db: &hawser_store::Database, from: u64| -> Vec<u64> {
        db.ddl_from(Lsn(from))
            .unwrap()
            .iter()
            .map(|r| {
                assert!(matches!(r.entry, hawser_store::LogEntry::Ddl { .. }));
                r.lsn.0
            })
            .collect()
    };
    assert_eq!(ddl(db, 1), [1, 5, 6]);
    assert_eq!(ddl(db, 2), [5, 6]);
    assert_eq!(ddl(db, 6), [6]);
    assert!(ddl(db, 7).is_empty());
    let db = f.reopen();
    assert_eq!(ddl(db, 0), [1, 5, 6]);
    db.release_log(Lsn(5), 0).unwrap();
    assert_eq!(ddl(db, 1), [6]);
    let db = f.reopen();
    assert_eq!(ddl(db, 1), [6]);
}

/// `log_bytes_from` (kept in memory) agrees with what the log holds: everything from
/// the log's start or before, less and less after it, nothing past its end.
fn assert_log_bytes_add_up(db: &hawser_store::Database) {
    let (start, last) = (db.log_start(), db.last_lsn());
    let all = db.log_retained_bytes();
    assert_eq!(db.log_bytes_from(Lsn(0)).unwrap(), all);
    assert_eq!(db.log_bytes_from(start).unwrap(), all);
    assert_eq!(db.log_bytes_from(last.next()).unwrap(), 0);
    let mut before = all;
    for lsn in start.0 + 1..=last.0 {
        let from = db.log_bytes_from(Lsn(lsn)).unwrap();
        assert!(
            0 < from && from < before,
            "bytes from {lsn}: {from} of {before}"
        );
        before = from;
    }
}

async fn stream_positions_persist_until_forgotten(mut f: Fixture) {
    let db = f.db();
    assert!(db.positions().unwrap().is_empty());
    let at = |lsn: u64, node: Option<u64>| Position {
        lsn: Lsn(lsn),
        receiver: node.map(NodeId),
    };
    db.set_positions(&[
        ("r/n2".to_string(), Some(at(7, Some(2)))),
        ("r/n3".to_string(), Some(at(2, None))),
        ("r/n4".to_string(), Some(at(3, Some(4)))),
    ])
    .unwrap();
    db.set_positions(&[
        ("r/n2".to_string(), Some(at(9, Some(22)))),
        ("r/n3".to_string(), None),
    ])
    .unwrap();
    let expected: std::collections::BTreeMap<String, Position> = [
        ("r/n2".to_string(), at(9, Some(22))),
        ("r/n4".to_string(), at(3, Some(4))),
    ]
    .into_iter()
    .collect();
    assert_eq!(db.positions().unwrap(), expected);
    assert_eq!(f.reopen().positions().unwrap(), expected);
}

async fn the_log_tail_serves_recent_records_as_the_log_has_them(f: Fixture) {
    let db = f.db();
    db.create_table(accounts()).await.unwrap();
    let t = accounts_name();
    let commits = hawser_store::db::TAIL_RECORDS as i64 + 10;
    for i in 1..=commits {
        let mut txn = db.begin();
        txn.insert(&t, account(i, "ann", "1")).await.unwrap();
        txn.commit().await.unwrap();
    }
    let last = db.last_lsn();
    assert_eq!(last.0, commits as u64 + 1);
    // Recent LSNs: the same records the engine holds.
    let from = Lsn(last.0 - 20);
    let tail = db
        .log_tail(from, 8)
        .expect("recent records are in the tail");
    let stored = db.log_range(from, 8).unwrap();
    assert_eq!(tail.len(), 8);
    assert!(tail.iter().zip(&stored).all(|(a, b)| **a == *b));
    // Past the end: nothing yet, not a miss.
    assert_eq!(db.log_tail(last.next(), 8).map(|v| v.len()), Some(0));
    // Older than the tail: the engine has them.
    assert!(db.log_tail(Lsn(1), 8).is_none());
}
