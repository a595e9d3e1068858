//! Checks a history of client writes against what survived: the promises a drill
//! (`hawser drill`) or a chaos run verifies.
//!
//! ```text
//!  every write a client sent: its key (written once, never again), when it was sent
//!  and answered (ms since the run began), and the answer — acknowledged (by which
//!  origin, under which epoch, promised by a return service or not), refused (certainly
//!  not committed), or unknown (the answer was lost)
//!      + the keys present at the end (on the master, every copy compared equal)
//!  ─► check (pure):
//!      lost promises    acknowledged by RETURN RECEIPT / TWOSAFE, absent at the end
//!      lost async       acknowledged without a return service (or after it timed
//!                       out), absent: a failover may set these aside — counted, not
//!                       a broken promise
//!      refused, present a write the client was told did not commit, committed
//!      two masters      an acknowledgement by one origin under epoch e for a write sent
//!                       after another origin had acknowledged under a later epoch (or
//!                       two origins acknowledging under one epoch): two nodes took
//!                       writes of the element at once
//!      window           the longest time no write was acknowledged
//! ```
//!
//! The two-masters check is sound with client clocks alone: a commit happens between
//! its write being sent and its answer arriving, so a write sent after the newer
//! master's first answer arrived was committed after that master had committed.

use std::collections::{BTreeMap, HashSet};

/// How a write ended, as its client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged by `origin` (its node id) under `epoch`; `promised` when a return
    /// service (RECEIPT, TWOSAFE) acknowledged it too, so that no failover may lose it.
    Acked {
        origin: u64,
        epoch: u64,
        promised: bool,
    },
    /// Refused with an error proving it did not commit.
    Refused,
    /// The answer was lost: it may or may not have committed.
    Unknown,
}

/// One write of one client: a key inserted once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub writer: u32,
    pub key: i64,
    /// When it was sent and when its answer came, in ms since the run began.
    pub sent_ms: u64,
    pub done_ms: u64,
    pub outcome: Outcome,
}

/// Two origins that acknowledged writes of one element at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The write acknowledged by the older master.
    pub key: i64,
    pub origin: u64,
    pub epoch: u64,
    pub sent_ms: u64,
    /// The newer master, and when its first acknowledgement arrived.
    pub newer_origin: u64,
    pub newer_epoch: u64,
    pub newer_first_ms: u64,
}

/// What a history shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    pub writes: usize,
    pub acked: usize,
    /// Acknowledged with a return service's promise.
    pub promised: usize,
    pub refused: usize,
    pub unknown: usize,
    /// Promised and absent: broken promises.
    pub lost_promised: Vec<i64>,
    /// Acknowledged without a promise and absent (set aside by a failover).
    pub lost_async: Vec<i64>,
    /// Refused, yet present.
    pub refused_present: Vec<i64>,
    pub overlaps: Vec<Overlap>,
    /// The longest time without an acknowledgement, and when it began (ms since the
    /// run began): from the first write sent to the first answer, between two answers,
    /// or from the last answer to the end.
    pub window_ms: u64,
    pub window_from_ms: u64,
    /// The origins that acknowledged, in the order their first acknowledgements came,
    /// with their epochs.
    pub masters: Vec<(u64, u64)>,
}

impl Verdict {
    /// Whether every promise held: nothing promised lost, nothing refused committed,
    /// never two masters.
    pub fn held(&self) -> bool {
        self.lost_promised.is_empty() && self.refused_present.is_empty() && self.overlaps.is_empty()
    }
}

