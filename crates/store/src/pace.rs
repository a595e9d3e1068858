//! Pacing of work nobody waits for, so that it does not hold a core for long.
//!
//! A receiver that no return service waits on applies what it is sent in runs: a
//! lingered batch of an asynchronous stream is hundreds of microseconds of CPU, and
//! the move of its flushed batches into sled as much again. On a machine whose cores
//! are shared with other work — the master and its clients on the same host, as in a
//! demo, a test or a small deployment — a task woken while such a run holds its core
//! waits for the run to end: the scheduler lets the running task finish its slice.
//! [`Pacer::tick`] between pieces of the run sleeps for the shortest time the kernel
//! gives (one timer slack, ~50–70 µs on Linux) once `slice` of work has passed since
//! the last pause, and the waiting task runs then. The receiver paces only when it is
//! not behind (docs/stream.md, "Paced apply"), so a catch-up is never slowed.

use std::time::{Duration, Instant};

/// Breaks a run of CPU work into slices of about `slice`, with a short sleep between
/// them.
#[derive(Debug, Clone)]
pub struct Pacer {
    slice: Duration,
    since: Instant,
    pauses: u64,
}

impl Pacer {
    pub fn new(slice: Duration) -> Pacer {
        Pacer {
            slice,
            since: Instant::now(),
            pauses: 0,
        }
    }

    /// Starts a run: the first slice counts from now.
    pub fn start(&mut self) {
        self.since = Instant::now();
    }

    /// Between two pieces of a run: sleeps briefly if a slice has passed since the
    /// run started or since the last pause.
    pub fn tick(&mut self) {
        if self.since.elapsed() >= self.slice {
            // The shortest sleep: the kernel rounds it up to the thread's timer slack.
            std::thread::sleep(Duration::from_micros(1));
            self.pauses += 1;
            self.since = Instant::now();
        }
    }

    /// The pauses taken so far.
    pub fn pauses(&self) -> u64 {
        self.pauses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pacer_pauses_once_a_slice_has_passed_and_not_before() {
        let mut p = Pacer::new(Duration::from_millis(50));
        p.start();
        p.tick();
        assert_eq!(p.pauses(), 0, "no slice has passed yet");
        let mut zero = Pacer::new(Duration::ZERO);
        zero.start();
        let before = Instant::now();
        zero.tick();
        zero.tick();
        assert_eq!(zero.pauses(), 2);
        assert!(before.elapsed() >= Duration::from_micros(2));
    }
}
