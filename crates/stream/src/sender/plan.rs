//! What a turn of shipping does with the records read ahead: which it passes, which of
//! those go on the wire and how (whole or filtered), where it stops and why. Pure: the
//! session reads the log, sends what this decides and acts on the stops.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use hawser_core::{Epoch, Lsn, NodeId};
use hawser_store::{LogEntry, LogRecord};

use crate::codec;
use crate::link::LinkConfig;

/// Where a session's sender is in its log.
#[derive(Debug)]
pub(super) struct Reader {
    /// The next LSN to look at.
    pub cursor: Lsn,
    /// The end of log passed but not sent: records this receiver gets nothing of.
    pub unsent: Option<Lsn>,
    /// Records read from `cursor` on and not passed yet (at most a batch's worth),
    /// topped up from the log as it grows. A stream that stops before another stream's
    /// transaction keeps them for its next turn rather than reading them again (which,
    /// behind the store's in-memory tail, would decode them again at every turn).
    pub ahead: VecDeque<Arc<LogRecord>>,
    /// The record the stream stopped before, for another stream's transaction.
    pub blocked_at: Option<Arc<LogRecord>>,
    /// Since when it has stopped before that record.
    pub blocked_since: Option<Instant>,
}

impl Reader {
    pub fn new(cursor: Lsn) -> Self {
        Self {
            cursor,
            unsent: None,
            ahead: VecDeque::new(),
            blocked_at: None,
            blocked_since: None,
        }
    }

    /// The LSN after what is held: where the next read of the log starts.
    pub fn next_to_read(&self) -> Lsn {
        self.ahead.back().map_or(self.cursor, |r| r.lsn.next())
    }

    /// Stops before `at` (or goes on, `None`), keeping the time of the first stop
    /// before the same record (`before`, as [`Reader::unblock`] gave it).
    pub fn block(
        &mut self,
        at: Option<Arc<LogRecord>>,
        before: Option<(Lsn, Instant)>,
        now: Instant,
    ) {
        self.blocked_since = match (&at, before) {
            (Some(r), Some((lsn, since))) if r.lsn == lsn => Some(since),
            (Some(_), _) => Some(now),
            (None, _) => None,
        };
        self.blocked_at = at;
    }

    /// Takes the stop the last turn ended at, if any: the record's LSN and since when.
    pub fn unblock(&mut self) -> Option<(Lsn, Instant)> {
        self.blocked_at
            .take()
            .zip(self.blocked_since.take())
            .map(|(r, since)| (r.lsn, since))
    }

    /// The first `count` records read ahead are passed, through `through`.
    pub fn pass(&mut self, count: usize, through: Lsn) {
        self.ahead.drain(..count);
        self.cursor = through.next();
    }
}

/// The receiver's newest commit of this node's origin (`HelloReply.last_of_sender`),
/// until the log passes this node's own commit under that seq and it is checked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReuseWatch {
    /// Its seq; 0 when none, or once checked or passed.
    seq: u64,
    commit_micros: i64,
}

/// This node gave the seq of the receiver's newest commit of its origin to another
/// commit: the receiver skips it as a duplicate, and every commit of it up to there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reused {
    pub holds: u64,
    pub theirs: i64,
    pub ours: i64,
}

impl ReuseWatch {
    /// Watches for the receiver's newest commit of this node's origin, `(seq, commit
    /// time)`.
    pub fn new(last_of_sender: Option<(u64, i64)>) -> Self {
        let (seq, commit_micros) = last_of_sender.unwrap_or((0, 0));
        Self { seq, commit_micros }
    }

    /// Whether the receiver's newest commit is still to be checked.
    #[cfg(test)]
    pub fn watching(&self) -> bool {
        self.seq != 0
    }

    /// Checks `entry` as the log passes it. This node's own commit under the watched
    /// seq must be the very commit the receiver has (the same commit time); a later
    /// seq passed without finding it ends the watch (it is not in what this stream
    /// reads).
    pub fn check(&mut self, own: NodeId, entry: &LogEntry) -> Option<Reused> {
        let gtid = entry.gtid();
        if gtid.origin != own || self.seq == 0 || gtid.seq < self.seq {
            return None;
        }
        let holds = std::mem::take(&mut self.seq);
        let ours = entry.commit_micros();
        if gtid.seq > holds || ours == self.commit_micros {
            return None;
        }
        Some(Reused {
            holds,
            theirs: self.commit_micros,
            ours,
        })
    }
}

