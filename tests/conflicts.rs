//! End-to-end: row-timestamp conflict checking on the TimesTen seed's Example 10-31, a
//! bidirectional scheme on `accounts` with `CHECK CONFLICTS BY ROW TIMESTAMP COLUMN
//! tstamp UPDATE BY SYSTEM ON EXCEPTION ROLLBACK WORK`, as written. Both stores update
//! the same row while their streams are paused; once resumed, the later update wins on
//! both, the earlier one is a conflict recorded in `hawser_conflicts` where it was
//! rejected, and the two copies are equal.

mod common;

use std::time::Duration;

use common::{ddl, sql_json, start_member, stderr, voters, wait_for, wait_leased, Node};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

const EXAMPLE_10_31: &str = "CREATE REPLICATION r1
ELEMENT elem_accounts_1 TABLE accounts
  CHECK CONFLICTS BY ROW TIMESTAMP
    COLUMN tstamp
    UPDATE BY SYSTEM
    ON EXCEPTION ROLLBACK WORK
  MASTER westds ON \"westcoast\"
  SUBSCRIBER eastds ON \"eastcoast\"
ELEMENT elem_accounts_2 TABLE accounts
  CHECK CONFLICTS BY ROW TIMESTAMP
    COLUMN tstamp
    UPDATE BY SYSTEM
    ON EXCEPTION ROLLBACK WORK
  MASTER eastds ON \"eastcoast\"
  SUBSCRIBER westds ON \"westcoast\"";

fn sql(node: &Node, text: &str) {
    let out = node.cli(&["sql", "-e", text]);
    assert!(
        out.status.success(),
        "{text} on {}: {}",
        node.name,
        stderr(&out)
    );
}

fn rows(node: &Node, query: &str) -> Option<Value> {
    let (ok, results, _) = sql_json(node, query);
    ok.then(|| results.last().map(|r| r["rows"].clone()))
        .flatten()
}

fn receivers(node: &Node, state: &str) {
    for store in ["westds", "eastds"] {
        let out = node.cli(&[
            "receiver",
            "--scheme",
            "r1",
            "--subscriber",
            store,
            "--state",
            state,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

const ACCOUNTS: &str = "select custname, curbalance, tstamp from accounts order by custname";

#[test]
fn the_later_of_two_conflicting_updates_wins_on_both_and_the_earlier_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let west = start_member("westds", d, "127.0.0.1:0", None, &[]);
    let out = west.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let east = start_member("eastds", d, "127.0.0.1:0", Some(&west.grpc), &[]);
    for n in [&west, &east] {
        wait_for("two voters", WAIT, || (voters(n) == 2).then_some(()));
        sql(
            n,
            "CREATE TABLE accounts (custname VARCHAR2(30) NOT NULL, address VARCHAR2(80), \
             curbalance DEC(15,2), tstamp BINARY(8), PRIMARY KEY (custname))",
        );
    }
    ddl(&west, EXAMPLE_10_31);
    wait_leased(&west);
    wait_leased(&east);

    // UPDATE BY SYSTEM: the store stamps the row; the copy carries the same stamp.
    sql(
        &west,
        "insert into accounts values ('ann', 'west st', 100, null)",
    );
    let first = wait_for("ann on eastds", WAIT, || {
        let r = rows(&east, ACCOUNTS)?;
        (r.as_array()?.len() == 1).then_some(r)
    });
    assert!(!first[0][2].is_null(), "not stamped: {first}");
    assert_eq!(rows(&west, ACCOUNTS), Some(first.clone()));

    // Both update ann while neither hears the other; eastds writes last.
    receivers(&west, "pause");
    sql(
        &west,
        "update accounts set curbalance = 1 where custname = 'ann'",
    );
    let west_stamp = rows(&west, ACCOUNTS).unwrap()[0][2].clone();
    wait_for("a later stamp on eastds", WAIT, || {
        sql(
            &east,
            "update accounts set curbalance = 2 where custname = 'ann'",
        );
        let r = rows(&east, ACCOUNTS)?;
        (r[0][2].as_str()? > west_stamp.as_str()?).then_some(())
    });
    receivers(&west, "start");

    // eastds's update is later: applied on westds; westds's is rejected on eastds.
    let mut last = None;
    let expected = common::poll_until(WAIT, || {
        let (w, e) = (rows(&west, ACCOUNTS)?, rows(&east, ACCOUNTS)?);
        last = Some((w.clone(), e.clone()));
        (w == e && w[0][1] == json!("2")).then_some(w)
    })
    .unwrap_or_else(|| {
        panic!(
            "copies differ: west, east = {last:?}\nwest log:\n{}\neast log:\n{}",
            west.log(),
            east.log()
        )
    });
    assert_ne!(expected[0][2], west_stamp);
    let kept = wait_for("the conflict recorded on eastds", WAIT, || {
        let r = rows(
            &east,
            "select table_name, op, row_key, action from hawser_conflicts",
        )?;
        (r.as_array()?.len() == 1).then_some(r)
    });
    assert_eq!(
        kept,
        json!([["accounts", "update", "'ann'", "transaction rejected"]])
    );
    assert_eq!(
        rows(&west, "select count(*) from hawser_conflicts"),
        Some(json!([[0]]))
    );
    let metrics = common::http_get(&east.http, "/metrics").1;
    assert!(
        metrics.contains(
            "hawser_conflicts_total{table=\"accounts\",action=\"transaction rejected\"} 1"
        ),
        "{metrics}"
    );
}
