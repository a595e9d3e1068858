//! Bound expressions and their evaluation over [`Value`]s.
//!
//! The planner turns sqlparser's `Expr` into an [`Expr`] whose column references are
//! positions in the input row, so evaluation is a plain tree walk with no name lookup.
//! The rules are SQL's:
//!
//! * three-valued logic: comparisons with NULL are unknown (`Value::Null`), `AND`/`OR`
//!   follow Kleene's tables, a WHERE keeps a row only when its predicate is TRUE;
//! * arithmetic: integers stay integers with overflow checked (22003), an integer meets a
//!   DECIMAL as an exact decimal (also checked), anything meets DOUBLE as a double;
//!   integer division truncates (as PostgreSQL, Sybase and TimesTen do); `/ 0` is 22012;
//! * comparisons coerce numerics across types (1 = 1.0 = 1e0), a text literal against
//!   a DATE or TIMESTAMP is read as one; other mixes are a type mismatch (42804);
//! * `||` concatenates the text form of its operands, NULL if either is NULL;
//! * LIKE with `%`, `_` and an optional ESCAPE character;
//! * `seq.NEXTVAL` / `seq.CURRVAL` ask an [`EvalContext`], which the session implements
//!   (NEXTVAL advances once per row, however often the row mentions it).

use std::cmp::Ordering;
use std::fmt;

use hawser_core::coerce::coerce;
use hawser_core::{DataType, QualName, Value};
use rust_decimal::prelude::{FromPrimitive, ToPrimitive};
use rust_decimal::Decimal;
use sqlparser::tokenizer::Location;

use crate::error::{At, Error, ErrorKind, Result};

/// A bound scalar expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Literal(Value),
    /// The value at this position of the input row.
    Column(usize),
    /// `seq.NEXTVAL` or `seq.CURRVAL`.
    Sequence {
        name: QualName,
        op: SeqOp,
    },
    Unary {
        op: UnaryOp,
        expr: Box<Expr>,
    },
    Binary {
        op: BinOp,
        left: Box<Expr>,
        right: Box<Expr>,
        /// Where the operator stands in the script, for type errors found at run time.
        at: Location,
    },
    IsNull {
        expr: Box<Expr>,
        negated: bool,
    },
    InList {
        expr: Box<Expr>,
        list: Vec<Expr>,
        negated: bool,
    },
    Between {
        expr: Box<Expr>,
        low: Box<Expr>,
        high: Box<Expr>,
        negated: bool,
    },
    Like {
        expr: Box<Expr>,
        pattern: Box<Expr>,
        escape: Option<char>,
        negated: bool,
        case_insensitive: bool,
    },
    Cast {
        expr: Box<Expr>,
        to: DataType,
    },
    Func {
        func: Func,
        args: Vec<Expr>,
    },
    Case {
        operand: Option<Box<Expr>>,
        whens: Vec<(Expr, Expr)>,
        otherwise: Option<Box<Expr>>,
    },
}

/// `NEXTVAL` or `CURRVAL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqOp {
    NextVal,
    CurrVal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Not,
    Minus,
    Plus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Concat,
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
    And,
    Or,
}

impl fmt::Display for BinOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "%",
            BinOp::Concat => "||",
            BinOp::Eq => "=",
            BinOp::NotEq => "<>",
            BinOp::Lt => "<",
            BinOp::LtEq => "<=",
            BinOp::Gt => ">",
            BinOp::GtEq => ">=",
            BinOp::And => "AND",
            BinOp::Or => "OR",
        })
    }
}

impl BinOp {
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::NotEq | BinOp::Lt | BinOp::LtEq | BinOp::Gt | BinOp::GtEq
        )
    }

    /// The comparison with its operands swapped (`a < b` is `b > a`).
    pub fn flipped(self) -> BinOp {
        match self {
            BinOp::Lt => BinOp::Gt,
            BinOp::LtEq => BinOp::GtEq,
            BinOp::Gt => BinOp::Lt,
            BinOp::GtEq => BinOp::LtEq,
            other => other,
        }
    }
}

/// Scalar functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Upper,
    Lower,
    Length,
    Abs,
    Coalesce,
}

impl Func {
    pub fn by_name(name: &str) -> Option<Func> {
        Some(match name {
            "upper" => Func::Upper,
            "lower" => Func::Lower,
            "length" | "char_length" => Func::Length,
            "abs" => Func::Abs,
            "coalesce" | "nvl" => Func::Coalesce,
            _ => return None,
        })
    }
}

/// What evaluation needs from the session: sequence values.
pub trait EvalContext {
    /// The next value of `seq` for the current row (advancing the sequence at most once per row).
    fn next_val(&mut self, seq: &QualName) -> Result<i64>;
    /// The session's current value of `seq` (55000 before any NEXTVAL).
    fn curr_val(&mut self, seq: &QualName) -> Result<i64>;
}

/// A context for expressions that may not use sequences (constants in plans, tests).
pub struct NoSequences;

