//! Group commit, proven with an engine whose flush can be held open: commits that
//! apply while one flush runs share the next one, and none is acknowledged before the
//! flush that covers it has finished.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::{counters, opts};
use hawser_core::{Lsn, QualName, Value};
use hawser_store::{Database, KvEngine, KvIter, MemEngine, StoreError, WriteBatch};
use parking_lot::Mutex;

/// A memory engine that counts flushes and can hold the next flush until released.
#[derive(Default)]
struct GatedEngine {
    inner: MemEngine,
    flushes: AtomicU64,
    /// Of the flushes, those that left their housekeeping for `settle`.
    unsettled: AtomicU64,
    settles: AtomicU64,
    /// The thread each flush ran on, in order.
    flush_threads: Mutex<Vec<std::thread::ThreadId>>,
    gate: Mutex<Option<(tokio::sync::oneshot::Sender<()>, mpsc::Receiver<()>)>>,
}

impl GatedEngine {
    /// Holds the next flush: `entered` fires when it starts, sending on the returned
    /// channel lets it finish.
    fn arm(&self) -> (tokio::sync::oneshot::Receiver<()>, mpsc::Sender<()>) {
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = mpsc::channel();
        *self.gate.lock() = Some((entered_tx, release_rx));
        (entered_rx, release_tx)
    }
}

impl KvEngine for GatedEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key)
    }
    fn scan(
        &self,
        range: (std::ops::Bound<Vec<u8>>, std::ops::Bound<Vec<u8>>),
        reverse: bool,
    ) -> KvIter {
        self.inner.scan(range, reverse)
    }
    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError> {
        self.inner.apply(batch)
    }
    fn flush(&self) -> Result<(), StoreError> {
        let gate = self.gate.lock().take();
        if let Some((entered, release)) = gate {
            let _ = entered.send(());
            release
                .recv_timeout(Duration::from_secs(30))
                .expect("the test releases the flush");
        }
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.flush_threads.lock().push(std::thread::current().id());
        Ok(())
    }
    fn flush_unsettled(&self) -> Result<(), StoreError> {
        self.unsettled.fetch_add(1, Ordering::SeqCst);
        self.flush()
    }
    fn settle(&self) -> Result<(), StoreError> {
        self.settles.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::task::yield_now().await;
    }
}

/// A database on a fresh [`GatedEngine`], with the `counters` table.
async fn open_gated() -> (Arc<GatedEngine>, Database) {
    let engine = Arc::new(GatedEngine::default());
    let db = Database::open(engine.clone() as Arc<dyn KvEngine>, opts()).unwrap();
    db.create_table(counters()).await.unwrap();
    (engine, db)
}

