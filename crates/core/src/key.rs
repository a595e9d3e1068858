//! Order-preserving key encoding.
//!
//! The store keeps rows under `encode_key(primary key values)`, so a byte-wise range
//! scan returns rows in key order and a point or prefix lookup needs no full scan. The
//! encoding has two properties, property-tested below for every type:
//!
//! * **order**: for keys of the same column types, `encode(a) < encode(b)` exactly when
//!   `a < b` in [`Value`]'s order (NULL first);
//! * **prefix-free components**: each value is self-delimiting, so a composite key
//!   sorts by its first column, then its second, and the encoding of the first `k`
//!   columns is a prefix of the whole key's.
//!
//! ```text
//! value      tag  body
//! NULL       00
//! BOOLEAN    01   00 | 01
//! integers   02   i64 big-endian, sign bit flipped
//! DECIMAL    03   sign (01 neg, 02 zero, 03 pos), then for non-zero: exponent (i16 BE,
//!                 biased) and one byte per digit (d+1), 00 terminator; negatives inverted
//! DOUBLE     04   IEEE bits: positive → sign flipped, negative → all bits inverted
//! text       05   UTF-8 bytes, 00 escaped as 00 FF, terminated by 00 01
//! binary     06   bytes, escaped and terminated as text
//! DATE       07   i32 big-endian, sign bit flipped
//! TIMESTAMP  08   i64 big-endian, sign bit flipped
//! ```

use rust_decimal::Decimal;
use thiserror::Error;

use crate::value::Value;

const TAG_NULL: u8 = 0x00;
const TAG_BOOL: u8 = 0x01;
const TAG_INT: u8 = 0x02;
const TAG_DECIMAL: u8 = 0x03;
const TAG_DOUBLE: u8 = 0x04;
const TAG_TEXT: u8 = 0x05;
const TAG_BYTES: u8 = 0x06;
const TAG_DATE: u8 = 0x07;
const TAG_TIMESTAMP: u8 = 0x08;

const DEC_NEG: u8 = 0x01;
const DEC_ZERO: u8 = 0x02;
const DEC_POS: u8 = 0x03;

/// A key that does not decode: the bytes were not written by [`encode_key`].
#[derive(Debug, Error, PartialEq, Eq)]
#[error("malformed key at byte {offset}: {reason}")]
pub struct KeyError {
    pub offset: usize,
    pub reason: &'static str,
}

/// Encodes a key (one value per key column, in key order).
pub fn encode_key(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 9);
    for v in values {
        encode_value(v, &mut out);
    }
    out
}

/// Appends the encoding of one value to `out`.
pub fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(TAG_NULL),
        Value::Bool(b) => {
            out.push(TAG_BOOL);
            out.push(u8::from(*b));
        }
        Value::Int(i) => {
            out.push(TAG_INT);
            out.extend_from_slice(&((*i as u64) ^ (1 << 63)).to_be_bytes());
        }
        Value::Decimal(d) => {
            out.push(TAG_DECIMAL);
            encode_decimal(d, out);
        }
        Value::Double(d) => {
            out.push(TAG_DOUBLE);
            let bits = d.to_bits();
            let ordered = if bits >> 63 == 1 {
                !bits
            } else {
                bits ^ (1 << 63)
            };
            out.extend_from_slice(&ordered.to_be_bytes());
        }
        Value::Text(s) => {
            out.push(TAG_TEXT);
            encode_escaped(s.as_bytes(), out);
        }
        Value::Bytes(b) => {
            out.push(TAG_BYTES);
            encode_escaped(b, out);
        }
        Value::Date(d) => {
            out.push(TAG_DATE);
            out.extend_from_slice(&((*d as u32) ^ (1 << 31)).to_be_bytes());
        }
        Value::Timestamp(t) => {
            out.push(TAG_TIMESTAMP);
            out.extend_from_slice(&((*t as u64) ^ (1 << 63)).to_be_bytes());
        }
    }
}

fn encode_escaped(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0x00, 0x01]);
}

