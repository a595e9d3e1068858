//! End-to-end: asynchronous row replication between real hawser processes. Three nodes
//! form a cluster; a TABLE element mastered by n1 is replicated to n2 and n3 (n1's
//! traffic compressed); inserts, updates and deletes on n1 reach both subscribers; n3 is
//! SIGKILLed, misses writes, restarts on its data and addresses and catches up with
//! nothing lost or doubled. Every wait is bounded and waits on a condition.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{ddl, http_get, start_member, stderr, voters, wait_for, Node};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

fn start(name: &str, dir: &Path, listen: &str, join: Option<&str>) -> Node {
    start_member(name, dir, listen, join, &[])
}

/// n1 (started with `n1_args`) bootstraps the cluster and n2 joins it; returns both
/// once each sees two voters.
fn two_voters(d: &Path, n1_args: &[&str]) -> (Node, Node) {
    let n1 = start_member("n1", d, "127.0.0.1:0", None, n1_args);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start("n2", d, "127.0.0.1:0", Some(&n1.grpc));
    for n in [&n1, &n2] {
        wait_for("two voters", WAIT, || (voters(n) == 2).then_some(()));
    }
    (n1, n2)
}

/// Runs SQL on `node` and fails the test if it fails.
fn sql(node: &Node, text: &str) {
    let out = node.cli(&["sql", "-e", text]);
    assert!(
        out.status.success(),
        "{} on {}: {}",
        text,
        node.name,
        stderr(&out)
    );
}

/// The rows of t on `node`, in key order; `None` if the node does not answer.
fn rows(node: &Node) -> Option<Value> {
    let out = node.cli(&[
        "sql",
        "--format",
        "json",
        "-e",
        "select k, v from t order by k",
    ]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).ok()?;
    Some(v["rows"].clone())
}

/// Waits until `node` has exactly `expected` in t.
fn converge(node: &Node, expected: &Value, what: &str) {
    let mut last = None;
    let done = common::poll_until(WAIT, || {
        last = rows(node);
        (last.as_ref() == Some(expected)).then_some(())
    });
    assert!(
        done.is_some(),
        "{what}: {} has {last:?}, the master {expected}; log:\n{}",
        node.name,
        node.log()
    );
}

