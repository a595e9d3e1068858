//! What the demo shows at the end: gathered from the nodes into one [`Summary`], printed
//! as a few aligned tables for a person, or serialized as one JSON object.
//!
//! ```text
//!  each node's status (gRPC) ──► cluster: nodes, Raft roles, leader
//!  the effective scheme ───────► roles per element, STORE attributes
//!  each sender's /replication ─► streams: state, lag, acked high-water, raw/wire bytes
//!  the master's /replication ──► return services ("returns", when the node has them)
//!  SELECT * on every holder ───► per table a checksum per node, match or DIFFERENT
//!  ds3's accounts_history ─────► the CCD change history, in commit order
//!  the conflict step ──────────► the two updates, who holds what, what was recorded
//! ```
//!
//! The JSON form carries everything the tables show; the tables are a rendering of the
//! same struct, so the two cannot disagree.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::checksum::{self, Checksum};
use super::probe::get_json;
use super::scheme::{self, ElementRoles, NODES};
use super::{Demo, Workload};
use crate::output::{render_table, Align};

/// How the checksums are computed (also printed with them).
const CHECKSUM_METHOD: &str =
    "CRC-32 of every row in primary-key order (SELECT * ... ORDER BY key), computed by the demo";

/// Everything the demo shows.
#[derive(Debug, Serialize)]
pub(crate) struct Summary {
    pub(crate) nodes: Vec<NodeReport>,
    /// The Raft leader's store name, as the master sees it.
    pub(crate) leader: Option<String>,
    pub(crate) raft_term: u64,
    pub(crate) scheme: SchemeReport,
    pub(crate) streams: Vec<StreamReport>,
    /// The master's return-service counters; `None` when its node does not report them.
    pub(crate) returns: Option<Returns>,
    /// Whether every stream acknowledged its sender's whole log before the checksums.
    pub(crate) caught_up: bool,
    pub(crate) checksum_method: &'static str,
    pub(crate) checksums: Vec<TableReport>,
    /// Every table's copies match.
    pub(crate) all_match: bool,
    pub(crate) workload: Option<Workload>,
    /// ds3's CCD history of accounts.
    pub(crate) history: Option<super::history::HistoryReport>,
    /// The conflict step's report.
    pub(crate) conflict: Option<super::conflict::ConflictReport>,
    /// What could not be read from the nodes.
    pub(crate) problems: Vec<String>,
    pub(crate) data_dir: String,
    pub(crate) elapsed_ms: u64,
    /// What `--failover` did, after everything above was gathered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) failover: Option<super::failover::FailoverReport>,
}

/// One node.
#[derive(Debug, Serialize)]
pub(crate) struct NodeReport {
    pub(crate) name: String,
    pub(crate) node_id: u64,
    pub(crate) grpc: String,
    pub(crate) http: String,
    /// The node's own Raft role: leader, follower, ...
    pub(crate) raft_role: String,
    pub(crate) last_lsn: u64,
    pub(crate) commits: u64,
    /// The node's log file.
    pub(crate) log: String,
}

/// The effective scheme.
#[derive(Debug, Serialize)]
pub(crate) struct SchemeReport {
    pub(crate) name: String,
    pub(crate) elements: Vec<ElementRoles>,
    /// STORE clauses, one line each.
    pub(crate) stores: Vec<String>,
    /// Canonical CREATE REPLICATION text.
    pub(crate) ddl: String,
}

