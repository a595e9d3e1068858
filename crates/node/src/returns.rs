//! The node's return services: commits on this master wait for the acknowledgements
//! the replication scheme asks for (DESIGN.md §3).
//!
//! ```text
//!  client commit ─► Txn::commit_holding(hide = any TWOSAFE) ─► log + rows, flushed
//!                      │ hold: wake senders, ReturnTracker::begin(seq, awaits) ─► wait
//!  sender (acks per origin) ─► its AckHook, on the sender's task ─► ReturnTracker::ack
//!  timer (next deadline) ─► ReturnTracker::tick ─► releases with 8170, DISABLE RETURN
//!                      └─ released ─► locks freed, rows visible ─► reply (+ TT8170)
//! ```
//!
//! The rules live in the pure [`ReturnTracker`] of `hawser-stream`; this module only
//! moves time and messages into it and releases the commits it says to release. The
//! data plane task ([`crate::dataplane`]) gives it the routes (which subscriber each
//! table's commits wait for, at which level) and the master's STORE settings each time
//! it re-plans, and starts an ack watcher beside each sender.
//!
//! A TWOSAFE commit holds its row locks and hides its rows from readers until it is
//! released, whatever the outcome (acknowledged, timed out, disabled). hawser commits
//! locally before it waits, so LOCAL COMMIT ACTION NO ACTION and COMMIT end the same
//! way here — the transaction is committed and visible after the timeout — and only
//! the 8170 message says which action the scheme named (see `docs/stream.md`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use hawser_core::{Ident, NodeId};
use hawser_scheme::ast::LocalAction;
use hawser_sql::call::Call;
use hawser_sql::{
    BoxFuture, ColumnMeta, Committed, ReplicationError, ReturnServices, StatementResult,
    SyncSettings, Warning,
};
use hawser_store::{CommitInfo, StoreError, Txn};
use hawser_stream::returns::{
    AckMarks, ReplicationState, ReturnEvent, ReturnLevel, ReturnOutcome, ReturnRoutes,
    ReturnSettings, ReturnTracker, ReturnWait, Step, SyncOptions,
};
use hawser_stream::{AckHook, SenderStatus};
use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::dataplane::Senders;

/// Counters of released commits, for status and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReturnCounts {
    pub(crate) acknowledged: u64,
    pub(crate) timed_out: u64,
    pub(crate) disabled: u64,
    pub(crate) not_requested: u64,
    pub(crate) disable_events: u64,
    pub(crate) resume_events: u64,
}

/// How many return-service commits `ttRepXactStatus` can be asked about.
const REMEMBERED_COMMITS: usize = 65_536;

struct Inner {
    tracker: ReturnTracker,
    routes: ReturnRoutes,
    /// Commits waiting, by seq of this origin.
    waiters: HashMap<u64, oneshot::Sender<ReturnOutcome>>,
    /// Subscribers (with their strongest level) some route names, for status.
    subscribers: BTreeMap<Ident, ReturnLevel>,
    /// The subscribers recent commits waited for, by seq (`ttRepXactStatus`); the
    /// oldest are forgotten past [`REMEMBERED_COMMITS`].
    awaited: BTreeMap<u64, Vec<Ident>>,
    counts: ReturnCounts,
    /// The deadline the timer task sleeps until (`None`: none, it waits for a wake).
    timer_armed: Option<Instant>,
}

/// This node's return services; one per node, shared by the SQL engine and the
/// typed write path.
pub(crate) struct Returns {
    inner: Mutex<Inner>,
    node_id: NodeId,
    senders: Senders,
    /// Wakes the timer when a new deadline may be earlier.
    timer: Notify,
}

/// What a commit through the return services ended with.
pub(crate) struct ReturnCommit {
    pub(crate) info: CommitInfo,
    pub(crate) outcome: ReturnOutcome,
    /// Whether a return service applied (the commit had subscribers to wait for).
    pub(crate) waited: bool,
}

