//! One demo node: `hawser start` run as a child process of this same binary.
//!
//! The child listens on free loopback ports (port 0; its ready line tells the real
//! ones), writes its log to a file beside its data directory, and is put in a process
//! group of its own so that a Ctrl-C in the terminal reaches the demo only: the demo
//! then stops its nodes itself, in order, with SIGTERM. Whatever happens, a
//! [`ChildNode`] that is dropped while its process runs sends it SIGKILL — the last
//! line of defence on an error or a panic.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use hawser_client::Client;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a node may take from spawn to its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Deadline of every call the demo makes to a node.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A `hawser start` child process and how to reach it.
pub(crate) struct ChildNode {
    /// Store name (`ds1`, ...), as the replication scheme names it.
    pub(crate) name: String,
    pub(crate) node_id: u64,
    pub(crate) grpc: String,
    pub(crate) http: String,
    /// The node's stderr.
    pub(crate) log: PathBuf,
    /// A connection to the node, cloned for each call.
    pub(crate) client: Client,
    child: Option<Child>,
}

impl ChildNode {
    /// Starts `hawser start --name NAME` with its data in `data_dir` (joining the
    /// cluster through `join` unless empty) and waits, bounded, for its ready line.
    pub(crate) async fn start(name: &str, data_dir: &Path, join: &[&str]) -> anyhow::Result<Self> {
        Self::start_at(name, data_dir, join, "127.0.0.1:0").await
    }

    /// [`ChildNode::start`] with the gRPC server on `listen`: a node started again on
    /// its data keeps its address, which the Raft membership names. Its log is
    /// appended to.
    pub(crate) async fn start_at(
        name: &str,
        data_dir: &Path,
        join: &[&str],
        listen: &str,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locate the hawser binary")?;
        let log = data_dir.with_extension("log");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("open the log file {}", log.display()))?;
        let mut cmd = Command::new(exe);
        // --exit-with-parent: the nodes stop even if the demo itself is SIGKILLed.
        // The demo's certificates sit beside its nodes' data directories.
        let certs = data_dir
            .parent()
            .context("a node's data directory has a parent")?
            .join(super::CERTS);
        cmd.args(["start", "--name", name, "--exit-with-parent"])
            .args(["--listen", listen, "--http", "127.0.0.1:0"])
            .arg("--data")
            .arg(data_dir)
            .arg("--certs-dir")
            .arg(certs);
        if !join.is_empty() {
            cmd.arg("--join").arg(join.join(","));
        }
        // The demo's nodes are configured by the demo alone: a HAWSER_JOIN or
        // HAWSER_CONFIG left in the user's environment must not reach them.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HAWSER_") {
                cmd.env_remove(key);
            }
        }
        // A process group of its own: the terminal's Ctrl-C reaches the demo, which
        // stops its nodes itself.
        #[cfg(unix)]
        cmd.process_group(0);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {name}"))?;
        let stdout = child.stdout.take().context("the child's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = match tokio::time::timeout(READY_TIMEOUT, lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => bail!(
                "{name} exited before it was ready; its log is {}",
                log.display()
            ),
            Ok(Err(e)) => return Err(e).with_context(|| format!("read {name}'s ready line")),
            Err(_) => bail!(
                "{name} was not ready within {READY_TIMEOUT:?}; its log is {}",
                log.display()
            ),
        };
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                .map(str::to_string)
        };
        let (Some(grpc), Some(http), Some(node_id)) =
            (field("grpc"), field("http"), field("node_id"))
        else {
            bail!("unexpected ready line from {name}: {line:?}");
        };
        let node_id = node_id
            .parse()
            .with_context(|| format!("node id in {line:?}"))?;
        let client = Client::connect_with_timeout(&grpc, CALL_TIMEOUT)
            .await
            .with_context(|| format!("connect to {name} at {grpc}"))?;
        Ok(ChildNode {
            name: name.to_string(),
            node_id,
            grpc,
            http,
            log,
            client,
            child: Some(child),
        })
    }

    /// How the process ended, if it has.
    pub(crate) fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// SIGKILL, as a crash would: no flush, no goodbye to the peers.
    pub(crate) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // kill() also reaps the process.
            let _ = child.kill().await;
        }
    }

    /// Sends SIGTERM, so the node stops cleanly (flushes, leaves its ports).
    pub(crate) fn terminate(&self) {
        let Some(pid) = self.child.as_ref().and_then(Child::id) else {
            return;
        };
        // tokio can only SIGKILL; `kill` is on every Unix. If the process is already
        // gone or this fails, wait_or_kill falls back to SIGKILL.
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Waits until the process has exited, at most `timeout`, then SIGKILLs it.
    /// Returns whether it stopped on its own.
    pub(crate) async fn wait_or_kill(&mut self, timeout: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(_) => true,
            Err(_) => {
                // kill() also reaps the process.
                let _ = child.kill().await;
                false
            }
        }
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            // kill_on_drop would do it too; saying so here keeps the guarantee visible.
            let _ = child.start_kill();
        }
    }
}
