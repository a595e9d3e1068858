//! Rows as the apply sees them while it simulates a batch in log order, the DB2
//! exception rules that apply one change to them, and the conflict checks of a
//! received transaction against them.

use std::collections::{BTreeMap, HashMap};

use hawser_core::{ChangeOp, QualName, Row, RowChange};

use super::prepare::{PreparedChange, PreparedTxn, Slot};
use crate::conflict::Found;
use crate::db::{Inner, TableRef};
use crate::error::StoreError;

/// Rows as the apply sees them: the committed row the first time a key is read
/// (remembered in `before`), then the apply's own writes. Per table index
/// ([`Prepared::tables`](super::prepare::Prepared::tables)), keyed by encoded key, so
/// a lookup borrows the key.
pub(super) struct Overlay<'a> {
    inner: &'a Inner,
    /// The committed version of every key read, as it was before this apply.
    pub(super) before: Vec<BTreeMap<Vec<u8>, Option<Row>>>,
    /// The version after the changes simulated so far, for every key written.
    pub(super) after: Vec<BTreeMap<Vec<u8>, Option<Row>>>,
}

impl<'a> Overlay<'a> {
    pub(super) fn new(inner: &'a Inner, tables: usize) -> Self {
        Self {
            inner,
            before: vec![BTreeMap::new(); tables],
            after: vec![BTreeMap::new(); tables],
        }
    }

    pub(super) fn committed(
        &mut self,
        tables: &[TableRef],
        table: usize,
        enc: &[u8],
    ) -> Result<Option<Row>, StoreError> {
        if let Some(row) = self.before[table].get(enc) {
            return Ok(row.clone());
        }
        let row = self.inner.get_row(&tables[table], enc)?;
        self.before[table].insert(enc.to_vec(), row.clone());
        Ok(row)
    }

    /// [`Overlay::current`], borrowed.
    fn current_ref(
        &mut self,
        tables: &[TableRef],
        table: usize,
        enc: &[u8],
    ) -> Result<Option<&Row>, StoreError> {
        if !self.after[table].contains_key(enc) && !self.before[table].contains_key(enc) {
            let row = self.inner.get_row(&tables[table], enc)?;
            self.before[table].insert(enc.to_vec(), row);
        }
        Ok(match self.after[table].get(enc) {
            Some(row) => row.as_ref(),
            None => self.before[table].get(enc).and_then(Option::as_ref),
        })
    }

    fn current(
        &mut self,
        tables: &[TableRef],
        table: usize,
        enc: &[u8],
    ) -> Result<Option<Row>, StoreError> {
        match self.after[table].get(enc) {
            Some(row) => Ok(row.clone()),
            None => self.committed(tables, table, enc),
        }
    }

    fn set(&mut self, table: usize, enc: &[u8], row: Option<Row>) {
        match self.after[table].get_mut(enc) {
            Some(version) => *version = row,
            None => {
                self.after[table].insert(enc.to_vec(), row);
            }
        }
    }
}

