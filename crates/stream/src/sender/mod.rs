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
//!
//! The parts: [`status`] (what a sender shows, its handle), [`rules`] and [`window`]
//! (batch sizes, backoff, linger, positions, the in-flight window: pure), [`claims`]
//! (what a session says and hears of other streams: pure), [`plan`] (what a turn ships
//! of the records read ahead: pure), and the task itself — this module (sessions,
//! the checks on a receiver) and `session` (one connection's loop, shipping, sending).

mod claims;
mod inbound;
mod plan;
mod rules;
mod session;
mod status;
#[cfg(test)]
mod testing;
mod window;

pub use status::{AckHook, Held, SenderHandle, SenderStart, SenderState, SenderStatus};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_core::{Gtid, Lsn, NodeId, QualName};
use hawser_store::{
    CommitsAfter, Database, DdlOp, HeldCommit, LogEntry, RestartCheck, RestartEvidence,
};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Endpoint;
use tracing::{debug, info, instrument, warn};

use crate::codec;
use crate::error::StreamError;
use crate::link::LinkConfig;
use crate::paths::DecidedMarks;
use crate::pb::{self, receiver_message};
use crate::{codec_to_pb, PROTOCOL_VERSION};

use claims::Claims;
use plan::Reused;
use rules::{next_backoff, Failure};
use status::ships_written;

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
            oldest_unacked_micros: 0,
            unflushed_since: None,
            decided: 0,
            claims: Claims::new(relays),
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
    oldest_unacked_micros: i64,
    /// Since when the log at the cursor is this node's own commit not yet flushed.
    unflushed_since: Option<Instant>,
    /// How far this stream has decided about this node's own commits (seq): each one
    /// up to it was passed (shipped, whole if the stream carries any of it, or found
    /// nothing of it for this stream), or is one this stream waits before that only
    /// relays of it to the receiver carry (`LinkConfig::decides_while_waiting`). Sent
    /// with Hello and every batch (`Batch.decided`).
    decided: u64,
    /// What this session has decided about the origins it relays (`Batch.relayed`):
    /// the origins other than this node whose transactions the stream carries, when it
    /// has siblings or feeds a relay.
    claims: Claims,
    /// This node's receiver's marks (`SenderStart::upstream`).
    upstream: DecidedMarks,
    on_ack: Option<AckHook>,
}

/// How long a sender waits for an own commit's flush before flushing itself: a commit
/// whose caller went away (a dropped request) is applied but nobody flushes it, and
/// without a later commit it would hold the stream back for good.
const UNFLUSHED_PATIENCE: Duration = Duration::from_millis(20);

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

    fn hello(&mut self) -> Result<pb::Hello, StreamError> {
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
    fn decided_at_start(&mut self) -> Result<u64, StreamError> {
        const LOOK_BACK: usize = 4096;
        let at = self
            .db
            .own_seq_through(self.acked_lsn, LOOK_BACK)?
            .unwrap_or(0);
        self.decided = at;
        self.claims.restart();
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

    /// The lag now: log records after the acknowledged position, and the age of the
    /// oldest transaction the receiver has not acknowledged — the oldest one sent, or
    /// when none is out, the first record after the acknowledged position (0 when
    /// there is none). Both are upper bounds: records the link does not carry count
    /// until an ack moves past them.
    fn lag(&self) -> (u64, u64) {
        let records = self.db.last_lsn().0.saturating_sub(self.acked_lsn.0);
        let oldest = match self.oldest_unacked_micros {
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

    /// Records durably that the receiver is diverged and ends the session: the log
    /// passed this node's own commit under the seq of the receiver's newest commit of
    /// this node's origin, and it is not the commit the receiver has ([`Reused`]). The
    /// receiver skips it as a duplicate; this node gave that seq to another commit — it
    /// lost the receiver's, say when its data directory was put back from a copy and it
    /// took writes before this stream came up — and every commit of it up to there
    /// would be skipped.
    async fn reused(&self, r: Reused) -> StreamError {
        let holds = r.holds;
        let marked = self
            .about_receiver(move |db, receiver, node| {
                Ok(db.mark_receiver_diverged(receiver, node, holds)?)
            })
            .await;
        match marked {
            Ok(_) => StreamError::Reused {
                holds: r.holds,
                theirs: r.theirs,
                ours: r.ours,
            },
            Err(e) => e,
        }
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

    /// How far this node holds each origin this stream relays, as far as the streams
    /// into this node say (`LinkConfig::upstream`, `SenderStart::upstream`).
    fn upstream_through(&self) -> BTreeMap<NodeId, u64> {
        if self.claims.relays().is_empty() {
            return BTreeMap::new();
        }
        self.link
            .upstream
            .iter()
            .filter(|(o, _)| self.claims.relays().contains(o))
            .filter_map(|(o, senders)| self.upstream.through(*o, senders).map(|n| (*o, n)))
            .collect()
    }
}

/// it lasts; the session ends as if the peer were unreachable.
fn isolation_check() -> Result<(), StreamError> {
    if hawser_core::isolation::isolated() {
        return Err(StreamError::Rpc(tonic::Status::unavailable(
            hawser_core::isolation::REFUSAL,
        )));
    }
    Ok(())
}

/// What ended a stream on which this sender hit `e`: when it could no longer write to
/// it ([`StreamError::Closed`]), the receiver's refusal if one is on its way (a
/// receiver refuses a stream with a message and then closes it, and the close may
/// reach a sender that is writing first), read for at most `wait`; `e` otherwise.
async fn why_closed(e: StreamError, inbound: &mut inbound::Inbound, wait: Duration) -> StreamError {
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
                Err(e) => return e,
            }
        }
    };
    tokio::time::timeout(wait, reason)
        .await
        .unwrap_or(StreamError::Closed)
}
