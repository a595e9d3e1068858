//! The documented restrictions of a scheme.
//!
//! [`validate`] checks a parsed [`Scheme`] against every rule that can be decided from
//! the scheme alone (rules that need the databases' catalogs — objects that do not exist,
//! CYCLE sequences, "excludes everything" — are checked by [`crate::route`]). It reports
//! every problem, each with TimesTen's error number where the TimesTen documentation
//! gives one and a hawser `HW` number otherwise, and the span to point at.
//!
//! Deliberate departures from TimesTen 22.1 (see `docs/scheme.md`): RETURN TWOSAFE is
//! allowed on TABLE elements (TT8193 is not raised) and with any number of subscribers
//! (TT8195 is not raised) — the commit waits for all of them, and hawser's failover
//! promotes a subscriber that has every TWOSAFE transaction.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use hawser_core::{Ident, QualName};

use crate::ast::*;
use crate::error::{ErrorCode, SchemeError};
use crate::span::Span;

/// TimesTen 22.1's limit of subscriber databases per scheme.
pub const MAX_SUBSCRIBERS: usize = 255;

/// Owners whose objects are never replicated (TT8207).
const SYSTEM_OWNERS: &[&str] = &["sys", "ttrep"];

/// Checks `scheme`; on failure returns every problem, ordered by position.
pub fn validate(scheme: &Scheme) -> Result<(), Vec<SchemeError>> {
    let mut errors = Vec::new();
    check_element_names(&scheme.elements, &mut errors);
    check_hosts(scheme, &mut errors);
    for el in &scheme.elements {
        check_element(el, &mut errors);
    }
    check_ownership(&scheme.elements, &mut errors);
    check_conflict_settings(&scheme.elements, &mut errors);
    check_propagators(&scheme.elements, &mut errors);
    check_stores(scheme, &mut errors);
    check_routes(scheme, &mut errors);
    let subscribers: BTreeSet<&StoreName> = scheme
        .elements
        .iter()
        .flat_map(|e| e.subscriber_stores().map(|s| &s.name))
        .collect();
    if subscribers.len() > MAX_SUBSCRIBERS {
        errors.push(SchemeError::new(
            ErrorCode::TooManySubscribers,
            scheme.name_span,
            format!(
                "the scheme has {} subscriber databases; at most {MAX_SUBSCRIBERS} are allowed",
                subscribers.len()
            ),
        ));
    }
    finish(errors)
}

/// The checks an ALTER REPLICATION can fail on its own, before it meets a scheme: the
/// elements it adds, TT8104 (ALTER or DROP after DROP of the same element) and TT8101
/// (ALTER or DROP of an element added by the same statement).
pub fn validate_alter(alter: &AlterReplication) -> Result<(), Vec<SchemeError>> {
    let mut errors = Vec::new();
    let mut added: BTreeSet<&Ident> = BTreeSet::new();
    let mut dropped: BTreeSet<&Ident> = BTreeSet::new();
    let added_elements: Vec<Element> = alter
        .ops
        .iter()
        .filter_map(|op| match op {
            AlterOp::AddElement(el) => Some(el.clone()),
            _ => None,
        })
        .collect();
    check_element_names(&added_elements, &mut errors);
    for op in &alter.ops {
        let named = match op {
            AlterOp::AddElement(el) => {
                check_element(el, &mut errors);
                added.insert(&el.name);
                continue;
            }
            AlterOp::AlterElement {
                target: ElementTarget::Named { name, span },
                ..
            } => Some((name, *span, false)),
            AlterOp::DropElement {
                target: ElementTarget::Named { name, span },
                ..
            } => Some((name, *span, true)),
            _ => None,
        };
        let Some((name, span, is_drop)) = named else {
            continue;
        };
        if dropped.contains(name) {
            errors.push(SchemeError::new(
                ErrorCode::AlterAfterDrop,
                span,
                format!(
                    "element {} was dropped earlier in this statement",
                    name.as_str()
                ),
            ));
        } else if added.contains(name) {
            errors.push(SchemeError::new(
                ErrorCode::ElementNameDuplicate,
                span,
                format!(
                    "element {} is added by this statement and cannot also be altered or dropped in it",
                    name.as_str()
                ),
            ));
        }
        if is_drop {
            dropped.insert(name);
        }
    }
    finish(errors)
}

