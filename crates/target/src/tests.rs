//! Each target type against what the DB2 seed says its table holds, run through a
//! small model of the store's apply (its DB2 exception rules) so the rows compared
//! are the target's exact rows, control columns included.

use std::collections::BTreeMap;

use hawser_core::{Gtid, NodeId};
use proptest::prelude::*;

use super::aggregate::Acc;
use super::*;

fn col(name: &str, data_type: DataType, nullable: bool) -> ColumnDef {
    column(name, data_type, nullable)
}

/// `acct (id INTEGER PRIMARY KEY, owner VARCHAR(20), bal BIGINT NOT NULL)`.
fn acct() -> TableDef {
    TableDef {
        name: QualName::bare("acct"),
        columns: vec![
            col("id", DataType::Integer, false),
            col("owner", DataType::Varchar(20), true),
            col("bal", DataType::BigInt, false),
        ],
        primary_key: vec![0],
        explicit_key: true,
    }
}

fn target(kind: TargetKind, into: &str) -> ResolvedTarget {
    ResolvedTarget {
        kind,
        into: QualName::bare(into),
    }
}

fn ccd(condensed: bool) -> TargetKind {
    TargetKind::Ccd {
        condensed: Some(condensed),
        complete: Some(false),
    }
}

fn row(id: i64, owner: &str, bal: i64) -> Row {
    vec![Value::Int(id), Value::Text(owner.into()), Value::Int(bal)]
}

fn insert(r: Row) -> RowChange {
    RowChange {
        table: QualName::bare("acct"),
        op: ChangeOp::Insert,
        key: vec![r[0].clone()],
        before: None,
        after: Some(r),
    }
}

fn update(before: Row, after: Row) -> RowChange {
    RowChange {
        table: QualName::bare("acct"),
        op: ChangeOp::Update,
        key: vec![before[0].clone()],
        before: Some(before),
        after: Some(after),
    }
}

fn delete(before: Row) -> RowChange {
    RowChange {
        table: QualName::bare("acct"),
        op: ChangeOp::Delete,
        key: vec![before[0].clone()],
        before: Some(before),
        after: None,
    }
}

fn txn(seq: u64, micros: i64, changes: Vec<RowChange>) -> Transaction {
    Transaction {
        gtid: Gtid {
            origin: NodeId(7),
            seq,
        },
        commit_micros: micros,
        changes,
    }
}

/// The store's apply of changes to one table, with the DB2 exception rules
/// (crates/store/src/apply/): rows by key.
fn apply(table: &mut BTreeMap<Row, Row>, def: &TableDef, changes: &[RowChange]) {
    for c in changes {
        assert_eq!(c.table, def.name, "a change of another table");
        match (c.op, &c.after) {
            (ChangeOp::Delete, _) => {
                table.remove(&c.key);
            }
            (_, Some(after)) => {
                assert_eq!(after.len(), def.columns.len(), "{after:?}");
                for (v, cd) in after.iter().zip(&def.columns) {
                    assert!(cd.nullable || !v.is_null(), "NULL in {}", cd.name);
                }
                // Insert of a present key = update; update of a missing row = insert;
                // an update may move the row to a new key.
                table.remove(&c.key);
                table.insert(def.key_of(after), after.clone());
            }
            (_, None) => panic!("no after-image"),
        }
    }
}

/// The history every test replays: two inserts, an update, a key change, a delete, a
/// re-insert of a deleted key, over four transactions.
fn history() -> Vec<Transaction> {
    vec![
        txn(
            10,
            1_000,
            vec![insert(row(1, "ann", 100)), insert(row(2, "bob", 50))],
        ),
        txn(
            11,
            2_000,
            vec![update(row(1, "ann", 100), row(1, "ann", 70))],
        ),
        txn(
            12,
            3_000,
            vec![
                update(row(2, "bob", 50), row(3, "bob", 50)),
                delete(row(1, "ann", 70)),
            ],
        ),
        txn(13, 4_000, vec![insert(row(1, "cy", 5))]),
    ]
}

/// The target's rows after `history`, applied once, or twice (a resend of all of it).
fn replay(kind: TargetKind, into: &str, resend: bool) -> (TableDef, Vec<Row>) {
    let t = target(kind, into);
    let def = shape(&acct(), &t).expect("a shape");
    let mut plan = TargetPlan::default();
    plan.add(acct(), t).expect("planned");
    let mut rows = BTreeMap::new();
    for _ in 0..(1 + usize::from(resend)) {
        for tx in history() {
            let w = plan.rewrite(tx, Epoch(2)).expect("rewritten");
            apply(&mut rows, &def, &w.changes);
        }
    }
    (def, rows.into_values().collect())
}

