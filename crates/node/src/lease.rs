//! The node's side of liveness, master leases and failover.
//!
//! ```text
//!  report_loop, every report interval:
//!     HealthReport {own seq, high-water per origin, state version, echo} ─► ControlPlane::report
//!     ◄─ lease grant, stamp (echoed next time) ─► wait until this node applied the
//!        grant's state version
//!        ─► LeaseGate: scope from that state, lease until (sent + lease)
//!  report_loop, on every cluster state change: LeaseGate scope from the new state
//!  a node the cluster removed: no reports, no scope, every write of its own refused
//!  failover_loop, every report interval: ControlPlane::failover_tick (acts only on the
//!     Raft leader); blocked failovers logged when they change, and kept for status
//! ```
//!
//! One task owns the lease gate's scope and deadline, so a scope computed from an older
//! cluster state never replaces one computed from a newer state: the scope only ever
//! follows the latest applied state, and a lease is only extended once the state that
//! the grant was made against is applied here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_control::failover::{BlockReason, Echo, HealthReport};
use hawser_control::{ClusterState, ControlPlane, PlaneError};
use hawser_core::{Epoch, Ident, QualName};
use hawser_scheme::ast::{ElementKind, OwnerRole, StoreName};
use hawser_store::{Database, LeaseScope};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Silent masters the leader cannot fail over now, with why, for status.
pub(crate) type Blocked = Arc<Mutex<Vec<String>>>;

/// Which client writes need a master lease on `store`: the tables of the TABLE
/// elements it masters (every table for a DATASTORE element it masters); `None` when
/// it masters nothing or is not registered in the cluster.
pub(crate) fn lease_scope(state: &ClusterState, store: &Ident) -> Option<LeaseScope> {
    let mut scope = LeaseScope::default();
    let mut elements = Vec::new();
    state.node_by_store(store)?;
    for (name, s) in &state.schemes {
        for el in &s.scheme.elements {
            let owns = matches!(&el.owner.name, StoreName::Named(n) if n == store);
            let subscribes = el
                .subscriber_stores()
                .any(|sub| matches!(&sub.name, StoreName::Named(n) if n == store));
            if let (false, true, OwnerRole::Master, ElementKind::Table { table, .. }) =
                (owns, subscribes, el.owner_role, &el.kind)
            {
                let master = match &el.owner.name {
                    StoreName::Named(n) => n.to_string(),
                    other => format!("{other:?}"),
                };
                scope.elsewhere.insert(
                    table.clone(),
                    format!(
                        "{master} masters it (element {name}.{}); this store subscribes",
                        el.name
                    ),
                );
            }
            if !owns || el.owner_role != OwnerRole::Master {
                continue;
            }
            match &el.kind {
                ElementKind::Table { table, .. } => {
                    scope.tables.insert(table.clone());
                }
                ElementKind::Datastore => scope.every_table = true,
                ElementKind::Sequence { .. } => continue,
            }
            elements.push(format!("{name}.{}", el.name));
        }
    }
    // A table this store masters in another element (a bidirectional scheme) or under
    // a DATASTORE element is its own to write.
    if scope.every_table {
        scope.elsewhere.clear();
    }
    let mastered = scope.tables.clone();
    scope.elsewhere.retain(|t, _| !mastered.contains(t));
    if scope.tables.is_empty() && !scope.every_table && scope.elsewhere.is_empty() {
        return None;
    }
    scope.refusal = format!(
        "{store} masters it (elements {}) but holds no master lease now: the Raft leader \
         has not confirmed this node lately, so the cluster may be failing the element \
         over; retry, here or on the master `hawser status` names",
        elements.join(", ")
    );
    Some(scope)
}

/// The master term `store` writes `table` under in `state`: the epoch of the element
/// (TABLE of that table, or DATASTORE) it masters, the highest if several; `None` when
/// it masters none. A client tells two masters' acknowledgements apart by it (every
/// change of master, planned or not, starts a new epoch of the element).
pub(crate) fn master_term(state: &ClusterState, store: &Ident, table: &QualName) -> Option<Epoch> {
    let mut term = None;
    for s in state.schemes.values() {
        for el in &s.scheme.elements {
            let owns = matches!(&el.owner.name, StoreName::Named(n) if n == store);
            if !owns || el.owner_role != OwnerRole::Master {
                continue;
            }
            let covers = match &el.kind {
                ElementKind::Table { table: t, .. } => t == table,
                ElementKind::Datastore => true,
                ElementKind::Sequence { .. } => false,
            };
            if let (true, Some(es)) = (covers, s.elements.get(&el.name)) {
                term = term.max(Some(es.epoch));
            }
        }
    }
    term
}

