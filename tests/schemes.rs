//! End-to-end: the example replication schemes of the TimesTen documentation that move
//! data, on real hawser processes. Every node is named after the store the example uses
//! (`masterds`, `propds`, `westds`, ...), so the documentation's CREATE REPLICATION
//! statements run as written, `ON "host"` clauses included (hawser resolves stores by
//! name). Where the documentation has no example (INCLUDE / EXCLUDE, EXACT), the scheme
//! is written in the same grammar. For each shape the subscribers' tables must end equal
//! to the master's:
//!
//! * two subscribers with RETURN RECEIPT and FAILTHRESHOLD;
//! * a propagator forwarding a master's rows to two backups, origin kept;
//! * a subscriber fed by a master and by a propagator that does not see all of the
//!   master's transactions; two relays, each blind to the other's table, keeping a
//!   master's order and its transactions whole, one of them at the end of a chain; a master's own stream and a propagator's under a mixed load, with kills;
//!   a propagator that is down, whose relaying the master's stream takes over;
//! * a bidirectional split workload, each side refusing writes to the other's table;
//! * DATASTORE elements with EXCLUDE and INCLUDE, tables created after the scheme;
//! * TABLE DEFINITION CHECKING RELAXED (columns mapped by name) and EXACT (refused);
//! * a subscriber SIGKILLed under `hawser bench` load, catching up with nothing lost or
//!   doubled;
//! * COMPRESS TRAFFIC on one side of a bidirectional scheme, with TABLE elements and
//!   with the documentation's two DATASTORE elements.
//!
//! Every wait is bounded and waits on a condition.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{
    ddl, hawser_bin, http_get, poll_until, sql_json as sql, start_member, stderr, stdout, voters,
    wait_for, Node,
};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);

fn start(name: &str, dir: &Path, listen: &str, join: Option<&str>) -> Node {
    start_member(name, dir, listen, join, &[])
}

/// One node per store name: the first bootstraps the cluster, the others join through
/// it. Returns once every node sees all of them as voters.
fn cluster(dir: &Path, stores: &[&str]) -> Vec<Node> {
    cluster_with(dir, stores, &[])
}

/// [`cluster`] with `extra` arguments to every node's `hawser start`.
fn cluster_with(dir: &Path, stores: &[&str], extra: &[&str]) -> Vec<Node> {
    let first = start_member(stores[0], dir, "127.0.0.1:0", None, extra);
    let out = first.cli(&["init"]);
    assert!(out.status.success(), "init: {}", stderr(&out));
    let mut nodes = vec![first];
    for store in &stores[1..] {
        let node = start_member(store, dir, "127.0.0.1:0", Some(&nodes[0].grpc), extra);
        nodes.push(node);
    }
    for n in &nodes {
        wait_for("every node a voter", WAIT, || {
            (voters(n) == stores.len()).then_some(())
        });
    }
    nodes
}

/// Runs SQL on `node`, failing the test (with the node's log) if it fails; returns the
/// results. A script refused at its first statement for want of a master lease (57P03:
/// nothing of it ran — a loaded machine can keep a two-node cluster's leader from
/// hearing its quorum in time) runs again once the node holds one.
fn sql_ok(node: &Node, text: &str) -> Vec<Value> {
    let (ok, results, err) = match sql(node, text) {
        (false, _, err)
            if err.contains("error[57P03]")
                && (err.contains("(statement 1,") || err.contains("(statement 1)")) =>
        {
            common::wait_leased(node);
            sql(node, text)
        }
        done => done,
    };
    assert!(ok, "{text} on {}: {err}; log:\n{}", node.name, node.log());
    results
}

/// The rows a single query returns on `node`; `None` if it fails (the node does not
/// answer, or the table does not exist there).
fn rows(node: &Node, query: &str) -> Option<Value> {
    let (ok, results, _) = sql(node, query);
    if !ok {
        return None;
    }
    Some(results.first()?["rows"].clone())
}

/// Waits until `query` gives `expected` on `node`; the failure shows what it gave last
/// and the node's log.
fn converge(node: &Node, query: &str, expected: &Value, what: &str) {
    let mut last = None;
    let done = poll_until(WAIT, || {
        last = rows(node, query);
        (last.as_ref() == Some(expected)).then_some(())
    });
    assert!(
        done.is_some(),
        "{what}: `{query}` on {} gives {last:?}, the master {expected}; log:\n{}",
        node.name,
        node.log()
    );
}

/// Warnings of the last statement's result, as `code: message`.
fn warnings(results: &[Value]) -> Vec<String> {
    results
        .last()
        .and_then(|r| r["warnings"].as_array())
        .map(|w| {
            w.iter()
                .map(|w| format!("{}: {}", w["code"].as_str().unwrap_or(""), w["message"]))
                .collect()
        })
        .unwrap_or_default()
}

/// The node's data-plane streams (HTTP `/replication`).
fn replication(node: &Node) -> Value {
    let (code, body) = http_get(&node.http, "/replication");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("replication JSON")
}

fn outbound(node: &Node) -> Vec<Value> {
    replication(node)["outbound"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Receiver store names of `streams`, sorted.
fn receivers(streams: &[Value]) -> Vec<String> {
    let mut r: Vec<String> = streams
        .iter()
        .filter_map(|s| s["receiver"].as_str().map(String::from))
        .collect();
    r.sort();
    r
}

/// Waits until `node` sends exactly to `to` (store names, sorted), every stream
/// streaming.
fn streaming_to(node: &Node, to: &[&str]) -> Vec<Value> {
    let mut last = Vec::new();
    let done = poll_until(WAIT, || {
        last = outbound(node);
        (receivers(&last) == to && last.iter().all(|s| s["state"] == "streaming"))
            .then(|| last.clone())
    });
    done.unwrap_or_else(|| {
        panic!(
            "{} does not stream to {to:?}: {last:?}; log:\n{}",
            node.name,
            node.log()
        )
    })
}

/// Waits until every outbound stream of `node` has acknowledged its whole log.
fn all_acknowledged(node: &Node) -> Vec<Value> {
    let last_lsn = node.status()["last_lsn"].as_u64().expect("last_lsn");
    let mut last = Vec::new();
    let done = poll_until(WAIT, || {
        last = outbound(node);
        let caught_up = !last.is_empty()
            && last
                .iter()
                .all(|s| s["state"] == "streaming" && s["acked_lsn"].as_u64() == Some(last_lsn));
        caught_up.then(|| last.clone())
    });
    done.unwrap_or_else(|| panic!("{}'s subscribers lag: {last:?}", node.name))
}

/// The seed's "twosubscribers" with owner-qualified table, RETURN RECEIPT for both
/// subscribers and a FAILTHRESHOLD on the master.
const TWO_SUBSCRIBERS: &str = r#"CREATE REPLICATION twosubscribers
ELEMENT e TABLE rel.tab
  MASTER masterds ON "server1"
  SUBSCRIBER subscriber1ds ON "server2",
             subscriber2ds ON "server3"
  RETURN RECEIPT
STORE masterds FAILTHRESHOLD 10;"#;

#[test]
fn two_subscribers_with_return_receipt_have_each_commit_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path(), &["masterds", "subscriber1ds", "subscriber2ds"]);
    let [master, sub1, sub2] = &nodes[..] else {
        unreachable!()
    };
    for n in &nodes {
        sql_ok(
            n,
            "create table rel.tab (id int primary key, name varchar(40), amount dec(15,2))",
        );
    }
    ddl(master, TWO_SUBSCRIBERS);
    streaming_to(master, &["subscriber1ds", "subscriber2ds"]);

    // RETURN RECEIPT: when COMMIT returns without a warning, both subscribers have the
    // transaction (their receipt is the same write as their apply).
    let writes = [
        "insert into rel.tab values (1, 'alpha', 10.50), (2, 'beta', 20.25)",
        "insert into rel.tab values (3, 'gamma', 30)",
        "update rel.tab set amount = amount * 2 where id = 2",
        "delete from rel.tab where id = 1",
        "begin; insert into rel.tab values (4, 'delta', 4.04); \
         update rel.tab set name = 'GAMMA' where id = 3; commit",
    ];
    let query = "select id, name, amount from rel.tab order by id";
    for w in writes {
        let results = sql_ok(master, w);
        assert!(warnings(&results).is_empty(), "{w}: {results:?}");
        let expected = rows(master, query).expect("masterds answers");
        for sub in [sub1, sub2] {
            assert_eq!(
                rows(sub, query).as_ref(),
                Some(&expected),
                "{} differs from masterds after `{w}` returned",
                sub.name
            );
        }
    }
    assert_eq!(
        rows(master, query).unwrap(),
        json!([
            [2, "beta", "40.50"],
            [3, "GAMMA", "30"],
            [4, "delta", "4.04"]
        ])
    );

    // Every commit waited for both and none timed out.
    let r = replication(master)["returns"].clone();
    assert_eq!(r["timed_out"], 0, "{r}");
    assert!(
        r["acknowledged"].as_u64().unwrap_or(0) >= writes.len() as u64,
        "{r}"
    );
    for s in ["subscriber1ds", "subscriber2ds"] {
        let sub = r["subscribers"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["subscriber"] == s))
            .unwrap_or_else(|| panic!("no return service for {s}: {r}"));
        assert_eq!(sub["level"], "receipt", "{r}");
    }
}

