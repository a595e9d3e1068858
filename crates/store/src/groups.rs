//! What a store keeps of its BASE AGGREGATE tables: the rules (source table and
//! target) and, per aggregate table, its groups as the committed copy gives them. The
//! upkeep that reads and writes them on each apply is `crate::aggregate`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hawser_core::{QualName, Row};
use hawser_scheme::route::ResolvedTarget;
use hawser_target::aggregate::Acc;
use parking_lot::{Mutex, RwLock};

/// The BASE AGGREGATE targets this store keeps: source table and target.
pub type AggregateRules = Vec<(QualName, ResolvedTarget)>;

#[derive(Default)]
pub(crate) struct Aggregates {
    pub(crate) rules: RwLock<Arc<AggregateRules>>,
    /// Per aggregate table, its groups as the committed copy gives them.
    pub(crate) kept: Mutex<HashMap<QualName, Kept>>,
}

/// One aggregate table's groups, and what they were folded from.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    /// The copy's and the aggregate table's ids and the copy's catalog version.
    pub(crate) tables: (u64, u64, u64),
    pub(crate) groups: BTreeMap<Row, Group>,
}

/// What an apply changes in the kept groups once its batch is written.
pub(crate) enum Done {
    /// All of them, folded again.
    Replace(Kept),
    /// The groups it touched (`None`: no row is left in it), over the kept groups of
    /// these tables.
    Update {
        tables: (u64, u64, u64),
        groups: BTreeMap<Row, Option<Group>>,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) acc: Acc,
    /// `IBMSNAP_LLOGMARKER`: when the group began.
    pub(crate) low: i64,
}

impl Aggregates {
    pub(crate) fn rules(&self) -> Arc<AggregateRules> {
        self.rules.read().clone()
    }

    /// Makes an apply's groups the kept ones (its engine write succeeded).
    pub(crate) fn commit(&self, done: Vec<(QualName, Done)>) {
        let mut kept = self.kept.lock();
        for (into, d) in done {
            match d {
                Done::Replace(k) => {
                    kept.insert(into, k);
                }
                Done::Update { tables, groups } => {
                    // Kept groups dropped meanwhile (a failed write) are folded again
                    // when next used: nothing to update.
                    let Some(k) = kept.get_mut(&into).filter(|k| k.tables == tables) else {
                        continue;
                    };
                    for (g, group) in groups {
                        match group {
                            Some(group) => k.groups.insert(g, group),
                            None => k.groups.remove(&g),
                        };
                    }
                }
            }
        }
    }

    /// Drops every kept group: they are folded again when next used.
    pub(crate) fn forget(&self) {
        self.kept.lock().clear();
    }
}