impl Returns {
    pub(crate) fn new(node_id: NodeId, senders: Senders) -> Self {
        Self {
            inner: Mutex::new(Inner {
                tracker: ReturnTracker::new(ReturnSettings::default()),
                routes: ReturnRoutes::default(),
                waiters: HashMap::new(),
                subscribers: BTreeMap::new(),
                awaited: BTreeMap::new(),
                counts: ReturnCounts::default(),
                timer_armed: None,
            }),
            node_id,
            senders,
            timer: Notify::new(),
        }
    }

    /// New routes and STORE settings from the data plane's latest plan.
    pub(crate) fn set_plan(
        &self,
        routes: ReturnRoutes,
        subscribers: BTreeMap<Ident, ReturnLevel>,
        settings: ReturnSettings,
    ) {
        let mut inner = self.inner.lock();
        if inner.routes != routes {
            inner.routes = routes;
        }
        inner.subscribers = subscribers;
        if *inner.tracker.settings() != settings {
            inner.tracker.set_settings(settings);
        }
    }

    /// The receiver states of this master's subscribers (START when absent).
    pub(crate) fn set_replication(&self, states: BTreeMap<Ident, ReplicationState>) {
        let mut inner = self.inner.lock();
        let known: Vec<Ident> = inner.subscribers.keys().cloned().collect();
        for sub in known {
            let state = states.get(&sub).copied().unwrap_or_default();
            if inner.tracker.replication_state(&sub) != state {
                info!(subscriber = %sub, ?state, "receiver state");
                let step = inner.tracker.set_replication(&sub, state);
                Self::dispatch(&mut inner, step);
            }
        }
    }

    /// Commits `txn`, then waits as the routes and `sync` say.
    pub(crate) async fn commit(
        &self,
        mut txn: Txn,
        sync: SyncOptions,
    ) -> Result<ReturnCommit, StoreError> {
        let tables = txn.written_tables();
        let (awaits, force_durable) = {
            let inner = self.inner.lock();
            (
                inner.routes.awaits(&tables, sync.request_return),
                inner.tracker.durable_commit_forced(),
            )
        };
        if force_durable {
            // DURABLE COMMIT ON: a disabled return service no longer guards this
            // commit, so the master's own flush does.
            txn.force_durable();
        }
        let waited = !awaits.is_empty();
        if waited {
            // The flush's housekeeping waits until the commit is on its way to the
            // subscribers (below), off the time the commit waits for.
            txn.settle_later();
        }
        let db = txn.database().clone();
        let hide = awaits.iter().any(|a| a.level == ReturnLevel::Twosafe)
            && sync.return_wait != Some(ReturnWait::NoWait);
        let (info, outcome) = txn
            .commit_holding(hide, |info| async move {
                // The senders ship this commit now, not at their next poll.
                crate::dataplane::wake_all(&self.senders);
                if awaits.is_empty() {
                    self.inner.lock().counts.not_requested += 1;
                    return ReturnOutcome::NotRequested;
                }
                let (tx, rx) = oneshot::channel();
                let seq = info.gtid.seq;
                {
                    let mut inner = self.inner.lock();
                    inner.waiters.insert(seq, tx);
                    let subs = awaits.iter().map(|a| a.subscriber.clone()).collect();
                    inner.awaited.insert(seq, subs);
                    if inner.awaited.len() > REMEMBERED_COMMITS {
                        inner.awaited.pop_first();
                    }
                    let step = inner.tracker.begin(seq, awaits, &sync, Instant::now());
                    Self::dispatch(&mut inner, step);
                    // The timer needs waking only for an earlier deadline than the one
                    // it sleeps until (commits usually share one wait time, so a new
                    // commit's deadline comes after those already waiting).
                    let next = inner.tracker.next_deadline();
                    if next.is_some_and(|n| inner.timer_armed.is_none_or(|armed| n < armed)) {
                        inner.timer_armed = next;
                        self.timer.notify_one();
                    }
                }
                // The senders just woken run first (on this worker: the yield lets
                // them), then the flush's housekeeping while the subscribers work.
                tokio::task::yield_now().await;
                if let Err(e) = db.settle() {
                    tracing::warn!(error = %e, "settling a commit's flush failed");
                }
                // A dropped sender means the node is shutting down: nothing to wait for.
                rx.await.unwrap_or(ReturnOutcome::NotRequested)
            })
            .await?;
        Ok(ReturnCommit {
            info,
            outcome: outcome.unwrap_or(ReturnOutcome::NotRequested),
            waited,
        })
    }

