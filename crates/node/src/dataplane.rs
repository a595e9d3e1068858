//! The node's side of the data plane: which streams this node sends, and what its
//! receiver accepts, both derived from the cluster state Raft agrees on.
//!
//! ```text
//!  plane.subscribe() ─► ClusterState ─► route::plan per scheme ─► links sent by this store
//!        │                                   └─► StreamSender per (scheme, receiver store)
//!        └─► elements this store subscribes to, with epochs ─► ReceiverService epochs watch
//! ```
//!
//! One task ([`run`]) owns every sender. It re-plans when the cluster state changes and
//! once a second (this node's catalog may change without a Raft command). A sender
//! whose [`LinkConfig`] or receiver address changed — a new scheme version, a new
//! epoch, a moved node — is stopped and a new one started; the new one resumes from the
//! receiver's high-water marks, so nothing is sent twice to the store.
//!
//! Catalogs: every node reports its tables and sequences to the cluster when they change
//! ([`crate::cluster::report_catalog`]); the routing plan reads this node's own catalog
//! for its store and, for the others, what they reported plus this node's tables they
//! lack ([`crate::cluster::topology`]). What this node sends is planned from its own
//! catalog (the tables of TABLE elements and the INCLUDE / EXCLUDE of DATASTORE
//! elements it masters); what it receives — the tables it refuses to client writes —
//! from its masters' reports.
//!
//! Log retention: every link this store sends to a receiver in START or PAUSE state
//! holds the log after its *position* — the last LSN its receiver acknowledged
//! durably, kept in the store (`P` keys) so a restarted node resumes there instead of
//! rescanning its whole log. Once a second the positions are saved and the log is
//! released through the lowest of them, keeping at least `log_keep_bytes` of recent
//! log (which is also all a store without streams keeps). Receivers in STOP or FAILED
//! state hold nothing (TimesTen: updates for a stopped subscriber are not retained);
//! their position stays, so when one is started again and the log it lacks is gone,
//! its sender says it needs a duplicate instead of skipping what is missing. A link
//! that leaves every scheme forgets its position.
//!
//! The gRPC client handlers wake every sender after each request that may have
//! committed ([`wake_all`]); the sender's poll (every few milliseconds) covers the rest.
//!
//! A node the cluster removed ([`ControlPlane::removal`]) stops every sender and
//! subscribes its receiver to nothing, for good: it neither sends nor receives.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_control::state::ReceiverState;
use hawser_control::{ClusterState, ControlPlane};
use hawser_core::{Epoch, Ident, Lsn, NodeId, QualName};
use hawser_proto::v1;
use hawser_scheme::ast::ReturnService;
use hawser_scheme::route::{Link, ResolvedTarget};
use hawser_scheme::Topology;
use hawser_sql::{BoxFuture, ReplicationError};
use hawser_store::{Database, Position};
use hawser_stream::returns::{
    ReplicationState, ReturnLevel, ReturnRoutes, ReturnSettings, ReturnWait,
};
use hawser_stream::{
    Compression, DatastoreRule, ForkedRange, LinkConfig, ReceiverService, SenderHandle,
    SenderStart, SenderState, StreamSender,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::returns::{Returns, SubscriberWait};
use crate::senders::Senders;

/// How often the plan is recomputed when the cluster state does not change.
const REPLAN_EVERY: Duration = Duration::from_secs(1);

/// One running sender and what it was started with.
struct Running {
    link: LinkConfig,
    addr: String,
    handle: SenderHandle,
    stop: CancellationToken,
}

/// What the data plane cannot do as the schemes ask, as of its last re-plan (a scheme
/// it cannot plan, a stream it cannot start), for `/replication` and `hawser status`.
pub(crate) type Problems = Arc<parking_lot::Mutex<Vec<String>>>;

/// Why writes are paused after a machine restart until [`fence_check`] lifts it.
pub(crate) const RESTART_FENCE: &str = "the machine restarted since this node last took \
     writes, and commits it shipped before their sync may have been lost with it: waiting \
     for its return-service subscribers to report what they hold of this node's commits";

/// What the restart fence ([`RESTART_FENCE`]) should do now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fence {
    /// Not every receiver that may hold commits shipped before their sync has
    /// answered a Hello since this node started: these have not.
    Wait(Vec<Ident>),
    /// Every one has, and none holds more of this node's commits than it has.
    Lift,
    /// A receiver holds commits of this node's that it lost: writes stay paused.
    Diverged {
        receiver: Ident,
        holds: u64,
        ours: u64,
    },
}

/// Checks the receivers this node ships commits to before their sync (`senders`:
/// each with its status) against `ours`, this node's last own seq. `pending` says
/// which receivers' senders have not yet admitted them after the restart
/// ([`hawser_store::Database::restart_check_pending`]): one of those is waited for even
/// if it was heard, since its acknowledged marks are only published once the check
/// passes (until then they read as empty: holding nothing).
pub(crate) fn fence_check(
    own: NodeId,
    ours: u64,
    senders: &[(Ident, hawser_stream::SenderStatus)],
    pending: impl Fn(&Ident) -> bool,
) -> Fence {
    let mut waiting = Vec::new();
    for (receiver, status) in senders {
        if let hawser_stream::SenderState::Diverged { holds, .. } = status.state {
            // Its sender found it holding more than the restart point (its marks were
            // not taken as acknowledgements).
            return Fence::Diverged {
                receiver: receiver.clone(),
                holds,
                ours,
            };
        }
        if status.last_contact.is_none() || pending(receiver) {
            waiting.push(receiver.clone());
            continue;
        }
        let holds = status.acked_durable.get(&own).copied().unwrap_or(0);
        if holds > ours {
            return Fence::Diverged {
                receiver: receiver.clone(),
                holds,
                ours,
            };
        }
    }
    if waiting.is_empty() {
        Fence::Lift
    } else {
        Fence::Wait(waiting)
    }
}

/// Lifts the restart fence once [`fence_check`] allows it, or says why it stays.
fn check_restart_fence(
    task: &DataPlaneTask,
    state: &ClusterState,
    running: &BTreeMap<(QualName, Ident), Running>,
) {
    let Some(reason) = task.db.writes_paused() else {
        return;
    };
    if !reason.starts_with(RESTART_FENCE) || state.node_by_store(&task.store).is_none() {
        // Not this fence, or the cluster state does not know this node yet (so the
        // links it plans are not yet the ones it had).
        return;
    }
    let statuses: Vec<_> = running
        .iter()
        .filter(|(_, r)| r.handle.ships_written())
        .map(|((_, receiver), r)| (receiver.clone(), r.handle.status().borrow().clone()))
        .collect();
    let own = task.db.node_id();
    let ours = match task.db.high_water(own) {
        Ok(seq) => seq,
        Err(e) => {
            warn!(error = %e, "cannot read this node's high-water");
            return;
        }
    };
    let pending = |receiver: &Ident| task.db.restart_check_pending(receiver.as_str());
    match fence_check(own, ours, &statuses, pending) {
        Fence::Lift => {
            info!(
                receivers = statuses.len(),
                "no subscriber holds commits this node lost in the machine restart: taking writes"
            );
            // Recorded, so that a restart of the process does not fence again; if that
            // fails, it only would.
            if let Err(e) = task.db.lift_restart_fence() {
                warn!(error = %e, "cannot record that the restart fence lifted");
            }
            task.db.pause_writes(None);
        }
        Fence::Wait(_) => {}
        Fence::Diverged {
            receiver,
            holds,
            ours,
        } => {
            let why = format!(
                "{RESTART_FENCE}: subscriber {receiver} holds this node's commits through seq \
                 {holds}, this node only through {ours} (the rest were lost with the \
                 machine); nothing more is sent to {receiver} until it is rebuilt from this \
                 node, and to take writes before that, set its receiver to STOP (hawser \
                 receiver --subscriber {receiver} --state stop)"
            );
            if why != reason {
                warn!("{why}");
                task.db.pause_writes(Some(why));
            }
        }
    }
}

/// The senders the cluster state asks for: link and receiver address, by (scheme,
/// receiver store).
type Wanted = BTreeMap<(QualName, Ident), (LinkConfig, String)>;

/// FAILTHRESHOLD of the master's STORE clause for each link it sends, whatever its
/// receiver's state (0 = no limit).
type Thresholds = BTreeMap<(QualName, Ident), u32>;

/// The links this store sends in the cluster state, whatever their receiver's state
/// (`true`: START or PAUSE, so the link holds log).
type Known = BTreeMap<(QualName, Ident), bool>;

/// The name a link's position is kept under.
fn position_name((scheme, receiver): &(QualName, Ident)) -> String {
    format!("{scheme}\u{1f}{receiver}")
}

/// The last LSN released from the log (the one before its first record).
fn released_through(db: &Database) -> Lsn {
    Lsn(db.log_start().0.saturating_sub(1))
}

/// What [`run`] needs.
pub(crate) struct DataPlaneTask {
    /// Given the return-service routes at each re-plan; fed acks by a watcher per sender.
    pub(crate) returns: Arc<Returns>,
    pub(crate) plane: ControlPlane,
    pub(crate) db: Database,
    pub(crate) store: Ident,
    /// Fed with the elements this store subscribes to; the receiver checks epochs on it.
    pub(crate) epochs: watch::Sender<BTreeMap<Ident, Epoch>>,
    /// Fed with the target of each table this store receives (`AS target`).
    pub(crate) targets: watch::Sender<BTreeMap<QualName, ResolvedTarget>>,
    /// Fed with what failovers forked off; the receiver refuses records of it.
    pub(crate) forked: watch::Sender<Vec<ForkedRange>>,
    /// Fed with the schemes this store must be rebuilt in, keeping what the copy
    /// replaces: it holds commits past a fork point its log no longer shows.
    pub(crate) rebuilds: watch::Sender<BTreeSet<QualName>>,
    pub(crate) senders: Senders,
    pub(crate) problems: Problems,
    pub(crate) tracker: TaskTracker,
    pub(crate) shutdown: CancellationToken,
    /// The unit of FAILTHRESHOLD, in bytes of log (TimesTen's LogFileSize).
    pub(crate) log_file_size: u64,
    /// Recent log kept whatever the streams need.
    pub(crate) log_keep_bytes: u64,
    /// Log held for copies this node serves (a duplicate of a receiver).
    pub(crate) copy_holds: Arc<hawser_stream::CopyHolds>,
    /// How this node's senders compress where the scheme says COMPRESS TRAFFIC ON.
    pub(crate) codec: crate::CompressCodec,
    /// This node's receiver's marks of what each sender decided, read by its relays
    /// (`SenderStart::upstream`).
    pub(crate) decided: hawser_stream::DecidedMarks,
    /// What senders call receivers with when the cluster runs secure.
    pub(crate) peer_tls: Option<tonic::transport::ClientTlsConfig>,
}

