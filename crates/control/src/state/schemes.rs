//! The replication schemes' commands: CREATE and ALTER REPLICATION, and a master change
//! (failover or switchover) with its new epoch and fork point.

use std::collections::BTreeMap;

use hawser_core::{Epoch, Gtid, Ident, NodeId, QualName};
use hawser_scheme::ast::{
    AlterOp, AlterReplication, ElementAction, ElementKind, ElementTarget, OwnerRole, Scheme,
    StoreName, StoreRef,
};
use hawser_scheme::Span;

use super::change::Change;
use super::query::named;
use super::{
    holds_a_copy, ClusterState, ControlError, ElementState, EpochRecord, ReceiverState,
    ReturnServiceState, SchemeState,
};

pub(super) fn create_scheme(state: &ClusterState, scheme: &Scheme) -> Result<Change, ControlError> {
    if state.schemes.contains_key(&scheme.name) {
        return Err(ControlError::SchemeExists(scheme.name.clone()));
    }
    hawser_scheme::validate(scheme).map_err(ControlError::Invalid)?;
    if mentions_self(scheme) {
        return Err(ControlError::UnresolvedSelf(scheme.name.clone()));
    }
    let elements = scheme
        .elements
        .iter()
        .filter_map(|el| Some((el.name.clone(), first_epoch(state, named(&el.owner)?))))
        .collect();
    Ok(Change::PutScheme(SchemeState {
        scheme: scheme.clone(),
        version: 1,
        elements,
        receivers: BTreeMap::new(),
        return_services: BTreeMap::new(),
    }))
}

pub(super) fn alter_scheme(
    state: &ClusterState,
    alter: &AlterReplication,
) -> Result<Change, ControlError> {
    let old = scheme(state, &alter.name)?;
    altered(state, old, &old.scheme, alter).map(Change::PutScheme)
}

/// Scheme `old` after `alter`, applied to `base` (`old.scheme`, or a copy of it a
/// removal already took some clauses out of): the epoch of every element whose owner
/// changes grows, renamed elements keep their history, and the receiver and return
/// service states of stores that no longer subscribe are forgotten.
pub(super) fn altered(
    state: &ClusterState,
    old: &SchemeState,
    base: &Scheme,
    alter: &AlterReplication,
) -> Result<SchemeState, ControlError> {
    let next = hawser_scheme::apply(base, alter).map_err(|e| ControlError::Invalid(vec![e]))?;
    if mentions_self(&next) {
        return Err(ControlError::UnresolvedSelf(next.name.clone()));
    }
    // Element names before the ALTER, for elements it renames.
    let mut former: BTreeMap<Ident, Ident> = BTreeMap::new();
    for op in &alter.ops {
        if let AlterOp::AlterElement {
            target: ElementTarget::Named { name: from, .. },
            action: ElementAction::SetName { name: to, .. },
            ..
        } = op
        {
            let origin = former.remove(from).unwrap_or_else(|| from.clone());
            former.insert(to.clone(), origin);
        }
    }
    let mut elements = BTreeMap::new();
    for el in &next.elements {
        let Some(owner) = named(&el.owner) else {
            continue;
        };
        let before = former.get(&el.name).unwrap_or(&el.name);
        let es = match old.elements.get(before) {
            Some(prev) if &prev.current().master == owner => prev.clone(),
            Some(prev) => {
                // The new master must hold a copy of the table (not a CCD or another
                // target) as the element's subscriber before this ALTER.
                let was = base.elements.iter().find(|e| &e.name == before);
                if was.is_some_and(|e| !holds_a_copy(e, &StoreName::Named(owner.clone()))) {
                    return Err(ControlError::NotACopy {
                        scheme: old.scheme.name.clone(),
                        element: el.name.clone(),
                        store: owner.clone(),
                    });
                }
                let mut es = prev.clone();
                es.epoch = Epoch(es.epoch.0 + 1);
                es.history.push(EpochRecord {
                    epoch: es.epoch,
                    master: owner.clone(),
                    node: state.node_by_store(owner).map(|n| n.id),
                    fork_point: None,
                    era: None,
                });
                es
            }
            None => first_epoch(state, owner),
        };
        elements.insert(el.name.clone(), es);
    }
    let mut s = SchemeState {
        scheme: next,
        version: old.version + 1,
        elements,
        receivers: old.receivers.clone(),
        return_services: old.return_services.clone(),
    };
    let subscribers = s.subscriber_stores();
    s.receivers.retain(|store, _| subscribers.contains(store));
    s.return_services
        .retain(|store, _| subscribers.contains(store));
    Ok(s)
}

