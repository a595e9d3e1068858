//! The sending end of `Replicate`: one task per (this node, receiver) link.
//!
//! ```text
//!  ┌──────── Connecting ──(connect, Hello)──► HelloReply(high-waters) ──► Streaming ─┐
//!  │               ▲                               │ Refused(reason)                 │
//!  │               └── Backoff (50 ms … 5 s) ◄─────┴───── error / peer silent ◄──────┘
//!  └─ shutdown ──► Stopped
//!
//!  The backoff grows to 5 s after a refusal, to 250 ms when the receiver could not be
//!  reached ([`next_backoff`]): a peer that restarts is streamed to again at once.
//!
//!  A refusal (Refused, LogReleased, Diverged) stays the state through the backoff and
//!  the next attempt, until that attempt streams or ends another way.
//!
//!  Streaming: log_range(cursor) ─► LinkConfig::filter (origin, tables, high-water)
//!             ─► encode ─► compress ─► Batch(through_lsn) ─► in flight (bounded)
//!                (cut by exact encoded size at 1 MiB, at most half the receiver's
//!                 message limit; a larger record goes alone, in chunks: crate::chunks)
//!             ◄─ Ack(durable, applied, through_lsn) ─ frees in-flight, feeds status
//!             heartbeat when idle; silence past the peer timeout ends the session
//! ```
//!
//! The cursor resumes at the LSN after the last durably acknowledged batch — at first
//! the position the caller gives ([`SenderStart`]: the link's retained position, kept
//! durably by the node, or the start of the log for a new link) — and records the
//! receiver already has are skipped by its high-water marks, so a reconnect re-sends
//! nothing it does not need and the store's idempotent apply absorbs any overlap. When
//! the log after that position was released (a receiver in STOP or FAILED state does
//! not hold the log), the sender does not connect: status says the subscriber needs a
//! duplicate.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_core::{Epoch, Gtid, Lsn, NodeId, QualName};
use hawser_store::{
    CommitsAfter, Database, DdlOp, HeldCommit, LogEntry, LogRecord, RestartCheck, RestartEvidence,
};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::MissedTickBehavior;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Endpoint;
use tracing::{debug, info, instrument, warn};

use crate::chunks;
use crate::codec::{self, compress_at, encode_entries, Compression};
use crate::error::StreamError;
use crate::link::LinkConfig;
use crate::paths::DecidedMarks;
use crate::pb::{self, receiver_message, sender_message};
use crate::{codec_to_pb, PROTOCOL_VERSION};

/// Where a sender is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderState {
    Connecting,
    Streaming,
    /// Waiting before the next attempt; `error` is why the last one ended.
    Backoff {
        error: String,
    },
    /// The receiver refused the stream; retried after a backoff (the cause may be
    /// fixed: a table created, an epoch caught up).
    Refused {
        reason: String,
    },
    /// The log after what the receiver acknowledged was released: nothing can be sent
    /// until it is duplicated (checked again after a backoff).
    LogReleased {
        reason: String,
    },
    /// The receiver holds commits of this node's origin that this node lost in a
    /// machine restart ([`hawser_store::RestartPoint`]) — through seq `holds`: nothing
    /// is sent to it until it is rebuilt (checked again after a backoff), and what its
    /// Hello said it holds acknowledges nothing.
    Diverged {
        reason: String,
        holds: u64,
    },
    Stopped,
}

impl SenderState {
    /// Whether the receiver (or this node's log) refused the last session: the cause
    /// outlasts the backoff unless something changed.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::Refused { .. } | Self::LogReleased { .. } | Self::Diverged { .. }
        )
    }
}

/// A sender's status, for `hawser status` and the return-service tracker.
///
/// Changes of state and acknowledgements (marks, acknowledged position, lag) wake the
/// watch's waiters; the per-batch counters (`sent_lsn`, `transactions_sent`,
/// `batches_sent`, bytes) and `last_contact` on a heartbeat are updated in place
/// without waking them: readers see them, and a batch sent does not wake every task
/// waiting for an acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SenderStatus {
    pub state: SenderState,
    /// Last message from the receiver.
    pub last_contact: Option<Instant>,
    /// Durably received per origin (RETURN RECEIPT).
    pub acked_durable: BTreeMap<NodeId, u64>,
    /// Committed per origin (RETURN TWOSAFE).
    pub acked_applied: BTreeMap<NodeId, u64>,
    /// This node's log position the receiver has acknowledged.
    pub acked_lsn: Lsn,
    /// This node's log position sent.
    pub sent_lsn: Lsn,
    /// Log records after `acked_lsn` (what the receiver lacks, as an upper bound).
    /// Refreshed at every ack and every heartbeat tick, in a session or between them.
    pub lag_records: u64,
    /// Age of the oldest unacknowledged transaction sent, in microseconds (refreshed
    /// as `lag_records` is).
    pub lag_micros: u64,
    /// Round trip of the last acknowledged batch: from handing it to the stream to
    /// reading the ack that covers it, in microseconds (0 before the first ack). On a
    /// stream a return service waits on, the receiver acks once the batch is durable
    /// there, so this is what RECEIPT adds to a commit after the master's own flush
    /// (PostgreSQL's `flush_lag`); on other streams acks are gathered (every few
    /// batches or at the receiver's lazy flush), so it includes that wait.
    pub ack_micros: u64,
    /// [`SenderStatus::ack_micros`] smoothed over recent acks: each new one weighs 1/8.
    pub ack_micros_mean: u64,
    pub transactions_sent: u64,
    pub batches_sent: u64,
    pub raw_bytes: u64,
    pub wire_bytes: u64,
    pub sessions: u64,
    /// The stream has stopped before a transaction for another stream to the same
    /// receiver (docs/stream.md, "Two paths from one origin to one receiver"): which,
    /// since when, and what it waits for. `None` while it ships.
    pub held: Option<Held>,
    /// Why the last session ended, when an error ended it — kept until a later
    /// session's ack moves the acknowledged position (or says the receiver has the
    /// whole log), so that a stream that keeps breaking at the same place says why
    /// even while it is streaming again.
    pub last_error: Option<String>,
}

/// Why a stream has stopped before a transaction ([`SenderStatus::held`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub gtid: Gtid,
    pub since: Instant,
    /// In words, naming the stores ([`LinkConfig::waits_for`]).
    pub waits_for: String,
}

impl Default for SenderStatus {
    /// A sender that has not connected yet.
    fn default() -> Self {
        Self::new()
    }
}

impl SenderStatus {
    fn new() -> Self {
        Self {
            state: SenderState::Connecting,
            last_contact: None,
            acked_durable: BTreeMap::new(),
            acked_applied: BTreeMap::new(),
            acked_lsn: Lsn::ZERO,
            sent_lsn: Lsn::ZERO,
            lag_records: 0,
            lag_micros: 0,
            ack_micros: 0,
            ack_micros_mean: 0,
            transactions_sent: 0,
            batches_sent: 0,
            raw_bytes: 0,
            wire_bytes: 0,
            sessions: 0,
            held: None,
            last_error: None,
        }
    }
}

/// The caller's handle on a running sender.
#[derive(Clone)]
pub struct SenderHandle {
    status: watch::Receiver<SenderStatus>,
    wake: Arc<Notify>,
    /// Set while the sender lingers: the log's last LSN at which it has enough records
    /// to ship at once (see [`SenderTuning::linger`]); 0 when a wake may be needed.
    wake_at: Arc<AtomicU64>,
    db: Database,
    /// Whether it ships this node's commits once written, before their sync (see
    /// [`SenderHandle::ships_written`]).
    ships_written: bool,
    /// How its batches are compressed (the link's [`LinkConfig::compression`], and
    /// its zstd level).
    compression: Compression,
    zstd_level: i32,
}

impl std::fmt::Debug for SenderHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderHandle")
            .field("wake_at", &self.wake_at)
            .finish_non_exhaustive()
    }
}

impl SenderHandle {
    pub fn status(&self) -> watch::Receiver<SenderStatus> {
        self.status.clone()
    }

    /// Tells the sender there is new log to ship (the commit path calls this after
    /// each commit, so shipping does not wait for the poll interval). A sender that
    /// lingers for company is left alone until the log holds the records that end its
    /// linger: its timer ships the rest, and a wake per commit (a task run, often a
    /// thread woken, only to linger on) is what lingering saves.
    pub fn wake(&self) {
        if self.db.last_lsn().0 >= self.wake_at.load(Ordering::Acquire) {
            self.wake.notify_one();
        }
    }

    /// Whether the sender lingers now: it holds records for company, and commits do not
    /// wake it until enough are ready (see [`SenderTuning::linger`]).
    pub fn lingering(&self) -> bool {
        self.wake_at.load(Ordering::Acquire) != 0
    }

    /// Whether this sender ships this node's own commits as soon as they are written
    /// to the log, while their sync is still under way: on a stream a return service
    /// waits on (the commit waits for the receiver's ack anyway, so the two syncs
    /// overlap instead of following each other), when the node commits durably. The
    /// commit path wakes such senders between the write and the sync
    /// ([`Database::set_written_hook`]).
    pub fn ships_written(&self) -> bool {
        self.ships_written
    }

    /// How this sender compresses its batches.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The codec as status shows it and `hawser start --compress-codec` takes it:
    /// `off`, `lz4`, or `zstd:LEVEL`.
    pub fn codec_name(&self) -> String {
        match self.compression {
            Compression::Zstd => format!("zstd:{}", self.zstd_level),
            other => other.name().to_string(),
        }
    }
}

