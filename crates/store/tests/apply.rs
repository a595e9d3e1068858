//! Receiver-side apply, run once against each engine: idempotence by Gtid, the DB2
//! exception rules, gaps and order per origin, refused batches that change nothing,
//! log records with the original Gtid, high-water marks across reopen, row locks
//! against local transactions, and bulk apply of compiled runs.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{col, counters, opts, Fixture};
use hawser_core::{
    ChangeOp, DataType, Epoch, Gtid, Lsn, NodeId, QualName, Row, RowChange, TableDef, Transaction,
    Value,
};
use hawser_store::{
    Database, DdlOp, HeldCommit, KeyRange, LogEntry, LogRecord, ReplicatedTxn, StoreError,
};

macro_rules! on_both_engines {
    ($($name:ident),* $(,)?) => {
        mod mem_engine {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Fixture::mem(super::opts())).await;
                }
            )*
        }
        mod sled_engine {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Fixture::sled(super::opts())).await;
                }
            )*
        }
    };
}

on_both_engines!(
    a_batch_applied_twice_changes_nothing_the_second_time,
    insert_of_an_existing_key_is_applied_as_an_update,
    update_of_a_missing_row_is_applied_as_an_insert,
    delete_of_a_missing_row_is_ignored,
    key_changing_updates_follow_the_rules_at_both_keys,
    gaps_advance_the_high_water_and_older_seqs_are_skipped,
    an_origin_out_of_order_within_a_batch_is_refused,
    an_unknown_table_refuses_the_whole_batch,
    log_records_carry_the_original_gtid_and_epoch,
    high_water_marks_survive_reopen,
    high_water_marks_survive_release_and_reopen,
    apply_waits_for_a_local_transaction_holding_the_row,
    a_compiled_run_writes_net_rows_and_every_record,
    a_run_that_does_not_compile_is_applied_in_log_order,
    a_partly_applied_run_is_finished_in_log_order,
    a_compilation_of_another_run_is_refused,
    replicated_ddl_runs_once_with_its_original_gtid,
    replicated_ddl_that_fails_here_changes_nothing,
    replicated_ddl_already_in_effect_is_recorded_and_changes_nothing,
    a_table_replicated_ddl_creates_is_refused_to_client_writes_until_a_plan_saw_it,
    commits_after_reads_one_origins_newest_commits_back_and_says_when_it_saw_them_all,
    a_replicated_sequence_block_sets_the_sequence_ahead_never_back,
    the_newest_commit_of_each_origin_is_known_before_and_after_reopening,
    a_copy_merges_chunks_writes_only_differences_and_trims_what_the_source_lacks,
    a_copys_marks_and_in_order_window_survive_reopen,
    a_copied_sequence_is_created_and_set_ahead_never_back,
    the_rest_of_a_transaction_that_came_in_parts_is_applied_at_its_high_water,
);

const ORIGIN: NodeId = NodeId(100);

fn t() -> QualName {
    QualName::bare("counters")
}

fn row(k: i64, n: i64) -> Row {
    vec![Value::Int(k), Value::Int(n)]
}

fn ins(k: i64, n: i64) -> RowChange {
    RowChange {
        table: t(),
        op: ChangeOp::Insert,
        key: vec![Value::Int(k)],
        before: None,
        after: Some(row(k, n)),
    }
}

/// An update of row `k` (holding `before` at the origin) to `(new_k, n)`.
fn upd(k: i64, before: i64, new_k: i64, n: i64) -> RowChange {
    RowChange {
        table: t(),
        op: ChangeOp::Update,
        key: vec![Value::Int(k)],
        before: Some(row(k, before)),
        after: Some(row(new_k, n)),
    }
}

fn del(k: i64, before: i64) -> RowChange {
    RowChange {
        table: t(),
        op: ChangeOp::Delete,
        key: vec![Value::Int(k)],
        before: Some(row(k, before)),
        after: None,
    }
}

fn rtxn(origin: NodeId, seq: u64, changes: Vec<RowChange>) -> ReplicatedTxn {
    ReplicatedTxn {
        txn: Transaction {
            gtid: Gtid::new(origin, seq),
            commit_micros: 1_000 + seq as i64,
            changes,
        },
        epoch: Epoch(3),
    }
}

async fn setup(f: &Fixture) -> &Database {
    let db = f.db();
    db.create_table(counters()).await.unwrap();
    db
}

