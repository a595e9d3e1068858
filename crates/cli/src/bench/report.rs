//! The merged result of a run ([`Report`]) as text or JSON, and the `--log` file of
//! every measured commit.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde_json::json;

use super::client::{new_histogram, ClientRun, LogLine, ReturnCounts};
use super::measure::StreamSamples;

/// How many commit errors the report shows.
const ERRORS_REPORTED: usize = 5;

/// Writes the `--log` file: a header, then every client's lines merged in the order
/// sent (ties by client). `start_unix_us` is the run's start on the wall clock.
pub(super) fn write_log(
    out: &mut impl Write,
    start_unix_us: u64,
    runs: &[ClientRun],
) -> std::io::Result<u64> {
    let mut lines: Vec<(u64, usize, &LogLine)> = runs
        .iter()
        .enumerate()
        .flat_map(|(client, run)| run.log.iter().map(move |l| (l.sent_us, client, l)))
        .collect();
    lines.sort_unstable_by_key(|&(sent, client, _)| (sent, client));
    writeln!(out, "client,sent_unix_us,latency_us,lag_us,outcome")?;
    for (_, client, l) in &lines {
        writeln!(
            out,
            "{client},{},{},{},{}",
            start_unix_us + l.sent_us,
            l.latency_us,
            l.lag_us,
            l.outcome.name()
        )?;
    }
    out.flush()?;
    Ok(lines.len() as u64)
}

/// The merged result of a run.
pub(super) struct Report {
    pub(super) clients: u32,
    /// Connections the clients shared (`--connections`, 0 resolved).
    pub(super) connections: u32,
    pub(super) measured: Duration,
    pub(super) commits: u64,
    pub(super) errors: u64,
    /// With `--follow-master`: writes sent again to the master; `None` without.
    pub(super) retries: Option<u64>,
    pub(super) not_durable: u64,
    pub(super) latency_us: Histogram<u64>,
    /// The `--rate` the clients were held to, and how late they sent on its schedule.
    pub(super) rate: Option<f64>,
    pub(super) schedule_lag_us: Histogram<u64>,
    pub(super) first_errors: Vec<String>,
    /// The disk's write+fdatasync rate, when probed.
    pub(super) fsyncs_per_sec: Option<f64>,
    /// The CPU time the hypervisor gave other guests while this one wanted it, in
    /// percent of this machine's CPU time over the measured seconds (Linux only).
    pub(super) steal_pct: Option<f64>,
    /// Commits and flushes the server counted over the whole run (warm-up included).
    pub(super) server: Option<(u64, u64)>,
    /// Per node (the master, then the subscribers), µs of CPU per commit over the same
    /// span as `server` (and the subscribers' catch-up).
    pub(super) server_cpu: Vec<(String, f64)>,
    pub(super) returns: ReturnCounts,
    /// The replication mode, with --mode.
    pub(super) mode: Option<&'static str>,
    /// How long the subscribers took to catch up after the load stopped, with --mode.
    pub(super) catch_up: Option<Duration>,
    /// The master's streams of the bench scheme, sampled under load, with --mode.
    pub(super) streams: StreamSamples,
    /// With `--log`: the file and the lines written to it.
    pub(super) log: Option<(String, u64)>,
}

/// The share of `--rate` below which the report says the rate was not reached (a
/// Poisson schedule's count varies a little by chance).
const RATE_REACHED: f64 = 0.95;

/// Steal at or above which the text report warns that the host, not the system under
/// test, shaped the figures.
const NOISY_STEAL_PCT: f64 = 5.0;

