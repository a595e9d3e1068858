//! The free-space floor of a store on disk.
//!
//! A write that runs out of disk half way is the worst way to find a full disk: sled
//! records the I/O error and fails every later operation, so the store is left broken
//! until the process restarts (the log frames are durable, so nothing is lost, but
//! nothing is written either). So a store keeps a floor: while the volume holding its
//! directory has less than [`crate::DbOptions::min_free_bytes`] available, it refuses
//! writes — its own commits, DDL, sequence blocks and replicated applies — with
//! [`StoreError::DiskFull`] (SQLSTATE 53100), before they touch the disk. Reads go on,
//! and writes resume by themselves once there is room again.
//!
//! The free space is read (`statvfs`) once when the store opens and then every
//! [`CHECK_EVERY`] by a small thread of its own, so a commit pays one atomic load for
//! it. Between two readings the store can write at most what arrives in that time: the
//! floor must be larger than that, which the default (64 MiB) is for any rate this
//! store sustains.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::{info, warn};

use crate::error::StoreError;

/// How often the watcher reads the free space.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The free space of a store's volume, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpaceStatus {
    /// Bytes available to this process on the volume at the last reading.
    pub free_bytes: u64,
    /// The floor below which writes are refused.
    pub min_free_bytes: u64,
    /// Whether writes are refused now.
    pub low: bool,
}

/// Watches one directory's volume against a floor.
pub(crate) struct SpaceGuard {
    dir: PathBuf,
    min_free: u64,
    free: AtomicU64,
    low: AtomicBool,
}

impl SpaceGuard {
    /// Reads the free space of `dir`'s volume once and starts a thread that reads it
    /// again every [`CHECK_EVERY`] until the guard is dropped.
    pub(crate) fn start(dir: &Path, min_free: u64) -> Result<Arc<Self>, StoreError> {
        let guard = Arc::new(Self {
            dir: dir.to_path_buf(),
            min_free,
            free: AtomicU64::new(u64::MAX),
            low: AtomicBool::new(false),
        });
        let free = available(dir).map_err(|e| {
            StoreError::io(format!("reading the free space of {}", dir.display()), e)
        })?;
        guard.note(free);
        let weak: Weak<Self> = Arc::downgrade(&guard);
        std::thread::Builder::new()
            .name("hawser-space".into())
            .spawn(move || watch(weak))
            .map_err(|e| StoreError::io("starting the free-space watcher", e))?;
        Ok(guard)
    }

    /// Refuses a write while the volume is below the floor.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        if self.low.load(Ordering::Acquire) {
            return Err(StoreError::DiskFull(self.describe()));
        }
        Ok(())
    }

    pub(crate) fn status(&self) -> SpaceStatus {
        SpaceStatus {
            free_bytes: self.free.load(Ordering::Acquire),
            min_free_bytes: self.min_free,
            low: self.low.load(Ordering::Acquire),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} available on the volume of {}, below the {} kept free \
             (hawser start --min-free-bytes); writes resume once there is room",
            mib(self.free.load(Ordering::Acquire)),
            self.dir.display(),
            mib(self.min_free),
        )
    }

    /// Takes a reading: below the floor refuses writes from now on, at or above it
    /// lets them through again.
    fn note(&self, free: u64) {
        self.free.store(free, Ordering::Release);
        let low = free < self.min_free;
        if self.low.swap(low, Ordering::AcqRel) != low {
            if low {
                warn!("disk full: {}", self.describe());
            } else {
                info!(
                    free = %mib(free),
                    dir = %self.dir.display(),
                    "disk has room again: taking writes"
                );
            }
        }
    }
}

fn watch(guard: Weak<SpaceGuard>) {
    loop {
        std::thread::sleep(CHECK_EVERY);
        let Some(g) = guard.upgrade() else { return };
        match available(&g.dir) {
            Ok(free) => g.note(free),
            // Keep the last verdict: a failed reading says nothing of the space.
            Err(e) => warn!(dir = %g.dir.display(), error = %e, "cannot read the free space"),
        }
    }
}

/// Bytes available to an unprivileged writer on the volume holding `dir`.
fn available(dir: &Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(dir)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_below_the_floor_refuses_and_one_above_it_lets_through() {
        let dir = tempfile::tempdir().unwrap();
        let g = SpaceGuard::start(dir.path(), 1).unwrap();
        assert!(g.check().is_ok(), "{:?}", g.status());
        g.note(0);
        let err = g.check().unwrap_err();
        assert_eq!(err.code(), "53100");
        let msg = err.to_string();
        assert!(msg.starts_with("disk full: 0.0 MiB available"), "{msg}");
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
        assert!(g.status().low);
        g.note(1);
        assert!(g.check().is_ok());
        assert_eq!(g.status().free_bytes, 1);
    }

    #[test]
    fn the_watcher_reads_the_volume_again() {
        let dir = tempfile::tempdir().unwrap();
        let g = SpaceGuard::start(dir.path(), 1).unwrap();
        g.note(0);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while g.status().low {
            assert!(std::time::Instant::now() < deadline, "never read again");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(g.status().free_bytes > 1);
    }
}
