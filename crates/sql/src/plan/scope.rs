//! The one table a statement reads: found in the catalog by name, with the names
//! (table or alias) its columns may be qualified by.

use std::sync::Arc;

use hawser_core::{Ident, TableDef};
use sqlparser::ast::{self, Spanned};

use super::{ident, qual_name, unsupported, Catalog};
use crate::error::{Error, ErrorKind, Result};

/// The table a DML statement or a FROM clause names, with its alias.
pub(super) fn single_table(
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

pub(super) fn table_named(name: &ast::ObjectName, catalog: &dyn Catalog) -> Result<Arc<TableDef>> {
    let qn = qual_name(name)?;
    catalog
        .table(&qn)
        .ok_or_else(|| Error::from(ErrorKind::UndefinedTable(qn)).or_at(name.span().start))
}

/// The one table in scope and the names it answers to.
pub(super) struct TableScope<'a> {
    pub(super) table: &'a TableDef,
    alias: Option<Ident>,
}

impl<'a> TableScope<'a> {
    pub(super) fn new(table: &'a Arc<TableDef>, alias: Option<Ident>) -> Self {
        TableScope {
            table: table.as_ref(),
            alias,
        }
    }

    /// Whether `q` (the qualifier in `q.col`) names this table.
    pub(super) fn answers_to(&self, owner: Option<&Ident>, q: &Ident) -> bool {
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
