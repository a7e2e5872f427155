//! The value tree a pickle decodes to.

use std::fmt;
use std::sync::Arc;

use serde::ser::{SerializeMap, SerializeSeq};

/// A Python object made of plain data, as a pickle describes it.
///
/// Containers sit behind [`Arc`]: an object the pickle references several
/// times through its memo is stored once and shared, as in Python. Equality
/// compares contents.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An int that fits in 64 bits.
    Int(i64),
    /// An int that does not fit in 64 bits.
    BigInt(BigInt),
    /// A float.
    Float(f64),
    /// A `str`.
    Str(Arc<str>),
    /// `bytes` or `bytearray` (and protocol-0/1 byte strings that are not
    /// valid UTF-8).
    Bytes(Arc<[u8]>),
    /// A `list`.
    List(Arc<[Value]>),
    /// A `tuple`.
    Tuple(Arc<[Value]>),
    /// A `dict` (or `collections.OrderedDict`): key/value pairs in insertion
    /// order. Duplicate keys are kept as they appear in the stream;
    /// [`Value::get`] returns the last one, as Python's dict would hold.
    Dict(Arc<[(Value, Value)]>),
    /// A `set` or `frozenset`, in stream order.
    Set(Arc<[Value]>),
    /// A reference to a module attribute (`GLOBAL` / `STACK_GLOBAL`), kept as
    /// a name: nothing is imported.
    Global(Arc<GlobalName>),
}

/// The module and attribute a `GLOBAL` opcode names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GlobalName {
    /// Module, e.g. `collections`.
    pub module: String,
    /// Attribute, e.g. `OrderedDict`.
    pub name: String,
}

impl fmt::Display for GlobalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.module, self.name)
    }
}

/// An integer outside the `i64` range, as minimal little-endian two's
/// complement bytes (the encoding of pickle's `LONG1`/`LONG4`).
///
/// Invariant: the value never fits in an `i64` (such values are
/// [`Value::Int`]); build one with [`BigInt::from_signed_le`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BigInt(Arc<[u8]>);

impl BigInt {
    /// The int whose little-endian two's-complement bytes are `bytes` (empty
    /// means 0), as a [`Value::Int`] when it fits in 64 bits, else as a
    /// [`Value::BigInt`].
    pub fn from_signed_le(bytes: &[u8]) -> Value {
        let mut len = bytes.len();
        while len > 1 {
            let last = bytes[len - 1];
            let prev_neg = bytes[len - 2] & 0x80 != 0;
            if (last == 0 && !prev_neg) || (last == 0xff && prev_neg) {
                len -= 1;
            } else {
                break;
            }
        }
        let bytes = &bytes[..len];
        if len <= 8 {
            let neg = len > 0 && bytes[len - 1] & 0x80 != 0;
            let mut buf = [if neg { 0xff } else { 0 }; 8];
            buf[..len].copy_from_slice(bytes);
            Value::Int(i64::from_le_bytes(buf))
        } else {
            Value::BigInt(BigInt(Arc::from(bytes)))
        }
    }

    /// `v` as a [`Value`].
    pub fn from_i128(v: i128) -> Value {
        BigInt::from_signed_le(&v.to_le_bytes())
    }

    /// The minimal little-endian two's-complement bytes.
    pub fn to_signed_le(&self) -> &[u8] {
        &self.0
    }

    /// True when the value is below zero.
    pub fn is_negative(&self) -> bool {
        self.0.last().is_some_and(|b| b & 0x80 != 0)
    }

    /// The value, if it fits in an `i128`.
    pub fn to_i128(&self) -> Option<i128> {
        if self.0.len() > 16 {
            return None;
        }
        let mut buf = [if self.is_negative() { 0xff } else { 0 }; 16];
        buf[..self.0.len()].copy_from_slice(&self.0);
        Some(i128::from_le_bytes(buf))
    }

    /// The value, if it fits in a `u64`.
    pub fn to_u64(&self) -> Option<u64> {
        self.to_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Magnitude as big-endian hex digits, without leading zeros.
    fn magnitude_hex(&self) -> String {
        let mut mag: Vec<u8> = self.0.to_vec();
        if self.is_negative() {
            // two's complement negate, little-endian
            let mut carry = 1u16;
            for b in mag.iter_mut() {
                let v = u16::from(!*b) + carry;
                *b = v as u8;
                carry = v >> 8;
            }
        }
        let mut s = String::with_capacity(mag.len() * 2);
        for b in mag.iter().rev() {
            s.push_str(&format!("{b:02x}"));
        }
        let trimmed = s.trim_start_matches('0');
        if trimmed.is_empty() {
            "0".to_string()
        } else {
            trimmed.to_string()
        }
    }
}

impl fmt::Display for BigInt {
    /// Decimal when the value fits in an `i128`, else hexadecimal (`0x…`):
    /// decimal conversion of huge ints is quadratic, so it is not attempted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_i128() {
            Some(v) => write!(f, "{v}"),
            None => {
                let sign = if self.is_negative() { "-" } else { "" };
                write!(f, "{sign}0x{}", self.magnitude_hex())
            }
        }
    }
}

impl fmt::Debug for BigInt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BigInt({self})")
    }
}

impl Value {
    /// A list.
    pub fn list(items: Vec<Value>) -> Value {
        Value::List(items.into())
    }

    /// A tuple.
    pub fn tuple(items: Vec<Value>) -> Value {
        Value::Tuple(items.into())
    }

