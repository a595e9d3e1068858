//! The failover decision: which silent masters to replace, by whom, and why not.
//!
//! This module is pure (no I/O, no clock, no randomness), like [`crate::state`]: the Raft
//! leader keeps a [`HealthView`] of the [`HealthReport`]s the nodes send it every
//! heartbeat, and calls [`decide`] with the applied [`ClusterState`] and its own
//! monotonic "now". [`decide`] answers a [`Plan`]: the [`Command::SetMaster`]s to propose
//! and the silent masters it cannot replace, with the reason. Proposing, timing and
//! confirming leadership are the caller's: the decision is a function, so it is tested
//! here without a cluster, and every leader that sees the same state and view decides
//! the same.
//!
//! ```text
//!  nodes ── HealthReport (own seq, high-water per origin, echo) ──► leader's HealthView
//!                                                                  │ decide(state, view, now)
//!  per MASTER element, in (scheme, element) order                  ▼
//!    master heard within failover_timeout? ─── yes ──► nothing
//!    automatic failover off? ───────────────── yes ──► Blocked(Disabled)
//!    subscribers: registered, not the master; live = START | PAUSE and reported
//!                 within candidate_fresh ───── none live ──► Blocked(NoLiveSubscriber)
//!    settled = live, and its report echoes a stamp later than the master's last
//!              hearing + failover_timeout (sent after every lease of the master ended)
//!    holders = return service in effect (commits waited for them)
//!      holders, none settled ─── one live ──► Blocked(AwaitingReports)
//!                            └── none live ─► Blocked(HoldersSilent)
//!    candidates: settled, high-water of the master ≥ the lowest settled holder's
//!      (so holding every commit acknowledged under a return service)
//!                                       ─── none ──► Blocked(AwaitingReports)
//!    rank: fewest missing of earlier masters' kept commits ▸ high-water ▸ holder
//!          ▸ list order
//!    first ranked within max_lag ──────────────────── none ──► Blocked(TooFarBehind)
//!    SetMaster { epoch + 1, fork point (master, chosen's high-water) }
//!        validate ── Err ──► Blocked(Refused)   Ok ──► Plan.commands
//! ```
//!
//! Why this is safe to get wrong in time but not in order:
//!
//! * Every command is a compare-and-set on the element's epoch ([`crate::state`]): a
//!   decision made on an old state, by a leader that has since been deposed, or twice,
//!   is rejected when applied. So [`decide`] needs no memory of what it proposed.
//! * A master is replaced only after `failover_timeout` without a report, which the
//!   caller keeps above the master lease plus a margin: by then the silent master has
//!   stopped accepting commits, and the new epoch fences it if it comes back.
//! * A leader counts silence from when it started keeping its view at the earliest
//!   ([`HealthView::since`]), so a new leader waits a full timeout before replacing a
//!   master it never heard from, instead of acting on history it did not see.
//! * The fork point records how much of the old master's origin the new master had: the
//!   old master, when it rejoins, sets aside what it committed past that point. It comes
//!   from a settled report, so every commit the master acknowledged is at or below it
//!   on the new master: nothing acknowledged under a return service is set aside.
//! * A report's receipt time says nothing of when it was built (a stalled node sends
//!   late). The leader stamps each answer and the node echoes the stamp in its next
//!   report, built after it had the answer: that proves, by causality alone, that the
//!   report describes the node after the stamp.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hawser_core::{Epoch, Gtid, Ident, NodeId, QualName};
use hawser_scheme::ast::{Element, OwnerRole, ReturnService, StoreName};
use serde::{Deserialize, Serialize};

use crate::state::{
    self, ClusterState, Command, ControlError, ReceiverState, ReturnServiceState, SchemeState,
};

/// What a node tells the Raft leader every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReport {
    pub node: NodeId,
    /// This node's own last committed seq (its origin's high-water).
    pub own_seq: u64,
    /// Per origin node, the highest seq of that origin this node holds (durably).
    pub high_water: BTreeMap<NodeId, u64>,
    /// The cluster state version this node had applied when it sent the report.
    pub state_version: u64,
    /// The node gave its master lease up before it sent the report, told that the
    /// role of an element it masters is moving (a drained switchover): it takes no
    /// write as master until a new grant, and `own_seq` is final until then.
    #[serde(default)]
    pub lease_released: bool,
    /// The stamp of the last answer this node had from the leader before it built the
    /// report ([`Echo`]): the report was sent after that moment of the leader's clock.
    #[serde(default)]
    pub echo: Option<Echo>,
}

/// A moment of one leader's clock, as the leader stamped its answer to a report and the
/// node handed it back in its next one. The node read what it reports after it had the
/// answer, so the leader knows the report describes the node at a moment after the
/// stamp: causality, with no clock compared between machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Echo {
    pub leader: NodeId,
    pub term: u64,
    /// The leader's monotonic clock (its [`HealthView`] times), in microseconds.
    pub micros: u64,
}

impl HealthReport {
    /// The highest seq of `origin` this node holds; 0 when it holds none.
    pub fn high_water_of(&self, origin: NodeId) -> u64 {
        self.high_water.get(&origin).copied().unwrap_or(0)
    }
}

/// One node as the leader last heard it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHealth {
    /// When the leader received the node's last report (leader's clock).
    pub last_report: Duration,
    pub report: HealthReport,
    /// The report describes the node at a moment after this (leader's clock): the
    /// stamp it echoed, when the stamp is this leader's in this term; `None` if the
    /// node echoed none.
    #[serde(default)]
    pub heard_after: Option<Duration>,
}

/// What the leader knows of every node's liveness.
///
/// Times are [`Duration`]s on the leader's monotonic clock, since an instant the caller
/// chooses: a wall clock could step back and make a live master look silent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthView {
    /// When this leader started keeping the view (it became leader): a node it has not
    /// heard from counts as silent since then, so a new leader never acts on history it
    /// did not see.
    pub since: Duration,
    pub nodes: BTreeMap<NodeId, NodeHealth>,
}

impl HealthView {
    /// An empty view started at `since` (when the leader took over).
    pub fn new(since: Duration) -> Self {
        Self {
            since,
            nodes: BTreeMap::new(),
        }
    }

    /// Records a report received at `at`, sent after `heard_after` (see
    /// [`NodeHealth::heard_after`]); it replaces the node's previous one.
    pub fn record(&mut self, at: Duration, heard_after: Option<Duration>, report: HealthReport) {
        self.nodes.insert(
            report.node,
            NodeHealth {
                last_report: at,
                report,
                heard_after: heard_after.filter(|t| *t <= at),
            },
        );
    }

    /// The last time `node` counts as heard from: its last report, and never earlier
    /// than [`HealthView::since`].
    pub fn last_heard(&self, node: NodeId) -> Duration {
        self.nodes
            .get(&node)
            .map_or(self.since, |h| h.last_report.max(self.since))
    }

    /// How long `node` has been silent at `now` (zero if `now` is not after its last
    /// report).
    pub fn silence(&self, node: NodeId, now: Duration) -> Duration {
        now.saturating_sub(self.last_heard(node))
    }

    /// `node`'s last report if it came within `within` of `now` (inclusive).
    pub fn fresh_report(
        &self,
        node: NodeId,
        now: Duration,
        within: Duration,
    ) -> Option<&HealthReport> {
        self.nodes
            .get(&node)
            .filter(|h| now.saturating_sub(h.last_report) <= within)
            .map(|h| &h.report)
    }
}

/// When and how far the leader fails masters over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverSettings {
    /// Automatic failover on (true by default); off, silent masters are only reported
    /// as blocked with reason [`BlockReason::Disabled`].
    pub enabled: bool,
    /// A master silent (no report) for longer than this is failed over. The caller
    /// guarantees it exceeds the master lease plus margin, so a silent master's lease
    /// has expired by then.
    pub failover_timeout: Duration,
    /// A candidate must have reported within this much of now.
    pub candidate_fresh: Duration,
    /// A candidate may trail the dead master by at most this many transactions (`None`:
    /// no limit). The master reached its last reported own_seq, or what some candidate
    /// holds of it if that is more (it committed after its last report, or this leader
    /// never heard from it).
    pub max_lag: Option<u64>,
}

impl FailoverSettings {
    /// Failover on, without a lag limit. The timing has no default here: it depends on
    /// the master lease, which the caller knows.
    pub fn new(failover_timeout: Duration, candidate_fresh: Duration) -> Self {
        Self {
            enabled: true,
            failover_timeout,
            candidate_fresh,
            max_lag: None,
        }
    }
}

/// The health of a node as status shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    Ok,
    Late,
    Unreachable,
}

impl Liveness {
    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Ok => "ok",
            Liveness::Late => "late",
            Liveness::Unreachable => "unreachable",
        }
    }
}

impl fmt::Display for Liveness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `late` after `late_after` without a report, `unreachable` after `unreachable_after`
/// (both exclusive, as the failover timeout is); a node never heard from counts from
/// `view.since`. Also answers how long it has been since the node was last heard from.
pub fn liveness(
    view: &HealthView,
    node: NodeId,
    now: Duration,
    late_after: Duration,
    unreachable_after: Duration,
) -> (Liveness, Duration) {
    let silence = view.silence(node, now);
    let liveness = if silence > unreachable_after {
        Liveness::Unreachable
    } else if silence > late_after {
        Liveness::Late
    } else {
        Liveness::Ok
    };
    (liveness, silence)
}

/// What the leader should do now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// SetMaster commands to propose, one per element failed over, in (scheme, element)
    /// order.
    pub commands: Vec<Command>,
    /// Elements whose master is silent past the timeout but which cannot be failed over
    /// now, with why, in (scheme, element) order.
    pub blocked: Vec<Blocked>,
}

/// A silent master that stays master for now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    pub scheme: QualName,
    pub element: Ident,
    /// The silent master's store.
    pub master: Ident,
    pub reason: BlockReason,
}

/// Why a silent master is not replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockReason {
    /// Automatic failover is off ([`FailoverSettings::enabled`]).
    Disabled,
    /// An operator paused automatic failover for the whole cluster
    /// ([`ClusterState::failover_pause`]), with this reason.
    Paused { reason: String },
    /// The scheme says `STORE master FAILOVER OFF`.
    OffForStore,
    /// No subscriber of the element is registered, in START or PAUSE, and fresh.
    NoLiveSubscriber,
    /// Live subscribers have not yet reported from after the master's lease ran out
    /// for sure; decided again at the next tick, a report interval later.
    AwaitingReports,
    /// Commits waited for these subscribers' return service, and none of them is live:
    /// any other successor may lack commits the master acknowledged.
    HoldersSilent { holders: Vec<Ident> },
    /// Every live candidate trails the master by more than max_lag: (best candidate
    /// store, its lag, the limit).
    TooFarBehind { best: Ident, lag: u64, max_lag: u64 },
    /// The cluster state refuses the chosen candidate as master (for example it already
    /// masters the same table in another element of the scheme).
    Refused {
        candidate: Ident,
        error: ControlError,
    },
}