fn rows(db: &Database) -> Vec<Row> {
    db.scan(&t(), KeyRange::all())
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn records(db: &Database) -> Vec<LogRecord> {
    db.log_range(Lsn(1), usize::MAX).unwrap()
}

/// The transaction records of the log (DDL left out).
fn txn_records(db: &Database) -> Vec<(Lsn, Epoch, Transaction)> {
    records(db)
        .into_iter()
        .filter_map(|r| match r.entry {
            LogEntry::Txn(t) => Some((r.lsn, r.epoch, t)),
            _ => None,
        })
        .collect()
}

/// Inserts `(k, n)` in a local transaction.
async fn local_insert(db: &Database, k: i64, n: i64) {
    let mut txn = db.begin();
    txn.insert(&t(), row(k, n)).await.unwrap();
    txn.commit().await.unwrap();
}

async fn a_batch_applied_twice_changes_nothing_the_second_time(f: Fixture) {
    let db = setup(&f).await;
    let batch = vec![
        rtxn(ORIGIN, 1, vec![ins(1, 10), ins(2, 20)]),
        rtxn(ORIGIN, 2, vec![upd(1, 10, 1, 11), del(2, 20)]),
        rtxn(NodeId(200), 1, vec![ins(3, 30)]),
    ];
    let first = db.apply_replicated(batch.clone()).await.unwrap();
    assert_eq!((first.applied, first.skipped), (3, 0));
    assert_eq!(first.row_changes, 5);
    assert!(first.durable && !first.compiled);
    let after_first = (rows(db), records(db));
    assert_eq!(after_first.0, vec![row(1, 11), row(3, 30)]);
    let second = db.apply_replicated(batch).await.unwrap();
    assert_eq!((second.applied, second.skipped), (0, 3));
    assert_eq!(second.rows_written, 0);
    assert_eq!(second.last_lsn, Lsn::ZERO);
    assert_eq!((rows(db), records(db)), after_first);
    assert_eq!(second.high_water, first.high_water);
    assert_eq!(second.high_water[&ORIGIN], 2);
    assert_eq!(second.high_water[&NodeId(200)], 1);
}

async fn insert_of_an_existing_key_is_applied_as_an_update(f: Fixture) {
    let db = setup(&f).await;
    local_insert(db, 1, 5).await;
    let info = db
        .apply_replicated(vec![rtxn(ORIGIN, 1, vec![ins(1, 10)])])
        .await
        .unwrap();
    assert_eq!(info.applied, 1);
    assert_eq!(rows(db), vec![row(1, 10)]);
    // Recorded as what happened here: an update of the row that was here.
    let (_, _, txn) = txn_records(db).pop().unwrap();
    assert_eq!(txn.changes.len(), 1);
    let c = &txn.changes[0];
    assert_eq!(c.op, ChangeOp::Update);
    assert_eq!(c.before, Some(row(1, 5)));
    assert_eq!(c.after, Some(row(1, 10)));
}

async fn update_of_a_missing_row_is_applied_as_an_insert(f: Fixture) {
    let db = setup(&f).await;
    db.apply_replicated(vec![rtxn(ORIGIN, 1, vec![upd(4, 40, 4, 41)])])
        .await
        .unwrap();
    assert_eq!(rows(db), vec![row(4, 41)]);
    let (_, _, txn) = txn_records(db).pop().unwrap();
    assert_eq!(txn.changes[0].op, ChangeOp::Insert);
    assert_eq!(txn.changes[0].before, None);
    assert_eq!(txn.changes[0].after, Some(row(4, 41)));
}

async fn delete_of_a_missing_row_is_ignored(f: Fixture) {
    let db = setup(&f).await;
    local_insert(db, 1, 5).await;
    let info = db
        .apply_replicated(vec![rtxn(ORIGIN, 1, vec![del(9, 90), del(1, 5)])])
        .await
        .unwrap();
    assert_eq!(info.applied, 1);
    assert_eq!(
        info.rows_written, 1,
        "only the row that was here is deleted"
    );
    assert!(rows(db).is_empty());
    let (_, _, txn) = txn_records(db).pop().unwrap();
    assert_eq!(txn.changes, vec![del(1, 5)]);
    assert_eq!(db.high_water(ORIGIN).unwrap(), 1);
}

async fn key_changing_updates_follow_the_rules_at_both_keys(f: Fixture) {
    let db = setup(&f).await;
    local_insert(db, 1, 10).await;
    local_insert(db, 2, 20).await;
    local_insert(db, 3, 30).await;
    db.apply_replicated(vec![
        // Old key here, new key free: the row moves.
        rtxn(ORIGIN, 1, vec![upd(1, 10, 5, 11)]),
        // Old key here, new key taken here: the old goes, the new is overwritten.
        rtxn(ORIGIN, 2, vec![upd(2, 20, 3, 21)]),
        // Old key missing, new key free: an insert at the new key.
        rtxn(ORIGIN, 3, vec![upd(7, 70, 8, 71)]),
        // Old key missing, new key taken: the row there is overwritten.
        rtxn(ORIGIN, 4, vec![upd(9, 90, 5, 91)]),
    ])
    .await
    .unwrap();
    assert_eq!(rows(db), vec![row(3, 21), row(5, 91), row(8, 71)]);
    let txns: Vec<Vec<RowChange>> = txn_records(db)
        .into_iter()
        .filter(|(_, _, t)| t.gtid.origin == ORIGIN)
        .map(|(_, _, t)| t.changes)
        .collect();
    assert_eq!(txns[0], vec![upd(1, 10, 5, 11)]);
    assert_eq!(txns[1], vec![del(2, 20), upd(3, 30, 3, 21)]);
    assert_eq!(txns[2], vec![ins(8, 71)]);
    assert_eq!(txns[3], vec![upd(5, 11, 5, 91)]);
}

async fn gaps_advance_the_high_water_and_older_seqs_are_skipped(f: Fixture) {
    let db = setup(&f).await;
    let info = db
        .apply_replicated(vec![
            rtxn(ORIGIN, 1, vec![ins(1, 10)]),
            rtxn(ORIGIN, 5, vec![ins(5, 50)]),
        ])
        .await
        .unwrap();
    assert_eq!(info.applied, 2);
    assert_eq!(db.high_water(ORIGIN).unwrap(), 5);
    // A transaction inside the gap arriving later is already covered by the mark.
    let late = db
        .apply_replicated(vec![
            rtxn(ORIGIN, 3, vec![ins(3, 30)]),
            rtxn(ORIGIN, 6, vec![ins(6, 60)]),
        ])
        .await
        .unwrap();
    assert_eq!((late.applied, late.skipped), (1, 1));
    assert_eq!(rows(db), vec![row(1, 10), row(5, 50), row(6, 60)]);
    assert_eq!(db.high_water(ORIGIN).unwrap(), 6);
}

async fn an_origin_out_of_order_within_a_batch_is_refused(f: Fixture) {
    let db = setup(&f).await;
    let before = records(db);
    for batch in [
        vec![
            rtxn(ORIGIN, 2, vec![ins(2, 20)]),
            rtxn(ORIGIN, 1, vec![ins(1, 10)]),
        ],
        vec![
            rtxn(ORIGIN, 1, vec![ins(1, 10)]),
            rtxn(NodeId(200), 1, vec![ins(2, 20)]),
            rtxn(ORIGIN, 1, vec![ins(3, 30)]),
        ],
    ] {
        let err = db.apply_replicated(batch).await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidBatch(_)), "{err}");
        assert!(err.to_string().contains("out of order"), "{err}");
    }
    assert!(rows(db).is_empty());
    assert_eq!(records(db), before);
    assert_eq!(db.high_water(ORIGIN).unwrap(), 0);
    // Different origins interleave freely.
    db.apply_replicated(vec![
        rtxn(ORIGIN, 1, vec![ins(1, 10)]),
        rtxn(NodeId(200), 7, vec![ins(2, 20)]),
        rtxn(ORIGIN, 2, vec![ins(3, 30)]),
    ])
    .await
    .unwrap();
    assert_eq!(rows(db).len(), 3);
}

