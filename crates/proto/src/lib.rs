//! hawser's gRPC API (`proto/hawser/v1/hawser.proto`) and the conversions between its
//! messages and `hawser-core`'s domain types.
//!
//! Protobuf types stay here and at service edges: a server decodes a request into domain
//! types with the functions below, calls the domain, and encodes the answer back.

use hawser_core::{Row, Value};
use rust_decimal::Decimal;
use thiserror::Error;

/// Generated code for package `hawser.v1`.
#[allow(clippy::all, rust_2018_idioms, missing_docs)]
pub mod v1 {
    tonic::include_proto!("hawser.v1");
}

use v1::value::Kind;

/// A protobuf value that does not make a domain value.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConvertError {
    #[error("value {index} has no kind set")]
    MissingKind { index: usize },
    #[error("value {index}: {text:?} is not a decimal number")]
    BadDecimal { index: usize, text: String },
}

/// Encodes a domain value.
pub fn value_to_pb(v: &Value) -> v1::Value {
    let kind = match v {
        Value::Null => Kind::Null(v1::Null {}),
        Value::Bool(b) => Kind::Bool(*b),
        Value::Int(i) => Kind::Int(*i),
        Value::Decimal(d) => Kind::Decimal(d.to_string()),
        Value::Double(d) => Kind::Double(*d),
        Value::Text(s) => Kind::Text(s.clone()),
        Value::Bytes(b) => Kind::Bytes(b.clone()),
        Value::Date(d) => Kind::Date(*d),
        Value::Timestamp(t) => Kind::Timestamp(*t),
    };
    v1::Value { kind: Some(kind) }
}

/// An upper bound of the bytes [`value_to_pb`] of `v` takes as an element of a repeated
/// field (its tag, its length and the message), counted without building it.
pub fn value_encoded_bound(v: &Value) -> usize {
    // The element's tag and length (at most 5 bytes), then the oneof's tag.
    const AROUND: usize = 1 + 5 + 1;
    AROUND
        + match v {
            Value::Null => 1,
            Value::Bool(_) => 1,
            Value::Int(_) | Value::Timestamp(_) => 10,
            // At most 29 digits, a sign and a point, after its length.
            Value::Decimal(_) => 1 + 32,
            Value::Double(_) => 8,
            Value::Text(t) => 5 + t.len(),
            Value::Bytes(b) => 5 + b.len(),
            Value::Date(_) => 5,
        }
}

/// Decodes a value; `index` names its position in error messages.
pub fn value_from_pb(v: &v1::Value, index: usize) -> Result<Value, ConvertError> {
    Ok(
        match v.kind.as_ref().ok_or(ConvertError::MissingKind { index })? {
            Kind::Null(_) => Value::Null,
            Kind::Bool(b) => Value::Bool(*b),
            Kind::Int(i) => Value::Int(*i),
            Kind::Decimal(s) => {
                Value::Decimal(s.parse::<Decimal>().map_err(|_| ConvertError::BadDecimal {
                    index,
                    text: s.clone(),
                })?)
            }
            Kind::Double(d) => Value::Double(*d),
            Kind::Text(s) => Value::Text(s.clone()),
            Kind::Bytes(b) => Value::Bytes(b.clone()),
            Kind::Date(d) => Value::Date(*d),
            Kind::Timestamp(t) => Value::Timestamp(*t),
        },
    )
}

pub fn row_to_pb(row: &[Value]) -> v1::Row {
    v1::Row {
        values: row.iter().map(value_to_pb).collect(),
    }
}

pub fn row_from_pb(row: &v1::Row) -> Result<Row, ConvertError> {
    row.values
        .iter()
        .enumerate()
        .map(|(i, v)| value_from_pb(v, i))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_of_a_value_is_never_below_its_encoding() {
        use prost::Message;
        let long = "é".repeat(70_000);
        let values = [
            Value::Null,
            Value::Bool(false),
            Value::Int(i64::MIN),
            Value::Int(0),
            Value::Decimal(rust_decimal::Decimal::MIN),
            Value::Decimal("-0.0000000000000000000000000001".parse().unwrap()),
            Value::Double(f64::MAX),
            Value::Text(String::new()),
            Value::Text(long.clone()),
            Value::Bytes(long.into_bytes()),
            Value::Date(i32::MIN),
            Value::Timestamp(i64::MAX),
        ];
        for v in &values {
            let row = v1::Row {
                values: vec![value_to_pb(v)],
            };
            let exact = row.encoded_len();
            let bound = value_encoded_bound(v);
            assert!(bound >= exact, "{v:?}: {bound} < {exact}");
            assert!(bound <= exact + 40, "{v:?}: {bound} far above {exact}");
        }
    }

    #[test]
    fn values_round_trip() {
        let row = vec![
            Value::Null,
            Value::Bool(true),
            Value::Int(-7),
            Value::Decimal("12.50".parse().unwrap()),
            Value::Double(1.5),
            Value::Text("x".into()),
            Value::Bytes(vec![0, 1]),
            Value::Date(-3),
            Value::Timestamp(99),
        ];
        assert_eq!(row_from_pb(&row_to_pb(&row)).unwrap(), row);
    }

    #[test]
    fn malformed_values_are_refused_with_their_position() {
        let bad = v1::Row {
            values: vec![
                value_to_pb(&Value::Int(1)),
                v1::Value {
                    kind: Some(Kind::Decimal("1.2.3".into())),
                },
                v1::Value { kind: None },
            ],
        };
        assert_eq!(
            row_from_pb(&bad),
            Err(ConvertError::BadDecimal {
                index: 1,
                text: "1.2.3".into()
            })
        );
    }
}