/// Checks `ops` against the keys `present` at the end; `end_ms` is when the run ended.
pub fn check(ops: &[Op], present: &HashSet<i64>, end_ms: u64) -> Verdict {
    let mut v = Verdict {
        writes: ops.len(),
        ..Verdict::default()
    };
    // The first acknowledgement of each (epoch, origin).
    let mut first: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    let mut answers: Vec<u64> = Vec::new();
    for op in ops {
        match op.outcome {
            Outcome::Acked {
                origin,
                epoch,
                promised,
            } => {
                v.acked += 1;
                answers.push(op.done_ms);
                let f = first.entry((epoch, origin)).or_insert(op.done_ms);
                *f = (*f).min(op.done_ms);
                if promised {
                    v.promised += 1;
                }
                if !present.contains(&op.key) {
                    if promised {
                        v.lost_promised.push(op.key);
                    } else {
                        v.lost_async.push(op.key);
                    }
                }
            }
            Outcome::Refused => {
                v.refused += 1;
                if present.contains(&op.key) {
                    v.refused_present.push(op.key);
                }
            }
            Outcome::Unknown => v.unknown += 1,
        }
    }
    // For each acknowledgement, the earliest first acknowledgement by a newer master:
    // another origin under a later epoch, or under the same epoch one that answered
    // before this one's origin first did (two origins under one epoch: the second is
    // the intruder).
    for op in ops {
        let Outcome::Acked { origin, epoch, .. } = op.outcome else {
            continue;
        };
        let mine = first[&(epoch, origin)];
        let newer = first
            .range((epoch, 0)..)
            .filter(|((e, o), at)| *o != origin && (*e > epoch || (**at, *o) < (mine, origin)))
            .min_by_key(|(_, at)| **at);
        if let Some((&(newer_epoch, newer_origin), &at)) = newer {
            if op.sent_ms > at {
                v.overlaps.push(Overlap {
                    key: op.key,
                    origin,
                    epoch,
                    sent_ms: op.sent_ms,
                    newer_origin,
                    newer_epoch,
                    newer_first_ms: at,
                });
            }
        }
    }
    let mut masters: Vec<((u64, u64), u64)> = first.into_iter().collect();
    masters.sort_by_key(|(_, at)| *at);
    v.masters = masters.into_iter().map(|((e, o), _)| (o, e)).collect();
    // The window.
    answers.sort_unstable();
    let start = ops.iter().map(|o| o.sent_ms).min().unwrap_or(0);
    let mut last = start;
    for at in answers.iter().copied().chain([end_ms.max(last)]) {
        if at.saturating_sub(last) > v.window_ms {
            v.window_ms = at - last;
            v.window_from_ms = last;
        }
        last = last.max(at);
    }
    v.lost_promised.sort_unstable();
    v.lost_async.sort_unstable();
    v.refused_present.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked(key: i64, sent: u64, done: u64, origin: u64, epoch: u64, promised: bool) -> Op {
        Op {
            writer: 0,
            key,
            sent_ms: sent,
            done_ms: done,
            outcome: Outcome::Acked {
                origin,
                epoch,
                promised,
            },
        }
    }

    fn op(key: i64, sent: u64, done: u64, outcome: Outcome) -> Op {
        Op {
            writer: 1,
            key,
            sent_ms: sent,
            done_ms: done,
            outcome,
        }
    }

    /// A failover from origin 1 (epoch 1) to origin 2 (epoch 2) with a 900 ms gap.
    fn failover() -> Vec<Op> {
        vec![
            acked(1, 0, 5, 1, 1, true),
            acked(2, 5, 10, 1, 1, true),
            acked(3, 10, 12, 1, 1, false),
            op(4, 12, 800, Outcome::Refused),
            op(5, 12, 400, Outcome::Unknown),
            acked(6, 800, 912, 2, 2, true),
            acked(7, 912, 920, 2, 2, true),
        ]
    }

    #[test]
    fn a_clean_failover_holds_every_promise_and_measures_its_window() {
        let present: HashSet<i64> = [1, 2, 3, 6, 7].into();
        let v = check(&failover(), &present, 950);
        assert!(v.held(), "{v:?}");
        assert_eq!((v.writes, v.acked, v.promised), (7, 5, 4));
        assert_eq!((v.refused, v.unknown), (1, 1));
        assert_eq!((v.window_ms, v.window_from_ms), (900, 12));
        assert_eq!(v.masters, [(1, 1), (2, 2)]);
        // The unknown write may be there or not.
        let with_unknown: HashSet<i64> = [1, 2, 3, 5, 6, 7].into();
        assert!(check(&failover(), &with_unknown, 950).held());
    }

    #[test]
    fn a_promised_write_missing_breaks_the_promise_an_async_one_is_counted() {
        let v = check(&failover(), &[1, 3, 6, 7].into(), 950);
        assert_eq!(v.lost_promised, [2]);
        assert!(!v.held());
        let v = check(&failover(), &[1, 2, 6, 7].into(), 950);
        assert_eq!(v.lost_async, [3]);
        assert!(v.held());
    }

    #[test]
    fn a_refused_write_that_committed_is_caught() {
        let v = check(&failover(), &[1, 2, 3, 4, 6, 7].into(), 950);
        assert_eq!(v.refused_present, [4]);
        assert!(!v.held());
    }

    #[test]
    fn the_old_master_acknowledging_after_the_new_one_is_two_masters() {
        let mut ops = failover();
        // Sent after origin 2's first answer (912), acknowledged by origin 1 at epoch 1.
        ops.push(acked(8, 915, 930, 1, 1, false));
        let present: HashSet<i64> = [1, 2, 3, 6, 7, 8].into();
        let v = check(&ops, &present, 950);
        assert_eq!(v.overlaps.len(), 1, "{v:?}");
        let o = &v.overlaps[0];
        assert_eq!(
            (o.key, o.origin, o.newer_origin, o.newer_first_ms),
            (8, 1, 2, 912)
        );
        assert!(!v.held());
        // Sent before the new master's first answer arrived: it may have committed
        // before, so it proves nothing.
        let mut ops = failover();
        ops.push(acked(8, 905, 930, 1, 1, false));
        assert!(check(&ops, &present, 950).overlaps.is_empty());
    }

    #[test]
    fn a_switch_back_is_not_two_masters_but_two_origins_under_one_epoch_are() {
        let mut ops = failover();
        ops.push(acked(8, 1000, 1010, 1, 3, true));
        ops.push(acked(9, 1010, 1020, 1, 3, true));
        let present: HashSet<i64> = [1, 2, 3, 6, 7, 8, 9].into();
        let v = check(&ops, &present, 1100);
        assert!(v.held(), "{v:?}");
        assert_eq!(v.masters, [(1, 1), (2, 2), (1, 3)]);
        // Origin 3 acknowledging under epoch 2 after origin 2 did.
        let mut ops = failover();
        ops.push(acked(8, 930, 940, 3, 2, true));
        let present: HashSet<i64> = [1, 2, 3, 6, 7, 8].into();
        let v = check(&ops, &present, 950);
        assert_eq!(v.overlaps.len(), 1, "{v:?}");
        assert_eq!((v.overlaps[0].origin, v.overlaps[0].newer_origin), (3, 2));
    }
}
