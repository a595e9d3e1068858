//! `hawser switchover`: moves the master role of every element one store masters in a
//! scheme to one of their subscribers, with nothing lost — the planned switchover of
//! `ALTER REPLICATION s ALTER ELEMENT * IN from SET MASTER to` (docs/control.md,
//! "Planned switchover"), checked before it is asked for and timed.
//!
//! ```text
//!  status (from the Raft leader: node health is known there) ─► plan (pure): the
//!  elements `from` masters, `to` subscribing to each, `to` not late or unreachable
//!  ─► the ALTER, timed (the old master drains, the new one catches up, then the
//!  role moves) ─► status: the new master and epoch of each element
//! ```

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use hawser_client::Client;
use hawser_proto::v1;
use serde_json::json;

use crate::output::{error_text, Format};

/// `hawser switchover`'s arguments.
#[derive(clap::Args, Debug)]
#[command(after_help = "Example:\n  hawser switchover --host n1:7420 --scheme repscheme --to ds2")]
pub struct SwitchoverArgs {
    /// Any member of the cluster.
    #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
    host: String,
    /// The replication scheme.
    #[arg(long, value_name = "NAME")]
    scheme: String,
    /// The store that takes the master role: a subscriber of every element moved.
    #[arg(long, value_name = "STORE")]
    to: String,
    /// The store that masters the elements now [default: the one store that masters
    /// elements of the scheme].
    #[arg(long, value_name = "STORE")]
    from: Option<String>,
    /// Output: a line for a person, or one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// What a switchover moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub from: String,
    pub elements: Vec<String>,
    pub ddl: String,
}

/// What switching `scheme`'s elements mastered by `from` (or by its one master store)
/// over to `to` moves, as `cluster` shows the cluster — or why it cannot be done.
pub fn plan(
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
        ddl: format!(
            "ALTER REPLICATION {} ALTER ELEMENT * IN {from} SET MASTER {to}",
            s.name
        ),
        elements: moved.iter().map(|e| e.name.clone()).collect(),
        from,
    })
}

/// The cluster status as the Raft leader sees it (node health is known only there),
/// asked through `host`.
pub(crate) async fn leader_status(host: &str) -> anyhow::Result<v1::ClusterStatus> {
    let mut client = Client::connect(host)
        .await
        .with_context(|| format!("connect to {host}"))?;
    let status = client.status().await.context("read the cluster status")?;
    let cluster = status.cluster.context("this node is not in a cluster")?;
    if cluster.role == "leader" || cluster.leader_addr.is_empty() {
        return Ok(cluster);
    }
    let mut leader = Client::connect(&cluster.leader_addr)
        .await
        .with_context(|| format!("connect to the Raft leader at {}", cluster.leader_addr))?;
    leader
        .status()
        .await
        .context("read the cluster status on the Raft leader")?
        .cluster
        .context("the Raft leader is not in a cluster")
}

/// Runs `hawser switchover`. Exit status 1 when it cannot be done (with why) or fails.
pub async fn run(args: SwitchoverArgs) -> anyhow::Result<ExitCode> {
    let before = leader_status(&args.host).await?;
    let plan = match plan(&before, &args.scheme, args.from.as_deref(), &args.to) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("error: cannot switch over: {why}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut client = Client::connect(&args.host)
        .await
        .with_context(|| format!("connect to {}", args.host))?;
    let started = Instant::now();
    let outcome = match client.execute(&plan.ddl).await {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: switchover: {}", error_text(&e));
            return Ok(ExitCode::FAILURE);
        }
    };
    let millis = started.elapsed().as_millis() as u64;
    if let Some(e) = outcome.error {
        eprintln!(
            "error[{}]: switchover refused: {}{}",
            e.code,
            e.message,
            if e.code == "57P03" {
                " (retryable: nothing moved)"
            } else {
                ""
            }
        );
        return Ok(ExitCode::FAILURE);
    }
    let after = leader_status(&args.host).await?;
    let epochs: Vec<(String, u64)> = after
        .schemes
        .iter()
        .flat_map(|s| &s.elements)
        .filter(|e| {
            plan.elements.contains(&e.name) && e.master_store.eq_ignore_ascii_case(&args.to)
        })
        .map(|e| (e.name.clone(), e.epoch))
        .collect();
    match args.format {
        Format::Json => println!(
            "{}",
            json!({
                "scheme": args.scheme,
                "from": plan.from,
                "to": args.to,
                "elements": epochs.iter().map(|(e, epoch)| json!({"element": e, "epoch": epoch})).collect::<Vec<_>>(),
                "millis": millis,
            })
        ),
        Format::Table => println!(
            "switched over: {} from {} to {} ({}) in {millis} ms — writes to them paused for \
             at most that long",
            plan.elements.join(", "),
            plan.from,
            args.to,
            epochs
                .iter()
                .map(|(e, epoch)| format!("{e} epoch {epoch}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    Ok(ExitCode::SUCCESS)
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
