//! From sqlparser's AST to plans.
//!
//! The planner resolves every name against the catalog (tables, columns, sequences),
//! maps types, binds expressions to row positions ([`crate::expr::Expr`]) and picks the
//! access path ([`crate::access`]). A plan holds no reference to the AST, so execution
//! is independent of sqlparser and planning can be unit-tested against an in-memory
//! [`Catalog`].
//!
//! ```text
//! sqlparser Statement ──plan()──► Plan ──exec──► store (Txn)
//!                       │
//!                       └── Catalog: table definitions
//! ```
//!
//! Scope is one table per statement (no joins); `FROM dual` and no FROM at all give a
//! single row with no columns.

use std::cell::Cell;
use std::sync::Arc;

use hawser_core::coerce::coerce;
use hawser_core::{ColumnDef, DataType, Ident, QualName, TableDef, Value};
use sqlparser::ast::{self, Spanned};
use sqlparser::tokenizer::Location;

use crate::access::{self, KeyPredicates};
use crate::error::{At, Error, ErrorKind, Result};
use crate::expr::{self, BinOp, Expr, Func, SeqOp, UnaryOp};
use crate::limits::{self, MAX_EXPR_DEPTH};
use crate::outcome::ColumnMeta;
use crate::types::map_type;

/// What the planner needs to know about the database.
pub trait Catalog {
    fn table(&self, name: &QualName) -> Option<Arc<TableDef>>;
}

/// A planned statement.
#[derive(Debug, Clone)]
pub enum Plan {
    CreateTable(TableDef),
    DropTable {
        name: QualName,
        if_exists: bool,
    },
    AddColumn {
        table: QualName,
        column: ColumnDef,
    },
    CreateSequence(SequenceSpec),
    DropSequence {
        name: QualName,
        if_exists: bool,
    },
    Insert(InsertPlan),
    Update(UpdatePlan),
    Delete(DeletePlan),
    Select(SelectPlan),
    Begin,
    Commit,
    Rollback,
    /// `EXPLAIN [ANALYZE] stmt`: describe the plan; with ANALYZE also run it and count rows.
    Explain {
        plan: Box<Plan>,
        analyze: bool,
    },
}

impl Plan {
    /// The statement tag a client sees.
    pub fn tag(&self) -> &'static str {
        match self {
            Plan::CreateTable(_) => "CREATE TABLE",
            Plan::DropTable { .. } => "DROP TABLE",
            Plan::AddColumn { .. } => "ALTER TABLE",
            Plan::CreateSequence(_) => "CREATE SEQUENCE",
            Plan::DropSequence { .. } => "DROP SEQUENCE",
            Plan::Insert(_) => "INSERT",
            Plan::Update(_) => "UPDATE",
            Plan::Delete(_) => "DELETE",
            Plan::Select(_) => "SELECT",
            Plan::Begin => "BEGIN",
            Plan::Commit => "COMMIT",
            Plan::Rollback => "ROLLBACK",
            Plan::Explain { .. } => "EXPLAIN",
        }
    }

    /// Whether the statement changes the catalog (and so commits on its own).
    pub fn is_ddl(&self) -> bool {
        matches!(
            self,
            Plan::CreateTable(_)
                | Plan::DropTable { .. }
                | Plan::AddColumn { .. }
                | Plan::CreateSequence(_)
                | Plan::DropSequence { .. }
        )
    }
}

/// `CREATE SEQUENCE` options, defaults not yet applied (the store applies them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceSpec {
    pub name: QualName,
    pub increment: Option<i64>,
    pub min_value: Option<i64>,
    pub max_value: Option<i64>,
    pub start: Option<i64>,
    pub cycle: bool,
}

/// How a statement finds its rows in one table.
#[derive(Debug, Clone)]
pub struct TableAccess {
    pub table: Arc<TableDef>,
    /// Constant predicates on a prefix of the primary key, for a key-range scan.
    pub keys: KeyPredicates,
}

#[derive(Debug, Clone)]
pub struct InsertPlan {
    pub table: Arc<TableDef>,
    /// For each value of a source row, the table column it goes to.
    pub targets: Vec<usize>,
    pub source: InsertSource,
}

#[derive(Debug, Clone)]
pub enum InsertSource {
    /// `VALUES (...), (...)`: expressions with where each stands in the script.
    Values(Vec<Vec<(Expr, Location)>>),
    Select(Box<SelectPlan>),
}

#[derive(Debug, Clone)]
pub struct UpdatePlan {
    pub access: TableAccess,
    pub filter: Option<Expr>,
    /// `(column, new value)`, the value evaluated against the old row.
    pub assignments: Vec<(usize, Expr, Location)>,
}

#[derive(Debug, Clone)]
pub struct DeletePlan {
    pub access: TableAccess,
    pub filter: Option<Expr>,
}

