//! The demo's data and replication scheme, and what the summary reads out of a scheme.
//!
//! The scheme, in the TimesTen language, gives each of the three nodes a different
//! part:
//!
//! ```text
//!                 accounts, events (RETURN TWOSAFE)
//!        ds1 ─────────────────────────────────────► ds2
//!     (MASTER)                                  (SUBSCRIBER of ds1,
//!         │                                      PROPAGATOR of events)
//!         │ accounts (asynchronous,                  │ events (asynchronous,
//!         │  as a CCD change history)                │  COMPRESS TRAFFIC ON)
//!         └──────────────────► ds3 ◄─────────────────┘
//! ```
//!
//! The compressed link is the one the bulk of the workload takes to ds3; the direct
//! links stay uncompressed, so the summary shows the saving next to a stream without
//! one. ds3 keeps `accounts` as a DB2 CCD NONCONDENSED table, `accounts_history`: every
//! change with its operation and commit sequence, the transfer's included. A second
//! scheme, [`BRANCHES_SCHEME`], makes ds2 and ds3 both masters of `branches` with
//! row-timestamp conflict checking, for the demo's conflict (`super::conflict`). The roles, links and table holders shown by the summary are read from the
//! cluster's effective scheme (parsed back from `SHOW`-style DDL), not from the text
//! below, so they show what Raft holds.

use std::collections::BTreeMap;

use hawser_scheme::ast::{ElementKind, OwnerRole, ReturnService, Scheme, StoreName, TargetKind};
use hawser_scheme::print;
use hawser_scheme::route::StoreSettings;
use serde::Serialize;

/// The three nodes, in the order they start; the first is every element's master.
pub(crate) const NODES: [&str; 3] = ["ds1", "ds2", "ds3"];

/// The tables and the nodes that create them: DDL of TABLE elements is not replicated.
/// ds3 has no `accounts`: its subscriber creates `accounts_history` itself.
pub(crate) const TABLES: [(&str, &[&str]); 3] = [
    (
        "create table accounts (
            id       integer primary key,
            owner    varchar(40) not null,
            balance  decimal(12,2) not null,
            opened   date
        )",
        &["ds1", "ds2"],
    ),
    (
        "create table events (k bigint primary key, payload varchar(200))",
        &["ds1", "ds2", "ds3"],
    ),
    (
        "create table branches (
            id       integer primary key,
            city     varchar(40) not null,
            manager  varchar(40) not null,
            tstamp   binary(8)
        )",
        &["ds2", "ds3"],
    ),
];

/// Example rows, written on the master only (replication brings them to the others).
pub(crate) const SEED: &str = "
create sequence account_ids start with 1000 increment by 1;
insert into accounts values
    (account_ids.nextval, 'Ada',    100.00, date '2026-01-05'),
    (account_ids.nextval, 'Brian',  250.50, date '2026-02-11'),
    (account_ids.nextval, 'Chen',    75.25, null);
";

/// One multi-statement transaction on the master, recorded in `events` too: ds3 gets
/// its `accounts` part on ds1's own stream and its `events` part through ds2, so it
/// is split between two streams (the whole of it travels on ds1's; docs/stream.md,
/// "Two paths from one origin to one receiver"). Its event's key is below the
/// workload's.
pub(crate) const TRANSFER: &str = "
begin;
update accounts set balance = balance - 25 where owner = 'Brian';
update accounts set balance = balance + 25 where owner = 'Ada';
insert into events values (-1, 'transfer: 25.00 from Brian to Ada');
commit;
";

/// The table the write workload fills.
pub(crate) const WORKLOAD_TABLE: &str = "events";

/// The replication scheme (checked by `hawser scheme check`; a unit test below keeps it
/// valid).
pub(crate) const SCHEME: &str = "CREATE REPLICATION bank
ELEMENT accounts TABLE accounts
  MASTER ds1
  SUBSCRIBER ds2 RETURN TWOSAFE
  SUBSCRIBER ds3 AS CCD NONCONDENSED INTO accounts_history
