//! The node's configuration: one typed struct, defaults defined once here.
//!
//! The binary fills it from (lowest to highest precedence) these defaults, a TOML file
//! (`--config`), `HAWSER_*` environment variables and command-line flags; [`NodeConfig::validate`]
//! then explains any bad combination before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hawser_core::Ident;
use hawser_stream::codec::{ZSTD_DEFAULT_LEVEL, ZSTD_LEVELS};
use hawser_stream::{CompilePolicy, Compression, ReceiverConfig, DEFAULT_APPLY_SLICE};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Everything one `hawser start` needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// The store name (TimesTen's "database name") replication schemes use for this node.
    pub name: String,
    /// gRPC address to listen on (clients, and later peers).
    pub listen: SocketAddr,
    /// HTTP address for `/healthz`, `/readyz`, `/metrics` and `/status`.
    pub http: SocketAddr,
    /// Directory of the node's database; created if missing.
    pub data_dir: PathBuf,
    /// Whether a commit waits for its flush to disk before it is acknowledged.
    pub durable_commits: bool,
    /// How long a transaction waits for a row lock before it fails (TimesTen's LockWait).
    #[serde(with = "humantime_serde")]
    pub lock_timeout: Duration,
    /// Largest gRPC message accepted or sent.
    pub max_message_bytes: usize,
    /// Interactive sessions (`Client.Session`) open at once at most; one more is refused
    /// with RESOURCE_EXHAUSTED (53300) until one ends.
    pub max_sessions: u32,
    /// `Client` calls handled at once at most (a session's stream counts while it is
    /// being opened; its scripts are bounded by `max_sessions`); one more is refused with
    /// RESOURCE_EXHAUSTED (53300) at once, not queued. `Admin` calls have their own,
    /// fixed bound ([`crate::ADMIN_REQUESTS`]), so an operator reaches a node its clients
    /// flood.
    pub max_requests: u32,
    /// How long one SQL statement may run before it fails with 57014 and is undone
    /// (0: no bound, as in TimesTen, PostgreSQL and CockroachDB). A call's own gRPC
    /// deadline bounds its statements too (docs/sql.md, "Limits").
    #[serde(with = "humantime_serde")]
    pub statement_timeout: Duration,
    /// Members (`host:port` of their gRPC servers) to join the cluster through; empty
    /// for the first node, which `hawser init` bootstraps.
    pub join: Vec<String>,
    /// The gRPC `host:port` peers and clients use to reach this node; defaults to the
    /// bound gRPC address (which resolves port 0).
    pub advertise: Option<String>,
    /// Raft leader heartbeat interval.
    #[serde(with = "humantime_serde")]
    pub raft_heartbeat: Duration,
    /// Raft election timeout, lower bound.
    #[serde(with = "humantime_serde")]
    pub raft_election_min: Duration,
    /// Raft election timeout, upper bound.
    #[serde(with = "humantime_serde")]
    pub raft_election_max: Duration,
    /// Build a Raft snapshot after this many applied entries.
    pub raft_snapshot_every: u64,
    /// Raft log entries kept behind the last snapshot (followers slightly behind catch
    /// up from them; 0 purges the log at every snapshot).
    pub raft_log_keep: u64,
    /// How often this node reports its liveness and high-water marks to the Raft
    /// leader (which renews its master lease in answer).
    #[serde(with = "humantime_serde")]
    pub report_interval: Duration,
    /// How long a master lease lasts, from when the master sent the report that earned
    /// it: a master cut off from the Raft leader's quorum stops taking writes to what
    /// it masters within this long (docs/control.md, "Failover timing").
    #[serde(with = "humantime_serde")]
    pub master_lease: Duration,
    /// A master the Raft leader has not heard from for this long is failed over (when
    /// this node leads). At least the master lease plus the report interval.
    #[serde(with = "humantime_serde")]
    pub failover_timeout: Duration,
    /// Whether this node, when it leads the Raft group, fails silent masters over
    /// (off: it only reports them as blocked, and failover is by hand).
    pub auto_failover: bool,
    /// A subscriber that trails the silent master by more than this many of its
    /// transactions is not promoted (0: no limit).
    pub failover_max_lag: u64,
    /// Whether this node's receiver compiles a backlog of received transactions into
    /// RTL net row operations (`false`: always apply in log order).
    pub compile: bool,
    /// A receiver's backlog (the batch read plus those queued behind it) of at least
    /// this many transactions is compiled.
    pub compile_threshold_txns: u64,
    /// A receiver's backlog of at least this many bytes (uncompressed) is compiled.
    pub compile_threshold_bytes: u64,
    /// A receiver applying a stream that no return service waits on, while it is not
    /// behind, pauses briefly after about this much time of apply (or of moving
    /// flushed rows into sled), so that other work woken on its core runs
    /// (docs/stream.md, "Paced apply"); 0 applies in one go.
    #[serde(with = "humantime_serde")]
    pub apply_slice: Duration,
    /// TimesTen's LogFileSize: the unit of FAILTHRESHOLD. A master marks a subscriber
    /// FAILED once the log it has not acknowledged exceeds FAILTHRESHOLD × this many
    /// bytes.
    pub log_file_size: u64,
    /// Bytes of commit log kept even when no stream needs them, so a subscriber added
    /// soon after can still get recent history; older log is released once every
    /// stream that holds log (receivers in START or PAUSE state) has acknowledged it.
    pub log_keep_bytes: u64,
    /// Writes (own commits, DDL, replicated applies) are refused with SQLSTATE 53100
    /// while the volume of the data directory has less than this many bytes available,
    /// so a filling disk stops writes cleanly instead of failing one half way
    /// (docs/storage.md, "A full disk"); 0 never refuses.
    pub min_free_bytes: u64,
    /// How this node compresses what it sends where a scheme says COMPRESS TRAFFIC ON
    /// for its store (TimesTen names no algorithm): lz4, fast, or zstd[:LEVEL], smaller.
    pub compress_codec: CompressCodec,
    /// Async worker threads: 0 runs one per CPU core; 1 runs the whole node on one
    /// thread, where a receiver's flush blocks it as a PostgreSQL walreceiver's does
    /// (several nodes sharing a small machine spend less CPU per replicated commit
    /// that way; see docs/architecture.md "Threads").
    pub threads: usize,
    /// The CPU scheduling class of the node's threads: `normal`, or `idle` (Linux's
    /// SCHED_IDLE), in which they run only on CPU time that normal-class threads of
    /// the same cgroup leave. For an asynchronous subscriber sharing cores with the
    /// master it serves, such as a reporting replica: the master's commits never wait
    /// for a core the subscriber holds, and the subscriber lags while the machine is
    /// busy (docs/stream.md, "The idle CPU class", which says where it has no effect).
    pub cpu_class: CpuClass,
    /// Whether the kernel may back the node's memory with transparent huge pages:
    /// `off` (the default) opts the process out (Linux's `PR_SET_THP_DISABLE`), as
    /// Redis does by default and Oracle advises; `system` leaves it to the
    /// machine's setting. A huge page is 2 MiB zeroed in one page fault, where a
    /// virtual machine's host may first have to find and back those 2 MiB: faults that
    /// stalled a node's thread for 5–6 ms at a time (docs/storage.md, "Transparent huge
    /// pages").
    pub transparent_huge_pages: HugePages,
    /// Stands in for the machine's boot id (Linux's `/proc/sys/kernel/random/boot_id`),
    /// which the store compares at every open to tell a restart of the process from one
    /// of the machine (docs/stream.md, "Shipping before the sync"). For drills and
    /// tests that rehearse a machine crash; leave unset otherwise.
    pub boot_id: Option<String>,
    /// Cut a damaged write-ahead log before the damage instead of refusing to start
    /// (`hawser start --salvage`; `hawser_store::DbOptions::salvage`).
    pub salvage: bool,
    /// Take `Admin.Fault` requests (crash or pause this node, for `hawser drill`);
    /// refused when false (`hawser start --allow-faults`).
    pub allow_faults: bool,
    /// The certificates directory: `ca.crt`, `node.crt`, `node.key` (`hawser cert`).
    /// Every gRPC call to the node is then TLS, and every caller shows a certificate of
    /// the cluster's CA; the peer services take node certificates only.
    pub certs_dir: Option<PathBuf>,
    /// Run without TLS and without checking callers: anyone who reaches the gRPC port
    /// may do anything, peer calls included. Required when no `certs_dir` is given.
    pub insecure: bool,
    /// Joining, take the place of a silent member the cluster registers under this
    /// node's name: for a node that lost its data directory (`hawser_control::replace`).
    pub replace: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            name: "hawser".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7420)),
            http: SocketAddr::from(([127, 0, 0, 1], 7421)),
            data_dir: PathBuf::from("hawser-data"),
            durable_commits: true,
            lock_timeout: Duration::from_secs(10),
            max_message_bytes: 16 * 1024 * 1024,
            max_sessions: 1000,
            max_requests: 1000,
            statement_timeout: Duration::ZERO,
            join: Vec::new(),
            advertise: None,
            raft_heartbeat: Duration::from_millis(100),
            raft_election_min: Duration::from_millis(300),
            raft_election_max: Duration::from_millis(600),
            raft_snapshot_every: 1000,
            raft_log_keep: 1000,
            report_interval: Duration::from_millis(100),
            master_lease: Duration::from_millis(500),
            failover_timeout: Duration::from_millis(1000),
            auto_failover: true,
            failover_max_lag: 0,
            compile: true,
            compile_threshold_txns: CompilePolicy::DEFAULT_MIN_TRANSACTIONS,
            compile_threshold_bytes: CompilePolicy::DEFAULT_MIN_BYTES,
            apply_slice: DEFAULT_APPLY_SLICE,
            log_file_size: 64 * 1024 * 1024,
            log_keep_bytes: 64 * 1024 * 1024,
            min_free_bytes: 64 * 1024 * 1024,
            compress_codec: CompressCodec::Lz4,
            threads: 0,
            cpu_class: CpuClass::Normal,
            transparent_huge_pages: HugePages::Off,
            boot_id: None,
            salvage: false,
            allow_faults: false,
            certs_dir: None,
            insecure: false,
            replace: false,
        }
    }
}