#[derive(Debug, Clone)]
pub struct SelectPlan {
    /// `None` is the one-row source of `SELECT 1` and `FROM dual`.
    pub source: Option<TableAccess>,
    pub filter: Option<Expr>,
    pub aggregate: Option<Aggregate>,
    pub distinct: bool,
    /// Output expressions: the visible columns, then hidden sort keys.
    pub outputs: Vec<Expr>,
    pub columns: Vec<ColumnMeta>,
    pub order_by: Vec<SortKey>,
    pub limit: Option<u64>,
    pub offset: u64,
}

/// GROUP BY and aggregates. After grouping, a row is the group values followed by
/// the aggregate results; HAVING and the outputs are bound to that row.
#[derive(Debug, Clone)]
pub struct Aggregate {
    pub group_by: Vec<Expr>,
    pub calls: Vec<AggCall>,
    pub having: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AggCall {
    pub func: AggFunc,
    /// `None` for `COUNT(*)`.
    pub arg: Option<Expr>,
    pub distinct: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggFunc {
    Count,
    Sum,
    Min,
    Max,
    Avg,
}

/// One ORDER BY key: a position in the output row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortKey {
    pub column: usize,
    pub desc: bool,
    pub nulls_first: bool,
}

/// Turns an [`ast::ObjectName`] into a [`QualName`] (`[owner.]name`).
pub fn qual_name(name: &ast::ObjectName) -> Result<QualName> {
    let parts: Vec<&ast::Ident> = name
        .0
        .iter()
        .filter_map(|p| match p {
            ast::ObjectNamePart::Identifier(id) => Some(id),
            _ => None,
        })
        .collect();
    let qn: Result<QualName> = match (parts.len() == name.0.len(), parts.as_slice()) {
        (true, [n]) => Ok(QualName::new(None, ident(n))),
        (true, [o, n]) => Ok(QualName::new(Some(ident(o)), ident(n))),
        _ => Err(ErrorKind::InvalidStatement(format!("name {name} must be [owner.]name")).into()),
    };
    qn.at(name.span().start)
}

/// A parsed identifier, folded unless it was double-quoted.
pub fn ident(id: &ast::Ident) -> Ident {
    match id.quote_style {
        Some(_) => Ident::quoted(&id.value),
        None => Ident::unquoted(&id.value),
    }
}

fn unsupported<T>(what: impl Into<String>) -> Result<T> {
    Err(ErrorKind::Unsupported(what.into()).into())
}

/// Plans one statement.
pub fn plan(stmt: &ast::Statement, catalog: &dyn Catalog) -> Result<Plan> {
    use ast::Statement as S;
    match stmt {
        S::CreateTable(ct) => plan_create_table(ct),
        S::Drop {
            object_type,
            if_exists,
            names,
            ..
        } => {
            let [name] = names.as_slice() else {
                return unsupported("DROP takes one name at a time");
            };
            let name = qual_name(name)?;
            match object_type {
                ast::ObjectType::Table => Ok(Plan::DropTable {
                    name,
                    if_exists: *if_exists,
                }),
                ast::ObjectType::Sequence => Ok(Plan::DropSequence {
                    name,
                    if_exists: *if_exists,
                }),
                other => unsupported(format!("DROP {other} is not supported")),
            }
        }
        S::AlterTable(at) => plan_alter_table(at),
        S::CreateSequence {
            name,
            sequence_options,
            ..
        } => plan_create_sequence(name, sequence_options),
        S::Insert(ins) => plan_insert(ins, catalog),
        S::Update(up) => plan_update(up, catalog),
        S::Delete(del) => plan_delete(del, catalog),
        S::Query(q) => Ok(Plan::Select(plan_query(q, catalog)?)),
        S::StartTransaction { .. } => Ok(Plan::Begin),
        S::Commit { .. } => Ok(Plan::Commit),
        S::Rollback {
            savepoint: None, ..
        } => Ok(Plan::Rollback),
        S::Explain {
            statement, analyze, ..
        } => {
            let explainable =
                |s: &S| matches!(s, S::Query(_) | S::Insert(_) | S::Update(_) | S::Delete(_));
            // Checked before planning the inner statement, so `EXPLAIN EXPLAIN ...` does
            // not recurse.
            if !explainable(statement) {
                return unsupported("EXPLAIN takes SELECT, INSERT, UPDATE or DELETE");
            }
            let inner = plan(statement, catalog)?;
            Ok(Plan::Explain {
                plan: Box::new(inner),
                analyze: *analyze,
            })
        }
        other => {
            let text = other.to_string();
            let head: String = text
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            unsupported(format!("statement {head} ... is not supported"))
        }
    }
}

fn plan_create_table(ct: &ast::CreateTable) -> Result<Plan> {
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

fn plan_alter_table(at: &ast::AlterTable) -> Result<Plan> {
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

fn plan_create_sequence(name: &ast::ObjectName, options: &[ast::SequenceOptions]) -> Result<Plan> {
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

/// The table a DML statement or a FROM clause names, with its alias.
fn single_table(
    twj: &[ast::TableWithJoins],
    catalog: &dyn Catalog,
) -> Result<Option<(Arc<TableDef>, Option<Ident>)>> {
    let [t] = twj else {
        return if twj.is_empty() {
            Ok(None)
        } else {
            unsupported("only one table per statement is supported (no joins)")
        };
    };
    if !t.joins.is_empty() {
        return unsupported("joins are not supported");
    }
    let ast::TableFactor::Table { name, alias, .. } = &t.relation else {
        return unsupported("FROM takes a table name");
    };
    let qn = qual_name(name)?;
    match catalog.table(&qn) {
        Some(def) => Ok(Some((def, alias.as_ref().map(|a| ident(&a.name))))),
        None if qn.owner.is_none() && qn.name.as_str() == "dual" => Ok(None),
        None => Err(Error::from(ErrorKind::UndefinedTable(qn)).or_at(name.span().start)),
    }
}

fn table_named(name: &ast::ObjectName, catalog: &dyn Catalog) -> Result<Arc<TableDef>> {
    let qn = qual_name(name)?;
    catalog
        .table(&qn)
        .ok_or_else(|| Error::from(ErrorKind::UndefinedTable(qn)).or_at(name.span().start))
}

fn plan_insert(ins: &ast::Insert, catalog: &dyn Catalog) -> Result<Plan> {
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

fn plan_update(up: &ast::Update, catalog: &dyn Catalog) -> Result<Plan> {
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

fn plan_delete(del: &ast::Delete, catalog: &dyn Catalog) -> Result<Plan> {
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
const AGG_BASE: usize = usize::MAX / 2;

/// The one table in scope and the names it answers to.
struct TableScope<'a> {
    table: &'a TableDef,
    alias: Option<Ident>,
}

impl<'a> TableScope<'a> {
    fn new(table: &'a Arc<TableDef>, alias: Option<Ident>) -> Self {
        TableScope {
            table: table.as_ref(),
            alias,
        }
    }

    /// Whether `q` (the qualifier in `q.col`) names this table.
    fn answers_to(&self, owner: Option<&Ident>, q: &Ident) -> bool {
        match (&self.alias, owner) {
            (Some(a), None) if a == q => true,
            (Some(_), _) => false,
            (None, owner) => {
                &self.table.name.name == q
                    && (owner.is_none() || owner == self.table.name.owner.as_ref())
            }
        }
    }
}

/// Binds AST expressions to [`Expr`] within a scope.
///
/// Binding is where [`MAX_EXPR_DEPTH`] is enforced, so it must not itself recurse
/// through a parsed expression deeper than that: it descends one level at a time and
/// asks sqlparser for a node's span (which recurses through the whole node) only once
/// the node is bound, or when the node is a leaf.
struct Binder<'a> {
    scope: Option<TableScope<'a>>,
    /// How many levels deep the expression being bound is at this point.
    depth: Cell<usize>,
}

/// One level of [`Binder::depth`], given back when dropped.
struct Level<'b>(&'b Cell<usize>);

impl Drop for Level<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

impl<'a> Binder<'a> {
    fn new(scope: Option<TableScope<'a>>) -> Self {
        Binder {
            scope,
            depth: Cell::new(0),
        }
    }

    /// Enters one more level of the expression being bound.
    fn descend(&self) -> Result<Level<'_>> {
        let depth = self.depth.get() + 1;
        if depth > MAX_EXPR_DEPTH {
            return Err(limits::too_deep().into());
        }
        self.depth.set(depth);
        Ok(Level(&self.depth))
    }

    fn column_type(&self, i: usize) -> Option<DataType> {
        self.scope
            .as_ref()
            .and_then(|s| s.table.columns.get(i))
            .map(|c| c.data_type)
    }

    /// The column an UPDATE's SET names.
    fn column_of_name(&self, name: &ast::ObjectName) -> Result<usize> {
        let qn = qual_name(name)?;
        let Some(scope) = &self.scope else {
            return Err(ErrorKind::UndefinedColumn(format!("column {qn} does not exist")).into());
        };
        scope.table.column_index(&qn.name).ok_or_else(|| {
            Error::from(ErrorKind::UndefinedColumn(format!(
                "column {} of table {} does not exist",
                qn.name, scope.table.name
            )))
            .or_at(name.span().start)
        })
    }

    /// Binds an expression where aggregates are not allowed.
    fn bind(&self, e: &ast::Expr) -> Result<Expr> {
        self.bind_in(e, None)
    }

    /// Binds an expression where aggregates are allowed, collecting them in `calls`.
    fn bind_agg(&self, e: &ast::Expr, calls: &mut Vec<AggCall>) -> Result<Expr> {
        self.bind_in(e, Some(calls))
    }

    fn bind_in(&self, e: &ast::Expr, calls: Option<&mut Vec<AggCall>>) -> Result<Expr> {
        let _level = self.descend()?;
        // Each kind of node has a function of its own, and what a level does besides
        // recursing is in further functions, whose frames are gone when it recurses:
        // with one function for all of it a debug build spent 11 KB of stack per level.
        use ast::Expr as A;
        match e {
            A::Nested(inner) => self.bind_in(inner, calls),
            A::UnaryOp { op, expr } => self.unary(e, op, expr, calls),
            A::BinaryOp { left, op, right } => self.binary(e, left, op, right, calls),
            A::IsNull(x) => self.is_null(x, false, calls),
            A::IsNotNull(x) => self.is_null(x, true, calls),
            A::In {
                expr,
                target: ast::InTarget::List(list),
                negated,
                ..
            } => self.in_list(expr, list, *negated, calls),
            A::In { .. } | A::Subquery(_) | A::Exists { .. } => {
                unsupported("subqueries are not supported")
            }
            A::Between {
                expr,
                negated,
                low,
                high,
            } => self.between(expr, low, high, *negated, calls),
            A::Like {
                negated,
                any: false,
                expr,
                pattern,
                escape_char,
            }
            | A::ILike {
                negated,
                any: false,
                expr,
                pattern,
                escape_char,
            } => {
                let how = (*negated, matches!(e, A::ILike { .. }));
                self.like(expr, pattern, escape_char.as_deref(), how, calls)
            }
            A::Cast {
                expr, data_type, ..
            } => self.cast(e, expr, data_type, calls),
            A::Case {
                operand,
                conditions,
                else_result,
                ..
            } => self.case(
                operand.as_deref(),
                conditions,
                else_result.as_deref(),
                calls,
            ),
            A::Function(f) => self.function(f, calls),
            other => self.leaf(other),
        }
    }

    /// A node with no operands to bind.
    fn leaf(&self, e: &ast::Expr) -> Result<Expr> {
        use ast::Expr as A;
        match e {
            A::Identifier(id) => self.column(None, id),
            A::CompoundIdentifier(ids) => self.compound(ids),
            A::Value(v) => Ok(Expr::Literal(literal(&v.value).at(v.span.start)?)),
            A::TypedString(ts) => typed_string(e, ts),
            other => unsupported_expr(other),
        }
    }

    fn unary(
        &self,
        e: &ast::Expr,
        op: &ast::UnaryOperator,
        operand: &ast::Expr,
        calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let op = unary_op(op)?;
        if let Some(literal) = negative_literal(e, op, operand) {
            return literal;
        }
        let operand = self.bind_in(operand, calls)?;
        Ok(Expr::Unary {
            op,
            expr: Box::new(operand),
        })
    }

    fn binary(
        &self,
        e: &ast::Expr,
        left: &ast::Expr,
        op: &ast::BinaryOperator,
        right: &ast::Expr,
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let op = binary_op(op)?;
        let l = self.bind_in(left, calls.as_deref_mut())?;
        let r = self.bind_in(right, calls)?;
        Ok(self.binary_node(
            op,
            l,
            r,
            op_location(left, right).unwrap_or_else(|| e.span().start),
        ))
    }

    fn binary_node(&self, op: BinOp, mut l: Expr, mut r: Expr, at: Location) -> Expr {
        if op.is_comparison() {
            self.fit_literal(&l, &mut r);
            self.fit_literal(&r, &mut l);
        }
        Expr::Binary {
            op,
            left: Box::new(l),
            right: Box::new(r),
            at,
        }
    }

    fn is_null(
        &self,
        operand: &ast::Expr,
        negated: bool,
        calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        Ok(Expr::IsNull {
            expr: Box::new(self.bind_in(operand, calls)?),
            negated,
        })
    }

    fn in_list(
        &self,
        operand: &ast::Expr,
        list: &[ast::Expr],
        negated: bool,
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let target = self.bind_in(operand, calls.as_deref_mut())?;
        let mut items = Vec::new();
        for item in list {
            let mut b = self.bind_in(item, calls.as_deref_mut())?;
            self.fit_literal(&target, &mut b);
            items.push(b);
        }
        Ok(Expr::InList {
            expr: Box::new(target),
            list: items,
            negated,
        })
    }

    fn between(
        &self,
        operand: &ast::Expr,
        low: &ast::Expr,
        high: &ast::Expr,
        negated: bool,
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let target = self.bind_in(operand, calls.as_deref_mut())?;
        let mut low = self.bind_in(low, calls.as_deref_mut())?;
        let mut high = self.bind_in(high, calls)?;
        self.fit_literal(&target, &mut low);
        self.fit_literal(&target, &mut high);
        Ok(Expr::Between {
            expr: Box::new(target),
            low: Box::new(low),
            high: Box::new(high),
            negated,
        })
    }

    /// `LIKE` or `ILIKE`; `how` is (NOT, case-insensitive).
    fn like(
        &self,
        operand: &ast::Expr,
        pattern: &ast::Expr,
        escape: Option<&ast::Expr>,
        (negated, case_insensitive): (bool, bool),
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let escape = match escape {
            None => None,
            Some(ast::Expr::Value(v)) => match &v.value {
                ast::Value::SingleQuotedString(s) if s.chars().count() == 1 => s.chars().next(),
                _ => {
                    return Err(Error::from(ErrorKind::InvalidStatement(
                        "ESCAPE must be a single character".into(),
                    ))
                    .or_at(v.span.start))
                }
            },
            Some(_) => return unsupported("ESCAPE must be a literal"),
        };
        Ok(Expr::Like {
            expr: Box::new(self.bind_in(operand, calls.as_deref_mut())?),
            pattern: Box::new(self.bind_in(pattern, calls)?),
            escape,
            negated,
            case_insensitive,
        })
    }

    fn cast(
        &self,
        e: &ast::Expr,
        operand: &ast::Expr,
        data_type: &ast::DataType,
        calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let operand = self.bind_in(operand, calls)?;
        Ok(Expr::Cast {
            expr: Box::new(operand),
            to: map_type(data_type).at(e.span().start)?,
        })
    }

    fn case(
        &self,
        operand: Option<&ast::Expr>,
        conditions: &[ast::CaseWhen],
        else_result: Option<&ast::Expr>,
        mut calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let operand = match operand {
            Some(o) => Some(Box::new(self.bind_in(o, calls.as_deref_mut())?)),
            None => None,
        };
        let mut whens = Vec::new();
        for cw in conditions {
            let when = self.bind_in(&cw.condition, calls.as_deref_mut())?;
            whens.push((when, self.bind_in(&cw.result, calls.as_deref_mut())?));
        }
        let otherwise = match else_result {
            Some(o) => Some(Box::new(self.bind_in(o, calls)?)),
            None => None,
        };
        Ok(Expr::Case {
            operand,
            whens,
            otherwise,
        })
    }

    /// When a comparison sets a column against a text literal, reads the literal as the
    /// column's type once, at plan time: `d = '2026-01-02'` compares dates, and a
    /// `CHAR(n)` column compares with the literal blank-padded, as Oracle does. A literal
    /// that does not fit stays as it is (the comparison then says why at run time).
    fn fit_literal(&self, column: &Expr, other: &mut Expr) {
        let (Expr::Column(i), Expr::Literal(v @ Value::Text(_))) = (column, &*other) else {
            return;
        };
        let Some(ty) = self.column_type(*i) else {
            return;
        };
        if matches!(ty, DataType::Varchar(_)) {
            return;
        }
        if let Ok(fitted) = coerce(v.clone(), &ty) {
            *other = Expr::Literal(fitted);
        }
    }

    fn column(
        &self,
        owner_and_table: Option<(Option<&Ident>, &Ident)>,
        id: &ast::Ident,
    ) -> Result<Expr> {
        let name = ident(id);
        let Some(scope) = &self.scope else {
            return Err(Error::from(ErrorKind::UndefinedColumn(format!(
                "column {name} does not exist (the statement reads no table)"
            )))
            .or_at(id.span.start));
        };
        if let Some((owner, q)) = owner_and_table {
            if !scope.answers_to(owner, q) {
                return Err(Error::from(ErrorKind::UndefinedTable(QualName::new(
                    owner.cloned(),
                    q.clone(),
                )))
                .or_at(id.span.start));
            }
        }
        match scope.table.column_index(&name) {
            Some(i) => Ok(Expr::Column(i)),
            None => Err(Error::from(ErrorKind::UndefinedColumn(format!(
                "column {name} of table {} does not exist",
                scope.table.name
            )))
            .or_at(id.span.start)),
        }
    }

    /// `t.c`, `owner.t.c`, `seq.NEXTVAL`, `owner.seq.CURRVAL`.
    fn compound(&self, ids: &[ast::Ident]) -> Result<Expr> {
        let names: Vec<Ident> = ids.iter().map(ident).collect();
        let last = names.last().map(|n| n.as_str().to_ascii_lowercase());
        let seq_op = match last.as_deref() {
            Some("nextval") => Some(SeqOp::NextVal),
            Some("currval") => Some(SeqOp::CurrVal),
            _ => None,
        };
        let (owner, q) = match names.as_slice() {
            [q, _] => (None, q),
            [o, q, _] => (Some(o), q),
            _ => {
                return unsupported(format!(
                    "name {} has too many parts",
                    ids.iter()
                        .map(|i| i.value.as_str())
                        .collect::<Vec<_>>()
                        .join(".")
                ))
            }
        };
        let is_table = self.scope.as_ref().is_some_and(|s| s.answers_to(owner, q));
        match seq_op {
            Some(op) if !is_table || self.column_is_missing(&names[names.len() - 1]) => {
                Ok(Expr::Sequence {
                    name: QualName::new(owner.cloned(), q.clone()),
                    op,
                })
            }
            _ => self.column(Some((owner, q)), &ids[ids.len() - 1]),
        }
    }

    fn column_is_missing(&self, name: &Ident) -> bool {
        self.scope
            .as_ref()
            .is_none_or(|s| s.table.column_index(name).is_none())
    }

    /// A function call. Its errors that point nowhere point at its name (not at the
    /// whole call, whose span would recurse through arguments not yet bound).
    fn function(&self, f: &ast::Function, mut calls: Option<&mut Vec<AggCall>>) -> Result<Expr> {
        let at = f.name.span().start;
        let parts = call_parts(f).at(at)?;
        if let Some(func) = aggregate_func(&parts.name) {
            return self.aggregate(func, &parts, calls).at(at);
        }
        let func = scalar_func(&parts.name).at(at)?;
        let mut args = Vec::with_capacity(parts.args.len());
        for a in &parts.args {
            let e = scalar_arg(a, &parts.name).at(at)?;
            args.push(self.bind_in(e, calls.as_deref_mut()).at(at)?);
        }
        check_arity(func, &parts.name, args.len()).at(at)?;
        Ok(Expr::Func { func, args })
    }

    /// An aggregate call: bound as the column its result will be in.
    fn aggregate(
        &self,
        func: AggFunc,
        parts: &CallParts<'_>,
        calls: Option<&mut Vec<AggCall>>,
    ) -> Result<Expr> {
        let name = &parts.name;
        let Some(calls) = calls else {
            return Err(ErrorKind::Grouping(format!(
                "aggregate function {} is not allowed here",
                name.to_uppercase()
            ))
            .into());
        };
        let arg = match parts.args.as_slice() {
            [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)]
                if func == AggFunc::Count && !parts.distinct =>
            {
                None
            }
            // Arguments of an aggregate may not hold another aggregate.
            [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e))] => Some(self.bind(e)?),
            _ => {
                return Err(ErrorKind::InvalidStatement(format!(
                    "{} takes one argument",
                    name.to_uppercase()
                ))
                .into())
            }
        };
        let call = AggCall {
            func,
            arg,
            distinct: parts.distinct,
        };
        let j = match calls.iter().position(|c| *c == call) {
            Some(j) => j,
            None => {
                calls.push(call);
                calls.len() - 1
            }
        };
        Ok(Expr::Column(AGG_BASE + j))
    }
}

