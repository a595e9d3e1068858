//! Rows held back from readers while a RETURN TWOSAFE commit waits for its subscriber.
//!
//! docs/design.md §3: nobody reads a TWOSAFE transaction's effects on the master before the
//! subscriber has committed it, and later writers of the same rows are ordered after it.
//! The second half is the row locks, which a holding commit keeps until its wait ends.
//! The first half is this overlay: before the commit's batch is applied, the committed
//! version of every row it writes (raw value bytes, or absent) is recorded here, and
//! committed reads ([`crate::db::Inner::get_row`], [`crate::db::Inner::scan_rows`]) see
//! that version instead of the engine's until the commit lets go.
//!
//! ```text
//!  Txn::commit_held(hide) ─► hold(keys, versions before) ─► batch applied ─► wait
//!                                   │ readers see the before versions      │
//!                                   └──────────── release(keys) ◄──────────┘
//! ```
//!
//! The overlay lives in memory only: after a crash the commit is simply visible (it is
//! in the log, and the subscriber that was being waited for gets it from there). Two
//! commits never hold the same key, because each holds the key's row lock.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::engine::{ByteRange, KvIter};
use crate::error::StoreError;

/// Raw row keys held, with the version readers see meanwhile.
#[derive(Default)]
pub(crate) struct HeldRows {
    rows: RwLock<BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Number of keys held: lets reads skip the lock when nothing is held.
    len: AtomicUsize,
}

impl HeldRows {
    /// Holds `keys` with the versions readers keep seeing.
    pub(crate) fn hold(&self, versions: Vec<HeldVersion>) {
        let mut rows = self.rows.write();
        for (k, v) in versions {
            rows.insert(k, v);
        }
        self.len.store(rows.len(), Ordering::Release);
    }

    /// Lets readers see the engine's versions of `keys` again.
    pub(crate) fn release<'a>(&self, keys: impl IntoIterator<Item = &'a Vec<u8>>) {
        let mut rows = self.rows.write();
        for k in keys {
            rows.remove(k);
        }
        self.len.store(rows.len(), Ordering::Release);
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys held now.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// The version readers see of `key`, when it is held.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        if self.is_empty() {
            return None;
        }
        self.rows.read().get(key).cloned()
    }

    /// `iter` (the engine's scan of `range`) with held keys replaced by the versions
    /// readers see: a held key's engine version is dropped, its held version (if any)
    /// is merged in at its place in key order.
    pub(crate) fn overlay(&self, range: &ByteRange, reverse: bool, iter: KvIter) -> KvIter {
        if self.is_empty() {
            return iter;
        }
        let bounds = (as_ref(&range.0), as_ref(&range.1));
        let held: Vec<HeldVersion> = self
            .rows
            .read()
            .range::<[u8], _>(bounds)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if held.is_empty() {
            return iter;
        }
        let mut held = held;
        if reverse {
            held.reverse();
        }
        Box::new(Overlay {
            engine: iter.peekable(),
            held: held.into_iter().peekable(),
            reverse,
        })
    }
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(v) => Bound::Included(v.as_slice()),
        Bound::Excluded(v) => Bound::Excluded(v.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

type Kv = Result<(Vec<u8>, Vec<u8>), StoreError>;

/// A held key and the version readers see (`None`: no row).
type HeldVersion = (Vec<u8>, Option<Vec<u8>>);

struct Overlay {
    engine: std::iter::Peekable<KvIter>,
    held: std::iter::Peekable<std::vec::IntoIter<HeldVersion>>,
    reverse: bool,
}

impl Overlay {
    /// Whether `a` comes before `b` in this scan's direction.
    fn before(&self, a: &[u8], b: &[u8]) -> bool {
        if self.reverse {
            a > b
        } else {
            a < b
        }
    }
}

impl Iterator for Overlay {
    type Item = Kv;

    fn next(&mut self) -> Option<Kv> {
        loop {
            let engine_key = match self.engine.peek() {
                Some(Ok((k, _))) => Some(k.clone()),
                Some(Err(_)) => return self.engine.next(),
                None => None,
            };
            let held_key = self.held.peek().map(|(k, _)| k.clone());
            match (engine_key, held_key) {
                (None, None) => return None,
                (Some(_), None) => return self.engine.next(),
                (Some(e), Some(h)) if self.before(&e, &h) => return self.engine.next(),
                (e, Some(h)) => {
                    if e.as_deref() == Some(h.as_slice()) {
                        // The engine's version of a held key is not visible yet.
                        self.engine.next();
                    }
                    let (k, v) = self.held.next()?;
                    if let Some(v) = v {
                        return Some(Ok((k, v)));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(rows: &[(&[u8], &[u8])], reverse: bool) -> KvIter {
        let mut v: Vec<Kv> = rows
            .iter()
            .map(|(k, v)| Ok((k.to_vec(), v.to_vec())))
            .collect();
        if reverse {
            v.reverse();
        }
        Box::new(v.into_iter())
    }

    fn keys(iter: KvIter) -> Vec<(Vec<u8>, Vec<u8>)> {
        iter.map(|kv| kv.unwrap()).collect()
    }

    fn all() -> ByteRange {
        (Bound::Unbounded, Bound::Unbounded)
    }

    #[test]
    fn held_versions_replace_insert_and_hide_in_key_order() {
        let h = HeldRows::default();
        // b was updated (readers keep "b0"), c inserted (readers see nothing),
        // d deleted (readers keep "d0").
        h.hold(vec![
            (b"b".to_vec(), Some(b"b0".to_vec())),
            (b"c".to_vec(), None),
            (b"d".to_vec(), Some(b"d0".to_vec())),
        ]);
        let rows: &[(&[u8], &[u8])] = &[(b"a", b"a1"), (b"b", b"b1"), (b"c", b"c1"), (b"e", b"e1")];
        let want: Vec<(Vec<u8>, Vec<u8>)> = [("a", "a1"), ("b", "b0"), ("d", "d0"), ("e", "e1")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(keys(h.overlay(&all(), false, engine(rows, false))), want);
        let mut rev = want.clone();
        rev.reverse();
        assert_eq!(keys(h.overlay(&all(), true, engine(rows, true))), rev);
        assert_eq!(h.get(b"c"), Some(None));
        assert_eq!(h.get(b"a"), None);

        h.release(&[b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]);
        assert_eq!(keys(h.overlay(&all(), false, engine(rows, false))).len(), 4);
        assert_eq!(h.get(b"b"), None);
    }

    #[test]
    fn held_keys_outside_the_range_are_ignored() {
        let h = HeldRows::default();
        h.hold(vec![(b"z".to_vec(), Some(b"z0".to_vec()))]);
        let range = (
            Bound::Included(b"a".to_vec()),
            Bound::Excluded(b"m".to_vec()),
        );
        let rows: &[(&[u8], &[u8])] = &[(b"a", b"a1")];
        assert_eq!(keys(h.overlay(&range, false, engine(rows, false))).len(), 1);
    }
}