fn bytes(v: Vec<u8>) -> Value {
    Value::Bytes(v)
}

fn ccd_row(seq: u64, index: usize, op: char, micros: i64, user: Row) -> Row {
    let mut r = vec![
        bytes(intent_seq(seq, index)),
        Value::Text(op.to_string()),
        bytes(commit_seq(Epoch(2), seq)),
        Value::Timestamp(micros),
    ];
    r.extend(user);
    r
}

#[test]
fn a_user_copy_into_another_table_holds_the_source_rows_there() {
    let (def, rows) = replay(TargetKind::UserCopy, "acct_copy", false);
    assert_eq!(def.name, QualName::bare("acct_copy"));
    assert_eq!(def.columns, acct().columns);
    assert_eq!(rows, vec![row(1, "cy", 5), row(3, "bob", 50)]);
}

#[test]
fn a_plain_user_copy_or_replica_is_no_target_at_all() {
    let mut plan = TargetPlan::default();
    plan.add(acct(), target(TargetKind::UserCopy, "acct"))
        .unwrap();
    plan.add(acct(), target(TargetKind::Replica, "acct"))
        .unwrap();
    assert!(plan.is_empty());
    let tx = history().remove(0);
    assert_eq!(plan.rewrite(tx.clone(), Epoch(1)), Ok(tx));
}

#[test]
fn a_point_in_time_copy_stamps_each_row_with_its_source_commit_time() {
    let (def, rows) = replay(TargetKind::PointInTime, "acct", false);
    let last = def.columns.last().unwrap();
    assert_eq!(last.name, Ident::unquoted("ibmsnap_logmarker"));
    assert_eq!(
        (last.data_type, last.nullable),
        (DataType::Timestamp, false)
    );
    assert_eq!(def.primary_key, vec![0]);
    let stamped = |mut r: Row, micros| {
        r.push(Value::Timestamp(micros));
        r
    };
    assert_eq!(
        rows,
        vec![
            stamped(row(1, "cy", 5), 4_000),
            stamped(row(3, "bob", 50), 3_000)
        ]
    );
}

#[test]
fn a_condensed_ccd_keeps_each_keys_latest_change_and_its_deletes_as_d_rows() {
    let (def, rows) = replay(ccd(true), "acct_ccd", false);
    let names: Vec<&str> = def.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "ibmsnap_intentseq",
            "ibmsnap_operation",
            "ibmsnap_commitseq",
            "ibmsnap_logmarker",
            "id",
            "owner",
            "bal"
        ]
    );
    assert_eq!(def.primary_key, vec![4]);
    assert_eq!(
        rows,
        vec![
            // 1: inserted, updated, deleted, inserted again: the insert.
            ccd_row(13, 0, 'I', 4_000, row(1, "cy", 5)),
            // 2: moved to key 3: a D row with its last values.
            ccd_row(12, 0, 'D', 3_000, row(2, "bob", 50)),
            ccd_row(12, 0, 'U', 3_000, row(3, "bob", 50)),
        ]
    );
}

#[test]
fn a_noncondensed_ccd_keeps_every_change_in_commit_order() {
    let (def, rows) = replay(ccd(false), "acct_hist", false);
    assert_eq!(def.primary_key, vec![2, 0]);
    assert!(def.columns[5].nullable && !def.columns[4].nullable);
    assert_eq!(
        rows,
        vec![
            ccd_row(10, 0, 'I', 1_000, row(1, "ann", 100)),
            ccd_row(10, 1, 'I', 1_000, row(2, "bob", 50)),
            ccd_row(11, 0, 'U', 2_000, row(1, "ann", 70)),
            ccd_row(12, 0, 'U', 3_000, row(3, "bob", 50)),
            ccd_row(12, 1, 'D', 3_000, row(1, "ann", 70)),
            ccd_row(13, 0, 'I', 4_000, row(1, "cy", 5)),
        ]
    );
}

