//! The Hello check, pure: a sender's Hello against this node's identity, subscriptions
//! and tables, into an [`Accepted`] stream or a refusal with its [`RefuseCode`].
//!
//! The order of the checks is the order a sender hears of problems in: the protocol
//! version, the store and node addressed, then (after the store's free space, which the
//! service checks) the elements and their epochs, then each table. The epochs are
//! checked again before every batch ([`check_epochs`]): a master change since Hello
//! makes the sender stale from that moment on.

use std::collections::{BTreeMap, BTreeSet};

use hawser_core::{Epoch, Ident, NodeId, QualName, TableDef};
use hawser_scheme::ast::TableDefinitionChecking;
use hawser_scheme::route::ResolvedTarget;
use hawser_target::{TargetError, TargetPlan};

use super::accepted::{check_as_of, Accepted, Catalog};
use super::Refusal;
use crate::codec;
use crate::pb::{self, RefuseCode};
use crate::PROTOCOL_VERSION;

/// What a Hello is checked against beyond this node's identity.
pub(super) struct HelloContext<'a, C> {
    /// This node's store name, for refusals.
    pub(super) store: &'a Ident,
    /// The elements this node subscribes to, with the epochs the control plane gives.
    pub(super) epochs: &'a BTreeMap<Ident, Epoch>,
    /// The target of each table this store receives, as the schemes say.
    pub(super) targets: &'a BTreeMap<QualName, ResolvedTarget>,
    /// This node's tables and high-waters.
    pub(super) catalog: &'a C,
}

/// Where a received table's target table stands at Hello.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TargetTable {
    /// It exists with the target's shape.
    Ready,
    /// It is missing: created (with this definition) before the first batch.
    Create(TableDef),
}

/// Whether `hello` speaks this build's protocol and is meant for this node: store
/// `store`, node `me` (a Hello that names no node is for whichever holds the store).
pub(super) fn check_identity(hello: &pb::Hello, store: &Ident, me: NodeId) -> Result<(), Refusal> {
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err((
            RefuseCode::Protocol,
            format!(
                "protocol version {} is not supported (this node speaks {PROTOCOL_VERSION})",
                hello.protocol_version
            ),
        ));
    }
    if hello.receiver_store != store.as_str() {
        return Err((
            RefuseCode::NotSubscriber,
            format!("this node is store {store}, not {}", hello.receiver_store),
        ));
    }
    if hello.receiver_node != 0 && hello.receiver_node != me.0 {
        return Err((
            RefuseCode::NotSubscriber,
            format!(
                "this is node {me} holding store {store}, not node {} that the sender's \
                 cluster state registers for it: the store was given to another node (a \
                 data directory replaced?); remove the old member and let this one \
                 rejoin and be rebuilt",
                hello.receiver_node
            ),
        ));
    }
    Ok(())
}

