//! A drill's network partition, in process: while it lasts, this process neither sends
//! nor takes peer traffic (Raft RPCs, liveness reports, replication streams); client
//! traffic goes on, so clients can still reach a master that is cut off from its peers —
//! the case a master lease exists for.
//!
//! Process-wide on purpose: it stands in for the network around the process, which is
//! one per node. Set only by `Admin.Fault` ("isolate", `hawser drill isolate-master`);
//! checked by every peer path (`hawser-control`'s peer calls and service, the
//! replication sender and receiver). One atomic load when not isolated.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Milliseconds since [`origin`] until which the process is isolated (0: not).
static UNTIL_MS: AtomicU64 = AtomicU64::new(0);

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    origin().elapsed().as_millis() as u64 + 1
}

/// Cuts this process off from its peers for `d` from now (replacing any cut under way).
pub fn isolate_for(d: Duration) {
    UNTIL_MS.store(now_ms() + d.as_millis() as u64, Ordering::Release);
}

/// Whether peer traffic is cut now.
pub fn isolated() -> bool {
    let until = UNTIL_MS.load(Ordering::Acquire);
    until != 0 && now_ms() < until
}

/// The error text of a peer call or stream refused because of it.
pub const REFUSAL: &str = "isolated from its peers by a drill (Admin.Fault isolate)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_isolation_lasts_its_time() {
        assert!(!isolated());
        isolate_for(Duration::from_millis(200));
        assert!(isolated());
        let deadline = Instant::now() + Duration::from_secs(5);
        while isolated() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!isolated());
    }
}