#[test]
fn a_resent_history_changes_no_target() {
    for kind in [
        TargetKind::UserCopy,
        TargetKind::PointInTime,
        ccd(true),
        ccd(false),
    ] {
        assert_eq!(
            replay(kind.clone(), "acct_t", false),
            replay(kind.clone(), "acct_t", true),
            "{kind:?}"
        );
    }
}

#[test]
fn a_delete_without_its_before_image_keeps_the_key_and_nulls() {
    let t = target(ccd(false), "h");
    let mut plan = TargetPlan::default();
    plan.add(acct(), t).unwrap();
    let mut d = delete(row(4, "x", 1));
    d.before = None;
    let w = plan.rewrite(txn(20, 9, vec![d]), Epoch(1)).unwrap();
    let after = w.changes[0].after.clone().unwrap();
    assert_eq!(&after[4..], &[Value::Int(4), Value::Null, Value::Null]);
}

#[test]
fn commit_seqs_order_by_failover_era_then_seq_and_intent_seqs_by_change() {
    assert!(commit_seq(Epoch(1), 900) < commit_seq(Epoch(2), 3));
    assert!(commit_seq(Epoch(2), 3) < commit_seq(Epoch(2), 4));
    assert_eq!(commit_seq(Epoch(1), 1).len(), SEQ_BYTES as usize);
    assert!(intent_seq(5, 9) < intent_seq(6, 0));
    assert!(intent_seq(5, 1) < intent_seq(5, 2));
    assert_eq!(intent_seq(u64::MAX, usize::MAX).len(), SEQ_BYTES as usize);
}

#[test]
fn an_existing_table_of_another_shape_is_refused_naming_what_differs() {
    let expected = shape(&acct(), &target(ccd(true), "acct")).unwrap();
    assert_eq!(check_shape(&expected, &expected), Ok(()));
    let e = check_shape(&acct(), &expected).unwrap_err().to_string();
    assert!(
        e.contains(
            "column 1 is id INTEGER NOT NULL but must be ibmsnap_intentseq BINARY(10) NOT NULL"
        ),
        "{e}"
    );
    assert!(
        e.contains("column 5 (id INTEGER NOT NULL) is missing"),
        "{e}"
    );
    let mut rekeyed = expected.clone();
    rekeyed.primary_key = vec![2, 0];
    let e = check_shape(&rekeyed, &expected).unwrap_err().to_string();
    assert!(
        e.contains("the primary key is (ibmsnap_commitseq, ibmsnap_intentseq) but must be (id)"),
        "{e}"
    );
}

#[test]
fn a_source_column_named_like_a_control_column_or_an_aggregate_is_refused() {
    let mut t = acct();
    t.columns[1].name = Ident::unquoted("IBMSNAP_LOGMARKER");
    let e = shape(&t, &target(TargetKind::PointInTime, "x")).unwrap_err();
    assert!(matches!(e, TargetError::NameTaken { .. }), "{e}");
    let agg = TargetKind::BaseAggregate {
        aggregates: vec![],
        group_by: vec![],
    };
    let mut plan = TargetPlan::default();
    let e = plan.add(acct(), target(agg, "acct")).unwrap_err();
    assert!(
        e.to_string().contains("INTO must name another table"),
        "{e}"
    );
    assert!(plan.is_empty());
}

fn arb_change() -> impl Strategy<Value = (u8, i64, i64, i64)> {
    // (op, key, new key, value) over a few keys so changes collide.
    (0u8..3, 0i64..4, 0i64..4, 0i64..100)
}