/// The string side of a setting whose values are names: `as_str` (its name in
/// configuration, status and logs), parsing (trimmed, any case; an error names the key
/// and the names it takes), and serde through both (`#[serde(try_from = "String",
/// into = "String")]` on the enum).
macro_rules! named_setting {
    ($ty:ident, $key:literal, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Its name: one of the names the setting takes.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }

        impl std::str::FromStr for $ty {
            type Err = ConfigError;

            fn from_str(s: &str) -> Result<Self, ConfigError> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $($name => Ok($ty::$variant),)+
                    _ => Err(ConfigError(format!(
                        "{} {s:?} is not {} hawser has: {}",
                        $key,
                        $what,
                        [$($name),+].join(" or ")
                    ))),
                }
            }
        }

        impl TryFrom<String> for $ty {
            type Error = ConfigError;

            fn try_from(s: String) -> Result<Self, ConfigError> {
                s.parse()
            }
        }

        impl From<$ty> for String {
            fn from(v: $ty) -> String {
                v.as_str().into()
            }
        }
    };
}

/// The CPU scheduling class a node's threads run in (`cpu_class`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CpuClass {
    /// The kernel's default (SCHED_OTHER): the node's threads share the cores with the
    /// machine's other normal-class threads by their nice values.
    #[default]
    Normal,
    /// SCHED_IDLE: the node's threads run only when no normal-class thread of their
    /// cgroup is waiting for the core. Entering it needs no privilege; a process cannot
    /// leave it without CAP_SYS_NICE, so a node started in it stays in it until it exits.
    Idle,
}

