//! Whole-table copies for a duplicate (`hawser duplicate`, docs/stream.md, "Duplicate").
//!
//! ```text
//!  source:  copy_point() ─► (last LSN, marks) ─► copy_scan(table) … rows as committed
//!  target:  copy_merge(table, rows, cursor) … ─► copy_trim(table, cursor)
//!           … ─► copy_marks(point's marks, end marks)
//!  sequences: copy_sequence_point(name) ─► copy_sequence(def, restart point)
//! ```
//!
//! The source copies without stopping its commits: it reads the point first and the
//! rows after, so every row reflects at least the point, and a row may reflect later
//! commits too. Its stream then resumes from the point; the receiver applies what
//! follows with the DB2 exception rules (an insert of a present key updates, an update
//! of a missing row inserts its after-image, a delete of a missing row does nothing)
//! and full images, so replaying commits the copy already reflects converges on the
//! source's rows. The target writes without log records: what it copies is another
//! node's history, which it must not ship on as its own.

use std::collections::BTreeMap;
use std::ops::Bound;

use hawser_core::key::encode_key;
use hawser_core::{Epoch, Lsn, NodeId, QualName, Row};

use crate::aside::KeepReplaced;
use crate::db::{Database, Origin};
use crate::engine::WriteBatch;
use crate::error::StoreError;
use crate::layout;
use crate::rows::{decode_stored_row, validate_row};
use crate::sequence::SequenceDef;

/// Rows deleted or written per engine batch.
const BATCH_ROWS: usize = 1024;

/// How far a table's copy has merged ([`Database::copy_merge`]): the highest key so
/// far, in this node's encoding. Start with `CopyCursor::default()` for each table.
#[derive(Debug, Clone, Default)]
pub struct CopyCursor(Option<Vec<u8>>);

/// What merging a chunk did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeCounts {
    /// Rows put: new here, or different.
    pub written: u64,
    /// Rows here already as the source has them.
    pub unchanged: u64,
    /// Rows here the source does not have.
    pub deleted: u64,
}

/// When this store's tables were last rebuilt ([`Database::rebuilt`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// The log's last LSN then (0: never rebuilt): its records up to it describe
    /// tables the rebuild replaced.
    pub through: Lsn,
    /// This store holds nothing a failover of this era or an earlier one forked off:
    /// the era it stamped on its commits when it was rebuilt (it had heard of those
    /// failovers, so every commit they forked off preceded the copy), or the era
    /// through which it judged every failover against its log since
    /// ([`Database::settle_forks`]), whichever is later.
    pub era: Epoch,
}

/// Where a copy starts: the source's last LSN and its high-water marks (its own last
/// seq included), read before any row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyPoint {
    pub lsn: Lsn,
    pub marks: BTreeMap<NodeId, u64>,
}

impl Database {
    /// The point a copy starts from: every commit at or below it is in the marks and
    /// visible to a scan that starts afterwards; a later one may be visible too, and
    /// its log record comes after `lsn`.
    pub fn copy_point(&self) -> Result<CopyPoint, StoreError> {
        let lsn = self.last_lsn();
        let marks = self.high_waters()?;
        Ok(CopyPoint { lsn, marks })
    }

    /// A table's committed rows in key order, read from the engine: rows a RETURN
    /// TWOSAFE commit still hides from readers count too (the copy point covers their
    /// commit).
    pub fn copy_scan(
        &self,
        table: &QualName,
    ) -> Result<impl Iterator<Item = Result<Row, StoreError>>, StoreError> {
        let t = self.table_ref(table)?;
        let def = t.def.clone();
        let rows = self
            .inner
            .engine
            .scan(layout::prefix_range(&layout::row_prefix(t.id)), false);
        Ok(rows.map(move |kv| kv.and_then(|(k, v)| decode_stored_row(&def, &k, &v))))
    }

    /// Merges a chunk of copied rows into `table` (validated against its definition
    /// here), without a log record: puts the rows that differ from this node's, and
    /// deletes this node's rows whose keys lie after `cursor` and up to the chunk's
    /// highest key but are not in the chunk. Chunks come in the source's key order; the
    /// cursor (the highest key merged so far, in this node's encoding) makes the
    /// ranges tile the key space even where this node orders keys otherwise: a row
    /// deleted here because its key fell in an earlier chunk's range is put again by
    /// the chunk that has it. [`Database::copy_trim`] deletes what lies past the last
    /// chunk. A store that already holds most of the rows writes only the difference.
    pub async fn copy_merge(
        &self,
        table: &QualName,
        rows: Vec<Row>,
        cursor: &mut CopyCursor,
    ) -> Result<MergeCounts, StoreError> {
        self.copy_merge_keeping(table, rows, cursor, None).await
    }

