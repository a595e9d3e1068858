//! The commit log's keys, which stay in the write-ahead log and out of sled: the index of
//! the frames that hold them, and reading their values back from those frames.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::Shared;
use crate::engine::LOG_PREFIX;
use crate::engine::{wal, ByteRange};
use crate::error::StoreError;

/// The commit log's keys ([`LOG_PREFIX`]) do not go into sled: the
/// write-ahead log frame that put one already holds its value, so the engine keeps
/// the frame number and reads the value back from the log. Commit log records are
/// written once and deleted when released (`db::release_log`), so this saves a sled
/// insert per commit and keeps the log on disk once; the log segments holding a key
/// stay until it is deleted.
#[derive(Default)]
pub(super) struct LogIndex {
    /// Log key → the frame whose batch last put it.
    pub(super) keys: BTreeMap<Vec<u8>, u64>,
    /// Frame → how many of `keys` it holds: the segments before the first one held
    /// (and at or below the checkpoint) can go.
    pub(super) frames: BTreeMap<u64, u32>,
    /// Log keys sled still holds, from a store of format 2 or older. They are read
    /// from sled and deleted there; opening removes any the log holds too.
    pub(super) legacy: usize,
}

impl LogIndex {
    pub(super) fn put(&mut self, key: Vec<u8>, frame: u64) {
        if let Some(old) = self.keys.insert(key, frame) {
            self.unhold(old);
        }
        *self.frames.entry(frame).or_default() += 1;
    }

    /// Removes `key`; false when it is not here.
    pub(super) fn delete(&mut self, key: &[u8]) -> bool {
        match self.keys.remove(key) {
            Some(frame) => {
                self.unhold(frame);
                true
            }
            None => false,
        }
    }

    fn unhold(&mut self, frame: u64) {
        if let std::collections::btree_map::Entry::Occupied(mut e) = self.frames.entry(frame) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    /// The oldest frame a log key is read from.
    pub(super) fn first_held(&self) -> Option<u64> {
        self.frames.keys().next().copied()
    }
}

/// The log keys one frame puts, with their values.
pub(super) type FrameLog = BTreeMap<Vec<u8>, Vec<u8>>;

/// The value of `key` among the log keys frame `frame` puts; the index sent the
/// reader there, so a frame without it is corrupt.
pub(super) fn take_log_value(
    values: &mut FrameLog,
    frame: u64,
    key: &[u8],
) -> Result<Vec<u8>, StoreError> {
    values.remove(key).ok_or_else(|| {
        StoreError::corrupt(
            key,
            format!("log key in frame {frame}: the frame does not put it"),
        )
    })
}

/// Whether `key` is a commit log key, kept in the write-ahead log ([`LogIndex`]).
pub(super) fn is_log_key(key: &[u8]) -> bool {
    key.first() == Some(&LOG_PREFIX)
}

/// The byte range of every log key.
pub(super) fn log_key_range() -> ByteRange {
    (
        Bound::Included(vec![LOG_PREFIX]),
        Bound::Excluded(vec![LOG_PREFIX + 1]),
    )
}
impl Shared {
    /// The value log key `key` has in frame `frame`; `None` when the frame's segment
    /// was released meanwhile (the key was deleted).
    pub(super) fn log_value(&self, frame: u64, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(mut values) = self.log_values(frame)? else {
            return Ok(None);
        };
        take_log_value(&mut values, frame, key).map(Some)
    }

    /// The log keys frame `frame` puts, with their values; `None` when the frame's
    /// segment was released meanwhile.
    pub(super) fn log_values(&self, frame: u64) -> Result<Option<FrameLog>, StoreError> {
        let Some(payload) = self.wal.read_frame(frame)? else {
            return Ok(None);
        };
        let batch = wal::decode_batch(&payload).map_err(|reason| {
            StoreError::corrupt(&frame.to_be_bytes(), format!("frame {frame}: {reason}"))
        })?;
        let mut values = FrameLog::new();
        for (k, v) in batch.into_ops() {
            if is_log_key(&k) {
                match v {
                    Some(v) => values.insert(k, v),
                    None => values.remove(&k),
                };
            }
        }
        Ok(Some(values))
    }
}
