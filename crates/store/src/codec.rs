//! How rows, catalog entries and log records are stored, in the one format
//! ([`crate::format`]) the stream's batches share.
//!
//! Decoding is bounded by the input length and refuses trailing bytes, and every
//! failure becomes [`StoreError::Corrupt`] naming the key.

use bincode::Options;
use hawser_core::{Epoch, Gtid, Lsn, TableDef, Value};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::error::StoreError;
use crate::format::{self, Entry, EntryRef, RowRef, Sequence, Table, V};
use crate::log::{LogEntry, LogRecord};
use crate::sequence::SequenceDef;

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing plain data into a Vec has no failure mode: no I/O, no size limit,
    // and every mirror type has only serializable fields.
    format::options()
        .serialize(value)
        .unwrap_or_else(|e| unreachable!("bincode serialization into a Vec failed: {e}"))
}

pub(crate) fn decode<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    format::options()
        .with_limit(bytes.len() as u64)
        .deserialize(bytes)
        .map_err(|e| StoreError::corrupt(key, e))
}

pub(crate) fn encode_row(row: &[Value]) -> Vec<u8> {
    encode(&RowRef(row))
}

pub(crate) fn decode_row(key: &[u8], bytes: &[u8]) -> Result<Vec<Value>, StoreError> {
    let row: Vec<V> = decode(key, bytes)?;
    format::row_from(row).map_err(|e| StoreError::corrupt(key, e))
}

/// A catalog entry of a table: its id, its version (bumped by ALTER) and definition.
#[derive(Serialize, Deserialize)]
struct StoredTable {
    id: u64,
    version: u64,
    def: Table,
}

pub(crate) fn encode_table(id: u64, version: u64, def: &TableDef) -> Vec<u8> {
    encode(&StoredTable {
        id,
        version,
        def: Table::of(def),
    })
}

pub(crate) fn decode_table(key: &[u8], bytes: &[u8]) -> Result<(u64, u64, TableDef), StoreError> {
    let t: StoredTable = decode(key, bytes)?;
    let def = t.def.into_def().map_err(|e| StoreError::corrupt(key, e))?;
    Ok((t.id, t.version, def))
}

#[derive(Serialize, Deserialize)]
struct StoredSequence {
    def: Sequence,
    restart_at: Option<i64>,
}

pub(crate) fn encode_sequence(def: &SequenceDef, restart_at: Option<i64>) -> Vec<u8> {
    encode(&StoredSequence {
        def: Sequence::of(def),
        restart_at,
    })
}

pub(crate) fn decode_sequence(
    key: &[u8],
    bytes: &[u8],
) -> Result<(SequenceDef, Option<i64>), StoreError> {
    let s: StoredSequence = decode(key, bytes)?;
    let def = s.def.into_def();
    def.validate()
        .map_err(|e| StoreError::corrupt(key, format!("bad sequence definition: {e}")))?;
    Ok((def, s.restart_at))
}

/// A log record as written: the entry through its borrowed view.
#[derive(Serialize)]
struct RecordRef<'a> {
    lsn: Lsn,
    epoch: Epoch,
    entry: EntryRef<'a>,
}

/// A log record as read.
#[derive(Deserialize)]
struct StoredRecord {
    lsn: Lsn,
    epoch: Epoch,
    entry: Entry,
}

/// The leading fields of a stored record, up to its Gtid (every entry kind starts
/// with it): enough to derive high-water marks without decoding the changes.
#[derive(Deserialize)]
struct StoredHead {
    _lsn: Lsn,
    _epoch: Epoch,
    entry: HeadEntry,
}

#[derive(Deserialize)]
enum HeadEntry {
    Txn { gtid: Gtid, commit_micros: i64 },
    Ddl { gtid: Gtid, commit_micros: i64 },
    SequenceBlock { gtid: Gtid, commit_micros: i64 },
}

/// What [`record_head`] reads of a log record.
pub(crate) struct RecordHead {
    pub gtid: Gtid,
    pub commit_micros: i64,
    pub ddl: bool,
}

/// A log record's Gtid, commit time and whether it is a DDL record, read without
/// decoding the rest.
pub(crate) fn record_head(key: &[u8], bytes: &[u8]) -> Result<RecordHead, StoreError> {
    let head: StoredHead = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(bytes.len() as u64)
        .deserialize(bytes)
        .map_err(|e| StoreError::corrupt(key, e))?;
    let (gtid, commit_micros, ddl) = match head.entry {
        HeadEntry::Txn {
            gtid,
            commit_micros,
        }
        | HeadEntry::SequenceBlock {
            gtid,
            commit_micros,
        } => (gtid, commit_micros, false),
        HeadEntry::Ddl {
            gtid,
            commit_micros,
        } => (gtid, commit_micros, true),
    };
    Ok(RecordHead {
        gtid,
        commit_micros,
        ddl,
    })
}

