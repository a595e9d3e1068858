//! Net-row compilation: a run of transactions in, net row operations per table out.
//!
//! ```text
//!  txn 1 ─┐                      ┌─ (t, key 1) ─ I U D I ─► Insert
//!  txn 2 ─┼─► changes by table ──┼─ (t, key 2) ─ U U     ─► Update (merged)
//!  txn n ─┘     and key          └─ (u, key 7) ─ U D     ─► Delete
//! ```
//!
//! Every (table, key) cluster is reduced as changes arrive, with the pair rules of
//! Sybase RTL as docs/design.md §6 fixes them. The rule for a pair depends only on the
//! cluster's last operation and the new one:
//!
//! | last \ next | insert            | update              | delete        |
//! |-------------|-------------------|---------------------|---------------|
//! | insert      | invalid           | insert, merged      | nothing       |
//! | update      | invalid           | update, merged      | delete        |
//! | delete      | replace (delete + insert, not reduced) | invalid | invalid |
//!
//! Merging is "later wins per column". An update that changes the key is split into a
//! delete of the old key and an insert of the new key (docs/rtl.md explains why), so it
//! needs the whole new row: from its before-image, or from an insert earlier in the run.
//!
//! The first invalid pair stops reduction: the run is [`Outcome::NotCompilable`], the
//! result names the table, key, pair and position, and the caller applies the run in
//! log order instead. Malformed input (unknown table, missing images, wrong widths) is
//! a [`CompileError`] and leaves the compiler as it was.

use std::collections::BTreeMap;
use std::fmt;

use hawser_core::key::encode_key;
use hawser_core::{ChangeOp, Gtid, QualName, Row, TableDef, Transaction, Value};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::change::{Assignment, Catalog, Change, ChangeKind, ChangeProblem};

/// A malformed change in the input; nothing of its transaction was taken in.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("transaction {transaction} of the run, change {change}: {problem}")]
pub struct CompileError {
    /// Index of the transaction in the run, from 0.
    pub transaction: usize,
    /// Index of the change in its transaction, from 0.
    pub change: usize,
    pub problem: ChangeProblem,
}

/// Compiles a run of commit-log transactions (log order) in one call.
pub fn compile<C: Catalog + ?Sized>(
    transactions: &[Transaction],
    catalog: &C,
) -> Result<Compilation, CompileError> {
    let mut compiler = Compiler::new(catalog);
    for txn in transactions {
        compiler.push_transaction(txn)?;
    }
    Ok(compiler.finish())
}

/// Compiles a run given as transactions of [`Change`]s (log order) in one call.
pub fn compile_changes<C: Catalog + ?Sized>(
    transactions: impl IntoIterator<Item = Vec<Change>>,
    catalog: &C,
) -> Result<Compilation, CompileError> {
    let mut compiler = Compiler::new(catalog);
    for txn in transactions {
        compiler.push_changes(txn)?;
    }
    Ok(compiler.finish())
}

/// An incremental compiler: feed transactions in log order, then [`finish`](Self::finish).
///
/// A receiver can push transactions as they arrive and cut the run wherever it likes;
/// the end of a run is always a transaction boundary.
pub struct Compiler<'c, C: Catalog + ?Sized> {
    catalog: &'c C,
    transactions: u64,
    row_changes: u64,
    /// Clusters by table, then by encoded key (so iteration is key order).
    clusters: BTreeMap<QualName, BTreeMap<Vec<u8>, Cluster>>,
    refused: Option<NotCompilable>,
}

impl<'c, C: Catalog + ?Sized> Compiler<'c, C> {
    pub fn new(catalog: &'c C) -> Self {
        Self {
            catalog,
            transactions: 0,
            row_changes: 0,
            clusters: BTreeMap::new(),
            refused: None,
        }
    }

