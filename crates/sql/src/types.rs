//! SQL type names to hawser column types.
//!
//! sqlparser knows most type names as variants of its own `DataType`; the Oracle and
//! TimesTen names it does not know (`NUMBER`, `VARCHAR2`, `BINARY_DOUBLE`) arrive as
//! `Custom` with their modifiers. Everything lands on [`hawser_core::DataType`]:
//!
//! | SQL                                         | hawser                          |
//! |---------------------------------------------|---------------------------------|
//! | `TINYINT`, `SMALLINT`, `INT`/`INTEGER`, `BIGINT` | the integer of that width  |
//! | `NUMBER`, `DECIMAL`, `DEC`, `NUMERIC` without precision | floating exact decimal |
//! | `NUMBER(p)`, `DECIMAL(p[,s])`, ...           | `Decimal { p, s }` (p ≤ 28)     |
//! | `DOUBLE [PRECISION]`, `FLOAT`, `REAL`, `BINARY_DOUBLE`, `BINARY_FLOAT` | `Double` |
//! | `CHAR[(n)]`, `VARCHAR(n)`, `VARCHAR2(n)`     | `Char(n)` (n = 1 if omitted), `Varchar(n)` |
//! | `BINARY[(n)]`, `VARBINARY(n)`                | `Binary(n)`, `Varbinary(n)`     |
//! | `DATE`, `TIMESTAMP`, `BOOLEAN`               | the same                        |

use hawser_core::types::MAX_DECIMAL_PRECISION;
use hawser_core::DataType;
use sqlparser::ast::{
    self, BinaryLength, CharacterLength, ExactNumberInfo, ObjectNamePart, TimezoneInfo,
    TypeModifier,
};

use crate::error::{ErrorKind, Result};

/// Longest `CHAR`, `VARCHAR`, `BINARY` or `VARBINARY` a column may declare.
pub const MAX_LENGTH: u64 = 4_194_304;

/// The hawser type of a SQL type name.
pub fn map_type(ty: &ast::DataType) -> Result<DataType> {
    use ast::DataType as T;
    let mapped = match ty {
        T::TinyInt(_) => DataType::TinyInt,
        T::SmallInt(_) | T::Int2(_) => DataType::SmallInt,
        T::Int(_) | T::Integer(_) | T::Int4(_) => DataType::Integer,
        T::BigInt(_) | T::Int8(_) => DataType::BigInt,
        T::Numeric(info) | T::Decimal(info) | T::Dec(info) => decimal(info)?,
        T::Float(_)
        | T::Real
        | T::Double(_)
        | T::DoublePrecision
        | T::Float4
        | T::Float8
        | T::Float64 => DataType::Double,
        T::Char(len) | T::Character(len) => DataType::Char(char_length(ty, len.as_ref(), true)?),
        T::Varchar(len) | T::CharacterVarying(len) | T::CharVarying(len) => {
            DataType::Varchar(char_length(ty, len.as_ref(), false)?)
        }
        T::Binary(len) => DataType::Binary(length(ty, len.unwrap_or(1))?),
        T::Varbinary(Some(BinaryLength::IntegerLength { length: n })) => {
            DataType::Varbinary(length(ty, *n)?)
        }
        T::Varbinary(_) => return Err(needs_length(ty)),
        T::Date => DataType::Date,
        T::Timestamp(_, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) | T::Datetime(_) => {
            DataType::Timestamp
        }
        T::Bool | T::Boolean => DataType::Boolean,
        T::Custom(name, modifiers) => custom(ty, name, modifiers)?,
        other => {
            return Err(ErrorKind::Unsupported(format!("type {other} is not supported")).into())
        }
    };
    Ok(mapped)
}

