//! [`BenchArgs`], the command line of `hawser bench`, with the parsers of its values
//! and the thread count it resolves.

use std::time::Duration;

use crate::output::Format;

/// Arguments of `hawser bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The node to load.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "HAWSER_HOST",
        default_value = "127.0.0.1:7420"
    )]
    pub host: String,
    /// Concurrent clients, each with its own write stream (the `WriteStream` RPC) and
    /// one commit in flight.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub clients: u32,
    /// How long to measure, after the warm-up (`10s`, `1m`, or plain seconds).
    #[arg(long, value_name = "SECS", default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Length of the random text written per row, in bytes.
    #[arg(long, value_name = "B", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub value_size: u32,
    /// Size of the key space: keys are drawn uniformly from [0, N).
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(i64).range(1..))]
    pub keys: i64,
    /// Table to write, created as `(k BIGINT PRIMARY KEY, v VARCHAR(B))` if missing.
    #[arg(long, value_name = "NAME", default_value = "bench")]
    pub table: String,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Load applied before measuring starts, not counted.
    #[arg(long, value_name = "SECS", default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Replicate the bench table while measuring: create a scheme (replacing the one
    /// named by --scheme) whose subscribers get this return service. async: none;
    /// receipt: RETURN RECEIPT; twosafe: RETURN TWOSAFE. Needs --subscriber or
    /// --async-subscriber. The report adds, per subscriber, the stream's lag sampled
    /// on the master every 250 ms under load, its ack round trip, and how long the
    /// subscribers took to have everything after the load stopped.
    #[arg(long, value_enum, value_name = "MODE")]
    pub mode: Option<crate::wait_cmd::BenchMode>,
    /// A subscriber store that gets --mode's return service (repeat for several).
    #[arg(long = "subscriber", value_name = "STORE")]
    pub subscribers: Vec<String>,
    /// A subscriber store without a return service (repeat for several).
    #[arg(long = "async-subscriber", value_name = "STORE")]
    pub async_subscribers: Vec<String>,
    /// COMPRESS TRAFFIC ON for the master's streams in the scheme --mode creates.
    #[arg(long)]
    pub compress: bool,
    /// The subscribers' target table in the scheme --mode creates, as the scheme's `AS`
    /// clause says it, e.g. "CCD NONCONDENSED INTO bench_hist" or "POINT IN TIME INTO
    /// bench_pit" (docs/targets.md): the scheme then replicates the bench table as a
    /// TABLE element, and each subscriber creates the target table itself.
    #[arg(long, value_name = "TARGET")]
    pub target: Option<String>,
    /// Make the scheme --mode creates bidirectional: a second TABLE element masters the
    /// bench table on the first subscriber and sends it back to this master (the bench
    /// still writes here only). The table must exist on that subscriber too.
    #[arg(long)]
    pub bidirectional: bool,
    /// Check conflicts by row timestamp in the scheme --mode creates (`CHECK CONFLICTS
    /// BY ROW TIMESTAMP COLUMN ts`, UPDATE BY SYSTEM; docs/conflicts.md): the bench table
    /// has a third column `ts BINARY(8)`, which the stores stamp. With --bidirectional,
    /// its cost on the commit path of a two-master pair.
    #[arg(long)]
    pub check_conflicts: bool,
    /// The scheme --mode creates (an existing one of this name is dropped first).
    #[arg(long, value_name = "NAME", default_value = "bench_repl")]
    pub scheme: String,
    /// Before the load, measure how many write+fdatasync calls per second the disk under
    /// DIR sustains (the physical limit of one commit per flush), for comparison. Only
    /// meaningful when DIR is on the node's disk.
    #[arg(long, value_name = "DIR")]
    pub fsync_probe: Option<std::path::PathBuf>,
    /// Threads the load generator runs on. 0 (the default) picks one per 16 clients, at
    /// most one per CPU core: a thread drives many clients as an event loop, and on a
    /// small machine shared with the nodes every extra thread hands replies between
    /// threads, which costs the CPU being measured
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
    /// Commits per second, all clients together, on a schedule (Poisson arrivals, as
    /// pgbench --rate): latency counts from each commit's scheduled time, so two systems
    /// run at the same rate compare at the same load. Without it every client commits
    /// again as soon as its last commit returns.
    #[arg(long, value_name = "PER_SEC", value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Connections the clients share, HTTP/2 carrying one stream per client on each
    /// (as an application sharing one gRPC channel does): fewer sockets and system
    /// calls on both sides. 0 (the default) gives each client its own, as a
    /// PostgreSQL client has.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub connections: u32,
    /// Write one line per measured commit to FILE, as pgbench --log does, to see *when*
    /// the slow ones happened: CSV with a header — client, sent_unix_us (when it was
    /// sent, µs since the Unix epoch), latency_us (as the report counts it), lag_us
    /// (with --rate, how late it was sent after its scheduled time; else 0) and outcome
    /// (acknowledged, timed_out, disabled, none — no return service — or error), in
    /// the order they were sent. Lines are kept in memory (24 bytes each) and written
    /// after the run, so the file's writing does not load the machine being measured.
    #[arg(long, value_name = "FILE")]
    pub log: Option<std::path::PathBuf>,
    /// Write to the table's master, wherever the cluster says it is, and follow it
    /// through failovers and switchovers: a write refused before it committed (not the
    /// master, no master lease, connection refused) is sent again to the new master,
    /// for up to 30 s, its latency counting the wait; the report counts these retries.
    /// A write whose outcome is unknown (connection lost mid-call) counts as an error.
    #[arg(long)]
    pub follow_master: bool,
}

