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

use anyhow::Context;
use hawser_client::Client;
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

/// Runs `hawser switchover` (`Admin.Switchover`). Exit status 1 when it cannot be done
/// (with why) or fails.
pub async fn run(args: SwitchoverArgs) -> anyhow::Result<ExitCode> {
    let mut client = Client::connect(&args.host)
        .await
        .with_context(|| format!("connect to {}", args.host))?;
    let done = match client
        .switchover(&args.scheme, &args.to, args.from.as_deref())
        .await
    {
        Ok(d) => d,
        Err(e) => {
            let retry = matches!(&e, hawser_client::ClientError::Status(s) if s.code() == tonic::Code::Unavailable);
            eprintln!(
                "error: {}{}",
                error_text(&e),
                if retry {
                    " (retryable: nothing moved)"
                } else {
                    ""
                }
            );
            return Ok(ExitCode::FAILURE);
        }
    };
    let elements: Vec<(String, u64)> = done
        .elements
        .iter()
        .map(|e| (e.name.clone(), e.epoch))
        .collect();
    match args.format {
        Format::Json => println!(
            "{}",
            json!({
                "scheme": done.scheme,
                "from": done.from,
                "to": done.to,
                "elements": elements.iter().map(|(e, epoch)| json!({"element": e, "epoch": epoch})).collect::<Vec<_>>(),
                "millis": done.millis,
            })
        ),
        Format::Table => println!(
            "switched over: {} from {} to {} ({}) in {} ms — writes to them paused for at \
             most that long",
            elements
                .iter()
                .map(|(e, _)| e.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            done.from,
            done.to,
            elements
                .iter()
                .map(|(e, epoch)| format!("{e} epoch {epoch}"))
                .collect::<Vec<_>>()
                .join(", "),
            done.millis
        ),
    }
    Ok(ExitCode::SUCCESS)
}
