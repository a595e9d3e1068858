//! `Admin.Drill`: a failover drill run by this node for a caller, streamed back.
//!
//! ```text
//!  request ─► settings (defaults for zeros) ─► the Raft leader's status ─► plan (pure,
//!  hawser_client::drill::plan)
//!    ├─ the fault strikes this node ─► one event: run_on, a healthy member to ask
//!    └─ otherwise ─► the engine here, each step a progress event, the report last
//! ```
//!
//! The engine is the CLI's (`hawser_client::drill`): a client of the cluster, which this
//! node reaches through its own advertised address like any client would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hawser_client::drill::{self, Kind, Settings};
use hawser_proto::v1;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::{info, warn};

use crate::NodeState;

type Events = mpsc::Sender<Result<v1::DrillEvent, Status>>;

/// The drill's kind and settings from `req`, `hawser drill`'s defaults for zeros.
pub(crate) fn settings(req: &v1::DrillRequest, host: &str) -> Result<(Kind, Settings), Status> {
    let kind = Kind::parse(&req.kind).ok_or_else(|| {
        let kinds: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        Status::invalid_argument(format!(
            "drill kind {:?}: give one of {}",
            req.kind,
            kinds.join(", ")
        ))
    })?;
    if req.scheme.trim().is_empty() {
        return Err(Status::invalid_argument(
            "name the replication scheme to drill",
        ));
    }
    let mut s = Settings::new(host);
    let ms = |v: u64, default: Duration| {
        if v == 0 {
            default
        } else {
            Duration::from_millis(v)
        }
    };
    s.down = ms(req.down_ms, s.down);
    s.warmup = ms(req.warmup_ms, s.warmup);
    s.after = ms(req.after_ms, s.after);
    s.timeout = ms(req.timeout_ms, s.timeout);
    if req.writers > 0 {
        s.writers = req.writers;
    }
    if s.down > crate::fault::MAX_DOWN {
        return Err(Status::invalid_argument(format!(
            "down_ms may be at most {}",
            crate::fault::MAX_DOWN.as_millis()
        )));
    }
    Ok((kind, s))
}

/// Starts drill `req` for a caller; its events arrive on the returned channel.
pub(crate) async fn start(
    state: Arc<NodeState>,
    req: v1::DrillRequest,
) -> Result<mpsc::Receiver<Result<v1::DrillEvent, Status>>, Status> {
    let host = state.plane.config().grpc_addr.clone();
    let (kind, settings) = settings(&req, &host)?;
    let table = if req.table.trim().is_empty() {
        "hawser_drill".to_string()
    } else {
        req.table.trim().to_string()
    };
    let cluster = drill::leader_status(&host)
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let plan = drill::plan(&cluster, kind, req.scheme.trim(), &table)
        .map_err(Status::failed_precondition)?;
    let (tx, rx) = mpsc::channel(64);
    let runner = state.config.name.clone();
    let started = Instant::now();
    let event = move |e: v1::drill_event::Event| v1::DrillEvent {
        at_ms: started.elapsed().as_millis() as u64,
        runner: runner.clone(),
        event: Some(e),
    };
    if req.dry_run {
        let report = v1::DrillReport {
            kind: kind.name().into(),
            scheme: plan.scheme.clone(),
            element: plan.element.clone(),
            table: plan.table.clone(),
            plan: plan.describe(settings.down, settings.after),
            dry_run: true,
            held: true,
            ..Default::default()
        };
        let _ = tx
            .send(Ok(event(v1::drill_event::Event::Report(report))))
            .await;
        return Ok(rx);
    }
    let strikes_me = plan
        .target
        .as_ref()
        .is_some_and(|t| t.node == state.node_id.0);
    if strikes_me {
        if req.forwarded {
            return Err(Status::failed_precondition(
                "the drill would strike the node it was passed on to; run it again",
            ));
        }
        // Any other healthy member: the plan checked they all are.
        let other = cluster
            .nodes
            .iter()
            .find(|n| n.id != state.node_id.0 && n.membership != "none" && n.health == "ok")
            .map(|n| (n.store.clone(), n.grpc_addr.clone()))
            .ok_or_else(|| {
                Status::failed_precondition("the drill strikes this node and no other can run it")
            })?;
        info!(to = %other.0, kind = kind.name(), "the drill strikes this node: sent to another");
        let _ = tx
            .send(Ok(event(v1::drill_event::Event::RunOn(other.1))))
            .await;
        return Ok(rx);
    }
    info!(kind = kind.name(), plan = %plan.describe(settings.down, settings.after), "drill");
    tokio::spawn(async move {
        run(plan, settings, tx, event).await;
    });
    Ok(rx)
}

/// Runs the drill to its end whether or not anyone still listens: a switchover drill
/// must move the role back, and a broken promise goes to the log.
async fn run(
    plan: drill::Plan,
    settings: Settings,
    tx: Events,
    event: impl Fn(v1::drill_event::Event) -> v1::DrillEvent + Send + Sync + 'static,
) {
    let event = Arc::new(event);
    let progress = {
        let (tx, event) = (tx.clone(), event.clone());
        move |line: String| {
            // A full channel or a caller gone drops the line, never blocks the drill.
            let _ = tx.try_send(Ok(event(v1::drill_event::Event::Progress(line))));
        }
    };
    match drill::run(plan, &settings, &progress).await {
        Ok(report) => {
            let summary = report.summary(settings.down, settings.after);
            if summary.held {
                info!(kind = %summary.kind, "drill: every promise held");
            } else {
                warn!(kind = %summary.kind, problems = ?summary.problems, "drill: a promise broke");
            }
            let _ = tx
                .send(Ok(event(v1::drill_event::Event::Report(summary))))
                .await;
        }
        Err(e) => {
            warn!(error = %e, "drill failed");
            let _ = tx.send(Err(Status::aborted(e.to_string()))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_takes_the_clis_defaults_for_what_it_leaves_out() {
        let req = v1::DrillRequest {
            kind: "Kill-Master".into(),
            scheme: "r".into(),
            writers: 2,
            down_ms: 1500,
            ..Default::default()
        };
        let (kind, s) = settings(&req, "h:1").unwrap();
        assert_eq!(kind, Kind::KillMaster);
        assert_eq!((s.writers, s.down), (2, Duration::from_millis(1500)));
        assert_eq!(
            (s.warmup, s.after, s.timeout),
            (
                Duration::from_secs(1),
                Duration::from_secs(2),
                Duration::from_secs(60)
            )
        );
        let bad = settings(
            &v1::DrillRequest {
                kind: "explode".into(),
                ..req.clone()
            },
            "h:1",
        )
        .unwrap_err();
        assert!(
            bad.message().contains("kill-master, pause-master"),
            "{bad:?}"
        );
        let long = settings(
            &v1::DrillRequest {
                down_ms: 3_600_000,
                ..req
            },
            "h:1",
        )
        .unwrap_err();
        assert!(long.message().contains("at most"), "{long:?}");
    }
}
