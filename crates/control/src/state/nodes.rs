//! The node registry's commands: registering a node, and removing one with what the
//! removal mode does to the schemes that name its store.

use std::collections::BTreeSet;

use hawser_core::{Ident, NodeId, QualName};
use hawser_scheme::ast::{
    AlterOp, AlterReplication, ElementAction, ElementTarget, StoreName, StoreRef,
};
use hawser_scheme::Span;

use super::change::Change;
use super::query::named;
use super::schemes::{altered, scheme};
use super::{
    store_roles, ClusterState, ControlError, NodeInfo, RemovalMode, RemovedNode, SchemeState,
    StoreRole,
};

pub(super) fn register_node(state: &ClusterState, info: &NodeInfo) -> Result<Change, ControlError> {
    if state.removed.contains_key(&info.id) {
        return Err(ControlError::NodeRemoved(info.id));
    }
    let clash = state
        .nodes
        .values()
        .find(|n| (n.id == info.id) != (n.store == info.store));
    if let Some(existing) = clash {
        return Err(ControlError::IdentityClash {
            node: info.id,
            store: info.store.clone(),
            existing: existing.id,
            existing_store: existing.store.clone(),
        });
    }
    let mut info = info.clone();
    // The voter flag follows Raft membership, never the proposer.
    info.voter = state.nodes.get(&info.id).is_some_and(|n| n.voter);
    Ok(Change::PutNode(info))
}

/// A removal, checked against the schemes as `mode` says (see [`RemovalMode`]).
pub(super) fn remove_node(
    state: &ClusterState,
    id: NodeId,
    mode: RemovalMode,
    at_unix_ms: u64,
) -> Result<Change, ControlError> {
    if state.removed.contains_key(&id) {
        return Err(ControlError::NodeRemoved(id));
    }
    let node = state.nodes.get(&id).ok_or(ControlError::UnknownNode(id))?;
    let store = &node.store;
    let roles = store_roles(state, store);
    // An element keeps its owner whatever the mode: the role moves first.
    if let Some(owner) = roles.iter().find(|r| r.role != StoreRole::Subscriber) {
        return Err(ControlError::NodeHoldsRole {
            node: id,
            store: store.clone(),
            role: Box::new(owner.clone()),
        });
    }
    let mut schemes = Vec::new();
    match (mode, roles.first()) {
        (_, None) => {}
        (RemovalMode::KeepInSchemes, _) => {
            // The store's next holder is a new node with nothing of its own, so nothing
            // past a fork point: where this node sat as a deposed master not yet
            // rejoined (receiver STOPPED, return service DISABLED by the failover), the
            // store is received again in the same entry. Left so, the new node would
            // never be streamed to: only the deposed node itself starts its receiver,
            // once it has judged its forked-off commits.
            for (_, scheme) in state.schemes.iter() {
                if scheme.is_deposed(state, store) {
                    let mut s = scheme.clone();
                    s.receivers.remove(store);
                    s.return_services.remove(store);
                    s.version += 1;
                    schemes.push(s);
                }
            }
        }
        (RemovalMode::Refuse, Some(first)) => {
            return Err(ControlError::StoreInScheme {
                node: id,
                store: store.clone(),
                role: Box::new(first.clone()),
                others: roles.len() - 1,
            })
        }
        (RemovalMode::Force, Some(_)) => {
            let names: BTreeSet<&QualName> = roles.iter().map(|r| &r.scheme).collect();
            for name in names {
                schemes.push(drop_store(state, id, name, store)?);
            }
        }
    }
    Ok(Change::RemoveNode(
        id,
        RemovedNode {
            store: store.clone(),
            at_unix_ms,
            log_index: 0,
        },
        schemes,
    ))
}

/// Scheme `name` with `store` (a subscriber only) taken out: `ALTER REPLICATION name
/// ALTER ELEMENT e DROP SUBSCRIBER store` for every element it subscribes to, applied
/// as any ALTER is (so an element left without subscribers is refused, HW2006), after
/// dropping the STORE and ROUTE clauses that name it — the store is in no element
/// afterwards, and the checker refuses clauses naming such a store (HW1002), which no
/// ALTER can drop.
fn drop_store(
    state: &ClusterState,
    node: NodeId,
    name: &QualName,
    store: &Ident,
) -> Result<SchemeState, ControlError> {
    let old = scheme(state, name)?;
    let mut base = old.scheme.clone();
    base.stores.retain(|c| named(&c.store) != Some(store));
    base.routes
        .retain(|r| named(&r.master) != Some(store) && named(&r.subscriber) != Some(store));
    let ops = old
        .scheme
        .elements
        .iter()
        .filter(|el| el.subscriber_stores().any(|s| named(s) == Some(store)))
        .map(|el| AlterOp::AlterElement {
            target: ElementTarget::Named {
                name: el.name.clone(),
                span: Span::default(),
            },
            action: ElementAction::DropSubscriber(vec![StoreRef {
                name: StoreName::Named(store.clone()),
                host: None,
                span: Span::default(),
            }]),
            span: Span::default(),
        })
        .collect();
    let alter = AlterReplication {
        name: name.clone(),
        name_span: Span::default(),
        ops,
        span: Span::default(),
    };
    altered(state, old, &base, &alter).map_err(|e| match e {
        ControlError::Invalid(mut findings) if !findings.is_empty() => {
            ControlError::ForcedRemovalRefused {
                node,
                store: store.clone(),
                scheme: name.clone(),
                finding: Box::new(findings.swap_remove(0)),
            }
        }
        other => other,
    })
}
