//! The database: catalog, committed reads, the commit path and group commit.
//!
//! ```text
//!  Txn::commit / DDL / sequence block
//!        │
//!        ▼  commit mutex (short): assign LSN + Gtid, build ONE batch
//!   ┌───────────────────────────────────────────────┐
//!   │ rows (puts/deletes) + catalog + log record    │──► KvEngine::apply   (write)
//!   │ + origin high-water                           │
//!   └───────────────────────────────────────────────┘
//!        │  applied_lsn = L
//!        ▼  group flush: first waiter leads, flushes everything applied so far,
//!           sets flushed_lsn; the others find themselves covered             (flush)
//!        ▼  flushed_lsn ≥ L                                                  (advance)
//!        ▼  release row locks, return CommitInfo { durable: true }           (ack)
//! ```
//!
//! Commits are serialized only for LSN assignment and the in-memory batch apply; the
//! flush, the slow part, is shared: while one commit flushes, the others apply and then
//! wait for the next flush, which covers all of them. No background task is involved.
//! Readers are read-committed: they read the engine directly. A batch is atomic across
//! crashes; its keys become visible in batch order (rows, then log record, then
//! high-water), so a scan racing a multi-row commit may see part of it
//! (`docs/storage.md`, "Write-ahead log").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hawser_core::key::{encode_key, prefix_successor};
use hawser_core::{ColumnDef, Epoch, Gtid, Lsn, NodeId, QualName, Row, TableDef, Value};
use parking_lot::{Mutex, RwLock};

/// How many of the newest log records [`Database::log_tail`] keeps decoded in memory.
pub use crate::commit_log::TAIL_RECORDS;
use crate::commit_log::{note_last_commit, CommitLog, LogSizes};
pub(crate) use crate::group_flush::Flusher;
use crate::group_flush::GroupFlush;
pub use crate::rows::key_text;
use crate::rows::{coerce_key, decode_stored_row};
use crate::rows::{normalize_column, normalize_table_def};

use crate::codec;
use crate::engine::{ByteRange, KvEngine, KvIter, MemEngine, SledEngine, WriteBatch};
use crate::error::{printable_key, StoreError};
use crate::layout::{self, FORMAT_KEY, FORMAT_MAGIC, FORMAT_VERSION, NEXT_TABLE_ID_KEY};
use crate::locks::LockManager;
use crate::log::{DdlOp, LogEntry, LogRecord};
use crate::restart::{
    Diverged, HeldCommit, RestartCheck, RestartEvidence, RestartFence, RestartPoint,
};
use crate::sequence::{SequenceDef, SequenceState, BLOCK_SIZE};
use crate::space::{SpaceGuard, SpaceStatus};
use crate::txn::Txn;

/// How a database is opened.
#[derive(Debug, Clone)]
pub struct DbOptions {
    /// This node's id: the origin of every Gtid committed here.
    pub node_id: NodeId,
    /// Wait for the flush before a commit returns (`false` trades the last commits
    /// before a crash for latency; DDL and sequence blocks are always flushed).
    pub durable_commits: bool,
    /// How long a writer waits for a row lock before failing with 55P03.
    pub lock_timeout: Duration,
    /// The id of the running machine boot, compared at open with the one the store
    /// was last opened under ([`Database::machine_restarted`]); `None` reads Linux's
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: Option<String>,
    /// Writes are refused (SQLSTATE 53100) while the volume of the store's directory
    /// has less than this many bytes available ([`crate::space`]); 0 never refuses.
    /// Only a store on disk ([`Database::open_sled`]) checks.
    pub min_free_bytes: u64,
    /// Open a store whose write-ahead log is damaged by cutting the log before the
    /// damage instead of refusing ([`crate::engine::wal::scan`]): what followed is kept aside,
    /// not in the store, and the store counts as restarted, so that a receiver holding
    /// more of its commits is never streamed to again until it is rebuilt.
    pub salvage: bool,
}

impl DbOptions {
    /// Durable commits, a 10 s lock timeout, no free-space floor.
    pub fn new(node_id: NodeId) -> Self {
        Self {
            node_id,
            durable_commits: true,
            lock_timeout: Duration::from_secs(10),
            boot_id: None,
            min_free_bytes: 0,
            salvage: false,
        }
    }
}

/// Where an outbound stream's receiver stands ([`Database::positions`]): the last LSN it
/// acknowledged durably, and the node it was (`None` for positions written before the
/// node was kept). A position is the receiver node's: another node under the same
/// store name (one replaced on an empty data directory) holds none of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub lsn: Lsn,
    pub receiver: Option<NodeId>,
}

/// The outcome of a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitInfo {
    /// The transaction's global id; `seq` 0 for a transaction that wrote nothing.
    pub gtid: Gtid,
    /// Its position in the commit log; 0 for a transaction that wrote nothing.
    pub lsn: Lsn,
    /// Whether the commit was flushed before it was acknowledged.
    pub durable: bool,
}

impl CommitInfo {
    /// Whether the transaction wrote nothing (and so has no log record).
    pub fn is_empty(&self) -> bool {
        self.lsn == Lsn::ZERO
    }
}

/// Counters since the database was opened, plus log positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Log records committed (transactions, DDL, sequence blocks).
    pub commits: u64,
    /// Engine flushes (fewer than durable commits when group commit works).
    pub flushes: u64,
    /// Row puts and deletes written by transactions.
    pub rows_written: u64,
    /// Bytes of log records written.
    pub log_bytes_written: u64,
    /// The first LSN still in the log (older records were released).
    pub log_start: Lsn,
    /// Bytes of log held from `log_start` on.
    pub log_retained_bytes: u64,
    pub last_lsn: Lsn,
    pub flushed_lsn: Lsn,
    /// Row locks held right now.
    pub locks_held: u64,
}

/// A range over primary-key values, compared as prefixes: a bound with `k` values
/// compares with a key's first `k` columns. `Included(prefix)` upper bounds include
/// every key that starts with the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRange {
    pub lower: Bound<Vec<Value>>,
    pub upper: Bound<Vec<Value>>,
}

impl KeyRange {
    pub fn new(lower: Bound<Vec<Value>>, upper: Bound<Vec<Value>>) -> Self {
        Self { lower, upper }
    }

    /// Every row.
    pub fn all() -> Self {
        Self::new(Bound::Unbounded, Bound::Unbounded)
    }

    /// The row with exactly this key.
    pub fn point(key: Vec<Value>) -> Self {
        Self::new(Bound::Included(key.clone()), Bound::Included(key))
    }

    /// Every row whose first key columns equal `values`.
    pub fn prefix(values: Vec<Value>) -> Self {
        Self::point(values)
    }

    /// The encoded byte range (without the table prefix); `None` when provably empty.
    pub(crate) fn to_bytes(&self) -> Option<ByteRange> {
        let lower = match &self.lower {
            Bound::Unbounded => Bound::Unbounded,
            Bound::Included(v) => Bound::Included(encode_key(v)),
            // Past every key that starts with v.
            Bound::Excluded(v) => Bound::Included(prefix_successor(&encode_key(v))?),
        };
        let upper = match &self.upper {
            Bound::Unbounded => Bound::Unbounded,
            Bound::Included(v) => {
                prefix_successor(&encode_key(v)).map_or(Bound::Unbounded, Bound::Excluded)
            }
            Bound::Excluded(v) => Bound::Excluded(encode_key(v)),
        };
        Some((lower, upper))
    }
}

/// Committed rows of one table in key order, decoded lazily.
pub struct RowIter {
    inner: KvIter,
    def: Arc<TableDef>,
}

impl Iterator for RowIter {
    type Item = Result<Row, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.inner.next()?;
        Some(item.and_then(|(k, v)| decode_stored_row(&self.def, &k, &v)))
    }
}

/// A table as a transaction pins it: id, catalog version and definition.
#[derive(Debug, Clone)]
pub(crate) struct TableRef {
    pub id: u64,
    pub version: u64,
    pub def: Arc<TableDef>,
}

#[derive(Default)]
pub(crate) struct Catalog {
    pub(crate) tables: BTreeMap<QualName, TableRef>,
}

/// What the commit mutex guards.
pub(crate) struct CommitState {
    last_lsn: Lsn,
    /// The highest seq of this node's own origin given out (or received back).
    last_seq: u64,
    seqs: SeqReservation,
    next_table_id: u64,
}

/// How many seqs one reservation covers: one synced write per this many local commits.
const SEQ_BLOCK: u64 = 1 << 16;

/// Which seqs of its own origin this node may still hand out.
///
/// A flush writes a commit before its sync and senders may ship it in between, so a
/// machine crash (or a salvage) can lose commits a receiver holds; handing their seqs
/// out again would name two transactions by one Gtid. So seqs are reserved in blocks,
/// the reservation synced before the first seq above the previous one is used, and a
/// store that opens after such a loss continues above everything ever reserved. Kept
/// under [`layout::SEQ_CEILING_KEY`] as `[ceiling u64 BE][floor u64 BE]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SeqReservation {
    /// Durably reserved through this seq.
    ceiling: u64,
    /// Seqs at or below it are not handed out: the ceiling found by the last open that
    /// may have lost commits, kept until commits pass it.
    floor: u64,
}

impl SeqReservation {
    fn decode(v: &[u8]) -> Result<SeqReservation, StoreError> {
        let bad = || StoreError::corrupt(layout::SEQ_CEILING_KEY, "not a ceiling and a floor");
        let word = |b: &[u8]| -> Result<u64, StoreError> {
            Ok(u64::from_be_bytes(b.try_into().map_err(|_| bad())?))
        };
        if v.len() != 16 {
            return Err(bad());
        }
        Ok(SeqReservation {
            ceiling: word(&v[..8])?,
            floor: word(&v[8..])?,
        })
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = self.ceiling.to_be_bytes().to_vec();
        v.extend_from_slice(&self.floor.to_be_bytes());
        v
    }

    /// The reservation of a store opened with `stored`; `lost` when commits may have
    /// been lost since they were handed out (a machine restart, a salvage): nothing
    /// reserved until now is handed out any more.
    pub(crate) fn opened(stored: SeqReservation, lost: bool) -> SeqReservation {
        SeqReservation {
            floor: if lost { stored.ceiling } else { stored.floor },
            ..stored
        }
    }

