//! The server side of the peers-only `hawser.raft.v1.RaftPeer` service.
//!
//! Thin on purpose: decode the JSON payload, hand it to the local Raft instance or to
//! the control plane, encode `Result<reply, error>` back. A payload that does not
//! decode is `INVALID_ARGUMENT`, and so is a snapshot chunk past [`MAX_SNAPSHOT_BYTES`]
//! ([`check_snapshot_chunk`]); everything else, errors included, is a normal reply so
//! that openraft's and hawser's error types reach the caller intact.

use std::sync::Arc;

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tonic::{Request, Response, Status};

use crate::bootstrap::InitIntent;
use crate::health::Report;
use crate::network::{check_not_removed, check_peer_call, FROM_NODE, MAX_MESSAGE_BYTES};
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

/// The largest snapshot a node takes from a leader, in bytes: 16 messages' worth. The
/// cluster state is mostly the catalogs the stores report, each in one Raft entry of at
/// most [`MAX_MESSAGE_BYTES`], so a real one stays far below (a few MB for thousands of
/// tables).
pub const MAX_SNAPSHOT_BYTES: u64 = 16 * MAX_MESSAGE_BYTES as u64;

/// The snapshot a follower is receiving, byte for byte as openraft's `Streaming` holds
/// it: a chunk of a new snapshot id starts over (at offset 0 only), a chunk is written
/// at its offset, a gap filled with zeros.
///
/// openraft hands the whole snapshot to the state machine's `install_snapshot` only
/// after the last chunk, and an error there is fatal: the control plane stops for good.
/// A leader (or a node holding a node certificate) that sends bytes which are no cluster
/// state would stop it; the last chunk is therefore checked against this copy first and
/// refused with INVALID_ARGUMENT, leaving openraft's stream unfinished until the next
/// snapshot starts over.
#[derive(Debug, Default)]
pub(crate) struct SnapshotMirror {
    id: Option<String>,
    data: Vec<u8>,
}

impl SnapshotMirror {
    /// The snapshot's bytes once this chunk is written, if it continues the snapshot
    /// followed (or starts one); `None` when openraft will refuse it as a mismatch.
    pub(crate) fn with_chunk(&self, id: &str, offset: u64, data: &[u8]) -> Option<Vec<u8>> {
        let mut data_so_far = if self.id.as_deref() == Some(id) {
            self.data.clone()
        } else if offset == 0 {
            Vec::new()
        } else {
            return None;
        };
        write_at(&mut data_so_far, offset, data);
        Some(data_so_far)
    }

    /// Follows a chunk openraft took.
    pub(crate) fn accept(&mut self, id: &str, offset: u64, data: &[u8]) {
        if self.id.as_deref() != Some(id) {
            if offset != 0 {
                return;
            }
            self.id = Some(id.to_string());
            self.data.clear();
        }
        write_at(&mut self.data, offset, data);
    }
}

/// Writes `data` at `offset` into `buf` as a `Cursor<Vec<u8>>` does after a seek.
/// The offset is bounded by [`check_snapshot_chunk`] before any chunk gets here.
fn write_at(buf: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = usize::try_from(offset).expect("offset bounded by MAX_SNAPSHOT_BYTES");
    let end = start + data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[start..end].copy_from_slice(data);
}

