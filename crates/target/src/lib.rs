//! DB2 SQL Replication target tables: what a subscriber makes of the rows it receives.
//!
//! A scheme's `AS target [INTO table]` (docs/scheme.md) says how a subscriber holds a
//! replicated table. This crate is the pure part: the target table's shape for a source
//! table ([`shape`]), whether an existing table has it ([`check_shape`]), and how one
//! received transaction becomes changes of the target table ([`TargetPlan::rewrite`]).
//! The receiver does the I/O: it creates or checks the table at Hello and hands the
//! rewritten transactions to the store's apply, whose DB2 exception rules (an insert of
//! a present key updates it, an update of a missing row inserts it, a delete of a
//! missing row is ignored) make a resent transaction change nothing.
//!
//! | type | columns | key | a source change becomes |
//! |---|---|---|---|
//! | USER COPY, REPLICA | the source's | the source's | itself (in `INTO`'s table) |
//! | POINT IN TIME | the source's, `IBMSNAP_LOGMARKER` | the source's | itself, stamped with the source commit time |
//! | CCD CONDENSED | [`CCD_COLUMNS`], the source's | the source's | an upsert of the key's latest change; a delete kept as operation `D` |
//! | CCD NONCONDENSED | [`CCD_COLUMNS`], the source's | `IBMSNAP_COMMITSEQ, IBMSNAP_INTENTSEQ` | a new row per change |
//! | BASE AGGREGATE | markers, groups, aggregates ([`aggregate`]) | the groups | itself, into the copy; the store recomputes its groups |
//! | CHANGE AGGREGATE | markers, `IBMSNAP_COMMITSEQ`, groups, aggregates | `IBMSNAP_COMMITSEQ`, the groups | a row per group of the transaction |
//!
//! `IBMSNAP_COMMITSEQ` ([`commit_seq`]) is the transaction's failover era and its seq at
//! its origin; `IBMSNAP_INTENTSEQ` ([`intent_seq`]) its seq and the change's place in it.
//! Both come from the transaction as committed, so a resend writes the same values.

use std::collections::BTreeMap;
use std::fmt;

use hawser_core::{
    ChangeOp, ColumnDef, DataType, Epoch, Ident, QualName, Row, RowChange, TableDef, Transaction,
    Value,
};
use hawser_scheme::ast::TargetKind;
use hawser_scheme::route::ResolvedTarget;

pub mod aggregate;
pub use aggregate::Aggregation;

/// The control columns a CCD table starts with, in order (the seed's Figure 69).
pub const CCD_COLUMNS: [&str; 4] = [
    "IBMSNAP_INTENTSEQ",
    "IBMSNAP_OPERATION",
    "IBMSNAP_COMMITSEQ",
    "IBMSNAP_LOGMARKER",
];

/// The column a POINT IN TIME table ends with: the source commit time.
pub const LOGMARKER: &str = "IBMSNAP_LOGMARKER";

/// Bytes of `IBMSNAP_COMMITSEQ` and `IBMSNAP_INTENTSEQ` (DB2's `CHAR(10) FOR BIT DATA`).
pub const SEQ_BYTES: u32 = 10;

/// Why a target cannot be kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetError {
    /// The target cannot be made of this source table: why.
    Unfit { table: QualName, reason: String },
    /// The source table has a column whose name a control column of the target takes.
    NameTaken { table: QualName, column: String },
    /// An existing table named by the target has another shape; what differs.
    Shape {
        table: QualName,
        differences: Vec<String>,
    },
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetError::Unfit { table, reason } => write!(f, "table {table}: {reason}"),
            TargetError::NameTaken { table, column } => write!(
                f,
                "table {table} has a column {column}, a control column of its target table; \
                 rename it or choose another target type"
            ),
            TargetError::Shape { table, differences } => write!(
                f,
                "table {table} exists with another shape than its target type needs: {}; \
                 drop or rename it and the subscriber creates it",
                differences.join("; ")
            ),
        }
    }
}

impl std::error::Error for TargetError {}

