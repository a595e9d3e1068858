//! Table checksums: how the demo shows that a subscriber holds what its master holds.
//!
//! hawser's SQL has no checksum aggregate, so the demo computes one client-side, the
//! way pt-table-checksum does for MySQL: read every row of the table on each node with
//! `SELECT * ... ORDER BY <primary key>`, and run CRC-32 over the rows in that order.
//! Each row is fed as its order-preserving key encoding (`hawser_core::encode_key` of
//! all its values): typed and self-delimiting, so `NULL` and the text `'NULL'`, or the
//! rows `('a', 'bc')` and `('ab', 'c')`, never hash alike. Two nodes agree when they
//! hold the same number of rows and the same CRC.

use anyhow::{bail, Context};
use hawser_client::Client;
use hawser_core::key::encode_key;
use hawser_core::Row;
use serde::Serialize;

/// A table's checksum on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Checksum {
    pub(crate) rows: u64,
    /// CRC-32 (IEEE) of the rows' encodings in key order.
    #[serde(serialize_with = "hex")]
    pub(crate) crc32: u32,
}

fn hex<S: serde::Serializer>(crc: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{crc:08x}"))
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} rows {:08x}", self.rows, self.crc32)
    }
}

/// The checksum of `rows`, which must be in key order.
pub(crate) fn of_rows(rows: &[Row]) -> Checksum {
    let mut crc = crc32fast::Hasher::new();
    for row in rows {
        crc.update(&encode_key(row));
    }
    Checksum {
        rows: rows.len() as u64,
        crc32: crc.finalize(),
    }
}

/// Reads `table` on the node behind `client` in primary-key order and checksums it.
pub(crate) async fn of_table(client: &Client, table: &str) -> anyhow::Result<Checksum> {
    let mut client = client.clone();
    let described = client
        .describe(table)
        .await
        .with_context(|| format!("describe {table}"))?;
    if described.primary_key.is_empty() {
        bail!("{table} has no primary key to order its rows by");
    }
    let sql = format!(
        "select * from {table} order by {}",
        described.primary_key.join(", ")
    );
    let outcome = client.execute(&sql).await.with_context(|| sql.clone())?;
    let results = outcome
        .into_result()
        .map_err(|e| anyhow::anyhow!("{sql}: error[{}]: {}", e.code, e.message))?;
    let result = results
        .last()
        .with_context(|| format!("{sql}: no result"))?;
    Ok(of_rows(&result.rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_core::Value;

    fn row(k: i64, v: Value) -> Row {
        vec![Value::Int(k), v]
    }

    #[test]
    fn equal_tables_agree_and_any_difference_shows() {
        let master = vec![
            row(1, Value::Text("one".into())),
            row(2, Value::Null),
            row(3, Value::Text("three".into())),
        ];
        assert_eq!(of_rows(&master), of_rows(&master.clone()));

        let mut changed = master.clone();
        changed[1] = row(2, Value::Text("NULL".into()));
        assert_ne!(of_rows(&master), of_rows(&changed));

        let missing = master[..2].to_vec();
        assert_ne!(of_rows(&master), of_rows(&missing));

        let mut reordered = master.clone();
        reordered.swap(0, 2);
        assert_ne!(of_rows(&master).crc32, of_rows(&reordered).crc32);
    }

    #[test]
    fn values_do_not_run_into_each_other() {
        let a = vec![vec![Value::Text("a".into()), Value::Text("bc".into())]];
        let b = vec![vec![Value::Text("ab".into()), Value::Text("c".into())]];
        assert_ne!(of_rows(&a), of_rows(&b));
    }

    #[test]
    fn an_empty_table_has_a_checksum_too() {
        let empty = of_rows(&[]);
        assert_eq!(empty.rows, 0);
        assert_eq!(empty.to_string(), "0 rows 00000000");
    }
}
