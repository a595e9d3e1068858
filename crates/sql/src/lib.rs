//! hawser's SQL front end.
//!
//! A [`Session`] takes a script, parses it with sqlparser ([`script`]), and runs its
//! statements one by one: each is planned against the current catalog ([`plan`]) —
//! so a table created by statement 1 is visible to statement 2 — and executed against
//! the store ([`exec`]) inside the session's transaction, or in a transaction of its
//! own that commits at once (autocommit).
//!
//! ```text
//! text ─► script (sqlparser) ─► plan (names, types, key ranges) ─► exec ─► hawser_store::Txn
//!                                      expr: evaluation over Values
//! ```
//!
//! * Transactions: `BEGIN` / `START TRANSACTION` opens one, `COMMIT` applies it
//!   atomically, `ROLLBACK` drops it. Inside one, a failing statement leaves no effect
//!   of its own (the transaction rolls back to a savepoint taken before it) and the
//!   transaction stays open, as in Oracle and TimesTen.
//! * DDL commits on its own in the store and is refused inside a transaction block.
//! * `seq.NEXTVAL` is not transactional (as in Oracle); `seq.CURRVAL` is per session.
//! * Replication DDL (`CREATE / ALTER / DROP REPLICATION`) runs through the
//!   [`ReplicationDdl`] hook the node gives [`SqlEngine::with_replication`] (it commits
//!   the change through the cluster's Raft group); an engine without one refuses it with
//!   0A000.
//! * Commits go through the [`ReturnServices`] hook when the node gives one
//!   ([`SqlEngine::with_return_services`]): it waits for the acknowledgements the
//!   replication scheme asks for and turns a timeout into warning `TT8170` on COMMIT.
//! * `CALL ttRepSyncSet(requestReturn, returnWait, localAction)`, `CALL ttRepSyncGet()`
//!   and `CALL ttRepXactTokenGet()` are the session's ([`SyncSettings`]); the other
//!   built-in procedures (`ttRepXactStatus`, `ttRepSubscriberWait`, ...) go to the hook.
//!
//! * Statements nested too deeply to process safely fail with 54001 ([`limits`]).
//!
//! See `docs/sql.md` for the supported SQL.

pub mod access;
pub mod call;
pub mod dialect;
pub mod error;
pub mod exec;
pub mod expr;
pub mod limits;
pub mod outcome;
pub mod plan;
pub mod script;
pub mod types;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hawser_core::Value;
use hawser_core::{QualName, TableDef};
use hawser_store::{CommitInfo, Database, SequenceDef, StoreError, Txn};

pub use error::{ReplicationError, SqlError};
pub use outcome::{ColumnMeta, ScriptOutcome, StatementResult, Warning};

use crate::error::{Error, ErrorKind, Result};
use crate::exec::SeqCtx;
use crate::plan::{Catalog, Plan};
use crate::script::{Parsed, ScriptStatement};

/// A boxed future, as [`ReplicationDdl::execute`] returns (no async-trait needed).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs replication DDL for the SQL engine. The node implements it over the cluster
/// control plane: the statement is validated, committed through the Raft leader, and
/// the call returns once this node has applied it.
pub trait ReplicationDdl: Send + Sync {
    /// Runs one `CREATE / ALTER / DROP REPLICATION` statement, given as written
    /// (without its `;`). The result's tag names the statement (`CREATE REPLICATION`).
    fn execute<'a>(
        &'a self,
        ddl: &'a str,
    ) -> BoxFuture<'a, Result<StatementResult, ReplicationError>>;
}

/// A session's return-service settings, as TimesTen's `ttRepSyncSet` sets them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncSettings {
    /// `requestReturn` 0x01: this transaction asks for the BY REQUEST return services.
    /// Reset when the transaction ends.
    pub request_return: bool,
    /// `returnWait` in seconds (0 = do not wait, -1 = until acknowledged), overriding
    /// RETURN WAIT TIME for every later transaction of the session.
    pub return_wait_s: Option<i64>,
    /// `localAction`: 1 = NO ACTION, 2 = COMMIT, overriding LOCAL COMMIT ACTION.
    pub local_action: Option<i64>,
}

