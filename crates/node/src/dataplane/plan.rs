//! The plan of links from the cluster state: which streams this store sends, with
//! each one's [`LinkConfig`] and receiver address, and what the plan gives the return
//! services and the database (routes, write refusals) on the way.

use std::collections::{BTreeMap, BTreeSet};

use hawser_control::state::ReceiverState;
use hawser_control::ClusterState;
use hawser_core::{Epoch, Ident, NodeId, QualName};
use hawser_scheme::ast::ReturnService;
use hawser_scheme::route::{Link, ResolvedTarget};
use hawser_scheme::Topology;
use hawser_store::Database;
use hawser_stream::returns::{ReplicationState, ReturnLevel, ReturnRoutes, ReturnSettings};
use hawser_stream::{DatastoreRule, LinkConfig};
use tracing::warn;

use super::forks::{forked_ranges, past_fork_points, ForkVerdicts};
use super::relays::{
    add_relays, read_by_siblings, received_in_parts, relay_replaced_masters, unseen_paths,
};
use super::targets::inbound_targets;
use crate::returns::Returns;

/// The senders the cluster state asks for: link and receiver address, by (scheme,
/// receiver store).
pub(super) type Wanted = BTreeMap<(QualName, Ident), (LinkConfig, String)>;

/// FAILTHRESHOLD of the master's STORE clause for each link it sends, whatever its
/// receiver's state (0 = no limit).
pub(super) type Thresholds = BTreeMap<(QualName, Ident), u32>;

/// The links this store sends in the cluster state, whatever their receiver's state
/// (`true`: START or PAUSE, so the link holds log).
pub(super) type Known = BTreeMap<(QualName, Ident), bool>;

/// What the routing plans are made from ([`crate::cluster::topology`]: this node's
/// catalog for `store`, the reported ones for the others); and the stores' node ids.
pub(crate) fn local_topology(
    state: &ClusterState,
    db: &Database,
    store: &Ident,
) -> (Topology, BTreeMap<Ident, NodeId>) {
    let topology = crate::cluster::topology(state, db, store);
    let nodes = topology.nodes.clone();
    (topology, nodes)
}

/// What [`wanted_links`] plans for this store.
pub(super) struct Planned {
    /// The links it sends.
    pub(super) wanted: Wanted,
    /// Why some cannot be streamed now, and what is wrong with its targets.
    pub(super) problems: BTreeSet<String>,
    /// The target of each table it receives, by source table.
    pub(super) targets: BTreeMap<QualName, ResolvedTarget>,
}

