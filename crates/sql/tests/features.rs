//! Every SQL feature of the single-node database, run as scripts against the
//! in-memory store.

mod common;

use common::*;
use hawser_core::Value;

#[tokio::test]
async fn create_table_with_every_type_and_read_values_back() {
    let mut s = engine().session();
    ok(
        &mut s,
        "CREATE TABLE all_types (
            i INTEGER PRIMARY KEY, i2 INT, b BIGINT, sm SMALLINT, ti TINYINT,
            n NUMBER(10,2), d DEC(5,1), dm DECIMAL(28,0), nf NUMBER,
            db DOUBLE, f FLOAT, r REAL,
            c CHAR(4), v VARCHAR(10), v2 VARCHAR2(10),
            bi BINARY(2), vb VARBINARY(4),
            dt DATE, ts TIMESTAMP, bo BOOLEAN)",
    )
    .await;
    let results = ok(
        &mut s,
        "insert into all_types values (1, 2, 3, 4, 5, 12.345, 1.25, 7, 0.1,
            1.5, 2.5e0, 3, 'ab', 'hello', 'x', X'0A', X'0102', DATE '2026-01-02',
            TIMESTAMP '2026-01-02 10:11:12', true)",
    )
    .await;
    assert_eq!(results[0].tag, "INSERT");
    assert_eq!(results[0].rows_affected, 1);
    let rows = text(&mut s, "select * from all_types").await;
    assert_eq!(
        rows,
        vec!["1|2|3|4|5|12.35|1.3|7|0.1|1.5|2.5|3|ab  |hello|x|0A00|0102|2026-01-02|2026-01-02 10:11:12|TRUE"]
    );
    // Column metadata carries the declared types.
    let r = ok(&mut s, "select n, c, v2 from all_types").await;
    let types: Vec<&str> = r[0].columns.iter().map(|c| c.data_type.as_str()).collect();
    assert_eq!(types, vec!["DECIMAL(10,2)", "CHAR(4)", "VARCHAR(10)"]);
    // CHAR compares blank-padded, DATE compares with a date literal in text.
    assert_eq!(
        query(
            &mut s,
            "select i from all_types where c = 'ab' and dt = '2026-01-02'"
        )
        .await,
        vec![vec![int(1)]]
    );
}

#[tokio::test]
async fn decimal_arithmetic_is_exact() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table acct (id int primary key, bal number(12,2));
         insert into acct values (1, 0.10), (2, 0.20)",
    )
    .await;
    assert_eq!(
        query(&mut s, "select sum(bal), sum(bal) = 0.3 from acct").await,
        vec![vec![dec("0.30"), Value::Bool(true)]]
    );
    ok(&mut s, "update acct set bal = bal * 3 where id = 1").await;
    assert_eq!(
        query(&mut s, "select bal from acct where id = 1").await,
        vec![vec![dec("0.30")]]
    );
}

#[tokio::test]
async fn sybase_forms_run_as_written() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table T (k int primary key, c int);
         insert T values (1, 10);
         insert T values (2, 20), (3, 30);
         delete T where k = 1;
         delete from T where k = 2",
    )
    .await;
    assert_eq!(text(&mut s, "select k, c from t").await, vec!["3|30"]);
}

#[tokio::test]
async fn insert_with_column_list_defaults_and_multi_row() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table t (k int primary key, name varchar(10) default 'none', qty int not null default 0);
         insert into t (k) values (1);
         insert into t (qty, k) values (5, 2), (6, 3);
         insert into t values (4, null, 7)",
    )
    .await;
    assert_eq!(
        text(&mut s, "select k, name, qty from t order by k").await,
        vec!["1|none|0", "2|none|5", "3|none|6", "4|NULL|7"]
    );
}

#[tokio::test]
async fn insert_select_copies_rows() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table a (k int primary key, v int);
         create table b (k int primary key, v int);
         insert into a values (1, 1), (2, 4), (3, 9);
         insert into b select k, v * 10 from a where k > 1",
    )
    .await;
    assert_eq!(text(&mut s, "select * from b").await, vec!["2|40", "3|90"]);
}

#[tokio::test]
async fn update_with_expressions_and_key_change() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table t (k int primary key, c int, s varchar(20));
         insert into t values (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')",
    )
    .await;
    let r = ok(&mut s, "update t set c = c + 1, s = s || '!' where k >= 2").await;
    assert_eq!(r[0].rows_affected, 2);
    assert_eq!(
        text(&mut s, "select * from t").await,
        vec!["1|1|a", "2|3|b!", "3|4|c!"]
    );
    ok(&mut s, "update t set k = k + 10 where k = 1").await;
    assert_eq!(text(&mut s, "select k from t").await, vec!["2", "3", "11"]);
    let r = ok(&mut s, "update t set c = 0").await;
    assert_eq!(r[0].rows_affected, 3);
}

