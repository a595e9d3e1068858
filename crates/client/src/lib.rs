//! A typed client for hawser's gRPC API, used by the CLI, the tests, the chaos tools and
//! the benchmarks.
//!
//! ```no_run
//! # async fn demo() -> Result<(), hawser_client::ClientError> {
//! let mut client = hawser_client::Client::connect("127.0.0.1:7420").await?;
//! let out = client.execute("select count(*) from dual").await?;
//! println!("{:?}", out.results[0].rows);
//! # Ok(()) }
//! ```
//!
//! Every call has a deadline (the `timeout` given at connect, 30 s by default): a dead
//! or partitioned node gives an error instead of a hang.

pub mod cluster;
pub mod drill;
pub mod history;

use std::time::Duration;

pub use cluster::ClusterClient;
use hawser_core::{Row, Value};
use hawser_proto::v1::{self, admin_client::AdminClient, client_client::ClientClient};
use hawser_proto::{row_from_pb, row_to_pb, ConvertError};
use thiserror::Error;
use tokio::sync::mpsc;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig};

pub use hawser_proto::v1::{
    ClusterNode, ClusterRemoval, ClusterStatus, ElementStatus, InitResponse, SchemeDdl,
    SchemeStatus, ShowSchemesResponse, StatusResponse, Warning,
};

/// Largest message the client sends or accepts.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// What can go wrong talking to a node.
#[derive(Debug, Error)]
pub enum ClientError {
    #[error(
        "the token is not one line of printable text (as `hawser cert create-token` prints it)"
    )]
    BadToken,
    #[error("bad address {addr:?}: {source}")]
    BadAddress {
        addr: String,
        source: tonic::transport::Error,
    },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: tonic::transport::Error,
    },
    /// The server answered with a gRPC error status.
    #[error("{}", status_text(.0))]
    Status(#[from] tonic::Status),
    #[error("the server sent a malformed value: {0}")]
    Convert(#[from] ConvertError),
    #[error("the session stream ended")]
    SessionClosed,
}

impl ClientError {
    /// One line about the failed call: the message, then the causes it wraps (tonic
    /// keeps the useful part, such as "Connection refused", in the sources),
    /// `: `-separated. A gRPC status already prints its message, so only the status's
    /// own causes follow it.
    pub fn text(&self) -> String {
        use std::error::Error as _;
        let mut text = self.to_string();
        let mut source = match self {
            ClientError::Status(status) => status.source(),
            other => other.source(),
        };
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        text
    }
}

fn status_text(s: &tonic::Status) -> String {
    match sqlstate(s) {
        Some(code) => format!("error[{code}]: {}", s.message()),
        // A node that runs secure answers a plain HTTP/2 connection with a TLS alert
        // (garbage to HTTP/2), or drops it.
        None if plain_to_secure(s) && DEFAULT_TLS.read().expect("not poisoned").is_none() => {
            format!(
                "{:?}: {} (the node closed the connection: if it runs secure, connect with \
                 --certs-dir and a client certificate)",
                s.code(),
                s.message()
            )
        }
        None => format!("{:?}: {}", s.code(), s.message()),
    }
}

/// Whether `s` is how a call in plain HTTP/2 to a server that speaks TLS fails: the
/// server's TLS alert read as HTTP/2, or the connection dropped (a broken pipe, a
/// cancelled call), whichever the timing gives.
fn plain_to_secure(s: &tonic::Status) -> bool {
    let m = s.message();
    match s.code() {
        tonic::Code::Cancelled
        | tonic::Code::Internal
        | tonic::Code::Unknown
        | tonic::Code::Unavailable => [
            "canceled",
            "h2 protocol error",
            "connection closed",
            "broken pipe",
            "transport error",
        ]
        .iter()
        .any(|p| m.contains(p)),
        _ => false,
    }
}

/// The SQLSTATE a server attached to an error status, if any.
pub fn sqlstate(status: &tonic::Status) -> Option<&str> {
    status
        .metadata()
        .get("hawser-sqlstate")
        .and_then(|v| v.to_str().ok())
}

impl ClientError {
    /// Whether trying the same call again may succeed (lock timeouts, unavailable nodes).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Connect { .. } | ClientError::SessionClosed => true,
            ClientError::Status(s) => matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::Aborted | tonic::Code::DeadlineExceeded
            ),
            _ => false,
        }
    }
}

