//! The receiver's choice between RTL net rows and log order, driven by hand over a
//! real tonic stream: each batch is sent and acknowledged before the next, so each is
//! one backlog and the choice is deterministic. The receiver's counters must say what
//! it did, and the subscriber must end with the master's rows either way.

mod common;

use common::id;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hawser_core::{ColumnDef, DataType, Epoch, Lsn, NodeId, QualName, Row, TableDef, Value};
use hawser_store::{Database, DbOptions, KeyRange, LogEntry};
use hawser_stream::codec::{encode_records, WireRecord};
use hawser_stream::pb::{self, receiver_message, sender_message};
use hawser_stream::{CompilePolicy, InboundStatus, ReceiverConfig, ReceiverService};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Server;

const DEADLINE: Duration = Duration::from_secs(20);
const KEYS: i64 = 5;
/// Exactly the default transaction threshold: the updates' batch is compiled.
const UPDATES: i64 = CompilePolicy::DEFAULT_MIN_TRANSACTIONS as i64;

fn tab() -> QualName {
    QualName::parse_unquoted("repl.tab")
}

fn tab_def() -> TableDef {
    let col = |n: &str, t: DataType, nullable: bool| ColumnDef {
        name: id(n),
        data_type: t,
        nullable,
        default: None,
    };
    TableDef {
        name: tab(),
        columns: vec![
            col("k", DataType::Integer, false),
            col("v", DataType::Integer, true),
        ],
        primary_key: vec![0],
        explicit_key: true,
    }
}

async fn open(node: u64) -> Result<Database> {
    let db = Database::open_memory(DbOptions::new(NodeId(node)))?;
    db.create_table(tab_def()).await?;
    Ok(db)
}

fn rows(db: &Database) -> Result<Vec<Row>> {
    Ok(db
        .scan(&tab(), KeyRange::all())?
        .collect::<Result<_, _>>()?)
}

/// A master with `KEYS` rows inserted one transaction each, then `UPDATES` single-row
/// updates cycling over them; returns it with its row transactions as two batches
/// (the inserts, the updates).
async fn master() -> Result<(Database, Vec<pb::Batch>)> {
    let db = open(1).await?;
    for k in 0..KEYS {
        let mut t = db.begin();
        t.insert(&tab(), vec![Value::Int(k), Value::Int(0)]).await?;
        t.commit().await?;
    }
    let inserted = db.last_lsn();
    for i in 0..UPDATES {
        let k = i % KEYS;
        let mut t = db.begin();
        t.update(&tab(), &[Value::Int(k)], vec![Value::Int(k), Value::Int(i)])
            .await?;
        t.commit().await?;
    }
    let records = db.log_range(Lsn(1), 100_000)?;
    let batch = |range: std::ops::RangeInclusive<Lsn>| {
        let wire: Vec<WireRecord> = records
            .iter()
            .filter(|r| range.contains(&r.lsn) && matches!(r.entry, LogEntry::Txn(_)))
            .map(|r| WireRecord {
                epoch: r.epoch,
                entry: r.entry.clone(),
            })
            .collect();
        let raw = encode_records(&wire);
        pb::Batch {
            through_lsn: range.end().0,
            count: wire.len() as u32,
            codec: pb::Codec::None as i32,
            raw_bytes: raw.len() as u64,
            payload: raw.into(),
            decided: 0,
            waiting: false,
            relayed: Vec::new(),
            chunk: None,
        }
    };
    let batches = vec![
        batch(Lsn(1)..=inserted),
        batch(inserted.next()..=db.last_lsn()),
    ];
    Ok((db, batches))
}

/// Serves a receiver for `sub` with `policy`, sends `batches` one by one (each waits
/// for its Ack) and returns the receiver's status of the stream.
async fn replicate(
    sub: &Database,
    policy: CompilePolicy,
    batches: Vec<pb::Batch>,
) -> Result<InboundStatus> {
    let mut config = ReceiverConfig::new(id("s1"));
    config.compile = policy;
    replicate_with(sub, config, common::hello(&tab_def()), batches).await
}

