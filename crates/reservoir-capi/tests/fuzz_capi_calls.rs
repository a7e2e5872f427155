//! The `capi_calls` fuzz target on stable: its body and checks live in
//! `fuzz/common/capi_calls.rs` (included below), so these tests run exactly
//! what the fuzzer runs (see `fuzz/README.md`):
//!
//! * `committed_inputs_pass` replays `fuzz/corpus-seeds/capi_calls/`
//!   (the seeds, written from the sequences below) and
//!   `fuzz/regressions/capi_calls/` (minimized findings);
//! * `seeds_are_current` checks that each seed file is the encoding of its
//!   sequence below and decodes back to it (`RESERVOIR_BLESS=1` rewrites
//!   them), so the seeds stay meaningful when the op set changes;
//! * the `issue29_*` tests are the fuzzer's findings of issue 29 (unknown
//!   stream ids accepted), fixed.
//!
//! ```sh
//! cargo test -p reservoir-capi --test fuzz_capi_calls
//! ```

use std::path::{Path, PathBuf};

#[path = "../../../fuzz/common/capi_calls.rs"]
mod capi_calls;

use capi_calls::*;

/// The inverse of `arbitrary`'s decoding (version 1.5, as pinned in both
/// lock files) for the op types, strings and byte vectors left out.
trait Encode {
    fn enc(&self, out: &mut Vec<u8>);
}

/// The `u32` that `#[derive(Arbitrary)]` maps to variant `idx` of `count`:
/// it picks `(u64::from(x) * count) >> 32`.
fn variant(out: &mut Vec<u8>, idx: u64, count: u64) {
    let x = (idx << 32).div_ceil(count) as u32;
    assert_eq!((u64::from(x) * count) >> 32, idx);
    out.extend_from_slice(&x.to_le_bytes());
}

macro_rules! le_ints {
    ($($t:ty),*) => {$(
        impl Encode for $t {
            fn enc(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
le_ints!(u8, i8, u16, u32, u64, i32);

impl Encode for bool {
    fn enc(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
}

impl Encode for f64 {
    fn enc(&self, out: &mut Vec<u8>) {
        self.to_bits().enc(out);
    }
}

impl Encode for HandleRef {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            HandleRef::Live(i) => (variant(out, 0, 4), i.enc(out)).1,
            HandleRef::Destroyed(i) => (variant(out, 1, 4), i.enc(out)).1,
            HandleRef::Null => variant(out, 2, 4),
            HandleRef::Garbage(x) => (variant(out, 3, 4), x.enc(out)).1,
        }
    }
}

impl Encode for SizeChoice {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            SizeChoice::Zero => variant(out, 0, 8),
            SizeChoice::Small(n) => (variant(out, 1, 8), n.enc(out)).1,
            SizeChoice::Mib(n) => (variant(out, 2, 8), n.enc(out)).1,
            SizeChoice::Medium(n) => (variant(out, 3, 8), n.enc(out)).1,
            SizeChoice::Edge { shift, delta } => {
                variant(out, 4, 8);
                shift.enc(out);
                delta.enc(out);
            }
            SizeChoice::Largest => variant(out, 5, 8),
            SizeChoice::TooLarge => variant(out, 6, 8),
            SizeChoice::Any(n) => (variant(out, 7, 8), n.enc(out)).1,
        }
    }
}

impl Encode for StreamRef {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            StreamRef::Default => variant(out, 0, 5),
            StreamRef::Created(i) => (variant(out, 1, 5), i.enc(out)).1,
            StreamRef::OtherHandles(i) => (variant(out, 2, 5), i.enc(out)).1,
            StreamRef::Any(x) => (variant(out, 3, 5), x.enc(out)).1,
            StreamRef::Max => variant(out, 4, 5),
        }
    }
}