impl fmt::Display for BlockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockReason::Disabled => f.write_str(
                "automatic failover is off: bring the master back, or promote a subscriber by \
                 hand with ALTER REPLICATION ... ALTER ELEMENT * IN <master> SET MASTER \
                 <subscriber>",
            ),
            BlockReason::Paused { reason } => {
                f.write_str("automatic failover is paused for the cluster")?;
                if !reason.is_empty() {
                    write!(f, " ({reason})")?;
                }
                f.write_str(
                    ": bring the master back, resume failover (hawser failover resume), or \
                     promote a subscriber by hand with ALTER REPLICATION ... ALTER ELEMENT * \
                     IN <master> SET MASTER <subscriber>",
                )
            }
            BlockReason::OffForStore => f.write_str(
                "the scheme turns automatic failover off for this master (STORE ... FAILOVER \
                 OFF): bring the master back, or promote a subscriber by hand with ALTER \
                 REPLICATION ... ALTER ELEMENT * IN <master> SET MASTER <subscriber>",
            ),
            BlockReason::NoLiveSubscriber => f.write_str(
                "no subscriber can take over: none is registered, receiving (START or PAUSE) \
                 and reporting recently; bring the master or a subscriber back, or start a \
                 subscriber's receiver",
            ),
            BlockReason::AwaitingReports => f.write_str(
                "waiting for a subscriber's report sent after the master's lease ran out \
                 (what it holds of the master is then final); decided at the next report",
            ),
            BlockReason::HoldersSilent { holders } => {
                let names: Vec<&str> = holders.iter().map(|h| h.as_str()).collect();
                let (it, its, which) = match names[..] {
                    [one] => ("it", "its return service", one),
                    _ => ("one of them", "their return services", "<store>"),
                };
                write!(
                    f,
                    "commits were acknowledged under the return service of {}, which \
                     cannot be reached; promoting another subscriber could lose them: bring \
                     the master or {it} back, or give those commits up by disabling {its} \
                     (hawser return-service --subscriber {which} --state disabled)",
                    names.join(", "),
                )
            }
            BlockReason::TooFarBehind { best, lag, max_lag } => write!(
                f,
                "the most up-to-date live subscriber, {best}, trails the master by {lag} \
                 transactions, more than the {max_lag} allowed; bring the master back, or \
                 raise the limit to give those transactions up"
            ),
            BlockReason::Refused { candidate, error } => write!(
                f,
                "the cluster refuses {candidate} as the new master ({error}); fix the scheme \
                 or bring the master back"
            ),
        }
    }
}

/// The failover plan for `state` as `view` sees the nodes at `now`. See the module
/// documentation for the rules.
pub fn decide(
    state: &ClusterState,
    view: &HealthView,
    now: Duration,
    settings: &FailoverSettings,
) -> Plan {
    let decider = Decider {
        state,
        view,
        now,
        settings,
    };
    let mut plan = Plan::default();
    for (name, scheme) in &state.schemes {
        // The element states are keyed by name, so this is (scheme, element) order.
        for element in scheme.elements.keys() {
            let Some(el) = scheme.element(element) else {
                continue;
            };
            match decider.element(name, scheme, el) {
                None => {}
                Some(Ok(cmd)) => plan.commands.push(cmd),
                Some(Err(blocked)) => plan.blocked.push(blocked),
            }
        }
    }
    plan
}

/// The inputs of one [`decide`] call.
struct Decider<'a> {
    state: &'a ClusterState,
    view: &'a HealthView,
    now: Duration,
    settings: &'a FailoverSettings,
}

/// A subscriber of a silent master's element, as the leader sees it.
struct Member<'a> {
    store: &'a Ident,
    node: NodeId,
    /// Commits wait for it ([`return_service_in_effect`]): it holds every commit
    /// acknowledged under its return service.
    holder: bool,
    /// Receiving (START or PAUSE) and reported within `candidate_fresh`.
    live: bool,
    /// Live, and its last report was sent after the master's lease had run out for
    /// sure: what it reports holding of the master is all it will get from it.
    settled: bool,
    /// Its high-water of the silent master's origin (from its last report).
    high_water: u64,
    /// How many commits of the element's earlier masters, up to what the element kept
    /// of each, it lacks.
    missing_earlier: u64,
}

impl Decider<'_> {
    /// `None` when the element needs nothing; else the command, or why there is none.
    fn element(
        &self,
        name: &QualName,
        scheme: &SchemeState,
        el: &Element,
    ) -> Option<Result<Command, Blocked>> {
        let master = self.state.master_of(name, &el.name)?;
        // A silent propagator is routed around by the data plane: its master feeds the
        // propagator's subscribers directly. Only a master's commits need a successor.
        if master.role != OwnerRole::Master {
            return None;
        }
        let master_node = master.node?;
        if self.view.silence(master_node, self.now) <= self.settings.failover_timeout {
            return None;
        }
        let blocked = |reason| Blocked {
            scheme: name.clone(),
            element: el.name.clone(),
            master: master.store.clone(),
            reason,
        };
        if !self.settings.enabled {
            return Some(Err(blocked(BlockReason::Disabled)));
        }
        if let Some(pause) = &self.state.failover_pause {
            return Some(Err(blocked(BlockReason::Paused {
                reason: pause.reason.clone(),
            })));
        }
        if !hawser_scheme::route::StoreSettings::of(&scheme.scheme, master.store).failover {
            return Some(Err(blocked(BlockReason::OffForStore)));
        }
        let members = self.members(name, scheme, el, master_node);
        if !members.iter().any(|m| m.live) {
            return Some(Err(blocked(BlockReason::NoLiveSubscriber)));
        }
        // Every commit acknowledged under a return service is held by every holder,
        // each origin's commits arriving in seq order: a settled holder's high-water
        // bounds them all, and any subscriber at or past it holds them too.
        let holders: Vec<&Member<'_>> = members.iter().filter(|m| m.holder).collect();
        let bar = holders
            .iter()
            .filter(|m| m.settled)
            .map(|m| m.high_water)
            .min();
        if !holders.is_empty() && bar.is_none() {
            let reason = if holders.iter().any(|m| m.live) {
                BlockReason::AwaitingReports
            } else {
                BlockReason::HoldersSilent {
                    holders: holders.iter().map(|m| m.store.clone()).collect(),
                }
            };
            return Some(Err(blocked(reason)));
        }
        let bar = bar.unwrap_or(0);
        let mut candidates: Vec<&Member<'_>> = members
            .iter()
            .filter(|m| m.settled && m.high_water >= bar)
            .collect();
        if candidates.is_empty() {
            return Some(Err(blocked(BlockReason::AwaitingReports)));
        }
        // Stable: equal candidates keep the subscriber list's order. Between equal
        // high-waters a holder goes first: the one the scheme made the standby.
        candidates.sort_by_key(|c| (c.missing_earlier, Reverse(c.high_water), !c.holder));
        let best = candidates[0];
        // How far the master got: at least its last report, and at least what any
        // candidate holds of it (it may have committed more after its last report, and a
        // new leader may have no report of it at all).
        let reached = candidates
            .iter()
            .map(|c| c.high_water)
            .chain(self.view.nodes.get(&master_node).map(|h| h.report.own_seq))
            .max()
            .unwrap_or(0);
        let lag = |c: &Member<'_>| reached.saturating_sub(c.high_water);
        let chosen = match self.settings.max_lag {
            None => best,
            Some(max_lag) => match candidates.iter().find(|c| lag(c) <= max_lag) {
                Some(c) => c,
                None => {
                    return Some(Err(blocked(BlockReason::TooFarBehind {
                        best: best.store.clone(),
                        lag: lag(best),
                        max_lag,
                    })));
                }
            },
        };
        let cmd = Command::SetMaster {
            scheme: name.clone(),
            element: el.name.clone(),
            node: chosen.node,
            epoch: Epoch(master.epoch.0 + 1),
            fork_point: Some(Gtid::new(master_node, chosen.high_water)),
        };
        // Validated on the state it was decided on, as the node validates before
        // proposing; the apply validates again against whatever committed meanwhile.
        Some(match state::validate(self.state, &cmd) {
            Ok(()) => Ok(cmd),
            Err(error) => Err(blocked(BlockReason::Refused {
                candidate: chosen.store.clone(),
                error,
            })),
        })
    }

    /// The element's registered subscribers other than its master, in subscriber
    /// list order.
    fn members<'s>(
        &self,
        name: &QualName,
        scheme: &'s SchemeState,
        el: &'s Element,
        master_node: NodeId,
    ) -> Vec<Member<'s>> {
        // Every lease any leader granted the master has run out by its last hearing
        // plus the failover timeout (docs/control.md, "Failover timing"); a report sent
        // after that holds every commit the master acknowledged.
        let settled_at = self.view.last_heard(master_node) + self.settings.failover_timeout;
        let kept = kept_of_earlier_masters(self.state, name, el, master_node);
        el.subscriber_stores()
            // A subscriber that keeps the table as another target (a CCD, a point-in-time
            // copy with its extra column, INTO another table) holds no copy to master.
            .filter(|r| state::holds_a_copy(el, &r.name))
            .filter_map(|r| match &r.name {
                StoreName::Named(store) => Some(store),
                StoreName::Local => None,
            })
            .filter_map(|store| {
                let node = self.state.node_by_store(store)?.id;
                if node == master_node {
                    return None;
                }
                // STOP and FAILED receivers were not sent to: they may lack commits the
                // master acknowledged, and a FAILED one lacks log it can no longer get.
                let receiver = scheme.receiver_state(store);
                let receiving = matches!(receiver, ReceiverState::Start | ReceiverState::Pause);
                let fresh = self.view.nodes.get(&node).filter(|h| {
                    self.now.saturating_sub(h.last_report) <= self.settings.candidate_fresh
                });
                let live = receiving && fresh.is_some();
                let settled = live
                    && fresh
                        .and_then(|h| h.heard_after)
                        .is_some_and(|t| t >= settled_at);
                let report = self.view.nodes.get(&node).map(|h| &h.report);
                let holds = |origin: NodeId| report.map_or(0, |r| r.high_water_of(origin));
                Some(Member {
                    store,
                    node,
                    holder: return_service_in_effect(scheme, el, store, receiver),
                    live,
                    settled,
                    high_water: holds(master_node),
                    missing_earlier: kept
                        .iter()
                        .map(|(origin, seq)| seq.saturating_sub(holds(*origin)))
                        .sum(),
                })
            })
            .collect()
    }
}

/// Per earlier master of `el` deposed by a failover (not `current`): the last seq of
/// its origin the element kept, the fork point of the latest failover away from it.
/// A successor lacking some of those lacks commits every copy should have (they may
/// have been acknowledged under a return service in their time), so it ranks behind
/// one that holds them. Masters moved by a switchover drained first: nothing records
/// how far they got, and they are not counted.
fn kept_of_earlier_masters(
    state: &ClusterState,
    name: &QualName,
    el: &Element,
    current: NodeId,
) -> BTreeMap<NodeId, u64> {
    let mut kept = BTreeMap::new();
    let history = state
        .schemes
        .get(name)
        .and_then(|s| s.elements.get(&el.name))
        .map(|e| e.history.as_slice())
        .unwrap_or_default();
    for fork in history.iter().filter_map(|r| r.fork_point) {
        if fork.origin != current {
            let seq = kept.entry(fork.origin).or_insert(0);
            *seq = (*seq).max(fork.seq);
        }
    }
    kept
}

