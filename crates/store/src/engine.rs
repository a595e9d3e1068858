//! The key-value engine under the store, and its two implementations.
//!
//! Everything hawser keeps lives in one ordered keyspace ([`crate::layout`] says where),
//! so one [`WriteBatch`] can change rows, the commit log and the catalog together and the
//! engine applies it atomically: after a crash either all of a batch is there or none of
//! it. Durability is explicit: [`KvEngine::apply`] makes a batch visible, and
//! [`KvEngine::flush`] makes everything applied so far durable. Keeping the two apart is
//! what lets many commits share one flush (group commit, see [`crate::db`]).
//!
//! * [`SledEngine`] is the real one: one sled tree for everything, so one
//!   `apply_batch` covers a whole commit.
//! * [`MemEngine`] keeps a `BTreeMap`: tests, simulations, and the second
//!   implementation that keeps the trait honest.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use parking_lot::RwLock;

use crate::error::StoreError;

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

    /// Applies `batch` atomically; it is visible to every reader once this returns and
    /// survives a crash either whole or not at all.
    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError>;

    /// Makes every batch applied before this call durable before it returns.
    fn flush(&self) -> Result<(), StoreError>;
}

/// The sled engine: one tree holds the whole keyspace.
pub struct SledEngine {
    db: sled::Db,
}

impl SledEngine {
    /// Opens (or creates) the sled database in `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let db = sled::Config::new()
            .path(dir)
            .open()
            .map_err(|e| StoreError::io(format!("open of {}", dir.display()), e))?;
        Ok(Self { db })
    }
}

impl KvEngine for SledEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db
            .get(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| StoreError::io("read", e))
    }

    fn scan(&self, range: ByteRange, reverse: bool) -> KvIter {
        if range_is_empty(&range) {
            return Box::new(std::iter::empty());
        }
        let iter = self.db.range(range);
        let map = |r: sled::Result<(sled::IVec, sled::IVec)>| {
            r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                .map_err(|e| StoreError::io("scan", e))
        };
        if reverse {
            Box::new(iter.rev().map(map))
        } else {
            Box::new(iter.map(map))
        }
    }

    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let mut b = sled::Batch::default();
        for (k, v) in batch.into_ops() {
            match v {
                Some(v) => b.insert(k, v),
                None => b.remove(k),
            }
        }
        self.db
            .apply_batch(b)
            .map_err(|e| StoreError::io("batch write", e))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db
            .flush()
            .map(|_| ())
            .map_err(|e| StoreError::io("flush", e))
    }
}

/// The in-memory engine: a `BTreeMap` behind a lock. `flush` has nothing to do.
#[derive(Default)]
pub struct MemEngine {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemEngine {
    pub fn new() -> Self {
        Self::default()
    }
}

impl KvEngine for MemEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.map.read().get(key).cloned())
    }

    fn scan(&self, range: ByteRange, reverse: bool) -> KvIter {
        if range_is_empty(&range) {
            return Box::new(std::iter::empty());
        }
        // A snapshot of the range: simple, and the memory engine serves tests only.
        let map = self.map.read();
        let mut items: Vec<_> = map
            .range(range)
            .map(|(k, v)| Ok((k.clone(), v.clone())))
            .collect();
        if reverse {
            items.reverse();
        }
        Box::new(items.into_iter())
    }

    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let mut map = self.map.write();
        for (k, v) in batch.into_ops() {
            match v {
                Some(v) => map.insert(k, v),
                None => map.remove(&k),
            };
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(engine: &dyn KvEngine) {
        let mut b = WriteBatch::new();
        for k in [3u8, 1, 2, 5] {
            b.put(vec![k], vec![k * 10]);
        }
        b.delete(vec![5]);
        engine.apply(b).unwrap();
        engine.flush().unwrap();
        assert_eq!(engine.get(&[2]).unwrap(), Some(vec![20]));
        assert_eq!(engine.get(&[5]).unwrap(), None);
        let keys = |r, rev| -> Vec<u8> {
            engine
                .scan(r, rev)
                .map(|kv| kv.unwrap().0[0])
                .collect::<Vec<_>>()
        };
        use Bound::*;
        assert_eq!(keys((Unbounded, Unbounded), false), vec![1, 2, 3]);
        assert_eq!(
            keys((Excluded(vec![1]), Included(vec![3])), true),
            vec![3, 2]
        );
        assert!(keys((Included(vec![3]), Excluded(vec![1])), false).is_empty());
    }

    #[test]
    fn mem_engine_applies_batches_in_order_and_scans_both_ways() {
        exercise(&MemEngine::new());
    }

    #[test]
    fn sled_engine_applies_batches_in_order_and_scans_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        exercise(&SledEngine::open(dir.path()).unwrap());
    }
}
