//! The stream codec: log records to batch bytes and back, and batch compression.
//!
//! ```text
//!  [(epoch, LogEntry)] ──encode──► [version][bincode: records] ──compress──► payload
//!  payload ──decompress (bounded by raw size)──► bytes ──decode (bounded by length)──► records
//! ```
//!
//! A record is its epoch and its entry in the store's log format
//! ([`hawser_store::format`]): the bytes of a stored log record after its LSN. The first
//! byte is that format's version, so a peer running another format is refused with a
//! clear error rather than misread. Decoding is bounded by the input length, refuses
//! trailing bytes and never panics on hostile input (a property test feeds it random
//! bytes).
//!
//! Compression (COMPRESS TRAFFIC) is per batch, as a whole: lz4 (`lz4_flex`, pure Rust,
//! fast) or zstd (level 3, better ratio where bandwidth matters). The batch message
//! carries the raw size, and decompression refuses to produce more than that or more
//! than [`MAX_RAW_BATCH`], so a small hostile payload cannot blow up memory.

use std::borrow::Cow;

use bincode::Options;
use hawser_core::{Epoch, TableDef};
use hawser_store::format::{self, Entry, EntryRef, FormatError, Table};
use hawser_store::LogEntry;
use serde::ser::Serializer;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use thiserror::Error;

/// The format version this build writes and reads: the log format's.
pub const FORMAT_VERSION: u8 = format::VERSION;

/// Largest decompressed batch accepted (a sender cuts batches well below this).
pub const MAX_RAW_BATCH: u64 = 256 * 1024 * 1024;

/// Batch compression (COMPRESS TRAFFIC).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd,
}

impl Compression {
    /// The name status and configuration use: `off`, `lz4` or `zstd`.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "off",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

/// Bytes that do not decode.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("empty payload")]
    Empty,
    #[error("payload format version {0} is not supported (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion(u8),
    #[error("malformed payload: {0}")]
    Malformed(String),
    #[error("decimal with mantissa {mantissa} and scale {scale} is out of range")]
    BadDecimal { mantissa: i128, scale: u32 },
    #[error("{codec:?} payload does not decompress: {reason}")]
    Decompress { codec: Compression, reason: String },
    #[error("batch of {size} bytes exceeds the limit of {max}")]
    TooLarge { size: u64, max: u64 },
    #[error("batch decompressed to {got} bytes, its header says {expected}")]
    SizeMismatch { expected: u64, got: u64 },
}

impl From<FormatError> for CodecError {
    fn from(e: FormatError) -> Self {
        match e {
            FormatError::BadDecimal { mantissa, scale } => {
                CodecError::BadDecimal { mantissa, scale }
            }
            e => CodecError::Malformed(e.to_string()),
        }
    }
}

fn encode_versioned<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![FORMAT_VERSION];
    // Serializing plain data into a Vec has no failure mode: no I/O, no size limit,
    // and every mirror type has only serializable fields.
    format::options()
        .serialize_into(&mut out, value)
        .unwrap_or_else(|e| unreachable!("bincode serialization into a Vec failed: {e}"));
    out
}

fn decode_versioned<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(CodecError::UnsupportedVersion(version));
    }
    format::options()
        .with_limit(body.len() as u64)
        .deserialize(body)
        .map_err(|e| CodecError::Malformed(e.to_string()))
}

/// A record as a batch carries it, written from the log's types in place.
#[derive(Serialize)]
struct RecordRef<'a> {
    epoch: Epoch,
    entry: EntryRef<'a>,
}

/// A record as read.
#[derive(Deserialize)]
struct Record {
    epoch: Epoch,
    entry: Entry,
}

/// Serializes (epoch, entry) pairs as `Vec<Record>`.
struct RecordsRef<'a, 'e>(&'a [(Epoch, &'e LogEntry)]);

impl Serialize for RecordsRef<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(epoch, entry)| RecordRef {
            epoch: *epoch,
            entry: EntryRef::new(entry),
        }))
    }
}

// ---- public API -----------------------------------------------------------------