    /// A subscriber acknowledged this origin's commits up to `marks`.
    pub(crate) fn ack(&self, subscriber: &Ident, marks: AckMarks) {
        let mut inner = self.inner.lock();
        let step = inner.tracker.ack(subscriber, marks, Instant::now());
        Self::dispatch(&mut inner, step);
    }

    /// Releases what a step released and records its events.
    fn dispatch(inner: &mut Inner, step: Step) {
        for r in step.released {
            match &r.outcome {
                ReturnOutcome::NotRequested => inner.counts.not_requested += 1,
                ReturnOutcome::Acknowledged => inner.counts.acknowledged += 1,
                ReturnOutcome::TimedOut { pending, .. } => {
                    inner.counts.timed_out += 1;
                    for p in pending {
                        metrics::counter!("hawser_return_timeouts_total", "subscriber" => p.to_string())
                            .increment(1);
                    }
                }
                ReturnOutcome::ReturnDisabled { .. } => inner.counts.disabled += 1,
            }
            metrics::counter!("hawser_return_commits_total", "outcome" => outcome_label(&r.outcome))
                .increment(1);
            if let Some(tx) = inner.waiters.remove(&r.seq) {
                // The committing client may be gone; its commit stands either way.
                let _ = tx.send(r.outcome);
            }
        }
        for e in step.events {
            match &e {
                ReturnEvent::Disabled {
                    subscriber,
                    timeouts,
                } => {
                    inner.counts.disable_events += 1;
                    metrics::counter!("hawser_return_disable_events_total", "subscriber" => subscriber.to_string())
                        .increment(1);
                    warn!(%subscriber, timeouts, "return service disabled (DISABLE RETURN)");
                }
                ReturnEvent::Resumed {
                    subscriber,
                    latency,
                } => {
                    inner.counts.resume_events += 1;
                    metrics::counter!("hawser_return_resume_events_total", "subscriber" => subscriber.to_string())
                        .increment(1);
                    info!(%subscriber, ?latency, "return service resumed (RESUME RETURN)");
                }
            }
        }
        metrics::gauge!("hawser_return_waiting").set(inner.tracker.waiting() as f64);
    }

