//! The sender's rules that depend on nothing but their inputs: how large a batch may
//! be, how long to wait before the next attempt, when a lazy stream lingers, when a
//! position or a "waiting" batch is due, from where its own commits are not yet
//! shipped, and how the acknowledged position moves.

use std::collections::BTreeMap;
use std::time::Duration;

use hawser_core::{Lsn, NodeId};

use crate::chunks;
use crate::error::StreamError;
use crate::link::SenderTuning;
use crate::pb;

/// An exponentially weighted mean giving each new sample 1/8 of the weight (the first
/// sample is taken whole): steady within a few percent after ~25 acks, and one slow
/// ack moves it by an eighth of the difference.
pub(super) fn smoothed(mean: u64, sample: u64) -> u64 {
    if mean == 0 {
        return sample.max(1);
    }
    let (m, s) = (mean as i128, sample as i128);
    (m + (s - m) / 8).max(1) as u64
}

/// The encoded bytes a batch of several records stays within, and the largest chunk of
/// a batch of one larger record: the tuning's batch size, or less when half the
/// receiver's message limit is less.
pub(super) fn batch_cap(max_batch_bytes: usize, max_message_bytes: u64) -> u64 {
    (max_batch_bytes.min(chunks::payload_budget(max_message_bytes))) as u64
}

/// The message limit a session keeps to: the lower of what this sender was told
/// (`ours`) and what the receiver says it reads (`theirs`, 0 when it does not say).
pub(super) fn message_limit(ours: u64, theirs: u64) -> u64 {
    match theirs {
        0 => ours,
        t => ours.min(t),
    }
}

/// How many of the `limit` records from some LSN on make at most `budget` bytes, at
/// least one: `bytes(n)` is the bytes of the first `n` (growing with `n`).
pub(super) fn count_within(limit: usize, budget: u64, bytes: impl Fn(usize) -> u64) -> usize {
    if limit <= 1 || bytes(limit) <= budget {
        return limit;
    }
    // The largest n in [1, limit) with bytes(n) <= budget, or 1.
    let (mut lo, mut hi) = (1, limit);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if bytes(mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// How a session failed, for the wait before the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// The receiver could not be reached or the connection broke: cheap to try again,
    /// and a restarting peer is back soon.
    Unreachable,
    /// The receiver refused the stream, or this node did (the log, a diverged receiver),
    /// or something it sent could not be read: the same attempt fails again until
    /// something changes.
    Refused,
}

impl Failure {
    pub(super) fn of(e: &StreamError) -> Self {
        use tonic::Code;
        match e {
            StreamError::Connect(_) | StreamError::PeerTimeout | StreamError::Closed => {
                Failure::Unreachable
            }
            StreamError::Rpc(status) => match status.code() {
                // A connection reset, a peer gone away or restarting.
                Code::Unavailable
                | Code::Unknown
                | Code::Cancelled
                | Code::Aborted
                | Code::DeadlineExceeded => Failure::Unreachable,
                // A message too large, one that does not decode, an unknown service.
                _ => Failure::Refused,
            },
            StreamError::Refused { .. }
            | StreamError::Protocol(_)
            | StreamError::LogReleased { .. }
            | StreamError::Diverged { .. }
            | StreamError::Ahead { .. }
            | StreamError::Reused { .. }
            | StreamError::GaveAgain { .. }
            | StreamError::Store(_)
            | StreamError::Codec(_) => Failure::Refused,
        }
    }
}

/// The wait before the next attempt after one that failed as `failure`, the last wait
/// having been `previous` (`None`: none since a session streamed): `backoff_min`, then
/// doubled at each failure up to the failure's ceiling — `reconnect_max` for a receiver
/// that could not be reached, `backoff_max` for a refusal. A longer wait left by
/// refusals drops to `reconnect_max` as soon as the receiver is found down: it is
/// restarting, and what it refused may be gone when it is back.
/// A drill's partition ([`hawser_core::isolation`]): no stream to or from peers while
pub(super) fn next_backoff(
    previous: Option<Duration>,
    failure: Failure,
    tuning: &SenderTuning,
) -> Duration {
    let ceiling = match failure {
        Failure::Unreachable => tuning.reconnect_max,
        Failure::Refused => tuning.backoff_max,
    }
    .max(tuning.backoff_min);
    match previous {
        None => tuning.backoff_min,
        Some(p) => (p * 2).clamp(tuning.backoff_min, ceiling),
    }
}

/// What a wake (a commit, or the poll) does to a session that is not shipping yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wake {
    /// Ship what the log holds now.
    Ship,
    /// Start lingering: ship when the linger's timer ends, or sooner once the log's
    /// last LSN reaches `until` (commits wake the sender only then).
    Linger { until: u64 },
    /// Already lingering, and still too few records: wait on.
    Wait,
}

