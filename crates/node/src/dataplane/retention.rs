//! Log retention: the position each link holds the log from, saved and used to release
//! the log nobody holds; and FAILTHRESHOLD, which marks a receiver FAILED once the log
//! held for it grows past the master's limit.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hawser_control::state::ReceiverState;
use hawser_core::{Ident, Lsn, QualName};
use hawser_store::{Database, Position};
use tracing::warn;

use super::plan::{Known, Thresholds};
use super::running::Running;
use super::DataPlaneTask;

/// The name a link's position is kept under.
pub(super) fn position_name((scheme, receiver): &(QualName, Ident)) -> String {
    format!("{scheme}\u{1f}{receiver}")
}

/// The last LSN released from the log (the one before its first record).
pub(super) fn released_through(db: &Database) -> Lsn {
    Lsn(db.log_start().0.saturating_sub(1))
}

/// How long a proposal to mark a receiver FAILED is given before it is made again
/// (the Raft leader may have been away; setting FAILED twice changes nothing).
const FAIL_RETRY: Duration = Duration::from_secs(10);

/// Where the log a link holds is measured from, for a link whose receiver has not been
/// heard by this process: its saved position, but not before the link was first seen
/// here (`first_seen`, the last LSN then).
pub(super) struct Measured<'a> {
    pub(super) positions: &'a BTreeMap<String, Position>,
    pub(super) first_seen: &'a BTreeMap<(QualName, Ident), Lsn>,
}

/// The LSN after which a link's held log is measured (see [`check_fail_thresholds`]):
/// `acked` is the receiver's position, `heard` whether this process has streamed to
/// it, `since` the last LSN when this process first saw the link, `floor` the last
/// released LSN and `last` the log's end. `None`: nothing to measure.
fn measured_from(heard: bool, acked: Lsn, since: Lsn, floor: Lsn, last: Lsn) -> Option<Lsn> {
    if acked < floor {
        // The receiver lacks released log: past what a threshold can do.
        return None;
    }
    let from = if heard { acked } else { acked.max(since) };
    (from < last).then_some(from)
}

/// Marks receivers FAILED whose held log passed the master's FAILTHRESHOLD (in units
/// of `log_file_size` bytes): every link that holds log — its receiver in START or
/// PAUSE, streaming or not — is measured. A receiver this process has streamed to is
/// measured from the last position it acknowledged durably; one it has not (PAUSEd, not
/// connected since the master restarted, no address yet) from its saved position, or
/// from where the log stood when this process first saw the link if that is later: a
/// new subscriber is not blamed for the log kept before it existed, and one that was
/// down across a restart counts from the restart — later than it could, never
/// earlier. A link whose receiver already lacks released log is not measured: its
/// sender reports that it needs a duplicate.
pub(super) fn check_fail_thresholds(
    task: &DataPlaneTask,
    running: &BTreeMap<(QualName, Ident), Running>,
    thresholds: &Thresholds,
    known: &Known,
    measured: &Measured<'_>,
    failing: &mut BTreeMap<(QualName, Ident), Instant>,
) {
    // Proposed and since applied (the link no longer holds log), or given up on.
    failing.retain(|k, at| known.get(k) == Some(&true) && at.elapsed() < FAIL_RETRY);
    let floor = released_through(&task.db);
    let last = task.db.last_lsn();
    for (key, _) in known.iter().filter(|(_, holds)| **holds) {
        let threshold = thresholds.get(key).copied().unwrap_or(0);
        if threshold == 0 || failing.contains_key(key) {
            continue;
        }
        // The receiver may be gone: its last ack, not a fresh one, says where it is.
        let streamed = running.get(key).map(|r| {
            let s = r.handle.status();
            let s = s.borrow();
            (s.last_contact.is_some(), s.acked_lsn)
        });
        let (heard, acked) = match streamed {
            Some(s) => s,
            None => match measured.positions.get(&position_name(key)) {
                Some(p) => (false, p.lsn),
                None => continue,
            },
        };
        let since = measured.first_seen.get(key).copied().unwrap_or(last);
        let Some(from) = measured_from(heard, acked, since, floor, last) else {
            continue;
        };
        let limit = u64::from(threshold).saturating_mul(task.log_file_size);
        let held = match task.db.log_bytes_from(from.next()) {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "cannot measure the log held for a receiver");
                continue;
            }
        };
        if held <= limit {
            continue;
        }
        warn!(
            scheme = %key.0, receiver = %key.1, held, limit,
            has_sender = running.contains_key(key),
            "receiver passed FAILTHRESHOLD; marking it FAILED"
        );
        failing.insert(key.clone(), Instant::now());
        let plane = task.plane.clone();
        let cmd = hawser_control::Command::SetReceiverState {
            scheme: key.0.clone(),
            store: key.1.clone(),
            state: ReceiverState::Failed,
        };
        task.tracker.spawn(async move {
            if let Err(e) = plane.propose(cmd).await {
                warn!(error = %e, "could not mark the receiver FAILED; will retry");
            }
        });
    }
}

