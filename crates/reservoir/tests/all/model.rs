//! Model-based property test: random operation sequences against a shadow
//! model, with the invariant checker after every operation.
//!
//! The shadow model knows which byte ranges are live (handed out and not
//! freed) and which are pending (freed after `record_stream` on a stream that
//! was busy). It checks that no allocation overlaps a live or pending range,
//! that the counters match its own counts, and that every out-of-memory error
//! is justified by the device's free memory or the fraction limit.
//!
//! Runs `CASES` sequences of `MIN_OPS` to `MAX_OPS` operations: at least
//! 100,000 operations per run (about 170,000 on average).

use proptest::prelude::*;

use reservoir::caching::PoolFilter;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::MempoolId;
use reservoir::{AllocError, AllocatorConfig, Backend, CachingAllocator, DevicePtr, StreamId};

use crate::common::*;

const CASES: u32 = 400;
const MIN_OPS: usize = 250;
const MAX_OPS: usize = 600;
const CAPACITY: u64 = 768 * MIB;
const STREAMS: u64 = 3;

const CONFIGS: [&str; 9] = [
    "",
    "max_split_size_mb:64",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6",
    "roundup_power2_divisions:[1:2,64:8,>:1],max_split_size_mb:40",
    "expandable_segments:True",
    "expandable_segments:True,max_split_size_mb:64",
    // The Reservoir-only `reservoir` policy (policy/reservoir.rs).
    "policy:reservoir",
    "policy:reservoir,max_split_size_mb:64",
];

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: u64 },
    Free { pick: usize },
    RecordStream { pick: usize, stream: u64 },
    Hold { stream: u64 },
    Release { stream: u64 },
    EmptyCache,
    SetFraction { tenths: u8 },
    SetConfig { which: usize },
    BeginPool { pool: u64, stream: u64 },
    EndPool { pool: u64 },
    ReleasePool { pool: u64 },
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        4 => 4096u64..=MIB,
        3 => (MIB + 1)..10 * MIB,
        2 => 10 * MIB..120 * MIB,
        1 => 120 * MIB..400 * MIB,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (size(), 0..=STREAMS).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        9 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 1..=STREAMS).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        1 => (1..=STREAMS).prop_map(|stream| Op::Hold { stream }),
        2 => (1..=STREAMS).prop_map(|stream| Op::Release { stream }),
        1 => Just(Op::EmptyCache),
        1 => (3u8..=10).prop_map(|tenths| Op::SetFraction { tenths }),
        1 => (0..CONFIGS.len()).prop_map(|which| Op::SetConfig { which }),
        1 => (1..=2u64, 0..=STREAMS).prop_map(|(pool, stream)| Op::BeginPool { pool, stream }),
        1 => (1..=2u64).prop_map(|pool| Op::EndPool { pool }),
        1 => (1..=2u64).prop_map(|pool| Op::ReleasePool { pool }),
    ]
}

struct Live {
    ptr: u64,
    size: u64,
    stream: u64,
    /// Other streams recorded with `record_stream` (the allocation stream is ignored).
    streams: Vec<u64>,
    /// Those recorded while a pool allocation was underway: a free deferred
    /// to the end of all captures does not wait for them.
    capture_streams: Vec<u64>,
}

struct Pending {
    ptr: u64,
    size: u64,
    busy: Vec<u64>,
}