/// The seed's "propagator": centralds feeds propds, which forwards to two backups.
const PROPAGATOR: &str = r#"CREATE REPLICATION propagator
ELEMENT a TABLE tab
  MASTER centralds ON "finance"
  SUBSCRIBER propds ON "nethandler"
ELEMENT b TABLE tab
  PROPAGATOR propds ON "nethandler"
  SUBSCRIBER backup1ds ON "backupsystem1",
             backup2ds ON "backupsystem2";"#;

#[test]
fn a_propagator_forwards_the_masters_rows_to_its_subscribers_with_the_origin_kept() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(
        dir.path(),
        &["centralds", "propds", "backup1ds", "backup2ds"],
    );
    let [central, prop, backup1, backup2] = &nodes[..] else {
        unreachable!()
    };
    for n in &nodes {
        sql_ok(n, "create table tab (k int primary key, v varchar(40))");
    }
    ddl(central, PROPAGATOR);
    sql_ok(central, "insert into tab values (1, 'one'), (2, 'two')");
    sql_ok(central, "update tab set v = 'TWO' where k = 2");
    sql_ok(central, "insert into tab values (3, 'three')");
    sql_ok(central, "delete from tab where k = 1");
    let query = "select k, v from tab order by k";
    let expected = rows(central, query).expect("centralds answers");
    assert_eq!(expected, json!([[2, "TWO"], [3, "three"]]));
    for n in [prop, backup1, backup2] {
        converge(n, query, &expected, "propagated writes");
    }

    // centralds sends to propds only; propds forwards to the backups and sends nothing
    // back to centralds.
    streaming_to(central, &["propds"]);
    streaming_to(prop, &["backup1ds", "backup2ds"]);
    // What propds forwards keeps centralds as its origin: the backups acknowledge
    // centralds's transactions through its sequence number 5 (its CREATE TABLE, which
    // no element carries, then its four writes), and propds forwards exactly those four.
    let central_id = central.node_id.to_string();
    for s in all_acknowledged(prop) {
        assert_eq!(s["acked_applied"][&central_id], 5, "{s}");
        assert_eq!(s["transactions"], 4, "{s}");
    }
    // Each backup's log: its own CREATE TABLE and the four forwarded writes, once.
    for n in [backup1, backup2] {
        assert_eq!(n.status()["last_lsn"], 5, "{}", n.name);
    }
    for (n, from) in [
        (prop, "centralds"),
        (backup1, "propds"),
        (backup2, "propds"),
    ] {
        let inbound = replication(n)["inbound"].clone();
        let senders: Vec<&str> = inbound
            .as_array()
            .map(|a| a.iter().filter_map(|s| s["sender"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(senders, [from], "{}: {inbound}", n.name);
    }
    // Only centralds may write tab.
    for n in [prop, backup1] {
        let (ok, _, err) = sql(n, "insert into tab values (9, 'nine')");
        assert!(
            !ok && err.contains("25006") && err.contains("centralds"),
            "{}: {err}",
            n.name
        );
    }
}

/// A cluster of `stores` with tables `accounts` and `events` on each, and `scheme`
/// created through the first.
fn two_tables(dir: &Path, stores: &[&str], scheme: &str) -> Vec<Node> {
    let nodes = cluster(dir, stores);
    for n in &nodes {
        sql_ok(
            n,
            "create table accounts (k int primary key, v int); \
             create table events (k int primary key, v varchar(40))",
        );
    }
    ddl(&nodes[0], scheme);
    nodes
}

/// Two paths from one master to one subscriber, one through a propagator that does not
/// see all of the master's transactions: ds3 gets `accounts` from ds1 directly and
/// `events` through ds2, which does not receive `accounts`.
const BLIND_PROPAGATOR: &str = "CREATE REPLICATION blind
ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds3
ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3;";

/// Commits on `ds1` alternating between `events` and `accounts` (20 rows each, every
/// third `accounts` row updated; with `both`, also a transaction updating both
/// tables), one commit each, then waits until `ds3`'s tables equal `ds1`'s.
fn interleave_and_converge(ds1: &Node, ds3: &Node, both: bool) {
    let mut writes = Vec::new();
    for k in 0..20 {
        writes.push(format!("insert into events values ({k}, 'event {k}')"));
        writes.push(format!("insert into accounts values ({k}, {k})"));
        if k % 3 == 0 {
            writes.push(format!("update accounts set v = v + 100 where k = {k}"));
            if both {
                writes.push(format!(
                    "begin; update events set v = 'both {k}' where k = {k}; \
                     update accounts set v = v + 1000 where k = {k}; commit"
                ));
            }
        }
    }
    sql_ok(ds1, &writes.join("; "));
    for (table, query) in [
        ("accounts", "select k, v from accounts order by k"),
        ("events", "select k, v from events order by k"),
    ] {
        let expected = rows(ds1, query).expect("ds1 answers");
        assert_eq!(expected.as_array().map(Vec::len), Some(20), "{table}");
        converge(ds3, query, &expected, table);
    }
}

#[test]
fn a_subscriber_fed_by_the_master_and_a_blind_propagator_gets_every_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = two_tables(dir.path(), &["ds1", "ds2", "ds3"], BLIND_PROPAGATOR);
    let [ds1, ds2, ds3] = &nodes[..] else {
        unreachable!()
    };
    streaming_to(ds1, &["ds2", "ds3"]);
    streaming_to(ds2, &["ds3"]);
    // The two tables' transactions interleaved, one commit each: ds3's one high-water
    // for ds1 must not pass an `accounts` commit before ds1's stream brought it.
    interleave_and_converge(ds1, ds3, false);
    converge(
        ds2,
        "select count(*) from events",
        &json!([[20]]),
        "ds2's events",
    );
    assert_eq!(
        rows(ds2, "select count(*) from accounts"),
        Some(json!([[0]]))
    );
}

/// The demo's routes: ds3 gets `accounts` from ds1 itself and `events` through ds2.
const MASTER_AND_PROPAGATOR: &str = "CREATE REPLICATION paths
ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds2, ds3
ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3;";

/// ds1's own stream to ds3 keeps ds1's order with ds2's relay: it waits before the
/// events ds2 relays until ds3 has them. With ds2 stopped as a receiver, ds2 gets none
/// of ds1's commits and relays none: ds1's stream must not wait for it.
#[test]
fn a_stopped_propagator_does_not_hold_the_masters_own_stream() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = two_tables(dir.path(), &["ds1", "ds2", "ds3"], MASTER_AND_PROPAGATOR);
    let [ds1, ds2, ds3] = &nodes[..] else {
        unreachable!()
    };
    streaming_to(ds1, &["ds2", "ds3"]);
    streaming_to(ds2, &["ds3"]);
    sql_ok(
        ds1,
        "insert into events values (1, 'one'); insert into accounts values (1, 1)",
    );
    converge(
        ds3,
        "select k from accounts",
        &json!([[1]]),
        "before the stop",
    );
    let out = ds1.cli(&[
        "receiver",
        "--scheme",
        "paths",
        "--subscriber",
        "ds2",
        "--state",
        "stop",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    streaming_to(ds1, &["ds3"]);
    sql_ok(
        ds1,
        "insert into events values (2, 'two'); insert into accounts values (2, 2)",
    );
    converge(
        ds3,
        "select k from accounts order by k",
        &json!([[1], [2]]),
        "ds1's own stream with ds2 stopped",
    );
    assert_eq!(
        rows(ds3, "select k from events order by k"),
        Some(json!([[1]]))
    );
}

/// ds1's own stream to ds3 waits for the events ds2 relays (one high-water per origin
/// at ds3). With ds2 down, it takes them over once ds2 has had no stream to ds3 for a
/// while: ds3 keeps getting both tables, and ds2, back, catches up itself.
#[test]
fn a_propagator_that_is_down_does_not_hold_the_masters_own_stream() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut nodes = two_tables(d, &["ds1", "ds2", "ds3"], MASTER_AND_PROPAGATOR);
    streaming_to(&nodes[0], &["ds2", "ds3"]);
    streaming_to(&nodes[1], &["ds3"]);
    let grpc = nodes[1].grpc.clone();
    nodes[1].kill9();
    sql_ok(
        &nodes[0],
        "insert into events values (1, 'one'); insert into accounts values (1, 1); \
         insert into events values (2, 'two'); insert into accounts values (2, 2)",
    );
    for query in [
        "select k, v from accounts order by k",
        "select k, v from events order by k",
    ] {
        let expected = rows(&nodes[0], query).expect("ds1 answers");
        converge(&nodes[2], query, &expected, "ds3 with ds2 down");
    }
    nodes[1] = start("ds2", d, &grpc, Some(&nodes[0].grpc));
    sql_ok(&nodes[0], "insert into events values (3, 'three')");
    for query in [
        "select k, v from accounts order by k",
        "select k, v from events order by k",
    ] {
        let expected = rows(&nodes[0], query).expect("ds1 answers");
        converge(&nodes[1], query, &expected, "ds2 back");
        converge(&nodes[2], query, &expected, "ds3 with ds2 back");
    }
}

/// ds1 sends `accounts` to ds3 itself and its sequence `s` through ds2. With ds2 down,
/// ds1's stream takes over the sequence's blocks as it does row changes: otherwise the
/// first block (every 20 NEXTVAL) would hold ds3's `accounts` until ds2 came back.
const SEQUENCE_THROUGH_A_PROPAGATOR: &str = "CREATE REPLICATION seqs
ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds2, ds3
ELEMENT q SEQUENCE s MASTER ds1 SUBSCRIBER ds2
ELEMENT q2 SEQUENCE s PROPAGATOR ds2 SUBSCRIBER ds3;";

#[test]
fn a_propagator_that_is_down_does_not_hold_the_masters_stream_at_a_sequence_block() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut nodes = cluster(d, &["ds1", "ds2", "ds3"]);
    for n in &nodes {
        sql_ok(
            n,
            "create table accounts (k int primary key, v int); create sequence s",
        );
    }
    ddl(&nodes[0], SEQUENCE_THROUGH_A_PROPAGATOR);
    streaming_to(&nodes[0], &["ds2", "ds3"]);
    streaming_to(&nodes[1], &["ds3"]);
    let grpc = nodes[1].grpc.clone();
    nodes[1].kill9();
    // 45 NEXTVALs: the master reserves three blocks of 20.
    let inserts: Vec<String> = (0..45)
        .map(|_| "insert into accounts values (s.nextval, 1)".to_string())
        .collect();
    sql_ok(&nodes[0], &inserts.join("; "));
    let query = "select count(*), max(k) from accounts";
    let expected = rows(&nodes[0], query).expect("ds1 answers");
    assert_eq!(expected, json!([[45, 45]]));
    converge(&nodes[2], query, &expected, "ds3 with ds2 down");
    // ds3's sequence was set ahead of every value ds1 handed out.
    let next = rows(&nodes[2], "select s.nextval from dual").expect("ds3 answers");
    assert!(next[0][0].as_i64().unwrap_or(0) > 45, "{next}");
    nodes[1] = start("ds2", d, &grpc, Some(&nodes[0].grpc));
    sql_ok(&nodes[0], "insert into accounts values (s.nextval, 2)");
    let expected = rows(&nodes[0], query).expect("ds1 answers");
    converge(&nodes[1], query, &expected, "ds2 back");
    converge(&nodes[2], query, &expected, "ds3 with ds2 back");
}

