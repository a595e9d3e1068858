//! One session of a sender, from connect to its end: the Hello exchange and the
//! receiver's checks, then the loop that takes acks, ships what [`super::plan`]
//! decides and sends it. Only messages, bytes and the store are handled here; what to
//! do with them is decided by the pure parts.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_core::{Epoch, Lsn, NodeId};
use hawser_store::blocking::sized;
use hawser_store::{CommitsAfter, HeldCommit, LogEntry, LogRecord};
use tokio::sync::{mpsc, watch};
use tokio::time::MissedTickBehavior;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info};

use super::claims::Others;
use super::inbound::{send_while_heard, Inbound};
use super::plan::{self, Reader, ReuseWatch, Turn};
use super::rules::{
    batch_cap, clears_error, count_within, durable_from, message_limit, on_wake, position_due,
    raise_marks, read_span, resume_after, smoothed, waiting_due, DurableFrom, Wake,
};
use super::status::ships_written;
use super::window::{InFlight, Window};
use super::{
    from_marks, isolation_check, now_micros, why_closed, Held, Sender, SenderState,
    UNFLUSHED_PATIENCE,
};
use crate::chunks;
use crate::codec::{compress_at, encode_entries};
use crate::codec_to_pb;
use crate::error::StreamError;
use crate::liveness::{heartbeats, Heard};
use crate::pb::{self, receiver_message, sender_message};

/// A session's state: where it is in the log, what its receiver holds and has heard,
/// and what it has sent.
struct Session {
    out: Outbound,
    reader: Reader,
    /// What the receiver holds per origin: its HelloReply's marks, raised by acks.
    high_water: BTreeMap<NodeId, u64>,
    others: Others,
    reuse: ReuseWatch,
    /// Commits wait for company (see `SenderTuning::linger`).
    lingering: bool,
}

/// Where a session's batches go, and what is out.
struct Outbound {
    tx: mpsc::Sender<pb::SenderMessage>,
    window: Window,
    /// When the last message went out.
    last_sent: Instant,
    /// When the receiver was last heard from: a send on a full channel waits only
    /// while it is.
    heard: Heard,
    peer_timeout: Duration,
}

/// One batch to send.
struct Outgoing<'r> {
    wire: Vec<(Epoch, Cow<'r, LogEntry>)>,
    /// The receiver acknowledges up to here.
    through: Lsn,
    first_commit_micros: Option<i64>,
    /// The stream stops after it for another stream's transaction (`Batch.waiting`).
    waiting: bool,
    /// Its encoded size, as planned.
    size: u64,
}

impl Outgoing<'_> {
    /// A record-less batch: how far the stream has come, and whether it waits.
    fn position(through: Lsn, waiting: bool) -> Self {
        Self {
            wire: Vec::new(),
            through,
            first_commit_micros: None,
            waiting,
            size: crate::codec::BATCH_HEADER_BYTES,
        }
    }
}

