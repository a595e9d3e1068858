//! The node's side of the cluster control plane: replication DDL through Raft, the
//! cluster view for `Status`, Raft metrics, and the `--join` loop.
//!
//! ```text
//!  hawser sql ─► SqlEngine ─► RaftDdl::execute ─► SELF := this store ─► Command::from_ddl
//!       ─► validate (cluster state) ─► route::plan (this node's catalog) ─► propose
//!       ─► wait_for_version (this node has applied it) ─► "CREATE REPLICATION"
//!  raft metrics watch ─► hawser_raft_* gauges / counters, fatal stop on Shutdown
//!  catalog watch ─► ReportCatalog when this store's tables / sequences differ from the
//!       cluster's record of them
//!  --join loop ─► ControlPlane::join with backoff while the error is retryable
//! ```
//!
//! What DDL validation checks here: the scheme language's restrictions (syntax,
//! TimesTen's TT8xxx rules, hawser's HW codes) against the cluster's current schemes, and
//! the routing plan against the catalogs this node can see ([`topology`]) — its own for
//! its own store, and for the others what they reported to the cluster
//! ([`report_catalog`]) plus this node's tables they lack — and the registry for which
//! store is which node.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hawser_control::failover::{liveness, Liveness};
use hawser_control::state::{FailoverPause, ReceiverState, ReturnServiceState};
use hawser_control::{
    ClusterState, Command, ControlConfig, ControlError, ControlPlane, PlaneError, RaftRole, Removal,
};
use hawser_core::{Ident, QualName};
use hawser_proto::v1;
use hawser_scheme::ast::{ElementKind, OwnerRole, StoreName};
use hawser_scheme::lexer::{tokenize, TokenKind};
use hawser_scheme::route::{SequenceInfo, StoreCatalog};
use hawser_scheme::Topology;
use hawser_sql::{BoxFuture, ReplicationDdl, ReplicationError, StatementResult, Warning};
use hawser_store::Database;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// SQLSTATE of a DDL statement that could not be committed because the cluster has no
/// reachable Raft leader now: retry (PostgreSQL's `cannot_connect_now`).
pub const NO_LEADER: &str = "57P03";

/// How long DDL waits for this node to apply its own committed change.
const APPLY_WAIT: Duration = Duration::from_secs(10);

/// Runs replication DDL through the control plane for the SQL engine.
pub(crate) struct RaftDdl {
    pub(crate) plane: ControlPlane,
    pub(crate) db: Database,
    pub(crate) store: Ident,
}

impl ReplicationDdl for RaftDdl {
    fn execute<'a>(
        &'a self,
        ddl: &'a str,
    ) -> BoxFuture<'a, Result<StatementResult, ReplicationError>> {
        Box::pin(self.run(ddl))
    }
}

impl RaftDdl {
    async fn run(&self, ddl: &str) -> Result<StatementResult, ReplicationError> {
        if self.plane.metrics().voters.is_empty() {
            return Err(ReplicationError {
                code: NO_LEADER.into(),
                message: "this node is not part of a cluster yet: run `hawser init` on one \
                          node, start the others with --join, and retry"
                    .into(),
            });
        }
        let text = resolve_self(ddl, &self.store);
        let commands = Command::from_ddl(&text).map_err(rejected)?;
        let mut result = StatementResult::default();
        for cmd in commands {
            result.tag = tag(&cmd).to_string();
            let state = self.plane.state();
            hawser_control::state::validate(&state, &cmd).map_err(rejected)?;
            result.warnings.extend(self.check_routes(&state, &cmd)?);
            let version = self.plane.propose(cmd).await.map_err(plane_error)?;
            self.plane
                .wait_for_version(version, APPLY_WAIT)
                .await
                .map_err(plane_error)?;
        }
        Ok(result)
    }

