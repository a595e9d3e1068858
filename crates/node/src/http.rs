//! The node's HTTP port: probes for Kubernetes, Prometheus metrics, status as JSON.
//!
//! | path       | answers                                                    |
//! |------------|------------------------------------------------------------|
//! | `/healthz` | 200 while the process serves at all (liveness)             |
//! | `/readyz`  | 200 once the database is open and gRPC is serving, else 503 (for good once the node was removed from the cluster) |
//! | `/metrics` | Prometheus text format (with `process_*`: CPU, memory, threads, fds) |
//! | `/status`  | the same status `hawser status --format json` prints       |
//! | `/replication` | this node's data-plane streams, outbound and inbound    |
//!
//! A node with certificates serves the port over TLS (docs/security.md): the probes
//! answer anyone, the rest only a caller showing a certificate of the cluster's CA (any
//! role: what they show, `hawser status` shows a reader too).

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::NodeState;

/// How long a TLS handshake on the HTTP port may take.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Who called, on a secure node's HTTP port: the subject of the certificate of the
/// cluster's CA it showed, if it showed one.
#[derive(Clone)]
struct HttpCaller(Option<hawser_tls::Subject>);

/// `tokens`: the node runs secure, and a caller without a certificate may show one
/// of these instead; `None`: insecure, everything open.
pub(crate) fn router(state: Arc<NodeState>, tokens: Option<Arc<hawser_tls::Tokens>>) -> Router {
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz));
    let mut rest = Router::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/replication", get(replication));
    if let Some(tokens) = tokens {
        rest = rest.route_layer(middleware::from_fn_with_state(tokens, require_caller));
    }
    probes.merge(rest).with_state(state)
}

/// Any client of the cluster's CA may read the HTTP port's pages, by certificate or
/// by token (a Prometheus scrape's `authorization: credentials_file`).
async fn require_caller(
    State(tokens): State<Arc<hawser_tls::Tokens>>,
    caller: Option<Extension<HttpCaller>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(Extension(HttpCaller(Some(_)))) = caller {
        return next.run(request).await;
    }
    let token = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let why = match token.map(|t| tokens.check(t.trim())) {
        Some(Ok(_)) => return next.run(request).await,
        Some(Err(e)) => format!("the token: {e}"),
        None => "this node runs secure: show a certificate of its cluster's CA (curl \
                 --cacert ca.crt --cert client.root.crt --key client.root.key) or a token \
                 (-H 'Authorization: Bearer TOKEN'); /healthz and /readyz need none"
            .to_string(),
    };
    (StatusCode::UNAUTHORIZED, format!("{why}\n")).into_response()
}

/// Serves the HTTP port until shutdown: plain, or over TLS with `tls`.
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<NodeState>,
    tls: Option<(
        Arc<hawser_tls::rustls::ServerConfig>,
        Arc<hawser_tls::Tokens>,
    )>,
) -> std::io::Result<()> {
    let shutdown = state.shutdown.clone();
    let tasks = state.tasks.clone();
    let Some((tls, tokens)) = tls else {
        return axum::serve(listener, router(state, None))
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let router = router(state, Some(tokens));
    loop {
        let tcp = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                // Out of file descriptors and the like: the next accept may work.
                Err(e) => {
                    warn!(error = %e, "cannot accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, router, shutdown) = (acceptor.clone(), router.clone(), shutdown.clone());
        tasks.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return debug!(error = %e, "HTTP port: TLS handshake failed"),
                Err(_) => return debug!("HTTP port: TLS handshake timed out"),
            };
            // rustls checked the chain against the CA; the subject says who it is.
            let caller = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|der| hawser_tls::subject(der).ok());
            let service = hyper_util::service::TowerToHyperService::new(
                router.layer(Extension(HttpCaller(caller))),
            );
            let builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), service);
            tokio::select! {
                r = connection => if let Err(e) = r {
                    debug!(error = %e, "HTTP connection ended with an error");
                },
                () = shutdown.cancelled() => {}
            }
        });
    }
}

async fn readyz(State(state): State<Arc<NodeState>>) -> Response {
    if let Some(removal) = state.plane.removal() {
        // Never ready again: a load balancer must not send clients here.
        let body = format!("removed: {}\n", crate::cluster::removal_message(&removal));
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    let metrics = state.plane.raft_metrics().borrow().clone();
    let seen = Readiness {
        started: state.ready.load(Ordering::Acquire),
        joins: !state.config.join.is_empty(),
        in_cluster: metrics
            .membership_config
            .membership()
            .nodes()
            .next()
            .is_some(),
        member: metrics
            .membership_config
            .membership()
            .get_node(&state.node_id.0)
            .is_some(),
        leader_known: metrics.current_leader.is_some(),
    };
    match seen.verdict() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// What `/readyz` looks at: ready means a node that can serve — a standalone node
/// once started; a cluster node once it is a Raft member (a joining node is admitted
/// as a voter only after it caught up with the log) and knows a leader.
#[derive(Debug, Clone, Copy)]
struct Readiness {
    started: bool,
    /// Started with --join: meant to be a member, so not ready until it is one.
    joins: bool,
    /// Its Raft state names a membership (initialized, or joined).
    in_cluster: bool,
    member: bool,
    leader_known: bool,
}

impl Readiness {
    fn verdict(self) -> Result<(), &'static str> {
        if !self.started {
            return Err("starting");
        }
        if !self.in_cluster {
            return if self.joins {
                Err("joining the cluster (--join); not a member yet")
            } else {
                // A database on its own (no `hawser init`, no --join) serves as one.
                Ok(())
            };
        }
        if !self.member {
            return Err("not in the cluster's Raft membership");
        }
        if !self.leader_known {
            return Err("no Raft leader known");
        }
        Ok(())
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

#[cfg(test)]
mod readiness_tests {
    use super::Readiness;

    #[test]
    fn ready_means_a_member_that_knows_a_leader_or_a_standalone_node() {
        let base = Readiness {
            started: true,
            joins: true,
            in_cluster: true,
            member: true,
            leader_known: true,
        };
        assert!(base.verdict().is_ok());
        let standalone = Readiness {
            joins: false,
            in_cluster: false,
            member: false,
            leader_known: false,
            ..base
        };
        assert!(standalone.verdict().is_ok());
        for (not_ready, why) in [
            (
                Readiness {
                    started: false,
                    ..base
                },
                "starting",
            ),
            (
                Readiness {
                    in_cluster: false,
                    member: false,
                    ..base
                },
                "joining",
            ),
            (
                Readiness {
                    member: false,
                    ..base
                },
                "membership",
            ),
            (
                Readiness {
                    leader_known: false,
                    ..base
                },
                "leader",
            ),
        ] {
            assert!(
                not_ready.verdict().unwrap_err().contains(why),
                "{not_ready:?}"
            );
        }
    }
}
