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
//!
//! The parts: `plan` (the links this store sends, planned from the cluster state),
//! `relays` (what a stream carries of other origins and which streams are blind),
//! `targets` (the target of each table received), `receiver` (the elements this store
//! subscribes to and its conflict checking), `forks` (what failovers forked off, and
//! setting it aside), `running` (the senders and their re-plan), `fence` (lifting the
//! restart fence), `retention` (positions, FAILTHRESHOLD and log release), `status`
//! (stream status for gRPC and `/metrics`) and `waits` (`ttRepSubscriberWait`).
//!
//! [`LinkConfig`]: hawser_stream::LinkConfig
//! [`wake_all`]: crate::senders::wake_all

mod fence;
mod forks;
mod plan;
mod receiver;
mod relays;
mod retention;
mod running;
mod status;
mod targets;
mod waits;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use hawser_control::ControlPlane;
use hawser_core::{Epoch, Ident, QualName};
use hawser_scheme::route::ResolvedTarget;
use hawser_store::Database;
use hawser_stream::{Compression, ForkedRange};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::returns::Returns;
use crate::senders::Senders;

pub(crate) use fence::RESTART_FENCE;
pub(crate) use plan::local_topology;
pub(crate) use receiver::checked_tables;
pub(crate) use status::streams_status;
pub(crate) use waits::SenderWaits;

use fence::check_restart_fence;
use forks::{forked_ranges, rejoin, ForkVerdicts};
use plan::{wanted_links, Known, Planned, Thresholds};
use receiver::{checked_rules, conflict_rules, subscribed};
use retention::{check_fail_thresholds, retain_log, Measured};
use running::{reconcile, unusable_addresses, Running};
use status::export_metrics;
use targets::base_aggregates;

/// How often the plan is recomputed when the cluster state does not change.
const REPLAN_EVERY: Duration = Duration::from_secs(1);

/// What the data plane cannot do as the schemes ask, as of its last re-plan (a scheme
/// it cannot plan, a stream it cannot start), for `/replication` and `hawser status`.
pub(crate) type Problems = Arc<parking_lot::Mutex<Vec<String>>>;

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
        now.extend(unusable_addresses(&mut wanted, task.peer_tls.as_ref()));
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

#[cfg(test)]
/// What the parts' tests plan from: schemes among ds1 to ds5, and a cluster state
/// after a failover.
mod testing {
    use hawser_core::{Ident, NodeId, QualName};
    use hawser_scheme::route::Link;

    /// The streams `source` (one CREATE REPLICATION) plans among ds1, ds2 and ds3.
    pub(super) fn planned(source: &str) -> Vec<Link> {
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

    /// ds1, ds2, ds3 registered, the scheme of `ddl` (element `e` mastered by ds1), and
    /// a failover of `e` to ds2 with ds1's fork point at `fork_seq`.
    pub(super) fn failed_over(ddl: &str, fork_seq: u64) -> hawser_control::ClusterState {
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
}
