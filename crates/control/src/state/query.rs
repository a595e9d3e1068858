//! Questions asked of the state without changing it: a scheme's receiver and
//! return-service states and subscribers, who masters an element, the roles a store
//! has in the schemes, and whether a subscriber holds a copy it could master.

use std::collections::BTreeSet;

use hawser_core::{Ident, NodeId, QualName};
use hawser_scheme::ast::{Element, OwnerRole, StoreName, StoreRef};

use super::{
    ClusterState, MasterView, NodeInfo, ReceiverState, ReturnServiceState, SchemeRole, SchemeState,
    StoreRole,
};

impl SchemeState {
    /// The effective scheme in canonical CREATE REPLICATION text.
    pub fn ddl(&self) -> String {
        hawser_scheme::print_scheme(&self.scheme)
    }

    /// The state of `store` as a receiver of this scheme.
    pub fn receiver_state(&self, store: &Ident) -> ReceiverState {
        self.receivers
            .get(store)
            .copied()
            .unwrap_or(ReceiverState::Start)
    }

    /// Whether commits wait for `store`'s return service.
    pub fn return_service_state(&self, store: &Ident) -> ReturnServiceState {
        self.return_services
            .get(store)
            .copied()
            .unwrap_or(ReturnServiceState::Enabled)
    }

    /// Whether `store` is a master a failover deposed that has not rejoined: its
    /// receiver STOPPED and its return service DISABLED (as the failover left them),
    /// and a failover of this scheme forked off its node's commits.
    pub fn is_deposed(&self, state: &ClusterState, store: &Ident) -> bool {
        let Some(node) = state.node_by_store(store).map(|n| n.id) else {
            return false;
        };
        self.receiver_state(store) == ReceiverState::Stop
            && self.return_service_state(store) == ReturnServiceState::Disabled
            && self.elements.values().any(|e| {
                e.history
                    .iter()
                    .any(|r| r.fork_point.is_some_and(|f| f.origin == node))
            })
    }

    /// The element named `name` in the effective scheme.
    pub fn element(&self, name: &Ident) -> Option<&Element> {
        self.scheme.elements.iter().find(|e| &e.name == name)
    }

    /// Every store that subscribes to some element of the scheme.
    pub fn subscriber_stores(&self) -> BTreeSet<Ident> {
        self.scheme
            .elements
            .iter()
            .flat_map(|e| e.subscriber_stores())
            .filter_map(named)
            .cloned()
            .collect()
    }
}

/// Every role `store` has in the schemes of `state`, in scheme and element order.
pub fn store_roles(state: &ClusterState, store: &Ident) -> Vec<SchemeRole> {
    let mut roles = Vec::new();
    for (name, s) in &state.schemes {
        for el in &s.scheme.elements {
            let role = if named(&el.owner) == Some(store) {
                match el.owner_role {
                    OwnerRole::Master => StoreRole::Master,
                    OwnerRole::Propagator => StoreRole::Propagator,
                }
            } else if el.subscriber_stores().any(|s| named(s) == Some(store)) {
                StoreRole::Subscriber
            } else {
                continue;
            };
            roles.push(SchemeRole {
                scheme: name.clone(),
                element: el.name.clone(),
                role,
            });
        }
    }
    roles
}

impl ClusterState {
    /// The node that holds `store`, if it has registered.
    pub fn node_by_store(&self, store: &Ident) -> Option<&NodeInfo> {
        self.nodes.values().find(|n| &n.store == store)
    }

    /// The current master (or propagator) store of an element, its node if registered,
    /// and its epoch.
    pub fn master_of(&self, scheme: &QualName, element: &Ident) -> Option<MasterView<'_>> {
        let s = self.schemes.get(scheme)?;
        let el = s.element(element)?;
        let state = s.elements.get(element)?;
        let store = named(&el.owner)?;
        Some(MasterView {
            store,
            node: self.node_by_store(store).map(|n| n.id),
            role: el.owner_role,
            epoch: state.epoch,
        })
    }

    /// Sets the voter flags from a Raft membership: `voters` vote, everyone else does not.
    pub fn set_voters(&mut self, voters: &BTreeSet<NodeId>) {
        for node in self.nodes.values_mut() {
            node.voter = voters.contains(&node.id);
        }
    }
}

/// Whether `store` subscribes to `el` as a copy of its table (USER COPY or REPLICA into
/// the table of the same name, the default), so that it could master it: a CCD, a
/// point-in-time copy (an extra column) or a copy INTO another table could not.
pub(crate) fn holds_a_copy(el: &hawser_scheme::ast::Element, store: &StoreName) -> bool {
    use hawser_scheme::ast::{ElementKind, TargetKind};
    let Some(target) = el.subscription_of(store).and_then(|c| c.target.as_ref()) else {
        return true;
    };
    let same_table = match (&el.kind, &target.into) {
        (_, None) => true,
        (ElementKind::Table { table, .. }, Some(into)) => into == table,
        _ => false,
    };
    same_table && matches!(target.kind, TargetKind::UserCopy | TargetKind::Replica)
}

/// The store name of a reference, `None` for `SELF`.
pub(super) fn named(store: &StoreRef) -> Option<&Ident> {
    match &store.name {
        StoreName::Named(n) => Some(n),
        StoreName::Local => None,
    }
}
