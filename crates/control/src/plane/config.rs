//! [`ControlConfig`]: one node's control-plane settings, their defaults and checks,
//! and the openraft configuration made from them.

use std::time::Duration;

use hawser_core::{Ident, NodeId};
use openraft::{Config, SnapshotPolicy};

use super::PlaneError;
use crate::failover::FailoverSettings;
use crate::state::NodeInfo;

/// Settings of one node's control plane. [`ControlConfig::new`] fills in the defaults.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    pub node_id: NodeId,
    /// What this node calls its peers with when the cluster runs secure: the cluster's
    /// CA and this node's certificate (`None`: plain HTTP/2).
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// This node's database name in replication schemes.
    pub store_name: Ident,
    /// The advertised host name.
    pub host: String,
    /// `host:port` where peers reach this node's gRPC server (and the peer service).
    pub grpc_addr: String,
    /// `host:port` of this node's HTTP server.
    pub http_addr: String,
    /// Leader heartbeat; also openraft's deadline for an AppendEntries call.
    pub heartbeat_interval: Duration,
    /// Election timeout range; a vote call's deadline is the minimum.
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Deadline of one snapshot chunk.
    pub install_snapshot_timeout: Duration,
    /// Deadline of a call this node makes on behalf of a caller (join, forwarded
    /// proposal, remove); a join waits for the new learner to catch up within it.
    pub request_timeout: Duration,
    /// How often to retry a peer that could not be reached.
    pub unreachable_backoff: Duration,
    /// Build a snapshot after this many applied entries.
    pub snapshot_every: u64,
    /// Entries kept in the log behind the last snapshot (for followers slightly behind).
    pub max_in_snapshot_log_to_keep: u64,
    /// Joining nodes become voters until there are this many; learners after.
    pub max_voters: usize,
    /// How often this node reports its liveness and marks to the Raft leader.
    pub report_interval: Duration,
    /// How long a master lease lasts, from when its holder sent the report that
    /// earned it. Must be shorter than the failover timeout (docs/control.md,
    /// "Failover timing").
    pub master_lease: Duration,
    /// When the leader decides failovers, and whom it promotes.
    pub failover: FailoverSettings,
    /// Joining, take the place of a silent member registered under this node's store
    /// name ([`crate::replace`]; `hawser start --replace`).
    pub replace: bool,
}

impl ControlConfig {
    /// A configuration with hawser's defaults: 100 ms heartbeat, 300–600 ms election
    /// timeout (about one second from a leader's death to a new leader on a LAN).
    pub fn new(
        node_id: NodeId,
        store_name: Ident,
        host: impl Into<String>,
        grpc_addr: impl Into<String>,
        http_addr: impl Into<String>,
    ) -> Self {
        Self {
            node_id,
            tls: None,
            store_name,
            host: host.into(),
            grpc_addr: grpc_addr.into(),
            http_addr: http_addr.into(),
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(300),
            election_timeout_max: Duration::from_millis(600),
            install_snapshot_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            unreachable_backoff: Duration::from_millis(200),
            snapshot_every: 1000,
            max_in_snapshot_log_to_keep: 1000,
            max_voters: 5,
            report_interval: Duration::from_millis(100),
            master_lease: Duration::from_millis(500),
            failover: FailoverSettings {
                enabled: true,
                failover_timeout: Duration::from_millis(1000),
                candidate_fresh: Duration::from_millis(500),
                max_lag: None,
            },
            replace: false,
        }
    }

    /// How long a member must have been silent before a node joining with `replace`
    /// takes its place: the failover timeout, and never under ten reports' time.
    pub fn replace_after(&self) -> Duration {
        self.failover
            .failover_timeout
            .max(self.report_interval * 10)
    }

    /// The longest a leader may have gone without hearing from a quorum and still
    /// grant a lease: the minimum election timeout. Any lease it grants then ends
    /// before a successor elected without it can fail the master over, because the
    /// successor's takeover credit is computed from it
    /// ([`ControlConfig::takeover_credit`]; docs/control.md, "Failover timing"). A
    /// window close to the heartbeat would stop grants on a loaded machine while the
    /// quorum is fine.
    pub fn lease_quorum_age(&self) -> Duration {
        self.election_timeout_min
    }

    /// How much of the failover timeout a newly elected leader may count as already
    /// passed: it was elected at least `election_timeout_min` after its predecessor's
    /// last quorum acknowledgement Q, and every lease that predecessor granted ends by
    /// Q + [`ControlConfig::lease_quorum_age`] + the lease. Deciding at failover timeout
    /// minus this credit after taking over keeps one report interval of margin past
    /// that (docs/control.md, "Failover timing").
    pub fn takeover_credit(&self) -> Duration {
        (self.failover.failover_timeout + self.election_timeout_min)
            .saturating_sub(self.lease_quorum_age() + self.master_lease + self.report_interval)
            .min(self.failover.failover_timeout)
    }

    /// Explains a bad combination of settings.
    pub fn validate(&self) -> Result<(), PlaneError> {
        let bad = |m: String| Err(PlaneError::Config(m));
        if self.node_id.0 == 0 {
            return bad("node id 0 is reserved; use 1 or more".into());
        }
        if self.election_timeout_min <= self.heartbeat_interval {
            return bad(format!(
                "election timeout minimum {:?} must exceed the heartbeat interval {:?}",
                self.election_timeout_min, self.heartbeat_interval
            ));
        }
        if self.election_timeout_max <= self.election_timeout_min {
            return bad(format!(
                "election timeout maximum {:?} must exceed its minimum {:?}",
                self.election_timeout_max, self.election_timeout_min
            ));
        }
        if self.max_voters == 0 {
            return bad("max_voters must be at least 1".into());
        }
        if self.snapshot_every == 0 {
            return bad("snapshot_every must be at least 1".into());
        }
        if self.report_interval.is_zero() {
            return bad("the report interval must be at least 1ms".into());
        }
        if self.master_lease < self.report_interval * 2 {
            return bad(format!(
                "the master lease {:?} must be at least twice the report interval {:?}, or \
                 a master loses its lease between two reports",
                self.master_lease, self.report_interval
            ));
        }
        if self.failover.failover_timeout < self.master_lease + self.report_interval {
            return bad(format!(
                "the failover timeout {:?} must be at least the master lease {:?} plus the \
                 report interval {:?}: a master must have stopped taking writes before \
                 another is promoted",
                self.failover.failover_timeout, self.master_lease, self.report_interval
            ));
        }
        Ok(())
    }

    pub(super) fn raft_config(&self) -> Result<Config, PlaneError> {
        let ms = |d: Duration| d.as_millis() as u64;
        let config = Config {
            cluster_name: "hawser".into(),
            heartbeat_interval: ms(self.heartbeat_interval),
            election_timeout_min: ms(self.election_timeout_min),
            election_timeout_max: ms(self.election_timeout_max),
            install_snapshot_timeout: ms(self.install_snapshot_timeout),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.max_in_snapshot_log_to_keep,
            // JSON encodes bytes several times larger; keep a chunk well under
            // MAX_MESSAGE_BYTES.
            snapshot_max_chunk_size: 1024 * 1024,
            ..Config::default()
        };
        config
            .validate()
            .map_err(|e| PlaneError::Config(e.to_string()))
    }

    pub(super) fn node_info(&self) -> NodeInfo {
        NodeInfo {
            id: self.node_id,
            store: self.store_name.clone(),
            host: self.host.clone(),
            grpc_addr: self.grpc_addr.clone(),
            http_addr: self.http_addr.clone(),
            voter: false,
        }
    }
}
