//! Assignment coercion: turning a value into what a column of a given type stores.
//!
//! The store calls [`coerce`] on every value it writes and the SQL front end on every
//! literal it compares with a column, so both agree on what `'2026-01-02'` means for a
//! `DATE` column or `1.005` for a `DECIMAL(5,2)`. The rules follow Oracle and TimesTen
//! assignment semantics where the SQL standard leaves room:
//!
//! | target                 | accepts                                                        |
//! |------------------------|----------------------------------------------------------------|
//! | integer types          | integers in range; integral decimals and doubles; numeric text |
//! | `DECIMAL(p,s)`         | integers, decimals, finite doubles, numeric text; extra scale is rounded half away from zero (as Oracle `NUMBER`); more than `p - s` integer digits is out of range |
//! | `DOUBLE`               | any number, numeric text                                       |
//! | `CHAR(n)`, `VARCHAR(n)`| text (numbers, dates and booleans in their printed form); at most `n` characters after dropping excess trailing blanks; `CHAR` is blank-padded to `n` |
//! | `BINARY(n)`, `VARBINARY(n)` | bytes, at most `n`; `BINARY` is zero-padded to `n`        |
//! | `DATE`, `TIMESTAMP`    | dates, timestamps and ISO-8601 text (`2026-01-02`, `2026-01-02 10:00:00[.ffffff]`, `T` separator allowed) |
//! | `BOOLEAN`              | booleans and the text `true`/`false`/`t`/`f`/`1`/`0`           |
//!
//! NULL passes unchanged; whether a column may hold it is the store's business.

use chrono::{NaiveDate, NaiveDateTime, NaiveTime};
use rust_decimal::prelude::{FromPrimitive, ToPrimitive};
use rust_decimal::{Decimal, RoundingStrategy};
use thiserror::Error;

use crate::types::DataType;
use crate::value::Value;

/// Why a value cannot be stored in a column of some type.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoerceError {
    /// The value's type cannot be converted to the column's type at all.
    #[error("value {value} of type {found} cannot be stored as {target}")]
    TypeMismatch {
        value: String,
        found: &'static str,
        target: DataType,
    },
    /// Text or binary longer than the declared length.
    #[error("value too long for {target}: {len} {unit}")]
    TooLong {
        target: DataType,
        len: usize,
        unit: &'static str,
    },
    /// A number outside the type's range (or a non-integral number for an integer type).
    #[error("value {value} out of range for {target}")]
    OutOfRange { value: String, target: DataType },
    /// Text that does not spell a value of the type (`'abc'` for an INTEGER, a bad date).
    #[error("invalid {target} value: '{text}'")]
    InvalidText { text: String, target: DataType },
}

impl CoerceError {
    /// The SQLSTATE of this error.
    pub fn code(&self) -> &'static str {
        match self {
            CoerceError::TypeMismatch { .. } => "42804",
            CoerceError::TooLong { .. } => "22001",
            CoerceError::OutOfRange { .. } => "22003",
            CoerceError::InvalidText { target, .. } => match target {
                DataType::Date | DataType::Timestamp => "22007",
                _ => "22018",
            },
        }
    }
}

