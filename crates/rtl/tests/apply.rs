//! Property tests: applying a compiled run with the DB2 apply rules gives the same
//! table as applying the run row by row.
//!
//! The table is modelled as a `BTreeMap` from key to row. DB2 apply rules (docs/design.md
//! §7): an insert whose key exists becomes an update, an update whose row is missing
//! becomes an insert, a delete of a missing row is ignored. The model lives here only:
//! the real bulk apply belongs to the store.

use std::collections::BTreeMap;

use hawser_core::{
    ChangeOp, ColumnDef, DataType, Gtid, Ident, NodeId, QualName, Row, RowChange, TableDef,
    Transaction, Value,
};
use hawser_rtl::{
    compile, compile_changes, Assignment, Change, ChangeKind, Compilation, NetOp, Outcome,
};
use proptest::prelude::*;

type Table = BTreeMap<Row, Row>;

const KEYS: i64 = 5;
const WIDTH: usize = 3;

/// `t (k, a, b)` keyed on `k`.
fn def() -> TableDef {
    let col = |n: &str| ColumnDef {
        name: Ident::unquoted(n),
        data_type: DataType::Integer,
        nullable: true,
        default: None,
    };
    TableDef {
        name: QualName::bare("t"),
        columns: vec![col("k"), col("a"), col("b")],
        primary_key: vec![0],
        explicit_key: true,
    }
}

fn int(i: i64) -> Value {
    Value::Int(i)
}

fn key_of(row: &[Value]) -> Row {
    vec![row[0].clone()]
}

// ---- DB2-rule apply over the model ----

/// Applies one change row by row with the DB2 rules.
fn apply_change(table: &mut Table, change: &Change) {
    match &change.kind {
        ChangeKind::Insert { row } => {
            table.insert(change.key.clone(), row.clone());
        }
        ChangeKind::Update { set, .. } => {
            // A missing row becomes an insert of the key and the set columns.
            let mut row = table.remove(&change.key).unwrap_or_else(|| {
                let mut r = vec![Value::Null; WIDTH];
                r[0] = change.key[0].clone();
                r
            });
            for a in set {
                row[a.column] = a.value.clone();
            }
            table.insert(key_of(&row), row);
        }
        ChangeKind::Delete { .. } => {
            table.remove(&change.key);
        }
    }
}

/// Applies a compiled result with the DB2 rules.
fn apply_compiled(table: &mut Table, compiled: &Compilation) {
    let tables = compiled.tables().expect("only compiled runs are applied");
    for op in tables.iter().flat_map(|t| &t.operations) {
        match op {
            NetOp::Insert { key, row } => {
                table.insert(key.clone(), row.clone());
            }
            NetOp::Update {
                key, after, set, ..
            } => {
                let row = match after {
                    Some(after) => after.clone(),
                    None => {
                        let mut row = table.get(key).cloned().unwrap_or_else(|| {
                            let mut r = vec![Value::Null; WIDTH];
                            r[0] = key[0].clone();
                            r
                        });
                        for a in set {
                            row[a.column] = a.value.clone();
                        }
                        row
                    }
                };
                table.insert(key.clone(), row);
            }
            NetOp::Delete { key, .. } => {
                table.remove(key);
            }
            NetOp::Replace { key, row, .. } => {
                table.remove(key);
                table.insert(key.clone(), row.clone());
            }
        }
    }
}

// ---- random runs (any operation on any key) ----

#[derive(Debug, Clone)]
enum Op {
    Insert(i64, i64, i64),
    /// Sets `a` and/or `b`.
    Update(i64, Option<i64>, Option<i64>),
    /// Moves the row to another key.
    MoveKey(i64, i64),
    Delete(i64),
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..KEYS;
    prop_oneof![
        (k.clone(), 0..4i64, 0..4i64).prop_map(|(k, a, b)| Op::Insert(k, a, b)),
        (k.clone(), 0..4i64, proptest::option::of(0..4i64)).prop_map(|(k, a, b)| Op::Update(
            k,
            Some(a),
            b
        )),
        (k.clone(), 0..4i64, proptest::option::of(0..4i64)).prop_map(|(k, b, a)| Op::Update(
            k,
            a,
            Some(b)
        )),
        (k.clone(), 1..KEYS).prop_map(|(a, d)| Op::MoveKey(a, (a + d) % KEYS)),
        k.prop_map(Op::Delete),
    ]
}