proptest! {
    /// Random histories (inserts, updates, key changes, deletes, with DB2's exceptions
    /// making any sequence legal): a condensed CCD ends with one row per key ever
    /// touched, holding the source's current row for each key present and a D row for
    /// each key gone; a noncondensed CCD holds one row per change; both unchanged by a
    /// resend.
    #[test]
    fn ccds_follow_the_source_for_any_history(raw in proptest::collection::vec(proptest::collection::vec(arb_change(), 1..4), 1..12)) {
        let mut source: BTreeMap<Row, Row> = BTreeMap::new();
        let mut txns = Vec::new();
        for (n, changes) in raw.iter().enumerate() {
            let mut cs = Vec::new();
            for &(op, k, k2, v) in changes {
                let before = source.get(&vec![Value::Int(k)]).cloned();
                let c = match (op, before) {
                    (0, _) => insert(row(k, "o", v)),
                    (1, Some(b)) => update(b, row(k2, "o", v)),
                    (1, None) => update(row(k, "o", 0), row(k2, "o", v)),
                    (_, Some(b)) => delete(b),
                    (_, None) => delete(row(k, "o", 0)),
                };
                apply(&mut source, &acct(), std::slice::from_ref(&c));
                cs.push(c);
            }
            txns.push(txn(100 + n as u64, n as i64, cs));
        }
        let changes: usize = txns.iter().map(|t| t.changes.len()).sum();
        for condensed in [true, false] {
            let t = target(ccd(condensed), "c");
            let def = shape(&acct(), &t).unwrap();
            let mut plan = TargetPlan::default();
            plan.add(acct(), t).unwrap();
            let mut once = BTreeMap::new();
            for tx in &txns {
                apply(&mut once, &def, &plan.rewrite(tx.clone(), Epoch(1)).unwrap().changes);
            }
            let mut twice = once.clone();
            for tx in &txns {
                apply(&mut twice, &def, &plan.rewrite(tx.clone(), Epoch(1)).unwrap().changes);
            }
            prop_assert_eq!(&once, &twice);
            if condensed {
                for r in once.values() {
                    let key = vec![r[4].clone()];
                    match source.get(&key) {
                        Some(current) => {
                            prop_assert_ne!(&r[1], &Value::Text("D".into()));
                            prop_assert_eq!(&r[4..], &current[..]);
                        }
                        None => prop_assert_eq!(&r[1], &Value::Text("D".into())),
                    }
                }
                for key in source.keys() {
                    prop_assert!(once.contains_key(key));
                }
            } else {
                prop_assert_eq!(once.len(), changes);
            }
        }
    }
}

/// `acct` with `owner NOT NULL`, so it can group an aggregate.
fn acct_owned() -> TableDef {
    let mut t = acct();
    t.columns[1].nullable = false;
    t
}

fn aggregates(specs: &[(&str, Option<&str>, &str)]) -> Vec<hawser_scheme::ast::Aggregate> {
    use hawser_scheme::ast::{AggFunc, Aggregate};
    specs
        .iter()
        .map(|(f, c, alias)| {
            let c = || Ident::unquoted(c.expect("a column"));
            Aggregate {
                func: match *f {
                    "COUNT" => AggFunc::CountStar,
                    "SUM" => AggFunc::Sum(c()),
                    "MIN" => AggFunc::Min(c()),
                    "MAX" => AggFunc::Max(c()),
                    _ => AggFunc::Avg(c()),
                },
                alias: (!alias.is_empty()).then(|| Ident::unquoted(alias)),
            }
        })
        .collect()
}

fn ts(micros: i64) -> Value {
    Value::Timestamp(micros)
}

#[test]
fn a_change_aggregate_holds_one_row_per_transaction_and_group() {
    let kind = TargetKind::ChangeAggregate {
        aggregates: aggregates(&[("COUNT", None, "n"), ("SUM", Some("bal"), "total")]),
        group_by: vec![Ident::unquoted("owner")],
    };
    let t = target(kind, "acct_chg");
    let def = shape(&acct_owned(), &t).unwrap();
    let names: Vec<String> = def.columns.iter().map(|c| c.name.to_string()).collect();
    assert_eq!(
        names,
        [
            "ibmsnap_llogmarker",
            "ibmsnap_hlogmarker",
            "ibmsnap_commitseq",
            "owner",
            "n",
            "total"
        ]
    );
    assert_eq!(def.primary_key, vec![2, 3]);
    let mut plan = TargetPlan::default();
    plan.add(acct_owned(), t).unwrap();
    let mut once = BTreeMap::new();
    let mut twice = BTreeMap::new();
    for tx in history() {
        let w = plan.rewrite(tx, Epoch(2)).unwrap();
        apply(&mut once, &def, &w.changes);
        apply(&mut twice, &def, &w.changes);
        apply(&mut twice, &def, &w.changes);
    }
    let r = |micros: i64, seq: u64, owner: &str, n: i64, total: i64| {
        vec![
            ts(micros),
            ts(micros),
            bytes(commit_seq(Epoch(2), seq)),
            Value::Text(owner.into()),
            Value::Int(n),
            Value::Int(total),
        ]
    };
    let expected = vec![
        r(1_000, 10, "ann", 1, 100),
        r(1_000, 10, "bob", 1, 50),
        r(2_000, 11, "ann", 1, 70),
        // The key change counts its after-image, the delete its before-image.
        r(3_000, 12, "ann", 1, 70),
        r(3_000, 12, "bob", 1, 50),
        r(4_000, 13, "cy", 1, 5),
    ];
    assert_eq!(once.into_values().collect::<Vec<_>>(), expected);
    assert_eq!(twice.into_values().collect::<Vec<_>>(), expected);
}