/// Whether commits of `el` wait for `store`: it subscribes with RETURN RECEIPT or RETURN
/// TWOSAFE (by request or not), its return service is enabled, and its receiver is
/// started. A paused receiver is not sent to, so commits stop waiting for it (at once, or
/// after RETURN WAIT TIME with RETURN SERVICES ON WHEN STOPPED): it may lack commits that
/// were acknowledged, and gets no preference.
fn return_service_in_effect(
    scheme: &SchemeState,
    el: &Element,
    store: &Ident,
    receiver: ReceiverState,
) -> bool {
    let written = el
        .subscription_of(&StoreName::Named(store.clone()))
        .and_then(|c| c.return_service);
    matches!(
        written,
        Some(ReturnService::Receipt { .. } | ReturnService::Twosafe { .. })
    ) && scheme.return_service_state(store) == ReturnServiceState::Enabled
        && receiver == ReceiverState::Start
}

/// A master role an ALTER REPLICATION moves from one registered node to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterMove {
    pub scheme: QualName,
    pub element: Ident,
    pub from: NodeId,
    /// The new master's node, if its store has registered.
    pub to: Option<NodeId>,
}

/// The master roles `alter` would move between nodes (`SET MASTER`, or any change that
/// gives a MASTER element another owner): each needs the planned switchover protocol
/// (the old master fenced, its lease run out, the new one caught up) before the ALTER
/// commits, so that two masters never take writes at once. An ALTER that does not
/// apply moves nothing (the state refuses it anyway).
pub fn master_moves(
    state: &ClusterState,
    alter: &hawser_scheme::ast::AlterReplication,
) -> Vec<MasterMove> {
    let Some(old) = state.schemes.get(&alter.name) else {
        return Vec::new();
    };
    let Ok(next) = hawser_scheme::apply(&old.scheme, alter) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for el in &next.elements {
        let Some(before) = state.master_of(&alter.name, &el.name) else {
            continue;
        };
        let (Some(from), OwnerRole::Master) = (before.node, before.role) else {
            continue;
        };
        let StoreName::Named(owner) = &el.owner.name else {
            continue;
        };
        if owner == before.store {
            continue;
        }
        out.push(MasterMove {
            scheme: alter.name.clone(),
            element: el.name.clone(),
            from,
            to: state.node_by_store(owner).map(|n| n.id),
        });
    }
    out
}

