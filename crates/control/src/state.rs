//! The cluster state machine: what the Raft group agrees on, and how commands change it.
//!
//! This module is pure (no I/O, no clock, no randomness): [`validate`] says whether a
//! [`Command`] fits a [`ClusterState`], and [`apply`] changes the state deterministically,
//! so every replica that applies the same log reaches the same state. The Raft glue in
//! [`crate::store`] calls [`apply`] for every committed entry; the node calls [`validate`]
//! before it proposes, so that bad input is refused before it costs a log entry. Because
//! another command may commit between the two, [`apply`] validates again and answers
//! [`Response::Rejected`] instead of changing anything.
//!
//! ```text
//!  ClusterState
//!  ├── nodes: NodeId ─► NodeInfo (store name, host, gRPC / HTTP address, voter?)
//!  └── schemes: QualName ─► SchemeState
//!        ├── scheme: the effective AST (DDL and role changes applied), version
//!        ├── elements: name ─► ElementState (epoch, epoch history)
//!        ├── receivers: subscriber store ─► START | PAUSE | STOP | FAILED
//!        └── return services: subscriber store ─► ENABLED | DISABLED
//! ```
//!
//! The scheme kept is the *effective* one: a master change ([`Command::SetMaster`]) is
//! applied to the AST as `ALTER ELEMENT ... SET MASTER` would be, so printing it shows the
//! current master, and a later ALTER REPLICATION applies to what people see. The element
//! state remembers every master change as an [`EpochRecord`] with its fork point.

use std::collections::{BTreeMap, BTreeSet};

use hawser_core::{Epoch, Gtid, Ident, NodeId, QualName};
use hawser_scheme::ast::{
    AlterOp, AlterReplication, Element, ElementAction, ElementKind, ElementTarget, OwnerRole,
    Scheme, StoreName, StoreRef,
};
use hawser_scheme::route::StoreCatalog;
use hawser_scheme::{SchemeError, Span};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One member of the cluster as the registry knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    /// The database name schemes use for this node (`masterds` in `masterds ON "host"`).
    pub store: Ident,
    /// The advertised host name, matched against `ON "host"` in schemes.
    pub host: String,
    /// `host:port` of the node's gRPC server (clients, data plane and Raft peers).
    pub grpc_addr: String,
    /// `host:port` of the node's HTTP server (health, metrics, status).
    pub http_addr: String,
    /// Whether the node votes in the Raft group (else it is a learner or not yet a
    /// member). Maintained from the membership entries of the Raft log.
    pub voter: bool,
}

/// The state of a receiver (a subscriber store) of one scheme, as `ttRepAdmin -receiver
/// -state` sets it in TimesTen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ReceiverState {
    /// Replicating (the default).
    Start,
    /// Not sent to; the sender keeps log for it.
    Pause,
    /// Not sent to; the sender does not keep log for it.
    Stop,
    /// Fell past FAILTHRESHOLD; needs a duplicate before it can receive again.
    Failed,
}

impl ReceiverState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiverState::Start => "START",
            ReceiverState::Pause => "PAUSE",
            ReceiverState::Stop => "STOP",
            ReceiverState::Failed => "FAILED",
        }
    }
}

/// Whether commits currently wait for a subscriber's return service (DISABLE RETURN
/// turns it off after repeated timeouts, RESUME RETURN turns it back on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ReturnServiceState {
    Enabled,
    Disabled,
}

/// One master change of an element.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    pub epoch: Epoch,
    /// The store that masters (or propagates) the element from this epoch on.
    pub master: Ident,
    /// The node of that store when the change was made, if it had registered.
    pub node: Option<NodeId>,
    /// The high-water of the old master's origin that the new master had when it took
    /// over; `None` for the first epoch and for changes made by DDL.
    pub fork_point: Option<Gtid>,
    /// For a failover (with a fork point): the cluster's failover era it started
    /// ([`ClusterState::era`]). The deposed master's commits past the fork point carry
    /// an older era: that is what tells them from its later ones.
    #[serde(default)]
    pub era: Option<u64>,
}

/// The roles of one element beyond what its AST says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElementState {
    /// The current fencing token; grows by one at every master change.
    pub epoch: Epoch,
    /// Every epoch of the element, oldest first; the last one is the current one.
    pub history: Vec<EpochRecord>,
}