/// A function call's name and arguments, read before any argument is bound.
struct CallParts<'e> {
    /// Folded to lower case.
    name: String,
    args: Vec<&'e ast::FunctionArg>,
    distinct: bool,
}

fn call_parts(f: &ast::Function) -> Result<CallParts<'_>> {
    let name = match f.name.0.as_slice() {
        [ast::ObjectNamePart::Identifier(id)] => id.value.to_ascii_lowercase(),
        _ => return unsupported(format!("function {} is not supported", f.name)),
    };
    if f.over.is_some() || f.filter.is_some() || !f.within_group.is_empty() {
        return unsupported("window functions, FILTER and WITHIN GROUP are not supported");
    }
    let (args, distinct) = match &f.args {
        ast::FunctionArguments::None => (Vec::new(), false),
        ast::FunctionArguments::List(list) => (
            list.args.iter().collect(),
            matches!(
                list.duplicate_treatment,
                Some(ast::DuplicateTreatment::Distinct)
            ),
        ),
        ast::FunctionArguments::Subquery(_) => return unsupported("subqueries are not supported"),
    };
    Ok(CallParts {
        name,
        args,
        distinct,
    })
}

fn aggregate_func(name: &str) -> Option<AggFunc> {
    Some(match name {
        "count" => AggFunc::Count,
        "sum" => AggFunc::Sum,
        "min" => AggFunc::Min,
        "max" => AggFunc::Max,
        "avg" => AggFunc::Avg,
        _ => return None,
    })
}

