//! Whole-table copies between peers, for a duplicate (docs/stream.md, "Duplicate").
//!
//! ```text
//!  target (hawser duplicate)                 source
//!  CopyRequest(scheme | tables) ─ Copy ─►  the tables the scheme routes to the target
//!                                          as this node plans it (or those named);
//!                                          copy_point: last LSN + marks, log held
//!          ◄──────────── CopyStart(lsn, marks, rows_estimate, tables)
//!          ◄──────────── CopyRows … (stream codec: CREATE TABLE before a table's
//!                                    first rows, then the rows as one txn of inserts)
//!          ◄──────────── CopyEnd(rows, lsn)
//! ```
//!
//! The source reads on a blocking thread and sends through a bounded channel, so a slow
//! target slows the reads rather than filling memory. It holds its log from the copy's
//! point (see [`CopyHolds`]) until [`HOLD_AFTER_COPY`] after the copy ends, time for the
//! target to set its receiver state back to START, after which the stream's own
//! position holds it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hawser_core::{
    ChangeOp, Epoch, Gtid, Ident, Lsn, NodeId, QualName, RowChange, TableDef, Transaction,
};
use hawser_store::{Database, DdlOp, LogEntry, SequenceDef};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::codec::{compress, decode_records, decompress, encode_entries, Compression};
use crate::pb::{self, copy_message};
use crate::{codec_from_pb, codec_to_pb, PROTOCOL_VERSION};

/// How long the source keeps its log from a copy's point once the copy ended.
pub const HOLD_AFTER_COPY: Duration = Duration::from_secs(600);

/// Rows per `CopyRows`, at most (fewer when they pass [`CHUNK_BYTES`]).
const CHUNK_ROWS: usize = 2048;
/// Raw bytes per `CopyRows`, roughly.
const CHUNK_BYTES: usize = 1 << 20;

/// The log positions copies in progress (and just ended) hold on this node: the data
/// plane releases no log past the lowest.
#[derive(Debug, Default)]
pub struct CopyHolds {
    next: AtomicU64,
    holds: parking_lot::Mutex<BTreeMap<u64, (Lsn, Option<Instant>)>>,
}

impl CopyHolds {
    /// The lowest LSN held (records after it stay); expired holds are dropped.
    pub fn lowest(&self) -> Option<Lsn> {
        let mut holds = self.holds.lock();
        let now = Instant::now();
        holds.retain(|_, (_, until)| until.is_none_or(|u| u > now));
        holds.values().map(|(lsn, _)| *lsn).min()
    }

    fn hold(&self, lsn: Lsn) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.holds.lock().insert(id, (lsn, None));
        id
    }

    fn end(&self, id: u64, keep: Duration) {
        if let Some(h) = self.holds.lock().get_mut(&id) {
            h.1 = Some(Instant::now() + keep);
        }
    }
}

/// What a copy carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyObjects {
    pub tables: Vec<QualName>,
    pub sequences: Vec<QualName>,
}

/// What a scheme routes to a store as this node plans it (its own catalog for every
/// store's, as its data plane plans): what a copy for that scheme carries. Given to
/// the receiver service by the node, which knows the schemes
/// ([`crate::ReceiverService::with_copy_plan`]).
pub type CopyPlan =
    std::sync::Arc<dyn Fn(&str, &Ident) -> Result<CopyObjects, Status> + Send + Sync>;

/// Serves a `Copy` request: checks it, then streams the tables from a blocking thread.
pub(crate) fn serve(
    db: Database,
    holds: std::sync::Arc<CopyHolds>,
    plan: Option<&CopyPlan>,
    request: pb::CopyRequest,
) -> Result<ReceiverStream<Result<pb::CopyMessage, Status>>, Status> {
    if request.protocol_version != PROTOCOL_VERSION {
        return Err(Status::failed_precondition(format!(
            "copy protocol version {} is not supported (this node speaks {PROTOCOL_VERSION})",
            request.protocol_version
        )));
    }
    let Some(codec) = codec_from_pb(request.codec) else {
        return Err(Status::invalid_argument(format!(
            "unknown codec {}",
            request.codec
        )));
    };
    let objects = match plan {
        Some(plan) if !request.scheme.is_empty() => {
            plan(&request.scheme, &Ident::unquoted(&request.receiver_store))?
        }
        _ => CopyObjects {
            tables: request
                .tables
                .iter()
                .map(|t| QualName::parse_unquoted(t))
                .collect(),
            sequences: Vec::new(),
        },
    };
    let defs = db.tables();
    let mut tables = Vec::new();
    for name in &objects.tables {
        match defs.iter().find(|t| t.name == *name) {
            Some(t) => tables.push((**t).clone()),
            None => {
                return Err(Status::not_found(format!(
                    "this node has no table {name} to copy"
                )))
            }
        }
    }
    for name in &objects.sequences {
        if db.sequence(name).is_none() {
            return Err(Status::not_found(format!(
                "this node has no sequence {name} to copy"
            )));
        }
    }
    let sequences = objects.sequences;
    let (tx, rx) = mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        let point = match db.copy_point() {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.blocking_send(Err(Status::internal(format!(
                    "cannot read the copy point: {e}"
                ))));
                return;
            }
        };
        let id = holds.hold(point.lsn);
        if let Err(status) = send_copy(&db, &tables, &sequences, codec, &point, &tx) {
            let _ = tx.blocking_send(Err(status));
        }
        holds.end(id, HOLD_AFTER_COPY);
    });
    Ok(ReceiverStream::new(rx))
}

