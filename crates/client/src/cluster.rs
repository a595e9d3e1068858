//! [`ClusterClient`]: writes that follow an element's master through failovers.
//!
//! ```text
//!  write(ops) ── master of ops[0]'s table (learned from Admin.Status) ── Client::write
//!      │ refused before it could commit: 25006 (not the master here; the error's
//!      │ hawser-master metadata says where), 57P03 (no master lease now, no leader),
//!      │ connection refused
//!      └─► learn the masters again from every node that answers (per table, the
//!          master under the highest epoch), back off, try again, for at most
//!          `retry_for`
//!  anything else, and any error after the request may have reached a master (the
//!  connection lost mid-call, 08007 outcome unknown) ─► returned as is: retrying could
//!  apply the write twice
//! ```
//!
//! A write is retried only when the node certainly did not commit it, so a write that
//! was acknowledged is never applied twice by a retry. (Request ids that would let an
//! ambiguous write be retried too are not built yet.)

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::{sqlstate, Client, ClientError, RowOp, WriteOutcome};

/// The longest pause between two tries: about one liveness report interval, so a
/// client notices a new master (or lease) within one after the cluster has it. A try
/// costs a status call and a write.
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The longest a refresh waits for any one node's status: a node stopped (SIGSTOP) or
/// cut off accepts connections and never answers.
const REFRESH_CALL: Duration = Duration::from_secs(1);

/// What to do after a failed write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retry {
    /// Not committed, and another node masters the table: try there (the address when
    /// the error named it), after learning the masters again.
    Redirect(Option<String>),
    /// Not committed, and it may succeed shortly (no lease, no leader, node down).
    Later,
    /// Committed, refused for good, or unknown: do not retry.
    Never,
}

/// How `err` from a write should be handled (pure: what the error proves).
pub fn classify(err: &ClientError) -> Retry {
    match err {
        // Nothing was sent.
        ClientError::Connect { .. } => Retry::Later,
        ClientError::Status(s) => match sqlstate(s) {
            Some("25006") => Retry::Redirect(
                s.metadata()
                    .get("hawser-master")
                    .and_then(|v| v.to_str().ok())
                    .map(String::from),
            ),
            Some("57P03") => Retry::Later,
            Some(_) => Retry::Never,
            // A connection that could not be made (the node is down): the request was
            // never sent. Any other transport failure may have happened after it was.
            None if s.code() == tonic::Code::Unavailable
                && (s.message().contains("tcp connect error")
                    || s.message().contains("error trying to connect")) =>
            {
                Retry::Later
            }
            None => Retry::Never,
        },
        _ => Retry::Never,
    }
}

/// A client of a whole cluster that sends each write to its table's master.
pub struct ClusterClient {
    /// Addresses to learn the cluster from: the seeds, then every node seen.
    known: Vec<String>,
    /// Table name → the gRPC address of its master.
    masters: HashMap<String, String>,
    conns: HashMap<String, Client>,
    /// Connections status requests are asked on, kept apart from the writes' (see
    /// [`ClusterClient::refresh`]) so that a refresh does not open new ones each time.
    status_conns: HashMap<String, Client>,
    timeout: Duration,
    /// How long a write keeps trying while the error proves it did not commit.
    pub retry_for: Duration,
}

impl ClusterClient {
    /// A client that learns the cluster from `seeds` (`host:port`), with `timeout` per
    /// call; writes keep trying for 30 s.
    pub async fn connect(seeds: &[String], timeout: Duration) -> Result<Self, ClientError> {
        let mut c = ClusterClient {
            known: seeds.to_vec(),
            masters: HashMap::new(),
            conns: HashMap::new(),
            status_conns: HashMap::new(),
            timeout,
            retry_for: Duration::from_secs(30),
        };
        c.refresh().await?;
        Ok(c)
    }

    /// The master of `table` as last learned.
    pub fn master_of(&self, table: &str) -> Option<&str> {
        self.masters.get(table).map(String::as_str)
    }

