//! The receiving end of `Replicate`: check the sender, apply its batches, acknowledge.
//!
//! ```text
//!  Hello ──► protocol, receiver name, elements subscribed, epochs not stale,
//!            table definitions (EXACT / RELAXED) ──► HelloReply(high-waters) | Refused
//!  Batch ──► (its chunks joined as they are read: crate::chunks; a stream that ends
//!            between two chunks applies nothing of their batch)
//!        ──► + the batches already queued behind it (compilation on: the backlog)
//!        ──► epochs still current ──► decompress (bounded) ──► decode
//!        ──► rows: backlog ≥ threshold (transactions or bytes) and compilation on:
//!                      hawser_rtl::compile ──► Database::apply_compiled (net rows, one batch)
//!                  otherwise: Database::apply_replicated (log order)
//!            DDL: Database::apply_replicated_ddl (between runs)
//!        ──► (write + flush inside the store) ──► Ack(durable, applied, through_lsn)
//! ```
//!
//! **When to compile.** A receiver that is current gets small batches and applies them
//! in log order as they come. One that is behind — after a pause, a restart, a new
//! subscription — gets full batches back to back, and the sender keeps several in
//! flight. With compilation on ([`CompilePolicy`]), the receiver takes the batch it
//! read together with every batch already waiting on the stream (without waiting for
//! more, up to [`ReceiverConfig::max_run_bytes`]); if that backlog reaches the
//! transaction or byte threshold it is compiled into net row operations and written as
//! one atomic batch (docs/design.md §6), else applied in log order. The backlog a receiver
//! can see is bounded by the sender's in-flight window, which is what keeps a run's
//! memory bounded too. Acks are cumulative, so one Ack answers the whole backlog.
//!
//! The store makes apply idempotent by Gtid, so a batch re-sent after a reconnect
//! changes nothing, and it writes rows, log records and high-waters in one atomic
//! batch flushed before it returns: the Ack is sent only after the bytes it promises
//! are durable (the `durable` marks say so only when the flush happened). While a long
//! run applies, the receiver keeps heartbeating so the sender does not take it for dead.
//!
//! Each stream is served by one task on the caller's [`TaskTracker`], cancelled by the
//! caller's token. A refusal travels as a `Refused` message with its reason (never a
//! bare gRPC error), so the sender can show it in status. Per stream the receiver
//! counts transactions and row changes received against rows written, by apply mode
//! ([`InboundStatus`], and the `hawser_stream_*` metrics labelled by sender store).

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use hawser_core::{Epoch, Ident, NodeId, QualName, TableDef, Transaction};
use hawser_rtl::{Compilation, CompileError, Compiler};
use hawser_scheme::ast::TableDefinitionChecking;
use hawser_scheme::route::ResolvedTarget;
use hawser_store::{Database, DdlOp, LogEntry, Pacer, ReplicatedTxn, StoreError};
use hawser_target::{TargetError, TargetPlan};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::chunks::Joiner;
use crate::codec::{self, decode_records, decompress};
use crate::link::{check_table, ForkedRange};
use crate::paths::DecidedMarks;
use crate::pb::{self, receiver_message, sender_message, RefuseCode};
use crate::PROTOCOL_VERSION;

/// When a receiver applies what it received as RTL net rows instead of in log order.
///
/// The measure of "behind" is the backlog: the batch just read plus the batches already
/// waiting behind it on the stream. A current receiver sees one small batch at a time;
/// one catching up sees full batches queued up to the sender's in-flight window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompilePolicy {
    /// `false`: every batch is applied in log order, whatever the backlog (for targets
    /// that must see every change, or to compare).
    pub enabled: bool,
    /// Compile a backlog of at least this many transactions.
    pub min_transactions: u64,
    /// Compile a backlog of at least this many bytes (uncompressed batch payloads), so
    /// a few large transactions count as much as many small ones.
    pub min_bytes: u64,
}

impl CompilePolicy {
    /// Default transaction threshold: one full sender batch
    /// ([`crate::SenderTuning::max_batch_records`]). A catching-up receiver's backlog is
    /// full batches back to back; a current one's is what a linger gathered (at most
    /// [`crate::SenderTuning::linger_records`], 128, a batch), perhaps two or three of
    /// them. Compiling a current receiver's backlog gains nothing — the store's
    /// log-order apply of the same backlog writes each key once too, since it simulates
    /// the run for the log records anyway — and costs the compiler's pass and the net
    /// writes: with the earlier threshold of 64, an asynchronous subscriber under
    /// `hawser bench --clients 16` compiled nearly every ~80-transaction backlog and
    /// spent ~12 % more CPU per transaction (`docs/rtl.md`).
    pub const DEFAULT_MIN_TRANSACTIONS: u64 = 512;
    /// Default byte threshold: one full sender batch
    /// ([`crate::SenderTuning::max_batch_bytes`]), for the same reason.
    pub const DEFAULT_MIN_BYTES: u64 = 1024 * 1024;

    /// Whether a backlog of `transactions` in `bytes` is compiled.
    pub fn compiles(&self, transactions: u64, bytes: u64) -> bool {
        self.enabled && (transactions >= self.min_transactions || bytes >= self.min_bytes)
    }
}

impl Default for CompilePolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            min_transactions: Self::DEFAULT_MIN_TRANSACTIONS,
            min_bytes: Self::DEFAULT_MIN_BYTES,
        }
    }
}

/// How a receiver behaves.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// This node's store name: a Hello for another store is refused.
    pub store: Ident,
    /// When received transactions are applied as RTL net rows.
    pub compile: CompilePolicy,
    /// The most uncompressed batch bytes gathered into one compiled run: a bound on
    /// the memory one apply takes, whatever the sender's window.
    pub max_run_bytes: u64,
    pub heartbeat: Duration,
    /// Silence after which the sender is taken for dead and the stream dropped.
    pub peer_timeout: Duration,
    /// A stream no return service waits on, when it is not behind, applies in slices
    /// of about this much time with a short sleep between them (`hawser start
    /// --apply-slice`; docs/stream.md, "Paced apply"). `None`: in one go.
    pub apply_slice: Option<Duration>,
    /// The largest gRPC message read from a sender (`hawser start --max-message-bytes`):
    /// [`ReceiverService::into_server`] sets it, and the HelloReply says it, so that the
    /// sender keeps its messages well under it and cuts larger batches into chunks.
    pub max_message_bytes: usize,
    /// The largest batch taken in chunks, as sent and decompressed: one transaction at
    /// most this large can be replicated to this node. A larger one is refused at its
    /// first chunk, naming the sizes, before the rest is read or held.
    pub max_transaction_bytes: u64,
}

impl ReceiverConfig {
    pub fn new(store: Ident) -> Self {
        Self {
            store,
            compile: CompilePolicy::default(),
            max_run_bytes: 32 * 1024 * 1024,
            heartbeat: Duration::from_millis(250),
            peer_timeout: Duration::from_secs(1),
            apply_slice: Some(DEFAULT_APPLY_SLICE),
            max_message_bytes: crate::link::DEFAULT_MAX_MESSAGE_BYTES,
            max_transaction_bytes: codec::MAX_RAW_BATCH,
        }
    }
}

/// What a receiver knows about one inbound stream, by sender store. Counters cover the
/// life of this process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboundStatus {
    pub connected: bool,
    /// Why the last Hello or batch was refused.
    pub refused: Option<String>,
    pub last_contact: Option<Instant>,
    /// When the current (or last) stream was accepted.
    pub connected_since: Option<Instant>,
    pub through_lsn: u64,
    /// Batches received and applied.
    pub batches: u64,
    /// Transactions received (including any already here, skipped).
    pub transactions: u64,
    /// Transactions received that were already here (a resend) and were skipped.
    pub transactions_skipped: u64,
    /// Row changes carried by the transactions received.
    pub row_changes: u64,
    /// Row puts and deletes written for them, in either mode. Compiled runs write one
    /// per net operation; log-order applies one per key changed in the apply (the
    /// store folds repeated changes of a key within one apply).
    pub rows_written: u64,
    /// The part of `rows_written` written by compiled runs.
    pub rows_written_compiled: u64,
    /// Applies of compiled net rows: one per backlog (or part of one between DDL).
    pub runs_compiled: u64,
    /// Applies in log order: backlogs under the threshold, compilation off, runs the
    /// compiler declared not compilable, runs partly here already.
    pub runs_in_order: u64,
    /// Short sleeps a paced apply (or the move of its flushed rows) took to give way
    /// to other work ([`ReceiverConfig::apply_slice`]).
    pub apply_pauses: u64,
    pub raw_bytes: u64,
    pub wire_bytes: u64,
    /// The target tables the current (or last) stream writes, as its Hello set them.
    pub targets: Vec<TargetInfo>,
}

