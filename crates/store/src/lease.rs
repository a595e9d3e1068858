//! The master lease gate: which client writes need this node to hold a master lease,
//! and until when it holds one.
//!
//! ```text
//!  node: lease granted by the Raft leader ──► LeaseGate::extend(until)
//!  node: elements this store masters     ──► LeaseGate::set_scope(scope)
//!  Txn::pin (first write of a table)     ──► LeaseGate::check(table)   ─► NoMasterLease
//!  Txn::commit, under the commit mutex   ──► LeaseGate::check_commit   ─► NoMasterLease
//!  node, from commit to acknowledgement  ──► LeaseGate::hold (counted)
//!  node, before acknowledging a commit   ──► LeaseGate::check_held
//!  leader: the role is moving            ──► LeaseGate::drain ─► no new transaction;
//!     once no commit is held ──► release_drained: the lease is given up early
//! ```
//!
//! A master must stop taking writes once the cluster may have moved its role (docs/design.md
//! §5): the Raft leader fails an element over only after the master's lease has run out,
//! and the master times its lease on its own monotonic clock from when it *sent* the
//! request that earned it, so its view of the lease ends no later than the leader's.
//! The gate owns nothing but that deadline and the tables it covers; it does no I/O and
//! reads the clock only through the `now` its callers pass.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hawser_core::QualName;
use parking_lot::RwLock;

use crate::StoreError;

/// Which client writes need a lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseScope {
    /// Tables of TABLE elements this store masters.
    pub tables: HashSet<QualName>,
    /// This store masters a DATASTORE element: every table it does not receive.
    pub every_table: bool,
    /// Why a write is refused without a lease, naming who masters what as the
    /// cluster state knows it.
    pub refusal: String,
    /// Tables of TABLE elements this store subscribes to and another store masters,
    /// each with why a client write to it is refused: set together with the rest, so a
    /// master that learns its role moved refuses its old tables at once (the data
    /// plane's refusal of received tables comes with its next plan, a moment later).
    pub elsewhere: std::collections::HashMap<QualName, String>,
}

impl LeaseScope {
    fn covers(&self, table: &QualName) -> bool {
        self.every_table || self.tables.contains(table)
    }

    /// Whether any write needs the lease.
    fn masters_something(&self) -> bool {
        self.every_table || !self.tables.is_empty()
    }
}

#[derive(Debug, Default)]
struct Gate {
    /// `None`: no write needs a lease (a node outside any cluster, or one that
    /// masters nothing).
    scope: Option<LeaseScope>,
    /// The end of the lease held now, if any.
    until: Option<Instant>,
    /// The role is moving ([`LeaseGate::drain`]): no new transaction until a grant.
    draining: bool,
    /// The lease was given up while draining ([`LeaseGate::release_drained`]).
    released: bool,
    /// Counts unbroken leases: a grant that finds no lease held (run out, given up,
    /// revoked, or never held) starts a new one ([`LeaseGate::generation`]).
    generation: u64,
}

/// See the module documentation. Shared by the store's clones.
#[derive(Debug, Default)]
pub struct LeaseGate {
    gate: RwLock<Gate>,
    /// Leased commits between their commit and their acknowledgement
    /// ([`LeaseGate::hold`]).
    holds: Arc<AtomicU64>,
}

/// A leased commit on its way to being acknowledged ([`LeaseGate::hold`]); counted
/// until dropped.
#[derive(Debug)]
pub struct LeaseHold(Arc<AtomicU64>);

impl Drop for LeaseHold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl LeaseGate {
    /// Sets which writes need a lease (`None`: none do).
    pub fn set_scope(&self, scope: Option<LeaseScope>) {
        let mut gate = self.gate.write();
        if gate.scope != scope {
            gate.scope = scope;
        }
    }

    /// Holds a lease until `until` (a later grant extends it; an earlier one does not
    /// shorten it, since grants may arrive out of order).
    pub fn extend(&self, until: Instant) {
        let mut gate = self.gate.write();
        if gate.until.is_none_or(|u| u <= Instant::now()) {
            gate.generation += 1;
        }
        if gate.until.is_none_or(|u| u < until) {
            gate.until = Some(until);
        }
        gate.draining = false;
        gate.released = false;
    }

    /// Counts a leased commit from before it commits until it is acknowledged (or
    /// refused): a draining master gives its lease up early only once none is.
    pub fn hold(&self) -> LeaseHold {
        self.holds.fetch_add(1, Ordering::AcqRel);
        LeaseHold(self.holds.clone())
    }