/// Sets the gate's scope and the commit epoch from the latest applied state. On a node
/// the cluster removed, refuses every write of its own instead, for good, saying why
/// (the removal is never undone; the node may not even have applied the entry that
/// removed it, so its state is no guide to what it may write).
pub(crate) fn rescope(plane: &ControlPlane, db: &Database, store: &Ident) -> Arc<ClusterState> {
    let state = plane.state();
    if let Some(removal) = plane.removal() {
        db.lease().set_scope(None);
        db.lease().revoke();
        let why = crate::cluster::removal_message(&removal);
        if db.writes_paused().as_deref() != Some(why.as_str()) {
            db.pause_writes(Some(why));
        }
        return state;
    }
    db.lease().set_scope(lease_scope(&state, store));
    // This node's commits carry the failover era it knows: a deposed master's commits
    // made before it heard of the failover carry an older one than any made since.
    let era = Epoch(state.era);
    if db.epoch() != era {
        db.set_epoch(era);
    }
    state
}

/// This node's report: its own last seq and every origin's high-water it holds.
/// `echo`: the leader's stamp on the last answer this node had (read before the
/// high-waters, so the report describes this node after that moment).
fn health_report(db: &Database, state_version: u64, echo: Option<Echo>) -> Option<HealthReport> {
    let own = db.node_id();
    // Given up while draining: every commit that passed the lease check before is in
    // place, so the seq read below is final until a new grant.
    let lease_released = db.lease().release_drained();
    if lease_released {
        db.commit_barrier();
    }
    let high_water = match db.high_waters() {
        Ok(h) => h,
        Err(e) => {
            warn!(error = %e, "cannot read the high-water marks to report");
            return None;
        }
    };
    Some(HealthReport {
        node: own,
        own_seq: high_water.get(&own).copied().unwrap_or(0),
        high_water,
        state_version,
        lease_released,
        echo,
    })
}

/// Reports to the Raft leader every `interval` and keeps the master lease gate in
/// line with what the leader grants and the cluster state says this node masters.
pub(crate) async fn report_loop(
    plane: ControlPlane,
    db: Database,
    store: Ident,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut cluster = plane.subscribe();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refused: Option<String> = None;
    let mut echo: Option<Echo> = None;
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            changed = cluster.changed() => {
                if changed.is_err() {
                    break;
                }
                rescope(&plane, &db, &store);
                continue;
            }
            _ = tick.tick() => {}
        }
        let state = rescope(&plane, &db, &store);
        // A removed node reports to nobody: every member would refuse it.
        if state.node_by_store(&store).is_none() || plane.removal().is_some() {
            continue;
        }
        let Some(report) = health_report(&db, state.version, echo) else {
            continue;
        };
        // The lease is timed from now, before the request leaves: the leader's
        // clock starts later, so this node's lease ends first.
        let sent = Instant::now();
        let grant = match plane.report(report).await {
            Ok(reply) => {
                echo = reply.stamp.or(echo);
                if reply.draining {
                    db.lease().drain();
                }
                reply.lease
            }
            // Removed from the cluster (a member just refused this report): the next
            // rescope refuses every write, and the removal is said where it is
            // learned (cluster::watch_raft), not as a lease refused.
            Err(PlaneError::Removed(_)) => {
                rescope(&plane, &db, &store);
                continue;
            }
            Err(e) => Err(e.to_string()),
        };
        match grant {
            Ok(grant) => {
                // Judge what this node masters by a state at least as new as the one
                // the grant was made against.
                let wait = plane.wait_for_version(grant.state_version, interval);
                if wait.await.is_err() {
                    continue;
                }
                rescope(&plane, &db, &store);
                db.lease()
                    .extend(sent + Duration::from_millis(grant.millis));
                if refused.take().is_some() {
                    info!("master lease granted again");
                }
            }
            Err(why) => {
                if refused.as_deref() != Some(why.as_str()) {
                    if db.lease().held_until(Instant::now()).is_some() {
                        warn!(reason = %why, "no master lease granted; the held one runs out");
                    } else {
                        debug!(reason = %why, "no master lease granted");
                    }
                    refused = Some(why);
                }
            }
        }
    }
    db.lease().revoke();
}

/// How long a failover may wait for settled reports before the wait is reported as
/// blocked: many report intervals.
const AWAITING_SAID_AFTER: Duration = Duration::from_secs(3);

