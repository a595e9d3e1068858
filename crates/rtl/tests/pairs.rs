//! Every RTL pair rule, valid and invalid, longer chains, key-changing updates, output
//! order and counts, through the compiler API in both input forms.

use hawser_core::{
    ChangeOp, ColumnDef, DataType, Gtid, Ident, NodeId, QualName, RowChange, TableDef, Transaction,
    Value,
};
use hawser_rtl::{
    compile, compile_changes, Assignment, Change, ChangeKind, ChangeProblem, Compilation,
    CompileError, Compiler, NetOp, NotCompilable, Outcome, Reason,
};

fn table(name: &str, columns: &[&str], key: &[usize]) -> TableDef {
    TableDef {
        name: QualName::bare(name),
        columns: columns
            .iter()
            .map(|c| ColumnDef {
                name: Ident::unquoted(c),
                data_type: DataType::Integer,
                nullable: true,
                default: None,
            })
            .collect(),
        primary_key: key.to_vec(),
        explicit_key: true,
    }
}

/// `t (k, a, b)` keyed on `k`, and `u (x, y)` keyed on `x`.
fn catalog() -> Vec<TableDef> {
    vec![
        table("t", &["k", "a", "b"], &[0]),
        table("u", &["x", "y"], &[0]),
    ]
}

fn int(i: i64) -> Value {
    Value::Int(i)
}

fn ins(k: i64, a: i64, b: i64) -> Change {
    Change {
        table: QualName::bare("t"),
        key: vec![int(k)],
        kind: ChangeKind::Insert {
            row: vec![int(k), int(a), int(b)],
        },
    }
}

/// An update of `t` that sets the given columns, before-image unknown.
fn upd(k: i64, set: &[(usize, i64)]) -> Change {
    Change {
        table: QualName::bare("t"),
        key: vec![int(k)],
        kind: ChangeKind::Update {
            before: None,
            set: set
                .iter()
                .map(|&(column, v)| Assignment {
                    column,
                    value: int(v),
                })
                .collect(),
        },
    }
}

fn del(k: i64) -> Change {
    Change {
        table: QualName::bare("t"),
        key: vec![int(k)],
        kind: ChangeKind::Delete { before: None },
    }
}

/// Compiles `changes` with each change its own transaction.
fn run(changes: Vec<Change>) -> Compilation {
    compile_changes(changes.into_iter().map(|c| vec![c]), &catalog()).unwrap()
}

fn ops(c: &Compilation) -> Vec<NetOp> {
    c.tables()
        .expect("run compiles")
        .iter()
        .flat_map(|t| t.operations.clone())
        .collect()
}

fn refusal(c: &Compilation) -> &NotCompilable {
    match &c.outcome {
        Outcome::NotCompilable(n) => n,
        Outcome::Compiled { tables } => panic!("expected not compilable, got {tables:?}"),
    }
}

fn assignments(set: &[(usize, i64)]) -> Vec<Assignment> {
    set.iter()
        .map(|&(column, v)| Assignment {
            column,
            value: int(v),
        })
        .collect()
}

// ---- the valid pairs ----

#[test]
fn insert_then_delete_gives_nothing() {
    let c = run(vec![ins(1, 10, 20), del(1)]);
    assert!(ops(&c).is_empty());
    assert_eq!(c.tables().map(<[_]>::len), Some(0));
    assert_eq!(
        (
            c.counts.transactions,
            c.counts.row_changes,
            c.counts.net_operations
        ),
        (2, 2, 0)
    );
}

#[test]
fn delete_then_insert_is_not_reduced() {
    let c = run(vec![del(1), ins(1, 10, 20)]);
    assert_eq!(
        ops(&c),
        [NetOp::Replace {
            key: vec![int(1)],
            before: None,
            row: vec![int(1), int(10), int(20)],
        }]
    );
}

