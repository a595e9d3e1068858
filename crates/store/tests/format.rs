//! A data directory of another format, or with corrupt bytes, is refused with a clear
//! error and left untouched.

mod common;

use std::sync::Arc;

use common::{accounts, accounts_name, opts};
use hawser_core::Value;
use hawser_store::{
    Database, Diverged, KvEngine, MemEngine, RestartCheck, RestartEvidence, WriteBatch,
};

fn engine_with(pairs: &[(&[u8], &[u8])]) -> Arc<MemEngine> {
    let engine = Arc::new(MemEngine::new());
    let mut b = WriteBatch::new();
    for (k, v) in pairs {
        b.put(k.to_vec(), v.to_vec());
    }
    engine.apply(b).unwrap();
    engine
}

/// Commits one account row per key of `keys`, one transaction each.
async fn insert_accounts(db: &Database, keys: std::ops::RangeInclusive<i64>) {
    for k in keys {
        let mut txn = db.begin();
        txn.insert(
            &accounts_name(),
            vec![Value::Int(k), Value::Text("x".into()), Value::Null],
        )
        .await
        .unwrap();
        txn.commit().await.unwrap();
    }
}

fn open(engine: &Arc<MemEngine>) -> Result<Database, hawser_store::StoreError> {
    Database::open(engine.clone() as Arc<dyn KvEngine>, opts())
}

#[test]
fn format_1_to_3_stores_are_upgraded_and_keep_their_high_water_marks() {
    // Format 1 wrote the high-water keys with every commit; formats 2 and later read
    // them as the marks of released log and raise them with the log they hold. Format 3
    // moved the log keys out of sled, which changes nothing for a store in memory;
    // format 4 may add a commit time after the seq, which older values lack.
    for old in [1u32, 2, 3] {
        let mut marker = b"hawser-store".to_vec();
        marker.extend_from_slice(&old.to_be_bytes());
        let mut hw = vec![b'H'];
        hw.extend_from_slice(&77u64.to_be_bytes());
        let engine = engine_with(&[(b"Fformat", &marker), (&hw, &5u64.to_be_bytes())]);
        let db = open(&engine).unwrap();
        assert_eq!(db.high_water(hawser_core::NodeId(77)).unwrap(), 5);
        let mut upgraded = b"hawser-store".to_vec();
        upgraded.extend_from_slice(&hawser_store::layout::FORMAT_VERSION.to_be_bytes());
        assert_eq!(
            engine.get(b"Fformat").unwrap(),
            Some(upgraded),
            "from {old}"
        );
    }
}

#[test]
fn a_high_water_value_of_another_length_is_reported_with_its_key() {
    let mut hw = vec![b'H'];
    hw.extend_from_slice(&77u64.to_be_bytes());
    let mut marker = b"hawser-store".to_vec();
    marker.extend_from_slice(&hawser_store::layout::FORMAT_VERSION.to_be_bytes());
    let engine = engine_with(&[(b"Fformat", &marker), (&hw, &[0u8; 12])]);
    let err = open(&engine).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("8 or 16 bytes, found 12"), "{msg}");
    assert!(msg.contains("H\\x00"), "names the key: {msg}");
}

#[test]
fn a_newer_format_is_refused_and_not_rewritten() {
    let mut marker = b"hawser-store".to_vec();
    marker.extend_from_slice(&99u32.to_be_bytes());
    let engine = engine_with(&[(b"Fformat", &marker)]);
    let err = open(&engine).unwrap_err();
    assert_eq!(err.code(), "XX001");
    assert!(err.to_string().contains("newer hawser"), "{err}");
    assert!(err.to_string().contains("99"), "{err}");
    assert_eq!(engine.get(b"Fformat").unwrap(), Some(marker));
}

#[test]
fn foreign_data_without_a_marker_is_refused() {
    let engine = engine_with(&[(b"something", b"else")]);
    let err = open(&engine).unwrap_err();
    assert!(err.to_string().contains("no hawser format marker"), "{err}");
    assert_eq!(engine.get(b"Fformat").unwrap(), None, "nothing written");
    let engine = engine_with(&[(b"Fformat", b"sqlite 3")]);
    assert!(open(&engine).is_err());
}