impl ElementState {
    /// The current epoch's record.
    pub fn current(&self) -> &EpochRecord {
        // Never empty: created with one record, records are only pushed.
        &self.history[self.history.len() - 1]
    }
}

/// One replication scheme as the cluster holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemeState {
    /// The effective scheme: as created, with every ALTER and role change applied.
    pub scheme: Scheme,
    /// Grows by one with every change to the scheme or its roles.
    pub version: u64,
    /// Per element name.
    pub elements: BTreeMap<Ident, ElementState>,
    /// Receiver states that differ from START, per subscriber store.
    pub receivers: BTreeMap<Ident, ReceiverState>,
    /// Return services that are disabled, per subscriber store.
    pub return_services: BTreeMap<Ident, ReturnServiceState>,
}

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

/// Everything the Raft group agrees on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    pub nodes: BTreeMap<NodeId, NodeInfo>,
    #[serde(with = "pairs")]
    pub schemes: BTreeMap<QualName, SchemeState>,
    /// Grows by one with every command applied (rejected ones too), so watchers can tell
    /// states apart cheaply.
    pub version: u64,
    /// The catalog each store last reported ([`Command::ReportCatalog`]): what a node
    /// plans another store's DATASTORE elements from. Absent for a store that has not
    /// reported (and in states written before reports existed).
    #[serde(default, with = "pairs")]
    pub catalogs: BTreeMap<Ident, StoreCatalog>,
    /// The failover era: grows by one with every failover (a [`Command::SetMaster`]
    /// with a fork point), whatever the element. Every node stamps the log records of
    /// its own commits with the era it has applied, so a commit made by a master that
    /// had not yet heard of the failover that deposed it carries an older era than any
    /// commit made since, by anyone.
    #[serde(default)]
    pub era: u64,
    /// The cluster's id: the node id of the node that created it (the first one
    /// registered; node ids are random), so two clusters never share one. Every peer
    /// call carries it and a node of another cluster refuses the call. 0 in states
    /// written before it existed, which check nothing by it.
    #[serde(default)]
    pub cluster_id: u64,
    /// Automatic failover paused for the whole cluster by an operator (`hawser failover
    /// pause`, Patroni's maintenance mode): silent masters are reported, not replaced,
    /// whichever node leads. `None` (the default): failover is automatic.
    #[serde(default)]
    pub failover_pause: Option<FailoverPause>,
}

/// Why and since when automatic failover is paused ([`ClusterState::failover_pause`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverPause {
    /// The operator's words; may be empty.
    pub reason: String,
    /// Milliseconds since the Unix epoch, by the clock of the node that proposed the
    /// pause: shown to operators, never compared.
    pub since_unix_ms: u64,
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

/// Who owns an element now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MasterView<'a> {
    pub store: &'a Ident,
    pub node: Option<NodeId>,
    pub role: OwnerRole,
    pub epoch: Epoch,
}

/// A change to the cluster state. Every command is validated against the state before
/// it is proposed and again when it is applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Adds a node to the registry, or updates the addresses of a registered one (a node
    /// restarted on another address keeps its id and store name).
    RegisterNode(NodeInfo),
    /// Takes a node out of the registry. Refused while the node masters an element.
    RemoveNode { node: NodeId },
    /// `CREATE REPLICATION`.
    CreateScheme { scheme: Scheme },
    /// `ALTER REPLICATION`. A change of owner (SET MASTER / SET PROPAGATOR) starts a new
    /// epoch of the element, with no fork point.
    AlterScheme { alter: AlterReplication },
    /// `DROP REPLICATION`.
    DropScheme { name: QualName },
    /// Failover or switchover: `node` masters (or propagates) `element` from `epoch` on,
    /// which must be the element's current epoch plus one. With a fork point (a
    /// failover) the deposed master's receiver is STOPPED and its return service
    /// DISABLED in the same entry, so no commit on the new master waits for it.
    SetMaster {
        scheme: QualName,
        element: Ident,
        node: NodeId,
        epoch: Epoch,
        fork_point: Option<Gtid>,
    },
    /// Sets the state of `store` as a receiver of `scheme`.
    SetReceiverState {
        scheme: QualName,
        store: Ident,
        state: ReceiverState,
    },
    /// Enables or disables the return service of `store` in `scheme`.
    SetReturnServiceState {
        scheme: QualName,
        store: Ident,
        state: ReturnServiceState,
    },
    /// The tables and sequences `store` holds now, reported by its node whenever they
    /// change. Refused for a store no registered node holds.
    ReportCatalog { store: Ident, catalog: StoreCatalog },
    /// Pauses automatic failover cluster-wide (`Some`) or resumes it (`None`). Always
    /// accepted; pausing a paused cluster replaces the reason.
    SetFailoverPause { pause: Option<FailoverPause> },
}

