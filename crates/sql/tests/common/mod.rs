//! Helpers shared by the SQL integration tests.

#![allow(dead_code)]

use hawser_core::{NodeId, Value};
use hawser_sql::{Session, SqlEngine, SqlError, StatementResult};
use hawser_store::{Database, DbOptions};

pub fn engine() -> SqlEngine {
    let db = Database::open_memory(DbOptions::new(NodeId(1))).expect("open memory database");
    SqlEngine::new(db)
}

/// Runs a script that must succeed.
pub async fn ok(s: &mut Session, sql: &str) -> Vec<StatementResult> {
    let out = s.execute(sql).await;
    if let Some(e) = out.error {
        panic!("script failed: {e} [{}]\n{sql}", e.code);
    }
    out.results
}

/// Runs a script that must fail; returns the error.
pub async fn fails(s: &mut Session, sql: &str) -> SqlError {
    let out = s.execute(sql).await;
    match out.error {
        Some(e) => e,
        None => panic!("script should have failed: {sql}"),
    }
}

/// The rows of a single SELECT.
pub async fn query(s: &mut Session, sql: &str) -> Vec<Vec<Value>> {
    let mut results = ok(s, sql).await;
    assert_eq!(results.len(), 1, "one statement expected: {sql}");
    results.remove(0).rows
}

/// The rows of a single SELECT as text, one string per row, columns joined by `|`.
pub async fn text(s: &mut Session, sql: &str) -> Vec<String> {
    query(s, sql)
        .await
        .iter()
        .map(|r| {
            r.iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect()
}

pub fn int(i: i64) -> Value {
    Value::Int(i)
}

pub fn dec(s: &str) -> Value {
    Value::Decimal(s.parse().expect("decimal literal"))
}

pub fn txt(s: &str) -> Value {
    Value::Text(s.to_string())
}

/// Runs the future `f` makes to completion on a thread of its own with `stack` bytes of
/// stack and a current-thread runtime: a statement's recursion measured against the
/// stack a node's tokio worker has. A panic there (an overflow aborts) fails the caller.
pub fn on_thread_with_stack<T, Fut>(stack: usize, f: impl FnOnce() -> Fut + Send + 'static) -> T
where
    T: Send + 'static,
    Fut: std::future::Future<Output = T>,
{
    std::thread::Builder::new()
        .stack_size(stack)
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(f())
        })
        .expect("spawn")
        .join()
        .expect("the test thread panicked")
}