#[test]
fn update_then_delete_gives_delete() {
    let c = run(vec![upd(1, &[(1, 5)]), del(1)]);
    assert_eq!(
        ops(&c),
        [NetOp::Delete {
            key: vec![int(1)],
            before: None
        }]
    );
}

#[test]
fn insert_then_update_gives_the_insert_with_the_update_merged() {
    let c = run(vec![ins(1, 10, 20), upd(1, &[(2, 21)])]);
    assert_eq!(
        ops(&c),
        [NetOp::Insert {
            key: vec![int(1)],
            row: vec![int(1), int(10), int(21)],
        }]
    );
}

#[test]
fn update_then_update_merges_with_the_later_winning_per_column() {
    let c = run(vec![
        upd(1, &[(1, 1)]),
        upd(1, &[(2, 2)]),
        upd(1, &[(1, 3)]),
    ]);
    assert_eq!(
        ops(&c),
        [NetOp::Update {
            key: vec![int(1)],
            before: None,
            after: None,
            set: assignments(&[(1, 3), (2, 2)]),
        }]
    );
}

#[test]
fn an_update_that_sets_every_column_knows_its_after_image() {
    let c = run(vec![upd(1, &[(0, 1), (1, 2)]), upd(1, &[(2, 3)])]);
    let ops = ops(&c);
    let [NetOp::Update { after, .. }] = ops.as_slice() else {
        panic!("expected one update, got {ops:?}");
    };
    assert_eq!(after, &Some(vec![int(1), int(2), int(3)]));
}

// ---- the invalid pairs ----

fn assert_invalid(changes: Vec<Change>, first: ChangeOp, second: ChangeOp, at: usize) {
    let c = run(changes);
    let n = refusal(&c);
    assert_eq!(n.table, QualName::bare("t"));
    assert_eq!(n.key, vec![int(1)]);
    assert_eq!(n.reason, Reason::InvalidPair { first, second });
    assert_eq!((n.transaction, n.change, n.gtid), (at, 0, None));
    assert_eq!(c.rows_to_write(), c.counts.row_changes);
}

#[test]
fn insert_then_insert_is_invalid() {
    assert_invalid(
        vec![ins(1, 1, 1), ins(1, 2, 2)],
        ChangeOp::Insert,
        ChangeOp::Insert,
        1,
    );
}

#[test]
fn update_then_insert_is_invalid() {
    assert_invalid(
        vec![upd(1, &[(1, 1)]), ins(1, 2, 2)],
        ChangeOp::Update,
        ChangeOp::Insert,
        1,
    );
}

#[test]
fn delete_then_update_is_invalid() {
    assert_invalid(
        vec![del(1), upd(1, &[(1, 1)])],
        ChangeOp::Delete,
        ChangeOp::Update,
        1,
    );
}

#[test]
fn delete_then_delete_is_invalid() {
    assert_invalid(vec![del(1), del(1)], ChangeOp::Delete, ChangeOp::Delete, 1);
}

#[test]
fn a_pair_is_judged_after_earlier_reductions() {
    // insert + delete cancel, but the row is still gone: an update cannot follow.
    assert_invalid(
        vec![ins(1, 1, 1), del(1), upd(1, &[(1, 2)])],
        ChangeOp::Delete,
        ChangeOp::Update,
        2,
    );
    // insert + update is an insert whose last operation is an update.
    assert_invalid(
        vec![ins(1, 1, 1), upd(1, &[(1, 2)]), ins(1, 3, 3)],
        ChangeOp::Update,
        ChangeOp::Insert,
        2,
    );
}

#[test]
fn the_refusal_names_the_change_inside_its_transaction_and_counting_goes_on() {
    let c = compile_changes(
        vec![
            vec![ins(2, 0, 0)],
            vec![ins(3, 0, 0), del(1), del(1)],
            vec![ins(4, 0, 0)],
        ],
        &catalog(),
    )
    .unwrap();
    let n = refusal(&c);
    assert_eq!((n.transaction, n.change), (1, 2));
    assert_eq!((c.counts.transactions, c.counts.row_changes), (3, 5));
    assert_eq!(
        n.to_string(),
        "table t, key (1): delete followed by delete is not a valid pair (transaction 1, change 2)"
    );
}

