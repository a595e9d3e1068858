//! Statement complexity: no statement can overflow the stack of the thread running the
//! session (which aborts the whole node). Too deep an expression fails with 54001 and
//! changes nothing; one at the limit runs, even on a fraction of a tokio worker's stack.

mod common;

use common::*;
use hawser_core::Value;
use hawser_sql::limits::{MAX_EXPR_DEPTH, MAX_NESTING_TOKENS, MAX_STATEMENT_DEPTH};
use hawser_sql::{Session, SqlError};

/// A tokio worker's stack.
const WORKER_STACK: usize = 2 << 20;

/// Runs `f` to completion on a thread of its own with `stack` bytes of stack.
fn on_stack<T: Send + 'static>(
    stack: usize,
    f: impl FnOnce(Session) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>
        + Send
        + 'static,
) -> T {
    on_thread_with_stack(stack, move || async move {
        let mut s = engine().session();
        ok(
            &mut s,
            "create table t (k int primary key, v int, s varchar(10000), b boolean);
             insert into t values (1, 1, 'x', true), (2, 2, 'y', false)",
        )
        .await;
        f(s).await
    })
}

const TABLE: [&str; 2] = ["1|1|x|TRUE", "2|2|y|FALSE"];

/// An expression shape, made at an exact depth.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Plus,
    Or,
    And,
    Concat,
    Not,
    Parens,
    /// `abs(abs(...))`
    Func,
    /// `case when true then case ... end end`
    Case,
    /// `cast(cast(... as int) as int)`
    Cast,
}

const SHAPES: [Shape; 9] = [
    Shape::Plus,
    Shape::Or,
    Shape::And,
    Shape::Concat,
    Shape::Not,
    Shape::Parens,
    Shape::Func,
    Shape::Case,
    Shape::Cast,
];

impl Shape {
    /// An expression `depth` levels deep (`depth` terms of a chain).
    fn expr(self, depth: usize) -> String {
        let chain = |term: &str, op: &str| vec![term; depth].join(op);
        let n = depth - 1;
        match self {
            Shape::Plus => chain("1", "+"),
            Shape::Or => format!("{}true", "false or ".repeat(n)),
            Shape::And => chain("true", " and "),
            Shape::Concat => chain("'a'", "||"),
            Shape::Not => format!("{}true", "not ".repeat(n)),
            Shape::Parens => format!("{}1{}", "(".repeat(n), ")".repeat(n)),
            Shape::Func => format!("{}1{}", "abs(".repeat(n), ")".repeat(n)),
            Shape::Case => format!("{}1{}", "case when true then ".repeat(n), " end".repeat(n)),
            Shape::Cast => format!("{}1{}", "cast(".repeat(n), " as int)".repeat(n)),
        }
    }

    /// The value of [`Shape::expr`].
    fn value(self, depth: usize) -> Value {
        match self {
            Shape::Plus => Value::Int(depth as i64),
            Shape::Or | Shape::And => Value::Bool(true),
            Shape::Concat => Value::Text("a".repeat(depth)),
            Shape::Not => Value::Bool(depth % 2 == 1),
            Shape::Parens | Shape::Func | Shape::Case | Shape::Cast => Value::Int(1),
        }
    }

    /// The column of `t` an expression of this shape fits.
    fn column(self) -> &'static str {
        match self {
            Shape::Plus | Shape::Parens | Shape::Func | Shape::Case | Shape::Cast => "v",
            Shape::Concat => "s",
            Shape::Or | Shape::And | Shape::Not => "b",
        }
    }

    /// A predicate `depth` levels deep that holds for both rows of `t`.
    fn predicate(self, depth: usize) -> String {
        match self {
            // One level for the comparison; v is 1 or 2, s 'x' or 'y'.
            Shape::Plus => format!("v <= {}", self.expr(depth - 1)),
            Shape::Parens | Shape::Func | Shape::Case | Shape::Cast => {
                format!("v >= {}", self.expr(depth - 1))
            }
            Shape::Concat => format!("s <> {}", self.expr(depth - 1)),
            Shape::Or | Shape::And => self.expr(depth),
            // TRUE under an even number of NOTs.
            Shape::Not if depth % 2 == 1 => self.expr(depth),
            Shape::Not => format!("true and {}", self.expr(depth - 1)),
        }
    }

    /// The statements that hold an expression `depth` levels deep, in every place one
    /// can stand.
    fn statements(self, depth: usize) -> Vec<String> {
        let (e, p, c) = (self.expr(depth), self.predicate(depth), self.column());
        vec![
            format!("select {e} from t where k = 1"),
            format!("select k from t where {p}"),
            format!("insert into t (k, {c}) values (3, {e})"),
            format!("update t set {c} = {e} where k = 1"),
            format!("update t set v = v where {p}"),
            format!("delete from t where {p}"),
            format!("explain select {e} from t"),
            format!("explain delete from t where {p}"),
        ]
    }
}

async fn unchanged(s: &mut Session) {
    assert_eq!(text(s, "select * from t order by k").await, TABLE);
}

