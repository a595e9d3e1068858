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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use hawser_core::key::{decode_key, encode_key};
use hawser_core::{ChangeOp, Epoch, Gtid, Lsn, NodeId, QualName, Row, RowChange, Transaction};
use hawser_rtl::{Compilation, NetOp, NetTable};

use crate::codec;
use crate::conflict::Found;
use crate::db::{Database, Flusher, ForeignAppend, Inner, Origin, TableRef};
use crate::engine::WriteBatch;
use crate::error::StoreError;
use crate::layout;
use crate::locks::{LockKey, TxnId};
use crate::log::{DdlOp, LogEntry};
use crate::rows::{coerce_key, key_text, validate_row};

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

/// The apply's counters; `mode` is `log` or `compiled`.
pub(crate) struct ApplyMetrics {
    rows_log: metrics::Counter,
    rows_compiled: metrics::Counter,
    changes: metrics::Counter,
    applied: metrics::Counter,
    skipped: metrics::Counter,
}

impl ApplyMetrics {
    pub(crate) fn new() -> Self {
        metrics::describe_counter!(
            "hawser_store_apply_rows_total",
            "row puts and deletes written by replicated apply, by mode (log order or compiled)"
        );
        metrics::describe_counter!(
            "hawser_store_apply_changes_total",
            "row changes carried by applied replicated transactions"
        );
        metrics::describe_counter!(
            "hawser_store_apply_transactions_total",
            "replicated transactions, applied or skipped as already present"
        );
        Self {
            rows_log: metrics::counter!("hawser_store_apply_rows_total", "mode" => "log"),
            rows_compiled: metrics::counter!("hawser_store_apply_rows_total", "mode" => "compiled"),
            changes: metrics::counter!("hawser_store_apply_changes_total"),
            applied: metrics::counter!("hawser_store_apply_transactions_total", "result" => "applied"),
            skipped: metrics::counter!("hawser_store_apply_transactions_total", "result" => "skipped"),
        }
    }
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

    async fn apply_internal(
        &self,
        batch: &[ReplicatedTxn],
        net: Option<&[NetTable]>,
        durable: bool,
    ) -> Result<ApplyInfo, StoreError> {
        self.apply_as(batch, net, durable, false).await
    }

    /// [`Database::apply_internal`]; with `part`, a transaction at its origin's
    /// high-water is applied too ([`Database::apply_part`]).
    async fn apply_as(
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
        let prepared = prepare(self, &fresh, net)?;
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
        let appended = inner.append_foreign(|own_seq| write(inner, own_seq, &prepared, part));
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

/// A row of the apply: index into [`Prepared::tables`] and encoded key.
type Slot = (usize, Vec<u8>);

/// Row versions by slot: `Some(row)`, or `None` for absent.
type RowVersions = BTreeMap<Slot, Option<Row>>;

/// One change, checked against its table and ready to apply.
struct PreparedChange {
    /// Index into [`Prepared::tables`].
    table: usize,
    op: ChangeOp,
    /// The (coerced) key of the row the change applies to.
    key: Row,
    enc: Vec<u8>,
    /// Insert and update: the validated after-row, its key and encoded key.
    after: Option<(Row, Row, Vec<u8>)>,
}

struct PreparedTxn<'r> {
    src: &'r ReplicatedTxn,
    changes: Vec<PreparedChange>,
}

/// A batch resolved against the catalog, before any lock is taken.
struct Prepared<'r> {
    tables: Vec<TableRef>,
    txns: Vec<PreparedTxn<'r>>,
    /// Net operations per table index, when writing compiled.
    net: Option<Vec<(usize, &'r [NetOp])>>,
    lock_keys: BTreeSet<Slot>,
}

fn prepare<'r>(
    db: &Database,
    fresh: &[&'r ReplicatedTxn],
    net: Option<&'r [NetTable]>,
) -> Result<Prepared<'r>, StoreError> {
    let mut tables: Vec<TableRef> = Vec::new();
    let mut by_name: HashMap<QualName, usize> = HashMap::new();
    let mut resolve = |tables: &mut Vec<TableRef>, name: &QualName| -> Result<usize, StoreError> {
        if let Some(&i) = by_name.get(name) {
            return Ok(i);
        }
        tables.push(db.table_ref(name)?);
        by_name.insert(name.clone(), tables.len() - 1);
        Ok(tables.len() - 1)
    };
    let mut txns = Vec::with_capacity(fresh.len());
    let mut lock_keys = BTreeSet::new();
    for &src in fresh {
        let gtid = src.txn.gtid;
        let wrap = |source: StoreError| StoreError::Replicated {
            gtid,
            source: Box::new(source),
        };
        let mut changes = Vec::with_capacity(src.txn.changes.len());
        for (i, c) in src.txn.changes.iter().enumerate() {
            let table = resolve(&mut tables, &c.table).map_err(wrap)?;
            let def = &tables[table].def;
            let key = coerce_key(def, &c.key, false).map_err(wrap)?;
            let enc = encode_key(&key);
            let after = match (c.op, &c.after) {
                (ChangeOp::Delete, _) => None,
                (_, Some(row)) => {
                    let row = validate_row(def, row.clone()).map_err(wrap)?;
                    let row_key = def.key_of(&row);
                    let row_enc = encode_key(&row_key);
                    Some((row, row_key, row_enc))
                }
                (op, None) => {
                    return Err(StoreError::InvalidBatch(format!(
                    "transaction {gtid}, change {i}: {op:?} of table {} without its after-image",
                    c.table
                )))
                }
            };
            if let Some((_, _, row_enc)) = after.as_ref().filter(|(_, _, e)| *e != enc) {
                // An update that moves the row locks its new key too.
                lock_keys.insert((table, row_enc.clone()));
            }
            lock_keys.insert((table, enc.clone()));
            changes.push(PreparedChange {
                table,
                op: c.op,
                key,
                enc,
                after,
            });
        }
        txns.push(PreparedTxn { src, changes });
    }
    let net = match net {
        Some(net_tables) if !fresh.is_empty() => {
            let mut out = Vec::with_capacity(net_tables.len());
            for nt in net_tables {
                let table = *by_name.get(&nt.table).ok_or_else(|| {
                    StoreError::InvalidBatch(format!(
                        "the compilation writes table {}, which no transaction of the run changes",
                        nt.table
                    ))
                })?;
                for op in &nt.operations {
                    let key = coerce_key(&tables[table].def, op.key(), false)?;
                    lock_keys.insert((table, encode_key(&key)));
                }
                out.push((table, nt.operations.as_slice()));
            }
            Some(out)
        }
        _ => None,
    };
    Ok(Prepared {
        tables,
        txns,
        net,
        lock_keys,
    })
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
            .map_err(|_| StoreError::LockTimeout {
                table: t.def.name.clone(),
                key: decode_key(enc).map_or_else(|_| "?".into(), |k| key_text(&k)),
                waited: timeout,
            })?;
        self.keys.push(key);
        Ok(())
    }
}

