//! End-to-end: a damaged write-ahead log is never passed over in silence. A node
//! stopped cleanly, whose last commit's frame is then damaged, refuses to start,
//! naming the file and the offset and the ways out; once the damage is undone it
//! starts with every commit. A master stopped while it streams closes its store as
//! cleanly as one that does not. Every wait is bounded.

mod common;

use std::path::{Path, PathBuf};

use std::time::Duration;

use common::{ddl, sql_json as sql, start_member, stderr, voters, wait_for, Node};

/// The newest segment of the store's write-ahead log under `data`.
fn newest_segment(data: &Path) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(data.join("db").join("wal"))
        .expect("the store's log directory")
        .map(|e| e.expect("an entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("wal-") && n.ends_with(".log"))
        })
        .collect();
    found.sort();
    found.pop().expect("a log segment")
}

/// The offsets and payload lengths of the frames at the start of `bytes` (the
/// segment format of docs/storage.md: a 24-byte header whose first word is the payload
/// length with its top bit set; a length of 0 is the sync mark past the last frame).
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 24 <= bytes.len() {
        let word = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        if word & (1 << 31) == 0 {
            break;
        }
        let len = (word & !(1 << 31)) as usize;
        if len == 0 {
            break;
        }
        out.push((at, len));
        at += 24 + len;
    }
    out
}

#[test]
fn a_damaged_last_commit_after_a_clean_stop_refuses_to_start_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("m");
    let mut node = Node::start("m", &data);
    let (ok, _, err) = sql(&node, "create table t (k int primary key, v varchar(20))");
    assert!(ok, "{err}");
    for k in 0..20 {
        let (ok, _, err) = sql(&node, &format!("insert into t values ({k}, 'row {k}')"));
        assert!(ok, "{err}");
    }
    let stopped = node.terminate().expect("the node stops on SIGTERM");
    assert!(stopped.success(), "{stopped:?}");

    // The clean stop's mark is the last frame; the one before it is the last commit.
    let segment = newest_segment(&data);
    let intact = std::fs::read(&segment).unwrap();
    let found = frames(&intact);
    assert!(found.len() >= 2, "{found:?}");
    let (at, len) = found[found.len() - 2];
    assert!(len > 8, "the last commit's frame has a payload");
    let mut damaged = intact.clone();
    for b in &mut damaged[at + 24 + len / 2..at + 24 + len / 2 + 4] {
        *b ^= 0xff;
    }
    std::fs::write(&segment, &damaged).unwrap();

    let log = Node::try_start("m", &data, &[])
        .err()
        .expect("a damaged log refuses to start");
    let name = segment.file_name().unwrap().to_str().unwrap();
    for part in [
        "XX001",
        &format!("at offset {at} of {name}"),
        "acknowledged and damaged since",
        "hawser duplicate",
    ] {
        assert!(log.contains(part), "{part:?} not in:\n{log}");
    }
    assert_eq!(
        std::fs::read(&segment).unwrap(),
        damaged,
        "nothing was changed"
    );

    // Undone: every commit is there.
    std::fs::write(&segment, &intact).unwrap();
    let mut node = Node::start("m", &data);
    let count = |node: &Node| {
        let (ok, results, err) = sql(node, "select count(*) from t");
        assert!(ok, "{err}");
        results[0]["rows"].clone()
    };
    assert_eq!(count(&node), serde_json::json!([[20]]));
    assert!(node.terminate().is_some_and(|s| s.success()));

    // Damaged again, and salvaged: the log is cut before the damage (the tables keep
    // what the clean stop checkpointed, the last row included; its commit record is
    // gone), the segment as it was is kept aside, and the log opens as it is from then
    // on.
    std::fs::write(&segment, &damaged).unwrap();
    let mut node = Node::try_start("m", &data, &["--salvage"]).expect("a salvaged start");
    assert_eq!(count(&node), serde_json::json!([[20]]));
    let (ok, results, err) = sql(&node, "select count(*) from t where k = 19");
    assert!(ok, "{err}");
    assert_eq!(results[0]["rows"], serde_json::json!([[1]]));
    assert!(node.log().contains("salvaged"), "{}", node.log());
    let aside: Vec<PathBuf> = std::fs::read_dir(data.join("db").join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("salvaged-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(aside[0].join(name)).unwrap(),
        damaged,
        "the damaged segment kept as it was"
    );
    assert!(node.terminate().is_some_and(|s| s.success()));
    let node = Node::start("m", &data);
    assert_eq!(count(&node), serde_json::json!([[20]]));
}