fn finish(mut errors: Vec<SchemeError>) -> Result<(), Vec<SchemeError>> {
    if errors.is_empty() {
        Ok(())
    } else {
        errors.sort_by_key(|e| e.span.start);
        Err(errors)
    }
}

fn check_element_names(elements: &[Element], errors: &mut Vec<SchemeError>) {
    let mut seen = BTreeSet::new();
    for el in elements {
        if !seen.insert(&el.name) {
            errors.push(SchemeError::new(
                ErrorCode::ElementNameDuplicate,
                el.name_span,
                format!("element name {} is used twice", el.name.as_str()),
            ));
        }
    }
}

/// Every store reference of the scheme.
fn all_store_refs(scheme: &Scheme) -> Vec<&StoreRef> {
    let mut refs = Vec::new();
    for el in &scheme.elements {
        refs.push(&el.owner);
        refs.extend(el.subscriber_stores());
    }
    refs.extend(scheme.stores.iter().map(|s| &s.store));
    for r in &scheme.routes {
        refs.push(&r.master);
        refs.push(&r.subscriber);
    }
    refs
}

/// TT8172: a database is identified by its name; every host given for it must agree.
fn check_hosts(scheme: &Scheme, errors: &mut Vec<SchemeError>) {
    let mut hosts: HashMap<&StoreName, &str> = HashMap::new();
    for store in all_store_refs(scheme) {
        let Some(host) = &store.host else { continue };
        match hosts.get(&store.name) {
            Some(first) if first != host => errors.push(SchemeError::new(
                ErrorCode::HostMismatch,
                store.span,
                format!(
                    "database {} is named on host \"{host}\" here and on \"{first}\" elsewhere",
                    store.name
                ),
            )),
            Some(_) => {}
            None => {
                hosts.insert(&store.name, host);
            }
        }
    }
}

/// Rules about one element on its own.
pub(crate) fn check_element(el: &Element, errors: &mut Vec<SchemeError>) {
    let is_datastore = matches!(el.kind, ElementKind::Datastore);
    let mut subscribed: BTreeSet<&StoreName> = BTreeSet::new();
    for store in el.subscriber_stores() {
        if store.name == el.owner.name {
            errors.push(SchemeError::new(
                ErrorCode::OwnerIsSubscriber,
                store.span,
                format!(
                    "database {} owns element {} and cannot also subscribe to it",
                    store.name,
                    el.name.as_str()
                ),
            ));
        } else if !subscribed.insert(&store.name) {
            errors.push(SchemeError::new(
                ErrorCode::SubscriberTwice,
                store.span,
                format!(
                    "database {} already subscribes to element {}",
                    store.name,
                    el.name.as_str()
                ),
            ));
        }
    }
    for clause in &el.subscribers {
        check_subscriber_clause(el, clause, errors);
    }
    if el.transmit == Some(Transmit::Nondurable) && !is_datastore {
        errors.push(SchemeError::new(
            ErrorCode::NondurableNotDatastore,
            el.transmit_span,
            "TRANSMIT NONDURABLE is allowed only on a DATASTORE element",
        ));
    }
    match &el.kind {
        ElementKind::Table {
            table, table_span, ..
        } => check_not_system(table, *table_span, errors),
        ElementKind::Sequence {
            sequence,
            sequence_span,
        } => check_not_system(sequence, *sequence_span, errors),
        ElementKind::Datastore => {}
    }
    if !is_datastore {
        for inc in &el.inclusions {
            errors.push(SchemeError::new(
                ErrorCode::InclusionNotDatastore,
                inc.span,
                format!(
                    "INCLUDE / EXCLUDE is allowed only on DATASTORE elements; {} is a {} element",
                    el.name.as_str(),
                    el.kind.keyword()
                ),
            ));
        }
        return;
    }
    check_inclusions(&el.inclusions, errors);
    let nothing = Coverage::Only(BTreeSet::new());
    if coverage(&el.inclusions, ObjectType::Table) == nothing
        && coverage(&el.inclusions, ObjectType::Sequence) == nothing
    {
        errors.push(SchemeError::new(
            ErrorCode::ExcludesEverything,
            el.name_span,
            format!(
                "DATASTORE element {} includes no table and no sequence",
                el.name.as_str()
            ),
        ));
    }
}

