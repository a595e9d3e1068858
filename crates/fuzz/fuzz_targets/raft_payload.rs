//! Bytes from a peer → the control plane's `RaftPeer` payloads: the JSON that
//! `PeerService` decodes for each RPC (openraft's AppendEntries / Vote / InstallSnapshot
//! requests of `TypeConfig`, a `JoinRequest`, a forwarded `Command`, a node to remove, a
//! removal notice, a health `Report`) and the replies a node decodes from its peers, then
//! what the node does with the decoded values without Raft: commands validated and
//! applied to a seeded cluster state (as a follower applies log entries), snapshot chunks
//! checked as `PeerService` checks them and streamed by openraft's own `Streaming` into
//! the state machine's buffer, then decoded as a `ClusterState`, a report recorded and
//! the failover decision taken on it. The first byte picks the RPC. An error is fine; a
//! panic, a hang or running out of memory is a failure.
#![no_main]

use std::io::Cursor;
use std::sync::OnceLock;
use std::time::Duration;

use hawser_control::failover::{self, FailoverSettings, HealthView};
use hawser_control::health::{Report, ReportReply};
use hawser_control::state::{self, ClusterState, Command};
use hawser_control::types::{RaftNodeId, TypeConfig};
use hawser_control::{
    JoinReply, JoinRequest, PeerError, Removal, RemovalMode, RemoveReply, RemoveRequest, Response,
};
use libfuzzer_sys::fuzz_target;
use openraft::network::snapshot_transport::Streaming;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::EntryPayload;
use serde::de::DeserializeOwned;

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    serde_json::from_slice(bytes).ok()
}

fn cluster() -> &'static ClusterState {
    static STATE: OnceLock<ClusterState> = OnceLock::new();
    STATE.get_or_init(hawser_fuzz::seeded_cluster)
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("build the fuzz runtime")
    })
}

/// Validates and applies `cmd` to the seeded state, as a leader checks a proposal and
/// every replica applies the committed entry.
fn apply(cmd: &Command) {
    let mut st = cluster().clone();
    let _ = state::validate(&st, cmd);
    let _ = state::apply(&mut st, cmd);
    // What a leader does with its state at every tick.
    decide(&st, &HealthView::new(Duration::ZERO));
}

