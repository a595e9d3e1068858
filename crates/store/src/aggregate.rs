//! BASE AGGREGATE upkeep (docs/targets.md): a subscriber keeps the source rows of a
//! BASE AGGREGATE target as a copy, and every replicated apply that changes that copy
//! writes the aggregate rows of the groups it touched in the same engine batch (atomic
//! with it across crashes). The arithmetic is `hawser_target::aggregate`'s; this module
//! keeps the groups and reads and writes.
//!
//! ```text
//!  apply (write step)     note(change): group of before −= row, group of after += row
//!                         (from the kept groups: folded from the copy once, then kept)
//!                         write(): the touched groups' rows into the batch
//!  after the engine write commit(): the touched groups become the kept ones
//! ```
//!
//! Decisions:
//! - The groups are kept in memory per aggregate table, folded from the copy on first
//!   use (one scan per table per process) and then changed by each apply: an apply
//!   costs its changes, not the table. A removal the running state cannot undo (the
//!   row held a group's MIN or MAX, or a DOUBLE sum would drift) folds the whole copy
//!   again for that apply, as DB2 folds the whole source each cycle.
//! - An apply copies each group it touches out of the kept ones and puts back only
//!   those, after its engine write succeeded; the kept groups are dropped on a failed
//!   write, a catalog change of the copy or a duplicate ([`Database::
//!   refresh_aggregates`]), so they never run ahead of the committed rows, and an
//!   apply costs its changes, not the number of groups.
//! - Aggregate rows have no log record: they are this store's derivation of rows it
//!   logs, like the conflicts table's rows, and are never sent on.
//! - A rule set for a copy that already holds rows (after a duplicate) is reconciled at
//!   once; groups whose aggregates already agree are left as they are, so a restart
//!   writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hawser_core::key::encode_key;
use hawser_core::{QualName, Row, RowChange, Value};
use hawser_scheme::route::ResolvedTarget;
use hawser_target::Aggregation;

use crate::codec;
use crate::db::{now_micros, Database, Inner, KeyRange, TableRef};
use crate::engine::WriteBatch;
use crate::error::StoreError;
pub use crate::groups::AggregateRules;
pub(crate) use crate::groups::{Aggregates, Done};
use crate::groups::{Group, Kept};
use crate::layout;
use crate::rows::decode_stored_row;

/// One aggregation an apply touches.
struct Rule {
    agg: Aggregation,
    source: TableRef,
    into: TableRef,
    /// The kept groups' tables ([`Kept::tables`]).
    tables: (u64, u64, u64),
    /// The groups the apply touched, as its changes leave them (each taken from the
    /// kept groups when first touched).
    groups: BTreeMap<Row, Group>,
    /// Groups changed, with what they were before the apply.
    changed: BTreeMap<Row, Changed>,
    /// A removal could not be undone: fold the copy again at the end.
    refold: bool,
}

/// A group an apply changed.
struct Changed {
    /// Commit time of the first change.
    first: i64,
    /// Commit time of the last change.
    last: i64,
    /// Its `IBMSNAP_LLOGMARKER` before the apply, when it had rows then.
    old_low: Option<i64>,
}

/// The aggregations of one apply.
pub(crate) struct Touched<'a> {
    aggregates: &'a Aggregates,
    rules: Vec<Rule>,
}

