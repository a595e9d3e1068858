//! Random SQL-shaped input never panics: scripts drawn from a small grammar (statements,
//! expressions over the seeded tables' columns, literals at the edges of their types),
//! token soup that is rarely valid SQL, and expressions nested or chained far past the
//! complexity limits each either run or fail with an error. Every case runs on a thread
//! with a tokio worker's stack, as a node runs statements, so an overflow fails the test
//! too (it aborts the test binary). The fuzz target `crates/fuzz/fuzz_targets/sql.rs`
//! explores the same ground for longer.

mod common;

use common::*;
use hawser_sql::limits::MAX_EXPR_DEPTH;
use proptest::prelude::*;
use proptest::test_runner::Config;

/// A tokio worker's stack.
const WORKER_STACK: usize = 2 << 20;

const SEED: &str = "
create table t (k int primary key, v int, s varchar(20), d decimal(10,2), f double,
                b boolean, dt date, ts timestamp, bin varbinary(8));
create table u (a int not null, b varchar(10) not null, x bigint default 7,
                primary key (a, b));
create sequence q start with 5 increment by 3 maxvalue 100 cycle;
insert into t values
  (1, 10, 'one', 1.50, 2.5, true, date '2024-01-31', timestamp '2024-01-31 12:00:00', x'00ff'),
  (2, -3, 'two', -0.01, -1e10, false, date '1999-12-31', timestamp '1970-01-01 00:00:00', x''),
  (3, null, null, null, null, null, null, null, null);
insert into u values (1, 'a', 1), (1, 'b', 2), (2, 'a', 9223372036854775807);
";

/// Runs `script` after the seed in a fresh session, on a thread of a worker's stack.
/// Either outcome is fine; a panic or an overflow is not.
fn survives(script: String) {
    on_thread_with_stack(WORKER_STACK, move || async move {
        let mut s = engine().session();
        ok(&mut s, SEED).await;
        let out = s.execute(&script).await;
        if let Some(e) = &out.error {
            assert_eq!(e.code.len(), 5, "a SQLSTATE: {e} [{}]", e.code);
            let _ = e.to_string();
        }
        for v in out.results.iter().flat_map(|r| &r.rows).flatten() {
            let _ = v.to_string();
        }
    })
}

fn column() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "k",
        "v",
        "s",
        "d",
        "f",
        "b",
        "dt",
        "ts",
        "bin",
        "a",
        "x",
        "t.k",
        "t.v",
        "nope",
        "\"K\"",
        "q.nextval",
        "q.currval",
    ])
    .prop_map(str::to_string)
}

/// A column as SET and ADD COLUMN name one.
fn plain_column() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "k", "v", "s", "d", "f", "b", "a", "x", "nope", "\"K\"",
    ])
    .prop_map(str::to_string)
}

fn literal() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|i| i.to_string()),
        (-1000i64..1000).prop_map(|i| i.to_string()),
        prop::sample::select(vec![
            "0",
            "1",
            "-1",
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "99999999999999999999999999999",
            "0.5",
            "-12.340",
            "1e308",
            "1e309",
            "-0.0",
            "1.0e-400",
            "'x'",
            "''",
            "'it''s'",
            "'2024-02-30'",
            "x'0a0b'",
            "x'zz'",
            "date '2024-01-01'",
            "date '0000-00-00'",
            "timestamp '2024-01-01 00:00:00'",
            "null",
            "true",
            "false",
        ])
        .prop_map(str::to_string),
        "[a-z ]{0,12}".prop_map(|s| format!("'{s}'")),
    ]
}

fn data_type() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "int",
        "smallint",
        "tinyint",
        "bigint",
        "decimal(10,2)",
        "number",
        "number(38)",
        "double",
        "varchar(3)",
        "char(2)",
        "varbinary(2)",
        "date",
        "timestamp",
        "boolean",
    ])
}

fn expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![literal(), column()];
    leaf.prop_recursive(6, 48, 4, |inner| {
        let binop = prop::sample::select(vec![
            "+", "-", "*", "/", "%", "||", "=", "<>", "<", "<=", ">", ">=", "and", "or", "like",
            "not like", "ilike",
        ]);
        let func = prop::sample::select(vec![
            "abs", "upper", "lower", "length", "coalesce", "nvl", "sum", "min", "max", "avg",
            "count", "nosuch",
        ]);
        prop_oneof![
            (inner.clone(), binop, inner.clone()).prop_map(|(a, op, b)| format!("{a} {op} {b}")),
            inner.clone().prop_map(|e| format!("({e})")),
            inner.clone().prop_map(|e| format!("(not {e})")),
            inner.clone().prop_map(|e| format!("(- {e})")),
            (func, prop::collection::vec(inner.clone(), 1..3))
                .prop_map(|(f, args)| format!("{f}({})", args.join(", "))),
            (inner.clone(), data_type()).prop_map(|(e, t)| format!("cast({e} as {t})")),
            (
                inner.clone(),
                inner.clone(),
                prop::option::of(inner.clone())
            )
                .prop_map(|(c, v, e)| match e {
                    Some(e) => format!("case when {c} then {v} else {e} end"),
                    None => format!("case when {c} then {v} end"),
                }),
            (inner.clone(), prop::collection::vec(inner.clone(), 1..4))
                .prop_map(|(e, l)| format!("{e} in ({})", l.join(", "))),
            (inner.clone(), inner.clone(), inner.clone())
                .prop_map(|(e, lo, hi)| format!("{e} between {lo} and {hi}")),
            inner.clone().prop_map(|e| format!("{e} is not null")),
        ]
    })
}

