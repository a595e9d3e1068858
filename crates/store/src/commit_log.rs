//! What the store keeps in memory of its commit log, beside the records in the engine:
//! where the log starts, each record's size (FAILTHRESHOLD and retention count bytes
//! without reading the log), the newest records decoded (senders that keep up read
//! them without the engine), the DDL records' LSNs and each origin's newest commit.
//!
//! Records are added under the commit mutex once their batch is in the engine
//! ([`CommitLog::appended`], in LSN order); the oldest leave by release
//! ([`CommitLog::released_through`], one release at a time: [`CommitLog::releasing`]).
//! Readers compare what they get with the applied LSN: what is added here before that
//! LSN moves is not read.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hawser_core::{Gtid, Lsn, NodeId};
use parking_lot::{Mutex, MutexGuard};

use crate::log::{LogEntry, LogRecord};
use crate::restart::HeldCommit;

/// How many of the newest log records [`CommitLog::tail`] keeps decoded in memory.
pub const TAIL_RECORDS: usize = 4096;

/// How many bytes of log (as stored) the tail keeps at most, whatever the records'
/// count: 4,096 transactions of 40 MiB would otherwise be 160 GiB held. The newest
/// record stays whatever its size: the senders are about to read it.
pub const TAIL_BYTES: u64 = 64 * 1024 * 1024;

pub(crate) struct CommitLog {
    /// The first LSN still in the log (one past the last when it is empty): records
    /// before it were released.
    start: AtomicU64,
    /// The size of every record held; `start` moves under this lock too.
    sizes: Mutex<LogSizes>,
    /// Held by the one release in progress.
    release: Mutex<()>,
    /// The newest records, decoded, at most [`TAIL_RECORDS`] and [`TAIL_BYTES`].
    tail: Mutex<Tail>,
    /// The LSNs of the DDL records held.
    ddl: Mutex<BTreeSet<u64>>,
    /// Each origin's newest commit in the log, by seq and commit time.
    newest: Mutex<HashMap<NodeId, HeldCommit>>,
}

impl CommitLog {
    /// The log as opening found it.
    pub(crate) fn opened(
        start: u64,
        sizes: LogSizes,
        ddl: BTreeSet<u64>,
        newest: HashMap<NodeId, HeldCommit>,
    ) -> Self {
        CommitLog {
            start: AtomicU64::new(start),
            sizes: Mutex::new(sizes),
            release: Mutex::new(()),
            tail: Mutex::new(Tail::default()),
            ddl: Mutex::new(ddl),
            newest: Mutex::new(newest),
        }
    }

    /// The first LSN still in the log.
    pub(crate) fn start(&self) -> Lsn {
        Lsn(self.start.load(Ordering::Acquire))
    }

    /// Records just applied to the engine, in LSN order, each with its size in the
    /// log (key and encoded record). Called under the commit mutex.
    pub(crate) fn appended(&self, records: &[Arc<LogRecord>], sizes: &[u64]) {
        debug_assert_eq!(records.len(), sizes.len(), "a size for every record");
        {
            let mut newest = self.newest.lock();
            for r in records {
                note_last_commit(&mut newest, r.entry.gtid(), r.entry.commit_micros());
                if matches!(r.entry, LogEntry::Ddl { .. }) {
                    self.ddl.lock().insert(r.lsn.0);
                }
            }
        }
        {
            let mut held = self.sizes.lock();
            for &size in sizes {
                held.push(size);
            }
        }
        let mut tail = self.tail.lock();
        for (r, &size) in records.iter().zip(sizes) {
            tail.push(r.clone(), size);
        }
    }

    /// `origin`'s newest commit in the log (or the newest released, as the `H` keys
    /// keep it).
    pub(crate) fn newest_of(&self, origin: NodeId) -> Option<HeldCommit> {
        self.newest.lock().get(&origin).copied()
    }

    /// The LSNs of the DDL records from `from` on.
    pub(crate) fn ddl_from(&self, from: Lsn) -> Vec<u64> {
        self.ddl.lock().range(from.0..).copied().collect()
    }