impl EvalContext for NoSequences {
    fn next_val(&mut self, seq: &QualName) -> Result<i64> {
        Err(ErrorKind::Unsupported(format!("{seq}.NEXTVAL is not allowed here")).into())
    }
    fn curr_val(&mut self, seq: &QualName) -> Result<i64> {
        Err(ErrorKind::Unsupported(format!("{seq}.CURRVAL is not allowed here")).into())
    }
}

impl Expr {
    /// Whether the expression reads no column (its value is the same for every row).
    pub fn is_constant(&self) -> bool {
        let mut constant = true;
        self.walk(&mut |e| {
            if matches!(e, Expr::Column(_)) {
                constant = false;
            }
        });
        constant
    }

    /// Whether the expression mentions a sequence (its value changes per evaluation).
    pub fn uses_sequence(&self) -> bool {
        let mut found = false;
        self.walk(&mut |e| {
            if matches!(e, Expr::Sequence { .. }) {
                found = true;
            }
        });
        found
    }

    /// Calls `f` on this node and every node below it.
    pub fn walk(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Literal(_) | Expr::Column(_) | Expr::Sequence { .. } => {}
            Expr::Unary { expr, .. } | Expr::IsNull { expr, .. } | Expr::Cast { expr, .. } => {
                expr.walk(f)
            }
            Expr::Binary { left, right, .. } => {
                left.walk(f);
                right.walk(f);
            }
            Expr::InList { expr, list, .. } => {
                expr.walk(f);
                list.iter().for_each(|e| e.walk(f));
            }
            Expr::Between {
                expr, low, high, ..
            } => {
                expr.walk(f);
                low.walk(f);
                high.walk(f);
            }
            Expr::Like { expr, pattern, .. } => {
                expr.walk(f);
                pattern.walk(f);
            }
            Expr::Func { args, .. } => args.iter().for_each(|e| e.walk(f)),
            Expr::Case {
                operand,
                whens,
                otherwise,
            } => {
                if let Some(o) = operand {
                    o.walk(f);
                }
                for (w, t) in whens {
                    w.walk(f);
                    t.walk(f);
                }
                if let Some(o) = otherwise {
                    o.walk(f);
                }
            }
        }
    }

    /// The operands of this node, in order, for rewriting them.
    pub fn children_mut(&mut self) -> Vec<&mut Expr> {
        match self {
            Expr::Literal(_) | Expr::Column(_) | Expr::Sequence { .. } => Vec::new(),
            Expr::Unary { expr, .. } | Expr::IsNull { expr, .. } | Expr::Cast { expr, .. } => {
                vec![expr.as_mut()]
            }
            Expr::Binary { left, right, .. } => vec![left.as_mut(), right.as_mut()],
            Expr::InList { expr, list, .. } => {
                let mut v = vec![expr.as_mut()];
                v.extend(list.iter_mut());
                v
            }
            Expr::Between {
                expr, low, high, ..
            } => vec![expr.as_mut(), low.as_mut(), high.as_mut()],
            Expr::Like { expr, pattern, .. } => vec![expr.as_mut(), pattern.as_mut()],
            Expr::Func { args, .. } => args.iter_mut().collect(),
            Expr::Case {
                operand,
                whens,
                otherwise,
            } => {
                let mut v: Vec<&mut Expr> = operand.iter_mut().map(|o| o.as_mut()).collect();
                for (w, t) in whens {
                    v.push(w);
                    v.push(t);
                }
                v.extend(otherwise.iter_mut().map(|o| o.as_mut()));
                v
            }
        }
    }

    /// Evaluates the expression against one input row.
    ///
    /// Recursion keeps each level's frame small: every kind of node is evaluated by a
    /// function of its own (in a debug build one function for all of them took 7 KB of
    /// stack per level; see [`crate::limits`]).
    pub fn eval(&self, row: &[Value], ctx: &mut dyn EvalContext) -> Result<Value> {
        match self {
            Expr::Literal(v) => Ok(v.clone()),
            Expr::Column(i) => Ok(row.get(*i).cloned().unwrap_or(Value::Null)),
            Expr::Sequence { name, op } => sequence(name, *op, ctx),
            Expr::Unary { op, expr } => eval_unary(*op, expr, row, ctx),
            Expr::Binary {
                op,
                left,
                right,
                at,
            } => eval_binary(*op, left, right, *at, row, ctx),
            Expr::IsNull { expr, negated } => eval_is_null(expr, *negated, row, ctx),
            Expr::InList {
                expr,
                list,
                negated,
            } => eval_in_list(expr, list, *negated, row, ctx),
            Expr::Between {
                expr,
                low,
                high,
                negated,
            } => eval_between(expr, low, high, *negated, row, ctx),
            Expr::Like {
                expr,
                pattern,
                escape,
                negated,
                case_insensitive,
            } => {
                let how = (*escape, *negated, *case_insensitive);
                eval_like(expr, pattern, how, row, ctx)
            }
            Expr::Cast { expr, to } => eval_cast(expr, to, row, ctx),
            Expr::Func { func, args } => eval_func(*func, args, row, ctx),
            Expr::Case {
                operand,
                whens,
                otherwise,
            } => eval_case(operand.as_deref(), whens, otherwise.as_deref(), row, ctx),
        }
    }

    /// Evaluates a predicate: only TRUE keeps a row (NULL and FALSE do not).
    pub fn holds(&self, row: &[Value], ctx: &mut dyn EvalContext) -> Result<bool> {
        Ok(truth(&self.eval(row, ctx)?)? == Some(true))
    }
}

