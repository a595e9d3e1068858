//! What the bench samples beside its own commits: each node's CPU time, the host's
//! CPU steal, and the master's streams of the bench scheme under load.

use std::collections::BTreeMap;
use std::time::Duration;

use hawser_client::Client;
use hawser_proto::v1;
use tokio::time::Instant;

/// One node's CPU time (`StatusResponse.cpu_micros`) before and after the run.
pub(super) struct NodeCpu {
    pub(super) store: String,
    /// A connection to it (none for the master, read through the bench's own).
    pub(super) client: Option<Client>,
    pub(super) before: Option<u64>,
    pub(super) after: Option<u64>,
}

impl NodeCpu {
    pub(super) fn new(store: String, client: Option<Client>, before: u64) -> Self {
        // 0: a server that predates the field.
        let before = (before > 0).then_some(before);
        NodeCpu {
            store,
            client,
            before,
            after: None,
        }
    }

    /// Reads the CPU time of the node whose store is `store`, found in the master's
    /// cluster status; a node it cannot reach is left out of the report, with a warning.
    pub(super) async fn connect(store: &str, master: &v1::StatusResponse) -> Self {
        let addr = master.cluster.as_ref().and_then(|c| {
            c.nodes
                .iter()
                .find(|n| n.store.eq_ignore_ascii_case(store))
                .map(|n| n.grpc_addr.clone())
        });
        let Some(addr) = addr else {
            eprintln!("warning: {store} is not in the cluster's status: its CPU is not reported");
            return NodeCpu::new(store.to_string(), None, 0);
        };
        let mut client = match Client::connect(&addr).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("warning: cannot reach {store} at {addr} for its CPU time: {e}");
                return NodeCpu::new(store.to_string(), None, 0);
            }
        };
        let before = client.status().await.map_or(0, |s| s.cpu_micros);
        NodeCpu::new(store.to_string(), Some(client), before)
    }

    pub(super) async fn read_after(&mut self) {
        if let (Some(client), Some(_)) = (&mut self.client, self.before) {
            self.after = client.status().await.ok().map(|s| s.cpu_micros);
        }
    }

    /// µs of CPU per commit of the master's `commits` between the two readings.
    pub(super) fn micros_per(&self, commits: u64) -> Option<f64> {
        let used = self.after?.checked_sub(self.before?)?;
        (commits > 0).then(|| used as f64 / commits as f64)
    }
}

/// How often the master's streams are sampled under load.
pub(super) const STREAM_SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The first line of `/proc/stat`: CPU time of all CPUs since boot, in ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct CpuTicks {
    /// Time the hypervisor ran other guests while this one had work ("steal").
    steal: u64,
    /// user, nice, system, idle, iowait, irq, softirq and steal together.
    total: u64,
}

impl CpuTicks {
    /// `None` where there is no `/proc/stat` (not Linux) or it has no steal column.
    pub(super) fn read() -> Option<CpuTicks> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    fn parse(stat: &str) -> Option<CpuTicks> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        Some(CpuTicks {
            steal: *v.get(7)?,
            total: v.iter().sum(),
        })
    }

    pub(super) fn steal_pct_until(&self, later: &CpuTicks) -> Option<f64> {
        let total = later.total.checked_sub(self.total).filter(|t| *t > 0)?;
        let steal = later.steal.checked_sub(self.steal)?;
        Some(steal as f64 * 100.0 / total as f64)
    }
}

pub(super) fn now_before(end: Instant) -> bool {
    Instant::now() < end
}

/// Per receiver of the bench scheme, what the master's `/replication` said under load.
#[derive(Default)]
pub(super) struct StreamSamples {
    by_receiver: BTreeMap<String, StreamSample>,
}

#[derive(Default)]
struct StreamSample {
    /// `lag_micros` (age of the oldest unacknowledged transaction sent) per sample.
    lag_us: Vec<u64>,
    lag_records_max: u64,
    /// `ack_micros_mean` at the last sample (0: no ack yet).
    ack_us: u64,
    /// The stream's counters (raw bytes, wire bytes, transactions) at the first and the
    /// last sample under load: what it sent while the load was measured.
    first: Option<[u64; 3]>,
    last: [u64; 3],
    /// The codec the sender reports (`off`, `lz4`, `zstd`).
    compression: String,
}

impl StreamSamples {
    /// Takes one sample from a status response's replication status. Only samples
    /// taken before the load ended (`under_load`) count towards the lag.
    pub(super) fn add(
        &mut self,
        replication: Option<&v1::ReplicationStatus>,
        scheme: &str,
        under_load: bool,
    ) {
        let Some(r) = replication else {
            return;
        };
        for o in r
            .outbound
            .iter()
            .filter(|o| o.scheme.eq_ignore_ascii_case(scheme))
        {
            let sample = self.by_receiver.entry(o.receiver.clone()).or_default();
            if under_load {
                sample.lag_us.push(o.lag_micros);
                sample.lag_records_max = sample.lag_records_max.max(o.lag_records);
                let counters = [o.raw_bytes, o.wire_bytes, o.transactions];
                sample.first.get_or_insert(counters);
                sample.last = counters;
                sample.compression = o.compression.clone();
            }
            sample.ack_us = o.ack_micros_mean;
        }
    }

