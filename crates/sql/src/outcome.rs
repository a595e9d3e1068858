//! What a script returns to the client: one [`StatementResult`] per statement that ran,
//! and the error that stopped it, if any.

use hawser_core::Row;

use crate::error::SqlError;

/// The outcome of [`crate::Session::execute`].
#[derive(Debug, Clone, Default)]
pub struct ScriptOutcome {
    /// One result per statement that succeeded, in script order.
    pub results: Vec<StatementResult>,
    /// The first failure; the statements after it did not run.
    pub error: Option<SqlError>,
}

/// The result of one statement.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatementResult {
    /// What the statement was: `SELECT`, `INSERT`, `CREATE TABLE`, `BEGIN`, ...
    pub tag: String,
    /// Result columns (empty for statements that return no rows).
    pub columns: Vec<ColumnMeta>,
    pub rows: Vec<Row>,
    /// Rows inserted, updated or deleted; rows returned for a SELECT.
    pub rows_affected: u64,
    pub warnings: Vec<Warning>,
}

/// Name and SQL type of a result column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnMeta {
    pub name: String,
    /// The type as SQL spells it (`INTEGER`, `VARCHAR(10)`, `DECIMAL(10,2)`, ...).
    pub data_type: String,
}

/// A condition worth telling the client that did not stop the statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// SQLSTATE class 01 or 25 code, e.g. `25P01` for COMMIT outside a transaction.
    pub code: String,
    pub message: String,
}

impl StatementResult {
    /// A result with a tag and nothing else.
    pub fn tag(tag: &str) -> Self {
        StatementResult {
            tag: tag.to_string(),
            ..Default::default()
        }
    }
}