/// A received table written into a target table (docs/targets.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetInfo {
    /// The source table.
    pub table: String,
    /// Its target type (`CCD NONCONDENSED`, ...).
    pub kind: String,
    /// The table written.
    pub into: String,
}
#[derive(Clone)]
pub struct ReceiverService {
    db: Database,
    config: ReceiverConfig,
    /// The elements this node subscribes to, with the epochs the control plane gives.
    epochs: watch::Receiver<BTreeMap<Ident, Epoch>>,
    /// The target of each table this store receives (`AS target [INTO table]`), as the
    /// schemes say; a stream follows what it was at its Hello.
    targets: watch::Receiver<BTreeMap<QualName, ResolvedTarget>>,
    /// What failovers forked off ([`ForkedRange`]): a record of one is refused, whoever
    /// sends it — a deposed master's commit past the fork point is never applied.
    forked: watch::Receiver<Vec<ForkedRange>>,
    status: watch::Sender<BTreeMap<Ident, InboundStatus>>,
    /// Per (origin, sender node), how far the sender's streams to this node have
    /// decided about the origin's transactions (`Batch.decided` for the sender's own,
    /// `Batch.relayed` for those it relays), shared by every stream: acks tell each
    /// sender, and a propagator that relays an origin it cannot see all of waits for
    /// it. This node's senders read it too (`SenderStart::upstream`).
    decided: DecidedMarks,
    /// Moves after every apply that moved this node's marks: a stream whose sender
    /// waits for another stream's transaction (`Batch.waiting`) is acked again then.
    applied: Arc<watch::Sender<u64>>,
    /// Log positions held for copies this node serves (`Copy`, a duplicate).
    copy_holds: Arc<crate::copy::CopyHolds>,
    /// What a copy for a scheme carries (set by the node; without it a copy carries the
    /// tables its request names).
    copy_plan: Option<crate::copy::CopyPlan>,
    /// Streams accepted and not ended, per sender node (acks list the nodes).
    connected: Arc<parking_lot::Mutex<BTreeMap<NodeId, usize>>>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl ReceiverService {
    /// A receiver applying to `db`. Stream tasks run on `tracker` and stop when
    /// `shutdown` is cancelled.
    pub fn new(
        db: Database,
        config: ReceiverConfig,
        epochs: watch::Receiver<BTreeMap<Ident, Epoch>>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            db,
            config,
            epochs,
            targets: watch::channel(BTreeMap::new()).1,
            forked: watch::channel(Vec::new()).1,
            status: watch::Sender::new(BTreeMap::new()),
            decided: DecidedMarks::default(),
            applied: Arc::new(watch::Sender::new(0)),
            copy_holds: Arc::default(),
            copy_plan: None,
            connected: Arc::default(),
            tracker,
            shutdown,
        }
    }

    /// An ack of what a stream from `sender` has applied (`marks`) through
    /// `through_lsn`, outside the apply of a backlog.
    fn ack(&self, marks: &Marks, through_lsn: u64) -> pb::ReceiverMessage {
        pb::ReceiverMessage {
            msg: Some(receiver_message::Msg::Ack(pb::Ack {
                durable: to_pb(&marks.durable),
                applied: to_pb(&marks.applied),
                through_lsn,
                connected_senders: self.connected_senders(),
                decided_paths: self.decided.to_pb(),
            })),
        }
    }

    /// The sender nodes with a stream to this node now.
    fn connected_senders(&self) -> Vec<u64> {
        self.connected.lock().keys().map(|n| n.0).collect()
    }

    /// Notes what a stream from `sender` decided: through `own` of its own commits,
    /// and as `relayed` says of the origins it relays. Whether a mark moved.
    fn note_decided(&self, sender: NodeId, own: u64, relayed: &[pb::OriginMark]) -> bool {
        let mut moved = self.decided.note(sender, sender, own);
        for m in relayed.iter().filter(|m| m.origin != sender.0) {
            moved |= self.decided.note(NodeId(m.origin), sender, m.seq);
        }
        moved
    }

    /// The marks of what each sender decided, which this node's relays read to know
    /// how much of an origin they hold (`SenderStart::upstream`).
    pub fn decided_marks(&self) -> DecidedMarks {
        self.decided.clone()
    }

    /// The log positions copies served by this node hold (the data plane releases no
    /// log past the lowest).
    /// Lets copies for a scheme (`CopyRequest.scheme`) find what they carry with `plan`.
    pub fn with_copy_plan(mut self, plan: crate::copy::CopyPlan) -> Self {
        self.copy_plan = Some(plan);
        self
    }

    /// Writes each received table as its target says (`targets`: by source table; the
    /// node feeds it from the schemes). Without it every table is a plain copy.
    pub fn with_targets(
        mut self,
        targets: watch::Receiver<BTreeMap<QualName, ResolvedTarget>>,
    ) -> Self {
        self.targets = targets;
        self
    }

    /// Refuses the records of what failovers forked off, as `forked` says from time to
    /// time (the node feeds it from the cluster state).
    pub fn with_forked(mut self, forked: watch::Receiver<Vec<ForkedRange>>) -> Self {
        self.forked = forked;
        self
    }

    pub fn copy_holds(&self) -> Arc<crate::copy::CopyHolds> {
        self.copy_holds.clone()
    }

    /// Per-sender status, for `hawser status`.
    pub fn status(&self) -> watch::Receiver<BTreeMap<Ident, InboundStatus>> {
        self.status.subscribe()
    }

    /// The tonic service to add to a server, reading and writing messages of up to
    /// [`ReceiverConfig::max_message_bytes`] (the limit its HelloReply tells senders).
    pub fn into_server(self) -> pb::replication_server::ReplicationServer<Self> {
        let max = self.config.max_message_bytes;
        pb::replication_server::ReplicationServer::new(self)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max)
    }
}

type Outbound = Pin<Box<dyn Stream<Item = Result<pb::ReceiverMessage, Status>> + Send>>;

fn refused(code: RefuseCode, reason: impl Into<String>) -> pb::ReceiverMessage {
    pb::ReceiverMessage {
        msg: Some(receiver_message::Msg::Refused(pb::Refused {
            code: code as i32,
            reason: reason.into(),
        })),
    }
}

fn to_pb(m: &BTreeMap<NodeId, u64>) -> Vec<pb::OriginMark> {
    m.iter()
        .map(|(o, s)| pb::OriginMark {
            origin: o.0,
            seq: *s,
        })
        .collect()
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// How often a stream no return service waits on flushes what it applied.
const LAZY_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(20);
/// A stream no return service waits on acks after this many batches, or this many
/// wire bytes, applied since its last ack (or at its next lazy flush, whichever comes
/// first) rather than after every batch: each ack is a message both ends handle, and
/// nothing waits on it. Well inside the sender's default window
/// ([`crate::SenderTuning`]: 32 batches, 8 MiB), so the sender never stalls on it.
const LAZY_ACK_BATCHES: usize = 8;
const LAZY_ACK_BYTES: u64 = 1 << 20;

/// [`ReceiverConfig::apply_slice`] by default: about four one-row transactions.
pub const DEFAULT_APPLY_SLICE: Duration = Duration::from_micros(60);

/// The row changes a paced apply writes at least between two chances to pause.
const PACED_ROWS: usize = 4;

/// The high-water marks a stream's acks carry, per origin.
///
/// They start from the store's marks when the stream is accepted and then follow what
/// the stream applies, so an ack costs no read of the store; the store's marks are
/// merged in again when the stream is idle (a heartbeat), for origins other streams
/// or local commits advanced. Every mark is one the store has reached, never ahead
/// of it: apply errors end the stream before they are counted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Marks {
    /// Committed here (RETURN TWOSAFE).
    applied: BTreeMap<NodeId, u64>,
    /// Committed and flushed here (RETURN RECEIPT).
    durable: BTreeMap<NodeId, u64>,
}

impl Marks {
    fn new(store: BTreeMap<NodeId, u64>) -> Self {
        Self {
            durable: store.clone(),
            applied: store,
        }
    }

    /// Raises the applied marks to `seen` where it is ahead.
    fn refresh(&mut self, seen: &BTreeMap<NodeId, u64>) {
        for (origin, seq) in seen {
            let m = self.applied.entry(*origin).or_insert(0);
            *m = (*m).max(*seq);
        }
    }
}

/// Applies `f` to `sender`'s entry, created when missing (the name is cloned only then).
fn with_status(
    m: &mut BTreeMap<Ident, InboundStatus>,
    sender: &Ident,
    f: impl FnOnce(&mut InboundStatus),
) {
    match m.get_mut(sender) {
        Some(s) => f(s),
        None => f(m.entry(sender.clone()).or_default()),
    }
}

/// Where a received table's target table stands at Hello.
enum TargetTable {
    /// It exists with the target's shape.
    Ready,
    /// It is missing: created (with this definition) before the first batch.
    Create(TableDef),
}