/// A `hawser sql -f FILE` run in the background, killed if the test ends while it runs.
struct SqlLoad {
    child: Child,
}

impl SqlLoad {
    fn start(host: &str, file: &Path) -> SqlLoad {
        let child = Command::new(hawser_bin())
            .args(["sql", "-f"])
            .arg(file)
            .env("HAWSER_HOST", host)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hawser sql");
        SqlLoad { child }
    }

    /// Whether the script has ended.
    fn ended(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// Waits (bounded) for the script to end, failing the test if it failed.
    fn finish(&mut self) {
        let status = wait_for("the SQL load to finish", Duration::from_secs(120), || {
            self.child.try_wait().ok().flatten()
        });
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut err).expect("read sql stderr");
        }
        assert!(status.success(), "hawser sql -f failed: {err}");
    }
}

impl Drop for SqlLoad {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The demo's routes under a load that alternates between them — transactions split
/// between ds1's own stream and ds2's relay, `accounts` alone, `events` alone — while
/// ds3 and then ds2 are SIGKILLed and started again: ds3 ends with exactly ds1's
/// tables.
#[test]
fn a_subscriber_fed_two_ways_matches_the_master_after_kills_under_a_mixed_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut nodes = two_tables(d, &["ds1", "ds2", "ds3"], MASTER_AND_PROPAGATOR);
    streaming_to(&nodes[0], &["ds2", "ds3"]);
    streaming_to(&nodes[1], &["ds3"]);
    let mut script = String::from("insert into accounts values ");
    script.push_str(
        &(0..50)
            .map(|k| format!("({k}, 0)"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    script.push_str(";\n");
    for i in 0..3000 {
        let k = i % 50;
        script.push_str(&match i % 4 {
            0 => format!(
                "begin; update accounts set v = v + 1 where k = {k}; \
                 insert into events values ({i}, 'split {i}'); commit;\n"
            ),
            1 => format!("update accounts set v = v + 10 where k = {k};\n"),
            2 => format!("insert into events values ({i}, 'event {i}');\n"),
            _ => format!(
                "begin; delete from events where k = {}; \
                 update accounts set v = v - 1 where k = {}; commit;\n",
                i - 3,
                (k + 7) % 50
            ),
        });
    }
    let file = d.join("load.sql");
    std::fs::write(&file, script).unwrap();
    let mut load = SqlLoad::start(&nodes[0].grpc, &file);

    for victim in [2, 1] {
        let before = rows(&nodes[victim], "select count(*) from events");
        wait_for("the victim to receive some of the load", WAIT, || {
            let now = rows(&nodes[victim], "select count(*) from events")?;
            (Some(&now) != before.as_ref()).then_some(())
        });
        let name = nodes[victim].name.clone();
        let grpc = nodes[victim].grpc.clone();
        eprintln!(
            "killing {name}; the load is {}",
            match load.child.try_wait() {
                Ok(None) => "running",
                _ => "over",
            }
        );
        nodes[victim].kill9();
        nodes[victim] = start(&name, d, &grpc, Some(&nodes[0].grpc));
    }
    load.finish();
    for query in [
        "select k, v from accounts order by k",
        "select k, v from events order by k",
    ] {
        let expected = rows(&nodes[0], query).expect("ds1 answers");
        converge(&nodes[2], query, &expected, "ds3 after the kills");
        converge(&nodes[1], query, &expected, "ds2 after the kills");
    }
    assert_eq!(
        rows(&nodes[0], "select count(*), sum(v) from accounts"),
        Some(json!([[50, 7500]]))
    );
}

/// Two relays of one master to one subscriber, each blind to the other's table, and no
/// stream of the master's own beside them: each relay waits, before each of ds1's
/// transactions, until the other has decided about the earlier ones, so ds3 gets every
/// one of them; a transaction writing both tables reaches ds3 in two parts, one by
/// each relay, and ds3 applies both. Nothing is left for the data plane to name as a
/// problem.
const TWO_BLIND_RELAYS: &str = "CREATE REPLICATION relays
ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds4
ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
ELEMENT a2 TABLE accounts PROPAGATOR ds4 SUBSCRIBER ds3
ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3;";

#[test]
fn a_subscriber_fed_by_two_blind_relays_gets_every_transaction_whole() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = two_tables(dir.path(), &["ds1", "ds2", "ds3", "ds4"], TWO_BLIND_RELAYS);
    let [ds1, ds2, ds3, ds4] = &nodes[..] else {
        unreachable!()
    };
    streaming_to(ds1, &["ds2", "ds4"]);
    streaming_to(ds2, &["ds3"]);
    streaming_to(ds4, &["ds3"]);
    // The two tables' transactions interleaved, one table each, and some writing both:
    // ds3's one high-water for ds1 must not pass a transaction one relay brings before
    // the other brought an earlier one, nor drop the second part of one in two.
    interleave_and_converge(ds1, ds3, true);
    for n in [ds1, ds2, ds3, ds4] {
        assert_eq!(replication(n)["problems"], json!([]), "{}", n.name);
    }
}

/// The two relays of the test above, one at the end of a propagator chain: ds1 →
/// ds5 → ds4 → ds3 for `accounts`, ds1 → ds2 → ds3 for `events`. ds4 knows how much
/// of ds1 it holds only from what ds5's stream decides (`LinkConfig::feeds_relay`,
/// `upstream`): without it, ds2 would hold the last of two `events` commits in a row
/// until ds1 next wrote `accounts`.
const RELAY_AT_A_CHAINS_END: &str = "CREATE REPLICATION chain
ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds5
ELEMENT a2 TABLE accounts PROPAGATOR ds5 SUBSCRIBER ds4
ELEMENT a3 TABLE accounts PROPAGATOR ds4 SUBSCRIBER ds3
ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3;";

#[test]
fn a_subscriber_fed_by_a_relay_at_the_end_of_a_chain_and_another_relay_gets_everything() {
    let dir = tempfile::tempdir().unwrap();
    let stores = ["ds1", "ds2", "ds3", "ds4", "ds5"];
    let nodes = two_tables(dir.path(), &stores, RELAY_AT_A_CHAINS_END);
    let [ds1, ds2, ds3, ds4, ds5] = &nodes[..] else {
        unreachable!()
    };
    streaming_to(ds1, &["ds2", "ds5"]);
    streaming_to(ds5, &["ds4"]);
    streaming_to(ds4, &["ds3"]);
    streaming_to(ds2, &["ds3"]);
    interleave_and_converge(ds1, ds3, true);
    // Two `events` commits last: the second waits for ds4 to say it holds nothing of
    // ds1's before it, which ds4 knows only from ds5.
    sql_ok(
        ds1,
        "insert into events values (100, 'last but one'); \
         insert into events values (101, 'last')",
    );
    let query = "select k, v from events order by k";
    let expected = rows(ds1, query).expect("ds1 answers");
    converge(ds3, query, &expected, "the last two events");
    for n in [ds1, ds2, ds3, ds4, ds5] {
        assert_eq!(replication(n)["problems"], json!([]), "{}", n.name);
    }
}

/// The seed's split workload: each side masters one table and subscribes to the other.
const SPLIT_WORKLOAD: &str = r#"CREATE REPLICATION r1
ELEMENT elem_waccounts TABLE waccounts
  MASTER westds ON "westcoast"
  SUBSCRIBER eastds ON "eastcoast" RETURN RECEIPT
ELEMENT elem_eaccounts TABLE eaccounts
  MASTER eastds ON "eastcoast"
  SUBSCRIBER westds ON "westcoast" RETURN RECEIPT;"#;

#[test]
fn a_bidirectional_split_workload_replicates_both_ways_and_refuses_the_other_sides_table() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path(), &["westds", "eastds"]);
    let [west, east] = &nodes[..] else {
        unreachable!()
    };
    for n in &nodes {
        sql_ok(
            n,
            "create table waccounts (custname varchar2(30) not null primary key, \
             curbalance dec(15,2)); \
             create table eaccounts (custname varchar2(30) not null primary key, \
             curbalance dec(15,2))",
        );
    }
    ddl(west, SPLIT_WORKLOAD);
    streaming_to(west, &["eastds"]);
    streaming_to(east, &["westds"]);