fn scalar_func(name: &str) -> Result<Func> {
    match Func::by_name(name) {
        Some(func) => Ok(func),
        None => unsupported(format!("function {} is not supported", name.to_uppercase())),
    }
}

fn scalar_arg<'e>(a: &'e ast::FunctionArg, name: &str) -> Result<&'e ast::Expr> {
    match a {
        ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => Ok(e),
        _ => unsupported(format!("arguments of {name} must be expressions")),
    }
}

fn check_arity(func: Func, name: &str, n: usize) -> Result<()> {
    let ok = match func {
        Func::Coalesce => n > 0,
        _ => n == 1,
    };
    if ok {
        return Ok(());
    }
    Err(ErrorKind::InvalidStatement(format!(
        "wrong number of arguments for {}",
        name.to_uppercase()
    ))
    .into())
}

fn unary_op(op: &ast::UnaryOperator) -> Result<UnaryOp> {
    match op {
        ast::UnaryOperator::Not => Ok(UnaryOp::Not),
        ast::UnaryOperator::Minus => Ok(UnaryOp::Minus),
        ast::UnaryOperator::Plus => Ok(UnaryOp::Plus),
        other => unsupported(format!("operator {other} is not supported")),
    }
}

/// `-9223372036854775808` must read as one literal, not overflow on negation.
fn negative_literal(e: &ast::Expr, op: UnaryOp, operand: &ast::Expr) -> Option<Result<Expr>> {
    let (UnaryOp::Minus, ast::Expr::Value(v)) = (op, operand) else {
        return None;
    };
    let ast::Value::Number(n, _) = &v.value else {
        return None;
    };
    Some(
        expr::parse_number(&format!("-{n}"))
            .at(e.span().start)
            .map(Expr::Literal),
    )
}

