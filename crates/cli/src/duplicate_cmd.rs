//! `hawser duplicate`: rebuild what a subscriber receives from another store.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use hawser_proto::v1;
use serde_json::json;

use crate::output::{error_text, Format};

/// `hawser duplicate`'s arguments (the help text is on the command in main.rs).
#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  hawser receiver --host ds1:7420 --scheme repscheme \
    --subscriber ds3 --state stop\n  hawser duplicate --host ds3:7420 --scheme repscheme"
)]
pub struct DuplicateArgs {
    /// The subscriber to rebuild (its gRPC address).
    #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
    host: String,
    /// The replication scheme [default: the one scheme the subscriber receives in].
    /// Other schemes into the subscriber stream on during the copy if they bring it
    /// other origins' transactions and other tables; otherwise the duplicate is refused.
    #[arg(long, value_name = "NAME")]
    scheme: Option<String>,
    /// The store to copy from [default: the master of the tables it receives].
    #[arg(long, value_name = "STORE")]
    from: Option<String>,
    /// Keep every row of the subscriber that the copy replaces or removes in its
    /// hawser_lost table first (origin 0, seq the rebuild's number): for a store that
    /// may hold commits no other store has — a deposed master whose log no longer
    /// reaches a failover's fork point — so that nothing is dropped unseen.
    #[arg(long)]
    keep_replaced: bool,
    /// Output: progress and a summary for a person, or JSON lines (one per progress
    /// message, the last with "done": true).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

pub async fn run(args: DuplicateArgs) -> anyhow::Result<ExitCode> {
    let mut client = hawser_client::Client::connect(&args.host)
        .await
        .with_context(|| format!("connect to {}", args.host))?;
    let mut progress = match client
        .duplicate(
            args.scheme.as_deref(),
            args.from.as_deref(),
            args.keep_replaced,
        )
        .await
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: duplicate on {}: {}", args.host, error_text(&e));
            return Ok(ExitCode::FAILURE);
        }
    };
    let show = args.format == Format::Table && std::io::stderr().is_terminal();
    let mut last: Option<v1::DuplicateProgress> = None;
    loop {
        match progress.message().await {
            Ok(Some(p)) => {
                match args.format {
                    Format::Json => println!("{}", progress_json(&p)),
                    Format::Table if show && !p.done => eprint!(
                        "\r\x1b[2Kcopying {} from {}: table {}/{}  rows {}/{}",
                        if p.table.is_empty() { "-" } else { &p.table },
                        p.from,
                        p.tables_done + u32::from(!p.table.is_empty()),
                        p.tables.len(),
                        p.rows,
                        p.rows_estimate
                    ),
                    Format::Table => {}
                }
                last = Some(p);
            }
            Ok(None) => break,
            Err(status) => {
                if show {
                    eprint!("\r\x1b[2K");
                }
                eprintln!("error: duplicate on {}: {}", args.host, status.message());
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    if show {
        eprint!("\r\x1b[2K");
    }
    let Some(p) = last.filter(|p| p.done) else {
        eprintln!(
            "error: duplicate on {}: the node ended without finishing",
            args.host
        );
        return Ok(ExitCode::FAILURE);
    };
    if args.format == Format::Table {
        println!(
            "copied {} rows of {} from {}: {} written, {} unchanged, {} deleted; \
             streams resume after its LSN {}",
            p.rows,
            tables(p.tables.len()),
            p.from,
            p.rows_written,
            p.rows_unchanged,
            p.rows_deleted,
            p.copy_lsn
        );
        if args.keep_replaced {
            println!(
                "kept {} of this store's rows the copy replaced or removed in hawser_lost \
                 (origin 0, seq {})",
                p.rows_kept, p.rebuild
            );
        }
        if !p.sequences.is_empty() {
            println!(
                "set {} at least as far ahead as {}'s",
                count(p.sequences.len(), "sequence"),
                p.from
            );
        }
        let created: Vec<String> = [
            (p.tables_created, "table"),
            (p.sequences_created, "sequence"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| count(n as usize, what))
        .collect();
        if !created.is_empty() {
            println!("created {} as {} has them", created.join(" and "), p.from);
        }
        let marks: Vec<String> = p.marks.iter().map(|(s, q)| format!("{s} {q}")).collect();
        println!("marks: {}", marks.join(", "));
        println!("receiver state START");
    }
    Ok(ExitCode::SUCCESS)
}

fn tables(n: usize) -> String {
    count(n, "table")
}

/// `1 table`, `2 tables`.
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn progress_json(p: &v1::DuplicateProgress) -> serde_json::Value {
    json!({
        "from": p.from,
        "tables": p.tables,
        "table": p.table,
        "tables_done": p.tables_done,
        "rows": p.rows,
        "rows_estimate": p.rows_estimate,
        "rows_written": p.rows_written,
        "rows_unchanged": p.rows_unchanged,
        "rows_deleted": p.rows_deleted,
        "rows_kept": p.rows_kept,
        "rebuild": p.rebuild,
        "tables_created": p.tables_created,
        "sequences": p.sequences,
        "sequences_created": p.sequences_created,
        "copy_lsn": p.copy_lsn,
        "marks": p.marks,
        "done": p.done,
    })
}