/// The name a target type goes by in messages and status.
pub fn kind_name(kind: &TargetKind) -> &'static str {
    match kind {
        TargetKind::UserCopy => "USER COPY",
        TargetKind::PointInTime => "POINT IN TIME",
        TargetKind::Replica => "REPLICA",
        TargetKind::Ccd {
            condensed: Some(false),
            ..
        } => "CCD NONCONDENSED",
        TargetKind::Ccd { .. } => "CCD CONDENSED",
        TargetKind::BaseAggregate { .. } => "BASE AGGREGATE",
        TargetKind::ChangeAggregate { .. } => "CHANGE AGGREGATE",
    }
}

/// Whether a subscriber keeps the source rows of `table` as they are beside `target`
/// (a BASE AGGREGATE, which is computed from them).
pub fn keeps_copy(table: &QualName, target: &ResolvedTarget) -> bool {
    written_tables(table, target).len() > 1
}

/// The tables a subscriber writes for source table `table` with `target`: the target
/// table, and for a BASE AGGREGATE the copy of the source it aggregates too.
pub fn written_tables(table: &QualName, target: &ResolvedTarget) -> Vec<QualName> {
    match target.kind {
        TargetKind::BaseAggregate { .. } if &target.into != table => {
            vec![table.clone(), target.into.clone()]
        }
        _ => vec![target.into.clone()],
    }
}

/// Whether `target` of `table` is what a subscriber does without a target: the rows
/// as they are, in the table of the same name.
pub fn is_plain(table: &QualName, target: &ResolvedTarget) -> bool {
    matches!(target.kind, TargetKind::UserCopy | TargetKind::Replica) && &target.into == table
}

fn column(name: &str, data_type: DataType, nullable: bool) -> ColumnDef {
    ColumnDef {
        name: Ident::unquoted(name),
        data_type,
        nullable,
        default: None,
    }
}

/// The target table `target` of `source` needs: its name, columns and key.
pub fn shape(source: &TableDef, target: &ResolvedTarget) -> Result<TableDef, TargetError> {
    let named = |columns: &[&str]| -> Result<(), TargetError> {
        for c in &source.columns {
            if columns.iter().any(|n| Ident::unquoted(n) == c.name) {
                return Err(TargetError::NameTaken {
                    table: source.name.clone(),
                    column: c.name.to_string(),
                });
            }
        }
        Ok(())
    };
    let mut def = TableDef {
        name: target.into.clone(),
        columns: source.columns.clone(),
        primary_key: source.primary_key.clone(),
        explicit_key: true,
    };
    match &target.kind {
        TargetKind::UserCopy | TargetKind::Replica => {
            def.explicit_key = source.explicit_key;
        }
        TargetKind::PointInTime => {
            named(&[LOGMARKER])?;
            def.columns
                .push(column(LOGMARKER, DataType::Timestamp, false));
        }
        TargetKind::Ccd { condensed, .. } => {
            named(&CCD_COLUMNS)?;
            let control = [
                column(CCD_COLUMNS[0], DataType::Binary(SEQ_BYTES), false),
                column(CCD_COLUMNS[1], DataType::Char(1), false),
                column(CCD_COLUMNS[2], DataType::Binary(SEQ_BYTES), false),
                column(CCD_COLUMNS[3], DataType::Timestamp, false),
            ];
            // A delete's row may hold only its key: every other column takes NULL.
            let user = source.columns.iter().enumerate().map(|(i, c)| ColumnDef {
                nullable: c.nullable || !source.is_key_column(i),
                default: None,
                ..c.clone()
            });
            def.columns = control.into_iter().chain(user).collect();
            def.primary_key = if condensed.unwrap_or(true) {
                source
                    .primary_key
                    .iter()
                    .map(|&i| i + CCD_COLUMNS.len())
                    .collect()
            } else {
                vec![2, 0]
            };
        }
        TargetKind::BaseAggregate { .. } | TargetKind::ChangeAggregate { .. } => {
            let agg = Aggregation::new(source, target)?;
            return Ok(agg.map(|a| a.def).unwrap_or(def));
        }
    }
    Ok(def)
}

