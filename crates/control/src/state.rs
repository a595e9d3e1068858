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
//!  ├── removed: NodeId ─► RemovedNode (store, when, log index): never let back in
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
    /// Every node taken out of the cluster ([`Command::RemoveNode`]), kept for good:
    /// node ids are random and never reused, so a member that finds a call from one of
    /// these knows for certain its sender was removed (and tells it so), and the id is
    /// never registered again. Empty in states written before it existed.
    #[serde(default)]
    pub removed: BTreeMap<NodeId, RemovedNode>,
}

/// A node taken out of the cluster ([`ClusterState::removed`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedNode {
    /// The store it held (a new node may take the name).
    pub store: Ident,
    /// Milliseconds since the Unix epoch by the clock of the leader that proposed the
    /// removal: shown to operators, never compared.
    pub at_unix_ms: u64,
    /// The Raft log index of the entry that removed it (0 where unknown).
    pub log_index: u64,
}

/// What a removal does with the replication schemes that name the node's store
/// ([`Command::RemoveNode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum RemovalMode {
    /// Refused while any scheme names the store (`hawser node remove ID`).
    #[default]
    Refuse,
    /// Takes the store out of every scheme in the same entry, by the rules of `ALTER
    /// REPLICATION … DROP SUBSCRIBER` (`--force`). A master or propagator is still
    /// refused.
    Force,
    /// Leaves the store named in the schemes (`--keep-in-schemes`): for a node whose
    /// data directory was lost and that comes back as a new node under the same store
    /// name, which then takes the store's place in them.
    KeepInSchemes,
}

/// A role a store has in a replication scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum StoreRole {
    Master,
    Propagator,
    Subscriber,
}

impl StoreRole {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreRole::Master => "MASTER",
            StoreRole::Propagator => "PROPAGATOR",
            StoreRole::Subscriber => "SUBSCRIBER",
        }
    }
}

impl std::fmt::Display for StoreRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a scheme names a store: element `element` of scheme `scheme`, as `role`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemeRole {
    pub scheme: QualName,
    pub element: Ident,
    pub role: StoreRole,
}

impl std::fmt::Display for SchemeRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of element {} in scheme {}",
            self.role, self.element, self.scheme
        )
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
    /// Takes a node out of the registry and records it in [`ClusterState::removed`] for
    /// good. Refused while its store masters or propagates an element, and — as `mode`
    /// says — while any scheme names its store, or the store is taken out of every
    /// scheme in the same entry. `at_unix_ms` is the proposer's clock (shown, never
    /// compared). The Raft membership change is separate (`ControlPlane::remove_node`).
    RemoveNode {
        node: NodeId,
        #[serde(default)]
        mode: RemovalMode,
        #[serde(default)]
        at_unix_ms: u64,
    },
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
    /// The node's store masters or propagates an element: never removed, not even
    /// with force, since the element would have no owner.
    #[error("{}", holds_role(*.node, .store, .role))]
    NodeHoldsRole {
        node: NodeId,
        store: Ident,
        role: Box<SchemeRole>,
    },
    /// The node's store subscribes to an element (`others`: how many more roles it
    /// has in the schemes) and the removal was not forced.
    #[error("{}", in_scheme(*.node, .store, .role, *.others))]
    StoreInScheme {
        node: NodeId,
        store: Ident,
        role: Box<SchemeRole>,
        others: usize,
    },
    /// A forced removal whose change to a scheme the scheme rules refuse (the store is
    /// the last subscriber of an element).
    #[error(
        "node {node} cannot be removed with --force: taking store {store} out of \
         replication scheme {scheme} is refused: {finding}; drop the element (ALTER \
         REPLICATION {scheme} DROP ELEMENT ...) or the scheme (DROP REPLICATION {scheme}) \
         first"
    )]
    ForcedRemovalRefused {
        node: NodeId,
        store: Ident,
        scheme: QualName,
        finding: Box<SchemeError>,
    },
    /// The node was removed from the cluster: its id is never registered or removed
    /// again.
    #[error(
        "node {0} was removed from the cluster and cannot be part of it again; start the \
         machine on an empty data directory with --join to add it as a new node"
    )]
    NodeRemoved(NodeId),
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
    #[error(
        "store {store} keeps element {element} of scheme {scheme} as a target table other \
         than a copy of it (AS ... in its SUBSCRIBER clause): it holds no copy to master"
    )]
    NotACopy {
        scheme: QualName,
        element: Ident,
        store: Ident,
    },
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