/// The store's BASE AGGREGATE upkeep, modelled: the source rows are kept as they come;
/// each change's before-image is removed from its group and its after-image added
/// (the group folded again from all rows when a removal cannot be undone); each
/// transaction's touched groups are written with `base_row`.
fn replay_base(agg: &Aggregation) -> BTreeMap<Row, Row> {
    let source = acct_owned();
    let mut copy: BTreeMap<Row, Row> = BTreeMap::new();
    let mut groups: BTreeMap<Row, (Acc, i64)> = BTreeMap::new();
    let mut table: BTreeMap<Row, Row> = BTreeMap::new();
    for tx in history() {
        let mut touched = std::collections::BTreeSet::new();
        for c in &tx.changes {
            // An update within one group does not end the group, even for a moment.
            let mut left = None;
            if let Some(before) = copy.remove(&c.key) {
                let g = agg.group_of(&before);
                left = Some(g.clone());
                let (acc, _) = groups.get_mut(&g).expect("a group of a row");
                if !agg.remove(acc, &before) {
                    let folded = agg.fold(copy.values(), |x| *x == g);
                    *acc = folded.get(&g).cloned().unwrap_or_else(|| agg.empty());
                }
                touched.insert(g);
            }
            if let Some(after) = &c.after {
                let g = agg.group_of(after);
                let (acc, low) = groups
                    .entry(g.clone())
                    .or_insert_with(|| (agg.empty(), tx.commit_micros));
                if acc.rows() == 0 && left.as_ref() != Some(&g) {
                    *low = tx.commit_micros;
                }
                agg.add(acc, after);
                copy.insert(source.key_of(after), after.clone());
                touched.insert(g);
            }
        }
        for g in &touched {
            table.retain(|_, r| &agg.group_of_target(r) != g);
            let (acc, low) = &groups[g];
            if acc.rows() > 0 {
                let row = agg.base_row(g, acc, *low, tx.commit_micros).unwrap();
                table.insert(agg.def.key_of(&row), row);
            }
        }
    }
    table
}

#[test]
fn a_base_aggregate_holds_the_aggregates_of_each_group_of_the_current_rows() {
    let kind = TargetKind::BaseAggregate {
        aggregates: aggregates(&[
            ("COUNT", None, "n"),
            ("SUM", Some("bal"), "total"),
            ("MIN", Some("bal"), ""),
            ("MAX", Some("id"), ""),
            ("AVG", Some("bal"), ""),
        ]),
        group_by: vec![Ident::unquoted("owner")],
    };
    let agg = Aggregation::new(&acct_owned(), &target(kind, "acct_agg"))
        .unwrap()
        .unwrap();
    let types: Vec<(String, DataType, bool)> = agg
        .def
        .columns
        .iter()
        .map(|c| (c.name.to_string(), c.data_type, c.nullable))
        .collect();
    assert_eq!(
        types,
        [
            ("ibmsnap_llogmarker".into(), DataType::Timestamp, false),
            ("ibmsnap_hlogmarker".into(), DataType::Timestamp, false),
            ("owner".into(), DataType::Varchar(20), false),
            ("n".into(), DataType::BigInt, false),
            ("total".into(), DataType::BigInt, true),
            ("min_bal".into(), DataType::BigInt, true),
            ("max_id".into(), DataType::Integer, true),
            ("avg_bal".into(), DataType::Double, true),
        ]
    );
    assert_eq!(agg.def.primary_key, vec![2]);
    let rows: Vec<Row> = replay_base(&agg).into_values().collect();
    let r = |low: i64, high: i64, owner: &str, n: i64, bal: i64, id: i64| {
        vec![
            ts(low),
            ts(high),
            Value::Text(owner.into()),
            Value::Int(n),
            Value::Int(bal),
            Value::Int(bal),
            Value::Int(id),
            Value::Double(bal as f64),
        ]
    };
    // ann's last row went at 3,000; bob's moved to id 3 then; cy began at 4,000.
    assert_eq!(
        rows,
        vec![
            r(1_000, 3_000, "bob", 1, 50, 3),
            r(4_000, 4_000, "cy", 1, 5, 1)
        ]
    );
}

