//! Return-service accounting: when a waiting commit is released, and how.
//!
//! A pure state machine (no clock, no I/O, no tasks): the node's commit path tells it
//! about each commit that may wait ([`ReturnTracker::begin`]), the senders tell it
//! about acknowledgements ([`ReturnTracker::ack`]) and the control plane about receiver
//! states ([`ReturnTracker::set_replication`]); a timer calls [`ReturnTracker::tick`]
//! at [`ReturnTracker::next_deadline`]. Every call takes the current time and returns
//! a [`Step`]: the commits to release with their [`ReturnOutcome`], and the return
//! services that were disabled or resumed. The runtime around it only moves time and
//! messages, so every TimesTen rule is unit-tested here without sockets or sleeps.
//!
//! ```text
//!  commit flushed ──begin──►┌──────────────┐──► Release { seq, Acknowledged | TimedOut (8170)
//!  Ack from stream ──ack───►│ ReturnTracker│                 | ReturnDisabled | NotRequested }
//!  receiver state ─────────►│  per-sub hw, │──► Disabled / Resumed (status, metrics, Raft)
//!  timer ──────────tick────►└──────────────┘
//! ```
//!
//! The rules, from TimesTen's return services (docs/design.md §3):
//!
//! * RECEIPT waits for the subscriber's durable receipt, TWOSAFE for its commit; a
//!   commit waits for **every** subscriber its tables' return services name. BY REQUEST
//!   services apply only to transactions that asked (`ttRepSyncSet(0x01, ...)`).
//! * RETURN WAIT TIME bounds the wait (default 10 s, 0 = do not wait; the connection may
//!   override it, −1 = until acknowledged). A commit that times out is released with
//!   warning 8170 and, for TWOSAFE, the LOCAL COMMIT ACTION in force — except a TWOSAFE
//!   commit under LOCAL COMMIT ACTION NO ACTION whose caller can COMMIT again
//!   ([`SyncOptions::keep_open`]): it is *left open* ([`Step::left_open`], 8170 to the
//!   caller) and keeps waiting, without a deadline, until it is acknowledged, its
//!   subscribers stop being waited for, or the caller gives up
//!   ([`ReturnTracker::give_up`]: LOCAL COMMIT ACTION COMMIT, or the session ends).
//! * DISABLE RETURN SUBSCRIBER n: after n consecutive timeouts of one subscriber, commits
//!   stop waiting for it. DISABLE RETURN ALL n: after n consecutive timed-out commits,
//!   commits stop waiting for any subscriber. A commit acknowledged in time resets the
//!   count. Commits already waiting stop waiting for a subscriber the moment it is
//!   disabled.
//! * RESUME RETURN ms: a disabled subscriber is re-enabled once the commit-to-ack
//!   latency of a commit that would have waited for it is below ms. Without it, the
//!   return service stays off until [`ReturnTracker::enable`] (TimesTen: until the
//!   replication agent restarts).
//! * DURABLE COMMIT ON forces durable commits while some return service is disabled.
//! * RETURN SERVICES OFF WHEN REPLICATION STOPPED (RECEIPT's default): while the
//!   subscriber is paused, stopped or failed, commits do not wait for it. ON (TWOSAFE's
//!   default): they keep waiting, and time out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use hawser_core::{Ident, QualName};
use hawser_scheme::ast::{DisableScope, LocalAction, ReturnService};
use hawser_scheme::route::{Link, StoreSettings};

/// How far a commit waits for one subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReturnLevel {
    /// RETURN RECEIPT: the subscriber has the transaction durably.
    Receipt,
    /// RETURN TWOSAFE: the subscriber has committed it.
    Twosafe,
}

/// One subscriber a commit waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Await {
    pub subscriber: Ident,
    pub level: ReturnLevel,
    /// RETURN SERVICES ON WHEN REPLICATION STOPPED: keep waiting while the subscriber's
    /// replication is paused, stopped or failed.
    pub when_stopped: bool,
}

/// How long a commit waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnWait {
    /// RETURN WAIT TIME 0: release at once.
    NoWait,
    For(Duration),
    /// `ttRepSyncSet(.., -1, ..)`: until acknowledged (or the return service is disabled).
    Forever,
}

impl ReturnWait {
    /// The meaning of a `returnWait` in seconds as `ttRepSyncSet` takes it (−1 = forever).
    pub fn from_seconds(s: i64) -> Self {
        match s {
            0 => ReturnWait::NoWait,
            s if s < 0 => ReturnWait::Forever,
            s => ReturnWait::For(Duration::from_secs(s.unsigned_abs())),
        }
    }
}

/// A connection's `ttRepSyncSet` state (or the typed API's commit options).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncOptions {
    /// `requestReturn` 0x01: this transaction asks for the BY REQUEST services.
    pub request_return: bool,
    /// `returnWait`, overriding RETURN WAIT TIME.
    pub return_wait: Option<ReturnWait>,
    /// `localAction`, overriding LOCAL COMMIT ACTION.
    pub local_action: Option<LocalAction>,
    /// The caller can COMMIT again (a SQL session): a TWOSAFE commit that times out
    /// under LOCAL COMMIT ACTION NO ACTION is left open instead of released. The typed
    /// API cannot, so its commits end as under COMMIT.
    pub keep_open: bool,
}

/// The master's STORE attributes that govern return services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnSettings {
    pub disable: Option<(DisableScope, u32)>,
    pub resume_latency: Option<Duration>,
    pub durable_commit: Option<bool>,
    pub wait: ReturnWait,
    pub local_action: LocalAction,
}

impl ReturnSettings {
    /// The settings of the master's STORE clause (defaults already filled in).
    pub fn from_store(s: &StoreSettings) -> Self {
        Self {
            disable: s.disable_return,
            resume_latency: s
                .resume_return_ms
                .map(|ms| Duration::from_millis(u64::from(ms))),
            durable_commit: s.durable_commit,
            wait: ReturnWait::from_seconds(i64::from(s.return_wait_time_s)),
            local_action: s.local_commit_action,
        }
    }
}

