//! Large transactions on the data plane (issue #50, items 4 and 6): a subscriber behind
//! on them catches up, one larger than a message goes in chunks and is applied whole
//! or not at all, a message the receiver cannot take is refused with the sizes, and a
//! sender follows a receiver's restart within a few hundred milliseconds, and one whose
//! link stalls mid-transaction gives it up and sends the transaction again.
//!
//! Real tonic receivers on 127.0.0.1:0, in-memory databases. Every wait is on a
//! condition with a deadline.

mod common;

use common::{id, Senders};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hawser_core::{ColumnDef, DataType, Epoch, Lsn, NodeId, QualName, Row, TableDef, Value};
use hawser_scheme::ast::TableDefinitionChecking;
use hawser_store::{Database, DbOptions, KeyRange};
use hawser_stream::codec::{compress, encode_records, WireRecord};
use hawser_stream::pb::{self, receiver_message, sender_message};
use hawser_stream::{
    chunks, Compression, LinkConfig, ReceiverConfig, ReceiverService, SenderHandle, SenderState,
    SenderStatus, SenderTuning,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::{Endpoint, Server};

/// Long enough for 80 MiB through a debug build on a busy 2-core machine.
const DEADLINE: Duration = Duration::from_secs(120);

const MIB: usize = 1024 * 1024;

/// The row: one value of 40,000 characters.
const ROW_CHARS: usize = 40_000;

fn big() -> QualName {
    QualName::parse_unquoted("repl.big")
}

fn big_def() -> TableDef {
    let col = |n: &str, t: DataType, nullable: bool| ColumnDef {
        name: id(n),
        data_type: t,
        nullable,
        default: None,
    };
    TableDef {
        name: big(),
        columns: vec![
            col("k", DataType::Integer, false),
            col("v", DataType::Varchar(1_000_000), true),
        ],
        primary_key: vec![0],
        explicit_key: true,
    }
}

async fn open(node: u64) -> Result<Database> {
    let db = Database::open_memory(DbOptions::new(NodeId(node)))?;
    db.create_table(big_def()).await?;
    Ok(db)
}

/// `len` characters no compressor shrinks much (alphanumeric, from a xorshift seeded by
/// `seed`): what gets through lz4 is about as large as what goes in.
fn noise(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// Commits `txns` transactions of `rows` rows of [`ROW_CHARS`] characters each, keys
/// from `first` on.
async fn commit_large(db: &Database, first: i64, txns: usize, rows: usize) -> Result<()> {
    let mut k = first;
    for _ in 0..txns {
        let mut t = db.begin();
        for _ in 0..rows {
            t.insert(
                &big(),
                vec![Value::Int(k), Value::Text(noise(k as u64, ROW_CHARS))],
            )
            .await?;
            k += 1;
        }
        t.commit().await?;
    }
    Ok(())
}

fn rows(db: &Database) -> Result<Vec<Row>> {
    Ok(db
        .scan(&big(), KeyRange::all())?
        .collect::<Result<_, _>>()?)
}

/// A receiver served on its own port until `stop`.
struct Receiver {
    addr: SocketAddr,
    server: JoinHandle<()>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    service: ReceiverService,
}

impl Receiver {
    async fn start(
        db: &Database,
        config: ReceiverConfig,
        addr: Option<SocketAddr>,
    ) -> Result<Self> {
        Self::start_serving(db, config, addr, |s| s).await
    }

    /// A receiver whose tonic service `serve` may change (a lower decoding limit than
    /// its config says, to play an older or misconfigured node).
    async fn start_serving(
        db: &Database,
        config: ReceiverConfig,
        addr: Option<SocketAddr>,
        serve: impl FnOnce(
            pb::replication_server::ReplicationServer<ReceiverService>,
        ) -> pb::replication_server::ReplicationServer<ReceiverService>,
    ) -> Result<Self> {
        let listener = TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap()))
            .await
            .context("bind receiver")?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let epochs = watch::channel(BTreeMap::from([(id("e"), Epoch(1))])).1;
        let service = ReceiverService::new(
            db.clone(),
            config,
            epochs,
            tracker.clone(),
            shutdown.clone(),
        );
        let router = Server::builder().add_service(serve(service.clone().into_server()));
        let server = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        Ok(Self {
            addr,
            server,
            shutdown,
            tracker,
            service,
        })
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::from_shared(format!("http://{}", self.addr)).unwrap()
    }

    async fn stop(self) -> SocketAddr {
        self.server.abort();
        let _ = self.server.await;
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        self.addr
    }
}

