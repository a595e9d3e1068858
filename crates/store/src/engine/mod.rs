//! The key-value engine under the store, and its two implementations.
//!
//! Everything hawser keeps lives in one ordered keyspace ([`crate::layout`] says where),
//! so one [`WriteBatch`] can change rows, the commit log and the catalog together and the
//! engine applies it atomically: after a crash either all of a batch is there or none of
//! it. Durability is explicit: [`KvEngine::apply`] makes a batch visible, and
//! [`KvEngine::flush`] makes everything applied so far durable. Keeping the two apart is
//! what lets many commits share one flush (group commit, see [`crate::db`]).
//!
//! * [`SledEngine`] is the real one: one sled tree for everything, with hawser's
//!   write-ahead log ([`wal`]) making each batch atomic and durable.
//! * [`MemEngine`] keeps a `BTreeMap`: tests, simulations, and the second
//!   implementation that keeps the trait honest.

use std::ops::Bound;

use crate::error::StoreError;

mod mem;
mod sled_engine;

/// The first byte of the commit log's keys. The sled engine keeps the log in its own
/// write-ahead log rather than in sled's tree, so the engine knows the prefix; the
/// database's key layout (`crate::layout`) takes it from here.
pub(crate) const LOG_PREFIX: u8 = b'L';
pub(crate) mod wal;

pub use mem::MemEngine;
pub use sled_engine::SledEngine;

/// A range of keys: lower and upper bound.
pub type ByteRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// An iterator over `(key, value)` pairs of one scan, in the scan's order.
pub type KvIter = Box<dyn Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + Send>;

/// A set of puts and deletes applied as one atomic unit, in insertion order (a later
/// operation on the same key wins).
#[derive(Debug, Default, Clone)]
pub struct WriteBatch {
    ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl WriteBatch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.ops.push((key, Some(value)));
    }

    pub fn delete(&mut self, key: Vec<u8>) {
        self.ops.push((key, None));
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Bytes of keys and values in the batch.
    pub fn size_bytes(&self) -> usize {
        self.ops
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
            .sum()
    }

    /// The operations: `(key, Some(value))` puts, `(key, None)` deletes.
    pub fn ops(&self) -> &[(Vec<u8>, Option<Vec<u8>>)] {
        &self.ops
    }

    pub fn into_ops(self) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        self.ops
    }
}

/// An ordered keyspace with atomic batches and explicit durability.
pub trait KvEngine: Send + Sync + 'static {
    /// The value under `key`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// The pairs whose keys fall in `range`, ascending, or descending when `reverse`.
    fn scan(&self, range: ByteRange, reverse: bool) -> KvIter;

    /// Applies `batch`: it is visible to every reader once this returns (its keys may
    /// become visible one by one before that) and survives a crash either whole or not
    /// at all.
    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError>;

    /// Makes every batch applied before this call durable before it returns.
    fn flush(&self) -> Result<(), StoreError>;

    /// [`KvEngine::flush`], leaving work the flush does after the batches are durable
    /// (moving them to where they stay) for [`KvEngine::settle`] or a later flush, so
    /// that a caller can act on the durability first.
    fn flush_unsettled(&self) -> Result<(), StoreError> {
        self.flush()
    }

    /// Does what [`KvEngine::flush_unsettled`] left; cheap when nothing was left.
    fn settle(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// [`KvEngine::settle`], calling `pause` between pieces of the work (the sled
    /// engine: before each batch it moves).
    fn settle_paced(&self, _pause: &mut dyn FnMut()) -> Result<(), StoreError> {
        self.settle()
    }

    /// Starts a flush's write without waiting for the disk: after it, the batches
    /// applied so far survive a crash of this process (not yet of the machine). A
    /// [`KvEngine::flush`] still makes them durable. Nothing to do for an engine whose
    /// flush does not write ahead.
    fn write_ahead(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Why the engine can no longer write, once a write or sync of its log failed or a
    /// durable batch could be moved only in part (a full disk, an I/O error): it refuses
    /// every write from then on, while readers may still see batches that never became
    /// durable. Only a restart, which recovers from what is durable, clears it.
    fn failure(&self) -> Option<String> {
        None
    }

    /// What opening cut from a damaged log when told to salvage it
    /// ([`SledEngine::open_salvaging`]); `None` when nothing was.
    fn salvaged(&self) -> Option<String> {
        None
    }
}

/// Whether a byte range holds no key at all. `BTreeMap::range` panics on a range whose
/// start is after its end, so both engines check first.
pub(crate) fn range_is_empty(range: &ByteRange) -> bool {
    use Bound::*;
    match range {
        (Included(a), Included(b)) => a > b,
        (Included(a), Excluded(b)) | (Excluded(a), Included(b)) | (Excluded(a), Excluded(b)) => {
            a >= b
        }
        _ => false,
    }
}