    /// Up to `limit` records from `from` through `last` (the applied LSN), when the
    /// tail still has `from`; `None` when `from` is older than the tail.
    pub(crate) fn tail(&self, from: Lsn, last: Lsn, limit: usize) -> Option<Vec<Arc<LogRecord>>> {
        let tail = self.tail.lock();
        let first = tail.records.front()?.0.lsn;
        if from < first || from > last {
            return (from > last && from >= first).then(Vec::new);
        }
        let skip = usize::try_from(from.0 - first.0).ok()?;
        Some(
            tail.records
                .iter()
                .skip(skip)
                .map(|(r, _)| r)
                .take_while(|r| r.lsn <= last)
                .take(limit)
                .cloned()
                .collect(),
        )
    }

    /// Bytes of log from LSN `from` on.
    pub(crate) fn bytes_from(&self, from: Lsn) -> u64 {
        let sizes = self.sizes.lock();
        let start = self.start.load(Ordering::Acquire);
        sizes.bytes_from(from.0.saturating_sub(start))
    }

    /// Bytes of log still held.
    pub(crate) fn retained_bytes(&self) -> u64 {
        self.sizes.lock().bytes_from(0)
    }

    /// Held while a release runs: one at a time.
    pub(crate) fn releasing(&self) -> MutexGuard<'_, ()> {
        self.release.lock()
    }

    /// The records through `last` were deleted from the engine.
    pub(crate) fn released_through(&self, last: Lsn) {
        {
            let mut sizes = self.sizes.lock();
            let start = self.start.load(Ordering::Acquire);
            sizes.release((last.0 + 1).saturating_sub(start));
            self.start.store(last.0 + 1, Ordering::Release);
        }
        let mut ddl = self.ddl.lock();
        *ddl = ddl.split_off(&(last.0 + 1));
    }
}

/// The newest records, each with its size in the log, and their total.
#[derive(Default)]
struct Tail {
    records: VecDeque<(Arc<LogRecord>, u64)>,
    bytes: u64,
}

impl Tail {
    /// Adds the newest record, then lets the oldest go while the tail is past
    /// [`TAIL_RECORDS`] or [`TAIL_BYTES`], keeping the newest.
    fn push(&mut self, record: Arc<LogRecord>, size: u64) {
        self.records.push_back((record, size));
        self.bytes += size;
        while self.records.len() > 1
            && (self.records.len() > TAIL_RECORDS || self.bytes > TAIL_BYTES)
        {
            if let Some((_, size)) = self.records.pop_front() {
                self.bytes -= size;
            }
        }
    }
}

/// The size of every log record held, so the bytes from an LSN on are known without
/// reading the log: cumulative bytes (key and encoded record) through each record
/// from `log_start` on, counted from an arbitrary origin. LSNs are dense, so the
/// record at LSN `log_start + i` is entry `i`.
#[derive(Default)]
pub(crate) struct LogSizes {
    /// Cumulative bytes through the last record released.
    released: u64,
    /// Cumulative bytes through `log_start + i`.
    through: VecDeque<u64>,
}

impl LogSizes {
    /// Records counted.
    pub(crate) fn len(&self) -> u64 {
        self.through.len() as u64
    }

    pub(crate) fn push(&mut self, size: u64) {
        let end = self.through.back().copied().unwrap_or(self.released);
        self.through.push_back(end + size);
    }

    /// Forgets the oldest `count` records (released).
    fn release(&mut self, count: u64) {
        for _ in 0..count {
            match self.through.pop_front() {
                Some(c) => self.released = c,
                None => break,
            }
        }
    }

    /// Bytes of the records from entry `index` on.
    pub(crate) fn bytes_from(&self, index: u64) -> u64 {
        let end = self.through.back().copied().unwrap_or(self.released);
        let before = match index.checked_sub(1) {
            None => self.released,
            Some(i) => usize::try_from(i)
                .ok()
                .and_then(|i| self.through.get(i))
                .copied()
                .unwrap_or(end),
        };
        end - before
    }
}

