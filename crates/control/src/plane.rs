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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use hawser_core::{Epoch, Ident, NodeId};
use hawser_store::KvEngine;
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{ChangeMembers, Config, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::watch;

use crate::bootstrap::{self, BootstrapGate, BootstrapRefusal, InitAnswer, InitIntent};
use crate::failover::{self, Blocked, FailoverSettings, HealthReport, HealthView};
use crate::health::{HealthBook, LeaseGrant, Report, ReportReply};
use crate::network::{CallError, NetworkFactory, PeerError, PeerPool, Rpc};
use crate::pb::raft_peer_server::RaftPeerServer;
use crate::removal::{Learned, Removal, RemovalBook};
use crate::replace;
use crate::service::PeerService;
use crate::state::{
    self, ClusterState, Command, ControlError, NodeInfo, RemovalMode, Response, SchemeRole,
};
use crate::store;
use crate::types::{BasicNode, Raft, RaftMetrics, RaftNodeId};

/// How many times a proposal or join follows "the leader is over there" before it gives
/// up with a retryable error.
const MAX_HOPS: usize = 3;

/// Settings of one node's control plane. [`ControlConfig::new`] fills in the defaults.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    pub node_id: NodeId,
    /// What this node calls its peers with when the cluster runs secure: the cluster's
    /// CA and this node's certificate (`None`: plain HTTP/2).
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// This node's database name in replication schemes.
    pub store_name: Ident,
    /// The advertised host name.
    pub host: String,
    /// `host:port` where peers reach this node's gRPC server (and the peer service).
    pub grpc_addr: String,
    /// `host:port` of this node's HTTP server.
    pub http_addr: String,
    /// Leader heartbeat; also openraft's deadline for an AppendEntries call.
    pub heartbeat_interval: Duration,
    /// Election timeout range; a vote call's deadline is the minimum.
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Deadline of one snapshot chunk.
    pub install_snapshot_timeout: Duration,
    /// Deadline of a call this node makes on behalf of a caller (join, forwarded
    /// proposal, remove); a join waits for the new learner to catch up within it.
    pub request_timeout: Duration,
    /// How often to retry a peer that could not be reached.
    pub unreachable_backoff: Duration,
    /// Build a snapshot after this many applied entries.
    pub snapshot_every: u64,
    /// Entries kept in the log behind the last snapshot (for followers slightly behind).
    pub max_in_snapshot_log_to_keep: u64,
    /// Joining nodes become voters until there are this many; learners after.
    pub max_voters: usize,
    /// How often this node reports its liveness and marks to the Raft leader.
    pub report_interval: Duration,
    /// How long a master lease lasts, from when its holder sent the report that
    /// earned it. Must be shorter than the failover timeout (docs/control.md,
    /// "Failover timing").
    pub master_lease: Duration,
    /// When the leader decides failovers, and whom it promotes.
    pub failover: FailoverSettings,
    /// Joining, take the place of a silent member registered under this node's store
    /// name ([`crate::replace`]; `hawser start --replace`).
    pub replace: bool,
}

impl ControlConfig {
    /// A configuration with hawser's defaults: 100 ms heartbeat, 300–600 ms election
    /// timeout (about one second from a leader's death to a new leader on a LAN).
    pub fn new(
        node_id: NodeId,
        store_name: Ident,
        host: impl Into<String>,
        grpc_addr: impl Into<String>,
        http_addr: impl Into<String>,
    ) -> Self {
        Self {
            node_id,
            tls: None,
            store_name,
            host: host.into(),
            grpc_addr: grpc_addr.into(),
            http_addr: http_addr.into(),
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(300),
            election_timeout_max: Duration::from_millis(600),
            install_snapshot_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            unreachable_backoff: Duration::from_millis(200),
            snapshot_every: 1000,
            max_in_snapshot_log_to_keep: 1000,
            max_voters: 5,
            report_interval: Duration::from_millis(100),
            master_lease: Duration::from_millis(500),
            failover: FailoverSettings {
                enabled: true,
                failover_timeout: Duration::from_millis(1000),
                candidate_fresh: Duration::from_millis(500),
                max_lag: None,
            },
            replace: false,
        }
    }

    /// How long a member must have been silent before a node joining with `replace`
    /// takes its place: the failover timeout, and never under ten reports' time.
    pub fn replace_after(&self) -> Duration {
        self.failover
            .failover_timeout
            .max(self.report_interval * 10)
    }

    /// The longest a leader may have gone without hearing from a quorum and still
    /// grant a lease: the minimum election timeout. Any lease it grants then ends
    /// before a successor elected without it can fail the master over, because the
    /// successor's takeover credit is computed from it
    /// ([`ControlConfig::takeover_credit`]; docs/control.md, "Failover timing"). A
    /// window close to the heartbeat would stop grants on a loaded machine while the
    /// quorum is fine.
    pub fn lease_quorum_age(&self) -> Duration {
        self.election_timeout_min
    }

    /// How much of the failover timeout a newly elected leader may count as already
    /// passed: it was elected at least `election_timeout_min` after its predecessor's
    /// last quorum acknowledgement Q, and every lease that predecessor granted ends by
    /// Q + [`ControlConfig::lease_quorum_age`] + the lease. Deciding at failover timeout
    /// minus this credit after taking over keeps one report interval of margin past
    /// that (docs/control.md, "Failover timing").
    pub fn takeover_credit(&self) -> Duration {
        (self.failover.failover_timeout + self.election_timeout_min)
            .saturating_sub(self.lease_quorum_age() + self.master_lease + self.report_interval)
            .min(self.failover.failover_timeout)
    }

