//! The front-end of `hawser rtl compile`: SQL text in log order, net operations out.
//!
//! ```text
//!  script ─► sqlparser ─► CREATE TABLE ─► catalog ─┐
//!                       └► INSERT/UPDATE/DELETE ───┴─► Change per statement ─► Compiler
//!                                                                              │
//!                         render_sql() / to_json() ◄── ScriptOutput ◄──────────┘
//! ```
//!
//! The script is read in two passes so that the compiler can borrow a finished catalog:
//! the first turns every statement into a table definition or one [`Change`], the
//! second compiles. Each DML statement is one transaction.
//!
//! The accepted language is deliberately small. Statements need no `;` between them,
//! and the Sybase forms run as written: `insert T values (1, 10)` without INTO,
//! `delete T where k = 1` without FROM. An UPDATE or DELETE must name one row by its
//! whole primary key with `=` and literals; an UPDATE sets columns to literals. A table
//! without a PRIMARY KEY keys on all its columns. Literals are coerced to the column
//! type: integers (range-checked), decimals (within precision and scale), text
//! (within length; CHAR blank-padded), doubles, booleans and NULL. Anything else is
//! refused with the statement's number, line and column.
//!
//! sqlparser's `GenericDialect` parses the statements. Rather than list every clause
//! this front-end does not support (sqlparser's statements have dozens of optional
//! clauses), each statement is compared with a parsed template after the parts that
//! are read have been copied in: any other clause makes the two differ.
//!
//! Submodules: `render` prints a compiled script as SQL in the script's own spelling
//! or as JSON.

mod render;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use hawser_core::types::MAX_DECIMAL_PRECISION;
use hawser_core::{ColumnDef, DataType, Ident, QualName, Row, TableDef, Value};
use rust_decimal::Decimal;
use sqlparser::ast::{
    self, AssignmentTarget, BinaryOperator, CharacterLength, ColumnOption, CreateTable, Delete,
    ExactNumberInfo, Expr, FromTable, Insert, ObjectName, ObjectNamePart, SetExpr, Spanned,
    Statement, TableConstraint, TableFactor, TableObject, UnaryOperator, Update,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::{Parser, ParserError, ParserOptions};
use sqlparser::tokenizer::{Location, Token};
use thiserror::Error;

use crate::change::{Assignment, Change, ChangeKind};
use crate::compile::{Compilation, Compiler};

/// A statement the front-end refuses, with where it starts.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("statement {statement} (line {line}, column {column}): {problem}")]
pub struct ScriptError {
    /// Number of the statement in the script, from 1.
    pub statement: usize,
    /// Line and column (from 1) of the offending part, or of the statement's start.
    pub line: u64,
    pub column: u64,
    pub problem: ScriptProblem,
}

/// What is wrong with a statement.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ScriptProblem {
    #[error("syntax error: {0}")]
    Syntax(String),
    #[error("only CREATE TABLE, INSERT, UPDATE and DELETE are accepted, not {0}")]
    UnsupportedStatement(String),
    #[error("unsupported clause or form in {0}")]
    UnsupportedForm(&'static str),
    #[error("unsupported column type {0}")]
    UnsupportedType(String),
    #[error("table {0} is already defined")]
    DuplicateTable(QualName),
    #[error("no table {0}; define it with CREATE TABLE first")]
    UnknownTable(QualName),
    #[error("column {0} is named twice")]
    DuplicateColumn(Ident),
    #[error("no column {column} in table {table}")]
    UnknownColumn { table: QualName, column: Ident },
    #[error("more than one PRIMARY KEY")]
    DuplicatePrimaryKey,
    #[error("{expected} values expected, {got} given")]
    ValueCount { expected: usize, got: usize },
    #[error("column {0} is NOT NULL and gets no value")]
    NullNotAllowed(Ident),
    #[error("column {column} ({data_type}): {reason}")]
    BadLiteral {
        column: Ident,
        data_type: DataType,
        reason: String,
    },
    #[error("only literal values are accepted here")]
    NotALiteral,
    #[error("must name one row by its whole primary key ({0}) with `=`")]
    NotOneRow(String),
    #[error("the run could not be compiled: {0}")]
    Compile(String),
}

/// A compiled script: the compilation and what is needed to print it in the
/// script's own spelling.
#[derive(Debug, Clone)]
pub struct ScriptOutput {
    /// The compiler's result; transaction `i` is the `i`-th DML statement.
    pub compilation: Compilation,
    tables: BTreeMap<QualName, Spelling>,
    /// Every DML statement in log order with its number and line.
    log: Vec<LoggedChange>,
}

/// A table as the script wrote it, for printing.
#[derive(Debug, Clone)]
struct Spelling {
    def: TableDef,
    name: String,
    columns: Vec<String>,
}

#[derive(Debug, Clone)]
struct LoggedChange {
    statement: usize,
    line: u64,
    change: Change,
}

/// Reads a script of CREATE TABLE and single-row DML statements in log order and
/// compiles its DML into net operations.
pub fn compile_script(sql: &str) -> Result<ScriptOutput, ScriptError> {
    let mut reader = Reader::default();
    let dialect = GenericDialect {};
    let options = ParserOptions {
        require_semicolon_stmt_delimiter: false,
        ..ParserOptions::default()
    };
    let mut parser = Parser::new(&dialect)
        .with_options(options)
        .try_with_sql(sql)
        .map_err(|e| syntax_error(1, Location::new(1, 1), e))?;
    let mut number = 0;
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        let start = parser.peek_token();
        if start.token == Token::EOF {
            break;
        }
        number += 1;
        let statement = parser
            .parse_statement()
            .map_err(|e| syntax_error(number, start.span.start, e))?;
        reader
            .statement(&statement, number, start.span.start)
            .map_err(|(at, problem)| {
                let at = at.filter(|l| l.line > 0).unwrap_or(start.span.start);
                ScriptError {
                    statement: number,
                    line: at.line,
                    column: at.column,
                    problem,
                }
            })?;
    }
    reader.finish()
}