    /// Releases timed-out commits at their deadlines until `shutdown`.
    pub(crate) async fn run_timer(&self, shutdown: CancellationToken) {
        loop {
            let deadline = {
                let mut inner = self.inner.lock();
                let next = inner.tracker.next_deadline();
                inner.timer_armed = next;
                next
            };
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.timer.notified() => continue,
                _ = sleep => {}
            }
            let mut inner = self.inner.lock();
            let step = inner.tracker.tick(Instant::now());
            Self::dispatch(&mut inner, step);
        }
        // Shutting down: release every waiting commit (their clients get no warning;
        // the commits are durable here).
        self.inner.lock().waiters.clear();
    }

    /// The hook through which a sender to `subscriber` feeds its acknowledgements of
    /// this origin's commits to the tracker, on the sender's task.
    pub(crate) fn ack_hook(self: &Arc<Self>, subscriber: Ident) -> AckHook {
        let returns = Arc::downgrade(self);
        AckHook(Arc::new(move |s: &SenderStatus| {
            let Some(returns) = returns.upgrade() else {
                return;
            };
            let marks = AckMarks {
                receipt: s.acked_durable.get(&returns.node_id).copied().unwrap_or(0),
                commit: s.acked_applied.get(&returns.node_id).copied().unwrap_or(0),
            };
            if marks != AckMarks::default() {
                returns.ack(&subscriber, marks);
            }
        }))
    }

    /// How long a commit with `opts` waits (for the 8170 message).
    pub(crate) fn wait_for(&self, opts: &SyncOptions) -> ReturnWait {
        opts.return_wait
            .unwrap_or_else(|| self.inner.lock().tracker.settings().wait)
    }

    /// The return services as JSON (HTTP `/replication`, `hawser status`).
    pub(crate) fn json(&self) -> serde_json::Value {
        let inner = self.inner.lock();
        let c = inner.counts;
        let subscribers: Vec<serde_json::Value> = inner
            .subscribers
            .iter()
            .map(|(sub, level)| {
                let marks = inner.tracker.marks(sub);
                serde_json::json!({
                    "subscriber": sub.to_string(),
                    "level": level_name(*level),
                    "disabled": inner.tracker.is_disabled(sub),
                    "timeouts": inner.tracker.consecutive_timeouts(sub),
                    "receipt_seq": marks.receipt,
                    "commit_seq": marks.commit,
                })
            })
            .collect();
        let s = inner.tracker.settings();
        serde_json::json!({
            "waiting": inner.tracker.waiting(),
            "acknowledged": c.acknowledged,
            "timed_out": c.timed_out,
            "released_disabled": c.disabled,
            "not_requested": c.not_requested,
            "disable_events": c.disable_events,
            "resume_events": c.resume_events,
            "return_wait": match s.wait {
                ReturnWait::NoWait => serde_json::json!(0),
                ReturnWait::For(d) => serde_json::json!(d.as_secs_f64()),
                ReturnWait::Forever => serde_json::json!(-1),
            },
            "subscribers": subscribers,
        })
    }

    /// `ttRepXactStatus` of commit `seq`: its subscribers' states, or `None` when
    /// no return service applied to it (or it is too old to be remembered).
    fn xact_status(&self, seq: u64) -> Option<Vec<(Ident, &'static str)>> {
        let inner = self.inner.lock();
        let subs = inner.awaited.get(&seq)?;
        Some(
            subs.iter()
                .map(|sub| (sub.clone(), inner.tracker.xact_status(seq, sub).code()))
                .collect(),
        )
    }
}

fn level_name(l: ReturnLevel) -> &'static str {
    match l {
        ReturnLevel::Receipt => "receipt",
        ReturnLevel::Twosafe => "twosafe",
    }
}

pub(crate) fn outcome_label(o: &ReturnOutcome) -> &'static str {
    match o {
        ReturnOutcome::NotRequested => "none",
        ReturnOutcome::Acknowledged => "acknowledged",
        ReturnOutcome::TimedOut { .. } => "timed_out",
        ReturnOutcome::ReturnDisabled { .. } => "disabled",
    }
}

/// The warning a committing client gets for `outcome`, if any.
pub(crate) fn outcome_warning(outcome: &ReturnOutcome, wait: ReturnWait) -> Option<Warning> {
    let ReturnOutcome::TimedOut {
        pending,
        local_action,
    } = outcome
    else {
        return None;
    };
    let who = pending
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let within = match wait {
        ReturnWait::For(d) => format!(" within {}s", d.as_secs_f64()),
        ReturnWait::NoWait | ReturnWait::Forever => String::new(),
    };
    let action = match local_action {
        Some(LocalAction::NoAction) => {
            " (LOCAL COMMIT ACTION NO ACTION: hawser has committed locally before waiting, \
             so the transaction stands; COMMIT again is not needed)"
        }
        Some(LocalAction::Commit) => " (LOCAL COMMIT ACTION COMMIT)",
        None => "",
    };
    Some(Warning {
        code: "TT8170".into(),
        message: format!(
            "return service failed: subscriber {who} did not acknowledge{within}; the \
             transaction is committed here and will be replicated when the subscriber \
             catches up{action}"
        ),
    })
}

