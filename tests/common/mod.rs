//! Harness for end-to-end tests: real `hawser` processes on free ports in temporary
//! directories, killed when the test ends, pass or fail.
//!
//! These files are compiled as integration tests of the `hawser-cli` package (see its
//! Cargo.toml), which is how they get the path of the freshly built binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The `hawser` binary under test.
pub fn hawser_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hawser"))
}

/// A running `hawser start`; SIGKILLed on drop if still running.
pub struct Node {
    child: Option<Child>,
    pub name: String,
    pub data_dir: PathBuf,
    pub grpc: String,
    pub http: String,
    pub node_id: u64,
    log: PathBuf,
    /// The certificates directory it was started with (`--certs-dir`), which its
    /// client commands use too; `None`: it runs `--insecure`.
    pub certs: Option<PathBuf>,
}

/// Why a node did not start: its first line on stdout (or the wait's error), its whole
/// log, and what this start added to it.
struct StartFailure {
    line: Result<String, mpsc::RecvTimeoutError>,
    whole_log: String,
    new_log: String,
}

impl Node {
    /// Starts a node named `name` with its data in `data_dir`, on free ports, and waits
    /// (at most 60 s) for its ready line.
    pub fn start(name: &str, data_dir: &Path) -> Node {
        Self::start_with(name, data_dir, &[])
    }

    pub fn start_with(name: &str, data_dir: &Path, extra: &[&str]) -> Node {
        Self::start_at(name, data_dir, "127.0.0.1:0", extra)
    }

    /// Starts a node whose gRPC server listens on `listen` (a restarted cluster member
    /// must keep its address: the Raft membership names it), with `extra` flags.
    ///
    /// A fixed port is one that an earlier node of the test had from the kernel's
    /// ephemeral range, and while its node is down an outgoing connection may take it as
    /// its local port — a peer reconnecting to that very address can even connect to
    /// itself (seen once under a CPU hog: a restart refused with "Address already in
    /// use"). Such a start is tried again every [`POLL`] for up to 30 s while the port is
    /// taken.
    pub fn start_at(name: &str, data_dir: &Path, listen: &str, extra: &[&str]) -> Node {
        let fixed_port = !listen.ends_with(":0");
        let mut refused = None;
        let started = poll_until(Duration::from_secs(30), || {
            match Self::spawn_at(name, data_dir, listen, extra) {
                Err(f) if fixed_port && f.new_log.contains("Address already in use") => {
                    refused = Some(f);
                    None
                }
                done => Some(done),
            }
        });
        match started.unwrap_or_else(|| Err(refused.expect("tried at least once"))) {
            Ok(node) => node,
            Err(failure) => panic!(
                "node {name} did not become ready ({:?}); log:\n{}",
                failure.line, failure.whole_log
            ),
        }
    }

    /// Starts a node that may refuse to: `Err` with what it logged when it exits (or
    /// does not become ready within 60 s).
    pub fn try_start(name: &str, data_dir: &Path, extra: &[&str]) -> Result<Node, String> {
        Self::spawn_at(name, data_dir, "127.0.0.1:0", extra).map_err(|f| f.new_log)
    }

