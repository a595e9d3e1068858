//! What this node's receiver is configured with from the cluster state: the elements
//! this store subscribes to, with their epochs, and the row-timestamp conflict checking
//! of the tables it takes part in.

use std::collections::{BTreeMap, BTreeSet};

use hawser_control::ClusterState;
use hawser_core::{Epoch, Ident, QualName};

/// The row-timestamp conflict checking of the tables `store` masters or subscribes to
/// in a TABLE element with `CHECK CONFLICTS BY ROW TIMESTAMP` (defaults: UPDATE BY
/// SYSTEM, ON EXCEPTION ROLLBACK WORK). A table checked by two elements keeps the
/// first's rule (the scheme checker refuses incompatible ones within one scheme).
pub(super) fn conflict_rules(
    state: &ClusterState,
    store: &Ident,
) -> std::collections::HashMap<QualName, hawser_store::ConflictRule> {
    use hawser_scheme::ast::{CheckConflicts, OnException, UpdateBy};
    let mut out = std::collections::HashMap::new();
    for (_, table, check) in checked_tables(state, store) {
        let CheckConflicts::ByRowTimestamp {
            column,
            update_by,
            on_exception,
            ..
        } = check
        else {
            continue;
        };
        out.entry(table.clone())
            .or_insert_with(|| hawser_store::ConflictRule {
                column: column.clone(),
                by_system: *update_by != Some(UpdateBy::User),
                rollback: *on_exception != Some(OnException::NoAction),
            });
    }
    out
}

/// The TABLE elements with `CHECK CONFLICTS BY ROW TIMESTAMP` that `store` masters or
/// subscribes to, in scheme and element order: each one's scheme, table and clause.
pub(crate) fn checked_tables<'s>(
    state: &'s ClusterState,
    store: &'s Ident,
) -> impl Iterator<
    Item = (
        &'s hawser_scheme::ast::Scheme,
        &'s QualName,
        &'s hawser_scheme::ast::CheckConflicts,
    ),
> + 's {
    use hawser_scheme::ast::{CheckConflicts, ElementKind, StoreName};
    let named = move |n: &StoreName| matches!(n, StoreName::Named(s) if s == store);
    state.schemes.values().flat_map(move |s| {
        s.scheme
            .elements
            .iter()
            .filter_map(move |el| match &el.kind {
                ElementKind::Table {
                    table,
                    check: Some(check @ CheckConflicts::ByRowTimestamp { .. }),
                    ..
                } if named(&el.owner.name) || el.subscriber_stores().any(|r| named(&r.name)) => {
                    Some((&s.scheme, table, check))
                }
                _ => None,
            })
    })
}

/// The rules of `rules` whose timestamp column is a nullable `BINARY(8)` column outside
/// the primary key of the table here (`table` looks a table up; TimesTen's TT2208 and
/// TT8004); and why each other one is not applied. A table not here yet has nothing to
/// check: its rule waits for it, without a problem.
pub(super) fn checked_rules(
    rules: std::collections::HashMap<QualName, hawser_store::ConflictRule>,
    table: impl Fn(&QualName) -> Option<hawser_core::TableDef>,
) -> (
    std::collections::HashMap<QualName, hawser_store::ConflictRule>,
    BTreeSet<String>,
) {
    let mut problems = BTreeSet::new();
    let kept = rules
        .into_iter()
        .filter(|(name, rule)| {
            let Some(def) = table(name) else {
                return false;
            };
            let why = match def.column_index(&rule.column) {
                None => Some(format!("has no column {} (TT2208)", rule.column)),
                Some(i) if def.is_key_column(i) => {
                    Some(format!("has {} in its primary key (TT8004)", rule.column))
                }
                Some(i)
                    if def.columns[i].data_type != hawser_core::DataType::Binary(8)
                        || !def.columns[i].nullable =>
                {
                    Some(format!(
                        "has {} as {}{}, not a nullable BINARY(8) (TT8004)",
                        rule.column,
                        def.columns[i].data_type,
                        if def.columns[i].nullable {
                            ""
                        } else {
                            " NOT NULL"
                        }
                    ))
                }
                Some(_) => None,
            };
            if let Some(why) = &why {
                problems.insert(format!(
                    "table {name} {why}: its CHECK CONFLICTS BY ROW TIMESTAMP is not \
                     applied; received changes overwrite it unchecked"
                ));
            }
            why.is_none()
        })
        .collect();
    (kept, problems)
}

