//! The script front-end: what it accepts, how it coerces literals, how it renders, and
//! what it refuses (with statement, line and column).

use hawser_rtl::script::ScriptProblem;
use hawser_rtl::{compile_script, Reason, ScriptError};

fn refuse(sql: &str) -> ScriptError {
    match compile_script(sql) {
        Ok(out) => panic!("expected a refusal, got {}", out.render_sql()),
        Err(e) => e,
    }
}

fn body(sql: &str) -> Vec<String> {
    compile_script(sql)
        .unwrap()
        .render_sql()
        .lines()
        .filter(|l| !l.starts_with("--"))
        .map(str::to_string)
        .collect()
}

const T: &str = "create table T (k int primary key, c int)\n";

#[test]
fn standard_forms_and_semicolons_are_accepted_too() {
    let sql = format!(
        "{T}insert into T (c, k) values (5, 1); delete from T where k = 1;; \
         insert into T values (2, 6); update T set c = 7 where (k = 2);"
    );
    assert_eq!(body(&sql), ["insert T values (2, 7)"]);
}

#[test]
fn an_update_must_name_one_row_by_its_whole_key() {
    let e = refuse(&format!(
        "{T}insert T values (1, 1)\nupdate T set c = 1 where c = 2\n"
    ));
    assert_eq!((e.statement, e.line, e.column), (3, 3, 26));
    assert_eq!(e.problem, ScriptProblem::NotOneRow("k".into()));
    assert_eq!(
        e.to_string(),
        "statement 3 (line 3, column 26): must name one row by its whole primary key (k) with `=`"
    );
    for bad in [
        "update T set c = 1 where k > 1",
        "update T set c = 1 where k = 1 or k = 2",
        "update T set c = 1 where k = 1 and k = 1",
        "update T set c = 1 where k = 1 and c = 1",
        "update T set c = 1",
        "delete T",
        "delete T where k = null",
        "delete T where k in (1)",
    ] {
        let e = refuse(&format!("{T}{bad}"));
        assert!(
            matches!(e.problem, ScriptProblem::NotOneRow(_)),
            "{bad}: {e}"
        );
        assert_eq!((e.statement, e.line), (2, 2), "{bad}");
    }
}

#[test]
fn a_composite_key_is_named_in_any_order() {
    let sql = "create table P (a int, b varchar(4), v int, primary key (b, a))\n\
               insert P values (1, 'x', 0)\n\
               update P set v = 3 where (a = 1) and 'x' = b\n";
    assert_eq!(body(sql), ["insert P values (1, 'x', 3)"]);
    let e = refuse(&format!("{sql}delete P where a = 1"));
    assert_eq!(e.problem, ScriptProblem::NotOneRow("b, a".into()));
}

#[test]
fn a_table_without_a_primary_key_keys_on_all_columns() {
    let sql = "create table U (a int, b int)\ninsert U values (1, 2)\ninsert U values (1, 3)\n\
               delete U where a = 1 and b = 2\n";
    assert_eq!(body(sql), ["insert U values (1, 3)"]);
    assert!(matches!(
        refuse("create table U (a int, b int)\ndelete U where a = 1").problem,
        ScriptProblem::NotOneRow(_)
    ));
}

#[test]
fn other_statements_and_forms_are_refused_with_their_place() {
    let cases: &[(&str, u64, u64)] = &[
        ("select * from T", 2, 1),
        ("insert T values (1, 2), (3, 4)", 2, 8),
        ("insert T select 1, 2", 2, 8),
        ("insert T values (1, 2) returning k", 2, 8),
        ("update T set c = 1 where k = 1 returning c", 2, 8),
        ("update T set c = 1 from T where k = 1", 2, 8),
        ("delete T where k = 1 limit 1", 2, 8),
        ("drop table T", 2, 1),
    ];
    for &(stmt, line, column) in cases {
        let e = refuse(&format!("{T}{stmt}"));
        assert_eq!(
            (e.statement, e.line, e.column),
            (2, line, column),
            "{stmt}: {e}"
        );
        assert!(
            matches!(
                e.problem,
                ScriptProblem::UnsupportedForm(_) | ScriptProblem::UnsupportedStatement(_)
            ),
            "{stmt}: {e}"
        );
    }
}

#[test]
fn expressions_are_refused() {
    let e = refuse(&format!("{T}update T set c = c + 1 where k = 1"));
    assert_eq!(e.problem, ScriptProblem::NotALiteral);
    assert_eq!((e.line, e.column), (2, 18));
}

#[test]
fn syntax_errors_name_the_statement() {
    let e = refuse(&format!(
        "{T}insert T values (1, 2)\nupdate T set where k = 1\n"
    ));
    assert_eq!(e.statement, 3);
    assert!(matches!(e.problem, ScriptProblem::Syntax(_)), "{e}");
}

