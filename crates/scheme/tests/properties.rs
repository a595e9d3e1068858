//! Property tests: printer round trip, ALTER laws, and no panic on hostile input.

use hawser_core::{Ident, QualName};
use hawser_scheme::ast::*;
use hawser_scheme::{apply, check_source, format_source, parse_statement, print_statement, Span};
use proptest::prelude::*;

fn ident() -> impl Strategy<Value = Ident> {
    prop_oneof![
        4 => "[a-z_][a-z0-9_$#]{0,6}".prop_map(|s| Ident::unquoted(&s)),
        1 => prop::sample::select(vec![
            "subscriber", "table", "Self", "ON", "Mixed Case", "x\"y", "element", "é"
        ])
        .prop_map(Ident::quoted),
    ]
}

fn qual_name() -> impl Strategy<Value = QualName> {
    (prop::option::of(ident()), ident()).prop_map(|(o, n)| QualName::new(o, n))
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9.-]{0,8}",
        "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}"
    ]
}

fn store_ref() -> impl Strategy<Value = StoreRef> {
    (
        prop_oneof![9 => ident().prop_map(StoreName::Named), 1 => Just(StoreName::Local)],
        prop::option::of(host()),
    )
        .prop_map(|(name, host)| StoreRef {
            name,
            host,
            span: Span::default(),
        })
}

fn return_service() -> impl Strategy<Value = ReturnService> {
    prop_oneof![
        any::<bool>().prop_map(|by_request| ReturnService::Receipt { by_request }),
        any::<bool>().prop_map(|by_request| ReturnService::Twosafe { by_request }),
        Just(ReturnService::NoReturn),
    ]
}

fn aggregate() -> impl Strategy<Value = Aggregate> {
    (
        prop_oneof![
            Just(AggFunc::CountStar),
            ident().prop_map(AggFunc::Sum),
            ident().prop_map(AggFunc::Min),
            ident().prop_map(AggFunc::Max),
            ident().prop_map(AggFunc::Avg),
        ],
        prop::option::of(ident()),
    )
        .prop_map(|(func, alias)| Aggregate { func, alias })
}

fn target() -> impl Strategy<Value = TargetSpec> {
    let aggs = || {
        (
            prop::collection::vec(aggregate(), 1..3),
            prop::collection::vec(ident(), 0..3),
        )
    };
    (
        prop_oneof![
            Just(TargetKind::UserCopy),
            Just(TargetKind::PointInTime),
            Just(TargetKind::Replica),
            (
                prop::option::of(any::<bool>()),
                prop::option::of(any::<bool>())
            )
                .prop_map(|(condensed, complete)| TargetKind::Ccd {
                    condensed,
                    complete
                }),
            aggs().prop_map(|(aggregates, group_by)| TargetKind::BaseAggregate {
                aggregates,
                group_by
            }),
            aggs().prop_map(|(aggregates, group_by)| TargetKind::ChangeAggregate {
                aggregates,
                group_by
            }),
        ],
        prop::option::of(qual_name()),
    )
        .prop_map(|(kind, into)| TargetSpec {
            kind,
            into,
            span: Span::default(),
        })
}

fn subscriber_clause() -> impl Strategy<Value = SubscriberClause> {
    (
        prop::collection::vec(store_ref(), 1..3),
        prop::option::of(return_service()),
        prop::option::of(target()),
    )
        .prop_map(|(stores, return_service, target)| SubscriberClause {
            stores,
            return_service,
            return_span: Span::default(),
            target,
            span: Span::default(),
        })
}

fn check_conflicts() -> impl Strategy<Value = CheckConflicts> {
    let report = prop_oneof![
        Just(Report::NoReport),
        (
            "[ -~]{0,10}",
            prop::option::of(prop_oneof![
                Just(ReportFormat::Xml),
                Just(ReportFormat::Standard)
            ])
        )
            .prop_map(|(file, format)| Report::To { file, format }),
    ];
    prop_oneof![
        Just(CheckConflicts::NoCheck),
        (
            ident(),
            prop::option::of(prop_oneof![Just(UpdateBy::System), Just(UpdateBy::User)]),
            prop::option::of(prop_oneof![
                Just(OnException::Rollback),
                Just(OnException::NoAction)
            ]),
            prop::option::of(report),
        )
            .prop_map(|(column, update_by, on_exception, report)| {
                CheckConflicts::ByRowTimestamp {
                    column,
                    update_by,
                    on_exception,
                    report,
                }
            }),
    ]
}

