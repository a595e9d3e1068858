//! End-to-end crash test: SIGKILL a node in the middle of a write load, restart it on the
//! same data directory and check that every acknowledged commit is there and nothing
//! that was never attempted (or half written) is.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common::Node;
use hawser_client::{Client, RowOp};
use hawser_core::Value;

const WRITERS: i64 = 8;

#[test]
fn every_acknowledged_commit_survives_sigkill_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("crash");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let attempted = Arc::new(Mutex::new(BTreeSet::new()));

    let node = Node::start("crash", &data);
    rt.block_on(async {
        let mut c = Client::connect(&node.grpc).await.unwrap();
        let out = c
            .execute("create table acked (k bigint primary key, writer int not null, payload varchar(64))")
            .await
            .unwrap();
        assert!(out.error.is_none(), "{out:?}");
    });
    let mut node = node;

    for round in 0..3i64 {
        // Writers insert keys of their own; each key is recorded as attempted before
        // it is sent and as acked once the commit returns.
        let target = 300 + round as usize * 300;
        let round_acks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (reached_tx, reached_rx) = std::sync::mpsc::channel::<()>();
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (acked, attempted, addr) =
                    (acked.clone(), attempted.clone(), node.grpc.clone());
                let (round_acks, reached) = (round_acks.clone(), reached_tx.clone());
                rt.spawn(async move {
                    let Ok(mut c) = Client::connect(&addr).await else {
                        return;
                    };
                    for i in 0.. {
                        let k = round * 1_000_000 + w * 100_000 + i;
                        attempted.lock().unwrap().insert(k);
                        let row = vec![
                            Value::Int(k),
                            Value::Int(w),
                            Value::Text(format!("round {round} key {k}")),
                        ];
                        match c
                            .write(vec![RowOp::Insert {
                                table: "acked".into(),
                                row,
                            }])
                            .await
                        {
                            Ok(_) => {
                                acked.lock().unwrap().insert(k);
                                if round_acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
                                    == target
                                {
                                    let _ = reached.send(());
                                }
                            }
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        // Kill once enough commits are acknowledged in this round (bounded wait).
        reached_rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .unwrap_or_else(|_| {
                panic!("round {round}: {target} commits not acknowledged in 120 s")
            });
        node.kill9();
        for h in handles {
            rt.block_on(h).unwrap();
        }

        node = Node::start("crash", &data);
        let rows = rt.block_on(async {
            let mut c = Client::connect(&node.grpc).await.unwrap();
            let out = c
                .execute("select k, writer, payload from acked order by k")
                .await
                .unwrap();
            assert!(out.error.is_none(), "{out:?}");
            out.results.into_iter().next().unwrap().rows
        });
        let present: BTreeSet<i64> = rows
            .iter()
            .map(|r| match (&r[0], &r[2]) {
                (Value::Int(k), Value::Text(p)) => {
                    assert!(p.ends_with(&format!("key {k}")), "torn row {r:?}");
                    *k
                }
                other => panic!("unexpected row {other:?}"),
            })
            .collect();
        let acked = acked.lock().unwrap();
        let missing: Vec<_> = acked.difference(&present).collect();
        assert!(
            missing.is_empty(),
            "round {round}: acknowledged commits lost: {missing:?}"
        );
        let attempted = attempted.lock().unwrap();
        let unknown: Vec<_> = present.difference(&attempted).collect();
        assert!(
            unknown.is_empty(),
            "round {round}: rows nobody wrote: {unknown:?}"
        );
        assert!(
            acked.len() >= target,
            "round {round}: only {} acks",
            acked.len()
        );
    }
}