pub(super) fn set_master(
    state: &ClusterState,
    name: &QualName,
    element: &Ident,
    node: NodeId,
    epoch: Epoch,
    fork_point: Option<Gtid>,
) -> Result<Change, ControlError> {
    let old = scheme(state, name)?;
    let unknown = || ControlError::UnknownElement {
        scheme: name.clone(),
        element: element.clone(),
    };
    let el = old.element(element).ok_or_else(unknown)?;
    let es = old.elements.get(element).ok_or_else(unknown)?;
    if epoch.0 != es.epoch.0 + 1 {
        return Err(ControlError::StaleEpoch {
            scheme: name.clone(),
            element: element.clone(),
            current: es.epoch,
            proposed: epoch,
        });
    }
    let info = state
        .nodes
        .get(&node)
        .ok_or(ControlError::UnknownNode(node))?;
    if !el
        .subscriber_stores()
        .any(|s| named(s) == Some(&info.store))
    {
        return Err(ControlError::NotSubscriber {
            scheme: name.clone(),
            element: element.clone(),
            store: info.store.clone(),
        });
    }
    if !holds_a_copy(el, &StoreName::Named(info.store.clone())) {
        return Err(ControlError::NotACopy {
            scheme: name.clone(),
            element: element.clone(),
            store: info.store.clone(),
        });
    }
    let store = StoreRef {
        name: StoreName::Named(info.store.clone()),
        host: None,
        span: Span::default(),
    };
    let action = match el.owner_role {
        OwnerRole::Master => ElementAction::SetMaster(store),
        OwnerRole::Propagator => ElementAction::SetPropagator(store),
    };
    let named_target = |name: &Ident| ElementTarget::Named {
        name: name.clone(),
        span: Span::default(),
    };
    // A new master that propagated the same table in another element (the master's
    // TWOSAFE subscriber relaying to the others) cannot also own it there: that element
    // is folded into this one, its subscribers now subscribing to the new master
    // directly, with their return services.
    let mut ops = Vec::new();
    let mut folded = Vec::new();
    let mut dropped = Vec::new();
    if let (OwnerRole::Master, ElementKind::Table { table, .. }) = (el.owner_role, &el.kind) {
        for other in &old.scheme.elements {
            let same_table =
                matches!(&other.kind, ElementKind::Table { table: t, .. } if t == table);
            if other.name == *element
                || other.owner_role != OwnerRole::Propagator
                || named(&other.owner) != Some(&info.store)
                || !same_table
            {
                continue;
            }
            ops.push(AlterOp::DropElement {
                target: named_target(&other.name),
                span: Span::default(),
            });
            dropped.push(other.name.clone());
            for clause in &other.subscribers {
                let mut clause = clause.clone();
                clause.stores.retain(|r| {
                    named(r).is_some_and(|n| {
                        Some(n) != named(&el.owner)
                            && *n != info.store
                            && !el.subscriber_stores().any(|x| named(x) == Some(n))
                    })
                });
                if !clause.stores.is_empty() {
                    folded.push(clause);
                }
            }
        }
    }
    ops.push(AlterOp::AlterElement {
        target: named_target(element),
        action,
        span: Span::default(),
    });
    for clause in folded {
        ops.push(AlterOp::AlterElement {
            target: named_target(element),
            action: ElementAction::AddSubscriber(clause),
            span: Span::default(),
        });
    }
    let alter = AlterReplication {
        name: name.clone(),
        name_span: Span::default(),
        ops,
        span: Span::default(),
    };
    let next =
        hawser_scheme::apply(&old.scheme, &alter).map_err(|e| ControlError::Invalid(vec![e]))?;
    let mut s = old.clone();
    s.scheme = next;
    s.elements.retain(|n, _| !dropped.contains(n));
    // The new master no longer receives what it now masters; a state kept for it as a
    // receiver of nothing would only mislead.
    let subscribers = s.subscriber_stores();
    s.receivers.retain(|store, _| subscribers.contains(store));
    s.return_services
        .retain(|store, _| subscribers.contains(store));
    s.version += 1;
    if fork_point.is_some() {
        // A failover: the deposed master now sits in its successor's subscriber slot,
        // dead or fenced. Nothing is sent to it and no commit waits for it until it has
        // rejoined (set aside what never left it and caught up), which starts it again.
        if let Some(deposed) = named(&el.owner) {
            s.receivers.insert(deposed.clone(), ReceiverState::Stop);
            s.return_services
                .insert(deposed.clone(), ReturnServiceState::Disabled);
        }
    }
    if let Some(es) = s.elements.get_mut(element) {
        es.epoch = epoch;
        es.history.push(EpochRecord {
            epoch,
            master: info.store.clone(),
            node: Some(node),
            fork_point,
            era: fork_point.map(|_| state.era + 1),
        });
    }
    Ok(match fork_point {
        Some(_) => Change::Failover(s),
        None => Change::PutScheme(s),
    })
}

pub(super) fn scheme<'a>(
    state: &'a ClusterState,
    name: &QualName,
) -> Result<&'a SchemeState, ControlError> {
    state
        .schemes
        .get(name)
        .ok_or_else(|| ControlError::UnknownScheme(name.clone()))
}

/// A copy of scheme `name` after checking that `store` subscribes to it.
pub(super) fn subscribed_scheme(
    state: &ClusterState,
    name: &QualName,
    store: &Ident,
) -> Result<SchemeState, ControlError> {
    let s = scheme(state, name)?;
    if !s.subscriber_stores().contains(store) {
        return Err(ControlError::NotSchemeSubscriber {
            scheme: name.clone(),
            store: store.clone(),
        });
    }
    Ok(s.clone())
}

fn first_epoch(state: &ClusterState, owner: &Ident) -> ElementState {
    ElementState {
        epoch: Epoch(0),
        history: vec![EpochRecord {
            epoch: Epoch(0),
            master: owner.clone(),
            node: state.node_by_store(owner).map(|n| n.id),
            fork_point: None,
            era: None,
        }],
    }
}

fn mentions_self(scheme: &Scheme) -> bool {
    let local = |s: &StoreRef| s.name == StoreName::Local;
    scheme
        .elements
        .iter()
        .any(|e| local(&e.owner) || e.subscriber_stores().any(local))
        || scheme.stores.iter().any(|c| local(&c.store))
        || scheme
            .routes
            .iter()
            .any(|r| local(&r.master) || local(&r.subscriber))
}
