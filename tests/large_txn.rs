//! End-to-end: a subscriber behind on large transactions catches up (issue #50, item 4).
//!
//! Two real nodes, `t` mastered by n1 and subscribed by n2. n1's stream to n2 is paused
//! (`hawser receiver --state pause`: the master holds the log and sends nothing); n1
//! commits three transactions of about 4 MB and one of about 18 MB — past the 16 MiB
//! gRPC message limit of a node, so it can only travel in chunks — of rows of 40,000
//! characters (`hawser sql -f`, each a BEGIN … COMMIT block). The stream is started
//! again: n2 must end with n1's rows, the stream streaming with no error and without
//! reconnecting (before, a batch past the limit broke the stream at every attempt and
//! nothing was ever applied).
//!
//! And a TWOSAFE subscriber that restarts is streamed to again within a few hundred
//! milliseconds of its start however long it was down (issue #50, item 6: the sender's
//! wait between attempts doubled to 5 s, and a subscriber restarted in 0.05 s got its
//! first ack 3.3 s later).
//!
//! Every wait is bounded and waits on a condition; the nodes are killed when the test
//! ends, pass or fail.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{ddl, http_get, start_member, stderr, stdout, voters, wait_for, Node};
use serde_json::Value;

/// Generous: a debug build applies 30 MB of rows on a busy 2-core machine.
const WAIT: Duration = Duration::from_secs(120);

/// The row: one value of 40,000 characters.
const ROW_CHARS: usize = 40_000;

/// Rows per transaction: three of about 4 MB, then one of about 18 MB (> 16 MiB).
const TXN_ROWS: [i64; 4] = [100, 100, 100, 450];

/// Rows compared per query (a result must fit a message too).
const COMPARE_ROWS: i64 = 50;

fn start(name: &str, dir: &Path, join: Option<&str>) -> Node {
    // No failover: the paused subscriber is not a candidate anyway, and nothing else
    // should move the master while the test measures.
    start_at(name, dir, "127.0.0.1:0", join)
}

fn start_at(name: &str, dir: &Path, listen: &str, join: Option<&str>) -> Node {
    start_member(name, dir, listen, join, &["--auto-failover", "false"])
}

fn sql(node: &Node, text: &str) {
    let out = node.cli(&["sql", "-e", text]);
    assert!(
        out.status.success(),
        "{} on {}: {}",
        text.chars().take(200).collect::<String>(),
        node.name,
        stderr(&out)
    );
}

