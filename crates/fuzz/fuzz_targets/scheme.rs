//! Text → the replication scheme language (`hawser_scheme`): the parser (strict and
//! recovering), the validator, ALTER applied to the scheme it alters, the routing
//! planner, the printer and the checker's reports. Errors are fine; a panic, a stack
//! overflow or a hang is a failure, and so is a statement that parses but whose printed
//! form does not parse back to the same statement.
#![no_main]

use hawser_core::{ColumnDef, DataType, Ident, NodeId, QualName, TableDef};
use hawser_scheme::ast::{ElementKind, ObjectType, Statement, StoreName};
use hawser_scheme::route::{SequenceInfo, StoreCatalog, Topology};
use hawser_scheme::Scheme;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let report = hawser_scheme::check_source("fuzz.sql", &text);
    let _ = report.render_text();
    let _ = report.to_json();
    let _ = hawser_scheme::format_source(&text);
    let _ = hawser_scheme::parse_recovering(&text);
    let Ok(statements) = hawser_scheme::parse(&text) else {
        return;
    };
    let printed = hawser_scheme::print_statements(&statements);
    let again = hawser_scheme::parse(&printed).expect("the printed statements parse");
    assert_eq!(
        again, statements,
        "printing changed the statements:\n{printed}"
    );
    // Each CREATE that validates is the scheme the ALTERs after it apply to, as the
    // cluster state machine does.
    let mut current: Option<Scheme> = None;
    for statement in &statements {
        match statement {
            Statement::Create(scheme) => {
                if hawser_scheme::validate(scheme).is_ok() {
                    plan_all(scheme);
                    current = Some(scheme.clone());
                }
            }
            Statement::Alter(alter) => {
                if let Some(scheme) = &current {
                    let _ = hawser_scheme::validate_alter(alter);
                    if let Ok(next) = hawser_scheme::apply(scheme, alter) {
                        if hawser_scheme::validate(&next).is_ok() {
                            let text = hawser_scheme::print_scheme(&next);
                            hawser_scheme::parse(&text).expect("an altered scheme prints");
                            plan_all(&next);
                            current = Some(next);
                        }
                    }
                }
            }
            Statement::Drop(_) => current = None,
        }
    }
});

/// Plans the scheme's links over a topology in which every store it names has a node
/// and every other one has reported a catalog holding every table and sequence the
/// scheme names (the others have not reported: their DATASTORE elements fail to resolve).
fn plan_all(scheme: &Scheme) {
    let mut stores: Vec<&Ident> = Vec::new();
    let mut tables: Vec<QualName> = vec![QualName::bare("tab")];
    let mut sequences: Vec<QualName> = Vec::new();
    for el in &scheme.elements {
        for s in std::iter::once(&el.owner).chain(el.subscriber_stores()) {
            if let StoreName::Named(n) = &s.name {
                if !stores.contains(&n) {
                    stores.push(n);
                }
            }
        }
        match &el.kind {
            ElementKind::Datastore => {}
            ElementKind::Table { table, .. } => tables.push(table.clone()),
            ElementKind::Sequence { sequence, .. } => sequences.push(sequence.clone()),
        }
        for group in el.inclusions.iter().flat_map(|i| &i.groups) {
            let names = group.names.iter().map(|o| o.name.clone());
            match group.object_type {
                ObjectType::Table => tables.extend(names),
                ObjectType::Sequence => sequences.extend(names),
            }
        }
    }
    let catalog = StoreCatalog {
        tables: tables.into_iter().map(table).collect(),
        sequences: sequences
            .into_iter()
            .enumerate()
            .map(|(i, name)| SequenceInfo {
                name,
                cycle: i % 2 == 1,
            })
            .collect(),
    };
    let mut topology = Topology::default();
    for (i, store) in stores.into_iter().enumerate() {
        topology.nodes.insert(store.clone(), NodeId(i as u64 + 1));
        if i % 2 == 0 {
            topology.catalogs.insert(store.clone(), catalog.clone());
        }
    }
    let _ = hawser_scheme::plan(scheme, &topology);
}

fn table(name: QualName) -> TableDef {
    TableDef {
        name,
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