    /// The next local seq after `last_seq`, and the reservation to make durable first
    /// when that seq lies above the current ceiling.
    pub(crate) fn next(&self, last_seq: u64) -> (u64, Option<SeqReservation>) {
        let seq = last_seq.max(self.floor) + 1;
        let raise = (seq > self.ceiling).then_some(SeqReservation {
            ceiling: seq - 1 + SEQ_BLOCK,
            floor: self.floor,
        });
        (seq, raise)
    }
}

struct Metrics {
    commits_txn: metrics::Counter,
    commits_ddl: metrics::Counter,
    commits_seq: metrics::Counter,
    commits_replicated: metrics::Counter,
    flushes: metrics::Counter,
    rows_written: metrics::Counter,
    commit_seconds: metrics::Histogram,
    flush_seconds: metrics::Histogram,
}

impl Metrics {
    fn new() -> Self {
        metrics::describe_counter!(
            "hawser_store_commits_total",
            "log records committed, by kind"
        );
        metrics::describe_counter!("hawser_store_flushes_total", "engine flushes");
        metrics::describe_counter!("hawser_store_rows_written_total", "row puts and deletes");
        metrics::describe_histogram!(
            "hawser_store_commit_seconds",
            metrics::Unit::Seconds,
            "transaction commit latency, from commit call to acknowledgement"
        );
        metrics::describe_histogram!(
            "hawser_store_flush_seconds",
            metrics::Unit::Seconds,
            "engine flush latency"
        );
        Self {
            commits_txn: metrics::counter!("hawser_store_commits_total", "kind" => "txn"),
            commits_ddl: metrics::counter!("hawser_store_commits_total", "kind" => "ddl"),
            commits_seq: metrics::counter!("hawser_store_commits_total", "kind" => "sequence"),
            commits_replicated: metrics::counter!("hawser_store_commits_total", "kind" => "replicated"),
            flushes: metrics::counter!("hawser_store_flushes_total"),
            rows_written: metrics::counter!("hawser_store_rows_written_total"),
            commit_seconds: metrics::histogram!("hawser_store_commit_seconds"),
            flush_seconds: metrics::histogram!("hawser_store_flush_seconds"),
        }
    }
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    flushes: AtomicU64,
    rows_written: AtomicU64,
    log_bytes: AtomicU64,
}

pub(crate) struct Inner {
    pub(crate) engine: Arc<dyn KvEngine>,
    pub(crate) opts: DbOptions,
    pub(crate) catalog: RwLock<Catalog>,
    pub(crate) sequences: RwLock<BTreeMap<QualName, Arc<Mutex<SequenceState>>>>,
    pub(crate) commit: Mutex<CommitState>,
    /// Highest LSN whose batch has been applied to the engine.
    applied_lsn: AtomicU64,
    /// Group flush: flushed and written positions, the flushing commit and those
    /// waiting ([`GroupFlush`]).
    pub(crate) flush: GroupFlush,
    /// What is kept in memory of the commit log: where it starts, record sizes, the
    /// newest records, DDL positions, each origin's newest commit ([`CommitLog`]).
    pub(crate) log: CommitLog,
    /// The high-water mark of every other origin committed here (this node's own is
    /// the commit state's `last_seq`). Changed under the commit mutex with the batch
    /// that writes the origin's log record; derived from the log at open (see
    /// [`Database::open`]).
    pub(crate) marks: RwLock<BTreeMap<NodeId, u64>>,
    pub(crate) locks: LockManager,
    epoch: AtomicU64,
    pub(crate) next_txn_id: AtomicU64,
    /// Held by the one replicated apply in progress: only applies advance other
    /// origins' high-water marks, so what an apply reads of them stays true until it
    /// has written its batch.
    pub(crate) apply_lock: tokio::sync::Mutex<()>,
    pub(crate) apply_metrics: crate::apply::ApplyMetrics,
    /// Row-timestamp conflict checking: rules, stamp clock ([`crate::conflict`]).
    pub(crate) conflicts: crate::conflict::Conflicts,
    /// BASE AGGREGATE targets kept from received rows ([`crate::aggregate`]).
    pub(crate) aggregates: crate::aggregate::Aggregates,
    /// Rows of RETURN TWOSAFE commits not yet visible to readers ([`crate::held`]).
    pub(crate) held: crate::held::HeldRows,
    /// Tables this store receives from a master and refuses client writes to, with
    /// the reason the refusal gives.
    refusals: RwLock<Refusals>,
    /// Counts tables created by replicated DDL, each counted once it is in the catalog
    /// ([`Database::catalog_generation`]).
    created_generation: AtomicU64,
    /// The restart fence: the machine restart this open found, the restart point and
    /// the receivers checked against it or found ahead ([`RestartFence`]).
    fence: RestartFence,
    /// Per origin, the seq through which replicated transactions are applied in log
    /// order, never compiled: what a duplicate's copy may already reflect in part
    /// ([`Database::in_order_through`]); written through to [`layout::COPY_ORDER_KEY`].
    pub(crate) in_order: RwLock<BTreeMap<NodeId, u64>>,
    /// Why this node takes no commits of its own now ([`Database::pause_writes`]).
    paused: RwLock<Option<String>>,
    /// Which client writes need a master lease, and the lease held ([`crate::lease`]).
    pub(crate) lease: crate::lease::LeaseGate,
    /// The free-space floor of a store on disk ([`crate::space`]).
    space: std::sync::OnceLock<Arc<SpaceGuard>>,
    counters: Counters,
    metrics: Metrics,
}

/// One open database. Cheap to clone: clones share everything.
#[derive(Clone)]
pub struct Database {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("node_id", &self.inner.opts.node_id)
            .field("last_lsn", &self.last_lsn())
            .finish()
    }
}