/// The rows of a query as JSON, `None` when it fails.
fn query(node: &Node, text: &str) -> Option<Value> {
    let out = node.cli(&["sql", "--format", "json", "-e", text]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_str(stdout(&out).trim()).ok()?;
    Some(v["rows"].clone())
}

/// count(*), sum(k) and sum(length(v)) of t.
fn summary(node: &Node) -> Option<Value> {
    query(node, "select count(*), sum(k), sum(length(v)) from t")
}

fn replication(node: &Node) -> Value {
    let (code, body) = http_get(&node.http, "/replication");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("replication JSON")
}

fn outbound_to(master: &Node, receiver: &str) -> Option<Value> {
    replication(master)["outbound"]
        .as_array()?
        .iter()
        .find(|o| o["receiver"] == receiver)
        .cloned()
}

/// `len` alphanumeric characters from a xorshift seeded by `seed`: rows that do not
/// compress into something small.
fn noise(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// A BEGIN … COMMIT block inserting `rows` rows from key `first` on.
fn transaction(first: i64, rows: i64) -> String {
    let mut s = String::from("BEGIN;\n");
    for k in first..first + rows {
        s.push_str(&format!(
            "INSERT INTO t VALUES ({k}, '{}');\n",
            noise(k as u64, ROW_CHARS)
        ));
    }
    s.push_str("COMMIT;\n");
    s
}

#[test]
fn a_subscriber_paused_behind_large_transactions_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n1 = start("n1", d, None);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start("n2", d, Some(&n1.grpc));
    for n in [&n1, &n2] {
        sql(n, "create table t (k bigint primary key, v varchar(40000))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2",
    );
    sql(&n1, "insert into t values (0, 'first')");
    wait_for("n2 to have the first row", WAIT, || {
        (summary(&n2) == summary(&n1)).then_some(())
    });

    let out = n1.cli(&["receiver", "--subscriber", "n2", "--state", "pause"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("n1 to stop sending to n2", WAIT, || {
        outbound_to(&n1, "n2").is_none().then_some(())
    });

    let script = d.join("large.sql");
    let mut first = 1;
    let mut text = String::new();
    for rows in TXN_ROWS {
        text.push_str(&transaction(first, rows));
        first += rows;
    }
    std::fs::write(&script, &text).unwrap();
    let committing = Instant::now();
    let out = n1.cli(&["sql", "-f", script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    eprintln!(
        "committed {} MB in {} transactions on n1 in {:?}",
        text.len() / 1_000_000,
        TXN_ROWS.len(),
        committing.elapsed()
    );
    let expected = summary(&n1).expect("n1 answers");
    assert_eq!(expected[0][0].as_i64(), Some(first), "{expected}");
    let last = n1.status()["last_lsn"].as_u64().expect("last_lsn");

    let out = n1.cli(&["receiver", "--subscriber", "n2", "--state", "start"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let started = Instant::now();
    // The new stream's sessions when first seen: a stream that broke at the large
    // transaction would reconnect again and again.
    let sessions = wait_for("n1 to stream to n2 again", WAIT, || {
        outbound_to(&n1, "n2")?["sessions"].as_u64()
    });
    let inbound = wait_for("n2 to apply n1's whole log", WAIT, || {
        let v = replication(&n2);
        let s = v["inbound"].as_array()?.first()?.clone();
        (s["through_lsn"].as_u64() == Some(last)).then_some(s)
    });
    let took = started.elapsed();
    let out = outbound_to(&n1, "n2").expect("n1's stream to n2");
    eprintln!(
        "n2 caught up on {} MB in {took:?}: {} batches, {} wire bytes, sessions {} → {}",
        text.len() / 1_000_000,
        out["batches"],
        out["wire_bytes"],
        sessions,
        out["sessions"]
    );
    assert_eq!(summary(&n2).as_ref(), Some(&expected));
    for from in (0..first).step_by(COMPARE_ROWS as usize) {
        let q = format!(
            "select k, v from t where k >= {from} and k < {} order by k",
            from + COMPARE_ROWS
        );
        assert_eq!(query(&n2, &q), query(&n1, &q), "rows from {from} on");
    }
    assert_eq!(out["state"], "streaming", "{out}");
    assert_eq!(out["last_error"], Value::Null, "{out}");
    let now = out["sessions"].as_u64().expect("sessions");
    assert!(
        now <= sessions + 1,
        "reconnected: {sessions} → {now}\n{out}"
    );
    assert_eq!(inbound["refused"], Value::Null, "{inbound}");
    assert_eq!(inbound["transactions_skipped"], 0, "{inbound}");
}

/// Warnings of the last statement's result.
fn warnings(results: &[Value]) -> Vec<String> {
    results
        .last()
        .and_then(|r| r["warnings"].as_array())
        .map(|w| w.iter().map(|w| w.to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn a_restarted_twosafe_subscriber_is_streamed_to_within_a_few_hundred_ms_of_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Three voters: n1 keeps a quorum, and its master lease, while n2 is down.
    let n1 = start("n1", d, None);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut n2 = start("n2", d, Some(&n1.grpc));
    let n3 = start("n3", d, Some(&n1.grpc));
    for n in [&n1, &n2, &n3] {
        wait_for("three voters", WAIT, || (voters(n) == 3).then_some(()));
        sql(n, "create table t (k bigint primary key, v varchar(40))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2 RETURN TWOSAFE \
         SUBSCRIBER n3 STORE n1 RETURN WAIT TIME 10",
    );
    let commit = |k: i64| {
        let out = n1.cli(&[
            "sql",
            "--format",
            "json",
            "-e",
            &format!("insert into t values ({k}, 'v')"),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let results: Vec<Value> = stdout(&out)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        warnings(&results)
    };
    wait_for("n1 streaming to n2", WAIT, || {
        (outbound_to(&n1, "n2")?["state"] == "streaming").then_some(())
    });
    assert_eq!(commit(1), Vec::<String>::new());

    let n2_grpc = n2.grpc.clone();
    let sessions = outbound_to(&n1, "n2").expect("a stream")["sessions"]
        .as_u64()
        .expect("sessions");
    n2.kill9();
    drop(n2);
    // Down through eight attempts: with waits doubling to 5 s, the next would be
    // seconds away.
    wait_for("n1 to try n2 eight times", WAIT, || {
        let out = outbound_to(&n1, "n2")?;
        (out["sessions"].as_u64()? >= sessions + 8 && out["state"] == "backoff").then_some(())
    });
    let spawned = Instant::now();
    let n2 = start_at("n2", d, &n2_grpc, Some(&n1.grpc));
    let ready = spawned.elapsed();
    wait_for("n1 streaming to n2 again", WAIT, || {
        (outbound_to(&n1, "n2")?["state"] == "streaming").then_some(())
    });
    let streaming = spawned.elapsed();
    let committing = Instant::now();
    assert_eq!(
        commit(2),
        Vec::<String>::new(),
        "a TWOSAFE commit after the restart"
    );
    let acked = committing.elapsed();
    eprintln!(
        "n2 restarted: ready {ready:?} after its spawn, n1 streaming to it {:?} after that, \
         a TWOSAFE commit then took {acked:?}",
        streaming - ready
    );
    // At most one 250 ms wait, a connection and a Hello, and a poll of n1's status.
    assert!(
        streaming - ready < Duration::from_millis(1500),
        "streaming {:?} after n2 was ready",
        streaming - ready
    );
    drop(n2);
}
