//! Why a control-plane call failed ([`PlaneError`]) or `hawser init` did not bootstrap
//! a cluster ([`InitError`]).

use thiserror::Error;

use crate::bootstrap::BootstrapRefusal;
use crate::network::{CallError, PeerError};
use crate::removal::Removal;
use crate::state::ControlError;

/// Why a control-plane call failed.
#[derive(Debug, Error)]
pub enum PlaneError {
    /// The command does not fit the cluster state; nothing changed. Not retryable.
    #[error("refused: {0}")]
    Rejected(ControlError),
    /// No leader could take the request now (an election is running, the leader is
    /// unreachable, leadership moved during the call). Retry; `leader_addr` is where the
    /// leader was last seen, if anywhere.
    #[error("no Raft leader available ({reason}); retry")]
    Unavailable {
        leader_addr: Option<String>,
        reason: String,
    },
    /// A member refused to let this node join because its Raft state was lost.
    #[error("{0}")]
    LostState(PeerError),
    /// A bad setting.
    #[error("invalid control-plane configuration: {0}")]
    Config(String),
    /// The Raft storage failed to open.
    #[error("raft storage: {0}")]
    Storage(Box<crate::types::StorageError>),
    /// Raft stopped (shut down or a fatal storage error): the node must restart.
    #[error("raft stopped: {0}")]
    Fatal(String),
    /// This node was removed from the cluster: it takes no part any more, and no call
    /// of it will succeed (docs/control.md, "Removing a node").
    #[error(
        "this node (id {}) was {}; it takes no part in the cluster any more (to bring the \
         machine back, start it on an empty data directory with --join)",
        .0.node, .0.describe()
    )]
    Removed(Removal),
}

impl PlaneError {
    /// Whether the same call may succeed later unchanged.
    pub fn is_retryable(&self) -> bool {
        matches!(self, PlaneError::Unavailable { .. })
    }

    /// The leader's address, when the error knows it.
    pub fn leader_addr(&self) -> Option<&str> {
        match self {
            PlaneError::Unavailable { leader_addr, .. } => leader_addr.as_deref(),
            _ => None,
        }
    }

    pub(super) fn from_peer(e: PeerError) -> Self {
        match e {
            PeerError::Rejected(e) => PlaneError::Rejected(e),
            PeerError::NotLeader { addr, .. } => PlaneError::Unavailable {
                leader_addr: addr,
                reason: "the leader moved".into(),
            },
            PeerError::LostState(_) => PlaneError::LostState(e),
            PeerError::Failed(m) => PlaneError::Fatal(m),
            PeerError::Retry(reason) => PlaneError::Unavailable {
                leader_addr: None,
                reason,
            },
            PeerError::Misaddressed { .. } => PlaneError::Unavailable {
                leader_addr: None,
                reason: e.to_string(),
            },
        }
    }

    pub(super) fn from_call(e: CallError) -> Self {
        if let Some(removal) = e.removal() {
            return PlaneError::Removed(removal);
        }
        PlaneError::Unavailable {
            leader_addr: None,
            reason: e.to_string(),
        }
    }
}

/// Why `hawser init` on a node with `--join` peers did not bootstrap a cluster.
#[derive(Debug, Error)]
pub enum InitError {
    /// A peer's answer forbids it (or a peer did not answer); nothing changed.
    #[error("{0}")]
    Refused(BootstrapRefusal),
    #[error(transparent)]
    Plane(#[from] PlaneError),
}