impl Drop for RowLocks<'_> {
    fn drop(&mut self) {
        self.inner.release_locks(self.txn, &self.keys);
    }
}

/// What the write step reports back.
struct Outcome {
    applied: u64,
    row_changes: u64,
    rows_written: u64,
    compiled: bool,
    /// Conflicts found, published once the batch is written.
    conflicts: Vec<crate::conflict::ConflictEvent>,
    /// BASE AGGREGATE groups, kept once the batch is written.
    aggregated: Vec<(QualName, crate::aggregate::Done)>,
}

/// Rows as the apply sees them: the committed row the first time a key is read
/// (remembered in `before`), then the apply's own writes. Per table index
/// ([`Prepared::tables`]), keyed by encoded key, so a lookup borrows the key.
struct Overlay<'a> {
    inner: &'a Inner,
    /// The committed version of every key read, as it was before this apply.
    before: Vec<BTreeMap<Vec<u8>, Option<Row>>>,
    /// The version after the changes simulated so far, for every key written.
    after: Vec<BTreeMap<Vec<u8>, Option<Row>>>,
}

impl<'a> Overlay<'a> {
    fn new(inner: &'a Inner, tables: usize) -> Self {
        Self {
            inner,
            before: vec![BTreeMap::new(); tables],
            after: vec![BTreeMap::new(); tables],
        }
    }

