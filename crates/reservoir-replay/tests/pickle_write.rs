//! The pickle writer of `reservoir::observe::pickle` read back by this crate's
//! reader: every protocol round-trips, and only the opcodes `MemoryViz.js`
//! understands are written.

use std::sync::Arc;

use reservoir::observe::pickle::{
    op, opcode_name, to_vec, to_vec_with, Value, WriteError, WriteOptions,
};
use reservoir_replay::pickle::from_slice;

/// Opcodes of a pickle this writer produced (it only emits opcodes whose
/// arguments it knows how to skip).
fn opcodes(data: &[u8]) -> Vec<u8> {
    let mut ops = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let o = data[i];
        ops.push(o);
        i += 1;
        i += match o {
            op::PROTO | op::BININT1 | op::BINGET | op::BINPUT => 1,
            op::BININT2 => 2,
            op::BININT | op::LONG_BINGET | op::LONG_BINPUT => 4,
            op::FRAME | op::BINFLOAT => 8,
            op::LONG1 | op::SHORT_BINUNICODE => 1 + usize::from(data[i]),
            op::BINUNICODE => 4 + u32::from_le_bytes(data[i..i + 4].try_into().unwrap()) as usize,
            _ => 0,
        };
    }
    ops
}

fn sample() -> Value {
    let shared = Value::list(vec![Value::from("frame"), Value::from(1i64)]);
    Value::dict(vec![
        (
            Value::from("ints"),
            Value::list(
                [
                    0i64,
                    255,
                    256,
                    65535,
                    65536,
                    -1,
                    i64::from(i32::MIN),
                    i64::from(i32::MAX) + 1,
                    i64::MIN,
                    i64::MAX,
                ]
                .map(Value::Int)
                .to_vec(),
            ),
        ),
        (Value::from("big"), Value::from(u64::MAX)),
        (Value::from("neg_big"), Value::from(i128::MIN)),
        (
            Value::from("floats"),
            Value::list(vec![
                Value::Float(0.5),
                Value::Float(-1e300),
                Value::Float(f64::INFINITY),
            ]),
        ),
        (Value::from("str"), Value::from("x".repeat(300))),
        (Value::from("unicode"), Value::from("h\u{e9}llo \u{1f600}")),
        (
            Value::from("tuples"),
            Value::list(vec![
                Value::tuple(vec![]),
                Value::tuple(vec![Value::None]),
                Value::tuple(vec![Value::Bool(true), Value::Bool(false)]),
                Value::tuple(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
                Value::tuple((0..5).map(Value::Int).collect()),
            ]),
        ),
        (Value::from("a"), shared.clone()),
        (Value::from("b"), shared),
        (
            Value::from("many"),
            Value::list((0..2500).map(Value::Int).collect()),
        ),
        (Value::from("one"), Value::list(vec![Value::None])),
    ])
}

#[test]
fn round_trip_all_protocols() {
    let v = sample();
    for protocol in 2..=4 {
        for memoize in [false, true] {
            let opts = WriteOptions {
                protocol,
                memoize,
                ..WriteOptions::default()
            };
            let data = to_vec_with(&v, &opts).unwrap();
            assert_eq!(
                from_slice(&data).unwrap(),
                v,
                "protocol {protocol} memoize {memoize}"
            );
        }
    }
}

#[test]
fn only_memoryviz_opcodes() {
    let allowed = [
        op::PROTO,
        op::FRAME,
        op::MARK,
        op::STOP,
        op::EMPTY_DICT,
        op::EMPTY_LIST,
        op::EMPTY_TUPLE,
        op::TUPLE,
        op::TUPLE1,
        op::TUPLE2,
        op::TUPLE3,
        op::SETITEM,
        op::SETITEMS,
        op::APPEND,
        op::APPENDS,
        op::BININT,
        op::BININT1,
        op::BININT2,
        op::LONG1,
        op::BINFLOAT,
        op::NEWTRUE,
        op::NEWFALSE,
        op::NONE,
        op::SHORT_BINUNICODE,
        op::BINUNICODE,
        op::MEMOIZE,
        op::BINPUT,
        op::LONG_BINPUT,
        op::BINGET,
        op::LONG_BINGET,
    ];
    for protocol in 2..=4 {
        let opts = WriteOptions {
            protocol,
            ..WriteOptions::default()
        };
        let data = to_vec_with(&sample(), &opts).unwrap();
        for o in opcodes(&data) {
            assert!(
                allowed.contains(&o),
                "protocol {protocol}: {:?}",
                opcode_name(o)
            );
        }
        let has_short = opcodes(&data).contains(&op::SHORT_BINUNICODE);
        assert_eq!(has_short, protocol >= 4);
    }
}

#[test]
fn frames_cover_the_stream() {
    let v = Value::list((0..100_000).map(|i| Value::from(format!("s{i}"))).collect());
    let data = to_vec(&v).unwrap();
    // Walk the frames: each FRAME's length must land exactly on the next FRAME or the end.
    let mut i = 2;
    let mut frames = 0;
    while i < data.len() {
        assert_eq!(data[i], op::FRAME, "frame at {i}");
        let n = u64::from_le_bytes(data[i + 1..i + 9].try_into().unwrap()) as usize;
        i += 9 + n;
        frames += 1;
    }
    assert_eq!(i, data.len());
    assert!(frames > 10);
    assert_eq!(from_slice(&data).unwrap(), v);
}

#[test]
fn unwritable_values() {
    assert_eq!(
        to_vec(&Value::Bytes(Arc::from(&b"x"[..]))),
        Err(WriteError::Unsupported("bytes"))
    );
    assert_eq!(
        to_vec(&Value::Set(Arc::from(vec![]))),
        Err(WriteError::Unsupported("a set"))
    );
    assert_eq!(
        to_vec_with(
            &Value::None,
            &WriteOptions {
                protocol: 5,
                ..WriteOptions::default()
            }
        ),
        Err(WriteError::Protocol(5))
    );
    let mut deep = Value::None;
    for _ in 0..300 {
        deep = Value::list(vec![deep]);
    }
    assert_eq!(to_vec(&deep), Err(WriteError::Depth(256)));
}

#[test]
fn memo_indices_beyond_255() {
    let strings: Vec<Value> = (0..1000).map(|i| Value::from(format!("k{i}"))).collect();
    let v = Value::list(strings.iter().chain(strings.iter()).cloned().collect());
    for protocol in [2, 4] {
        let data = to_vec_with(
            &v,
            &WriteOptions {
                protocol,
                ..WriteOptions::default()
            },
        )
        .unwrap();
        let ops = opcodes(&data);
        assert!(ops.contains(&op::LONG_BINGET));
        assert_eq!(from_slice(&data).unwrap(), v);
    }
}