/// Refuses an InstallSnapshot chunk that would reach past [`MAX_SNAPSHOT_BYTES`].
///
/// openraft writes each chunk at its offset into the buffer the state machine hands out
/// for the snapshot (a `Cursor<Vec<u8>>`), which grows to the offset first: a second
/// chunk of a snapshot at offset 2^40 made the node try to allocate a terabyte and abort
/// (seen while writing the `raft_payload` fuzz target, `docs/fuzzing.md`). A leader
/// sends the chunks of a snapshot in order from 0, so a chunk within the bound costs no
/// more than the snapshot itself.
pub fn check_snapshot_chunk(req: &InstallSnapshotRequest<TypeConfig>) -> Result<(), Status> {
    let end = req.offset.checked_add(req.data.len() as u64);
    if end.is_some_and(|end| end <= MAX_SNAPSHOT_BYTES) {
        return Ok(());
    }
    Err(Status::invalid_argument(format!(
        "a snapshot chunk of {} bytes at offset {} reaches past the {MAX_SNAPSHOT_BYTES} \
         bytes a snapshot may hold; refused",
        req.data.len(),
        req.offset
    )))
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
        check_snapshot_chunk(&rpc)?;
        // Held across openraft's handling, so the mirror follows the chunks in the order
        // openraft took them.
        let mut mirror = self.inner.snapshot.lock().await;
        if rpc.done {
            if let Some(whole) = mirror.with_chunk(&rpc.meta.snapshot_id, rpc.offset, &rpc.data) {
                if let Err(why) = crate::store::check_snapshot_data(&whole) {
                    *mirror = SnapshotMirror::default();
                    tracing::warn!(
                        snapshot = %rpc.meta.snapshot_id,
                        error = %why,
                        "refused a snapshot whose data is not a cluster state"
                    );
                    return Err(Status::invalid_argument(format!(
                        "snapshot {}: its data is not a cluster state ({why}); not installed",
                        rpc.meta.snapshot_id
                    )));
                }
            }
        }
        let (id, offset, data, done, vote) = (
            rpc.meta.snapshot_id.clone(),
            rpc.offset,
            rpc.data.clone(),
            rpc.done,
            rpc.vote,
        );
        let reply = self.inner.raft.install_snapshot(rpc).await;
        // Taken unless openraft answered with a higher vote (it then wrote nothing).
        if let Ok(r) = &reply {
            if r.vote <= vote {
                if done {
                    *mirror = SnapshotMirror::default();
                } else {
                    mirror.accept(&id, offset, &data);
                }
            }
        }
        encode(&reply)
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

    async fn init_intent(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let from = self.check(&req, false)?;
        let intent: InitIntent = decode(req)?;
        if from.is_some_and(|f| f != intent.from) {
            return Err(Status::invalid_argument(format!(
                "an init intent for node {} sent by node {}; refused",
                intent.from,
                from.unwrap_or_default()
            )));
        }
        encode(&self.inner.handle_init_intent(intent).await)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use openraft::network::snapshot_transport::Streaming;

    use super::*;

    /// A snapshot's first chunk, then one of the same snapshot at offset 2^40: the
    /// `raft_payload` fuzz finding, minimised. openraft grew its buffer to the offset
    /// (a terabyte) and the allocation failure aborted the process.
    const FAR_CHUNK: &str = r#"
        {"vote":{"leader_id":{"term":1,"node_id":1},"committed":true},
         "meta":{"last_log_id":null,"last_membership":{"log_id":null,
                 "membership":{"configs":[],"nodes":{}}},"snapshot_id":"s"},
         "offset":0,"data":[123],"done":false}
        {"vote":{"leader_id":{"term":1,"node_id":1},"committed":true},
         "meta":{"last_log_id":null,"last_membership":{"log_id":null,
                 "membership":{"configs":[],"nodes":{}}},"snapshot_id":"s"},
         "offset":1099511627776,"data":[125],"done":true}
    "#;

    fn chunks(json: &str) -> Vec<InstallSnapshotRequest<TypeConfig>> {
        serde_json::Deserializer::from_str(json)
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("the chunks decode")
    }

    #[test]
    fn a_snapshot_chunk_far_past_any_snapshot_is_refused_before_openraft_writes_it() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let [first, far] = <[_; 2]>::try_from(chunks(FAR_CHUNK)).expect("two chunks");
        // What PeerService::install_snapshot does with each, openraft's part by its
        // own Streaming over the buffer our state machine hands out.
        check_snapshot_chunk(&first).expect("the first chunk is taken");
        let mut streaming = Streaming::<TypeConfig>::new(
            first.meta.snapshot_id.clone(),
            Box::new(Cursor::new(Vec::new())),
        );
        rt.block_on(streaming.receive(first)).expect("written");
        let status = check_snapshot_chunk(&far).expect_err("the far chunk is refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("1099511627776"),
            "{}",
            status.message()
        );
        assert_eq!(streaming.into_snapshot_data().into_inner(), b"{");
    }

    /// The mirror ends with what openraft's own Streaming holds, for chunks in order,
    /// resent, overlapping, with a gap, and of a new snapshot.
    #[test]
    fn the_mirror_holds_what_openraft_holds_chunk_for_chunk() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let plan: &[(&str, u64, &[u8])] = &[
            ("a", 0, b"hel"),
            ("a", 3, b"lo"),
            ("a", 3, b"LO"),
            ("a", 2, b"xx"),
            ("a", 8, b"!"),
        ];
        let mut mirror = SnapshotMirror::default();
        let mut streaming =
            Streaming::<TypeConfig>::new("a".to_string(), Box::new(Cursor::new(Vec::new())));
        let template = chunks(FAR_CHUNK).remove(0);
        for &(id, offset, data) in plan {
            let mut req = template.clone();
            req.meta.snapshot_id = id.to_string();
            req.offset = offset;
            req.data = data.to_vec();
            let expected = mirror.with_chunk(id, offset, data).expect("same stream");
            rt.block_on(streaming.receive(req)).expect("written");
            mirror.accept(id, offset, data);
            assert_eq!(mirror.data, expected);
        }
        assert_eq!(streaming.into_snapshot_data().into_inner(), mirror.data);
        assert_eq!(mirror.data, b"hexxO\0\0\0!");
        // Another snapshot: only from offset 0, and it starts over.
        assert_eq!(mirror.with_chunk("b", 4, b"z"), None);
        mirror.accept("b", 4, b"z");
        assert_eq!(mirror.data, b"hexxO\0\0\0!");
        assert_eq!(
            mirror.with_chunk("b", 0, b"{}").as_deref(),
            Some(&b"{}"[..])
        );
        mirror.accept("b", 0, b"{}");
        assert_eq!(mirror.data, b"{}");
    }

    #[test]
    fn chunks_are_taken_up_to_the_bound_and_not_past_it() {
        let mut req = chunks(FAR_CHUNK).remove(0);
        req.offset = MAX_SNAPSHOT_BYTES - 1;
        check_snapshot_chunk(&req).expect("the last byte a snapshot may hold");
        req.offset = MAX_SNAPSHOT_BYTES;
        assert!(check_snapshot_chunk(&req).is_err());
        // An offset whose end does not fit a u64 is refused, not wrapped.
        req.offset = u64::MAX;
        assert!(check_snapshot_chunk(&req).is_err());
        req.data.clear();
        req.offset = u64::MAX;
        assert!(check_snapshot_chunk(&req).is_err());
    }
}
