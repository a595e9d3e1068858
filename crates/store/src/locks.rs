//! Row locks: exclusive, held until commit or rollback, granted first come, first served,
//! waited for with a deadline.
//!
//! Writers lock every row they change, keyed by `(table id, encoded key)`; readers take
//! no locks (read committed, as TimesTen's default). A transaction that finds a row locked
//! joins the row's queue; a release hands the lock straight to the oldest waiter still
//! waiting, so a busy row cannot starve anyone (with "wake everybody and let them race"
//! one unlucky waiter can lose every race until its timeout — seen under load). A wait
//! longer than the lock timeout fails, which is also how a deadlock ends.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Identifies one transaction to the lock manager.
pub(crate) type TxnId = u64;

/// A lockable row: table id and encoded primary key.
pub(crate) type LockKey = (u64, Vec<u8>);

struct Held {
    owner: TxnId,
    /// Waiters in arrival order; the sender tells a waiter it now owns the lock.
    queue: VecDeque<(TxnId, oneshot::Sender<()>)>,
}

/// The lock table.
#[derive(Default)]
pub(crate) struct LockManager {
    held: Mutex<HashMap<LockKey, Held>>,
}

/// Why a lock was not granted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LockTimedOut;

/// Cleans up after a waiter that stops waiting for any reason (timeout, or its future
/// dropped): it leaves the queue, and a lock handed to it in the meantime is passed on.
struct Waiting<'a> {
    manager: &'a LockManager,
    txn: TxnId,
    key: &'a LockKey,
    /// Set once the caller has been told it owns the lock.
    granted: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let mut held = self.manager.held.lock();
        let Some(h) = held.get_mut(self.key) else {
            return;
        };
        if h.owner == self.txn {
            // Handed over just as we stopped waiting: pass it on.
            LockManager::hand_over(&mut held, self.key);
        } else {
            h.queue.retain(|(t, _)| *t != self.txn);
        }
    }
}

impl LockManager {
    /// Takes the lock on `key` for `txn`, waiting at most `timeout`. Taking a lock the
    /// transaction already holds returns at once. Cancel-safe: dropping the future
    /// leaves no trace in the lock table.
    pub async fn acquire(
        &self,
        txn: TxnId,
        key: &LockKey,
        timeout: Duration,
    ) -> Result<(), LockTimedOut> {
        let granted = {
            let mut held = self.held.lock();
            match held.get_mut(key) {
                None => {
                    held.insert(
                        key.clone(),
                        Held {
                            owner: txn,
                            queue: VecDeque::new(),
                        },
                    );
                    return Ok(());
                }
                Some(h) if h.owner == txn => return Ok(()),
                Some(h) => {
                    let (tx, rx) = oneshot::channel();
                    h.queue.push_back((txn, tx));
                    rx
                }
            }
        };
        let mut waiting = Waiting {
            manager: self,
            txn,
            key,
            granted: false,
        };
        match tokio::time::timeout(timeout, granted).await {
            Ok(Ok(())) => {
                waiting.granted = true;
                Ok(())
            }
            // Timed out (or the sender vanished, which hand_over never does while we
            // are queued): the guard leaves the queue or passes on a late hand-over.
            _ => {
                let owned = self.held.lock().get(key).is_some_and(|h| h.owner == txn);
                if owned {
                    // The hand-over raced the deadline and won: keep the lock.
                    waiting.granted = true;
                    return Ok(());
                }
                Err(LockTimedOut)
            }
        }
    }

    /// Gives the lock on `key` to the oldest waiter still waiting, or frees it.
    fn hand_over(held: &mut HashMap<LockKey, Held>, key: &LockKey) {
        let Some(h) = held.get_mut(key) else { return };
        while let Some((next, tx)) = h.queue.pop_front() {
            h.owner = next;
            if tx.send(()).is_ok() {
                return;
            }
            // That waiter is gone (its guard will find it no longer queued); try the next.
        }
        held.remove(key);
    }

