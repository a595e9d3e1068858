//! What a stream carries of origins other than its sender: an element's earlier
//! masters after a failover, by store or by node id, and where a relay cannot see the
//! transactions a stream beside it sends (blind paths, transactions received in parts).

use std::collections::{BTreeMap, BTreeSet};

use hawser_core::{Ident, NodeId, QualName};
use hawser_scheme::route::Link;
use hawser_stream::{DatastoreRule, LinkConfig};

/// Master catch-up after a failover (DESIGN §5): the current master of an element also
/// sends each subscriber the transactions of the element's earlier masters, origin
/// kept, that it holds and the subscriber lacks. A subscriber that was behind the
/// promoted one when its old master died thereby gets every commit up to the fork
/// point before the new master's own (each origin has its own high-water, and the
/// stream resumes from the receiver's): the surviving copies converge. An earlier
/// master is never sent its own transactions back.
///
/// An earlier master whose store no node holds now (removed) is left to
/// [`relay_replaced_masters`], which relays by node id: a link naming a store without a
/// node could not be streamed at all.
pub(super) fn add_relays(
    links: &mut [Link],
    s: &hawser_control::state::SchemeState,
    nodes: &BTreeMap<Ident, NodeId>,
) {
    for link in links.iter_mut() {
        let mut relays = Vec::new();
        for t in link.tables.iter().filter(|t| t.origin == link.sender) {
            let Some(history) = s.elements.get(&t.element).map(|e| &e.history) else {
                continue;
            };
            let earlier: BTreeSet<&Ident> = history
                .iter()
                .map(|r| &r.master)
                .filter(|m| **m != link.sender && **m != link.receiver)
                .filter(|m| nodes.contains_key(*m))
                .collect();
            for master in earlier {
                let mut relay = t.clone();
                relay.origin = master.clone();
                relays.push(relay);
            }
        }
        for relay in relays {
            let carried = link
                .tables
                .iter()
                .any(|t| t.table == relay.table && t.origin == relay.origin);
            if !carried {
                link.tables.push(relay);
            }
        }
    }
}

