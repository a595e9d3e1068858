//! One hawser node: its configuration, its database, and the servers and tasks around it.
//!
//! ```text
//!   gRPC (hawser.v1.Client/Admin, hawser.raft.v1.RaftPeer)   HTTP (/healthz /readyz /metrics /status)
//!                        │                                     │
//!                  grpc::Services ──────── NodeState ───────── http::router
//!                        │                    │
//!                hawser_sql::SqlEngine ── hawser_store::Database (sled, DATA/db)
//!                        │ replication DDL (cluster::RaftDdl)
//!                hawser_control::ControlPlane ── Raft log + state (sled, DATA/raft)
//!                        │ cluster state watch
//!                dataplane::run ── StreamSender per link; ReceiverService on the gRPC port
//! ```
//!
//! [`run`] takes already-bound listeners and a shutdown token (the mini-redis
//! `server::run(listener, shutdown)` shape): the binary owns sockets, signals and the
//! global metrics recorder, the library owns everything else. Every task it starts is
//! tracked; if a critical one (a server) ends on its own, `run` cancels the rest and
//! returns an error so the process exits non-zero — durable state makes a restart safe.
//! The same holds when Raft stops under the node (a storage error) or the cluster
//! refuses to let the node join.

mod admission;
pub mod cluster;
mod codes;
pub mod config;
mod conflict_report;
mod dataplane;
mod drill;
mod duplicate;
pub mod fault;
mod grpc;
mod http;
pub mod identity;
mod lease;
mod returns;
mod roles;
mod senders;
mod stall;
mod switchover;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_control::{ControlConfig, ControlPlane, PlaneError};
use hawser_core::{Ident, NodeId};
use hawser_proto::v1;
use hawser_sql::SqlEngine;
use hawser_store::{Database, DbOptions, KvEngine, SledEngine, StoreError};
use metrics_exporter_prometheus::PrometheusHandle;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, instrument, warn};

pub use config::{CompressCodec, ConfigError, CpuClass, HugePages, NodeConfig};
pub use grpc::MAX_SCAN_ROWS;

/// `Admin` calls a node handles at once at most; one more is refused (53300). Fixed:
/// operators' calls are few, and their own bound keeps them reaching a node whose
/// `Client` calls are at `--max-requests`.
pub const ADMIN_REQUESTS: usize = 64;

/// Why a node could not start or stopped on its own.
///
/// Each message includes its cause, so no variant declares a source: a printer that
/// walks the source chain (`{:#}` of an `anyhow::Error`) would print the cause twice.
#[derive(Debug, Error)]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("node identity: {0}")]
    Identity(String),
    #[error("certificates: {0}")]
    Tls(String),
    #[error("cannot create data directory {path}: {error}")]
    DataDir { path: String, error: std::io::Error },
    #[error("cannot open the database ({code}): {0}", code = .0.code())]
    Open(StoreError),
    #[error("cannot start the control plane: {0}")]
    Control(PlaneError),
    #[error("the control plane stopped the node: {0}")]
    ControlFailed(String),
    #[error("{task} failed: {reason}")]
    TaskFailed { task: &'static str, reason: String },
    #[error("{task} stopped unexpectedly")]
    TaskExited { task: &'static str },
    #[error(
        "storage failed: {0}; the node stops so that a restart recovers every commit it \
         acknowledged from its log (free space on the disk first if it is full)"
    )]
    StorageFailed(String),
}

/// What the services share.
pub(crate) struct NodeState {
    pub(crate) config: NodeConfig,
    pub(crate) node_id: NodeId,
    pub(crate) db: Database,
    pub(crate) sql: SqlEngine,
    pub(crate) plane: ControlPlane,
    pub(crate) metrics: Option<PrometheusHandle>,
    pub(crate) started: Instant,
    pub(crate) ready: AtomicBool,
    pub(crate) sessions: AtomicU32,
    pub(crate) tasks: TaskTracker,
    pub(crate) shutdown: CancellationToken,
    /// The addresses actually bound (the config may say port 0).
    pub(crate) grpc_addr: std::net::SocketAddr,
    pub(crate) http_addr: std::net::SocketAddr,
    /// This node's outbound streams (the data plane task keeps the map current).
    pub(crate) senders: senders::Senders,
    /// What the data plane cannot do as the schemes ask (kept by its task).
    pub(crate) problems: dataplane::Problems,
    /// This node's inbound streams.
    pub(crate) receiver: hawser_stream::ReceiverService,
    /// Commits waiting for subscribers' acknowledgements.
    pub(crate) returns: Arc<returns::Returns>,
    /// On the Raft leader: silent masters it cannot fail over now, with why.
    pub(crate) blocked_failovers: lease::Blocked,
    /// Held while a duplicate runs here: one at a time.
    pub(crate) duplicating: tokio::sync::Mutex<()>,
    /// What this node calls its peers with when the cluster runs secure.
    pub(crate) peer_tls: Option<tonic::transport::ClientTlsConfig>,
}

