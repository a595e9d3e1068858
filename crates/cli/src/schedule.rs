//! Waiting for a scheduled instant with the kernel's precision, for `hawser bench
//! --rate`.
//!
//! tokio's timers live in a wheel of one-millisecond slots: a sleep ends at the first
//! tick at or after its deadline, up to a millisecond late. A schedule of a few thousand
//! commits per second has gaps of a few hundred microseconds, so every commit would be
//! sent late by about half a millisecond and its latency — counted from the scheduled
//! time — would carry it. On Linux a timerfd per client, registered with the runtime's
//! reactor, fires within the kernel's timer slack (50 µs by default) instead.

use tokio::time::Instant;

/// Sleeps until instants, one at a time.
pub struct Sleeper {
    #[cfg(target_os = "linux")]
    timer: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
}

impl Sleeper {
    /// A sleeper with its own timerfd, or tokio's timer where there is none (another
    /// system, or the timerfd could not be made: out of file descriptors).
    pub fn new() -> Sleeper {
        Sleeper {
            #[cfg(target_os = "linux")]
            timer: linux::timerfd().ok(),
        }
    }

    /// Whether waits have the kernel's precision rather than tokio's millisecond.
    #[cfg(test)]
    pub fn precise(&self) -> bool {
        #[cfg(target_os = "linux")]
        return self.timer.is_some();
        #[cfg(not(target_os = "linux"))]
        return false;
    }

    /// Returns at `at` (at once if it has passed). Should the timerfd fail, this wait
    /// and the later ones fall back to tokio's timer.
    pub async fn until(&mut self, at: Instant) {
        let Some(wait) = at
            .checked_duration_since(Instant::now())
            .filter(|w| !w.is_zero())
        else {
            return;
        };
        #[cfg(target_os = "linux")]
        if let Some(timer) = &self.timer {
            match linux::wait(timer, wait).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "timerfd failed; waiting on tokio's timer");
                    self.timer = None;
                }
            }
        }
        let _ = wait;
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::os::fd::OwnedFd;
    use std::time::Duration;

    use rustix::time::{
        timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags,
        TimerfdTimerFlags, Timespec,
    };
    use tokio::io::unix::AsyncFd;

    pub fn timerfd() -> io::Result<AsyncFd<OwnedFd>> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // Deprecated as unsound for a type whose `as_raw_fd` may change or close; an
        // `OwnedFd` owns its descriptor for its whole life, which is what `AsyncFd` needs
        // (its `unsafe` replacement is closed to this workspace).
        #[allow(deprecated)]
        AsyncFd::new(fd)
    }

    /// Arms the timer `wait` from now (relative: the same monotonic clock as tokio's
    /// `Instant`) and waits until it has fired.
    pub async fn wait(timer: &AsyncFd<OwnedFd>, wait: Duration) -> io::Result<()> {
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let value = Itimerspec {
            it_interval: zero,
            it_value: Timespec {
                tv_sec: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(wait.subsec_nanos()),
            },
        };
        timerfd_settime(timer.get_ref(), TimerfdTimerFlags::empty(), &value)?;
        loop {
            let mut ready = timer.readable().await?;
            // A fired timer reads as the count of expirations; not yet fired, EAGAIN.
            let mut expirations = [0u8; 8];
            match rustix::io::read(timer.get_ref(), &mut expirations) {
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::AGAIN) => ready.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_sleeper_returns_at_its_instant_not_before() {
        let mut sleeper = Sleeper::new();
        #[cfg(target_os = "linux")]
        assert!(sleeper.precise(), "a timerfd is available on Linux");
        for micros in [0u64, 300, 1500] {
            let at = Instant::now() + Duration::from_micros(micros);
            sleeper.until(at).await;
            assert!(
                Instant::now() >= at,
                "returned before its instant ({micros} µs)"
            );
        }
        // An instant in the past returns at once.
        sleeper
            .until(Instant::now() - Duration::from_millis(5))
            .await;
    }
}
