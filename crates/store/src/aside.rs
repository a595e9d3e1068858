//! Setting aside what a failover forked off: a deposed master's commits past the fork
//! point (and those a subscriber got of them before the master died) are taken out of
//! the tables and kept, change by change, in the `hawser_lost` table — never silently
//! dropped (DESIGN §5, §10.4; MongoDB's rollback files are the model).
//!
//! ```text
//!  node: log records of the forked range, oldest first ─► Database::set_aside
//!     per change, newest first: row now == its after-image? ─ yes ─► put before-image
//!                                                          └─ no ──► leave (moved on)
//!     every change ─► a hawser_lost row; the log's end ─► Mrebuilt_through
//!     all in one atomic batch, flushed
//! ```
//!
//! A change is undone only while the row still holds what it wrote: a row changed
//! since (by the new master's stream, or by this store as master again) holds a value
//! the cluster agreed on, which an old before-image must not replace. Either way the
//! change is kept in `hawser_lost`, with `undone` saying which. Like a duplicate's
//! copy, the undo writes rows without a log record: the forked records stay in the log,
//! and every sender passes them over (their failover era is older than the failover's).

use std::collections::HashMap;

use hawser_core::key::encode_key;
use hawser_core::{ColumnDef, DataType, Ident, QualName, Row, RowChange, TableDef, Value};

use crate::db::{Database, TableRef};
use crate::engine::WriteBatch;
use crate::error::StoreError;
use crate::log::{LogEntry, LogRecord};
use crate::rows::{decode_stored_row, key_text, validate_row};
use crate::{codec, layout};

/// The table set-aside commits are kept in.
pub const LOST_TABLE: &str = "hawser_lost";

/// The longest image or key text kept (longer ones are cut, marked with `…`).
pub(crate) const TEXT_LIMIT: u32 = 16_000;

/// A column of a system table (`hawser_lost`, `hawser_conflicts`): no default.
pub(crate) fn system_column(name: &str, data_type: DataType, nullable: bool) -> ColumnDef {
    ColumnDef {
        name: Ident::unquoted(name),
        data_type,
        nullable,
        default: None,
    }
}

/// The definition of [`LOST_TABLE`]: one row per change of a commit set aside.
pub fn lost_table_def() -> TableDef {
    let col = system_column;
    TableDef {
        name: QualName::bare(LOST_TABLE),
        columns: vec![
            col("origin", DataType::BigInt, false),
            col("seq", DataType::BigInt, false),
            col("change_no", DataType::Integer, false),
            col("era", DataType::BigInt, false),
            col("commit_time", DataType::Timestamp, false),
            col("table_name", DataType::Varchar(1024), false),
            col("op", DataType::Varchar(16), false),
            col("row_key", DataType::Varchar(TEXT_LIMIT), true),
            col("before_image", DataType::Varchar(TEXT_LIMIT), true),
            col("after_image", DataType::Varchar(TEXT_LIMIT), true),
            col("undone", DataType::Boolean, false),
        ],
        primary_key: vec![0, 1, 2],
        explicit_key: true,
    }
}

/// What a rebuild keeps of the rows it replaces or removes (a duplicate run with
/// [`Database::keep_replaced`]): for a store whose log no longer tells which of its
/// commits no survivor has, every row the copy changes is kept in [`LOST_TABLE`]
/// before it goes — under origin 0 (no log record says which commit wrote it), `seq`
/// the rebuild's number, one `change_no` per row, `op` `replaced` or `removed`, the
/// row as it was here (`before_image`) and as the source has it (`after_image`), and
/// `undone` true. Some of them are older versions the source changed since, not
/// commits of this store's own: kept all the same, never silently dropped.
#[derive(Debug)]
pub struct KeepReplaced {
    rebuild: i64,
    next_change: i64,
    era: i64,
    micros: i64,
    /// Rows kept so far.
    pub kept: u64,
}

impl KeepReplaced {
    /// The rebuild's number: `seq` of its rows in [`LOST_TABLE`] (origin 0).
    pub fn rebuild(&self) -> u64 {
        self.rebuild as u64
    }
}

