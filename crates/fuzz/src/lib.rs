//! What the fuzz targets in `fuzz_targets/` share: a SQL engine seeded with tables, run
//! on a thread with a tokio worker's stack, and a cluster state seeded with nodes and a
//! scheme, for the commands and reports a peer sends to act on.
//!
//! Each target is one `fuzz_targets/<name>.rs`; `docs/fuzzing.md` says what each feeds
//! where, what counts as a failure, and how `chaos/fuzz.sh` runs them.

use std::ops::Bound;
use std::sync::{Arc, OnceLock};

use hawser_control::{ClusterState, Command, NodeInfo};
use hawser_core::{Ident, NodeId};
use hawser_sql::{ScriptOutcome, SqlEngine};
use hawser_store::{Database, DbOptions, KvEngine, MemEngine, WriteBatch};

/// Tables of every column type, a composite key, a keyless table, a sequence and a few
/// rows, so that fuzzed DML and queries have something to hit.
pub const SQL_SEED: &str = "
create table t (k int primary key, v int, s varchar(20), d decimal(10,2), f double,
                b boolean, dt date, ts timestamp, bin varbinary(8), c char(4), n number);
create table u (a int not null, b varchar(10) not null, x bigint default 7,
                primary key (a, b));
create table w (i smallint, j tinyint, txt varchar2(30));
create sequence q start with 5 increment by 3 maxvalue 100 cycle;
insert into t values
  (1, 10, 'one', 1.50, 2.5, true, date '2024-01-31', timestamp '2024-01-31 12:00:00',
   x'00ff', 'ab', 3.25),
  (2, -3, 'two', -0.01, -1e10, false, date '1999-12-31', timestamp '1970-01-01 00:00:00',
   x'', 'xyzw', 0),
  (3, null, null, null, null, null, null, null, null, null, null);
insert into u values (1, 'a', 1), (1, 'b', 2), (2, 'a', 9223372036854775807);
insert into w values (1, 1, 'x'), (null, -128, null);
";

/// The stack of a tokio worker thread, where a node runs statements.
pub const WORKER_STACK: usize = 2 << 20;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_stack_size(WORKER_STACK)
            .enable_all()
            .build()
            .expect("build the fuzz runtime")
    })
}

/// The key-value pairs of a database seeded with [`SQL_SEED`], made once.
fn seeded_pairs() -> &'static Vec<(Vec<u8>, Vec<u8>)> {
    static PAIRS: OnceLock<Vec<(Vec<u8>, Vec<u8>)>> = OnceLock::new();
    PAIRS.get_or_init(|| {
        let engine = Arc::new(MemEngine::new());
        runtime().block_on(async {
            let db = Database::open(engine.clone(), options()).expect("open a memory db");
            let mut session = SqlEngine::new(db).session();
            let seeded = session.execute(SQL_SEED).await;
            assert!(seeded.error.is_none(), "seed failed: {:?}", seeded.error);
        });
        engine
            .scan((Bound::Unbounded, Bound::Unbounded), false)
            .collect::<Result<_, _>>()
            .expect("read the seeded engine")
    })
}

fn options() -> DbOptions {
    DbOptions::new(NodeId(1))
}

/// Runs `script` in a new session over a fresh in-memory database holding what
/// [`SQL_SEED`] made (a copy of its pairs, opened as a node reopens its store: parsing
/// the seed again for every input would take most of the time), on a tokio worker with
/// a node's stack. A panic or a stack overflow there aborts the process (libFuzzer's
/// panic hook), which is the failure the target looks for.
pub fn run_sql(script: String) -> ScriptOutcome {
    let pairs = seeded_pairs();
    let rt = runtime();
    let task = rt.spawn(async move {
        let engine = Arc::new(MemEngine::new());
        let mut batch = WriteBatch::new();
        for (k, v) in pairs {
            batch.put(k.clone(), v.clone());
        }
        engine.apply(batch).expect("copy the seeded pairs");
        let db = Database::open(engine, options()).expect("open the seeded db");
        let mut session = SqlEngine::new(db).session();
        let outcome = session.execute(&script).await;
        // Printing is part of answering a client.
        for r in &outcome.results {
            for row in &r.rows {
                for v in row {
                    let _ = v.to_string();
                }
            }
        }
        if let Some(e) = &outcome.error {
            let _ = e.to_string();
        }
        // Dropping the session rolls back whatever transaction the script left open.
        drop(session);
        outcome
    });
    rt.block_on(task).expect("the SQL task panicked")
}

/// A member of the seeded cluster.
pub fn node(id: u64, store: &str) -> NodeInfo {
    NodeInfo {
        id: NodeId(id),
        store: Ident::unquoted(store),
        host: format!("server{id}"),
        grpc_addr: format!("10.0.0.{id}:7000"),
        http_addr: format!("10.0.0.{id}:8000"),
        voter: id < 3,
    }
}

/// The scheme of the seeded cluster: one element with return receipt, one datastore
/// element, subscribers on every node.
pub const SCHEME: &str = r#"
CREATE REPLICATION r1
ELEMENT e TABLE tab
  MASTER masterds ON "server1"
  SUBSCRIBER subscriber1 ON "server2", subscriber2 ON "server3"
  RETURN RECEIPT
ELEMENT d DATASTORE
  MASTER subscriber1 ON "server2"
  SUBSCRIBER masterds ON "server1"
STORE masterds ON "server1" RETURN WAIT TIME 30;
"#;

/// Three registered nodes and scheme [`SCHEME`], as a running cluster's state machine
/// holds them.
pub fn seeded_cluster() -> ClusterState {
    let mut state = ClusterState::default();
    let mut commands: Vec<Command> = [(1, "masterds"), (2, "subscriber1"), (3, "subscriber2")]
        .into_iter()
        .map(|(id, store)| Command::RegisterNode(node(id, store)))
        .collect();
    commands.extend(Command::from_ddl(SCHEME).expect("the seed scheme parses"));
    for cmd in commands {
        let r = hawser_control::state::apply(&mut state, &cmd);
        assert!(
            matches!(r, hawser_control::Response::Applied { .. }),
            "seeding the cluster: {r:?}"
        );
    }
    state
}