/// The elements `store` subscribes to in any scheme, with their current epochs. An
/// element name used by two schemes keeps the higher epoch.
pub(super) fn subscribed(state: &ClusterState, store: &Ident) -> BTreeMap<Ident, Epoch> {
    let mut out = BTreeMap::new();
    for s in state.schemes.values() {
        for el in &s.scheme.elements {
            let subscribes = el
                .subscriber_stores()
                .any(|r| matches!(&r.name, hawser_scheme::ast::StoreName::Named(n) if n == store));
            let Some(es) = s.elements.get(&el.name) else {
                continue;
            };
            if subscribes {
                let e = out.entry(el.name.clone()).or_insert(es.epoch);
                *e = (*e).max(es.epoch);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::dataplane::testing::failed_over;
    use hawser_core::{Ident, QualName};

    /// Example 10-31's rules (defaults filled in) for both its stores, none for a third;
    /// NO ACTION and BY USER as written.
    #[test]
    fn conflict_rules_come_from_the_elements_a_store_takes_part_in() {
        let st = failed_over(
            "CREATE REPLICATION r \
               ELEMENT e TABLE t CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts \
                 MASTER ds1 SUBSCRIBER ds2 \
               ELEMENT f TABLE u CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts2 \
                 UPDATE BY USER ON EXCEPTION NO ACTION \
                 MASTER ds2 SUBSCRIBER ds1 \
               ELEMENT g TABLE v MASTER ds1 SUBSCRIBER ds3",
            0,
        );
        let rules = |s: &str| super::conflict_rules(&st, &Ident::unquoted(s));
        let ds1 = rules("ds1");
        assert_eq!(ds1.len(), 2);
        let t = &ds1[&QualName::bare("t")];
        assert_eq!(
            (t.column.as_str(), t.by_system, t.rollback),
            ("ts", true, true)
        );
        let u = &rules("ds2")[&QualName::bare("u")];
        assert_eq!(
            (u.column.as_str(), u.by_system, u.rollback),
            ("ts2", false, false)
        );
        assert!(rules("ds3").is_empty());

        // Checked against the tables here: a missing or unfit column is a problem.
        let col = |name: &str, data_type, nullable| hawser_core::ColumnDef {
            name: Ident::unquoted(name),
            data_type,
            nullable,
            default: None,
        };
        let table = |name: &str, ts: hawser_core::DataType, nullable| hawser_core::TableDef {
            name: QualName::bare(name),
            columns: vec![
                col("k", hawser_core::DataType::BigInt, false),
                col("ts", ts, nullable),
            ],
            primary_key: vec![0],
            explicit_key: true,
        };
        let (kept, problems) = super::checked_rules(ds1.clone(), |n| {
            (n == &QualName::bare("t")).then(|| table("t", hawser_core::DataType::Binary(8), true))
        });
        assert_eq!(kept.len(), 1, "u is not here yet: waits");
        assert!(problems.is_empty(), "{problems:?}");
        let (kept, problems) = super::checked_rules(ds1, |n| {
            (n == &QualName::bare("t"))
                .then(|| table("t", hawser_core::DataType::Varbinary(8), true))
        });
        assert!(kept.is_empty());
        assert!(
            problems
                .iter()
                .next()
                .unwrap()
                .contains("table t has ts as VARBINARY(8), not a nullable BINARY(8) (TT8004)"),
            "{problems:?}"
        );
    }

    /// After a failover of e to ds2, ds1 (deposed, now its subscriber) and ds3 subscribe
    /// to e at its new epoch, ds2 (its master) does not; e named again in a second
    /// scheme at epoch 0 keeps the higher epoch.
    #[test]
    fn a_store_subscribes_to_the_elements_naming_it_at_the_highest_epoch_of_each_name() {
        use hawser_control::state::{apply, Response};
        use hawser_core::Epoch;
        let mut st = failed_over(
            "CREATE REPLICATION r ELEMENT e TABLE t MASTER ds1 SUBSCRIBER ds2, ds3 \
             ELEMENT f TABLE u MASTER ds3 SUBSCRIBER ds1",
            5,
        );
        for cmd in hawser_control::Command::from_ddl(
            "CREATE REPLICATION r2 ELEMENT e TABLE v MASTER ds1 SUBSCRIBER ds3",
        )
        .unwrap()
        {
            assert!(matches!(apply(&mut st, &cmd), Response::Applied { .. }));
        }
        let subscribed = |s: &str| {
            super::subscribed(&st, &Ident::unquoted(s))
                .into_iter()
                .map(|(el, epoch)| (el.to_string(), epoch))
                .collect::<Vec<_>>()
        };
        let e = |n| ("e".to_string(), Epoch(n));
        assert_eq!(subscribed("ds1"), [e(1), ("f".to_string(), Epoch(0))]);
        assert!(subscribed("ds2").is_empty());
        assert_eq!(subscribed("ds3"), [e(1)]);
    }
}