    /// Explains a bad combination of settings.
    pub fn validate(&self) -> Result<(), PlaneError> {
        let bad = |m: String| Err(PlaneError::Config(m));
        if self.node_id.0 == 0 {
            return bad("node id 0 is reserved; use 1 or more".into());
        }
        if self.election_timeout_min <= self.heartbeat_interval {
            return bad(format!(
                "election timeout minimum {:?} must exceed the heartbeat interval {:?}",
                self.election_timeout_min, self.heartbeat_interval
            ));
        }
        if self.election_timeout_max <= self.election_timeout_min {
            return bad(format!(
                "election timeout maximum {:?} must exceed its minimum {:?}",
                self.election_timeout_max, self.election_timeout_min
            ));
        }
        if self.max_voters == 0 {
            return bad("max_voters must be at least 1".into());
        }
        if self.snapshot_every == 0 {
            return bad("snapshot_every must be at least 1".into());
        }
        if self.report_interval.is_zero() {
            return bad("the report interval must be at least 1ms".into());
        }
        if self.master_lease < self.report_interval * 2 {
            return bad(format!(
                "the master lease {:?} must be at least twice the report interval {:?}, or \
                 a master loses its lease between two reports",
                self.master_lease, self.report_interval
            ));
        }
        if self.failover.failover_timeout < self.master_lease + self.report_interval {
            return bad(format!(
                "the failover timeout {:?} must be at least the master lease {:?} plus the \
                 report interval {:?}: a master must have stopped taking writes before \
                 another is promoted",
                self.failover.failover_timeout, self.master_lease, self.report_interval
            ));
        }
        Ok(())
    }

    fn raft_config(&self) -> Result<Config, PlaneError> {
        let ms = |d: Duration| d.as_millis() as u64;
        let config = Config {
            cluster_name: "hawser".into(),
            heartbeat_interval: ms(self.heartbeat_interval),
            election_timeout_min: ms(self.election_timeout_min),
            election_timeout_max: ms(self.election_timeout_max),
            install_snapshot_timeout: ms(self.install_snapshot_timeout),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.max_in_snapshot_log_to_keep,
            // JSON encodes bytes several times larger; keep a chunk well under
            // MAX_MESSAGE_BYTES.
            snapshot_max_chunk_size: 1024 * 1024,
            ..Config::default()
        };
        config
            .validate()
            .map_err(|e| PlaneError::Config(e.to_string()))
    }

    fn node_info(&self) -> NodeInfo {
        NodeInfo {
            id: self.node_id,
            store: self.store_name.clone(),
            host: self.host.clone(),
            grpc_addr: self.grpc_addr.clone(),
            http_addr: self.http_addr.clone(),
            voter: false,
        }
    }
}

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

    fn from_peer(e: PeerError) -> Self {
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

    fn from_call(e: CallError) -> Self {
        if let Some(removal) = e.removal() {
            return PlaneError::Removed(removal);
        }
        PlaneError::Unavailable {
            leader_addr: None,
            reason: e.to_string(),
        }
    }
}

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

/// What one [`ControlPlane::failover_tick`] did.
#[derive(Debug, Clone, Default)]
pub struct FailoverTick {
    /// Whether this node leads (else it decided nothing).
    pub leader: bool,
    /// The failovers committed.
    pub committed: Vec<Command>,
    /// Silent masters that cannot be failed over now, with why.
    pub blocked: Vec<Blocked>,
}

