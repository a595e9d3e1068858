//! Group commit's flush: who flushes for everybody, who waits, and how far the log is
//! flushed and written. One commit at a time leads a flush that covers every commit
//! applied before it started; the others wait for it and wake together
//! ([`GroupFlush::wait_durable`]; docs/storage.md, "Commit path and group commit").

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hawser_core::Lsn;

use crate::engine::KvEngine;
use crate::error::StoreError;

pub(crate) struct GroupFlush {
    /// Highest LSN known flushed.
    flushed: AtomicU64,
    /// Highest LSN a commit flush wrote ahead of its sync ([`GroupFlush::written`]).
    written: AtomicU64,
    /// The written position, published to the senders that ship written commits
    /// ([`GroupFlush::watch_written`]).
    published: tokio::sync::watch::Sender<Lsn>,
    /// Set by the one commit that is flushing for everybody ([`FlushLeader`]).
    flushing: AtomicBool,
    /// Wakes every commit waiting for a flush when the flushing commit lets go.
    done: tokio::sync::Notify,
    /// Client commits waiting for a flush (leading one or queued behind it), and
    /// those past their flush still holding (waiting for a return service): whether a
    /// single-threaded node's commit may flush inline ([`flush_mode`]).
    committing: AtomicUsize,
    holding: AtomicUsize,
}

impl GroupFlush {
    /// Everything through `last` is flushed (as opening finds the log).
    pub(crate) fn new(last: Lsn) -> Self {
        GroupFlush {
            flushed: AtomicU64::new(last.0),
            written: AtomicU64::new(last.0),
            published: tokio::sync::watch::channel(last).0,
            flushing: AtomicBool::new(false),
            done: tokio::sync::Notify::new(),
            committing: AtomicUsize::new(0),
            holding: AtomicUsize::new(0),
        }
    }

    /// The highest LSN known flushed.
    pub(crate) fn flushed(&self) -> Lsn {
        Lsn(self.flushed.load(Ordering::Acquire))
    }

    /// The highest LSN known written to the log: flushed, or written ahead of a sync
    /// still under way.
    pub(crate) fn written(&self) -> Lsn {
        let written = self.written.load(Ordering::Acquire);
        Lsn(written.max(self.flushed.load(Ordering::Acquire)))
    }

    /// Everything through `upto` was written ahead: recorded, and published to whoever
    /// watches. Whether anybody does.
    pub(crate) fn wrote(&self, upto: u64) -> bool {
        self.written.fetch_max(upto, Ordering::AcqRel);
        if self.published.receiver_count() == 0 {
            return false;
        }
        self.published.send_if_modified(|at| {
            let moved = upto > at.0;
            if moved {
                *at = Lsn(upto);
            }
            moved
        });
        true
    }

    /// The written position as it moves: see [`Database::watch_written`].
    ///
    /// [`Database::watch_written`]: crate::Database::watch_written
    pub(crate) fn watch_written(&self) -> tokio::sync::watch::Receiver<Lsn> {
        self.published.subscribe()
    }