/// Raises `origin`'s newest commit in `last` to `gtid` (made at `commit_micros`).
pub(crate) fn note_last_commit(
    last: &mut HashMap<NodeId, HeldCommit>,
    gtid: Gtid,
    commit_micros: i64,
) {
    let c = last.entry(gtid.origin).or_insert(HeldCommit {
        seq: 0,
        commit_micros,
    });
    if gtid.seq >= c.seq {
        *c = HeldCommit {
            seq: gtid.seq,
            commit_micros,
        };
    }
}

#[cfg(test)]
mod tests {
    use hawser_core::{Epoch, QualName, Transaction};

    use super::*;
    use crate::log::DdlOp;

    fn txn(lsn: u64, seq: u64) -> Arc<LogRecord> {
        Arc::new(LogRecord {
            lsn: Lsn(lsn),
            epoch: Epoch(0),
            entry: LogEntry::Txn(Transaction {
                gtid: Gtid::new(NodeId(1), seq),
                commit_micros: seq as i64 * 10,
                changes: Vec::new(),
            }),
        })
    }

    fn ddl(lsn: u64, seq: u64) -> Arc<LogRecord> {
        Arc::new(LogRecord {
            lsn: Lsn(lsn),
            epoch: Epoch(0),
            entry: LogEntry::Ddl {
                gtid: Gtid::new(NodeId(1), seq),
                commit_micros: seq as i64 * 10,
                op: DdlOp::DropTable(QualName::bare("t")),
            },
        })
    }

    #[test]
    fn appended_records_are_counted_read_back_and_released() {
        let log = CommitLog::opened(1, LogSizes::default(), BTreeSet::new(), HashMap::new());
        log.appended(&[txn(1, 1), ddl(2, 2)], &[100, 50]);
        log.appended(&[txn(3, 3)], &[25]);
        assert_eq!(log.retained_bytes(), 175);
        assert_eq!(log.bytes_from(Lsn(2)), 75);
        assert_eq!(log.ddl_from(Lsn(1)), vec![2]);
        assert_eq!(
            log.newest_of(NodeId(1)),
            Some(HeldCommit {
                seq: 3,
                commit_micros: 30
            })
        );
        // The tail up to the applied LSN only; past it, nothing yet.
        let lsns = |v: Option<Vec<Arc<LogRecord>>>| {
            v.map(|v| v.iter().map(|r| r.lsn.0).collect::<Vec<_>>())
        };
        assert_eq!(lsns(log.tail(Lsn(2), Lsn(2), 10)), Some(vec![2]));
        assert_eq!(lsns(log.tail(Lsn(4), Lsn(3), 10)), Some(vec![]));
        log.released_through(Lsn(2));
        assert_eq!(log.start(), Lsn(3));
        assert_eq!(log.retained_bytes(), 25);
        assert!(log.ddl_from(Lsn(1)).is_empty());
    }

    #[test]
    fn the_tail_keeps_at_most_its_records_and_bytes_and_always_the_newest() {
        let mut tail = Tail::default();
        for lsn in 1..=(TAIL_RECORDS as u64 + 3) {
            tail.push(txn(lsn, lsn), 10);
        }
        assert_eq!(tail.records.len(), TAIL_RECORDS);
        assert_eq!(tail.records.front().unwrap().0.lsn, Lsn(4));
        assert_eq!(tail.bytes, 10 * TAIL_RECORDS as u64);
        // Large records: as many as fit in the bytes.
        let big = TAIL_BYTES / 4;
        for lsn in 5000..5010 {
            tail.push(txn(lsn, lsn), big);
        }
        assert_eq!(tail.records.len(), 4);
        assert_eq!(tail.bytes, 4 * big);
        assert_eq!(tail.records.front().unwrap().0.lsn, Lsn(5006));
        // One larger than the bound on its own: it stays, alone.
        tail.push(txn(6000, 6000), 2 * TAIL_BYTES);
        assert_eq!(tail.records.len(), 1);
        assert_eq!(tail.bytes, 2 * TAIL_BYTES);
        // And goes at the next.
        tail.push(txn(6001, 6001), 1);
        assert_eq!(tail.records.len(), 1);
        assert_eq!(tail.bytes, 1);
    }
}