impl Report {
    pub(super) fn merge(
        clients: u32,
        measured: Duration,
        runs: &[ClientRun],
    ) -> anyhow::Result<Report> {
        let mut report = Report {
            clients,
            connections: clients,
            measured,
            commits: 0,
            errors: 0,
            retries: None,
            not_durable: 0,
            latency_us: new_histogram(),
            rate: None,
            schedule_lag_us: new_histogram(),
            first_errors: Vec::new(),
            fsyncs_per_sec: None,
            steal_pct: None,
            server: None,
            server_cpu: Vec::new(),
            returns: ReturnCounts::default(),
            mode: None,
            catch_up: None,
            streams: StreamSamples::default(),
            log: None,
        };
        for run in runs {
            report.commits += run.commits;
            report.returns.add(&run.returns);
            report.errors += run.errors;
            report.not_durable += run.not_durable;
            report
                .latency_us
                .add(&run.latency_us)
                .context("merge latency histograms")?;
            report
                .schedule_lag_us
                .add(&run.schedule_lag_us)
                .context("merge schedule lag histograms")?;
            for e in &run.first_errors {
                if report.first_errors.len() < ERRORS_REPORTED {
                    report.first_errors.push(e.clone());
                }
            }
        }
        Ok(report)
    }

    fn commits_per_sec(&self) -> f64 {
        let secs = self.measured.as_secs_f64();
        if secs > 0.0 {
            self.commits as f64 / secs
        } else {
            0.0
        }
    }

    /// Latency percentiles in µs: p50, p99, p999, max, mean (all 0 with no commits).
    fn latency(&self) -> (u64, u64, u64, u64, f64) {
        let h = &self.latency_us;
        if h.is_empty() {
            return (0, 0, 0, 0, 0.0);
        }
        (
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max(),
            h.mean(),
        )
    }

    pub(super) fn json(&self) -> serde_json::Value {
        let (p50, p99, p999, max, mean) = self.latency();
        json!({
            "clients": self.clients,
            "connections": self.connections,
            "duration_s": self.measured.as_secs_f64(),
            "commits": self.commits,
            "errors": self.errors,
            "retries": self.retries,
            "commits_per_sec": self.commits_per_sec(),
            "durable": self.commits > 0 && self.not_durable == 0,
            "latency_us": {"p50": p50, "p99": p99, "p999": p999, "max": max, "mean": mean},
            "rate": self.rate,
            "schedule_lag_us": self.rate.map(|_| {
                let h = &self.schedule_lag_us;
                let (mean, p99, max) = if h.is_empty() {
                    (0.0, 0, 0)
                } else {
                    (h.mean(), h.value_at_quantile(0.99), h.max())
                };
                json!({"mean": mean, "p99": p99, "max": max})
            }),
            "fsyncs_per_sec": self.fsyncs_per_sec,
            "host_steal_pct": self.steal_pct,
            "commits_per_fsync_limit": self.fsyncs_per_sec.map(|f| self.commits_per_sec() / f),
            "server_commits": self.server.map(|s| s.0),
            "server_flushes": self.server.map(|s| s.1),
            "commits_per_flush": self.commits_per_flush(),
            "server_cpu_us_per_commit": self
                .server_cpu
                .iter()
                .map(|(store, us)| (store.clone(), json!((us * 10.0).round() / 10.0)))
                .collect::<serde_json::Map<_, _>>(),
            "mode": self.mode,
            "returns": {
                "acknowledged": self.returns.acknowledged,
                "timed_out": self.returns.timed_out,
                "disabled": self.returns.disabled,
                "none": self.returns.none,
            },
            "catch_up_ms": self.catch_up.map(|d| d.as_secs_f64() * 1000.0),
            "log": self.log.as_ref().map(|(path, lines)| json!({"path": path, "lines": lines})),
            "streams": self.streams.summary().into_iter().map(|s| json!({
                "receiver": s.receiver,
                "samples": s.samples,
                "lag_ms_mean": s.lag_ms_mean,
                "lag_ms_max": s.lag_ms_max,
                "lag_records_max": s.lag_records_max,
                "ack_round_trip_ms": s.ack_ms,
                "compression": s.compression,
                "raw_bytes_per_txn": s.raw_per_txn,
                "wire_bytes_per_txn": s.wire_per_txn,
            })).collect::<Vec<_>>(),
        })
    }

    /// The group-commit factor the server saw: commits per disk flush.
    fn commits_per_flush(&self) -> Option<f64> {
        self.server
            .filter(|s| s.1 > 0)
            .map(|(c, f)| c as f64 / f as f64)
    }