/// Keeps this node's senders and its receiver's epochs in line with the cluster state
/// until shutdown.
pub(crate) async fn run(task: DataPlaneTask) {
    let mut state_rx = task.plane.subscribe();
    let mut running: BTreeMap<(QualName, Ident), Running> = BTreeMap::new();
    let mut tick = tokio::time::interval(REPLAN_EVERY);
    let mut problems = BTreeSet::new();
    let mut thresholds = Thresholds::new();
    let mut failing = BTreeMap::new();
    let mut known = Known::new();
    let mut first_seen = BTreeMap::new();
    let mut forks = ForkVerdicts::new();
    let mut positions = match task.db.positions() {
        Ok(p) => p,
        Err(e) => {
            // Without positions nothing is released (every link starts at the log's
            // start and holds it from there).
            warn!(error = %e, "cannot read the streams' retained positions");
            BTreeMap::new()
        }
    };
    let mut removal_rx = task.plane.removal_watch();
    loop {
        let removal = removal_rx.borrow_and_update().clone();
        if let Some(removal) = removal {
            // Removed from the cluster, for good: nothing is sent or received here
            // any more, whatever the state this node applied still says.
            retire(
                &task,
                &mut running,
                &crate::cluster::removal_message(&removal),
            );
            task.shutdown.cancelled().await;
            break;
        }
        let state = state_rx.borrow_and_update().clone();
        task.epochs.send_if_modified(|current| {
            replace_if_changed(current, subscribed(&state, &task.store))
        });
        task.forked
            .send_if_modified(|current| replace_if_changed(current, forked_ranges(&state)));
        let (rules, rule_problems) =
            checked_rules(conflict_rules(&state, &task.store), |t: &QualName| {
                task.db.table(t).map(|t| (*t).clone())
            });
        if let Err(e) = task.db.set_conflict_rules(rules).await {
            warn!(error = %e, "cannot set up conflict checking");
        }
        let Planned {
            mut wanted,
            problems: mut now,
            targets,
        } = wanted_links(
            &state,
            &task.db,
            &task.store,
            &task.returns,
            &mut thresholds,
            &mut known,
            &mut forks,
        );
        if let Err(e) = task.db.set_aggregates(base_aggregates(&targets)).await {
            warn!(error = %e, "cannot keep the BASE AGGREGATE targets");
        }
        task.targets
            .send_if_modified(|current| replace_if_changed(current, targets));
        // The plan says whether to compress (COMPRESS TRAFFIC); the node, with what.
        for (config, _) in wanted.values_mut() {
            if config.compression != Compression::None {
                config.compression = task.codec.compression();
                config.tuning.zstd_level = task.codec.zstd_level();
            }
        }
        now.extend(rule_problems);
        // Each problem is logged once, when it appears, not at every re-plan.
        for p in now.difference(&problems) {
            warn!("{p}");
        }
        if now != problems {
            *task.problems.lock() = now.iter().cloned().collect();
        }
        problems = now;
        reconcile(&task, &mut running, wanted, &positions);
        rejoin(&task, &state, &mut forks).await;
        check_restart_fence(&task, &state, &running);
        metrics::gauge!("hawser_writes_paused")
            .set(f64::from(u8::from(task.db.writes_paused().is_some())));
        if let Some(space) = task.db.space() {
            metrics::gauge!("hawser_disk_free_bytes").set(space.free_bytes as f64);
            metrics::gauge!("hawser_disk_full").set(f64::from(u8::from(space.low)));
        }
        first_seen.retain(|k, _| known.contains_key(k));
        for k in known.keys() {
            first_seen
                .entry(k.clone())
                .or_insert_with(|| task.db.last_lsn());
        }
        check_fail_thresholds(
            &task,
            &running,
            &thresholds,
            &known,
            &Measured {
                positions: &positions,
                first_seen: &first_seen,
            },
            &mut failing,
        );
        retain_log(&task, &running, &known, &mut positions).await;
        export_metrics(&running);
        tokio::select! {
            _ = task.shutdown.cancelled() => break,
            changed = state_rx.changed() => if changed.is_err() { break },
            Ok(()) = removal_rx.changed() => {}
            _ = tick.tick() => {}
        }
    }
    for r in running.values() {
        r.stop.cancel();
    }
}

/// Stops every sender and has the receiver refuse every stream (it subscribes to
/// nothing now), for a node the cluster removed; `why` is what status shows.
fn retire(task: &DataPlaneTask, running: &mut BTreeMap<(QualName, Ident), Running>, why: &str) {
    for ((scheme, receiver), r) in std::mem::take(running) {
        info!(%scheme, %receiver, "stopping sender: this node was removed from the cluster");
        r.stop.cancel();
    }
    task.senders.lock().clear();
    // Nothing is received any more, so no write is refused as another store's to
    // make: every write of its own is refused as the removal's (lease::rescope).
    let seen = task.db.catalog_generation();
    task.db
        .set_write_refusals(std::collections::HashMap::new(), seen);
    task.epochs.send_replace(BTreeMap::new());
    task.rebuilds.send_replace(BTreeSet::new());
    *task.problems.lock() = vec![why.to_string()];
}

fn replace_if_changed<T: PartialEq>(current: &mut T, new: T) -> bool {
    if *current == new {
        return false;
    }
    *current = new;
    true
}

/// Stops senders no longer wanted or wanted differently, starts the missing ones.
fn reconcile(
    task: &DataPlaneTask,
    running: &mut BTreeMap<(QualName, Ident), Running>,
    mut wanted: Wanted,
    positions: &BTreeMap<String, Position>,
) {
    // The status of a sender replaced by a new one (same link, new settings), which
    // carries its counters and acknowledged position on.
    let mut replaced: BTreeMap<(QualName, Ident), hawser_stream::SenderStatus> = BTreeMap::new();
    running.retain(|key, r| {
        let keep = wanted
            .get(key)
            .is_some_and(|(link, addr)| *link == r.link && *addr == r.addr);
        if !keep {
            info!(scheme = %key.0, receiver = %key.1, "stopping sender");
            r.stop.cancel();
            if wanted.contains_key(key) {
                replaced.insert(key.clone(), r.handle.status().borrow().clone());
            }
        }
        keep
    });
    wanted.retain(|key, _| !running.contains_key(key));
    for (key, (link, addr)) in wanted {
        let endpoint = match hawser_tls::endpoint(&addr, task.peer_tls.as_ref()) {
            Ok(e) => e,
            Err(e) => {
                warn!(receiver = %key.1, %addr, error = %e, "bad receiver address");
                continue;
            }
        };
        // A link seen before resumes at its position; a new one starts with the log
        // as it is now. A position another node acknowledged (the store's name given to
        // a node replaced on an empty data directory) is not this one's: it starts
        // from nothing, so that it gets the whole log or is told it needs a duplicate
        // (its marks lack what the log released) — never streamed to as current.
        let resume_after = match positions.get(&position_name(&key)) {
            Some(p)
                if link.receiver_node.0 != 0
                    && p.receiver.is_some_and(|n| n != link.receiver_node) =>
            {
                warn!(
                    scheme = %key.0, receiver = %key.1,
                    acknowledged_by = p.receiver.map_or(0, |n| n.0),
                    now = link.receiver_node.0,
                    "the receiver's store is held by another node than the one that \
                     acknowledged its position: streaming from the log's start"
                );
                Lsn::ZERO
            }
            Some(p) => p.lsn,
            None => released_through(&task.db),
        };
        info!(
            scheme = %key.0, receiver = %key.1, %addr, version = link.scheme_version,
            resume_after = resume_after.0, "starting sender"
        );
        let stop = task.shutdown.child_token();
        let start = SenderStart {
            resume_after,
            previous: replaced.remove(&key),
            on_ack: Some(task.returns.ack_hook(key.1.clone())),
            upstream: Some(task.decided.clone()),
        };
        let handle = StreamSender::spawn(
            link.clone(),
            task.db.clone(),
            endpoint,
            start,
            &task.tracker,
            stop.clone(),
        );
        running.insert(
            key,
            Running {
                link,
                addr,
                handle,
                stop,
            },
        );
    }
    let mut senders = task.senders.lock();
    *senders = running
        .iter()
        .map(|(k, r)| (k.clone(), r.handle.clone()))
        .collect();
}

/// The row-timestamp conflict checking of the tables `store` masters or subscribes to
/// in a TABLE element with `CHECK CONFLICTS BY ROW TIMESTAMP` (defaults: UPDATE BY
/// SYSTEM, ON EXCEPTION ROLLBACK WORK). A table checked by two elements keeps the
/// first's rule (the scheme checker refuses incompatible ones within one scheme).
pub(crate) fn conflict_rules(
    state: &ClusterState,
    store: &Ident,
) -> std::collections::HashMap<QualName, hawser_store::ConflictRule> {
    use hawser_scheme::ast::{CheckConflicts, OnException, UpdateBy};
    let mut out = std::collections::HashMap::new();
    for (_, table, check) in checked_tables(state, store) {
        let CheckConflicts::ByRowTimestamp {
            column,
            update_by,
            on_exception,
            ..
        } = check
        else {
            continue;
        };
        out.entry(table.clone())
            .or_insert_with(|| hawser_store::ConflictRule {
                column: column.clone(),
                by_system: *update_by != Some(UpdateBy::User),
                rollback: *on_exception != Some(OnException::NoAction),
            });
    }
    out
}

/// The TABLE elements with `CHECK CONFLICTS BY ROW TIMESTAMP` that `store` masters or
/// subscribes to, in scheme and element order: each one's scheme, table and clause.
pub(crate) fn checked_tables<'s>(
    state: &'s ClusterState,
    store: &'s Ident,
) -> impl Iterator<
    Item = (
        &'s hawser_scheme::ast::Scheme,
        &'s QualName,
        &'s hawser_scheme::ast::CheckConflicts,
    ),
> + 's {
    use hawser_scheme::ast::{CheckConflicts, ElementKind, StoreName};
    let named = move |n: &StoreName| matches!(n, StoreName::Named(s) if s == store);
    state.schemes.values().flat_map(move |s| {
        s.scheme
            .elements
            .iter()
            .filter_map(move |el| match &el.kind {
                ElementKind::Table {
                    table,
                    check: Some(check @ CheckConflicts::ByRowTimestamp { .. }),
                    ..
                } if named(&el.owner.name) || el.subscriber_stores().any(|r| named(&r.name)) => {
                    Some((&s.scheme, table, check))
                }
                _ => None,
            })
    })
}

/// The rules of `rules` whose timestamp column is a nullable `BINARY(8)` column outside
/// the primary key of the table here (`table` looks a table up; TimesTen's TT2208 and
/// TT8004); and why each other one is not applied. A table not here yet has nothing to
/// check: its rule waits for it, without a problem.
pub(crate) fn checked_rules(
    rules: std::collections::HashMap<QualName, hawser_store::ConflictRule>,
    table: impl Fn(&QualName) -> Option<hawser_core::TableDef>,
) -> (
    std::collections::HashMap<QualName, hawser_store::ConflictRule>,
    BTreeSet<String>,
) {
    let mut problems = BTreeSet::new();
    let kept = rules
        .into_iter()
        .filter(|(name, rule)| {
            let Some(def) = table(name) else {
                return false;
            };
            let why = match def.column_index(&rule.column) {
                None => Some(format!("has no column {} (TT2208)", rule.column)),
                Some(i) if def.is_key_column(i) => {
                    Some(format!("has {} in its primary key (TT8004)", rule.column))
                }
                Some(i)
                    if def.columns[i].data_type != hawser_core::DataType::Binary(8)
                        || !def.columns[i].nullable =>
                {
                    Some(format!(
                        "has {} as {}{}, not a nullable BINARY(8) (TT8004)",
                        rule.column,
                        def.columns[i].data_type,
                        if def.columns[i].nullable {
                            ""
                        } else {
                            " NOT NULL"
                        }
                    ))
                }
                Some(_) => None,
            };
            if let Some(why) = &why {
                problems.insert(format!(
                    "table {name} {why}: its CHECK CONFLICTS BY ROW TIMESTAMP is not \
                     applied; received changes overwrite it unchecked"
                ));
            }
            why.is_none()
        })
        .collect();
    (kept, problems)
}

/// The elements `store` subscribes to in any scheme, with their current epochs. An
/// element name used by two schemes keeps the higher epoch.
fn subscribed(state: &ClusterState, store: &Ident) -> BTreeMap<Ident, Epoch> {
    let mut out = BTreeMap::new();
    for s in state.schemes.values() {
        for el in &s.scheme.elements {
            let subscribes = el
                .subscriber_stores()
                .any(|r| matches!(&r.name, hawser_scheme::ast::StoreName::Named(n) if n == store));
            let Some(es) = s.elements.get(&el.name) else {
                continue;
            };
            if subscribes {
                let e = out.entry(el.name.clone()).or_insert(es.epoch);
                *e = (*e).max(es.epoch);
            }
        }
    }
    out
}

