//! hawser's storage engine.
//!
//! One node's database: typed tables in one ordered keyspace, transactions with row
//! locks, a commit log with before- and after-images, group commit, sequences, and
//! recovery that needs nothing but the atomic batches it wrote (docs/design.md §2, §3).
//!
//! ```text
//!  sql / stream / control
//!          │  Database, Txn
//!          ▼
//!   db (catalog, commit path, group flush) ── txn (buffer, row locks) ── locks
//!          │                                   sequence (blocks of 20)
//!          ▼  one WriteBatch per commit: rows + log record
//!   engine: KvEngine ── SledEngine (real) | MemEngine (tests, simulation)
//! ```
//!
//! * [`engine`]: the key-value trait and its two engines.
//! * [`layout`]: which key holds what (documented in `docs/storage.md`).
//! * [`db`]: [`Database`], the catalog, committed reads, commit and group flush.
//! * [`txn`]: [`Txn`], buffered writes under exclusive row locks.
//! * [`log`]: what a commit log record holds.
//! * [`aside`]: commits a failover forked off, undone and kept in `hawser_lost`.
//! * [`apply`]: transactions from other origins, applied in log order or as the net
//!   operations of an RTL compilation, idempotently and with the DB2 exception rules.
//! * [`sequence`]: CREATE SEQUENCE semantics.
//! * [`lease`]: which client writes need a master lease, and until when one is held.
//! * [`error`]: [`StoreError`] with SQLSTATE codes.

pub mod aggregate;
pub mod apply;
mod apply_metrics;
pub mod aside;
pub mod blocking;
mod catalog;
mod codec;
mod commit_log;
pub mod conflict;
pub mod copy;
pub mod db;
pub mod engine;
pub mod error;
pub mod format;
mod group_flush;
mod groups;
mod held;
pub mod layout;
pub mod lease;
mod locks;
pub mod log;
mod marks;
pub mod pace;
mod restart;
mod rows;
pub mod sequence;
pub mod space;
pub mod txn;

/// The decoders that read the commit log, the catalog and the write-ahead log back,
/// for the fuzz targets in `crates/fuzz` (they are private to the store otherwise).
/// Each takes bytes as they would come off disk. Not part of the store's API.
#[doc(hidden)]
pub mod fuzzing {
    use hawser_core::{TableDef, Value};

    use crate::engine::wal;
    use crate::error::StoreError;
    use crate::log::LogRecord;
    use crate::sequence::SequenceDef;
    use crate::{codec, WriteBatch};

    /// A commit log record, as reading the log decodes it.
    pub fn decode_record(bytes: &[u8]) -> Result<LogRecord, StoreError> {
        codec::decode_record(b"fuzz", bytes)
    }

    /// The Gtid, commit time and DDL flag a record's head holds (read without the rest).
    pub fn record_head(bytes: &[u8]) -> Result<(hawser_core::Gtid, i64, bool), StoreError> {
        codec::record_head(b"fuzz", bytes).map(|h| (h.gtid, h.commit_micros, h.ddl))
    }

    /// What [`decode_record`] reads.
    pub fn encode_record(record: &LogRecord) -> Vec<u8> {
        codec::encode_record(record)
    }

    /// A stored row.
    pub fn decode_row(bytes: &[u8]) -> Result<Vec<Value>, StoreError> {
        codec::decode_row(b"fuzz", bytes)
    }

    /// What [`decode_row`] reads.
    pub fn encode_row(row: &[Value]) -> Vec<u8> {
        codec::encode_row(row)
    }

    /// A catalog entry of a table: id, version, definition.
    pub fn decode_table(bytes: &[u8]) -> Result<(u64, u64, TableDef), StoreError> {
        codec::decode_table(b"fuzz", bytes)
    }

    /// What [`decode_table`] reads.
    pub fn encode_table(id: u64, version: u64, def: &TableDef) -> Vec<u8> {
        codec::encode_table(id, version, def)
    }

    /// A catalog entry of a sequence and its restart point.
    pub fn decode_sequence(bytes: &[u8]) -> Result<(SequenceDef, Option<i64>), StoreError> {
        codec::decode_sequence(b"fuzz", bytes)
    }

    /// What [`decode_sequence`] reads.
    pub fn encode_sequence(def: &SequenceDef, restart_at: Option<i64>) -> Vec<u8> {
        codec::encode_sequence(def, restart_at)
    }

    /// The batch a write-ahead log frame's payload holds.
    pub fn decode_wal_batch(bytes: &[u8]) -> Result<WriteBatch, String> {
        wal::decode_batch(bytes)
    }

    /// What [`decode_wal_batch`] reads.
    pub fn encode_wal_batch(batch: &WriteBatch) -> Vec<u8> {
        wal::encode_batch(batch)
    }
}

pub use aggregate::AggregateRules;
pub use apply::{ApplyInfo, ReplicatedTxn};
pub use aside::KeepReplaced;
pub use conflict::{ConflictEvent, ConflictRule, CONFLICTS_TABLE};
pub use copy::{CopyCursor, CopyPoint, MergeCounts, Rebuilt};
pub use db::{CommitInfo, Database, DbOptions, KeyRange, Position, RowIter, StoreStats};
pub use engine::{ByteRange, KvEngine, KvIter, MemEngine, SledEngine, WriteBatch};
pub use error::StoreError;
pub use lease::{LeaseGate, LeaseHold, LeaseScope};
pub use log::{DdlOp, LogEntry, LogRecord};
pub use pace::Pacer;
pub use restart::{
    CommitsAfter, Diverged, HeldCommit, RestartCheck, RestartEvidence, RestartPoint,
};
pub use sequence::SequenceDef;
pub use space::SpaceStatus;
pub use txn::{Committed, Savepoint, Txn};
