//! Running plans against the store, inside one transaction.
//!
//! Reads go through the session's [`Txn`], so a statement sees committed rows plus its
//! own transaction's writes (read committed). Writers are careful about concurrency:
//!
//! ```text
//! UPDATE / DELETE:  scan candidates (key range or full)  ──►  WHERE on the scanned row
//!                   ──► lock_and_get(key)  (exclusive row lock, latest version)
//!                   ──► WHERE again on the locked version ──► write the new row
//! ```
//!
//! The second WHERE is what keeps `c = c + 1` from concurrent sessions exact: the new
//! value is always computed from the version read under the lock.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::ops::Bound;
use std::time::{Duration, Instant};

use hawser_core::coerce::coerce;
use hawser_core::{QualName, Row, TableDef, Value};
use hawser_store::{Database, KeyRange, StoreError, Txn};
use rust_decimal::Decimal;
use sqlparser::tokenizer::Location;

use crate::access::{self, Resolved};
use crate::error::{At, Error, ErrorKind, Result};
use crate::expr::{self, BinOp, EvalContext};
use crate::outcome::{ColumnMeta, StatementResult};
use crate::plan::{
    AggCall, AggFunc, DeletePlan, InsertPlan, InsertSource, Plan, SelectPlan, TableAccess,
    UpdatePlan,
};

/// Sequence access for one statement: NEXTVAL advances a sequence once per row, and
/// the session remembers the last value for CURRVAL.
pub struct SeqCtx<'a> {
    pub db: &'a Database,
    pub currval: &'a mut HashMap<QualName, i64>,
    row: HashMap<QualName, i64>,
    deadline: Option<Deadline>,
    /// Why NEXTVAL may not advance a sequence here (a read-only session).
    read_only: Option<String>,
}

/// When a statement must have finished ([`crate::Session::set_statement_timeout`]):
/// checked every [`Deadline::EVERY`] rows, so that a long statement costs a clock read
/// per that many rows, not per row.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    pub at: Instant,
    /// What the caller asked for, for the error's text.
    pub timeout: Duration,
    rows: u32,
}

impl Deadline {
    const EVERY: u32 = 256;

    pub fn after(timeout: Duration) -> Self {
        Deadline {
            at: Instant::now() + timeout,
            timeout,
            rows: 0,
        }
    }

    /// Counts one row; an error once the deadline has passed (checked on the first
    /// row and then every [`Deadline::EVERY`]).
    fn tick(&mut self) -> Result<()> {
        let due = self.rows.is_multiple_of(Self::EVERY);
        self.rows = self.rows.wrapping_add(1);
        if due && Instant::now() >= self.at {
            return Err(ErrorKind::StatementTimeout(format!(
                "canceling statement due to statement timeout: it ran longer than {}",
                humantime::format_duration(self.timeout)
            ))
            .into());
        }
        Ok(())
    }
}

impl<'a> SeqCtx<'a> {
    pub fn new(db: &'a Database, currval: &'a mut HashMap<QualName, i64>) -> Self {
        SeqCtx {
            db,
            currval,
            row: HashMap::new(),
            deadline: None,
            read_only: None,
        }
    }

    /// Refuses NEXTVAL, which writes, with `why` (a read-only session).
    pub fn read_only(mut self, why: Option<String>) -> Self {
        self.read_only = why;
        self
    }

    /// Fails the statement once `deadline` has passed.
    pub fn with_deadline(mut self, deadline: Option<Deadline>) -> Self {
        self.deadline = deadline;
        self
    }

    /// Starts a new row: the next NEXTVAL advances again. Fails once the statement's
    /// deadline has passed.
    fn new_row(&mut self) -> Result<()> {
        self.row.clear();
        self.check_deadline()
    }

    /// Fails once the statement's deadline has passed (counted as one row's work).
    fn check_deadline(&mut self) -> Result<()> {
        match &mut self.deadline {
            Some(d) => d.tick(),
            None => Ok(()),
        }
    }
}

