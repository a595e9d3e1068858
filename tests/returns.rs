//! End-to-end: return services between real hawser processes. n1 masters two tables:
//! `t` goes to n2 with RETURN TWOSAFE, `u` to n3 with RETURN RECEIPT; n1's STORE clause
//! sets RETURN WAIT TIME 2, DISABLE RETURN SUBSCRIBER 2 and RESUME RETURN.
//!
//! * A TWOSAFE commit returns only once n2 has committed it: n2 has the row the moment
//!   the master's COMMIT returns, without waiting.
//! * With n2 killed, a commit to `t` returns after the wait time with warning TT8170
//!   (SQL and the typed API alike) and stands; n2 catches up when it restarts.
//! * Subscribers refuse client writes to the tables they receive, naming the master.
//! * With n3 killed, two timeouts in a row disable n3's return service (commits then
//!   return at once); once n3 is back and acknowledges quickly, RESUME RETURN turns it
//!   on again.
//! * BY REQUEST: `ttRepSyncSet(0x01, ...)` inside the transaction; `ttRepXactStatus`.
//!
//! Every node runs with automatic failover off ([`MANUAL`]): these tests stop and
//! restart masters on their data to test what a master that comes back does, where a
//! failover would have moved the role (tests/failover.rs tests that). A subscriber is
//! only ever taken down in clusters of three voters, so that the master keeps a Raft
//! quorum, and with it the master lease it takes writes under.
//!
//! Every wait is bounded and waits on a condition.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    ddl, http_get, poll_until, sql_json as sql, start_member, stderr, stdout, voters, wait_for,
    Node, FAST_RAFT,
};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// Automatic failover off.
const MANUAL: &[&str] = &["--auto-failover", "false"];

fn start(name: &str, dir: &Path, listen: &str, join: Option<&str>) -> Node {
    start_member(name, dir, listen, join, MANUAL)
}

fn sql_ok(node: &Node, text: &str) -> (Vec<Value>, String) {
    let (ok, results, err) = sql(node, text);
    assert!(ok, "{text} on {}: {err}", node.name);
    (results, err)
}

fn count(node: &Node, table: &str) -> Option<i64> {
    let (ok, results, _) = sql(node, &format!("select count(*) from {table}"));
    if !ok {
        return None;
    }
    results.first()?["rows"][0][0].as_i64()
}

/// n1's return-service status (HTTP `/replication`).
fn returns(node: &Node) -> Value {
    let (code, body) = http_get(&node.http, "/replication");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["returns"].clone()
}

fn subscriber<'a>(returns: &'a Value, name: &str) -> &'a Value {
    returns["subscribers"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["subscriber"] == name))
        .unwrap_or(&Value::Null)
}

/// Warnings of the last statement's result.
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

