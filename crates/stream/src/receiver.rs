//! The receiving end of `Replicate`: check the sender, apply its batches, acknowledge.
//!
//! ```text
//!  Hello ──► protocol, receiver name, elements subscribed, epochs not stale,
//!            table definitions (EXACT / RELAXED) ──► HelloReply(high-waters) | Refused
//!  Batch ──► epochs still current ──► decompress (bounded) ──► decode
//!        ──► rows: Database::apply_replicated (log order)
//!                  or apply_compiled (≥ compile_threshold transactions: RTL net rows)
//!            DDL: Database::apply_replicated_ddl
//!        ──► (write + flush inside the store) ──► Ack(durable, applied, through_lsn)
//! ```
//!
//! The store makes apply idempotent by Gtid, so a batch re-sent after a reconnect
//! changes nothing, and it writes rows, log records and high-waters in one atomic
//! batch flushed before it returns: the Ack is sent only after the bytes it promises
//! are durable (the `durable` marks say so only when the flush happened).
//!
//! Each stream is served by one task on the caller's [`TaskTracker`], cancelled by the
//! caller's token. A refusal travels as a `Refused` message with its reason (never a
//! bare gRPC error), so the sender can show it in status.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::Stream;
use hawser_core::{Epoch, Ident, NodeId, QualName, TableDef};
use hawser_rtl::compile;
use hawser_scheme::ast::TableDefinitionChecking;
use hawser_store::{Database, LogEntry, ReplicatedTxn};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::codec::{self, decode_records, decompress, Compression};
use crate::link::check_table;
use crate::pb::{self, receiver_message, sender_message, RefuseCode};
use crate::PROTOCOL_VERSION;

/// How a receiver behaves.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    /// This node's store name: a Hello for another store is refused.
    pub store: Ident,
    /// Batches with at least this many transactions are applied as RTL net rows.
    /// `usize::MAX` turns compilation off.
    pub compile_threshold: usize,
    pub heartbeat: Duration,
    /// Silence after which the sender is taken for dead and the stream dropped.
    pub peer_timeout: Duration,
}

impl ReceiverConfig {
    pub fn new(store: Ident) -> Self {
        Self {
            store,
            compile_threshold: 64,
            heartbeat: Duration::from_millis(250),
            peer_timeout: Duration::from_secs(1),
        }
    }
}

/// What a receiver knows about one inbound stream, by sender store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundStatus {
    pub connected: bool,
    /// Why the last Hello or batch was refused.
    pub refused: Option<String>,
    pub last_contact: Option<Instant>,
    pub through_lsn: u64,
    pub transactions: u64,
    pub raw_bytes: u64,
    pub wire_bytes: u64,
}

/// The `hawser.replication.v1.Replication` service of one node.
#[derive(Clone)]
pub struct ReceiverService {
    db: Database,
    config: ReceiverConfig,
    /// The elements this node subscribes to, with the epochs the control plane gives.
    epochs: watch::Receiver<BTreeMap<Ident, Epoch>>,
    status: watch::Sender<BTreeMap<Ident, InboundStatus>>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl ReceiverService {
    /// A receiver applying to `db`. Stream tasks run on `tracker` and stop when
    /// `shutdown` is cancelled.
    pub fn new(
        db: Database,
        config: ReceiverConfig,
        epochs: watch::Receiver<BTreeMap<Ident, Epoch>>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            db,
            config,
            epochs,
            status: watch::Sender::new(BTreeMap::new()),
            tracker,
            shutdown,
        }
    }

    /// Per-sender status, for `hawser status`.
    pub fn status(&self) -> watch::Receiver<BTreeMap<Ident, InboundStatus>> {
        self.status.subscribe()
    }

    /// The tonic service to add to a server.
    pub fn into_server(self) -> pb::replication_server::ReplicationServer<Self> {
        pb::replication_server::ReplicationServer::new(self)
    }
}

type Outbound = Pin<Box<dyn Stream<Item = Result<pb::ReceiverMessage, Status>> + Send>>;