impl EvalContext for SeqCtx<'_> {
    fn next_val(&mut self, seq: &QualName) -> Result<i64> {
        if let Some(v) = self.row.get(seq) {
            return Ok(*v);
        }
        if let Some(why) = &self.read_only {
            return Err(
                ErrorKind::ReadOnly(format!("cannot advance sequence {seq}: {why}")).into(),
            );
        }
        let v = self.db.next_val(seq)?;
        self.row.insert(seq.clone(), v);
        self.currval.insert(seq.clone(), v);
        Ok(v)
    }

    fn curr_val(&mut self, seq: &QualName) -> Result<i64> {
        if self.db.sequence(seq).is_none() {
            return Err(StoreError::UndefinedSequence(seq.clone()).into());
        }
        self.currval
            .get(seq)
            .copied()
            .ok_or_else(|| ErrorKind::CurrvalUndefined(seq.clone()).into())
    }
}

/// Runs a DML statement, a SELECT or an EXPLAIN in `txn`.
pub async fn run_in_txn(
    plan: &Plan,
    txn: &mut Txn,
    ctx: &mut SeqCtx<'_>,
) -> Result<StatementResult> {
    let mut stats = RunStats::default();
    run_counted(plan, txn, ctx, &mut stats).await
}

/// What a run read and produced, for EXPLAIN ANALYZE.
#[derive(Debug, Default)]
struct RunStats {
    rows_scanned: u64,
}

async fn run_counted(
    plan: &Plan,
    txn: &mut Txn,
    ctx: &mut SeqCtx<'_>,
    stats: &mut RunStats,
) -> Result<StatementResult> {
    match plan {
        Plan::Select(p) => {
            let rows = select(p, txn, ctx, stats)?;
            Ok(StatementResult {
                tag: "SELECT".into(),
                columns: p.columns.clone(),
                rows_affected: rows.len() as u64,
                rows,
                warnings: Vec::new(),
            })
        }
        Plan::Insert(p) => affected("INSERT", insert(p, txn, ctx, stats).await?),
        Plan::Update(p) => affected("UPDATE", update(p, txn, ctx, stats).await?),
        Plan::Delete(p) => affected("DELETE", delete(p, txn, ctx, stats).await?),
        Plan::Explain { plan, analyze } => {
            let mut lines = explain(plan, ctx)?;
            if *analyze {
                let mut inner = RunStats::default();
                // Boxed: EXPLAIN nests one level of this same async function.
                let result = Box::pin(run_counted(plan, txn, ctx, &mut inner)).await?;
                lines.push(format!("rows scanned: {}", inner.rows_scanned));
                lines.push(format!("rows affected: {}", result.rows_affected));
            }
            Ok(StatementResult {
                tag: "EXPLAIN".into(),
                columns: vec![ColumnMeta {
                    name: "plan".into(),
                    data_type: "VARCHAR".into(),
                }],
                rows_affected: lines.len() as u64,
                rows: lines.into_iter().map(|l| vec![Value::Text(l)]).collect(),
                warnings: Vec::new(),
            })
        }
        other => Err(ErrorKind::InvalidStatement(format!(
            "{} does not run inside a transaction statement",
            other.tag()
        ))
        .into()),
    }
}

fn affected(tag: &str, n: u64) -> Result<StatementResult> {
    Ok(StatementResult {
        tag: tag.into(),
        rows_affected: n,
        ..Default::default()
    })
}

/// The rows of `access` as the transaction sees them, in key order.
fn read(
    access: &TableAccess,
    txn: &Txn,
    ctx: &mut SeqCtx<'_>,
    stats: &mut RunStats,
) -> Result<Vec<Row>> {
    let name = &access.table.name;
    let rows = match access::resolve(&access.table, &access.keys, ctx)? {
        Resolved::Empty => Vec::new(),
        Resolved::Full => txn.scan(name, KeyRange::all())?,
        Resolved::Range {
            lower: Bound::Included(key),
            point: true,
            ..
        } => txn.get(name, &key)?.into_iter().collect(),
        Resolved::Range { lower, upper, .. } => txn.scan(name, KeyRange::new(lower, upper))?,
    };
    stats.rows_scanned += rows.len() as u64;
    Ok(rows)
}