/// Earlier masters of the link's elements whose store another node holds now (one
/// replaced on an empty data directory, `--replace`) or nobody: their transactions carry
/// the old node's id, which the store-keyed plan ([`add_relays`]) maps to no node. The
/// sender relays them by that id like any earlier master's, to every receiver — the
/// store's new holder included, which never had them (an earlier master is never sent
/// its own transactions back: that is by node, and the new holder is another node).
pub(super) fn relay_replaced_masters(
    config: &mut LinkConfig,
    s: &hawser_control::state::SchemeState,
    nodes: &BTreeMap<Ident, NodeId>,
) {
    let (sender, receiver) = (config.sender_node, config.receiver_node);
    let replaced = |element: &Ident| -> Vec<NodeId> {
        s.elements
            .get(element)
            .map(|e| {
                e.history
                    .iter()
                    .filter_map(|r| r.node.filter(|n| nodes.get(&r.master) != Some(n)))
                    .filter(|n| *n != sender && *n != receiver)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut tables = Vec::new();
    for ((table, origin), element) in &config.tables {
        if *origin == sender {
            for old in replaced(element) {
                tables.push(((table.clone(), old), element.clone()));
            }
        }
    }
    for (key, element) in tables {
        config.tables.entry(key).or_insert(element);
    }
    let mut rules = Vec::new();
    for rule in config.datastore.iter().filter(|r| r.origin == sender) {
        for old in replaced(&rule.element) {
            let known = config
                .datastore
                .iter()
                .any(|r| r.element == rule.element && r.origin == old);
            if !known {
                rules.push(DatastoreRule {
                    origin: old,
                    ..rule.clone()
                });
            }
        }
    }
    config.datastore.extend(rules);
}

/// A table of `origin` that `sender` sends `receiver`, which this store also sends
/// `origin`'s transactions to, and which this store does not receive: this store's
/// log lacks those transactions, so its stream cannot see them to wait for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unseen {
    pub(super) store: Ident,
    pub(super) receiver: Ident,
    pub(super) origin: Ident,
    pub(super) sender: Ident,
    pub(super) table: QualName,
}

/// Where this store forwards another origin's transactions to a receiver that also
/// gets some of that origin's tables from another sender, in tables this store does
/// not receive (see [`Unseen`]).
pub(super) fn unseen_paths(store: &Ident, links: &[Link]) -> Vec<Unseen> {
    let inbound: BTreeSet<(&QualName, &Ident)> = links
        .iter()
        .filter(|l| &l.receiver == store)
        .flat_map(|l| l.tables.iter().map(|t| (&t.table, &t.origin)))
        .collect();
    let mut out = Vec::new();
    for mine in links.iter().filter(|l| &l.sender == store) {
        let forwarded: BTreeSet<&Ident> = mine
            .tables
            .iter()
            .map(|t| &t.origin)
            .filter(|o| *o != store)
            .collect();
        for other in links
            .iter()
            .filter(|l| &l.sender != store && l.receiver == mine.receiver)
        {
            for t in &other.tables {
                if forwarded.contains(&t.origin) && !inbound.contains(&(&t.table, &t.origin)) {
                    out.push(Unseen {
                        store: store.clone(),
                        receiver: mine.receiver.clone(),
                        origin: t.origin.clone(),
                        sender: other.sender.clone(),
                        table: t.table.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Whether another sender's stream to `receiver` is blind for an origin this store
/// relays there, because of a table this store sends that the other does not receive:
/// that stream waits for what this store's stream decides about the origin
/// (`LinkConfig::read_by_siblings`).
pub(super) fn read_by_siblings(store: &Ident, receiver: &Ident, links: &[Link]) -> bool {
    let others: BTreeSet<&Ident> = links
        .iter()
        .filter(|l| &l.receiver == receiver && &l.sender != store)
        .map(|l| &l.sender)
        .collect();
    others.into_iter().any(|x| {
        unseen_paths(x, links)
            .iter()
            .any(|u| &u.receiver == receiver && &u.sender == store && &u.origin != store)
    })
}

/// The origins this store gets from two relays that each carry tables of the origin
/// the other does not receive: a transaction writing tables of both reaches it in two
/// parts, two log records under one Gtid, and a stream relaying the origin on from here
/// ships both (`LinkConfig::parts`; docs/stream.md, "Two blind relays").
pub(super) fn received_in_parts(store: &Ident, links: &[Link]) -> BTreeSet<Ident> {
    let senders: BTreeSet<&Ident> = links
        .iter()
        .filter(|l| &l.receiver == store)
        .map(|l| &l.sender)
        .collect();
    senders
        .into_iter()
        .flat_map(|x| unseen_paths(x, links))
        .filter(|u| &u.receiver == store && u.sender != u.origin)
        .map(|u| u.origin)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{read_by_siblings, received_in_parts, unseen_paths, Unseen};
    use crate::dataplane::plan::link_config;
    use crate::dataplane::testing::{failed_over, planned};
    use hawser_core::{Ident, NodeId, QualName};
    use hawser_scheme::route::Link;

    #[test]
    fn after_a_failover_the_new_master_relays_its_predecessors_transactions() {
        let st = failed_over(
            "CREATE REPLICATION r ELEMENT e TABLE t \
             MASTER ds1 SUBSCRIBER ds2 RETURN TWOSAFE SUBSCRIBER ds3",
            9,
        );
        let s = &st.schemes[&QualName::bare("r")];
        let mut links = planned(&hawser_scheme::print_scheme(&s.scheme));
        let mut nodes: std::collections::BTreeMap<Ident, NodeId> =
            st.nodes.values().map(|n| (n.store.clone(), n.id)).collect();
        super::add_relays(&mut links, s, &nodes);
        let carried = |links: &[Link], to: &str| -> Vec<String> {
            let l = links.iter().find(|l| l.receiver.as_str() == to).unwrap();
            assert_eq!(l.sender.as_str(), "ds2");
            l.tables.iter().map(|t| t.origin.to_string()).collect()
        };
        assert_eq!(
            carried(&links, "ds3"),
            ["ds2", "ds1"],
            "ds1's commits ds3 lacks"
        );
        assert_eq!(carried(&links, "ds1"), ["ds2"], "never its own back to ds1");

        // ds1 replaced on an empty data directory by node 7: the store-keyed relay
        // would name node 7, which has no such commits; node 1's go by its id, to ds3
        // and to the new ds1 alike.
        nodes.insert(Ident::unquoted("ds1"), NodeId(7));
        let epochs = s
            .elements
            .iter()
            .map(|(n, e)| (n.clone(), e.epoch))
            .collect();
        let config = |to: &str| {
            let mut links = planned(&hawser_scheme::print_scheme(&s.scheme));
            super::add_relays(&mut links, s, &nodes);
            let link = links.iter().find(|l| l.receiver.as_str() == to).unwrap();
            let mut c = link_config(link, s.version, &nodes, &epochs, &Default::default())
                .expect("a stream");
            super::relay_replaced_masters(&mut c, s, &nodes);
            c.tables.keys().map(|(_, o)| o.0).collect::<Vec<_>>()
        };
        assert_eq!(
            config("ds1"),
            [1, 2],
            "the new ds1 gets the old one's commits"
        );
        assert!(
            config("ds3").contains(&1),
            "ds3 still gets node 1's commits"
        );
        // ds1 removed for good: its store has no node; the stream is still planned,
        // and node 1's commits still relayed.
        nodes.remove(&Ident::unquoted("ds1"));
        let mut links = planned(&hawser_scheme::print_scheme(&s.scheme));
        super::add_relays(&mut links, s, &nodes);
        assert_eq!(carried(&links, "ds3"), ["ds2"]);
        let link = links.iter().find(|l| l.receiver.as_str() == "ds3").unwrap();
        let mut c = link_config(link, s.version, &nodes, &epochs, &Default::default())
            .expect("a stream without the removed store");
        super::relay_replaced_masters(&mut c, s, &nodes);
        assert!(c.tables.keys().any(|(_, o)| o.0 == 1));
    }

    #[test]
    fn a_relay_that_cannot_see_a_transaction_it_races_is_blind_for_its_origin() {
        let ds = |s: &str| Ident::unquoted(s);
        // The demo's scheme: ds2 receives both tables, so it sees every transaction
        // of ds1 that ds1 sends ds3 itself, and waits for it (LinkConfig::siblings).
        let sees_all = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds2 RETURN TWOSAFE SUBSCRIBER ds3
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2 RETURN TWOSAFE
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3",
        );
        for store in ["ds1", "ds2", "ds3"] {
            assert!(unseen_paths(&ds(store), &sees_all).is_empty());
        }
        // ds2 does not receive accounts: it cannot see ds1's transactions of it, so it
        // waits for ds1's own stream to decide about each (LinkConfig::blind).
        let blind = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds3
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3",
        );
        let unseen = unseen_paths(&ds("ds2"), &blind);
        assert_eq!(
            unseen,
            [Unseen {
                store: ds("ds2"),
                receiver: ds("ds3"),
                origin: ds("ds1"),
                sender: ds("ds1"),
                table: QualName::bare("accounts"),
            }]
        );
        // Only the propagator is blind; the master sees all of its own log.
        assert!(unseen_paths(&ds("ds1"), &blind).is_empty());
        // Two relays of ds1 to ds3, each blind to the other's table: each is blind
        // for ds1 by the other relay's stream, and waits for its decisions.
        let relays = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds4
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
             ELEMENT a2 TABLE accounts PROPAGATOR ds4 SUBSCRIBER ds3
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3",
        );
        for (store, other, table) in [("ds2", "ds4", "accounts"), ("ds4", "ds2", "events")] {
            assert_eq!(
                unseen_paths(&ds(store), &relays),
                [Unseen {
                    store: ds(store),
                    receiver: ds("ds3"),
                    origin: ds("ds1"),
                    sender: ds(other),
                    table: QualName::bare(table),
                }]
            );
        }
        // ds3 gets ds1's transactions in parts; relaying ds1's events on to ds5, its
        // stream ships both parts of one (LinkConfig::parts).
        let on = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds4
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
             ELEMENT a2 TABLE accounts PROPAGATOR ds4 SUBSCRIBER ds3
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3
             ELEMENT e3 TABLE events PROPAGATOR ds3 SUBSCRIBER ds5",
        );
        assert_eq!(received_in_parts(&ds("ds3"), &on), [ds("ds1")].into());
        // Who says what it decides about ds1 for whom: each of the two relays for the
        // other; in the demo's shape nobody (ds2 sees all, and ds1's stream decides
        // about its own commits anyway); with a blind propagator, not ds1 either.
        let (ds1, ds2, ds3, ds4) = (ds("ds1"), ds("ds2"), ds("ds3"), ds("ds4"));
        assert!(read_by_siblings(&ds2, &ds3, &relays));
        assert!(read_by_siblings(&ds4, &ds3, &relays));
        assert!(!read_by_siblings(&ds2, &ds3, &sees_all));
        assert!(!read_by_siblings(&ds1, &ds3, &sees_all));
        assert!(!read_by_siblings(&ds1, &ds3, &blind));
        assert!(!read_by_siblings(&ds2, &ds3, &blind));
        // One relay sees all (ds2 receives accounts too), the other does not: only the
        // one that sees all is waited for.
        let mixed = planned(
            "CREATE REPLICATION r
             ELEMENT a TABLE accounts MASTER ds1 SUBSCRIBER ds2, ds4
             ELEMENT e TABLE events MASTER ds1 SUBSCRIBER ds2
             ELEMENT a2 TABLE accounts PROPAGATOR ds4 SUBSCRIBER ds3
             ELEMENT e2 TABLE events PROPAGATOR ds2 SUBSCRIBER ds3",
        );
        assert!(read_by_siblings(&ds2, &ds3, &mixed));
        assert!(!read_by_siblings(&ds4, &ds3, &mixed));
        for store in ["ds1", "ds2", "ds4", "ds5"] {
            assert!(received_in_parts(&ds(store), &on).is_empty(), "{store}");
        }
    }
}