/// Shared by the handle and the peer service.
pub(crate) struct Inner {
    pub(crate) cfg: ControlConfig,
    pub(crate) raft: Raft,
    pub(crate) sm: store::StateMachineStore,
    peers: PeerPool,
    /// On the leader: every node's last report ([`crate::health`]).
    health: HealthBook,
    /// Serializes membership changes on this node (when it leads).
    membership: tokio::sync::Mutex<()>,
    /// Whether this node was removed from the cluster ([`crate::removal`]).
    removal: Arc<RemovalBook>,
    /// The snapshot being received, as openraft holds it: its last chunk is checked
    /// before openraft installs it ([`crate::service::SnapshotMirror`]).
    pub(crate) snapshot: tokio::sync::Mutex<crate::service::SnapshotMirror>,
    /// Who may bootstrap a cluster through this node ([`crate::bootstrap`]).
    bootstrap: parking_lot::Mutex<BootstrapGate>,
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

/// One node's handle on the cluster's control plane.
#[derive(Clone)]
pub struct ControlPlane {
    inner: Arc<Inner>,
}

impl ControlPlane {
    /// Opens the Raft log and state machine in `engine` and starts Raft. Takes no
    /// socket: serve [`ControlPlane::raft_service`] on the node's gRPC server. A node
    /// restarted on the same engine resumes with its old identity and state.
    pub async fn start(cfg: ControlConfig, engine: Arc<dyn KvEngine>) -> Result<Self, PlaneError> {
        cfg.validate()?;
        let config = Arc::new(cfg.raft_config()?);
        let credit = cfg.takeover_credit();
        let (log, sm) =
            store::open(engine.clone()).map_err(|e| PlaneError::Storage(Box::new(e)))?;
        // Read before Raft starts: a node removed already must never campaign.
        let removal = Arc::new(
            RemovalBook::open(engine, cfg.node_id, &sm.state())
                .map_err(|e| PlaneError::Fatal(format!("cannot read the removal record: {e}")))?,
        );
        sm.watch_removal(removal.clone());
        let peers = PeerPool::new(
            cfg.election_timeout_min,
            cfg.node_id.0,
            sm.subscribe(),
            removal.clone(),
            cfg.tls.clone(),
        );
        let network = NetworkFactory::new(peers.clone(), cfg.unreachable_backoff);
        let raft = Raft::new(cfg.node_id.0, config, network, log, sm.clone())
            .await
            .map_err(|e| PlaneError::Fatal(e.to_string()))?;
        // The first election comes an election timeout after the start at the earliest,
        // long after this.
        removal.attach(raft.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                raft,
                sm,
                peers,
                health: HealthBook::new(credit),
                membership: tokio::sync::Mutex::new(()),
                removal,
                snapshot: Default::default(),
                bootstrap: Default::default(),
            }),
        })
    }

    /// The configuration this plane was started with.
    pub fn config(&self) -> &ControlConfig {
        &self.inner.cfg
    }

    /// The peers-only gRPC service to add to the node's server.
    pub fn raft_service(&self) -> RaftPeerServer<PeerService> {
        RaftPeerServer::new(PeerService {
            inner: self.inner.clone(),
        })
        .max_decoding_message_size(crate::network::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(crate::network::MAX_MESSAGE_BYTES)
    }

    /// Bootstraps a new cluster with this node as its only voter, then registers the
    /// node. On a cluster that exists already it only makes sure the node is
    /// registered: running it again is harmless.
    pub async fn initialize(&self) -> Result<(), PlaneError> {
        let raft = &self.inner.raft;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| PlaneError::Fatal(e.to_string()))?;
        if !initialized {
            let members = BTreeMap::from([(
                self.inner.cfg.node_id.0,
                BasicNode::new(&self.inner.cfg.grpc_addr),
            )]);
            match raft.initialize(members).await {
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(PlaneError::Fatal(e.to_string())),
            }
        }
        self.ensure_registered().await
    }

    /// Bootstraps a new cluster as [`ControlPlane::initialize`] does, but only when
    /// every one of `peers` (the node's `--join` list, which may name the node itself)
    /// answers that it belongs to no cluster and grants this node the bootstrap
    /// ([`crate::bootstrap`]): however often and wherever `hawser init` runs, one
    /// cluster comes of it. `Ok(false)` when this node was initialized already.
    pub async fn initialize_among(&self, peers: &[String]) -> Result<bool, InitError> {
        if self.is_initialized().await? {
            self.initialize().await?;
            return Ok(false);
        }
        let me = self.inner.cfg.node_id.0;
        self.inner
            .bootstrap
            .lock()
            .claim(me, std::time::Instant::now())
            .map_err(|holder| {
                InitError::Refused(BootstrapRefusal::Busy {
                    addr: self.inner.cfg.grpc_addr.clone(),
                    node: me,
                    holder,
                })
            })?;
        let outcome = self.bootstrap_among(me, peers).await;
        self.inner.bootstrap.lock().unclaim();
        outcome
    }

    async fn bootstrap_among(&self, me: u64, peers: &[String]) -> Result<bool, InitError> {
        // A peer's answer within a few seconds: an init is an operator's command.
        let deadline = Duration::from_secs(3);
        let mut answers = Vec::with_capacity(peers.len());
        for addr in peers {
            let intent = InitIntent {
                from: me,
                release: false,
            };
            let answer: Result<InitAnswer, String> = self
                .inner
                .peers
                .call(addr, Rpc::InitIntent, &intent, deadline)
                .await
                .map_err(|e| e.to_string());
            answers.push((addr.clone(), answer));
        }
        if let Err(refusal) = bootstrap::verdict(&answers) {
            tracing::warn!(%refusal, "init refused: this node does not bootstrap a cluster");
            // Best effort: a grant not given back ends with its lease.
            for (addr, answer) in &answers {
                if matches!(answer, Ok(InitAnswer::Granted { node }) if *node != me) {
                    let release = InitIntent {
                        from: me,
                        release: true,
                    };
                    let _: Result<InitAnswer, _> = self
                        .inner
                        .peers
                        .call(addr, Rpc::InitIntent, &release, deadline)
                        .await;
                }
            }
            return Err(InitError::Refused(refusal));
        }
        self.initialize().await?;
        Ok(true)
    }

    async fn is_initialized(&self) -> Result<bool, PlaneError> {
        self.inner
            .raft
            .is_initialized()
            .await
            .map_err(|e| PlaneError::Fatal(e.to_string()))
    }

    /// Proposes this node's registry entry unless the registry already has it as is.
    async fn ensure_registered(&self) -> Result<(), PlaneError> {
        let me = self.inner.cfg.node_info();
        let known = self.state().nodes.get(&me.id).cloned();
        if known.is_some_and(|n| NodeInfo { voter: false, ..n } == me) {
            return Ok(());
        }
        self.propose(Command::RegisterNode(me)).await.map(|_| ())
    }

    /// Asks the cluster to admit this node, through each of `members` (`host:port` of
    /// their gRPC servers) in turn until one answers. The node must already serve
    /// [`ControlPlane::raft_service`], since the leader starts replicating to it before
    /// this returns. A node that is a member already is re-registered (a restart).
    /// Callers retry a retryable error (no leader yet, members unreachable).
    pub async fn join(&self, members: &[String]) -> Result<JoinReply, PlaneError> {
        self.not_removed()?;
        let fresh = !self
            .inner
            .raft
            .is_initialized()
            .await
            .map_err(|e| PlaneError::Fatal(e.to_string()))?;
        let request = JoinRequest {
            node: self.inner.cfg.node_info(),
            fresh,
            replace: self.inner.cfg.replace,
        };
        let mut targets: Vec<String> = members.to_vec();
        let mut last = PlaneError::Unavailable {
            leader_addr: None,
            reason: "no member to ask".into(),
        };
        let mut i = 0;
        while i < targets.len() && i < members.len() + MAX_HOPS {
            let addr = targets[i].clone();
            i += 1;
            let reply: Result<Result<JoinReply, PeerError>, CallError> = self
                .inner
                .peers
                .call(
                    &addr,
                    Rpc::JoinCluster,
                    &request,
                    self.inner.cfg.request_timeout,
                )
                .await;
            match reply {
                Ok(Ok(joined)) => return Ok(joined),
                Ok(Err(PeerError::NotLeader {
                    addr: Some(leader), ..
                })) => {
                    if !targets.contains(&leader) {
                        targets.push(leader);
                    }
                    last = PlaneError::Unavailable {
                        leader_addr: targets.last().cloned(),
                        reason: format!("{addr} is not the leader"),
                    };
                }
                Ok(Err(e @ (PeerError::Rejected(_) | PeerError::LostState(_)))) => {
                    return Err(PlaneError::from_peer(e))
                }
                Ok(Err(e)) => last = PlaneError::from_peer(e),
                Err(e) => {
                    last = PlaneError::from_call(e);
                    if matches!(last, PlaneError::Removed(_)) {
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    }

    /// Whether this node was removed from the cluster, and how it learned it
    /// ([`crate::removal`]).
    pub fn removal(&self) -> Option<Removal> {
        self.inner.removal.get()
    }

    /// A watch of [`ControlPlane::removal`]; it changes once, when the node learns it.
    pub fn removal_watch(&self) -> watch::Receiver<Option<Removal>> {
        self.inner.removal.subscribe()
    }

    fn not_removed(&self) -> Result<(), PlaneError> {
        match self.removal() {
            Some(r) => Err(PlaneError::Removed(r)),
            None => Ok(()),
        }
    }

    /// Proposes `cmd`: validated against this node's state first, then committed
    /// through the Raft leader, wherever it is. Returns the cluster state version after
    /// the command; [`ControlPlane::wait_for_version`] waits until this node has
    /// applied it.
    pub async fn propose(&self, cmd: Command) -> Result<u64, PlaneError> {
        self.not_removed()?;
        state::validate(&self.state(), &cmd).map_err(PlaneError::Rejected)?;
        let mut target: Option<String> = None;
        let mut last_leader = None;
        for _ in 0..MAX_HOPS {
            let result = match &target {
                None => self.inner.propose_here(cmd.clone()).await,
                Some(addr) => match self
                    .inner
                    .peers
                    .call::<_, Result<Response, PeerError>>(
                        addr,
                        Rpc::ForwardPropose,
                        &cmd,
                        self.inner.cfg.request_timeout,
                    )
                    .await
                {
                    Ok(reply) => reply,
                    // The outcome is unknown: the leader may have committed it.
                    Err(e) => {
                        return Err(PlaneError::Unavailable {
                            leader_addr: Some(addr.clone()),
                            reason: e.to_string(),
                        })
                    }
                },
            };
            match result {
                Ok(Response::Applied { version }) => return Ok(version),
                Ok(Response::Rejected(e)) => return Err(PlaneError::Rejected(e)),
                Ok(Response::Empty) => {
                    return Err(PlaneError::Fatal("a command produced no response".into()))
                }
                Err(PeerError::NotLeader {
                    addr: Some(addr), ..
                }) => {
                    last_leader = Some(addr.clone());
                    target = Some(addr);
                }
                Err(PeerError::NotLeader { addr: None, .. }) => {
                    self.inner.wait_for_leader().await?;
                    target = None;
                }
                Err(e) => return Err(PlaneError::from_peer(e)),
            }
        }
        Err(PlaneError::Unavailable {
            leader_addr: last_leader,
            reason: "the leader could not be reached".into(),
        })
    }

    /// Takes node `id` out of the cluster, through the Raft leader wherever it is: one
    /// entry takes it out of the registry for good (and, with [`RemovalMode::Force`],
    /// its store out of every scheme), then the membership change takes it out of Raft.
    /// Refused while its store masters or propagates an element, and (unless `mode`
    /// says otherwise) while any scheme names it. Calling it again for a node whose
    /// membership change did not finish finishes it.
    pub async fn remove_node(
        &self,
        id: NodeId,
        mode: RemovalMode,
    ) -> Result<RemoveReply, PlaneError> {
        let state = self.state();
        if !state.removed.contains_key(&id) {
            let cmd = Command::RemoveNode {
                node: id,
                mode,
                at_unix_ms: 0,
            };
            state::validate(&state, &cmd).map_err(PlaneError::Rejected)?;
        }
        let request = RemoveRequest { node: id, mode };
        let mut target: Option<String> = None;
        for _ in 0..MAX_HOPS {
            let result = match &target {
                None => self.inner.handle_remove(request.clone()).await,
                Some(addr) => self
                    .inner
                    .peers
                    .call::<_, Result<RemoveReply, PeerError>>(
                        addr,
                        Rpc::RemoveNode,
                        &request,
                        self.inner.cfg.request_timeout,
                    )
                    .await
                    .map_err(PlaneError::from_call)?,
            };
            match result {
                Ok(reply) => return Ok(reply),
                Err(PeerError::NotLeader {
                    addr: Some(addr), ..
                }) => target = Some(addr),
                Err(PeerError::NotLeader { addr: None, .. }) => {
                    self.inner.wait_for_leader().await?;
                    target = None;
                }
                Err(e) => return Err(PlaneError::from_peer(e)),
            }
        }
        Err(PlaneError::Unavailable {
            leader_addr: target,
            reason: "the leader could not be reached".into(),
        })
    }

    /// The cluster state as this node has applied it.
    pub fn state(&self) -> Arc<ClusterState> {
        self.inner.sm.state()
    }

    /// A watch of the applied cluster state; it changes after every applied batch.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.inner.sm.subscribe()
    }

    /// Waits until this node has applied cluster state `version` (from
    /// [`ControlPlane::propose`]) or `timeout` passes; returns the state it saw.
    pub async fn wait_for_version(
        &self,
        version: u64,
        timeout: Duration,
    ) -> Result<Arc<ClusterState>, PlaneError> {
        let mut rx = self.subscribe();
        let wait = async {
            loop {
                let state = rx.borrow_and_update().clone();
                if state.version >= version {
                    return Ok(state);
                }
                if rx.changed().await.is_err() {
                    return Err(PlaneError::Fatal("the state machine stopped".into()));
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| {
                Err(PlaneError::Unavailable {
                    leader_addr: None,
                    reason: format!("state version {version} not applied within {timeout:?}"),
                })
            })
    }

    /// This node's Raft progress now.
    pub fn metrics(&self) -> ControlMetrics {
        summarize(&self.inner.raft.metrics().borrow())
    }

    /// openraft's own metrics channel (for waiting on conditions and for exporters).
    pub fn raft_metrics(&self) -> watch::Receiver<RaftMetrics> {
        self.inner.raft.metrics()
    }

    /// The Raft instance, for what this handle does not wrap (`ensure_linearizable`
    /// before granting a lease or deciding a failover, `wait()` in tests).
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Confirms with a quorum that this node still leads and that its state includes
    /// everything committed before the call. openraft 0.9 keeps an isolated leader
    /// believing it leads; call this before acting as leader (leases, failover).
    pub async fn ensure_leader(&self) -> Result<(), PlaneError> {
        match self.inner.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(e)) => Err(PlaneError::Unavailable {
                leader_addr: None,
                reason: e.to_string(),
            }),
            Err(RaftError::Fatal(e)) => Err(PlaneError::Fatal(e.to_string())),
        }
    }

    /// Sends this node's liveness report to the Raft leader (handled here when this
    /// node leads) and returns its answer, with a master lease or why there is none.
    pub async fn report(&self, health: HealthReport) -> Result<ReportReply, PlaneError> {
        self.not_removed()?;
        let (leader, addr) = {
            let m = self.inner.raft.metrics();
            let m = m.borrow();
            let Some(leader) = m.current_leader else {
                return Err(PlaneError::Unavailable {
                    leader_addr: None,
                    reason: "no Raft leader known".into(),
                });
            };
            let addr = m
                .membership_config
                .membership()
                .get_node(&leader)
                .map(|n| n.addr.clone());
            (leader, addr)
        };
        let report = Report {
            to: NodeId(leader),
            health,
        };
        if leader == self.inner.cfg.node_id.0 {
            return self
                .inner
                .handle_report(report)
                .map_err(PlaneError::from_peer);
        }
        let Some(addr) = addr else {
            return Err(PlaneError::Unavailable {
                leader_addr: None,
                reason: format!("the leader {leader} has no address in the membership"),
            });
        };
        // A report older than a lease is worth nothing: bound the call by the lease.
        let deadline = self.inner.cfg.master_lease;
        let reply: Result<ReportReply, PeerError> = self
            .inner
            .peers
            .call_to(&addr, Some(leader), Rpc::Report, &report, deadline)
            .await
            .map_err(PlaneError::from_call)?;
        reply.map_err(PlaneError::from_peer)
    }

    /// The leader's view of every node's liveness (`None` on a node that does not
    /// lead), with now on the same clock.
    pub fn health(&self) -> Option<(HealthView, std::time::Duration)> {
        let m = self.inner.raft.metrics().borrow().clone();
        (m.state == ServerState::Leader).then(|| {
            (
                self.inner.health.view(m.current_term),
                self.inner.health.now(),
            )
        })
    }

    /// On the Raft leader: decides which elements to fail over now
    /// ([`failover::decide`]) and commits each decision, after confirming leadership
    /// with a quorum. Does nothing on other nodes. The node calls it every report
    /// interval.
    pub async fn failover_tick(&self) -> Result<FailoverTick, PlaneError> {
        let m = self.inner.raft.metrics().borrow().clone();
        // A removed node still leading (it removed itself, and the membership change
        // is under way) decides nothing more.
        if m.state != ServerState::Leader || self.removal().is_some() {
            return Ok(FailoverTick::default());
        }
        let term = m.current_term;
        let state = self.state();
        let health = &self.inner.health;
        let plan = failover::decide(
            &state,
            &health.view(term),
            health.now(),
            &self.inner.cfg.failover,
        );
        let mut tick = FailoverTick {
            leader: true,
            blocked: plan.blocked,
            committed: Vec::new(),
        };
        for cmd in plan.commands {
            let Command::SetMaster {
                scheme,
                element,
                node,
                epoch,
                fork_point,
            } = &cmd
            else {
                continue;
            };
            let deposed = state.master_of(scheme, element).and_then(|m| m.node);
            if let Some(d) = deposed {
                health.fence(
                    term,
                    d,
                    scheme.clone(),
                    element.clone(),
                    Epoch(epoch.0.saturating_sub(1)),
                );
            }
            // Only a leader that a quorum confirms now decides a failover: openraft 0.9
            // keeps an isolated leader believing it leads.
            if let Err(e) = self.ensure_leader().await {
                if let Some(d) = deposed {
                    health.unfence(d, scheme, element);
                }
                return Err(e);
            }
            match self.inner.propose_here(cmd.clone()).await {
                Ok(Response::Applied { .. }) => {
                    tracing::warn!(
                        %scheme, %element, new_master = %node, epoch = epoch.0,
                        deposed = ?deposed, fork_point = ?fork_point,
                        "failover committed: the master was silent past the failover timeout"
                    );
                    metrics::counter!("hawser_failovers_total").increment(1);
                    tick.committed.push(cmd.clone());
                }
                Ok(Response::Rejected(e)) => {
                    if let Some(d) = deposed {
                        health.unfence(d, scheme, element);
                    }
                    tracing::warn!(%scheme, %element, error = %e, "failover refused");
                }
                Ok(Response::Empty) => {}
                // The outcome is unknown: the fence stays until the state shows the
                // element moved on or leadership changes.
                Err(e) => return Err(PlaneError::from_peer(e)),
            }
        }
        Ok(tick)
    }

    /// Stops Raft. The peer service answers with errors afterwards; the node stops its
    /// gRPC server itself.
    pub async fn shutdown(&self) -> Result<(), PlaneError> {
        self.inner
            .raft
            .shutdown()
            .await
            .map_err(|e| PlaneError::Fatal(e.to_string()))
    }
}

fn summarize(m: &RaftMetrics) -> ControlMetrics {
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

impl Inner {
    /// Commits `cmd` if this node leads; otherwise says who does. An ALTER REPLICATION
    /// that moves a master role is committed as a planned switchover
    /// ([`Inner::switch_over`]).
    pub(crate) async fn propose_here(&self, cmd: Command) -> Result<Response, PeerError> {
        if let Command::AlterScheme { alter } = &cmd {
            if self.is_leader() {
                let moves = failover::master_moves(&self.sm.state(), alter);
                if !moves.is_empty() {
                    return self.switch_over(cmd.clone(), moves).await;
                }
            }
        }
        self.commit_here(cmd).await
    }

    async fn commit_here(&self, cmd: Command) -> Result<Response, PeerError> {
        self.raft
            .client_write(cmd)
            .await
            .map(|r| r.data)
            .map_err(write_error)
    }

    /// A planned move of master roles (`ALTER ... SET MASTER`), on the leader: no more
    /// leases for the old masters; wait until the last lease each was granted has run
    /// out (its writes stopped) and each new master has reported holding every commit
    /// its old master reported after that; then commit. Writes to the elements pause
    /// for about a lease. Nothing acknowledged is lost and two masters never take
    /// writes at once (docs/control.md, "Planned switchover").
    async fn switch_over(
        &self,
        cmd: Command,
        moves: Vec<failover::MasterMove>,
    ) -> Result<Response, PeerError> {
        let started = std::time::Instant::now();
        let term = self.raft.metrics().borrow().current_term;
        let state = self.sm.state();
        for m in &moves {
            let epoch = state
                .schemes
                .get(&m.scheme)
                .and_then(|s| s.elements.get(&m.element))
                .map_or(Epoch(0), |e| e.epoch);
            self.health
                .fence(term, m.from, m.scheme.clone(), m.element.clone(), epoch);
        }
        let unfence = || {
            for m in &moves {
                self.health.unfence(m.from, &m.scheme, &m.element);
            }
        };
        // The last grant to an old master was made when its last report before the
        // fence arrived: its lease ends a lease after that at the latest.
        let fenced_at = self.health.now();
        let margin = self.cfg.report_interval;
        // Well within the deadline of a forwarded proposal, so its caller hears why.
        let limit = self.cfg.request_timeout / 2;
        let deadline = started + limit;
        let wait_tick = self.cfg.report_interval / 2;
        loop {
            let view = self.health.view(term);
            let now = self.health.now();
            // An old master told to drain gives its lease up once its commits under
            // way are acknowledged, and says so in a report sent after that.
            let released = |node: NodeId| {
                view.nodes
                    .get(&node)
                    .is_some_and(|n| n.last_report >= fenced_at && n.report.lease_released)
            };
            let leases_over = now >= fenced_at + self.cfg.master_lease + margin
                || moves.iter().all(|m| released(m.from));
            // What each old master reported committing after its lease ran out is
            // final; its new master must hold it.
            let behind: Vec<String> = moves
                .iter()
                .filter_map(|m| {
                    // A silent old master is not waited for (it takes no writes once
                    // its lease is over): what it committed past the new master's
                    // high-water is past the fork point, as in a failover.
                    if view.silence(m.from, now) > self.cfg.failover.failover_timeout {
                        return None;
                    }
                    let old = view.nodes.get(&m.from)?;
                    let last = old.report.own_seq;
                    let to = m.to?;
                    let has = view
                        .nodes
                        .get(&to)
                        .map_or(0, |n| n.report.high_water_of(m.from));
                    let final_report =
                        old.last_report >= fenced_at + self.cfg.master_lease || released(m.from);
                    (has < last || !final_report)
                        .then(|| format!("node {to} holds seq {has} of node {}'s {last}", m.from))
                })
                .collect();
            if leases_over && behind.is_empty() {
                break;
            }
            if std::time::Instant::now() >= deadline {
                unfence();
                let why = if leases_over {
                    format!("the new master has not caught up: {}", behind.join("; "))
                } else {
                    "the old master's lease did not run out in time".into()
                };
                return Err(PeerError::Retry(format!(
                    "switchover not committed within {limit:?}: {why}; the old master \
                     takes writes again; retry"
                )));
            }
            tokio::time::sleep(wait_tick).await;
        }
        // From silent old masters the switchover is a failover by hand: it records the
        // fork point, so what they committed past it is set aside when they return.
        let cmds = match &cmd {
            Command::AlterScheme { alter } => {
                let view = self.health.view(term);
                let now = self.health.now();
                let silent_for = self.cfg.failover.failover_timeout;
                failover::switchover_commands(&self.sm.state(), alter, &moves, |m| {
                    (view.silence(m.from, now) > silent_for).then(|| {
                        m.to.and_then(|to| view.nodes.get(&to))
                            .map_or(0, |n| n.report.high_water_of(m.from))
                    })
                })
            }
            _ => vec![cmd],
        };
        let applied = |r: &Result<Response, PeerError>| matches!(r, Ok(Response::Applied { .. }));
        let mut cmds = cmds.into_iter();
        let first = cmds
            .next()
            .expect("a switchover commits at least one command");
        let mut result = self.commit_here(first).await;
        for cmd in cmds {
            if !applied(&result) {
                break;
            }
            result = self.commit_here(cmd).await;
        }
        if !applied(&result) {
            unfence();
        }
        let paused = started.elapsed();
        metrics::histogram!("hawser_switchover_pause_seconds").record(paused.as_secs_f64());
        tracing::info!(
            moves = ?moves, paused_ms = paused.as_millis() as u64,
            "switchover: the old masters' writes paused, the new ones caught up, committed"
        );
        result
    }

    async fn wait_for_leader(&self) -> Result<(), PlaneError> {
        // Twice the longest election timeout covers one failed election round.
        let timeout = self.cfg.election_timeout_max * 2;
        self.raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await
            .map(|_| ())
            .map_err(|e| PlaneError::Unavailable {
                leader_addr: None,
                reason: e.to_string(),
            })
    }

    fn leader_hint(&self) -> PeerError {
        let m = self.raft.metrics().borrow().clone();
        let addr = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| n.addr.clone())
        });
        PeerError::NotLeader {
            leader: m.current_leader,
            addr,
        }
    }

    fn is_leader(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        m.state == ServerState::Leader
    }

    /// A member's answer to JoinCluster: the leader admits the node, another member
    /// forwards the request to the leader.
    pub(crate) async fn handle_join(&self, join: JoinRequest) -> Result<JoinReply, PeerError> {
        if !self.is_leader() {
            let PeerError::NotLeader {
                addr: Some(addr), ..
            } = self.leader_hint()
            else {
                return Err(self.leader_hint());
            };
            if addr == self.cfg.grpc_addr {
                return Err(self.leader_hint());
            }
            return self
                .peers
                .call::<_, Result<JoinReply, PeerError>>(
                    &addr,
                    Rpc::JoinCluster,
                    &join,
                    self.cfg.request_timeout,
                )
                .await
                .unwrap_or_else(|e| Err(PeerError::Failed(e.to_string())));
        }
        let _one_at_a_time = self.membership.lock().await;
        let id = join.node.id.0;
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let is_member = membership.membership().get_node(&id).is_some();
        if join.fresh && is_member {
            return Err(PeerError::LostState(id));
        }
        if join.replace {
            self.replace_for(&join.node).await?;
        }
        let state = self.sm.state();
        let cmd = Command::RegisterNode(join.node.clone());
        state::validate(&state, &cmd).map_err(PeerError::Rejected)?;
        match self.propose_here(cmd).await? {
            Response::Rejected(e) => return Err(PeerError::Rejected(e)),
            Response::Applied { .. } | Response::Empty => {}
        }
        let deadline = self.cfg.request_timeout;
        if !is_member {
            // Blocks until the learner has caught up closely; bounded, since an
            // unreachable learner would block it for ever.
            tokio::time::timeout(
                deadline,
                self.raft
                    .add_learner(id, BasicNode::new(&join.node.grpc_addr), true),
            )
            .await
            .map_err(|_| {
                PeerError::Failed(format!("node {id} did not catch up within {deadline:?}"))
            })?
            .map_err(write_error)?;
        }
        let voters: BTreeSet<u64> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        let voter = if voters.contains(&id) {
            true
        } else if voters.len() < self.cfg.max_voters {
            tokio::time::timeout(
                deadline,
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true),
            )
            .await
            .map_err(|_| {
                PeerError::Failed(format!(
                    "promoting node {id} did not commit within {deadline:?}"
                ))
            })?
            .map_err(write_error)?;
            true
        } else {
            false
        };
        tracing::info!(node = id, voter, "node joined the cluster");
        Ok(JoinReply {
            leader: self.cfg.node_id,
            voter,
        })
    }

    /// A node's liveness report, on the leader: recorded on the leader's clock and
    /// answered with a master lease when the leader may grant one.
    /// A peer's InitIntent ([`crate::bootstrap`]): this node's gate answers it, a member
    /// of a cluster always with `Member`.
    pub(crate) async fn handle_init_intent(&self, intent: InitIntent) -> InitAnswer {
        let me = self.cfg.node_id.0;
        if intent.release {
            self.bootstrap.lock().release(intent.from);
            return InitAnswer::Granted { node: me };
        }
        // An error reading Raft's state answers as a member would: no bootstrap on a
        // node that cannot say it has no cluster.
        let member = match self.raft.is_initialized().await {
            Ok(false) => None,
            Ok(true) | Err(_) => {
                let m = self.raft.metrics().borrow().clone();
                let leader = m.current_leader.and_then(|id| {
                    m.membership_config
                        .membership()
                        .get_node(&id)
                        .map(|n| n.addr.clone())
                });
                Some(leader.unwrap_or_default())
            }
        };
        let answer = self
            .bootstrap
            .lock()
            .ask(me, intent.from, member, std::time::Instant::now());
        if let InitAnswer::Granted { .. } = answer {
            if intent.from != me {
                tracing::info!(
                    node = intent.from,
                    "a peer bootstraps a cluster: this node will not for {} s",
                    bootstrap::BOOTSTRAP_LEASE.as_secs()
                );
            }
        }
        answer
    }

    pub(crate) fn handle_report(&self, report: Report) -> Result<ReportReply, PeerError> {
        let m = self.raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            return Err(self.leader_hint());
        }
        if report.to != self.cfg.node_id {
            return Err(PeerError::Misaddressed {
                meant: report.to.0,
                here: self.cfg.node_id.0,
            });
        }
        let node = report.health.node;
        let stamp = self
            .health
            .record(self.cfg.node_id, m.current_term, report.health);
        let state = self.sm.state();
        let lease = self.grant(&m, node, &state);
        let draining = lease.is_err() && self.health.is_fenced(m.current_term, node, &state);
        Ok(ReportReply {
            leader: self.cfg.node_id,
            term: m.current_term,
            lease,
            draining,
            stamp: Some(stamp),
        })
    }

    /// A master lease for `node`, or why the leader grants none now: while a quorum
    /// acknowledged this leader lately, or no other node can become leader without its
    /// vote ([`irreplaceable`]).
    fn grant(
        &self,
        m: &crate::types::RaftMetrics,
        node: NodeId,
        state: &ClusterState,
    ) -> Result<LeaseGrant, String> {
        if !state.nodes.contains_key(&node) {
            return Err(format!("node {node} is not registered in the cluster"));
        }
        let limit = self.cfg.lease_quorum_age();
        let configs = m.membership_config.membership().get_joint_config();
        match m.millis_since_quorum_ack {
            Some(ms) if u128::from(ms) <= limit.as_millis() => {}
            _ if irreplaceable(self.cfg.node_id.0, configs) => {}
            other => {
                return Err(format!(
                    "the Raft leader has not heard from a quorum within {limit:?} (last: \
                     {}); no master lease is granted without one",
                    other.map_or("never".into(), |ms| format!("{ms} ms ago"))
                ))
            }
        }
        if self.health.is_fenced(m.current_term, node, state) {
            return Err(format!(
                "a failover of an element node {node} masters is being committed"
            ));
        }
        Ok(LeaseGrant {
            millis: self.cfg.master_lease.as_millis() as u64,
            state_version: state.version,
        })
    }

    /// Takes a node out of the registry and then the membership (on the leader), and
    /// promotes a learner if that leaves fewer voters than wanted; then tells the node
    /// (best effort). The registry goes first, in one entry with whatever a forced
    /// removal does to the schemes, so that the check against the schemes and the
    /// change are atomic, and so that a removed node that is up applies its own removal
    /// while still a member: the surest way for it to learn, as openraft tells a
    /// removed voter nothing. A node found removed already (a removal whose membership
    /// change did not finish: the leader changed, a timeout) only has the membership
    /// change finished.
    pub(crate) async fn handle_remove(
        &self,
        request: RemoveRequest,
    ) -> Result<RemoveReply, PeerError> {
        if !self.is_leader() {
            return Err(self.leader_hint());
        }
        let _one_at_a_time = self.membership.lock().await;
        self.remove_member(request).await
    }

    /// On the leader, with the membership lock held: removes the member that holds
    /// `joining`'s store name when [`replace::decide`] says so, or says what to wait for.
    async fn replace_for(&self, joining: &NodeInfo) -> Result<(), PeerError> {
        let term = self.raft.metrics().borrow().current_term;
        let decision = replace::decide(
            &self.sm.state(),
            joining,
            &self.health.view(term),
            self.health.now(),
            self.health.led_since(term),
            self.cfg.replace_after(),
        );
        match decision {
            replace::Replace::Nothing => Ok(()),
            replace::Replace::Wait(why) => Err(PeerError::Retry(why)),
            replace::Replace::Remove(old) => {
                tracing::warn!(
                    old = %old,
                    new = %joining.id,
                    store = %joining.store,
                    "a joining node takes the place of the silent member holding its store \
                     name (--replace): removing the old one, its store kept in the schemes"
                );
                self.remove_member(RemoveRequest {
                    node: old,
                    mode: RemovalMode::KeepInSchemes,
                })
                .await
                .map(drop)
            }
        }
    }

    /// Removes a member (the leader, membership lock held): registry, then Raft.
    async fn remove_member(&self, request: RemoveRequest) -> Result<RemoveReply, PeerError> {
        let id = request.node;
        let state = self.sm.state();
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let mut addr = membership
            .membership()
            .get_node(&id.0)
            .map(|n| n.addr.clone());
        let mut reply = RemoveReply::default();
        if !state.removed.contains_key(&id) {
            let cmd = Command::RemoveNode {
                node: id,
                mode: request.mode,
                at_unix_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            };
            state::validate(&state, &cmd).map_err(PeerError::Rejected)?;
            if let Some(node) = state.nodes.get(&id) {
                addr = addr.or_else(|| Some(node.grpc_addr.clone()));
                if request.mode == RemovalMode::Force {
                    reply.schemes_changed = state::store_roles(&state, &node.store);
                }
            }
            match self.propose_here(cmd).await? {
                Response::Rejected(e) => return Err(PeerError::Rejected(e)),
                Response::Applied { .. } | Response::Empty => {}
            }
        }
        let voters: BTreeSet<u64> = membership.membership().voter_ids().collect();
        let learners: Vec<u64> = membership.membership().learner_ids().collect();
        let change = if voters.contains(&id.0) {
            // Not kept as a learner: out of the membership in one joint change.
            Some(ChangeMembers::RemoveVoters(BTreeSet::from([id.0])))
        } else if membership.membership().get_node(&id.0).is_some() {
            Some(ChangeMembers::RemoveNodes(BTreeSet::from([id.0])))
        } else {
            None
        };
        let deadline = self.cfg.request_timeout;
        if let Some(change) = change {
            tokio::time::timeout(deadline, self.raft.change_membership(change, false))
                .await
                .map_err(|_| {
                    PeerError::Failed(format!(
                        "node {id} is out of the registry, but taking it out of the Raft \
                         membership did not commit within {deadline:?}; run the removal \
                         again to finish it"
                    ))
                })?
                .map_err(write_error)?;
        }
        let remaining = voters.len() - usize::from(voters.contains(&id.0));
        if remaining < self.cfg.max_voters && self.is_leader() {
            if let Some(&learner) = learners.iter().find(|&&l| l != id.0) {
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([learner])), true)
                    .await
                    .map_err(write_error)?;
            }
        }
        tracing::info!(node = %id, mode = ?request.mode, "node removed from the cluster");
        if let (Some(addr), true) = (addr, id != self.cfg.node_id) {
            self.tell_removed(id, &addr).await;
        }
        Ok(reply)
    }

    /// Tells node `id` at `addr` that it was removed, once: best effort (it may be down;
    /// it then learns when it next calls a member), bounded by a short deadline.
    async fn tell_removed(&self, id: NodeId, addr: &str) {
        let Some(mut removal) = Removal::from_state(&self.sm.state(), id) else {
            return;
        };
        removal.learned = Learned::Told {
            by: self.cfg.node_id,
        };
        let deadline = self.cfg.request_timeout.min(Duration::from_secs(1));
        let told: Result<Result<(), PeerError>, CallError> = self
            .peers
            .call_to(addr, Some(id.0), Rpc::NotifyRemoved, &removal, deadline)
            .await;
        match told {
            Ok(Ok(())) => tracing::debug!(node = %id, "told the node it was removed"),
            Ok(Err(e)) => tracing::debug!(node = %id, error = %e, "the node did not take the news"),
            Err(e) => {
                tracing::debug!(node = %id, error = %e, "could not tell the node it was removed")
            }
        }
    }

    /// The leader's word that this node was removed: recorded when it names this node
    /// and comes, from the node it says it comes from (`from`, the call's metadata), a
    /// member of the committed membership (the leader that removed it is one).
    pub(crate) async fn handle_notify_removed(
        &self,
        from: Option<u64>,
        removal: Removal,
    ) -> Result<(), PeerError> {
        let by = match removal.learned {
            Learned::Told { by } if from == Some(by.0) => by,
            _ => {
                return Err(PeerError::Failed(
                    "a removal notice must come from the node it names as its teller".into(),
                ))
            }
        };
        if removal.node != self.cfg.node_id {
            return Err(PeerError::Misaddressed {
                meant: removal.node.0,
                here: self.cfg.node_id.0,
            });
        }
        if !self.sm.members().contains(&by.0) {
            return Err(PeerError::Failed(format!(
                "node {by} is not a member this node knows; a removal notice is taken from \
                 the leader only"
            )));
        }
        self.removal.record(removal).await;
        Ok(())
    }
}

