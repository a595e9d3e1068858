//! The sled engine: one sled tree for the whole keyspace, hawser's write-ahead log
//! ([`super::wal`]) making each batch atomic and durable, recovery from it at open, an
//! overlay of batches not yet moved into sled, and the merged iterators over both.
//! One file over a thousand lines because recovery, the overlay, the checkpoint and the
//! iterators all work on the engine's one private state (`Shared`) and its invariants.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use super::wal::{self, Wal};
use super::{range_is_empty, ByteRange, KvEngine, KvIter, WriteBatch};
use crate::error::StoreError;
use crate::layout::LOG_PREFIX;

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
/// times (`db.rs`) say how long, these say whether the disk (the log's sync) or sled
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
/// The key of the checkpoint in the redo tree: sorts before every frame number.
const CHECKPOINT_KEY: &[u8] = b"";
/// How long an open waits for sled's directory lock. The lock outlives the last handle
/// by a moment (sled's own I/O threads finish their writes first), and a restarted node
/// can start while its predecessor is still exiting; a store still locked after this is
/// held by another live process.
const LOCK_PATIENCE: Duration = Duration::from_secs(10);

/// What readers see of batches sled does not have yet: the newest operation of each
/// key, and the batches themselves, oldest first, waiting to move into sled.
#[derive(Default)]
struct Overlay {
    /// Key → (the frame that last wrote it, its value; `None` = deleted).
    keys: BTreeMap<Vec<u8>, (u64, Option<Vec<u8>>)>,
    frames: std::collections::VecDeque<(u64, WriteBatch)>,
}

/// The commit log's keys ([`layout::LOG_PREFIX`]) do not go into sled: the
/// write-ahead log frame that put one already holds its value, so the engine keeps
/// the frame number and reads the value back from the log. Commit log records are
/// written once and deleted when released (`db::release_log`), so this saves a sled
/// insert per commit and keeps the log on disk once; the log segments holding a key
/// stay until it is deleted.
#[derive(Default)]
struct LogIndex {
    /// Log key → the frame whose batch last put it.
    keys: BTreeMap<Vec<u8>, u64>,
    /// Frame → how many of `keys` it holds: the segments before the first one held
    /// (and at or below the checkpoint) can go.
    frames: BTreeMap<u64, u32>,
    /// Log keys sled still holds, from a store of format 2 or older. They are read
    /// from sled and deleted there; opening removes any the log holds too.
    legacy: usize,
}

impl LogIndex {
    fn put(&mut self, key: Vec<u8>, frame: u64) {
        if let Some(old) = self.keys.insert(key, frame) {
            self.unhold(old);
        }
        *self.frames.entry(frame).or_default() += 1;
    }

    /// Removes `key`; false when it is not here.
    fn delete(&mut self, key: &[u8]) -> bool {
        match self.keys.remove(key) {
            Some(frame) => {
                self.unhold(frame);
                true
            }
            None => false,
        }
    }