/// What [`Database::set_aside`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAsideCounts {
    /// Commits set aside.
    pub commits: u64,
    /// Their changes, each kept in [`LOST_TABLE`].
    pub changes: u64,
    /// Changes undone (the row still held what they wrote).
    pub undone: u64,
}

/// `s` as a text value of at most [`TEXT_LIMIT`] characters (cut with `…`).
pub(crate) fn text(s: String) -> Value {
    let limit = TEXT_LIMIT as usize;
    if s.chars().count() <= limit {
        return Value::Text(s);
    }
    let mut cut: String = s.chars().take(limit - 1).collect();
    cut.push('…');
    Value::Text(cut)
}

/// A row image as text, `(v1, v2, …)`; NULL for none.
pub(crate) fn image(row: &Option<Row>) -> Value {
    match row {
        Some(r) => text(format!("({})", key_text(r))),
        None => Value::Null,
    }
}

impl Database {
    /// Sets aside `records` (commits a failover forked off, oldest first): undoes each
    /// change, newest first, where the row still holds what it wrote, keeps every
    /// change in [`LOST_TABLE`] (created if missing), and marks each commit set aside
    /// ([`Database::is_set_aside`]), so it is never set aside again. One atomic batch,
    /// flushed before it returns.
    ///
    /// The marks name the commits, not a point of the log: a failover this node learns
    /// of later may fork off commits older than these, and they must still be found.
    pub async fn set_aside(&self, records: &[LogRecord]) -> Result<SetAsideCounts, StoreError> {
        let lost_name = QualName::bare(LOST_TABLE);
        if self.table(&lost_name).is_none() {
            // A catalog change of this node's own, like any CREATE TABLE here.
            self.create_table(lost_table_def()).await?;
        }
        let lost = self.table_ref(&lost_name)?;
        let _serial = self.inner.apply_lock.lock().await;
        // Thousands of undos, reads and an fsync: off the async workers, which would
        // otherwise answer nothing meanwhile.
        let db = self.clone();
        let records = records.to_vec();
        tokio::task::spawn_blocking(move || db.set_aside_now(&records, &lost))
            .await
            .map_err(|e| StoreError::io("setting commits aside", e))?
    }

    /// [`Database::set_aside`]'s work, under its apply lock.
    fn set_aside_now(
        &self,
        records: &[LogRecord],
        lost: &TableRef,
    ) -> Result<SetAsideCounts, StoreError> {
        let lost = lost.clone();
        let mut batch = WriteBatch::new();
        // Rows as this batch leaves them, for changes of one row undone in turn.
        let mut pending: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
        let mut counts = SetAsideCounts::default();
        for record in records.iter().rev() {
            counts.commits += 1;
            let gtid = record.entry.gtid();
            batch.put(layout::aside_key(gtid), Vec::new());
            let micros = record.entry.commit_micros();
            let lost_row = |no: usize,
                            table: &QualName,
                            op: &str,
                            change: Option<&RowChange>,
                            undone: bool| {
                vec![
                    Value::Int(gtid.origin.0 as i64),
                    Value::Int(gtid.seq as i64),
                    Value::Int(no as i64),
                    Value::Int(record.epoch.0 as i64),
                    Value::Timestamp(micros),
                    text(table.to_string()),
                    text(op.to_string()),
                    change.map_or(Value::Null, |c| text(key_text(&c.key))),
                    change.map_or(Value::Null, |c| image(&c.before)),
                    change.map_or(Value::Null, |c| image(&c.after)),
                    Value::Bool(undone),
                ]
            };
            let LogEntry::Txn(t) = &record.entry else {
                // A catalog change or a sequence block: kept, not undone.
                let what = match &record.entry {
                    LogEntry::Ddl { .. } => "ddl",
                    _ => "sequence",
                };
                let row = lost_row(0, &QualName::bare("-"), what, None, false);
                self.put_lost(&mut batch, &lost, row)?;
                counts.changes += 1;
                continue;
            };
            for (no, change) in t.changes.iter().enumerate().rev() {
                let undone = match self.table_ref(&change.table) {
                    Ok(table) => self.undo(&mut batch, &mut pending, &table, change)?,
                    // Dropped since: nothing to undo in it.
                    Err(StoreError::UndefinedTable(_)) => false,
                    Err(e) => return Err(e),
                };
                counts.changes += 1;
                counts.undone += u64::from(undone);
                let op = format!("{:?}", change.op).to_lowercase();
                let row = lost_row(no, &change.table, &op, Some(change), undone);
                self.put_lost(&mut batch, &lost, row)?;
            }
        }
        let rows = batch.len() as u64;
        self.inner.engine.apply(batch)?;
        self.inner.engine.flush()?;
        self.inner.count_rows_written(rows);
        Ok(counts)
    }

