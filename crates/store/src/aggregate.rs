//! BASE AGGREGATE upkeep (docs/targets.md): a subscriber keeps the source rows of a
//! BASE AGGREGATE target as a copy, and every replicated apply that changes that copy
//! recomputes the groups it touched from it, writing the aggregate rows in the same
//! engine batch as the apply (atomic with it across crashes). The arithmetic is
//! `hawser_target::aggregate`'s; this module reads and writes.
//!
//! Decisions:
//! - A touched group is folded again from every row of the copy (one scan per apply
//!   that touches a rule's table), as DB2 computes a base aggregate from the whole
//!   source table each cycle: exact for MIN, MAX and AVG without keeping more state.
//! - Aggregate rows have no log record: they are this store's derivation of rows it
//!   logs, like the conflicts table's rows, and are never sent on.
//! - A rule set for a copy that already holds rows (after a duplicate) is reconciled at
//!   once; groups whose aggregates already agree are left as they are, so a restart
//!   writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hawser_core::key::encode_key;
use hawser_core::{QualName, Row, RowChange};
use hawser_scheme::route::ResolvedTarget;
use hawser_target::aggregate::Acc;
use hawser_target::Aggregation;
use parking_lot::RwLock;

use crate::codec;
use crate::db::{decode_stored_row, now_micros, Database, Inner, KeyRange, TableRef};
use crate::engine::WriteBatch;
use crate::error::StoreError;
use crate::layout;

/// The BASE AGGREGATE targets this store keeps: source table and target.
pub type AggregateRules = Vec<(QualName, ResolvedTarget)>;

#[derive(Default)]
pub(crate) struct Aggregates {
    rules: RwLock<Arc<AggregateRules>>,
}

impl Aggregates {
    pub(crate) fn rules(&self) -> Arc<AggregateRules> {
        self.rules.read().clone()
    }
}

/// Groups touched, with the commit times of the first and last transactions that
/// touched each.
type Groups = BTreeMap<Row, (i64, i64)>;

/// The groups one apply's changes touched, per aggregation of a table it changes.
pub(crate) struct Touched {
    rules: Vec<(Aggregation, Groups)>,
}

impl Touched {
    /// The aggregations of `tables` (an apply's) under `rules`; one that no longer
    /// fits its source table is skipped with a warning.
    pub(crate) fn new(rules: &AggregateRules, tables: &[TableRef]) -> Self {
        let mut out = Vec::new();
        for (source, target) in rules {
            let Some(t) = tables.iter().find(|t| &t.def.name == source) else {
                continue;
            };
            match Aggregation::new(&t.def, target) {
                Ok(Some(a)) if !a.change => out.push((a, BTreeMap::new())),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "an aggregate target is not kept"),
            }
        }
        Touched { rules: out }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Notes the groups a change applied here left and entered.
    pub(crate) fn note(&mut self, change: &RowChange, commit_micros: i64) {
        for (agg, groups) in &mut self.rules {
            if agg.source != change.table {
                continue;
            }
            for row in [&change.before, &change.after].into_iter().flatten() {
                groups
                    .entry(agg.group_of(row))
                    .and_modify(|(_, last)| *last = (*last).max(commit_micros))
                    .or_insert((commit_micros, commit_micros));
            }
        }
    }

    /// Adds to `batch` the aggregate rows of every touched group, folded from the
    /// source rows as the apply leaves them: the committed rows of `tables[i]` under
    /// the apply's own writes `overlay[i]` (by encoded key).
    pub(crate) fn write(
        self,
        inner: &Inner,
        tables: &[TableRef],
        overlay: &[BTreeMap<Vec<u8>, Option<Row>>],
        batch: &mut WriteBatch,
    ) -> Result<(), StoreError> {
        for (agg, groups) in self.rules {
            if groups.is_empty() {
                continue;
            }
            let Some(into) = target_table(inner, &agg) else {
                continue;
            };
            let Some(i) = tables.iter().position(|t| t.def.name == agg.source) else {
                continue;
            };
            let mut folded = BTreeMap::new();
            each_row(inner, &tables[i], Some(&overlay[i]), |row| {
                agg.fold_row(&mut folded, row, |g| groups.contains_key(g));
            })?;
            let olds = old_rows(inner, &into, &agg, groups.keys())?;
            for (group, (first, last)) in &groups {
                let (gone, put) = agg
                    .base_update(group, folded.get(group), olds.get(group), *first, *last)
                    .map_err(|e| StoreError::InvalidBatch(e.to_string()))?;
                put_rows(&into, gone, put, batch);
            }
        }
        Ok(())
    }
}

/// The aggregate table of `agg`, if it is there with the shape `agg` needs.
fn target_table(inner: &Inner, agg: &Aggregation) -> Option<TableRef> {
    let into = inner.catalog.read().tables.get(&agg.def.name).cloned();
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

/// The aggregate table's rows of `groups`, by group.
fn old_rows<'a>(
    inner: &Inner,
    into: &TableRef,
    agg: &Aggregation,
    groups: impl Iterator<Item = &'a Row>,
) -> Result<BTreeMap<Row, Row>, StoreError> {
    let mut out = BTreeMap::new();
    if agg.keyed_by_group() {
        for g in groups {
            if let Some(row) = inner.get_row(into, &encode_key(g))? {
                out.insert(g.clone(), row);
            }
        }
    } else {
        each_row(inner, into, None, |row| {
            out.insert(agg.group_of_target(row), row.clone());
        })?;
    }
    Ok(out)
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
        for (source, target) in rules.iter().filter(|r| !old.contains(r)) {
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
            self.reconcile(&agg).await?;
        }
        Ok(())
    }

    /// Writes every group of `agg` whose aggregate row does not hold what the source
    /// rows here give, and deletes the rows of groups the source no longer has.
    async fn reconcile(&self, agg: &Aggregation) -> Result<(), StoreError> {
        let inner = &self.inner;
        let _serial = inner.apply_lock.lock().await;
        let state = inner.commit.lock();
        let (Some(source), Some(into)) = (
            inner.catalog.read().tables.get(&agg.source).cloned(),
            target_table(inner, agg),
        ) else {
            return Ok(());
        };
        let mut folded: BTreeMap<Row, Acc> = BTreeMap::new();
        each_row(inner, &source, None, |row| {
            agg.fold_row(&mut folded, row, |_| true)
        })?;
        let mut olds = BTreeMap::new();
        each_row(inner, &into, None, |row| {
            olds.insert(agg.group_of_target(row), row.clone());
        })?;
        let now = now_micros();
        let mut batch = WriteBatch::new();
        let mut written = 0;
        let groups: BTreeSet<&Row> = folded.keys().chain(olds.keys()).collect();
        for group in groups {
            let (acc, old) = (folded.get(group), olds.get(group));
            if let (Some(acc), Some(old)) = (acc, old) {
                if agg.agrees(old, acc) {
                    continue;
                }
            }
            let (gone, put) = agg
                .base_update(group, acc, old, now, now)
                .map_err(|e| StoreError::InvalidBatch(e.to_string()))?;
            put_rows(&into, gone, put, &mut batch);
            written += 1;
        }
        if written > 0 {
            inner.engine.apply(batch)?;
            drop(state);
            inner.engine.flush()?;
            tracing::info!(table = %agg.def.name, groups = written, "aggregate table brought up to date");
        }
        Ok(())
    }
}
