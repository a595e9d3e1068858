//! How far each sender has decided about each origin's transactions at one receiver.
//!
//! A receiver keeps one high-water mark per origin, so when one origin's transactions
//! reach it by several streams (the origin's own and a propagator's, or two
//! propagators'), each stream must hold back until the others have delivered the
//! origin's earlier transactions. A stream that cannot see those transactions in its own
//! log (it relays for an origin some of whose tables it does not receive) waits instead
//! for the other streams to *decide* about them: to say that everything of the origin up
//! to a seq that they will ever carry has been delivered (docs/stream.md, "Two paths
//! from one origin to one receiver"). The receiver gathers what each sender says
//! (`Batch.decided`, `Batch.relayed`) and returns it with every ack
//! (`Ack.decided_paths`); a relay also reads its own node's marks to know how much of
//! an origin it holds (`SenderStart::upstream`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hawser_core::NodeId;

use crate::pb;

/// Per (origin, sender node): the seq through which that sender's streams to this node
/// have decided about the origin's transactions, each claim noted once the batch that
/// carried it was applied here. Kept for the process's life; shared by every inbound
/// stream, and with this node's senders.
#[derive(Debug, Clone, Default)]
pub struct DecidedMarks(Arc<parking_lot::Mutex<BTreeMap<(NodeId, NodeId), u64>>>);

impl DecidedMarks {
    /// Raises the mark of `origin`'s transactions by `sender` to `seq`; whether it
    /// moved.
    pub fn note(&self, origin: NodeId, sender: NodeId, seq: u64) -> bool {
        if seq == 0 {
            return false;
        }
        let mut marks = self.0.lock();
        let mark = marks.entry((origin, sender)).or_insert(0);
        let moved = seq > *mark;
        *mark = (*mark).max(seq);
        moved
    }

    /// The mark of `origin`'s transactions by `sender` (0 when none came).
    pub fn get(&self, origin: NodeId, sender: NodeId) -> u64 {
        self.0.lock().get(&(origin, sender)).copied().unwrap_or(0)
    }

    /// How far every one of `senders` has decided about `origin`: the lowest of their
    /// marks. `None` when `senders` is empty.
    pub fn through(&self, origin: NodeId, senders: &BTreeSet<NodeId>) -> Option<u64> {
        let marks = self.0.lock();
        senders
            .iter()
            .map(|s| marks.get(&(origin, *s)).copied().unwrap_or(0))
            .min()
    }

    pub(crate) fn to_pb(&self) -> Vec<pb::PathMark> {
        self.0
            .lock()
            .iter()
            .map(|((origin, sender), seq)| pb::PathMark {
                origin: origin.0,
                sender: sender.0,
                seq: *seq,
            })
            .collect()
    }
}

/// The marks an ack lists (`Ack.decided_paths`), by (origin, sender node).
pub(crate) fn from_pb(marks: &[pb::PathMark]) -> BTreeMap<(NodeId, NodeId), u64> {
    marks
        .iter()
        .map(|m| ((NodeId(m.origin), NodeId(m.sender)), m.seq))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_only_rise_and_a_group_of_senders_is_as_far_as_its_slowest() {
        let marks = DecidedMarks::default();
        let (o, a, b) = (NodeId(1), NodeId(2), NodeId(3));
        assert!(marks.note(o, a, 5));
        assert!(!marks.note(o, a, 4));
        assert!(!marks.note(o, a, 0));
        assert_eq!(marks.get(o, a), 5);
        assert_eq!(marks.through(o, &[a].into()), Some(5));
        // b has said nothing yet.
        assert_eq!(marks.through(o, &[a, b].into()), Some(0));
        assert!(marks.note(o, b, 9));
        assert_eq!(marks.through(o, &[a, b].into()), Some(5));
        assert_eq!(marks.through(o, &BTreeSet::new()), None);
        let back = from_pb(&marks.to_pb());
        assert_eq!(back, BTreeMap::from([((o, a), 5), ((o, b), 9)]));
    }
}