impl Command {
    /// The command for one parsed CREATE / ALTER / DROP REPLICATION statement.
    pub fn from_statement(statement: hawser_scheme::Statement) -> Command {
        match statement {
            hawser_scheme::Statement::Create(scheme) => Command::CreateScheme { scheme },
            hawser_scheme::Statement::Alter(alter) => Command::AlterScheme { alter },
            hawser_scheme::Statement::Drop(drop) => Command::DropScheme { name: drop.name },
        }
    }

    /// The commands for DDL text (one per statement), or the first syntax error.
    pub fn from_ddl(text: &str) -> Result<Vec<Command>, ControlError> {
        let statements = hawser_scheme::parse(text).map_err(|e| ControlError::Invalid(vec![e]))?;
        Ok(statements
            .into_iter()
            .map(Command::from_statement)
            .collect())
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::RegisterNode(_) => "register_node",
            Command::RemoveNode { .. } => "remove_node",
            Command::CreateScheme { .. } => "create_scheme",
            Command::AlterScheme { .. } => "alter_scheme",
            Command::DropScheme { .. } => "drop_scheme",
            Command::SetMaster { .. } => "set_master",
            Command::SetReceiverState { .. } => "set_receiver_state",
            Command::SetReturnServiceState { .. } => "set_return_service_state",
            Command::ReportCatalog { .. } => "report_catalog",
            Command::SetFailoverPause { .. } => "set_failover_pause",
        }
    }
}

/// What applying one log entry produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// An entry without a command (a leader's blank entry, a membership change).
    Empty,
    /// The command changed the state; `version` is the cluster state's version after it.
    Applied { version: u64 },
    /// The command did not fit the state it was applied to; nothing changed.
    Rejected(ControlError),
}

/// Why a command does not fit the cluster state.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum ControlError {
    #[error("node {0} is not registered")]
    UnknownNode(NodeId),
    /// Another member already has this id with another store name, or this store name
    /// with another id.
    #[error(
        "node {node} with store {store} clashes with member {existing} (store {existing_store})"
    )]
    IdentityClash {
        node: NodeId,
        store: Ident,
        existing: NodeId,
        existing_store: Ident,
    },
    #[error("node {node} masters element {element} of scheme {scheme}; move the role first")]
    NodeHoldsRole {
        node: NodeId,
        scheme: QualName,
        element: Ident,
    },
    #[error("no registered node holds store {0}")]
    UnknownStore(Ident),
    #[error("replication scheme {0} already exists")]
    SchemeExists(QualName),
    #[error("replication scheme {0} does not exist")]
    UnknownScheme(QualName),
    #[error("replication scheme {scheme} has no element {element}")]
    UnknownElement { scheme: QualName, element: Ident },
    /// The scheme checker's findings (syntax, restrictions, an ALTER that does not fit).
    #[error("{}", join(.0))]
    Invalid(Vec<SchemeError>),
    /// `SELF` names the database running the statement; the node must replace it with
    /// its own store name before proposing.
    #[error("scheme {0} names SELF, which the cluster cannot resolve")]
    UnresolvedSelf(QualName),
    #[error("element {element} of scheme {scheme} is at epoch {current}; epoch {proposed} is not the next one")]
    StaleEpoch {
        scheme: QualName,
        element: Ident,
        current: Epoch,
        proposed: Epoch,
    },
    #[error("store {store} does not subscribe to element {element} of scheme {scheme}")]
    NotSubscriber {
        scheme: QualName,
        element: Ident,
        store: Ident,
    },
    #[error("store {store} is not a subscriber of scheme {scheme}")]
    NotSchemeSubscriber { scheme: QualName, store: Ident },
}