    /// While draining and no leased commit is held: gives the lease up now, so the
    /// switchover need not wait for it to run out. Whether it is given up (now or
    /// before). Commits whose writes needed the lease are refused at commit from then
    /// on ([`LeaseGate::check_commit`]); the caller waits for any commit that passed
    /// that check just before ([`crate::Database::commit_barrier`]) before it reports
    /// the release.
    pub fn release_drained(&self) -> bool {
        let mut gate = self.gate.write();
        if gate.draining && !gate.released && self.holds.load(Ordering::Acquire) == 0 {
            gate.until = None;
            gate.released = true;
        }
        gate.released
    }

    /// Whether the lease was given up while draining and no grant came since.
    pub fn released(&self) -> bool {
        self.gate.read().released
    }

    /// Takes no new transaction on the lease held now (a switchover of this master is
    /// being committed): those under way may still be acknowledged until it runs out,
    /// so a planned switchover does not leave them with an unknown outcome. A new
    /// grant ends it.
    pub fn drain(&self) {
        self.gate.write().draining = true;
    }

    /// Gives the lease up at once (the node learned its role moved, or it shuts down).
    pub fn revoke(&self) {
        self.gate.write().until = None;
    }

    /// Whether some client writes need a lease (this node masters something).
    pub fn required(&self) -> bool {
        self.gate
            .read()
            .scope
            .as_ref()
            .is_some_and(LeaseScope::masters_something)
    }

    /// When the lease held now ends, if one is held at `now`.
    pub fn held_until(&self, now: Instant) -> Option<Instant> {
        self.gate.read().until.filter(|u| *u > now)
    }

    /// Whether a client may write `table` at `now`; `Ok(true)` when the write needs
    /// the lease (the caller checks [`LeaseGate::check_held`] again before it
    /// acknowledges the commit, since the lease may run out meanwhile).
    pub fn check(&self, table: &QualName, now: Instant) -> Result<bool, StoreError> {
        let gate = self.gate.read();
        if let Some(reason) = gate.scope.as_ref().and_then(|s| s.elsewhere.get(table)) {
            return Err(StoreError::ReceivedTable {
                table: table.clone(),
                reason: reason.clone(),
            });
        }
        match &gate.scope {
            Some(scope) if scope.covers(table) => {
                if gate.draining {
                    Err(StoreError::NoMasterLease {
                        table: table.clone(),
                        reason: format!(
                            "the role of this master is moving (a switchover or failover \
                             is being committed): try again on the new master; {}",
                            scope.refusal
                        ),
                    })
                } else if gate.until.is_some_and(|u| u > now) {
                    Ok(true)
                } else {
                    Err(StoreError::NoMasterLease {
                        table: table.clone(),
                        reason: scope.refusal.clone(),
                    })
                }
            }
            _ => Ok(false),
        }
    }

    /// Whether a transaction whose writes needed the lease may commit at `now` (called
    /// under the commit mutex, before it takes a seq): a lease given up or run out
    /// since its first write refuses it — nothing is committed, so it is retryable.
    pub fn check_commit(&self, table: &QualName, now: Instant) -> Result<(), StoreError> {
        let gate = self.gate.read();
        if gate.until.is_some_and(|u| u > now) {
            return Ok(());
        }
        Err(StoreError::NoMasterLease {
            table: table.clone(),
            reason: gate.scope.as_ref().map_or_else(
                || "this node no longer masters it".to_string(),
                |s| s.refusal.clone(),
            ),
        })
    }

    /// The unbroken lease held now (or last): read before a leased commit, and
    /// given to [`LeaseGate::check_held`] before it is acknowledged.
    pub fn generation(&self) -> u64 {
        self.gate.read().generation
    }

