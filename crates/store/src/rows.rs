//! A table's rows as the store checks and reads them: a full row validated against its
//! table's definition, key values coerced to the key columns' types, a stored row
//! decoded (with the defaults of columns added since), a table definition
//! normalised. Pure functions of a definition and values.

use std::time::Duration;

use hawser_core::coerce::coerce;
use hawser_core::{ColumnDef, Ident, QualName, Row, TableDef, Value};

use crate::codec;
use crate::error::StoreError;

/// Decodes a stored row and fills columns added after it was written with their
/// defaults (ADD COLUMN does not rewrite rows).
pub(crate) fn decode_stored_row(
    def: &TableDef,
    key: &[u8],
    bytes: &[u8],
) -> Result<Row, StoreError> {
    let mut row = codec::decode_row(key, bytes)?;
    if row.len() > def.columns.len() {
        return Err(StoreError::corrupt(
            key,
            format!(
                "row has {} values, table {} has {} columns",
                row.len(),
                def.name,
                def.columns.len()
            ),
        ));
    }
    for c in &def.columns[row.len()..] {
        row.push(c.default.clone().unwrap_or(Value::Null));
    }
    Ok(row)
}

/// Coerces key values to the key columns' types. `prefix` allows fewer values than
/// key columns (range bounds); a point key must be complete.
pub(crate) fn coerce_key(
    def: &TableDef,
    key: &[Value],
    prefix: bool,
) -> Result<Vec<Value>, StoreError> {
    let n = def.primary_key.len();
    if key.len() > n || (!prefix && key.len() != n) {
        return Err(StoreError::WrongArity {
            table: def.name.clone(),
            what: "key values",
            expected: n,
            got: key.len(),
        });
    }
    key.iter()
        .zip(&def.primary_key)
        .map(|(v, &i)| {
            let col = &def.columns[i];
            coerce(v.clone(), &col.data_type).map_err(|source| StoreError::InvalidValue {
                table: def.name.clone(),
                column: col.name.clone(),
                source,
            })
        })
        .collect()
}

/// Validates and coerces a full row for `def`: arity, types, lengths, NOT NULL.
pub(crate) fn validate_row(def: &TableDef, row: Row) -> Result<Row, StoreError> {
    if row.len() != def.columns.len() {
        return Err(StoreError::WrongArity {
            table: def.name.clone(),
            what: "column values",
            expected: def.columns.len(),
            got: row.len(),
        });
    }
    row.into_iter()
        .zip(&def.columns)
        .map(|(v, col)| {
            let v = coerce(v, &col.data_type).map_err(|source| StoreError::InvalidValue {
                table: def.name.clone(),
                column: col.name.clone(),
                source,
            })?;
            if v.is_null() && !col.nullable {
                return Err(StoreError::NotNullViolation {
                    table: def.name.clone(),
                    column: col.name.clone(),
                });
            }
            Ok(v)
        })
        .collect()
}

/// A key for messages: `1, 'a'`.
/// Values as SQL literals, comma-separated: a key or row in messages and reports.
pub fn key_text(key: &[Value]) -> String {
    key.iter()
        .map(Value::to_sql_literal)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error of a row lock on `table`'s encoded key `enc` not granted within
/// `waited`: it names the row (or `?` for a key that does not decode).
pub(crate) fn lock_timed_out(table: &QualName, enc: &[u8], waited: Duration) -> StoreError {
    StoreError::LockTimeout {
        table: table.clone(),
        key: hawser_core::key::decode_key(enc).map_or_else(|_| "?".into(), |k| key_text(&k)),
        waited,
    }
}

pub(crate) fn normalize_column(
    table: &QualName,
    mut col: ColumnDef,
) -> Result<ColumnDef, StoreError> {
    if let Some(d) = col.default.take() {
        let d = coerce(d, &col.data_type).map_err(|source| StoreError::InvalidValue {
            table: table.clone(),
            column: col.name.clone(),
            source,
        })?;
        col.default = if d.is_null() { None } else { Some(d) };
    }
    Ok(col)
}

pub(crate) fn normalize_table_def(mut def: TableDef) -> Result<TableDef, StoreError> {
    let bad = |reason: String| StoreError::InvalidTableDef {
        table: def.name.clone(),
        reason,
    };
    if def.columns.is_empty() {
        return Err(bad("a table needs at least one column".into()));
    }
    let mut seen: Vec<&Ident> = Vec::new();
    for c in &def.columns {
        if seen.contains(&&c.name) {
            return Err(StoreError::DuplicateColumn {
                table: def.name.clone(),
                column: c.name.clone(),
            });
        }
        seen.push(&c.name);
    }
    if def.explicit_key {
        if def.primary_key.is_empty() {
            return Err(bad("PRIMARY KEY names no column".into()));
        }
        let mut sorted = def.primary_key.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != def.primary_key.len() {
            return Err(bad("a column appears twice in the PRIMARY KEY".into()));
        }
        if let Some(&i) = def.primary_key.iter().find(|&&i| i >= def.columns.len()) {
            return Err(bad(format!("PRIMARY KEY column {i} does not exist")));
        }
        for &i in &def.primary_key {
            def.columns[i].nullable = false;
        }
    } else {
        def.primary_key = (0..def.columns.len()).collect();
    }
    let name = def.name.clone();
    def.columns = def
        .columns
        .into_iter()
        .map(|c| normalize_column(&name, c))
        .collect::<Result<_, _>>()?;
    Ok(def)
}
