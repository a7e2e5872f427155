//! The conformance scenarios on the asynchronous simulated device, with the
//! race sanitizer on (spec 1.10), in PyTorch mode and with the Reservoir-only
//! cross-stream reuse policy.

use reservoir::sim::{AsyncSimDevice, SimConfig};
use reservoir::{AllocatorConfig, Backend, CachingAllocator, StreamId};
use reservoir_testkit::conformance::{held_stream_reuse, integrity_run, IntegrityConfig};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const S0: StreamId = StreamId::DEFAULT;

fn allocator(config: AllocatorConfig) -> CachingAllocator<AsyncSimDevice> {
    let dev = AsyncSimDevice::new(SimConfig {
        capacity: 8 * GIB,
        ..SimConfig::default()
    });
    CachingAllocator::new(dev, config)
}

fn cross_stream() -> AllocatorConfig {
    let mut c = AllocatorConfig::default();
    c.policy = reservoir::config::ReservoirPolicy::CrossStreamReuse;
    c
}

#[test]
fn held_stream_block_is_reused_only_after_the_stream_finishes() {
    let a = allocator(AllocatorConfig::default());
    let busy = a.backend().create_stream().unwrap();
    let out = held_stream_reuse(&a, S0, busy, 3 * MIB).unwrap();
    assert_ne!(
        out.while_busy, out.freed,
        "not handed out while the stream is busy"
    );
    assert_eq!(out.after, out.freed, "handed out again once it finished");
    assert_eq!(out.data_intact, None, "the simulated device holds no data");
    a.backend().assert_no_races();
    a.check_invariants().unwrap();
}

#[test]
fn integrity_run_has_no_races() {
    let a = allocator(AllocatorConfig::default());
    let cfg = IntegrityConfig::default();
    let rep = integrity_run(&a, &cfg).unwrap();
    a.backend().assert_no_races();
    a.check_invariants().unwrap();
    assert_eq!(rep.ops, 10_000);
    assert!(rep.copies > 500 && rep.frees > 1000, "{rep:?}");
    eprintln!(
        "sim integrity: {} ops, {} streams, {} races, {} read-backs",
        rep.ops,
        rep.streams,
        a.backend().races().len(),
        rep.verified
    );
}

#[test]
fn cross_stream_reuse_integrity_run_has_no_races_and_reserves_less() {
    let cfg = IntegrityConfig {
        seed: 7,
        ..IntegrityConfig::default()
    };
    let pytorch = allocator(AllocatorConfig::default());
    let base = integrity_run(&pytorch, &cfg).unwrap();
    let reservoir = allocator(cross_stream());
    let rep = integrity_run(&reservoir, &cfg).unwrap();
    reservoir.backend().assert_no_races();
    reservoir.check_invariants().unwrap();
    assert!(reservoir.cross_stream_reuses() > 0);
    assert!(
        rep.peak_reserved < base.peak_reserved,
        "cross-stream {} vs pytorch {}",
        rep.peak_reserved,
        base.peak_reserved
    );
}

#[test]
fn reservoir_policy_without_virtual_memory_runs_pytorchs_segments_race_free() {
    // The asynchronous sim has no virtual memory: the `reservoir` policy
    // falls back to PyTorch's segments (expandable segments are dropped,
    // there is nothing to unmap), so it reserves what PyTorch mode does.
    let cfg = IntegrityConfig {
        seed: 11,
        ..IntegrityConfig::default()
    };
    let pytorch = allocator(AllocatorConfig::default());
    let base = integrity_run(&pytorch, &cfg).unwrap();
    let reservoir = allocator(AllocatorConfig::parse_with_policy("policy:reservoir").unwrap());
    let rep = integrity_run(&reservoir, &cfg).unwrap();
    reservoir.backend().assert_no_races();
    reservoir.check_invariants().unwrap();
    assert_eq!(rep.peak_reserved, base.peak_reserved);
    assert_eq!(rep.ops, base.ops);
}
