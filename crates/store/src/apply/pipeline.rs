//! The course of every apply of a batch: the order check, the skip of what is here, the
//! preparation, the row locks, the write step under the commit mutex, the flush and the
//! ack, with the counters and the [`ApplyInfo`] it returns.

use std::collections::HashMap;
use std::time::Instant;

use hawser_core::{Gtid, Lsn, NodeId};
use hawser_rtl::NetTable;

use super::prepare::prepare;
use super::write::write;
use super::{ApplyInfo, ReplicatedTxn};
use crate::db::{Database, Flusher, Inner, TableRef};
use crate::error::StoreError;
use crate::locks::{LockKey, TxnId};
use crate::rows::lock_timed_out;

impl Database {
    pub(super) async fn apply_internal(
        &self,
        batch: &[ReplicatedTxn],
        net: Option<&[NetTable]>,
        durable: bool,
    ) -> Result<ApplyInfo, StoreError> {
        self.apply_as(batch, net, durable, false).await
    }

    /// [`Database::apply_internal`]; with `part`, a transaction at its origin's
    /// high-water is applied too ([`Database::apply_part`]).
    pub(super) async fn apply_as(
        &self,
        batch: &[ReplicatedTxn],
        net: Option<&[NetTable]>,
        durable: bool,
        part: bool,
    ) -> Result<ApplyInfo, StoreError> {
        let inner = &self.inner;
        let started = Instant::now();
        check_order(batch)?;
        // One apply at a time: the high-water marks read below stay true until this
        // apply has written its batch.
        let serial = inner.apply_lock.lock().await;
        let marks = self.high_waters()?;
        if part {
            // Checked again under the lock: another stream may have applied a later
            // transaction of the origin since the caller looked, and a part skipped as
            // a duplicate would be lost without a word.
            for r in batch {
                let mark = marks.get(&r.txn.gtid.origin).copied().unwrap_or(0);
                if r.txn.gtid.seq != mark {
                    return Err(StoreError::InvalidBatch(format!(
                        "transaction {}: only the newest transaction of another origin here \
                         can come in parts (its high-water is {mark})",
                        r.txn.gtid
                    )));
                }
            }
        }
        let fresh: Vec<&ReplicatedTxn> = batch
            .iter()
            .filter(|r| {
                let mark = marks.get(&r.txn.gtid.origin).copied().unwrap_or(0);
                r.txn.gtid.seq > mark || (part && r.txn.gtid.seq == mark)
            })
            .collect();
        if !fresh.is_empty() {
            inner.check_space()?;
        }
        // Net operations describe the whole run: write them only if all of it is new.
        let net = net.filter(|_| fresh.len() == batch.len());
        // Reading, checking and writing a large batch takes long: off the worker.
        let work = fresh.iter().map(|r| r.txn.approx_bytes()).sum();
        let prepared = crate::blocking::sized(work, || prepare(self, &fresh, net))?;
        // Lock every row the batch may touch, in key order (so two appliers cannot
        // deadlock each other); held until the batch is durable.
        let mut locks = RowLocks::new(
            inner,
            inner
                .next_txn_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        for (table, enc) in &prepared.lock_keys {
            let t = &prepared.tables[*table];
            locks.acquire(t, enc).await?;
        }
        let appended = crate::blocking::sized(work, || {
            inner.append_foreign(|own_seq| write(inner, own_seq, &prepared, part))
        });
        let (last_lsn, mut outcome) = match appended {
            Ok(done) => done,
            Err(e) => {
                // The kept aggregate groups may be ahead of what is written.
                inner.aggregates.forget();
                return Err(e);
            }
        };
        inner
            .aggregates
            .commit(std::mem::take(&mut outcome.aggregated));
        inner
            .conflicts
            .publish(std::mem::take(&mut outcome.conflicts));
        // The marks are written: the next apply may build its batch while this one
        // waits for the flush (which then often covers both).
        drop(serial);
        if durable {
            // Flush (shared with concurrent commits) and advance. With nothing applied
            // this still covers the skipped transactions, which an earlier
            // non-durable apply may have left unflushed.
            inner
                .wait_durable(
                    last_lsn.unwrap_or_else(|| self.last_lsn()),
                    Flusher::Apply,
                    false,
                )
                .await?;
        }
        // Ack: only now may later writers of these rows build on them.
        drop(locks);
        let skipped = batch.len() as u64 - outcome.applied;
        let m = &inner.apply_metrics;
        m.applied.increment(outcome.applied);
        m.skipped.increment(skipped);
        m.changes.increment(outcome.row_changes);
        if outcome.compiled {
            m.rows_compiled.increment(outcome.rows_written);
        } else {
            m.rows_log.increment(outcome.rows_written);
        }
        inner.count_rows_written(outcome.rows_written);
        tracing::debug!(
            applied = outcome.applied,
            skipped,
            rows_written = outcome.rows_written,
            compiled = outcome.compiled,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "replicated batch applied"
        );
        Ok(ApplyInfo {
            applied: outcome.applied,
            skipped,
            row_changes: outcome.row_changes,
            rows_written: outcome.rows_written,
            compiled: outcome.compiled,
            last_lsn: last_lsn.unwrap_or(Lsn::ZERO),
            durable,
            high_water: self.high_waters()?,
        })
    }
}

/// Refuses a batch in which an origin's seqs do not strictly increase.
fn check_order(batch: &[ReplicatedTxn]) -> Result<(), StoreError> {
    let mut last: HashMap<NodeId, u64> = HashMap::new();
    for r in batch {
        let Gtid { origin, seq } = r.txn.gtid;
        if let Some(&prev) = last.get(&origin) {
            if seq <= prev {
                return Err(StoreError::InvalidBatch(format!(
                    "transactions of origin {origin} out of order: seq {seq} after seq {prev}"
                )));
            }
        }
        last.insert(origin, seq);
    }
    Ok(())
}

/// Row locks of one apply, released when dropped (on success after the flush, on
/// error at once).
struct RowLocks<'a> {
    inner: &'a Inner,
    txn: TxnId,
    keys: Vec<LockKey>,
}

impl<'a> RowLocks<'a> {
    fn new(inner: &'a Inner, txn: TxnId) -> Self {
        Self {
            inner,
            txn,
            keys: Vec::new(),
        }
    }

    async fn acquire(&mut self, t: &TableRef, enc: &[u8]) -> Result<(), StoreError> {
        let key: LockKey = (t.id, enc.to_vec());
        let timeout = self.inner.opts.lock_timeout;
        self.inner
            .locks
            .acquire(self.txn, &key, timeout)
            .await
            .map_err(|_| lock_timed_out(&t.def.name, enc, timeout))?;
        self.keys.push(key);
        Ok(())
    }
}

impl Drop for RowLocks<'_> {
    fn drop(&mut self) {
        self.inner.release_locks(self.txn, &self.keys);
    }
}
