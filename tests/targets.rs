//! End-to-end: DB2 target tables on a subscriber (`AS target [INTO table]`). n1 masters
//! four tables of one shape; n2 subscribes to each as another target type, into tables
//! it creates itself. One history (inserts, an update, a key change, a delete, a
//! re-insert) reaches each target as the DB2 seed defines it; n2 is SIGKILLed, misses
//! more changes and catches up with nothing doubled; a target table that exists with
//! the wrong shape is refused, naming what differs. BASE and CHANGE AGGREGATE targets
//! hold the aggregates of the source's rows and of each transaction's changes, through
//! a restart of the subscriber too.

mod common;

use std::time::Duration;

use common::{
    ddl, query_rows as rows, sql_ok as sql, start_member, stderr, stdout, voters, wait_for, Node,
};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

/// Waits until `query` on `node` returns `expected`.
fn converge(node: &Node, query: &str, expected: &Value) {
    let mut last = None;
    let done = common::poll_until(WAIT, || {
        last = rows(node, query);
        (last.as_ref() == Some(expected)).then_some(())
    });
    assert!(
        done.is_some(),
        "{query}: {} has {last:?}, expected {expected}; log:\n{}",
        node.name,
        node.log()
    );
}

/// n1, initialised, and n2 joined to it: two voters.
fn pair(d: &std::path::Path) -> (Node, Node) {
    let n1 = start_member("n1", d, "127.0.0.1:0", None, &[]);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start_member("n2", d, "127.0.0.1:0", Some(&n1.grpc), &[]);
    for n in [&n1, &n2] {
        wait_for("two voters", WAIT, || (voters(n) == 2).then_some(()));
    }
    (n1, n2)
}

/// `tables` on `node`, each `(id INTEGER PRIMARY KEY, owner VARCHAR(20), bal BIGINT NOT
/// NULL)`.
fn create_accounts(node: &Node, tables: &[&str]) {
    for t in tables {
        sql(
            node,
            &format!(
                "create table {t} (id integer primary key, owner varchar(20), bal bigint not null)"
            ),
        );
    }
}

const TABLES: [&str; 4] = ["acct_u", "acct_p", "acct_c", "acct_h"];