fn assert_too_complex(e: &SqlError, statement: usize, sql: &str) {
    let head: String = sql.chars().take(60).collect();
    assert_eq!(e.code, "54001", "{head}...: {e}");
    assert_eq!(e.statement, statement, "{head}...: {e}");
    assert!(
        e.message.starts_with("statement too complex")
            && e.message.contains(&MAX_EXPR_DEPTH.to_string()),
        "{head}...: {e}"
    );
}

/// Every shape in every place, too deep: 54001 and nothing changed.
fn refused_at(depth: usize) {
    on_stack(WORKER_STACK, move |mut s| {
        Box::pin(async move {
            for shape in SHAPES {
                for sql in shape.statements(depth) {
                    assert_too_complex(&fails(&mut s, &sql).await, 1, &sql);
                    unchanged(&mut s).await;
                    // Refused before it runs (the script is refused whole when the
                    // statement is too long to parse); in a transaction, the failure
                    // undoes only the statement.
                    let script = format!("begin; insert into t values (4, 4, 'w', null); {sql}");
                    let out = s.execute(&script).await;
                    assert_too_complex(&out.error.expect("fails"), 3, &sql);
                    if s.in_transaction() {
                        assert_eq!(out.results.len(), 2);
                        assert_eq!(text(&mut s, "select k from t where k > 2").await, ["4"]);
                        ok(&mut s, "rollback").await;
                    } else {
                        assert!(out.results.is_empty());
                    }
                    unchanged(&mut s).await;
                }
            }
        })
    });
}

#[test]
fn one_level_past_the_limit_is_refused() {
    refused_at(MAX_EXPR_DEPTH + 1);
}

#[test]
fn a_thousand_levels_are_refused() {
    // Most shapes are short enough to be parsed, and the planner refuses them.
    const { assert!(4 * 1000 < MAX_NESTING_TOKENS) };
    refused_at(1000);
}

#[test]
fn five_thousand_levels_are_refused() {
    // Too long to be parsed at all.
    const { assert!(5000 > MAX_NESTING_TOKENS) };
    refused_at(5000);
}

#[test]
fn the_reported_statements() {
    on_stack(WORKER_STACK, |mut s| {
        Box::pin(async move {
            // A 4 KB SELECT 1+1+...+1 aborted the node; 1,600 terms ran.
            let plus = Shape::Plus.expr(1800);
            let or = Shape::Or.expr(2000);
            let and = Shape::And.expr(2000);
            let concat = Shape::Concat.expr(2000);
            for sql in [
                format!("select {plus}"),
                format!("select {or}"),
                format!("select {and}"),
                format!("select {concat}"),
                format!("insert into t (k, v) values (3, {plus})"),
                format!("explain select {plus} from t"),
            ] {
                assert_too_complex(&fails(&mut s, &sql).await, 1, &sql);
            }
            // Sixty NOTs were refused as "expected ; or the end of the script, found NOT".
            let sql = format!("select {}", Shape::Not.expr(61));
            assert_eq!(query(&mut s, &sql).await, vec![vec![Value::Bool(true)]]);
            unchanged(&mut s).await;
        })
    });
}

#[test]
fn statements_nest_at_most_the_limit() {
    on_stack(WORKER_STACK, |mut s| {
        Box::pin(async move {
            // EXPLAIN's statement is planned, so it nests 2 deep.
            const { assert!(MAX_STATEMENT_DEPTH >= 2) };
            let rows = ok(&mut s, "explain analyze update t set v = v where k = 1").await;
            assert!(!rows[0].rows.is_empty());
            // sqlparser does not guard these against the stack; 84 nested EXPLAINs
            // overflowed 2 MiB in a debug build.
            for n in [MAX_STATEMENT_DEPTH + 1, 100, 1000] {
                let sql = format!("{}select 1 from t", "prepare p as ".repeat(n - 1));
                let e = fails(&mut s, &sql).await;
                assert_eq!(e.code, "54001", "{e}");
                assert!(
                    e.message
                        .contains(&format!("statements nest more than {MAX_STATEMENT_DEPTH}")),
                    "{e}"
                );
                let sql = format!("{}select 1 from t", "explain ".repeat(n - 1));
                assert_eq!(fails(&mut s, &sql).await.code, "54001");
            }
            unchanged(&mut s).await;
        })
    });
}

#[test]
fn chains_far_past_the_limit_do_not_crash() {
    // 100,000 terms: the tree of such a chain overflowed 2 MiB merely being dropped.
    on_stack(WORKER_STACK, |mut s| {
        Box::pin(async move {
            for shape in SHAPES {
                let sql = format!("select {} from t", shape.expr(100_000));
                assert_too_complex(&fails(&mut s, &sql).await, 1, &sql);
            }
            let sql = format!("select 1 {}", "union select 1 ".repeat(50_000));
            assert_too_complex(&fails(&mut s, &sql).await, 1, &sql);
            let sql = format!("{}select 1", "explain ".repeat(50_000));
            assert_too_complex(&fails(&mut s, &sql).await, 1, &sql);
            unchanged(&mut s).await;
        })
    });
}

