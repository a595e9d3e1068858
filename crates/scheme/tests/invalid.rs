//! One invalid variant per documented restriction: each must fail with the right code
//! at the right line and column. `§` marks where the diagnostic must point; it is
//! removed before checking.

use hawser_scheme::{check_source, ErrorCode};

/// Checks `marked` and asserts a `code` diagnostic at the `§` marker.
fn expect(code: ErrorCode, marked: &str) {
    let at = marked.find('§').expect("test source has a § marker");
    let source = marked.replacen('§', "", 1);
    let before = &source[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    let report = check_source("bad.sql", &source);
    let found = report.diagnostics.iter().find(|d| d.code == code);
    let Some(d) = found else {
        panic!(
            "expected {code}, got:\n{}\nsource:\n{source}",
            report.render_text()
        );
    };
    assert_eq!(
        (d.line, d.column),
        (line, column),
        "{code} at the wrong place:\n{}",
        report.render_text()
    );
    assert!(!report.is_ok());
}

#[test]
fn lexical_and_syntax_errors() {
    expect(
        ErrorCode::Lex,
        "CREATE REPLICATION r\nELEMENT e TABLE t §@ MASTER m SUBSCRIBER s;",
    );
    expect(
        ErrorCode::Lex,
        "CREATE REPLICATION r ELEMENT e TABLE t\n  MASTER m ON §\"open SUBSCRIBER s;",
    );
    expect(
        ErrorCode::Lex,
        "CREATE REPLICATION r ELEMENT e TABLE t /* fine */ MASTER m SUBSCRIBER s\n§/* never closed",
    );
    expect(
        ErrorCode::Syntax,
        "CREATE REPLICATION r\nELEMENT e TABLE t\n  MASTER m\n  §STORE m PORT 1;",
    );
    expect(
        ErrorCode::Syntax,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER m SUBSCRIBER s RETURN §SOMETIMES;",
    );
    expect(ErrorCode::Syntax, "CREATE §TABLE t (a INT);");
    expect(
        ErrorCode::Syntax,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER m§",
    );
    expect(
        ErrorCode::Syntax,
        "ALTER REPLICATION r ALTER ELEMENT e SET §MASTER m;",
    );
    expect(
        ErrorCode::OutOfRange,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER m SUBSCRIBER s\nSTORE m PORT §70000;",
    );
    expect(
        ErrorCode::OutOfRange,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER m SUBSCRIBER s\nROUTE MASTER m SUBSCRIBER s MASTERIP \"1.2.3.4\" PRIORITY §100;",
    );
}

#[test]
fn syntax_errors_do_not_hide_later_statements() {
    let source = "CREATE REPLICATION a ELEMENT e TABLE t MASTER;\n\
                  CREATE REPLICATION b ELEMENT e TABLE t MASTER m SUBSCRIBER m;";
    let report = check_source("two.sql", source);
    let codes: Vec<_> = report.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, [ErrorCode::Syntax, ErrorCode::OwnerIsSubscriber]);
    assert_eq!(report.diagnostics[1].line, 2);
}