#[test]
fn rows_written_on_the_master_reach_subscribers_and_a_killed_subscriber_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n1 = start("n1", d, "127.0.0.1:0", None);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start("n2", d, "127.0.0.1:0", Some(&n1.grpc));
    let mut n3 = start("n3", d, "127.0.0.1:0", Some(&n1.grpc));
    for n in [&n1, &n2, &n3] {
        wait_for("three voters", WAIT, || (voters(n) == 3).then_some(()));
    }
    for n in [&n1, &n2, &n3] {
        sql(n, "create table t (k int primary key, v varchar(40))");
    }
    // Rows written before the scheme exists are replicated too: the sender starts from
    // the beginning of the log.
    sql(
        &n1,
        "insert into t values (1, 'one'), (2, 'two'), (3, 'three')",
    );
    ddl(
        &n2,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2, n3 \
         STORE n1 COMPRESS TRAFFIC ON",
    );
    sql(&n1, "insert into t values (4, 'four'), (5, 'five')");
    sql(&n1, "update t set v = 'TWO' where k = 2");
    sql(&n1, "delete from t where k = 3");
    sql(
        &n1,
        "begin; insert into t values (6, 'six'); update t set v = 'SIX' where k = 6; commit",
    );
    let expected = rows(&n1).expect("n1 answers");
    assert_eq!(
        expected,
        serde_json::json!([[1, "one"], [2, "TWO"], [4, "four"], [5, "five"], [6, "SIX"]])
    );
    converge(&n2, &expected, "first writes");
    converge(&n3, &expected, "first writes");

    // n1's HTTP /replication shows both streams caught up, with bytes counted; n2's
    // shows the inbound stream from n1.
    let n1_id = n1.node_id.to_string();
    let outbound = wait_for("n1's streams acknowledged", WAIT, || {
        let (code, body) = http_get(&n1.http, "/replication");
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        let out = v["outbound"].as_array().cloned().unwrap_or_default();
        let caught_up = out.len() == 2
            && out.iter().all(|s| {
                s["state"] == "streaming"
                    && s["lag_records"] == 0
                    && s["acked_applied"][&n1_id].as_u64().unwrap_or(0) > 0
            });
        caught_up.then_some(out)
    });
    let receivers: Vec<&str> = outbound
        .iter()
        .filter_map(|s| s["receiver"].as_str())
        .collect();
    assert_eq!(receivers, ["n2", "n3"]);
    for s in &outbound {
        // Every n1 transaction: CREATE TABLE, then five writes.
        assert_eq!(s["acked_applied"][&n1_id], 6, "{s}");
        assert_eq!(s["acked_durable"][&n1_id], 6, "{s}");
        assert!(s["raw_bytes"].as_u64().unwrap_or(0) > 0, "{s}");
        assert!(s["wire_bytes"].as_u64().unwrap_or(0) > 0, "{s}");
        assert!(s["transactions"].as_u64().unwrap_or(0) >= 5, "{s}");
    }
    let (_, body) = http_get(&n2.http, "/replication");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["inbound"][0]["sender"], "n1", "{v}");
    assert_eq!(v["outbound"], serde_json::json!([]), "{v}");

    // n3 dies without a chance to flush; n1 keeps writing.
    let n3_grpc = n3.grpc.clone();
    n3.kill9();
    drop(n3);
    sql(&n1, "insert into t values (7, 'seven'), (8, 'eight')");
    sql(&n1, "update t set v = 'ONE' where k = 1");
    sql(&n1, "delete from t where k = 4");
    let expected = rows(&n1).expect("n1 answers");
    converge(&n2, &expected, "writes while n3 is down");

    // Restarted on the same data and address, n3 gets exactly what it missed.
    let n3 = start("n3", d, &n3_grpc, Some(&n1.grpc));
    converge(&n3, &expected, "n3 after its restart");
    sql(&n1, "insert into t values (9, 'nine')");
    let expected = rows(&n1).expect("n1 answers");
    converge(&n3, &expected, "writes after n3's restart");
    converge(&n2, &expected, "writes after n3's restart");

    // Nothing doubled: each subscriber's log holds its own CREATE TABLE and exactly one
    // record per n1 transaction (n1: CREATE TABLE and nine writes).
    for n in [&n1, &n2, &n3] {
        assert_eq!(n.status()["last_lsn"], 10, "{}", n.name);
    }
}

/// The outbound stream of `node` to `receiver` from its `/replication`, once it has
/// `txns` transactions acknowledged.
fn outbound_acked(node: &Node, receiver: &str, txns: u64) -> Value {
    let id = node.node_id.to_string();
    wait_for("the stream acknowledged", WAIT, || {
        let (code, body) = http_get(&node.http, "/replication");
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        v["outbound"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["receiver"] == receiver && s["acked_applied"][&id].as_u64() >= Some(txns))
            .cloned()
    })
}