async fn an_unknown_table_refuses_the_whole_batch(f: Fixture) {
    let db = setup(&f).await;
    let before = records(db);
    let mut stray = ins(1, 10);
    stray.table = QualName::bare("nowhere");
    let err = db
        .apply_replicated(vec![
            rtxn(ORIGIN, 1, vec![ins(1, 10)]),
            rtxn(ORIGIN, 2, vec![ins(2, 20), stray]),
        ])
        .await
        .unwrap_err();
    assert_eq!(err.code(), "42P01");
    let msg = err.to_string();
    assert!(
        msg.contains("100:2") && msg.contains("nowhere"),
        "the error names the Gtid and the table: {msg}"
    );
    assert!(rows(db).is_empty());
    assert_eq!(records(db), before);
    assert_eq!(db.high_water(ORIGIN).unwrap(), 0);
    // A row that does not fit the table is refused the same way.
    let mut wide = ins(1, 10);
    wide.after = Some(vec![Value::Int(1), Value::Int(2), Value::Int(3)]);
    let err = db
        .apply_replicated(vec![rtxn(ORIGIN, 1, vec![wide])])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Replicated { .. }), "{err}");
    assert_eq!(records(db), before);
}

async fn log_records_carry_the_original_gtid_and_epoch(f: Fixture) {
    let db = setup(&f).await;
    local_insert(db, 1, 10).await;
    let own_before = db.high_water(db.node_id()).unwrap();
    let last = db.last_lsn();
    let info = db
        .apply_replicated(vec![
            rtxn(ORIGIN, 41, vec![ins(2, 20)]),
            rtxn(ORIGIN, 42, vec![]),
        ])
        .await
        .unwrap();
    assert_eq!(info.last_lsn, Lsn(last.0 + 2));
    let recs = txn_records(db);
    let applied: Vec<_> = recs.iter().filter(|r| r.2.gtid.origin == ORIGIN).collect();
    assert_eq!(applied.len(), 2);
    assert_eq!(applied[0].0, Lsn(last.0 + 1));
    assert_eq!(applied[0].1, Epoch(3));
    assert_eq!(applied[0].2.gtid, Gtid::new(ORIGIN, 41));
    assert_eq!(applied[0].2.commit_micros, 1_041);
    assert_eq!(applied[1].2.gtid, Gtid::new(ORIGIN, 42));
    assert!(applied[1].2.changes.is_empty());
    // Applying does not consume this node's own seqs: local Gtids stay dense.
    assert_eq!(db.high_water(db.node_id()).unwrap(), own_before);
    local_insert(db, 3, 30).await;
    let (_, _, mine) = txn_records(db).pop().unwrap();
    assert_eq!(mine.gtid, Gtid::new(db.node_id(), own_before + 1));
}

async fn high_water_marks_survive_release_and_reopen(mut f: Fixture) {
    setup(&f).await;
    let db = f.db();
    db.apply_replicated(vec![
        rtxn(ORIGIN, 3, vec![ins(1, 10)]),
        rtxn(NodeId(200), 9, vec![ins(2, 20)]),
        rtxn(ORIGIN, 4, vec![ins(3, 30)]),
    ])
    .await
    .unwrap();
    local_insert(db, 4, 40).await;
    let marks = db.high_waters().unwrap();
    // Every record but the last (this node's insert) is released: the marks they
    // carried must come back from the high-water keys.
    db.release_log(db.last_lsn(), 0).unwrap();
    assert_eq!(db.log_start(), db.last_lsn());
    assert_eq!(db.high_waters().unwrap(), marks);
    let db = f.reopen();
    assert_eq!(db.high_waters().unwrap(), marks);
    assert_eq!(
        marks,
        BTreeMap::from([(opts().node_id, 2), (ORIGIN, 4), (NodeId(200), 9)])
    );
    // Released transactions are still recognised as applied.
    let info = db
        .apply_replicated(vec![rtxn(ORIGIN, 4, vec![ins(3, 99)])])
        .await
        .unwrap();
    assert_eq!((info.applied, info.skipped), (0, 1));
}