fn link(codec: Compression, tuning: SenderTuning) -> LinkConfig {
    LinkConfig {
        sender_node: NodeId(1),
        sender_store: id("master"),
        receiver_store: id("s1"),
        receiver_node: NodeId(2),
        scheme_version: 1,
        elements: BTreeMap::from([(id("e"), Epoch(1))]),
        tables: BTreeMap::from([((big(), NodeId(1)), id("e"))]),
        sequences: BTreeMap::new(),
        replicate_ddl: false,
        returns_wait: false,
        datastore: Vec::new(),
        compression: codec,
        table_check: TableDefinitionChecking::Exact,
        tuning,
        siblings: Vec::new(),
        blind: Default::default(),
        upstream: Default::default(),
        feeds_relay: false,
        read_by_siblings: false,
        parts: Default::default(),
        forked: Default::default(),
    }
}

async fn wait_status(
    handle: &SenderHandle,
    what: &str,
    cond: impl FnMut(&SenderStatus) -> bool,
) -> Result<SenderStatus> {
    common::wait_status_within(handle, what, DEADLINE, cond).await
}

/// Waits until the receiver has acknowledged every commit of the master, durably.
async fn caught_up(handle: &SenderHandle, master: &Database) -> Result<SenderStatus> {
    let own = master.high_water(master.node_id())?;
    wait_status(handle, "the receiver to catch up", |s| {
        s.acked_durable.get(&master.node_id()).copied().unwrap_or(0) >= own
    })
    .await
}

/// A subscriber behind on `txns` transactions of about `txn_bytes` each (rows of
/// 40,000 characters) catches up in one session and ends with the master's rows.
async fn behind_on(txn_bytes: usize, txns: usize, codec: Compression) -> Result<()> {
    let master = open(1).await?;
    let sub = open(2).await?;
    commit_large(&master, 0, txns, (txn_bytes / ROW_CHARS).max(1)).await?;
    let r = Receiver::start(&sub, ReceiverConfig::new(id("s1")), None).await?;
    let senders = Senders::default();
    let started = Instant::now();
    let h = senders.spawn(link(codec, SenderTuning::default()), &master, r.endpoint());
    let st = caught_up(&h, &master).await?;
    let took = started.elapsed();
    eprintln!(
        "{txns} transactions of {} KiB ({codec:?}): caught up in {took:?}, {} batches, {} \
         wire bytes, {} sessions",
        txn_bytes / 1024,
        st.batches_sent,
        st.wire_bytes,
        st.sessions
    );
    assert_eq!(rows(&sub)?, rows(&master)?);
    // Not one reconnection: no message was refused, no session broke.
    assert_eq!(st.sessions, 1, "{st:?}");
    assert_eq!(st.state, SenderState::Streaming);
    assert_eq!(st.last_error, None);
    assert_eq!(
        r.service
            .status()
            .borrow()
            .get(&id("master"))
            .and_then(|s| s.refused.clone()),
        None
    );
    senders.stop().await;
    r.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_behind_on_1_mib_transactions_catches_up() -> Result<()> {
    behind_on(MIB, 24, Compression::None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_behind_on_10_mib_transactions_catches_up() -> Result<()> {
    behind_on(10 * MIB, 3, Compression::Lz4).await
}

/// Larger than the receiver's whole message limit (16 MiB): in chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_behind_on_40_mib_transactions_catches_up() -> Result<()> {
    behind_on(40 * MIB, 2, Compression::None).await
}

/// The case: paused behind 25 MiB of one-row commits of 40,000 characters. The
/// sender counted 12 bytes a value whatever its length, so 512 of them (20 MB) went in
/// one message, past the receiver's 16 MiB: nothing was applied, ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_behind_on_25_mib_of_one_row_commits_of_40000_characters_catches_up(
) -> Result<()> {
    behind_on(ROW_CHARS, 25 * MIB / ROW_CHARS, Compression::None).await
}

/// A receiver that reads small messages says so, and the sender keeps to it: every
/// transaction here is larger than one of its messages, and each goes in chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_with_a_small_message_limit_gets_its_transactions_in_chunks() -> Result<()> {
    let master = open(1).await?;
    let sub = open(2).await?;
    commit_large(&master, 0, 6, 5).await?;
    let config = ReceiverConfig {
        max_message_bytes: 64 * 1024,
        ..ReceiverConfig::new(id("s1"))
    };
    let r = Receiver::start(&sub, config, None).await?;
    let senders = Senders::default();
    let h = senders.spawn(
        link(Compression::Zstd, SenderTuning::default()),
        &master,
        r.endpoint(),
    );
    // More commits while it streams: the current path (the log's in-memory tail) too.
    commit_large(&master, 100, 4, 3).await?;
    h.wake();
    let st = caught_up(&h, &master).await?;
    assert_eq!(rows(&sub)?, rows(&master)?);
    assert_eq!(st.sessions, 1, "{st:?}");
    senders.stop().await;
    r.stop().await;
    Ok(())
}