/// The name of a value's type, for messages.
pub fn value_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "NULL",
        Value::Bool(_) => "BOOLEAN",
        Value::Int(_) => "INTEGER",
        Value::Decimal(_) => "DECIMAL",
        Value::Double(_) => "DOUBLE",
        Value::Text(_) => "TEXT",
        Value::Bytes(_) => "BINARY",
        Value::Date(_) => "DATE",
        Value::Timestamp(_) => "TIMESTAMP",
    }
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// Converts `value` to what a column of type `ty` stores, or says why it cannot.
pub fn coerce(value: Value, ty: &DataType) -> Result<Value, CoerceError> {
    if value.is_null() {
        return Ok(value);
    }
    let ty = *ty;
    let mismatch = |v: &Value| CoerceError::TypeMismatch {
        value: v.to_sql_literal(),
        found: value_type_name(v),
        target: ty,
    };
    match ty {
        DataType::Boolean => match value {
            Value::Bool(_) => Ok(value),
            Value::Text(ref s) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "t" | "1" => Ok(Value::Bool(true)),
                "false" | "f" | "0" => Ok(Value::Bool(false)),
                _ => Err(CoerceError::InvalidText {
                    text: s.clone(),
                    target: ty,
                }),
            },
            other => Err(mismatch(&other)),
        },
        DataType::TinyInt | DataType::SmallInt | DataType::Integer | DataType::BigInt => {
            let (lo, hi) = ty.int_range().unwrap_or((i64::MIN, i64::MAX));
            let out_of_range = |v: String| CoerceError::OutOfRange {
                value: v,
                target: ty,
            };
            let i = match value {
                Value::Int(i) => i,
                Value::Decimal(d) => {
                    if !d.fract().is_zero() {
                        return Err(out_of_range(d.to_string()));
                    }
                    d.to_i64().ok_or_else(|| out_of_range(d.to_string()))?
                }
                Value::Double(f) => {
                    // The range check is on the float itself: `as` would saturate.
                    if !f.is_finite()
                        || f.fract() != 0.0
                        || f < i64::MIN as f64
                        || f >= 9.223_372_036_854_776e18
                    {
                        return Err(out_of_range(f.to_string()));
                    }
                    f as i64
                }
                Value::Text(ref s) => {
                    let t = s.trim();
                    match t.parse::<i64>() {
                        Ok(i) => i,
                        Err(_) => match t.parse::<Decimal>() {
                            Ok(d) => return coerce(Value::Decimal(d), &ty),
                            Err(_) => {
                                return Err(CoerceError::InvalidText {
                                    text: s.clone(),
                                    target: ty,
                                })
                            }
                        },
                    }
                }
                other => return Err(mismatch(&other)),
            };
            if i < lo || i > hi {
                return Err(out_of_range(i.to_string()));
            }
            Ok(Value::Int(i))
        }
        DataType::Decimal { precision, scale } => {
            let d = match value {
                Value::Int(i) => Decimal::from(i),
                Value::Decimal(d) => d,
                Value::Double(f) => {
                    Decimal::from_f64(f).ok_or_else(|| CoerceError::OutOfRange {
                        value: f.to_string(),
                        target: ty,
                    })?
                }
                Value::Text(ref s) => {
                    let t = s.trim();
                    t.parse::<Decimal>()
                        .or_else(|_| Decimal::from_scientific(t))
                        .map_err(|_| CoerceError::InvalidText {
                            text: s.clone(),
                            target: ty,
                        })?
                }
                other => return Err(mismatch(&other)),
            };
            let Some(p) = precision else {
                return Ok(Value::Decimal(d));
            };
            let d =
                d.round_dp_with_strategy(u32::from(scale), RoundingStrategy::MidpointAwayFromZero);
            // Digits left of the point must fit in p - s.
            let int_digits = {
                let t = d.trunc().abs();
                if t.is_zero() {
                    0
                } else {
                    t.mantissa().to_string().len() as i64 - i64::from(t.scale())
                }
            };
            if int_digits > i64::from(p) - i64::from(scale) {
                return Err(CoerceError::OutOfRange {
                    value: d.to_string(),
                    target: ty,
                });
            }
            Ok(Value::Decimal(d))
        }
        DataType::Double => {
            match value {
                Value::Int(i) => Ok(Value::Double(i as f64)),
                Value::Decimal(d) => {
                    d.to_f64()
                        .map(Value::Double)
                        .ok_or_else(|| CoerceError::OutOfRange {
                            value: d.to_string(),
                            target: ty,
                        })
                }
                Value::Double(_) => Ok(value),
                Value::Text(ref s) => s.trim().parse::<f64>().map(Value::Double).map_err(|_| {
                    CoerceError::InvalidText {
                        text: s.clone(),
                        target: ty,
                    }
                }),
                other => Err(mismatch(&other)),
            }
        }
        DataType::Char(n) | DataType::Varchar(n) => {
            let text = match value {
                Value::Text(s) => s,
                Value::Bytes(_) | Value::Null => return Err(mismatch(&value)),
                other => other.to_string(),
            };
            let n = n as usize;
            let mut len = text.chars().count();
            let mut text = text;
            if len > n {
                // Excess trailing blanks are dropped rather than refused (SQL standard).
                let trimmed = text.trim_end_matches(' ');
                let trimmed_len = trimmed.chars().count();
                if trimmed_len > n {
                    return Err(CoerceError::TooLong {
                        target: ty,
                        len,
                        unit: "characters",
                    });
                }
                text = text.chars().take(n).collect();
                len = n;
            }
            if matches!(ty, DataType::Char(_)) && len < n {
                text.extend(std::iter::repeat_n(' ', n - len));
            }
            Ok(Value::Text(text))
        }
        DataType::Binary(n) | DataType::Varbinary(n) => {
            let Value::Bytes(mut b) = value else {
                return Err(mismatch(&value));
            };
            let n = n as usize;
            if b.len() > n {
                return Err(CoerceError::TooLong {
                    target: ty,
                    len: b.len(),
                    unit: "bytes",
                });
            }
            if matches!(ty, DataType::Binary(_)) {
                b.resize(n, 0);
            }
            Ok(Value::Bytes(b))
        }
        DataType::Date => match value {
            Value::Date(_) => Ok(value),
            Value::Timestamp(us) => {
                let days = us.div_euclid(MICROS_PER_DAY);
                i32::try_from(days)
                    .map(Value::Date)
                    .map_err(|_| CoerceError::OutOfRange {
                        value: us.to_string(),
                        target: ty,
                    })
            }
            Value::Text(ref s) => match parse_datetime(s) {
                Some(dt) => coerce(timestamp_value(dt), &ty),
                None => Err(CoerceError::InvalidText {
                    text: s.clone(),
                    target: ty,
                }),
            },
            other => Err(mismatch(&other)),
        },
        DataType::Timestamp => match value {
            Value::Timestamp(_) => Ok(value),
            Value::Date(d) => Ok(Value::Timestamp(i64::from(d) * MICROS_PER_DAY)),
            Value::Text(ref s) => match parse_datetime(s) {
                Some(dt) => Ok(timestamp_value(dt)),
                None => Err(CoerceError::InvalidText {
                    text: s.clone(),
                    target: ty,
                }),
            },
            other => Err(mismatch(&other)),
        },
    }
}

