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
//!   0A000. `CALL` is refused with 0A000.
//!
//! See `docs/sql.md` for the supported SQL.

pub mod access;
pub mod error;
pub mod exec;
pub mod expr;
pub mod outcome;
pub mod plan;
pub mod script;
pub mod types;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hawser_core::{QualName, TableDef};
use hawser_store::{Database, SequenceDef, Txn};

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

/// The SQL engine of one node: hands out sessions over one database.
#[derive(Clone)]
pub struct SqlEngine {
    db: Database,
    replication: Option<Arc<dyn ReplicationDdl>>,
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
        }
    }

    /// An engine that runs replication DDL through `hook`.
    pub fn with_replication(db: Database, hook: Arc<dyn ReplicationDdl>) -> Self {
        SqlEngine {
            db,
            replication: Some(hook),
        }
    }

    /// A new session (one per client connection).
    pub fn session(&self) -> Session {
        Session {
            db: self.db.clone(),
            replication: self.replication.clone(),
            txn: None,
            currval: HashMap::new(),
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
    txn: Option<Txn>,
    currval: HashMap<QualName, i64>,
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
        for (i, stmt) in statements.iter().enumerate() {
            match self.run(stmt).await {
                Ok(result) => {
                    tracing::debug!(statement = i + 1, tag = %result.tag, rows = result.rows_affected, "statement ran");
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

    /// Whether a transaction block (BEGIN ... COMMIT) is open.
    pub fn in_transaction(&self) -> bool {
        self.txn.is_some()
    }

    async fn run(&mut self, stmt: &ScriptStatement) -> Result<StatementResult> {
        let ast = match &stmt.parsed {
            Parsed::Sql(ast) => ast,
            Parsed::Rejected(reason) => {
                return Err(Error::from(ErrorKind::Unsupported(reason.clone())).or_at(stmt.at))
            }
            Parsed::Replication(ddl) => return self.run_replication(ddl).await,
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
                    Some(txn) => {
                        txn.commit().await?;
                    }
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
                let mut ctx = SeqCtx::new(&self.db, &mut self.currval);
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
                        let result = exec::run_in_txn(dml, &mut txn, &mut ctx).await?;
                        txn.commit().await?;
                        Ok(result)
                    }
                }
            }
        }
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