/// A stream that passed Hello.
struct Accepted {
    sender: Ident,
    sender_node: NodeId,
    /// A return service may wait on this stream: every apply is flushed before its ack.
    /// Otherwise applies do not wait for the flush, and durable marks follow a flush
    /// every [`LAZY_FLUSH_EVERY`].
    returns_wait: bool,
    elements: BTreeMap<Ident, Epoch>,
    /// Column maps of tables whose columns are in another order (RELAXED).
    maps: BTreeMap<QualName, Vec<usize>>,
    /// The sender's table definitions as of Hello, kept up to date with the DDL the
    /// stream carries, and how they are checked: a replicated ADD COLUMN or DROP /
    /// CREATE TABLE changes a table's column map from its next row on.
    remote: BTreeMap<QualName, TableDef>,
    /// Tables this stream drops before it creates them again in the sender's layout
    /// (`TableSpec.dropped_at`): their row changes are not applied until the drop,
    /// which would remove them.
    doomed: BTreeSet<QualName>,
    mode: TableDefinitionChecking,
    /// The sender relays an origin beside another relay of it and ships its part of
    /// a transaction split between them (`Hello.ships_parts`): one at an origin's
    /// high-water here may be the rest of it ([`ReceiverService::second_part`]).
    ships_parts: bool,
    /// The tables written into a target table (`hawser_target`): each transaction is
    /// rewritten before it is applied, and runs are applied in log order.
    targets: TargetPlan,
    /// Target tables to create before the first batch (absent at Hello).
    create: Vec<TableDef>,
}

impl Accepted {
    /// Follows a DDL record this stream just applied: the sender's definition of the
    /// table changed, and so did this node's, so its column map is computed again.
    fn follow_ddl(&mut self, db: &Database, op: &DdlOp) -> Result<(), (RefuseCode, String)> {
        let name = match op {
            DdlOp::CreateTable(def) => {
                self.remote.insert(def.name.clone(), def.clone());
                &def.name
            }
            DdlOp::DropTable(name) => {
                self.remote.remove(name);
                self.maps.remove(name);
                self.doomed.remove(name);
                return Ok(());
            }
            DdlOp::AddColumn { table, column } => {
                // Hello described the table as the sender has it now, which may
                // already include this column (this node was behind).
                if let Some(def) = self.remote.get_mut(table) {
                    if !def.columns.iter().any(|c| c.name == column.name) {
                        def.columns.push(column.clone());
                    }
                }
                table
            }
            DdlOp::CreateSequence(_) | DdlOp::DropSequence(_) => return Ok(()),
        };
        match (db.table(name), self.remote.get(name)) {
            (Some(local), Some(remote)) => match check_as_of(&local, remote, true, self.mode) {
                Ok(Some(map)) => {
                    self.maps.insert(name.clone(), map);
                }
                Ok(None) => {
                    self.maps.remove(name);
                }
                Err(e) => return Err((RefuseCode::TableMismatch, e.to_string())),
            },
            // A table the Hello did not describe: its rows arrive in this node's order.
            _ => {
                self.maps.remove(name);
            }
        }
        Ok(())
    }
}

/// [`check_table`] of this node's definition against the sender's, where the sender's
/// may be ahead: on a stream that carries DDL, columns the sender has beyond this node's
/// count were added by ADD COLUMN records this node has yet to receive (columns are
/// only ever added at the end), so the check is against the sender's table as it was
/// then — its first columns.
fn check_as_of(
    local: &TableDef,
    remote: &TableDef,
    carries_ddl: bool,
    mode: TableDefinitionChecking,
) -> Result<Option<Vec<usize>>, crate::link::TableMismatch> {
    if carries_ddl && remote.columns.len() > local.columns.len() {
        let mut then = remote.clone();
        then.columns.truncate(local.columns.len());
        return check_table(local, &then, mode);
    }
    check_table(local, remote, mode)
}

impl ReceiverService {
    /// Whether this node has yet to apply the DROP TABLE a Hello names
    /// (`TableSpec.dropped_at`).
    fn drop_ahead(&self, dropped_at: Option<&pb::OriginMark>) -> bool {
        dropped_at.is_some_and(|g| {
            self.db
                .high_water(NodeId(g.origin))
                .is_ok_and(|held| held < g.seq)
        })
    }

    /// The refusal for an apply this store cannot do, naming the store (the sender
    /// shows it as its own status).
    fn apply_failed(&self, e: &hawser_store::StoreError) -> (RefuseCode, String) {
        (
            RefuseCode::ApplyFailed,
            format!("{} cannot apply: {e}", self.config.store),
        )
    }

