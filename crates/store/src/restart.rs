//! Where the last machine restart left this node's own commits.
//!
//! A flush writes a commit ahead of its sync and return-service senders may ship it in
//! between (docs/stream.md, "Shipping before the sync"), so a crash of the machine can
//! lose commits a receiver already holds. The store keeps, from the first open after
//! such a restart, the node's last own seq at that open and which receivers have since
//! been checked against it: a receiver whose first answer holds more of this node's
//! origin than that seq holds commits this node lost, and streaming to it again would
//! hand it new commits under the seqs it already has — which it would skip as
//! duplicates. Kept under [`crate::layout::RESTART_KEY`] until the next machine
//! restart replaces it, so neither a restart of the process nor a receiver that was
//! stopped meanwhile gets past the check.

use std::collections::{BTreeMap, BTreeSet};

use parking_lot::Mutex;

use crate::engine::{KvEngine, WriteBatch};
use crate::error::StoreError;
use crate::layout;

/// The last machine restart's point (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartPoint {
    /// This node's last own seq when the store opened after the restart: commits of
    /// its origin above it that a receiver holds were lost here.
    pub seq: u64,
    /// Whether the node has taken writes of its own since (its restart fence lifted).
    pub lifted: bool,
    /// Receivers (store names) whose first answer after the restart held no more than
    /// `seq` of this node's origin: everything they get from here on is new to them.
    pub checked: BTreeSet<String>,
    /// Receivers found holding commits this node lost, by store name — at this restart
    /// or an earlier one: a later restart does not clear them, only a new store under
    /// that name (another receiver node id) does.
    pub diverged: BTreeMap<String, Diverged>,
}

/// A receiver found holding commits of this node's that it lost in a machine restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Diverged {
    /// The receiver's node id then: a store rebuilt under the same name has another.
    pub node: u64,
    /// The highest seq of this node's origin it held.
    pub holds: u64,
    /// This node's last own seq at that restart.
    pub seq: u64,
}

/// What [`crate::Database::check_receiver_after_restart`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartCheck {
    /// Stream to it: it holds nothing this node lost.
    Admitted,
    /// Do not: it holds commits of this node's that this node lost.
    Diverged(Diverged),
}

/// A commit by its seq in its origin, and its origin's commit time. The seq names it:
/// a store never hands one out twice, not even after losing commits to a machine crash
/// or a salvage (`crate::db::SeqReservation`). The time is a second tell only for a
/// store whose directory was put back from an older copy, which took back the seqs
/// reserved since — a case no local record can see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldCommit {
    pub seq: u64,
    pub commit_micros: i64,
}

/// The commits of one origin a log holds past some seq, in seq order
/// ([`crate::Database::commits_after`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitsAfter {
    pub commits: Vec<HeldCommit>,
    /// Whether that is all of them: false when the log was released past some of
    /// them, or there were more than asked for.
    pub complete: bool,
}

/// What a receiver showed of this node's commits past the restart point, and this
/// node's own commits there, for [`crate::Database::check_receiver_after_restart`]:
/// a receiver that holds more than the point may hold only commits this node made
/// since (it got them through a propagator before this node's own stream came up).
#[derive(Clone, Debug, Default)]
pub struct RestartEvidence {
    /// The receiver's commits of this node's origin past the point (`None`: it did
    /// not answer the probe).
    pub held: Option<CommitsAfter>,
    /// This node's own commits past the point, each with whether the stream to this
    /// receiver carries it.
    pub own: Vec<(HeldCommit, bool)>,
    /// Whether `own` is all of this node's commits past the point.
    pub own_complete: bool,
}