/// The links `store` sends, with the receiver's gRPC address, by (scheme, receiver);
/// and why some links cannot be streamed now. Also gives `returns` the routes of this
/// store's return services and the database the tables it receives (refused to
/// client writes).
pub(super) fn wanted_links(
    state: &ClusterState,
    db: &Database,
    store: &Ident,
    returns: &Returns,
    thresholds: &mut Thresholds,
    known: &mut Known,
    forks: &mut ForkVerdicts,
) -> Planned {
    thresholds.clear();
    known.clear();
    let mut replication: BTreeMap<Ident, ReplicationState> = BTreeMap::new();
    // Before the catalog is read: tables replicated DDL creates from here on stay
    // refused until a later plan has seen them (`Database::set_write_refusals`).
    let seen = db.catalog_generation();
    let (topology, nodes) = local_topology(state, db, store);
    db.set_store_names(
        nodes
            .iter()
            .map(|(store, id)| (*id, store.to_string()))
            .collect(),
    );
    let mut out = BTreeMap::new();
    let mut problems = BTreeSet::new();
    let mut all_links = Vec::new();
    let mut ds_routes: Vec<DatastoreRoute> = Vec::new();
    let mut received: Vec<(QualName, String)> = Vec::new();
    // Streams other nodes send: (scheme, sender, receiver) and what each carries.
    let mut foreign: Vec<((QualName, Ident, Ident), LinkConfig)> = Vec::new();
    // Every scheme's planned streams, whoever sends them.
    let mut planned: Vec<Link> = Vec::new();
    // Per origin, the senders of the streams into this store that carry it and run
    // (this store in START or PAUSE as their receiver).
    let mut upstream: BTreeMap<NodeId, BTreeSet<NodeId>> = BTreeMap::new();
    for (name, s) in &state.schemes {
        let mut plan = match hawser_scheme::plan(&s.scheme, &topology) {
            Ok(p) => p,
            Err(errors) => {
                let first = errors
                    .first()
                    .map(|e| e.message.clone())
                    .unwrap_or_default();
                problems.insert(format!("scheme {name}: cannot plan its streams: {first}"));
                continue;
            }
        };
        add_relays(&mut plan.links, s, &nodes);
        // A return service the cluster state disables is not waited for: commits to
        // the subscriber go asynchronously, as the failover choice assumes
        // (`failover::decide` counts a subscriber a holder of acknowledged commits
        // only while its return service is enabled). A master deposed by a failover
        // has its receiver STOPPED and its return service DISABLED in the same Raft
        // entry: nothing waits for it, whatever RETURN SERVICES ... WHEN REPLICATION
        // STOPPED says, until it has rejoined.
        for link in &mut plan.links {
            let disabled = s.return_service_state(&link.receiver)
                == hawser_control::state::ReturnServiceState::Disabled;
            if disabled {
                for t in &mut link.tables {
                    t.return_service = hawser_scheme::ast::ReturnService::NoReturn;
                    t.return_when_stopped = false;
                }
            }
        }
        let epochs: BTreeMap<Ident, Epoch> = s
            .elements
            .iter()
            .map(|(n, e)| (n.clone(), e.epoch))
            .collect();
        // DATASTORE elements: their INCLUDE / EXCLUDE table lists, so tables created
        // after this plan are carried (and waited for) too.
        let datastore: BTreeMap<&Ident, TableLists> = s
            .scheme
            .elements
            .iter()
            .filter(|e| matches!(e.kind, hawser_scheme::ast::ElementKind::Datastore))
            .map(|e| (&e.name, table_lists(e)))
            .collect();
        for link in plan.links.iter().filter(|l| &l.sender == store) {
            let mut seen = BTreeSet::new();
            for t in link.tables.iter().filter(|t| &t.origin == store) {
                let Some((include, exclude)) = datastore.get(&t.element) else {
                    continue;
                };
                if seen.insert(&t.element) {
                    ds_routes.push((
                        link.receiver.clone(),
                        include.clone(),
                        exclude.clone(),
                        t.return_service,
                        t.return_when_stopped,
                    ));
                }
            }
        }
        for link in plan.links.iter().filter(|l| &l.receiver == store) {
            if matches!(
                s.receiver_state(store),
                ReceiverState::Start | ReceiverState::Pause
            ) {
                let origins = link.tables.iter().map(|t| &t.origin);
                let origins = origins.chain(link.sequences.iter().map(|q| &q.origin));
                for origin in origins.filter(|o| *o != store) {
                    if let (Some(o), Some(from)) = (nodes.get(origin), nodes.get(&link.sender)) {
                        upstream.entry(*o).or_default().insert(*from);
                    }
                }
            }
            for t in link.tables.iter().filter(|t| &t.origin != store) {
                // What this store writes: the target table (and a BASE AGGREGATE's
                // copy of the source).
                for written in hawser_target::written_tables(&t.table, &t.target) {
                    received.push((
                        written,
                        format!(
                            "{store} receives it from master {} (scheme {name}, element {}); \
                             write it on {}",
                            t.origin, t.element, t.origin
                        ),
                    ));
                }
            }
        }
        all_links.extend(plan.links.iter().filter(|l| &l.sender == store).cloned());
        for link in plan.links.iter().filter(|l| &l.sender == store) {
            if link.tables.is_empty() && link.sequences.is_empty() {
                continue;
            }
            // PAUSE, STOP and FAILED receivers get nothing; commits stop waiting for
            // them under RETURN SERVICES OFF WHEN REPLICATION STOPPED.
            let rstate = match s.receiver_state(&link.receiver) {
                ReceiverState::Start => ReplicationState::Start,
                ReceiverState::Pause => ReplicationState::Pause,
                ReceiverState::Stop => ReplicationState::Stop,
                ReceiverState::Failed => ReplicationState::Failed,
            };
            known.insert(
                (name.clone(), link.receiver.clone()),
                matches!(rstate, ReplicationState::Start | ReplicationState::Pause),
            );
            thresholds.insert(
                (name.clone(), link.receiver.clone()),
                link.sender_settings.fail_threshold,
            );
            let e = replication.entry(link.receiver.clone()).or_default();
            if rstate != ReplicationState::Start {
                *e = rstate;
                continue;
            }
            let config = match link_config(link, s.version, &nodes, &epochs, &datastore) {
                Ok(mut c) => {
                    relay_replaced_masters(&mut c, s, &nodes);
                    c
                }
                Err(e) => {
                    let to = &link.receiver;
                    problems.insert(format!("scheme {name}: no stream to {to} yet: {e}"));
                    continue;
                }
            };
            let Some(addr) = state
                .node_by_store(&link.receiver)
                .map(|n| n.grpc_addr.clone())
            else {
                continue;
            };
            out.insert((name.clone(), link.receiver.clone()), (config, addr));
        }
        // The streams other nodes send that run (their receiver in START): a receiver
        // they share with this node's gets some origin's transactions by both.
        for link in plan.links.iter().filter(|l| &l.sender != store) {
            if s.receiver_state(&link.receiver) != ReceiverState::Start {
                continue;
            }
            // A sender stopped or failed as a receiver of this scheme gets no other
            // origin's commits to relay: nobody waits for it to relay them (its own
            // commits it still sends).
            let relays = !matches!(
                s.receiver_state(&link.sender),
                ReceiverState::Stop | ReceiverState::Failed
            );
            let mut link = link.clone();
            if !relays {
                link.tables.retain(|t| t.origin == link.sender);
                link.sequences.retain(|t| t.origin == link.sender);
            }
            if link.tables.is_empty() && link.sequences.is_empty() {
                continue;
            }
            if let Ok(mut config) = link_config(&link, s.version, &nodes, &epochs, &datastore) {
                if relays {
                    relay_replaced_masters(&mut config, s, &nodes);
                }
                foreign.push((
                    (name.clone(), link.sender.clone(), link.receiver.clone()),
                    config,
                ));
            }
        }
        planned.extend(plan.links.iter().cloned());
    }
    // Every stream to the same receiver node — from this node (several schemes) or
    // from another (a propagator beside a master's own stream) — keeps each origin's
    // transactions in seq order between them (`LinkConfig::siblings`): the receiver
    // keeps one high-water per origin.
    let configs: Vec<((QualName, Ident, Ident), LinkConfig)> = out
        .iter()
        .map(|((scheme, receiver), (c, _))| {
            ((scheme.clone(), store.clone(), receiver.clone()), c.clone())
        })
        .chain(foreign)
        .collect();
    let (targets, target_problems) = inbound_targets(store, &planned);
    problems.extend(target_problems);
    let unseen = unseen_paths(store, &planned);
    let in_parts: BTreeSet<NodeId> = received_in_parts(store, &planned)
        .iter()
        .filter_map(|o| nodes.get(o).copied())
        .collect();
    for ((scheme, receiver), (config, _)) in out.iter_mut() {
        let own = (scheme.clone(), store.clone(), receiver.clone());
        config.siblings = configs
            .iter()
            .filter(|(k, c)| *k != own && c.receiver_node == config.receiver_node)
            .map(|(_, c)| c.clone())
            .collect();
        // Origins this stream relays without seeing all their transactions that a
        // stream running beside it (the origin's own, or another relay's) sends the
        // same receiver.
        config.blind = unseen
            .iter()
            .filter(|u| &u.receiver == receiver)
            .filter_map(|u| Some((*nodes.get(&u.origin)?, *nodes.get(&u.sender)?)))
            .filter(|(_, from)| config.siblings.iter().any(|s| s.sender_node == *from))
            .map(|(origin, _)| origin)
            .collect();
        config.upstream.clone_from(&upstream);
        // Origins this store gets in parts, which this stream relays on.
        config.parts = in_parts
            .iter()
            .copied()
            .filter(|o| config.carries_origin(*o))
            .collect();
        // The receiver relays an origin this stream carries beside another path to
        // the same store: it needs this stream's decisions about that origin.
        config.read_by_siblings = read_by_siblings(store, receiver, &planned);
        config.feeds_relay = unseen_paths(receiver, &planned).iter().any(|u| {
            nodes
                .get(&u.origin)
                .is_some_and(|o| *o != config.sender_node && config.carries_origin(*o))
        });
    }
    set_returns(returns, store, &all_links, ds_routes);
    returns.set_replication(replication);
    // A table this store also masters (bidirectional, general workload) stays writable.
    let mastered: BTreeSet<&QualName> = all_links
        .iter()
        .flat_map(|l| l.tables.iter())
        .filter(|t| &t.origin == store)
        .map(|t| &t.table)
        .collect();
    let mut refusals = std::collections::HashMap::new();
    for (table, reason) in received {
        if !mastered.contains(&table) {
            refusals.entry(table).or_insert(reason);
        }
    }
    db.set_write_refusals(refusals, seen);
    // What failovers forked off is never shipped, whoever masters now.
    let forked = forked_ranges(state);
    for (config, _) in out.values_mut() {
        config.forked.clone_from(&forked);
    }
    match db.high_waters() {
        Ok(held) => problems.extend(past_fork_points(state, store, &held, |f| {
            forks.holds(db, &f)
        })),
        Err(e) => warn!(error = %e, "cannot read the high-water marks"),
    }
    Planned {
        wanted: out,
        problems,
        targets,
    }
}

