//! The sled engine: one sled tree for the whole keyspace, hawser's write-ahead log
//! ([`super::wal`]) making each batch atomic and durable, recovery from it at open, an
//! overlay of batches not yet moved into sled, and the merged iterators over both.
//!
//! * `recovery`: what opening re-applies from the redo records and the log, and the
//!   checkpoint record that bounds it.
//! * `overlay`: batches applied but not yet in sled, and their move into sled.
//! * `log_index`: the commit log's keys, kept in the write-ahead log and read back from it.
//! * `iter`: scans: sled's part with the log keys in it, merged with the overlay's.
//!
//! This module keeps the engine and its shared state, opening, the checkpoint thread and
//! the [`KvEngine`] implementation.

mod iter;
mod log_index;
mod overlay;
mod recovery;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use self::iter::Merged;
use self::log_index::{is_log_key, LogIndex};
use self::overlay::{broken_error, Overlay};
use self::recovery::{recover, set_checkpoint, Recovered};
use super::wal::{self, Wal};
use super::{range_is_empty, ByteRange, KvEngine, KvIter, WriteBatch};
use crate::error::StoreError;

/// The sled engine: one tree holds the whole keyspace; [`wal`] makes its
/// batches atomic and durable.
///
/// `apply` appends a batch's frame to the write-ahead log and puts its operations in an
/// in-memory overlay, where readers see them at once. `flush` syncs the log and then
/// moves the batches it made durable from the overlay into sled, as plain inserts, in
/// frame order. A background thread checkpoints every second: it flushes sled, records
/// the last frame sled holds durably and drops the log segments at or below it that no
/// commit log key is read from ([`LogIndex`]: those keys never go into sled). sled
/// never gets a batch before its frame is durable, and recovers a prefix of its
/// inserts, so after a crash it holds every batch up to some point and perhaps part of
/// the next — whose frame the log holds: opening re-applies the log frames after the
/// checkpoint, in order, which leaves every batch whole.
pub struct SledEngine {
    shared: Arc<Shared>,
    checkpointer: Option<std::thread::JoinHandle<()>>,
    /// Whether closing marks the log's end ([`wal::Wal::seal`]); tests that
    /// build a crash's leftovers by hand after a close turn it off.
    seal_on_close: bool,
}

/// What the engine and its checkpoint thread share.
struct Shared {
    db: sled::Db,
    /// Redo records by frame number (u64 BE), and the checkpoint under the empty key.
    redo: sled::Tree,
    wal: Wal,
    /// The last frame applied; held while a batch is applied, so frames are applied
    /// and logged in number order.
    applying: Mutex<u64>,
    /// Batches applied (visible) whose frames sled does not have yet.
    overlay: RwLock<Overlay>,
    /// Where the log keys are: in the write-ahead log, never in sled.
    log: RwLock<LogIndex>,
    /// Held while batches move from the overlay into sled, so they go in frame order.
    moving: Mutex<()>,
    /// The last frame whose inserts are all in sled.
    applied: AtomicU64,
    /// The last frame sled holds durably (log segments up to it are gone).
    checkpoint: AtomicU64,
    /// Held through a checkpoint: two at once (the thread's and a caller's) could
    /// store an older frame after a newer one and release fewer segments.
    checkpointing: Mutex<()>,
    /// Set when an insert failed halfway through a batch: sled holds part of it, so
    /// nothing more is applied until a restart re-applies its frame.
    broken: Mutex<Option<String>>,
    /// What opening cut from a damaged log when told to salvage it.
    salvaged: Option<String>,
    /// sled's first I/O error, met by a read, a scan or the checkpoint's flush: sled
    /// keeps it and fails every later operation (reads included), and what it holds
    /// durably is no longer known, so the store is failed ([`KvEngine::failure`]) and
    /// a restart recovers from the log.
    sled_failed: Mutex<Option<String>>,
    stop: Mutex<bool>,
    wake: Condvar,
    metrics: EngineMetrics,
}

/// Where a flush's and a checkpoint's time goes, for `/metrics`: the commit and flush
/// times (`crate::db`) say how long, these say whether the disk (the log's sync) or sled
/// (the move, the checkpoint's flush) took it.
struct EngineMetrics {
    log_sync: metrics::Histogram,
    moves: metrics::Histogram,
    forced_moves: metrics::Counter,
    checkpoint: metrics::Histogram,
}