named_setting!(CpuClass, "cpu_class", "a class", { Normal => "normal", Idle => "idle" });

/// Whether a node's memory may be backed by transparent huge pages
/// (`transparent_huge_pages`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum HugePages {
    /// The node's process opts out of transparent huge pages, whatever the machine's
    /// setting: its memory grows 4 KiB at a time.
    #[default]
    Off,
    /// The machine's setting applies (`/sys/kernel/mm/transparent_hugepage/enabled`).
    System,
}

named_setting!(HugePages, "transparent_huge_pages", "a setting", {
    Off => "off",
    System => "system",
});

/// The algorithm of COMPRESS TRAFFIC ON, chosen per sending node (`compress_codec`:
/// `lz4`, `zstd` or `zstd:LEVEL`). Each batch names its codec, so a receiver reads
/// either whatever it is set to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CompressCodec {
    /// lz4 (block format): cheap on CPU.
    #[default]
    Lz4,
    /// zstd at a level of [`hawser_stream::codec::ZSTD_LEVELS`] (3 unless named): fewer
    /// bytes than lz4 for more CPU, for links where bandwidth costs more than the
    /// sender's cores.
    Zstd { level: i32 },
}

impl CompressCodec {
    /// The batch compression it stands for.
    pub fn compression(self) -> Compression {
        match self {
            CompressCodec::Lz4 => Compression::Lz4,
            CompressCodec::Zstd { .. } => Compression::Zstd,
        }
    }

