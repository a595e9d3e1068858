//! The load: what every client does and when ([`Workload`]), the client loop that
//! upserts, commits and records, following the master with `--follow-master`, and
//! what one client measured ([`ClientRun`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hawser_client::cluster::{classify, Retry};
use hawser_client::{Client, ClientError, ClusterClient, RowOp, WriteOutcome, Writer};
use hawser_core::Value;
use hdrhistogram::Histogram;
use rand::distributions::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::output::error_text;

/// A gap of a Poisson schedule whose mean gap is `mean`: exponentially distributed.
fn poisson_gap(rng: &mut impl Rng, mean: Duration) -> Duration {
    // 1 - u is in (0, 1]: the logarithm is finite and at most 0.
    let u: f64 = rng.gen();
    mean.mul_f64(-(1.0 - u).ln())
}

/// How many commit errors each client remembers to report.
const ERRORS_KEPT_PER_CLIENT: usize = 3;

/// How long a client waits for a fresh connection before declaring the server gone.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// With `--follow-master`: how long a write keeps following the table's master, and
/// how long a client looks for a master it can reach before declaring the cluster gone.
pub(super) const FOLLOW_FOR: Duration = Duration::from_secs(30);
/// With `--follow-master`: the pause between two looks for the master (about one
/// liveness report interval of the nodes).
const FOLLOW_PAUSE: Duration = Duration::from_millis(50);
/// Highest latency the histograms hold exactly (one hour, in µs); higher ones saturate.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// What every client does, and when.
pub(super) struct Workload {
    pub(super) host: String,
    pub(super) table: String,
    pub(super) keys: i64,
    pub(super) value_size: usize,
    /// Rows carry a third column, the row timestamp the store sets (--check-conflicts).
    pub(super) stamped: bool,
    pub(super) start: Instant,
    pub(super) measure_from: Instant,
    pub(super) end: Instant,
    /// With `--rate`: the mean gap between one client's scheduled commits.
    pub(super) mean_gap: Option<Duration>,
    /// With `--log`: every measured commit is kept as a [`LogLine`].
    pub(super) log: bool,
    /// With `--follow-master`: where the table's master is.
    pub(super) follow: Option<Arc<Follow>>,
}

/// What `--follow-master` clients share: the cluster's view of who masters what.
pub(super) struct Follow {
    pub(super) cluster: tokio::sync::Mutex<ClusterClient>,
    /// The master the clients last went to, to say once when it moves.
    pub(super) current: std::sync::Mutex<String>,
}

impl Follow {
    /// A connection to the master of `table` as the cluster names it now, looking again
    /// every [`FOLLOW_PAUSE`] until `until`; the last error if none could be had.
    async fn master(&self, table: &str, until: Instant) -> Result<Client, ClientError> {
        loop {
            let addr = {
                let mut cluster = self.cluster.lock().await;
                let learned = cluster.refresh().await;
                match (cluster.master_of(table), learned) {
                    (Some(addr), _) => Ok(addr.to_string()),
                    (None, Err(e)) => Err(e),
                    (None, Ok(())) => Err(ClientError::Status(tonic::Status::unavailable(
                        format!("the cluster names no master of {table}"),
                    ))),
                }
            };
            let err = match addr {
                Ok(addr) => match Client::connect_with_timeout(&addr, PROBE_TIMEOUT).await {
                    Ok(client) => {
                        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
                        if *current != addr {
                            eprintln!("following the master of {table} to {addr}");
                            *current = addr;
                        }
                        return Ok(client);
                    }
                    Err(e) => e,
                },
                Err(e) => e,
            };
            if Instant::now() + FOLLOW_PAUSE >= until {
                return Err(err);
            }
            tokio::time::sleep(FOLLOW_PAUSE).await;
        }
    }
}

/// Live totals over all clients and phases, for the progress line.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) commits: AtomicU64,
    pub(super) errors: AtomicU64,
}

/// What one client measured.
pub(super) struct ClientRun {
    pub(super) latency_us: Histogram<u64>,
    /// With `--rate`: how late each measured commit was sent after its scheduled time.
    pub(super) schedule_lag_us: Histogram<u64>,
    pub(super) commits: u64,
    pub(super) errors: u64,
    /// With `--follow-master`: writes sent again after a refusal that proved nothing
    /// was committed (warm-up included).
    pub(super) retries: u64,
    pub(super) not_durable: u64,
    /// Measured commits by return-service outcome.
    pub(super) returns: ReturnCounts,
    pub(super) first_errors: Vec<String>,
    /// Why the client concluded the server is gone, if it did.
    pub(super) fatal: Option<String>,
    /// With `--log`: every measured commit, in the order sent.
    pub(super) log: Vec<LogLine>,
}

