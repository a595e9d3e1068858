//! The routing plan: who sends what to whom.
//!
//! Input: a valid [`Scheme`], the catalogs the stores have reported (tables as
//! [`TableDef`], sequences with their CYCLE flag) and which node is which store (a store
//! with no node has not joined yet). Output: one [`Link`] per (sender store, receiver
//! store) pair with the tables and sequences it carries, each with its element, origin,
//! return service and target table, plus both ends' STORE settings with TimesTen's
//! defaults filled in.
//!
//! ```text
//! master ──element──► subscriber                      origin = master
//! master ──element a──► propagator ──element b──► subscriber   origin kept = master
//! ```
//!
//! DATASTORE elements resolve INCLUDE / EXCLUDE against the owning store's catalog
//! (TT17000 for a name it lacks, TT17007 for a CYCLE sequence named explicitly, TT17008
//! as a warning for one left out silently, TT17002 when nothing remains). A transaction
//! is never routed back to its origin, which is what keeps bidirectional schemes from
//! echoing.

use std::collections::{BTreeMap, BTreeSet};

use hawser_core::{Ident, NodeId, QualName, TableDef};
use serde::{Deserialize, Serialize};

use crate::ast::*;
use crate::error::{ErrorCode, SchemeError};
use crate::validate::coverage;

/// A sequence as a store's catalog reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceInfo {
    pub name: QualName,
    /// Created with CYCLE: never replicated.
    pub cycle: bool,
}

/// What one store holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreCatalog {
    pub tables: Vec<TableDef>,
    pub sequences: Vec<SequenceInfo>,
}

/// The cluster as the routing plan sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Catalogs by store name; a store that has not reported one is absent.
    pub catalogs: BTreeMap<Ident, StoreCatalog>,
    /// Which node serves which store; a store that has not joined is absent.
    pub nodes: BTreeMap<Ident, NodeId>,
}

/// The STORE attributes of one store with defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreSettings {
    pub disable_return: Option<(DisableScope, u32)>,
    /// As written; `None` means "the return service's default" (ON for TWOSAFE, OFF
    /// for RECEIPT), which [`RoutedTable::return_when_stopped`] resolves.
    pub return_services_when_stopped: Option<bool>,
    /// `None`: follow the connection's durable-commit setting.
    pub durable_commit: Option<bool>,
    pub resume_return_ms: Option<u32>,
    /// Default 10 s; 0 = do not wait.
    pub return_wait_time_s: u32,
    /// Default NO ACTION.
    pub local_commit_action: LocalAction,
    /// Default OFF.
    pub compress_traffic: bool,
    /// Default ON: the cluster fails over what this store masters when it goes silent.
    pub failover: bool,
    /// `None`: assigned automatically.
    pub port: Option<u16>,
    /// Default 120 s.
    pub timeout_s: u32,
    /// Default 0 = no limit.
    pub fail_threshold: u32,
    /// Default 0 = never suspend.
    pub conflict_reporting_suspend_at: u32,
    pub conflict_reporting_resume_at: u32,
    /// Default RELAXED.
    pub table_definition_checking: TableDefinitionChecking,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            disable_return: None,
            return_services_when_stopped: None,
            durable_commit: None,
            resume_return_ms: None,
            return_wait_time_s: 10,
            local_commit_action: LocalAction::NoAction,
            compress_traffic: false,
            failover: true,
            port: None,
            timeout_s: 120,
            fail_threshold: 0,
            conflict_reporting_suspend_at: 0,
            conflict_reporting_resume_at: 0,
            table_definition_checking: TableDefinitionChecking::Relaxed,
        }
    }
}

