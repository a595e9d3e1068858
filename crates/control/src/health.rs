//! Liveness the Raft leader can trust, and the master leases it grants on it.
//!
//! ```text
//!  every node, every report interval ── Report {to: leader id, HealthReport} ──► leader
//!  leader: HealthBook.record (its monotonic clock) ── quorum heard lately? not fenced?
//!        ◄── ReportReply {lease: LeaseGrant {millis, state_version}}
//!  node: lease ends at (when it SENT the report) + millis, once it has applied
//!        state_version ── hawser_store::LeaseGate
//!  leader, every tick: failover::decide(state, HealthBook view, now) ── SetMaster
//! ```
//!
//! The book belongs to one leadership: a leader that finds a new term in its metrics
//! starts an empty view, so a newly elected leader counts every node as silent since it
//! took over and never acts on silences it did not see (docs/control.md, "Failover
//! timing"). A node whose failover is being proposed is *fenced*: it gets no lease
//! until the leader's applied state shows the element moved on, so a report that
//! races the proposal cannot earn the deposed master a lease that overlaps its
//! successor's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hawser_core::{Epoch, Ident, NodeId, QualName};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::failover::{Echo, HealthReport, HealthView};
use crate::state::ClusterState;

/// What a node sends the Raft leader every report interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The leader the sender means: a node that is not it refuses the report, so a
    /// stale address can never earn a lease from another node.
    pub to: NodeId,
    pub health: HealthReport,
}

/// The leader's answer to a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportReply {
    pub leader: NodeId,
    pub term: u64,
    /// A master lease, or why none was granted.
    pub lease: Result<LeaseGrant, String>,
    /// No lease because a switchover or failover of an element the node masters is
    /// being committed: the node takes no new transaction on the lease it still holds,
    /// and finishes those under way before it runs out.
    #[serde(default)]
    pub draining: bool,
    /// The leader's stamp for this answer, for the node to echo in its next report
    /// ([`Echo`]).
    #[serde(default)]
    pub stamp: Option<Echo>,
}

/// A master lease: valid for `millis` from when its holder sent the report that
/// earned it, once the holder has applied cluster state `state_version` (so it judges
/// which elements it masters by a state at least as new as the grant's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    pub millis: u64,
    pub state_version: u64,
}

/// A proposed failover: its deposed master gets no lease until the element's epoch
/// has moved past `epoch` in the leader's state (or leadership changes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fence {
    node: NodeId,
    scheme: QualName,
    element: Ident,
    epoch: Epoch,
}

#[derive(Debug)]
struct Book {
    /// The leader term the view belongs to.
    term: Option<u64>,
    view: HealthView,
    fences: Vec<Fence>,
}

/// The leader's record of the reports it received, on its monotonic clock.
#[derive(Debug)]
pub struct HealthBook {
    origin: Instant,
    /// How long before it took over a new leader counts unheard nodes as silent
    /// ([`crate::ControlConfig::takeover_credit`]).
    credit: Duration,
    book: Mutex<Book>,
}

impl HealthBook {
    /// A book whose new leaderships count nodes silent from `credit` before they began.
    pub fn new(credit: Duration) -> Self {
        Self {
            origin: Instant::now(),
            credit,
            book: Mutex::new(Book {
                term: None,
                view: HealthView {
                    since: Duration::ZERO,
                    nodes: BTreeMap::new(),
                },
                fences: Vec::new(),
            }),
        }
    }

