//! Hostile input for every reader: the pickle reader, the snapshot decoder,
//! the alloc_data JSON and allocatorSim log readers, and the oracle text
//! trace parser. Each must return a typed error (naming the byte offset, the
//! key path or the line) and never panic, recurse without bound, or take
//! memory or time out of proportion to the input.
//!
//! Also replays every input the fuzzers (`fuzz/`) found and that was saved
//! in `fuzz/regressions/` (and the hand-written seeds of `fuzz/hand_seeds/`)
//! through the same checks the fuzz targets make, so the crashes they found
//! stay fixed on stable Rust.

use std::path::{Path, PathBuf};

use reservoir::observe::pickle::{Value, WriteError};
use reservoir::observe::snapshot::Snapshot;
use reservoir_replay::input::{self, ReadSnapshot};
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::pickle::{self, Limits, PickleErrorKind};
use reservoir_testkit::traces::{shared_traces, trace_files};

// ---------------------------------------------------------------------------
// Helpers

fn is_pickle(p: &Path) -> bool {
    matches!(p.extension(), Some(x) if x == "pickle" || x == "pkl")
}

fn limit_kind(e: &PickleErrorKind) -> Option<&'static str> {
    match e {
        PickleErrorKind::Limit { what, .. } => Some(what),
        _ => None,
    }
}

/// What the `pickle_reader` fuzz target checks: a pickle that reads writes
/// back (unless it holds a value the writer refuses) and reads back equal.
fn pickle_round_trip(data: &[u8]) {
    let Ok(v) = pickle::from_slice(data) else {
        return;
    };
    let bytes = match reservoir::observe::pickle::to_vec(&v) {
        Ok(b) => b,
        Err(WriteError::Unsupported(_)) => return,
        Err(e) => panic!("write failed on a value the reader accepted: {e}"),
    };
    let limits = Limits {
        min_node_budget: (data.len() as u64).saturating_mul(32).max(1 << 16),
        ..Limits::default()
    };
    let back = pickle::from_slice_with(&bytes, &limits)
        .unwrap_or_else(|e| panic!("re-read of written pickle failed: {e}"));
    if back != v {
        assert_eq!(
            reservoir::observe::pickle::to_vec(&back).unwrap(),
            bytes,
            "round trip changed the value"
        );
    }
}

/// What the `snapshot_loader` fuzz target checks.
fn snapshot_round_trip(data: &[u8]) {
    let Ok(loaded) = input::load_bytes(data) else {
        return;
    };
    let _ = loaded.to_trace_input();
    let Some(s) = loaded.snapshot() else {
        return;
    };
    let _ = s.check_consistency();
    let bytes = s.to_pickle().expect("a loaded snapshot encodes");
    let limits = Limits {
        min_node_budget: (data.len() as u64).saturating_mul(32).max(1 << 16),
        ..Limits::default()
    };
    let v = pickle::from_slice_with(&bytes, &limits).expect("encoded snapshot reads");
    let back = Snapshot::from_value(&v).expect("encoded snapshot decodes");
    if &back != s {
        assert_eq!(
            back.to_pickle().unwrap(),
            bytes,
            "round trip changed the snapshot"
        );
    }
}

/// What the `trace_readers` fuzz target checks.
fn text_readers(data: &[u8]) {
    if let Ok(l) = input::load_alloc_data(data) {
        let _ = l.to_trace_input();
    }
    if let Ok(l) = input::load_allocator_sim_log(data) {
        let _ = l.to_trace_input();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(t) = Trace::parse(text) {
            let again = Trace::parse(&t.to_text()).expect("re-parse of to_text");
            assert_eq!(again.ops, t.ops, "text round trip changed the ops");
        }
    }
}

// ---------------------------------------------------------------------------
// Fuzzer regressions