/// A commit through [`ReturnServices::commit`].
#[derive(Debug)]
pub struct Committed {
    pub info: CommitInfo,
    /// Warnings for the committing client (`TT8170` when a return service timed out).
    pub warnings: Vec<Warning>,
    /// Set when a return service applied to the commit: the token
    /// `ttRepXactTokenGet` returns and `ttRepXactStatus` takes (the commit's seq).
    pub token: Option<u64>,
    /// Set when a RETURN TWOSAFE commit timed out under LOCAL COMMIT ACTION NO ACTION:
    /// the transaction stays open in the session (TimesTen: the application may only
    /// COMMIT again).
    pub open: Option<OpenCommit>,
}

/// A RETURN TWOSAFE commit left open by LOCAL COMMIT ACTION NO ACTION. It is in this
/// node's log and on its way to the subscribers, but its rows stay hidden from other
/// sessions and locked until the session COMMITs again and the subscribers have it.
pub struct OpenCommit {
    /// The subscribers it still waits for, for messages.
    pub pending: Vec<String>,
    /// Resolves with the commit's warnings once it is released. Dropping it ends the
    /// wait: the commit stands here, as under LOCAL COMMIT ACTION COMMIT.
    pub settled: BoxFuture<'static, Vec<Warning>>,
}

impl fmt::Debug for OpenCommit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenCommit")
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

/// The node's return services, for the SQL engine: commits wait for the
/// acknowledgements the replication scheme asks for, and the built-in procedures
/// that need the node run here.
pub trait ReturnServices: Send + Sync {
    /// Commits `txn` and waits as the scheme and `sync` say.
    fn commit<'a>(
        &'a self,
        txn: Txn,
        sync: SyncSettings,
    ) -> BoxFuture<'a, std::result::Result<Committed, StoreError>>;

    /// Runs a built-in procedure other than the session's own. `token` is the
    /// session's last return-service commit, for `ttRepXactStatus()` without argument.
    fn call<'a>(
        &'a self,
        call: &'a call::Call,
        token: Option<u64>,
    ) -> BoxFuture<'a, std::result::Result<StatementResult, ReplicationError>>;

    /// RETURN WAIT TIME (seconds) and LOCAL COMMIT ACTION (1 or 2) in force on this
    /// node, for `ttRepSyncGet` on a session that did not set them.
    fn defaults(&self) -> (i64, i64);
}

/// The SQL engine of one node: hands out sessions over one database.
#[derive(Clone)]
pub struct SqlEngine {
    db: Database,
    replication: Option<Arc<dyn ReplicationDdl>>,
    returns: Option<Arc<dyn ReturnServices>>,
}

impl fmt::Debug for SqlEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlEngine")
            .field("db", &self.db)
            .field("replication", &self.replication.is_some())
            .finish()
    }
}

impl SqlEngine {
    /// An engine that refuses replication DDL (0A000).
    pub fn new(db: Database) -> Self {
        SqlEngine {
            db,
            replication: None,
            returns: None,
        }
    }

    /// This engine with commits and built-in procedures going through `hook`.
    pub fn with_return_services(mut self, hook: Arc<dyn ReturnServices>) -> Self {
        self.returns = Some(hook);
        self
    }

    /// An engine that runs replication DDL through `hook`.
    pub fn with_replication(db: Database, hook: Arc<dyn ReplicationDdl>) -> Self {
        SqlEngine {
            db,
            replication: Some(hook),
            returns: None,
        }
    }

    /// A new session (one per client connection).
    pub fn session(&self) -> Session {
        Session {
            db: self.db.clone(),
            replication: self.replication.clone(),
            returns: self.returns.clone(),
            txn: None,
            currval: HashMap::new(),
            sync: SyncSettings::default(),
            last_token: None,
            open: None,
            result_limit: None,
            statement_timeout: None,
            read_only: None,
        }
    }

