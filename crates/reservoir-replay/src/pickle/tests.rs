//! Unit tests of the pickle reader.

use super::text::{parse_decimal, raw_unicode_escape_decode};
use super::*;

fn load(b: &[u8]) -> Value {
    from_slice(b).unwrap_or_else(|e| panic!("{e}"))
}

fn err(b: &[u8]) -> PickleError {
    match from_slice(b) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e,
    }
}

#[test]
fn protocol0_text_opcodes() {
    // pickle.dumps({'a': [1, 2.5, 'x', u'\u00e9', None, True, 12345678901234567890123]}, protocol=0)
    let data = b"(dp0\nVa\np1\n(lp2\nI1\naF2.5\naVx\np3\naV\\u00e9\np4\naNaI01\naL12345678901234567890123L\nas.";
    let v = load(data);
    let list = v.get("a").unwrap().as_seq().unwrap();
    assert_eq!(list[0], Value::Int(1));
    assert_eq!(list[1], Value::Float(2.5));
    assert_eq!(list[2], Value::from("x"));
    assert_eq!(list[3], Value::from("\u{e9}"));
    assert_eq!(list[4], Value::None);
    assert_eq!(list[5], Value::Bool(true));
    assert_eq!(list[6], Value::from(12345678901234567890123i128));
}

#[test]
fn string_escapes() {
    let v = load(b"S'a\\'b\\n\\x41\\101'\np0\n.");
    assert_eq!(v, Value::from("a'b\nAA"));
    let v = load(b"S'\\xff'\n.");
    assert_eq!(v, Value::Bytes(Arc::from(&[0xffu8][..])));
    assert_eq!(
        raw_unicode_escape_decode(b"a\\\\u0041\\u0041").unwrap(),
        "a\\\\u0041A"
    );
}

#[test]
fn memo_shares_growing_containers() {
    // l = []; d = {'x': l, 'y': l}; l.append(1)  -- protocol 4
    // EMPTY_DICT MEMOIZE MARK 'x' MEMOIZE EMPTY_LIST MEMOIZE BININT1 1 APPEND 'y' MEMOIZE GET 2 SETITEMS STOP
    let data = b"\x80\x04}\x94(\x8c\x01x\x94]\x94K\x01a\x8c\x01y\x94h\x02u.";
    let v = load(data);
    let x = v.get("x").unwrap();
    let y = v.get("y").unwrap();
    assert_eq!(x, &Value::list(vec![Value::Int(1)]));
    match (x, y) {
        (Value::List(a), Value::List(b)) => assert!(Arc::ptr_eq(a, b)),
        _ => unreachable!(),
    }
}

#[test]
fn ordered_dict_and_set_reduce() {
    // pickle.dumps(collections.OrderedDict([('a', 1)]), protocol=2)
    let data = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01X\x01\x00\x00\x00aq\x02K\x01s.";
    assert_eq!(
        load(data),
        Value::dict(vec![(Value::from("a"), Value::Int(1))])
    );
    // pickle.dumps({1, 2}, protocol=2)
    let data = b"\x80\x02c__builtin__\nset\nq\x00]q\x01(K\x01K\x02e\x85q\x02Rq\x03.";
    assert_eq!(
        load(data),
        Value::Set(vec![Value::Int(1), Value::Int(2)].into())
    );
    // pickle.dumps(b'ab', protocol=2)
    let data = b"\x80\x02c_codecs\nencode\nq\x00X\x02\x00\x00\x00abq\x01X\x06\x00\x00\x00latin1q\x02\x86q\x03Rq\x04.";
    assert_eq!(load(data), Value::Bytes(Arc::from(&b"ab"[..])));
}