fn syntax_error(statement: usize, at: Location, e: ParserError) -> ScriptError {
    ScriptError {
        statement,
        line: at.line,
        column: at.column,
        problem: ScriptProblem::Syntax(e.to_string()),
    }
}

/// A problem and, when known more precisely than the statement's start, where.
type Refused = (Option<Location>, ScriptProblem);

fn at(node: &impl Spanned, problem: ScriptProblem) -> Refused {
    (Some(node.span().start), problem)
}

fn at_ident(id: &ast::Ident, problem: ScriptProblem) -> Refused {
    (Some(id.span.start), problem)
}

#[derive(Default)]
struct Reader {
    tables: BTreeMap<QualName, Spelling>,
    log: Vec<LoggedChange>,
}

impl Reader {
    fn statement(
        &mut self,
        statement: &Statement,
        number: usize,
        start: Location,
    ) -> Result<(), Refused> {
        let change = match statement {
            Statement::CreateTable(create) => return self.create_table(create),
            Statement::Insert(insert) => self.insert(insert)?,
            Statement::Update(update) => self.update(update)?,
            Statement::Delete(delete) => self.delete(delete)?,
            other => {
                let text = other.to_string();
                let first = text.split_whitespace().next().unwrap_or_default();
                return Err((
                    None,
                    ScriptProblem::UnsupportedStatement(first.to_uppercase()),
                ));
            }
        };
        self.log.push(LoggedChange {
            statement: number,
            line: start.line,
            change,
        });
        Ok(())
    }

    fn finish(self) -> Result<ScriptOutput, ScriptError> {
        let catalog: BTreeMap<QualName, TableDef> = self
            .tables
            .iter()
            .map(|(name, s)| (name.clone(), s.def.clone()))
            .collect();
        let mut compiler = Compiler::new(&catalog);
        for logged in &self.log {
            compiler
                .push_changes(vec![logged.change.clone()])
                .map_err(|e| ScriptError {
                    statement: logged.statement,
                    line: logged.line,
                    column: 1,
                    problem: ScriptProblem::Compile(e.to_string()),
                })?;
        }
        Ok(ScriptOutput {
            compilation: compiler.finish(),
            tables: self.tables,
            log: self.log,
        })
    }

