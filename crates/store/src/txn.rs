//! Transactions: buffered writes under row locks, one log record at commit.
//!
//! A [`Txn`] keeps its writes in memory (per table, by encoded key: the row's new
//! version, or a tombstone) and the list of changes with before- and after-images in
//! the order they were made. Every row it inserts, updates or deletes is locked
//! exclusively until the transaction ends, and the row's current version is read
//! *after* the lock is granted, so read-modify-write (`UPDATE t SET x = x + 1`) never
//! loses an update. Reads take no locks and see committed rows plus the transaction's
//! own writes (read committed, TimesTen's default).
//!
//! Commit turns the buffer into one atomic batch with one log record
//! ([`crate::db`]), waits for the group flush, and only then releases the locks, so a
//! later writer of the same rows never builds on a commit that could still be lost.
//! Dropping a transaction rolls it back.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::RangeBounds;
use std::time::Instant;

use hawser_core::key::encode_key;
use hawser_core::{ChangeOp, Gtid, Lsn, QualName, Row, RowChange, Transaction, Value};

use crate::codec;
use crate::db::{table_byte_range, CommitInfo, Database, DdlKind, KeyRange, TableRef};
use crate::engine::WriteBatch;
use crate::error::StoreError;
use crate::layout;
use crate::locks::{LockKey, TxnId};
use crate::log::LogEntry;
use crate::rows::{coerce_key, key_text, lock_timed_out, validate_row};

/// A point to roll a transaction back to: what it had done when the point was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Savepoint {
    changes: usize,
}

/// One transaction. Dropping it without commit rolls it back and releases its locks.
pub struct Txn {
    db: Database,
    id: TxnId,
    /// Tables written, pinned at their first write (id and catalog version).
    tables: HashMap<QualName, TableRef>,
    /// Own versions by table id and encoded key: `Some(row)`, or `None` for deleted.
    writes: BTreeMap<u64, BTreeMap<Vec<u8>, Option<Row>>>,
    changes: Vec<RowChange>,
    locks: Vec<LockKey>,
    locked: HashSet<LockKey>,
    finished: bool,
    /// Flush before the commit returns even when the database's commits are not
    /// durable (TimesTen's DURABLE COMMIT ON while a return service is disabled).
    force_durable: bool,
    /// Leave the flush's housekeeping for the caller's [`Database::settle`].
    settle_later: bool,
    /// A write needed the master lease ([`Txn::leased`]).
    leased: bool,
}

impl std::fmt::Debug for Txn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Txn")
            .field("id", &self.id)
            .field("changes", &self.changes.len())
            .field("locks", &self.locks.len())
            .finish()
    }
}

impl Txn {
    pub(crate) fn new(db: Database, id: TxnId) -> Self {
        Self {
            db,
            id,
            tables: HashMap::new(),
            writes: BTreeMap::new(),
            changes: Vec::new(),
            locks: Vec::new(),
            locked: HashSet::new(),
            finished: false,
            force_durable: false,
            settle_later: false,
            leased: false,
        }
    }

    /// Whether a write of this transaction needed this node's master lease
    /// ([`crate::lease`]): its commit is acknowledged only while the lease holds.
    pub fn leased(&self) -> bool {
        self.leased
    }

    /// Whether the transaction has changed anything so far.
    pub fn has_writes(&self) -> bool {
        !self.changes.is_empty()
    }

    /// The changes made so far, in order.
    pub fn changes(&self) -> &[RowChange] {
        &self.changes
    }

    /// The table for reading: the catalog's current definition, which must still be
    /// the one this transaction wrote with, if it wrote.
    fn read_ref(&self, name: &QualName) -> Result<TableRef, StoreError> {
        let current = self.db.table_ref(name)?;
        match self.tables.get(name) {
            Some(p) if p.id != current.id || p.version != current.version => {
                Err(StoreError::TableChanged(name.clone()))
            }
            _ => Ok(current),
        }
    }

    /// The table for writing, pinned at first use. A table this store receives from a
    /// master is refused here, for SQL and the typed API alike.
    fn pin(&mut self, name: &QualName) -> Result<TableRef, StoreError> {
        let t = self.read_ref(name)?;
        if !self.tables.contains_key(name) {
            self.leased |= self.db.inner.check_writable(name)?;
            self.tables.insert(name.clone(), t.clone());
        }
        Ok(t)
    }

    /// Makes this transaction's commit wait for its flush even when the database's
    /// commits are not durable.
    pub fn force_durable(&mut self) {
        self.force_durable = true;
    }