pub(crate) fn encode_record(r: &LogRecord) -> Vec<u8> {
    encode(&RecordRef {
        lsn: r.lsn,
        epoch: r.epoch,
        entry: EntryRef::new(&r.entry),
    })
}

pub(crate) fn decode_record(key: &[u8], bytes: &[u8]) -> Result<LogRecord, StoreError> {
    let r: StoredRecord = decode(key, bytes)?;
    let entry: LogEntry = r
        .entry
        .into_log_entry()
        .map_err(|e| StoreError::corrupt(key, e))?;
    Ok(LogRecord {
        lsn: r.lsn,
        epoch: r.epoch,
        entry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::DdlOp;
    use hawser_core::{ChangeOp, ColumnDef, DataType, Ident, QualName, RowChange, Transaction};

    #[test]
    fn rows_round_trip_every_type() {
        let row = vec![
            Value::Null,
            Value::Bool(true),
            Value::Int(-5),
            Value::Decimal("-12.340".parse().unwrap()),
            Value::Double(1.5),
            Value::Text("héllo".into()),
            Value::Bytes(vec![0, 255]),
            Value::Date(-3),
            Value::Timestamp(123),
        ];
        let back = decode_row(b"k", &encode_row(&row)).unwrap();
        assert_eq!(back, row);
        assert_eq!(back[3].to_string(), "-12.340");
    }

    #[test]
    fn garbage_is_corrupt_and_names_the_key() {
        let e = decode_row(b"Rkey", &[0xFF; 3]).unwrap_err();
        assert_eq!(e.code(), "XX001");
        assert!(e.to_string().contains("Rkey"), "{e}");
        let mut bytes = encode_row(&[Value::Int(1)]);
        bytes.push(0);
        assert!(decode_row(b"k", &bytes).is_err(), "trailing bytes refused");
        // A huge length prefix must fail, not allocate.
        let e = decode_row(b"k", &[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]).unwrap_err();
        assert_eq!(e.code(), "XX001");
    }

    #[test]
    fn the_gtid_is_read_from_the_head_of_every_kind_of_record() {
        let name = QualName::bare("t");
        let entries = [
            LogEntry::Txn(Transaction {
                gtid: Gtid::new(hawser_core::NodeId(3), 17),
                commit_micros: 5,
                changes: vec![RowChange {
                    table: name.clone(),
                    op: ChangeOp::Insert,
                    key: vec![Value::Int(1)],
                    before: None,
                    after: Some(vec![Value::Int(1), Value::Text("x".into())]),
                }],
            }),
            LogEntry::Ddl {
                gtid: Gtid::new(hawser_core::NodeId(4), 2),
                commit_micros: 6,
                op: DdlOp::DropTable(name.clone()),
            },
            LogEntry::SequenceBlock {
                gtid: Gtid::new(hawser_core::NodeId(u64::MAX), u64::MAX),
                commit_micros: 7,
                name,
                restart_at: Some(40),
            },
        ];
        for entry in entries {
            let gtid = entry.gtid();
            let bytes = encode_record(&LogRecord {
                lsn: Lsn(9),
                epoch: Epoch(1),
                entry,
            });
            assert_eq!(record_head(b"L", &bytes).unwrap().gtid, gtid);
            assert!(
                record_head(b"L", &bytes[..10]).is_err(),
                "a short record is corrupt"
            );
        }
    }

    /// Records of every kind, and a table and a sequence, as the golden-bytes test
    /// encodes them.
    fn samples() -> (Vec<LogRecord>, TableDef, SequenceDef) {
        let name = QualName::new(Some(Ident::unquoted("app")), Ident::unquoted("t"));
        let col = |n: &str, data_type: DataType, default: Option<Value>| ColumnDef {
            name: Ident::unquoted(n),
            data_type,
            nullable: default.is_none(),
            default,
        };
        let table = TableDef {
            name: name.clone(),
            columns: vec![
                col("id", DataType::BigInt, None),
                col(
                    "d",
                    DataType::Decimal {
                        precision: Some(10),
                        scale: 2,
                    },
                    Some(Value::Decimal("1.50".parse().unwrap())),
                ),
                col("s", DataType::Varchar(20), Some(Value::Text("x".into()))),
            ],
            primary_key: vec![0, 2],
            explicit_key: true,
        };
        let seq = SequenceDef {
            name: QualName::bare("q"),
            increment: 2,
            min_value: 1,
            max_value: 1000,
            start: 5,
            cycle: true,
        };
        let row = vec![
            Value::Null,
            Value::Bool(true),
            Value::Int(-5),
            Value::Decimal("-12.340".parse().unwrap()),
            Value::Double(1.5),
            Value::Text("héllo".into()),
            Value::Bytes(vec![0, 255]),
            Value::Date(-3),
            Value::Timestamp(123),
        ];
        let node = hawser_core::NodeId(3);
        let entries = vec![
            LogEntry::Txn(Transaction {
                gtid: Gtid::new(node, 17),
                commit_micros: 1_700_000_000_000_000,
                changes: vec![
                    RowChange {
                        table: name.clone(),
                        op: ChangeOp::Insert,
                        key: vec![Value::Int(1)],
                        before: None,
                        after: Some(row.clone()),
                    },
                    RowChange {
                        table: name.clone(),
                        op: ChangeOp::Update,
                        key: vec![Value::Int(1)],
                        before: Some(row.clone()),
                        after: Some(row),
                    },
                    RowChange {
                        table: name.clone(),
                        op: ChangeOp::Delete,
                        key: vec![Value::Int(2)],
                        before: Some(vec![Value::Int(2)]),
                        after: None,
                    },
                ],
            }),
            LogEntry::Ddl {
                gtid: Gtid::new(node, 18),
                commit_micros: 6,
                op: DdlOp::CreateTable(table.clone()),
            },
            LogEntry::Ddl {
                gtid: Gtid::new(node, 19),
                commit_micros: 7,
                op: DdlOp::DropTable(name.clone()),
            },
            LogEntry::Ddl {
                gtid: Gtid::new(node, 20),
                commit_micros: 8,
                op: DdlOp::AddColumn {
                    table: name.clone(),
                    column: table.columns[1].clone(),
                },
            },
            LogEntry::Ddl {
                gtid: Gtid::new(node, 21),
                commit_micros: 9,
                op: DdlOp::CreateSequence(seq.clone()),
            },
            LogEntry::Ddl {
                gtid: Gtid::new(node, 22),
                commit_micros: 10,
                op: DdlOp::DropSequence(QualName::bare("q")),
            },
            LogEntry::SequenceBlock {
                gtid: Gtid::new(node, 23),
                commit_micros: 11,
                name: QualName::bare("q"),
                restart_at: Some(40),
            },
        ];
        let records = entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| LogRecord {
                lsn: Lsn(100 + i as u64),
                epoch: Epoch(2),
                entry,
            })
            .collect();
        (records, table, seq)
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// The bytes the store wrote for [`samples`] when this test was written: what is
    /// on disk must decode the same, whatever the code that writes it becomes.
    #[test]
    fn the_stored_format_is_byte_for_byte_what_it_was() {
        let golden = include_str!("../testdata/log_format.hex");
        let lines: Vec<(&str, &str)> = golden
            .lines()
            .map(|l| l.split_once(' ').expect("a kind and the bytes"))
            .collect();
        let (records, table, seq) = samples();
        let mut want = lines.iter();
        for r in &records {
            let (kind, bytes) = want.next().expect("a line per record");
            assert_eq!((*kind, hex(&encode_record(r))), ("R", bytes.to_string()));
            assert_eq!(&decode_record(b"L", &encode_record(r)).unwrap(), r);
        }
        assert_eq!(
            lines[records.len()],
            ("T", hex(&encode_table(7, 3, &table)).as_str())
        );
        assert_eq!(
            decode_table(b"T", &encode_table(7, 3, &table)).unwrap(),
            (7, 3, table)
        );
        let s = hex(&encode_sequence(&seq, Some(41)));
        assert_eq!(lines[records.len() + 1], ("S", s.as_str()));
        assert_eq!(
            decode_sequence(b"S", &encode_sequence(&seq, Some(41))).unwrap(),
            (seq, Some(41))
        );
        let LogEntry::Txn(t) = &records[0].entry else {
            panic!("the first sample is a transaction")
        };
        let row = t.changes[0].after.as_deref().unwrap();
        assert_eq!(
            lines[records.len() + 2],
            ("W", hex(&encode_row(row)).as_str())
        );
    }
}
