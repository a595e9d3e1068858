//! BASE and CHANGE AGGREGATE targets: the aggregate table's shape and the pure
//! arithmetic of its rows (docs/targets.md).
//!
//! - A BASE AGGREGATE holds, per group of the source table's current rows, the
//!   aggregates over them. The subscriber keeps the source rows (a copy under the
//!   source's name); the store folds them once ([`Aggregation::fold`]) and then adds
//!   and removes each applied change's images ([`Aggregation::add`],
//!   [`Aggregation::remove`]), writing the touched groups' rows
//!   ([`Aggregation::base_row`]) in the same atomic write as the transaction.
//! - A CHANGE AGGREGATE holds, per received transaction (hawser's apply cycle) and
//!   group, the aggregates over that transaction's changes: an insert's or update's
//!   after-image, a delete's before-image. It is written by the receiver's rewrite
//!   ([`Aggregation::change_rows`]) and needs no copy.

use std::collections::BTreeMap;

use hawser_core::{ColumnDef, DataType, Ident, QualName, Row, TableDef, Value};
use hawser_scheme::ast::{AggFunc, TargetKind};
use hawser_scheme::route::ResolvedTarget;
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

use crate::{column, kind_name, TargetError, SEQ_BYTES};

/// The oldest commit time an aggregate row reflects.
pub const LLOGMARKER: &str = "IBMSNAP_LLOGMARKER";
/// The newest commit time an aggregate row reflects.
pub const HLOGMARKER: &str = "IBMSNAP_HLOGMARKER";
/// A CHANGE AGGREGATE row's transaction (as in a CCD: failover era and origin seq).
pub const COMMITSEQ: &str = "IBMSNAP_COMMITSEQ";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Count,
    Sum,
    Min,
    Max,
    Avg,
}

/// One aggregate column: its function and the source column it reads.
#[derive(Debug, Clone, PartialEq)]
struct Func {
    kind: Kind,
    column: Option<usize>,
    source_type: Option<DataType>,
}

impl Func {
    /// The non-NULL value this aggregate reads of `row`, if any.
    fn value<'r>(&self, row: &'r [Value]) -> Option<&'r Value> {
        self.column
            .and_then(|i| row.get(i))
            .filter(|v| !v.is_null())
    }
}

/// An aggregate target resolved against its source table's definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregation {
    /// The source table.
    pub source: QualName,
    /// CHANGE AGGREGATE (else BASE).
    pub change: bool,
    groups: Vec<usize>,
    funcs: Vec<Func>,
    /// The aggregate table.
    pub def: TableDef,
}

/// One group's running aggregates: enough to add a source row and, mostly, to take
/// one away again ([`Aggregation::remove`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Acc {
    rows: i64,
    slots: Vec<Slot>,
}

impl Acc {
    /// Source rows in the group.
    pub fn rows(&self) -> i64 {
        self.rows
    }
}

/// A running sum, exact for integers and decimals.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i128),
    Decimal(Decimal),
    Double(f64),
}

impl Num {
    fn add(&mut self, v: &Value, sign: i8) {
        match (self, v) {
            (Num::Int(s), Value::Int(i)) => *s += i128::from(*i) * i128::from(sign),
            (Num::Decimal(s), Value::Decimal(d)) => {
                *s = if sign > 0 {
                    s.saturating_add(*d)
                } else {
                    s.saturating_sub(*d)
                }
            }
            (Num::Double(s), v) => *s += as_f64(v).unwrap_or(0.0) * f64::from(sign),
            _ => {}
        }
    }

    fn as_f64(&self) -> f64 {
        match self {
            Num::Int(i) => *i as f64,
            Num::Decimal(d) => d.to_f64().unwrap_or(f64::NAN),
            Num::Double(d) => *d,
        }
    }
}

/// One aggregate column's running state; `n` counts the non-NULL values seen.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    Count,
    Sum { sum: Num, n: i64 },
    Extreme { value: Option<Value>, n: i64 },
    Avg { sum: Num, n: i64 },
}

fn unfit(table: &QualName, reason: String) -> TargetError {
    TargetError::Unfit {
        table: table.clone(),
        reason,
    }
}