    /// Counts a client commit as holding (waiting for a return service past its
    /// flush), until [`GroupFlush::leave_holding`].
    pub(crate) fn enter_holding(&self) {
        self.holding.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn leave_holding(&self) {
        self.holding.fetch_sub(1, Ordering::AcqRel);
    }

    /// Group commit: returns once everything up to `lsn` is flushed.
    ///
    /// The first committer to get here leads: it notes how far the engine has been
    /// applied, flushes, and advances `flushed_lsn` to that point. The others wait for
    /// the flush to end, and all of them wake at once when it does: those it covered
    /// return, the first of the rest to run leads the next flush, which covers
    /// everything applied meanwhile. So one flush serves as many commits as applied
    /// during the previous one.
    ///
    /// The waiters do not queue on a lock: a fair lock hands itself to one waiter at a
    /// time, each hand-off a trip through the scheduler's queue, so (when they did) the
    /// last covered commit learned of its flush — and the next flush started — only
    /// after every covered commit ahead of it had run (on a one-thread node with 16
    /// clients, ~8 trips behind the tasks already queued, with the disk idle meanwhile).
    ///
    /// `settle`: the flush also does its housekeeping before it returns (see
    /// [`KvEngine::flush_unsettled`]); `false` leaves it for [`Database::settle`].
    /// `engine` is flushed; `applied` is the highest LSN whose batch is in it.
    /// Returns when the flush this caller led started (`None`: another covered it).
    pub(crate) async fn wait_durable(
        &self,
        engine: &Arc<dyn KvEngine>,
        applied: &AtomicU64,
        lsn: Lsn,
        who: Flusher,
        settle: bool,
    ) -> Result<Option<Instant>, StoreError> {
        if self.flushed.load(Ordering::Acquire) >= lsn.0 {
            return Ok(None);
        }
        let _counted = (who == Flusher::Commit).then(|| Counted::enter(&self.committing));
        let _leader = loop {
            // Registered before the checks, so a flush that ends after them wakes us.
            let flushed = self.done.notified();
            tokio::pin!(flushed);
            flushed.as_mut().enable();
            if self.flushed.load(Ordering::Acquire) >= lsn.0 {
                // A flush that finished while we waited covered us.
                return Ok(None);
            }
            if self
                .flushing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break FlushLeader {
                    flushing: &self.flushing,
                    done: &self.done,
                };
            }
            flushed.await;
        };
        // Every batch up to `upto` was applied before this load, so the flush below
        // covers it (and `lsn` ≤ `upto`, since our own batch is applied).
        let mut upto = applied.load(Ordering::Acquire);
        let started = Instant::now();
        // Flush: a blocking fsync. With two or more async workers it runs right here,
        // blocking this worker for the sync as a PostgreSQL backend does: only the one
        // leading commit blocks, the other workers go on applying commits, and it
        // saves the hand-off to tokio's blocking pool and back — two thread wake-ups
        // per flush, which cost more CPU than the sync itself with few clients. With a
        // single worker, blocking it would stall every other task, so the sync goes to
        // the blocking pool there (as tokio::fs does) — unless this commit is the only
        // one waiting for a flush once the tasks ready to run have run: then nothing
        // could join it or apply meanwhile, and the hand-off would only add its two
        // wake-ups. (docs/storage.md, "Commit path and group commit".)
        let flush = move |engine: &dyn KvEngine| {
            if settle {
                engine.flush()
            } else {
                engine.flush_unsettled()
            }
        };
        let mut yielded = false;
        if who == Flusher::Commit && self.published.receiver_count() > 0 {
            // Write ahead, let the senders that ship written commits go, then sync.
            engine.write_ahead()?;
            if self.wrote(upto) {
                // A woken task waits in this worker's next-task slot, which no other
                // worker takes from: it runs now, or only after the sync.
                tokio::task::yield_now().await;
                yielded = true;
            }
        }
        let inline = match flush_mode(who) {
            FlushMode::Inline => true,
            FlushMode::Pool => false,
            FlushMode::InlineIfAlone => {
                // On one thread the other commits run only when this task lets them:
                // a yield (tokio defers it until every ready task has run and the I/O
                // driver was polled) lets those whose requests are in apply and queue
                // behind this flush — which then covers them too. Commits holding for
                // a return service count too: the acks that end their wait, and the
                // next commits of their clients, would wait for an inline sync.
                if !yielded {
                    tokio::task::yield_now().await;
                }
                upto = applied.load(Ordering::Acquire);
                self.committing.load(Ordering::Acquire) + self.holding.load(Ordering::Acquire) <= 1
            }
        };
        if inline {
            flush(&**engine)?;
        } else {
            let engine = engine.clone();
            tokio::task::spawn_blocking(move || flush(&*engine))
                .await
                .map_err(|e| StoreError::io("flush", e))??;
        }
        // Advance: only now may anyone acknowledge commits up to `upto` as durable.
        self.flushed.fetch_max(upto, Ordering::AcqRel);
        Ok(Some(started))
    }