    fn create_table(&mut self, create: &CreateTable) -> Result<(), Refused> {
        let template = template_create();
        let mut probe = create.clone();
        probe.name = template.name.clone();
        probe.columns = template.columns.clone();
        probe.constraints = template.constraints.clone();
        if &probe != template {
            return Err(at(
                &create.name,
                ScriptProblem::UnsupportedForm("CREATE TABLE"),
            ));
        }
        let name = qual_name(&create.name)?;
        if self.tables.contains_key(&name) {
            return Err(at(&create.name, ScriptProblem::DuplicateTable(name)));
        }
        let mut columns: Vec<ColumnDef> = Vec::new();
        let mut primary_key: Option<Vec<usize>> = None;
        for (index, col) in create.columns.iter().enumerate() {
            let col_name = ident(&col.name);
            if columns.iter().any(|c| c.name == col_name) {
                return Err(at_ident(
                    &col.name,
                    ScriptProblem::DuplicateColumn(col_name),
                ));
            }
            let data_type = data_type(&col.data_type).map_err(|p| at_ident(&col.name, p))?;
            let mut def = ColumnDef {
                name: col_name,
                data_type,
                nullable: true,
                default: None,
            };
            for option in &col.options {
                match &option.option {
                    ColumnOption::Null => def.nullable = true,
                    ColumnOption::NotNull => def.nullable = false,
                    ColumnOption::PrimaryKey(pk) if pk.columns.is_empty() => {
                        if primary_key.replace(vec![index]).is_some() {
                            return Err(at_ident(&col.name, ScriptProblem::DuplicatePrimaryKey));
                        }
                    }
                    ColumnOption::Default(expr) => {
                        let value = literal(expr, &def).map_err(|p| at(expr, p))?;
                        def.default = Some(value);
                    }
                    _ => {
                        return Err(at_ident(
                            &col.name,
                            ScriptProblem::UnsupportedForm("a column"),
                        ))
                    }
                }
            }
            columns.push(def);
        }
        for constraint in &create.constraints {
            let TableConstraint::PrimaryKey(pk) = constraint else {
                return Err(at(
                    constraint,
                    ScriptProblem::UnsupportedForm("a constraint"),
                ));
            };
            if pk.index_name.is_some() || pk.index_type.is_some() || !pk.include.is_empty() {
                return Err(at(
                    constraint,
                    ScriptProblem::UnsupportedForm("PRIMARY KEY"),
                ));
            }
            let mut positions = Vec::new();
            for c in &pk.columns {
                let Expr::Identifier(id) = &c.column.expr else {
                    return Err(at(
                        &c.column.expr,
                        ScriptProblem::UnsupportedForm("PRIMARY KEY"),
                    ));
                };
                let col = ident(id);
                let pos = columns.iter().position(|d| d.name == col).ok_or_else(|| {
                    at_ident(
                        id,
                        ScriptProblem::UnknownColumn {
                            table: name.clone(),
                            column: col.clone(),
                        },
                    )
                })?;
                if positions.contains(&pos) {
                    return Err(at_ident(id, ScriptProblem::DuplicateColumn(col)));
                }
                positions.push(pos);
            }
            if primary_key.replace(positions).is_some() {
                return Err(at(constraint, ScriptProblem::DuplicatePrimaryKey));
            }
        }
        let explicit_key = primary_key.is_some();
        let primary_key = primary_key.unwrap_or_else(|| (0..columns.len()).collect());
        if explicit_key {
            // Key columns are NOT NULL, as in SQL.
            for &i in &primary_key {
                columns[i].nullable = false;
            }
        }
        let spelling = Spelling {
            name: create.name.to_string(),
            columns: create.columns.iter().map(|c| c.name.to_string()).collect(),
            def: TableDef {
                name: name.clone(),
                columns,
                primary_key,
                explicit_key,
            },
        };
        self.tables.insert(name, spelling);
        Ok(())
    }

    fn table(&self, name: &ObjectName) -> Result<&Spelling, Refused> {
        let qual = qual_name(name)?;
        self.tables
            .get(&qual)
            .ok_or_else(|| at(name, ScriptProblem::UnknownTable(qual)))
    }