pub(crate) fn check_subscriber_clause(
    el: &Element,
    clause: &SubscriberClause,
    errors: &mut Vec<SchemeError>,
) {
    let is_sequence = matches!(el.kind, ElementKind::Sequence { .. });
    if let Some(rs) = clause.return_service {
        if is_sequence && rs != ReturnService::NoReturn {
            errors.push(SchemeError::new(
                ErrorCode::ReturnOnSequence,
                clause.return_span,
                format!(
                    "a return service cannot be set on SEQUENCE element {}",
                    el.name.as_str()
                ),
            ));
        }
        if el.owner_role == OwnerRole::Propagator && matches!(rs, ReturnService::Twosafe { .. }) {
            errors.push(SchemeError::new(
                ErrorCode::TwosafePropagator,
                clause.return_span,
                format!(
                    "RETURN TWOSAFE cannot be used on PROPAGATOR element {}",
                    el.name.as_str()
                ),
            ));
        }
    }
    if let Some(target) = &clause.target {
        if !matches!(el.kind, ElementKind::Table { .. }) {
            errors.push(SchemeError::new(
                ErrorCode::TargetNotOnTable,
                target.span,
                format!(
                    "AS target is allowed only on TABLE elements; {} is a {} element",
                    el.name.as_str(),
                    el.kind.keyword()
                ),
            ));
        }
        check_target(target, errors);
        if let (ElementKind::Table { table, .. }, TargetKind::BaseAggregate { .. }) =
            (&el.kind, &target.kind)
        {
            if target.into.as_ref().is_none_or(|into| into == table) {
                errors.push(SchemeError::new(
                    ErrorCode::InvalidTarget,
                    target.span,
                    format!(
                        "a BASE AGGREGATE of {table} needs INTO another table: the subscriber \
                         keeps the rows of {table} to aggregate them"
                    ),
                ));
            }
        }
    }
}

fn check_target(target: &TargetSpec, errors: &mut Vec<SchemeError>) {
    let (aggregates, group_by) = match &target.kind {
        TargetKind::BaseAggregate {
            aggregates,
            group_by,
        }
        | TargetKind::ChangeAggregate {
            aggregates,
            group_by,
        } => (aggregates, group_by),
        _ => return,
    };
    let mut columns = BTreeSet::new();
    for col in group_by {
        if !columns.insert(col) {
            errors.push(SchemeError::new(
                ErrorCode::InvalidTarget,
                target.span,
                format!("GROUP BY lists column {} twice", col.as_str()),
            ));
        }
    }
    for agg in aggregates {
        if let Some(alias) = &agg.alias {
            if !columns.insert(alias) {
                errors.push(SchemeError::new(
                    ErrorCode::InvalidTarget,
                    target.span,
                    format!(
                        "aggregate alias {} repeats a GROUP BY column or another alias",
                        alias.as_str()
                    ),
                ));
            }
        }
        if let Some(col) = agg.func.column() {
            if group_by.contains(col) {
                errors.push(SchemeError::new(
                    ErrorCode::InvalidTarget,
                    target.span,
                    format!("column {} is both grouped by and aggregated", col.as_str()),
                ));
            }
        }
    }
}

fn check_not_system(name: &QualName, span: Span, errors: &mut Vec<SchemeError>) {
    if let Some(owner) = &name.owner {
        if SYSTEM_OWNERS.contains(&owner.as_str()) {
            errors.push(SchemeError::new(
                ErrorCode::SystemObject,
                span,
                format!("{name} is a system object and cannot be replicated"),
            ));
        }
    }
}