impl Encode for PtrRef {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            PtrRef::Live(i) => (variant(out, 0, 6), i.enc(out)).1,
            PtrRef::Freed(i) => (variant(out, 1, 6), i.enc(out)).1,
            PtrRef::Foreign(i) => (variant(out, 2, 6), i.enc(out)).1,
            PtrRef::Interior(i, off) => {
                variant(out, 3, 6);
                i.enc(out);
                off.enc(out);
            }
            PtrRef::Null => variant(out, 4, 6),
            PtrRef::Any(x) => (variant(out, 5, 6), x.enc(out)).1,
        }
    }
}

impl Encode for ConfigChoice {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            ConfigChoice::Null => variant(out, 0, 4),
            ConfigChoice::Known(i) => (variant(out, 1, 4), i.enc(out)).1,
            ConfigChoice::Text(_) | ConfigChoice::Bytes(_) => {
                unreachable!("seeds use the known settings strings")
            }
        }
    }
}

impl Encode for CapacityChoice {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            CapacityChoice::Default => variant(out, 0, 4),
            CapacityChoice::Tiny(n) => (variant(out, 1, 4), n.enc(out)).1,
            CapacityChoice::Mib(n) => (variant(out, 2, 4), n.enc(out)).1,
            CapacityChoice::Any(n) => (variant(out, 3, 4), n.enc(out)).1,
        }
    }
}

impl Encode for BackendChoice {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            BackendChoice::Sim => variant(out, 0, 4),
            BackendChoice::Host => variant(out, 1, 4),
            BackendChoice::CudaWithCapacity => variant(out, 2, 4),
            BackendChoice::Any(b) => (variant(out, 3, 4), b.enc(out)).1,
        }
    }
}

impl Encode for FractionChoice {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            FractionChoice::Ratio(k) => (variant(out, 0, 2), k.enc(out)).1,
            FractionChoice::Any(x) => (variant(out, 1, 2), x.enc(out)).1,
        }
    }
}

impl Encode for PathChoice {
    fn enc(&self, out: &mut Vec<u8>) {
        let i = match self {
            PathChoice::Temp => 0,
            PathChoice::Null => 1,
            PathChoice::NoFolder => 2,
            PathChoice::NotUtf8 => 3,
        };
        variant(out, i, 4);
    }
}

impl Encode for StatKey {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            StatKey::Known(i) => (variant(out, 0, 3), i.enc(out)).1,
            StatKey::Text(_) => unreachable!("seeds use the known keys"),
            StatKey::Null => variant(out, 2, 3),
        }
    }
}

const OPS: u64 = 15;

impl Encode for Op {
    fn enc(&self, out: &mut Vec<u8>) {
        match self {
            Op::Create {
                backend,
                device,
                capacity,
                config,
            } => {
                variant(out, 0, OPS);
                backend.enc(out);
                device.enc(out);
                capacity.enc(out);
                config.enc(out);
            }
            Op::Destroy(h) => (variant(out, 1, OPS), h.enc(out)).1,
            Op::CreateStream(h) => (variant(out, 2, OPS), h.enc(out)).1,
            Op::Alloc(h, size, stream) => {
                variant(out, 3, OPS);
                h.enc(out);
                size.enc(out);
                stream.enc(out);
            }
            Op::Free(h, p) => {
                variant(out, 4, OPS);
                h.enc(out);
                p.enc(out);
            }
            Op::RecordStream(h, p, s) => {
                variant(out, 5, OPS);
                h.enc(out);
                p.enc(out);
                s.enc(out);
            }
            Op::EmptyCache(h) => (variant(out, 6, OPS), h.enc(out)).1,
            Op::Fraction(h, f) => {
                variant(out, 7, OPS);
                h.enc(out);
                f.enc(out);
            }
            Op::RecordHistory(h, on, max) => {
                variant(out, 8, OPS);
                h.enc(out);
                on.enc(out);
                max.enc(out);
            }
            Op::Snapshot(h, p) => {
                variant(out, 9, OPS);
                h.enc(out);
                p.enc(out);
            }
            Op::StatAt {
                h,
                index,
                capacity,
                null_key,
            } => {
                variant(out, 10, OPS);
                h.enc(out);
                index.enc(out);
                capacity.enc(out);
                null_key.enc(out);
            }
            Op::Stat(h, k) => {
                variant(out, 11, OPS);
                h.enc(out);
                k.enc(out);
            }
            Op::NullOut(h, which) => {
                variant(out, 12, OPS);
                h.enc(out);
                which.enc(out);
            }
            Op::FreeAll(h) => (variant(out, 13, OPS), h.enc(out)).1,
            Op::StatusName(s) => (variant(out, 14, OPS), s.enc(out)).1,
        }
    }
}