    fn insert(&self, insert: &Insert) -> Result<Change, Refused> {
        let form = || at(&insert.table, ScriptProblem::UnsupportedForm("INSERT"));
        let template = template_insert();
        let mut probe = insert.clone();
        probe.table = template.table.clone();
        probe.columns = template.columns.clone();
        probe.into = template.into;
        probe.source = template.source.clone();
        if &probe != template {
            return Err(form());
        }
        let TableObject::TableName(table_name) = &insert.table else {
            return Err(form());
        };
        let Some(query) = &insert.source else {
            return Err(form());
        };
        let mut probe_query = query.clone();
        probe_query.body = template
            .source
            .as_ref()
            .map(|q| q.body.clone())
            .ok_or_else(form)?;
        if Some(&probe_query) != template.source.as_ref() {
            return Err(form());
        }
        let SetExpr::Values(values) = query.body.as_ref() else {
            return Err(form());
        };
        let [row_exprs] = values.rows.as_slice() else {
            return Err(form());
        };
        if values.explicit_row {
            return Err(form());
        }
        let table = self.table(table_name)?;
        let def = &table.def;
        // Target positions, in the order the values are given.
        let targets: Vec<usize> = if insert.columns.is_empty() {
            (0..def.columns.len()).collect()
        } else {
            let mut targets = Vec::new();
            for c in &insert.columns {
                let pos = column_of(def, c)?;
                if targets.contains(&pos) {
                    return Err(at(
                        c,
                        ScriptProblem::DuplicateColumn(def.columns[pos].name.clone()),
                    ));
                }
                targets.push(pos);
            }
            targets
        };
        if row_exprs.content.len() != targets.len() {
            return Err(at(
                &insert.table,
                ScriptProblem::ValueCount {
                    expected: targets.len(),
                    got: row_exprs.content.len(),
                },
            ));
        }
        let mut row: Vec<Option<Value>> = vec![None; def.columns.len()];
        for (&pos, expr) in targets.iter().zip(&row_exprs.content) {
            row[pos] = Some(literal(expr, &def.columns[pos]).map_err(|p| at(expr, p))?);
        }
        let mut full = Vec::with_capacity(row.len());
        for (value, col) in row.into_iter().zip(&def.columns) {
            let value = value.or_else(|| col.default.clone()).unwrap_or(Value::Null);
            if value.is_null() && !col.nullable {
                return Err(at(
                    &insert.table,
                    ScriptProblem::NullNotAllowed(col.name.clone()),
                ));
            }
            full.push(value);
        }
        Ok(Change {
            table: def.name.clone(),
            key: def.key_of(&full),
            kind: ChangeKind::Insert { row: full },
        })
    }

    fn update(&self, update: &Update) -> Result<Change, Refused> {
        let form = || at(&update.table, ScriptProblem::UnsupportedForm("UPDATE"));
        let template = template_update();
        let TableFactor::Table { name, .. } = &update.table.relation else {
            return Err(form());
        };
        let mut probe = update.clone();
        if let TableFactor::Table {
            name: probe_name, ..
        } = &mut probe.table.relation
        {
            *probe_name = template_table_name(&template.table.relation).ok_or_else(form)?;
        }
        probe.assignments = template.assignments.clone();
        probe.selection = template.selection.clone();
        if &probe != template {
            return Err(form());
        }
        let table = self.table(name)?;
        let def = &table.def;
        let key = self.where_key(def, update.selection.as_ref(), &update.table)?;
        let mut set: Vec<Assignment> = Vec::new();
        for a in &update.assignments {
            let AssignmentTarget::ColumnName(target) = &a.target else {
                return Err(at(&a.target, ScriptProblem::UnsupportedForm("SET")));
            };
            let column = column_of(def, target)?;
            if set.iter().any(|s| s.column == column) {
                return Err(at(
                    target,
                    ScriptProblem::DuplicateColumn(def.columns[column].name.clone()),
                ));
            }
            let col = &def.columns[column];
            let value = literal(&a.value, col).map_err(|p| at(&a.value, p))?;
            if value.is_null() && !col.nullable {
                return Err(at(
                    &a.value,
                    ScriptProblem::NullNotAllowed(col.name.clone()),
                ));
            }
            set.push(Assignment { column, value });
        }
        Ok(Change {
            table: def.name.clone(),
            key,
            kind: ChangeKind::Update { before: None, set },
        })
    }