fn inclusion() -> impl Strategy<Value = Inclusion> {
    let group = (
        prop_oneof![Just(ObjectType::Table), Just(ObjectType::Sequence)],
        prop::collection::vec(qual_name(), 0..3),
    )
        .prop_map(|(object_type, names)| ObjectGroup {
            object_type,
            names: names
                .into_iter()
                .map(|name| NamedObject {
                    name,
                    span: Span::default(),
                })
                .collect(),
            span: Span::default(),
        });
    (
        prop_oneof![
            Just(InclusionAction::Include),
            Just(InclusionAction::Exclude)
        ],
        prop::collection::vec(group, 1..3),
    )
        .prop_map(|(action, groups)| Inclusion {
            action,
            groups,
            span: Span::default(),
        })
}

fn element() -> impl Strategy<Value = Element> {
    let kind = prop_oneof![
        Just(ElementKind::Datastore),
        (qual_name(), prop::option::of(check_conflicts())).prop_map(|(table, check)| {
            ElementKind::Table {
                table,
                table_span: Span::default(),
                check,
            }
        }),
        qual_name().prop_map(|sequence| ElementKind::Sequence {
            sequence,
            sequence_span: Span::default()
        }),
    ];
    (
        ident(),
        kind,
        prop_oneof![Just(OwnerRole::Master), Just(OwnerRole::Propagator)],
        store_ref(),
        prop::option::of(prop_oneof![
            Just(Transmit::Durable),
            Just(Transmit::Nondurable)
        ]),
        prop::collection::vec(subscriber_clause(), 1..3),
        prop::collection::vec(inclusion(), 0..2),
    )
        .prop_map(
            |(name, kind, owner_role, owner, transmit, subscribers, inclusions)| Element {
                name,
                name_span: Span::default(),
                kind,
                owner_role,
                owner,
                transmit,
                transmit_span: Span::default(),
                subscribers,
                inclusions,
                span: Span::default(),
            },
        )
}

fn store_attr() -> impl Strategy<Value = StoreAttr> {
    prop_oneof![
        (any::<bool>(), any::<u32>()).prop_map(|(all, failures)| StoreAttr::DisableReturn {
            scope: if all {
                DisableScope::All
            } else {
                DisableScope::Subscriber
            },
            failures
        }),
        any::<bool>().prop_map(StoreAttr::ReturnServicesWhenStopped),
        any::<bool>().prop_map(StoreAttr::DurableCommit),
        any::<u32>().prop_map(StoreAttr::ResumeReturn),
        any::<u32>().prop_map(StoreAttr::ReturnWaitTime),
        prop_oneof![Just(LocalAction::NoAction), Just(LocalAction::Commit)]
            .prop_map(StoreAttr::LocalCommitAction),
        any::<bool>().prop_map(StoreAttr::CompressTraffic),
        any::<bool>().prop_map(StoreAttr::Failover),
        any::<u16>().prop_map(StoreAttr::Port),
        any::<u32>().prop_map(StoreAttr::Timeout),
        any::<u32>().prop_map(StoreAttr::FailThreshold),
        any::<u32>().prop_map(StoreAttr::ConflictReportingSuspendAt),
        any::<u32>().prop_map(StoreAttr::ConflictReportingResumeAt),
        prop_oneof![
            Just(TableDefinitionChecking::Exact),
            Just(TableDefinitionChecking::Relaxed)
        ]
        .prop_map(StoreAttr::TableDefinitionChecking),
    ]
}

fn store_clause() -> impl Strategy<Value = StoreClause> {
    (store_ref(), prop::collection::vec(store_attr(), 0..4)).prop_map(|(store, attrs)| {
        StoreClause {
            store,
            attributes: attrs
                .into_iter()
                .map(|attr| StoreAttribute {
                    attr,
                    span: Span::default(),
                })
                .collect(),
            span: Span::default(),
        }
    })
}

