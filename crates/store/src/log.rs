//! What the commit log holds (docs/design.md §2).
//!
//! Every commit — a transaction's row changes, a DDL statement, a sequence block
//! reservation — becomes one [`LogRecord`] under the next LSN, written in the same
//! atomic batch as the changes it describes. Each record also takes the next `seq` of
//! its origin, so `Gtid`s are dense per origin. Replication reads this log to ship
//! commits; receiver-side apply ([`crate::apply`]) appends records of other origins here
//! too, under new local LSNs with their original Gtids and epochs.

use hawser_core::{ColumnDef, Epoch, Gtid, Lsn, QualName, TableDef, Transaction};

use crate::sequence::SequenceDef;

/// One committed entry at one LSN.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    pub lsn: Lsn,
    /// The element epoch in force when it was committed.
    pub epoch: Epoch,
    pub entry: LogEntry,
}

impl LogRecord {
    /// The global id of the entry.
    pub fn gtid(&self) -> Gtid {
        self.entry.gtid()
    }
}

/// What a log record describes.
#[derive(Debug, Clone, PartialEq)]
pub enum LogEntry {
    /// Row changes, with before- and after-images, in the order they were made.
    Txn(Transaction),
    /// A catalog change.
    Ddl {
        gtid: Gtid,
        commit_micros: i64,
        op: DdlOp,
    },
    /// A sequence reserved a new block of values: it will hand out nothing at or past
    /// `restart_at` (in its direction) without writing another record. `None` means
    /// the block runs to the sequence's limit. A subscriber sets its copy ahead to it.
    SequenceBlock {
        gtid: Gtid,
        commit_micros: i64,
        name: QualName,
        restart_at: Option<i64>,
    },
}

impl LogEntry {
    pub fn gtid(&self) -> Gtid {
        match self {
            LogEntry::Txn(t) => t.gtid,
            LogEntry::Ddl { gtid, .. } | LogEntry::SequenceBlock { gtid, .. } => *gtid,
        }
    }

    pub fn commit_micros(&self) -> i64 {
        match self {
            LogEntry::Txn(t) => t.commit_micros,
            LogEntry::Ddl { commit_micros, .. } | LogEntry::SequenceBlock { commit_micros, .. } => {
                *commit_micros
            }
        }
    }
}

/// A DDL statement as the log records it.
#[derive(Debug, Clone, PartialEq)]
pub enum DdlOp {
    CreateTable(TableDef),
    DropTable(QualName),
    AddColumn { table: QualName, column: ColumnDef },
    CreateSequence(SequenceDef),
    DropSequence(QualName),
}