/// Called by a sender, on its own task, each time its receiver's acknowledged marks
/// may have moved (an Ack, the Hello exchange): return services learn of an ack
/// without another task watching the status for it.
#[derive(Clone)]
pub struct AckHook(pub Arc<dyn Fn(&SenderStatus) + Send + Sync>);

impl std::fmt::Debug for AckHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AckHook")
    }
}

/// Where a new sender starts.
#[derive(Debug, Clone, Default)]
pub struct SenderStart {
    /// The receiver has everything of this link through this LSN: the first session
    /// reads the log after it.
    pub resume_after: Lsn,
    /// The status of the sender this one replaces (a re-plan): its counters and marks
    /// carry on, and it resumes after that sender's acknowledged position when that is
    /// further.
    pub previous: Option<SenderStatus>,
    /// Told of every acknowledgement (see [`AckHook`]), and once at the start.
    pub on_ack: Option<AckHook>,
    /// This node's receiver's marks ([`ReceiverService::decided_marks`]): how far the
    /// streams into this node have decided about each origin, so that a relay can say
    /// how far it holds an origin's transactions (`LinkConfig::upstream`).
    ///
    /// [`ReceiverService::decided_marks`]: crate::ReceiverService::decided_marks
    pub upstream: Option<DecidedMarks>,
}

/// Starts senders.
pub struct StreamSender;

impl StreamSender {
    /// Spawns the sender of `link` on `tracker`: it streams `db`'s log to the receiver
    /// at `endpoint` until `shutdown` is cancelled.
    pub fn spawn(
        link: LinkConfig,
        db: Database,
        endpoint: Endpoint,
        start: SenderStart,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> SenderHandle {
        let mut initial = SenderStatus::new();
        if let Some(p) = start.previous {
            initial = SenderStatus {
                state: SenderState::Connecting,
                lag_micros: 0,
                ..p
            };
        }
        let acked_lsn = initial.acked_lsn.max(start.resume_after);
        initial.acked_lsn = acked_lsn;
        initial.sent_lsn = initial.sent_lsn.max(acked_lsn);
        let (status_tx, status) = watch::channel(initial);
        let wake = Arc::new(Notify::new());
        let wake_at = Arc::new(AtomicU64::new(0));
        let handle_db = db.clone();
        let ships_written = ships_written(&link, &db);
        let (compression, zstd_level) = (link.compression, link.tuning.zstd_level);
        // Only a stream whose decisions about the origins it relays someone waits for
        // says them: a blind sibling's (`LinkConfig::read_by_siblings`), or the relay
        // its receiver runs beside another path (`LinkConfig::feeds_relay`).
        let relays = if !link.read_by_siblings && !link.feeds_relay {
            BTreeSet::new()
        } else {
            let mut o = link.carried_origins();
            o.remove(&link.sender_node);
            o.remove(&link.receiver_node);
            o
        };
        let max_message_bytes = link.tuning.max_message_bytes as u64;
        let task = Sender {
            link,
            max_message_bytes,
            db,
            endpoint,
            shutdown,
            status: status_tx,
            wake: wake.clone(),
            wake_at: wake_at.clone(),
            acked_lsn,
            oldest_unacked_micros: AtomicI64::new(0),
            unflushed_since: std::sync::Mutex::new(None),
            unverified_seq: AtomicU64::new(0),
            unverified_micros: AtomicI64::new(0),
            decided: AtomicU64::new(0),
            relayed: parking_lot::Mutex::default(),
            relays,
            upstream: start.upstream.unwrap_or_default(),
            on_ack: start.on_ack,
        };
        task.report_acks();
        tracker.spawn(task.run());
        SenderHandle {
            status,
            wake,
            wake_at,
            db: handle_db,
            ships_written,
            compression,
            zstd_level,
        }
    }
}

/// See [`SenderHandle::ships_written`].
fn ships_written(link: &LinkConfig, db: &Database) -> bool {
    link.returns_wait && db.options().durable_commits
}

struct Sender {
    link: LinkConfig,
    /// The largest message the receiver reads: the tuning's, or the lower one the
    /// receiver said in its HelloReply.
    max_message_bytes: u64,
    db: Database,
    endpoint: Endpoint,
    shutdown: CancellationToken,
    status: watch::Sender<SenderStatus>,
    wake: Arc<Notify>,
    /// Shared with the handles (see [`SenderHandle::wake`]).
    wake_at: Arc<AtomicU64>,
    acked_lsn: Lsn,
    /// Commit time (µs since the epoch) of the oldest transaction sent and not yet
    /// acknowledged, kept across sessions (a broken session's batches stay unacknowledged
    /// until a later one resends them); 0 when none.
    oldest_unacked_micros: AtomicI64,
    /// Since when the log at the cursor is this node's own commit not yet flushed.
    unflushed_since: std::sync::Mutex<Option<Instant>>,
    /// The receiver's newest commit of this node's origin (`HelloReply.last_of_sender`),
    /// its seq (0: none) and commit time, until the log passes this node's own commit
    /// under that seq and it is checked ([`Sender::check_reused`]).
    unverified_seq: AtomicU64,
    unverified_micros: AtomicI64,
    /// How far this stream has decided about this node's own commits (seq): each one
    /// up to it was passed (shipped, whole if the stream carries any of it, or found
    /// nothing of it for this stream), or is one this stream waits before that only
    /// relays of it to the receiver carry (`LinkConfig::decides_while_waiting`). Sent
    /// with Hello and every batch (`Batch.decided`).
    decided: AtomicU64,
    /// What this session has decided about the origins it relays (`Batch.relayed`).
    relayed: parking_lot::Mutex<Claims>,
    /// The origins other than this node whose transactions the stream carries, when
    /// it has siblings or feeds a relay (see [`Sender::claim_relayed`]).
    relays: BTreeSet<NodeId>,
    /// This node's receiver's marks (`SenderStart::upstream`).
    upstream: DecidedMarks,
    on_ack: Option<AckHook>,
}

/// Per origin a stream relays, how far this session has decided about its
/// transactions: every one of them up to the seq that this node's log holds, or will
/// ever hold, was passed. Claims start afresh with each session: one that rode on a
/// batch the receiver never applied would not hold.
#[derive(Default)]
struct Claims {
    now: BTreeMap<NodeId, u64>,
    /// As last sent.
    sent: BTreeMap<NodeId, u64>,
}

impl Claims {
    fn raise(&mut self, origin: NodeId, seq: u64) {
        let c = self.now.entry(origin).or_insert(0);
        *c = (*c).max(seq);
    }
}

/// What a session's acks say of the other streams to its receiver.
#[derive(Default)]
struct Others {
    /// How far each sender node's streams to the receiver have decided about each
    /// origin, by (origin, sender).
    decided: BTreeMap<(NodeId, NodeId), u64>,
    /// Since when each sibling's sender has had no stream to the receiver
    /// (`Ack.connected_senders`).
    absent_since: BTreeMap<NodeId, Instant>,
    /// When the last ack came.
    last_heard: Option<Instant>,
}

impl Others {
    fn heard(&mut self, link: &LinkConfig, ack: &pb::Ack) {
        self.last_heard = Some(Instant::now());
        for (path, s) in crate::paths::from_pb(&ack.decided_paths) {
            let d = self.decided.entry(path).or_insert(0);
            *d = (*d).max(s);
        }
        for sibling in &link.siblings {
            let node = sibling.sender_node;
            if node == link.sender_node || ack.connected_senders.contains(&node.0) {
                self.absent_since.remove(&node);
            } else {
                self.absent_since.entry(node).or_insert_with(Instant::now);
            }
        }
    }

    /// The siblings' senders without a stream to the receiver for `after` or longer.
    fn absent(&self, after: Duration) -> BTreeSet<NodeId> {
        self.absent_since
            .iter()
            .filter(|(_, since)| since.elapsed() >= after)
            .map(|(n, _)| *n)
            .collect()
    }
}

/// Where a session's sender is in its log.
struct Reader {
    /// The next LSN to look at.
    cursor: Lsn,
    /// The end of log passed but not sent: records this receiver gets nothing of.
    unsent: Option<Lsn>,
    /// Records read from `cursor` on and not passed yet (at most a batch's worth),
    /// topped up from the log as it grows. A stream that stops before another stream's
    /// transaction keeps them for its next turn rather than reading them again (which,
    /// behind the store's in-memory tail, decodes them again: with turns every few
    /// transactions, hundreds of decodes per transaction shipped).
    ahead: VecDeque<Arc<LogRecord>>,
    /// The record the stream stopped before, for another stream's transaction.
    blocked_at: Option<Arc<LogRecord>>,
    /// Since when it has stopped before that record.
    blocked_since: Option<Instant>,
}

impl Reader {
    fn new(cursor: Lsn) -> Self {
        Self {
            cursor,
            unsent: None,
            ahead: VecDeque::new(),
            blocked_at: None,
            blocked_since: None,
        }
    }

    /// Stops before `at` (or goes on, `None`), keeping the time of the first stop
    /// before the same record.
    fn block(&mut self, at: Option<Arc<LogRecord>>, before: Option<(Lsn, Instant)>) {
        self.blocked_since = match (&at, before) {
            (Some(r), Some((lsn, since))) if r.lsn == lsn => Some(since),
            (Some(_), _) => Some(Instant::now()),
            (None, _) => None,
        };
        self.blocked_at = at;
    }