fn route() -> impl Strategy<Value = Route> {
    let address = (any::<bool>(), host(), 1u8..=99).prop_map(|(m, host, priority)| RouteAddress {
        side: if m {
            RouteSide::MasterIp
        } else {
            RouteSide::SubscriberIp
        },
        host,
        priority,
        span: Span::default(),
    });
    (
        store_ref(),
        store_ref(),
        prop::collection::vec(address, 1..3),
    )
        .prop_map(|(master, subscriber, addresses)| Route {
            master,
            subscriber,
            addresses,
            span: Span::default(),
        })
}

fn scheme() -> impl Strategy<Value = Scheme> {
    (
        qual_name(),
        prop::collection::vec(element(), 1..4),
        prop::collection::vec(store_clause(), 0..3),
        prop::collection::vec(route(), 0..2),
    )
        .prop_map(|(name, elements, stores, routes)| Scheme {
            name,
            name_span: Span::default(),
            elements,
            stores,
            routes,
            span: Span::default(),
        })
}

fn alter_statement() -> impl Strategy<Value = AlterReplication> {
    let target = prop_oneof![
        ident().prop_map(|name| ElementTarget::Named {
            name,
            span: Span::default()
        }),
        store_ref().prop_map(ElementTarget::AllIn),
    ];
    let action = prop_oneof![
        subscriber_clause().prop_map(ElementAction::AddSubscriber),
        (prop::collection::vec(store_ref(), 1..3), return_service()).prop_map(
            |(stores, return_service)| ElementAction::AlterSubscriber {
                stores,
                return_service
            }
        ),
        return_service().prop_map(ElementAction::SetReturnService),
        prop::collection::vec(store_ref(), 1..3).prop_map(ElementAction::DropSubscriber),
        inclusion().prop_map(ElementAction::Inclusion),
    ];
    let named_action = prop_oneof![
        ident().prop_map(|name| ElementAction::SetName {
            name,
            span: Span::default()
        }),
        check_conflicts().prop_map(ElementAction::SetCheckConflicts),
    ];
    let all_in_action = prop_oneof![
        store_ref().prop_map(ElementAction::SetMaster),
        store_ref().prop_map(ElementAction::SetPropagator),
    ];
    let alter_element = (target, action).prop_map(|(target, action)| AlterOp::AlterElement {
        target,
        action,
        span: Span::default(),
    });
    let named = (ident(), named_action).prop_map(|(name, action)| AlterOp::AlterElement {
        target: ElementTarget::Named {
            name,
            span: Span::default(),
        },
        action,
        span: Span::default(),
    });
    let all_in = (store_ref(), all_in_action).prop_map(|(s, action)| AlterOp::AlterElement {
        target: ElementTarget::AllIn(s),
        action,
        span: Span::default(),
    });
    let op = prop_oneof![
        element().prop_map(AlterOp::AddElement),
        alter_element,
        named,
        all_in,
        store_ref().prop_map(|s| AlterOp::DropElement {
            target: ElementTarget::AllIn(s),
            span: Span::default()
        }),
        store_clause().prop_map(AlterOp::AddStore),
        (store_clause(), store_attr()).prop_map(|(mut c, a)| {
            c.attributes.push(StoreAttribute {
                attr: a,
                span: Span::default(),
            });
            AlterOp::AlterStore(c)
        }),
        route().prop_map(AlterOp::AddRoute),
        route().prop_map(|r| AlterOp::DropRoute(DropRoute {
            master: r.master,
            subscriber: r.subscriber,
            addresses: r.addresses.into_iter().map(|a| (a.side, a.host)).collect(),
            span: Span::default(),
        })),
    ];
    (qual_name(), prop::collection::vec(op, 1..4)).prop_map(|(name, ops)| AlterReplication {
        name,
        name_span: Span::default(),
        ops,
        span: Span::default(),
    })
}