    fn unhold(&mut self, frame: u64) {
        if let std::collections::btree_map::Entry::Occupied(mut e) = self.frames.entry(frame) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    /// The oldest frame a log key is read from.
    fn first_held(&self) -> Option<u64> {
        self.frames.keys().next().copied()
    }
}

/// The log keys one frame puts, with their values.
type FrameLog = BTreeMap<Vec<u8>, Vec<u8>>;

/// The value of `key` among the log keys frame `frame` puts; the index sent the
/// reader there, so a frame without it is corrupt.
fn take_log_value(values: &mut FrameLog, frame: u64, key: &[u8]) -> Result<Vec<u8>, StoreError> {
    values.remove(key).ok_or_else(|| {
        StoreError::corrupt(
            key,
            format!("log key in frame {frame}: the frame does not put it"),
        )
    })
}

/// Whether `key` is a commit log key, kept in the write-ahead log ([`LogIndex`]).
fn is_log_key(key: &[u8]) -> bool {
    key.first() == Some(&LOG_PREFIX)
}

/// The byte range of every log key.
fn log_key_range() -> ByteRange {
    (
        Bound::Included(vec![LOG_PREFIX]),
        Bound::Excluded(vec![LOG_PREFIX + 1]),
    )
}

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

/// What opening found.
struct Recovered {
    /// The last frame.
    last: u64,
    log: LogIndex,
    /// The log segments kept: they hold log keys.
    kept: Vec<wal::ScannedSegment>,
    /// What salvaging the log cut, if it did.
    salvaged: Option<String>,
}

/// Re-applies what sled may lack, checkpoints it, and indexes the log keys the log
/// segments hold; removes the segments that hold none.
fn recover(
    db: &sled::Db,
    redo: &sled::Tree,
    wal_dir: &Path,
    salvage: bool,
) -> Result<Recovered, StoreError> {
    let io = |what: &'static str| move |e: sled::Error| StoreError::io(what, e);
    let checkpoint = match redo.get(CHECKPOINT_KEY).map_err(io("recovery"))? {
        Some(v) => frame_number(&v)?,
        None => 0,
    };
    let mut last = checkpoint;
    // Redo records first: sled has each of these batches whole or in part.
    for item in redo.range(FIRST_FRAME_KEY..) {
        let (k, v) = item.map_err(io("recovery"))?;
        let frame = frame_number(&k)?;
        if frame != last + 1 {
            return Err(StoreError::corrupt(
                &k,
                format!("redo record {frame} does not follow frame {last}"),
            ));
        }
        apply_frame(db, frame, &v)?;
        last = frame;
    }
    // Log keys older stores kept in sled.
    let mut log = LogIndex {
        legacy: db.range(log_key_range()).count(),
        ..LogIndex::default()
    };
    // Then the log, from its oldest segment: the log keys of every frame, and the
    // other changes of the frames sled may not have at all.
    let in_sled = last;
    let mut replayed: Option<u64> = None;
    let mut seen: Option<u64> = None;
    let scanned = wal::scan(wal_dir, salvage, checkpoint, |frame, payload| {
        seen = Some(frame);
        let batch = wal::decode_batch(payload).map_err(|reason| {
            StoreError::corrupt(&frame.to_be_bytes(), format!("frame {frame}: {reason}"))
        })?;
        let redo = frame > in_sled;
        if redo {
            wal::check_continues(wal_dir, in_sled, replayed, frame)?;
            replayed = Some(frame);
        }
        let failed = |e| StoreError::io(format!("re-applying frame {frame}"), e);
        for (k, v) in batch.into_ops() {
            if is_log_key(&k) {
                if v.is_some() {
                    // An older store may have moved it into sled too.
                    if log.legacy > 0 && db.remove(&k).map_err(failed)?.is_some() {
                        log.legacy -= 1;
                    }
                    log.put(k, frame);
                } else if !log.delete(&k)
                    && redo
                    && log.legacy > 0
                    && db.remove(&k).map_err(failed)?.is_some()
                {
                    log.legacy -= 1;
                }
                continue;
            }
            if redo {
                match v {
                    Some(v) => db.insert(k, v).map(|_| ()),
                    None => db.remove(k).map(|_| ()),
                }
                .map_err(failed)?;
            }
        }
        Ok(())
    })?;
    // Frames a crash of the process left written but not synced are in the kernel's
    // cache, where the scan read them: they become durable before anything counts
    // on them (only the last segment can hold such frames: a roll syncs the old one).
    if let Some(segment) = scanned.segments.last() {
        std::fs::File::open(&segment.path)
            .and_then(|f| f.sync_data())
            .map_err(|e| StoreError::io(format!("syncing {}", segment.path.display()), e))?;
    }
    if let Some(l) = replayed {
        tracing::info!(
            from = checkpoint + 1,
            to = l,
            "recovered batches from the redo records and the write-ahead log"
        );
        last = l;
    } else if last > checkpoint {
        tracing::info!(
            from = checkpoint + 1,
            to = last,
            "recovered batches from the redo records"
        );
    }
    if scanned.salvaged.is_some() {
        // The log was cut before frames sled may hold: the next frame follows the last
        // one kept, so that the log goes on without a gap (what sled holds of the
        // frames cut stays; a frame written again under their numbers is re-applied
        // over it, as the checkpoint now says).
        let kept = seen.unwrap_or(0);
        if kept < last {
            tracing::warn!(
                from = kept + 1,
                to = last,
                "frames cut from the salvaged log were in sled already; the log goes on \
                 after the last frame kept"
            );
            last = kept;
        }
    }
    // Make all of it sled's; then only the segments with log keys in them stay.
    db.flush().map_err(io("recovery flush"))?;
    set_checkpoint(db, redo, last)?;
    let first_held = log.first_held().unwrap_or(u64::MAX);
    let mut kept = Vec::new();
    // Oldest first, the directory synced after each: a crash leaves the segments that
    // remain continuing one another (a gap is taken for damage at the next open).
    let remove = |path: &Path| {
        std::fs::remove_file(path)
            .map_err(|e| StoreError::io(format!("removing {}", path.display()), e))?;
        wal::sync_dir(wal_dir)
    };
    for segment in scanned.segments {
        if segment.offsets.is_empty() || segment.last() < first_held {
            remove(&segment.path)?;
        } else {
            kept.push(segment);
        }
    }
    for path in &scanned.stale {
        remove(path)?;
    }
    Ok(Recovered {
        last,
        log,
        kept,
        salvaged: scanned.salvaged,
    })
}

/// The smallest redo record key.
const FIRST_FRAME_KEY: [u8; 8] = [0; 8];

fn frame_number(bytes: &[u8]) -> Result<u64, StoreError> {
    let arr: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StoreError::corrupt(bytes, "a frame number is 8 bytes"))?;
    Ok(u64::from_be_bytes(arr))
}