    /// The zstd level its streams use (zstd's default for lz4, where it means nothing).
    pub fn zstd_level(self) -> i32 {
        match self {
            CompressCodec::Lz4 => ZSTD_DEFAULT_LEVEL,
            CompressCodec::Zstd { level } => level,
        }
    }
}

impl std::str::FromStr for CompressCodec {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let text = s.trim().to_ascii_lowercase();
        let (name, level) = match text.split_once(':') {
            Some((name, level)) => (name, Some(level)),
            None => (text.as_str(), None),
        };
        match (name, level) {
            ("lz4", None) => Ok(CompressCodec::Lz4),
            ("zstd", None) => Ok(CompressCodec::Zstd {
                level: ZSTD_DEFAULT_LEVEL,
            }),
            ("zstd", Some(level)) => match level.parse::<i32>() {
                Ok(level) if ZSTD_LEVELS.contains(&level) => Ok(CompressCodec::Zstd { level }),
                _ => Err(ConfigError(format!(
                    "compress_codec {s:?}: the zstd level must be a whole number from {} to {}",
                    ZSTD_LEVELS.start(),
                    ZSTD_LEVELS.end()
                ))),
            },
            ("lz4", Some(_)) => Err(ConfigError(format!(
                "compress_codec {s:?}: lz4 has no level (lz4, or zstd:LEVEL)"
            ))),
            _ => Err(ConfigError(format!(
                "compress_codec {s:?} is not a codec hawser has: lz4, zstd or zstd:LEVEL"
            ))),
        }
    }
}

impl TryFrom<String> for CompressCodec {
    type Error = ConfigError;

    fn try_from(s: String) -> Result<Self, ConfigError> {
        s.parse()
    }
}

impl std::fmt::Display for CompressCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompressCodec::Lz4 => f.write_str("lz4"),
            CompressCodec::Zstd { level } => write!(f, "zstd:{level}"),
        }
    }
}

impl From<CompressCodec> for String {
    fn from(c: CompressCodec) -> String {
        c.to_string()
    }
}

/// The most async worker threads a node runs.
pub const MAX_THREADS: usize = 1024;

