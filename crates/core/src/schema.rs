//! Table definitions.
//!
//! A table has typed columns and a primary key. A table declared without one uses all
//! of its columns as its key, as Sybase does, so every row has an identity that
//! replication, RTL compilation and DB2-style apply can match on.

use serde::{Deserialize, Serialize};

use crate::name::{Ident, QualName};
use crate::types::DataType;
use crate::value::{Row, Value};

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnDef {
    pub name: Ident,
    pub data_type: DataType,
    pub nullable: bool,
    /// Value used when an INSERT leaves the column out; `None` means NULL.
    pub default: Option<Value>,
}

/// A table's definition as the catalog keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDef {
    pub name: QualName,
    pub columns: Vec<ColumnDef>,
    /// Positions of the key columns, in key order.
    pub primary_key: Vec<usize>,
    /// False when the table was declared without a PRIMARY KEY and keys on all columns.
    pub explicit_key: bool,
}

impl TableDef {
    /// Position of the column called `name`.
    pub fn column_index(&self, name: &Ident) -> Option<usize> {
        self.columns.iter().position(|c| &c.name == name)
    }

    /// The key values of `row`, in key order.
    pub fn key_of(&self, row: &[Value]) -> Row {
        self.primary_key.iter().map(|&i| row[i].clone()).collect()
    }

    pub fn is_key_column(&self, index: usize) -> bool {
        self.primary_key.contains(&index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_of_picks_key_columns_in_key_order() {
        let col = |n: &str| ColumnDef {
            name: Ident::unquoted(n),
            data_type: DataType::Integer,
            nullable: false,
            default: None,
        };
        let t = TableDef {
            name: QualName::bare("t"),
            columns: vec![col("a"), col("b"), col("c")],
            primary_key: vec![2, 0],
            explicit_key: true,
        };
        let row = vec![Value::Int(1), Value::Int(2), Value::Int(3)];
        assert_eq!(t.key_of(&row), vec![Value::Int(3), Value::Int(1)]);
        assert_eq!(t.column_index(&Ident::unquoted("B")), Some(1));
    }
}
