//! `hawser status`: what a node knows about itself and the cluster, for people or as
//! JSON (fields in docs/status.md).

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

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
    match args.format {
        Format::Json => println!("{}", hawser_node::status_json(&s)),
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
            let paused = serde_json::from_str::<serde_json::Value>(&s.replication_json)
                .ok()
                .and_then(|r| r.get("writes_paused")?.as_str().map(str::to_string));
            if let Some(reason) = paused {
                println!("writes      PAUSED: {reason}");
            }
            let disk = serde_json::from_str::<serde_json::Value>(&s.replication_json)
                .ok()
                .and_then(|r| {
                    let d = r.get("disk")?;
                    Some((
                        d["free_bytes"].as_u64()?,
                        d["min_free_bytes"].as_u64()?,
                        d["full"].as_bool()?,
                    ))
                });
            if let Some((free, min, full)) = disk {
                let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
                if full {
                    println!(
                        "disk        FULL: {:.1} MiB free, below the {:.1} MiB kept free: \
                         writes and applies refused until there is room",
                        mib(free),
                        mib(min)
                    );
                } else {
                    println!(
                        "disk        {:.1} MiB free ({:.1} MiB kept free)",
                        mib(free),
                        mib(min)
                    );
                }
            }
            let log = serde_json::from_str::<serde_json::Value>(&s.replication_json)
                .ok()
                .and_then(|r| {
                    let l = r.get("log")?;
                    Some((l["start_lsn"].as_u64()?, l["retained_bytes"].as_u64()?))
                });
            match log {
                Some((start, bytes)) => println!(
                    "log         last LSN {}, held from LSN {start} ({:.1} MiB)",
                    s.last_lsn,
                    bytes as f64 / (1024.0 * 1024.0)
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
            if let Ok(r) = serde_json::from_str::<serde_json::Value>(&s.replication_json) {
                print_replication(&r);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Text of a JSON field (numbers and strings as they are, null as `-`).
fn field(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".into(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// How long a stream must have been held for another stream's transaction before
/// `hawser status` shows it.
const HELD_SHOWN_MS: u64 = 1000;

/// An outbound stream's REASON column: why it is not streaming, or, once it has lasted
/// (streams to one receiver take turns within milliseconds), the other stream's
/// transaction it has stopped for.
fn outbound_reason(o: &serde_json::Value) -> String {
    let held = o["held"]["millis"]
        .as_u64()
        .filter(|&ms| ms >= HELD_SHOWN_MS)
        .map(|ms| {
            format!(
                "held {:.1} s at {}: waits for {}",
                ms as f64 / 1000.0,
                field(&o["held"]["gtid"]),
                field(&o["held"]["waits_for"])
            )
        });
    match (&o["reason"], held) {
        (serde_json::Value::Null, Some(h)) => h,
        (r, _) => field(r),
    }
}

/// The streams and return services from the node's replication JSON.
fn print_replication(r: &serde_json::Value) {
    let empty = Vec::new();
    let problems = r["problems"].as_array().unwrap_or(&empty);
    for (i, p) in problems.iter().enumerate() {
        if i == 0 {
            println!();
        }
        println!("PROBLEM     {}", field(p));
    }
    let outbound = r["outbound"].as_array().unwrap_or(&empty);
    let inbound = r["inbound"].as_array().unwrap_or(&empty);
    if outbound.is_empty() && inbound.is_empty() {
        return;
    }
    if !outbound.is_empty() {
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
    for o in outbound {
        let lag_ms = o["lag_micros"].as_u64().map(|us| (us / 1000).to_string());
        let reason = outbound_reason(o);
        // The smoothed ack round trip; none before the first ack.
        let ack_ms = o["ack_micros_mean"]
            .as_u64()
            .filter(|&us| us > 0)
            .map(|us| format!("{:.2}", us as f64 / 1000.0));
        println!(
            "{:<20} {:<12} {:<10} {:<8} {:>8} {:>9} {:>9} {:>8} {:>12} {:>12}  {}",
            field(&o["scheme"]),
            field(&o["receiver"]),
            field(&o["state"]),
            field(&o["compression"]),
            field(&o["transactions"]),
            field(&o["lag_records"]),
            lag_ms.unwrap_or_else(|| "-".into()),
            ack_ms.unwrap_or_else(|| "-".into()),
            field(&o["raw_bytes"]),
            field(&o["wire_bytes"]),
            reason,
        );
    }
    if !inbound.is_empty() {
        println!();
        println!(
            "{:<20} {:<10} {:>8} {:>12} {:>12}  REFUSED",
            "INBOUND FROM", "CONNECTED", "TXNS", "ROW CHANGES", "ROWS WRITTEN"
        );
        for i in inbound {
            println!(
                "{:<20} {:<10} {:>8} {:>12} {:>12}  {}",
                field(&i["sender"]),
                field(&i["connected"]),
                field(&i["transactions"]),
                field(&i["row_changes"]),
                field(&i["rows_written"]),
                field(&i["refused"]),
            );
        }
    }
    let ret = &r["returns"];
    let subs = ret["subscribers"].as_array().unwrap_or(&empty);
    if !subs.is_empty() {
        println!();
        println!(
            "returns     {} waiting, {} acknowledged, {} timed out (TT8170), {} released \
             without a disabled subscriber; RETURN WAIT TIME {}s",
            field(&ret["waiting"]),
            field(&ret["acknowledged"]),
            field(&ret["timed_out"]),
            field(&ret["released_disabled"]),
            field(&ret["return_wait"]),
        );
        for s in subs {
            println!(
                "            {} {}: {}, {} timeouts in a row, acknowledged through seq {}",
                field(&s["subscriber"]),
                field(&s["level"]),
                if s["disabled"] == true {
                    "DISABLED"
                } else {
                    "enabled"
                },
                field(&s["timeouts"]),
                field(&s["commit_seq"]),
            );
        }
    }
}

fn print_cluster(c: &hawser_client::ClusterStatus) {
    println!();
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

#[cfg(test)]
mod tests {
    use super::outbound_reason;
    use serde_json::json;

    #[test]
    fn a_stream_held_for_a_second_or_more_says_what_it_waits_for() {
        let held = |ms: u64| {
            json!({"reason": null, "held": {"gtid": "1:57", "millis": ms,
                "waits_for": "ds3 to get ds1's transaction 1:57 from ds2"}})
        };
        assert_eq!(outbound_reason(&held(40)), "-");
        assert_eq!(
            outbound_reason(&held(3200)),
            "held 3.2 s at 1:57: waits for ds3 to get ds1's transaction 1:57 from ds2"
        );
        // Why it is not streaming comes first.
        let mut down = held(3200);
        down["reason"] = json!("connection refused");
        assert_eq!(outbound_reason(&down), "connection refused");
        assert_eq!(outbound_reason(&json!({"reason": null, "held": null})), "-");
    }
}
