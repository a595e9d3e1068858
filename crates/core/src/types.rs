//! Column types.
//!
//! The integer family is stored as `i64` and range-checked by its declared width;
//! `DECIMAL(p,s)` is exact ([`rust_decimal`], so at most 28 significant digits);
//! `CHAR(n)` is blank-padded to `n` characters; `VARCHAR2` is a synonym of `VARCHAR`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Largest precision a `DECIMAL`/`NUMBER` column may declare (what `rust_decimal` holds exactly).
pub const MAX_DECIMAL_PRECISION: u8 = 28;

/// The declared type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DataType {
    Boolean,
    TinyInt,
    SmallInt,
    Integer,
    BigInt,
    /// Exact decimal. `precision` `None` is a floating decimal (`NUMBER` with no
    /// precision): any scale up to 28 digits.
    Decimal {
        precision: Option<u8>,
        scale: u8,
    },
    Double,
    Char(u32),
    Varchar(u32),
    Binary(u32),
    Varbinary(u32),
    Date,
    Timestamp,
}

impl DataType {
    /// The inclusive range of an integer type, `None` for other types.
    pub fn int_range(&self) -> Option<(i64, i64)> {
        match self {
            DataType::TinyInt => Some((i8::MIN as i64, i8::MAX as i64)),
            DataType::SmallInt => Some((i16::MIN as i64, i16::MAX as i64)),
            DataType::Integer => Some((i32::MIN as i64, i32::MAX as i64)),
            DataType::BigInt => Some((i64::MIN, i64::MAX)),
            _ => None,
        }
    }

    pub fn is_integer(&self) -> bool {
        self.int_range().is_some()
    }

    pub fn is_numeric(&self) -> bool {
        self.is_integer() || matches!(self, DataType::Decimal { .. } | DataType::Double)
    }

    pub fn is_text(&self) -> bool {
        matches!(self, DataType::Char(_) | DataType::Varchar(_))
    }

    pub fn is_binary(&self) -> bool {
        matches!(self, DataType::Binary(_) | DataType::Varbinary(_))
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataType::Boolean => f.write_str("BOOLEAN"),
            DataType::TinyInt => f.write_str("TINYINT"),
            DataType::SmallInt => f.write_str("SMALLINT"),
            DataType::Integer => f.write_str("INTEGER"),
            DataType::BigInt => f.write_str("BIGINT"),
            DataType::Decimal {
                precision: None, ..
            } => f.write_str("NUMBER"),
            DataType::Decimal {
                precision: Some(p),
                scale,
            } => write!(f, "DECIMAL({p},{scale})"),
            DataType::Double => f.write_str("DOUBLE"),
            DataType::Char(n) => write!(f, "CHAR({n})"),
            DataType::Varchar(n) => write!(f, "VARCHAR({n})"),
            DataType::Binary(n) => write!(f, "BINARY({n})"),
            DataType::Varbinary(n) => write!(f, "VARBINARY({n})"),
            DataType::Date => f.write_str("DATE"),
            DataType::Timestamp => f.write_str("TIMESTAMP"),
        }
    }
}