#[test]
fn compressed_traffic_goes_out_in_the_codec_each_sender_is_set_to() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // n1 compresses with zstd at level 19, n2 with the default, lz4: each sender picks
    // the codec, and each batch names it for the receiver.
    let (n1, n2) = two_voters(d, &["--compress-codec", "zstd:19"]);
    for n in [&n1, &n2] {
        sql(n, "create table t (k int primary key, v varchar(400))");
        sql(n, "create table u (k int primary key, v varchar(400))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r \
         ELEMENT e1 TABLE t MASTER n1 SUBSCRIBER n2 \
         ELEMENT e2 TABLE u MASTER n2 SUBSCRIBER n1 \
         STORE n1 COMPRESS TRAFFIC ON STORE n2 COMPRESS TRAFFIC ON",
    );
    // Each master takes writes once the Raft leader has granted it a lease.
    common::wait_leased(&n1);
    common::wait_leased(&n2);
    // The same compressible rows on each side, in one transaction each.
    let values: Vec<String> = (0..200)
        .map(|k| {
            format!(
                "({k}, '{}')",
                format!("row {k:03} of many alike; ").repeat(12)
            )
        })
        .collect();
    sql(&n1, &format!("insert into t values {}", values.join(", ")));
    sql(&n2, &format!("insert into u values {}", values.join(", ")));

    let zstd = outbound_acked(&n1, "n2", 1);
    let lz4 = outbound_acked(&n2, "n1", 1);
    assert_eq!(zstd["compression"], "zstd:19", "{zstd}");
    assert_eq!(lz4["compression"], "lz4", "{lz4}");
    let bytes = |s: &Value, k: &str| s[k].as_u64().unwrap_or(0);
    for s in [&zstd, &lz4] {
        assert!(
            bytes(s, "wire_bytes") * 2 < bytes(s, "raw_bytes"),
            "compressible rows should at least halve on the wire: {s}"
        );
    }
    assert!(
        bytes(&zstd, "wire_bytes") < bytes(&lz4, "wire_bytes"),
        "zstd should send fewer bytes than lz4 for the same rows: {zstd} against {lz4}"
    );
    // Both receivers read what they got, and count the same bytes the senders did.
    for (node, table, other) in [(&n2, "t", &n1), (&n1, "u", &n2)] {
        let count = format!("select count(*) from {table}");
        let want = serde_json::json!([[200]]);
        let got = wait_for("the rows applied", WAIT, || {
            let out = node.cli(&["sql", "--format", "json", "-e", &count]);
            let v: Value = serde_json::from_slice(&out.stdout).ok()?;
            (v["rows"] == want).then_some(v)
        });
        assert_eq!(got["rows"], want);
        let (_, body) = http_get(&node.http, "/replication");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        let inbound = &v["inbound"][0];
        let sent = outbound_acked(other, &node.name, 1);
        assert_eq!(
            inbound["wire_bytes"], sent["wire_bytes"],
            "{inbound} / {sent}"
        );
    }
    // `hawser status` names the codec of each outbound stream.
    let out = n1.cli(&["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains(" n2 ") && l.contains("zstd:19")),
        "{text}"
    );
}

/// The first value of `select s.nextval` on `node`.
fn nextval(node: &Node) -> Option<i64> {
    let out = node.cli(&["sql", "--format", "json", "-e", "select s.nextval"]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).ok()?;
    v["rows"][0][0].as_i64()
}

#[test]
fn a_sequence_element_keeps_the_subscriber_ahead_and_cycle_sequences_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, n2) = two_voters(d, &[]);
    for n in [&n1, &n2] {
        sql(n, "create sequence s");
        sql(n, "create sequence c maxvalue 5 cycle");
    }
    // CYCLE sequences cannot be replicated (TimesTen refuses them too).
    let out = n1.cli(&[
        "sql",
        "-e",
        "CREATE REPLICATION rc ELEMENT q SEQUENCE c MASTER n1 SUBSCRIBER n2",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("CYCLE"), "{}", stderr(&out));

    ddl(
        &n1,
        "CREATE REPLICATION rs ELEMENT q SEQUENCE s MASTER n1 SUBSCRIBER n2",
    );
    // The master hands out values; its reserved block (20 at a time) reaches n2, whose
    // sequence is set ahead of every value the master could have handed out.
    let mut handed = 0;
    for _ in 0..3 {
        handed = nextval(&n1).expect("n1 answers");
    }
    assert_eq!(handed, 3);
    let v = wait_for(
        "n2's sequence set ahead of the master's block",
        WAIT,
        || nextval(&n2).filter(|v| *v > 20),
    );
    assert!(v > handed, "{v}");
}

/// The number of rows in t on `node` (`None` if it does not answer).
fn count(node: &Node) -> Option<u64> {
    let out = node.cli(&["sql", "--format", "json", "-e", "select count(*) from t"]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).ok()?;
    v["rows"][0][0].as_u64()
}

