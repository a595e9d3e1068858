//! hawser-rtl: Sybase-RTL-style net-row compilation (docs/design.md §6).
//!
//! A subscriber that is behind need not replay every intermediate row change: a run of
//! transactions can be reduced to one net operation per (table, key) and applied as a
//! batch sorted by key. This crate owns that reduction and nothing else — it is pure,
//! does no I/O and knows no store:
//!
//! * [`change`]: the input model both the commit log's full-image row changes and the
//!   lighter statement-level form convert into;
//! * [`mod@compile`]: the pair rules, the net result and the "not compilable" verdict;
//! * [`script`]: the front-end of `hawser rtl compile`, which reads CREATE TABLE and
//!   single-row DML in log order and renders the net result as SQL or JSON.
//!
//! Applying a result (DB2 exception rules, one atomic batch) is the store's job.

pub mod change;
pub mod compile;
pub mod script;

pub use change::{Assignment, Catalog, Change, ChangeKind, ChangeProblem};
pub use compile::{
    compile, compile_changes, Compilation, CompileError, Compiler, Counts, NetOp, NetTable,
    NotCompilable, Outcome, Reason,
};
pub use script::{compile_script, ScriptError, ScriptOutput, ScriptProblem};
