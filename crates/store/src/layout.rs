//! Where everything lives in the one keyspace (`docs/storage.md` has the table).
//!
//! ```text
//! F "format"                     → magic + format version (u32 BE); written once, never rewritten
//! M "next_table_id"              → u64 BE, the next table id to assign
//! M "boot_id"                    → the boot id of the machine it was last opened on
//! M "restart"                    → the last machine restart's point (db::RestartPoint)
//! M "ahead"                      → receivers found holding more of this origin than it has
//! M "copy_in_order"              → per origin, the seq through which replicated
//!                                  transactions apply in log order after a duplicate
//! T <table id u64 BE>            → catalog entry of a table (id, version, definition)
//! S <encode_key(owner, name)>    → sequence definition and restart point
//! R <table id u64 BE> <encode_key(pk)> → row
//! L <lsn u64 BE>                 → commit log record (the sled engine keeps these in its
//!                                  write-ahead log, not in sled)
//! H <origin node id u64 BE>      → highest seq of that origin in the log released so far
//!                                  (the log records still held raise it; see db::open)
//! P <link name>                  → a stream's retained position: the LSN its receiver
//!                                  acknowledged durably, u64 BE (log retention)
//! A <origin u64 BE> <seq u64 BE>  → a commit set aside (Database::set_aside), empty value:
//!                                  never set aside again
//! ```
//!
//! Rows sit under a numeric table id assigned at CREATE TABLE and never reused, so a
//! DROP followed by a CREATE of the same name never sees the old rows. Big-endian
//! numbers make byte order numeric order, so the log scans in LSN order.

use hawser_core::key::{encode_key, prefix_successor};
use hawser_core::{Lsn, NodeId, QualName, Value};
use std::collections::BTreeMap;
use std::ops::Bound;

use crate::engine::ByteRange;
use crate::error::StoreError;

pub(crate) const FORMAT_KEY: &[u8] = b"Fformat";
pub(crate) const NEXT_TABLE_ID_KEY: &[u8] = b"Mnext_table_id";
/// The boot id of the machine the store was last opened on.
pub(crate) const BOOT_KEY: &[u8] = b"Mboot_id";
/// Where the last machine restart left this node's own commits, and which receivers
/// have been checked against it ([`crate::RestartPoint`]).
pub(crate) const RESTART_KEY: &[u8] = b"Mrestart";
/// Receivers found holding more of this node's origin than it had committed
/// ([`crate::Database::check_receiver_ahead`]).
pub(crate) const AHEAD_KEY: &[u8] = b"Mahead";
/// Per origin, the seq through which replicated transactions are applied in log order
/// after a duplicate (`crate::Database::in_order_through`): pairs of u64 BE.
pub(crate) const COPY_ORDER_KEY: &[u8] = b"Mcopy_in_order";
/// The last LSN of the log when a duplicate last finished (u64 BE): what the log holds
/// up to there no longer describes the tables the copy replaced
/// (`crate::Database::rebuilt_through`).
pub(crate) const REBUILT_KEY: &[u8] = b"Mrebuilt_through";
/// The highest seq of this node's own origin reserved so far, made durable before any
/// seq above the previous reservation is handed out, and the floor local commits
/// continue above after a restart that may have lost commits: no seq is given twice
/// (`crate::db::SeqReservation`).
pub(crate) const SEQ_CEILING_KEY: &[u8] = b"Mseq_ceiling";
pub(crate) const TABLE_PREFIX: u8 = b'T';
pub(crate) const SEQUENCE_PREFIX: u8 = b'S';
pub(crate) const ROW_PREFIX: u8 = b'R';

pub(crate) use crate::engine::LOG_PREFIX;
pub(crate) const HIGH_WATER_PREFIX: u8 = b'H';
pub(crate) const POSITION_PREFIX: u8 = b'P';
pub(crate) const ASIDE_PREFIX: u8 = b'A';

/// What the format key holds before the version number.
pub(crate) const FORMAT_MAGIC: &[u8] = b"hawser-store";
/// The on-disk format this build reads and writes.
/// Format 1 wrote every origin's high-water mark with each commit; format 2 derives the
/// marks from the log and writes `H` keys only for log it releases; format 3 keeps the
/// log's `L` keys in the write-ahead log instead of sled (`crate::engine`, `LogIndex`);
/// format 4 may follow an `H` key's seq with the commit time of that origin's newest
/// released commit ([`high_water_value`]). Older formats are upgraded when opened.
pub const FORMAT_VERSION: u32 = 4;

pub(crate) fn format_value() -> Vec<u8> {
    let mut v = FORMAT_MAGIC.to_vec();
    v.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
    v
}