ELEMENT events TABLE events
  MASTER ds1
  SUBSCRIBER ds2 RETURN TWOSAFE
ELEMENT events_relay TABLE events
  PROPAGATOR ds2
  SUBSCRIBER ds3
STORE ds1 RETURN WAIT TIME 5 DISABLE RETURN SUBSCRIBER 3 RESUME RETURN 100
STORE ds2 COMPRESS TRAFFIC ON
STORE ds3 TABLE DEFINITION CHECKING EXACT";

/// ds3's change history of `accounts` (the CCD its subscriber keeps).
pub(crate) const HISTORY_TABLE: &str = "accounts_history";

/// A bidirectional scheme as the TimesTen seed's Example 10-31 writes one: ds2 and ds3
/// both master `branches`; a received change older than the row is a conflict.
pub(crate) const BRANCHES_SCHEME: &str = "CREATE REPLICATION branches
ELEMENT branches_ds2 TABLE branches
  CHECK CONFLICTS BY ROW TIMESTAMP COLUMN tstamp UPDATE BY SYSTEM ON EXCEPTION NO ACTION
  MASTER ds2
  SUBSCRIBER ds3
ELEMENT branches_ds3 TABLE branches
  CHECK CONFLICTS BY ROW TIMESTAMP COLUMN tstamp UPDATE BY SYSTEM ON EXCEPTION NO ACTION
  MASTER ds3
  SUBSCRIBER ds2";

/// The row both sides of the conflict update.
pub(crate) const BRANCH_ROW: &str =
    "insert into branches (id, city, manager) values (1, 'Lisbon', 'Ada')";

/// One element as the summary shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ElementRoles {
    pub(crate) element: String,
    /// DATASTORE, TABLE or SEQUENCE.
    pub(crate) kind: String,
    /// The table or sequence; `*` for a DATASTORE element.
    pub(crate) object: String,
    /// MASTER or PROPAGATOR.
    pub(crate) owner_role: String,
    pub(crate) owner: String,
    pub(crate) subscribers: Vec<SubscriberRole>,
}

/// One subscriber of an element and its return service.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SubscriberRole {
    pub(crate) store: String,
    /// `RETURN TWOSAFE`, `RETURN RECEIPT`, ... or `NO RETURN` (asynchronous).
    pub(crate) return_service: String,
    /// `AS ...` when the subscriber keeps a target table other than a plain copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<String>,
}

fn store_name(name: &StoreName) -> String {
    name.to_string()
}

/// Every element's owner and subscribers.
pub(crate) fn roles(scheme: &Scheme) -> Vec<ElementRoles> {
    scheme
        .elements
        .iter()
        .map(|el| ElementRoles {
            element: el.name.to_string(),
            kind: el.kind.keyword().to_string(),
            object: match &el.kind {
                ElementKind::Datastore => "*".to_string(),
                ElementKind::Table { table, .. } => print::qual_name(table),
                ElementKind::Sequence { sequence, .. } => print::qual_name(sequence),
            },
            owner_role: match el.owner_role {
                OwnerRole::Master => "MASTER",
                OwnerRole::Propagator => "PROPAGATOR",
            }
            .to_string(),
            owner: store_name(&el.owner.name),
            subscribers: el
                .subscribers
                .iter()
                .flat_map(|clause| {
                    let rs = clause.return_service.unwrap_or(ReturnService::NoReturn);
                    let target = clause.target.as_ref().map(print::target);
                    clause.stores.iter().map(move |s| SubscriberRole {
                        store: store_name(&s.name),
                        return_service: print::return_service(&rs).to_string(),
                        target: target.clone(),
                    })
                })
                .collect(),
        })
        .collect()
}

/// The STORE clauses, one line each (`ds2: COMPRESS TRAFFIC ON`).
pub(crate) fn store_lines(scheme: &Scheme) -> Vec<String> {
    scheme
        .stores
        .iter()
        .map(|c| {
            let attrs: Vec<String> = c
                .attributes
                .iter()
                .map(|a| print::store_attr(&a.attr))
                .collect();
            format!("{}: {}", print::store_ref(&c.store), attrs.join(", "))
        })
        .collect()
}