impl RestartEvidence {
    /// Whether a receiver holding this node's origin up to `holds` (above `point`)
    /// holds only commits this node has, and will miss none this stream carries: every
    /// commit it holds past the point is this node's own under that seq (same commit
    /// time), and every commit of this node's up to `holds` that the stream carries,
    /// it holds. Anything it cannot show, or this node cannot, counts against it.
    pub fn holds_only_commits_made_since(&self, point: u64, holds: u64) -> bool {
        let Some(held) = self.held.as_ref().filter(|h| h.complete) else {
            return false;
        };
        if !self.own_complete {
            return false;
        }
        let own: BTreeMap<u64, (i64, bool)> = self
            .own
            .iter()
            .map(|(c, carried)| (c.seq, (c.commit_micros, *carried)))
            .collect();
        let theirs: BTreeMap<u64, i64> = held
            .commits
            .iter()
            .filter(|c| c.seq > point)
            .map(|c| (c.seq, c.commit_micros))
            .collect();
        let all_ours = theirs
            .iter()
            .all(|(seq, micros)| own.get(seq).is_some_and(|(m, _)| m == micros));
        let none_missed = own
            .iter()
            .filter(|(seq, (_, carried))| **seq > point && **seq <= holds && *carried)
            .all(|(seq, _)| theirs.contains_key(seq));
        // Its high-water itself must be a seq this node has given out.
        let reached = own.keys().next_back().is_some_and(|last| *last >= holds);
        all_ours && none_missed && reached
    }
}

impl RestartPoint {
    /// A new restart's point at `seq`: what diverged before stays diverged.
    pub(crate) fn after(previous: Option<&RestartPoint>, seq: u64) -> RestartPoint {
        RestartPoint {
            seq,
            diverged: previous.map(|p| p.diverged.clone()).unwrap_or_default(),
            ..RestartPoint::default()
        }
    }

    /// `[seq u64 BE][lifted u8][checked count u16 BE]` then per checked receiver
    /// `[name]`, then `[diverged count u16 BE]` and per diverged receiver `[name][node
    /// u64 BE][holds u64 BE][seq u64 BE]`; a name is `[length u16 BE][UTF-8 bytes]`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(13 + self.checked.len() * 8);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.push(u8::from(self.lifted));
        out.extend_from_slice(&count(self.checked.len()).to_be_bytes());
        for receiver in &self.checked {
            encode_name(&mut out, receiver);
        }
        encode_diverged(&mut out, &self.diverged);
        out
    }

    pub(crate) fn decode(key: &[u8], v: &[u8]) -> Result<Self, StoreError> {
        let mut r = Reader {
            key,
            rest: v,
            what: "restart point",
        };
        let seq = r.u64("its seq")?;
        let lifted = match r.take(1, "its lifted flag")?[0] {
            0 => false,
            1 => true,
            _ => return Err(r.bad("its lifted flag is not 0 or 1")),
        };
        let mut checked = BTreeSet::new();
        for _ in 0..r.u16("the count of checked receivers")? {
            checked.insert(r.name()?);
        }
        let diverged = r.diverged()?;
        r.end()?;
        Ok(RestartPoint {
            seq,
            lifted,
            checked,
            diverged,
        })
    }
}

/// Receivers found holding more of this node's origin than it had committed, with no
/// machine restart to account for it ([`crate::Database::check_receiver_ahead`]), kept
/// under [`crate::layout::AHEAD_KEY`]: `[count u16 BE]` then per receiver as a restart
/// point's diverged receivers. `seq` is this node's last own seq when it was found.
pub(crate) fn encode_ahead(ahead: &BTreeMap<String, Diverged>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_diverged(&mut out, ahead);
    out
}

pub(crate) fn decode_ahead(key: &[u8], v: &[u8]) -> Result<BTreeMap<String, Diverged>, StoreError> {
    let mut r = Reader {
        key,
        rest: v,
        what: "receivers ahead",
    };
    let ahead = r.diverged()?;
    r.end()?;
    Ok(ahead)
}

fn count(n: usize) -> u16 {
    u16::try_from(n).expect("fewer receivers than 65536")
}

