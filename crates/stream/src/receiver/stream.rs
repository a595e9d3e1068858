//! The tasks that serve one accepted stream: the reader, which reads messages ahead
//! of the apply and joins chunks, and the apply loop, which moves messages between the
//! stream, the store and the ack rules ([`super::acks`]), and keeps heartbeating.

use std::collections::BTreeMap;
use std::sync::Arc;

use hawser_core::{Ident, NodeId};
use hawser_store::Pacer;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};
use tracing::{debug, info, warn};

use super::accepted::Accepted;
use super::acks::{ack_message, wakes_waiters, Acks, BacklogDone, LAZY_FLUSH_EVERY};
use super::backlog::{gather_backlog, paces, stream_slice, Inbound};
use super::runs::Tally;
use super::{refused, ReceiverService};
use crate::chunks::Joiner;
use crate::liveness::{self, heartbeats, AbortOnDrop, Ear, Heard};
use crate::pb::{self, receiver_message, sender_message, RefuseCode};

/// The channel a stream's answers go out on.
type Outbound = mpsc::Sender<Result<pb::ReceiverMessage, Status>>;

/// Messages read ahead of the apply at most: room for a sender's whole in-flight
/// window (32 batches by default) and its heartbeats. A full queue stops reading, and
/// HTTP/2 flow control then stops the sender.
const READ_AHEAD: usize = 64;

impl ReceiverService {
    /// Serves one accepted stream until it ends, is refused or is cancelled.
    ///
    /// The stream is read ahead of the apply into a bounded queue, so batches the
    /// sender has in flight reach this node (and release HTTP/2 flow-control window)
    /// while a run applies: they are the backlog the next apply sees.
    pub(super) async fn serve(
        self,
        accepted: Accepted,
        inbound: Streaming<pb::SenderMessage>,
        out: Outbound,
    ) {
        let _connected = Connected::new(&self.connected, accepted.sender_node);
        let (queue_tx, queue) = mpsc::channel(READ_AHEAD);
        let stop = self.shutdown.child_token();
        let joiner = Joiner::new(self.config.max_transaction_bytes);
        let (ear, heard) = liveness::ear(tokio::time::Instant::now());
        // A task of its own: the apply may block its task for long (a large
        // transaction's write), and the sender's messages are noted meanwhile.
        let reader = AbortOnDrop::spawn(read_ahead(inbound, queue_tx, joiner, ear, stop.clone()));
        // From a task of their own, whatever the apply is doing (`crate::liveness`);
        // ended with the stream (the task holds a sender of `out`).
        let beats = heartbeats(out.clone(), self.config.heartbeat, || {
            Ok(pb::ReceiverMessage {
                msg: Some(receiver_message::Msg::Heartbeat(pb::Heartbeat {
                    sent_micros: now_micros(),
                })),
            })
        });
        self.apply_stream(accepted, queue, heard, out).await;
        drop(beats);
        stop.cancel();
        reader.join().await;
    }

    /// The ack of what `acks` says was applied, as a message.
    fn ack_of(&self, acks: &Acks) -> pb::ReceiverMessage {
        ack_message(acks.ack(self.connected_senders(), &self.decided))
    }