#[test]
fn a_base_aggregate_without_groups_is_one_row_keyed_by_its_first_change() {
    let kind = TargetKind::BaseAggregate {
        aggregates: aggregates(&[("COUNT", None, ""), ("SUM", Some("bal"), "")]),
        group_by: vec![],
    };
    let agg = Aggregation::new(&acct_owned(), &target(kind, "acct_agg"))
        .unwrap()
        .unwrap();
    assert_eq!(agg.def.primary_key, vec![0]);
    let rows: Vec<Row> = replay_base(&agg).into_values().collect();
    assert_eq!(
        rows,
        vec![vec![ts(1_000), ts(4_000), Value::Int(2), Value::Int(55)]]
    );
}

#[test]
fn an_aggregate_that_cannot_be_kept_is_refused_with_the_reason() {
    let refused = |kind: TargetKind, into: &str| {
        Aggregation::new(&acct(), &target(kind, into))
            .unwrap_err()
            .to_string()
    };
    let base = |aggs, group: &[&str]| TargetKind::BaseAggregate {
        aggregates: aggregates(aggs),
        group_by: group.iter().map(|g| Ident::unquoted(g)).collect(),
    };
    let e = refused(base(&[("COUNT", None, "")], &["owner"]), "a");
    assert!(e.contains("owner is nullable"), "{e}");
    let e = refused(base(&[("SUM", Some("owner"), "")], &[]), "a");
    assert!(e.contains("not a number"), "{e}");
    let e = refused(base(&[("SUM", Some("nope"), "")], &[]), "a");
    assert!(e.contains("column nope"), "{e}");
    let e = refused(
        base(&[("SUM", Some("bal"), ""), ("SUM", Some("bal"), "")], &[]),
        "a",
    );
    assert!(e.contains("twice"), "{e}");
}

#[test]
fn a_duplicate_gives_each_target_its_initial_rows() {
    let rows = vec![row(1, "ann", 100), row(2, "bob", 50)];
    let seq = commit_seq(Epoch(2), 9);
    let kind_of = |kind: TargetKind, into: &str| initial(&acct(), &target(kind, into)).unwrap();
    assert_eq!(kind_of(TargetKind::UserCopy, "acct"), Initial::Copy);
    assert_eq!(
        kind_of(ccd(false), "h"),
        Initial::Skip,
        "NONCOMPLETE holds changes only"
    );
    let complete = TargetKind::Ccd {
        condensed: Some(false),
        complete: Some(true),
    };
    let Initial::Into { def, replace } = kind_of(complete.clone(), "h") else {
        panic!("a CCD COMPLETE starts with the rows");
    };
    assert!(!replace, "a CCD's history is kept");
    let ccd_rows = initial_rows(&target(complete, "h"), rows.clone(), &seq, 7_000, 5);
    assert_eq!(
        ccd_rows,
        vec![
            vec![
                bytes(intent_seq(0, 5)),
                Value::Text("I".into()),
                bytes(seq.clone()),
                Value::Timestamp(7_000),
                Value::Int(1),
                Value::Text("ann".into()),
                Value::Int(100),
            ],
            vec![
                bytes(intent_seq(0, 6)),
                Value::Text("I".into()),
                bytes(seq.clone()),
                Value::Timestamp(7_000),
                Value::Int(2),
                Value::Text("bob".into()),
                Value::Int(50),
            ],
        ]
    );
    // No change of the stream after the copy takes an initial row's key.
    let mut table = BTreeMap::new();
    for r in &ccd_rows {
        table.insert(def.key_of(r), r.clone());
    }
    let (_, changes) = replay(ccd(false), "h", false);
    for r in changes {
        assert!(
            table.insert(def.key_of(&r), r).is_none(),
            "a key taken twice"
        );
    }
    let pit = target(TargetKind::PointInTime, "acct");
    assert!(matches!(
        initial(&acct(), &pit).unwrap(),
        Initial::Into { replace: true, .. }
    ));
    assert_eq!(
        initial_rows(&pit, vec![row(1, "ann", 100)], &seq, 7_000, 0),
        vec![vec![
            Value::Int(1),
            Value::Text("ann".into()),
            Value::Int(100),
            Value::Timestamp(7_000)
        ]]
    );
}