impl EngineMetrics {
    fn new() -> Self {
        metrics::describe_histogram!(
            "hawser_store_log_sync_seconds",
            metrics::Unit::Seconds,
            "write-ahead log write and fdatasync, per sync that made frames durable"
        );
        metrics::describe_histogram!(
            "hawser_store_move_seconds",
            metrics::Unit::Seconds,
            "moving durable batches from the overlay into sled, per move"
        );
        metrics::describe_counter!(
            "hawser_store_forced_moves_total",
            "moves a flush made itself because more durable batches waited in the overlay than a flush leaves there"
        );
        metrics::describe_histogram!(
            "hawser_store_checkpoint_seconds",
            metrics::Unit::Seconds,
            "the checkpoint's flushes of sled (its tree, then the checkpoint record), once a second while there are writes"
        );
        Self {
            log_sync: metrics::histogram!("hawser_store_log_sync_seconds"),
            moves: metrics::histogram!("hawser_store_move_seconds"),
            forced_moves: metrics::counter!("hawser_store_forced_moves_total"),
            checkpoint: metrics::histogram!("hawser_store_checkpoint_seconds"),
        }
    }
}

/// How often the checkpoint thread flushes sled and trims the log.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Appended log bytes that wake the checkpoint thread early to write them out (when
/// nobody waits for durability, e.g. with non-durable commits).
const PENDING_WAKE_BYTES: usize = 4 << 20;
/// How long an open waits for sled's directory lock. The lock outlives the last handle
/// by a moment (sled's own I/O threads finish their writes first), and a restarted node
/// can start while its predecessor is still exiting; a store still locked after this is
/// held by another live process.
const LOCK_PATIENCE: Duration = Duration::from_secs(10);
impl SledEngine {
    /// Opens (or creates) the sled database in `dir`, with its write-ahead log in
    /// `dir/wal`, and recovers: batches the log or the redo records hold beyond sled's
    /// checkpoint are applied again, in order.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_salvaging(dir, false)
    }

    /// [`SledEngine::open`]; with `salvage`, a damaged log is cut before the damage
    /// instead of refused (see [`wal::scan`]), and [`KvEngine::salvaged`] says
    /// so.
    pub fn open_salvaging(dir: &Path, salvage: bool) -> Result<Self, StoreError> {
        let db = open_sled(dir)?;
        let redo = db
            .open_tree("hawser_redo")
            .map_err(|e| StoreError::io("open of the redo records", e))?;
        let wal_dir = dir.join("wal");
        let Recovered {
            last,
            log,
            kept,
            salvaged,
        } = recover(&db, &redo, &wal_dir, salvage)?;
        let shared = Arc::new(Shared {
            wal: Wal::open(&wal_dir, last + 1, kept)?,
            db,
            redo,
            applying: Mutex::new(last),
            overlay: RwLock::new(Overlay::default()),
            log: RwLock::new(log),
            moving: Mutex::new(()),
            applied: AtomicU64::new(last),
            checkpoint: AtomicU64::new(last),
            checkpointing: Mutex::new(()),
            broken: Mutex::new(None),
            salvaged,
            sled_failed: Mutex::new(None),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            metrics: EngineMetrics::new(),
        });
        let bg = shared.clone();
        let checkpointer = std::thread::Builder::new()
            .name("hawser-checkpoint".into())
            .spawn(move || bg.run_checkpoints())
            .map_err(|e| StoreError::io("starting the checkpoint thread", e))?;
        Ok(Self {
            shared,
            checkpointer: Some(checkpointer),
            seal_on_close: true,
        })
    }

    /// Flushes sled and trims the log (and redo records of older stores) now (also done every
    /// second in the background).
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.shared.checkpoint()
    }
}

