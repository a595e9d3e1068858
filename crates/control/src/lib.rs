//! hawser's control plane: the cluster's authoritative configuration in a Raft group.
//!
//! Which nodes exist, the replication schemes, and per element which node masters it
//! under which epoch live in an openraft 0.9 group spanning the nodes (docs/design.md §1,
//! §2, §5). Row data never goes through Raft.
//!
//! ```text
//!   ControlPlane (plane) ── propose / join / remove / state / metrics / removal
//!        │                        ▲
//!        ▼                        │ applied ClusterState (watch)
//!   openraft::Raft ── store: LogStore + StateMachineStore ── KvEngine (sled | memory)
//!        │   ▲                         └── state: pure ClusterState, Command, apply
//!        ▼   │
//!   network: PeerPool, NetworkFactory ──gRPC──► service: PeerService (peers-only)
//! ```
//!
//! * [`bootstrap`]: who may bootstrap a cluster when several nodes are told to at once.
//! * [`state`]: the pure cluster state machine, unit-tested without I/O.
//! * [`store`]: openraft storage-v2 over the store's [`hawser_store::KvEngine`].
//! * [`network`] and [`service`]: the peers-only `hawser.raft.v1.RaftPeer` service.
//! * [`health`]: the leader's book of liveness reports and the master leases it grants.
//! * [`failover`]: the pure failover decision.
//! * [`plane`]: [`ControlPlane`], what the node holds.
//! * [`removal`]: how a node learns it was removed, and keeps knowing it.
//! * [`types`]: the openraft type configuration.
//!
//! `docs/control.md` records the layout, the RPCs, the timing settings and the
//! decisions.

pub mod bootstrap;
pub mod failover;
pub mod health;
pub mod network;
pub mod plane;
pub mod removal;
pub mod replace;
pub mod service;
pub mod state;
pub mod store;
pub mod types;

/// Code generated from `proto/hawser/v1/raft.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("hawser.raft.v1");
}

pub use bootstrap::BootstrapRefusal;
pub use network::PeerError;
pub use plane::{
    ControlConfig, ControlMetrics, ControlPlane, FailoverTick, InitError, JoinReply, JoinRequest,
    PlaneError, RaftRole, RemoveReply, RemoveRequest,
};
pub use removal::{Learned, Removal};
pub use state::{ClusterState, Command, ControlError, NodeInfo, RemovalMode, Response};