    for (side, table, names) in [
        (west, "waccounts", ["ada", "bob", "cyd"]),
        (east, "eaccounts", ["dee", "eve", "fay"]),
    ] {
        for (i, name) in names.iter().enumerate() {
            let results = sql_ok(
                side,
                &format!("insert into {table} values ('{name}', {}.25)", i * 100),
            );
            assert!(warnings(&results).is_empty(), "{results:?}");
        }
        let results = sql_ok(
            side,
            &format!(
                "update {table} set curbalance = curbalance + 1 where custname = '{}'",
                names[0]
            ),
        );
        assert!(warnings(&results).is_empty(), "{results:?}");
        sql_ok(
            side,
            &format!("delete from {table} where custname = '{}'", names[1]),
        );
    }
    for table in ["waccounts", "eaccounts"] {
        let query = format!("select custname, curbalance from {table} order by custname");
        let master = if table == "waccounts" { west } else { east };
        let expected = rows(master, &query).expect("the master answers");
        assert_eq!(expected.as_array().map(Vec::len), Some(2), "{expected}");
        for n in &nodes {
            converge(n, &query, &expected, table);
        }
    }

    // Each side refuses writes to the table the other masters, naming that master.
    for (n, table, master) in [(west, "eaccounts", "eastds"), (east, "waccounts", "westds")] {
        let (ok, _, err) = sql(n, &format!("insert into {table} values ('zed', 1)"));
        assert!(
            !ok && err.contains("25006") && err.contains(&format!("master {master}")),
            "{} writing {table}: {err}",
            n.name
        );
    }
}

/// DATASTORE elements in TimesTen's grammar: one replicates everything but t2, the
/// other only t1.
const DATASTORE_SCHEMES: &str = r#"CREATE REPLICATION allbutt2
ELEMENT ds_all DATASTORE
    MASTER masterds ON "server1"
    SUBSCRIBER subscriber1ds ON "server2"
    EXCLUDE TABLE t2;

CREATE REPLICATION onlyt1
ELEMENT ds_t1 DATASTORE
    MASTER masterds ON "server1"
    SUBSCRIBER subscriber2ds ON "server3"
    INCLUDE TABLE t1;
"#;

#[test]
fn datastore_elements_replicate_new_tables_and_honour_include_and_exclude() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The offline checker accepts both statements.
    let file = d.join("datastore.sql");
    std::fs::write(&file, DATASTORE_SCHEMES).unwrap();
    let out = Command::new(hawser_bin())
        .args(["scheme", "check"])
        .arg(&file)
        .output()
        .expect("run hawser scheme check");
    assert!(
        out.status.success(),
        "scheme check: {}{}",
        stdout(&out),
        stderr(&out)
    );

    let mut nodes = cluster(d, &["masterds", "subscriber1ds", "subscriber2ds"]);
    let [master, sub1, sub2] = &nodes[..] else {
        unreachable!()
    };
    // The tables INCLUDE / EXCLUDE name exist on the master only; the subscribers get
    // them (or not) from the stream.
    sql_ok(
        master,
        "create table t1 (k int primary key, v varchar(40)); \
         create table t2 (k int primary key, v varchar(40)); \
         insert into t1 values (1, 'before'); insert into t2 values (1, 'before')",
    );
    for statement in DATASTORE_SCHEMES.split_terminator(';') {
        if !statement.trim().is_empty() {
            ddl(master, statement);
        }
    }
    // A table created after the schemes exist, and more rows everywhere.
    sql_ok(
        master,
        "create table t3 (k int primary key, v varchar(40), n bigint); \
         insert into t3 values (1, 'after', 10), (2, 'after', 20); \
         insert into t1 values (2, 'after'); update t1 set v = 'BEFORE' where k = 1; \
         insert into t2 values (2, 'after')",
    );
    let t1 = "select k, v from t1 order by k";
    let t3 = "select k, v, n from t3 order by k";
    let expected_t1 = rows(master, t1).unwrap();
    let expected_t3 = rows(master, t3).unwrap();
    assert_eq!(expected_t1, json!([[1, "BEFORE"], [2, "after"]]));
    // Everything but t2: t1 and the new t3.
    converge(sub1, t1, &expected_t1, "t1 on subscriber1ds");
    converge(sub1, t3, &expected_t3, "t3 created after the scheme");
    // Only t1.
    converge(sub2, t1, &expected_t1, "t1 on subscriber2ds");
    all_acknowledged(master);

    // Once the master's whole log is acknowledged, what was left out is absent on the
    // subscribers: a table's CREATE TABLE goes only where its rows go.
    let absent = |n: &Node, table: &str| {
        let got = rows(n, &format!("select count(*) from {table}"));
        assert!(got.is_none(), "{} has {table}: {got:?}", n.name);
    };
    absent(sub1, "t2");
    absent(sub2, "t2");
    absent(sub2, "t3");

    // subscriber1ds is down while the master drops t3 and creates it again in another
    // layout: back on its data, it is streamed to (its t3 goes with the stream's DROP
    // TABLE before any row of the new one) and ends with the master's new t3.
    let sub1_grpc = nodes[1].grpc.clone();
    nodes[1].kill9();
    let master = &nodes[0];
    sql_ok(
        master,
        "insert into t3 values (3, 'old layout', 30); drop table t3; \
         create table t3 (k bigint primary key, n int, v varchar(40)); \
         insert into t3 values (1, 100, 'new layout'); insert into t1 values (3, 'later')",
    );
    let expected_t3 = rows(master, "select k, n, v from t3 order by k").unwrap();
    let expected_t1 = rows(master, t1).unwrap();
    nodes[1] = start("subscriber1ds", d, &sub1_grpc, Some(&nodes[0].grpc));
    let sub1 = &nodes[1];
    converge(sub1, t1, &expected_t1, "t1 after subscriber1ds's restart");
    converge(
        sub1,
        "select k, n, v from t3 order by k",
        &expected_t3,
        "t3 dropped and created again in another layout while subscriber1ds was down",
    );
    all_acknowledged(&nodes[0]);
}