fn apply_frame(db: &sled::Db, frame: u64, payload: &[u8]) -> Result<(), StoreError> {
    let batch = wal::decode_batch(payload).map_err(|reason| {
        StoreError::corrupt(&frame.to_be_bytes(), format!("frame {frame}: {reason}"))
    })?;
    for (k, v) in batch.into_ops() {
        match v {
            Some(v) => db.insert(k, v).map(|_| ()),
            None => db.remove(k).map(|_| ()),
        }
        .map_err(|e| StoreError::io(format!("re-applying frame {frame}"), e))?;
    }
    Ok(())
}

/// Records `frame` as sled's checkpoint and drops the redo records up to it, durably:
/// only then may log segments up to it go (a replayed frame has no redo record).
fn set_checkpoint(db: &sled::Db, redo: &sled::Tree, frame: u64) -> Result<(), StoreError> {
    let mut b = sled::Batch::default();
    b.insert(CHECKPOINT_KEY, &frame.to_be_bytes());
    for k in redo.range(FIRST_FRAME_KEY..=frame.to_be_bytes()).keys() {
        b.remove(k.map_err(|e| StoreError::io("checkpoint", e))?);
    }
    redo.apply_batch(b)
        .map_err(|e| StoreError::io("checkpoint", e))?;
    db.flush()
        .map(|_| ())
        .map_err(|e| StoreError::io("checkpoint flush", e))
}

impl Shared {
    /// Syncs the log and moves the batches it made durable into sled.
    fn sync(&self) -> Result<(), StoreError> {
        self.sync_log()?;
        self.move_durable()
    }

    fn move_durable(&self) -> Result<(), StoreError> {
        self.move_durable_paced(&mut || {})
    }

