//! `hawser status`: what a node knows about itself and the cluster, for people or as
//! JSON (fields in docs/status.md).

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use hawser_proto::v1;

/// How to print.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Format {
    /// Aligned text for people.
    Table,
    /// One JSON object for programs (fields documented in docs/status.md).
    Json,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Node to ask.
    #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
    host: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let mut client = hawser_client::Client::connect(&args.host)
        .await
        .with_context(|| format!("connect to {}", args.host))?;
    let s = client
        .status()
        .await
        .with_context(|| format!("status of {}", args.host))?;
    // Each target table's rows, counted here (a scan): the status RPC, which tools
    // poll, does not count them.
    let mut target_rows = std::collections::BTreeMap::new();
    for i in s.replication.iter().flat_map(|r| &r.inbound) {
        for t in &i.targets {
            target_rows.insert(t.into.clone(), count_rows(&mut client, &t.into).await);
        }
    }
    match args.format {
        Format::Json => {
            let mut json = hawser_node::status_json(&s);
            hawser_node::cluster::add_removal_json(&mut json, &s);
            let inbound = json
                .pointer_mut("/replication/inbound")
                .and_then(|v| v.as_array_mut());
            for t in inbound
                .into_iter()
                .flatten()
                .filter_map(|i| i.get_mut("targets").and_then(|t| t.as_array_mut()))
                .flatten()
            {
                let into = t["into"].as_str().unwrap_or_default().to_string();
                if let Some(rows) = target_rows.get(&into) {
                    t["rows"] = serde_json::json!(rows);
                }
            }
            println!("{json}");
        }
        Format::Table => {
            println!("node        {} (id {})", s.name, s.node_id);
            println!("version     {}", s.version);
            println!("gRPC        {}", s.listen);
            println!("HTTP        {}", s.http);
            println!("data        {}", s.data_dir);
            println!(
                "uptime      {}",
                humantime::format_duration(std::time::Duration::from_secs(s.uptime_ms / 1000))
            );
            println!(
                "cpu         {:.1} s (user + system, since start)",
                s.cpu_micros as f64 / 1e6
            );
            if s.cpu_class == "idle" {
                println!("cpu class   idle (SCHED_IDLE: runs on CPU time its cgroup's other threads leave)");
            }
            println!(
                "durable     {}",
                if s.durable_commits {
                    "yes (commits wait for flush)"
                } else {
                    "no"
                }
            );
            let replication = s.replication.clone().unwrap_or_default();
            if let Some(reason) = &replication.writes_paused {
                println!("writes      PAUSED: {reason}");
            }
            if let Some(d) = &replication.disk {
                let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
                if d.full {
                    println!(
                        "disk        FULL: {:.1} MiB free, below the {:.1} MiB kept free: \
                         writes and applies refused until there is room",
                        mib(d.free_bytes),
                        mib(d.min_free_bytes)
                    );
                } else {
                    println!(
                        "disk        {:.1} MiB free ({:.1} MiB kept free)",
                        mib(d.free_bytes),
                        mib(d.min_free_bytes)
                    );
                }
            }
            match &replication.log {
                Some(l) => println!(
                    "log         last LSN {}, held from LSN {} ({:.1} MiB)",
                    s.last_lsn,
                    l.start_lsn,
                    l.retained_bytes as f64 / (1024.0 * 1024.0)
                ),
                None => println!("log         last LSN {}", s.last_lsn),
            }
            println!(
                "commits     {} in {} flushes, {} rows written",
                s.commits, s.flushes, s.rows_written
            );
            println!("sessions    {}", s.sessions);
            let tables: Vec<&str> = s.tables.iter().map(|t| t.name.as_str()).collect();
            println!(
                "tables      {}",
                if tables.is_empty() {
                    "-".into()
                } else {
                    tables.join(", ")
                }
            );
            println!(
                "sequences   {}",
                if s.sequences.is_empty() {
                    "-".into()
                } else {
                    s.sequences.join(", ")
                }
            );
            if let Some(c) = &s.cluster {
                print_cluster(c);
            }
            print_replication(&replication, &target_rows);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How long a stream must have been held for another stream's transaction before
/// `hawser status` shows it.
const HELD_SHOWN_MS: u64 = 1000;

/// An outbound stream's REASON column: why it is not streaming, or, once it has lasted
/// (streams to one receiver take turns within milliseconds), the other stream's
/// transaction it has stopped for.
fn outbound_reason(o: &v1::OutboundStream) -> String {
    if let Some(reason) = &o.reason {
        return reason.clone();
    }
    match o.held.as_ref().filter(|h| h.millis >= HELD_SHOWN_MS) {
        Some(h) => format!(
            "held {:.1} s at {}: waits for {}",
            h.millis as f64 / 1000.0,
            h.gtid,
            h.waits_for
        ),
        None => "-".into(),
    }
}

/// The streams and return services.
/// The replication part of the table output; `target_rows` the rows of each target
/// table (`None`: not counted).
fn print_replication(
    r: &v1::ReplicationStatus,
    target_rows: &std::collections::BTreeMap<String, Option<u64>>,
) {
    for (i, p) in r.problems.iter().enumerate() {
        if i == 0 {
            println!();
        }
        println!("PROBLEM     {p}");
    }
    if !r.outbound.is_empty() {
        println!();
        println!(
            "{:<20} {:<12} {:<10} {:<8} {:>8} {:>9} {:>9} {:>8} {:>12} {:>12}  REASON",
            "OUTBOUND SCHEME",
            "TO",
            "STATE",
            "COMPRESS",
            "TXNS",
            "LAG RECS",
            "LAG MS",
            "ACK MS",
            "RAW BYTES",
            "WIRE BYTES"
        );
    }
    for o in &r.outbound {
        // The smoothed ack round trip; none before the first ack.
        let ack_ms = if o.ack_micros_mean > 0 {
            format!("{:.2}", o.ack_micros_mean as f64 / 1000.0)
        } else {
            "-".into()
        };
        println!(
            "{:<20} {:<12} {:<10} {:<8} {:>8} {:>9} {:>9} {:>8} {:>12} {:>12}  {}",
            o.scheme,
            o.receiver,
            hawser_node::stream_state_name(o.state()),
            o.compression,
            o.transactions,
            o.lag_records,
            o.lag_micros / 1000,
            ack_ms,
            o.raw_bytes,
            o.wire_bytes,
            outbound_reason(o),
        );
    }
    if !r.inbound.is_empty() {
        println!();
        println!(
            "{:<20} {:<10} {:>8} {:>12} {:>12}  REFUSED",
            "INBOUND FROM", "CONNECTED", "TXNS", "ROW CHANGES", "ROWS WRITTEN"
        );
        for i in &r.inbound {
            println!(
                "{:<20} {:<10} {:>8} {:>12} {:>12}  {}",
                i.sender,
                i.connected,
                i.transactions,
                i.row_changes,
                i.rows_written,
                i.refused.as_deref().unwrap_or("-"),
            );
        }
    }
    let targets: Vec<_> = r
        .inbound
        .iter()
        .flat_map(|i| i.targets.iter().map(move |t| (&i.sender, t)))
        .collect();
    if !targets.is_empty() {
        println!();
        println!(
            "{:<24} {:<18} {:<24} {:<12} {:>10}",
            "TARGET TABLE", "TYPE", "OF TABLE", "FROM", "ROWS"
        );
        for (sender, t) in targets {
            println!(
                "{:<24} {:<18} {:<24} {:<12} {:>10}",
                t.into,
                t.kind,
                t.table,
                sender,
                target_rows
                    .get(&t.into)
                    .copied()
                    .flatten()
                    .map_or("?".to_string(), |n: u64| n.to_string()),
            );
        }
    }
    let Some(ret) = &r.returns else {
        return;
    };
    if !ret.subscribers.is_empty() {
        println!();
        let wait = if ret.return_wait == 0.0 || ret.return_wait == -1.0 {
            format!("{}", ret.return_wait as i64)
        } else {
            format!("{}", ret.return_wait)
        };
        println!(
            "returns     {} waiting, {} acknowledged, {} timed out (TT8170), {} released \
             without a disabled subscriber; RETURN WAIT TIME {wait}s",
            ret.waiting, ret.acknowledged, ret.timed_out, ret.released_disabled,
        );
        for s in &ret.subscribers {
            println!(
                "            {} {}: {}, {} timeouts in a row, acknowledged through seq {}",
                s.subscriber,
                s.level,
                if s.disabled { "DISABLED" } else { "enabled" },
                s.timeouts,
                s.commit_seq,
            );
        }
    }
}

fn print_cluster(c: &hawser_client::ClusterStatus) {
    println!();
    if let Some(r) = &c.removed {
        println!("cluster     REMOVED: {}", r.message);
        println!("            (what follows is the cluster as this node last knew it)");
        println!();
    }
    if !c.initialized {
        println!(
            "cluster     not initialized (run `hawser init` on one node, or start with --join)"
        );
        return;
    }
    let leader = if c.leader_id == 0 {
        "none known".to_string()
    } else {
        format!("{} at {}", c.leader_id, c.leader_addr)
    };
    println!("raft        {} in term {}, leader {leader}", c.role, c.term);
    println!(
        "raft log    last {} applied {} snapshot {} purged {} (state version {})",
        c.last_log_index, c.last_applied, c.snapshot_index, c.purged_index, c.state_version
    );
    println!();
    println!(
        "{:<20} {:<12} {:<22} {:<8} {:<10} {:<12} {:>5}",
        "NODE", "STORE", "GRPC", "MEMBER", "ROLE", "HEALTH", "LAG"
    );
    for n in &c.nodes {
        let health = if n.millis_since_report >= 0 && n.health != "ok" {
            format!("{} {}ms", n.health, n.millis_since_report)
        } else {
            n.health.clone()
        };
        println!(
            "{:<20} {:<12} {:<22} {:<8} {:<10} {:<12} {:>5}",
            n.id,
            n.store,
            n.grpc_addr,
            n.membership,
            n.role,
            health,
            if n.lag_entries < 0 {
                "-".to_string()
            } else {
                n.lag_entries.to_string()
            }
        );
    }
    if let Some(f) = c.failover.as_ref().filter(|f| f.paused) {
        let reason = if f.paused_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", f.paused_reason)
        };
        println!("failover    PAUSED for the cluster{reason} (hawser failover resume)");
    }
    for b in &c.blocked_failovers {
        println!("failover    blocked: {b}");
    }
    if c.schemes.is_empty() {
        println!();
        println!("schemes     -");
        return;
    }
    println!();
    println!(
        "{:<20} {:<12} {:<10} {:<11} {:<12} {:>5}  SUBSCRIBERS",
        "SCHEME", "ELEMENT", "KIND", "ROLE", "MASTER", "EPOCH"
    );
    for s in &c.schemes {
        for e in &s.elements {
            println!(
                "{:<20} {:<12} {:<10} {:<11} {:<12} {:>5}  {}",
                s.name,
                e.name,
                e.kind,
                e.owner_role,
                e.master_store,
                e.epoch,
                e.subscribers.join(", ")
            );
        }
        if !s.return_services_disabled.is_empty() {
            println!(
                "{:<20} return service disabled: {}",
                "",
                s.return_services_disabled.join(", ")
            );
        }
        if !s.receivers.is_empty() {
            println!("{:<20} receivers: {}", "", s.receivers.join(", "));
        }
    }
}

/// The rows of `table`, or `None` when the count fails (shown as `?`).
async fn count_rows(client: &mut hawser_client::Client, table: &str) -> Option<u64> {
    let out = client
        .execute(&format!("SELECT COUNT(*) FROM {table}"))
        .await
        .ok()?;
    if out.error.is_some() {
        return None;
    }
    match out.results.first()?.rows.first()?.first()? {
        hawser_core::Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::outbound_reason;
    use hawser_proto::v1;

    #[test]
    fn a_stream_held_for_a_second_or_more_says_what_it_waits_for() {
        let held = |ms: u64| v1::OutboundStream {
            held: Some(v1::StreamHold {
                gtid: "1:57".into(),
                millis: ms,
                waits_for: "ds3 to get ds1's transaction 1:57 from ds2".into(),
            }),
            ..Default::default()
        };
        assert_eq!(outbound_reason(&held(40)), "-");
        assert_eq!(
            outbound_reason(&held(3200)),
            "held 3.2 s at 1:57: waits for ds3 to get ds1's transaction 1:57 from ds2"
        );
        // Why it is not streaming comes first.
        let mut down = held(3200);
        down.reason = Some("connection refused".into());
        assert_eq!(outbound_reason(&down), "connection refused");
        assert_eq!(outbound_reason(&v1::OutboundStream::default()), "-");
    }
}
