//! Receiver-side apply: transactions committed at other origins, written here.
//!
//! A subscriber or propagator applies what a sender ships (docs/design.md §2, §4), either
//! in log order ([`Database::apply_replicated`]) or as the net operations of an RTL
//! compilation of the run ([`Database::apply_compiled`], docs/design.md §6):
//!
//! ```text
//!  batch (log order) ──► order check ──► skip seq ≤ high-water ──► resolve tables,
//!                                        (idempotent by Gtid)      validate rows
//!        ──► row locks (sorted) ──► commit mutex:
//!              log-order simulation on an overlay, DB2 exception rules
//!                → one log record per applied transaction (new LSN, original
//!                  Gtid and epoch, images as they were HERE)
//!              row writes: the overlay's final rows (log order)
//!                       or the compiled net operations (bulk)
//!              + high-water per origin ─── ONE atomic batch ───► engine  (write)
//!        ──► group flush (durable commits)                                (flush)
//!        ──► release row locks, return ApplyInfo                          (ack)
//! ```
//!
//! The DB2 exception rules (`db2-apply-rules`, docs/design.md §7) make apply idempotent:
//! an insert whose key exists is applied as an update, an update whose row is missing
//! as an insert of its after-image, a delete of a missing row is ignored. The log
//! record describes what the apply did *here* — an insert that found its key is
//! recorded as an update with the row it replaced — so that rolling back a divergent
//! transaction from before-images restores exactly what this node held.
//!
//! DDL from another origin ([`Database::apply_replicated_ddl`]) runs through the same
//! catalog code as local DDL, keeping its original Gtid, with the same idempotence.
//!
//! One apply runs at a time (the apply lock): only applies advance other origins'
//! high-water marks, so the marks an apply reads stay true until its batch is written.
//! It is released before the flush, so the next batch is written while this one
//! flushes and one flush often covers both.
//! Row locks keep an apply from interleaving with local transactions on the same rows,
//! and are held until the batch is durable, as a local commit holds its own.
//!
//! * `pipeline`: the course of every apply, from the order check to the ack.
//! * `prepare`: a batch resolved against the catalog, and the rows it locks.
//! * `overlay`: rows as the apply sees them, the DB2 exception rules, conflict checks.
//! * `write`: the write step under the commit mutex: log records and row writes.
//! * `compiled`: the apply of a run as the net operations of its RTL compilation.
//! * `ddl`: DDL statements and sequence blocks from other origins.
//! * `crate::apply_metrics`: the apply's counters (a part the database owns).

mod compiled;
mod ddl;

mod overlay;
mod pipeline;
mod prepare;
mod write;

use std::collections::BTreeMap;

use hawser_core::{Epoch, Gtid, Lsn, NodeId, Transaction};

use crate::db::{Database, Flusher};
use crate::error::StoreError;

/// One transaction as a receiver gets it: committed at its origin (`txn.gtid`) under
/// the element epoch `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicatedTxn {
    pub txn: Transaction,
    pub epoch: Epoch,
}

/// What an apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyInfo {
    /// Transactions applied (each now has a log record here).
    pub applied: u64,
    /// Transactions skipped because their seq was at or below their origin's
    /// high-water: already here.
    pub skipped: u64,
    /// Row changes carried by the applied transactions.
    pub row_changes: u64,
    /// Row puts and deletes written to the engine. Writes go through an overlay, so a
    /// key changed several times in one batch is written once, and a delete of a row
    /// that is not here writes nothing.
    pub rows_written: u64,
    /// Whether the rows were written from compiled net operations (`false`: log order).
    pub compiled: bool,
    /// LSN of the last log record written; [`Lsn::ZERO`] when nothing was applied.
    pub last_lsn: Lsn,
    /// Whether everything the batch covers (applied or skipped) was flushed before
    /// return; `false` only with `durable_commits = false`.
    pub durable: bool,
    /// The high-water of every origin after the apply (as [`Database::high_waters`]).
    pub high_water: BTreeMap<NodeId, u64>,
}