/// The stream `link` plans, for one of this node's senders or as another node's
/// stream a sender of this node must keep order with (`LinkConfig::siblings`).
pub(super) fn link_config(
    link: &Link,
    version: u64,
    nodes: &BTreeMap<Ident, NodeId>,
    epochs: &BTreeMap<Ident, Epoch>,
    datastore: &BTreeMap<&Ident, TableLists>,
) -> Result<LinkConfig, hawser_stream::LinkError> {
    let mut config = LinkConfig::from_link(link, version, nodes, epochs)?;
    config.replicate_ddl = link
        .tables
        .iter()
        .any(|t| datastore.contains_key(&t.element));
    let mut rules: BTreeMap<(Ident, NodeId), DatastoreRule> = BTreeMap::new();
    for t in &link.tables {
        let (Some((include, exclude)), Some(origin)) =
            (datastore.get(&t.element), nodes.get(&t.origin))
        else {
            continue;
        };
        rules
            .entry((t.element.clone(), *origin))
            .or_insert_with(|| DatastoreRule {
                element: t.element.clone(),
                origin: *origin,
                include: include.clone(),
                exclude: exclude.clone(),
            });
    }
    config.datastore = rules.into_values().collect();
    Ok(config)
}

/// A DATASTORE element's INCLUDE TABLE names (`None`: every table) and EXCLUDE TABLE
/// names.
type TableLists = (Option<BTreeSet<QualName>>, BTreeSet<QualName>);

