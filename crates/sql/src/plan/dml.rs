//! Planning of INSERT, UPDATE and DELETE: target columns, assignments, and the
//! access path from the WHERE clause.

use sqlparser::ast::{self, Spanned};

use super::bind::Binder;
use super::scope::{single_table, table_named, TableScope};
use super::{
    plan_query, qual_name, unsupported, Catalog, DeletePlan, InsertPlan, InsertSource, Plan,
    TableAccess, UpdatePlan,
};
use crate::access;
use crate::error::{Error, ErrorKind, Result};

pub(super) fn plan_insert(ins: &ast::Insert, catalog: &dyn Catalog) -> Result<Plan> {
    let ast::TableObject::TableName(name) = &ins.table else {
        return unsupported("INSERT INTO a table function is not supported");
    };
    if ins.on.is_some() || ins.returning.is_some() || !ins.assignments.is_empty() {
        return unsupported("INSERT ... ON / RETURNING / SET is not supported");
    }
    let table = table_named(name, catalog)?;
    let targets = if ins.columns.is_empty() {
        (0..table.columns.len()).collect::<Vec<_>>()
    } else {
        let mut targets = Vec::new();
        for c in &ins.columns {
            let qn = qual_name(c)?;
            let i = table.column_index(&qn.name).ok_or_else(|| {
                Error::from(ErrorKind::UndefinedColumn(format!(
                    "column {} of table {} does not exist",
                    qn.name, table.name
                )))
                .or_at(c.span().start)
            })?;
            if targets.contains(&i) {
                return Err(Error::from(ErrorKind::DuplicateColumn(qn.name.to_string()))
                    .or_at(c.span().start));
            }
            targets.push(i);
        }
        targets
    };
    let Some(query) = &ins.source else {
        return unsupported("INSERT needs VALUES or a SELECT");
    };
    let source = match query.body.as_ref() {
        ast::SetExpr::Values(values) if query.order_by.is_none() => {
            let binder = Binder::new(None);
            let mut rows = Vec::new();
            for row in &values.rows {
                let exprs = &row.content;
                if exprs.len() != targets.len() {
                    let what = if exprs.len() > targets.len() {
                        "more"
                    } else {
                        "fewer"
                    };
                    return Err(Error::from(ErrorKind::InvalidStatement(format!(
                        "INSERT has {what} values ({}) than target columns ({})",
                        exprs.len(),
                        targets.len()
                    )))
                    .or_at(row.opening_token.0.span.start));
                }
                let mut bound = Vec::new();
                for e in exprs {
                    bound.push((binder.bind(e)?, e.span().start));
                }
                rows.push(bound);
            }
            InsertSource::Values(rows)
        }
        _ => {
            let select = plan_query(query, catalog)?;
            let width = select.columns.len();
            if width != targets.len() {
                return Err(ErrorKind::InvalidStatement(format!(
                    "INSERT ... SELECT gives {width} columns for {} target columns",
                    targets.len()
                ))
                .into());
            }
            InsertSource::Select(Box::new(select))
        }
    };
    Ok(Plan::Insert(InsertPlan {
        table,
        targets,
        source,
    }))
}

pub(super) fn plan_update(up: &ast::Update, catalog: &dyn Catalog) -> Result<Plan> {
    if up.from.is_some() || up.returning.is_some() || up.limit.is_some() {
        return unsupported("UPDATE ... FROM / RETURNING / LIMIT is not supported");
    }
    let Some((table, alias)) = single_table(std::slice::from_ref(&up.table), catalog)? else {
        return unsupported("UPDATE needs a table");
    };
    let binder = Binder::new(Some(TableScope::new(&table, alias)));
    let mut assignments = Vec::new();
    for a in &up.assignments {
        let ast::AssignmentTarget::ColumnName(col) = &a.target else {
            return unsupported("UPDATE ... SET (a, b) = ... is not supported");
        };
        let i = binder.column_of_name(col)?;
        if assignments.iter().any(|(j, _, _)| *j == i) {
            return Err(Error::from(ErrorKind::DuplicateColumn(
                table.columns[i].name.to_string(),
            ))
            .or_at(col.span().start));
        }
        let value = binder.bind(&a.value)?;
        assignments.push((i, value, a.value.span().start));
    }
    let filter = up.selection.as_ref().map(|e| binder.bind(e)).transpose()?;
    let keys = access::analyze(&table, filter.as_ref());
    Ok(Plan::Update(UpdatePlan {
        access: TableAccess { table, keys },
        filter,
        assignments,
    }))
}

pub(super) fn plan_delete(del: &ast::Delete, catalog: &dyn Catalog) -> Result<Plan> {
    if del.using.is_some() || del.returning.is_some() || del.limit.is_some() {
        return unsupported("DELETE ... USING / RETURNING / LIMIT is not supported");
    }
    let from = match &del.from {
        ast::FromTable::WithFromKeyword(t) | ast::FromTable::WithoutKeyword(t) => t,
    };
    let Some((table, alias)) = single_table(from, catalog)? else {
        return unsupported("DELETE needs a table");
    };
    let binder = Binder::new(Some(TableScope::new(&table, alias)));
    let filter = del.selection.as_ref().map(|e| binder.bind(e)).transpose()?;
    let keys = access::analyze(&table, filter.as_ref());
    Ok(Plan::Delete(DeletePlan {
        access: TableAccess { table, keys },
        filter,
    }))
}