#[tokio::test]
async fn a_corrupt_row_is_reported_with_its_key() {
    let engine = Arc::new(MemEngine::new());
    let db = open(&engine).unwrap();
    db.create_table(accounts()).await.unwrap();
    let mut txn = db.begin();
    txn.insert(&accounts_name(), common::account(1, "ann", "1"))
        .await
        .unwrap();
    txn.commit().await.unwrap();
    // Overwrite the row's value with garbage.
    let row_key = engine
        .scan(
            (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded),
            false,
        )
        .map(|kv| kv.unwrap().0)
        .find(|k| k.first() == Some(&b'R'))
        .unwrap();
    let mut b = WriteBatch::new();
    b.put(row_key, vec![1, 2, 3]);
    engine.apply(b).unwrap();
    let err = db.get(&accounts_name(), &[Value::Int(1)]).unwrap_err();
    assert_eq!(err.code(), "XX001");
    assert!(err.to_string().contains("data corrupted at key R"), "{err}");
    // A corrupt catalog entry stops the open instead of dropping the table silently.
    let mut b = WriteBatch::new();
    b.put(vec![b'T', 0, 0, 0, 0, 0, 0, 0, 1], vec![9; 5]);
    engine.apply(b).unwrap();
    drop(db);
    assert_eq!(open(&engine).unwrap_err().code(), "XX001");
}

#[tokio::test]
async fn a_store_opened_after_another_boot_says_so_and_paused_writes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let under = |boot: &str| {
        let mut o = opts();
        o.boot_id = Some(boot.to_string());
        o
    };
    // First open: nothing shipped before, nothing to fear.
    let db = Database::open_sled(dir.path(), under("boot-a")).unwrap();
    assert!(!db.machine_restarted());
    db.create_table(accounts()).await.unwrap();
    drop(db);
    let reopen = |boot: &str| {
        let engine = hawser_store::SledEngine::open(dir.path()).unwrap();
        Database::open(Arc::new(engine), under(boot)).unwrap()
    };
    // The process restarted, the machine did not.
    let db = reopen("boot-a");
    assert!(!db.machine_restarted());
    drop(db);
    // The machine restarted; and the new boot is recorded for the next open.
    let db = reopen("boot-b");
    assert!(db.machine_restarted());
    drop(db);
    let db = reopen("boot-b");
    assert!(!db.machine_restarted());

    // Paused: this node's own commits are refused (57P03, retryable), nothing lands.
    let insert_ann = |db: &Database| {
        let db = db.clone();
        async move {
            let mut txn = db.begin();
            txn.insert(
                &accounts_name(),
                vec![Value::Int(1), Value::Text("ann".into()), Value::Null],
            )
            .await
            .unwrap();
            txn.commit().await
        }
    };
    db.pause_writes(Some("waiting for the subscribers".into()));
    let err = insert_ann(&db).await.unwrap_err();
    assert_eq!(err.code(), "57P03");
    assert!(err.is_retryable());
    assert!(
        err.to_string().contains("waiting for the subscribers"),
        "{err}"
    );
    assert_eq!(
        db.writes_paused().as_deref(),
        Some("waiting for the subscribers")
    );
    let before = db.last_lsn();
    db.pause_writes(None);
    insert_ann(&db).await.unwrap();
    assert_eq!(db.last_lsn(), before.next());
}

