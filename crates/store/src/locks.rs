//! Row locks: exclusive, held until commit or rollback, waited for with a deadline.
//!
//! Writers lock every row they change, keyed by `(table id, encoded key)`; readers take
//! no locks (read committed, as TimesTen's default). A waiter sleeps on the lock's
//! `Notify` and retries when the holder releases; a wait longer than the lock timeout
//! fails, which is also how a deadlock ends. A lock that is released wakes all its
//! waiters at once; one of them takes it and the rest wait on the new holder's entry.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Identifies one transaction to the lock manager.
pub(crate) type TxnId = u64;

/// A lockable row: table id and encoded primary key.
pub(crate) type LockKey = (u64, Vec<u8>);

struct Held {
    owner: TxnId,
    released: Arc<Notify>,
}

/// The lock table.
#[derive(Default)]
pub(crate) struct LockManager {
    held: Mutex<HashMap<LockKey, Held>>,
}

/// Why a lock was not granted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LockTimedOut;

impl LockManager {
    /// Takes the lock on `key` for `txn`, waiting at most `timeout`. Taking a lock the
    /// transaction already holds returns at once.
    pub async fn acquire(
        &self,
        txn: TxnId,
        key: &LockKey,
        timeout: Duration,
    ) -> Result<(), LockTimedOut> {
        let deadline = Instant::now() + timeout;
        loop {
            let released = {
                let mut held = self.held.lock();
                match held.get(key) {
                    None => {
                        held.insert(
                            key.clone(),
                            Held {
                                owner: txn,
                                released: Arc::new(Notify::new()),
                            },
                        );
                        return Ok(());
                    }
                    Some(h) if h.owner == txn => return Ok(()),
                    Some(h) => h.released.clone(),
                }
            };
            let notified = released.notified();
            tokio::pin!(notified);
            // Register interest before re-checking, so a release between the check above
            // and the await below is not missed.
            notified.as_mut().enable();
            if self.is_free_or_mine(txn, key) {
                continue;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(LockTimedOut);
            }
        }
    }

    fn is_free_or_mine(&self, txn: TxnId, key: &LockKey) -> bool {
        self.held.lock().get(key).is_none_or(|h| h.owner == txn)
    }

    /// Releases every lock in `keys` that `txn` holds and wakes their waiters.
    pub fn release_all<'a>(&self, txn: TxnId, keys: impl IntoIterator<Item = &'a LockKey>) {
        let mut held = self.held.lock();
        for key in keys {
            if held.get(key).is_some_and(|h| h.owner == txn) {
                if let Some(h) = held.remove(key) {
                    h.released.notify_waiters();
                }
            }
        }
    }

    /// How many rows are locked right now (for tests and status).
    pub fn held_count(&self) -> usize {
        self.held.lock().len()
    }
}

#[cfg(test)]
mod tests {
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
}