fn numeric(t: &DataType) -> bool {
    matches!(
        t,
        DataType::TinyInt
            | DataType::SmallInt
            | DataType::Integer
            | DataType::BigInt
            | DataType::Decimal { .. }
            | DataType::Double
    )
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Decimal(d) => d.to_f64(),
        Value::Double(d) => Some(*d),
        _ => None,
    }
}

impl Aggregation {
    /// `target` of `source` as an aggregation; `Ok(None)` when it is no aggregate.
    pub fn new(source: &TableDef, target: &ResolvedTarget) -> Result<Option<Self>, TargetError> {
        let (change, aggregates, group_by) = match &target.kind {
            TargetKind::BaseAggregate {
                aggregates,
                group_by,
            } => (false, aggregates, group_by),
            TargetKind::ChangeAggregate {
                aggregates,
                group_by,
            } => (true, aggregates, group_by),
            _ => return Ok(None),
        };
        let table = &source.name;
        if !change && target.into == source.name {
            return Err(unfit(
                table,
                format!(
                    "a BASE AGGREGATE keeps the source rows in table {table} to aggregate \
                     them: INTO must name another table"
                ),
            ));
        }
        let find = |name: &Ident| {
            source.column_index(name).ok_or_else(|| {
                unfit(
                    table,
                    format!(
                        "the {} names column {name}, which it lacks",
                        kind_name(&target.kind)
                    ),
                )
            })
        };
        let control: Vec<ColumnDef> = if change {
            vec![
                column(LLOGMARKER, DataType::Timestamp, false),
                column(HLOGMARKER, DataType::Timestamp, false),
                column(COMMITSEQ, DataType::Binary(SEQ_BYTES), false),
            ]
        } else {
            vec![
                column(LLOGMARKER, DataType::Timestamp, false),
                column(HLOGMARKER, DataType::Timestamp, false),
            ]
        };
        let mut columns = control.clone();
        let mut groups = Vec::with_capacity(group_by.len());
        for name in group_by {
            let i = find(name)?;
            let c = &source.columns[i];
            if c.nullable {
                return Err(unfit(
                    table,
                    format!(
                        "GROUP BY column {name} is nullable; a grouping column keys the \
                         aggregate table and must be NOT NULL"
                    ),
                ));
            }
            if columns.iter().any(|x| x.name == c.name) {
                return Err(TargetError::NameTaken {
                    table: table.clone(),
                    column: c.name.to_string(),
                });
            }
            groups.push(i);
            columns.push(ColumnDef {
                default: None,
                ..c.clone()
            });
        }
        let mut funcs = Vec::with_capacity(aggregates.len());
        for agg in aggregates {
            let (kind, name) = match &agg.func {
                AggFunc::CountStar => (Kind::Count, "COUNT".to_string()),
                AggFunc::Sum(c) => (Kind::Sum, format!("SUM_{}", c.as_str())),
                AggFunc::Min(c) => (Kind::Min, format!("MIN_{}", c.as_str())),
                AggFunc::Max(c) => (Kind::Max, format!("MAX_{}", c.as_str())),
                AggFunc::Avg(c) => (Kind::Avg, format!("AVG_{}", c.as_str())),
            };
            let name = agg.alias.clone().unwrap_or_else(|| Ident::unquoted(&name));
            let col = agg.func.column().map(find).transpose()?;
            let source_type = col.map(|i| source.columns[i].data_type);
            let data_type = match (kind, &source_type) {
                (Kind::Count, _) => DataType::BigInt,
                (Kind::Sum | Kind::Avg, Some(t)) if !numeric(t) => {
                    return Err(unfit(
                        table,
                        format!("{name} aggregates column {} of type {t}, not a number", {
                            agg.func.column().map(Ident::as_str).unwrap_or_default()
                        }),
                    ))
                }
                (Kind::Sum, Some(DataType::Decimal { scale, .. })) => DataType::Decimal {
                    precision: None,
                    scale: *scale,
                },
                (Kind::Sum, Some(DataType::Double)) | (Kind::Avg, _) => DataType::Double,
                (Kind::Sum, _) => DataType::BigInt,
                (Kind::Min | Kind::Max, Some(t)) => *t,
                (Kind::Min | Kind::Max, None) => DataType::BigInt,
            };
            if columns.iter().any(|c| c.name == name) {
                return Err(unfit(
                    table,
                    format!(
                        "the aggregate table would have column {name} twice; give the \
                         aggregate an alias"
                    ),
                ));
            }
            columns.push(ColumnDef {
                name,
                data_type,
                nullable: kind != Kind::Count,
                default: None,
            });
            funcs.push(Func {
                kind,
                column: col,
                source_type,
            });
        }
        let g = groups.len();
        let primary_key = match (change, g) {
            (true, _) => std::iter::once(2).chain(3..3 + g).collect(),
            (false, 0) => vec![0],
            (false, _) => (2..2 + g).collect(),
        };
        Ok(Some(Aggregation {
            source: source.name.clone(),
            change,
            groups,
            funcs,
            def: TableDef {
                name: target.into.clone(),
                columns,
                primary_key,
                explicit_key: true,
            },
        }))
    }

