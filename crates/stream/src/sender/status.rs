//! What a sender shows and how it is driven from outside: its state and status, the
//! handle the commit path wakes it through, and where it starts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hawser_core::{Gtid, Lsn, NodeId};
use hawser_store::Database;
use tokio::sync::{watch, Notify};

use crate::codec::Compression;
use crate::link::LinkConfig;
use crate::paths::DecidedMarks;

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
    pub(super) fn new() -> Self {
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
    pub(super) status: watch::Receiver<SenderStatus>,
    pub(super) wake: Arc<Notify>,
    /// Set while the sender lingers: the log's last LSN at which it has enough records
    /// to ship at once (see [`SenderTuning::linger`](crate::link::SenderTuning::linger)); 0 when a wake may be needed.
    pub(super) wake_at: Arc<AtomicU64>,
    pub(super) db: Database,
    /// Whether it ships this node's commits once written, before their sync (see
    /// [`SenderHandle::ships_written`]).
    pub(super) ships_written: bool,
    /// How its batches are compressed (the link's [`LinkConfig::compression`], and
    /// its zstd level).
    pub(super) compression: Compression,
    pub(super) zstd_level: i32,
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
    /// wake it until enough are ready (see [`SenderTuning::linger`](crate::link::SenderTuning::linger)).
    pub fn lingering(&self) -> bool {
        self.wake_at.load(Ordering::Acquire) != 0
    }

    /// Whether this sender ships this node's own commits as soon as they are written
    /// to the log, while their sync is still under way: on a stream a return service
    /// waits on (the commit waits for the receiver's ack anyway, so the two syncs
    /// overlap instead of following each other), when the node commits durably. Such
    /// a sender watches the written position the commit path publishes between the
    /// write and the sync ([`Database::watch_written`]).
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

/// See [`SenderHandle::ships_written`].
pub(super) fn ships_written(link: &LinkConfig, db: &Database) -> bool {
    link.returns_wait && db.options().durable_commits
}
