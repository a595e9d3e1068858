//! The restart fence: writes paused after a machine restart until every receiver this
//! node ships commits to before their sync has answered, and none holds more of this
//! node's commits than it has.

use std::collections::BTreeMap;

use hawser_control::ClusterState;
use hawser_core::{Ident, NodeId, QualName};
use tracing::{info, warn};

use super::running::Running;
use super::DataPlaneTask;

/// Why writes are paused after a machine restart until [`fence_check`] lifts it.
pub(crate) const RESTART_FENCE: &str = "the machine restarted since this node last took \
     writes, and commits it shipped before their sync may have been lost with it: waiting \
     for its return-service subscribers to report what they hold of this node's commits";

/// What the restart fence ([`RESTART_FENCE`]) should do now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Fence {
    /// Not every receiver that may hold commits shipped before their sync has
    /// answered a Hello since this node started: these have not.
    Wait(Vec<Ident>),
    /// Every one has, and none holds more of this node's commits than it has.
    Lift,
    /// A receiver holds commits of this node's that it lost: writes stay paused.
    Diverged {
        receiver: Ident,
        holds: u64,
        ours: u64,
    },
}

/// Checks the receivers this node ships commits to before their sync (`senders`:
/// each with its status) against `ours`, this node's last own seq. `pending` says
/// which receivers' senders have not yet admitted them after the restart
/// ([`hawser_store::Database::restart_check_pending`]): one of those is waited for even
/// if it was heard, since its acknowledged marks are only published once the check
/// passes (until then they read as empty: holding nothing).
pub(super) fn fence_check(
    own: NodeId,
    ours: u64,
    senders: &[(Ident, hawser_stream::SenderStatus)],
    pending: impl Fn(&Ident) -> bool,
) -> Fence {
    let mut waiting = Vec::new();
    for (receiver, status) in senders {
        if let hawser_stream::SenderState::Diverged { holds, .. } = status.state {
            // Its sender found it holding more than the restart point (its marks were
            // not taken as acknowledgements).
            return Fence::Diverged {
                receiver: receiver.clone(),
                holds,
                ours,
            };
        }
        if status.last_contact.is_none() || pending(receiver) {
            waiting.push(receiver.clone());
            continue;
        }
        let holds = status.acked_durable.get(&own).copied().unwrap_or(0);
        if holds > ours {
            return Fence::Diverged {
                receiver: receiver.clone(),
                holds,
                ours,
            };
        }
    }
    if waiting.is_empty() {
        Fence::Lift
    } else {
        Fence::Wait(waiting)
    }
}

/// Lifts the restart fence once [`fence_check`] allows it, or says why it stays.
pub(super) fn check_restart_fence(
    task: &DataPlaneTask,
    state: &ClusterState,
    running: &BTreeMap<(QualName, Ident), Running>,
) {
    let Some(reason) = task.db.writes_paused() else {
        return;
    };
    if !reason.starts_with(RESTART_FENCE) || state.node_by_store(&task.store).is_none() {
        // Not this fence, or the cluster state does not know this node yet (so the
        // links it plans are not yet the ones it had).
        return;
    }
    let statuses: Vec<_> = running
        .iter()
        .filter(|(_, r)| r.handle.ships_written())
        .map(|((_, receiver), r)| (receiver.clone(), r.handle.status().borrow().clone()))
        .collect();
    let own = task.db.node_id();
    let ours = match task.db.high_water(own) {
        Ok(seq) => seq,
        Err(e) => {
            warn!(error = %e, "cannot read this node's high-water");
            return;
        }
    };
    let pending = |receiver: &Ident| task.db.restart_check_pending(receiver.as_str());
    match fence_check(own, ours, &statuses, pending) {
        Fence::Lift => {
            info!(
                receivers = statuses.len(),
                "no subscriber holds commits this node lost in the machine restart: taking writes"
            );
            // Recorded, so that a restart of the process does not fence again; if that
            // fails, it only would.
            if let Err(e) = task.db.lift_restart_fence() {
                warn!(error = %e, "cannot record that the restart fence lifted");
            }
            task.db.pause_writes(None);
        }
        Fence::Wait(_) => {}
        Fence::Diverged {
            receiver,
            holds,
            ours,
        } => {
            let why = format!(
                "{RESTART_FENCE}: subscriber {receiver} holds this node's commits through seq \
                 {holds}, this node only through {ours} (the rest were lost with the \
                 machine); nothing more is sent to {receiver} until it is rebuilt from this \
                 node, and to take writes before that, set its receiver to STOP (hawser \
                 receiver --subscriber {receiver} --state stop)"
            );
            if why != reason {
                warn!("{why}");
                task.db.pause_writes(Some(why));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fence_check, Fence};
    use hawser_core::{Ident, NodeId};
    use hawser_stream::SenderStatus;

    #[test]
    fn the_restart_fence_lifts_once_every_receiver_answered_and_none_holds_more() {
        let me = NodeId(1);
        let heard = |holds: Option<u64>| SenderStatus {
            last_contact: Some(std::time::Instant::now()),
            acked_durable: holds.map(|s| [(me, s)].into()).unwrap_or_default(),
            ..SenderStatus::default()
        };
        let ds2 = Ident::unquoted("ds2");
        let ds3 = Ident::unquoted("ds3");
        // Nobody to ask: nothing of this node's can be elsewhere.
        let none_pending = |_: &Ident| false;
        assert_eq!(fence_check(me, 10, &[], none_pending), Fence::Lift);
        // One has not answered since the start.
        assert_eq!(
            fence_check(
                me,
                10,
                &[
                    (ds2.clone(), heard(Some(10))),
                    (ds3.clone(), SenderStatus::default())
                ],
                none_pending
            ),
            Fence::Wait(vec![ds3.clone()])
        );
        // Heard, but its sender has not admitted it yet: its marks are not published,
        // so holding nothing proves nothing (the check may yet find it diverged).
        assert_eq!(
            fence_check(
                me,
                10,
                &[(ds2.clone(), heard(Some(9))), (ds3.clone(), heard(None))],
                |r: &Ident| *r == ds3
            ),
            Fence::Wait(vec![ds3.clone()])
        );
        // Both answered with no more than this node has (or nothing of it).
        assert_eq!(
            fence_check(
                me,
                10,
                &[(ds2.clone(), heard(Some(9))), (ds3.clone(), heard(None))],
                none_pending
            ),
            Fence::Lift
        );
        // One holds commits this node lost: that wins over anyone still silent.
        assert_eq!(
            fence_check(
                me,
                10,
                &[
                    (ds2.clone(), SenderStatus::default()),
                    (ds3.clone(), heard(Some(12)))
                ],
                none_pending
            ),
            Fence::Diverged {
                receiver: ds3.clone(),
                holds: 12,
                ours: 10
            }
        );
        // Its sender refused it (its marks were not published): the state says so.
        let refused = SenderStatus {
            state: hawser_stream::SenderState::Diverged {
                reason: "lost".into(),
                holds: 3,
            },
            last_contact: Some(std::time::Instant::now()),
            ..SenderStatus::default()
        };
        assert_eq!(
            fence_check(
                me,
                2,
                &[(ds2.clone(), heard(Some(2))), (ds3.clone(), refused)],
                none_pending
            ),
            Fence::Diverged {
                receiver: ds3,
                holds: 3,
                ours: 2
            }
        );
    }
}