/// One record as a batch carries it: the entry and the element epoch it was committed
/// under (the sender's LSN is local to the sender and does not travel).
#[derive(Debug, Clone, PartialEq)]
pub struct WireRecord {
    pub epoch: Epoch,
    pub entry: LogEntry,
}

/// Encodes records in order, version byte first.
pub fn encode_records(records: &[WireRecord]) -> Vec<u8> {
    let refs: Vec<(Epoch, &LogEntry)> = records.iter().map(|r| (r.epoch, &r.entry)).collect();
    encode_entries(&refs)
}

/// [`encode_records`] from borrowed entries (the sender encodes log records without
/// copying them); the same bytes.
pub fn encode_entries(records: &[(Epoch, &LogEntry)]) -> Vec<u8> {
    encode_versioned(&RecordsRef(records))
}

/// What a batch's encoding holds besides its records: the version byte and the
/// record count (a u64).
pub const BATCH_HEADER_BYTES: u64 = 1 + 8;

/// The bytes one record adds to a batch's encoding: a batch of records is
/// [`BATCH_HEADER_BYTES`] plus the sum of theirs, exactly. The sender cuts batches by
/// it; an estimate that counted a fixed size per value once let 512 rows of 40,000
/// characters each (20 MB) into one batch, past the receiver's message limit.
pub fn record_size(epoch: Epoch, entry: &LogEntry) -> u64 {
    let record = RecordRef {
        epoch,
        entry: EntryRef::new(entry),
    };
    // Sizing plain data has no failure mode (no I/O, no limit set): see encode_versioned.
    format::options()
        .serialized_size(&record)
        .unwrap_or_else(|e| unreachable!("bincode sizing failed: {e}"))
}

/// Decodes what [`encode_records`] wrote.
pub fn decode_records(bytes: &[u8]) -> Result<Vec<WireRecord>, CodecError> {
    let w: Vec<Record> = decode_versioned(bytes)?;
    w.into_iter()
        .map(|r| {
            Ok(WireRecord {
                epoch: r.epoch,
                entry: r.entry.into_log_entry()?,
            })
        })
        .collect()
}

/// Encodes a table definition for `Hello`.
pub fn encode_table_def(def: &TableDef) -> Vec<u8> {
    encode_versioned(&Table::of(def))
}

/// Decodes what [`encode_table_def`] wrote.
pub fn decode_table_def(bytes: &[u8]) -> Result<TableDef, CodecError> {
    let t: Table = decode_versioned(bytes)?;
    Ok(t.into_def()?)
}

/// zstd's own default level: a good ratio at a few hundred MB/s.
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

/// The zstd levels a sender may be set to: 1 (fastest) to 19 (smallest; 20–22, zstd's
/// "ultra" levels, need far more memory on both ends).
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = 1..=19;

/// Compresses a whole batch, zstd at its default level. Without compression the bytes
/// are the payload as they are (no copy).
pub fn compress(codec: Compression, raw: Vec<u8>) -> Vec<u8> {
    compress_at(codec, ZSTD_DEFAULT_LEVEL, raw)
}

/// [`compress`] with zstd at `zstd_level` (the other codecs have no level).
pub fn compress_at(codec: Compression, zstd_level: i32, raw: Vec<u8>) -> Vec<u8> {
    match codec {
        Compression::None => raw,
        Compression::Lz4 => lz4_flex::block::compress(&raw),
        // Compressing from memory into memory fails only on allocation failure (which
        // aborts anyway) or an invalid level, which the sender's settings exclude.
        Compression::Zstd => zstd::bulk::compress(&raw, zstd_level)
            .unwrap_or_else(|e| unreachable!("zstd compression into memory failed: {e}")),
    }
}

