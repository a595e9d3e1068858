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
//!
//! [`Database`] is a front over parts that each own their state and locks: the commit
//! log's memory (`CommitLog`), group flush (`GroupFlush`), the restart fence
//! (`RestartFence`), row locks, held rows, conflict rules, aggregates and the lease.
//! What is left here is the commit mutex's state, the catalog and sequences, and the
//! marks. Its operations are split by concern: `open` (opening and recovery),
//! `catalog` (tables, sequences, DDL), `log_reads` (reading and releasing the log,
//! positions, stats), `seqs` (this node's seq reservations), and `crate::txn` and
//! `crate::apply` for transactions and replicated applies.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hawser_core::key::{encode_key, prefix_successor};
use hawser_core::{ColumnDef, Epoch, Gtid, Lsn, NodeId, QualName, Row, TableDef, Value};
use parking_lot::{Mutex, RwLock};

use crate::catalog::Catalog;
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
use crate::marks::Marks;
use crate::restart::{
    Diverged, HeldCommit, RestartCheck, RestartEvidence, RestartFence, RestartPoint,
};
use crate::sequence::{SequenceDef, SequenceState, BLOCK_SIZE};
use crate::space::{SpaceGuard, SpaceStatus};

mod catalog;
mod log_reads;
mod open;
mod seqs;

use seqs::write_seqs;
pub(crate) use seqs::SeqReservation;

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

pub(crate) use crate::catalog::TableRef;

/// What the commit mutex guards.
pub(crate) struct CommitState {
    last_lsn: Lsn,
    /// The highest seq of this node's own origin given out (or received back).
    last_seq: u64,
    seqs: SeqReservation,
    next_table_id: u64,
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
    /// The tables and sequences ([`Catalog`]).
    pub(crate) catalog: Catalog,
    pub(crate) commit: Mutex<CommitState>,
    /// Highest LSN whose batch has been applied to the engine.
    applied_lsn: AtomicU64,
    /// Group flush: flushed and written positions, the flushing commit and those
    /// waiting ([`GroupFlush`]).
    pub(crate) flush: GroupFlush,
    /// What is kept in memory of the commit log: where it starts, record sizes, the
    /// newest records, DDL positions, each origin's newest commit ([`CommitLog`]).
    pub(crate) log: CommitLog,
    /// The high-water mark of every other origin committed here ([`Marks`]; this
    /// node's own is the commit state's `last_seq`). Raised under the commit mutex
    /// with the batch that writes the origin's log record.
    pub(crate) marks: Marks,
    pub(crate) locks: LockManager,
    epoch: AtomicU64,
    pub(crate) next_txn_id: AtomicU64,
    /// Held by the one replicated apply in progress: only applies advance other
    /// origins' high-water marks, so what an apply reads of them stays true until it
    /// has written its batch.
    pub(crate) apply_lock: tokio::sync::Mutex<()>,
    pub(crate) apply_metrics: crate::apply_metrics::ApplyMetrics,
    /// Row-timestamp conflict checking: rules, stamp clock ([`crate::conflict`]).
    pub(crate) conflicts: crate::conflict::Conflicts,
    /// BASE AGGREGATE targets kept from received rows ([`crate::aggregate`]).
    pub(crate) aggregates: crate::groups::Aggregates,
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
            self.marks.raise([(gtid.origin, gtid.seq)]);
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
        let (own, others): (Vec<_>, Vec<_>) = high_water
            .into_iter()
            .partition(|(origin, _)| *origin == self.opts.node_id);
        // This node's own transactions, received back (after a duplicate): local
        // commits continue after them.
        for (_, seq) in own {
            state.last_seq = state.last_seq.max(seq);
        }
        self.marks.raise(others);
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
        self.marks.get(origin)
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
        if self.catalog.is_current(t) {
            Ok(())
        } else {
            Err(StoreError::TableChanged(t.def.name.clone()))
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