impl NodeState {
    pub(crate) fn status(&self) -> v1::StatusResponse {
        let stats = self.db.stats();
        let mut tables: Vec<v1::TableStatus> = self
            .db
            .tables()
            .iter()
            .map(|t| v1::TableStatus {
                name: t.name.to_string(),
                columns: t.columns.len() as u32,
            })
            .collect();
        tables.sort_by(|a, b| a.name.cmp(&b.name));
        let mut sequences: Vec<String> = self
            .db
            .sequences()
            .iter()
            .map(|s| s.name.to_string())
            .collect();
        sequences.sort();
        let replication = self.replication_status();
        v1::StatusResponse {
            name: self.config.name.clone(),
            node_id: self.node_id.0,
            version: env!("CARGO_PKG_VERSION").into(),
            listen: self.grpc_addr.to_string(),
            http: self.http_addr.to_string(),
            data_dir: self.config.data_dir.display().to_string(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            cpu_micros: process_cpu_micros(),
            cpu_class: self.config.cpu_class.as_str().into(),
            last_lsn: self.db.last_lsn().0,
            commits: stats.commits,
            flushes: stats.flushes,
            rows_written: stats.rows_written,
            durable_commits: self.config.durable_commits,
            tables,
            sequences,
            sessions: self.sessions.load(Ordering::Relaxed),
            cluster: Some(cluster::cluster_status(
                &self.plane,
                &cluster::HealthLimits {
                    late_after: self.config.report_interval * 3,
                    unreachable_after: self.config.master_lease,
                },
                self.blocked_failovers.lock().clone(),
            )),
            replication_json: replication_json(&replication).to_string(),
            replication: Some(replication),
        }
    }

    /// Streams, return services, lease, log and disk (`Status.replication`, HTTP
    /// `/replication`).
    pub(crate) fn replication_status(&self) -> v1::ReplicationStatus {
        let (outbound, inbound) = dataplane::streams_status(&self.senders, &self.receiver);
        let now = Instant::now();
        v1::ReplicationStatus {
            outbound,
            inbound,
            returns: Some(self.returns.status()),
            problems: self.problems.lock().clone(),
            // Why this node takes no writes of its own now (the restart fence), if so.
            writes_paused: self.db.writes_paused(),
            // Whether its client writes need a master lease, and how long the one it
            // holds has left.
            master_lease: Some(v1::MasterLease {
                required: self.db.lease().required(),
                remaining_ms: self
                    .db
                    .lease()
                    .held_until(now)
                    .map(|until| until.duration_since(now).as_millis() as u64),
            }),
            // The data directory's free space against the floor writes stop at.
            disk: self.db.space().map(|s| v1::DiskSpace {
                free_bytes: s.free_bytes,
                min_free_bytes: s.min_free_bytes,
                full: s.low,
            }),
            log: Some(v1::CommitLog {
                start_lsn: self.db.log_start().0,
                last_lsn: self.db.last_lsn().0,
                retained_bytes: self.db.log_retained_bytes(),
                keep_bytes: self.config.log_keep_bytes,
            }),
        }
    }
}

/// The lower-case name status JSON gives a stream state.
pub fn stream_state_name(state: v1::StreamState) -> &'static str {
    match state {
        v1::StreamState::Unspecified => "unknown",
        v1::StreamState::Connecting => "connecting",
        v1::StreamState::Streaming => "streaming",
        v1::StreamState::Backoff => "backoff",
        v1::StreamState::Refused => "refused",
        v1::StreamState::LogReleased => "log_released",
        v1::StreamState::Diverged => "diverged",
        v1::StreamState::Stopped => "stopped",
    }
}