/// A master run with `--durable-commits false` may lose its last commits in a crash,
/// but never ones its subscriber holds: it would give their seqs to its next commits,
/// which the subscriber would skip as duplicates. SIGKILLed under load and restarted,
/// its subscriber is streamed to again (not refused as holding more than the master)
/// and ends equal to it.
#[test]
fn a_master_without_durable_commits_killed_under_load_loses_nothing_its_subscriber_holds() {
    use hawser_client::{Client, RowOp};
    use hawser_core::Value as V;

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let nondurable = ["--durable-commits", "false"];
    let (mut n1, n2) = two_voters(d, &nondurable);
    for n in [&n1, &n2] {
        sql(n, "create table t (k int primary key, v varchar(40))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2",
    );

    // Four writers insert keys of their own until n1 dies. Commits are not flushed,
    // so what reached n2 in the last moments is in n1's log only if its sender wrote
    // it there on the way out.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let writers: Vec<_> = (0..4i64)
        .map(|w| {
            let addr = n1.grpc.clone();
            rt.spawn(async move {
                let Ok(mut c) = Client::connect(&addr).await else {
                    return;
                };
                for i in 0.. {
                    let row = vec![V::Int(w * 1_000_000 + i), V::Text(format!("w{w} {i}"))];
                    let op = RowOp::Insert {
                        table: "t".into(),
                        row,
                    };
                    if c.write(vec![op]).await.is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    // Kill n1 while the load runs, once n2 has a good part of it.
    wait_for("n2 receiving the load", WAIT * 3, || {
        count(&n2).filter(|n| *n >= 2_000).map(|_| ())
    });
    let n1_grpc = n1.grpc.clone();
    n1.kill9();
    drop(n1);
    for w in writers {
        rt.block_on(w).unwrap();
    }

    let n1 = start_member("n1", d, &n1_grpc, None, &nondurable);
    // n1 takes writes again (once the cluster has a leader: it answers 57P03 until
    // then), and n2 gets them: it held nothing n1 lost.
    wait_for("n1 taking writes", WAIT, || {
        let out = n1.cli(&["sql", "-e", "insert into t values (-1, 'after')"]);
        out.status.success().then_some(())
    });
    sql(&n1, "insert into t values (-2, 'after'), (-3, 'after')");
    let expected = rows(&n1).expect("n1 answers");
    let (_, body) = http_get(&n1.http, "/replication");
    converge(&n2, &expected, &format!("after n1's restart ({body})"));
    let (_, body) = http_get(&n1.http, "/replication");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["outbound"][0]["state"], "streaming", "{v}");
}

/// A two-voter cluster keeps taking writes on the Raft leader's side while the other
/// voter is down: nobody can become leader without the leader's vote, so its master
/// lease stays safe without a quorum. The subscriber catches up when it is back.
#[test]
fn a_two_voter_master_keeps_writing_while_its_subscriber_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, mut n2) = two_voters(d, &[]);
    for n in [&n1, &n2] {
        sql(n, "create table t (k int primary key, v varchar(40))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2",
    );
    common::wait_leased(&n1);
    sql(&n1, "insert into t values (1, 'before')");
    let n2_grpc = n2.grpc.clone();
    assert!(n2.terminate().is_some_and(|s| s.success()));
    drop(n2);
    // Well past any lease granted while n2 was there: n1, the leader, has not heard
    // from n2 for four leases.
    wait_for("n2 silent for four leases", WAIT, || {
        let s = n1.try_status()?;
        let nodes = s["cluster"]["nodes"].as_array()?.clone();
        nodes
            .iter()
            .any(|n| n["store"] == "n2" && n["millis_since_report"].as_u64() >= Some(2_000))
            .then_some(())
    });
    sql(&n1, "insert into t values (2, 'while n2 is down')");
    let expected = rows(&n1).expect("n1 answers");
    let n2 = start("n2", d, &n2_grpc, None);
    converge(&n2, &expected, "after n2's restart");
}
