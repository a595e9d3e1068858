//! The Raft transport: clients of the peers-only `hawser.raft.v1.RaftPeer` service.
//!
//! [`PeerPool`] keeps one lazily connected tonic [`Channel`] per peer address and makes
//! every call with a deadline. [`NetworkFactory`] hands openraft a [`PeerConnection`] per
//! target; openraft calls `new_client` often (per replication stream, per election), so
//! it only looks a channel up and never connects or fails there.
//!
//! Payloads are JSON (see `proto/hawser/v1/raft.proto`). Failures map onto openraft's
//! error kinds on purpose: a peer that cannot be reached (`UNAVAILABLE`, a bad
//! address) is [`Unreachable`], which makes openraft back off before the next attempt;
//! a deadline, any other status or an undecodable reply is a [`NetworkError`], retried on
//! the next heartbeat; an error the remote Raft returned travels back as itself in a
//! [`RemoteError`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::watch;

use crate::state::ClusterState;
use tonic::transport::{Channel, ClientTlsConfig};

use crate::pb::raft_peer_client::RaftPeerClient;
use crate::pb::Payload;
use crate::removal::{Learned, Removal, RemovalBook};
use crate::state::ControlError;
use crate::types::{BasicNode, RaftNodeId, TypeConfig};

/// The largest message a peer sends or accepts (snapshot chunks are 1 MiB of JSON-encoded
/// bytes, several times that on the wire).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The RPCs of the peer service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
    JoinCluster,
    ForwardPropose,
    RemoveNode,
    Report,
    NotifyRemoved,
    InitIntent,
}

impl Rpc {
    /// The RPC's name as metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            Rpc::AppendEntries => "append_entries",
            Rpc::Vote => "vote",
            Rpc::InstallSnapshot => "install_snapshot",
            Rpc::JoinCluster => "join_cluster",
            Rpc::ForwardPropose => "forward_propose",
            Rpc::RemoveNode => "remove_node",
            Rpc::Report => "report",
            Rpc::NotifyRemoved => "notify_removed",
            Rpc::InitIntent => "init_intent",
        }
    }
}

/// Why a call to a peer failed before its reply could be read.
#[derive(Debug, Error)]
pub enum CallError {
    #[error("bad peer address {addr}: {source}")]
    BadAddress {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("peer {addr} answered {status}")]
    Status {
        addr: String,
        #[source]
        status: tonic::Status,
    },
    #[error("peer {addr} did not answer within {deadline:?}")]
    Deadline { addr: String, deadline: Duration },
    #[error("cannot encode or decode a message for peer {addr}: {source}")]
    Codec {
        addr: String,
        #[source]
        source: serde_json::Error,
    },
}

impl CallError {
    /// The removal a peer's refusal says this node had, if that is why it refused.
    pub fn removal(&self) -> Option<Removal> {
        match self {
            CallError::Status { status, .. } => removal_refusal(status),
            _ => None,
        }
    }

    /// Whether the peer is down or not listening (as opposed to slow or confused).
    pub fn is_unreachable(&self) -> bool {
        match self {
            CallError::BadAddress { .. } => true,
            CallError::Status { status, .. } => status.code() == tonic::Code::Unavailable,
            _ => false,
        }
    }
}

/// An error a member returns for JoinCluster, ForwardPropose and RemoveNode.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum PeerError {
    /// The member is not the Raft leader; `addr` is the leader's, when one is known.
    #[error("not the Raft leader (leader: {leader:?} at {addr:?})")]
    NotLeader {
        leader: Option<RaftNodeId>,
        addr: Option<String>,
    },
    /// The command does not fit the cluster state.
    #[error("{0}")]
    Rejected(ControlError),
    /// A node with empty Raft storage asked to join under an id that is already a
    /// member: its old log is gone, and letting it in could lose committed entries.
    #[error("node {0} is already a member but has lost its Raft state; join under a new id")]
    LostState(RaftNodeId),
    /// A message meant for node `meant` reached node `here` (an address now answered
    /// by another node): refused, never acted on.
    #[error("this is node {here}, not node {meant} the message was meant for")]
    Misaddressed { meant: RaftNodeId, here: RaftNodeId },
    /// The leader could not make the change now, for a reason that may pass (a
    /// switchover whose new master did not catch up in time): nothing changed; retry.
    #[error("{0}")]
    Retry(String),
    /// The leader could not finish the change (Raft stopped, a membership change did
    /// not commit in time, ...).
    #[error("{0}")]
    Failed(String),
}