/// One outbound stream, as its sender reports it.
#[derive(Debug, Serialize)]
pub(crate) struct StreamReport {
    pub(crate) scheme: String,
    pub(crate) sender: String,
    pub(crate) receiver: String,
    pub(crate) state: String,
    pub(crate) reason: Option<String>,
    /// The sender's COMPRESS TRAFFIC.
    pub(crate) compressed: bool,
    /// How the sender compresses: `off`, `lz4` or `zstd:LEVEL` (its node's
    /// `compress_codec`).
    pub(crate) compression: String,
    pub(crate) lag_records: u64,
    pub(crate) lag_micros: u64,
    /// The smoothed round trip of the stream's acks (0 before the first).
    pub(crate) ack_micros_mean: u64,
    /// Acknowledged (committed by the receiver) high-water per origin store, the
    /// receiver's own origin left out.
    pub(crate) acked_applied: BTreeMap<String, u64>,
    pub(crate) transactions: u64,
    pub(crate) raw_bytes: u64,
    pub(crate) wire_bytes: u64,
    /// `100 * (1 - wire / raw)`; 0 when nothing was sent.
    pub(crate) saving_percent: f64,
}

/// The master's return-service counters, as HTTP `/replication` reports them under
/// `"returns"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Returns {
    pub(crate) waiting: u64,
    pub(crate) acknowledged: u64,
    pub(crate) timed_out: u64,
    pub(crate) not_requested: u64,
    #[serde(default)]
    pub(crate) subscribers: Vec<ReturnSubscriber>,
}

/// One subscriber's return-service state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ReturnSubscriber {
    pub(crate) subscriber: String,
    #[serde(default)]
    pub(crate) disabled: bool,
    #[serde(default)]
    pub(crate) timeouts: u64,
}

/// One table's checksum on every node that holds it.
#[derive(Debug, Serialize)]
pub(crate) struct TableReport {
    pub(crate) table: String,
    pub(crate) nodes: Vec<NodeChecksum>,
    /// Every copy has the master's checksum.
    #[serde(rename = "match")]
    pub(crate) matches: bool,
}

/// A table's checksum on one node.
#[derive(Debug, Serialize)]
pub(crate) struct NodeChecksum {
    pub(crate) node: String,
    #[serde(flatten)]
    pub(crate) checksum: Option<Checksum>,
    /// Why there is no checksum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// Reads `"returns"` out of a `/replication` answer: `None` when it is absent (nodes
/// that do not run return services yet) or not in the expected shape.
pub(crate) fn returns_of(replication: &serde_json::Value) -> Option<Returns> {
    serde_json::from_value(replication.get("returns")?.clone()).ok()
}

/// `100 * (1 - wire / raw)`, 0 when nothing was sent.
pub(crate) fn saving_percent(raw: u64, wire: u64) -> f64 {
    if raw == 0 {
        return 0.0;
    }
    100.0 * (1.0 - wire as f64 / raw as f64)
}

impl Summary {
    /// Asks every node and builds the summary; what a node cannot answer is listed in
    /// `problems`.
    pub(crate) async fn gather(demo: &Demo) -> Summary {
        let names: BTreeMap<String, String> = demo
            .nodes
            .iter()
            .map(|n| (n.node_id.to_string(), n.name.clone()))
            .collect();

        // A node that does not answer is shown as such: the summary matters most when
        // something is wrong.
        let mut problems = Vec::new();
        let mut nodes = Vec::new();
        let mut leader = None;
        let mut raft_term = 0;
        for n in &demo.nodes {
            let mut report = NodeReport {
                name: n.name.clone(),
                node_id: n.node_id,
                grpc: n.grpc.clone(),
                http: n.http.clone(),
                raft_role: "unreachable".into(),
                last_lsn: 0,
                commits: 0,
                log: n.log.display().to_string(),
            };
            match n.client.clone().status().await {
                Ok(status) => {
                    let cluster = status.cluster.unwrap_or_default();
                    // The leader as the first node that answers sees it.
                    if leader.is_none() {
                        leader = names.get(&cluster.leader_id.to_string()).cloned();
                        raft_term = cluster.term;
                    }
                    report.raft_role = cluster.role;
                    report.last_lsn = status.last_lsn;
                    report.commits = status.commits;
                }
                Err(e) => problems.push(format!("{}: status: {e}", n.name)),
            }
            nodes.push(report);
        }

        let mut streams = Vec::new();
        let mut returns = None;
        for n in &demo.nodes {
            let replication = match get_json(&n.http, "/replication").await {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("{}: {e:#}", n.name));
                    continue;
                }
            };
            if n.name == NODES[0] {
                returns = returns_of(&replication);
            }
            for s in replication["outbound"].as_array().into_iter().flatten() {
                streams.push(stream_report(demo, &n.name, s, &names));
            }
        }