/// A duration as humantime writes it (`500ms`, `10s`, `1m 30s`) or plain seconds (`10`,
/// `2.5`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.trim().parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"));
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))
}

/// A `--rate`: a finite number of commits per second above zero.
fn parse_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        Ok(_) => Err(format!(
            "{s:?} is not a rate: it must be above 0 commits per second"
        )),
        Err(_) => Err(format!("{s:?} is not a number of commits per second")),
    }
}

/// Runs `hawser bench`. Exit status 1 when the server cannot be reached or goes away
/// during the run, or when no commit succeeded.
impl BenchArgs {
    /// The load generator's thread count, `--threads` with 0 resolved.
    pub fn worker_threads(&self) -> usize {
        match self.threads {
            0 => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                auto_threads(self.clients, cores)
            }
            n => n,
        }
    }
}

/// One thread per [`CLIENTS_PER_THREAD`] clients, at least one, at most `cores`.
fn auto_threads(clients: u32, cores: usize) -> usize {
    (clients as usize)
        .div_ceil(CLIENTS_PER_THREAD)
        .clamp(1, cores.max(1))
}

/// Clients one load-generator thread drives when `--threads` is 0: a client costs its
/// thread a few tens of µs of CPU per commit, so one thread keeps 16 clients going well
/// past the rates one node commits.
const CLIENTS_PER_THREAD: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_default_to_one_per_sixteen_clients_within_the_cores() {
        assert_eq!(auto_threads(1, 2), 1);
        assert_eq!(auto_threads(16, 2), 1);
        assert_eq!(auto_threads(17, 2), 2);
        assert_eq!(auto_threads(200, 2), 2);
        assert_eq!(auto_threads(64, 32), 4);
        assert_eq!(auto_threads(0, 8), 1);
        assert_eq!(auto_threads(40, 0), 1);
    }

    #[test]
    fn durations_accept_humantime_and_plain_seconds() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn a_rate_is_a_number_of_commits_per_second_above_zero() {
        assert_eq!(parse_rate("5000"), Ok(5000.0));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        for bad in ["0", "-1", "inf", "NaN", "fast", ""] {
            assert!(parse_rate(bad).is_err(), "{bad:?} was taken");
        }
    }
}