/// `ops` as libFuzzer input: `Vec::arbitrary_take_rest` reads a "go on"
/// byte (odd) before each element.
fn encode(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    for op in ops {
        out.push(1);
        op.enc(&mut out);
    }
    out
}

const H0: HandleRef = HandleRef::Live(0);
const H1: HandleRef = HandleRef::Live(1);

fn sim(capacity: CapacityChoice, config: u8) -> Op {
    Op::Create {
        backend: BackendChoice::Sim,
        device: 0,
        capacity,
        config: ConfigChoice::Known(config),
    }
}

/// The seeds: one short call sequence per area of the C ABI. `config` is
/// an index into `CONFIGS` of `fuzz/common/capi_calls.rs`.
fn seeds() -> Vec<(&'static str, Vec<Op>)> {
    use PtrRef as P;
    use SizeChoice as S;
    use StreamRef as St;
    vec![
        (
            "sim_streams_and_frees",
            vec![
                sim(CapacityChoice::Mib(63), 0),
                Op::CreateStream(H0),
                Op::CreateStream(H0),
                Op::Alloc(H0, S::Small(1000), St::Default),
                Op::Alloc(H0, S::Mib(3), St::Created(0)),
                Op::Alloc(H0, S::Medium(12 << 20), St::Created(1)),
                Op::RecordStream(H0, P::Live(0), St::Created(1)),
                Op::Free(H0, P::Live(0)),
                Op::Alloc(H0, S::Small(1000), St::Default),
                Op::Free(H0, P::Freed(0)),
                Op::Free(H0, P::Interior(0, 4096)),
                Op::Free(H0, P::Null),
                Op::Free(H0, P::Any(0xdead_beef)),
                Op::RecordStream(H0, P::Freed(0), St::Default),
                Op::EmptyCache(H0),
                Op::Free(H0, P::Live(1)),
                Op::FreeAll(H0),
            ],
        ),
        (
            "host_memory_blocks",
            vec![
                Op::Create {
                    backend: BackendChoice::Host,
                    device: 0,
                    capacity: CapacityChoice::Mib(31),
                    config: ConfigChoice::Null,
                },
                Op::CreateStream(H0),
                Op::Alloc(H0, S::Small(24), St::Default),
                Op::Alloc(H0, S::Mib(2), St::Created(0)),
                Op::Alloc(
                    H0,
                    S::Edge {
                        shift: 20,
                        delta: 129,
                    },
                    St::Default,
                ),
                Op::RecordStream(H0, P::Live(1), St::Default),
                Op::Free(H0, P::Live(0)),
                Op::Alloc(H0, S::Mib(40), St::Default),
                Op::EmptyCache(H0),
                Op::FreeAll(H0),
            ],
        ),
        (
            "policies_and_fraction",
            vec![
                sim(CapacityChoice::Mib(127), 8),
                sim(CapacityChoice::Mib(127), 1),
                Op::Alloc(H0, S::Mib(30), St::Default),
                Op::Alloc(H0, S::Small(512), St::Default),
                Op::Alloc(H1, S::Mib(21), St::Default),
                Op::Free(H0, P::Live(0)),
                Op::Alloc(H0, S::Mib(90), St::Default),
                Op::Fraction(H0, FractionChoice::Ratio(64)),
                Op::Alloc(H0, S::Mib(60), St::Default),
                Op::Fraction(H0, FractionChoice::Any(f64::NAN)),
                Op::Fraction(H0, FractionChoice::Any(1.5)),
                Op::Fraction(H0, FractionChoice::Ratio(255)),
                Op::Alloc(H0, S::Largest, St::Default),
                Op::Free(H1, P::Foreign(0)),
                Op::FreeAll(H0),
                Op::FreeAll(H1),
            ],
        ),
        (
            "split_and_rounding_settings",
            vec![
                sim(CapacityChoice::Mib(255), 3),
                sim(CapacityChoice::Mib(255), 4),
                Op::Alloc(H0, S::Mib(50), St::Default),
                Op::Alloc(H0, S::Mib(5), St::Default),
                Op::Alloc(
                    H1,
                    S::Edge {
                        shift: 22,
                        delta: 0,
                    },
                    St::Default,
                ),
                Op::Alloc(
                    H1,
                    S::Edge {
                        shift: 9,
                        delta: 255,
                    },
                    St::Default,
                ),
                Op::Free(H0, P::Live(0)),
                Op::Alloc(H0, S::Mib(45), St::Default),
                Op::Free(H1, P::Live(0)),
                Op::EmptyCache(H1),
                Op::FreeAll(H0),
            ],
        ),
        (
            "out_of_memory_on_a_tiny_device",
            vec![
                sim(CapacityChoice::Tiny(4096), 0),
                sim(CapacityChoice::Mib(1), 1),
                Op::Alloc(H0, S::Small(1), St::Default),
                Op::Alloc(H1, S::Mib(1), St::Default),
                Op::Alloc(H1, S::Small(100), St::Default),
                Op::Alloc(H1, S::Small(100), St::Default),
                Op::Alloc(H1, S::Any(u64::MAX >> 2), St::Default),
                Op::FreeAll(H1),
            ],
        ),
        (
            "bad_arguments",
            vec![
                sim(CapacityChoice::Default, 0),
                Op::Alloc(H0, S::Zero, St::Default),
                Op::Alloc(H0, S::TooLarge, St::Default),
                Op::Alloc(H0, S::Largest, St::Default),
                Op::NullOut(H0, 0),
                Op::NullOut(H0, 1),
                Op::NullOut(H0, 2),
                Op::NullOut(H0, 3),
                Op::NullOut(H0, 4),
                Op::Snapshot(H0, PathChoice::Null),
                Op::Snapshot(H0, PathChoice::NoFolder),
                Op::Snapshot(H0, PathChoice::NotUtf8),
                Op::StatAt {
                    h: H0,
                    index: 0,
                    capacity: 4,
                    null_key: false,
                },
                Op::StatAt {
                    h: H0,
                    index: 255,
                    capacity: 64,
                    null_key: false,
                },
                Op::StatAt {
                    h: H0,
                    index: 1,
                    capacity: 0,
                    null_key: true,
                },
                Op::Stat(H0, StatKey::Null),
                Op::Stat(H0, StatKey::Known(11)),
                Op::StatusName(-1),
                Op::StatusName(14),
                Op::StatusName(7),
                Op::Create {
                    backend: BackendChoice::Any(9),
                    device: 0,
                    capacity: CapacityChoice::Default,
                    config: ConfigChoice::Null,
                },
                Op::Create {
                    backend: BackendChoice::CudaWithCapacity,
                    device: 0,
                    capacity: CapacityChoice::Mib(1),
                    config: ConfigChoice::Null,
                },
                Op::Create {
                    backend: BackendChoice::Sim,
                    device: -1,
                    capacity: CapacityChoice::Default,
                    config: ConfigChoice::Null,
                },
            ],
        ),
        (
            "bad_handles",
            vec![
                sim(CapacityChoice::Mib(15), 0),
                Op::Alloc(H0, S::Small(4000), St::Default),
                Op::Destroy(H0),
                Op::Alloc(HandleRef::Destroyed(0), S::Small(1), St::Default),
                Op::Free(HandleRef::Destroyed(0), P::Any(0x1000)),
                Op::EmptyCache(HandleRef::Null),
                Op::CreateStream(HandleRef::Garbage(0x1234)),
                Op::Stat(HandleRef::Garbage(0xffff_0000_5e5e), StatKey::Known(0)),
                Op::Snapshot(HandleRef::Null, PathChoice::Temp),
                Op::Destroy(HandleRef::Destroyed(0)),
                Op::Destroy(HandleRef::Null),
                Op::RecordHistory(HandleRef::Null, true, 10),
            ],
        ),
        (
            "stats_history_snapshot",
            vec![
                sim(CapacityChoice::Mib(31), 14),
                Op::RecordHistory(H0, true, 100),
                Op::CreateStream(H0),
                Op::Alloc(H0, S::Small(3000), St::Created(0)),
                Op::Alloc(H0, S::Mib(1), St::Default),
                Op::Free(H0, P::Live(0)),
                Op::Snapshot(H0, PathChoice::Temp),
                Op::StatAt {
                    h: H0,
                    index: 3,
                    capacity: 200,
                    null_key: false,
                },
                Op::Stat(H0, StatKey::Known(1)),
                Op::Stat(H0, StatKey::Known(4)),
                Op::RecordHistory(H0, false, 0),
                Op::Snapshot(H0, PathChoice::Temp),
                Op::FreeAll(H0),
            ],
        ),
    ]
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && !p.extension().is_some_and(|x| x == "md"))
        .collect();
    v.sort();
    v
}

