//! What a stream answers its sender, and when: the ack rules, pure.
//!
//! A stream's [`Acks`] holds the marks its acks carry ([`Marks`]) and what it applied
//! since its last ack. The stream task tells it what happened — a backlog applied, a
//! lazy flush done — and asks what to do: whether an ack is due now, whether a flush is.
//! [`note_decided`] says how a batch's decisions are noted in the [`DecidedMarks`]
//! every ack lists. When a silent sender is taken for dead is `crate::liveness`'s.

use std::collections::BTreeMap;
use std::time::Duration;

use hawser_core::NodeId;

use crate::paths::DecidedMarks;
use crate::pb::{self, receiver_message};

/// How often a stream no return service waits on flushes what it applied.
pub(super) const LAZY_FLUSH_EVERY: Duration = Duration::from_millis(20);

/// A stream no return service waits on acks after this many batches, or this many
/// wire bytes, applied since its last ack (or at its next lazy flush, whichever comes
/// first) rather than after every batch: each ack is a message both ends handle, and
/// nothing waits on it. Well inside the sender's default window
/// ([`crate::SenderTuning`]: 32 batches, 8 MiB), so the sender never stalls on it.
pub(super) const LAZY_ACK_BATCHES: usize = 8;

/// The wire bytes after which a lazy stream acks ([`LAZY_ACK_BATCHES`]).
pub(super) const LAZY_ACK_BYTES: u64 = 1 << 20;

/// The high-water marks a stream's acks carry, per origin.
///
/// They start from the store's marks when the stream is accepted and then follow what
/// the stream applies, so an ack costs no read of the store; the store's marks are
/// merged in again when the stream is idle (a heartbeat), for origins other streams
/// or local commits advanced. Every mark is one the store has reached, never ahead
/// of it: apply errors end the stream before they are counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Marks {
    /// Committed here (RETURN TWOSAFE).
    pub(super) applied: BTreeMap<NodeId, u64>,
    /// Committed and flushed here (RETURN RECEIPT).
    pub(super) durable: BTreeMap<NodeId, u64>,
}

impl Marks {
    /// Marks starting from the store's: everything there is both applied and durable.
    pub(super) fn new(store: BTreeMap<NodeId, u64>) -> Self {
        Self {
            durable: store.clone(),
            applied: store,
        }
    }

    /// Raises the applied marks to `seen` where it is ahead.
    pub(super) fn refresh(&mut self, seen: &BTreeMap<NodeId, u64>) {
        for (origin, seq) in seen {
            let m = self.applied.entry(*origin).or_insert(0);
            *m = (*m).max(*seq);
        }
    }

    /// Follows the apply of a backlog of `records` records whose highest seq per origin
    /// is `received`, every run of it flushed when `flushed`.
    ///
    /// A record-less backlog is the sender asking where this store stands (it waits for
    /// a transaction another stream carries): the store's marks answer it (`store`,
    /// read only then; `None` when unreadable), and they say nothing of durability, so
    /// the durable marks stay. Otherwise the durable marks catch up with the applied
    /// ones when everything applied so far was flushed.
    pub(super) fn after_backlog(
        &mut self,
        received: &BTreeMap<NodeId, u64>,
        records: u64,
        flushed: bool,
        store: impl FnOnce() -> Option<BTreeMap<NodeId, u64>>,
    ) {
        self.refresh(received);
        if records == 0 {
            if let Some(now) = store() {
                self.refresh(&now);
            }
        } else if flushed {
            self.durable.clone_from(&self.applied);
        }
    }
}

/// A backlog the stream applied, as the ack rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BacklogDone {
    /// Batches in the backlog.
    pub(super) batches: usize,
    /// Their payloads' bytes as they came over the wire.
    pub(super) wire_bytes: u64,
    /// The last batch's `through_lsn`: what an ack of the backlog answers.
    pub(super) through_lsn: u64,
    /// The last batch says its sender waits for another stream's transaction
    /// (`Batch.waiting`).
    pub(super) waiting: bool,
}