    /// [`Database::copy_merge`] that keeps every row it replaces or deletes in
    /// `hawser_lost` first, in the same batch, when `keep` is given ([`KeepReplaced`]).
    pub async fn copy_merge_keeping(
        &self,
        table: &QualName,
        rows: Vec<Row>,
        cursor: &mut CopyCursor,
        mut keep: Option<&mut KeepReplaced>,
    ) -> Result<MergeCounts, StoreError> {
        let t = self.table_ref(table)?;
        let mut incoming = BTreeMap::new();
        for row in rows {
            let row = validate_row(&t.def, row)?;
            let key = layout::row_key(t.id, &encode_key(&t.def.key_of(&row)));
            incoming.insert(key, crate::codec::encode_row(&row));
        }
        let mut counts = MergeCounts::default();
        let Some(high) = incoming.keys().next_back().cloned() else {
            return Ok(counts);
        };
        let high = match &cursor.0 {
            Some(prev) if *prev > high => prev.clone(),
            _ => high,
        };
        let lower = match &cursor.0 {
            Some(prev) => Bound::Excluded(prev.clone()),
            None => Bound::Included(layout::row_prefix(t.id)),
        };
        let _serial = self.inner.apply_lock.lock().await;
        let mut batch = WriteBatch::new();
        // This node's rows in the chunk's range: kept when equal, deleted when absent.
        for kv in self
            .inner
            .engine
            .scan((lower, Bound::Included(high.clone())), false)
        {
            let (k, v) = kv?;
            match incoming.get(&k) {
                Some(new) if *new == v => {
                    incoming.remove(&k);
                    counts.unchanged += 1;
                }
                Some(new) => {
                    if let Some(keep) = keep.as_deref_mut() {
                        self.keep_row(&mut batch, keep, &t, &k, &v, Some(new))?;
                    }
                }
                None => {
                    if let Some(keep) = keep.as_deref_mut() {
                        self.keep_row(&mut batch, keep, &t, &k, &v, None)?;
                    }
                    batch.delete(k);
                    counts.deleted += 1;
                }
            }
            if batch.len() >= BATCH_ROWS {
                self.inner.engine.apply(std::mem::take(&mut batch))?;
            }
        }
        for (k, v) in incoming {
            batch.put(k, v);
            counts.written += 1;
            if batch.len() >= BATCH_ROWS {
                self.inner.engine.apply(std::mem::take(&mut batch))?;
            }
        }
        if !batch.is_empty() {
            self.inner.engine.apply(batch)?;
        }
        self.inner
            .count_rows_written(counts.written + counts.deleted);
        *cursor = CopyCursor(Some(high));
        Ok(counts)
    }

    /// Puts each of `rows` into `table` (a duplicate's, without a log record) where its
    /// key is absent here; rows already here stay as they are (a CCD's history).
    pub async fn copy_insert_absent(
        &self,
        table: &QualName,
        rows: Vec<Row>,
    ) -> Result<MergeCounts, StoreError> {
        let t = self.table_ref(table)?;
        let mut counts = MergeCounts::default();
        let _serial = self.inner.apply_lock.lock().await;
        let mut batch = WriteBatch::new();
        for row in rows {
            let row = validate_row(&t.def, row)?;
            let key = layout::row_key(t.id, &encode_key(&t.def.key_of(&row)));
            if self.inner.engine.get(&key)?.is_some() {
                counts.unchanged += 1;
                continue;
            }
            batch.put(key, crate::codec::encode_row(&row));
            counts.written += 1;
            if batch.len() >= BATCH_ROWS {
                self.inner.engine.apply(std::mem::take(&mut batch))?;
            }
        }
        if !batch.is_empty() {
            self.inner.engine.apply(batch)?;
        }
        self.inner.count_rows_written(counts.written);
        Ok(counts)
    }