impl Default for ReturnSettings {
    fn default() -> Self {
        Self::from_store(&StoreSettings::default())
    }
}

/// Which subscribers a commit on each table waits for: the routing plan's return
/// services on the links this store sends its **own** transactions on (forwarded
/// transactions of other origins never wait here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReturnRoutes {
    by_table: BTreeMap<QualName, Vec<(Ident, ReturnService, bool)>>,
    /// DATASTORE elements by rule, so a table created after the plan waits too.
    datastore: Vec<DatastoreRoute>,
}

/// The return service of a DATASTORE element's subscriber, for the tables its
/// INCLUDE / EXCLUDE lets in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DatastoreRoute {
    subscriber: Ident,
    include: Option<BTreeSet<QualName>>,
    exclude: BTreeSet<QualName>,
    service: ReturnService,
    when_stopped: bool,
}

impl ReturnRoutes {
    /// Routes of `me` from a routing plan's links.
    pub fn from_links<'a>(me: &Ident, links: impl IntoIterator<Item = &'a Link>) -> Self {
        let mut by_table: BTreeMap<QualName, Vec<(Ident, ReturnService, bool)>> = BTreeMap::new();
        for link in links.into_iter().filter(|l| &l.sender == me) {
            for t in link.tables.iter().filter(|t| &t.origin == me) {
                if t.return_service != ReturnService::NoReturn {
                    by_table.entry(t.table.clone()).or_default().push((
                        link.receiver.clone(),
                        t.return_service,
                        t.return_when_stopped,
                    ));
                }
            }
        }
        Self {
            by_table,
            datastore: Vec::new(),
        }
    }

    /// Adds a DATASTORE element of this store with `subscriber`'s return service: a
    /// commit to any table the INCLUDE / EXCLUDE lists let in waits for it, tables
    /// created after the plan included.
    pub fn add_datastore(
        &mut self,
        subscriber: Ident,
        include: Option<BTreeSet<QualName>>,
        exclude: BTreeSet<QualName>,
        service: ReturnService,
        when_stopped: bool,
    ) {
        if service != ReturnService::NoReturn {
            self.datastore.push(DatastoreRoute {
                subscriber,
                include,
                exclude,
                service,
                when_stopped,
            });
        }
    }

    /// The subscribers a transaction touching `tables` waits for. A subscriber named
    /// by several tables is awaited once, at the strongest level, and keeps blocking
    /// when stopped if any of its services says so.
    pub fn awaits<'a>(
        &self,
        tables: impl IntoIterator<Item = &'a QualName>,
        request_return: bool,
    ) -> Vec<Await> {
        let mut out: BTreeMap<Ident, (ReturnLevel, bool)> = BTreeMap::new();
        for table in tables {
            let by_rule = self
                .datastore
                .iter()
                .filter(|r| {
                    r.include.as_ref().is_none_or(|i| i.contains(table))
                        && !r.exclude.contains(table)
                })
                .map(|r| (&r.subscriber, &r.service, &r.when_stopped));
            let by_table = self
                .by_table
                .get(table)
                .into_iter()
                .flatten()
                .map(|(a, b, c)| (a, b, c));
            for (sub, service, when_stopped) in by_table.chain(by_rule) {
                let level = match *service {
                    ReturnService::NoReturn => continue,
                    ReturnService::Receipt { by_request } if !by_request || request_return => {
                        ReturnLevel::Receipt
                    }
                    ReturnService::Twosafe { by_request } if !by_request || request_return => {
                        ReturnLevel::Twosafe
                    }
                    _ => continue,
                };
                let e = out.entry(sub.clone()).or_insert((level, *when_stopped));
                e.0 = e.0.max(level);
                e.1 |= *when_stopped;
            }
        }
        out.into_iter()
            .map(|(subscriber, (level, when_stopped))| Await {
                subscriber,
                level,
                when_stopped,
            })
            .collect()
    }
}

/// A receiver's replication state as the control plane holds it (TimesTen's
/// `ttRepSubscriberStateSet` states).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ReplicationState {
    #[default]
    Start,
    Pause,
    Stop,
    Failed,
}

/// A subscriber's acknowledged positions for this node's own transactions (seq of
/// this origin).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AckMarks {
    /// Durably received (RETURN RECEIPT).
    pub receipt: u64,
    /// Committed (RETURN TWOSAFE).
    pub commit: u64,
}

/// How a waiting commit ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReturnOutcome {
    /// No return service applied to this commit, or RETURN WAIT TIME 0.
    NotRequested,
    /// Every awaited subscriber acknowledged in time.
    Acknowledged,
    /// Warning 8170 (`tt_ErrRepReturnFailed`): these subscribers had not acknowledged
    /// in time. `local_action` is set when a TWOSAFE subscriber was among them.
    TimedOut {
        pending: Vec<Ident>,
        local_action: Option<LocalAction>,
    },
    /// Released without the acknowledgements of these subscribers because their return
    /// service is disabled (DISABLE RETURN) or their replication is stopped under
    /// RETURN SERVICES OFF WHEN REPLICATION STOPPED; the others acknowledged.
    ReturnDisabled { subscribers: Vec<Ident> },
}

impl ReturnOutcome {
    /// The TimesTen warning the committing client gets, if any.
    pub fn warning_code(&self) -> Option<u32> {
        matches!(self, ReturnOutcome::TimedOut { .. }).then_some(8170)
    }
}

/// One commit to release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub seq: u64,
    pub outcome: ReturnOutcome,
}

/// A change of a subscriber's return service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReturnEvent {
    /// DISABLE RETURN tripped after `timeouts` consecutive timeouts.
    Disabled { subscriber: Ident, timeouts: u32 },
    /// RESUME RETURN: a commit was acknowledged within the resume latency.
    Resumed {
        subscriber: Ident,
        latency: Duration,
    },
}