fn sequence(name: &QualName, op: SeqOp, ctx: &mut dyn EvalContext) -> Result<Value> {
    let v = match op {
        SeqOp::NextVal => ctx.next_val(name)?,
        SeqOp::CurrVal => ctx.curr_val(name)?,
    };
    Ok(Value::Int(v))
}

fn eval_unary(op: UnaryOp, e: &Expr, row: &[Value], ctx: &mut dyn EvalContext) -> Result<Value> {
    unary(op, e.eval(row, ctx)?)
}

fn eval_is_null(
    e: &Expr,
    negated: bool,
    row: &[Value],
    ctx: &mut dyn EvalContext,
) -> Result<Value> {
    Ok(Value::Bool(e.eval(row, ctx)?.is_null() != negated))
}

fn eval_cast(e: &Expr, to: &DataType, row: &[Value], ctx: &mut dyn EvalContext) -> Result<Value> {
    cast(e.eval(row, ctx)?, to)
}

/// `how` is (ESCAPE, NOT, case-insensitive).
fn eval_like(
    e: &Expr,
    pattern: &Expr,
    (escape, negated, case_insensitive): (Option<char>, bool, bool),
    row: &[Value],
    ctx: &mut dyn EvalContext,
) -> Result<Value> {
    let v = e.eval(row, ctx)?;
    let p = pattern.eval(row, ctx)?;
    like_values(v, p, escape, negated, case_insensitive)
}

fn eval_binary(
    op: BinOp,
    left: &Expr,
    right: &Expr,
    at: Location,
    row: &[Value],
    ctx: &mut dyn EvalContext,
) -> Result<Value> {
    let l = left.eval(row, ctx)?;
    if let Some(v) = short_circuit(op, &l).at(at)? {
        return Ok(v);
    }
    let r = right.eval(row, ctx)?;
    binary(op, l, r).at(at)
}

/// AND / OR short-circuit only on a definite answer, as Kleene logic allows.
fn short_circuit(op: BinOp, left: &Value) -> Result<Option<Value>> {
    if !matches!(op, BinOp::And | BinOp::Or) {
        return Ok(None);
    }
    Ok(match (op, truth(left)?) {
        (BinOp::And, Some(false)) => Some(Value::Bool(false)),
        (BinOp::Or, Some(true)) => Some(Value::Bool(true)),
        _ => None,
    })
}

fn eval_in_list(
    operand: &Expr,
    list: &[Expr],
    negated: bool,
    row: &[Value],
    ctx: &mut dyn EvalContext,
) -> Result<Value> {
    let v = operand.eval(row, ctx)?;
    let mut saw_null = v.is_null();
    let mut found = false;
    for item in list {
        match sql_cmp(&v, &item.eval(row, ctx)?)? {
            Some(Ordering::Equal) => {
                found = true;
                break;
            }
            Some(_) => {}
            None => saw_null = true,
        }
    }
    Ok(match (found, saw_null) {
        (true, _) => Value::Bool(!negated),
        (false, true) => Value::Null,
        (false, false) => Value::Bool(negated),
    })
}

fn eval_between(
    operand: &Expr,
    low: &Expr,
    high: &Expr,
    negated: bool,
    row: &[Value],
    ctx: &mut dyn EvalContext,
) -> Result<Value> {
    let v = operand.eval(row, ctx)?;
    let ge = cmp_op(BinOp::GtEq, &v, &low.eval(row, ctx)?)?;
    let le = cmp_op(BinOp::LtEq, &v, &high.eval(row, ctx)?)?;
    let within = and(ge, le);
    Ok(if negated { not(within) } else { within })
}

fn like_values(
    v: Value,
    p: Value,
    escape: Option<char>,
    negated: bool,
    case_insensitive: bool,
) -> Result<Value> {
    match (v, p) {
        (Value::Null, _) | (_, Value::Null) => Ok(Value::Null),
        (Value::Text(s), Value::Text(p)) => {
            let m = if case_insensitive {
                like(&s.to_lowercase(), &p.to_lowercase(), escape)?
            } else {
                like(&s, &p, escape)?
            };
            Ok(Value::Bool(m != negated))
        }
        (v, p) => Err(ErrorKind::TypeMismatch(format!(
            "LIKE needs text operands, not {} and {}",
            type_name(&v),
            type_name(&p)
        ))
        .into()),
    }
}

fn eval_func(func: Func, args: &[Expr], row: &[Value], ctx: &mut dyn EvalContext) -> Result<Value> {
    let mut vals = Vec::with_capacity(args.len());
    for a in args {
        vals.push(a.eval(row, ctx)?);
    }
    scalar_func(func, vals)
}

