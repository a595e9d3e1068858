//! The two worked examples of the Sybase RTL text (`rtl-seed.txt`), run as written
//! through the script front-end.

use hawser_rtl::compile_script;

const TABLE: &str = "create table T (k int primary key, c int)\n";

const EXAMPLE_1: &str = "\
insert T values (1, 10)
update T set c = 11 where k = 1
delete T where k = 1
insert T values (1, 12)
delete T where k = 1
insert T values (1, 13)
";

const EXAMPLE_2: &str = "\
update T set c = 14 where k = 1
update T set c = 15 where k = 1
update T set c = 16 where k = 1
";

/// The statements of a rendering, without the comment lines.
fn statements(sql: &str) -> Vec<&str> {
    sql.lines().filter(|l| !l.starts_with("--")).collect()
}

#[test]
fn example_1_compiles_to_the_last_insert() {
    let out = compile_script(&format!("{TABLE}{EXAMPLE_1}")).unwrap();
    let sql = out.render_sql();
    assert_eq!(statements(&sql), ["insert T values (1, 13)"]);
    assert_eq!(
        sql.lines().next(),
        Some("-- 6 transactions, 6 row changes in, 1 net row operation out")
    );
    let c = out.compilation.counts;
    assert_eq!((c.transactions, c.row_changes, c.net_operations), (6, 6, 1));
}

#[test]
fn example_2_compiles_to_the_last_update() {
    let out = compile_script(&format!("{TABLE}{EXAMPLE_2}")).unwrap();
    assert_eq!(
        statements(&out.render_sql()),
        ["update T set c = 16 where k = 1"]
    );
    assert_eq!(out.compilation.counts.net_operations, 1);
}

#[test]
fn example_1_as_json_names_columns() {
    let out = compile_script(&format!("{TABLE}{EXAMPLE_1}")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&out.to_json()).unwrap();
    assert_eq!(
        doc,
        serde_json::json!({
            "compiled": true,
            "counts": {"transactions": 6, "row_changes": 6, "net_operations": 1},
            "tables": [{
                "table": "T",
                "operations": [{"op": "insert", "key": {"k": 1}, "row": {"k": 1, "c": 13}}],
            }],
        })
    );
}

#[test]
fn both_examples_in_one_script_keep_keys_apart() {
    // Example 2 on key 2 so the two runs do not meet.
    let script = format!("{TABLE}{EXAMPLE_1}{}", EXAMPLE_2.replace("k = 1", "k = 2"));
    let out = compile_script(&script).unwrap();
    assert_eq!(
        statements(&out.render_sql()),
        ["insert T values (1, 13)", "update T set c = 16 where k = 2"]
    );
}
