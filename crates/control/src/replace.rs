//! Replacing a member that lost its data: a node started with `--replace` whose store
//! name the cluster registers to another node takes that node's place once the leader
//! has heard nothing from it for long enough (docs/control.md, "Replacing a node").
//!
//! ```text
//!  join(replace) ─► store registered to another node?  no ─► an ordinary join
//!                      │ yes
//!                      ├─ heard from within the threshold? ─► Retry: it is alive
//!                      └─ silent ─► remove it (store kept in the schemes), then join
//! ```
//!
//! The threshold counts from when this leader started leading, not from the credit a
//! new leader gives silent nodes for failover: a node that has not yet had the chance
//! to report to a new leader is not taken for dead. A node that still holds a master
//! role is not replaced until failover has moved it (the removal itself refuses).

use std::time::Duration;

use hawser_core::NodeId;

use crate::failover::HealthView;
use crate::state::{store_roles, ClusterState, NodeInfo, StoreRole};

/// What the leader does with a join that asks to replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replace {
    /// No other node has the store name: join as usual.
    Nothing,
    /// Remove this node (store kept in the schemes), then admit the joining one.
    Remove(NodeId),
    /// Not now; the reason says what is waited for.
    Wait(String),
}

/// Decides a replacing join of `joining` with the leader's `view` at `now`, the leader
/// having led since `led_since` (on the view's clock), waiting for `threshold` of
/// silence.
pub fn decide(
    state: &ClusterState,
    joining: &NodeInfo,
    view: &HealthView,
    now: Duration,
    led_since: Duration,
    threshold: Duration,
) -> Replace {
    let Some(old) = state
        .nodes
        .values()
        .find(|n| n.store == joining.store && n.id != joining.id)
    else {
        return Replace::Nothing;
    };
    // An empty node must never take a master's or propagator's role: failover moves
    // the role off a silent master first (or, paused or without a candidate, the role
    // stays and so does the old node).
    let owned: Vec<String> = store_roles(state, &joining.store)
        .into_iter()
        .filter(|r| r.role != StoreRole::Subscriber)
        .map(|r| format!("{} of {}.{}", r.role, r.scheme, r.element))
        .collect();
    if !owned.is_empty() {
        return Replace::Wait(format!(
            "store {} is registered to node {}, which still holds {}; node {} takes its place \
             (--replace) once failover has moved the role",
            joining.store,
            old.id,
            owned.join(", "),
            joining.id
        ));
    }
    let heard = view
        .nodes
        .get(&old.id)
        .map_or(led_since, |h| h.last_report.max(led_since));
    let silence = now.saturating_sub(heard);
    if silence <= threshold {
        return Replace::Wait(format!(
            "store {} is registered to node {} at {}, which the leader heard from {} ms ago; \
             node {} takes its place (--replace) once it has been silent for {} ms",
            joining.store,
            old.id,
            old.grpc_addr,
            silence.as_millis(),
            joining.id,
            threshold.as_millis()
        ));
    }
    Replace::Remove(old.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failover::NodeHealth;
    use hawser_core::Ident;

    fn node(id: u64, store: &str) -> NodeInfo {
        NodeInfo {
            id: NodeId(id),
            store: Ident::unquoted(store),
            host: "h".into(),
            grpc_addr: format!("h:{id}"),
            http_addr: String::new(),
            voter: true,
        }
    }

    fn state(nodes: &[NodeInfo]) -> ClusterState {
        let mut st = ClusterState::default();
        for n in nodes {
            st.nodes.insert(n.id, n.clone());
        }
        st
    }

    fn heard(view: &mut HealthView, id: u64, at: Duration) {
        view.nodes.insert(
            NodeId(id),
            NodeHealth {
                last_report: at,
                report: crate::failover::HealthReport {
                    node: NodeId(id),
                    own_seq: 0,
                    high_water: Default::default(),
                    state_version: 0,
                    lease_released: false,
                    echo: None,
                },
                heard_after: None,
            },
        );
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_store_nobody_else_holds_is_an_ordinary_join() {
        let st = state(&[node(1, "a"), node(2, "b")]);
        let view = HealthView::new(Duration::ZERO);
        assert_eq!(
            decide(&st, &node(9, "c"), &view, 10 * S, Duration::ZERO, S),
            Replace::Nothing
        );
        // The node itself, rejoining under its own id: nothing to replace.
        assert_eq!(
            decide(&st, &node(2, "b"), &view, 10 * S, Duration::ZERO, S),
            Replace::Nothing
        );
    }

    #[test]
    fn a_silent_holder_of_the_store_is_removed_and_a_live_one_waited_for() {
        let st = state(&[node(1, "a"), node(2, "b")]);
        let mut view = HealthView::new(Duration::ZERO);
        heard(&mut view, 2, 8 * S);
        let joining = node(9, "b");
        match decide(&st, &joining, &view, 8 * S + S / 2, Duration::ZERO, S) {
            Replace::Wait(why) => {
                assert!(
                    why.contains("node 2") && why.contains("500 ms ago"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decide(&st, &joining, &view, 10 * S, Duration::ZERO, S),
            Replace::Remove(NodeId(2))
        );
    }

    #[test]
    fn a_silent_master_is_not_replaced_until_failover_moved_its_role() {
        let mut st = state(&[node(1, "a"), node(2, "b")]);
        let cmd = crate::state::Command::from_ddl(
            "CREATE REPLICATION r ELEMENT e DATASTORE MASTER b SUBSCRIBER a;",
        )
        .unwrap()
        .remove(0);
        assert!(matches!(
            crate::state::apply(&mut st, &cmd),
            crate::state::Response::Applied { .. }
        ));
        let view = HealthView::new(Duration::ZERO);
        match decide(&st, &node(9, "b"), &view, 10 * S, Duration::ZERO, S) {
            Replace::Wait(why) => assert!(why.contains("failover"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn silence_counts_from_when_the_leader_began_leading_not_before() {
        let st = state(&[node(1, "a"), node(2, "b")]);
        // A view whose failover credit reaches back before this leadership: node 2
        // never reported to it, and it has led for half the threshold only.
        let view = HealthView::new(Duration::ZERO);
        let led_since = 20 * S;
        assert!(matches!(
            decide(&st, &node(9, "b"), &view, 20 * S + S / 2, led_since, S),
            Replace::Wait(_)
        ));
        assert_eq!(
            decide(&st, &node(9, "b"), &view, 22 * S, led_since, S),
            Replace::Remove(NodeId(2))
        );
    }
}