/// Applies one change to the overlay with the DB2 exception rules and returns the
/// changes it amounts to here (what the log record holds).
pub(super) fn apply_change(
    ov: &mut Overlay<'_>,
    tables: &[TableRef],
    name: &QualName,
    c: &PreparedChange,
) -> Result<Vec<RowChange>, StoreError> {
    let change = |op, key: &Row, before: Option<Row>, after: Option<Row>| RowChange {
        table: name.clone(),
        op,
        key: key.clone(),
        before,
        after,
    };
    let t = c.table;
    let Some((row, row_key, row_enc)) = &c.after else {
        // Delete: of a row that is here; a missing row is ignored.
        return Ok(match ov.current(tables, t, &c.enc)? {
            Some(before) => {
                ov.set(t, &c.enc, None);
                vec![change(ChangeOp::Delete, &c.key, Some(before), None)]
            }
            None => Vec::new(),
        });
    };
    let at_new = ov.current(tables, t, row_enc)?;
    let mut out = Vec::new();
    if c.op == ChangeOp::Update && row_enc != &c.enc {
        // An update that moves the row to another key.
        match (ov.current(tables, t, &c.enc)?, at_new) {
            (Some(before), None) => {
                ov.set(t, &c.enc, None);
                out.push(change(
                    ChangeOp::Update,
                    &c.key,
                    Some(before),
                    Some(row.clone()),
                ));
            }
            (Some(before), Some(there)) => {
                // The new key is taken here: the row there is replaced (insert of an
                // existing key → update).
                ov.set(t, &c.enc, None);
                out.push(change(ChangeOp::Delete, &c.key, Some(before), None));
                out.push(change(
                    ChangeOp::Update,
                    row_key,
                    Some(there),
                    Some(row.clone()),
                ));
            }
            // Update of a missing row → insert of the after-image.
            (None, None) => out.push(change(ChangeOp::Insert, row_key, None, Some(row.clone()))),
            (None, Some(there)) => out.push(change(
                ChangeOp::Update,
                row_key,
                Some(there),
                Some(row.clone()),
            )),
        }
    } else {
        // Insert, or an update that keeps the key: insert of an existing key → update,
        // update of a missing row → insert.
        out.push(match at_new {
            Some(before) => change(ChangeOp::Update, row_key, Some(before), Some(row.clone())),
            None => change(ChangeOp::Insert, row_key, None, Some(row.clone())),
        });
    }
    ov.set(t, row_enc, Some(row.clone()));
    Ok(out)
}

/// The conflicts of one received transaction's changes of checked tables
/// ([`crate::conflict`]), each decided against the row as the changes before it in the
/// transaction would leave it (the overlay is not changed here).
pub(super) fn check_conflicts(
    ov: &mut Overlay<'_>,
    tables: &[TableRef],
    pt: &PreparedTxn<'_>,
    rules: &HashMap<QualName, crate::conflict::ConflictRule>,
) -> Result<Vec<Found>, StoreError> {
    let mut found = Vec::new();
    // Rows as this transaction's applied changes of checked tables leave them; only a
    // transaction of several changes can read its own writes.
    let several = pt.changes.len() > 1;
    let mut scratch: HashMap<Slot, Option<Row>> = HashMap::new();
    for (i, (c, src)) in pt.changes.iter().zip(&pt.src.txn.changes).enumerate() {
        let Some(rule) = rules.get(&src.table) else {
            continue;
        };
        let def = &tables[c.table].def;
        let Some(column) = def.column_index(&rule.column) else {
            continue;
        };
        let incoming = match &c.after {
            Some((row, _, _)) => Some(row),
            None => src.before.as_ref(),
        };
        let own = several
            .then(|| scratch.get(&(c.table, c.enc.clone())))
            .flatten();
        let verdict = match own {
            Some(row) => crate::conflict::verdict(c.op, incoming, row.as_ref(), column),
            None => crate::conflict::verdict(
                c.op,
                incoming,
                ov.current_ref(tables, c.table, &c.enc)?,
                column,
            ),
        };
        match verdict {
            crate::conflict::Verdict::Apply if several => match &c.after {
                None => {
                    scratch.insert((c.table, c.enc.clone()), None);
                }
                Some((row, _, row_enc)) => {
                    if row_enc != &c.enc {
                        scratch.insert((c.table, c.enc.clone()), None);
                    }
                    scratch.insert((c.table, row_enc.clone()), Some(row.clone()));
                }
            },
            crate::conflict::Verdict::Apply => {}
            crate::conflict::Verdict::Conflict => {
                let here = match own {
                    Some(row) => row.clone(),
                    None => ov.current(tables, c.table, &c.enc)?,
                };
                found.push(Found {
                    change_no: i,
                    op: c.op,
                    key: c.key.clone(),
                    incoming: incoming.cloned(),
                    here,
                    column,
                    rollback: rule.rollback,
                })
            }
        }
    }
    Ok(found)
}