    pub fn database(&self) -> &Database {
        &self.db
    }
}

/// One client's session: its open transaction, if any, and its CURRVAL values.
/// Dropping a session rolls back its open transaction.
pub struct Session {
    db: Database,
    replication: Option<Arc<dyn ReplicationDdl>>,
    returns: Option<Arc<dyn ReturnServices>>,
    txn: Option<Txn>,
    currval: HashMap<QualName, i64>,
    sync: SyncSettings,
    /// The last commit a return service applied to (`ttRepXactTokenGet`).
    last_token: Option<u64>,
    /// A commit left open by LOCAL COMMIT ACTION NO ACTION: only COMMIT (and the
    /// return-service procedures) may run until it ends.
    open: Option<OpenCommit>,
    /// How large a script's results may grow ([`Session::limit_results`]).
    result_limit: Option<ResultLimit>,
    /// How long one statement may run ([`Session::set_statement_timeout`]).
    statement_timeout: Option<Duration>,
    /// Why this session may only read, if it may ([`Session::set_read_only`]).
    read_only: Option<String>,
}

/// How large the results of one script may grow: what the caller can send back in one
/// reply. A statement whose result would take the script's past `max_bytes` fails with
/// 54000 (its rows are not kept) and the script stops there, as at any error.
#[derive(Clone)]
pub struct ResultLimit {
    pub max_bytes: usize,
    /// An upper bound of the bytes one statement's result takes in the reply.
    pub measure: Arc<dyn Fn(&StatementResult) -> usize + Send + Sync>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("in_transaction", &self.txn.is_some())
            .field("currval", &self.currval)
            .finish()
    }
}

struct DbCatalog<'a>(&'a Database);

impl Catalog for DbCatalog<'_> {
    fn table(&self, name: &QualName) -> Option<Arc<TableDef>> {
        self.0.table(name)
    }
}

impl Session {
    /// Runs every statement of `text` in order; stops at the first error.
    ///
    /// The whole script is parsed first, so a syntax error anywhere runs nothing.
    /// Bounds the results of every script this session runs from now on.
    pub fn limit_results(&mut self, limit: ResultLimit) {
        self.result_limit = Some(limit);
    }

    /// Bounds how long each DML statement, SELECT or EXPLAIN ANALYZE of the scripts this
    /// session runs from now on may take (`None`: no bound). One that runs longer fails
    /// with 57014 and is undone (its transaction keeps running); a timed out
    /// autocommitted statement commits nothing. The bound is checked between the rows a
    /// statement reads and writes: a row lock wait ends at the lock timeout, a commit's
    /// wait for a return service at its RETURN WAIT TIME, and DDL is not bounded.
    pub fn set_statement_timeout(&mut self, timeout: Option<Duration>) {
        self.statement_timeout = timeout.filter(|t| !t.is_zero());
    }

    /// Lets this session only read from now on (`Some(why)`, e.g. the caller's role):
    /// SELECT, EXPLAIN (ANALYZE of a SELECT only) and transaction control run; any other
    /// statement, replication DDL, a CALL or a NEXTVAL fails with 25006 saying `why`.
    pub fn set_read_only(&mut self, why: Option<String>) {
        self.read_only = why;
    }

    /// Refuses what a read-only session may not run ([`Session::set_read_only`]).
    fn check_read_only(&self, stmt: &ScriptStatement) -> Result<()> {
        let Some(why) = &self.read_only else {
            return Ok(());
        };
        let what = match &stmt.parsed {
            Parsed::Sql(ast) => match plan::plan(ast, &DbCatalog(&self.db))? {
                Plan::Select(_) | Plan::Begin | Plan::Commit | Plan::Rollback => return Ok(()),
                Plan::Explain { plan, analyze } => match *plan {
                    Plan::Select(_) => return Ok(()),
                    _ if !analyze => return Ok(()),
                    other => format!("EXPLAIN ANALYZE {}", other.tag()),
                },
                other => other.tag().to_string(),
            },
            Parsed::Replication(_) => "replication DDL".to_string(),
            Parsed::Call(_) => "CALL".to_string(),
            Parsed::Rejected(_) => return Ok(()),
        };
        Err(ErrorKind::ReadOnly(format!("cannot run {what}: {why}")).into())
    }

