//! End-to-end: removing a node leaves the cluster consistent. Three real nodes, n1
//! masters a table that n2 and n3 subscribe to. Removing n3 is refused while the scheme
//! names its store, saying where and what to do; a master is refused even with --force;
//! with --force the scheme drops n3 in the same step, n3 says it was removed (status
//! JSON, /readyz, its log once), refuses writes and receives nothing, while n1 keeps
//! replicating to n2. Restarted on its data, n3 stays removed and does not rejoin; on
//! an empty data directory the machine joins as a new node. Every wait is bounded and
//! waits on a condition; every node is killed when the test ends, pass or fail.

mod common;

use common::{
    ddl, http_get, sql_json, start_member, stderr, stdout, voters, wait_for, wait_leased, Node,
    CLUSTER_WAIT,
};
use serde_json::Value;

/// `select count(*) from t` on `node`, if it answers.
fn rows(node: &Node) -> Option<u64> {
    let (ok, results, _) = sql_json(node, "select count(*) from t");
    ok.then(|| results.first()?["rows"][0][0].as_u64())
        .flatten()
}

/// Inserts key `k` into t on the master, retrying while it holds no lease yet.
fn insert(master: &Node, k: i64) {
    wait_leased(master);
    let sql = format!("insert into t values ({k}, 'row {k}')");
    wait_for("an insert on the master", CLUSTER_WAIT, || {
        master
            .cli(&["sql", "-e", &sql])
            .status
            .success()
            .then_some(())
    });
}

fn scheme_text(node: &Node) -> String {
    stdout(&node.cli(&["scheme", "show", "r"]))
}

#[test]
fn a_subscribers_node_is_removed_only_with_force_and_then_takes_no_part() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n1 = start_member("n1", d, "127.0.0.1:0", None, &[]);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start_member("n2", d, "127.0.0.1:0", Some(&n1.grpc), &[]);
    let mut n3 = start_member("n3", d, "127.0.0.1:0", Some(&n1.grpc), &[]);
    for n in [&n1, &n2, &n3] {
        wait_for("three voters", CLUSTER_WAIT, || {
            (voters(n) == 3).then_some(())
        });
        let out = n.cli(&[
            "sql",
            "-e",
            "create table t (k bigint primary key, v varchar(20))",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2, n3",
    );
    insert(&n1, 1);
    for n in [&n2, &n3] {
        wait_for("row 1 on both subscribers", CLUSTER_WAIT, || {
            (rows(n) == Some(1)).then_some(())
        });
    }
    let n3_id = n3.node_id.to_string();

    // Named in the scheme: refused, saying where and what to do; nothing changed.
    let out = n1.cli(&["node", "remove", &n3_id]);
    assert!(!out.status.success());
    let err = stderr(&out);
    for part in [
        "SUBSCRIBER of element e in replication scheme r",
        "ALTER REPLICATION r ALTER ELEMENT e DROP SUBSCRIBER n3",
        "DROP REPLICATION r",
        "--force",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    assert!(scheme_text(&n1).contains("n3"), "{}", scheme_text(&n1));
    assert_eq!(n3.status()["cluster"]["removed"], Value::Null);

    // A master stays, force or not.
    let out = n2.cli(&["node", "remove", &n1.node_id.to_string(), "--force"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("not even with --force") && err.contains("move the role first"),
        "{err}"
    );

    // Forced, through a follower: the scheme drops n3 in the same step.
    let out = n2.cli(&["node", "remove", &n3_id, "--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("no longer SUBSCRIBER of element e in scheme r"),
        "{}",
        stdout(&out)
    );
    for n in [&n1, &n2] {
        wait_for("n3 out of the scheme and the members", CLUSTER_WAIT, || {
            let text = scheme_text(n);
            let s = n.try_status()?;
            let members = s["cluster"]["nodes"].as_array()?.len();
            (text.contains("SUBSCRIBER n2") && !text.contains("n3") && members == 2).then_some(())
        });
        assert_eq!(voters(n), 2);
    }

    // n3 knows it: status (JSON), /readyz, its log — once.
    let removed = wait_for("n3 reports itself removed", CLUSTER_WAIT, || {
        let s = n3.try_status()?;
        (s["cluster"]["role"] == "removed").then(|| s["cluster"]["removed"].clone())
    });
    assert!(removed["cluster_id"].as_u64().unwrap() > 0, "{removed}");
    assert!(removed["log_index"].as_u64().unwrap() > 0, "{removed}");
    assert!(removed["at_unix_ms"].as_u64().unwrap() > 0, "{removed}");
    let message = removed["message"].as_str().unwrap().to_string();
    assert!(
        message.contains(&format!(
            "was removed from cluster {}",
            removed["cluster_id"]
        )) && message.contains("empty data directory"),
        "{message}"
    );
    let text = stdout(&n3.cli(&["status"]));
    assert!(text.contains("REMOVED: this node"), "{text}");
    let (code, body) = http_get(&n3.http, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("removed from cluster"), "{body}");
    let (_, body) = http_get(&n3.http, "/status");
    let s: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["cluster"]["removed"]["message"], message.as_str());
    let warned = wait_for("n3 logs its removal", CLUSTER_WAIT, || {
        let log = n3.log();
        let lines = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("takes no part in the cluster"))
            .count();
        (lines > 0).then_some(lines)
    });
    assert_eq!(warned, 1, "said once:\n{}", n3.log());

    // It refuses writes, saying why; its own DDL too.
    let out = n3.cli(&["sql", "-e", "insert into t values (100, 'no')"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("removed from cluster"),
        "{}",
        stderr(&out)
    );
    let out = n3.cli(&["sql", "-e", "create table local (k bigint primary key)"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("removed from cluster"),
        "{}",
        stderr(&out)
    );

    // The two left keep replicating; n3 gets nothing more (its master stopped sending
    // to it when the scheme dropped it, before this insert).
    insert(&n1, 2);
    wait_for("row 2 on n2", CLUSTER_WAIT, || {
        (rows(&n2) == Some(2)).then_some(())
    });
    assert_eq!(rows(&n3), Some(1));

    // Restarted on its data (and --join), it stays removed and does not come back.
    let n3_dir = n3.data_dir.clone();
    n3.kill9();
    n3 = start_member("n3", d, "127.0.0.1:0", Some(&n1.grpc), &[]);
    let s = n3.status();
    assert_eq!(s["cluster"]["role"], "removed", "{s:#}");
    assert_eq!(s["cluster"]["removed"]["message"], message.as_str());
    let (code, _) = http_get(&n3.http, "/readyz");
    assert_eq!(code, 503);
    assert_eq!(voters(&n1), 2);
    assert!(
        !n1.status()["cluster"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["id"] == n3.node_id),
        "the removed node was let back in"
    );

    // The way back: the same machine and name on an empty data directory is a new node.
    n3.kill9();
    std::fs::remove_dir_all(&n3_dir).unwrap();
    let n3 = start_member("n3", d, "127.0.0.1:0", Some(&n1.grpc), &[]);
    assert_ne!(n3.node_id.to_string(), n3_id);
    for n in [&n1, &n2, &n3] {
        wait_for("three voters again", CLUSTER_WAIT, || {
            (voters(n) == 3).then_some(())
        });
    }
    assert_eq!(n3.status()["cluster"]["removed"], Value::Null);
    let (code, _) = http_get(&n3.http, "/readyz");
    assert_eq!(code, 200);
}