async fn high_water_marks_survive_reopen(mut f: Fixture) {
    setup(&f).await;
    f.db()
        .apply_replicated(vec![
            rtxn(ORIGIN, 3, vec![ins(1, 10)]),
            rtxn(NodeId(200), 9, vec![ins(2, 20)]),
        ])
        .await
        .unwrap();
    let marks = f.db().high_waters().unwrap();
    let last = f.db().last_lsn();
    let db = f.reopen();
    assert_eq!(db.high_waters().unwrap(), marks);
    assert_eq!(
        marks,
        BTreeMap::from([(opts().node_id, 1), (ORIGIN, 3), (NodeId(200), 9)])
    );
    assert_eq!(db.last_lsn(), last);
    let again = db
        .apply_replicated(vec![rtxn(ORIGIN, 3, vec![ins(1, 99)])])
        .await
        .unwrap();
    assert_eq!(again.skipped, 1);
    assert_eq!(rows(db), vec![row(1, 10), row(2, 20)]);
}

async fn apply_waits_for_a_local_transaction_holding_the_row(f: Fixture) {
    let db = setup(&f).await;
    local_insert(db, 1, 10).await;
    let mut local = db.begin();
    local
        .update(&t(), &[Value::Int(1)], row(1, 11))
        .await
        .unwrap();
    let mut applier = {
        let db = db.clone();
        tokio::spawn(async move {
            db.apply_replicated(vec![rtxn(ORIGIN, 1, vec![upd(1, 11, 1, 12)])])
                .await
        })
    };
    // The apply needs the row lock the local transaction holds: it must still be
    // waiting when this deadline passes (without the lock it finishes in microseconds).
    let waited = tokio::time::timeout(Duration::from_millis(300), &mut applier).await;
    assert!(waited.is_err(), "apply overtook a local transaction");
    assert_eq!(db.high_water(ORIGIN).unwrap(), 0);
    local.commit().await.unwrap();
    applier.await.unwrap().unwrap();
    assert_eq!(rows(db), vec![row(1, 12)]);
    let (_, _, applied) = txn_records(db).pop().unwrap();
    assert_eq!(applied.changes[0].before, Some(row(1, 11)));
}

/// A run over keys 1..=3: 1 is inserted and updated twice, 2 is updated then deleted,
/// 3 is deleted and inserted again.
fn run() -> Vec<ReplicatedTxn> {
    vec![
        rtxn(ORIGIN, 1, vec![ins(1, 10), upd(2, 20, 2, 21)]),
        rtxn(ORIGIN, 2, vec![upd(1, 10, 1, 11), del(3, 30)]),
        rtxn(ORIGIN, 3, vec![upd(1, 11, 1, 12), del(2, 21)]),
        rtxn(ORIGIN, 4, vec![ins(3, 33)]),
    ]
}

fn compile(db: &Database, run: &[ReplicatedTxn]) -> hawser_rtl::Compilation {
    let catalog: Vec<TableDef> = db.tables().iter().map(|t| (**t).clone()).collect();
    let txns: Vec<Transaction> = run.iter().map(|r| r.txn.clone()).collect();
    hawser_rtl::compile(&txns, &catalog).unwrap()
}

async fn a_compiled_run_writes_net_rows_and_every_record(f: Fixture) {
    let db = setup(&f).await;
    local_insert(db, 2, 20).await;
    local_insert(db, 3, 30).await;
    let run = run();
    let compiled = compile(db, &run);
    assert!(compiled.is_compiled());
    let info = db.apply_compiled(&run, &compiled).await.unwrap();
    assert!(info.compiled);
    assert_eq!((info.applied, info.row_changes), (4, 7));
    assert_eq!(info.rows_written, 3, "one write per key");
    assert_eq!(rows(db), vec![row(1, 12), row(3, 33)]);
    let applied: Vec<_> = txn_records(db)
        .into_iter()
        .filter(|r| r.2.gtid.origin == ORIGIN)
        .collect();
    let gtids: Vec<u64> = applied.iter().map(|r| r.2.gtid.seq).collect();
    assert_eq!(gtids, vec![1, 2, 3, 4]);
    // Records hold the changes as they happened here, in log order.
    assert_eq!(applied[1].2.changes, vec![upd(1, 10, 1, 11), del(3, 30)]);
    assert_eq!(db.high_water(ORIGIN).unwrap(), 4);
    // The same run again is skipped whole.
    let again = db.apply_compiled(&run, &compiled).await.unwrap();
    assert_eq!(
        (again.applied, again.skipped, again.rows_written),
        (0, 4, 0)
    );
    assert_eq!(rows(db), vec![row(1, 12), row(3, 33)]);
}

async fn a_run_that_does_not_compile_is_applied_in_log_order(f: Fixture) {
    let db = setup(&f).await;
    // insert followed by insert of the same key is not an RTL pair.
    let run = vec![
        rtxn(ORIGIN, 1, vec![ins(1, 10)]),
        rtxn(ORIGIN, 2, vec![ins(1, 11), ins(2, 20)]),
    ];
    let compiled = compile(db, &run);
    assert!(!compiled.is_compiled());
    let info = db.apply_compiled(&run, &compiled).await.unwrap();
    assert!(!info.compiled);
    assert_eq!(info.applied, 2);
    assert_eq!(rows(db), vec![row(1, 11), row(2, 20)]);
}