impl StoreSettings {
    /// The settings the scheme gives `store`.
    pub fn of(scheme: &Scheme, store: &Ident) -> Self {
        let mut s = Self::default();
        let named = StoreName::Named(store.clone());
        for clause in scheme.stores.iter().filter(|c| c.store.name == named) {
            for a in &clause.attributes {
                match a.attr {
                    StoreAttr::DisableReturn { scope, failures } => {
                        s.disable_return = Some((scope, failures))
                    }
                    StoreAttr::ReturnServicesWhenStopped(on) => {
                        s.return_services_when_stopped = Some(on)
                    }
                    StoreAttr::DurableCommit(on) => s.durable_commit = Some(on),
                    StoreAttr::ResumeReturn(ms) => s.resume_return_ms = Some(ms),
                    StoreAttr::ReturnWaitTime(t) => s.return_wait_time_s = t,
                    StoreAttr::LocalCommitAction(a) => s.local_commit_action = a,
                    StoreAttr::CompressTraffic(on) => s.compress_traffic = on,
                    StoreAttr::Failover(on) => s.failover = on,
                    StoreAttr::Port(p) => s.port = Some(p),
                    StoreAttr::Timeout(t) => s.timeout_s = t,
                    StoreAttr::FailThreshold(n) => s.fail_threshold = n,
                    StoreAttr::ConflictReportingSuspendAt(n) => s.conflict_reporting_suspend_at = n,
                    StoreAttr::ConflictReportingResumeAt(n) => s.conflict_reporting_resume_at = n,
                    StoreAttr::TableDefinitionChecking(m) => s.table_definition_checking = m,
                }
            }
        }
        s
    }
}

/// A target table with its defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedTarget {
    /// USER COPY when none was written; a CCD's CONDENSED / COMPLETE always `Some`
    /// (default CONDENSED COMPLETE).
    pub kind: TargetKind,
    /// The table the receiver writes (the replicated table's name unless INTO says).
    pub into: QualName,
}

/// One table carried by a link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutedTable {
    pub element: Ident,
    pub table: QualName,
    /// The store where the transactions were first committed.
    pub origin: Ident,
    /// NO RETURN when none was written.
    pub return_service: ReturnService,
    /// RETURN SERVICES ... WHEN REPLICATION STOPPED in force for this table.
    pub return_when_stopped: bool,
    pub target: ResolvedTarget,
    pub check: Option<CheckConflicts>,
}

/// One sequence carried by a link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutedSequence {
    pub element: Ident,
    pub sequence: QualName,
    pub origin: Ident,
}

/// Everything one sender sends one receiver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub sender: Ident,
    pub sender_node: Option<NodeId>,
    pub receiver: Ident,
    pub receiver_node: Option<NodeId>,
    pub tables: Vec<RoutedTable>,
    pub sequences: Vec<RoutedSequence>,
    pub sender_settings: StoreSettings,
    pub receiver_settings: StoreSettings,
}

/// The routing plan of one scheme.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingPlan {
    /// Ordered by (sender, receiver).
    pub links: Vec<Link>,
    /// Non-fatal findings (TT17008).
    pub warnings: Vec<SchemeError>,
}

/// The objects one element replicates.
#[derive(Debug, Default)]
struct Objects {
    tables: BTreeSet<QualName>,
    sequences: BTreeSet<QualName>,
}

fn named(store: &StoreRef) -> Result<&Ident, SchemeError> {
    match &store.name {
        StoreName::Named(n) => Ok(n),
        StoreName::Local => Err(SchemeError::new(
            ErrorCode::UnresolvedSelf,
            store.span,
            "SELF names no particular store in a cluster-wide scheme; name the database",
        )),
    }
}

