//! Commits and built-in procedures through the [`ReturnServices`] hook: the session's
//! `ttRepSyncSet` settings reach the commit, BY REQUEST is reset when the transaction
//! ends, the hook's warnings reach COMMIT (and autocommitted statements), and the
//! procedures the session does not own go to the hook.

mod common;

use std::sync::{Arc, Mutex};

use common::{fails, ok, query};
use hawser_core::{NodeId, Value};
use hawser_sql::call::Call;
use hawser_sql::{
    BoxFuture, Committed, ReplicationError, ReturnServices, SqlEngine, StatementResult,
    SyncSettings, Warning,
};
use hawser_store::{Database, DbOptions, StoreError, Txn};

/// Commits for real and records the settings each commit came with; warns 8170 when
/// the transaction asked for its return service.
#[derive(Default)]
struct Recorder {
    commits: Mutex<Vec<SyncSettings>>,
    calls: Mutex<Vec<(String, Option<u64>)>>,
}

impl ReturnServices for Recorder {
    fn commit<'a>(
        &'a self,
        txn: Txn,
        sync: SyncSettings,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        Box::pin(async move {
            self.commits.lock().unwrap().push(sync);
            let info = txn.commit().await?;
            let warnings = if sync.request_return {
                vec![Warning {
                    code: "TT8170".into(),
                    message: "ds2 did not acknowledge in time".into(),
                }]
            } else {
                Vec::new()
            };
            Ok(Committed {
                info,
                warnings,
                token: sync.request_return.then_some(info.gtid.seq),
                open: None,
            })
        })
    }

    fn call<'a>(
        &'a self,
        call: &'a Call,
        token: Option<u64>,
    ) -> BoxFuture<'a, Result<StatementResult, ReplicationError>> {
        Box::pin(async move {
            self.calls.lock().unwrap().push((call.name.clone(), token));
            Ok(StatementResult::tag("CALL"))
        })
    }

    fn defaults(&self) -> (i64, i64) {
        (30, 2)
    }
}

fn engine(hook: Arc<Recorder>) -> SqlEngine {
    let db = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
    SqlEngine::new(db).with_return_services(hook)
}

#[tokio::test]
async fn sync_settings_reach_the_commit_and_request_return_ends_with_the_transaction() {
    let hook = Arc::new(Recorder::default());
    let mut s = engine(hook.clone()).session();
    ok(&mut s, "create table t (k int primary key, v int)").await;

    // Defaults come from the node until the session sets them.
    let rows = query(&mut s, "call ttRepSyncGet()").await;
    assert_eq!(
        rows,
        vec![vec![Value::Bytes(vec![0]), Value::Int(30), Value::Int(2)]]
    );

    let results = ok(
        &mut s,
        "begin; call ttRepSyncSet(0x01, 45, 1); insert into t values (1, 1); commit",
    )
    .await;
    let commit = results.last().unwrap();
    assert_eq!(commit.tag, "COMMIT");
    assert_eq!(commit.warnings[0].code, "TT8170");
    let token = query(&mut s, "call ttRepXactTokenGet()").await;
    let Value::Bytes(token) = &token[0][0] else {
        panic!("token {token:?}")
    };
    let token = u64::from_be_bytes(token.as_slice().try_into().unwrap());

    // returnWait and localAction persist; requestReturn was reset at COMMIT.
    let rows = query(&mut s, "call ttRepSyncGet()").await;
    assert_eq!(
        rows,
        vec![vec![Value::Bytes(vec![0]), Value::Int(45), Value::Int(1)]]
    );
    let results = ok(&mut s, "insert into t values (2, 2)").await;
    assert!(results[0].warnings.is_empty());
    // ROLLBACK resets it too.
    ok(
        &mut s,
        "begin; call ttRepSyncSet(0x01); rollback; insert into t values (3, 3)",
    )
    .await;

    let commits = hook.commits.lock().unwrap().clone();
    assert_eq!(commits.len(), 3, "{commits:?}");
    assert_eq!(
        commits[0],
        SyncSettings {
            request_return: true,
            return_wait_s: Some(45),
            local_action: Some(1)
        }
    );
    assert!(!commits[1].request_return);
    assert_eq!(commits[1].return_wait_s, Some(45));
    assert!(!commits[2].request_return);

    // Procedures the session does not own go to the hook with the last token.
    ok(&mut s, "call ttRepXactStatus()").await;
    let calls = hook.calls.lock().unwrap().clone();
    assert_eq!(calls, vec![("ttrepxactstatus".to_string(), Some(token))]);
}

#[tokio::test]
async fn bad_sync_calls_are_refused_and_change_nothing() {
    let hook = Arc::new(Recorder::default());
    let mut s = engine(hook).session();
    for (sql, code, needle) in [
        (
            "call ttRepSyncSet(0x01)",
            "25001",
            "inside a transaction block",
        ),
        ("call ttRepSyncSet(0x02)", "42601", "0x00 or 0x01"),
        ("call ttRepSyncSet(NULL, -5)", "42601", "-1 to wait"),
        (
            "call ttRepSyncSet(NULL, NULL, 3)",
            "42601",
            "1 (NO ACTION) or 2 (COMMIT)",
        ),
        ("call ttRepSyncSet(1, 2, 1, 4)", "42601", "at most 3"),
        ("call ttRepSyncSet('x')", "42601", "integer or NULL"),
        ("call ttRepSyncSet(1,", "42601", "expected an argument"),
        (
            "begin; call ttRepSubscriberWait(NULL, NULL, 'ds2', NULL, 1)",
            "25001",
            "outside a transaction",
        ),
    ] {
        let e = fails(&mut s, sql).await;
        assert_eq!(e.code, code, "{sql}: {e}");
        assert!(e.message.contains(needle), "{sql}: {e}");
        s.execute("rollback").await;
    }
    let rows = query(&mut s, "call ttRepSyncGet()").await;
    assert_eq!(
        rows,
        vec![vec![Value::Bytes(vec![0]), Value::Int(30), Value::Int(2)]]
    );
}