    /// The first `count` records read ahead are passed, through `through`.
    fn pass(&mut self, count: usize, through: Lsn) {
        self.ahead.drain(..count);
        self.cursor = through.next();
    }
}

/// How long a sender waits for an own commit's flush before flushing itself: a commit
/// whose caller went away (a dropped request) is applied but nobody flushes it, and
/// without a later commit it would hold the stream back for good.
const UNFLUSHED_PATIENCE: Duration = Duration::from_millis(20);

/// One batch sent and not yet acknowledged.
struct InFlight {
    through_lsn: Lsn,
    /// When the batch was handed to the stream.
    sent_at: Instant,
    wire_bytes: u64,
    first_commit_micros: Option<i64>,
}

/// An exponentially weighted mean giving each new sample 1/8 of the weight (the first
/// sample is taken whole): steady within a few percent after ~25 acks, and one slow
/// ack moves it by an eighth of the difference.
fn smoothed(mean: u64, sample: u64) -> u64 {
    if mean == 0 {
        return sample.max(1);
    }
    let (m, s) = (mean as i128, sample as i128);
    (m + (s - m) / 8).max(1) as u64
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

fn from_marks(m: &[pb::OriginMark]) -> BTreeMap<NodeId, u64> {
    m.iter().map(|m| (NodeId(m.origin), m.seq)).collect()
}

impl Sender {
    #[instrument(skip_all, fields(sender = %self.link.sender_store, receiver = %self.link.receiver_store))]
    async fn run(mut self) {
        let tuning = self.link.tuning.clone();
        // The last wait; `None` at first and after a session that streamed.
        let mut backoff: Option<Duration> = None;
        // The last error logged at WARN, so that a stream failing the same way at every
        // attempt says so once rather than every few seconds.
        let mut warned: Option<String> = None;
        'sessions: loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            self.status.send_modify(|s| {
                // A refusal stays the state until the next attempt ends another way:
                // status keeps naming why nothing is sent while it is asked again.
                if !s.state.is_refusal() {
                    s.state = SenderState::Connecting;
                }
                s.sessions += 1;
            });
            let mut streamed = false;
            let ended = self.session(&mut streamed).await;
            // A stream that is not up holds nothing back.
            self.status.send_if_modified(|s| {
                s.held = None;
                false
            });
            let ended = match ended {
                Ok(()) => break,
                Err(e) => e,
            };
            let failure = Failure::of(&ended);
            let error = ended.to_string();
            let state = match ended {
                StreamError::Refused { reason, .. } => {
                    warn!(reason = %reason, "receiver refused the stream");
                    SenderState::Refused { reason }
                }
                e @ StreamError::LogReleased { .. } => {
                    warn!(error = %e, "cannot stream");
                    SenderState::LogReleased {
                        reason: e.to_string(),
                    }
                }
                e @ (StreamError::Diverged { holds, .. }
                | StreamError::Ahead { holds, .. }
                | StreamError::Reused { holds, .. }
                | StreamError::GaveAgain { holds }) => {
                    warn!(error = %e, "cannot stream");
                    SenderState::Diverged {
                        reason: e.to_string(),
                        holds,
                    }
                }
                e => {
                    // A receiver that is down or restarting is routine; anything else
                    // (a message the receiver could not read, a protocol violation)
                    // repeats at every attempt until somebody acts on it.
                    if failure == Failure::Unreachable || warned.as_ref() == Some(&error) {
                        debug!(error = %e, "stream ended");
                    } else {
                        warn!(error = %e, "stream ended");
                        warned = Some(error.clone());
                    }
                    SenderState::Backoff {
                        error: error.clone(),
                    }
                }
            };
            if streamed {
                backoff = None;
            }
            let wait = next_backoff(backoff, failure, &tuning);
            backoff = Some(wait);
            self.status.send_modify(|s| {
                s.state = state;
                s.last_error = Some(error);
            });
            // The lag keeps growing while no session runs.
            let resume = tokio::time::sleep(wait);
            tokio::pin!(resume);
            let mut refresh = tokio::time::interval(tuning.heartbeat);
            loop {
                tokio::select! {
                    biased;
                    _ = self.shutdown.cancelled() => break 'sessions,
                    _ = &mut resume => break,
                    _ = refresh.tick() => self.refresh_lag(),
                }
            }
        }
        self.status.send_modify(|s| s.state = SenderState::Stopped);
    }

    fn hello(&self) -> Result<pb::Hello, StreamError> {
        let dropped = self.drops_ahead()?;
        let mut tables: Vec<pb::TableSpec> = self
            .link
            .tables
            .iter()
            .filter_map(|((table, _), element)| {
                self.db.table(table).map(|def| pb::TableSpec {
                    element: element.as_str().to_string(),
                    definition: codec::encode_table_def(&def),
                    dropped_at: dropped.get(table).map(|g| pb::OriginMark {
                        origin: g.origin.0,
                        seq: g.seq,
                    }),
                    completing: false,
                })
            })
            .collect();
        // Tables a sibling stream carries, which this one ships inside split
        // transactions (`LinkConfig::completes`).
        if !self.link.siblings.is_empty() {
            tables.extend(
                self.db
                    .tables()
                    .iter()
                    .filter(|def| self.link.completes(&def.name))
                    .map(|def| pb::TableSpec {
                        element: String::new(),
                        definition: codec::encode_table_def(def),
                        dropped_at: None,
                        completing: true,
                    }),
            );
        }
        Ok(pb::Hello {
            protocol_version: PROTOCOL_VERSION,
            sender_node: self.link.sender_node.0,
            sender_store: self.link.sender_store.as_str().to_string(),
            receiver_store: self.link.receiver_store.as_str().to_string(),
            scheme_version: self.link.scheme_version,
            elements: self
                .link
                .elements
                .iter()
                .map(|(e, epoch)| pb::ElementEpoch {
                    element: e.as_str().to_string(),
                    epoch: epoch.0,
                })
                .collect(),
            tables,
            codec: codec_to_pb(self.link.compression) as i32,
            table_check: match self.link.table_check {
                hawser_scheme::ast::TableDefinitionChecking::Exact => pb::TableCheck::Exact,
                hawser_scheme::ast::TableDefinitionChecking::Relaxed => pb::TableCheck::Relaxed,
            } as i32,
            carries_ddl: self.link.replicate_ddl,
            returns_wait: self.link.returns_wait,
            restart_probe: self.restart_probe(),
            decided: self.decided_at_start()?,
            ships_parts: self
                .link
                .carried_origins()
                .iter()
                .any(|o| self.link.ships_parts(*o)),
            receiver_node: self.link.receiver_node.0,
        })
    }

    /// How far this stream had decided when the session starts: through its
    /// acknowledged position, every record was passed by an earlier session. What an
    /// earlier session decided past that rode on batches the receiver may never have
    /// applied, and is forgotten; so are its claims about the origins it relays.
    fn decided_at_start(&self) -> Result<u64, StreamError> {
        const LOOK_BACK: usize = 4096;
        let at = self
            .db
            .own_seq_through(self.acked_lsn, LOOK_BACK)?
            .unwrap_or(0);
        self.decided.store(at, Ordering::Release);
        *self.relayed.lock() = Claims::default();
        Ok(at)
    }

    /// On a stream that carries DDL: the last DROP TABLE of each table this stream
    /// carries from where it resumes (`TableSpec.dropped_at`). Hello describes the
    /// tables as they are now; a receiver behind such a drop holds the table as it was
    /// before it, maybe in another layout, and the stream drops that before any row of
    /// the new one reaches it.
    fn drops_ahead(&self) -> Result<BTreeMap<QualName, Gtid>, StreamError> {
        let mut dropped = BTreeMap::new();
        if !self.link.replicate_ddl {
            return Ok(dropped);
        }
        for r in self.db.ddl_from(self.acked_lsn.next())? {
            if let LogEntry::Ddl {
                gtid,
                op: DdlOp::DropTable(name),
                ..
            } = &r.entry
            {
                if self.link.carries(&r.entry) {
                    dropped.insert(name.clone(), *gtid);
                }
            }
        }
        Ok(dropped)
    }

    /// After a machine restart, until this receiver is checked: ask it for the commits
    /// of this node's origin it holds past the restart point.
    fn restart_probe(&self) -> Option<pb::RestartProbe> {
        if !self
            .db
            .restart_check_pending(self.link.receiver_store.as_str())
        {
            return None;
        }
        self.db.restart_point().map(|p| pb::RestartProbe {
            origin: self.db.node_id().0,
            after_seq: p.seq,
        })
    }

    /// One connection, from connect to its end. `Ok` only on shutdown.
    async fn session(&mut self, streamed: &mut bool) -> Result<(), StreamError> {
        // A session that ended while lingering left its threshold behind.
        self.wake_at.store(0, Ordering::Release);
        isolation_check()?;
        let tuning = self.link.tuning.clone();
        // `None` from a connect step: shutting down.
        let Some(channel) = self.connecting(self.endpoint.connect()).await? else {
            return Ok(());
        };
        let mut client = pb::replication_client::ReplicationClient::new(channel?);
        let (tx, rx) = mpsc::channel(tuning.max_in_flight_batches + 16);
        let hello = pb::SenderMessage {
            msg: Some(sender_message::Msg::Hello(self.hello()?)),
        };
        tx.send(hello).await.map_err(|_| StreamError::Closed)?;
        let Some(opened) = self
            .connecting(client.replicate(ReceiverStream::new(rx)))
            .await?
        else {
            return Ok(());
        };
        let mut inbound = opened?.into_inner();
        let Some(first) = self.connecting(inbound.message()).await? else {
            return Ok(());
        };
        let first = first?;
        let (mut high_water, held_after) = match first.and_then(|m| m.msg) {
            Some(receiver_message::Msg::HelloReply(r)) => {
                self.max_message_bytes = message_limit(
                    self.link.tuning.max_message_bytes as u64,
                    r.max_message_bytes,
                );
                let last = r.last_of_sender.as_ref();
                self.unverified_micros
                    .store(last.map_or(0, |c| c.commit_micros), Ordering::Release);
                self.unverified_seq
                    .store(last.map_or(0, |c| c.seq), Ordering::Release);
                let held = CommitsAfter {
                    commits: r
                        .held_after
                        .iter()
                        .map(|c| HeldCommit {
                            seq: c.seq,
                            commit_micros: c.commit_micros,
                        })
                        .collect(),
                    complete: r.held_after_complete,
                };
                (from_marks(&r.high_waters), held)
            }
            Some(receiver_message::Msg::Refused(r)) => {
                return Err(StreamError::Refused {
                    code: r.code,
                    reason: r.reason,
                })
            }
            _ => {
                return Err(StreamError::Protocol(
                    "the first answer must be HelloReply".into(),
                ))
            }
        };
        *streamed = true;
        let mut others = Others::default();

        let mut last_contact = Instant::now();
        let mut last_sent = Instant::now();
        // Before its marks count: a receiver holding commits this node lost would
        // seem to acknowledge the new commits that reuse their seqs.
        self.check_after_restart(&high_water, held_after).await?;
        self.check_ahead(&high_water).await?;
        self.check_log(&high_water)?;
        // What the receiver already has is durable and committed there: return
        // services waiting on it are answered by the Hello exchange alone. Contact is
        // published with the marks, once the receiver is admitted: the restart fence
        // reads a receiver heard from with no marks as holding nothing of this node's,
        // which must not happen while the checks above may still find it holding lost
        // commits.
        self.status.send_modify(|s| {
            s.last_contact = Some(last_contact);
            s.state = SenderState::Streaming;
            for (origin, seq) in &high_water {
                for marks in [&mut s.acked_durable, &mut s.acked_applied] {
                    let m = marks.entry(*origin).or_insert(0);
                    *m = (*m).max(*seq);
                }
            }
        });
        self.report_acks();
        info!("streaming");
        let mut reader = Reader::new(self.acked_lsn.next());
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        let mut in_flight_bytes = 0u64;
        let mut heartbeat = tokio::time::interval(tuning.heartbeat);
        // One timer for the session rather than a new one per turn of the loop (each
        // wake and each ack is a turn).
        let mut poll = tokio::time::interval(tuning.poll_interval);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // A lazy stream's commits wait up to `linger` for company (see SenderTuning):
        // set when a wake found too few records to ship at once.
        let lingers = !self.link.returns_wait && !tuning.linger.is_zero();
        let linger = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(linger);
        let mut lingering = false;
        loop {
            isolation_check()?;
            // Why the last turn stopped, if it did, for status.
            self.publish_held(&reader, &high_water, &others.decided);
            let room = in_flight.len() < tuning.max_in_flight_batches
                && in_flight_bytes < tuning.max_in_flight_bytes;
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Ok(()),
                msg = inbound.message() => {
                    let msg = msg?.ok_or(StreamError::Closed)?;
                    last_contact = Instant::now();
                    match msg.msg {
                        Some(receiver_message::Msg::Ack(ack)) => {
                            let through = Lsn(ack.through_lsn);
                            // The newest batch this ack covers: its round trip.
                            let mut answered = None;
                            while in_flight.front().is_some_and(|f| f.through_lsn <= through) {
                                if let Some(f) = in_flight.pop_front() {
                                    in_flight_bytes -= f.wire_bytes;
                                    answered = Some(f.sent_at);
                                }
                            }
                            let round_trip = answered.map(|t| t.elapsed().as_micros() as u64);
                            // A session resumes after `acked_lsn`, so it moves only with
                            // an ack that says everything through it is durable there (a
                            // receiver no return service waits on acks applies first and
                            // durability after its next flush).
                            if ack.durable == ack.applied {
                                self.acked_lsn = self.acked_lsn.max(through);
                            }
                            let applied = from_marks(&ack.applied);
                            for (o, s) in &applied {
                                let hw = high_water.entry(*o).or_insert(0);
                                *hw = (*hw).max(*s);
                            }
                            others.heard(&self.link, &ack);
                            let acked_lsn = self.acked_lsn;
                            let oldest = in_flight.iter().find_map(|f| f.first_commit_micros);
                            self.oldest_unacked_micros.store(oldest.unwrap_or(0), Ordering::Relaxed);
                            let (lag_records, lag_micros) = self.lag();
                            self.status.send_modify(|s| {
                                s.last_contact = Some(last_contact);
                                if acked_lsn > s.acked_lsn || lag_records == 0 {
                                    // Past where earlier sessions broke, if they did,
                                    // or nothing left to break at.
                                    s.last_error = None;
                                }
                                s.acked_lsn = acked_lsn;
                                s.acked_durable = from_marks(&ack.durable);
                                s.acked_applied = applied;
                                s.lag_records = lag_records;
                                s.lag_micros = lag_micros;
                                if let Some(rt) = round_trip {
                                    s.ack_micros = rt;
                                    s.ack_micros_mean = smoothed(s.ack_micros_mean, rt);
                                }
                            });
                            self.report_acks();
                            // Stopped before another stream's transaction: ship again
                            // once the receiver has it (it acks, unasked, when its
                            // marks move).
                            let unblocked = reader.blocked_at.as_ref().is_some_and(|r| {
                                !self.link.waits_for_sibling(&r.entry, &high_water, &others.decided)
                                    || self.link.takes_over(&r.entry, &others.absent(tuning.takeover_after))
                            });
                            if unblocked
                                && in_flight.len() < tuning.max_in_flight_batches
                                && in_flight_bytes < tuning.max_in_flight_bytes
                            {
                                self.end_linger(&mut lingering);
                                if let Err(e) = self.ship(&tx, &mut reader, &high_water, &others, &mut in_flight, &mut in_flight_bytes, &mut last_sent).await {
                                    return Err(why_closed(e, &mut inbound, tuning.peer_timeout).await);
                                }
                            }
                        }
                        Some(receiver_message::Msg::Heartbeat(_)) => {
                            self.status.send_if_modified(|s| {
                                s.last_contact = Some(last_contact);
                                false
                            });
                        }
                        Some(receiver_message::Msg::Refused(r)) => {
                            return Err(StreamError::Refused { code: r.code, reason: r.reason });
                        }
                        Some(receiver_message::Msg::HelloReply(_)) | None => {
                            return Err(StreamError::Protocol("unexpected HelloReply".into()));
                        }
                    }
                }
                _ = heartbeat.tick() => {
                    if last_contact.elapsed() > tuning.peer_timeout {
                        return Err(StreamError::PeerTimeout);
                    }
                    // The lag grows between acks too (a receiver that stopped acking,
                    // a log that grows while the window is full): refreshed here, for
                    // readers only.
                    self.refresh_lag();
                    if last_sent.elapsed() >= tuning.heartbeat {
                        let hb = pb::SenderMessage {
                            msg: Some(sender_message::Msg::Heartbeat(pb::Heartbeat { sent_micros: now_micros() })),
                        };
                        // A full channel is traffic enough.
                        let _ = tx.try_send(hb);
                        last_sent = Instant::now();
                    }
                }
                _ = self.wake.notified(), if room => {
                    if lingers {
                        let ready = self.db.last_lsn().0.saturating_sub(reader.cursor.0.saturating_sub(1));
                        if ready < tuning.linger_records as u64 {
                            if !lingering {
                                lingering = true;
                                linger.as_mut().reset(tokio::time::Instant::now() + tuning.linger);
                                // Commits wake this sender again only once the log holds
                                // enough to ship now.
                                let enough = reader.cursor.0.saturating_sub(1) + tuning.linger_records as u64;
                                self.wake_at.store(enough, Ordering::Release);
                            }
                            continue;
                        }
                    }
                    self.end_linger(&mut lingering);
                    if let Err(e) = self.ship(&tx, &mut reader, &high_water, &others, &mut in_flight, &mut in_flight_bytes, &mut last_sent).await {
                        return Err(why_closed(e, &mut inbound, tuning.peer_timeout).await);
                    }
                }
                _ = &mut linger, if lingering && room => {
                    self.end_linger(&mut lingering);
                    if let Err(e) = self.ship(&tx, &mut reader, &high_water, &others, &mut in_flight, &mut in_flight_bytes, &mut last_sent).await {
                        return Err(why_closed(e, &mut inbound, tuning.peer_timeout).await);
                    }
                }
                _ = poll.tick(), if room => {
                    if lingering {
                        // Its timer ships what lingers, the wake that finds enough
                        // records sooner.
                        continue;
                    }
                    if let Err(e) = self.ship(&tx, &mut reader, &high_water, &others, &mut in_flight, &mut in_flight_bytes, &mut last_sent).await {
                        return Err(why_closed(e, &mut inbound, tuning.peer_timeout).await);
                    }
                }
            }
        }
    }

    /// The lag now: log records after the acknowledged position, and the age of the
    /// oldest transaction the receiver has not acknowledged — the oldest one sent, or
    /// when none is out, the first record after the acknowledged position (0 when
    /// there is none). Both are upper bounds: records the link does not carry count
    /// until an ack moves past them.
    fn lag(&self) -> (u64, u64) {
        let records = self.db.last_lsn().0.saturating_sub(self.acked_lsn.0);
        let oldest = match self.oldest_unacked_micros.load(Ordering::Relaxed) {
            0 if records > 0 => self.commit_micros_at(self.acked_lsn.next()),
            0 => None,
            m => Some(m),
        };
        let micros = oldest.map_or(0, |m| now_micros().saturating_sub(m).max(0) as u64);
        (records, micros)
    }

    /// When the record at `lsn` was committed: from the in-memory tail, else from the
    /// log (only while nothing is in flight, at most once per ack or heartbeat).
    fn commit_micros_at(&self, lsn: Lsn) -> Option<i64> {
        let from_tail = self
            .db
            .log_tail(lsn, 1)
            .and_then(|r| r.first().map(|r| r.entry.commit_micros()));
        from_tail.or_else(|| {
            self.db
                .log_range(lsn, 1)
                .ok()
                .and_then(|r| r.first().map(|r| r.entry.commit_micros()))
        })
    }

    /// Awaits one step of connecting (the connection, the stream's opening, the
    /// receiver's answer to Hello), bounded by the connect timeout, keeping the
    /// published lag fresh meanwhile: a receiver that accepts connections but does not
    /// answer holds a session here for up to the timeout, three times over. `None` on
    /// shutdown, which does not wait for the step.
    async fn connecting<T>(
        &self,
        step: impl std::future::Future<Output = T>,
    ) -> Result<Option<T>, StreamError> {
        let timeout = tokio::time::sleep(self.link.tuning.connect_timeout);
        tokio::pin!(step, timeout);
        let mut refresh = tokio::time::interval(self.link.tuning.heartbeat);
        loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Ok(None),
                out = &mut step => return Ok(Some(out)),
                _ = &mut timeout => return Err(StreamError::PeerTimeout),
                _ = refresh.tick() => self.refresh_lag(),
            }
        }
    }

    /// Publishes the lag now, for readers only (watchers are not woken).
    fn refresh_lag(&self) {
        let (lag_records, lag_micros) = self.lag();
        self.status.send_if_modified(|s| {
            s.lag_records = lag_records;
            s.lag_micros = lag_micros;
            false
        });
    }

    /// Ends a linger: commits wake the sender again.
    fn end_linger(&self, lingering: &mut bool) {
        *lingering = false;
        self.wake_at.store(0, Ordering::Release);
    }

    /// Fails when log after the acknowledged position was released and the receiver's
    /// marks (`receiver`, from its HelloReply) do not show that it has everything of it
    /// this link carries: sending what follows would skip the rest silently. When they
    /// do — a duplicate gave it the rows and the marks, or it got them from another
    /// stream — the session goes on from the log's start (the receiver skips what it
    /// has by its marks).
    fn check_log(&mut self, receiver: &BTreeMap<NodeId, u64>) -> Result<(), StreamError> {
        let log_start = self.db.log_start();
        if self.acked_lsn.next() >= log_start {
            return Ok(());
        }
        // Read after the start: marks only grow, so they cover the log released by then.
        let released = self.db.released_marks()?;
        let origins = self.link.carried_origins();
        let lacks = released
            .iter()
            .filter(|(o, _)| origins.contains(o))
            .any(|(o, seq)| receiver.get(o).copied().unwrap_or(0) < *seq);
        if lacks {
            return Err(StreamError::LogReleased {
                acked: self.acked_lsn,
                log_start,
            });
        }
        info!(
            acked = self.acked_lsn.0,
            log_start = log_start.0,
            "the receiver's marks cover the released log: resuming from the log's start"
        );
        self.acked_lsn = Lsn(log_start.0.saturating_sub(1));
        let acked = self.acked_lsn;
        self.status.send_modify(|s| {
            s.acked_lsn = s.acked_lsn.max(acked);
            s.sent_lsn = s.sent_lsn.max(acked);
        });
        Ok(())
    }

    /// Fails when the receiver holds commits of this node's origin beyond where this
    /// node's own commits stopped at its last machine restart: they were lost here, and
    /// this node's next commits take the same seqs, which the receiver would skip as
    /// duplicates — silent divergence. A receiver that holds no more is recorded as
    /// checked (durably), once per restart.
    async fn check_after_restart(
        &self,
        high_water: &BTreeMap<NodeId, u64>,
        held_after: CommitsAfter,
    ) -> Result<(), StreamError> {
        let receiver = self.link.receiver_store.as_str().to_string();
        if !self.db.restart_check_pending(&receiver) {
            return Ok(());
        }
        let holds = high_water.get(&self.db.node_id()).copied().unwrap_or(0);
        let link = self.link.clone();
        let verdict = self
            .about_receiver(move |db, receiver, node| {
                let point = db.restart_point().map(|p| p.seq).unwrap_or(0);
                let mut evidence = RestartEvidence::default();
                // Only a receiver holding more than the point needs its evidence weighed,
                // and only one that answered the probe has any.
                if holds > point && held_after.complete {
                    let (own, own_complete) = db.commits_after(
                        db.node_id(),
                        point,
                        holds,
                        crate::receiver::PROBE_LIMIT,
                        |r| {
                            let commit = HeldCommit {
                                seq: r.gtid().seq,
                                commit_micros: r.entry.commit_micros(),
                            };
                            (commit, link.carries(&r.entry))
                        },
                    )?;
                    evidence = RestartEvidence {
                        held: Some(held_after),
                        own,
                        own_complete,
                    };
                }
                Ok(db.check_receiver_after_restart(receiver, node, holds, &evidence)?)
            })
            .await?;
        match verdict {
            RestartCheck::Admitted => Ok(()),
            RestartCheck::Diverged(d) => Err(StreamError::Diverged {
                holds: d.holds,
                restart_seq: d.seq,
            }),
        }
    }

    /// Refuses a receiver that holds more of this node's origin than this node has
    /// committed ([`Database::check_receiver_ahead`]), at every session. (On the
    /// blocking pool: a verdict that changes what the store recorded is flushed.)
    async fn check_ahead(&self, high_water: &BTreeMap<NodeId, u64>) -> Result<(), StreamError> {
        let holds = high_water.get(&self.db.node_id()).copied().unwrap_or(0);
        let verdict = self
            .about_receiver(move |db, receiver, node| {
                Ok(db.check_receiver_ahead(receiver, node, holds)?)
            })
            .await?;
        match verdict {
            RestartCheck::Admitted => Ok(()),
            // Recorded by the reuse check: this node's seqs had passed what it holds.
            RestartCheck::Diverged(d) if d.holds <= d.seq => {
                Err(StreamError::GaveAgain { holds: d.holds })
            }
            RestartCheck::Diverged(d) => Err(StreamError::Ahead {
                holds: d.holds,
                own: d.seq,
            }),
        }
    }

    /// Checks this node's own commit under the seq of the receiver's newest commit of
    /// this node's origin, as the log passes it: the receiver skips it as a duplicate,
    /// so it must be the very commit the receiver has (same commit time). Another one
    /// means this node gave that seq to another commit — it lost the receiver's, say
    /// when its data directory was put back from a copy and it took writes before this
    /// stream came up — and every commit of it up to there would be skipped: the
    /// receiver is diverged, and recorded so durably.
    async fn check_reused(&self, entry: &LogEntry) -> Result<(), StreamError> {
        let gtid = entry.gtid();
        if gtid.origin != self.db.node_id() {
            return Ok(());
        }
        // Two atomic loads per own record on the way (the ship loop's path); the
        // receiver's seq is 0 once checked or passed.
        let want = self.unverified_seq.load(Ordering::Acquire);
        if want == 0 || gtid.seq < want {
            return Ok(());
        }
        // Checked now, or passed without finding it (not in what this stream reads).
        self.unverified_seq.store(0, Ordering::Release);
        let theirs = self.unverified_micros.load(Ordering::Acquire);
        let ours = entry.commit_micros();
        if gtid.seq > want || ours == theirs {
            return Ok(());
        }
        self.about_receiver(move |db, receiver, node| {
            Ok(db.mark_receiver_diverged(receiver, node, want)?)
        })
        .await?;
        Err(StreamError::Reused {
            holds: want,
            theirs,
            ours,
        })
    }

    /// Runs `f` with the store, the receiver's store name and its node id on the
    /// blocking pool: the receiver checks write what they find through to the store.
    async fn about_receiver<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database, &str, u64) -> Result<T, StreamError> + Send + 'static,
    ) -> Result<T, StreamError> {
        let (db, receiver, node) = (
            self.db.clone(),
            self.link.receiver_store.as_str().to_string(),
            self.link.receiver_node.0,
        );
        tokio::task::spawn_blocking(move || f(&db, &receiver, node))
            .await
            .map_err(|e| StreamError::Protocol(format!("checking the receiver: {e}")))?
    }

    /// Hands the current status to the ack hook, if there is one.
    fn report_acks(&self) {
        if let Some(hook) = &self.on_ack {
            (hook.0)(&self.status.borrow());
        }
    }

    fn clear_unflushed(&self) {
        *self
            .unflushed_since
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Publishes the transaction the stream stopped before and what it waits for
    /// ([`SenderStatus::held`]) when that changed. Readers see it; waiters are not
    /// woken.
    fn publish_held(
        &self,
        reader: &Reader,
        high_water: &BTreeMap<NodeId, u64>,
        decided: &BTreeMap<(NodeId, NodeId), u64>,
    ) {
        let current = self.status.borrow().held.as_ref().map(|h| h.gtid);
        let held = match (&reader.blocked_at, reader.blocked_since) {
            (Some(r), Some(since)) if current != Some(r.entry.gtid()) => Some(Held {
                gtid: r.entry.gtid(),
                since,
                waits_for: self.link.waits_for(&r.entry, high_water, decided),
            }),
            (Some(_), Some(_)) => return,
            _ if current.is_none() => return,
            _ => None,
        };
        self.status.send_if_modified(|s| {
            s.held = held;
            false
        });
    }

    /// Reads the log from the reader's cursor and sends batches while there is log and
    /// room.
    ///
    /// Log this receiver gets nothing of (other tables, other elements) is skipped
    /// without a message: its position goes out in a record-less batch at most every
    /// [`SenderTuning::position_every`], or with the next batch that carries records,
    /// so a master busy with tables a receiver does not subscribe to does not cost
    /// that receiver a round trip per commit (`Reader::unsent`).
    ///
    /// A stream that stops before another stream's transaction (`LinkConfig::siblings`)
    /// says so (`Batch.waiting`) and keeps what it read ahead for the next turn.
    #[allow(clippy::too_many_arguments)]
    async fn ship(
        &self,
        tx: &mpsc::Sender<pb::SenderMessage>,
        reader: &mut Reader,
        high_water: &BTreeMap<NodeId, u64>,
        others: &Others,
        in_flight: &mut VecDeque<InFlight>,
        in_flight_bytes: &mut u64,
        last_sent: &mut Instant,
    ) -> Result<(), StreamError> {
        let tuning = &self.link.tuning;
        let decided = &others.decided;
        let before = reader
            .blocked_at
            .take()
            .zip(reader.blocked_since.take())
            .map(|(r, since)| (r.lsn, since));
        let was_blocked = before.is_some();
        // Siblings' senders long without a stream to the receiver, as an ack that came
        // since this stream stopped says: it takes over this node's transactions they
        // would relay (`LinkConfig::takes_over`). Not on older news: a stopped stream
        // asks at once, and the answer decides.
        let absent = match (before, others.last_heard) {
            (Some((_, since)), Some(heard)) if heard > since => {
                others.absent(tuning.takeover_after)
            }
            _ => BTreeSet::new(),
        };
        while in_flight.len() < tuning.max_in_flight_batches
            && *in_flight_bytes < tuning.max_in_flight_bytes
        {
            // The log's end is an atomic read; reading the log is a range scan whose every
            // step descends the tree. So the log is not read when nothing is past the
            // cursor (every wake after the one that shipped a commit group), and otherwise
            // asked for exactly the records there are (LSNs are dense), which spares the
            // scan the step that would only find the end.
            //
            // A sender that keeps up reads the store's in-memory tail of the log (no
            // engine read, no decoding); one that is behind reads the engine. What was
            // read and not passed yet is kept (`Reader::ahead`).
            // Read before the log's end (see Sender::claim_relayed).
            let upstream = self.upstream_through();
            let last_lsn = self.db.last_lsn();
            let next = reader.ahead.back().map_or(reader.cursor, |r| r.lsn.next());
            let room = tuning.max_batch_records.saturating_sub(reader.ahead.len());
            if last_lsn >= next && room > 0 {
                let available = usize::try_from(last_lsn.0 - next.0 + 1).unwrap_or(usize::MAX);
                let limit = available.min(room);
                match self.db.log_tail(next, limit) {
                    Some(records) => reader.ahead.extend(records),
                    None => {
                        // Behind the tail, each record read is decoded and held until
                        // passed: about a batch's bytes at a time (at least a record),
                        // not `max_batch_records` whatever their size — 512 records of
                        // 40 MiB would be 20 GiB.
                        let limit = self.records_within(next, limit, tuning.max_batch_bytes);
                        reader
                            .ahead
                            .extend(self.db.log_range(next, limit)?.into_iter().map(Arc::new));
                    }
                }
            }
            let to_end = reader.ahead.back().map_or(reader.cursor, |r| r.lsn.next()) > last_lsn;
            if reader.ahead.is_empty() {
                // Passed through the log's end. New claims about the origins this
                // stream relays go out at once (another relay may wait for them), at
                // most every poll; a position alone at most every `position_every`.
                self.claim_relayed(&[], 0, Some(&upstream));
                let claims = self.claims_unsent();
                let every = if claims {
                    tuning.poll_interval
                } else {
                    tuning.position_every
                };
                let position = match reader.unsent {
                    None if claims => Some(Lsn(reader.cursor.0.saturating_sub(1))),
                    unsent => unsent,
                };
                if let Some(position) = position {
                    if last_sent.elapsed() >= every {
                        self.send(
                            tx,
                            Vec::new(),
                            position,
                            None,
                            false,
                            in_flight,
                            in_flight_bytes,
                        )
                        .await?;
                        *last_sent = Instant::now();
                        reader.unsent = None;
                    }
                }
                return Ok(());
            }
            let records: &[Arc<LogRecord>] = reader.ahead.make_contiguous();
            let mut through = None;
            // Records passed: the first `passed` of `records`.
            let mut passed = 0;
            let mut blocked_at = None;
            let mut wire: Vec<(Epoch, Cow<'_, LogEntry>)> = Vec::new();
            let mut first_commit_micros = None;
            let mut size = codec::BATCH_HEADER_BYTES;
            let cap = batch_cap(tuning.max_batch_bytes, self.max_message_bytes);
            let mut unflushed = false;
            // This node's own commits go out only once durable here — or, on a stream a
            // return service waits on, once written to the log while their sync runs
            // (see docs/stream.md, "Shipping before the sync"): a receiver must
            // never hold a commit this node could lose in a crash, since after it this
            // node would give the lost commit's seq to another transaction and the
            // receiver would skip that one as a duplicate. A written commit survives a
            // crash of this process; a crash of the machine is what the restart's fence
            // covers. (Other origins' records may go before: a crash here loses them
            // on both sides' terms, and they come back from their origin under the
            // same Gtid.) With non-durable commits (`--durable-commits false`) the node
            // accepts losing them in a crash of the machine, and nobody flushes after
            // a commit: it writes them to its log on the way out (no sync), so that a
            // crash of the process alone does not lose what a receiver holds.
            let durable_from = if !self.db.options().durable_commits {
                let last = records.last().map_or(Lsn::ZERO, |r| r.lsn);
                let written = self.db.written_lsn();
                if last > written {
                    self.db.write_ahead()?.next()
                } else {
                    written.next()
                }
            } else if ships_written(&self.link, &self.db) {
                self.db.written_lsn().next()
            } else {
                self.db.flushed_lsn().next()
            };
            let own = self.db.node_id();
            for (i, r) in records.iter().enumerate() {
                self.check_reused(&r.entry).await?;
                if r.lsn >= durable_from && r.entry.gtid().origin == own {
                    // Its commit is flushing; the committer wakes the senders after.
                    unflushed = true;
                    break;
                }
                let takes_over = !absent.is_empty() && self.link.takes_over(&r.entry, &absent);
                if !takes_over && self.link.waits_for_sibling(&r.entry, high_water, decided) {
                    // Another stream to this receiver carries it: stop before it until
                    // the receiver has it (see LinkConfig::siblings).
                    if self.link.decides_while_waiting(&r.entry) {
                        // Nothing of it is this stream's, nor of the own commits
                        // after it that only relays carry: decided, so that a relay
                        // that cannot see this node's other commits may ship them
                        // (one ping-pong per run of them, not per commit).
                        let run = records[i..]
                            .iter()
                            .filter(|r| r.entry.gtid().origin == own)
                            .take_while(|r| {
                                r.lsn < durable_from && self.link.decides_while_waiting(&r.entry)
                            })
                            .last();
                        if let Some(last) = run {
                            self.decided
                                .fetch_max(last.entry.gtid().seq, Ordering::AcqRel);
                        }
                    }
                    blocked_at = Some(r.clone());
                    break;
                }
                let entry = if self.link.forked_off(r.epoch, &r.entry) {
                    // Not the receiver's, ever: passed over like a record it does not
                    // carry.
                    None
                } else if takes_over {
                    self.link.filter_whole(&r.entry, high_water)
                } else {
                    self.link.filter_ref(&r.entry, high_water)
                };
                let entry_size = entry.as_ref().map_or(0, |e| codec::record_size(r.epoch, e));
                if !wire.is_empty() && size + entry_size > cap {
                    // The next batch's, which it may have to itself.
                    break;
                }
                through = Some(r.lsn);
                passed = i + 1;
                if r.entry.gtid().origin == own {
                    self.decided.fetch_max(r.entry.gtid().seq, Ordering::AcqRel);
                }
                if let Some(entry) = entry {
                    size += entry_size;
                    first_commit_micros.get_or_insert(entry.commit_micros());
                    wire.push((r.epoch, entry));
                }
                if size >= cap {
                    break;
                }
            }
            self.claim_relayed(records, passed, to_end.then_some(&upstream));
            let Some(through) = through else {
                if unflushed {
                    // Normally the committer's flush ends within a millisecond and it
                    // wakes the senders; past that, flush on its behalf.
                    let since = *self
                        .unflushed_since
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert_with(Instant::now);
                    if since.elapsed() < UNFLUSHED_PATIENCE {
                        return Ok(());
                    }
                    self.db.flush().await?;
                    self.clear_unflushed();
                    continue;
                }
                // Blocked at the cursor: ask for the receiver's marks (a record-less
                // batch flagged waiting is answered with them at once, and again
                // whenever another stream's apply moves them) when newly blocked, and
                // at most every poll after that.
                if !was_blocked || last_sent.elapsed() >= tuning.poll_interval {
                    let position = reader
                        .unsent
                        .unwrap_or(Lsn(reader.cursor.0.saturating_sub(1)));
                    self.say_waiting(tx, position, in_flight, in_flight_bytes)
                        .await?;
                    *last_sent = Instant::now();
                    reader.unsent = None;
                }
                reader.block(blocked_at, before);
                return Ok(());
            };
            self.clear_unflushed();
            let blocked = blocked_at.is_some();
            if wire.is_empty() {
                reader.pass(passed, through);
                reader.unsent = Some(through);
                if blocked && !was_blocked {
                    // Say so now (see above).
                    self.say_waiting(tx, through, in_flight, in_flight_bytes)
                        .await?;
                    *last_sent = Instant::now();
                    reader.unsent = None;
                }
                if blocked || unflushed {
                    reader.block(blocked_at, before);
                    return Ok(());
                }
                // Nothing of this batch was the receiver's (it has those origins' commits
                // already, or they were forked off): past a failover a whole backlog can
                // be like that. Say how far the stream has come, as at the log's end, or
                // the receiver takes the silence for a dead sender (peer timeout) and
                // every new session scans the same backlog again.
                if last_sent.elapsed() >= tuning.position_every {
                    self.send(
                        tx,
                        Vec::new(),
                        through,
                        None,
                        false,
                        in_flight,
                        in_flight_bytes,
                    )
                    .await?;
                    *last_sent = Instant::now();
                    reader.unsent = None;
                }
                // And let the runtime's other tasks (Raft, liveness reports, commits)
                // run between batches, or the node stalls for as long as the scan and
                // is failed over as silent.
                tokio::task::yield_now().await;
                continue;
            }
            self.send(
                tx,
                wire,
                through,
                first_commit_micros,
                blocked,
                in_flight,
                in_flight_bytes,
            )
            .await?;
            reader.pass(passed, through);
            *last_sent = Instant::now();
            reader.unsent = None;
            if blocked || unflushed {
                reader.block(blocked_at, before);
                return Ok(());
            }
        }
        Ok(())
    }

    /// How many of the `limit` records from `from` on make at most `budget` bytes as the
    /// store keeps them (at least one), by the sizes it holds in memory: no read.
    fn records_within(&self, from: Lsn, limit: usize, budget: usize) -> usize {
        let bytes_from = |lsn: Lsn| self.db.log_bytes_from(lsn).unwrap_or(0);
        let all = bytes_from(from);
        count_within(limit, budget as u64, |n| {
            all.saturating_sub(bytes_from(Lsn(from.0 + n as u64)))
        })
    }

    /// How far this node holds each origin this stream relays, as far as the streams
    /// into this node say (`LinkConfig::upstream`, `SenderStart::upstream`).
    fn upstream_through(&self) -> BTreeMap<NodeId, u64> {
        if self.relays.is_empty() {
            return BTreeMap::new();
        }
        self.link
            .upstream
            .iter()
            .filter(|(o, _)| self.relays.contains(o))
            .filter_map(|(o, senders)| self.upstream.through(*o, senders).map(|n| (*o, n)))
            .collect()
    }

    /// Raises this session's claims about the origins the stream relays
    /// (`Batch.relayed`) once the first `passed` of `records` (read from the cursor
    /// on) are passed. Its transactions passed are decided. This node's log holds an
    /// origin's transactions in seq order (a receiver skips an older one), so one not
    /// passed yet means every earlier one of its origin is. And with `upstream` —
    /// given when `records` reach the log's end as read after it — an origin none of
    /// whose transactions is left is decided through what this node holds of it.
    fn claim_relayed(
        &self,
        records: &[Arc<LogRecord>],
        passed: usize,
        upstream: Option<&BTreeMap<NodeId, u64>>,
    ) {
        if self.relays.is_empty() {
            return;
        }
        let mut claims = self.relayed.lock();
        for r in &records[..passed] {
            let g = r.entry.gtid();
            if self.relays.contains(&g.origin) {
                claims.raise(g.origin, g.seq);
            }
        }
        let mut pending = BTreeSet::new();
        for r in &records[passed..] {
            let g = r.entry.gtid();
            if self.relays.contains(&g.origin) && pending.insert(g.origin) {
                claims.raise(g.origin, g.seq.saturating_sub(1));
                if pending.len() == self.relays.len() {
                    break;
                }
            }
        }
        for (o, n) in upstream.into_iter().flatten() {
            if !pending.contains(o) {
                claims.raise(*o, *n);
            }
        }
    }

    /// Claims about relayed origins not sent yet.
    fn claims_unsent(&self) -> bool {
        let claims = self.relayed.lock();
        claims.now != claims.sent
    }

    /// Sends a record-less batch through `position` that says the stream waits for
    /// another stream's transaction (`Batch.waiting`).
    async fn say_waiting(
        &self,
        tx: &mpsc::Sender<pb::SenderMessage>,
        position: Lsn,
        in_flight: &mut VecDeque<InFlight>,
        in_flight_bytes: &mut u64,
    ) -> Result<(), StreamError> {
        self.send(
            tx,
            Vec::new(),
            position,
            None,
            true,
            in_flight,
            in_flight_bytes,
        )
        .await
    }

    /// Sends one batch of `wire` records, acknowledged up to `through`; `waiting`: the
    /// stream stops after it for another stream's transaction (`Batch.waiting`).
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        tx: &mpsc::Sender<pb::SenderMessage>,
        wire: Vec<(Epoch, Cow<'_, LogEntry>)>,
        through: Lsn,
        first_commit_micros: Option<i64>,
        waiting: bool,
        in_flight: &mut VecDeque<InFlight>,
        in_flight_bytes: &mut u64,
    ) -> Result<(), StreamError> {
        let raw = {
            let refs: Vec<(Epoch, &LogEntry)> = wire.iter().map(|(e, r)| (*e, &**r)).collect();
            encode_entries(&refs)
        };
        let count = wire.len() as u64;
        drop(wire);
        let raw_bytes = raw.len() as u64;
        let payload = compress_at(self.link.compression, self.link.tuning.zstd_level, raw);
        let batch = pb::Batch {
            through_lsn: through.0,
            count: u32::try_from(count).unwrap_or(u32::MAX),
            codec: codec_to_pb(self.link.compression) as i32,
            raw_bytes,
            payload,
            decided: self.decided.load(Ordering::Acquire),
            waiting,
            relayed: {
                let mut claims = self.relayed.lock();
                let claims = &mut *claims;
                claims.sent.clone_from(&claims.now);
                claims
                    .now
                    .iter()
                    .map(|(o, seq)| pb::OriginMark {
                        origin: o.0,
                        seq: *seq,
                    })
                    .collect()
            },
            chunk: None,
        };
        let wire_bytes = batch.payload.len() as u64;
        if let Some(m) = first_commit_micros {
            // The oldest unacknowledged, unless an older one is still out.
            let _ = self.oldest_unacked_micros.compare_exchange(
                0,
                m,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        // A batch larger than a batch may be (one transaction, alone in it) goes in
        // chunks of that size, back to back: the receiver applies it once it has them
        // all. Chunks no larger than a batch keep the receiver hearing from this sender
        // as often as whole batches do (it times out a silent sender after a second,
        // and a message is heard of only once all of it has come).
        let chunk = batch_cap(self.link.tuning.max_batch_bytes, self.max_message_bytes);
        let pieces = chunks::split(batch, usize::try_from(chunk).unwrap_or(usize::MAX));
        if pieces.len() > 1 {
            debug!(
                through = through.0,
                raw_bytes,
                wire_bytes,
                chunks = pieces.len(),
                "a batch larger than a message goes in chunks"
            );
        }
        for piece in pieces {
            let msg = pb::SenderMessage {
                msg: Some(sender_message::Msg::Batch(piece)),
            };
            // Cannot happen with the budget at half the limit; if it did, the receiver
            // would drop the stream at it, again at every attempt.
            let len = prost::Message::encoded_len(&msg) as u64;
            if len > self.max_message_bytes {
                return Err(StreamError::Protocol(format!(
                    "a batch message of {len} bytes (through LSN {}) exceeds the receiver's \
                     message limit of {} bytes",
                    through.0, self.max_message_bytes
                )));
            }
            tx.send(msg).await.map_err(|_| StreamError::Closed)?;
        }
        in_flight.push_back(InFlight {
            through_lsn: through,
            sent_at: Instant::now(),
            wire_bytes,
            first_commit_micros,
        });
        *in_flight_bytes += wire_bytes;
        // Counters only: readers see them, waiters are not woken (see SenderStatus).
        self.status.send_if_modified(|s| {
            s.sent_lsn = through;
            s.batches_sent += 1;
            s.transactions_sent += count;
            s.raw_bytes += raw_bytes;
            s.wire_bytes += wire_bytes;
            false
        });
        Ok(())
    }
}

/// The encoded bytes a batch of several records stays within, and the largest chunk of
/// a batch of one larger record: the tuning's batch size, or less when half the
/// receiver's message limit is less.
fn batch_cap(max_batch_bytes: usize, max_message_bytes: u64) -> u64 {
    (max_batch_bytes.min(chunks::payload_budget(max_message_bytes))) as u64
}

/// The message limit a session keeps to: the lower of what this sender was told
/// (`ours`) and what the receiver says it reads (`theirs`, 0 when it does not say).
fn message_limit(ours: u64, theirs: u64) -> u64 {
    match theirs {
        0 => ours,
        t => ours.min(t),
    }
}

/// How many of the `limit` records from some LSN on make at most `budget` bytes, at
/// least one: `bytes(n)` is the bytes of the first `n` (growing with `n`).
fn count_within(limit: usize, budget: u64, bytes: impl Fn(usize) -> u64) -> usize {
    if limit <= 1 || bytes(limit) <= budget {
        return limit;
    }
    // The largest n in [1, limit) with bytes(n) <= budget, or 1.
    let (mut lo, mut hi) = (1, limit);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if bytes(mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// How a session failed, for the wait before the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// The receiver could not be reached or the connection broke: cheap to try again,
    /// and a restarting peer is back soon.
    Unreachable,
    /// The receiver refused the stream, or this node did (the log, a diverged receiver),
    /// or something it sent could not be read: the same attempt fails again until
    /// something changes.
    Refused,
}

impl Failure {
    fn of(e: &StreamError) -> Self {
        use tonic::Code;
        match e {
            StreamError::Connect(_) | StreamError::PeerTimeout | StreamError::Closed => {
                Failure::Unreachable
            }
            StreamError::Rpc(status) => match status.code() {
                // A connection reset, a peer gone away or restarting.
                Code::Unavailable
                | Code::Unknown
                | Code::Cancelled
                | Code::Aborted
                | Code::DeadlineExceeded => Failure::Unreachable,
                // A message too large, one that does not decode, an unknown service.
                _ => Failure::Refused,
            },
            StreamError::Refused { .. }
            | StreamError::Protocol(_)
            | StreamError::LogReleased { .. }
            | StreamError::Diverged { .. }
            | StreamError::Ahead { .. }
            | StreamError::Reused { .. }
            | StreamError::GaveAgain { .. }
            | StreamError::Store(_)
            | StreamError::Codec(_) => Failure::Refused,
        }
    }
}

/// The wait before the next attempt after one that failed as `failure`, the last wait
/// having been `previous` (`None`: none since a session streamed): `backoff_min`, then
/// doubled at each failure up to the failure's ceiling — `reconnect_max` for a receiver
/// that could not be reached, `backoff_max` for a refusal. A longer wait left by
/// refusals drops to `reconnect_max` as soon as the receiver is found down: it is
/// restarting, and what it refused may be gone when it is back.
/// A drill's partition ([`hawser_core::isolation`]): no stream to or from peers while
/// it lasts; the session ends as if the peer were unreachable.
fn isolation_check() -> Result<(), StreamError> {
    if hawser_core::isolation::isolated() {
        return Err(StreamError::Rpc(tonic::Status::unavailable(
            hawser_core::isolation::REFUSAL,
        )));
    }
    Ok(())
}

fn next_backoff(
    previous: Option<Duration>,
    failure: Failure,
    tuning: &crate::link::SenderTuning,
) -> Duration {
    let ceiling = match failure {
        Failure::Unreachable => tuning.reconnect_max,
        Failure::Refused => tuning.backoff_max,
    }
    .max(tuning.backoff_min);
    match previous {
        None => tuning.backoff_min,
        Some(p) => (p * 2).clamp(tuning.backoff_min, ceiling),
    }
}

/// What ended a stream on which this sender hit `e`: when it could no longer write to
/// it ([`StreamError::Closed`]), the receiver's refusal if one is on its way (a
/// receiver refuses a stream with a message and then closes it, and the close may
/// reach a sender that is writing first), read for at most `wait`; `e` otherwise.
async fn why_closed(
    e: StreamError,
    inbound: &mut tonic::Streaming<pb::ReceiverMessage>,
    wait: Duration,
) -> StreamError {
    if !matches!(e, StreamError::Closed) {
        return e;
    }
    let reason = async {
        loop {
            match inbound.message().await {
                Ok(Some(pb::ReceiverMessage {
                    msg: Some(receiver_message::Msg::Refused(r)),
                })) => {
                    return StreamError::Refused {
                        code: r.code,
                        reason: r.reason,
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => return StreamError::Closed,
                Err(status) => return StreamError::Rpc(status),
            }
        }
    };
    tokio::time::timeout(wait, reason)
        .await
        .unwrap_or(StreamError::Closed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::SenderTuning;

    #[test]
    fn batches_stay_within_the_tuning_and_half_the_receivers_limit() {
        let mib = 1024 * 1024;
        // The defaults: 1 MiB batches, well under half of 16 MiB.
        let t = SenderTuning::default();
        assert_eq!(
            batch_cap(t.max_batch_bytes, t.max_message_bytes as u64),
            mib
        );
        // A receiver that reads small messages gets small batches.
        assert_eq!(batch_cap(mib as usize, 64 * 1024), 32 * 1024);
        // The receiver's limit counts when it is the lower one, and only then.
        assert_eq!(message_limit(16 * mib, 4 * mib), 4 * mib);
        assert_eq!(message_limit(16 * mib, 64 * mib), 16 * mib);
        assert_eq!(message_limit(16 * mib, 0), 16 * mib);
    }

    #[test]
    fn a_read_takes_the_records_within_the_budget_and_at_least_one() {
        let sizes = [100u64, 200, 300, 400, 50_000, 10];
        let bytes = |n: usize| sizes[..n].iter().sum::<u64>();
        // All of them fit.
        assert_eq!(count_within(6, 1_000_000, bytes), 6);
        // The first three fit exactly, the fourth would pass the budget.
        assert_eq!(count_within(6, 600, bytes), 3);
        assert_eq!(count_within(6, 999, bytes), 3);
        assert_eq!(count_within(6, 1000, bytes), 4);
        // A record larger than the budget is read alone.
        assert_eq!(count_within(6, 50, bytes), 1);
        assert_eq!(count_within(2, 10, |n| [60_000, 5][..n].iter().sum()), 1);
        // The limit bounds as before.
        assert_eq!(count_within(2, 1_000_000, bytes), 2);
        assert_eq!(count_within(0, 10, bytes), 0);
        // Every budget gives the most records within it (checked against a scan).
        for budget in 0..1200 {
            let most = (1..=6).rev().find(|&n| bytes(n) <= budget).unwrap_or(1);
            assert_eq!(count_within(6, budget, bytes), most, "budget {budget}");
        }
    }

    #[test]
    fn a_receiver_found_down_is_tried_again_within_a_quarter_second_a_refusal_backs_off_to_5_s() {
        let t = SenderTuning::default();
        let ms = Duration::from_millis;
        let waits = |failures: &[Failure]| {
            let mut last = None;
            failures
                .iter()
                .map(|f| {
                    let w = next_backoff(last, *f, &t);
                    last = Some(w);
                    w
                })
                .collect::<Vec<_>>()
        };
        use Failure::{Refused, Unreachable};
        // A peer that is down: 50, 100, 200, then every 250 ms.
        assert_eq!(
            waits(&[Unreachable; 6]),
            [ms(50), ms(100), ms(200), ms(250), ms(250), ms(250)]
        );
        // A peer that refuses: doubling to 5 s.
        assert_eq!(
            waits(&[Refused; 9]),
            [
                ms(50),
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(5000),
                ms(5000)
            ]
        );
        // Refused for long, then found down (it restarts): back to 250 ms at once, and
        // a refusal after that grows from there.
        let mut w = waits(&[Refused; 8]);
        assert_eq!(w.last(), Some(&ms(5000)));
        w.push(next_backoff(w.last().copied(), Unreachable, &t));
        assert_eq!(w.last(), Some(&ms(250)));
        assert_eq!(next_backoff(Some(ms(250)), Refused, &t), ms(500));
        // Nothing since a session streamed: the shortest wait, whatever the failure.
        assert_eq!(next_backoff(None, Refused, &t), ms(50));
        assert_eq!(next_backoff(None, Unreachable, &t), ms(50));
        // A ceiling below the first wait is no ceiling below it.
        let odd = SenderTuning {
            backoff_min: ms(300),
            ..SenderTuning::default()
        };
        assert_eq!(next_backoff(Some(ms(300)), Unreachable, &odd), ms(300));
    }

    #[test]
    fn failures_are_told_by_whether_the_peer_was_there_to_refuse() {
        use tonic::{Code, Status};
        let rpc = |code| StreamError::Rpc(Status::new(code, "x"));
        for e in [
            StreamError::PeerTimeout,
            StreamError::Closed,
            rpc(Code::Unavailable),
            rpc(Code::Unknown),
            rpc(Code::Cancelled),
        ] {
            assert_eq!(Failure::of(&e), Failure::Unreachable, "{e}");
        }
        for e in [
            StreamError::Refused {
                code: 1,
                reason: "stale".into(),
            },
            StreamError::Protocol("x".into()),
            // "decoded message length too large" and the like: it fails the same way
            // again.
            rpc(Code::OutOfRange),
            rpc(Code::Internal),
            rpc(Code::Unimplemented),
            StreamError::LogReleased {
                acked: Lsn(1),
                log_start: Lsn(5),
            },
        ] {
            assert_eq!(Failure::of(&e), Failure::Refused, "{e}");
        }
    }

    #[test]
    fn the_ack_round_trip_mean_takes_the_first_sample_then_moves_an_eighth() {
        assert_eq!(smoothed(0, 400), 400);
        assert_eq!(smoothed(400, 1200), 500);
        assert_eq!(smoothed(500, 100), 450);
        // A sub-microsecond round trip still counts as measured.
        assert_eq!(smoothed(0, 0), 1);
        // Steady samples converge on the sample.
        let mut m = 0;
        for _ in 0..60 {
            m = smoothed(m, 1000);
        }
        assert_eq!(m, 1000);
        let mut m = 8000;
        for _ in 0..60 {
            m = smoothed(m, 300);
        }
        assert!((300..=310).contains(&m), "{m}");
    }
}