    fn check_hello(&self, hello: &pb::Hello) -> Result<Accepted, (RefuseCode, String)> {
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err((
                RefuseCode::Protocol,
                format!(
                    "protocol version {} is not supported (this node speaks {PROTOCOL_VERSION})",
                    hello.protocol_version
                ),
            ));
        }
        if hello.receiver_store != self.config.store.as_str() {
            return Err((
                RefuseCode::NotSubscriber,
                format!(
                    "this node is store {}, not {}",
                    self.config.store, hello.receiver_store
                ),
            ));
        }
        let me = self.db.node_id();
        if hello.receiver_node != 0 && hello.receiver_node != me.0 {
            return Err((
                RefuseCode::NotSubscriber,
                format!(
                    "this is node {me} holding store {}, not node {} that the sender's \
                     cluster state registers for it: the store was given to another node (a \
                     data directory replaced?); remove the old member and let this one \
                     rejoin and be rebuilt",
                    self.config.store, hello.receiver_node
                ),
            ));
        }
        // A store that cannot write now (its disk is full) takes no stream: its sender
        // keeps saying why until there is room.
        self.db.check_space().map_err(|e| self.apply_failed(&e))?;
        let known = self.epochs.borrow().clone();
        let mut elements = BTreeMap::new();
        for e in &hello.elements {
            let name = Ident::quoted(&e.element);
            let Some(&current) = known.get(&name) else {
                return Err((
                    RefuseCode::NotSubscriber,
                    format!(
                        "store {} does not subscribe to element {name}",
                        self.config.store
                    ),
                ));
            };
            if Epoch(e.epoch) < current {
                return Err((
                    RefuseCode::StaleEpoch,
                    format!(
                        "element {name}: the sender is at epoch {}, the cluster at {current}",
                        e.epoch
                    ),
                ));
            }
            elements.insert(name, Epoch(e.epoch));
        }
        let mode = match pb::TableCheck::try_from(hello.table_check) {
            Ok(pb::TableCheck::Exact) => TableDefinitionChecking::Exact,
            _ => TableDefinitionChecking::Relaxed,
        };
        let mut maps = BTreeMap::new();
        let mut remotes = BTreeMap::new();
        let mut doomed = BTreeSet::new();
        let mut targets = TargetPlan::default();
        let mut create = Vec::new();
        let wanted = self.targets.borrow().clone();
        for spec in &hello.tables {
            let remote: TableDef = codec::decode_table_def(&spec.definition)
                .map_err(|e| (RefuseCode::Protocol, format!("a table definition: {e}")))?;
            remotes.insert(remote.name.clone(), remote.clone());
            if let Some(target) = wanted
                .get(&remote.name)
                .filter(|t| !hawser_target::is_plain(&remote.name, t))
            {
                if let TargetTable::Create(def) =
                    self.check_target(&remote, target, &mut targets)?
                {
                    create.push(def);
                }
                if !hawser_target::keeps_copy(&remote.name, target) {
                    continue;
                }
                // A BASE AGGREGATE's source rows: a plain copy, checked as one below.
            }
            let Some(local) = self.db.table(&remote.name) else {
                if hello.carries_ddl || spec.completing {
                    // A DATASTORE element's stream creates the table before its rows;
                    // a completing table is a sibling stream's (which may create it).
                    continue;
                }
                return Err((
                    RefuseCode::TableMismatch,
                    format!(
                        "table {} does not exist on store {}",
                        remote.name, self.config.store
                    ),
                ));
            };
            match check_as_of(&local, &remote, hello.carries_ddl, mode) {
                Ok(Some(map)) => {
                    maps.insert(remote.name.clone(), map);
                }
                Ok(None) => {}
                Err(_) if hello.carries_ddl && self.drop_ahead(spec.dropped_at.as_ref()) => {
                    // The stream drops this node's table before any row of the
                    // sender's new layout: its rows until then are not applied (the
                    // drop removes them), so how this node has the table does not
                    // matter, and the CREATE after the drop is checked as it comes
                    // (`Accepted::follow_ddl`).
                    remotes.remove(&remote.name);
                    doomed.insert(remote.name.clone());
                }
                Err(e) => return Err((RefuseCode::TableMismatch, e.to_string())),
            }
        }
        Ok(Accepted {
            sender: Ident::quoted(&hello.sender_store),
            sender_node: NodeId(hello.sender_node),
            returns_wait: hello.returns_wait,
            elements,
            maps,
            remote: remotes,
            doomed,
            mode,
            ships_parts: hello.ships_parts,
            targets,
            create,
        })
    }

    /// How `remote` is written into `target`'s table here: that table has the shape
    /// the target needs (or is refused, naming what differs), or is created before the
    /// first batch. The target is added to `plan`.
    fn check_target(
        &self,
        remote: &TableDef,
        target: &ResolvedTarget,
        plan: &mut TargetPlan,
    ) -> Result<TargetTable, (RefuseCode, String)> {
        let refused = |e: TargetError| {
            (
                RefuseCode::TableMismatch,
                format!("store {}: {e}", self.config.store),
            )
        };
        let expected = hawser_target::shape(remote, target).map_err(refused)?;
        plan.add(remote.clone(), target.clone()).map_err(refused)?;
        match self.db.table(&expected.name) {
            Some(local) => {
                hawser_target::check_shape(&local, &expected).map_err(refused)?;
                Ok(TargetTable::Ready)
            }
            None => Ok(TargetTable::Create(expected)),
        }
    }

    /// Creates the target tables a stream's Hello found missing. Another stream may
    /// create one first: then it is checked as Hello would have.
    async fn create_targets(&self, accepted: &mut Accepted) -> Result<(), (RefuseCode, String)> {
        for def in std::mem::take(&mut accepted.create) {
            if let Some(local) = self.db.table(&def.name) {
                hawser_target::check_shape(&local, &def).map_err(|e| {
                    (
                        RefuseCode::TableMismatch,
                        format!("store {}: {e}", self.config.store),
                    )
                })?;
                continue;
            }
            let name = def.name.clone();
            match self.db.create_table(def.clone()).await {
                Ok(_) => info!(table = %name, "created a target table"),
                Err(e) if self.db.table(&name).is_some() => {
                    debug!(table = %name, error = %e, "a target table was created meanwhile");
                }
                Err(e) => return Err(self.apply_failed(&e)),
            }
        }
        Ok(())
    }

    /// Changes `sender`'s status and wakes the watch's waiters (connection, refusal).
    fn update_status(&self, sender: &Ident, f: impl FnOnce(&mut InboundStatus)) {
        self.status.send_modify(|m| with_status(m, sender, f));
    }

    /// Changes `sender`'s counters in place: readers see them, waiters are not woken
    /// (they change with every message).
    fn update_counters(&self, sender: &Ident, f: impl FnOnce(&mut InboundStatus)) {
        self.status.send_if_modified(|m| {
            with_status(m, sender, f);
            false
        });
    }

    /// Serves one accepted stream until it ends, is refused or is cancelled.
    ///
    /// The stream is read ahead of the apply into a bounded queue, so batches the
    /// sender has in flight reach this node (and release HTTP/2 flow-control window)
    /// while a run applies: they are the backlog the next apply sees.
    async fn serve(
        self,
        accepted: Accepted,
        inbound: Streaming<pb::SenderMessage>,
        out: mpsc::Sender<Result<pb::ReceiverMessage, Status>>,
    ) {
        let _connected = Connected::new(&self.connected, accepted.sender_node);
        let (queue_tx, queue) = mpsc::channel(READ_AHEAD);
        let stop = self.shutdown.child_token();
        let joiner = Joiner::new(self.config.max_transaction_bytes);
        let reader = read_ahead(inbound, queue_tx, joiner, stop.clone());
        let apply = async {
            self.apply_stream(accepted, queue, out).await;
            stop.cancel();
        };
        tokio::join!(reader, apply);
    }

    /// Applies what the reader queued, acknowledging each backlog, until the stream
    /// ends, is refused or is cancelled.
    async fn apply_stream(
        &self,
        mut accepted: Accepted,
        mut queue: mpsc::Receiver<Inbound>,
        out: mpsc::Sender<Result<pb::ReceiverMessage, Status>>,
    ) {
        let sender = accepted.sender.clone();
        let metrics = InboundMetrics::new(&sender);
        // Nobody waits on this stream's applies: they give way to other work now and
        // then, unless the stream is behind.
        let mut pacer = self
            .config
            .apply_slice
            .filter(|_| !accepted.returns_wait)
            .map(Pacer::new);
        let mut marks = Marks::new(self.db.high_waters().unwrap_or_default());
        let mut heartbeat = tokio::time::interval(self.config.heartbeat);
        let mut lazy_flush = tokio::time::interval(LAZY_FLUSH_EVERY);
        lazy_flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_through = 0u64;
        // The sender waits for another stream's transaction (`Batch.waiting`): acked
        // again, unasked, whenever another stream's apply moves the marks.
        let mut waiting = false;
        let mut moved = self.applied.subscribe();
        // Batches and wire bytes applied on a lazy stream since its last ack.
        let mut unacked_batches = 0usize;
        let mut unacked_bytes = 0u64;
        let mut last_contact = Instant::now();
        // A message read while gathering a backlog that is not a batch: handled next.
        let mut carried = None;
        loop {
            let msg = match carried.take() {
                Some(msg) => msg,
                None => tokio::select! {
                    biased;
                    _ = self.shutdown.cancelled() => break,
                    _ = lazy_flush.tick(), if marks.durable != marks.applied || unacked_batches > 0 => {
                        // Applied without waiting for the flush (no return service on
                        // this stream): one flush covers them all, then the durable
                        // marks catch up, and one ack answers every batch since the
                        // last.
                        let applied = marks.applied.clone();
                        let flushed = match pacer.as_mut().filter(|_| queue.is_empty()) {
                            Some(p) => {
                                let before = p.pauses();
                                let r = self.db.flush_paced(p).await;
                                self.count_pauses(&sender, &metrics, p.pauses() - before);
                                r
                            }
                            None => self.db.flush().await,
                        };
                        if let Err(e) = flushed {
                            warn!(sender = %sender, error = %e, "flush failed; dropping the stream");
                            break;
                        }
                        marks.durable = applied;
                        unacked_batches = 0;
                        unacked_bytes = 0;
                        let ack = self.ack(&marks, last_through);
                        if out.send(Ok(ack)).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    Ok(()) = moved.changed(), if waiting => {
                        if let Ok(now) = self.db.high_waters() {
                            marks.refresh(&now);
                        }
                        let ack = self.ack(&marks, last_through);
                        if out.send(Ok(ack)).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    _ = heartbeat.tick() => {
                        if last_contact.elapsed() > self.config.peer_timeout {
                            info!(sender = %sender, "sender silent past the peer timeout; dropping the stream");
                            break;
                        }
                        send_heartbeat(&out);
                        if let Ok(now) = self.db.high_waters() {
                            marks.refresh(&now);
                        }
                        continue;
                    }
                    msg = queue.recv() => match msg {
                        Some(msg) => msg,
                        // The reader stopped: shutdown.
                        None => break,
                    },
                },
            };
            let msg = match msg {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(status) if unreadable(&status) => {
                    // The sender sends it again at every attempt: both ends say why.
                    let reason = format!(
                        "store {} could not take a message of the stream: {} (its limits: \
                         {} bytes a message, --max-message-bytes; {} bytes a batch in chunks)",
                        self.config.store,
                        status.message(),
                        self.config.max_message_bytes,
                        self.config.max_transaction_bytes,
                    );
                    warn!(sender = %sender, code = ?status.code(), reason = %reason, "refusing the stream");
                    self.update_status(&sender, |s| s.refused = Some(reason.clone()));
                    let _ = out.send(Ok(refused(RefuseCode::Protocol, reason))).await;
                    break;
                }
                Err(status) => {
                    debug!(sender = %sender, %status, "inbound stream failed");
                    break;
                }
            };
            last_contact = Instant::now();
            self.update_counters(&sender, |s| s.last_contact = Some(last_contact));
            match msg.msg {
                Some(sender_message::Msg::Batch(batch)) => {
                    let mut backlog = vec![batch];
                    if self.config.compile.enabled {
                        carried =
                            gather_backlog(&mut queue, &mut backlog, self.config.max_run_bytes);
                    }
                    // Paced only when nothing more is queued: a stream that is behind
                    // catches up at full speed.
                    let mut paced = pacer
                        .as_mut()
                        .filter(|_| carried.is_none() && queue.is_empty());
                    let pauses_before = paced.as_ref().map_or(0, |p| p.pauses());
                    let applied = {
                        let apply = self.apply_backlog(
                            &mut accepted,
                            &backlog,
                            &mut marks,
                            paced.as_deref_mut(),
                        );
                        tokio::pin!(apply);
                        // Heartbeats go on while a long run applies, or the sender
                        // would take this receiver for dead and start over.
                        loop {
                            tokio::select! {
                                biased;
                                r = &mut apply => break r,
                                _ = heartbeat.tick() => send_heartbeat(&out),
                            }
                        }
                    };
                    if let Some(p) = paced {
                        self.count_pauses(&sender, &metrics, p.pauses() - pauses_before);
                    }
                    // Time spent applying is not the sender's silence: its messages
                    // are waiting unread.
                    last_contact = Instant::now();
                    match applied {
                        Ok(done) => {
                            let wire: u64 = backlog.iter().map(|b| b.payload.len() as u64).sum();
                            let raw: u64 = backlog.iter().map(|b| b.raw_bytes).sum();
                            metrics.record(&done.tally);
                            self.update_counters(&sender, |s| {
                                let t = &done.tally;
                                s.through_lsn = done.ack.through_lsn;
                                s.batches += backlog.len() as u64;
                                s.transactions += t.transactions;
                                s.transactions_skipped += t.skipped;
                                s.row_changes += t.row_changes;
                                s.rows_written += t.rows_compiled + t.rows_in_order;
                                s.rows_written_compiled += t.rows_compiled;
                                s.runs_compiled += t.runs_compiled;
                                s.runs_in_order += t.runs_in_order;
                                s.raw_bytes += raw;
                                s.wire_bytes += wire;
                            });
                            last_through = done.ack.through_lsn;
                            // Streams waiting for another's transaction hear of it, and
                            // of decisions they may wait for.
                            if done.decided_moved || backlog.iter().any(|b| b.count > 0) {
                                self.applied.send_modify(|n| *n = n.wrapping_add(1));
                            }
                            waiting = backlog.last().is_some_and(|b| b.waiting);
                            if waiting {
                                // Answered below; later moves are news.
                                moved.mark_unchanged();
                            }
                            // Nobody waits on a lazy stream's acks: they free the
                            // sender's window and report progress, so one answers
                            // several batches (and the lazy flush acks the rest).
                            unacked_batches += backlog.len();
                            unacked_bytes += wire;
                            if accepted.returns_wait
                                || waiting
                                || unacked_batches >= LAZY_ACK_BATCHES
                                || unacked_bytes >= LAZY_ACK_BYTES
                            {
                                unacked_batches = 0;
                                unacked_bytes = 0;
                                let ack = pb::ReceiverMessage {
                                    msg: Some(receiver_message::Msg::Ack(done.ack)),
                                };
                                if out.send(Ok(ack)).await.is_err() {
                                    break;
                                }
                            }
                            if accepted.returns_wait {
                                // The apply's flush left its housekeeping: done once
                                // the ack is on its way (the yield lets the response
                                // stream's tasks write it first), before the next
                                // batch can arrive.
                                tokio::task::yield_now().await;
                                if let Err(e) = self.db.settle() {
                                    warn!(sender = %sender, error = %e, "settling the apply failed; dropping the stream");
                                    break;
                                }
                            }
                        }
                        Err((code, reason)) => {
                            warn!(sender = %sender, reason = %reason, "refusing the stream");
                            self.update_status(&sender, |s| s.refused = Some(reason.clone()));
                            let _ = out.send(Ok(refused(code, reason))).await;
                            break;
                        }
                    }
                }
                Some(sender_message::Msg::Heartbeat(_)) => {}
                Some(sender_message::Msg::Hello(_)) | None => {
                    let _ = out
                        .send(Ok(refused(
                            RefuseCode::Protocol,
                            "Hello may only come first",
                        )))
                        .await;
                    break;
                }
            }
        }
        self.update_status(&sender, |s| s.connected = false);
    }

    fn count_pauses(&self, sender: &Ident, metrics: &InboundMetrics, pauses: u64) {
        if pauses > 0 {
            metrics.pauses.increment(pauses);
            self.update_counters(sender, |s| s.apply_pauses += pauses);
        }
    }

    /// Applies a backlog of batches (log order across them) and builds the Ack that
    /// answers all of them; in slices with pauses between them when `pacer` is given.
    async fn apply_backlog(
        &self,
        accepted: &mut Accepted,
        backlog: &[pb::Batch],
        marks: &mut Marks,
        mut pacer: Option<&mut Pacer>,
    ) -> Result<Applied, (RefuseCode, String)> {
        // Epochs are checked on every batch: a master change since Hello makes this
        // sender stale from that moment on.
        {
            let known = self.epochs.borrow();
            for (element, epoch) in &accepted.elements {
                match known.get(element) {
                    Some(current) if current > epoch => {
                        return Err((
                            RefuseCode::StaleEpoch,
                            format!(
                                "element {element}: the sender is at epoch {epoch}, the cluster now at {current}"
                            ),
                        ))
                    }
                    None => {
                        return Err((
                            RefuseCode::NotSubscriber,
                            format!("store {} no longer subscribes to element {element}", self.config.store),
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
        let Some(through_lsn) = backlog.last().map(|b| b.through_lsn) else {
            return Err((RefuseCode::Protocol, "an empty backlog".into()));
        };
        let count: u64 = backlog.iter().map(|b| u64::from(b.count)).sum();
        let bytes: u64 = backlog.iter().map(|b| b.raw_bytes).sum();
        let compiles = self.config.compile.compiles(count, bytes);
        let failed = |e: hawser_store::StoreError| self.apply_failed(&e);
        let mut tally = Tally::default();
        let mut run: Vec<ReplicatedTxn> = Vec::new();
        let mut all_durable = true;
        // The highest seq of each origin in the backlog: applied (or found here
        // already) once every run below has returned.
        let mut received: BTreeMap<NodeId, u64> = BTreeMap::new();
        let forked = self.forked.borrow().clone();
        for batch in backlog {
            for r in decode_batch(batch)? {
                let gtid = r.entry.gtid();
                if let Some(f) = forked.iter().find(|f| f.holds(r.epoch, &r.entry)) {
                    return Err((
                        RefuseCode::StaleEpoch,
                        format!(
                            "record {gtid} was committed under failover era {} by a deposed \
                             master after the fork point (seq {}, era {}): a failover forked it off",
                            r.epoch, f.after_seq, f.before_epoch
                        ),
                    ));
                }
                let seq = received.entry(gtid.origin).or_insert(0);
                *seq = (*seq).max(gtid.seq);
                match r.entry {
                    LogEntry::Txn(mut txn) => {
                        if !accepted.doomed.is_empty() {
                            txn.changes.retain(|c| !accepted.doomed.contains(&c.table));
                        }
                        for c in &mut txn.changes {
                            if let Some(map) = accepted.maps.get(&c.table) {
                                for row in [&mut c.before, &mut c.after].into_iter().flatten() {
                                    *row = remap(row, map).ok_or_else(|| {
                                        (
                                            RefuseCode::Protocol,
                                            format!(
                                                "transaction {}: a row of {} has too few values",
                                                txn.gtid, c.table
                                            ),
                                        )
                                    })?;
                                }
                            }
                        }
                        // Into the target tables (the names the log here records).
                        let mut txn = accepted.targets.rewrite(txn, r.epoch).map_err(|e| {
                            (
                                RefuseCode::TableMismatch,
                                format!("store {}: {e}", self.config.store),
                            )
                        })?;
                        tally.transactions += 1;
                        tally.row_changes += txn.changes.len() as u64;
                        if accepted.ships_parts && join_part(&mut run, &mut txn) {
                            // The sender's log holds the transaction in two parts
                            // (it got them from two relays): one transaction here.
                            continue;
                        }
                        if let Some(part) = self.second_part(accepted, &txn).map_err(failed)? {
                            // The rest of a transaction that came in parts: after what
                            // came before it, on its own.
                            all_durable &= self
                                .apply_run(
                                    accepted,
                                    std::mem::take(&mut run),
                                    compiles,
                                    &mut tally,
                                    pacer.as_deref_mut(),
                                )
                                .await?;
                            let part = ReplicatedTxn {
                                txn: part,
                                epoch: r.epoch,
                            };
                            let info = self
                                .db
                                .apply_part(part, !accepted.returns_wait)
                                .await
                                .map_err(failed)?;
                            all_durable &= info.durable;
                            tally.runs_in_order += 1;
                            tally.rows_in_order += info.rows_written;
                            continue;
                        }
                        run.push(ReplicatedTxn {
                            txn,
                            epoch: r.epoch,
                        });
                    }
                    entry @ (LogEntry::Ddl { .. } | LogEntry::SequenceBlock { .. }) => {
                        all_durable &= self
                            .apply_run(
                                accepted,
                                std::mem::take(&mut run),
                                compiles,
                                &mut tally,
                                pacer.as_deref_mut(),
                            )
                            .await?;
                        self.db
                            .apply_replicated_ddl(&entry, r.epoch)
                            .await
                            .map_err(failed)?;
                        if let LogEntry::Ddl { op, .. } = &entry {
                            accepted.follow_ddl(&self.db, op)?;
                        }
                    }
                }
            }
        }
        all_durable &= self
            .apply_run(accepted, run, compiles, &mut tally, pacer)
            .await?;
        marks.refresh(&received);
        if count == 0 {
            // A record-less batch: the sender is asking where this store stands (it
            // waits for a transaction another stream carries). The store's marks answer
            // it; they say nothing of durability, so the durable marks stay.
            if let Ok(now) = self.db.high_waters() {
                marks.refresh(&now);
            }
        } else if all_durable {
            // Everything applied so far was flushed: the durable marks catch up.
            marks.durable.clone_from(&marks.applied);
        }
        // Applied (or found here) through these batches: what they decided holds now.
        let mut decided_moved = false;
        for b in backlog {
            decided_moved |= self.note_decided(accepted.sender_node, b.decided, &b.relayed);
        }
        Ok(Applied {
            ack: pb::Ack {
                durable: to_pb(&marks.durable),
                applied: to_pb(&marks.applied),
                through_lsn,
                connected_senders: self.connected_senders(),
                decided_paths: self.decided.to_pb(),
            },
            tally,
            decided_moved,
        })
    }

    /// What of `txn` is the rest of a transaction that reached this store in parts:
    /// two propagators relaying one origin's tables to this store each ship their own
    /// part of a transaction that writes tables of both (docs/stream.md, "Two blind
    /// relays"), and the part applied first made its seq the origin's high-water here.
    /// The changes of tables that the records of it here do not write, when its seq is
    /// that high-water and there are any; `None` otherwise (below the high-water, a
    /// resend, skipped as a duplicate; above it, a transaction of its own). A resend of
    /// a part is found here whole and skipped too. Only from a relay that ships parts
    /// (`Hello.ships_parts`): from any other stream a transaction at the high-water is
    /// a resend — and a resend's delete of a row that was missing here, which left no
    /// change in the record, must not delete a row written here since.
    fn second_part(
        &self,
        accepted: &Accepted,
        txn: &Transaction,
    ) -> Result<Option<Transaction>, StoreError> {
        /// Log records looked back over for the parts here: the first part is applied
        /// just before the second, unless transactions of other origins came between.
        const LOOK_BACK: usize = 4096;
        let gtid = txn.gtid;
        if !accepted.ships_parts
            || gtid.origin == accepted.sender_node
            || gtid.origin == self.db.node_id()
            || gtid.seq != self.db.high_water(gtid.origin)?
        {
            return Ok(None);
        }
        let Some(here) = self.db.tables_of(gtid, LOOK_BACK)? else {
            debug!(%gtid, "the newest transaction of its origin is not in the recent log; skipped");
            return Ok(None);
        };
        let rest: Vec<_> = txn
            .changes
            .iter()
            .filter(|c| !here.contains(&c.table))
            .cloned()
            .collect();
        Ok((!rest.is_empty()).then_some(Transaction {
            gtid,
            commit_micros: txn.commit_micros,
            changes: rest,
        }))
    }

    /// Applies a run in log order, waiting for its flush unless `lazy`.
    async fn apply_in_order(
        &self,
        run: Vec<ReplicatedTxn>,
        lazy: bool,
    ) -> Result<hawser_store::ApplyInfo, hawser_store::StoreError> {
        if lazy {
            self.db.apply_replicated_lazily(run).await
        } else {
            self.db.apply_replicated(run).await
        }
    }

    /// Applies a lazy run in log order in slices of at least [`PACED_ROWS`] row
    /// changes, letting `pacer` pause between them.
    async fn apply_paced(
        &self,
        mut run: Vec<ReplicatedTxn>,
        pacer: &mut Pacer,
    ) -> Result<hawser_store::ApplyInfo, hawser_store::StoreError> {
        /// The first of `run`'s transactions that make a slice.
        fn slice_len(run: &[ReplicatedTxn]) -> usize {
            let mut rows = 0;
            run.iter()
                .position(|r| {
                    rows += r.txn.changes.len();
                    rows >= PACED_ROWS
                })
                .map_or(run.len(), |i| i + 1)
        }
        pacer.start();
        let rest = run.split_off(slice_len(&run));
        let mut total = self.db.apply_replicated_lazily(run).await?;
        let mut run = rest;
        while !run.is_empty() {
            pacer.tick();
            let rest = run.split_off(slice_len(&run));
            let info = self.db.apply_replicated_lazily(run).await?;
            run = rest;
            total.applied += info.applied;
            total.skipped += info.skipped;
            total.row_changes += info.row_changes;
            total.rows_written += info.rows_written;
            total.last_lsn = total.last_lsn.max(info.last_lsn);
            total.durable &= info.durable;
            total.high_water = info.high_water;
        }
        Ok(total)
    }

    /// Applies one run of transactions as RTL net rows (`compiles`) or in log order
    /// (paced by `pacer`, when given and the stream is lazy), and counts what was
    /// written. Returns whether the apply was flushed.
    async fn apply_run(
        &self,
        accepted: &Accepted,
        run: Vec<ReplicatedTxn>,
        compiles: bool,
        tally: &mut Tally,
        pacer: Option<&mut Pacer>,
    ) -> Result<bool, (RefuseCode, String)> {
        if run.is_empty() {
            return Ok(true);
        }
        let failed = |e: hawser_store::StoreError| self.apply_failed(&e);
        let lazy = !accepted.returns_wait;
        // Transactions a duplicate's copy may reflect in part go in log order, and so
        // do target tables': a noncondensed CCD keeps every change, which compilation
        // would net away.
        let compiles = compiles
            && accepted.targets.is_empty()
            && !run
                .iter()
                .any(|r| r.txn.gtid.seq <= self.db.in_order_through(r.txn.gtid.origin));
        let info = if compiles {
            let catalog: Vec<TableDef> = self.db.tables().iter().map(|t| (**t).clone()).collect();
            // Compilation is CPU work proportional to the run: off the async workers.
            let (run, compiled) = tokio::task::spawn_blocking(move || {
                let compiled = compile_run(&run, &catalog);
                (run, compiled)
            })
            .await
            .map_err(|e| {
                (
                    RefuseCode::ApplyFailed,
                    format!("the RTL compiler failed: {e}"),
                )
            })?;
            match compiled {
                Ok(compiled) if lazy => self.db.apply_compiled_lazily(&run, &compiled).await,
                Ok(compiled) => self.db.apply_compiled(&run, &compiled).await,
                // A run the compiler cannot read (a change without the image it
                // needs) is applied in log order, which reports the problem precisely
                // if it is real.
                Err(e) => {
                    debug!(error = %e, "run not read by the compiler; applying in log order");
                    self.apply_in_order(run, lazy).await
                }
            }
        } else {
            match pacer.filter(|_| lazy) {
                Some(pacer) => self.apply_paced(run, pacer).await,
                None => self.apply_in_order(run, lazy).await,
            }
        }
        .map_err(failed)?;
        tally.skipped += info.skipped;
        if info.compiled {
            tally.runs_compiled += 1;
            tally.rows_compiled += info.rows_written;
        } else {
            tally.runs_in_order += 1;
            tally.rows_in_order += info.rows_written;
        }
        Ok(info.durable)
    }
}

/// Joins `txn` to the run's transaction with the same Gtid, when the run's last one of
/// its origin is that: a sender that got a transaction in two parts ships both records
/// (`Hello.ships_parts`), and a batch must not hold one Gtid twice. The changes of
/// tables the first part lacks are added to it (a part's tables are its own); whether
/// they were.
fn join_part(run: &mut [ReplicatedTxn], txn: &mut Transaction) -> bool {
    let origin = txn.gtid.origin;
    let Some(first) = run.iter_mut().rev().find(|r| r.txn.gtid.origin == origin) else {
        return false;
    };
    if first.txn.gtid != txn.gtid {
        return false;
    }
    let have: BTreeSet<QualName> = first.txn.changes.iter().map(|c| c.table.clone()).collect();
    first.txn.changes.extend(
        std::mem::take(&mut txn.changes)
            .into_iter()
            .filter(|c| !have.contains(&c.table)),
    );
    true
}

fn compile_run(run: &[ReplicatedTxn], catalog: &[TableDef]) -> Result<Compilation, CompileError> {
    let mut compiler = Compiler::new(catalog);
    for r in run {
        compiler.push_transaction(&r.txn)?;
    }
    Ok(compiler.finish())
}

/// Decompresses and decodes one batch.
fn decode_batch(batch: &pb::Batch) -> Result<Vec<codec::WireRecord>, (RefuseCode, String)> {
    let proto = |e: codec::CodecError| {
        (
            RefuseCode::Protocol,
            format!("batch through LSN {}: {e}", batch.through_lsn),
        )
    };
    let Some(codec) = crate::codec_from_pb(batch.codec) else {
        return Err((
            RefuseCode::Protocol,
            format!("unknown codec {}", batch.codec),
        ));
    };
    let raw = decompress(codec, &batch.payload, batch.raw_bytes).map_err(proto)?;
    decode_records(&raw).map_err(proto)
}

/// Messages queued by [`read_ahead`]: a message, the end of the stream, or its error.
type Inbound = Result<Option<pb::SenderMessage>, Status>;

/// Messages read ahead of the apply at most: room for a sender's whole in-flight
/// window (32 batches by default) and its heartbeats. A full queue stops reading, and
/// HTTP/2 flow control then stops the sender.
const READ_AHEAD: usize = 64;

/// Reads `inbound` into `queue` until the stream ends or fails (queued too) or `stop`.
///
/// Chunks of a batch are joined here (`joiner`), so that the apply sees whole batches
/// only, and a stream that ends between two chunks drops the ones it had. A chunk that
/// does not complete its batch is queued as a heartbeat: the apply hears from the
/// sender while a large transaction arrives, and does not take it for dead.
async fn read_ahead(
    mut inbound: Streaming<pb::SenderMessage>,
    queue: mpsc::Sender<Inbound>,
    mut joiner: Joiner,
    stop: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            msg = inbound.message() => msg,
        };
        // A drill's partition: the stream ends as if the sender had gone.
        let msg = if hawser_core::isolation::isolated() {
            Err(Status::unavailable(hawser_core::isolation::REFUSAL))
        } else {
            msg
        };
        let msg = match msg {
            Ok(Some(pb::SenderMessage {
                msg: Some(sender_message::Msg::Batch(batch)),
            })) => match joiner.push(batch) {
                Ok(Some(whole)) => Ok(Some(pb::SenderMessage {
                    msg: Some(sender_message::Msg::Batch(whole)),
                })),
                Ok(None) => Ok(Some(pb::SenderMessage {
                    msg: Some(sender_message::Msg::Heartbeat(pb::Heartbeat {
                        sent_micros: 0,
                    })),
                })),
                Err(e) => Err(Status::invalid_argument(e.to_string())),
            },
            other => other,
        };
        let last = !matches!(msg, Ok(Some(_)));
        let queued = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            queued = queue.send(msg) => queued,
        };
        if queued.is_err() || last {
            break;
        }
    }
}

/// Moves every batch already queued into `backlog` without waiting for more, until the
/// backlog holds `max_bytes`. Heartbeats are dropped (the caller has just heard from
/// the sender); any other message, the end of the stream or an error is returned for
/// the caller to handle after the backlog.
fn gather_backlog(
    queue: &mut mpsc::Receiver<Inbound>,
    backlog: &mut Vec<pb::Batch>,
    max_bytes: u64,
) -> Option<Inbound> {
    let size = |b: &pb::Batch| b.raw_bytes.max(b.payload.len() as u64);
    let mut bytes: u64 = backlog.iter().map(size).sum();
    while bytes < max_bytes {
        // Empty: nothing more has arrived. Disconnected: the reader stopped, which the
        // caller's next receive sees.
        match queue.try_recv().ok()? {
            Ok(Some(pb::SenderMessage {
                msg: Some(sender_message::Msg::Batch(b)),
            })) => {
                bytes += size(&b);
                backlog.push(b);
            }
            Ok(Some(pb::SenderMessage {
                msg: Some(sender_message::Msg::Heartbeat(_)),
            })) => {}
            other => return Some(other),
        }
    }
    None
}

/// Whether a failed read of the stream is the sender's message, not the connection: too
/// large for this node's limit, not decodable, or chunks that do not join. The sender
/// would send it again at every attempt, so it is refused with the reason.
fn unreadable(status: &Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::OutOfRange
            | Code::Internal
            | Code::InvalidArgument
            | Code::ResourceExhausted
            | Code::DataLoss
    )
}

/// Best effort: a full channel means acks are queued, which says as much.
fn send_heartbeat(out: &mpsc::Sender<Result<pb::ReceiverMessage, Status>>) {
    let _ = out.try_send(Ok(pb::ReceiverMessage {
        msg: Some(receiver_message::Msg::Heartbeat(pb::Heartbeat {
            sent_micros: now_micros(),
        })),
    }));
}

/// One accepted stream of a sender node, counted while it lasts.
struct Connected {
    map: Arc<parking_lot::Mutex<BTreeMap<NodeId, usize>>>,
    node: NodeId,
}

impl Connected {
    fn new(map: &Arc<parking_lot::Mutex<BTreeMap<NodeId, usize>>>, node: NodeId) -> Self {
        *map.lock().entry(node).or_insert(0) += 1;
        Self {
            map: map.clone(),
            node,
        }
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        let mut map = self.map.lock();
        if let Some(n) = map.get_mut(&self.node) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.node);
            }
        }
    }
}

