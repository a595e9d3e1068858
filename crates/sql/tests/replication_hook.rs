//! Replication DDL through the [`ReplicationDdl`] hook: the hook gets the statement as
//! written, its result and its errors reach the client, and the hook is not called
//! inside a transaction block.

mod common;

use std::sync::{Arc, Mutex};

use common::{fails, ok};
use hawser_core::NodeId;
use hawser_sql::{BoxFuture, ReplicationDdl, ReplicationError, SqlEngine, StatementResult};
use hawser_store::{Database, DbOptions};

/// Records what it is given; refuses statements that mention `bad`.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<String>>,
}

impl ReplicationDdl for Recorder {
    fn execute<'a>(
        &'a self,
        ddl: &'a str,
    ) -> BoxFuture<'a, Result<StatementResult, ReplicationError>> {
        Box::pin(async move {
            self.seen.lock().unwrap().push(ddl.to_string());
            if ddl.contains("bad") {
                return Err(ReplicationError {
                    code: "TT8106".into(),
                    message: "refused by the checker".into(),
                });
            }
            Ok(StatementResult::tag("CREATE REPLICATION"))
        })
    }
}

#[tokio::test]
async fn replication_ddl_goes_to_the_hook_as_written() {
    let db = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
    let hook = Arc::new(Recorder::default());
    let engine = SqlEngine::with_replication(db, hook.clone());
    let mut s = engine.session();

    let results = ok(
        &mut s,
        "select 1;\nCREATE REPLICATION r\n  ELEMENT e TABLE t MASTER a ON \"h\" SUBSCRIBER b ON \"h\";\nselect 2",
    )
    .await;
    assert_eq!(results.len(), 3);
    assert_eq!(results[1].tag, "CREATE REPLICATION");
    assert_eq!(
        hook.seen.lock().unwrap().as_slice(),
        ["CREATE REPLICATION r\n  ELEMENT e TABLE t MASTER a ON \"h\" SUBSCRIBER b ON \"h\""]
    );

    let e = fails(&mut s, "select 1; DROP REPLICATION bad; select 3").await;
    assert_eq!((e.code.as_str(), e.statement), ("TT8106", 2));
    assert!(e.message.contains("refused by the checker"), "{e}");

    // Not inside a transaction block: the hook is not called.
    let e = fails(&mut s, "begin; DROP REPLICATION r").await;
    assert_eq!(e.code, "25001");
    assert_eq!(hook.seen.lock().unwrap().len(), 2);
}