/// What a switchover commits once its old masters are out of the way. While they
/// answered, the ALTER as written. When every old master is silent — the operator
/// fails them over by hand — and the ALTER only sets masters: one `SetMaster` per move,
/// with the fork point a failover records (`forked(move)`: the new master's
/// high-water of the old master's origin), so that what a silent master committed
/// past it is set aside when it comes back, never kept unseen. `None` from `forked`:
/// that old master answered.
pub fn switchover_commands(
    state: &ClusterState,
    alter: &hawser_scheme::ast::AlterReplication,
    moves: &[MasterMove],
    forked: impl Fn(&MasterMove) -> Option<u64>,
) -> Vec<Command> {
    let as_written = || {
        vec![Command::AlterScheme {
            alter: alter.clone(),
        }]
    };
    let only_set_master = alter.ops.iter().all(|op| {
        matches!(
            op,
            hawser_scheme::ast::AlterOp::AlterElement {
                action: hawser_scheme::ast::ElementAction::SetMaster(_),
                ..
            }
        )
    });
    if moves.is_empty() || !only_set_master {
        return as_written();
    }
    let mut out = Vec::new();
    for m in moves {
        let (Some(to), Some(has)) = (m.to, forked(m)) else {
            return as_written();
        };
        let Some(current) = state.master_of(&m.scheme, &m.element) else {
            return as_written();
        };
        out.push(Command::SetMaster {
            scheme: m.scheme.clone(),
            element: m.element.clone(),
            node: to,
            epoch: Epoch(current.epoch.0 + 1),
            fork_point: Some(Gtid::new(m.from, has)),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{apply, validate, NodeInfo, Response};

    #[test]
    fn a_switchover_from_a_silent_master_records_the_fork_point_a_failover_would() {
        let st = cluster(ASYNC);
        let alter = |text: &str| match ddl(text) {
            Command::AlterScheme { alter } => alter,
            other => panic!("not an ALTER: {other:?}"),
        };
        let set = alter("ALTER REPLICATION r1 ALTER ELEMENT * IN masterds SET MASTER sub2;");
        let moves = master_moves(&st, &set);
        // The old master answered: the ALTER as written.
        assert_eq!(
            switchover_commands(&st, &set, &moves, |_| None),
            [Command::AlterScheme { alter: set.clone() }]
        );
        // Silent: a failover by hand, with its fork point, which the state accepts.
        let cmds = switchover_commands(&st, &set, &moves, |_| Some(41));
        assert_eq!(cmds, [set_master(SUB2, 1, 41)]);
        assert_eq!(validate(&st, &cmds[0]), Ok(()));
        // An ALTER that does more than set masters is committed as written.
        let mut more = set.clone();
        more.ops.push(hawser_scheme::ast::AlterOp::DropElement {
            target: hawser_scheme::ast::ElementTarget::Named {
                name: Ident::unquoted("other"),
                span: Default::default(),
            },
            span: Default::default(),
        });
        assert_eq!(
            switchover_commands(&st, &more, &moves, |_| Some(41)),
            [Command::AlterScheme {
                alter: more.clone()
            }]
        );
    }

    #[test]
    fn an_alter_that_moves_a_master_role_is_a_master_move() {
        let st = cluster(ASYNC);
        let alter = |text: &str| match ddl(text) {
            Command::AlterScheme { alter } => alter,
            other => panic!("not an ALTER: {other:?}"),
        };
        let moves = master_moves(
            &st,
            &alter("ALTER REPLICATION r1 ALTER ELEMENT * IN masterds SET MASTER sub2;"),
        );
        assert_eq!(
            moves,
            [MasterMove {
                scheme: QualName::bare("r1"),
                element: Ident::unquoted("e"),
                from: MASTER,
                to: Some(SUB2),
            }]
        );
        // Dropping a subscriber moves no role; an ALTER that does not apply neither.
        assert!(master_moves(
            &st,
            &alter("ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER sub3;")
        )
        .is_empty());
        assert!(master_moves(
            &st,
            &alter("ALTER REPLICATION r1 ALTER ELEMENT e DROP SUBSCRIBER nobody;")
        )
        .is_empty());
    }

    // Helpers as in the state module's tests.

    fn node(id: u64, store: &str) -> NodeInfo {
        NodeInfo {
            id: NodeId(id),
            store: Ident::unquoted(store),
            host: format!("server{id}"),
            grpc_addr: format!("10.0.0.{id}:7000"),
            http_addr: format!("10.0.0.{id}:8000"),
            voter: false,
        }
    }

    fn ddl(text: &str) -> Command {
        let mut cmds = Command::from_ddl(text).unwrap();
        assert_eq!(cmds.len(), 1);
        cmds.remove(0)
    }

    fn must_apply(state: &mut ClusterState, cmd: Command) {
        validate(state, &cmd).unwrap();
        let resp = apply(state, &cmd);
        assert!(matches!(resp, Response::Applied { .. }), "{resp:?}");
    }

    const MASTER: NodeId = NodeId(1);
    const SUB1: NodeId = NodeId(2);
    const SUB2: NodeId = NodeId(3);
    const SUB3: NodeId = NodeId(4);

    /// Nodes 1 to 4 (masterds, sub1, sub2, sub3) and the schemes of `text`.
    fn cluster(text: &str) -> ClusterState {
        let mut st = ClusterState::default();
        for (id, store) in [(1, "masterds"), (2, "sub1"), (3, "sub2"), (4, "sub3")] {
            must_apply(&mut st, Command::RegisterNode(node(id, store)));
        }
        for cmd in Command::from_ddl(text).unwrap() {
            must_apply(&mut st, cmd);
        }
        st
    }

    /// masterds masters e to three asynchronous subscribers.
    const ASYNC: &str = r#"
        CREATE REPLICATION r1
        ELEMENT e TABLE tab
          MASTER masterds ON "server1"
          SUBSCRIBER sub1 ON "server2", sub2 ON "server3", sub3 ON "server4";
    "#;

    /// As [`ASYNC`] but sub2 is RETURN TWOSAFE.
    const TWOSAFE: &str = r#"
        CREATE REPLICATION r1
        ELEMENT e TABLE tab
          MASTER masterds ON "server1"
          SUBSCRIBER sub1 ON "server2"
          SUBSCRIBER sub2 ON "server3" RETURN TWOSAFE
          SUBSCRIBER sub3 ON "server4";
    "#;

    fn r1() -> QualName {
        QualName::bare("r1")
    }

    fn e() -> Ident {
        Ident::unquoted("e")
    }

    fn id(s: &str) -> Ident {
        Ident::unquoted(s)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn settings() -> FailoverSettings {
        FailoverSettings::new(secs(10), secs(2))
    }

    /// `node` reports at `at` with `own_seq` and, of the master's origin, `of_master`,
    /// echoing a stamp of `at` (an answer that came back at once).
    fn report(view: &mut HealthView, node: NodeId, at: Duration, own_seq: u64, of_master: u64) {
        view.record(
            at,
            Some(at),
            HealthReport {
                node,
                own_seq,
                high_water: BTreeMap::from([(MASTER, of_master)]),
                state_version: 0,
                lease_released: false,
                echo: None,
            },
        );
    }

    /// A view started at 0 in which the master last reported at 5 s with own seq 100 and
    /// the subscribers report at `now` with the given high-waters of the master.
    fn view_at(now: Duration, subscribers: &[(NodeId, u64)]) -> HealthView {
        let mut view = HealthView::new(Duration::ZERO);
        report(&mut view, MASTER, secs(5), 100, 100);
        for &(n, hw) in subscribers {
            report(&mut view, n, now, 0, hw);
        }
        view
    }

    /// ASYNC after masterds failed over to sub1 with fork point masterds:50.
    fn failed_over_to_sub1() -> ClusterState {
        let mut st = cluster(ASYNC);
        must_apply(
            &mut st,
            Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: SUB1,
                epoch: Epoch(1),
                fork_point: Some(Gtid::new(MASTER, 50)),
            },
        );
        st
    }

    /// `node` reports at `at` (echoing `at`) holding `of_old` of masterds and
    /// `of_sub1` of sub1.
    fn report_both(view: &mut HealthView, node: NodeId, at: Duration, of_old: u64, of_sub1: u64) {
        view.record(
            at,
            Some(at),
            HealthReport {
                node,
                own_seq: 0,
                high_water: BTreeMap::from([(MASTER, of_old), (SUB1, of_sub1)]),
                state_version: 0,
                lease_released: false,
                echo: None,
            },
        );
    }

    fn set_master(to: NodeId, epoch: u64, fork: u64) -> Command {
        Command::SetMaster {
            scheme: r1(),
            element: e(),
            node: to,
            epoch: Epoch(epoch),
            fork_point: Some(Gtid::new(MASTER, fork)),
        }
    }

    fn blocked(reason: BlockReason) -> Blocked {
        Blocked {
            scheme: r1(),
            element: e(),
            master: id("masterds"),
            reason,
        }
    }

    #[test]
    fn a_silent_master_fails_over_to_its_most_up_to_date_subscriber() {
        let st = cluster(ASYNC);
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 90), (SUB2, 97), (SUB3, 95)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 97)]);
        assert!(plan.blocked.is_empty());
    }

    #[test]
    fn a_short_silence_under_the_timeout_never_fails_over() {
        let st = cluster(ASYNC);
        let subs = [(SUB1, 90), (SUB2, 97)];
        // The master last reported at 5 s: silent for 1 s, then exactly the timeout.
        for now in [secs(6), secs(15)] {
            let plan = decide(&st, &view_at(now, &subs), now, &settings());
            assert_eq!(plan, Plan::default(), "at {now:?}");
        }
        // Not even reported as blocked when failover is off.
        let off = FailoverSettings {
            enabled: false,
            ..settings()
        };
        let now = secs(15);
        assert_eq!(
            decide(&st, &view_at(now, &subs), now, &off),
            Plan::default()
        );
        let now = secs(15) + Duration::from_millis(1);
        let plan = decide(&st, &view_at(now, &subs), now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 97)]);
    }

    #[test]
    fn a_new_leader_waits_a_full_timeout_from_when_it_started() {
        let st = cluster(ASYNC);
        // The master died long ago, but this leader took over at 100 s and never heard
        // from anyone before.
        let since = secs(100);
        let view_at = |now: Duration| {
            let mut view = HealthView::new(since);
            report(&mut view, SUB1, now, 0, 40);
            view
        };
        for now in [secs(101), secs(109), secs(110)] {
            assert_eq!(
                decide(&st, &view_at(now), now, &settings()),
                Plan::default(),
                "at {now:?}"
            );
        }
        let now = secs(110) + Duration::from_millis(1);
        let plan = decide(&st, &view_at(now), now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 40)]);
        // A report older than since (kept from an earlier view) counts from since too.
        let mut view = view_at(secs(105));
        report(&mut view, MASTER, secs(3), 100, 100);
        assert_eq!(view.silence(MASTER, secs(105)), secs(5));
    }

    #[test]
    fn only_master_elements_fail_over_a_silent_propagator_is_left_to_the_data_plane() {
        // masterds feeds sub1, which propagates the same table to sub2 and sub3.
        let st = cluster(
            r#"
            CREATE REPLICATION r1
            ELEMENT a TABLE tab MASTER masterds ON "server1" SUBSCRIBER sub1 ON "server2"
            ELEMENT e TABLE tab PROPAGATOR sub1 ON "server2"
              SUBSCRIBER sub2 ON "server3", sub3 ON "server4";
            "#,
        );
        let now = secs(60);
        let mut view = HealthView::new(Duration::ZERO);
        for n in [MASTER, SUB2, SUB3] {
            report(&mut view, n, now, 5, 5);
        }
        // The propagator sub1 is silent (never reported): nothing, not even blocked.
        assert_eq!(decide(&st, &view, now, &settings()), Plan::default());
    }

    #[test]
    fn an_element_whose_master_store_has_no_registered_node_is_skipped() {
        let st = cluster(
            r#"
            CREATE REPLICATION r1
            ELEMENT e TABLE tab MASTER ghost ON "server9" SUBSCRIBER sub1 ON "server2";
            "#,
        );
        let now = secs(60);
        let view = view_at(now, &[(SUB1, 3)]);
        assert_eq!(decide(&st, &view, now, &settings()), Plan::default());
    }

    #[test]
    fn only_subscribers_holding_what_the_twosafe_one_holds_may_take_over() {
        // Every commit acknowledged under RETURN TWOSAFE is at or below sub2's 90:
        // sub1 and sub3, past it, hold them all too, and sub1 holds the most.
        let st = cluster(TWOSAFE);
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 99), (SUB2, 90), (SUB3, 98)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 99)]);
        // Below it, they may lack acknowledged commits: only sub2 may take over.
        let view = view_at(now, &[(SUB1, 89), (SUB2, 90), (SUB3, 88)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 90)]);
        // Level with it, the TWOSAFE subscriber goes first.
        let view = view_at(now, &[(SUB1, 90), (SUB2, 90), (SUB3, 90)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 90)]);
    }

    #[test]
    fn a_silent_twosafe_subscriber_blocks_a_failover_that_could_lose_what_it_acknowledged() {
        let st = cluster(TWOSAFE);
        let now = secs(20);
        // sub2 never reported (or stopped reporting): sub1 may lack what it holds.
        let view = view_at(now, &[(SUB1, 99), (SUB3, 98)]);
        let plan = decide(&st, &view, now, &settings());
        assert!(plan.commands.is_empty());
        assert_eq!(
            plan.blocked,
            vec![blocked(BlockReason::HoldersSilent {
                holders: vec![id("sub2")]
            })]
        );
        let text = plan.blocked[0].reason.to_string();
        assert!(
            text.contains("sub2") && text.contains("--state disabled"),
            "{text}"
        );
        // Disabling its return service (or stopping its receiver) gives those commits
        // up: the others may take over.
        for cmd in [
            Command::SetReturnServiceState {
                scheme: r1(),
                store: id("sub2"),
                state: ReturnServiceState::Disabled,
            },
            Command::SetReceiverState {
                scheme: r1(),
                store: id("sub2"),
                state: ReceiverState::Stop,
            },
        ] {
            let mut given_up = st.clone();
            must_apply(&mut given_up, cmd);
            let plan = decide(&given_up, &view, now, &settings());
            assert_eq!(plan.commands, vec![set_master(SUB1, 1, 99)]);
        }
    }

    #[test]
    fn a_report_sent_before_the_masters_lease_surely_ran_out_does_not_count() {
        // The master was last heard at 5 s; the timeout is 10 s: what a subscriber
        // reports holding counts once its report left after 15 s (the stamp it echoes).
        let st = cluster(TWOSAFE);
        let now = secs(20);
        let mut view = view_at(now, &[(SUB1, 99), (SUB3, 98)]);
        let early = |view: &mut HealthView, after: Duration| {
            view.record(
                now,
                Some(after),
                HealthReport {
                    node: SUB2,
                    own_seq: 0,
                    high_water: BTreeMap::from([(MASTER, 90)]),
                    state_version: 0,
                    lease_released: false,
                    echo: None,
                },
            )
        };
        early(&mut view, secs(15) - Duration::from_millis(1));
        let plan = decide(&st, &view, now, &settings());
        assert!(plan.commands.is_empty());
        assert_eq!(plan.blocked, vec![blocked(BlockReason::AwaitingReports)]);
        // A report with no stamp at all is live but never settled either.
        view.nodes.get_mut(&SUB2).unwrap().heard_after = None;
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.blocked, vec![blocked(BlockReason::AwaitingReports)]);
        early(&mut view, secs(15));
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 99)]);
        // Asynchronous subscribers alone: the same wait.
        let st = cluster(ASYNC);
        let mut view = view_at(now, &[]);
        view.record(
            now,
            Some(secs(14)),
            HealthReport {
                node: SUB1,
                own_seq: 0,
                high_water: BTreeMap::from([(MASTER, 90)]),
                state_version: 0,
                lease_released: false,
                echo: None,
            },
        );
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.blocked, vec![blocked(BlockReason::AwaitingReports)]);
    }

    #[test]
    fn a_subscriber_lacking_an_earlier_masters_commits_ranks_behind_one_that_has_them() {
        // masterds failed over to sub1 (fork masterds:50); now sub1 is silent. sub2
        // is ahead of sub3 on sub1's commits but lacks 10 of masterds's the element
        // kept: sub3, which has them, takes over.
        let st = failed_over_to_sub1();
        let now = secs(20);
        let mut view = HealthView::new(Duration::ZERO);
        report_both(&mut view, SUB2, now, 40, 30);
        report_both(&mut view, SUB3, now, 50, 20);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(
            plan.commands,
            vec![Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: SUB3,
                epoch: Epoch(2),
                fork_point: Some(Gtid::new(SUB1, 20)),
            }]
        );
        // Holding more than the element kept of it (commits set aside) is no merit.
        report_both(&mut view, SUB2, now, 70, 30);
        let plan = decide(&st, &view, now, &settings());
        assert!(
            matches!(&plan.commands[..], [Command::SetMaster { node, .. }] if *node == SUB2),
            "{plan:?}"
        );
    }

    #[test]
    fn with_several_holders_the_lowest_one_bounds_what_was_acknowledged() {
        let st = cluster(
            r#"
            CREATE REPLICATION r1
            ELEMENT e TABLE tab
              MASTER masterds ON "server1"
              SUBSCRIBER sub1 ON "server2" RETURN RECEIPT BY REQUEST
              SUBSCRIBER sub2 ON "server3"
              SUBSCRIBER sub3 ON "server4" RETURN TWOSAFE BY REQUEST;
            "#,
        );
        let now = secs(20);
        // Commits waited for both sub1 and sub3: acknowledged ones are at or below 80.
        let view = view_at(now, &[(SUB1, 80), (SUB2, 99), (SUB3, 85)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 99)]);
        let view = view_at(now, &[(SUB1, 80), (SUB2, 79), (SUB3, 85)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB3, 1, 85)]);
        // One of them silent: the other's high-water is bound enough.
        let view = view_at(now, &[(SUB2, 99), (SUB3, 85)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 99)]);
    }

    #[test]
    fn a_disabled_return_service_loses_its_preference() {
        let mut st = cluster(TWOSAFE);
        must_apply(
            &mut st,
            Command::SetReturnServiceState {
                scheme: r1(),
                store: id("sub2"),
                state: ReturnServiceState::Disabled,
            },
        );
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 99), (SUB2, 90), (SUB3, 98)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 99)]);
    }

    #[test]
    fn a_paused_receiver_is_a_candidate_without_its_return_service_preference() {
        // Commits stop waiting for a paused receiver, so it may lack acknowledged ones.
        let mut st = cluster(TWOSAFE);
        must_apply(
            &mut st,
            Command::SetReceiverState {
                scheme: r1(),
                store: id("sub2"),
                state: ReceiverState::Pause,
            },
        );
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 80), (SUB2, 90), (SUB3, 85)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 90)]);
        let view = view_at(now, &[(SUB1, 99), (SUB2, 90), (SUB3, 85)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 99)]);
    }

    #[test]
    fn stopped_and_failed_receivers_are_not_candidates() {
        let mut st = cluster(TWOSAFE);
        for (store, rs) in [
            ("sub2", ReceiverState::Stop),
            ("sub3", ReceiverState::Failed),
        ] {
            must_apply(
                &mut st,
                Command::SetReceiverState {
                    scheme: r1(),
                    store: id(store),
                    state: rs,
                },
            );
        }
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 10), (SUB2, 99), (SUB3, 99)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 10)]);
        // Without sub1, nobody is left.
        let view = view_at(now, &[(SUB2, 99), (SUB3, 99)]);
        let plan = decide(&st, &view, now, &settings());
        assert!(plan.commands.is_empty());
        assert_eq!(plan.blocked, vec![blocked(BlockReason::NoLiveSubscriber)]);
    }

    #[test]
    fn stale_candidates_are_not_candidates_and_fresh_is_inclusive() {
        let st = cluster(ASYNC);
        let now = secs(20);
        let mut view = view_at(now, &[(SUB1, 50)]);
        // sub2 reported exactly candidate_fresh ago: fresh. sub3 a millisecond earlier.
        report(&mut view, SUB2, secs(18), 0, 60);
        report(&mut view, SUB3, secs(18) - Duration::from_millis(1), 0, 99);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 60)]);
        // Registered subscribers that never reported are not candidates either.
        let view = view_at(now, &[]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.blocked, vec![blocked(BlockReason::NoLiveSubscriber)]);
    }

    #[test]
    fn an_unregistered_subscriber_is_not_a_candidate() {
        let st = cluster(
            r#"
            CREATE REPLICATION r1
            ELEMENT e TABLE tab
              MASTER masterds ON "server1"
              SUBSCRIBER nobody ON "server9", sub1 ON "server2";
            "#,
        );
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 7)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 7)]);
    }

    /// A subscriber keeping the table as a CCD, or INTO another table, holds no copy of
    /// it: never promoted, however far ahead; a REPLICA or USER COPY of the same table is.
    #[test]
    fn a_subscriber_holding_another_target_than_a_copy_is_not_a_candidate() {
        let st = cluster(
            r#"
            CREATE REPLICATION r1
            ELEMENT e TABLE tab
              MASTER masterds ON "server1"
              SUBSCRIBER sub1 ON "server2" AS CCD NONCONDENSED INTO tab_hist
              SUBSCRIBER sub2 ON "server3" AS USER COPY INTO tab_copy
              SUBSCRIBER sub3 ON "server4" AS REPLICA;
            "#,
        );
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 99), (SUB2, 98), (SUB3, 7)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB3, 1, 7)]);
    }

    #[test]
    fn equal_candidates_are_ranked_by_their_order_in_the_subscriber_list() {
        let st = cluster(
            r#"
            CREATE REPLICATION r1
            ELEMENT e TABLE tab
              MASTER masterds ON "server1"
              SUBSCRIBER sub3 ON "server4", sub1 ON "server2", sub2 ON "server3";
            "#,
        );
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 70), (SUB2, 70), (SUB3, 70)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB3, 1, 70)]);
        // A missing high-water of the master counts as 0.
        let mut view = view_at(now, &[(SUB1, 0), (SUB2, 1)]);
        view.record(
            now,
            Some(now),
            HealthReport {
                node: SUB3,
                own_seq: 0,
                high_water: BTreeMap::new(),
                state_version: 0,
                lease_released: false,
                echo: None,
            },
        );
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 1)]);
    }

    #[test]
    fn max_lag_blocks_naming_the_best_candidate_when_none_is_close_enough() {
        // The master reported 100; the best candidate, sub1, holds 95.
        let st = cluster(TWOSAFE);
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 95), (SUB2, 70), (SUB3, 80)]);
        let limit = |max_lag| FailoverSettings {
            max_lag: Some(max_lag),
            ..settings()
        };
        // At exactly the limit a candidate is still eligible.
        let plan = decide(&st, &view, now, &limit(5));
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 95)]);
        let plan = decide(&st, &view, now, &limit(4));
        assert!(plan.commands.is_empty());
        assert_eq!(
            plan.blocked,
            vec![blocked(BlockReason::TooFarBehind {
                best: id("sub1"),
                lag: 5,
                max_lag: 4,
            })]
        );
    }

    #[test]
    fn max_lag_passes_over_a_candidate_missing_earlier_commits_if_it_must() {
        // After masterds:50 failed over to sub1, sub2 lacks 10 of masterds's commits
        // but holds all of sub1's; sub3 has masterds's but trails sub1 by 20.
        let st = failed_over_to_sub1();
        let now = secs(20);
        let mut view = HealthView::new(Duration::ZERO);
        report_both(&mut view, SUB2, now, 40, 30);
        report_both(&mut view, SUB3, now, 50, 10);
        let plan = decide(&st, &view, now, &settings());
        assert!(matches!(&plan.commands[..], [Command::SetMaster { node, .. }] if *node == SUB3));
        let limited = FailoverSettings {
            max_lag: Some(10),
            ..settings()
        };
        let plan = decide(&st, &view, now, &limited);
        assert!(matches!(&plan.commands[..], [Command::SetMaster { node, .. }] if *node == SUB2));
    }

    #[test]
    fn without_a_report_of_the_master_lag_counts_from_the_highest_candidate() {
        // The leader never heard from the master: what the candidates hold of it is all
        // it knows.
        let st = cluster(ASYNC);
        let now = secs(20);
        let mut view = HealthView::new(Duration::ZERO);
        report(&mut view, SUB1, now, 0, 90);
        report(&mut view, SUB2, now, 0, 70);
        let limited = FailoverSettings {
            max_lag: Some(10),
            ..settings()
        };
        let plan = decide(&st, &view, now, &limited);
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 90)]);
        // Without sub1, sub2 is as far as anyone knows the master got.
        view.nodes.remove(&SUB1);
        let plan = decide(&st, &view, now, &limited);
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 70)]);
    }

    #[test]
    fn a_candidate_ahead_of_the_masters_last_report_raises_the_bar() {
        // The master committed up to 120 after its last report (100); sub1 holds it.
        let st = cluster(TWOSAFE);
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 120), (SUB2, 100)]);
        let limited = FailoverSettings {
            max_lag: Some(10),
            ..settings()
        };
        let plan = decide(&st, &view, now, &limited);
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 120)]);
    }

    #[test]
    fn disabled_failover_only_reports_silent_masters_as_blocked() {
        let st = cluster(ASYNC);
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 90)]);
        let off = FailoverSettings {
            enabled: false,
            ..settings()
        };
        let plan = decide(&st, &view, now, &off);
        assert!(plan.commands.is_empty());
        assert_eq!(plan.blocked, vec![blocked(BlockReason::Disabled)]);
    }

    #[test]
    fn a_paused_cluster_reports_silent_masters_with_the_reason_until_resumed() {
        let mut st = cluster(ASYNC);
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 90)]);
        let pause = |reason: &str| Command::SetFailoverPause {
            pause: Some(crate::state::FailoverPause {
                reason: reason.into(),
                since_unix_ms: 1,
            }),
        };
        assert!(matches!(
            state::apply(&mut st, &pause("kernel upgrade")),
            crate::Response::Applied { .. }
        ));
        let plan = decide(&st, &view, now, &settings());
        assert!(plan.commands.is_empty());
        let reason = BlockReason::Paused {
            reason: "kernel upgrade".into(),
        };
        assert_eq!(plan.blocked, vec![blocked(reason.clone())]);
        let text = reason.to_string();
        assert!(
            text.contains("kernel upgrade") && text.contains("hawser failover resume"),
            "{text}"
        );
        state::apply(&mut st, &Command::SetFailoverPause { pause: None });
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB1, 1, 90)]);
        assert!(plan.blocked.is_empty());
    }

    #[test]
    fn several_elements_of_a_dead_master_each_get_a_command_in_scheme_and_element_order() {
        let st = cluster(
            r#"
            CREATE REPLICATION r2
            ELEMENT b TABLE t2 MASTER masterds ON "server1" SUBSCRIBER sub1 ON "server2", sub2 ON "server3"
            ELEMENT a TABLE t1 MASTER masterds ON "server1" SUBSCRIBER sub2 ON "server3", sub1 ON "server2"
            ELEMENT c TABLE t3 MASTER sub3 ON "server4" SUBSCRIBER masterds ON "server1";
            CREATE REPLICATION r1
            ELEMENT e TABLE tab MASTER masterds ON "server1" SUBSCRIBER sub1 ON "server2";
            "#,
        );
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 90), (SUB2, 90), (SUB3, 0)]);
        let plan = decide(&st, &view, now, &settings());
        let targets: Vec<_> = plan
            .commands
            .iter()
            .map(|c| match c {
                Command::SetMaster {
                    scheme,
                    element,
                    node,
                    ..
                } => (scheme.to_string(), element.to_string(), *node),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        // Equal high-waters: the order of each element's own list decides.
        assert_eq!(
            targets,
            vec![
                ("r1".into(), "e".into(), SUB1),
                ("r2".into(), "a".into(), SUB2),
                ("r2".into(), "b".into(), SUB1),
            ]
        );
        // With sub1 ahead, every element picks it.
        let view = view_at(now, &[(SUB1, 95), (SUB2, 90), (SUB3, 0)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands.len(), 3);
        assert!(plan
            .commands
            .iter()
            .all(|c| matches!(c, Command::SetMaster { node, .. } if *node == SUB1)));
        // Each applies on its own epoch, one after the other.
        let mut next = st.clone();
        for cmd in &plan.commands {
            must_apply(&mut next, cmd.clone());
        }
    }

    #[test]
    fn a_command_the_state_refuses_is_not_emitted_and_is_reported() {
        // sub1 already masters tab in its own element: it cannot master masterds's too.
        let st = cluster(
            r#"
            CREATE REPLICATION r1
            ELEMENT e TABLE tab MASTER masterds ON "server1" SUBSCRIBER sub1 ON "server2"
            ELEMENT f TABLE tab MASTER sub1 ON "server2" SUBSCRIBER masterds ON "server1";
            "#,
        );
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 90)]);
        let plan = decide(&st, &view, now, &settings());
        assert!(plan.commands.is_empty());
        match &plan.blocked[..] {
            [Blocked {
                element,
                reason: BlockReason::Refused { candidate, error },
                ..
            }] => {
                assert_eq!((element, candidate), (&e(), &id("sub1")));
                assert!(matches!(error, ControlError::Invalid(_)), "{error:?}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn after_a_failover_the_next_decision_leaves_the_element_alone() {
        let mut st = cluster(TWOSAFE);
        let now = secs(20);
        let mut view = view_at(now, &[(SUB1, 89), (SUB2, 90), (SUB3, 88)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands, vec![set_master(SUB2, 1, 90)]);
        must_apply(&mut st, plan.commands[0].clone());
        let m = st.master_of(&r1(), &e()).unwrap();
        assert_eq!((m.node, m.epoch), (Some(SUB2), Epoch(1)));
        // The same plan again is refused by the epoch compare-and-set.
        assert!(matches!(
            validate(&st, &plan.commands[0]),
            Err(ControlError::StaleEpoch { .. })
        ));
        // Later: the old master is still silent, the new one reports.
        let later = secs(40);
        for n in [SUB1, SUB2, SUB3] {
            report(&mut view, n, later, 0, 99);
        }
        assert_eq!(decide(&st, &view, later, &settings()), Plan::default());
        // The deposed master is a stopped receiver now: never a candidate, even fresh.
        report(&mut view, MASTER, later, 100, 100);
        let much_later = secs(60);
        for n in [MASTER, SUB1] {
            report(&mut view, n, much_later, 100, 100);
        }
        let plan = decide(&st, &view, much_later, &settings());
        assert_eq!(
            plan.commands,
            vec![Command::SetMaster {
                scheme: r1(),
                element: e(),
                node: SUB1,
                epoch: Epoch(2),
                fork_point: Some(Gtid::new(SUB2, 0)),
            }]
        );
    }

    #[test]
    fn every_command_validates_against_the_state_it_was_decided_on() {
        let st = cluster(TWOSAFE);
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 99), (SUB2, 90), (SUB3, 98)]);
        let plan = decide(&st, &view, now, &settings());
        assert_eq!(plan.commands.len(), 1);
        for cmd in &plan.commands {
            validate(&st, cmd).unwrap();
        }
    }

    #[test]
    fn liveness_counts_from_the_last_report_or_from_since() {
        let mut view = HealthView::new(secs(10));
        report(&mut view, SUB1, secs(12), 0, 0);
        let at = |node, now| liveness(&view, node, secs(now), secs(2), secs(5));
        assert_eq!(at(SUB1, 14), (Liveness::Ok, secs(2)));
        assert_eq!(at(SUB1, 15), (Liveness::Late, secs(3)));
        assert_eq!(at(SUB1, 17), (Liveness::Late, secs(5)));
        assert_eq!(at(SUB1, 18), (Liveness::Unreachable, secs(6)));
        // Never heard from: counted from since.
        assert_eq!(at(SUB2, 11), (Liveness::Ok, secs(1)));
        assert_eq!(at(SUB2, 16), (Liveness::Unreachable, secs(6)));
        // A clock reading before the report is not negative silence.
        assert_eq!(at(SUB1, 5), (Liveness::Ok, Duration::ZERO));
        assert_eq!(Liveness::Unreachable.to_string(), "unreachable");
    }

    #[test]
    fn block_reasons_read_as_sentences_an_operator_can_act_on() {
        let far = BlockReason::TooFarBehind {
            best: id("sub2"),
            lag: 30,
            max_lag: 10,
        }
        .to_string();
        assert!(
            far.contains("sub2") && far.contains("30") && far.contains("10"),
            "{far}"
        );
        for reason in [BlockReason::Disabled, BlockReason::NoLiveSubscriber] {
            let text = reason.to_string();
            assert!(text.contains("bring the master"), "{text}");
        }
    }

    #[test]
    fn views_and_plans_round_trip_through_json() {
        let st = cluster(ASYNC);
        let now = secs(20);
        let view = view_at(now, &[(SUB1, 90), (SUB2, 97)]);
        let json = serde_json::to_string(&view).unwrap();
        assert_eq!(serde_json::from_str::<HealthView>(&json).unwrap(), view);
        let limited = FailoverSettings {
            max_lag: Some(1),
            ..settings()
        };
        for s in [settings(), limited] {
            let plan = decide(&st, &view, now, &s);
            let json = serde_json::to_string(&plan).unwrap();
            assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), plan);
        }
    }

    /// Random clusters and event sequences: reports, time passing, crashes, operator
    /// changes, decisions by the leader and by a stale leader acting on an old state.
    mod property {
        use std::collections::BTreeSet;

        use proptest::collection::vec;
        use proptest::prelude::*;

        use super::*;

        const TIMEOUT: Duration = Duration::from_millis(3_000);
        const FRESH: Duration = Duration::from_millis(1_000);
        /// A master lease: the timeout covers it plus a report interval.
        const LEASE: Duration = Duration::from_millis(2_000);

        #[derive(Debug, Clone)]
        struct ElementSpec {
            master: usize,
            /// (node index, 0 none / 1 RETURN RECEIPT / 2 RETURN TWOSAFE), in list order.
            subscribers: Vec<(usize, u8)>,
        }

        #[derive(Debug, Clone)]
        struct Setup {
            nodes: usize,
            elements: Vec<ElementSpec>,
            max_lag: Option<u64>,
        }

        #[derive(Debug, Clone)]
        enum Event {
            /// The node (if up) commits `commits` more, catches up on every other origin
            /// by `catch_up` percent of what it lacks, and reports to the leader (and to
            /// the stale leader if `to_stale`), echoing a stamp `echo_lag` ms old. A
            /// master that reports acknowledges, under the return services in effect,
            /// every commit all their subscribers hold.
            Report {
                node: usize,
                commits: u64,
                catch_up: Vec<u8>,
                to_stale: bool,
                echo_lag: u64,
            },
            /// The node (if up) receives: catches up on every other origin by
            /// `catch_up` percent of what it lacks, without reporting.
            Apply {
                node: usize,
                catch_up: Vec<u8>,
            },
            /// The node (if up) builds a report of what it holds now, echoing the stamp
            /// of the last answer it had; it reaches the leader at a later [`Deliver`].
            Build(usize),
            /// The node's report built last reaches the leader now; the answer (stamp,
            /// lease from when the report was built) comes back at once.
            Deliver(usize),
            /// The node (if up and within its lease) acknowledges, under the return
            /// services in effect, every commit their subscribers hold now.
            Ack(usize),
            Advance(u64),
            Crash(usize),
            Recover(usize),
            /// The leader decides and applies its commands.
            Decide,
            /// The stale leader decides on its old state and view; its commands are
            /// applied to the real state.
            StaleDecide,
            /// The stale leader copies the real state (and then falls behind again).
            StaleSync,
            /// Leadership moves: the leader's view starts afresh at now.
            NewLeader,
            Receiver(usize, ReceiverState),
            ReturnService(usize, ReturnServiceState),
        }

        fn element_spec(n: usize) -> impl Strategy<Value = ElementSpec> {
            (0..n, vec((any::<bool>(), 0u8..3), n), any::<bool>()).prop_map(
                move |(master, picks, reversed)| {
                    let mut subscribers: Vec<(usize, u8)> = picks
                        .iter()
                        .enumerate()
                        .filter(|&(i, &(take, _))| i != master && take)
                        .map(|(i, &(_, rs))| (i, rs))
                        .collect();
                    if subscribers.is_empty() {
                        subscribers.push(((master + 1) % n, picks[0].1));
                    }
                    if reversed {
                        subscribers.reverse();
                    }
                    ElementSpec {
                        master,
                        subscribers,
                    }
                },
            )
        }

        fn setup() -> impl Strategy<Value = Setup> {
            (3usize..=5).prop_flat_map(|n| {
                (
                    Just(n),
                    vec(element_spec(n), 1..=2),
                    proptest::option::of(0u64..6),
                )
                    .prop_map(|(nodes, elements, max_lag)| Setup {
                        nodes,
                        elements,
                        max_lag,
                    })
            })
        }

        fn event() -> impl Strategy<Value = Event> {
            let receiver = prop_oneof![
                Just(ReceiverState::Start),
                Just(ReceiverState::Pause),
                Just(ReceiverState::Stop),
                Just(ReceiverState::Failed),
            ];
            let return_service = prop_oneof![
                Just(ReturnServiceState::Enabled),
                Just(ReturnServiceState::Disabled),
            ];
            prop_oneof![
                8 => (0..5usize, 0..12u64, vec(0..=100u8, 5), any::<bool>(), 0..4_000u64)
                    .prop_map(|(node, commits, catch_up, to_stale, echo_lag)| Event::Report {
                        node,
                        commits,
                        catch_up,
                        to_stale,
                        echo_lag,
                    }),
                4 => (0..2_500u64).prop_map(Event::Advance),
                3 => (0..5usize, vec(0..=100u8, 5))
                    .prop_map(|(node, catch_up)| Event::Apply { node, catch_up }),
                3 => (0..5usize).prop_map(Event::Build),
                3 => (0..5usize).prop_map(Event::Deliver),
                3 => (0..5usize).prop_map(Event::Ack),
                2 => (0..5usize).prop_map(Event::Crash),
                1 => (0..5usize).prop_map(Event::Recover),
                4 => Just(Event::Decide),
                2 => Just(Event::StaleDecide),
                1 => Just(Event::StaleSync),
                1 => Just(Event::NewLeader),
                1 => (0..5usize, receiver).prop_map(|(n, s)| Event::Receiver(n, s)),
                1 => (0..5usize, return_service).prop_map(|(n, s)| Event::ReturnService(n, s)),
            ]
        }

        fn store(i: usize) -> Ident {
            Ident::unquoted(&format!("s{}", i + 1))
        }

        fn node_id(i: usize) -> NodeId {
            NodeId(i as u64 + 1)
        }

        fn scheme_ddl(setup: &Setup) -> String {
            let at = |i: usize| format!("s{} ON \"server{}\"", i + 1, i + 1);
            let mut text = String::from("CREATE REPLICATION r\n");
            for (k, el) in setup.elements.iter().enumerate() {
                text += &format!("ELEMENT e{k} TABLE t{k} MASTER {}\n", at(el.master));
                for &(sub, rs) in &el.subscribers {
                    let rs = ["", " RETURN RECEIPT", " RETURN TWOSAFE"][rs as usize];
                    text += &format!("  SUBSCRIBER {}{rs}\n", at(sub));
                }
            }
            text + ";"
        }

        struct Sim {
            n: usize,
            settings: FailoverSettings,
            now: Duration,
            state: ClusterState,
            view: HealthView,
            stale_state: ClusterState,
            stale_view: HealthView,
            own: Vec<u64>,
            /// Per node: the report it built and has not delivered, with when it built
            /// it.
            pending: Vec<Option<(Duration, HealthReport)>>,
            /// Per node: the leader's stamp on the last answer it had.
            stamp: Vec<Option<Duration>>,
            /// Per node: until when it holds a master lease.
            lease: Vec<Duration>,
            high_water: Vec<BTreeMap<NodeId, u64>>,
            down: Vec<bool>,
            failovers: usize,
            /// Per element: (its master then, the last seq of the master's origin
            /// acknowledged under a return service). Forgotten when an operator changes
            /// a receiver or return service state (stopping one gives its commits up).
            promised: BTreeMap<Ident, (NodeId, u64)>,
        }

        impl Sim {
            fn new(setup: &Setup) -> Sim {
                let mut state = ClusterState::default();
                for i in 0..setup.nodes {
                    let info = node(node_id(i).0, store(i).as_str());
                    must_apply(&mut state, Command::RegisterNode(info));
                }
                must_apply(&mut state, ddl(&scheme_ddl(setup)));
                Sim {
                    n: setup.nodes,
                    settings: FailoverSettings {
                        max_lag: setup.max_lag,
                        ..FailoverSettings::new(TIMEOUT, FRESH)
                    },
                    now: Duration::ZERO,
                    stale_state: state.clone(),
                    state,
                    view: HealthView::new(Duration::ZERO),
                    stale_view: HealthView::new(Duration::ZERO),
                    own: vec![0; setup.nodes],
                    pending: vec![None; setup.nodes],
                    stamp: vec![None; setup.nodes],
                    lease: vec![Duration::ZERO; setup.nodes],
                    high_water: vec![BTreeMap::new(); setup.nodes],
                    down: vec![false; setup.nodes],
                    failovers: 0,
                    promised: BTreeMap::new(),
                }
            }

            fn step(&mut self, event: &Event) {
                match event {
                    Event::Report {
                        node,
                        commits,
                        catch_up,
                        to_stale,
                        echo_lag,
                    } => {
                        let i = node % self.n;
                        if self.down[i] {
                            return;
                        }
                        self.own[i] += commits;
                        self.catch_up(i, catch_up);
                        let report = HealthReport {
                            node: node_id(i),
                            own_seq: self.own[i],
                            high_water: self.high_water[i].clone(),
                            state_version: self.state.version,
                            lease_released: false,
                            echo: None,
                        };
                        let after = Some(self.now.saturating_sub(Duration::from_millis(*echo_lag)));
                        if *to_stale {
                            self.stale_view.record(self.now, after, report.clone());
                        }
                        self.view.record(self.now, after, report);
                        self.stamp[i] = Some(self.now);
                        self.lease[i] = self.now + LEASE;
                        self.promise(node_id(i));
                    }
                    Event::Apply { node, catch_up } => {
                        let i = node % self.n;
                        if !self.down[i] {
                            self.catch_up(i, catch_up);
                        }
                    }
                    Event::Build(i) => {
                        let i = i % self.n;
                        if !self.down[i] {
                            let report = HealthReport {
                                node: node_id(i),
                                own_seq: self.own[i],
                                high_water: self.high_water[i].clone(),
                                state_version: self.state.version,
                                lease_released: false,
                                echo: None,
                            };
                            self.pending[i] = Some((self.now, report));
                        }
                    }
                    Event::Deliver(i) => {
                        let i = i % self.n;
                        if let Some((built, report)) = self.pending[i].take() {
                            // The stamp it echoes is the one it had when it built it:
                            // the last answer before then.
                            let after = self.stamp[i].filter(|t| *t <= built);
                            self.view.record(self.now, after, report);
                            if !self.down[i] {
                                self.stamp[i] = Some(self.now);
                                self.lease[i] = built + LEASE;
                            }
                        }
                    }
                    Event::Ack(i) => {
                        let i = i % self.n;
                        if !self.down[i] && self.now < self.lease[i] {
                            self.promise(node_id(i));
                        }
                    }
                    Event::Advance(ms) => self.now += Duration::from_millis(*ms),
                    Event::Crash(i) => self.down[i % self.n] = true,
                    Event::Recover(i) => self.down[i % self.n] = false,
                    Event::Decide => {
                        let plan = decide(&self.state, &self.view, self.now, &self.settings);
                        check_plan(&self.state, &self.view, self.now, &self.settings, &plan);
                        assert_eq!(
                            decide(&self.state, &self.view, self.now, &self.settings),
                            plan,
                            "deterministic"
                        );
                        for cmd in &plan.commands {
                            self.check_promises_kept(cmd);
                            let resp = apply(&mut self.state, cmd);
                            assert!(matches!(resp, Response::Applied { .. }), "{resp:?}");
                            self.failovers += 1;
                        }
                    }
                    Event::StaleDecide => {
                        let plan = decide(
                            &self.stale_state,
                            &self.stale_view,
                            self.now,
                            &self.settings,
                        );
                        check_plan(
                            &self.stale_state,
                            &self.stale_view,
                            self.now,
                            &self.settings,
                            &plan,
                        );
                        for cmd in &plan.commands {
                            let Command::SetMaster {
                                scheme, element, ..
                            } = cmd
                            else {
                                panic!("not a SetMaster: {cmd:?}");
                            };
                            let epoch = |st: &ClusterState| {
                                st.schemes
                                    .get(scheme)
                                    .and_then(|s| s.elements.get(element))
                                    .map(|es| es.epoch)
                            };
                            let (decided_on, now_at) =
                                (epoch(&self.stale_state), epoch(&self.state));
                            let resp = apply(&mut self.state, cmd);
                            if decided_on != now_at {
                                assert!(
                                    matches!(
                                        resp,
                                        Response::Rejected(ControlError::StaleEpoch { .. })
                                    ),
                                    "a command decided at epoch {decided_on:?} applied at \
                                     {now_at:?}: {resp:?}"
                                );
                            }
                        }
                    }
                    Event::StaleSync => self.stale_state = self.state.clone(),
                    Event::NewLeader => self.view = HealthView::new(self.now),
                    Event::Receiver(i, rs) => {
                        let cmd = Command::SetReceiverState {
                            scheme: QualName::bare("r"),
                            store: store(i % self.n),
                            state: *rs,
                        };
                        // Refused for a store that subscribes to nothing: fine.
                        apply(&mut self.state, &cmd);
                        self.promised.clear();
                    }
                    Event::ReturnService(i, rs) => {
                        let cmd = Command::SetReturnServiceState {
                            scheme: QualName::bare("r"),
                            store: store(i % self.n),
                            state: *rs,
                        };
                        apply(&mut self.state, &cmd);
                        self.promised.clear();
                    }
                }
                check_epochs(&self.state);
            }

            /// Node `i` catches up on every other origin by `catch_up` percent of what it
            /// lacks.
            fn catch_up(&mut self, i: usize, catch_up: &[u8]) {
                for j in (0..self.n).filter(|&j| j != i) {
                    let hw = self.high_water[i].entry(node_id(j)).or_insert(0);
                    *hw += (self.own[j] - *hw) * u64::from(catch_up[j]) / 100;
                }
            }

            /// `master` holds a lease: it acknowledges, under the return
            /// services in effect, every commit of its elements all their holders have.
            fn promise(&mut self, master: NodeId) {
                let s = &self.state.schemes[&QualName::bare("r")];
                for el in &s.scheme.elements {
                    let m = self.state.master_of(&s.scheme.name, &el.name).unwrap();
                    if m.node != Some(master) || m.role != OwnerRole::Master {
                        continue;
                    }
                    let held = el
                        .subscriber_stores()
                        .filter_map(|r| match &r.name {
                            StoreName::Named(st) => Some(st),
                            StoreName::Local => None,
                        })
                        .filter(|st| return_service_in_effect(s, el, st, s.receiver_state(st)))
                        .filter_map(|st| self.state.node_by_store(st))
                        .map(|n| {
                            let i = (n.id.0 - 1) as usize;
                            self.high_water[i].get(&master).copied().unwrap_or(0)
                        })
                        .min();
                    if let Some(seq) = held {
                        let entry = self.promised.entry(el.name.clone()).or_insert((master, 0));
                        if entry.0 != master {
                            *entry = (master, 0);
                        }
                        entry.1 = entry.1.max(seq);
                    }
                }
            }

            /// The leader's failover never promotes a subscriber whose reported
            /// high-water (the fork point) is short of what was acknowledged.
            fn check_promises_kept(&self, cmd: &Command) {
                let Command::SetMaster {
                    element,
                    fork_point: Some(fork),
                    ..
                } = cmd
                else {
                    return;
                };
                if let Some(&(master, seq)) = self.promised.get(element) {
                    if master == fork.origin {
                        assert!(
                            fork.seq >= seq,
                            "{element}: promoted at {fork}, past which the holders had \
                             acknowledged through seq {seq}"
                        );
                    }
                }
            }
        }

        /// Every element's epochs strictly increase, one master each, the last one
        /// current, and the scheme shows the current master.
        fn check_epochs(state: &ClusterState) {
            for s in state.schemes.values() {
                for (name, es) in &s.elements {
                    assert!(!es.history.is_empty());
                    for pair in es.history.windows(2) {
                        assert!(pair[0].epoch < pair[1].epoch, "{:?}", es.history);
                    }
                    let epochs: BTreeSet<Epoch> = es.history.iter().map(|r| r.epoch).collect();
                    assert_eq!(epochs.len(), es.history.len(), "one master per epoch");
                    assert_eq!(es.current().epoch, es.epoch);
                    let el = s.element(name).unwrap();
                    assert_eq!(el.owner.name, StoreName::Named(es.current().master.clone()));
                }
            }
        }

        /// A subscriber as the oracle sees it.
        #[derive(Debug, Clone, Copy)]
        struct Seen {
            node: NodeId,
            holder: bool,
            live: bool,
            settled: bool,
            high_water: u64,
            missing: u64,
        }

        /// The subscribers of an element other than its master, worked out from the
        /// rules directly.
        fn members(
            state: &ClusterState,
            view: &HealthView,
            now: Duration,
            settings: &FailoverSettings,
            scheme: &QualName,
            element: &Ident,
            master: NodeId,
        ) -> Vec<Seen> {
            let s = &state.schemes[scheme];
            let el = s.element(element).unwrap();
            let mut kept: BTreeMap<NodeId, u64> = BTreeMap::new();
            for r in &s.elements[element].history {
                if let Some(f) = r.fork_point.filter(|f| f.origin != master) {
                    let k = kept.entry(f.origin).or_default();
                    *k = (*k).max(f.seq);
                }
            }
            let settled_at = heard(view, master) + settings.failover_timeout;
            let mut seen = Vec::new();
            for clause in &el.subscribers {
                for r in &clause.stores {
                    let StoreName::Named(st) = &r.name else {
                        continue;
                    };
                    let Some(info) = state.nodes.values().find(|n| &n.store == st) else {
                        continue;
                    };
                    if info.id == master {
                        continue;
                    }
                    let receiver = s.receiver_state(st);
                    let h = view.nodes.get(&info.id);
                    let live = matches!(receiver, ReceiverState::Start | ReceiverState::Pause)
                        && h.is_some_and(|h| {
                            now.saturating_sub(h.last_report) <= settings.candidate_fresh
                        });
                    let settled = live
                        && h.and_then(|h| h.heard_after)
                            .is_some_and(|t| t >= settled_at);
                    let holder = matches!(
                        clause.return_service,
                        Some(ReturnService::Receipt { .. } | ReturnService::Twosafe { .. })
                    ) && s.return_service_state(st) == ReturnServiceState::Enabled
                        && receiver == ReceiverState::Start;
                    let hw = |o: NodeId| {
                        h.and_then(|h| h.report.high_water.get(&o).copied())
                            .unwrap_or(0)
                    };
                    seen.push(Seen {
                        node: info.id,
                        holder,
                        live,
                        settled,
                        high_water: hw(master),
                        missing: kept.iter().map(|(o, k)| k.saturating_sub(hw(*o))).sum(),
                    });
                }
            }
            seen
        }

        /// The subscribers that may take over: settled, and holding at least what a
        /// settled holder holds; those within max_lag.
        fn safe(
            seen: &[Seen],
            view: &HealthView,
            master: NodeId,
            settings: &FailoverSettings,
        ) -> Vec<Seen> {
            let bar = seen
                .iter()
                .filter(|c| c.holder && c.settled)
                .map(|c| c.high_water)
                .min();
            if seen.iter().any(|c| c.holder) && bar.is_none() {
                return Vec::new();
            }
            let mut out: Vec<Seen> = seen
                .iter()
                .filter(|c| c.settled && c.high_water >= bar.unwrap_or(0))
                .copied()
                .collect();
            let reached = out
                .iter()
                .map(|c| c.high_water)
                .chain(view.nodes.get(&master).map(|h| h.report.own_seq))
                .max()
                .unwrap_or(0);
            out.retain(|c| {
                settings
                    .max_lag
                    .is_none_or(|max| reached - c.high_water <= max)
            });
            out
        }

        /// When `node` was last heard from, worked out from the view directly: its last
        /// report, but never before the view started.
        fn heard(view: &HealthView, node: NodeId) -> Duration {
            let report = view.nodes.get(&node).map(|h| h.last_report);
            report.map_or(view.since, |at| at.max(view.since))
        }

        /// What every plan must satisfy, whoever decided it.
        fn check_plan(
            state: &ClusterState,
            view: &HealthView,
            now: Duration,
            settings: &FailoverSettings,
            plan: &Plan,
        ) {
            // The elements whose master is silent past the timeout.
            let mut silent = BTreeSet::new();
            for (name, s) in &state.schemes {
                for el in &s.scheme.elements {
                    let m = state.master_of(name, &el.name).unwrap();
                    if let (OwnerRole::Master, Some(n)) = (m.role, m.node) {
                        if now.saturating_sub(heard(view, n)) > settings.failover_timeout {
                            silent.insert((name.clone(), el.name.clone()));
                        }
                    }
                }
            }
            let mut keys = Vec::new();
            for cmd in &plan.commands {
                let Command::SetMaster {
                    scheme,
                    element,
                    node,
                    epoch,
                    fork_point,
                } = cmd
                else {
                    panic!("not a SetMaster: {cmd:?}");
                };
                keys.push((scheme.clone(), element.clone()));
                let m = state.master_of(scheme, element).unwrap();
                let master = m.node.unwrap();
                let heard = heard(view, master);
                assert!(
                    now.saturating_sub(heard) > settings.failover_timeout,
                    "failed over {element}, whose master was heard at {heard:?}, at {now:?}"
                );
                assert_eq!(m.role, OwnerRole::Master);
                assert_eq!(*epoch, Epoch(m.epoch.0 + 1));
                let el = state.schemes[scheme].element(element).unwrap();
                let chosen = &state.nodes[node].store;
                assert!(el
                    .subscriber_stores()
                    .any(|r| r.name == StoreName::Named(chosen.clone())));
                let h = &view.nodes[node];
                assert!(now.saturating_sub(h.last_report) <= settings.candidate_fresh);
                let hw = h.report.high_water.get(&master).copied().unwrap_or(0);
                assert_eq!(*fork_point, Some(Gtid::new(master, hw)));
                let seen = members(state, view, now, settings, scheme, element, master);
                let safe = safe(&seen, view, master, settings);
                let chosen = safe
                    .iter()
                    .find(|c| c.node == *node)
                    .expect("the chosen one may take over");
                assert!(h.heard_after.is_some());
                for c in &safe {
                    assert!(
                        (chosen.missing, Reverse(chosen.high_water))
                            <= (c.missing, Reverse(c.high_water)),
                        "{seen:?} chose {node}"
                    );
                }
                assert_eq!(chosen.high_water, hw);
                validate(state, cmd).unwrap();
            }
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "order: {keys:?}");
            let mut blocked_keys = Vec::new();
            for b in &plan.blocked {
                let key = (b.scheme.clone(), b.element.clone());
                let m = state.master_of(&b.scheme, &b.element).unwrap();
                assert_eq!(m.store, &b.master);
                match &b.reason {
                    BlockReason::Disabled => assert!(!settings.enabled),
                    BlockReason::Paused { .. } => assert!(state.failover_pause.is_some()),
                    // The simulated schemes never turn failover off for a store.
                    BlockReason::OffForStore => panic!("{b:?}"),
                    BlockReason::Refused { .. } => {}
                    reason => {
                        let master = m.node.unwrap();
                        let seen =
                            members(state, view, now, settings, &b.scheme, &b.element, master);
                        assert!(
                            safe(&seen, view, master, settings).is_empty(),
                            "{b:?} with {seen:?}"
                        );
                        let live = seen.iter().any(|c| c.live);
                        let holders_live = seen.iter().any(|c| c.holder && c.live);
                        match reason {
                            BlockReason::NoLiveSubscriber => assert!(!live, "{seen:?}"),
                            BlockReason::HoldersSilent { .. } => {
                                assert!(live && !holders_live, "{seen:?}")
                            }
                            BlockReason::AwaitingReports => assert!(live, "{seen:?}"),
                            BlockReason::TooFarBehind { .. } => assert!(live, "{seen:?}"),
                            _ => {}
                        }
                    }
                }
                blocked_keys.push(key);
            }
            assert!(blocked_keys.windows(2).all(|w| w[0] < w[1]));
            let decided: BTreeSet<_> = keys.into_iter().chain(blocked_keys).collect();
            assert_eq!(decided, silent, "every silent master, once");
        }

        proptest! {
            // Small states: 512 cases take well under a second in debug.
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn failover_keeps_epochs_ordered_and_picks_the_right_candidate(
                setup in setup(),
                events in vec(event(), 1..120),
            ) {
                let mut sim = Sim::new(&setup);
                for event in &events {
                    sim.step(event);
                }
            }
        }

        /// The generator does produce failovers (else the property says little).
        #[test]
        fn the_random_runs_do_fail_over() {
            let setup = Setup {
                nodes: 3,
                elements: vec![ElementSpec {
                    master: 0,
                    subscribers: vec![(1, 0), (2, 2)],
                }],
                max_lag: None,
            };
            let mut sim = Sim::new(&setup);
            let report = |node| Event::Report {
                node,
                commits: 1,
                catch_up: vec![100; 5],
                to_stale: true,
                echo_lag: 0,
            };
            let mut events = vec![report(0), report(1), report(2), Event::StaleSync];
            events.extend([Event::Crash(0), Event::Advance(3_500), report(1), report(2)]);
            events.extend([Event::Decide, Event::StaleDecide, Event::Decide]);
            for event in &events {
                sim.step(event);
            }
            assert_eq!(sim.failovers, 1);
            let m = sim
                .state
                .master_of(&QualName::bare("r"), &Ident::unquoted("e0"));
            assert_eq!(m.unwrap().node, Some(NodeId(3)), "the TWOSAFE subscriber");
        }

        /// A report in flight while the master still acknowledged: it says less than
        /// the TWOSAFE subscriber holds by the time the master stops, so it cannot fix
        /// the fork point. Only a report sent after the master's lease surely ended can.
        #[test]
        fn a_report_built_before_the_masters_last_acknowledgement_is_not_trusted() {
            let setup = Setup {
                nodes: 3,
                elements: vec![ElementSpec {
                    master: 0,
                    subscribers: vec![(1, 0), (2, 2)],
                }],
                max_lag: None,
            };
            let mut sim = Sim::new(&setup);
            let all = vec![100; 5];
            let report = |node, commits| Event::Report {
                node,
                commits,
                catch_up: vec![100; 5],
                to_stale: false,
                echo_lag: 0,
            };
            let apply = |node| Event::Apply {
                node,
                catch_up: all.clone(),
            };
            // The master commits 10; the TWOSAFE subscriber (node 3) builds a report
            // holding them, then receives 10 more, which the master acknowledges.
            let mut events = vec![report(0, 10), report(1, 0), report(2, 0)];
            events.extend([Event::Build(2), report(0, 10), apply(2), Event::Ack(0)]);
            events.extend([Event::Crash(0), Event::Advance(3_100)]);
            // Its old report arrives now, fresh; the async node 2, which received
            // nothing more, reports too.
            let behind = Event::Report {
                node: 1,
                commits: 0,
                catch_up: vec![0; 5],
                to_stale: false,
                echo_lag: 0,
            };
            events.extend([Event::Deliver(2), behind, Event::Decide]);
            for event in &events {
                sim.step(event);
            }
            assert_eq!(sim.failovers, 0, "decided on a report sent too early");
            // Its next report, sent after the answer to that one, settles it.
            events = vec![report(2, 0), Event::Decide];
            for event in &events {
                sim.step(event);
            }
            assert_eq!(sim.failovers, 1);
            let m = sim
                .state
                .master_of(&QualName::bare("r"), &Ident::unquoted("e0"));
            assert_eq!(m.unwrap().node, Some(NodeId(3)), "the TWOSAFE subscriber");
        }
    }
}

