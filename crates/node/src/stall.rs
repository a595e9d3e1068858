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
                let mut during = None;
                let Some(waited) = schedule_delay(&runtime, THRESHOLD, || {
                    during = Some(worker_states());
                }) else {
                    return;
                };
                if waited > THRESHOLD {
                    warn!(
                        stalled_ms = waited.as_millis() as u64,
                        workers = during.as_deref().unwrap_or("-"),
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
/// first. Blocks the calling thread (not a runtime thread) until the task ran; after
/// `first_look` without it, calls `stalled` (while the stall lasts) and keeps waiting.
fn schedule_delay(
    runtime: &tokio::runtime::Handle,
    first_look: Duration,
    stalled: impl FnOnce(),
) -> Option<Duration> {
    let (tx, rx) = mpsc::sync_channel::<()>(1);
    let handed = Instant::now();
    runtime.spawn(async move {
        let _ = tx.send(());
    });
    match rx.recv_timeout(first_look) {
        Ok(()) => Some(handed.elapsed()),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            stalled();
            rx.recv().ok().map(|()| handed.elapsed())
        }
        // The runtime shut down and dropped the task.
        Err(mpsc::RecvTimeoutError::Disconnected) => None,
    }
}

/// What the runtime's worker threads are doing now, from `/proc/self/task`: each
/// one's state (R running, S sleeping, D in uninterruptible I/O) and, when it waits in
/// the kernel, where (`wchan`), as "R, S futex_wait_queue, D ..." — to tell a busy
/// runtime from one blocked on a lock or on the disk. Empty off Linux.
fn worker_states() -> String {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return String::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        // tokio names its workers "tokio-rt-worker" ("tokio-runtime-worker" before).
        if !(name.starts_with("tokio-rt") || name.starts_with("tokio-runtime")) {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        // The state follows the parenthesised name, which may itself hold spaces.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').next())
            .unwrap_or("?");
        let wchan = std::fs::read_to_string(path.join("wchan")).unwrap_or_default();
        out.push(match wchan.trim() {
            "" | "0" => state.to_string(),
            w => format!("{state} {w}"),
        });
    }
    out.join(", ")
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
        let mut seen = None;
        let waited = schedule_delay(runtime.handle(), Duration::from_millis(10), || {
            seen = Some(worker_states())
        })
        .unwrap();
        assert!(waited >= block / 2, "waited {waited:?}");
        // The one worker was seen while it slept in the kernel.
        let seen = seen.expect("the stall was noticed while it lasted");
        if cfg!(target_os = "linux") {
            assert!(seen.starts_with('S') || seen.starts_with('R'), "{seen}");
        }
    }

    #[test]
    fn a_runtime_shut_down_ends_the_measure() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        runtime.shutdown_background();
        assert_eq!(
            schedule_delay(&handle, Duration::from_millis(10), || {}),
            None
        );
    }
}