/// The (sender, receiver) pairs the scheme streams over, in the order written.
pub(crate) fn links(scheme: &Scheme) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for el in &scheme.elements {
        let sender = store_name(&el.owner.name);
        for s in el.subscriber_stores() {
            let pair = (sender.clone(), store_name(&s.name));
            if !out.contains(&pair) {
                out.push(pair);
            }
        }
    }
    out
}

/// Whether `sender`'s STORE clause turns COMPRESS TRAFFIC on (what it sends).
pub(crate) fn compressed(scheme: &Scheme, sender: &str) -> bool {
    StoreSettings::of(scheme, &hawser_core::Ident::unquoted(sender)).compress_traffic
}

/// The tables of TABLE elements and the stores that hold a copy (owners and
/// subscribers that keep no other target), master first.
pub(crate) fn table_holders(scheme: &Scheme) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for el in &scheme.elements {
        let ElementKind::Table { table, .. } = &el.kind else {
            continue;
        };
        let holders = out.entry(print::qual_name(table)).or_default();
        let copies = el
            .subscribers
            .iter()
            .filter(|c| c.target.as_ref().is_none_or(|t| is_copy(table, t)))
            .flat_map(|c| c.stores.iter());
        let stores = std::iter::once(&el.owner).chain(copies);
        for s in stores {
            let name = store_name(&s.name);
            if !holders.contains(&name) {
                holders.push(name);
            }
        }
    }
    out
}

/// Whether a subscriber's `AS target` keeps a copy of `table`.
fn is_copy(table: &hawser_core::QualName, t: &hawser_scheme::ast::TargetSpec) -> bool {
    matches!(t.kind, TargetKind::UserCopy | TargetKind::Replica)
        && t.into.as_ref().is_none_or(|i| i == table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo_scheme() -> Scheme {
        let report = hawser_scheme::check_source("demo", SCHEME);
        assert!(report.is_ok(), "{:?}", report.diagnostics);
        match hawser_scheme::parse(SCHEME).expect("parses").remove(0) {
            hawser_scheme::Statement::Create(s) => s,
            other => panic!("not a CREATE REPLICATION: {other:?}"),
        }
    }

    #[test]
    fn the_demo_scheme_is_valid_and_names_the_three_nodes() {
        let scheme = demo_scheme();
        assert_eq!(
            links(&scheme),
            [("ds1", "ds2"), ("ds1", "ds3"), ("ds2", "ds3")].map(|(a, b)| (a.into(), b.into()))
        );
        assert!(compressed(&scheme, "ds2"));
        assert!(!compressed(&scheme, "ds1"));
        let holders = table_holders(&scheme);
        // ds3 keeps a change history of accounts, not a copy.
        assert_eq!(holders["accounts"], ["ds1", "ds2"]);
        assert_eq!(holders["events"], ["ds1", "ds2", "ds3"]);
    }

    #[test]
    fn the_branches_scheme_is_valid_and_checks_conflicts_both_ways() {
        let report = hawser_scheme::check_source("branches", BRANCHES_SCHEME);
        assert!(report.is_ok(), "{:?}", report.diagnostics);
    }

    #[test]
    fn roles_show_owners_and_return_services() {
        let roles = roles(&demo_scheme());
        assert_eq!(roles.len(), 3);
        assert_eq!(roles[0].owner_role, "MASTER");
        assert_eq!(roles[0].subscribers[0].return_service, "RETURN TWOSAFE");
        assert_eq!(roles[0].subscribers[1].return_service, "NO RETURN");
        assert_eq!(roles[2].owner_role, "PROPAGATOR");
        assert_eq!(roles[2].owner, "ds2");
        let stores = store_lines(&demo_scheme());
        assert_eq!(stores[1], "ds2: COMPRESS TRAFFIC ON");
    }
}