/// What a commit's wake does: a lazy stream (no return service waits on it, a linger
/// set) whose log holds fewer than `linger_records` records past the cursor waits up
/// to `linger` for company rather than shipping each commit alone.
pub(super) fn on_wake(
    lingers: bool,
    lingering: bool,
    last_lsn: Lsn,
    cursor: Lsn,
    linger_records: usize,
) -> Wake {
    let shipped_through = cursor.0.saturating_sub(1);
    if !lingers || last_lsn.0.saturating_sub(shipped_through) >= linger_records as u64 {
        return Wake::Ship;
    }
    if lingering {
        Wake::Wait
    } else {
        Wake::Linger {
            until: shipped_through + linger_records as u64,
        }
    }
}

/// From which LSN this node's own commits may not go out yet, as
/// [`DurableFrom::At`], or that the read must be written to the log first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DurableFrom {
    At(Lsn),
    /// Non-durable commits past what is written: write the log ahead (no sync), then
    /// ship through what that wrote.
    WriteAhead,
}

/// How far this node's own commits may be shipped: once durable here (`flushed`) —
/// or, on a stream a return service waits on, once written (`ships_written`); with
/// non-durable commits once written, writing the log ahead first when the records
/// read (through `last_read`) go past it. A receiver must never hold a commit this
/// node could lose in a crash of its process: this node would give the lost commit's
/// seq to another transaction, and the receiver would skip that one.
pub(super) fn durable_from(
    durable_commits: bool,
    ships_written: bool,
    written: Lsn,
    flushed: Lsn,
    last_read: Lsn,
) -> DurableFrom {
    if !durable_commits {
        if last_read > written {
            DurableFrom::WriteAhead
        } else {
            DurableFrom::At(written.next())
        }
    } else if ships_written {
        DurableFrom::At(written.next())
    } else {
        DurableFrom::At(flushed.next())
    }
}

/// Which records to read from the log to top up what was read ahead: from `next` (the
/// LSN after what is held), as many as the log holds up to `last_lsn`, and no more
/// than `max_records` held in all. `None` when there is nothing to read or no room:
/// the log is not read then (LSNs are dense, so the count is exact).
pub(super) fn read_span(
    next: Lsn,
    last_lsn: Lsn,
    held: usize,
    max_records: usize,
) -> Option<(Lsn, usize)> {
    let room = max_records.saturating_sub(held);
    if last_lsn < next || room == 0 {
        return None;
    }
    let available = usize::try_from(last_lsn.0 - next.0 + 1).unwrap_or(usize::MAX);
    Some((next, available.min(room)))
}

/// The position a record-less batch says at the log's end, if one is due: the end of
/// log passed but not sent (`unsent`) at most every `position_every`; with claims
/// about relayed origins not sent yet, at most every poll and through what the
/// cursor passed even when nothing is unsent (another relay may wait for them).
pub(super) fn position_due(
    unsent: Option<Lsn>,
    cursor: Lsn,
    claims_unsent: bool,
    since_sent: Duration,
    tuning: &SenderTuning,
) -> Option<Lsn> {
    let every = if claims_unsent {
        tuning.poll_interval
    } else {
        tuning.position_every
    };
    let position = match unsent {
        None if claims_unsent => Some(Lsn(cursor.0.saturating_sub(1))),
        unsent => unsent,
    };
    position.filter(|_| since_sent >= every)
}