/// One statement's result, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct StatementResult {
    pub tag: String,
    pub columns: Vec<v1::Column>,
    pub rows: Vec<Row>,
    pub rows_affected: u64,
    pub warnings: Vec<Warning>,
}

/// The outcome of a script: the results of the statements that ran and the error that
/// stopped it, if one did.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptOutcome {
    pub results: Vec<StatementResult>,
    pub error: Option<v1::SqlError>,
    pub in_transaction: bool,
    /// The open transaction is a RETURN TWOSAFE commit left open by LOCAL COMMIT
    /// ACTION NO ACTION: committed on the node, only COMMIT may follow, and ending the
    /// session commits it there.
    pub left_open: bool,
}

impl ScriptOutcome {
    fn decode(resp: v1::ExecuteResponse) -> Result<Self, ClientError> {
        let results = resp
            .results
            .into_iter()
            .map(|r| {
                Ok(StatementResult {
                    rows: r.rows.iter().map(row_from_pb).collect::<Result<_, _>>()?,
                    tag: r.tag,
                    columns: r.columns,
                    rows_affected: r.rows_affected,
                    warnings: r.warnings,
                })
            })
            .collect::<Result<_, ClientError>>()?;
        Ok(ScriptOutcome {
            results,
            error: resp.error,
            in_transaction: resp.in_transaction,
            left_open: resp.left_open,
        })
    }

    /// Turns a statement error into `Err`, for callers that treat any failure alike.
    pub fn into_result(self) -> Result<Vec<StatementResult>, Box<v1::SqlError>> {
        match self.error {
            Some(e) => Err(Box::new(e)),
            None => Ok(self.results),
        }
    }
}

/// A row operation for [`Client::write`].
#[derive(Debug, Clone, PartialEq)]
pub enum RowOp {
    Insert { table: String, row: Row },
    Upsert { table: String, row: Row },
    Delete { table: String, key: Row },
}

/// Where a committed write landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOutcome {
    pub origin: u64,
    pub seq: u64,
    pub lsn: u64,
    pub durable: bool,
    /// `TT8170` when a return service did not acknowledge in time.
    pub warnings: Vec<Warning>,
    /// How the return service ended: `none`, `acknowledged`, `timed_out`, `disabled`.
    pub return_outcome: String,
    /// The master's term for the table: its element's epoch when the write began (0
    /// when no scheme covers the table).
    pub epoch: u64,
}

/// Return-service options of one write (what `CALL ttRepSyncSet` sets in SQL).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitOptions {
    /// Ask for the RETURN RECEIPT / TWOSAFE BY REQUEST services.
    pub request_return: bool,
    /// Seconds to wait (0 = do not wait, -1 = until acknowledged); `None` = the
    /// scheme's RETURN WAIT TIME.
    pub return_wait_seconds: Option<i64>,
    /// 1 = NO ACTION, 2 = COMMIT; `None` = the scheme's LOCAL COMMIT ACTION.
    pub local_action: Option<i64>,
}

/// A connection to one hawser node.
#[derive(Clone)]
pub struct Client {
    client: ClientClient<InterceptedService<Channel, Bearer>>,
    admin: AdminClient<InterceptedService<Channel, Bearer>>,
    timeout: Duration,
}

/// Adds `authorization: Bearer <token>` to every call when the process holds a token
/// ([`set_default_token`]); nothing otherwise.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The token every [`Client`] of this process shows a secure node, if it holds one
/// instead of a client certificate (see [`DEFAULT_TLS`] for why process-wide).
static DEFAULT_TOKEN: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// Sets the token later connections of this process show (`hawser --token`); pair it
/// with [`set_default_tls`] of `hawser_tls::load_token_client`, so the token goes over
/// TLS only. A token that is not header text is refused here.
pub fn set_default_token(token: Option<String>) -> Result<(), ClientError> {
    if let Some(t) = &token {
        tonic::metadata::MetadataValue::<tonic::metadata::Ascii>::try_from(format!("Bearer {t}"))
            .map_err(|_| ClientError::BadToken)?;
    }
    *DEFAULT_TOKEN.write().expect("not poisoned") = token;
    Ok(())
}