fn holds_role(node: NodeId, store: &Ident, role: &SchemeRole) -> String {
    let (scheme, element) = (&role.scheme, &role.element);
    let how = match role.role {
        StoreRole::Propagator => format!(
            "ALTER REPLICATION {scheme} ALTER ELEMENT {element} SET PROPAGATOR <store>, or \
             drop the element"
        ),
        _ => format!(
            "hawser switchover --scheme {scheme} --to <subscriber>, or ALTER REPLICATION \
             {scheme} ALTER ELEMENT {element} SET MASTER <store>"
        ),
    };
    format!(
        "node {node} cannot be removed, not even with --force: its store {store} is the \
         {} of element {element} in replication scheme {scheme}; move the role first \
         ({how})",
        role.role
    )
}

fn in_scheme(node: NodeId, store: &Ident, role: &SchemeRole, others: usize) -> String {
    let (scheme, element) = (&role.scheme, &role.element);
    let more = match others {
        0 => String::new(),
        1 => " (and has 1 more role in the schemes)".into(),
        n => format!(" (and has {n} more roles in the schemes)"),
    };
    format!(
        "node {node} cannot be removed: its store {store} is a {} of element {element} in \
         replication scheme {scheme}{more}. Take it out first (ALTER REPLICATION {scheme} \
         ALTER ELEMENT {element} DROP SUBSCRIBER {store}, or DROP REPLICATION {scheme}), or \
         remove the node with --force, which drops the store from every scheme in the same \
         step (--keep-in-schemes instead leaves the store in them for a new node that takes \
         its name)",
        role.role
    )
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
    apply_at(state, cmd, 0)
}

