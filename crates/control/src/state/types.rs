//! The data types of the cluster state: the node registry, the replication schemes with
//! their element, receiver and return-service states, removed nodes and the failover
//! pause.

use std::collections::BTreeMap;

use hawser_core::{Epoch, Gtid, Ident, NodeId, QualName};
use hawser_scheme::ast::{OwnerRole, Scheme};
use hawser_scheme::route::StoreCatalog;
use serde::{Deserialize, Serialize};

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
    ///
    /// [`Command::ReportCatalog`]: super::Command::ReportCatalog
    #[serde(default, with = "pairs")]
    pub catalogs: BTreeMap<Ident, StoreCatalog>,
    /// The failover era: grows by one with every failover (a [`Command::SetMaster`]
    /// with a fork point), whatever the element. Every node stamps the log records of
    /// its own commits with the era it has applied, so a commit made by a master that
    /// had not yet heard of the failover that deposed it carries an older era than any
    /// commit made since, by anyone.
    ///
    /// [`Command::SetMaster`]: super::Command::SetMaster
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
    ///
    /// [`Command::RemoveNode`]: super::Command::RemoveNode
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
///
/// [`Command::RemoveNode`]: super::Command::RemoveNode
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

/// Why and since when automatic failover is paused ([`ClusterState::failover_pause`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverPause {
    /// The operator's words; may be empty.
    pub reason: String,
    /// Milliseconds since the Unix epoch, by the clock of the node that proposed the
    /// pause: shown to operators, never compared.
    pub since_unix_ms: u64,
}

/// Who owns an element now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MasterView<'a> {
    pub store: &'a Ident,
    pub node: Option<NodeId>,
    pub role: OwnerRole,
    pub epoch: Epoch,
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
