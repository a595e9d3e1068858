//! `hawser status`: what a node knows about itself, for people or as JSON.

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
                "durable     {}",
                if s.durable_commits {
                    "yes (commits wait for flush)"
                } else {
                    "no"
                }
            );
            println!("log         last LSN {}", s.last_lsn);
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
        }
    }
    Ok(ExitCode::SUCCESS)
}