    fn committed(
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
fn apply_change(
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
fn check_conflicts(
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

/// The write step, run under the commit mutex: re-checks the catalog and the
/// high-water marks, simulates the batch in log order (log records), and fills the
/// engine batch with the row writes, log order's or the compiled ones. With `part`,
/// a transaction at its origin's high-water is written too ([`Database::apply_part`]).
fn write(
    inner: &Inner,
    own_seq: u64,
    p: &Prepared<'_>,
    part: bool,
) -> Result<(ForeignAppend, Outcome), StoreError> {
    // DDL takes the commit mutex too, so the tables cannot change from here to the
    // engine write.
    for t in &p.tables {
        inner.check_table_current(t)?;
    }
    let mut marks: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut ov = Overlay::new(inner, p.tables.len());
    let mut records = Vec::with_capacity(p.txns.len());
    let mut row_changes = 0;
    let rules = inner.conflicts.rules();
    let mut touched = crate::aggregate::Touched::new(inner, &p.tables)?;
    // Conflicts found, with their transaction and table: kept in the conflicts table.
    let mut conflicts: Vec<(&ReplicatedTxn, QualName, Found, bool)> = Vec::new();
    for pt in &p.txns {
        let Gtid { origin, seq } = pt.src.txn.gtid;
        let mark = match marks.get(&origin) {
            Some(&m) => m,
            None if origin == inner.opts.node_id => own_seq,
            None => inner.mark(origin),
        };
        if seq < mark || (seq == mark && !(part && origin != inner.opts.node_id)) {
            // Only this node's own origin can move between the first check and here
            // (local commits); the apply lock holds every other origin still.
            continue;
        }
        let found = if rules.is_empty() {
            Vec::new()
        } else {
            check_conflicts(&mut ov, &p.tables, pt, &rules)?
        };
        // ON EXCEPTION ROLLBACK WORK: nothing of the transaction is applied; NO
        // ACTION: all but the conflicting changes.
        let rollback = found.iter().any(|f| f.rollback);
        let mut effective = Vec::with_capacity(pt.changes.len());
        for (i, (c, src)) in pt.changes.iter().zip(&pt.src.txn.changes).enumerate() {
            if rollback || found.iter().any(|f| f.change_no == i) {
                continue;
            }
            let applied = apply_change(&mut ov, &p.tables, &src.table, c)?;
            if !touched.is_empty() {
                for a in &applied {
                    touched.note(a, pt.src.txn.commit_micros);
                }
            }
            effective.extend(applied);
        }
        for f in found {
            let table = pt.src.txn.changes[f.change_no].table.clone();
            crate::conflict::count(
                &table,
                if rollback {
                    "transaction rejected"
                } else {
                    "change rejected"
                },
            );
            tracing::info!(
                gtid = %pt.src.txn.gtid,
                table = %table,
                key = %key_text(&f.key),
                rollback,
                "a received change is older than the row here: conflict"
            );
            conflicts.push((pt.src, table, f, rollback));
        }
        row_changes += pt.changes.len() as u64;
        records.push((
            pt.src.epoch,
            LogEntry::Txn(Transaction {
                gtid: pt.src.txn.gtid,
                commit_micros: pt.src.txn.commit_micros,
                changes: effective,
            }),
        ));
        marks.insert(origin, seq);
    }
    let applied = records.len() as u64;
    // Net operations describe the whole run: if a transaction of this node's own
    // origin turned out to be here already, write in log order after all.
    // A rejected change is not in the net operations' view: then too in log order.
    let net = p
        .net
        .as_ref()
        .filter(|_| applied == p.txns.len() as u64 && conflicts.is_empty());
    let mut batch = WriteBatch::new();
    if !conflicts.is_empty() {
        // Kept beside the rows, without a log record: a conflict is this store's own
        // finding, not a change to replicate.
        let name = QualName::bare(crate::conflict::CONFLICTS_TABLE);
        let kept = inner.catalog.read().tables.get(&name).cloned();
        match kept {
            Some(t) => {
                for (src, table, f, rolled_back) in &conflicts {
                    let row = crate::conflict::conflict_row(
                        src.txn.gtid,
                        src.txn.commit_micros,
                        table,
                        f,
                        *rolled_back,
                    );
                    let row = validate_row(&t.def, row)?;
                    let key = layout::row_key(t.id, &encode_key(&t.def.key_of(&row)));
                    batch.put(key, codec::encode_row(&row));
                }
            }
            None => tracing::warn!(
                conflicts = conflicts.len(),
                "conflicts found but the conflicts table is missing: counted and logged only"
            ),
        }
    }
    // BASE AGGREGATE rows of the groups the batch touched, beside its rows.
    let aggregated = touched.write(inner, &p.tables, &ov.after, &mut batch)?;
    let mut put = |table: usize, enc: &[u8], row: &Option<Row>| {
        let key = layout::row_key(p.tables[table].id, enc);
        match row {
            Some(row) => batch.put(key, codec::encode_row(row)),
            None => batch.delete(key),
        }
    };
    let rows_written = match net {
        Some(net) => {
            let writes = net_writes(&mut ov, &p.tables, net)?;
            for ((table, enc), row) in &writes {
                put(*table, enc, row);
            }
            writes.len()
        }
        None => {
            let mut written = 0;
            for (table, rows) in ov.after.iter().enumerate() {
                for (enc, row) in rows {
                    // Deleting a row that was not here writes nothing.
                    if row.is_some() || ov.before[table].get(enc).is_some_and(Option::is_some) {
                        put(table, enc, row);
                        written += 1;
                    }
                }
            }
            written
        }
    };
    Ok((
        ForeignAppend {
            batch,
            records,
            high_water: marks,
        },
        Outcome {
            applied,
            row_changes,
            rows_written: rows_written as u64,
            compiled: net.is_some(),
            aggregated,
            conflicts: conflicts
                .iter()
                .map(|(src, table, f, rolled_back)| {
                    crate::conflict::event(
                        src.txn.gtid,
                        src.txn.commit_micros,
                        table,
                        f,
                        *rolled_back,
                    )
                })
                .collect(),
        },
    ))
}

/// The row writes of compiled net operations, sorted by table and key, with the DB2
/// rules: insert and replace put their row, an update puts its after-row (an insert
/// when the row is missing here), a delete removes the row only if it is here.
fn net_writes(
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
