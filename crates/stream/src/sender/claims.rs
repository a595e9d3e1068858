//! What a session knows and says about streams other than itself: its claims about the
//! origins it relays (`Batch.relayed`), and what its receiver's acks say of the other
//! streams to that receiver (`Ack.decided_paths`, `Ack.connected_senders`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_core::NodeId;
use hawser_store::LogRecord;

use crate::link::LinkConfig;
use crate::pb;

/// Per origin a stream relays, how far this session has decided about its
/// transactions: every one of them up to the seq that this node's log holds, or will
/// ever hold, was passed. Claims start afresh with each session: one that rode on a
/// batch the receiver never applied would not hold.
#[derive(Debug, Default)]
pub(super) struct Claims {
    /// The origins the stream relays; none when nobody waits for its claims.
    relays: BTreeSet<NodeId>,
    now: BTreeMap<NodeId, u64>,
    /// As last sent.
    sent: BTreeMap<NodeId, u64>,
}

impl Claims {
    /// Claims about `relays`, none made yet.
    pub fn new(relays: BTreeSet<NodeId>) -> Self {
        Self {
            relays,
            ..Self::default()
        }
    }

    /// The origins the stream relays.
    pub fn relays(&self) -> &BTreeSet<NodeId> {
        &self.relays
    }

    /// Forgets what was claimed, for a new session.
    pub fn restart(&mut self) {
        self.now.clear();
        self.sent.clear();
    }

    fn raise(&mut self, origin: NodeId, seq: u64) {
        let c = self.now.entry(origin).or_insert(0);
        *c = (*c).max(seq);
    }

    /// Raises the claims once the first `passed` of `records` (read from the cursor
    /// on) are passed. A relayed origin's transactions passed are decided. This node's
    /// log holds an origin's transactions in seq order (a receiver skips an older
    /// one), so one not passed yet means every earlier one of its origin is. And with
    /// `upstream` — how far this node holds each relayed origin, given when `records`
    /// reach the log's end as read after it — an origin none of whose transactions is
    /// left is decided through what this node holds of it.
    pub fn passed(
        &mut self,
        records: &[Arc<LogRecord>],
        passed: usize,
        upstream: Option<&BTreeMap<NodeId, u64>>,
    ) {
        if self.relays.is_empty() {
            return;
        }
        for r in &records[..passed] {
            let g = r.entry.gtid();
            if self.relays.contains(&g.origin) {
                self.raise(g.origin, g.seq);
            }
        }
        let mut pending = BTreeSet::new();
        for r in &records[passed..] {
            let g = r.entry.gtid();
            if self.relays.contains(&g.origin) && pending.insert(g.origin) {
                self.raise(g.origin, g.seq.saturating_sub(1));
                if pending.len() == self.relays.len() {
                    break;
                }
            }
        }
        for (o, n) in upstream.into_iter().flatten() {
            if !pending.contains(o) {
                self.raise(*o, *n);
            }
        }
    }

    /// Whether claims were raised since they were last sent.
    pub fn unsent(&self) -> bool {
        self.now != self.sent
    }

    /// The claims for the next batch, recorded as sent.
    pub fn send(&mut self) -> Vec<pb::OriginMark> {
        self.sent.clone_from(&self.now);
        self.now
            .iter()
            .map(|(o, seq)| pb::OriginMark {
                origin: o.0,
                seq: *seq,
            })
            .collect()
    }
}

/// What a session's acks say of the other streams to its receiver.
#[derive(Debug, Default)]
pub(super) struct Others {
    /// How far each sender node's streams to the receiver have decided about each
    /// origin, by (origin, sender).
    pub decided: BTreeMap<(NodeId, NodeId), u64>,
    /// Since when each sibling's sender has had no stream to the receiver
    /// (`Ack.connected_senders`).
    absent_since: BTreeMap<NodeId, Instant>,
    /// When the last ack came.
    pub last_heard: Option<Instant>,
}

impl Others {
    /// Takes in an ack heard at `now`: decided marks only rise; a sibling's sender is
    /// absent from the first ack that does not list it until one does.
    pub fn heard(&mut self, link: &LinkConfig, ack: &pb::Ack, now: Instant) {
        self.last_heard = Some(now);
        for (path, s) in crate::paths::from_pb(&ack.decided_paths) {
            let d = self.decided.entry(path).or_insert(0);
            *d = (*d).max(s);
        }
        for sibling in &link.siblings {
            let node = sibling.sender_node;
            if node == link.sender_node || ack.connected_senders.contains(&node.0) {
                self.absent_since.remove(&node);
            } else {
                self.absent_since.entry(node).or_insert(now);
            }
        }
    }