/// The batch of the master's log records in `lsns`, uncompressed (or with `codec`).
fn batch_of(
    db: &Database,
    lsns: std::ops::RangeInclusive<Lsn>,
    codec: Compression,
) -> Result<pb::Batch> {
    let records: Vec<WireRecord> = db
        .log_range(*lsns.start(), 100)?
        .into_iter()
        .filter(|r| r.lsn <= *lsns.end() && matches!(r.entry, hawser_store::LogEntry::Txn(_)))
        .map(|r| WireRecord {
            epoch: r.epoch,
            entry: r.entry,
        })
        .collect();
    let raw = encode_records(&records);
    Ok(pb::Batch {
        through_lsn: lsns.end().0,
        count: records.len() as u32,
        codec: codec_pb(codec) as i32,
        raw_bytes: raw.len() as u64,
        payload: compress(codec, raw).into(),
        decided: 0,
        waiting: false,
        relayed: Vec::new(),
        chunk: None,
    })
}

fn codec_pb(c: Compression) -> pb::Codec {
    match c {
        Compression::None => pb::Codec::None,
        Compression::Lz4 => pb::Codec::Lz4,
        Compression::Zstd => pb::Codec::Zstd,
    }
}

/// A stream driven by hand.
struct ByHand {
    tx: tokio::sync::mpsc::Sender<pb::SenderMessage>,
    inbound: tonic::Streaming<pb::ReceiverMessage>,
}