    /// Plans the scheme as it will be after `cmd` against what this node knows;
    /// returns the plan's warnings.
    fn check_routes(
        &self,
        state: &ClusterState,
        cmd: &Command,
    ) -> Result<Vec<Warning>, ReplicationError> {
        let scheme = match cmd {
            Command::CreateScheme { scheme } => scheme.clone(),
            Command::AlterScheme { alter } => {
                let Some(current) = state.schemes.get(&alter.name) else {
                    return Ok(Vec::new());
                };
                hawser_scheme::apply(&current.scheme, alter)
                    .map_err(|e| rejected(ControlError::Invalid(vec![e])))?
            }
            _ => return Ok(Vec::new()),
        };
        let topology = self.topology(state);
        let plan = hawser_scheme::plan(&scheme, &topology)
            .map_err(|e| rejected(ControlError::Invalid(e)))?;
        Ok(plan
            .warnings
            .iter()
            .map(|w| Warning {
                code: w.code.as_str().to_string(),
                message: w.message.clone(),
            })
            .collect())
    }

    fn topology(&self, state: &ClusterState) -> Topology {
        topology(state, &self.db, &self.store)
    }
}

/// The tables and sequences `db` holds, as the routing plan and catalog reports see them.
pub(crate) fn local_catalog(db: &Database) -> StoreCatalog {
    StoreCatalog {
        tables: db.tables().iter().map(|t| (**t).clone()).collect(),
        sequences: db
            .sequences()
            .into_iter()
            .map(|s| SequenceInfo {
                name: s.name,
                cycle: s.cycle,
            })
            .collect(),
    }
}

/// The cluster as this node plans it: its own catalog for its own store (`store`); for
/// every other registered store, the catalog that store reported to the cluster together
/// with this node's own tables and sequences it lacks. A report lags the store (a table
/// created on a master reaches a subscriber through its stream before the master's
/// report does), and this node's own catalog standing in errs on the side of planning a
/// table as received — refused to client writes — rather than missing it. A store that
/// has not reported gets this node's catalog alone, as before reports existed.
pub(crate) fn topology(state: &ClusterState, db: &Database, store: &Ident) -> Topology {
    let local = local_catalog(db);
    let nodes: BTreeMap<Ident, hawser_core::NodeId> = state
        .nodes
        .values()
        .map(|n| (n.store.clone(), n.id))
        .collect();
    let mut catalogs: BTreeMap<Ident, StoreCatalog> = nodes
        .keys()
        .filter(|s| *s != store)
        .map(|s| (s.clone(), with_local(state.catalogs.get(s), &local)))
        .collect();
    catalogs.insert(store.clone(), local);
    Topology { catalogs, nodes }
}

/// `reported` and whatever of `local` it lacks, by name.
fn with_local(reported: Option<&StoreCatalog>, local: &StoreCatalog) -> StoreCatalog {
    let Some(reported) = reported else {
        return local.clone();
    };
    let mut out = reported.clone();
    add_missing(&mut out.tables, &local.tables, |t| &t.name);
    add_missing(&mut out.sequences, &local.sequences, |q| &q.name);
    out
}

/// Appends the items of `from` whose name `into` lacks.
fn add_missing<T: Clone>(into: &mut Vec<T>, from: &[T], name: impl Fn(&T) -> &QualName) {
    let have: BTreeSet<QualName> = into.iter().map(|t| name(t).clone()).collect();
    into.extend(from.iter().filter(|t| !have.contains(name(t))).cloned());
}

/// Keeps this store's catalog in the cluster state current: whenever what the cluster
/// holds for it differs from the store's tables and sequences (DDL here, a replicated
/// CREATE TABLE, a first start), proposes [`Command::ReportCatalog`]. Looks on every
/// cluster change and once a second (DDL here changes no Raft state): a look compares
/// the catalog with the record, which costs a copy of the table definitions. A failed
/// proposal (no leader yet, this node not registered yet) is tried again at the next
/// look.
pub(crate) async fn report_catalog(
    plane: ControlPlane,
    db: Database,
    store: Ident,
    shutdown: CancellationToken,
) {
    let mut cluster = plane.subscribe();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = cluster.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tick.tick() => {}
        }
        let state = plane.state();
        if state.node_by_store(&store).is_none() || plane.removal().is_some() {
            continue;
        }
        let catalog = local_catalog(&db);
        if state.catalogs.get(&store) == Some(&catalog) {
            continue;
        }
        let tables = catalog.tables.len();
        match plane
            .propose(Command::ReportCatalog {
                store: store.clone(),
                catalog,
            })
            .await
        {
            Ok(version) => info!(tables, version, "catalog reported to the cluster"),
            Err(e) => tracing::debug!(error = %e, "catalog report not committed; trying again"),
        }
    }
}