    /// Deletes this node's rows of `table` past the cursor: after the last chunk,
    /// what the source does not have. Returns how many went.
    pub async fn copy_trim(
        &self,
        table: &QualName,
        cursor: &CopyCursor,
    ) -> Result<u64, StoreError> {
        self.copy_trim_keeping(table, cursor, None).await
    }

    /// [`Database::copy_trim`] that keeps every row it deletes in `hawser_lost` first
    /// when `keep` is given ([`KeepReplaced`]).
    pub async fn copy_trim_keeping(
        &self,
        table: &QualName,
        cursor: &CopyCursor,
        mut keep: Option<&mut KeepReplaced>,
    ) -> Result<u64, StoreError> {
        let t = self.table_ref(table)?;
        let (_, upper) = layout::prefix_range(&layout::row_prefix(t.id));
        let lower = match &cursor.0 {
            Some(prev) => Bound::Excluded(prev.clone()),
            None => Bound::Included(layout::row_prefix(t.id)),
        };
        let _serial = self.inner.apply_lock.lock().await;
        let mut deleted = 0u64;
        let mut lower = lower;
        loop {
            let mut batch = WriteBatch::new();
            let mut last = None;
            let mut n = 0u64;
            for kv in self
                .inner
                .engine
                .scan((lower.clone(), upper.clone()), false)
                .take(BATCH_ROWS)
            {
                let (k, v) = kv?;
                last = Some(k.clone());
                if let Some(keep) = keep.as_deref_mut() {
                    self.keep_row(&mut batch, keep, &t, &k, &v, None)?;
                }
                batch.delete(k);
                n += 1;
            }
            let Some(last) = last else {
                return Ok(deleted);
            };
            self.inner.engine.apply(batch)?;
            self.inner.count_rows_written(n);
            deleted += n;
            lower = Bound::Excluded(last);
        }
    }

    /// Ends a copy: raises this node's high-water marks of other origins to the copy
    /// point's (`start`; this node's own origin is left alone), and has transactions
    /// through `end` — the source's marks once it had read every row — applied in log
    /// order, never compiled. Everything is made durable; the marks go to the `H` keys
    /// and the order to [`layout::COPY_ORDER_KEY`], which opening reads.
    ///
    /// A row copied may reflect commits after `start`: they come again from the
    /// stream, and applied in log order with the DB2 rules and full images they
    /// converge on the source's rows. A compiled run would not: its insert + delete of
    /// a key is nothing, which leaves a row copied between the two (docs/rtl.md, "Apply
    /// semantics and the one divergence"). Past `end` the rows are exactly the
    /// source's, and compiling is safe again. A mark already higher stays (the stream
    /// re-sends what it carries from the point on, and the receiver skips what it has).
    /// Where a sequence stands for a copy: its definition and its restart point — no
    /// value this store handed out lies at or past it, nor will one before it records
    /// another block (`None`: exhausted). `None` when there is no such sequence.
    pub fn copy_sequence_point(&self, name: &QualName) -> Option<(SequenceDef, Option<i64>)> {
        let seq = self.inner.catalog.sequence(name)?;
        let state = seq.lock();
        Some((state.def.clone(), state.restart_at))
    }

    /// A sequence copied from a source: created as the source has it when this store
    /// lacks it, then set at least as far ahead as the source's restart point (never
    /// back), as a replicated block would set it. Returns whether it was created. Both
    /// are local commits here (a CREATE SEQUENCE and a block record of this node).
    pub async fn copy_sequence(
        &self,
        def: SequenceDef,
        restart_at: Option<i64>,
    ) -> Result<bool, StoreError> {
        let name = def.name.clone();
        let created = if self.sequence(&name).is_none() {
            self.create_sequence(def).await?;
            true
        } else {
            false
        };
        self.advance_sequence_as(&name, restart_at, Origin::Local)
            .await?;
        Ok(created)
    }