    /// Learns every TABLE element's master, and the nodes, from every known node that
    /// answers: per table, the master the newest view names (the element's highest
    /// epoch), so a node cut off from the cluster, which still names itself, is passed
    /// over once another node knows of the failover.
    pub async fn refresh(&mut self) -> Result<(), ClientError> {
        // Every known node at once, each bounded: a stopped or unreachable node must not
        // hold the others' answers back.
        let wait = self.timeout.min(REFRESH_CALL);
        let mut calls = tokio::task::JoinSet::new();
        for addr in self.known.clone() {
            let cached = self.status_conns.get(&addr).cloned();
            calls.spawn(async move {
                let asked = tokio::time::timeout(wait, async {
                    let mut c = match cached {
                        Some(c) => c,
                        None => Client::connect_with_timeout(&addr, wait).await?,
                    };
                    let status = c.status().await?;
                    Ok::<_, ClientError>((c, status))
                })
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::Status(tonic::Status::deadline_exceeded(
                        format!("{addr} did not answer a status request within {wait:?}"),
                    )))
                });
                (addr, asked)
            });
        }
        let mut last = None;
        // Table → (epoch, master address).
        let mut newest: HashMap<String, (u64, String)> = HashMap::new();
        let mut answered = false;
        while let Some(joined) = calls.join_next().await {
            let Ok((addr, asked)) = joined else { continue };
            // Kept for the next refresh, never for writes: a write on a kept
            // connection to a node that died since fails with an outcome it cannot
            // tell (the request may have left), where a fresh connect is refused
            // before anything is sent.
            let status = match asked {
                Ok((client, status)) => {
                    self.status_conns.insert(addr, client);
                    status
                }
                Err(e) => {
                    self.status_conns.remove(&addr);
                    last = Some(e);
                    continue;
                }
            };
            let Some(cluster) = status.cluster else {
                continue;
            };
            answered = true;
            for e in cluster.schemes.iter().flat_map(|s| s.elements.iter()) {
                if e.table.is_empty() || e.master_addr.is_empty() || e.owner_role != "MASTER" {
                    continue;
                }
                let seen = newest.entry(e.table.clone()).or_insert((0, String::new()));
                if seen.1.is_empty() || e.epoch > seen.0 {
                    *seen = (e.epoch, e.master_addr.clone());
                }
            }
            for n in cluster.nodes {
                if !self.known.contains(&n.grpc_addr) {
                    self.known.push(n.grpc_addr);
                }
            }
        }
        if answered {
            self.masters = newest.into_iter().map(|(t, (_, a))| (t, a)).collect();
            return Ok(());
        }
        Err(last.unwrap_or_else(|| {
            ClientError::Status(tonic::Status::unavailable("no seed address to ask"))
        }))
    }

    async fn conn(&mut self, addr: &str) -> Result<&mut Client, ClientError> {
        if !self.conns.contains_key(addr) {
            let c = Client::connect_with_timeout(addr, self.timeout).await?;
            self.conns.insert(addr.to_string(), c);
        }
        Ok(self.conns.get_mut(addr).expect("inserted above"))
    }

    /// Applies `ops` as one transaction on the master of the first operation's table,
    /// following the master while the errors prove nothing was committed.
    pub async fn write(&mut self, ops: Vec<RowOp>) -> Result<WriteOutcome, ClientError> {
        let table = match ops.first() {
            Some(RowOp::Insert { table, .. })
            | Some(RowOp::Upsert { table, .. })
            | Some(RowOp::Delete { table, .. }) => table.clone(),
            None => {
                return Err(ClientError::Status(tonic::Status::invalid_argument(
                    "a write needs at least one operation",
                )))
            }
        };
        let deadline = Instant::now() + self.retry_for;
        let mut backoff = Duration::from_millis(20);
        let mut target: Option<String> = None;
        loop {
            let addr = match target.take().or_else(|| self.masters.get(&table).cloned()) {
                Some(a) => a,
                None => self.known.first().cloned().unwrap_or_default(),
            };
            let result = match self.conn(&addr).await {
                Ok(c) => c.write(ops.clone()).await,
                Err(e) => Err(e),
            };
            let err = match result {
                Ok(out) => return Ok(out),
                Err(e) => e,
            };
            let retry = classify(&err);
            if retry == Retry::Never || Instant::now() >= deadline {
                return Err(err);
            }
            if !matches!(&err, ClientError::Status(s) if sqlstate(s).is_some()) {
                // The node did not answer: connect afresh when it is tried again.
                self.conns.remove(&addr);
            }
            // Learn the masters again (an unreachable cluster leaves the old view).
            let _ = self.refresh().await;
            if let Retry::Redirect(Some(to)) = retry {
                target = Some(to);
                continue;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, state: Option<&str>, master: Option<&str>) -> ClientError {
        let mut s = tonic::Status::new(code, "refused");
        if let Some(state) = state {
            s.metadata_mut()
                .insert("hawser-sqlstate", state.parse().unwrap());
        }
        if let Some(m) = master {
            s.metadata_mut().insert("hawser-master", m.parse().unwrap());
        }
        ClientError::Status(s)
    }

    #[test]
    fn only_errors_that_prove_nothing_committed_are_retried() {
        use tonic::Code;
        assert_eq!(
            classify(&status(
                Code::InvalidArgument,
                Some("25006"),
                Some("10.0.0.2:7420")
            )),
            Retry::Redirect(Some("10.0.0.2:7420".into()))
        );
        assert_eq!(
            classify(&status(Code::InvalidArgument, Some("25006"), None)),
            Retry::Redirect(None)
        );
        assert_eq!(
            classify(&status(Code::Unavailable, Some("57P03"), None)),
            Retry::Later
        );
        // Committed here but not acknowledged: never again.
        assert_eq!(
            classify(&status(Code::Unknown, Some("08007"), None)),
            Retry::Never
        );
        assert_eq!(
            classify(&status(Code::InvalidArgument, Some("23505"), None)),
            Retry::Never
        );
        // The connection broke mid-call: the write may have committed.
        assert_eq!(
            classify(&ClientError::Status(tonic::Status::unavailable(
                "error reading a body from connection: connection reset"
            ))),
            Retry::Never
        );
        assert_eq!(
            classify(&ClientError::Status(tonic::Status::unavailable(
                "tcp connect error: Connection refused (os error 111)"
            ))),
            Retry::Later
        );
    }
}