    /// Releases every lock in `keys` that `txn` holds and hands each to its next waiter.
    pub fn release_all<'a>(&self, txn: TxnId, keys: impl IntoIterator<Item = &'a LockKey>) {
        let mut held = self.held.lock();
        for key in keys {
            if held.get(key).is_some_and(|h| h.owner == txn) {
                Self::hand_over(&mut held, key);
            }
        }
    }

    /// How many transactions wait for `key` (tests).
    #[cfg(test)]
    fn waiting_for(&self, key: &LockKey) -> usize {
        self.held.lock().get(key).map_or(0, |h| h.queue.len())
    }

    /// How many rows are locked right now (for tests and status).
    pub fn held_count(&self) -> usize {
        self.held.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_second_owner_waits_until_release() {
        let locks = Arc::new(LockManager::default());
        let key: LockKey = (1, vec![1]);
        locks
            .acquire(1, &key, Duration::from_secs(5))
            .await
            .unwrap();
        locks
            .acquire(1, &key, Duration::from_secs(5))
            .await
            .unwrap();
        let l2 = locks.clone();
        let k2 = key.clone();
        let waiter = tokio::spawn(async move { l2.acquire(2, &k2, Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        locks.release_all(1, [&key]);
        waiter.await.unwrap().unwrap();
        assert_eq!(locks.held_count(), 1);
        locks.release_all(2, [&key]);
        assert_eq!(locks.held_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_timeout_fails() {
        let locks = LockManager::default();
        let key: LockKey = (1, vec![1]);
        locks
            .acquire(1, &key, Duration::from_secs(1))
            .await
            .unwrap();
        let r = locks.acquire(2, &key, Duration::from_millis(50)).await;
        assert_eq!(r, Err(LockTimedOut));
    }

    /// Waits (bounded) until `n` transactions queue for `key`.
    async fn until_queued(locks: &LockManager, key: &LockKey, n: usize) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while locks.waiting_for(key) < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("waiters queue up");
    }

    #[tokio::test]
    async fn waiters_get_the_lock_in_arrival_order() {
        let locks = Arc::new(LockManager::default());
        let key: LockKey = (1, vec![7]);
        locks
            .acquire(1, &key, Duration::from_secs(5))
            .await
            .unwrap();
        let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for txn in 2..=5u64 {
            let (l, k, tx) = (locks.clone(), key.clone(), order_tx.clone());
            waiters.push(tokio::spawn(async move {
                l.acquire(txn, &k, Duration::from_secs(30)).await.unwrap();
                tx.send(txn).unwrap();
                l.release_all(txn, [&k]);
            }));
            until_queued(&locks, &key, (txn - 1) as usize).await;
        }
        locks.release_all(1, [&key]);
        for w in waiters {
            w.await.unwrap();
        }
        let got: Vec<u64> = std::iter::from_fn(|| order.try_recv().ok()).collect();
        assert_eq!(got, vec![2, 3, 4, 5]);
        assert_eq!(locks.held_count(), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_does_not_block_the_next() {
        let locks = Arc::new(LockManager::default());
        let key: LockKey = (1, vec![9]);
        locks
            .acquire(1, &key, Duration::from_secs(5))
            .await
            .unwrap();
        // Waiter 2 queues, then its future is dropped (a cancelled request).
        let (l, k) = (locks.clone(), key.clone());
        let quitter = tokio::spawn(async move { l.acquire(2, &k, Duration::from_secs(30)).await });
        until_queued(&locks, &key, 1).await;
        let (l, k) = (locks.clone(), key.clone());
        let patient = tokio::spawn(async move { l.acquire(3, &k, Duration::from_secs(30)).await });
        until_queued(&locks, &key, 2).await;
        quitter.abort();
        let _ = quitter.await;
        assert_eq!(
            locks.waiting_for(&key),
            1,
            "the dropped waiter left the queue"
        );
        locks.release_all(1, [&key]);
        patient.await.unwrap().unwrap();
        locks.release_all(3, [&key]);
        assert_eq!(locks.held_count(), 0);
    }
}
