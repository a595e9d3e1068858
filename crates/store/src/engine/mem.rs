//! The in-memory engine: tests, simulations, and the second implementation that keeps
//! the [`KvEngine`] trait honest.

use std::collections::BTreeMap;

use parking_lot::RwLock;

use super::{range_is_empty, ByteRange, KvEngine, KvIter, WriteBatch};
use crate::error::StoreError;

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