#[test]
fn each_target_type_holds_what_the_db2_seed_says_and_a_resend_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, mut n2) = pair(d);
    create_accounts(&n1, &TABLES);
    ddl(
        &n1,
        "CREATE REPLICATION r \
           ELEMENT eu TABLE acct_u MASTER n1 SUBSCRIBER n2 AS USER COPY INTO acct_copy \
           ELEMENT ep TABLE acct_p MASTER n1 SUBSCRIBER n2 AS POINT IN TIME \
           ELEMENT ec TABLE acct_c MASTER n1 SUBSCRIBER n2 AS CCD CONDENSED INTO acct_ccd \
           ELEMENT eh TABLE acct_h MASTER n1 SUBSCRIBER n2 AS CCD NONCONDENSED INTO acct_hist",
    );
    common::wait_leased(&n1);
    for t in TABLES {
        sql(
            &n1,
            &format!("insert into {t} values (1, 'ann', 100), (2, 'bob', 50)"),
        );
        sql(&n1, &format!("update {t} set bal = 70 where id = 1"));
        sql(&n1, &format!("update {t} set id = 3 where id = 2"));
        sql(&n1, &format!("delete from {t} where id = 1"));
        sql(&n1, &format!("insert into {t} values (1, 'cy', 5)"));
    }

    // USER COPY into another table: the source rows, there.
    let current = json!([[1, "cy", 5], [3, "bob", 50]]);
    converge(
        &n2,
        "select id, owner, bal from acct_copy order by id",
        &current,
    );
    // POINT IN TIME: the source rows, each with the source commit time.
    converge(
        &n2,
        "select id, owner, bal, ibmsnap_logmarker is not null from acct_p order by id",
        &json!([[1, "cy", 5, true], [3, "bob", 50, true]]),
    );
    // CCD CONDENSED: each key's latest change; key 2 moved away, kept as a D row.
    converge(
        &n2,
        "select id, ibmsnap_operation, owner, bal from acct_ccd order by id",
        &json!([[1, "I", "cy", 5], [2, "D", "bob", 50], [3, "U", "bob", 50]]),
    );
    // CCD NONCONDENSED: every change, in commit order.
    let history = json!([
        ["I", 1, "ann", 100],
        ["I", 2, "bob", 50],
        ["U", 1, "ann", 70],
        ["U", 3, "bob", 50],
        ["D", 1, "ann", 70],
        ["I", 1, "cy", 5]
    ]);
    let hist_query = "select ibmsnap_operation, id, owner, bal from acct_hist \
                      order by ibmsnap_commitseq, ibmsnap_intentseq";
    converge(&n2, hist_query, &history);
    // `hawser status` lists each target with its type and rows.
    let out = n2.cli(&["status", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let targets = &st["replication"]["inbound"][0]["targets"];
    let mut listed: Vec<(String, String, u64)> = targets
        .as_array()
        .unwrap_or_else(|| panic!("no targets in {st:#}"))
        .iter()
        .map(|t| {
            (
                t["into"].as_str().unwrap().to_string(),
                t["kind"].as_str().unwrap().to_string(),
                t["rows"].as_u64().unwrap(),
            )
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            ("acct_ccd".to_string(), "CCD CONDENSED".to_string(), 3),
            ("acct_copy".to_string(), "USER COPY".to_string(), 2),
            ("acct_hist".to_string(), "CCD NONCONDENSED".to_string(), 6),
            ("acct_p".to_string(), "POINT IN TIME".to_string(), 2),
        ]
    );
    let out = n2.cli(&["status"]);
    assert!(
        stdout(&out).contains("TARGET TABLE") && stdout(&out).contains("CCD NONCONDENSED"),
        "{}",
        stdout(&out)
    );
    // The subscriber's target tables are the master's copies: not written locally.
    let out = n2.cli(&["sql", "-e", "insert into acct_copy values (9, 'z', 9)"]);
    assert!(
        !out.status.success(),
        "a local write to a target table was taken"
    );

    // n2 dies, misses two changes, and comes back: they arrive once, and what it had
    // is not doubled.
    n2.kill9();
    sql(&n1, "update acct_h set bal = 6 where id = 1");
    sql(&n1, "delete from acct_h where id = 3");
    n2 = start_member("n2", d, &n2.grpc.clone(), Some(&n1.grpc), &[]);
    let mut longer = history.as_array().unwrap().clone();
    longer.push(json!(["U", 1, "cy", 6]));
    longer.push(json!(["D", 3, "bob", 50]));
    converge(&n2, hist_query, &Value::Array(longer));
    converge(
        &n2,
        "select id, owner, bal from acct_copy order by id",
        &current,
    );

    // A target table that exists with another shape: the stream is refused, saying
    // what differs, and nothing is written into it.
    sql(
        &n1,
        "create table bad (id integer primary key, v varchar(5))",
    );
    sql(
        &n2,
        "create table bad_ccd (id integer primary key, v varchar(5))",
    );
    ddl(
        &n1,
        "CREATE REPLICATION r2 ELEMENT eb TABLE bad MASTER n1 SUBSCRIBER n2 AS CCD INTO bad_ccd",
    );
    sql(&n1, "insert into bad values (1, 'x')");
    wait_for("the refusal shown on the master", WAIT, || {
        let st = n1.try_status()?.to_string();
        st.contains("bad_ccd exists with another shape")
            .then_some(())
    });
    let st = n1.status().to_string();
    assert!(
        st.contains(
            "column 1 is id INTEGER NOT NULL but must be ibmsnap_intentseq BINARY(10) NOT NULL"
        ),
        "{st}"
    );
    assert_eq!(rows(&n2, "select id from bad_ccd"), Some(json!([])));
}

#[test]
fn aggregate_targets_hold_the_groups_of_the_rows_and_of_each_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, mut n2) = pair(d);
    // A TABLE element's subscriber has the table: the BASE AGGREGATE's copy is it.
    for (node, t) in [(&n1, "acct_b"), (&n2, "acct_b"), (&n1, "acct_g")] {
        sql(
            node,
            &format!(
                "create table {t} (id integer primary key, owner varchar(20) not null, \
                 bal bigint not null)"
            ),
        );
    }
    ddl(
        &n1,
        "CREATE REPLICATION r \
           ELEMENT eb TABLE acct_b MASTER n1 SUBSCRIBER n2 \
             AS BASE AGGREGATE (COUNT(*) AS n, SUM(bal) AS total) GROUP BY owner INTO acct_sum \
           ELEMENT eg TABLE acct_g MASTER n1 SUBSCRIBER n2 \
             AS CHANGE AGGREGATE (COUNT(*) AS n, SUM(bal) AS total) GROUP BY owner INTO acct_chg",
    );
    common::wait_leased(&n1);
    for t in ["acct_b", "acct_g"] {
        sql(
            &n1,
            &format!("insert into {t} values (1, 'ann', 100), (2, 'bob', 50)"),
        );
        sql(&n1, &format!("update {t} set bal = 70 where id = 1"));
        sql(&n1, &format!("update {t} set id = 3 where id = 2"));
        sql(&n1, &format!("delete from {t} where id = 1"));
        sql(&n1, &format!("insert into {t} values (1, 'cy', 5)"));
    }
    let sums = "select owner, n, total, ibmsnap_llogmarker <= ibmsnap_hlogmarker \
                from acct_sum order by owner";
    converge(
        &n2,
        sums,
        &json!([["bob", 1, 50, true], ["cy", 1, 5, true]]),
    );
    let changes = "select owner, n, total from acct_chg order by ibmsnap_commitseq, owner";
    let per_txn = json!([
        ["ann", 1, 100],
        ["bob", 1, 50],
        ["ann", 1, 70],
        ["bob", 1, 50],
        ["ann", 1, 70],
        ["cy", 1, 5]
    ]);
    converge(&n2, changes, &per_txn);
    let out = n2.cli(&["status"]);
    assert!(
        stdout(&out).contains("BASE AGGREGATE") && stdout(&out).contains("CHANGE AGGREGATE"),
        "{}",
        stdout(&out)
    );
    // Neither the aggregate nor the copy it is computed from takes local writes.
    for write in [
        "insert into acct_sum values (current_timestamp, current_timestamp, 'z', 1, 1)",
        "insert into acct_b values (9, 'z', 9)",
    ] {
        let out = n2.cli(&["sql", "-e", write]);
        assert!(!out.status.success(), "{write}: taken on the subscriber");
    }

    // n2 dies and misses a transaction of three changes; back, the aggregates take it
    // once.
    n2.kill9();
    for t in ["acct_b", "acct_g"] {
        sql(
            &n1,
            &format!(
                "begin; insert into {t} values (4, 'cy', 10); update {t} set bal = 1 \
                 where id = 1; delete from {t} where id = 3; commit"
            ),
        );
    }
    n2 = start_member("n2", d, &n2.grpc.clone(), Some(&n1.grpc), &[]);
    converge(&n2, sums, &json!([["cy", 2, 11, true]]));
    let mut longer = per_txn.as_array().unwrap().clone();
    longer.push(json!(["bob", 1, 50]));
    longer.push(json!(["cy", 2, 11]));
    converge(&n2, changes, &Value::Array(longer));
}

