//! The node's configuration: one typed struct, defaults defined once here.
//!
//! The binary fills it from (lowest to highest precedence) these defaults, a TOML file
//! (`--config`), `HAWSER_*` environment variables and command-line flags; [`NodeConfig::validate`]
//! then explains any bad combination before anything starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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
        }
    }
}

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
        if self.lock_timeout.is_zero() {
            return Err(ConfigError("lock_timeout must be greater than 0".into()));
        }
        if self.max_message_bytes < 64 * 1024 {
            return Err(ConfigError(format!(
                "max_message_bytes {} is below the minimum of 65536",
                self.max_message_bytes
            )));
        }
        Ok(())
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
            name: "1bad".into(),
            ..NodeConfig::default()
        };
        assert!(c.validate().unwrap_err().0.contains("identifier"));
        c.name = "good".into();
        c.http = c.listen;
        assert!(c.validate().unwrap_err().0.contains("different ports"));
        c.http = SocketAddr::from(([127, 0, 0, 1], 0));
        assert_eq!(c.validate(), Ok(()));
    }
}