impl ByHand {
    async fn open(r: &Receiver) -> Result<ByHand> {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tx.send(pb::SenderMessage {
            msg: Some(sender_message::Msg::Hello(pb::Hello {
                returns_wait: true,
                ..common::hello(&big_def())
            })),
        })
        .await?;
        let mut client =
            pb::replication_client::ReplicationClient::connect(format!("http://{}", r.addr))
                .await?;
        let mut inbound = client
            .replicate(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        match inbound.message().await?.and_then(|m| m.msg) {
            Some(receiver_message::Msg::HelloReply(_)) => {}
            other => bail!("expected HelloReply, got {other:?}"),
        }
        Ok(ByHand { tx, inbound })
    }

    async fn send(&self, batch: pb::Batch) -> Result<()> {
        self.tx
            .send(pb::SenderMessage {
                msg: Some(sender_message::Msg::Batch(batch)),
            })
            .await
            .context("the stream is closed")
    }

    /// The next ack through `through`, or the refusal's reason as an error.
    async fn ack_through(&mut self, through: u64) -> Result<pb::Ack> {
        loop {
            let m = tokio::time::timeout(DEADLINE, self.inbound.message())
                .await?
                .context("stream")?
                .context("stream ended")?;
            match m.msg {
                Some(receiver_message::Msg::Ack(a)) if a.through_lsn >= through => return Ok(a),
                Some(receiver_message::Msg::Refused(r)) => bail!("refused: {}", r.reason),
                _ => {}
            }
        }
    }
}

/// Waits until the receiver has no stream from the master connected.
async fn disconnected(r: &Receiver) -> Result<()> {
    let mut status = r.service.status();
    tokio::time::timeout(
        DEADLINE,
        status.wait_for(|m| m.get(&id("master")).is_some_and(|s| !s.connected)),
    )
    .await
    .context("the receiver to see the stream end")??;
    Ok(())
}

/// A stream broken between two chunks of a transaction leaves nothing of it applied;
/// the same transaction sent whole in a later stream is applied, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_broken_mid_transaction_applies_nothing_of_it() -> Result<()> {
    let master = open(1).await?;
    let sub = open(2).await?;
    // One small transaction, then one of 3 MiB.
    commit_large(&master, 0, 1, 1).await?;
    let small = master.last_lsn();
    commit_large(&master, 10, 1, 3 * MIB / ROW_CHARS).await?;
    let large = master.last_lsn();
    let r = Receiver::start(&sub, ReceiverConfig::new(id("s1")), None).await?;

    let mut stream = ByHand::open(&r).await?;
    stream
        .send(batch_of(&master, Lsn(1)..=small, Compression::None)?)
        .await?;
    stream.ack_through(small.0).await?;
    let before = (rows(&sub)?, sub.last_lsn(), sub.high_water(NodeId(1))?);
    assert_eq!(before.0.len(), 1);
    let chunks = chunks::split(
        batch_of(&master, Lsn(small.0 + 1)..=large, Compression::Lz4)?,
        MIB,
    );
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    // All but the last, then the stream breaks.
    for c in &chunks[..chunks.len() - 1] {
        stream.send(c.clone()).await?;
    }
    drop(stream);
    disconnected(&r).await?;
    assert_eq!(
        (rows(&sub)?, sub.last_lsn(), sub.high_water(NodeId(1))?),
        before,
        "nothing of the transaction whose last chunk never came"
    );

    // Again in a new stream, whole this time: applied, every row.
    let mut stream = ByHand::open(&r).await?;
    for c in &chunks {
        stream.send(c.clone()).await?;
    }
    let ack = stream.ack_through(large.0).await?;
    assert_eq!(rows(&sub)?, rows(&master)?);
    assert!(
        ack.applied.contains(&pb::OriginMark {
            origin: 1,
            seq: master.high_water(NodeId(1))?
        }),
        "{ack:?}"
    );
    drop(stream);
    r.stop().await;
    Ok(())
}

