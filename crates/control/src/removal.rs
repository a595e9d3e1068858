//! How a node knows that it was removed from the cluster, and keeps knowing it.
//!
//! openraft 0.9 does not tell a removed voter that it was removed: the leader stops
//! replicating to it as soon as it appends the membership that leaves it out, so the
//! node may never see that entry, and a voter that missed it campaigns for ever. The
//! cluster state remembers every removed node for good instead
//! ([`ClusterState::removed`]; node ids are random and never reused), and a node learns
//! of its own removal in one of three ways, whichever comes first:
//!
//! ```text
//!  applied  the leader commits RemoveNode before the membership change, while the node
//!           is still a member: a node that is up applies the entry naming itself
//!  refused  a member it calls (a vote, an append of a stale leader, a report, a join, a
//!           forwarded proposal) finds the caller in `removed` and refuses the call with
//!           a typed refusal ([`crate::network::REFUSAL`] = "removed", the details a
//!           JSON [`Removal`]); the caller's PeerPool records it
//!  told     the leader calls NotifyRemoved on the node once the removal committed
//!           (best effort: the node may be down)
//!            │
//!            ▼
//!  RemovalBook::record ── rft/x in the Raft engine, flushed ── watch ── elections off
//! ```
//!
//! The record lives in the Raft engine (`rft/x`), not in the node's identity file: it
//! is a fact about this node's Raft membership and goes with its Raft state (a data
//! directory whose Raft state is wiped is a new member anyway, and joins under a new
//! id), the control plane that learns it owns that engine, and it is read before Raft
//! starts, so a restarted removed node never campaigns. Once recorded it is never
//! cleared: a removed node is not let back in by accident (every member refuses its id
//! for good); the way back is a fresh data directory, which is a new node.

use std::sync::{Arc, OnceLock};

use hawser_core::NodeId;
use hawser_store::{KvEngine, WriteBatch};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::state::ClusterState;
use crate::types::Raft;

/// Where the record is kept in the Raft engine.
const REMOVAL_KEY: &[u8] = b"rft/x";

/// That a node was removed from the cluster, as the node knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    /// The removed node.
    pub node: NodeId,
    /// The cluster it was removed from (0 where the state predates cluster ids).
    pub cluster_id: u64,
    /// The Raft log index of the entry that removed it (0 where unknown).
    pub log_index: u64,
    /// When, in milliseconds since the Unix epoch by the clock of the leader that
    /// proposed it (0 where unknown).
    pub at_unix_ms: u64,
    /// How this node learned it.
    pub learned: Learned,
}

/// How a node learned of its removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Learned {
    /// It applied the Raft entry that removed it.
    Applied,
    /// Member `by` refused one of its calls, saying it was removed.
    Refused { by: NodeId },
    /// The leader `by` told it once the removal committed.
    Told { by: NodeId },
}

impl Learned {
    /// How status words it.
    pub fn describe(&self) -> String {
        match self {
            Learned::Applied => "applied the entry that removed it".into(),
            Learned::Refused { by } => format!("node {by} refused its call"),
            Learned::Told { by } => format!("told by the leader, node {by}"),
        }
    }
}

impl Removal {
    /// The removal recorded for `me` in `state`, if any (learned by applying it).
    pub fn from_state(state: &ClusterState, me: NodeId) -> Option<Removal> {
        let removed = state.removed.get(&me)?;
        Some(Removal {
            node: me,
            cluster_id: state.cluster_id,
            log_index: removed.log_index,
            at_unix_ms: removed.at_unix_ms,
            learned: Learned::Applied,
        })
    }

    /// "removed from cluster C at 2024-05-01 12:00:00 UTC (Raft log index 42)".
    pub fn describe(&self) -> String {
        let at = match self.at_unix_ms {
            0 => "an unknown time".to_string(),
            ms => utc(ms),
        };
        let index = match self.log_index {
            0 => String::new(),
            i => format!(" (Raft log index {i})"),
        };
        format!("removed from cluster {} at {at}{index}", self.cluster_id)
    }
}

/// `ms` since the Unix epoch as `YYYY-MM-DD hh:mm:ss UTC` (proleptic Gregorian).
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (never negative).
    let z = days as i64 + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// This node's record of its removal: the one owner of `rft/x` and of the watch the
/// node reacts to.
pub(crate) struct RemovalBook {
    me: NodeId,
    engine: Arc<dyn KvEngine>,
    tx: watch::Sender<Option<Removal>>,
    /// Set once Raft runs: recording a removal turns its elections off.
    raft: OnceLock<Raft>,
    /// Serializes records, so the first one found is the one kept.
    write: tokio::sync::Mutex<()>,
}