fn statement() -> impl Strategy<Value = String> {
    let table = prop::sample::select(vec!["t", "u", "dual", "nope"]);
    prop_oneof![
        (
            prop::collection::vec(expr(), 1..4),
            table.clone(),
            prop::option::of(expr()),
            prop::option::of(expr()),
            prop::option::of(0u32..5),
        )
            .prop_map(|(list, t, w, g, l)| {
                let mut s = format!("select {} from {t}", list.join(", "));
                if let Some(w) = w {
                    s += &format!(" where {w}");
                }
                if let Some(g) = g {
                    s += &format!(" group by {g} having {g} order by 1 desc");
                }
                if let Some(l) = l {
                    s += &format!(" limit {l} offset 1");
                }
                s
            }),
        (any::<i32>(), expr(), expr())
            .prop_map(|(k, v, s)| format!("insert into t (k, v, s) values ({k}, {v}, {s})")),
        (plain_column(), expr(), prop::option::of(expr())).prop_map(|(c, e, w)| match w {
            Some(w) => format!("update t set {c} = {e} where {w}"),
            None => format!("update u set {c} = {e}"),
        }),
        (table.clone(), expr()).prop_map(|(t, w)| format!("delete from {t} where {w}")),
        (plain_column(), data_type(), prop::option::of(literal())).prop_map(|(c, ty, d)| {
            let default = d.map(|d| format!(" default {d}")).unwrap_or_default();
            format!("alter table t add column {c} {ty}{default}")
        }),
        (data_type(), data_type()).prop_map(|(a, b)| format!(
            "create table z (p {a} primary key, o {b} not null); insert into z select k, s from t"
        )),
        Just("begin".to_string()),
        Just("commit".to_string()),
        Just("rollback".to_string()),
        Just("drop table t".to_string()),
        (any::<i64>(), any::<i64>())
            .prop_map(|(i, m)| format!("create sequence r increment by {i} maxvalue {m}")),
        expr().prop_map(|e| format!("explain analyze select {e} from t")),
    ]
}

/// Words and symbols in any order: mostly syntax errors, sometimes a statement.
fn token_soup() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        prop::sample::select(vec![
            "select",
            "from",
            "where",
            "insert",
            "into",
            "values",
            "update",
            "set",
            "delete",
            "create",
            "table",
            "drop",
            "alter",
            "add",
            "column",
            "primary",
            "key",
            "not",
            "null",
            "and",
            "or",
            "case",
            "when",
            "then",
            "else",
            "end",
            "cast",
            "as",
            "in",
            "between",
            "like",
            "escape",
            "group",
            "by",
            "having",
            "order",
            "limit",
            "offset",
            "explain",
            "analyze",
            "begin",
            "commit",
            "rollback",
            "call",
            "replication",
            "element",
            "dual",
            "(",
            ")",
            "[",
            "]",
            ",",
            ";",
            ".",
            "+",
            "-",
            "*",
            "/",
            "%",
            "||",
            "=",
            "<>",
            "<",
            ">",
            "?",
            "$1",
            "::",
            "'",
            "\"",
            "--",
            "/*",
            "*/",
            "\\",
        ])
        .prop_map(str::to_string),
        column(),
        literal(),
    ];
    prop::collection::vec(token, 0..40).prop_map(|t| t.join(" "))
}

/// An expression nested `n` deep in one of the ways that recursed unbounded before the
/// complexity limits (issue #46), or a chain of `n` terms.
fn deep() -> impl Strategy<Value = String> {
    let n = prop_oneof![1..=MAX_EXPR_DEPTH + 8, 200usize..3000];
    (0u8..10, n).prop_map(|(shape, n)| {
        let wrap = |open: &str, close: &str| format!("{}1{}", open.repeat(n), close.repeat(n));
        let chain = |op: &str| vec!["1"; n].join(op);
        let e = match shape {
            0 => chain(" + "),
            1 => chain(" or "),
            2 => chain(" || "),
            3 => wrap("(", ")"),
            4 => format!("{}true", "not ".repeat(n)),
            5 => wrap("abs(", ")"),
            6 => wrap("- ", ""),
            7 => wrap("case when true then ", " end"),
            8 => wrap("cast(", " as int)"),
            _ => wrap("coalesce(null, ", ")"),
        };
        match n % 4 {
            0 => format!("select {e}"),
            1 => format!("select k from t where k = {e}"),
            2 => format!("insert into t (k, v) values (7, {e})"),
            _ => format!("explain select {e} from t"),
        }
    })
}

proptest! {
    #![proptest_config(Config { cases: 96, ..Config::default() })]

    #[test]
    fn a_script_from_the_grammar_never_panics(
        script in prop::collection::vec(statement(), 1..4).prop_map(|s| s.join(";\n"))
    ) {
        survives(script);
    }

    #[test]
    fn token_soup_never_panics(script in token_soup()) {
        survives(script);
    }
}

proptest! {
    #![proptest_config(Config { cases: 32, ..Config::default() })]

    #[test]
    fn deep_nesting_and_long_chains_never_panic(script in deep()) {
        survives(script);
    }
}