#[cfg(test)]
mod propagated {
    use super::*;
    use crate::state::{apply, Command, NodeInfo, Response};

    /// The demo's shape: masterds masters `tab` to sub1 (TWOSAFE), which propagates it
    /// to sub2. masterds dies: sub1 takes over, and sub2 subscribes to it directly.
    #[test]
    fn a_propagators_master_fails_over_to_the_propagator() {
        let mut st = ClusterState::default();
        for (id, store) in [(1, "masterds"), (2, "sub1"), (3, "sub2")] {
            let cmd = Command::RegisterNode(NodeInfo {
                id: NodeId(id),
                store: Ident::unquoted(store),
                host: "h".into(),
                grpc_addr: format!("h:{id}"),
                http_addr: format!("h:{id}0"),
                voter: true,
            });
            assert!(matches!(apply(&mut st, &cmd), Response::Applied { .. }));
        }
        let ddl = "CREATE REPLICATION r
            ELEMENT a TABLE tab MASTER masterds SUBSCRIBER sub1 RETURN TWOSAFE
            ELEMENT b TABLE tab PROPAGATOR sub1 SUBSCRIBER sub2";
        for cmd in Command::from_ddl(ddl).unwrap() {
            let r = apply(&mut st, &cmd);
            assert!(matches!(r, Response::Applied { .. }), "{r:?}");
        }
        let mut view = HealthView::new(Duration::ZERO);
        for (node, hw) in [(2, 50), (3, 40)] {
            view.record(
                Duration::from_secs(10),
                Some(Duration::from_secs(10)),
                HealthReport {
                    node: NodeId(node),
                    own_seq: 0,
                    high_water: BTreeMap::from([(NodeId(1), hw)]),
                    state_version: 1,
                    lease_released: false,
                    echo: None,
                },
            );
        }
        let plan = decide(
            &st,
            &view,
            Duration::from_secs(10),
            &FailoverSettings::new(Duration::from_secs(1), Duration::from_millis(500)),
        );
        assert!(plan.blocked.is_empty(), "{:?}", plan.blocked);
        assert_eq!(plan.commands.len(), 1, "{plan:?}");
        let Command::SetMaster { node, .. } = &plan.commands[0] else {
            panic!("{plan:?}");
        };
        assert_eq!(*node, NodeId(2), "the TWOSAFE propagator");
        let r = apply(&mut st, &plan.commands[0]);
        assert!(matches!(r, Response::Applied { .. }), "{r:?}");
        // The propagator's element is folded into the master's: sub2 now subscribes
        // to sub1 directly; masterds sits in sub1's TWOSAFE slot, stopped.
        let s = &st.schemes[&QualName::bare("r")];
        let text = s.ddl();
        assert!(!text.contains("ELEMENT b"), "{text}");
        assert!(text.contains("MASTER sub1"), "{text}");
        assert!(text.contains("sub2"), "{text}");
        assert!(!s.elements.contains_key(&Ident::unquoted("b")));
        assert_eq!(st.era, 1);
    }

