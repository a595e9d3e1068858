//! Property-test strategies for the core types, shared by the crates whose codecs carry
//! them (the store's log format, the stream's batches). Behind the `strategies`
//! feature, which only dev-dependencies enable.

use proptest::prelude::*;
use rust_decimal::Decimal;

use crate::Value;

/// Any value of every type, of short texts and byte strings. Doubles are never NaN,
/// which compares unequal to itself and so to its round trip.
pub fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        (any::<i64>(), 0u32..=28).prop_map(|(m, s)| Value::Decimal(Decimal::new(m, s))),
        any::<f64>()
            .prop_filter("NaN compares unequal to itself", |d| !d.is_nan())
            .prop_map(Value::Double),
        ".{0,12}".prop_map(Value::Text),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::Bytes),
        any::<i32>().prop_map(Value::Date),
        any::<i64>().prop_map(Value::Timestamp),
    ]
}

/// A row of one to three values.
pub fn row() -> impl Strategy<Value = Vec<Value>> {
    proptest::collection::vec(value(), 1..4)
}