/// What a turn decides from: the stream, what its receiver holds, and this node's
/// durable position.
pub(super) struct Turn<'a> {
    pub link: &'a LinkConfig,
    /// This node.
    pub own: NodeId,
    /// Own commits from here on are not durable yet ([`super::rules::durable_from`]).
    pub durable_from: Lsn,
    /// Siblings' senders this stream takes over from ([`super::claims::Others`]).
    pub absent: &'a BTreeSet<NodeId>,
    /// What the receiver holds per origin.
    pub high_water: &'a BTreeMap<NodeId, u64>,
    /// How far the other streams to the receiver decided, by (origin, sender).
    pub decided: &'a BTreeMap<(NodeId, NodeId), u64>,
    /// The encoded bytes a batch stays within (a larger record goes alone).
    pub cap: u64,
}

/// What a turn decided about the records read ahead.
#[derive(Debug, Default)]
pub(super) struct Plan<'r> {
    /// How many of the records are passed (the first `passed`).
    pub passed: usize,
    /// The last record passed.
    pub through: Option<Lsn>,
    /// What of the passed records goes to the receiver, filtered for it.
    pub wire: Vec<(Epoch, Cow<'r, LogEntry>)>,
    /// The batch's encoded size, its header included.
    pub size: u64,
    /// Commit time of the first transaction on the wire.
    pub first_commit_micros: Option<i64>,
    /// The record the stream stops before, for another stream's transaction.
    pub blocked_at: Option<Arc<LogRecord>>,
    /// Stopped before an own commit not yet durable here.
    pub unflushed: bool,
    /// The highest seq of this node's own commits decided (0: none): passed, or
    /// waited before where only relays carry them.
    pub decided: u64,
    /// Stopped at an own commit that reuses the seq the receiver holds.
    pub reused: Option<Reused>,
}

/// Decides a turn over `records` (read from the cursor on), for one batch.
///
/// Records pass in order until one stops the turn: an own commit not durable yet
/// (its committer wakes the senders after its flush), a transaction another stream to
/// this receiver carries and the receiver lacks (`LinkConfig::waits_for_sibling`,
/// unless this stream takes it over from an absent sibling), or the batch's size.
/// A record forked off for this receiver, or nothing of which is the receiver's, is
/// passed with nothing on the wire. A record larger than the cap goes alone.
pub(super) fn plan<'r>(
    turn: &Turn<'_>,
    records: &'r [Arc<LogRecord>],
    reuse: &mut ReuseWatch,
) -> Plan<'r> {
    let link = turn.link;
    let own = turn.own;
    let mut plan = Plan {
        size: codec::BATCH_HEADER_BYTES,
        ..Plan::default()
    };
    for (i, r) in records.iter().enumerate() {
        if let Some(reused) = reuse.check(own, &r.entry) {
            plan.reused = Some(reused);
            break;
        }
        let is_own = r.entry.gtid().origin == own;
        if r.lsn >= turn.durable_from && is_own {
            plan.unflushed = true;
            break;
        }
        let takes_over = !turn.absent.is_empty() && link.takes_over(&r.entry, turn.absent);
        if !takes_over && link.waits_for_sibling(&r.entry, turn.high_water, turn.decided) {
            if link.decides_while_waiting(&r.entry) {
                // Nothing of it is this stream's, nor of the own commits after it that
                // only relays carry: decided, so that a relay that cannot see this
                // node's other commits may ship them (one ping-pong per run of them,
                // not per commit).
                let run = records[i..]
                    .iter()
                    .filter(|r| r.entry.gtid().origin == own)
                    .take_while(|r| {
                        r.lsn < turn.durable_from && link.decides_while_waiting(&r.entry)
                    })
                    .last();
                if let Some(last) = run {
                    plan.decided = plan.decided.max(last.entry.gtid().seq);
                }
            }
            plan.blocked_at = Some(r.clone());
            break;
        }
        let entry = if link.forked_off(r.epoch, &r.entry) {
            // Not the receiver's, ever: passed over like a record it does not carry.
            None
        } else if takes_over {
            link.filter_whole(&r.entry, turn.high_water)
        } else {
            link.filter_ref(&r.entry, turn.high_water)
        };
        let entry_size = entry.as_ref().map_or(0, |e| codec::record_size(r.epoch, e));
        if !plan.wire.is_empty() && plan.size + entry_size > turn.cap {
            // The next batch's, which it may have to itself.
            break;
        }
        plan.through = Some(r.lsn);
        plan.passed = i + 1;
        if is_own {
            plan.decided = plan.decided.max(r.entry.gtid().seq);
        }
        if let Some(entry) = entry {
            plan.size += entry_size;
            plan.first_commit_micros
                .get_or_insert(entry.commit_micros());
            plan.wire.push((r.epoch, entry));
        }
        if plan.size >= turn.cap {
            break;
        }
    }
    plan
}