fn eval_case(
    operand: Option<&Expr>,
    whens: &[(Expr, Expr)],
    otherwise: Option<&Expr>,
    row: &[Value],
    ctx: &mut dyn EvalContext,
) -> Result<Value> {
    let subject = match operand {
        Some(o) => Some(o.eval(row, ctx)?),
        None => None,
    };
    for (when, then) in whens {
        let w = when.eval(row, ctx)?;
        if case_hit(subject.as_ref(), &w)? {
            return then.eval(row, ctx);
        }
    }
    match otherwise {
        Some(o) => o.eval(row, ctx),
        None => Ok(Value::Null),
    }
}

/// Whether a WHEN value selects its branch: equal to the CASE operand, or TRUE.
fn case_hit(subject: Option<&Value>, when: &Value) -> Result<bool> {
    Ok(match subject {
        Some(s) => sql_cmp(s, when)? == Some(Ordering::Equal),
        None => truth(when)? == Some(true),
    })
}

/// The SQL name of a value's type, for error messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "NULL",
        Value::Bool(_) => "BOOLEAN",
        Value::Int(_) => "INTEGER",
        Value::Decimal(_) => "DECIMAL",
        Value::Double(_) => "DOUBLE",
        Value::Text(_) => "VARCHAR",
        Value::Bytes(_) => "VARBINARY",
        Value::Date(_) => "DATE",
        Value::Timestamp(_) => "TIMESTAMP",
    }
}

/// A boolean operand: `Some(b)` or `None` for unknown; other types are a mismatch.
fn truth(v: &Value) -> Result<Option<bool>> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        other => Err(ErrorKind::TypeMismatch(format!(
            "a condition must be BOOLEAN, not {}",
            type_name(other)
        ))
        .into()),
    }
}

fn and(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Bool(false), _) | (_, Value::Bool(false)) => Value::Bool(false),
        (Value::Bool(true), Value::Bool(true)) => Value::Bool(true),
        _ => Value::Null,
    }
}

fn not(v: Value) -> Value {
    match v {
        Value::Bool(b) => Value::Bool(!b),
        other => other,
    }
}

fn unary(op: UnaryOp, v: Value) -> Result<Value> {
    match (op, v) {
        (_, Value::Null) => Ok(Value::Null),
        (UnaryOp::Not, v) => Ok(match truth(&v)? {
            Some(b) => Value::Bool(!b),
            None => Value::Null,
        }),
        (UnaryOp::Plus, v @ (Value::Int(_) | Value::Decimal(_) | Value::Double(_))) => Ok(v),
        (UnaryOp::Minus, Value::Int(i)) => i
            .checked_neg()
            .map(Value::Int)
            .ok_or_else(|| overflow("negation")),
        (UnaryOp::Minus, Value::Decimal(d)) => Ok(Value::Decimal(-d)),
        (UnaryOp::Minus, Value::Double(d)) => Ok(Value::Double(-d)),
        (op, v) => Err(ErrorKind::TypeMismatch(format!(
            "unary {} cannot be applied to {}",
            match op {
                UnaryOp::Not => "NOT",
                UnaryOp::Minus => "-",
                UnaryOp::Plus => "+",
            },
            type_name(&v)
        ))
        .into()),
    }
}

fn overflow(what: &str) -> Error {
    ErrorKind::NumericOverflow(format!("numeric overflow in {what}")).into()
}

/// Applies a binary operator to two evaluated operands.
pub fn binary(op: BinOp, l: Value, r: Value) -> Result<Value> {
    match op {
        BinOp::And => Ok(and(bool_operand(l)?, bool_operand(r)?)),
        BinOp::Or => {
            let (l, r) = (bool_operand(l)?, bool_operand(r)?);
            Ok(match (l, r) {
                (Value::Bool(true), _) | (_, Value::Bool(true)) => Value::Bool(true),
                (Value::Bool(false), Value::Bool(false)) => Value::Bool(false),
                _ => Value::Null,
            })
        }
        BinOp::Concat => match (l, r) {
            (Value::Null, _) | (_, Value::Null) => Ok(Value::Null),
            (l, r) => Ok(Value::Text(format!("{l}{r}"))),
        },
        op if op.is_comparison() => cmp_op(op, &l, &r),
        op => arith(op, l, r),
    }
}

fn bool_operand(v: Value) -> Result<Value> {
    truth(&v)?;
    Ok(v)
}

fn cmp_op(op: BinOp, l: &Value, r: &Value) -> Result<Value> {
    let Some(ord) = sql_cmp(l, r)? else {
        return Ok(Value::Null);
    };
    Ok(Value::Bool(match op {
        BinOp::Eq => ord == Ordering::Equal,
        BinOp::NotEq => ord != Ordering::Equal,
        BinOp::Lt => ord == Ordering::Less,
        BinOp::LtEq => ord != Ordering::Greater,
        BinOp::Gt => ord == Ordering::Greater,
        BinOp::GtEq => ord != Ordering::Less,
        _ => unreachable!("cmp_op is only called with comparison operators"),
    }))
}