fn join(errors: &[SchemeError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether `cmd` can be applied to `state`.
pub fn validate(state: &ClusterState, cmd: &Command) -> Result<(), ControlError> {
    plan(state, cmd).map(|_| ())
}

/// Applies `cmd` to `state`. Deterministic: the same state and command give the same
/// result on every replica. A command that does not fit changes nothing but the
/// state's version and is answered with [`Response::Rejected`].
pub fn apply(state: &mut ClusterState, cmd: &Command) -> Response {
    state.version += 1;
    match plan(state, cmd) {
        Ok(change) => {
            change.commit(state);
            Response::Applied {
                version: state.version,
            }
        }
        Err(e) => Response::Rejected(e),
    }
}

/// A validated change, computed from the state without touching it.
enum Change {
    PutNode(NodeInfo),
    RemoveNode(NodeId),
    PutScheme(SchemeState),
    /// A failover: the scheme, and the next era.
    Failover(SchemeState),
    DropScheme(QualName),
    PutCatalog(Ident, StoreCatalog),
    SetFailoverPause(Option<FailoverPause>),
}

impl Change {
    fn commit(self, state: &mut ClusterState) {
        match self {
            Change::PutNode(n) => {
                if state.cluster_id == 0 && state.nodes.is_empty() {
                    state.cluster_id = n.id.0;
                }
                state.nodes.insert(n.id, n);
            }
            Change::RemoveNode(id) => {
                if let Some(node) = state.nodes.remove(&id) {
                    state.catalogs.remove(&node.store);
                }
            }
            Change::PutCatalog(store, catalog) => {
                state.catalogs.insert(store, catalog);
            }
            Change::PutScheme(s) => {
                state.schemes.insert(s.scheme.name.clone(), s);
            }
            Change::Failover(s) => {
                state.era += 1;
                state.schemes.insert(s.scheme.name.clone(), s);
            }
            Change::DropScheme(name) => {
                state.schemes.remove(&name);
            }
            Change::SetFailoverPause(pause) => {
                state.failover_pause = pause;
            }
        }
    }
}

fn plan(state: &ClusterState, cmd: &Command) -> Result<Change, ControlError> {
    match cmd {
        Command::RegisterNode(info) => register_node(state, info),
        Command::RemoveNode { node } => remove_node(state, *node),
        Command::CreateScheme { scheme } => create_scheme(state, scheme),
        Command::AlterScheme { alter } => alter_scheme(state, alter),
        Command::DropScheme { name } => {
            scheme(state, name)?;
            Ok(Change::DropScheme(name.clone()))
        }
        Command::SetMaster {
            scheme,
            element,
            node,
            epoch,
            fork_point,
        } => set_master(state, scheme, element, *node, *epoch, *fork_point),
        Command::SetReceiverState {
            scheme: name,
            store,
            state: rs,
        } => {
            let mut s = subscribed_scheme(state, name, store)?;
            if *rs == ReceiverState::Start {
                // A master deposed by a failover had its return service disabled with
                // its receiver stopped, only so that nothing waited for it while away:
                // started again, commits wait for it as its subscription says, and the
                // failover choice must count it a holder of what they acknowledge.
                if s.is_deposed(state, store) {
                    s.return_services.remove(store);
                }
                s.receivers.remove(store);
            } else {
                s.receivers.insert(store.clone(), *rs);
            }
            s.version += 1;
            Ok(Change::PutScheme(s))
        }
        Command::SetReturnServiceState {
            scheme: name,
            store,
            state: rs,
        } => {
            let mut s = subscribed_scheme(state, name, store)?;
            if *rs == ReturnServiceState::Enabled {
                s.return_services.remove(store);
            } else {
                s.return_services.insert(store.clone(), *rs);
            }
            s.version += 1;
            Ok(Change::PutScheme(s))
        }
        Command::ReportCatalog { store, catalog } => {
            if state.node_by_store(store).is_none() {
                return Err(ControlError::UnknownStore(store.clone()));
            }
            Ok(Change::PutCatalog(store.clone(), catalog.clone()))
        }
        Command::SetFailoverPause { pause } => Ok(Change::SetFailoverPause(pause.clone())),
    }
}

fn register_node(state: &ClusterState, info: &NodeInfo) -> Result<Change, ControlError> {
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

fn remove_node(state: &ClusterState, id: NodeId) -> Result<Change, ControlError> {
    let node = state.nodes.get(&id).ok_or(ControlError::UnknownNode(id))?;
    for (name, s) in &state.schemes {
        for el in &s.scheme.elements {
            if named(&el.owner) == Some(&node.store) {
                return Err(ControlError::NodeHoldsRole {
                    node: id,
                    scheme: name.clone(),
                    element: el.name.clone(),
                });
            }
        }
    }
    Ok(Change::RemoveNode(id))
}

fn create_scheme(state: &ClusterState, scheme: &Scheme) -> Result<Change, ControlError> {
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

fn alter_scheme(state: &ClusterState, alter: &AlterReplication) -> Result<Change, ControlError> {
    let old = scheme(state, &alter.name)?;
    let next =
        hawser_scheme::apply(&old.scheme, alter).map_err(|e| ControlError::Invalid(vec![e]))?;
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
    Ok(Change::PutScheme(s))
}

fn set_master(
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

fn scheme<'a>(state: &'a ClusterState, name: &QualName) -> Result<&'a SchemeState, ControlError> {
    state
        .schemes
        .get(name)
        .ok_or_else(|| ControlError::UnknownScheme(name.clone()))
}

/// A copy of scheme `name` after checking that `store` subscribes to it.
fn subscribed_scheme(
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

/// The store name of a reference, `None` for `SELF`.
fn named(store: &StoreRef) -> Option<&Ident> {
    match &store.name {
        StoreName::Named(n) => Some(n),
        StoreName::Local => None,
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

/// Serializes a map with non-string keys as a list of pairs, so JSON can hold it.
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K, V, S>(map: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error>
    where
        K: Serialize,
        V: Serialize,
        S: Serializer,
    {
        s.collect_seq(map.iter())
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEME: &str = r#"
        CREATE REPLICATION r1
        ELEMENT e TABLE tab
          MASTER masterds ON "server1"
          SUBSCRIBER subscriber1 ON "server2", subscriber2 ON "server3"
          RETURN RECEIPT
        STORE masterds ON "server1" RETURN WAIT TIME 30;
    "#;

    fn node(id: u64, store: &str) -> NodeInfo {
        NodeInfo {
            id: NodeId(id),
            store: Ident::unquoted(store),
            host: format!("server{id}"),
            grpc_addr: format!("10.0.0.{id}:7000"),
            http_addr: format!("10.0.0.{id}:8000"),
            voter: false,
        }
    }

    fn ddl(text: &str) -> Command {
        let mut cmds = Command::from_ddl(text).unwrap();
        assert_eq!(cmds.len(), 1);
        cmds.remove(0)
    }

    fn must_apply(state: &mut ClusterState, cmd: Command) {
        validate(state, &cmd).unwrap();
        let resp = apply(state, &cmd);
        assert!(matches!(resp, Response::Applied { .. }), "{resp:?}");
    }

    fn cluster() -> ClusterState {
        let mut st = ClusterState::default();
        for (id, store) in [(1, "masterds"), (2, "subscriber1"), (3, "subscriber2")] {
            must_apply(&mut st, Command::RegisterNode(node(id, store)));
        }
        must_apply(&mut st, ddl(SCHEME));
        st
    }

    fn r1() -> QualName {
        QualName::bare("r1")
    }

    fn e() -> Ident {
        Ident::unquoted("e")
    }

    #[test]
    fn the_cluster_id_is_the_first_registered_node_and_never_changes() {
        let mut st = cluster();
        assert_eq!(st.cluster_id, 1);
        must_apply(&mut st, Command::RemoveNode { node: NodeId(3) });
        must_apply(&mut st, Command::RegisterNode(node(4, "other")));
        assert_eq!(st.cluster_id, 1);
        // A state written before the id existed reads as 0, and stays so.
        let mut old: ClusterState =
            serde_json::from_str(r#"{"nodes":{},"schemes":[],"version":3}"#).unwrap();
        assert_eq!(old.cluster_id, 0);
        old.nodes.insert(NodeId(5), node(5, "x"));
        must_apply(&mut old, Command::RegisterNode(node(6, "y")));
        assert_eq!(old.cluster_id, 0);
    }

    #[test]
    fn a_new_scheme_starts_at_epoch_zero_with_its_master() {
        let st = cluster();
        let m = st.master_of(&r1(), &e()).unwrap();
        assert_eq!(m.store.as_str(), "masterds");
        assert_eq!(m.node, Some(NodeId(1)));
        assert_eq!(m.epoch, Epoch(0));
        assert_eq!(st.schemes[&r1()].version, 1);
        assert_eq!(st.version, 4);
    }

    #[test]
    fn set_master_swaps_roles_and_records_the_fork_point() {
        let mut st = cluster();
        let fork = Some(Gtid::new(NodeId(1), 41));
        must_apply(
            &mut st,
            Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: NodeId(2),
                epoch: Epoch(1),
                fork_point: fork,
            },
        );
        let m = st.master_of(&r1(), &e()).unwrap();
        assert_eq!(
            (m.store.as_str(), m.node, m.epoch),
            ("subscriber1", Some(NodeId(2)), Epoch(1))
        );
        let s = &st.schemes[&r1()];
        let history = &s.elements[&e()].history;
        assert_eq!(history.len(), 2);
        assert_eq!(history[1].fork_point, fork);
        assert_eq!(
            (history[1].era, st.era),
            (Some(1), 1),
            "a failover starts an era"
        );
        assert_eq!(history[0].master.as_str(), "masterds");
        // The effective scheme shows the new master, the old one now subscribes.
        let text = s.ddl();
        assert!(text.contains("MASTER subscriber1"), "{text}");
        assert!(text.contains("SUBSCRIBER masterds"), "{text}");
        assert_eq!(s.version, 2);
        // The deposed master gets nothing and holds back no commit until it rejoins.
        let masterds = Ident::unquoted("masterds");
        assert_eq!(s.receiver_state(&masterds), ReceiverState::Stop);
        assert_eq!(
            s.return_service_state(&masterds),
            ReturnServiceState::Disabled
        );
        assert!(s.is_deposed(&st, &masterds));
        // Started again once it has rejoined: commits wait for it as its subscription
        // says, in the same entry, so the failover choice and the data plane agree.
        let s = s.clone();
        must_apply(
            &mut st,
            Command::SetReceiverState {
                scheme: r1(),
                store: masterds.clone(),
                state: ReceiverState::Start,
            },
        );
        let started = &st.schemes[&r1()];
        assert_eq!(started.receiver_state(&masterds), ReceiverState::Start);
        assert_eq!(
            started.return_service_state(&masterds),
            ReturnServiceState::Enabled
        );
        assert!(!started.is_deposed(&st, &masterds));
        // A return service disabled by hand stays disabled when the receiver starts.
        let sub2 = Ident::unquoted("subscriber2");
        assert!(!s.is_deposed(&st, &sub2));
        for cmd in [
            Command::SetReturnServiceState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReturnServiceState::Disabled,
            },
            Command::SetReceiverState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReceiverState::Stop,
            },
            Command::SetReceiverState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReceiverState::Start,
            },
        ] {
            must_apply(&mut st, cmd);
        }
        assert_eq!(
            st.schemes[&r1()].return_service_state(&sub2),
            ReturnServiceState::Disabled
        );
    }

    #[test]
    fn a_switchover_without_fork_point_leaves_the_old_master_receiving() {
        let mut st = cluster();
        must_apply(
            &mut st,
            Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: NodeId(2),
                epoch: Epoch(1),
                fork_point: None,
            },
        );
        let s = &st.schemes[&r1()];
        assert!(s.receivers.is_empty() && s.return_services.is_empty());
        assert_eq!(st.era, 0, "no failover, no new era");
    }

    #[test]
    fn set_master_refuses_a_stale_or_skipped_epoch() {
        let mut st = cluster();
        for epoch in [0, 2] {
            let cmd = Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: NodeId(2),
                epoch: Epoch(epoch),
                fork_point: None,
            };
            assert!(matches!(
                validate(&st, &cmd),
                Err(ControlError::StaleEpoch { .. })
            ));
            let before = st.clone();
            let resp = apply(&mut st, &cmd);
            assert!(matches!(
                resp,
                Response::Rejected(ControlError::StaleEpoch { .. })
            ));
            assert_eq!(
                st.schemes, before.schemes,
                "a rejected command changes nothing"
            );
        }
    }

    #[test]
    fn set_master_refuses_a_node_that_does_not_subscribe() {
        let mut st = cluster();
        must_apply(&mut st, Command::RegisterNode(node(4, "other")));
        let cmd = Command::SetMaster {
            scheme: r1(),
            element: e(),
            node: NodeId(4),
            epoch: Epoch(1),
            fork_point: None,
        };
        assert!(matches!(
            validate(&st, &cmd),
            Err(ControlError::NotSubscriber { .. })
        ));
        let cmd = Command::SetMaster {
            scheme: r1(),
            element: e(),
            node: NodeId(9),
            epoch: Epoch(1),
            fork_point: None,
        };
        assert_eq!(
            validate(&st, &cmd),
            Err(ControlError::UnknownNode(NodeId(9)))
        );
    }

    #[test]
    fn alter_set_master_by_ddl_starts_a_new_epoch_without_fork_point() {
        let mut st = cluster();
        must_apply(
            &mut st,
            ddl("ALTER REPLICATION r1 ALTER ELEMENT * IN masterds SET MASTER subscriber2;"),
        );
        let es = &st.schemes[&r1()].elements[&e()];
        assert_eq!(es.epoch, Epoch(1));
        assert_eq!(es.current().master.as_str(), "subscriber2");
        assert_eq!(es.current().node, Some(NodeId(3)));
        assert_eq!(es.current().fork_point, None);
    }

    #[test]
    fn alter_that_keeps_the_master_keeps_the_epoch_and_follows_renames() {
        let mut st = cluster();
        must_apply(
            &mut st,
            Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: NodeId(3),
                epoch: Epoch(1),
                fork_point: None,
            },
        );
        must_apply(
            &mut st,
            ddl("ALTER REPLICATION r1 ALTER ELEMENT e SET NAME f;"),
        );
        let s = &st.schemes[&r1()];
        assert!(!s.elements.contains_key(&e()));
        let f = &s.elements[&Ident::unquoted("f")];
        assert_eq!(f.epoch, Epoch(1));
        assert_eq!(f.history.len(), 2);
        assert_eq!(s.version, 3);
    }

    #[test]
    fn invalid_ddl_is_refused_with_the_checker_code_and_changes_nothing() {
        let mut st = cluster();
        let before = st.schemes.clone();
        // subscriber1 does not subscribe twice; dropping an unknown subscriber is HW2002.
        let cmd = ddl("ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER nobody;");
        let err = validate(&st, &cmd).unwrap_err();
        match &err {
            ControlError::Invalid(errors) => assert_eq!(errors[0].code.as_str(), "HW2002"),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(apply(&mut st, &cmd), Response::Rejected(err));
        assert_eq!(st.schemes, before);
        // Owner also subscriber: TT8106.
        let bad = ddl("CREATE REPLICATION r2 ELEMENT x TABLE t MASTER a SUBSCRIBER a;");
        match validate(&st, &bad) {
            Err(ControlError::Invalid(errors)) => assert_eq!(errors[0].code.as_str(), "TT8106"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn create_twice_drop_and_unknown_schemes() {
        let mut st = cluster();
        assert_eq!(
            validate(&st, &ddl(SCHEME)),
            Err(ControlError::SchemeExists(r1()))
        );
        must_apply(&mut st, ddl("DROP REPLICATION r1;"));
        assert!(st.schemes.is_empty());
        assert_eq!(
            validate(&st, &ddl("DROP REPLICATION r1;")),
            Err(ControlError::UnknownScheme(r1()))
        );
    }

    #[test]
    fn self_must_be_resolved_before_proposing() {
        let st = ClusterState::default();
        let cmd = ddl("CREATE REPLICATION r3 ELEMENT x TABLE t MASTER SELF SUBSCRIBER b;");
        assert!(matches!(
            validate(&st, &cmd),
            Err(ControlError::UnresolvedSelf(_))
        ));
    }

    #[test]
    fn identities_may_not_clash_but_a_node_may_move() {
        let mut st = cluster();
        let clash_store = Command::RegisterNode(node(4, "masterds"));
        assert!(matches!(
            validate(&st, &clash_store),
            Err(ControlError::IdentityClash {
                existing: NodeId(1),
                ..
            })
        ));
        let clash_id = Command::RegisterNode(node(1, "elsewhere"));
        assert!(matches!(
            validate(&st, &clash_id),
            Err(ControlError::IdentityClash { .. })
        ));
        let mut moved = node(1, "masterds");
        moved.grpc_addr = "10.0.9.9:7000".into();
        moved.voter = true; // ignored: membership decides
        st.set_voters(&BTreeSet::from([NodeId(1)]));
        must_apply(&mut st, Command::RegisterNode(moved));
        assert_eq!(st.nodes[&NodeId(1)].grpc_addr, "10.0.9.9:7000");
        assert!(st.nodes[&NodeId(1)].voter);
        assert!(!st.nodes[&NodeId(2)].voter);
    }

    #[test]
    fn a_store_reports_its_catalog_and_it_goes_with_its_node() {
        let mut st = cluster();
        let catalog = StoreCatalog {
            tables: Vec::new(),
            sequences: vec![hawser_scheme::route::SequenceInfo {
                name: QualName::bare("s"),
                cycle: false,
            }],
        };
        let report = |store: &str| Command::ReportCatalog {
            store: Ident::unquoted(store),
            catalog: catalog.clone(),
        };
        assert_eq!(
            validate(&st, &report("nobody")),
            Err(ControlError::UnknownStore(Ident::unquoted("nobody")))
        );
        must_apply(&mut st, report("subscriber1"));
        assert_eq!(st.catalogs[&Ident::unquoted("subscriber1")], catalog);
        // Written before reports existed: no catalogs, still readable.
        let mut json = serde_json::to_value(&st).unwrap();
        json.as_object_mut().unwrap().remove("catalogs");
        let old: ClusterState = serde_json::from_value(json).unwrap();
        assert!(old.catalogs.is_empty());
        must_apply(&mut st, Command::RemoveNode { node: NodeId(2) });
        assert!(
            st.catalogs.is_empty(),
            "a removed node's catalog goes with it"
        );
    }

    #[test]
    fn a_node_holding_a_role_cannot_be_removed() {
        let mut st = cluster();
        assert!(matches!(
            validate(&st, &Command::RemoveNode { node: NodeId(1) }),
            Err(ControlError::NodeHoldsRole { .. })
        ));
        must_apply(&mut st, Command::RemoveNode { node: NodeId(2) });
        assert!(!st.nodes.contains_key(&NodeId(2)));
        assert_eq!(
            validate(&st, &Command::RemoveNode { node: NodeId(2) }),
            Err(ControlError::UnknownNode(NodeId(2)))
        );
    }

    #[test]
    fn receiver_and_return_service_states_default_and_are_cleaned_up() {
        let mut st = cluster();
        let sub2 = Ident::unquoted("subscriber2");
        assert_eq!(
            st.schemes[&r1()].receiver_state(&sub2),
            ReceiverState::Start
        );
        must_apply(
            &mut st,
            Command::SetReceiverState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReceiverState::Pause,
            },
        );
        must_apply(
            &mut st,
            Command::SetReturnServiceState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReturnServiceState::Disabled,
            },
        );
        let s = &st.schemes[&r1()];
        assert_eq!(s.receiver_state(&sub2), ReceiverState::Pause);
        assert_eq!(s.return_service_state(&sub2), ReturnServiceState::Disabled);
        // The master is not a receiver of the scheme.
        let cmd = Command::SetReceiverState {
            scheme: r1(),
            store: Ident::unquoted("masterds"),
            state: ReceiverState::Stop,
        };
        assert!(matches!(
            validate(&st, &cmd),
            Err(ControlError::NotSchemeSubscriber { .. })
        ));
        // Dropping the subscriber forgets its states.
        must_apply(
            &mut st,
            ddl("ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER subscriber2;"),
        );
        let s = &st.schemes[&r1()];
        assert!(s.receivers.is_empty() && s.return_services.is_empty());
    }

    #[test]
    fn apply_is_deterministic_and_the_state_round_trips_through_json() {
        let cmds = vec![
            Command::RegisterNode(node(1, "masterds")),
            Command::RegisterNode(node(2, "subscriber1")),
            ddl(SCHEME),
            Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: NodeId(2),
                epoch: Epoch(1),
                fork_point: Some(Gtid::new(NodeId(1), 7)),
            },
            Command::RemoveNode { node: NodeId(7) },
        ];
        let run = || {
            let mut st = ClusterState::default();
            let responses: Vec<_> = cmds.iter().map(|c| apply(&mut st, c)).collect();
            (st, responses)
        };
        let (a, ra) = run();
        let (b, rb) = run();
        assert_eq!(a, b);
        assert_eq!(ra, rb);
        assert!(matches!(
            ra[4],
            Response::Rejected(ControlError::UnknownNode(_))
        ));
        let json = serde_json::to_vec(&a).unwrap();
        let back: ClusterState = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, a);
        let cmd_json = serde_json::to_vec(&cmds).unwrap();
        let cmds_back: Vec<Command> = serde_json::from_slice(&cmd_json).unwrap();
        assert_eq!(cmds_back, cmds);
    }
}