    #[test]
    fn a_store_whose_scheme_turns_failover_off_is_only_reported() {
        let mut st = ClusterState::default();
        for (id, store) in [(1, "m"), (2, "s")] {
            let cmd = Command::RegisterNode(NodeInfo {
                id: NodeId(id),
                store: Ident::unquoted(store),
                host: "h".into(),
                grpc_addr: format!("h:{id}"),
                http_addr: format!("h:{id}0"),
                voter: true,
            });
            assert!(matches!(apply(&mut st, &cmd), Response::Applied { .. }));
        }
        let ddl = "CREATE REPLICATION r ELEMENT e TABLE t MASTER m SUBSCRIBER s \
                   STORE m FAILOVER OFF";
        for cmd in Command::from_ddl(ddl).unwrap() {
            assert!(matches!(apply(&mut st, &cmd), Response::Applied { .. }));
        }
        let mut view = HealthView::new(Duration::ZERO);
        view.record(
            Duration::from_secs(10),
            Some(Duration::from_secs(10)),
            HealthReport {
                node: NodeId(2),
                own_seq: 0,
                high_water: BTreeMap::new(),
                state_version: 1,
                lease_released: false,
                echo: None,
            },
        );
        let settings = FailoverSettings::new(Duration::from_secs(1), Duration::from_millis(500));
        let plan = decide(&st, &view, Duration::from_secs(10), &settings);
        assert!(plan.commands.is_empty(), "{plan:?}");
        assert_eq!(plan.blocked.len(), 1);
        assert_eq!(plan.blocked[0].reason, BlockReason::OffForStore);
        assert!(plan.blocked[0].reason.to_string().contains("FAILOVER OFF"));
    }
}