async fn a_partly_applied_run_is_finished_in_log_order(f: Fixture) {
    let db = setup(&f).await;
    local_insert(db, 2, 20).await;
    local_insert(db, 3, 30).await;
    let run = run();
    // The first two transactions arrived earlier, in log order.
    db.apply_replicated(run[..2].to_vec()).await.unwrap();
    let compiled = compile(db, &run);
    let info = db.apply_compiled(&run, &compiled).await.unwrap();
    assert!(
        !info.compiled,
        "net operations must not land inside the run"
    );
    assert_eq!((info.applied, info.skipped), (2, 2));
    assert_eq!(rows(db), vec![row(1, 12), row(3, 33)]);
}

async fn a_compilation_of_another_run_is_refused(f: Fixture) {
    let db = setup(&f).await;
    let run = run();
    let compiled = compile(db, &run[..2]);
    let err = db.apply_compiled(&run, &compiled).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidBatch(_)), "{err}");
    assert_eq!(err.code(), "08P01");
    assert!(rows(db).is_empty());
    assert_eq!(db.stats().locks_held, 0);
}

fn ddl(seq: u64, op: DdlOp) -> LogEntry {
    LogEntry::Ddl {
        gtid: Gtid::new(ORIGIN, seq),
        commit_micros: 500 + seq as i64,
        op,
    }
}

async fn replicated_ddl_runs_once_with_its_original_gtid(mut f: Fixture) {
    let db = f.db();
    let create = ddl(1, DdlOp::CreateTable(counters()));
    let info = db.apply_replicated_ddl(&create, Epoch(2)).await.unwrap();
    assert_eq!((info.applied, info.skipped), (1, 0));
    assert!(info.durable);
    assert!(db.table(&t()).is_some());
    let again = db.apply_replicated_ddl(&create, Epoch(2)).await.unwrap();
    assert_eq!((again.applied, again.skipped), (0, 1));
    // Row changes and DDL of one origin share its high-water.
    db.apply_replicated(vec![rtxn(ORIGIN, 2, vec![ins(1, 10)])])
        .await
        .unwrap();
    let add = ddl(
        3,
        DdlOp::AddColumn {
            table: t(),
            column: col("note", DataType::Varchar(8), true),
        },
    );
    db.apply_replicated_ddl(&add, Epoch(2)).await.unwrap();
    assert_eq!(db.high_water(ORIGIN).unwrap(), 3);
    let recs = records(db);
    assert_eq!(recs.len(), 3);
    assert_eq!((recs[0].epoch, &recs[0].entry), (Epoch(2), &create));
    assert_eq!(recs[2].entry, add);
    // Nothing of this node's own origin was used up.
    assert_eq!(db.high_water(db.node_id()).unwrap(), 0);
    let db = f.reopen();
    assert_eq!(db.table(&t()).unwrap().columns.len(), 3);
    assert_eq!(
        rows(db),
        vec![vec![Value::Int(1), Value::Int(10), Value::Null]]
    );
    let drop = ddl(4, DdlOp::DropTable(t()));
    db.apply_replicated_ddl(&drop, Epoch(2)).await.unwrap();
    assert!(db.table(&t()).is_none());
    assert_eq!(db.high_waters().unwrap(), BTreeMap::from([(ORIGIN, 4)]));
}

async fn replicated_ddl_that_fails_here_changes_nothing(f: Fixture) {
    let db = setup(&f).await;
    let before = records(db);
    // The table exists here with another definition.
    let mut other = counters();
    other.columns.push(col("extra", DataType::Integer, true));
    let err = db
        .apply_replicated_ddl(&ddl(1, DdlOp::CreateTable(other)), Epoch(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "42P07");
    assert!(err.to_string().contains("100:1"), "{err}");
    assert_eq!(records(db), before);
    assert_eq!(db.high_water(ORIGIN).unwrap(), 0);
    let txn = LogEntry::Txn(rtxn(ORIGIN, 1, vec![]).txn);
    let err = db.apply_replicated_ddl(&txn, Epoch(1)).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidBatch(_)), "{err}");
}

async fn replicated_ddl_already_in_effect_is_recorded_and_changes_nothing(f: Fixture) {
    let db = setup(&f).await;
    db.apply_replicated(vec![rtxn(ORIGIN, 1, vec![ins(1, 10)])])
        .await
        .unwrap();
    // The same table was created on both sides before the scheme shipped the DDL.
    let info = db
        .apply_replicated_ddl(&ddl(2, DdlOp::CreateTable(counters())), Epoch(1))
        .await
        .unwrap();
    assert_eq!((info.applied, info.skipped), (1, 0));
    assert_eq!(db.high_water(ORIGIN).unwrap(), 2);
    assert_eq!(rows(db), vec![vec![Value::Int(1), Value::Int(10)]]);
    // Dropping a table that is not here is done already too.
    let gone = QualName::bare("gone");
    db.apply_replicated_ddl(&ddl(3, DdlOp::DropTable(gone)), Epoch(1))
        .await
        .unwrap();
    assert_eq!(db.high_water(ORIGIN).unwrap(), 3);
    assert_eq!(rows(db).len(), 1);
}