/// What the routing plans are made from ([`crate::cluster::topology`]: this node's
/// catalog for `store`, the reported ones for the others); and the stores' node ids.
pub(crate) fn local_topology(
    state: &ClusterState,
    db: &Database,
    store: &Ident,
) -> (Topology, BTreeMap<Ident, NodeId>) {
    let topology = crate::cluster::topology(state, db, store);
    let nodes = topology.nodes.clone();
    (topology, nodes)
}

/// What [`wanted_links`] plans for this store.
struct Planned {
    /// The links it sends.
    wanted: Wanted,
    /// Why some cannot be streamed now, and what is wrong with its targets.
    problems: BTreeSet<String>,
    /// The target of each table it receives, by source table.
    targets: BTreeMap<QualName, ResolvedTarget>,
}

/// The links `store` sends, with the receiver's gRPC address, by (scheme, receiver);
/// and why some links cannot be streamed now. Also gives `returns` the routes of this
/// store's return services and the database the tables it receives (refused to
/// client writes).
fn wanted_links(
    state: &ClusterState,
    db: &Database,
    store: &Ident,
    returns: &Returns,
    thresholds: &mut Thresholds,
    known: &mut Known,
    forks: &mut ForkVerdicts,
) -> Planned {
    thresholds.clear();
    known.clear();
    let mut replication: BTreeMap<Ident, ReplicationState> = BTreeMap::new();
    // Before the catalog is read: tables replicated DDL creates from here on stay
    // refused until a later plan has seen them (`Database::set_write_refusals`).
    let seen = db.catalog_generation();
    let (topology, nodes) = local_topology(state, db, store);
    db.set_store_names(
        nodes
            .iter()
            .map(|(store, id)| (*id, store.to_string()))
            .collect(),
    );
    let mut out = BTreeMap::new();
    let mut problems = BTreeSet::new();
    let mut all_links = Vec::new();
    let mut ds_routes: Vec<DatastoreRoute> = Vec::new();
    let mut received: Vec<(QualName, String)> = Vec::new();
    // Streams other nodes send: (scheme, sender, receiver) and what each carries.
    let mut foreign: Vec<((QualName, Ident, Ident), LinkConfig)> = Vec::new();
    // Every scheme's planned streams, whoever sends them.
    let mut planned: Vec<Link> = Vec::new();
    // Per origin, the senders of the streams into this store that carry it and run
    // (this store in START or PAUSE as their receiver).
    let mut upstream: BTreeMap<NodeId, BTreeSet<NodeId>> = BTreeMap::new();
    for (name, s) in &state.schemes {
        let mut plan = match hawser_scheme::plan(&s.scheme, &topology) {
            Ok(p) => p,
            Err(errors) => {
                let first = errors
                    .first()
                    .map(|e| e.message.clone())
                    .unwrap_or_default();
                problems.insert(format!("scheme {name}: cannot plan its streams: {first}"));
                continue;
            }
        };
        add_relays(&mut plan.links, s, &nodes);
        // A return service the cluster state disables is not waited for: commits to
        // the subscriber go asynchronously, as the failover choice assumes
        // (`failover::decide` counts a subscriber a holder of acknowledged commits
        // only while its return service is enabled). A master deposed by a failover
        // has its receiver STOPPED and its return service DISABLED in the same Raft
        // entry: nothing waits for it, whatever RETURN SERVICES ... WHEN REPLICATION
        // STOPPED says, until it has rejoined.
        for link in &mut plan.links {
            let disabled = s.return_service_state(&link.receiver)
                == hawser_control::state::ReturnServiceState::Disabled;
            if disabled {
                for t in &mut link.tables {
                    t.return_service = hawser_scheme::ast::ReturnService::NoReturn;
                    t.return_when_stopped = false;
                }
            }
        }
        let epochs: BTreeMap<Ident, Epoch> = s
            .elements
            .iter()
            .map(|(n, e)| (n.clone(), e.epoch))
            .collect();
        // DATASTORE elements: their INCLUDE / EXCLUDE table lists, so tables created
        // after this plan are carried (and waited for) too.
        let datastore: BTreeMap<&Ident, TableLists> = s
            .scheme
            .elements
            .iter()
            .filter(|e| matches!(e.kind, hawser_scheme::ast::ElementKind::Datastore))
            .map(|e| (&e.name, table_lists(e)))
            .collect();
        for link in plan.links.iter().filter(|l| &l.sender == store) {
            let mut seen = BTreeSet::new();
            for t in link.tables.iter().filter(|t| &t.origin == store) {
                let Some((include, exclude)) = datastore.get(&t.element) else {
                    continue;
                };
                if seen.insert(&t.element) {
                    ds_routes.push((
                        link.receiver.clone(),
                        include.clone(),
                        exclude.clone(),
                        t.return_service,
                        t.return_when_stopped,
                    ));
                }
            }
        }
        for link in plan.links.iter().filter(|l| &l.receiver == store) {
            if matches!(
                s.receiver_state(store),
                ReceiverState::Start | ReceiverState::Pause
            ) {
                let origins = link.tables.iter().map(|t| &t.origin);
                let origins = origins.chain(link.sequences.iter().map(|q| &q.origin));
                for origin in origins.filter(|o| *o != store) {
                    if let (Some(o), Some(from)) = (nodes.get(origin), nodes.get(&link.sender)) {
                        upstream.entry(*o).or_default().insert(*from);
                    }
                }
            }
            for t in link.tables.iter().filter(|t| &t.origin != store) {
                // What this store writes: the target table (and a BASE AGGREGATE's
                // copy of the source).
                for written in hawser_target::written_tables(&t.table, &t.target) {
                    received.push((
                        written,
                        format!(
                            "{store} receives it from master {} (scheme {name}, element {}); \
                             write it on {}",
                            t.origin, t.element, t.origin
                        ),
                    ));
                }
            }
        }
        all_links.extend(plan.links.iter().filter(|l| &l.sender == store).cloned());
        for link in plan.links.iter().filter(|l| &l.sender == store) {
            if link.tables.is_empty() && link.sequences.is_empty() {
                continue;
            }
            // PAUSE, STOP and FAILED receivers get nothing; commits stop waiting for
            // them under RETURN SERVICES OFF WHEN REPLICATION STOPPED.
            let rstate = match s.receiver_state(&link.receiver) {
                ReceiverState::Start => ReplicationState::Start,
                ReceiverState::Pause => ReplicationState::Pause,
                ReceiverState::Stop => ReplicationState::Stop,
                ReceiverState::Failed => ReplicationState::Failed,
            };
            known.insert(
                (name.clone(), link.receiver.clone()),
                matches!(rstate, ReplicationState::Start | ReplicationState::Pause),
            );
            thresholds.insert(
                (name.clone(), link.receiver.clone()),
                link.sender_settings.fail_threshold,
            );
            let e = replication.entry(link.receiver.clone()).or_default();
            if rstate != ReplicationState::Start {
                *e = rstate;
                continue;
            }
            let config = match link_config(link, s.version, &nodes, &epochs, &datastore) {
                Ok(mut c) => {
                    relay_replaced_masters(&mut c, s, &nodes);
                    c
                }
                Err(e) => {
                    let to = &link.receiver;
                    problems.insert(format!("scheme {name}: no stream to {to} yet: {e}"));
                    continue;
                }
            };
            let Some(addr) = state
                .node_by_store(&link.receiver)
                .map(|n| n.grpc_addr.clone())
            else {
                continue;
            };
            out.insert((name.clone(), link.receiver.clone()), (config, addr));
        }
        // The streams other nodes send that run (their receiver in START): a receiver
        // they share with this node's gets some origin's transactions by both.
        for link in plan.links.iter().filter(|l| &l.sender != store) {
            if s.receiver_state(&link.receiver) != ReceiverState::Start {
                continue;
            }
            // A sender stopped or failed as a receiver of this scheme gets no other
            // origin's commits to relay: nobody waits for it to relay them (its own
            // commits it still sends).
            let relays = !matches!(
                s.receiver_state(&link.sender),
                ReceiverState::Stop | ReceiverState::Failed
            );
            let mut link = link.clone();
            if !relays {
                link.tables.retain(|t| t.origin == link.sender);
                link.sequences.retain(|t| t.origin == link.sender);
            }
            if link.tables.is_empty() && link.sequences.is_empty() {
                continue;
            }
            if let Ok(mut config) = link_config(&link, s.version, &nodes, &epochs, &datastore) {
                if relays {
                    relay_replaced_masters(&mut config, s, &nodes);
                }
                foreign.push((
                    (name.clone(), link.sender.clone(), link.receiver.clone()),
                    config,
                ));
            }
        }
        planned.extend(plan.links.iter().cloned());
    }
    // Every stream to the same receiver node — from this node (several schemes) or
    // from another (a propagator beside a master's own stream) — keeps each origin's
    // transactions in seq order between them (`LinkConfig::siblings`): the receiver
    // keeps one high-water per origin.
    let configs: Vec<((QualName, Ident, Ident), LinkConfig)> = out
        .iter()
        .map(|((scheme, receiver), (c, _))| {
            ((scheme.clone(), store.clone(), receiver.clone()), c.clone())
        })
        .chain(foreign)
        .collect();
    let (targets, target_problems) = inbound_targets(store, &planned);
    problems.extend(target_problems);
    let unseen = unseen_paths(store, &planned);
    let in_parts: BTreeSet<NodeId> = received_in_parts(store, &planned)
        .iter()
        .filter_map(|o| nodes.get(o).copied())
        .collect();
    for ((scheme, receiver), (config, _)) in out.iter_mut() {
        let own = (scheme.clone(), store.clone(), receiver.clone());
        config.siblings = configs
            .iter()
            .filter(|(k, c)| *k != own && c.receiver_node == config.receiver_node)
            .map(|(_, c)| c.clone())
            .collect();
        // Origins this stream relays without seeing all their transactions that a
        // stream running beside it (the origin's own, or another relay's) sends the
        // same receiver.
        config.blind = unseen
            .iter()
            .filter(|u| &u.receiver == receiver)
            .filter_map(|u| Some((*nodes.get(&u.origin)?, *nodes.get(&u.sender)?)))
            .filter(|(_, from)| config.siblings.iter().any(|s| s.sender_node == *from))
            .map(|(origin, _)| origin)
            .collect();
        config.upstream.clone_from(&upstream);
        // Origins this store gets in parts, which this stream relays on.
        config.parts = in_parts
            .iter()
            .copied()
            .filter(|o| config.carries_origin(*o))
            .collect();
        // The receiver relays an origin this stream carries beside another path to
        // the same store: it needs this stream's decisions about that origin.
        config.read_by_siblings = read_by_siblings(store, receiver, &planned);
        config.feeds_relay = unseen_paths(receiver, &planned).iter().any(|u| {
            nodes
                .get(&u.origin)
                .is_some_and(|o| *o != config.sender_node && config.carries_origin(*o))
        });
    }
    set_returns(returns, store, &all_links, ds_routes);
    returns.set_replication(replication);
    // A table this store also masters (bidirectional, general workload) stays writable.
    let mastered: BTreeSet<&QualName> = all_links
        .iter()
        .flat_map(|l| l.tables.iter())
        .filter(|t| &t.origin == store)
        .map(|t| &t.table)
        .collect();
    let mut refusals = std::collections::HashMap::new();
    for (table, reason) in received {
        if !mastered.contains(&table) {
            refusals.entry(table).or_insert(reason);
        }
    }
    db.set_write_refusals(refusals, seen);
    // What failovers forked off is never shipped, whoever masters now.
    let forked = forked_ranges(state);
    for (config, _) in out.values_mut() {
        config.forked.clone_from(&forked);
    }
    match db.high_waters() {
        Ok(held) => problems.extend(past_fork_points(state, store, &held, |f| {
            forks.holds(db, &f)
        })),
        Err(e) => warn!(error = %e, "cannot read the high-water marks"),
    }
    Planned {
        wanted: out,
        problems,
        targets,
    }
}