#[test]
fn the_error_names_the_statement() {
    on_stack(WORKER_STACK, |mut s| {
        Box::pin(async move {
            let deep = Shape::Plus.expr(2 * MAX_EXPR_DEPTH);
            let e = fails(&mut s, &format!("select 1;\n\n  select {deep} from t")).await;
            assert_eq!((e.code.as_str(), e.statement), ("54001", 2), "{e}");
            assert_eq!((e.line, e.column), (Some(3), Some(3)), "{e}");
            // Too long to parse: the script is refused whole, as for a syntax error.
            let long = Shape::Plus.expr(MAX_NESTING_TOKENS);
            let sql = format!("insert into t values (3, 3, 'z', null);\n  select {long} from t");
            let e = fails(&mut s, &sql).await;
            assert_eq!((e.code.as_str(), e.statement), ("54001", 2), "{e}");
            assert_eq!((e.line, e.column), (Some(2), Some(3)), "{e}");
            // A syntax error before the refused statement is reported first.
            let e = fails(&mut s, &format!("select from where; select {long}")).await;
            assert_eq!((e.code.as_str(), e.statement), ("42601", 1), "{e}");
            unchanged(&mut s).await;
        })
    });
}

/// Every shape in every place at the limit: the right answer.
async fn at_the_limit(mut s: Session) {
    let d = MAX_EXPR_DEPTH;
    for shape in SHAPES {
        let [select, where_, insert, set, update, delete, explain, explain_delete] =
            <[String; 8]>::try_from(shape.statements(d)).expect("eight statements");
        let c = shape.column();
        assert_eq!(query(&mut s, &select).await, vec![vec![shape.value(d)]]);
        assert_eq!(query(&mut s, &where_).await.len(), 2, "{shape:?}");
        ok(&mut s, &insert).await;
        assert_eq!(
            query(&mut s, &format!("select {c} from t where k = 3")).await,
            vec![vec![shape.value(d)]],
            "{shape:?}"
        );
        ok(&mut s, "delete from t where k = 3").await;
        let sql = format!("begin; {set}; select {c} from t where k = 1; rollback");
        let results = ok(&mut s, &sql).await;
        assert_eq!(results[2].rows, vec![vec![shape.value(d)]], "{shape:?}");
        assert_eq!(ok(&mut s, &update).await[0].rows_affected, 2, "{shape:?}");
        let results = ok(&mut s, &format!("begin; {delete}; rollback")).await;
        assert_eq!(results[1].rows_affected, 2, "{shape:?}");
        assert!(!ok(&mut s, &explain).await[0].rows.is_empty());
        assert!(!ok(&mut s, &explain_delete).await[0].rows.is_empty());
        unchanged(&mut s).await;
    }
}

// A debug build needs about 600 KB for a chain at the limit and 780 KB for nested
// functions or CASEs (a third of them the session's own); half a worker's stack leaves
// room to spare.
#[test]
fn expressions_at_the_limit_work_on_half_a_worker_stack() {
    on_stack(WORKER_STACK / 2, |s| Box::pin(at_the_limit(s)));
}

/// Aggregate queries rebind their outputs to the grouped row, another pass.
async fn aggregates(mut s: Session, d: usize) -> Vec<Result<Vec<String>, SqlError>> {
    let chain = |first: &str, n: usize| format!("{first}{}", " + 1".repeat(n - 1));
    let sqls = [
        format!(
            "select {} from t group by v order by 1",
            chain("count(*)", d)
        ),
        format!("select sum({}) from t", chain("1", d - 1)),
        format!(
            "select v from t group by v having {} = {}",
            chain("count(*)", d - 1),
            d - 1
        ),
        format!("select v from t order by {}", chain("v", d)),
        format!("select {} from t group by 1", chain("v", d)),
    ];
    let mut out = Vec::new();
    for sql in sqls {
        let result = s.execute(&sql).await;
        out.push(match result.error {
            Some(e) => Err(e),
            None => Ok(result.results[0]
                .rows
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join("|")
                })
                .collect()),
        });
    }
    unchanged(&mut s).await;
    out
}

#[test]
fn aggregate_queries_at_and_past_the_limit() {
    let d = MAX_EXPR_DEPTH;
    let results = on_stack(WORKER_STACK / 2, move |s| Box::pin(aggregates(s, d)));
    let expected = [
        vec![d.to_string(), d.to_string()],
        vec![(2 * (d - 1)).to_string()],
        vec!["1".to_string(), "2".to_string()],
        vec!["1".to_string(), "2".to_string()],
        vec![d.to_string(), (d + 1).to_string()],
    ];
    for (got, want) in results.into_iter().zip(expected) {
        let mut got = got.expect("runs");
        got.sort();
        assert_eq!(got, want);
    }
    for result in on_stack(WORKER_STACK, move |s| Box::pin(aggregates(s, d + 1))) {
        assert_too_complex(&result.expect_err("too deep"), 1, "aggregate");
    }
}
