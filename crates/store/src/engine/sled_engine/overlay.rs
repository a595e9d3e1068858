//! Batches applied but not yet in sled: the overlay readers see them in, and their move
//! into sled, in frame order, once the log has made their frames durable.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::log_index::is_log_key;
use super::Shared;
use crate::engine::WriteBatch;
use crate::error::StoreError;

/// What readers see of batches sled does not have yet: the newest operation of each
/// key, and the batches themselves, oldest first, waiting to move into sled.
#[derive(Default)]
pub(super) struct Overlay {
    /// Key → (the frame that last wrote it, its value; `None` = deleted).
    pub(super) keys: BTreeMap<Vec<u8>, (u64, Option<Vec<u8>>)>,
    pub(super) frames: std::collections::VecDeque<(u64, WriteBatch)>,
}
impl Shared {
    /// Syncs the log and moves the batches it made durable into sled.
    pub(super) fn sync(&self) -> Result<(), StoreError> {
        self.sync_log()?;
        self.move_durable()
    }

    pub(super) fn move_durable(&self) -> Result<(), StoreError> {
        self.move_durable_paced(&mut || {})
    }

    /// Syncs the log, timing the syncs that made frames durable.
    pub(super) fn sync_log(&self) -> Result<(), StoreError> {
        let (before, started) = (self.wal.synced(), Instant::now());
        self.wal.sync()?;
        if self.wal.synced() > before {
            self.metrics.log_sync.record(started.elapsed());
        }
        Ok(())
    }

    /// Moves the batches whose frames are durable from the overlay into sled, oldest
    /// first; their keys leave the overlay once sled has them all (readers look in the
    /// overlay first, so they never miss one), unless a later batch wrote them again.
    pub(super) fn move_durable_paced(&self, pause: &mut dyn FnMut()) -> Result<(), StoreError> {
        let _moving = self.moving.lock();
        if let Some(reason) = self.broken.lock().clone() {
            return Err(broken_error(&reason));
        }
        let durable = self.wal.synced();
        let moving: Vec<(u64, WriteBatch)> = {
            let mut o = self.overlay.write();
            let n = o.frames.iter().take_while(|(f, _)| *f <= durable).count();
            o.frames.drain(..n).collect()
        };
        let Some(&(last, _)) = moving.last() else {
            return Ok(());
        };
        let started = Instant::now();
        let broken = |e: sled::Error| {
            // The batches stay visible in the overlay; their frames are durable, so a
            // restart completes them.
            *self.broken.lock() = Some(e.to_string());
            StoreError::io("batch write", e)
        };
        for (_, batch) in &moving {
            pause();
            for (k, v) in batch.ops() {
                if is_log_key(k) {
                    continue;
                }
                match v {
                    Some(v) => self.db.insert(k.as_slice(), v.as_slice()).map(|_| ()),
                    None => self.db.remove(k.as_slice()).map(|_| ()),
                }
                .map_err(broken)?;
            }
        }
        // Log keys: readable from their (durable) frames from now on.
        let mut legacy_deletes = Vec::new();
        {
            let mut log = self.log.write();
            for (frame, batch) in &moving {
                for (k, v) in batch.ops() {
                    if !is_log_key(k) {
                        continue;
                    }
                    if v.is_some() {
                        log.put(k.clone(), *frame);
                    } else if !log.delete(k) && log.legacy > 0 {
                        legacy_deletes.push(k.as_slice());
                    }
                }
            }
        }
        for k in legacy_deletes {
            if self.db.remove(k).map_err(broken)?.is_some() {
                let mut log = self.log.write();
                log.legacy = log.legacy.saturating_sub(1);
            }
        }
        let mut o = self.overlay.write();
        for (frame, batch) in &moving {
            for (k, _) in batch.ops() {
                if o.keys.get(k).is_some_and(|(f, _)| f == frame) {
                    o.keys.remove(k);
                }
            }
        }
        drop(o);
        self.applied.store(last, Ordering::Release);
        self.metrics.moves.record(started.elapsed());
        Ok(())
    }
}

pub(super) fn broken_error(reason: &str) -> StoreError {
    StoreError::io(
        "batch write",
        std::io::Error::other(format!(
            "an earlier batch was written only in part ({reason}); restart to recover it"
        )),
    )
}