/// Maps openraft's write errors: "forward to leader" becomes [`PeerError::NotLeader`].
fn write_error(e: RaftError<RaftNodeId, ClientWriteError<RaftNodeId, BasicNode>>) -> PeerError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => PeerError::NotLeader {
            leader: f.leader_id,
            addr: f.leader_node.map(|n| n.addr),
        },
        other => PeerError::Failed(other.to_string()),
    }
}

/// Whether no node other than `me` can become Raft leader without `me`'s vote: in
/// every voter set of the membership (two during a joint change), `me` is one of at
/// most two. A leader that has not heard from a quorum lately then still cannot have
/// been replaced — a candidate needs its vote, and it steps down before it gives one —
/// so the leases it grants stay safe, and a two-voter cluster keeps writing on the
/// leader's side while the other voter is down (no failover can commit then either).
/// A successor elected with its vote takes over no earlier than the step-down, so every
/// such lease ends within a lease of the takeover, within the takeover credit's margin
/// (docs/control.md, "Failover timing").
fn irreplaceable(me: u64, configs: &[BTreeSet<u64>]) -> bool {
    !configs.is_empty() && configs.iter().all(|c| c.contains(&me) && c.len() <= 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_leader_whose_vote_every_successor_needs_is_irreplaceable() {
        let set = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>();
        assert!(irreplaceable(1, &[set(&[1])]));
        assert!(irreplaceable(1, &[set(&[1, 2])]));
        // Three voters: the other two elect a leader without it.
        assert!(!irreplaceable(1, &[set(&[1, 2, 3])]));
        // Not a voter of a set: that set elects without it.
        assert!(!irreplaceable(1, &[set(&[2, 3])]));
        // A joint change needs a majority of each set.
        assert!(irreplaceable(1, &[set(&[1, 2]), set(&[1])]));
        assert!(!irreplaceable(1, &[set(&[1, 2]), set(&[1, 2, 3])]));
        assert!(!irreplaceable(1, &[]));
    }
}