    /// Lets this commit's flush leave its housekeeping (moving the flushed batches into
    /// the engine's tree) for a [`Database::settle`] the caller makes once the commit's
    /// next step is under way, such as shipping it to a subscriber the caller then
    /// waits for. Without that call, the next flush does it.
    pub fn settle_later(&mut self) {
        self.settle_later = true;
    }

    /// The database this transaction writes to.
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// The tables this transaction has written to.
    pub fn written_tables(&self) -> Vec<QualName> {
        let mut names: Vec<QualName> = self.tables.keys().cloned().collect();
        names.sort();
        names
    }

    async fn lock(&mut self, t: &TableRef, enc: &[u8]) -> Result<(), StoreError> {
        let key: LockKey = (t.id, enc.to_vec());
        if self.locked.contains(&key) {
            return Ok(());
        }
        let timeout = self.db.inner.opts.lock_timeout;
        self.db
            .inner
            .locks
            .acquire(self.id, &key, timeout)
            .await
            .map_err(|_| lock_timed_out(&t.def.name, enc, timeout))?;
        self.locked.insert(key.clone());
        self.locks.push(key);
        Ok(())
    }

    /// The version this transaction sees: its own write, else the committed row.
    fn visible(&self, t: &TableRef, enc: &[u8]) -> Result<Option<Row>, StoreError> {
        match self.writes.get(&t.id).and_then(|m| m.get(enc)) {
            Some(own) => Ok(own.clone()),
            None => self.db.inner.get_row(t, enc),
        }
    }

    fn put(&mut self, t: &TableRef, enc: Vec<u8>, row: Option<Row>) {
        self.writes.entry(t.id).or_default().insert(enc, row);
    }

    /// The row with primary key `key`, as this transaction sees it.
    pub fn get(&self, table: &QualName, key: &[Value]) -> Result<Option<Row>, StoreError> {
        let t = self.read_ref(table)?;
        let key = coerce_key(&t.def, key, false)?;
        self.visible(&t, &encode_key(&key))
    }

    /// Rows in `range` as this transaction sees them (committed rows merged with its
    /// own writes), in key order.
    pub fn scan(&self, table: &QualName, range: KeyRange) -> Result<Vec<Row>, StoreError> {
        let t = self.read_ref(table)?;
        let prefix_len = layout::row_prefix(t.id).len();
        let mut rows = BTreeMap::new();
        for kv in self.db.inner.scan_rows(&t, &range, false)? {
            let (k, v) = kv?;
            let row = crate::rows::decode_stored_row(&t.def, &k, &v)?;
            rows.insert(k[prefix_len..].to_vec(), row);
        }
        if let (Some(own), Some(bounds)) = (self.writes.get(&t.id), table_byte_range(&t, &range)?) {
            for (enc, version) in own {
                if !bounds.contains(&layout::row_key(t.id, enc)) {
                    continue;
                }
                match version {
                    Some(row) => rows.insert(enc.clone(), row.clone()),
                    None => rows.remove(enc),
                };
            }
        }
        Ok(rows.into_values().collect())
    }

    /// Locks the row with primary key `key` (held until the transaction ends) and
    /// returns its latest version: the committed one, or this transaction's own.
    pub async fn lock_and_get(
        &mut self,
        table: &QualName,
        key: &[Value],
    ) -> Result<Option<Row>, StoreError> {
        let t = self.pin(table)?;
        let key = coerce_key(&t.def, key, false)?;
        let enc = encode_key(&key);
        self.lock(&t, &enc).await?;
        self.visible(&t, &enc)
    }

    /// Inserts a row (values in column order). Values are coerced to the column types
    /// and checked (NOT NULL, lengths, ranges); a row whose key exists is refused with
    /// 23505.
    pub async fn insert(&mut self, table: &QualName, row: Row) -> Result<(), StoreError> {
        let t = self.pin(table)?;
        let mut row = validate_row(&t.def, row)?;
        self.db.inner.conflicts.stamp(&t.def, &mut row);
        let key = t.def.key_of(&row);
        let enc = encode_key(&key);
        self.lock(&t, &enc).await?;
        if self.visible(&t, &enc)?.is_some() {
            return Err(StoreError::UniqueViolation {
                table: table.clone(),
                key: key_text(&key),
            });
        }
        self.put(&t, enc, Some(row.clone()));
        self.changes.push(RowChange {
            table: t.def.name.clone(),
            op: ChangeOp::Insert,
            key,
            before: None,
            after: Some(row),
        });
        Ok(())
    }