/// Compares two values the SQL way: `None` when either is NULL, numerics across
/// types, text against DATE/TIMESTAMP by reading the text; a type mismatch otherwise.
pub fn sql_cmp(l: &Value, r: &Value) -> Result<Option<Ordering>> {
    use Value as V;
    Ok(Some(match (l, r) {
        (V::Null, _) | (_, V::Null) => return Ok(None),
        (V::Int(a), V::Decimal(b)) => Decimal::from(*a).cmp(b),
        (V::Decimal(a), V::Int(b)) => a.cmp(&Decimal::from(*b)),
        (V::Int(_) | V::Decimal(_), V::Double(b)) => to_f64(l)?.total_cmp(b),
        (V::Double(a), V::Int(_) | V::Decimal(_)) => a.total_cmp(&to_f64(r)?),
        (V::Date(a), V::Timestamp(b)) => date_micros(*a).cmp(b),
        (V::Timestamp(a), V::Date(b)) => a.cmp(&date_micros(*b)),
        (V::Text(_), V::Date(_) | V::Timestamp(_)) => {
            return sql_cmp(&read_datetime(l, r)?, r);
        }
        (V::Date(_) | V::Timestamp(_), V::Text(_)) => {
            return sql_cmp(l, &read_datetime(r, l)?);
        }
        (a, b) if std::mem::discriminant(a) == std::mem::discriminant(b) => a.cmp(b),
        (a, b) => {
            return Err(ErrorKind::TypeMismatch(format!(
                "cannot compare {} with {}",
                type_name(a),
                type_name(b)
            ))
            .into())
        }
    }))
}

/// The order ORDER BY and MIN/MAX use: [`sql_cmp`] where it applies, NULL first, and
/// the value order of [`Value`] between types that do not compare.
pub fn sort_cmp(l: &Value, r: &Value) -> Ordering {
    match sql_cmp(l, r) {
        Ok(Some(o)) => o,
        _ => l.cmp(r),
    }
}

fn date_micros(days: i32) -> i64 {
    i64::from(days) * 86_400_000_000
}

/// Reads a text operand as the DATE or TIMESTAMP it is compared with.
fn read_datetime(text: &Value, like: &Value) -> Result<Value> {
    let ty = match like {
        Value::Date(_) => DataType::Date,
        _ => DataType::Timestamp,
    };
    coerce(text.clone(), &ty).map_err(Error::from)
}

fn to_f64(v: &Value) -> Result<f64> {
    match v {
        Value::Int(i) => Ok(*i as f64),
        Value::Decimal(d) => d.to_f64().ok_or_else(|| overflow("conversion to DOUBLE")),
        Value::Double(d) => Ok(*d),
        other => {
            Err(ErrorKind::TypeMismatch(format!("{} is not a number", type_name(other))).into())
        }
    }
}

fn arith(op: BinOp, l: Value, r: Value) -> Result<Value> {
    use Value as V;
    let mismatch = |l: &Value, r: &Value| -> Error {
        ErrorKind::TypeMismatch(format!(
            "operator {op} cannot be applied to {} and {}",
            type_name(l),
            type_name(r)
        ))
        .into()
    };
    match (&l, &r) {
        (V::Null, _) | (_, V::Null) => Ok(V::Null),
        (V::Int(a), V::Int(b)) => int_arith(op, *a, *b).map(V::Int),
        (V::Int(_) | V::Decimal(_), V::Int(_) | V::Decimal(_)) => {
            dec_arith(op, to_decimal(&l), to_decimal(&r)).map(V::Decimal)
        }
        (V::Int(_) | V::Decimal(_) | V::Double(_), V::Int(_) | V::Decimal(_) | V::Double(_)) => {
            let (a, b) = (to_f64(&l)?, to_f64(&r)?);
            let v = match op {
                BinOp::Add => a + b,
                BinOp::Sub => a - b,
                BinOp::Mul => a * b,
                BinOp::Div if b == 0.0 => return Err(ErrorKind::DivisionByZero.into()),
                BinOp::Div => a / b,
                BinOp::Mod if b == 0.0 => return Err(ErrorKind::DivisionByZero.into()),
                BinOp::Mod => a % b,
                _ => return Err(mismatch(&l, &r)),
            };
            if v.is_finite() {
                Ok(V::Double(v))
            } else {
                Err(overflow("DOUBLE arithmetic"))
            }
        }
        // Date arithmetic in days, as Oracle and TimesTen do it.
        (V::Date(d), V::Int(n)) if matches!(op, BinOp::Add | BinOp::Sub) => {
            let n = i32::try_from(*n).map_err(|_| overflow("date arithmetic"))?;
            let days = if op == BinOp::Add {
                d.checked_add(n)
            } else {
                d.checked_sub(n)
            };
            days.map(V::Date).ok_or_else(|| overflow("date arithmetic"))
        }
        (V::Int(n), V::Date(d)) if op == BinOp::Add => {
            let n = i32::try_from(*n).map_err(|_| overflow("date arithmetic"))?;
            d.checked_add(n)
                .map(V::Date)
                .ok_or_else(|| overflow("date arithmetic"))
        }
        (V::Date(a), V::Date(b)) if op == BinOp::Sub => Ok(V::Int(i64::from(*a) - i64::from(*b))),
        _ => Err(mismatch(&l, &r)),
    }
}

fn to_decimal(v: &Value) -> Decimal {
    match v {
        Value::Int(i) => Decimal::from(*i),
        Value::Decimal(d) => *d,
        _ => Decimal::ZERO,
    }
}