/// The BASE AGGREGATE targets among `targets` (by source table): the store keeps them.
fn base_aggregates(targets: &BTreeMap<QualName, ResolvedTarget>) -> hawser_store::AggregateRules {
    targets
        .iter()
        .filter(|(table, t)| hawser_target::keeps_copy(table, t))
        .map(|(table, t)| (table.clone(), t.clone()))
        .collect()
}

/// The target of each table `store` receives, by source table, from every scheme's
/// links into it; and what is wrong with them: a table given two targets (the first
/// kept), a CCD or CHANGE AGGREGATE fed by several origins (their commit sequence
/// numbers are independent, so IBMSNAP_COMMITSEQ may repeat).
fn inbound_targets(
    store: &Ident,
    planned: &[Link],
) -> (BTreeMap<QualName, ResolvedTarget>, BTreeSet<String>) {
    let mut out: BTreeMap<QualName, ResolvedTarget> = BTreeMap::new();
    let mut origins: BTreeMap<QualName, BTreeSet<&Ident>> = BTreeMap::new();
    let mut problems = BTreeSet::new();
    for link in planned.iter().filter(|l| &l.receiver == store) {
        for t in link.tables.iter().filter(|t| &t.origin != store) {
            let kind = hawser_target::kind_name(&t.target.kind);
            origins
                .entry(t.table.clone())
                .or_default()
                .insert(&t.origin);
            match out.get(&t.table) {
                None => {
                    out.insert(t.table.clone(), t.target.clone());
                }
                Some(first) if first != &t.target => {
                    problems.insert(format!(
                        "table {}: two schemes give store {store} two targets for it ({} into \
                         {} and {kind} into {}); the first is kept",
                        t.table,
                        hawser_target::kind_name(&first.kind),
                        first.into,
                        t.target.into
                    ));
                }
                Some(_) => {}
            }
        }
    }
    for (table, from) in origins.iter().filter(|(_, o)| o.len() > 1) {
        if let Some(t) = out.get(table).filter(|t| {
            matches!(
                t.kind,
                hawser_scheme::ast::TargetKind::Ccd { .. }
                    | hawser_scheme::ast::TargetKind::ChangeAggregate { .. }
            )
        }) {
            problems.insert(format!(
                "table {table}: its {} on store {store} is fed by {} origins, whose commit \
                 sequence numbers are independent: IBMSNAP_COMMITSEQ orders each origin's \
                 changes only",
                hawser_target::kind_name(&t.kind),
                from.len()
            ));
        }
    }
    (out, problems)
}

/// What every failover in the cluster state forked off: per element history record
/// with a fork point, the deposed origin's commits past it stamped with an older
/// failover era (the `epoch` of log records is the era their committer knew).
fn forked_ranges(state: &ClusterState) -> Vec<ForkedRange> {
    let ranges: BTreeSet<ForkedRange> = state
        .schemes
        .values()
        .flat_map(|s| {
            s.scheme.elements.iter().flat_map(move |el| {
                s.elements
                    .get(&el.name)
                    .into_iter()
                    .flat_map(|e| e.history.iter())
                    .filter_map(move |r| fork_range(el, r))
            })
        })
        .collect();
    ranges.into_iter().collect()
}

/// What the failover of element `el` recorded in `record` forked off, if it was one.
fn fork_range(
    el: &hawser_scheme::ast::Element,
    record: &hawser_control::state::EpochRecord,
) -> Option<ForkedRange> {
    let fork = record.fork_point?;
    let tables = match &el.kind {
        hawser_scheme::ast::ElementKind::Table { table, .. } => Some(vec![table.clone()]),
        hawser_scheme::ast::ElementKind::Datastore => None,
        hawser_scheme::ast::ElementKind::Sequence { .. } => Some(Vec::new()),
    };
    Some(ForkedRange {
        origin: fork.origin,
        after_seq: fork.seq,
        before_epoch: Epoch(record.era?),
        tables,
    })
}

/// Whether this store's log holds a commit of a [`ForkedRange`], found once and kept:
/// no such commit arrives later (a deposed master's stream is refused for its stale
/// epoch, and senders pass them over), so the answer does not change.
/// A duplicate that finished since replaced the tables, and with them what the log
/// before it says: the answers start again.
pub(crate) struct ForkVerdicts {
    known: BTreeMap<ForkedRange, Option<bool>>,
    rebuilt: hawser_store::Rebuilt,
}

impl ForkVerdicts {
    fn new() -> Self {
        Self {
            known: BTreeMap::new(),
            rebuilt: hawser_store::Rebuilt::default(),
        }
    }

    /// `Some(found)`, or `None` when the log cannot tell (released past the fork
    /// point, or too long to read back through). A store rebuilt whole since it heard
    /// of the failover holds none: they all precede the rebuild.
    fn holds(&mut self, db: &Database, f: &ForkedRange) -> Option<bool> {
        match db.rebuilt() {
            Ok(r) if r != self.rebuilt => {
                self.rebuilt = r;
                self.known.clear();
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot read when this store was last rebuilt"),
        }
        if self.rebuilt.era >= f.before_epoch {
            return Some(false);
        }
        if let Some(v) = self.known.get(f) {
            return *v;
        }
        let through = self.rebuilt.through;
        let verdict = match off_the_runtime(|| {
            // A commit of this node's own that passed its lease check before it was
            // deposed may be finishing its append (a process stopped mid-commit and
            // continued): let it, so the answer kept below counts it.
            if f.origin == db.node_id() {
                db.commit_barrier();
            }
            forked_records(db, f, through)
        }) {
            Ok((found, _)) if !found.is_empty() => Some(true),
            Ok((_, true)) => Some(false),
            Ok((_, false)) => None,
            Err(e) => {
                warn!(error = %e, "cannot read the log for commits a failover forked off");
                return None;
            }
        };
        self.known.insert(f.clone(), verdict);
        verdict
    }

    /// Forgets every verdict: commits were set aside, so ranges found before may hold
    /// none now.
    fn forget(&mut self) {
        self.known.clear();
    }

    /// The ranges found in this store's log (since it was last rebuilt).
    fn found(&self) -> Vec<ForkedRange> {
        self.known
            .iter()
            .filter(|(_, v)| **v == Some(true))
            .map(|(f, _)| f.clone())
            .collect()
    }

    /// Whether every range of `origin` is known to be absent from the log.
    fn none_of(&self, origin: NodeId) -> bool {
        self.known
            .iter()
            .filter(|(f, _)| f.origin == origin)
            .all(|(_, v)| *v == Some(false))
    }
}

/// Runs `f`, which reads the store's log synchronously (from a fork point to the end
/// of the log, perhaps a long way), without holding up the other tasks of a
/// multi-threaded runtime: this worker hands them on first. Elsewhere it just runs.
fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// The records of range `f` in `db`'s log after LSN `rebuilt`, oldest first, and
/// whether the log could say (see [`Database::commits_after`]).
fn forked_records(
    db: &Database,
    f: &ForkedRange,
    rebuilt: Lsn,
) -> Result<(Vec<hawser_store::LogRecord>, bool), hawser_store::StoreError> {
    let (records, complete) =
        db.commits_after(f.origin, f.after_seq, u64::MAX, usize::MAX, |r| {
            // One set aside before (for this failover or another) stays set aside; a
            // mark that cannot be read counts as none, and the undo finds nothing left.
            let aside = db.is_set_aside(r.entry.gtid()).unwrap_or(false);
            (r.lsn > rebuilt && !aside && f.holds(r.epoch, &r.entry)).then_some(r)
        })?;
    Ok((records.into_iter().flatten().collect(), complete))
}

/// Sets aside what this store holds of the ranges `forks` found (docs/control.md,
/// "Rejoin"), and starts this store's receiver again where a failover stopped it as
/// the deposed master and nothing of it is left to set aside.
async fn rejoin(task: &DataPlaneTask, state: &ClusterState, forks: &mut ForkVerdicts) {
    let found = forks.found();
    if !found.is_empty() {
        let rebuilt = forks.rebuilt.through;
        let mut records: BTreeMap<Lsn, hawser_store::LogRecord> = BTreeMap::new();
        for f in &found {
            match off_the_runtime(|| forked_records(&task.db, f, rebuilt)) {
                Ok((rs, _)) => records.extend(rs.into_iter().map(|r| (r.lsn, r))),
                Err(e) => {
                    warn!(error = %e, "cannot read the commits a failover forked off");
                    return;
                }
            }
        }
        let records: Vec<_> = records.into_values().collect();
        match task.db.set_aside(&records).await {
            Ok(counts) => {
                // They are marked now: the next look finds the ranges without them.
                forks.forget();
                metrics::counter!("hawser_set_aside_commits_total").increment(counts.commits);
                warn!(
                    commits = counts.commits,
                    changes = counts.changes,
                    undone = counts.undone,
                    "set aside commits a failover forked off: undone where their rows still \
                     held them, and kept in hawser_lost"
                );
            }
            Err(e) => warn!(error = %e, "cannot set aside the commits a failover forked off"),
        }
        return;
    }
    // Where the log cannot tell what this store holds past a fork point: rebuilt
    // from the master, what the copy replaces kept (`duplicate::auto_rebuild`).
    let rebuild: BTreeSet<QualName> = match task.db.high_waters() {
        Ok(held) => {
            let past = past_forks(state, &task.store, &held, |f| forks.holds(&task.db, &f));
            if past.is_empty() {
                // Every failover of this state is judged: this store holds nothing any
                // of them forked off. Kept, so that a restart does not ask again of a
                // log released since (it could not tell, and would rebuild the store).
                if let Err(e) = task.db.settle_forks(Epoch(state.era)) {
                    warn!(error = %e, "cannot record the failovers judged");
                }
            }
            past.into_iter()
                .filter(|p| p.log_cannot_tell)
                .map(|p| p.scheme)
                .collect()
        }
        Err(_) => BTreeSet::new(),
    };
    task.rebuilds
        .send_if_modified(|current| replace_if_changed(current, rebuild));
    let me = task.db.node_id();
    if !forks.none_of(me) {
        return;
    }
    for (name, s) in &state.schemes {
        if !s.is_deposed(state, &task.store) {
            continue;
        }
        let cmd = hawser_control::Command::SetReceiverState {
            scheme: name.clone(),
            store: task.store.clone(),
            state: ReceiverState::Start,
        };
        match task.plane.propose(cmd).await {
            Ok(_) => info!(
                scheme = %name,
                "this deposed master holds nothing past its fork point: receiving again"
            ),
            Err(e) => debug!(error = %e, "cannot start this node's receiver yet"),
        }
    }
}

/// Where this store holds commits of a deposed master past the fork point of a
/// failover of an element it takes part in: commits no survivor that took over has,
/// acknowledged without a return service (or in flight) when the master died. Setting
/// them aside is not built yet, so the copy differs from the new master's: said, never
/// silent (DESIGN §10.4), with the way to rebuild it. `in_log` says whether this
/// store's log holds a commit of the range (`None`: it cannot tell; then a high-water
/// past the fork point is taken as holding one).
fn past_fork_points(
    state: &ClusterState,
    store: &Ident,
    held: &BTreeMap<NodeId, u64>,
    in_log: impl FnMut(ForkedRange) -> Option<bool>,
) -> Vec<String> {
    past_forks(state, store, held, in_log)
        .into_iter()
        .map(|p| p.text)
        .collect()
}

/// A failover's fork point this store holds commits past ([`past_forks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct PastFork {
    scheme: QualName,
    /// What to tell the operator.
    text: String,
    /// The log cannot say which commits they are: the store must be rebuilt.
    log_cannot_tell: bool,
}