const WAIT: Duration = Duration::from_secs(30);

/// Two voters in `d`, n1 the Raft leader, with `t (k int primary key)` on each and n1
/// mastering it to n2.
fn pair(d: &Path) -> (Node, Node) {
    let n1 = start_member("n1", d, "127.0.0.1:0", None, &[]);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start_member("n2", d, "127.0.0.1:0", Some(&n1.grpc), &[]);
    for n in [&n1, &n2] {
        wait_for("two voters", WAIT, || (voters(n) == 2).then_some(()));
        let (ok, _, err) = sql(n, "create table t (k int primary key)");
        assert!(ok, "{err}");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n1 SUBSCRIBER n2",
    );
    (n1, n2)
}

/// Whether the last frame of the store's newest log segment under `data` is the empty
/// batch a clean close appends (an operation count of 0).
fn ends_with_the_close_mark(data: &Path) -> bool {
    let bytes = std::fs::read(newest_segment(data)).unwrap();
    frames(&bytes)
        .last()
        .is_some_and(|&(at, len)| len == 4 && bytes[at + 24..at + 28] == [0, 0, 0, 0])
}

#[test]
fn a_master_stopped_with_a_stream_running_closes_its_store_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut n1, n2) = pair(d);
    wait_for("n1 takes writes", WAIT, || {
        sql(&n1, "insert into t values (1)").0.then_some(())
    });
    wait_for("n2 has the row", WAIT, || {
        let (ok, results, _) = sql(&n2, "select count(*) from t");
        (ok && results[0]["rows"] == serde_json::json!([[1]])).then_some(())
    });
    let stopped = n1.terminate().expect("n1 stops on SIGTERM");
    assert!(stopped.success(), "{stopped:?}");
    assert!(
        ends_with_the_close_mark(&d.join("n1")),
        "n1's store was not closed: its log does not end with the mark of a clean close"
    );
}