/// The replication status as the JSON object HTTP `/replication` and `hawser status
/// --format json` give (docs/status.md, "replication").
pub fn replication_json(r: &v1::ReplicationStatus) -> serde_json::Value {
    let marks = |m: &std::collections::HashMap<u64, u64>| {
        m.iter()
            .map(|(n, seq)| (n.to_string(), serde_json::json!(seq)))
            .collect::<serde_json::Map<_, _>>()
    };
    let outbound: Vec<serde_json::Value> = r
        .outbound
        .iter()
        .map(|o| {
            serde_json::json!({
                "scheme": o.scheme,
                "receiver": o.receiver,
                "state": stream_state_name(o.state()),
                "reason": o.reason,
                "last_error": o.last_error,
                "millis_since_contact": o.millis_since_contact,
                "acked_durable": marks(&o.acked_durable),
                "acked_applied": marks(&o.acked_applied),
                "acked_lsn": o.acked_lsn,
                "sent_lsn": o.sent_lsn,
                "lag_records": o.lag_records,
                "lag_micros": o.lag_micros,
                "ack_micros": o.ack_micros,
                "ack_micros_mean": o.ack_micros_mean,
                "transactions": o.transactions,
                "batches": o.batches,
                "compression": o.compression,
                "raw_bytes": o.raw_bytes,
                "wire_bytes": o.wire_bytes,
                "sessions": o.sessions,
                "held": o.held.as_ref().map(|h| serde_json::json!({
                    "gtid": h.gtid,
                    "millis": h.millis,
                    "waits_for": h.waits_for,
                })),
            })
        })
        .collect();
    let inbound: Vec<serde_json::Value> = r
        .inbound
        .iter()
        .map(|i| {
            serde_json::json!({
                "sender": i.sender,
                "connected": i.connected,
                "refused": i.refused,
                "millis_since_contact": i.millis_since_contact,
                "millis_since_connect": i.millis_since_connect,
                "through_lsn": i.through_lsn,
                "batches": i.batches,
                "transactions": i.transactions,
                "transactions_skipped": i.transactions_skipped,
                "row_changes": i.row_changes,
                "rows_written": i.rows_written,
                "rows_written_compiled": i.rows_written_compiled,
                "runs_compiled": i.runs_compiled,
                "runs_in_order": i.runs_in_order,
                "apply_pauses": i.apply_pauses,
                "raw_bytes": i.raw_bytes,
                "wire_bytes": i.wire_bytes,
                "targets": i.targets.iter().map(|t| serde_json::json!({
                    "table": t.table,
                    "kind": t.kind,
                    "into": t.into,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let returns = r.returns.as_ref().map(|t| {
        serde_json::json!({
            "waiting": t.waiting,
            "acknowledged": t.acknowledged,
            "timed_out": t.timed_out,
            "released_disabled": t.released_disabled,
            "not_requested": t.not_requested,
            "disable_events": t.disable_events,
            "resume_events": t.resume_events,
            // 0 (no wait) and -1 (forever) are integers, a wait time seconds.
            "return_wait": if t.return_wait == 0.0 || t.return_wait == -1.0 {
                serde_json::json!(t.return_wait as i64)
            } else {
                serde_json::json!(t.return_wait)
            },
            "subscribers": t.subscribers.iter().map(|s| serde_json::json!({
                "subscriber": s.subscriber,
                "level": s.level,
                "disabled": s.disabled,
                "timeouts": s.timeouts,
                "receipt_seq": s.receipt_seq,
                "commit_seq": s.commit_seq,
            })).collect::<Vec<_>>(),
        })
    });
    serde_json::json!({
        "outbound": outbound,
        "inbound": inbound,
        "returns": returns,
        "problems": r.problems,
        "writes_paused": r.writes_paused,
        "master_lease": r.master_lease.as_ref().map(|l| serde_json::json!({
            "required": l.required,
            "remaining_ms": l.remaining_ms,
        })),
        "disk": r.disk.as_ref().map(|d| serde_json::json!({
            "free_bytes": d.free_bytes,
            "min_free_bytes": d.min_free_bytes,
            "full": d.full,
        })),
        "log": r.log.as_ref().map(|l| serde_json::json!({
            "start_lsn": l.start_lsn,
            "last_lsn": l.last_lsn,
            "retained_bytes": l.retained_bytes,
            "keep_bytes": l.keep_bytes,
        })),
    })
}

/// CPU time (user + system) this process has used so far, in microseconds.
fn process_cpu_micros() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0) / 1000
}

/// The status as the JSON object `/status` and `hawser status --format json` print.
pub fn status_json(s: &v1::StatusResponse) -> serde_json::Value {
    serde_json::json!({
        "name": s.name,
        "node_id": s.node_id,
        "version": s.version,
        "listen": s.listen,
        "http": s.http,
        "data_dir": s.data_dir,
        "uptime_ms": s.uptime_ms,
        "cpu_micros": s.cpu_micros,
        "cpu_class": s.cpu_class,
        "last_lsn": s.last_lsn,
        "commits": s.commits,
        "flushes": s.flushes,
        "rows_written": s.rows_written,
        "durable_commits": s.durable_commits,
        "sessions": s.sessions,
        "tables": s.tables.iter().map(|t| serde_json::json!({"name": t.name, "columns": t.columns})).collect::<Vec<_>>(),
        "sequences": s.sequences,
        "cluster": s.cluster.as_ref().map(cluster_json),
        "replication": match &s.replication {
            Some(r) => Some(replication_json(r)),
            None => serde_json::from_str::<serde_json::Value>(&s.replication_json).ok(),
        },
    })
}

/// `cluster.failover` of `hawser status --format json` (docs/status.md).
pub fn failover_json(f: &v1::FailoverStatus) -> serde_json::Value {
    serde_json::json!({
        "paused": f.paused,
        "paused_reason": f.paused.then_some(&f.paused_reason),
        "paused_since_unix_ms": f.paused.then_some(f.paused_since_unix_ms),
        "automatic_here": f.automatic_here,
        "failover_timeout_ms": f.failover_timeout_ms,
        "master_lease_ms": f.master_lease_ms,
        "report_interval_ms": f.report_interval_ms,
    })
}

fn cluster_json(c: &v1::ClusterStatus) -> serde_json::Value {
    let opt = |v: i64| (v >= 0).then_some(v);
    serde_json::json!({
        "initialized": c.initialized,
        "role": c.role,
        "term": c.term,
        "leader_id": (c.leader_id != 0).then_some(c.leader_id),
        "leader_addr": (!c.leader_addr.is_empty()).then_some(&c.leader_addr),
        "last_log_index": c.last_log_index,
        "last_applied": c.last_applied,
        "snapshot_index": c.snapshot_index,
        "purged_index": c.purged_index,
        "state_version": c.state_version,
        "millis_since_quorum_ack": opt(c.millis_since_quorum_ack),
        "blocked_failovers": c.blocked_failovers,
        "failover": c.failover.as_ref().map(failover_json),
        "nodes": c.nodes.iter().map(|n| serde_json::json!({
            "id": n.id,
            "store": n.store,
            "host": n.host,
            "grpc": n.grpc_addr,
            "http": n.http_addr,
            "membership": n.membership,
            "role": n.role,
            "health": n.health,
            "millis_since_report": opt(n.millis_since_report),
            "matched_index": opt(n.matched_index),
            "lag_entries": opt(n.lag_entries),
            "catalog": n.catalog_reported.then(|| serde_json::json!({
                "tables": n.tables,
                "sequences": n.sequences,
            })),
        })).collect::<Vec<_>>(),
        "schemes": c.schemes.iter().map(|s| serde_json::json!({
            "name": s.name,
            "version": s.version,
            "receivers": s.receivers,
            "return_services_disabled": s.return_services_disabled,
            "elements": s.elements.iter().map(|e| serde_json::json!({
                "name": e.name,
                "kind": e.kind,
                "owner_role": e.owner_role,
                "master_store": e.master_store,
                "master_node": (e.master_node != 0).then_some(e.master_node),
                "master_addr": (!e.master_addr.is_empty()).then_some(&e.master_addr),
                "table": (!e.table.is_empty()).then_some(&e.table),
                "epoch": e.epoch,
                "subscribers": e.subscribers,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// Runs one node until `shutdown` is cancelled or a critical task fails.
#[instrument(skip_all, fields(name = %config.name))]
pub async fn run(
    config: NodeConfig,
    grpc_listener: TcpListener,
    http_listener: TcpListener,
    metrics: Option<PrometheusHandle>,
    shutdown: CancellationToken,
    ready: Option<tokio::sync::oneshot::Sender<NodeId>>,
) -> Result<(), NodeError> {
    config.validate()?;
    let tls = match &config.certs_dir {
        Some(dir) => Some(hawser_tls::load_node(dir).map_err(|e| NodeError::Tls(e.to_string()))?),
        None => None,
    };
    std::fs::create_dir_all(&config.data_dir).map_err(|error| NodeError::DataDir {
        path: config.data_dir.display().to_string(),
        error,
    })?;
    let node_id = identity::load_or_create(&config.data_dir, &config.name)?;
    let opts = DbOptions {
        node_id,
        durable_commits: config.durable_commits,
        lock_timeout: config.lock_timeout,
        boot_id: config.boot_id.clone(),
        min_free_bytes: config.min_free_bytes,
        salvage: config.salvage,
    };
    let db_dir = config.data_dir.join("db");
    // Opening sled replays its log: blocking work, kept off the async workers.
    let db = tokio::task::spawn_blocking(move || Database::open_sled(&db_dir, opts))
        .await
        .map_err(|e| NodeError::TaskFailed {
            task: "database open",
            reason: e.to_string(),
        })?
        .map_err(NodeError::Open)?;
    if db.restart_fence_pending() {
        // Commits written ahead of their sync may have been lost with the machine after
        // senders shipped them: no commit of this node's own until its receivers have
        // said how much of it they hold (the data plane lifts this). The store keeps
        // the fence across restarts of the process until it lifts.
        warn!("the machine restarted since this node last took writes: its own writes wait until its return-service subscribers report what they hold of it");
        db.pause_writes(Some(dataplane::RESTART_FENCE.to_string()));
    }
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|e| NodeError::TaskFailed {
            task: "grpc listener",
            reason: e.to_string(),
        })?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|e| NodeError::TaskFailed {
            task: "http listener",
            reason: e.to_string(),
        })?;
    info!(node_id = %node_id, grpc = %grpc_addr, http = %http_addr, data = %config.data_dir.display(), "node starting");

    let peer_tls = tls.as_ref().map(|t| t.peer.clone());
    let plane = start_control(&config, node_id, grpc_addr, http_addr, peer_tls.clone()).await?;
    let store = Ident::unquoted(&config.name);
    let ddl = Arc::new(cluster::RaftDdl {
        plane: plane.clone(),
        db: db.clone(),
        store: store.clone(),
    });

    let tasks = TaskTracker::new();
    let node_shutdown = shutdown.child_token();
    let (epochs, epochs_rx) = tokio::sync::watch::channel(std::collections::BTreeMap::new());
    let (forked, forked_rx) = tokio::sync::watch::channel(Vec::new());
    let (targets, targets_rx) = tokio::sync::watch::channel(std::collections::BTreeMap::new());
    let receiver = hawser_stream::ReceiverService::new(
        db.clone(),
        config.receiver_config(store.clone()),
        epochs_rx,
        tasks.clone(),
        node_shutdown.clone(),
    )
    .with_forked(forked_rx)
    .with_targets(targets_rx)
    .with_copy_plan(duplicate::copy_plan(
        plane.clone(),
        db.clone(),
        store.clone(),
    ));
    let senders: senders::Senders = Default::default();
    let returns = Arc::new(returns::Returns::new(node_id, senders.clone()));
    let sql_returns = Arc::new(returns::SqlReturns {
        returns: returns.clone(),
        waits: Arc::new(dataplane::SenderWaits {
            senders: senders.clone(),
            db: db.clone(),
        }),
    });
    let state = Arc::new(NodeState {
        sql: SqlEngine::with_replication(db.clone(), ddl).with_return_services(sql_returns),
        plane,
        db,
        node_id,
        metrics,
        started: Instant::now(),
        ready: AtomicBool::new(false),
        sessions: AtomicU32::new(0),
        tasks,
        shutdown: node_shutdown,
        grpc_addr,
        http_addr,
        config,
        senders,
        problems: Default::default(),
        receiver,
        returns,
        blocked_failovers: Default::default(),
        duplicating: Default::default(),
        peer_tls,
    });

    // Peer RPCs come from nodes only, when the cluster runs secure (a client's
    // certificate of the same CA is refused), and are refused while a drill isolates
    // this node (`hawser_core::isolation`); client and admin RPCs go on.
    let secure = tls.is_some();
    let tokens = match &state.config.certs_dir {
        Some(dir) if secure => Some(Arc::new(
            hawser_tls::Tokens::load(dir).map_err(|e| NodeError::Tls(e.to_string()))?,
        )),
        _ => None,
    };
    let peer_gate = move |r: tonic::Request<()>| -> Result<tonic::Request<()>, tonic::Status> {
        if secure {
            match hawser_tls::caller(&r) {
                Some(Ok(hawser_tls::Subject::Node { .. })) => {}
                Some(Ok(other)) => {
                    return Err(tonic::Status::permission_denied(format!(
                        "peer services take calls from nodes only; the caller's \
                         certificate names {other}"
                    )))
                }
                Some(Err(e)) => {
                    return Err(tonic::Status::unauthenticated(format!(
                        "the caller's certificate: {e}"
                    )))
                }
                None => {
                    return Err(tonic::Status::unauthenticated(
                        "peer services take calls from nodes only, with a node certificate",
                    ))
                }
            }
        }
        if hawser_core::isolation::isolated() {
            return Err(tonic::Status::unavailable(hawser_core::isolation::REFUSAL));
        }
        Ok(r)
    };
    use tonic::service::interceptor::InterceptedService;

    // What this store masters, receives and the failover era, from the cluster state it
    // had applied, before the first client request: a restarted master deposed while
    // it was down would otherwise take writes to its old tables, unfenced and stamped
    // with no era, until the report task first set them.
    lease::rescope(&state.plane, &state.db, &store);

    let services = grpc::Services {
        state: state.clone(),
    };
    let max = state.config.max_message_bytes;
    let grpc_shutdown = state.shutdown.clone();
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &tls {
        builder = builder
            .tls_config(tls.server.clone())
            .map_err(|e| NodeError::Tls(e.to_string()))?;
    }
    let grpc = builder
        .timeout(Duration::from_secs(300))
        .add_service(codes::Corrected(roles::Authorized::new(
            admission::Bounded::new(
                v1::client_server::ClientServer::new(services.clone())
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max),
                state.config.max_requests as usize,
                "--max-requests",
            ),
            tokens.clone(),
        )))
        .add_service(codes::Corrected(roles::Authorized::new(
            admission::Bounded::new(
                v1::admin_server::AdminServer::new(services)
                    .max_decoding_message_size(max)
                    .max_encoding_message_size(max),
                ADMIN_REQUESTS,
                "Admin calls at once, fixed",
            ),
            tokens.clone(),
        )))
        .add_service(InterceptedService::new(
            state.plane.raft_service(),
            peer_gate,
        ))
        .add_service(InterceptedService::new(
            state
                .receiver
                .clone()
                .into_server()
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
            peer_gate,
        ))
        .serve_with_incoming_shutdown(
            // The builder's tcp_nodelay applies only to sockets tonic binds itself:
            // accepted ones get it here, or Nagle holds small replies (acks of the
            // replication stream, commit replies) for a delayed ACK, ~40 ms.
            tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
            async move { grpc_shutdown.cancelled().await },
        );
    let http_tls = match (&state.config.certs_dir, tokens) {
        (Some(dir), Some(tokens)) => Some((
            hawser_tls::http_server_config(dir).map_err(|e| NodeError::Tls(e.to_string()))?,
            tokens,
        )),
        _ => None,
    };
    let http = http::serve(http_listener, state.clone(), http_tls);

    // Raft watch and join: a message on `fatal` stops the node with an error.
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::channel::<String>(2);
    state.tasks.spawn(cluster::watch_raft(
        state.plane.clone(),
        state.shutdown.clone(),
        fatal_tx.clone(),
    ));
    if !state.config.join.is_empty() {
        state.tasks.spawn(cluster::join_loop(
            state.plane.clone(),
            state.config.join.clone(),
            state.shutdown.clone(),
            fatal_tx,
        ));
    } else {
        drop(fatal_tx);
    }

    // This store's tables and sequences, reported to the cluster as they change: what
    // the other nodes plan its DATASTORE elements from.
    state.tasks.spawn(cluster::report_catalog(
        state.plane.clone(),
        state.db.clone(),
        store.clone(),
        state.shutdown.clone(),
    ));

    // A node whose runtime runs nothing is silent to the cluster: said when it happens.
    stall::watch(tokio::runtime::Handle::current(), state.shutdown.clone());

    // Liveness reports to the Raft leader and the master lease they earn; on the
    // leader, failovers of silent masters.
    state.tasks.spawn(lease::report_loop(
        state.plane.clone(),
        state.db.clone(),
        store.clone(),
        state.config.report_interval,
        state.shutdown.clone(),
    ));
    state.tasks.spawn(lease::failover_loop(
        state.plane.clone(),
        state.config.report_interval,
        state.blocked_failovers.clone(),
        state.shutdown.clone(),
    ));

    // Rebuilds the data plane asks for (commits past a fork point the log no longer
    // shows), one at a time.
    let (rebuilds, rebuilds_rx) = tokio::sync::watch::channel(Default::default());
    state
        .tasks
        .spawn(duplicate::auto_rebuild(state.clone(), rebuilds_rx));

    // Conflict report files (CHECK CONFLICTS ... REPORT TO).
    state.tasks.spawn(conflict_report::run(
        state.db.clone(),
        state.plane.clone(),
        store.clone(),
        state.config.data_dir.clone(),
        state.shutdown.clone(),
    ));

    // The data plane: senders for the links this store sends, epochs for its receiver.
    let timer = state.returns.clone();
    let timer_shutdown = state.shutdown.clone();
    state
        .tasks
        .spawn(async move { timer.run_timer(timer_shutdown).await });
    state.tasks.spawn(dataplane::run(dataplane::DataPlaneTask {
        returns: state.returns.clone(),
        log_file_size: state.config.log_file_size,
        log_keep_bytes: state.config.log_keep_bytes,
        copy_holds: state.receiver.copy_holds(),
        decided: state.receiver.decided_marks(),
        codec: state.config.compress_codec,
        plane: state.plane.clone(),
        db: state.db.clone(),
        store,
        epochs,
        targets,
        forked,
        rebuilds,
        senders: state.senders.clone(),
        problems: state.problems.clone(),
        tracker: state.tasks.clone(),
        shutdown: state.shutdown.clone(),
        peer_tls: state.peer_tls.clone(),
    }));

    state.ready.store(true, Ordering::Release);
    info!("node ready");
    if let Some(tx) = ready {
        // The receiver may be gone (nobody waits); that is fine.
        let _ = tx.send(node_id);
    }

    // Both servers and the control plane are critical: whichever ends first decides
    // how `run` ends.
    let control_failed = async move {
        match fatal_rx.recv().await {
            Some(reason) => reason,
            // Every sender is gone (the tasks ended normally): nothing to report.
            None => std::future::pending().await,
        }
    };
    // A store whose log write or sync failed refuses writes and may show readers
    // commits that never became durable: stop, as PostgreSQL PANICs, and let a restart
    // recover from the log.
    let storage_failed = {
        let db = state.db.clone();
        async move {
            let mut tick = tokio::time::interval(STORAGE_CHECK);
            loop {
                tick.tick().await;
                if let Some(reason) = db.storage_failure() {
                    return reason;
                }
            }
        }
    };
    let result = tokio::select! {
        reason = control_failed => Err(NodeError::ControlFailed(reason)),
        reason = storage_failed => Err(NodeError::StorageFailed(reason)),
        r = grpc => match r {
            Ok(()) if state.shutdown.is_cancelled() => Ok(()),
            Ok(()) => Err(NodeError::TaskExited { task: "grpc server" }),
            Err(e) => Err(NodeError::TaskFailed { task: "grpc server", reason: e.to_string() }),
        },
        r = http => match r {
            Ok(()) if state.shutdown.is_cancelled() => Ok(()),
            Ok(()) => Err(NodeError::TaskExited { task: "http server" }),
            Err(e) => Err(NodeError::TaskFailed { task: "http server", reason: e.to_string() }),
        },
    };
    if let Err(e) = &result {
        error!(error = %e, "critical task ended; stopping the node");
    }
    state.ready.store(false, Ordering::Release);
    state.shutdown.cancel();
    state.tasks.close();
    state.tasks.wait().await;
    // Each sender's handle holds the store: let them go, so that the store closes as
    // the node exits (its final checkpoint, and the end of its log marked).
    state.senders.lock().clear();
    if let Err(e) = state.plane.shutdown().await {
        warn!(error = %e, "Raft did not shut down cleanly");
    }
    info!("node stopped");
    result
}

/// How often the node looks for a storage failure ([`Database::storage_failure`]).
const STORAGE_CHECK: Duration = Duration::from_millis(100);

/// Opens the Raft storage in `DATA/raft` and starts the control plane; the node's id
/// is its Raft id.
async fn start_control(
    config: &NodeConfig,
    node_id: NodeId,
    grpc_addr: std::net::SocketAddr,
    http_addr: std::net::SocketAddr,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<ControlPlane, NodeError> {
    let raft_dir = config.data_dir.join("raft");
    let engine = tokio::task::spawn_blocking(move || SledEngine::open(&raft_dir))
        .await
        .map_err(|e| NodeError::TaskFailed {
            task: "raft storage open",
            reason: e.to_string(),
        })?
        .map_err(NodeError::Open)?;
    let engine: Arc<dyn KvEngine> = Arc::new(engine);
    let advertise = config
        .advertise
        .clone()
        .unwrap_or_else(|| grpc_addr.to_string());
    let mut cfg = ControlConfig::new(
        node_id,
        Ident::unquoted(&config.name),
        config.advertised_host(grpc_addr),
        advertise,
        config.advertised_http(grpc_addr, http_addr),
    );
    cfg.tls = tls;
    cfg.replace = config.replace;
    cfg.heartbeat_interval = config.raft_heartbeat;
    cfg.election_timeout_min = config.raft_election_min;
    cfg.election_timeout_max = config.raft_election_max;
    cfg.snapshot_every = config.raft_snapshot_every;
    cfg.max_in_snapshot_log_to_keep = config.raft_log_keep;
    cfg.report_interval = config.report_interval;
    cfg.master_lease = config.master_lease;
    cfg.failover.enabled = config.auto_failover;
    cfg.failover.failover_timeout = config.failover_timeout;
    // A candidate must have spoken within a lease: about five reports at the defaults.
    cfg.failover.candidate_fresh = config.master_lease;
    cfg.failover.max_lag = (config.failover_max_lag > 0).then_some(config.failover_max_lag);
    ControlPlane::start(cfg, engine)
        .await
        .map_err(NodeError::Control)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole chain a `{:#}` printer shows: the error, then each source.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(cause) = next {
            out.push_str(": ");
            out.push_str(&cause.to_string());
            next = cause.source();
        }
        out
    }

    #[test]
    fn a_start_error_names_its_cause_once() {
        let open = NodeError::Open(StoreError::IncompatibleFormat("format 9".into()));
        assert_eq!(
            chain(&open),
            "cannot open the database (XX001): incompatible data directory: format 9"
        );
        let dir = NodeError::DataDir {
            path: "/d".into(),
            error: std::io::Error::other("read-only"),
        };
        assert_eq!(chain(&dir), "cannot create data directory /d: read-only");
    }

    #[test]
    fn replication_json_names_states_and_leaves_what_is_unknown_null() {
        let r = v1::ReplicationStatus {
            outbound: vec![v1::OutboundStream {
                scheme: "r".into(),
                receiver: "ds2".into(),
                state: v1::StreamState::LogReleased.into(),
                reason: Some("log released".into()),
                acked_durable: [(7, 41)].into(),
                ..Default::default()
            }],
            returns: Some(v1::ReturnServices {
                return_wait: -1.0,
                ..Default::default()
            }),
            writes_paused: None,
            disk: None,
            ..Default::default()
        };
        let j = replication_json(&r);
        let o = &j["outbound"][0];
        assert_eq!(o["state"], "log_released");
        assert_eq!(o["reason"], "log released");
        assert_eq!(o["last_error"], serde_json::Value::Null);
        assert_eq!(o["millis_since_contact"], serde_json::Value::Null);
        assert_eq!(o["acked_durable"]["7"], 41);
        assert_eq!(o["held"], serde_json::Value::Null);
        assert_eq!(j["returns"]["return_wait"], -1);
        assert_eq!(j["writes_paused"], serde_json::Value::Null);
        assert_eq!(j["disk"], serde_json::Value::Null);
        let ten = v1::ReplicationStatus {
            returns: Some(v1::ReturnServices {
                return_wait: 10.0,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(replication_json(&ten)["returns"]["return_wait"], 10.0);
    }
}