/// [`replicate`] with a receiver configured as `config` and the stream opened by
/// `hello`.
async fn replicate_with(
    sub: &Database,
    config: ReceiverConfig,
    hello: pb::Hello,
    batches: Vec<pb::Batch>,
) -> Result<InboundStatus> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let epochs = tokio::sync::watch::Sender::new(BTreeMap::from([(id("e"), Epoch(1))]));
    let service = ReceiverService::new(
        sub.clone(),
        config,
        epochs.subscribe(),
        tracker.clone(),
        shutdown.clone(),
    );
    let router = Server::builder().add_service(service.clone().into_server());
    let server = tokio::spawn(async move {
        let _ = router
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await;
    });
    let msg = |m: sender_message::Msg| pb::SenderMessage { msg: Some(m) };
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(msg(sender_message::Msg::Hello(hello))).await?;
    let mut client =
        pb::replication_client::ReplicationClient::connect(format!("http://{addr}")).await?;
    let mut inbound = client
        .replicate(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    for batch in batches {
        let through = batch.through_lsn;
        tx.send(msg(sender_message::Msg::Batch(batch))).await?;
        loop {
            let m = tokio::time::timeout(DEADLINE, inbound.message())
                .await?
                .context("stream")?
                .context("stream ended")?;
            match m.msg {
                Some(receiver_message::Msg::Ack(a)) if a.through_lsn >= through => break,
                Some(receiver_message::Msg::Refused(r)) => bail!("refused: {}", r.reason),
                _ => {}
            }
        }
    }
    let status = service.status().borrow().get(&id("master")).cloned();
    drop(tx);
    server.abort();
    let _ = server.await;
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    status.context("no inbound status for the master")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_at_the_transaction_threshold_is_compiled_a_small_one_is_not() -> Result<()> {
    let (master, batches) = master().await?;
    let sub = open(2).await?;
    let s = replicate(&sub, CompilePolicy::default(), batches).await?;
    assert_eq!(rows(&sub)?, rows(&master)?);
    // Five inserts (under the threshold) in log order; the threshold's worth of updates
    // compiled to five rows.
    assert_eq!((s.runs_in_order, s.runs_compiled), (1, 1), "{s:?}");
    assert_eq!(s.batches, 2);
    assert_eq!(s.transactions, (KEYS + UPDATES) as u64);
    assert_eq!(s.row_changes, (KEYS + UPDATES) as u64);
    assert_eq!(s.rows_written_compiled, KEYS as u64, "{s:?}");
    assert_eq!(s.rows_written, 2 * KEYS as u64, "{s:?}");
    assert_eq!(s.transactions_skipped, 0);
    assert_eq!(sub.high_water(NodeId(1))?, master.high_water(NodeId(1))?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_compilation_off_every_batch_goes_in_log_order() -> Result<()> {
    let (master, batches) = master().await?;
    let sub = open(2).await?;
    let off = ReceiverConfig {
        compile: CompilePolicy {
            enabled: false,
            ..CompilePolicy::default()
        },
        // One apply per batch (a paced apply writes a batch in slices).
        apply_slice: None,
        ..ReceiverConfig::new(id("s1"))
    };
    let s = replicate_with(&sub, off, common::hello(&tab_def()), batches).await?;
    assert_eq!(rows(&sub)?, rows(&master)?);
    assert_eq!((s.runs_in_order, s.runs_compiled), (2, 0), "{s:?}");
    assert_eq!(s.apply_pauses, 0, "{s:?}");
    assert_eq!(s.rows_written_compiled, 0);
    assert_eq!(s.row_changes, (KEYS + UPDATES) as u64);
    // The store's log-order apply writes each key once per apply too: inside one
    // batch the modes write the same rows; compilation gains across batches.
    assert_eq!(s.rows_written, 2 * KEYS as u64, "{s:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_apply_pauses_between_slices_and_writes_what_one_apply_would() -> Result<()> {
    let (origin, batches) = master().await?;
    let sub = open(2).await?;
    // Every chance to pause is taken: one between each slice of four row changes.
    let paced = || ReceiverConfig {
        compile: CompilePolicy {
            enabled: false,
            ..CompilePolicy::default()
        },
        apply_slice: Some(Duration::ZERO),
        ..ReceiverConfig::new(id("s1"))
    };
    // Paced: no return service waits on the stream.
    let lazy = || pb::Hello {
        returns_wait: false,
        ..common::hello(&tab_def())
    };
    let s = replicate_with(&sub, paced(), lazy(), batches).await?;
    assert_eq!(rows(&sub)?, rows(&origin)?);
    assert_eq!(sub.high_water(NodeId(1))?, origin.high_water(NodeId(1))?);
    assert_eq!((s.runs_in_order, s.runs_compiled), (2, 0), "{s:?}");
    assert_eq!(s.transactions, (KEYS + UPDATES) as u64);
    assert_eq!(s.transactions_skipped, 0);
    // Five inserts: slices of four and one; the updates: a slice per four of them.
    let slices = 2 + (UPDATES as u64).div_ceil(4);
    assert!(s.apply_pauses >= slices - 2, "{s:?}");
    // A resend is found here whole, paced or not.
    let (_, again) = master().await?;
    let s = replicate_with(&sub, paced(), lazy(), again).await?;
    assert_eq!(s.transactions_skipped, (KEYS + UPDATES) as u64, "{s:?}");
    assert_eq!(rows(&sub)?, rows(&origin)?);
    // A stream a return service waits on is never paced.
    let (_, again) = master().await?;
    let s = replicate_with(&sub, paced(), common::hello(&tab_def()), again).await?;
    assert_eq!(s.apply_pauses, 0, "{s:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_threshold_alone_makes_a_backlog_compile() -> Result<()> {
    let (master, batches) = master().await?;
    let sub = open(2).await?;
    let by_bytes = CompilePolicy {
        enabled: true,
        min_transactions: u64::MAX,
        min_bytes: 1,
    };
    let s = replicate(&sub, by_bytes, batches).await?;
    assert_eq!(rows(&sub)?, rows(&master)?);
    assert_eq!((s.runs_in_order, s.runs_compiled), (0, 2), "{s:?}");
    assert_eq!(s.rows_written_compiled, s.rows_written);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_received_twice_writes_nothing() -> Result<()> {
    let (master, batches) = master().await?;
    let sub = open(2).await?;
    let again = batches.clone();
    replicate(&sub, CompilePolicy::default(), batches).await?;
    let before = sub.last_lsn();
    // A new stream (as after a reconnect) re-sends everything: nothing is applied again.
    let s = replicate(&sub, CompilePolicy::default(), again).await?;
    assert_eq!(sub.last_lsn(), before);
    assert_eq!(rows(&sub)?, rows(&master)?);
    assert_eq!(s.transactions_skipped, (KEYS + UPDATES) as u64, "{s:?}");
    assert_eq!(s.rows_written, 0, "{s:?}");
    Ok(())
}
