//! The pure effect of ALTER REPLICATION on a scheme.
//!
//! [`apply`] takes a scheme and an ALTER statement and returns the altered scheme, or
//! the first reason it cannot: an operation that does not fit the scheme (`HW2xxx`,
//! TT8101, TT8135, TT8177, ...) or an altered scheme that breaks a restriction (whatever
//! [`crate::validate`] reports). Nothing is changed on failure. The Raft state machine
//! applies ALTERs with it, and failover builds `ALTER ELEMENT * IN old SET MASTER new`.
//!
//! `SET MASTER` / `SET PROPAGATOR` swap roles when the new owner already subscribes to
//! the element: it takes the owner's place and the old owner takes its place in the
//! same SUBSCRIBER clause (same return service and target), which is what a failover
//! means. When the new owner does not subscribe, the old owner simply leaves the
//! element, as TimesTen's "replacing a master database" does.

use hawser_core::QualName;

use crate::ast::*;
use crate::error::{ErrorCode, SchemeError};
use crate::span::Span;
use crate::validate::{coverage, validate, validate_alter, Coverage};

/// Applies `alter` to `scheme`.
pub fn apply(scheme: &Scheme, alter: &AlterReplication) -> Result<Scheme, SchemeError> {
    if alter.name != scheme.name {
        return Err(SchemeError::new(
            ErrorCode::SchemeMismatch,
            alter.name_span,
            format!(
                "ALTER REPLICATION {} cannot be applied to scheme {}",
                alter.name, scheme.name
            ),
        ));
    }
    validate_alter(alter).map_err(first)?;
    let mut next = scheme.clone();
    for op in &alter.ops {
        apply_op(&mut next, op)?;
    }
    validate(&next).map_err(first)?;
    Ok(next)
}

fn first(mut errors: Vec<SchemeError>) -> SchemeError {
    // validate never returns an empty error list.
    errors.swap_remove(0)
}

fn apply_op(scheme: &mut Scheme, op: &AlterOp) -> Result<(), SchemeError> {
    match op {
        AlterOp::AddElement(el) => {
            if scheme.elements.iter().any(|e| e.name == el.name) {
                return Err(SchemeError::new(
                    ErrorCode::ElementNameDuplicate,
                    el.name_span,
                    format!("element {} already exists", el.name.as_str()),
                ));
            }
            scheme.elements.push(el.clone());
        }
        AlterOp::AlterElement {
            target,
            action,
            span,
        } => {
            for i in resolve(scheme, target)? {
                alter_element(&mut scheme.elements[i], action, *span)?;
            }
            if let ElementAction::SetName { name, span } = action {
                let count = scheme.elements.iter().filter(|e| &e.name == name).count();
                if count > 1 {
                    return Err(SchemeError::new(
                        ErrorCode::ElementNameDuplicate,
                        *span,
                        format!("element {} already exists", name.as_str()),
                    ));
                }
            }
        }
        AlterOp::DropElement { target, span } => {
            let indices = resolve(scheme, target)?;
            for &i in &indices {
                let el = &scheme.elements[i];
                if matches!(el.kind, ElementKind::Datastore)
                    && el.transmit == Some(Transmit::Nondurable)
                {
                    return Err(SchemeError::new(
                        ErrorCode::NondurableDrop,
                        *span,
                        format!(
                            "element {} is a TRANSMIT NONDURABLE DATASTORE element; drop and re-create the scheme instead",
                            el.name.as_str()
                        ),
                    ));
                }
            }
            if indices.len() == scheme.elements.len() {
                return Err(SchemeError::new(
                    ErrorCode::LastElement,
                    *span,
                    "dropping these elements would leave the scheme empty; use DROP REPLICATION",
                ));
            }
            let mut i = 0;
            scheme.elements.retain(|_| {
                i += 1;
                !indices.contains(&(i - 1))
            });
        }
        AlterOp::AddStore(clause) => scheme.stores.push(clause.clone()),
        AlterOp::AlterStore(clause) => alter_store(scheme, clause),
        AlterOp::AddRoute(route) => {
            match scheme.routes.iter_mut().find(|r| {
                r.master.name == route.master.name && r.subscriber.name == route.subscriber.name
            }) {
                Some(existing) => existing.addresses.extend(route.addresses.iter().cloned()),
                None => scheme.routes.push(route.clone()),
            }
        }
        AlterOp::DropRoute(drop) => drop_route(scheme, drop)?,
    }
    Ok(())
}

