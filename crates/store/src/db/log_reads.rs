//! The commit log through the database: reading it (from the in-memory tail or the
//! engine), what it holds per origin, releasing it, the links' retained positions, the
//! log's positions (last, written, flushed), the marks and the counters.

use super::*;

impl Database {
    /// Up to `limit` log records from LSN `from` on, in LSN order.
    pub fn log_range(&self, from: Lsn, limit: usize) -> Result<Vec<LogRecord>, StoreError> {
        self.inner
            .engine
            .scan(log_from(from), false)
            .take(limit)
            .map(|kv| kv.and_then(|(k, v)| codec::decode_record(&k, &v)))
            .collect()
    }

    /// The seq of this node's own newest commit at or before `lsn` in the log, looking
    /// at most `look_back` records back from there (`None` when none is found: the
    /// records are released, or all of another origin's).
    pub fn own_seq_through(&self, lsn: Lsn, look_back: usize) -> Result<Option<u64>, StoreError> {
        let own = self.node_id();
        let from = self.log_start();
        if lsn < from || lsn == Lsn::ZERO {
            return Ok(None);
        }
        let range = (
            Bound::Included(layout::log_key(from)),
            Bound::Included(layout::log_key(lsn)),
        );
        for kv in self.inner.engine.scan(range, true).take(look_back) {
            let (k, v) = kv?;
            let head = codec::record_head(&k, &v)?;
            if head.gtid.origin == own {
                return Ok(Some(head.gtid.seq));
            }
        }
        Ok(None)
    }

    /// The tables that this store's log records of the transaction `gtid` write (a
    /// transaction can have several records here when it arrived in parts: see
    /// [`Database::apply_part`]), looking back from the log's end over at most
    /// `look_back` records; `None` when no record of it is found there.
    pub fn tables_of(
        &self,
        gtid: Gtid,
        look_back: usize,
    ) -> Result<Option<BTreeSet<QualName>>, StoreError> {
        let (from, to) = (self.log_start(), self.last_lsn());
        if to < from || to == Lsn::ZERO {
            return Ok(None);
        }
        let range = (
            Bound::Included(layout::log_key(from)),
            Bound::Included(layout::log_key(to)),
        );
        let mut tables: Option<BTreeSet<QualName>> = None;
        for kv in self.inner.engine.scan(range, true).take(look_back) {
            let (k, v) = kv?;
            let head = codec::record_head(&k, &v)?;
            if head.gtid == gtid {
                let found = tables.get_or_insert_with(BTreeSet::new);
                if let LogEntry::Txn(t) = codec::decode_record(&k, &v)?.entry {
                    found.extend(t.changes.into_iter().map(|c| c.table));
                }
            } else if head.gtid.origin == gtid.origin && head.gtid.seq < gtid.seq {
                // The log holds an origin's transactions in seq order: no record of
                // this one comes before an older one.
                break;
            }
        }
        Ok(tables)
    }

    /// The newest commit of `origin` this store holds, by seq and its origin's commit
    /// time (`None` when there is none, or when its record was released before store
    /// format 4, whose `H` keys keep the newest released commit's time). A sender compares it with its own commit under
    /// that seq: another time means the sender gave that seq to another commit — it
    /// lost the one the receiver has.
    pub fn last_commit_of(&self, origin: NodeId) -> Option<HeldCommit> {
        let last = self.inner.log.newest_of(origin)?;
        let mark = if origin == self.node_id() {
            self.inner.commit.lock().last_seq
        } else {
            self.high_water(origin).ok()?
        };
        (last.seq == mark).then_some(last)
    }

    /// The DDL records of the log from LSN `from` on, in log order, read by the LSNs
    /// kept in memory (no scan of the log between them).
    pub fn ddl_from(&self, from: Lsn) -> Result<Vec<LogRecord>, StoreError> {
        let from = from.max(self.log_start());
        // (Released records leave the index as `release_log` releases them.)
        let lsns = self.inner.log.ddl_from(from);
        let mut records = Vec::with_capacity(lsns.len());
        for lsn in lsns {
            match self.log_range(Lsn(lsn), 1)?.pop() {
                Some(r) if r.lsn == Lsn(lsn) => records.push(r),
                // Released meanwhile: whatever came after it is still read.
                _ => {}
            }
        }
        Ok(records)
    }