// ---- longer chains ----

#[test]
fn chains_reduce_pair_by_pair() {
    let row = |a, b| vec![int(1), int(a), int(b)];
    // delete + insert + update: a replace carrying the update.
    assert_eq!(
        ops(&run(vec![del(1), ins(1, 1, 1), upd(1, &[(1, 9)])])),
        [NetOp::Replace {
            key: vec![int(1)],
            before: None,
            row: row(9, 1)
        }]
    );
    // delete + insert + delete: the pre-existing row goes.
    assert_eq!(
        ops(&run(vec![del(1), ins(1, 1, 1), del(1)])),
        [NetOp::Delete {
            key: vec![int(1)],
            before: None
        }]
    );
    // update + delete + insert: replaced.
    assert_eq!(
        ops(&run(vec![upd(1, &[(1, 5)]), del(1), ins(1, 2, 2)])),
        [NetOp::Replace {
            key: vec![int(1)],
            before: None,
            row: row(2, 2)
        }]
    );
    // insert + delete + insert: an insert (the row did not exist before the run).
    assert_eq!(
        ops(&run(vec![ins(1, 1, 1), del(1), ins(1, 2, 2)])),
        [NetOp::Insert {
            key: vec![int(1)],
            row: row(2, 2)
        }]
    );
}

// ---- order and tables ----

#[test]
fn operations_come_sorted_by_table_then_encoded_key() {
    let u = |x: i64| Change {
        table: QualName::bare("u"),
        key: vec![int(x)],
        kind: ChangeKind::Delete { before: None },
    };
    let c = run(vec![u(5), ins(3, 0, 0), ins(-1, 0, 0), u(-7), ins(2, 0, 0)]);
    let tables = c.tables().unwrap();
    let names: Vec<String> = tables.iter().map(|t| t.table.to_string()).collect();
    assert_eq!(names, ["t", "u"]);
    let keys = |i: usize| -> Vec<Vec<Value>> {
        tables[i]
            .operations
            .iter()
            .map(|o| o.key().clone())
            .collect()
    };
    assert_eq!(keys(0), [vec![int(-1)], vec![int(2)], vec![int(3)]]);
    assert_eq!(keys(1), [vec![int(-7)], vec![int(5)]]);
    assert_eq!(c.counts.net_operations, 5);
}

#[test]
fn compilation_round_trips_through_json() {
    let c = run(vec![del(1), ins(1, 1, 1), upd(2, &[(1, 1)]), del(3)]);
    let text = serde_json::to_string(&c).unwrap();
    let back: Compilation = serde_json::from_str(&text).unwrap();
    assert_eq!(back, c);
    let refused = run(vec![del(1), del(1)]);
    let back: Compilation =
        serde_json::from_str(&serde_json::to_string(&refused).unwrap()).unwrap();
    assert_eq!(back, refused);
}

// ---- malformed input ----

#[test]
fn malformed_changes_are_errors_and_leave_the_compiler_unchanged() {
    let catalog = catalog();
    let mut compiler = Compiler::new(&catalog);
    compiler.push_changes(vec![ins(1, 1, 1)]).unwrap();
    let unknown = Change {
        table: QualName::bare("nope"),
        ..del(2)
    };
    let err = compiler.push_changes(vec![del(3), unknown]).unwrap_err();
    assert_eq!(
        err,
        CompileError {
            transaction: 1,
            change: 1,
            problem: ChangeProblem::UnknownTable(QualName::bare("nope")),
        }
    );
    let wrong_key = Change {
        key: vec![int(9)],
        ..ins(1, 1, 1)
    };
    assert_eq!(
        compiler.push_changes(vec![wrong_key]).unwrap_err().problem,
        ChangeProblem::KeyMismatch
    );
    let twice = upd(1, &[(1, 1), (1, 2)]);
    assert_eq!(
        compiler.push_changes(vec![twice]).unwrap_err().problem,
        ChangeProblem::DuplicateAssignment { column: 1 }
    );
    let out_of_range = upd(1, &[(7, 1)]);
    assert_eq!(
        compiler
            .push_changes(vec![out_of_range])
            .unwrap_err()
            .problem,
        ChangeProblem::ColumnOutOfRange { column: 7 }
    );
    // None of the refused transactions counted or touched key 3.
    let c = compiler.finish();
    assert_eq!((c.counts.transactions, c.counts.row_changes), (1, 1));
    assert_eq!(ops(&c).len(), 1);
}