        let mut checksums = Vec::new();
        for (table, holders) in scheme::table_holders(&demo.scheme) {
            let mut per_node = Vec::new();
            for holder in holders {
                let read = match demo.node(&holder) {
                    Ok(node) => checksum::of_table(&node.client, &table).await,
                    Err(e) => Err(e),
                };
                let (checksum, error) = match read {
                    Ok(c) => (Some(c), None),
                    Err(e) => {
                        let why = format!("{e}: {}", e.root_cause());
                        problems.push(format!("{holder}: checksum of {table}: {why}"));
                        (None, Some(why))
                    }
                };
                per_node.push(NodeChecksum {
                    node: holder,
                    checksum,
                    error,
                });
            }
            let first = per_node.first().and_then(|c| c.checksum);
            let matches = first.is_some() && per_node.iter().all(|c| c.checksum == first);
            checksums.push(TableReport {
                table,
                nodes: per_node,
                matches,
            });
        }

        let history = match super::history::gather(demo).await {
            Ok(h) => Some(h),
            Err(e) => {
                problems.push(format!("{e:#}"));
                None
            }
        };
        Summary {
            nodes,
            leader,
            raft_term,
            scheme: SchemeReport {
                name: demo.scheme.name.to_string(),
                elements: scheme::roles(&demo.scheme),
                stores: scheme::store_lines(&demo.scheme),
                ddl: hawser_scheme::print_scheme(&demo.scheme),
            },
            streams,
            returns,
            caught_up: demo.caught_up,
            checksum_method: CHECKSUM_METHOD,
            all_match: !checksums.is_empty() && checksums.iter().all(|t| t.matches),
            checksums,
            workload: demo.workload.clone(),
            history,
            conflict: demo.conflict.clone(),
            problems,
            data_dir: demo.root.display().to_string(),
            elapsed_ms: demo.started.elapsed().as_millis() as u64,
            failover: None,
        }
    }

    /// The summary as aligned tables for a person.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let h = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();

        let _ = writeln!(
            out,
            "\nCLUSTER — Raft leader {} (term {})",
            self.leader.as_deref().unwrap_or("unknown"),
            self.raft_term
        );
        let rows: Vec<Vec<String>> = self
            .nodes
            .iter()
            .map(|n| {
                vec![
                    n.name.clone(),
                    n.raft_role.clone(),
                    n.grpc.clone(),
                    n.http.clone(),
                    n.last_lsn.to_string(),
                    n.node_id.to_string(),
                ]
            })
            .collect();
        out.push_str(&render_table(
            &h(&["node", "raft", "gRPC", "HTTP", "last LSN", "node id"]),
            &[
                Align::Left,
                Align::Left,
                Align::Left,
                Align::Left,
                Align::Right,
                Align::Right,
            ],
            &rows,
        ));

        let _ = writeln!(out, "\nSCHEME {} — roles per element", self.scheme.name);
        let rows: Vec<Vec<String>> = self
            .scheme
            .elements
            .iter()
            .map(|e| {
                let subs: Vec<String> = e
                    .subscribers
                    .iter()
                    .map(|s| {
                        let rs = match s.return_service.as_str() {
                            "NO RETURN" => "asynchronous",
                            rs => rs,
                        };
                        match &s.target {
                            Some(t) => format!("{} ({rs}, {t})", s.store),
                            None => format!("{} ({rs})", s.store),
                        }
                    })
                    .collect();
                vec![
                    e.element.clone(),
                    format!("{} {}", e.kind, e.object),
                    format!("{} {}", e.owner_role, e.owner),
                    subs.join(", "),
                ]
            })
            .collect();
        out.push_str(&render_table(
            &h(&["element", "replicates", "owner", "subscribers"]),
            &[Align::Left; 4],
            &rows,
        ));
        for s in &self.scheme.stores {
            let _ = writeln!(out, "STORE {s}");
        }

        let _ = writeln!(out, "\nSTREAMS — as each sender reports them");
        let rows: Vec<Vec<String>> = self
            .streams
            .iter()
            .map(|s| {
                let acked: Vec<String> = s
                    .acked_applied
                    .iter()
                    .map(|(origin, seq)| format!("{origin}:{seq}"))
                    .collect();
                let main = s.scheme == self.scheme.name;
                vec![
                    if main {
                        format!("{} → {}", s.sender, s.receiver)
                    } else {
                        format!("{} → {} ({})", s.sender, s.receiver, s.scheme)
                    },
                    match &s.reason {
                        Some(r) => format!("{} ({r})", s.state),
                        None => s.state.clone(),
                    },
                    s.compression.clone(),
                    s.lag_records.to_string(),
                    format!("{:.1}", s.lag_micros as f64 / 1000.0),
                    match s.ack_micros_mean {
                        0 => "-".to_string(),
                        us => format!("{:.2}", us as f64 / 1000.0),
                    },
                    acked.join(", "),
                    s.transactions.to_string(),
                    bytes(s.raw_bytes),
                    bytes(s.wire_bytes),
                    format!("{:.0}%", s.saving_percent),
                ]
            })
            .collect();
        out.push_str(&render_table(
            &h(&[
                "stream",
                "state",
                "compress",
                "lag rec",
                "lag ms",
                "ack ms",
                "acked origin:seq",
                "txns",
                "raw",
                "wire",
                "saved",
            ]),
            &[
                Align::Left,
                Align::Left,
                Align::Left,
                Align::Right,
                Align::Right,
                Align::Right,
                Align::Left,
                Align::Right,
                Align::Right,
                Align::Right,
                Align::Right,
            ],
            &rows,
        ));

        let _ = write!(out, "\nRETURN SERVICES — commits on {}", NODES[0]);
        match &self.returns {
            None => out.push_str(": n/a (the nodes do not report return services yet)\n"),
            Some(r) => {
                out.push('\n');
                out.push_str(&render_table(
                    &h(&["waiting", "acknowledged", "timed out", "not requested"]),
                    &[Align::Right; 4],
                    &[vec![
                        r.waiting.to_string(),
                        r.acknowledged.to_string(),
                        r.timed_out.to_string(),
                        r.not_requested.to_string(),
                    ]],
                ));
                for s in &r.subscribers {
                    let _ = writeln!(
                        out,
                        "{}: {}, {} timeouts",
                        s.subscriber,
                        if s.disabled { "disabled" } else { "enabled" },
                        s.timeouts
                    );
                }
            }
        }

        let _ = writeln!(out, "\nCHECKSUMS — {}", self.checksum_method);
        let holders: Vec<String> = {
            let mut all: Vec<String> = Vec::new();
            for t in &self.checksums {
                for c in &t.nodes {
                    if !all.contains(&c.node) {
                        all.push(c.node.clone());
                    }
                }
            }
            all
        };
        let mut headers = vec!["table".to_string()];
        headers.extend(holders.iter().cloned());
        headers.push("copies".into());
        let rows: Vec<Vec<String>> = self
            .checksums
            .iter()
            .map(|t| {
                let mut row = vec![t.table.clone()];
                for node in &holders {
                    let cell = t.nodes.iter().find(|c| &c.node == node);
                    row.push(match cell {
                        None => "-".into(),
                        Some(NodeChecksum {
                            checksum: Some(c), ..
                        }) => c.to_string(),
                        Some(NodeChecksum { .. }) => "unreadable".into(),
                    });
                }
                row.push(if t.matches { "match" } else { "DIFFERENT" }.into());
                row
            })
            .collect();
        out.push_str(&render_table(&headers, &[], &rows));
        if !self.caught_up {
            out.push_str("(the subscribers had not caught up when the checksums were taken)\n");
        }

        if let Some(h) = &self.history {
            out.push_str(&h.render());
        }
        if let Some(c) = &self.conflict {
            out.push_str(&c.render());
        }

        if !self.problems.is_empty() {
            let _ = writeln!(out, "\nPROBLEMS");
            for p in &self.problems {
                let _ = writeln!(out, "  {p}");
            }
        }

        if let Some(w) = &self.workload {
            let _ = writeln!(
                out,
                "\nWORKLOAD — {} commits into {} on {} by {} writers in {:.2} s ({:.0} commits/s)",
                w.commits, w.table, w.node, w.writers, w.seconds, w.commits_per_sec
            );
        }
        if let Some(f) = &self.failover {
            out.push_str(&f.render());
        }
        out
    }
}