    /// Per receiver sampled under load at least once.
    pub(super) fn summary(&self) -> Vec<StreamSummary> {
        self.by_receiver
            .iter()
            .filter(|(_, s)| !s.lag_us.is_empty())
            .map(|(receiver, s)| {
                let samples = s.lag_us.len();
                let max = s.lag_us.iter().copied().max().unwrap_or(0);
                let first = s.first.unwrap_or(s.last);
                let [raw, wire, txns] = [0, 1, 2].map(|i| s.last[i].saturating_sub(first[i]));
                let per_txn = |bytes: u64| (txns > 0).then(|| bytes as f64 / txns as f64);
                StreamSummary {
                    receiver: receiver.clone(),
                    samples,
                    lag_ms_mean: s.lag_us.iter().sum::<u64>() as f64 / samples as f64 / 1000.0,
                    lag_ms_max: max as f64 / 1000.0,
                    lag_records_max: s.lag_records_max,
                    ack_ms: s.ack_us as f64 / 1000.0,
                    compression: s.compression.clone(),
                    raw_per_txn: per_txn(raw),
                    wire_per_txn: per_txn(wire),
                }
            })
            .collect()
    }
}

/// One stream's samples, summed up.
pub(super) struct StreamSummary {
    pub(super) receiver: String,
    pub(super) samples: usize,
    pub(super) lag_ms_mean: f64,
    pub(super) lag_ms_max: f64,
    pub(super) lag_records_max: u64,
    pub(super) ack_ms: f64,
    pub(super) compression: String,
    /// Bytes per transaction the stream encoded and sent between the first and the
    /// last sample (none when it sent no transaction meanwhile).
    pub(super) raw_per_txn: Option<f64>,
    pub(super) wire_per_txn: Option<f64>,
}

impl StreamSummary {
    /// `; compression lz4: 262 B per transaction encoded, 175 sent (33 % saved)` (or
    /// `; 262 B per transaction, uncompressed`), or nothing when the stream sent no
    /// transaction between samples.
    pub(super) fn bytes_text(&self) -> String {
        let (Some(raw), Some(wire)) = (self.raw_per_txn, self.wire_per_txn) else {
            return String::new();
        };
        if self.compression == "off" {
            return format!("; {raw:.0} B per transaction, uncompressed");
        }
        let codec = if self.compression.is_empty() {
            "?"
        } else {
            &self.compression
        };
        let saved = if raw > 0.0 {
            100.0 * (1.0 - wire / raw)
        } else {
            0.0
        };
        format!(
            "; compression {codec}: {raw:.0} B per transaction encoded, {wire:.0} sent \
             ({saved:.0} % saved)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_read_from_proc_stat_as_a_share_of_all_cpu_time() {
        let at = |steal: u64, idle: u64| {
            format!("cpu  100 0 50 {idle} 5 0 2 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 9\n")
        };
        let a = CpuTicks::parse(&at(10, 1000)).unwrap();
        assert_eq!(
            a,
            CpuTicks {
                steal: 10,
                total: 1167
            }
        );
        let b = CpuTicks::parse(&at(40, 1270)).unwrap();
        // 300 ticks later, 30 of them stolen.
        assert_eq!(a.steal_pct_until(&b), Some(10.0));
        assert_eq!(b.steal_pct_until(&a), None, "counters only grow");
        assert_eq!(a.steal_pct_until(&a), None, "no time passed");
        // An old kernel's line without the steal column.
        assert_eq!(CpuTicks::parse("cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(CpuTicks::parse("intr 1\n"), None);
    }

    #[test]
    fn stream_samples_give_the_bytes_per_transaction_sent_while_measured() {
        let sample = |raw: u64, wire: u64, txns: u64| v1::ReplicationStatus {
            outbound: vec![
                v1::OutboundStream {
                    scheme: "bench_repl".into(),
                    receiver: "ds2".into(),
                    lag_micros: 900,
                    lag_records: 3,
                    ack_micros_mean: 400,
                    compression: "lz4".into(),
                    raw_bytes: raw,
                    wire_bytes: wire,
                    transactions: txns,
                    ..Default::default()
                },
                v1::OutboundStream {
                    scheme: "other".into(),
                    receiver: "ds9".into(),
                    lag_micros: 1,
                    lag_records: 1,
                    raw_bytes: 1,
                    wire_bytes: 1,
                    transactions: 1,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let mut samples = StreamSamples::default();
        samples.add(Some(&sample(1_000, 1_000, 4)), "BENCH_REPL", true);
        samples.add(Some(&sample(27_000, 14_000, 104)), "bench_repl", true);
        // After the load: not counted.
        samples.add(Some(&sample(99_000, 99_000, 200)), "bench_repl", false);
        let summary = samples.summary();
        assert_eq!(summary.len(), 1);
        let s = &summary[0];
        assert_eq!(
            (s.receiver.as_str(), s.compression.as_str()),
            ("ds2", "lz4")
        );
        assert_eq!((s.raw_per_txn, s.wire_per_txn), (Some(260.0), Some(130.0)));
        assert!(
            s.bytes_text()
                .contains("lz4: 260 B per transaction encoded, 130 sent (50 % saved)"),
            "{}",
            s.bytes_text()
        );

        // A stream that sent nothing between its samples has no per-transaction figure.
        let mut idle = StreamSamples::default();
        idle.add(Some(&sample(5, 5, 1)), "bench_repl", true);
        idle.add(Some(&sample(5, 5, 1)), "bench_repl", true);
        let s = &idle.summary()[0];
        assert_eq!((s.raw_per_txn, s.bytes_text()), (None, String::new()));

        // An uncompressed stream says so rather than "0 % saved".
        let plain = StreamSummary {
            receiver: "ds3".into(),
            samples: 2,
            lag_ms_mean: 0.0,
            lag_ms_max: 0.0,
            lag_records_max: 0,
            ack_ms: 0.0,
            compression: "off".into(),
            raw_per_txn: Some(249.4),
            wire_per_txn: Some(249.4),
        };
        assert_eq!(plain.bytes_text(), "; 249 B per transaction, uncompressed");
    }
}
