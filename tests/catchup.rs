//! End-to-end: a subscriber that was stopped catches up, compiling its backlog into RTL
//! net rows — or, started with `--no-compile`, applying every batch in log order. Two
//! real nodes; the subscriber is terminated, the master commits many single-row updates
//! over a few keys, the subscriber restarts on its data and address; its table must
//! equal the master's and its `/replication` JSON and `/metrics` must say how the
//! backlog was applied. Both modes get the same load, so the master's log and the
//! sender's batches are the same. Every wait is bounded and waits on a condition.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{ddl, http_get, start_member, stderr, wait_for, Node};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// Keys in t, and single-row updates committed while the subscriber is down.
const KEYS: u64 = 10;
const UPDATES: u64 = 3000;

fn start(name: &str, dir: &Path, listen: &str, extra: &[&str]) -> Node {
    start_member(name, dir, listen, None, extra)
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

fn replication(node: &Node) -> Value {
    let (code, body) = http_get(&node.http, "/replication");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("replication JSON")
}

/// The value of the Prometheus series `name{labels}` (labels as printed).
fn metric(node: &Node, series: &str) -> Option<u64> {
    let (code, body) = http_get(&node.http, "/metrics");
    assert_eq!(code, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Waits until the master's stream to the subscriber has everything acknowledged.
fn acknowledged(master: &Node) {
    let last = master.status()["last_lsn"].as_u64().expect("last_lsn");
    wait_for(
        "the subscriber to acknowledge the master's log",
        WAIT,
        || {
            let v = replication(master);
            let out = v["outbound"].as_array()?.first()?.clone();
            (out["state"] == "streaming" && out["acked_lsn"].as_u64() == Some(last)).then_some(())
        },
    );
}

/// One catch-up: returns the restarted subscriber's inbound stream status and the
/// `/metrics` rows written by mode (compiled, log).
fn catch_up(dir: &Path, subscriber_flags: &[&str]) -> (Value, (u64, u64)) {
    // Commits on the master need not wait for the disk: the load is the point, not
    // the master's durability.
    let n1 = start("n1", dir, "127.0.0.1:0", &["--durable-commits", "false"]);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Unpaced: a paced apply (a stream nobody waits on, not behind) cuts a run into
    // slices applied one by one, each writing its keys again, which is not what the
    // counts below are about; whether a run is paced depends on how the backlog
    // happened to arrive.
    let join = ["--join", n1.grpc.as_str(), "--apply-slice", "0s"];
    let flags: Vec<&str> = join.iter().chain(subscriber_flags).copied().collect();
    let mut n2 = start("n2", dir, "127.0.0.1:0", &flags);
    for n in [&n1, &n2] {
        sql(n, "create table t (k int primary key, v bigint)");
    }
    let values: Vec<String> = (0..KEYS).map(|k| format!("({k}, 0)")).collect();
    sql(&n1, &format!("insert into t values {}", values.join(", ")));
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2",
    );
    let expected = rows(&n1).expect("n1 answers");
    wait_for("n2 to have the first rows", WAIT, || {
        (rows(&n2).as_ref() == Some(&expected)).then_some(())
    });
    acknowledged(&n1);

    // The subscriber stops cleanly; the master commits one transaction per update.
    let n2_grpc = n2.grpc.clone();
    assert!(
        n2.terminate().is_some_and(|s| s.success()),
        "n2 did not stop cleanly"
    );
    drop(n2);
    let script: String = (1..=UPDATES)
        .map(|i| format!("update t set v = {i} where k = {};\n", i % KEYS))
        .collect();
    sql(&n1, &script);
    let expected = rows(&n1).expect("n1 answers");
    let last = n1.status()["last_lsn"].as_u64().expect("last_lsn");

    // Back on its data and address, the subscriber gets the backlog.
    let n2 = start("n2", dir, &n2_grpc, &flags);
    let inbound = wait_for("n2 to apply the master's whole log", WAIT, || {
        let v = replication(&n2);
        let s = v["inbound"].as_array()?.first()?.clone();
        (s["through_lsn"].as_u64() == Some(last)).then_some(s)
    });
    assert_eq!(
        rows(&n2).as_ref(),
        Some(&expected),
        "n2's table differs from n1's"
    );
    let series = |mode: &str| {
        metric(
            &n2,
            &format!("hawser_stream_rows_written_total{{sender=\"n1\",mode=\"{mode}\"}}"),
        )
        .unwrap_or(0)
    };
    (inbound, (series("compiled"), series("log")))
}

fn count(s: &Value, field: &str) -> u64 {
    s[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {s}"))
}

#[test]
fn a_stopped_subscriber_catches_up_compiled_and_with_no_compile_in_log_order() {
    let compiled_dir = tempfile::tempdir().unwrap();
    let (compiled, (metric_compiled, metric_log)) = catch_up(compiled_dir.path(), &[]);
    // Exactly the missed updates arrive, none twice; they are folded into net rows.
    assert_eq!(count(&compiled, "transactions"), UPDATES, "{compiled}");
    assert_eq!(count(&compiled, "transactions_skipped"), 0, "{compiled}");
    assert_eq!(count(&compiled, "row_changes"), UPDATES, "{compiled}");
    assert!(count(&compiled, "runs_compiled") >= 1, "{compiled}");
    let written = count(&compiled, "rows_written");
    assert!(written < UPDATES, "{compiled}");
    // A run writes each of the KEYS rows at most once.
    let runs = count(&compiled, "runs_compiled") + count(&compiled, "runs_in_order");
    assert!(written <= KEYS * runs, "{compiled}");
    assert!(count(&compiled, "rows_written_compiled") > 0, "{compiled}");
    // The Prometheus counters say the same.
    assert_eq!(metric_compiled, count(&compiled, "rows_written_compiled"));
    assert_eq!(metric_compiled + metric_log, written);

    let plain_dir = tempfile::tempdir().unwrap();
    let (plain, (metric_compiled, metric_log)) = catch_up(plain_dir.path(), &["--no-compile"]);
    assert_eq!(count(&plain, "transactions"), UPDATES, "{plain}");
    assert_eq!(count(&plain, "row_changes"), UPDATES, "{plain}");
    assert_eq!(count(&plain, "runs_compiled"), 0, "{plain}");
    assert_eq!(count(&plain, "rows_written_compiled"), 0, "{plain}");
    // Nothing gathered: one apply per batch the sender cut (at most 512 records each).
    assert_eq!(
        count(&plain, "runs_in_order"),
        count(&plain, "batches"),
        "{plain}"
    );
    assert!(count(&plain, "batches") >= UPDATES.div_ceil(512), "{plain}");
    assert_eq!(
        (metric_compiled, metric_log),
        (0, count(&plain, "rows_written"))
    );
    // The store writes each key once per apply in log order too, so rows written fall
    // short of row changes in both modes; a compiled run spans one or more of the
    // batches a log-order apply takes one at a time, so it never writes more.
    assert!(
        written <= count(&plain, "rows_written"),
        "compiled {compiled}\nlog order {plain}"
    );
}