// ---- the commit-log form (full images) ----

fn txn(seq: u64, changes: Vec<RowChange>) -> Transaction {
    Transaction {
        gtid: Gtid::new(NodeId(7), seq),
        commit_micros: 0,
        changes,
    }
}

fn rc(op: ChangeOp, before: Option<[i64; 3]>, after: Option<[i64; 3]>) -> RowChange {
    let row = |r: [i64; 3]| r.iter().map(|&v| int(v)).collect::<Vec<_>>();
    let key = before
        .or(after)
        .map(|r| vec![int(r[0])])
        .unwrap_or_default();
    RowChange {
        table: QualName::bare("t"),
        op,
        key,
        before: before.map(row),
        after: after.map(row),
    }
}

#[test]
fn full_image_updates_set_the_changed_columns_and_keep_the_first_before_image() {
    let run = [
        txn(
            1,
            vec![rc(ChangeOp::Update, Some([1, 10, 20]), Some([1, 11, 20]))],
        ),
        txn(
            2,
            vec![rc(ChangeOp::Update, Some([1, 11, 20]), Some([1, 11, 22]))],
        ),
    ];
    let c = compile(&run, &catalog()).unwrap();
    assert_eq!(
        ops(&c),
        [NetOp::Update {
            key: vec![int(1)],
            before: Some(vec![int(1), int(10), int(20)]),
            after: Some(vec![int(1), int(11), int(22)]),
            set: assignments(&[(1, 11), (2, 22)]),
        }]
    );
    // update + delete: the delete carries the row as it was before the run.
    let run = [
        txn(
            1,
            vec![rc(ChangeOp::Update, Some([1, 10, 20]), Some([1, 11, 20]))],
        ),
        txn(2, vec![rc(ChangeOp::Delete, Some([1, 11, 20]), None)]),
    ];
    assert_eq!(
        ops(&compile(&run, &catalog()).unwrap()),
        [NetOp::Delete {
            key: vec![int(1)],
            before: Some(vec![int(1), int(10), int(20)]),
        }]
    );
}

#[test]
fn a_refused_commit_log_run_names_the_gtid() {
    let run = [
        txn(4, vec![rc(ChangeOp::Insert, None, Some([1, 1, 1]))]),
        txn(5, vec![rc(ChangeOp::Insert, None, Some([1, 2, 2]))]),
    ];
    let c = compile(&run, &catalog()).unwrap();
    assert_eq!(refusal(&c).gtid, Some(Gtid::new(NodeId(7), 5)));
    assert!(refusal(&c).to_string().contains("[7:5]"));
}

#[test]
fn commit_log_changes_missing_an_image_are_errors() {
    let mut bad = rc(ChangeOp::Update, Some([1, 1, 1]), Some([1, 2, 1]));
    bad.after = None;
    let err = compile(&[txn(1, vec![bad])], &catalog()).unwrap_err();
    assert_eq!(
        err.problem,
        ChangeProblem::MissingImage {
            op: ChangeOp::Update,
            image: "after"
        }
    );
    let mut short = rc(ChangeOp::Insert, None, Some([1, 1, 1]));
    short.after = Some(vec![int(1)]);
    let err = compile(&[txn(1, vec![short])], &catalog()).unwrap_err();
    assert_eq!(
        err.problem,
        ChangeProblem::RowWidth {
            expected: 3,
            got: 1
        }
    );
}