/// Computes the routing plan of `scheme` (which should have passed [`crate::validate`]).
pub fn plan(scheme: &Scheme, topology: &Topology) -> Result<RoutingPlan, Vec<SchemeError>> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let objects: Vec<Objects> = scheme
        .elements
        .iter()
        .map(|el| element_objects(el, topology, &mut errors, &mut warnings))
        .collect();
    for store in scheme
        .elements
        .iter()
        .flat_map(|e| std::iter::once(&e.owner).chain(e.subscriber_stores()))
    {
        if let Err(e) = named(store) {
            errors.push(e);
        }
    }
    if !errors.is_empty() {
        errors.sort_by_key(|e| e.span.start);
        return Err(errors);
    }
    let mut links: BTreeMap<(Ident, Ident), (Vec<RoutedTable>, Vec<RoutedSequence>)> =
        BTreeMap::new();
    for (i, el) in scheme.elements.iter().enumerate() {
        let sender = named(&el.owner).map_err(|e| vec![e])?;
        let sender_settings = StoreSettings::of(scheme, sender);
        for clause in &el.subscribers {
            let rs = clause.return_service.unwrap_or(ReturnService::NoReturn);
            let return_when_stopped = sender_settings
                .return_services_when_stopped
                .unwrap_or(matches!(rs, ReturnService::Twosafe { .. }));
            for store in &clause.stores {
                let receiver = named(store).map_err(|e| vec![e])?;
                let entry = links.entry((sender.clone(), receiver.clone())).or_default();
                for table in &objects[i].tables {
                    for origin in origins(scheme, &objects, i, ObjectType::Table, table) {
                        if &origin == receiver {
                            continue;
                        }
                        entry.0.push(RoutedTable {
                            element: el.name.clone(),
                            table: table.clone(),
                            origin,
                            return_service: rs,
                            return_when_stopped,
                            target: resolve_target(clause.target.as_ref(), table),
                            check: match &el.kind {
                                ElementKind::Table { check, .. } => {
                                    check.clone().filter(|c| *c != CheckConflicts::NoCheck)
                                }
                                _ => None,
                            },
                        });
                    }
                }
                for sequence in &objects[i].sequences {
                    for origin in origins(scheme, &objects, i, ObjectType::Sequence, sequence) {
                        if &origin == receiver {
                            continue;
                        }
                        entry.1.push(RoutedSequence {
                            element: el.name.clone(),
                            sequence: sequence.clone(),
                            origin,
                        });
                    }
                }
            }
        }
    }
    let links = links
        .into_iter()
        .filter(|(_, (t, s))| !t.is_empty() || !s.is_empty())
        .map(|((sender, receiver), (tables, sequences))| Link {
            sender_node: topology.nodes.get(&sender).copied(),
            receiver_node: topology.nodes.get(&receiver).copied(),
            sender_settings: StoreSettings::of(scheme, &sender),
            receiver_settings: StoreSettings::of(scheme, &receiver),
            sender,
            receiver,
            tables,
            sequences,
        })
        .collect();
    Ok(RoutingPlan { links, warnings })
}

fn resolve_target(spec: Option<&TargetSpec>, table: &QualName) -> ResolvedTarget {
    let Some(spec) = spec else {
        return ResolvedTarget {
            kind: TargetKind::UserCopy,
            into: table.clone(),
        };
    };
    let kind = match &spec.kind {
        TargetKind::Ccd {
            condensed,
            complete,
        } => TargetKind::Ccd {
            condensed: Some(condensed.unwrap_or(true)),
            complete: Some(complete.unwrap_or(true)),
        },
        other => other.clone(),
    };
    ResolvedTarget {
        kind,
        into: spec.into.clone().unwrap_or_else(|| table.clone()),
    }
}

/// The stores where the transactions on `name` that element `i` carries originate:
/// its master, or — for a propagator — the origins of what the propagator receives.
fn origins(
    scheme: &Scheme,
    objects: &[Objects],
    i: usize,
    object_type: ObjectType,
    name: &QualName,
) -> BTreeSet<Ident> {
    let mut out = BTreeSet::new();
    let mut visited = BTreeSet::new();
    collect_origins(
        scheme,
        objects,
        i,
        object_type,
        name,
        &mut visited,
        &mut out,
    );
    out
}

fn collect_origins(
    scheme: &Scheme,
    objects: &[Objects],
    i: usize,
    object_type: ObjectType,
    name: &QualName,
    visited: &mut BTreeSet<usize>,
    out: &mut BTreeSet<Ident>,
) {
    if !visited.insert(i) {
        return;
    }
    let el = &scheme.elements[i];
    let StoreName::Named(owner) = &el.owner.name else {
        return;
    };
    if el.owner_role == OwnerRole::Master {
        out.insert(owner.clone());
        return;
    }
    for (j, src) in scheme.elements.iter().enumerate() {
        let carries = match object_type {
            ObjectType::Table => objects[j].tables.contains(name),
            ObjectType::Sequence => objects[j].sequences.contains(name),
        };
        if j != i && carries && src.subscriber_stores().any(|s| s.name == el.owner.name) {
            collect_origins(scheme, objects, j, object_type, name, visited, out);
        }
    }
}

