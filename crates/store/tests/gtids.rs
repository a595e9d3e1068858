//! A Gtid names one transaction for ever, across crashes of the machine.
//!
//! A master's commits reach a receiver before they are durable (senders ship what a
//! flush wrote ahead of its sync), so a machine crash can lose commits a receiver
//! holds. The master must never give their seqs to other transactions. Here the
//! master's engine keeps, like a disk, only what was flushed plus a prefix of what was
//! written since; a "machine crash" reopens the master on that under another boot id
//! (or as a salvage), and random commits, flushes, shipments to a receiver and crashes
//! are checked: every Gtid ever handed out, and every Gtid the receiver holds, names
//! exactly one transaction.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use common::{col, opts};
use hawser_core::{DataType, Gtid, Lsn, NodeId, QualName, TableDef, Value};
use hawser_store::{
    ByteRange, Database, DbOptions, KvEngine, KvIter, LogEntry, MemEngine, ReplicatedTxn,
    StoreError, WriteBatch,
};
use parking_lot::Mutex;
use proptest::prelude::*;

type Ops = Vec<(Vec<u8>, Option<Vec<u8>>)>;
type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// An engine that forgets, at a simulated crash, what was not flushed: the disk holds
/// every flushed batch and a prefix of the ones written since. Reads are served by a
/// memory engine holding everything applied.
#[derive(Default)]
struct CrashEngine {
    live: MemEngine,
    /// What is on disk: the flushed state, and the batches written since, in order.
    disk: Mutex<(Map, Vec<Ops>)>,
    salvaged: Option<String>,
}

fn apply_ops(map: &mut Map, ops: &Ops) {
    for (k, v) in ops {
        match v {
            Some(v) => map.insert(k.clone(), v.clone()),
            None => map.remove(k),
        };
    }
}

impl CrashEngine {
    /// The engine a restart finds after a crash that kept `keep` of the batches
    /// written since the last flush.
    fn crashed(&self, keep: usize, salvaged: bool) -> CrashEngine {
        let disk = self.disk.lock();
        let mut map = disk.0.clone();
        for ops in disk.1.iter().take(keep) {
            apply_ops(&mut map, ops);
        }
        let live = MemEngine::new();
        let mut all = WriteBatch::new();
        for (k, v) in &map {
            all.put(k.clone(), v.clone());
        }
        live.apply(all).expect("a memory engine applies");
        CrashEngine {
            live,
            disk: Mutex::new((map, Vec::new())),
            salvaged: salvaged.then(|| "a damaged frame (simulated)".to_string()),
        }
    }

    fn unflushed(&self) -> usize {
        self.disk.lock().1.len()
    }
}

impl KvEngine for CrashEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.live.get(key)
    }

    fn scan(&self, range: ByteRange, reverse: bool) -> KvIter {
        self.live.scan(range, reverse)
    }

    fn apply(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let mut disk = self.disk.lock();
        disk.1.push(batch.ops().to_vec());
        self.live.apply(batch)
    }

    fn flush(&self) -> Result<(), StoreError> {
        let mut disk = self.disk.lock();
        let (map, pending) = &mut *disk;
        for ops in pending.drain(..) {
            apply_ops(map, &ops);
        }
        Ok(())
    }

    fn salvaged(&self) -> Option<String> {
        self.salvaged.clone()
    }
}

const MASTER: NodeId = NodeId(1);

fn table() -> TableDef {
    TableDef {
        name: QualName::bare("t"),
        columns: vec![
            col("k", DataType::BigInt, false),
            col("v", DataType::BigInt, false),
        ],
        primary_key: vec![0],
        explicit_key: true,
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Local commits on the master, each inserting one new key.
    Commit(u8),
    /// The master's engine flushes.
    Flush,
    /// The receiver applies what the master's log holds.
    Ship,
    /// The machine crashes: the disk kept this share (in percent) of the batches
    /// written since the last flush; the restart may be a salvage.
    MachineCrash { kept_percent: u8, salvage: bool },
    /// The process crashes: the kernel keeps everything written.
    ProcessCrash,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1u8..5).prop_map(Step::Commit),
        1 => Just(Step::Flush),
        2 => Just(Step::Ship),
        1 => (0u8..=100, any::<bool>())
            .prop_map(|(kept_percent, salvage)| Step::MachineCrash { kept_percent, salvage }),
        1 => Just(Step::ProcessCrash),
    ]
}

fn master_opts(boot: u32) -> DbOptions {
    DbOptions {
        node_id: MASTER,
        durable_commits: false,
        boot_id: Some(format!("boot-{boot}")),
        ..opts()
    }
}