/// What one input changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    pub released: Vec<Release>,
    /// TWOSAFE commits that timed out under LOCAL COMMIT ACTION NO ACTION and stay
    /// held (their callers get 8170 now); each is released later like any other.
    pub left_open: Vec<Release>,
    pub events: Vec<ReturnEvent>,
}

/// TimesTen's per-subscriber transaction state (`ttRepXactStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XactState {
    /// NS: not acknowledged at all.
    NotSent,
    /// RC: durably received, not yet committed.
    Received,
    /// CT: committed, not yet known durable.
    Committed,
    /// AP: committed and durable.
    Applied,
}

impl XactState {
    pub fn code(self) -> &'static str {
        match self {
            XactState::NotSent => "NS",
            XactState::Received => "RC",
            XactState::Committed => "CT",
            XactState::Applied => "AP",
        }
    }
}

/// Bound on the commits remembered per disabled subscriber to measure resume latency.
const MAX_PROBES: usize = 4096;

#[derive(Debug, Default)]
struct Sub {
    marks: AckMarks,
    state: ReplicationState,
    consecutive_timeouts: u32,
    disabled: bool,
    /// Commits that would have waited for this disabled subscriber: seq → (commit
    /// time, level). Their ack latency decides RESUME RETURN.
    probes: BTreeMap<u64, (Instant, ReturnLevel)>,
}

impl Sub {
    fn satisfied(&self, seq: u64, level: ReturnLevel) -> bool {
        match level {
            ReturnLevel::Receipt => self.marks.receipt >= seq,
            ReturnLevel::Twosafe => self.marks.commit >= seq,
        }
    }
}

#[derive(Debug)]
struct Waiting {
    /// When the commit began waiting (its commit-to-ack latency starts here).
    started: Instant,
    deadline: Option<Instant>,
    /// Subscriber → (level, when_stopped), still unacknowledged.
    pending: BTreeMap<Ident, (ReturnLevel, bool)>,
    /// Subscribers no longer waited for (disabled, or stopped with OFF).
    skipped: BTreeSet<Ident>,
    local_action: LocalAction,
    /// Left open at its deadline instead of released ([`SyncOptions::keep_open`]).
    keep_open: bool,
}

/// The return-service state of one master: its subscribers and its waiting commits.
#[derive(Debug)]
pub struct ReturnTracker {
    settings: ReturnSettings,
    subs: BTreeMap<Ident, Sub>,
    waiting: BTreeMap<u64, Waiting>,
    /// Consecutive timed-out commits, for DISABLE RETURN ALL.
    all_timeouts: u32,
}

impl ReturnTracker {
    pub fn new(settings: ReturnSettings) -> Self {
        Self {
            settings,
            subs: BTreeMap::new(),
            waiting: BTreeMap::new(),
            all_timeouts: 0,
        }
    }

    pub fn settings(&self) -> &ReturnSettings {
        &self.settings
    }

    /// Takes new STORE settings (an ALTER REPLICATION); waiting commits keep their
    /// deadlines.
    pub fn set_settings(&mut self, settings: ReturnSettings) {
        self.settings = settings;
    }

    /// Registers commit `seq` (of this node's origin), flushed at `now`, that waits for
    /// `awaits`. It may be released at once: nothing to wait for, RETURN WAIT TIME 0,
    /// every subscriber disabled or already acknowledged (an ack can beat the commit
    /// path here).
    pub fn begin(
        &mut self,
        seq: u64,
        awaits: Vec<Await>,
        opts: &SyncOptions,
        now: Instant,
    ) -> Step {
        let mut step = Step::default();
        let wait = opts.return_wait.unwrap_or(self.settings.wait);
        if awaits.is_empty() || wait == ReturnWait::NoWait {
            step.released.push(Release {
                seq,
                outcome: ReturnOutcome::NotRequested,
            });
            return step;
        }
        let mut waiting = Waiting {
            started: now,
            deadline: match wait {
                ReturnWait::For(d) => Some(now + d),
                ReturnWait::NoWait | ReturnWait::Forever => None,
            },
            pending: BTreeMap::new(),
            skipped: BTreeSet::new(),
            local_action: opts.local_action.unwrap_or(self.settings.local_action),
            keep_open: opts.keep_open,
        };
        for a in awaits {
            let sub = self.subs.entry(a.subscriber.clone()).or_default();
            if sub.disabled {
                if sub.probes.len() < MAX_PROBES {
                    sub.probes.insert(seq, (now, a.level));
                }
                waiting.skipped.insert(a.subscriber);
            } else if sub.state != ReplicationState::Start && !a.when_stopped {
                waiting.skipped.insert(a.subscriber);
            } else if !sub.satisfied(seq, a.level) {
                waiting
                    .pending
                    .insert(a.subscriber, (a.level, a.when_stopped));
            }
        }
        self.waiting.insert(seq, waiting);
        self.release_done(&mut step);
        step
    }

    /// A subscriber acknowledged up to `marks` (seq of this origin). Marks only grow:
    /// a lower value (a restarted stream repeating itself) changes nothing.
    pub fn ack(&mut self, subscriber: &Ident, marks: AckMarks, now: Instant) -> Step {
        let mut step = Step::default();
        let sub = self.subs.entry(subscriber.clone()).or_default();
        sub.marks.receipt = sub.marks.receipt.max(marks.receipt);
        sub.marks.commit = sub.marks.commit.max(marks.commit);
        if sub.disabled {
            let satisfied: Vec<u64> = sub
                .probes
                .iter()
                .filter(|(seq, (_, level))| sub.satisfied(**seq, *level))
                .map(|(seq, _)| *seq)
                .collect();
            let newest = satisfied.last().and_then(|s| sub.probes.get(s)).copied();
            for s in &satisfied {
                sub.probes.remove(s);
            }
            if let (Some(limit), Some((at, _))) = (self.settings.resume_latency, newest) {
                let latency = now.saturating_duration_since(at);
                if latency < limit {
                    sub.disabled = false;
                    sub.consecutive_timeouts = 0;
                    sub.probes.clear();
                    step.events.push(ReturnEvent::Resumed {
                        subscriber: subscriber.clone(),
                        latency,
                    });
                }
            }
        }
        let Some(sub) = self.subs.get_mut(subscriber) else {
            return step;
        };
        for (seq, w) in self.waiting.iter_mut() {
            if let Some((level, _)) = w.pending.get(subscriber) {
                if sub.satisfied(*seq, *level) {
                    w.pending.remove(subscriber);
                    // Acknowledged in time: its run of timeouts is over.
                    sub.consecutive_timeouts = 0;
                }
            }
        }
        self.release_done(&mut step);
        step
    }

