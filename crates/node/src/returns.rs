//! The node's return services: commits on this master wait for the acknowledgements
//! the replication scheme asks for (docs/design.md §3).
//!
//! ```text
//!  client commit ─► Txn::commit_held(hide = any TWOSAFE) ─► log + rows, flushed
//!                      │ Committed held: wake senders, ReturnTracker::begin(seq, awaits) ─► wait
//!  sender (acks per origin) ─► its AckHook, on the sender's task ─► ReturnTracker::ack
//!  timer (next deadline) ─► ReturnTracker::tick ─► releases with 8170, DISABLE RETURN
//!                      └─ released: Committed dropped ─► locks freed, rows visible ─► reply (+ TT8170)
//! ```
//!
//! The rules live in the pure [`ReturnTracker`] of `hawser-stream`; this module only
//! moves time and messages into it and releases the commits it says to release. The
//! data plane task ([`crate::dataplane`]) gives it the routes (which subscriber each
//! table's commits wait for, at which level) and the master's STORE settings each time
//! it re-plans, and starts an ack watcher beside each sender.
//!
//! A TWOSAFE commit holds its row locks and hides its rows from readers until it is
//! released, whatever the outcome (acknowledged, timed out, disabled). A SQL session's
//! TWOSAFE commit that times out under LOCAL COMMIT ACTION NO ACTION is not released: it
//! comes back to the session open ([`SessionCommit::Open`]), its hold kept in the future
//! the session keeps, until the session COMMITs again and the subscribers have it, or
//! gives it up (see `docs/stream.md`, "LOCAL COMMIT ACTION").

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use hawser_core::{Ident, NodeId};
use hawser_proto::v1;
use hawser_scheme::ast::LocalAction;
use hawser_sql::call::Call;
use hawser_sql::{
    BoxFuture, ColumnMeta, Committed, OpenCommit, ReplicationError, ReturnServices,
    StatementResult, SyncSettings, Warning,
};
use hawser_store::{CommitInfo, Database, StoreError, Txn};
use hawser_stream::returns::{
    AckMarks, ReplicationState, ReturnEvent, ReturnLevel, ReturnOutcome, ReturnRoutes,
    ReturnSettings, ReturnTracker, ReturnWait, Step, SyncOptions,
};
use hawser_stream::{AckHook, SenderStatus};
use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::senders::Senders;

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
    /// Sessions' commits that may be left open, by seq: told when they are.
    opened: HashMap<u64, (CommitInfo, oneshot::Sender<(CommitInfo, ReturnOutcome)>)>,
    /// Commits left open and not yet released (counted when left open).
    left_open: std::collections::HashSet<u64>,
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
                opened: HashMap::new(),
                left_open: std::collections::HashSet::new(),
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
        // Subscribers this node no longer sends to (the master role moved away, or the
        // scheme dropped them) will never acknowledge: their waiting commits go now,
        // not at RETURN WAIT TIME.
        let gone: std::collections::BTreeSet<Ident> = inner
            .subscribers
            .keys()
            .filter(|s| !subscribers.contains_key(*s))
            .cloned()
            .collect();
        if !gone.is_empty() {
            let step = inner.tracker.abandon(&gone);
            if !step.released.is_empty() || !step.left_open.is_empty() {
                info!(
                    subscribers = ?gone,
                    released = step.released.len() + step.left_open.len(),
                    "no longer sending to these subscribers: commits waiting for them released"
                );
            }
            Self::dispatch(&mut inner, step);
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

    /// Commits `txn`, then waits as the routes and `sync` say (the typed API: a
    /// TWOSAFE commit that times out is released, whatever LOCAL COMMIT ACTION says —
    /// its caller cannot COMMIT again).
    pub(crate) async fn commit(
        self: &Arc<Self>,
        txn: Txn,
        mut sync: SyncOptions,
    ) -> Result<ReturnCommit, StoreError> {
        sync.keep_open = false;
        let (holding, waited) = self.holding(txn, sync, None);
        let (info, outcome) = holding.await?;
        Ok(ReturnCommit {
            info,
            outcome: outcome.unwrap_or(ReturnOutcome::NotRequested),
            waited,
        })
    }

    /// [`Returns::commit`] for a SQL session, which can COMMIT again: a TWOSAFE commit
    /// that times out under LOCAL COMMIT ACTION NO ACTION comes back
    /// [`SessionCommit::Open`], still holding its rows, for the session to wait on
    /// again or give up.
    pub(crate) async fn commit_in_session(
        self: &Arc<Self>,
        txn: Txn,
        mut sync: SyncOptions,
    ) -> Result<SessionCommit, StoreError> {
        sync.keep_open = true;
        let (open_tx, open_rx) = oneshot::channel();
        let (mut holding, waited) = self.holding(txn, sync, Some(open_tx));
        tokio::select! {
            biased;
            done = &mut holding => {
                let (info, outcome) = done?;
                Ok(SessionCommit::Done(ReturnCommit {
                    info,
                    outcome: outcome.unwrap_or(ReturnOutcome::NotRequested),
                    waited,
                }))
            }
            Ok((info, outcome)) = open_rx => Ok(SessionCommit::Open {
                info,
                outcome,
                rest: Box::pin(async move {
                    match holding.await {
                        Ok((_, outcome)) => outcome.unwrap_or(ReturnOutcome::NotRequested),
                        Err(_) => ReturnOutcome::NotRequested,
                    }
                }),
            }),
        }
    }

    /// The commit of `txn` and its wait, as a future of its own (it owns what it
    /// needs, so a session can keep it past the COMMIT that left it open), and whether
    /// a return service applies. `opened` hears of the commit when it is left open.
    fn holding(
        self: &Arc<Self>,
        mut txn: Txn,
        sync: SyncOptions,
        opened: Option<oneshot::Sender<(CommitInfo, ReturnOutcome)>>,
    ) -> (Holding, bool) {
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
        // The flush's housekeeping (moving the flushed batches into sled's tree) is
        // off the time the commit waits for: a waited commit settles once it is on its
        // way to the subscribers (below), any other once its reply has gone.
        txn.settle_later();
        let db = txn.database().clone();
        let hide = awaits.iter().any(|a| a.level == ReturnLevel::Twosafe)
            && sync.return_wait != Some(ReturnWait::NoWait);
        let this = self.clone();
        let leased = txn.leased();
        // Counted from before the commit to its acknowledgement: a master draining for
        // a switchover gives its lease up only once no such commit is under way.
        let lease_hold = leased.then(|| db.lease().hold());
        // The lease the commit is made under: it is acknowledged only if that same
        // lease still holds then.
        let lease_generation = db.lease().generation();
        let holding = async move {
            let _lease_hold = lease_hold;
            let lease_db = db.clone();
            let held = txn.commit_held(hide).await?;
            let info = held.info();
            // A transaction that wrote nothing has nothing to wait for.
            let outcome = if info.is_empty() {
                None
            } else {
                Some(this.wait_for_returns(info, awaits, sync, opened, db).await)
            };
            // Acknowledged as far as the store goes: the rows are shown again and the
            // row locks released, only now that whatever it waited for has happened.
            drop(held);
            let committed = (info, outcome);
            // The lease may have run out while the commit flushed and waited: a master
            // that may have been deposed meanwhile does not acknowledge it.
            if leased {
                if let Err(reason) = lease_db
                    .lease()
                    .check_held(lease_generation, Instant::now())
                {
                    return Err(StoreError::OutcomeUnknown {
                        gtid: committed.0.gtid,
                        reason,
                    });
                }
            }
            Ok(committed)
        };
        (Box::pin(holding), waited)
    }

    /// What a commit waits for past its flush, with its rows held: wakes the senders so
    /// that they ship it now, then waits for the acknowledgements `awaits` names (or
    /// the tracker's timeout or disable), and says how that ended.
    async fn wait_for_returns(
        self: Arc<Self>,
        info: CommitInfo,
        awaits: Vec<hawser_stream::returns::Await>,
        sync: SyncOptions,
        opened: Option<oneshot::Sender<(CommitInfo, ReturnOutcome)>>,
        db: Database,
    ) -> ReturnOutcome {
        // The senders ship this commit now, not at their next poll.
        crate::senders::wake_all(&self.senders);
        if awaits.is_empty() {
            self.inner.lock().counts.not_requested += 1;
            if info.durable {
                // A commit nobody flushed left nothing to settle.
                settle_after_reply(db);
            }
            return ReturnOutcome::NotRequested;
        }
        let (tx, rx) = oneshot::channel();
        let seq = info.gtid.seq;
        {
            let mut inner = self.inner.lock();
            inner.waiters.insert(seq, tx);
            if let Some(opened) = opened {
                inner.opened.insert(seq, (info, opened));
            }
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
        // A session that drops a commit left open commits it here (the hold
        // ends with this future): the tracker stops waiting for it.
        let mut give_up = GiveUpOnDrop {
            returns: sync.keep_open.then(|| self.clone()),
            seq,
        };
        // The senders just woken run first (on this worker: the yield lets
        // them), then the flush's housekeeping while the subscribers work.
        tokio::task::yield_now().await;
        settle(&db);
        // A dropped sender means the node is shutting down: nothing to wait for.
        let outcome = rx.await.unwrap_or(ReturnOutcome::NotRequested);
        give_up.returns = None;
        outcome
    }

    /// Ends the wait of a commit left open whose session gave it up.
    fn give_up(&self, seq: u64) {
        let mut inner = self.inner.lock();
        inner.waiters.remove(&seq);
        inner.opened.remove(&seq);
        let step = inner.tracker.give_up(seq);
        Self::dispatch(&mut inner, step);
    }

    /// A subscriber acknowledged this origin's commits up to `marks`.
    pub(crate) fn ack(&self, subscriber: &Ident, marks: AckMarks) {
        let mut inner = self.inner.lock();
        let step = inner.tracker.ack(subscriber, marks, Instant::now());
        Self::dispatch(&mut inner, step);
    }

    /// Releases what a step released and records its events.
    fn dispatch(inner: &mut Inner, step: Step) {
        for r in step.left_open {
            // Counted as timed out now; its release later is not counted again.
            inner.counts.timed_out += 1;
            inner.left_open.insert(r.seq);
            count_outcome(&r.outcome);
            if let Some((info, tx)) = inner.opened.remove(&r.seq) {
                let _ = tx.send((info, r.outcome));
            }
        }
        for r in step.released {
            inner.opened.remove(&r.seq);
            if inner.left_open.remove(&r.seq) {
                if let Some(tx) = inner.waiters.remove(&r.seq) {
                    let _ = tx.send(r.outcome);
                }
                continue;
            }
            match &r.outcome {
                ReturnOutcome::NotRequested => inner.counts.not_requested += 1,
                ReturnOutcome::Acknowledged => inner.counts.acknowledged += 1,
                ReturnOutcome::TimedOut { .. } => inner.counts.timed_out += 1,
                ReturnOutcome::ReturnDisabled { .. } => inner.counts.disabled += 1,
            }
            count_outcome(&r.outcome);
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

    /// The return services as status shows them (HTTP `/replication`, `hawser status`).
    pub(crate) fn status(&self) -> v1::ReturnServices {
        let inner = self.inner.lock();
        let c = inner.counts;
        let subscribers = inner
            .subscribers
            .iter()
            .map(|(sub, level)| {
                let marks = inner.tracker.marks(sub);
                v1::ReturnSubscriber {
                    subscriber: sub.to_string(),
                    level: level_name(*level).into(),
                    disabled: inner.tracker.is_disabled(sub),
                    timeouts: inner.tracker.consecutive_timeouts(sub),
                    receipt_seq: marks.receipt,
                    commit_seq: marks.commit,
                }
            })
            .collect();
        v1::ReturnServices {
            waiting: inner.tracker.waiting() as u64,
            acknowledged: c.acknowledged,
            timed_out: c.timed_out,
            released_disabled: c.disabled,
            not_requested: c.not_requested,
            disable_events: c.disable_events,
            resume_events: c.resume_events,
            return_wait: match inner.tracker.settings().wait {
                ReturnWait::NoWait => 0.0,
                ReturnWait::For(d) => d.as_secs_f64(),
                ReturnWait::Forever => -1.0,
            },
            subscribers,
        }
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

/// Moves a commit's flushed batches into sled once its reply is on its way: a task of
/// its own that first lets the tasks already woken run (the connection's, which writes
/// the reply). A commit no return service waits on has nothing else to overlap the move
/// with, and its client waited for it. If the task never runs, the next flush moves
/// them (past a bound, `hawser_store_forced_moves_total`).
fn settle_after_reply(db: Database) {
    tokio::spawn(async move {
        tokio::task::yield_now().await;
        settle(&db);
    });
}

/// Does the flush's housekeeping a commit left for later ([`Txn::settle_later`]).
fn settle(db: &Database) {
    if let Err(e) = db.settle() {
        tracing::warn!(error = %e, "settling a commit's flush failed");
    }
}

/// The metrics of one commit's outcome.
fn count_outcome(outcome: &ReturnOutcome) {
    if let ReturnOutcome::TimedOut { pending, .. } = outcome {
        for p in pending {
            metrics::counter!("hawser_return_timeouts_total", "subscriber" => p.to_string())
                .increment(1);
        }
    }
    metrics::counter!("hawser_return_commits_total", "outcome" => outcome_label(outcome))
        .increment(1);
}

/// A commit's hold and wait, as [`Returns::holding`] builds it.
type Holding = BoxFuture<'static, Result<(CommitInfo, Option<ReturnOutcome>), StoreError>>;

/// How a session's commit came back from [`Returns::commit_in_session`].
pub(crate) enum SessionCommit {
    Done(ReturnCommit),
    /// Timed out under LOCAL COMMIT ACTION NO ACTION (`outcome`, for the 8170) and left
    /// open: committed here, its rows still hidden and locked. `rest` resolves with the
    /// final outcome once it is released; dropping it commits it here.
    Open {
        info: CommitInfo,
        outcome: ReturnOutcome,
        rest: BoxFuture<'static, ReturnOutcome>,
    },
}

/// Gives a commit left open up when its hold ends before its wait did (the session
/// dropped it); `returns` is `None` once there is nothing to give up.
struct GiveUpOnDrop {
    returns: Option<Arc<Returns>>,
    seq: u64,
}

impl Drop for GiveUpOnDrop {
    fn drop(&mut self) {
        if let Some(r) = self.returns.take() {
            r.give_up(self.seq);
        }
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

/// The warning a session gets for a commit left open ([`SessionCommit::Open`]).
fn left_open_warning(pending: &[String], wait: ReturnWait) -> Option<Warning> {
    let within = match wait {
        ReturnWait::For(d) => format!(" within {}s", d.as_secs_f64()),
        ReturnWait::NoWait | ReturnWait::Forever => String::new(),
    };
    Some(Warning {
        code: "TT8170".into(),
        message: format!(
            "return service failed: subscriber {} did not acknowledge{within}; the \
             transaction stays open (LOCAL COMMIT ACTION NO ACTION): it is committed here \
             and on its way to the subscriber, but its rows stay hidden from other sessions \
             and locked until you COMMIT again and the subscriber has it; CALL \
             ttRepSyncSet(NULL, NULL, 2) before that COMMIT ends it committed here instead",
            pending.join(", ")
        ),
    })
}

/// The warning a committing client gets for `outcome`, if any; `session` when the
/// client is a SQL session (which keeps a commit open under NO ACTION instead of
/// getting this warning for it).
pub(crate) fn outcome_warning(
    outcome: &ReturnOutcome,
    wait: ReturnWait,
    session: bool,
) -> Option<Warning> {
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
        Some(LocalAction::NoAction) if session => " (LOCAL COMMIT ACTION NO ACTION)",
        Some(LocalAction::NoAction) => {
            " (LOCAL COMMIT ACTION NO ACTION applies to SQL sessions, which can COMMIT \
             again; a typed write cannot, so it ends committed here)"
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
        // Set by the commit path that can keep a commit open.
        keep_open: false,
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
            match self.returns.commit_in_session(txn, opts).await? {
                SessionCommit::Done(c) => Ok(Committed {
                    info: c.info,
                    warnings: outcome_warning(&c.outcome, wait, true)
                        .into_iter()
                        .collect(),
                    token: c.waited.then_some(c.info.gtid.seq),
                    open: None,
                }),
                SessionCommit::Open {
                    info,
                    outcome,
                    rest,
                } => {
                    let pending = match &outcome {
                        ReturnOutcome::TimedOut { pending, .. } => {
                            pending.iter().map(ToString::to_string).collect()
                        }
                        _ => Vec::new(),
                    };
                    Ok(Committed {
                        info,
                        warnings: left_open_warning(&pending, wait).into_iter().collect(),
                        token: Some(info.gtid.seq),
                        open: Some(OpenCommit {
                            pending,
                            settled: Box::pin(async move {
                                let outcome = rest.await;
                                outcome_warning(&outcome, wait, true).into_iter().collect()
                            }),
                        }),
                    })
                }
            }
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