/// The key a transaction of the log inserted.
fn key_of(entry: &LogEntry) -> Option<(Gtid, i64)> {
    let LogEntry::Txn(t) = entry else {
        return None;
    };
    let after = t.changes.first()?.after.as_ref()?;
    match after.first() {
        Some(Value::Int(k)) => Some((t.gtid, *k)),
        _ => None,
    }
}

/// Every transaction record of `db`'s log names the transaction `named` says it does.
fn check_log(db: &Database, named: &HashMap<Gtid, i64>, whose: &str) -> Result<(), String> {
    for r in db
        .log_range(Lsn(1), usize::MAX)
        .map_err(|e| e.to_string())?
    {
        if let Some((gtid, k)) = key_of(&r.entry) {
            match named.get(&gtid) {
                Some(&n) if n == k => {}
                other => {
                    return Err(format!(
                        "{whose} holds {gtid:?} inserting key {k}, but that Gtid was given \
                         to the transaction inserting {other:?}"
                    ))
                }
            }
        }
    }
    Ok(())
}

async fn run(steps: Vec<Step>) -> Result<(), String> {
    let err = |e: StoreError| e.to_string();
    let mut boot = 0;
    let mut engine = Arc::new(CrashEngine::default());
    let mut master =
        Database::open(engine.clone() as Arc<dyn KvEngine>, master_opts(boot)).map_err(err)?;
    master.create_table(table()).await.map_err(err)?;
    let receiver = Database::open(
        Arc::new(MemEngine::new()) as Arc<dyn KvEngine>,
        DbOptions::new(NodeId(2)),
    )
    .map_err(err)?;
    receiver.create_table(table()).await.map_err(err)?;
    // Every Gtid the master ever handed out, and the key its transaction inserted.
    let mut named: HashMap<Gtid, i64> = HashMap::new();
    let mut next_key = 0i64;
    for s in steps {
        match s {
            Step::Commit(n) => {
                for _ in 0..n {
                    next_key += 1;
                    let mut txn = master.begin();
                    txn.insert(&table().name, vec![Value::Int(next_key), Value::Int(0)])
                        .await
                        .map_err(err)?;
                    let info = txn.commit().await.map_err(err)?;
                    if let Some(before) = named.insert(info.gtid, next_key) {
                        return Err(format!(
                            "{:?} given twice: to the transaction inserting {before} and to \
                             the one inserting {next_key}",
                            info.gtid
                        ));
                    }
                }
            }
            Step::Flush => engine.flush().map_err(err)?,
            Step::Ship => {
                let from = receiver.high_water(MASTER).map_err(err)?;
                let run: Vec<ReplicatedTxn> = master
                    .log_range(Lsn(1), usize::MAX)
                    .map_err(err)?
                    .into_iter()
                    .filter_map(|r| match r.entry {
                        LogEntry::Txn(t) if t.gtid.seq > from => Some(ReplicatedTxn {
                            txn: t,
                            epoch: r.epoch,
                        }),
                        _ => None,
                    })
                    .collect();
                receiver.apply_replicated(run).await.map_err(err)?;
            }
            Step::MachineCrash {
                kept_percent,
                salvage,
            } => {
                drop(master);
                let keep = engine.unflushed() * kept_percent as usize / 100;
                engine = Arc::new(engine.crashed(keep, salvage));
                boot += u32::from(!salvage);
                master = Database::open(engine.clone() as Arc<dyn KvEngine>, master_opts(boot))
                    .map_err(err)?;
                check_log(&master, &named, "the restarted master")?;
            }
            Step::ProcessCrash => {
                drop(master);
                engine = Arc::new(engine.crashed(usize::MAX, false));
                master = Database::open(engine.clone() as Arc<dyn KvEngine>, master_opts(boot))
                    .map_err(err)?;
                check_log(&master, &named, "the restarted master")?;
            }
        }
    }
    check_log(&master, &named, "the master")?;
    check_log(&receiver, &named, "the receiver")?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_two_transactions_share_a_gtid_across_machine_crashes(
        steps in proptest::collection::vec(step(), 1..40)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcome = rt.block_on(run(steps));
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}

/// The case the property test would find first, spelled out: commits shipped before
/// their flush, lost with the machine, and the master writing on.
#[tokio::test]
async fn commits_lost_with_the_machine_keep_their_seqs() {
    run(vec![
        Step::Commit(3),
        Step::Flush,
        Step::Commit(2),
        Step::Ship,
        Step::MachineCrash {
            kept_percent: 0,
            salvage: false,
        },
        Step::Commit(3),
        Step::Ship,
    ])
    .await
    .unwrap();
}