/// A configuration that cannot work, with the reason.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl NodeConfig {
    /// Reads a TOML file's settings over the defaults.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml_from_str(text)
    }

    /// Checks the combination of settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = self
            .name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
            && self.name.len() <= 30;
        if !name_ok {
            return Err(ConfigError(format!(
                "name {:?} must be an identifier of at most 30 characters (letters, digits, _; \
                 starting with a letter), as replication schemes refer to it",
                self.name
            )));
        }
        if self.listen.port() != 0 && self.listen == self.http {
            return Err(ConfigError(format!(
                "listen and http are both {}; they need different ports",
                self.listen
            )));
        }
        if self.threads > MAX_THREADS {
            return Err(ConfigError(format!(
                "threads {} is above the maximum of {MAX_THREADS} (0 runs one per CPU core)",
                self.threads
            )));
        }
        if self.max_sessions == 0 {
            return Err(ConfigError("max_sessions must be at least 1".into()));
        }
        match (&self.certs_dir, self.insecure) {
            (None, false) => {
                return Err(ConfigError(
                    "no certificates: give --certs-dir DIR (ca.crt, node.crt and node.key, \
                     made by `hawser cert create-ca` and `hawser cert create-node`), or \
                     --insecure to run without TLS, where anyone who reaches the gRPC port \
                     can do anything"
                        .into(),
                ))
            }
            (Some(dir), true) => {
                return Err(ConfigError(format!(
                    "both --certs-dir {} and --insecure: choose one",
                    dir.display()
                )))
            }
            _ => {}
        }
        if self.max_requests == 0 {
            return Err(ConfigError("max_requests must be at least 1".into()));
        }
        if !self.join.is_empty() && self.listen.ip().is_unspecified() && self.advertise.is_none() {
            // The cluster would register 0.0.0.0 (or ::) as this node's address, which
            // names no machine: peers and redirected clients could never reach it.
            return Err(ConfigError(format!(
                "--listen {} names no machine for the cluster to reach this node by: give \
                 --advertise HOST:PORT (the name or address peers dial, e.g. \
                 $(POD_NAME).hawser:7420 on Kubernetes)",
                self.listen
            )));
        }
        if self.lock_timeout.is_zero() {
            return Err(ConfigError("lock_timeout must be greater than 0".into()));
        }
        if self.max_message_bytes < 64 * 1024 {
            return Err(ConfigError(format!(
                "max_message_bytes {} is below the minimum of 65536",
                self.max_message_bytes
            )));
        }
        for member in &self.join {
            check_host_port("join", member)?;
        }
        match &self.advertise {
            Some(a) => check_host_port("advertise", a)?,
            None if self.listen.ip().is_unspecified() => {
                return Err(ConfigError(format!(
                    "listen {} is a wildcard address that peers cannot dial; set advertise \
                     (--advertise HOST:PORT) to the address they should use",
                    self.listen
                )))
            }
            None => {}
        }
        if self.raft_election_min <= self.raft_heartbeat {
            return Err(ConfigError(format!(
                "raft_election_min {:?} must exceed raft_heartbeat {:?}, or followers start \
                 elections between heartbeats",
                self.raft_election_min, self.raft_heartbeat
            )));
        }
        if self.log_file_size == 0 {
            return Err(ConfigError("log_file_size must be at least 1 byte".into()));
        }
        if self.raft_election_max <= self.raft_election_min {
            return Err(ConfigError(format!(
                "raft_election_max {:?} must exceed raft_election_min {:?}",
                self.raft_election_max, self.raft_election_min
            )));
        }
        if self.raft_heartbeat.as_millis() == 0 {
            return Err(ConfigError(
                "raft_heartbeat must be at least 1ms (Raft timing has millisecond resolution)"
                    .into(),
            ));
        }
        if self.raft_snapshot_every == 0 {
            return Err(ConfigError("raft_snapshot_every must be at least 1".into()));
        }
        if self.report_interval.as_millis() == 0 {
            return Err(ConfigError("report_interval must be at least 1ms".into()));
        }
        if self.master_lease < self.report_interval * 2 {
            return Err(ConfigError(format!(
                "master_lease {:?} must be at least twice report_interval {:?}, or a master \
                 loses its lease between two reports",
                self.master_lease, self.report_interval
            )));
        }
        if self.failover_timeout < self.master_lease + self.report_interval {
            return Err(ConfigError(format!(
                "failover_timeout {:?} must be at least master_lease {:?} plus \
                 report_interval {:?}: a silent master must have stopped taking writes \
                 before another is promoted",
                self.failover_timeout, self.master_lease, self.report_interval
            )));
        }
        if self.compile_threshold_txns == 0 || self.compile_threshold_bytes == 0 {
            return Err(ConfigError(
                "compile_threshold_txns and compile_threshold_bytes must be at least 1 \
                 (1 compiles every batch; --no-compile, compile = false in TOML, never compiles)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The receiver settings of this node, whose store is `store`.
    pub fn receiver_config(&self, store: Ident) -> ReceiverConfig {
        let mut c = ReceiverConfig::new(store);
        c.compile = CompilePolicy {
            enabled: self.compile,
            min_transactions: self.compile_threshold_txns,
            min_bytes: self.compile_threshold_bytes,
        };
        c.apply_slice = (!self.apply_slice.is_zero()).then_some(self.apply_slice);
        c.max_message_bytes = self.max_message_bytes;
        c
    }

    /// The host part of the advertised address, or of the bound one.
    /// The HTTP `host:port` registered for peers and tools: the bound one, unless it
    /// is a wildcard address (0.0.0.0, ::), which names no machine; then the advertised
    /// host with the bound port.
    pub fn advertised_http(&self, grpc_bound: SocketAddr, http_bound: SocketAddr) -> String {
        if !http_bound.ip().is_unspecified() {
            return http_bound.to_string();
        }
        let host = self.advertised_host(grpc_bound);
        if host.contains(':') {
            format!("[{host}]:{}", http_bound.port())
        } else {
            format!("{host}:{}", http_bound.port())
        }
    }

    pub fn advertised_host(&self, bound: SocketAddr) -> String {
        match &self.advertise {
            Some(a) => a
                .rsplit_once(':')
                .map(|(h, _)| h.trim_matches(['[', ']']).to_string())
                .unwrap_or_else(|| a.clone()),
            None => bound.ip().to_string(),
        }
    }
}

/// A `host:port` with a non-zero port.
fn check_host_port(what: &str, addr: &str) -> Result<(), ConfigError> {
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    if ok {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "{what} address {addr:?} must be HOST:PORT with a port other than 0"
        )))
    }
}