#[test]
fn fuzz_regressions() {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut n = 0;
    for dir in ["regressions", "hand_seeds"] {
        let Ok(rd) = std::fs::read_dir(fuzz.join(dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if !p.is_file() || p.extension().is_some_and(|x| x == "md") {
                continue;
            }
            let data = std::fs::read(&p).unwrap();
            pickle_round_trip(&data);
            snapshot_round_trip(&data);
            text_readers(&data);
            n += 1;
        }
    }
    println!("{n} fuzz regressions and hand-written seeds replayed");
    assert!(n > 0, "no inputs in {}", fuzz.display());
}

// ---------------------------------------------------------------------------
// Truncation

#[test]
fn every_prefix_of_small_real_files_is_an_error() {
    let Some(dir) = shared_traces() else {
        println!("skipping: ../shared/traces not found (set RESERVOIR_TRACES)");
        return;
    };
    let mut checked = 0;
    for f in trace_files(&dir) {
        let data = std::fs::read(&f).unwrap();
        if is_pickle(&f) {
            assert!(pickle::from_slice(&data).is_ok(), "{}", f.display());
            // Every prefix of the small files; a few of the big ones (each
            // costs a full parse).
            let cuts: Vec<usize> = if data.len() <= 12 * 1024 {
                (0..data.len()).collect()
            } else {
                vec![0, 1, 2, data.len() / 3, data.len() / 2, data.len() - 1]
            };
            for n in cuts {
                let prefix = &data[..n];
                let e = pickle::from_slice(prefix).expect_err("a truncated pickle must not load");
                assert!(e.offset <= n, "{}: offset {} > {n}", f.display(), e.offset);
                assert!(input::load_bytes(prefix).is_err());
            }
            checked += 1;
        } else if data.len() <= 64 * 1024 {
            // JSON and text logs: prefixes may be valid logs, but never panic.
            for n in 0..data.len() {
                let _ = input::load_bytes(&data[..n]);
                text_readers(&data[..n]);
            }
            checked += 1;
        }
    }
    println!("{checked} files cut at every offset (pickles ≤ 12 KiB) or a few");
}

// ---------------------------------------------------------------------------
// Declared lengths, memo, nesting, marks

#[test]
fn oversized_and_negative_length_fields() {
    let cases: &[&[u8]] = &[
        b"\x80\x04\x8a\xff",                               // LONG1 255 bytes, none left
        b"\x80\x04\x8b\xff\xff\xff\xff.",                  // LONG4 -1
        b"\x80\x04\x8b\x00\x00\x00\x80.",                  // LONG4 i32::MIN
        b"\x80\x04T\xff\xff\xff\xff.",                     // BINSTRING -1
        b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x80N.", // FRAME 2^63
        b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff",   // BINUNICODE8 u64::MAX
        b"\x80\x04\x96\x00\x00\x00\x00\x00\x00\x01\x00.",  // BYTEARRAY8 2^48
        b"\x80\x04X\x00\x00\x00\x01",                      // BINUNICODE 16 MiB
        b"\x80\x04C\x05ab",                                // SHORT_BINBYTES past end
        b"\x80\x04J\x01\x02",                              // BININT cut
        b"\x80\x04G\x00\x00",                              // BINFLOAT cut
    ];
    for data in cases {
        let e = pickle::from_slice(data).unwrap_err();
        assert!(e.offset <= data.len(), "{e}");
        assert!(
            matches!(
                e.kind,
                PickleErrorKind::Truncated { .. } | PickleErrorKind::Literal(_)
            ),
            "{data:?}: {e}"
        );
        assert!(e.to_string().starts_with("at byte "), "{e}");
    }
    // A big but present LONG4 is a value (and a BigInt, not a panic).
    let mut data = b"\x80\x04\x8b".to_vec();
    data.extend(100_000u32.to_le_bytes());
    data.extend(std::iter::repeat(0x5a).take(100_000));
    data.push(b'.');
    let v = pickle::from_slice(&data).unwrap();
    assert!(matches!(v, Value::BigInt(_)));
    assert!(v.to_string_lossy_len() > 0);
    // Text ints past the digit limit, and huge text memo indices.
    let mut data = b"I".to_vec();
    data.extend(std::iter::repeat(b'9').take(5000));
    data.extend(b"\n.");
    assert_eq!(
        limit_kind(&pickle::from_slice(&data).unwrap_err().kind),
        Some("int digits")
    );
    for data in [
        &b"Np99999999999999999999999999\n."[..],
        b"Ng99999999999999999999999999\n.",
        b"Np-1\n.",
        b"Np\n.",
    ] {
        assert!(pickle::from_slice(data).is_err(), "{data:?}");
    }
}

trait LossyLen {
    fn to_string_lossy_len(&self) -> usize;
}

impl LossyLen for Value {
    fn to_string_lossy_len(&self) -> usize {
        match self {
            Value::BigInt(b) => b.to_string().len(),
            other => format!("{other:?}").len(),
        }
    }
}

#[test]
fn malicious_memo_references() {
    // Far-away sparse PUTs, GETs of never-stored and of negative indices.
    for data in [
        &b"\x80\x04Nr\xff\xff\xff\xffj\xfe\xff\xff\xff."[..],
        b"\x80\x04Nh\x01.",
        b"\x80\x04N\x94h\x01.",
        b"g0\n.",
        b"Np0\ng-0\n.",
    ] {
        let e = pickle::from_slice(data).unwrap_err();
        assert!(e.to_string().starts_with("at byte "), "{e}");
    }
    // A list that contains itself through the memo, via APPEND and via
    // a tuple; a dict that is its own key.
    for data in [
        &b"\x80\x04]\x94h\x00a."[..],
        b"\x80\x04]\x94(h\x00\x85e.",
        b"\x80\x04}\x94h\x00Ns.",
    ] {
        let e = pickle::from_slice(data).unwrap_err();
        assert!(
            matches!(
                e.kind,
                PickleErrorKind::Recursive | PickleErrorKind::Type { .. }
            ),
            "{data:?}: {e}"
        );
    }
    // Doubling through the memo: 2^200 leaves from 1.6 KB of input.
    let mut data = vec![0x80, 4, b'N', 0x94];
    for i in 0..200u32 {
        data.push(b'j');
        data.extend(i.to_le_bytes());
        data.push(b'2');
        data.push(0x86); // TUPLE2 of the previous value twice
        data.push(0x94);
    }
    data.push(b'.');
    let e = pickle::from_slice(&data).unwrap_err();
    assert_eq!(limit_kind(&e.kind), Some("value tree size"), "{e}");
    // Dense memo growth is capped at the memo limit.
    let limits = Limits {
        max_memo: 10_000,
        ..Limits::default()
    };
    let mut data = vec![0x80, 4, b'N'];
    data.extend(std::iter::repeat(0x94).take(20_000));
    data.push(b'.');
    let e = pickle::from_slice_with(&data, &limits).unwrap_err();
    assert_eq!(limit_kind(&e.kind), Some("memo"), "{e}");
}

/// One big container copied again and again by `REDUCE set(...)` /
/// `REDUCE OrderedDict(...)`: each copy costs a few input bytes but
/// duplicates every item, which used to take quadratic memory (a 300 KB
/// input asked for tens of GB). The copies now count against the node
/// budget.
#[test]
fn reduce_recopying_a_big_container_hits_the_item_budget() {
    let n = 100_000;
    for (callable, items_op) in [
        (&b"c__builtin__\nset\n"[..], b'e'),
        (b"ccollections\nOrderedDict\n", b'u'),
    ] {
        let mut data = vec![0x80, 4];
        data.extend(callable);
        data.push(0x94); // memo 0: the callable
        if items_op == b'e' {
            data.extend(b"](N");
            data.extend(std::iter::repeat(b'2').take(n));
            data.push(b'e');
        } else {
            data.extend(b"}(NN");
            data.extend(std::iter::repeat(b'2').take(n));
            data.push(b'u');
        }
        data.push(0x94); // memo 1: the container
        data.push(b'0');
        for _ in 0..100_000 {
            // BINGET 0, BINGET 1, TUPLE1, REDUCE, POP
            data.extend(b"h\x00h\x01\x85R0");
        }
        data.extend(b"N.");
        let start = std::time::Instant::now();
        let e = pickle::from_slice(&data).unwrap_err();
        assert_eq!(limit_kind(&e.kind), Some("container items"), "{e}");
        assert!(start.elapsed().as_secs() < 20);
    }
}

#[test]
fn deep_nesting_every_way() {
    let depth = 1_000_000;
    let rep = |b: &[u8], n: usize| b.repeat(n);
    let mut cases: Vec<Vec<u8>> = vec![
        // ]]]]…aaaa
        [
            b"\x80\x04",
            &rep(b"]", depth)[..],
            &rep(b"a", depth - 1),
            b".",
        ]
        .concat(),
        // ((((…llll and ((((…tttt
        [&rep(b"(", depth)[..], &rep(b"l", depth), b"."].concat(),
        [&rep(b"(", depth)[..], &rep(b"t", depth), b"."].concat(),
        // N then TUPLE1 a million times: nested 1-tuples
        [&b"\x80\x04N"[..], &rep(b"\x85", depth), b"."].concat(),
        // dicts: }N}N…} sss
        [
            b"\x80\x04",
            &rep(b"}N", depth)[..],
            b"}",
            &rep(b"s", depth),
            b".",
        ]
        .concat(),
    ];
    // lists nested through the memo: each new list holds the previous one.
    let mut m = b"\x80\x04]\x94".to_vec();
    for i in 0..200_000u32 {
        m.extend(b"(j");
        m.extend(i.to_le_bytes());
        m.extend(b"l\x94");
    }
    m.push(b'.');
    cases.push(m);
    for data in &cases {
        let e = pickle::from_slice(data).unwrap_err();
        assert_eq!(limit_kind(&e.kind), Some("nesting depth"), "{e}");
        assert!(input::load_bytes(data).is_err());
    }
    // Marks that never close, and a stack that only grows.
    let limits = Limits {
        max_stack: 100_000,
        ..Limits::default()
    };
    for data in [rep(b"(", 200_000), rep(b"N", 200_000), rep(b"(N", 100_000)] {
        let e = pickle::from_slice_with(&data, &limits).unwrap_err();
        assert_eq!(limit_kind(&e.kind), Some("stack"), "{e}");
    }
    let e = pickle::from_slice(&rep(b"(", 5_000_000)).unwrap_err();
    assert_eq!(limit_kind(&e.kind), Some("stack"), "{e}");
    // JSON nested past serde_json's recursion limit.
    let json = [
        &b"{\"actions\":"[..],
        &rep(b"[", 100_000),
        &rep(b"]", 100_000),
        b"}",
    ]
    .concat();
    assert!(input::load_bytes(&json).is_err());
}

/// The reader's depth bound is what keeps every recursive consumer of a
/// [`Value`] (drop, `Debug`, `PartialEq`, `Clone`, serde, the writer, the
/// decoder) safe: a value at the limit works everywhere.
#[test]
fn a_value_at_the_depth_limit_is_usable_everywhere() {
    let max = Limits::default().max_depth;
    let nested = |n: usize| [&b"\x80\x04"[..], &b"]".repeat(n), &b"a".repeat(n - 1), b"."].concat();
    assert!(pickle::from_slice(&nested(max + 1)).is_err());
    let v = pickle::from_slice(&nested(max)).unwrap();
    let w = v.clone();
    assert_eq!(v, w);
    assert!(format!("{v:?}").len() > max);
    assert!(serde_json::to_string(&v).unwrap().len() >= 2 * max);
    let bytes = reservoir::observe::pickle::to_vec(&v).unwrap();
    assert_eq!(pickle::from_slice(&bytes).unwrap(), v);
    assert!(Snapshot::from_value(&v).is_err());
    drop(w);
    drop(v);
}

#[test]
fn non_utf8_strings() {
    // Unicode opcodes: an error naming the offset.
    for data in [
        &b"\x80\x04\x8c\x02\xff\xfe."[..],
        b"\x80\x04X\x01\x00\x00\x00\x80.",
        b"\x80\x04\x8d\x01\x00\x00\x00\x00\x00\x00\x00\xc3.",
        b"c\xff\nx\n.",
        b"V\\u12\n.",          // truncated \u escape
        b"Vabc\\U0011ffff\n.", // beyond Unicode
    ] {
        let e = pickle::from_slice(data).unwrap_err();
        assert!(e.to_string().starts_with("at byte "), "{e}");
    }
    // Protocol-0/1 byte strings that are not UTF-8 are bytes, not errors;
    // as a snapshot key or value they are a schema error naming the key.
    let v = pickle::from_slice(b"U\x02\xff\xfe.").unwrap();
    assert_eq!(v, Value::Bytes(vec![0xff, 0xfe].into()));
    let data = b"\x80\x02}(X\x08\x00\x00\x00segments](}(X\x07\x00\x00\x00addressU\x02\xff\xfeueu.";
    let e = input::load_bytes(data).unwrap_err().to_string();
    assert!(e.contains("segments[0]"), "{e}");
    // Non-UTF-8 logs and traces.
    assert!(input::load_allocator_sim_log(b"0 1 \xff\n").is_err());
    assert!(input::load_alloc_data(b"{\"actions\":[\"\xff\"]}").is_err());
}

/// Found by the `snapshot_loader` fuzzer: an unknown key (kept in `extra`)
/// holding bytes loaded fine, and then the snapshot could not be saved
/// (the writer refuses bytes). Values the writer cannot write are now
/// refused when loading, naming the key, at every level that keeps extras.
#[test]
fn unknown_keys_must_hold_writable_values() {
    let unwritable = [
        Value::Bytes(vec![].into()),
        Value::Set(vec![].into()),
        pickle::from_slice(b"cbuiltins\nlen\n.").unwrap(),
        // LONG4 of 300 bytes
        pickle::from_slice(&[&b"\x8b\x2c\x01\x00\x00"[..], &[0x11; 300], b"."].concat()).unwrap(),
        Value::list(vec![Value::dict(vec![(
            Value::from("deep"),
            Value::Bytes(vec![1].into()),
        )])]),
    ];
    let seg = |extra: Option<(&str, Value)>, block_extra: Option<(&str, Value)>| {
        let mut b = vec![
            (Value::from("size"), Value::from(512i64)),
            (Value::from("state"), Value::from("inactive")),
        ];
        b.extend(block_extra.map(|(k, v)| (Value::from(k), v)));
        let mut s = vec![
            (Value::from("device"), Value::from(0i64)),
            (Value::from("address"), Value::from(0i64)),
            (Value::from("total_size"), Value::from(512i64)),
            (Value::from("allocated_size"), Value::from(0i64)),
            (Value::from("active_size"), Value::from(0i64)),
            (Value::from("stream"), Value::from(0i64)),
            (Value::from("segment_type"), Value::from("small")),
            (Value::from("blocks"), Value::list(vec![Value::dict(b)])),
        ];
        s.extend(extra.map(|(k, v)| (Value::from(k), v)));
        Value::dict(s)
    };
    let snap = |top: Option<(&str, Value)>, segment: Value| {
        let mut d = vec![
            (Value::from("segments"), Value::list(vec![segment])),
            (Value::from("device_traces"), Value::list(vec![])),
        ];
        d.extend(top.map(|(k, v)| (Value::from(k), v)));
        Value::dict(d)
    };
    // The clean snapshot loads and saves.
    let ok = Snapshot::from_value(&snap(None, seg(None, None))).unwrap();
    ok.to_pickle().unwrap();
    for bad in &unwritable {
        let cases = [
            (snap(Some(("x_top", bad.clone())), seg(None, None)), "x_top"),
            (snap(None, seg(Some(("x_seg", bad.clone())), None)), "x_seg"),
            (
                snap(None, seg(None, Some(("x_block", bad.clone())))),
                "x_block",
            ),
            (
                snap(
                    Some((
                        "allocator_settings",
                        Value::dict(vec![(Value::from("x_set"), bad.clone())]),
                    )),
                    seg(None, None),
                ),
                "x_set",
            ),
        ];
        for (v, key) in cases {
            let e = Snapshot::from_value(&v).unwrap_err();
            assert!(e.path.contains(key), "{e}");
            assert!(e.message.contains("writer cannot write"), "{e}");
            // Through the pickle too.
            let bytes = reservoir::observe::pickle::to_vec(&v);
            if let Ok(bytes) = bytes {
                assert!(input::load_bytes(&bytes).is_err());
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Wrong types for every key

/// Every path to a dict key in `v` (following only the first item of each
/// list, which is enough to reach every key kind).
fn key_paths(v: &Value, prefix: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    match v {
        Value::Dict(d) => {
            for (i, (k, x)) in d.iter().enumerate() {
                prefix.push(PathStep::Key(i, k.as_str().unwrap_or("?").to_string()));
                out.push(prefix.clone());
                key_paths(x, prefix, out);
                prefix.pop();
            }
        }
        Value::List(l) | Value::Tuple(l) => {
            if let Some(first) = l.first() {
                prefix.push(PathStep::Index(0));
                out.push(prefix.clone());
                key_paths(first, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum PathStep {
    Key(usize, String),
    Index(usize),
}

fn replace(v: &Value, path: &[PathStep], new: &Value) -> Value {
    let Some((first, rest)) = path.split_first() else {
        return new.clone();
    };
    match (v, first) {
        (Value::Dict(d), PathStep::Key(i, _)) => {
            let mut d = d.to_vec();
            d[*i].1 = replace(&d[*i].1, rest, new);
            Value::dict(d)
        }
        (Value::List(l), PathStep::Index(i)) => {
            let mut l = l.to_vec();
            l[*i] = replace(&l[*i], rest, new);
            Value::list(l)
        }
        (Value::Tuple(l), PathStep::Index(i)) => {
            let mut l = l.to_vec();
            l[*i] = replace(&l[*i], rest, new);
            Value::tuple(l)
        }
        _ => unreachable!(),
    }
}

#[test]
fn wrong_type_for_every_key() {
    let Some(dir) = shared_traces() else {
        println!("skipping: ../shared/traces not found (set RESERVOIR_TRACES)");
        return;
    };
    // Small files covering each layout: segment-list, 2.0 history, no
    // time_us, current with traces, expandable segments.
    let wanted = [
        "stateonly-text-to-sql/27df9f5b_dump_snapshot.pickle",
        "stateonly-docubox/5741975d_dump_snapshot.pickle",
        "select_n-bert-llama/bdf4fe2e_snapshot.pickle",
        "octree-nca/55ff68f5_cuda_single_step.pickle",
        "stateonly-voxelflex/95411eb0_dump_snapshot.pickle",
        "stateonly-triton-unfold/c45a3cd2_memory.pkl",
    ];
    let wrong = [
        Value::None,
        Value::Bool(true),
        Value::Int(-1),
        Value::from(u64::MAX),
        Value::BigInt(match Value::from(i128::MAX) {
            Value::BigInt(b) => b,
            _ => unreachable!(),
        }),
        Value::Float(f64::NAN),
        Value::from("x"),
        Value::Bytes(vec![0xff].into()),
        Value::list(vec![]),
        Value::list(vec![Value::None]),
        Value::tuple(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
        Value::dict(vec![]),
        Value::dict(vec![(Value::Int(1), Value::None)]),
    ];
    let mut tried = 0;
    let mut errors = 0;
    for w in wanted {
        let f = dir.join(w);
        let Ok(data) = std::fs::read(&f) else {
            continue;
        };
        let v = pickle::from_slice(&data).unwrap();
        Snapshot::from_value(&v).unwrap();
        let mut paths = Vec::new();
        key_paths(&v, &mut Vec::new(), &mut paths);
        for p in &paths {
            for new in &wrong {
                let bad = replace(&v, p, new);
                tried += 1;
                match Snapshot::decode(&bad) {
                    Ok(d) => {
                        // Accepted (optional or unknown key): must still
                        // encode and round-trip.
                        let bytes = d.snapshot.to_pickle().unwrap();
                        let back = Snapshot::from_pickle(&bytes).unwrap();
                        if back != d.snapshot {
                            assert_eq!(back.to_pickle().unwrap(), bytes);
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        // The error names a key on the path (or the root).
                        let named = p.iter().any(|s| match s {
                            PathStep::Key(_, k) => e.path.contains(k.as_str()),
                            PathStep::Index(_) => false,
                        });
                        assert!(
                            named || e.path == "<root>",
                            "{w}: {p:?} := {new:?}: error {e} does not name the key"
                        );
                    }
                }
            }
        }
    }
    println!("{tried} wrong-type substitutions, {errors} rejected with the key named");
}

// ---------------------------------------------------------------------------
// alloc_data JSON, allocatorSim log, oracle text trace

/// A suffix chain shared by every element: each element's stack is
/// materialized, so the output would be quadratic in the input. Bounded now.
#[test]
fn alloc_data_long_shared_stacks_are_bounded() {
    let m = 20_000;
    let mut json = String::from("{\"string_table\":[\"a.py:1:f\"],\"suffix_table\":[[0,null]");
    for i in 1..m {
        json.push_str(&format!(",[0,{}]", i - 1));
    }
    json.push_str("],\"elements_size\":[");
    json.push_str(&vec!["8"; m].join(","));
    json.push_str("],\"elements_info\":[");
    json.push_str(&vec![(m - 1).to_string(); m].join(","));
    json.push_str("],\"actions\":[]}");
    let start = std::time::Instant::now();
    let e = input::load_bytes(json.as_bytes()).unwrap_err().to_string();
    assert!(e.starts_with("elements_info["), "{e}");
    assert!(e.contains("frames in all"), "{e}");
    assert!(start.elapsed().as_secs() < 20);
}

#[test]
fn hostile_alloc_data() {
    for json in [
        r#"{"actions":[],"elements_size":[]}"#,
        r#"{"actions":[0,0],"elements_size":[18446744073709551615]}"#,
        r#"{"actions":[0],"elements_size":[-1]}"#,
        r#"{"actions":[0],"elements_size":[1e400]}"#,
        r#"{"actions":[18446744073709551616],"elements_size":[1]}"#,
        r#"{"actions":[0],"elements_size":[1],"elements_info":[0],"suffix_table":[[0,0]],"string_table":["x"]}"#,
        r#"{"actions":[0],"elements_size":[1],"elements_info":[0],"suffix_table":[[0,18446744073709551615]],"string_table":["x"]}"#,
        r#"{"actions":[0],"elements_size":[1],"elements_info":[0],"suffix_table":[[0]],"string_table":["x"]}"#,
        r#"{"actions":[0],"elements_size":[1],"elements_info":[null],"string_table":[1]}"#,
        r#"{"actions":[0,0],"elements_size":[1],"elements_info":[0],"suffix_table":[[0,null]],"string_table":["b7fb2760_0 1 B"]}"#,
        r#"{"actions":[0,1],"elements_size":[1,1],"elements_info":[0,0],"suffix_table":[[0,null]],"string_table":["bff_0 x"]}"#,
        r#"{"actions":[0],"elements_size":[1],"initially_allocated":[7]}"#,
        r#"{"actions":[0],"elements_size":[1],"initially_allocated":"x"}"#,
        r#"{"actions":{},"elements_size":{}}"#,
        r#"{"actions":[0],"elements_size":[1],"actions":[1]}"#,
        "{\"actions\":[0],\"elements_size\":[1],\"string_table\":[\"\\ud800\"]}",
    ] {
        if let Err(e) = input::load_bytes(json.as_bytes()) {
            assert!(!e.to_string().is_empty());
        }
        text_readers(json.as_bytes());
    }
}

#[test]
fn hostile_allocator_sim_logs() {
    let ok =
        input::load_allocator_sim_log(b"0 18446744073709551615 18446744073709551615\n").unwrap();
    let _ = ok.to_trace_input();
    for log in [
        &b"0 1 2\n0 3 4\n"[..],             // event used twice
        b"0 1\n",                           // too few fields
        b"1 1 5\n",                         // free not after alloc
        b"0 18446744073709551616 1\n",      // past u64
        b"0 1 +5\n\x0b",                    // sign, vertical tab
        "0\u{3000}1\u{3000}2\n".as_bytes(), // ideographic spaces
        b"# only a comment",
        b"\n\n\n",
    ] {
        if let Err(e) = input::load_allocator_sim_log(log) {
            let s = e.to_string();
            assert!(!s.is_empty());
        }
    }
    // Errors name the line.
    let e = input::load_allocator_sim_log(b"0 1 2\n\n3 x 4\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains('3'), "{e}");
    // A long log is linear.
    let mut big = String::new();
    for i in 0..200_000u64 {
        big.push_str(&format!("{} {} 512\n", 2 * i, 2 * i + 1));
    }
    let l = input::load_allocator_sim_log(big.as_bytes()).unwrap();
    assert!(l.to_trace_input().devices[0].events.len() > 200_000);
}

#[test]
fn hostile_oracle_traces() {
    let cases = [
        "a 1 1e400M\n",
        "a 18446744073709551616 1\n",
        "a 1 18446744073709551615\n",
        "a 1 17179869184G\n",
        "a 1 NaNM\n",
        "a 1 infK\n",
        "a 1 -0\n",
        "a 1 0x10\n",
        "k\n",
        "y a b\n",
        "w a\n",
        "\u{3000}a\u{3000}1\u{3000}2\n",
        "a 1 2 s#tream\n",
        "\0\n",
        "é 1\n",
        "a\u{0085}1 2\n",
        "#\n#\n",
        "",
    ];
    for text in cases {
        match Trace::parse(text) {
            Ok(t) => {
                let again = Trace::parse(&t.to_text()).unwrap();
                assert_eq!(again.ops, t.ops, "{text:?}");
            }
            Err(e) => assert!(e.to_string().starts_with("line "), "{e}"),
        }
    }
    // Long lines and many lines stay linear.
    let mut k = String::from("k s");
    for i in 0..200_000 {
        k.push_str(&format!(" {i}"));
    }
    k.push('\n');
    assert_eq!(Trace::parse(&k).unwrap().ops.len(), 1);
    let many = "a 1 1\nf 1\n".repeat(200_000);
    assert_eq!(Trace::parse(&many).unwrap().ops.len(), 400_000);
    let e = Trace::parse(&format!("{}q\n", "e\n".repeat(1000))).unwrap_err();
    assert_eq!(e.line, 1001);
}

// ---------------------------------------------------------------------------
// Files that are not inputs (issue 29, 4): read only what is needed to
// refuse them.

/// A fresh, empty folder for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reservoir-hostile-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A sparse file of `len` bytes that starts with `head`.
fn sparse_file(path: &Path, head: &[u8], len: u64) {
    use std::io::Write as _;
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(head).unwrap();
    f.set_len(len).unwrap();
}

/// A 4 GiB sparse file of zeros cost 4 GiB of memory before the loader
/// said "starts with byte 0x00": now its first bytes are judged first.
#[test]
fn a_big_file_of_an_unknown_format_is_refused_from_its_first_bytes() {
    let dir = scratch("sparse");
    let path = dir.join("zeros.pickle");
    sparse_file(&path, &[], 4 << 30);
    let t = std::time::Instant::now();
    let e = input::load(&path).unwrap_err();
    let took = t.elapsed();
    assert!(
        matches!(&e, input::Error::UnknownFormat(m) if m == "starts with byte 0x00"),
        "{e}"
    );
    // Reading 4 GiB takes seconds (and 4 GiB); 4 KiB takes microseconds.
    assert!(took < std::time::Duration::from_secs(1), "{took:?}");
    let e = Snapshot::read(&path).unwrap_err();
    assert!(matches!(e, input::Error::UnknownFormat(_)), "{e}");
    // A protocol 0 pickle is recognized by its last byte too: a file that
    // starts with an opcode but does not end in STOP is refused unread.
    let path = dir.join("mark.pickle");
    sparse_file(&path, b"(", 4 << 30);
    let e = input::load(&path).unwrap_err();
    assert!(
        matches!(&e, input::Error::UnknownFormat(m) if m.starts_with("starts with byte 0x28 (not a pickle: at byte 1")),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reader that counts the bytes read through it.
struct Counting<R> {
    inner: R,
    read: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: std::io::Read> std::io::Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

/// Read `path` through [`input::read_input_from`], counting the bytes read.
fn read_counted(path: &Path) -> (Result<Vec<u8>, input::Error>, u64) {
    let read = std::rc::Rc::new(std::cell::Cell::new(0));
    let r = Counting {
        inner: std::fs::File::open(path).unwrap(),
        read: read.clone(),
    };
    let got = input::read_input_from(path, r, input::DEFAULT_MAX_INPUT_BYTES);
    (got, read.get())
}

/// Issue 44 (F4): the format was judged from the first bytes and the last
/// one, so a pickle header, a 4 GiB hole and a final `.` was read whole
/// (19.3 s, 4.1 GB) before it was refused. The reading now follows the
/// pickle's opcodes a chunk at a time and stops at the first bad byte.
#[test]
fn a_pickle_header_before_a_hole_is_refused_at_the_hole_unread() {
    use std::io::{Seek as _, SeekFrom, Write as _};
    let dir = scratch("hole");
    let path = dir.join("hole.pickle");
    {
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&[0x80, 4]).unwrap();
        f.set_len(4 << 30).unwrap();
        f.seek(SeekFrom::End(0)).unwrap();
        f.write_all(b".").unwrap();
    }
    let (got, read) = read_counted(&path);
    let e = got.unwrap_err();
    match &e {
        input::Error::Pickle(p) => {
            assert_eq!(p.offset, 2);
            assert_eq!(p.kind, PickleErrorKind::UnknownOpcode);
        }
        other => panic!("{other}"),
    }
    assert!(read <= 1 << 20, "read {read} bytes of 4 GiB");
    let e = input::load(&path).unwrap_err();
    assert!(
        e.to_string()
            .contains("at byte 2 (byte 0x00): not a pickle opcode"),
        "{e}"
    );
    // JSON and allocatorSim logs stop at their first control byte.
    for (head, format) in [
        (&b"{\"actions\": "[..], "JSON"),
        (b"0 1 1024\n", "allocatorSim log"),
    ] {
        let path = dir.join("hole.txt");
        sparse_file(&path, head, 4 << 30);
        let (got, read) = read_counted(&path);
        match got.unwrap_err() {
            input::Error::BadByte {
                format: f,
                offset,
                byte: 0,
            } => {
                assert_eq!((f, offset), (format, head.len() as u64));
            }
            other => panic!("{other}"),
        }
        assert!(read <= 1 << 20, "read {read} bytes of 4 GiB");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44 (F4): bytes after a pickle's `STOP` were ignored silently; a
/// snapshot file holds one pickle, and the error names where the rest
/// starts.
#[test]
fn bytes_after_stop_are_an_error_naming_the_offset() {
    let dir = scratch("trailing");
    let good = Snapshot::default().to_pickle().unwrap();
    assert!(input::load_bytes(&good).is_ok());
    let mut bad = good.clone();
    bad.extend_from_slice(b"\ngarbage");
    let stop = good.len() - 1;
    let want = format!(
        "at byte {}: data after the STOP opcode at byte {stop}",
        good.len()
    );
    let e = input::load_bytes(&bad).unwrap_err();
    assert!(e.to_string().contains(&want), "{e}");
    let e = input::load_pickle(&bad).unwrap_err();
    assert!(e.to_string().contains(&want), "{e}");
    let path = dir.join("two.pickle");
    std::fs::write(&path, &bad).unwrap();
    let e = input::load(&path).unwrap_err();
    assert!(e.to_string().contains(&want), "{e}");
    let e = Snapshot::read(&path).unwrap_err();
    assert!(e.to_string().contains(&want), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file over the size limit is refused from its size, unread; the error
/// says the size, the limit and how to raise it.
#[test]
fn a_file_over_the_size_limit_is_refused_unread() {
    let dir = scratch("limit");
    let path = dir.join("huge.pickle");
    sparse_file(&path, &[0x80, 4], 4 << 30);
    let t = std::time::Instant::now();
    let e = input::load_with_limit(&path, 1 << 30).unwrap_err();
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    match &e {
        input::Error::TooLarge { size, limit, .. } => {
            assert_eq!((*size, *limit), (4 << 30, 1 << 30));
        }
        other => panic!("{other}"),
    }
    let msg = e.to_string();
    for needle in [
        "4294967296 bytes (4.00 GiB)",
        "limit of 1073741824 bytes",
        "RESERVOIR_MAX_INPUT_BYTES",
        "huge.pickle",
    ] {
        assert!(msg.contains(needle), "{needle:?} not in {msg}");
    }
    // past the default limit (8 GiB), with the default
    assert_eq!(input::DEFAULT_MAX_INPUT_BYTES, 8 << 30);
    if std::env::var_os(input::MAX_INPUT_BYTES_ENV).is_none() {
        sparse_file(&path, &[0x80, 4], (8 << 30) + 1);
        let e = input::load(&path).unwrap_err();
        assert!(matches!(e, input::Error::TooLarge { .. }), "{e}");
        let e = Snapshot::read(&path).unwrap_err();
        assert!(matches!(e, input::Error::TooLarge { .. }), "{e}");
    }
    // a real snapshot under a limit of its own size loads; one byte less
    // refuses it
    if let Some(real) = shared_traces().into_iter().find(|p| is_pickle(p)) {
        let len = std::fs::metadata(&real).unwrap().len();
        assert!(input::load_with_limit(&real, len).is_ok());
        let e = input::load_with_limit(&real, len - 1).unwrap_err();
        assert!(matches!(e, input::Error::TooLarge { .. }), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/dev/zero` grew past 6 GB and never ended, a FIFO blocked: a path that
/// is no regular file is refused before it is opened.
#[test]
fn devices_fifos_and_folders_are_refused_without_reading() {
    let dir = scratch("special");
    let cases: Vec<(PathBuf, &str)> = vec![
        (PathBuf::from("/dev/zero"), "a character device"),
        (dir.clone(), "a folder"),
    ];
    let link = dir.join("zero.pickle");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let fifo = dir.join("fifo.pickle");
    let made_fifo = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    let mut cases = cases;
    cases.push((link, "a character device"));
    if made_fifo {
        cases.push((fifo, "a FIFO"));
    } else {
        eprintln!("mkfifo unavailable: the FIFO case is not run");
    }
    for (path, kind) in cases {
        // On a thread, so that a blocking open fails the test instead of
        // hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let _ = tx.send((input::load(&p).map(|_| ()), Snapshot::read(&p).map(|_| ())));
        });
        let (a, b) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{}: still reading after 10 s", path.display()));
        for e in [a.unwrap_err(), b.unwrap_err()] {
            assert!(
                matches!(&e, input::Error::NotAFile { kind: k, .. } if *k == kind),
                "{}: {e}",
                path.display()
            );
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
