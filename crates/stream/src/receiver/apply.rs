//! The apply of a backlog into the store: the I/O edge of [`super::runs`].
//!
//! A backlog's records are read in log order and gathered into runs as the rules of
//! [`super::runs`] say; each run, the second part of a transaction that came in parts,
//! and each DDL record is written by the store, and what the backlog applied is
//! returned for the stream's acks and counters ([`Applied`]).

use std::collections::BTreeMap;

use hawser_core::{NodeId, TableDef, Transaction};
use hawser_store::{ApplyInfo, LogEntry, Pacer, ReplicatedTxn, StoreError};
use tracing::debug;

use super::accepted::Accepted;
use super::acks::note_decided;
use super::backlog::BacklogPlan;
use super::hello::check_epochs;
use super::runs::{
    add_slice, check_forked, compile_run, compiles_run, decode_batch, join_part,
    may_be_second_part, note_received, rest_of, run_mode, slice_len, RunMode, Tally, LOOK_BACK,
};
use super::{ReceiverService, Refusal};
use crate::codec::WireRecord;
use crate::pb::{self, RefuseCode};

/// What one backlog's apply did.
pub(super) struct Applied {
    /// What was decided of the backlog as a whole.
    pub(super) plan: BacklogPlan,
    /// The highest seq of each origin in the backlog: applied (or found here already).
    pub(super) received: BTreeMap<NodeId, u64>,
    /// Every run of the backlog was flushed before the apply returned.
    pub(super) flushed: bool,
    pub(super) tally: Tally,
    /// A sender's decision moved a mark ([`crate::paths::DecidedMarks`]).
    pub(super) decided_moved: bool,
}

/// A batch of at least this many raw bytes is decoded off the async workers.
const DECODE_OFF_WORKER_BYTES: u64 = 1 << 20;

impl ReceiverService {
    /// Applies a backlog of batches (log order across them); in slices with pauses
    /// between them when `pacer` is given.
    pub(super) async fn apply_backlog(
        &self,
        accepted: &mut Accepted,
        backlog: &[pb::Batch],
        mut pacer: Option<&mut Pacer>,
    ) -> Result<Applied, Refusal> {
        // Epochs are checked on every batch: a master change since Hello makes this
        // sender stale from that moment on.
        check_epochs(
            &accepted.elements,
            &self.epochs.borrow(),
            &self.config.store,
        )?;
        let plan = BacklogPlan::new(backlog, &self.config.compile)?;
        let failed = |e: StoreError| self.apply_failed(&e);
        let mut tally = Tally::default();
        let mut run: Vec<ReplicatedTxn> = Vec::new();
        let mut flushed = true;
        let mut received = BTreeMap::new();
        let forked = self.forked.borrow().clone();
        for batch in backlog {
            for r in self.decode(batch).await? {
                check_forked(&forked, &r)?;
                note_received(&mut received, r.entry.gtid());
                match r.entry {
                    LogEntry::Txn(txn) => {
                        let mut txn = accepted.prepare(txn, r.epoch, &self.config.store)?;
                        tally.transactions += 1;
                        tally.row_changes += txn.changes.len() as u64;
                        if accepted.ships_parts && join_part(&mut run, &mut txn) {
                            // The sender's log holds the transaction in two parts
                            // (it got them from two relays): one transaction here.
                            continue;
                        }
                        if let Some(part) = self.second_part(accepted, &txn).map_err(failed)? {
                            // The rest of a transaction that came in parts: after what
                            // came before it, on its own.
                            flushed &= self
                                .apply_run(
                                    accepted,
                                    std::mem::take(&mut run),
                                    plan.compiles,
                                    &mut tally,
                                    pacer.as_deref_mut(),
                                )
                                .await?;
                            let part = ReplicatedTxn {
                                txn: part,
                                epoch: r.epoch,
                            };
                            let info = self
                                .db
                                .apply_part(part, !accepted.returns_wait)
                                .await
                                .map_err(failed)?;
                            flushed &= info.durable;
                            tally.count_part(&info);
                            continue;
                        }
                        run.push(ReplicatedTxn {
                            txn,
                            epoch: r.epoch,
                        });
                    }
                    entry @ (LogEntry::Ddl { .. } | LogEntry::SequenceBlock { .. }) => {
                        flushed &= self
                            .apply_run(
                                accepted,
                                std::mem::take(&mut run),
                                plan.compiles,
                                &mut tally,
                                pacer.as_deref_mut(),
                            )
                            .await?;
                        self.db
                            .apply_replicated_ddl(&entry, r.epoch)
                            .await
                            .map_err(failed)?;
                        if let LogEntry::Ddl { op, .. } = &entry {
                            accepted.follow_ddl(&self.db, op)?;
                        }
                    }
                }
            }
        }
        flushed &= self
            .apply_run(accepted, run, plan.compiles, &mut tally, pacer)
            .await?;
        // Applied (or found here) through these batches: what they decided holds now.
        let mut decided_moved = false;
        for b in backlog {
            decided_moved |=
                note_decided(&self.decided, accepted.sender_node, b.decided, &b.relayed);
        }
        Ok(Applied {
            plan,
            received,
            flushed,
            tally,
            decided_moved,
        })
    }

