//! Planning of SELECT: projections, ORDER BY, GROUP BY and HAVING, LIMIT and OFFSET,
//! and the SQL type names of the result columns.

use hawser_core::Value;
use sqlparser::ast::{self, Spanned};

use super::bind::Binder;
use super::scope::{single_table, TableScope};
use super::{
    ident, unsupported, AggCall, AggFunc, Aggregate, Catalog, SelectPlan, SortKey, TableAccess,
};
use crate::access;
use crate::error::{At, Error, ErrorKind, Result};
use crate::expr::{self, BinOp, Expr, Func, UnaryOp};
use crate::outcome::ColumnMeta;

/// Plans a SELECT (with ORDER BY / LIMIT / OFFSET).
pub fn plan_query(q: &ast::Query, catalog: &dyn Catalog) -> Result<SelectPlan> {
    if q.with.is_some() || q.fetch.is_some() || !q.locks.is_empty() {
        return unsupported("WITH, FETCH and FOR UPDATE are not supported");
    }
    let ast::SetExpr::Select(select) = q.body.as_ref() else {
        return unsupported("only plain SELECT queries are supported (no UNION, no VALUES)");
    };
    let s = select.as_ref();
    if s.top.is_some() || s.into.is_some() || !s.lateral_views.is_empty() || s.qualify.is_some() {
        return unsupported("TOP, INTO, LATERAL VIEW and QUALIFY are not supported");
    }
    let distinct = match &s.distinct {
        None | Some(ast::Distinct::All) => false,
        Some(ast::Distinct::Distinct) => true,
        Some(ast::Distinct::On(_)) => return unsupported("DISTINCT ON is not supported"),
    };
    let table = single_table(&s.from, catalog)?;
    let scope = table
        .as_ref()
        .map(|(def, alias)| TableScope::new(def, alias.clone()));
    let binder = Binder::new(scope);
    let input_types: Vec<String> = table
        .as_ref()
        .map(|(def, _)| {
            def.columns
                .iter()
                .map(|c| c.data_type.to_string())
                .collect()
        })
        .unwrap_or_default();

    let filter = s.selection.as_ref().map(|e| binder.bind(e)).transpose()?;

    // Projections, bound with aggregates allowed; `*` expands to every column.
    let mut calls: Vec<AggCall> = Vec::new();
    let mut outputs = Vec::new();
    let mut names = Vec::new();
    let mut aliases = Vec::new();
    for item in &s.projection {
        match item {
            ast::SelectItem::Wildcard(_) | ast::SelectItem::QualifiedWildcard(..) => {
                let Some((def, _)) = &table else {
                    return unsupported("SELECT * needs a FROM table");
                };
                for (i, c) in def.columns.iter().enumerate() {
                    outputs.push(Expr::Column(i));
                    names.push(c.name.as_str().to_string());
                    aliases.push(None);
                }
            }
            ast::SelectItem::UnnamedExpr(e) => {
                outputs.push(binder.bind_agg(e, &mut calls)?);
                names.push(output_name(e));
                aliases.push(None);
            }
            ast::SelectItem::ExprWithAlias { expr: e, alias } => {
                outputs.push(binder.bind_agg(e, &mut calls)?);
                names.push(ident(alias).as_str().to_string());
                aliases.push(Some(ident(alias)));
            }
            ast::SelectItem::ExprWithAliases { .. } => {
                return unsupported("multiple aliases are not supported")
            }
        }
    }
    let visible = outputs.len();

    // ORDER BY: a position, an output alias, or an expression (a hidden output).
    let mut order_by = Vec::new();
    if let Some(ob) = &q.order_by {
        let ast::OrderByKind::Expressions(items) = &ob.kind else {
            return unsupported("ORDER BY ALL is not supported");
        };
        for item in items {
            let desc = matches!(item.options.sort, Some(ast::OrderBySort::Desc));
            let column = match &item.expr {
                ast::Expr::Value(v) if matches!(v.value, ast::Value::Number(..)) => {
                    let n: usize = v.value.to_string().parse().unwrap_or(0);
                    if n == 0 || n > visible {
                        return Err(Error::from(ErrorKind::InvalidStatement(format!(
                            "ORDER BY position {} is not in the select list (1..{visible})",
                            v.value
                        )))
                        .or_at(v.span.start));
                    }
                    n - 1
                }
                ast::Expr::Identifier(id)
                    if aliases.iter().any(|a| a.as_ref() == Some(&ident(id))) =>
                {
                    aliases
                        .iter()
                        .position(|a| a.as_ref() == Some(&ident(id)))
                        .unwrap_or(0)
                }
                e => {
                    let bound = binder.bind_agg(e, &mut calls)?;
                    match outputs[..visible].iter().position(|o| *o == bound) {
                        Some(i) => i,
                        None => {
                            outputs.push(bound);
                            outputs.len() - 1
                        }
                    }
                }
            };
            order_by.push(SortKey {
                column,
                desc,
                nulls_first: item.options.nulls_first.unwrap_or(!desc),
            });
        }
    }

    // GROUP BY / HAVING: rebind outputs over the grouped row.
    let group_exprs = match &s.group_by {
        ast::GroupByExpr::Expressions(exprs, mods) if mods.is_empty() => exprs,
        _ => return unsupported("GROUP BY ALL / ROLLUP / CUBE are not supported"),
    };
    let mut group_by = Vec::new();
    for e in group_exprs {
        // GROUP BY may name an output position or alias, as in ORDER BY.
        let bound = match e {
            ast::Expr::Value(v) if matches!(v.value, ast::Value::Number(..)) => {
                let n: usize = v.value.to_string().parse().unwrap_or(0);
                match n
                    .checked_sub(1)
                    .and_then(|i| outputs.get(i).filter(|_| i < visible))
                {
                    Some(o) => o.clone(),
                    None => {
                        return Err(Error::from(ErrorKind::InvalidStatement(format!(
                            "GROUP BY position {} is not in the select list",
                            v.value
                        )))
                        .or_at(v.span.start))
                    }
                }
            }
            e => binder.bind(e)?,
        };
        group_by.push(bound);
    }
    let having = s
        .having
        .as_ref()
        .map(|e| binder.bind_agg(e, &mut calls))
        .transpose()?;
    let aggregate = if calls.is_empty() && group_by.is_empty() {
        if having.is_some() {
            return Err(ErrorKind::Grouping("HAVING needs GROUP BY or an aggregate".into()).into());
        }
        None
    } else {
        let to_group = |e: &Expr| regroup(e, &group_by, &binder);
        outputs = outputs.iter().map(to_group).collect::<Result<_>>()?;
        let having = having.as_ref().map(to_group).transpose()?;
        Some(Aggregate {
            group_by: group_by.clone(),
            calls: calls.clone(),
            having,
        })
    };

    // Result column types, from the row the outputs read.
    let row_types: Vec<String> = match &aggregate {
        None => input_types.clone(),
        Some(agg) => agg
            .group_by
            .iter()
            .map(|g| infer_type(g, &input_types))
            .chain(agg.calls.iter().map(|c| agg_type(c, &input_types)))
            .collect(),
    };
    let columns = names
        .into_iter()
        .zip(&outputs)
        .map(|(name, e)| ColumnMeta {
            name,
            data_type: infer_type(e, &row_types),
        })
        .collect();

    let (limit, offset) = limit_offset(q)?;
    let source = table.map(|(def, _)| {
        let keys = access::analyze(&def, filter.as_ref());
        TableAccess { table: def, keys }
    });
    Ok(SelectPlan {
        source,
        filter,
        aggregate,
        distinct,
        outputs,
        columns,
        order_by,
        limit,
        offset,
    })
}