fn int_arith(op: BinOp, a: i64, b: i64) -> Result<i64> {
    let r = match op {
        BinOp::Add => a.checked_add(b),
        BinOp::Sub => a.checked_sub(b),
        BinOp::Mul => a.checked_mul(b),
        BinOp::Div | BinOp::Mod if b == 0 => return Err(ErrorKind::DivisionByZero.into()),
        BinOp::Div => a.checked_div(b),
        BinOp::Mod => a.checked_rem(b),
        _ => None,
    };
    r.ok_or_else(|| {
        ErrorKind::NumericOverflow(format!("integer out of range in {a} {op} {b}")).into()
    })
}

fn dec_arith(op: BinOp, a: Decimal, b: Decimal) -> Result<Decimal> {
    let r = match op {
        BinOp::Add => a.checked_add(b),
        BinOp::Sub => a.checked_sub(b),
        BinOp::Mul => a.checked_mul(b),
        BinOp::Div | BinOp::Mod if b.is_zero() => return Err(ErrorKind::DivisionByZero.into()),
        BinOp::Div => a.checked_div(b),
        BinOp::Mod => a.checked_rem(b),
        _ => None,
    };
    r.ok_or_else(|| {
        ErrorKind::NumericOverflow(format!("decimal out of range in {a} {op} {b}")).into()
    })
}

/// `CAST(v AS ty)`: the column coercion, plus reading text as a number or boolean and
/// printing anything as text.
pub fn cast(v: Value, ty: &DataType) -> Result<Value> {
    let v = match (v, ty) {
        (Value::Text(s), t) if t.is_numeric() => parse_number(s.trim())?,
        (Value::Text(s), DataType::Boolean) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "t" | "1" | "yes" => Value::Bool(true),
            "false" | "f" | "0" | "no" => Value::Bool(false),
            _ => return Err(ErrorKind::InvalidText(format!("invalid BOOLEAN value '{s}'")).into()),
        },
        (Value::Double(d), t) if t.is_integer() || matches!(t, DataType::Decimal { .. }) => {
            let rounded = if t.is_integer() { d.round() } else { d };
            Value::Decimal(Decimal::from_f64(rounded).ok_or_else(|| overflow("CAST"))?)
        }
        (Value::Decimal(d), t) if t.is_integer() => Value::Decimal(d.round()),
        (v @ (Value::Int(_) | Value::Decimal(_) | Value::Double(_) | Value::Bool(_)), t)
            if t.is_text() =>
        {
            Value::Text(v.to_string())
        }
        (v @ (Value::Date(_) | Value::Timestamp(_)), t) if t.is_text() => {
            Value::Text(v.to_string())
        }
        (v, _) => v,
    };
    coerce(v, ty).map_err(Error::from)
}

/// Reads a numeric literal: an integer if it fits `i64`, an exact decimal if it has a
/// point, a double if it has an exponent.
pub fn parse_number(s: &str) -> Result<Value> {
    if let Ok(i) = s.parse::<i64>() {
        return Ok(Value::Int(i));
    }
    if !s.contains(['e', 'E']) {
        if let Ok(d) = Decimal::from_str_exact(s) {
            return Ok(Value::Decimal(d));
        }
        if s.bytes()
            .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-' || b == b'+')
        {
            return Err(overflow(&format!("the number {s}")));
        }
    }
    match s.parse::<f64>() {
        Ok(d) if d.is_finite() => Ok(Value::Double(d)),
        Ok(_) => Err(overflow(&format!("the number {s}"))),
        Err(_) => Err(ErrorKind::InvalidText(format!("invalid number '{s}'")).into()),
    }
}

fn scalar_func(func: Func, args: Vec<Value>) -> Result<Value> {
    let one = |args: &[Value]| -> Result<Value> {
        match args {
            [v] => Ok(v.clone()),
            _ => Err(ErrorKind::InvalidStatement(format!(
                "{func:?} takes one argument, not {}",
                args.len()
            ))
            .into()),
        }
    };
    match func {
        Func::Coalesce => Ok(args
            .into_iter()
            .find(|v| !v.is_null())
            .unwrap_or(Value::Null)),
        Func::Upper | Func::Lower | Func::Length => match one(&args)? {
            Value::Null => Ok(Value::Null),
            Value::Text(s) => Ok(match func {
                Func::Upper => Value::Text(s.to_uppercase()),
                Func::Lower => Value::Text(s.to_lowercase()),
                _ => Value::Int(s.chars().count() as i64),
            }),
            Value::Bytes(b) if func == Func::Length => Ok(Value::Int(b.len() as i64)),
            v => Err(ErrorKind::TypeMismatch(format!(
                "{func:?} needs text, not {}",
                type_name(&v)
            ))
            .into()),
        },
        Func::Abs => match one(&args)? {
            Value::Null => Ok(Value::Null),
            Value::Int(i) => i
                .checked_abs()
                .map(Value::Int)
                .ok_or_else(|| overflow("ABS")),
            Value::Decimal(d) => Ok(Value::Decimal(d.abs())),
            Value::Double(d) => Ok(Value::Double(d.abs())),
            v => Err(
                ErrorKind::TypeMismatch(format!("ABS needs a number, not {}", type_name(&v)))
                    .into(),
            ),
        },
    }
}