    /// Whether the commit `gtid` was set aside here ([`Database::set_aside`]).
    pub fn is_set_aside(&self, gtid: hawser_core::Gtid) -> Result<bool, StoreError> {
        Ok(self.inner.engine.get(&layout::aside_key(gtid))?.is_some())
    }

    /// Starts keeping what a rebuild replaces ([`KeepReplaced`]); creates
    /// [`LOST_TABLE`] if missing. Its rebuild number follows the last one kept there.
    pub async fn keep_replaced(&self) -> Result<KeepReplaced, StoreError> {
        let lost_name = QualName::bare(LOST_TABLE);
        if self.table(&lost_name).is_none() {
            self.create_table(lost_table_def()).await?;
        }
        let lost = self.table_ref(&lost_name)?;
        // The highest rebuild number under origin 0: the first key of origin 1 bounds
        // them from above, read backwards.
        let from = layout::row_key(lost.id, &encode_key(&[Value::Int(0), Value::Int(0)]));
        let to = layout::row_key(lost.id, &encode_key(&[Value::Int(1)]));
        let last = match self
            .inner
            .engine
            .scan(
                (
                    std::ops::Bound::Included(from),
                    std::ops::Bound::Excluded(to),
                ),
                true,
            )
            .next()
        {
            Some(kv) => {
                let (k, v) = kv?;
                match decode_stored_row(&lost.def, &k, &v)?.get(1) {
                    Some(Value::Int(n)) => *n,
                    _ => 0,
                }
            }
            None => 0,
        };
        Ok(KeepReplaced {
            rebuild: last + 1,
            next_change: 0,
            era: self.epoch().0 as i64,
            micros: crate::db::now_micros(),
            kept: 0,
        })
    }

    /// Puts into `batch` the [`LOST_TABLE`] row that keeps `here` (this store's row of
    /// `table` at `key`, which a rebuild replaces with `source`, or removes).
    pub(crate) fn keep_row(
        &self,
        batch: &mut WriteBatch,
        keep: &mut KeepReplaced,
        table: &TableRef,
        key: &[u8],
        here: &[u8],
        source: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let lost = self.table_ref(&QualName::bare(LOST_TABLE))?;
        let before = decode_stored_row(&table.def, key, here)?;
        let after = source
            .map(|bytes| decode_stored_row(&table.def, key, bytes))
            .transpose()?;
        let row = vec![
            Value::Int(0),
            Value::Int(keep.rebuild),
            Value::Int(keep.next_change),
            Value::Int(keep.era),
            Value::Timestamp(keep.micros),
            text(table.def.name.to_string()),
            text(
                if source.is_some() {
                    "replaced"
                } else {
                    "removed"
                }
                .to_string(),
            ),
            text(key_text(&table.def.key_of(&before))),
            image(&Some(before)),
            image(&after),
            Value::Bool(true),
        ];
        keep.next_change += 1;
        keep.kept += 1;
        self.put_lost(batch, &lost, row)
    }

    fn put_lost(
        &self,
        batch: &mut WriteBatch,
        lost: &TableRef,
        row: Row,
    ) -> Result<(), StoreError> {
        let row = validate_row(&lost.def, row)?;
        let key = layout::row_key(lost.id, &encode_key(&lost.def.key_of(&row)));
        batch.put(key, codec::encode_row(&row));
        Ok(())
    }

