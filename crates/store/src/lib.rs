//! hawser's storage engine.
//!
//! One node's database: typed tables in one ordered keyspace, transactions with row
//! locks, a commit log with before- and after-images, group commit, sequences, and
//! recovery that needs nothing but the atomic batches it wrote (DESIGN.md §2, §3).
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

pub mod apply;
pub mod aside;
mod codec;
pub mod copy;
pub mod db;
pub mod engine;
pub mod error;
mod held;
pub mod layout;
pub mod lease;
mod locks;
pub mod log;
pub mod pace;
mod restart;
pub mod sequence;
pub mod space;
pub mod txn;
mod wal;

pub use apply::{ApplyInfo, ReplicatedTxn};
pub use aside::KeepReplaced;
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
pub use txn::{Savepoint, Txn};
