//! End-to-end: automatic failover between real hawser processes.
//!
//! Three voters; n2 masters `t`, n3 subscribes with RETURN TWOSAFE, n1 (the Raft
//! leader) asynchronously. Writers commit to n2 through the client library and record
//! every commit n2 acknowledged without warning 8170.
//!
//! * SIGKILL of n2: without any command, the leader promotes n3 (the TWOSAFE
//!   subscriber) under epoch 1; every acknowledged commit is on n3; n3 takes writes;
//!   status names n2 unreachable.
//! * SIGSTOP of the master for less than half a lease changes nothing.
//! * SIGSTOP of the master past its lease: it takes no writes while it is not
//!   confirmed, the cluster fails over, and after SIGCONT it refuses writes to the
//!   table it no longer masters.
//!
//! Every wait is bounded and waits on a condition.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ddl, sql_json as sql, start_member, stderr, stdout, voters, wait_for, Node};
use hawser_client::{Client, ClusterClient, RowOp};
use hawser_core::Value as V;

const WAIT: Duration = Duration::from_secs(30);

/// n1 (initialized first: the Raft leader), n2 and n3, with `t` on each and the
/// scheme: n2 masters `t`, n3 subscribes with RETURN TWOSAFE, n1 asynchronously.
fn cluster(d: &Path) -> (Node, Node, Node) {
    cluster_with(
        d,
        "CREATE REPLICATION r ELEMENT e TABLE t \
           MASTER n2 SUBSCRIBER n3 RETURN TWOSAFE SUBSCRIBER n1 \
         STORE n2 RETURN WAIT TIME 10",
    )
}

/// n1 (the Raft leader), n2 and n3 with `t` on each, and `scheme`.
fn cluster_with(d: &Path, scheme: &str) -> (Node, Node, Node) {
    cluster_args(d, scheme, &[])
}

/// [`cluster_with`], every node started with `args` too.
fn cluster_args(d: &Path, scheme: &str, args: &[&str]) -> (Node, Node, Node) {
    let n1 = start_member("n1", d, "127.0.0.1:0", None, args);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let n2 = start_member("n2", d, "127.0.0.1:0", Some(&n1.grpc), args);
    let n3 = start_member("n3", d, "127.0.0.1:0", Some(&n1.grpc), args);
    for n in [&n1, &n2, &n3] {
        wait_for("three voters", WAIT, || (voters(n) == 3).then_some(()));
        let (ok, _, err) = sql(n, "create table t (k bigint primary key, v varchar(40))");
        assert!(ok, "{err}");
    }
    ddl(&n1, scheme);
    (n1, n2, n3)
}

/// The element's master store and epoch as `node`'s status shows them.
fn master(node: &Node) -> Option<(String, u64)> {
    let s = node.try_status()?;
    let e = s["cluster"]["schemes"][0]["elements"][0].clone();
    Some((
        e["master_store"].as_str()?.to_string(),
        e["epoch"].as_u64()?,
    ))
}

/// The keys of `t` on `node`.
fn keys(node: &Node) -> Option<BTreeSet<i64>> {
    keys_of(node, "t")
}

/// The keys of `table` on `node`.
fn keys_of(node: &Node, table: &str) -> Option<BTreeSet<i64>> {
    let (ok, results, _) = sql(node, &format!("select k from {table}"));
    if !ok {
        return None;
    }
    results.first()?["rows"]
        .as_array()?
        .iter()
        .map(|r| r[0].as_i64())
        .collect()
}