/// Metadata keys of a peer call's identity: who sends it, which node it is for, which
/// cluster it belongs to (each a decimal u64). An address is no identity — a node
/// replaced on an empty data directory answers at the old one's address — so the
/// receiving node checks them ([`check_peer_call`]).
pub const FROM_NODE: &str = "hawser-from-node";
pub const TO_NODE: &str = "hawser-to-node";
pub const CLUSTER: &str = "hawser-cluster";

/// Metadata key of a peer's refusal that the caller must act on; its one value now is
/// [`REFUSED_REMOVED`], with the status details a JSON [`Removal`].
pub const REFUSAL: &str = "hawser-refusal";
/// [`REFUSAL`]: the caller was removed from the cluster.
pub const REFUSED_REMOVED: &str = "removed";

/// Refuses a call from node `from` when the cluster (`state`, applied here by node
/// `me`) removed it, with a typed refusal the caller records ([`removal_refusal`]).
/// `raft_member`: the call is a Raft call (AppendEntries, Vote, InstallSnapshot) and
/// the caller is still in this node's committed membership — taken, since the
/// membership change that follows a removal may still be under way (a leader removing
/// itself leads it), and Raft needs the call then.
pub fn check_not_removed(
    from: Option<u64>,
    state: &ClusterState,
    me: u64,
    raft_member: bool,
) -> Result<(), tonic::Status> {
    let Some(from) = from else {
        return Ok(());
    };
    let Some(removed) = state.removed.get(&hawser_core::NodeId(from)) else {
        return Ok(());
    };
    if raft_member {
        return Ok(());
    }
    let removal = Removal {
        node: hawser_core::NodeId(from),
        cluster_id: state.cluster_id,
        log_index: removed.log_index,
        at_unix_ms: removed.at_unix_ms,
        learned: Learned::Refused {
            by: hawser_core::NodeId(me),
        },
    };
    let message = format!(
        "node {from} (store {}) was {}: it takes no part in the cluster any more; \
         refused",
        removed.store,
        removal.describe()
    );
    // A Removal always serializes (plain numbers and an enum).
    let details = serde_json::to_vec(&removal).unwrap_or_default();
    let mut status =
        tonic::Status::with_details(tonic::Code::FailedPrecondition, message, details.into());
    status.metadata_mut().insert(
        REFUSAL,
        tonic::metadata::MetadataValue::from_static(REFUSED_REMOVED),
    );
    Err(status)
}

/// The removal a peer's refusal ([`check_not_removed`]) names, if it is one.
pub fn removal_refusal(status: &tonic::Status) -> Option<Removal> {
    let typed = status
        .metadata()
        .get(REFUSAL)
        .is_some_and(|v| v.as_bytes() == REFUSED_REMOVED.as_bytes());
    typed
        .then(|| serde_json::from_slice(status.details()).ok())
        .flatten()
}

/// Lazily connected channels to peers, by address, and deadline-bounded calls that say
/// who sends them, to which node and in which cluster. A peer's refusal saying this
/// node was removed is recorded in the removal book, whichever call met it.
#[derive(Clone)]
pub struct PeerPool {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    connect_timeout: Duration,
    /// This node's id.
    from: u64,
    /// The applied cluster state, for the cluster id (0 until this node has one).
    state: watch::Receiver<Arc<ClusterState>>,
    removal: Arc<RemovalBook>,
    /// This node's certificate and the cluster's CA, when the cluster runs secure.
    tls: Option<ClientTlsConfig>,
}

