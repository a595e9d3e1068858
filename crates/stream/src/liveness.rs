//! Whether a stream's peer is alive, known apart from the work the stream does.
//!
//! Both ends take a peer silent past `peer_timeout` for dead and start over. Which
//! makes two things matter, each learnt from a 40 MiB transaction that broke its
//! session on a loaded host:
//!
//! - **Heartbeats come from a task of their own** ([`heartbeats`]), not from the loop
//!   that also applies or ships: a synchronous stretch of that loop (a large
//!   transaction's encode or apply) would hold them up, and the peer would take a busy
//!   node for a dead one.
//! - **Silence is judged by the reader** ([`Ear`], [`Heard`]): the task that reads the
//!   peer's messages notes each as it arrives, whatever the loop is doing. While that
//!   reader waits for room in its queue (the loop is busy and has not taken what was
//!   read), the peer's messages wait in HTTP/2 unread, so no silence is counted.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the reader knows of its peer. Tokio's clock, so tests can run it paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hearing {
    /// When the last message arrived.
    last: Instant,
    /// Since when the reader has waited on the network with nothing arriving; `None`
    /// while it waits for room in its queue instead.
    listening_since: Option<Instant>,
}

/// Whether a peer is silent past `timeout` at `now`: the reader has listened that
/// long with nothing arriving. Never while the reader waits for room.
fn silent(h: &Hearing, now: Instant, timeout: Duration) -> bool {
    h.listening_since
        .is_some_and(|since| now.saturating_duration_since(since) > timeout)
}

/// The reader's side: what it notes as it reads.
pub(crate) struct Ear(watch::Sender<Hearing>);

/// The side of the loop that judges silence (and reports last contact).
#[derive(Clone)]
pub(crate) struct Heard(watch::Receiver<Hearing>);

/// A reader's ear and what it tells, the peer heard from at `now`.
pub(crate) fn ear(now: Instant) -> (Ear, Heard) {
    let (tx, rx) = watch::channel(Hearing {
        last: now,
        listening_since: Some(now),
    });
    (Ear(tx), Heard(rx))
}

impl Ear {
    /// A message arrived at `now`; the reader listens on unless it queues it
    /// ([`Ear::queueing`]).
    pub(crate) fn heard(&self, now: Instant) {
        self.0.send_replace(Hearing {
            last: now,
            listening_since: Some(now),
        });
    }

    /// The reader waits for room in its queue: the peer's silence is not judged.
    pub(crate) fn queueing(&self) {
        self.0.send_modify(|h| h.listening_since = None);
    }

    /// The reader listens again from `now`, what it read queued.
    pub(crate) fn listening(&self, now: Instant) {
        self.0.send_modify(|h| h.listening_since = Some(now));
    }
}

impl Heard {
    /// When the last message arrived, on the standard clock (for status).
    pub(crate) fn last(&self) -> std::time::Instant {
        self.0.borrow().last.into_std()
    }

    /// Whether the peer has been silent past `timeout` at `now`.
    pub(crate) fn silent(&self, now: Instant, timeout: Duration) -> bool {
        silent(&self.0.borrow(), now, timeout)
    }
}

/// A task that ends when dropped.
pub(crate) struct AbortOnDrop(JoinHandle<()>);

impl AbortOnDrop {
    /// Runs `task` until the guard is dropped.
    pub(crate) fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(task))
    }

    /// Waits for the task to end on its own.
    pub(crate) async fn join(mut self) {
        let _ = (&mut self.0).await;
    }

    #[cfg(test)]
    fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends `beat()` on `out` every `period` until dropped or the channel closes. A full
/// channel skips the beat: the peer has messages of this end waiting already. The task
/// holds a sender of `out`, so the guard must be dropped for the stream to end.
pub(crate) fn heartbeats<T: Send + 'static>(
    out: mpsc::Sender<T>,
    period: Duration,
    beat: impl Fn() -> T + Send + 'static,
) -> AbortOnDrop {
    AbortOnDrop::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(mpsc::error::TrySendError::Closed(_)) = out.try_send(beat()) {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_peer_is_silent_only_after_the_reader_listened_past_the_timeout() {
        let t0 = Instant::now();
        let (ear, heard) = ear(t0);
        assert!(!heard.silent(t0 + SECOND, SECOND));
        assert!(heard.silent(t0 + SECOND + Duration::from_millis(1), SECOND));
        // A clock read before the last contact is no silence.
        ear.heard(t0 + 2 * SECOND);
        assert!(!heard.silent(t0, SECOND));
        assert_eq!(heard.last(), (t0 + 2 * SECOND).into_std());
    }

    /// The loop was busy for ten seconds and the reader's queue was full: the peer's
    /// messages waited unread, which is no silence of the peer's.
    #[test]
    fn no_silence_is_counted_while_the_reader_waits_for_room() {
        let t0 = Instant::now();
        let (ear, heard) = ear(t0);
        ear.heard(t0);
        ear.queueing();
        assert!(!heard.silent(t0 + 10 * SECOND, SECOND));
        // Listening again from then on, the silence counts from then.
        ear.listening(t0 + 10 * SECOND);
        assert!(!heard.silent(t0 + 10 * SECOND + SECOND / 2, SECOND));
        assert!(heard.silent(t0 + 12 * SECOND, SECOND));
        // The last message is still the one before the wait.
        assert_eq!(heard.last(), t0.into_std());
    }

    /// Beats go out while the task that started them is blocked, and stop with the
    /// guard.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heartbeats_go_out_while_their_starter_is_blocked() {
        let (tx, mut rx) = mpsc::channel(16);
        let guard = heartbeats(tx, Duration::from_millis(10), || 7u8);
        // Blocks this worker, as a large apply does; the other worker beats.
        std::thread::sleep(Duration::from_millis(100));
        let mut beats = 0;
        while let Ok(b) = rx.try_recv() {
            assert_eq!(b, 7);
            beats += 1;
        }
        assert!(beats >= 2, "{beats} beats while blocked");
        drop(guard);
        // The task held the only sender: once it is gone, the channel ends.
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_channel_skips_beats_and_a_closed_one_ends_them() {
        let (tx, mut rx) = mpsc::channel(1);
        let guard = heartbeats(tx, Duration::from_millis(250), || 1u8);
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Eight periods, one slot: the rest were skipped, not queued behind.
        assert_eq!(rx.recv().await, Some(1));
        assert!(rx.try_recv().is_err());
        drop(rx);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(guard.is_finished());
    }
}