/// TT8146 (two clauses for one object type), TT17001 (a name twice), TT8207.
pub(crate) fn check_inclusions(inclusions: &[Inclusion], errors: &mut Vec<SchemeError>) {
    let mut clause_of_type: BTreeMap<ObjectType, InclusionAction> = BTreeMap::new();
    for inc in inclusions {
        let mut seen_here = BTreeSet::new();
        for group in &inc.groups {
            if !seen_here.insert(group.object_type)
                || clause_of_type.contains_key(&group.object_type)
            {
                let what = match group.object_type {
                    ObjectType::Table => "TABLE",
                    ObjectType::Sequence => "SEQUENCE",
                };
                errors.push(SchemeError::new(
                    ErrorCode::InclusionTwice,
                    group.span,
                    format!("only one INCLUDE or EXCLUDE clause for {what} objects is allowed in an element"),
                ));
            }
            let mut names = BTreeSet::new();
            for obj in &group.names {
                if !names.insert(&obj.name) {
                    errors.push(SchemeError::new(
                        ErrorCode::IncludedTwice,
                        obj.span,
                        format!("{} is listed twice", obj.name),
                    ));
                }
                check_not_system(&obj.name, obj.span, errors);
            }
        }
        for group in &inc.groups {
            clause_of_type
                .entry(group.object_type)
                .or_insert(inc.action);
        }
    }
}

/// Which objects of one type a DATASTORE element covers, before looking at a catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// Every object of the type except these.
    AllExcept(BTreeSet<QualName>),
    /// Exactly these objects.
    Only(BTreeSet<QualName>),
}

impl Coverage {
    pub fn covers(&self, name: &QualName) -> bool {
        match self {
            Coverage::AllExcept(except) => !except.contains(name),
            Coverage::Only(only) => only.contains(name),
        }
    }

    /// Whether two coverages may share an object (without a catalog, "every object
    /// except ..." is assumed to overlap with another such set).
    pub fn overlaps(&self, other: &Coverage) -> bool {
        match (self, other) {
            (Coverage::AllExcept(_), Coverage::AllExcept(_)) => true,
            (Coverage::AllExcept(except), Coverage::Only(only))
            | (Coverage::Only(only), Coverage::AllExcept(except)) => {
                only.iter().any(|n| !except.contains(n))
            }
            (Coverage::Only(a), Coverage::Only(b)) => a.iter().any(|n| b.contains(n)),
        }
    }
}

/// What a DATASTORE element's INCLUDE / EXCLUDE clauses leave of `object_type`:
/// an INCLUDE of that type keeps exactly the listed objects, an EXCLUDE keeps all but
/// the listed ones, and a type without a clause is kept entirely unless the element has
/// an INCLUDE clause for the other type ("only the objects named in INCLUDE clauses are
/// replicated"). A list written empty (`INCLUDE TABLE`) is taken literally.
pub fn coverage(inclusions: &[Inclusion], object_type: ObjectType) -> Coverage {
    for inc in inclusions {
        if let Some(group) = inc.groups.iter().find(|g| g.object_type == object_type) {
            let names: BTreeSet<QualName> = group.names.iter().map(|n| n.name.clone()).collect();
            return match inc.action {
                InclusionAction::Include => Coverage::Only(names),
                InclusionAction::Exclude => Coverage::AllExcept(names),
            };
        }
    }
    if inclusions
        .iter()
        .any(|i| i.action == InclusionAction::Include)
    {
        Coverage::Only(BTreeSet::new())
    } else {
        Coverage::AllExcept(BTreeSet::new())
    }
}

