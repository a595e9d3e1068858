//! `hawser wait` and the replication set-up of `hawser bench --mode`.
//!
//! `hawser wait` is TimesTen's `ttRepAdmin -wait` / `ttRepSubscriberWait`: it blocks
//! until everything the node committed before the call has been acknowledged as
//! durably committed by its subscribers (all, or one scheme's, or one store), and
//! exits 0 — or 1 when they did not catch up within `--timeout`. It runs
//! `CALL ttRepSubscriberWait(...)` on the node, so SQL clients have the same thing.
//!
//! `hawser bench --mode async|receipt|twosafe` creates (replacing its previous one) a
//! scheme with one DATASTORE element that includes only the bench table: the node is
//! its master, `--subscriber` stores get the mode's return service and
//! `--async-subscriber` stores none. A DATASTORE element replicates the bench table's
//! CREATE TABLE too, so the subscribers need nothing prepared.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hawser_client::Client;
use hawser_core::Value;

use crate::output::{connect_error_text, error_text};

/// Arguments of `hawser wait`.
#[derive(clap::Args, Debug)]
pub struct WaitArgs {
    /// The master (or propagator) whose subscribers to wait for.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "HAWSER_HOST",
        default_value = "127.0.0.1:7420"
    )]
    pub host: String,
    /// Only the subscribers of this replication scheme.
    #[arg(long, value_name = "NAME")]
    pub scheme: Option<String>,
    /// Only this subscriber store.
    #[arg(long, value_name = "STORE")]
    pub subscriber: Option<String>,
    /// Give up after this long (`30s`, `2m`; `forever` waits until caught up).
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub timeout: String,
}

/// How long to wait, as `ttRepSubscriberWait`'s `waitTime` (seconds, -1 = forever).
fn wait_seconds(timeout: &str) -> anyhow::Result<i64> {
    if timeout.trim().eq_ignore_ascii_case("forever") {
        return Ok(-1);
    }
    let d = humantime::parse_duration(timeout.trim())
        .or_else(|_| timeout.trim().parse::<u64>().map(Duration::from_secs))
        .map_err(|_| {
            anyhow::anyhow!("--timeout {timeout:?}: give a duration such as 30s or 2m, or forever")
        })?;
    // ttRepSubscriberWait counts whole seconds; round up so a short wait still waits.
    Ok(i64::try_from(d.as_millis().div_ceil(1000)).unwrap_or(i64::MAX))
}

/// A SQL string literal (or NULL).
fn literal(s: Option<&str>) -> String {
    s.map_or("NULL".into(), |s| format!("'{}'", s.replace('\'', "''")))
}

/// Runs `ttRepSubscriberWait` on `client`: `Ok(true)` when the subscribers caught up.
pub async fn subscriber_wait(
    client: &mut Client,
    scheme: Option<&str>,
    subscriber: Option<&str>,
    seconds: i64,
) -> anyhow::Result<bool> {
    let sql = format!(
        "CALL ttRepSubscriberWait({}, NULL, {}, NULL, {seconds})",
        literal(scheme),
        literal(subscriber)
    );
    let outcome = client
        .execute(&sql)
        .await
        .map_err(|e| anyhow::anyhow!("{}", error_text(&e)))?;
    if let Some(e) = outcome.error {
        bail!("error[{}]: {}", e.code, e.message);
    }
    let row = outcome
        .results
        .first()
        .and_then(|r| r.rows.first())
        .context("ttRepSubscriberWait returned no row")?;
    match row.first() {
        Some(Value::Bytes(b)) if b.as_slice() == [0] => Ok(true),
        Some(Value::Bytes(b)) if b.as_slice() == [1] => Ok(false),
        other => bail!("ttRepSubscriberWait returned {other:?}"),
    }
}