/// [`apply`] for the entry at Raft log index `log_index`, which a removal records
/// ([`RemovedNode::log_index`]). Every replica applies an entry at the same index, so
/// this stays deterministic.
pub fn apply_at(state: &mut ClusterState, cmd: &Command, log_index: u64) -> Response {
    state.version += 1;
    match plan(state, cmd) {
        Ok(change) => {
            change.commit(state, log_index);
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
    /// The node, its record in `removed` (its log index set at commit), and the schemes
    /// a forced removal took its store out of.
    RemoveNode(NodeId, RemovedNode, Vec<SchemeState>),
    PutScheme(SchemeState),
    /// A failover: the scheme, and the next era.
    Failover(SchemeState),
    DropScheme(QualName),
    PutCatalog(Ident, StoreCatalog),
    SetFailoverPause(Option<FailoverPause>),
}

impl Change {
    fn commit(self, state: &mut ClusterState, log_index: u64) {
        match self {
            Change::PutNode(n) => {
                if state.cluster_id == 0 && state.nodes.is_empty() {
                    state.cluster_id = n.id.0;
                }
                state.nodes.insert(n.id, n);
            }
            Change::RemoveNode(id, mut removed, schemes) => {
                if let Some(node) = state.nodes.remove(&id) {
                    state.catalogs.remove(&node.store);
                }
                removed.log_index = log_index;
                state.removed.insert(id, removed);
                for s in schemes {
                    state.schemes.insert(s.scheme.name.clone(), s);
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
        Command::RemoveNode {
            node,
            mode,
            at_unix_ms,
        } => remove_node(state, *node, *mode, *at_unix_ms),
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
fn remove_node(
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
    altered(state, old, &old.scheme, alter).map(Change::PutScheme)
}

/// Scheme `old` after `alter`, applied to `base` (`old.scheme`, or a copy of it a
/// removal already took some clauses out of): the epoch of every element whose owner
/// changes grows, renamed elements keep their history, and the receiver and return
/// service states of stores that no longer subscribe are forgotten.
fn altered(
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
        must_apply(&mut st, remove(3, RemovalMode::Force));
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
    fn a_deposed_master_removed_keeping_its_store_leaves_the_store_received_again() {
        let mut st = cluster();
        must_apply(&mut st, master_to_2(Some(Gtid::new(NodeId(1), 41))));
        let masterds = Ident::unquoted("masterds");
        assert!(st.schemes[&r1()].is_deposed(&st, &masterds));
        let version = st.schemes[&r1()].version;
        // Replaced by a new node (it lost its data): the store is no longer deposed.
        must_apply(&mut st, remove(1, RemovalMode::KeepInSchemes));
        let s = &st.schemes[&r1()];
        assert_eq!(s.receiver_state(&masterds), ReceiverState::Start);
        assert_eq!(
            s.return_service_state(&masterds),
            ReturnServiceState::Enabled
        );
        assert_eq!(s.version, version + 1);
        assert!(s.ddl().contains("SUBSCRIBER masterds"), "{}", s.ddl());
        // A subscriber that was never a master keeps what it had.
        let mut st = cluster();
        must_apply(
            &mut st,
            Command::SetReceiverState {
                scheme: r1(),
                store: Ident::unquoted("subscriber2"),
                state: ReceiverState::Pause,
            },
        );
        let id = st
            .node_by_store(&Ident::unquoted("subscriber2"))
            .unwrap()
            .id;
        must_apply(&mut st, remove(id.0, RemovalMode::KeepInSchemes));
        assert_eq!(
            st.schemes[&r1()].receiver_state(&Ident::unquoted("subscriber2")),
            ReceiverState::Pause
        );
    }

    #[test]
    fn set_master_swaps_roles_and_records_the_fork_point() {
        let mut st = cluster();
        let fork = Some(Gtid::new(NodeId(1), 41));
        must_apply(&mut st, master_to_2(fork));
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
        must_apply(&mut st, master_to_2(None));
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

    /// A subscriber keeping the table as a CCD holds no copy to master: refused, saying
    /// so; one keeping a plain copy is taken.
    #[test]
    fn set_master_refuses_a_subscriber_that_keeps_another_target_than_a_copy() {
        let mut st = ClusterState::default();
        for (id, store) in [(1, "masterds"), (2, "subscriber1"), (3, "subscriber2")] {
            must_apply(&mut st, Command::RegisterNode(node(id, store)));
        }
        must_apply(
            &mut st,
            ddl("CREATE REPLICATION r1 ELEMENT e TABLE t MASTER masterds \
                 SUBSCRIBER subscriber1 AS CCD INTO t_ccd SUBSCRIBER subscriber2"),
        );
        let to = |n| Command::SetMaster {
            scheme: r1(),
            element: e(),
            node: NodeId(n),
            epoch: Epoch(1),
            fork_point: None,
        };
        let refused = validate(&st, &to(2)).unwrap_err();
        assert!(
            matches!(refused, ControlError::NotACopy { .. }),
            "{refused}"
        );
        assert!(
            refused.to_string().contains("holds no copy to master"),
            "{refused}"
        );
        assert_eq!(validate(&st, &to(3)), Ok(()));
        // By hand, with ALTER ... SET MASTER, alike.
        let by_hand = |store: &str| {
            ddl(&format!(
                "ALTER REPLICATION r1 ALTER ELEMENT * IN masterds SET MASTER {store}"
            ))
        };
        assert!(matches!(
            validate(&st, &by_hand("subscriber1")),
            Err(ControlError::NotACopy { .. })
        ));
        assert_eq!(validate(&st, &by_hand("subscriber2")), Ok(()));
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
        must_apply(&mut st, remove(2, RemovalMode::Force));
        assert!(
            st.catalogs.is_empty(),
            "a removed node's catalog goes with it"
        );
    }

    /// Element e of r1 to node 2 (subscriber1) at epoch 1: a failover with a fork
    /// point, a switchover without.
    fn master_to_2(fork_point: Option<Gtid>) -> Command {
        Command::SetMaster {
            scheme: r1(),
            element: e(),
            node: NodeId(2),
            epoch: Epoch(1),
            fork_point,
        }
    }

    fn remove(id: u64, mode: RemovalMode) -> Command {
        Command::RemoveNode {
            node: NodeId(id),
            mode,
            at_unix_ms: 1_700_000_000_000,
        }
    }

    /// `cmd` refused by `validate` and by `apply` with `err`, changing nothing but the
    /// state's version.
    fn must_refuse(st: &mut ClusterState, cmd: Command) -> ControlError {
        let err = validate(st, &cmd).unwrap_err();
        let mut before = st.clone();
        assert_eq!(apply(st, &cmd), Response::Rejected(err.clone()));
        before.version += 1;
        assert_eq!(*st, before, "a refused removal changes nothing");
        err
    }

    #[test]
    fn a_node_whose_store_a_scheme_names_is_refused_naming_scheme_element_and_role() {
        let mut st = cluster();
        let err = must_refuse(&mut st, remove(2, RemovalMode::Refuse));
        assert_eq!(
            err,
            ControlError::StoreInScheme {
                node: NodeId(2),
                store: Ident::unquoted("subscriber1"),
                role: Box::new(SchemeRole {
                    scheme: r1(),
                    element: e(),
                    role: StoreRole::Subscriber,
                }),
                others: 0,
            }
        );
        let text = err.to_string();
        for part in [
            "SUBSCRIBER of element e in replication scheme r1",
            "ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER subscriber1",
            "DROP REPLICATION r1",
            "--force",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        // Taken out of the scheme first, it goes; a node no scheme names goes at once.
        must_apply(
            &mut st,
            ddl("ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER subscriber1;"),
        );
        must_apply(&mut st, remove(2, RemovalMode::Refuse));
        must_apply(&mut st, Command::RegisterNode(node(4, "other")));
        must_apply(&mut st, remove(4, RemovalMode::Refuse));
        assert!(!st.nodes.contains_key(&NodeId(2)) && !st.nodes.contains_key(&NodeId(4)));
    }

    #[test]
    fn a_master_or_propagator_is_refused_even_with_force() {
        let mut st = cluster();
        for mode in [
            RemovalMode::Refuse,
            RemovalMode::Force,
            RemovalMode::KeepInSchemes,
        ] {
            let err = must_refuse(&mut st, remove(1, mode));
            assert!(
                matches!(&err, ControlError::NodeHoldsRole { role, .. } if role.role == StoreRole::Master),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(
                text.contains("not even with --force")
                    && text.contains("MASTER of element e in replication scheme r1")
                    && text.contains("move the role first")
                    && text.contains("hawser switchover --scheme r1"),
                "{text}"
            );
        }
        must_apply(
            &mut st,
            ddl("CREATE REPLICATION r2
                 ELEMENT a TABLE t2 MASTER masterds SUBSCRIBER subscriber1
                 ELEMENT b TABLE t2 PROPAGATOR subscriber1 SUBSCRIBER subscriber2;"),
        );
        let err = must_refuse(&mut st, remove(2, RemovalMode::Force));
        assert!(
            matches!(&err, ControlError::NodeHoldsRole { role, .. } if role.role == StoreRole::Propagator),
            "{err:?}"
        );
        assert!(err.to_string().contains("SET PROPAGATOR"), "{err}");
    }

    #[test]
    fn force_takes_the_store_out_of_every_scheme_in_the_same_entry() {
        let mut st = cluster();
        must_apply(
            &mut st,
            ddl(r#"CREATE REPLICATION r2
                   ELEMENT x TABLE t2 MASTER masterds SUBSCRIBER subscriber1, subscriber2
                   ELEMENT y TABLE t3 MASTER subscriber1 SUBSCRIBER subscriber2, masterds
                   STORE subscriber2 RETURN WAIT TIME 5
                   ROUTE MASTER masterds SUBSCRIBER subscriber2
                     MASTERIP "10.0.0.1" PRIORITY 1 SUBSCRIBERIP "10.0.0.3" PRIORITY 1;"#),
        );
        let sub2 = Ident::unquoted("subscriber2");
        must_apply(
            &mut st,
            Command::SetReceiverState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReceiverState::Pause,
            },
        );
        let roles = store_roles(&st, &sub2);
        assert_eq!(roles.len(), 3, "{roles:?}");
        // Unforced: refused, naming the first role and counting the others.
        let err = must_refuse(&mut st, remove(3, RemovalMode::Refuse));
        assert!(err.to_string().contains("and has 2 more roles"), "{err}");
        let before = st.clone();
        let cmd = remove(3, RemovalMode::Force);
        validate(&st, &cmd).unwrap();
        assert!(matches!(
            apply_at(&mut st, &cmd, 42),
            Response::Applied { .. }
        ));
        // One entry: one state version, the node gone and recorded, both schemes
        // without the store, its states forgotten, every epoch kept.
        assert_eq!(st.version, before.version + 1);
        assert!(!st.nodes.contains_key(&NodeId(3)));
        assert_eq!(
            st.removed[&NodeId(3)],
            RemovedNode {
                store: sub2.clone(),
                at_unix_ms: 1_700_000_000_000,
                log_index: 42,
            }
        );
        assert!(store_roles(&st, &sub2).is_empty());
        for name in [r1(), QualName::bare("r2")] {
            let (old, new) = (&before.schemes[&name], &st.schemes[&name]);
            assert_eq!(new.version, old.version + 1, "{name}");
            assert!(!new.ddl().contains("subscriber2"), "{}", new.ddl());
            assert_eq!(
                new.elements.values().map(|e| e.epoch).collect::<Vec<_>>(),
                old.elements.values().map(|e| e.epoch).collect::<Vec<_>>()
            );
            assert!(new.receivers.is_empty(), "{:?}", new.receivers);
        }
        assert!(st.schemes[&r1()].ddl().contains("SUBSCRIBER subscriber1"));
        // The same checks the DDL path makes still hold on what force left.
        for s in st.schemes.values() {
            hawser_scheme::validate(&s.scheme).unwrap();
        }
    }

    #[test]
    fn force_is_refused_where_the_store_is_the_last_subscriber_of_an_element() {
        let mut st = cluster();
        must_apply(
            &mut st,
            ddl("CREATE REPLICATION r2 ELEMENT x TABLE t2 MASTER masterds SUBSCRIBER subscriber2;"),
        );
        // Nothing changes, r1 included: the removal is one entry or none.
        let err = must_refuse(&mut st, remove(3, RemovalMode::Force));
        match &err {
            ControlError::ForcedRemovalRefused {
                scheme, finding, ..
            } => {
                assert_eq!(scheme, &QualName::bare("r2"));
                assert_eq!(finding.code.as_str(), "HW2006");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("DROP REPLICATION r2"), "{err}");
    }

    #[test]
    fn keep_in_schemes_leaves_the_store_for_a_new_node_and_a_removed_id_never_returns() {
        let mut st = cluster();
        let sub2 = Ident::unquoted("subscriber2");
        must_apply(&mut st, remove(3, RemovalMode::KeepInSchemes));
        assert!(st.schemes[&r1()].subscriber_stores().contains(&sub2));
        assert!(st.removed.contains_key(&NodeId(3)));
        // The old id may not come back, nor be removed twice.
        assert_eq!(
            must_refuse(&mut st, Command::RegisterNode(node(3, "subscriber2"))),
            ControlError::NodeRemoved(NodeId(3))
        );
        let err = must_refuse(&mut st, remove(3, RemovalMode::Force));
        assert_eq!(err, ControlError::NodeRemoved(NodeId(3)));
        assert!(err.to_string().contains("empty data directory"), "{err}");
        // A new node (a new id) takes the store's name and its place in the scheme.
        must_apply(&mut st, Command::RegisterNode(node(9, "subscriber2")));
        assert_eq!(st.node_by_store(&sub2).map(|n| n.id), Some(NodeId(9)));
        // Unknown ids are still unknown.
        assert_eq!(
            validate(&st, &remove(8, RemovalMode::Refuse)),
            Err(ControlError::UnknownNode(NodeId(8)))
        );
    }

    #[test]
    fn removals_written_before_modes_existed_read_as_refuse_and_states_without_removed_read() {
        let cmd: Command = serde_json::from_str(r#"{"RemoveNode":{"node":5}}"#).unwrap();
        assert_eq!(
            cmd,
            Command::RemoveNode {
                node: NodeId(5),
                mode: RemovalMode::Refuse,
                at_unix_ms: 0,
            }
        );
        let mut st = cluster();
        must_apply(&mut st, remove(3, RemovalMode::KeepInSchemes));
        let mut json = serde_json::to_value(&st).unwrap();
        assert!(json["removed"]["3"].is_object(), "{json}");
        json.as_object_mut().unwrap().remove("removed");
        let old: ClusterState = serde_json::from_value(json).unwrap();
        assert!(old.removed.is_empty());
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
            master_to_2(Some(Gtid::new(NodeId(1), 7))),
            remove(7, RemovalMode::Refuse),
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