/// TT8101 / TT8107: one database may own a given object in one element only.
fn check_ownership(elements: &[Element], errors: &mut Vec<SchemeError>) {
    let mut single: BTreeMap<(&StoreName, ObjectType, &QualName), &Element> = BTreeMap::new();
    for el in elements {
        let (object_type, name, span) = match &el.kind {
            ElementKind::Table {
                table, table_span, ..
            } => (ObjectType::Table, table, *table_span),
            ElementKind::Sequence {
                sequence,
                sequence_span,
            } => (ObjectType::Sequence, sequence, *sequence_span),
            ElementKind::Datastore => continue,
        };
        if let Some(first) = single.get(&(&el.owner.name, object_type, name)) {
            errors.push(SchemeError::new(
                ErrorCode::ElementNameDuplicate,
                span,
                format!(
                    "database {} already owns {name} in element {}",
                    el.owner.name,
                    first.name.as_str()
                ),
            ));
            continue;
        }
        single.insert((&el.owner.name, object_type, name), el);
        let covering = elements.iter().find(|ds| {
            matches!(ds.kind, ElementKind::Datastore)
                && ds.owner.name == el.owner.name
                && coverage(&ds.inclusions, object_type).covers(name)
        });
        if let Some(ds) = covering {
            errors.push(SchemeError::new(
                ErrorCode::DatastoreOverlap,
                span,
                format!(
                    "{name} is already covered by DATASTORE element {} of database {}",
                    ds.name.as_str(),
                    el.owner.name
                ),
            ));
        }
    }
    let datastores: Vec<&Element> = elements
        .iter()
        .filter(|e| matches!(e.kind, ElementKind::Datastore))
        .collect();
    for (i, later) in datastores.iter().enumerate() {
        let earlier = datastores[..i].iter().find(|first| {
            first.owner.name == later.owner.name
                && [ObjectType::Table, ObjectType::Sequence].iter().any(|&t| {
                    coverage(&first.inclusions, t).overlaps(&coverage(&later.inclusions, t))
                })
        });
        if let Some(first) = earlier {
            errors.push(SchemeError::new(
                ErrorCode::ElementNameDuplicate,
                later.name_span,
                format!(
                    "DATASTORE elements {} and {} of database {} cover the same objects",
                    first.name.as_str(),
                    later.name.as_str(),
                    later.owner.name
                ),
            ));
        }
    }
}

/// TT8176: every element over one table must configure conflict checking the same way.
fn check_conflict_settings(elements: &[Element], errors: &mut Vec<SchemeError>) {
    let mut first: BTreeMap<&QualName, (&Element, Option<&CheckConflicts>)> = BTreeMap::new();
    for el in elements {
        let ElementKind::Table {
            table,
            table_span,
            check,
        } = &el.kind
        else {
            continue;
        };
        // NO CHECK and no clause at all mean the same thing.
        let check = check.as_ref().filter(|c| **c != CheckConflicts::NoCheck);
        match first.get(table) {
            Some((other, other_check)) if *other_check != check => errors.push(SchemeError::new(
                ErrorCode::ConflictCheckMismatch,
                *table_span,
                format!(
                    "element {} checks conflicts on {table} differently from element {}",
                    el.name.as_str(),
                    other.name.as_str()
                ),
            )),
            Some(_) => {}
            None => {
                first.insert(table, (el, check));
            }
        }
    }
}

/// Whether element `source` may deliver (some of) the objects of `el` to its subscribers.
pub(crate) fn feeds(source: &Element, el: &Element) -> bool {
    match (&source.kind, &el.kind) {
        (ElementKind::Datastore, ElementKind::Datastore) => true,
        (ElementKind::Datastore, ElementKind::Table { table, .. }) => {
            coverage(&source.inclusions, ObjectType::Table).covers(table)
        }
        (ElementKind::Datastore, ElementKind::Sequence { sequence, .. }) => {
            coverage(&source.inclusions, ObjectType::Sequence).covers(sequence)
        }
        (ElementKind::Table { table: a, .. }, ElementKind::Table { table: b, .. }) => a == b,
        (ElementKind::Table { table, .. }, ElementKind::Datastore) => {
            coverage(&el.inclusions, ObjectType::Table).covers(table)
        }
        (ElementKind::Sequence { sequence: a, .. }, ElementKind::Sequence { sequence: b, .. }) => {
            a == b
        }
        (ElementKind::Sequence { sequence, .. }, ElementKind::Datastore) => {
            coverage(&el.inclusions, ObjectType::Sequence).covers(sequence)
        }
        _ => false,
    }
}

