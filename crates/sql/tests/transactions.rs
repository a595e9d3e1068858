//! Transactions, isolation, concurrency, key-range access and the sled engine.

mod common;

use common::*;
use hawser_core::NodeId;
use hawser_sql::SqlEngine;
use hawser_store::{Database, DbOptions};

#[tokio::test]
async fn commit_applies_a_block_and_rollback_drops_it() {
    let eng = engine();
    let mut s = eng.session();
    let mut other = eng.session();
    ok(&mut s, "create table t (k int primary key, v int)").await;
    let r = ok(
        &mut s,
        "begin; insert into t values (1, 1); insert into t values (2, 2)",
    )
    .await;
    assert_eq!(r[0].tag, "BEGIN");
    assert!(s.in_transaction());
    // Read committed: the other session does not see uncommitted rows; we see ours.
    assert!(query(&mut other, "select * from t").await.is_empty());
    assert_eq!(text(&mut s, "select count(*) from t").await, vec!["2"]);
    ok(&mut s, "commit").await;
    assert!(!s.in_transaction());
    assert_eq!(text(&mut other, "select k from t").await, vec!["1", "2"]);

    ok(
        &mut s,
        "start transaction; delete from t; update t set v = 9; insert into t values (3, 3)",
    )
    .await;
    assert_eq!(text(&mut s, "select k from t").await, vec!["3"]);
    ok(&mut s, "rollback").await;
    assert_eq!(text(&mut s, "select k, v from t").await, vec!["1|1", "2|2"]);
}

#[tokio::test]
async fn a_failed_statement_inside_a_transaction_leaves_no_partial_effect() {
    let mut s = engine().session();
    ok(&mut s, "create table t (k int primary key, v varchar(3))").await;
    ok(&mut s, "begin; insert into t values (1, 'a')").await;
    let e = fails(
        &mut s,
        "insert into t values (2, 'b'), (3, 'c'), (1, 'dup')",
    )
    .await;
    assert_eq!(e.code, "23505");
    assert!(s.in_transaction(), "the transaction stays open");
    let e = fails(&mut s, "update t set v = v || 'xyz'").await;
    assert_eq!(e.code, "22001");
    ok(&mut s, "insert into t values (4, 'd'); commit").await;
    assert_eq!(text(&mut s, "select * from t").await, vec!["1|a", "4|d"]);
}

#[tokio::test]
async fn transaction_state_warnings_and_ddl_in_a_block() {
    let mut s = engine().session();
    let r = ok(&mut s, "commit").await;
    assert_eq!(r[0].warnings[0].code, "25P01");
    let r = ok(&mut s, "rollback").await;
    assert_eq!(r[0].warnings[0].code, "25P01");
    let r = ok(&mut s, "begin; begin").await;
    assert!(r[0].warnings.is_empty());
    assert_eq!(r[1].warnings[0].code, "25001");
    let e = fails(&mut s, "create table t (k int)").await;
    assert_eq!(e.code, "25001");
    ok(&mut s, "rollback").await;
    ok(&mut s, "create table t (k int)").await;
}