fn to_change(op: &Op) -> Change {
    let (key, kind) = match *op {
        Op::Insert(k, a, b) => (
            k,
            ChangeKind::Insert {
                row: vec![int(k), int(a), int(b)],
            },
        ),
        Op::Update(k, a, b) => {
            let set = [(1, a), (2, b)]
                .into_iter()
                .filter_map(|(column, v)| {
                    v.map(|v| Assignment {
                        column,
                        value: int(v),
                    })
                })
                .collect();
            (k, ChangeKind::Update { before: None, set })
        }
        Op::MoveKey(k, to) => (
            k,
            ChangeKind::Update {
                before: None,
                set: vec![Assignment {
                    column: 0,
                    value: int(to),
                }],
            },
        ),
        Op::Delete(k) => (k, ChangeKind::Delete { before: None }),
    };
    Change {
        table: QualName::bare("t"),
        key: vec![int(key)],
        kind,
    }
}

fn state() -> impl Strategy<Value = Table> {
    proptest::collection::btree_map(0..KEYS, (0..4i64, 0..4i64), 0..=KEYS as usize).prop_map(|m| {
        m.into_iter()
            .map(|(k, (a, b))| (vec![int(k)], vec![int(k), int(a), int(b)]))
            .collect()
    })
}

/// For each key, whether the first change in the run that touches it brings a row
/// there (an insert, or a key change landing on it).
fn first_touch_inserts(ops: &[Op]) -> BTreeMap<i64, bool> {
    let mut first = BTreeMap::new();
    for op in ops {
        match *op {
            Op::Insert(k, ..) => {
                first.entry(k).or_insert(true);
            }
            Op::Update(k, ..) | Op::Delete(k) => {
                first.entry(k).or_insert(false);
            }
            Op::MoveKey(k, to) => {
                first.entry(k).or_insert(false);
                first.entry(to).or_insert(true);
            }
        }
    }
    first
}

fn run_rows(start: &Table, changes: &[Change]) -> Table {
    let mut table = start.clone();
    for c in changes {
        apply_change(&mut table, c);
    }
    table
}

fn compile_ops(changes: &[Change]) -> Compilation {
    compile_changes(changes.iter().map(|c| vec![c.clone()]), &vec![def()])
        .expect("generated changes are well formed")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// From any starting table, a compiled run applies to the same table as the run
    /// row by row, with one exception that the test pins down exactly: a key the run
    /// begins by inserting while the table already holds it, and whose changes cancel
    /// (insert … delete gives nothing). Such a start is one the source never had (its
    /// insert would have failed), so it cannot arise from replaying a log onto a
    /// state before or after the run.
    #[test]
    fn compiled_apply_matches_row_by_row_apply_from_any_table(
        start in state(),
        ops in proptest::collection::vec(op(), 0..8),
    ) {
        let changes: Vec<Change> = ops.iter().map(to_change).collect();
        let compiled = compile_ops(&changes);
        if !compiled.is_compiled() {
            // Random runs are often invalid (insert over insert, ...): then the run is
            // applied in log order and there is nothing to compare.
            return Ok(());
        }
        let expected = run_rows(&start, &changes);
        let mut got = start.clone();
        apply_compiled(&mut got, &compiled);
        let netted: Vec<Row> = compiled
            .tables()
            .unwrap_or_default()
            .iter()
            .flat_map(|t| t.operations.iter().map(|o| o.key().clone()))
            .collect();
        let first = first_touch_inserts(&ops);
        for k in 0..KEYS {
            let key = vec![int(k)];
            if got.get(&key) == expected.get(&key) {
                continue;
            }
            prop_assert!(
                start.contains_key(&key)
                    && !expected.contains_key(&key)
                    && !netted.contains(&key)
                    && first.get(&k) == Some(&true),
                "key {k}: compiled gives {:?}, row by row {:?}\nstart {start:?}\nops {ops:?}\n{compiled:?}",
                got.get(&key),
                expected.get(&key),
            );
        }
    }

    /// When the starting table agrees with the run (keys the run first inserts are
    /// absent, keys it first updates or deletes are present), the tables are equal —
    /// or the run is reported not compilable.
    #[test]
    fn compiled_apply_matches_row_by_row_apply_from_an_agreeing_table(
        start in state(),
        ops in proptest::collection::vec(op(), 0..8),
        fill in (0..4i64, 0..4i64),
    ) {
        let mut start = start;
        for (k, inserts) in first_touch_inserts(&ops) {
            let key = vec![int(k)];
            if inserts {
                start.remove(&key);
            } else {
                start.entry(key).or_insert_with(|| vec![int(k), int(fill.0), int(fill.1)]);
            }
        }
        let changes: Vec<Change> = ops.iter().map(to_change).collect();
        let compiled = compile_ops(&changes);
        if let Outcome::NotCompilable(n) = &compiled.outcome {
            // The refusal points at a change of the run.
            prop_assert!(n.transaction < changes.len());
            return Ok(());
        }
        let expected = run_rows(&start, &changes);
        let mut got = start.clone();
        apply_compiled(&mut got, &compiled);
        prop_assert_eq!(&got, &expected, "ops {:?}\n{:?}", ops, compiled);
        // Re-applying the same result after it was applied changes nothing.
        let mut again = got.clone();
        apply_compiled(&mut again, &compiled);
        prop_assert_eq!(again, got);
    }
}