    /// Syncs the log, timing the syncs that made frames durable.
    fn sync_log(&self) -> Result<(), StoreError> {
        let (before, started) = (self.wal.synced(), Instant::now());
        self.wal.sync()?;
        if self.wal.synced() > before {
            self.metrics.log_sync.record(started.elapsed());
        }
        Ok(())
    }

    /// Moves the batches whose frames are durable from the overlay into sled, oldest
    /// first; their keys leave the overlay once sled has them all (readers look in the
    /// overlay first, so they never miss one), unless a later batch wrote them again.
    fn move_durable_paced(&self, pause: &mut dyn FnMut()) -> Result<(), StoreError> {
        let _moving = self.moving.lock();
        if let Some(reason) = self.broken.lock().clone() {
            return Err(broken_error(&reason));
        }
        let durable = self.wal.synced();
        let moving: Vec<(u64, WriteBatch)> = {
            let mut o = self.overlay.write();
            let n = o.frames.iter().take_while(|(f, _)| *f <= durable).count();
            o.frames.drain(..n).collect()
        };
        let Some(&(last, _)) = moving.last() else {
            return Ok(());
        };
        let started = Instant::now();
        let broken = |e: sled::Error| {
            // The batches stay visible in the overlay; their frames are durable, so a
            // restart completes them.
            *self.broken.lock() = Some(e.to_string());
            StoreError::io("batch write", e)
        };
        for (_, batch) in &moving {
            pause();
            for (k, v) in batch.ops() {
                if is_log_key(k) {
                    continue;
                }
                match v {
                    Some(v) => self.db.insert(k.as_slice(), v.as_slice()).map(|_| ()),
                    None => self.db.remove(k.as_slice()).map(|_| ()),
                }
                .map_err(broken)?;
            }
        }
        // Log keys: readable from their (durable) frames from now on.
        let mut legacy_deletes = Vec::new();
        {
            let mut log = self.log.write();
            for (frame, batch) in &moving {
                for (k, v) in batch.ops() {
                    if !is_log_key(k) {
                        continue;
                    }
                    if v.is_some() {
                        log.put(k.clone(), *frame);
                    } else if !log.delete(k) && log.legacy > 0 {
                        legacy_deletes.push(k.as_slice());
                    }
                }
            }
        }
        for k in legacy_deletes {
            if self.db.remove(k).map_err(broken)?.is_some() {
                let mut log = self.log.write();
                log.legacy = log.legacy.saturating_sub(1);
            }
        }
        let mut o = self.overlay.write();
        for (frame, batch) in &moving {
            for (k, _) in batch.ops() {
                if o.keys.get(k).is_some_and(|(f, _)| f == frame) {
                    o.keys.remove(k);
                }
            }
        }
        drop(o);
        self.applied.store(last, Ordering::Release);
        self.metrics.moves.record(started.elapsed());
        Ok(())
    }

    /// The value log key `key` has in frame `frame`; `None` when the frame's segment
    /// was released meanwhile (the key was deleted).
    fn log_value(&self, frame: u64, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(mut values) = self.log_values(frame)? else {
            return Ok(None);
        };
        take_log_value(&mut values, frame, key).map(Some)
    }

    /// The log keys frame `frame` puts, with their values; `None` when the frame's
    /// segment was released meanwhile.
    fn log_values(&self, frame: u64) -> Result<Option<FrameLog>, StoreError> {
        let Some(payload) = self.wal.read_frame(frame)? else {
            return Ok(None);
        };
        let batch = wal::decode_batch(&payload).map_err(|reason| {
            StoreError::corrupt(&frame.to_be_bytes(), format!("frame {frame}: {reason}"))
        })?;
        let mut values = FrameLog::new();
        for (k, v) in batch.into_ops() {
            if is_log_key(&k) {
                match v {
                    Some(v) => values.insert(k, v),
                    None => values.remove(&k),
                };
            }
        }
        Ok(Some(values))
    }

