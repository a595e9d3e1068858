//! Routing plans for the seed's topologies and the catalog-dependent restrictions.

use hawser_core::{ColumnDef, DataType, Ident, NodeId, QualName, TableDef};
use hawser_scheme::ast::*;
use hawser_scheme::route::{plan, SequenceInfo, StoreCatalog, Topology};
use hawser_scheme::{parse_statement, ErrorCode, Scheme};

fn scheme(text: &str) -> Scheme {
    match parse_statement(text) {
        Ok(Statement::Create(s)) => {
            hawser_scheme::validate(&s).unwrap();
            s
        }
        other => panic!("{other:?}"),
    }
}

fn table(name: &str) -> TableDef {
    TableDef {
        name: QualName::parse_unquoted(name),
        columns: vec![ColumnDef {
            name: Ident::unquoted("id"),
            data_type: DataType::Integer,
            nullable: false,
            default: None,
        }],
        primary_key: vec![0],
        explicit_key: true,
    }
}

fn catalog(tables: &[&str], sequences: &[(&str, bool)]) -> StoreCatalog {
    StoreCatalog {
        tables: tables.iter().map(|t| table(t)).collect(),
        sequences: sequences
            .iter()
            .map(|(n, cycle)| SequenceInfo {
                name: QualName::parse_unquoted(n),
                cycle: *cycle,
            })
            .collect(),
    }
}

fn id(s: &str) -> Ident {
    Ident::unquoted(s)
}

#[test]
fn propagator_keeps_the_origin() {
    let s = scheme(
        "CREATE REPLICATION propagator
         ELEMENT a TABLE tab MASTER centralds ON \"finance\" SUBSCRIBER propds ON \"nethandler\"
         ELEMENT b TABLE tab PROPAGATOR propds ON \"nethandler\"
           SUBSCRIBER backup1ds ON \"backupsystem1\", backup2ds ON \"backupsystem2\";",
    );
    let mut topo = Topology::default();
    topo.nodes.insert(id("centralds"), NodeId(1));
    topo.nodes.insert(id("propds"), NodeId(2));
    let p = plan(&s, &topo).unwrap();
    let pairs: Vec<(String, String)> = p
        .links
        .iter()
        .map(|l| (l.sender.to_string(), l.receiver.to_string()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("centralds".into(), "propds".into()),
            ("propds".into(), "backup1ds".into()),
            ("propds".into(), "backup2ds".into())
        ]
    );
    for link in &p.links {
        assert_eq!(link.tables.len(), 1);
        assert_eq!(link.tables[0].origin, id("centralds"));
        assert_eq!(link.tables[0].table, QualName::bare("tab"));
    }
    assert_eq!(p.links[0].sender_node, Some(NodeId(1)));
    assert_eq!(p.links[1].sender_node, Some(NodeId(2)));
    // backup1ds has not joined.
    assert_eq!(p.links[1].receiver_node, None);
}