// ---- runs valid by construction (full images, as the commit log records them) ----

/// One step of a valid run, interpreted against the current table: `pick` chooses
/// among the operations legal for the row's state.
#[derive(Debug, Clone)]
struct Step {
    key: i64,
    pick: u8,
    a: i64,
    b: i64,
    /// Ends the transaction after this step.
    commit: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (0..KEYS, any::<u8>(), 0..4i64, 0..4i64, any::<bool>()).prop_map(|(key, pick, a, b, commit)| {
        Step {
            key,
            pick,
            a,
            b,
            commit,
        }
    })
}

/// Turns steps into transactions that are legal for `start`, and the table they leave.
fn valid_run(start: &Table, steps: &[Step]) -> (Vec<Transaction>, Table) {
    let mut table = start.clone();
    let mut txns = Vec::new();
    let mut current = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let key = vec![int(s.key)];
        let change = match table.get(&key).cloned() {
            None => {
                let row = vec![int(s.key), int(s.a), int(s.b)];
                table.insert(key.clone(), row.clone());
                RowChange {
                    table: QualName::bare("t"),
                    op: ChangeOp::Insert,
                    key,
                    before: None,
                    after: Some(row),
                }
            }
            Some(before) => {
                let free = (0..KEYS).find(|k| !table.contains_key(&vec![int(*k)]));
                match (s.pick % 4, free) {
                    (0, _) => {
                        table.remove(&key);
                        RowChange {
                            table: QualName::bare("t"),
                            op: ChangeOp::Delete,
                            key,
                            before: Some(before),
                            after: None,
                        }
                    }
                    (1, Some(to)) => {
                        // A key change, keeping `b` and setting `a`.
                        let after = vec![int(to), int(s.a), before[2].clone()];
                        table.remove(&key);
                        table.insert(vec![int(to)], after.clone());
                        RowChange {
                            table: QualName::bare("t"),
                            op: ChangeOp::Update,
                            key,
                            before: Some(before),
                            after: Some(after),
                        }
                    }
                    (pick, _) => {
                        let mut after = before.clone();
                        if pick != 2 {
                            after[1] = int(s.a);
                        }
                        after[2] = int(s.b);
                        table.insert(key.clone(), after.clone());
                        RowChange {
                            table: QualName::bare("t"),
                            op: ChangeOp::Update,
                            key,
                            before: Some(before),
                            after: Some(after),
                        }
                    }
                }
            }
        };
        current.push(change);
        if s.commit || i + 1 == steps.len() {
            txns.push(Transaction {
                gtid: Gtid::new(NodeId(1), txns.len() as u64 + 1),
                commit_micros: 0,
                changes: std::mem::take(&mut current),
            });
        }
    }
    (txns, table)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// A run that only makes legal changes always compiles, and its result applied to
    /// the starting table gives the table the run left — applied to that table again,
    /// it changes nothing.
    #[test]
    fn valid_runs_always_compile_and_apply_to_the_same_table(
        start in state(),
        steps in proptest::collection::vec(step(), 0..16),
    ) {
        let (txns, end) = valid_run(&start, &steps);
        let compiled = compile(&txns, &vec![def()]).expect("generated changes are well formed");
        prop_assert!(compiled.is_compiled(), "{:?}\n{:?}", txns, compiled.outcome);
        prop_assert_eq!(compiled.counts.transactions, txns.len() as u64);
        prop_assert_eq!(compiled.counts.row_changes, steps.len() as u64);
        prop_assert!(compiled.counts.net_operations <= 2 * KEYS as u64);

        let mut got = start.clone();
        apply_compiled(&mut got, &compiled);
        prop_assert_eq!(&got, &end, "{:?}\n{:?}", txns, compiled);
        let mut again = end.clone();
        apply_compiled(&mut again, &compiled);
        prop_assert_eq!(&again, &end);

        // Every net operation's before-image is the row as it was before the run.
        for op in compiled.tables().unwrap_or_default().iter().flat_map(|t| &t.operations) {
            let before = match op {
                NetOp::Update { before, .. } | NetOp::Delete { before, .. }
                | NetOp::Replace { before, .. } => before.as_ref(),
                NetOp::Insert { .. } => None,
            };
            if let Some(before) = before {
                prop_assert_eq!(start.get(op.key()), Some(before));
            }
            if let NetOp::Insert { key, .. } = op {
                prop_assert!(!start.contains_key(key));
            }
        }
    }

    /// The same legal runs, given as statement-level changes without before-images and
    /// without key changes, also always compile to the same table.
    #[test]
    fn valid_statement_level_runs_always_compile(
        start in state(),
        steps in proptest::collection::vec(step(), 0..16),
    ) {
        let steps: Vec<Step> = steps
            .into_iter()
            .map(|s| Step { pick: if s.pick % 4 == 1 { 3 } else { s.pick }, ..s })
            .collect();
        let (txns, end) = valid_run(&start, &steps);
        let light: Vec<Vec<Change>> = txns
            .iter()
            .map(|t| {
                t.changes
                    .iter()
                    .map(|rc| {
                        let full = Change::from_row_change(rc, &def()).expect("well formed");
                        let kind = match full.kind {
                            ChangeKind::Update { set, .. } => ChangeKind::Update { before: None, set },
                            ChangeKind::Delete { .. } => ChangeKind::Delete { before: None },
                            insert => insert,
                        };
                        Change { kind, ..full }
                    })
                    .collect()
            })
            .collect();
        let compiled = compile_changes(light, &vec![def()]).expect("well formed");
        prop_assert!(compiled.is_compiled(), "{:?}", compiled.outcome);
        let mut got = start.clone();
        apply_compiled(&mut got, &compiled);
        prop_assert_eq!(got, end);
    }
}

#[test]
fn the_one_divergence_insert_then_delete_over_a_row_the_source_never_had() {
    // The target holds key 1; the run inserts key 1 and deletes it. Row by row the
    // insert overwrites and the delete removes; compiled, the pair is nothing and the
    // target keeps its row. The source could not have run this log from that state.
    let start: Table = [(vec![int(1)], vec![int(1), int(0), int(0)])].into();
    let changes = vec![to_change(&Op::Insert(1, 5, 5)), to_change(&Op::Delete(1))];
    let compiled = compile_ops(&changes);
    assert_eq!(compiled.counts.net_operations, 0);
    let mut got = start.clone();
    apply_compiled(&mut got, &compiled);
    assert_eq!(got, start);
    assert!(run_rows(&start, &changes).is_empty());
}
