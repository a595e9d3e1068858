//! The canonical printer.
//!
//! Prints statements in one fixed layout: keywords upper case, elements then STORE then
//! ROUTE clauses, two-space indentation, every host in double quotes, every name that
//! would read back differently (upper case, odd characters, or one of the language's
//! words) in double quotes. Re-parsing the output gives back an equal AST (property
//! tested in `tests/roundtrip.rs`); `SHOW`-style output and `hawser scheme fmt` use it.

use std::fmt::{self, Write};

use hawser_core::{Ident, QualName};

use crate::ast::*;

/// Every word the grammar gives a meaning to. A name spelled like one is printed quoted.
pub const KEYWORDS: &[&str] = &[
    "ACTION",
    "ADD",
    "AGGREGATE",
    "ALL",
    "ALTER",
    "AS",
    "AT",
    "AVG",
    "BASE",
    "BY",
    "CCD",
    "CHANGE",
    "CHECK",
    "CHECKING",
    "COLUMN",
    "COMMIT",
    "COMPLETE",
    "COMPRESS",
    "CONDENSED",
    "CONFLICT",
    "CONFLICTS",
    "COPY",
    "COUNT",
    "CREATE",
    "DATASTORE",
    "DEFINITION",
    "DISABLE",
    "DROP",
    "DURABLE",
    "ELEMENT",
    "EXACT",
    "EXCEPTION",
    "EXCLUDE",
    "FAILOVER",
    "FAILTHRESHOLD",
    "FORMAT",
    "GROUP",
    "IN",
    "INCLUDE",
    "INTO",
    "LOCAL",
    "MASTER",
    "MASTERIP",
    "MAX",
    "MIN",
    "NAME",
    "NO",
    "NONCOMPLETE",
    "NONCONDENSED",
    "NONDURABLE",
    "OFF",
    "ON",
    "POINT",
    "PORT",
    "PRIORITY",
    "PROPAGATOR",
    "RECEIPT",
    "RELAXED",
    "REPLICA",
    "REPLICATION",
    "REPORT",
    "REPORTING",
    "REQUEST",
    "RESUME",
    "RETURN",
    "ROLLBACK",
    "ROUTE",
    "ROW",
    "SELF",
    "SEQUENCE",
    "SERVICES",
    "SET",
    "STANDARD",
    "STOPPED",
    "STORE",
    "SUBSCRIBER",
    "SUBSCRIBERIP",
    "SUM",
    "SUSPEND",
    "SYSTEM",
    "TABLE",
    "TIME",
    "TIMEOUT",
    "TIMESTAMP",
    "TO",
    "TRAFFIC",
    "TRANSMIT",
    "TWOSAFE",
    "UPDATE",
    "USER",
    "WAIT",
    "WHEN",
    "WORK",
    "XML",
];

fn is_keyword(s: &str) -> bool {
    KEYWORDS.iter().any(|k| k.eq_ignore_ascii_case(s))
}

/// `ident` as it must be written to read back the same.
pub fn ident(id: &Ident) -> String {
    if id.needs_quotes() || is_keyword(id.as_str()) {
        format!("\"{}\"", id.as_str().replace('"', "\"\""))
    } else {
        id.as_str().to_string()
    }
}

pub fn qual_name(name: &QualName) -> String {
    match &name.owner {
        Some(owner) => format!("{}.{}", ident(owner), ident(&name.name)),
        None => ident(&name.name),
    }
}

fn quoted_host(host: &str) -> String {
    format!("\"{}\"", host.replace('"', "\"\""))
}

pub fn store_ref(store: &StoreRef) -> String {
    let mut out = match &store.name {
        StoreName::Local => "SELF".to_string(),
        StoreName::Named(name) => ident(name),
    };
    if let Some(host) = &store.host {
        out.push_str(" ON ");
        out.push_str(&quoted_host(host));
    }
    out
}

pub fn return_service(rs: &ReturnService) -> &'static str {
    match rs {
        ReturnService::Receipt { by_request: false } => "RETURN RECEIPT",
        ReturnService::Receipt { by_request: true } => "RETURN RECEIPT BY REQUEST",
        ReturnService::Twosafe { by_request: false } => "RETURN TWOSAFE",
        ReturnService::Twosafe { by_request: true } => "RETURN TWOSAFE BY REQUEST",
        ReturnService::NoReturn => "NO RETURN",
    }
}

fn on_off(on: bool) -> &'static str {
    if on {
        "ON"
    } else {
        "OFF"
    }
}