/// What one backlog's apply did.
struct Applied {
    ack: pb::Ack,
    tally: Tally,
    /// A sender's decision moved a mark (`DecidedMarks`).
    decided_moved: bool,
}

/// Counts of one backlog's apply.
#[derive(Debug, Default)]
struct Tally {
    transactions: u64,
    skipped: u64,
    row_changes: u64,
    rows_compiled: u64,
    rows_in_order: u64,
    runs_compiled: u64,
    runs_in_order: u64,
}

/// The stream's counters, labelled by sender store (one series per store of the
/// cluster) and, for writes, by apply mode.
struct InboundMetrics {
    transactions: metrics::Counter,
    row_changes: metrics::Counter,
    rows_compiled: metrics::Counter,
    rows_in_order: metrics::Counter,
    runs_compiled: metrics::Counter,
    runs_in_order: metrics::Counter,
    pauses: metrics::Counter,
}

impl InboundMetrics {
    fn new(sender: &Ident) -> Self {
        metrics::describe_counter!(
            "hawser_stream_received_transactions_total",
            "replicated transactions received, by sender store"
        );
        metrics::describe_counter!(
            "hawser_stream_received_row_changes_total",
            "row changes carried by the replicated transactions received, by sender store"
        );
        metrics::describe_counter!(
            "hawser_stream_rows_written_total",
            "row puts and deletes written for received transactions, by sender store and \
             apply mode (compiled net rows or log order)"
        );
        metrics::describe_counter!(
            "hawser_stream_apply_runs_total",
            "applies of received transactions, by sender store and apply mode"
        );
        metrics::describe_counter!(
            "hawser_stream_apply_pauses_total",
            "short sleeps a paced apply took to give way to other work, by sender store"
        );
        let s = sender.as_str().to_string();
        Self {
            pauses: metrics::counter!("hawser_stream_apply_pauses_total", "sender" => s.clone()),
            transactions: metrics::counter!("hawser_stream_received_transactions_total", "sender" => s.clone()),
            row_changes: metrics::counter!("hawser_stream_received_row_changes_total", "sender" => s.clone()),
            rows_compiled: metrics::counter!("hawser_stream_rows_written_total", "sender" => s.clone(), "mode" => "compiled"),
            rows_in_order: metrics::counter!("hawser_stream_rows_written_total", "sender" => s.clone(), "mode" => "log"),
            runs_compiled: metrics::counter!("hawser_stream_apply_runs_total", "sender" => s.clone(), "mode" => "compiled"),
            runs_in_order: metrics::counter!("hawser_stream_apply_runs_total", "sender" => s, "mode" => "log"),
        }
    }