pub(crate) fn table_key(id: u64) -> Vec<u8> {
    let mut k = vec![TABLE_PREFIX];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn sequence_key(name: &QualName) -> Vec<u8> {
    let mut k = vec![SEQUENCE_PREFIX];
    k.extend(encode_key(&[
        name.owner
            .as_ref()
            .map_or(Value::Null, |o| Value::Text(o.as_str().to_string())),
        Value::Text(name.name.as_str().to_string()),
    ]));
    k
}

pub(crate) fn row_prefix(table_id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(ROW_PREFIX);
    k.extend_from_slice(&table_id.to_be_bytes());
    k
}

/// The row key for an already encoded primary key.
pub(crate) fn row_key(table_id: u64, encoded_pk: &[u8]) -> Vec<u8> {
    let mut k = row_prefix(table_id);
    k.extend_from_slice(encoded_pk);
    k
}

pub(crate) fn log_key(lsn: Lsn) -> Vec<u8> {
    let mut k = vec![LOG_PREFIX];
    k.extend_from_slice(&lsn.0.to_be_bytes());
    k
}

/// An `H` key's value: the highest seq of the origin among released log records,
/// followed (format 4) by that commit's commit time.
pub(crate) fn high_water_value(seq: u64, commit_micros: i64) -> Vec<u8> {
    let mut v = seq.to_be_bytes().to_vec();
    v.extend_from_slice(&commit_micros.to_be_bytes());
    v
}

/// The seq `origin`'s `H` key holds in `engine` (0 without one).
pub(crate) fn stored_high_water(
    engine: &dyn crate::engine::KvEngine,
    origin: NodeId,
) -> Result<u64, StoreError> {
    let key = high_water_key(origin);
    Ok(match engine.get(&key)? {
        Some(v) => decode_high_water(&key, &v)?.0,
        None => 0,
    })
}

/// A map of origin → seq as pairs of big-endian u64s.
pub(crate) fn encode_marks(marks: &BTreeMap<NodeId, u64>) -> Vec<u8> {
    let mut v = Vec::with_capacity(marks.len() * 16);
    for (origin, seq) in marks {
        v.extend_from_slice(&origin.0.to_be_bytes());
        v.extend_from_slice(&seq.to_be_bytes());
    }
    v
}

/// Reads what [`encode_marks`] wrote.
pub(crate) fn decode_marks(key: &[u8], v: &[u8]) -> Result<BTreeMap<NodeId, u64>, StoreError> {
    if !v.len().is_multiple_of(16) {
        return Err(StoreError::corrupt(key, "malformed origin marks"));
    }
    Ok(v.chunks_exact(16)
        .map(|c| {
            let word = |b: &[u8]| u64::from_be_bytes(<[u8; 8]>::try_from(b).expect("eight bytes"));
            (NodeId(word(&c[..8])), word(&c[8..]))
        })
        .collect())
}

/// Reads an `H` key's value: the seq, and the commit time where the value has one
/// (formats before 4 wrote the seq alone).
pub(crate) fn decode_high_water(key: &[u8], v: &[u8]) -> Result<(u64, Option<i64>), StoreError> {
    let word = |b: &[u8]| <[u8; 8]>::try_from(b).expect("eight bytes");
    match v.len() {
        8 => Ok((u64::from_be_bytes(word(v)), None)),
        16 => Ok((
            u64::from_be_bytes(word(&v[..8])),
            Some(i64::from_be_bytes(word(&v[8..]))),
        )),
        n => Err(StoreError::corrupt(
            key,
            format!("a high-water value is 8 or 16 bytes, found {n}"),
        )),
    }
}

pub(crate) fn high_water_key(origin: NodeId) -> Vec<u8> {
    let mut k = vec![HIGH_WATER_PREFIX];
    k.extend_from_slice(&origin.0.to_be_bytes());
    k
}

pub(crate) fn aside_key(gtid: hawser_core::Gtid) -> Vec<u8> {
    let mut k = vec![ASIDE_PREFIX];
    k.extend_from_slice(&gtid.origin.0.to_be_bytes());
    k.extend_from_slice(&gtid.seq.to_be_bytes());
    k
}

pub(crate) fn position_key(link: &str) -> Vec<u8> {
    let mut k = vec![POSITION_PREFIX];
    k.extend_from_slice(link.as_bytes());
    k
}

/// The byte range of every key that starts with `prefix`.
pub(crate) fn prefix_range(prefix: &[u8]) -> ByteRange {
    (
        Bound::Included(prefix.to_vec()),
        prefix_successor(prefix).map_or(Bound::Unbounded, Bound::Excluded),
    )
}

/// Reads a big-endian u64 that follows a one-byte prefix.
pub(crate) fn suffix_u64(key: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = key.get(1..9)?.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}