#[tokio::test]
async fn dropping_a_session_rolls_back_its_transaction() {
    let eng = engine();
    let mut s = eng.session();
    ok(
        &mut s,
        "create table t (k int primary key); begin; insert into t values (1)",
    )
    .await;
    drop(s);
    let mut other = eng.session();
    assert!(query(&mut other, "select * from t").await.is_empty());
    // Its row lock is gone too: the same key can be written at once.
    ok(&mut other, "insert into t values (1)").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_increments_never_lose_an_update() {
    const TASKS: usize = 16;
    const ROUNDS: usize = 25;
    let eng = engine();
    let mut s = eng.session();
    ok(
        &mut s,
        "create table t (k int primary key, c int); insert into t values (1, 0), (2, 0)",
    )
    .await;
    let mut handles = Vec::new();
    for i in 0..TASKS {
        let eng = eng.clone();
        handles.push(tokio::spawn(async move {
            let mut s = eng.session();
            for _ in 0..ROUNDS {
                if i % 2 == 0 {
                    ok(&mut s, "update t set c = c + 1 where k = 1").await;
                } else {
                    // The same through an explicit transaction that also touches row 2.
                    ok(&mut s, "begin; update t set c = c + 1 where k = 1; update t set c = c + 1 where k = 2; commit").await;
                }
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    assert_eq!(
        text(&mut s, "select c from t order by k").await,
        vec![
            (TASKS * ROUNDS).to_string(),
            (TASKS / 2 * ROUNDS).to_string()
        ]
    );
}

#[tokio::test]
async fn point_lookups_and_key_ranges_use_the_key_order() {
    let mut s = engine().session();
    ok(&mut s, "create table t (k int primary key, v int); create table c (a int, b int, v int, primary key (a, b))").await;
    let mut values = Vec::new();
    for i in 1..=100 {
        values.push(format!("({i}, {})", i % 7));
    }
    ok(
        &mut s,
        &format!("insert into t values {}", values.join(", ")),
    )
    .await;
    let mut values = Vec::new();
    for a in 1..=10 {
        for b in 1..=10 {
            values.push(format!("({a}, {b}, {})", a * b));
        }
    }
    ok(
        &mut s,
        &format!("insert into c values {}", values.join(", ")),
    )
    .await;

    let plan = |rows: Vec<String>| rows.join("\n");
    let p = plan(text(&mut s, "explain select * from t where k = 42").await);
    assert!(p.contains("KEY LOOKUP t (k = 42)"), "{p}");
    let p = plan(
        text(
            &mut s,
            "explain select * from t where k between 10 and 19 and v = 3",
        )
        .await,
    );
    assert!(p.contains("KEY RANGE SCAN t (k >= 10, k <= 19)"), "{p}");
    let p = plan(text(&mut s, "explain select * from t where v = 3").await);
    assert!(p.contains("FULL SCAN t"), "{p}");
    let p = plan(text(&mut s, "explain select * from c where a = 3 and b > 7").await);
    assert!(p.contains("KEY RANGE SCAN c (a = 3, b > 7)"), "{p}");
    let p = plan(text(&mut s, "explain update t set v = 0 where 5 > k").await);
    assert!(p.contains("KEY RANGE SCAN t (k < 5)"), "{p}");
    let p = plan(text(&mut s, "explain delete from c where a = 2 and b = 2").await);
    assert!(p.contains("KEY LOOKUP c (a = 2, b = 2)"), "{p}");

    // EXPLAIN ANALYZE runs the statement and counts the rows it read.
    let scanned = |rows: Vec<String>| -> u64 {
        rows.iter()
            .find_map(|l| l.strip_prefix("rows scanned: "))
            .and_then(|n| n.parse().ok())
            .expect("rows scanned line")
    };
    assert_eq!(
        scanned(text(&mut s, "explain analyze select * from t where k = 42").await),
        1
    );
    assert_eq!(
        scanned(
            text(
                &mut s,
                "explain analyze select * from t where k >= 10 and k < 20"
            )
            .await
        ),
        10
    );
    assert_eq!(
        scanned(text(&mut s, "explain analyze select * from t where v = 3").await),
        100
    );
    assert_eq!(
        scanned(text(&mut s, "explain analyze select * from c where a = 3").await),
        10
    );
    assert_eq!(
        scanned(
            text(
                &mut s,
                "explain analyze select * from c where a = 3 and b >= 9"
            )
            .await
        ),
        2
    );
    assert_eq!(
        scanned(
            text(
                &mut s,
                "explain analyze select * from c where a = 3 and b > 9"
            )
            .await
        ),
        1
    );
    assert_eq!(
        scanned(text(&mut s, "explain analyze select * from t where k = null").await),
        0
    );
    assert_eq!(
        scanned(text(&mut s, "explain analyze update t set v = v + 1 where k = 7").await),
        1
    );
    // And the answers are right.
    assert_eq!(text(&mut s, "select v from t where k = 7").await, vec!["1"]);
    assert_eq!(
        text(
            &mut s,
            "select count(*), sum(v) from c where a = 3 and b > 7"
        )
        .await,
        vec!["3|81"]
    );
    assert_eq!(
        text(&mut s, "select count(*) from t where k > 99.5").await,
        vec!["1"]
    );
}

#[tokio::test]
async fn sled_database_keeps_committed_sql_across_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = Database::open_sled(dir.path(), DbOptions::new(NodeId(7))).expect("open sled");
        let mut s = SqlEngine::new(db).session();
        ok(
            &mut s,
            "create table t (k int primary key, v varchar(10));
             create sequence q;
             insert into t values (q.nextval, 'a'), (q.nextval, 'b');
             begin; insert into t values (10, 'pending')",
        )
        .await;
        // The session (and its open transaction) goes away with the database.
    }
    let db = Database::open_sled(dir.path(), DbOptions::new(NodeId(7))).expect("reopen sled");
    let mut s = SqlEngine::new(db).session();
    assert_eq!(text(&mut s, "select * from t").await, vec!["1|a", "2|b"]);
    let next: i64 = text(&mut s, "select q.nextval from dual").await[0]
        .parse()
        .expect("number");
    assert!(next > 2, "a sequence never hands out a value twice: {next}");
}