fn refused(code: RefuseCode, reason: impl Into<String>) -> pb::ReceiverMessage {
    pb::ReceiverMessage {
        msg: Some(receiver_message::Msg::Refused(pb::Refused {
            code: code as i32,
            reason: reason.into(),
        })),
    }
}

fn marks(m: &BTreeMap<NodeId, u64>) -> Vec<pb::OriginMark> {
    m.iter()
        .map(|(o, s)| pb::OriginMark {
            origin: o.0,
            seq: *s,
        })
        .collect()
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// A stream that passed Hello.
struct Accepted {
    sender: Ident,
    elements: BTreeMap<Ident, Epoch>,
    /// Column maps of tables whose columns are in another order (RELAXED).
    maps: BTreeMap<QualName, Vec<usize>>,
}

impl ReceiverService {
    fn check_hello(&self, hello: &pb::Hello) -> Result<Accepted, (RefuseCode, String)> {
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err((
                RefuseCode::Protocol,
                format!(
                    "protocol version {} is not supported (this node speaks {PROTOCOL_VERSION})",
                    hello.protocol_version
                ),
            ));
        }
        if hello.receiver_store != self.config.store.as_str() {
            return Err((
                RefuseCode::NotSubscriber,
                format!(
                    "this node is store {}, not {}",
                    self.config.store, hello.receiver_store
                ),
            ));
        }
        let known = self.epochs.borrow().clone();
        let mut elements = BTreeMap::new();
        for e in &hello.elements {
            let name = Ident::quoted(&e.element);
            let Some(&current) = known.get(&name) else {
                return Err((
                    RefuseCode::NotSubscriber,
                    format!(
                        "store {} does not subscribe to element {name}",
                        self.config.store
                    ),
                ));
            };
            if Epoch(e.epoch) < current {
                return Err((
                    RefuseCode::StaleEpoch,
                    format!(
                        "element {name}: the sender is at epoch {}, the cluster at {current}",
                        e.epoch
                    ),
                ));
            }
            elements.insert(name, Epoch(e.epoch));
        }
        let mode = match pb::TableCheck::try_from(hello.table_check) {
            Ok(pb::TableCheck::Exact) => TableDefinitionChecking::Exact,
            _ => TableDefinitionChecking::Relaxed,
        };
        let mut maps = BTreeMap::new();
        for spec in &hello.tables {
            let remote: TableDef = codec::decode_table_def(&spec.definition)
                .map_err(|e| (RefuseCode::Protocol, format!("a table definition: {e}")))?;
            let Some(local) = self.db.table(&remote.name) else {
                return Err((
                    RefuseCode::TableMismatch,
                    format!(
                        "table {} does not exist on store {}",
                        remote.name, self.config.store
                    ),
                ));
            };
            match check_table(&local, &remote, mode) {
                Ok(Some(map)) => {
                    maps.insert(remote.name.clone(), map);
                }
                Ok(None) => {}
                Err(e) => return Err((RefuseCode::TableMismatch, e.to_string())),
            }
        }
        Ok(Accepted {
            sender: Ident::quoted(&hello.sender_store),
            elements,
            maps,
        })
    }

    fn update_status(&self, sender: &Ident, f: impl FnOnce(&mut InboundStatus)) {
        self.status.send_modify(|m| {
            let s = m.entry(sender.clone()).or_insert(InboundStatus {
                connected: false,
                refused: None,
                last_contact: None,
                through_lsn: 0,
                transactions: 0,
                raw_bytes: 0,
                wire_bytes: 0,
            });
            f(s);
        });
    }

    /// Serves one accepted stream until it ends, is refused or is cancelled.
    async fn serve(
        self,
        accepted: Accepted,
        mut inbound: Streaming<pb::SenderMessage>,
        out: mpsc::Sender<Result<pb::ReceiverMessage, Status>>,
    ) {
        let sender = accepted.sender.clone();
        let mut durable = self.db.high_waters().unwrap_or_default();
        let mut heartbeat = tokio::time::interval(self.config.heartbeat);
        let mut last_contact = Instant::now();
        loop {
            let msg = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break,
                _ = heartbeat.tick() => {
                    if last_contact.elapsed() > self.config.peer_timeout {
                        info!(sender = %sender, "sender silent past the peer timeout; dropping the stream");
                        break;
                    }
                    // Best effort: a full channel means acks are queued, which says as much.
                    let _ = out.try_send(Ok(pb::ReceiverMessage {
                        msg: Some(receiver_message::Msg::Heartbeat(pb::Heartbeat { sent_micros: now_micros() })),
                    }));
                    continue;
                }
                msg = inbound.message() => msg,
            };
            let msg = match msg {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(status) => {
                    debug!(sender = %sender, %status, "inbound stream failed");
                    break;
                }
            };
            last_contact = Instant::now();
            self.update_status(&sender, |s| s.last_contact = Some(last_contact));
            match msg.msg {
                Some(sender_message::Msg::Batch(batch)) => {
                    match self.apply_batch(&accepted, &batch, &mut durable).await {
                        Ok(ack) => {
                            self.update_status(&sender, |s| {
                                s.through_lsn = batch.through_lsn;
                                s.transactions += u64::from(batch.count);
                                s.raw_bytes += batch.raw_bytes;
                                s.wire_bytes += batch.payload.len() as u64;
                            });
                            let ack = pb::ReceiverMessage {
                                msg: Some(receiver_message::Msg::Ack(ack)),
                            };
                            if out.send(Ok(ack)).await.is_err() {
                                break;
                            }
                        }
                        Err((code, reason)) => {
                            warn!(sender = %sender, reason = %reason, "refusing the stream");
                            self.update_status(&sender, |s| s.refused = Some(reason.clone()));
                            let _ = out.send(Ok(refused(code, reason))).await;
                            break;
                        }
                    }
                }
                Some(sender_message::Msg::Heartbeat(_)) => {}
                Some(sender_message::Msg::Hello(_)) | None => {
                    let _ = out
                        .send(Ok(refused(
                            RefuseCode::Protocol,
                            "Hello may only come first",
                        )))
                        .await;
                    break;
                }
            }
        }
        self.update_status(&sender, |s| s.connected = false);
    }

    async fn apply_batch(
        &self,
        accepted: &Accepted,
        batch: &pb::Batch,
        durable: &mut BTreeMap<NodeId, u64>,
    ) -> Result<pb::Ack, (RefuseCode, String)> {
        // Epochs are checked on every batch: a master change since Hello makes this
        // sender stale from that moment on.
        {
            let known = self.epochs.borrow();
            for (element, epoch) in &accepted.elements {
                match known.get(element) {
                    Some(current) if current > epoch => {
                        return Err((
                            RefuseCode::StaleEpoch,
                            format!(
                                "element {element}: the sender is at epoch {epoch}, the cluster now at {current}"
                            ),
                        ))
                    }
                    None => {
                        return Err((
                            RefuseCode::NotSubscriber,
                            format!("store {} no longer subscribes to element {element}", self.config.store),
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
        let codec = match pb::Codec::try_from(batch.codec) {
            Ok(pb::Codec::None) => Compression::None,
            Ok(pb::Codec::Lz4) => Compression::Lz4,
            Ok(pb::Codec::Zstd) => Compression::Zstd,
            Err(_) => {
                return Err((
                    RefuseCode::Protocol,
                    format!("unknown codec {}", batch.codec),
                ))
            }
        };
        let proto = |e: codec::CodecError| {
            (
                RefuseCode::Protocol,
                format!("batch through LSN {}: {e}", batch.through_lsn),
            )
        };
        let raw = decompress(codec, &batch.payload, batch.raw_bytes).map_err(proto)?;
        let records = decode_records(&raw).map_err(proto)?;
        let failed = |e: hawser_store::StoreError| (RefuseCode::ApplyFailed, e.to_string());
        let mut run: Vec<ReplicatedTxn> = Vec::new();
        let mut all_durable = true;
        for r in records {
            match r.entry {
                LogEntry::Txn(mut txn) => {
                    for c in &mut txn.changes {
                        if let Some(map) = accepted.maps.get(&c.table) {
                            for row in [&mut c.before, &mut c.after].into_iter().flatten() {
                                *row = remap(row, map).ok_or_else(|| {
                                    (
                                        RefuseCode::Protocol,
                                        format!(
                                            "transaction {}: a row of {} has too few values",
                                            txn.gtid, c.table
                                        ),
                                    )
                                })?;
                            }
                        }
                    }
                    run.push(ReplicatedTxn {
                        txn,
                        epoch: r.epoch,
                    });
                }
                entry @ LogEntry::Ddl { .. } => {
                    all_durable &= self
                        .apply_run(std::mem::take(&mut run))
                        .await
                        .map_err(failed)?;
                    self.db
                        .apply_replicated_ddl(&entry, r.epoch)
                        .await
                        .map_err(failed)?;
                }
                LogEntry::SequenceBlock { .. } => {}
            }
        }
        all_durable &= self.apply_run(run).await.map_err(failed)?;
        let applied = self.db.high_waters().map_err(failed)?;
        if all_durable {
            // Everything applied so far was flushed: the durable marks catch up.
            *durable = applied.clone();
        }
        Ok(pb::Ack {
            durable: marks(durable),
            applied: marks(&applied),
            through_lsn: batch.through_lsn,
        })
    }

    /// Applies transactions in log order, or as RTL net rows when there are many.
    /// Returns whether the apply was flushed.
    async fn apply_run(&self, run: Vec<ReplicatedTxn>) -> Result<bool, hawser_store::StoreError> {
        if run.is_empty() {
            return Ok(true);
        }
        if run.len() >= self.config.compile_threshold {
            let catalog: Vec<TableDef> = self.db.tables().iter().map(|t| (**t).clone()).collect();
            let txns: Vec<_> = run.iter().map(|r| r.txn.clone()).collect();
            // A run the compiler cannot read (a change without the image it needs) is
            // applied in log order, which reports the problem precisely if it is real.
            if let Ok(compiled) = compile(&txns, &catalog) {
                return Ok(self.db.apply_compiled(&run, &compiled).await?.durable);
            }
        }
        Ok(self.db.apply_replicated(run).await?.durable)
    }
}

fn remap(row: &[hawser_core::Value], map: &[usize]) -> Option<Vec<hawser_core::Value>> {
    map.iter().map(|&j| row.get(j).cloned()).collect()
}

#[tonic::async_trait]
impl pb::replication_server::Replication for ReceiverService {
    type ReplicateStream = Outbound;

    async fn replicate(
        &self,
        request: Request<Streaming<pb::SenderMessage>>,
    ) -> Result<Response<Self::ReplicateStream>, Status> {
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(self.config.peer_timeout, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Hello within the peer timeout"))??;
        let Some(pb::SenderMessage {
            msg: Some(sender_message::Msg::Hello(hello)),
        }) = first
        else {
            return Err(Status::invalid_argument("the first message must be Hello"));
        };
        // Room for every batch a sender may have in flight plus heartbeats, so acks
        // never wait behind a full channel.
        let (tx, rx) = mpsc::channel(256);
        let sender = Ident::quoted(&hello.sender_store);
        match self.check_hello(&hello) {
            Err((code, reason)) => {
                info!(sender = %sender, reason = %reason, "refusing a replication stream");
                self.update_status(&sender, |s| {
                    s.connected = false;
                    s.refused = Some(reason.clone());
                });
                // The channel is empty and has room: this cannot fail.
                let _ = tx.try_send(Ok(refused(code, reason)));
            }
            Ok(accepted) => {
                let high_waters = self
                    .db
                    .high_waters()
                    .map_err(|e| Status::unavailable(e.to_string()))?;
                self.update_status(&sender, |s| {
                    s.connected = true;
                    s.refused = None;
                    s.last_contact = Some(Instant::now());
                });
                let _ = tx.try_send(Ok(pb::ReceiverMessage {
                    msg: Some(receiver_message::Msg::HelloReply(pb::HelloReply {
                        high_waters: marks(&high_waters),
                    })),
                }));
                info!(sender = %sender, "replication stream accepted");
                self.tracker
                    .spawn(self.clone().serve(accepted, inbound, tx));
            }
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