/// A stream's ack state: its marks, the last LSN it answers, and what it applied since
/// its last ack. Owned by the stream's apply task.
#[derive(Debug, Clone)]
pub(super) struct Acks {
    /// The marks every ack carries.
    pub(super) marks: Marks,
    /// A return service may wait on this stream: every backlog is acked as soon as it
    /// is applied. Otherwise acks are lazy ([`LAZY_ACK_BATCHES`], [`LAZY_ACK_BYTES`],
    /// [`LAZY_FLUSH_EVERY`]).
    returns_wait: bool,
    /// The `through_lsn` of the last backlog applied (0 before the first).
    last_through: u64,
    /// The sender waits for another stream's transaction (`Batch.waiting` on the last
    /// backlog): acked again, unasked, whenever another stream's apply moves the marks.
    waiting: bool,
    /// Batches applied since the last ack.
    unacked_batches: usize,
    /// Wire bytes applied since the last ack.
    unacked_bytes: u64,
}

impl Acks {
    /// The ack state of a stream accepted when the store's marks were `store`.
    pub(super) fn new(store: BTreeMap<NodeId, u64>, returns_wait: bool) -> Self {
        Self {
            marks: Marks::new(store),
            returns_wait,
            last_through: 0,
            waiting: false,
            unacked_batches: 0,
            unacked_bytes: 0,
        }
    }

    /// Whether the sender waits for another stream's transaction, so that any move of
    /// this node's marks is news to it.
    pub(super) fn waiting(&self) -> bool {
        self.waiting
    }

    /// Whether a lazy flush has anything to do: applies not yet flushed, or batches not
    /// yet acked.
    pub(super) fn flush_due(&self) -> bool {
        self.marks.durable != self.marks.applied || self.unacked_batches > 0
    }

    /// Follows a lazy flush that covered everything applied when it began (`applied`,
    /// the applied marks then): the durable marks catch up, and the ack that follows
    /// answers every batch since the last.
    pub(super) fn flushed(&mut self, applied: BTreeMap<NodeId, u64>) {
        self.marks.durable = applied;
        self.unacked_batches = 0;
        self.unacked_bytes = 0;
    }

    /// Follows a backlog applied (its marks already moved, [`Marks::after_backlog`]);
    /// whether it is acked now.
    ///
    /// A stream a return service may wait on acks every backlog, and so does one whose
    /// sender waits for another stream. Nobody waits on a lazy stream's acks: they free
    /// the sender's window and report progress, so one answers several batches, once
    /// [`LAZY_ACK_BATCHES`] or [`LAZY_ACK_BYTES`] have gathered (and the lazy flush
    /// acks the rest).
    pub(super) fn backlog_applied(&mut self, done: BacklogDone) -> bool {
        self.last_through = done.through_lsn;
        self.waiting = done.waiting;
        self.unacked_batches += done.batches;
        self.unacked_bytes += done.wire_bytes;
        let due = self.returns_wait
            || self.waiting
            || self.unacked_batches >= LAZY_ACK_BATCHES
            || self.unacked_bytes >= LAZY_ACK_BYTES;
        if due {
            self.unacked_batches = 0;
            self.unacked_bytes = 0;
        }
        due
    }

    /// The ack of everything applied through the last backlog, listing the sender nodes
    /// connected now and the decided marks (`decided`).
    pub(super) fn ack(&self, connected_senders: Vec<u64>, decided: &DecidedMarks) -> pb::Ack {
        pb::Ack {
            durable: to_pb(&self.marks.durable),
            applied: to_pb(&self.marks.applied),
            through_lsn: self.last_through,
            connected_senders,
            decided_paths: decided.to_pb(),
        }
    }
}

/// An ack as the message that carries it.
pub(super) fn ack_message(ack: pb::Ack) -> pb::ReceiverMessage {
    pb::ReceiverMessage {
        msg: Some(receiver_message::Msg::Ack(ack)),
    }
}

/// Marks per origin as the wire lists them.
pub(super) fn to_pb(m: &BTreeMap<NodeId, u64>) -> Vec<pb::OriginMark> {
    m.iter()
        .map(|(o, s)| pb::OriginMark {
            origin: o.0,
            seq: *s,
        })
        .collect()
}

/// Whether an apply is news to streams waiting for another's transaction: it applied
/// records (`records`), or moved a sender's decided mark (`decided_moved`).
pub(super) fn wakes_waiters(records: u64, decided_moved: bool) -> bool {
    decided_moved || records > 0
}