fn stream_report(
    demo: &Demo,
    sender: &str,
    s: &serde_json::Value,
    names: &BTreeMap<String, String>,
) -> StreamReport {
    let num = |k: &str| s[k].as_u64().unwrap_or(0);
    let receiver = s["receiver"].as_str().unwrap_or("?").to_string();
    let acked_applied = s["acked_applied"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(id, seq)| {
            let origin = names.get(id).cloned().unwrap_or_else(|| id.clone());
            (origin != receiver).then_some((origin, seq.as_u64().unwrap_or(0)))
        })
        .collect();
    let (raw_bytes, wire_bytes) = (num("raw_bytes"), num("wire_bytes"));
    // A node that does not report it compresses as the scheme says, with lz4.
    let compression = match s["compression"].as_str() {
        Some(c) => c.to_string(),
        None if scheme::compressed(&demo.scheme, sender) => "lz4".to_string(),
        None => "off".to_string(),
    };
    StreamReport {
        scheme: s["scheme"].as_str().unwrap_or("?").to_string(),
        sender: sender.to_string(),
        state: s["state"].as_str().unwrap_or("?").to_string(),
        reason: s["reason"].as_str().map(str::to_string),
        compressed: compression != "off",
        compression,
        lag_records: num("lag_records"),
        lag_micros: num("lag_micros"),
        ack_micros_mean: num("ack_micros_mean"),
        acked_applied,
        transactions: num("transactions"),
        raw_bytes,
        wire_bytes,
        saving_percent: saving_percent(raw_bytes, wire_bytes),
        receiver,
    }
}