/// A valid table-level scheme: master `m` owns `n` tables, each with some of the
/// subscribers `s0..s3`.
fn valid_scheme() -> impl Strategy<Value = Scheme> {
    prop::collection::vec(
        (
            prop::sample::subsequence(vec![0usize, 1, 2, 3], 1..=4),
            prop::option::of(return_service()),
        ),
        1..4,
    )
    .prop_map(|tables| {
        let mut text = String::from("CREATE REPLICATION repl.r\n");
        for (i, (subs, rs)) in tables.iter().enumerate() {
            let subs: Vec<String> = subs.iter().map(|s| format!("s{s} ON \"h{s}\"")).collect();
            let rs = rs
                .map(|r| hawser_scheme::print::return_service(&r).to_string())
                .unwrap_or_default();
            text.push_str(&format!(
                "ELEMENT e{i} TABLE repl.t{i} MASTER m ON \"hm\" SUBSCRIBER {} {rs}\n",
                subs.join(", ")
            ));
        }
        text.push_str("STORE m RETURN WAIT TIME 5;");
        match parse_statement(&text) {
            Ok(Statement::Create(s)) => s,
            other => panic!("generator wrote a bad scheme: {other:?}\n{text}"),
        }
    })
}

fn alter_of(text: &str) -> AlterReplication {
    match parse_statement(text) {
        Ok(Statement::Alter(a)) => a,
        other => panic!("{other:?}"),
    }
}