fn limit_offset(q: &ast::Query) -> Result<(Option<u64>, u64)> {
    let count = |e: &ast::Expr, what: &str| -> Result<u64> {
        let v = Binder::new(None).bind(e)?;
        match v.eval(&[], &mut expr::NoSequences).at(e.span().start)? {
            Value::Int(n) if n >= 0 => Ok(n as u64),
            other => Err(Error::from(ErrorKind::InvalidStatement(format!(
                "{what} must be a non-negative integer, not {other}"
            )))
            .or_at(e.span().start)),
        }
    };
    match &q.limit_clause {
        None => Ok((None, 0)),
        Some(ast::LimitClause::LimitOffset {
            limit,
            offset,
            limit_by,
        }) => {
            if !limit_by.is_empty() {
                return unsupported("LIMIT BY is not supported");
            }
            let limit = limit.as_ref().map(|e| count(e, "LIMIT")).transpose()?;
            let offset = offset
                .as_ref()
                .map(|o| count(&o.value, "OFFSET"))
                .transpose()?
                .unwrap_or(0);
            Ok((limit, offset))
        }
        Some(ast::LimitClause::OffsetCommaLimit { offset, limit }) => {
            Ok((Some(count(limit, "LIMIT")?), count(offset, "OFFSET")?))
        }
    }
}

/// The name of an unaliased output column: the column's name, or the expression's text.
fn output_name(e: &ast::Expr) -> String {
    match e {
        ast::Expr::Identifier(id) => ident(id).as_str().to_string(),
        ast::Expr::CompoundIdentifier(ids) if ids.len() == 2 => {
            let last = ident(&ids[1]);
            match last.as_str() {
                "nextval" | "currval" => e.to_string(),
                _ => last.as_str().to_string(),
            }
        }
        _ => e.to_string(),
    }
}

/// Rebinds an output of an aggregate query to the grouped row: group expressions
/// become their group column, aggregates their result column; any other column
/// reference is an error (42803).
fn regroup(e: &Expr, group_by: &[Expr], binder: &Binder<'_>) -> Result<Expr> {
    let mut out = e.clone();
    regroup_in_place(&mut out, group_by, binder)?;
    Ok(out)
}

