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

impl RowChange {
    /// About how many bytes of values the change holds ([`crate::Value::approx_bytes`]):
    /// how much work writing or encoding it is.
    pub fn approx_bytes(&self) -> usize {
        let row = |r: &[crate::Value]| r.iter().map(crate::Value::approx_bytes).sum::<usize>();
        row(&self.key)
            + self.before.as_deref().map_or(0, row)
            + self.after.as_deref().map_or(0, row)
    }
}

impl Transaction {
    /// About how many bytes of values the transaction's changes hold
    /// ([`RowChange::approx_bytes`]): how much work applying or encoding it is.
    pub fn approx_bytes(&self) -> usize {
        self.changes.iter().map(RowChange::approx_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;
    use crate::value::Value;

    #[test]
    fn a_transaction_counts_its_text_and_bytes_and_eight_for_other_values() {
        let table = QualName::parse_unquoted("app.t");
        let change = |op, before: Option<Row>, after: Option<Row>| RowChange {
            table: table.clone(),
            op,
            key: vec![Value::Int(1)],
            before,
            after,
        };
        let txn = Transaction {
            gtid: Gtid {
                origin: NodeId(1),
                seq: 1,
            },
            commit_micros: 0,
            changes: vec![
                change(
                    ChangeOp::Insert,
                    None,
                    Some(vec![Value::Int(1), Value::Text("x".repeat(40_000))]),
                ),
                change(
                    ChangeOp::Delete,
                    Some(vec![Value::Int(1), Value::Bytes(vec![0; 100])]),
                    None,
                ),
            ],
        };
        // Keys 8 + 8, the insert 8 + 40,000, the delete 8 + 100.
        assert_eq!(txn.approx_bytes(), 16 + 40_008 + 108);
    }
}