#[test]
fn seeds_are_current() {
    let dir = fuzz_dir().join("corpus-seeds/capi_calls");
    let bless = std::env::var_os("RESERVOIR_BLESS").is_some();
    for (name, ops) in seeds() {
        let bytes = encode(&ops);
        let decoded = Vec::<Op>::arbitrary_take_rest(arbitrary::Unstructured::new(&bytes))
            .expect("a seed decodes");
        assert_eq!(
            format!("{decoded:?}"),
            format!("{ops:?}"),
            "seed {name} does not decode to its ops"
        );
        let path = dir.join(name);
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let committed = std::fs::read(&path).unwrap_or_default();
            assert!(
                committed == bytes,
                "{} is not the encoding of seed {name}: rerun with RESERVOIR_BLESS=1",
                path.display()
            );
        }
    }
}

#[test]
fn committed_inputs_pass() {
    let mut all = files(&fuzz_dir().join("corpus-seeds/capi_calls"));
    assert!(all.len() >= seeds().len(), "seeds missing");
    all.extend(files(&fuzz_dir().join("regressions/capi_calls")));
    for f in &all {
        let data = std::fs::read(f).unwrap();
        if std::panic::catch_unwind(|| run_bytes(&data)).is_err() {
            panic!("{} fails (see the panic above)", f.display());
        }
    }
    println!("capi_calls: {} committed inputs replayed", all.len());
}

use arbitrary::Arbitrary;

// Findings of the fuzzer that belong to issue 29's other items (fixed in
// crates/reservoir-capi and the backends).

/// Issue 29 item 2: a stream id the handle never made is accepted.
#[test]
fn issue29_alloc_on_an_unknown_stream_is_refused() {
    run(&[
        sim(CapacityChoice::Mib(63), 0),
        Op::Alloc(H0, SizeChoice::Small(16), StreamRef::Any(12345)),
    ]);
}

/// Issue 29 items 1 and 2: `record_stream` on a stream never made answered
/// OK, and the `free` after it then failed and orphaned the block.
#[test]
fn issue29_record_stream_on_an_unknown_stream_is_refused() {
    run(&[
        sim(CapacityChoice::Default, 0),
        Op::Alloc(H0, SizeChoice::Small(1000), StreamRef::Default),
        Op::RecordStream(H0, PtrRef::Live(0), StreamRef::Any(999)),
        Op::Free(H0, PtrRef::Live(0)),
    ]);
}