    /// Applies what the reader queued, acknowledging each backlog, until the stream
    /// ends, is refused or is cancelled.
    async fn apply_stream(
        &self,
        mut accepted: Accepted,
        mut queue: mpsc::Receiver<Inbound>,
        heard: Heard,
        out: Outbound,
    ) {
        let sender = accepted.sender.clone();
        let metrics = InboundMetrics::new(&sender);
        // Nobody waits on this stream's applies: they give way to other work now and
        // then, unless the stream is behind.
        let mut pacer =
            stream_slice(self.config.apply_slice, accepted.returns_wait).map(Pacer::new);
        let mut acks = Acks::new(
            self.db.high_waters().unwrap_or_default(),
            accepted.returns_wait,
        );
        let mut heartbeat = tokio::time::interval(self.config.heartbeat);
        let mut lazy_flush = tokio::time::interval(LAZY_FLUSH_EVERY);
        lazy_flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut moved = self.applied.subscribe();
        // A message read while gathering a backlog that is not a batch: handled next.
        let mut carried = None;
        loop {
            let msg = match carried.take() {
                Some(msg) => msg,
                None => tokio::select! {
                    biased;
                    _ = self.shutdown.cancelled() => break,
                    _ = lazy_flush.tick(), if acks.flush_due() => {
                        // Applied without waiting for the flush (no return service on
                        // this stream): one flush covers them all, then the durable
                        // marks catch up, and one ack answers every batch since the
                        // last.
                        let applied = acks.marks.applied.clone();
                        let paced_flush = pacer.as_mut().filter(|_| paces(!queue.is_empty()));
                        let before = paced_flush.as_ref().map(|p| p.pauses());
                        // Heartbeats go on meanwhile (a task of their own), and the
                        // reader notes the sender's messages.
                        let flushed = match paced_flush {
                            Some(p) => self.db.flush_paced(p).await,
                            None => self.db.flush().await,
                        };
                        if let (Some(before), Some(p)) = (before, pacer.as_ref()) {
                            self.count_pauses(&sender, &metrics, p.pauses() - before);
                        }
                        if let Err(e) = flushed {
                            warn!(sender = %sender, error = %e, "flush failed; dropping the stream");
                            break;
                        }
                        acks.flushed(applied);
                        if out.send(Ok(self.ack_of(&acks))).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    Ok(()) = moved.changed(), if acks.waiting() => {
                        if let Ok(now) = self.db.high_waters() {
                            acks.marks.refresh(&now);
                        }
                        if out.send(Ok(self.ack_of(&acks))).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    _ = heartbeat.tick() => {
                        if heard.silent(tokio::time::Instant::now(), self.config.peer_timeout) {
                            info!(sender = %sender, "sender silent past the peer timeout; dropping the stream");
                            break;
                        }
                        let last = heard.last();
                        self.update_counters(&sender, |s| s.last_contact = Some(last));
                        if let Ok(now) = self.db.high_waters() {
                            acks.marks.refresh(&now);
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
            match msg.msg {
                Some(sender_message::Msg::Batch(batch)) => {
                    let mut backlog = vec![batch];
                    if self.config.compile.enabled {
                        carried =
                            gather_backlog(&mut queue, &mut backlog, self.config.max_run_bytes);
                    }
                    let mut paced = pacer
                        .as_mut()
                        .filter(|_| paces(carried.is_some() || !queue.is_empty()));
                    let pauses_before = paced.as_ref().map_or(0, |p| p.pauses());
                    let applied = self
                        .apply_backlog(&mut accepted, &backlog, paced.as_deref_mut())
                        .await;
                    if let Some(p) = paced {
                        self.count_pauses(&sender, &metrics, p.pauses() - pauses_before);
                    }
                    match applied {
                        Ok(done) => {
                            let plan = done.plan;
                            acks.marks.after_backlog(
                                &done.received,
                                plan.records,
                                done.flushed,
                                || self.db.high_waters().ok(),
                            );
                            metrics.record(&done.tally);
                            self.update_counters(&sender, |s| {
                                let t = &done.tally;
                                s.through_lsn = plan.through_lsn;
                                s.batches += backlog.len() as u64;
                                s.transactions += t.transactions;
                                s.transactions_skipped += t.skipped;
                                s.row_changes += t.row_changes;
                                s.rows_written += t.rows_compiled + t.rows_in_order;
                                s.rows_written_compiled += t.rows_compiled;
                                s.runs_compiled += t.runs_compiled;
                                s.runs_in_order += t.runs_in_order;
                                s.raw_bytes += plan.raw_bytes;
                                s.wire_bytes += plan.wire_bytes;
                            });
                            // Streams waiting for another's transaction hear of it, and
                            // of decisions they may wait for.
                            if wakes_waiters(plan.records, done.decided_moved) {
                                self.applied.send_modify(|n| *n = n.wrapping_add(1));
                            }
                            let ack_now = acks.backlog_applied(BacklogDone {
                                batches: backlog.len(),
                                wire_bytes: plan.wire_bytes,
                                through_lsn: plan.through_lsn,
                                waiting: plan.waiting,
                            });
                            if acks.waiting() {
                                // Answered below; later moves are news.
                                moved.mark_unchanged();
                            }
                            if ack_now && out.send(Ok(self.ack_of(&acks))).await.is_err() {
                                break;
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

    /// Counts the pauses a paced apply or flush of `sender`'s stream took.
    fn count_pauses(&self, sender: &Ident, metrics: &InboundMetrics, pauses: u64) {
        if pauses > 0 {
            metrics.pauses.increment(pauses);
            self.update_counters(sender, |s| s.apply_pauses += pauses);
        }
    }
}

/// Reads `inbound` into `queue` until the stream ends or fails (queued too) or `stop`.
///
/// Chunks of a batch are joined here (`joiner`), so that the apply sees whole batches
/// only, and a stream that ends between two chunks drops the ones it had.
///
/// Each message's arrival is noted on `ear`, so the apply knows the sender is alive
/// while a large transaction arrives or a long apply runs. Heartbeats and chunks that
/// do not complete their batch say nothing more and are not queued.
async fn read_ahead(
    mut inbound: Streaming<pb::SenderMessage>,
    queue: mpsc::Sender<Inbound>,
    mut joiner: Joiner,
    ear: Ear,
    stop: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            msg = inbound.message() => msg,
        };
        if let Ok(Some(_)) = msg {
            ear.heard(tokio::time::Instant::now());
        }
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
                Ok(None) => continue,
                Err(e) => Err(Status::invalid_argument(e.to_string())),
            },
            Ok(Some(pb::SenderMessage {
                msg: Some(sender_message::Msg::Heartbeat(_)),
            })) => continue,
            other => other,
        };
        let last = !matches!(msg, Ok(Some(_)));
        // Waiting for room is the apply's time, not the sender's silence.
        ear.queueing();
        let queued = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            queued = queue.send(msg) => queued,
        };
        if queued.is_err() || last {
            break;
        }
        ear.listening(tokio::time::Instant::now());
    }
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

/// Microseconds since the Unix epoch, for heartbeats.
fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
