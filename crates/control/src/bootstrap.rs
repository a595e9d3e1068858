//! Who may bootstrap a cluster: `hawser init` on a node started with `--join`.
//!
//! Every node of a Kubernetes StatefulSet starts with `--join` naming all of them, and
//! the init Job may reach any of them, more than once, even twice at the same time. A
//! node bootstraps only when every `--join` peer answers that it belongs to no cluster
//! *and* promises not to bootstrap one itself for a while ([`BOOTSTRAP_LEASE`]): the
//! peer grants that lease to one node at a time, and refuses it while it bootstraps
//! itself. Two inits started together on two fresh nodes therefore cannot both win:
//! whichever asks a node second is refused by it (both may be refused, and the Job's
//! retry settles it).
//!
//! The gate is pure (time is passed in) and unit-tested; the plane asks the peers
//! (`InitIntent` on the peer service) and keeps one gate per node.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How long a node's promise not to bootstrap, given to a peer that asked, lasts:
/// longer than the peer needs to bootstrap and register, short enough that an init
/// that died half-way blocks no other for long.
pub const BOOTSTRAP_LEASE: Duration = Duration::from_secs(20);

/// An `InitIntent` request: node `from` asks whether it may bootstrap a cluster, or
/// (`release`) gives back the lease it was granted after its init failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitIntent {
    pub from: u64,
    #[serde(default)]
    pub release: bool,
}

/// A peer's answer to an [`InitIntent`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InitAnswer {
    /// The asker may bootstrap: this node (`node`) belongs to no cluster and will not
    /// bootstrap one itself before the lease ends. Also the answer to the asker itself.
    Granted { node: u64 },
    /// This node (`node`) belongs to a cluster already; `leader` its leader's address
    /// when known.
    Member { node: u64, leader: String },
    /// Another node (`holder`, possibly this one, `node`) is bootstrapping.
    Busy { node: u64, holder: u64 },
}

/// One node's bootstrap gate: its own init under way, or the lease it granted a peer.
#[derive(Debug, Default)]
pub struct BootstrapGate {
    /// Until when this node's own init holds the gate.
    own: Option<Instant>,
    /// The peer granted the lease, and until when.
    lease: Option<(u64, Instant)>,
}

impl BootstrapGate {
    /// Answers node `from` asking to bootstrap, on node `me` (a member of a cluster led
    /// from `leader` when `member`).
    pub fn ask(&mut self, me: u64, from: u64, member: Option<String>, now: Instant) -> InitAnswer {
        if let Some(leader) = member {
            return InitAnswer::Member { node: me, leader };
        }
        if from == me {
            return InitAnswer::Granted { node: me };
        }
        if self.own.is_some_and(|until| now < until) {
            return InitAnswer::Busy {
                node: me,
                holder: me,
            };
        }
        match self.lease {
            Some((holder, until)) if holder != from && now < until => {
                InitAnswer::Busy { node: me, holder }
            }
            _ => {
                self.lease = Some((from, now + BOOTSTRAP_LEASE));
                InitAnswer::Granted { node: me }
            }
        }
    }

    /// Gives back the lease node `from` holds, if it holds it.
    pub fn release(&mut self, from: u64) {
        if self.lease.is_some_and(|(holder, _)| holder == from) {
            self.lease = None;
        }
    }

    /// This node starts its own init: refused with the holder of a lease it granted a
    /// peer that is still running, or of its own init under way.
    pub fn claim(&mut self, me: u64, now: Instant) -> Result<(), u64> {
        if self.own.is_some_and(|until| now < until) {
            return Err(me);
        }
        if let Some((holder, until)) = self.lease {
            if holder != me && now < until {
                return Err(holder);
            }
        }
        self.own = Some(now + BOOTSTRAP_LEASE);
        Ok(())
    }

    /// This node's own init ended, done or not.
    pub fn unclaim(&mut self) {
        self.own = None;
    }
}

/// Why a node may not bootstrap, from what its `--join` peers answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootstrapRefusal {
    /// `addr` (node `node`) belongs to a cluster already, led from `leader`.
    Member {
        addr: String,
        node: u64,
        leader: String,
    },
    /// `addr` (node `node`) promised node `holder` to let it bootstrap, or bootstraps
    /// itself (`holder == node`).
    Busy {
        addr: String,
        node: u64,
        holder: u64,
    },
    /// `addr` did not answer (`why`): it may be a member, so no verdict.
    Unanswered { addr: String, why: String },
}

impl std::fmt::Display for BootstrapRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootstrapRefusal::Member { addr, node, leader } => write!(
                f,
                "{addr} (node {node}) already belongs to a cluster (leader {}); this node \
                 joins it through --join instead of starting another; nothing changed",
                if leader.is_empty() { "unknown" } else { leader }
            ),
            BootstrapRefusal::Busy { addr, node, holder } if holder == node => write!(
                f,
                "{addr} (node {node}) is bootstrapping a cluster itself right now; this node \
                 joins it instead; nothing changed"
            ),
            BootstrapRefusal::Busy { addr, node, holder } => write!(
                f,
                "{addr} (node {node}) let node {holder} bootstrap a cluster moments ago; \
                 this node joins that one instead (retry init in {} s if none appears); \
                 nothing changed",
                BOOTSTRAP_LEASE.as_secs()
            ),
            BootstrapRefusal::Unanswered { addr, why } => write!(
                f,
                "cannot ask {addr} (a --join peer) whether it already belongs to a cluster: \
                 {why}; init bootstraps only when every peer answers that none exists — \
                 retry when they are up"
            ),
        }
    }
}

