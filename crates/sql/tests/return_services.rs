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
