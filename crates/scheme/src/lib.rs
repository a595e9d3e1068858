//! hawser's replication-scheme language.
//!
//! The scheme is hawser's user interface for replication: Oracle TimesTen Classic's
//! `CREATE / ALTER / DROP REPLICATION`, plus hawser's `AS target [INTO table]` extension
//! for DB2-style target tables. This crate is pure (no I/O):
//!
//! ```text
//! text ─► lexer ─► parser ─► ast::Statement ─► validate ─► Scheme ─► route::plan
//!                                  │                          ▲  │
//!                                  └─ ALTER ─► alter::apply ──┘  └─► print (canonical text)
//! ```
//!
//! [`check`] wraps it all for the offline `hawser scheme check` / `fmt` commands.
//! `docs/scheme.md` records the language as hawser reads it, every error code and the
//! decisions taken.

pub mod alter;
pub mod ast;
pub mod check;
pub mod error;
pub mod lexer;
pub mod parser;
pub mod print;
pub mod route;
pub mod span;
pub mod validate;

pub use ast::{AlterReplication, Scheme, Statement};
pub use error::{ErrorCode, SchemeError};
pub use parser::{parse, parse_recovering, parse_statement};
pub use print::{print_scheme, print_statement, print_statements};

pub use alter::apply;
pub use check::{check_source, format_source, CheckReport, Diagnostic};
pub use route::{plan, RoutingPlan, Topology};
pub use span::Span;
pub use validate::{validate, validate_alter};