/// Notes in `marks` what a stream from `sender` decided: through `own` of its own
/// commits, and as `relayed` says of the origins it relays (a relayed mark of the
/// sender's own origin is not its to make: `own` says that). Whether a mark moved.
pub(super) fn note_decided(
    marks: &DecidedMarks,
    sender: NodeId,
    own: u64,
    relayed: &[pb::OriginMark],
) -> bool {
    let mut moved = marks.note(sender, sender, own);
    for m in relayed.iter().filter(|m| m.origin != sender.0) {
        moved |= marks.note(NodeId(m.origin), sender, m.seq);
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(pairs: &[(u64, u64)]) -> BTreeMap<NodeId, u64> {
        pairs.iter().map(|&(o, s)| (NodeId(o), s)).collect()
    }

    fn done(batches: usize, wire_bytes: u64, through_lsn: u64) -> BacklogDone {
        BacklogDone {
            batches,
            wire_bytes,
            through_lsn,
            waiting: false,
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
    fn durable_marks_catch_up_only_when_every_run_of_the_backlog_was_flushed() {
        let mut m = Marks::new(marks(&[(1, 5)]));
        m.after_backlog(&marks(&[(1, 8)]), 3, false, || unreachable!());
        assert_eq!(m.applied, marks(&[(1, 8)]));
        assert_eq!(m.durable, marks(&[(1, 5)]), "not flushed: durable stays");
        m.after_backlog(&marks(&[(1, 9), (2, 1)]), 2, true, || unreachable!());
        assert_eq!(m.durable, marks(&[(1, 9), (2, 1)]));
        assert_eq!(m.durable, m.applied);
    }

    #[test]
    fn a_record_less_batch_is_answered_with_the_stores_marks_and_leaves_durable_alone() {
        let mut m = Marks::new(marks(&[(1, 5)]));
        let mut read = false;
        m.after_backlog(&BTreeMap::new(), 0, true, || {
            read = true;
            Some(marks(&[(1, 7), (2, 3)]))
        });
        assert!(read, "the store is read for a probe");
        assert_eq!(m.applied, marks(&[(1, 7), (2, 3)]));
        assert_eq!(
            m.durable,
            marks(&[(1, 5)]),
            "a probe says nothing of durability"
        );
        // An unreadable store leaves the marks as they were.
        m.after_backlog(&BTreeMap::new(), 0, true, || None);
        assert_eq!(m.applied, marks(&[(1, 7), (2, 3)]));
    }

    #[test]
    fn a_stream_a_return_service_may_wait_on_acks_every_backlog() {
        let mut acks = Acks::new(BTreeMap::new(), true);
        for lsn in 1..=3 {
            assert!(acks.backlog_applied(done(1, 10, lsn)));
        }
    }

    #[test]
    fn a_lazy_stream_acks_after_eight_batches_and_not_before() {
        let mut acks = Acks::new(BTreeMap::new(), false);
        for lsn in 1..LAZY_ACK_BATCHES as u64 {
            assert!(!acks.backlog_applied(done(1, 10, lsn)), "batch {lsn}");
        }
        assert!(acks.backlog_applied(done(1, 10, 8)));
        // The count starts again after an ack.
        assert!(!acks.backlog_applied(done(1, 10, 9)));
        // A backlog of several batches counts them all.
        assert!(acks.backlog_applied(done(LAZY_ACK_BATCHES - 1, 10, 20)));
    }

    #[test]
    fn a_lazy_stream_acks_once_a_mebibyte_has_come_over_the_wire() {
        let mut acks = Acks::new(BTreeMap::new(), false);
        assert!(!acks.backlog_applied(done(1, LAZY_ACK_BYTES - 1, 1)));
        assert!(acks.backlog_applied(done(1, 1, 2)));
        assert!(!acks.backlog_applied(done(1, LAZY_ACK_BYTES / 2, 3)));
    }

    #[test]
    fn a_sender_waiting_for_another_stream_is_acked_at_once_even_on_a_lazy_stream() {
        let mut acks = Acks::new(BTreeMap::new(), false);
        let waiting = BacklogDone {
            waiting: true,
            ..done(1, 10, 4)
        };
        assert!(acks.backlog_applied(waiting));
        assert!(acks.waiting());
        // The next backlog without the flag: lazy again.
        assert!(!acks.backlog_applied(done(1, 10, 5)));
        assert!(!acks.waiting());
    }

    #[test]
    fn a_lazy_flush_is_due_while_applies_are_unflushed_or_batches_unacked() {
        let mut acks = Acks::new(marks(&[(1, 5)]), false);
        assert!(!acks.flush_due(), "nothing applied yet");
        acks.marks
            .after_backlog(&marks(&[(1, 6)]), 1, false, || None);
        assert!(!acks.backlog_applied(done(1, 10, 6)));
        assert!(acks.flush_due());
        let applied = acks.marks.applied.clone();
        acks.flushed(applied);
        assert!(!acks.flush_due());
        assert_eq!(acks.marks.durable, marks(&[(1, 6)]));
        // Flushed applies whose batches were not acked yet still want the flush's ack.
        acks.marks
            .after_backlog(&marks(&[(1, 7)]), 1, true, || None);
        assert!(!acks.backlog_applied(done(1, 10, 7)));
        assert!(acks.flush_due());
        // And the flush's ack starts the lazy count again.
        acks.flushed(acks.marks.applied.clone());
        for lsn in 8..8 + LAZY_ACK_BATCHES as u64 - 1 {
            assert!(!acks.backlog_applied(done(1, 10, lsn)));
        }
    }

    #[test]
    fn a_lazy_flush_makes_durable_only_what_was_applied_when_it_began() {
        let mut acks = Acks::new(marks(&[(1, 5)]), false);
        acks.marks.refresh(&marks(&[(1, 6)]));
        let before = acks.marks.applied.clone();
        acks.marks.refresh(&marks(&[(1, 9)]));
        acks.flushed(before);
        assert_eq!(acks.marks.durable, marks(&[(1, 6)]));
        assert!(acks.flush_due());
    }

    #[test]
    fn an_ack_carries_both_marks_and_the_last_backlogs_through_lsn() {
        let decided = DecidedMarks::default();
        decided.note(NodeId(1), NodeId(2), 4);
        let mut acks = Acks::new(marks(&[(1, 5)]), true);
        let ack = acks.ack(vec![2], &decided);
        assert_eq!(ack.through_lsn, 0, "nothing applied yet");
        acks.marks
            .after_backlog(&marks(&[(1, 7)]), 2, false, || None);
        acks.backlog_applied(done(1, 10, 42));
        let ack = acks.ack(vec![2, 3], &decided);
        assert_eq!(ack.through_lsn, 42);
        assert_eq!(ack.applied, to_pb(&marks(&[(1, 7)])));
        assert_eq!(ack.durable, to_pb(&marks(&[(1, 5)])));
        assert_eq!(ack.connected_senders, [2, 3]);
        assert_eq!(ack.decided_paths, decided.to_pb());
    }

    #[test]
    fn a_sender_decides_its_own_origin_by_its_own_mark_and_relays_others() {
        let (origin, sender) = (NodeId(1), NodeId(2));
        let marks = DecidedMarks::default();
        let relayed = [
            pb::OriginMark { origin: 1, seq: 9 },
            // A relayed mark of the sender's own origin is not taken.
            pb::OriginMark { origin: 2, seq: 50 },
        ];
        assert!(note_decided(&marks, sender, 7, &relayed));
        assert_eq!(marks.get(sender, sender), 7);
        assert_eq!(marks.get(origin, sender), 9);
        // The same claims again move nothing; nor do lower ones, nor a zero.
        assert!(!note_decided(&marks, sender, 7, &relayed));
        assert!(!note_decided(
            &marks,
            sender,
            0,
            &[pb::OriginMark { origin: 1, seq: 3 }]
        ));
        assert_eq!(marks.get(origin, sender), 9);
    }

    #[test]
    fn streams_waiting_for_another_are_woken_by_records_or_moved_decisions_only() {
        assert!(!wakes_waiters(0, false), "a probe moved nothing");
        assert!(wakes_waiters(3, false));
        assert!(wakes_waiters(0, true));
    }
}
