//! The demo's conflict: ds2 and ds3 both master `branches` under a second scheme
//! ([`BRANCHES_SCHEME`], TimesTen's `CHECK CONFLICTS BY ROW TIMESTAMP ... UPDATE BY
//! SYSTEM`). With both receivers of that scheme paused, ds2 and then ds3 update the
//! same row; once resumed, each receives the other's update. ds3's is later: ds2
//! applies it, ds3 rejects ds2's older one and records it in `hawser_conflicts`. Both
//! end with ds3's row.
//!
//! ```text
//!   CREATE REPLICATION branches ─► insert on ds2, seen on ds3 ─► pause both receivers
//!     ─► update on ds2, then on ds3 (a later stamp) ─► start both receivers
//!     ─► both hold ds3's row; ds3's hawser_conflicts holds ds2's update
//! ```

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hawser_core::Value;
use serde::Serialize;

use super::node::ChildNode;
use super::probe::{get_json, wait_until};
use super::scheme::{BRANCHES_SCHEME, BRANCH_ROW, NODES};
use super::steps::{await_links, execute, outbound, replication_ddl};
use super::Demo;
use crate::output::render_table;

/// How long the conflict may take to be resolved once the receivers are started.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(30);
/// The scheme's name.
const SCHEME: &str = "branches";
const ROW: &str = "select manager, tstamp from branches where id = 1";

/// What the conflict step did and found.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConflictReport {
    pub(crate) scheme: String,
    pub(crate) table: String,
    /// The updates made while neither master heard the other, in the order made.
    pub(crate) updates: Vec<Update>,
    /// The manager each master holds afterwards.
    pub(crate) holds: Vec<(String, String)>,
    /// Rows of `hawser_conflicts` per master: `(node, rows, action of the last)`.
    pub(crate) recorded: Vec<(String, u64, String)>,
    /// Both masters hold the same row, the later update's.
    pub(crate) resolved_equal: bool,
    /// From the receivers' start until both held the same row.
    pub(crate) resolved_ms: u64,
}

/// One master's update of the row.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Update {
    pub(crate) node: String,
    pub(crate) manager: String,
    /// Its row timestamp (hex), set by the store (UPDATE BY SYSTEM).
    pub(crate) stamp: String,
}