#[test]
fn names_are_checked() {
    assert_eq!(
        refuse("insert T values (1)").problem,
        ScriptProblem::UnknownTable(hawser_core::QualName::bare("t"))
    );
    assert!(matches!(
        refuse(&format!("{T}update T set d = 1 where k = 1")).problem,
        ScriptProblem::UnknownColumn { .. }
    ));
    assert!(matches!(
        refuse(&format!("{T}create table t (x int)")).problem,
        ScriptProblem::DuplicateTable(_)
    ));
    assert!(matches!(
        refuse("create table X (a int, A int)").problem,
        ScriptProblem::DuplicateColumn(_)
    ));
    assert!(matches!(
        refuse(&format!("{T}insert T values (1)")).problem,
        ScriptProblem::ValueCount {
            expected: 2,
            got: 1
        }
    ));
}

#[test]
fn literals_are_coerced_to_the_column_types() {
    let sql = "create table L (k smallint primary key, d decimal(5,2), s char(3), v varchar(4), \
               f double, b boolean, n numeric)\n\
               insert L values (-3, 1.5, 'ab', 'it''s', 2, true, 123456789.123456789)\n";
    assert_eq!(
        body(sql),
        ["insert L values (-3, 1.50, 'ab ', 'it''s', 2, TRUE, 123456789.123456789)"]
    );
    let bad = |stmt: &str| {
        let e = refuse(&format!(
            "create table L (k smallint primary key, d decimal(5,2), v varchar(2))\n{stmt}"
        ));
        assert!(
            matches!(e.problem, ScriptProblem::BadLiteral { .. }),
            "{stmt}: {e}"
        );
    };
    bad("insert L values (40000, 1, 'a')");
    bad("insert L values (1.5, 1, 'a')");
    bad("insert L values (1, 1.234, 'a')");
    bad("insert L values (1, 1234, 'a')");
    bad("insert L values (1, 1, 'abc')");
    bad("insert L values ('1', 1, 'a')");
    bad("insert L values (1, 1, 5)");
}

#[test]
fn defaults_and_not_null_apply_to_inserts_with_a_column_list() {
    let sql = "create table D (k int primary key, c int default 7, n int not null, z int)\n";
    assert_eq!(
        body(&format!("{sql}insert D (k, n) values (1, 2)")),
        ["insert D values (1, 7, 2, NULL)"]
    );
    assert_eq!(
        refuse(&format!("{sql}insert D (k) values (1)")).problem,
        ScriptProblem::NullNotAllowed(hawser_core::Ident::unquoted("n"))
    );
    assert_eq!(
        refuse(&format!("{sql}update D set n = null where k = 1")).problem,
        ScriptProblem::NullNotAllowed(hawser_core::Ident::unquoted("n"))
    );
}

#[test]
fn quoted_names_keep_their_spelling() {
    let sql = "create table \"Tab\" (\"K\" int primary key, v varchar(5))\n\
               update \"Tab\" set V = 'x' where \"K\" = 1\n";
    assert_eq!(body(sql), ["update \"Tab\" set v = 'x' where \"K\" = 1"]);
    assert!(matches!(
        refuse("create table \"Tab\" (k int)\ninsert Tab values (1)").problem,
        ScriptProblem::UnknownTable(_)
    ));
}

#[test]
fn a_key_changing_update_renders_as_delete_and_insert() {
    let sql = format!("{T}update T set k = 2, c = 3 where k = 1\n");
    assert_eq!(
        body(&sql),
        ["delete T where k = 1", "insert T values (2, 3)"]
    );
    let sql = format!("{T}insert T values (1, 10)\nupdate T set k = 2 where k = 1\n");
    assert_eq!(body(&sql), ["insert T values (2, 10)"]);
}

#[test]
fn a_run_that_does_not_compile_is_shown_in_log_order_with_the_reason() {
    let sql =
        format!("{T}insert T values (1, 1)\ninsert T values (2, 2)\ninsert T values (1, 3)\n");
    let out = compile_script(&sql).unwrap();
    assert!(!out.compilation.is_compiled());
    let hawser_rtl::Outcome::NotCompilable(n) = &out.compilation.outcome else {
        unreachable!()
    };
    assert_eq!(
        n.reason,
        Reason::InvalidPair {
            first: hawser_core::ChangeOp::Insert,
            second: hawser_core::ChangeOp::Insert
        }
    );
    assert_eq!(
        out.render_sql(),
        "-- not compilable: table T, key (1): insert followed by insert is not a valid pair \
         at statement 4 (line 4); apply in log order\n\
         -- 3 transactions, 3 row changes in\n\
         insert T values (1, 1)\n\
         insert T values (2, 2)\n\
         insert T values (1, 3)\n"
    );
    let doc: serde_json::Value = serde_json::from_str(&out.to_json()).unwrap();
    assert_eq!(doc["compiled"], false);
    assert_eq!(doc["not_compilable"]["statement"], 4);
    assert_eq!(doc["not_compilable"]["line"], 4);
    assert_eq!(doc["not_compilable"]["key"], serde_json::json!([1]));
    assert_eq!(doc["log"].as_array().map(Vec::len), Some(3));
}

#[test]
fn an_empty_script_compiles_to_nothing() {
    let out = compile_script("").unwrap();
    assert_eq!(
        out.render_sql(),
        "-- 0 transactions, 0 row changes in, 0 net row operations out\n"
    );
    let out = compile_script(T).unwrap();
    assert_eq!(out.compilation.counts.transactions, 0);
}