    /// Takes in one commit-log transaction.
    pub fn push_transaction(&mut self, txn: &Transaction) -> Result<(), CompileError> {
        let index = self.transaction_index();
        let changes = txn
            .changes
            .iter()
            .enumerate()
            .map(|(i, rc)| {
                self.catalog
                    .table(&rc.table)
                    .ok_or_else(|| ChangeProblem::UnknownTable(rc.table.clone()))
                    .and_then(|def| Change::from_row_change(rc, def))
                    .map_err(|problem| CompileError {
                        transaction: index,
                        change: i,
                        problem,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.take(changes, Some(txn.gtid));
        Ok(())
    }

    /// Takes in one transaction given as [`Change`]s.
    pub fn push_changes(&mut self, changes: Vec<Change>) -> Result<(), CompileError> {
        let index = self.transaction_index();
        for (i, change) in changes.iter().enumerate() {
            self.catalog
                .table(&change.table)
                .ok_or_else(|| ChangeProblem::UnknownTable(change.table.clone()))
                .and_then(|def| change.check(def))
                .map_err(|problem| CompileError {
                    transaction: index,
                    change: i,
                    problem,
                })?;
        }
        self.take(changes, None);
        Ok(())
    }

    /// Whether the run so far still compiles.
    pub fn is_compilable(&self) -> bool {
        self.refused.is_none()
    }

    /// The net result of everything pushed.
    pub fn finish(self) -> Compilation {
        let mut counts = Counts {
            transactions: self.transactions,
            row_changes: self.row_changes,
            net_operations: 0,
        };
        let outcome = match self.refused {
            Some(refused) => Outcome::NotCompilable(refused),
            None => {
                let catalog = self.catalog;
                let tables: Vec<NetTable> = self
                    .clusters
                    .into_iter()
                    .map(|(table, clusters)| {
                        // Only tables found in the catalog ever get clusters.
                        let width = catalog.table(&table).map_or(0, |d| d.columns.len());
                        NetTable {
                            table,
                            operations: clusters
                                .into_values()
                                .filter_map(|c| c.into_op(width))
                                .collect(),
                        }
                    })
                    .filter(|t| !t.operations.is_empty())
                    .collect();
                counts.net_operations = tables.iter().map(|t| t.operations.len() as u64).sum();
                Outcome::Compiled { tables }
            }
        };
        Compilation { counts, outcome }
    }

    fn transaction_index(&self) -> usize {
        usize::try_from(self.transactions).unwrap_or(usize::MAX)
    }

    /// Reduces one well-formed transaction into the clusters.
    fn take(&mut self, changes: Vec<Change>, gtid: Option<Gtid>) {
        let transaction = self.transaction_index();
        self.transactions += 1;
        self.row_changes += changes.len() as u64;
        if self.refused.is_some() {
            // The run is applied in log order anyway; only the counts still matter.
            return;
        }
        for (index, change) in changes.into_iter().enumerate() {
            // `push_*` checked the table exists before calling here.
            let Some(def) = self.catalog.table(&change.table) else {
                continue;
            };
            if let Err(refusal) = reduce(&mut self.clusters, def, change) {
                self.refused = Some(NotCompilable {
                    table: refusal.table,
                    key: refusal.key,
                    reason: refusal.reason,
                    transaction,
                    change: index,
                    gtid,
                });
                return;
            }
        }
    }
}

/// The net state of one (table, key) cluster.
#[derive(Debug)]
struct Cluster {
    key: Row,
    net: Net,
    /// The last operation reduced into this cluster; it alone decides which next
    /// operation is a valid pair.
    last: ChangeOp,
}

#[derive(Debug)]
enum Net {
    /// Inserted and deleted within the run.
    Nothing,
    Insert {
        row: Row,
    },
    Update {
        before: Option<Row>,
        set: BTreeMap<usize, Value>,
    },
    Delete {
        before: Option<Row>,
    },
    Replace {
        before: Option<Row>,
        row: Row,
    },
}

impl Cluster {
    /// The whole row as it stands after the cluster's changes, when known.
    fn current_row(&self, width: usize) -> Option<Row> {
        match &self.net {
            Net::Insert { row } | Net::Replace { row, .. } => Some(row.clone()),
            Net::Update { before, set } => after_of(before.as_ref(), set, width),
            Net::Nothing | Net::Delete { .. } => None,
        }
    }

    fn into_op(self, width: usize) -> Option<NetOp> {
        let key = self.key;
        Some(match self.net {
            Net::Nothing => return None,
            Net::Insert { row } => NetOp::Insert { key, row },
            Net::Update { before, set } => {
                let after = after_of(before.as_ref(), &set, width);
                NetOp::Update {
                    key,
                    before,
                    after,
                    set: set
                        .into_iter()
                        .map(|(column, value)| Assignment { column, value })
                        .collect(),
                }
            }
            Net::Delete { before } => NetOp::Delete { key, before },
            Net::Replace { before, row } => NetOp::Replace { key, before, row },
        })
    }
}

/// `before` with `set` applied, or — without a before-image — the row made of `set`
/// alone when it covers all `width` columns.
fn after_of(before: Option<&Row>, set: &BTreeMap<usize, Value>, width: usize) -> Option<Row> {
    match before {
        Some(before) => {
            let mut row = before.clone();
            apply_set(&mut row, set);
            Some(row)
        }
        None if width > 0 && set.len() == width && set.keys().copied().eq(0..width) => {
            Some(set.values().cloned().collect())
        }
        None => None,
    }
}

fn apply_set(row: &mut [Value], set: &BTreeMap<usize, Value>) {
    for (&column, value) in set {
        if let Some(slot) = row.get_mut(column) {
            *slot = value.clone();
        }
    }
}

/// Why one change could not be reduced, before the compiler adds its position.
struct Refusal {
    table: QualName,
    key: Row,
    reason: Reason,
}

fn invalid(table: &QualName, key: &Row, first: ChangeOp, second: ChangeOp) -> Refusal {
    Refusal {
        table: table.clone(),
        key: key.clone(),
        reason: Reason::InvalidPair { first, second },
    }
}

fn reduce(
    clusters: &mut BTreeMap<QualName, BTreeMap<Vec<u8>, Cluster>>,
    def: &TableDef,
    change: Change,
) -> Result<(), Refusal> {
    let Change { table, key, kind } = change;
    let table_clusters = clusters.entry(table.clone()).or_default();
    let encoded = encode_key(&key);
    match kind {
        ChangeKind::Insert { row } => {
            insert(table_clusters, &table, encoded, key, row)?;
        }
        ChangeKind::Delete { before } => {
            delete(table_clusters, &table, encoded, key, before)?;
        }
        ChangeKind::Update { before, set } => {
            let mut new_key = key.clone();
            for a in &set {
                if let Some(pos) = def.primary_key.iter().position(|&c| c == a.column) {
                    new_key[pos] = a.value.clone();
                }
            }
            let set: BTreeMap<usize, Value> =
                set.into_iter().map(|a| (a.column, a.value)).collect();
            if new_key == key {
                update(table_clusters, &table, encoded, key, before, set)?;
            } else {
                let width = def.columns.len();
                change_key(
                    table_clusters,
                    &table,
                    width,
                    encoded,
                    key,
                    new_key,
                    before,
                    set,
                )?;
            }
        }
    }
    Ok(())
}

fn insert(
    clusters: &mut BTreeMap<Vec<u8>, Cluster>,
    table: &QualName,
    encoded: Vec<u8>,
    key: Row,
    row: Row,
) -> Result<(), Refusal> {
    let Some(cluster) = clusters.get_mut(&encoded) else {
        clusters.insert(
            encoded,
            Cluster {
                key,
                net: Net::Insert { row },
                last: ChangeOp::Insert,
            },
        );
        return Ok(());
    };
    if cluster.last != ChangeOp::Delete {
        return Err(invalid(table, &key, cluster.last, ChangeOp::Insert));
    }
    cluster.net = match std::mem::replace(&mut cluster.net, Net::Nothing) {
        // delete + insert: not reduced, the row is replaced.
        Net::Delete { before } => Net::Replace { before, row },
        // (insert + delete) + insert: the row did not exist before the run.
        _ => Net::Insert { row },
    };
    cluster.last = ChangeOp::Insert;
    Ok(())
}

fn update(
    clusters: &mut BTreeMap<Vec<u8>, Cluster>,
    table: &QualName,
    encoded: Vec<u8>,
    key: Row,
    before: Option<Row>,
    set: BTreeMap<usize, Value>,
) -> Result<(), Refusal> {
    let Some(cluster) = clusters.get_mut(&encoded) else {
        clusters.insert(
            encoded,
            Cluster {
                key,
                net: Net::Update { before, set },
                last: ChangeOp::Update,
            },
        );
        return Ok(());
    };
    if cluster.last == ChangeOp::Delete {
        return Err(invalid(table, &key, ChangeOp::Delete, ChangeOp::Update));
    }
    match &mut cluster.net {
        // insert + update: an insert with the update's differences merged in.
        Net::Insert { row } | Net::Replace { row, .. } => apply_set(row, &set),
        // update + update: later wins per column.
        Net::Update { set: merged, .. } => merged.extend(set),
        // `last` is Delete exactly for these two, refused above.
        Net::Nothing | Net::Delete { .. } => {
            return Err(invalid(table, &key, ChangeOp::Delete, ChangeOp::Update))
        }
    }
    cluster.last = ChangeOp::Update;
    Ok(())
}

fn delete(
    clusters: &mut BTreeMap<Vec<u8>, Cluster>,
    table: &QualName,
    encoded: Vec<u8>,
    key: Row,
    before: Option<Row>,
) -> Result<(), Refusal> {
    let Some(cluster) = clusters.get_mut(&encoded) else {
        clusters.insert(
            encoded,
            Cluster {
                key,
                net: Net::Delete { before },
                last: ChangeOp::Delete,
            },
        );
        return Ok(());
    };
    if cluster.last == ChangeOp::Delete {
        return Err(invalid(table, &key, ChangeOp::Delete, ChangeOp::Delete));
    }
    cluster.net = match std::mem::replace(&mut cluster.net, Net::Nothing) {
        // insert + delete: nothing.
        Net::Insert { .. } => Net::Nothing,
        // update + delete: a delete of the row as it was before the run.
        Net::Update { before, .. } | Net::Replace { before, .. } => Net::Delete { before },
        Net::Nothing | Net::Delete { .. } => {
            return Err(invalid(table, &key, ChangeOp::Delete, ChangeOp::Delete))
        }
    };
    cluster.last = ChangeOp::Delete;
    Ok(())
}

/// An update that moves a row from `old_key` to `new_key`: a delete of the old key and
/// an insert of the whole new row under the new key.
#[allow(clippy::too_many_arguments)]
fn change_key(
    clusters: &mut BTreeMap<Vec<u8>, Cluster>,
    table: &QualName,
    width: usize,
    old_encoded: Vec<u8>,
    old_key: Row,
    new_key: Row,
    before: Option<Row>,
    set: BTreeMap<usize, Value>,
) -> Result<(), Refusal> {
    let existing = clusters.get(&old_encoded);
    if let Some(c) = existing {
        if c.last == ChangeOp::Delete {
            return Err(invalid(table, &old_key, ChangeOp::Delete, ChangeOp::Update));
        }
    }
    let current = match existing {
        Some(c) => c.current_row(width),
        None => before.clone(),
    };
    let after = match current {
        Some(mut row) => {
            apply_set(&mut row, &set);
            Some(row)
        }
        None => after_of(None, &set, width),
    };
    let Some(after) = after else {
        return Err(Refusal {
            table: table.clone(),
            key: old_key,
            reason: Reason::KeyChangeWithoutRow { new_key },
        });
    };
    let new_encoded = encode_key(&new_key);
    if let Some(c) = clusters.get(&new_encoded) {
        if c.last != ChangeOp::Delete {
            return Err(Refusal {
                table: table.clone(),
                key: new_key,
                reason: Reason::KeyChangeOntoLiveKey { old_key },
            });
        }
    }
    delete(clusters, table, old_encoded, old_key, before)?;
    insert(clusters, table, new_encoded, new_key, after)
}

/// What a run compiled to, with its counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compilation {
    pub counts: Counts,
    pub outcome: Outcome,
}

impl Compilation {
    pub fn is_compiled(&self) -> bool {
        matches!(self.outcome, Outcome::Compiled { .. })
    }

    /// The net operations per table, `None` when the run is not compilable.
    pub fn tables(&self) -> Option<&[NetTable]> {
        match &self.outcome {
            Outcome::Compiled { tables } => Some(tables),
            Outcome::NotCompilable(_) => None,
        }
    }

    /// Row writes the apply will make: the net operations when compiled, every row
    /// change when the run goes in log order.
    pub fn rows_to_write(&self) -> u64 {
        match self.outcome {
            Outcome::Compiled { .. } => self.counts.net_operations,
            Outcome::NotCompilable(_) => self.counts.row_changes,
        }
    }
}

/// Sizes of a run before and after compilation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub transactions: u64,
    pub row_changes: u64,
    /// Net row operations out (a replace counts as one); 0 when not compilable.
    pub net_operations: u64,
}

/// Whether the run compiled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Net operations per table, tables by name, operations by encoded key
    /// (`hawser_core::key::encode_key` order). Tables whose changes all cancelled
    /// are left out.
    Compiled { tables: Vec<NetTable> },
    /// The run must be applied in log order.
    NotCompilable(NotCompilable),
}

/// The net operations of one table, sorted by key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetTable {
    pub table: QualName,
    pub operations: Vec<NetOp>,
}