    fn record(&self, t: &Tally) {
        self.transactions.increment(t.transactions);
        self.row_changes.increment(t.row_changes);
        self.rows_compiled.increment(t.rows_compiled);
        self.rows_in_order.increment(t.rows_in_order);
        self.runs_compiled.increment(t.runs_compiled);
        self.runs_in_order.increment(t.runs_in_order);
    }
}

fn remap(row: &[hawser_core::Value], map: &[usize]) -> Option<Vec<hawser_core::Value>> {
    map.iter().map(|&j| row.get(j).cloned()).collect()
}

/// The most commits either side lists for a restart check (12 bytes each on the
/// wire): a receiver holding more past the restart point than that is refused.
pub(crate) const PROBE_LIMIT: usize = 65_536;

impl ReceiverService {
    /// The answer to a sender's restart probe: the commits of its origin this store
    /// holds past the probed seq, and whether that is all of them.
    async fn held_after(
        &self,
        probe: pb::RestartProbe,
    ) -> Result<(Vec<pb::HeldCommit>, bool), Status> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            let origin = NodeId(probe.origin);
            db.commits_after(origin, probe.after_seq, u64::MAX, PROBE_LIMIT, |r| {
                pb::HeldCommit {
                    seq: r.gtid().seq,
                    commit_micros: r.entry.commit_micros(),
                }
            })
        })
        .await
        .map_err(|e| Status::internal(format!("reading the log: {e}")))?
        .map_err(|e| Status::unavailable(e.to_string()))
    }
}