/// Words and symbols that the scheme language is made of, for token soups.
const VOCABULARY: &[&str] = &[
    "CREATE",
    "ALTER",
    "DROP",
    "REPLICATION",
    "ELEMENT",
    "DATASTORE",
    "TABLE",
    "SEQUENCE",
    "MASTER",
    "PROPAGATOR",
    "SUBSCRIBER",
    "ON",
    "RETURN",
    "RECEIPT",
    "TWOSAFE",
    "BY",
    "REQUEST",
    "NO",
    "STORE",
    "PORT",
    "ROUTE",
    "MASTERIP",
    "PRIORITY",
    "INCLUDE",
    "EXCLUDE",
    "ADD",
    "SET",
    "NAME",
    "IN",
    "*",
    "AS",
    "CCD",
    "BASE",
    "AGGREGATE",
    "(",
    ")",
    "COUNT",
    "CHECK",
    "CONFLICTS",
    "ROW",
    "TIMESTAMP",
    "COLUMN",
    "REPORT",
    "TO",
    "'f'",
    "SELF",
    ",",
    ";",
    ".",
    "a",
    "b",
    "m",
    "s",
    "\"h\"",
    "1",
    "99",
    "100",
    "70000",
    "99999999999999999999999",
    "--c\n",
    "/*",
    "*/",
    "TRANSMIT",
    "NONDURABLE",
    "DISABLE",
    "ALL",
    "WAIT",
    "TIME",
    "GROUP",
    "INTO",
    "\"",
    "'",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn printed_schemes_parse_back_equal(s in scheme()) {
        let statement = Statement::Create(s);
        let text = print_statement(&statement);
        let back = parse_statement(&text);
        prop_assert_eq!(back.as_ref().ok(), Some(&statement), "{}\n{:?}", text, back);
    }

    #[test]
    fn printed_alters_parse_back_equal(a in alter_statement()) {
        let statement = Statement::Alter(a);
        let text = print_statement(&statement);
        let back = parse_statement(&text);
        prop_assert_eq!(back.as_ref().ok(), Some(&statement), "{}\n{:?}", text, back);
    }

    #[test]
    fn set_master_to_a_subscriber_and_back_is_identity(s in valid_scheme(), pick in any::<prop::sample::Index>()) {
        prop_assert!(hawser_scheme::validate(&s).is_ok());
        let subs: Vec<StoreName> = s.elements[0].subscriber_stores().map(|x| x.name.clone()).collect();
        let new = subs[pick.index(subs.len())].to_string();
        let failover = alter_of(&format!("ALTER REPLICATION repl.r ALTER ELEMENT * IN m SET MASTER {new}"));
        // Always valid here: the tables are distinct, so any database may own them.
        let after = apply(&s, &failover).unwrap();
        for (before, el) in s.elements.iter().zip(&after.elements) {
            let was_sub = before.subscriber_stores().any(|x| x.name.to_string() == new);
            prop_assert_eq!(el.owner.name.to_string(), new.clone());
            prop_assert_eq!(el.subscriber_stores().any(|x| x.name.to_string() == "m"), was_sub);
            prop_assert!(!el.subscriber_stores().any(|x| x.name.to_string() == new));
            prop_assert_eq!(el.subscriber_stores().count(), before.subscriber_stores().count());
        }
        // Printing the altered scheme reads back the same scheme.
        let again = parse_statement(&print_statement(&Statement::Create(after.clone())));
        prop_assert_eq!(again.ok(), Some(Statement::Create(after.clone())));
        // When every element had the new master as a subscriber the swap is reversible.
        if s.elements.iter().all(|e| e.subscriber_stores().any(|x| x.name.to_string() == new)) {
            let back = alter_of(&format!("ALTER REPLICATION repl.r ALTER ELEMENT * IN {new} SET MASTER m"));
            prop_assert_eq!(apply(&after, &back).ok(), Some(s.clone()));
        }
    }

    #[test]
    fn add_then_drop_subscriber_is_identity(s in valid_scheme(), rs in prop::option::of(return_service())) {
        let rs = rs.map(|r| hawser_scheme::print::return_service(&r)).unwrap_or("");
        let add = alter_of(&format!("ALTER REPLICATION repl.r ALTER ELEMENT e0 ADD SUBSCRIBER newcomer ON \"hn\" {rs}"));
        let added = apply(&s, &add).unwrap();
        prop_assert!(added.elements[0].subscriber_stores().any(|x| x.name.to_string() == "newcomer"));
        let drop = alter_of("ALTER REPLICATION repl.r ALTER ELEMENT e0 DROP SUBSCRIBER newcomer");
        prop_assert_eq!(apply(&added, &drop).unwrap(), s);
    }

    #[test]
    fn rename_and_rename_back_is_identity(s in valid_scheme()) {
        let there = alter_of("ALTER REPLICATION repl.r ALTER ELEMENT e0 SET NAME renamed");
        let back = alter_of("ALTER REPLICATION repl.r ALTER ELEMENT renamed SET NAME e0");
        let renamed = apply(&s, &there).unwrap();
        prop_assert_eq!(&renamed.elements[0].name, &Ident::unquoted("renamed"));
        prop_assert_eq!(apply(&renamed, &back).unwrap(), s);
    }

    #[test]
    fn alter_store_sets_each_attribute_once(s in valid_scheme(), wait in 0u32..1000) {
        let alter = alter_of(&format!("ALTER REPLICATION repl.r ALTER STORE m SET RETURN WAIT TIME {wait} PORT 4000"));
        let after = apply(&s, &alter).unwrap();
        let attrs: Vec<StoreAttr> = after.stores.iter().filter(|c| c.store.name.to_string() == "m")
            .flat_map(|c| c.attributes.iter().map(|a| a.attr)).collect();
        prop_assert_eq!(attrs, vec![StoreAttr::ReturnWaitTime(wait), StoreAttr::Port(4000)]);
    }

    #[test]
    fn failed_alter_leaves_scheme_untouched(s in valid_scheme()) {
        // The second operation fails, so the first must not show either.
        let alter = alter_of("ALTER REPLICATION repl.r ALTER ELEMENT e0 SET NAME x ALTER ELEMENT nosuch SET NAME y");
        let before = s.clone();
        prop_assert!(apply(&s, &alter).is_err());
        prop_assert_eq!(s, before);
    }

    #[test]
    fn token_soup_never_panics(words in prop::collection::vec(prop::sample::select(VOCABULARY), 0..60)) {
        let text = words.join(" ");
        let report = check_source("soup.sql", &text);
        let _ = report.render_text();
        let _ = report.to_json();
        let _ = format_source(&text);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let text = String::from_utf8_lossy(&bytes);
        let report = check_source("bytes.sql", &text);
        let _ = report.render_text();
        let _ = format_source(&text);
    }

    #[test]
    fn mutated_seed_never_panics(cut in any::<prop::sample::Index>(), len in 0usize..40, insert in prop::sample::select(VOCABULARY)) {
        let seed = include_str!("fixtures/timesten-seed.sql");
        let mut at = cut.index(seed.len());
        while !seed.is_char_boundary(at) { at -= 1; }
        let mut end = (at + len).min(seed.len());
        while !seed.is_char_boundary(end) { end -= 1; }
        let text = format!("{}{insert}{}", &seed[..at], &seed[end..]);
        let report = check_source("mutated.sql", &text);
        let _ = report.render_text();
    }
}