/// A node's health as the Raft leader `leader` reports it.
fn health(leader: &Node, store: &str) -> Option<String> {
    let s = leader.try_status()?;
    s["cluster"]["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["store"] == store)
        .and_then(|n| n["health"].as_str().map(String::from))
}

/// Inserts into `t` on `node` until it fails; returns whether one insert of key `k`
/// was acknowledged without warnings.
fn insert(node: &Node, k: i64) -> Result<(), String> {
    let (ok, results, err) = sql(node, &format!("insert into t values ({k}, 'x')"));
    if !ok {
        return Err(err);
    }
    let warned = results
        .last()
        .and_then(|r| r["warnings"].as_array())
        .is_some_and(|w| !w.is_empty());
    if warned {
        return Err(format!("warned: {results:?}"));
    }
    Ok(())
}

/// Writers that insert distinct keys into `t` on `addr` through the client library,
/// recording every key acknowledged without a warning, until the first error.
struct Load {
    rt: tokio::runtime::Runtime,
    acked: Arc<Mutex<Vec<i64>>>,
    writers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addr: &str, writers: i64) -> Load {
        Self::start_on(addr, "t", writers)
    }

    /// Writers into `table` (keys `w * 1_000_000 + i`, `w` from 0).
    fn start_on(addr: &str, table: &str, writers: i64) -> Load {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let acked = Arc::new(Mutex::new(Vec::new()));
        let writers = (0..writers)
            .map(|w| {
                let addr = addr.to_string();
                let table = table.to_string();
                let acked = acked.clone();
                rt.spawn(async move {
                    let Ok(mut c) = Client::connect(&addr).await else {
                        return;
                    };
                    for i in 0.. {
                        let k = w * 1_000_000 + i;
                        let op = RowOp::Insert {
                            table: table.clone(),
                            row: vec![V::Int(k), V::Text(format!("w{w}"))],
                        };
                        match c.write(vec![op]).await {
                            Ok(out) if out.warnings.is_empty() => acked.lock().unwrap().push(k),
                            _ => return,
                        }
                    }
                })
            })
            .collect();
        Load { rt, acked, writers }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Waits (bounded) for every writer to stop, and returns the acknowledged keys.
    fn finish(self) -> Vec<i64> {
        let Load { rt, acked, writers } = self;
        rt.block_on(async {
            for w in writers {
                let _ = tokio::time::timeout(WAIT, w).await;
            }
        });
        let keys = acked.lock().unwrap().clone();
        rt.shutdown_timeout(Duration::from_secs(1));
        keys
    }
}

#[test]
fn a_killed_master_is_replaced_by_its_twosafe_subscriber_with_every_acknowledged_commit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, mut n2, n3) = cluster(d);
    wait_for("n2 takes writes", WAIT, || insert(&n2, -1).ok());

    // n1 gets none of the load from n2: after the failover, n3 must relay it.
    let out = n1.cli(&["receiver", "--subscriber", "n1", "--state", "pause"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let load = Load::start(&n2.grpc, 4);
    wait_for("some commits acknowledged", WAIT, || {
        (load.acked() >= 200).then_some(())
    });
    // A client of the whole cluster, which knows n2 as the master of t.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let seeds = [&n1, &n2, &n3].map(|n| n.grpc.clone());
    let mut client = rt
        .block_on(ClusterClient::connect(&seeds, Duration::from_secs(5)))
        .expect("the cluster answers");
    assert_eq!(client.master_of("t"), Some(n2.grpc.as_str()));
    n2.kill9();
    let killed = Instant::now();
    let acked = load.finish();
    assert!(acked.len() >= 200, "{}", acked.len());
    // The same write goes through once the cluster has a new master.
    let row = vec![V::Int(-4), V::Text("follows".into())];
    let out = rt.block_on(client.write(vec![RowOp::Insert {
        table: "t".into(),
        row,
    }]));
    let followed = killed.elapsed();
    let out = out.expect("the write follows the master");
    assert!(out.warnings.is_empty(), "{out:?}");
    assert_eq!(client.master_of("t"), Some(n3.grpc.as_str()));
    eprintln!("failover: SIGKILL to a write acknowledged by the new master, as the client library sees it: {followed:?}");

    // No command: the leader sees n2 silent past the failover timeout and promotes n3.
    let (store, epoch) = wait_for("a new master", WAIT, || {
        master(&n1).filter(|(s, _)| s != "n2")
    });
    assert_eq!((store.as_str(), epoch), ("n3", 1), "the TWOSAFE subscriber");
    let mut last = String::new();
    common::poll_until(WAIT, || match insert(&n3, -2) {
        Ok(()) => Some(()),
        Err(e) => {
            last = e;
            None
        }
    })
    .unwrap_or_else(|| panic!("n3 takes no writes: {last}\n{}", n3.log()));
    let took_writes = killed.elapsed();
    eprintln!("failover: SIGKILL to the first write on n3 in {took_writes:?}");

    // Every commit n2 acknowledged without a warning is on n3.
    let on_n3 = keys(&n3).expect("n3 answers");
    let lost: Vec<_> = acked.iter().filter(|k| !on_n3.contains(k)).collect();
    assert!(lost.is_empty(), "acknowledged but not on n3: {lost:?}");

    // The leader's view: n2 silent, the failover visible in the scheme.
    assert_eq!(health(&n1, "n2").as_deref(), Some("unreachable"));
    assert_eq!(health(&n1, "n3").as_deref(), Some("ok"));
    let status = n1.status();
    let ddl = status["cluster"]["schemes"][0].to_string();
    assert!(
        ddl.contains("n2=STOP"),
        "the deposed master receives nothing: {ddl}"
    );
    // n1, started again, gets what n2 committed before it died from n3, then n3's
    // own commit: the surviving copies converge.
    let out = n1.cli(&["receiver", "--subscriber", "n1", "--state", "start"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let on_n3 = keys(&n3).expect("n3 answers");
    assert!(on_n3.contains(&-2));
    wait_for("n1 equal to n3", WAIT, || {
        (keys(&n1).as_ref() == Some(&on_n3)).then_some(())
    });
}

#[test]
fn a_short_pause_of_the_master_changes_nothing_and_a_long_one_fails_it_over() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A 1 s lease and a 3 s failover timeout: a pause of under half a lease stays far
    // from the timeout even on a loaded machine.
    let (n1, n2, n3) = cluster_args(
        d,
        "CREATE REPLICATION r ELEMENT e TABLE t \
           MASTER n2 SUBSCRIBER n3 RETURN TWOSAFE SUBSCRIBER n1 \
         STORE n2 RETURN WAIT TIME 10",
        &["--master-lease", "1s", "--failover-timeout", "3s"],
    );
    wait_for("n2 takes writes", WAIT, || insert(&n2, 1).ok());

    // Under half a lease: no failover, writes go on.
    let pid = n2.pid().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    };
    let mut next = 100;
    let mut write = |node: &Node| {
        next += 1;
        insert(node, next).ok()
    };
    for _ in 0..3 {
        signal("-STOP");
        // The fault itself: the process stays stopped this long.
        std::thread::sleep(Duration::from_millis(400));
        signal("-CONT");
        wait_for("n2 takes writes after a short pause", WAIT, || write(&n2));
        assert_eq!(master(&n1), Some(("n2".into(), 0)), "no failover");
    }

    // Past the failover timeout: n3 takes over; n2, resumed, is no master any more.
    signal("-STOP");
    let (store, epoch) = wait_for("a new master", WAIT, || {
        master(&n1).filter(|(s, _)| s != "n2")
    });
    assert_eq!((store.as_str(), epoch), ("n3", 1));
    wait_for("n3 takes writes", WAIT, || insert(&n3, 3).ok());
    signal("-CONT");
    // n2 learns the new state from Raft and refuses client writes to t; until then it
    // has no lease, so it cannot take one either.
    let err = wait_for("n2 refuses writes as a subscriber", WAIT, || {
        let (ok, _, err) = sql(&n2, "insert into t values (4, 'late')");
        assert!(!ok, "n2 took a write after it was deposed");
        err.contains("25006").then_some(err)
    });
    assert!(err.contains("n3"), "{err}");
}

#[test]
fn a_master_that_is_also_the_raft_leader_fails_over_and_comes_back_deposed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut n1, n2, n3) = cluster_with(
        d,
        "CREATE REPLICATION r ELEMENT e TABLE t \
           MASTER n1 SUBSCRIBER n2 RETURN TWOSAFE SUBSCRIBER n3 \
         STORE n1 RETURN WAIT TIME 10",
    );
    wait_for("n1 takes writes", WAIT, || insert(&n1, -1).ok());
    let load = Load::start(&n1.grpc, 2);
    wait_for("some commits acknowledged", WAIT, || {
        (load.acked() >= 100).then_some(())
    });
    let n1_grpc = n1.grpc.clone();
    n1.kill9();
    let acked = load.finish();

    // A new Raft leader first, then — a full failover timeout after it took over —
    // the failover it decides.
    let (store, epoch) = wait_for("a new master", WAIT, || {
        master(&n3).filter(|(s, _)| s != "n1")
    });
    assert_eq!((store.as_str(), epoch), ("n2", 1), "the TWOSAFE subscriber");
    wait_for("n2 takes writes", WAIT, || insert(&n2, -2).ok());
    let on_n2 = keys(&n2).expect("n2 answers");
    let lost: Vec<_> = acked.iter().filter(|k| !on_n2.contains(k)).collect();
    assert!(lost.is_empty(), "acknowledged but not on n2: {lost:?}");

    // n1 restarted on its data directory learns from the cluster that it no longer
    // masters t before it takes any write to it: it never holds a lease as its master.
    drop(n1);
    let n1 = start_member("n1", d, &n1_grpc, Some(&n2.grpc), &[]);
    let err = wait_for("n1 refuses writes as a subscriber", WAIT, || {
        let (ok, _, err) = sql(&n1, "insert into t values (-3, 'late')");
        assert!(!ok, "the deposed master took a write");
        err.contains("25006").then_some(err)
    });
    assert!(err.contains("n2"), "names the master: {err}");
    assert_eq!(master(&n1), Some(("n2".into(), 1)));
    assert!(keys(&n3).is_some_and(|k| !k.contains(&-3)));
}

