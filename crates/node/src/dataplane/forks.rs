//! What failovers forked off: the ranges of a deposed master's commits past each fork
//! point, whether this store's log holds any, setting them aside, and receiving again
//! once a deposed master holds nothing of them.

use std::collections::{BTreeMap, BTreeSet};

use hawser_control::state::ReceiverState;
use hawser_control::ClusterState;
use hawser_core::{Epoch, Ident, Lsn, NodeId, QualName};
use hawser_store::blocking::off_the_runtime;
use hawser_store::Database;
use hawser_stream::ForkedRange;
use tracing::{debug, info, warn};

use super::{replace_if_changed, DataPlaneTask};

/// What every failover in the cluster state forked off: per element history record
/// with a fork point, the deposed origin's commits past it stamped with an older
/// failover era (the `epoch` of log records is the era their committer knew).
pub(super) fn forked_ranges(state: &ClusterState) -> Vec<ForkedRange> {
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
pub(super) struct ForkVerdicts {
    known: BTreeMap<ForkedRange, Option<bool>>,
    rebuilt: hawser_store::Rebuilt,
}

impl ForkVerdicts {
    pub(super) fn new() -> Self {
        Self {
            known: BTreeMap::new(),
            rebuilt: hawser_store::Rebuilt::default(),
        }
    }

    /// `Some(found)`, or `None` when the log cannot tell (released past the fork
    /// point, or too long to read back through). A store rebuilt whole since it heard
    /// of the failover holds none: they all precede the rebuild.
    pub(super) fn holds(&mut self, db: &Database, f: &ForkedRange) -> Option<bool> {
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
pub(super) async fn rejoin(task: &DataPlaneTask, state: &ClusterState, forks: &mut ForkVerdicts) {
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
        Err(e) => {
            // Not an empty answer: that would withdraw a rebuild already asked for.
            // The next plan (within a second) judges again.
            warn!(error = %e, "cannot read the high-water marks to judge the failovers");
            return;
        }
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
pub(super) fn past_fork_points(
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

#[cfg(test)]
mod tests {
    use crate::dataplane::testing::failed_over;
    use hawser_core::{Ident, NodeId, QualName};

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
}