/// Indices of the elements `target` names.
fn resolve(scheme: &Scheme, target: &ElementTarget) -> Result<Vec<usize>, SchemeError> {
    match target {
        ElementTarget::Named { name, span } => scheme
            .elements
            .iter()
            .position(|e| &e.name == name)
            .map(|i| vec![i])
            .ok_or_else(|| {
                SchemeError::new(
                    ErrorCode::ElementNotFound,
                    *span,
                    format!("scheme has no element {}", name.as_str()),
                )
            }),
        ElementTarget::AllIn(store) => {
            let found: Vec<usize> = scheme
                .elements
                .iter()
                .enumerate()
                .filter(|(_, e)| e.owner.name == store.name)
                .map(|(i, _)| i)
                .collect();
            if found.is_empty() {
                return Err(SchemeError::new(
                    ErrorCode::NoElementOwnedBy,
                    store.span,
                    format!("database {} owns no element of the scheme", store.name),
                ));
            }
            Ok(found)
        }
    }
}

/// `span` is the ALTER ELEMENT operation's, for errors about the operation as a whole.
fn alter_element(el: &mut Element, action: &ElementAction, span: Span) -> Result<(), SchemeError> {
    match action {
        ElementAction::AddSubscriber(clause) => el.subscribers.push(clause.clone()),
        ElementAction::AlterSubscriber {
            stores,
            return_service,
        } => {
            for store in stores {
                set_subscriber_return(el, store, *return_service)?;
            }
        }
        ElementAction::SetReturnService(rs) => {
            for clause in &mut el.subscribers {
                clause.return_service = Some(*rs);
            }
        }
        ElementAction::DropSubscriber(stores) => {
            for store in stores {
                let clause = find_subscriber(el, store)?;
                el.subscribers[clause]
                    .stores
                    .retain(|s| s.name != store.name);
            }
            el.subscribers.retain(|c| !c.stores.is_empty());
            if el.subscribers.is_empty() {
                return Err(SchemeError::new(
                    ErrorCode::LastSubscriber,
                    span,
                    format!(
                        "element {} would have no subscriber left; drop the element instead",
                        el.name.as_str()
                    ),
                ));
            }
        }
        ElementAction::SetMaster(store) => set_owner(el, store, OwnerRole::Master),
        ElementAction::SetPropagator(store) => set_owner(el, store, OwnerRole::Propagator),
        ElementAction::SetName { name, .. } => el.name = name.clone(),
        ElementAction::SetCheckConflicts(check) => match &mut el.kind {
            ElementKind::Table { check: slot, .. } => {
                *slot = match check {
                    CheckConflicts::NoCheck => None,
                    other => Some(other.clone()),
                };
            }
            _ => {
                return Err(SchemeError::new(
                    ErrorCode::ConflictCheckNotTable,
                    span,
                    format!(
                        "conflict checking needs a TABLE element; {} is a {} element",
                        el.name.as_str(),
                        el.kind.keyword()
                    ),
                ))
            }
        },
        ElementAction::Inclusion(inc) => alter_inclusion(el, inc)?,
    }
    Ok(())
}

fn find_subscriber(el: &Element, store: &StoreRef) -> Result<usize, SchemeError> {
    el.subscribers
        .iter()
        .position(|c| c.stores.iter().any(|s| s.name == store.name))
        .ok_or_else(|| {
            SchemeError::new(
                ErrorCode::SubscriberNotFound,
                store.span,
                format!(
                    "database {} does not subscribe to element {}",
                    store.name,
                    el.name.as_str()
                ),
            )
        })
}

/// Gives `store` its own return service, splitting it out of a shared clause if needed.
fn set_subscriber_return(
    el: &mut Element,
    store: &StoreRef,
    rs: ReturnService,
) -> Result<(), SchemeError> {
    let i = find_subscriber(el, store)?;
    let clause = &mut el.subscribers[i];
    if clause.stores.len() == 1 {
        clause.return_service = Some(rs);
        return Ok(());
    }
    let pos = clause
        .stores
        .iter()
        .position(|s| s.name == store.name)
        .unwrap_or(0);
    let moved = clause.stores.remove(pos);
    let split = SubscriberClause {
        stores: vec![moved],
        return_service: Some(rs),
        return_span: Span::default(),
        target: clause.target.clone(),
        span: clause.span,
    };
    el.subscribers.insert(i + 1, split);
    Ok(())
}

fn set_owner(el: &mut Element, store: &StoreRef, role: OwnerRole) {
    el.owner_role = role;
    if el.owner.name == store.name {
        return;
    }
    let slot = el
        .subscribers
        .iter_mut()
        .flat_map(|c| c.stores.iter_mut())
        .find(|s| s.name == store.name);
    match slot {
        Some(slot) => {
            // The subscriber's own reference keeps its host when the ALTER names none.
            let new_owner = if store.host.is_none() {
                slot.clone()
            } else {
                store.clone()
            };
            let old = std::mem::replace(&mut el.owner, new_owner);
            *slot = old;
        }
        None => el.owner = store.clone(),
    }
}

