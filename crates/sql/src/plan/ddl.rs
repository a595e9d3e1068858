//! Planning of DDL: CREATE TABLE with its column definitions, ALTER TABLE ADD COLUMN
//! and CREATE SEQUENCE.

use hawser_core::coerce::coerce;
use hawser_core::{ColumnDef, TableDef, Value};
use sqlparser::ast::{self, Spanned};
use sqlparser::tokenizer::Location;

use super::bind::Binder;
use super::{ident, qual_name, unsupported, Plan, SequenceSpec};
use crate::error::{At, Error, ErrorKind, Result};
use crate::expr;
use crate::types::map_type;

pub(super) fn plan_create_table(ct: &ast::CreateTable) -> Result<Plan> {
    let name = qual_name(&ct.name)?;
    if ct.query.is_some() {
        return unsupported("CREATE TABLE ... AS SELECT is not supported");
    }
    let mut columns: Vec<ColumnDef> = Vec::new();
    let mut key: Option<Vec<usize>> = None;
    let mut key_at = None;
    for (i, c) in ct.columns.iter().enumerate() {
        let col_name = ident(&c.name);
        if columns.iter().any(|x| x.name == col_name) {
            return Err(
                Error::from(ErrorKind::DuplicateColumn(col_name.to_string()))
                    .or_at(c.name.span.start),
            );
        }
        let (column, is_key) = column_def(c)?;
        if is_key {
            if key.is_some() {
                return Err(Error::from(ErrorKind::InvalidDefinition(format!(
                    "table {name} has more than one PRIMARY KEY"
                )))
                .or_at(c.name.span.start));
            }
            key = Some(vec![i]);
            key_at = Some(c.name.span.start);
        }
        columns.push(column);
    }
    if columns.is_empty() {
        return Err(ErrorKind::InvalidDefinition(format!("table {name} has no columns")).into());
    }
    for constraint in &ct.constraints {
        match constraint {
            ast::TableConstraint::PrimaryKey(pk) => {
                if key.is_some() {
                    return Err(Error::from(ErrorKind::InvalidDefinition(format!(
                        "table {name} has more than one PRIMARY KEY"
                    )))
                    .or_at(key_at.unwrap_or(Location::new(0, 0))));
                }
                let mut positions = Vec::new();
                for ic in &pk.columns {
                    let ast::Expr::Identifier(id) = &ic.column.expr else {
                        return unsupported("PRIMARY KEY columns must be plain column names");
                    };
                    let pos = columns
                        .iter()
                        .position(|c| c.name == ident(id))
                        .ok_or_else(|| {
                            Error::from(ErrorKind::UndefinedColumn(format!(
                                "PRIMARY KEY column {} is not a column of {name}",
                                ident(id)
                            )))
                            .or_at(id.span.start)
                        })?;
                    if positions.contains(&pos) {
                        return Err(
                            Error::from(ErrorKind::DuplicateColumn(ident(id).to_string()))
                                .or_at(id.span.start),
                        );
                    }
                    positions.push(pos);
                }
                key = Some(positions);
            }
            other => return unsupported(format!("constraint {other} is not supported")),
        }
    }
    let explicit_key = key.is_some();
    let primary_key = match key {
        Some(k) => {
            // Key columns are NOT NULL, as in every SQL database.
            for &i in &k {
                columns[i].nullable = false;
            }
            k
        }
        None => (0..columns.len()).collect(),
    };
    Ok(Plan::CreateTable(TableDef {
        name,
        columns,
        primary_key,
        explicit_key,
    }))
}

/// A column definition; the flag says it was declared `PRIMARY KEY` inline.
fn column_def(c: &ast::ColumnDef) -> Result<(ColumnDef, bool)> {
    let data_type = map_type(&c.data_type).at(c.name.span.start)?;
    let mut column = ColumnDef {
        name: ident(&c.name),
        data_type,
        nullable: true,
        default: None,
    };
    let mut is_key = false;
    for opt in &c.options {
        match &opt.option {
            ast::ColumnOption::Null => column.nullable = true,
            ast::ColumnOption::NotNull => column.nullable = false,
            ast::ColumnOption::PrimaryKey(_) => {
                is_key = true;
                column.nullable = false;
            }
            ast::ColumnOption::Default(e) => {
                let bound = Binder::new(None).bind(e)?;
                if !bound.is_constant() || bound.uses_sequence() {
                    return unsupported(format!("DEFAULT must be a literal, not {e}"));
                }
                let v = bound.eval(&[], &mut expr::NoSequences).at(e.span().start)?;
                let v = coerce(v, &column.data_type).at(e.span().start)?;
                column.default = Some(v);
            }
            other => return unsupported(format!("column option {other} is not supported")),
        }
    }
    Ok((column, is_key))
}

pub(super) fn plan_alter_table(at: &ast::AlterTable) -> Result<Plan> {
    let table = qual_name(&at.name)?;
    let [op] = at.operations.as_slice() else {
        return unsupported("ALTER TABLE takes one operation at a time");
    };
    match op {
        ast::AlterTableOperation::AddColumn { column_def: c, .. } => {
            let (column, is_key) = column_def(c)?;
            if is_key {
                return unsupported("ALTER TABLE ADD COLUMN cannot add a PRIMARY KEY column");
            }
            Ok(Plan::AddColumn { table, column })
        }
        other => unsupported(format!("ALTER TABLE {other} is not supported")),
    }
}

pub(super) fn plan_create_sequence(
    name: &ast::ObjectName,
    options: &[ast::SequenceOptions],
) -> Result<Plan> {
    let mut spec = SequenceSpec {
        name: qual_name(name)?,
        increment: None,
        min_value: None,
        max_value: None,
        start: None,
        cycle: false,
    };
    let int = |e: &ast::Expr| -> Result<i64> {
        let v = Binder::new(None).bind(e)?;
        match v.eval(&[], &mut expr::NoSequences).at(e.span().start)? {
            Value::Int(i) => Ok(i),
            other => Err(Error::from(ErrorKind::InvalidDefinition(format!(
                "sequence options must be integers, not {other}"
            )))
            .or_at(e.span().start)),
        }
    };
    for opt in options {
        match opt {
            ast::SequenceOptions::IncrementBy(e, _) => spec.increment = Some(int(e)?),
            ast::SequenceOptions::MinValue(e) => {
                spec.min_value = e.as_ref().map(int).transpose()?
            }
            ast::SequenceOptions::MaxValue(e) => {
                spec.max_value = e.as_ref().map(int).transpose()?
            }
            ast::SequenceOptions::StartWith(e, _) => spec.start = Some(int(e)?),
            // sqlparser's flag is true for `NO CYCLE`.
            ast::SequenceOptions::Cycle(no) => spec.cycle = !*no,
            ast::SequenceOptions::Cache(_) => {}
            other => return unsupported(format!("sequence option {other} is not supported")),
        }
    }
    if spec.increment == Some(0) {
        return Err(ErrorKind::InvalidDefinition("INCREMENT BY must not be zero".into()).into());
    }
    Ok(Plan::CreateSequence(spec))
}