/// SQL LIKE: `%` matches any run of characters, `_` one character, `escape` makes the
/// next pattern character literal.
pub fn like(text: &str, pattern: &str, escape: Option<char>) -> Result<bool> {
    #[derive(Clone, Copy, PartialEq)]
    enum P {
        Any,
        One,
        Lit(char),
    }
    let mut pat = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        pat.push(match c {
            c if Some(c) == escape => match chars.next() {
                Some(n) => P::Lit(n),
                None => {
                    return Err(ErrorKind::InvalidText(format!(
                        "LIKE pattern '{pattern}' ends with its escape character"
                    ))
                    .into())
                }
            },
            '%' => P::Any,
            '_' => P::One,
            c => P::Lit(c),
        });
    }
    let text: Vec<char> = text.chars().collect();
    // Greedy matching with one backtrack point (the last `%`): linear in practice and
    // O(n·m) at worst, with no recursion.
    let (mut t, mut p) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pat.get(p) {
            Some(P::Any) => {
                star = Some((p, t));
                p += 1;
            }
            Some(P::One) => {
                t += 1;
                p += 1;
            }
            Some(P::Lit(c)) if *c == text[t] => {
                t += 1;
                p += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return Ok(false),
            },
        }
    }
    Ok(pat[p..].iter().all(|x| *x == P::Any))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(v: Value) -> Box<Expr> {
        Box::new(Expr::Literal(v))
    }

    fn bin(op: BinOp, l: Value, r: Value) -> Result<Value> {
        Expr::Binary {
            op,
            left: lit(l),
            right: lit(r),
            at: Location::new(1, 1),
        }
        .eval(&[], &mut NoSequences)
    }

    fn dec(s: &str) -> Value {
        Value::Decimal(s.parse().unwrap())
    }

    #[test]
    fn kleene_logic_for_and_or_not() {
        use Value::{Bool, Null};
        let t = Bool(true);
        let f = Bool(false);
        assert_eq!(bin(BinOp::And, Null, f.clone()).unwrap(), f);
        assert_eq!(bin(BinOp::And, Null, t.clone()).unwrap(), Null);
        assert_eq!(bin(BinOp::Or, Null, t.clone()).unwrap(), t);
        assert_eq!(bin(BinOp::Or, Null, f.clone()).unwrap(), Null);
        assert_eq!(unary(UnaryOp::Not, Null).unwrap(), Null);
        assert_eq!(unary(UnaryOp::Not, t).unwrap(), f);
        assert_eq!(bin(BinOp::Eq, Null, Null).unwrap(), Null);
        assert!(!Expr::Literal(Null).holds(&[], &mut NoSequences).unwrap());
    }

    #[test]
    fn integer_arithmetic_checks_overflow_and_division_by_zero() {
        assert_eq!(
            bin(BinOp::Add, Value::Int(1), Value::Int(1)).unwrap(),
            Value::Int(2)
        );
        assert_eq!(
            bin(BinOp::Div, Value::Int(7), Value::Int(2)).unwrap(),
            Value::Int(3)
        );
        assert_eq!(
            bin(BinOp::Mod, Value::Int(7), Value::Int(2)).unwrap(),
            Value::Int(1)
        );
        let e = bin(BinOp::Add, Value::Int(i64::MAX), Value::Int(1)).unwrap_err();
        assert_eq!(e.kind.code(), "22003");
        assert_eq!(e.at, Some(Location::new(1, 1)));
        let e = bin(BinOp::Div, Value::Int(1), Value::Int(0)).unwrap_err();
        assert_eq!(e.kind.code(), "22012");
        let e = bin(BinOp::Div, Value::Int(i64::MIN), Value::Int(-1)).unwrap_err();
        assert_eq!(e.kind.code(), "22003");
        assert_eq!(
            unary(UnaryOp::Minus, Value::Int(i64::MIN))
                .unwrap_err()
                .kind
                .code(),
            "22003"
        );
    }

    #[test]
    fn decimals_stay_exact() {
        assert_eq!(bin(BinOp::Add, dec("0.1"), dec("0.2")).unwrap(), dec("0.3"));
        assert_eq!(
            bin(BinOp::Mul, Value::Int(3), dec("1.10")).unwrap(),
            dec("3.30")
        );
        assert_eq!(
            bin(BinOp::Div, dec("1"), Value::Int(4)).unwrap(),
            dec("0.25")
        );
        let e = bin(BinOp::Mul, Value::Decimal(Decimal::MAX), Value::Int(2)).unwrap_err();
        assert_eq!(e.kind.code(), "22003");
        assert_eq!(
            bin(BinOp::Add, Value::Double(0.5), Value::Int(1)).unwrap(),
            Value::Double(1.5)
        );
    }

    #[test]
    fn comparisons_coerce_numerics_and_refuse_mismatches() {
        assert_eq!(
            bin(BinOp::Eq, Value::Int(1), dec("1.0")).unwrap(),
            Value::Bool(true)
        );
        assert_eq!(
            bin(BinOp::Lt, dec("1.5"), Value::Double(2.0)).unwrap(),
            Value::Bool(true)
        );
        assert_eq!(
            bin(
                BinOp::GtEq,
                Value::Text("b".into()),
                Value::Text("a".into())
            )
            .unwrap(),
            Value::Bool(true)
        );
        let e = bin(BinOp::Eq, Value::Text("1".into()), Value::Int(1)).unwrap_err();
        assert_eq!(e.kind.code(), "42804");
        assert_eq!(
            bin(BinOp::Eq, Value::Date(0), Value::Text("1970-01-01".into())).unwrap(),
            Value::Bool(true)
        );
    }

    #[test]
    fn concat_and_arithmetic_on_text() {
        assert_eq!(
            bin(BinOp::Concat, Value::Text("a".into()), Value::Int(1)).unwrap(),
            Value::Text("a1".into())
        );
        assert_eq!(
            bin(BinOp::Concat, Value::Text("a".into()), Value::Null).unwrap(),
            Value::Null
        );
        let e = bin(BinOp::Add, Value::Text("a".into()), Value::Int(1)).unwrap_err();
        assert_eq!(e.kind.code(), "42804");
    }

    #[test]
    fn in_between_and_is_null_follow_three_valued_logic() {
        let in_list = |v: Value, items: Vec<Value>, negated| {
            Expr::InList {
                expr: lit(v),
                list: items.into_iter().map(Expr::Literal).collect(),
                negated,
            }
            .eval(&[], &mut NoSequences)
            .unwrap()
        };
        assert_eq!(
            in_list(Value::Int(2), vec![Value::Int(1), dec("2")], false),
            Value::Bool(true)
        );
        assert_eq!(
            in_list(Value::Int(3), vec![Value::Int(1), Value::Null], false),
            Value::Null
        );
        assert_eq!(
            in_list(Value::Int(3), vec![Value::Int(1)], true),
            Value::Bool(true)
        );
        assert_eq!(
            in_list(Value::Null, vec![Value::Int(1)], false),
            Value::Null
        );
        let between = Expr::Between {
            expr: Box::new(Expr::Column(0)),
            low: lit(Value::Int(1)),
            high: lit(Value::Int(3)),
            negated: false,
        };
        let mut ctx = NoSequences;
        assert!(between.holds(&[Value::Int(3)], &mut ctx).unwrap());
        assert!(!between.holds(&[Value::Int(4)], &mut ctx).unwrap());
        assert_eq!(between.eval(&[Value::Null], &mut ctx).unwrap(), Value::Null);
        let is_null = Expr::IsNull {
            expr: Box::new(Expr::Column(0)),
            negated: true,
        };
        assert!(!is_null.holds(&[Value::Null], &mut ctx).unwrap());
    }

    #[test]
    fn like_patterns() {
        assert!(like("hello", "h%o", None).unwrap());
        assert!(like("hello", "h_llo", None).unwrap());
        assert!(!like("hello", "h_lo", None).unwrap());
        assert!(like("", "%", None).unwrap());
        assert!(like("a%b", "a!%b", Some('!')).unwrap());
        assert!(!like("axb", "a!%b", Some('!')).unwrap());
        assert!(like("mississippi", "%iss%ppi", None).unwrap());
        assert!(!like("abc", "abcd", None).unwrap());
        assert!(like("abc", "%%c", None).unwrap());
        assert_eq!(like("a", "a!", Some('!')).unwrap_err().kind.code(), "22P02");
    }

    #[test]
    fn numbers_parse_to_the_narrowest_exact_type() {
        assert_eq!(parse_number("42").unwrap(), Value::Int(42));
        assert_eq!(parse_number("1.50").unwrap(), dec("1.50"));
        assert_eq!(parse_number("1e3").unwrap(), Value::Double(1000.0));
        assert_eq!(
            parse_number("99999999999999999999").unwrap(),
            dec("99999999999999999999")
        );
        assert_eq!(parse_number("1e999").unwrap_err().kind.code(), "22003");
    }

    #[test]
    fn case_and_functions() {
        let e = Expr::Case {
            operand: None,
            whens: vec![(
                Expr::Binary {
                    op: BinOp::Gt,
                    left: Box::new(Expr::Column(0)),
                    right: lit(Value::Int(1)),
                    at: Location::new(1, 1),
                },
                Expr::Literal(Value::Text("big".into())),
            )],
            otherwise: Some(lit(Value::Text("small".into()))),
        };
        let mut ctx = NoSequences;
        assert_eq!(
            e.eval(&[Value::Int(5)], &mut ctx).unwrap(),
            Value::Text("big".into())
        );
        assert_eq!(
            e.eval(&[Value::Int(0)], &mut ctx).unwrap(),
            Value::Text("small".into())
        );
        assert_eq!(
            scalar_func(Func::Coalesce, vec![Value::Null, Value::Int(2)]).unwrap(),
            Value::Int(2)
        );
        assert_eq!(
            scalar_func(Func::Upper, vec![Value::Text("ab".into())]).unwrap(),
            Value::Text("AB".into())
        );
    }
}