fn overlaps(a: u64, an: u64, b: u64, bn: u64) -> bool {
    a < b + bn && b < a + an
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let dev = SimDevice::new(SimConfig {
        capacity: CAPACITY,
        ..SimConfig::default()
    });
    for _ in 0..STREAMS {
        dev.create_stream().unwrap();
    }
    let a = CachingAllocator::new(dev, AllocatorConfig::default());
    let mut live: Vec<Live> = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    let mut held = [false; STREAMS as usize + 1];
    let mut expandable = false;
    // Pool allocations underway (begin/end calls that succeeded).
    let mut captures = 0usize;
    for (i, op) in ops.iter().enumerate() {
        let syncs_before = a.stats().num_sync_all_streams;
        // Unmapping expandable pages synchronises the segment's stream
        // (torch's unmapHandles), which completes a held stream's work too.
        let forced_before = a.backend().counters().forced_syncs;
        let reserved_before = a.stats().reserved_bytes.all().current as u64;
        let free_before = a.mem_info().unwrap().free;
        match *op {
            Op::Alloc { size, stream } => match a.raw_alloc(size, StreamId(stream)) {
                Ok(p) => {
                    for l in &live {
                        prop_assert!(
                            !overlaps(p.0, size, l.ptr, l.size),
                            "op {i}: overlaps a live block"
                        );
                    }
                    // Pending ranges freed by a sync during this call are no longer pending.
                    if a.stats().num_sync_all_streams == syncs_before
                        && a.backend().counters().forced_syncs == forced_before
                    {
                        for q in &pending {
                            prop_assert!(
                                !overlaps(p.0, size, q.ptr, q.size),
                                "op {i}: reused a block other streams may still use"
                            );
                        }
                    }
                    live.push(Live {
                        ptr: p.0,
                        size,
                        stream,
                        streams: Vec::new(),
                        capture_streams: Vec::new(),
                    });
                }
                Err(AllocError::OutOfMemory(e)) => {
                    // Plain segments need alloc_size (in 2 MiB units); expandable
                    // segments map whole 20 MiB pages and may straddle one more.
                    let granule = if expandable { 20 * MIB } else { 2 * MIB };
                    let slack = if expandable { granule } else { 0 };
                    let needed = e.alloc_size.div_ceil(granule) * granule + slack;
                    // The fraction limit counts reserved bytes when the
                    // request arrived (the retry chain may release some).
                    let limited = e
                        .allowed
                        .is_some_and(|al| reserved_before + e.alloc_size > al);
                    // While a pool is allocated to there is no full flush, so
                    // the free memory before the request also justifies it.
                    prop_assert!(
                        e.device_free.min(free_before) < needed || limited,
                        "op {i}: OOM with {} free for {} bytes: {}",
                        e.device_free,
                        e.alloc_size,
                        e.message
                    );
                }
                Err(e) => return Err(TestCaseError::fail(format!("op {i}: {e}"))),
            },
            Op::Free { pick } => {
                if live.is_empty() {
                    continue;
                }
                let l = live.swap_remove(pick % live.len());
                a.raw_free(DevicePtr(l.ptr))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let deferred = captures > 0;
                let busy: Vec<u64> = l
                    .streams
                    .iter()
                    .copied()
                    .filter(|&s| held[s as usize])
                    .filter(|s| !(deferred && l.capture_streams.contains(s)))
                    .collect();
                if !busy.is_empty() {
                    pending.push(Pending {
                        ptr: l.ptr,
                        size: l.size,
                        busy,
                    });
                }
                // A second free of the same pointer is always rejected.
                prop_assert!(a.raw_free(DevicePtr(l.ptr)).is_err());
            }
            Op::RecordStream { pick, stream } => {
                if live.is_empty() {
                    continue;
                }
                let n = live.len();
                let l = &mut live[pick % n];
                a.record_stream(DevicePtr(l.ptr), StreamId(stream))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if stream != l.stream {
                    l.streams.push(stream);
                    if captures > 0 {
                        l.capture_streams.push(stream);
                    }
                }
            }
            Op::Hold { stream } => {
                a.backend().hold_stream(StreamId(stream)).unwrap();
                held[stream as usize] = true;
            }
            Op::Release { stream } => {
                a.backend().release_stream(StreamId(stream)).unwrap();
                held[stream as usize] = false;
                for q in &mut pending {
                    q.busy.retain(|&s| s != stream);
                }
                pending.retain(|q| !q.busy.is_empty());
            }
            Op::EmptyCache => {
                a.empty_cache()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            Op::SetFraction { tenths } => {
                a.set_memory_fraction(tenths as f64 / 10.0).unwrap();
            }
            Op::SetConfig { which } => {
                a.set_config(AllocatorConfig::parse_with_policy(CONFIGS[which]).unwrap());
                expandable = CONFIGS[which].contains("expandable_segments:True")
                    || CONFIGS[which].contains("policy:reservoir");
            }
            // Pool calls may be refused (already recording, not recording,
            // released): a refusal must change nothing, which the checks
            // below and the invariant checker see.
            Op::BeginPool { pool, stream } => {
                if a.begin_allocate_to_pool(
                    MempoolId(pool, 0),
                    PoolFilter::Stream(StreamId(stream)),
                )
                .is_ok()
                {
                    captures += 1;
                }
            }
            Op::EndPool { pool } => {
                if a.end_allocate_to_pool(MempoolId(pool, 0)).is_ok() {
                    captures -= 1;
                }
            }
            Op::ReleasePool { pool } => {
                let _ = a.release_pool(MempoolId(pool, 0));
            }
        }
        if a.stats().num_sync_all_streams != syncs_before
            || a.backend().counters().forced_syncs != forced_before
        {
            pending.clear();
        }
        if let Err(e) = a.check_invariants() {
            return Err(TestCaseError::fail(format!("after op {i} ({op:?}): {e}")));
        }
        let s = a.stats();
        prop_assert_eq!(s.allocation.all().current as usize, live.len(), "op {}", i);
        let live_bytes: u64 = live.iter().map(|l| l.size).sum();
        prop_assert!(s.allocated_bytes.all().current as u64 >= live_bytes);
        prop_assert!(s.reserved_bytes.all().current as u64 <= CAPACITY);
    }
    // Tear down: everything frees, every pool is released, everything is given back.
    for pool in [1, 2] {
        let _ = a.end_allocate_to_pool(MempoolId(pool, 0));
        let _ = a.end_allocate_to_pool(MempoolId(pool, 0));
        while a.pool_use_count(MempoolId(pool, 0)) > 0 {
            a.release_pool(MempoolId(pool, 0))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }
    for l in live.drain(..) {
        a.raw_free(DevicePtr(l.ptr))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    a.empty_cache()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    a.check_invariants()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(a.stats().reserved_bytes.all().current, 0);
    prop_assert_eq!(a.backend().counters().bytes_in_use, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_every_invariant(ops in prop::collection::vec(op(), MIN_OPS..MAX_OPS)) {
        run(&ops)?;
    }
}