    /// Puts `change`'s before-image back if the row holds its after-image; whether it
    /// did.
    fn undo(
        &self,
        batch: &mut WriteBatch,
        pending: &mut HashMap<Vec<u8>, Option<Vec<u8>>>,
        table: &TableRef,
        change: &RowChange,
    ) -> Result<bool, StoreError> {
        let key = layout::row_key(table.id, &encode_key(&change.key));
        let stored = match pending.get(&key) {
            Some(v) => v.clone(),
            None => self.inner.engine.get(&key)?,
        };
        let now = stored
            .map(|bytes| decode_stored_row(&table.def, &key, &bytes))
            .transpose()?;
        if now != change.after {
            return Ok(false);
        }
        let restored = match &change.before {
            Some(row) => {
                let row = validate_row(&table.def, row.clone())?;
                let bytes = codec::encode_row(&row);
                batch.put(key.clone(), bytes.clone());
                Some(bytes)
            }
            None => {
                batch.delete(key.clone());
                None
            }
        };
        pending.insert(key, restored);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DbOptions;
    use hawser_core::{Epoch, NodeId, Value as V};

    fn table() -> TableDef {
        TableDef {
            name: QualName::bare("t"),
            columns: vec![
                ColumnDef {
                    name: Ident::unquoted("k"),
                    data_type: DataType::BigInt,
                    nullable: false,
                    default: None,
                },
                ColumnDef {
                    name: Ident::unquoted("v"),
                    data_type: DataType::BigInt,
                    nullable: true,
                    default: None,
                },
            ],
            primary_key: vec![0],
            explicit_key: true,
        }
    }

    async fn commit(db: &Database, f: impl AsyncFnOnce(&mut crate::Txn)) {
        let mut txn = db.begin();
        f(&mut txn).await;
        txn.commit().await.unwrap();
    }

    fn rows(db: &Database, name: &str) -> Vec<Row> {
        db.scan(&QualName::bare(name), crate::KeyRange::all())
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[tokio::test]
    async fn a_rebuild_keeps_every_row_it_replaces_or_removes() {
        let db = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
        db.create_table(table()).await.unwrap();
        let t = QualName::bare("t");
        for k in 1..=4 {
            commit(&db, async |x| {
                x.insert(&t, vec![V::Int(k), V::Int(k)]).await.unwrap()
            })
            .await;
        }
        let source = |pairs: &[(i64, i64)]| -> Vec<Row> {
            pairs
                .iter()
                .map(|(k, v)| vec![V::Int(*k), V::Int(*v)])
                .collect()
        };
        for rebuild in 1..=2 {
            let mut keep = db.keep_replaced().await.unwrap();
            let mut cursor = crate::CopyCursor::default();
            // The source has 1 as here, 2 changed, 3 not at all (within the chunk), 4
            // not at all (past the last chunk: the trim's).
            let merged = db
                .copy_merge_keeping(
                    &t,
                    source(&[(1, 1), (2, 20 * rebuild)]),
                    &mut cursor,
                    Some(&mut keep),
                )
                .await
                .unwrap();
            assert_eq!((merged.written, merged.unchanged), (1, 1));
            db.copy_trim_keeping(&t, &cursor, Some(&mut keep))
                .await
                .unwrap();
            assert_eq!(
                rows(&db, "t"),
                [
                    vec![V::Int(1), V::Int(1)],
                    vec![V::Int(2), V::Int(20 * rebuild)]
                ]
            );
            let kept: Vec<Row> = rows(&db, LOST_TABLE)
                .into_iter()
                .filter(|r| r[1] == V::Int(rebuild))
                .collect();
            // Rebuilt again: only row 2 differs from the source then.
            let expect = if rebuild == 1 { 3 } else { 1 };
            assert_eq!((kept.len(), keep.kept), (expect, expect as u64), "{kept:?}");
            assert!(kept
                .iter()
                .all(|r| r[0] == V::Int(0) && r[10] == V::Bool(true)));
            let replaced = &kept[0];
            assert_eq!(replaced[6], V::Text("replaced".into()));
            assert_eq!(
                replaced[8],
                V::Text(format!("(2, {})", if rebuild == 1 { 2 } else { 20 }))
            );
            assert_eq!(replaced[9], V::Text(format!("(2, {})", 20 * rebuild)));
            if rebuild == 1 {
                let ops: Vec<&V> = kept.iter().map(|r| &r[6]).collect();
                assert_eq!(
                    ops,
                    [
                        &V::Text("replaced".into()),
                        &V::Text("removed".into()),
                        &V::Text("removed".into())
                    ]
                );
                assert_eq!(kept[2][8], V::Text("(4, 4)".into()));
                assert_eq!(kept[2][9], V::Null);
            }
        }
    }

    #[tokio::test]
    async fn forked_commits_are_undone_where_the_row_holds_them_and_all_kept() {
        let db = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
        db.create_table(table()).await.unwrap();
        let t = QualName::bare("t");
        commit(&db, async |x| {
            x.insert(&t, vec![V::Int(1), V::Int(10)]).await.unwrap()
        })
        .await;
        commit(&db, async |x| {
            x.insert(&t, vec![V::Int(2), V::Int(20)]).await.unwrap()
        })
        .await;
        let fork = db.high_water(NodeId(1)).unwrap();
        // Forked off: an insert, an update of row 1 twice, a delete of row 2.
        commit(&db, async |x| {
            x.insert(&t, vec![V::Int(3), V::Int(30)]).await.unwrap()
        })
        .await;
        commit(&db, async |x| {
            x.update(&t, &[V::Int(1)], vec![V::Int(1), V::Int(11)])
                .await
                .unwrap();
        })
        .await;
        commit(&db, async |x| {
            x.update(&t, &[V::Int(1)], vec![V::Int(1), V::Int(12)])
                .await
                .unwrap();
            x.delete(&t, &[V::Int(2)]).await.unwrap();
        })
        .await;
        let (forked, complete) = db
            .commits_after(NodeId(1), fork, u64::MAX, usize::MAX, |r| r)
            .unwrap();
        assert!(complete);
        assert_eq!(forked.len(), 3);
        // Row 3 moved on since (a later value the cluster agreed on): left as it is.
        commit(&db, async |x| {
            x.update(&t, &[V::Int(3)], vec![V::Int(3), V::Int(33)])
                .await
                .unwrap();
        })
        .await;
        let counts = db.set_aside(&forked).await.unwrap();
        assert_eq!(
            counts,
            SetAsideCounts {
                commits: 3,
                changes: 4,
                undone: 3
            }
        );
        assert_eq!(
            rows(&db, "t"),
            [
                vec![V::Int(1), V::Int(10)],
                vec![V::Int(2), V::Int(20)],
                vec![V::Int(3), V::Int(33)],
            ]
        );
        let lost = rows(&db, LOST_TABLE);
        assert_eq!(lost.len(), 4);
        let undone: Vec<bool> = lost.iter().map(|r| r[10] == V::Bool(true)).collect();
        assert_eq!(
            undone,
            [false, true, true, true],
            "row 3's insert was not undone"
        );
        // Each commit is marked, by its Gtid: the log's point of a rebuild stays.
        for r in &forked {
            assert!(db.is_set_aside(r.entry.gtid()).unwrap());
        }
        assert!(!db
            .is_set_aside(hawser_core::Gtid::new(NodeId(1), fork))
            .unwrap());
        assert_eq!(db.rebuilt_through().unwrap(), hawser_core::Lsn(0));
    }

    #[test]
    fn settled_failovers_raise_the_era_nothing_forked_off_is_held_under() {
        let db = Database::open_memory(DbOptions::new(NodeId(1))).unwrap();
        assert_eq!(db.rebuilt().unwrap(), crate::Rebuilt::default());
        db.settle_forks(Epoch(3)).unwrap();
        assert_eq!(db.rebuilt().unwrap().era, Epoch(3));
        // Never lowered, and the rebuild's point of the log stays where it was.
        db.settle_forks(Epoch(2)).unwrap();
        let r = db.rebuilt().unwrap();
        assert_eq!((r.era, r.through), (Epoch(3), hawser_core::Lsn(0)));
    }
}
