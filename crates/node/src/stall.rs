//! Notices when this node's async runtime runs nothing for a while.
//!
//! Everything a node says to the cluster — Raft answers, liveness reports, stream acks —
//! runs on the tokio runtime. If every worker is busy or blocked, the node is silent to
//! the others however healthy it is, and the Raft leader may fail its elements over.
//! A thread outside the runtime hands it a task every [`PERIOD`] and times how long the
//! task waits to run; a wait past [`THRESHOLD`] is logged once, with its length, when it
//! ends, and every wait is recorded in `hawser_runtime_schedule_delay_seconds`. The log
//! line names the cause an operator should look for next to a failover it explains.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How often the watch hands the runtime a task.
const PERIOD: Duration = Duration::from_millis(50);
/// A wait longer than this is logged: a fifth of the default failover timeout.
const THRESHOLD: Duration = Duration::from_millis(200);

/// Starts the watch on `runtime` until `shutdown`, or until the runtime is gone.
pub(crate) fn watch(runtime: tokio::runtime::Handle, shutdown: CancellationToken) {
    let spawned = std::thread::Builder::new()
        .name("hawser-stall-watch".into())
        .spawn(move || {
            while !shutdown.is_cancelled() {
                let Some(waited) = schedule_delay(&runtime, THRESHOLD) else {
                    return;
                };
                if waited > THRESHOLD {
                    warn!(
                        stalled_ms = waited.as_millis() as u64,
                        "the async runtime ran no task for this long: every worker was busy \
                         or blocked, so this node could not answer Raft, reports or streams \
                         meanwhile (a failover of its elements may follow)"
                    );
                }
                metrics::histogram!("hawser_runtime_schedule_delay_seconds")
                    .record(waited.as_secs_f64());
                std::thread::sleep(PERIOD);
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the runtime stall watch");
    }
}

/// How long a task handed to `runtime` waited to run; `None` if the runtime shut down
/// first. Blocks the calling thread (not a runtime thread) until the task ran, waking
/// after `first_look` only to keep waiting.
fn schedule_delay(runtime: &tokio::runtime::Handle, first_look: Duration) -> Option<Duration> {
    let (tx, rx) = mpsc::sync_channel::<()>(1);
    let handed = Instant::now();
    runtime.spawn(async move {
        let _ = tx.send(());
    });
    match rx.recv_timeout(first_look) {
        Ok(()) => Some(handed.elapsed()),
        Err(mpsc::RecvTimeoutError::Timeout) => rx.recv().ok().map(|()| handed.elapsed()),
        // The runtime shut down and dropped the task.
        Err(mpsc::RecvTimeoutError::Disconnected) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_worker_delays_the_task_by_at_least_the_block() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (blocking_tx, blocking_rx) = mpsc::sync_channel::<()>(1);
        let block = Duration::from_millis(300);
        runtime.spawn(async move {
            let _ = blocking_tx.send(());
            // What the watch exists to notice: a worker blocked outside any await.
            std::thread::sleep(block);
        });
        blocking_rx.recv().unwrap();
        let waited = schedule_delay(runtime.handle(), Duration::from_millis(10)).unwrap();
        assert!(waited >= block / 2, "waited {waited:?}");
    }

    #[test]
    fn a_runtime_shut_down_ends_the_measure() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        runtime.shutdown_background();
        assert_eq!(schedule_delay(&handle, Duration::from_millis(10)), None);
    }
}
