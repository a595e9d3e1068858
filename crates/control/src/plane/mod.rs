//! [`ControlPlane`]: the handle a node holds on the cluster's Raft group.
//!
//! ```text
//!   node ──propose(cmd)──► validate ──► leader here? ── client_write ──► Raft log
//!                                         │ no
//!                                         └─ ForwardPropose ─► leader (≤ 3 hops)
//!   joining node ── JoinCluster ─► any member ─► leader: RegisterNode, add learner,
//!                                                promote to voter while voters < 5
//!   peers ◄── raft_service() (tonic, added to the node's gRPC server) ──► Raft
//!   state() / subscribe() ◄── applied ClusterState      metrics() ◄── Raft metrics
//! ```
//!
//! The control plane binds no socket and spawns nothing of its own beyond openraft's
//! tasks: the node serves [`ControlPlane::raft_service`] on its gRPC listener and calls
//! [`ControlPlane::shutdown`] on the way out. Membership changes (join, remove) are
//! made by the Raft leader only, one at a time.
//!
//! Submodules: `config` holds the settings, `error` the errors, `messages` what the
//! calls carry and return; `handle` is [`ControlPlane`], the node's handle; `inner` is
//! the state the handle shares with the peer service and how it commits on the
//! leader; `requests` answers peers' requests (join, init intent, report, removal).

mod config;
mod error;
mod handle;
mod inner;
mod messages;
mod requests;

pub use self::config::ControlConfig;
pub use self::error::{InitError, PlaneError};
pub use self::handle::ControlPlane;
pub(crate) use self::inner::Inner;
pub use self::messages::{
    ControlMetrics, FailoverTick, JoinReply, JoinRequest, RaftRole, RemoveReply, RemoveRequest,
};

/// How many times a proposal or join follows "the leader is over there" before it gives
/// up with a retryable error.
const MAX_HOPS: usize = 3;
