//! [`validate`] and [`apply`]: a command planned against the state as a [`Change`]
//! without touching it, then committed; the commands that set a receiver or return
//! service state, report a catalog or pause failover are planned here.

use hawser_core::{Ident, NodeId, QualName};
use hawser_scheme::route::StoreCatalog;

use super::nodes::{register_node, remove_node};
use super::schemes::{alter_scheme, create_scheme, scheme, set_master, subscribed_scheme};
use super::{
    ClusterState, Command, ControlError, FailoverPause, NodeInfo, ReceiverState, RemovedNode,
    Response, ReturnServiceState, SchemeState,
};

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
pub(super) enum Change {
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