/// Decompresses a batch whose header says it holds `raw_size` bytes. Without
/// compression the payload is borrowed as it is.
pub fn decompress(
    codec: Compression,
    wire: &[u8],
    raw_size: u64,
) -> Result<Cow<'_, [u8]>, CodecError> {
    if raw_size > MAX_RAW_BATCH {
        return Err(CodecError::TooLarge {
            size: raw_size,
            max: MAX_RAW_BATCH,
        });
    }
    // Bounded by MAX_RAW_BATCH just above, so it fits a usize on every target we build.
    let capacity = usize::try_from(raw_size).map_err(|_| CodecError::TooLarge {
        size: raw_size,
        max: MAX_RAW_BATCH,
    })?;
    let out = match codec {
        Compression::None => Cow::Borrowed(wire),
        Compression::Lz4 => {
            Cow::Owned(lz4_flex::block::decompress(wire, capacity).map_err(|e| {
                CodecError::Decompress {
                    codec,
                    reason: e.to_string(),
                }
            })?)
        }
        Compression::Zstd => Cow::Owned(zstd::bulk::decompress(wire, capacity).map_err(|e| {
            CodecError::Decompress {
                codec,
                reason: e.to_string(),
            }
        })?),
    };
    if out.len() as u64 != raw_size {
        return Err(CodecError::SizeMismatch {
            expected: raw_size,
            got: out.len() as u64,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_core::strategies::row;
    use hawser_core::{
        ChangeOp, ColumnDef, DataType, Gtid, Ident, NodeId, QualName, RowChange, Transaction, Value,
    };
    use hawser_store::DdlOp;
    use proptest::prelude::*;
    use rust_decimal::Decimal;

    fn change() -> impl Strategy<Value = RowChange> {
        ("[a-z]{1,4}", row(), row(), 0..3u8).prop_map(|(t, a, b, op)| {
            let key = vec![a[0].clone()];
            let (op, before, after) = match op {
                0 => (ChangeOp::Insert, None, Some(a)),
                1 => (ChangeOp::Update, Some(b), Some(a)),
                _ => (ChangeOp::Delete, Some(b), None),
            };
            RowChange {
                table: QualName::bare(&t),
                op,
                key,
                before,
                after,
            }
        })
    }

    fn record() -> impl Strategy<Value = WireRecord> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<i64>(),
            proptest::collection::vec(change(), 0..5),
        )
            .prop_map(|(epoch, origin, seq, commit_micros, changes)| WireRecord {
                epoch: Epoch(epoch),
                entry: LogEntry::Txn(Transaction {
                    gtid: Gtid::new(NodeId(origin), seq),
                    commit_micros,
                    changes,
                }),
            })
    }

    fn codec() -> impl Strategy<Value = Compression> {
        prop_oneof![
            Just(Compression::None),
            Just(Compression::Lz4),
            Just(Compression::Zstd)
        ]
    }

    proptest! {
        #[test]
        fn a_batch_is_its_header_and_its_records_sizes_exactly(
            records in proptest::collection::vec(record(), 0..8),
        ) {
            let sizes: u64 = records.iter().map(|r| record_size(r.epoch, &r.entry)).sum();
            prop_assert_eq!(encode_records(&records).len() as u64, BATCH_HEADER_BYTES + sizes);
        }

        #[test]
        fn records_round_trip_through_every_codec(
            records in proptest::collection::vec(record(), 0..8),
            codec in codec(),
        ) {
            let raw = encode_records(&records);
            let raw_size = raw.len() as u64;
            let wire = compress(codec, raw);
            let back = decompress(codec, &wire, raw_size).unwrap();
            prop_assert_eq!(decode_records(&back).unwrap(), records);
        }

        #[test]
        fn random_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            raw_size in 0u64..4096,
            codec in codec(),
        ) {
            let _ = decode_records(&bytes);
            let _ = decode_table_def(&bytes);
            if let Ok(raw) = decompress(codec, &bytes, raw_size) {
                prop_assert_eq!(raw.len() as u64, raw_size);
                let _ = decode_records(&raw);
            }
            let mut versioned = vec![FORMAT_VERSION];
            versioned.extend_from_slice(&bytes);
            let _ = decode_records(&versioned);
        }
    }

    fn table() -> TableDef {
        TableDef {
            name: QualName::parse_unquoted("repl.tab"),
            columns: vec![
                ColumnDef {
                    name: Ident::unquoted("k"),
                    data_type: DataType::Integer,
                    nullable: false,
                    default: None,
                },
                ColumnDef {
                    name: Ident::quoted("Amount"),
                    data_type: DataType::Decimal {
                        precision: Some(10),
                        scale: 2,
                    },
                    nullable: true,
                    default: Some(Value::Decimal(Decimal::new(150, 2))),
                },
            ],
            primary_key: vec![0],
            explicit_key: true,
        }
    }

    #[test]
    fn ddl_and_table_definitions_round_trip() {
        let def = table();
        assert_eq!(decode_table_def(&encode_table_def(&def)).unwrap(), def);
        let records = vec![
            WireRecord {
                epoch: Epoch(2),
                entry: LogEntry::Ddl {
                    gtid: Gtid::new(NodeId(1), 1),
                    commit_micros: 7,
                    op: DdlOp::CreateTable(def),
                },
            },
            WireRecord {
                epoch: Epoch(2),
                entry: LogEntry::SequenceBlock {
                    gtid: Gtid::new(NodeId(1), 2),
                    commit_micros: 8,
                    name: QualName::bare("s"),
                    restart_at: Some(41),
                },
            },
        ];
        assert_eq!(decode_records(&encode_records(&records)).unwrap(), records);
    }

    #[test]
    fn a_long_value_counts_its_length() {
        let text = "x".repeat(40_000);
        let entry = LogEntry::Txn(Transaction {
            gtid: Gtid::new(NodeId(1), 1),
            commit_micros: 0,
            changes: vec![RowChange {
                table: QualName::bare("t"),
                op: ChangeOp::Insert,
                key: vec![Value::Int(1)],
                before: None,
                after: Some(vec![Value::Int(1), Value::Text(text)]),
            }],
        });
        let size = record_size(Epoch(1), &entry);
        assert!((40_000..40_200).contains(&size), "{size}");
        let records = [WireRecord {
            epoch: Epoch(1),
            entry,
        }];
        assert_eq!(
            encode_records(&records).len() as u64,
            BATCH_HEADER_BYTES + size
        );
    }

    #[test]
    fn a_newer_format_is_refused_by_version() {
        let mut bytes = encode_records(&[]);
        bytes[0] = FORMAT_VERSION + 1;
        assert_eq!(
            decode_records(&bytes),
            Err(CodecError::UnsupportedVersion(FORMAT_VERSION + 1))
        );
        assert_eq!(decode_records(&[]), Err(CodecError::Empty));
    }

    #[test]
    fn a_higher_zstd_level_sends_fewer_bytes_and_any_level_reads_back() {
        let raw: Vec<u8> = (0..2000)
            .flat_map(|k| {
                format!("row {k:05} of many alike; value {};", k * 7919 % 10007).into_bytes()
            })
            .collect();
        let fast = compress_at(Compression::Zstd, 1, raw.clone());
        let small = compress_at(Compression::Zstd, 19, raw.clone());
        assert!(
            small.len() < fast.len(),
            "{} !< {}",
            small.len(),
            fast.len()
        );
        for wire in [&fast, &small] {
            let back = decompress(Compression::Zstd, wire, raw.len() as u64).unwrap();
            assert_eq!(back.as_ref(), raw.as_slice());
        }
        // The default is zstd's own level 3.
        assert_eq!(
            compress(Compression::Zstd, raw.clone()),
            compress_at(Compression::Zstd, ZSTD_DEFAULT_LEVEL, raw)
        );
    }

    #[test]
    fn decompression_refuses_sizes_that_lie() {
        let raw = vec![7u8; 10_000];
        let wire = compress(Compression::Lz4, raw.clone());
        assert!(wire.len() < raw.len() / 10, "repetitive bytes compress");
        assert!(decompress(Compression::Lz4, &wire, 100).is_err());
        assert!(matches!(
            decompress(Compression::Zstd, &compress(Compression::Zstd, raw), 20_000),
            Err(CodecError::SizeMismatch { .. }) | Err(CodecError::Decompress { .. })
        ));
        assert!(matches!(
            decompress(Compression::None, &wire, MAX_RAW_BATCH + 1),
            Err(CodecError::TooLarge { .. })
        ));
    }
}