/// Decimal as sign, exponent and digits: `|d| = 0.d1 d2 .. dn × 10^exp` with `d1 ≠ 0`
/// and no trailing zero digits, so equal values encode alike whatever their scale.
fn encode_decimal(d: &Decimal, out: &mut Vec<u8>) {
    if d.is_zero() {
        out.push(DEC_ZERO);
        return;
    }
    let digits = d.mantissa().unsigned_abs().to_string();
    let exp = digits.len() as i32 - d.scale() as i32;
    let significant = digits.trim_end_matches('0');
    let start = out.len() + 1;
    out.push(if d.is_sign_negative() {
        DEC_NEG
    } else {
        DEC_POS
    });
    // Digits below 29 and scales up to 28 keep the exponent well inside i16.
    out.extend_from_slice(&((exp as i16 as u16) ^ (1 << 15)).to_be_bytes());
    out.extend(significant.bytes().map(|c| c - b'0' + 1));
    out.push(0x00);
    if d.is_sign_negative() {
        // A larger magnitude is a smaller negative number: invert exponent, digits and
        // terminator (the terminator, lowest of all when positive, becomes the highest).
        for b in &mut out[start..] {
            *b = !*b;
        }
    }
}

/// Decodes a key written by [`encode_key`].
pub fn decode_key(mut bytes: &[u8]) -> Result<Vec<Value>, KeyError> {
    let total = bytes.len();
    let mut values = Vec::new();
    while !bytes.is_empty() {
        let offset = total - bytes.len();
        let (v, rest) = decode_value(bytes).map_err(|reason| KeyError { offset, reason })?;
        values.push(v);
        bytes = rest;
    }
    Ok(values)
}

fn take<const N: usize>(b: &[u8]) -> Result<([u8; N], &[u8]), &'static str> {
    if b.len() < N {
        return Err("truncated value");
    }
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    Ok((a, &b[N..]))
}

fn decode_value(b: &[u8]) -> Result<(Value, &[u8]), &'static str> {
    let (&tag, rest) = b.split_first().ok_or("empty value")?;
    Ok(match tag {
        TAG_NULL => (Value::Null, rest),
        TAG_BOOL => match rest.split_first() {
            Some((0, r)) => (Value::Bool(false), r),
            Some((1, r)) => (Value::Bool(true), r),
            _ => return Err("bad boolean"),
        },
        TAG_INT => {
            let (a, r) = take::<8>(rest)?;
            (Value::Int((u64::from_be_bytes(a) ^ (1 << 63)) as i64), r)
        }
        TAG_DECIMAL => {
            let (d, r) = decode_decimal(rest)?;
            (Value::Decimal(d), r)
        }
        TAG_DOUBLE => {
            let (a, r) = take::<8>(rest)?;
            let o = u64::from_be_bytes(a);
            let bits = if o >> 63 == 1 { o ^ (1 << 63) } else { !o };
            (Value::Double(f64::from_bits(bits)), r)
        }
        TAG_TEXT => {
            let (bytes, r) = decode_escaped(rest)?;
            (
                Value::Text(String::from_utf8(bytes).map_err(|_| "text is not UTF-8")?),
                r,
            )
        }
        TAG_BYTES => {
            let (bytes, r) = decode_escaped(rest)?;
            (Value::Bytes(bytes), r)
        }
        TAG_DATE => {
            let (a, r) = take::<4>(rest)?;
            (Value::Date((u32::from_be_bytes(a) ^ (1 << 31)) as i32), r)
        }
        TAG_TIMESTAMP => {
            let (a, r) = take::<8>(rest)?;
            (
                Value::Timestamp((u64::from_be_bytes(a) ^ (1 << 63)) as i64),
                r,
            )
        }
        _ => return Err("unknown type tag"),
    })
}

fn decode_escaped(b: &[u8]) -> Result<(Vec<u8>, &[u8]), &'static str> {
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        match (b.get(i), b.get(i + 1)) {
            (Some(0), Some(0x01)) => return Ok((out, &b[i + 2..])),
            (Some(0), Some(0xFF)) => {
                out.push(0);
                i += 2;
            }
            (Some(0), _) => return Err("bad escape in string"),
            (Some(&c), _) => {
                out.push(c);
                i += 1;
            }
            (None, _) => return Err("unterminated string"),
        }
    }
}