/// The seed's rep1: t1's columns are in another order on the subscriber, whose STORE
/// clause relaxes the check.
const RELAXED: &str = "CREATE REPLICATION rep1
       ELEMENT e1 TABLE t1
       MASTER dsn1
       SUBSCRIBER dsn2
       STORE dsn2 TABLE DEFINITION CHECKING relaxed;";

/// The seed's reppart: t3 got its column b by ALTER TABLE on the subscriber.
const RELAXED_PARTITIONED: &str = "CREATE REPLICATION reppart
       ELEMENT e2 TABLE t3
       MASTER dsn1
       SUBSCRIBER dsn2
       STORE dsn2 TABLE DEFINITION CHECKING RELAXED;";

/// rep1 with the check left EXACT, over a table laid out like t1.
const EXACT: &str = "CREATE REPLICATION repexact
       ELEMENT e3 TABLE t2
       MASTER dsn1
       SUBSCRIBER dsn2
       STORE dsn2 TABLE DEFINITION CHECKING EXACT;";

/// A DATASTORE element under RELAXED checking replicates ALTER TABLE ... ADD COLUMN and
/// DROP / CREATE TABLE, and the rows after each land by name. (The subscriber made its
/// own t1 in another column order; the master's CREATE TABLE left its log before the
/// scheme existed, so the stream does not carry it.) Whether the map follows within one
/// session or a re-plan starts a new one depends on timing here; the stream test
/// `a_relaxed_column_map_follows_the_ddl_its_stream_carries` pins the former.
#[test]
fn relaxed_column_maps_follow_replicated_ddl() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster_with(dir.path(), &["dsn1", "dsn2"], &["--log-keep-bytes", "0"]);
    let [dsn1, dsn2] = &nodes[..] else {
        unreachable!()
    };
    sql_ok(
        dsn1,
        "CREATE TABLE t1 (c INT, a INT PRIMARY KEY, b INT); INSERT INTO t1 VALUES (1, 2, 3)",
    );
    sql_ok(dsn2, "CREATE TABLE t1 (a INT PRIMARY KEY, b INT, c INT)");
    wait_for("dsn1 to release its CREATE TABLE", WAIT, || {
        let (_, body) = http_get(&dsn1.http, "/replication");
        let start = serde_json::from_str::<Value>(&body).ok()?["log"]["start_lsn"].as_u64()?;
        (start >= 2).then_some(())
    });
    ddl(
        dsn1,
        "CREATE REPLICATION repds ELEMENT e DATASTORE MASTER dsn1 SUBSCRIBER dsn2 \
         STORE dsn2 TABLE DEFINITION CHECKING RELAXED",
    );
    sql_ok(dsn1, "INSERT INTO t1 VALUES (4, 5, 6)");
    let by_name = "SELECT a, b, c FROM t1 ORDER BY a";
    converge(
        dsn2,
        by_name,
        &json!([[2, 3, 1], [5, 6, 4]]),
        "t1 mapped by name",
    );

    // A column added on the master goes to the end on both sides.
    sql_ok(
        dsn1,
        "ALTER TABLE t1 ADD COLUMN d INT; INSERT INTO t1 VALUES (7, 8, 9, 10); \
         UPDATE t1 SET d = 60 WHERE a = 5",
    );
    let by_name = "SELECT a, b, c, d FROM t1 ORDER BY a";
    converge(
        dsn2,
        by_name,
        &json!([[2, 3, 1, null], [5, 6, 4, 60], [8, 9, 7, 10]]),
        "t1 after ADD COLUMN",
    );

    // Dropped and created again in the master's own layout: no map any more.
    sql_ok(
        dsn1,
        "DROP TABLE t1; CREATE TABLE t1 (x INT PRIMARY KEY, y VARCHAR(10)); \
         INSERT INTO t1 VALUES (1, 'one')",
    );
    converge(
        dsn2,
        "SELECT x, y FROM t1",
        &json!([[1, "one"]]),
        "t1 created again",
    );
    for s in all_acknowledged(dsn1) {
        assert_eq!(s["state"], "streaming", "{s}");
    }
}

/// A subscriber that is down while its DATASTORE master adds a column to a table comes
/// back, is accepted although the master's table has a column more than its own, and
/// catches up through the ADD COLUMN.
#[test]
fn a_subscriber_down_across_an_add_column_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path(), &["dsn1", "dsn2"]);
    let [dsn1, dsn2] = &nodes[..] else {
        unreachable!()
    };
    ddl(
        dsn1,
        "CREATE REPLICATION repds ELEMENT e DATASTORE MASTER dsn1 SUBSCRIBER dsn2",
    );
    sql_ok(dsn1, "CREATE TABLE t1 (k INT PRIMARY KEY, v VARCHAR(10))");
    sql_ok(dsn1, "INSERT INTO t1 VALUES (1, 'one')");
    let query = "SELECT * FROM t1 ORDER BY k";
    converge(dsn2, query, &json!([[1, "one"]]), "t1 before");
    all_acknowledged(dsn1);

    let mut nodes = nodes;
    let mut dsn2 = nodes.pop().unwrap();
    assert!(dsn2.terminate().is_some_and(|s| s.success()));
    let dsn2_grpc = dsn2.grpc.clone();
    drop(dsn2);
    let dsn1 = &nodes[0];
    sql_ok(dsn1, "ALTER TABLE t1 ADD COLUMN n BIGINT");
    sql_ok(dsn1, "INSERT INTO t1 VALUES (2, 'two', 20)");
    let dsn2 = start("dsn2", dir.path(), &dsn2_grpc, None);
    converge(
        &dsn2,
        query,
        &json!([[1, "one", null], [2, "two", 20]]),
        "t1 after the ADD COLUMN",
    );
    for s in all_acknowledged(dsn1) {
        assert_eq!(s["state"], "streaming", "{s}");
    }
}

#[test]
fn relaxed_table_definitions_map_columns_by_name_and_exact_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path(), &["dsn1", "dsn2"]);
    let [dsn1, dsn2] = &nodes[..] else {
        unreachable!()
    };
    sql_ok(
        dsn1,
        "CREATE TABLE t1 (c INT, a INT PRIMARY KEY, b INT); \
         CREATE TABLE t2 (c INT, a INT PRIMARY KEY, b INT); \
         CREATE TABLE t3 (a INT PRIMARY KEY, b INT)",
    );
    sql_ok(
        dsn2,
        "CREATE TABLE t1 (a INT PRIMARY KEY, b INT, c INT); \
         CREATE TABLE t2 (a INT PRIMARY KEY, b INT, c INT); \
         CREATE TABLE t3 (a INT PRIMARY KEY); \
         ALTER TABLE t3 ADD COLUMN b INT",
    );
    ddl(dsn1, RELAXED);
    ddl(dsn1, RELAXED_PARTITIONED);
    ddl(dsn1, EXACT);

    // The documentation's example: (4, 5, 6) into (c, a, b) reads < 5, 6, 4 > as (a, b, c).
    // rep1 (t1) and reppart (t3) are two streams dsn1 → dsn2 over one high-water per
    // origin: the t3 insert must not overtake the t1 update (docs/stream.md, "Several
    // schemes between the same two nodes").
    sql_ok(dsn1, "INSERT INTO t1 VALUES (4,5,6)");
    sql_ok(dsn1, "INSERT INTO t1 VALUES (7,8,9), (1,2,3)");
    sql_ok(dsn1, "UPDATE t1 SET c = 40 WHERE a = 5");
    sql_ok(dsn1, "INSERT INTO t3 VALUES (1,2)");
    sql_ok(dsn1, "INSERT INTO t2 VALUES (4,5,6)");
    converge(
        dsn2,
        "SELECT * FROM t1 ORDER BY a",
        &json!([[2, 3, 1], [5, 6, 40], [8, 9, 7]]),
        "t1 mapped by name",
    );
    let by_name = "SELECT a, b, c FROM t1 ORDER BY a";
    converge(dsn2, by_name, &rows(dsn1, by_name).unwrap(), "t1 by name");
    converge(
        dsn2,
        "SELECT * FROM t3",
        &json!([[1, 2]]),
        "t3 (partitioned)",
    );

    // EXACT: dsn2 refuses the stream that carries t2, and dsn1's status says why.
    let mut last = Vec::new();
    let refused = poll_until(WAIT, || {
        last = outbound(dsn1);
        last.iter()
            .find(|s| s["scheme"] == "repexact" && s["state"] == "refused")
            .cloned()
    })
    .unwrap_or_else(|| panic!("repexact's stream is not refused: {last:?}"));
    let reason = refused["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("t2") && reason.contains("EXACT"),
        "{refused}"
    );
    // The relaxed streams are not affected; t2 got nothing.
    for scheme in ["rep1", "reppart"] {
        let s = last.iter().find(|s| s["scheme"] == scheme);
        assert!(
            s.is_some_and(|s| s["state"] == "streaming"),
            "{scheme}: {last:?}"
        );
    }
    assert_eq!(rows(dsn2, "SELECT * FROM t2"), Some(json!([])));
}