fn select(
    p: &SelectPlan,
    txn: &Txn,
    ctx: &mut SeqCtx<'_>,
    stats: &mut RunStats,
) -> Result<Vec<Row>> {
    let input = match &p.source {
        Some(access) => read(access, txn, ctx, stats)?,
        None => vec![Vec::new()],
    };
    let mut rows = Vec::with_capacity(input.len());
    for row in input {
        ctx.new_row()?;
        if match &p.filter {
            Some(f) => f.holds(&row, ctx)?,
            None => true,
        } {
            rows.push(row);
        }
    }
    if let Some(agg) = &p.aggregate {
        rows = aggregate(agg, rows, ctx)?;
    }
    let visible = p.columns.len();
    let mut out: Vec<Row> = Vec::with_capacity(rows.len());
    let mut seen = HashSet::new();
    for row in &rows {
        ctx.new_row()?;
        let mut o = Vec::with_capacity(p.outputs.len());
        for e in &p.outputs {
            o.push(e.eval(row, ctx)?);
        }
        if p.distinct && !seen.insert(o[..visible].to_vec()) {
            continue;
        }
        out.push(o);
    }
    if !p.order_by.is_empty() {
        out.sort_by(|a, b| {
            for k in &p.order_by {
                let (x, y) = (&a[k.column], &b[k.column]);
                let o = match (x.is_null(), y.is_null()) {
                    (true, true) => Ordering::Equal,
                    (true, false) if k.nulls_first => Ordering::Less,
                    (true, false) => Ordering::Greater,
                    (false, true) if k.nulls_first => Ordering::Greater,
                    (false, true) => Ordering::Less,
                    (false, false) if k.desc => expr::sort_cmp(y, x),
                    (false, false) => expr::sort_cmp(x, y),
                };
                if o != Ordering::Equal {
                    return o;
                }
            }
            Ordering::Equal
        });
    }
    let offset = usize::try_from(p.offset).unwrap_or(usize::MAX);
    let limit = p
        .limit
        .map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
    Ok(out
        .into_iter()
        .skip(offset)
        .take(limit)
        .map(|mut r| {
            r.truncate(visible);
            r
        })
        .collect())
}

/// One aggregate's running state.
struct Acc<'p> {
    call: &'p AggCall,
    count: i64,
    value: Option<Value>,
    distinct: HashSet<Value>,
}

impl<'p> Acc<'p> {
    fn new(call: &'p AggCall) -> Self {
        Acc {
            call,
            count: 0,
            value: None,
            distinct: HashSet::new(),
        }
    }

    fn add(&mut self, row: &[Value], ctx: &mut SeqCtx<'_>) -> Result<()> {
        let Some(arg) = &self.call.arg else {
            self.count += 1;
            return Ok(());
        };
        let v = arg.eval(row, ctx)?;
        if v.is_null() || (self.call.distinct && !self.distinct.insert(v.clone())) {
            return Ok(());
        }
        self.count += 1;
        self.value = Some(match (self.call.func, self.value.take()) {
            (AggFunc::Count, _) => Value::Null,
            (AggFunc::Sum | AggFunc::Avg, prev) => {
                if !matches!(v, Value::Int(_) | Value::Decimal(_) | Value::Double(_)) {
                    return Err(ErrorKind::TypeMismatch(format!(
                        "SUM and AVG need numbers, not {}",
                        expr::type_name(&v)
                    ))
                    .into());
                }
                match prev {
                    None => v,
                    Some(p) => expr::binary(BinOp::Add, p, v)?,
                }
            }
            (AggFunc::Min, Some(p)) if expr::sort_cmp(&p, &v) != Ordering::Greater => p,
            (AggFunc::Max, Some(p)) if expr::sort_cmp(&p, &v) != Ordering::Less => p,
            (AggFunc::Min | AggFunc::Max, _) => v,
        });
        Ok(())
    }

    fn finish(self) -> Result<Value> {
        Ok(match self.call.func {
            AggFunc::Count => Value::Int(self.count),
            AggFunc::Sum | AggFunc::Min | AggFunc::Max => self.value.unwrap_or(Value::Null),
            AggFunc::Avg => match self.value {
                None => Value::Null,
                Some(Value::Double(d)) => Value::Double(d / self.count as f64),
                Some(Value::Int(i)) => expr::binary(
                    BinOp::Div,
                    Value::Decimal(Decimal::from(i)),
                    Value::Int(self.count),
                )?,
                Some(sum) => expr::binary(BinOp::Div, sum, Value::Int(self.count))?,
            },
        })
    }
}

