//! The openraft type configuration of the control plane and short names for the
//! openraft types the rest of the crate uses.
//!
//! Raft node ids are the `u64` inside [`hawser_core::NodeId`]; a Raft node's
//! [`BasicNode::addr`] is the `host:port` of the node's gRPC server, where
//! [`crate::network::RaftServer`] answers the peers.

// `declare_raft_types!` names the default snapshot type `Cursor<Vec<u8>>` unqualified.
use std::io::Cursor;

pub use openraft::BasicNode;

use crate::state::{Command, Response};

openraft::declare_raft_types!(
    /// The control plane's Raft types: log entries carry a [`Command`], applying one
    /// gives a [`Response`], snapshots are the serialized cluster state in memory.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// A Raft node id (the `u64` of a [`hawser_core::NodeId`]).
pub type RaftNodeId = u64;
/// The running Raft instance.
pub type Raft = openraft::Raft<TypeConfig>;
/// One Raft log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log position: leader term and node, and index.
pub type LogId = openraft::LogId<RaftNodeId>;
/// A vote (term, candidate, committed).
pub type Vote = openraft::Vote<RaftNodeId>;
/// A membership as stored with the log id that introduced it.
pub type StoredMembership = openraft::StoredMembership<RaftNodeId, BasicNode>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<RaftNodeId, BasicNode>;
/// A storage failure as openraft sees it (fatal for the Raft instance).
pub type StorageError = openraft::StorageError<RaftNodeId>;
/// openraft's view of a node's progress.
pub type RaftMetrics = openraft::RaftMetrics<RaftNodeId, BasicNode>;