/// `[length u16 BE][UTF-8 bytes]`.
fn encode_name(out: &mut Vec<u8>, name: &str) {
    let len = u16::try_from(name.len()).expect("store names are short");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// `[count u16 BE]` and per receiver `[name][node u64 BE][holds u64 BE][seq u64 BE]`.
fn encode_diverged(out: &mut Vec<u8>, diverged: &BTreeMap<String, Diverged>) {
    out.extend_from_slice(&count(diverged.len()).to_be_bytes());
    for (receiver, d) in diverged {
        encode_name(out, receiver);
        for n in [d.node, d.holds, d.seq] {
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

/// Reads a restart point's (or the receivers ahead's) fields, naming what is cut
/// short.
struct Reader<'a> {
    key: &'a [u8],
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn bad(&self, what: &str) -> StoreError {
        StoreError::corrupt(self.key, format!("{}: {what}", self.what))
    }

    fn end(&self) -> Result<(), StoreError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.bad("bytes after its end"))
        }
    }

    fn diverged(&mut self) -> Result<BTreeMap<String, Diverged>, StoreError> {
        let mut diverged = BTreeMap::new();
        for _ in 0..self.u16("the count of diverged receivers")? {
            let name = self.name()?;
            let d = Diverged {
                node: self.u64("a diverged receiver's node id")?,
                holds: self.u64("a diverged receiver's seq")?,
                seq: self.u64("a diverged receiver's restart seq")?,
            };
            diverged.insert(name, d);
        }
        Ok(diverged)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], StoreError> {
        if self.rest.len() < n {
            return Err(self.bad(&format!("ends inside {what}")));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn u16(&mut self, what: &str) -> Result<u16, StoreError> {
        Ok(u16::from_be_bytes(
            self.take(2, what)?.try_into().expect("2 bytes"),
        ))
    }

    fn u64(&mut self, what: &str) -> Result<u64, StoreError> {
        Ok(u64::from_be_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    fn name(&mut self) -> Result<String, StoreError> {
        let len = self.u16("a receiver's name length")? as usize;
        let bytes = self.take(len, "a receiver's name")?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|_| self.bad("a receiver's name is not UTF-8"))
    }
}

/// The restart fence's state: whether the machine restarted before this open, the
/// restart point and the receivers checked against it, and the receivers found holding
/// more of this node's origin than it has. Each verdict that changes what is recorded
/// is written through to the engine and flushed before it counts.
pub(crate) struct RestartFence {
    machine_restarted: bool,
    /// Written through to [`crate::layout::RESTART_KEY`].
    point: Mutex<Option<RestartPoint>>,
    /// By receiver store name; written through to [`crate::layout::AHEAD_KEY`].
    ahead: Mutex<BTreeMap<String, Diverged>>,
}

impl RestartFence {
    /// The fence as an open finds it.
    pub(crate) fn new(
        machine_restarted: bool,
        point: Option<RestartPoint>,
        ahead: BTreeMap<String, Diverged>,
    ) -> Self {
        Self {
            machine_restarted,
            point: Mutex::new(point),
            ahead: Mutex::new(ahead),
        }
    }

    /// See [`crate::Database::machine_restarted`].
    pub(crate) fn machine_restarted(&self) -> bool {
        self.machine_restarted
    }

    /// See [`crate::Database::restart_point`].
    pub(crate) fn point(&self) -> Option<RestartPoint> {
        self.point.lock().clone()
    }

    /// See [`crate::Database::restart_fence_pending`].
    pub(crate) fn pending(&self) -> bool {
        self.point.lock().as_ref().is_some_and(|p| !p.lifted)
    }

    /// See [`crate::Database::lift_restart_fence`].
    pub(crate) fn lift(&self, engine: &dyn KvEngine) -> Result<(), StoreError> {
        self.update_point(engine, |p| {
            let changed = !p.lifted;
            p.lifted = true;
            changed
        })
    }

    /// See [`crate::Database::restart_check_pending`].
    pub(crate) fn check_pending(&self, receiver: &str) -> bool {
        self.point
            .lock()
            .as_ref()
            .is_some_and(|p| p.diverged.contains_key(receiver) || !p.checked.contains(receiver))
    }

    /// See [`crate::Database::check_receiver_after_restart`].
    pub(crate) fn check_after_restart(
        &self,
        engine: &dyn KvEngine,
        receiver: &str,
        node: u64,
        holds: u64,
        evidence: &RestartEvidence,
    ) -> Result<RestartCheck, StoreError> {
        let Some(point) = self.point() else {
            return Ok(RestartCheck::Admitted);
        };
        let rebuilt = match point.diverged.get(receiver) {
            Some(d) if d.node == node => return Ok(RestartCheck::Diverged(*d)),
            Some(_) => true,
            None => false,
        };
        if !rebuilt && point.checked.contains(receiver) {
            return Ok(RestartCheck::Admitted);
        }
        let verdict =
            if holds > point.seq && !evidence.holds_only_commits_made_since(point.seq, holds) {
                RestartCheck::Diverged(Diverged {
                    node,
                    holds,
                    seq: point.seq,
                })
            } else {
                RestartCheck::Admitted
            };
        self.update_point(engine, |p| {
            let cleared = p.diverged.remove(receiver).is_some();
            match verdict {
                RestartCheck::Admitted => p.checked.insert(receiver.to_string()) || cleared,
                RestartCheck::Diverged(d) => {
                    p.diverged.insert(receiver.to_string(), d);
                    true
                }
            }
        })?;
        Ok(verdict)
    }

    /// See [`crate::Database::check_receiver_ahead`]; `own` reads this node's last own
    /// seq, under the fence's lock of the receivers ahead.
    pub(crate) fn check_ahead(
        &self,
        engine: &dyn KvEngine,
        receiver: &str,
        node: u64,
        holds: u64,
        own: impl FnOnce() -> u64,
    ) -> Result<RestartCheck, StoreError> {
        let mut ahead = self.ahead.lock();
        let known = ahead.get(receiver).copied();
        if let Some(d) = known.filter(|d| d.node == node) {
            return Ok(RestartCheck::Diverged(d));
        }
        let own = own();
        let verdict = if holds > own {
            RestartCheck::Diverged(Diverged {
                node,
                holds,
                seq: own,
            })
        } else {
            RestartCheck::Admitted
        };
        if known.is_none() && verdict == RestartCheck::Admitted {
            return Ok(verdict);
        }
        Self::record_ahead(engine, &mut ahead, receiver, verdict)?;
        Ok(verdict)
    }

    /// See [`crate::Database::mark_receiver_diverged`]; `own` as for
    /// [`RestartFence::check_ahead`].
    pub(crate) fn mark_diverged(
        &self,
        engine: &dyn KvEngine,
        receiver: &str,
        node: u64,
        holds: u64,
        own: impl FnOnce() -> u64,
    ) -> Result<Diverged, StoreError> {
        let mut ahead = self.ahead.lock();
        let d = Diverged {
            node,
            holds,
            seq: own(),
        };
        Self::record_ahead(engine, &mut ahead, receiver, RestartCheck::Diverged(d))?;
        Ok(d)
    }

    /// Writes `receiver`'s verdict into the receivers ahead, through to the store.
    fn record_ahead(
        engine: &dyn KvEngine,
        ahead: &mut BTreeMap<String, Diverged>,
        receiver: &str,
        verdict: RestartCheck,
    ) -> Result<(), StoreError> {
        let mut next = ahead.clone();
        match verdict {
            RestartCheck::Diverged(d) => next.insert(receiver.to_string(), d),
            RestartCheck::Admitted => next.remove(receiver),
        };
        let mut batch = WriteBatch::new();
        if next.is_empty() {
            batch.delete(layout::AHEAD_KEY.to_vec());
        } else {
            batch.put(layout::AHEAD_KEY.to_vec(), encode_ahead(&next));
        }
        engine.apply(batch)?;
        engine.flush()?;
        *ahead = next;
        Ok(())
    }

    /// Changes the restart point (if there is one) and writes it through, durably,
    /// when `change` says it changed anything.
    fn update_point(
        &self,
        engine: &dyn KvEngine,
        change: impl FnOnce(&mut RestartPoint) -> bool,
    ) -> Result<(), StoreError> {
        let mut guard = self.point.lock();
        let Some(point) = guard.as_mut() else {
            return Ok(());
        };
        let mut next = point.clone();
        if !change(&mut next) {
            return Ok(());
        }
        let mut batch = WriteBatch::new();
        batch.put(layout::RESTART_KEY.to_vec(), next.encode());
        engine.apply(batch)?;
        engine.flush()?;
        *point = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{
        layout, CommitsAfter, Diverged, HeldCommit, RestartCheck, RestartEvidence, RestartFence,
        RestartPoint,
    };
    use crate::engine::KvEngine;
    use std::collections::BTreeMap;

    fn c(seq: u64, commit_micros: i64) -> HeldCommit {
        HeldCommit { seq, commit_micros }
    }

    /// The restart point is seq 10; this node has made 11..=13 since (times 111..113),
    /// of which the stream carries 11 and 13.
    fn evidence(held: &[HeldCommit], complete: bool) -> RestartEvidence {
        RestartEvidence {
            held: Some(CommitsAfter {
                commits: held.to_vec(),
                complete,
            }),
            own: vec![(c(11, 111), true), (c(12, 112), false), (c(13, 113), true)],
            own_complete: true,
        }
    }

    #[test]
    fn a_receiver_holding_only_commits_made_since_the_restart_passes() {
        // It got 11..=13 through a propagator (12 too: that route carries it).
        let all = [c(11, 111), c(12, 112), c(13, 113)];
        assert!(evidence(&all, true).holds_only_commits_made_since(10, 13));
        // The stream does not carry 12; not holding it is fine.
        let carried = [c(11, 111), c(13, 113)];
        assert!(evidence(&carried, true).holds_only_commits_made_since(10, 13));
        assert!(evidence(&carried[..1], true).holds_only_commits_made_since(10, 11));
    }

    #[test]
    fn a_receiver_holding_a_lost_commit_or_missing_a_carried_one_does_not() {
        // 11 is the commit this node lost: same seq, another time.
        let lost = [c(11, 99), c(12, 112), c(13, 113)];
        assert!(!evidence(&lost, true).holds_only_commits_made_since(10, 13));
        // It would skip 11, which its stream carries, as a duplicate.
        let skipped = [c(12, 112), c(13, 113)];
        assert!(!evidence(&skipped, true).holds_only_commits_made_since(10, 13));
        // It holds a seq this node has not given out yet.
        let ahead = [c(11, 111), c(12, 112), c(13, 113), c(14, 114)];
        assert!(!evidence(&ahead, true).holds_only_commits_made_since(10, 14));
        // Its high-water is past this node's seqs although it lists nothing there.
        assert!(!evidence(&[], true).holds_only_commits_made_since(10, 14));
    }

    #[test]
    fn what_either_side_cannot_show_counts_against_the_receiver() {
        let all = [c(11, 111), c(12, 112), c(13, 113)];
        assert!(!evidence(&all, false).holds_only_commits_made_since(10, 13));
        let mut own_cut = evidence(&all, true);
        own_cut.own_complete = false;
        assert!(!own_cut.holds_only_commits_made_since(10, 13));
        let unanswered = RestartEvidence {
            held: None,
            ..evidence(&all, true)
        };
        assert!(!unanswered.holds_only_commits_made_since(10, 13));
        assert!(!RestartEvidence::default().holds_only_commits_made_since(10, 11));
    }

    #[test]
    fn a_restart_point_reads_back_and_refuses_cut_or_trailing_bytes() {
        let mut p = RestartPoint {
            seq: 7,
            lifted: true,
            ..RestartPoint::default()
        };
        p.checked.insert("ds2".into());
        p.checked.insert("ds3_long_name".into());
        p.diverged.insert(
            "ds4".into(),
            Diverged {
                node: 44,
                holds: 9,
                seq: 7,
            },
        );
        let bytes = p.encode();
        assert_eq!(RestartPoint::decode(b"Mrestart", &bytes).unwrap(), p);
        let next = RestartPoint::after(Some(&p), 12);
        assert_eq!((next.seq, next.lifted, next.checked.len()), (12, false, 0));
        assert_eq!(next.diverged, p.diverged, "what diverged stays diverged");
        for cut in [0, 5, 9, 12, bytes.len() - 1] {
            let e = RestartPoint::decode(b"Mrestart", &bytes[..cut]).unwrap_err();
            assert!(e.to_string().contains("restart point: ends inside"), "{e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        let e = RestartPoint::decode(b"Mrestart", &longer).unwrap_err();
        assert!(e.to_string().contains("bytes after its end"), "{e}");
        let mut flag = bytes;
        flag[8] = 2;
        let e = RestartPoint::decode(b"Mrestart", &flag).unwrap_err();
        assert!(e.to_string().contains("lifted flag"), "{e}");
    }

    #[test]
    fn the_fence_writes_a_verdict_through_only_when_it_changes_what_is_recorded() {
        use crate::engine::MemEngine;
        let engine = MemEngine::new();
        let stored = |key: &[u8]| engine.get(key).unwrap();
        let fence = RestartFence::new(false, None, BTreeMap::new());
        // No restart point: every receiver is admitted after a restart, nothing written.
        let none = RestartEvidence::default();
        assert_eq!(
            fence
                .check_after_restart(&engine, "s1", 2, 99, &none)
                .unwrap(),
            RestartCheck::Admitted
        );
        assert!(!fence.check_pending("s1"));
        // A receiver holding no more than this node has: admitted, nothing recorded.
        assert_eq!(
            fence.check_ahead(&engine, "s1", 2, 10, || 10).unwrap(),
            RestartCheck::Admitted
        );
        assert_eq!(stored(layout::AHEAD_KEY), None);
        // One holding more: diverged, written through, and so on every later check,
        // even once this node's seqs pass what it holds.
        let ahead = RestartCheck::Diverged(Diverged {
            node: 2,
            holds: 12,
            seq: 10,
        });
        assert_eq!(
            fence.check_ahead(&engine, "s1", 2, 12, || 10).unwrap(),
            ahead
        );
        let written = stored(layout::AHEAD_KEY).expect("recorded");
        assert_eq!(
            fence.check_ahead(&engine, "s1", 2, 12, || 50).unwrap(),
            ahead
        );
        assert_eq!(stored(layout::AHEAD_KEY), Some(written));
        // A rebuilt receiver (another node id under the name) is judged afresh.
        assert_eq!(
            fence.check_ahead(&engine, "s1", 3, 0, || 50).unwrap(),
            RestartCheck::Admitted
        );
        assert_eq!(stored(layout::AHEAD_KEY), None, "cleared");
    }

    #[test]
    fn after_a_machine_restart_a_receiver_is_checked_once_against_the_point() {
        use crate::engine::MemEngine;
        let engine = MemEngine::new();
        let point = RestartPoint::after(None, 20);
        let fence = RestartFence::new(true, Some(point), BTreeMap::new());
        assert!(fence.machine_restarted() && fence.pending());
        assert!(fence.check_pending("s1"));
        let none = RestartEvidence::default();
        // Holding no more than the point: checked, durably.
        assert_eq!(
            fence
                .check_after_restart(&engine, "s1", 2, 20, &none)
                .unwrap(),
            RestartCheck::Admitted
        );
        assert!(!fence.check_pending("s1"));
        let stored = engine.get(layout::RESTART_KEY).unwrap().expect("written");
        let back = RestartPoint::decode(layout::RESTART_KEY, &stored).unwrap();
        assert!(back.checked.contains("s1"));
        // Checked: its later answers (commits made since) pass without a write.
        assert_eq!(
            fence
                .check_after_restart(&engine, "s1", 2, 25, &none)
                .unwrap(),
            RestartCheck::Admitted
        );
        // Another holding more than the point, with no evidence: diverged.
        assert!(matches!(
            fence
                .check_after_restart(&engine, "s2", 4, 21, &none)
                .unwrap(),
            RestartCheck::Diverged(Diverged {
                holds: 21,
                seq: 20,
                ..
            })
        ));
        assert!(fence.check_pending("s2"));
        // Lifting the fence is recorded once.
        fence.lift(&engine).unwrap();
        assert!(!fence.pending());
    }
}