#[tonic::async_trait]
impl pb::replication_server::Replication for ReceiverService {
    type ReplicateStream = Outbound;
    type CopyStream = tokio_stream::wrappers::ReceiverStream<Result<pb::CopyMessage, Status>>;

    async fn copy(
        &self,
        request: Request<pb::CopyRequest>,
    ) -> Result<Response<Self::CopyStream>, Status> {
        let request = request.into_inner();
        tracing::info!(
            receiver = %request.receiver_store,
            scheme = %request.scheme,
            tables = request.tables.len(),
            "copying tables for a duplicate"
        );
        crate::copy::serve(
            self.db.clone(),
            self.copy_holds.clone(),
            self.copy_plan.as_ref(),
            request,
        )
        .map(Response::new)
    }

    async fn replicate(
        &self,
        request: Request<Streaming<pb::SenderMessage>>,
    ) -> Result<Response<Self::ReplicateStream>, Status> {
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(self.config.peer_timeout, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Hello within the peer timeout"))??;
        let Some(pb::SenderMessage {
            msg: Some(sender_message::Msg::Hello(hello)),
        }) = first
        else {
            return Err(Status::invalid_argument("the first message must be Hello"));
        };
        // Room for every batch a sender may have in flight plus heartbeats, so acks
        // never wait behind a full channel.
        let (tx, rx) = mpsc::channel(256);
        let sender = Ident::quoted(&hello.sender_store);
        let checked = match self.check_hello(&hello) {
            Ok(mut accepted) => self.create_targets(&mut accepted).await.map(|()| accepted),
            Err(refusal) => Err(refusal),
        };
        match checked {
            Err((code, reason)) => {
                info!(sender = %sender, reason = %reason, "refusing a replication stream");
                self.update_status(&sender, |s| {
                    s.connected = false;
                    s.refused = Some(reason.clone());
                });
                // The channel is empty and has room: this cannot fail.
                let _ = tx.try_send(Ok(refused(code, reason)));
            }
            Ok(accepted) => {
                if self.note_decided(accepted.sender_node, hello.decided, &[]) {
                    self.applied.send_modify(|n| *n = n.wrapping_add(1));
                }
                let high_waters = self
                    .db
                    .high_waters()
                    .map_err(|e| Status::unavailable(e.to_string()))?;
                let now = Instant::now();
                let targets: Vec<TargetInfo> = accepted
                    .targets
                    .targets()
                    .map(|(table, t)| TargetInfo {
                        table: table.to_string(),
                        kind: hawser_target::kind_name(&t.kind).to_string(),
                        into: t.into.to_string(),
                    })
                    .collect();
                self.update_status(&sender, |s| {
                    s.connected = true;
                    s.refused = None;
                    s.last_contact = Some(now);
                    s.connected_since = Some(now);
                    s.targets = targets;
                });
                let (held_after, held_after_complete) = match hello.restart_probe {
                    Some(probe) => self.held_after(probe).await?,
                    None => (Vec::new(), false),
                };
                let _ = tx.try_send(Ok(pb::ReceiverMessage {
                    msg: Some(receiver_message::Msg::HelloReply(pb::HelloReply {
                        high_waters: to_pb(&high_waters),
                        held_after,
                        held_after_complete,
                        last_of_sender: self.db.last_commit_of(NodeId(hello.sender_node)).map(
                            |c| pb::HeldCommit {
                                seq: c.seq,
                                commit_micros: c.commit_micros,
                            },
                        ),
                        max_message_bytes: self.config.max_message_bytes as u64,
                    })),
                }));
                info!(sender = %sender, "replication stream accepted");
                self.tracker
                    .spawn(self.clone().serve(accepted, inbound, tx));
            }
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(through: u64, raw: u64) -> pb::Batch {
        pb::Batch {
            through_lsn: through,
            count: 1,
            codec: pb::Codec::None as i32,
            raw_bytes: raw,
            payload: Vec::new(),
            decided: 0,
            waiting: false,
            relayed: Vec::new(),
            chunk: None,
        }
    }

    fn msg(m: sender_message::Msg) -> Inbound {
        Ok(Some(pb::SenderMessage { msg: Some(m) }))
    }

    fn throughs(backlog: &[pb::Batch]) -> Vec<u64> {
        backlog.iter().map(|b| b.through_lsn).collect()
    }

    #[test]
    fn a_message_the_receiver_cannot_take_is_told_from_a_broken_connection() {
        use tonic::Code;
        // What tonic says of a message past the limit, of one that does not decode,
        // and what the joiner's refusals travel as.
        for code in [Code::OutOfRange, Code::Internal, Code::InvalidArgument] {
            assert!(unreadable(&Status::new(code, "x")), "{code:?}");
        }
        // A sender gone away, a reset: nothing to refuse.
        for code in [Code::Unknown, Code::Cancelled, Code::Unavailable] {
            assert!(!unreadable(&Status::new(code, "x")), "{code:?}");
        }
    }

    #[test]
    fn marks_only_rise_and_durable_follows_applied_when_told() {
        let (a, b, c) = (NodeId(1), NodeId(2), NodeId(3));
        let mut m = Marks::new(BTreeMap::from([(a, 5), (b, 9)]));
        // A backlog of origin a up to 7 and of a new origin c.
        m.refresh(&BTreeMap::from([(a, 7), (c, 2)]));
        // The store's marks read later, lower for a (read before) and higher for b.
        m.refresh(&BTreeMap::from([(a, 6), (b, 11)]));
        assert_eq!(m.applied, BTreeMap::from([(a, 7), (b, 11), (c, 2)]));
        assert_eq!(m.durable, BTreeMap::from([(a, 5), (b, 9)]));
        m.durable.clone_from(&m.applied);
        assert_eq!(m.durable, m.applied);
    }

    #[test]
    fn the_policy_compiles_at_either_threshold_and_never_when_off() {
        let p = CompilePolicy {
            enabled: true,
            min_transactions: 64,
            min_bytes: 1000,
        };
        assert!(!p.compiles(63, 999));
        assert!(p.compiles(64, 0));
        assert!(p.compiles(1, 1000));
        let off = CompilePolicy {
            enabled: false,
            ..p
        };
        assert!(!off.compiles(1_000_000, 1 << 30));
        // By default: one full sender batch, so that a current receiver's backlog — a
        // few lingered batches — is applied in log order, and a catching-up one's full
        // batches are compiled.
        let (d, t) = (CompilePolicy::default(), crate::SenderTuning::default());
        assert_eq!(d.min_transactions, t.max_batch_records as u64);
        assert_eq!(d.min_bytes, t.max_batch_bytes as u64);
        assert!(!d.compiles(3 * t.linger_records as u64, 3 * 128 * 200));
        assert!(d.compiles(t.max_batch_records as u64, 0));
    }

    /// A queue holding `msgs`, its sender kept open (so "nothing more yet" is Empty).
    fn queued(msgs: Vec<Inbound>) -> (mpsc::Sender<Inbound>, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(16);
        for m in msgs {
            tx.try_send(m).expect("room");
        }
        (tx, rx)
    }

    #[test]
    fn a_backlog_takes_the_batches_already_there_and_stops_at_what_is_not() {
        use sender_message::Msg;
        let hb = || Msg::Heartbeat(pb::Heartbeat { sent_micros: 0 });
        // Queued batches and a heartbeat, then nothing ready: all batches taken.
        let (_tx, mut q) = queued(vec![
            msg(Msg::Batch(batch(2, 10))),
            msg(hb()),
            msg(Msg::Batch(batch(3, 10))),
        ]);
        let mut backlog = vec![batch(1, 10)];
        assert!(gather_backlog(&mut q, &mut backlog, 1 << 20).is_none());
        assert_eq!(throughs(&backlog), [1, 2, 3]);

        // The byte bound leaves the rest queued.
        let (_tx, mut q) = queued(vec![
            msg(Msg::Batch(batch(2, 10))),
            msg(Msg::Batch(batch(3, 10))),
        ]);
        let mut backlog = vec![batch(1, 10)];
        assert!(gather_backlog(&mut q, &mut backlog, 15).is_none());
        assert_eq!(throughs(&backlog), [1, 2]);
        let next = q.try_recv().ok().and_then(Result::ok).flatten();
        assert!(
            matches!(next, Some(pb::SenderMessage { msg: Some(Msg::Batch(b)) }) if b.through_lsn == 3)
        );

        // Anything else, or the end of the stream, is handed back after the batches.
        let (_tx, mut q) = queued(vec![
            msg(Msg::Batch(batch(2, 10))),
            msg(Msg::Hello(pb::Hello::default())),
            msg(Msg::Batch(batch(3, 10))),
        ]);
        let mut backlog = vec![batch(1, 10)];
        let carried = gather_backlog(&mut q, &mut backlog, 1 << 20);
        assert!(matches!(
            carried,
            Some(Ok(Some(pb::SenderMessage {
                msg: Some(Msg::Hello(_))
            })))
        ));
        assert_eq!(throughs(&backlog), [1, 2]);

        let (_tx, mut q) = queued(vec![msg(Msg::Batch(batch(2, 10))), Ok(None)]);
        let mut backlog = vec![batch(1, 10)];
        assert!(matches!(
            gather_backlog(&mut q, &mut backlog, 1 << 20),
            Some(Ok(None))
        ));
        assert_eq!(throughs(&backlog), [1, 2]);
    }
}