    /// Up to `limit` records from LSN `from` on, through the last applied LSN, when
    /// the in-memory tail of the log still has `from` (a sender that keeps up): no
    /// read of the engine and no decoding. `None` when `from` is older than the tail;
    /// [`Database::log_range`] has it then.
    pub fn log_tail(&self, from: Lsn, limit: usize) -> Option<Vec<Arc<LogRecord>>> {
        self.inner.log.tail(from, self.last_lsn(), limit)
    }

    /// Bytes of log (keys and encoded records) from LSN `from` on: what a receiver
    /// that has everything before `from` still lacks, as FAILTHRESHOLD measures it.
    /// Counted from the sizes kept in memory, not read from the log.
    pub fn log_bytes_from(&self, from: Lsn) -> Result<u64, StoreError> {
        Ok(self.inner.log.bytes_from(from))
    }

    /// The first LSN still in the log: everything before it was released. One past
    /// [`Database::last_lsn`] when nothing was ever committed.
    pub fn log_start(&self) -> Lsn {
        self.inner.log.start()
    }

    /// Bytes of log (keys and encoded records) still held, from [`Database::log_start`]
    /// on.
    pub fn log_retained_bytes(&self) -> u64 {
        self.inner.log.retained_bytes()
    }

    /// Releases the log through LSN `through`, oldest first, while more than
    /// `keep_bytes` of log would remain: the records are deleted and
    /// [`Database::log_start`] moves past them. The last record is never released
    /// (opening reads the last LSN from it). Returns how many records went.
    ///
    /// The caller decides what nobody needs any more (every stream that retains log
    /// has acknowledged it, docs/design.md §4); a reader asking for released LSNs gets the
    /// log from `log_start` on, so readers compare their position with it first.
    pub fn release_log(&self, through: Lsn, keep_bytes: u64) -> Result<u64, StoreError> {
        const CHUNK: usize = 1024;
        let inner = &self.inner;
        let _one = inner.log.releasing();
        let limit = through.0.min(self.last_lsn().0.saturating_sub(1));
        let mut released = 0u64;
        loop {
            let start = inner.log.start().0;
            let mut retained = self.log_retained_bytes();
            if start > limit || retained <= keep_bytes {
                break;
            }
            let mut batch = WriteBatch::new();
            let mut last = None;
            // The marks the released records carry go to the `H` keys in the same
            // batch: they are what opening derives the marks from.
            let mut released_marks: HashMap<NodeId, HeldCommit> = HashMap::new();
            for kv in inner.engine.scan(log_from(Lsn(start)), false).take(CHUNK) {
                let (k, v) = kv?;
                let lsn = layout::suffix_u64(&k)
                    .ok_or_else(|| StoreError::corrupt(&k, "malformed log key"))?;
                let size = (k.len() + v.len()) as u64;
                if lsn > limit || retained.saturating_sub(size) < keep_bytes {
                    break;
                }
                let head = codec::record_head(&k, &v)?;
                note_last_commit(&mut released_marks, head.gtid, head.commit_micros);
                retained -= size;
                batch.delete(k);
                last = Some(lsn);
            }
            let Some(last) = last else { break };
            let count = batch.len() as u64;
            for (origin, newest) in released_marks {
                if newest.seq > layout::stored_high_water(inner.engine.as_ref(), origin)? {
                    batch.put(
                        layout::high_water_key(origin),
                        layout::high_water_value(newest.seq, newest.commit_micros),
                    );
                }
            }
            inner.engine.apply(batch)?;
            inner.log.released_through(Lsn(last));
            released += count;
        }
        Ok(released)
    }

    /// The retained positions of this node's outbound streams, by link name: the last
    /// LSN each receiver acknowledged durably, and which node it was
    /// ([`Database::set_positions`]).
    pub fn positions(&self) -> Result<BTreeMap<String, Position>, StoreError> {
        let mut out = BTreeMap::new();
        for kv in self
            .inner
            .engine
            .scan(layout::prefix_range(&[layout::POSITION_PREFIX]), false)
        {
            let (k, v) = kv?;
            let name = String::from_utf8(k[1..].to_vec())
                .map_err(|_| StoreError::corrupt(&k, "position name is not UTF-8"))?;
            let position = match v.len() {
                // Written before the receiver's node id was kept.
                8 => Position {
                    lsn: Lsn(u64_value(&k, &v)?),
                    receiver: None,
                },
                16 => Position {
                    lsn: Lsn(u64_value(&k, &v[..8])?),
                    receiver: Some(NodeId(u64_value(&k, &v[8..])?)),
                },
                _ => return Err(StoreError::corrupt(&k, "not a stream position")),
            };
            out.insert(name, position);
        }
        Ok(out)
    }