fn binary_op(op: &ast::BinaryOperator) -> Result<BinOp> {
    use ast::BinaryOperator as B;
    Ok(match op {
        B::Plus => BinOp::Add,
        B::Minus => BinOp::Sub,
        B::Multiply => BinOp::Mul,
        B::Divide => BinOp::Div,
        B::Modulo => BinOp::Mod,
        B::StringConcat => BinOp::Concat,
        B::Eq => BinOp::Eq,
        B::NotEq => BinOp::NotEq,
        B::Lt => BinOp::Lt,
        B::LtEq => BinOp::LtEq,
        B::Gt => BinOp::Gt,
        B::GtEq => BinOp::GtEq,
        B::And => BinOp::And,
        B::Or => BinOp::Or,
        other => return unsupported(format!("operator {other} is not supported")),
    })
}

/// `DATE '2026-01-02'` and the like: the text read as the type at plan time.
fn typed_string(e: &ast::Expr, ts: &ast::TypedString) -> Result<Expr> {
    let at = e.span().start;
    let ty = map_type(&ts.data_type).at(at)?;
    let text = match &ts.value.value {
        ast::Value::SingleQuotedString(s) => s.clone(),
        other => other.to_string(),
    };
    Ok(Expr::Literal(coerce(Value::Text(text), &ty).at(at)?))
}

