//! The store's one error type.
//!
//! Every variant names what it is about (table, column, key, value) and maps to a
//! SQLSTATE with [`StoreError::code`], so the SQL front end and the gRPC edge pass it on
//! without re-wording it. [`StoreError::is_retryable`] separates what a client may
//! simply try again (a lock timeout) from what it must fix.

use std::time::Duration;

use hawser_core::coerce::CoerceError;
use hawser_core::{Gtid, Ident, QualName};
use thiserror::Error;

/// Any failure of the store.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("table {0} does not exist")]
    UndefinedTable(QualName),
    #[error("table {0} already exists")]
    DuplicateTable(QualName),
    #[error("column {column} of table {table} does not exist")]
    UndefinedColumn { table: QualName, column: Ident },
    #[error("column {column} of table {table} already exists")]
    DuplicateColumn { table: QualName, column: Ident },
    #[error("sequence {0} does not exist")]
    UndefinedSequence(QualName),
    #[error("sequence {0} already exists")]
    DuplicateSequence(QualName),
    /// A bad CREATE TABLE / ADD COLUMN (no columns, a key column out of range, ...).
    #[error("invalid definition of table {table}: {reason}")]
    InvalidTableDef { table: QualName, reason: String },
    /// A bad CREATE SEQUENCE (zero increment, START WITH outside the bounds, ...).
    #[error("invalid definition of sequence {name}: {reason}")]
    InvalidSequenceDef { name: QualName, reason: String },
    #[error("duplicate key value in table {table}: key ({key}) already exists")]
    UniqueViolation { table: QualName, key: String },
    #[error("null value in column {column} of table {table} violates not-null constraint")]
    NotNullViolation { table: QualName, column: Ident },
    /// A value that does not fit its column (type, length, range); the code is the cause's.
    #[error("column {column} of table {table}: {source}")]
    InvalidValue {
        table: QualName,
        column: Ident,
        #[source]
        source: CoerceError,
    },
    /// A row or key with the wrong number of values.
    #[error("table {table} expects {expected} {what}, got {got}")]
    WrongArity {
        table: QualName,
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("sequence {name} reached its limit {limit} and does not CYCLE")]
    SequenceExhausted { name: QualName, limit: i64 },
    /// A row lock was not granted within the lock timeout (a deadlock ends this way too).
    #[error("lock on a row of table {table} with key ({key}) not granted within {waited:?}")]
    LockTimeout {
        table: QualName,
        key: String,
        waited: Duration,
    },
    /// DDL changed a table this transaction wrote while it was open.
    #[error("table {0} was dropped or altered while the transaction was open")]
    TableChanged(QualName),
    #[error("not supported: {0}")]
    NotSupported(String),
    /// A client write to a table this store receives from its master.
    #[error("table {table} is read-only here: {reason}")]
    ReceivedTable { table: QualName, reason: String },
    /// A client write while this node does not take writes of its own (see
    /// [`crate::Database::pause_writes`]); retry once the reason is resolved.
    #[error("this node takes no writes now: {0}")]
    WritesPaused(String),
    /// A client write to a table this node masters while it holds no master lease
    /// (see [`crate::lease`]): the cluster may be moving the role. Retry, here or on
    /// the master the reason names.
    #[error("table {table} takes no writes here now: {reason}")]
    NoMasterLease { table: QualName, reason: String },
    /// A commit written here that is not acknowledged: the master lease ran out before
    /// its reply, so the cluster may have moved the role without it. Whether it
    /// survives is not known; a retry may apply it twice.
    #[error(
        "transaction {gtid} was committed on this node but is not acknowledged, and may \
         not survive: {reason}"
    )]
    OutcomeUnknown { gtid: Gtid, reason: String },
    /// The volume of the store's directory has less free space than the store keeps
    /// ([`crate::DbOptions::min_free_bytes`]): writes are refused before they touch the
    /// disk; retry once there is room.
    #[error("disk full: {0}")]
    DiskFull(String),
    /// A replicated transaction could not be applied here (a table it names does not
    /// exist, a row does not fit the table, ...). Nothing of its batch was applied.
    #[error("replicated transaction {gtid}: {source}")]
    Replicated {
        gtid: Gtid,
        #[source]
        source: Box<StoreError>,
    },
    /// A replicated batch that breaks the apply contract: an origin's transactions out
    /// of seq order, a change without the image it needs, a compilation that does not
    /// belong to its run. A sender's or caller's bug; nothing was applied.
    #[error("replicated batch refused: {0}")]
    InvalidBatch(String),
    /// The engine failed to read, write or flush.
    #[error("storage i/o failed during {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Bytes on disk that do not decode.
    #[error("data corrupted at key {key}: {reason}")]
    Corrupt { key: String, reason: String },
    /// A data directory this build must not touch (newer or unknown format).
    #[error("incompatible data directory: {0}")]
    IncompatibleFormat(String),
    /// A write-ahead log that lacks frames between two it holds: damage, which the
    /// store does not guess its way past.
    #[error("damaged write-ahead log: {0}")]
    DamagedLog(String),
}