impl<'a> Touched<'a> {
    /// The aggregations of `tables` (an apply's) under the store's rules, each with its
    /// groups as committed. One that no longer fits its source table is skipped with a
    /// warning.
    pub(crate) fn new(inner: &'a Inner, tables: &[TableRef]) -> Result<Self, StoreError> {
        let mut out = Vec::new();
        for (source, target) in inner.aggregates.rules().iter() {
            let Some(t) = tables.iter().find(|t| &t.def.name == source) else {
                continue;
            };
            let agg = match Aggregation::new(&t.def, target) {
                Ok(Some(a)) if !a.change => a,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "an aggregate target is not kept");
                    continue;
                }
            };
            let Some(into) = target_table(inner, &agg) else {
                continue;
            };
            let tables = keep_groups(inner, &agg, t, &into)?;
            out.push(Rule {
                agg,
                source: t.clone(),
                into,
                tables,
                groups: BTreeMap::new(),
                changed: BTreeMap::new(),
                refold: false,
            });
        }
        Ok(Touched {
            aggregates: &inner.aggregates,
            rules: out,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Takes a change applied here into its groups: its before-image out of one, its
    /// after-image into one.
    pub(crate) fn note(&mut self, change: &RowChange, commit_micros: i64) {
        for rule in &mut self.rules {
            if rule.agg.source != change.table {
                continue;
            }
            // An update within one group does not end the group, even for a moment.
            let left = change.before.as_ref().map(|b| rule.agg.group_of(b));
            for (row, add) in [(&change.before, false), (&change.after, true)] {
                let Some(row) = row else { continue };
                let group = rule.agg.group_of(row);
                if !rule.changed.contains_key(&group) {
                    // First touched: as kept.
                    let kept = self
                        .aggregates
                        .kept
                        .lock()
                        .get(&rule.into.def.name)
                        .and_then(|k| k.groups.get(&group))
                        .filter(|g| g.acc.rows() > 0)
                        .cloned();
                    let old_low = kept.as_ref().map(|g| g.low);
                    if let Some(g) = kept {
                        rule.groups.insert(group.clone(), g);
                    }
                    rule.changed.insert(
                        group.clone(),
                        Changed {
                            first: commit_micros,
                            last: commit_micros,
                            old_low,
                        },
                    );
                } else if let Some(c) = rule.changed.get_mut(&group) {
                    c.last = c.last.max(commit_micros);
                }
                if rule.refold {
                    continue;
                }
                let same = left.as_ref() == Some(&group);
                let g = rule.groups.entry(group).or_insert_with(|| Group {
                    acc: rule.agg.empty(),
                    low: commit_micros,
                });
                if add && g.acc.rows() == 0 && !same {
                    g.low = commit_micros;
                }
                if add {
                    rule.agg.add(&mut g.acc, row);
                } else if g.acc.rows() == 0 || !rule.agg.remove(&mut g.acc, row) {
                    // Also a row the kept groups do not know: fold again.
                    rule.refold = true;
                }
            }
        }
    }

    /// Adds to `batch` the aggregate rows of every group the apply changed, and
    /// returns the groups to keep once the batch is written. `overlay[i]` holds the
    /// apply's own writes of `tables[i]` (by encoded key), for a refold.
    pub(crate) fn write(
        self,
        inner: &Inner,
        tables: &[TableRef],
        overlay: &[BTreeMap<Vec<u8>, Option<Row>>],
        batch: &mut WriteBatch,
    ) -> Result<Vec<(QualName, Done)>, StoreError> {
        let mut done = Vec::new();
        for mut rule in self.rules {
            if rule.changed.is_empty() {
                continue;
            }
            let mut all = None;
            if rule.refold {
                // Fold the copy as the apply leaves it. A group keeps the low it had
                // before the apply; one that begins in it, its first change's time.
                let i = tables.iter().position(|t| t.id == rule.source.id);
                let mut folded = BTreeMap::new();
                each_row(inner, &rule.source, i.map(|i| &overlay[i]), |row| {
                    rule.agg.fold_row(&mut folded, row, |_| true);
                })?;
                let kept = self.aggregates.kept.lock();
                let kept = kept.get(&rule.into.def.name);
                let low_of = |g: &Row| match rule.changed.get(g) {
                    Some(c) => c.old_low.unwrap_or(c.first),
                    None => kept
                        .and_then(|k| k.groups.get(g))
                        .map_or_else(now_micros, |k| k.low),
                };
                let groups: BTreeMap<Row, Group> = folded
                    .into_iter()
                    .map(|(g, acc)| {
                        let low = low_of(&g);
                        (g, Group { acc, low })
                    })
                    .collect();
                all = Some(groups);
            }
            let now_of = |g: &Row| {
                all.as_ref()
                    .unwrap_or(&rule.groups)
                    .get(g)
                    .filter(|g| g.acc.rows() > 0)
            };
            for (group, c) in &rule.changed {
                let old_key = c.old_low.map(|low| key_of(&rule.agg, group, low));
                let (gone, put) = match now_of(group) {
                    None => (old_key, None),
                    Some(g) => {
                        let row = rule
                            .agg
                            .base_row(group, &g.acc, g.low, c.last.max(g.low))
                            .map_err(|e| StoreError::InvalidBatch(e.to_string()))?;
                        let key = rule.into.def.key_of(&row);
                        (old_key.filter(|k| *k != key), Some(row))
                    }
                };
                put_rows(&rule.into, gone, put, batch);
            }
            let name = rule.into.def.name.clone();
            done.push(match all {
                Some(groups) => (
                    name,
                    Done::Replace(Kept {
                        tables: rule.tables,
                        groups,
                    }),
                ),
                None => {
                    let groups = rule
                        .changed
                        .keys()
                        .map(|g| {
                            let group = rule.groups.remove(g).filter(|g| g.acc.rows() > 0);
                            (g.clone(), group)
                        })
                        .collect();
                    (
                        name,
                        Done::Update {
                            tables: rule.tables,
                            groups,
                        },
                    )
                }
            });
        }
        Ok(done)
    }
}

/// The aggregate table's key of `group`'s row, the group having begun at `low`.
fn key_of(agg: &Aggregation, group: &Row, low: i64) -> Row {
    if agg.keyed_by_group() {
        group.clone()
    } else {
        vec![Value::Timestamp(low)]
    }
}

/// The aggregate table of `agg`, if it is there with the shape `agg` needs.
fn target_table(inner: &Inner, agg: &Aggregation) -> Option<TableRef> {
    let into = inner.catalog.table(&agg.def.name);
    let Some(into) = into else {
        tracing::warn!(table = %agg.def.name, "an aggregate table is missing: not kept");
        return None;
    };
    if let Err(e) = hawser_target::check_shape(&into.def, &agg.def) {
        tracing::warn!(error = %e, "an aggregate table is not kept");
        return None;
    }
    Some(into)
}

/// Makes sure `agg`'s groups are kept, folded from the committed copy when none are
/// kept for these tables; returns the tables they are kept for.
fn keep_groups(
    inner: &Inner,
    agg: &Aggregation,
    source: &TableRef,
    into: &TableRef,
) -> Result<(u64, u64, u64), StoreError> {
    let tables = (source.id, into.id, source.version);
    if inner
        .aggregates
        .kept
        .lock()
        .get(&into.def.name)
        .is_some_and(|k| k.tables == tables)
    {
        return Ok(tables);
    }
    let kept = fold_groups(inner, agg, source, into)?;
    // The committed rows' groups: true whatever the apply about to use them does.
    inner
        .aggregates
        .kept
        .lock()
        .insert(into.def.name.clone(), kept);
    Ok(tables)
}

/// `agg`'s groups folded from the committed copy, each with its low from the aggregate
/// table (now, for a group it lacks).
fn fold_groups(
    inner: &Inner,
    agg: &Aggregation,
    source: &TableRef,
    into: &TableRef,
) -> Result<Kept, StoreError> {
    let mut folded = BTreeMap::new();
    each_row(inner, source, None, |row| {
        agg.fold_row(&mut folded, row, |_| true)
    })?;
    let lows = lows(inner, agg, into)?;
    let groups = folded
        .into_iter()
        .map(|(g, acc)| {
            let low = lows.get(&g).copied().unwrap_or_else(now_micros);
            (g, Group { acc, low })
        })
        .collect();
    Ok(Kept {
        tables: (source.id, into.id, source.version),
        groups,
    })
}

/// Each group's `IBMSNAP_LLOGMARKER` in the aggregate table.
fn lows(
    inner: &Inner,
    agg: &Aggregation,
    into: &TableRef,
) -> Result<BTreeMap<Row, i64>, StoreError> {
    let mut out = BTreeMap::new();
    each_row(inner, into, None, |row| {
        if let Some(Value::Timestamp(t)) = row.first() {
            out.insert(agg.group_of_target(row), *t);
        }
    })?;
    Ok(out)
}

/// Calls `f` with every row of `t` as committed, under `overlay`'s versions.
fn each_row(
    inner: &Inner,
    t: &TableRef,
    overlay: Option<&BTreeMap<Vec<u8>, Option<Row>>>,
    mut f: impl FnMut(&Row),
) -> Result<(), StoreError> {
    let prefix = layout::row_prefix(t.id).len();
    for kv in inner.scan_rows(t, &KeyRange::all(), false)? {
        let (key, value) = kv?;
        if overlay.is_some_and(|o| o.contains_key(&key[prefix..])) {
            continue;
        }
        f(&decode_stored_row(&t.def, &key, &value)?);
    }
    for row in overlay.into_iter().flat_map(|o| o.values()).flatten() {
        f(row);
    }
    Ok(())
}

fn put_rows(into: &TableRef, gone: Option<Row>, put: Option<Row>, batch: &mut WriteBatch) {
    if let Some(key) = gone {
        batch.delete(layout::row_key(into.id, &encode_key(&key)));
    }
    if let Some(row) = put {
        let key = layout::row_key(into.id, &encode_key(&into.def.key_of(&row)));
        batch.put(key, codec::encode_row(&row));
    }
}

impl Database {
    /// Keeps the BASE AGGREGATE targets `rules` says (the node sets them from the
    /// schemes): from now on each apply that changes a rule's source table updates its
    /// aggregate table. A rule new here whose source table is already here creates the
    /// aggregate table if needed and brings it up to date with the rows there.
    pub async fn set_aggregates(&self, rules: AggregateRules) -> Result<(), StoreError> {
        let old = self.inner.aggregates.rules();
        if *old == rules {
            return Ok(());
        }
        *self.inner.aggregates.rules.write() = Arc::new(rules.clone());
        let new: Vec<_> = rules.into_iter().filter(|r| !old.contains(r)).collect();
        self.reconcile(&new).await
    }

    /// Brings every aggregate table up to date with its copy, folded again: after a
    /// duplicate, which writes the copy without applies.
    pub async fn refresh_aggregates(&self) -> Result<(), StoreError> {
        self.inner.aggregates.forget();
        let rules = self.inner.aggregates.rules();
        self.reconcile(&rules).await
    }

    async fn reconcile(&self, rules: &[(QualName, ResolvedTarget)]) -> Result<(), StoreError> {
        for (source, target) in rules {
            let Some(def) = self.table(source) else {
                continue;
            };
            let Some(agg) = Aggregation::new(&def, target)
                .map_err(|e| StoreError::InvalidBatch(e.to_string()))?
            else {
                continue;
            };
            if self.table(&agg.def.name).is_none() {
                match self.create_table(agg.def.clone()).await {
                    Ok(_) => {}
                    Err(_) if self.table(&agg.def.name).is_some() => {}
                    Err(e) => return Err(e),
                }
            }
            self.reconcile_one(&agg).await?;
        }
        Ok(())
    }

    /// Writes every group of `agg` whose aggregate row does not hold what the source
    /// rows here give, and deletes the rows of groups the source no longer has.
    async fn reconcile_one(&self, agg: &Aggregation) -> Result<(), StoreError> {
        let inner = &self.inner;
        let _serial = inner.apply_lock.lock().await;
        let state = inner.commit.lock();
        let (Some(source), Some(into)) =
            (inner.catalog.table(&agg.source), target_table(inner, agg))
        else {
            return Ok(());
        };
        let kept = fold_groups(inner, agg, &source, &into)?;
        let mut olds = BTreeMap::new();
        each_row(inner, &into, None, |row| {
            olds.insert(agg.group_of_target(row), row.clone());
        })?;
        let mut batch = WriteBatch::new();
        let mut written = 0;
        let groups: BTreeSet<&Row> = kept.groups.keys().chain(olds.keys()).collect();
        for group in groups {
            let (g, old) = (kept.groups.get(group), olds.get(group));
            let put = match (g, old) {
                (Some(g), Some(old)) if agg.agrees(old, &g.acc) => continue,
                (Some(g), _) => Some(
                    agg.base_row(group, &g.acc, g.low, g.low.max(now_micros()))
                        .map_err(|e| StoreError::InvalidBatch(e.to_string()))?,
                ),
                (None, _) => None,
            };
            let gone = old
                .map(|o| into.def.key_of(o))
                .filter(|k| put.as_ref().is_none_or(|p| *k != into.def.key_of(p)));
            put_rows(&into, gone, put, &mut batch);
            written += 1;
        }
        if written > 0 {
            inner.engine.apply(batch)?;
        }
        inner
            .aggregates
            .commit(vec![(into.def.name.clone(), Done::Replace(kept))]);
        drop(state);
        if written > 0 {
            inner.engine.flush()?;
            tracing::info!(table = %agg.def.name, groups = written, "aggregate table brought up to date");
        }
        Ok(())
    }
}
