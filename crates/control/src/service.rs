//! The server side of the peers-only `hawser.raft.v1.RaftPeer` service.
//!
//! Thin on purpose: decode the JSON payload, hand it to the local Raft instance or to
//! the control plane, encode `Result<reply, error>` back. A payload that does not
//! decode is `INVALID_ARGUMENT`; everything else, errors included, is a normal reply so
//! that openraft's and hawser's error types reach the caller intact.

use std::sync::Arc;

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::health::Report;
use crate::network::check_peer_call;
use crate::pb::raft_peer_server::RaftPeer;
use crate::pb::Payload;
use crate::plane::{Inner, JoinRequest};
use crate::state::Command;
use crate::types::{RaftNodeId, TypeConfig};

/// The peer service of one node; the node adds [`crate::ControlPlane::raft_service`] to
/// its gRPC server.
pub struct PeerService {
    pub(crate) inner: Arc<Inner>,
}

impl PeerService {
    /// The call's identity checked against this node's ([`check_peer_call`]).
    fn check(&self, req: &Request<Payload>, raft: bool) -> Result<(), Status> {
        let cluster = self.inner.sm.state().cluster_id;
        check_peer_call(req.metadata(), self.inner.cfg.node_id.0, cluster, raft)
            .inspect_err(|e| tracing::warn!(error = %e.message(), "refused a peer call"))
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
        let id: RaftNodeId = decode(req)?;
        encode(&self.inner.handle_remove(id).await)
    }

    async fn report(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.check(&req, false)?;
        let report: Report = decode(req)?;
        encode(&self.inner.handle_report(report))
    }
}