/// The manager and stamp of row 1 on `node`.
async fn row(node: &ChildNode) -> anyhow::Result<Option<(String, Vec<u8>)>> {
    let outcome = execute(node, ROW).await?;
    let Some(r) = outcome.results.first().and_then(|r| r.rows.first()) else {
        return Ok(None);
    };
    match (&r[0], &r[1]) {
        (Value::Text(m), Value::Bytes(b)) => Ok(Some((m.clone(), b.clone()))),
        (Value::Text(m), Value::Null) => Ok(Some((m.clone(), Vec::new()))),
        other => bail!("on {}, row 1 of branches is {other:?}", node.name),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn receivers(demo: &Demo, state: &str) -> anyhow::Result<()> {
    let mut client = demo.node(NODES[1])?.client.clone();
    for store in [NODES[1], NODES[2]] {
        client
            .set_receiver_state(Some(SCHEME), store, state)
            .await
            .with_context(|| format!("set {store}'s receiver of {SCHEME} to {state}"))?;
    }
    Ok(())
}

/// `hawser_conflicts` on `node`: rows, and the action of the last.
async fn recorded(node: &ChildNode) -> anyhow::Result<(u64, String)> {
    let outcome = execute(
        node,
        "select action from hawser_conflicts order by detected_at",
    )
    .await?;
    let rows = outcome
        .results
        .first()
        .map(|r| r.rows.clone())
        .unwrap_or_default();
    let last = match rows.last().and_then(|r| r.first()) {
        Some(Value::Text(a)) => a.clone(),
        _ => String::new(),
    };
    Ok((rows.len() as u64, last))
}

/// Runs the conflict and keeps its report in the demo.
pub(crate) async fn run(demo: &mut Demo) -> anyhow::Result<()> {
    let (a, b) = (NODES[1], NODES[2]);
    replication_ddl(demo.node(b)?, BRANCHES_SCHEME).await?;
    let links = [
        (a.to_string(), b.to_string()),
        (b.to_string(), a.to_string()),
    ];
    await_links(demo, SCHEME, &links).await?;
    let (na, nb) = (demo.node(a)?, demo.node(b)?);
    execute(na, BRANCH_ROW).await?;
    wait_until(
        "the branch on both masters",
        RESOLVE_TIMEOUT,
        async || match row(nb).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(format!("no branch on {b} yet")),
            Err(e) => Err(format!("{e:#}")),
        },
    )
    .await?;

    receivers(demo, "pause").await?;
    // The senders see the pause once their node has applied it from Raft: until
    // then an update could still be shipped, and there would be no conflict.
    wait_until(
        "both streams of branches paused",
        RESOLVE_TIMEOUT,
        async || {
            for (sender, receiver) in &links {
                let node = demo.node(sender).map_err(|e| e.to_string())?;
                let replication = get_json(&node.http, "/replication")
                    .await
                    .map_err(|e| e.to_string())?;
                if let Some(s) = outbound(&replication, SCHEME, receiver) {
                    if s["state"] == "streaming" {
                        return Err(format!("{sender} → {receiver} still streaming"));
                    }
                }
            }
            Ok(())
        },
    )
    .await?;
    let mut updates = Vec::new();
    for (node, manager) in [(na, "Brian"), (nb, "Chen")] {
        let sql = format!("update branches set manager = '{manager}' where id = 1");
        execute(node, &sql).await?;
        let (_, stamp) = row(node).await?.context("the branch is gone")?;
        updates.push(Update {
            node: node.name.clone(),
            manager: manager.to_string(),
            stamp: hex(&stamp),
        });
    }
    receivers(demo, "start").await?;
    let started = Instant::now();

    let later = updates[1].manager.clone();
    wait_until("the conflict resolved alike", RESOLVE_TIMEOUT, async || {
        let (ra, rb) = (row(na).await, row(nb).await);
        match (ra, rb) {
            (Ok(Some(x)), Ok(Some(y))) if x == y && x.0 == later => {}
            (x, y) => return Err(format!("{a} holds {x:?}, {b} holds {y:?}")),
        }
        // ds3 rejected ds2's older update: recorded with the apply that rejected it.
        match recorded(nb).await {
            Ok((n, _)) if n > 0 => Ok(()),
            Ok(_) => Err(format!("no conflict recorded on {b} yet")),
            Err(e) => Err(format!("{e:#}")),
        }
    })
    .await?;
    let resolved_ms = started.elapsed().as_millis() as u64;
    let mut recorded_by = Vec::new();
    let mut holds = Vec::new();
    for node in [na, nb] {
        let (n, action) = recorded(node).await.unwrap_or((0, String::new()));
        recorded_by.push((node.name.clone(), n, action));
        let (manager, _) = row(node).await?.context("the branch is gone")?;
        holds.push((node.name.clone(), manager));
    }
    await_links(demo, SCHEME, &links).await?;
    demo.progress(&format!(
        "  {b}'s later update won on both in {resolved_ms} ms; {} conflict(s) recorded on {b}",
        recorded_by[1].1
    ));
    demo.conflict = Some(ConflictReport {
        scheme: SCHEME.to_string(),
        table: "branches".to_string(),
        updates,
        resolved_equal: holds.iter().all(|(_, m)| *m == later),
        holds,
        recorded: recorded_by,
        resolved_ms,
    });
    Ok(())
}

impl ConflictReport {
    /// The report as a few lines and a table for a person.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nCONFLICT — scheme {}: two masters of {}, CHECK CONFLICTS BY ROW TIMESTAMP",
            self.scheme, self.table
        );
        let rows: Vec<Vec<String>> = self
            .updates
            .iter()
            .map(|u| {
                let holds = self
                    .holds
                    .iter()
                    .find(|(n, _)| *n == u.node)
                    .map_or("?", |(_, m)| m.as_str());
                let kept = self
                    .recorded
                    .iter()
                    .find(|(n, _, _)| *n == u.node)
                    .map_or(0, |(_, k, _)| *k);
                vec![
                    u.node.clone(),
                    format!("manager = '{}'", u.manager),
                    u.stamp.clone(),
                    holds.to_string(),
                    kept.to_string(),
                ]
            })
            .collect();
        let h = [
            "master",
            "update while paused",
            "row timestamp",
            "holds now",
            "conflicts kept",
        ]
        .map(str::to_string);
        out.push_str(&render_table(&h, &[], &rows));
        let _ = writeln!(
            out,
            "{} in {} ms: the later timestamp wins on both; the store that rejected the \
             older update keeps it in hawser_conflicts (select * from hawser_conflicts)",
            if self.resolved_equal {
                "resolved alike"
            } else {
                "NOT RESOLVED ALIKE"
            },
            self.resolved_ms
        );
        out
    }
}