    fn extra_text(&self) -> String {
        let mut out = String::new();
        if let Some(rate) = self.rate {
            let h = &self.schedule_lag_us;
            let (mean, max) = if h.is_empty() {
                (0.0, 0)
            } else {
                (h.mean(), h.max())
            };
            let short = if self.commits_per_sec() < RATE_REACHED * rate {
                " — the rate was not reached: the server (or this machine) could not keep up"
            } else {
                ""
            };
            out.push_str(&format!(
                "rate           {rate:.0} commits/s scheduled (Poisson); latency counts from each \
                 commit's scheduled time; sent late by {mean:.0} µs mean, {max} µs max{short}\n"
            ));
        }
        if let Some((commits, flushes)) = self.server {
            let factor = self
                .commits_per_flush()
                .map_or("-".into(), |f| format!("{f:.1}"));
            out.push_str(&format!(
                "server         {commits} commits in {flushes} flushes ({factor} commits per flush)\n"
            ));
        }
        if !self.server_cpu.is_empty() {
            let per: Vec<String> = self
                .server_cpu
                .iter()
                .map(|(store, us)| format!("{store} {us:.1}"))
                .collect();
            out.push_str(&format!(
                "server cpu     {} µs per commit (user + system, warm-up and catch-up included)\n",
                per.join(", ")
            ));
        }
        if let Some(mode) = self.mode {
            let r = &self.returns;
            out.push_str(&format!(
                "replication    {mode}: {} acknowledged, {} timed out (TT8170), {} with the \
                 service disabled, {} without one\n",
                r.acknowledged, r.timed_out, r.disabled, r.none
            ));
            for s in self.streams.summary() {
                out.push_str(&format!(
                    "stream {:<8} lag mean {:.1} ms, max {:.1} ms, at most {} log records \
                     behind ({} samples); ack round trip {:.2} ms{}\n",
                    s.receiver,
                    s.lag_ms_mean,
                    s.lag_ms_max,
                    s.lag_records_max,
                    s.samples,
                    s.ack_ms,
                    s.bytes_text()
                ));
            }
            if let Some(d) = self.catch_up {
                out.push_str(&format!(
                    "catch-up       subscribers had everything {:.1} ms after the load stopped\n",
                    d.as_secs_f64() * 1000.0
                ));
            }
        }
        if let Some(f) = self.fsyncs_per_sec {
            out.push_str(&format!(
                "disk           {f:.0} fsyncs/s; commits/s is {:.2}x that limit\n",
                self.commits_per_sec() / f
            ));
        }
        if let Some((path, lines)) = &self.log {
            out.push_str(&format!(
                "log            {lines} commits, one per line, in {path}\n"
            ));
        }
        if let Some(steal) = self.steal_pct {
            out.push_str(&format!(
                "host           {steal:.1} % CPU steal on this machine while measuring{}\n",
                if steal >= NOISY_STEAL_PCT {
                    " (the hypervisor ran other guests: figures are low and noisy)"
                } else {
                    ""
                }
            ));
        }
        out
    }

