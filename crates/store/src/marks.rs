//! The high-water mark of every other origin committed here: the highest seq of each
//! origin whose transaction this store holds. This node's own is the commit state's
//! `last_seq`, not here.
//!
//! Marks are raised with the batch that writes the origin's log record (under the
//! commit mutex), and by a duplicate's copy; they only ever rise. At open they are
//! derived from the log (see `db::open`).

use std::collections::BTreeMap;

use hawser_core::NodeId;
use parking_lot::RwLock;

/// Other origins' high-water marks, behind their own lock.
#[derive(Debug, Default)]
pub(crate) struct Marks(RwLock<BTreeMap<NodeId, u64>>);

impl Marks {
    pub(crate) fn new(marks: BTreeMap<NodeId, u64>) -> Self {
        Self(RwLock::new(marks))
    }

    /// `origin`'s mark (0 when nothing of it is here).
    pub(crate) fn get(&self, origin: NodeId) -> u64 {
        self.0.read().get(&origin).copied().unwrap_or(0)
    }

    /// Every origin's mark.
    pub(crate) fn all(&self) -> BTreeMap<NodeId, u64> {
        self.0.read().clone()
    }

    /// Raises each origin's mark to its seq: a lower seq leaves it as it is.
    pub(crate) fn raise(&self, seqs: impl IntoIterator<Item = (NodeId, u64)>) {
        let mut marks = self.0.write();
        for (origin, seq) in seqs {
            let mark = marks.entry(origin).or_insert(0);
            *mark = (*mark).max(seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_only_rise() {
        let marks = Marks::new([(NodeId(2), 5)].into());
        assert_eq!(marks.get(NodeId(3)), 0);
        marks.raise([(NodeId(2), 4), (NodeId(3), 7)]);
        assert_eq!(marks.get(NodeId(2)), 5, "a lower seq does not lower it");
        marks.raise([(NodeId(2), 6)]);
        assert_eq!(marks.all(), [(NodeId(2), 6), (NodeId(3), 7)].into());
    }
}
