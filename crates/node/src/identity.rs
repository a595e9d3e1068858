//! The node's identity, kept in its data directory.
//!
//! A node picks a random [`NodeId`] the first time it starts and writes it, with its
//! store name, to `identity.toml` before it opens its database. Restarted on the same
//! directory it keeps both, so a node's transactions keep one origin for life. A data
//! directory started under a different name is refused rather than renamed: the
//! database in it belongs to the other store.

use std::fs;
use std::io::Write;
use std::path::Path;

use hawser_core::NodeId;
use serde::{Deserialize, Serialize};

use crate::NodeError;

const FILE: &str = "identity.toml";

#[derive(Debug, Serialize, Deserialize)]
struct Identity {
    node_id: u64,
    name: String,
}

/// Loads the identity in `dir`, or creates one for `name`.
pub fn load_or_create(dir: &Path, name: &str) -> Result<NodeId, NodeError> {
    let path = dir.join(FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let id: Identity = toml::from_str(&text).map_err(|e| {
                NodeError::Identity(format!(
                    "{} is not a valid identity file: {e}",
                    path.display()
                ))
            })?;
            if id.name != name {
                return Err(NodeError::Identity(format!(
                    "data directory {} belongs to store {:?}, not {:?}; start with --name {} \
                     or use another --data directory",
                    dir.display(),
                    id.name,
                    name,
                    id.name
                )));
            }
            Ok(NodeId(id.node_id))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Never 0, so 0 can mean "unknown" on the wire.
            let node_id = rand::random::<u64>().max(1) >> 1;
            let text = toml::to_string(&Identity {
                node_id,
                name: name.to_string(),
            })
            .map_err(|e| NodeError::Identity(e.to_string()))?;
            // Write to a temporary file, fsync, then rename: a crash leaves either no
            // identity or a whole one.
            let tmp = dir.join(format!("{FILE}.tmp"));
            let io = |e: std::io::Error| {
                NodeError::Identity(format!("cannot write {}: {e}", path.display()))
            };
            let mut f = fs::File::create(&tmp).map_err(io)?;
            f.write_all(text.as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            fs::rename(&tmp, &path).map_err(io)?;
            if let Ok(d) = fs::File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(NodeId(node_id))
        }
        Err(e) => Err(NodeError::Identity(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_survives_restart_and_refuses_another_name() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path(), "ds1").unwrap();
        assert_eq!(load_or_create(dir.path(), "ds1").unwrap(), a);
        let err = load_or_create(dir.path(), "ds2").unwrap_err().to_string();
        assert!(err.contains("belongs to store \"ds1\""), "{err}");
    }
}