    pub(super) fn text(&self, table: &str, value_size: usize, keys: i64) -> String {
        let (p50, p99, p999, max, mean) = self.latency();
        let durable = match (self.commits, self.not_durable) {
            (0, _) => "-".to_string(),
            (_, 0) => "all".to_string(),
            (_, n) => format!("{} of {}", self.commits - n, self.commits),
        };
        format!(
            "bench: {clients} clients{shared}, {secs:.1} s, table {table}, {value_size} B values, \
             {keys} keys\n\
             commits        {commits}\n\
             commits/s      {rate:.1}\n\
             errors         {errors}{retries}\n\
             durable        {durable}\n\
             latency (µs)   p50 {p50}  p99 {p99}  p999 {p999}  max {max}  mean {mean:.0}\n\
             {extra}",
            extra = self.extra_text(),
            clients = self.clients,
            shared = if self.connections < self.clients {
                let s = if self.connections == 1 { "" } else { "s" };
                format!(" on {} connection{s}", self.connections)
            } else {
                String::new()
            },
            secs = self.measured.as_secs_f64(),
            commits = self.commits,
            rate = self.commits_per_sec(),
            errors = self.errors,
            retries = self
                .retries
                .map_or(String::new(), |r| format!("  (retried at the master: {r})")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::client::LogOutcome;

    #[test]
    fn the_log_merges_the_clients_lines_in_the_order_sent() {
        let line = |sent_us, latency_us, lag_us, outcome| LogLine {
            sent_us,
            latency_us,
            lag_us,
            outcome,
        };
        let runs = [
            logged(vec![
                line(10, 500, 0, LogOutcome::Acknowledged),
                line(900, 7000, 40, LogOutcome::TimedOut),
            ]),
            logged(vec![]),
            logged(vec![
                line(10, 300, 2, LogOutcome::NoReturn),
                line(450, 1200, 0, LogOutcome::Error),
                line(2000, 80, 1, LogOutcome::Disabled),
            ]),
        ];
        let mut out = Vec::new();
        assert_eq!(write_log(&mut out, 1_000_000, &runs).unwrap(), 5);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "client,sent_unix_us,latency_us,lag_us,outcome\n\
             0,1000010,500,0,acknowledged\n\
             2,1000010,300,2,none\n\
             2,1000450,1200,0,error\n\
             0,1000900,7000,40,timed_out\n\
             2,1002000,80,1,disabled\n"
        );
        for outcome in ["acknowledged", "timed_out", "disabled"] {
            assert_eq!(LogOutcome::of(outcome).name(), outcome);
        }
        assert_eq!(LogOutcome::of("").name(), "none");
    }

    fn client_run(latencies: &[u64], errors: u64, not_durable: u64) -> ClientRun {
        let mut latency_us = new_histogram();
        for &l in latencies {
            latency_us.saturating_record(l);
        }
        ClientRun {
            latency_us,
            schedule_lag_us: new_histogram(),
            commits: latencies.len() as u64,
            errors,
            retries: 0,
            not_durable,
            returns: ReturnCounts::default(),
            first_errors: (0..errors).map(|i| format!("e{i}")).collect(),
            fatal: None,
            log: Vec::new(),
        }
    }

    fn logged(log: Vec<LogLine>) -> ClientRun {
        ClientRun {
            log,
            ..client_run(&[], 0, 0)
        }
    }

    #[test]
    fn report_merges_clients_and_computes_rate_and_percentiles() {
        let a = client_run(&(1..=500).collect::<Vec<_>>(), 4, 0);
        let b = client_run(&(501..=1000).collect::<Vec<_>>(), 3, 0);
        let report = Report::merge(2, Duration::from_secs(2), &[a, b]).unwrap();
        assert_eq!(report.commits, 1000);
        assert_eq!(report.errors, 7);
        assert_eq!(report.first_errors.len(), ERRORS_REPORTED);
        assert_eq!(report.commits_per_sec(), 500.0);
        let (p50, p99, p999, max, mean) = report.latency();
        assert_eq!(p50, 500);
        assert_eq!(p99, 990);
        assert_eq!(p999, 999);
        assert_eq!(max, 1000);
        assert!((mean - 500.5).abs() < 1.0);

        let j = report.json();
        assert_eq!(j["clients"], 2);
        assert_eq!(j["commits"], 1000);
        assert_eq!(j["commits_per_sec"], 500.0);
        assert_eq!(j["durable"], true);
        assert_eq!(j["latency_us"]["p99"], 990);
        assert!(report
            .text("bench", 100, 10)
            .contains("commits/s      500.0\n"));
    }

    #[test]
    fn an_empty_run_reports_zeros_not_nan() {
        let report = Report::merge(1, Duration::ZERO, &[client_run(&[], 2, 0)]).unwrap();
        assert_eq!(report.commits_per_sec(), 0.0);
        assert_eq!(report.latency(), (0, 0, 0, 0, 0.0));
        assert_eq!(report.json()["durable"], false);
        assert!(report.text("bench", 1, 1).contains("durable        -\n"));
    }

    #[test]
    fn non_durable_commits_are_reported() {
        let report =
            Report::merge(1, Duration::from_secs(1), &[client_run(&[5, 6], 0, 1)]).unwrap();
        assert_eq!(report.json()["durable"], false);
        assert!(report
            .text("bench", 1, 1)
            .contains("durable        1 of 2\n"));
    }
}
