//! The gRPC services `hawser.v1.Client` and `hawser.v1.Admin`.
//!
//! Thin on purpose (the tonic examples' shape): decode the request into domain types,
//! call the SQL engine or the store, map the outcome back. Errors a caller can act on
//! become INVALID_ARGUMENT / NOT_FOUND / ABORTED with the SQLSTATE in the
//! `hawser-sqlstate` metadata key; nothing the caller could fix becomes INTERNAL.

use std::ops::Bound;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hawser_core::coerce::coerce;
use hawser_core::{QualName, Row, TableDef, Value};
use hawser_proto::v1::{self, admin_server::Admin, client_server::Client};
use hawser_proto::{row_from_pb, row_to_pb};
use hawser_store::{KeyRange, StoreError};
use tokio_stream::{wrappers::ReceiverStream, Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::NodeState;

/// Largest number of rows one Scan returns.
pub const MAX_SCAN_ROWS: u32 = 10_000;

/// Implements both services over one node's state.
#[derive(Clone)]
pub struct Services {
    pub(crate) state: Arc<NodeState>,
}

fn status_with_code(code: tonic::Code, sqlstate: &str, message: String) -> Status {
    let mut status = Status::new(code, message);
    if let Ok(v) = sqlstate.parse() {
        status.metadata_mut().insert("hawser-sqlstate", v);
    }
    status
}

/// Maps a store error to the gRPC code a caller can act on.
fn store_status(e: &StoreError) -> Status {
    let code = e.code();
    let grpc = match code {
        "42P01" | "42703" => tonic::Code::NotFound,
        "55P03" | "40001" => tonic::Code::Aborted,
        "58030" | "57P03" => tonic::Code::Unavailable,
        "XX001" => tonic::Code::DataLoss,
        "53100" => tonic::Code::ResourceExhausted,
        // Committed here but not acknowledged (the master lease ran out): the caller
        // cannot know whether it survives.
        "08007" => tonic::Code::Unknown,
        _ => tonic::Code::InvalidArgument,
    };
    status_with_code(grpc, code, e.to_string())
}

/// The next request on a client's stream; `None` once the stream ends or fails (logged)
/// or the node shuts down.
async fn next_request<T>(
    inbound: &mut Streaming<T>,
    shutdown: &tokio_util::sync::CancellationToken,
    what: &str,
) -> Option<T> {
    next_request_or_failure(inbound, shutdown, what)
        .await
        .ok()
        .flatten()
}

/// [`next_request`], with why the client's stream failed when it did (a request over
/// the message limit, say), for a caller that tells the client.
async fn next_request_or_failure<T>(
    inbound: &mut Streaming<T>,
    shutdown: &tokio_util::sync::CancellationToken,
    what: &str,
) -> Result<Option<T>, Status> {
    let next = tokio::select! {
        biased;
        _ = shutdown.cancelled() => return Ok(None),
        next = inbound.next() => next,
    };
    match next {
        None => Ok(None),
        Some(Ok(req)) => Ok(Some(req)),
        Some(Err(e)) => {
            debug!(error = %e, "{what} stream failed");
            Err(e)
        }
    }
}

fn bad_request(message: String) -> Status {
    status_with_code(tonic::Code::InvalidArgument, "22023", message)
}

fn pb_result(r: &hawser_sql::StatementResult) -> v1::StatementResult {
    v1::StatementResult {
        tag: r.tag.clone(),
        columns: r
            .columns
            .iter()
            .map(|c| v1::Column {
                name: c.name.clone(),
                data_type: c.data_type.clone(),
                nullable: true,
            })
            .collect(),
        rows: r.rows.iter().map(|row| row_to_pb(row)).collect(),
        rows_affected: r.rows_affected,
        warnings: r
            .warnings
            .iter()
            .map(|w| v1::Warning {
                code: w.code.clone(),
                message: w.message.clone(),
            })
            .collect(),
    }
}

/// An upper bound of the bytes [`pb_result`] of `r` takes in an ExecuteResponse,
/// counted without building it: each message and string with its tag and a length of
/// at most 5 bytes.
fn result_bytes(r: &hawser_sql::StatementResult) -> usize {
    const AROUND: usize = 6;
    let text = |t: &str| AROUND + t.len();
    let columns: usize = r
        .columns
        .iter()
        .map(|c| AROUND + text(&c.name) + text(&c.data_type) + 2)
        .sum();
    let rows: usize = r
        .rows
        .iter()
        .map(|row| {
            AROUND
                + row
                    .iter()
                    .map(hawser_proto::value_encoded_bound)
                    .sum::<usize>()
        })
        .sum();
    let warnings: usize = r
        .warnings
        .iter()
        .map(|w| AROUND + text(&w.code) + text(&w.message))
        .sum();
    AROUND + text(&r.tag) + columns + rows + 11 + warnings
}

/// What one reply may carry of a script's results: the largest message, less room for
/// the rest of the reply (an error with its text, flags).
fn result_limit(max_message_bytes: usize) -> hawser_sql::ResultLimit {
    hawser_sql::ResultLimit {
        max_bytes: max_message_bytes.saturating_sub(8 * 1024),
        measure: Arc::new(result_bytes),
    }
}

/// Why the SQL of this call may only read: its caller's certificate gives the reader
/// role (`crate::roles`).
fn read_only<T>(request: &Request<T>) -> Option<String> {
    request
        .extensions()
        .get::<crate::roles::Caller>()
        .and_then(crate::roles::Caller::read_only)
}

/// How long each statement of a call may run: the node's `statement_timeout`, or the
/// call's own deadline (`grpc-timeout`) where that is sooner; `None` for no bound.
fn statement_timeout(
    configured: Duration,
    metadata: &tonic::metadata::MetadataMap,
) -> Option<Duration> {
    let configured = (!configured.is_zero()).then_some(configured);
    let deadline = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(grpc_timeout);
    match (configured, deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A `grpc-timeout` header's value (gRPC over HTTP/2: at most 8 digits and a unit,
/// H M S m u n); `None` when it is not one.
fn grpc_timeout(value: &str) -> Option<Duration> {
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A script's outcome as a response; a write refused because this node receives the
/// table names where the table's master is in `state`.
fn pb_outcome(
    o: &hawser_sql::ScriptOutcome,
    in_transaction: bool,
    left_open: bool,
    state: &hawser_control::ClusterState,
) -> v1::ExecuteResponse {
    v1::ExecuteResponse {
        results: o.results.iter().map(pb_result).collect(),
        error: o.error.as_ref().map(|e| {
            let (master_store, master_addr, master_epoch) = e
                .received_table
                .as_ref()
                .and_then(|t| crate::cluster::master_of_table(state, t))
                .unwrap_or_default();
            v1::SqlError {
                code: e.code.clone(),
                message: e.message.clone(),
                statement: e.statement as u32,
                line: e.line,
                column: e.column,
                master_addr,
                master_store,
                master_epoch,
            }
        }),
        in_transaction,
        left_open,
    }
}

impl Services {
    /// A store error of a client write as a status; a write refused because this node
    /// receives the table carries where its master is (`hawser-master`: its gRPC
    /// address, `hawser-master-store`, `hawser-epoch`), for clients that follow it.
    fn write_status(&self, e: &StoreError) -> Status {
        let mut status = store_status(e);
        if let StoreError::ReceivedTable { table, .. } = e {
            let state = self.state.plane.state();
            if let Some((store, addr, epoch)) = crate::cluster::master_of_table(&state, table) {
                let md = status.metadata_mut();
                for (key, value) in [
                    ("hawser-master", addr),
                    ("hawser-master-store", store),
                    ("hawser-epoch", epoch.to_string()),
                ] {
                    if let Ok(v) = value.parse() {
                        md.insert(key, v);
                    }
                }
            }
        }
        status
    }

    /// Commits one typed write (the body of `Write` and of each `WriteStream` request).
    async fn commit_write(&self, request: v1::WriteRequest) -> Result<v1::WriteResponse, Status> {
        let ops = request.ops;
        let sync = match request.commit {
            Some(c) => commit_options(&c)?,
            None => hawser_sql::SyncSettings::default(),
        };
        if ops.is_empty() {
            return Err(bad_request("a write needs at least one operation".into()));
        }
        // The master term of the first table, as this node knows it before the write:
        // a commit that passes the lease check happens under it (a switchover drains
        // the commits under way before the role moves).
        let term = {
            let first = self.table(&ops[0].table)?;
            let store = hawser_core::Ident::unquoted(&self.state.config.name);
            crate::lease::master_term(&self.state.plane.state(), &store, &first.name)
                .map_or(0, |e| e.0)
        };
        let mut txn = self.state.db.begin();
        for (i, op) in ops.iter().enumerate() {
            let table = self.table(&op.table)?;
            match &op.op {
                Some(v1::row_op::Op::Insert(row)) => {
                    let row =
                        self.typed_row(&table, Some(row), &Self::all_columns(&table), "row")?;
                    txn.insert(&table.name, row)
                        .await
                        .map_err(|e| self.write_status(&e))?;
                }
                Some(v1::row_op::Op::Upsert(row)) => {
                    let row =
                        self.typed_row(&table, Some(row), &Self::all_columns(&table), "row")?;
                    let key = table.key_of(&row);
                    let existing = txn
                        .lock_and_get(&table.name, &key)
                        .await
                        .map_err(|e| self.write_status(&e))?;
                    match existing {
                        Some(_) => txn.update(&table.name, &key, row).await.map(|_| ()),
                        None => txn.insert(&table.name, row).await,
                    }
                    .map_err(|e| self.write_status(&e))?;
                }
                Some(v1::row_op::Op::DeleteKey(key)) => {
                    let key = self.typed_row(&table, Some(key), &table.primary_key, "key")?;
                    txn.delete(&table.name, &key)
                        .await
                        .map_err(|e| self.write_status(&e))?;
                }
                None => return Err(bad_request(format!("operation {} has no kind set", i + 1))),
            }
        }
        let opts = crate::returns::sync_options(&sync);
        let wait = self.state.returns.wait_for(&opts);
        let committed = self.state.returns.commit(txn, opts).await.map_err(|e| {
            warn!(error = %e, "typed write failed to commit");
            store_status(&e)
        })?;
        let info = committed.info;
        let warnings = crate::returns::outcome_warning(&committed.outcome, wait, false)
            .into_iter()
            .map(|w| v1::Warning {
                code: w.code,
                message: w.message,
            })
            .collect();
        Ok(v1::WriteResponse {
            origin: info.gtid.origin.0,
            seq: info.gtid.seq,
            lsn: info.lsn.0,
            durable: info.durable,
            warnings,
            return_outcome: crate::returns::outcome_label(&committed.outcome).into(),
            epoch: term,
        })
    }

    fn table(&self, name: &str) -> Result<Arc<TableDef>, Status> {
        let qn = QualName::parse_unquoted(name.trim());
        self.state
            .db
            .table(&qn)
            .ok_or_else(|| store_status(&StoreError::UndefinedTable(qn)))
    }

    /// Decodes a row or key and coerces it to `types`' column types.
    fn typed_row(
        &self,
        table: &TableDef,
        row: Option<&v1::Row>,
        columns: &[usize],
        what: &str,
    ) -> Result<Row, Status> {
        let row = row_from_pb(row.unwrap_or(&v1::Row::default()))
            .map_err(|e| bad_request(format!("{what} for table {}: {e}", table.name)))?;
        if row.len() != columns.len() {
            return Err(bad_request(format!(
                "{what} for table {} has {} values, the table needs {}",
                table.name,
                row.len(),
                columns.len()
            )));
        }
        row.into_iter()
            .zip(columns)
            .map(|(v, &i)| {
                let col = &table.columns[i];
                coerce(v, &col.data_type).map_err(|e| {
                    status_with_code(
                        tonic::Code::InvalidArgument,
                        e.code(),
                        format!("column {} of table {}: {e}", col.name, table.name),
                    )
                })
            })
            .collect()
    }

    fn all_columns(table: &TableDef) -> Vec<usize> {
        (0..table.columns.len()).collect()
    }
}

/// A write's commit options as a session's `ttRepSyncSet` settings.
fn commit_options(c: &v1::CommitOptions) -> Result<hawser_sql::SyncSettings, Status> {
    if let Some(w) = c.return_wait_seconds {
        if w < -1 {
            return Err(bad_request(format!(
                "commit.return_wait_seconds must be >= 0, or -1 to wait until acknowledged; \
                 got {w}"
            )));
        }
    }
    if let Some(a) = c.local_action {
        if !(1..=2).contains(&a) {
            return Err(bad_request(format!(
                "commit.local_action must be 1 (NO ACTION) or 2 (COMMIT), not {a}"
            )));
        }
    }
    Ok(hawser_sql::SyncSettings {
        request_return: c.request_return,
        return_wait_s: c.return_wait_seconds,
        local_action: c.local_action,
    })
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<v1::ExecuteResponse, Status>> + Send>>;
type WriteStream = Pin<Box<dyn Stream<Item = Result<v1::WriteStreamResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Client for Services {
    async fn execute(
        &self,
        request: Request<v1::ExecuteRequest>,
    ) -> Result<Response<v1::ExecuteResponse>, Status> {
        let timeout = statement_timeout(self.state.config.statement_timeout, request.metadata());
        let read_only = read_only(&request);
        let sql = request.into_inner().sql;
        let mut session = self.state.sql.session();
        session.limit_results(result_limit(self.state.config.max_message_bytes));
        session.set_statement_timeout(timeout);
        session.set_read_only(read_only);
        let outcome = session.execute(&sql).await;
        crate::senders::wake_all(&self.state.senders);
        let mut resp = pb_outcome(&outcome, false, false, &self.state.plane.state());
        if session.left_open() {
            // Dropping the session below ends the wait: the commit stands here.
            resp.results.last_mut().into_iter().for_each(|r| {
                r.warnings.push(v1::Warning {
                    code: "TT8170".into(),
                    message: "the commit left open by LOCAL COMMIT ACTION NO ACTION at the \
                              end of the script is committed here (a one-shot call cannot \
                              COMMIT again; use a session, hawser sql, to wait for the \
                              subscriber)"
                        .into(),
                })
            });
        } else if session.in_transaction() {
            // One-shot calls cannot keep a transaction: roll it back and say so.
            resp.results.last_mut().into_iter().for_each(|r| {
                r.warnings.push(v1::Warning {
                    code: "25P01".into(),
                    message: "the transaction left open at the end of the script was rolled \
                              back; use a session (hawser sql) to keep one open"
                        .into(),
                })
            });
        }
        Ok(Response::new(resp))
    }

    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<v1::ExecuteRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        // Counted here, before the session's task starts, so that a burst of opens
        // cannot pass the bound between a check and the count.
        let open = self
            .state
            .sessions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if open >= self.state.config.max_sessions {
            self.state
                .sessions
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            return Err(status_with_code(
                tonic::Code::ResourceExhausted,
                "53300",
                format!(
                    "too many sessions: this node has {open} open, its limit \
                     (--max-sessions); close one, or use Execute for one-shot scripts"
                ),
            ));
        }
        let read_only = read_only(&request);
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let state = self.state.clone();
        let shutdown = state.shutdown.clone();
        let tasks = state.tasks.clone();
        // The session task owns the SQL session; dropping it rolls back an open
        // transaction. It ends with the client's stream or at shutdown.
        tasks.spawn(async move {
            let mut session = state.sql.session();
            session.limit_results(result_limit(state.config.max_message_bytes));
            // A session's stream lives as long as the client likes: only the node's
            // bound applies to its statements.
            session.set_statement_timeout(Some(state.config.statement_timeout));
            session.set_read_only(read_only);
            loop {
                let req = match next_request_or_failure(&mut inbound, &shutdown, "session").await {
                    Ok(Some(req)) => req,
                    Ok(None) => break,
                    Err(status) => {
                        // The client is told why its session ended (a script over
                        // --max-message-bytes ends it here), not just that it did.
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                };
                let outcome = session.execute(&req.sql).await;
                crate::senders::wake_all(&state.senders);
                let resp = pb_outcome(
                    &outcome,
                    session.in_transaction(),
                    session.left_open(),
                    &state.plane.state(),
                );
                if tx.send(Ok(resp)).await.is_err() {
                    break;
                }
            }
            state
                .sessions
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn write(
        &self,
        request: Request<v1::WriteRequest>,
    ) -> Result<Response<v1::WriteResponse>, Status> {
        self.commit_write(request.into_inner())
            .await
            .map(Response::new)
    }

    type WriteStreamStream = WriteStream;

    async fn write_stream(
        &self,
        request: Request<Streaming<v1::WriteRequest>>,
    ) -> Result<Response<Self::WriteStreamStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let services = self.clone();
        let shutdown = self.state.shutdown.clone();
        // One task per stream commits its writes in the order they arrive; it ends with
        // the client's stream, when the client stops reading, or at shutdown.
        self.state.tasks.spawn(async move {
            while let Some(req) = next_request(&mut inbound, &shutdown, "write").await {
                let result = match services.commit_write(req).await {
                    Ok(ok) => v1::write_stream_response::Result::Ok(ok),
                    Err(status) => v1::write_stream_response::Result::Error(v1::WriteError {
                        code: status.code() as i32,
                        sqlstate: status
                            .metadata()
                            .get("hawser-sqlstate")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string(),
                        message: status.message().to_string(),
                    }),
                };
                let resp = v1::WriteStreamResponse {
                    result: Some(result),
                };
                if tx.send(Ok(resp)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get(
        &self,
        request: Request<v1::GetRequest>,
    ) -> Result<Response<v1::GetResponse>, Status> {
        let req = request.into_inner();
        let table = self.table(&req.table)?;
        let key = self.typed_row(&table, req.key.as_ref(), &table.primary_key, "key")?;
        let row = self
            .state
            .db
            .get(&table.name, &key)
            .map_err(|e| store_status(&e))?;
        Ok(Response::new(v1::GetResponse {
            row: row.as_deref().map(row_to_pb),
        }))
    }

    async fn scan(
        &self,
        request: Request<v1::ScanRequest>,
    ) -> Result<Response<v1::ScanResponse>, Status> {
        let req = request.into_inner();
        let table = self.table(&req.table)?;
        let bound = |row: Option<&v1::Row>, what: &str| -> Result<Vec<Value>, Status> {
            let n = row.map_or(0, |r| r.values.len());
            if n > table.primary_key.len() {
                return Err(bad_request(format!(
                    "scan {what} bound has {n} values, table {} has {} key columns",
                    table.name,
                    table.primary_key.len()
                )));
            }
            self.typed_row(&table, row, &table.primary_key[..n], what)
        };
        let start = bound(req.start.as_ref(), "start")?;
        let end = bound(req.end.as_ref(), "end")?;
        let limit = match req.limit {
            0 => MAX_SCAN_ROWS,
            n => n.min(MAX_SCAN_ROWS),
        } as usize;
        let lower = if start.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Included(start)
        };
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end)
        };
        let range = KeyRange::new(lower, upper);
        let iter = self
            .state
            .db
            .scan(&table.name, range)
            .map_err(|e| store_status(&e))?;
        let mut rows = Vec::new();
        let mut more = false;
        for row in iter {
            let row = row.map_err(|e| store_status(&e))?;
            if rows.len() == limit {
                more = true;
                break;
            }
            rows.push(row_to_pb(&row));
        }
        Ok(Response::new(v1::ScanResponse { rows, more }))
    }

    async fn describe(
        &self,
        request: Request<v1::DescribeRequest>,
    ) -> Result<Response<v1::DescribeResponse>, Status> {
        let table = self.table(&request.into_inner().table)?;
        Ok(Response::new(v1::DescribeResponse {
            table: table.name.to_string(),
            columns: table
                .columns
                .iter()
                .map(|c| v1::Column {
                    name: c.name.to_string(),
                    data_type: c.data_type.to_string(),
                    nullable: c.nullable,
                })
                .collect(),
            primary_key: table
                .primary_key
                .iter()
                .map(|&i| table.columns[i].name.to_string())
                .collect(),
        }))
    }
}

#[tonic::async_trait]
impl Admin for Services {
    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        Ok(Response::new(self.state.status()))
    }

    async fn init(
        &self,
        _request: Request<v1::InitRequest>,
    ) -> Result<Response<v1::InitResponse>, Status> {
        let plane = &self.state.plane;
        // Every node of a Kubernetes StatefulSet starts with --join naming them all: one
        // bootstraps only when every --join peer answers that it belongs to no cluster
        // and lets it (hawser_control::bootstrap), so init run again, anywhere, even
        // twice at once, makes no second cluster.
        let join = &self.state.config.join;
        let before = if join.is_empty() {
            let before = plane
                .raft()
                .is_initialized()
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
            plane
                .initialize()
                .await
                .map_err(crate::cluster::plane_status)?;
            before
        } else {
            match plane.initialize_among(join).await {
                Ok(now) => !now,
                Err(hawser_control::InitError::Plane(e)) => {
                    return Err(crate::cluster::plane_status(e))
                }
                Err(hawser_control::InitError::Refused(why)) => {
                    return Err(match why {
                        hawser_control::BootstrapRefusal::Unanswered { .. } => {
                            Status::unavailable(why.to_string())
                        }
                        _ => Status::failed_precondition(why.to_string()),
                    })
                }
            }
        };
        let message = if before {
            "this node is already part of an initialized cluster; nothing changed".to_string()
        } else {
            format!(
                "initialized a new cluster with node {} ({}) as its only voter; start the \
                 other nodes with --join {}",
                self.state.node_id,
                self.state.config.name,
                self.state.plane.config().grpc_addr
            )
        };
        Ok(Response::new(v1::InitResponse {
            initialized_now: !before,
            message,
        }))
    }

    async fn remove_node(
        &self,
        request: Request<v1::RemoveNodeRequest>,
    ) -> Result<Response<v1::RemoveNodeResponse>, Status> {
        let req = request.into_inner();
        if req.node_id == 0 {
            return Err(bad_request("node_id 0 names no node".into()));
        }
        let mode = match (req.force, req.keep_in_schemes) {
            (true, true) => {
                return Err(bad_request(
                    "force takes the store out of the schemes, keep_in_schemes leaves it \
                     there: give one of them"
                        .into(),
                ))
            }
            (true, false) => hawser_control::RemovalMode::Force,
            (false, true) => hawser_control::RemovalMode::KeepInSchemes,
            (false, false) => hawser_control::RemovalMode::Refuse,
        };
        let reply = self
            .state
            .plane
            .remove_node(hawser_core::NodeId(req.node_id), mode)
            .await
            .map_err(crate::cluster::plane_status)?;
        Ok(Response::new(v1::RemoveNodeResponse {
            schemes_changed: reply
                .schemes_changed
                .iter()
                .map(ToString::to_string)
                .collect(),
        }))
    }

    async fn set_receiver_state(
        &self,
        request: Request<v1::SetReceiverStateRequest>,
    ) -> Result<Response<v1::SetReceiverStateResponse>, Status> {
        let req = request.into_inner();
        let schemes = crate::cluster::set_receiver_state(
            &self.state.plane,
            req.scheme.trim(),
            req.store.trim(),
            req.state.trim(),
        )
        .await?;
        Ok(Response::new(v1::SetReceiverStateResponse { schemes }))
    }

    async fn set_return_service(
        &self,
        request: Request<v1::SetReturnServiceRequest>,
    ) -> Result<Response<v1::SetReturnServiceResponse>, Status> {
        let req = request.into_inner();
        let schemes = crate::cluster::set_return_service(
            &self.state.plane,
            req.scheme.trim(),
            req.store.trim(),
            req.state.trim(),
        )
        .await?;
        Ok(Response::new(v1::SetReturnServiceResponse { schemes }))
    }

    async fn set_failover(
        &self,
        request: Request<v1::SetFailoverRequest>,
    ) -> Result<Response<v1::SetFailoverResponse>, Status> {
        let req = request.into_inner();
        let failover =
            crate::cluster::set_failover(&self.state.plane, req.paused, &req.reason).await?;
        Ok(Response::new(v1::SetFailoverResponse {
            failover: Some(failover),
        }))
    }

    type DrillStream = ReceiverStream<Result<v1::DrillEvent, Status>>;

    async fn drill(
        &self,
        request: Request<v1::DrillRequest>,
    ) -> Result<Response<Self::DrillStream>, Status> {
        let rx = crate::drill::start(self.state.clone(), request.into_inner()).await?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type DuplicateStream = ReceiverStream<Result<v1::DuplicateProgress, Status>>;

    async fn duplicate(
        &self,
        request: Request<v1::DuplicateRequest>,
    ) -> Result<Response<Self::DuplicateStream>, Status> {
        let req = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let state = self.state.clone();
        self.state.tasks.spawn(async move {
            if let Err(status) =
                crate::duplicate::run(state, req.scheme, req.from, req.keep_replaced, tx.clone())
                    .await
            {
                warn!(error = %status.message(), "duplicate failed");
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn switchover(
        &self,
        request: Request<v1::SwitchoverRequest>,
    ) -> Result<Response<v1::SwitchoverResponse>, Status> {
        let req = request.into_inner();
        let status = self.state.status();
        let cluster = status
            .cluster
            .ok_or_else(|| Status::failed_precondition("this node is not in a cluster"))?;
        if cluster.role != "leader" {
            // Node health, which the plan checks, is known on the leader only.
            if cluster.leader_addr.is_empty() {
                return Err(status_with_code(
                    tonic::Code::Unavailable,
                    crate::cluster::NO_LEADER,
                    "no Raft leader is known now; retry".into(),
                ));
            }
            let endpoint = hawser_tls::endpoint(&cluster.leader_addr, self.state.peer_tls.as_ref())
                .map_err(|e| {
                    Status::unavailable(format!(
                        "bad address of the Raft leader {}: {e}",
                        cluster.leader_addr
                    ))
                })?;
            let mut leader = v1::admin_client::AdminClient::connect(endpoint)
                .await
                .map_err(|e| {
                    Status::unavailable(format!(
                        "cannot reach the Raft leader at {}: {e}",
                        cluster.leader_addr
                    ))
                })?;
            return leader.switchover(req).await;
        }
        let plan = crate::switchover::plan(
            &cluster,
            req.scheme.trim(),
            Some(req.from.trim()).filter(|f| !f.is_empty()),
            req.to.trim(),
        )
        .map_err(|why| Status::failed_precondition(format!("cannot switch over: {why}")))?;
        let started = std::time::Instant::now();
        let mut session = self.state.sql.session();
        let outcome = session.execute(&plan.ddl).await;
        let millis = started.elapsed().as_millis() as u64;
        if let Some(e) = outcome.error {
            let code = match e.code.as_str() {
                crate::cluster::NO_LEADER => tonic::Code::Unavailable,
                _ => tonic::Code::FailedPrecondition,
            };
            return Err(status_with_code(
                code,
                &e.code,
                format!("switchover refused: {}", e.message),
            ));
        }
        let state = self.state.plane.state();
        let elements = state
            .schemes
            .values()
            .filter(|s| s.scheme.name.to_string().eq_ignore_ascii_case(&plan.scheme))
            .flat_map(|s| s.elements.iter())
            .filter(|(name, _)| {
                plan.elements
                    .iter()
                    .any(|e| e.eq_ignore_ascii_case(name.as_str()))
            })
            .map(|(name, es)| v1::MovedElement {
                name: name.as_str().to_string(),
                epoch: es.epoch.0,
            })
            .collect();
        Ok(Response::new(v1::SwitchoverResponse {
            scheme: plan.scheme,
            from: plan.from,
            to: req.to.trim().to_string(),
            elements,
            millis,
        }))
    }

    async fn fault(
        &self,
        request: Request<v1::FaultRequest>,
    ) -> Result<Response<v1::FaultResponse>, Status> {
        let req = request.into_inner();
        if !self.state.config.allow_faults {
            return Err(Status::failed_precondition(format!(
                "node {} ({}) takes no faults: start it with --allow-faults \
                 (HAWSER_ALLOW_FAULTS=1) to let drills crash or pause it",
                self.state.node_id, self.state.config.name
            )));
        }
        if req.node_id != self.state.node_id.0 {
            return Err(bad_request(format!(
                "this is node {} ({}), not node {}: the address reached another node than \
                 the one meant; nothing done",
                self.state.node_id, self.state.config.name, req.node_id
            )));
        }
        let fault = crate::fault::Fault::parse(&req.kind, req.down_ms).map_err(bad_request)?;
        let message = fault.describe();
        warn!(node = %self.state.node_id, fault = ?fault, "a drill injects a fault: {message}");
        crate::fault::inject(fault, self.state.grpc_addr, self.state.http_addr);
        Ok(Response::new(v1::FaultResponse { message }))
    }

    async fn show_schemes(
        &self,
        request: Request<v1::ShowSchemesRequest>,
    ) -> Result<Response<v1::ShowSchemesResponse>, Status> {
        let name = request.into_inner().name;
        let reply = crate::cluster::show_schemes(&self.state.plane, &name);
        if !name.trim().is_empty() && reply.schemes.is_empty() {
            return Err(Status::not_found(format!(
                "replication scheme {} does not exist",
                name.trim()
            )));
        }
        Ok(Response::new(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_are_read_by_their_unit_and_the_sooner_bound_wins() {
        assert_eq!(grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(
            grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "S", "5", "5s", "123456789S", "-5S", "5 S", "5é"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(statement_timeout(Duration::ZERO, &md), None);
        assert_eq!(
            statement_timeout(Duration::from_secs(30), &md),
            Some(Duration::from_secs(30))
        );
        md.insert("grpc-timeout", "2S".parse().unwrap());
        assert_eq!(
            statement_timeout(Duration::ZERO, &md),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            statement_timeout(Duration::from_secs(30), &md),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            statement_timeout(Duration::from_secs(1), &md),
            Some(Duration::from_secs(1))
        );
    }
}
