//! The one format of a log entry, a row and a table definition in bytes: the store's
//! log, rows and catalog and a stream's batches all write these.
//!
//! ```text
//!  stored log record  = [lsn u64][epoch u64][entry]      (the key holds the LSN too)
//!  batch record       =           [epoch u64][entry]     (stream: [VERSION][count u64][records])
//!  entry              = Txn { gtid, commit_micros, changes } | Ddl { .. } | SequenceBlock { .. }
//! ```
//!
//! bincode 1.3 (fixed-width integers, trailing bytes refused) over mirror types rather
//! than over hawser-core's types directly: `rust_decimal`'s serde support needs a
//! self-describing format, and the bytes must not change when a core type gains a
//! derive or a field. Decimals are (mantissa, scale). A record's bytes after its LSN
//! are the same bytes a batch carries for it.
//!
//! Writing goes through borrowed views ([`EntryRef`], [`RowRef`]) that serialize the
//! log's types in place — what serde's derive writes for the owned mirror types
//! ([`Entry`], `Vec<V>`), byte for byte (a property test compares them) — so a commit
//! or a batch does not copy every row value first. Reading builds the owned mirrors
//! and converts them, checking what bincode cannot (a decimal's scale, a key column's
//! index).

use bincode::Options;
use hawser_core::{
    ChangeOp, ColumnDef, DataType, Gtid, Ident, QualName, RowChange, TableDef, Transaction, Value,
};
use rust_decimal::Decimal;
use serde::ser::{SerializeTupleVariant, Serializer};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::log::{DdlOp, LogEntry};
use crate::sequence::SequenceDef;

/// The version of this format, which a stream's batches and table definitions carry
/// as their first byte. 2: a table's key columns are u64 in batches too, as stored.
pub const VERSION: u8 = 2;

/// bincode as this format uses it.
pub fn options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .reject_trailing_bytes()
}

/// Bytes that decode as the mirror types but not as values.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("decimal with mantissa {mantissa} and scale {scale} is out of range")]
    BadDecimal { mantissa: i128, scale: u32 },
    #[error("table {table}: key column {column} of {columns}")]
    BadKey {
        table: QualName,
        column: usize,
        columns: usize,
    },
}

/// A value.
#[derive(Serialize, Deserialize)]
pub(crate) enum V {
    Null,
    Bool(bool),
    Int(i64),
    Decimal(i128, u32),
    Double(f64),
    Text(String),
    Bytes(Vec<u8>),
    Date(i32),
    Timestamp(i64),
}

impl V {
    fn of(v: &Value) -> Self {
        match v {
            Value::Null => V::Null,
            Value::Bool(b) => V::Bool(*b),
            Value::Int(i) => V::Int(*i),
            Value::Decimal(d) => V::Decimal(d.mantissa(), d.scale()),
            Value::Double(d) => V::Double(*d),
            Value::Text(s) => V::Text(s.clone()),
            Value::Bytes(b) => V::Bytes(b.clone()),
            Value::Date(d) => V::Date(*d),
            Value::Timestamp(t) => V::Timestamp(*t),
        }
    }

    fn into_value(self) -> Result<Value, FormatError> {
        Ok(match self {
            V::Null => Value::Null,
            V::Bool(b) => Value::Bool(b),
            V::Int(i) => Value::Int(i),
            V::Decimal(mantissa, scale) => Value::Decimal(
                Decimal::try_from_i128_with_scale(mantissa, scale)
                    .map_err(|_| FormatError::BadDecimal { mantissa, scale })?,
            ),
            V::Double(d) => Value::Double(d),
            V::Text(s) => Value::Text(s),
            V::Bytes(b) => Value::Bytes(b),
            V::Date(d) => Value::Date(d),
            V::Timestamp(t) => Value::Timestamp(t),
        })
    }
}

/// A row as read: its values' mirrors.
pub(crate) fn row_from(row: Vec<V>) -> Result<Vec<Value>, FormatError> {
    row.into_iter().map(V::into_value).collect()
}

/// A column definition.
#[derive(Serialize, Deserialize)]
pub(crate) struct Column {
    name: Ident,
    data_type: DataType,
    nullable: bool,
    default: Option<V>,
}

impl Column {
    fn of(c: &ColumnDef) -> Self {
        Self {
            name: c.name.clone(),
            data_type: c.data_type,
            nullable: c.nullable,
            default: c.default.as_ref().map(V::of),
        }
    }