impl Database {
    /// Applies transactions received from other origins, in log order.
    ///
    /// * Per origin the batch must be in strictly increasing seq order (else
    ///   [`StoreError::InvalidBatch`]); a transaction at or below its origin's
    ///   high-water is skipped, so a batch received twice changes nothing; a gap is
    ///   fine (a sender skips transactions that carry nothing for this receiver).
    /// * Every applied transaction's changes go through the DB2 exception rules and
    ///   get a log record here: the next local LSN, the original Gtid and epoch, the
    ///   before-images as they were here.
    /// * All of the batch — rows, records, high-waters — is one atomic engine batch,
    ///   flushed before return unless `durable_commits` is off. The flush leaves its
    ///   housekeeping for [`Database::settle`] (or the next flush): the receiver
    ///   acknowledges first.
    /// * A table named by an applied change must exist: otherwise
    ///   [`StoreError::Replicated`] names the Gtid and the table, and nothing is applied.
    pub async fn apply_replicated(
        &self,
        batch: Vec<ReplicatedTxn>,
    ) -> Result<ApplyInfo, StoreError> {
        let durable = self.inner.opts.durable_commits;
        self.apply_internal(&batch, None, durable).await
    }

    /// [`Database::apply_replicated`] without waiting for the flush (`ApplyInfo.durable`
    /// is `false`): for a receiver nobody's commit waits on, which makes its applies
    /// durable with [`Database::flush`] now and then instead of once per batch.
    pub async fn apply_replicated_lazily(
        &self,
        batch: Vec<ReplicatedTxn>,
    ) -> Result<ApplyInfo, StoreError> {
        self.apply_internal(&batch, None, false).await
    }

    /// Does the housekeeping flushes left for later (a commit's after
    /// [`crate::Txn::settle_later`], a replicated apply's): moves the flushed batches
    /// into the engine's tree. Blocking but short (no I/O wait): call it once the
    /// commit or apply has been acted on, while waiting for the next thing to do.
    pub fn settle(&self) -> Result<(), StoreError> {
        self.inner.engine.settle()
    }

    /// [`Database::flush`], with the work after the sync (moving the flushed batches
    /// into the engine's tree) paced by `pacer`: for a caller nobody waits on.
    pub async fn flush_paced(&self, pacer: &mut crate::pace::Pacer) -> Result<Lsn, StoreError> {
        let upto = self.last_lsn();
        self.inner.wait_durable(upto, Flusher::Apply, false).await?;
        pacer.start();
        self.inner.engine.settle_paced(&mut || pacer.tick())?;
        Ok(upto)
    }

    /// Makes every commit and apply so far durable; returns the LSN it covers.
    pub async fn flush(&self) -> Result<Lsn, StoreError> {
        let upto = self.last_lsn();
        self.inner.wait_durable(upto, Flusher::Apply, true).await?;
        Ok(upto)
    }
    /// Applies the rest of a transaction of another origin that reached this store in
    /// parts, by two streams that each carry some of its tables (two propagators that
    /// relay one master's tables to the same subscriber): its seq is already the
    /// origin's high-water here, from the part applied first, so
    /// [`Database::apply_replicated`] would skip it as a duplicate. `part` must hold
    /// only changes of tables the parts here lack ([`Database::tables_of`]): it is
    /// applied as they are and gets a log record of its own under the same Gtid; the
    /// marks stay. A transaction of the origin's past the high-water, or behind it, is
    /// an error.
    pub async fn apply_part(
        &self,
        part: ReplicatedTxn,
        lazily: bool,
    ) -> Result<ApplyInfo, StoreError> {
        let Gtid { origin, seq } = part.txn.gtid;
        if origin == self.node_id() || seq != self.high_water(origin)? {
            return Err(StoreError::InvalidBatch(format!(
                "transaction {}: only the newest transaction of another origin here \
                 can come in parts (its high-water is {})",
                part.txn.gtid,
                self.high_water(origin)?
            )));
        }
        let durable = !lazily && self.inner.opts.durable_commits;
        self.apply_as(&[part], None, durable, true).await
    }
}