/// Oracle and TimesTen names that sqlparser leaves to the dialect.
fn custom(
    ty: &ast::DataType,
    name: &ast::ObjectName,
    modifiers: &[TypeModifier],
) -> Result<DataType> {
    let base = match name.0.as_slice() {
        [ObjectNamePart::Identifier(id)] => id.value.to_ascii_lowercase(),
        _ => String::new(),
    };
    let numbers = modifiers
        .iter()
        .map(|m| match m {
            TypeModifier::Number(n, _) => n.parse::<i64>().ok(),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ErrorKind::InvalidDefinition(format!("bad modifiers in type {ty}")))?;
    match (base.as_str(), numbers.as_slice()) {
        ("number", []) => Ok(DataType::Decimal {
            precision: None,
            scale: 0,
        }),
        ("number", [p]) => decimal_checked(*p, 0),
        ("number", [p, s]) => decimal_checked(*p, *s),
        ("varchar2" | "nvarchar2", [n]) => Ok(DataType::Varchar(length(ty, u64_of(ty, *n)?)?)),
        ("varchar2" | "nvarchar2", _) => Err(needs_length(ty)),
        ("binary_double" | "binary_float", []) => Ok(DataType::Double),
        _ => Err(ErrorKind::Unsupported(format!("type {ty} is not supported")).into()),
    }
}

fn decimal(info: &ExactNumberInfo) -> Result<DataType> {
    match info {
        ExactNumberInfo::None => Ok(DataType::Decimal {
            precision: None,
            scale: 0,
        }),
        ExactNumberInfo::Precision(p) => decimal_checked(*p as i64, 0),
        ExactNumberInfo::PrecisionAndScale(p, s) => decimal_checked(*p as i64, *s),
    }
}

fn decimal_checked(p: i64, s: i64) -> Result<DataType> {
    if p < 1 || p > i64::from(MAX_DECIMAL_PRECISION) {
        return Err(ErrorKind::InvalidDefinition(format!(
            "DECIMAL precision {p} must be between 1 and {MAX_DECIMAL_PRECISION}"
        ))
        .into());
    }
    if s < 0 || s > p {
        return Err(ErrorKind::InvalidDefinition(format!(
            "DECIMAL scale {s} must be between 0 and the precision {p}"
        ))
        .into());
    }
    Ok(DataType::Decimal {
        precision: Some(p as u8),
        scale: s as u8,
    })
}

fn char_length(ty: &ast::DataType, len: Option<&CharacterLength>, fixed: bool) -> Result<u32> {
    match len {
        Some(CharacterLength::IntegerLength { length: n, .. }) => length(ty, *n),
        None if fixed => Ok(1),
        _ => Err(needs_length(ty)),
    }
}

fn u64_of(ty: &ast::DataType, n: i64) -> Result<u64> {
    u64::try_from(n).map_err(|_| {
        ErrorKind::InvalidDefinition(format!("length of {ty} must be positive")).into()
    })
}

fn length(ty: &ast::DataType, n: u64) -> Result<u32> {
    if n == 0 || n > MAX_LENGTH {
        return Err(ErrorKind::InvalidDefinition(format!(
            "length of {ty} must be between 1 and {MAX_LENGTH}"
        ))
        .into());
    }
    Ok(n as u32)
}

fn needs_length(ty: &ast::DataType) -> crate::error::Error {
    ErrorKind::InvalidDefinition(format!("type {ty} needs a length, e.g. {ty}(20)")).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::GenericDialect;
    use sqlparser::parser::Parser;

    fn ty(text: &str) -> Result<DataType> {
        let dialect = GenericDialect {};
        let parsed = Parser::new(&dialect)
            .try_with_sql(text)
            .and_then(|mut p| p.parse_data_type())
            .expect("type parses");
        map_type(&parsed)
    }

    #[test]
    fn every_type_of_the_issue_maps() {
        let cases = [
            ("INTEGER", DataType::Integer),
            ("INT", DataType::Integer),
            ("BIGINT", DataType::BigInt),
            ("SMALLINT", DataType::SmallInt),
            ("TINYINT", DataType::TinyInt),
            (
                "NUMBER(10,2)",
                DataType::Decimal {
                    precision: Some(10),
                    scale: 2,
                },
            ),
            (
                "NUMBER(5)",
                DataType::Decimal {
                    precision: Some(5),
                    scale: 0,
                },
            ),
            (
                "NUMBER",
                DataType::Decimal {
                    precision: None,
                    scale: 0,
                },
            ),
            (
                "DEC(5,1)",
                DataType::Decimal {
                    precision: Some(5),
                    scale: 1,
                },
            ),
            (
                "DECIMAL(28,28)",
                DataType::Decimal {
                    precision: Some(28),
                    scale: 28,
                },
            ),
            ("DOUBLE", DataType::Double),
            ("FLOAT", DataType::Double),
            ("REAL", DataType::Double),
            ("CHAR(3)", DataType::Char(3)),
            ("CHAR", DataType::Char(1)),
            ("VARCHAR(10)", DataType::Varchar(10)),
            ("VARCHAR2(10)", DataType::Varchar(10)),
            ("BINARY(4)", DataType::Binary(4)),
            ("VARBINARY(5)", DataType::Varbinary(5)),
            ("DATE", DataType::Date),
            ("TIMESTAMP", DataType::Timestamp),
            ("BOOLEAN", DataType::Boolean),
        ];
        for (text, want) in cases {
            assert_eq!(ty(text).expect(text), want, "{text}");
        }
    }

    #[test]
    fn bad_types_are_refused_with_reasons() {
        assert_eq!(ty("DECIMAL(29,2)").unwrap_err().kind.code(), "42P16");
        assert_eq!(ty("NUMBER(5,6)").unwrap_err().kind.code(), "42P16");
        assert_eq!(ty("VARCHAR").unwrap_err().kind.code(), "42P16");
        assert_eq!(ty("VARCHAR2").unwrap_err().kind.code(), "42P16");
        assert_eq!(ty("VARCHAR(0)").unwrap_err().kind.code(), "42P16");
        assert_eq!(ty("JSON").unwrap_err().kind.code(), "0A000");
    }
}