/// An expression kind hawser does not evaluate.
fn unsupported_expr(e: &ast::Expr) -> Result<Expr> {
    let text = e.to_string();
    let err = Error::from(ErrorKind::Unsupported(format!(
        "expression {} is not supported",
        shortened(&text)
    )));
    // Every level prints at least one character, so a short text is a shallow
    // expression, whose span is safe to take (see [`Binder`]).
    Err(if text.len() <= MAX_EXPR_DEPTH {
        err.or_at(e.span().start)
    } else {
        err
    })
}

/// `text` cut to a length fit for a message.
fn shortened(text: &str) -> String {
    const SHOWN: usize = 80;
    match text.char_indices().nth(SHOWN) {
        Some((i, _)) => format!("{} ...", &text[..i]),
        None => text.to_string(),
    }
}

/// Where the operator of `left op right` stands: just after the left operand.
fn op_location(left: &ast::Expr, _right: &ast::Expr) -> Option<Location> {
    let end = left.span().end;
    (end.line > 0).then_some(end)
}

/// The value of a literal.
fn literal(v: &ast::Value) -> Result<Value> {
    use ast::Value as V;
    match v {
        V::Number(n, _) => expr::parse_number(n),
        V::SingleQuotedString(s)
        | V::NationalStringLiteral(s)
        | V::EscapedStringLiteral(s)
        | V::TripleSingleQuotedString(s) => Ok(Value::Text(s.clone())),
        V::HexStringLiteral(h) => hex(h).map(Value::Bytes),
        V::Boolean(b) => Ok(Value::Bool(*b)),
        V::Null => Ok(Value::Null),
        V::DoubleQuotedString(s) => Err(ErrorKind::UndefinedColumn(format!(
            "column \"{s}\" does not exist (strings take single quotes)"
        ))
        .into()),
        other => unsupported(format!("literal {other} is not supported")),
    }
}