/// On the Raft leader, fails silent masters over every `interval`; records the
/// failovers it cannot make in `blocked`.
pub(crate) async fn failover_loop(
    plane: ControlPlane,
    interval: Duration,
    blocked: Blocked,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut logged: BTreeSet<String> = BTreeSet::new();
    // Since when each element has been waiting for settled reports.
    let mut awaiting: BTreeMap<(QualName, Ident), Instant> = BTreeMap::new();
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let outcome = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            r = plane.failover_tick() => r,
        };
        let now: BTreeSet<String> = match outcome {
            Ok(tick) => {
                let waiting: BTreeSet<(QualName, Ident)> = tick
                    .blocked
                    .iter()
                    .filter(|b| b.reason == BlockReason::AwaitingReports)
                    .map(|b| (b.scheme.clone(), b.element.clone()))
                    .collect();
                awaiting.retain(|k, _| waiting.contains(k));
                for k in waiting {
                    awaiting.entry(k).or_insert_with(Instant::now);
                }
                tick.blocked
                    .iter()
                    // A wait of a report interval or two for settled reports is part
                    // of every failover; said only when it lasts (a subscriber that
                    // never echoes the leader's stamps, say).
                    .filter(|b| {
                        b.reason != BlockReason::AwaitingReports
                            || awaiting
                                .get(&(b.scheme.clone(), b.element.clone()))
                                .is_some_and(|since| since.elapsed() > AWAITING_SAID_AFTER)
                    })
                    .map(|b| {
                        format!(
                            "element {} of scheme {} (master {}) cannot be failed over: {}",
                            b.element, b.scheme, b.master, b.reason
                        )
                    })
                    .collect()
            }
            Err(e) => {
                debug!(error = %e, "failover tick did not finish");
                continue;
            }
        };
        for b in now.difference(&logged) {
            warn!("{b}");
        }
        if now != logged {
            *blocked.lock() = now.iter().cloned().collect();
            logged = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_control::state::{apply, Response};
    use hawser_control::{Command, NodeInfo};
    use hawser_core::{NodeId, QualName};

    fn cluster(ddl: &str) -> ClusterState {
        let mut st = ClusterState::default();
        for (id, store) in [(1, "a"), (2, "b")] {
            let cmd = Command::RegisterNode(NodeInfo {
                id: NodeId(id),
                store: Ident::unquoted(store),
                host: "h".into(),
                grpc_addr: format!("h:{id}"),
                http_addr: format!("h:{id}0"),
                voter: true,
            });
            assert!(matches!(apply(&mut st, &cmd), Response::Applied { .. }));
        }
        for cmd in Command::from_ddl(ddl).unwrap() {
            assert!(matches!(apply(&mut st, &cmd), Response::Applied { .. }));
        }
        st
    }

    #[test]
    fn a_master_needs_a_lease_for_the_tables_it_masters_only() {
        let st = cluster(
            "CREATE REPLICATION r ELEMENT e1 TABLE t1 MASTER a SUBSCRIBER b \
             ELEMENT e2 TABLE t2 MASTER b SUBSCRIBER a",
        );
        let scope = lease_scope(&st, &Ident::unquoted("a")).expect("a masters e1");
        assert_eq!(
            scope.tables.into_iter().collect::<Vec<_>>(),
            [QualName::bare("t1")]
        );
        assert!(!scope.every_table);
        assert!(scope.refusal.contains("r.e1"), "{}", scope.refusal);
        assert!(lease_scope(&st, &Ident::unquoted("unregistered")).is_none());
    }

    #[test]
    fn a_table_another_store_masters_is_refused_with_the_scope_and_a_bidirectional_one_is_not() {
        let st = cluster(
            "CREATE REPLICATION r ELEMENT e1 TABLE t1 MASTER a SUBSCRIBER b \
             ELEMENT e2 TABLE t2 MASTER b SUBSCRIBER a",
        );
        let a = lease_scope(&st, &Ident::unquoted("a")).unwrap();
        let why = a.elsewhere.get(&QualName::bare("t2")).expect("t2 is b's");
        assert!(
            why.contains("b masters it") && why.contains("r.e2"),
            "{why}"
        );
        assert!(!a.elsewhere.contains_key(&QualName::bare("t1")));
        // Both master t: each writes it.
        let st = cluster(
            "CREATE REPLICATION r ELEMENT e1 TABLE t MASTER a SUBSCRIBER b \
             ELEMENT e2 TABLE t MASTER b SUBSCRIBER a",
        );
        assert!(lease_scope(&st, &Ident::unquoted("a"))
            .unwrap()
            .elsewhere
            .is_empty());
    }

    #[test]
    fn a_datastore_master_needs_it_for_every_table_and_a_propagator_for_none() {
        let st = cluster("CREATE REPLICATION r ELEMENT d DATASTORE MASTER a SUBSCRIBER b");
        assert!(lease_scope(&st, &Ident::unquoted("a")).unwrap().every_table);
        let none = lease_scope(&st, &Ident::unquoted("b"));
        assert!(none.is_none(), "a subscriber masters nothing");
    }

    #[test]
    fn the_lease_scope_follows_a_failover() {
        let mut st = cluster("CREATE REPLICATION r ELEMENT e TABLE t MASTER a SUBSCRIBER b");
        let cmd = Command::SetMaster {
            scheme: QualName::bare("r"),
            element: Ident::unquoted("e"),
            node: NodeId(2),
            epoch: Epoch(1),
            fork_point: Some(hawser_core::Gtid::new(NodeId(1), 5)),
        };
        assert!(matches!(apply(&mut st, &cmd), Response::Applied { .. }));
        assert!(lease_scope(&st, &Ident::unquoted("b")).is_some());
        // The deposed master needs no lease any more, and refuses writes to t at once
        // (it now subscribes to b's element).
        let a = lease_scope(&st, &Ident::unquoted("a")).expect("a subscribes to e");
        assert!(!a.every_table && a.tables.is_empty());
        assert!(a.elsewhere.contains_key(&QualName::bare("t")));
        assert_eq!(st.era, 1);
    }
}
