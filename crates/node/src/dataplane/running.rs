//! The senders this node runs, one per (scheme, receiver store), and their re-plan:
//! a sender whose link or receiver address changed is stopped and a new one started
//! where the old one's receiver left off.

use std::collections::BTreeMap;

use hawser_core::{Ident, Lsn, QualName};
use hawser_store::Position;
use hawser_stream::{LinkConfig, SenderHandle, SenderStart, StreamSender};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::plan::Wanted;
use super::retention::{position_name, released_through};
use super::DataPlaneTask;

/// One running sender and what it was started with.
pub(super) struct Running {
    pub(super) link: LinkConfig,
    pub(super) addr: String,
    pub(super) handle: SenderHandle,
    pub(super) stop: CancellationToken,
}

/// Stops senders no longer wanted or wanted differently, starts the missing ones.
pub(super) fn reconcile(
    task: &DataPlaneTask,
    running: &mut BTreeMap<(QualName, Ident), Running>,
    mut wanted: Wanted,
    positions: &BTreeMap<String, Position>,
) {
    // The status of a sender replaced by a new one (same link, new settings), which
    // carries its counters and acknowledged position on.
    let mut replaced: BTreeMap<(QualName, Ident), hawser_stream::SenderStatus> = BTreeMap::new();
    running.retain(|key, r| {
        let keep = wanted
            .get(key)
            .is_some_and(|(link, addr)| *link == r.link && *addr == r.addr);
        if !keep {
            info!(scheme = %key.0, receiver = %key.1, "stopping sender");
            r.stop.cancel();
            if wanted.contains_key(key) {
                replaced.insert(key.clone(), r.handle.status().borrow().clone());
            }
        }
        keep
    });
    wanted.retain(|key, _| !running.contains_key(key));
    for (key, (link, addr)) in wanted {
        let endpoint = match hawser_tls::endpoint(&addr, task.peer_tls.as_ref()) {
            Ok(e) => e,
            Err(e) => {
                warn!(receiver = %key.1, %addr, error = %e, "bad receiver address");
                continue;
            }
        };
        // A link seen before resumes at its position; a new one starts with the log
        // as it is now. A position another node acknowledged (the store's name given to
        // a node replaced on an empty data directory) is not this one's: it starts
        // from nothing, so that it gets the whole log or is told it needs a duplicate
        // (its marks lack what the log released) — never streamed to as current.
        let resume_after = match positions.get(&position_name(&key)) {
            Some(p)
                if link.receiver_node.0 != 0
                    && p.receiver.is_some_and(|n| n != link.receiver_node) =>
            {
                warn!(
                    scheme = %key.0, receiver = %key.1,
                    acknowledged_by = p.receiver.map_or(0, |n| n.0),
                    now = link.receiver_node.0,
                    "the receiver's store is held by another node than the one that \
                     acknowledged its position: streaming from the log's start"
                );
                Lsn::ZERO
            }
            Some(p) => p.lsn,
            None => released_through(&task.db),
        };
        info!(
            scheme = %key.0, receiver = %key.1, %addr, version = link.scheme_version,
            resume_after = resume_after.0, "starting sender"
        );
        let stop = task.shutdown.child_token();
        let start = SenderStart {
            resume_after,
            previous: replaced.remove(&key),
            on_ack: Some(task.returns.ack_hook(key.1.clone())),
            upstream: Some(task.decided.clone()),
        };
        let handle = StreamSender::spawn(
            link.clone(),
            task.db.clone(),
            endpoint,
            start,
            &task.tracker,
            stop.clone(),
        );
        running.insert(
            key,
            Running {
                link,
                addr,
                handle,
                stop,
            },
        );
    }
    let mut senders = task.senders.lock();
    *senders = running
        .iter()
        .map(|(k, r)| (k.clone(), r.handle.clone()))
        .collect();
}