    pub async fn copy_marks(
        &self,
        start: &BTreeMap<NodeId, u64>,
        end: &BTreeMap<NodeId, u64>,
    ) -> Result<(), StoreError> {
        let _serial = self.inner.apply_lock.lock().await;
        let own = self.node_id();
        let mut batch = WriteBatch::new();
        let mut raised = Vec::new();
        for (&origin, &seq) in start {
            if origin == own || seq <= self.inner.mark(origin) {
                continue;
            }
            if seq > layout::stored_high_water(self.inner.engine.as_ref(), origin)? {
                batch.put(
                    layout::high_water_key(origin),
                    layout::high_water_value(seq, 0),
                );
            }
            raised.push((origin, seq));
        }
        let mut in_order = self.inner.in_order.read().clone();
        for (&origin, &seq) in end {
            if origin != own {
                let e = in_order.entry(origin).or_insert(0);
                *e = (*e).max(seq);
            }
        }
        batch.put(
            layout::COPY_ORDER_KEY.to_vec(),
            layout::encode_marks(&in_order),
        );
        batch.put(
            layout::REBUILT_KEY.to_vec(),
            self.rebuilt_value(self.epoch()),
        );
        self.inner.engine.apply(batch)?;
        self.inner.engine.flush()?;
        *self.inner.in_order.write() = in_order;
        self.inner.marks.raise(raised);
        Ok(())
    }

    /// The last LSN of the log when a duplicate last finished here (0: never): the
    /// records up to it describe tables the copy has since replaced, such as commits a
    /// failover forked off this store before it was rebuilt.
    pub fn rebuilt_through(&self) -> Result<Lsn, StoreError> {
        Ok(self.rebuilt()?.through)
    }

    /// When the tables were last rebuilt here (a duplicate): through which LSN, and
    /// through which failover era nothing forked off is held here ([`Rebuilt`]).
    pub fn rebuilt(&self) -> Result<Rebuilt, StoreError> {
        let Some(v) = self.inner.engine.get(layout::REBUILT_KEY)? else {
            return Ok(Rebuilt::default());
        };
        let word = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("8 bytes"));
        match v.len() {
            // Written before the era was kept: era 0 proves nothing.
            8 => Ok(Rebuilt {
                through: Lsn(word(&v)),
                era: Epoch(0),
            }),
            16 => Ok(Rebuilt {
                through: Lsn(word(&v[..8])),
                era: Epoch(word(&v[8..])),
            }),
            _ => Err(StoreError::corrupt(
                layout::REBUILT_KEY,
                "not an LSN and an era",
            )),
        }
    }

    /// The value of [`layout::REBUILT_KEY`] for a rebuild that ends now: the log's end
    /// and `era` (a whole rebuild's: the era this store stamps on its commits).
    /// Records that this store holds nothing a failover of era ≤ `era` forked off:
    /// every such failover was judged against its log (commits found were set aside).
    /// Raises [`Rebuilt::era`] (never lowers it), keeps [`Rebuilt::through`].
    pub fn settle_forks(&self, era: Epoch) -> Result<(), StoreError> {
        let rebuilt = self.rebuilt()?;
        if era <= rebuilt.era {
            return Ok(());
        }
        let mut v = rebuilt.through.0.to_be_bytes().to_vec();
        v.extend_from_slice(&era.0.to_be_bytes());
        let mut batch = WriteBatch::new();
        batch.put(layout::REBUILT_KEY.to_vec(), v);
        self.inner.engine.apply(batch)?;
        self.inner.engine.flush()
    }

    pub(crate) fn rebuilt_value(&self, era: Epoch) -> Vec<u8> {
        let mut v = self.last_lsn().0.to_be_bytes().to_vec();
        v.extend_from_slice(&era.0.to_be_bytes());
        v
    }

    /// The seq of `origin` through which replicated transactions must be applied in
    /// log order (0: none); see [`Database::copy_marks`].
    pub fn in_order_through(&self, origin: NodeId) -> u64 {
        self.inner
            .in_order
            .read()
            .get(&origin)
            .copied()
            .unwrap_or(0)
    }

    /// Per origin, the highest seq of the log released so far (the `H` keys): a
    /// receiver whose marks reach these lacks nothing the released log held.
    pub fn released_marks(&self) -> Result<BTreeMap<NodeId, u64>, StoreError> {
        let mut out = BTreeMap::new();
        for kv in self
            .inner
            .engine
            .scan(layout::prefix_range(&[layout::HIGH_WATER_PREFIX]), false)
        {
            let (k, v) = kv?;
            let Some(origin) = layout::suffix_u64(&k).filter(|_| k.len() == 9) else {
                return Err(StoreError::corrupt(&k, "malformed high-water key"));
            };
            out.insert(NodeId(origin), layout::decode_high_water(&k, &v)?.0);
        }
        Ok(out)
    }
}