fn toml_from_str(text: &str) -> Result<NodeConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError(format!("config file: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_overrides_defaults_and_unknown_keys_are_refused() {
        let c = NodeConfig::from_toml("name = \"ds1\"\nlock_timeout = \"250ms\"\n").unwrap();
        assert_eq!(c.name, "ds1");
        assert_eq!(c.lock_timeout, Duration::from_millis(250));
        assert_eq!(c.listen, NodeConfig::default().listen);
        let err = NodeConfig::from_toml("nmae = \"x\"").unwrap_err();
        assert!(err.0.contains("nmae"), "{err}");
    }

    #[test]
    fn validate_explains_bad_combinations() {
        let mut c = NodeConfig {
            name: "good".into(),
            ..NodeConfig::default()
        };
        // Secure by default: certificates, or --insecure said out loud.
        let e = c.validate().unwrap_err().0;
        assert!(e.contains("--certs-dir") && e.contains("--insecure"), "{e}");
        c.certs_dir = Some(PathBuf::from("certs"));
        c.insecure = true;
        assert!(c.validate().unwrap_err().0.contains("choose one"));
        c.certs_dir = None;
        c.name = "1bad".into();
        assert!(c.validate().unwrap_err().0.contains("identifier"));
        c.name = "good".into();
        c.http = c.listen;
        assert!(c.validate().unwrap_err().0.contains("different ports"));
        c.http = SocketAddr::from(([127, 0, 0, 1], 0));
        assert_eq!(c.validate(), Ok(()));

        c.join = vec!["127.0.0.1:7420".into(), "nohost".into()];
        assert!(c.validate().unwrap_err().0.contains("\"nohost\""));
        c.join = vec!["n1:7420".into()];
        c.advertise = Some("n2:0".into());
        assert!(c.validate().unwrap_err().0.contains("advertise"));
        c.advertise = None;
        c.listen = SocketAddr::from(([0, 0, 0, 0], 7420));
        assert!(c.validate().unwrap_err().0.contains("--advertise"));
        c.advertise = Some("n2.example:7420".into());
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.advertised_host(c.listen), "n2.example");

        c.raft_election_min = c.raft_heartbeat;
        assert!(c.validate().unwrap_err().0.contains("raft_heartbeat"));
        c.raft_election_min = Duration::from_millis(300);
        c.raft_election_max = Duration::from_millis(300);
        assert!(c.validate().unwrap_err().0.contains("raft_election_max"));
        c.raft_election_max = Duration::from_millis(600);
        c.raft_snapshot_every = 0;
        assert!(c.validate().unwrap_err().0.contains("raft_snapshot_every"));
        c.raft_snapshot_every = 1000;

        c.threads = MAX_THREADS + 1;
        assert!(c.validate().unwrap_err().0.contains("threads 1025"));
        c = NodeConfig::from_toml("threads = 1\ninsecure = true\n").unwrap();
        assert_eq!((c.threads, c.validate()), (1, Ok(())));
    }

    #[test]
    fn transparent_huge_pages_read_from_toml_and_text_and_default_to_off() {
        assert_eq!(NodeConfig::default().transparent_huge_pages, HugePages::Off);
        let c = NodeConfig::from_toml("transparent_huge_pages = \"system\"\n").unwrap();
        assert_eq!(c.transparent_huge_pages, HugePages::System);
        assert_eq!(" OFF".parse::<HugePages>(), Ok(HugePages::Off));
        let err = NodeConfig::from_toml("transparent_huge_pages = \"always\"\n").unwrap_err();
        assert!(err.0.contains("off or system"), "{err}");
        let text = toml::to_string(&c).unwrap();
        assert!(
            text.contains("transparent_huge_pages = \"system\""),
            "{text}"
        );
        assert_eq!(NodeConfig::from_toml(&text).unwrap(), c);
    }

    #[test]
    fn the_cpu_class_reads_from_toml_and_text_and_defaults_to_normal() {
        assert_eq!(NodeConfig::default().cpu_class, CpuClass::Normal);
        let c = NodeConfig::from_toml("cpu_class = \"idle\"\n").unwrap();
        assert_eq!(c.cpu_class, CpuClass::Idle);
        assert_eq!(" IDLE".parse::<CpuClass>(), Ok(CpuClass::Idle));
        let err = NodeConfig::from_toml("cpu_class = \"batch\"\n").unwrap_err();
        assert!(
            err.0.contains("\"batch\"") && err.0.contains("normal or idle"),
            "{err}"
        );
        let text = toml::to_string(&c).unwrap();
        assert!(text.contains("cpu_class = \"idle\""), "{text}");
        assert_eq!(NodeConfig::from_toml(&text).unwrap(), c);
    }

    #[test]
    fn the_compression_codec_reads_from_toml_and_text_and_defaults_to_lz4() {
        assert_eq!(NodeConfig::default().compress_codec, CompressCodec::Lz4);
        let c = NodeConfig::from_toml("compress_codec = \"zstd\"\n").unwrap();
        assert_eq!(c.compress_codec.compression(), Compression::Zstd);
        assert_eq!(c.compress_codec.zstd_level(), 3);
        let c = NodeConfig::from_toml("compress_codec = \"zstd:9\"\n").unwrap();
        assert_eq!(c.compress_codec, CompressCodec::Zstd { level: 9 });
        let err = NodeConfig::from_toml("compress_codec = \"gzip\"\n").unwrap_err();
        assert!(err.0.contains("gzip"), "{err}");
        assert_eq!(
            "ZSTD".parse::<CompressCodec>(),
            Ok(CompressCodec::Zstd { level: 3 })
        );
        assert_eq!(" lz4".parse::<CompressCodec>(), Ok(CompressCodec::Lz4));
        assert_eq!(
            "zstd:19".parse::<CompressCodec>(),
            Ok(CompressCodec::Zstd { level: 19 })
        );
        let err = "snappy".parse::<CompressCodec>().unwrap_err();
        assert!(
            err.0.contains("\"snappy\"") && err.0.contains("lz4, zstd or zstd:LEVEL"),
            "{err}"
        );
        for bad in ["zstd:0", "zstd:20", "zstd:x", "zstd:"] {
            let err = bad.parse::<CompressCodec>().unwrap_err();
            assert!(err.0.contains("from 1 to 19"), "{bad}: {err}");
        }
        assert!("lz4:1"
            .parse::<CompressCodec>()
            .unwrap_err()
            .0
            .contains("no level"));
        // Written back as read.
        let c = NodeConfig {
            compress_codec: CompressCodec::Zstd { level: 7 },
            ..NodeConfig::default()
        };
        let text = toml::to_string(&c).unwrap();
        assert!(text.contains("compress_codec = \"zstd:7\""), "{text}");
        assert_eq!(NodeConfig::from_toml(&text).unwrap(), c);
    }

    #[test]
    fn raft_timing_reads_from_toml() {
        let c = NodeConfig::from_toml(
            "join = [\"a:1\", \"b:2\"]\nraft_heartbeat = \"50ms\"\nraft_snapshot_every = 3\n",
        )
        .unwrap();
        assert_eq!(c.join, ["a:1", "b:2"]);
        assert_eq!(c.raft_heartbeat, Duration::from_millis(50));
        assert_eq!(c.raft_snapshot_every, 3);
    }

    #[test]
    fn compilation_settings_reach_the_receiver_and_zero_thresholds_are_refused() {
        let c = NodeConfig::from_toml(
            "compile = false\ncompile_threshold_txns = 500\ncompile_threshold_bytes = 4096\n",
        )
        .unwrap();
        let r = c.receiver_config(Ident::unquoted("ds1"));
        assert_eq!(
            r.compile,
            CompilePolicy {
                enabled: false,
                min_transactions: 500,
                min_bytes: 4096
            }
        );
        assert_eq!(
            NodeConfig::default()
                .receiver_config(Ident::unquoted("ds1"))
                .compile,
            CompilePolicy::default()
        );
        let zero = NodeConfig {
            compile_threshold_bytes: 0,
            insecure: true,
            ..NodeConfig::default()
        };
        assert!(zero.validate().unwrap_err().0.contains("compile = false"));
    }

    #[test]
    fn the_apply_slice_reaches_the_receiver_and_zero_turns_pacing_off() {
        let default = NodeConfig::default().receiver_config(Ident::unquoted("ds1"));
        assert_eq!(default.apply_slice, Some(DEFAULT_APPLY_SLICE));
        let set = NodeConfig::from_toml("apply_slice = \"200us\"\n").unwrap();
        assert_eq!(
            set.receiver_config(Ident::unquoted("ds1")).apply_slice,
            Some(Duration::from_micros(200))
        );
        let off = NodeConfig::from_toml("apply_slice = \"0s\"\n").unwrap();
        assert_eq!(
            off.receiver_config(Ident::unquoted("ds1")).apply_slice,
            None
        );
    }

    #[test]
    fn a_joining_node_on_a_wildcard_address_must_say_how_it_is_reached() {
        let c = NodeConfig {
            insecure: true,
            listen: "0.0.0.0:7420".parse().unwrap(),
            join: vec!["seed:7420".into()],
            ..NodeConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--advertise"), "{e}");
        let c = NodeConfig {
            advertise: Some("n1.example:7420".into()),
            ..c
        };
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_wildcard_http_address_is_registered_under_the_advertised_host() {
        let bound = |a: &str| a.parse::<SocketAddr>().unwrap();
        let mut c = NodeConfig {
            advertise: Some("hawser-0.hawser:7420".into()),
            ..NodeConfig::default()
        };
        let grpc = bound("0.0.0.0:7420");
        assert_eq!(
            c.advertised_http(grpc, bound("0.0.0.0:7421")),
            "hawser-0.hawser:7421"
        );
        assert_eq!(
            c.advertised_http(grpc, bound("10.0.0.5:7421")),
            "10.0.0.5:7421"
        );
        c.advertise = Some("[fd00::5]:7420".into());
        assert_eq!(
            c.advertised_http(grpc, bound("[::]:7421")),
            "[fd00::5]:7421"
        );
    }
}