/// Runs `hawser wait`.
pub async fn run(args: WaitArgs) -> anyhow::Result<ExitCode> {
    let seconds = wait_seconds(&args.timeout)?;
    // The call lasts as long as the wait: its deadline must be longer.
    let deadline = match u64::try_from(seconds) {
        Ok(s) => Duration::from_secs(s + 30),
        Err(_) => Duration::from_secs(30 * 24 * 3600),
    };
    let mut client = match Client::connect_with_timeout(&args.host, deadline).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {}", connect_error_text(&args.host, &e));
            return Ok(ExitCode::FAILURE);
        }
    };
    let started = Instant::now();
    let who = match (&args.subscriber, &args.scheme) {
        (Some(s), Some(sc)) => format!("subscriber {s} of scheme {sc}"),
        (Some(s), None) => format!("subscriber {s}"),
        (None, Some(sc)) => format!("the subscribers of scheme {sc}"),
        (None, None) => "every subscriber".into(),
    };
    match subscriber_wait(
        &mut client,
        args.scheme.as_deref(),
        args.subscriber.as_deref(),
        seconds,
    )
    .await
    {
        Ok(true) => {
            println!(
                "caught up: {who} acknowledged everything committed before the call ({:.1}s)",
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(false) => {
            println!(
                "not caught up: {who} did not acknowledge within {}",
                args.timeout
            );
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The return service `hawser bench --mode` puts on its subscribers.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchMode {
    /// No return service: commits do not wait for subscribers.
    Async,
    /// RETURN RECEIPT: commits wait for the subscribers' durable receipt.
    Receipt,
    /// RETURN TWOSAFE: commits wait until the subscribers have committed.
    Twosafe,
}

impl BenchMode {
    pub fn name(self) -> &'static str {
        match self {
            BenchMode::Async => "async",
            BenchMode::Receipt => "receipt",
            BenchMode::Twosafe => "twosafe",
        }
    }

    fn clause(self) -> &'static str {
        match self {
            BenchMode::Async => "",
            BenchMode::Receipt => " RETURN RECEIPT",
            BenchMode::Twosafe => " RETURN TWOSAFE",
        }
    }
}

/// The scheme `hawser bench --mode` creates.
pub struct BenchScheme<'a> {
    pub name: &'a str,
    pub master: &'a str,
    pub table: &'a str,
    pub mode: BenchMode,
    pub subscribers: &'a [String],
    pub async_subscribers: &'a [String],
    pub compress: bool,
    /// `AS target` for every subscriber: a TABLE element instead of a DATASTORE one.
    pub target: Option<&'a str>,
    /// A second TABLE element mastered by the first subscriber, back to the master.
    pub bidirectional: bool,
    /// CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts on the TABLE elements.
    pub check_conflicts: bool,
}

impl BenchScheme<'_> {
    /// The CREATE REPLICATION statement.
    pub fn ddl(&self) -> String {
        let table_element = self.target.is_some() || self.bidirectional || self.check_conflicts;
        let check = if self.check_conflicts {
            " CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts"
        } else {
            ""
        };
        let mut s = if table_element {
            format!(
                "CREATE REPLICATION {} ELEMENT bench_e TABLE {}{check} MASTER {}",
                self.name, self.table, self.master
            )
        } else {
            format!(
                "CREATE REPLICATION {} ELEMENT bench_e DATASTORE MASTER {}",
                self.name, self.master
            )
        };
        let target = self.target.map(|t| format!(" AS {t}")).unwrap_or_default();
        if !self.subscribers.is_empty() {
            s.push_str(&format!(
                " SUBSCRIBER {}{}{target}",
                self.subscribers.join(", "),
                self.mode.clause()
            ));
        }
        if !self.async_subscribers.is_empty() {
            s.push_str(&format!(
                " SUBSCRIBER {}{target}",
                self.async_subscribers.join(", ")
            ));
        }
        if !table_element {
            s.push_str(&format!(" INCLUDE TABLE {}", self.table));
        }
        let back = self.subscribers.iter().chain(self.async_subscribers).next();
        if let Some(back) = back.filter(|_| self.bidirectional) {
            s.push_str(&format!(
                " ELEMENT bench_back TABLE {}{check} MASTER {back} SUBSCRIBER {}",
                self.table, self.master
            ));
        }
        if self.compress {
            s.push_str(&format!(" STORE {} COMPRESS TRAFFIC ON", self.master));
        }
        s
    }

    /// Replaces the scheme of this name with this one, then waits (bounded) until its
    /// subscribers have everything the master committed, so the run starts in steady
    /// state.
    pub async fn install(&self, client: &mut Client) -> anyhow::Result<()> {
        let drop = format!("DROP REPLICATION {}", self.name);
        let outcome = client
            .execute(&drop)
            .await
            .map_err(|e| anyhow::anyhow!("{}", error_text(&e)))?;
        if let Some(e) = outcome.error {
            if !e.message.contains("does not exist") {
                bail!("{drop}: error[{}]: {}", e.code, e.message);
            }
        }
        let ddl = self.ddl();
        let outcome = client
            .execute(&ddl)
            .await
            .map_err(|e| anyhow::anyhow!("{}", error_text(&e)))?;
        if let Some(e) = outcome.error {
            bail!("{ddl}\nerror[{}]: {}", e.code, e.message);
        }
        // The senders start when the node's data plane sees the new scheme; until
        // then ttRepSubscriberWait names no subscriber.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match subscriber_wait(client, Some(self.name), None, 20).await {
                Ok(true) => return Ok(()),
                Ok(false) => bail!(
                    "the subscribers of {} did not catch up within 20 s; see `curl \
                     <master http>/replication`",
                    self.name
                ),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "streams not up yet");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.context("the scheme's streams did not start")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_read_as_seconds_rounded_up_or_forever() {
        assert_eq!(wait_seconds("30s").unwrap(), 30);
        assert_eq!(wait_seconds("1500ms").unwrap(), 2);
        assert_eq!(wait_seconds("2m").unwrap(), 120);
        assert_eq!(wait_seconds("7").unwrap(), 7);
        assert_eq!(wait_seconds("forever").unwrap(), -1);
        assert!(wait_seconds("soon").is_err());
    }

    #[test]
    fn bench_schemes_read_as_timesten_ddl() {
        let subs = vec!["ds2".to_string()];
        let asyncs = vec!["ds3".to_string(), "ds4".to_string()];
        let s = BenchScheme {
            name: "bench_repl",
            master: "ds1",
            table: "bench",
            mode: BenchMode::Twosafe,
            subscribers: &subs,
            async_subscribers: &asyncs,
            compress: true,
            target: None,
            bidirectional: false,
            check_conflicts: false,
        };
        assert_eq!(
            s.ddl(),
            "CREATE REPLICATION bench_repl ELEMENT bench_e DATASTORE MASTER ds1 \
             SUBSCRIBER ds2 RETURN TWOSAFE SUBSCRIBER ds3, ds4 INCLUDE TABLE bench \
             STORE ds1 COMPRESS TRAFFIC ON"
        );
        let parsed = hawser_scheme::parse(&s.ddl());
        assert!(parsed.is_ok(), "{parsed:?}");
        let s = BenchScheme {
            mode: BenchMode::Async,
            compress: false,
            async_subscribers: &[],
            ..s
        };
        assert_eq!(
            s.ddl(),
            "CREATE REPLICATION bench_repl ELEMENT bench_e DATASTORE MASTER ds1 \
             SUBSCRIBER ds2 INCLUDE TABLE bench"
        );
        let s = BenchScheme {
            target: Some("CCD NONCONDENSED INTO bench_hist"),
            subscribers: &subs,
            ..s
        };
        assert_eq!(
            s.ddl(),
            "CREATE REPLICATION bench_repl ELEMENT bench_e TABLE bench MASTER ds1 \
             SUBSCRIBER ds2 AS CCD NONCONDENSED INTO bench_hist"
        );
        assert!(hawser_scheme::parse(&s.ddl()).is_ok());
        let s = BenchScheme {
            target: None,
            bidirectional: true,
            check_conflicts: true,
            ..s
        };
        assert_eq!(
            s.ddl(),
            "CREATE REPLICATION bench_repl ELEMENT bench_e TABLE bench \
             CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts MASTER ds1 SUBSCRIBER ds2 \
             ELEMENT bench_back TABLE bench CHECK CONFLICTS BY ROW TIMESTAMP COLUMN ts \
             MASTER ds2 SUBSCRIBER ds1"
        );
        assert!(hawser_scheme::parse(&s.ddl()).is_ok());
        assert_eq!(literal(Some("it's")), "'it''s'");
        assert_eq!(literal(None), "NULL");
    }
}