fn send_copy(
    db: &Database,
    tables: &[TableDef],
    sequences: &[QualName],
    codec: Compression,
    point: &hawser_store::CopyPoint,
    tx: &mpsc::Sender<Result<pb::CopyMessage, Status>>,
) -> Result<(), Status> {
    let gone = || Status::cancelled("the node asking for the copy went away");
    let failed = |e: hawser_store::StoreError| Status::internal(format!("reading rows: {e}"));
    let mut estimate = 0u64;
    for t in tables {
        estimate += db.copy_scan(&t.name).map_err(failed)?.count() as u64;
    }
    let start = copy_message::Msg::Start(pb::CopyStart {
        lsn: point.lsn.0,
        marks: to_pb(&point.marks),
        rows_estimate: estimate,
        tables: tables.iter().map(|t| t.name.to_string()).collect(),
        sequences: sequences.iter().map(|s| s.to_string()).collect(),
    });
    tx.blocking_send(Ok(pb::CopyMessage { msg: Some(start) }))
        .map_err(|_| gone())?;
    let mut total = 0u64;
    for t in tables {
        let mut def = Some(t.clone());
        let mut rows = db.copy_scan(&t.name).map_err(failed)?.peekable();
        // A table with no rows still sends its definition.
        while def.is_some() || rows.peek().is_some() {
            let mut changes = Vec::new();
            let mut bytes = 0usize;
            for row in rows.by_ref() {
                let row = row.map_err(failed)?;
                bytes += row.iter().map(value_bytes).sum::<usize>();
                changes.push(RowChange {
                    table: t.name.clone(),
                    op: ChangeOp::Insert,
                    key: t.key_of(&row),
                    before: None,
                    after: Some(row),
                });
                if changes.len() == CHUNK_ROWS || bytes >= CHUNK_BYTES {
                    break;
                }
            }
            let count = changes.len() as u32;
            total += u64::from(count);
            let mut entries = Vec::new();
            if let Some(def) = def.take() {
                entries.push(LogEntry::Ddl {
                    gtid: Gtid::new(db.node_id(), 0),
                    commit_micros: 0,
                    op: DdlOp::CreateTable(def),
                });
            }
            if !changes.is_empty() {
                entries.push(LogEntry::Txn(Transaction {
                    gtid: Gtid::new(db.node_id(), 0),
                    commit_micros: 0,
                    changes,
                }));
            }
            tx.blocking_send(Ok(rows_message(&entries, codec, count)))
                .map_err(|_| gone())?;
        }
    }
    for name in sequences {
        // Read after the copy's point: a block reserved since is past it, and its
        // record after the point comes by the stream too.
        let Some((def, restart_at)) = db.copy_sequence_point(name) else {
            return Err(Status::aborted(format!(
                "sequence {name} was dropped during the copy; run it again"
            )));
        };
        let gtid = Gtid::new(db.node_id(), 0);
        let entries = [
            LogEntry::Ddl {
                gtid,
                commit_micros: 0,
                op: DdlOp::CreateSequence(def),
            },
            LogEntry::SequenceBlock {
                gtid,
                commit_micros: 0,
                name: name.clone(),
                restart_at,
            },
        ];
        tx.blocking_send(Ok(rows_message(&entries, codec, 0)))
            .map_err(|_| gone())?;
    }
    let lsn = db.last_lsn();
    let marks = db
        .high_waters()
        .map_err(|e| Status::internal(format!("reading the marks: {e}")))?;
    let end = copy_message::Msg::End(pb::CopyEnd {
        rows: total,
        lsn: lsn.0,
        marks: to_pb(&marks),
    });
    tx.blocking_send(Ok(pb::CopyMessage { msg: Some(end) }))
        .map_err(|_| gone())
}

