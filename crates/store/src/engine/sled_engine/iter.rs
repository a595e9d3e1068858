//! Scans of the engine: sled's part with the log keys read from the log, merged with the
//! overlay's pairs, in either direction.

use std::ops::Bound;
use std::sync::Arc;

use super::log_index::{log_key_range, take_log_value, FrameLog};
use super::Shared;
use crate::engine::{range_is_empty, ByteRange, KvIter};
use crate::error::StoreError;

impl Shared {
    /// sled's part of a scan with the log keys in it, from the log.
    pub(super) fn disk_scan(self: &Arc<Self>, range: ByteRange, reverse: bool) -> KvIter {
        let sled_part = |r: ByteRange| -> KvIter {
            let iter = self.db.range(r);
            let shared = self.clone();
            let map = move |r: sled::Result<(sled::IVec, sled::IVec)>| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(|e| shared.sled_error("scan", e))
            };
            if reverse {
                Box::new(iter.rev().map(map))
            } else {
                Box::new(iter.map(map))
            }
        };
        let (log_lo, log_hi) = log_key_range();
        let Some(in_log) = intersect(&range, &log_key_range()) else {
            return sled_part(range);
        };
        let mut parts: Vec<KvIter> = Vec::with_capacity(3);
        if let Some(below) = intersect(&range, &(Bound::Unbounded, exclude(log_lo))) {
            parts.push(sled_part(below));
        }
        let from_log: KvIter = Box::new(LogIter {
            shared: self.clone(),
            range: in_log.clone(),
            reverse,
            buf: std::collections::VecDeque::new(),
            done: false,
            frame: None,
        });
        parts.push(if self.log.read().legacy > 0 {
            Box::new(Union::new(from_log, sled_part(in_log), reverse))
        } else {
            from_log
        });
        if let Some(above) = intersect(&range, &(include(log_hi), Bound::Unbounded)) {
            parts.push(sled_part(above));
        }
        if reverse {
            parts.reverse();
        }
        Box::new(parts.into_iter().flatten())
    }
}

/// Sled's part of a scan merged with the overlay's, in the scan's direction.
pub(super) struct Merged {
    sled: std::iter::Peekable<KvIter>,
    /// The overlay's pairs, the next one last.
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    reverse: bool,
}

impl Merged {
    pub(super) fn new(
        sled: KvIter,
        pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        reverse: bool,
    ) -> Self {
        Self {
            sled: sled.peekable(),
            pending,
            reverse,
        }
    }
}

impl Iterator for Merged {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let take_overlay = match (self.sled.peek(), self.pending.last()) {
                (_, None) | (Some(Err(_)), _) => return self.sled.next(),
                (None, Some(_)) => true,
                (Some(Ok((sk, _))), Some((ok, _))) => match sk.cmp(ok) {
                    std::cmp::Ordering::Equal => {
                        // Both have it: the overlay's is newer.
                        self.sled.next();
                        true
                    }
                    order => (order == std::cmp::Ordering::Greater) != self.reverse,
                },
            };
            if take_overlay {
                let (k, v) = self.pending.pop().expect("peeked");
                match v {
                    Some(v) => return Some(Ok((k, v))),
                    None => continue, // deleted, not yet in sled
                }
            }
            return self.sled.next();
        }
    }
}

/// The log keys of a scan, from the index and the frames that hold them, read a
/// chunk of keys at a time (the index is not held while frames are read).
struct LogIter {
    shared: Arc<Shared>,
    /// What is left to read.
    range: ByteRange,
    reverse: bool,
    buf: std::collections::VecDeque<(Vec<u8>, u64)>,
    done: bool,
    /// The last frame read: a batch of replicated commits puts many log keys.
    frame: Option<(u64, FrameLog)>,
}

/// Log keys a [`LogIter`] takes from the index at a time.
const LOG_CHUNK: usize = 128;

impl Iterator for LogIter {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.buf.is_empty() {
                if self.done || range_is_empty(&self.range) {
                    return None;
                }
                {
                    let log = self.shared.log.read();
                    let found = log.keys.range(self.range.clone());
                    let take = |(k, f): (&Vec<u8>, &u64)| (k.clone(), *f);
                    if self.reverse {
                        self.buf.extend(found.rev().take(LOG_CHUNK).map(take));
                    } else {
                        self.buf.extend(found.take(LOG_CHUNK).map(take));
                    }
                }
                self.done = self.buf.len() < LOG_CHUNK;
                if let Some((k, _)) = self.buf.back() {
                    if self.reverse {
                        self.range.1 = Bound::Excluded(k.clone());
                    } else {
                        self.range.0 = Bound::Excluded(k.clone());
                    }
                }
            }
            let (key, frame) = self.buf.pop_front()?;
            if self.frame.as_ref().is_none_or(|(f, _)| *f != frame) {
                match self.shared.log_values(frame) {
                    Ok(Some(values)) => self.frame = Some((frame, values)),
                    // Deleted and its segment released since the chunk was taken.
                    Ok(None) => continue,
                    Err(e) => return Some(Err(e)),
                }
            }
            let (_, values) = self.frame.as_mut().expect("just read");
            return Some(take_log_value(values, frame, &key).map(|value| (key, value)));
        }
    }
}

/// Two scans of disjoint keys merged in the scan's direction.
struct Union {
    a: std::iter::Peekable<KvIter>,
    b: std::iter::Peekable<KvIter>,
    reverse: bool,
}

impl Union {
    fn new(a: KvIter, b: KvIter, reverse: bool) -> Self {
        Self {
            a: a.peekable(),
            b: b.peekable(),
            reverse,
        }
    }
}

impl Iterator for Union {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let a_first = match (self.a.peek(), self.b.peek()) {
            (None, _) => false,
            (_, None) | (Some(Err(_)), _) => true,
            (_, Some(Err(_))) => false,
            (Some(Ok((ka, _))), Some(Ok((kb, _)))) => (ka < kb) != self.reverse,
        };
        if a_first {
            self.a.next()
        } else {
            self.b.next()
        }
    }
}

fn include(b: Bound<Vec<u8>>) -> Bound<Vec<u8>> {
    match b {
        Bound::Excluded(k) | Bound::Included(k) => Bound::Included(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn exclude(b: Bound<Vec<u8>>) -> Bound<Vec<u8>> {
    match b {
        Bound::Excluded(k) | Bound::Included(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// The keys both ranges hold, `None` when there are none.
fn intersect(a: &ByteRange, b: &ByteRange) -> Option<ByteRange> {
    use Bound::*;
    let lower = match (a.0.clone(), b.0.clone()) {
        (Unbounded, x) | (x, Unbounded) => x,
        (Included(x), Included(y)) => Included(x.max(y)),
        (Excluded(x), Excluded(y)) => Excluded(x.max(y)),
        (Included(i), Excluded(e)) | (Excluded(e), Included(i)) => {
            if i > e {
                Included(i)
            } else {
                Excluded(e)
            }
        }
    };
    let upper = match (a.1.clone(), b.1.clone()) {
        (Unbounded, x) | (x, Unbounded) => x,
        (Included(x), Included(y)) => Included(x.min(y)),
        (Excluded(x), Excluded(y)) => Excluded(x.min(y)),
        (Included(i), Excluded(e)) | (Excluded(e), Included(i)) => {
            if i < e {
                Included(i)
            } else {
                Excluded(e)
            }
        }
    };
    let r = (lower, upper);
    (!range_is_empty(&r)).then_some(r)
}
