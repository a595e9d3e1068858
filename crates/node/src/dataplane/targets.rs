//! The target of each table this store receives (`AS target`), gathered from every
//! scheme's links into it, with what is wrong with them; and the BASE AGGREGATE
//! targets the store keeps.

use std::collections::{BTreeMap, BTreeSet};

use hawser_core::{Ident, QualName};
use hawser_scheme::route::{Link, ResolvedTarget};

/// The BASE AGGREGATE targets among `targets` (by source table): the store keeps them.
pub(super) fn base_aggregates(
    targets: &BTreeMap<QualName, ResolvedTarget>,
) -> hawser_store::AggregateRules {
    targets
        .iter()
        .filter(|(table, t)| hawser_target::keeps_copy(table, t))
        .map(|(table, t)| (table.clone(), t.clone()))
        .collect()
}

/// The target of each table `store` receives, by source table, from every scheme's
/// links into it; and what is wrong with them: a table given two targets (the first
/// kept), a CCD or CHANGE AGGREGATE fed by several origins (their commit sequence
/// numbers are independent, so IBMSNAP_COMMITSEQ may repeat).
pub(super) fn inbound_targets(
    store: &Ident,
    planned: &[Link],
) -> (BTreeMap<QualName, ResolvedTarget>, BTreeSet<String>) {
    let mut out: BTreeMap<QualName, ResolvedTarget> = BTreeMap::new();
    let mut origins: BTreeMap<QualName, BTreeSet<&Ident>> = BTreeMap::new();
    let mut problems = BTreeSet::new();
    for link in planned.iter().filter(|l| &l.receiver == store) {
        for t in link.tables.iter().filter(|t| &t.origin != store) {
            let kind = hawser_target::kind_name(&t.target.kind);
            origins
                .entry(t.table.clone())
                .or_default()
                .insert(&t.origin);
            match out.get(&t.table) {
                None => {
                    out.insert(t.table.clone(), t.target.clone());
                }
                Some(first) if first != &t.target => {
                    problems.insert(format!(
                        "table {}: two schemes give store {store} two targets for it ({} into \
                         {} and {kind} into {}); the first is kept",
                        t.table,
                        hawser_target::kind_name(&first.kind),
                        first.into,
                        t.target.into
                    ));
                }
                Some(_) => {}
            }
        }
    }
    for (table, from) in origins.iter().filter(|(_, o)| o.len() > 1) {
        if let Some(t) = out.get(table).filter(|t| {
            matches!(
                t.kind,
                hawser_scheme::ast::TargetKind::Ccd { .. }
                    | hawser_scheme::ast::TargetKind::ChangeAggregate { .. }
            )
        }) {
            problems.insert(format!(
                "table {table}: its {} on store {store} is fed by {} origins, whose commit \
                 sequence numbers are independent: IBMSNAP_COMMITSEQ orders each origin's \
                 changes only",
                hawser_target::kind_name(&t.kind),
                from.len()
            ));
        }
    }
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::inbound_targets;
    use crate::dataplane::testing::planned;
    use hawser_core::Ident;

    /// A subscriber's targets by source table, plain ones included; a CCD fed by two
    /// masters is a problem. Another store's are not its. A BASE AGGREGATE is kept by
    /// the store.
    #[test]
    fn a_subscribers_targets_come_from_the_links_into_it() {
        let mut links = planned(
            "CREATE REPLICATION r \
               ELEMENT a TABLE t MASTER ds1 SUBSCRIBER ds2 AS CCD NONCONDENSED INTO h \
               ELEMENT b TABLE u MASTER ds1 SUBSCRIBER ds2 AS BASE AGGREGATE (COUNT(*)) INTO n \
               ELEMENT c TABLE v MASTER ds1 SUBSCRIBER ds2, ds3 AS POINT IN TIME",
        );
        let ds2 = Ident::unquoted("ds2");
        let (targets, problems) = inbound_targets(&ds2, &links);
        let kinds: Vec<(String, &str, String)> = targets
            .iter()
            .map(|(t, r)| {
                (
                    t.to_string(),
                    hawser_target::kind_name(&r.kind),
                    r.into.to_string(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("t".to_string(), "CCD NONCONDENSED", "h".to_string()),
                ("u".to_string(), "BASE AGGREGATE", "n".to_string()),
                ("v".to_string(), "POINT IN TIME", "v".to_string()),
            ]
        );
        assert!(problems.is_empty(), "{problems:?}");
        let kept: Vec<(String, String)> = super::base_aggregates(&targets)
            .into_iter()
            .map(|(t, r)| (t.to_string(), r.into.to_string()))
            .collect();
        assert_eq!(kept, [("u".to_string(), "n".to_string())]);
        let (for_ds1, _) = inbound_targets(&Ident::unquoted("ds1"), &links);
        assert!(for_ds1.is_empty());
        // t reaching ds2 from a second origin too: its CCD's commit seqs are per origin.
        let mut second = links[0].clone();
        second.sender = Ident::unquoted("ds3");
        for t in &mut second.tables {
            t.origin = Ident::unquoted("ds3");
        }
        links.push(second);
        let (_, problems) = inbound_targets(&ds2, &links);
        assert!(
            problems
                .iter()
                .any(|p| p
                    .contains("table t: its CCD NONCONDENSED on store ds2 is fed by 2 origins")),
            "{problems:?}"
        );
    }
}