/// A `hawser bench` run in the background, killed if the test ends while it runs.
struct Bench {
    child: Child,
    stderr: std::path::PathBuf,
}

impl Bench {
    /// Starts `hawser bench ARGS...` against `host`; its stderr goes to `stderr`.
    fn start(host: &str, args: &[&str], stderr: std::path::PathBuf) -> Bench {
        let child = Command::new(hawser_bin())
            .arg("bench")
            .args(args)
            .env("HAWSER_HOST", host)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("create bench stderr"))
            .spawn()
            .expect("spawn hawser bench");
        Bench { child, stderr }
    }

    /// Waits (bounded) for the run to end; returns its JSON report, failing the test if
    /// it failed.
    fn report(&mut self) -> Value {
        let status = wait_for("bench to finish", Duration::from_secs(60), || {
            self.child.try_wait().ok().flatten()
        });
        let mut out = String::new();
        if let Some(mut s) = self.child.stdout.take() {
            std::io::Read::read_to_string(&mut s, &mut out).expect("read bench stdout");
        }
        let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        assert!(status.success(), "bench failed: {out}{err}");
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("bench JSON {out:?}: {e}"))
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn count(node: &Node, table: &str) -> Option<i64> {
    rows(node, &format!("select count(*) from {table}"))?[0][0].as_i64()
}

#[test]
fn a_subscriber_killed_under_load_catches_up_with_nothing_lost_or_doubled() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut nodes = cluster(d, &["masterds", "subscriberds"]);
    let mut sub = nodes.pop().expect("subscriberds");
    let master = nodes.pop().expect("masterds");

    // Four clients upsert random keys of a large key space (nearly every commit a new
    // row) for four seconds; bench's scheme is a DATASTORE element that creates the
    // table on the subscriber.
    let mut bench = Bench::start(
        &master.grpc,
        &[
            "--mode",
            "async",
            "--subscriber",
            "subscriberds",
            "--clients",
            "4",
            "--duration",
            "4s",
            "--warmup",
            "0s",
            "--value-size",
            "40",
            "--format",
            "json",
        ],
        d.join("bench.stderr"),
    );

    // The subscriber is receiving the load when it dies.
    wait_for("subscriberds to receive bench rows", WAIT, || {
        (count(&sub, "bench").unwrap_or(0) >= 50).then_some(())
    });
    let at_kill = count(&master, "bench").expect("masterds answers");
    let sub_grpc = sub.grpc.clone();
    sub.kill9();
    drop(sub);
    wait_for(
        "masterds to commit more while subscriberds is down",
        WAIT,
        || (count(&master, "bench").unwrap_or(0) >= at_kill + 200).then_some(()),
    );

    // Back on its data and address, while the load goes on (or just after).
    let sub = start("subscriberds", d, &sub_grpc, Some(&master.grpc));
    let report = bench.report();
    assert!(report["commits"].as_u64().unwrap_or(0) > 200, "{report}");

    let query = "select k, v from bench order by k";
    let expected = rows(&master, query).expect("masterds answers");
    let total = expected.as_array().map(Vec::len).unwrap_or(0);
    assert!(total as i64 > at_kill + 200, "{total} rows");
    converge(&sub, query, &expected, "subscriberds after its restart");
    assert_eq!(count(&sub, "bench"), Some(total as i64));
    // Nothing doubled: the subscriber's log holds exactly one record per transaction
    // of the master (the bench table's CREATE TABLE came from the master too).
    all_acknowledged(&master);
    assert_eq!(
        sub.status()["last_lsn"],
        master.status()["last_lsn"],
        "subscriberds's log differs in length from masterds's"
    );
}

/// The seed's compressed bidirectional scheme (`repscheme`: only dsn1's STORE clause
/// says COMPRESS TRAFFIC ON) over a split workload of TABLE elements, so that each
/// direction carries its own rows.
const COMPRESSED_SPLIT: &str = "CREATE REPLICATION repscheme
ELEMENT e1 TABLE c1
    MASTER dsn1 ON machine1
    SUBSCRIBER dsn2 ON machine2
ELEMENT e2 TABLE c2
    MASTER dsn2 ON machine2
    SUBSCRIBER dsn1 ON machine1
STORE dsn1 ON machine1 COMPRESS TRAFFIC ON;";

/// Writes 100 rows of about 1 KB of repeated text into `table` on `node`.
fn write_compressible_rows(node: &Node, table: &str) {
    let text = "hawser replicates rows. ".repeat(40);
    for batch in 0..4 {
        let values: Vec<String> = (0..25)
            .map(|i| format!("({}, '{text}')", batch * 25 + i))
            .collect();
        sql_ok(
            node,
            &format!("insert into {table} values {}", values.join(", ")),
        );
    }
}

/// Checks that c1 and c2 are equal on both nodes, then that dsn1's stream to dsn2
/// went compressed and dsn2's to dsn1 did not.
fn check_compressed_one_way(dsn1: &Node, dsn2: &Node) {
    for (table, master) in [("c1", dsn1), ("c2", dsn2)] {
        let query = format!("select k, v from {table} order by k");
        let expected = rows(master, &query).unwrap();
        assert_eq!(expected.as_array().map(Vec::len), Some(100));
        for n in [dsn1, dsn2] {
            converge(n, &query, &expected, table);
        }
    }
    // 100 rows of about 1 KB each went each way. Counted where they arrived: the
    // receiver keeps its counters per sender across sessions, while a re-plan (a
    // DATASTORE table created by the other side's stream) starts a new sender with
    // fresh ones.
    let compressed = all_acknowledged(dsn1);
    assert_eq!(compressed.len(), 1, "{compressed:?}");
    let (raw, wire, seen) = received_bytes(dsn2, "dsn1");
    assert!(raw > 100_000, "{seen}");
    assert!(wire * 4 < raw, "dsn1 -> dsn2 not compressed: {seen}");
    let plain = all_acknowledged(dsn2);
    assert_eq!(plain.len(), 1, "{plain:?}");
    let (raw, wire, seen) = received_bytes(dsn1, "dsn2");
    assert!(raw > 100_000, "{seen}");
    assert_eq!(wire, raw, "dsn2 -> dsn1 is not to be compressed: {seen}");
}

/// Raw and wire bytes `receiver` got from `sender`, and its inbound status for them.
fn received_bytes(receiver: &Node, sender: &str) -> (u64, u64, Value) {
    let inbound = replication(receiver)["inbound"].clone();
    let seen = inbound
        .as_array()
        .and_then(|a| a.iter().find(|s| s["sender"] == sender).cloned())
        .unwrap_or_else(|| {
            panic!(
                "{} has no inbound stream from {sender}: {inbound}",
                receiver.name
            )
        });
    let n = |k: &str| seen[k].as_u64().unwrap_or(0);
    (n("raw_bytes"), n("wire_bytes"), seen)
}

#[test]
fn compress_traffic_shrinks_wire_bytes_of_compressible_rows_on_the_compressed_side_only() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path(), &["dsn1", "dsn2"]);
    let [dsn1, dsn2] = &nodes[..] else {
        unreachable!()
    };
    for n in &nodes {
        sql_ok(
            n,
            "create table c1 (k int primary key, v varchar(1000)); \
             create table c2 (k int primary key, v varchar(1000))",
        );
    }
    ddl(dsn1, COMPRESSED_SPLIT);
    write_compressible_rows(dsn1, "c1");
    write_compressible_rows(dsn2, "c2");
    check_compressed_one_way(dsn1, dsn2);
}