/// The point a machine restart leaves (this node's last own seq then) outlives restarts
/// of the process until the node takes writes again, and a receiver is checked against
/// it once: holding no more of this node's commits than the point, it is recorded and
/// passes from then on; holding more, it is recorded as diverged, and stays so across
/// later machine restarts until a store with another node id answers under its name.
#[tokio::test]
async fn a_machine_restart_point_outlives_process_restarts_and_checks_each_receiver_once() {
    let dir = tempfile::tempdir().unwrap();
    let reopen = |boot: &str| {
        let mut o = opts();
        o.boot_id = Some(boot.to_string());
        Database::open_sled(dir.path(), o).unwrap()
    };
    let db = reopen("boot-a");
    assert_eq!(db.restart_point(), None);
    assert!(!db.restart_fence_pending());
    db.create_table(accounts()).await.unwrap();
    insert_accounts(&db, 1..=2).await;
    let ours = db.high_water(db.node_id()).unwrap();
    assert_eq!(ours, 3, "a table and two rows");
    let check = |db: &Database, receiver: &str, node: u64, holds: u64| {
        db.check_receiver_after_restart(receiver, node, holds, &RestartEvidence::default())
            .unwrap()
    };
    // Nothing to check against without a machine restart.
    assert_eq!(check(&db, "ds2", 2, ours + 5), RestartCheck::Admitted);
    drop(db);

    let db = reopen("boot-b");
    assert!(db.machine_restarted() && db.restart_fence_pending());
    let point = db.restart_point().unwrap();
    assert_eq!((point.seq, point.lifted), (ours, false));
    assert_eq!(check(&db, "ds2", 2, ours), RestartCheck::Admitted);
    assert_eq!(
        check(&db, "ds2", 2, ours + 9),
        RestartCheck::Admitted,
        "checked once, ds2 gets this node's new commits"
    );
    let lost = Diverged {
        node: 3,
        holds: ours + 1,
        seq: ours,
    };
    assert_eq!(check(&db, "ds3", 3, ours + 1), RestartCheck::Diverged(lost));
    assert_eq!(
        check(&db, "ds3", 3, 0),
        RestartCheck::Diverged(lost),
        "diverged for good"
    );
    drop(db);

    // A restart of the process alone: still fenced, ds2 still checked, ds3 diverged.
    let db = reopen("boot-b");
    assert!(!db.machine_restarted() && db.restart_fence_pending());
    assert!(db.restart_point().unwrap().checked.contains("ds2"));
    assert_eq!(check(&db, "ds3", 3, ours + 1), RestartCheck::Diverged(lost));
    db.lift_restart_fence().unwrap();
    drop(db);
    let db = reopen("boot-b");
    assert!(!db.restart_fence_pending());
    drop(db);

    // The next machine restart starts over from the seq of then, but ds3 — whose seqs
    // this node has reused since — stays diverged until it is a new store.
    let db = reopen("boot-c");
    let point = db.restart_point().unwrap();
    assert_eq!(
        (point.seq, point.lifted, point.checked.len()),
        (ours, false, 0)
    );
    assert_eq!(check(&db, "ds3", 3, ours), RestartCheck::Diverged(lost));
    assert_eq!(
        check(&db, "ds3", 33, 0),
        RestartCheck::Admitted,
        "rebuilt: another node id"
    );
    assert!(db.restart_point().unwrap().diverged.is_empty());
}

/// A receiver found holding more of this node's origin than it has committed (no
/// machine restart involved: a copy put back, say) stays refused across restarts of
/// the process, even once this node's seqs have passed what it holds, until a store
/// with another node id answers under its name; that, too, is kept.
#[tokio::test]
async fn a_receiver_found_ahead_stays_refused_across_restarts_until_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let reopen = || {
        let mut o = opts();
        o.boot_id = Some("one boot".to_string());
        Database::open_sled(dir.path(), o).unwrap()
    };
    let db = reopen();
    db.create_table(accounts()).await.unwrap();
    let ours = db.high_water(db.node_id()).unwrap();
    assert_eq!(ours, 1);
    assert_eq!(
        db.check_receiver_ahead("ds2", 2, ours).unwrap(),
        RestartCheck::Admitted
    );
    let ahead = Diverged {
        node: 3,
        holds: 4,
        seq: ours,
    };
    assert_eq!(
        db.check_receiver_ahead("ds3", 3, 4).unwrap(),
        RestartCheck::Diverged(ahead)
    );
    drop(db);

    // Restarted, this node commits past what ds3 holds: ds3 would skip those commits.
    let db = reopen();
    insert_accounts(&db, 1..=5).await;
    assert!(db.high_water(db.node_id()).unwrap() > 4);
    assert_eq!(
        db.check_receiver_ahead("ds3", 3, 4).unwrap(),
        RestartCheck::Diverged(ahead),
        "refused for good"
    );
    assert_eq!(
        db.check_receiver_ahead("ds2", 2, 6).unwrap(),
        RestartCheck::Admitted
    );
    // Rebuilt under the same name: another node id, holding nothing yet.
    assert_eq!(
        db.check_receiver_ahead("ds3", 33, 0).unwrap(),
        RestartCheck::Admitted
    );
    drop(db);
    let db = reopen();
    assert_eq!(
        db.check_receiver_ahead("ds3", 33, 2).unwrap(),
        RestartCheck::Admitted,
        "the rebuilt store stays admitted"
    );
    assert_eq!(db.restart_point(), None, "no machine restart");
}