/// Groups `rows` and returns one row per group: the group values, then the aggregates.
/// Without GROUP BY there is exactly one group, even over no rows.
fn aggregate(
    agg: &crate::plan::Aggregate,
    rows: Vec<Row>,
    ctx: &mut SeqCtx<'_>,
) -> Result<Vec<Row>> {
    let mut index: HashMap<Row, usize> = HashMap::new();
    let mut groups: Vec<(Row, Vec<Acc<'_>>)> = Vec::new();
    if agg.group_by.is_empty() {
        groups.push((Vec::new(), agg.calls.iter().map(Acc::new).collect()));
        index.insert(Vec::new(), 0);
    }
    for row in &rows {
        ctx.new_row()?;
        let mut key = Vec::with_capacity(agg.group_by.len());
        for g in &agg.group_by {
            key.push(g.eval(row, ctx)?);
        }
        let i = match index.get(&key) {
            Some(i) => *i,
            None => {
                groups.push((key.clone(), agg.calls.iter().map(Acc::new).collect()));
                index.insert(key, groups.len() - 1);
                groups.len() - 1
            }
        };
        for acc in &mut groups[i].1 {
            acc.add(row, ctx)?;
        }
    }
    let mut out = Vec::with_capacity(groups.len());
    for (mut key, accs) in groups {
        for acc in accs {
            key.push(acc.finish()?);
        }
        ctx.new_row()?;
        if match &agg.having {
            Some(h) => h.holds(&key, ctx)?,
            None => true,
        } {
            out.push(key);
        }
    }
    Ok(out)
}

/// Converts a value for column `i` of `table`, with an error that names the column and
/// points at the expression that produced the value.
fn fit(table: &TableDef, i: usize, v: Value, at: Location) -> Result<Value> {
    let column = &table.columns[i];
    if v.is_null() && !column.nullable {
        return Err(Error::from(StoreError::NotNullViolation {
            table: table.name.clone(),
            column: column.name.clone(),
        })
        .or_at(at));
    }
    coerce(v, &column.data_type)
        .map_err(|source| StoreError::InvalidValue {
            table: table.name.clone(),
            column: column.name.clone(),
            source,
        })
        .at(at)
}

async fn insert(
    p: &InsertPlan,
    txn: &mut Txn,
    ctx: &mut SeqCtx<'_>,
    stats: &mut RunStats,
) -> Result<u64> {
    let def = &p.table;
    let template: Row = def
        .columns
        .iter()
        .map(|c| c.default.clone().unwrap_or(Value::Null))
        .collect();
    let mut rows: Vec<Vec<(Value, Location)>> = Vec::new();
    match &p.source {
        InsertSource::Values(values) => {
            for exprs in values {
                ctx.new_row()?;
                let mut vals = Vec::with_capacity(exprs.len());
                for (e, at) in exprs {
                    vals.push((e.eval(&[], ctx).at(*at)?, *at));
                }
                rows.push(vals);
            }
        }
        InsertSource::Select(select_plan) => {
            for r in select(select_plan, txn, ctx, stats)? {
                rows.push(r.into_iter().map(|v| (v, Location::new(0, 0))).collect());
            }
        }
    }
    let mut n = 0;
    for vals in rows {
        ctx.check_deadline()?;
        let mut row = template.clone();
        for (&i, (v, at)) in p.targets.iter().zip(vals) {
            row[i] = fit(def, i, v, at)?;
        }
        // Columns left out: their default must satisfy NOT NULL too.
        for (i, c) in def.columns.iter().enumerate() {
            if row[i].is_null() && !c.nullable {
                return Err(StoreError::NotNullViolation {
                    table: def.name.clone(),
                    column: c.name.clone(),
                }
                .into());
            }
        }
        txn.insert(&def.name, row).await?;
        n += 1;
    }
    Ok(n)
}

async fn update(
    p: &UpdatePlan,
    txn: &mut Txn,
    ctx: &mut SeqCtx<'_>,
    stats: &mut RunStats,
) -> Result<u64> {
    let def = &p.access.table;
    let candidates = read(&p.access, txn, ctx, stats)?;
    // Keys this statement has written: a row moved onto a key later in the scan must
    // not be updated twice.
    let mut written: HashSet<Row> = HashSet::new();
    let mut n = 0;
    for row in candidates {
        ctx.new_row()?;
        if !passes(&p.filter, &row, ctx)? {
            continue;
        }
        let key = def.key_of(&row);
        if written.contains(&key) {
            continue;
        }
        // Lock, then decide on the latest version (see the module docs).
        let Some(current) = txn.lock_and_get(&def.name, &key).await? else {
            continue;
        };
        ctx.new_row()?;
        if !passes(&p.filter, &current, ctx)? {
            continue;
        }
        let mut new_row = current.clone();
        for (i, e, at) in &p.assignments {
            let v = e.eval(&current, ctx).at(*at)?;
            new_row[*i] = fit(def, *i, v, *at)?;
        }
        written.insert(def.key_of(&new_row));
        if txn.update(&def.name, &key, new_row).await? {
            n += 1;
        }
    }
    Ok(n)
}

async fn delete(
    p: &DeletePlan,
    txn: &mut Txn,
    ctx: &mut SeqCtx<'_>,
    stats: &mut RunStats,
) -> Result<u64> {
    let def = &p.access.table;
    let candidates = read(&p.access, txn, ctx, stats)?;
    let mut n = 0;
    for row in candidates {
        ctx.new_row()?;
        if !passes(&p.filter, &row, ctx)? {
            continue;
        }
        let key = def.key_of(&row);
        let Some(current) = txn.lock_and_get(&def.name, &key).await? else {
            continue;
        };
        ctx.new_row()?;
        if !passes(&p.filter, &current, ctx)? {
            continue;
        }
        if txn.delete(&def.name, &key).await? {
            n += 1;
        }
    }
    Ok(n)
}

fn passes(filter: &Option<expr::Expr>, row: &[Value], ctx: &mut SeqCtx<'_>) -> Result<bool> {
    match filter {
        Some(f) => f.holds(row, ctx),
        None => Ok(true),
    }
}

/// The lines of EXPLAIN: the statement, how it reads its table, what it does next.
fn explain(plan: &Plan, ctx: &mut SeqCtx<'_>) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    let access_line = |access: &TableAccess, ctx: &mut SeqCtx<'_>| -> Result<String> {
        let name = &access.table.name;
        Ok(match access::resolve(&access.table, &access.keys, ctx)? {
            Resolved::Full => format!("FULL SCAN {name}"),
            Resolved::Empty => format!("NO ROWS {name} (the key predicates cannot hold)"),
            Resolved::Range {
                point: true,
                describe,
                ..
            } => format!("KEY LOOKUP {name} ({describe})"),
            Resolved::Range { describe, .. } => format!("KEY RANGE SCAN {name} ({describe})"),
        })
    };
    match plan {
        Plan::Select(p) => {
            lines.push("SELECT".to_string());
            lines.push(match &p.source {
                Some(a) => access_line(a, ctx)?,
                None => "ONE ROW (no table)".to_string(),
            });
            if p.filter.is_some() {
                lines.push("FILTER (WHERE)".into());
            }
            if let Some(agg) = &p.aggregate {
                lines.push(format!(
                    "AGGREGATE ({} group columns, {} aggregates)",
                    agg.group_by.len(),
                    agg.calls.len()
                ));
            }
            if p.distinct {
                lines.push("DISTINCT".into());
            }
            if !p.order_by.is_empty() {
                lines.push(format!("SORT ({} keys)", p.order_by.len()));
            }
            if p.limit.is_some() || p.offset > 0 {
                lines.push("LIMIT / OFFSET".into());
            }
        }
        Plan::Update(p) => {
            lines.push(format!("UPDATE {}", p.access.table.name));
            lines.push(access_line(&p.access, ctx)?);
        }
        Plan::Delete(p) => {
            lines.push(format!("DELETE {}", p.access.table.name));
            lines.push(access_line(&p.access, ctx)?);
        }
        Plan::Insert(p) => {
            lines.push(format!("INSERT {}", p.table.name));
            match &p.source {
                InsertSource::Values(v) => lines.push(format!("VALUES ({} rows)", v.len())),
                InsertSource::Select(s) => {
                    lines.extend(explain(&Plan::Select((**s).clone()), ctx)?)
                }
            }
        }
        other => lines.push(other.tag().to_string()),
    }
    Ok(lines)
}