// ---- updates that change the key ----

#[test]
fn a_key_change_with_images_is_a_delete_of_the_old_key_and_an_insert_of_the_new() {
    let run = [txn(
        1,
        vec![rc(ChangeOp::Update, Some([1, 10, 20]), Some([2, 10, 21]))],
    )];
    let c = compile(&run, &catalog()).unwrap();
    assert_eq!(
        ops(&c),
        [
            NetOp::Delete {
                key: vec![int(1)],
                before: Some(vec![int(1), int(10), int(20)]),
            },
            NetOp::Insert {
                key: vec![int(2)],
                row: vec![int(2), int(10), int(21)],
            },
        ]
    );
    assert_eq!((c.counts.row_changes, c.counts.net_operations), (1, 2));
}

#[test]
fn a_key_change_of_a_row_inserted_in_the_run_moves_the_insert() {
    let c = run(vec![ins(1, 10, 20), upd(1, &[(0, 2)]), upd(2, &[(1, 11)])]);
    assert_eq!(
        ops(&c),
        [NetOp::Insert {
            key: vec![int(2)],
            row: vec![int(2), int(11), int(20)],
        }]
    );
}

#[test]
fn a_key_change_onto_a_key_deleted_in_the_run_replaces_it() {
    let c = run(vec![del(2), ins(1, 10, 20), upd(1, &[(0, 2)])]);
    assert_eq!(
        ops(&c),
        [NetOp::Replace {
            key: vec![int(2)],
            before: None,
            row: vec![int(2), int(10), int(20)],
        }]
    );
}

#[test]
fn a_key_change_that_sets_every_column_needs_no_before_image() {
    let c = run(vec![upd(1, &[(0, 2), (1, 5), (2, 6)])]);
    assert_eq!(
        ops(&c),
        [
            NetOp::Delete {
                key: vec![int(1)],
                before: None
            },
            NetOp::Insert {
                key: vec![int(2)],
                row: vec![int(2), int(5), int(6)],
            },
        ]
    );
}

#[test]
fn a_key_change_without_the_whole_row_is_not_compilable() {
    let c = run(vec![upd(1, &[(1, 5)]), upd(1, &[(0, 2)])]);
    let n = refusal(&c);
    assert_eq!(n.key, vec![int(1)]);
    assert_eq!(
        n.reason,
        Reason::KeyChangeWithoutRow {
            new_key: vec![int(2)]
        }
    );
    assert_eq!(n.transaction, 1);
}

#[test]
fn a_key_change_onto_a_live_key_is_not_compilable() {
    let c = run(vec![ins(2, 0, 0), ins(1, 10, 20), upd(1, &[(0, 2)])]);
    let n = refusal(&c);
    assert_eq!(n.key, vec![int(2)]);
    assert_eq!(
        n.reason,
        Reason::KeyChangeOntoLiveKey {
            old_key: vec![int(1)]
        }
    );
}

#[test]
fn the_old_key_is_gone_after_a_key_change() {
    let c = run(vec![ins(1, 10, 20), upd(1, &[(0, 2)]), upd(1, &[(1, 5)])]);
    assert_eq!(
        refusal(&c).reason,
        Reason::InvalidPair {
            first: ChangeOp::Delete,
            second: ChangeOp::Update
        }
    );
}

#[test]
fn setting_a_key_column_to_its_own_value_is_no_key_change() {
    let c = run(vec![upd(1, &[(0, 1), (1, 5)])]);
    assert_eq!(
        ops(&c),
        [NetOp::Update {
            key: vec![int(1)],
            before: None,
            after: None,
            set: assignments(&[(0, 1), (1, 5)]),
        }]
    );
}