    fn delete(&self, delete: &Delete) -> Result<Change, Refused> {
        let template = template_delete();
        let tables = match &delete.from {
            FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => t,
        };
        let Some(first) = tables.first() else {
            return Err((None, ScriptProblem::UnsupportedForm("DELETE")));
        };
        let form = || at(&first.relation, ScriptProblem::UnsupportedForm("DELETE"));
        let TableFactor::Table { name, .. } = &first.relation else {
            return Err(form());
        };
        let mut probe = delete.clone();
        probe.from = template.from.clone();
        probe.selection = template.selection.clone();
        if &probe != template || tables.len() != 1 || !first.joins.is_empty() {
            return Err(form());
        }
        let mut probe_relation = first.relation.clone();
        let template_relation = match &template.from {
            FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => {
                t.first().map(|t| t.relation.clone()).ok_or_else(form)?
            }
        };
        if let TableFactor::Table { name: n, .. } = &mut probe_relation {
            *n = template_table_name(&template_relation).ok_or_else(form)?;
        }
        if probe_relation != template_relation {
            return Err(form());
        }
        let table = self.table(name)?;
        let def = &table.def;
        let key = self.where_key(def, delete.selection.as_ref(), &first.relation)?;
        Ok(Change {
            table: def.name.clone(),
            key,
            kind: ChangeKind::Delete { before: None },
        })
    }

    /// The key a WHERE clause names: `k1 = lit AND k2 = lit ...`, every key column
    /// exactly once and nothing else.
    fn where_key(
        &self,
        def: &TableDef,
        selection: Option<&Expr>,
        statement: &impl Spanned,
    ) -> Result<Row, Refused> {
        let key_names: Vec<String> = def
            .primary_key
            .iter()
            .map(|&i| def.columns[i].name.to_string())
            .collect();
        let not_one_row = || ScriptProblem::NotOneRow(key_names.join(", "));
        let Some(selection) = selection else {
            return Err(at(statement, not_one_row()));
        };
        let mut terms = Vec::new();
        conjuncts(selection, &mut terms);
        let mut key: Vec<Option<Value>> = vec![None; def.primary_key.len()];
        for term in terms {
            let Expr::BinaryOp {
                left,
                op: BinaryOperator::Eq,
                right,
            } = term
            else {
                return Err(at(term, not_one_row()));
            };
            let (column, value) = match (unnest(left), unnest(right)) {
                (Expr::Identifier(id), v) | (v, Expr::Identifier(id)) => (id, v),
                (Expr::CompoundIdentifier(_), _) | (_, Expr::CompoundIdentifier(_)) => {
                    return Err(at(term, ScriptProblem::UnsupportedForm("WHERE")))
                }
                _ => return Err(at(term, not_one_row())),
            };
            let name = ident(column);
            let pos = def.column_index(&name).ok_or_else(|| {
                at_ident(
                    column,
                    ScriptProblem::UnknownColumn {
                        table: def.name.clone(),
                        column: name.clone(),
                    },
                )
            })?;
            let Some(key_pos) = def.primary_key.iter().position(|&k| k == pos) else {
                return Err(at(term, not_one_row()));
            };
            if key[key_pos].is_some() {
                return Err(at(term, not_one_row()));
            }
            let v = literal(value, &def.columns[pos]).map_err(|p| at(value, p))?;
            if v.is_null() {
                // `k = NULL` is never true in SQL: it names no row.
                return Err(at(value, not_one_row()));
            }
            key[key_pos] = Some(v);
        }
        key.into_iter()
            .collect::<Option<Row>>()
            .ok_or_else(|| at(selection, not_one_row()))
    }
}

fn conjuncts<'e>(expr: &'e Expr, out: &mut Vec<&'e Expr>) {
    match unnest(expr) {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(left, out);
            conjuncts(right, out);
        }
        other => out.push(other),
    }
}

fn unnest(mut expr: &Expr) -> &Expr {
    while let Expr::Nested(inner) = expr {
        expr = inner;
    }
    expr
}

