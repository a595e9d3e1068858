//! What runs before the load: the bench table created or checked against the
//! workload's shape, and the disk's fsync rate probed.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use hawser_client::{Client, ClientError};
use hawser_proto::v1;
use tokio::time::Instant;

use crate::output::error_text;

/// How long the fsync probe runs.
pub(super) const FSYNC_PROBE_TIME: Duration = Duration::from_secs(3);

/// Writes 4 KiB and `fdatasync`s it in a loop in a temporary file under `dir` for
/// `time`; returns syncs per second.
pub(super) fn fsync_probe(dir: &std::path::Path, time: Duration) -> anyhow::Result<f64> {
    use std::io::{Seek, SeekFrom};
    let mut file = tempfile::tempfile_in(dir)
        .with_context(|| format!("create a probe file in {}", dir.display()))?;
    let block = vec![0xA5u8; 4096];
    let start = Instant::now();
    let mut syncs = 0u64;
    while start.elapsed() < time {
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&block)?;
        file.sync_data().context("fdatasync the probe file")?;
        syncs += 1;
    }
    Ok(syncs as f64 / start.elapsed().as_secs_f64())
}

/// Whether `name` is `table` or `owner.table` with plain identifiers, so that it can be
/// spliced into the CREATE TABLE statement as is.
pub(super) fn is_plain_table_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            let mut chars = p.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        })
}

/// Creates the bench table if it does not exist, or checks that the one there fits;
/// `stamped`: with the `ts BINARY(8)` column of --check-conflicts.
pub(super) async fn prepare_table(
    client: &mut Client,
    table: &str,
    value_size: usize,
    stamped: bool,
) -> Result<(), String> {
    match client.describe(table).await {
        Ok(described) => check_table(&described, value_size, stamped),
        Err(ClientError::Status(s)) if hawser_client::sqlstate(&s) == Some("42P01") => {
            let sql = format!(
                "CREATE TABLE {table} (k BIGINT PRIMARY KEY, v VARCHAR({value_size}){})",
                if stamped { ", ts BINARY(8)" } else { "" }
            );
            let outcome = client
                .execute(&sql)
                .await
                .map_err(|e| format!("cannot create table {table}: {}", error_text(&e)))?;
            match outcome.error {
                Some(e) => Err(format!(
                    "cannot create table {table}: error[{}]: {}",
                    e.code, e.message
                )),
                None => Ok(()),
            }
        }
        Err(e) => Err(format!("cannot describe table {table}: {}", error_text(&e))),
    }
}

/// Checks that an existing table has the shape the workload writes:
/// `(k <integer> PRIMARY KEY, v CHAR/VARCHAR(n ≥ value_size))`, and `ts BINARY(8)` when
/// `stamped`.
fn check_table(d: &v1::DescribeResponse, value_size: usize, stamped: bool) -> Result<(), String> {
    let shape = if stamped {
        "it needs (k BIGINT PRIMARY KEY, v VARCHAR(n), ts BINARY(8)); drop it or pick another --table"
    } else {
        "it needs (k BIGINT PRIMARY KEY, v VARCHAR(n)); drop it or pick another --table"
    };
    let (k, v) = match d.columns.as_slice() {
        [k, v] if !stamped => (k, v),
        [k, v, ts]
            if stamped && ts.name.eq_ignore_ascii_case("ts") && ts.data_type == "BINARY(8)" =>
        {
            (k, v)
        }
        _ => {
            return Err(format!(
                "table {} has {} columns: {shape}",
                d.table,
                d.columns.len()
            ))
        }
    };
    let int_type = ["TINYINT", "SMALLINT", "INTEGER", "BIGINT"].contains(&k.data_type.as_str());
    if !k.name.eq_ignore_ascii_case("k") || !int_type || d.primary_key != ["k"] {
        return Err(format!(
            "table {} does not have k as an integer key: {shape}",
            d.table
        ));
    }
    let width = v
        .data_type
        .strip_prefix("VARCHAR(")
        .or_else(|| v.data_type.strip_prefix("CHAR("))
        .and_then(|rest| rest.strip_suffix(')'))
        .and_then(|n| n.parse::<usize>().ok());
    match width {
        Some(n) if v.name.eq_ignore_ascii_case("v") && n >= value_size => Ok(()),
        Some(n) if v.name.eq_ignore_ascii_case("v") => Err(format!(
            "column v of table {} holds {n} characters, less than --value-size {value_size}",
            d.table
        )),
        _ => Err(format!("table {} has no text column v: {shape}", d.table)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_must_be_plain() {
        assert!(is_plain_table_name("bench"));
        assert!(is_plain_table_name("app.bench_2"));
        assert!(!is_plain_table_name(""));
        assert!(!is_plain_table_name("1bench"));
        assert!(!is_plain_table_name("a.b.c"));
        assert!(!is_plain_table_name("bench; drop table x"));
    }

    fn described(columns: &[(&str, &str)], key: &[&str]) -> v1::DescribeResponse {
        v1::DescribeResponse {
            table: "bench".into(),
            columns: columns
                .iter()
                .map(|(name, ty)| v1::Column {
                    name: name.to_string(),
                    data_type: ty.to_string(),
                    nullable: true,
                })
                .collect(),
            primary_key: key.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn an_existing_table_must_fit_the_workload() {
        let good = described(&[("k", "BIGINT"), ("v", "VARCHAR(100)")], &["k"]);
        assert_eq!(check_table(&good, 100, false), Ok(()));
        assert!(check_table(&good, 100, true).is_err());
        let stamped = described(
            &[("k", "BIGINT"), ("v", "VARCHAR(100)"), ("ts", "BINARY(8)")],
            &["k"],
        );
        assert_eq!(check_table(&stamped, 100, true), Ok(()));
        assert!(check_table(&stamped, 100, false).is_err());
        assert!(check_table(&good, 101, false)
            .unwrap_err()
            .contains("less than --value-size 101"));
        let three = described(
            &[("k", "BIGINT"), ("v", "VARCHAR(9)"), ("w", "DATE")],
            &["k"],
        );
        assert!(check_table(&three, 1, false)
            .unwrap_err()
            .contains("3 columns"));
        let keyed_on_v = described(&[("k", "BIGINT"), ("v", "VARCHAR(100)")], &["v"]);
        assert!(check_table(&keyed_on_v, 1, false).is_err());
        let not_text = described(&[("k", "BIGINT"), ("v", "DATE")], &["k"]);
        assert!(check_table(&not_text, 1, false)
            .unwrap_err()
            .contains("no text column v"));
    }
}