    /// sled's part of a scan with the log keys in it, from the log.
    fn disk_scan(self: &Arc<Self>, range: ByteRange, reverse: bool) -> KvIter {
        let sled_part = |r: ByteRange| -> KvIter {
            let iter = self.db.range(r);
            let shared = self.clone();
            let map = move |r: sled::Result<(sled::IVec, sled::IVec)>| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(|e| shared.sled_error("scan", e))
            };
            if reverse {
                Box::new(iter.rev().map(map))
            } else {
                Box::new(iter.map(map))
            }
        };
        let (log_lo, log_hi) = log_key_range();
        let Some(in_log) = intersect(&range, &log_key_range()) else {
            return sled_part(range);
        };
        let mut parts: Vec<KvIter> = Vec::with_capacity(3);
        if let Some(below) = intersect(&range, &(Bound::Unbounded, exclude(log_lo))) {
            parts.push(sled_part(below));
        }
        let from_log: KvIter = Box::new(LogIter {
            shared: self.clone(),
            range: in_log.clone(),
            reverse,
            buf: std::collections::VecDeque::new(),
            done: false,
            frame: None,
        });
        parts.push(if self.log.read().legacy > 0 {
            Box::new(Union::new(from_log, sled_part(in_log), reverse))
        } else {
            from_log
        });
        if let Some(above) = intersect(&range, &(include(log_hi), Bound::Unbounded)) {
            parts.push(sled_part(above));
        }
        if reverse {
            parts.reverse();
        }
        Box::new(parts.into_iter().flatten())
    }

    /// A sled error met by `what`: recorded as the store's failure (see
    /// `sled_failed`), and returned.
    fn sled_error(&self, what: &'static str, e: sled::Error) -> StoreError {
        self.sled_failed
            .lock()
            .get_or_insert_with(|| format!("sled failed during {what}: {e}"));
        StoreError::io(what, e)
    }

    fn checkpoint(&self) -> Result<(), StoreError> {
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

fn broken_error(reason: &str) -> StoreError {
    StoreError::io(
        "batch write",
        std::io::Error::other(format!(
            "an earlier batch was written only in part ({reason}); restart to recover it"
        )),
    )
}

/// Sled's part of a scan merged with the overlay's, in the scan's direction.
struct Merged {
    sled: std::iter::Peekable<KvIter>,
    /// The overlay's pairs, the next one last.
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    reverse: bool,
}

impl Merged {
    fn new(sled: KvIter, pending: Vec<(Vec<u8>, Option<Vec<u8>>)>, reverse: bool) -> Self {
        Self {
            sled: sled.peekable(),
            pending,
            reverse,
        }
    }
}

impl Iterator for Merged {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let take_overlay = match (self.sled.peek(), self.pending.last()) {
                (_, None) | (Some(Err(_)), _) => return self.sled.next(),
                (None, Some(_)) => true,
                (Some(Ok((sk, _))), Some((ok, _))) => match sk.cmp(ok) {
                    std::cmp::Ordering::Equal => {
                        // Both have it: the overlay's is newer.
                        self.sled.next();
                        true
                    }
                    order => (order == std::cmp::Ordering::Greater) != self.reverse,
                },
            };
            if take_overlay {
                let (k, v) = self.pending.pop().expect("peeked");
                match v {
                    Some(v) => return Some(Ok((k, v))),
                    None => continue, // deleted, not yet in sled
                }
            }
            return self.sled.next();
        }
    }
}

/// The log keys of a scan, from the index and the frames that hold them, read a
/// chunk of keys at a time (the index is not held while frames are read).
struct LogIter {
    shared: Arc<Shared>,
    /// What is left to read.
    range: ByteRange,
    reverse: bool,
    buf: std::collections::VecDeque<(Vec<u8>, u64)>,
    done: bool,
    /// The last frame read: a batch of replicated commits puts many log keys.
    frame: Option<(u64, FrameLog)>,
}

