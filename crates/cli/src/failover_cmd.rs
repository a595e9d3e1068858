//! `hawser failover`: pause, resume and show automatic failover for the whole cluster
//! (Patroni's `pause` / `resume`). The pause is part of the Raft state, so it holds
//! whichever node leads, across restarts and leader changes, until resumed.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use hawser_client::Client;
use hawser_proto::v1;

use crate::output::Format;

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  hawser failover pause --reason 'kernel upgrade on ds1'   # masters stay put while nodes restart
  hawser failover show --format json
  hawser failover resume")]
pub struct FailoverArgs {
    #[command(subcommand)]
    command: FailoverCommand,
}

#[derive(Subcommand, Debug)]
enum FailoverCommand {
    /// Stop promoting subscribers of silent masters, cluster-wide. A master silent past
    /// the failover timeout is then listed under `blocked` in `hawser status`, with the
    /// reason given here; switchover and ALTER REPLICATION ... SET MASTER still work.
    Pause {
        #[command(flatten)]
        target: Target,
        /// Why, shown in status and in each blocked failover.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Fail silent masters over automatically again (the default). A master that went
    /// silent while paused is failed over at the leader's next decision.
    Resume {
        #[command(flatten)]
        target: Target,
    },
    /// Whether failover is automatic, and the timing the addressed node applies while it
    /// is the Raft leader.
    Show {
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Args, Debug)]
struct Target {
    /// Any member of the cluster; a change goes through the Raft leader.
    #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
    host: String,
    /// Output: lines for a person, or one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Runs `hawser failover`.
pub async fn run(args: FailoverArgs) -> anyhow::Result<ExitCode> {
    let (target, change) = match args.command {
        FailoverCommand::Pause { target, reason } => (target, Some((true, reason))),
        FailoverCommand::Resume { target } => (target, Some((false, String::new()))),
        FailoverCommand::Show { target } => (target, None),
    };
    let mut client = Client::connect(&target.host)
        .await
        .with_context(|| format!("connect to {}", target.host))?;
    let status = match change {
        Some((paused, reason)) => {
            client
                .set_failover(paused, &reason)
                .await
                .context(if paused {
                    "pause failover"
                } else {
                    "resume failover"
                })?
        }
        None => client
            .status()
            .await
            .context("read the node's status")?
            .cluster
            .and_then(|c| c.failover)
            .context("this node is not in a cluster (or predates failover settings)")?,
    };
    match target.format {
        Format::Json => println!("{}", hawser_node::failover_json(&status)),
        Format::Table => print!("{}", text(&status)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The setting in lines for a person.
fn text(f: &v1::FailoverStatus) -> String {
    let mode = if f.paused {
        let since = chrono::DateTime::from_timestamp_millis(f.paused_since_unix_ms as i64)
            .map(|t| t.format(" since %Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_default();
        let reason = if f.paused_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", f.paused_reason)
        };
        format!("PAUSED{since}{reason} (resume with `hawser failover resume`)")
    } else {
        "automatic".to_string()
    };
    let here = if f.automatic_here {
        String::new()
    } else {
        " — this node was started with auto_failover off and promotes no one while it leads"
            .to_string()
    };
    format!(
        "failover    {mode}\n\
         timing      a master silent {} ms is failed over; lease {} ms, reports every {} ms{here}\n",
        f.failover_timeout_ms, f.master_lease_ms, f.report_interval_ms
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_reads_with_its_reason_time_and_the_way_out() {
        let f = v1::FailoverStatus {
            paused: true,
            paused_reason: "kernel upgrade".into(),
            paused_since_unix_ms: 1_780_000_000_000,
            automatic_here: true,
            failover_timeout_ms: 1000,
            master_lease_ms: 500,
            report_interval_ms: 100,
        };
        let t = text(&f);
        assert!(t.contains("PAUSED since 2026-"), "{t}");
        assert!(t.contains(": kernel upgrade"), "{t}");
        assert!(t.contains("hawser failover resume"), "{t}");
        assert!(t.contains("silent 1000 ms"), "{t}");
        let auto = text(&v1::FailoverStatus {
            paused: false,
            automatic_here: false,
            ..f
        });
        assert!(auto.starts_with("failover    automatic\n"), "{auto}");
        assert!(auto.contains("auto_failover off"), "{auto}");
    }
}