/// Whether a stream stopped before `blocked_at` may go on: the receiver has that
/// transaction now, or this stream takes it over from an absent sibling.
pub(super) fn unblocked(
    link: &LinkConfig,
    blocked_at: Option<&Arc<LogRecord>>,
    high_water: &BTreeMap<NodeId, u64>,
    decided: &BTreeMap<(NodeId, NodeId), u64>,
    absent: &BTreeSet<NodeId>,
) -> bool {
    blocked_at.is_some_and(|r| {
        !link.waits_for_sibling(&r.entry, high_water, decided) || link.takes_over(&r.entry, absent)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sender::testing::{demo_shape, link, record, txn};

    const M: NodeId = NodeId(1);
    const S: NodeId = NodeId(2);
    const P: NodeId = NodeId(3);

    /// A turn of `link` with everything durable before `durable_from`, a receiver
    /// holding `high_water`, no sibling absent and a 1 MiB cap.
    fn turn<'a>(
        link: &'a LinkConfig,
        durable_from: u64,
        high_water: &'a BTreeMap<NodeId, u64>,
        none: &'a (BTreeSet<NodeId>, BTreeMap<(NodeId, NodeId), u64>),
    ) -> Turn<'a> {
        Turn {
            link,
            own: link.sender_node,
            durable_from: Lsn(durable_from),
            absent: &none.0,
            high_water,
            decided: &none.1,
            cap: 1 << 20,
        }
    }

    fn lsns(plan: &Plan<'_>) -> Vec<u64> {
        plan.wire.iter().map(|(_, e)| e.gtid().seq).collect()
    }

    #[test]
    fn own_commits_go_out_only_once_durable_and_nothing_after_the_first_that_is_not() {
        let l = link(M, S, &["t"]);
        let hw = BTreeMap::new();
        let none = Default::default();
        let records: Vec<_> = (1..=4)
            .map(|i| record(i, txn(M, i, 0, &["t"], 8)))
            .collect();
        let plan = super::plan(
            &turn(&l, 3, &hw, &none),
            &records,
            &mut ReuseWatch::default(),
        );
        assert_eq!(plan.passed, 2);
        assert_eq!(plan.through, Some(Lsn(2)));
        assert_eq!(lsns(&plan), [1, 2]);
        assert!(plan.unflushed, "stopped for the flush of LSN 3");
        assert_eq!(plan.decided, 2);
        // Nothing durable: nothing passes, and the turn says why.
        let plan = super::plan(
            &turn(&l, 1, &hw, &none),
            &records,
            &mut ReuseWatch::default(),
        );
        assert_eq!((plan.passed, plan.through, plan.unflushed), (0, None, true));
    }

    #[test]
    fn other_origins_records_pass_before_this_nodes_flush() {
        // This node (M) relays P's t of which the receiver S gets everything.
        let mut l = link(M, S, &["t"]);
        l.tables.insert(
            (hawser_core::QualName::bare("t"), P),
            hawser_core::Ident::unquoted("e"),
        );
        let hw = BTreeMap::new();
        let none = Default::default();
        let records = vec![
            record(1, txn(P, 1, 0, &["t"], 8)),
            record(2, txn(P, 2, 0, &["t"], 8)),
            record(3, txn(M, 1, 0, &["t"], 8)),
        ];
        let plan = super::plan(
            &turn(&l, 1, &hw, &none),
            &records,
            &mut ReuseWatch::default(),
        );
        assert_eq!(plan.passed, 2, "P's two pass, M's own waits for its flush");
        assert!(plan.unflushed);
        assert_eq!(plan.decided, 0, "none of M's own passed");
    }

    #[test]
    fn a_batch_is_cut_at_its_size_and_a_record_larger_than_a_batch_goes_alone() {
        let l = link(M, S, &["t"]);
        let hw = BTreeMap::new();
        let none = Default::default();
        let records: Vec<_> = (1..=6)
            .map(|i| record(i, txn(M, i, 0, &["t"], if i == 4 { 5000 } else { 100 })))
            .collect();
        let one = codec::record_size(Epoch(1), &records[0].entry);
        let mut t = turn(&l, 100, &hw, &none);
        t.cap = codec::BATCH_HEADER_BYTES + 2 * one + one / 2;
        let plan = super::plan(&t, &records, &mut ReuseWatch::default());
        assert_eq!(lsns(&plan), [1, 2], "a third would pass the cap");
        assert_eq!(plan.size, codec::BATCH_HEADER_BYTES + 2 * one);
        // From LSN 3: the large fourth stops the batch after the third…
        let plan3 = super::plan(&t, &records[2..], &mut ReuseWatch::default());
        assert_eq!(lsns(&plan3), [3]);
        // …and goes alone in the next, though larger than the cap.
        let plan4 = super::plan(&t, &records[3..], &mut ReuseWatch::default());
        assert_eq!(lsns(&plan4), [4]);
        assert!(plan4.size > t.cap);
    }

    #[test]
    fn what_the_receiver_has_or_does_not_get_is_passed_with_nothing_on_the_wire() {
        let l = link(M, S, &["t"]);
        let hw = BTreeMap::from([(M, 2)]);
        let none = Default::default();
        let records = vec![
            // Held already.
            record(1, txn(M, 1, 10, &["t"], 8)),
            record(2, txn(M, 2, 20, &["t"], 8)),
            // Another table, the receiver's own origin.
            record(3, txn(M, 3, 30, &["other"], 8)),
            record(4, txn(S, 9, 40, &["t"], 8)),
            record(5, txn(M, 5, 50, &["t"], 8)),
        ];
        let plan = super::plan(
            &turn(&l, 100, &hw, &none),
            &records,
            &mut ReuseWatch::default(),
        );
        assert_eq!(plan.passed, 5);
        assert_eq!(plan.through, Some(Lsn(5)));
        assert_eq!(lsns(&plan), [5]);
        assert_eq!(plan.first_commit_micros, Some(50));
        assert_eq!(plan.decided, 5, "every own commit passed is decided");
    }

    #[test]
    fn a_forked_off_commit_never_goes_to_the_receiver() {
        let mut l = link(M, S, &["t"]);
        l.forked = vec![crate::link::ForkedRange {
            origin: M,
            after_seq: 1,
            before_epoch: Epoch(2),
            tables: None,
        }];
        let hw = BTreeMap::new();
        let none = Default::default();
        // Seq 2 under epoch 1 was forked off by a failover that made epoch 2.
        let records = vec![
            record(1, txn(M, 1, 0, &["t"], 8)),
            record(2, txn(M, 2, 0, &["t"], 8)),
        ];
        let plan = super::plan(
            &turn(&l, 100, &hw, &none),
            &records,
            &mut ReuseWatch::default(),
        );
        assert_eq!(plan.passed, 2);
        assert_eq!(lsns(&plan), [1]);
    }

    #[test]
    fn a_stream_stops_before_a_transaction_a_sibling_carries_until_the_receiver_has_it() {
        let (_, relay) = demo_shape(M, S, P);
        let none = Default::default();
        // The relay P holds M's transactions 1 (t1 and t2, split) and 2 (t2 only).
        let records = vec![
            record(1, txn(M, 1, 0, &["t1", "t2"], 8)),
            record(2, txn(M, 2, 0, &["t2"], 8)),
        ];
        let hw = BTreeMap::new();
        let plan = super::plan(
            &turn(&relay, 100, &hw, &none),
            &records,
            &mut ReuseWatch::default(),
        );
        assert_eq!(plan.passed, 0);
        assert_eq!(plan.blocked_at.as_ref().map(|r| r.lsn), Some(Lsn(1)));
        assert!(!unblocked(
            &relay,
            plan.blocked_at.as_ref(),
            &hw,
            &none.1,
            &none.0
        ));
        // Once the receiver has transaction 1 (from M's own stream), the relay goes on.
        let has = BTreeMap::from([(M, 1)]);
        assert!(unblocked(
            &relay,
            plan.blocked_at.as_ref(),
            &has,
            &none.1,
            &none.0
        ));
        let plan = super::plan(
            &turn(&relay, 100, &has, &none),
            &records,
            &mut ReuseWatch::default(),
        );
        assert_eq!(plan.passed, 2);
        assert_eq!(lsns(&plan), [2]);
    }

    #[test]
    fn the_origins_stream_takes_over_from_an_absent_relay_and_ships_its_part() {
        let (direct, _) = demo_shape(M, S, P);
        let hw = BTreeMap::new();
        let none: (BTreeSet<NodeId>, _) = Default::default();
        let records = vec![record(1, txn(M, 1, 0, &["t2"], 8))];
        // The relay is there: the direct stream stops before it (the relay ships it).
        let plan_there = super::plan(
            &turn(&direct, 100, &hw, &none),
            &records,
            &mut ReuseWatch::default(),
        );
        assert_eq!(plan_there.passed, 0);
        assert!(plan_there.blocked_at.is_some());
        // The relay's sender is absent: the direct stream ships it whole.
        let gone = BTreeSet::from([P]);
        let mut t = turn(&direct, 100, &hw, &none);
        t.absent = &gone;
        let plan = super::plan(&t, &records, &mut ReuseWatch::default());
        assert_eq!(lsns(&plan), [1]);
    }

    #[test]
    fn a_commit_reusing_the_receivers_seq_is_found_once_and_the_same_commit_passes() {
        let l = link(M, S, &["t"]);
        let hw = BTreeMap::new();
        let none = Default::default();
        let records: Vec<_> = (1..=3)
            .map(|i| record(i, txn(M, i, i as i64 * 10, &["t"], 8)))
            .collect();
        // The receiver's newest of M is seq 2 committed at 20: the same commit.
        let mut same = ReuseWatch::new(Some((2, 20)));
        let p = super::plan(&turn(&l, 100, &hw, &none), &records, &mut same);
        assert_eq!((p.passed, p.reused), (3, None));
        assert!(!same.watching(), "checked, not again");
        // Committed at 21 there: this node gave seq 2 to another commit.
        let mut other = ReuseWatch::new(Some((2, 21)));
        let p = super::plan(&turn(&l, 100, &hw, &none), &records, &mut other);
        assert_eq!(
            p.reused,
            Some(Reused {
                holds: 2,
                theirs: 21,
                ours: 20
            })
        );
        assert_eq!(p.passed, 1, "stopped at the reused commit");
        // A later seq passed without finding it ends the watch; other origins do not.
        let mut gap = ReuseWatch::new(Some((2, 21)));
        assert_eq!(gap.check(M, &txn(P, 2, 0, &["t"], 8)), None);
        assert_eq!(gap.check(M, &txn(M, 1, 0, &["t"], 8)), None);
        assert!(gap.watching());
        assert_eq!(gap.check(M, &txn(M, 3, 0, &["t"], 8)), None);
        assert!(!gap.watching());
    }

    #[test]
    fn a_stop_keeps_the_time_of_the_first_stop_before_the_same_record() {
        let t0 = Instant::now();
        let later = t0 + std::time::Duration::from_millis(5);
        let mut reader = Reader::new(Lsn(1));
        let r = record(1, txn(M, 1, 0, &["t"], 8));
        reader.block(Some(r.clone()), None, t0);
        let before = reader.unblock();
        assert_eq!(before, Some((Lsn(1), t0)));
        assert!(reader.blocked_at.is_none());
        // Stopped again before the same record: since the first stop.
        reader.block(Some(r), before, later);
        assert_eq!(reader.blocked_since, Some(t0));
        // Before another record: since now.
        let before = reader.unblock();
        reader.block(Some(record(2, txn(M, 2, 0, &["t"], 8))), before, later);
        assert_eq!(reader.blocked_since, Some(later));
        reader.block(None, None, later);
        assert_eq!(reader.blocked_since, None);
    }
}