fn increment(db: &Database, key: i64) -> tokio::task::JoinHandle<hawser_store::CommitInfo> {
    let db = db.clone();
    tokio::spawn(async move {
        let t = QualName::bare("counters");
        let mut txn = db.begin();
        txn.insert(&t, vec![Value::Int(key), Value::Int(0)])
            .await
            .unwrap();
        txn.commit().await.unwrap()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commits_that_apply_during_a_flush_share_the_next_one() {
    let (engine, db) = open_gated().await;
    let base_flushes = engine.flushes.load(Ordering::SeqCst);
    let base_lsn = db.last_lsn();

    let (entered, release) = engine.arm();
    let first = increment(&db, 0);
    entered.await.unwrap();
    // The first commit's flush is running; fifteen more commit meanwhile.
    let rest: Vec<_> = (1..16).map(|k| increment(&db, k)).collect();
    wait_until("fifteen commits applied", || {
        db.last_lsn() == Lsn(base_lsn.0 + 16)
    })
    .await;
    assert!(
        !first.is_finished(),
        "acknowledged before its flush finished"
    );
    assert!(
        rest.iter().all(|h| !h.is_finished()),
        "acknowledged before any flush covered it"
    );
    assert_eq!(db.flushed_lsn(), base_lsn);

    release.send(()).unwrap();
    let info = first.await.unwrap();
    assert!(info.durable);
    for h in rest {
        assert!(h.await.unwrap().durable);
    }
    assert_eq!(
        engine.flushes.load(Ordering::SeqCst) - base_flushes,
        2,
        "sixteen commits, two flushes"
    );
    assert_eq!(db.flushed_lsn(), Lsn(base_lsn.0 + 16));
    // CREATE TABLE's flush plus the two above.
    assert_eq!(db.stats().flushes, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_durable_commits_do_not_wait_for_a_flush() {
    let engine = Arc::new(GatedEngine::default());
    let mut o = opts();
    o.durable_commits = false;
    let db = Database::open(engine.clone() as Arc<dyn KvEngine>, o).unwrap();
    db.create_table(counters()).await.unwrap();
    let base = engine.flushes.load(Ordering::SeqCst);
    let info = increment(&db, 1).await.unwrap();
    assert!(!info.durable);
    assert_eq!(engine.flushes.load(Ordering::SeqCst), base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_settles_later_leaves_the_flush_housekeeping_to_settle() {
    let (engine, db) = open_gated().await;
    // An ordinary commit's flush does everything.
    assert!(increment(&db, 1).await.unwrap().durable);
    assert_eq!(engine.unsettled.load(Ordering::SeqCst), 0);
    let t = QualName::bare("counters");
    let mut txn = db.begin();
    txn.insert(&t, vec![Value::Int(2), Value::Int(0)])
        .await
        .unwrap();
    txn.settle_later();
    let flushes = engine.flushes.load(Ordering::SeqCst);
    // Durable all the same, and visible.
    assert!(txn.commit().await.unwrap().durable);
    assert_eq!(engine.flushes.load(Ordering::SeqCst), flushes + 1);
    assert_eq!(engine.unsettled.load(Ordering::SeqCst), 1);
    assert_eq!(db.flushed_lsn(), db.last_lsn());
    assert!(db.get(&t, &[Value::Int(2)]).unwrap().is_some());
    assert_eq!(engine.settles.load(Ordering::SeqCst), 0);
    db.settle().unwrap();
    assert_eq!(engine.settles.load(Ordering::SeqCst), 1);
}

#[test]
fn a_single_threaded_node_flushes_a_lone_commit_inline_but_not_while_another_holds() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let runtime_thread = std::thread::current().id();
    rt.block_on(async {
        let (engine, db) = open_gated().await;
        let t = QualName::bare("counters");
        let last_flush_thread = || *engine.flush_threads.lock().last().unwrap();

        // Alone: the sync runs on the runtime's one thread.
        increment(&db, 1).await.unwrap();
        assert_eq!(last_flush_thread(), runtime_thread, "a lone commit's flush");

        // A commit that holds after its flush (as one waiting for a return service).
        let (release_hold, held) = tokio::sync::oneshot::channel::<()>();
        let holder = {
            let db = db.clone();
            let t = t.clone();
            tokio::spawn(async move {
                let mut txn = db.begin();
                txn.insert(&t, vec![Value::Int(2), Value::Int(0)])
                    .await
                    .unwrap();
                let committed = txn.commit_held(false).await.unwrap();
                let _ = held.await;
                drop(committed);
            })
        };
        let flushes = engine.flushes.load(Ordering::SeqCst);
        wait_until("the holder's flush", || {
            engine.flushes.load(Ordering::SeqCst) > flushes
        })
        .await;
        // Another commit meanwhile: its sync must not stall the thread the holder's
        // release (an ack) would arrive on, so it goes to the blocking pool.
        increment(&db, 3).await.unwrap();
        assert_ne!(
            last_flush_thread(),
            runtime_thread,
            "a flush while another commit holds"
        );
        assert!(!holder.is_finished());
        release_hold.send(()).unwrap();
        holder.await.unwrap();

        // Alone again: inline again.
        increment(&db, 4).await.unwrap();
        assert_eq!(last_flush_thread(), runtime_thread, "a lone commit's flush");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn commits_waiting_on_a_flush_whose_commit_was_dropped_flush_for_themselves() {
    // One worker: every flush goes to the blocking pool, so the leading commit can be
    // dropped while its sync runs (a client gone, a cancelled request).
    let (engine, db) = open_gated().await;
    let base_lsn = db.last_lsn();

    let (entered, release) = engine.arm();
    let leader = increment(&db, 0);
    entered.await.unwrap();
    let waiters: Vec<_> = (1..4).map(|k| increment(&db, k)).collect();
    wait_until("three more commits applied", || {
        db.last_lsn() == Lsn(base_lsn.0 + 4)
    })
    .await;
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());

    // The held sync is still running; the waiters must not wait on it, nor for
    // anything else to wake them: one of them leads a flush of its own.
    for h in waiters {
        let info = tokio::time::timeout(Duration::from_secs(20), h)
            .await
            .expect("a commit waiting on the dropped commit's flush was never woken")
            .unwrap();
        assert!(info.durable);
    }
    assert_eq!(db.flushed_lsn(), Lsn(base_lsn.0 + 4));
    release.send(()).unwrap();
}