#[test]
fn return_services_hold_commits_until_acknowledged_and_fail_over_to_8170() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n1 = start("n1", d, "127.0.0.1:0", None);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut n2 = start("n2", d, "127.0.0.1:0", Some(&n1.grpc));
    let mut n3 = start("n3", d, "127.0.0.1:0", Some(&n1.grpc));
    for n in [&n1, &n2, &n3] {
        wait_for("three voters", WAIT, || (voters(n) == 3).then_some(()));
    }
    for n in [&n1, &n2, &n3] {
        sql_ok(
            n,
            "create table t (k int primary key, v varchar(40)); \
             create table u (k int primary key, v varchar(40))",
        );
    }
    ddl(
        &n1,
        "CREATE REPLICATION r \
         ELEMENT et TABLE t MASTER n1 SUBSCRIBER n2 RETURN TWOSAFE \
         ELEMENT eu TABLE u MASTER n1 SUBSCRIBER n3 RETURN RECEIPT \
         STORE n1 RETURN WAIT TIME 2 DISABLE RETURN SUBSCRIBER 2 RESUME RETURN 2000",
    );
    // The senders start when the data plane re-plans; a first commit that waits is
    // answered once the stream is up.
    wait_for("both streams streaming", WAIT, || {
        let (_, body) = http_get(&n1.http, "/replication");
        let v: Value = serde_json::from_str(&body).ok()?;
        let out = v["outbound"].as_array()?;
        (out.len() == 2 && out.iter().all(|s| s["state"] == "streaming")).then_some(())
    });

    // TWOSAFE: when COMMIT returns, n2 has committed the row: no polling needed.
    for k in 1..=5 {
        let (results, _) = sql_ok(&n1, &format!("insert into t values ({k}, 'v{k}')"));
        assert!(warnings(&results).is_empty(), "{results:?}");
        assert_eq!(
            count(&n2, "t"),
            Some(k),
            "n2 lacks row {k} after the commit"
        );
    }
    // RECEIPT: the same for n3's durable receipt (its apply is the same write).
    let (results, _) = sql_ok(&n1, "insert into u values (1, 'a')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert_eq!(count(&n3, "u"), Some(1));
    let r = returns(&n1);
    assert!(r["acknowledged"].as_u64().unwrap() >= 6, "{r}");
    assert_eq!(r["timed_out"], 0, "{r}");
    assert_eq!(subscriber(&r, "n2")["level"], "twosafe", "{r}");
    assert_eq!(subscriber(&r, "n3")["level"], "receipt", "{r}");
    // Each waited-for commit was answered by an ack: both streams report its round
    // trip (docs/status.md `ack_micros`).
    for to in ["n2", "n3"] {
        let out = outbound_to(&n1, to).expect("an outbound stream");
        let (last, mean) = (&out["ack_micros"], &out["ack_micros_mean"]);
        assert!(last.as_u64().is_some_and(|us| us > 0), "{out}");
        assert!(mean.as_u64().is_some_and(|us| us > 0), "{out}");
    }
    // Per-stream and return-service metrics.
    wait_for("stream metrics exported", WAIT, || {
        let (_, m) = http_get(&n1.http, "/metrics");
        (m.contains("hawser_stream_up{scheme=\"r\",receiver=\"n2\"} 1")
            && m.contains("hawser_stream_ack_round_trip_seconds{scheme=\"r\",receiver=\"n2\"}")
            && m.contains("hawser_stream_held_seconds{scheme=\"r\",receiver=\"n2\"} 0")
            && m.contains("hawser_stream_sent_wire_bytes_total{scheme=\"r\",receiver=\"n3\"}")
            && m.contains("hawser_return_commits_total{outcome=\"acknowledged\"}"))
        .then_some(())
    });

    // ttRepXactStatus of the session's last return-service commit: AP at n2.
    let (results, _) = sql_ok(
        &n1,
        "insert into t values (6, 'v6'); call ttRepXactStatus()",
    );
    assert_eq!(results[1]["rows"], serde_json::json!([["n2", "AP", null]]));

    // Subscribers refuse client writes to what they receive, naming the master.
    let (ok, _, err) = sql(&n2, "insert into t values (100, 'x')");
    assert!(
        !ok && err.contains("25006") && err.contains("master n1"),
        "{err}"
    );
    let (ok, _, err) = sql(&n3, "update u set v = 'x'");
    assert!(!ok && err.contains("master n1"), "{err}");
    // ... but n2 may write u, which it does not receive.
    sql_ok(&n2, "insert into u values (100, 'local')");
    // With --follow-master the session moves to the master named by the refusal and
    // goes on there from the refused statement; what ran before it stays on n2.
    let out = n2.cli(&[
        "sql",
        "--follow-master",
        "--format",
        "json",
        "-e",
        "insert into u values (101, 'local'); insert into t values (101, 'followed'); \
         select v from t where k = 101",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("moves from") && stderr(&out).contains(&n1.grpc),
        "{}",
        stderr(&out)
    );
    let results: Vec<Value> = stdout(&out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(results[2]["rows"], serde_json::json!([["followed"]]));
    let (on_n1, _) = sql_ok(&n1, "select count(*) from t where k = 101");
    assert_eq!(on_n1[0]["rows"], serde_json::json!([[1]]));
    let (on_n2, _) = sql_ok(&n2, "select count(*) from u where k = 101");
    assert_eq!(on_n2[0]["rows"], serde_json::json!([[1]]));
    // TWOSAFE: gone from n2 too when the delete returns; the counts below stay.
    sql_ok(&n1, "delete from t where k = 101");
    // Inside a transaction the session stays, and the refusal is the answer.
    let out = n2.cli(&[
        "sql",
        "--follow-master",
        "-e",
        "begin; insert into t values (102, 'no'); commit",
    ]);
    assert!(
        !out.status.success() && stderr(&out).contains("25006"),
        "{}",
        stderr(&out)
    );

    // n2 killed: a TWOSAFE commit times out after RETURN WAIT TIME with TT8170, and
    // stands on n1.
    let n2_grpc = n2.grpc.clone();
    n2.kill9();
    drop(n2);
    let (results, err) = sql_ok(&n1, "insert into t values (7, 'v7')");
    let w = warnings(&results);
    assert!(
        w.len() == 1 && w[0].starts_with("TT8170") && w[0].contains("n2"),
        "{w:?}"
    );
    // LOCAL COMMIT ACTION NO ACTION (the default) left it open; the script's session
    // ended, which commits it here.
    assert!(w[0].contains("stays open"), "{w:?}");
    assert!(err.contains("committed on the node"), "{err}");
    wait_for("row 7 once the session is gone", WAIT, || {
        (count(&n1, "t") == Some(7)).then_some(())
    });
    let r = returns(&n1);
    assert!(r["timed_out"].as_u64().unwrap() >= 1, "{r}");
    let (_, m) = http_get(&n1.http, "/metrics");
    assert!(
        m.contains("hawser_return_timeouts_total{subscriber=\"n2\"} 1"),
        "{m}"
    );

    // n2 back on its data: it catches up, and TWOSAFE commits are acknowledged again.
    let n2 = start("n2", d, &n2_grpc, Some(&n1.grpc));
    wait_for("n2 caught up", WAIT, || {
        (count(&n2, "t") == Some(7)).then_some(())
    });
    let (results, _) = sql_ok(&n1, "insert into t values (8, 'v8')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert_eq!(count(&n2, "t"), Some(8));

    // n3 killed: two timeouts in a row disable its return service; then commits to u
    // return at once, without a warning.
    let n3_grpc = n3.grpc.clone();
    n3.kill9();
    drop(n3);
    for k in 2..=3 {
        let (results, _) = sql_ok(&n1, &format!("insert into u values ({k}, 'b')"));
        assert!(warnings(&results)[0].starts_with("TT8170"), "{results:?}");
    }
    let r = returns(&n1);
    assert_eq!(subscriber(&r, "n3")["disabled"], true, "{r}");
    assert_eq!(r["disable_events"], 1, "{r}");
    let (results, _) = sql_ok(&n1, "insert into u values (4, 'c')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    let (results, _) = sql_ok(&n1, "call ttRepSyncSubscriberStatus('n3')");
    assert_eq!(results[0]["rows"], serde_json::json!([[1]]));

    // n3 back: commits acknowledged within RESUME RETURN turn the service on again.
    let n3 = start("n3", d, &n3_grpc, Some(&n1.grpc));
    wait_for("n3 caught up", WAIT, || {
        (count(&n3, "u") == Some(4)).then_some(())
    });
    let mut k = 10;
    wait_for("n3's return service resumed", WAIT, || {
        k += 1;
        sql_ok(&n1, &format!("insert into u values ({k}, 'd')"));
        (subscriber(&returns(&n1), "n3")["disabled"] == false).then_some(())
    });
    assert_eq!(returns(&n1)["resume_events"], 1);
}

#[test]
fn by_request_return_services_wait_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args = FAST_RAFT.to_vec();
    args.extend(MANUAL);
    let (n1, mut n2, _n3) = three_voters(d, &args);
    for n in [&n1, &n2] {
        sql_ok(n, "create table t (k int primary key, v varchar(40))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2 \
         RETURN RECEIPT BY REQUEST STORE n1 RETURN WAIT TIME 1",
    );
    sql_ok(&n1, "insert into t values (0, 'first')");
    wait_for("n2 replicates", WAIT, || {
        (count(&n2, "t") == Some(1)).then_some(())
    });

    // Only the transaction that asked waits; with n2 gone only it gets TT8170.
    let n2_grpc = n2.grpc.clone();
    n2.kill9();
    drop(n2);
    let (results, _) = sql_ok(&n1, "insert into t values (1, 'not asked')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    let (results, _) = sql_ok(
        &n1,
        "begin; call ttRepSyncSet(0x01, NULL, NULL); insert into t values (2, 'asked'); \
         commit; call ttRepXactStatus()",
    );
    assert!(
        warnings(&results[..4])[0].starts_with("TT8170"),
        "{results:?}"
    );
    assert_eq!(results[4]["rows"], serde_json::json!([["n2", "NS", null]]));
    // The session's returnWait of 0 means no wait at all.
    let (results, _) = sql_ok(
        &n1,
        "call ttRepSyncSet(NULL, 0, NULL); begin; call ttRepSyncSet(0x01); \
         insert into t values (3, 'no wait'); commit",
    );
    assert!(warnings(&results).is_empty(), "{results:?}");

    let n2 = start("n2", d, &n2_grpc, Some(&n1.grpc));
    wait_for("n2 caught up", WAIT, || {
        (count(&n2, "t") == Some(4)).then_some(())
    });
    let (results, _) = sql_ok(&n1, "call ttRepSubscriberWait(NULL, NULL, 'n2', NULL, 10)");
    // 0x00: caught up within the wait.
    assert_eq!(results[0]["rows"], serde_json::json!([["00"]]));
}

#[test]
fn bench_mode_replicates_its_table_and_wait_sees_subscribers_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The master and the TWOSAFE subscriber run on one thread each (`--threads 1`:
    // the master's commits flush on the blocking pool or, alone, inline; the
    // subscriber's applies inline), the async subscriber on one per core.
    let one = ["--threads", "1"];
    let n1 = start_member("n1", d, "127.0.0.1:0", None, &one);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start_member("n2", d, "127.0.0.1:0", Some(&n1.grpc), &one);
    let n3 = start("n3", d, "127.0.0.1:0", Some(&n1.grpc));
    for n in [&n1, &n2, &n3] {
        wait_for("three voters", WAIT, || (voters(n) == 3).then_some(()));
    }
    for n in [&n1, &n2] {
        assert!(
            without_colours(&n.log()).contains("async runtime started worker_threads=1"),
            "{} did not run on one thread: {}",
            n.name,
            n.log()
        );
    }
    // The bench creates its table on n1 only: the DATASTORE element replicates it.
    let out = n1.cli(&[
        "bench",
        "--mode",
        "twosafe",
        "--subscriber",
        "n2",
        "--async-subscriber",
        "n3",
        "--compress",
        "--clients",
        "2",
        // Both clients' write streams on one HTTP/2 connection.
        "--connections",
        "1",
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--keys",
        "50",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let commits = report["commits"].as_u64().unwrap();
    assert!(commits > 0, "{report}");
    assert_eq!(report["connections"], 1, "{report}");
    assert_eq!(report["mode"], "twosafe");
    // Every measured commit waited for n2 and was acknowledged.
    assert_eq!(report["returns"]["acknowledged"], commits, "{report}");
    assert_eq!(report["returns"]["timed_out"], 0, "{report}");
    assert!(report["catch_up_ms"].as_f64().is_some(), "{report}");
    // The master's streams were sampled under load: both subscribers, and the TWOSAFE
    // stream (acknowledged batch by batch) has an ack round trip.
    let streams = report["streams"].as_array().expect("streams sampled");
    let stream = |to: &str| streams.iter().find(|s| s["receiver"] == to).cloned();
    for to in ["n2", "n3"] {
        let s = stream(to).unwrap_or_else(|| panic!("no samples of the stream to {to}: {report}"));
        assert!(s["samples"].as_u64().is_some_and(|n| n >= 1), "{s}");
        assert!(s["lag_ms_max"].as_f64().is_some(), "{s}");
    }
    let twosafe = stream("n2").unwrap();
    assert!(
        twosafe["ack_round_trip_ms"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{twosafe}"
    );
    // Compressed (--compress) with the master's default codec, and the bytes counted.
    assert_eq!(twosafe["compression"], "lz4", "{twosafe}");
    assert!(
        twosafe["raw_bytes_per_txn"]
            .as_f64()
            .is_some_and(|b| b > 0.0),
        "{twosafe}"
    );
    // Each node's CPU per commit, read from the three nodes' status.
    let cpu = &report["server_cpu_us_per_commit"];
    for n in ["n1", "n2", "n3"] {
        assert!(cpu[n].as_f64().is_some_and(|us| us > 0.0), "{n}: {report}");
    }

    // `hawser wait` agrees, and both subscribers have the master's rows.
    for sub in ["n2", "n3"] {
        let out = n1.cli(&["wait", "--subscriber", sub, "--timeout", "20s"]);
        assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
        assert!(stdout(&out).contains("caught up"), "{}", stdout(&out));
    }
    let master = sql_ok(&n1, "select k, v from bench order by k").0;
    for n in [&n2, &n3] {
        assert_eq!(
            sql_ok(n, "select k, v from bench order by k").0[0]["rows"],
            master[0]["rows"]
        );
    }
    // A DATASTORE scheme over everything: its stream re-ships CREATE TABLE bench, which
    // n2 already has (recorded, not refused), and a table created after the scheme is
    // replicated and waited for at once: TWOSAFE holds the first commit to it.
    ddl(&n1, "DROP REPLICATION bench_repl");
    ddl(
        &n1,
        "CREATE REPLICATION d ELEMENT e DATASTORE MASTER n1 SUBSCRIBER n2 RETURN TWOSAFE \
         STORE n1 RETURN WAIT TIME 10",
    );
    let acknowledged = returns(&n1)["acknowledged"].as_u64().unwrap();
    let (results, _) = sql_ok(
        &n1,
        "create table late (k int primary key, v int); insert into late values (1, 1)",
    );
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert_eq!(count(&n2, "late"), Some(1));
    assert_eq!(
        returns(&n1)["acknowledged"].as_u64().unwrap(),
        acknowledged + 1,
        "the first commit to the new table waited for n2"
    );
    let (results, _) = sql_ok(&n1, "insert into late values (2, 2)");
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert_eq!(count(&n2, "late"), Some(2));

    // A subscriber that is not one: a clear error, exit 1.
    let out = n1.cli(&["wait", "--subscriber", "nobody", "--timeout", "1s"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("sends to no subscriber nobody"),
        "{}",
        stderr(&out)
    );
}

/// `text` without its ANSI colour sequences (ESC `[` ... `m`).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// The receiver states of `scheme` as `node` reports them (`"STORE=STATE"`).
fn receivers(node: &Node, scheme: &str) -> Vec<String> {
    node.try_status()
        .and_then(|s| {
            s["cluster"]["schemes"].as_array().and_then(|a| {
                a.iter().find(|x| x["name"] == scheme).map(|x| {
                    x["receivers"]
                        .as_array()
                        .map(|r| {
                            r.iter()
                                .filter_map(|v| v.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default()
                })
            })
        })
        .unwrap_or_default()
}

fn outbound_to(node: &Node, receiver: &str) -> Option<Value> {
    let (_, body) = http_get(&node.http, "/replication");
    let v: Value = serde_json::from_str(&body).ok()?;
    v["outbound"]
        .as_array()?
        .iter()
        .find(|o| o["receiver"] == receiver)
        .cloned()
}

/// Where `node`'s commit log starts (`replication.log.start_lsn`).
fn log_start(node: &Node) -> Option<u64> {
    let (_, body) = http_get(&node.http, "/replication");
    serde_json::from_str::<Value>(&body).ok()?["log"]["start_lsn"].as_u64()
}

/// The master's flags in the FAILTHRESHOLD tests: log files of 4 KiB (FAILTHRESHOLD's
/// unit) and no log kept beyond what streams hold.
fn small_log_args() -> Vec<&'static str> {
    let mut args: Vec<&str> = FAST_RAFT.to_vec();
    args.extend(MANUAL);
    args.extend(["--log-file-size", "4096", "--log-keep-bytes", "0"]);
    args
}

/// n1 started with `args` and initialised, n2 and n3 joined: three voters, so a Raft
/// quorum survives one of them going down.
fn three_voters(d: &Path, args: &[&str]) -> (Node, Node, Node) {
    let n1 = Node::start_at("n1", &d.join("n1"), "127.0.0.1:0", args);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start("n2", d, "127.0.0.1:0", Some(&n1.grpc));
    let n3 = start("n3", d, "127.0.0.1:0", Some(&n1.grpc));
    for n in [&n1, &n2, &n3] {
        wait_for("three voters", WAIT, || (voters(n) == 3).then_some(()));
    }
    (n1, n2, n3)
}

use common::wait_leased as leased;

/// Stops `node` cleanly (asserting that it did) and starts it again on its data and
/// address with `args`, and waits until it holds a master lease.
fn restart_cleanly(node: Node, d: &Path, args: &[&str]) -> Node {
    restart_cleanly_with(node, d, args, || {})
}

/// [`restart_cleanly`], doing `meanwhile` while the node is down.
fn restart_cleanly_with(mut node: Node, d: &Path, args: &[&str], meanwhile: impl FnOnce()) -> Node {
    assert!(
        node.terminate().is_some_and(|s| s.success()),
        "{} did not stop cleanly",
        node.name
    );
    let (name, grpc) = (node.name.clone(), node.grpc.clone());
    drop(node);
    meanwhile();
    let node = Node::start_at(&name, &d.join(&name), &grpc, args);
    leased(&node);
    node
}

/// Receiver states with TimesTen's log retention: PAUSE holds the master's log, FAILED
/// releases it, and a duplicate rebuilds the subscriber that lacks it. The master keeps
/// no log beyond what streams hold (`--log-keep-bytes 0`).
#[test]
fn receiver_states_and_failthreshold_stop_the_stream_and_release_commits() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let args = small_log_args();
    let (n1, mut n2, n3) = three_voters(d, &args);
    for n in [&n1, &n2] {
        sql_ok(n, "create table t (k int primary key, v varchar(200))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2 RETURN RECEIPT \
         STORE n1 RETURN WAIT TIME 2 FAILTHRESHOLD 1",
    );
    wait_for("the stream to n2", WAIT, || {
        outbound_to(&n1, "n2").filter(|o| o["state"] == "streaming")
    });
    let (results, _) = sql_ok(&n1, "insert into t values (1, 'a')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert_eq!(count(&n2, "t"), Some(1));
    // What n2 acknowledged is released (the last record always stays).
    let last = n1.status()["last_lsn"].as_u64().unwrap();
    wait_for("n1 to release the acknowledged log", WAIT, || {
        (log_start(&n1) == Some(last)).then_some(())
    });

    // PAUSE (set through another node): no stream, and RECEIPT commits do not wait for
    // a paused subscriber (RETURN SERVICES OFF WHEN REPLICATION STOPPED, its default).
    let out = n3.cli(&["receiver", "--subscriber", "n2", "--state", "pause"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("n2 is PAUSE in r"),
        "{}",
        stdout(&out)
    );
    wait_for("n1 stops sending to n2", WAIT, || {
        outbound_to(&n1, "n2").is_none().then_some(())
    });
    assert_eq!(receivers(&n1, "r"), ["n2=PAUSE"]);
    let released = returns(&n1)["released_disabled"].as_u64().unwrap();
    let paused_at = n1.status()["last_lsn"].as_u64().unwrap();
    let (results, _) = sql_ok(&n1, "insert into t values (2, 'b')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert_eq!(
        returns(&n1)["released_disabled"].as_u64().unwrap(),
        released + 1
    );
    sql_ok(&n1, "insert into t values (3, 'c')");
    assert!(log_start(&n1).unwrap() <= paused_at + 1);
    // Back to START: n2 gets what it missed — the paused receiver held the log (had
    // it been released, the sender would report `log_released` and n2 would stay at
    // one row).
    let out = n1.cli(&["receiver", "--subscriber", "n2", "--state", "start"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("n2 catches up", WAIT, || {
        (count(&n2, "t") == Some(3)).then_some(())
    });
    assert!(receivers(&n1, "r").is_empty());
    // FAILED is the master's to set.
    let out = n1.cli(&["receiver", "--subscriber", "n2", "--state", "failed"]);
    assert!(!out.status.success());

    // n2 dies; more than one 4 KiB log file of commits later it is marked FAILED, and
    // commits stop waiting for it.
    n2.kill9();
    let big = "x".repeat(180);
    let inserts: Vec<String> = (10..40)
        .map(|k| format!("insert into t values ({k}, '{big}')"))
        .collect();
    sql_ok(
        &n1,
        &format!("call ttRepSyncSet(NULL, 0, NULL); {}", inserts.join("; ")),
    );
    wait_for("n2 marked FAILED", WAIT, || {
        (receivers(&n1, "r") == ["n2=FAILED"]).then_some(())
    });
    let (results, _) = sql_ok(&n1, "insert into t values (99, 'after')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert!(outbound_to(&n1, "n2").is_none());
    // A FAILED receiver holds no log: everything but the last record goes.
    let last = n1.status()["last_lsn"].as_u64().unwrap();
    wait_for("n1 to release the log n2 lacks", WAIT, || {
        (log_start(&n1) == Some(last)).then_some(())
    });

    // n1 restarts: the position n2 acknowledged is kept across the restart.
    let n1 = restart_cleanly(n1, d, &args);
    // Back on its data, n2 stays behind until someone sets it to START; the log it
    // lacks is gone, so its sender says it needs a duplicate rather than skip it.
    let n2 = start("n2", d, &n2.grpc, Some(&n1.grpc));
    let out = wait_for("a leader to take the receiver state", WAIT, || {
        let out = n1.cli(&[
            "receiver",
            "--scheme",
            "r",
            "--subscriber",
            "n2",
            "--state",
            "start",
        ]);
        (!stderr(&out).contains("57P03")).then_some(out)
    });
    assert!(out.status.success(), "{}", stderr(&out));
    let out = wait_for("n1's sender to n2 to give up", WAIT, || {
        outbound_to(&n1, "n2").filter(|o| o["state"] == "log_released")
    });
    let reason = out["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("released") && reason.contains("duplicate"),
        "{reason}"
    );
    assert_eq!(count(&n2, "t"), Some(3), "n2 got part of what it missed");

    // The duplicate rebuilds it: stopped again, it copies t from n1, takes n1's marks
    // and starts its receiver; the stream resumes and n2 has every row.
    let out = n1.cli(&["receiver", "--subscriber", "n2", "--state", "stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = n2.cli(&["duplicate", "--scheme", "r"]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), n2.log());
    assert!(stdout(&out).contains("from n1"), "{}", stdout(&out));
    assert!(receivers(&n1, "r").is_empty());
    let rows = count(&n1, "t").unwrap();
    sql_ok(&n1, "insert into t values (100, 'after the duplicate')");
    wait_for("n2 to have every row", WAIT, || {
        (count(&n2, "t") == Some(rows + 1)).then_some(())
    });
    wait_for("the stream to n2", WAIT, || {
        outbound_to(&n1, "n2").filter(|o| o["state"] == "streaming")
    });
}

/// FAILTHRESHOLD bounds the log every receiver holds, not only a streaming one's: a
/// PAUSEd receiver (which holds the log), and one that has not connected since its
/// master restarted, are both marked FAILED once the log written since (their last
/// acknowledged position, or the restart) passes the threshold, and the log they held
/// is released.
#[test]
fn failthreshold_fails_paused_receivers_and_receivers_unseen_since_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let args = small_log_args();
    let (n1, n2, mut n3) = three_voters(d, &args);
    for n in [&n1, &n2, &n3] {
        sql_ok(n, "create table t (k int primary key, v varchar(200))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2, n3 \
         STORE n1 FAILTHRESHOLD 1",
    );
    for r in ["n2", "n3"] {
        wait_for("the streams to n2 and n3", WAIT, || {
            outbound_to(&n1, r).filter(|o| o["state"] == "streaming")
        });
    }
    sql_ok(&n1, "insert into t values (1, 'a')");
    for n in [&n2, &n3] {
        wait_for("the first row replicated", WAIT, || {
            (count(n, "t") == Some(1)).then_some(())
        });
    }
    // n2 is paused (it holds the log from here); n3 dies and n1 restarts, so n1's
    // sender to n3 never reaches it in this process.
    let out = n1.cli(&["receiver", "--subscriber", "n2", "--state", "pause"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("n1 stops sending to n2", WAIT, || {
        outbound_to(&n1, "n2").is_none().then_some(())
    });
    n3.kill9();
    let n1 = restart_cleanly(n1, d, &args);
    // More than one 4 KiB log file of commits (n1 takes writes once it is master again).
    let big = "x".repeat(180);
    for k in 10..40 {
        let text = format!("insert into t values ({k}, '{big}')");
        wait_for("n1 to take a write", WAIT, || {
            sql(&n1, &text).0.then_some(())
        });
    }
    wait_for("n2 and n3 marked FAILED", WAIT, || {
        let mut r = receivers(&n1, "r");
        r.sort();
        (r == ["n2=FAILED", "n3=FAILED"]).then_some(())
    });
    // Nobody holds the log now: everything but the last record goes.
    let last = n1.status()["last_lsn"].as_u64().unwrap();
    wait_for("n1 to release the log n2 and n3 held", WAIT, || {
        (log_start(&n1) == Some(last)).then_some(())
    });
    assert_eq!(count(&n2, "t"), Some(1), "a paused receiver got rows");
}

#[test]
fn durable_commit_on_flushes_commits_while_the_return_service_is_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args: Vec<&str> = FAST_RAFT.to_vec();
    args.extend(MANUAL);
    args.extend(["--durable-commits", "false"]);
    let (n1, mut n2, _n3) = three_voters(d, &args);
    for n in [&n1, &n2] {
        sql_ok(n, "create table t (k bigint primary key, v varchar(100))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2 RETURN RECEIPT \
         STORE n1 RETURN WAIT TIME 2 DISABLE RETURN SUBSCRIBER 1 DURABLE COMMIT ON",
    );
    wait_for("the stream to n2", WAIT, || {
        outbound_to(&n1, "n2").filter(|o| o["state"] == "streaming")
    });
    // The typed API reports whether each commit was flushed before it returned.
    // The node's commits are not durable, and the return service guards them.
    let r = bench(&n1);
    assert_eq!(r["durable"], false, "{r}");
    assert!(r["returns"]["acknowledged"].as_u64().unwrap() > 0, "{r}");

    // n2 dies: one timeout disables its return service, and from then on DURABLE
    // COMMIT ON makes every commit wait for its flush.
    n2.kill9();
    // (On a loaded machine a bench commit may already have timed out and disabled n2.)
    let mut k = 0;
    wait_for("n2's return service disabled", WAIT, || {
        k -= 1;
        sql_ok(&n1, &format!("insert into t values ({k}, 'times out')"));
        (subscriber(&returns(&n1), "n2")["disabled"] == true).then_some(())
    });
    assert!(returns(&n1)["timed_out"].as_u64().unwrap() >= 1);
    let r = bench(&n1);
    assert_eq!(r["durable"], true, "{r}");
    assert_eq!(r["returns"]["acknowledged"], 0, "{r}");
    assert!(r["returns"]["disabled"].as_u64().unwrap() > 0, "{r}");
}

/// One second of `hawser bench` on table `t` of `n1` with one client, as JSON.
fn bench(n1: &Node) -> Value {
    let out = n1.cli(&[
        "bench",
        "--table",
        "t",
        "--clients",
        "1",
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(stdout(&out).trim()).unwrap()
}

/// The lag a stream reports keeps growing while its receiver does not answer — between
/// acks, and after the peer timeout dropped the stream — and the receiver catches up
/// once it runs again.
#[test]
fn stream_lag_grows_while_the_receiver_does_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, n2, _n3) = three_voters(d, FAST_RAFT);
    for n in [&n1, &n2] {
        sql_ok(n, "create table t (k int primary key, v varchar(40))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2",
    );
    sql_ok(&n1, "insert into t values (1, 'a')");
    wait_for("n2 has the first row", WAIT, || {
        (count(&n2, "t") == Some(1)).then_some(())
    });
    let caught_up = || {
        let o = outbound_to(&n1, "n2")?;
        (o["lag_records"] == 0 && o["lag_micros"] == 0).then_some(())
    };
    wait_for("no lag once the first row is acknowledged", WAIT, caught_up);

    // n2 stops answering with its connection open (SIGSTOP): no acks come back, and the
    // stream's lag must still show the commit it has not acknowledged.
    let pid = n2.pid().to_string();
    let signal = |sig: &str| {
        let sent = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    sql_ok(&n1, "insert into t values (2, 'b')");
    let lagging = wait_for("the stopped receiver's lag reported", WAIT, || {
        let o = outbound_to(&n1, "n2")?;
        (o["lag_records"].as_u64()? > 0 && o["lag_micros"].as_u64()? > 0).then_some(o)
    });
    // Past the peer timeout the stream is dropped and retried; its lag keeps growing
    // while no session runs.
    let at_drop = wait_for("the stream to the stopped receiver dropped", WAIT, || {
        let o = outbound_to(&n1, "n2")?;
        (o["state"] != "streaming").then_some(o["lag_micros"].as_u64()?)
    });
    wait_for("the lag growing while the stream is down", WAIT, || {
        let o = outbound_to(&n1, "n2")?;
        (o["state"] != "streaming" && o["lag_micros"].as_u64()? > at_drop).then_some(())
    });
    signal("-CONT");
    wait_for("n2 catches up after SIGCONT", WAIT, || {
        (count(&n2, "t") == Some(2)).then_some(())
    });
    wait_for("no lag once n2 acknowledged again", WAIT, caught_up);
    assert!(
        lagging["ack_micros_mean"].as_u64().is_some_and(|us| us > 0),
        "{lagging}"
    );
}

/// Table `t` on n1 and n2, and scheme `r`: n1 master, n2 its RECEIPT subscriber
/// (RETURN WAIT TIME 1); returns once n1 streams to n2.
fn receipt_to_n2(n1: &Node, n2: &Node) {
    for n in [n1, n2] {
        sql_ok(n, "create table t (k int primary key, v varchar(20))");
    }
    ddl(
        n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2 RETURN RECEIPT \
         STORE n1 RETURN WAIT TIME 1",
    );
    wait_for("the stream to n2", WAIT, || {
        outbound_to(n1, "n2").filter(|o| o["state"] == "streaming")
    });
}

/// A node's arguments with `--boot-id`, which stands in for the machine's boot.
fn boot(id: &'static str) -> Vec<&'static str> {
    let mut args = FAST_RAFT.to_vec();
    args.extend(MANUAL);
    args.extend(["--boot-id", id]);
    args
}

/// Why `node` takes no writes of its own now (`/replication`'s `writes_paused`).
fn paused(node: &Node) -> Option<String> {
    let (code, body) = http_get(&node.http, "/replication");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["writes_paused"].as_str().map(str::to_string)
}

/// Sets `subscriber`'s receiver to STOP through `master` and waits until the master
/// takes writes: the way out of a restart fence held by that subscriber.
fn stop_receiver_for_writes(master: &Node, subscriber: &str) {
    let out = master.cli(&["receiver", "--subscriber", subscriber, "--state", "stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for(
        &format!("{} to take writes with {subscriber} stopped", master.name),
        WAIT,
        || paused(master).is_none().then_some(()),
    );
}

/// A master restarted after its machine did (`--boot-id` stands in for the boot) may
/// have lost commits it had shipped to its RECEIPT subscriber before their sync: it
/// takes no writes of its own (57P03, named in status) until that subscriber has
/// answered — or its receiver is stopped; a restart of the process alone does not
/// pause it.
#[test]
fn a_master_back_from_a_machine_restart_writes_once_its_return_subscriber_answered() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, mut n2, _n3) = three_voters(d, &boot("boot-a"));
    receipt_to_n2(&n1, &n2);
    let (results, _) = sql_ok(&n1, "insert into t values (1, 'before')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert_eq!(count(&n2, "t"), Some(1));
    assert_eq!(paused(&n1), None);

    // n2 is down when n1 comes back from a "machine restart".
    assert!(n2.terminate().is_some_and(|s| s.success()));
    let n2_grpc = n2.grpc.clone();
    drop(n2);
    let n1 = restart_cleanly(n1, d, &boot("boot-b"));
    let reason = paused(&n1).expect("writes paused after a machine restart");
    assert!(reason.contains("machine restarted"), "{reason}");
    // Refused until n1 holds a master lease again, then by the fence.
    let err = wait_for("the fence to refuse the write", WAIT, || {
        let (ok, _, err) = sql(&n1, "insert into t values (2, 'paused')");
        assert!(!ok && err.contains("57P03"), "{err}");
        (!err.contains("no master lease")).then_some(err)
    });
    assert!(err.contains("takes no writes now"), "{err}");
    let out = n1.cli(&["status"]);
    assert!(
        stdout(&out).contains("writes      PAUSED"),
        "{}",
        stdout(&out)
    );
    let writes_paused_metric = |n: &Node| {
        let (code, body) = http_get(&n.http, "/metrics");
        assert_eq!(code, 200, "{body}");
        body.lines()
            .find_map(|l| l.strip_prefix("hawser_writes_paused ").map(str::to_string))
    };
    wait_for("the paused-writes gauge", WAIT, || {
        (writes_paused_metric(&n1).as_deref() == Some("1")).then_some(())
    });

    // n2 answers, holding nothing n1 lacks: n1 takes writes again and n2 gets them.
    let n2 = start_member("n2", d, &n2_grpc, None, &[]);
    wait_for("n1 to take writes again", WAIT, || {
        paused(&n1).is_none().then_some(())
    });
    wait_for("the paused-writes gauge back to 0", WAIT, || {
        (writes_paused_metric(&n1).as_deref() == Some("0")).then_some(())
    });
    let (results, _) = sql_ok(&n1, "insert into t values (3, 'after')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert_eq!(count(&n2, "t"), Some(2));
    assert_eq!(count(&n1, "t"), Some(2));

    // A restart of the process alone (same boot) does not pause writes, even with n2
    // down: what n1 wrote survived in the kernel's cache.
    let mut n2 = n2;
    assert!(n2.terminate().is_some_and(|s| s.success()));
    let n1 = restart_cleanly(n1, d, &boot("boot-b"));
    assert_eq!(paused(&n1), None);
    let (results, _) = sql_ok(&n1, "insert into t values (4, 'n2 down')");
    assert!(
        warnings(&results).iter().any(|w| w.contains("8170")),
        "{results:?}"
    );

    // Another machine restart with n2 still down, for good this time: the way out is
    // to stop n2's receiver, which removes its stream and the wait for it.
    let n1 = restart_cleanly(n1, d, &boot("boot-c"));
    assert!(paused(&n1).is_some());
    stop_receiver_for_writes(&n1, "n2");
    let (results, _) = sql_ok(&n1, "insert into t values (5, 'n2 stopped')");
    assert!(warnings(&results).is_empty(), "{results:?}");
    assert_eq!(count(&n1, "t"), Some(4));
}

/// Waits (as `what`) until `master`'s stream to n2 says `diverged`, checks that its
/// reason says `why`, and returns the stream's status.
fn diverged_from(master: &Node, what: &str, why: &str) -> Value {
    let out = wait_for(what, WAIT, || {
        outbound_to(master, "n2").filter(|o| o["state"] == "diverged")
    });
    assert!(
        out["reason"].as_str().is_some_and(|r| r.contains(why)),
        "{out}"
    );
    out
}

/// The keys of t on `node`, in order.
fn keys(node: &Node) -> Value {
    let (ok, results, err) = sql(node, "select k from t order by k");
    assert!(ok, "{err}");
    results[0]["rows"].clone()
}

/// Puts a store back to the copy `saved` (the copy takes its place).
fn put_back(saved: &Path, store: &Path) {
    std::fs::remove_dir_all(store).unwrap();
    std::fs::rename(saved, store).unwrap();
}

/// Copies a directory tree (files and directories only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A master whose machine lost commits its RECEIPT subscriber already holds (here: its
/// store put back to a copy taken before them) stays paused, naming the subscriber and
/// both seqs — across a restart of the process too; stopping the receiver lets it take
/// writes, and starting the receiver again does not resume the stream: the subscriber
/// would skip the new commits as duplicates of the lost ones, so its sender says
/// `diverged` and sends nothing.
#[test]
fn a_subscriber_holding_commits_its_master_lost_is_never_streamed_to_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, n2, _n3) = three_voters(d, &boot("boot-a"));
    receipt_to_n2(&n1, &n2);
    sql_ok(&n1, "insert into t values (1, 'kept')");
    // The store as the machine's disk will have it: without the next two commits.
    let (store, saved) = (d.join("n1/db"), d.join("n1-db-saved"));
    let n1 = restart_cleanly_with(n1, d, &boot("boot-a"), || copy_tree(&store, &saved));
    wait_for("the stream to n2 again", WAIT, || {
        outbound_to(&n1, "n2").filter(|o| o["state"] == "streaming")
    });
    for k in [2, 3] {
        let (results, _) = sql_ok(&n1, &format!("insert into t values ({k}, 'lost')"));
        assert!(warnings(&results).is_empty(), "{results:?}");
    }
    assert_eq!(count(&n2, "t"), Some(3));
    let n1 = restart_cleanly_with(n1, d, &boot("boot-b"), || put_back(&saved, &store));
    let mut last = None;
    let reason = poll_until(WAIT, || {
        last = paused(&n1);
        last.clone()
            .filter(|r| r.contains("subscriber n2 holds this node's commits"))
    })
    .unwrap_or_else(|| {
        panic!(
            "timed out after {WAIT:?} waiting for n1 to name the subscriber holding its lost \
             commits; writes paused: {last:?}; stream to n2: {:?}",
            outbound_to(&n1, "n2")
        )
    });
    assert!(reason.contains("this node only through"), "{reason}");
    let (ok, _, err) = sql(&n1, "insert into t values (4, 'refused')");
    assert!(!ok && err.contains("57P03") && err.contains("n2"), "{err}");
    let out = diverged_from(&n1, "n2's stream to say diverged", "machine restarted");
    // What n2 holds acknowledges nothing: n1's next commits reuse those seqs.
    assert_eq!(out["acked_durable"], serde_json::json!({}), "{out}");
    let status = stdout(&n1.cli(&["status"]));
    assert!(
        status.contains("diverged") && status.contains("rebuild the subscriber"),
        "{status}"
    );

    // A restart of the process (same boot) keeps the fence.
    let n1 = restart_cleanly(n1, d, &boot("boot-b"));
    assert!(paused(&n1).is_some());

    // Stopping n2's receiver lets n1 take writes; starting it again sends n2 nothing.
    stop_receiver_for_writes(&n1, "n2");
    sql_ok(&n1, "insert into t values (5, 'new')");
    assert_eq!(count(&n1, "t"), Some(2));
    let out = n1.cli(&["receiver", "--subscriber", "n2", "--state", "start"]);
    assert!(out.status.success(), "{}", stderr(&out));
    diverged_from(&n1, "n2's stream refused again", "rebuild");
    assert_eq!(
        keys(&n2),
        serde_json::json!([[1], [2], [3]]),
        "n2 keeps what it had and gets nothing under the reused seqs"
    );

    // n1's own commits have passed n2's seqs by now; another machine restart does not
    // make n2 look current: it stays diverged (n1 waits for it, so it is stopped again).
    for k in 6..=8 {
        sql_ok(&n1, &format!("insert into t values ({k}, 'new')"));
    }
    let n1 = restart_cleanly(n1, d, &boot("boot-c"));
    diverged_from(
        &n1,
        "n2's stream refused after the next restart",
        "through seq",
    );
    stop_receiver_for_writes(&n1, "n2");
    assert_eq!(count(&n2, "t"), Some(3));
}

/// A master whose store is put back to a copy — no machine restart — and which takes
/// writes while its subscriber is down: when the subscriber is back, the master's seqs
/// have passed what it holds (it is not ahead), but its newest commits of the master's
/// are ones the master lost and has given out again. The master's sender finds its own
/// commit under the subscriber's newest seq made at another time and refuses it for
/// good, instead of streaming it the commits after those seqs (it would skip the ones
/// under them as duplicates).
#[test]
fn a_subscriber_holding_commits_a_restored_master_gave_out_again_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let args = boot("boot-a");
    let (n1, n2, _n3) = three_voters(d, &args);
    for n in [&n1, &n2] {
        sql_ok(n, "create table t (k int primary key, v varchar(20))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2",
    );
    let streaming = |n1: &Node| {
        wait_for("the stream to n2", WAIT, || {
            outbound_to(n1, "n2").filter(|o| o["state"] == "streaming")
        })
    };
    streaming(&n1);
    sql_ok(&n1, "insert into t values (1, 'kept')");
    // The copy of n1's store, taken without the next two commits.
    let (store, saved) = (d.join("n1/db"), d.join("n1-db-saved"));
    let n1 = restart_cleanly_with(n1, d, &args, || copy_tree(&store, &saved));
    streaming(&n1);
    for k in [2, 3] {
        sql_ok(&n1, &format!("insert into t values ({k}, 'lost')"));
    }
    wait_for("n2 to hold all three", WAIT, || {
        (count(&n2, "t") == Some(3)).then_some(())
    });
    // ... durably: an async subscriber flushes its applies now and then, and what a
    // SIGKILL takes from it now n1 no longer has to send again. The position n2 acked
    // durably must reach n1's log end (the stream's published lag and marks are only
    // as fresh as its last ack: they can still show the state before the third commit).
    wait_for("n2 to have all three durably", WAIT, || {
        let (_, body) = http_get(&n1.http, "/replication");
        let v: Value = serde_json::from_str(&body).ok()?;
        let last = v["log"]["last_lsn"].as_u64()?;
        let out = v["outbound"]
            .as_array()?
            .iter()
            .find(|o| o["receiver"] == "n2")?;
        (out["acked_lsn"].as_u64()? >= last).then_some(())
    });

    // n2 is down while n1 is put back to the copy and commits past n2's seqs.
    let mut n2 = n2;
    let n2_grpc = n2.grpc.clone();
    n2.kill9();
    drop(n2);
    let n1 = restart_cleanly_with(n1, d, &args, || put_back(&saved, &store));
    for k in 4..=7 {
        let row = format!("insert into t values ({k}, 'new')");
        wait_for("n1 to take a write", WAIT, || {
            sql(&n1, &row).0.then_some(())
        });
    }

    let n2 = start("n2", d, &n2_grpc, Some(&n1.grpc));
    diverged_from(
        &n1,
        "n2's stream to say diverged",
        "gave the seq to another commit",
    );
    assert_eq!(
        keys(&n2),
        serde_json::json!([[1], [2], [3]]),
        "n2 keeps what it had and gets nothing past the reused seqs"
    );
    // Refused for good: a restart of n1 does not let n2 through.
    let n1 = restart_cleanly(n1, d, &args);
    diverged_from(&n1, "n2's stream refused after n1's restart", "rebuild");
    assert_eq!(count(&n2, "t"), Some(3));
}

/// TimesTen's LOCAL COMMIT ACTION NO ACTION (the default) on real processes: a RETURN
/// TWOSAFE commit that times out leaves the session's transaction open — committed on
/// the master and shipped, but its rows hidden from other sessions — and only COMMIT
/// may follow: it waits again, and once the subscriber has the commit it ends it.
/// `ttRepSyncSet(NULL, NULL, 2)` before COMMIT ends it committed here instead, and so
/// does the session going away.
#[test]
fn a_twosafe_commit_timed_out_under_no_action_stays_open_until_commit_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, n2, _n3) = three_voters(d, FAST_RAFT);
    for n in [&n1, &n2] {
        sql_ok(n, "create table t (k int primary key, v varchar(20))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2 RETURN TWOSAFE \
         STORE n1 RETURN WAIT TIME 1",
    );
    wait_for("the stream to n2", WAIT, || {
        outbound_to(&n1, "n2").filter(|o| o["state"] == "streaming")
    });
    let set_receiver = |state: &str| {
        let out = n1.cli(&["receiver", "--subscriber", "n2", "--state", state]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    // A worker thread of its own, so a dropped session's stream is closed at once.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let session = || {
        rt.block_on(async {
            let mut c = hawser_client::Client::connect(&n1.grpc).await.unwrap();
            c.session().await.unwrap()
        })
    };
    let run = |s: &mut hawser_client::Session, sql: &str| rt.block_on(s.execute(sql)).unwrap();
    let warned = |o: &hawser_client::ScriptOutcome| -> Vec<String> {
        o.results
            .iter()
            .flat_map(|r| {
                r.warnings
                    .iter()
                    .map(|w| format!("{}: {}", w.code, w.message))
            })
            .collect()
    };

    // n2 paused: TWOSAFE keeps waiting while replication is stopped (RETURN SERVICES
    // ON WHEN STOPPED, its default), so the commit times out.
    set_receiver("pause");
    let mut a = session();
    let o = run(&mut a, "insert into t values (1, 'open')");
    assert!(o.error.is_none(), "{o:?}");
    let w = warned(&o);
    assert!(
        w[0].starts_with("TT8170") && w[0].contains("stays open"),
        "{w:?}"
    );
    assert!(o.in_transaction, "the transaction is still open");
    assert_eq!(count(&n1, "t"), Some(0), "other sessions do not see it yet");
    let o = run(&mut a, "insert into t values (2, 'refused')");
    let e = o.error.expect("refused while open");
    assert!(
        e.code == "25001" && e.message.contains("COMMIT again"),
        "{e:?}"
    );
    let o = run(&mut a, "rollback");
    assert!(o
        .error
        .is_some_and(|e| e.message.contains("ROLLBACK is not possible")));
    // COMMIT again waits again: still not acknowledged.
    let o = run(&mut a, "commit");
    assert!(warned(&o)[0].contains("again"), "{o:?}");
    assert!(o.in_transaction);
    // n2 resumes and commits it; the next COMMIT ends the transaction.
    set_receiver("start");
    wait_for("n2 to commit row 1", WAIT, || {
        (count(&n2, "t") == Some(1)).then_some(())
    });
    let o = run(&mut a, "commit");
    assert!(warned(&o).is_empty() && !o.in_transaction, "{o:?}");
    assert_eq!(count(&n1, "t"), Some(1));

    // localAction 2 before COMMIT: the next timeout ends it committed here.
    set_receiver("pause");
    let o = run(&mut a, "insert into t values (3, 'here')");
    assert!(o.in_transaction, "{o:?}");
    let o = run(&mut a, "call ttRepSyncSet(NULL, NULL, 2); commit");
    let w = warned(&o);
    assert!(w[0].contains("LOCAL COMMIT ACTION COMMIT"), "{w:?}");
    assert!(!o.in_transaction);
    assert_eq!(count(&n1, "t"), Some(2), "row 3 committed here");

    // A session that goes away with a commit left open: it stands here too.
    let mut b = session();
    let o = run(&mut b, "insert into t values (4, 'gone')");
    assert!(o.in_transaction, "{o:?}");
    assert_eq!(count(&n1, "t"), Some(2));
    drop(b);
    wait_for("row 4 once its session is gone", WAIT, || {
        (count(&n1, "t") == Some(3)).then_some(())
    });
    set_receiver("start");
    wait_for("n2 to catch up", WAIT, || {
        (count(&n2, "t") == Some(3)).then_some(())
    });
    assert_eq!(keys(&n1), keys(&n2));
    assert_eq!(keys(&n1), serde_json::json!([[1], [3], [4]]));
    let r = returns(&n1);
    assert_eq!(
        r["timed_out"], 3,
        "one per commit left open, not per COMMIT: {r}"
    );
}

/// `hawser return-service` disables a subscriber's return service cluster-wide: commits
/// stop waiting for it (the stream goes on asynchronously) and status says so; enabled
/// again, commits wait for it as its subscription says.
#[test]
fn a_return_service_disabled_by_hand_is_not_waited_for_until_enabled_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut args: Vec<&str> = FAST_RAFT.to_vec();
    args.extend(MANUAL);
    let (n1, n2, _n3) = three_voters(d, &args);
    for n in [&n1, &n2] {
        sql_ok(n, "create table t (k bigint primary key, v varchar(100))");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2 RETURN TWOSAFE",
    );
    wait_for("the stream to n2", WAIT, || {
        outbound_to(&n1, "n2").filter(|o| o["state"] == "streaming")
    });
    leased(&n1);
    let r = bench(&n1);
    assert!(r["returns"]["acknowledged"].as_u64().unwrap() > 0, "{r}");
    let disabled = |n: &Node| -> Value {
        let out = n.cli(&["status", "--format", "json"]);
        let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        v["cluster"]["schemes"][0]["return_services_disabled"].clone()
    };
    assert_eq!(disabled(&n1), serde_json::json!([]));

    let out = n2.cli(&[
        "return-service",
        "--subscriber",
        "n2",
        "--state",
        "disabled",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("DISABLED in r"), "{}", stdout(&out));
    wait_for("n1 to see n2's return service disabled", WAIT, || {
        (disabled(&n1) == serde_json::json!(["n2"])).then_some(())
    });
    // Once n1's plan follows the state, nothing waits for n2: no commit is
    // acknowledged by it, and none times out either.
    wait_for("commits no longer waiting for n2", WAIT, || {
        let r = bench(&n1);
        (r["returns"]["acknowledged"] == 0 && r["returns"]["timed_out"] == 0).then_some(())
    });
    // The stream itself goes on: n2 has what n1 committed.
    let k = 1_i64 << 40;
    sql_ok(&n1, &format!("insert into t values ({k}, 'async now')"));
    wait_for("the row on n2", WAIT, || {
        (count(&n2, &format!("t where k = {k}")) == Some(1)).then_some(())
    });

    let out = n1.cli(&["return-service", "--subscriber", "n2", "--state", "enabled"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for("commits waiting for n2 again", WAIT, || {
        let r = bench(&n1);
        (r["returns"]["acknowledged"].as_u64().unwrap_or(0) > 0).then_some(())
    });
    assert_eq!(disabled(&n1), serde_json::json!([]));

    // A store that subscribes to nothing, and a state that is none, are refused.
    let out = n1.cli(&[
        "return-service",
        "--subscriber",
        "nobody",
        "--state",
        "disabled",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("subscribes to no replication scheme"),
        "{}",
        stderr(&out)
    );
    let out = n1.cli(&["return-service", "--subscriber", "n2", "--state", "maybe"]);
    assert!(!out.status.success());
}
