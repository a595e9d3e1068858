//! The compiler's input model: one row change of one table, in either of two forms.
//!
//! The commit log records every change with full before- and after-images
//! ([`RowChange`]). Other producers — the `hawser rtl compile` script front-end, a
//! statement-level feed — know less: an update may carry only the columns it set, and
//! the row as it was before may be unknown. Both forms become a [`Change`]:
//!
//! ```text
//!   RowChange (full images) ──Change::from_row_change──┐
//!                                                      ├─► Change { table, key, kind }
//!   statement-level producer ──Change { .. } directly──┘
//! ```
//!
//! An update from full images keeps its before-image and sets exactly the columns whose
//! value changed, so "later wins per column" merging treats both forms alike.
//!
//! A [`Catalog`] gives the compiler each table's definition: it needs the key columns
//! to see that an update changes a row's key, and the column count to check rows.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use hawser_core::{ChangeOp, QualName, Row, RowChange, TableDef, Value};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Where the compiler looks up table definitions.
pub trait Catalog {
    /// The definition of `name`, `None` when there is no such table.
    fn table(&self, name: &QualName) -> Option<&TableDef>;
}

impl Catalog for [TableDef] {
    fn table(&self, name: &QualName) -> Option<&TableDef> {
        self.iter().find(|t| &t.name == name)
    }
}

impl Catalog for Vec<TableDef> {
    fn table(&self, name: &QualName) -> Option<&TableDef> {
        self.as_slice().table(name)
    }
}

impl Catalog for BTreeMap<QualName, TableDef> {
    fn table(&self, name: &QualName) -> Option<&TableDef> {
        self.get(name)
    }
}

impl<S: BuildHasher> Catalog for HashMap<QualName, TableDef, S> {
    fn table(&self, name: &QualName) -> Option<&TableDef> {
        self.get(name)
    }
}

/// One column set by an update: its position in the table and its new value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub column: usize,
    pub value: Value,
}

/// One row change as the compiler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub table: QualName,
    /// The key of the row the change applies to (for an update that changes the key,
    /// the old key; the new one follows from the key columns it sets).
    pub key: Row,
    pub kind: ChangeKind,
}

/// What a [`Change`] does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ChangeKind {
    /// A new row, all columns given.
    Insert { row: Row },
    /// Sets some columns of an existing row. `before` is the whole row before the
    /// update when the producer knows it.
    Update {
        before: Option<Row>,
        set: Vec<Assignment>,
    },
    /// Removes a row; `before` is the row removed when the producer knows it.
    Delete { before: Option<Row> },
}

impl Change {
    /// The operation in the commit log's vocabulary.
    pub fn op(&self) -> ChangeOp {
        match self.kind {
            ChangeKind::Insert { .. } => ChangeOp::Insert,
            ChangeKind::Update { .. } => ChangeOp::Update,
            ChangeKind::Delete { .. } => ChangeOp::Delete,
        }
    }

    /// Converts a commit-log change with full images. An update sets the columns whose
    /// value differs between its images.
    pub fn from_row_change(change: &RowChange, def: &TableDef) -> Result<Change, ChangeProblem> {
        let missing = |image| ChangeProblem::MissingImage {
            op: change.op,
            image,
        };
        let unexpected = |image| ChangeProblem::UnexpectedImage {
            op: change.op,
            image,
        };
        let kind = match change.op {
            ChangeOp::Insert => {
                if change.before.is_some() {
                    return Err(unexpected("before"));
                }
                let row = change.after.clone().ok_or_else(|| missing("after"))?;
                ChangeKind::Insert { row }
            }
            ChangeOp::Update => {
                let before = change.before.as_ref().ok_or_else(|| missing("before"))?;
                let after = change.after.as_ref().ok_or_else(|| missing("after"))?;
                check_width(def, after)?;
                check_width(def, before)?;
                let set = before
                    .iter()
                    .zip(after)
                    .enumerate()
                    .filter(|(_, (b, a))| b != a)
                    .map(|(column, (_, a))| Assignment {
                        column,
                        value: a.clone(),
                    })
                    .collect();
                ChangeKind::Update {
                    before: Some(before.clone()),
                    set,
                }
            }
            ChangeOp::Delete => {
                if change.after.is_some() {
                    return Err(unexpected("after"));
                }
                let before = change.before.clone().ok_or_else(|| missing("before"))?;
                ChangeKind::Delete {
                    before: Some(before),
                }
            }
        };
        let converted = Change {
            table: change.table.clone(),
            key: change.key.clone(),
            kind,
        };
        converted.check(def)?;
        Ok(converted)
    }

    /// Checks the change against its table's definition: row widths, the key against
    /// the images, assignments in range and not repeated.
    pub fn check(&self, def: &TableDef) -> Result<(), ChangeProblem> {
        if self.key.len() != def.primary_key.len() {
            return Err(ChangeProblem::KeyWidth {
                expected: def.primary_key.len(),
                got: self.key.len(),
            });
        }
        let image = match &self.kind {
            ChangeKind::Insert { row } => Some(row),
            ChangeKind::Update { before, set } => {
                let mut seen = vec![false; def.columns.len()];
                for a in set {
                    match seen.get_mut(a.column) {
                        None => return Err(ChangeProblem::ColumnOutOfRange { column: a.column }),
                        Some(true) => {
                            return Err(ChangeProblem::DuplicateAssignment { column: a.column })
                        }
                        Some(s) => *s = true,
                    }
                }
                before.as_ref()
            }
            ChangeKind::Delete { before } => before.as_ref(),
        };
        if let Some(row) = image {
            check_width(def, row)?;
            if def.key_of(row) != self.key {
                return Err(ChangeProblem::KeyMismatch);
            }
        }
        Ok(())
    }
}

fn check_width(def: &TableDef, row: &[Value]) -> Result<(), ChangeProblem> {
    if row.len() == def.columns.len() {
        Ok(())
    } else {
        Err(ChangeProblem::RowWidth {
            expected: def.columns.len(),
            got: row.len(),
        })
    }
}

/// Why one input change is malformed. Malformed input is an error, unlike a
/// well-formed run that merely cannot be reduced (see `NotCompilable`).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ChangeProblem {
    #[error("no table {0} in the catalog")]
    UnknownTable(QualName),
    #[error("{op:?} without its {image} image")]
    MissingImage { op: ChangeOp, image: &'static str },
    #[error("{op:?} must not carry an {image} image")]
    UnexpectedImage { op: ChangeOp, image: &'static str },
    #[error("row has {got} values, the table has {expected} columns")]
    RowWidth { expected: usize, got: usize },
    #[error("key has {got} values, the table's key has {expected} columns")]
    KeyWidth { expected: usize, got: usize },
    #[error("the key does not match the key columns of the row image")]
    KeyMismatch,
    #[error("update sets column {column}, which the table does not have")]
    ColumnOutOfRange { column: usize },
    #[error("update sets column {column} twice")]
    DuplicateAssignment { column: usize },
}
