//! The server side of the peers-only `hawser.raft.v1.RaftPeer` service.
//!
//! Thin on purpose: decode the JSON payload, hand it to the local Raft instance or to
//! the control plane, encode `Result<reply, error>` back. A payload that does not
//! decode is `INVALID_ARGUMENT`; everything else, errors included, is a normal reply so
//! that openraft's and hawser's error types reach the caller intact.

use std::sync::Arc;

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use crate::health::Report;
use crate::network::{check_not_removed, check_peer_call, FROM_NODE};
use crate::pb::raft_peer_server::RaftPeer;
use crate::pb::Payload;
use crate::plane::{Inner, JoinRequest, RemoveRequest};
use crate::removal::Removal;
use crate::state::{Command, RemovalMode};
use crate::types::{RaftNodeId, TypeConfig};

/// The peer service of one node; the node adds [`crate::ControlPlane::raft_service`] to
/// its gRPC server.
pub struct PeerService {
    pub(crate) inner: Arc<Inner>,
}

impl PeerService {
    /// The call's identity checked against this node's ([`check_peer_call`]), and its
    /// sender against the nodes the cluster removed ([`check_not_removed`]).
    /// Returns the caller's id, when it says it.
    fn check(&self, req: &Request<Payload>, raft: bool) -> Result<Option<u64>, Status> {
        let state = self.inner.sm.state();
        let me = self.inner.cfg.node_id.0;
        check_peer_call(req.metadata(), me, state.cluster_id, raft)
            .inspect_err(|e| tracing::warn!(error = %e.message(), "refused a peer call"))?;
        let from = req
            .metadata()
            .get(FROM_NODE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        // The committed membership is only looked up for a caller the cluster removed.
        let member = raft
            && from.is_some_and(|f| {
                state.removed.contains_key(&hawser_core::NodeId(f))
                    && self.inner.sm.members().contains(&f)
            });
        // Not a WARN: a removed node that is down when removed calls until it hears
        // this once; the removal itself was logged where it was made.
        check_not_removed(from, &state, me, member).inspect_err(
            |e| tracing::debug!(error = %e.message(), "refused a removed node's call"),
        )?;
        Ok(from)
    }
}

/// A RemoveNode request: a [`RemoveRequest`], or a bare node id as builds before
/// removal modes sent (mode Refuse).
#[derive(Deserialize)]
#[serde(untagged)]
enum RemoveWire {
    Id(RaftNodeId),
    Request(RemoveRequest),
}

impl From<RemoveWire> for RemoveRequest {
    fn from(w: RemoveWire) -> Self {
        match w {
            RemoveWire::Id(id) => RemoveRequest {
                node: hawser_core::NodeId(id),
                mode: RemovalMode::Refuse,
            },
            RemoveWire::Request(r) => r,
        }
    }
}

fn decode<T: DeserializeOwned>(req: Request<Payload>) -> Result<T, Status> {
    serde_json::from_slice(&req.into_inner().json)
        .map_err(|e| Status::invalid_argument(format!("undecodable peer message: {e}")))
}

fn encode<T: Serialize>(reply: &T) -> Result<Response<Payload>, Status> {
    serde_json::to_vec(reply)
        .map(|json| Response::new(Payload { json }))
        .map_err(|e| Status::internal(format!("cannot encode a peer reply: {e}")))
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.check(&req, true)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(req)?;
        encode(&self.inner.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.check(&req, true)?;
        let rpc: VoteRequest<RaftNodeId> = decode(req)?;
        encode(&self.inner.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.check(&req, true)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(req)?;
        encode(&self.inner.raft.install_snapshot(rpc).await)
    }

    async fn join_cluster(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.check(&req, false)?;
        let join: JoinRequest = decode(req)?;
        encode(&self.inner.handle_join(join).await)
    }

    async fn forward_propose(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.check(&req, false)?;
        let cmd: Command = decode(req)?;
        encode(&self.inner.propose_here(cmd).await)
    }

    async fn remove_node(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.check(&req, false)?;
        let remove: RemoveWire = decode(req)?;
        encode(&self.inner.handle_remove(remove.into()).await)
    }

    async fn notify_removed(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let from = self.check(&req, false)?;
        let removal: Removal = decode(req)?;
        encode(&self.inner.handle_notify_removed(from, removal).await)
    }

    async fn report(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.check(&req, false)?;
        let report: Report = decode(req)?;
        encode(&self.inner.handle_report(report))
    }
}
