//! What opening recovers: the redo records and the log frames past sled's checkpoint
//! re-applied in order, the log keys indexed, the segments that hold none removed; and
//! the checkpoint record that bounds the next recovery.

use std::path::Path;

use super::log_index::{is_log_key, log_key_range, LogIndex};
use crate::engine::wal;
use crate::error::StoreError;

/// The key of the checkpoint in the redo tree: sorts before every frame number.
pub(super) const CHECKPOINT_KEY: &[u8] = b"";

/// What opening found.
pub(super) struct Recovered {
    /// The last frame.
    pub(super) last: u64,
    pub(super) log: LogIndex,
    /// The log segments kept: they hold log keys.
    pub(super) kept: Vec<wal::ScannedSegment>,
    /// What salvaging the log cut, if it did.
    pub(super) salvaged: Option<String>,
}

/// Re-applies what sled may lack, checkpoints it, and indexes the log keys the log
/// segments hold; removes the segments that hold none.
pub(super) fn recover(
    db: &sled::Db,
    redo: &sled::Tree,
    wal_dir: &Path,
    salvage: bool,
) -> Result<Recovered, StoreError> {
    let io = |what: &'static str| move |e: sled::Error| StoreError::io(what, e);
    let checkpoint = match redo.get(CHECKPOINT_KEY).map_err(io("recovery"))? {
        Some(v) => frame_number(&v)?,
        None => 0,
    };
    let mut last = checkpoint;
    // Redo records first: sled has each of these batches whole or in part.
    for item in redo.range(FIRST_FRAME_KEY..) {
        let (k, v) = item.map_err(io("recovery"))?;
        let frame = frame_number(&k)?;
        if frame != last + 1 {
            return Err(StoreError::corrupt(
                &k,
                format!("redo record {frame} does not follow frame {last}"),
            ));
        }
        apply_frame(db, frame, &v)?;
        last = frame;
    }
    // Log keys older stores kept in sled.
    let mut log = LogIndex {
        legacy: db.range(log_key_range()).count(),
        ..LogIndex::default()
    };
    // Then the log, from its oldest segment: the log keys of every frame, and the
    // other changes of the frames sled may not have at all.
    let in_sled = last;
    let mut replayed: Option<u64> = None;
    let mut seen: Option<u64> = None;
    let scanned = wal::scan(wal_dir, salvage, checkpoint, |frame, payload| {
        seen = Some(frame);
        let batch = wal::decode_batch(payload).map_err(|reason| {
            StoreError::corrupt(&frame.to_be_bytes(), format!("frame {frame}: {reason}"))
        })?;
        let redo = frame > in_sled;
        if redo {
            wal::check_continues(wal_dir, in_sled, replayed, frame)?;
            replayed = Some(frame);
        }
        let failed = |e| StoreError::io(format!("re-applying frame {frame}"), e);
        for (k, v) in batch.into_ops() {
            if is_log_key(&k) {
                if v.is_some() {
                    // An older store may have moved it into sled too.
                    if log.legacy > 0 && db.remove(&k).map_err(failed)?.is_some() {
                        log.legacy -= 1;
                    }
                    log.put(k, frame);
                } else if !log.delete(&k)
                    && redo
                    && log.legacy > 0
                    && db.remove(&k).map_err(failed)?.is_some()
                {
                    log.legacy -= 1;
                }
                continue;
            }
            if redo {
                match v {
                    Some(v) => db.insert(k, v).map(|_| ()),
                    None => db.remove(k).map(|_| ()),
                }
                .map_err(failed)?;
            }
        }
        Ok(())
    })?;
    // Frames a crash of the process left written but not synced are in the kernel's
    // cache, where the scan read them: they become durable before anything counts
    // on them (only the last segment can hold such frames: a roll syncs the old one).
    if let Some(segment) = scanned.segments.last() {
        std::fs::File::open(&segment.path)
            .and_then(|f| f.sync_data())
            .map_err(|e| StoreError::io(format!("syncing {}", segment.path.display()), e))?;
    }
    if let Some(l) = replayed {
        tracing::info!(
            from = checkpoint + 1,
            to = l,
            "recovered batches from the redo records and the write-ahead log"
        );
        last = l;
    } else if last > checkpoint {
        tracing::info!(
            from = checkpoint + 1,
            to = last,
            "recovered batches from the redo records"
        );
    }
    if scanned.salvaged.is_some() {
        // The log was cut before frames sled may hold: the next frame follows the last
        // one kept, so that the log goes on without a gap (what sled holds of the
        // frames cut stays; a frame written again under their numbers is re-applied
        // over it, as the checkpoint now says).
        let kept = seen.unwrap_or(0);
        if kept < last {
            tracing::warn!(
                from = kept + 1,
                to = last,
                "frames cut from the salvaged log were in sled already; the log goes on \
                 after the last frame kept"
            );
            last = kept;
        }
    }
    // Make all of it sled's; then only the segments with log keys in them stay.
    db.flush().map_err(io("recovery flush"))?;
    set_checkpoint(db, redo, last)?;
    let first_held = log.first_held().unwrap_or(u64::MAX);
    let mut kept = Vec::new();
    // Oldest first, the directory synced after each: a crash leaves the segments that
    // remain continuing one another (a gap is taken for damage at the next open).
    let remove = |path: &Path| {
        std::fs::remove_file(path)
            .map_err(|e| StoreError::io(format!("removing {}", path.display()), e))?;
        wal::sync_dir(wal_dir)
    };
    for segment in scanned.segments {
        if segment.offsets.is_empty() || segment.last() < first_held {
            remove(&segment.path)?;
        } else {
            kept.push(segment);
        }
    }
    for path in &scanned.stale {
        remove(path)?;
    }
    Ok(Recovered {
        last,
        log,
        kept,
        salvaged: scanned.salvaged,
    })
}

/// The smallest redo record key.
const FIRST_FRAME_KEY: [u8; 8] = [0; 8];

pub(super) fn frame_number(bytes: &[u8]) -> Result<u64, StoreError> {
    let arr: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StoreError::corrupt(bytes, "a frame number is 8 bytes"))?;
    Ok(u64::from_be_bytes(arr))
}

fn apply_frame(db: &sled::Db, frame: u64, payload: &[u8]) -> Result<(), StoreError> {
    let batch = wal::decode_batch(payload).map_err(|reason| {
        StoreError::corrupt(&frame.to_be_bytes(), format!("frame {frame}: {reason}"))
    })?;
    for (k, v) in batch.into_ops() {
        match v {
            Some(v) => db.insert(k, v).map(|_| ()),
            None => db.remove(k).map(|_| ()),
        }
        .map_err(|e| StoreError::io(format!("re-applying frame {frame}"), e))?;
    }
    Ok(())
}

/// Records `frame` as sled's checkpoint and drops the redo records up to it, durably:
/// only then may log segments up to it go (a replayed frame has no redo record).
pub(super) fn set_checkpoint(
    db: &sled::Db,
    redo: &sled::Tree,
    frame: u64,
) -> Result<(), StoreError> {
    let mut b = sled::Batch::default();
    b.insert(CHECKPOINT_KEY, &frame.to_be_bytes());
    for k in redo.range(FIRST_FRAME_KEY..=frame.to_be_bytes()).keys() {
        b.remove(k.map_err(|e| StoreError::io("checkpoint", e))?);
    }
    redo.apply_batch(b)
        .map_err(|e| StoreError::io("checkpoint", e))?;
    db.flush()
        .map(|_| ())
        .map_err(|e| StoreError::io("checkpoint flush", e))
}