/// One measured commit as `--log` writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LogLine {
    /// When it was sent, in µs since the run's start.
    pub(super) sent_us: u64,
    pub(super) latency_us: u64,
    /// How late it was sent after its scheduled time (0 without `--rate`).
    pub(super) lag_us: u64,
    pub(super) outcome: LogOutcome,
}

/// How a logged commit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LogOutcome {
    Acknowledged,
    TimedOut,
    Disabled,
    NoReturn,
    Error,
}

impl LogOutcome {
    pub(super) fn of(return_outcome: &str) -> Self {
        match return_outcome {
            "acknowledged" => LogOutcome::Acknowledged,
            "timed_out" => LogOutcome::TimedOut,
            "disabled" => LogOutcome::Disabled,
            _ => LogOutcome::NoReturn,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            LogOutcome::Acknowledged => "acknowledged",
            LogOutcome::TimedOut => "timed_out",
            LogOutcome::Disabled => "disabled",
            LogOutcome::NoReturn => "none",
            LogOutcome::Error => "error",
        }
    }
}

/// Commits by how their return service ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ReturnCounts {
    pub(super) acknowledged: u64,
    pub(super) timed_out: u64,
    pub(super) disabled: u64,
    pub(super) none: u64,
}

impl ReturnCounts {
    fn count(&mut self, outcome: &str) {
        match outcome {
            "acknowledged" => self.acknowledged += 1,
            "timed_out" => self.timed_out += 1,
            "disabled" => self.disabled += 1,
            _ => self.none += 1,
        }
    }

    pub(super) fn add(&mut self, other: &ReturnCounts) {
        self.acknowledged += other.acknowledged;
        self.timed_out += other.timed_out;
        self.disabled += other.disabled;
        self.none += other.none;
    }
}

pub(super) fn new_histogram() -> Histogram<u64> {
    // Both bounds are constants within hdrhistogram's limits (low ≥ 1, high ≥ 2·low,
    // sigfig ≤ 5), so creation cannot fail.
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// One client: upsert a random key, wait for the commit, record, repeat until `end`.
pub(super) async fn client_loop(
    mut client: Client,
    work: Arc<Workload>,
    progress: Arc<Progress>,
    cancel: CancellationToken,
) -> ClientRun {
    let mut rng = StdRng::from_entropy();
    let mut writer: Option<Writer> = None;
    let mut run = ClientRun {
        latency_us: new_histogram(),
        schedule_lag_us: new_histogram(),
        commits: 0,
        errors: 0,
        retries: 0,
        not_durable: 0,
        returns: ReturnCounts::default(),
        first_errors: Vec::new(),
        fatal: None,
        log: Vec::new(),
    };
    // With --rate: when this client's next commit is due, and what waits for it.
    let mut scheduled = work.start;
    let mut sleeper = work.mean_gap.map(|_| crate::schedule::Sleeper::new());
    loop {
        let key = rng.gen_range(0..work.keys);
        let value: String = (&mut rng)
            .sample_iter(&Alphanumeric)
            .take(work.value_size)
            .map(char::from)
            .collect();
        let mut row = vec![Value::Int(key), Value::Text(value)];
        if work.stamped {
            row.push(Value::Null);
        }
        let op = RowOp::Upsert {
            table: work.table.clone(),
            row,
        };
        // The time a commit's latency counts from: when it is sent, or its place in the
        // schedule. Whether it is measured goes by when it is sent: a server that cannot
        // keep up leaves the schedule behind the clock, and its late commits count.
        let (since, sent) = match (work.mean_gap, &mut sleeper) {
            (Some(mean), Some(sleeper)) => {
                scheduled += poisson_gap(&mut rng, mean);
                if scheduled >= work.end {
                    break;
                }
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    () = sleeper.until(scheduled) => {}
                }
                let sent = Instant::now();
                if sent >= work.measure_from {
                    let late = sent.saturating_duration_since(scheduled).as_micros();
                    run.schedule_lag_us
                        .saturating_record(u64::try_from(late).unwrap_or(u64::MAX));
                }
                (scheduled, sent)
            }
            _ => {
                let now = Instant::now();
                (now, now)
            }
        };
        // Each client commits over one write stream (what a continuously writing
        // application uses), opened again after an error closed it. With
        // --follow-master, a write the error proves was not committed goes again to the
        // master the cluster names then.
        let retries = &mut run.retries;
        let commit = async {
            let until = Instant::now() + FOLLOW_FOR;
            loop {
                let result = commit_once(&mut client, &mut writer, op.clone()).await;
                let Some(follow) = &work.follow else {
                    return result;
                };
                match &result {
                    Err(e) if classify(e) != Retry::Never && Instant::now() < until => {}
                    _ => return result,
                }
                *retries += 1;
                writer = None;
                client = follow.master(&work.table, until).await?;
            }
        };
        let result = tokio::select! {
            // Checked first so that a stopped run does not start one more commit.
            biased;
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(work.end) => break,
            result = commit => result,
        };
        let measured = sent >= work.measure_from;
        let latency_us = u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut log = |outcome| {
            if work.log && measured {
                let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                run.log.push(LogLine {
                    sent_us: micros(sent.duration_since(work.start)),
                    latency_us,
                    lag_us: micros(sent.saturating_duration_since(since)),
                    outcome,
                });
            }
        };
        match result {
            Ok(outcome) => {
                log(LogOutcome::of(&outcome.return_outcome));
                progress.commits.fetch_add(1, Ordering::Relaxed);
                if measured {
                    run.latency_us.saturating_record(latency_us.max(1));
                    run.commits += 1;
                    run.not_durable += u64::from(!outcome.durable);
                    run.returns.count(&outcome.return_outcome);
                }
            }
            Err(e) => {
                log(LogOutcome::Error);
                progress.errors.fetch_add(1, Ordering::Relaxed);
                if measured {
                    run.errors += 1;
                }
                if run.first_errors.len() < ERRORS_KEPT_PER_CLIENT {
                    run.first_errors.push(error_text(&e));
                }
                if may_mean_server_gone(&e) {
                    writer = None;
                    let fresh = match &work.follow {
                        Some(follow) => {
                            follow
                                .master(&work.table, Instant::now() + FOLLOW_FOR)
                                .await
                        }
                        None => Client::connect_with_timeout(&work.host, PROBE_TIMEOUT).await,
                    };
                    match fresh {
                        Ok(fresh) => client = fresh,
                        Err(probe) => {
                            run.fatal = Some(error_text(&probe));
                            break;
                        }
                    }
                }
            }
        }
    }
    run
}