fn regroup_in_place(e: &mut Expr, group_by: &[Expr], binder: &Binder<'_>) -> Result<()> {
    if let Some(i) = group_by.iter().position(|g| g == e) {
        *e = Expr::Column(i);
        return Ok(());
    }
    match e {
        Expr::Column(i) if *i >= AGG_BASE => *i = group_by.len() + (*i - AGG_BASE),
        Expr::Column(i) => return Err(ungrouped(*i, binder)),
        _ => {
            for child in e.children_mut() {
                regroup_in_place(child, group_by, binder)?;
            }
        }
    }
    Ok(())
}

fn ungrouped(i: usize, binder: &Binder<'_>) -> Error {
    let name = binder
        .scope
        .as_ref()
        .and_then(|s| s.table.columns.get(i))
        .map(|c| c.name.to_string())
        .unwrap_or_else(|| format!("#{i}"));
    ErrorKind::Grouping(format!(
        "column {name} must appear in the GROUP BY clause or be used in an aggregate function"
    ))
    .into()
}

/// Aggregate results are bound as columns from this position up while an aggregate
/// query is planned, then moved behind the group columns by [`regroup`].
pub(super) const AGG_BASE: usize = usize::MAX / 2;

/// The SQL type name of an expression's results, for [`ColumnMeta`]. `row` holds the
/// type names of the row the expression reads.
fn infer_type(e: &Expr, row: &[String]) -> String {
    fn class(t: &str) -> &'static str {
        match t {
            "TINYINT" | "SMALLINT" | "INTEGER" | "BIGINT" => "int",
            "DOUBLE" => "double",
            t if t.starts_with("DECIMAL") || t.starts_with("NUMBER") => "decimal",
            "DATE" => "date",
            _ => "other",
        }
    }
    match e {
        Expr::Literal(v) => match v {
            Value::Null => "NULL".into(),
            Value::Bool(_) => "BOOLEAN".into(),
            Value::Int(_) => "BIGINT".into(),
            Value::Decimal(_) => "NUMBER".into(),
            Value::Double(_) => "DOUBLE".into(),
            Value::Text(_) => "VARCHAR".into(),
            Value::Bytes(_) => "VARBINARY".into(),
            Value::Date(_) => "DATE".into(),
            Value::Timestamp(_) => "TIMESTAMP".into(),
        },
        Expr::Column(i) => row.get(*i).cloned().unwrap_or_else(|| "NULL".into()),
        Expr::Sequence { .. } => "BIGINT".into(),
        Expr::Unary {
            op: UnaryOp::Not, ..
        } => "BOOLEAN".into(),
        Expr::Unary { expr, .. } => infer_type(expr, row),
        Expr::Binary {
            op, left, right, ..
        } => match op {
            BinOp::Concat => "VARCHAR".into(),
            op if op.is_comparison() || matches!(op, BinOp::And | BinOp::Or) => "BOOLEAN".into(),
            _ => {
                let (l, r) = (infer_type(left, row), infer_type(right, row));
                match (class(&l), class(&r)) {
                    ("date", "date") => "BIGINT".into(),
                    ("date", _) | (_, "date") => "DATE".into(),
                    ("double", _) | (_, "double") => "DOUBLE".into(),
                    ("decimal", _) | (_, "decimal") => "NUMBER".into(),
                    ("int", "int") => "BIGINT".into(),
                    _ if l == "NULL" => r,
                    _ => l,
                }
            }
        },
        Expr::IsNull { .. } | Expr::InList { .. } | Expr::Between { .. } | Expr::Like { .. } => {
            "BOOLEAN".into()
        }
        Expr::Cast { to, .. } => to.to_string(),
        Expr::Func { func, args } => match func {
            Func::Upper | Func::Lower => "VARCHAR".into(),
            Func::Length => "INTEGER".into(),
            Func::Abs | Func::Coalesce => args
                .first()
                .map(|a| infer_type(a, row))
                .unwrap_or_else(|| "NULL".into()),
        },
        Expr::Case {
            whens, otherwise, ..
        } => whens
            .first()
            .map(|(_, t)| infer_type(t, row))
            .or_else(|| otherwise.as_ref().map(|o| infer_type(o, row)))
            .unwrap_or_else(|| "NULL".into()),
    }
}

fn agg_type(call: &AggCall, input: &[String]) -> String {
    let arg = call
        .arg
        .as_ref()
        .map(|a| infer_type(a, input))
        .unwrap_or_default();
    match call.func {
        AggFunc::Count => "BIGINT".into(),
        AggFunc::Min | AggFunc::Max => arg,
        AggFunc::Sum => match arg.as_str() {
            "TINYINT" | "SMALLINT" | "INTEGER" | "BIGINT" => "BIGINT".into(),
            "DOUBLE" => "DOUBLE".into(),
            _ => "NUMBER".into(),
        },
        AggFunc::Avg => match arg.as_str() {
            "DOUBLE" => "DOUBLE".into(),
            _ => "NUMBER".into(),
        },
    }
}
