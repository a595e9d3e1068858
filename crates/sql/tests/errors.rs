//! Bad input: every error is precise (SQLSTATE, statement, line and column where the
//! parser gives one) and leaves the database unchanged.

mod common;

use common::*;

async fn setup() -> hawser_sql::Session {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table t (k int primary key, name varchar(5) not null, small tinyint, amount number(5,2));
         insert into t values (1, 'one', 1, 1.00)",
    )
    .await;
    s
}

async fn unchanged(s: &mut hawser_sql::Session) {
    assert_eq!(text(s, "select * from t").await, vec!["1|one|1|1.00"]);
}

#[tokio::test]
async fn syntax_errors_name_statement_line_and_column() {
    let mut s = setup().await;
    let e = fails(
        &mut s,
        "insert into t values (2, 'two', 2, 2);\nselect * fro t;\nselect 1",
    )
    .await;
    assert_eq!(e.code, "42601");
    assert_eq!(e.statement, 2);
    assert_eq!(e.line, Some(2));
    assert_eq!(e.column, Some(10));
    assert!(
        e.to_string()
            .starts_with("statement 2 (line 2, column 10): syntax error"),
        "{e}"
    );
    // The script is parsed before anything runs: statement 1 did not insert.
    unchanged(&mut s).await;
}

#[tokio::test]
async fn unknown_table_and_column_point_at_the_name() {
    let mut s = setup().await;
    let e = fails(&mut s, "select 1;\n  select nme from t").await;
    assert_eq!((e.code.as_str(), e.statement), ("42703", 2));
    assert_eq!((e.line, e.column), (Some(2), Some(10)));
    assert!(e.message.contains("nme") && e.message.contains("t"), "{e}");
    let e = fails(&mut s, "select * from nosuch").await;
    assert_eq!(e.code, "42P01");
    assert_eq!((e.line, e.column), (Some(1), Some(15)));
    assert_eq!(
        fails(&mut s, "insert into t (k, nope) values (1, 2)")
            .await
            .code,
        "42703"
    );
    assert_eq!(fails(&mut s, "update t set nope = 1").await.code, "42703");
    assert_eq!(
        fails(&mut s, "delete from nosuch where k = 1").await.code,
        "42P01"
    );
    assert_eq!(fails(&mut s, "select x.k from t").await.code, "42P01");
    unchanged(&mut s).await;
}

#[tokio::test]
async fn type_mismatches() {
    let mut s = setup().await;
    let e = fails(&mut s, "select * from t where name = 1").await;
    assert_eq!(e.code, "42804");
    let e = fails(&mut s, "update t set small = 'abc' where k = 1").await;
    assert_eq!(e.code, "22018");
    let e = fails(&mut s, "insert into t values (2, 'two', true, 1)").await;
    assert_eq!(e.code, "42804");
    assert_eq!((e.line, e.column), (Some(1), Some(33)));
    assert!(e.message.contains("small"), "{e}");
    let e = fails(&mut s, "select 'a' + 1").await;
    assert_eq!(e.code, "42804");
    let e = fails(&mut s, "select * from t where k").await;
    assert_eq!(e.code, "42804");
    unchanged(&mut s).await;
}