/// One write over the client's write stream, opened first if there is none; an error
/// that closed the stream drops it.
async fn commit_once(
    client: &mut Client,
    writer: &mut Option<Writer>,
    op: RowOp,
) -> Result<WriteOutcome, ClientError> {
    if writer.is_none() {
        *writer = Some(client.writer().await?);
    }
    let w = writer.as_mut().expect("opened above");
    let result = w.write(vec![op]).await;
    if matches!(&result, Err(ClientError::SessionClosed)) {
        *writer = None;
    }
    result
}

/// Errors the server itself reports carry a SQLSTATE; one without may be a dead
/// connection or server.
fn may_mean_server_gone(e: &ClientError) -> bool {
    match e {
        ClientError::Status(s) => hawser_client::sqlstate(s).is_none(),
        ClientError::Connect { .. } | ClientError::SessionClosed => true,
        ClientError::BadAddress { .. } | ClientError::BadToken | ClientError::Convert(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_gaps_average_their_mean_and_vary_as_exponential_ones_do() {
        let mut rng = StdRng::seed_from_u64(7);
        let mean = Duration::from_micros(400);
        let gaps: Vec<f64> = (0..100_000)
            .map(|_| poisson_gap(&mut rng, mean).as_secs_f64() * 1e6)
            .collect();
        let avg = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((avg - 400.0).abs() < 8.0, "mean gap {avg} µs");
        // An exponential distribution's median is ln 2 of its mean, and its standard
        // deviation equals the mean.
        let mut sorted = gaps.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        assert!(
            (median - 400.0 * 2f64.ln()).abs() < 10.0,
            "median {median} µs"
        );
        let sd = (gaps.iter().map(|g| (g - avg).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd - 400.0).abs() < 12.0, "standard deviation {sd} µs");
        assert!(gaps.iter().all(|g| g.is_finite() && *g >= 0.0));
    }

    #[test]
    fn only_errors_without_sqlstate_suggest_a_dead_server() {
        let mut status = tonic_status_with_sqlstate("23505");
        assert!(!may_mean_server_gone(&ClientError::Status(status.clone())));
        status.metadata_mut().remove("hawser-sqlstate");
        assert!(may_mean_server_gone(&ClientError::Status(status)));
        assert!(may_mean_server_gone(&ClientError::SessionClosed));
    }

    fn tonic_status_with_sqlstate(code: &str) -> tonic::Status {
        let mut status = tonic::Status::invalid_argument("duplicate key");
        status
            .metadata_mut()
            .insert("hawser-sqlstate", code.parse().unwrap());
        status
    }
}
