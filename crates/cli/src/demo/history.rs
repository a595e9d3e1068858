//! ds3's change history of `accounts`: the DB2 CCD NONCONDENSED table its subscriber
//! keeps (docs/targets.md), read for the summary — every change of the seed rows and
//! the transfer, in commit order, with its operation.

use std::fmt::Write as _;

use anyhow::Context;
use serde::Serialize;

use super::scheme::{HISTORY_TABLE, NODES};
use super::Demo;
use crate::output::{render_table, Align};

/// The history as the summary shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HistoryReport {
    pub(crate) node: String,
    pub(crate) table: String,
    pub(crate) kind: &'static str,
    /// Each change: `IBMSNAP_OPERATION`, id, owner, balance.
    pub(crate) changes: Vec<[String; 4]>,
}

const QUERY: &str = "select ibmsnap_operation, id, owner, balance from accounts_history \
                     order by ibmsnap_commitseq, ibmsnap_intentseq";

/// Reads the history on ds3.
pub(crate) async fn gather(demo: &Demo) -> anyhow::Result<HistoryReport> {
    let node = demo.node(NODES[2])?;
    let outcome = node
        .client
        .clone()
        .execute(QUERY)
        .await
        .with_context(|| format!("read {HISTORY_TABLE} on {}", node.name))?;
    if let Some(e) = outcome.error {
        anyhow::bail!("read {HISTORY_TABLE} on {}: {}", node.name, e.message);
    }
    let changes = outcome
        .results
        .first()
        .map(|r| {
            r.rows
                .iter()
                .map(|row| {
                    std::array::from_fn(|i| row.get(i).map_or(String::new(), |v| v.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(HistoryReport {
        node: node.name.clone(),
        table: HISTORY_TABLE.to_string(),
        kind: "CCD NONCONDENSED",
        changes,
    })
}

impl HistoryReport {
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nHISTORY — {} on {} ({} of accounts): every change, in commit order",
            self.table, self.node, self.kind
        );
        let h = ["operation", "id", "owner", "balance"].map(str::to_string);
        let rows: Vec<Vec<String>> = self.changes.iter().map(|c| c.to_vec()).collect();
        out.push_str(&render_table(
            &h,
            &[Align::Left, Align::Right, Align::Left, Align::Right],
            &rows,
        ));
        out
    }
}
