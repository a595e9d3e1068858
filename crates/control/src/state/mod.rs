//! The cluster state machine: what the Raft group agrees on, and how commands change it.
//!
//! This module is pure (no I/O, no clock, no randomness): [`validate`] says whether a
//! [`Command`] fits a [`ClusterState`], and [`apply`] changes the state deterministically,
//! so every replica that applies the same log reaches the same state. The Raft glue in
//! [`crate::store`] calls [`apply`] for every committed entry; the node calls [`validate`]
//! before it proposes, so that bad input is refused before it costs a log entry. Because
//! another command may commit between the two, [`apply`] validates again and answers
//! [`Response::Rejected`] instead of changing anything.
//!
//! ```text
//!  ClusterState
//!  ├── nodes: NodeId ─► NodeInfo (store name, host, gRPC / HTTP address, voter?)
//!  ├── removed: NodeId ─► RemovedNode (store, when, log index): never let back in
//!  └── schemes: QualName ─► SchemeState
//!        ├── scheme: the effective AST (DDL and role changes applied), version
//!        ├── elements: name ─► ElementState (epoch, epoch history)
//!        ├── receivers: subscriber store ─► START | PAUSE | STOP | FAILED
//!        └── return services: subscriber store ─► ENABLED | DISABLED
//! ```
//!
//! The scheme kept is the *effective* one: a master change ([`Command::SetMaster`]) is
//! applied to the AST as `ALTER ELEMENT ... SET MASTER` would be, so printing it shows the
//! current master, and a later ALTER REPLICATION applies to what people see. The element
//! state remembers every master change as an [`EpochRecord`] with its fork point.
//!
//! Submodules: `types` holds the state's data types, `query` the questions asked of
//! them, `command` the commands, responses and errors; `change` validates and applies
//! a command, with the changes of the node registry in `nodes` and of the replication
//! schemes in `schemes`.

mod change;
mod command;
mod nodes;
mod query;
mod schemes;
mod types;