/// After a SIGKILL under load, one byte of one frame of the newest log segment is
/// damaged — a different frame and byte each round, the last frames included. The node
/// then either refuses to start, naming the damage, or starts with every commit it
/// acknowledged: never without one, silently.
#[test]
fn after_a_sigkill_damage_anywhere_is_refused_or_loses_no_acknowledged_commit() {
    use hawser_client::{Client, RowOp};
    use hawser_core::Value;
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};

    const WRITERS: i64 = 4;
    const TARGET: usize = 150;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (mut refused, mut recovered) = (0, 0);
    // A fixed pseudo-random sequence: which frame (counted from the end) and byte.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    for round in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("k");
        let mut node = Node::start("k", &data);
        let (ok, _, err) = sql(
            &node,
            "create table t (k bigint primary key, v varchar(64))",
        );
        assert!(ok, "{err}");
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let (reached_tx, reached_rx) = std::sync::mpsc::channel::<()>();
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (acked, addr, reached) = (acked.clone(), node.grpc.clone(), reached_tx.clone());
                rt.spawn(async move {
                    let Ok(mut c) = Client::connect(&addr).await else {
                        return;
                    };
                    for i in 0.. {
                        let k = w * 1_000_000 + i;
                        let row = vec![Value::Int(k), Value::Text(format!("writer {w} key {k}"))];
                        match c
                            .write(vec![RowOp::Insert {
                                table: "t".into(),
                                row,
                            }])
                            .await
                        {
                            Ok(_) => {
                                let mut a = acked.lock().unwrap();
                                a.insert(k);
                                if a.len() == TARGET {
                                    let _ = reached.send(());
                                }
                            }
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        reached_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("commits acknowledged");
        node.kill9();
        for w in writers {
            rt.block_on(w).unwrap();
        }

        let segment = newest_segment(&data);
        let mut bytes = std::fs::read(&segment).unwrap();
        let found = frames(&bytes);
        let back = (next() as usize % found.len().min(12)) + 1;
        let (at, len) = found[found.len() - back];
        let byte = at + (next() as usize % (24 + len));
        bytes[byte] ^= 0x20;
        std::fs::write(&segment, &bytes).unwrap();

        match Node::try_start("k", &data, &[]) {
            Err(log) => {
                assert!(
                    log.contains("XX001") && log.contains("damaged write-ahead log"),
                    "round {round}: refused without naming the damage:\n{log}"
                );
                refused += 1;
            }
            Ok(node) => {
                let (ok, results, err) = sql(&node, "select k from t");
                assert!(ok, "{err}");
                let present: BTreeSet<i64> = results[0]["rows"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r[0].as_i64().unwrap())
                    .collect();
                let acked = acked.lock().unwrap();
                let lost: Vec<_> = acked.difference(&present).collect();
                assert!(
                    lost.is_empty(),
                    "round {round}: frame {back} from the end, byte {byte}: acknowledged \
                     commits lost without a word: {lost:?}"
                );
                recovered += 1;
            }
        }
    }
    eprintln!(
        "damage after SIGKILL: {refused} refused, {recovered} recovered every acknowledged commit"
    );
}

/// A master salvaged past a commit its subscriber holds never streams to that
/// subscriber again as if it were current: the subscriber is reported diverged, and a
/// commit the master makes under the seq it lost does not reach it.
#[test]
fn a_salvaged_master_reports_a_subscriber_holding_what_it_lost_as_diverged() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut n1, n2) = pair(d);
    for k in 1..=10 {
        wait_for("n1 takes a write", WAIT, || {
            sql(&n1, &format!("insert into t values ({k})"))
                .0
                .then_some(())
        });
    }
    let rows = |n: &Node| {
        let (ok, results, _) = sql(n, "select count(*) from t");
        ok.then(|| results[0]["rows"].clone())
    };
    wait_for("n2 has the ten rows", WAIT, || {
        (rows(&n2) == Some(serde_json::json!([[10]]))).then_some(())
    });
    let n1_grpc = n1.grpc.clone();
    assert!(n1.terminate().is_some_and(|s| s.success()));
    drop(n1);

    // n1's last commit is damaged, and n1 salvaged past it.
    let data = d.join("n1");
    let segment = newest_segment(&data);
    let mut bytes = std::fs::read(&segment).unwrap();
    let found = frames(&bytes);
    let (at, len) = found[found.len() - 2];
    bytes[at + 24 + len / 2] ^= 0xff;
    std::fs::write(&segment, &bytes).unwrap();
    let n1 = start_member("n1", d, &n1_grpc, None, &["--salvage"]);
    let outbound = wait_for("n1 to say n2 diverged", WAIT, || {
        let (_, body) = common::http_get(&n1.http, "/replication");
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let o = v["outbound"].as_array()?.first()?.clone();
        assert_ne!(
            (o["state"].as_str(), o["lag_records"].as_u64()),
            (Some("streaming"), Some(0)),
            "n2 reported current: {o}"
        );
        (o["state"] == "diverged").then_some(o)
    });
    assert!(
        outbound["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("rebuild"),
        "{outbound}"
    );
    // n1's next commit takes the seq it lost; the stream to n2, which holds that seq,
    // stays refused rather than have n2 skip it as a duplicate.
    wait_for("n1 takes a write", WAIT, || {
        sql(&n1, "insert into t values (11)").0.then_some(())
    });
    let (_, body) = common::http_get(&n1.http, "/replication");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["outbound"][0]["state"], "diverged", "{v}");
}
