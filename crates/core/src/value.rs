//! Typed values and rows.
//!
//! A [`Value`] is what one column of one row holds. Values of one column are always of
//! one variant (the store coerces on write), so the total order defined here — NULL
//! first, then by value within a variant, variants by a fixed rank across — is the SQL
//! order for every column and the order of the key encoding in [`crate::key`].

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use chrono::{DateTime, NaiveDate};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// One row: values in column order.
pub type Row = Vec<Value>;

/// Days from 0001-01-01 (CE) to 1970-01-01, for converting `chrono` dates.
const UNIX_EPOCH_DAYS_FROM_CE: i32 = 719_163;

/// A typed SQL value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Value {
    Null,
    Bool(bool),
    /// Every integer type (`TINYINT` .. `BIGINT`).
    Int(i64),
    Decimal(Decimal),
    Double(f64),
    /// `CHAR` and `VARCHAR`.
    Text(String),
    /// `BINARY` and `VARBINARY`.
    Bytes(Vec<u8>),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since 1970-01-01 00:00:00, no time zone.
    Timestamp(i64),
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// About how many bytes the value holds: its text or bytes, 8 for the rest. For
    /// judging how much work a batch is, not for encoding.
    pub fn approx_bytes(&self) -> usize {
        match self {
            Value::Text(t) => t.len(),
            Value::Bytes(b) => b.len(),
            _ => 8,
        }
    }

    /// Rank of the variant in the cross-variant order (NULL first).
    fn rank(&self) -> u8 {
        match self {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Int(_) => 2,
            Value::Decimal(_) => 3,
            Value::Double(_) => 4,
            Value::Text(_) => 5,
            Value::Bytes(_) => 6,
            Value::Date(_) => 7,
            Value::Timestamp(_) => 8,
        }
    }

    /// A date from its calendar form.
    pub fn date(d: NaiveDate) -> Value {
        Value::Date(d.num_days_from_ce_i32() - UNIX_EPOCH_DAYS_FROM_CE)
    }

    /// The calendar form of a `Date` day number, `None` when out of chrono's range.
    pub fn date_to_naive(days: i32) -> Option<NaiveDate> {
        NaiveDate::from_num_days_from_ce_opt(days.checked_add(UNIX_EPOCH_DAYS_FROM_CE)?)
    }

    /// The SQL literal that reads back as this value (`'it''s'`, `DATE '2026-01-02'`).
    pub fn to_sql_literal(&self) -> String {
        match self {
            Value::Null => "NULL".into(),
            Value::Text(s) => format!("'{}'", s.replace('\'', "''")),
            Value::Bytes(b) => format!("X'{}'", hex(b)),
            Value::Date(_) => format!("DATE '{self}'"),
            Value::Timestamp(_) => format!("TIMESTAMP '{self}'"),
            Value::Double(d) if !d.is_finite() => format!("'{d}'"),
            other => other.to_string(),
        }
    }
}

trait NaiveDateExt {
    fn num_days_from_ce_i32(&self) -> i32;
}

impl NaiveDateExt for NaiveDate {
    fn num_days_from_ce_i32(&self) -> i32 {
        use chrono::Datelike;
        self.num_days_from_ce()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

impl Ord for Value {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Value::Null, Value::Null) => Ordering::Equal,
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            (Value::Int(a), Value::Int(b)) => a.cmp(b),
            (Value::Decimal(a), Value::Decimal(b)) => a.cmp(b),
            (Value::Double(a), Value::Double(b)) => a.total_cmp(b),
            (Value::Text(a), Value::Text(b)) => a.cmp(b),
            (Value::Bytes(a), Value::Bytes(b)) => a.cmp(b),
            (Value::Date(a), Value::Date(b)) => a.cmp(b),
            (Value::Timestamp(a), Value::Timestamp(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for Value {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Value {}

impl Hash for Value {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.rank().hash(state);
        match self {
            Value::Null => {}
            Value::Bool(b) => b.hash(state),
            Value::Int(i) => i.hash(state),
            // Normalized so that 1.0 and 1.00 (equal) hash alike.
            Value::Decimal(d) => d.normalize().hash(state),
            Value::Double(d) => d.to_bits().hash(state),
            Value::Text(s) => s.hash(state),
            Value::Bytes(b) => b.hash(state),
            Value::Date(d) => d.hash(state),
            Value::Timestamp(t) => t.hash(state),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Bool(b) => f.write_str(if *b { "TRUE" } else { "FALSE" }),
            Value::Int(i) => write!(f, "{i}"),
            Value::Decimal(d) => write!(f, "{d}"),
            Value::Double(d) => write!(f, "{d}"),
            Value::Text(s) => f.write_str(s),
            Value::Bytes(b) => f.write_str(&hex(b)),
            Value::Date(days) => match Value::date_to_naive(*days) {
                Some(d) => write!(f, "{}", d.format("%Y-%m-%d")),
                None => write!(f, "<date {days}>"),
            },
            Value::Timestamp(us) => match DateTime::from_timestamp_micros(*us) {
                Some(t) if us % 1_000_000 == 0 => write!(f, "{}", t.format("%Y-%m-%d %H:%M:%S")),
                Some(t) => write!(f, "{}", t.format("%Y-%m-%d %H:%M:%S%.6f")),
                None => write!(f, "<timestamp {us}>"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_sorts_first_and_equals_itself() {
        assert!(Value::Null < Value::Int(i64::MIN));
        assert_eq!(Value::Null, Value::Null);
    }

    #[test]
    fn dates_and_timestamps_print_in_iso_form() {
        let d = Value::date(NaiveDate::from_ymd_opt(2026, 11, 30).unwrap());
        assert_eq!(d.to_string(), "2026-11-30");
        assert_eq!(Value::Date(0).to_string(), "1970-01-01");
        assert_eq!(
            Value::Timestamp(1_500_000).to_string(),
            "1970-01-01 00:00:01.500000"
        );
        assert_eq!(d.to_sql_literal(), "DATE '2026-11-30'");
    }

    #[test]
    fn decimal_equality_ignores_trailing_zeros() {
        let a = Value::Decimal("1.0".parse().unwrap());
        let b = Value::Decimal("1.00".parse().unwrap());
        assert_eq!(a, b);
        use std::collections::hash_map::DefaultHasher;
        let h = |v: &Value| {
            let mut s = DefaultHasher::new();
            v.hash(&mut s);
            s.finish()
        };
        assert_eq!(h(&a), h(&b));
    }
}
