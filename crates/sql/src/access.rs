//! Access paths: point lookups and key-range scans instead of full scans.
//!
//! Rows are stored in primary-key order, so a WHERE clause that pins a prefix of the
//! key with constants can be answered by a range scan. Planning ([`analyze`]) collects,
//! for each key column in key order, the constant comparisons the WHERE clause ANDs
//! together (`=`, `<`, `<=`, `>`, `>=`, `BETWEEN`). Execution ([`resolve`]) evaluates the
//! constants, converts them to the key column's type, and builds the range:
//!
//! ```text
//! key (a, b, c)    WHERE a = 1 AND b >= 5 AND b < 9 AND c = 2
//!                  ─────────►  lower ≥ (1, 5)   upper < (1, 9)    (c is filtered)
//! ```
//!
//! The range only narrows what is read: the full WHERE clause is still applied to every
//! row, so a constant that does not convert exactly (`int_key = 1.5`) simply drops out
//! of the range and the result stays right.

use std::cmp::Ordering;
use std::fmt::Write as _;
use std::ops::Bound;

use hawser_core::coerce::coerce;
use hawser_core::{TableDef, Value};

use crate::error::Result;
use crate::expr::{self, BinOp, EvalContext, Expr};

/// Constant comparisons on each primary-key column (index = position in the key).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyPredicates {
    pub columns: Vec<Vec<(BinOp, Expr)>>,
}

impl KeyPredicates {
    pub fn is_empty(&self) -> bool {
        self.columns.iter().all(Vec::is_empty)
    }
}

/// The rows a statement must read, resolved for one execution.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// Every row (no usable key predicate).
    Full,
    /// The rows whose key lies within the bounds. Bounds are key prefixes: `Included`
    /// covers every key that starts with the prefix, `Excluded` none of them.
    Range {
        lower: Bound<Vec<Value>>,
        upper: Bound<Vec<Value>>,
        /// Whether the bounds pin the whole key (at most one row).
        point: bool,
        /// The predicates used, for EXPLAIN (`k = 1`, `a = 1, b >= 5`).
        describe: String,
    },
    /// No row can match (a key compared with NULL, contradictory equalities).
    Empty,
}

/// Collects the key predicates of `filter`.
pub fn analyze(table: &TableDef, filter: Option<&Expr>) -> KeyPredicates {
    let mut preds = KeyPredicates {
        columns: vec![Vec::new(); table.primary_key.len()],
    };
    let Some(filter) = filter else {
        return preds;
    };
    let mut conjuncts = Vec::new();
    flatten_and(filter, &mut conjuncts);
    let key_pos = |e: &Expr| match e {
        Expr::Column(i) => table.primary_key.iter().position(|k| k == i),
        _ => None,
    };
    let usable = |e: &Expr| e.is_constant() && !e.uses_sequence();
    for c in conjuncts {
        match c {
            Expr::Binary {
                op, left, right, ..
            } if op.is_comparison() && *op != BinOp::NotEq => {
                if let (Some(k), true) = (key_pos(left), usable(right)) {
                    preds.columns[k].push((*op, (**right).clone()));
                } else if let (Some(k), true) = (key_pos(right), usable(left)) {
                    preds.columns[k].push((op.flipped(), (**left).clone()));
                }
            }
            Expr::Between {
                expr,
                low,
                high,
                negated: false,
            } => {
                if let (Some(k), true, true) = (key_pos(expr), usable(low), usable(high)) {
                    preds.columns[k].push((BinOp::GtEq, (**low).clone()));
                    preds.columns[k].push((BinOp::LtEq, (**high).clone()));
                }
            }
            _ => {}
        }
    }
    preds
}

fn flatten_and<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::Binary {
            op: BinOp::And,
            left,
            right,
            ..
        } => {
            flatten_and(left, out);
            flatten_and(right, out);
        }
        other => out.push(other),
    }
}