#[test]
fn bidirectional_datastore_resolves_against_the_masters_catalog() {
    let s = scheme(
        "CREATE REPLICATION bidirect
         ELEMENT a DATASTORE MASTER dba ON \"system1\" SUBSCRIBER dbb ON \"system2\" RETURN TWOSAFE
           EXCLUDE TABLE app.scratch
         ELEMENT b DATASTORE MASTER dbb ON \"system2\" SUBSCRIBER dba ON \"system1\" RETURN TWOSAFE
         STORE dba RETURN WAIT TIME 30 COMPRESS TRAFFIC ON;",
    );
    let mut topo = Topology::default();
    topo.catalogs.insert(
        id("dba"),
        catalog(
            &["app.orders", "app.scratch"],
            &[("app.ids", false), ("app.ring", true)],
        ),
    );
    topo.catalogs
        .insert(id("dbb"), catalog(&["app.orders", "app.scratch"], &[]));
    let p = plan(&s, &topo).unwrap();
    assert_eq!(p.links.len(), 2);
    let ab = &p.links[0];
    assert_eq!((ab.sender.as_str(), ab.receiver.as_str()), ("dba", "dbb"));
    let tables: Vec<String> = ab.tables.iter().map(|t| t.table.to_string()).collect();
    assert_eq!(tables, ["app.orders"]);
    assert!(ab.tables.iter().all(|t| t.origin == id("dba")));
    assert_eq!(
        ab.tables[0].return_service,
        ReturnService::Twosafe { by_request: false }
    );
    // TWOSAFE keeps returning when replication stops, unless the store says otherwise.
    assert!(ab.tables[0].return_when_stopped);
    assert_eq!(ab.sequences.len(), 1, "the CYCLE sequence is left out");
    assert_eq!(p.warnings.len(), 1);
    assert_eq!(p.warnings[0].code, ErrorCode::CycleSequenceSkipped);
    assert_eq!(ab.sender_settings.return_wait_time_s, 30);
    assert!(ab.sender_settings.compress_traffic);
    assert_eq!(ab.receiver_settings.return_wait_time_s, 10);
    assert_eq!(ab.receiver_settings.timeout_s, 120);
    assert_eq!(
        ab.receiver_settings.table_definition_checking,
        TableDefinitionChecking::Relaxed
    );
    // The way back carries dbb's own tables, scratch included, with dbb as origin.
    let ba = &p.links[1];
    assert_eq!(ba.tables.len(), 2);
    assert!(ba.tables.iter().all(|t| t.origin == id("dbb")));
}

#[test]
fn targets_get_their_defaults() {
    let s = scheme(
        "CREATE REPLICATION r ELEMENT e TABLE app.t MASTER m
           SUBSCRIBER s1 RETURN RECEIPT AS CCD NONCONDENSED
           SUBSCRIBER s2 AS CHANGE AGGREGATE (COUNT(*) AS n) GROUP BY region INTO app.t_agg
           SUBSCRIBER s3;",
    );
    let p = plan(&s, &Topology::default()).unwrap();
    let t = |i: usize| &p.links[i].tables[0];
    assert_eq!(
        t(0).target.kind,
        TargetKind::Ccd {
            condensed: Some(false),
            complete: Some(true)
        }
    );
    assert_eq!(t(0).target.into, QualName::parse_unquoted("app.t"));
    assert!(!t(0).return_when_stopped);
    assert_eq!(t(1).target.into, QualName::parse_unquoted("app.t_agg"));
    assert_eq!(t(2).target.kind, TargetKind::UserCopy);
    assert_eq!(t(2).return_service, ReturnService::NoReturn);
}

#[test]
fn catalog_restrictions() {
    let codes = |text: &str, topo: &Topology| -> Vec<ErrorCode> {
        plan(&scheme(text), topo)
            .unwrap_err()
            .into_iter()
            .map(|e| e.code)
            .collect()
    };
    let mut topo = Topology::default();
    topo.catalogs
        .insert(id("m"), catalog(&["t"], &[("ring", true)]));
    assert_eq!(
        codes(
            "CREATE REPLICATION r ELEMENT d DATASTORE MASTER m SUBSCRIBER s INCLUDE TABLE t, nosuch;",
            &topo
        ),
        [ErrorCode::IncludedObjectMissing]
    );
    assert_eq!(
        codes(
            "CREATE REPLICATION r ELEMENT q SEQUENCE ring MASTER m SUBSCRIBER s;",
            &topo
        ),
        [ErrorCode::CycleSequence]
    );
    assert_eq!(
        codes(
            "CREATE REPLICATION r ELEMENT d DATASTORE MASTER m SUBSCRIBER s EXCLUDE TABLE t;",
            &topo
        ),
        [ErrorCode::ExcludesEverything]
    );
    assert_eq!(
        codes(
            "CREATE REPLICATION r ELEMENT d DATASTORE MASTER other SUBSCRIBER s;",
            &topo
        ),
        [ErrorCode::MissingCatalog]
    );
    assert_eq!(
        codes(
            "CREATE REPLICATION r ELEMENT e TABLE t MASTER SELF SUBSCRIBER s;",
            &topo
        ),
        [ErrorCode::UnresolvedSelf]
    );
}