    fn into_def(self) -> Result<ColumnDef, FormatError> {
        Ok(ColumnDef {
            name: self.name,
            data_type: self.data_type,
            nullable: self.nullable,
            default: self.default.map(V::into_value).transpose()?,
        })
    }
}

/// A table definition.
#[derive(Serialize, Deserialize)]
pub struct Table {
    name: QualName,
    columns: Vec<Column>,
    primary_key: Vec<usize>,
    explicit_key: bool,
}

impl Table {
    pub fn of(t: &TableDef) -> Self {
        Self {
            name: t.name.clone(),
            columns: t.columns.iter().map(Column::of).collect(),
            primary_key: t.primary_key.clone(),
            explicit_key: t.explicit_key,
        }
    }

    /// The definition, its key columns checked against its columns.
    pub fn into_def(self) -> Result<TableDef, FormatError> {
        let columns = self
            .columns
            .into_iter()
            .map(Column::into_def)
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(&column) = self.primary_key.iter().find(|&&i| i >= columns.len()) {
            return Err(FormatError::BadKey {
                table: self.name,
                column,
                columns: columns.len(),
            });
        }
        Ok(TableDef {
            name: self.name,
            columns,
            primary_key: self.primary_key,
            explicit_key: self.explicit_key,
        })
    }
}

/// A sequence definition.
#[derive(Serialize, Deserialize)]
pub(crate) struct Sequence {
    name: QualName,
    increment: i64,
    min_value: i64,
    max_value: i64,
    start: i64,
    cycle: bool,
}

impl Sequence {
    pub(crate) fn of(d: &SequenceDef) -> Self {
        Self {
            name: d.name.clone(),
            increment: d.increment,
            min_value: d.min_value,
            max_value: d.max_value,
            start: d.start,
            cycle: d.cycle,
        }
    }

    /// The definition as it was written; [`SequenceDef::validate`] is the reader's.
    pub(crate) fn into_def(self) -> SequenceDef {
        SequenceDef {
            name: self.name,
            increment: self.increment,
            min_value: self.min_value,
            max_value: self.max_value,
            start: self.start,
            cycle: self.cycle,
        }
    }
}

/// A row change.
#[derive(Serialize, Deserialize)]
pub(crate) struct Change {
    table: QualName,
    op: ChangeOp,
    key: Vec<V>,
    before: Option<Vec<V>>,
    after: Option<Vec<V>>,
}

/// A DDL operation.
#[derive(Serialize, Deserialize)]
pub(crate) enum Ddl {
    CreateTable(Table),
    DropTable(QualName),
    AddColumn { table: QualName, column: Column },
    CreateSequence(Sequence),
    DropSequence(QualName),
}

impl Ddl {
    fn of(op: &DdlOp) -> Self {
        match op {
            DdlOp::CreateTable(t) => Ddl::CreateTable(Table::of(t)),
            DdlOp::DropTable(n) => Ddl::DropTable(n.clone()),
            DdlOp::AddColumn { table, column } => Ddl::AddColumn {
                table: table.clone(),
                column: Column::of(column),
            },
            DdlOp::CreateSequence(s) => Ddl::CreateSequence(Sequence::of(s)),
            DdlOp::DropSequence(n) => Ddl::DropSequence(n.clone()),
        }
    }

    fn into_op(self) -> Result<DdlOp, FormatError> {
        Ok(match self {
            Ddl::CreateTable(t) => DdlOp::CreateTable(t.into_def()?),
            Ddl::DropTable(n) => DdlOp::DropTable(n),
            Ddl::AddColumn { table, column } => DdlOp::AddColumn {
                table,
                column: column.into_def()?,
            },
            Ddl::CreateSequence(s) => DdlOp::CreateSequence(s.into_def()),
            Ddl::DropSequence(n) => DdlOp::DropSequence(n),
        })
    }
}

/// A log entry as read.
#[derive(Serialize, Deserialize)]
#[serde(transparent)]
pub struct Entry(Mirror);

/// [`Entry`]'s layout.
#[derive(Serialize, Deserialize)]
enum Mirror {
    Txn {
        gtid: Gtid,
        commit_micros: i64,
        changes: Vec<Change>,
    },
    Ddl {
        gtid: Gtid,
        commit_micros: i64,
        op: Ddl,
    },
    SequenceBlock {
        gtid: Gtid,
        commit_micros: i64,
        name: QualName,
        restart_at: Option<i64>,
    },
}