/// The rest of the Hello check, once its identity passed and the store has room: the
/// elements it carries are subscribed here at an epoch not behind the cluster's, and
/// every table it describes fits this node's (or its target's) table.
pub(super) fn accept<C: Catalog>(
    hello: &pb::Hello,
    ctx: &HelloContext<'_, C>,
) -> Result<Accepted, Refusal> {
    let mut elements = BTreeMap::new();
    for e in &hello.elements {
        let name = Ident::quoted(&e.element);
        let Some(&current) = ctx.epochs.get(&name) else {
            return Err((
                RefuseCode::NotSubscriber,
                format!("store {} does not subscribe to element {name}", ctx.store),
            ));
        };
        if Epoch(e.epoch) < current {
            return Err((
                RefuseCode::StaleEpoch,
                format!(
                    "element {name}: the sender is at epoch {}, the cluster at {current}",
                    e.epoch
                ),
            ));
        }
        elements.insert(name, Epoch(e.epoch));
    }
    let mode = table_check(hello.table_check);
    let mut maps = BTreeMap::new();
    let mut remotes = BTreeMap::new();
    let mut doomed = BTreeSet::new();
    let mut targets = TargetPlan::default();
    let mut create = Vec::new();
    for spec in &hello.tables {
        let remote: TableDef = codec::decode_table_def(&spec.definition)
            .map_err(|e| (RefuseCode::Protocol, format!("a table definition: {e}")))?;
        remotes.insert(remote.name.clone(), remote.clone());
        if let Some(target) = ctx
            .targets
            .get(&remote.name)
            .filter(|t| !hawser_target::is_plain(&remote.name, t))
        {
            if let TargetTable::Create(def) =
                check_target(ctx.store, ctx.catalog, &remote, target, &mut targets)?
            {
                create.push(def);
            }
            if !hawser_target::keeps_copy(&remote.name, target) {
                continue;
            }
            // A BASE AGGREGATE's source rows: a plain copy, checked as one below.
        }
        let Some(local) = ctx.catalog.local_table(&remote.name) else {
            if hello.carries_ddl || spec.completing {
                // A DATASTORE element's stream creates the table before its rows;
                // a completing table is a sibling stream's (which may create it).
                continue;
            }
            return Err((
                RefuseCode::TableMismatch,
                format!(
                    "table {} does not exist on store {}",
                    remote.name, ctx.store
                ),
            ));
        };
        match check_as_of(&local, &remote, hello.carries_ddl, mode) {
            Ok(Some(map)) => {
                maps.insert(remote.name.clone(), map);
            }
            Ok(None) => {}
            Err(_) if hello.carries_ddl && drop_ahead(ctx.catalog, spec.dropped_at.as_ref()) => {
                // The stream drops this node's table before any row of the
                // sender's new layout: its rows until then are not applied (the
                // drop removes them), so how this node has the table does not
                // matter, and the CREATE after the drop is checked as it comes
                // (`Accepted::follow_ddl`).
                remotes.remove(&remote.name);
                doomed.insert(remote.name.clone());
            }
            Err(e) => return Err((RefuseCode::TableMismatch, e.to_string())),
        }
    }
    Ok(Accepted {
        sender: Ident::quoted(&hello.sender_store),
        sender_node: NodeId(hello.sender_node),
        returns_wait: hello.returns_wait,
        elements,
        maps,
        remote: remotes,
        doomed,
        mode,
        ships_parts: hello.ships_parts,
        targets,
        create,
    })
}

/// How a Hello's tables are checked: EXACT when it says so, RELAXED otherwise
/// (including a value this build does not know).
pub(super) fn table_check(value: i32) -> TableDefinitionChecking {
    match pb::TableCheck::try_from(value) {
        Ok(pb::TableCheck::Exact) => TableDefinitionChecking::Exact,
        _ => TableDefinitionChecking::Relaxed,
    }
}

/// Whether this node has yet to apply the DROP TABLE a Hello names
/// (`TableSpec.dropped_at`). A store that cannot say its high-water has not.
pub(super) fn drop_ahead(catalog: &impl Catalog, dropped_at: Option<&pb::OriginMark>) -> bool {
    dropped_at.is_some_and(|g| {
        catalog
            .held_through(NodeId(g.origin))
            .is_some_and(|held| held < g.seq)
    })
}

/// How `remote` is written into `target`'s table here: that table has the shape
/// the target needs (or is refused, naming what differs), or is created before the
/// first batch. The target is added to `plan`.
pub(super) fn check_target(
    store: &Ident,
    catalog: &impl Catalog,
    remote: &TableDef,
    target: &ResolvedTarget,
    plan: &mut TargetPlan,
) -> Result<TargetTable, Refusal> {
    let expected = hawser_target::shape(remote, target).map_err(|e| target_refusal(store, e))?;
    plan.add(remote.clone(), target.clone())
        .map_err(|e| target_refusal(store, e))?;
    match catalog.local_table(&expected.name) {
        Some(local) => {
            hawser_target::check_shape(&local, &expected).map_err(|e| target_refusal(store, e))?;
            Ok(TargetTable::Ready)
        }
        None => Ok(TargetTable::Create(expected)),
    }
}

/// The refusal of a target table that cannot be written as its target says.
pub(super) fn target_refusal(store: &Ident, e: TargetError) -> Refusal {
    (RefuseCode::TableMismatch, format!("store {store}: {e}"))
}