/// One `CopyRows`: `entries` encoded and compressed.
fn rows_message(entries: &[LogEntry], codec: Compression, rows: u32) -> pb::CopyMessage {
    let refs: Vec<(Epoch, &LogEntry)> = entries.iter().map(|e| (Epoch(0), e)).collect();
    let raw = encode_entries(&refs);
    let raw_bytes = raw.len() as u64;
    let payload = compress(codec, raw);
    pb::CopyMessage {
        msg: Some(copy_message::Msg::Rows(pb::CopyRows {
            codec: codec_to_pb(codec) as i32,
            raw_bytes,
            payload,
            rows,
        })),
    }
}

fn value_bytes(v: &hawser_core::Value) -> usize {
    use hawser_core::Value;
    match v {
        Value::Text(s) => s.len() + 8,
        Value::Bytes(b) => b.len() + 8,
        _ => 16,
    }
}

fn to_pb(marks: &BTreeMap<NodeId, u64>) -> Vec<pb::OriginMark> {
    marks
        .iter()
        .map(|(o, s)| pb::OriginMark {
            origin: o.0,
            seq: *s,
        })
        .collect()
}

/// What one `CopyRows` holds: the table's definition at the source (before its first
/// rows) and rows of one table; or a sequence, with its restart point at the source.
#[derive(Debug, Clone, PartialEq)]
pub struct CopiedRows {
    pub definition: Option<TableDef>,
    pub table: Option<hawser_core::QualName>,
    pub rows: Vec<hawser_core::Row>,
    pub sequence: Option<(SequenceDef, Option<i64>)>,
}

/// Decodes a `CopyRows` (bounded like a batch: the codec refuses hostile sizes).
pub fn decode_rows(msg: &pb::CopyRows) -> Result<CopiedRows, String> {
    let Some(codec) = codec_from_pb(msg.codec) else {
        return Err(format!("unknown codec {}", msg.codec));
    };
    let raw = decompress(codec, &msg.payload, msg.raw_bytes).map_err(|e| e.to_string())?;
    let records = decode_records(&raw).map_err(|e| e.to_string())?;
    let mut out = CopiedRows {
        definition: None,
        table: None,
        rows: Vec::new(),
        sequence: None,
    };
    // A sequence: its definition and its block, alone in the chunk.
    if let [first, second] = records.as_slice() {
        if let (
            LogEntry::Ddl {
                op: DdlOp::CreateSequence(def),
                ..
            },
            LogEntry::SequenceBlock {
                name, restart_at, ..
            },
        ) = (&first.entry, &second.entry)
        {
            if def.name != *name {
                return Err(format!(
                    "a copied sequence {} with the block of {name}",
                    def.name
                ));
            }
            out.sequence = Some((def.clone(), *restart_at));
            return Ok(out);
        }
    }
    for r in records {
        match r.entry {
            LogEntry::Ddl {
                op: DdlOp::CreateTable(def),
                ..
            } if out.definition.is_none() && out.rows.is_empty() => {
                out.table = Some(def.name.clone());
                out.definition = Some(def);
            }
            LogEntry::Txn(t) => {
                for c in t.changes {
                    if out.table.as_ref().is_some_and(|n| *n != c.table) {
                        return Err(format!(
                            "rows of {} and {} in one chunk",
                            out.table
                                .as_ref()
                                .map(|n| n.to_string())
                                .unwrap_or_default(),
                            c.table
                        ));
                    }
                    out.table = Some(c.table.clone());
                    match (c.op, c.after) {
                        (ChangeOp::Insert, Some(row)) => out.rows.push(row),
                        _ => return Err(format!("a copied row of {} is not an insert", c.table)),
                    }
                }
            }
            _ => {
                return Err(
                    "a copy chunk holds something other than a table and rows, or a sequence"
                        .into(),
                )
            }
        }
    }
    Ok(out)
}

/// Origin marks as the copy messages carry them.
pub fn from_pb(marks: &[pb::OriginMark]) -> BTreeMap<NodeId, u64> {
    marks.iter().map(|m| (NodeId(m.origin), m.seq)).collect()
}
