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
//!
//! The protocol's decisions are pure and unit-tested in their own submodules; the
//! async tasks around them only move messages and bytes and call the store:
//!
//! * `hello`: the Hello check (identity, elements and epochs, tables and targets)
//!   into an accepted stream or a refusal; the epochs checked again per batch.
//! * `accepted`: an accepted stream's view of the sender's tables (column maps,
//!   doomed tables), kept up to date with the DDL it carries, and how a received
//!   transaction is made this store's.
//! * `backlog`: gathering the batches waiting behind the one read, and what is
//!   decided of a backlog as a whole (its ack's LSN, compiled or not, paced or not).
//! * `runs`: a backlog's records into runs (parts of split transactions joined,
//!   forked-off records refused) and how each run is applied and counted.
//! * `acks`: the marks acks carry, when a stream acks (at once or lazily), when it
//!   flushes, when its sender is taken for dead, and the decided marks.
//! * `apply`: the I/O of a backlog's apply, run by run, into the store.
//! * `stream`: the tasks serving one stream: read-ahead, the apply loop, heartbeats.
//! * This module: the public types, the service and its gRPC entry points.

mod accepted;
mod acks;
mod apply;
mod backlog;
mod hello;
mod runs;
mod stream;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use hawser_core::{Epoch, Ident, NodeId, QualName};
use hawser_scheme::route::ResolvedTarget;
use hawser_store::Database;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info};

use self::accepted::Accepted;
use self::acks::{note_decided, to_pb};
use self::hello::{accept, check_identity, target_refusal, HelloContext};
use crate::codec;
use crate::link::ForkedRange;
use crate::paths::DecidedMarks;
use crate::pb::{self, receiver_message, sender_message, RefuseCode};

/// Why a stream is refused: the code and the reason the sender shows.
type Refusal = (RefuseCode, String);

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
    /// How often the receiver heartbeats its senders, and checks they are not silent.
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
    /// The defaults for a node holding `store`.
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

/// The receiving end of `Replicate` on one node: checks each sender's Hello, applies
/// its batches to the store and acknowledges them, one task per stream.
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

    /// The sender nodes with a stream to this node now.
    fn connected_senders(&self) -> Vec<u64> {
        self.connected.lock().keys().map(|n| n.0).collect()
    }

    /// The marks of what each sender decided, which this node's relays read to know
    /// how much of an origin they hold (`SenderStart::upstream`).
    pub fn decided_marks(&self) -> DecidedMarks {
        self.decided.clone()
    }

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

    /// The log positions copies served by this node hold (the data plane releases no
    /// log past the lowest).
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

/// The messages a stream sends back to its sender.
type Outbound = Pin<Box<dyn Stream<Item = Result<pb::ReceiverMessage, Status>> + Send>>;

/// The message refusing a stream, with its code and reason.
fn refused(code: RefuseCode, reason: impl Into<String>) -> pb::ReceiverMessage {
    pb::ReceiverMessage {
        msg: Some(receiver_message::Msg::Refused(pb::Refused {
            code: code as i32,
            reason: reason.into(),
        })),
    }
}

/// [`ReceiverConfig::apply_slice`] by default: about four one-row transactions.
pub const DEFAULT_APPLY_SLICE: Duration = Duration::from_micros(60);

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

impl ReceiverService {
    /// The refusal for an apply this store cannot do, naming the store (the sender
    /// shows it as its own status).
    fn apply_failed(&self, e: &hawser_store::StoreError) -> Refusal {
        (
            RefuseCode::ApplyFailed,
            format!("{} cannot apply: {e}", self.config.store),
        )
    }

    /// Checks a stream's Hello (`hello`) against this node and its store now.
    fn check_hello(&self, hello: &pb::Hello) -> Result<Accepted, Refusal> {
        check_identity(hello, &self.config.store, self.db.node_id())?;
        // A store that cannot write now (its disk is full) takes no stream: its sender
        // keeps saying why until there is room.
        self.db.check_space().map_err(|e| self.apply_failed(&e))?;
        let epochs = self.epochs.borrow().clone();
        let targets = self.targets.borrow().clone();
        let ctx = HelloContext {
            store: &self.config.store,
            epochs: &epochs,
            targets: &targets,
            catalog: &self.db,
        };
        accept(hello, &ctx)
    }

    /// Creates the target tables a stream's Hello found missing. Another stream may
    /// create one first: then it is checked as Hello would have.
    async fn create_targets(&self, accepted: &mut Accepted) -> Result<(), Refusal> {
        for def in std::mem::take(&mut accepted.create) {
            if let Some(local) = self.db.table(&def.name) {
                hawser_target::check_shape(&local, &def)
                    .map_err(|e| target_refusal(&self.config.store, e))?;
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
                if note_decided(&self.decided, accepted.sender_node, hello.decided, &[]) {
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
}
