//! `Admin.Switchover`: the planned switchover of every element one store masters in a
//! scheme, checked before it is asked for and timed (`hawser switchover`; docs/control.md,
//! "Planned switchover").
//!
//! ```text
//!  this node not the Raft leader ─► the request goes to the leader (node health is
//!  known only there)
//!  leader's status ─► plan (pure): the elements `from` masters, `to` subscribing to
//!  each, `to` healthy ─► ALTER REPLICATION s ALTER ELEMENT * IN from SET MASTER to,
//!  timed (the old master drains, the new one catches up, then the role moves)
//!  ─► the new epoch of each element moved
//! ```
//!
//! TimesTen's grammar moves every element of a store at once (`ALTER ELEMENT * IN`), so
//! there are no per-element moves.

use hawser_proto::v1;

/// What a switchover moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The scheme as the cluster names it.
    pub(crate) scheme: String,
    pub(crate) from: String,
    pub(crate) elements: Vec<String>,
    pub(crate) ddl: String,
}

/// What switching `scheme`'s elements mastered by `from` (or by its one master store)
/// over to `to` moves, as `cluster` shows the cluster — or why it cannot be done.
pub(crate) fn plan(
    cluster: &v1::ClusterStatus,
    scheme: &str,
    from: Option<&str>,
    to: &str,
) -> Result<Plan, String> {
    let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    let Some(s) = cluster.schemes.iter().find(|s| {
        same(&s.name, scheme) || s.name.rsplit('.').next().is_some_and(|n| same(n, scheme))
    }) else {
        let names: Vec<&str> = cluster.schemes.iter().map(|s| s.name.as_str()).collect();
        return Err(format!(
            "no replication scheme {scheme} (the cluster has: {})",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        ));
    };
    let masters: Vec<&v1::ElementStatus> = s
        .elements
        .iter()
        .filter(|e| e.owner_role == "MASTER")
        .collect();
    let from = match from {
        Some(f) => f.to_string(),
        None => {
            let mut stores: Vec<&str> = masters.iter().map(|e| e.master_store.as_str()).collect();
            stores.sort();
            stores.dedup();
            match stores[..] {
                [one] => one.to_string(),
                [] => return Err(format!("scheme {} has no MASTER element", s.name)),
                _ => {
                    return Err(format!(
                        "scheme {} has several master stores ({}): say which with --from",
                        s.name,
                        stores.join(", ")
                    ))
                }
            }
        }
    };
    let moved: Vec<&v1::ElementStatus> = masters
        .iter()
        .copied()
        .filter(|e| same(&e.master_store, &from))
        .collect();
    if moved.is_empty() {
        return Err(format!(
            "store {from} masters no element of scheme {}",
            s.name
        ));
    }
    if same(&from, to) {
        return Err(format!("store {to} masters those elements already"));
    }
    for e in &moved {
        if !e.subscribers.iter().any(|sub| same(sub, to)) {
            return Err(format!(
                "store {to} does not subscribe to element {} (its subscribers: {}); the \
                 master role moves to a subscriber, which has the element's rows",
                e.name,
                e.subscribers.join(", ")
            ));
        }
    }
    if let Some(node) = cluster.nodes.iter().find(|n| same(&n.store, to)) {
        if matches!(node.health.as_str(), "late" | "unreachable") {
            return Err(format!(
                "store {to} is {} (the Raft leader has not heard from it lately): a \
                 switchover to it could not finish",
                node.health
            ));
        }
    } else {
        return Err(format!("store {to} has not joined the cluster"));
    }
    Ok(Plan {
        scheme: s.name.clone(),
        ddl: format!(
            "ALTER REPLICATION {} ALTER ELEMENT * IN {from} SET MASTER {to}",
            s.name
        ),
        elements: moved.iter().map(|e| e.name.clone()).collect(),
        from,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> v1::ClusterStatus {
        let element = |name: &str, master: &str, subs: &[&str]| v1::ElementStatus {
            name: name.into(),
            kind: "TABLE".into(),
            owner_role: "MASTER".into(),
            master_store: master.into(),
            subscribers: subs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let node = |store: &str, health: &str| v1::ClusterNode {
            store: store.into(),
            health: health.into(),
            ..Default::default()
        };
        v1::ClusterStatus {
            schemes: vec![v1::SchemeStatus {
                name: "r".into(),
                elements: vec![
                    element("a", "n2", &["n3", "n1"]),
                    element("b", "n2", &["n3"]),
                ],
                ..Default::default()
            }],
            nodes: vec![
                node("n1", "ok"),
                node("n2", "ok"),
                node("n3", "ok"),
                node("n4", "unreachable"),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_switchover_moves_every_element_of_the_master_to_a_subscriber_of_each() {
        let c = cluster();
        let p = plan(&c, "R", None, "n3").unwrap();
        assert_eq!(p.from, "n2");
        assert_eq!(p.elements, ["a", "b"]);
        assert_eq!(
            p.ddl,
            "ALTER REPLICATION r ALTER ELEMENT * IN n2 SET MASTER n3"
        );
        assert_eq!(plan(&c, "r", Some("n2"), "n3").unwrap(), p);
    }

    #[test]
    fn a_switchover_that_cannot_be_done_says_why() {
        let c = cluster();
        let why = |s: &str, from: Option<&str>, to: &str| plan(&c, s, from, to).unwrap_err();
        assert!(why("q", None, "n3").contains("no replication scheme q"));
        assert!(why("r", None, "n1").contains("does not subscribe to element b"));
        assert!(why("r", None, "n2").contains("already"));
        assert!(why("r", Some("n1"), "n3").contains("masters no element"));
        assert!(why("r", None, "n9").contains("does not subscribe"));
        let mut down = c.clone();
        down.schemes[0].elements[1].subscribers.push("n4".into());
        down.schemes[0].elements[0].subscribers.push("n4".into());
        assert!(plan(&down, "r", None, "n4")
            .unwrap_err()
            .contains("unreachable"));
        let mut two = c.clone();
        two.schemes[0].elements[1].master_store = "n1".into();
        assert!(plan(&two, "r", None, "n3").unwrap_err().contains("--from"));
    }
}