async fn a_table_replicated_ddl_creates_is_refused_to_client_writes_until_a_plan_saw_it(
    f: Fixture,
) {
    let db = f.db();
    let write = || async {
        let mut txn = db.begin();
        txn.insert(&t(), row(1, 1)).await?;
        txn.commit().await.map(|_| ())
    };
    // The master drops the table and creates it again (seqs `seq` and `seq + 1`).
    let recreate = |seq: u64| async move {
        db.apply_replicated_ddl(&ddl(seq, DdlOp::DropTable(t())), Epoch(1))
            .await
            .unwrap();
        db.apply_replicated_ddl(&ddl(seq + 1, DdlOp::CreateTable(counters())), Epoch(1))
            .await
            .unwrap();
    };
    // A plan of the write refusals reads the count, then the catalog: this one ran
    // before the table existed.
    let before = db.catalog_generation();
    db.apply_replicated_ddl(&ddl(1, DdlOp::CreateTable(counters())), Epoch(1))
        .await
        .unwrap();
    let err = write().await.unwrap_err();
    assert_eq!(err.code(), "25006", "{err}");
    assert!(err.to_string().contains("node 100"), "{err}");
    // Named by its store once the node knows the cluster's names.
    db.set_store_names([(ORIGIN, "ds1".to_string())].into_iter().collect());
    recreate(2).await;
    let err = write().await.unwrap_err();
    assert!(err.to_string().contains("master ds1 (node 100)"), "{err}");
    // Its result must not lift the refusal: it never saw the table.
    db.set_write_refusals(Default::default(), before);
    assert_eq!(write().await.unwrap_err().code(), "25006");
    // A plan that saw the table decides: here, that this store masters it too.
    db.set_write_refusals(Default::default(), db.catalog_generation());
    write().await.unwrap();
    // Dropped and created again by its master: refused again at once.
    recreate(4).await;
    assert_eq!(write().await.unwrap_err().code(), "25006");
    // This node's own tables never are.
    let own = QualName::bare("own");
    let mut def = counters();
    def.name = own.clone();
    db.create_table(def).await.unwrap();
    let mut txn = db.begin();
    txn.insert(&own, row(1, 1)).await.unwrap();
    txn.commit().await.unwrap();
}

/// `last_commit_of` gives each origin's newest commit by seq and commit time, for this
/// node's own origin and for one applied from, kept as commits come and derived from
/// the log when the store opens — and from the marks of released log once the log holds
/// none of an origin's commits.
async fn the_newest_commit_of_each_origin_is_known_before_and_after_reopening(mut f: Fixture) {
    let db = setup(&f).await;
    let own = db.node_id();
    assert_eq!(db.last_commit_of(ORIGIN), None);
    db.apply_replicated(vec![
        rtxn(ORIGIN, 1, vec![ins(1, 0)]),
        rtxn(ORIGIN, 2, vec![]),
    ])
    .await
    .unwrap();
    let mut txn = db.begin();
    txn.insert(&t(), row(2, 0)).await.unwrap();
    let c = txn.commit().await.unwrap();
    let micros = db.log_range(c.lsn, 1).unwrap()[0].entry.commit_micros();
    let expected = |db: &Database, own_seq: u64, own_micros: i64| {
        assert_eq!(
            db.last_commit_of(ORIGIN),
            Some(HeldCommit {
                seq: 2,
                commit_micros: 1_002
            })
        );
        assert_eq!(
            db.last_commit_of(own),
            Some(HeldCommit {
                seq: own_seq,
                commit_micros: own_micros
            })
        );
    };
    expected(db, c.gtid.seq, micros);
    let db = f.reopen();
    expected(db, c.gtid.seq, micros);
    // Once every record of ORIGIN is released, its newest commit is still known
    // after reopening: the released mark keeps its commit time.
    let mut txn = db.begin();
    txn.insert(&t(), row(3, 0)).await.unwrap();
    let newer = txn.commit().await.unwrap();
    db.release_log(newer.lsn, 0).unwrap();
    assert!(db
        .log_range(Lsn(1), 10)
        .unwrap()
        .iter()
        .all(|r| r.entry.gtid().origin == own));
    let micros = db.log_range(newer.lsn, 1).unwrap()[0].entry.commit_micros();
    expected(f.reopen(), newer.gtid.seq, micros);
}

async fn commits_after_reads_one_origins_newest_commits_back_and_says_when_it_saw_them_all(
    f: Fixture,
) {
    let db = setup(&f).await;
    // ORIGIN's seqs 1..=5, with local commits between them.
    for seq in 1..=5 {
        db.apply_replicated(vec![rtxn(ORIGIN, seq, vec![ins(seq as i64, 0)])])
            .await
            .unwrap();
        let mut txn = db.begin();
        txn.insert(&t(), row(100 + seq as i64, 0)).await.unwrap();
        txn.commit().await.unwrap();
    }
    let after = |after: u64, through: u64, limit: usize| {
        db.commits_after(ORIGIN, after, through, limit, |r| {
            (r.gtid().seq, r.entry.commit_micros())
        })
        .unwrap()
    };
    let seqs = |v: &[(u64, i64)]| v.iter().map(|(s, _)| *s).collect::<Vec<_>>();
    let (got, complete) = after(2, u64::MAX, 10);
    assert_eq!(got, vec![(3, 1_003), (4, 1_004), (5, 1_005)]);
    assert!(complete);
    // The newest ones when there are more than asked for.
    let (got, complete) = after(2, u64::MAX, 2);
    assert_eq!((seqs(&got), complete), (vec![4, 5], false));
    // Newer ones than `through` are passed over, not counted.
    let (got, complete) = after(2, 4, 2);
    assert_eq!((seqs(&got), complete), (vec![3, 4], true));
    // Nothing released: all of an origin's commits are there to see.
    let (got, complete) = after(0, u64::MAX, 10);
    assert_eq!((seqs(&got), complete), (vec![1, 2, 3, 4, 5], true));
    let (got, complete) = db
        .commits_after(NodeId(999), 0, u64::MAX, 10, |r| r.gtid())
        .unwrap();
    assert!(got.is_empty() && complete);
    // Once log is released, only a commit at or below `after` shows where they start.
    db.release_log(db.last_lsn(), 0).unwrap();
    db.apply_replicated(vec![rtxn(ORIGIN, 6, vec![ins(6, 0)])])
        .await
        .unwrap();
    let (got, complete) = after(5, u64::MAX, 10);
    assert_eq!((seqs(&got), complete), (vec![6], false));
}

