//! End-to-end: `hawser drill` on a live three-node cluster of real processes.
//!
//! n1 (initialized first: the Raft leader at the start), n2 and n3, every one started
//! with --allow-faults; the drill's table `hawser_drill` on each, and a scheme in which
//! n2 masters it, n3 subscribes with RETURN TWOSAFE and n1 asynchronously. Every drill
//! kind runs once, one after another on the same cluster (each leaves it healthy), with
//! a short load; each must exit 0 and its JSON report carry the figures. Faults are
//! refused by a node not started with --allow-faults and by one that is not the node
//! meant.
//!
//! Every wait is bounded and waits on a condition.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{ddl, sql_json as sql, start_member, stderr, stdout, voters, wait_for, Node};
use hawser_client::Client;

const WAIT: Duration = Duration::from_secs(30);

const DRILL_TABLE: &str = "create table hawser_drill (k bigint primary key, v varchar(64))";

fn cluster(d: &Path, scheme: &str) -> (Node, Node, Node) {
    let args = ["--allow-faults"];
    let n1 = start_member("n1", d, "127.0.0.1:0", None, &args);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start_member("n2", d, "127.0.0.1:0", Some(&n1.grpc), &args);
    let n3 = start_member("n3", d, "127.0.0.1:0", Some(&n1.grpc), &args);
    for n in [&n1, &n2, &n3] {
        wait_for("three voters", WAIT, || (voters(n) == 3).then_some(()));
        let (ok, _, err) = sql(n, DRILL_TABLE);
        assert!(ok, "{err}");
    }
    ddl(&n1, scheme);
    (n1, n2, n3)
}

/// Runs `hawser drill` through `node` with a short load; its JSON report.
fn drill(node: &Node, kind: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "drill",
        kind,
        "--scheme",
        "r",
        "--down",
        "2s",
        "--warmup",
        "500ms",
        "--after",
        "1s",
        "--writers",
        "2",
        "--format",
        "json",
    ];
    args.extend(extra);
    // A drill starts from a healthy cluster: the previous one may have just ended
    // (the restarted node is healthy, its last report a moment away).
    let mut last = String::new();
    let out = wait_for("a drill that starts", WAIT, || {
        let out = node.cli(&args);
        let err = stderr(&out);
        if err.contains("a drill starts from a healthy cluster") {
            last = err;
            return None;
        }
        Some(out)
    });
    let text = stdout(&out);
    let report: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{kind}: no JSON report ({e}): {text}\nstderr: {}\n(last refusal: {last})",
            stderr(&out)
        )
    });
    assert!(
        out.status.success(),
        "{kind} broke a promise: {report:#}\nstderr: {}",
        stderr(&out)
    );
    assert_eq!(report["held"], true, "{report:#}");
    assert_eq!(report["drill"], kind);
    for field in ["lost_promised", "refused_but_committed", "two_masters"] {
        assert_eq!(report[field], 0, "{kind}: {field} in {report:#}");
    }
    assert_eq!(report["copies_equal"], true, "{report:#}");
    assert!(report["acknowledged"].as_u64().unwrap() > 0, "{report:#}");
    assert!(report["write_window_ms"].is_u64(), "{report:#}");
    assert!(report["rejoined_ms"].is_u64(), "{report:#}");
    report
}

#[test]
fn every_drill_kind_holds_its_promises_on_a_live_cluster() {
    let d = tempfile::tempdir().unwrap();
    let (n1, _n2, _n3) = cluster(
        d.path(),
        "CREATE REPLICATION r ELEMENT drill TABLE hawser_drill \
           MASTER n2 SUBSCRIBER n3 RETURN TWOSAFE SUBSCRIBER n1 \
         STORE n2 RETURN WAIT TIME 10",
    );
    // Says what it would do and does nothing.
    let out = n1.cli(&["drill", "kill-master", "--scheme", "r", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("would kill-master") && stdout(&out).contains("crash n2"),
        "{}",
        stdout(&out)
    );

    // The master crashes and comes back 2 s later: a subscriber takes over.
    let r = drill(&n1, "kill-master", &[]);
    assert_eq!(r["target"]["store"], "n2", "{r:#}");
    assert!(r["time_to_new_master_ms"].is_u64(), "{r:#}");
    assert_ne!(r["new_master"]["store"], "n2", "{r:#}");
    assert!(r["masters"].as_array().unwrap().len() >= 2, "{r:#}");
    let first_master = r["final_master"].as_str().unwrap().to_string();

    // The new master stops for 2 s, past its lease and the failover timeout: the
    // cluster fails over again, and the paused master, continued, acknowledges nothing.
    let r = drill(&n1, "pause-master", &[]);
    assert_eq!(r["target"]["store"], first_master.as_str(), "{r:#}");
    assert!(r["time_to_new_master_ms"].is_u64(), "{r:#}");

    // The master cut off from its peers while its clients still reach it: it stops
    // acknowledging within its lease, another takes over, nothing is acknowledged by both.
    let r = drill(&n1, "isolate-master", &[]);
    assert!(r["time_to_new_master_ms"].is_u64(), "{r:#}");

    // A planned switchover and back: two moves, no loss.
    let r = drill(&n1, "switchover", &[]);
    assert_eq!(r["switchover_ms"].as_array().unwrap().len(), 2, "{r:#}");
    assert_eq!(r["lost_async"], 0, "{r:#}");

    // The Raft leader crashes and comes back.
    let r = drill(&n1, "kill-leader", &[]);
    assert!(r["time_to_new_leader_ms"].is_u64(), "{r:#}");
}

#[test]
fn a_drill_on_asynchronous_subscribers_accounts_for_what_it_set_aside() {
    let d = tempfile::tempdir().unwrap();
    let (_n1, n2, _n3) = cluster(
        d.path(),
        "CREATE REPLICATION r ELEMENT drill TABLE hawser_drill \
           MASTER n2 SUBSCRIBER n3 SUBSCRIBER n1",
    );
    // Run by a node (Admin.Drill): asked of the master it strikes, which passes it on.
    let out = n2.cli(&[
        "drill",
        "kill-master",
        "--scheme",
        "r",
        "--on-node",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("would kill-master"),
        "{}",
        stdout(&out)
    );
    let out = n2.cli(&["drill", "explode", "--scheme", "r", "--on-node"]);
    assert!(!out.status.success());
    let r = drill(&n2, "kill-master", &["--on-node"]);
    assert_eq!(r["acknowledged_promised"], 0, "{r:#}");
    // Acknowledged asynchronous commits the new master lacks are not promises, but
    // each is accounted for: set aside in the old master's hawser_lost when it rejoined.
    assert_eq!(r["lost_async"], r["lost_async_set_aside"], "{r:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_is_refused_without_allow_faults_and_by_another_node() {
    let d = tempfile::tempdir().unwrap();
    let plain = Node::start("plain", &d.path().join("plain"));
    let mut c = Client::connect(&plain.grpc).await.unwrap();
    let err = c
        .fault(plain.node_id, "crash", Duration::from_secs(1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("--allow-faults"), "{err}");

    let open = Node::start_with("open", &d.path().join("open"), &["--allow-faults"]);
    let mut c = Client::connect(&open.grpc).await.unwrap();
    let err = c
        .fault(open.node_id + 1, "crash", Duration::from_secs(1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("not node"), "{err}");
    let err = c
        .fault(open.node_id, "partition", Duration::from_secs(1))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("crash, pause or isolate"), "{err}");
    // Both nodes still answer.
    assert!(plain.try_status().is_some() && open.try_status().is_some());
}