#[test]
fn element_restrictions() {
    expect(
        ErrorCode::ElementNameDuplicate,
        "CREATE REPLICATION r\nELEMENT a TABLE t MASTER m SUBSCRIBER s\nELEMENT §a TABLE u MASTER m SUBSCRIBER s;",
    );
    expect(
        ErrorCode::ElementNameDuplicate,
        "CREATE REPLICATION r\nELEMENT a TABLE t MASTER m SUBSCRIBER s\nELEMENT b TABLE §T MASTER m SUBSCRIBER s2;",
    );
    expect(
        ErrorCode::ElementNameDuplicate,
        "CREATE REPLICATION r\nELEMENT a DATASTORE MASTER m SUBSCRIBER s\nELEMENT §b DATASTORE MASTER m SUBSCRIBER s2;",
    );
    expect(
        ErrorCode::OwnerIsSubscriber,
        "CREATE REPLICATION r ELEMENT a DATASTORE\n  MASTER m ON \"h\"\n  SUBSCRIBER s, §m ON \"h\";",
    );
    expect(
        ErrorCode::SubscriberTwice,
        "CREATE REPLICATION r ELEMENT a TABLE t MASTER m\n  SUBSCRIBER s RETURN RECEIPT\n  SUBSCRIBER §s;",
    );
    expect(
        ErrorCode::DatastoreOverlap,
        "CREATE REPLICATION r\nELEMENT d DATASTORE MASTER m SUBSCRIBER s EXCLUDE TABLE u\nELEMENT t TABLE §t MASTER m SUBSCRIBER s2;",
    );
    expect(
        ErrorCode::NondurableNotDatastore,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER m\n  §TRANSMIT NONDURABLE SUBSCRIBER s;",
    );
    expect(
        ErrorCode::InclusionTwice,
        "CREATE REPLICATION r ELEMENT d DATASTORE MASTER m SUBSCRIBER s\n  INCLUDE TABLE a\n  EXCLUDE §TABLE b;",
    );
    expect(
        ErrorCode::InclusionNotDatastore,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER m SUBSCRIBER s\n  §INCLUDE TABLE a;",
    );
    expect(
        ErrorCode::IncludedTwice,
        "CREATE REPLICATION r ELEMENT d DATASTORE MASTER m SUBSCRIBER s\n  EXCLUDE TABLE a, x.b, §X.B;",
    );
    expect(
        ErrorCode::ExcludesEverything,
        "CREATE REPLICATION r ELEMENT §d DATASTORE MASTER m SUBSCRIBER s\n  INCLUDE TABLE;",
    );
    expect(
        ErrorCode::ReturnOnSequence,
        "CREATE REPLICATION r ELEMENT q SEQUENCE s1 MASTER m SUBSCRIBER s §RETURN RECEIPT;",
    );
    expect(
        ErrorCode::TwosafePropagator,
        "CREATE REPLICATION r\nELEMENT a TABLE t MASTER m SUBSCRIBER p\nELEMENT b TABLE t PROPAGATOR p SUBSCRIBER s §RETURN TWOSAFE;",
    );
    expect(
        ErrorCode::PropagatorWithoutSource,
        "CREATE REPLICATION r\nELEMENT a TABLE t MASTER m SUBSCRIBER p\nELEMENT b TABLE u PROPAGATOR §p SUBSCRIBER s;",
    );
    expect(
        ErrorCode::SystemObject,
        "CREATE REPLICATION r ELEMENT e TABLE §sys.tables MASTER m SUBSCRIBER s;",
    );
    expect(
        ErrorCode::HostMismatch,
        "CREATE REPLICATION r\nELEMENT a TABLE t MASTER m ON \"h1\" SUBSCRIBER s\nELEMENT b TABLE u MASTER §m ON h2 SUBSCRIBER s;",
    );
    expect(
        ErrorCode::ConflictCheckMismatch,
        "CREATE REPLICATION r\nELEMENT a TABLE t CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts MASTER m SUBSCRIBER s\nELEMENT b TABLE §t MASTER s SUBSCRIBER m;",
    );
    expect(
        ErrorCode::TargetNotOnTable,
        "CREATE REPLICATION r ELEMENT d DATASTORE MASTER m\n  SUBSCRIBER s §AS CCD CONDENSED;",
    );
    expect(
        ErrorCode::InvalidTarget,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER m\n  SUBSCRIBER s §AS BASE AGGREGATE (SUM(a) AS region) GROUP BY region INTO a;",
    );
    expect(
        ErrorCode::InvalidTarget,
        "CREATE REPLICATION r ELEMENT e TABLE t MASTER m\n  SUBSCRIBER s §AS BASE AGGREGATE (SUM(a)) GROUP BY region;",
    );
}

#[test]
fn store_and_route_restrictions() {
    let head = "CREATE REPLICATION r ELEMENT e TABLE t MASTER m SUBSCRIBER s\n";
    expect(
        ErrorCode::StoreAttributeDuplicate,
        &format!("{head}STORE m PORT 1 TIMEOUT 5 §PORT 2;"),
    );
    expect(
        ErrorCode::StoreAttributeDuplicate,
        &format!("{head}STORE m RETURN WAIT TIME 5\nSTORE m §RETURN WAIT TIME 6;"),
    );
    expect(
        ErrorCode::UnknownStore,
        &format!("{head}STORE §nobody PORT 1;"),
    );
    expect(
        ErrorCode::UnknownStore,
        &format!("{head}ROUTE MASTER m SUBSCRIBER §x MASTERIP \"a\" PRIORITY 1;"),
    );
    expect(
        ErrorCode::DuplicateRoute,
        &format!("{head}ROUTE MASTER m SUBSCRIBER s MASTERIP \"a\" PRIORITY 1 §MASTERIP \"A\" PRIORITY 2;"),
    );
    expect(
        ErrorCode::ConflictReportingDatastore,
        "CREATE REPLICATION r ELEMENT d DATASTORE MASTER m SUBSCRIBER s\nSTORE m §CONFLICT REPORTING SUSPEND AT 10;",
    );
    let many: Vec<String> = (0..256).map(|i| format!("s{i}")).collect();
    expect(
        ErrorCode::TooManySubscribers,
        &format!(
            "CREATE REPLICATION §r ELEMENT e TABLE t MASTER m SUBSCRIBER {};",
            many.join(", ")
        ),
    );
}