    /// The control plane changed a receiver's state. With RETURN SERVICES OFF WHEN
    /// REPLICATION STOPPED, commits waiting for it stop waiting.
    pub fn set_replication(&mut self, subscriber: &Ident, state: ReplicationState) -> Step {
        let mut step = Step::default();
        self.subs.entry(subscriber.clone()).or_default().state = state;
        if state != ReplicationState::Start {
            for w in self.waiting.values_mut() {
                if w.pending.get(subscriber).is_some_and(|(_, ws)| !ws) {
                    w.pending.remove(subscriber);
                    w.skipped.insert(subscriber.clone());
                }
            }
        }
        self.release_done(&mut step);
        step
    }

    /// Time passed: commits past their deadline are released with 8170, in commit
    /// order, and DISABLE RETURN is applied as their timeouts add up.
    pub fn tick(&mut self, now: Instant) -> Step {
        let mut step = Step::default();
        let due: Vec<u64> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.deadline.is_some_and(|d| d <= now))
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            // An earlier timeout in this loop may have disabled this commit's last
            // pending subscriber and released it already.
            let Some(w) = self.waiting.remove(&seq) else {
                continue;
            };
            self.time_out(seq, w, &mut step, true);
        }
        step
    }

    /// This node no longer sends to the subscribers in `gone` (a failover or a
    /// switchover moved the master role away, or the scheme dropped them): no
    /// acknowledgement can come, so commits waiting for any of them are released now as
    /// timed out (8170: committed here, not confirmed there — a deposed master's commit
    /// may be set aside), without counting toward DISABLE RETURN.
    pub fn abandon(&mut self, gone: &BTreeSet<Ident>) -> Step {
        let mut step = Step::default();
        let due: Vec<u64> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.pending.keys().any(|s| gone.contains(s)))
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            if let Some(w) = self.waiting.remove(&seq) {
                self.time_out(seq, w, &mut step, false);
            }
        }
        step
    }

    /// Releases `w` as timed out; `counts` says whether the timeout counts toward
    /// DISABLE RETURN.
    fn time_out(&mut self, seq: u64, mut w: Waiting, step: &mut Step, counts: bool) {
        let pending: Vec<Ident> = w.pending.keys().cloned().collect();
        let twosafe = w.pending.values().any(|(l, _)| *l == ReturnLevel::Twosafe);
        let release = Release {
            seq,
            outcome: ReturnOutcome::TimedOut {
                pending: pending.clone(),
                local_action: twosafe.then_some(w.local_action),
            },
        };
        if twosafe && w.keep_open && w.local_action == LocalAction::NoAction {
            // Still held, now without a deadline; a subscriber disabled below stops
            // being waited for like any other.
            step.left_open.push(release);
            w.deadline = None;
            self.waiting.insert(seq, w);
        } else {
            step.released.push(release);
        }
        let mut to_disable = Vec::new();
        match self.settings.disable.filter(|_| counts) {
            Some((DisableScope::Subscriber, n)) => {
                for p in &pending {
                    let sub = self.subs.entry(p.clone()).or_default();
                    sub.consecutive_timeouts += 1;
                    if !sub.disabled && sub.consecutive_timeouts >= n {
                        to_disable.push((p.clone(), sub.consecutive_timeouts));
                    }
                }
            }
            Some((DisableScope::All, n)) => {
                self.all_timeouts += 1;
                if self.all_timeouts >= n {
                    to_disable.extend(
                        self.subs
                            .iter()
                            .filter(|(_, s)| !s.disabled)
                            .map(|(id, _)| (id.clone(), self.all_timeouts)),
                    );
                    self.all_timeouts = 0;
                }
            }
            None => {}
        }
        for (id, timeouts) in to_disable {
            self.disable(&id, timeouts, step);
        }
    }

    fn disable(&mut self, id: &Ident, timeouts: u32, step: &mut Step) {
        let sub = self.subs.entry(id.clone()).or_default();
        sub.disabled = true;
        step.events.push(ReturnEvent::Disabled {
            subscriber: id.clone(),
            timeouts,
        });
        for (seq, w) in self.waiting.iter_mut() {
            if let Some((level, _)) = w.pending.remove(id) {
                w.skipped.insert(id.clone());
                if sub.probes.len() < MAX_PROBES {
                    sub.probes.insert(*seq, (w.started, level));
                }
            }
        }
        self.release_done(step);
    }

    /// Releases every waiting commit with nothing left pending.
    fn release_done(&mut self, step: &mut Step) {
        let done: Vec<u64> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.pending.is_empty())
            .map(|(seq, _)| *seq)
            .collect();
        for seq in done {
            let Some(w) = self.waiting.remove(&seq) else {
                continue;
            };
            let outcome = if w.skipped.is_empty() {
                ReturnOutcome::Acknowledged
            } else {
                ReturnOutcome::ReturnDisabled {
                    subscribers: w.skipped.into_iter().collect(),
                }
            };
            if outcome == ReturnOutcome::Acknowledged {
                self.all_timeouts = 0;
            }
            step.released.push(Release { seq, outcome });
        }
    }

    /// Ends the wait of commit `seq` left open ([`Step::left_open`]) without its
    /// acknowledgements: its caller commits it here (LOCAL COMMIT ACTION COMMIT, or it
    /// went away). Released as timed out under COMMIT; not another timeout for DISABLE
    /// RETURN. Nothing happens for a commit no longer waiting.
    pub fn give_up(&mut self, seq: u64) -> Step {
        let mut step = Step::default();
        if let Some(w) = self.waiting.remove(&seq) {
            let twosafe = w.pending.values().any(|(l, _)| *l == ReturnLevel::Twosafe);
            step.released.push(Release {
                seq,
                outcome: ReturnOutcome::TimedOut {
                    pending: w.pending.keys().cloned().collect(),
                    local_action: twosafe.then_some(LocalAction::Commit),
                },
            });
        }
        step
    }

    /// Re-enables a disabled return service by hand (TimesTen: the agent restarted).
    pub fn enable(&mut self, subscriber: &Ident) -> bool {
        match self.subs.get_mut(subscriber) {
            Some(s) if s.disabled => {
                s.disabled = false;
                s.consecutive_timeouts = 0;
                s.probes.clear();
                true
            }
            _ => false,
        }
    }

    /// When [`ReturnTracker::tick`] must next be called.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting.values().filter_map(|w| w.deadline).min()
    }

    /// Commits waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// `ttRepSyncSubscriberStatus`: whether DISABLE RETURN turned this subscriber off.
    pub fn is_disabled(&self, subscriber: &Ident) -> bool {
        self.subs.get(subscriber).is_some_and(|s| s.disabled)
    }

    /// The replication state the control plane last gave for `subscriber`.
    pub fn replication_state(&self, subscriber: &Ident) -> ReplicationState {
        self.subs
            .get(subscriber)
            .map(|s| s.state)
            .unwrap_or_default()
    }

    /// Consecutive timeouts of `subscriber` since its last acknowledgement in time.
    pub fn consecutive_timeouts(&self, subscriber: &Ident) -> u32 {
        self.subs
            .get(subscriber)
            .map_or(0, |s| s.consecutive_timeouts)
    }

    /// DURABLE COMMIT ON: commits must be flushed while a return service is disabled.
    pub fn durable_commit_forced(&self) -> bool {
        self.settings.durable_commit == Some(true) && self.subs.values().any(|s| s.disabled)
    }

    /// What `subscriber` has acknowledged of this origin.
    pub fn marks(&self, subscriber: &Ident) -> AckMarks {
        self.subs
            .get(subscriber)
            .map(|s| s.marks)
            .unwrap_or_default()
    }

    /// `ttRepXactStatus` for commit `seq` at `subscriber`.
    pub fn xact_status(&self, seq: u64, subscriber: &Ident) -> XactState {
        let m = self.marks(subscriber);
        match (m.receipt >= seq, m.commit >= seq) {
            (true, true) => XactState::Applied,
            (false, true) => XactState::Committed,
            (true, false) => XactState::Received,
            (false, false) => XactState::NotSent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Ident {
        Ident::unquoted(s)
    }

    fn receipt(s: &str) -> Await {
        Await {
            subscriber: id(s),
            level: ReturnLevel::Receipt,
            when_stopped: false,
        }
    }

    fn twosafe(s: &str) -> Await {
        Await {
            subscriber: id(s),
            level: ReturnLevel::Twosafe,
            when_stopped: true,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ms(m: u64) -> Duration {
        Duration::from_millis(m)
    }

    fn marks(receipt: u64, commit: u64) -> AckMarks {
        AckMarks { receipt, commit }
    }

    fn released(step: &Step) -> Vec<(u64, ReturnOutcome)> {
        step.released
            .iter()
            .map(|r| (r.seq, r.outcome.clone()))
            .collect()
    }

    fn timed_out(subs: &[&str], action: Option<LocalAction>) -> ReturnOutcome {
        ReturnOutcome::TimedOut {
            pending: subs.iter().map(|s| id(s)).collect(),
            local_action: action,
        }
    }

    fn settings() -> ReturnSettings {
        ReturnSettings::default()
    }

    #[test]
    fn no_return_service_releases_at_once() {
        let mut t = ReturnTracker::new(settings());
        let step = t.begin(1, vec![], &SyncOptions::default(), Instant::now());
        assert_eq!(released(&step), vec![(1, ReturnOutcome::NotRequested)]);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn return_wait_time_zero_does_not_wait() {
        let mut s = settings();
        s.wait = ReturnWait::NoWait;
        let mut t = ReturnTracker::new(s);
        let step = t.begin(
            1,
            vec![receipt("s1")],
            &SyncOptions::default(),
            Instant::now(),
        );
        assert_eq!(released(&step), vec![(1, ReturnOutcome::NotRequested)]);
    }

    #[test]
    fn receipt_waits_for_every_subscriber_durable_receipt() {
        let now = Instant::now();
        let mut t = ReturnTracker::new(settings());
        let step = t.begin(
            5,
            vec![receipt("s1"), receipt("s2")],
            &SyncOptions::default(),
            now,
        );
        assert!(step.released.is_empty());
        // A commit mark alone does not satisfy RECEIPT: it promises durability.
        assert!(t.ack(&id("s1"), marks(4, 5), now).released.is_empty());
        assert!(t.ack(&id("s1"), marks(5, 5), now).released.is_empty());
        let step = t.ack(&id("s2"), marks(7, 7), now + ms(3));
        assert_eq!(released(&step), vec![(5, ReturnOutcome::Acknowledged)]);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn twosafe_waits_for_commit_not_receipt() {
        let now = Instant::now();
        let mut t = ReturnTracker::new(settings());
        t.begin(3, vec![twosafe("s1")], &SyncOptions::default(), now);
        assert!(t.ack(&id("s1"), marks(3, 2), now).released.is_empty());
        assert_eq!(t.xact_status(3, &id("s1")), XactState::Received);
        let step = t.ack(&id("s1"), marks(3, 3), now);
        assert_eq!(released(&step), vec![(3, ReturnOutcome::Acknowledged)]);
        assert_eq!(t.xact_status(3, &id("s1")), XactState::Applied);
        assert_eq!(t.xact_status(4, &id("s1")), XactState::NotSent);
    }

    #[test]
    fn an_ack_that_beats_the_commit_path_releases_at_begin() {
        let now = Instant::now();
        let mut t = ReturnTracker::new(settings());
        t.ack(&id("s1"), marks(9, 9), now);
        let step = t.begin(9, vec![receipt("s1")], &SyncOptions::default(), now);
        assert_eq!(released(&step), vec![(9, ReturnOutcome::Acknowledged)]);
    }

    #[test]
    fn commits_waiting_for_subscribers_this_node_no_longer_sends_to_are_released_at_once() {
        let now = Instant::now();
        let mut s = settings();
        s.disable = Some((DisableScope::Subscriber, 1));
        let mut t = ReturnTracker::new(s);
        t.begin(1, vec![twosafe("s1")], &SyncOptions::default(), now);
        t.begin(2, vec![receipt("s2")], &SyncOptions::default(), now);
        // Deposed as master of what s1 subscribes to: s1 will never acknowledge.
        let step = t.abandon(&BTreeSet::from([id("s1")]));
        assert_eq!(
            released(&step),
            vec![(1, timed_out(&["s1"], Some(LocalAction::NoAction)))]
        );
        // Not a timeout toward DISABLE RETURN, and s2's commit still waits.
        assert!(!t.is_disabled(&id("s1")));
        assert_eq!(t.waiting(), 1);
    }

    #[test]
    fn timeout_gives_8170_after_return_wait_time_and_not_before() {
        let now = Instant::now();
        let mut t = ReturnTracker::new(settings()); // 10 s default
        t.begin(1, vec![receipt("s1")], &SyncOptions::default(), now);
        assert_eq!(t.next_deadline(), Some(now + secs(10)));
        assert!(t.tick(now + secs(9)).released.is_empty());
        let step = t.tick(now + secs(10));
        assert_eq!(released(&step), vec![(1, timed_out(&["s1"], None))]);
        assert_eq!(step.released[0].outcome.warning_code(), Some(8170));
        // A late ack changes nothing for a released commit.
        assert!(t
            .ack(&id("s1"), marks(1, 1), now + secs(11))
            .released
            .is_empty());
    }

    #[test]
    fn connection_return_wait_overrides_the_store_and_minus_one_waits_forever() {
        let now = Instant::now();
        let mut t = ReturnTracker::new(settings());
        let short = SyncOptions {
            return_wait: Some(ReturnWait::from_seconds(2)),
            ..SyncOptions::default()
        };
        t.begin(1, vec![receipt("s1")], &short, now);
        assert_eq!(released(&t.tick(now + secs(2))).len(), 1);
        let forever = SyncOptions {
            return_wait: Some(ReturnWait::from_seconds(-1)),
            ..SyncOptions::default()
        };
        t.begin(2, vec![receipt("s1")], &forever, now);
        assert_eq!(t.next_deadline(), None);
        assert!(t.tick(now + secs(3600)).released.is_empty());
        let step = t.ack(&id("s1"), marks(2, 2), now + secs(3601));
        assert_eq!(released(&step), vec![(2, ReturnOutcome::Acknowledged)]);
    }

    #[test]
    fn twosafe_timeout_carries_the_local_commit_action() {
        let now = Instant::now();
        let mut s = settings();
        s.local_action = LocalAction::Commit;
        let mut t = ReturnTracker::new(s);
        t.begin(1, vec![twosafe("s1")], &SyncOptions::default(), now);
        let opts = SyncOptions {
            local_action: Some(LocalAction::NoAction),
            ..SyncOptions::default()
        };
        t.begin(2, vec![twosafe("s1")], &opts, now);
        let step = t.tick(now + secs(10));
        assert_eq!(
            released(&step),
            vec![
                (1, timed_out(&["s1"], Some(LocalAction::Commit))),
                (2, timed_out(&["s1"], Some(LocalAction::NoAction))),
            ]
        );
    }

    fn left_open(step: &Step) -> Vec<(u64, ReturnOutcome)> {
        step.left_open
            .iter()
            .map(|r| (r.seq, r.outcome.clone()))
            .collect()
    }

    /// A session's options: it can COMMIT again.
    fn session() -> SyncOptions {
        SyncOptions {
            keep_open: true,
            ..SyncOptions::default()
        }
    }

    #[test]
    fn a_twosafe_timeout_under_no_action_leaves_the_commit_open_until_acknowledged() {
        let now = Instant::now();
        let mut t = ReturnTracker::new(settings());
        assert_eq!(
            t.settings().local_action,
            LocalAction::NoAction,
            "the default"
        );
        t.begin(1, vec![twosafe("s1")], &session(), now);
        let step = t.tick(now + secs(10));
        assert!(step.released.is_empty(), "{step:?}");
        assert_eq!(
            left_open(&step),
            vec![(1, timed_out(&["s1"], Some(LocalAction::NoAction)))]
        );
        // Still waiting, with no deadline: no second timeout.
        assert_eq!((t.waiting(), t.next_deadline()), (1, None));
        assert!(t.tick(now + secs(3600)).left_open.is_empty());
        let step = t.ack(&id("s1"), marks(1, 1), now + secs(3601));
        assert_eq!(released(&step), vec![(1, ReturnOutcome::Acknowledged)]);
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn only_a_twosafe_commit_under_no_action_whose_caller_can_commit_again_stays_open() {
        let now = Instant::now();
        let mut t = ReturnTracker::new(settings());
        // RECEIPT has no LOCAL COMMIT ACTION; COMMIT ends the transaction; the typed
        // API (keep_open false) cannot COMMIT again.
        t.begin(1, vec![receipt("s1")], &session(), now);
        let commit = SyncOptions {
            local_action: Some(LocalAction::Commit),
            ..session()
        };
        t.begin(2, vec![twosafe("s1")], &commit, now);
        t.begin(3, vec![twosafe("s1")], &SyncOptions::default(), now);
        let step = t.tick(now + secs(10));
        assert!(step.left_open.is_empty(), "{step:?}");
        assert_eq!(
            released(&step),
            vec![
                (1, timed_out(&["s1"], None)),
                (2, timed_out(&["s1"], Some(LocalAction::Commit))),
                (3, timed_out(&["s1"], Some(LocalAction::NoAction))),
            ]
        );
    }

    #[test]
    fn a_commit_left_open_is_given_up_as_committed_here_or_released_by_disable_return() {
        let now = Instant::now();
        let mut s = settings();
        s.disable = Some((DisableScope::Subscriber, 2));
        let mut t = ReturnTracker::new(s);
        t.begin(1, vec![twosafe("s1")], &session(), now);
        assert_eq!(left_open(&t.tick(now + secs(10))).len(), 1);
        let step = t.give_up(1);
        assert_eq!(
            released(&step),
            vec![(1, timed_out(&["s1"], Some(LocalAction::Commit)))]
        );
        assert!(t.give_up(1).released.is_empty(), "no longer waiting");
        assert_eq!(
            t.consecutive_timeouts(&id("s1")),
            1,
            "giving up is no timeout"
        );
        // The second timeout disables s1: the commit left open is released at once.
        t.begin(2, vec![twosafe("s1")], &session(), now + secs(20));
        let step = t.tick(now + secs(30));
        assert_eq!(left_open(&step).len(), 1);
        assert_eq!(
            released(&step),
            vec![(
                2,
                ReturnOutcome::ReturnDisabled {
                    subscribers: vec![id("s1")]
                }
            )]
        );
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn disable_return_subscriber_after_n_consecutive_timeouts() {
        let now = Instant::now();
        let mut s = settings();
        s.disable = Some((DisableScope::Subscriber, 2));
        s.wait = ReturnWait::For(secs(1));
        let mut t = ReturnTracker::new(s);
        let all = || vec![receipt("s1"), receipt("s2")];
        let opts = SyncOptions::default();
        // Commit 1 times out on s1 only (s2 acks); s1 has one timeout.
        t.begin(1, all(), &opts, now);
        t.ack(&id("s2"), marks(1, 1), now);
        let step = t.tick(now + secs(1));
        assert_eq!(released(&step), vec![(1, timed_out(&["s1"], None))]);
        assert!(step.events.is_empty());
        // Commit 2's timeout is s1's second in a row and trips the policy while
        // commit 3 is still waiting for s1.
        t.begin(2, all(), &opts, now + secs(1));
        t.begin(3, all(), &opts, now + ms(1500));
        t.ack(&id("s2"), marks(3, 3), now + ms(1500));
        let step = t.tick(now + secs(2));
        assert_eq!(
            step.events,
            vec![ReturnEvent::Disabled {
                subscriber: id("s1"),
                timeouts: 2
            }]
        );
        // 2 timed out; 3 stops waiting for s1 the moment it is disabled.
        assert_eq!(
            released(&step),
            vec![
                (2, timed_out(&["s1"], None)),
                (
                    3,
                    ReturnOutcome::ReturnDisabled {
                        subscribers: vec![id("s1")]
                    }
                )
            ]
        );
        assert!(t.is_disabled(&id("s1")));
        assert!(!t.is_disabled(&id("s2")));
        // From now on commits wait for s2 only.
        let step = t.begin(4, all(), &opts, now + secs(3));
        assert!(step.released.is_empty());
        let step = t.ack(&id("s2"), marks(4, 4), now + secs(3));
        assert_eq!(
            released(&step),
            vec![(
                4,
                ReturnOutcome::ReturnDisabled {
                    subscribers: vec![id("s1")]
                }
            )]
        );
    }

    #[test]
    fn an_ack_in_time_resets_the_consecutive_timeouts() {
        let now = Instant::now();
        let mut s = settings();
        s.disable = Some((DisableScope::Subscriber, 2));
        s.wait = ReturnWait::For(secs(1));
        let mut t = ReturnTracker::new(s);
        let opts = SyncOptions::default();
        t.begin(1, vec![receipt("s1")], &opts, now);
        t.tick(now + secs(1));
        t.begin(2, vec![receipt("s1")], &opts, now + secs(1));
        t.ack(&id("s1"), marks(2, 2), now + secs(1));
        t.begin(3, vec![receipt("s1")], &opts, now + secs(2));
        let step = t.tick(now + secs(3));
        assert_eq!(released(&step), vec![(3, timed_out(&["s1"], None))]);
        assert!(
            step.events.is_empty(),
            "timeouts 1 and 3 are not consecutive"
        );
        assert!(!t.is_disabled(&id("s1")));
    }

    #[test]
    fn disable_return_all_turns_off_every_subscriber() {
        let now = Instant::now();
        let mut s = settings();
        s.disable = Some((DisableScope::All, 2));
        s.wait = ReturnWait::For(secs(1));
        s.durable_commit = Some(true);
        let mut t = ReturnTracker::new(s);
        let opts = SyncOptions::default();
        t.ack(&id("s2"), marks(0, 0), now);
        // Two timed-out commits, each on a different subscriber.
        t.begin(1, vec![receipt("s1"), receipt("s2")], &opts, now);
        t.ack(&id("s2"), marks(1, 1), now);
        t.tick(now + secs(1));
        assert!(!t.durable_commit_forced());
        t.begin(2, vec![receipt("s1"), receipt("s2")], &opts, now + secs(1));
        t.ack(&id("s1"), marks(2, 2), now + secs(1));
        let step = t.tick(now + secs(2));
        assert_eq!(step.events.len(), 2);
        assert!(t.is_disabled(&id("s1")) && t.is_disabled(&id("s2")));
        // DURABLE COMMIT ON forces durable commits while disabled.
        assert!(t.durable_commit_forced());
        let step = t.begin(3, vec![receipt("s1"), receipt("s2")], &opts, now + secs(3));
        assert_eq!(
            released(&step),
            vec![(
                3,
                ReturnOutcome::ReturnDisabled {
                    subscribers: vec![id("s1"), id("s2")]
                }
            )]
        );
    }

    #[test]
    fn resume_return_when_latency_drops_below_the_limit() {
        let now = Instant::now();
        let mut s = settings();
        s.disable = Some((DisableScope::Subscriber, 1));
        s.resume_latency = Some(ms(8));
        s.wait = ReturnWait::For(secs(1));
        let mut t = ReturnTracker::new(s);
        let opts = SyncOptions::default();
        t.begin(1, vec![receipt("s1")], &opts, now);
        assert!(!t.tick(now + secs(1)).events.is_empty());
        // Commit 2 does not wait; its ack is slow: still disabled.
        let t2 = now + secs(2);
        t.begin(2, vec![receipt("s1")], &opts, t2);
        assert!(t.ack(&id("s1"), marks(2, 2), t2 + ms(20)).events.is_empty());
        assert!(t.is_disabled(&id("s1")));
        // Commit 3's ack comes within 8 ms: resumed.
        let t3 = now + secs(3);
        t.begin(3, vec![receipt("s1")], &opts, t3);
        let step = t.ack(&id("s1"), marks(3, 3), t3 + ms(5));
        assert_eq!(
            step.events,
            vec![ReturnEvent::Resumed {
                subscriber: id("s1"),
                latency: ms(5)
            }]
        );
        // And commits wait for it again.
        assert!(t
            .begin(4, vec![receipt("s1")], &opts, now + secs(4))
            .released
            .is_empty());
    }

    #[test]
    fn without_resume_return_a_disabled_service_stays_off_until_enabled() {
        let now = Instant::now();
        let mut s = settings();
        s.disable = Some((DisableScope::Subscriber, 1));
        s.wait = ReturnWait::For(secs(1));
        let mut t = ReturnTracker::new(s);
        let opts = SyncOptions::default();
        t.begin(1, vec![receipt("s1")], &opts, now);
        t.tick(now + secs(1));
        t.begin(2, vec![receipt("s1")], &opts, now + secs(2));
        assert!(t
            .ack(&id("s1"), marks(2, 2), now + secs(2))
            .events
            .is_empty());
        assert!(t.is_disabled(&id("s1")));
        assert!(t.enable(&id("s1")));
        assert!(t
            .begin(3, vec![receipt("s1")], &opts, now + secs(3))
            .released
            .is_empty());
    }

    #[test]
    fn return_services_off_when_stopped_releases_waiting_commits() {
        let now = Instant::now();
        let mut t = ReturnTracker::new(settings());
        let opts = SyncOptions::default();
        t.begin(1, vec![receipt("s1")], &opts, now);
        let step = t.set_replication(&id("s1"), ReplicationState::Stop);
        assert_eq!(
            released(&step),
            vec![(
                1,
                ReturnOutcome::ReturnDisabled {
                    subscribers: vec![id("s1")]
                }
            )]
        );
        // New commits do not wait either, until replication starts again.
        assert_eq!(
            t.begin(2, vec![receipt("s1")], &opts, now).released.len(),
            1
        );
        t.set_replication(&id("s1"), ReplicationState::Start);
        assert!(t
            .begin(3, vec![receipt("s1")], &opts, now)
            .released
            .is_empty());
    }

    #[test]
    fn return_services_on_when_stopped_keeps_waiting_and_times_out() {
        let now = Instant::now();
        let mut t = ReturnTracker::new(settings());
        let opts = SyncOptions::default();
        t.set_replication(&id("s1"), ReplicationState::Pause);
        // TWOSAFE defaults to ON WHEN REPLICATION STOPPED.
        assert!(t
            .begin(1, vec![twosafe("s1")], &opts, now)
            .released
            .is_empty());
        let step = t.tick(now + secs(10));
        assert_eq!(
            released(&step),
            vec![(1, timed_out(&["s1"], Some(LocalAction::NoAction)))]
        );
    }

    #[test]
    fn routes_pick_by_request_services_only_when_asked_and_the_strongest_level() {
        use hawser_scheme::ast::TargetKind;
        use hawser_scheme::route::{ResolvedTarget, RoutedTable};
        let table = |name: &str, origin: &str, rs: ReturnService| RoutedTable {
            element: id("e"),
            table: QualName::bare(name),
            origin: id(origin),
            return_service: rs,
            return_when_stopped: matches!(rs, ReturnService::Twosafe { .. }),
            target: ResolvedTarget {
                kind: TargetKind::UserCopy,
                into: QualName::bare(name),
            },
            check: None,
        };
        let link = |receiver: &str, tables: Vec<RoutedTable>| Link {
            sender: id("m"),
            sender_node: None,
            receiver: id(receiver),
            receiver_node: None,
            tables,
            sequences: vec![],
            sender_settings: StoreSettings::default(),
            receiver_settings: StoreSettings::default(),
        };
        let links = vec![
            link(
                "s1",
                vec![
                    table("a", "m", ReturnService::Receipt { by_request: false }),
                    table("b", "m", ReturnService::Twosafe { by_request: true }),
                    // Forwarded from another origin: never waits here.
                    table("c", "x", ReturnService::Receipt { by_request: false }),
                ],
            ),
            link(
                "s2",
                vec![table("a", "m", ReturnService::Receipt { by_request: true })],
            ),
        ];
        let routes = ReturnRoutes::from_links(&id("m"), &links);
        let a = QualName::bare("a");
        let b = QualName::bare("b");
        let c = QualName::bare("c");
        assert_eq!(routes.awaits([&a], false), vec![receipt("s1")]);
        assert_eq!(
            routes.awaits([&a], true),
            vec![receipt("s1"), receipt("s2")]
        );
        assert_eq!(routes.awaits([&a, &b], false), vec![receipt("s1")]);
        assert_eq!(routes.awaits([&a, &b], true)[0], twosafe("s1"));
        assert!(routes.awaits([&c], true).is_empty());
    }
}