pub fn store_attr(attr: &StoreAttr) -> String {
    match attr {
        StoreAttr::DisableReturn { scope, failures } => {
            let scope = match scope {
                DisableScope::Subscriber => "SUBSCRIBER",
                DisableScope::All => "ALL",
            };
            format!("DISABLE RETURN {scope} {failures}")
        }
        StoreAttr::ReturnServicesWhenStopped(on) => {
            format!("RETURN SERVICES {} WHEN REPLICATION STOPPED", on_off(*on))
        }
        StoreAttr::DurableCommit(on) => format!("DURABLE COMMIT {}", on_off(*on)),
        StoreAttr::ResumeReturn(ms) => format!("RESUME RETURN {ms}"),
        StoreAttr::ReturnWaitTime(s) => format!("RETURN WAIT TIME {s}"),
        StoreAttr::LocalCommitAction(LocalAction::NoAction) => {
            "LOCAL COMMIT ACTION NO ACTION".into()
        }
        StoreAttr::LocalCommitAction(LocalAction::Commit) => "LOCAL COMMIT ACTION COMMIT".into(),
        StoreAttr::CompressTraffic(on) => format!("COMPRESS TRAFFIC {}", on_off(*on)),
        StoreAttr::Failover(on) => format!("FAILOVER {}", on_off(*on)),
        StoreAttr::Port(p) => format!("PORT {p}"),
        StoreAttr::Timeout(s) => format!("TIMEOUT {s}"),
        StoreAttr::FailThreshold(n) => format!("FAILTHRESHOLD {n}"),
        StoreAttr::ConflictReportingSuspendAt(n) => format!("CONFLICT REPORTING SUSPEND AT {n}"),
        StoreAttr::ConflictReportingResumeAt(n) => format!("CONFLICT REPORTING RESUME AT {n}"),
        StoreAttr::TableDefinitionChecking(TableDefinitionChecking::Exact) => {
            "TABLE DEFINITION CHECKING EXACT".into()
        }
        StoreAttr::TableDefinitionChecking(TableDefinitionChecking::Relaxed) => {
            "TABLE DEFINITION CHECKING RELAXED".into()
        }
    }
}

fn check_conflicts(check: &CheckConflicts) -> String {
    match check {
        CheckConflicts::NoCheck => "NO CHECK".into(),
        CheckConflicts::ByRowTimestamp {
            column,
            update_by,
            on_exception,
            report,
        } => {
            let mut out = format!("CHECK CONFLICTS BY ROW TIMESTAMP COLUMN {}", ident(column));
            match update_by {
                Some(UpdateBy::System) => out.push_str(" UPDATE BY SYSTEM"),
                Some(UpdateBy::User) => out.push_str(" UPDATE BY USER"),
                None => {}
            }
            match on_exception {
                Some(OnException::Rollback) => out.push_str(" ON EXCEPTION ROLLBACK WORK"),
                Some(OnException::NoAction) => out.push_str(" ON EXCEPTION NO ACTION"),
                None => {}
            }
            match report {
                Some(Report::NoReport) => out.push_str(" NO REPORT"),
                Some(Report::To { file, format }) => {
                    let _ = write!(out, " REPORT TO '{}'", file.replace('\'', "''"));
                    match format {
                        Some(ReportFormat::Xml) => out.push_str(" FORMAT XML"),
                        Some(ReportFormat::Standard) => out.push_str(" FORMAT STANDARD"),
                        None => {}
                    }
                }
                None => {}
            }
            out
        }
    }
}

fn aggregate(agg: &Aggregate) -> String {
    let mut out = match &agg.func {
        AggFunc::CountStar => "COUNT(*)".to_string(),
        AggFunc::Sum(c) => format!("SUM({})", ident(c)),
        AggFunc::Min(c) => format!("MIN({})", ident(c)),
        AggFunc::Max(c) => format!("MAX({})", ident(c)),
        AggFunc::Avg(c) => format!("AVG({})", ident(c)),
    };
    if let Some(alias) = &agg.alias {
        let _ = write!(out, " AS {}", ident(alias));
    }
    out
}