    /// A dict with these pairs, in this order.
    pub fn dict(pairs: Vec<(Value, Value)>) -> Value {
        Value::Dict(pairs.into())
    }

    /// Python's name for the value's type (`"int"`, `"str"`, `"dict"`, …),
    /// for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
            Value::Global(_) => "global",
        }
    }

    /// The bool, for [`Value::Bool`].
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The int, if it is one and fits in an `i64` (bools are not ints here).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The int, if it is one and fits in a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) => u64::try_from(*i).ok(),
            Value::BigInt(b) => b.to_u64(),
            _ => None,
        }
    }

    /// The float, for [`Value::Float`].
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The string, for [`Value::Str`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes, for [`Value::Bytes`].
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The items of a list or a tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The pairs of a dict.
    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// The value of the string key `key` of a dict (the last one if the key
    /// is repeated); `None` for a missing key or a non-dict.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_dict()?
            .iter()
            .rev()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::Int(v.into())
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(v.into())
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        match i64::try_from(v) {
            Ok(i) => Value::Int(i),
            Err(_) => BigInt::from_i128(i128::from(v)),
        }
    }
}

impl From<i128> for Value {
    fn from(v: i128) -> Value {
        BigInt::from_i128(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.into())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Str(v.into())
    }
}

impl From<Arc<str>> for Value {
    fn from(v: Arc<str>) -> Value {
        Value::Str(v)
    }
}

impl From<Vec<Value>> for Value {
    /// A list.
    fn from(v: Vec<Value>) -> Value {
        Value::list(v)
    }
}

/// JSON-style serialization: None → null, ints → numbers (ints beyond
/// `i128` → a `"0x…"` string), bytes → list of numbers, tuples and sets →
/// arrays, dicts whose keys are all strings → objects (other dicts → arrays
/// of `[key, value]` pairs), globals → `"module.name"`.
impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::None => s.serialize_none(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::BigInt(b) => match b.to_i128() {
                Some(v) => match u64::try_from(v) {
                    Ok(u) => s.serialize_u64(u),
                    Err(_) => s.serialize_i128(v),
                },
                None => s.serialize_str(&b.to_string()),
            },
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(t) => s.serialize_str(t),
            Value::Bytes(b) => {
                let mut seq = s.serialize_seq(Some(b.len()))?;
                for x in b.iter() {
                    seq.serialize_element(x)?;
                }
                seq.end()
            }
            Value::List(v) | Value::Tuple(v) | Value::Set(v) => {
                let mut seq = s.serialize_seq(Some(v.len()))?;
                for x in v.iter() {
                    seq.serialize_element(x)?;
                }
                seq.end()
            }
            Value::Dict(d) => {
                if d.iter().all(|(k, _)| matches!(k, Value::Str(_))) {
                    let mut map = s.serialize_map(Some(d.len()))?;
                    for (k, v) in d.iter() {
                        map.serialize_entry(k, v)?;
                    }
                    map.end()
                } else {
                    let mut seq = s.serialize_seq(Some(d.len()))?;
                    for (k, v) in d.iter() {
                        seq.serialize_element(&(k, v))?;
                    }
                    seq.end()
                }
            }
            Value::Global(g) => s.serialize_str(&g.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigint_normalizes() {
        assert_eq!(BigInt::from_signed_le(&[]), Value::Int(0));
        assert_eq!(BigInt::from_signed_le(&[0xff]), Value::Int(-1));
        assert_eq!(BigInt::from_signed_le(&[0x80, 0x00]), Value::Int(128));
        assert_eq!(BigInt::from_signed_le(&[0xff, 0xff, 0xff]), Value::Int(-1));
        let big = Value::from(u64::MAX);
        match &big {
            Value::BigInt(b) => {
                assert_eq!(
                    b.to_signed_le(),
                    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]
                );
                assert_eq!(b.to_u64(), Some(u64::MAX));
                assert_eq!(b.to_string(), u64::MAX.to_string());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(big.as_u64(), Some(u64::MAX));
        assert_eq!(
            Value::from(i128::MIN).to_owned(),
            BigInt::from_i128(i128::MIN)
        );
        let huge = BigInt::from_signed_le(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01]);
        match huge {
            Value::BigInt(b) => {
                assert_eq!(b.to_i128(), None);
                assert_eq!(b.to_string(), "0x100000000000000000000000000000000");
            }
            other => panic!("{other:?}"),
        }
        let neg = BigInt::from_signed_le(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff]);
        match neg {
            Value::BigInt(b) => assert_eq!(b.to_string(), "-0x100000000000000000000000000000000"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn get_returns_last_duplicate() {
        let d = Value::dict(vec![
            (Value::from("a"), Value::from(1i64)),
            (Value::from("a"), Value::from(2i64)),
        ]);
        assert_eq!(d.get("a"), Some(&Value::Int(2)));
        assert_eq!(d.get("b"), None);
    }

    #[test]
    fn json() {
        let d = Value::dict(vec![
            (
                Value::from("a"),
                Value::tuple(vec![Value::None, Value::from(1.5)]),
            ),
            (Value::from("b"), Value::from(u64::MAX)),
        ]);
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"a":[null,1.5],"b":18446744073709551615}"#
        );
        let nd = Value::dict(vec![(Value::from(1i64), Value::from("x"))]);
        assert_eq!(serde_json::to_string(&nd).unwrap(), r#"[[1,"x"]]"#);
    }
}