fn alter_inclusion(el: &mut Element, inc: &Inclusion) -> Result<(), SchemeError> {
    if !matches!(el.kind, ElementKind::Datastore) {
        return Err(SchemeError::new(
            ErrorCode::InclusionNotDatastore,
            inc.span,
            format!(
                "INCLUDE / EXCLUDE needs a DATASTORE element; {} is a {} element",
                el.name.as_str(),
                el.kind.keyword()
            ),
        ));
    }
    if inc.action == InclusionAction::Exclude && el.transmit == Some(Transmit::Nondurable) {
        return Err(SchemeError::new(
            ErrorCode::NondurableDrop,
            inc.span,
            format!(
                "objects cannot be excluded from TRANSMIT NONDURABLE element {}",
                el.name.as_str()
            ),
        ));
    }
    for group in &inc.groups {
        alter_group(el, inc.action, group)?;
    }
    Ok(())
}

/// Changes the element's clause for `group`'s object type so that it covers more
/// (INCLUDE) or fewer (EXCLUDE) objects.
fn alter_group(
    el: &mut Element,
    action: InclusionAction,
    group: &ObjectGroup,
) -> Result<(), SchemeError> {
    let not_part = |obj: &NamedObject| {
        SchemeError::new(
            ErrorCode::ExcludeNotInElement,
            obj.span,
            format!(
                "{} is not part of DATASTORE element {} (or is already excluded)",
                obj.name,
                el.name.as_str()
            ),
        )
    };
    let existing = el.inclusions.iter().enumerate().find_map(|(i, inc)| {
        inc.groups
            .iter()
            .position(|g| g.object_type == group.object_type)
            .map(|j| (i, j))
    });
    let Some((i, j)) = existing else {
        let cover = coverage(&el.inclusions, group.object_type);
        match (action, cover) {
            // Everything of this type is already covered.
            (InclusionAction::Include, Coverage::AllExcept(_)) => {}
            (InclusionAction::Exclude, Coverage::Only(_)) => {
                if let Some(obj) = group.names.first() {
                    return Err(not_part(obj));
                }
            }
            _ => el.inclusions.push(Inclusion {
                action,
                groups: vec![group.clone()],
                span: group.span,
            }),
        }
        return Ok(());
    };
    let current = el.inclusions[i].action;
    let names = &mut el.inclusions[i].groups[j].names;
    let has = |names: &[NamedObject], n: &QualName| names.iter().any(|o| &o.name == n);
    for obj in &group.names {
        match (action, current) {
            (InclusionAction::Include, InclusionAction::Include) => {
                if !has(names, &obj.name) {
                    names.push(obj.clone());
                }
            }
            (InclusionAction::Include, InclusionAction::Exclude) => {
                names.retain(|o| o.name != obj.name)
            }
            (InclusionAction::Exclude, InclusionAction::Include) => {
                if !has(names, &obj.name) {
                    return Err(not_part(obj));
                }
                names.retain(|o| o.name != obj.name);
            }
            (InclusionAction::Exclude, InclusionAction::Exclude) => {
                if has(names, &obj.name) {
                    return Err(not_part(obj));
                }
                names.push(obj.clone());
            }
        }
    }
    Ok(())
}

/// ALTER STORE ... SET: each attribute replaces the store's value or is added to it.
fn alter_store(scheme: &mut Scheme, clause: &StoreClause) {
    for attr in &clause.attributes {
        let existing = scheme
            .stores
            .iter_mut()
            .filter(|c| c.store.name == clause.store.name)
            .flat_map(|c| c.attributes.iter_mut())
            .find(|a| a.attr.key() == attr.attr.key());
        match existing {
            Some(slot) => *slot = attr.clone(),
            None => match scheme
                .stores
                .iter_mut()
                .find(|c| c.store.name == clause.store.name)
            {
                Some(c) => c.attributes.push(attr.clone()),
                None => scheme.stores.push(StoreClause {
                    store: clause.store.clone(),
                    attributes: vec![attr.clone()],
                    span: clause.span,
                }),
            },
        }
    }
}

fn drop_route(scheme: &mut Scheme, drop: &DropRoute) -> Result<(), SchemeError> {
    let Some(i) = scheme.routes.iter().position(|r| {
        r.master.name == drop.master.name && r.subscriber.name == drop.subscriber.name
    }) else {
        return Err(SchemeError::new(
            ErrorCode::RouteNotFound,
            drop.span,
            format!(
                "there is no route from {} to {}",
                drop.master.name, drop.subscriber.name
            ),
        ));
    };
    let route = &mut scheme.routes[i];
    for (side, host) in &drop.addresses {
        let before = route.addresses.len();
        route
            .addresses
            .retain(|a| !(a.side == *side && &a.host == host));
        if route.addresses.len() == before {
            return Err(SchemeError::new(
                ErrorCode::RouteNotFound,
                drop.span,
                format!("the route has no address \"{host}\" on that side"),
            ));
        }
    }
    if route.addresses.is_empty() {
        scheme.routes.remove(i);
    }
    Ok(())
}