pub(crate) fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl Database {
    /// Opens a database on `engine`, creating an empty one when the keyspace is empty.
    ///
    /// Recovery happens here: the catalog and sequences are loaded, the next LSN is
    /// the one after the last log record and the next Gtid seq the one after this
    /// node's high-water. Because every commit is one atomic batch, whatever the engine
    /// recovered is a prefix of whole commits: nothing else needs repairing.
    pub fn open(engine: Arc<dyn KvEngine>, opts: DbOptions) -> Result<Database, StoreError> {
        check_format(engine.as_ref())?;
        let mut boot = read_boot(engine.as_ref(), opts.boot_id.as_deref())?;
        if let Some(what) = engine.salvaged() {
            // Commits past the cut are gone from this store, and a receiver may hold
            // them: as after a machine restart that lost some, never stream to one
            // that holds more of this node's commits than it has now.
            tracing::error!(
                what = %what,
                "this store opened from a salvaged log: it counts as restarted; a \
                 receiver holding more of its commits is refused until it is rebuilt"
            );
            boot.restarted = true;
        }
        let mut catalog = Catalog::default();
        let mut max_id = 0;
        for kv in engine.scan(layout::prefix_range(&[layout::TABLE_PREFIX]), false) {
            let (k, v) = kv?;
            let (id, version, def) = codec::decode_table(&k, &v)?;
            max_id = max_id.max(id);
            catalog.tables.insert(
                def.name.clone(),
                TableRef {
                    id,
                    version,
                    def: Arc::new(def),
                },
            );
        }
        let next_table_id = match engine.get(NEXT_TABLE_ID_KEY)? {
            Some(v) => u64_value(NEXT_TABLE_ID_KEY, &v)?,
            None => max_id + 1,
        };
        let mut sequences = BTreeMap::new();
        for kv in engine.scan(layout::prefix_range(&[layout::SEQUENCE_PREFIX]), false) {
            let (k, v) = kv?;
            let (def, restart_at) = codec::decode_sequence(&k, &v)?;
            sequences.insert(
                def.name.clone(),
                Arc::new(Mutex::new(SequenceState::reopened(def, restart_at))),
            );
        }
        let last_lsn = match engine
            .scan(layout::prefix_range(&[layout::LOG_PREFIX]), true)
            .next()
            .transpose()?
        {
            Some((k, _)) => Lsn(layout::suffix_u64(&k)
                .ok_or_else(|| StoreError::corrupt(&k, "malformed log key"))?),
            None => Lsn::ZERO,
        };
        // High-water marks: the `H` keys hold every origin's mark as of the log
        // released so far; the records still held raise them to the last commit.
        // They also name each origin's newest released commit, the newest one held
        // when no record of that origin is left (the log raises it too).
        let mut marks = BTreeMap::new();
        let mut last_commits = HashMap::new();
        for kv in engine.scan(layout::prefix_range(&[layout::HIGH_WATER_PREFIX]), false) {
            let (k, v) = kv?;
            let origin = layout::suffix_u64(&k)
                .filter(|_| k.len() == 9)
                .ok_or_else(|| StoreError::corrupt(&k, "malformed high-water key"))?;
            let (seq, micros) = layout::decode_high_water(&k, &v)?;
            marks.insert(NodeId(origin), seq);
            if let Some(micros) = micros {
                note_last_commit(&mut last_commits, Gtid::new(NodeId(origin), seq), micros);
            }
        }
        // The log's first record and size, for retention ([`Database::release_log`]).
        let mut log_start = None;
        let mut log_sizes = LogSizes::default();
        let mut ddl_lsns = BTreeSet::new();
        for kv in engine.scan(layout::prefix_range(&[layout::LOG_PREFIX]), false) {
            let (k, v) = kv?;
            let lsn = layout::suffix_u64(&k)
                .ok_or_else(|| StoreError::corrupt(&k, "malformed log key"))?;
            let start = *log_start.get_or_insert(lsn);
            // LSNs are dense; a gap (none is known to happen) counts as empty records.
            while log_sizes.len() < lsn - start {
                log_sizes.push(0);
            }
            log_sizes.push((k.len() + v.len()) as u64);
            let head = codec::record_head(&k, &v)?;
            let gtid = head.gtid;
            if head.ddl {
                ddl_lsns.insert(lsn);
            }
            note_last_commit(&mut last_commits, gtid, head.commit_micros);
            let mark = marks.entry(gtid.origin).or_insert(0);
            *mark = (*mark).max(gtid.seq);
        }
        let log_start = log_start.unwrap_or(last_lsn.0 + 1);
        let log_retained_bytes = log_sizes.bytes_from(0);
        let last_seq = marks.remove(&opts.node_id).unwrap_or(0);
        let restart = note_boot(engine.as_ref(), &boot, last_seq)?;
        let stored = match engine.get(layout::SEQ_CEILING_KEY)? {
            Some(v) => SeqReservation::decode(&v)?,
            None => SeqReservation::default(),
        };
        let seqs = SeqReservation::opened(stored, boot.restarted);
        if seqs != stored {
            write_seqs(engine.as_ref(), &seqs)?;
        }
        let ahead = match engine.get(layout::AHEAD_KEY)? {
            Some(v) => crate::restart::decode_ahead(layout::AHEAD_KEY, &v)?,
            None => BTreeMap::new(),
        };
        let in_order = match engine.get(layout::COPY_ORDER_KEY)? {
            Some(v) => layout::decode_marks(layout::COPY_ORDER_KEY, &v)?,
            None => BTreeMap::new(),
        };
        let machine_restarted = boot.restarted;
        tracing::info!(
            node = %opts.node_id,
            tables = catalog.tables.len(),
            sequences = sequences.len(),
            last_lsn = last_lsn.0,
            log_start,
            log_retained_bytes,
            last_seq,
            seq_floor = seqs.floor,
            "store opened"
        );
        let inner = Inner {
            engine,
            opts,
            catalog: RwLock::new(catalog),
            sequences: RwLock::new(sequences),
            commit: Mutex::new(CommitState {
                last_lsn,
                last_seq,
                seqs,
                next_table_id,
            }),
            applied_lsn: AtomicU64::new(last_lsn.0),
            flush: GroupFlush::new(last_lsn),
            log: CommitLog::opened(log_start, log_sizes, ddl_lsns, last_commits),
            marks: RwLock::new(marks),
            locks: LockManager::default(),
            epoch: AtomicU64::new(0),
            next_txn_id: AtomicU64::new(1),
            apply_lock: tokio::sync::Mutex::new(()),
            apply_metrics: crate::apply::ApplyMetrics::new(),
            conflicts: Default::default(),
            aggregates: Default::default(),
            held: crate::held::HeldRows::default(),
            refusals: RwLock::new(Refusals::default()),
            created_generation: AtomicU64::new(0),
            fence: RestartFence::new(machine_restarted, restart, ahead),
            in_order: RwLock::new(in_order),
            paused: RwLock::new(None),
            lease: crate::lease::LeaseGate::default(),
            space: std::sync::OnceLock::new(),
            counters: Counters::default(),
            metrics: Metrics::new(),
        };
        Ok(Database {
            inner: Arc::new(inner),
        })
    }

    /// Opens (or creates) a sled-backed database in `dir`.
    pub fn open_sled(dir: &Path, opts: DbOptions) -> Result<Database, StoreError> {
        let min_free = opts.min_free_bytes;
        let engine = SledEngine::open_salvaging(dir, opts.salvage)?;
        let db = Self::open(Arc::new(engine), opts)?;
        if min_free > 0 {
            let guard = SpaceGuard::start(dir, min_free)?;
            let _ = db.inner.space.set(guard);
        }
        Ok(db)
    }

    /// Why the store can no longer write, if its engine failed a write or sync
    /// ([`KvEngine::failure`]): it refuses every write, and what it shows readers may
    /// include commits that were never durable (and were reported failed). The node
    /// stops on it; a restart recovers every durable commit.
    pub fn storage_failure(&self) -> Option<String> {
        self.inner.engine.failure()
    }

    /// Refuses with [`StoreError::DiskFull`] while the store's volume is below its
    /// free-space floor (any write would be refused).
    pub fn check_space(&self) -> Result<(), StoreError> {
        self.inner.check_space()
    }

    /// The free space of the store's volume against its floor (`None` for a store not
    /// on disk, or without a floor).
    pub fn space(&self) -> Option<SpaceStatus> {
        self.inner.space.get().map(|g| g.status())
    }

    /// A fresh in-memory database.
    pub fn open_memory(opts: DbOptions) -> Result<Database, StoreError> {
        Self::open(Arc::new(MemEngine::new()), opts)
    }

    pub fn node_id(&self) -> NodeId {
        self.inner.opts.node_id
    }

    pub fn options(&self) -> &DbOptions {
        &self.inner.opts
    }

    /// The epoch stamped on records committed from now on.
    pub fn set_epoch(&self, epoch: Epoch) {
        self.inner.epoch.store(epoch.0, Ordering::Release);
    }

    pub fn epoch(&self) -> Epoch {
        Epoch(self.inner.epoch.load(Ordering::Acquire))
    }

    // ---- catalog -------------------------------------------------------------------

    pub fn table(&self, name: &QualName) -> Option<Arc<TableDef>> {
        self.inner
            .catalog
            .read()
            .tables
            .get(name)
            .map(|t| t.def.clone())
    }

    /// Every table, by name.
    pub fn tables(&self) -> Vec<Arc<TableDef>> {
        self.inner
            .catalog
            .read()
            .tables
            .values()
            .map(|t| t.def.clone())
            .collect()
    }

    pub(crate) fn table_ref(&self, name: &QualName) -> Result<TableRef, StoreError> {
        self.inner
            .catalog
            .read()
            .tables
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::UndefinedTable(name.clone()))
    }

    /// Creates a table. A table declared without a primary key (`explicit_key` false)
    /// keys on all its columns; explicit key columns become NOT NULL.
    pub async fn create_table(&self, def: TableDef) -> Result<CommitInfo, StoreError> {
        self.create_table_as(def, Origin::Local).await
    }

    pub(crate) async fn create_table_as(
        &self,
        def: TableDef,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let def = normalize_table_def(def)?;
        let name = def.name.clone();
        let (gtid, lsn) = self.inner.append_as(
            |state, gtid, micros| {
                if self.inner.catalog.read().tables.contains_key(&name) {
                    return Err(StoreError::DuplicateTable(name.clone()));
                }
                let id = state.next_table_id;
                state.next_table_id += 1;
                let mut batch = WriteBatch::new();
                batch.put(layout::table_key(id), codec::encode_table(id, 0, &def));
                batch.put(
                    NEXT_TABLE_ID_KEY.to_vec(),
                    state.next_table_id.to_be_bytes().to_vec(),
                );
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::CreateTable(def.clone()),
                };
                let install = move || {
                    // Another master's table: refused to client writes from the moment
                    // it exists, not only once the next plan has seen it.
                    if gtid.origin != self.node_id() {
                        self.inner.refuse_created(&name, gtid.origin);
                    }
                    self.inner.catalog.write().tables.insert(
                        name.clone(),
                        TableRef {
                            id,
                            version: 0,
                            def: Arc::new(def),
                        },
                    );
                    if gtid.origin != self.node_id() {
                        self.inner.count_created(&name);
                    }
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    /// Drops a table and all its rows.
    pub async fn drop_table(&self, name: &QualName) -> Result<CommitInfo, StoreError> {
        self.drop_table_as(name, Origin::Local).await
    }

    pub(crate) async fn drop_table_as(
        &self,
        name: &QualName,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let (gtid, lsn) = self.inner.append_as(
            |_, gtid, micros| {
                let t = self.table_ref(name)?;
                let mut batch = WriteBatch::new();
                batch.delete(layout::table_key(t.id));
                let prefix = layout::row_prefix(t.id);
                for kv in self.inner.engine.scan(layout::prefix_range(&prefix), false) {
                    batch.delete(kv?.0);
                }
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::DropTable(name.clone()),
                };
                let install = move || {
                    self.inner.catalog.write().tables.remove(name);
                    self.inner.refusals.write().created.remove(name);
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    /// Adds a column at the end. Existing rows read the column's default (NULL when it
    /// has none); they are not rewritten. A NOT NULL column without a default can only
    /// be added to an empty table. Tables keyed on all columns cannot grow a column
    /// (it would change every row's key).
    pub async fn add_column(
        &self,
        table: &QualName,
        col: ColumnDef,
    ) -> Result<CommitInfo, StoreError> {
        self.add_column_as(table, col, Origin::Local).await
    }

    pub(crate) async fn add_column_as(
        &self,
        table: &QualName,
        col: ColumnDef,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let (gtid, lsn) = self.inner.append_as(
            |_, gtid, micros| {
                let t = self.table_ref(table)?;
                if !t.def.explicit_key {
                    return Err(StoreError::NotSupported(format!(
                        "ADD COLUMN on table {table}, which has no PRIMARY KEY and keys on all its columns"
                    )));
                }
                if t.def.column_index(&col.name).is_some() {
                    return Err(StoreError::DuplicateColumn {
                        table: table.clone(),
                        column: col.name.clone(),
                    });
                }
                let col = normalize_column(table, col.clone())?;
                if !col.nullable && col.default.is_none() {
                    let prefix = layout::row_prefix(t.id);
                    let mut rows = self.inner.engine.scan(layout::prefix_range(&prefix), false);
                    if rows.next().transpose()?.is_some() {
                        return Err(StoreError::InvalidTableDef {
                            table: table.clone(),
                            reason: format!(
                                "column {} is NOT NULL without a default and the table has rows",
                                col.name
                            ),
                        });
                    }
                }
                let mut def = (*t.def).clone();
                def.columns.push(col.clone());
                let version = t.version + 1;
                let mut batch = WriteBatch::new();
                batch.put(
                    layout::table_key(t.id),
                    codec::encode_table(t.id, version, &def),
                );
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::AddColumn {
                        table: table.clone(),
                        column: col,
                    },
                };
                let install = move || {
                    self.inner.catalog.write().tables.insert(
                        table.clone(),
                        TableRef {
                            id: t.id,
                            version,
                            def: Arc::new(def),
                        },
                    );
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    pub async fn create_sequence(&self, def: SequenceDef) -> Result<CommitInfo, StoreError> {
        self.create_sequence_as(def, Origin::Local).await
    }

    pub(crate) async fn create_sequence_as(
        &self,
        def: SequenceDef,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        def.validate()?;
        let (gtid, lsn) = self.inner.append_as(
            |_, gtid, micros| {
                if self.inner.sequences.read().contains_key(&def.name) {
                    return Err(StoreError::DuplicateSequence(def.name.clone()));
                }
                let mut batch = WriteBatch::new();
                batch.put(
                    layout::sequence_key(&def.name),
                    codec::encode_sequence(&def, Some(def.start)),
                );
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::CreateSequence(def.clone()),
                };
                let install = move || {
                    self.inner.sequences.write().insert(
                        def.name.clone(),
                        Arc::new(Mutex::new(SequenceState::new(def))),
                    );
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    pub async fn drop_sequence(&self, name: &QualName) -> Result<CommitInfo, StoreError> {
        self.drop_sequence_as(name, Origin::Local).await
    }

    pub(crate) async fn drop_sequence_as(
        &self,
        name: &QualName,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let (gtid, lsn) = self.inner.append_as(
            |_, gtid, micros| {
                if !self.inner.sequences.read().contains_key(name) {
                    return Err(StoreError::UndefinedSequence(name.clone()));
                }
                let mut batch = WriteBatch::new();
                batch.delete(layout::sequence_key(name));
                let entry = LogEntry::Ddl {
                    gtid,
                    commit_micros: micros,
                    op: DdlOp::DropSequence(name.clone()),
                };
                let install = move || {
                    self.inner.sequences.write().remove(name);
                };
                Ok((batch, entry, install))
            },
            DdlKind::Ddl,
            origin,
        )?;
        self.ddl_durable(gtid, lsn).await
    }

    pub fn sequence(&self, name: &QualName) -> Option<SequenceDef> {
        // Clone the handle and drop the map lock before locking the sequence: NEXTVAL
        // holds a sequence's lock while it waits for the commit mutex, and DDL holds
        // the commit mutex while it waits for the map's write lock.
        let seq = self.inner.sequences.read().get(name).cloned()?;
        let def = seq.lock().def.clone();
        Some(def)
    }

    pub fn sequences(&self) -> Vec<SequenceDef> {
        let all: Vec<_> = self.inner.sequences.read().values().cloned().collect();
        all.iter().map(|s| s.lock().def.clone()).collect()
    }

    /// The next value of a sequence. Not transactional (a rollback does not return
    /// it). Every [`BLOCK_SIZE`] values it durably records where the next block starts
    /// (a log record plus a flush, on the calling thread); the other calls touch only
    /// memory.
    pub fn next_val(&self, name: &QualName) -> Result<i64, StoreError> {
        let seq = self
            .inner
            .sequences
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::UndefinedSequence(name.clone()))?;
        let mut state = seq.lock();
        if state.left_in_block == 0 && state.next.is_some() {
            let restart_at = state.next_block_start();
            let def = state.def.clone();
            let (_, lsn) = self.inner.append(
                |_, gtid, micros| {
                    // A DROP SEQUENCE may have won the race for the commit mutex.
                    let current = self.inner.sequences.read().get(name).cloned();
                    if !current.is_some_and(|c| Arc::ptr_eq(&c, &seq)) {
                        return Err(StoreError::UndefinedSequence(name.clone()));
                    }
                    let mut batch = WriteBatch::new();
                    batch.put(
                        layout::sequence_key(name),
                        codec::encode_sequence(&def, restart_at),
                    );
                    let entry = LogEntry::SequenceBlock {
                        gtid,
                        commit_micros: micros,
                        name: name.clone(),
                        restart_at,
                    };
                    Ok((batch, entry, || {}))
                },
                DdlKind::Sequence,
            )?;
            // The reservation must be durable before any value of the block is handed
            // out, or a crash could hand the same values out again.
            self.inner.flush_through(lsn)?;
            state.restart_at = restart_at;
            state.left_in_block = BLOCK_SIZE;
        }
        state.take()
    }

    /// A replicated sequence block: the master reserved values up to `restart_at`, so
    /// this store's sequence moves at least that far ahead (never back), durably. A
    /// subscriber that takes over as master then hands out only values the old master
    /// never did (TimesTen sets the subscriber ahead every 20 NEXTVAL references).
    pub(crate) async fn advance_sequence_as(
        &self,
        name: &QualName,
        restart_at: Option<i64>,
        origin: Origin,
    ) -> Result<CommitInfo, StoreError> {
        let seq = self
            .inner
            .sequences
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::UndefinedSequence(name.clone()))?;
        let (gtid, lsn) = {
            let mut state = seq.lock();
            let ahead = match (state.next, restart_at) {
                // Exhausted on the master: exhausted here too.
                (_, None) | (None, _) => None,
                (Some(here), Some(there)) if state.def.increment > 0 => Some(here.max(there)),
                (Some(here), Some(there)) => Some(here.min(there)),
            };
            let def = state.def.clone();
            let installed = std::cell::Cell::new(false);
            let pos = self.inner.append_as(
                |_, gtid, micros| {
                    let mut batch = WriteBatch::new();
                    batch.put(
                        layout::sequence_key(name),
                        codec::encode_sequence(&def, ahead),
                    );
                    let entry = LogEntry::SequenceBlock {
                        gtid,
                        commit_micros: micros,
                        name: name.clone(),
                        restart_at,
                    };
                    Ok((batch, entry, || installed.set(true)))
                },
                DdlKind::Sequence,
                origin,
            )?;
            if installed.get() {
                // The values of the current local block are not handed out any more:
                // the next NEXTVAL here reserves a block from `ahead`.
                state.next = ahead;
                state.restart_at = ahead;
                state.left_in_block = 0;
            }
            pos
        };
        self.ddl_durable(gtid, lsn).await
    }

    /// Sets the tables this store receives from a master, each with the reason a
    /// client write to it is refused (naming the master). Replaces the previous set;
    /// replicated applies are not affected.
    ///
    /// `seen` is what [`Database::catalog_generation`] said before the caller read
    /// the catalog it planned from. A table created by replicated DDL is refused from
    /// the moment it exists, before any plan has seen it; that refusal is kept until a
    /// plan that saw the table replaces it (by refusing it with its own reason, or by
    /// leaving it writable where this store masters it too).
    /// Checks conflicts of received changes by row timestamp, and stamps local writes,
    /// as `rules` say per table (the node sets them from the schemes). Creates the
    /// conflicts table when a rule needs it.
    pub async fn set_conflict_rules(
        &self,
        rules: HashMap<QualName, crate::conflict::ConflictRule>,
    ) -> Result<(), StoreError> {
        let name = QualName::bare(crate::conflict::CONFLICTS_TABLE);
        if !rules.is_empty() && self.table(&name).is_none() {
            match self
                .create_table(crate::conflict::conflicts_table_def())
                .await
            {
                Ok(_) => {}
                // Made meanwhile by another caller.
                Err(_) if self.table(&name).is_some() => {}
                Err(e) => return Err(e),
            }
        }
        if *self.inner.conflicts.rules() != rules {
            self.inner.conflicts.set(rules);
        }
        Ok(())
    }

    /// The conflicts applies find from now on, once committed (a reporter writes them
    /// to the scheme's report files).
    pub fn subscribe_conflicts(
        &self,
    ) -> tokio::sync::broadcast::Receiver<std::sync::Arc<crate::conflict::ConflictEvent>> {
        self.inner.conflicts.subscribe()
    }

    pub fn set_write_refusals(&self, refusals: HashMap<QualName, String>, seen: u64) {
        let mut r = self.inner.refusals.write();
        r.planned = refusals;
        r.created.retain(|_, (_, counted)| *counted > seen);
    }

    /// The store names of the cluster's nodes, for the reason a write to a table
    /// created by replicated DDL is refused with before a plan has seen it (it names
    /// the origin's store; by node id when the name is not known).
    pub fn set_store_names(&self, names: HashMap<NodeId, String>) {
        self.inner.refusals.write().stores = names;
    }

    /// A count of the tables created here by replicated DDL so far, taken before
    /// reading the catalog to plan write refusals from (see
    /// [`Database::set_write_refusals`]): a table counted in it is in the catalog.
    pub fn catalog_generation(&self) -> u64 {
        self.inner.created_generation.load(Ordering::Acquire)
    }

    /// Whether the machine restarted since this store was last opened (another boot
    /// id, or none to compare). Commits a flush had written but not yet synced
    /// before that were lost with the machine, while senders may have shipped them
    /// ([`Database::written_lsn`]): the node checks with its receivers before it
    /// takes writes again (docs/stream.md, "Shipping before the sync").
    pub fn machine_restarted(&self) -> bool {
        self.inner.fence.machine_restarted()
    }

    /// Where the last machine restart this store saw left this node's own commits,
    /// and which receivers were checked against it since (`None`: no machine restart
    /// since the store was created).
    pub fn restart_point(&self) -> Option<RestartPoint> {
        self.inner.fence.point()
    }

    /// Whether this node has not taken writes of its own since its last machine
    /// restart: it opened after one ([`Database::machine_restarted`]), or after a
    /// restart of the process that came before its fence was lifted.
    pub fn restart_fence_pending(&self) -> bool {
        self.inner.fence.pending()
    }

    /// Records, durably, that the node takes writes of its own again after its last
    /// machine restart: a later restart of the process does not hold them back.
    pub fn lift_restart_fence(&self) -> Result<(), StoreError> {
        self.inner.fence.lift(self.inner.engine.as_ref())
    }

    /// Whether `receiver` still has to go through
    /// [`Database::check_receiver_after_restart`]: there is a restart point and the
    /// receiver is not checked against it, or was found diverged. No I/O: a sender asks
    /// this at every session start.
    pub fn restart_check_pending(&self, receiver: &str) -> bool {
        self.inner.fence.check_pending(receiver)
    }

    /// Checks a receiver's first answer after a machine restart — `holds`, the highest
    /// seq of this node's origin it has; `node`, the receiver's node id — against the
    /// restart point. A receiver holding more than the point holds commits this node
    /// lost with the machine (streaming to it would hand it new commits under seqs it
    /// already has): it is recorded as diverged, durably, and stays so across later
    /// restarts until a store with another node id answers under its name (rebuilt).
    /// One holding no more is recorded as checked, so that its later answers, holding
    /// commits made since, pass. So is one holding more when `evidence` shows that
    /// what it holds past the point are commits this node made since, and that it
    /// misses none of them its stream carries
    /// ([`RestartEvidence::holds_only_commits_made_since`]): it got them through a
    /// propagator before this node's own stream came up.
    pub fn check_receiver_after_restart(
        &self,
        receiver: &str,
        node: u64,
        holds: u64,
        evidence: &RestartEvidence,
    ) -> Result<RestartCheck, StoreError> {
        self.inner.fence.check_after_restart(
            self.inner.engine.as_ref(),
            receiver,
            node,
            holds,
            evidence,
        )
    }

    /// The commits of `origin` this log holds past `after_seq` and up to
    /// `through_seq`, in seq order, each as `keep` makes it of its record; read back
    /// from the newest record until one of `origin` at or below `after_seq`. At most
    /// `limit` of them: not complete when there were more, when the log was released
    /// before such a record was found (some may be gone), or when that took more than
    /// [`COMMITS_AFTER_SCAN`] records (a peer's probe cannot make it read a whole large
    /// log). Used around a machine restart, when the commits in question are recent.
    pub fn commits_after<T>(
        &self,
        origin: NodeId,
        after_seq: u64,
        through_seq: u64,
        limit: usize,
        mut keep: impl FnMut(LogRecord) -> T,
    ) -> Result<(Vec<T>, bool), StoreError> {
        let start = self.log_start();
        let mut found = Vec::new();
        let mut complete = start <= Lsn(1);
        for (scanned, kv) in self.inner.engine.scan(log_from(start), true).enumerate() {
            if scanned == COMMITS_AFTER_SCAN {
                complete = false;
                break;
            }
            let (k, v) = kv?;
            let record = codec::decode_record(&k, &v)?;
            let gtid = record.gtid();
            if gtid.origin != origin || gtid.seq > through_seq {
                continue;
            }
            if gtid.seq <= after_seq {
                complete = true;
                break;
            }
            if found.len() == limit {
                complete = false;
                break;
            }
            found.push(keep(record));
        }
        found.reverse();
        Ok((found, complete))
    }

    /// Checks a receiver's answer to a Hello — `holds`, the highest seq of this node's
    /// origin it has; `node`, its node id — against this node's own last seq, at every
    /// session: a receiver holding more has commits this node no longer has (a data
    /// directory put back from a copy, or commits lost in a crash some other way, with
    /// no machine restart to set a restart point), and this node's next commits would
    /// reach it under seqs it already has. It is refused, and stays refused — durably,
    /// across restarts, even once this node's seqs have passed what it holds — until a
    /// store with another node id answers under its name (rebuilt). Writes only when
    /// its verdict changes what is recorded.
    pub fn check_receiver_ahead(
        &self,
        receiver: &str,
        node: u64,
        holds: u64,
    ) -> Result<RestartCheck, StoreError> {
        let own = || self.inner.commit.lock().last_seq;
        self.inner
            .fence
            .check_ahead(self.inner.engine.as_ref(), receiver, node, holds, own)
    }

    /// Records, durably, that `receiver` (node id `node`) holds this node's commit
    /// `holds` while this node gave that seq to another commit (the sender found its
    /// own commit under that seq made at another time): it is refused from now on, as
    /// [`Database::check_receiver_ahead`] refuses a receiver found ahead.
    pub fn mark_receiver_diverged(
        &self,
        receiver: &str,
        node: u64,
        holds: u64,
    ) -> Result<Diverged, StoreError> {
        let own = || self.inner.commit.lock().last_seq;
        self.inner
            .fence
            .mark_diverged(self.inner.engine.as_ref(), receiver, node, holds, own)
    }

    /// Stops (with the reason client writes are refused with, SQLSTATE 57P03) or,
    /// with `None`, resumes this node's own commits: transactions, DDL and
    /// sequence reservations. Replicated applies go on.
    pub fn pause_writes(&self, reason: Option<String>) {
        *self.inner.paused.write() = reason;
    }

    /// The master lease gate: which client writes need a lease, and the lease held.
    pub fn lease(&self) -> &crate::lease::LeaseGate {
        &self.inner.lease
    }

    /// Returns once every commit that had taken the commit mutex has its seq and log
    /// record in place: a seq read after it covers them.
    pub fn commit_barrier(&self) {
        drop(self.inner.commit.lock());
    }

    /// Why this node's own commits are paused, if they are.
    pub fn writes_paused(&self) -> Option<String> {
        self.inner.paused.read().clone()
    }

    /// Rows that RETURN TWOSAFE commits are holding back from readers now, for status.
    pub fn held_rows(&self) -> usize {
        self.inner.held.len()
    }

    // ---- committed reads -----------------------------------------------------------

    /// The committed row with primary key `key`.
    pub fn get(&self, table: &QualName, key: &[Value]) -> Result<Option<Row>, StoreError> {
        let t = self.table_ref(table)?;
        let key = coerce_key(&t.def, key, false)?;
        self.inner.get_row(&t, &encode_key(&key))
    }

    /// Committed rows in `range`, in key order.
    pub fn scan(&self, table: &QualName, range: KeyRange) -> Result<RowIter, StoreError> {
        let t = self.table_ref(table)?;
        Ok(RowIter {
            inner: self.inner.scan_rows(&t, &range, false)?,
            def: t.def,
        })
    }

    // ---- transactions --------------------------------------------------------------

    /// Starts a transaction.
    pub fn begin(&self) -> Txn {
        let id = self.inner.next_txn_id.fetch_add(1, Ordering::Relaxed);
        Txn::new(self.clone(), id)
    }

    // ---- commit log ----------------------------------------------------------------

    /// Up to `limit` log records from LSN `from` on, in LSN order.
    pub fn log_range(&self, from: Lsn, limit: usize) -> Result<Vec<LogRecord>, StoreError> {
        self.inner
            .engine
            .scan(log_from(from), false)
            .take(limit)
            .map(|kv| kv.and_then(|(k, v)| codec::decode_record(&k, &v)))
            .collect()
    }

    /// The seq of this node's own newest commit at or before `lsn` in the log, looking
    /// at most `look_back` records back from there (`None` when none is found: the
    /// records are released, or all of another origin's).
    pub fn own_seq_through(&self, lsn: Lsn, look_back: usize) -> Result<Option<u64>, StoreError> {
        let own = self.node_id();
        let from = self.log_start();
        if lsn < from || lsn == Lsn::ZERO {
            return Ok(None);
        }
        let range = (
            Bound::Included(layout::log_key(from)),
            Bound::Included(layout::log_key(lsn)),
        );
        for kv in self.inner.engine.scan(range, true).take(look_back) {
            let (k, v) = kv?;
            let head = codec::record_head(&k, &v)?;
            if head.gtid.origin == own {
                return Ok(Some(head.gtid.seq));
            }
        }
        Ok(None)
    }

    /// The tables that this store's log records of the transaction `gtid` write (a
    /// transaction can have several records here when it arrived in parts: see
    /// [`Database::apply_part`]), looking back from the log's end over at most
    /// `look_back` records; `None` when no record of it is found there.
    pub fn tables_of(
        &self,
        gtid: Gtid,
        look_back: usize,
    ) -> Result<Option<BTreeSet<QualName>>, StoreError> {
        let (from, to) = (self.log_start(), self.last_lsn());
        if to < from || to == Lsn::ZERO {
            return Ok(None);
        }
        let range = (
            Bound::Included(layout::log_key(from)),
            Bound::Included(layout::log_key(to)),
        );
        let mut tables: Option<BTreeSet<QualName>> = None;
        for kv in self.inner.engine.scan(range, true).take(look_back) {
            let (k, v) = kv?;
            let head = codec::record_head(&k, &v)?;
            if head.gtid == gtid {
                let found = tables.get_or_insert_with(BTreeSet::new);
                if let LogEntry::Txn(t) = codec::decode_record(&k, &v)?.entry {
                    found.extend(t.changes.into_iter().map(|c| c.table));
                }
            } else if head.gtid.origin == gtid.origin && head.gtid.seq < gtid.seq {
                // The log holds an origin's transactions in seq order: no record of
                // this one comes before an older one.
                break;
            }
        }
        Ok(tables)
    }

    /// The newest commit of `origin` this store holds, by seq and its origin's commit
    /// time (`None` when there is none, or when its record was released before store
    /// format 4, whose `H` keys keep the newest released commit's time). A sender compares it with its own commit under
    /// that seq: another time means the sender gave that seq to another commit — it
    /// lost the one the receiver has.
    pub fn last_commit_of(&self, origin: NodeId) -> Option<HeldCommit> {
        let last = self.inner.log.newest_of(origin)?;
        let mark = if origin == self.node_id() {
            self.inner.commit.lock().last_seq
        } else {
            self.high_water(origin).ok()?
        };
        (last.seq == mark).then_some(last)
    }

    /// The DDL records of the log from LSN `from` on, in log order, read by the LSNs
    /// kept in memory (no scan of the log between them).
    pub fn ddl_from(&self, from: Lsn) -> Result<Vec<LogRecord>, StoreError> {
        let from = from.max(self.log_start());
        // (Released records leave the index as `release_log` releases them.)
        let lsns = self.inner.log.ddl_from(from);
        let mut records = Vec::with_capacity(lsns.len());
        for lsn in lsns {
            match self.log_range(Lsn(lsn), 1)?.pop() {
                Some(r) if r.lsn == Lsn(lsn) => records.push(r),
                // Released meanwhile: whatever came after it is still read.
                _ => {}
            }
        }
        Ok(records)
    }

    /// Up to `limit` records from LSN `from` on, through the last applied LSN, when
    /// the in-memory tail of the log still has `from` (a sender that keeps up): no
    /// read of the engine and no decoding. `None` when `from` is older than the tail;
    /// [`Database::log_range`] has it then.
    pub fn log_tail(&self, from: Lsn, limit: usize) -> Option<Vec<Arc<LogRecord>>> {
        self.inner.log.tail(from, self.last_lsn(), limit)
    }

    /// Bytes of log (keys and encoded records) from LSN `from` on: what a receiver
    /// that has everything before `from` still lacks, as FAILTHRESHOLD measures it.
    /// Counted from the sizes kept in memory, not read from the log.
    pub fn log_bytes_from(&self, from: Lsn) -> Result<u64, StoreError> {
        Ok(self.inner.log.bytes_from(from))
    }

    /// The first LSN still in the log: everything before it was released. One past
    /// [`Database::last_lsn`] when nothing was ever committed.
    pub fn log_start(&self) -> Lsn {
        self.inner.log.start()
    }

    /// Bytes of log (keys and encoded records) still held, from [`Database::log_start`]
    /// on.
    pub fn log_retained_bytes(&self) -> u64 {
        self.inner.log.retained_bytes()
    }

    /// Releases the log through LSN `through`, oldest first, while more than
    /// `keep_bytes` of log would remain: the records are deleted and
    /// [`Database::log_start`] moves past them. The last record is never released
    /// (opening reads the last LSN from it). Returns how many records went.
    ///
    /// The caller decides what nobody needs any more (every stream that retains log
    /// has acknowledged it, docs/design.md §4); a reader asking for released LSNs gets the
    /// log from `log_start` on, so readers compare their position with it first.
    pub fn release_log(&self, through: Lsn, keep_bytes: u64) -> Result<u64, StoreError> {
        const CHUNK: usize = 1024;
        let inner = &self.inner;
        let _one = inner.log.releasing();
        let limit = through.0.min(self.last_lsn().0.saturating_sub(1));
        let mut released = 0u64;
        loop {
            let start = inner.log.start().0;
            let mut retained = self.log_retained_bytes();
            if start > limit || retained <= keep_bytes {
                break;
            }
            let mut batch = WriteBatch::new();
            let mut last = None;
            // The marks the released records carry go to the `H` keys in the same
            // batch: they are what opening derives the marks from.
            let mut released_marks: HashMap<NodeId, HeldCommit> = HashMap::new();
            for kv in inner.engine.scan(log_from(Lsn(start)), false).take(CHUNK) {
                let (k, v) = kv?;
                let lsn = layout::suffix_u64(&k)
                    .ok_or_else(|| StoreError::corrupt(&k, "malformed log key"))?;
                let size = (k.len() + v.len()) as u64;
                if lsn > limit || retained.saturating_sub(size) < keep_bytes {
                    break;
                }
                let head = codec::record_head(&k, &v)?;
                note_last_commit(&mut released_marks, head.gtid, head.commit_micros);
                retained -= size;
                batch.delete(k);
                last = Some(lsn);
            }
            let Some(last) = last else { break };
            let count = batch.len() as u64;
            for (origin, newest) in released_marks {
                if newest.seq > layout::stored_high_water(inner.engine.as_ref(), origin)? {
                    batch.put(
                        layout::high_water_key(origin),
                        layout::high_water_value(newest.seq, newest.commit_micros),
                    );
                }
            }
            inner.engine.apply(batch)?;
            inner.log.released_through(Lsn(last));
            released += count;
        }
        Ok(released)
    }

    /// The retained positions of this node's outbound streams, by link name: the last
    /// LSN each receiver acknowledged durably, and which node it was
    /// ([`Database::set_positions`]).
    pub fn positions(&self) -> Result<BTreeMap<String, Position>, StoreError> {
        let mut out = BTreeMap::new();
        for kv in self
            .inner
            .engine
            .scan(layout::prefix_range(&[layout::POSITION_PREFIX]), false)
        {
            let (k, v) = kv?;
            let name = String::from_utf8(k[1..].to_vec())
                .map_err(|_| StoreError::corrupt(&k, "position name is not UTF-8"))?;
            let position = match v.len() {
                // Written before the receiver's node id was kept.
                8 => Position {
                    lsn: Lsn(u64_value(&k, &v)?),
                    receiver: None,
                },
                16 => Position {
                    lsn: Lsn(u64_value(&k, &v[..8])?),
                    receiver: Some(NodeId(u64_value(&k, &v[8..])?)),
                },
                _ => return Err(StoreError::corrupt(&k, "not a stream position")),
            };
            out.insert(name, position);
        }
        Ok(out)
    }

    /// Records streams' positions (`Some`) and forgets others (`None`), durably: a
    /// release that relies on a position must not outlive it in a crash.
    pub fn set_positions(&self, changes: &[(String, Option<Position>)]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::new();
        for (name, position) in changes {
            let key = layout::position_key(name);
            match position {
                Some(p) => {
                    let mut v = p.lsn.0.to_be_bytes().to_vec();
                    if let Some(node) = p.receiver {
                        v.extend_from_slice(&node.0.to_be_bytes());
                    }
                    batch.put(key, v)
                }
                None => batch.delete(key),
            }
        }
        self.inner.engine.apply(batch)?;
        self.inner.engine.flush()
    }

    /// The LSN of the last committed record (0 when the log is empty).
    pub fn last_lsn(&self) -> Lsn {
        Lsn(self.inner.applied_lsn.load(Ordering::Acquire))
    }

    /// The highest LSN known to be flushed.
    pub fn flushed_lsn(&self) -> Lsn {
        self.inner.flush.flushed()
    }

    /// The highest LSN known to be written to the log: flushed, or written by a
    /// commit flush whose sync is still under way. Such a commit survives a crash of
    /// this process (the kernel holds what was written; opening syncs it), not a
    /// crash of the machine.
    pub fn written_lsn(&self) -> Lsn {
        self.inner.flush.written()
    }

    /// Writes every commit applied so far to the log without syncing it and returns
    /// the new [`Database::written_lsn`]: from here a crash of this process keeps
    /// them. Senders of a node whose commits are not durable
    /// (`DbOptions::durable_commits` false) call it before they ship this node's own
    /// commits, which nobody flushes after their commit: a commit only in memory that
    /// a receiver held would be lost here in a crash of the process, and its seq given
    /// to the next commit, which the receiver would skip as a duplicate.
    pub fn write_ahead(&self) -> Result<Lsn, StoreError> {
        let upto = self.inner.applied_lsn.load(Ordering::Acquire);
        self.inner.engine.write_ahead()?;
        let _ = self.inner.flush.wrote(upto);
        Ok(self.written_lsn())
    }

    /// The written position ([`Database::written_lsn`]) as commit flushes move it,
    /// for the senders that ship this node's commits once written: a commit flush
    /// publishes it between writing the log and syncing it, then lets the tasks it woke
    /// run before it blocks on the sync, so that the receivers' syncs run while this
    /// one does. While anybody watches, commit flushes write the log ahead of their
    /// sync; the store calls no code of its watchers.
    pub fn watch_written(&self) -> tokio::sync::watch::Receiver<Lsn> {
        self.inner.flush.watch_written()
    }

    /// The highest seq of `origin` committed here (0 when none).
    pub fn high_water(&self, origin: NodeId) -> Result<u64, StoreError> {
        if origin == self.node_id() {
            return Ok(self.inner.commit.lock().last_seq);
        }
        Ok(self.inner.mark(origin))
    }

    /// The high-water mark of every origin with a transaction committed here: this
    /// node's own and every origin it applied from (docs/design.md §2). A receiver answers
    /// a sender's `Hello` with these.
    pub fn high_waters(&self) -> Result<BTreeMap<NodeId, u64>, StoreError> {
        let mut marks = self.inner.marks.read().clone();
        let own = self.inner.commit.lock().last_seq;
        if own > 0 {
            marks.insert(self.node_id(), own);
        }
        Ok(marks)
    }

    pub fn stats(&self) -> StoreStats {
        let c = &self.inner.counters;
        StoreStats {
            commits: c.commits.load(Ordering::Relaxed),
            flushes: c.flushes.load(Ordering::Relaxed),
            rows_written: c.rows_written.load(Ordering::Relaxed),
            log_bytes_written: c.log_bytes.load(Ordering::Relaxed),
            log_start: self.log_start(),
            log_retained_bytes: self.log_retained_bytes(),
            last_lsn: self.last_lsn(),
            flushed_lsn: self.flushed_lsn(),
            locks_held: self.inner.locks.held_count() as u64,
        }
    }

    /// DDL is always durable before it is acknowledged.
    async fn ddl_durable(&self, gtid: Gtid, lsn: Lsn) -> Result<CommitInfo, StoreError> {
        self.inner.wait_durable(lsn, Flusher::Commit, true).await?;
        Ok(CommitInfo {
            gtid,
            lsn,
            durable: true,
        })
    }
}

/// Whose commit a DDL statement is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin {
    /// This node's: the next Gtid of this node, the current epoch, the time now.
    Local,
    /// Another origin's, received by replication: its own Gtid, epoch and time.
    Replicated {
        gtid: Gtid,
        epoch: Epoch,
        commit_micros: i64,
    },
}

/// The tables a store refuses client writes to, with the reason each refusal gives.
#[derive(Default)]
struct Refusals {
    /// From the last plan of the scheme's routes ([`Database::set_write_refusals`]).
    planned: HashMap<QualName, String>,
    /// Created by replicated DDL and not yet seen by a plan, with the
    /// [`Database::catalog_generation`] that counted them (`u64::MAX` while being
    /// created).
    created: HashMap<QualName, (String, u64)>,
    /// Store names by node id ([`Database::set_store_names`]).
    stores: HashMap<NodeId, String>,
}

/// Which counter a commit counts under.
#[derive(Clone, Copy)]
pub(crate) enum DdlKind {
    Txn,
    Ddl,
    Sequence,
}

/// What a commit closure returns: the batch, the log entry, and what to change in
/// memory once the batch is applied (run while the commit mutex is still held, so the
/// next commit sees the new catalog).
pub(crate) type Prepared<I> = (WriteBatch, LogEntry, I);

/// What a replicated apply hands [`Inner::append_foreign`]: its row writes, its log
/// records in order (epoch and entry) and the high-water of each origin it advanced.
pub(crate) struct ForeignAppend {
    pub batch: WriteBatch,
    pub records: Vec<(Epoch, LogEntry)>,
    pub high_water: BTreeMap<NodeId, u64>,
}

impl Inner {
    /// The write step of every commit: under the commit mutex, assigns the next LSN and
    /// Gtid, lets `prepare` build the batch and log entry (it may refuse), adds the log
    /// record and this origin's high-water, and applies it all as one atomic batch.
    pub(crate) fn append<P, I>(&self, prepare: P, kind: DdlKind) -> Result<(Gtid, Lsn), StoreError>
    where
        P: FnOnce(&mut CommitState, Gtid, i64) -> Result<Prepared<I>, StoreError>,
        I: FnOnce(),
    {
        self.append_as(prepare, kind, Origin::Local)
    }

    /// The next seq of this node's own origin, its reservation made durable first when
    /// it needs a new one ([`SeqReservation`]): a synced write under the commit mutex,
    /// once every [`SEQ_BLOCK`] local commits.
    fn next_own_seq(&self, state: &mut CommitState) -> Result<u64, StoreError> {
        let (seq, raise) = state.seqs.next(state.last_seq);
        if let Some(raised) = raise {
            write_seqs(self.engine.as_ref(), &raised)?;
            state.seqs = raised;
        }
        Ok(seq)
    }

    /// Refuses a write while the store's volume is below its free-space floor.
    pub(crate) fn check_space(&self) -> Result<(), StoreError> {
        match self.space.get() {
            Some(guard) => guard.check(),
            None => Ok(()),
        }
    }

    /// [`Inner::append`] for a commit of either origin: a local one takes the next
    /// Gtid of this node and the current epoch, a replicated one (DDL received from
    /// another origin) keeps its Gtid, epoch and commit time. Either way the record's
    /// origin gets its high-water in the same batch.
    pub(crate) fn append_as<P, I>(
        &self,
        prepare: P,
        kind: DdlKind,
        origin: Origin,
    ) -> Result<(Gtid, Lsn), StoreError>
    where
        P: FnOnce(&mut CommitState, Gtid, i64) -> Result<Prepared<I>, StoreError>,
        I: FnOnce(),
    {
        self.check_space()?;
        if matches!(origin, Origin::Local) {
            if let Some(reason) = self.paused.read().clone() {
                return Err(StoreError::WritesPaused(reason));
            }
        }
        let mut state = self.commit.lock();
        let lsn = state.last_lsn.next();
        let (gtid, epoch, micros) = match origin {
            Origin::Local => (
                Gtid::new(self.opts.node_id, self.next_own_seq(&mut state)?),
                Epoch(self.epoch.load(Ordering::Acquire)),
                now_micros(),
            ),
            Origin::Replicated {
                gtid,
                epoch,
                commit_micros,
            } => (gtid, epoch, commit_micros),
        };
        let (mut batch, entry, install) = prepare(&mut state, gtid, micros)?;
        let record = Arc::new(LogRecord { lsn, epoch, entry });
        let bytes = codec::encode_record(&record);
        let log_bytes = bytes.len() as u64;
        let key = layout::log_key(lsn);
        let retained = (key.len() + bytes.len()) as u64;
        batch.put(key, bytes);
        // Write: rows, catalog and log record in one batch, atomic across crashes (the
        // record carries the origin's new high-water). It is visible to readers from
        // here on, durable only after the flush.
        self.engine.apply(batch)?;
        self.log
            .appended(std::slice::from_ref(&record), &[retained]);
        state.last_lsn = lsn;
        if gtid.origin == self.opts.node_id {
            state.last_seq = state.last_seq.max(gtid.seq);
        } else {
            let mut marks = self.marks.write();
            let mark = marks.entry(gtid.origin).or_insert(0);
            *mark = (*mark).max(gtid.seq);
        }
        install();
        self.applied_lsn.store(lsn.0, Ordering::Release);
        drop(state);
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        self.counters
            .log_bytes
            .fetch_add(log_bytes, Ordering::Relaxed);
        match kind {
            DdlKind::Txn => self.metrics.commits_txn.increment(1),
            DdlKind::Ddl => self.metrics.commits_ddl.increment(1),
            DdlKind::Sequence => self.metrics.commits_seq.increment(1),
        }
        Ok((gtid, lsn))
    }

    /// The write step of a replicated apply: like [`Inner::append`], but for records of
    /// other origins. Under the commit mutex `prepare` gets this node's own high-water
    /// (the commit state's `last_seq`) and builds the row batch, the records (their
    /// original Gtids and epochs) and the new high-water of each origin it applied;
    /// each record takes the next local LSN, and rows, records and high-waters are
    /// applied as one atomic batch. Returns the last LSN written (`None` when
    /// `prepare` produced no record) and `prepare`'s extra result.
    pub(crate) fn append_foreign<P, T>(&self, prepare: P) -> Result<(Option<Lsn>, T), StoreError>
    where
        P: FnOnce(u64) -> Result<(ForeignAppend, T), StoreError>,
    {
        let mut state = self.commit.lock();
        let (append, extra) = prepare(state.last_seq)?;
        let ForeignAppend {
            mut batch,
            records,
            high_water,
        } = append;
        if records.is_empty() {
            return Ok((None, extra));
        }
        let count = records.len() as u64;
        let mut lsn = state.last_lsn;
        let mut log_bytes = 0;
        let mut written = Vec::with_capacity(records.len());
        let mut sizes = Vec::with_capacity(records.len());
        for (epoch, entry) in records {
            lsn = lsn.next();
            let record = Arc::new(LogRecord { lsn, epoch, entry });
            let bytes = codec::encode_record(&record);
            log_bytes += bytes.len() as u64;
            let key = layout::log_key(lsn);
            sizes.push((key.len() + bytes.len()) as u64);
            batch.put(key, bytes);
            written.push(record);
        }
        // Write: rows and log records in one batch (atomic across crashes; the records
        // carry the new high-waters), visible from here on, durable only after the
        // flush.
        self.engine.apply(batch)?;
        self.log.appended(&written, &sizes);
        state.last_lsn = lsn;
        let mut marks = self.marks.write();
        for (origin, seq) in high_water {
            if origin == self.opts.node_id {
                // This node's own transactions, received back (after a duplicate):
                // local commits continue after them.
                state.last_seq = state.last_seq.max(seq);
            } else {
                let mark = marks.entry(origin).or_insert(0);
                *mark = (*mark).max(seq);
            }
        }
        drop(marks);
        self.applied_lsn.store(lsn.0, Ordering::Release);
        drop(state);
        self.counters.commits.fetch_add(count, Ordering::Relaxed);
        self.counters
            .log_bytes
            .fetch_add(log_bytes, Ordering::Relaxed);
        self.metrics.commits_replicated.increment(count);
        Ok((Some(lsn), extra))
    }

    /// Counts row writes of a replicated apply with the other row writes.
    /// The high-water mark of another origin (see `marks`).
    pub(crate) fn mark(&self, origin: NodeId) -> u64 {
        self.marks.read().get(&origin).copied().unwrap_or(0)
    }

    pub(crate) fn count_rows_written(&self, rows: u64) {
        self.counters
            .rows_written
            .fetch_add(rows, Ordering::Relaxed);
        self.metrics.rows_written.increment(rows);
    }

    /// Group commit: returns once everything up to `lsn` is flushed
    /// ([`GroupFlush::wait_durable`]); counts the flush when this caller led one.
    pub(crate) async fn wait_durable(
        &self,
        lsn: Lsn,
        who: Flusher,
        settle: bool,
    ) -> Result<(), StoreError> {
        let led = self
            .flush
            .wait_durable(&self.engine, &self.applied_lsn, lsn, who, settle)
            .await?;
        if let Some(started) = led {
            self.count_flush(started);
        }
        Ok(())
    }

    /// The blocking form of [`Inner::wait_durable`], for sequence reservations.
    pub(crate) fn flush_through(&self, lsn: Lsn) -> Result<(), StoreError> {
        if let Some(started) = self
            .flush
            .flush_through(&*self.engine, &self.applied_lsn, lsn)?
        {
            self.count_flush(started);
        }
        Ok(())
    }

    fn count_flush(&self, started: Instant) {
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        self.metrics.flushes.increment(1);
        self.metrics
            .flush_seconds
            .record(started.elapsed().as_secs_f64());
    }

    pub(crate) fn record_txn_commit(&self, rows: u64, started: Instant) {
        self.counters
            .rows_written
            .fetch_add(rows, Ordering::Relaxed);
        self.metrics.rows_written.increment(rows);
        self.metrics
            .commit_seconds
            .record(started.elapsed().as_secs_f64());
    }

    /// Checks, under the commit mutex, that a transaction's pinned table is still the
    /// catalog's (same id and version).
    pub(crate) fn check_table_current(&self, t: &TableRef) -> Result<(), StoreError> {
        match self.catalog.read().tables.get(&t.def.name) {
            Some(cur) if cur.id == t.id && cur.version == t.version => Ok(()),
            _ => Err(StoreError::TableChanged(t.def.name.clone())),
        }
    }

    /// The committed row under an encoded key.
    pub(crate) fn get_row(&self, t: &TableRef, enc_key: &[u8]) -> Result<Option<Row>, StoreError> {
        let key = layout::row_key(t.id, enc_key);
        let stored = match self.held.get(&key) {
            Some(version) => version,
            None => self.engine.get(&key)?,
        };
        match stored {
            Some(v) => decode_stored_row(&t.def, &key, &v).map(Some),
            None => Ok(None),
        }
    }

    /// Raw committed `(row key, value)` pairs of `range`.
    pub(crate) fn scan_rows(
        &self,
        t: &TableRef,
        range: &KeyRange,
        reverse: bool,
    ) -> Result<KvIter, StoreError> {
        match table_byte_range(t, range)? {
            Some(r) => Ok(self
                .held
                .overlay(&r, reverse, self.engine.scan(r.clone(), reverse))),
            None => Ok(Box::new(std::iter::empty())),
        }
    }

    /// Refuses a client write to `table` when this store receives it from a master.
    /// Refuses it too when this node masters `table` but holds no master lease.
    /// `Ok(true)`: the write needs the master lease, held now.
    pub(crate) fn check_writable(&self, table: &QualName) -> Result<bool, StoreError> {
        self.check_received(table)?;
        self.lease.check(table, std::time::Instant::now())
    }

    fn check_received(&self, table: &QualName) -> Result<(), StoreError> {
        let refusals = self.refusals.read();
        let reason = refusals
            .planned
            .get(table)
            .or_else(|| refusals.created.get(table).map(|(reason, _)| reason));
        match reason {
            Some(reason) => Err(StoreError::ReceivedTable {
                table: table.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses client writes to a table replicated DDL of `origin` is about to
    /// create here, until a plan that saw it says otherwise (uncounted until
    /// [`Inner::count_created`]).
    fn refuse_created(&self, table: &QualName, origin: NodeId) {
        let mut refusals = self.refusals.write();
        let reason = match refusals.stores.get(&origin) {
            Some(store) => format!(
                "it was created here by replicated DDL of master {store} (node {origin}); \
                 write it on {store}"
            ),
            None => format!(
                "it was created here by replicated DDL of node {origin}, which masters it; \
                 write it there"
            ),
        };
        refusals.created.insert(table.clone(), (reason, u64::MAX));
    }

    /// Counts a table created by replicated DDL once it is in the catalog: a plan
    /// that read the count at or past this saw the table.
    fn count_created(&self, table: &QualName) {
        let counted = self.created_generation.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some((_, c)) = self.refusals.write().created.get_mut(table) {
            *c = counted;
        }
    }

    pub(crate) fn release_locks<'a>(
        &self,
        txn: u64,
        keys: impl IntoIterator<Item = &'a crate::locks::LockKey>,
    ) {
        self.locks.release_all(txn, keys);
    }
}

/// The most log records [`Database::commits_after`] reads back.
pub const COMMITS_AFTER_SCAN: usize = 1 << 20;

/// The keys of the log records from LSN `from` on.
fn log_from(from: Lsn) -> ByteRange {
    (
        Bound::Included(layout::log_key(from)),
        prefix_successor(&[layout::LOG_PREFIX]).map_or(Bound::Unbounded, Bound::Excluded),
    )
}

/// The byte range of a key range inside one table's rows; `None` when empty.
pub(crate) fn table_byte_range(
    t: &TableRef,
    range: &KeyRange,
) -> Result<Option<ByteRange>, StoreError> {
    let range = KeyRange {
        lower: map_bound(&range.lower, |v| coerce_key(&t.def, v, true))?,
        upper: map_bound(&range.upper, |v| coerce_key(&t.def, v, true))?,
    };
    let Some((lower, upper)) = range.to_bytes() else {
        return Ok(None);
    };
    let prefix = layout::row_prefix(t.id);
    let with_prefix = |b: Vec<u8>| layout::row_key(t.id, &b);
    let lower = match lower {
        Bound::Unbounded => Bound::Included(prefix.clone()),
        Bound::Included(b) => Bound::Included(with_prefix(b)),
        Bound::Excluded(b) => Bound::Excluded(with_prefix(b)),
    };
    let upper = match upper {
        Bound::Unbounded => prefix_successor(&prefix).map_or(Bound::Unbounded, Bound::Excluded),
        Bound::Included(b) => Bound::Included(with_prefix(b)),
        Bound::Excluded(b) => Bound::Excluded(with_prefix(b)),
    };
    Ok(Some((lower, upper)))
}

fn map_bound(
    b: &Bound<Vec<Value>>,
    f: impl FnOnce(&[Value]) -> Result<Vec<Value>, StoreError>,
) -> Result<Bound<Vec<Value>>, StoreError> {
    Ok(match b {
        Bound::Unbounded => Bound::Unbounded,
        Bound::Included(v) => Bound::Included(f(v)?),
        Bound::Excluded(v) => Bound::Excluded(f(v)?),
    })
}

pub(crate) fn u64_value(key: &[u8], v: &[u8]) -> Result<u64, StoreError> {
    let bytes: [u8; 8] = v
        .try_into()
        .map_err(|_| StoreError::corrupt(key, format!("expected 8 bytes, found {}", v.len())))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Refuses a keyspace of another format; marks an empty one as ours.
fn check_format(engine: &dyn KvEngine) -> Result<(), StoreError> {
    match engine.get(FORMAT_KEY)? {
        Some(v) => {
            let version = v
                .strip_prefix(FORMAT_MAGIC)
                .and_then(|rest| <[u8; 4]>::try_from(rest).ok())
                .map(u32::from_be_bytes)
                .ok_or_else(|| {
                    StoreError::IncompatibleFormat(format!(
                        "the format marker reads {:?}, which is not a hawser store's",
                        printable_key(&v)
                    ))
                })?;
            if version == FORMAT_VERSION {
                Ok(())
            } else if (1..=3).contains(&version) {
                // Format 1 wrote every origin's high-water key with each commit; format
                // 2 derives the marks from the log and writes the keys only as log is
                // released. A format-1 store is a valid format-2 store (its keys are
                // current). Format 3 keeps the log keys in the sled engine's
                // write-ahead log; the engine still reads and deletes those an older
                // store left in sled. So both are upgraded by rewriting the marker: an
                // older build must not open the store afterwards (it would not find the
                // log, and would drop the log segments that hold it). Format 4 reads
                // an older `H` value (its seq alone) as it is.
                write_format_marker(engine)
            } else if version > FORMAT_VERSION {
                Err(StoreError::IncompatibleFormat(format!(
                    "written by a newer hawser (store format {version}; this build reads format {FORMAT_VERSION})"
                )))
            } else {
                Err(StoreError::IncompatibleFormat(format!(
                    "unknown store format {version} (this build reads format {FORMAT_VERSION})"
                )))
            }
        }
        None => {
            let any = engine
                .scan((Bound::Unbounded, Bound::Unbounded), false)
                .next()
                .transpose()?;
            if let Some((k, _)) = any {
                return Err(StoreError::IncompatibleFormat(format!(
                    "it holds data (first key {}) but no hawser format marker",
                    printable_key(&k)
                )));
            }
            write_format_marker(engine)
        }
    }
}

/// Writes this build's format marker, durably.
fn write_format_marker(engine: &dyn KvEngine) -> Result<(), StoreError> {
    let mut batch = WriteBatch::new();
    batch.put(FORMAT_KEY.to_vec(), layout::format_value());
    engine.apply(batch)?;
    engine.flush()
}

/// Makes `seqs` the durable reservation ([`SeqReservation`]).
fn write_seqs(engine: &dyn KvEngine, seqs: &SeqReservation) -> Result<(), StoreError> {
    let mut batch = WriteBatch::new();
    batch.put(layout::SEQ_CEILING_KEY.to_vec(), seqs.encode());
    engine.apply(batch)?;
    engine.flush()
}

/// Where Linux tells the id of the running boot.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The running boot's id, and whether the store was last opened under another one —
/// or under one that could not be read, which counts as a restart. A store opened for
/// the first time was not.
struct Boot {
    /// What to record: the running boot's id (empty when it cannot be read).
    current: Vec<u8>,
    changed: bool,
    restarted: bool,
}

fn read_boot(engine: &dyn KvEngine, boot_id: Option<&str>) -> Result<Boot, StoreError> {
    let current = match boot_id {
        Some(id) => Some(id.to_string()),
        None => std::fs::read_to_string(BOOT_ID_PATH)
            .ok()
            .map(|s| s.trim().to_string()),
    };
    let stored = engine.get(layout::BOOT_KEY)?;
    let restarted = match (&stored, &current) {
        (None, _) => false,
        (Some(before), Some(now)) => before.as_slice() != now.as_bytes(),
        (Some(_), None) => true,
    };
    let current = current.unwrap_or_default().into_bytes();
    Ok(Boot {
        changed: stored.as_deref() != Some(current.as_slice()),
        current,
        restarted,
    })
}

/// Records the running boot's id and, after a machine restart, a new restart point
/// at `last_seq` (this node's last own seq as opened) — in one durable batch, so a
/// crash before it is recorded leaves the next open to see the restart again. Returns
/// the restart point now in force (the stored one when the machine did not restart).
fn note_boot(
    engine: &dyn KvEngine,
    boot: &Boot,
    last_seq: u64,
) -> Result<Option<RestartPoint>, StoreError> {
    let stored = match engine.get(layout::RESTART_KEY)? {
        Some(v) => Some(RestartPoint::decode(layout::RESTART_KEY, &v)?),
        None => None,
    };
    let restart = if boot.restarted {
        Some(RestartPoint::after(stored.as_ref(), last_seq))
    } else {
        stored
    };
    if boot.changed || boot.restarted {
        let mut batch = WriteBatch::new();
        batch.put(layout::BOOT_KEY.to_vec(), boot.current.clone());
        if let Some(point) = restart.as_ref().filter(|_| boot.restarted) {
            batch.put(layout::RESTART_KEY.to_vec(), point.encode());
        }
        engine.apply(batch)?;
        engine.flush()?;
    }
    Ok(restart)
}

#[cfg(test)]
mod tests {
    use super::{SeqReservation, SEQ_BLOCK};

    #[test]
    fn seqs_are_reserved_a_block_ahead_and_an_open_after_a_loss_continues_above_them() {
        let fresh = SeqReservation::opened(SeqReservation::default(), false);
        // The first seq needs a reservation, which covers a block.
        let (seq, raised) = fresh.next(0);
        assert_eq!(seq, 1);
        let r = raised.expect("a reservation");
        assert_eq!(r.ceiling, SEQ_BLOCK);
        // Within it, none.
        assert_eq!(r.next(SEQ_BLOCK - 1), (SEQ_BLOCK, None));
        // Past it, the next block.
        let (seq, raised) = r.next(SEQ_BLOCK);
        assert_eq!(seq, SEQ_BLOCK + 1);
        assert_eq!(raised.map(|r| r.ceiling), Some(2 * SEQ_BLOCK));
        // An open that may have lost commits (whatever was handed out up to 40 is
        // recovered as 10) continues above the whole reservation, and keeps doing so
        // at later opens until a commit passes it.
        let lost = SeqReservation::opened(r, true);
        let (seq, raised) = lost.next(10);
        assert_eq!(seq, SEQ_BLOCK + 1);
        let raised = raised.expect("a new block");
        assert_eq!(raised.floor, SEQ_BLOCK);
        let reopened = SeqReservation::opened(lost, false);
        assert_eq!(reopened.next(10).0, SEQ_BLOCK + 1);
        // Encoded and decoded whole.
        assert_eq!(SeqReservation::decode(&raised.encode()).unwrap(), raised);
        assert!(SeqReservation::decode(&[0; 8]).is_err());
    }
}