/// Whether a stream blocked at its cursor says so now (`Batch.waiting`, which the
/// receiver answers with its marks at once): when newly blocked, and at most every
/// poll after that.
pub(super) fn waiting_due(was_blocked: bool, since_sent: Duration, tuning: &SenderTuning) -> bool {
    !was_blocked || since_sent >= tuning.poll_interval
}

/// The LSN a session resumes after, moved by an ack through `through`: only when the
/// ack says everything through it is durable there (`durable == applied`). A receiver
/// no return service waits on acks applied first and durable after its next flush.
pub(super) fn resume_after(acked: Lsn, through: Lsn, ack: &pb::Ack) -> Lsn {
    if ack.durable == ack.applied {
        acked.max(through)
    } else {
        acked
    }
}

/// Raises `high_water` (what the receiver holds per origin) to `applied`: marks only
/// rise.
pub(super) fn raise_marks(high_water: &mut BTreeMap<NodeId, u64>, applied: &BTreeMap<NodeId, u64>) {
    for (o, s) in applied {
        let hw = high_water.entry(*o).or_insert(0);
        *hw = (*hw).max(*s);
    }
}

/// Whether an ack clears the last session's error: it moved the acknowledged position
/// past where earlier sessions broke, or there is nothing left to break at.
pub(super) fn clears_error(acked: Lsn, was_acked: Lsn, lag_records: u64) -> bool {
    acked > was_acked || lag_records == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_stay_within_the_tuning_and_half_the_receivers_limit() {
        let mib = 1024 * 1024;
        // The defaults: 1 MiB batches, well under half of 16 MiB.
        let t = SenderTuning::default();
        assert_eq!(
            batch_cap(t.max_batch_bytes, t.max_message_bytes as u64),
            mib
        );
        // A receiver that reads small messages gets small batches.
        assert_eq!(batch_cap(mib as usize, 64 * 1024), 32 * 1024);
        // The receiver's limit counts when it is the lower one, and only then.
        assert_eq!(message_limit(16 * mib, 4 * mib), 4 * mib);
        assert_eq!(message_limit(16 * mib, 64 * mib), 16 * mib);
        assert_eq!(message_limit(16 * mib, 0), 16 * mib);
    }

    #[test]
    fn a_read_takes_the_records_within_the_budget_and_at_least_one() {
        let sizes = [100u64, 200, 300, 400, 50_000, 10];
        let bytes = |n: usize| sizes[..n].iter().sum::<u64>();
        // All of them fit.
        assert_eq!(count_within(6, 1_000_000, bytes), 6);
        // The first three fit exactly, the fourth would pass the budget.
        assert_eq!(count_within(6, 600, bytes), 3);
        assert_eq!(count_within(6, 999, bytes), 3);
        assert_eq!(count_within(6, 1000, bytes), 4);
        // A record larger than the budget is read alone.
        assert_eq!(count_within(6, 50, bytes), 1);
        assert_eq!(count_within(2, 10, |n| [60_000, 5][..n].iter().sum()), 1);
        // The limit bounds as before.
        assert_eq!(count_within(2, 1_000_000, bytes), 2);
        assert_eq!(count_within(0, 10, bytes), 0);
        // Every budget gives the most records within it (checked against a scan).
        for budget in 0..1200 {
            let most = (1..=6).rev().find(|&n| bytes(n) <= budget).unwrap_or(1);
            assert_eq!(count_within(6, budget, bytes), most, "budget {budget}");
        }
    }

    #[test]
    fn a_receiver_found_down_is_tried_again_within_a_quarter_second_a_refusal_backs_off_to_5_s() {
        let t = SenderTuning::default();
        let ms = Duration::from_millis;
        let waits = |failures: &[Failure]| {
            let mut last = None;
            failures
                .iter()
                .map(|f| {
                    let w = next_backoff(last, *f, &t);
                    last = Some(w);
                    w
                })
                .collect::<Vec<_>>()
        };
        use Failure::{Refused, Unreachable};
        // A peer that is down: 50, 100, 200, then every 250 ms.
        assert_eq!(
            waits(&[Unreachable; 6]),
            [ms(50), ms(100), ms(200), ms(250), ms(250), ms(250)]
        );
        // A peer that refuses: doubling to 5 s.
        assert_eq!(
            waits(&[Refused; 9]),
            [
                ms(50),
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(3200),
                ms(5000),
                ms(5000)
            ]
        );
        // Refused for long, then found down (it restarts): back to 250 ms at once, and
        // a refusal after that grows from there.
        let mut w = waits(&[Refused; 8]);
        assert_eq!(w.last(), Some(&ms(5000)));
        w.push(next_backoff(w.last().copied(), Unreachable, &t));
        assert_eq!(w.last(), Some(&ms(250)));
        assert_eq!(next_backoff(Some(ms(250)), Refused, &t), ms(500));
        // Nothing since a session streamed: the shortest wait, whatever the failure.
        assert_eq!(next_backoff(None, Refused, &t), ms(50));
        assert_eq!(next_backoff(None, Unreachable, &t), ms(50));
        // A ceiling below the first wait is no ceiling below it.
        let odd = SenderTuning {
            backoff_min: ms(300),
            ..SenderTuning::default()
        };
        assert_eq!(next_backoff(Some(ms(300)), Unreachable, &odd), ms(300));
    }

    #[test]
    fn failures_are_told_by_whether_the_peer_was_there_to_refuse() {
        use tonic::{Code, Status};
        let rpc = |code| StreamError::Rpc(Status::new(code, "x"));
        for e in [
            StreamError::PeerTimeout,
            StreamError::Closed,
            rpc(Code::Unavailable),
            rpc(Code::Unknown),
            rpc(Code::Cancelled),
        ] {
            assert_eq!(Failure::of(&e), Failure::Unreachable, "{e}");
        }
        for e in [
            StreamError::Refused {
                code: 1,
                reason: "stale".into(),
            },
            StreamError::Protocol("x".into()),
            // "decoded message length too large" and the like: it fails the same way
            // again.
            rpc(Code::OutOfRange),
            rpc(Code::Internal),
            rpc(Code::Unimplemented),
            StreamError::LogReleased {
                acked: Lsn(1),
                log_start: Lsn(5),
            },
        ] {
            assert_eq!(Failure::of(&e), Failure::Refused, "{e}");
        }
    }

    #[test]
    fn the_ack_round_trip_mean_takes_the_first_sample_then_moves_an_eighth() {
        assert_eq!(smoothed(0, 400), 400);
        assert_eq!(smoothed(400, 1200), 500);
        assert_eq!(smoothed(500, 100), 450);
        // A sub-microsecond round trip still counts as measured.
        assert_eq!(smoothed(0, 0), 1);
        // Steady samples converge on the sample.
        let mut m = 0;
        for _ in 0..60 {
            m = smoothed(m, 1000);
        }
        assert_eq!(m, 1000);
        let mut m = 8000;
        for _ in 0..60 {
            m = smoothed(m, 300);
        }
        assert!((300..=310).contains(&m), "{m}");
    }

    #[test]
    fn a_lazy_stream_lingers_for_company_and_ships_once_enough_records_are_ready() {
        // Shipped through 10 (cursor 11), 8 records make company.
        let wake = |lingers, lingering, last| on_wake(lingers, lingering, Lsn(last), Lsn(11), 8);
        // A stream a return service waits on never lingers.
        assert_eq!(wake(false, false, 11), Wake::Ship);
        // Three ready: linger until the log reaches 18.
        assert_eq!(wake(true, false, 13), Wake::Linger { until: 18 });
        // Still lingering and still too few: wait on (the timer ships them).
        assert_eq!(wake(true, true, 15), Wake::Wait);
        // Enough now: ship, lingering or not.
        assert_eq!(wake(true, true, 18), Wake::Ship);
        assert_eq!(wake(true, false, 30), Wake::Ship);
    }

    #[test]
    fn own_commits_ship_once_flushed_or_written_as_the_stream_and_the_node_allow() {
        let (w, f) = (Lsn(20), Lsn(15));
        // Durable commits: flushed, or written where a return service waits.
        assert_eq!(
            durable_from(true, false, w, f, Lsn(30)),
            DurableFrom::At(Lsn(16))
        );
        assert_eq!(
            durable_from(true, true, w, f, Lsn(30)),
            DurableFrom::At(Lsn(21))
        );
        // Non-durable commits: written; what was read past that is written first.
        assert_eq!(
            durable_from(false, false, w, f, Lsn(20)),
            DurableFrom::At(Lsn(21))
        );
        assert_eq!(
            durable_from(false, true, w, f, Lsn(21)),
            DurableFrom::WriteAhead
        );
    }

    #[test]
    fn the_log_is_read_only_for_records_there_are_and_room_for() {
        // Next 5, log through 9: five records, within the room.
        assert_eq!(read_span(Lsn(5), Lsn(9), 0, 512), Some((Lsn(5), 5)));
        // Held 510 of 512: two more at most.
        assert_eq!(read_span(Lsn(5), Lsn(9), 510, 512), Some((Lsn(5), 2)));
        // Nothing past the end, or no room: no read.
        assert_eq!(read_span(Lsn(10), Lsn(9), 0, 512), None);
        assert_eq!(read_span(Lsn(5), Lsn(9), 512, 512), None);
    }

    #[test]
    fn a_position_alone_goes_out_at_most_every_position_every_and_claims_at_most_every_poll() {
        let t = SenderTuning::default();
        assert!(t.poll_interval < t.position_every);
        let (poll, every) = (t.poll_interval, t.position_every);
        // Nothing passed unsent, no claims: nothing to say.
        assert_eq!(position_due(None, Lsn(11), false, every, &t), None);
        // Passed unsent through 10: said once `position_every` has passed.
        assert_eq!(position_due(Some(Lsn(10)), Lsn(11), false, poll, &t), None);
        assert_eq!(
            position_due(Some(Lsn(10)), Lsn(11), false, every, &t),
            Some(Lsn(10))
        );
        // Claims unsent: said at the poll, through what the cursor passed.
        assert_eq!(position_due(None, Lsn(11), true, poll, &t), Some(Lsn(10)));
        assert_eq!(
            position_due(Some(Lsn(10)), Lsn(11), true, poll, &t),
            Some(Lsn(10))
        );
        assert_eq!(position_due(None, Lsn(11), true, Duration::ZERO, &t), None);
        // A stream stopped at its cursor says so when newly stopped, then every poll.
        assert!(waiting_due(false, Duration::ZERO, &t));
        assert!(!waiting_due(true, Duration::ZERO, &t));
        assert!(waiting_due(true, poll, &t));
    }

    #[test]
    fn the_resume_position_moves_only_with_an_ack_that_says_all_of_it_is_durable() {
        let marks = |seq| vec![pb::OriginMark { origin: 1, seq }];
        let ack = |durable, applied| pb::Ack {
            durable: marks(durable),
            applied: marks(applied),
            ..pb::Ack::default()
        };
        assert_eq!(resume_after(Lsn(5), Lsn(9), &ack(4, 4)), Lsn(9));
        // Applied ahead of durable (a lazy receiver's ack before its flush): stays.
        assert_eq!(resume_after(Lsn(5), Lsn(9), &ack(3, 4)), Lsn(5));
        // Never back.
        assert_eq!(resume_after(Lsn(9), Lsn(5), &ack(4, 4)), Lsn(9));
        // The receiver's marks only rise.
        let mut hw = BTreeMap::from([(NodeId(1), 7), (NodeId(2), 3)]);
        raise_marks(&mut hw, &BTreeMap::from([(NodeId(1), 5), (NodeId(3), 1)]));
        assert_eq!(
            hw,
            BTreeMap::from([(NodeId(1), 7), (NodeId(2), 3), (NodeId(3), 1)])
        );
        // The last session's error stays until an ack moves past it or no lag is left.
        assert!(clears_error(Lsn(6), Lsn(5), 3));
        assert!(!clears_error(Lsn(5), Lsn(5), 3));
        assert!(clears_error(Lsn(5), Lsn(5), 0));
    }
}