/// What every [`Client::connect`] of this process shows a secure cluster: its CA and a
/// certificate (a client's, or a node's own). Process-wide because a process speaks for
/// one identity — the CLI for its `--user`, a node for itself when it runs a drill or
/// asks a peer — and every connection it makes, however deep in a library, must use it.
static DEFAULT_TLS: std::sync::RwLock<Option<ClientTlsConfig>> = std::sync::RwLock::new(None);

/// Sets what later connections of this process use ([`DEFAULT_TLS`]); `None` connects in
/// plain HTTP/2.
pub fn set_default_tls(tls: Option<ClientTlsConfig>) {
    *DEFAULT_TLS.write().expect("not poisoned") = tls;
}

impl Client {
    /// Connects to `addr` (`host:port` or `http://host:port`) with a 30 s deadline per call.
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        Self::connect_with_timeout(addr, Duration::from_secs(30)).await
    }

    /// Connects with the given per-call deadline (also the connect timeout).
    pub async fn connect_with_timeout(addr: &str, timeout: Duration) -> Result<Self, ClientError> {
        let tls = DEFAULT_TLS.read().expect("not poisoned").clone();
        let endpoint = hawser_tls::endpoint(addr, tls.as_ref())
            .map_err(|source| ClientError::BadAddress {
                addr: addr.to_string(),
                source,
            })?
            .connect_timeout(timeout)
            .tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| ClientError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        Ok(Self::from_channel(channel, timeout))
    }

    /// Wraps an existing channel (for in-memory transports in tests).
    pub fn from_channel(channel: Channel, timeout: Duration) -> Self {
        let bearer = Bearer(
            DEFAULT_TOKEN
                .read()
                .expect("not poisoned")
                .as_ref()
                .and_then(|t| format!("Bearer {t}").try_into().ok()),
        );
        Client {
            client: ClientClient::with_interceptor(channel.clone(), bearer.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            admin: AdminClient::with_interceptor(channel, bearer)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            timeout,
        }
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(self.timeout);
        req
    }

    /// Runs a script; statements outside BEGIN ... COMMIT commit one by one.
    pub async fn execute(&mut self, sql: &str) -> Result<ScriptOutcome, ClientError> {
        let req = self.request(v1::ExecuteRequest {
            sql: sql.to_string(),
        });
        ScriptOutcome::decode(self.client.execute(req).await?.into_inner())
    }

    /// Opens an interactive session whose transaction state lasts until it is dropped.
    pub async fn session(&mut self) -> Result<Session, ClientError> {
        let (tx, rx) = mpsc::channel(4);
        // No deadline on the stream itself: a session lives as long as the user wants it.
        let responses = self
            .client
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Session {
            tx,
            responses,
            timeout: self.timeout,
        })
    }

    /// Applies `ops` as one transaction, with the scheme's return services.
    pub async fn write(&mut self, ops: Vec<RowOp>) -> Result<WriteOutcome, ClientError> {
        self.write_with(ops, None).await
    }

    /// Applies `ops` as one transaction with return-service options.
    pub async fn write_with(
        &mut self,
        ops: Vec<RowOp>,
        commit: Option<CommitOptions>,
    ) -> Result<WriteOutcome, ClientError> {
        let resp = self
            .client
            .write(self.request(write_request(ops, commit)))
            .await?
            .into_inner();
        Ok(WriteOutcome::from_pb(resp))
    }

    /// Opens a write stream: many transactions over one gRPC stream, each committed in
    /// turn (cheaper per write than [`Client::write`]).
    pub async fn writer(&mut self) -> Result<Writer, ClientError> {
        let (tx, rx) = mpsc::channel(4);
        // No deadline on the stream itself; each write has one.
        let responses = self
            .client
            .write_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Writer {
            tx: Some(tx),
            responses,
            timeout: self.timeout,
        })
    }

    /// Reads the row with primary key `key`.
    pub async fn get(&mut self, table: &str, key: &[Value]) -> Result<Option<Row>, ClientError> {
        let req = self.request(v1::GetRequest {
            table: table.into(),
            key: Some(row_to_pb(key)),
        });
        let resp = self.client.get(req).await?.into_inner();
        Ok(resp.row.as_ref().map(row_from_pb).transpose()?)
    }

    /// Reads up to `limit` rows with `start <= key < end` in key order (empty bound =
    /// unbounded); the flag says whether more rows follow.
    pub async fn scan(
        &mut self,
        table: &str,
        start: &[Value],
        end: &[Value],
        limit: u32,
    ) -> Result<(Vec<Row>, bool), ClientError> {
        let req = self.request(v1::ScanRequest {
            table: table.into(),
            start: Some(row_to_pb(start)),
            end: Some(row_to_pb(end)),
            limit,
        });
        let resp = self.client.scan(req).await?.into_inner();
        let rows = resp
            .rows
            .iter()
            .map(row_from_pb)
            .collect::<Result<_, _>>()?;
        Ok((rows, resp.more))
    }

    /// Describes a table.
    pub async fn describe(&mut self, table: &str) -> Result<v1::DescribeResponse, ClientError> {
        let req = self.request(v1::DescribeRequest {
            table: table.into(),
        });
        Ok(self.client.describe(req).await?.into_inner())
    }

    /// What the node knows about itself and, in `cluster`, about the cluster.
    pub async fn status(&mut self) -> Result<StatusResponse, ClientError> {
        Ok(self
            .admin
            .status(self.request(v1::StatusRequest {}))
            .await?
            .into_inner())
    }

    /// Bootstraps the cluster on this node (`hawser init`). On a node already in a
    /// cluster it changes nothing; `initialized_now` says which happened.
    pub async fn init(&mut self) -> Result<v1::InitResponse, ClientError> {
        Ok(self
            .admin
            .init(self.request(v1::InitRequest {}))
            .await?
            .into_inner())
    }

    /// Takes node `node_id` out of the cluster (through the Raft leader). Fails with
    /// FAILED_PRECONDITION while the node masters an element or any replication scheme
    /// names its store, UNAVAILABLE without a leader.
    pub async fn remove_node(&mut self, node_id: u64) -> Result<(), ClientError> {
        self.remove_node_with(v1::RemoveNodeRequest {
            node_id,
            ..Default::default()
        })
        .await
        .map(|_| ())
    }

    /// [`Client::remove_node`] with its options: `force` also takes the store out of
    /// every scheme in the same step, `keep_in_schemes` leaves it there for a new node
    /// under the same store name.
    pub async fn remove_node_with(
        &mut self,
        request: v1::RemoveNodeRequest,
    ) -> Result<v1::RemoveNodeResponse, ClientError> {
        Ok(self
            .admin
            .remove_node(self.request(request))
            .await?
            .into_inner())
    }

    /// Switches the master role of every element `from` (empty: the scheme's one master
    /// store) masters in `scheme` over to `to` (`Admin.Switchover`, through the Raft
    /// leader): checked first, then done with nothing lost, and timed.
    pub async fn switchover(
        &mut self,
        scheme: &str,
        to: &str,
        from: Option<&str>,
    ) -> Result<v1::SwitchoverResponse, ClientError> {
        let reply = self
            .admin
            .switchover(self.request(v1::SwitchoverRequest {
                scheme: scheme.to_string(),
                to: to.to_string(),
                from: from.unwrap_or_default().to_string(),
            }))
            .await?;
        Ok(reply.into_inner())
    }

    /// Injects fault `kind` (`crash`, `pause`, `isolate`) into node `node_id`, which this client
    /// must be connected to, for `down` (`Admin.Fault`; the node must have been started
    /// with `--allow-faults`). Returns what the node said it will do.
    pub async fn fault(
        &mut self,
        node_id: u64,
        kind: &str,
        down: Duration,
    ) -> Result<String, ClientError> {
        let reply = self
            .admin
            .fault(self.request(v1::FaultRequest {
                node_id,
                kind: kind.to_string(),
                down_ms: down.as_millis() as u64,
            }))
            .await?;
        Ok(reply.into_inner().message)
    }

    /// Sets `store`'s receiver state (`start`, `pause`, `stop`) in `scheme` (every
    /// scheme it subscribes to when `None`), through the Raft leader; returns the
    /// schemes set.
    pub async fn set_receiver_state(
        &mut self,
        scheme: Option<&str>,
        store: &str,
        state: &str,
    ) -> Result<Vec<String>, ClientError> {
        let resp = self
            .admin
            .set_receiver_state(self.request(v1::SetReceiverStateRequest {
                scheme: scheme.unwrap_or_default().into(),
                store: store.into(),
                state: state.into(),
            }))
            .await?
            .into_inner();
        Ok(resp.schemes)
    }

    /// Enables or disables `store`'s return service (`enabled`, `disabled`) in `scheme`
    /// (every scheme it subscribes to when `None`), through the Raft leader; returns
    /// the schemes set.
    pub async fn set_return_service(
        &mut self,
        scheme: Option<&str>,
        store: &str,
        state: &str,
    ) -> Result<Vec<String>, ClientError> {
        let resp = self
            .admin
            .set_return_service(self.request(v1::SetReturnServiceRequest {
                scheme: scheme.unwrap_or_default().into(),
                store: store.into(),
                state: state.into(),
            }))
            .await?
            .into_inner();
        Ok(resp.schemes)
    }

    /// Pauses (`paused`, with `reason`) or resumes automatic failover for the whole
    /// cluster, through the Raft leader; returns the setting as applied.
    pub async fn set_failover(
        &mut self,
        paused: bool,
        reason: &str,
    ) -> Result<v1::FailoverStatus, ClientError> {
        let resp = self
            .admin
            .set_failover(self.request(v1::SetFailoverRequest {
                paused,
                reason: reason.into(),
            }))
            .await?
            .into_inner();
        Ok(resp.failover.unwrap_or_default())
    }

    /// Rebuilds what this node receives in `scheme` (None: the one it receives in) by
    /// copying the tables from `from` (None: their master); see `hawser duplicate`.
    /// Progress messages follow, the last with `done`; no timeout applies (a copy takes
    /// as long as the tables need). With `keep_replaced`, the node keeps every row the
    /// copy replaces or removes in `hawser_lost` first.
    pub async fn duplicate(
        &mut self,
        scheme: Option<&str>,
        from: Option<&str>,
        keep_replaced: bool,
    ) -> Result<tonic::Streaming<v1::DuplicateProgress>, ClientError> {
        let req = tonic::Request::new(v1::DuplicateRequest {
            scheme: scheme.unwrap_or_default().into(),
            from: from.unwrap_or_default().into(),
            keep_replaced,
        });
        Ok(self.admin.duplicate(req).await?.into_inner())
    }

    /// Runs a failover drill on this node (`Admin.Drill`): progress events, the last one
    /// the report. No timeout applies (a drill takes as long as its settings say).
    pub async fn drill(
        &mut self,
        request: v1::DrillRequest,
    ) -> Result<tonic::Streaming<v1::DrillEvent>, ClientError> {
        Ok(self
            .admin
            .drill(tonic::Request::new(request))
            .await?
            .into_inner())
    }

    /// The effective replication schemes as this node has applied them, in canonical
    /// DDL; `name` (`[owner.]name`) selects one, and an unknown name is NOT_FOUND.
    pub async fn show_schemes(
        &mut self,
        name: Option<&str>,
    ) -> Result<v1::ShowSchemesResponse, ClientError> {
        let req = self.request(v1::ShowSchemesRequest {
            name: name.unwrap_or_default().to_string(),
        });
        Ok(self.admin.show_schemes(req).await?.into_inner())
    }
}