/// Evaluates the key predicates and builds the range to read.
pub fn resolve(
    table: &TableDef,
    preds: &KeyPredicates,
    ctx: &mut dyn EvalContext,
) -> Result<Resolved> {
    let mut prefix: Vec<Value> = Vec::new();
    let mut describe = String::new();
    let mut lower: Option<(Value, bool)> = None;
    let mut upper: Option<(Value, bool)> = None;
    for (k, constraints) in preds.columns.iter().enumerate() {
        let column = &table.columns[table.primary_key[k]];
        let mut eq: Option<Value> = None;
        let mut lo: Option<(Value, bool)> = None;
        let mut hi: Option<(Value, bool)> = None;
        for (op, e) in constraints {
            let v = e.eval(&[], ctx)?;
            if v.is_null() {
                return Ok(Resolved::Empty);
            }
            // Only an exact conversion may narrow the range (see the module docs).
            let Ok(fitted) = coerce(v.clone(), &column.data_type) else {
                continue;
            };
            if expr::sql_cmp(&fitted, &v).ok().flatten() != Some(Ordering::Equal) {
                continue;
            }
            match op {
                BinOp::Eq => match &eq {
                    Some(prev) if expr::sort_cmp(prev, &fitted) != Ordering::Equal => {
                        return Ok(Resolved::Empty)
                    }
                    _ => eq = Some(fitted),
                },
                BinOp::Gt | BinOp::GtEq => {
                    let incl = *op == BinOp::GtEq;
                    lo = Some(tighter(lo, (fitted, incl), Ordering::Greater));
                }
                BinOp::Lt | BinOp::LtEq => {
                    let incl = *op == BinOp::LtEq;
                    hi = Some(tighter(hi, (fitted, incl), Ordering::Less));
                }
                _ => {}
            }
        }
        if let Some(v) = eq {
            sep(&mut describe);
            let _ = write!(describe, "{} = {}", column.name, v.to_sql_literal());
            prefix.push(v);
            continue;
        }
        if let Some((v, incl)) = &lo {
            sep(&mut describe);
            let op = if *incl { ">=" } else { ">" };
            let _ = write!(describe, "{} {op} {}", column.name, v.to_sql_literal());
        }
        if let Some((v, incl)) = &hi {
            sep(&mut describe);
            let op = if *incl { "<=" } else { "<" };
            let _ = write!(describe, "{} {op} {}", column.name, v.to_sql_literal());
        }
        lower = lo;
        upper = hi;
        break;
    }
    if prefix.is_empty() && lower.is_none() && upper.is_none() {
        return Ok(Resolved::Full);
    }
    let point = prefix.len() == table.primary_key.len();
    let bound = |b: Option<(Value, bool)>| match b {
        Some((v, incl)) => {
            let mut key = prefix.clone();
            key.push(v);
            if incl {
                Bound::Included(key)
            } else {
                Bound::Excluded(key)
            }
        }
        None if prefix.is_empty() => Bound::Unbounded,
        None => Bound::Included(prefix.clone()),
    };
    Ok(Resolved::Range {
        lower: bound(lower),
        upper: bound(upper),
        point,
        describe,
    })
}

/// The tighter of two bounds on the same side: `want` is the ordering a tighter value
/// has (Greater for lower bounds); on a tie the exclusive bound is tighter.
fn tighter(old: Option<(Value, bool)>, new: (Value, bool), want: Ordering) -> (Value, bool) {
    match old {
        None => new,
        Some(old) => match expr::sort_cmp(&new.0, &old.0) {
            o if o == want => new,
            Ordering::Equal => (new.0, new.1 && old.1),
            _ => old,
        },
    }
}

