//! Links and log records for the sender's unit tests.

use std::sync::Arc;

use hawser_core::{
    ChangeOp, Epoch, Gtid, Ident, Lsn, NodeId, QualName, RowChange, Transaction, Value,
};
use hawser_store::{LogEntry, LogRecord};

use crate::link::LinkConfig;

/// A stream from `m` to `s` carrying `tables` of origin `m`, with no DDL, sequences or
/// siblings.
pub fn link(m: NodeId, s: NodeId, tables: &[&str]) -> LinkConfig {
    let tables = tables
        .iter()
        .map(|t| ((QualName::bare(t), m), Ident::unquoted("e")))
        .collect();
    crate::link::testing::test_link(m, s, tables)
}

pub(crate) use crate::link::testing::demo_shape;

/// A transaction of `origin` committed at `micros`, inserting a row of `bytes` bytes
/// into each of `tables`.
pub fn txn(origin: NodeId, seq: u64, micros: i64, tables: &[&str], bytes: usize) -> LogEntry {
    LogEntry::Txn(Transaction {
        gtid: Gtid::new(origin, seq),
        commit_micros: micros,
        changes: tables
            .iter()
            .map(|t| RowChange {
                table: QualName::bare(t),
                op: ChangeOp::Insert,
                key: vec![Value::Int(1)],
                before: None,
                after: Some(vec![Value::Int(1), Value::Bytes(vec![7; bytes])]),
            })
            .collect(),
    })
}

/// A log record at `lsn` under epoch 1.
pub fn record(lsn: u64, entry: LogEntry) -> Arc<LogRecord> {
    Arc::new(LogRecord {
        lsn: Lsn(lsn),
        epoch: Epoch(1),
        entry,
    })
}