impl PeerPool {
    pub(crate) fn new(
        connect_timeout: Duration,
        from: u64,
        state: watch::Receiver<Arc<ClusterState>>,
        removal: Arc<RemovalBook>,
        tls: Option<ClientTlsConfig>,
    ) -> Self {
        Self {
            channels: Arc::default(),
            connect_timeout,
            from,
            state,
            removal,
            tls,
        }
    }

    fn channel(&self, addr: &str) -> Result<Channel, CallError> {
        let mut channels = self.channels.lock();
        if let Some(ch) = channels.get(addr) {
            return Ok(ch.clone());
        }
        let bad = |source| CallError::BadAddress {
            addr: addr.to_string(),
            source,
        };
        // Connects on first use and reconnects by itself after a failure.
        let ch = hawser_tls::endpoint(addr, self.tls.as_ref())
            .map_err(bad)?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        channels.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }

    /// Sends `json` to `addr` as `rpc` and returns the reply's JSON, within `deadline`;
    /// `to`, when known, is the node the call is meant for.
    pub async fn call_raw(
        &self,
        addr: &str,
        to: Option<u64>,
        rpc: Rpc,
        json: Vec<u8>,
        deadline: Duration,
    ) -> Result<Vec<u8>, CallError> {
        if hawser_core::isolation::isolated() {
            return Err(CallError::Status {
                addr: addr.to_string(),
                status: tonic::Status::unavailable(hawser_core::isolation::REFUSAL),
            });
        }
        let mut client = RaftPeerClient::new(self.channel(addr)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let mut request = tonic::Request::new(Payload { json });
        // The deadline travels to the server too (grpc-timeout).
        request.set_timeout(deadline);
        let cluster = self.state.borrow().cluster_id;
        let md = request.metadata_mut();
        let ids = [
            (FROM_NODE, Some(self.from)),
            (TO_NODE, to),
            (CLUSTER, Some(cluster)),
        ];
        for (key, id) in ids {
            if let Some(v) = id
                .filter(|v| *v != 0)
                .and_then(|v| v.to_string().parse().ok())
            {
                md.insert(key, v);
            }
        }
        let call = async {
            match rpc {
                Rpc::AppendEntries => client.append_entries(request).await,
                Rpc::Vote => client.vote(request).await,
                Rpc::InstallSnapshot => client.install_snapshot(request).await,
                Rpc::JoinCluster => client.join_cluster(request).await,
                Rpc::ForwardPropose => client.forward_propose(request).await,
                Rpc::RemoveNode => client.remove_node(request).await,
                Rpc::Report => client.report(request).await,
                Rpc::NotifyRemoved => client.notify_removed(request).await,
                Rpc::InitIntent => client.init_intent(request).await,
            }
        };
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(deadline, call).await;
        // Every call is timed, failures included; the label sets are small and fixed.
        metrics::histogram!(
            "hawser_raft_rpc_seconds",
            "rpc" => rpc.name(),
            "outcome" => match &outcome {
                Ok(Ok(_)) => "ok",
                Ok(Err(_)) => "error",
                Err(_) => "deadline",
            }
        )
        .record(started.elapsed().as_secs_f64());
        match outcome {
            Err(_) => Err(CallError::Deadline {
                addr: addr.to_string(),
                deadline,
            }),
            Ok(Err(status)) => {
                if let Some(removal) = removal_refusal(&status) {
                    // Whichever call met it (a vote, a report, a join), this node was
                    // removed: recorded once, which turns its elections off.
                    let cluster = self.state.borrow().cluster_id;
                    if cluster == 0 || removal.cluster_id == cluster {
                        self.removal.record(removal).await;
                    }
                }
                Err(CallError::Status {
                    addr: addr.to_string(),
                    status,
                })
            }
            Ok(Ok(reply)) => Ok(reply.into_inner().json),
        }
    }

    /// Sends `req` to `addr` as `rpc` and decodes the reply as `T`, within `deadline`.
    pub async fn call<Req: Serialize, T: DeserializeOwned>(
        &self,
        addr: &str,
        rpc: Rpc,
        req: &Req,
        deadline: Duration,
    ) -> Result<T, CallError> {
        self.call_to(addr, None, rpc, req, deadline).await
    }

    /// [`PeerPool::call`] to node `to`, which must be the one answering at `addr`.
    pub async fn call_to<Req: Serialize, T: DeserializeOwned>(
        &self,
        addr: &str,
        to: Option<u64>,
        rpc: Rpc,
        req: &Req,
        deadline: Duration,
    ) -> Result<T, CallError> {
        let codec = |source| CallError::Codec {
            addr: addr.to_string(),
            source,
        };
        let json = serde_json::to_vec(req).map_err(codec)?;
        let reply = self.call_raw(addr, to, rpc, json, deadline).await?;
        serde_json::from_slice(&reply).map_err(codec)
    }
}

/// Checks a peer call's identity against this node's (`me`) and cluster's (`cluster`, 0
/// while this node has none): refused when it is meant for another node or comes from
/// another cluster, and — for `raft` calls (AppendEntries, Vote, InstallSnapshot), which
/// could make this node adopt a vote or membership — when it does not say which node it
/// is for. A node that is not in a cluster yet takes any cluster's calls meant for it
/// (it is joining).
pub fn check_peer_call(
    md: &tonic::metadata::MetadataMap,
    me: u64,
    cluster: u64,
    raft: bool,
) -> Result<(), tonic::Status> {
    let id = |key: &str| -> Result<Option<u64>, tonic::Status> {
        match md.get(key) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|t| t.parse().ok())
                .map(Some)
                .ok_or_else(|| {
                    tonic::Status::invalid_argument(format!(
                        "peer call metadata {key} is not a node id"
                    ))
                }),
        }
    };
    let from = id(FROM_NODE)?.map_or("an unnamed node".to_string(), |f| format!("node {f}"));
    match id(TO_NODE)? {
        Some(to) if to != me => {
            return Err(tonic::Status::failed_precondition(format!(
                "a peer call from {from} is meant for node {to}, but this is node {me}: the \
                 address reached another node than the member it names (one replaced on an \
                 empty data directory?); refused"
            )))
        }
        None if raft => {
            return Err(tonic::Status::failed_precondition(format!(
                "a Raft call from {from} does not say which node it is for; refused"
            )))
        }
        _ => {}
    }
    if let Some(theirs) = id(CLUSTER)? {
        if cluster != 0 && theirs != cluster {
            return Err(tonic::Status::failed_precondition(format!(
                "a peer call from {from} belongs to cluster {theirs}, but this node is in \
                 cluster {cluster}; refused"
            )));
        }
    }
    Ok(())
}