fn template(sql: &str) -> Statement {
    // The templates are fixed text that this front-end's own tests parse.
    Parser::parse_sql(&GenericDialect {}, sql)
        .ok()
        .and_then(|mut s| s.pop())
        .unwrap_or_else(|| panic!("template {sql:?} must parse"))
}

fn template_create() -> &'static CreateTable {
    static T: OnceLock<CreateTable> = OnceLock::new();
    T.get_or_init(|| match template("create table t (k int)") {
        Statement::CreateTable(c) => c,
        other => panic!("template parsed as {other:?}"),
    })
}

fn template_insert() -> &'static Insert {
    static T: OnceLock<Insert> = OnceLock::new();
    T.get_or_init(|| match template("insert t values (0)") {
        Statement::Insert(i) => i,
        other => panic!("template parsed as {other:?}"),
    })
}

fn template_update() -> &'static Update {
    static T: OnceLock<Update> = OnceLock::new();
    T.get_or_init(|| match template("update t set c = 0 where k = 0") {
        Statement::Update(u) => u,
        other => panic!("template parsed as {other:?}"),
    })
}

fn template_delete() -> &'static Delete {
    static T: OnceLock<Delete> = OnceLock::new();
    T.get_or_init(|| match template("delete t where k = 0") {
        Statement::Delete(d) => d,
        other => panic!("template parsed as {other:?}"),
    })
}

fn template_table_name(relation: &TableFactor) -> Option<ObjectName> {
    match relation {
        TableFactor::Table { name, .. } => Some(name.clone()),
        _ => None,
    }
}

fn ident(id: &ast::Ident) -> Ident {
    match id.quote_style {
        Some(_) => Ident::quoted(&id.value),
        None => Ident::unquoted(&id.value),
    }
}

fn qual_name(name: &ObjectName) -> Result<QualName, Refused> {
    let parts: Vec<&ast::Ident> = name
        .0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(id) => Some(id),
            ObjectNamePart::Function(_) => None,
        })
        .collect::<Option<_>>()
        .ok_or_else(|| at(name, ScriptProblem::UnsupportedForm("a table name")))?;
    match parts.as_slice() {
        [name] => Ok(QualName::new(None, ident(name))),
        [owner, name] => Ok(QualName::new(Some(ident(owner)), ident(name))),
        _ => Err(at(name, ScriptProblem::UnsupportedForm("a table name"))),
    }
}

fn column_of(def: &TableDef, name: &ObjectName) -> Result<usize, Refused> {
    let [ObjectNamePart::Identifier(id)] = name.0.as_slice() else {
        return Err(at(name, ScriptProblem::UnsupportedForm("a column name")));
    };
    let column = ident(id);
    def.column_index(&column).ok_or_else(|| {
        at_ident(
            id,
            ScriptProblem::UnknownColumn {
                table: def.name.clone(),
                column,
            },
        )
    })
}

fn data_type(t: &ast::DataType) -> Result<DataType, ScriptProblem> {
    use ast::DataType as T;
    let unsupported = || ScriptProblem::UnsupportedType(t.to_string());
    let length = |len: &Option<CharacterLength>, default: u32| match len {
        None => Ok(default),
        Some(CharacterLength::IntegerLength { length, .. }) => {
            u32::try_from(*length).map_err(|_| unsupported())
        }
        Some(CharacterLength::Max) => Ok(u32::MAX),
    };
    Ok(match t {
        T::Boolean | T::Bool => DataType::Boolean,
        T::TinyInt(_) => DataType::TinyInt,
        T::SmallInt(_) | T::Int2(_) => DataType::SmallInt,
        T::Int(_) | T::Integer(_) | T::Int4(_) => DataType::Integer,
        T::BigInt(_) | T::Int8(_) | T::Int64 => DataType::BigInt,
        T::Decimal(info) | T::Numeric(info) | T::Dec(info) => match info {
            ExactNumberInfo::None => DataType::Decimal {
                precision: None,
                scale: 0,
            },
            ExactNumberInfo::Precision(p) => decimal_type(*p, 0).ok_or_else(unsupported)?,
            ExactNumberInfo::PrecisionAndScale(p, s) => {
                let s = u64::try_from(*s).map_err(|_| unsupported())?;
                decimal_type(*p, s).ok_or_else(unsupported)?
            }
        },
        T::Double(_) | T::DoublePrecision | T::Float(_) | T::Float64 | T::Real => DataType::Double,
        T::Char(len) | T::Character(len) => DataType::Char(length(len, 1)?),
        T::Varchar(len) | T::CharacterVarying(len) | T::Nvarchar(len) => {
            DataType::Varchar(length(len, u32::MAX)?)
        }
        T::Text => DataType::Varchar(u32::MAX),
        _ => return Err(unsupported()),
    })
}