    pub async fn execute(&mut self, text: &str) -> ScriptOutcome {
        let statements = match script::parse_script(text) {
            Ok(s) => s,
            Err(e) => {
                return ScriptOutcome {
                    results: Vec::new(),
                    error: Some(SqlError::from_error(e.error, e.statement)),
                }
            }
        };
        let mut outcome = ScriptOutcome::default();
        let mut result_bytes = 0usize;
        for (i, stmt) in statements.iter().enumerate() {
            match self.run(stmt).await {
                Ok(result) => {
                    tracing::debug!(statement = i + 1, tag = %result.tag, rows = result.rows_affected, "statement ran");
                    if let Some(limit) = &self.result_limit {
                        result_bytes = result_bytes.saturating_add((limit.measure)(&result));
                        if result_bytes > limit.max_bytes {
                            let e = Error::from(ErrorKind::ResultTooLarge(format!(
                                "the results come to more than {} bytes, the most one reply \
                                 carries (--max-message-bytes): select fewer rows or columns \
                                 (WHERE, LIMIT), split the script, or page with Scan",
                                limit.max_bytes
                            )))
                            .or_at(stmt.at);
                            outcome.error = Some(SqlError::from_error(e, i + 1));
                            break;
                        }
                    }
                    outcome.results.push(result);
                }
                Err(e) => {
                    let e = e.or_at(stmt.at);
                    tracing::debug!(statement = i + 1, code = e.kind.code(), "statement failed");
                    outcome.error = Some(SqlError::from_error(e, i + 1));
                    break;
                }
            }
        }
        outcome
    }

    /// Whether a transaction block (BEGIN ... COMMIT) is open, or a commit left open
    /// ([`Session::left_open`]).
    pub fn in_transaction(&self) -> bool {
        self.txn.is_some() || self.open.is_some()
    }

    /// Whether a RETURN TWOSAFE commit timed out under LOCAL COMMIT ACTION NO ACTION
    /// and waits for the session to COMMIT again. Dropping the session commits it here.
    pub fn left_open(&self) -> bool {
        self.open.is_some()
    }

    async fn run(&mut self, stmt: &ScriptStatement) -> Result<StatementResult> {
        self.check_read_only(stmt)?;
        if self.open.is_some() {
            return self.run_while_open(stmt).await;
        }
        let ast = match &stmt.parsed {
            Parsed::Sql(ast) => ast,
            Parsed::Rejected(reason) => {
                return Err(Error::from(ErrorKind::Unsupported(reason.clone())).or_at(stmt.at))
            }
            Parsed::Replication(ddl) => return self.run_replication(ddl).await,
            Parsed::Call(call) => return self.run_call(call).await,
        };
        let plan = plan::plan(ast, &DbCatalog(&self.db))?;
        match &plan {
            Plan::Begin => {
                let mut result = StatementResult::tag("BEGIN");
                if self.txn.is_some() {
                    result.warnings.push(Warning {
                        code: "25001".into(),
                        message: "a transaction is already in progress".into(),
                    });
                } else {
                    self.txn = Some(self.db.begin());
                }
                Ok(result)
            }
            Plan::Commit => {
                let mut result = StatementResult::tag("COMMIT");
                match self.txn.take() {
                    Some(txn) => result.warnings = self.commit(txn).await?,
                    None => result.warnings.push(no_transaction()),
                }
                Ok(result)
            }
            Plan::Rollback => {
                let mut result = StatementResult::tag("ROLLBACK");
                match self.txn.take() {
                    Some(txn) => txn.rollback(),
                    None => result.warnings.push(no_transaction()),
                }
                self.sync.request_return = false;
                Ok(result)
            }
            ddl if ddl.is_ddl() => {
                if self.txn.is_some() {
                    return Err(ErrorKind::TransactionState(format!(
                        "{} cannot run inside a transaction block; COMMIT or ROLLBACK first",
                        ddl.tag()
                    ))
                    .into());
                }
                self.run_ddl(ddl).await
            }
            dml => {
                let deadline = self.statement_timeout.map(exec::Deadline::after);
                let mut ctx = SeqCtx::new(&self.db, &mut self.currval)
                    .with_deadline(deadline)
                    .read_only(self.read_only.clone());
                match &mut self.txn {
                    Some(txn) => {
                        // Statement-level atomicity: a failure undoes this statement only.
                        let sp = txn.statement_savepoint();
                        let result = exec::run_in_txn(dml, txn, &mut ctx).await;
                        if result.is_err() {
                            txn.rollback_to(sp);
                        }
                        result
                    }
                    None => {
                        let mut txn = self.db.begin();
                        // On error the transaction is dropped, which rolls it back.
                        let mut result = exec::run_in_txn(dml, &mut txn, &mut ctx).await?;
                        result.warnings.extend(self.commit(txn).await?);
                        Ok(result)
                    }
                }
            }
        }
    }

