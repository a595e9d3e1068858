//! The node's HTTP port: probes for Kubernetes, Prometheus metrics, status as JSON.
//!
//! | path       | answers                                                    |
//! |------------|------------------------------------------------------------|
//! | `/healthz` | 200 while the process serves at all (liveness)             |
//! | `/readyz`  | 200 once the database is open and gRPC is serving, else 503 (for good once the node was removed from the cluster) |
//! | `/metrics` | Prometheus text format (with `process_*`: CPU, memory, threads, fds) |
//! | `/status`  | the same status `hawser status --format json` prints       |
//! | `/replication` | this node's data-plane streams, outbound and inbound    |

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::NodeState;

pub(crate) fn router(state: Arc<NodeState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/replication", get(replication))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<NodeState>>) -> Response {
    if let Some(removal) = state.plane.removal() {
        // Never ready again: a load balancer must not send clients here.
        let body = format!("removed: {}\n", crate::cluster::removal_message(&removal));
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

/// The process's CPU time, memory, threads and file descriptors under the names
/// Prometheus client libraries give them (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, ...), read at every scrape.
fn process_metrics() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(|| {
        let collector = metrics_process::Collector::default();
        collector.describe();
        collector
    })
}

async fn metrics(State(state): State<Arc<NodeState>>) -> Response {
    match &state.metrics {
        Some(handle) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], {
            process_metrics().collect();
            handle.render()
        })
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "metrics are not enabled in this process\n",
        )
            .into_response(),
    }
}

async fn status(State(state): State<Arc<NodeState>>) -> Response {
    let s = state.status();
    let mut json = crate::status_json(&s);
    crate::cluster::add_removal_json(&mut json, &s);
    axum::Json(json).into_response()
}

async fn replication(State(state): State<Arc<NodeState>>) -> Response {
    axum::Json(crate::replication_json(&state.replication_status())).into_response()
}