fn decode_decimal(b: &[u8]) -> Result<(Decimal, &[u8]), &'static str> {
    let (&sign, rest) = b.split_first().ok_or("truncated decimal")?;
    let negative = match sign {
        DEC_ZERO => return Ok((Decimal::ZERO, rest)),
        DEC_NEG => true,
        DEC_POS => false,
        _ => return Err("bad decimal sign"),
    };
    let flip = |x: u8| if negative { !x } else { x };
    let (e, mut rest) = take::<2>(rest)?;
    let exp = (u16::from_be_bytes([flip(e[0]), flip(e[1])]) ^ (1 << 15)) as i16 as i32;
    let mut mantissa: i128 = 0;
    let mut n = 0i32;
    loop {
        let (&c, r) = rest.split_first().ok_or("unterminated decimal")?;
        rest = r;
        let c = flip(c);
        if c == 0 {
            break;
        }
        if !(1..=10).contains(&c) || n >= 29 {
            return Err("bad decimal digit");
        }
        mantissa = mantissa * 10 + i128::from(c - 1);
        n += 1;
    }
    let mut scale = n - exp;
    while scale < 0 {
        mantissa = mantissa.checked_mul(10).ok_or("decimal out of range")?;
        scale += 1;
    }
    if negative {
        mantissa = -mantissa;
    }
    let d = Decimal::try_from_i128_with_scale(mantissa, scale as u32)
        .map_err(|_| "decimal out of range")?;
    Ok((d, rest))
}

/// The smallest byte string greater than every string that starts with `prefix`,
/// or `None` when there is none (all bytes 0xFF). The exclusive end of a prefix scan.
pub fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut out = prefix.to_vec();
    while let Some(last) = out.pop() {
        if last < 0xFF {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decimal() -> impl Strategy<Value = Decimal> {
        (any::<i64>(), 0u32..=18).prop_map(|(m, s)| Decimal::new(m, s))
    }

    /// One strategy per column type, each also producing NULL.
    fn typed(kind: u8) -> BoxedStrategy<Value> {
        let v: BoxedStrategy<Value> = match kind {
            0 => any::<bool>().prop_map(Value::Bool).boxed(),
            1 => any::<i64>().prop_map(Value::Int).boxed(),
            2 => decimal().prop_map(Value::Decimal).boxed(),
            3 => any::<f64>().prop_map(Value::Double).boxed(),
            4 => ".{0,6}".prop_map(Value::Text).boxed(),
            5 => proptest::collection::vec(prop_oneof![Just(0u8), Just(0xFF), any::<u8>()], 0..6)
                .prop_map(Value::Bytes)
                .boxed(),
            6 => any::<i32>().prop_map(Value::Date).boxed(),
            _ => any::<i64>().prop_map(Value::Timestamp).boxed(),
        };
        prop_oneof![1 => Just(Value::Null), 8 => v].boxed()
    }

    fn key_pair() -> impl Strategy<Value = (Vec<Value>, Vec<Value>)> {
        proptest::collection::vec(0u8..8, 1..4).prop_flat_map(|kinds| {
            let a: Vec<_> = kinds.iter().map(|&k| typed(k)).collect();
            let b: Vec<_> = kinds.iter().map(|&k| typed(k)).collect();
            (a, b)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn byte_order_is_value_order((a, b) in key_pair()) {
            prop_assert_eq!(encode_key(&a).cmp(&encode_key(&b)), a.cmp(&b));
        }

        #[test]
        fn keys_round_trip((a, _b) in key_pair()) {
            let decoded = decode_key(&encode_key(&a)).unwrap();
            prop_assert_eq!(decoded, a);
        }

        #[test]
        fn a_key_prefix_encodes_as_a_byte_prefix((a, _b) in key_pair()) {
            let whole = encode_key(&a);
            for k in 0..a.len() {
                prop_assert!(whole.starts_with(&encode_key(&a[..k])));
            }
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = decode_key(&bytes);
        }
    }

    #[test]
    fn decimals_of_different_scale_order_by_value() {
        let enc = |s: &str| encode_key(&[Value::Decimal(s.parse().unwrap())]);
        assert_eq!(enc("1.50"), enc("1.5"));
        assert!(enc("-100") < enc("-99.99"));
        assert!(enc("-1.55") < enc("-1.5"));
        assert!(enc("-0.001") < enc("0"));
        assert!(enc("0") < enc("0.001"));
        assert!(enc("9.99") < enc("10"));
        assert!(enc("100") < enc("100.5"));
    }

    #[test]
    fn prefix_successor_bounds_a_prefix_scan() {
        assert_eq!(prefix_successor(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_successor(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_successor(&[0xFF]), None);
    }
}