    /// Commits through the return services when the node has them; the warnings are
    /// COMMIT's (or the autocommitted statement's).
    async fn commit(&mut self, txn: Txn) -> Result<Vec<Warning>> {
        let sync = self.sync;
        self.sync.request_return = false;
        let Some(hook) = &self.returns else {
            txn.commit().await?;
            return Ok(Vec::new());
        };
        let committed = hook.commit(txn, sync).await?;
        if committed.token.is_some() {
            self.last_token = committed.token;
        }
        self.open = committed.open;
        Ok(committed.warnings)
    }

    /// A statement while a commit is left open: COMMIT waits for it again, the
    /// return-service procedures run, anything else is refused.
    async fn run_while_open(&mut self, stmt: &ScriptStatement) -> Result<StatementResult> {
        let refused = |what: &str| -> Result<StatementResult> {
            Err(ErrorKind::TransactionState(format!(
                "{what}: the last commit timed out waiting for its RETURN TWOSAFE \
                 subscribers under LOCAL COMMIT ACTION NO ACTION and is still open; COMMIT \
                 again to wait for them again, or CALL ttRepSyncSet(NULL, NULL, 2) and \
                 COMMIT to end it committed here"
            ))
            .into())
        };
        match &stmt.parsed {
            Parsed::Call(call)
                if matches!(
                    call.name.as_str(),
                    "ttrepsyncset"
                        | "ttrepsyncget"
                        | "ttrepxacttokenget"
                        | "ttrepxactstatus"
                        | "ttrepsyncsubscriberstatus"
                ) =>
            {
                self.run_call(call).await
            }
            Parsed::Sql(ast) => match plan::plan(ast, &DbCatalog(&self.db))? {
                Plan::Commit => self.commit_again().await,
                Plan::Rollback => refused(
                    "ROLLBACK is not possible: the transaction is committed on this node \
                     and was sent to its subscribers",
                ),
                other => refused(&format!("{} cannot run", other.tag())),
            },
            _ => refused("only COMMIT may run"),
        }
    }