fn decide(st: &ClusterState, view: &HealthView) {
    let settings = FailoverSettings::new(Duration::from_secs(3), Duration::from_secs(2));
    let _ = failover::decide(st, view, Duration::from_secs(10), &settings);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    match mode % 10 {
        0 => {
            let Some(rpc) = decode::<AppendEntriesRequest<TypeConfig>>(bytes) else {
                return;
            };
            let mut st = cluster().clone();
            for entry in rpc.entries {
                match entry.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(cmd) => {
                        let _ = state::apply(&mut st, &cmd);
                    }
                    EntryPayload::Membership(m) => {
                        st.set_voters(&m.voter_ids().map(hawser_core::NodeId).collect());
                    }
                }
            }
            decide(&st, &HealthView::new(Duration::ZERO));
        }
        1 => {
            let _ = decode::<VoteRequest<RaftNodeId>>(bytes);
        }
        2 => snapshot(bytes),
        3 => {
            if let Some(join) = decode::<JoinRequest>(bytes) {
                apply(&Command::RegisterNode(join.node));
            }
        }
        4 => {
            if let Some(cmd) = decode::<Command>(bytes) {
                apply(&cmd);
            }
        }
        5 => {
            // RemoveNode: a bare node id (older builds) or a RemoveRequest, as
            // `PeerService::remove_node` reads it; `handle_remove` proposes the command.
            let request = match decode::<RaftNodeId>(bytes) {
                Some(id) => Some(RemoveRequest {
                    node: hawser_core::NodeId(id),
                    mode: RemovalMode::Refuse,
                }),
                None => decode::<RemoveRequest>(bytes),
            };
            if let Some(r) = request {
                apply(&Command::RemoveNode {
                    node: r.node,
                    mode: r.mode,
                    at_unix_ms: 1_700_000_000_000,
                });
            }
        }
        6 => {
            if let Some(report) = decode::<Report>(bytes) {
                // Received at 9 s on the leader's clock, which leads from 0 s.
                let heard_after = report.health.echo.map(|e| Duration::from_micros(e.micros));
                let mut view = HealthView::new(Duration::ZERO);
                view.record(Duration::from_secs(9), heard_after, report.health);
                decide(cluster(), &view);
            }
        }
        7 => {
            if let Some(st) = decode::<ClusterState>(bytes) {
                decide(&st, &HealthView::new(Duration::ZERO));
            }
        }
        8 => {
            // NotifyRemoved, and the removal a peer's refusal carries in its details;
            // InitIntent, as a free node's bootstrap gate answers it.
            let _ = decode::<Removal>(bytes);
            if let Some(intent) = decode::<hawser_control::bootstrap::InitIntent>(bytes) {
                let mut gate = hawser_control::bootstrap::BootstrapGate::default();
                let now = std::time::Instant::now();
                let _ = gate.ask(1, intent.from, None, now);
                gate.release(intent.from);
                let _ = gate.claim(1, now);
            }
            let mut status = tonic::Status::with_details(
                tonic::Code::FailedPrecondition,
                "removed",
                bytes.to_vec().into(),
            );
            status.metadata_mut().insert(
                hawser_control::network::REFUSAL,
                tonic::metadata::MetadataValue::from_static(
                    hawser_control::network::REFUSED_REMOVED,
                ),
            );
            let _ = hawser_control::network::removal_refusal(&status);
        }
        _ => {
            // Replies, as `PeerPool::call` and openraft's network decode them.
            let _ = decode::<Result<AppendEntriesResponse<RaftNodeId>, PeerError>>(bytes);
            let _ = decode::<Result<VoteResponse<RaftNodeId>, PeerError>>(bytes);
            let _ = decode::<Result<InstallSnapshotResponse<RaftNodeId>, PeerError>>(bytes);
            let _ = decode::<Result<JoinReply, PeerError>>(bytes);
            let _ = decode::<Result<Response, PeerError>>(bytes);
            let _ = decode::<Result<RemoveReply, PeerError>>(bytes);
            let _ = decode::<Result<(), PeerError>>(bytes);
            let _ = decode::<Result<ReportReply, PeerError>>(bytes);
            let _ = decode::<hawser_control::bootstrap::InitAnswer>(bytes);
        }
    }
});

/// A run of InstallSnapshot chunks (JSON values one after another), each decoded as
/// `PeerService` does, checked as it checks them, and streamed as openraft's
/// `Chunked::receive_snapshot` streams them into the buffer the state machine hands out
/// (`begin_receiving_snapshot`); the last one's data decoded as the state machine's
/// `install_snapshot` decodes it.
fn snapshot(bytes: &[u8]) {
    let chunks = serde_json::Deserializer::from_slice(bytes)
        .into_iter::<InstallSnapshotRequest<TypeConfig>>()
        .map_while(Result::ok);
    let mut streaming: Option<Streaming<TypeConfig>> = None;
    for req in chunks.take(16) {
        if hawser_control::service::check_snapshot_chunk(&req).is_err() {
            continue;
        }
        let same = streaming
            .as_ref()
            .is_some_and(|s| s.snapshot_id() == &req.meta.snapshot_id);
        if !same {
            if req.offset != 0 {
                continue;
            }
            streaming = Some(Streaming::new(
                req.meta.snapshot_id.clone(),
                Box::new(Cursor::new(Vec::new())),
            ));
        }
        let done = req.done;
        let Some(s) = streaming.as_mut() else {
            continue;
        };
        if runtime().block_on(s.receive(req)).is_err() {
            return;
        }
        if done {
            if let Some(s) = streaming.take() {
                let data = s.into_snapshot_data().into_inner();
                let _ = decode::<ClusterState>(&data);
            }
        }
    }
}
