//! The leader's (or any member's) answers to peers' requests: JoinCluster,
//! InitIntent, a liveness report with its master lease, RemoveNode and NotifyRemoved.

use std::collections::BTreeSet;
use std::time::Duration;

use hawser_core::NodeId;
use openraft::{ChangeMembers, ServerState};

use super::inner::write_error;
use super::{Inner, JoinReply, JoinRequest, RemoveReply, RemoveRequest};
use crate::bootstrap::{self, InitAnswer, InitIntent};
use crate::health::{LeaseGrant, Report, ReportReply};
use crate::network::{CallError, PeerError, Rpc};
use crate::removal::{Learned, Removal};
use crate::replace;
use crate::state::{self, ClusterState, Command, NodeInfo, RemovalMode, Response};
use crate::types::BasicNode;

impl Inner {
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