/// The session settings as the tracker takes them.
pub(crate) fn sync_options(s: &SyncSettings) -> SyncOptions {
    SyncOptions {
        request_return: s.request_return,
        return_wait: s.return_wait_s.map(ReturnWait::from_seconds),
        local_action: s.local_action.map(|a| {
            if a == 2 {
                LocalAction::Commit
            } else {
                LocalAction::NoAction
            }
        }),
    }
}

/// The SQL engine's hook: commits and the node's built-in procedures.
pub(crate) struct SqlReturns {
    pub(crate) returns: std::sync::Arc<Returns>,
    pub(crate) waits: std::sync::Arc<dyn SubscriberWait>,
}

/// `ttRepSubscriberWait`: waits until a subscriber has acknowledged everything this
/// node committed before the call (implemented by the data plane).
pub(crate) trait SubscriberWait: Send + Sync {
    fn wait<'a>(
        &'a self,
        scheme: Option<String>,
        subscriber: Option<String>,
        wait: ReturnWait,
    ) -> BoxFuture<'a, Result<bool, ReplicationError>>;
}

impl ReturnServices for SqlReturns {
    fn commit<'a>(
        &'a self,
        txn: Txn,
        sync: SyncSettings,
    ) -> BoxFuture<'a, Result<Committed, StoreError>> {
        Box::pin(async move {
            let opts = sync_options(&sync);
            let wait = self.returns.wait_for(&opts);
            let c = self.returns.commit(txn, opts).await?;
            Ok(Committed {
                info: c.info,
                warnings: outcome_warning(&c.outcome, wait).into_iter().collect(),
                token: c.waited.then_some(c.info.gtid.seq),
            })
        })
    }

    fn call<'a>(
        &'a self,
        call: &'a Call,
        token: Option<u64>,
    ) -> BoxFuture<'a, Result<StatementResult, ReplicationError>> {
        Box::pin(async move {
            match call.name.as_str() {
                "ttrepxactstatus" => self.xact_status(call, token),
                "ttrepsyncsubscriberstatus" => self.subscriber_status(call),
                "ttrepsubscriberwait" => self.subscriber_wait(call).await,
                _ => Err(ReplicationError {
                    code: "42883".into(),
                    message: format!(
                        "procedure {} does not exist; hawser runs ttRepSyncSet, ttRepSyncGet, \
                         ttRepXactTokenGet, ttRepXactStatus, ttRepSyncSubscriberStatus and \
                         ttRepSubscriberWait",
                        call.written
                    ),
                }),
            }
        })
    }

    fn defaults(&self) -> (i64, i64) {
        let inner = self.returns.inner.lock();
        let s = inner.tracker.settings();
        let wait = match s.wait {
            ReturnWait::NoWait => 0,
            ReturnWait::For(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            ReturnWait::Forever => -1,
        };
        let action = match s.local_action {
            LocalAction::NoAction => 1,
            LocalAction::Commit => 2,
        };
        (wait, action)
    }
}

fn bad_argument(message: String) -> ReplicationError {
    ReplicationError {
        code: "22023".into(),
        message,
    }
}

/// A text argument, or `None` for NULL.
fn text_arg(call: &Call, i: usize, what: &str) -> Result<Option<String>, ReplicationError> {
    match call.arg(i) {
        hawser_core::Value::Null => Ok(None),
        hawser_core::Value::Text(t) => Ok(Some(t.clone())),
        other => Err(bad_argument(format!(
            "{}: {what} must be a quoted name or NULL, not {other:?}",
            call.written
        ))),
    }
}