/// A DATASTORE element's return service to one subscriber: (subscriber, lists,
/// service, RETURN SERVICES ON WHEN REPLICATION STOPPED).
type DatastoreRoute = (
    Ident,
    Option<BTreeSet<QualName>>,
    BTreeSet<QualName>,
    ReturnService,
    bool,
);

fn table_lists(el: &hawser_scheme::ast::Element) -> TableLists {
    use hawser_scheme::ast::{InclusionAction, ObjectType};
    let mut include: Option<BTreeSet<QualName>> = None;
    let mut exclude = BTreeSet::new();
    for inc in &el.inclusions {
        let names = inc
            .groups
            .iter()
            .filter(|g| g.object_type == ObjectType::Table)
            .flat_map(|g| g.names.iter().map(|n| n.name.clone()));
        match inc.action {
            InclusionAction::Include => include.get_or_insert_with(BTreeSet::new).extend(names),
            InclusionAction::Exclude => exclude.extend(names),
        }
    }
    (include, exclude)
}

/// Gives the return services the routes of the links this store sends and the
/// master's STORE settings (the first scheme's that names any).
fn set_returns(returns: &Returns, store: &Ident, links: &[Link], ds_routes: Vec<DatastoreRoute>) {
    let mut routes = ReturnRoutes::from_links(store, links.iter());
    for (subscriber, include, exclude, service, when_stopped) in ds_routes {
        routes.add_datastore(subscriber, include, exclude, service, when_stopped);
    }
    let mut subscribers: BTreeMap<Ident, ReturnLevel> = BTreeMap::new();
    let mut settings = None;
    for link in links {
        for t in link.tables.iter().filter(|t| &t.origin == store) {
            let level = match t.return_service {
                ReturnService::NoReturn => continue,
                ReturnService::Receipt { .. } => ReturnLevel::Receipt,
                ReturnService::Twosafe { .. } => ReturnLevel::Twosafe,
            };
            let e = subscribers.entry(link.receiver.clone()).or_insert(level);
            *e = (*e).max(level);
            settings.get_or_insert_with(|| ReturnSettings::from_store(&link.sender_settings));
        }
    }
    returns.set_plan(routes, subscribers, settings.unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use hawser_core::QualName;

    /// A DATASTORE element's INCLUDE TABLE names (every table when it has none) and its
    /// EXCLUDE TABLE names; sequences it lists are not tables.
    #[test]
    fn a_datastore_elements_table_lists_are_the_tables_it_includes_and_excludes() {
        let scheme = match hawser_scheme::parse(
            "CREATE REPLICATION r \
               ELEMENT a DATASTORE MASTER ds1 SUBSCRIBER ds2 \
                 INCLUDE TABLE t1, t2 INCLUDE SEQUENCE s \
               ELEMENT b DATASTORE MASTER ds2 SUBSCRIBER ds1 EXCLUDE TABLE t3 \
               ELEMENT c DATASTORE MASTER ds3 SUBSCRIBER ds1",
        )
        .expect("parses")
        .remove(0)
        {
            hawser_scheme::Statement::Create(s) => s,
            other => panic!("not a CREATE REPLICATION: {other:?}"),
        };
        let lists: Vec<_> = scheme.elements.iter().map(super::table_lists).collect();
        let names = |ns: &[&str]| ns.iter().map(|n| QualName::bare(n)).collect();
        assert_eq!(
            lists,
            [
                (Some(names(&["t1", "t2"])), names(&[])),
                (None, names(&["t3"])),
                (None, names(&[])),
            ]
        );
    }
}
