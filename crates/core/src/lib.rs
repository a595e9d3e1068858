//! Shared domain types for every hawser crate.
//!
//! This crate owns the vocabulary the rest of hawser speaks: node and transaction
//! identities and positions ([`ids`]), SQL names ([`name`]), column types and typed
//! values ([`types`], [`value`]), table definitions ([`schema`]), row changes as the
//! commit log records them ([`change`]) and the order-preserving key encoding that the
//! store sorts rows by ([`key`]).
//!
//! It does no I/O and depends on nothing of hawser's, so the pure crates (`scheme`,
//! `rtl`) can build on it alone.

pub mod change;
pub mod coerce;
pub mod ids;
pub mod isolation;
pub mod key;
pub mod name;
pub mod schema;
#[cfg(feature = "strategies")]
pub mod strategies;
pub mod types;
pub mod value;

pub use change::{ChangeOp, RowChange, Transaction};
pub use ids::{Epoch, Gtid, Lsn, NodeId};
pub use name::{Ident, QualName};
pub use schema::{ColumnDef, TableDef};
pub use types::DataType;
pub use value::{Row, Value};
