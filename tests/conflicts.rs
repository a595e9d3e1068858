//! End-to-end: row-timestamp conflict checking on the TimesTen seed's Example 10-31, a
//! bidirectional scheme on `accounts` with `CHECK CONFLICTS BY ROW TIMESTAMP COLUMN
//! tstamp UPDATE BY SYSTEM ON EXCEPTION ROLLBACK WORK`, as written. Both stores update
//! the same row while their streams are paused; once resumed, the later update wins on
//! both, the earlier one is a conflict recorded in `hawser_conflicts` where it was
//! rejected, and the two copies are equal.

mod common;

use std::time::Duration;

use common::{
    ddl, query_rows as rows, sql_ok as sql, start_member, stderr, voters, wait_for, wait_leased,
    Node,
};
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

/// Waits until neither of `nodes` streams to the other: each node applies the pause
/// from Raft in its own time, and until then its sender may still ship.
fn paused(nodes: [&Node; 2]) {
    for n in nodes {
        wait_for("the sender to see the pause", WAIT, || {
            let st = n.try_status()?;
            let streaming = st["replication"]["outbound"]
                .as_array()?
                .iter()
                .any(|o| o["state"] == "streaming");
            (!streaming).then_some(())
        });
    }
}

const ACCOUNTS: &str = "select custname, curbalance, tstamp from accounts order by custname";

/// westds and eastds, each with `accounts`, under `scheme`; both hold master leases.
fn pair(d: &std::path::Path, scheme: &str) -> (Node, Node) {
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
    ddl(&west, scheme);
    wait_leased(&west);
    wait_leased(&east);
    (west, east)
}

/// Both update ann while neither hears the other, eastds last; then both hear.
fn conflicting_updates(west: &Node, east: &Node) -> Value {
    receivers(west, "pause");
    paused([west, east]);
    sql(
        west,
        "update accounts set curbalance = 1 where custname = 'ann'",
    );
    let west_stamp = rows(west, ACCOUNTS).unwrap()[0][2].clone();
    wait_for("a later stamp on eastds", WAIT, || {
        sql(
            east,
            "update accounts set curbalance = 2 where custname = 'ann'",
        );
        let r = rows(east, ACCOUNTS)?;
        (r[0][2].as_str()? > west_stamp.as_str()?).then_some(())
    });
    receivers(west, "start");
    west_stamp
}

#[test]
fn the_later_of_two_conflicting_updates_wins_on_both_and_the_earlier_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (west, east) = pair(dir.path(), EXAMPLE_10_31);

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
    let west_stamp = conflicting_updates(&west, &east);

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

/// NO ACTION with a report file in XML under the store's data directory: a conflict is
/// in the file too, and a second one in the same second is not reported once the
/// store's SUSPEND AT 1 is passed (it is still in hawser_conflicts).
#[test]
fn a_report_file_gets_each_conflict_until_reporting_is_suspended() {
    let dir = tempfile::tempdir().unwrap();
    let scheme = "CREATE REPLICATION r1 \
        ELEMENT e1 TABLE accounts CHECK CONFLICTS BY ROW TIMESTAMP COLUMN tstamp \
          ON EXCEPTION NO ACTION REPORT TO 'conflicts.xml' FORMAT XML \
          MASTER westds SUBSCRIBER eastds \
        ELEMENT e2 TABLE accounts CHECK CONFLICTS BY ROW TIMESTAMP COLUMN tstamp \
          ON EXCEPTION NO ACTION REPORT TO 'conflicts.xml' FORMAT XML \
          MASTER eastds SUBSCRIBER westds \
        STORE eastds CONFLICT REPORTING SUSPEND AT 1 CONFLICT REPORTING RESUME AT 1";
    let (west, east) = pair(dir.path(), scheme);
    sql(
        &west,
        "insert into accounts values ('ann', 'west st', 100, null), ('bob', 'x', 5, null)",
    );
    wait_for("both rows on eastds", WAIT, || {
        (rows(&east, ACCOUNTS)?.as_array()?.len() == 2).then_some(())
    });
    // Two conflicts in one transaction from westds: both rejected on eastds.
    receivers(&west, "pause");
    paused([&west, &east]);
    sql(&west, "update accounts set curbalance = 1");
    let west_rows = rows(&west, ACCOUNTS).unwrap();
    wait_for("later stamps on eastds", WAIT, || {
        sql(&east, "update accounts set curbalance = 2");
        let r = rows(&east, ACCOUNTS)?;
        (r[0][2].as_str()? > west_rows[0][2].as_str()?
            && r[1][2].as_str()? > west_rows[1][2].as_str()?)
        .then_some(())
    });
    receivers(&west, "start");
    wait_for("two conflicts kept on eastds", WAIT, || {
        (rows(&east, "select count(*) from hawser_conflicts")? == json!([[2]])).then_some(())
    });
    let file = dir.path().join("eastds").join("conflicts.xml");
    let report = wait_for("the report file", WAIT, || {
        std::fs::read_to_string(&file)
            .ok()
            .filter(|s| !s.is_empty())
    });
    assert_eq!(
        report.lines().count(),
        1,
        "the second was suspended: {report}"
    );
    assert!(
        report.starts_with("<conflict ")
            && report.contains("table=\"accounts\"")
            && report.contains("action=\"skip\""),
        "{report}"
    );
    wait_for("the suspension logged", WAIT, || {
        east.log().contains("TT17051").then_some(())
    });
    assert_eq!(rows(&west, ACCOUNTS), rows(&east, ACCOUNTS));
}