/// Leaves the first commit open, as a RETURN TWOSAFE commit that timed out under LOCAL
/// COMMIT ACTION NO ACTION is: it settles when `acknowledge` sends, and records when
/// the session dropped its wait (gave it up).
struct LeavesOpen {
    acknowledge: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    dropped: Arc<std::sync::atomic::AtomicBool>,
    action: i64,
}

struct OnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl ReturnServices for LeavesOpen {
    fn commit<'a>(
        &'a self,
        txn: Txn,
        _sync: SyncSettings,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        Box::pin(async move {
            let info = txn.commit().await?;
            // The first commit is left open, later ones are not.
            let Some(acked) = self.acknowledge.lock().unwrap().take() else {
                return Ok(Committed {
                    info,
                    warnings: Vec::new(),
                    token: None,
                    open: None,
                });
            };
            let on_drop = OnDrop(self.dropped.clone());
            Ok(Committed {
                info,
                warnings: vec![Warning {
                    code: "TT8170".into(),
                    message: "left open".into(),
                }],
                token: Some(info.gtid.seq),
                open: Some(hawser_sql::OpenCommit {
                    pending: vec!["ds2".into()],
                    settled: Box::pin(async move {
                        let _ = acked.await;
                        std::mem::forget(on_drop);
                        Vec::new()
                    }),
                }),
            })
        })
    }

    fn call<'a>(
        &'a self,
        _call: &'a Call,
        _token: Option<u64>,
    ) -> BoxFuture<'a, Result<StatementResult, ReplicationError>> {
        Box::pin(async { Ok(StatementResult::tag("CALL")) })
    }

    fn defaults(&self) -> (i64, i64) {
        (0, self.action)
    }
}

/// A session over a hook that leaves its first commit open (the node's LOCAL COMMIT
/// ACTION is `action`), with table t, and the sender that acknowledges the commit.
async fn leaves_open(
    action: i64,
) -> (
    Arc<LeavesOpen>,
    tokio::sync::oneshot::Sender<()>,
    hawser_sql::Session,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let hook = Arc::new(LeavesOpen {
        acknowledge: Mutex::new(Some(rx)),
        dropped: Arc::default(),
        action,
    });
    let db = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
    let mut s = SqlEngine::new(db)
        .with_return_services(hook.clone())
        .session();
    ok(&mut s, "create table t (k int primary key)").await;
    (hook, tx, s)
}

/// TimesTen's LOCAL COMMIT ACTION NO ACTION: after a commit times out, the application
/// may only COMMIT again — which waits again and, once the subscribers have it, ends
/// the transaction.
#[tokio::test]
async fn a_commit_left_open_takes_only_commit_until_it_settles() {
    let (hook, acknowledge, mut s) = leaves_open(1).await;
    let results = ok(&mut s, "insert into t values (1)").await;
    assert_eq!(results[0].warnings[0].code, "TT8170");
    assert!(s.left_open() && s.in_transaction());
    for sql in ["insert into t values (2)", "select * from t", "begin"] {
        let e = fails(&mut s, sql).await;
        assert_eq!(e.code, "25001", "{sql}: {e:?}");
        assert!(e.message.contains("COMMIT again"), "{e:?}");
    }
    let e = fails(&mut s, "rollback").await;
    assert!(e.message.contains("ROLLBACK is not possible"), "{e:?}");
    // The return-service procedures still run.
    ok(&mut s, "call ttRepSyncGet(); call ttRepXactTokenGet()").await;
    // Not acknowledged within the wait (0 s here): still open, and said so.
    let results = ok(&mut s, "commit").await;
    assert!(
        results[0].warnings[0].message.contains("stays open"),
        "{results:?}"
    );
    assert!(s.left_open());
    acknowledge.send(()).unwrap();
    let results = ok(&mut s, "commit").await;
    assert!(results[0].warnings.is_empty(), "{results:?}");
    assert!(!s.left_open() && !s.in_transaction());
    assert!(!hook.dropped.load(std::sync::atomic::Ordering::SeqCst));
    ok(&mut s, "insert into t values (2)").await;
}

/// With localAction 2 (COMMIT), a COMMIT that times out again ends the transaction
/// committed here: the session drops its wait.
#[tokio::test]
async fn commit_again_under_local_commit_action_commit_ends_it_committed_here() {
    let (hook, _acknowledge, mut s) = leaves_open(1).await;
    ok(&mut s, "insert into t values (1)").await;
    let results = ok(&mut s, "call ttRepSyncSet(NULL, NULL, 2); commit").await;
    let w = &results[1].warnings;
    assert!(
        w[0].code == "TT8170" && w[0].message.contains("ds2"),
        "{w:?}"
    );
    assert!(w[0].message.contains("LOCAL COMMIT ACTION COMMIT"), "{w:?}");
    assert!(!s.left_open());
    assert!(hook.dropped.load(std::sync::atomic::Ordering::SeqCst));
}

/// A session that ends with a commit left open gives the wait up: the commit stands.
#[tokio::test]
async fn a_session_ending_with_a_commit_left_open_gives_its_wait_up() {
    let (hook, _acknowledge, mut s) = leaves_open(1).await;
    ok(&mut s, "insert into t values (1)").await;
    assert!(s.left_open());
    drop(s);
    assert!(hook.dropped.load(std::sync::atomic::Ordering::SeqCst));
}