/// A receiver refuses, at its first chunk and with the sizes, a transaction larger than
/// it takes; nothing of it is applied, and the sender's status says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_past_the_receivers_bound_is_refused_with_the_sizes() -> Result<()> {
    let master = open(1).await?;
    let sub = open(2).await?;
    commit_large(&master, 0, 1, 2).await?;
    commit_large(&master, 10, 1, 2 * MIB / ROW_CHARS).await?;
    let config = ReceiverConfig {
        max_message_bytes: 256 * 1024,
        max_transaction_bytes: MIB as u64,
        ..ReceiverConfig::new(id("s1"))
    };
    let r = Receiver::start(&sub, config, None).await?;
    let senders = Senders::default();
    let h = senders.spawn(
        link(Compression::None, SenderTuning::default()),
        &master,
        r.endpoint(),
    );
    let st = wait_status(&h, "a refusal", |s| {
        matches!(s.state, SenderState::Refused { .. })
    })
    .await?;
    let SenderState::Refused { reason } = &st.state else {
        unreachable!()
    };
    assert!(
        reason.contains("past the 1048576 bytes this receiver takes"),
        "{reason}"
    );
    assert_eq!(
        st.last_error.as_deref(),
        Some(&*format!("refused by the receiver: {reason}"))
    );
    let refused = r
        .service
        .status()
        .borrow()
        .get(&id("master"))
        .and_then(|s| s.refused.clone());
    assert_eq!(refused.as_deref(), Some(reason.as_str()));
    // The small transaction before it went through; the large one not at all.
    assert_eq!(rows(&sub)?.len(), 2);
    senders.stop().await;
    r.stop().await;
    Ok(())
}

/// A message larger than the receiver's gRPC limit — what an older sender sent — is
/// refused with the sizes, not dropped with the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_past_the_receivers_limit_is_refused_with_the_sizes() -> Result<()> {
    let master = open(1).await?;
    let sub = open(2).await?;
    commit_large(&master, 0, 1, 2 * MIB / ROW_CHARS).await?;
    let config = ReceiverConfig {
        max_message_bytes: MIB,
        ..ReceiverConfig::new(id("s1"))
    };
    let r = Receiver::start(&sub, config, None).await?;
    let mut stream = ByHand::open(&r).await?;
    let whole = batch_of(&master, Lsn(1)..=master.last_lsn(), Compression::None)?;
    stream.send(whole.clone()).await?;
    let refused = stream
        .ack_through(whole.through_lsn)
        .await
        .expect_err("refused");
    let reason = refused.to_string();
    assert!(
        reason.contains("decoded message length too large")
            && reason.contains("the limit is: 1048576 bytes"),
        "{reason}"
    );
    assert!(rows(&sub)?.is_empty());
    drop(stream);

    // A sender whose receiver reads less than it says (a misconfigured node): its
    // status names the refusal, and it backs off rather than cycling fast.
    // Another store s1 the link addresses (node 2, as the link registers it).
    let sub2 = open(2).await?;
    let r2 = Receiver::start_serving(&sub2, ReceiverConfig::new(id("s1")), None, |s| {
        s.max_decoding_message_size(MIB)
    })
    .await?;
    let senders = Senders::default();
    let h = senders.spawn(
        link(Compression::None, SenderTuning::default()),
        &master,
        r2.endpoint(),
    );
    let st = wait_status(&h, "a refusal", |s| {
        matches!(s.state, SenderState::Refused { .. })
    })
    .await?;
    assert!(
        st.last_error
            .as_deref()
            .is_some_and(|e| e.contains("decoded message length too large")),
        "{st:?}"
    );
    senders.stop().await;
    r2.stop().await;
    r.stop().await;
    Ok(())
}

/// A receiver that restarts is streamed to again within a few hundred milliseconds of
/// its start, however long it was down: the wait after a refused connection grows to
/// 250 ms, not 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_follows_a_receivers_restart_within_a_few_hundred_ms() -> Result<()> {
    let master = open(1).await?;
    let sub = open(2).await?;
    commit_large(&master, 0, 1, 1).await?;
    let r = Receiver::start(&sub, ReceiverConfig::new(id("s1")), None).await?;
    let senders = Senders::default();
    // The default backoff, which this test is about.
    let h = senders.spawn(
        link(Compression::None, SenderTuning::default()),
        &master,
        r.endpoint(),
    );
    let st = caught_up(&h, &master).await?;
    let addr = r.stop().await;
    // Down through ten failed attempts: with waits doubling to 5 s, the next attempt
    // would be seconds away.
    let sessions = st.sessions + 10;
    wait_status(&h, "ten failed attempts", |s| {
        s.sessions >= sessions && matches!(s.state, SenderState::Backoff { .. })
    })
    .await?;
    let restarted = Instant::now();
    let r = Receiver::start(&sub, ReceiverConfig::new(id("s1")), Some(addr)).await?;
    wait_status(&h, "streaming again", |s| s.state == SenderState::Streaming).await?;
    let took = restarted.elapsed();
    eprintln!("streaming again {took:?} after the receiver's restart");
    // 250 ms of backoff at most, plus a connection and a Hello on a busy machine.
    assert!(took < Duration::from_millis(1500), "{took:?}");
    senders.stop().await;
    r.stop().await;
    Ok(())
}