const BASE: &str = "CREATE REPLICATION r\n\
    ELEMENT a TABLE t MASTER m SUBSCRIBER s, s2\n\
    ELEMENT d DATASTORE MASTER n SUBSCRIBER s INCLUDE TABLE x, y\n\
    ELEMENT nd DATASTORE MASTER o TRANSMIT NONDURABLE SUBSCRIBER s\n\
    ROUTE MASTER m SUBSCRIBER s MASTERIP \"a\" PRIORITY 1;\n";

#[test]
fn alter_restrictions() {
    expect(
        ErrorCode::SchemeExists,
        &format!("{BASE}CREATE REPLICATION §R ELEMENT e TABLE t MASTER m SUBSCRIBER s;"),
    );
    expect(
        ErrorCode::AlterAfterDrop,
        &format!("{BASE}ALTER REPLICATION r DROP ELEMENT a ALTER ELEMENT §a SET NAME b;"),
    );
    expect(
        ErrorCode::ElementNameDuplicate,
        &format!("{BASE}ALTER REPLICATION r ADD ELEMENT z TABLE z MASTER m SUBSCRIBER s\n  DROP ELEMENT §z;"),
    );
    expect(
        ErrorCode::ElementNameDuplicate,
        &format!("{BASE}ALTER REPLICATION r ADD ELEMENT §a TABLE z MASTER m SUBSCRIBER s;"),
    );
    expect(
        ErrorCode::ElementNotFound,
        &format!("{BASE}ALTER REPLICATION r ALTER ELEMENT §zz SET NAME q;"),
    );
    expect(
        ErrorCode::SubscriberNotFound,
        &format!("{BASE}ALTER REPLICATION r ALTER ELEMENT a DROP SUBSCRIBER §nobody;"),
    );
    expect(
        ErrorCode::NoElementOwnedBy,
        &format!("{BASE}ALTER REPLICATION r ALTER ELEMENT * IN §s SET MASTER m;"),
    );
    expect(
        ErrorCode::RouteNotFound,
        &format!("{BASE}ALTER REPLICATION r §DROP ROUTE MASTER m SUBSCRIBER s2 MASTERIP \"a\";"),
    );
    expect(
        ErrorCode::LastSubscriber,
        &format!("{BASE}ALTER REPLICATION r §ALTER ELEMENT d DROP SUBSCRIBER s;"),
    );
    expect(
        ErrorCode::LastElement,
        "CREATE REPLICATION q ELEMENT a TABLE t MASTER m SUBSCRIBER s;\nALTER REPLICATION q §DROP ELEMENT a;",
    );
    expect(
        ErrorCode::ExcludeNotInElement,
        &format!("{BASE}ALTER REPLICATION r ALTER ELEMENT d EXCLUDE TABLE §w;"),
    );
    expect(
        ErrorCode::NondurableDrop,
        &format!("{BASE}ALTER REPLICATION r §DROP ELEMENT nd;"),
    );
    expect(
        ErrorCode::ConflictCheckNotTable,
        &format!("{BASE}ALTER REPLICATION r\n  §ALTER ELEMENT d SET CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts;"),
    );
    expect(
        ErrorCode::InclusionNotDatastore,
        &format!("{BASE}ALTER REPLICATION r ALTER ELEMENT a §INCLUDE TABLE q;"),
    );
    // The altered scheme is validated: a new subscriber that owns the element.
    expect(
        ErrorCode::OwnerIsSubscriber,
        &format!("{BASE}ALTER REPLICATION r ALTER ELEMENT a ADD SUBSCRIBER §m;"),
    );
    // An ALTER of a scheme the file does not create is checked on its own only.
    let report = check_source(
        "alone.sql",
        "ALTER REPLICATION elsewhere ALTER ELEMENT e SET NAME f;",
    );
    assert!(report.is_ok(), "{}", report.render_text());
}

#[test]
fn text_report_points_at_the_problem() {
    let report = check_source(
        "x.sql",
        "CREATE REPLICATION r\nELEMENT a TABLE t MASTER m SUBSCRIBER s\n\tELEMENT a TABLE u MASTER m SUBSCRIBER s;",
    );
    assert_eq!(
        report.render_text(),
        "x.sql:3:10: error[TT8101]: element name a is used twice\n  \tELEMENT a TABLE u MASTER m SUBSCRIBER s;\n  \t        ^\nx.sql: 1 statement, 1 error\n"
    );
    let json = report.to_json();
    assert_eq!(json["ok"], false);
    assert_eq!(json["diagnostics"][0]["code"], "TT8101");
    assert_eq!(json["diagnostics"][0]["line"], 3);
    assert_eq!(json["diagnostics"][0]["column"], 10);
}