pub fn target(spec: &TargetSpec) -> String {
    let aggregate_body = |aggs: &[Aggregate], group_by: &[Ident]| {
        let mut out = format!(
            "({})",
            aggs.iter().map(aggregate).collect::<Vec<_>>().join(", ")
        );
        if !group_by.is_empty() {
            let cols: Vec<_> = group_by.iter().map(ident).collect();
            let _ = write!(out, " GROUP BY {}", cols.join(", "));
        }
        out
    };
    let mut out = match &spec.kind {
        TargetKind::UserCopy => "AS USER COPY".to_string(),
        TargetKind::PointInTime => "AS POINT IN TIME".to_string(),
        TargetKind::Replica => "AS REPLICA".to_string(),
        TargetKind::Ccd {
            condensed,
            complete,
        } => {
            let mut out = "AS CCD".to_string();
            match condensed {
                Some(true) => out.push_str(" CONDENSED"),
                Some(false) => out.push_str(" NONCONDENSED"),
                None => {}
            }
            match complete {
                Some(true) => out.push_str(" COMPLETE"),
                Some(false) => out.push_str(" NONCOMPLETE"),
                None => {}
            }
            out
        }
        TargetKind::BaseAggregate {
            aggregates,
            group_by,
        } => format!("AS BASE AGGREGATE {}", aggregate_body(aggregates, group_by)),
        TargetKind::ChangeAggregate {
            aggregates,
            group_by,
        } => format!(
            "AS CHANGE AGGREGATE {}",
            aggregate_body(aggregates, group_by)
        ),
    };
    if let Some(into) = &spec.into {
        let _ = write!(out, " INTO {}", qual_name(into));
    }
    out
}

fn subscriber_clause(clause: &SubscriberClause) -> String {
    let stores: Vec<_> = clause.stores.iter().map(store_ref).collect();
    let mut out = stores.join(", ");
    if let Some(rs) = &clause.return_service {
        out.push(' ');
        out.push_str(return_service(rs));
    }
    if let Some(spec) = &clause.target {
        out.push(' ');
        out.push_str(&target(spec));
    }
    out
}

fn inclusion(inc: &Inclusion) -> String {
    let mut out = match inc.action {
        InclusionAction::Include => "INCLUDE ".to_string(),
        InclusionAction::Exclude => "EXCLUDE ".to_string(),
    };
    let groups: Vec<String> = inc
        .groups
        .iter()
        .map(|g| {
            let kw = match g.object_type {
                ObjectType::Table => "TABLE",
                ObjectType::Sequence => "SEQUENCE",
            };
            if g.names.is_empty() {
                kw.to_string()
            } else {
                let names: Vec<_> = g.names.iter().map(|n| qual_name(&n.name)).collect();
                format!("{kw} {}", names.join(", "))
            }
        })
        .collect();
    out.push_str(&groups.join(", "));
    out
}

/// An element, its first line at `indent`, the rest two spaces deeper.
fn element(out: &mut String, el: &Element, indent: &str) {
    let _ = write!(
        out,
        "{indent}ELEMENT {} {}",
        ident(&el.name),
        el.kind.keyword()
    );
    let inner = format!("{indent}  ");
    match &el.kind {
        ElementKind::Datastore => {}
        ElementKind::Table { table, check, .. } => {
            let _ = write!(out, " {}", qual_name(table));
            if let Some(check) = check {
                let _ = write!(out, "\n{inner}{}", check_conflicts(check));
            }
        }
        ElementKind::Sequence { sequence, .. } => {
            let _ = write!(out, " {}", qual_name(sequence));
        }
    }
    let role = match el.owner_role {
        OwnerRole::Master => "MASTER",
        OwnerRole::Propagator => "PROPAGATOR",
    };
    let _ = write!(out, "\n{inner}{role} {}", store_ref(&el.owner));
    match el.transmit {
        Some(Transmit::Durable) => {
            let _ = write!(out, "\n{inner}TRANSMIT DURABLE");
        }
        Some(Transmit::Nondurable) => {
            let _ = write!(out, "\n{inner}TRANSMIT NONDURABLE");
        }
        None => {}
    }
    for clause in &el.subscribers {
        let _ = write!(out, "\n{inner}SUBSCRIBER {}", subscriber_clause(clause));
    }
    for inc in &el.inclusions {
        let _ = write!(out, "\n{inner}{}", inclusion(inc));
    }
}

fn store_clause_body(clause: &StoreClause) -> String {
    let mut out = store_ref(&clause.store);
    for a in &clause.attributes {
        out.push(' ');
        out.push_str(&store_attr(&a.attr));
    }
    out
}

fn route(r: &Route) -> String {
    let mut out = format!(
        "ROUTE MASTER {} SUBSCRIBER {}",
        store_ref(&r.master),
        store_ref(&r.subscriber)
    );
    for a in &r.addresses {
        let _ = write!(
            out,
            " {} {} PRIORITY {}",
            route_side(a.side),
            quoted_host(&a.host),
            a.priority
        );
    }
    out
}

fn route_side(side: RouteSide) -> &'static str {
    match side {
        RouteSide::MasterIp => "MASTERIP",
        RouteSide::SubscriberIp => "SUBSCRIBERIP",
    }
}