/// Whether the elements a stream carries (`elements`, at the epochs its Hello gave)
/// are still current by the epochs the control plane gives now (`known`): an element
/// moved to a later epoch makes the sender stale, one no longer subscribed ends the
/// stream.
pub(super) fn check_epochs(
    elements: &BTreeMap<Ident, Epoch>,
    known: &BTreeMap<Ident, Epoch>,
    store: &Ident,
) -> Result<(), Refusal> {
    for (element, epoch) in elements {
        match known.get(element) {
            Some(current) if current > epoch => {
                return Err((
                    RefuseCode::StaleEpoch,
                    format!(
                        "element {element}: the sender is at epoch {epoch}, the cluster now at {current}"
                    ),
                ))
            }
            None => {
                return Err((
                    RefuseCode::NotSubscriber,
                    format!("store {store} no longer subscribes to element {element}"),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receiver::accepted::tests::{table, FakeCatalog};

    fn store() -> Ident {
        Ident::unquoted("s")
    }

    fn hello() -> pb::Hello {
        pb::Hello {
            protocol_version: PROTOCOL_VERSION,
            sender_node: 1,
            sender_store: "a".into(),
            receiver_store: store().as_str().to_string(),
            ..pb::Hello::default()
        }
    }

    fn spec(def: &TableDef) -> pb::TableSpec {
        pb::TableSpec {
            element: "e".into(),
            definition: codec::encode_table_def(def),
            dropped_at: None,
            completing: false,
        }
    }

    fn accept_with(
        hello: &pb::Hello,
        epochs: &BTreeMap<Ident, Epoch>,
        catalog: &FakeCatalog,
    ) -> Result<Accepted, Refusal> {
        let s = store();
        let ctx = HelloContext {
            store: &s,
            epochs,
            targets: &BTreeMap::new(),
            catalog,
        };
        accept(hello, &ctx)
    }

    fn code<T>(r: Result<T, Refusal>) -> RefuseCode {
        match r {
            Ok(_) => panic!("accepted"),
            Err((code, _)) => code,
        }
    }

    #[test]
    fn a_hello_of_another_protocol_version_is_refused_as_protocol() {
        let h = pb::Hello {
            protocol_version: PROTOCOL_VERSION - 1,
            ..hello()
        };
        assert_eq!(
            code(check_identity(&h, &store(), NodeId(2))),
            RefuseCode::Protocol
        );
        assert!(check_identity(&hello(), &store(), NodeId(2)).is_ok());
    }

    #[test]
    fn a_hello_for_another_store_or_another_node_of_it_is_refused_as_not_subscriber() {
        let other_store = pb::Hello {
            receiver_store: "t".into(),
            ..hello()
        };
        assert_eq!(
            code(check_identity(&other_store, &store(), NodeId(2))),
            RefuseCode::NotSubscriber
        );
        let other_node = pb::Hello {
            receiver_node: 3,
            ..hello()
        };
        assert_eq!(
            code(check_identity(&other_node, &store(), NodeId(2))),
            RefuseCode::NotSubscriber
        );
        // Node 0: the sender does not say which node holds the store.
        for node in [0, 2] {
            let h = pb::Hello {
                receiver_node: node,
                ..hello()
            };
            assert!(
                check_identity(&h, &store(), NodeId(2)).is_ok(),
                "node {node}"
            );
        }
    }

    #[test]
    fn elements_must_be_subscribed_here_at_an_epoch_not_behind_the_clusters() {
        let e = Ident::quoted("E");
        let epochs = BTreeMap::from([(e.clone(), Epoch(5))]);
        let catalog = FakeCatalog::default();
        let with = |element: &str, epoch| pb::Hello {
            elements: vec![pb::ElementEpoch {
                element: element.into(),
                epoch,
            }],
            ..hello()
        };
        assert_eq!(
            code(accept_with(&with("F", 5), &epochs, &catalog)),
            RefuseCode::NotSubscriber
        );
        assert_eq!(
            code(accept_with(&with("E", 4), &epochs, &catalog)),
            RefuseCode::StaleEpoch
        );
        // At the cluster's epoch, or ahead of what this node has heard of.
        for epoch in [5, 6] {
            let a = accept_with(&with("E", epoch), &epochs, &catalog).expect("accepted");
            assert_eq!(a.elements, BTreeMap::from([(e.clone(), Epoch(epoch))]));
        }
    }

    #[test]
    fn a_table_missing_here_is_refused_unless_the_stream_creates_it_or_a_sibling_completes_it() {
        let t = table("t", &["k", "a"]);
        let catalog = FakeCatalog::default();
        let none = BTreeMap::new();
        let plain = pb::Hello {
            tables: vec![spec(&t)],
            ..hello()
        };
        assert_eq!(
            code(accept_with(&plain, &none, &catalog)),
            RefuseCode::TableMismatch
        );
        let ddl = pb::Hello {
            carries_ddl: true,
            ..plain.clone()
        };
        assert!(accept_with(&ddl, &none, &catalog).is_ok());
        let completing = pb::Hello {
            tables: vec![pb::TableSpec {
                completing: true,
                ..spec(&t)
            }],
            ..hello()
        };
        assert!(accept_with(&completing, &none, &catalog).is_ok());
    }

    #[test]
    fn relaxed_checking_maps_columns_in_another_order_and_exact_refuses_them() {
        let name = QualName::bare("t");
        let catalog = FakeCatalog {
            tables: BTreeMap::from([(name.clone(), table("t", &["k", "b", "a"]))]),
            ..FakeCatalog::default()
        };
        let none = BTreeMap::new();
        let relaxed = pb::Hello {
            tables: vec![spec(&table("t", &["k", "a", "b"]))],
            table_check: pb::TableCheck::Relaxed as i32,
            ..hello()
        };
        let a = accept_with(&relaxed, &none, &catalog).expect("accepted");
        assert_eq!(a.maps.get(&name), Some(&vec![0, 2, 1]));
        assert_eq!(a.mode, TableDefinitionChecking::Relaxed);
        let exact = pb::Hello {
            table_check: pb::TableCheck::Exact as i32,
            ..relaxed
        };
        assert_eq!(
            code(accept_with(&exact, &none, &catalog)),
            RefuseCode::TableMismatch
        );
        // A value this build does not know checks as RELAXED.
        assert_eq!(table_check(99), TableDefinitionChecking::Relaxed);
    }

    #[test]
    fn a_mismatched_table_the_stream_drops_before_this_node_applied_the_drop_is_doomed() {
        let name = QualName::bare("t");
        let catalog = FakeCatalog {
            tables: BTreeMap::from([(name.clone(), table("t", &["k", "old"]))]),
            held: BTreeMap::from([(NodeId(1), 10)]),
        };
        let none = BTreeMap::new();
        let dropped_at = |seq| pb::Hello {
            carries_ddl: true,
            tables: vec![pb::TableSpec {
                dropped_at: Some(pb::OriginMark { origin: 1, seq }),
                ..spec(&table("t", &["k", "new"]))
            }],
            table_check: pb::TableCheck::Exact as i32,
            ..hello()
        };
        let a = accept_with(&dropped_at(11), &none, &catalog).expect("accepted");
        assert!(a.doomed.contains(&name));
        assert!(!a.remote.contains_key(&name), "checked again at its CREATE");
        // The drop is here already: the sender's layout is the one to fit.
        assert_eq!(
            code(accept_with(&dropped_at(10), &none, &catalog)),
            RefuseCode::TableMismatch
        );
        // A store that cannot say how far it holds the origin has not dropped it.
        assert!(!drop_ahead(
            &FakeCatalog::default(),
            Some(&pb::OriginMark { origin: 1, seq: 11 })
        ));
        assert!(!drop_ahead(&catalog, None));
    }

    #[test]
    fn an_undecodable_table_definition_is_refused_as_protocol() {
        let h = pb::Hello {
            tables: vec![pb::TableSpec {
                definition: vec![0xff, 0x00],
                ..pb::TableSpec::default()
            }],
            ..hello()
        };
        assert_eq!(
            code(accept_with(&h, &BTreeMap::new(), &FakeCatalog::default())),
            RefuseCode::Protocol
        );
    }

    #[test]
    fn a_batch_is_refused_once_its_element_moved_to_a_later_epoch_or_was_unsubscribed() {
        let e = Ident::quoted("E");
        let elements = BTreeMap::from([(e.clone(), Epoch(5))]);
        let at = |epoch| BTreeMap::from([(e.clone(), Epoch(epoch))]);
        assert!(check_epochs(&elements, &at(5), &store()).is_ok());
        // The sender ahead of what this node has heard: still current.
        assert!(check_epochs(&elements, &at(4), &store()).is_ok());
        assert_eq!(
            code(check_epochs(&elements, &at(6), &store())),
            RefuseCode::StaleEpoch
        );
        assert_eq!(
            code(check_epochs(&elements, &BTreeMap::new(), &store())),
            RefuseCode::NotSubscriber
        );
    }
}