impl Entry {
    /// The owned mirror of `e`: what [`EntryRef`] writes without building it. Kept as
    /// the reference the borrowed encoding is tested against.
    #[cfg(test)]
    pub(crate) fn of(e: &LogEntry) -> Self {
        Entry(match e {
            LogEntry::Txn(t) => Mirror::Txn {
                gtid: t.gtid,
                commit_micros: t.commit_micros,
                changes: t
                    .changes
                    .iter()
                    .map(|c| Change {
                        table: c.table.clone(),
                        op: c.op,
                        key: c.key.iter().map(V::of).collect(),
                        before: c.before.as_ref().map(|r| r.iter().map(V::of).collect()),
                        after: c.after.as_ref().map(|r| r.iter().map(V::of).collect()),
                    })
                    .collect(),
            },
            LogEntry::Ddl {
                gtid,
                commit_micros,
                op,
            } => Mirror::Ddl {
                gtid: *gtid,
                commit_micros: *commit_micros,
                op: Ddl::of(op),
            },
            LogEntry::SequenceBlock {
                gtid,
                commit_micros,
                name,
                restart_at,
            } => Mirror::SequenceBlock {
                gtid: *gtid,
                commit_micros: *commit_micros,
                name: name.clone(),
                restart_at: *restart_at,
            },
        })
    }

    /// The log entry.
    pub fn into_log_entry(self) -> Result<LogEntry, FormatError> {
        Ok(match self.0 {
            Mirror::Txn {
                gtid,
                commit_micros,
                changes,
            } => LogEntry::Txn(Transaction {
                gtid,
                commit_micros,
                changes: changes
                    .into_iter()
                    .map(|c| {
                        Ok(RowChange {
                            table: c.table,
                            op: c.op,
                            key: row_from(c.key)?,
                            before: c.before.map(row_from).transpose()?,
                            after: c.after.map(row_from).transpose()?,
                        })
                    })
                    .collect::<Result<_, FormatError>>()?,
            }),
            Mirror::Ddl {
                gtid,
                commit_micros,
                op,
            } => LogEntry::Ddl {
                gtid,
                commit_micros,
                op: op.into_op()?,
            },
            Mirror::SequenceBlock {
                gtid,
                commit_micros,
                name,
                restart_at,
            } => LogEntry::SequenceBlock {
                gtid,
                commit_micros,
                name,
                restart_at,
            },
        })
    }
}

// ---- borrowed views -------------------------------------------------------------
//
// Each writes exactly what serde's derive writes for the mirror type it stands for
// (same variant indices, same field order).

/// Serializes a [`Value`] as [`V`].
struct ValueRef<'a>(&'a Value);

impl Serialize for ValueRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Null => s.serialize_unit_variant("V", 0, "Null"),
            Value::Bool(b) => s.serialize_newtype_variant("V", 1, "Bool", b),
            Value::Int(i) => s.serialize_newtype_variant("V", 2, "Int", i),
            Value::Decimal(d) => {
                let mut t = s.serialize_tuple_variant("V", 3, "Decimal", 2)?;
                t.serialize_field(&d.mantissa())?;
                t.serialize_field(&d.scale())?;
                t.end()
            }
            Value::Double(d) => s.serialize_newtype_variant("V", 4, "Double", d),
            Value::Text(t) => s.serialize_newtype_variant("V", 5, "Text", t),
            Value::Bytes(b) => s.serialize_newtype_variant("V", 6, "Bytes", b),
            Value::Date(d) => s.serialize_newtype_variant("V", 7, "Date", d),
            Value::Timestamp(t) => s.serialize_newtype_variant("V", 8, "Timestamp", t),
        }
    }
}

/// Serializes a row as `Vec<V>`.
pub struct RowRef<'a>(pub &'a [Value]);

impl Serialize for RowRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(ValueRef))
    }
}

/// Serializes a [`RowChange`] as [`Change`].
#[derive(Serialize)]
struct ChangeRef<'a> {
    table: &'a QualName,
    op: ChangeOp,
    key: RowRef<'a>,
    before: Option<RowRef<'a>>,
    after: Option<RowRef<'a>>,
}

/// Serializes a transaction's changes as `Vec<Change>`.
struct ChangesRef<'a>(&'a [RowChange]);

impl Serialize for ChangesRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|c| ChangeRef {
            table: &c.table,
            op: c.op,
            key: RowRef(&c.key),
            before: c.before.as_deref().map(RowRef),
            after: c.after.as_deref().map(RowRef),
        }))
    }
}