/// Replaces every `SELF` word of scheme text with `store` (SELF is the database that
/// runs the statement; the cluster-wide scheme must name it).
pub fn resolve_self(ddl: &str, store: &Ident) -> String {
    let (tokens, _) = tokenize(ddl);
    let name = if store.needs_quotes() {
        format!("\"{}\"", store.as_str().replace('"', "\"\""))
    } else {
        store.as_str().to_string()
    };
    let mut out = String::with_capacity(ddl.len());
    let mut at = 0;
    for t in tokens {
        if matches!(&t.kind, TokenKind::Word(w) if w.eq_ignore_ascii_case("self")) {
            out.push_str(&ddl[at..t.span.start]);
            out.push_str(&name);
            at = t.span.end;
        }
    }
    out.push_str(&ddl[at..]);
    out
}

fn tag(cmd: &Command) -> &'static str {
    match cmd {
        Command::CreateScheme { .. } => "CREATE REPLICATION",
        Command::AlterScheme { .. } => "ALTER REPLICATION",
        Command::DropScheme { .. } => "DROP REPLICATION",
        _ => "REPLICATION",
    }
}

/// A refusal with the scheme checker's code where there is one, else a SQLSTATE.
fn rejected(e: ControlError) -> ReplicationError {
    let code = match &e {
        ControlError::Invalid(errors) => errors
            .first()
            .map(|f| f.code.as_str())
            .unwrap_or("42601")
            .to_string(),
        ControlError::UnresolvedSelf(_) => hawser_scheme::ErrorCode::UnresolvedSelf
            .as_str()
            .to_string(),
        ControlError::SchemeExists(_) => "42710".into(),
        ControlError::UnknownScheme(_) | ControlError::UnknownElement { .. } => "42704".into(),
        _ => "55000".into(),
    };
    let message = match &e {
        // The first finding's code is the error's; the others name theirs.
        ControlError::Invalid(errors) => errors
            .iter()
            .enumerate()
            .map(|(i, f)| match i {
                0 => f.message.clone(),
                _ => format!("[{}] {}", f.code.as_str(), f.message),
            })
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    };
    ReplicationError { code, message }
}

fn plane_error(e: PlaneError) -> ReplicationError {
    match e {
        PlaneError::Rejected(e) => rejected(e),
        PlaneError::Unavailable {
            leader_addr,
            reason,
        } => ReplicationError {
            code: NO_LEADER.into(),
            message: match leader_addr {
                Some(addr) => format!(
                    "the cluster cannot commit the change now ({reason}); the Raft leader \
                     was last seen at {addr}; retry"
                ),
                None => {
                    format!("the cluster has no Raft leader now ({reason}); nothing changed; retry")
                }
            },
        },
        other => ReplicationError {
            code: "XX000".into(),
            message: other.to_string(),
        },
    }
}

/// A control-plane failure as a gRPC status a caller can act on: UNAVAILABLE
/// (retryable, no leader now), FAILED_PRECONDITION (the cluster state refuses it).
pub(crate) fn plane_status(e: PlaneError) -> tonic::Status {
    match &e {
        PlaneError::Unavailable { .. } => tonic::Status::unavailable(e.to_string()),
        PlaneError::Rejected(_) | PlaneError::LostState(_) | PlaneError::Removed(_) => {
            tonic::Status::failed_precondition(e.to_string())
        }
        PlaneError::Config(_) => tonic::Status::invalid_argument(e.to_string()),
        PlaneError::Storage(_) | PlaneError::Fatal(_) => tonic::Status::internal(e.to_string()),
    }
}

/// Why a removed node takes no part, in full: its log line, its write refusals, its
/// status and `/readyz` say this.
pub(crate) fn removal_message(r: &Removal) -> String {
    format!(
        "this node (id {}) was {} ({}): it takes no part in the cluster any more — it \
         neither sends nor receives replication, takes no writes and does not campaign. To \
         bring this machine back, start it on an empty data directory with --join: it \
         joins as a new node (docs/control.md, \"Removing a node\")",
        r.node,
        r.describe(),
        r.learned.describe()
    )
}

