//! [`ControlPlane`], one node's handle on the cluster's control plane: start and
//! bootstrap, join, proposals and removals through the leader, the applied state,
//! metrics, liveness reports and failover decisions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hawser_core::{Epoch, NodeId};
use hawser_store::KvEngine;
use openraft::error::{InitializeError, RaftError};
use openraft::ServerState;
use tokio::sync::watch;

use super::messages::summarize;
use super::{
    ControlConfig, ControlMetrics, FailoverTick, InitError, Inner, JoinReply, JoinRequest,
    PlaneError, RemoveReply, RemoveRequest, MAX_HOPS,
};
use crate::bootstrap::{self, BootstrapRefusal, InitAnswer, InitIntent};
use crate::failover::{self, HealthReport, HealthView};
use crate::health::{HealthBook, Report, ReportReply};
use crate::network::{CallError, NetworkFactory, PeerError, PeerPool, Rpc};
use crate::pb::raft_peer_server::RaftPeerServer;
use crate::removal::{Removal, RemovalBook};
use crate::service::PeerService;
use crate::state::{self, ClusterState, Command, NodeInfo, RemovalMode, Response};
use crate::store;
use crate::types::{BasicNode, Raft, RaftMetrics};

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