    /// Replaces the row with primary key `key` by `new_row` (all columns). The new row
    /// may have a different key, which must then be free. Returns false, changing
    /// nothing, when there is no such row.
    pub async fn update(
        &mut self,
        table: &QualName,
        key: &[Value],
        new_row: Row,
    ) -> Result<bool, StoreError> {
        let t = self.pin(table)?;
        let key = coerce_key(&t.def, key, false)?;
        let enc = encode_key(&key);
        self.lock(&t, &enc).await?;
        let Some(before) = self.visible(&t, &enc)? else {
            return Ok(false);
        };
        let mut row = validate_row(&t.def, new_row)?;
        self.db.inner.conflicts.stamp(&t.def, &mut row);
        let new_key = t.def.key_of(&row);
        let new_enc = encode_key(&new_key);
        if new_enc != enc {
            self.lock(&t, &new_enc).await?;
            if self.visible(&t, &new_enc)?.is_some() {
                return Err(StoreError::UniqueViolation {
                    table: table.clone(),
                    key: key_text(&new_key),
                });
            }
            self.put(&t, enc, None);
            self.put(&t, new_enc, Some(row.clone()));
        } else {
            self.put(&t, enc, Some(row.clone()));
        }
        self.changes.push(RowChange {
            table: t.def.name.clone(),
            op: ChangeOp::Update,
            key,
            before: Some(before),
            after: Some(row),
        });
        Ok(true)
    }

    /// Deletes the row with primary key `key`; false when there is none.
    pub async fn delete(&mut self, table: &QualName, key: &[Value]) -> Result<bool, StoreError> {
        let t = self.pin(table)?;
        let key = coerce_key(&t.def, key, false)?;
        let enc = encode_key(&key);
        self.lock(&t, &enc).await?;
        let Some(before) = self.visible(&t, &enc)? else {
            return Ok(false);
        };
        self.put(&t, enc, None);
        self.changes.push(RowChange {
            table: t.def.name.clone(),
            op: ChangeOp::Delete,
            key,
            before: Some(before),
            after: None,
        });
        Ok(true)
    }

    /// Marks the current state, for undoing a failed statement with
    /// [`Txn::rollback_to`] without ending the transaction.
    pub fn statement_savepoint(&self) -> Savepoint {
        Savepoint {
            changes: self.changes.len(),
        }
    }

    /// Undoes every change made since `sp`. Row locks taken since are kept until the
    /// transaction ends (as PostgreSQL and Oracle do).
    pub fn rollback_to(&mut self, sp: Savepoint) {
        if sp.changes >= self.changes.len() {
            return;
        }
        self.changes.truncate(sp.changes);
        self.writes.clear();
        // Rebuild the write buffer by replaying the changes that remain.
        let changes = std::mem::take(&mut self.changes);
        for c in &changes {
            let Some(t) = self.tables.get(&c.table).cloned() else {
                continue;
            };
            let enc = encode_key(&c.key);
            match c.op {
                ChangeOp::Insert => self.put(&t, enc, c.after.clone()),
                ChangeOp::Delete => self.put(&t, enc, None),
                ChangeOp::Update => {
                    if let Some(after) = &c.after {
                        let new_enc = encode_key(&t.def.key_of(after));
                        if new_enc != enc {
                            self.put(&t, enc, None);
                        }
                        self.put(&t, new_enc, Some(after.clone()));
                    }
                }
            }
        }
        self.changes = changes;
    }

    /// Commits: one atomic batch with the row changes and the log record, then (with
    /// durable commits) the group flush, then the locks are released. A transaction
    /// that changed nothing commits without a log record ([`CommitInfo::is_empty`]).
    pub async fn commit(self) -> Result<CommitInfo, StoreError> {
        self.commit_held(false).await.map(|c| c.info())
    }