    /// COMMIT of a commit left open: waits for its subscribers again, up to the return
    /// wait; then, under LOCAL COMMIT ACTION COMMIT, ends it committed here, and under
    /// NO ACTION leaves it open again.
    async fn commit_again(&mut self) -> Result<StatementResult> {
        let mut result = StatementResult::tag("COMMIT");
        let (default_wait, default_action) =
            self.returns.as_ref().map_or((10, 1), |h| h.defaults());
        let wait = self.sync.return_wait_s.unwrap_or(default_wait);
        let action = self.sync.local_action.unwrap_or(default_action);
        let Some(open) = self.open.as_mut() else {
            result.warnings.push(no_transaction());
            return Ok(result);
        };
        let settled = if wait < 0 {
            Some((&mut open.settled).await)
        } else {
            let limit = std::time::Duration::from_secs(wait.unsigned_abs());
            tokio::time::timeout(limit, &mut open.settled).await.ok()
        };
        let who = open.pending.join(", ");
        match settled {
            Some(warnings) => {
                self.open = None;
                result.warnings = warnings;
            }
            None if action == 2 => {
                // Dropping the wait ends it: the commit stands here.
                self.open = None;
                result.warnings.push(Warning {
                    code: "TT8170".into(),
                    message: format!(
                        "return service failed: subscriber {who} did not acknowledge within \
                         {wait}s; the transaction is committed here and will be replicated \
                         when the subscriber catches up (LOCAL COMMIT ACTION COMMIT)"
                    ),
                });
            }
            None => result.warnings.push(Warning {
                code: "TT8170".into(),
                message: format!(
                    "return service failed: subscriber {who} did not acknowledge within \
                     {wait}s again; the transaction stays open (LOCAL COMMIT ACTION NO \
                     ACTION): COMMIT again, or CALL ttRepSyncSet(NULL, NULL, 2) and COMMIT \
                     to end it committed here"
                ),
            }),
        }
        Ok(result)
    }

    async fn run_call(&mut self, call: &call::Call) -> Result<StatementResult> {
        match call.name.as_str() {
            "ttrepsyncset" => self.rep_sync_set(call),
            "ttrepsyncget" => {
                let (wait, action) = self.returns.as_ref().map_or((10, 1), |h| h.defaults());
                let mut result = StatementResult::tag("CALL");
                result.columns = vec![
                    ColumnMeta {
                        name: "requestReturn".into(),
                        data_type: "BINARY(1)".into(),
                    },
                    ColumnMeta {
                        name: "returnWait".into(),
                        data_type: "INTEGER".into(),
                    },
                    ColumnMeta {
                        name: "localAction".into(),
                        data_type: "INTEGER".into(),
                    },
                ];
                result.rows = vec![vec![
                    Value::Bytes(vec![u8::from(self.sync.request_return)]),
                    Value::Int(self.sync.return_wait_s.unwrap_or(wait)),
                    Value::Int(self.sync.local_action.unwrap_or(action)),
                ]];
                result.rows_affected = 1;
                Ok(result)
            }
            "ttrepxacttokenget" => {
                let mut result = StatementResult::tag("CALL");
                result.columns = vec![ColumnMeta {
                    name: "xactId".into(),
                    data_type: "VARBINARY(10000)".into(),
                }];
                result.rows = vec![vec![self
                    .last_token
                    .map_or(Value::Null, |t| Value::Bytes(t.to_be_bytes().to_vec()))]];
                result.rows_affected = 1;
                Ok(result)
            }
            _ => {
                if self.txn.is_some() && call.name == "ttrepsubscriberwait" {
                    return Err(ErrorKind::TransactionState(
                        "ttRepSubscriberWait must run outside a transaction block; COMMIT or \
                         ROLLBACK first"
                            .into(),
                    )
                    .into());
                }
                let Some(hook) = &self.returns else {
                    return Err(ErrorKind::Unsupported(format!(
                        "CALL {} needs the cluster control plane, which this SQL engine is not \
                         connected to",
                        call.written
                    ))
                    .into());
                };
                hook.call(call, self.last_token)
                    .await
                    .map_err(|e| ErrorKind::Replication(e).into())
            }
        }
    }