/// One net row operation. Before-images, where present, are the row as it was before
/// the run (what conflict checks and CCD targets need).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum NetOp {
    /// The row did not exist before the run and does after it.
    Insert { key: Row, row: Row },
    /// The row existed before and after the run. `set` holds every column the run
    /// set, with its last value, in column order; `after` is the whole row after the
    /// run when it is known (a before-image was given, or every column was set).
    Update {
        key: Row,
        before: Option<Row>,
        after: Option<Row>,
        set: Vec<Assignment>,
    },
    /// The row existed before the run and does not after it.
    Delete { key: Row, before: Option<Row> },
    /// A delete followed by an insert of the same key, which RTL does not reduce: the
    /// old row goes and `row` takes its place. Apply it as the delete, then the insert.
    Replace {
        key: Row,
        before: Option<Row>,
        row: Row,
    },
}

impl NetOp {
    pub fn key(&self) -> &Row {
        match self {
            NetOp::Insert { key, .. }
            | NetOp::Update { key, .. }
            | NetOp::Delete { key, .. }
            | NetOp::Replace { key, .. } => key,
        }
    }
}

/// Why a run is not compilable, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotCompilable {
    pub table: QualName,
    pub key: Row,
    pub reason: Reason,
    /// Index of the offending transaction in the run, from 0.
    pub transaction: usize,
    /// Index of the offending change in its transaction, from 0.
    pub change: usize,
    /// The offending transaction's id, when the input was commit-log transactions.
    pub gtid: Option<Gtid>,
}