    /// Commits like [`Txn::commit`] but keeps the row locks until the returned
    /// [`Committed`] is released (dropped): later writers of these rows are ordered
    /// after whatever the caller waits for meanwhile (a return service). With `hide`,
    /// readers also keep seeing the rows' previous versions until then (RETURN
    /// TWOSAFE's visibility rule, docs/design.md §3).
    pub async fn commit_held(mut self, hide: bool) -> Result<Committed, StoreError> {
        let started = Instant::now();
        let inner = self.db.inner.clone();
        if self.changes.is_empty() {
            self.finish();
            let info = CommitInfo {
                gtid: Gtid::new(inner.opts.node_id, 0),
                lsn: Lsn::ZERO,
                durable: true,
            };
            return Ok(Committed {
                info,
                txn: self,
                shown: None,
                rows: 0,
                started,
            });
        }
        let writes = std::mem::take(&mut self.writes);
        let changes = std::mem::take(&mut self.changes);
        let pinned: Vec<TableRef> = self.tables.values().cloned().collect();
        let rows: u64 = writes.values().map(|m| m.len() as u64).sum();
        // Held keys: the row locks are ours, so the committed versions read here stay
        // the committed versions until the batch below replaces them.
        let mut held = Vec::new();
        if hide {
            for (table_id, versions) in &writes {
                for enc in versions.keys() {
                    let key = layout::row_key(*table_id, enc);
                    match inner.engine.get(&key) {
                        Ok(before) => held.push((key, before)),
                        Err(e) => {
                            self.finish();
                            return Err(e);
                        }
                    }
                }
            }
        }
        // Shown again on every path out, a cancelled caller included: the guard is
        // dropped before the locks are free.
        let shown_on_drop = HeldGuard {
            inner: inner.clone(),
            keys: held.iter().map(|(k, _)| k.clone()).collect(),
        };
        inner.held.hold(held);
        let leased = self.leased;
        // Building and writing a large transaction's batch takes long: off the worker,
        // so the node's other tasks (its lease renewals among them) go on meanwhile.
        let work = changes.iter().map(RowChange::approx_bytes).sum();
        let appended = crate::blocking::sized(work, || {
            inner.append(
                |_, gtid, micros| {
                    // DDL takes the commit mutex too, so the catalog cannot change between
                    // this check and the apply.
                    for t in &pinned {
                        inner.check_table_current(t)?;
                    }
                    // A lease given up or run out since the first write: nothing commits
                    // (a master draining for a switchover reports its last seq after this).
                    if leased {
                        if let Some(t) = pinned.first() {
                            inner.lease.check_commit(&t.def.name, Instant::now())?;
                        }
                    }
                    let mut batch = WriteBatch::new();
                    for (table_id, versions) in writes {
                        for (enc, version) in versions {
                            let key = layout::row_key(table_id, &enc);
                            match version {
                                Some(row) => batch.put(key, codec::encode_row(&row)),
                                None => batch.delete(key),
                            }
                        }
                    }
                    let entry = LogEntry::Txn(Transaction {
                        gtid,
                        commit_micros: micros,
                        changes,
                    });
                    Ok((batch, entry, || {}))
                },
                DdlKind::Txn,
            )
        });
        let (gtid, lsn) = match appended {
            Ok(pos) => pos,
            Err(e) => {
                drop(shown_on_drop);
                self.finish();
                return Err(e);
            }
        };
        let durable = inner.opts.durable_commits || self.force_durable;
        if durable {
            // Flush (shared with concurrent commits) and advance.
            let settle = !self.settle_later;
            if let Err(e) = inner
                .wait_durable(lsn, crate::db::Flusher::Commit, settle)
                .await
            {
                drop(shown_on_drop);
                self.finish();
                return Err(e);
            }
        }
        inner.flush.enter_holding();
        Ok(Committed {
            info: CommitInfo { gtid, lsn, durable },
            txn: self,
            shown: Some(shown_on_drop),
            rows,
            started,
        })
    }

    /// Discards every change and releases the locks.
    pub fn rollback(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.db.inner.release_locks(self.id, &self.locks);
        self.locks.clear();
        self.locked.clear();
        self.writes.clear();
        self.changes.clear();
    }
}

/// A commit made, as durable as promised, whose row locks are still held: see
/// [`Txn::commit_held`]. Dropping it acknowledges the commit as far as the store goes:
/// the hidden rows are shown, then the locks are released.
#[must_use = "the row locks are held until it is dropped"]
pub struct Committed {
    info: CommitInfo,
    txn: Txn,
    /// `None` for a transaction that wrote nothing (nothing to show, nothing counted).
    shown: Option<HeldGuard>,
    rows: u64,
    started: Instant,
}

impl Committed {
    /// Where the commit is: its Gtid, its LSN, whether it was flushed.
    pub fn info(&self) -> CommitInfo {
        self.info
    }
}

impl Drop for Committed {
    fn drop(&mut self) {
        let Some(shown) = self.shown.take() else {
            return;
        };
        let inner = shown.inner.clone();
        inner.flush.leave_holding();
        // Show the rows, then release the row locks.
        drop(shown);
        self.txn.finish();
        inner.record_txn_commit(self.rows, self.started);
    }
}

impl Database {
    /// Starts a transaction.
    pub fn begin(&self) -> Txn {
        let id = self
            .inner
            .next_txn_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Txn::new(self.clone(), id)
    }
}

/// Shows the rows a holding commit hid when dropped (also when the commit's future
/// is dropped part-way).
struct HeldGuard {
    inner: std::sync::Arc<crate::db::Inner>,
    keys: Vec<Vec<u8>>,
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        if !self.keys.is_empty() {
            self.inner.held.release(&self.keys);
        }
    }
}

impl Drop for Txn {
    fn drop(&mut self) {
        self.finish();
    }
}