impl SqlReturns {
    /// `ttRepXactStatus([xactId])`: one row per subscriber with NS / RC / CT / AP.
    fn xact_status(
        &self,
        call: &Call,
        token: Option<u64>,
    ) -> Result<StatementResult, ReplicationError> {
        let seq = match call.arg(0) {
            hawser_core::Value::Null => token.ok_or_else(|| {
                bad_argument(
                    "ttRepXactStatus: this session has committed no transaction that a \
                     return service applied to; pass a token from ttRepXactTokenGet"
                        .into(),
                )
            })?,
            hawser_core::Value::Bytes(b) => {
                let bytes: [u8; 8] = b.as_slice().try_into().map_err(|_| {
                    bad_argument(format!(
                        "ttRepXactStatus: {} bytes is not a token from ttRepXactTokenGet",
                        b.len()
                    ))
                })?;
                u64::from_be_bytes(bytes)
            }
            hawser_core::Value::Int(i) if *i > 0 => i.unsigned_abs(),
            other => {
                return Err(bad_argument(format!(
                    "ttRepXactStatus: {other:?} is not a token from ttRepXactTokenGet"
                )))
            }
        };
        let mut result = StatementResult::tag("CALL");
        result.columns = vec![
            ColumnMeta {
                name: "subscriberName".into(),
                data_type: "VARCHAR(61)".into(),
            },
            ColumnMeta {
                name: "state".into(),
                data_type: "CHAR(2)".into(),
            },
            ColumnMeta {
                name: "errorString".into(),
                data_type: "VARCHAR(2000)".into(),
            },
        ];
        let states = self.returns.xact_status(seq).ok_or_else(|| {
            bad_argument(format!(
                "ttRepXactStatus: no return service applied to transaction {seq} of this \
                 node, or it is older than the last {REMEMBERED_COMMITS} that did"
            ))
        })?;
        result.rows = states
            .into_iter()
            .map(|(sub, state)| {
                vec![
                    hawser_core::Value::Text(sub.to_string()),
                    hawser_core::Value::Text(state.into()),
                    hawser_core::Value::Null,
                ]
            })
            .collect();
        result.rows_affected = result.rows.len() as u64;
        Ok(result)
    }

    /// `ttRepSyncSubscriberStatus(subscriber [, host])`: 1 when DISABLE RETURN turned
    /// the subscriber's return service off.
    fn subscriber_status(&self, call: &Call) -> Result<StatementResult, ReplicationError> {
        let name = text_arg(call, 0, "subscriber")?.ok_or_else(|| {
            bad_argument("ttRepSyncSubscriberStatus needs a subscriber name".into())
        })?;
        let sub = Ident::unquoted(&name);
        let inner = self.returns.inner.lock();
        if !inner.subscribers.contains_key(&sub) {
            return Err(bad_argument(format!(
                "ttRepSyncSubscriberStatus: {sub} is not a return-service subscriber of this \
                 store"
            )));
        }
        let mut result = StatementResult::tag("CALL");
        result.columns = vec![ColumnMeta {
            name: "disabled".into(),
            data_type: "INTEGER".into(),
        }];
        result.rows = vec![vec![hawser_core::Value::Int(i64::from(
            inner.tracker.is_disabled(&sub),
        ))]];
        result.rows_affected = 1;
        Ok(result)
    }

    /// `ttRepSubscriberWait(scheme, owner, store, host, waitTime)`: 0x00 when caught
    /// up, 0x01 when not within `waitTime` seconds.
    async fn subscriber_wait(&self, call: &Call) -> Result<StatementResult, ReplicationError> {
        let scheme = text_arg(call, 0, "replicationName")?;
        let subscriber = text_arg(call, 2, "subscriberStoreName")?;
        let wait = match call.arg(4) {
            hawser_core::Value::Int(-1) => ReturnWait::Forever,
            hawser_core::Value::Int(s) if *s >= 0 => ReturnWait::from_seconds(*s),
            other => {
                return Err(bad_argument(format!(
                    "ttRepSubscriberWait: waitTime must be seconds >= 0 or -1 (forever), not \
                     {other:?}"
                )))
            }
        };
        let caught_up = self.waits.wait(scheme, subscriber, wait).await?;
        let mut result = StatementResult::tag("CALL");
        result.columns = vec![ColumnMeta {
            name: "timeOut".into(),
            data_type: "BINARY(1)".into(),
        }];
        result.rows = vec![vec![hawser_core::Value::Bytes(vec![u8::from(!caught_up)])]];
        result.rows_affected = 1;
        Ok(result)
    }
}