#[tokio::test]
async fn not_null_duplicate_key_overlong_and_overflow_leave_nothing_behind() {
    let mut s = setup().await;
    // The third row of each multi-row INSERT fails: none of its rows stay.
    let e = fails(
        &mut s,
        "insert into t values (2, 'a', 1, 1), (3, 'b', 1, 1), (4, null, 1, 1)",
    )
    .await;
    assert_eq!(e.code, "23502");
    assert!(e.message.contains("name"), "{e}");
    let e = fails(&mut s, "insert into t (k, small) values (5, 1)").await;
    assert_eq!(e.code, "23502");
    let e = fails(
        &mut s,
        "insert into t values (2, 'a', 1, 1), (3, 'b', 1, 1), (1, 'dup', 1, 1)",
    )
    .await;
    assert_eq!(e.code, "23505");
    let e = fails(
        &mut s,
        "insert into t values (2, 'a', 1, 1), (3, 'toolong', 1, 1)",
    )
    .await;
    assert_eq!(e.code, "22001");
    assert_eq!((e.line, e.column), (Some(1), Some(42)));
    let e = fails(&mut s, "insert into t values (2, 'a', 1000, 1)").await;
    assert_eq!(e.code, "22003");
    let e = fails(&mut s, "insert into t values (2, 'a', 1, 1000)").await;
    assert_eq!(e.code, "22003");
    let e = fails(&mut s, "update t set small = small + 200").await;
    assert_eq!(e.code, "22003");
    let e = fails(&mut s, "select 9223372036854775807 + 1").await;
    assert_eq!(e.code, "22003");
    let e = fails(&mut s, "select 1 / 0").await;
    assert_eq!(e.code, "22012");
    let e = fails(&mut s, "create table t (k int)").await;
    assert_eq!(e.code, "42P07");
    unchanged(&mut s).await;
}

#[tokio::test]
async fn invalid_definitions_and_statements() {
    let mut s = setup().await;
    assert_eq!(
        fails(&mut s, "create table x (a varchar)").await.code,
        "42P16"
    );
    assert_eq!(
        fails(&mut s, "create table x (a decimal(40, 2))")
            .await
            .code,
        "42P16"
    );
    assert_eq!(
        fails(&mut s, "create table x (a int, a int)").await.code,
        "42701"
    );
    assert_eq!(
        fails(
            &mut s,
            "create table x (a int primary key, b int, primary key (b))"
        )
        .await
        .code,
        "42P16"
    );
    assert_eq!(fails(&mut s, "create table x (a json)").await.code, "0A000");
    assert_eq!(
        fails(&mut s, "insert into t values (1, 'a')").await.code,
        "42601"
    );
    assert_eq!(
        fails(&mut s, "select k from t order by 5").await.code,
        "42601"
    );
    assert_eq!(
        fails(&mut s, "select * from t a join t b on a.k = b.k")
            .await
            .code,
        "0A000"
    );
    assert_eq!(
        fails(&mut s, "create sequence q increment by 0").await.code,
        "42P16"
    );
    assert_eq!(
        fails(&mut s, "create sequence q minvalue 5 maxvalue 1")
            .await
            .code,
        "22023"
    );
    unchanged(&mut s).await;
}

#[tokio::test]
async fn replication_ddl_and_call_need_the_control_plane() {
    let mut s = setup().await;
    let e = fails(
        &mut s,
        "select 1;\nCREATE REPLICATION r ELEMENT e TABLE t MASTER a ON \"h1\" SUBSCRIBER b ON \"h2\"",
    )
    .await;
    assert_eq!(
        (e.code.as_str(), e.statement, e.line),
        ("0A000", 2, Some(2))
    );
    assert!(e.message.contains("replication DDL"), "{e}");
    assert!(e.message.contains("control plane"), "{e}");
    for sql in [
        "alter replication r drop element e",
        "DROP REPLICATION r",
        "call ttRepSubscriberWait(NULL, NULL, 'ds2', NULL, 5)",
    ] {
        let e = fails(&mut s, sql).await;
        assert_eq!(e.code, "0A000", "{sql}");
        assert!(e.message.contains("control plane"), "{sql}: {e}");
    }
}

#[tokio::test]
async fn statements_after_an_error_do_not_run() {
    let mut s = setup().await;
    let out = s
        .execute("insert into t values (2, 'b', 1, 1); insert into t values (1, 'x', 1, 1); insert into t values (3, 'c', 1, 1)")
        .await;
    assert_eq!(out.results.len(), 1);
    let e = out.error.expect("duplicate key");
    assert_eq!((e.code.as_str(), e.statement), ("23505", 2));
    assert_eq!(text(&mut s, "select k from t").await, vec!["1", "2"]);
}