/// Saves the links' positions and releases the log nobody holds ([`super`]'s "Log
/// retention"). Positions only move forward; a link that holds log but has none yet
/// (its sender has not started: no address, a planning problem) gets the log's start,
/// so the log is held for it from the moment it appears.
pub(super) async fn retain_log(
    task: &DataPlaneTask,
    running: &BTreeMap<(QualName, Ident), Running>,
    known: &Known,
    positions: &mut BTreeMap<String, Position>,
) {
    let db = &task.db;
    let mut changes: Vec<(String, Option<Position>)> = Vec::new();
    let names: BTreeMap<String, bool> = known
        .iter()
        .map(|(k, holds)| (position_name(k), *holds))
        .collect();
    for name in positions.keys() {
        if !names.contains_key(name) {
            changes.push((name.clone(), None));
        }
    }
    for (key, r) in running {
        let acked = r.handle.status().borrow().acked_lsn;
        let name = position_name(key);
        let now = Position {
            lsn: acked,
            receiver: Some(r.link.receiver_node).filter(|n| n.0 != 0),
        };
        if positions
            .get(&name)
            .is_none_or(|p| p.lsn < acked || p.receiver != now.receiver)
        {
            changes.push((name, Some(now)));
        }
    }
    let floor = released_through(db);
    for (name, holds) in &names {
        if *holds && !positions.contains_key(name) && !changes.iter().any(|(n, _)| n == name) {
            changes.push((
                name.clone(),
                Some(Position {
                    lsn: floor,
                    receiver: None,
                }),
            ));
        }
    }
    if !changes.is_empty() {
        let saved = {
            let db = db.clone();
            let changes = changes.clone();
            tokio::task::spawn_blocking(move || db.set_positions(&changes)).await
        };
        match saved {
            Ok(Ok(())) => {
                for (name, lsn) in changes {
                    match lsn {
                        Some(lsn) => positions.insert(name, lsn),
                        None => positions.remove(&name),
                    };
                }
            }
            // Unsaved positions are not used for a release: try again next time.
            Ok(Err(e)) => {
                warn!(error = %e, "cannot save the streams' retained positions");
                return;
            }
            Err(e) => {
                warn!(error = %e, "saving the streams' retained positions panicked");
                return;
            }
        }
    }
    // Released through the lowest position of a link that holds log; with none, all
    // but the recent log kept anyway. A link whose receiver already lacks released log
    // (its sender says it needs a duplicate) is past helping and holds nothing.
    let through = names
        .iter()
        .filter(|(_, holds)| **holds)
        .filter_map(|(name, _)| positions.get(name).map(|p| p.lsn))
        .filter(|p| *p >= floor)
        .min()
        .unwrap_or_else(|| db.last_lsn());
    // A copy in progress (or just ended) keeps the log after its point: its receiver
    // resumes from there once set to START again.
    let through = match task.copy_holds.lowest() {
        Some(held) => through.min(held),
        None => through,
    };
    if through < db.log_start() || db.log_retained_bytes() <= task.log_keep_bytes {
        return;
    }
    let keep = task.log_keep_bytes;
    let released = {
        let db = db.clone();
        tokio::task::spawn_blocking(move || db.release_log(through, keep)).await
    };
    match released {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => {
            metrics::counter!("hawser_log_released_records_total").increment(n);
            tracing::debug!(records = n, log_start = db.log_start().0, "released log");
        }
        Ok(Err(e)) => warn!(error = %e, "cannot release the log"),
        Err(e) => warn!(error = %e, "releasing the log panicked"),
    }
}

#[cfg(test)]
mod tests {
    use super::measured_from;
    use hawser_core::Lsn;

    #[test]
    fn held_log_is_measured_from_the_position_or_from_when_the_link_was_first_seen() {
        let (floor, last) = (Lsn(10), Lsn(100));
        // Heard in this process: its acknowledged position, whenever it was first seen.
        assert_eq!(
            measured_from(true, Lsn(20), Lsn(90), floor, last),
            Some(Lsn(20))
        );
        // Not heard (paused, down across a restart, new): not before it was first seen.
        assert_eq!(
            measured_from(false, Lsn(20), Lsn(50), floor, last),
            Some(Lsn(50))
        );
        assert_eq!(
            measured_from(false, Lsn(60), Lsn(50), floor, last),
            Some(Lsn(60))
        );
        // Caught up: nothing held.
        assert_eq!(measured_from(true, last, Lsn(0), floor, last), None);
        assert_eq!(measured_from(false, Lsn(20), last, floor, last), None);
        // Lacks released log: its sender says it needs a duplicate.
        assert_eq!(measured_from(true, Lsn(9), Lsn(0), floor, last), None);
        assert_eq!(measured_from(false, Lsn(9), Lsn(50), floor, last), None);
    }
}