impl StoreError {
    /// The SQLSTATE code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::UndefinedTable(_) | StoreError::UndefinedSequence(_) => "42P01",
            StoreError::DuplicateTable(_) | StoreError::DuplicateSequence(_) => "42P07",
            StoreError::UndefinedColumn { .. } => "42703",
            StoreError::DuplicateColumn { .. } => "42701",
            StoreError::InvalidTableDef { .. } => "42P16",
            StoreError::InvalidSequenceDef { .. } => "22023",
            StoreError::UniqueViolation { .. } => "23505",
            StoreError::NotNullViolation { .. } => "23502",
            StoreError::InvalidValue { source, .. } => source.code(),
            StoreError::WrongArity { .. } => "42601",
            StoreError::SequenceExhausted { .. } => "2200H",
            StoreError::LockTimeout { .. } => "55P03",
            StoreError::TableChanged(_) => "40001",
            StoreError::NotSupported(_) => "0A000",
            StoreError::ReceivedTable { .. } => "25006",
            StoreError::WritesPaused(_) | StoreError::NoMasterLease { .. } => "57P03",
            StoreError::DiskFull(_) => "53100",
            StoreError::OutcomeUnknown { .. } => "08007",
            StoreError::Replicated { source, .. } => source.code(),
            StoreError::InvalidBatch(_) => "08P01",
            StoreError::Io { .. } => "58030",
            StoreError::Corrupt { .. }
            | StoreError::IncompatibleFormat(_)
            | StoreError::DamagedLog(_) => "XX001",
        }
    }

    /// Whether running the same transaction again may succeed without changing it.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::LockTimeout { .. }
            | StoreError::TableChanged(_)
            | StoreError::WritesPaused(_)
            | StoreError::NoMasterLease { .. }
            | StoreError::DiskFull(_) => true,
            StoreError::Replicated { source, .. } => source.is_retryable(),
            _ => false,
        }
    }

    pub(crate) fn io(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let source: Box<dyn std::error::Error + Send + Sync> = Box::new(source);
        // sled prints its I/O errors with Debug ("IO error: Os { code: 28, ... }"):
        // give the operating system's own words instead.
        let source = match source.downcast::<sled::Error>() {
            Ok(sled) => match *sled {
                sled::Error::Io(io) => Box::new(io) as Box<dyn std::error::Error + Send + Sync>,
                other => Box::new(other),
            },
            Err(other) => other,
        };
        StoreError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn corrupt(key: &[u8], reason: impl std::fmt::Display) -> Self {
        StoreError::Corrupt {
            key: printable_key(key),
            reason: reason.to_string(),
        }
    }
}

/// A raw key for messages: printable ASCII as is, other bytes as `\xNN`.
pub(crate) fn printable_key(key: &[u8]) -> String {
    key.iter()
        .map(|&b| {
            if b.is_ascii_graphic() {
                (b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect()
}