#[tokio::test]
async fn results_past_the_limit_fail_the_statement_and_stop_the_script_there() {
    let mut s = setup().await;
    // Counted in rows: a script may return two in all.
    s.limit_results(hawser_sql::ResultLimit {
        max_bytes: 2,
        measure: std::sync::Arc::new(|r: &hawser_sql::StatementResult| r.rows.len()),
    });
    ok(&mut s, "insert into t values (2, 'two', 2, 2)").await;
    let e = fails(
        &mut s,
        "insert into t values (3, 'three', 3, 3);\nselect * from t;\ninsert into t values (4, 'four', 4, 4)",
    )
    .await;
    assert_eq!(e.code, "54000");
    assert_eq!((e.statement, e.line), (2, Some(2)));
    assert!(e.message.contains("more than 2 bytes"), "{e}");
    // What ran before it stands; what follows did not run.
    assert_eq!(text(&mut s, "select k from t where k > 2").await, vec!["3"]);
    // Each script starts its count again.
    assert_eq!(
        text(&mut s, "select k from t where k < 3").await,
        vec!["1", "2"]
    );
}

#[tokio::test]
async fn a_statement_past_its_timeout_fails_with_57014_and_is_undone() {
    let mut s = setup().await;
    ok(&mut s, "insert into t values (2, 'two', 2, 2)").await;
    // A timeout no statement can meet: the first row already finds it passed.
    s.set_statement_timeout(Some(std::time::Duration::from_nanos(1)));
    let e = fails(&mut s, "select * from t").await;
    assert_eq!(e.code, "57014");
    assert!(e.message.contains("statement timeout"), "{e}");
    let e = fails(&mut s, "update t set small = 9").await;
    assert_eq!(e.code, "57014");
    // Inside a transaction only the statement is undone; the transaction goes on.
    let e = fails(&mut s, "begin; insert into t values (3, 'c', 1, 1)").await;
    assert_eq!((e.code.as_str(), e.statement), ("57014", 2));
    s.set_statement_timeout(None);
    ok(&mut s, "insert into t values (4, 'd', 1, 1); commit").await;
    assert_eq!(
        text(&mut s, "select k, small from t").await,
        vec!["1|1", "2|2", "4|1"]
    );
    // Zero means no bound.
    s.set_statement_timeout(Some(std::time::Duration::ZERO));
    ok(&mut s, "select * from t").await;
}

#[tokio::test]
async fn a_read_only_session_reads_and_refuses_every_write_with_25006() {
    let mut s = setup().await;
    ok(&mut s, "create sequence sq").await;
    s.set_read_only(Some("client ann has role reader".into()));
    ok(
        &mut s,
        "select * from t; begin; select count(*) from t; commit; explain select * from t; \
         explain insert into t values (2, 'b', 1, 1); explain analyze select * from t",
    )
    .await;
    for (sql, what) in [
        ("insert into t values (2, 'b', 1, 1)", "cannot run INSERT"),
        ("update t set small = 2", "cannot run UPDATE"),
        ("delete from t", "cannot run DELETE"),
        (
            "create table u (k int primary key)",
            "cannot run CREATE TABLE",
        ),
        (
            "explain analyze delete from t",
            "cannot run EXPLAIN ANALYZE DELETE",
        ),
        ("select sq.nextval from t", "cannot advance sequence"),
        ("call ttRepSyncSet(0x01, 5, 1)", "cannot run CALL"),
        ("drop replication r", "cannot run replication DDL"),
    ] {
        let e = fails(&mut s, sql).await;
        assert_eq!(e.code, "25006", "{sql}: {e}");
        assert!(
            e.message.contains(what) && e.message.contains("role reader"),
            "{sql}: {e}"
        );
    }
    unchanged(&mut s).await;
    s.set_read_only(None);
    ok(&mut s, "insert into t values (2, 'b', 1, 1)").await;
}