#[tokio::test]
async fn where_clauses() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table p (id int primary key, name varchar(20), price number(6,2), tag varchar(5));
         insert into p values (1, 'apple', 1.50, 'f'), (2, 'banana', 0.25, null),
                              (3, 'cherry', 10, 'f'), (4, 'date', 3.00, 'x'), (5, 'apricot', 2.75, null)",
    )
    .await;
    let q = |w: &str| format!("select id from p where {w} order by id");
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("price > 2", vec!["3", "4", "5"]),
        ("price >= 1.5 and price <= 3", vec!["1", "4", "5"]),
        ("id = 1 or id = 3", vec!["1", "3"]),
        ("not (id < 4)", vec!["4", "5"]),
        ("id in (2, 4, 9)", vec!["2", "4"]),
        ("id not in (2, 4)", vec!["1", "3", "5"]),
        ("price between 1 and 3", vec!["1", "4", "5"]),
        ("price not between 1 and 3", vec!["2", "3"]),
        ("tag is null", vec!["2", "5"]),
        ("tag is not null", vec!["1", "3", "4"]),
        ("name like 'ap%'", vec!["1", "5"]),
        ("name like '_a%'", vec!["2", "4"]),
        ("name not like '%e%'", vec!["2", "5"]),
        // Unknown is not true: neither branch keeps the NULL tags.
        ("tag = 'f'", vec!["1", "3"]),
        ("tag <> 'f'", vec!["4"]),
        ("tag not in ('f', null)", vec![]),
        ("price = 10", vec!["3"]),
        ("price * 2 > 5 + 0.5", vec!["3", "4"]),
    ];
    for (w, want) in cases {
        assert_eq!(text(&mut s, &q(w)).await, want, "WHERE {w}");
    }
}

#[tokio::test]
async fn order_by_limit_offset_distinct() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table t (k int primary key, g varchar(5), v int);
         insert into t values (1, 'a', 30), (2, 'b', 10), (3, 'a', 20), (4, 'c', null), (5, 'b', 10)",
    )
    .await;
    assert_eq!(
        text(&mut s, "select k from t order by v desc, k").await,
        vec!["1", "3", "2", "5", "4"]
    );
    assert_eq!(
        text(&mut s, "select k, v as val from t order by val, k desc").await,
        vec!["4|NULL", "5|10", "2|10", "3|20", "1|30"]
    );
    assert_eq!(
        text(&mut s, "select g, k from t order by 1, 2 desc limit 3").await,
        vec!["a|3", "a|1", "b|5"]
    );
    assert_eq!(
        text(&mut s, "select k from t order by k limit 2 offset 2").await,
        vec!["3", "4"]
    );
    assert_eq!(
        text(&mut s, "select distinct g from t order by g").await,
        vec!["a", "b", "c"]
    );
    assert_eq!(
        text(&mut s, "select k from t order by v nulls first, k limit 1").await,
        vec!["4"]
    );
}

#[tokio::test]
async fn aggregates_with_group_by_and_having() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table sales (id int primary key, region varchar(5), amount number(8,2), qty int);
         insert into sales values (1, 'n', 10.50, 1), (2, 'n', 4.50, 3), (3, 's', 7, null),
                                  (4, 's', 3, 2), (5, 'e', 1, 1)",
    )
    .await;
    assert_eq!(
        text(
            &mut s,
            "select count(*), count(qty), sum(amount), min(amount), max(qty), avg(amount) from sales"
        )
        .await,
        vec!["5|4|26.00|1|3|5.20"]
    );
    assert_eq!(
        text(
            &mut s,
            "select region, count(*) as n, sum(amount) from sales group by region order by region"
        )
        .await,
        vec!["e|1|1", "n|2|15.00", "s|2|10"]
    );
    assert_eq!(
        text(
            &mut s,
            "select region, sum(qty) from sales group by region having count(*) > 1 order by 2 desc"
        )
        .await,
        vec!["n|4", "s|2"]
    );
    assert_eq!(
        text(&mut s, "select avg(qty) from sales").await,
        vec!["1.75"]
    );
    assert_eq!(
        text(&mut s, "select count(distinct region) from sales").await,
        vec!["3"]
    );
    // Over no rows: one row, COUNT 0 and SUM NULL; with GROUP BY, no rows.
    assert_eq!(
        text(
            &mut s,
            "select count(*), sum(qty) from sales where id > 100"
        )
        .await,
        vec!["0|NULL"]
    );
    assert!(text(
        &mut s,
        "select region, count(*) from sales where id > 100 group by region"
    )
    .await
    .is_empty());
    let e = fails(&mut s, "select region, count(*) from sales").await;
    assert_eq!(e.code, "42803");
    let e = fails(&mut s, "select id from sales where count(*) > 1").await;
    assert_eq!(e.code, "42803");
}