/// The stream from `from` to `to` as `from`'s status shows it.
fn outbound_state(from: &Node, to: &str) -> Option<String> {
    let st = from.try_status()?;
    st["replication"]["outbound"]
        .as_array()?
        .iter()
        .find(|o| o["receiver"] == to)
        .map(|o| o["state"].as_str().unwrap_or("").to_string())
}

#[test]
fn a_duplicate_starts_each_target_as_its_type_says() {
    let dir = tempfile::tempdir().unwrap();
    let (n1, n2) = pair(dir.path());
    create_accounts(&n1, &["acct_c", "acct_n", "acct_p"]);
    ddl(
        &n1,
        "CREATE REPLICATION r \
           ELEMENT ec TABLE acct_c MASTER n1 SUBSCRIBER n2 AS CCD NONCONDENSED COMPLETE INTO hist_c \
           ELEMENT en TABLE acct_n MASTER n1 SUBSCRIBER n2 AS CCD NONCONDENSED NONCOMPLETE INTO hist_n \
           ELEMENT ep TABLE acct_p MASTER n1 SUBSCRIBER n2 AS POINT IN TIME",
    );
    common::wait_leased(&n1);
    // n2 gets nothing by its stream: its rows come from the duplicate.
    let out = n1.cli(&[
        "receiver",
        "--scheme",
        "r",
        "--subscriber",
        "n2",
        "--state",
        "stop",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A stopped receiver is sent nothing: the stream is gone.
    wait_for("the stream to n2 stopped", WAIT, || {
        n1.try_status()?;
        outbound_state(&n1, "n2").is_none().then_some(())
    });
    for t in ["acct_c", "acct_n", "acct_p"] {
        sql(
            &n1,
            &format!("insert into {t} values (1, 'ann', 100), (2, 'bob', 50), (3, 'cy', 5)"),
        );
    }
    let out = n2.cli(&["duplicate", "--scheme", "r", "--format", "json"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    // After the copy, one more change reaches n2 by its stream.
    for t in ["acct_c", "acct_n", "acct_p"] {
        sql(&n1, &format!("update {t} set bal = 7 where id = 2"));
    }
    // CCD COMPLETE: the copied rows as inserts at the copy point, then the change.
    let history = "select ibmsnap_operation, id, owner, bal from {t} \
                   order by ibmsnap_commitseq, ibmsnap_intentseq";
    converge(
        &n2,
        &history.replace("{t}", "hist_c"),
        &json!([
            ["I", 1, "ann", 100],
            ["I", 2, "bob", 50],
            ["I", 3, "cy", 5],
            ["U", 2, "bob", 7]
        ]),
    );
    // NONCOMPLETE: only the change.
    converge(
        &n2,
        &history.replace("{t}", "hist_n"),
        &json!([["U", 2, "bob", 7]]),
    );
    // POINT IN TIME: the rows, stamped (the copy's time, then the change's).
    converge(
        &n2,
        "select id, bal, ibmsnap_logmarker is not null from acct_p order by id",
        &json!([[1, 100, true], [2, 7, true], [3, 5, true]]),
    );
    // No plain copy of a CCD's source was made on n2.
    for t in ["acct_c", "acct_n"] {
        let out = n2.cli(&["sql", "-e", &format!("select count(*) from {t}")]);
        assert!(!out.status.success(), "{t} exists on n2");
    }
}