#[test]
fn alter_set_master_is_a_planned_switchover_that_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, n2, n3) = cluster(d);
    wait_for("n2 takes writes", WAIT, || insert(&n2, -1).ok());
    let load = Load::start(&n2.grpc, 4);
    wait_for("some commits acknowledged", WAIT, || {
        (load.acked() >= 200).then_some(())
    });
    // By hand, through a node that is neither: n2's writes stop (its lease runs out),
    // n3 gets all of n2's commits, then the role moves.
    let started = Instant::now();
    ddl(
        &n1,
        "ALTER REPLICATION r ALTER ELEMENT * IN n2 SET MASTER n3",
    );
    eprintln!("switchover: the ALTER took {:?}", started.elapsed());
    let acked = load.finish();
    assert_eq!(master(&n1), Some(("n3".into(), 1)));
    let on_n3 = keys(&n3).expect("n3 answers");
    let lost: Vec<_> = acked.iter().filter(|k| !on_n3.contains(k)).collect();
    assert!(
        lost.is_empty(),
        "acknowledged on n2 but not on n3: {lost:?}"
    );
    // n2 is a subscriber now, still receiving; n3 takes writes and they reach n2.
    let err = wait_for("n2 refuses writes as a subscriber", WAIT, || {
        let (ok, _, err) = sql(&n2, "insert into t values (-3, 'late')");
        assert!(!ok, "the old master took a write after the switchover");
        err.contains("25006").then_some(err)
    });
    assert!(err.contains("n3"), "{err}");
    wait_for("n3 takes writes", WAIT, || insert(&n3, -2).ok());
    let on_n3 = keys(&n3).expect("n3 answers");
    wait_for("n2 equal to n3", WAIT, || {
        (keys(&n2).as_ref() == Some(&on_n3)).then_some(())
    });
}

