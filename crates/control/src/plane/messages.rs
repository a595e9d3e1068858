//! What control-plane calls carry and return: join and removal requests and replies,
//! the summary of this node's Raft progress, and what a failover tick did.

use std::collections::{BTreeMap, BTreeSet};

use hawser_core::NodeId;
use openraft::ServerState;
use serde::{Deserialize, Serialize};

use crate::failover::Blocked;
use crate::state::{Command, NodeInfo, RemovalMode, SchemeRole};
use crate::types::RaftMetrics;

/// What a join request carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinRequest {
    pub node: NodeInfo,
    /// Whether the joining node's Raft storage is empty (never initialized or joined).
    pub fresh: bool,
    /// Take the place of a silent member under the same store name ([`crate::replace`]).
    #[serde(default)]
    pub replace: bool,
}

/// What a RemoveNode request carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoveRequest {
    pub node: NodeId,
    #[serde(default)]
    pub mode: RemovalMode,
}

/// What a successful removal returns.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RemoveReply {
    /// The roles a forced removal took the node's store out of (none otherwise).
    pub schemes_changed: Vec<SchemeRole>,
}

/// What a successful join returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinReply {
    /// The leader that admitted the node.
    pub leader: NodeId,
    /// Whether the node became a voter (else it is a learner).
    pub voter: bool,
}

/// This node's Raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftRole {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

/// A summary of this node's Raft progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlMetrics {
    pub node: NodeId,
    pub role: RaftRole,
    pub term: u64,
    pub leader: Option<NodeId>,
    /// Index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
    /// Index of the last entry applied to the state machine (committed, by Raft's rules).
    pub last_applied: Option<u64>,
    /// Last log index included in the latest snapshot.
    pub snapshot_index: Option<u64>,
    pub voters: BTreeSet<NodeId>,
    pub learners: BTreeSet<NodeId>,
    /// On the leader: time since a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
    /// On the leader: per follower, the index it has replicated up to.
    pub replication: BTreeMap<NodeId, Option<u64>>,
}

/// What one [`ControlPlane::failover_tick`](super::ControlPlane::failover_tick) did.
#[derive(Debug, Clone, Default)]
pub struct FailoverTick {
    /// Whether this node leads (else it decided nothing).
    pub leader: bool,
    /// The failovers committed.
    pub committed: Vec<Command>,
    /// Silent masters that cannot be failed over now, with why.
    pub blocked: Vec<Blocked>,
}

pub(super) fn summarize(m: &RaftMetrics) -> ControlMetrics {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().map(NodeId).collect();
    let learners = membership.learner_ids().map(NodeId).collect();
    ControlMetrics {
        node: NodeId(m.id),
        role: match m.state {
            ServerState::Leader => RaftRole::Leader,
            ServerState::Follower => RaftRole::Follower,
            ServerState::Candidate => RaftRole::Candidate,
            ServerState::Learner => RaftRole::Learner,
            ServerState::Shutdown => RaftRole::Shutdown,
        },
        term: m.current_term,
        leader: m.current_leader.map(NodeId),
        last_log_index: m.last_log_index,
        last_applied: m.last_applied.map(|l| l.index),
        snapshot_index: m.snapshot.map(|l| l.index),
        voters,
        learners,
        millis_since_quorum_ack: m.millis_since_quorum_ack,
        replication: m
            .replication
            .iter()
            .flatten()
            .map(|(id, l)| (NodeId(*id), l.map(|l| l.index)))
            .collect(),
    }
}