/// `cluster.removed` of `hawser status --format json` and `/status`: null unless this
/// node was removed (docs/status.md).
pub fn removal_json(r: Option<&v1::ClusterRemoval>) -> serde_json::Value {
    match r {
        None => serde_json::Value::Null,
        Some(r) => serde_json::json!({
            "cluster_id": r.cluster_id,
            "log_index": (r.log_index != 0).then_some(r.log_index),
            "at_unix_ms": (r.at_unix_ms != 0).then_some(r.at_unix_ms),
            "learned": r.learned,
            "message": r.message,
        }),
    }
}

/// Adds `cluster.removed` ([`removal_json`]) to a status JSON object made by
/// [`crate::status_json`].
pub fn add_removal_json(json: &mut serde_json::Value, s: &v1::StatusResponse) {
    if let Some(cluster) = json.get_mut("cluster").and_then(|c| c.as_object_mut()) {
        let removed = s.cluster.as_ref().and_then(|c| c.removed.as_ref());
        cluster.insert("removed".into(), removal_json(removed));
    }
}

/// A Raft role as status prints it.
pub fn role_name(role: RaftRole) -> &'static str {
    match role {
        RaftRole::Leader => "leader",
        RaftRole::Follower => "follower",
        RaftRole::Candidate => "candidate",
        RaftRole::Learner => "learner",
        RaftRole::Shutdown => "shutdown",
    }
}

/// How long without a report makes a node `late`, and `unreachable`.
pub(crate) struct HealthLimits {
    pub(crate) late_after: Duration,
    pub(crate) unreachable_after: Duration,
}