/// The seed's `repscheme` as written: two DATASTORE elements, one per direction, and
/// only dsn1's traffic compressed.
const BIDIRECTIONAL_DATASTORE: &str = "CREATE REPLICATION repscheme
ELEMENT d1 DATASTORE
    MASTER dsn1 ON machine1
    SUBSCRIBER dsn2 ON machine2
ELEMENT d2 DATASTORE
    MASTER dsn2 ON machine2
    SUBSCRIBER dsn1 ON machine1
STORE dsn1 ON machine1 COMPRESS TRAFFIC ON;";

#[test]
fn a_bidirectional_datastore_scheme_replicates_each_sides_tables_to_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path(), &["dsn1", "dsn2"]);
    let [dsn1, dsn2] = &nodes[..] else {
        unreachable!()
    };
    // Each side creates its own table; the DATASTORE elements carry it to the other.
    sql_ok(dsn1, "create table c1 (k int primary key, v varchar(1000))");
    sql_ok(dsn2, "create table c2 (k int primary key, v varchar(1000))");
    ddl(dsn1, BIDIRECTIONAL_DATASTORE);
    write_compressible_rows(dsn1, "c1");
    write_compressible_rows(dsn2, "c2");
    check_compressed_one_way(dsn1, dsn2);
}

/// `hawser duplicate`: a subscriber whose master released log it still needed (its
/// receiver was stopped) is refused with `log_released`; the duplicate copies the
/// master's table while a load keeps changing it, sets the receiver back to START, and
/// the stream resumes from the copy's point — the subscriber ends equal to the master
/// and keeps receiving.
#[test]
fn a_subscriber_past_the_released_log_is_rebuilt_by_a_duplicate_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let nodes = cluster_with(d, &["ds1", "ds2"], &["--log-keep-bytes", "0"]);
    let (ds1, ds2) = (&nodes[0], &nodes[1]);
    for n in [ds1, ds2] {
        sql_ok(
            n,
            "create table t (k int primary key, v int, s varchar(40))",
        );
    }
    ddl(
        ds1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER ds1 SUBSCRIBER ds2;",
    );
    streaming_to(ds1, &["ds2"]);
    let values = |from: i64, to: i64| {
        (from..to)
            .map(|k| format!("({k}, {k}, 'row {k}')"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    sql_ok(ds1, &format!("insert into t values {}", values(0, 100)));
    let query = "select k, v, s from t order by k";
    converge(
        ds2,
        query,
        &rows(ds1, query).unwrap(),
        "ds2 before the stop",
    );
    // A stopped receiver holds no log: what ds1 commits meanwhile is released.
    let receiver = |state: &str| {
        let out = ds1.cli(&[
            "receiver",
            "--scheme",
            "r",
            "--subscriber",
            "ds2",
            "--state",
            state,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    receiver("stop");
    wait_for("ds1 to stop sending", WAIT, || {
        outbound(ds1).is_empty().then_some(())
    });
    for chunk in 1..5 {
        sql_ok(
            ds1,
            &format!(
                "insert into t values {}",
                values(chunk * 500, chunk * 500 + 500)
            ),
        );
    }
    sql_ok(
        ds1,
        "update t set v = v + 1 where k < 50; delete from t where k >= 90 and k < 100",
    );
    let last = ds1.status()["last_lsn"].as_u64().unwrap();
    wait_for("ds1 to release the log", WAIT, || {
        (replication(ds1)["log"]["start_lsn"].as_u64() == Some(last)).then_some(())
    });
    receiver("start");
    wait_for("the sender to say ds2 needs a duplicate", WAIT, || {
        outbound(ds1)
            .into_iter()
            .find(|o| o["state"] == "log_released")
    });
    // And its metrics, for the alert HawserSubscriberNeedsRebuild.
    wait_for("hawser_stream_needs_rebuild 1 for ds2", WAIT, || {
        let (_, metrics) = http_get(&ds1.http, "/metrics");
        metrics
            .lines()
            .any(|l| {
                l.starts_with("hawser_stream_needs_rebuild{")
                    && l.contains("receiver=\"ds2\"")
                    && l.ends_with(" 1")
            })
            .then_some(())
    });
    // Not while the receiver is started: a stream could apply during the copy.
    let out = ds2.cli(&["duplicate"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("set it to stop first"),
        "{}",
        stderr(&out)
    );
    receiver("stop");

    let mut script = String::new();
    for i in 0..1500 {
        let k = (i * 7) % 2500;
        script.push_str(&match i % 3 {
            0 => format!("update t set v = v + 1, s = 'load {i}' where k = {k};\n"),
            1 => format!("insert into t values ({}, {i}, 'new {i}');\n", 10_000 + i),
            _ => format!("delete from t where k = {};\n", 10_000 + i - 1),
        });
    }
    let file = d.join("load.sql");
    std::fs::write(&file, script).unwrap();
    // Started: ds1's commit count moved (the table's row count only moves between an
    // insert and the delete after it), or the load already ended (its finish says how).
    let commits = |n: &Node| n.status()["commits"].as_u64().unwrap_or(0);
    let before = commits(ds1);
    let mut load = SqlLoad::start(&ds1.grpc, &file);
    wait_for("the load to start", WAIT, || {
        (commits(ds1) > before || load.ended()).then_some(())
    });
    let out = ds2.cli(&["duplicate", "--keep-replaced", "--format", "json"]);
    assert!(
        out.status.success(),
        "duplicate: {}\n{}",
        stderr(&out),
        ds2.log()
    );
    let text = stdout(&out);
    let done: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(done["done"], true, "{text}");
    assert_eq!(done["from"], "ds1", "{text}");
    assert_eq!(done["tables"], json!(["t"]), "{text}");
    let copied = done["rows"].as_u64().unwrap();
    assert!(copied >= 2000, "{text}");
    // ds2 held keys 0-99 as they were before the stop: ds1 deleted 90-99 since (and
    // the load deletes only keys ds2 never had); 50-89 are as ds1 has them unless the
    // load changed them.
    assert_eq!(done["rows_deleted"], 10, "{text}");
    let unchanged = done["rows_unchanged"].as_u64().unwrap();
    assert!(unchanged > 0 && unchanged <= 40, "{text}");
    // --keep-replaced: every one of ds2's 100 rows the copy did not find as it was
    // is kept in hawser_lost first, under origin 0 and the first rebuild's number.
    assert_eq!(done["rows_kept"].as_u64(), Some(100 - unchanged), "{text}");
    assert_eq!(done["rebuild"], 1, "{text}");
    let kept = sql_ok(
        ds2,
        "select count(*) from hawser_lost where origin = 0 and seq = 1",
    );
    assert_eq!(kept[0]["rows"], json!([[100 - unchanged]]));
    assert_eq!(
        done["rows_written"].as_u64().unwrap() + unchanged,
        copied,
        "{text}"
    );
    load.finish();
    streaming_to(ds1, &["ds2"]);
    let expected = rows(ds1, query).unwrap();
    converge(ds2, query, &expected, "ds2 after the duplicate");
    sql_ok(ds1, "insert into t values (99999, 1, 'after')");
    let expected = rows(ds1, query).unwrap();
    converge(ds2, query, &expected, "ds2 streaming after the duplicate");
}

/// A subscriber added to a scheme after its master wrote a table's history, without the
/// table: its stream is refused until a duplicate creates the table as the master has
/// it and copies the rows; then it streams.
/// TimesTen's way to add a subscriber to a DATASTORE scheme — create it from the
/// master with a duplicate — on a store that has none of the master's tables or
/// sequences and whose master's log no longer matters: the master names what the
/// element covers (its own catalog; EXCLUDE honoured), the store creates it as the
/// master has it, and the stream goes on from the copy, sequence blocks included.
#[test]
fn a_new_datastore_subscriber_is_seeded_by_a_duplicate_with_the_masters_tables_and_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut nodes = cluster(d, &["ds1", "ds2", "ds3"]);
    // ds3 is down while the master's tables, sequence and the scheme come about: it
    // misses all of it.
    let grpc = nodes[2].grpc.clone();
    nodes[2].kill9();
    sql_ok(
        &nodes[0],
        "create table t (k int primary key, v varchar(20) not null); \
         create table u (k int primary key); create table x (k int primary key); \
         create sequence s; \
         insert into t values (1, 'one'), (2, 'two'); insert into u values (7); \
         insert into x values (9)",
    );
    for _ in 0..25 {
        sql_ok(&nodes[0], "select s.nextval");
    }
    ddl(
        &nodes[0],
        "CREATE REPLICATION r ELEMENT e DATASTORE MASTER ds1 SUBSCRIBER ds2, ds3 \
         EXCLUDE TABLE x;",
    );
    let out = nodes[0].cli(&["receiver", "--subscriber", "ds3", "--state", "stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    nodes[2] = start("ds3", d, &grpc, Some(&nodes[0].grpc));
    let (ds1, ds3) = (&nodes[0], &nodes[2]);

    let out = ds3.cli(&["duplicate", "--format", "json"]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), ds3.log());
    let last: Value = stdout(&out)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("a JSON progress line");
    assert_eq!(last["done"], true, "{last}");
    assert_eq!(last["tables"], json!(["t", "u"]), "{last}");
    assert_eq!(last["tables_created"], 2, "{last}");
    assert_eq!(last["sequences"], json!(["s"]), "{last}");
    assert_eq!(last["sequences_created"], 1, "{last}");
    assert_eq!(last["rows_written"], 3, "{last}");
    assert!(rows(ds3, "select k from x").is_none(), "x is excluded");
    // The sequence is past every value the master handed out.
    let next = rows(ds3, "select s.nextval").expect("ds3 has s")[0][0]
        .as_i64()
        .unwrap();
    assert!(next > 25, "ds3's s hands out {next}");

    // The stream goes on from the copy, sequence blocks of the master included.
    sql_ok(
        ds1,
        "insert into t values (3, 'three'); delete from u where k = 7",
    );
    for _ in 0..25 {
        sql_ok(ds1, "select s.nextval");
    }
    sql_ok(ds1, "insert into t values (4, 'four')");
    for query in [
        "select k, v from t order by k",
        "select k from u order by k",
    ] {
        let expected = rows(ds1, query).expect("ds1 answers");
        converge(ds3, query, &expected, "ds3 seeded by a duplicate");
    }
    streaming_to(ds1, &["ds2", "ds3"]);

    // ds3 plans ds1's element from the catalog ds1 reported to the cluster, x included
    // (which ds3 lacks): it refuses client writes to the tables it receives, naming ds1,
    // and has no problem planning. (Planned from ds3's own catalog, the EXCLUDE of a
    // table it lacks did not plan, nothing was refused and the write went in.)
    let refused = wait_for("ds3 to refuse client writes to t", WAIT, || {
        let (ok, _, err) = sql(ds3, "insert into t values (100, 'here')");
        (!ok).then_some(err)
    });
    assert!(
        refused.contains("25006") && refused.contains("ds1"),
        "{refused}"
    );
    assert_eq!(replication(ds3)["problems"], json!([]));

    // A table ds1 creates now reaches the cluster's record of ds1's catalog, which every
    // node shows (a local CREATE TABLE moves no Raft state by itself).
    sql_ok(ds1, "create table w (k int primary key)");
    wait_for("ds3 to show ds1's reported catalog with w", WAIT, || {
        let status = ds3.status();
        let nodes = status["cluster"]["nodes"].as_array()?.clone();
        let ds1_node = nodes.iter().find(|n| n["store"] == "ds1")?;
        let tables = ds1_node["catalog"]["tables"].as_array()?;
        tables.contains(&json!("w")).then_some(())
    });
}

/// A duplicate of one scheme into a store that also receives in another: allowed when
/// the other brings none of its origins or tables — that scheme's stream goes on during
/// the copy and only the copied scheme's origin's marks move — and refused, naming what
/// is shared, when it does.
#[test]
fn a_duplicate_of_one_scheme_leaves_another_scheme_into_the_same_store_streaming() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path(), &["ds1", "ds2", "ds3"]);
    let (ds1, ds2, ds3) = (&nodes[0], &nodes[1], &nodes[2]);
    sql_ok(ds1, "create table t (k int primary key, v int)");
    sql_ok(ds2, "create table u (k int primary key, v int)");
    sql_ok(ds3, "create table t (k int primary key, v int)");
    sql_ok(ds3, "create table u (k int primary key, v int)");
    ddl(
        ds1,
        "CREATE REPLICATION a ELEMENT e TABLE t MASTER ds1 SUBSCRIBER ds3;",
    );
    ddl(
        ds1,
        "CREATE REPLICATION b ELEMENT f TABLE u MASTER ds2 SUBSCRIBER ds3;",
    );
    streaming_to(ds1, &["ds3"]);
    streaming_to(ds2, &["ds3"]);
    let insert = |n: &Node, table: &str, from: i64, to: i64| {
        let values: Vec<String> = (from..to).map(|k| format!("({k}, {k})")).collect();
        sql_ok(
            n,
            &format!("insert into {table} values {}", values.join(", ")),
        );
    };
    insert(ds1, "t", 0, 50);
    insert(ds2, "u", 0, 50);
    let t = "select k, v from t order by k";
    let u = "select k, v from u order by k";
    converge(ds3, t, &rows(ds1, t).unwrap(), "t before the stop");
    converge(ds3, u, &rows(ds2, u).unwrap(), "u before the stop");

    // ds3's receiver in scheme a, stopped through ds1.
    let stop_a = || {
        let out = ds1.cli(&[
            "receiver",
            "--scheme",
            "a",
            "--subscriber",
            "ds3",
            "--state",
            "stop",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    stop_a();
    wait_for("ds1 to stop sending", WAIT, || {
        outbound(ds1).is_empty().then_some(())
    });
    insert(ds1, "t", 50, 120);
    sql_ok(ds1, "update t set v = v + 1000 where k < 10");
    insert(ds2, "u", 50, 80);
    // Scheme b streams on while a's receiver is stopped.
    converge(ds3, u, &rows(ds2, u).unwrap(), "u while a is stopped");

    // Two schemes into ds3: the duplicate needs to be told which.
    let out = ds3.cli(&["duplicate"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--scheme"), "{}", stderr(&out));
    let out = ds3.cli(&["duplicate", "--scheme", "a", "--format", "json"]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), ds3.log());
    let text = stdout(&out);
    let done: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(done["done"], true, "{text}");
    assert_eq!(done["from"], "ds1", "{text}");
    assert_eq!(done["tables"], json!(["t"]), "{text}");
    // Only ds1's mark is set from the copy; ds2's stays ds3's own.
    let marks = done["marks"].as_object().expect("marks");
    assert_eq!(marks.keys().collect::<Vec<_>>(), ["ds1"], "{text}");
    converge(ds3, t, &rows(ds1, t).unwrap(), "t after the duplicate");
    streaming_to(ds1, &["ds3"]);
    insert(ds1, "t", 200, 210);
    insert(ds2, "u", 200, 210);
    converge(
        ds3,
        t,
        &rows(ds1, t).unwrap(),
        "t streaming after the duplicate",
    );
    converge(
        ds3,
        u,
        &rows(ds2, u).unwrap(),
        "u streaming after the duplicate",
    );

    // A third scheme bringing ds3 more of ds1's transactions shares ds1's mark with a:
    // refused.
    sql_ok(ds1, "create table w (k int primary key)");
    sql_ok(ds3, "create table w (k int primary key)");
    ddl(
        ds1,
        "CREATE REPLICATION c ELEMENT g TABLE w MASTER ds1 SUBSCRIBER ds3;",
    );
    stop_a();
    let out = ds3.cli(&["duplicate", "--scheme", "a"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("scheme c") && err.contains("ds1's transactions"),
        "{err}"
    );
}

#[test]
fn a_new_subscriber_without_the_table_is_seeded_by_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path(), &["ds1", "ds2"]);
    let (ds1, ds2) = (&nodes[0], &nodes[1]);
    sql_ok(
        ds1,
        "create table t (k int primary key, v varchar(20) not null)",
    );
    sql_ok(
        ds1,
        "insert into t values (1, 'one'), (2, 'two'), (3, 'three')",
    );
    ddl(
        ds1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER ds1 SUBSCRIBER ds2;",
    );
    let out = ds1.cli(&["receiver", "--subscriber", "ds2", "--state", "stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ds2.cli(&["duplicate"]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), ds2.log());
    let text = stdout(&out);
    assert!(text.contains("created 1 table as ds1 has them"), "{text}");
    assert!(text.contains("3 written"), "{text}");
    sql_ok(ds1, "insert into t values (4, 'four')");
    let query = "select k, v from t order by k";
    converge(
        ds2,
        query,
        &rows(ds1, query).unwrap(),
        "ds2 seeded by a duplicate",
    );
    streaming_to(ds1, &["ds2"]);
}
