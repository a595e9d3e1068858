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
use tonic::transport::{Channel, Endpoint};

use crate::pb::raft_peer_client::RaftPeerClient;
use crate::pb::Payload;
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

/// Lazily connected channels to peers, by address, and deadline-bounded calls.
#[derive(Clone)]
pub struct PeerPool {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    connect_timeout: Duration,
}

impl PeerPool {
    pub fn new(connect_timeout: Duration) -> Self {
        Self {
            channels: Arc::default(),
            connect_timeout,
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
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(bad)?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        channels.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }

    /// Sends `json` to `addr` as `rpc` and returns the reply's JSON, within `deadline`.
    pub async fn call_raw(
        &self,
        addr: &str,
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
        let call = async {
            match rpc {
                Rpc::AppendEntries => client.append_entries(request).await,
                Rpc::Vote => client.vote(request).await,
                Rpc::InstallSnapshot => client.install_snapshot(request).await,
                Rpc::JoinCluster => client.join_cluster(request).await,
                Rpc::ForwardPropose => client.forward_propose(request).await,
                Rpc::RemoveNode => client.remove_node(request).await,
                Rpc::Report => client.report(request).await,
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
            Ok(Err(status)) => Err(CallError::Status {
                addr: addr.to_string(),
                status,
            }),
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
        let codec = |source| CallError::Codec {
            addr: addr.to_string(),
            source,
        };
        let json = serde_json::to_vec(req).map_err(codec)?;
        let reply = self.call_raw(addr, rpc, json, deadline).await?;
        serde_json::from_slice(&reply).map_err(codec)
    }
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
            .call(&self.addr, rpc, req, deadline)
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
