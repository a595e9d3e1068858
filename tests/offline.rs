//! End-to-end: the offline commands of the real binary (no server): `hawser scheme
//! check` / `fmt` and `hawser rtl compile`.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{hawser_bin, stderr, stdout};

fn run_with_stdin(args: &[&str], input: &str) -> std::process::Output {
    let mut child = Command::new(hawser_bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hawser");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

const VALID: &str = "CREATE REPLICATION repl.r1
ELEMENT e TABLE repl.tab
  MASTER masterds ON \"server1\"
  SUBSCRIBER subscriber1 ON \"server2\" RETURN RECEIPT
STORE masterds ON \"server1\" RETURN SERVICES ON WHEN REPLICATION STOPPED;
";

#[test]
fn scheme_check_accepts_valid_ddl_with_a_one_line_summary() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ok.sql");
    std::fs::write(&file, VALID).unwrap();
    let out = Command::new(hawser_bin())
        .args(["scheme", "check"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));
}

#[test]
fn scheme_check_points_at_the_problem_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.sql");
    // The same element name twice.
    std::fs::write(
        &file,
        "CREATE REPLICATION r\nELEMENT a TABLE t MASTER m SUBSCRIBER s\nELEMENT a TABLE u MASTER m SUBSCRIBER s;\n",
    )
    .unwrap();
    let out = Command::new(hawser_bin())
        .args(["scheme", "check"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("{}:3:9: error[TT8101]", file.display())),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.trim() == "^" || l.trim_start().starts_with('^')),
        "{err}"
    );

    let out = Command::new(hawser_bin())
        .args(["scheme", "check", "--format", "json"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert!(v.to_string().contains("\"line\":3"), "{v}");
}

#[test]
fn scheme_fmt_prints_canonical_ddl_that_checks_clean() {
    let out = run_with_stdin(&["scheme", "fmt", "-"], VALID);
    assert!(out.status.success(), "{}", stderr(&out));
    let canonical = stdout(&out);
    assert!(
        canonical.to_uppercase().contains("CREATE REPLICATION"),
        "{canonical}"
    );
    let again = run_with_stdin(&["scheme", "fmt", "-"], &canonical);
    assert_eq!(stdout(&again), canonical, "formatting is idempotent");
}

#[test]
fn rtl_compile_gives_the_seed_answers() {
    let example1 = "create table T (k int primary key, c int)
insert T values (1, 10)
update T set c = 11 where k = 1
delete T where k = 1
insert T values (1, 12)
delete T where k = 1
insert T values (1, 13)
";
    let out = run_with_stdin(&["rtl", "compile"], example1);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let sql: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("--") && !l.trim().is_empty())
        .collect();
    assert_eq!(sql, ["insert T values (1, 13)"], "{}", stdout(&out));

    let out = run_with_stdin(&["rtl", "compile", "--format", "json", "-"], example1);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert!(v.is_object(), "{v}");

    let out = run_with_stdin(&["rtl", "compile"], "insert T values (1, 10)\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("line 1"), "{}", stderr(&out));
}