    /// `ttRepSyncSet([requestReturn], [returnWait], [localAction])`; NULL keeps a value.
    fn rep_sync_set(&mut self, call: &call::Call) -> Result<StatementResult> {
        let int = |i: usize, what: &str| -> Result<Option<i64>> {
            match call.arg(i) {
                Value::Null => Ok(None),
                Value::Int(v) => Ok(Some(*v)),
                Value::Bytes(b) if b.len() == 1 => Ok(Some(i64::from(b[0]))),
                other => Err(ErrorKind::InvalidStatement(format!(
                    "ttRepSyncSet: {what} must be an integer or NULL, not {other:?}"
                ))
                .into()),
            }
        };
        if call.args.len() > 3 {
            return Err(ErrorKind::InvalidStatement(format!(
                "ttRepSyncSet takes at most 3 arguments (requestReturn, returnWait, \
                 localAction), got {}",
                call.args.len()
            ))
            .into());
        }
        let request = int(0, "requestReturn")?;
        let wait = int(1, "returnWait")?;
        let action = int(2, "localAction")?;
        match request {
            Some(0) | None => {}
            Some(1) if self.txn.is_none() => {
                return Err(ErrorKind::TransactionState(
                    "ttRepSyncSet(0x01, ...) asks for the return service of the current \
                     transaction: run it inside a transaction block (BEGIN first)"
                        .into(),
                )
                .into())
            }
            Some(1) => {}
            Some(v) => {
                return Err(ErrorKind::InvalidStatement(format!(
                    "ttRepSyncSet: requestReturn must be 0x00 or 0x01, not {v:#04x}"
                ))
                .into())
            }
        }
        if let Some(w) = wait {
            if w < -1 {
                return Err(ErrorKind::InvalidStatement(format!(
                    "ttRepSyncSet: returnWait must be seconds >= 0, or -1 to wait until \
                     acknowledged; got {w}"
                ))
                .into());
            }
        }
        if let Some(a) = action {
            if !(1..=2).contains(&a) {
                return Err(ErrorKind::InvalidStatement(format!(
                    "ttRepSyncSet: localAction must be 1 (NO ACTION) or 2 (COMMIT), not {a}"
                ))
                .into());
            }
        }
        if let Some(r) = request {
            self.sync.request_return = r == 1;
        }
        if wait.is_some() {
            self.sync.return_wait_s = wait;
        }
        if action.is_some() {
            self.sync.local_action = action;
        }
        Ok(StatementResult::tag("CALL"))
    }

    async fn run_replication(&mut self, ddl: &str) -> Result<StatementResult> {
        let Some(hook) = &self.replication else {
            return Err(ErrorKind::Unsupported(script::REPLICATION_REJECTED.into()).into());
        };
        if self.txn.is_some() {
            return Err(ErrorKind::TransactionState(
                "replication DDL cannot run inside a transaction block; COMMIT or ROLLBACK first"
                    .into(),
            )
            .into());
        }
        hook.execute(ddl)
            .await
            .map_err(|e| ErrorKind::Replication(e).into())
    }

    async fn run_ddl(&mut self, plan: &Plan) -> Result<StatementResult> {
        let db = &self.db;
        match plan {
            Plan::CreateTable(def) => {
                db.create_table(def.clone()).await?;
            }
            Plan::DropTable { name, if_exists } => {
                if !(*if_exists && db.table(name).is_none()) {
                    db.drop_table(name).await?;
                }
            }
            Plan::AddColumn { table, column } => {
                db.add_column(table, column.clone()).await?;
            }
            Plan::CreateSequence(s) => {
                let def = SequenceDef::with_defaults(
                    s.name.clone(),
                    s.increment,
                    s.min_value,
                    s.max_value,
                    s.start,
                    s.cycle,
                );
                db.create_sequence(def).await?;
            }
            Plan::DropSequence { name, if_exists } => {
                if !(*if_exists && db.sequence(name).is_none()) {
                    db.drop_sequence(name).await?;
                    self.currval.remove(name);
                }
            }
            other => {
                return Err(
                    ErrorKind::InvalidStatement(format!("{} is not DDL", other.tag())).into(),
                )
            }
        }
        Ok(StatementResult::tag(plan.tag()))
    }
}

fn no_transaction() -> Warning {
    Warning {
        code: "25P01".into(),
        message: "there is no transaction in progress".into(),
    }
}
