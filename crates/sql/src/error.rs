//! Errors of the SQL front end.
//!
//! Inside the crate a statement fails with an [`Error`]: a precise [`ErrorKind`] (each
//! with its SQLSTATE) and, where the parser gave one, the line and column in the
//! script. The session turns it into the public [`SqlError`], which also names the
//! statement (1-based) within the script, so a client can point at the culprit:
//!
//! ```text
//! statement 2 (line 3, column 7): column "nme" of table t does not exist
//! ```

use std::fmt;

use hawser_core::coerce::CoerceError;
use hawser_core::QualName;
use hawser_store::StoreError;
use sqlparser::tokenizer::Location;
use thiserror::Error;

/// Why one statement failed. Every variant has a SQLSTATE ([`ErrorKind::code`]).
#[derive(Debug, Error)]
pub enum ErrorKind {
    /// The text is not SQL sqlparser accepts (42601).
    #[error("syntax error: {0}")]
    Syntax(String),
    /// Valid SQL that hawser does not run (0A000).
    #[error("{0}")]
    Unsupported(String),
    #[error("table {0} does not exist")]
    UndefinedTable(QualName),
    #[error("sequence {0} does not exist")]
    UndefinedSequence(QualName),
    /// A column name that resolves to nothing (42703); the text says where it was looked up.
    #[error("{0}")]
    UndefinedColumn(String),
    #[error("column reference {0} is ambiguous")]
    AmbiguousColumn(String),
    #[error("column {0} is named more than once")]
    DuplicateColumn(String),
    /// Operands or values of types that do not fit together (42804).
    #[error("{0}")]
    TypeMismatch(String),
    /// Text that does not read as the value it must be (22P02).
    #[error("{0}")]
    InvalidText(String),
    #[error("division by zero")]
    DivisionByZero,
    /// Arithmetic or a conversion out of a type's range (22003).
    #[error("{0}")]
    NumericOverflow(String),
    /// A column used outside GROUP BY in an aggregate query, or an aggregate misplaced (42803).
    #[error("{0}")]
    Grouping(String),
    /// A table or sequence definition that cannot be (42P16).
    #[error("{0}")]
    InvalidDefinition(String),
    /// A statement that is not valid here, e.g. an INSERT with too many values (42601).
    #[error("{0}")]
    InvalidStatement(String),
    /// `seq.CURRVAL` before any `seq.NEXTVAL` in the session (55000).
    #[error("CURRVAL of sequence {0} is not yet defined in this session; use NEXTVAL first")]
    CurrvalUndefined(QualName),
    /// A statement that cannot run in the session's transaction state (25001).
    #[error("{0}")]
    TransactionState(String),
    /// A statement nested or chained past [`crate::limits`] (54001, as PostgreSQL's
    /// `statement_too_complex`); the text names the limit.
    #[error("statement too complex: {0}")]
    TooComplex(String),
    /// A write in a session that may only read (25006, as PostgreSQL's
    /// `read_only_sql_transaction`); the text says why it may only read.
    #[error("{0}")]
    ReadOnly(String),
    /// A statement that ran past the session's statement timeout (57014, as
    /// PostgreSQL's `query_canceled`); the text names the timeout.
    #[error("{0}")]
    StatementTimeout(String),
    /// A script whose results would not fit in one reply (54000, as PostgreSQL's
    /// `program_limit_exceeded`); the text names the limit.
    #[error("{0}")]
    ResultTooLarge(String),
    /// A value that does not fit a column type (the coercion's own SQLSTATE).
    #[error(transparent)]
    Coerce(#[from] CoerceError),
    /// The store refused (its own SQLSTATE: duplicate key, NOT NULL, lock timeout, ...).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Replication DDL refused by the node's [`crate::ReplicationDdl`] hook, with the
    /// code it chose (a scheme checker code such as `TT8106`, or a SQLSTATE).
    #[error("{}", .0.message)]
    Replication(ReplicationError),
}

/// Why the node could not run a replication DDL statement: a code (the scheme checker's,
/// e.g. `TT8106`, or a SQLSTATE such as `57P03`) and a message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{code}: {message}")]
pub struct ReplicationError {
    pub code: String,
    pub message: String,
}

impl ErrorKind {
    /// The SQLSTATE of this error (for [`ErrorKind::Replication`], the hook's code).
    pub fn code(&self) -> &str {
        match self {
            ErrorKind::Syntax(_) | ErrorKind::InvalidStatement(_) => "42601",
            ErrorKind::Unsupported(_) => "0A000",
            ErrorKind::UndefinedTable(_) | ErrorKind::UndefinedSequence(_) => "42P01",
            ErrorKind::UndefinedColumn(_) => "42703",
            ErrorKind::AmbiguousColumn(_) => "42702",
            ErrorKind::DuplicateColumn(_) => "42701",
            ErrorKind::TypeMismatch(_) => "42804",
            ErrorKind::InvalidText(_) => "22P02",
            ErrorKind::DivisionByZero => "22012",
            ErrorKind::NumericOverflow(_) => "22003",
            ErrorKind::Grouping(_) => "42803",
            ErrorKind::InvalidDefinition(_) => "42P16",
            ErrorKind::CurrvalUndefined(_) => "55000",
            ErrorKind::TransactionState(_) => "25001",
            ErrorKind::TooComplex(_) => "54001",
            ErrorKind::ResultTooLarge(_) => "54000",
            ErrorKind::StatementTimeout(_) => "57014",
            ErrorKind::ReadOnly(_) => "25006",
            ErrorKind::Coerce(e) => e.code(),
            ErrorKind::Store(e) => e.code(),
            ErrorKind::Replication(e) => &e.code,
        }
    }
}

/// An [`ErrorKind`] with the place in the script it points at, when known.
#[derive(Debug, Error)]
#[error("{kind}")]
pub struct Error {
    /// Boxed: errors travel through every `Result` of the crate and should stay small.
    pub kind: Box<ErrorKind>,
    pub at: Option<Location>,
}

impl Error {
    /// Points the error at `loc` unless it already points somewhere more precise.
    pub fn or_at(mut self, loc: Location) -> Self {
        if self.at.is_none() && loc.line > 0 {
            self.at = Some(loc);
        }
        self
    }
}

impl<E: Into<ErrorKind>> From<E> for Error {
    fn from(kind: E) -> Self {
        Error {
            kind: Box::new(kind.into()),
            at: None,
        }
    }
}

/// Shorthand for the crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds a location to the error of a result.
pub(crate) trait At<T> {
    fn at(self, loc: Location) -> Result<T>;
}

impl<T, E: Into<Error>> At<T> for std::result::Result<T, E> {
    fn at(self, loc: Location) -> Result<T> {
        self.map_err(|e| e.into().or_at(loc))
    }
}

/// The error a client sees: SQLSTATE, message, and where in the script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlError {
    /// SQLSTATE, e.g. `23505` for a duplicate key.
    pub code: String,
    pub message: String,
    /// 1-based index of the failing statement in the script.
    pub statement: usize,
    /// 1-based line in the script, when the parser or the AST gave one.
    pub line: Option<u64>,
    /// 1-based column in the script, when the parser or the AST gave one.
    pub column: Option<u64>,
    /// The table a write was refused on because this node receives it (25006): the
    /// node tells the client where the table's master is.
    pub received_table: Option<QualName>,
}

impl SqlError {
    pub(crate) fn from_error(err: Error, statement: usize) -> Self {
        let received_table = match &*err.kind {
            ErrorKind::Store(StoreError::ReceivedTable { table, .. }) => Some(table.clone()),
            _ => None,
        };
        SqlError {
            received_table,
            code: err.kind.code().to_string(),
            message: err.kind.to_string(),
            statement,
            line: err.at.map(|l| l.line),
            column: err.at.map(|l| l.column),
        }
    }
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => write!(
                f,
                "statement {} (line {line}, column {column}): {}",
                self.statement, self.message
            ),
            _ => write!(f, "statement {}: {}", self.statement, self.message),
        }
    }
}

impl std::error::Error for SqlError {}