/// [`past_fork_points`], with the scheme of each and whether the log can tell.
fn past_forks(
    state: &ClusterState,
    store: &Ident,
    held: &BTreeMap<NodeId, u64>,
    mut in_log: impl FnMut(ForkedRange) -> Option<bool>,
) -> Vec<PastFork> {
    let mut out = Vec::new();
    for (name, s) in &state.schemes {
        for el in &s.scheme.elements {
            let takes_part = std::iter::once(&el.owner)
                .chain(el.subscriber_stores())
                .any(|r| matches!(&r.name, hawser_scheme::ast::StoreName::Named(n) if n == store));
            let Some(es) = s.elements.get(&el.name) else {
                continue;
            };
            if !takes_part {
                continue;
            }
            for record in &es.history {
                let (Some(range), Some(fork)) = (fork_range(el, record), record.fork_point) else {
                    continue;
                };
                let holds = held.get(&fork.origin).copied().unwrap_or(0);
                if holds <= fork.seq {
                    continue;
                }
                let verdict = in_log(range);
                let then = match verdict {
                    Some(false) => continue,
                    Some(true) => "they are set aside into hawser_lost",
                    None => {
                        "its log no longer shows which they are: this store is rebuilt \
                         from the master by a duplicate that keeps every row it replaces \
                         in hawser_lost (origin 0)"
                    }
                };
                out.push(PastFork {
                    scheme: name.clone(),
                    text: format!(
                        "scheme {name}, element {}: this store holds commits of node {} \
                         through seq {holds}, past the fork point {fork} of the failover to \
                         {} (epoch {}), which the new master does not have: {then}",
                        el.name, fork.origin, record.master, record.epoch.0
                    ),
                    log_cannot_tell: verdict.is_none(),
                });
            }
        }
    }
    out
}

/// Master catch-up after a failover (DESIGN §5): the current master of an element also
/// sends each subscriber the transactions of the element's earlier masters, origin
/// kept, that it holds and the subscriber lacks. A subscriber that was behind the
/// promoted one when its old master died thereby gets every commit up to the fork
/// point before the new master's own (each origin has its own high-water, and the
/// stream resumes from the receiver's): the surviving copies converge. An earlier
/// master is never sent its own transactions back.
///
/// An earlier master whose store no node holds now (removed) is left to
/// [`relay_replaced_masters`], which relays by node id: a link naming a store without a
/// node could not be streamed at all.
fn add_relays(
    links: &mut [Link],
    s: &hawser_control::state::SchemeState,
    nodes: &BTreeMap<Ident, NodeId>,
) {
    for link in links.iter_mut() {
        let mut relays = Vec::new();
        for t in link.tables.iter().filter(|t| t.origin == link.sender) {
            let Some(history) = s.elements.get(&t.element).map(|e| &e.history) else {
                continue;
            };
            let earlier: BTreeSet<&Ident> = history
                .iter()
                .map(|r| &r.master)
                .filter(|m| **m != link.sender && **m != link.receiver)
                .filter(|m| nodes.contains_key(*m))
                .collect();
            for master in earlier {
                let mut relay = t.clone();
                relay.origin = master.clone();
                relays.push(relay);
            }
        }
        for relay in relays {
            let carried = link
                .tables
                .iter()
                .any(|t| t.table == relay.table && t.origin == relay.origin);
            if !carried {
                link.tables.push(relay);
            }
        }
    }
}

