//! The senders this node runs, one per (scheme, receiver store), and their re-plan:
//! a sender whose link or receiver address changed is stopped and a new one started
//! where the old one's receiver left off.

use std::collections::{BTreeMap, BTreeSet};

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

/// Takes out of `wanted` the links whose receiver address cannot be used, and says
/// why for each: reported with the plan's problems (once, and in `/replication`),
/// rather than warned about at every re-plan.
pub(super) fn unusable_addresses(
    wanted: &mut Wanted,
    tls: Option<&tonic::transport::ClientTlsConfig>,
) -> BTreeSet<String> {
    let mut problems = BTreeSet::new();
    wanted.retain(
        |(scheme, receiver), (_, addr)| match hawser_tls::endpoint(addr, tls) {
            Ok(_) => true,
            Err(e) => {
                problems.insert(format!(
                    "scheme {scheme}: no stream to {receiver}: its address {addr} cannot be \
                     used: {e}"
                ));
                false
            }
        },
    );
    problems
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

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_core::NodeId;

    #[test]
    fn a_link_whose_receiver_address_cannot_be_used_is_a_problem_not_a_sender() {
        let links = crate::dataplane::testing::planned(
            "CREATE REPLICATION r ELEMENT e TABLE t MASTER ds1 SUBSCRIBER ds2, ds3",
        );
        let nodes = (1..=3)
            .map(|i| (Ident::unquoted(&format!("ds{i}")), NodeId(i)))
            .collect();
        let epochs = BTreeMap::from([(Ident::unquoted("e"), hawser_core::Epoch(1))]);
        let mut wanted: Wanted = links
            .iter()
            .map(|l| {
                let config = LinkConfig::from_link(l, 1, &nodes, &epochs).expect("a link");
                let addr = if l.receiver == Ident::unquoted("ds2") {
                    "127.0.0.1:7002"
                } else {
                    "not an address\n"
                };
                (
                    (QualName::bare("r"), l.receiver.clone()),
                    (config, addr.to_string()),
                )
            })
            .collect();
        assert_eq!(wanted.len(), 2);
        let problems = unusable_addresses(&mut wanted, None);
        assert_eq!(wanted.len(), 1, "{problems:?}");
        assert!(wanted.contains_key(&(QualName::bare("r"), Ident::unquoted("ds2"))));
        assert_eq!(problems.len(), 1);
        let p = problems.first().unwrap();
        assert!(
            p.contains("no stream to ds3") && p.contains("cannot be used"),
            "{p}"
        );
    }
}