/// Opens sled in `dir`, waiting up to [`LOCK_PATIENCE`] for its directory lock.
fn open_sled(dir: &Path) -> Result<sled::Db, StoreError> {
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    loop {
        match sled::Config::new().path(dir).flush_every_ms(None).open() {
            Ok(db) => return Ok(db),
            Err(e) if is_lock_conflict(&e) => {
                if std::time::Instant::now() >= deadline {
                    return Err(StoreError::io(
                        format!(
                            "open of {}: another process (another hawser on the same \
                             data directory?) still holds its lock after {} s",
                            dir.display(),
                            LOCK_PATIENCE.as_secs()
                        ),
                        e,
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(StoreError::io(format!("open of {}", dir.display()), e)),
        }
    }
}

/// Whether sled refused an open because its directory lock is held (sled reports it as
/// an I/O error wrapping the `WouldBlock` of the failed `flock`).
fn is_lock_conflict(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock
        || io.to_string().contains("could not acquire lock"))
}
impl Shared {
    /// A sled error met by `what`: recorded as the store's failure (see
    /// `sled_failed`), and returned.
    fn sled_error(&self, what: &'static str, e: sled::Error) -> StoreError {
        self.sled_failed
            .lock()
            .get_or_insert_with(|| format!("sled failed during {what}: {e}"));
        StoreError::io(what, e)
    }

    fn checkpoint(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.checkpointing.lock();
        // Everything written before the load is in sled; after the flush, durably.
        let frame = self.applied.load(Ordering::Acquire);
        if frame > self.checkpoint.load(Ordering::Acquire) {
            let started = Instant::now();
            self.db
                .flush()
                .map_err(|e| self.sled_error("checkpoint flush", e))?;
            set_checkpoint(&self.db, &self.redo, frame).inspect_err(|e| {
                self.sled_failed
                    .lock()
                    .get_or_insert_with(|| format!("sled failed during the checkpoint: {e}"));
            })?;
            self.metrics.checkpoint.record(started.elapsed());
            self.checkpoint.store(frame, Ordering::Release);
        }
        // Segments go once sled has their frames and no log key is read from them.
        let through = self.checkpoint.load(Ordering::Acquire);
        let through = match self.log.read().first_held() {
            Some(held) => through.min(held - 1),
            None => through,
        };
        self.wal.release_through(through)
    }

    fn run_checkpoints(&self) {
        loop {
            {
                let mut stop = self.stop.lock();
                if !*stop {
                    self.wake.wait_for(&mut stop, CHECKPOINT_EVERY);
                }
                if *stop {
                    return;
                }
            }
            // Appended frames nobody waited for still reach the disk within a tick.
            if let Err(e) = self.sync().and_then(|()| self.checkpoint()) {
                tracing::warn!(error = %e, "checkpoint failed; retrying in a second");
            }
        }
    }
}

impl Drop for SledEngine {
    fn drop(&mut self) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.checkpointer.take() {
            let _ = t.join();
        }
        // A clean close leaves nothing to recover.
        if let Err(e) = self.shared.sync().and_then(|()| self.shared.checkpoint()) {
            tracing::warn!(error = %e, "final checkpoint failed; the next open recovers");
            return;
        }
        if !self.seal_on_close {
            return;
        }
        // The mark after the last frame: damage to it is told from a torn write. It
        // changes nothing in sled, so the checkpoint covers it at once (the next open
        // has nothing to re-apply).
        let next = *self.shared.applying.lock() + 1;
        match self.shared.wal.seal(next) {
            Ok(true) => {
                if let Err(e) = set_checkpoint(&self.shared.db, &self.shared.redo, next) {
                    tracing::warn!(error = %e, "cannot checkpoint the log's end mark");
                }
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cannot mark the end of the write-ahead log"),
        }
    }
}

impl KvEngine for SledEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        // The overlay first: a key leaves it only after sled has it.
        if let Some((_, v)) = self.shared.overlay.read().keys.get(key) {
            return Ok(v.clone());
        }
        if is_log_key(key) {
            // A key leaves the overlay only after it is in the index.
            let (frame, legacy) = {
                let log = self.shared.log.read();
                (log.keys.get(key).copied(), log.legacy > 0)
            };
            if let Some(frame) = frame {
                return self.shared.log_value(frame, key);
            }
            if !legacy {
                return Ok(None);
            }
        }
        self.shared
            .db
            .get(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| self.shared.sled_error("read", e))
    }

    fn scan(&self, range: ByteRange, reverse: bool) -> KvIter {
        if range_is_empty(&range) {
            return Box::new(std::iter::empty());
        }
        // The overlay's part of the range, taken now, merged with sled's as it is read:
        // a key both hold is read from the overlay (sled has the same or an older value).
        let mut pending: Vec<(Vec<u8>, Option<Vec<u8>>)> = self
            .shared
            .overlay
            .read()
            .keys
            .range(range.clone())
            .map(|(k, (_, v))| (k.clone(), v.clone()))
            .collect();
        let disk = self.shared.disk_scan(range, reverse);
        if !reverse {
            pending.reverse();
        }
        Box::new(Merged::new(disk, pending, reverse))
    }

    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let s = &*self.shared;
        let payload = wal::encode_batch(&batch);
        let mut last = s.applying.lock();
        if let Some(reason) = s.broken.lock().clone() {
            return Err(broken_error(&reason));
        }
        let frame = *last + 1;
        s.wal.append(frame, &payload);
        {
            let mut o = s.overlay.write();
            for (k, v) in batch.ops() {
                o.keys.insert(k.clone(), (frame, v.clone()));
            }
            o.frames.push_back((frame, batch));
        }
        *last = frame;
        drop(last);
        if s.wal.pending_bytes() > PENDING_WAKE_BYTES {
            s.wake.notify_all();
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.shared.sync()
    }

    /// Syncs the log only. The overlay keeps the durable batches (readers see them
    /// there) until [`KvEngine::settle`] or a flush moves them. When more than
    /// [`UNSETTLED_FRAMES`] batches were durable *before* this sync — left unsettled
    /// across a flush — this flush moves them itself, so a caller that never settles
    /// costs a larger move now and then, not memory. The batches this sync makes durable
    /// do not count: a caller that settles after every flush (a paced receiver, which
    /// moves them one by one with pauses between) is never overtaken by an unpaced move,
    /// however many batches one flush covers.
    fn flush_unsettled(&self) -> Result<(), StoreError> {
        let s = &*self.shared;
        // Counted only past the bound: a flush usually finds few batches in the overlay.
        let left = {
            let o = s.overlay.read();
            if o.frames.len() > UNSETTLED_FRAMES {
                let durable = s.wal.synced();
                o.frames.iter().take_while(|(f, _)| *f <= durable).count()
            } else {
                0
            }
        };
        s.sync_log()?;
        if left > UNSETTLED_FRAMES {
            s.metrics.forced_moves.increment(1);
            s.move_durable()?;
        }
        Ok(())
    }

    fn write_ahead(&self) -> Result<(), StoreError> {
        self.shared.wal.write_ahead()
    }

    fn salvaged(&self) -> Option<String> {
        self.shared.salvaged.clone()
    }

    fn failure(&self) -> Option<String> {
        let s = &*self.shared;
        s.wal
            .failure()
            .or_else(|| {
                s.broken
                    .lock()
                    .as_ref()
                    .map(|r| format!("a durable batch was moved into sled only in part: {r}"))
            })
            .or_else(|| s.sled_failed.lock().clone())
    }

    fn settle(&self) -> Result<(), StoreError> {
        // Called after every waited-for commit and apply: most find that a flush or
        // another settle has moved everything already, and need no lock for it.
        let s = &*self.shared;
        if s.applied.load(Ordering::Acquire) >= s.wal.synced() {
            return Ok(());
        }
        s.move_durable()
    }

    fn settle_paced(&self, pause: &mut dyn FnMut()) -> Result<(), StoreError> {
        let s = &*self.shared;
        if s.applied.load(Ordering::Acquire) >= s.wal.synced() {
            return Ok(());
        }
        s.move_durable_paced(pause)
    }
}

/// Durable batches left unsettled across a flush beyond which
/// [`KvEngine::flush_unsettled`] moves them itself.
const UNSETTLED_FRAMES: usize = 64;

#[cfg(test)]
mod tests {
    use std::ops::Bound;

    use super::super::MemEngine;
    use super::log_index::log_key_range;
    use super::recovery::{frame_number, CHECKPOINT_KEY};
    use super::*;
    use crate::engine::LOG_PREFIX;

    fn exercise(engine: &dyn KvEngine) {
        let mut b = WriteBatch::new();
        for k in [3u8, 1, 2, 5] {
            b.put(vec![k], vec![k * 10]);
        }
        b.delete(vec![5]);
        engine.apply(b).unwrap();
        engine.flush().unwrap();
        assert_eq!(engine.get(&[2]).unwrap(), Some(vec![20]));
        assert_eq!(engine.get(&[5]).unwrap(), None);
        let keys = |r, rev| -> Vec<u8> {
            engine
                .scan(r, rev)
                .map(|kv| kv.unwrap().0[0])
                .collect::<Vec<_>>()
        };
        use Bound::*;
        assert_eq!(keys((Unbounded, Unbounded), false), vec![1, 2, 3]);
        assert_eq!(
            keys((Excluded(vec![1]), Included(vec![3])), true),
            vec![3, 2]
        );
        assert!(keys((Included(vec![3]), Excluded(vec![1])), false).is_empty());
    }

    #[test]
    fn mem_engine_applies_batches_in_order_and_scans_both_ways() {
        exercise(&MemEngine::new());
    }

    #[test]
    fn sled_engine_applies_batches_in_order_and_scans_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        exercise(&SledEngine::open(dir.path()).unwrap());
    }

    #[test]
    fn an_open_waits_for_the_lock_of_a_store_being_closed() {
        let dir = tempfile::tempdir().unwrap();
        let first = SledEngine::open(dir.path()).unwrap();
        first.apply(put(&[1], b"kept")).unwrap();
        first.flush().unwrap();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(first);
        });
        // Opened while the first handle still holds the lock: the open waits for it.
        let second = SledEngine::open(dir.path()).unwrap();
        closer.join().unwrap();
        assert_eq!(second.get(&[1]).unwrap().as_deref(), Some(&b"kept"[..]));
    }

    fn put(k: &[u8], v: &[u8]) -> WriteBatch {
        let mut b = WriteBatch::new();
        b.put(k.to_vec(), v.to_vec());
        b
    }

    #[test]
    fn batches_reach_sled_only_once_their_frames_are_durable() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = SledEngine::open(dir.path()).unwrap();
            for i in 0..50u8 {
                e.apply(put(&[b'k', i], &[i])).unwrap();
            }
            // Visible at once, but sled has none of it before the log is synced.
            assert_eq!(e.get(&[b'k', 7]).unwrap(), Some(vec![7]));
            assert_eq!(e.shared.db.get([b'k', 7]).unwrap(), None);
            assert_eq!(e.shared.overlay.read().frames.len(), 50);
            e.flush().unwrap();
            assert_eq!(
                e.shared.db.get([b'k', 7]).unwrap().as_deref(),
                Some(&[7u8][..])
            );
            let o = e.shared.overlay.read();
            assert!(o.frames.is_empty() && o.keys.is_empty());
            drop(o);
            e.checkpoint().unwrap();
            // No redo records: only the checkpoint is in their tree.
            assert_eq!(e.shared.redo.len(), 1);
            assert_eq!(e.shared.checkpoint.load(Ordering::Acquire), 50);
            e.apply(put(b"late", b"1")).unwrap();
            e.flush().unwrap();
        }
        let e = SledEngine::open(dir.path()).unwrap();
        assert_eq!(e.get(&[b'k', 49]).unwrap(), Some(vec![49]));
        assert_eq!(e.get(b"late").unwrap(), Some(b"1".to_vec()));
        // Frame numbers go on from where they were: the close's mark took 52.
        assert_eq!(*e.shared.applying.lock(), 52);
    }

    #[test]
    fn an_unsettled_flush_makes_batches_durable_and_leaves_the_move_to_settle() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = SledEngine::open(dir.path()).unwrap();
            e.apply(put(b"a", b"1")).unwrap();
            e.flush_unsettled().unwrap();
            // Durable (the log has it) and visible, but still in the overlay.
            assert!(e.shared.wal.synced() >= 1);
            assert_eq!(e.get(b"a").unwrap(), Some(b"1".to_vec()));
            assert_eq!(e.shared.db.get(b"a").unwrap(), None);
            assert_eq!(e.shared.overlay.read().frames.len(), 1);
            e.settle().unwrap();
            assert_eq!(e.shared.db.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
            assert!(e.shared.overlay.read().frames.is_empty());
            // A caller that settles after every flush: however many batches one flush
            // covers, the flush leaves the move to it.
            for i in 0..2 * UNSETTLED_FRAMES as u8 {
                e.apply(put(&[b'm', i], &[i])).unwrap();
            }
            e.flush_unsettled().unwrap();
            assert_eq!(e.shared.overlay.read().frames.len(), 2 * UNSETTLED_FRAMES);
            assert_eq!(e.shared.db.get([b'm', 0]).unwrap(), None);
            e.settle().unwrap();
            assert!(e.shared.overlay.read().frames.is_empty());
            // A caller that never settles: once more batches than the bound were left
            // durable across a flush, the flush moves them itself.
            let mut most = 0;
            for i in 0..=2 * UNSETTLED_FRAMES as u8 {
                e.apply(put(&[b'k', i], &[i])).unwrap();
                e.flush_unsettled().unwrap();
                most = most.max(e.shared.overlay.read().frames.len());
            }
            assert_eq!(most, UNSETTLED_FRAMES + 1);
            assert_eq!(
                e.shared.db.get([b'k', 3]).unwrap().as_deref(),
                Some(&[3][..])
            );
            e.apply(put(b"z", b"2")).unwrap();
            e.flush_unsettled().unwrap();
            // Closed unsettled: the close moves what is left.
        }
        let e = SledEngine::open(dir.path()).unwrap();
        assert_eq!(e.get(b"z").unwrap(), Some(b"2".to_vec()));
        assert_eq!(e.get(&[b'k', 3]).unwrap(), Some(vec![3]));
    }

    #[test]
    fn a_batch_sled_kept_only_in_part_is_completed_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = SledEngine::open(dir.path()).unwrap();
            e.apply(put(b"x", b"0")).unwrap();
            unsealed(e);
        }
        // As after a crash while frame 2 moved into sled: the log has it durably, sled
        // got its first insert and not its second.
        let mut two = put(b"x", b"2");
        two.put(b"y".to_vec(), b"2".to_vec());
        let wal = Wal::new(&dir.path().join("wal"), 2).unwrap();
        wal.append(2, &wal::encode_batch(&two));
        wal.sync().unwrap();
        drop(wal);
        {
            let db = open_sled(dir.path()).unwrap();
            db.insert(b"x", b"2").unwrap();
            db.flush().unwrap();
        }
        assert_frame_two_whole(dir.path());
    }

    /// Opens the store of the two "kept in part" tests: frame 2 (x = 2, y = 2) is whole.
    fn assert_frame_two_whole(dir: &Path) {
        let e = SledEngine::open(dir).unwrap();
        assert_eq!(e.get(b"x").unwrap(), Some(b"2".to_vec()));
        assert_eq!(e.get(b"y").unwrap(), Some(b"2".to_vec()));
        assert_eq!(*e.shared.applying.lock(), 2);
    }

    /// One step of the comparison below: a put, a delete, or a flush.
    #[derive(Debug, Clone)]
    enum Step {
        Put(u8, u8),
        Delete(u8),
        Flush,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u8..24, any::<u8>()).prop_map(|(k, v)| Step::Put(k, v)),
            2 => (0u8..24).prop_map(Step::Delete),
            1 => Just(Step::Flush),
        ]
    }

    /// Key `k` of the comparison below: eight keys before the log keys, eight log keys
    /// (kept in the write-ahead log), eight after them; 24 and 25 are bounds past all.
    fn key(k: u8) -> Vec<u8> {
        vec![LOG_PREFIX - 1 + k / 8, k % 8]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever mix of batches sled has, the overlay still holds and the log holds
        /// (log keys), reads and scans (both ways, any bounds) see what the in-memory
        /// engine sees, before and after a reopen.
        #[test]
        fn reads_merge_the_overlay_with_sled(
            batches in proptest::collection::vec(proptest::collection::vec(step(), 1..4), 1..30),
            lo in 0u8..24,
            hi in 0u8..26,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut sled = SledEngine::open(dir.path()).unwrap();
            let mem = MemEngine::new();
            for steps in &batches {
                let mut b = WriteBatch::new();
                for s in steps {
                    match s {
                        Step::Put(k, v) => b.put(key(*k), vec![*v]),
                        Step::Delete(k) => b.delete(key(*k)),
                        Step::Flush => sled.flush().unwrap(),
                    }
                }
                sled.apply(b.clone()).unwrap();
                mem.apply(b).unwrap();
            }
            for round in 0..2 {
                if round == 1 {
                    // Everything again from what the log and sled hold after a restart.
                    drop(sled);
                    sled = SledEngine::open(dir.path()).unwrap();
                }
                for k in 0u8..24 {
                    proptest::prop_assert_eq!(sled.get(&key(k)).unwrap(), mem.get(&key(k)).unwrap());
                }
                let range = || (Bound::Included(key(lo)), Bound::Excluded(key(hi)));
                for reverse in [false, true] {
                    let a: Vec<_> = sled.scan(range(), reverse).map(|r| r.unwrap()).collect();
                    let b: Vec<_> = mem.scan(range(), reverse).map(|r| r.unwrap()).collect();
                    proptest::prop_assert_eq!(a, b);
                    let a: Vec<_> = sled.scan((Bound::Unbounded, Bound::Unbounded), reverse).map(|r| r.unwrap()).collect();
                    let b: Vec<_> = mem.scan((Bound::Unbounded, Bound::Unbounded), reverse).map(|r| r.unwrap()).collect();
                    proptest::prop_assert_eq!(a, b);
                }
            }
        }
    }

    fn log_key(n: u8) -> Vec<u8> {
        vec![LOG_PREFIX, n]
    }

    fn segment_count(dir: &Path) -> usize {
        wal::segments(&dir.join("wal")).unwrap().len()
    }

    #[test]
    fn log_keys_stay_in_the_log_and_hold_its_segments_until_deleted() {
        let dir = tempfile::tempdir().unwrap();
        // Values of half a segment and more: each frame below fills a segment.
        let big = |n: u8| vec![n; (wal::SEGMENT_BYTES / 2) as usize + 1];
        {
            let e = SledEngine::open(dir.path()).unwrap();
            e.apply(put(&log_key(1), &big(1))).unwrap();
            e.flush().unwrap();
            e.apply(put(&log_key(2), &big(2))).unwrap();
            e.flush().unwrap();
            e.apply(put(b"row", &big(3))).unwrap();
            e.flush().unwrap();
            e.checkpoint().unwrap();
            // sled has the row and no log key; the log keeps the segments of both.
            assert!(e.shared.db.get(b"row").unwrap().is_some());
            assert_eq!(e.shared.db.range(log_key_range()).count(), 0);
            assert_eq!(segment_count(dir.path()), 3);
            assert_eq!(e.get(&log_key(1)).unwrap(), Some(big(1)));
            let mut gone = WriteBatch::new();
            gone.delete(log_key(1));
            e.apply(gone).unwrap();
            e.flush().unwrap();
            e.checkpoint().unwrap();
            assert_eq!(segment_count(dir.path()), 2, "key 1's segment went");
            assert_eq!(e.get(&log_key(1)).unwrap(), None);
        }
        let e = SledEngine::open(dir.path()).unwrap();
        // Reopened: key 2 read from its segment, which stays with the one after it.
        let keys: Vec<_> = e.scan(log_key_range(), false).map(|r| r.unwrap()).collect();
        assert_eq!(keys, vec![(log_key(2), big(2))]);
        assert_eq!(segment_count(dir.path()), 2);
        let mut gone = WriteBatch::new();
        gone.delete(log_key(2));
        e.apply(gone).unwrap();
        e.flush().unwrap();
        e.checkpoint().unwrap();
        // Only the segment being written is left.
        assert_eq!(segment_count(dir.path()), 1);
        assert_eq!(e.get(&log_key(2)).unwrap(), None);
        drop(e);
        let e = SledEngine::open(dir.path()).unwrap();
        assert_eq!(e.scan(log_key_range(), false).count(), 0);
        assert_eq!(e.get(b"row").unwrap(), Some(big(3)));
    }

    /// A segment before a gap in the frames is never removed at open as a released one
    /// a crash brought back (segments are removed oldest first, the directory synced
    /// after each, so no crash leaves one): the open refuses, naming it, and removes
    /// nothing.
    #[test]
    fn a_segment_before_a_gap_is_refused_not_removed() {
        let dir = tempfile::tempdir().unwrap();
        let big = |n: u8| vec![n; (wal::SEGMENT_BYTES / 2) as usize + 1];
        let first_segment;
        {
            let e = SledEngine::open(dir.path()).unwrap();
            e.apply(put(&log_key(1), &big(1))).unwrap();
            e.flush().unwrap();
            // Key 1's segment as it will stay: the next frame starts another.
            let (_, path) = wal::segments(&dir.path().join("wal")).unwrap().remove(0);
            let bytes = std::fs::read(&path).unwrap();
            first_segment = (path, bytes);
            let mut gone = WriteBatch::new();
            gone.delete(log_key(1));
            gone.put(b"row".to_vec(), big(2));
            e.apply(gone).unwrap();
            e.flush().unwrap();
            e.apply(put(&log_key(3), &big(3))).unwrap();
            e.flush().unwrap();
            e.checkpoint().unwrap();
            // Key 1's segment and the next one went; key 3's stays.
            assert_eq!(segment_count(dir.path()), 1);
        }
        // The first one put back, the second not.
        std::fs::write(&first_segment.0, &first_segment.1).unwrap();
        let err = SledEngine::open(dir.path())
            .err()
            .expect("a gap is refused");
        assert_eq!(err.code(), "XX001");
        assert!(
            err.to_string().contains("wal-00000000000000000001.log"),
            "{err}"
        );
        assert_eq!(segment_count(dir.path()), 2, "nothing removed");
        // Taken away again by hand: the store opens as it was.
        std::fs::remove_file(&first_segment.0).unwrap();
        let e = SledEngine::open(dir.path()).unwrap();
        let keys: Vec<_> = e
            .scan(log_key_range(), false)
            .map(|r| r.unwrap().0)
            .collect();
        assert_eq!(keys, vec![log_key(3)]);
        assert!(e.get(b"row").unwrap() == Some(big(2)));
    }

    /// After a clean close every frame is behind the checkpoint: a log cut short of it
    /// (the segment truncated, or its last frames zeroed) lost commit log records the
    /// store had, and is refused, naming both frames; salvaged, it opens with the
    /// frames before the cut.
    #[test]
    fn a_log_cut_short_of_the_checkpoint_is_refused() {
        for zero in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            {
                let e = SledEngine::open(dir.path()).unwrap();
                for n in 1..=5u8 {
                    e.apply(put(&log_key(n), &[n; 100])).unwrap();
                    e.flush().unwrap();
                }
            }
            let (_, path) = wal::segments(&dir.path().join("wal"))
                .unwrap()
                .pop()
                .unwrap();
            let mut bytes = std::fs::read(&path).unwrap();
            // Frames of 100-byte keys' batches: cut into the third one from the end.
            let at = bytes
                .windows(100)
                .rposition(|w| w == [3u8; 100])
                .expect("key 3's frame");
            if zero {
                bytes[at - 10..].fill(0);
            } else {
                bytes.truncate(at);
            }
            std::fs::write(&path, &bytes).unwrap();
            let err = SledEngine::open(dir.path())
                .err()
                .expect("a log cut short of the checkpoint is refused");
            assert_eq!(err.code(), "XX001");
            assert!(err.to_string().contains("checkpoint says"), "{err}");
            let e = SledEngine::open_salvaging(dir.path(), true).unwrap();
            assert!(e.salvaged().is_some());
            let keys: Vec<_> = e
                .scan(log_key_range(), false)
                .map(|r| r.unwrap().0)
                .collect();
            assert_eq!(keys, vec![log_key(1), log_key(2)], "zeroed: {zero}");
        }
    }

    #[test]
    fn log_keys_an_older_store_left_in_sled_are_read_and_deleted_there() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = SledEngine::open(dir.path()).unwrap();
            e.apply(put(b"row", b"1")).unwrap();
            unsealed(e);
        }
        {
            // As a format-2 store left them: log keys 1 and 3 in sled, and key 5 in
            // sled as well as in a log frame after the checkpoint.
            let db = open_sled(dir.path()).unwrap();
            for n in [1u8, 3, 5] {
                db.insert(log_key(n), vec![n]).unwrap();
            }
            db.flush().unwrap();
        }
        {
            let redo = open_sled(dir.path())
                .unwrap()
                .open_tree("hawser_redo")
                .unwrap();
            let at = frame_number(&redo.get(CHECKPOINT_KEY).unwrap().unwrap()).unwrap();
            let wal = Wal::new(&dir.path().join("wal"), at + 1).unwrap();
            wal.append(at + 1, &wal::encode_batch(&put(&log_key(5), &[5])));
            wal.sync().unwrap();
        }
        let e = SledEngine::open(dir.path()).unwrap();
        // Key 5 is read from the log only.
        assert_eq!(e.shared.db.get(log_key(5)).unwrap(), None);
        assert_eq!(e.shared.log.read().legacy, 2);
        e.apply(put(&log_key(4), &[4])).unwrap();
        e.flush().unwrap();
        let scan = |reverse| -> Vec<u8> {
            e.scan(log_key_range(), reverse)
                .map(|r| r.unwrap().0[1])
                .collect()
        };
        assert_eq!(scan(false), vec![1, 3, 4, 5]);
        assert_eq!(scan(true), vec![5, 4, 3, 1]);
        assert_eq!(e.get(&log_key(3)).unwrap(), Some(vec![3]));
        let mut gone = WriteBatch::new();
        gone.delete(log_key(1));
        gone.delete(log_key(4));
        e.apply(gone).unwrap();
        e.flush().unwrap();
        assert_eq!(e.shared.db.get(log_key(1)).unwrap(), None);
        assert_eq!(e.shared.log.read().legacy, 1);
        assert_eq!(scan(false), vec![3, 5]);
        assert_eq!(e.get(b"row").unwrap(), Some(b"1".to_vec()));
    }

    #[test]
    fn frames_in_the_log_that_sled_never_got_are_applied_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = SledEngine::open(dir.path()).unwrap();
            e.apply(put(b"a", b"1")).unwrap();
            e.flush().unwrap();
            unsealed(e);
        }
        // As after a crash that lost sled's last writes but not the synced log: frames
        // 2 and 3 are only in the log.
        let wal = Wal::new(&dir.path().join("wal"), 2).unwrap();
        let mut two = put(b"b", b"2");
        two.delete(b"a".to_vec());
        wal.append(2, &wal::encode_batch(&two));
        wal.append(3, &wal::encode_batch(&put(b"c", b"3")));
        wal.sync().unwrap();
        drop(wal);
        for _ in 0..2 {
            // Twice: a second open finds it all in sled and nothing to redo.
            let e = SledEngine::open(dir.path()).unwrap();
            assert_eq!(e.get(b"a").unwrap(), None);
            assert_eq!(e.get(b"b").unwrap(), Some(b"2".to_vec()));
            assert_eq!(e.get(b"c").unwrap(), Some(b"3".to_vec()));
            assert_eq!(*e.shared.applying.lock(), 3);
        }
    }

    #[test]
    fn a_batch_sled_kept_only_in_part_is_completed_from_its_redo_record() {
        let dir = tempfile::tempdir().unwrap();
        {
            let e = SledEngine::open(dir.path()).unwrap();
            e.apply(put(b"x", b"0")).unwrap();
            unsealed(e);
        }
        {
            // As after a crash in the middle of frame 2: its redo record and its first
            // insert reached sled, its second did not, and the log lost it.
            let db = open_sled(dir.path()).unwrap();
            let mut two = put(b"x", b"2");
            two.put(b"y".to_vec(), b"2".to_vec());
            db.open_tree("hawser_redo")
                .unwrap()
                .insert(2u64.to_be_bytes(), wal::encode_batch(&two))
                .unwrap();
            db.insert(b"x", b"2").unwrap();
            db.flush().unwrap();
        }
        assert_frame_two_whole(dir.path());
    }

    /// An engine whose close leaves the log as a crash after the final checkpoint
    /// would: without the mark of a clean close, for tests that add frames by hand.
    fn unsealed(mut e: SledEngine) {
        e.seal_on_close = false;
    }
}