    /// Control columns before the groups.
    fn control(&self) -> usize {
        if self.change {
            3
        } else {
            2
        }
    }

    /// The group of a source row.
    pub fn group_of(&self, row: &[Value]) -> Row {
        self.groups.iter().map(|&i| row[i].clone()).collect()
    }

    /// The group an aggregate table row holds.
    pub fn group_of_target(&self, row: &[Value]) -> Row {
        let c = self.control();
        row[c..c + self.groups.len()].to_vec()
    }

    /// Whether the aggregate table is keyed by its groups (else by `IBMSNAP_LLOGMARKER`:
    /// a BASE AGGREGATE without GROUP BY, one row).
    pub fn keyed_by_group(&self) -> bool {
        self.change || !self.groups.is_empty()
    }

    /// A group's aggregates with no row in it yet.
    pub fn empty(&self) -> Acc {
        let zero = |t: &Option<DataType>| match t {
            Some(DataType::Decimal { .. }) => Num::Decimal(Decimal::ZERO),
            Some(DataType::Double) => Num::Double(0.0),
            _ => Num::Int(0),
        };
        Acc {
            rows: 0,
            slots: self
                .funcs
                .iter()
                .map(|f| match f.kind {
                    Kind::Count => Slot::Count,
                    Kind::Sum => Slot::Sum {
                        sum: zero(&f.source_type),
                        n: 0,
                    },
                    Kind::Min | Kind::Max => Slot::Extreme { value: None, n: 0 },
                    Kind::Avg => Slot::Avg {
                        sum: zero(&f.source_type),
                        n: 0,
                    },
                })
                .collect(),
        }
    }

    /// Adds a source row of the group to `acc`.
    pub fn add(&self, acc: &mut Acc, row: &[Value]) {
        acc.rows += 1;
        for (f, slot) in self.funcs.iter().zip(&mut acc.slots) {
            let Some(v) = f.value(row) else {
                continue;
            };
            match slot {
                Slot::Count => {}
                Slot::Sum { sum, n } | Slot::Avg { sum, n } => {
                    sum.add(v, 1);
                    *n += 1;
                }
                Slot::Extreme { value, n } => {
                    *n += 1;
                    let better = match value {
                        None => true,
                        Some(cur) if f.kind == Kind::Min => v < cur,
                        Some(cur) => v > cur,
                    };
                    if better {
                        *value = Some(v.clone());
                    }
                }
            }
        }
    }

    /// Takes a source row of the group out of `acc`; `false` when that cannot be done
    /// from `acc` alone (the row held a MIN or MAX, or a DOUBLE sum would drift) and
    /// the group must be folded again from its rows. `acc` is then unusable.
    #[must_use]
    pub fn remove(&self, acc: &mut Acc, row: &[Value]) -> bool {
        acc.rows -= 1;
        let mut exact = true;
        for (f, slot) in self.funcs.iter().zip(&mut acc.slots) {
            let Some(v) = f.value(row) else {
                continue;
            };
            match slot {
                Slot::Count => {}
                Slot::Sum { sum, n } | Slot::Avg { sum, n } => {
                    exact &= !matches!(sum, Num::Double(_));
                    sum.add(v, -1);
                    *n -= 1;
                }
                Slot::Extreme { value, n } => {
                    *n -= 1;
                    if *n == 0 {
                        *value = None;
                    } else if value.as_ref() == Some(v) {
                        exact = false;
                    }
                }
            }
        }
        exact
    }