fn decimal_type(precision: u64, scale: u64) -> Option<DataType> {
    let p = u8::try_from(precision).ok()?;
    let s = u8::try_from(scale).ok()?;
    (1..=MAX_DECIMAL_PRECISION)
        .contains(&p)
        .then_some(())
        .filter(|_| s <= p)
        .map(|_| DataType::Decimal {
            precision: Some(p),
            scale: s,
        })
}

/// The value of a literal expression coerced to `col`'s type.
fn literal(expr: &Expr, col: &ColumnDef) -> Result<Value, ScriptProblem> {
    let bad = |reason: String| ScriptProblem::BadLiteral {
        column: col.name.clone(),
        data_type: col.data_type,
        reason,
    };
    let (negative, value) = match unnest(expr) {
        Expr::Value(v) => (false, &v.value),
        Expr::UnaryOp { op, expr: inner } => match (op, unnest(inner)) {
            (UnaryOperator::Minus, Expr::Value(v)) => (true, &v.value),
            (UnaryOperator::Plus, Expr::Value(v)) => (false, &v.value),
            _ => return Err(ScriptProblem::NotALiteral),
        },
        _ => return Err(ScriptProblem::NotALiteral),
    };
    let number = |text: &str| {
        if negative {
            format!("-{text}")
        } else {
            text.to_string()
        }
    };
    match (value, col.data_type) {
        (ast::Value::Null, _) if !negative => Ok(Value::Null),
        (ast::Value::Boolean(b), DataType::Boolean) if !negative => Ok(Value::Bool(*b)),
        (ast::Value::Number(text, _), t) if t.is_integer() => {
            let n: i64 = number(text)
                .parse()
                .map_err(|_| bad(format!("{} is not an integer", number(text))))?;
            let (lo, hi) = t.int_range().unwrap_or((i64::MIN, i64::MAX));
            if n < lo || n > hi {
                return Err(bad(format!("{n} is out of range")));
            }
            Ok(Value::Int(n))
        }
        (ast::Value::Number(text, _), DataType::Decimal { precision, scale }) => {
            let text = number(text);
            let mut d = Decimal::from_str_exact(&text)
                .or_else(|_| Decimal::from_scientific(&text))
                .map_err(|_| bad(format!("{text} is not a decimal")))?;
            if let Some(p) = precision {
                if d.scale() > u32::from(scale) {
                    return Err(bad(format!("{text} has more than {scale} decimal places")));
                }
                d.rescale(u32::from(scale));
                let digits = d.mantissa().unsigned_abs().to_string().len();
                if digits > usize::from(p) {
                    return Err(bad(format!("{text} needs more than {p} digits")));
                }
            }
            Ok(Value::Decimal(d))
        }
        (ast::Value::Number(text, _), DataType::Double) => number(text)
            .parse::<f64>()
            .map(Value::Double)
            .map_err(|_| bad(format!("{} is not a number", number(text)))),
        (ast::Value::SingleQuotedString(s), DataType::Char(n)) if !negative => {
            let len = s.chars().count();
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if len > n {
                return Err(bad(format!("'{s}' is longer than {n} characters")));
            }
            Ok(Value::Text(format!("{s}{}", " ".repeat(n - len))))
        }
        (ast::Value::SingleQuotedString(s), DataType::Varchar(n)) if !negative => {
            if s.chars().count() > usize::try_from(n).unwrap_or(usize::MAX) {
                return Err(bad(format!("'{s}' is longer than {n} characters")));
            }
            Ok(Value::Text(s.clone()))
        }
        (other, _) => Err(bad(format!(
            "{}{other} does not fit the column",
            if negative { "-" } else { "" }
        ))),
    }
}