async fn a_replicated_sequence_block_sets_the_sequence_ahead_never_back(mut f: Fixture) {
    let db = f.db();
    let name = QualName::bare("s");
    let def = hawser_store::SequenceDef::with_defaults(name.clone(), None, None, None, None, false);
    db.create_sequence(def).await.unwrap();
    assert_eq!(db.next_val(&name).unwrap(), 1);
    // The master has handed out values up to 40.
    let block = |seq: u64, restart_at: i64| LogEntry::SequenceBlock {
        gtid: Gtid::new(ORIGIN, seq),
        commit_micros: 1,
        name: name.clone(),
        restart_at: Some(restart_at),
    };
    let info = db
        .apply_replicated_ddl(&block(1, 41), Epoch(1))
        .await
        .unwrap();
    assert_eq!((info.applied, info.skipped), (1, 0));
    assert_eq!(db.next_val(&name).unwrap(), 41);
    // An older reservation never moves it back; a repeat is skipped.
    db.apply_replicated_ddl(&block(2, 21), Epoch(1))
        .await
        .unwrap();
    let again = db
        .apply_replicated_ddl(&block(2, 21), Epoch(1))
        .await
        .unwrap();
    assert_eq!(again.skipped, 1);
    assert_eq!(db.next_val(&name).unwrap(), 42);
    assert_eq!(db.high_water(ORIGIN).unwrap(), 2);
    // Durable: a reopened store resumes past the master's values.
    let db = f.reopen();
    assert!(db.next_val(&name).unwrap() > 42);
    // A block for a sequence this store lacks is refused, naming it.
    let missing = LogEntry::SequenceBlock {
        gtid: Gtid::new(ORIGIN, 3),
        commit_micros: 1,
        name: QualName::bare("nope"),
        restart_at: Some(5),
    };
    let err = db
        .apply_replicated_ddl(&missing, Epoch(1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

/// A duplicate's target: chunks in key order merge into what the table holds (equal
/// rows untouched, different ones put, keys in a chunk's range it lacks deleted), the
/// trim removes what lies past the last chunk, and no log record is written.
async fn a_copy_merges_chunks_writes_only_differences_and_trims_what_the_source_lacks(f: Fixture) {
    let db = setup(&f).await;
    for k in [1, 3, 5, 7, 9, 11] {
        local_insert(db, k, k).await;
    }
    let logged = records(db).len();
    let mut cursor = hawser_store::CopyCursor::default();
    // Keys up to 5: 1 is gone at the source, 2 is new, 3 changed, 5 the same.
    let m = db
        .copy_merge(&t(), vec![row(2, 2), row(3, 30), row(5, 5)], &mut cursor)
        .await
        .unwrap();
    assert_eq!((m.written, m.unchanged, m.deleted), (2, 1, 1));
    // Keys after 5 up to 9: 7 is gone, 8 is new, 9 the same.
    let m = db
        .copy_merge(&t(), vec![row(8, 8), row(9, 9)], &mut cursor)
        .await
        .unwrap();
    assert_eq!((m.written, m.unchanged, m.deleted), (1, 1, 1));
    // An empty chunk moves nothing.
    let m = db.copy_merge(&t(), vec![], &mut cursor).await.unwrap();
    assert_eq!((m.written, m.unchanged, m.deleted), (0, 0, 0));
    // 11 lies past the last chunk.
    assert_eq!(db.copy_trim(&t(), &cursor).await.unwrap(), 1);
    assert_eq!(
        rows(db),
        vec![row(2, 2), row(3, 30), row(5, 5), row(8, 8), row(9, 9)]
    );
    assert_eq!(records(db).len(), logged, "a copy writes no log record");
    // A row that does not fit the table is refused, naming it.
    let err = db
        .copy_merge(&t(), vec![vec![Value::Int(1)]], &mut cursor)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::WrongArity { .. }), "{err}");
    // A table copied from scratch: the trim of a fresh cursor empties it.
    let fresh = hawser_store::CopyCursor::default();
    assert_eq!(db.copy_trim(&t(), &fresh).await.unwrap(), 5);
    assert!(rows(db).is_empty());
}

/// A copy's marks raise the other origins' high-water (never lower them, never this
/// node's own) and, with the in-order window, hold across a reopen.
async fn a_copys_marks_and_in_order_window_survive_reopen(mut f: Fixture) {
    let db = setup(&f).await;
    db.apply_replicated(vec![rtxn(ORIGIN, 7, vec![ins(1, 1)])])
        .await
        .unwrap();
    let other = NodeId(200);
    let own = db.node_id();
    let own_seq = db.high_water(own).unwrap();
    let start = BTreeMap::from([(ORIGIN, 5), (other, 40), (own, 999)]);
    let end = BTreeMap::from([(ORIGIN, 9), (other, 44), (own, 999)]);
    db.copy_marks(&start, &end).await.unwrap();
    let check = |db: &Database| {
        assert_eq!(db.high_water(ORIGIN).unwrap(), 7, "a higher mark stays");
        assert_eq!(db.high_water(other).unwrap(), 40);
        assert_eq!(
            db.high_water(own).unwrap(),
            own_seq,
            "the own origin is left alone"
        );
        assert_eq!(db.in_order_through(ORIGIN), 9);
        assert_eq!(db.in_order_through(other), 44);
        assert_eq!(db.in_order_through(own), 0);
    };
    check(db);
    let db = f.reopen();
    check(db);
    // A transaction at or below the copied mark is skipped as held already.
    let info = db
        .apply_replicated(vec![rtxn(other, 40, vec![ins(2, 2)])])
        .await
        .unwrap();
    assert_eq!((info.applied, info.skipped), (0, 1));
}

/// A duplicate's sequences: the source's restart point is read with its definition; the
/// target creates a sequence it lacks as the source has it and sets it ahead to that
/// point (never back), durably.
async fn a_copied_sequence_is_created_and_set_ahead_never_back(mut f: Fixture) {
    let name = QualName::bare("s");
    let def = hawser_store::SequenceDef::with_defaults(name.clone(), None, None, None, None, false);
    // The source handed out 1..=25: its second block of 20 ends before 41.
    let source =
        hawser_store::Database::open_memory(hawser_store::DbOptions::new(NodeId(7))).unwrap();
    source.create_sequence(def.clone()).await.unwrap();
    for _ in 0..25 {
        source.next_val(&name).unwrap();
    }
    let (copied, restart_at) = source.copy_sequence_point(&name).unwrap();
    assert_eq!((&copied, restart_at), (&def, Some(41)));
    assert!(source
        .copy_sequence_point(&QualName::bare("nope"))
        .is_none());

    let db = f.db();
    assert!(
        db.copy_sequence(copied.clone(), restart_at).await.unwrap(),
        "created"
    );
    assert_eq!(db.sequence(&name), Some(def.clone()));
    assert_eq!(db.next_val(&name).unwrap(), 41);
    // Copied again from a point behind it: it stays, and nothing is created.
    assert!(!db.copy_sequence(copied, Some(21)).await.unwrap());
    assert_eq!(db.next_val(&name).unwrap(), 42);
    let db = f.reopen();
    assert!(db.next_val(&name).unwrap() > 42, "durable across a reopen");
}

/// Two propagators that each relay some of an origin's tables deliver a transaction
/// writing tables of both in two parts: the second is at the origin's high-water
/// already, and `apply_part` applies it with a log record of its own, marks unchanged.
async fn the_rest_of_a_transaction_that_came_in_parts_is_applied_at_its_high_water(f: Fixture) {
    let db = setup(&f).await;
    let second = QualName::bare("second");
    db.create_table(TableDef {
        name: second.clone(),
        ..counters()
    })
    .await
    .unwrap();
    let in_second = |mut c: RowChange| {
        c.table = second.clone();
        c
    };
    db.apply_replicated(vec![rtxn(ORIGIN, 4, vec![ins(1, 10)])])
        .await
        .unwrap();
    assert_eq!(
        db.tables_of(Gtid::new(ORIGIN, 4), 100).unwrap(),
        Some([t()].into())
    );
    assert_eq!(db.tables_of(Gtid::new(ORIGIN, 3), 100).unwrap(), None);
    // As a transaction, the rest is a duplicate.
    let rest = rtxn(ORIGIN, 4, vec![in_second(ins(7, 70))]);
    let info = db.apply_replicated(vec![rest.clone()]).await.unwrap();
    assert_eq!((info.applied, info.skipped), (0, 1));
    // As a part, it is applied.
    let info = db.apply_part(rest, false).await.unwrap();
    assert_eq!(info.applied, 1);
    assert_eq!(db.high_water(ORIGIN).unwrap(), 4);
    let scanned: Vec<Row> = db
        .scan(&second, KeyRange::all())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(scanned, vec![row(7, 70)]);
    assert_eq!(
        db.tables_of(Gtid::new(ORIGIN, 4), 100).unwrap(),
        Some([t(), second.clone()].into())
    );
    let gtids: Vec<Gtid> = txn_records(db).iter().map(|(_, _, t)| t.gtid).collect();
    assert_eq!(gtids, [Gtid::new(ORIGIN, 4), Gtid::new(ORIGIN, 4)]);
    // Only the newest transaction of the origin comes in parts.
    for seq in [3, 5] {
        let err = db
            .apply_part(rtxn(ORIGIN, seq, vec![in_second(ins(8, 80))]), false)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidBatch(_)), "{err}");
    }
    // After it, the origin goes on as before.
    db.apply_replicated(vec![rtxn(ORIGIN, 5, vec![ins(2, 20)])])
        .await
        .unwrap();
    assert_eq!(db.high_water(ORIGIN).unwrap(), 5);
    assert_eq!(rows(db), vec![row(1, 10), row(2, 20)]);
}