/// Resolves when the watched written position moves; never without one to watch (or
/// once the store is gone).
async fn written_moved(written: &mut Option<watch::Receiver<Lsn>>) {
    let Some(w) = written else {
        return std::future::pending().await;
    };
    if w.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Sender {
    /// One connection, from connect to its end. `Ok` only on shutdown.
    pub(super) async fn session(&mut self, streamed: &mut bool) -> Result<(), StreamError> {
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
        let mut stream = opened?.into_inner();
        let Some(first) = self.connecting(stream.message()).await? else {
            return Ok(());
        };
        let first = first?;
        let (high_water, held_after, reuse) = match first.and_then(|m| m.msg) {
            Some(receiver_message::Msg::HelloReply(r)) => {
                self.max_message_bytes = message_limit(
                    self.link.tuning.max_message_bytes as u64,
                    r.max_message_bytes,
                );
                let reuse =
                    ReuseWatch::new(r.last_of_sender.as_ref().map(|c| (c.seq, c.commit_micros)));
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
                (from_marks(&r.high_waters), held, reuse)
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

        let last_contact = Instant::now();
        // From here on the receiver's messages are read as they come, whatever the
        // session is doing (see `inbound`).
        let mut inbound = Inbound::start(stream, tokio::time::Instant::now());
        // Beats go out from a task of their own, whatever the session is doing (the
        // checks below included; see `crate::liveness`); the loop's tick judges the
        // receiver's silence.
        let _beats = heartbeats(tx.clone(), tuning.heartbeat, || pb::SenderMessage {
            msg: Some(sender_message::Msg::Heartbeat(pb::Heartbeat {
                sent_micros: now_micros(),
            })),
        });
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
        let mut s = Session {
            out: Outbound {
                tx,
                window: Window::default(),
                last_sent: Instant::now(),
                heard: inbound.heard().clone(),
                peer_timeout: tuning.peer_timeout,
            },
            reader: Reader::new(self.acked_lsn.next()),
            high_water,
            others: Others::default(),
            reuse,
            lingering: false,
        };
        let mut heartbeat = tokio::time::interval(tuning.heartbeat);
        // One timer for the session rather than a new one per turn of the loop (each
        // wake and each ack is a turn).
        let mut poll = tokio::time::interval(tuning.poll_interval);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // A lazy stream's commits wait up to `linger` for company (see SenderTuning).
        let lingers = !self.link.returns_wait && !tuning.linger.is_zero();
        let linger = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(linger);
        // A stream that ships this node's commits once written hears of each commit
        // flush's write, which the store publishes before the sync.
        let mut written = ships_written(&self.link, &self.db).then(|| self.db.watch_written());
        loop {
            isolation_check()?;
            // Why the last turn stopped, if it did, for status.
            self.publish_held(&s);
            let room = s.out.window.has_room(&tuning);
            let ship = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Ok(()),
                msg = inbound.message() => {
                    let msg = msg?.ok_or(StreamError::Closed)?;
                    match msg.msg {
                        Some(receiver_message::Msg::Ack(ack)) => {
                            self.take_ack(&mut s, &ack);
                            // Stopped before another stream's transaction: ship again
                            // once the receiver has it (it acks, unasked, when its
                            // marks move).
                            s.reader.blocked_at.is_some()
                                && plan::unblocked(
                                    &self.link,
                                    s.reader.blocked_at.as_ref(),
                                    &s.high_water,
                                    &s.others.decided,
                                    &s.others.absent(tuning.takeover_after, Instant::now()),
                                )
                                && s.out.window.has_room(&tuning)
                        }
                        // Noted by the reader, not queued.
                        Some(receiver_message::Msg::Heartbeat(_)) => false,
                        Some(receiver_message::Msg::Refused(r)) => {
                            return Err(StreamError::Refused { code: r.code, reason: r.reason });
                        }
                        Some(receiver_message::Msg::HelloReply(_)) | None => {
                            return Err(StreamError::Protocol("unexpected HelloReply".into()));
                        }
                    }
                }
                _ = heartbeat.tick() => {
                    let heard = inbound.heard();
                    if heard.silent(tokio::time::Instant::now(), tuning.peer_timeout) {
                        return Err(StreamError::PeerTimeout);
                    }
                    let last_contact = heard.last();
                    self.status.send_if_modified(|st| {
                        st.last_contact = Some(last_contact);
                        false
                    });
                    // The lag grows between acks too (a receiver that stopped acking,
                    // a log that grows while the window is full): refreshed here, for
                    // readers only.
                    self.refresh_lag();
                    false
                }
                _ = self.wake.notified(), if room => {
                    match on_wake(lingers, s.lingering, self.db.last_lsn(), s.reader.cursor, tuning.linger_records) {
                        Wake::Ship => true,
                        Wake::Wait => false,
                        Wake::Linger { until } => {
                            s.lingering = true;
                            linger.as_mut().reset(tokio::time::Instant::now() + tuning.linger);
                            // Commits wake this sender again only once the log holds
                            // enough to ship now.
                            self.wake_at.store(until, Ordering::Release);
                            false
                        }
                    }
                }
                _ = written_moved(&mut written), if room => true,
                _ = &mut linger, if s.lingering && room => true,
                // While lingering, its timer ships what lingers, the wake that finds
                // enough records sooner.
                _ = poll.tick(), if room => !s.lingering,
            };
            if ship {
                self.end_linger(&mut s);
                if let Err(e) = self.ship(&mut s).await {
                    return Err(why_closed(e, &mut inbound, tuning.peer_timeout).await);
                }
            }
        }
    }

    /// Takes in an ack: frees what it covers, moves the resume position and the
    /// receiver's marks, and publishes them.
    fn take_ack(&mut self, s: &mut Session, ack: &pb::Ack) {
        let now = Instant::now();
        let through = Lsn(ack.through_lsn);
        let round_trip = s.out.window.acked(through, now);
        self.acked_lsn = resume_after(self.acked_lsn, through, ack);
        let applied = from_marks(&ack.applied);
        raise_marks(&mut s.high_water, &applied);
        s.others.heard(&self.link, ack, now);
        self.oldest_unacked_micros = s.out.window.oldest_commit_micros().unwrap_or(0);
        let (lag_records, lag_micros) = self.lag();
        let (acked_lsn, last_contact) = (self.acked_lsn, s.out.heard.last());
        self.status.send_modify(|st| {
            st.last_contact = Some(last_contact);
            if clears_error(acked_lsn, st.acked_lsn, lag_records) {
                st.last_error = None;
            }
            st.acked_lsn = acked_lsn;
            st.acked_durable = from_marks(&ack.durable);
            st.acked_applied = applied;
            st.lag_records = lag_records;
            st.lag_micros = lag_micros;
            if let Some(rt) = round_trip {
                st.ack_micros = rt;
                st.ack_micros_mean = smoothed(st.ack_micros_mean, rt);
            }
        });
        self.report_acks();
    }

    /// Ends a linger: commits wake the sender again.
    fn end_linger(&self, s: &mut Session) {
        s.lingering = false;
        self.wake_at.store(0, Ordering::Release);
    }

    /// Publishes the transaction the stream stopped before and what it waits for
    /// ([`super::SenderStatus::held`]) when that changed. Readers see it; waiters are
    /// not woken.
    fn publish_held(&self, s: &Session) {
        let current = self.status.borrow().held.as_ref().map(|h| h.gtid);
        let held = match (&s.reader.blocked_at, s.reader.blocked_since) {
            (Some(r), Some(since)) if current != Some(r.entry.gtid()) => Some(Held {
                gtid: r.entry.gtid(),
                since,
                waits_for: self
                    .link
                    .waits_for(&r.entry, &s.high_water, &s.others.decided),
            }),
            (Some(_), Some(_)) => return,
            _ if current.is_none() => return,
            _ => None,
        };
        self.status.send_if_modified(|st| {
            st.held = held;
            false
        });
    }

    /// Reads the log from the reader's cursor and sends batches while there is log and
    /// room.
    ///
    /// Log this receiver gets nothing of (other tables, other elements) is skipped
    /// without a message: its position goes out in a record-less batch at most every
    /// [`SenderTuning::position_every`](crate::link::SenderTuning::position_every), or
    /// with the next batch that carries records, so a master busy with tables a
    /// receiver does not subscribe to does not cost that receiver a round trip per
    /// commit (`Reader::unsent`).
    ///
    /// A stream that stops before another stream's transaction (`LinkConfig::siblings`)
    /// says so (`Batch.waiting`) and keeps what it read ahead for the next turn.
    async fn ship(&mut self, s: &mut Session) -> Result<(), StreamError> {
        let tuning = self.link.tuning.clone();
        let before = s.reader.unblock();
        let was_blocked = before.is_some();
        // Siblings' senders long without a stream to the receiver: it takes over this
        // node's transactions they would relay (`LinkConfig::takes_over`).
        let absent = s.others.absent_since_blocked(
            before.map(|(_, since)| since),
            tuning.takeover_after,
            Instant::now(),
        );
        let cap = batch_cap(tuning.max_batch_bytes, self.max_message_bytes);
        let ships_written = ships_written(&self.link, &self.db);
        let own = self.db.node_id();
        while s.out.window.has_room(&tuning) {
            // The log's end is an atomic read; reading the log is a range scan whose every
            // step descends the tree. So the log is not read when nothing is past the
            // cursor (every wake after the one that shipped a commit group), and otherwise
            // asked for exactly the records there are.
            //
            // A sender that keeps up reads the store's in-memory tail of the log (no
            // engine read, no decoding); one that is behind reads the engine. What was
            // read and not passed yet is kept (`Reader::ahead`).
            // Read before the log's end (see Claims::passed).
            let upstream = self.upstream_through();
            let last_lsn = self.db.last_lsn();
            let span = read_span(
                s.reader.next_to_read(),
                last_lsn,
                s.reader.ahead.len(),
                tuning.max_batch_records,
            );
            if let Some((next, limit)) = span {
                match self.db.log_tail(next, limit) {
                    Some(records) => s.reader.ahead.extend(records),
                    None => {
                        // Behind the tail, each record read is decoded and held until
                        // passed: about a batch's bytes at a time (at least a record),
                        // not `max_batch_records` whatever their size — 512 records of
                        // 40 MiB would be 20 GiB.
                        let limit = self.records_within(next, limit, tuning.max_batch_bytes);
                        s.reader
                            .ahead
                            .extend(self.db.log_range(next, limit)?.into_iter().map(Arc::new));
                    }
                }
            }
            let to_end = s.reader.next_to_read() > last_lsn;
            if s.reader.ahead.is_empty() {
                // Passed through the log's end. New claims about the origins this
                // stream relays go out at once (another relay may wait for them).
                self.claims.passed(&[], 0, Some(&upstream));
                let due = position_due(
                    s.reader.unsent,
                    s.reader.cursor,
                    self.claims.unsent(),
                    s.out.last_sent.elapsed(),
                    &tuning,
                );
                if let Some(position) = due {
                    self.send(&mut s.out, Outgoing::position(position, false))
                        .await?;
                    s.reader.unsent = None;
                }
                return Ok(());
            }
            let last_read = s.reader.ahead.back().map_or(Lsn::ZERO, |r| r.lsn);
            let durable_from = match durable_from(
                self.db.options().durable_commits,
                ships_written,
                self.db.written_lsn(),
                self.db.flushed_lsn(),
                last_read,
            ) {
                DurableFrom::At(lsn) => lsn,
                DurableFrom::WriteAhead => self.db.write_ahead()?.next(),
            };
            let records: &[Arc<LogRecord>] = s.reader.ahead.make_contiguous();
            let turn = Turn {
                link: &self.link,
                own,
                durable_from,
                absent: &absent,
                high_water: &s.high_water,
                decided: &s.others.decided,
                cap,
            };
            let plan = plan::plan(&turn, records, &mut s.reuse);
            if let Some(r) = plan.reused {
                return Err(self.reused(r).await);
            }
            self.decided = self.decided.max(plan.decided);
            self.claims
                .passed(records, plan.passed, to_end.then_some(&upstream));
            let plan::Plan {
                passed,
                through,
                wire,
                first_commit_micros,
                blocked_at,
                unflushed,
                size,
                ..
            } = plan;
            let Some(through) = through else {
                if unflushed {
                    // Normally the committer's flush ends within a millisecond and it
                    // wakes the senders; past that, flush on its behalf.
                    let since = *self.unflushed_since.get_or_insert_with(Instant::now);
                    if since.elapsed() < UNFLUSHED_PATIENCE {
                        return Ok(());
                    }
                    self.db.flush().await?;
                    self.unflushed_since = None;
                    continue;
                }
                // Blocked at the cursor: ask for the receiver's marks (a record-less
                // batch flagged waiting is answered with them at once, and again
                // whenever another stream's apply moves them).
                if waiting_due(was_blocked, s.out.last_sent.elapsed(), &tuning) {
                    let position =
                        s.reader
                            .unsent
                            .unwrap_or(Lsn(s.reader.cursor.0.saturating_sub(1)));
                    self.send(&mut s.out, Outgoing::position(position, true))
                        .await?;
                    s.reader.unsent = None;
                }
                s.reader.block(blocked_at, before, Instant::now());
                return Ok(());
            };
            self.unflushed_since = None;
            let blocked = blocked_at.is_some();
            if wire.is_empty() {
                s.reader.pass(passed, through);
                s.reader.unsent = Some(through);
                if blocked && !was_blocked {
                    // Say so now (see above).
                    self.send(&mut s.out, Outgoing::position(through, true))
                        .await?;
                    s.reader.unsent = None;
                }
                if blocked || unflushed {
                    s.reader.block(blocked_at, before, Instant::now());
                    return Ok(());
                }
                // Nothing of this batch was the receiver's (it has those origins' commits
                // already, or they were forked off): past a failover a whole backlog can
                // be like that. Say how far the stream has come, as at the log's end, or
                // the receiver takes the silence for a dead sender (peer timeout) and
                // every new session scans the same backlog again.
                if s.out.last_sent.elapsed() >= tuning.position_every {
                    self.send(&mut s.out, Outgoing::position(through, false))
                        .await?;
                    s.reader.unsent = None;
                }
                // And let the runtime's other tasks (Raft, liveness reports, commits)
                // run between batches, or the node stalls for as long as the scan and
                // is failed over as silent.
                tokio::task::yield_now().await;
                continue;
            }
            let batch = Outgoing {
                wire,
                through,
                first_commit_micros,
                waiting: blocked,
                size,
            };
            self.send(&mut s.out, batch).await?;
            s.reader.pass(passed, through);
            s.reader.unsent = None;
            if blocked || unflushed {
                s.reader.block(blocked_at, before, Instant::now());
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

    /// Sends one batch, in chunks when it is larger than a message may be, and counts
    /// it in flight.
    async fn send(&mut self, out: &mut Outbound, batch: Outgoing<'_>) -> Result<(), StreamError> {
        let Outgoing {
            wire,
            through,
            first_commit_micros,
            waiting,
            size,
        } = batch;
        let (codec, level) = (self.link.compression, self.link.tuning.zstd_level);
        // Encoding a large transaction takes long: off the worker.
        let (raw_bytes, payload) = sized(usize::try_from(size).unwrap_or(usize::MAX), || {
            let refs: Vec<(Epoch, &LogEntry)> = wire.iter().map(|(e, r)| (*e, &**r)).collect();
            let raw = encode_entries(&refs);
            (raw.len() as u64, compress_at(codec, level, raw).into())
        });
        let count = wire.len() as u64;
        drop(wire);
        let batch = pb::Batch {
            through_lsn: through.0,
            count: u32::try_from(count).unwrap_or(u32::MAX),
            codec: codec_to_pb(self.link.compression) as i32,
            raw_bytes,
            payload,
            decided: self.decided,
            waiting,
            relayed: self.claims.send(),
            chunk: None,
        };
        let wire_bytes = batch.payload.len() as u64;
        if let Some(m) = first_commit_micros {
            // The oldest unacknowledged, unless an older one is still out.
            if self.oldest_unacked_micros == 0 {
                self.oldest_unacked_micros = m;
            }
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
            send_while_heard(&out.tx, msg, &out.heard, out.peer_timeout).await?;
        }
        out.window.sent(InFlight {
            through_lsn: through,
            sent_at: Instant::now(),
            wire_bytes,
            first_commit_micros,
        });
        out.last_sent = Instant::now();
        // Counters only: readers see them, waiters are not woken (see SenderStatus).
        self.status.send_if_modified(|st| {
            st.sent_lsn = through;
            st.batches_sent += 1;
            st.transactions_sent += count;
            st.raw_bytes += raw_bytes;
            st.wire_bytes += wire_bytes;
            false
        });
        Ok(())
    }
}