/// The condition that stopped compilation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// `second` followed `first` on the same key: not one of the RTL pair rules
    /// (insert+insert, update+insert, delete+update, delete+delete).
    InvalidPair { first: ChangeOp, second: ChangeOp },
    /// An update moved the row to `new_key` but neither a before-image nor an earlier
    /// change in the run gives the whole row to insert there.
    KeyChangeWithoutRow { new_key: Row },
    /// An update moved the row at `old_key` onto this key, which holds a live row in
    /// the run (the source would have refused it as a duplicate key).
    KeyChangeOntoLiveKey { old_key: Row },
}

/// `(1, 'a')`
pub(crate) fn fmt_key(key: &[Value]) -> String {
    let parts: Vec<String> = key.iter().map(Value::to_sql_literal).collect();
    format!("({})", parts.join(", "))
}

fn op_name(op: ChangeOp) -> &'static str {
    match op {
        ChangeOp::Insert => "insert",
        ChangeOp::Update => "update",
        ChangeOp::Delete => "delete",
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::InvalidPair { first, second } => write!(
                f,
                "{} followed by {} is not a valid pair",
                op_name(*first),
                op_name(*second)
            ),
            Reason::KeyChangeWithoutRow { new_key } => write!(
                f,
                "update moves the row to key {} but the whole row is not known",
                fmt_key(new_key)
            ),
            Reason::KeyChangeOntoLiveKey { old_key } => write!(
                f,
                "update moves the row at key {} onto a key that holds a row",
                fmt_key(old_key)
            ),
        }
    }
}

impl fmt::Display for NotCompilable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "table {}, key {}: {} (transaction {}",
            self.table,
            fmt_key(&self.key),
            self.reason,
            self.transaction
        )?;
        if let Some(gtid) = self.gtid {
            write!(f, " [{gtid}]")?;
        }
        write!(f, ", change {})", self.change)
    }
}