fn hex(h: &str) -> Result<Vec<u8>> {
    let bad = || ErrorKind::InvalidText(format!("invalid hexadecimal literal X'{h}'"));
    if !h.len().is_multiple_of(2) {
        return Err(bad().into());
    }
    (0..h.len())
        .step_by(2)
        .map(|i| {
            h.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(|| bad().into())
        })
        .collect()
}

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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use sqlparser::dialect::GenericDialect;
    use sqlparser::parser::Parser;

    use super::*;

    struct Tables(HashMap<QualName, Arc<TableDef>>);

    impl Catalog for Tables {
        fn table(&self, name: &QualName) -> Option<Arc<TableDef>> {
            self.0.get(name).cloned()
        }
    }

    fn catalog() -> Tables {
        let col = |n: &str, t| ColumnDef {
            name: Ident::unquoted(n),
            data_type: t,
            nullable: true,
            default: None,
        };
        let t = TableDef {
            name: QualName::bare("t"),
            columns: vec![
                col("k", DataType::Integer),
                col("c", DataType::Char(3)),
                col("nextval", DataType::Integer),
            ],
            primary_key: vec![0],
            explicit_key: true,
        };
        Tables(HashMap::from([(t.name.clone(), Arc::new(t))]))
    }

    fn plan_sql(sql: &str) -> Result<Plan> {
        let stmts = Parser::parse_sql(&GenericDialect {}, sql).expect("parses");
        plan(&stmts[0], &catalog())
    }

    fn select(sql: &str) -> SelectPlan {
        match plan_sql(sql).expect("plans") {
            Plan::Select(s) => s,
            other => panic!("not a select: {other:?}"),
        }
    }

    #[test]
    fn create_table_maps_keys_and_nullability() {
        let Plan::CreateTable(def) =
            plan_sql("create table x (a int, b varchar2(5) not null, primary key (b, a))")
                .expect("plans")
        else {
            panic!("not a create table");
        };
        assert_eq!(def.primary_key, vec![1, 0]);
        assert!(def.explicit_key);
        assert!(def.columns.iter().all(|c| !c.nullable));
        let Plan::CreateTable(def) = plan_sql("create table x (a int, b int)").expect("plans")
        else {
            panic!("not a create table");
        };
        assert_eq!(def.primary_key, vec![0, 1]);
        assert!(!def.explicit_key);
    }

    #[test]
    fn where_on_the_key_becomes_key_predicates() {
        let s = select("select c from t where k = 1 + 1 and c = 'a'");
        let access = s.source.expect("a table");
        assert_eq!(access.keys.columns[0].len(), 1);
        // The CHAR(3) literal is padded at plan time.
        let mut padded = false;
        s.filter.expect("filter").walk(&mut |e| {
            if *e == Expr::Literal(Value::Text("a  ".into())) {
                padded = true;
            }
        });
        assert!(padded);
    }

    #[test]
    fn order_by_alias_position_and_hidden_expression() {
        let s = select("select k as x, c from t order by x desc, 2, k + 1");
        assert_eq!(s.columns.len(), 2);
        assert_eq!(s.outputs.len(), 3, "k + 1 is a hidden sort column");
        let cols: Vec<usize> = s.order_by.iter().map(|k| k.column).collect();
        assert_eq!(cols, vec![0, 1, 2]);
        assert!(s.order_by[0].desc && !s.order_by[0].nulls_first);
    }

    #[test]
    fn aggregates_rebind_to_the_grouped_row() {
        let s = select("select c, count(*), max(k) + 1 from t group by c having count(*) > 1");
        let agg = s.aggregate.expect("aggregate");
        assert_eq!(agg.calls.len(), 2, "COUNT(*) is computed once");
        assert_eq!(s.outputs[0], Expr::Column(0));
        assert_eq!(s.outputs[1], Expr::Column(1));
        assert_eq!(s.columns[1].data_type, "BIGINT");
        let e = plan_sql("select k, count(*) from t").unwrap_err();
        assert_eq!(e.kind.code(), "42803");
        assert!(e.kind.to_string().contains("column k"), "{}", e.kind);
    }

    #[test]
    fn nextval_resolves_to_a_sequence_unless_the_table_has_such_a_column() {
        let s = select("select s.nextval, t.nextval from t");
        assert!(
            matches!(&s.outputs[0], Expr::Sequence { op: SeqOp::NextVal, name } if name.name.as_str() == "s")
        );
        assert_eq!(s.outputs[1], Expr::Column(2));
        assert_eq!(s.columns[0].name, "s.nextval");
    }

    #[test]
    fn unknown_names_point_at_themselves() {
        let e = plan_sql("select k from t where zz = 1").unwrap_err();
        assert_eq!(e.kind.code(), "42703");
        assert_eq!(e.at, Some(Location::new(1, 23)));
        let e = plan_sql("select * from nope").unwrap_err();
        assert_eq!(e.kind.code(), "42P01");
        assert_eq!(e.at, Some(Location::new(1, 15)));
    }
}