    /// Records streams' positions (`Some`) and forgets others (`None`), durably: a
    /// release that relies on a position must not outlive it in a crash.
    pub fn set_positions(&self, changes: &[(String, Option<Position>)]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::new();
        for (name, position) in changes {
            let key = layout::position_key(name);
            match position {
                Some(p) => {
                    let mut v = p.lsn.0.to_be_bytes().to_vec();
                    if let Some(node) = p.receiver {
                        v.extend_from_slice(&node.0.to_be_bytes());
                    }
                    batch.put(key, v)
                }
                None => batch.delete(key),
            }
        }
        self.inner.engine.apply(batch)?;
        self.inner.engine.flush()
    }

    /// The LSN of the last committed record (0 when the log is empty).
    pub fn last_lsn(&self) -> Lsn {
        Lsn(self.inner.applied_lsn.load(Ordering::Acquire))
    }

    /// The highest LSN known to be flushed.
    pub fn flushed_lsn(&self) -> Lsn {
        self.inner.flush.flushed()
    }

    /// The highest LSN known to be written to the log: flushed, or written by a
    /// commit flush whose sync is still under way. Such a commit survives a crash of
    /// this process (the kernel holds what was written; opening syncs it), not a
    /// crash of the machine.
    pub fn written_lsn(&self) -> Lsn {
        self.inner.flush.written()
    }

    /// Writes every commit applied so far to the log without syncing it and returns
    /// the new [`Database::written_lsn`]: from here a crash of this process keeps
    /// them. Senders of a node whose commits are not durable
    /// (`DbOptions::durable_commits` false) call it before they ship this node's own
    /// commits, which nobody flushes after their commit: a commit only in memory that
    /// a receiver held would be lost here in a crash of the process, and its seq given
    /// to the next commit, which the receiver would skip as a duplicate.
    pub fn write_ahead(&self) -> Result<Lsn, StoreError> {
        let upto = self.inner.applied_lsn.load(Ordering::Acquire);
        self.inner.engine.write_ahead()?;
        let _ = self.inner.flush.wrote(upto);
        Ok(self.written_lsn())
    }

    /// The written position ([`Database::written_lsn`]) as commit flushes move it,
    /// for the senders that ship this node's commits once written: a commit flush
    /// publishes it between writing the log and syncing it, then lets the tasks it woke
    /// run before it blocks on the sync, so that the receivers' syncs run while this
    /// one does. While anybody watches, commit flushes write the log ahead of their
    /// sync; the store calls no code of its watchers.
    pub fn watch_written(&self) -> tokio::sync::watch::Receiver<Lsn> {
        self.inner.flush.watch_written()
    }

    /// The highest seq of `origin` committed here (0 when none).
    pub fn high_water(&self, origin: NodeId) -> Result<u64, StoreError> {
        if origin == self.node_id() {
            return Ok(self.inner.commit.lock().last_seq);
        }
        Ok(self.inner.mark(origin))
    }

    /// The high-water mark of every origin with a transaction committed here: this
    /// node's own and every origin it applied from (docs/design.md §2). A receiver answers
    /// a sender's `Hello` with these.
    pub fn high_waters(&self) -> Result<BTreeMap<NodeId, u64>, StoreError> {
        let mut marks = self.inner.marks.all();
        let own = self.inner.commit.lock().last_seq;
        if own > 0 {
            marks.insert(self.node_id(), own);
        }
        Ok(marks)
    }

    pub fn stats(&self) -> StoreStats {
        let c = &self.inner.counters;
        StoreStats {
            commits: c.commits.load(Ordering::Relaxed),
            flushes: c.flushes.load(Ordering::Relaxed),
            rows_written: c.rows_written.load(Ordering::Relaxed),
            log_bytes_written: c.log_bytes.load(Ordering::Relaxed),
            log_start: self.log_start(),
            log_retained_bytes: self.log_retained_bytes(),
            last_lsn: self.last_lsn(),
            flushed_lsn: self.flushed_lsn(),
            locks_held: self.inner.locks.held_count() as u64,
        }
    }
}