    /// What of `txn` is the rest of a transaction that reached this store in parts
    /// ([`may_be_second_part`]): the changes of tables that the records of it here do
    /// not write, when its seq is its origin's high-water here and there are any;
    /// `None` otherwise.
    fn second_part(
        &self,
        accepted: &Accepted,
        txn: &Transaction,
    ) -> Result<Option<Transaction>, StoreError> {
        let gtid = txn.gtid;
        if !may_be_second_part(
            accepted.ships_parts,
            accepted.sender_node,
            self.db.node_id(),
            gtid,
        ) || gtid.seq != self.db.high_water(gtid.origin)?
        {
            return Ok(None);
        }
        let Some(here) = self.db.tables_of(gtid, LOOK_BACK)? else {
            debug!(%gtid, "the newest transaction of its origin is not in the recent log; skipped");
            return Ok(None);
        };
        Ok(rest_of(txn, &here))
    }

    /// Applies a run in log order, waiting for its flush unless `lazy`.
    async fn apply_in_order(
        &self,
        run: Vec<ReplicatedTxn>,
        lazy: bool,
    ) -> Result<ApplyInfo, StoreError> {
        if lazy {
            self.db.apply_replicated_lazily(run).await
        } else {
            self.db.apply_replicated(run).await
        }
    }

    /// Applies a lazy run in log order in slices ([`slice_len`]), letting `pacer`
    /// pause between them.
    async fn apply_paced(
        &self,
        mut run: Vec<ReplicatedTxn>,
        pacer: &mut Pacer,
    ) -> Result<ApplyInfo, StoreError> {
        pacer.start();
        let rest = run.split_off(slice_len(&run));
        let mut total = self.db.apply_replicated_lazily(run).await?;
        let mut run = rest;
        while !run.is_empty() {
            pacer.tick();
            let rest = run.split_off(slice_len(&run));
            let info = self.db.apply_replicated_lazily(run).await?;
            run = rest;
            add_slice(&mut total, info);
        }
        Ok(total)
    }

    /// Applies a run as RTL net rows, waiting for its flush unless `lazy`. A run the
    /// compiler cannot read (a change without the image it needs) is applied in log
    /// order, which reports the problem precisely if it is real.
    async fn apply_compiled(
        &self,
        run: Vec<ReplicatedTxn>,
        lazy: bool,
    ) -> Result<ApplyInfo, Refusal> {
        let catalog: Vec<TableDef> = self.db.tables().iter().map(|t| (**t).clone()).collect();
        // Compilation is CPU work proportional to the run: off the async workers.
        let (run, compiled) = tokio::task::spawn_blocking(move || {
            let compiled = compile_run(&run, &catalog);
            (run, compiled)
        })
        .await
        .map_err(|e| {
            (
                RefuseCode::ApplyFailed,
                format!("the RTL compiler failed: {e}"),
            )
        })?;
        match compiled {
            Ok(compiled) if lazy => self.db.apply_compiled_lazily(&run, &compiled).await,
            Ok(compiled) => self.db.apply_compiled(&run, &compiled).await,
            Err(e) => {
                debug!(error = %e, "run not read by the compiler; applying in log order");
                self.apply_in_order(run, lazy).await
            }
        }
        .map_err(|e| self.apply_failed(&e))
    }

    /// Decodes a batch: a large one (a big transaction, alone in its batch) off the
    /// async workers, so that this stream's heartbeats and the node's other tasks go
    /// on meanwhile — decoding tens of MiB holds a worker for longer than the sender's
    /// peer timeout on a loaded machine.
    async fn decode(&self, batch: &pb::Batch) -> Result<Vec<WireRecord>, Refusal> {
        if batch.raw_bytes < DECODE_OFF_WORKER_BYTES {
            return decode_batch(batch);
        }
        let batch = batch.clone();
        tokio::task::spawn_blocking(move || decode_batch(&batch))
            .await
            .map_err(|e| {
                (
                    RefuseCode::Protocol,
                    format!("decoding a batch failed: {e}"),
                )
            })?
    }

    /// Applies one run of transactions as RTL net rows (when the backlog compiles,
    /// `backlog_compiles`, and [`compiles_run`] agrees) or in log order (paced by
    /// `pacer`, when given and the stream is lazy), and counts what was written.
    /// Returns whether the apply was flushed.
    async fn apply_run(
        &self,
        accepted: &Accepted,
        run: Vec<ReplicatedTxn>,
        backlog_compiles: bool,
        tally: &mut Tally,
        pacer: Option<&mut Pacer>,
    ) -> Result<bool, Refusal> {
        if run.is_empty() {
            return Ok(true);
        }
        let lazy = !accepted.returns_wait;
        let compiles = compiles_run(
            backlog_compiles,
            !accepted.targets.is_empty(),
            &run,
            |origin| self.db.in_order_through(origin),
        );
        let info = match (run_mode(compiles, lazy, pacer.is_some()), pacer) {
            (RunMode::Compiled, _) => self.apply_compiled(run, lazy).await?,
            (RunMode::Paced, Some(pacer)) => self
                .apply_paced(run, pacer)
                .await
                .map_err(|e| self.apply_failed(&e))?,
            _ => self
                .apply_in_order(run, lazy)
                .await
                .map_err(|e| self.apply_failed(&e))?,
        };
        tally.count_run(&info);
        Ok(info.durable)
    }
}