/// The cluster as this node sees it, for `Status`; `blocked` lists the failovers the
/// leader cannot make now.
pub(crate) fn cluster_status(
    plane: &ControlPlane,
    limits: &HealthLimits,
    blocked: Vec<String>,
) -> v1::ClusterStatus {
    let m = plane.metrics();
    let health_view = plane.health();
    let raw = plane.raft_metrics().borrow().clone();
    let state = plane.state();
    let me = m.node;
    let removal = plane.removal();
    let is_leader = m.role == RaftRole::Leader && removal.is_none();
    let last_log = m.last_log_index.unwrap_or(0);
    let leader_addr = m
        .leader
        .and_then(|l| state.nodes.get(&l).map(|n| n.grpc_addr.clone()))
        .unwrap_or_default();
    let nodes = state
        .nodes
        .values()
        .map(|n| {
            let membership = if n.id == me && removal.is_some() {
                "removed"
            } else if m.voters.contains(&n.id) {
                "voter"
            } else if m.learners.contains(&n.id) {
                "learner"
            } else {
                "none"
            };
            let role = if n.id == me && removal.is_some() {
                "removed"
            } else if n.id == me {
                role_name(m.role)
            } else if Some(n.id) == m.leader {
                "leader"
            } else {
                match membership {
                    "voter" => "follower",
                    "learner" => "learner",
                    _ => "unknown",
                }
            };
            let matched = if is_leader {
                m.replication.get(&n.id).copied().flatten()
            } else {
                None
            };
            let catalog = state.catalogs.get(&n.store);
            let (health, since_report) = match &health_view {
                Some((view, now)) => {
                    let (live, since) = liveness(
                        view,
                        n.id,
                        *now,
                        limits.late_after,
                        limits.unreachable_after,
                    );
                    let name = match live {
                        Liveness::Ok => "ok",
                        Liveness::Late => "late",
                        Liveness::Unreachable => "unreachable",
                    };
                    (name, since.as_millis() as i64)
                }
                None if n.id == me => ("ok", -1),
                None => ("unknown", -1),
            };
            v1::ClusterNode {
                id: n.id.0,
                store: n.store.to_string(),
                host: n.host.clone(),
                grpc_addr: n.grpc_addr.clone(),
                http_addr: n.http_addr.clone(),
                membership: membership.into(),
                role: role.into(),
                matched_index: matched.map_or(-1, |i| i as i64),
                health: health.into(),
                lag_entries: match (is_leader, matched) {
                    (true, Some(i)) => last_log.saturating_sub(i) as i64,
                    _ => -1,
                },
                catalog_reported: catalog.is_some(),
                tables: catalog
                    .map(|c| c.tables.iter().map(|t| t.name.to_string()).collect())
                    .unwrap_or_default(),
                sequences: catalog
                    .map(|c| c.sequences.iter().map(|q| q.name.to_string()).collect())
                    .unwrap_or_default(),
                millis_since_report: since_report,
            }
        })
        .collect();
    let schemes = state
        .schemes
        .iter()
        .map(|(name, s)| v1::SchemeStatus {
            name: name.to_string(),
            version: s.version,
            elements: s
                .scheme
                .elements
                .iter()
                .map(|el| {
                    let owner = match &el.owner.name {
                        StoreName::Named(n) => n.to_string(),
                        StoreName::Local => "SELF".into(),
                    };
                    let master = state.master_of(name, &el.name);
                    v1::ElementStatus {
                        name: el.name.to_string(),
                        kind: match el.kind {
                            ElementKind::Datastore => "DATASTORE",
                            ElementKind::Table { .. } => "TABLE",
                            ElementKind::Sequence { .. } => "SEQUENCE",
                        }
                        .into(),
                        owner_role: match el.owner_role {
                            OwnerRole::Master => "MASTER",
                            OwnerRole::Propagator => "PROPAGATOR",
                        }
                        .into(),
                        master_store: owner,
                        master_node: master.and_then(|v| v.node).map_or(0, |n| n.0),
                        master_addr: master
                            .and_then(|v| v.node)
                            .and_then(|n| state.nodes.get(&n))
                            .map(|n| n.grpc_addr.clone())
                            .unwrap_or_default(),
                        table: match &el.kind {
                            ElementKind::Table { table, .. } => table.to_string(),
                            _ => String::new(),
                        },
                        epoch: master.map_or(0, |v| v.epoch.0),
                        subscribers: el.subscriber_stores().map(|s| s.name.to_string()).collect(),
                    }
                })
                .collect(),
            receivers: s
                .receivers
                .iter()
                .filter(|(_, st)| **st != ReceiverState::Start)
                .map(|(store, st)| format!("{store}={}", st.as_str()))
                .collect(),
            return_services_disabled: s
                .return_services
                .iter()
                .filter(|(_, st)| **st == ReturnServiceState::Disabled)
                .map(|(store, _)| store.to_string())
                .collect(),
        })
        .collect();
    v1::ClusterStatus {
        initialized: !m.voters.is_empty() || removal.is_some(),
        // A removed node's Raft role (often a learner that never heard the end of its
        // membership) means nothing any more.
        role: match &removal {
            Some(_) => "removed".into(),
            None => role_name(m.role).into(),
        },
        term: m.term,
        leader_id: m.leader.map_or(0, |l| l.0),
        leader_addr,
        last_log_index: last_log,
        last_applied: m.last_applied.unwrap_or(0),
        snapshot_index: m.snapshot_index.unwrap_or(0),
        state_version: state.version,
        millis_since_quorum_ack: m.millis_since_quorum_ack.map_or(-1, |v| v as i64),
        nodes,
        schemes,
        purged_index: raw.purged.map_or(0, |l| l.index),
        blocked_failovers: if is_leader { blocked } else { Vec::new() },
        failover: Some(failover_status(&state, plane.config())),
        removed: removal.as_ref().map(|r| v1::ClusterRemoval {
            cluster_id: r.cluster_id,
            log_index: r.log_index,
            at_unix_ms: r.at_unix_ms,
            learned: r.learned.describe(),
            message: removal_message(r),
        }),
    }
}

/// Whether failover is automatic in `state`, and the timing `cfg` gives this node.
pub(crate) fn failover_status(state: &ClusterState, cfg: &ControlConfig) -> v1::FailoverStatus {
    let ms = |d: Duration| d.as_millis() as u64;
    let pause = state.failover_pause.as_ref();
    v1::FailoverStatus {
        paused: pause.is_some(),
        paused_reason: pause.map(|p| p.reason.clone()).unwrap_or_default(),
        paused_since_unix_ms: pause.map_or(0, |p| p.since_unix_ms),
        automatic_here: cfg.failover.enabled,
        failover_timeout_ms: ms(cfg.failover.failover_timeout),
        master_lease_ms: ms(cfg.master_lease),
        report_interval_ms: ms(cfg.report_interval),
    }
}