/// Whether `existing` is the table `expected` (from [`shape`]) describes: the same
/// columns (names, types, nullability) in the same order and the same key. Defaults
/// do not matter (the receiver writes whole rows).
pub fn check_shape(existing: &TableDef, expected: &TableDef) -> Result<(), TargetError> {
    let show = |c: &ColumnDef| {
        format!(
            "{} {}{}",
            c.name,
            c.data_type,
            if c.nullable { "" } else { " NOT NULL" }
        )
    };
    let mut differences = Vec::new();
    let n = existing.columns.len().max(expected.columns.len());
    for i in 0..n {
        match (existing.columns.get(i), expected.columns.get(i)) {
            (Some(e), Some(x))
                if e.name == x.name && e.data_type == x.data_type && e.nullable == x.nullable => {}
            (Some(e), Some(x)) => differences.push(format!(
                "column {} is {} but must be {}",
                i + 1,
                show(e),
                show(x)
            )),
            (None, Some(x)) => {
                differences.push(format!("column {} ({}) is missing", i + 1, show(x)))
            }
            (Some(e), None) => differences.push(format!("column {} ({}) is extra", i + 1, show(e))),
            (None, None) => {}
        }
    }
    if differences.is_empty() && existing.primary_key != expected.primary_key {
        let names = |d: &TableDef| {
            d.primary_key
                .iter()
                .map(|&i| d.columns[i].name.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        differences.push(format!(
            "the primary key is ({}) but must be ({})",
            names(existing),
            names(expected)
        ));
    }
    if differences.is_empty() {
        Ok(())
    } else {
        Err(TargetError::Shape {
            table: existing.name.clone(),
            differences,
        })
    }
}

/// `IBMSNAP_COMMITSEQ` of a transaction committed at seq `seq` of its origin in failover
/// era `epoch`: the era (4 bytes) then the seq (6 bytes), big-endian, so that byte order
/// is commit order across failovers of the element. Eras past 2^32 and seqs past 2^48
/// saturate.
pub fn commit_seq(epoch: Epoch, seq: u64) -> Vec<u8> {
    let era = u32::try_from(epoch.0).unwrap_or(u32::MAX);
    let mut out = era.to_be_bytes().to_vec();
    out.extend_from_slice(&seq.min((1 << 48) - 1).to_be_bytes()[2..]);
    out
}

/// `IBMSNAP_INTENTSEQ` of the `index`th change of the transaction at `seq`: the seq
/// (6 bytes) then the index (4 bytes), big-endian — unique per change of an origin and
/// in the order the changes were made.
pub fn intent_seq(seq: u64, index: usize) -> Vec<u8> {
    let mut out = seq.min((1 << 48) - 1).to_be_bytes()[2..].to_vec();
    out.extend_from_slice(&u32::try_from(index).unwrap_or(u32::MAX).to_be_bytes());
    out
}

/// What a duplicate (the initial copy) does with a source table's rows for `target`.
#[derive(Debug, Clone, PartialEq)]
pub enum Initial {
    /// The rows as they are, under the source's name: a plain copy, or the copy a BASE
    /// AGGREGATE is computed from.
    Copy,
    /// Nothing: CCD NONCOMPLETE and CHANGE AGGREGATE hold changes only.
    Skip,
    /// The rows, as [`initial_rows`] makes them, into the target table `def`:
    /// replacing what is there (`replace`, the copy merged by key), or added where
    /// their key is absent (a CCD COMPLETE's history is kept).
    Into { def: TableDef, replace: bool },
}

/// What a duplicate does with `source`'s rows for `target` (docs/targets.md).
pub fn initial(source: &TableDef, target: &ResolvedTarget) -> Result<Initial, TargetError> {
    if is_plain(&source.name, target) {
        return Ok(Initial::Copy);
    }
    Ok(match &target.kind {
        TargetKind::BaseAggregate { .. } => Initial::Copy,
        TargetKind::ChangeAggregate { .. }
        | TargetKind::Ccd {
            complete: Some(false),
            ..
        } => Initial::Skip,
        TargetKind::Ccd { .. } => Initial::Into {
            def: shape(source, target)?,
            replace: false,
        },
        TargetKind::UserCopy | TargetKind::Replica | TargetKind::PointInTime => Initial::Into {
            def: shape(source, target)?,
            replace: true,
        },
    })
}

/// Source rows copied by a duplicate as `target`'s table holds them: as they are
/// (USER COPY, REPLICA), stamped with the copy's time `copy_micros` (POINT IN TIME), or
/// as CCD rows of operation `I` — each an insert at the copy point: `IBMSNAP_COMMITSEQ`
/// `commit_seq` (the source's position at the copy, [`commit_seq`]), `IBMSNAP_INTENTSEQ`
/// seq 0 and the row's place in the copy from `first` on (no transaction has seq 0, so
/// these never take a change's key), `IBMSNAP_LOGMARKER` the copy's time.
pub fn initial_rows(
    target: &ResolvedTarget,
    rows: Vec<Row>,
    commit_seq: &[u8],
    copy_micros: i64,
    first: usize,
) -> Vec<Row> {
    match &target.kind {
        TargetKind::PointInTime => rows
            .into_iter()
            .map(|mut r| {
                r.push(Value::Timestamp(copy_micros));
                r
            })
            .collect(),
        TargetKind::Ccd { .. } => rows
            .into_iter()
            .enumerate()
            .map(|(i, user)| {
                Stamp {
                    commit_seq: commit_seq.to_vec(),
                    intent_seq: intent_seq(0, first + i),
                    commit_micros: copy_micros,
                }
                .ccd_row('I', user)
            })
            .collect(),
        _ => rows,
    }
}

/// The targets of the tables one stream carries into this store: by source table, its
/// target, the source's definition (as the sender described it) and, for an
/// aggregate target, its aggregation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetPlan {
    tables: BTreeMap<QualName, Planned>,
}

#[derive(Debug, Clone, PartialEq)]
struct Planned {
    target: ResolvedTarget,
    source: TableDef,
    aggregation: Option<Aggregation>,
}

impl TargetPlan {
    /// Adds `source`'s target, unless it is plain ([`is_plain`]).
    pub fn add(&mut self, source: TableDef, target: ResolvedTarget) -> Result<(), TargetError> {
        if is_plain(&source.name, &target) {
            return Ok(());
        }
        shape(&source, &target)?;
        let aggregation = Aggregation::new(&source, &target)?;
        self.tables.insert(
            source.name.clone(),
            Planned {
                target,
                source,
                aggregation,
            },
        );
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Each source table with its target.
    pub fn targets(&self) -> impl Iterator<Item = (&QualName, &ResolvedTarget)> {
        self.tables.iter().map(|(name, p)| (name, &p.target))
    }

    /// The target of source table `table`, if it has one that is not plain.
    pub fn get(&self, table: &QualName) -> Option<&ResolvedTarget> {
        self.tables.get(table).map(|p| &p.target)
    }

    /// `txn`, committed under failover era `epoch`, as this store writes it: each change
    /// of a table with a target becomes that target's changes; the others stay. A
    /// CHANGE AGGREGATE's rows come after the transaction's other changes.
    pub fn rewrite(&self, txn: Transaction, epoch: Epoch) -> Result<Transaction, TargetError> {
        if self.tables.is_empty() {
            return Ok(txn);
        }
        let Transaction {
            gtid,
            commit_micros,
            changes,
        } = txn;
        let mut out = Vec::with_capacity(changes.len());
        // Per CHANGE AGGREGATE (by source table): the values of its changes.
        let mut changed: BTreeMap<&QualName, Vec<Row>> = BTreeMap::new();
        for (index, c) in changes.into_iter().enumerate() {
            let Some(planned) = self.tables.get(&c.table) else {
                out.push(c);
                continue;
            };
            if let Some(agg) = planned.aggregation.as_ref().filter(|a| a.change) {
                let values = match c.after {
                    Some(after) if c.op != ChangeOp::Delete => after,
                    _ => deleted_row(&planned.source, &c),
                };
                changed.entry(&agg.source).or_default().push(values);
                continue;
            }
            let stamp = Stamp {
                commit_seq: commit_seq(epoch, gtid.seq),
                intent_seq: intent_seq(gtid.seq, index),
                commit_micros,
            };
            write_change(&mut out, c, &planned.target, &planned.source, &stamp);
        }
        for (table, values) in changed {
            let Some(agg) = self.tables.get(table).and_then(|p| p.aggregation.as_ref()) else {
                continue;
            };
            let seq = commit_seq(epoch, gtid.seq);
            for row in agg.change_rows(&values, commit_micros, &seq)? {
                out.push(RowChange {
                    table: agg.def.name.clone(),
                    op: ChangeOp::Insert,
                    key: agg.def.key_of(&row),
                    before: None,
                    after: Some(row),
                });
            }
        }
        Ok(Transaction {
            gtid,
            commit_micros,
            changes: out,
        })
    }
}

/// What a change's control columns say of it.
struct Stamp {
    commit_seq: Vec<u8>,
    intent_seq: Vec<u8>,
    commit_micros: i64,
}

impl Stamp {
    fn ccd_row(&self, op: char, user: Row) -> Row {
        let mut row = vec![
            Value::Bytes(self.intent_seq.clone()),
            Value::Text(op.to_string()),
            Value::Bytes(self.commit_seq.clone()),
            Value::Timestamp(self.commit_micros),
        ];
        row.extend(user);
        row
    }
}

/// The row a delete leaves in a CCD: its before-image, or its key with NULL elsewhere.
fn deleted_row(source: &TableDef, c: &RowChange) -> Row {
    if let Some(before) = c
        .before
        .as_ref()
        .filter(|b| b.len() == source.columns.len())
    {
        return before.clone();
    }
    let mut row = vec![Value::Null; source.columns.len()];
    for (k, &i) in source.primary_key.iter().enumerate() {
        if let Some(v) = c.key.get(k) {
            row[i] = v.clone();
        }
    }
    row
}

fn write_change(
    out: &mut Vec<RowChange>,
    c: RowChange,
    target: &ResolvedTarget,
    source: &TableDef,
    stamp: &Stamp,
) {
    let table = target.into.clone();
    match &target.kind {
        TargetKind::UserCopy | TargetKind::Replica => out.push(RowChange { table, ..c }),
        TargetKind::PointInTime => {
            let after = c.after.map(|mut row| {
                row.push(Value::Timestamp(stamp.commit_micros));
                row
            });
            out.push(RowChange {
                table,
                op: c.op,
                key: c.key,
                before: None,
                after,
            });
        }
        TargetKind::Ccd {
            condensed: Some(false),
            ..
        } => {
            let user = match (&c.op, &c.after) {
                (ChangeOp::Delete, _) | (_, None) => deleted_row(source, &c),
                (_, Some(after)) => after.clone(),
            };
            let row = stamp.ccd_row(c.op.code(), user);
            out.push(RowChange {
                table,
                op: ChangeOp::Insert,
                key: vec![row[2].clone(), row[0].clone()],
                before: None,
                after: Some(row),
            });
        }
        TargetKind::Ccd { .. } => {
            // The latest change per key; a delete is handled as an update (kept as
            // operation D). An update that moves the row leaves its old key deleted.
            let upsert = |key: Row, row: Row| RowChange {
                table: table.clone(),
                op: ChangeOp::Update,
                key,
                before: None,
                after: Some(row),
            };
            match (&c.op, &c.after) {
                (ChangeOp::Delete, _) | (_, None) => {
                    out.push(upsert(
                        c.key.clone(),
                        stamp.ccd_row('D', deleted_row(source, &c)),
                    ));
                }
                (op, Some(after)) => {
                    let new_key = source.key_of(after);
                    if *op == ChangeOp::Update && new_key != c.key {
                        let gone = stamp.ccd_row('D', deleted_row(source, &c));
                        out.push(upsert(c.key.clone(), gone));
                    }
                    out.push(upsert(new_key, stamp.ccd_row(op.code(), after.clone())));
                }
            }
        }
        TargetKind::BaseAggregate { .. } | TargetKind::ChangeAggregate { .. } => {
            // A BASE AGGREGATE's source rows go into the copy the store aggregates (a
            // CHANGE AGGREGATE's never come here).
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests;
