//! The batches a session has sent and the receiver has not acknowledged yet: the
//! window that bounds what is in flight, and the round trip an ack measures.

use std::collections::VecDeque;
use std::time::Instant;

use hawser_core::Lsn;

use crate::link::SenderTuning;

/// One batch sent and not yet acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct InFlight {
    pub through_lsn: Lsn,
    /// When the batch was handed to the stream.
    pub sent_at: Instant,
    pub wire_bytes: u64,
    /// Commit time of its first transaction (µs since the epoch), if it carries any.
    pub first_commit_micros: Option<i64>,
}

/// A session's batches in flight, oldest first, and their bytes on the wire.
#[derive(Debug, Default)]
pub(super) struct Window {
    batches: VecDeque<InFlight>,
    bytes: u64,
}

impl Window {
    /// Whether another batch may go out: fewer than `max_in_flight_batches` out and
    /// fewer than `max_in_flight_bytes` on the wire (the last batch may pass the byte
    /// bound; the next waits).
    pub fn has_room(&self, tuning: &SenderTuning) -> bool {
        self.batches.len() < tuning.max_in_flight_batches && self.bytes < tuning.max_in_flight_bytes
    }

    pub fn sent(&mut self, batch: InFlight) {
        self.bytes += batch.wire_bytes;
        self.batches.push_back(batch);
    }

    /// Frees every batch an ack through `through` covers. Gives the round trip of the
    /// newest of them, in microseconds, from when it was sent to `now`; `None` when
    /// the ack covers none (a receiver acks unasked when its marks move).
    pub fn acked(&mut self, through: Lsn, now: Instant) -> Option<u64> {
        let mut answered = None;
        while let Some(f) = self.batches.front() {
            if f.through_lsn > through {
                break;
            }
            self.bytes -= f.wire_bytes;
            answered = Some(f.sent_at);
            self.batches.pop_front();
        }
        answered.map(|t| now.saturating_duration_since(t).as_micros() as u64)
    }

    /// The commit time of the oldest transaction still out, if any.
    pub fn oldest_commit_micros(&self) -> Option<i64> {
        self.batches.iter().find_map(|f| f.first_commit_micros)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.batches.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn batch(through: u64, at: Instant, bytes: u64, first: Option<i64>) -> InFlight {
        InFlight {
            through_lsn: Lsn(through),
            sent_at: at,
            wire_bytes: bytes,
            first_commit_micros: first,
        }
    }

    #[test]
    fn an_ack_frees_every_batch_through_its_position_and_times_the_newest_of_them() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut w = Window::default();
        w.sent(batch(10, t0, 100, Some(1)));
        w.sent(batch(20, t0 + ms(1), 200, Some(2)));
        w.sent(batch(30, t0 + ms(2), 300, None));
        // Through 25: the first two go, and the round trip is the second's.
        assert_eq!(w.acked(Lsn(25), t0 + ms(5)), Some(4_000));
        assert_eq!(w.len(), 1);
        assert_eq!(w.oldest_commit_micros(), None);
        // An ack that covers nothing new measures nothing and frees nothing.
        assert_eq!(w.acked(Lsn(25), t0 + ms(9)), None);
        assert_eq!(w.len(), 1);
        assert_eq!(w.acked(Lsn(30), t0 + ms(9)), Some(7_000));
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn the_oldest_unacknowledged_commit_is_the_first_batch_out_that_carries_one() {
        let t0 = Instant::now();
        let mut w = Window::default();
        assert_eq!(w.oldest_commit_micros(), None);
        // A record-less position batch carries no commit.
        w.sent(batch(5, t0, 10, None));
        w.sent(batch(9, t0, 10, Some(77)));
        w.sent(batch(12, t0, 10, Some(88)));
        assert_eq!(w.oldest_commit_micros(), Some(77));
        w.acked(Lsn(9), t0);
        assert_eq!(w.oldest_commit_micros(), Some(88));
    }

    #[test]
    fn the_window_closes_at_the_batch_count_or_once_the_bytes_reach_the_bound() {
        let t0 = Instant::now();
        let tuning = SenderTuning {
            max_in_flight_batches: 3,
            max_in_flight_bytes: 1000,
            ..SenderTuning::default()
        };
        let mut w = Window::default();
        assert!(w.has_room(&tuning));
        w.sent(batch(1, t0, 10, None));
        w.sent(batch(2, t0, 10, None));
        assert!(w.has_room(&tuning));
        w.sent(batch(3, t0, 10, None));
        assert!(!w.has_room(&tuning), "three batches out");
        w.acked(Lsn(1), t0);
        assert!(w.has_room(&tuning));
        // One large batch may pass the byte bound; nothing follows it until acked.
        w.sent(batch(4, t0, 5000, None));
        assert!(!w.has_room(&tuning), "bytes past the bound");
        w.acked(Lsn(4), t0);
        assert!(w.has_room(&tuning));
    }
}