/// Pauses (`paused`, with `reason`) or resumes automatic failover for the whole
/// cluster through the Raft leader, and waits until this node has applied it.
pub(crate) async fn set_failover(
    plane: &ControlPlane,
    paused: bool,
    reason: &str,
) -> Result<v1::FailoverStatus, tonic::Status> {
    let pause = paused.then(|| FailoverPause {
        reason: reason.trim().to_string(),
        since_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    });
    let version = plane
        .propose(Command::SetFailoverPause { pause })
        .await
        .map_err(plane_status)?;
    plane
        .wait_for_version(version, APPLY_WAIT)
        .await
        .map_err(plane_status)?;
    Ok(failover_status(&plane.state(), plane.config()))
}

/// Where client writes to `table` go: the store, gRPC address and epoch of the
/// master of the first TABLE element of `table` (DATASTORE elements are not looked
/// at), if its node has registered.
pub(crate) fn master_of_table(
    state: &ClusterState,
    table: &QualName,
) -> Option<(String, String, u64)> {
    state.schemes.iter().find_map(|(name, s)| {
        s.scheme.elements.iter().find_map(|el| {
            let ElementKind::Table { table: t, .. } = &el.kind else {
                return None;
            };
            if t != table || el.owner_role != OwnerRole::Master {
                return None;
            }
            let m = state.master_of(name, &el.name)?;
            let node = state.nodes.get(&m.node?)?;
            Some((m.store.to_string(), node.grpc_addr.clone(), m.epoch.0))
        })
    })
}

/// The effective schemes in canonical DDL; `name` selects one (`[owner.]name`).
pub(crate) fn show_schemes(plane: &ControlPlane, name: &str) -> v1::ShowSchemesResponse {
    let state = plane.state();
    let wanted = (!name.trim().is_empty()).then(|| QualName::parse_unquoted(name.trim()));
    let schemes = state
        .schemes
        .iter()
        .filter(|(qn, _)| match &wanted {
            None => true,
            Some(w) if w.owner.is_some() => *qn == w,
            Some(w) => qn.name == w.name,
        })
        .map(|(qn, s)| v1::SchemeDdl {
            name: qn.to_string(),
            version: s.version,
            ddl: s.ddl(),
        })
        .collect();
    v1::ShowSchemesResponse {
        schemes,
        state_version: state.version,
    }
}

/// Keeps the `hawser_raft_*` metrics up to date from openraft's metrics watch, and
/// cancels `fatal` if Raft stops while the node is running (a storage error: the node
/// must exit and restart). Ends at `shutdown`.
pub(crate) async fn watch_raft(
    plane: ControlPlane,
    shutdown: CancellationToken,
    fatal: tokio::sync::mpsc::Sender<String>,
) {
    let mut rx = plane.raft_metrics();
    let mut removal = plane.removal_watch();
    let mut leader = None;
    let mut announced = false;
    loop {
        // Said once, at WARN: from here on the node takes no part (the data plane,
        // the lease task and the reports stop; its elections are off already).
        if !announced {
            let removed = removal.borrow_and_update().clone();
            if let Some(r) = removed {
                warn!(
                    cluster = r.cluster_id,
                    log_index = r.log_index,
                    learned = %r.learned.describe(),
                    "{}",
                    removal_message(&r)
                );
                metrics::gauge!("hawser_node_removed").set(1.0);
                announced = true;
            }
        }
        let (role, stopped) = {
            let m = rx.borrow_and_update();
            metrics::gauge!("hawser_raft_term").set(m.current_term as f64);
            let last_log = m.last_log_index.unwrap_or(0);
            let applied = m.last_applied.map_or(0, |l| l.index);
            metrics::gauge!("hawser_raft_last_log_index").set(last_log as f64);
            metrics::gauge!("hawser_raft_last_applied").set(applied as f64);
            metrics::gauge!("hawser_raft_apply_lag").set(last_log.saturating_sub(applied) as f64);
            metrics::gauge!("hawser_raft_is_leader").set(
                if m.state == openraft::ServerState::Leader {
                    1.0
                } else {
                    0.0
                },
            );
            if m.current_leader != leader {
                if m.current_leader.is_some() {
                    metrics::counter!("hawser_raft_leader_changes_total").increment(1);
                    info!(leader = ?m.current_leader, term = m.current_term, "Raft leader known");
                }
                leader = m.current_leader;
            }
            let stopped = match &m.running_state {
                Err(e) => Some(e.to_string()),
                Ok(()) if m.state == openraft::ServerState::Shutdown => {
                    Some("Raft shut down".to_string())
                }
                Ok(()) => None,
            };
            (m.state, stopped)
        };
        if let Some(reason) = stopped {
            if !shutdown.is_cancelled() {
                let _ = fatal
                    .send(format!("Raft stopped ({role:?}): {reason}"))
                    .await;
            }
            return;
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            changed = rx.changed() => if changed.is_err() {
                if !shutdown.is_cancelled() {
                    let _ = fatal.send("the Raft metrics channel closed".into()).await;
                }
                return;
            },
            // The book lives as long as the plane; a closed watch only ends this arm.
            Ok(()) = removal.changed(), if !announced => {}
        }
    }
}