/// Log keys a [`LogIter`] takes from the index at a time.
const LOG_CHUNK: usize = 128;

impl Iterator for LogIter {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.buf.is_empty() {
                if self.done || range_is_empty(&self.range) {
                    return None;
                }
                {
                    let log = self.shared.log.read();
                    let found = log.keys.range(self.range.clone());
                    let take = |(k, f): (&Vec<u8>, &u64)| (k.clone(), *f);
                    if self.reverse {
                        self.buf.extend(found.rev().take(LOG_CHUNK).map(take));
                    } else {
                        self.buf.extend(found.take(LOG_CHUNK).map(take));
                    }
                }
                self.done = self.buf.len() < LOG_CHUNK;
                if let Some((k, _)) = self.buf.back() {
                    if self.reverse {
                        self.range.1 = Bound::Excluded(k.clone());
                    } else {
                        self.range.0 = Bound::Excluded(k.clone());
                    }
                }
            }
            let (key, frame) = self.buf.pop_front()?;
            if self.frame.as_ref().is_none_or(|(f, _)| *f != frame) {
                match self.shared.log_values(frame) {
                    Ok(Some(values)) => self.frame = Some((frame, values)),
                    // Deleted and its segment released since the chunk was taken.
                    Ok(None) => continue,
                    Err(e) => return Some(Err(e)),
                }
            }
            let (_, values) = self.frame.as_mut().expect("just read");
            return Some(take_log_value(values, frame, &key).map(|value| (key, value)));
        }
    }
}

/// Two scans of disjoint keys merged in the scan's direction.
struct Union {
    a: std::iter::Peekable<KvIter>,
    b: std::iter::Peekable<KvIter>,
    reverse: bool,
}

impl Union {
    fn new(a: KvIter, b: KvIter, reverse: bool) -> Self {
        Self {
            a: a.peekable(),
            b: b.peekable(),
            reverse,
        }
    }
}

impl Iterator for Union {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let a_first = match (self.a.peek(), self.b.peek()) {
            (None, _) => false,
            (_, None) | (Some(Err(_)), _) => true,
            (_, Some(Err(_))) => false,
            (Some(Ok((ka, _))), Some(Ok((kb, _)))) => (ka < kb) != self.reverse,
        };
        if a_first {
            self.a.next()
        } else {
            self.b.next()
        }
    }
}

fn include(b: Bound<Vec<u8>>) -> Bound<Vec<u8>> {
    match b {
        Bound::Excluded(k) | Bound::Included(k) => Bound::Included(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn exclude(b: Bound<Vec<u8>>) -> Bound<Vec<u8>> {
    match b {
        Bound::Excluded(k) | Bound::Included(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// The keys both ranges hold, `None` when there are none.
fn intersect(a: &ByteRange, b: &ByteRange) -> Option<ByteRange> {
    use Bound::*;
    let lower = match (a.0.clone(), b.0.clone()) {
        (Unbounded, x) | (x, Unbounded) => x,
        (Included(x), Included(y)) => Included(x.max(y)),
        (Excluded(x), Excluded(y)) => Excluded(x.max(y)),
        (Included(i), Excluded(e)) | (Excluded(e), Included(i)) => {
            if i > e {
                Included(i)
            } else {
                Excluded(e)
            }
        }
    };
    let upper = match (a.1.clone(), b.1.clone()) {
        (Unbounded, x) | (x, Unbounded) => x,
        (Included(x), Included(y)) => Included(x.min(y)),
        (Excluded(x), Excluded(y)) => Excluded(x.min(y)),
        (Included(i), Excluded(e)) | (Excluded(e), Included(i)) => {
            if i < e {
                Included(i)
            } else {
                Excluded(e)
            }
        }
    };
    let r = (lower, upper);
    (!range_is_empty(&r)).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::super::MemEngine;
    use super::*;

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