fn sep(s: &mut String) {
    if !s.is_empty() {
        s.push_str(", ");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::NoSequences;
    use hawser_core::{ColumnDef, DataType, Ident, QualName};
    use sqlparser::tokenizer::Location;

    fn table() -> TableDef {
        let col = |n: &str, t| ColumnDef {
            name: Ident::unquoted(n),
            data_type: t,
            nullable: false,
            default: None,
        };
        TableDef {
            name: QualName::bare("t"),
            columns: vec![
                col("v", DataType::Varchar(10)),
                col("a", DataType::Integer),
                col("b", DataType::Integer),
            ],
            primary_key: vec![1, 2],
            explicit_key: true,
        }
    }

    fn cmp(op: BinOp, col: usize, v: Value) -> Expr {
        Expr::Binary {
            op,
            left: Box::new(Expr::Column(col)),
            right: Box::new(Expr::Literal(v)),
            at: Location::new(1, 1),
        }
    }

    fn and(l: Expr, r: Expr) -> Expr {
        Expr::Binary {
            op: BinOp::And,
            left: Box::new(l),
            right: Box::new(r),
            at: Location::new(1, 1),
        }
    }

    fn run(filter: Expr) -> Resolved {
        let t = table();
        resolve(&t, &analyze(&t, Some(&filter)), &mut NoSequences).unwrap()
    }

    #[test]
    fn equality_on_the_whole_key_is_a_point() {
        let r = run(and(
            cmp(BinOp::Eq, 1, Value::Int(1)),
            cmp(BinOp::Eq, 2, Value::Int(2)),
        ));
        let Resolved::Range {
            lower,
            upper,
            point,
            describe,
        } = r
        else {
            panic!("expected a range, got {r:?}");
        };
        assert!(point);
        assert_eq!(lower, Bound::Included(vec![Value::Int(1), Value::Int(2)]));
        assert_eq!(upper, lower);
        assert_eq!(describe, "a = 1, b = 2");
    }

    #[test]
    fn prefix_and_range_on_the_next_key_column() {
        let f = and(
            cmp(BinOp::Eq, 1, Value::Int(1)),
            and(
                cmp(BinOp::GtEq, 2, Value::Int(5)),
                cmp(BinOp::Lt, 2, Value::Int(9)),
            ),
        );
        assert_eq!(
            run(f),
            Resolved::Range {
                lower: Bound::Included(vec![Value::Int(1), Value::Int(5)]),
                upper: Bound::Excluded(vec![Value::Int(1), Value::Int(9)]),
                point: false,
                describe: "a = 1, b >= 5, b < 9".into(),
            }
        );
        // Literal on the left: 5 < b is b > 5.
        let f = Expr::Binary {
            op: BinOp::Lt,
            left: Box::new(Expr::Literal(Value::Int(5))),
            right: Box::new(Expr::Column(1)),
            at: Location::new(1, 1),
        };
        assert_eq!(
            run(f),
            Resolved::Range {
                lower: Bound::Excluded(vec![Value::Int(5)]),
                upper: Bound::Unbounded,
                point: false,
                describe: "a > 5".into(),
            }
        );
    }

    #[test]
    fn non_key_or_or_predicates_scan_everything() {
        assert_eq!(
            run(cmp(BinOp::Eq, 0, Value::Text("x".into()))),
            Resolved::Full
        );
        assert_eq!(run(cmp(BinOp::Eq, 2, Value::Int(1))), Resolved::Full);
        let or = Expr::Binary {
            op: BinOp::Or,
            left: Box::new(cmp(BinOp::Eq, 1, Value::Int(1))),
            right: Box::new(cmp(BinOp::Eq, 1, Value::Int(2))),
            at: Location::new(1, 1),
        };
        assert_eq!(run(or), Resolved::Full);
    }

    #[test]
    fn inexact_constants_do_not_narrow_and_null_or_contradiction_is_empty() {
        let dec = Value::Decimal("1.5".parse().unwrap());
        assert_eq!(run(cmp(BinOp::Eq, 1, dec)), Resolved::Full);
        assert_eq!(run(cmp(BinOp::Eq, 1, Value::Null)), Resolved::Empty);
        let f = and(
            cmp(BinOp::Eq, 1, Value::Int(1)),
            cmp(BinOp::Eq, 1, Value::Int(2)),
        );
        assert_eq!(run(f), Resolved::Empty);
        // An integral decimal converts exactly and is used.
        let dec2 = Value::Decimal("2.0".parse().unwrap());
        assert!(matches!(
            run(cmp(BinOp::Eq, 1, dec2)),
            Resolved::Range { .. }
        ));
    }

    #[test]
    fn tightest_bounds_win() {
        let f = and(
            cmp(BinOp::Gt, 1, Value::Int(3)),
            cmp(BinOp::GtEq, 1, Value::Int(3)),
        );
        let Resolved::Range { lower, .. } = run(f) else {
            panic!("expected a range")
        };
        assert_eq!(lower, Bound::Excluded(vec![Value::Int(3)]));
        let f = and(
            cmp(BinOp::Lt, 1, Value::Int(10)),
            cmp(BinOp::LtEq, 1, Value::Int(4)),
        );
        let Resolved::Range { upper, .. } = run(f) else {
            panic!("expected a range")
        };
        assert_eq!(upper, Bound::Included(vec![Value::Int(4)]));
    }
}