/// An interactive SQL session (`BEGIN` ... `COMMIT` across calls).
fn write_request(ops: Vec<RowOp>, commit: Option<CommitOptions>) -> v1::WriteRequest {
    let ops = ops
        .into_iter()
        .map(|op| {
            let (table, op) = match op {
                RowOp::Insert { table, row } => (table, v1::row_op::Op::Insert(row_to_pb(&row))),
                RowOp::Upsert { table, row } => (table, v1::row_op::Op::Upsert(row_to_pb(&row))),
                RowOp::Delete { table, key } => (table, v1::row_op::Op::DeleteKey(row_to_pb(&key))),
            };
            v1::RowOp {
                table,
                op: Some(op),
            }
        })
        .collect();
    v1::WriteRequest {
        ops,
        commit: commit.map(|c| v1::CommitOptions {
            request_return: c.request_return,
            return_wait_seconds: c.return_wait_seconds,
            local_action: c.local_action,
        }),
    }
}

impl WriteOutcome {
    fn from_pb(resp: v1::WriteResponse) -> Self {
        WriteOutcome {
            origin: resp.origin,
            seq: resp.seq,
            lsn: resp.lsn,
            durable: resp.durable,
            warnings: resp.warnings,
            return_outcome: resp.return_outcome,
            epoch: resp.epoch,
        }
    }
}

