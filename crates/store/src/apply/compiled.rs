//! The apply of a run as the net operations of its RTL compilation, and the row writes
//! those operations amount to here under the DB2 rules.

use std::collections::BTreeMap;

use hawser_core::key::encode_key;
use hawser_rtl::{Compilation, NetOp};

use super::overlay::Overlay;
use super::prepare::RowVersions;
use super::{ApplyInfo, ReplicatedTxn};
use crate::db::{Database, TableRef};
use crate::error::StoreError;
use crate::rows::{coerce_key, key_text, validate_row};

impl Database {
    /// Applies a run as the net operations of its RTL compilation, in one atomic batch
    /// sorted by key, together with the log records of every transaction of the run.
    ///
    /// `compiled` must be `hawser_rtl::compile` of exactly `run`'s transactions. The
    /// run is applied in log order instead ([`Database::apply_replicated`]) when:
    /// it is not compilable; a net update lacks its whole after-row (it could not be
    /// inserted if the row is missing here, while the log has every after-image); or
    /// part of the run is already here (net operations describe the whole run, so
    /// they must not be written over a state inside it).
    ///
    /// Net operations are written with the DB2 rules: insert and replace put the row,
    /// update puts its after-row, delete removes the row if it is here. Applied from
    /// the state before the run or after it, this gives the same table as the run in
    /// log order (the one exception is in `docs/rtl.md`).
    pub async fn apply_compiled(
        &self,
        run: &[ReplicatedTxn],
        compiled: &Compilation,
    ) -> Result<ApplyInfo, StoreError> {
        let durable = self.inner.opts.durable_commits;
        self.apply_compiled_as(run, compiled, durable).await
    }

    /// [`Database::apply_compiled`] without waiting for the flush (see
    /// [`Database::apply_replicated_lazily`]).
    pub async fn apply_compiled_lazily(
        &self,
        run: &[ReplicatedTxn],
        compiled: &Compilation,
    ) -> Result<ApplyInfo, StoreError> {
        self.apply_compiled_as(run, compiled, false).await
    }

    async fn apply_compiled_as(
        &self,
        run: &[ReplicatedTxn],
        compiled: &Compilation,
        durable: bool,
    ) -> Result<ApplyInfo, StoreError> {
        let Some(tables) = compiled.tables() else {
            return self.apply_internal(run, None, durable).await;
        };
        if compiled.counts.transactions != run.len() as u64 {
            return Err(StoreError::InvalidBatch(format!(
                "the compilation covers {} transactions, the run has {}",
                compiled.counts.transactions,
                run.len()
            )));
        }
        let whole_rows = tables
            .iter()
            .flat_map(|t| &t.operations)
            .all(|op| !matches!(op, NetOp::Update { after: None, .. }));
        let net = whole_rows.then_some(tables);
        self.apply_internal(run, net, durable).await
    }
}

/// The row writes of compiled net operations, sorted by table and key, with the DB2
/// rules: insert and replace put their row, an update puts its after-row (an insert
/// when the row is missing here), a delete removes the row only if it is here.
pub(super) fn net_writes(
    ov: &mut Overlay<'_>,
    tables: &[TableRef],
    net: &[(usize, &[NetOp])],
) -> Result<RowVersions, StoreError> {
    let mut writes = BTreeMap::new();
    for &(table, ops) in net {
        let def = &tables[table].def;
        for op in ops {
            let key = coerce_key(def, op.key(), false)?;
            let enc = encode_key(&key);
            let row = match op {
                // A replace is a delete and an insert of the same key; in one batch
                // the put of the new row is exactly that.
                NetOp::Insert { row, .. } | NetOp::Replace { row, .. } => Some(row),
                NetOp::Update {
                    after: Some(row), ..
                } => Some(row),
                NetOp::Update { after: None, .. } => {
                    return Err(StoreError::InvalidBatch(format!(
                        "net update of table {}, key ({}), without its whole after-row",
                        def.name,
                        key_text(&key)
                    )))
                }
                NetOp::Delete { .. } => None,
            };
            match row {
                Some(row) => {
                    let row = validate_row(def, row.clone())?;
                    if encode_key(&def.key_of(&row)) != enc {
                        return Err(StoreError::InvalidBatch(format!(
                            "net operation on table {}, key ({}), carries a row of another key",
                            def.name,
                            key_text(&key)
                        )));
                    }
                    writes.insert((table, enc), Some(row));
                }
                None => {
                    if ov.committed(tables, table, &enc)?.is_some() {
                        writes.insert((table, enc), None);
                    }
                }
            }
        }
    }
    Ok(writes)
}