#[test]
fn refuses_arbitrary_calls() {
    let e = err(b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.");
    assert_eq!(e.kind, PickleErrorKind::Call("os.system".into()));
    assert_eq!(e.opcode, Some(op::REDUCE));
    assert!(e.to_string().contains("REDUCE"), "{e}");
    let e = err(b"\x80\x02cos\nsystem\n)\x81.");
    assert!(matches!(e.kind, PickleErrorKind::Unsupported(_)));
}

#[test]
fn recursive_structure_is_an_error() {
    // EMPTY_LIST MEMOIZE GET0 APPEND
    let e = err(b"\x80\x04]\x94h\x00a.");
    assert_eq!(e.kind, PickleErrorKind::Recursive);
}

#[test]
fn depth_limit() {
    let mut data = b"\x80\x04".to_vec();
    data.extend(std::iter::repeat(b']').take(300));
    data.extend(std::iter::repeat(b'a').take(299));
    data.push(b'.');
    let e = err(&data);
    assert!(
        matches!(
            e.kind,
            PickleErrorKind::Limit {
                what: "nesting depth",
                ..
            }
        ),
        "{e}"
    );
    // Within the limit it loads.
    let mut data = b"\x80\x04".to_vec();
    data.extend(std::iter::repeat(b']').take(200));
    data.extend(std::iter::repeat(b'a').take(199));
    data.push(b'.');
    load(&data);
}

#[test]
fn shared_subtree_depth_is_checked_at_every_use() {
    // Build a 150-deep chain, memoize it, then nest it under 150 more levels.
    let mut data = b"\x80\x04".to_vec();
    data.extend(std::iter::repeat(b']').take(150));
    data.extend(std::iter::repeat(b'a').take(149));
    data.push(0x94); // MEMOIZE chain as 0
    data.push(b'0'); // POP it
    data.extend(std::iter::repeat(b']').take(150));
    data.extend(b"h\x00a");
    data.extend(std::iter::repeat(b'a').take(149));
    data.push(b'.');
    let e = err(&data);
    assert!(
        matches!(
            e.kind,
            PickleErrorKind::Limit {
                what: "nesting depth",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn exponential_sharing_hits_the_tree_budget() {
    // x0 = [None]; x(i+1) = [x(i), x(i)]; 64 levels = 2^64 logical nodes.
    let mut data = b"\x80\x04]N\x94a".to_vec();
    // after MEMOIZE the memo 0 holds None; make the list itself memo 1
    data.push(0x94);
    for i in 1..=64u32 {
        data.push(b']');
        data.push(b'(');
        data.extend(b"j");
        data.extend(i.to_le_bytes());
        data.extend(b"j");
        data.extend(i.to_le_bytes());
        data.push(b'e');
        data.push(0x94);
    }
    data.push(b'.');
    let e = err(&data);
    assert!(
        matches!(
            e.kind,
            PickleErrorKind::Limit {
                what: "value tree size",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn huge_declared_lengths() {
    for data in [
        &b"\x80\x04X\xff\xff\xff\xff."[..],
        b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff.",
        b"\x80\x04\x8e\x00\x00\x00\x00\x00\x00\x00\x80.",
        b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7fN.",
        b"\x80\x04\x8b\xff\xff\xff\x7f.",
        b"\x80\x04T\xff\xff\xff\x7f.",
    ] {
        let e = err(data);
        assert!(matches!(e.kind, PickleErrorKind::Truncated { .. }), "{e}");
        assert_eq!(e.offset, 2);
    }
    let e = err(b"\x80\x04\x8b\xff\xff\xff\xff.");
    assert!(matches!(e.kind, PickleErrorKind::Literal(_)), "{e}");
}

#[test]
fn bad_opcodes_and_stack_misuse() {
    let e = err(b"\x80\x04\xff.");
    assert_eq!(
        (e.offset, e.opcode, e.kind.clone()),
        (2, Some(0xff), PickleErrorKind::UnknownOpcode)
    );
    assert_eq!(err(b"\x80\x06N.").kind, PickleErrorKind::Protocol(6));
    assert_eq!(err(b".").kind, PickleErrorKind::StackUnderflow);
    assert_eq!(err(b"a").kind, PickleErrorKind::StackUnderflow);
    assert_eq!(err(b"Ne.").kind, PickleErrorKind::NoMark);
    assert_eq!(err(b"(.").kind, PickleErrorKind::StackUnderflow);
    assert_eq!(load(b"(N."), Value::None); // as Python
    assert_eq!(err(b"}(Nu.").kind, PickleErrorKind::OddItems);
    assert!(matches!(
        err(b"NNa.").kind,
        PickleErrorKind::Type {
            expected: "list",
            found: "None"
        }
    ));
    assert!(matches!(
        err(b"](K\x01K\x02u.").kind,
        PickleErrorKind::Type {
            expected: "dict",
            found: "list"
        }
    ));
    assert_eq!(err(b"N").kind, PickleErrorKind::UnexpectedEnd);
    assert_eq!(err(b"").kind, PickleErrorKind::UnexpectedEnd);
    assert_eq!(err(b"I12").kind, PickleErrorKind::MissingNewline);
    assert!(matches!(err(b"Ix\n.").kind, PickleErrorKind::Literal(_)));
    assert!(matches!(
        err(b"\x8c\x02\xff\xfe.").kind,
        PickleErrorKind::Utf8
    ));
}

#[test]
fn memo_abuse() {
    assert_eq!(err(b"h\x05.").kind, PickleErrorKind::MemoMissing(5));
    assert_eq!(
        err(b"j\xff\xff\xff\xff.").kind,
        PickleErrorKind::MemoMissing(u64::from(u32::MAX))
    );
    assert_eq!(
        err(b"g99999999999999999999\n.").kind,
        PickleErrorKind::Literal("memo index \"99999999999999999999\"".into())
    );
    assert_eq!(err(b"\x94.").kind, PickleErrorKind::StackUnderflow);
    let limits = Limits {
        max_memo: 3,
        ..Limits::default()
    };
    let e = from_slice_with(b"N\x94\x94\x94\x94.", &limits).unwrap_err();
    assert!(
        matches!(e.kind, PickleErrorKind::Limit { what: "memo", .. }),
        "{e}"
    );
    // Overwriting an existing entry is not growth.
    from_slice_with(b"Nq\x01q\x01q\x01q\x01q\x01.", &limits).unwrap();
}

#[test]
fn stack_limit() {
    let limits = Limits {
        max_stack: 100,
        ..Limits::default()
    };
    let data: Vec<u8> = std::iter::repeat(b'N').take(200).chain([b'.']).collect();
    let e = from_slice_with(&data, &limits).unwrap_err();
    assert!(
        matches!(e.kind, PickleErrorKind::Limit { what: "stack", .. }),
        "{e}"
    );
    let data: Vec<u8> = std::iter::repeat(b'(')
        .take(200)
        .chain([b'N', b'.'])
        .collect();
    assert!(from_slice_with(&data, &limits).is_err());
}

#[test]
fn big_text_ints() {
    assert_eq!(
        parse_decimal(b"-170141183460469231731687303715884105728", 4300).unwrap(),
        Value::from(i128::MIN)
    );
    assert_eq!(
        parse_decimal(b"18446744073709551615", 4300).unwrap(),
        Value::from(u64::MAX)
    );
    assert_eq!(
        parse_decimal(b"-9223372036854775808", 4300).unwrap(),
        Value::Int(i64::MIN)
    );
    let many = vec![b'9'; 5000];
    assert!(matches!(
        parse_decimal(&many, 4300),
        Err(PickleErrorKind::Limit { .. })
    ));
}

#[test]
fn error_message_names_offset_and_opcode() {
    let e = err(b"\x80\x04\x95\x08\x00\x00\x00\x00\x00\x00\x00X\xff\x00\x00\x00ab.");
    assert_eq!(
        e.to_string(),
        "at byte 11 (opcode BINUNICODE, 0x58): needs 255 bytes but only 3 are left"
    );
}