/// A write stream ([`Client::writer`]): transactions committed one after another over
/// one gRPC stream. A write that fails gives its error and the stream goes on; a write
/// that gets no answer within the deadline closes the stream (a later answer could no
/// longer be told apart), and every later write fails with
/// [`ClientError::SessionClosed`].
pub struct Writer {
    tx: Option<mpsc::Sender<v1::WriteRequest>>,
    responses: tonic::Streaming<v1::WriteStreamResponse>,
    timeout: Duration,
}

impl Writer {
    /// Applies `ops` as one transaction, with the scheme's return services.
    pub async fn write(&mut self, ops: Vec<RowOp>) -> Result<WriteOutcome, ClientError> {
        self.write_with(ops, None).await
    }

    /// Applies `ops` as one transaction with return-service options.
    pub async fn write_with(
        &mut self,
        ops: Vec<RowOp>,
        commit: Option<CommitOptions>,
    ) -> Result<WriteOutcome, ClientError> {
        let tx = self.tx.as_ref().ok_or(ClientError::SessionClosed)?;
        if tx.send(write_request(ops, commit)).await.is_err() {
            self.tx = None;
            return Err(ClientError::SessionClosed);
        }
        let next = match tokio::time::timeout(self.timeout, self.responses.message()).await {
            Ok(next) => next,
            Err(_) => {
                self.tx = None;
                return Err(tonic::Status::deadline_exceeded(
                    "no answer on the write stream; it is closed",
                )
                .into());
            }
        };
        let resp = match next {
            Ok(Some(resp)) => resp,
            Ok(None) => {
                self.tx = None;
                return Err(ClientError::SessionClosed);
            }
            Err(status) => {
                self.tx = None;
                return Err(status.into());
            }
        };
        match resp.result {
            Some(v1::write_stream_response::Result::Ok(ok)) => Ok(WriteOutcome::from_pb(ok)),
            Some(v1::write_stream_response::Result::Error(e)) => {
                let mut status = tonic::Status::new(tonic::Code::from(e.code), e.message);
                if !e.sqlstate.is_empty() {
                    if let Ok(v) = e.sqlstate.parse() {
                        status.metadata_mut().insert("hawser-sqlstate", v);
                    }
                }
                Err(status.into())
            }
            None => {
                self.tx = None;
                Err(tonic::Status::internal("the server sent an empty write answer").into())
            }
        }
    }
}

pub struct Session {
    tx: mpsc::Sender<v1::ExecuteRequest>,
    responses: tonic::Streaming<v1::ExecuteResponse>,
    timeout: Duration,
}

impl Session {
    /// Runs a script within the session.
    pub async fn execute(&mut self, sql: &str) -> Result<ScriptOutcome, ClientError> {
        self.tx
            .send(v1::ExecuteRequest {
                sql: sql.to_string(),
            })
            .await
            .map_err(|_| ClientError::SessionClosed)?;
        let next = tokio::time::timeout(self.timeout, self.responses.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no answer from the session"))?;
        match next? {
            Some(resp) => ScriptOutcome::decode(resp),
            None => Err(ClientError::SessionClosed),
        }
    }
}