fn element_target(t: &ElementTarget) -> String {
    match t {
        ElementTarget::Named { name, .. } => ident(name),
        ElementTarget::AllIn(store) => format!("* IN {}", store_ref(store)),
    }
}

fn store_list(stores: &[StoreRef]) -> String {
    stores.iter().map(store_ref).collect::<Vec<_>>().join(", ")
}

fn alter_op(out: &mut String, op: &AlterOp) {
    match op {
        AlterOp::AddElement(el) => {
            out.push_str("\n  ADD ");
            let mut text = String::new();
            element(&mut text, el, "  ");
            out.push_str(text.trim_start());
        }
        AlterOp::AlterElement { target, action, .. } => {
            let _ = write!(out, "\n  ALTER ELEMENT {} ", element_target(target));
            match action {
                ElementAction::AddSubscriber(clause) => {
                    let _ = write!(out, "ADD SUBSCRIBER {}", subscriber_clause(clause));
                }
                ElementAction::AlterSubscriber {
                    stores,
                    return_service: rs,
                } => {
                    let _ = write!(
                        out,
                        "ALTER SUBSCRIBER {} SET {}",
                        store_list(stores),
                        return_service(rs)
                    );
                }
                ElementAction::SetReturnService(rs) => {
                    let _ = write!(out, "SET {}", return_service(rs));
                }
                ElementAction::DropSubscriber(stores) => {
                    let _ = write!(out, "DROP SUBSCRIBER {}", store_list(stores));
                }
                ElementAction::SetMaster(s) => {
                    let _ = write!(out, "SET MASTER {}", store_ref(s));
                }
                ElementAction::SetPropagator(s) => {
                    let _ = write!(out, "SET PROPAGATOR {}", store_ref(s));
                }
                ElementAction::SetName { name, .. } => {
                    let _ = write!(out, "SET NAME {}", ident(name));
                }
                ElementAction::SetCheckConflicts(c) => {
                    let _ = write!(out, "SET {}", check_conflicts(c));
                }
                ElementAction::Inclusion(inc) => out.push_str(&inclusion(inc)),
            }
        }
        AlterOp::DropElement { target, .. } => {
            let _ = write!(out, "\n  DROP ELEMENT {}", element_target(target));
        }
        AlterOp::AddStore(clause) => {
            let _ = write!(out, "\n  ADD STORE {}", store_clause_body(clause));
        }
        AlterOp::AlterStore(clause) => {
            let attrs: Vec<_> = clause
                .attributes
                .iter()
                .map(|a| store_attr(&a.attr))
                .collect();
            let _ = write!(
                out,
                "\n  ALTER STORE {} SET {}",
                store_ref(&clause.store),
                attrs.join(" ")
            );
        }
        AlterOp::AddRoute(r) => {
            let _ = write!(out, "\n  ADD {}", route(r));
        }
        AlterOp::DropRoute(d) => {
            let _ = write!(
                out,
                "\n  DROP ROUTE MASTER {} SUBSCRIBER {}",
                store_ref(&d.master),
                store_ref(&d.subscriber)
            );
            for (side, host) in &d.addresses {
                let _ = write!(out, " {} {}", route_side(*side), quoted_host(host));
            }
        }
    }
}

/// The canonical text of a scheme, without the final `;`.
pub fn print_scheme(scheme: &Scheme) -> String {
    let mut out = format!("CREATE REPLICATION {}", qual_name(&scheme.name));
    for el in &scheme.elements {
        out.push('\n');
        element(&mut out, el, "");
    }
    for clause in &scheme.stores {
        let _ = write!(out, "\nSTORE {}", store_clause_body(clause));
    }
    for r in &scheme.routes {
        let _ = write!(out, "\n{}", route(r));
    }
    out
}

/// The canonical text of one statement, ending with `;`.
pub fn print_statement(statement: &Statement) -> String {
    let mut out = match statement {
        Statement::Create(scheme) => print_scheme(scheme),
        Statement::Alter(alter) => {
            let mut out = format!("ALTER REPLICATION {}", qual_name(&alter.name));
            for op in &alter.ops {
                alter_op(&mut out, op);
            }
            out
        }
        Statement::Drop(drop) => format!("DROP REPLICATION {}", qual_name(&drop.name)),
    };
    out.push(';');
    out
}

/// Statements in canonical form, separated by a blank line, ending with a newline.
pub fn print_statements(statements: &[Statement]) -> String {
    let mut out = String::new();
    for (i, s) in statements.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&print_statement(s));
        out.push('\n');
    }
    out
}

impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print_statement(self))
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print_scheme(self))
    }
}
