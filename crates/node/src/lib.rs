//! One hawser node: its configuration, its database, and the servers and tasks around it.
//!
//! ```text
//!            gRPC (hawser.v1.Client/Admin)          HTTP (/healthz /readyz /metrics /status)
//!                        │                                     │
//!                  grpc::Services ──────── NodeState ───────── http::router
//!                        │                    │
//!                hawser_sql::SqlEngine ── hawser_store::Database (sled)
//! ```
//!
//! [`run`] takes already-bound listeners and a shutdown token (the mini-redis
//! `server::run(listener, shutdown)` shape): the binary owns sockets, signals and the
//! global metrics recorder, the library owns everything else. Every task it starts is
//! tracked; if a critical one (a server) ends on its own, `run` cancels the rest and
//! returns an error so the process exits non-zero — durable state makes a restart safe.

pub mod config;
mod grpc;
mod http;
pub mod identity;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_core::NodeId;
use hawser_proto::v1;
use hawser_sql::SqlEngine;
use hawser_store::{Database, DbOptions, StoreError};
use metrics_exporter_prometheus::PrometheusHandle;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, instrument};

pub use config::{ConfigError, NodeConfig};
pub use grpc::MAX_SCAN_ROWS;

/// Why a node could not start or stopped on its own.
#[derive(Debug, Error)]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("node identity: {0}")]
    Identity(String),
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot open the database: {0}")]
    Open(#[source] StoreError),
    #[error("{task} failed: {reason}")]
    TaskFailed { task: &'static str, reason: String },
    #[error("{task} stopped unexpectedly")]
    TaskExited { task: &'static str },
}

/// What the services share.
pub(crate) struct NodeState {
    pub(crate) config: NodeConfig,
    pub(crate) node_id: NodeId,
    pub(crate) db: Database,
    pub(crate) sql: SqlEngine,
    pub(crate) metrics: Option<PrometheusHandle>,
    pub(crate) started: Instant,
    pub(crate) ready: AtomicBool,
    pub(crate) sessions: AtomicU32,
    pub(crate) tasks: TaskTracker,
    pub(crate) shutdown: CancellationToken,
    /// The addresses actually bound (the config may say port 0).
    pub(crate) grpc_addr: std::net::SocketAddr,
    pub(crate) http_addr: std::net::SocketAddr,
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
        v1::StatusResponse {
            name: self.config.name.clone(),
            node_id: self.node_id.0,
            version: env!("CARGO_PKG_VERSION").into(),
            listen: self.grpc_addr.to_string(),
            http: self.http_addr.to_string(),
            data_dir: self.config.data_dir.display().to_string(),
            uptime_ms: self.started.elapsed().as_millis() as u64,
            last_lsn: self.db.last_lsn().0,
            commits: stats.commits,
            flushes: stats.flushes,
            rows_written: stats.rows_written,
            durable_commits: self.config.durable_commits,
            tables,
            sequences,
            sessions: self.sessions.load(Ordering::Relaxed),
        }
    }
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
        "last_lsn": s.last_lsn,
        "commits": s.commits,
        "flushes": s.flushes,
        "rows_written": s.rows_written,
        "durable_commits": s.durable_commits,
        "sessions": s.sessions,
        "tables": s.tables.iter().map(|t| serde_json::json!({"name": t.name, "columns": t.columns})).collect::<Vec<_>>(),
        "sequences": s.sequences,
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
    std::fs::create_dir_all(&config.data_dir).map_err(|source| NodeError::DataDir {
        path: config.data_dir.display().to_string(),
        source,
    })?;
    let node_id = identity::load_or_create(&config.data_dir, &config.name)?;
    let opts = DbOptions {
        node_id,
        durable_commits: config.durable_commits,
        lock_timeout: config.lock_timeout,
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

    let state = Arc::new(NodeState {
        sql: SqlEngine::new(db.clone()),
        db,
        node_id,
        metrics,
        started: Instant::now(),
        ready: AtomicBool::new(false),
        sessions: AtomicU32::new(0),
        tasks: TaskTracker::new(),
        shutdown: shutdown.child_token(),
        grpc_addr,
        http_addr,
        config,
    });

    let services = grpc::Services {
        state: state.clone(),
    };
    let max = state.config.max_message_bytes;
    let grpc_shutdown = state.shutdown.clone();
    let grpc = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(300))
        .add_service(
            v1::client_server::ClientServer::new(services.clone())
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .add_service(
            v1::admin_server::AdminServer::new(services)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        )
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(grpc_listener),
            async move { grpc_shutdown.cancelled().await },
        );
    let http_shutdown = state.shutdown.clone();
    let http = axum::serve(http_listener, http::router(state.clone()))
        .with_graceful_shutdown(async move { http_shutdown.cancelled().await });

    state.ready.store(true, Ordering::Release);
    info!("node ready");
    if let Some(tx) = ready {
        // The receiver may be gone (nobody waits); that is fine.
        let _ = tx.send(node_id);
    }

    // Both servers are critical: whichever ends first decides how `run` ends.
    let result = tokio::select! {
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
    info!("node stopped");
    result
}