#[test]
fn hawser_switchover_moves_a_masters_elements_and_says_how_long_it_took() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, n2, n3) = cluster(d);
    wait_for("n2 takes writes", WAIT, || insert(&n2, -1).ok());
    // Checked before anything is asked for: n9 subscribes to nothing. Asked of n3, a
    // follower: Admin.Switchover goes on to the Raft leader, where health is known.
    let out = n3.cli(&["switchover", "--scheme", "r", "--to", "n9"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("does not subscribe to element e"),
        "{}",
        stderr(&out)
    );
    assert_eq!(master(&n1), Some(("n2".into(), 0)));
    let out = n1.cli(&[
        "switchover",
        "--scheme",
        "r",
        "--to",
        "n3",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).expect("JSON");
    assert_eq!(
        (v["from"].as_str(), v["to"].as_str()),
        (Some("n2"), Some("n3")),
        "{v}"
    );
    assert_eq!(
        v["elements"],
        serde_json::json!([{"element": "e", "epoch": 1}]),
        "{v}"
    );
    assert!(v["millis"].as_u64().is_some(), "{v}");
    assert_eq!(master(&n1), Some(("n3".into(), 1)));
    wait_for("n3 takes writes", WAIT, || insert(&n3, -2).ok());
}

/// `hawser bench` running in the background; SIGKILLed on drop if still running.
struct Background(std::process::Child);

impl Background {
    /// Waits (bounded) for the command to end; its exit status and output.
    fn finish(mut self, timeout: Duration) -> (bool, String, String) {
        let status = wait_for("the command to end", timeout, || {
            self.0.try_wait().expect("wait for the command")
        });
        let read = |r: Option<&mut dyn std::io::Read>| {
            let mut text = String::new();
            if let Some(r) = r {
                r.read_to_string(&mut text).expect("read the output");
            }
            text
        };
        let out = read(self.0.stdout.as_mut().map(|r| r as &mut dyn std::io::Read));
        let err = read(self.0.stderr.as_mut().map(|r| r as &mut dyn std::io::Read));
        (status.success(), out, err)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn bench_following_the_master_keeps_writing_through_a_switchover() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, n2, n3) = cluster(d);
    wait_for("n2 takes writes", WAIT, || insert(&n2, -1).ok());
    // Pointed at n1, a subscriber: it learns that n2 masters t and writes there.
    let bench = Background(
        std::process::Command::new(common::hawser_bin())
            .args([
                "bench",
                "--host",
                &n1.grpc,
                "--follow-master",
                "--table",
                "t",
                "--value-size",
                "20",
                "--clients",
                "4",
                "--warmup",
                "0s",
                "--duration",
                "8s",
                "--format",
                "json",
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run hawser bench"),
    );
    let commits = |n: &Node| n.try_status().and_then(|s| s["commits"].as_u64());
    let before = commits(&n2).unwrap_or(0);
    wait_for("bench commits on n2", WAIT, || {
        (commits(&n2)? > before + 100).then_some(())
    });
    ddl(
        &n1,
        "ALTER REPLICATION r ALTER ELEMENT * IN n2 SET MASTER n3",
    );
    let on_n3 = commits(&n3).unwrap_or(0);
    let (ok, out, err) = bench.finish(WAIT);
    assert!(ok, "bench failed: {err}\n{out}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("a JSON report");
    // The longest latency is the write pause the switchover caused, as a client saw it.
    eprintln!("bench through the switchover: {report}\n{err}");
    assert!(report["retries"].as_u64() > Some(0), "{report}");
    assert!(report["commits"].as_u64() > Some(0), "{report}");
    assert!(
        err.contains(&format!("following the master of t to {}", n3.grpc)),
        "{err}"
    );
    assert!(
        commits(&n3).unwrap_or(0) > on_n3 + 100,
        "bench wrote little on n3 after the switchover: {report}"
    );
    // Every copy ends equal.
    let on_n3 = keys(&n3).expect("n3 answers");
    for n in [&n1, &n2] {
        wait_for("copies equal to n3", WAIT, || {
            (keys(n).as_ref() == Some(&on_n3)).then_some(())
        });
    }
}

#[test]
fn a_propagators_master_fails_over_to_the_propagator_and_its_subscriber_follows() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The demo's shape: n2 masters t to n3 (TWOSAFE), which relays it to n1.
    let (n1, mut n2, n3) = cluster_with(
        d,
        "CREATE REPLICATION r \
         ELEMENT a TABLE t MASTER n2 SUBSCRIBER n3 RETURN TWOSAFE \
         ELEMENT b TABLE t PROPAGATOR n3 SUBSCRIBER n1 \
         STORE n2 RETURN WAIT TIME 10",
    );
    wait_for("n2 takes writes", WAIT, || insert(&n2, -1).ok());
    let load = Load::start(&n2.grpc, 2);
    wait_for("some commits acknowledged", WAIT, || {
        (load.acked() >= 100).then_some(())
    });
    n2.kill9();
    let acked = load.finish();
    let (store, epoch) = wait_for("a new master", WAIT, || {
        master(&n1).filter(|(s, _)| s != "n2")
    });
    assert_eq!((store.as_str(), epoch), ("n3", 1));
    // The propagator's element is folded into the master's: n1 subscribes to n3.
    let status = n1.status();
    let elements = &status["cluster"]["schemes"][0]["elements"];
    assert_eq!(elements.as_array().map(Vec::len), Some(1), "{elements}");
    wait_for("n3 takes writes", WAIT, || insert(&n3, -2).ok());
    let on_n3 = keys(&n3).expect("n3 answers");
    let lost: Vec<_> = acked.iter().filter(|k| !on_n3.contains(k)).collect();
    assert!(lost.is_empty(), "acknowledged but not on n3: {lost:?}");
    wait_for("n1 equal to n3", WAIT, || {
        (keys(&n1).as_ref() == Some(&on_n3)).then_some(())
    });
}

#[test]
fn a_deposed_master_sets_aside_what_it_alone_committed_and_receives_again() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // n2 masters t to n3 asynchronously; n1 is a voter outside the scheme.
    let (_n1, mut n2, n3) = cluster_with(
        d,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n2 SUBSCRIBER n3",
    );
    let n2_grpc = commits_alone_then_dies(&mut n2, &n3);
    let (store, epoch) = wait_for("a new master", WAIT, || {
        master(&n3).filter(|(s, _)| s != "n2")
    });
    assert_eq!((store.as_str(), epoch), ("n3", 1));
    wait_for("n3 takes writes", WAIT, || insert(&n3, 10).ok());

    // n2 comes back: its three commits past the fork point are undone and kept, and it
    // receives from n3 again, without a command.
    drop(n2);
    let n2 = start_member("n2", d, &n2_grpc, Some(&n3.grpc), &[]);
    let on_n3 = keys(&n3).expect("n3 answers");
    assert_eq!(on_n3, BTreeSet::from([1, 10]));
    rejoined_with_inserts_set_aside(&n2, &n3, &on_n3, 2..=4);
}

/// Master `n2` commits key 1, which its subscriber `n3` gets, then keys 2 to 4 with
/// n3's stream paused — only n2 has them — and is SIGKILLed; returns its address.
fn commits_alone_then_dies(n2: &mut Node, n3: &Node) -> String {
    wait_for("n2 takes writes", WAIT, || insert(n2, 1).ok());
    wait_for("n3 has the first row", WAIT, || {
        keys(n3).filter(|k| k.contains(&1)).map(|_| ())
    });
    let out = n2.cli(&["receiver", "--subscriber", "n3", "--state", "pause"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for k in 2..=4 {
        wait_for("n2 takes a write", WAIT, || insert(n2, k).ok());
    }
    let n2_grpc = n2.grpc.clone();
    n2.kill9();
    n2_grpc
}

/// `deposed` ends equal to `master` (`on_master`), with its inserts of `keys` undone
/// and kept in hawser_lost, and receives again.
fn rejoined_with_inserts_set_aside(
    deposed: &Node,
    master: &Node,
    on_master: &BTreeSet<i64>,
    keys_set_aside: std::ops::RangeInclusive<i64>,
) {
    wait_for("the deposed master equal to the new one", WAIT, || {
        (keys(deposed).as_ref() == Some(on_master)).then_some(())
    });
    let (ok, results, err) = sql(
        deposed,
        "select seq, table_name, op, row_key, undone from hawser_lost order by seq",
    );
    assert!(ok, "{err}");
    let lost = results[0]["rows"].as_array().cloned().unwrap_or_default();
    assert_eq!(lost.len(), keys_set_aside.clone().count(), "{lost:?}");
    for (row, k) in lost.iter().zip(keys_set_aside) {
        assert_eq!(row[1], "t", "{row}");
        assert_eq!(row[2], "insert", "{row}");
        assert_eq!(row[3], k.to_string(), "{row}");
        assert_eq!(row[4], true, "{row}");
    }
    // Nothing of it is flagged any more; the deposed master is a subscriber, receiving.
    let receivers = master.status()["cluster"]["schemes"][0]["receivers"].to_string();
    assert!(
        !receivers.contains(&format!("{}=", deposed.name)),
        "{receivers}"
    );
}

/// With automatic failover off, `ALTER … SET MASTER` away from a dead master is a
/// failover by hand: it records the fork point, and what the dead master alone
/// committed is set aside when it comes back, as after an automatic failover.
#[test]
fn a_switchover_from_a_dead_master_is_a_failover_by_hand_that_sets_aside_what_it_alone_had() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, mut n2, n3) = cluster_args(
        d,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n2 SUBSCRIBER n3",
        &["--auto-failover", "false"],
    );
    let n2_grpc = commits_alone_then_dies(&mut n2, &n3);
    ddl(
        &n1,
        "ALTER REPLICATION r ALTER ELEMENT * IN n2 SET MASTER n3",
    );
    assert_eq!(master(&n1), Some(("n3".into(), 1)));
    wait_for("n3 takes writes", WAIT, || insert(&n3, 10).ok());
    drop(n2);
    let n2 = start_member(
        "n2",
        d,
        &n2_grpc,
        Some(&n3.grpc),
        &["--auto-failover", "false"],
    );
    let on_n3 = keys(&n3).expect("n3 answers");
    assert_eq!(on_n3, BTreeSet::from([1, 10]));
    rejoined_with_inserts_set_aside(&n2, &n3, &on_n3, 2..=4);
}

#[test]
fn a_failover_that_cannot_happen_is_shown_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Automatic failover off on every node: a dead master is only reported.
    let manual = ["--auto-failover", "false"];
    let n1 = start_member("n1", d, "127.0.0.1:0", None, &manual);
    let out = n1.cli(&["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut n2 = start_member("n2", d, "127.0.0.1:0", Some(&n1.grpc), &manual);
    let n3 = start_member("n3", d, "127.0.0.1:0", Some(&n1.grpc), &manual);
    for n in [&n1, &n2, &n3] {
        wait_for("three voters", WAIT, || (voters(n) == 3).then_some(()));
        let (ok, _, err) = sql(n, "create table t (k bigint primary key, v varchar(40))");
        assert!(ok, "{err}");
    }
    ddl(
        &n1,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER n2 SUBSCRIBER n3",
    );
    wait_for("n2 takes writes", WAIT, || insert(&n2, 1).ok());
    n2.kill9();
    let blocked = wait_for("the blocked failover in the leader's status", WAIT, || {
        let s = n1.try_status()?;
        let b = s["cluster"]["blocked_failovers"]
            .as_array()?
            .first()?
            .as_str()?
            .to_string();
        Some(b)
    });
    assert!(blocked.contains("element e"), "{blocked}");
    assert!(blocked.contains("automatic failover is off"), "{blocked}");
    assert_eq!(master(&n1), Some(("n2".into(), 0)), "nothing moved");
    let text = stdout(&n1.cli(&["status"]));
    assert!(text.contains("failover    blocked"), "{text}");
}

#[test]
fn a_paused_cluster_keeps_its_dead_master_until_failover_is_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (n1, mut n2, n3) = cluster(d);
    wait_for("n2 takes writes", WAIT, || insert(&n2, 1).ok());
    // Paused through a node that is not the Raft leader: the pause is cluster state.
    let out = n3.cli(&["failover", "pause", "--reason", "kernel upgrade"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("PAUSED"), "{}", stdout(&out));
    let shown = n1.cli(&["failover", "show", "--format", "json"]);
    let shown: serde_json::Value = serde_json::from_str(&stdout(&shown)).expect("one JSON object");
    assert_eq!(shown["paused"], true, "{shown}");
    assert_eq!(shown["paused_reason"], "kernel upgrade", "{shown}");
    assert_eq!(shown["failover_timeout_ms"], 1000, "{shown}");

    n2.kill9();
    let blocked = wait_for("the paused failover in the leader's status", WAIT, || {
        let s = n1.try_status()?;
        s["cluster"]["blocked_failovers"][0]
            .as_str()
            .map(String::from)
    });
    assert!(
        blocked.contains("paused") && blocked.contains("kernel upgrade"),
        "{blocked}"
    );
    assert_eq!(master(&n1), Some(("n2".into(), 0)), "nothing moved");
    let text = stdout(&n1.cli(&["status"]));
    assert!(
        text.contains("failover    PAUSED for the cluster: kernel upgrade"),
        "{text}"
    );

    let out = n1.cli(&["failover", "resume"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("failover    automatic"),
        "{}",
        stdout(&out)
    );
    let (store, epoch) = wait_for("a new master once resumed", WAIT, || {
        master(&n1).filter(|(s, _)| s != "n2")
    });
    assert_eq!((store.as_str(), epoch), ("n3", 1), "the TWOSAFE subscriber");
    wait_for("n3 takes writes", WAIT, || insert(&n3, 2).ok());
    assert_eq!(keys(&n3), Some(BTreeSet::from([1, 2])));
}

#[test]
fn under_a_mixed_load_every_acknowledged_commit_survives_or_is_set_aside_never_both() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // n2 masters t (n3 RETURN TWOSAFE, n1 asynchronous) and u (both asynchronous).
    let (n1, mut n2, n3) = cluster_with(
        d,
        "CREATE REPLICATION r \
         ELEMENT e TABLE t MASTER n2 SUBSCRIBER n3 RETURN TWOSAFE SUBSCRIBER n1 \
         ELEMENT f TABLE u MASTER n2 SUBSCRIBER n3, n1 \
         STORE n2 RETURN WAIT TIME 10",
    );
    for n in [&n1, &n2, &n3] {
        let (ok, _, err) = sql(n, "create table u (k bigint primary key, v varchar(40))");
        assert!(ok, "{err}");
    }
    wait_for("n2 takes writes", WAIT, || insert(&n2, -1).ok());
    let twosafe = Load::start_on(&n2.grpc, "t", 2);
    let asynchronous = Load::start_on(&n2.grpc, "u", 2);
    wait_for("both loads acknowledged", WAIT, || {
        (twosafe.acked() >= 100 && asynchronous.acked() >= 100).then_some(())
    });
    let n2_grpc = n2.grpc.clone();
    n2.kill9();
    let acked_t = twosafe.finish();
    let acked_u = asynchronous.finish();
    let moved = |element: usize| {
        let s = n1.try_status()?;
        let e = &s["cluster"]["schemes"][0]["elements"][element];
        (e["master_store"] != "n2").then(|| e["master_store"].as_str().map(String::from))?
    };
    let master_t = wait_for("a new master of t", WAIT, || moved(0));
    let master_u = wait_for("a new master of u", WAIT, || moved(1));
    assert_eq!(master_t, "n3", "the TWOSAFE subscriber");
    let by_name = |name: &str| [&n1, &n3].into_iter().find(|n| n.name == name).unwrap();

    // TWOSAFE: every acknowledged commit is on the new master.
    let on_t = keys_of(by_name(&master_t), "t").expect("answers");
    let lost: Vec<_> = acked_t.iter().filter(|k| !on_t.contains(k)).collect();
    assert!(
        lost.is_empty(),
        "TWOSAFE-acknowledged but not on {master_t}: {lost:?}"
    );

    // n2 comes back: it sets aside what only it had, and receives again.
    drop(n2);
    let n2 = start_member("n2", d, &n2_grpc, Some(&n1.grpc), &[]);
    for table in ["t", "u"] {
        let master = by_name(if table == "t" { &master_t } else { &master_u });
        wait_for("every copy equal", WAIT, || {
            let want = keys_of(master, table)?;
            [&n1, &n2, &n3]
                .iter()
                .all(|n| keys_of(n, table).as_ref() == Some(&want))
                .then_some(())
        });
    }
    // Asynchronous: every acknowledged commit is on the new master or set aside — in
    // some node's hawser_lost — never both, never neither.
    let on_u = keys_of(by_name(&master_u), "u").expect("answers");
    let mut set_aside = BTreeSet::new();
    for n in [&n1, &n2, &n3] {
        let (ok, results, _) = sql(
            n,
            "select row_key from hawser_lost where table_name = 'u' and op = 'insert'",
        );
        if ok {
            for row in results[0]["rows"].as_array().cloned().unwrap_or_default() {
                set_aside.insert(row[0].as_str().unwrap().parse::<i64>().unwrap());
            }
        }
    }
    eprintln!(
        "mixed load: {} TWOSAFE and {} asynchronous commits acknowledged; {} of u's set aside",
        acked_t.len(),
        acked_u.len(),
        set_aside.len()
    );
    for k in &acked_u {
        let kept = on_u.contains(k);
        let aside = set_aside.contains(k);
        assert!(
            kept != aside,
            "key {k}: on {master_u} {kept}, set aside {aside}"
        );
    }
}