    /// Now on the book's clock.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// The book for leader term `term`: a new term starts an empty view, counting
    /// silence from `credit` before now.
    fn for_term<'a>(&self, book: &'a mut Book, term: u64) -> &'a mut Book {
        if book.term != Some(term) {
            book.term = Some(term);
            book.view = HealthView {
                since: self.now().saturating_sub(self.credit),
                nodes: BTreeMap::new(),
            };
            book.fences.clear();
        }
        book
    }

    /// Records `report`, received now by `leader` (this node) leading `term`, and
    /// answers the stamp for the reply: the node echoes it in its next report.
    pub fn record(&self, leader: NodeId, term: u64, report: HealthReport) -> Echo {
        let now = self.now();
        // Only this leadership's own stamps are times on this clock.
        let heard_after = report
            .echo
            .filter(|e| e.leader == leader && e.term == term)
            .map(|e| Duration::from_micros(e.micros));
        let mut guard = self.book.lock();
        let book = self.for_term(&mut guard, term);
        book.view.record(now, heard_after, report);
        Echo {
            leader,
            term,
            micros: u64::try_from(now.as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// When the leader of `term` started leading, on the book's clock: its view's
    /// start without the failover credit.
    pub fn led_since(&self, term: u64) -> Duration {
        self.view(term).since + self.credit
    }

    /// The view of the leader of `term`.
    pub fn view(&self, term: u64) -> HealthView {
        let mut guard = self.book.lock();
        self.for_term(&mut guard, term).view.clone()
    }

    /// Whether `node` may not be granted a lease now: a failover of an element it
    /// mastered is under way. Forgets fences whose element has moved on in `state`.
    pub fn is_fenced(&self, term: u64, node: NodeId, state: &ClusterState) -> bool {
        let mut guard = self.book.lock();
        let book = self.for_term(&mut guard, term);
        book.fences.retain(|f| {
            state
                .schemes
                .get(&f.scheme)
                .and_then(|s| s.elements.get(&f.element))
                .is_some_and(|e| e.epoch <= f.epoch)
        });
        book.fences.iter().any(|f| f.node == node)
    }

    /// Fences `node` while the failover of `element` from `epoch` is proposed.
    pub fn fence(&self, term: u64, node: NodeId, scheme: QualName, element: Ident, epoch: Epoch) {
        let mut guard = self.book.lock();
        let book = self.for_term(&mut guard, term);
        let fence = Fence {
            node,
            scheme,
            element,
            epoch,
        };
        if !book.fences.contains(&fence) {
            book.fences.push(fence);
        }
    }

    /// Lifts the fences of a failover that was refused for good.
    pub fn unfence(&self, node: NodeId, scheme: &QualName, element: &Ident) {
        self.book
            .lock()
            .fences
            .retain(|f| !(f.node == node && &f.scheme == scheme && &f.element == element));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: u64) -> HealthReport {
        HealthReport {
            node: NodeId(node),
            own_seq: 1,
            high_water: BTreeMap::new(),
            state_version: 1,
            lease_released: false,
            echo: None,
        }
    }

    #[test]
    fn a_new_term_starts_an_empty_view_from_now() {
        let book = HealthBook::new(Duration::ZERO);
        book.record(NodeId(9), 1, report(1));
        let v1 = book.view(1);
        assert!(v1.nodes.contains_key(&NodeId(1)));
        let v2 = book.view(2);
        assert!(v2.nodes.is_empty(), "another leadership saw nothing yet");
        assert!(v2.since >= v1.since);
    }

    #[test]
    fn a_new_leader_counts_silence_from_its_credit_before_it_took_over() {
        let mut book = HealthBook::new(Duration::from_millis(550));
        // A book kept for a while, so that the credit fits behind its start.
        if let Some(earlier) = book.origin.checked_sub(Duration::from_secs(10)) {
            book.origin = earlier;
        }
        let since = book.view(1).since;
        let now = book.now();
        assert!(now.saturating_sub(since) >= Duration::from_millis(550));
    }

    #[test]
    fn a_fence_holds_until_the_element_moves_on() {
        let book = HealthBook::new(Duration::ZERO);
        let scheme = QualName::bare("r");
        let element = Ident::unquoted("e");
        book.fence(1, NodeId(1), scheme.clone(), element.clone(), Epoch(0));
        // The element is unknown to this state: the fence goes (nothing to protect).
        assert!(!book.is_fenced(1, NodeId(1), &ClusterState::default()));
        book.fence(1, NodeId(1), scheme.clone(), element.clone(), Epoch(0));
        book.unfence(NodeId(1), &scheme, &element);
        assert!(!book.is_fenced(1, NodeId(1), &ClusterState::default()));
    }
}