/// Joins the cluster through `members`, retrying with backoff until it succeeds, a
/// member refuses (an identity clash, lost Raft state: sent to `fatal`, since the node
/// cannot be part of the cluster) or `shutdown`. If this node's own Raft stops,
/// [`watch_raft`] reports it.
pub(crate) async fn join_loop(
    plane: ControlPlane,
    members: Vec<String>,
    shutdown: CancellationToken,
    fatal: tokio::sync::mpsc::Sender<String>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let result = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            r = plane.join(&members) => r,
        };
        match result {
            Ok(reply) => {
                info!(leader = %reply.leader, voter = reply.voter, attempt, "joined the cluster");
                return;
            }
            // A removed node does not join again, and does not stop either: it stays up
            // to say why (its status, its log, /readyz).
            Err(PlaneError::Removed(_)) => return,
            // A leader that could not finish the change (a learner slow to catch up, a
            // membership change that did not commit in time) may finish it next time.
            Err(e) if e.is_retryable() || matches!(e, PlaneError::Fatal(_)) => {
                if attempt == 1 || attempt.is_power_of_two() {
                    info!(error = %e, attempt, "cannot join yet; retrying");
                }
            }
            Err(e) => {
                warn!(error = %e, "the cluster refused this node");
                let _ = fatal
                    .send(format!("the cluster refused to let this node join: {e}"))
                    .await;
                return;
            }
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Sets `store`'s receiver state in `scheme` (every scheme it subscribes to when
/// `scheme` is empty) through the Raft leader and waits until this node has applied
/// it. Returns the schemes changed.
pub(crate) async fn set_receiver_state(
    plane: &ControlPlane,
    scheme: &str,
    store: &str,
    state: &str,
) -> Result<Vec<String>, tonic::Status> {
    let rs = match state.to_ascii_lowercase().as_str() {
        "start" => ReceiverState::Start,
        "pause" => ReceiverState::Pause,
        "stop" => ReceiverState::Stop,
        "failed" => {
            return Err(tonic::Status::invalid_argument(
                "FAILED cannot be set by hand: a master sets it when the log held for the \
                 subscriber passes FAILTHRESHOLD; set start, pause or stop",
            ))
        }
        other => {
            return Err(tonic::Status::invalid_argument(format!(
                "receiver state {other:?}: give start, pause or stop"
            )))
        }
    };
    for_subscribed_schemes(plane, scheme, store, "receiver state", |scheme, store| {
        Command::SetReceiverState {
            scheme,
            store,
            state: rs,
        }
    })
    .await
}

/// Enables or disables `store`'s return service in `scheme` (every scheme it
/// subscribes to when `scheme` is empty) through the Raft leader and waits until this
/// node has applied it. Returns the schemes changed.
pub(crate) async fn set_return_service(
    plane: &ControlPlane,
    scheme: &str,
    store: &str,
    state: &str,
) -> Result<Vec<String>, tonic::Status> {
    let rs = match state.to_ascii_lowercase().as_str() {
        "enabled" | "enable" => ReturnServiceState::Enabled,
        "disabled" | "disable" => ReturnServiceState::Disabled,
        other => {
            return Err(tonic::Status::invalid_argument(format!(
                "return service state {other:?}: give enabled or disabled"
            )))
        }
    };
    for_subscribed_schemes(plane, scheme, store, "return service", |scheme, store| {
        Command::SetReturnServiceState {
            scheme,
            store,
            state: rs,
        }
    })
    .await
}

/// Commits `command(scheme, store)` for `scheme`, or for every scheme `store`
/// subscribes to when `scheme` is empty, each validated first and applied here before
/// the next. `what` names the setting in errors.
async fn for_subscribed_schemes(
    plane: &ControlPlane,
    scheme: &str,
    store: &str,
    what: &str,
    command: impl Fn(QualName, Ident) -> Command,
) -> Result<Vec<String>, tonic::Status> {
    if store.is_empty() {
        return Err(tonic::Status::invalid_argument(format!(
            "name the subscriber store whose {what} to set"
        )));
    }
    let store = Ident::unquoted(store);
    let current = plane.state();
    let names: Vec<QualName> = if scheme.is_empty() {
        current
            .schemes
            .iter()
            .filter(|(_, s)| {
                s.scheme
                    .elements
                    .iter()
                    .flat_map(|e| e.subscriber_stores())
                    .any(|r| matches!(&r.name, StoreName::Named(n) if *n == store))
            })
            .map(|(n, _)| n.clone())
            .collect()
    } else {
        vec![QualName::parse_unquoted(scheme)]
    };
    if names.is_empty() {
        return Err(tonic::Status::not_found(format!(
            "{store} subscribes to no replication scheme"
        )));
    }
    for name in &names {
        let cmd = command(name.clone(), store.clone());
        hawser_control::state::validate(&current, &cmd)
            .map_err(|e| tonic::Status::failed_precondition(e.to_string()))?;
        let version = plane.propose(cmd).await.map_err(plane_status)?;
        plane
            .wait_for_version(version, APPLY_WAIT)
            .await
            .map_err(plane_status)?;
    }
    Ok(names.iter().map(|n| n.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_planned_with_what_this_node_has_and_it_lacks() {
        let seq = |n: &str| SequenceInfo {
            name: QualName::bare(n),
            cycle: false,
        };
        let reported = StoreCatalog {
            tables: Vec::new(),
            sequences: vec![seq("a")],
        };
        let local = StoreCatalog {
            tables: Vec::new(),
            sequences: vec![seq("a"), seq("b")],
        };
        let merged = with_local(Some(&reported), &local);
        let names: Vec<String> = merged
            .sequences
            .iter()
            .map(|q| q.name.to_string())
            .collect();
        assert_eq!(names, ["a", "b"], "a once, then the one the report lacks");
        assert_eq!(
            with_local(None, &local),
            local,
            "no report: this node's catalog"
        );
    }

    #[test]
    fn self_is_replaced_by_the_store_name_only_as_a_word() {
        let store = Ident::unquoted("n1");
        assert_eq!(
            resolve_self(
                "CREATE REPLICATION r ELEMENT e TABLE myself MASTER SELF SUBSCRIBER b -- self\n;",
                &store
            ),
            "CREATE REPLICATION r ELEMENT e TABLE myself MASTER n1 SUBSCRIBER b -- self\n;"
        );
        let quoted = Ident::quoted("Mixed");
        assert_eq!(
            resolve_self(
                "ALTER REPLICATION r ALTER ELEMENT e SET MASTER self",
                &quoted
            ),
            "ALTER REPLICATION r ALTER ELEMENT e SET MASTER \"Mixed\""
        );
    }

    #[test]
    fn refusals_carry_the_checker_code() {
        let e = Command::from_ddl("CREATE REPLICATION r ELEMENT").unwrap_err();
        let r = rejected(e);
        assert!(
            r.code.starts_with("TT") || r.code.starts_with("HW"),
            "{r:?}"
        );
        let r = plane_error(PlaneError::Unavailable {
            leader_addr: Some("10.0.0.1:7420".into()),
            reason: "election".into(),
        });
        assert_eq!(r.code, NO_LEADER);
        assert!(r.message.contains("10.0.0.1:7420"), "{}", r.message);
    }
}