impl RemovalBook {
    /// The record in `engine`, or — where the stored state already says this node was
    /// removed (it applied the entry; a crash came before the record) — that, recorded
    /// now.
    pub(crate) fn open(
        engine: Arc<dyn KvEngine>,
        me: NodeId,
        state: &ClusterState,
    ) -> Result<Self, hawser_store::StoreError> {
        let stored: Option<Removal> = match engine.get(REMOVAL_KEY)? {
            // An unreadable record is a record all the same: the node was removed.
            Some(bytes) => Some(serde_json::from_slice(&bytes).unwrap_or(Removal {
                node: me,
                cluster_id: state.cluster_id,
                log_index: 0,
                at_unix_ms: 0,
                learned: Learned::Applied,
            })),
            None => match Removal::from_state(state, me) {
                Some(r) => {
                    persist(&*engine, &r)?;
                    Some(r)
                }
                None => None,
            },
        };
        let (tx, _) = watch::channel(stored);
        Ok(Self {
            me,
            engine,
            tx,
            raft: OnceLock::new(),
            write: tokio::sync::Mutex::new(()),
        })
    }

    /// Gives the book the running Raft; a node removed already never campaigns.
    pub(crate) fn attach(&self, raft: Raft) {
        if self.get().is_some() {
            raft.runtime_config().elect(false);
        }
        let _ = self.raft.set(raft);
    }

    pub(crate) fn get(&self) -> Option<Removal> {
        self.tx.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<Removal>> {
        self.tx.subscribe()
    }

    /// Records this node's removal if `state` (just applied) holds it and none is
    /// recorded yet.
    pub(crate) async fn observe(&self, state: &ClusterState) {
        if self.get().is_none() {
            if let Some(removal) = Removal::from_state(state, self.me) {
                self.record(removal).await;
            }
        }
    }

    /// Records `removal` if it is this node's and none is recorded yet: written and
    /// flushed under `rft/x` (off the async workers), published, and elections turned
    /// off. Returns whether it was new. A failed write is logged and the removal kept
    /// in memory: the node was removed whether or not the disk says so, and a restart
    /// learns it again from the members.
    pub(crate) async fn record(&self, removal: Removal) -> bool {
        if removal.node != self.me {
            return false;
        }
        let _one = self.write.lock().await;
        if self.get().is_some() {
            return false;
        }
        let engine = self.engine.clone();
        let stored = removal.clone();
        let written = tokio::task::spawn_blocking(move || persist(&*engine, &stored)).await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot record this node's removal"),
            Err(e) => tracing::warn!(error = %e, "cannot record this node's removal"),
        }
        // Not a member any more: campaigning would only disturb the members.
        if let Some(raft) = self.raft.get() {
            raft.runtime_config().elect(false);
        }
        self.tx.send_replace(Some(removal));
        true
    }
}

fn persist(engine: &dyn KvEngine, removal: &Removal) -> Result<(), hawser_store::StoreError> {
    let mut batch = WriteBatch::new();
    // A Removal always serializes (plain numbers and an enum).
    let json = serde_json::to_vec(removal).unwrap_or_default();
    batch.put(REMOVAL_KEY.to_vec(), json);
    engine.apply(batch)?;
    engine.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::RemovedNode;
    use hawser_core::Ident;
    use hawser_store::MemEngine;

    #[test]
    fn times_print_as_utc_calendar_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20 UTC");
    }

    #[tokio::test]
    async fn the_first_removal_found_is_kept_across_a_reopen() {
        let engine: Arc<dyn KvEngine> = Arc::new(MemEngine::new());
        let state = ClusterState::default();
        let book = RemovalBook::open(engine.clone(), NodeId(7), &state).unwrap();
        assert_eq!(book.get(), None);
        let watch = book.subscribe();
        let refused = Removal {
            node: NodeId(7),
            cluster_id: 3,
            log_index: 12,
            at_unix_ms: 1_700_000_000_000,
            learned: Learned::Refused { by: NodeId(3) },
        };
        // Another node's removal is not this one's.
        let other = Removal {
            node: NodeId(8),
            ..refused.clone()
        };
        assert!(!book.record(other).await);
        assert!(book.record(refused.clone()).await);
        assert!(watch.has_changed().unwrap());
        let told = Removal {
            learned: Learned::Told { by: NodeId(3) },
            ..refused.clone()
        };
        assert!(!book.record(told).await, "the first one stays");
        let again = RemovalBook::open(engine, NodeId(7), &state).unwrap();
        assert_eq!(again.get(), Some(refused.clone()));
        assert_eq!(
            refused.describe(),
            "removed from cluster 3 at 2023-11-14 22:13:20 UTC (Raft log index 12)"
        );
    }

    #[test]
    fn a_state_that_removed_this_node_is_recorded_at_open() {
        let engine: Arc<dyn KvEngine> = Arc::new(MemEngine::new());
        let mut state = ClusterState {
            cluster_id: 3,
            ..Default::default()
        };
        state.removed.insert(
            NodeId(7),
            RemovedNode {
                store: Ident::unquoted("n7"),
                at_unix_ms: 5,
                log_index: 9,
            },
        );
        let book = RemovalBook::open(engine.clone(), NodeId(7), &state).unwrap();
        let r = book.get().expect("removed");
        assert_eq!(
            (r.learned, r.log_index, r.cluster_id),
            (Learned::Applied, 9, 3)
        );
        let reopened = RemovalBook::open(engine, NodeId(7), &ClusterState::default()).unwrap();
        assert_eq!(reopened.get(), Some(r));
    }
}
