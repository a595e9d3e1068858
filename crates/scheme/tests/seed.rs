//! Every replication statement of the TimesTen seed corpus parses, validates, passes the
//! checker and survives a print / re-parse round trip.

use hawser_scheme::{check_source, parse_statement, print_statement, validate, Statement};

const SEED: &str = include_str!("fixtures/timesten-seed.sql");

/// The seed's statements without comment lines; CREATE TABLE statements (context for
/// the examples, handled by the SQL front end) are left out.
fn replication_statements() -> Vec<String> {
    let text: String = SEED
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty() && !s.to_uppercase().starts_with("CREATE TABLE"))
        .map(|s| format!("{s};"))
        .collect()
}

#[test]
fn seed_has_twenty_one_replication_statements() {
    assert_eq!(replication_statements().len(), 21);
}

#[test]
fn every_seed_statement_parses_validates_and_round_trips() {
    for text in replication_statements() {
        let statement = parse_statement(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let Statement::Create(scheme) = &statement else {
            panic!("not a CREATE: {text}");
        };
        if let Err(errors) = validate(scheme) {
            panic!("{errors:?}\n{text}");
        }
        let printed = print_statement(&statement);
        let reparsed = parse_statement(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(reparsed, statement, "{printed}");
        let report = check_source("seed.sql", &text);
        assert!(report.is_ok(), "{}", report.render_text());
        assert_eq!(report.render_text().lines().count(), 1);
    }
}

#[test]
fn seed_details_are_read_as_timesten_means_them() {
    use hawser_scheme::ast::*;
    let all = replication_statements();
    // "SUBSCRIBER subscriber ON ..." names a database called subscriber.
    let Statement::Create(s) = parse_statement(&all[5]).unwrap() else {
        panic!()
    };
    let subs: Vec<String> = s.elements[0]
        .subscriber_stores()
        .map(|s| s.name.to_string())
        .collect();
    assert_eq!(subs, ["subscriber", "subscriber2"]);
    assert_eq!(
        s.elements[0].subscribers[0].return_service,
        Some(ReturnService::Receipt { by_request: false })
    );
    assert_eq!(
        s.stores[0]
            .attributes
            .iter()
            .map(|a| a.attr)
            .collect::<Vec<_>>(),
        [
            StoreAttr::DisableReturn {
                scope: DisableScope::All,
                failures: 5
            },
            StoreAttr::DurableCommit(true),
            StoreAttr::ResumeReturn(8)
        ]
    );
    // The propagator example: element b is owned by propds as PROPAGATOR.
    let Statement::Create(p) = parse_statement(&all[17]).unwrap() else {
        panic!()
    };
    assert_eq!(p.name.name.as_str(), "propagator");
    assert_eq!(p.elements[1].owner_role, OwnerRole::Propagator);
    // Bare hosts and unquoted names fold to lower case.
    let Statement::Create(d) = parse_statement(&all[0]).unwrap() else {
        panic!()
    };
    assert_eq!(
        d.elements[0].owner,
        StoreRef::named("databasea", Some("system1"))
    );
}