    fn spawn_at(
        name: &str,
        data_dir: &Path,
        listen: &str,
        extra: &[&str],
    ) -> Result<Node, StartFailure> {
        let log = data_dir.with_extension(format!("{}.log", std::process::id()));
        let logged_before = std::fs::metadata(&log).map_or(0, |m| m.len());
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("create node log");
        // Insecure unless the test gives certificates.
        let certs = extra
            .iter()
            .position(|a| *a == "--certs-dir")
            .and_then(|i| extra.get(i + 1))
            .map(PathBuf::from);
        let mut child = Command::new(hawser_bin())
            .arg("start")
            .args(certs.is_none().then_some("--insecure"))
            .args(["--name", name, "--listen", listen, "--http", "127.0.0.1:0"])
            .arg("--data")
            .arg(data_dir)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .spawn()
            .expect("spawn hawser start");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.starts_with("ready ") => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                let whole_log = std::fs::read_to_string(&log).unwrap_or_default();
                let new_log = whole_log
                    .get(usize::try_from(logged_before).unwrap_or(0)..)
                    .unwrap_or_default()
                    .to_string();
                return Err(StartFailure {
                    line: other,
                    whole_log,
                    new_log,
                });
            }
        };
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                .unwrap_or_else(|| panic!("no {k} in ready line {line:?}"))
                .to_string()
        };
        Ok(Node {
            name: name.into(),
            data_dir: data_dir.into(),
            grpc: field("grpc"),
            http: field("http"),
            node_id: field("node_id").parse().expect("node id"),
            child: Some(child),
            log,
            certs,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL, no chance to flush or clean up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (at most 20 s) for the process to exit; returns its exit
    /// status, or `None` if it had to be killed.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let pid = c.id().to_string();
        let _ = Command::new("kill").arg(&pid).status();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(c.wait());
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = Command::new("kill").args(["-9", &pid]).status();
                None
            }
        }
    }

    /// Waits (at most `timeout`) for the process to exit on its own; `None` if it is
    /// still running then.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut()?;
        let status = poll_until(timeout, || c.try_wait().ok().flatten())?;
        self.child = None;
        Some(status)
    }

    /// `hawser status --format json` of this node.
    pub fn status(&self) -> serde_json::Value {
        let out = self.cli(&["status", "--format", "json"]);
        assert!(out.status.success(), "status failed: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    /// Like [`Node::status`], `None` if the node does not answer.
    pub fn try_status(&self) -> Option<serde_json::Value> {
        let out = self.cli(&["status", "--format", "json"]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `hawser ARGS...` (a client command) and returns its output.
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(hawser_bin());
        cmd.args(args).env("HAWSER_HOST", &self.grpc);
        if let Some(certs) = &self.certs {
            cmd.env("HAWSER_CERTS_DIR", certs);
        }
        cmd.stdin(Stdio::null()).output().expect("run hawser")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// How often [`wait_for`] checks its condition.
pub const POLL: Duration = Duration::from_millis(50);

/// Checks `probe` every [`POLL`] until it gives a value, or `None` once `timeout` passed.
pub fn poll_until<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Like [`poll_until`], but a timeout fails the test naming `what`.
pub fn wait_for<T>(what: &str, timeout: Duration, probe: impl FnMut() -> Option<T>) -> T {
    poll_until(timeout, probe)
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// A blocking HTTP GET on loopback, returning (status code, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect http");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).expect("read http");
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

// ---- clusters ----------------------------------------------------------------------

/// Raft timing for tests: a leader within a few hundred milliseconds.
pub const FAST_RAFT: &[&str] = &[
    "--raft-heartbeat",
    "50ms",
    "--raft-election-min",
    "200ms",
    "--raft-election-max",
    "400ms",
];

/// How long cluster helpers wait for a condition.
pub const CLUSTER_WAIT: Duration = Duration::from_secs(20);

/// Starts node `name` with its data in `dir/name`, gRPC on `listen`, [`FAST_RAFT`],
/// joining through `join` when given, and `extra` flags.
pub fn start_member(
    name: &str,
    dir: &Path,
    listen: &str,
    join: Option<&str>,
    extra: &[&str],
) -> Node {
    let mut args: Vec<&str> = FAST_RAFT.to_vec();
    if let Some(j) = join {
        args.extend(["--join", j]);
    }
    args.extend(extra);
    Node::start_at(name, &dir.join(name), listen, &args)
}

/// The voters `node`'s status lists (0 when it does not answer).
pub fn voters(node: &Node) -> usize {
    node.try_status()
        .and_then(|s| {
            s["cluster"]["nodes"]
                .as_array()
                .map(|n| n.iter().filter(|n| n["membership"] == "voter").count())
        })
        .unwrap_or(0)
}

/// Runs replication DDL on `node`, retrying while the cluster has no leader (57P03);
/// fails the test if the statement fails for good.
pub fn ddl(node: &Node, text: &str) {
    let out = wait_for("DDL accepted or refused for good", CLUSTER_WAIT, || {
        let out = node.cli(&["sql", "-e", text]);
        (!stderr(&out).contains("error[57P03]")).then_some(out)
    });
    assert!(out.status.success(), "{text}: {}", stderr(&out));
}

/// Waits until `node` holds a master lease (a master takes client writes only under
/// one; a restarted one has none until the Raft leader it reports to grants it, and a
/// leader that has not heard from a quorum lately grants none).
pub fn wait_leased(node: &Node) {
    wait_for("a master lease", CLUSTER_WAIT, || {
        let (_, body) = http_get(&node.http, "/replication");
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        v["master_lease"]["remaining_ms"].as_u64().map(|_| ())
    });
}

/// Runs SQL on `node`; fails the test if it fails.
pub fn sql_ok(node: &Node, text: &str) {
    let out = node.cli(&["sql", "-e", text]);
    assert!(
        out.status.success(),
        "{text} on {}: {}",
        node.name,
        stderr(&out)
    );
}

/// The rows of the last result of `query` on `node`, or `None` while it fails (no such
/// table yet, the node not answering).
pub fn query_rows(node: &Node, query: &str) -> Option<serde_json::Value> {
    let (ok, results, _) = sql_json(node, query);
    if !ok {
        return None;
    }
    results.last().map(|r| r["rows"].clone())
}

/// Runs SQL on `node` with JSON output: (success, one JSON result per statement that
/// ran, stderr).
pub fn sql_json(node: &Node, text: &str) -> (bool, Vec<serde_json::Value>, String) {
    let out = node.cli(&["sql", "--format", "json", "-e", text]);
    let results = stdout(&out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (out.status.success(), results, stderr(&out))
}

/// Request bytes as they are, for sending what no generated client would.
#[derive(Clone, Copy)]
pub struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}