/// A byte count for people: `512 B`, `41.2 KiB`, `3.0 MiB`.
fn bytes(n: u64) -> String {
    const KIB: f64 = 1024.0;
    let f = n as f64;
    if f < KIB {
        format!("{n} B")
    } else if f < KIB * KIB {
        format!("{:.1} KiB", f / KIB)
    } else {
        format!("{:.1} MiB", f / (KIB * KIB))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_are_read_when_present_and_none_otherwise() {
        let absent = serde_json::json!({"outbound": [], "inbound": []});
        assert_eq!(returns_of(&absent), None);
        let present = serde_json::json!({"outbound": [], "returns": {
            "waiting": 1, "acknowledged": 300, "timed_out": 2, "not_requested": 4,
            "subscribers": [{"subscriber": "ds2", "disabled": false, "timeouts": 2}]
        }});
        let r = returns_of(&present).expect("returns");
        assert_eq!((r.waiting, r.acknowledged, r.timed_out), (1, 300, 2));
        assert_eq!(r.subscribers[0].subscriber, "ds2");
        let malformed = serde_json::json!({"returns": "later"});
        assert_eq!(returns_of(&malformed), None);
    }

    #[test]
    fn savings_and_byte_counts_read_well() {
        assert_eq!(saving_percent(0, 0), 0.0);
        assert_eq!(saving_percent(1000, 250), 75.0);
        assert_eq!(saving_percent(1000, 1000), 0.0);
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(42_189), "41.2 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
    }
}