pub use self::change::{apply, apply_at, validate};
pub use self::command::{Command, ControlError, Response};
pub(crate) use self::query::holds_a_copy;
pub use self::query::store_roles;
pub use self::types::{
    ClusterState, ElementState, EpochRecord, FailoverPause, MasterView, NodeInfo, ReceiverState,
    RemovalMode, RemovedNode, ReturnServiceState, SchemeRole, SchemeState, StoreRole,
};

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use hawser_core::{Epoch, Gtid, Ident, NodeId, QualName};
    use hawser_scheme::route::StoreCatalog;

    use super::*;

    const SCHEME: &str = r#"
        CREATE REPLICATION r1
        ELEMENT e TABLE tab
          MASTER masterds ON "server1"
          SUBSCRIBER subscriber1 ON "server2", subscriber2 ON "server3"
          RETURN RECEIPT
        STORE masterds ON "server1" RETURN WAIT TIME 30;
    "#;

    fn node(id: u64, store: &str) -> NodeInfo {
        NodeInfo {
            id: NodeId(id),
            store: Ident::unquoted(store),
            host: format!("server{id}"),
            grpc_addr: format!("10.0.0.{id}:7000"),
            http_addr: format!("10.0.0.{id}:8000"),
            voter: false,
        }
    }

    fn ddl(text: &str) -> Command {
        let mut cmds = Command::from_ddl(text).unwrap();
        assert_eq!(cmds.len(), 1);
        cmds.remove(0)
    }

    fn must_apply(state: &mut ClusterState, cmd: Command) {
        validate(state, &cmd).unwrap();
        let resp = apply(state, &cmd);
        assert!(matches!(resp, Response::Applied { .. }), "{resp:?}");
    }

    fn cluster() -> ClusterState {
        let mut st = ClusterState::default();
        for (id, store) in [(1, "masterds"), (2, "subscriber1"), (3, "subscriber2")] {
            must_apply(&mut st, Command::RegisterNode(node(id, store)));
        }
        must_apply(&mut st, ddl(SCHEME));
        st
    }

    fn r1() -> QualName {
        QualName::bare("r1")
    }

    fn e() -> Ident {
        Ident::unquoted("e")
    }

    #[test]
    fn the_cluster_id_is_the_first_registered_node_and_never_changes() {
        let mut st = cluster();
        assert_eq!(st.cluster_id, 1);
        must_apply(&mut st, remove(3, RemovalMode::Force));
        must_apply(&mut st, Command::RegisterNode(node(4, "other")));
        assert_eq!(st.cluster_id, 1);
        // A state written before the id existed reads as 0, and stays so.
        let mut old: ClusterState =
            serde_json::from_str(r#"{"nodes":{},"schemes":[],"version":3}"#).unwrap();
        assert_eq!(old.cluster_id, 0);
        old.nodes.insert(NodeId(5), node(5, "x"));
        must_apply(&mut old, Command::RegisterNode(node(6, "y")));
        assert_eq!(old.cluster_id, 0);
    }

    #[test]
    fn a_new_scheme_starts_at_epoch_zero_with_its_master() {
        let st = cluster();
        let m = st.master_of(&r1(), &e()).unwrap();
        assert_eq!(m.store.as_str(), "masterds");
        assert_eq!(m.node, Some(NodeId(1)));
        assert_eq!(m.epoch, Epoch(0));
        assert_eq!(st.schemes[&r1()].version, 1);
        assert_eq!(st.version, 4);
    }

    #[test]
    fn a_deposed_master_removed_keeping_its_store_leaves_the_store_received_again() {
        let mut st = cluster();
        must_apply(&mut st, master_to_2(Some(Gtid::new(NodeId(1), 41))));
        let masterds = Ident::unquoted("masterds");
        assert!(st.schemes[&r1()].is_deposed(&st, &masterds));
        let version = st.schemes[&r1()].version;
        // Replaced by a new node (it lost its data): the store is no longer deposed.
        must_apply(&mut st, remove(1, RemovalMode::KeepInSchemes));
        let s = &st.schemes[&r1()];
        assert_eq!(s.receiver_state(&masterds), ReceiverState::Start);
        assert_eq!(
            s.return_service_state(&masterds),
            ReturnServiceState::Enabled
        );
        assert_eq!(s.version, version + 1);
        assert!(s.ddl().contains("SUBSCRIBER masterds"), "{}", s.ddl());
        // A subscriber that was never a master keeps what it had.
        let mut st = cluster();
        must_apply(
            &mut st,
            Command::SetReceiverState {
                scheme: r1(),
                store: Ident::unquoted("subscriber2"),
                state: ReceiverState::Pause,
            },
        );
        let id = st
            .node_by_store(&Ident::unquoted("subscriber2"))
            .unwrap()
            .id;
        must_apply(&mut st, remove(id.0, RemovalMode::KeepInSchemes));
        assert_eq!(
            st.schemes[&r1()].receiver_state(&Ident::unquoted("subscriber2")),
            ReceiverState::Pause
        );
    }

    #[test]
    fn set_master_swaps_roles_and_records_the_fork_point() {
        let mut st = cluster();
        let fork = Some(Gtid::new(NodeId(1), 41));
        must_apply(&mut st, master_to_2(fork));
        let m = st.master_of(&r1(), &e()).unwrap();
        assert_eq!(
            (m.store.as_str(), m.node, m.epoch),
            ("subscriber1", Some(NodeId(2)), Epoch(1))
        );
        let s = &st.schemes[&r1()];
        let history = &s.elements[&e()].history;
        assert_eq!(history.len(), 2);
        assert_eq!(history[1].fork_point, fork);
        assert_eq!(
            (history[1].era, st.era),
            (Some(1), 1),
            "a failover starts an era"
        );
        assert_eq!(history[0].master.as_str(), "masterds");
        // The effective scheme shows the new master, the old one now subscribes.
        let text = s.ddl();
        assert!(text.contains("MASTER subscriber1"), "{text}");
        assert!(text.contains("SUBSCRIBER masterds"), "{text}");
        assert_eq!(s.version, 2);
        // The deposed master gets nothing and holds back no commit until it rejoins.
        let masterds = Ident::unquoted("masterds");
        assert_eq!(s.receiver_state(&masterds), ReceiverState::Stop);
        assert_eq!(
            s.return_service_state(&masterds),
            ReturnServiceState::Disabled
        );
        assert!(s.is_deposed(&st, &masterds));
        // Started again once it has rejoined: commits wait for it as its subscription
        // says, in the same entry, so the failover choice and the data plane agree.
        let s = s.clone();
        must_apply(
            &mut st,
            Command::SetReceiverState {
                scheme: r1(),
                store: masterds.clone(),
                state: ReceiverState::Start,
            },
        );
        let started = &st.schemes[&r1()];
        assert_eq!(started.receiver_state(&masterds), ReceiverState::Start);
        assert_eq!(
            started.return_service_state(&masterds),
            ReturnServiceState::Enabled
        );
        assert!(!started.is_deposed(&st, &masterds));
        // A return service disabled by hand stays disabled when the receiver starts.
        let sub2 = Ident::unquoted("subscriber2");
        assert!(!s.is_deposed(&st, &sub2));
        for cmd in [
            Command::SetReturnServiceState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReturnServiceState::Disabled,
            },
            Command::SetReceiverState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReceiverState::Stop,
            },
            Command::SetReceiverState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReceiverState::Start,
            },
        ] {
            must_apply(&mut st, cmd);
        }
        assert_eq!(
            st.schemes[&r1()].return_service_state(&sub2),
            ReturnServiceState::Disabled
        );
    }

    #[test]
    fn a_switchover_without_fork_point_leaves_the_old_master_receiving() {
        let mut st = cluster();
        must_apply(&mut st, master_to_2(None));
        let s = &st.schemes[&r1()];
        assert!(s.receivers.is_empty() && s.return_services.is_empty());
        assert_eq!(st.era, 0, "no failover, no new era");
    }

    #[test]
    fn set_master_refuses_a_stale_or_skipped_epoch() {
        let mut st = cluster();
        for epoch in [0, 2] {
            let cmd = Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: NodeId(2),
                epoch: Epoch(epoch),
                fork_point: None,
            };
            assert!(matches!(
                validate(&st, &cmd),
                Err(ControlError::StaleEpoch { .. })
            ));
            let before = st.clone();
            let resp = apply(&mut st, &cmd);
            assert!(matches!(
                resp,
                Response::Rejected(ControlError::StaleEpoch { .. })
            ));
            assert_eq!(
                st.schemes, before.schemes,
                "a rejected command changes nothing"
            );
        }
    }

    #[test]
    fn set_master_refuses_a_node_that_does_not_subscribe() {
        let mut st = cluster();
        must_apply(&mut st, Command::RegisterNode(node(4, "other")));
        let cmd = Command::SetMaster {
            scheme: r1(),
            element: e(),
            node: NodeId(4),
            epoch: Epoch(1),
            fork_point: None,
        };
        assert!(matches!(
            validate(&st, &cmd),
            Err(ControlError::NotSubscriber { .. })
        ));
        let cmd = Command::SetMaster {
            scheme: r1(),
            element: e(),
            node: NodeId(9),
            epoch: Epoch(1),
            fork_point: None,
        };
        assert_eq!(
            validate(&st, &cmd),
            Err(ControlError::UnknownNode(NodeId(9)))
        );
    }

    /// A subscriber keeping the table as a CCD holds no copy to master: refused, saying
    /// so; one keeping a plain copy is taken.
    #[test]
    fn set_master_refuses_a_subscriber_that_keeps_another_target_than_a_copy() {
        let mut st = ClusterState::default();
        for (id, store) in [(1, "masterds"), (2, "subscriber1"), (3, "subscriber2")] {
            must_apply(&mut st, Command::RegisterNode(node(id, store)));
        }
        must_apply(
            &mut st,
            ddl("CREATE REPLICATION r1 ELEMENT e TABLE t MASTER masterds \
                 SUBSCRIBER subscriber1 AS CCD INTO t_ccd SUBSCRIBER subscriber2"),
        );
        let to = |n| Command::SetMaster {
            scheme: r1(),
            element: e(),
            node: NodeId(n),
            epoch: Epoch(1),
            fork_point: None,
        };
        let refused = validate(&st, &to(2)).unwrap_err();
        assert!(
            matches!(refused, ControlError::NotACopy { .. }),
            "{refused}"
        );
        assert!(
            refused.to_string().contains("holds no copy to master"),
            "{refused}"
        );
        assert_eq!(validate(&st, &to(3)), Ok(()));
        // By hand, with ALTER ... SET MASTER, alike.
        let by_hand = |store: &str| {
            ddl(&format!(
                "ALTER REPLICATION r1 ALTER ELEMENT * IN masterds SET MASTER {store}"
            ))
        };
        assert!(matches!(
            validate(&st, &by_hand("subscriber1")),
            Err(ControlError::NotACopy { .. })
        ));
        assert_eq!(validate(&st, &by_hand("subscriber2")), Ok(()));
    }

    #[test]
    fn alter_set_master_by_ddl_starts_a_new_epoch_without_fork_point() {
        let mut st = cluster();
        must_apply(
            &mut st,
            ddl("ALTER REPLICATION r1 ALTER ELEMENT * IN masterds SET MASTER subscriber2;"),
        );
        let es = &st.schemes[&r1()].elements[&e()];
        assert_eq!(es.epoch, Epoch(1));
        assert_eq!(es.current().master.as_str(), "subscriber2");
        assert_eq!(es.current().node, Some(NodeId(3)));
        assert_eq!(es.current().fork_point, None);
    }

    #[test]
    fn alter_that_keeps_the_master_keeps_the_epoch_and_follows_renames() {
        let mut st = cluster();
        must_apply(
            &mut st,
            Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: NodeId(3),
                epoch: Epoch(1),
                fork_point: None,
            },
        );
        must_apply(
            &mut st,
            ddl("ALTER REPLICATION r1 ALTER ELEMENT e SET NAME f;"),
        );
        let s = &st.schemes[&r1()];
        assert!(!s.elements.contains_key(&e()));
        let f = &s.elements[&Ident::unquoted("f")];
        assert_eq!(f.epoch, Epoch(1));
        assert_eq!(f.history.len(), 2);
        assert_eq!(s.version, 3);
    }

    #[test]
    fn invalid_ddl_is_refused_with_the_checker_code_and_changes_nothing() {
        let mut st = cluster();
        let before = st.schemes.clone();
        // subscriber1 does not subscribe twice; dropping an unknown subscriber is HW2002.
        let cmd = ddl("ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER nobody;");
        let err = validate(&st, &cmd).unwrap_err();
        match &err {
            ControlError::Invalid(errors) => assert_eq!(errors[0].code.as_str(), "HW2002"),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(apply(&mut st, &cmd), Response::Rejected(err));
        assert_eq!(st.schemes, before);
        // Owner also subscriber: TT8106.
        let bad = ddl("CREATE REPLICATION r2 ELEMENT x TABLE t MASTER a SUBSCRIBER a;");
        match validate(&st, &bad) {
            Err(ControlError::Invalid(errors)) => assert_eq!(errors[0].code.as_str(), "TT8106"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn create_twice_drop_and_unknown_schemes() {
        let mut st = cluster();
        assert_eq!(
            validate(&st, &ddl(SCHEME)),
            Err(ControlError::SchemeExists(r1()))
        );
        must_apply(&mut st, ddl("DROP REPLICATION r1;"));
        assert!(st.schemes.is_empty());
        assert_eq!(
            validate(&st, &ddl("DROP REPLICATION r1;")),
            Err(ControlError::UnknownScheme(r1()))
        );
    }

    #[test]
    fn self_must_be_resolved_before_proposing() {
        let st = ClusterState::default();
        let cmd = ddl("CREATE REPLICATION r3 ELEMENT x TABLE t MASTER SELF SUBSCRIBER b;");
        assert!(matches!(
            validate(&st, &cmd),
            Err(ControlError::UnresolvedSelf(_))
        ));
    }

    #[test]
    fn identities_may_not_clash_but_a_node_may_move() {
        let mut st = cluster();
        let clash_store = Command::RegisterNode(node(4, "masterds"));
        assert!(matches!(
            validate(&st, &clash_store),
            Err(ControlError::IdentityClash {
                existing: NodeId(1),
                ..
            })
        ));
        let clash_id = Command::RegisterNode(node(1, "elsewhere"));
        assert!(matches!(
            validate(&st, &clash_id),
            Err(ControlError::IdentityClash { .. })
        ));
        let mut moved = node(1, "masterds");
        moved.grpc_addr = "10.0.9.9:7000".into();
        moved.voter = true; // ignored: membership decides
        st.set_voters(&BTreeSet::from([NodeId(1)]));
        must_apply(&mut st, Command::RegisterNode(moved));
        assert_eq!(st.nodes[&NodeId(1)].grpc_addr, "10.0.9.9:7000");
        assert!(st.nodes[&NodeId(1)].voter);
        assert!(!st.nodes[&NodeId(2)].voter);
    }

    #[test]
    fn a_store_reports_its_catalog_and_it_goes_with_its_node() {
        let mut st = cluster();
        let catalog = StoreCatalog {
            tables: Vec::new(),
            sequences: vec![hawser_scheme::route::SequenceInfo {
                name: QualName::bare("s"),
                cycle: false,
            }],
        };
        let report = |store: &str| Command::ReportCatalog {
            store: Ident::unquoted(store),
            catalog: catalog.clone(),
        };
        assert_eq!(
            validate(&st, &report("nobody")),
            Err(ControlError::UnknownStore(Ident::unquoted("nobody")))
        );
        must_apply(&mut st, report("subscriber1"));
        assert_eq!(st.catalogs[&Ident::unquoted("subscriber1")], catalog);
        // Written before reports existed: no catalogs, still readable.
        let mut json = serde_json::to_value(&st).unwrap();
        json.as_object_mut().unwrap().remove("catalogs");
        let old: ClusterState = serde_json::from_value(json).unwrap();
        assert!(old.catalogs.is_empty());
        must_apply(&mut st, remove(2, RemovalMode::Force));
        assert!(
            st.catalogs.is_empty(),
            "a removed node's catalog goes with it"
        );
    }

    /// Element e of r1 to node 2 (subscriber1) at epoch 1: a failover with a fork
    /// point, a switchover without.
    fn master_to_2(fork_point: Option<Gtid>) -> Command {
        Command::SetMaster {
            scheme: r1(),
            element: e(),
            node: NodeId(2),
            epoch: Epoch(1),
            fork_point,
        }
    }

    fn remove(id: u64, mode: RemovalMode) -> Command {
        Command::RemoveNode {
            node: NodeId(id),
            mode,
            at_unix_ms: 1_700_000_000_000,
        }
    }

    /// `cmd` refused by `validate` and by `apply` with `err`, changing nothing but the
    /// state's version.
    fn must_refuse(st: &mut ClusterState, cmd: Command) -> ControlError {
        let err = validate(st, &cmd).unwrap_err();
        let mut before = st.clone();
        assert_eq!(apply(st, &cmd), Response::Rejected(err.clone()));
        before.version += 1;
        assert_eq!(*st, before, "a refused removal changes nothing");
        err
    }

    #[test]
    fn a_node_whose_store_a_scheme_names_is_refused_naming_scheme_element_and_role() {
        let mut st = cluster();
        let err = must_refuse(&mut st, remove(2, RemovalMode::Refuse));
        assert_eq!(
            err,
            ControlError::StoreInScheme {
                node: NodeId(2),
                store: Ident::unquoted("subscriber1"),
                role: Box::new(SchemeRole {
                    scheme: r1(),
                    element: e(),
                    role: StoreRole::Subscriber,
                }),
                others: 0,
            }
        );
        let text = err.to_string();
        for part in [
            "SUBSCRIBER of element e in replication scheme r1",
            "ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER subscriber1",
            "DROP REPLICATION r1",
            "--force",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        // Taken out of the scheme first, it goes; a node no scheme names goes at once.
        must_apply(
            &mut st,
            ddl("ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER subscriber1;"),
        );
        must_apply(&mut st, remove(2, RemovalMode::Refuse));
        must_apply(&mut st, Command::RegisterNode(node(4, "other")));
        must_apply(&mut st, remove(4, RemovalMode::Refuse));
        assert!(!st.nodes.contains_key(&NodeId(2)) && !st.nodes.contains_key(&NodeId(4)));
    }

    #[test]
    fn a_master_or_propagator_is_refused_even_with_force() {
        let mut st = cluster();
        for mode in [
            RemovalMode::Refuse,
            RemovalMode::Force,
            RemovalMode::KeepInSchemes,
        ] {
            let err = must_refuse(&mut st, remove(1, mode));
            assert!(
                matches!(&err, ControlError::NodeHoldsRole { role, .. } if role.role == StoreRole::Master),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(
                text.contains("not even with --force")
                    && text.contains("MASTER of element e in replication scheme r1")
                    && text.contains("move the role first")
                    && text.contains("hawser switchover --scheme r1"),
                "{text}"
            );
        }
        must_apply(
            &mut st,
            ddl("CREATE REPLICATION r2
                 ELEMENT a TABLE t2 MASTER masterds SUBSCRIBER subscriber1
                 ELEMENT b TABLE t2 PROPAGATOR subscriber1 SUBSCRIBER subscriber2;"),
        );
        let err = must_refuse(&mut st, remove(2, RemovalMode::Force));
        assert!(
            matches!(&err, ControlError::NodeHoldsRole { role, .. } if role.role == StoreRole::Propagator),
            "{err:?}"
        );
        assert!(err.to_string().contains("SET PROPAGATOR"), "{err}");
    }

    #[test]
    fn force_takes_the_store_out_of_every_scheme_in_the_same_entry() {
        let mut st = cluster();
        must_apply(
            &mut st,
            ddl(r#"CREATE REPLICATION r2
                   ELEMENT x TABLE t2 MASTER masterds SUBSCRIBER subscriber1, subscriber2
                   ELEMENT y TABLE t3 MASTER subscriber1 SUBSCRIBER subscriber2, masterds
                   STORE subscriber2 RETURN WAIT TIME 5
                   ROUTE MASTER masterds SUBSCRIBER subscriber2
                     MASTERIP "10.0.0.1" PRIORITY 1 SUBSCRIBERIP "10.0.0.3" PRIORITY 1;"#),
        );
        let sub2 = Ident::unquoted("subscriber2");
        must_apply(
            &mut st,
            Command::SetReceiverState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReceiverState::Pause,
            },
        );
        let roles = store_roles(&st, &sub2);
        assert_eq!(roles.len(), 3, "{roles:?}");
        // Unforced: refused, naming the first role and counting the others.
        let err = must_refuse(&mut st, remove(3, RemovalMode::Refuse));
        assert!(err.to_string().contains("and has 2 more roles"), "{err}");
        let before = st.clone();
        let cmd = remove(3, RemovalMode::Force);
        validate(&st, &cmd).unwrap();
        assert!(matches!(
            apply_at(&mut st, &cmd, 42),
            Response::Applied { .. }
        ));
        // One entry: one state version, the node gone and recorded, both schemes
        // without the store, its states forgotten, every epoch kept.
        assert_eq!(st.version, before.version + 1);
        assert!(!st.nodes.contains_key(&NodeId(3)));
        assert_eq!(
            st.removed[&NodeId(3)],
            RemovedNode {
                store: sub2.clone(),
                at_unix_ms: 1_700_000_000_000,
                log_index: 42,
            }
        );
        assert!(store_roles(&st, &sub2).is_empty());
        for name in [r1(), QualName::bare("r2")] {
            let (old, new) = (&before.schemes[&name], &st.schemes[&name]);
            assert_eq!(new.version, old.version + 1, "{name}");
            assert!(!new.ddl().contains("subscriber2"), "{}", new.ddl());
            assert_eq!(
                new.elements.values().map(|e| e.epoch).collect::<Vec<_>>(),
                old.elements.values().map(|e| e.epoch).collect::<Vec<_>>()
            );
            assert!(new.receivers.is_empty(), "{:?}", new.receivers);
        }
        assert!(st.schemes[&r1()].ddl().contains("SUBSCRIBER subscriber1"));
        // The same checks the DDL path makes still hold on what force left.
        for s in st.schemes.values() {
            hawser_scheme::validate(&s.scheme).unwrap();
        }
    }

    #[test]
    fn force_is_refused_where_the_store_is_the_last_subscriber_of_an_element() {
        let mut st = cluster();
        must_apply(
            &mut st,
            ddl("CREATE REPLICATION r2 ELEMENT x TABLE t2 MASTER masterds SUBSCRIBER subscriber2;"),
        );
        // Nothing changes, r1 included: the removal is one entry or none.
        let err = must_refuse(&mut st, remove(3, RemovalMode::Force));
        match &err {
            ControlError::ForcedRemovalRefused {
                scheme, finding, ..
            } => {
                assert_eq!(scheme, &QualName::bare("r2"));
                assert_eq!(finding.code.as_str(), "HW2006");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("DROP REPLICATION r2"), "{err}");
    }

    #[test]
    fn keep_in_schemes_leaves_the_store_for_a_new_node_and_a_removed_id_never_returns() {
        let mut st = cluster();
        let sub2 = Ident::unquoted("subscriber2");
        must_apply(&mut st, remove(3, RemovalMode::KeepInSchemes));
        assert!(st.schemes[&r1()].subscriber_stores().contains(&sub2));
        assert!(st.removed.contains_key(&NodeId(3)));
        // The old id may not come back, nor be removed twice.
        assert_eq!(
            must_refuse(&mut st, Command::RegisterNode(node(3, "subscriber2"))),
            ControlError::NodeRemoved(NodeId(3))
        );
        let err = must_refuse(&mut st, remove(3, RemovalMode::Force));
        assert_eq!(err, ControlError::NodeRemoved(NodeId(3)));
        assert!(err.to_string().contains("empty data directory"), "{err}");
        // A new node (a new id) takes the store's name and its place in the scheme.
        must_apply(&mut st, Command::RegisterNode(node(9, "subscriber2")));
        assert_eq!(st.node_by_store(&sub2).map(|n| n.id), Some(NodeId(9)));
        // Unknown ids are still unknown.
        assert_eq!(
            validate(&st, &remove(8, RemovalMode::Refuse)),
            Err(ControlError::UnknownNode(NodeId(8)))
        );
    }

    #[test]
    fn removals_written_before_modes_existed_read_as_refuse_and_states_without_removed_read() {
        let cmd: Command = serde_json::from_str(r#"{"RemoveNode":{"node":5}}"#).unwrap();
        assert_eq!(
            cmd,
            Command::RemoveNode {
                node: NodeId(5),
                mode: RemovalMode::Refuse,
                at_unix_ms: 0,
            }
        );
        let mut st = cluster();
        must_apply(&mut st, remove(3, RemovalMode::KeepInSchemes));
        let mut json = serde_json::to_value(&st).unwrap();
        assert!(json["removed"]["3"].is_object(), "{json}");
        json.as_object_mut().unwrap().remove("removed");
        let old: ClusterState = serde_json::from_value(json).unwrap();
        assert!(old.removed.is_empty());
    }

    #[test]
    fn receiver_and_return_service_states_default_and_are_cleaned_up() {
        let mut st = cluster();
        let sub2 = Ident::unquoted("subscriber2");
        assert_eq!(
            st.schemes[&r1()].receiver_state(&sub2),
            ReceiverState::Start
        );
        must_apply(
            &mut st,
            Command::SetReceiverState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReceiverState::Pause,
            },
        );
        must_apply(
            &mut st,
            Command::SetReturnServiceState {
                scheme: r1(),
                store: sub2.clone(),
                state: ReturnServiceState::Disabled,
            },
        );
        let s = &st.schemes[&r1()];
        assert_eq!(s.receiver_state(&sub2), ReceiverState::Pause);
        assert_eq!(s.return_service_state(&sub2), ReturnServiceState::Disabled);
        // The master is not a receiver of the scheme.
        let cmd = Command::SetReceiverState {
            scheme: r1(),
            store: Ident::unquoted("masterds"),
            state: ReceiverState::Stop,
        };
        assert!(matches!(
            validate(&st, &cmd),
            Err(ControlError::NotSchemeSubscriber { .. })
        ));
        // Dropping the subscriber forgets its states.
        must_apply(
            &mut st,
            ddl("ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER subscriber2;"),
        );
        let s = &st.schemes[&r1()];
        assert!(s.receivers.is_empty() && s.return_services.is_empty());
    }

    #[test]
    fn apply_is_deterministic_and_the_state_round_trips_through_json() {
        let cmds = vec![
            Command::RegisterNode(node(1, "masterds")),
            Command::RegisterNode(node(2, "subscriber1")),
            ddl(SCHEME),
            master_to_2(Some(Gtid::new(NodeId(1), 7))),
            remove(7, RemovalMode::Refuse),
        ];
        let run = || {
            let mut st = ClusterState::default();
            let responses: Vec<_> = cmds.iter().map(|c| apply(&mut st, c)).collect();
            (st, responses)
        };
        let (a, ra) = run();
        let (b, rb) = run();
        assert_eq!(a, b);
        assert_eq!(ra, rb);
        assert!(matches!(
            ra[4],
            Response::Rejected(ControlError::UnknownNode(_))
        ));
        let json = serde_json::to_vec(&a).unwrap();
        let back: ClusterState = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, a);
        let cmd_json = serde_json::to_vec(&cmds).unwrap();
        let cmds_back: Vec<Command> = serde_json::from_slice(&cmd_json).unwrap();
        assert_eq!(cmds_back, cmds);
    }
}
