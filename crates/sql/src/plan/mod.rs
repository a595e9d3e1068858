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
//!
//! Submodules: `ddl` plans CREATE, ALTER and DROP; `dml` INSERT, UPDATE and DELETE;
//! `select` queries; `scope` finds the table a statement names; `bind` binds
//! expressions within that scope; `syntax` reads AST nodes that need no scope.

mod bind;
mod ddl;
mod dml;
mod scope;
mod select;
mod syntax;

use std::sync::Arc;

use hawser_core::{ColumnDef, Ident, QualName, TableDef};
use sqlparser::ast::{self, Spanned};
use sqlparser::tokenizer::Location;

use crate::access::KeyPredicates;
use crate::error::{At, ErrorKind, Result};
use crate::expr::Expr;
use crate::outcome::ColumnMeta;

use self::ddl::{plan_alter_table, plan_create_sequence, plan_create_table};
use self::dml::{plan_delete, plan_insert, plan_update};
pub use self::select::plan_query;

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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use hawser_core::{DataType, Value};
    use sqlparser::dialect::GenericDialect;
    use sqlparser::parser::Parser;

    use super::*;
    use crate::expr::SeqOp;

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