fn element_objects(
    el: &Element,
    topology: &Topology,
    errors: &mut Vec<SchemeError>,
    warnings: &mut Vec<SchemeError>,
) -> Objects {
    let mut objects = Objects::default();
    let catalog = match &el.owner.name {
        StoreName::Named(n) => topology.catalogs.get(n),
        StoreName::Local => None,
    };
    match &el.kind {
        ElementKind::Table { table, .. } => {
            objects.tables.insert(table.clone());
        }
        ElementKind::Sequence {
            sequence,
            sequence_span,
        } => {
            let cycles =
                catalog.is_some_and(|c| c.sequences.iter().any(|s| &s.name == sequence && s.cycle));
            if cycles {
                errors.push(SchemeError::new(
                    ErrorCode::CycleSequence,
                    *sequence_span,
                    format!("sequence {sequence} was created with CYCLE and cannot be replicated"),
                ));
            }
            objects.sequences.insert(sequence.clone());
        }
        ElementKind::Datastore => {
            let Some(catalog) = catalog else {
                errors.push(SchemeError::new(
                    ErrorCode::MissingCatalog,
                    el.owner.span,
                    format!(
                        "DATASTORE element {} needs the catalog of {}, which has not reported one",
                        el.name.as_str(),
                        el.owner.name
                    ),
                ));
                return objects;
            };
            // Every name in INCLUDE / EXCLUDE must exist; a CYCLE sequence named there is an error.
            for inc in &el.inclusions {
                for group in &inc.groups {
                    for obj in &group.names {
                        let (exists, cycle) = match group.object_type {
                            ObjectType::Table => {
                                (catalog.tables.iter().any(|t| t.name == obj.name), false)
                            }
                            ObjectType::Sequence => {
                                match catalog.sequences.iter().find(|s| s.name == obj.name) {
                                    Some(s) => (true, s.cycle),
                                    None => (false, false),
                                }
                            }
                        };
                        if !exists {
                            errors.push(SchemeError::new(
                                ErrorCode::IncludedObjectMissing,
                                obj.span,
                                format!("{} does not exist in {}", obj.name, el.owner.name),
                            ));
                        } else if cycle && inc.action == InclusionAction::Include {
                            errors.push(SchemeError::new(
                                ErrorCode::CycleSequence,
                                obj.span,
                                format!(
                                    "sequence {} was created with CYCLE and cannot be replicated",
                                    obj.name
                                ),
                            ));
                        }
                    }
                }
            }
            let tables = coverage(&el.inclusions, ObjectType::Table);
            let sequences = coverage(&el.inclusions, ObjectType::Sequence);
            objects.tables = catalog
                .tables
                .iter()
                .filter(|t| tables.covers(&t.name))
                .map(|t| t.name.clone())
                .collect();
            for s in catalog
                .sequences
                .iter()
                .filter(|s| sequences.covers(&s.name))
            {
                if s.cycle {
                    warnings.push(SchemeError::new(
                        ErrorCode::CycleSequenceSkipped,
                        el.name_span,
                        format!(
                            "element {} leaves out sequence {}, created with CYCLE",
                            el.name.as_str(),
                            s.name
                        ),
                    ));
                } else {
                    objects.sequences.insert(s.name.clone());
                }
            }
            // An empty database may well have an element over all of it; only clauses
            // that leave nothing are a mistake.
            if !el.inclusions.is_empty()
                && objects.tables.is_empty()
                && objects.sequences.is_empty()
            {
                errors.push(SchemeError::new(
                    ErrorCode::ExcludesEverything,
                    el.name_span,
                    format!(
                        "DATASTORE element {} replicates nothing of {}'s catalog",
                        el.name.as_str(),
                        el.owner.name
                    ),
                ));
            }
        }
    }
    objects
}
