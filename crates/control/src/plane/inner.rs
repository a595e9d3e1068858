//! [`Inner`], the state the handle shares with the peer service, and how it commits:
//! on the leader only, with an ALTER REPLICATION that moves a master role committed as
//! a planned switchover.

use std::sync::Arc;

use hawser_core::{Epoch, NodeId};
use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;

use super::{ControlConfig, PlaneError};
use crate::bootstrap::BootstrapGate;
use crate::failover;
use crate::health::HealthBook;
use crate::network::{PeerError, PeerPool};
use crate::removal::RemovalBook;
use crate::state::{Command, Response};
use crate::store;
use crate::types::{BasicNode, Raft, RaftNodeId};

/// Shared by the handle and the peer service.
pub(crate) struct Inner {
    pub(crate) cfg: ControlConfig,
    pub(crate) raft: Raft,
    pub(crate) sm: store::StateMachineStore,
    pub(super) peers: PeerPool,
    /// On the leader: every node's last report ([`crate::health`]).
    pub(super) health: HealthBook,
    /// Serializes membership changes on this node (when it leads).
    pub(super) membership: tokio::sync::Mutex<()>,
    /// Whether this node was removed from the cluster ([`crate::removal`]).
    pub(super) removal: Arc<RemovalBook>,
    /// The snapshot being received, as openraft holds it: its last chunk is checked
    /// before openraft installs it ([`crate::service::SnapshotMirror`]).
    pub(crate) snapshot: tokio::sync::Mutex<crate::service::SnapshotMirror>,
    /// Who may bootstrap a cluster through this node ([`crate::bootstrap`]).
    pub(super) bootstrap: parking_lot::Mutex<BootstrapGate>,
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

    pub(super) async fn wait_for_leader(&self) -> Result<(), PlaneError> {
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

    pub(super) fn leader_hint(&self) -> PeerError {
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

    pub(super) fn is_leader(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        m.state == ServerState::Leader
    }
}

/// Maps openraft's write errors: "forward to leader" becomes [`PeerError::NotLeader`].
pub(super) fn write_error(
    e: RaftError<RaftNodeId, ClientWriteError<RaftNodeId, BasicNode>>,
) -> PeerError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => PeerError::NotLeader {
            leader: f.leader_id,
            addr: f.leader_node.map(|n| n.addr),
        },
        other => PeerError::Failed(other.to_string()),
    }
}