/// A TCP proxy to a receiver whose first connection freezes once it has carried
/// `freeze_after` bytes towards the receiver: it forwards nothing more either way but
/// stays open, like a link whose far end stopped answering (a partition that drops
/// packets). Later connections pass.
struct Proxy {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Proxy {
    async fn start(target: SocketAddr, freeze_after: usize) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut pumps = tokio::task::JoinSet::new();
            let mut first = true;
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let frozen = Arc::new(AtomicBool::new(false));
                let limit = if std::mem::take(&mut first) {
                    freeze_after
                } else {
                    usize::MAX
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                pumps.spawn(pump(cr, sw, frozen.clone(), limit));
                pumps.spawn(pump(sr, cw, frozen, usize::MAX));
            }
        });
        Ok(Self { addr, task })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // The pumps are the task's: they end with it, sockets and all.
        self.task.abort();
    }
}

/// Forwards `from` to `to` until either closes; once `frozen` (set here after `limit`
/// bytes, or by the other direction's pump), holds both open and forwards nothing.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
    limit: usize,
) {
    let mut buf = vec![0; 64 * 1024];
    let mut carried = 0;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.load(Ordering::SeqCst) {
            let _held = (from, to);
            return std::future::pending().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        carried += n;
        if carried >= limit {
            frozen.store(true, Ordering::SeqCst);
        }
    }
}

/// A link that stops mid-transaction, the connection left open, is taken for dead by
/// the sender within its peer timeout while it is waiting to send (the receiver
/// neither reads nor speaks, and HTTP/2 would hold the send for ever), and a new
/// session delivers the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_stalls_mid_transaction_is_given_up_and_the_transaction_sent_again(
) -> Result<()> {
    let master = open(1).await?;
    let sub = open(2).await?;
    commit_large(&master, 0, 1, 24 * MIB / ROW_CHARS).await?;
    let r = Receiver::start(&sub, ReceiverConfig::new(id("s1")), None).await?;
    // Frozen 2 MiB into the transaction.
    let proxy = Proxy::start(r.addr, 2 * MIB).await?;
    // Small chunks and a short outbound queue: the rest of the transaction is many
    // times what the queue, HTTP/2's windows and the sockets' buffers hold.
    let tuning = SenderTuning {
        max_batch_bytes: 64 * 1024,
        max_in_flight_batches: 1,
        ..SenderTuning::default()
    };
    let senders = Senders::default();
    let endpoint = Endpoint::from_shared(format!("http://{}", proxy.addr))?;
    let h = senders.spawn(link(Compression::None, tuning), &master, endpoint);
    let st = wait_status(&h, "the sender to give the stalled link up", |s| {
        s.last_error.is_some()
    })
    .await?;
    assert_eq!(
        st.last_error.as_deref(),
        Some("the peer was silent past the timeout"),
        "{st:?}"
    );
    // Through a new connection, which passes: the whole transaction.
    let st = caught_up(&h, &master).await?;
    assert!(st.sessions >= 2, "{st:?}");
    assert_eq!(rows(&sub)?, rows(&master)?);
    senders.stop().await;
    drop(proxy);
    r.stop().await;
    Ok(())
}