    /// The siblings' senders without a stream to the receiver for `after` or longer,
    /// at `now`.
    pub fn absent(&self, after: Duration, now: Instant) -> BTreeSet<NodeId> {
        self.absent_since
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= after)
            .map(|(n, _)| *n)
            .collect()
    }

    /// The siblings' senders a stream stopped since `blocked_since` may take over
    /// ([`LinkConfig::takes_over`]): those absent for `after`, as an ack heard since
    /// it stopped says. Not on older news: a stopped stream asks at once, and the
    /// answer decides.
    pub fn absent_since_blocked(
        &self,
        blocked_since: Option<Instant>,
        after: Duration,
        now: Instant,
    ) -> BTreeSet<NodeId> {
        match (blocked_since, self.last_heard) {
            (Some(since), Some(heard)) if heard > since => self.absent(after, now),
            _ => BTreeSet::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sender::testing::{demo_shape, record, txn};

    const M: NodeId = NodeId(1);
    const S: NodeId = NodeId(2);
    const P: NodeId = NodeId(3);
    const Q: NodeId = NodeId(4);

    #[test]
    fn claims_cover_what_was_passed_and_everything_before_an_origins_first_record_left() {
        let mut c = Claims::new(BTreeSet::from([P, Q]));
        let records = vec![
            record(1, txn(P, 4, 0, &["t"], 1)),
            record(2, txn(M, 9, 0, &["t"], 1)),
            record(3, txn(P, 5, 0, &["t"], 1)),
            record(4, txn(Q, 7, 0, &["t"], 1)),
            record(5, txn(P, 6, 0, &["t"], 1)),
        ];
        assert!(!c.unsent());
        // Two passed: P through 4; P's next left is 5 (so 4), Q's first left is 7 (so 6).
        c.passed(&records, 2, None);
        assert!(c.unsent());
        let sent = c.send();
        assert_eq!(
            sent.iter().map(|m| (m.origin, m.seq)).collect::<Vec<_>>(),
            [(3, 4), (4, 6)]
        );
        assert!(!c.unsent(), "recorded as sent");
        // Claims never go down: the same again raises nothing.
        c.passed(&records, 2, None);
        assert!(!c.unsent());
        // At the log's end, an origin with nothing left is decided through what this
        // node holds of it; one with a record left is not.
        c.passed(&records, 4, Some(&BTreeMap::from([(P, 90), (Q, 80)])));
        let sent: BTreeMap<u64, u64> = c.send().iter().map(|m| (m.origin, m.seq)).collect();
        assert_eq!(sent, BTreeMap::from([(3, 5), (4, 80)]));
        // A new session forgets them.
        c.restart();
        assert!(c.send().is_empty());
    }

    #[test]
    fn a_stream_nobody_waits_for_claims_nothing() {
        let mut c = Claims::new(BTreeSet::new());
        c.passed(
            &[record(1, txn(P, 4, 0, &["t"], 1))],
            1,
            Some(&BTreeMap::from([(P, 9)])),
        );
        assert!(!c.unsent());
        assert!(c.send().is_empty());
    }

    #[test]
    fn a_sibling_is_absent_from_the_first_ack_that_leaves_it_out_until_one_lists_it() {
        let (direct, _) = demo_shape(M, S, P);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let ack = |connected: &[u64]| pb::Ack {
            connected_senders: connected.to_vec(),
            ..pb::Ack::default()
        };
        let mut o = Others::default();
        o.heard(&direct, &ack(&[M.0, P.0]), t0);
        assert!(o.absent(ms(0), t0).is_empty());
        o.heard(&direct, &ack(&[M.0]), t0 + ms(10));
        // A later ack without it keeps the first time it was missed.
        o.heard(&direct, &ack(&[M.0]), t0 + ms(500));
        assert!(o.absent(ms(1000), t0 + ms(900)).is_empty());
        assert_eq!(o.absent(ms(1000), t0 + ms(1010)), BTreeSet::from([P]));
        // Only on news heard since the stream stopped.
        let stopped = Some(t0 + ms(600));
        assert!(o
            .absent_since_blocked(stopped, ms(1000), t0 + ms(1010))
            .is_empty());
        assert_eq!(
            o.absent_since_blocked(Some(t0 + ms(400)), ms(1000), t0 + ms(1010)),
            BTreeSet::from([P])
        );
        assert!(o
            .absent_since_blocked(None, ms(0), t0 + ms(1010))
            .is_empty());
        o.heard(&direct, &ack(&[P.0]), t0 + ms(1100));
        assert!(o.absent(ms(0), t0 + ms(1200)).is_empty(), "back");
    }

    #[test]
    fn what_other_streams_decided_only_rises() {
        let (direct, _) = demo_shape(M, S, P);
        let ack = |seq: u64| {
            let marks = crate::paths::DecidedMarks::default();
            marks.note(M, P, seq);
            pb::Ack {
                decided_paths: marks.to_pb(),
                ..pb::Ack::default()
            }
        };
        let now = Instant::now();
        let mut o = Others::default();
        o.heard(&direct, &ack(7), now);
        o.heard(&direct, &ack(5), now);
        assert_eq!(o.decided.get(&(M, P)), Some(&7));
        assert_eq!(o.last_heard, Some(now));
    }
}