    /// Whether the lease `generation` names is still held at `now`, unbroken, for a
    /// commit whose writes needed one. Checked whatever the scope says now: a master
    /// that lost its role meanwhile must not acknowledge what it wrote as master — not
    /// even under a lease granted again since (a paused master, failed over and made
    /// master again, holds a new lease; what it committed under the old one may have
    /// been set aside by the failover in between).
    pub fn check_held(&self, generation: u64, now: Instant) -> Result<(), String> {
        let gate = self.gate.read();
        match gate.until {
            Some(u) if u > now && gate.generation == generation => Ok(()),
            Some(u) if u > now => Err(
                "this node's master lease ran out and was granted again before the commit \
                 could be acknowledged (the cluster may have moved the role meanwhile)"
                    .into(),
            ),
            _ => Err(
                "this node's master lease ran out before the commit could be \
                      acknowledged (the cluster may have moved the role)"
                    .into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn scope(tables: &[&str]) -> LeaseScope {
        LeaseScope {
            tables: tables.iter().map(|t| QualName::bare(t)).collect(),
            every_table: false,
            refusal: "ds1 masters it".into(),
            elsewhere: Default::default(),
        }
    }

    #[test]
    fn a_table_another_store_masters_is_refused_whatever_the_lease() {
        let gate = LeaseGate::default();
        let mut s = scope(&[]);
        s.elsewhere
            .insert(QualName::bare("t"), "ds2 masters it".into());
        gate.set_scope(Some(s));
        let now = Instant::now();
        gate.extend(now + Duration::from_secs(1));
        let err = gate.check(&QualName::bare("t"), now).unwrap_err();
        assert!(err.to_string().contains("ds2 masters it"), "{err}");
        assert!(!gate.check(&QualName::bare("u"), now).unwrap());
        assert!(!gate.required(), "it masters nothing");
    }

    #[test]
    fn without_a_scope_nothing_needs_a_lease() {
        let gate = LeaseGate::default();
        assert!(!gate.check(&QualName::bare("t"), Instant::now()).unwrap());
    }

    #[test]
    fn a_covered_table_needs_a_lease_that_has_not_run_out() {
        let gate = LeaseGate::default();
        let now = Instant::now();
        let t = QualName::bare("t");
        gate.set_scope(Some(scope(&["t"])));
        let err = gate.check(&t, now).unwrap_err();
        assert_eq!(err.code(), "57P03");
        assert!(err.is_retryable());
        assert!(err.to_string().contains("ds1 masters it"), "{err}");
        assert!(!gate.check(&QualName::bare("other"), now).unwrap());
        assert!(gate.check_held(gate.generation(), now).is_err());
        gate.extend(now + Duration::from_millis(500));
        assert!(
            gate.check(&t, now).unwrap(),
            "needs the lease, which is held"
        );
        assert!(gate.check_held(gate.generation(), now).is_ok());
        assert!(gate.check(&t, now + Duration::from_millis(499)).is_ok());
        assert!(gate.check(&t, now + Duration::from_millis(500)).is_err());
        // An older grant arriving late does not shorten the lease.
        gate.extend(now + Duration::from_millis(100));
        assert!(gate.check(&t, now + Duration::from_millis(200)).is_ok());
        gate.revoke();
        assert!(gate.check(&t, now).is_err());
    }

    #[test]
    fn a_datastore_master_needs_a_lease_for_every_table() {
        let gate = LeaseGate::default();
        gate.set_scope(Some(LeaseScope {
            every_table: true,
            ..scope(&[])
        }));
        let now = Instant::now();
        assert!(gate.check(&QualName::bare("any"), now).is_err());
        gate.extend(now + Duration::from_secs(1));
        assert!(gate.check(&QualName::bare("any"), now).unwrap());
        // Losing the scope (the role moved) does not make a held lease's end moot.
        gate.set_scope(None);
        assert!(gate
            .check_held(gate.generation(), now + Duration::from_secs(2))
            .is_err());
        assert_eq!(gate.held_until(now), Some(now + Duration::from_secs(1)));
    }

    #[test]
    fn a_draining_master_takes_no_new_transaction_but_acknowledges_those_under_way() {
        let gate = LeaseGate::default();
        let now = Instant::now();
        let t = QualName::bare("t");
        gate.set_scope(Some(scope(&["t"])));
        gate.extend(now + Duration::from_millis(500));
        let lease = gate.generation();
        gate.drain();
        let err = gate.check(&t, now).unwrap_err();
        assert_eq!(err.code(), "57P03");
        assert!(err.to_string().contains("moving"), "{err}");
        assert!(
            gate.check_held(lease, now).is_ok(),
            "those under way are acknowledged"
        );
        assert!(gate
            .check_held(lease, now + Duration::from_millis(500))
            .is_err());
        // A new grant (the switchover was refused, the fence lifted) ends the drain.
        gate.extend(now + Duration::from_millis(600));
        assert!(gate.check(&t, now).unwrap());
        assert_eq!(gate.generation(), lease, "extended without a break");
    }

    #[test]
    fn a_commit_under_a_lease_that_broke_is_not_acknowledged_under_the_next_one() {
        let gate = LeaseGate::default();
        gate.set_scope(Some(scope(&["t"])));
        let now = Instant::now();
        gate.extend(now + Duration::from_secs(60));
        let lease = gate.generation();
        // Extended while held: the same lease.
        gate.extend(now + Duration::from_secs(61));
        assert!(gate.check_held(lease, now).is_ok());
        // Given up (the role moved) and granted again (made master again later): a
        // commit made under the first must not be acknowledged under the second.
        gate.revoke();
        gate.extend(now + Duration::from_secs(62));
        assert_ne!(gate.generation(), lease);
        let err = gate.check_held(lease, now).unwrap_err();
        assert!(err.contains("granted again"), "{err}");
        assert!(gate.check_held(gate.generation(), now).is_ok());
    }
}
