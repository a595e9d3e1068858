//! DDL statements and sequence blocks from other origins, applied through the catalog
//! code local DDL uses, idempotently by their origin's high-water.

use hawser_core::{Epoch, Lsn};

use super::{ApplyInfo, ReplicatedTxn};
use crate::db::{Database, Flusher, Origin};
use crate::error::StoreError;
use crate::log::{DdlOp, LogEntry};

impl Database {
    /// Applies a DDL statement received from another origin (a [`LogEntry::Ddl`] read
    /// from the sender's log), with the same idempotence as row changes: at or below
    /// its origin's high-water it is skipped. Otherwise it runs here as it ran at the
    /// origin and its log record keeps the original Gtid, epoch and commit time; the
    /// catalog change, the record and the high-water are one atomic batch, flushed
    /// before return (DDL always is). A statement that fails here (the table exists
    /// already, ...) is [`StoreError::Replicated`] naming the Gtid; nothing changes.
    pub async fn apply_replicated_ddl(
        &self,
        entry: &LogEntry,
        epoch: Epoch,
    ) -> Result<ApplyInfo, StoreError> {
        let (gtid, commit_micros, op) = match entry {
            LogEntry::Ddl {
                gtid,
                commit_micros,
                op,
            } => (*gtid, commit_micros, Some(op)),
            LogEntry::SequenceBlock {
                gtid,
                commit_micros,
                ..
            } => (*gtid, commit_micros, None),
            LogEntry::Txn(_) => {
                return Err(StoreError::InvalidBatch(format!(
                    "transaction {} is not a DDL statement or sequence block",
                    entry.gtid()
                )))
            }
        };
        // One apply at a time, as for row changes: the mark read here stays true.
        let _serial = self.inner.apply_lock.lock().await;
        if gtid.seq <= self.high_water(gtid.origin)? {
            self.inner.apply_metrics.skipped.increment(1);
            let durable = self.inner.opts.durable_commits;
            if durable {
                self.inner
                    .wait_durable(self.last_lsn(), Flusher::Apply, true)
                    .await?;
            }
            return Ok(ApplyInfo {
                applied: 0,
                skipped: 1,
                row_changes: 0,
                rows_written: 0,
                compiled: false,
                last_lsn: Lsn::ZERO,
                durable,
                high_water: self.high_waters()?,
            });
        }
        // Already so here (the table was created on both sides before a DATASTORE
        // scheme shipped its CREATE TABLE, or dropped on both): nothing to change, but
        // the statement is recorded as applied, as an empty transaction.
        let already = match op {
            Some(DdlOp::CreateTable(def)) => self.table(&def.name).is_some_and(|t| *t == *def),
            Some(DdlOp::DropTable(name)) => self.table(name).is_none(),
            Some(DdlOp::CreateSequence(def)) => self.sequence(&def.name).is_some_and(|s| s == *def),
            Some(DdlOp::DropSequence(name)) => self.sequence(name).is_none(),
            Some(DdlOp::AddColumn { .. }) | None => false,
        };
        if already {
            drop(_serial);
            let noop = ReplicatedTxn {
                txn: hawser_core::Transaction {
                    gtid,
                    commit_micros: *commit_micros,
                    changes: Vec::new(),
                },
                epoch,
            };
            return self
                .apply_internal(&[noop], None, self.inner.opts.durable_commits)
                .await;
        }
        let origin = Origin::Replicated {
            gtid,
            epoch,
            commit_micros: *commit_micros,
        };
        let done = match (op, entry) {
            (Some(DdlOp::CreateTable(def)), _) => self.create_table_as(def.clone(), origin).await,
            (Some(DdlOp::DropTable(name)), _) => self.drop_table_as(name, origin).await,
            (Some(DdlOp::AddColumn { table, column }), _) => {
                self.add_column_as(table, column.clone(), origin).await
            }
            (Some(DdlOp::CreateSequence(def)), _) => {
                self.create_sequence_as(def.clone(), origin).await
            }
            (Some(DdlOp::DropSequence(name)), _) => self.drop_sequence_as(name, origin).await,
            (
                None,
                LogEntry::SequenceBlock {
                    name, restart_at, ..
                },
            ) => self.advance_sequence_as(name, *restart_at, origin).await,
            (None, other) => Err(StoreError::InvalidBatch(format!(
                "transaction {} is not a DDL statement or sequence block",
                other.gtid()
            ))),
        }
        .map_err(|source| StoreError::Replicated {
            gtid,
            source: Box::new(source),
        })?;
        self.inner.apply_metrics.applied.increment(1);
        Ok(ApplyInfo {
            applied: 1,
            skipped: 0,
            row_changes: 0,
            rows_written: 0,
            compiled: false,
            last_lsn: done.lsn,
            durable: done.durable,
            high_water: self.high_waters()?,
        })
    }
}
