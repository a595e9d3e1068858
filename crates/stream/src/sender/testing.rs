//! Links and log records for the sender's unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hawser_core::{
    ChangeOp, Epoch, Gtid, Ident, Lsn, NodeId, QualName, RowChange, Transaction, Value,
};
use hawser_scheme::ast::TableDefinitionChecking;
use hawser_store::{LogEntry, LogRecord};

use crate::codec::Compression;
use crate::link::{LinkConfig, SenderTuning};

/// A stream from `m` to `s` carrying `tables` of origin `m`, with no DDL, sequences or
/// siblings.
pub fn link(m: NodeId, s: NodeId, tables: &[&str]) -> LinkConfig {
    LinkConfig {
        sender_node: m,
        sender_store: Ident::unquoted("m"),
        receiver_store: Ident::unquoted("s"),
        receiver_node: s,
        scheme_version: 1,
        elements: BTreeMap::new(),
        tables: tables
            .iter()
            .map(|t| ((QualName::bare(t), m), Ident::unquoted("e")))
            .collect(),
        sequences: BTreeMap::new(),
        replicate_ddl: false,
        returns_wait: true,
        datastore: Vec::new(),
        compression: Compression::None,
        table_check: TableDefinitionChecking::Exact,
        tuning: SenderTuning::default(),
        siblings: Vec::new(),
        blind: BTreeSet::new(),
        upstream: BTreeMap::new(),
        feeds_relay: false,
        read_by_siblings: false,
        parts: BTreeSet::new(),
        forked: Vec::new(),
    }
}

/// The demo's shape: `m` sends its t1 to `s` itself (the first) while `p` relays m's
/// t2 to `s` (the second), each the other's sibling.
pub fn demo_shape(m: NodeId, s: NodeId, p: NodeId) -> (LinkConfig, LinkConfig) {
    let mut direct = link(m, s, &["t1"]);
    let mut relay = link(p, s, &[]);
    relay.tables = BTreeMap::from([((QualName::bare("t2"), m), Ident::unquoted("e"))]);
    direct.siblings = vec![relay.clone()];
    relay.siblings = vec![direct.clone()];
    (direct, relay)
}

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