/// Serializes a [`LogEntry`] as [`Entry`].
#[derive(Serialize)]
#[serde(transparent)]
pub struct EntryRef<'a>(MirrorRef<'a>);

/// [`Mirror`]'s variants in its order. DDL is rare and small, so it goes through the
/// owned [`Ddl`].
#[derive(Serialize)]
enum MirrorRef<'a> {
    Txn {
        gtid: Gtid,
        commit_micros: i64,
        changes: ChangesRef<'a>,
    },
    Ddl {
        gtid: Gtid,
        commit_micros: i64,
        op: Ddl,
    },
    SequenceBlock {
        gtid: Gtid,
        commit_micros: i64,
        name: &'a QualName,
        restart_at: Option<i64>,
    },
}

impl<'a> EntryRef<'a> {
    pub fn new(e: &'a LogEntry) -> Self {
        EntryRef(match e {
            LogEntry::Txn(t) => MirrorRef::Txn {
                gtid: t.gtid,
                commit_micros: t.commit_micros,
                changes: ChangesRef(&t.changes),
            },
            LogEntry::Ddl {
                gtid,
                commit_micros,
                op,
            } => MirrorRef::Ddl {
                gtid: *gtid,
                commit_micros: *commit_micros,
                op: Ddl::of(op),
            },
            LogEntry::SequenceBlock {
                gtid,
                commit_micros,
                name,
                restart_at,
            } => MirrorRef::SequenceBlock {
                gtid: *gtid,
                commit_micros: *commit_micros,
                name,
                restart_at: *restart_at,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_core::strategies::row;
    use hawser_core::NodeId;
    use proptest::prelude::*;

    fn entry() -> impl Strategy<Value = LogEntry> {
        let change = (
            "[a-z]{1,4}",
            prop_oneof![
                Just(ChangeOp::Insert),
                Just(ChangeOp::Update),
                Just(ChangeOp::Delete)
            ],
            row(),
            proptest::option::of(row()),
            proptest::option::of(row()),
        )
            .prop_map(|(t, op, key, before, after)| RowChange {
                table: QualName::bare(&t),
                op,
                key,
                before,
                after,
            });
        prop_oneof![
            (
                any::<u64>(),
                any::<u64>(),
                any::<i64>(),
                proptest::collection::vec(change, 0..5)
            )
                .prop_map(|(o, s, m, changes)| LogEntry::Txn(Transaction {
                    gtid: Gtid::new(NodeId(o), s),
                    commit_micros: m,
                    changes,
                })),
            (any::<u64>(), "[a-z]{1,4}").prop_map(|(s, n)| LogEntry::Ddl {
                gtid: Gtid::new(NodeId(1), s),
                commit_micros: 0,
                op: DdlOp::DropTable(QualName::bare(&n)),
            }),
            (any::<u64>(), proptest::option::of(any::<i64>())).prop_map(|(s, r)| {
                LogEntry::SequenceBlock {
                    gtid: Gtid::new(NodeId(2), s),
                    commit_micros: 1,
                    name: QualName::bare("q"),
                    restart_at: r,
                }
            }),
        ]
    }

    proptest! {
        #[test]
        fn the_borrowed_views_write_the_mirror_types_bytes_and_read_back(e in entry()) {
            let borrowed = options().serialize(&EntryRef::new(&e)).unwrap();
            let owned = options().serialize(&Entry::of(&e)).unwrap();
            prop_assert_eq!(&borrowed, &owned);
            let back: Entry = options().deserialize(&borrowed).unwrap();
            prop_assert_eq!(back.into_log_entry().unwrap(), e.clone());
            if let LogEntry::Txn(t) = &e {
                for c in &t.changes {
                    let borrowed = options().serialize(&RowRef(&c.key)).unwrap();
                    let owned: Vec<V> = c.key.iter().map(V::of).collect();
                    prop_assert_eq!(borrowed, options().serialize(&owned).unwrap());
                }
            }
        }
    }

    #[test]
    fn what_bincode_cannot_check_is_refused_by_name() {
        let bad = V::Decimal(1, 99).into_value().unwrap_err();
        assert_eq!(
            bad,
            FormatError::BadDecimal {
                mantissa: 1,
                scale: 99
            }
        );
        let t = Table {
            name: QualName::bare("t"),
            columns: Vec::new(),
            primary_key: vec![0],
            explicit_key: true,
        };
        assert_eq!(
            t.into_def().unwrap_err().to_string(),
            "table t: key column 0 of 0"
        );
    }
}