/// A date-time as a `Timestamp` (chrono's whole date range fits in i64 microseconds).
fn timestamp_value(dt: NaiveDateTime) -> Value {
    Value::Timestamp(dt.and_utc().timestamp_micros())
}

/// Parses ISO-8601 date or date-time text (no time zone).
pub fn parse_datetime(text: &str) -> Option<NaiveDateTime> {
    let t = text.trim();
    if let Ok(d) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Some(d.and_time(NaiveTime::MIN));
    }
    [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ]
    .iter()
    .find_map(|f| NaiveDateTime::parse_from_str(t, f).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Value {
        Value::Decimal(s.parse().unwrap())
    }

    #[test]
    fn integers_are_range_checked_by_width() {
        assert_eq!(
            coerce(Value::Int(127), &DataType::TinyInt),
            Ok(Value::Int(127))
        );
        let e = coerce(Value::Int(128), &DataType::TinyInt).unwrap_err();
        assert_eq!(e.code(), "22003");
        assert_eq!(
            coerce(dec("42.000"), &DataType::Integer),
            Ok(Value::Int(42))
        );
        assert_eq!(
            coerce(dec("4.5"), &DataType::Integer).unwrap_err().code(),
            "22003"
        );
        assert_eq!(
            coerce(Value::Text(" 7 ".into()), &DataType::BigInt),
            Ok(Value::Int(7))
        );
        assert_eq!(
            coerce(Value::Text("x".into()), &DataType::BigInt)
                .unwrap_err()
                .code(),
            "22018"
        );
        assert_eq!(
            coerce(Value::Double(1e19), &DataType::BigInt)
                .unwrap_err()
                .code(),
            "22003"
        );
        assert_eq!(
            coerce(Value::Bool(true), &DataType::Integer)
                .unwrap_err()
                .code(),
            "42804"
        );
    }

    #[test]
    fn decimals_round_extra_scale_and_check_precision() {
        let ty = DataType::Decimal {
            precision: Some(5),
            scale: 2,
        };
        assert_eq!(coerce(dec("1.005"), &ty), Ok(dec("1.01")));
        assert_eq!(coerce(dec("-1.005"), &ty), Ok(dec("-1.01")));
        assert_eq!(coerce(Value::Int(999), &ty), Ok(dec("999")));
        assert_eq!(coerce(Value::Int(1000), &ty).unwrap_err().code(), "22003");
        assert_eq!(coerce(dec("999.996"), &ty).unwrap_err().code(), "22003");
        assert_eq!(coerce(Value::Text("12.5".into()), &ty), Ok(dec("12.5")));
        let number = DataType::Decimal {
            precision: None,
            scale: 0,
        };
        assert_eq!(coerce(dec("1.23456"), &number), Ok(dec("1.23456")));
    }

    #[test]
    fn text_lengths_count_characters_and_char_pads() {
        assert_eq!(
            coerce(Value::Text("ab".into()), &DataType::Char(4)),
            Ok(Value::Text("ab  ".into()))
        );
        assert_eq!(
            coerce(Value::Text("äöü".into()), &DataType::Varchar(3)),
            Ok(Value::Text("äöü".into()))
        );
        let e = coerce(Value::Text("abcd".into()), &DataType::Varchar(3)).unwrap_err();
        assert_eq!(e.code(), "22001");
        assert_eq!(
            coerce(Value::Text("abc   ".into()), &DataType::Varchar(3)),
            Ok(Value::Text("abc".into()))
        );
        assert_eq!(
            coerce(Value::Int(12), &DataType::Varchar(3)),
            Ok(Value::Text("12".into()))
        );
    }

    #[test]
    fn binary_lengths_count_bytes_and_binary_pads() {
        assert_eq!(
            coerce(Value::Bytes(vec![1]), &DataType::Binary(3)),
            Ok(Value::Bytes(vec![1, 0, 0]))
        );
        assert_eq!(
            coerce(Value::Bytes(vec![1; 4]), &DataType::Varbinary(3))
                .unwrap_err()
                .code(),
            "22001"
        );
        assert_eq!(
            coerce(Value::Text("a".into()), &DataType::Varbinary(3))
                .unwrap_err()
                .code(),
            "42804"
        );
    }

    #[test]
    fn dates_and_timestamps_parse_iso_text() {
        let d = coerce(Value::Text("2026-01-02".into()), &DataType::Date).unwrap();
        assert_eq!(d.to_string(), "2026-01-02");
        let t = coerce(
            Value::Text("2026-01-02T10:11:12.5".into()),
            &DataType::Timestamp,
        )
        .unwrap();
        assert_eq!(t.to_string(), "2026-01-02 10:11:12.500000");
        assert_eq!(
            coerce(d.clone(), &DataType::Timestamp).unwrap().to_string(),
            "2026-01-02 00:00:00"
        );
        let back = coerce(Value::Text("2026-01-02 23:59:59".into()), &DataType::Date).unwrap();
        assert_eq!(back, d);
        let e = coerce(Value::Text("2026-02-30".into()), &DataType::Date).unwrap_err();
        assert_eq!(e.code(), "22007");
        assert_eq!(
            coerce(Value::Date(-1), &DataType::Timestamp)
                .unwrap()
                .to_string(),
            "1969-12-31 00:00:00"
        );
    }

    #[test]
    fn null_passes_and_booleans_read_text() {
        assert_eq!(coerce(Value::Null, &DataType::Integer), Ok(Value::Null));
        assert_eq!(
            coerce(Value::Text("TRUE".into()), &DataType::Boolean),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            coerce(Value::Text("no".into()), &DataType::Boolean)
                .unwrap_err()
                .code(),
            "22018"
        );
    }
}
