//! Identities and positions (docs/design.md §2).
//!
//! * [`NodeId`] names a node for its whole life.
//! * [`Gtid`] names a transaction globally: `(origin, seq)` where `seq` is dense at its
//!   origin, so "what I have from origin X" is one high-water mark.
//! * [`Lsn`] is a position in one node's own commit log (its own transactions and the
//!   ones it applied from others, in the order it committed them).
//! * [`Epoch`] is the fencing token of a replication element; it grows at every master
//!   change.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A node's identity; never reused within a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A transaction's global id: the node where it was first committed and its dense
/// sequence number there (the first transaction of an origin has `seq` 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Gtid {
    pub origin: NodeId,
    pub seq: u64,
}

impl Gtid {
    pub fn new(origin: NodeId, seq: u64) -> Self {
        Self { origin, seq }
    }
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.origin.0, self.seq)
    }
}

/// A position in one node's commit log. LSN 0 means "before the first record".
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Lsn(pub u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);

    pub fn next(self) -> Lsn {
        Lsn(self.0 + 1)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The fencing token of a replication element. Epoch 0 is "no master change yet".
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Epoch(pub u64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gtid_orders_by_origin_then_seq() {
        let a = Gtid::new(NodeId(1), 9);
        let b = Gtid::new(NodeId(2), 1);
        let c = Gtid::new(NodeId(2), 2);
        assert!(a < b && b < c);
        assert_eq!(c.to_string(), "2:2");
    }
}