/// Whether a node may bootstrap, from each `--join` peer's answer: only when every one
/// granted it. The first refusal, in the peers' order, says why not.
pub fn verdict(answers: &[(String, Result<InitAnswer, String>)]) -> Result<(), BootstrapRefusal> {
    for (addr, answer) in answers {
        match answer {
            Ok(InitAnswer::Granted { .. }) => {}
            Ok(InitAnswer::Member { node, leader }) => {
                return Err(BootstrapRefusal::Member {
                    addr: addr.clone(),
                    node: *node,
                    leader: leader.clone(),
                })
            }
            Ok(InitAnswer::Busy { node, holder }) => {
                return Err(BootstrapRefusal::Busy {
                    addr: addr.clone(),
                    node: *node,
                    holder: *holder,
                })
            }
            Err(why) => {
                return Err(BootstrapRefusal::Unanswered {
                    addr: addr.clone(),
                    why: why.clone(),
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 11;
    const B: u64 = 22;
    const C: u64 = 33;

    fn granted(answer: InitAnswer) -> bool {
        matches!(answer, InitAnswer::Granted { .. })
    }

    #[test]
    fn a_free_node_grants_one_asker_at_a_time_until_the_lease_ends() {
        let t = Instant::now();
        let mut c = BootstrapGate::default();
        assert!(granted(c.ask(C, A, None, t)));
        // A asking again (a retry) keeps its lease; B is refused while it runs.
        assert!(granted(c.ask(C, A, None, t + Duration::from_secs(1))));
        assert_eq!(
            c.ask(C, B, None, t + Duration::from_secs(2)),
            InitAnswer::Busy { node: C, holder: A }
        );
        // C itself may not init while A holds its promise.
        assert_eq!(c.claim(C, t + Duration::from_secs(2)), Err(A));
        let later = t + Duration::from_secs(1) + BOOTSTRAP_LEASE;
        assert!(granted(c.ask(C, B, None, later)));
    }

    #[test]
    fn a_released_lease_frees_the_node_at_once_and_only_its_holder_releases_it() {
        let t = Instant::now();
        let mut c = BootstrapGate::default();
        assert!(granted(c.ask(C, A, None, t)));
        c.release(B);
        assert!(!granted(c.ask(C, B, None, t)));
        c.release(A);
        assert!(granted(c.ask(C, B, None, t)));
    }

    #[test]
    fn a_node_bootstrapping_itself_refuses_every_other_and_grants_itself() {
        let t = Instant::now();
        let mut a = BootstrapGate::default();
        assert_eq!(a.claim(A, t), Ok(()));
        assert_eq!(a.claim(A, t), Err(A), "one init at a time on a node");
        assert_eq!(
            a.ask(A, B, None, t),
            InitAnswer::Busy { node: A, holder: A }
        );
        assert!(granted(a.ask(A, A, None, t)), "its own --join entry");
        a.unclaim();
        assert!(granted(a.ask(A, B, None, t)));
    }

    #[test]
    fn a_member_says_so_whatever_else_it_holds() {
        let t = Instant::now();
        let mut c = BootstrapGate::default();
        assert_eq!(
            c.ask(C, A, Some("h:1".into()), t),
            InitAnswer::Member {
                node: C,
                leader: "h:1".into()
            }
        );
    }

    /// Two inits at once, on A and B, each asking A, B and C in every interleaving of
    /// their asks: never both granted by all.
    #[test]
    fn two_inits_at_once_never_both_win_in_any_order() {
        let t = Instant::now();
        // Each init is: claim its own gate, then ask the three gates in order. An
        // interleaving is the order of those 8 steps (4 per init) keeping each init's
        // own order.
        let steps = 8;
        let mut both = 0;
        let mut some = 0;
        for mask in 0u32..(1 << steps) {
            if mask.count_ones() != 4 {
                continue;
            }
            let mut gates = [
                BootstrapGate::default(),
                BootstrapGate::default(),
                BootstrapGate::default(),
            ];
            let ids = [A, B, C];
            let mut next = [0usize; 2];
            let mut ok = [true; 2];
            for s in 0..steps {
                let who = (mask >> s & 1) as usize; // 0: A's init, 1: B's
                let me = ids[who];
                let step = next[who];
                next[who] += 1;
                if !ok[who] {
                    continue;
                }
                if step == 0 {
                    ok[who] = gates[who].claim(me, t).is_ok();
                } else {
                    let target = step - 1;
                    ok[who] = granted(gates[target].ask(ids[target], me, None, t));
                }
            }
            if ok[0] && ok[1] {
                both += 1;
            }
            if ok[0] || ok[1] {
                some += 1;
            }
        }
        assert_eq!(both, 0, "two clusters bootstrapped");
        assert!(some > 0, "some interleavings let one init win");
    }

    #[test]
    fn the_verdict_names_the_first_refusal() {
        let ok = |node| Ok(InitAnswer::Granted { node });
        let all = vec![("a:1".to_string(), ok(A)), ("b:1".to_string(), ok(B))];
        assert_eq!(verdict(&all), Ok(()));
        let busy = vec![
            ("a:1".to_string(), ok(A)),
            (
                "b:1".to_string(),
                Ok(InitAnswer::Busy { node: B, holder: C }),
            ),
            ("c:1".to_string(), Err("connection refused".to_string())),
        ];
        let refusal = verdict(&busy).unwrap_err();
        assert_eq!(
            refusal,
            BootstrapRefusal::Busy {
                addr: "b:1".into(),
                node: B,
                holder: C
            }
        );
        assert!(refusal.to_string().contains("let node 33 bootstrap"));
        let down = vec![("c:1".to_string(), Err("connection refused".to_string()))];
        assert!(verdict(&down)
            .unwrap_err()
            .to_string()
            .contains("cannot ask c:1"));
    }
}