/// openraft's factory of connections to peers.
#[derive(Clone)]
pub struct NetworkFactory {
    pool: PeerPool,
    backoff: Duration,
}

impl NetworkFactory {
    /// Connections through `pool`; an unreachable peer is retried every `backoff`.
    pub fn new(pool: PeerPool, backoff: Duration) -> Self {
        Self { pool, backoff }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: RaftNodeId, node: &BasicNode) -> PeerConnection {
        PeerConnection {
            target,
            addr: node.addr.clone(),
            pool: self.pool.clone(),
            backoff: self.backoff,
        }
    }
}

/// openraft's connection to one peer.
pub struct PeerConnection {
    target: RaftNodeId,
    addr: String,
    pool: PeerPool,
    backoff: Duration,
}

type RpcResult<T, E> = Result<T, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, E>>>;

impl PeerConnection {
    async fn send<Req, Resp, E>(
        &self,
        rpc: Rpc,
        req: &Req,
        deadline: Duration,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let reply: Result<Resp, RaftError<RaftNodeId, E>> = self
            .pool
            .call_to(&self.addr, Some(self.target), rpc, req, deadline)
            .await
            .map_err(|e| {
                if e.is_unreachable() {
                    RPCError::Unreachable(Unreachable::new(&e))
                } else {
                    RPCError::Network(NetworkError::new(&e))
                }
            })?;
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<RaftNodeId>, openraft::error::Infallible> {
        self.send(Rpc::AppendEntries, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<RaftNodeId>, InstallSnapshotError> {
        self.send(Rpc::InstallSnapshot, &rpc, option.hard_ttl())
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<RaftNodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<RaftNodeId>, openraft::error::Infallible> {
        self.send(Rpc::Vote, &rpc, option.hard_ttl()).await
    }

    fn backoff(&self) -> Backoff {
        // openraft's default is 500 ms; a returning peer is picked up sooner this way.
        Backoff::new(std::iter::repeat(self.backoff))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: &[(&'static str, &str)]) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn a_peer_call_for_another_node_or_cluster_is_refused() {
        let ok = md(&[(FROM_NODE, "1"), (TO_NODE, "7"), (CLUSTER, "99")]);
        assert!(check_peer_call(&ok, 7, 99, true).is_ok());
        // A node replaced on an empty data directory, at the old one's address.
        let err = check_peer_call(&ok, 8, 99, true).unwrap_err();
        assert!(
            err.message()
                .contains("meant for node 7, but this is node 8"),
            "{err:?}"
        );
        // Another cluster.
        let err = check_peer_call(&ok, 7, 42, false).unwrap_err();
        assert!(err.message().contains("cluster 99"), "{err:?}");
        // A node not in a cluster yet takes a call meant for it (it is joining).
        assert!(check_peer_call(&ok, 7, 0, true).is_ok());
        // A Raft call must name its node; others (a join, a forward to the leader by
        // address) need not.
        let unnamed = md(&[(FROM_NODE, "1"), (CLUSTER, "99")]);
        assert!(check_peer_call(&unnamed, 7, 99, true).is_err());
        assert!(check_peer_call(&unnamed, 7, 99, false).is_ok());
        let garbled = md(&[(TO_NODE, "seven")]);
        assert_eq!(
            check_peer_call(&garbled, 7, 99, false).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn a_removed_node_is_refused_with_a_removal_it_can_read_unless_a_raft_member() {
        let mut state = ClusterState {
            cluster_id: 99,
            ..Default::default()
        };
        state.removed.insert(
            hawser_core::NodeId(5),
            crate::state::RemovedNode {
                store: hawser_core::Ident::unquoted("n5"),
                at_unix_ms: 1_700_000_000_000,
                log_index: 31,
            },
        );
        assert!(check_not_removed(Some(6), &state, 1, false).is_ok());
        assert!(check_not_removed(None, &state, 1, false).is_ok());
        // Still in the committed membership: its Raft calls are taken.
        assert!(check_not_removed(Some(5), &state, 1, true).is_ok());
        let refusal = check_not_removed(Some(5), &state, 1, false).unwrap_err();
        assert_eq!(refusal.code(), tonic::Code::FailedPrecondition);
        assert!(
            refusal
                .message()
                .contains("node 5 (store n5) was removed from cluster 99"),
            "{}",
            refusal.message()
        );
        let removal = removal_refusal(&refusal).expect("a typed refusal");
        assert_eq!(
            (removal.node, removal.cluster_id, removal.log_index),
            (hawser_core::NodeId(5), 99, 31)
        );
        assert_eq!(
            removal.learned,
            Learned::Refused {
                by: hawser_core::NodeId(1)
            }
        );
        // Any other refusal is not one.
        assert!(removal_refusal(&tonic::Status::failed_precondition("no")).is_none());
    }
}