#[tokio::test]
async fn select_without_from_and_from_dual() {
    let mut s = engine().session();
    let r = ok(&mut s, "SELECT 1+1").await;
    assert_eq!(r[0].rows, vec![vec![int(2)]]);
    assert_eq!(r[0].columns[0].name, "1 + 1");
    assert_eq!(
        text(
            &mut s,
            "select 'a' || 'b' as x, 7 / 2, 7.0 / 2, -3 % 2, 1 = 1.0 from dual"
        )
        .await,
        vec!["ab|3|3.5|-1|TRUE"]
    );
    assert_eq!(
        text(&mut s, "select cast('12' as integer) + 1, upper('ab'), coalesce(null, 3), case when 1 > 2 then 'x' else 'y' end").await,
        vec!["13|AB|3|y"]
    );
}

#[tokio::test]
async fn sequences_nextval_currval_cycle_and_exhaustion() {
    let eng = engine();
    let mut s = eng.session();
    ok(
        &mut s,
        "create sequence s;
         create sequence c minvalue 1 maxvalue 3 increment by 1 start with 2 cycle;
         create sequence down increment by -5 start with 10 minvalue 0 maxvalue 10;
         create table t (id int primary key, v varchar(5))",
    )
    .await;
    let e = fails(&mut s, "select s.currval from dual").await;
    assert_eq!(e.code, "55000");
    assert_eq!(text(&mut s, "select s.nextval from dual").await, vec!["1"]);
    assert_eq!(
        text(&mut s, "SELECT S.NEXTVAL, s.currval FROM dual").await,
        vec!["2|2"]
    );
    assert_eq!(text(&mut s, "select s.currval from dual").await, vec!["2"]);
    ok(
        &mut s,
        "insert into t values (s.nextval, 'a'), (s.nextval, 'b')",
    )
    .await;
    assert_eq!(text(&mut s, "select id from t").await, vec!["3", "4"]);
    // CURRVAL is per session.
    let mut other = eng.session();
    let e = fails(&mut other, "select s.currval from dual").await;
    assert_eq!(e.code, "55000");

    let got: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.extend(text(&mut s, "select c.nextval from dual").await);
        }
        v
    };
    assert_eq!(got, vec!["2", "3", "1", "2"]);

    assert_eq!(
        text(&mut s, "select down.nextval from dual").await,
        vec!["10"]
    );
    assert_eq!(
        text(&mut s, "select down.nextval from dual").await,
        vec!["5"]
    );
    assert_eq!(
        text(&mut s, "select down.nextval from dual").await,
        vec!["0"]
    );
    let e = fails(&mut s, "insert into t values (down.nextval, 'z')").await;
    assert_eq!(e.code, "2200H");
    assert_eq!(text(&mut s, "select count(*) from t").await, vec!["2"]);
    let e = fails(&mut s, "select nosuch.nextval from dual").await;
    assert_eq!(e.code, "42P01");
    ok(&mut s, "drop sequence s").await;
    let e = fails(&mut s, "select s.nextval from dual").await;
    assert_eq!(e.code, "42P01");
}

#[tokio::test]
async fn alter_table_add_column_and_drop_table() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table t (k int primary key, a int);
         insert into t values (1, 1);
         alter table t add column b varchar(5) default 'x';
         insert into t values (2, 2, 'y')",
    )
    .await;
    assert_eq!(
        text(&mut s, "select * from t").await,
        vec!["1|1|x", "2|2|y"]
    );
    ok(&mut s, "drop table t").await;
    assert_eq!(fails(&mut s, "select * from t").await.code, "42P01");
    ok(&mut s, "drop table if exists t").await;
    ok(&mut s, "create table t (k int primary key)").await;
    assert!(query(&mut s, "select * from t").await.is_empty());
}

#[tokio::test]
async fn tables_without_primary_key_and_composite_keys() {
    let mut s = engine().session();
    ok(
        &mut s,
        "create table nokey (a int, b varchar(3));
         insert into nokey values (2, 'x'), (1, 'y'), (1, 'x');
         create table comp (a int, b int, v int, primary key (a, b));
         insert into comp values (1, 2, 3), (1, 1, 4), (0, 9, 5)",
    )
    .await;
    assert_eq!(
        text(&mut s, "select * from nokey").await,
        vec!["1|x", "1|y", "2|x"]
    );
    assert_eq!(
        fails(&mut s, "insert into nokey values (1, 'x')")
            .await
            .code,
        "23505"
    );
    assert_eq!(
        text(&mut s, "select * from comp").await,
        vec!["0|9|5", "1|1|4", "1|2|3"]
    );
    assert_eq!(
        fails(&mut s, "insert into comp values (1, 1, 0)")
            .await
            .code,
        "23505"
    );
}
