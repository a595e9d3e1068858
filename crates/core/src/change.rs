//! Row changes and transactions as the commit log records them.
//!
//! Every change carries the row's key and its before- and after-images: apply
//! exceptions, conflict checks, CCD targets, rolling back divergent transactions and
//! RTL compilation all need them (docs/design.md §2).

use serde::{Deserialize, Serialize};

use crate::ids::Gtid;
use crate::name::QualName;
use crate::value::Row;

/// What a change did to its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChangeOp {
    Insert,
    Update,
    Delete,
}

impl ChangeOp {
    /// The single-letter code DB2 CCD tables use (`IBMSNAP_OPERATION`).
    pub fn code(self) -> char {
        match self {
            ChangeOp::Insert => 'I',
            ChangeOp::Update => 'U',
            ChangeOp::Delete => 'D',
        }
    }
}

/// One row change.
///
/// * Insert: `before` is `None`, `after` is the new row, `key` is its key.
/// * Update: both images are present, `key` is the key of `before`; an update that
///   changes the key has `after`'s key different from `key`.
/// * Delete: `after` is `None`, `key` is the key of `before`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowChange {
    pub table: QualName,
    pub op: ChangeOp,
    pub key: Row,
    pub before: Option<Row>,
    pub after: Option<Row>,
}

/// A committed transaction's row changes, in the order they were made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transaction {
    pub gtid: Gtid,
    /// Commit time at the origin, microseconds since the Unix epoch.
    pub commit_micros: i64,
    pub changes: Vec<RowChange>,
}