/// Earlier masters of the link's elements whose store another node holds now (one
/// replaced on an empty data directory, `--replace`) or nobody: their transactions carry
/// the old node's id, which the store-keyed plan ([`add_relays`]) maps to no node. The
/// sender relays them by that id like any earlier master's, to every receiver — the
/// store's new holder included, which never had them (an earlier master is never sent
/// its own transactions back: that is by node, and the new holder is another node).
fn relay_replaced_masters(
    config: &mut LinkConfig,
    s: &hawser_control::state::SchemeState,
    nodes: &BTreeMap<Ident, NodeId>,
) {
    let (sender, receiver) = (config.sender_node, config.receiver_node);
    let replaced = |element: &Ident| -> Vec<NodeId> {
        s.elements
            .get(element)
            .map(|e| {
                e.history
                    .iter()
                    .filter_map(|r| r.node.filter(|n| nodes.get(&r.master) != Some(n)))
                    .filter(|n| *n != sender && *n != receiver)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut tables = Vec::new();
    for ((table, origin), element) in &config.tables {
        if *origin == sender {
            for old in replaced(element) {
                tables.push(((table.clone(), old), element.clone()));
            }
        }
    }
    for (key, element) in tables {
        config.tables.entry(key).or_insert(element);
    }
    let mut rules = Vec::new();
    for rule in config.datastore.iter().filter(|r| r.origin == sender) {
        for old in replaced(&rule.element) {
            let known = config
                .datastore
                .iter()
                .any(|r| r.element == rule.element && r.origin == old);
            if !known {
                rules.push(DatastoreRule {
                    origin: old,
                    ..rule.clone()
                });
            }
        }
    }
    config.datastore.extend(rules);
}

/// A table of `origin` that `sender` sends `receiver`, which this store also sends
/// `origin`'s transactions to, and which this store does not receive: this store's
/// log lacks those transactions, so its stream cannot see them to wait for them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unseen {
    store: Ident,
    receiver: Ident,
    origin: Ident,
    sender: Ident,
    table: QualName,
}

/// Where this store forwards another origin's transactions to a receiver that also
/// gets some of that origin's tables from another sender, in tables this store does
/// not receive (see [`Unseen`]).
fn unseen_paths(store: &Ident, links: &[Link]) -> Vec<Unseen> {
    let inbound: BTreeSet<(&QualName, &Ident)> = links
        .iter()
        .filter(|l| &l.receiver == store)
        .flat_map(|l| l.tables.iter().map(|t| (&t.table, &t.origin)))
        .collect();
    let mut out = Vec::new();
    for mine in links.iter().filter(|l| &l.sender == store) {
        let forwarded: BTreeSet<&Ident> = mine
            .tables
            .iter()
            .map(|t| &t.origin)
            .filter(|o| *o != store)
            .collect();
        for other in links
            .iter()
            .filter(|l| &l.sender != store && l.receiver == mine.receiver)
        {
            for t in &other.tables {
                if forwarded.contains(&t.origin) && !inbound.contains(&(&t.table, &t.origin)) {
                    out.push(Unseen {
                        store: store.clone(),
                        receiver: mine.receiver.clone(),
                        origin: t.origin.clone(),
                        sender: other.sender.clone(),
                        table: t.table.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Whether another sender's stream to `receiver` is blind for an origin this store
/// relays there, because of a table this store sends that the other does not receive:
/// that stream waits for what this store's stream decides about the origin
/// (`LinkConfig::read_by_siblings`).
fn read_by_siblings(store: &Ident, receiver: &Ident, links: &[Link]) -> bool {
    let others: BTreeSet<&Ident> = links
        .iter()
        .filter(|l| &l.receiver == receiver && &l.sender != store)
        .map(|l| &l.sender)
        .collect();
    others.into_iter().any(|x| {
        unseen_paths(x, links)
            .iter()
            .any(|u| &u.receiver == receiver && &u.sender == store && &u.origin != store)
    })
}

/// The origins this store gets from two relays that each carry tables of the origin
/// the other does not receive: a transaction writing tables of both reaches it in two
/// parts, two log records under one Gtid, and a stream relaying the origin on from here
/// ships both (`LinkConfig::parts`; docs/stream.md, "Two blind relays").
fn received_in_parts(store: &Ident, links: &[Link]) -> BTreeSet<Ident> {
    let senders: BTreeSet<&Ident> = links
        .iter()
        .filter(|l| &l.receiver == store)
        .map(|l| &l.sender)
        .collect();
    senders
        .into_iter()
        .flat_map(|x| unseen_paths(x, links))
        .filter(|u| &u.receiver == store && u.sender != u.origin)
        .map(|u| u.origin)
        .collect()
}

/// The stream `link` plans, for one of this node's senders or as another node's
/// stream a sender of this node must keep order with (`LinkConfig::siblings`).
fn link_config(
    link: &Link,
    version: u64,
    nodes: &BTreeMap<Ident, NodeId>,
    epochs: &BTreeMap<Ident, Epoch>,
    datastore: &BTreeMap<&Ident, TableLists>,
) -> Result<LinkConfig, hawser_stream::LinkError> {
    let mut config = LinkConfig::from_link(link, version, nodes, epochs)?;
    config.replicate_ddl = link
        .tables
        .iter()
        .any(|t| datastore.contains_key(&t.element));
    let mut rules: BTreeMap<(Ident, NodeId), DatastoreRule> = BTreeMap::new();
    for t in &link.tables {
        let (Some((include, exclude)), Some(origin)) =
            (datastore.get(&t.element), nodes.get(&t.origin))
        else {
            continue;
        };
        rules
            .entry((t.element.clone(), *origin))
            .or_insert_with(|| DatastoreRule {
                element: t.element.clone(),
                origin: *origin,
                include: include.clone(),
                exclude: exclude.clone(),
            });
    }
    config.datastore = rules.into_values().collect();
    Ok(config)
}

/// Per outbound stream, for `/metrics` (refreshed at every re-plan, at least once a
/// second): whether it streams, its lag in log records and seconds, the smoothed round
/// trip of its acks, time since the receiver was last heard, how long it has been held
/// for another stream's transaction (0 while it ships), and transactions and bytes (raw
/// and on the wire) sent.
fn export_metrics(running: &BTreeMap<(QualName, Ident), Running>) {
    for ((scheme, receiver), r) in running {
        let s = r.handle.status().borrow().clone();
        let labels = [
            ("scheme", scheme.to_string()),
            ("receiver", receiver.to_string()),
        ];
        let streaming = matches!(s.state, SenderState::Streaming);
        metrics::gauge!("hawser_stream_up", &labels).set(f64::from(u8::from(streaming)));
        // The receiver cannot be caught up by this stream: it lacks log released here,
        // or diverged. Only a duplicate rebuilds it (alert HawserSubscriberNeedsRebuild).
        let needs_rebuild = matches!(
            s.state,
            SenderState::LogReleased { .. } | SenderState::Diverged { .. }
        );
        metrics::gauge!("hawser_stream_needs_rebuild", &labels)
            .set(f64::from(u8::from(needs_rebuild)));
        metrics::gauge!("hawser_stream_lag_records", &labels).set(s.lag_records as f64);
        metrics::gauge!("hawser_stream_lag_seconds", &labels).set(s.lag_micros as f64 / 1e6);
        metrics::gauge!("hawser_stream_ack_round_trip_seconds", &labels)
            .set(s.ack_micros_mean as f64 / 1e6);
        metrics::gauge!("hawser_stream_held_seconds", &labels).set(
            s.held
                .as_ref()
                .map_or(0.0, |h| h.since.elapsed().as_secs_f64()),
        );
        if let Some(t) = s.last_contact {
            metrics::gauge!("hawser_stream_seconds_since_contact", &labels)
                .set(t.elapsed().as_secs_f64());
        }
        metrics::counter!("hawser_stream_sent_transactions_total", &labels)
            .absolute(s.transactions_sent);
        metrics::counter!("hawser_stream_sent_raw_bytes_total", &labels).absolute(s.raw_bytes);
        metrics::counter!("hawser_stream_sent_wire_bytes_total", &labels).absolute(s.wire_bytes);
    }
}

/// How long a proposal to mark a receiver FAILED is given before it is made again
/// (the Raft leader may have been away; setting FAILED twice changes nothing).
const FAIL_RETRY: Duration = Duration::from_secs(10);

/// Where the log a link holds is measured from, for a link whose receiver has not been
/// heard by this process: its saved position, but not before the link was first seen
/// here (`first_seen`, the last LSN then).
struct Measured<'a> {
    positions: &'a BTreeMap<String, Position>,
    first_seen: &'a BTreeMap<(QualName, Ident), Lsn>,
}

/// The LSN after which a link's held log is measured (see [`check_fail_thresholds`]):
/// `acked` is the receiver's position, `heard` whether this process has streamed to
/// it, `since` the last LSN when this process first saw the link, `floor` the last
/// released LSN and `last` the log's end. `None`: nothing to measure.
fn measured_from(heard: bool, acked: Lsn, since: Lsn, floor: Lsn, last: Lsn) -> Option<Lsn> {
    if acked < floor {
        // The receiver lacks released log: past what a threshold can do.
        return None;
    }
    let from = if heard { acked } else { acked.max(since) };
    (from < last).then_some(from)
}

/// Marks receivers FAILED whose held log passed the master's FAILTHRESHOLD (in units
/// of `log_file_size` bytes): every link that holds log — its receiver in START or
/// PAUSE, streaming or not — is measured. A receiver this process has streamed to is
/// measured from the last position it acknowledged durably; one it has not (PAUSEd, not
/// connected since the master restarted, no address yet) from its saved position, or
/// from where the log stood when this process first saw the link if that is later: a
/// new subscriber is not blamed for the log kept before it existed, and one that was
/// down across a restart counts from the restart — later than it could, never
/// earlier. A link whose receiver already lacks released log is not measured: its
/// sender reports that it needs a duplicate.
fn check_fail_thresholds(
    task: &DataPlaneTask,
    running: &BTreeMap<(QualName, Ident), Running>,
    thresholds: &Thresholds,
    known: &Known,
    measured: &Measured<'_>,
    failing: &mut BTreeMap<(QualName, Ident), Instant>,
) {
    // Proposed and since applied (the link no longer holds log), or given up on.
    failing.retain(|k, at| known.get(k) == Some(&true) && at.elapsed() < FAIL_RETRY);
    let floor = released_through(&task.db);
    let last = task.db.last_lsn();
    for (key, _) in known.iter().filter(|(_, holds)| **holds) {
        let threshold = thresholds.get(key).copied().unwrap_or(0);
        if threshold == 0 || failing.contains_key(key) {
            continue;
        }
        // The receiver may be gone: its last ack, not a fresh one, says where it is.
        let streamed = running.get(key).map(|r| {
            let s = r.handle.status();
            let s = s.borrow();
            (s.last_contact.is_some(), s.acked_lsn)
        });
        let (heard, acked) = match streamed {
            Some(s) => s,
            None => match measured.positions.get(&position_name(key)) {
                Some(p) => (false, p.lsn),
                None => continue,
            },
        };
        let since = measured.first_seen.get(key).copied().unwrap_or(last);
        let Some(from) = measured_from(heard, acked, since, floor, last) else {
            continue;
        };
        let limit = u64::from(threshold).saturating_mul(task.log_file_size);
        let held = match task.db.log_bytes_from(from.next()) {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "cannot measure the log held for a receiver");
                continue;
            }
        };
        if held <= limit {
            continue;
        }
        warn!(
            scheme = %key.0, receiver = %key.1, held, limit,
            has_sender = running.contains_key(key),
            "receiver passed FAILTHRESHOLD; marking it FAILED"
        );
        failing.insert(key.clone(), Instant::now());
        let plane = task.plane.clone();
        let cmd = hawser_control::Command::SetReceiverState {
            scheme: key.0.clone(),
            store: key.1.clone(),
            state: ReceiverState::Failed,
        };
        task.tracker.spawn(async move {
            if let Err(e) = plane.propose(cmd).await {
                warn!(error = %e, "could not mark the receiver FAILED; will retry");
            }
        });
    }
}

/// Saves the links' positions and releases the log nobody holds (the module's "Log
/// retention"). Positions only move forward; a link that holds log but has none yet
/// (its sender has not started: no address, a planning problem) gets the log's start,
/// so the log is held for it from the moment it appears.
async fn retain_log(
    task: &DataPlaneTask,
    running: &BTreeMap<(QualName, Ident), Running>,
    known: &Known,
    positions: &mut BTreeMap<String, Position>,
) {
    let db = &task.db;
    let mut changes: Vec<(String, Option<Position>)> = Vec::new();
    let names: BTreeMap<String, bool> = known
        .iter()
        .map(|(k, holds)| (position_name(k), *holds))
        .collect();
    for name in positions.keys() {
        if !names.contains_key(name) {
            changes.push((name.clone(), None));
        }
    }
    for (key, r) in running {
        let acked = r.handle.status().borrow().acked_lsn;
        let name = position_name(key);
        let now = Position {
            lsn: acked,
            receiver: Some(r.link.receiver_node).filter(|n| n.0 != 0),
        };
        if positions
            .get(&name)
            .is_none_or(|p| p.lsn < acked || p.receiver != now.receiver)
        {
            changes.push((name, Some(now)));
        }
    }
    let floor = released_through(db);
    for (name, holds) in &names {
        if *holds && !positions.contains_key(name) && !changes.iter().any(|(n, _)| n == name) {
            changes.push((
                name.clone(),
                Some(Position {
                    lsn: floor,
                    receiver: None,
                }),
            ));
        }
    }
    if !changes.is_empty() {
        let saved = {
            let db = db.clone();
            let changes = changes.clone();
            tokio::task::spawn_blocking(move || db.set_positions(&changes)).await
        };
        match saved {
            Ok(Ok(())) => {
                for (name, lsn) in changes {
                    match lsn {
                        Some(lsn) => positions.insert(name, lsn),
                        None => positions.remove(&name),
                    };
                }
            }
            // Unsaved positions are not used for a release: try again next time.
            Ok(Err(e)) => {
                warn!(error = %e, "cannot save the streams' retained positions");
                return;
            }
            Err(e) => {
                warn!(error = %e, "saving the streams' retained positions panicked");
                return;
            }
        }
    }
    // Released through the lowest position of a link that holds log; with none, all
    // but the recent log kept anyway. A link whose receiver already lacks released log
    // (its sender says it needs a duplicate) is past helping and holds nothing.
    let through = names
        .iter()
        .filter(|(_, holds)| **holds)
        .filter_map(|(name, _)| positions.get(name).map(|p| p.lsn))
        .filter(|p| *p >= floor)
        .min()
        .unwrap_or_else(|| db.last_lsn());
    // A copy in progress (or just ended) keeps the log after its point: its receiver
    // resumes from there once set to START again.
    let through = match task.copy_holds.lowest() {
        Some(held) => through.min(held),
        None => through,
    };
    if through < db.log_start() || db.log_retained_bytes() <= task.log_keep_bytes {
        return;
    }
    let keep = task.log_keep_bytes;
    let released = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || db.release_log(through, keep)).await
    };
    match released {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => {
            metrics::counter!("hawser_log_released_records_total").increment(n);
            tracing::debug!(records = n, log_start = db.log_start().0, "released log");
        }
        Ok(Err(e)) => warn!(error = %e, "cannot release the log"),
        Err(e) => warn!(error = %e, "releasing the log panicked"),
    }
}

/// A DATASTORE element's INCLUDE TABLE names (`None`: every table) and EXCLUDE TABLE
/// names.
type TableLists = (Option<BTreeSet<QualName>>, BTreeSet<QualName>);

/// A DATASTORE element's return service to one subscriber: (subscriber, lists,
/// service, RETURN SERVICES ON WHEN REPLICATION STOPPED).
type DatastoreRoute = (
    Ident,
    Option<BTreeSet<QualName>>,
    BTreeSet<QualName>,
    ReturnService,
    bool,
);

fn table_lists(el: &hawser_scheme::ast::Element) -> TableLists {
    use hawser_scheme::ast::{InclusionAction, ObjectType};
    let mut include: Option<BTreeSet<QualName>> = None;
    let mut exclude = BTreeSet::new();
    for inc in &el.inclusions {
        let names = inc
            .groups
            .iter()
            .filter(|g| g.object_type == ObjectType::Table)
            .flat_map(|g| g.names.iter().map(|n| n.name.clone()));
        match inc.action {
            InclusionAction::Include => include.get_or_insert_with(BTreeSet::new).extend(names),
            InclusionAction::Exclude => exclude.extend(names),
        }
    }
    (include, exclude)
}

/// Gives the return services the routes of the links this store sends and the
/// master's STORE settings (the first scheme's that names any).
fn set_returns(returns: &Returns, store: &Ident, links: &[Link], ds_routes: Vec<DatastoreRoute>) {
    let mut routes = ReturnRoutes::from_links(store, links.iter());
    for (subscriber, include, exclude, service, when_stopped) in ds_routes {
        routes.add_datastore(subscriber, include, exclude, service, when_stopped);
    }
    let mut subscribers: BTreeMap<Ident, ReturnLevel> = BTreeMap::new();
    let mut settings = None;
    for link in links {
        for t in link.tables.iter().filter(|t| &t.origin == store) {
            let level = match t.return_service {
                ReturnService::NoReturn => continue,
                ReturnService::Receipt { .. } => ReturnLevel::Receipt,
                ReturnService::Twosafe { .. } => ReturnLevel::Twosafe,
            };
            let e = subscribers.entry(link.receiver.clone()).or_insert(level);
            *e = (*e).max(level);
            settings.get_or_insert_with(|| ReturnSettings::from_store(&link.sender_settings));
        }
    }
    returns.set_plan(routes, subscribers, settings.unwrap_or_default());
}

/// `ttRepSubscriberWait` over this node's senders: everything committed before the
/// call acknowledged by the named subscribers.
pub(crate) struct SenderWaits {
    pub(crate) senders: Senders,
    pub(crate) db: Database,
}

impl SubscriberWait for SenderWaits {
    fn wait<'a>(
        &'a self,
        scheme: Option<String>,
        subscriber: Option<String>,
        wait: ReturnWait,
    ) -> BoxFuture<'a, Result<bool, ReplicationError>> {
        Box::pin(async move {
            let target = self.db.last_lsn();
            let scheme = scheme.map(|s| QualName::parse_unquoted(&s));
            let subscriber = subscriber.map(|s| Ident::unquoted(&s));
            let handles: Vec<SenderHandle> = self
                .senders
                .lock()
                .iter()
                .filter(|((sc, rcv), _)| {
                    scheme.as_ref().is_none_or(|s| s == sc)
                        && subscriber.as_ref().is_none_or(|s| s == rcv)
                })
                .map(|(_, h)| h.clone())
                .collect();
            if handles.is_empty() {
                return Err(ReplicationError {
                    code: "42704".into(),
                    message: format!(
                        "ttRepSubscriberWait: this node sends to no subscriber{}{}",
                        subscriber.map(|s| format!(" {s}")).unwrap_or_default(),
                        scheme
                            .map(|s| format!(" in scheme {s}"))
                            .unwrap_or_default()
                    ),
                });
            }
            let all = async {
                for h in handles {
                    let mut status = h.status();
                    // A closed watch means the sender stopped: it cannot catch up.
                    if status.wait_for(|s| s.acked_lsn >= target).await.is_err() {
                        return false;
                    }
                }
                true
            };
            Ok(match wait {
                ReturnWait::NoWait => {
                    tokio::time::timeout(std::time::Duration::ZERO, all).await == Ok(true)
                }
                ReturnWait::For(d) => tokio::time::timeout(d, all).await == Ok(true),
                ReturnWait::Forever => all.await,
            })
        })
    }
}

/// The streams this node sends and receives, as status shows them.
pub(crate) fn streams_status(
    senders: &Senders,
    receiver: &ReceiverService,
) -> (Vec<v1::OutboundStream>, Vec<v1::InboundStream>) {
    use v1::StreamState as S;
    let marks = |m: &BTreeMap<NodeId, u64>| m.iter().map(|(n, seq)| (n.0, *seq)).collect();
    let millis = |t: Instant| t.elapsed().as_millis() as u64;
    let outbound = senders
        .lock()
        .iter()
        .map(|((scheme, receiver), handle)| {
            let s = handle.status().borrow().clone();
            let (state, reason) = match &s.state {
                SenderState::Connecting => (S::Connecting, None),
                SenderState::Streaming => (S::Streaming, None),
                SenderState::Backoff { error } => (S::Backoff, Some(error.clone())),
                SenderState::Refused { reason } => (S::Refused, Some(reason.clone())),
                SenderState::LogReleased { reason } => (S::LogReleased, Some(reason.clone())),
                SenderState::Diverged { reason, .. } => (S::Diverged, Some(reason.clone())),
                SenderState::Stopped => (S::Stopped, None),
            };
            v1::OutboundStream {
                scheme: scheme.to_string(),
                receiver: receiver.to_string(),
                state: state.into(),
                reason,
                last_error: s.last_error.clone(),
                millis_since_contact: s.last_contact.map(millis),
                acked_durable: marks(&s.acked_durable),
                acked_applied: marks(&s.acked_applied),
                acked_lsn: s.acked_lsn.0,
                sent_lsn: s.sent_lsn.0,
                lag_records: s.lag_records,
                lag_micros: s.lag_micros,
                ack_micros: s.ack_micros,
                ack_micros_mean: s.ack_micros_mean,
                transactions: s.transactions_sent,
                batches: s.batches_sent,
                compression: handle.codec_name(),
                raw_bytes: s.raw_bytes,
                wire_bytes: s.wire_bytes,
                sessions: s.sessions,
                held: s.held.as_ref().map(|h| v1::StreamHold {
                    gtid: h.gtid.to_string(),
                    millis: millis(h.since),
                    waits_for: h.waits_for.clone(),
                }),
            }
        })
        .collect();
    let inbound = receiver
        .status()
        .borrow()
        .iter()
        .map(|(sender, s)| v1::InboundStream {
            sender: sender.to_string(),
            connected: s.connected,
            refused: s.refused.clone(),
            millis_since_contact: s.last_contact.map(millis),
            millis_since_connect: s.connected_since.map(millis),
            through_lsn: s.through_lsn,
            batches: s.batches,
            transactions: s.transactions,
            transactions_skipped: s.transactions_skipped,
            row_changes: s.row_changes,
            rows_written: s.rows_written,
            rows_written_compiled: s.rows_written_compiled,
            runs_compiled: s.runs_compiled,
            runs_in_order: s.runs_in_order,
            apply_pauses: s.apply_pauses,
            raw_bytes: s.raw_bytes,
            wire_bytes: s.wire_bytes,
            targets: s
                .targets
                .iter()
                .map(|t| v1::TargetTable {
                    table: t.table.clone(),
                    kind: t.kind.clone(),
                    into: t.into.clone(),
                })
                .collect(),
        })
        .collect();
    (outbound, inbound)
}

#[cfg(test)]
mod tests {
    use super::{
        fence_check, inbound_targets, measured_from, read_by_siblings, received_in_parts,
        unseen_paths, Fence, Unseen,
    };
    use hawser_core::{Ident, Lsn, NodeId, QualName};
    use hawser_scheme::route::Link;
    use hawser_stream::SenderStatus;

    /// The streams `source` (one CREATE REPLICATION) plans among ds1, ds2 and ds3.
    fn planned(source: &str) -> Vec<Link> {
        let scheme = match hawser_scheme::parse(source).expect("parses").remove(0) {
            hawser_scheme::Statement::Create(s) => s,
            other => panic!("not a CREATE REPLICATION: {other:?}"),
        };
        let topology = hawser_scheme::Topology {
            catalogs: Default::default(),
            nodes: [("ds1", 1), ("ds2", 2), ("ds3", 3), ("ds4", 4), ("ds5", 5)]
                .map(|(s, n)| (Ident::unquoted(s), NodeId(n)))
                .into(),
        };
        hawser_scheme::plan(&scheme, &topology)
            .expect("plans")
            .links
    }

    /// A subscriber's targets by source table, plain ones included; a CCD fed by two
    /// masters is a problem. Another store's are not its. A BASE AGGREGATE is kept by
    /// the store.
    #[test]
    fn a_subscribers_targets_come_from_the_links_into_it() {
        let mut links = planned(
            "CREATE REPLICATION r \
               ELEMENT a TABLE t MASTER ds1 SUBSCRIBER ds2 AS CCD NONCONDENSED INTO h \
               ELEMENT b TABLE u MASTER ds1 SUBSCRIBER ds2 AS BASE AGGREGATE (COUNT(*)) INTO n \
               ELEMENT c TABLE v MASTER ds1 SUBSCRIBER ds2, ds3 AS POINT IN TIME",
        );
        let ds2 = Ident::unquoted("ds2");
        let (targets, problems) = inbound_targets(&ds2, &links);
        let kinds: Vec<(String, &str, String)> = targets
            .iter()
            .map(|(t, r)| {
                (
                    t.to_string(),
                    hawser_target::kind_name(&r.kind),
                    r.into.to_string(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("t".to_string(), "CCD NONCONDENSED", "h".to_string()),
                ("u".to_string(), "BASE AGGREGATE", "n".to_string()),
                ("v".to_string(), "POINT IN TIME", "v".to_string()),
            ]
        );
        assert!(problems.is_empty(), "{problems:?}");
        let kept: Vec<(String, String)> = super::base_aggregates(&targets)
            .into_iter()
            .map(|(t, r)| (t.to_string(), r.into.to_string()))
            .collect();
        assert_eq!(kept, [("u".to_string(), "n".to_string())]);
        let (for_ds1, _) = inbound_targets(&Ident::unquoted("ds1"), &links);
        assert!(for_ds1.is_empty());
        // t reaching ds2 from a second origin too: its CCD's commit seqs are per origin.
        let mut second = links[0].clone();
        second.sender = Ident::unquoted("ds3");
        for t in &mut second.tables {
            t.origin = Ident::unquoted("ds3");
        }
        links.push(second);
        let (_, problems) = inbound_targets(&ds2, &links);
        assert!(
            problems
                .iter()
                .any(|p| p
                    .contains("table t: its CCD NONCONDENSED on store ds2 is fed by 2 origins")),
            "{problems:?}"
        );
    }

    /// Example 10-31's rules (defaults filled in) for both its stores, none for a third;
    /// NO ACTION and BY USER as written.
    #[test]
    fn conflict_rules_come_from_the_elements_a_store_takes_part_in() {
        let st = failed_over(
            "CREATE REPLICATION r \
               ELEMENT e TABLE t CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts \
                 MASTER ds1 SUBSCRIBER ds2 \
               ELEMENT f TABLE u CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts2 \
                 UPDATE BY USER ON EXCEPTION NO ACTION \
                 MASTER ds2 SUBSCRIBER ds1 \
               ELEMENT g TABLE v MASTER ds1 SUBSCRIBER ds3",
            0,
        );
        let rules = |s: &str| super::conflict_rules(&st, &Ident::unquoted(s));
        let ds1 = rules("ds1");
        assert_eq!(ds1.len(), 2);
        let t = &ds1[&QualName::bare("t")];
        assert_eq!(
            (t.column.as_str(), t.by_system, t.rollback),
            ("ts", true, true)
        );
        let u = &rules("ds2")[&QualName::bare("u")];
        assert_eq!(
            (u.column.as_str(), u.by_system, u.rollback),
            ("ts2", false, false)
        );
        assert!(rules("ds3").is_empty());

        // Checked against the tables here: a missing or unfit column is a problem.
        let col = |name: &str, data_type, nullable| hawser_core::ColumnDef {
            name: Ident::unquoted(name),
            data_type,
            nullable,
            default: None,
        };
        let table = |name: &str, ts: hawser_core::DataType, nullable| hawser_core::TableDef {
            name: QualName::bare(name),
            columns: vec![
                col("k", hawser_core::DataType::BigInt, false),
                col("ts", ts, nullable),
            ],
            primary_key: vec![0],
            explicit_key: true,
        };
        let (kept, problems) = super::checked_rules(ds1.clone(), |n| {
            (n == &QualName::bare("t")).then(|| table("t", hawser_core::DataType::Binary(8), true))
        });
        assert_eq!(kept.len(), 1, "u is not here yet: waits");
        assert!(problems.is_empty(), "{problems:?}");
        let (kept, problems) = super::checked_rules(ds1, |n| {
            (n == &QualName::bare("t"))
                .then(|| table("t", hawser_core::DataType::Varbinary(8), true))
        });
        assert!(kept.is_empty());
        assert!(
            problems
                .iter()
                .next()
                .unwrap()
                .contains("table t has ts as VARBINARY(8), not a nullable BINARY(8) (TT8004)"),
            "{problems:?}"
        );
    }

    /// ds1, ds2, ds3 registered, the scheme of `ddl` (element `e` mastered by ds1), and
    /// a failover of `e` to ds2 with ds1's fork point at `fork_seq`.
    fn failed_over(ddl: &str, fork_seq: u64) -> hawser_control::ClusterState {
        use hawser_control::state::{apply, Response};
        use hawser_control::{ClusterState, Command, NodeInfo};
        let mut st = ClusterState::default();
        let mut cmds: Vec<Command> = (1..=3)
            .map(|i| {
                Command::RegisterNode(NodeInfo {
                    id: NodeId(i),
                    store: Ident::unquoted(&format!("ds{i}")),
                    host: "h".into(),
                    grpc_addr: format!("h:{i}"),
                    http_addr: format!("h:{i}0"),
                    voter: true,
                })
            })
            .collect();
        cmds.extend(hawser_control::Command::from_ddl(ddl).unwrap());
        cmds.push(Command::SetMaster {
            scheme: QualName::bare("r"),
            element: Ident::unquoted("e"),
            node: NodeId(2),
            epoch: hawser_core::Epoch(1),
            fork_point: Some(hawser_core::Gtid::new(NodeId(1), fork_seq)),
        });
        for cmd in &cmds {
            assert!(matches!(apply(&mut st, cmd), Response::Applied { .. }));
        }
        st
    }

    #[test]
    fn after_a_failover_the_new_master_relays_its_predecessors_transactions() {
        let st = failed_over(
            "CREATE REPLICATION r ELEMENT e TABLE t \
             MASTER ds1 SUBSCRIBER ds2 RETURN TWOSAFE SUBSCRIBER ds3",
            9,
        );
        let s = &st.schemes[&QualName::bare("r")];
        let mut links = planned(&hawser_scheme::print_scheme(&s.scheme));
        let mut nodes: std::collections::BTreeMap<Ident, NodeId> =
            st.nodes.values().map(|n| (n.store.clone(), n.id)).collect();
        super::add_relays(&mut links, s, &nodes);
        let carried = |links: &[Link], to: &str| -> Vec<String> {
            let l = links.iter().find(|l| l.receiver.as_str() == to).unwrap();
            assert_eq!(l.sender.as_str(), "ds2");
            l.tables.iter().map(|t| t.origin.to_string()).collect()
        };
        assert_eq!(
            carried(&links, "ds3"),
            ["ds2", "ds1"],
            "ds1's commits ds3 lacks"
        );
        assert_eq!(carried(&links, "ds1"), ["ds2"], "never its own back to ds1");

        // ds1 replaced on an empty data directory by node 7: the store-keyed relay
        // would name node 7, which has no such commits; node 1's go by its id, to ds3
        // and to the new ds1 alike.
        nodes.insert(Ident::unquoted("ds1"), NodeId(7));
        let epochs = s
            .elements
            .iter()
            .map(|(n, e)| (n.clone(), e.epoch))
            .collect();
        let config = |to: &str| {
            let mut links = planned(&hawser_scheme::print_scheme(&s.scheme));
            super::add_relays(&mut links, s, &nodes);
            let link = links.iter().find(|l| l.receiver.as_str() == to).unwrap();
            let mut c = super::link_config(link, s.version, &nodes, &epochs, &Default::default())
                .expect("a stream");
            super::relay_replaced_masters(&mut c, s, &nodes);
            c.tables.keys().map(|(_, o)| o.0).collect::<Vec<_>>()
        };
        assert_eq!(
            config("ds1"),
            [1, 2],
            "the new ds1 gets the old one's commits"
        );
        assert!(
            config("ds3").contains(&1),
            "ds3 still gets node 1's commits"
        );
        // ds1 removed for good: its store has no node; the stream is still planned,
        // and node 1's commits still relayed.
        nodes.remove(&Ident::unquoted("ds1"));
        let mut links = planned(&hawser_scheme::print_scheme(&s.scheme));
        super::add_relays(&mut links, s, &nodes);
        assert_eq!(carried(&links, "ds3"), ["ds2"]);
        let link = links.iter().find(|l| l.receiver.as_str() == "ds3").unwrap();
        let mut c = super::link_config(link, s.version, &nodes, &epochs, &Default::default())
            .expect("a stream without the removed store");
        super::relay_replaced_masters(&mut c, s, &nodes);
        assert!(c.tables.keys().any(|(_, o)| o.0 == 1));
    }

    #[test]
    fn a_store_holding_commits_past_a_fork_point_says_so() {
        use hawser_core::Epoch;
        use std::collections::BTreeMap;
        let st = failed_over(
            "CREATE REPLICATION r ELEMENT e TABLE t MASTER ds1 SUBSCRIBER ds2, ds3",
            100,
        );
        let held = |seq| BTreeMap::from([(NodeId(1), seq)]);
        let ds3 = Ident::unquoted("ds3");
        let unknown = |_| None;
        assert!(super::past_fork_points(&st, &ds3, &held(100), unknown).is_empty());
        let found = super::past_fork_points(&st, &ds3, &held(101), unknown);
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("through seq 101"), "{}", found[0]);
        assert!(found[0].contains("rebuilt from the master"), "{}", found[0]);
        // The log cannot tell which commits they are: the store is to be rebuilt in
        // the scheme; where it can, they are set aside, no rebuild.
        let rebuild = |in_log: fn(hawser_stream::ForkedRange) -> Option<bool>| {
            super::past_forks(&st, &ds3, &held(101), in_log)
                .into_iter()
                .map(|p| (p.scheme.to_string(), p.log_cannot_tell))
                .collect::<Vec<_>>()
        };
        assert_eq!(rebuild(|_| None), [("r".to_string(), true)]);
        assert_eq!(rebuild(|_| Some(true)), [("r".to_string(), false)]);
        assert_eq!(rebuild(|_| Some(false)), []);
        // Its log says the commits past the fork are later ones (ds1 master again).
        let asked = std::cell::Cell::new(None);
        let later = |f| {
            asked.set(Some(f));
            Some(false)
        };
        assert!(super::past_fork_points(&st, &ds3, &held(101), later).is_empty());
        let range = hawser_stream::ForkedRange {
            origin: NodeId(1),
            after_seq: 100,
            before_epoch: Epoch(1),
            tables: Some(vec![QualName::bare("t")]),
        };
        assert_eq!(asked.take(), Some(range.clone()));
        assert_eq!(super::forked_ranges(&st), [range]);
        // A store that takes no part in the element is not concerned.
        let other = Ident::unquoted("ds9");
        assert!(super::past_fork_points(&st, &other, &held(500), unknown).is_empty());
    }

    #[tokio::test]
    async fn a_store_rebuilt_since_it_heard_of_the_failover_holds_nothing_it_forked_off() {
        use hawser_core::{ColumnDef, DataType, Epoch, TableDef, Value};
        let db =
            hawser_store::Database::open_memory(hawser_store::DbOptions::new(NodeId(1))).unwrap();
        let t = QualName::bare("t");
        db.create_table(TableDef {
            name: t.clone(),
            columns: vec![ColumnDef {
                name: Ident::unquoted("k"),
                data_type: DataType::BigInt,
                nullable: false,
                default: None,
            }],
            primary_key: vec![0],
            explicit_key: true,
        })
        .await
        .unwrap();
        let fork = db.high_water(NodeId(1)).unwrap();
        // Committed under era 0, past the fork point of a failover of era 1.
        let mut x = db.begin();
        x.insert(&t, vec![Value::Int(1)]).await.unwrap();
        x.commit().await.unwrap();
        let range = hawser_stream::ForkedRange {
            origin: NodeId(1),
            after_seq: fork,
            before_epoch: Epoch(1),
            tables: Some(vec![t]),
        };
        let mut forks = super::ForkVerdicts::new();
        assert_eq!(forks.holds(&db, &range), Some(true));
        // Rebuilt while it stamped era 1: whatever the log says, none is left.
        db.set_epoch(Epoch(1));
        db.copy_marks(&Default::default(), &Default::default())
            .await
            .unwrap();
        assert_eq!(forks.holds(&db, &range), Some(false));
        // A rebuild under an older era proves nothing of a later failover's fork.
        let later = hawser_stream::ForkedRange {
            before_epoch: Epoch(2),
            ..range
        };
        assert_eq!(
            forks.holds(&db, &later),
            Some(false),
            "the log since says none"
        );
    }

    #[test]
    fn a_relay_that_cannot_see_a_transaction_it_races_is_blind_for_its_origin() {
        let ds = |s: &str| Ident::unquoted(s);
        // The demo's scheme: ds2 receives both tables, so it sees every transaction
        // of ds1 that ds1 sends ds3 itself, and waits for it (LinkConfig::siblings).
        let sees_all = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds2 RETURN TWOSAFE SUBSCRIBER ds3
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2 RETURN TWOSAFE
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3",
        );
        for store in ["ds1", "ds2", "ds3"] {
            assert!(unseen_paths(&ds(store), &sees_all).is_empty());
        }
        // ds2 does not receive accounts: it cannot see ds1's transactions of it, so it
        // waits for ds1's own stream to decide about each (LinkConfig::blind).
        let blind = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds3
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3",
        );
        let unseen = unseen_paths(&ds("ds2"), &blind);
        assert_eq!(
            unseen,
            [Unseen {
                store: ds("ds2"),
                receiver: ds("ds3"),
                origin: ds("ds1"),
                sender: ds("ds1"),
                table: QualName::bare("accounts"),
            }]
        );
        // Only the propagator is blind; the master sees all of its own log.
        assert!(unseen_paths(&ds("ds1"), &blind).is_empty());
        // Two relays of ds1 to ds3, each blind to the other's table: each is blind
        // for ds1 by the other relay's stream, and waits for its decisions.
        let relays = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds4
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
             ELEMENT a2 TABLE accounts PROPAGATOR ds4 SUBSCRIBER ds3
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3",
        );
        for (store, other, table) in [("ds2", "ds4", "accounts"), ("ds4", "ds2", "events")] {
            assert_eq!(
                unseen_paths(&ds(store), &relays),
                [Unseen {
                    store: ds(store),
                    receiver: ds("ds3"),
                    origin: ds("ds1"),
                    sender: ds(other),
                    table: QualName::bare(table),
                }]
            );
        }
        // ds3 gets ds1's transactions in parts; relaying ds1's events on to ds5, its
        // stream ships both parts of one (LinkConfig::parts).
        let on = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds4
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
             ELEMENT a2 TABLE accounts PROPAGATOR ds4 SUBSCRIBER ds3
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3
             ELEMENT e3 TABLE events PROPAGATOR ds3 SUBSCRIBER ds5",
        );
        assert_eq!(received_in_parts(&ds("ds3"), &on), [ds("ds1")].into());
        // Who says what it decides about ds1 for whom: each of the two relays for the
        // other; in the demo's shape nobody (ds2 sees all, and ds1's stream decides
        // about its own commits anyway); with a blind propagator, not ds1 either.
        let (ds1, ds2, ds3, ds4) = (ds("ds1"), ds("ds2"), ds("ds3"), ds("ds4"));
        assert!(read_by_siblings(&ds2, &ds3, &relays));
        assert!(read_by_siblings(&ds4, &ds3, &relays));
        assert!(!read_by_siblings(&ds2, &ds3, &sees_all));
        assert!(!read_by_siblings(&ds1, &ds3, &sees_all));
        assert!(!read_by_siblings(&ds1, &ds3, &blind));
        assert!(!read_by_siblings(&ds2, &ds3, &blind));
        // One relay sees all (ds2 receives accounts too), the other does not: only the
        // one that sees all is waited for.
        let mixed = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds2, ds4
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
             ELEMENT a2 TABLE accounts PROPAGATOR ds4 SUBSCRIBER ds3
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3",
        );
        assert!(read_by_siblings(&ds2, &ds3, &mixed));
        assert!(!read_by_siblings(&ds4, &ds3, &mixed));
        for store in ["ds1", "ds2", "ds4", "ds5"] {
            assert!(received_in_parts(&ds(store), &on).is_empty(), "{store}");
        }
    }

    #[test]
    fn the_restart_fence_lifts_once_every_receiver_answered_and_none_holds_more() {
        let me = NodeId(1);
        let heard = |holds: Option<u64>| SenderStatus {
            last_contact: Some(std::time::Instant::now()),
            acked_durable: holds.map(|s| [(me, s)].into()).unwrap_or_default(),
            ..SenderStatus::default()
        };
        let ds2 = Ident::unquoted("ds2");
        let ds3 = Ident::unquoted("ds3");
        // Nobody to ask: nothing of this node's can be elsewhere.
        let none_pending = |_: &Ident| false;
        assert_eq!(fence_check(me, 10, &[], none_pending), Fence::Lift);
        // One has not answered since the start.
        assert_eq!(
            fence_check(
                me,
                10,
                &[
                    (ds2.clone(), heard(Some(10))),
                    (ds3.clone(), SenderStatus::default())
                ],
                none_pending
            ),
            Fence::Wait(vec![ds3.clone()])
        );
        // Heard, but its sender has not admitted it yet: its marks are not published,
        // so holding nothing proves nothing (the check may yet find it diverged).
        assert_eq!(
            fence_check(
                me,
                10,
                &[(ds2.clone(), heard(Some(9))), (ds3.clone(), heard(None))],
                |r: &Ident| *r == ds3
            ),
            Fence::Wait(vec![ds3.clone()])
        );
        // Both answered with no more than this node has (or nothing of it).
        assert_eq!(
            fence_check(
                me,
                10,
                &[(ds2.clone(), heard(Some(9))), (ds3.clone(), heard(None))],
                none_pending
            ),
            Fence::Lift
        );
        // One holds commits this node lost: that wins over anyone still silent.
        assert_eq!(
            fence_check(
                me,
                10,
                &[
                    (ds2.clone(), SenderStatus::default()),
                    (ds3.clone(), heard(Some(12)))
                ],
                none_pending
            ),
            Fence::Diverged {
                receiver: ds3.clone(),
                holds: 12,
                ours: 10
            }
        );
        // Its sender refused it (its marks were not published): the state says so.
        let refused = SenderStatus {
            state: hawser_stream::SenderState::Diverged {
                reason: "lost".into(),
                holds: 3,
            },
            last_contact: Some(std::time::Instant::now()),
            ..SenderStatus::default()
        };
        assert_eq!(
            fence_check(
                me,
                2,
                &[(ds2.clone(), heard(Some(2))), (ds3.clone(), refused)],
                none_pending
            ),
            Fence::Diverged {
                receiver: ds3,
                holds: 3,
                ours: 2
            }
        );
    }

    #[test]
    fn held_log_is_measured_from_the_position_or_from_when_the_link_was_first_seen() {
        let (floor, last) = (Lsn(10), Lsn(100));
        // Heard in this process: its acknowledged position, whenever it was first seen.
        assert_eq!(
            measured_from(true, Lsn(20), Lsn(90), floor, last),
            Some(Lsn(20))
        );
        // Not heard (paused, down across a restart, new): not before it was first seen.
        assert_eq!(
            measured_from(false, Lsn(20), Lsn(50), floor, last),
            Some(Lsn(50))
        );
        assert_eq!(
            measured_from(false, Lsn(60), Lsn(50), floor, last),
            Some(Lsn(60))
        );
        // Caught up: nothing held.
        assert_eq!(measured_from(true, last, Lsn(0), floor, last), None);
        assert_eq!(measured_from(false, Lsn(20), last, floor, last), None);
        // Lacks released log: its sender says it needs a duplicate.
        assert_eq!(measured_from(true, Lsn(9), Lsn(0), floor, last), None);
        assert_eq!(measured_from(false, Lsn(9), Lsn(50), floor, last), None);
    }
}