    /// The blocking form of [`GroupFlush::wait_durable`], for sequence reservations.
    pub(crate) fn flush_through(
        &self,
        engine: &dyn KvEngine,
        applied: &AtomicU64,
        lsn: Lsn,
    ) -> Result<Option<Instant>, StoreError> {
        if self.flushed.load(Ordering::Acquire) >= lsn.0 {
            return Ok(None);
        }
        let upto = applied.load(Ordering::Acquire);
        let started = Instant::now();
        engine.flush()?;
        self.flushed.fetch_max(upto, Ordering::AcqRel);
        Ok(Some(started))
    }
}

/// Who waits for a flush: it decides whether the flush may block the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flusher {
    /// A client's commit (or DDL): others may be applying commits meanwhile.
    Commit,
    /// A receiver's apply (or an explicit [`Database::flush`]): it has nothing to do
    /// but wait.
    Apply,
}

/// Where a flush runs (see [`GroupFlush::wait_durable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlushMode {
    /// On the calling async worker, blocking it for the sync.
    Inline,
    /// On tokio's blocking pool, the caller waiting for it.
    Pool,
    /// Inline when the caller is the only commit waiting for a flush, else pooled.
    InlineIfAlone,
}

/// Where `who`'s flush runs: on a multi-thread runtime with at least two workers,
/// inline — the other workers go on. On a single-threaded runtime (`hawser start
/// --threads 1`), inline for a receiver's apply, which, as a PostgreSQL walreceiver
/// does, has nothing better to do than wait for its own sync; a client commit's flush
/// goes to the blocking pool there, so other commits apply meanwhile and join the next
/// flush, unless the commit is alone. The measurements behind each choice are in
/// docs/storage.md, "Commit path and group commit".
fn flush_mode(who: Flusher) -> FlushMode {
    let handle = tokio::runtime::Handle::current();
    match handle.runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread if handle.metrics().num_workers() >= 2 => {
            FlushMode::Inline
        }
        tokio::runtime::RuntimeFlavor::CurrentThread => match who {
            Flusher::Apply => FlushMode::Inline,
            Flusher::Commit => FlushMode::InlineIfAlone,
        },
        _ => FlushMode::Pool,
    }
}

/// The commit that flushes for everybody ([`GroupFlush::flushing`] set). Letting go —
/// after the flush, or when the flush failed or its commit was dropped — wakes every
/// commit waiting: the covered ones return, another leads the next flush.
struct FlushLeader<'a> {
    flushing: &'a AtomicBool,
    done: &'a tokio::sync::Notify,
}

impl Drop for FlushLeader<'_> {
    fn drop(&mut self) {
        // Cleared first, so that a woken waiter can lead.
        self.flushing.store(false, Ordering::Release);
        self.done.notify_waiters();
    }
}

/// Counts a client commit in [`GroupFlush::committing`] while it waits for its flush, or
/// in [`GroupFlush::holding`] while it holds, however the wait ends (a dropped future
/// included).
pub(crate) struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    pub(crate) fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::{flush_mode, FlushMode, Flusher};

    #[test]
    fn a_single_threaded_runtime_flushes_a_receivers_apply_inline_and_a_commit_when_alone() {
        let one = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        one.block_on(async {
            assert_eq!(flush_mode(Flusher::Apply), FlushMode::Inline);
            assert_eq!(flush_mode(Flusher::Commit), FlushMode::InlineIfAlone);
        });
        for (workers, mode) in [(1, FlushMode::Pool), (2, FlushMode::Inline)] {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .build()
                .unwrap();
            rt.block_on(async {
                for who in [Flusher::Apply, Flusher::Commit] {
                    assert_eq!(flush_mode(who), mode, "{workers} workers, {who:?}");
                }
            });
        }
    }
}
