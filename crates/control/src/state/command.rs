//! The commands that change the cluster state, what applying one produced, and why a
//! command does not fit the state.

use hawser_core::{Epoch, Gtid, Ident, NodeId, QualName};
use hawser_scheme::ast::{AlterReplication, Scheme};
use hawser_scheme::route::StoreCatalog;
use hawser_scheme::SchemeError;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{
    FailoverPause, NodeInfo, ReceiverState, RemovalMode, ReturnServiceState, SchemeRole, StoreRole,
};

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
    ///
    /// [`ClusterState::removed`]: super::ClusterState::removed
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