    /// The aggregates of `rows` by group, for the groups `wanted` accepts.
    pub fn fold<'a>(
        &self,
        rows: impl IntoIterator<Item = &'a Row>,
        wanted: impl Fn(&Row) -> bool,
    ) -> BTreeMap<Row, Acc> {
        let mut out: BTreeMap<Row, Acc> = BTreeMap::new();
        for row in rows {
            self.fold_row(&mut out, row, &wanted);
        }
        out
    }

    /// Adds `row` to its group's aggregates in `out`, if `wanted` accepts the group.
    pub fn fold_row(
        &self,
        out: &mut BTreeMap<Row, Acc>,
        row: &[Value],
        wanted: impl Fn(&Row) -> bool,
    ) {
        let group = self.group_of(row);
        if !wanted(&group) {
            return;
        }
        let acc = out.entry(group).or_insert_with(|| self.empty());
        self.add(acc, row);
    }

    /// The aggregate columns of `acc`, in table order.
    fn values(&self, acc: &Acc) -> Result<Vec<Value>, TargetError> {
        let mut out = Vec::with_capacity(acc.slots.len());
        for (i, slot) in acc.slots.iter().enumerate() {
            out.push(match slot {
                Slot::Count => Value::Int(acc.rows),
                Slot::Sum { n: 0, .. } | Slot::Avg { n: 0, .. } => Value::Null,
                Slot::Sum { sum, .. } => match sum {
                    Num::Int(s) => Value::Int(i64::try_from(*s).map_err(|_| {
                        let c = self.control() + self.groups.len() + i;
                        unfit(
                            &self.source,
                            format!(
                                "{} of a group overflows BIGINT ({s})",
                                self.def.columns[c].name
                            ),
                        )
                    })?),
                    Num::Decimal(d) => Value::Decimal(*d),
                    Num::Double(d) => Value::Double(*d),
                },
                Slot::Extreme { value, .. } => value.clone().unwrap_or(Value::Null),
                Slot::Avg { sum, n } => Value::Double(sum.as_f64() / *n as f64),
            });
        }
        Ok(out)
    }

    /// The aggregate table's row for `group`.
    fn row(
        &self,
        group: &Row,
        acc: &Acc,
        low: i64,
        high: i64,
        commit_seq: Option<&[u8]>,
    ) -> Result<Row, TargetError> {
        let mut row = vec![Value::Timestamp(low), Value::Timestamp(high)];
        if let Some(seq) = commit_seq {
            row.push(Value::Bytes(seq.to_vec()));
        }
        row.extend(group.iter().cloned());
        row.extend(self.values(acc)?);
        Ok(row)
    }

    /// A CHANGE AGGREGATE's rows for one transaction (committed at `commit_micros`,
    /// `commit_seq` its `IBMSNAP_COMMITSEQ`) whose changes of the source table carry
    /// `values` (after-images, a delete's before-image): one row per group.
    pub fn change_rows(
        &self,
        values: &[Row],
        commit_micros: i64,
        commit_seq: &[u8],
    ) -> Result<Vec<Row>, TargetError> {
        self.fold(values, |_| true)
            .iter()
            .map(|(group, acc)| {
                self.row(group, acc, commit_micros, commit_micros, Some(commit_seq))
            })
            .collect()
    }

    /// A BASE AGGREGATE's row of `group`, whose aggregates are `acc`:
    /// `IBMSNAP_LLOGMARKER` `low` (the commit time of the change that made the group,
    /// kept while it has rows), `IBMSNAP_HLOGMARKER` `high` (its latest change's).
    pub fn base_row(
        &self,
        group: &Row,
        acc: &Acc,
        low: i64,
        high: i64,
    ) -> Result<Row, TargetError> {
        self.row(group, acc, low, high, None)
    }

    /// Whether `old` (a row of the aggregate table) holds the aggregates `acc` gives
    /// its group: the commit times aside.
    pub fn agrees(&self, old: &Row, acc: &Acc) -> bool {
        let c = self.control() + self.groups.len();
        self.values(acc).is_ok_and(|v| old.get(c..) == Some(&v[..]))
    }
}