/// HW1003: a propagator forwards what it receives, so it must subscribe to the same
/// objects in some other element.
fn check_propagators(elements: &[Element], errors: &mut Vec<SchemeError>) {
    for el in elements
        .iter()
        .filter(|e| e.owner_role == OwnerRole::Propagator)
    {
        let fed = elements.iter().any(|src| {
            !std::ptr::eq(src, el)
                && src.subscriber_stores().any(|s| s.name == el.owner.name)
                && feeds(src, el)
        });
        if !fed {
            errors.push(SchemeError::new(
                ErrorCode::PropagatorWithoutSource,
                el.owner.span,
                format!(
                    "propagator {} of element {} does not subscribe to its objects in any element",
                    el.owner.name,
                    el.name.as_str()
                ),
            ));
        }
    }
}

fn element_stores(scheme: &Scheme) -> BTreeSet<&StoreName> {
    let mut names = BTreeSet::new();
    for el in &scheme.elements {
        names.insert(&el.owner.name);
        names.extend(el.subscriber_stores().map(|s| &s.name));
    }
    names
}

/// HW1002, TT8103, TT17035.
fn check_stores(scheme: &Scheme, errors: &mut Vec<SchemeError>) {
    let known = element_stores(scheme);
    let has_datastore = scheme
        .elements
        .iter()
        .any(|e| matches!(e.kind, ElementKind::Datastore));
    let mut given: BTreeSet<(&StoreName, &'static str)> = BTreeSet::new();
    for clause in &scheme.stores {
        if !known.contains(&clause.store.name) {
            errors.push(unknown_store(&clause.store, "STORE"));
        }
        for attr in &clause.attributes {
            if !given.insert((&clause.store.name, attr.attr.key())) {
                errors.push(SchemeError::new(
                    ErrorCode::StoreAttributeDuplicate,
                    attr.span,
                    format!(
                        "{} is already given for database {}",
                        attr.attr.key(),
                        clause.store.name
                    ),
                ));
            }
            if has_datastore
                && matches!(
                    attr.attr,
                    StoreAttr::ConflictReportingSuspendAt(_)
                        | StoreAttr::ConflictReportingResumeAt(_)
                )
            {
                errors.push(SchemeError::new(
                    ErrorCode::ConflictReportingDatastore,
                    attr.span,
                    "CONFLICT REPORTING is not allowed in a scheme with a DATASTORE element",
                ));
            }
        }
    }
}

fn unknown_store(store: &StoreRef, clause: &str) -> SchemeError {
    SchemeError::new(
        ErrorCode::UnknownStore,
        store.span,
        format!(
            "{clause} names database {}, which no element of the scheme uses",
            store.name
        ),
    )
}

/// HW1002, HW1004.
fn check_routes(scheme: &Scheme, errors: &mut Vec<SchemeError>) {
    let known = element_stores(scheme);
    let mut pairs = BTreeSet::new();
    for route in &scheme.routes {
        for store in [&route.master, &route.subscriber] {
            if !known.contains(&store.name) {
                errors.push(unknown_store(store, "ROUTE"));
            }
        }
        if !pairs.insert((&route.master.name, &route.subscriber.name)) {
            errors.push(SchemeError::new(
                ErrorCode::DuplicateRoute,
                route.span,
                format!(
                    "the route from {} to {} is defined twice",
                    route.master.name, route.subscriber.name
                ),
            ));
        }
        let mut addresses = BTreeSet::new();
        for a in &route.addresses {
            if !addresses.insert((a.side == RouteSide::MasterIp, a.host.as_str())) {
                errors.push(SchemeError::new(
                    ErrorCode::DuplicateRoute,
                    a.span,
                    format!("address \"{}\" is listed twice in this route", a.host),
                ));
            }
        }
    }
}
