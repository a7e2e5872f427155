//! Tearing the allocator down (issue 15's `Drop`; PyTorch never destroys
//! its allocator, so there is no spec rule: see `caching/teardown.rs`).
//! Every test checks the simulated driver's own counters after the drop:
//! no live allocation, no byte in use, no live event, no reservation left.

use std::sync::Arc;

use reservoir::caching::PoolFilter;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocatorConfig, Backend, CachingAllocator, DevicePtr, MempoolId, StreamId};

use crate::common::{GIB, MIB, S0};

fn device() -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig {
        capacity: 8 * GIB,
        ..SimConfig::default()
    }))
}

fn allocator(dev: &Arc<SimDevice>, conf: &str) -> CachingAllocator<Arc<SimDevice>> {
    let config = if conf.is_empty() {
        AllocatorConfig::default()
    } else {
        AllocatorConfig::parse(conf).unwrap()
    };
    CachingAllocator::new(dev.clone(), config)
}

/// The driver holds nothing: every allocation, event and reservation is gone.
fn assert_driver_empty(dev: &SimDevice) {
    let c = dev.counters();
    assert_eq!(c.live_allocs, 0, "live driver allocations: {c:?}");
    assert_eq!(c.bytes_in_use, 0, "driver bytes in use: {c:?}");
    assert_eq!(c.live_events, 0, "live events: {c:?}");
    assert_eq!(c.reserves, c.releases, "reservations left: {c:?}");
    assert_eq!(c.pages_mapped, 0, "pages still mapped: {c:?}");
}

#[test]
fn drop_returns_every_cached_segment() {
    let dev = device();
    let a = allocator(&dev, "");
    // Small and large pools, a split segment and a whole one, all freed.
    let ptrs: Vec<DevicePtr> = [512, 4096, 3 * MIB, 30 * MIB]
        .iter()
        .map(|&s| a.raw_alloc(s, S0).unwrap())
        .collect();
    for p in ptrs {
        a.raw_free(p).unwrap();
    }
    a.check_invariants().unwrap();
    let before = dev.counters();
    assert!(before.live_allocs >= 3 && before.bytes_in_use > 0);
    drop(a);
    assert_driver_empty(&dev);
    assert_eq!(dev.counters().frees, before.allocs);
}

#[test]
fn close_reports_live_blocks_and_still_releases_their_segments() {
    let dev = device();
    let a = allocator(&dev, "");
    let kept = a.raw_alloc(1000, S0).unwrap();
    let big = a.raw_alloc(25 * MIB, S0).unwrap();
    let freed = a.raw_alloc(2000, S0).unwrap();
    a.raw_free(freed).unwrap();
    a.check_invariants().unwrap();
    let segments = dev.counters().live_allocs;
    let reserved = dev.counters().bytes_in_use;
    let report = a.close();
    assert_eq!(report.live_blocks, 2);
    assert_eq!(report.live_bytes, 1024 + 26 * MIB, "rounded block sizes");
    let mut expect = vec![kept, big];
    expect.sort();
    assert_eq!(report.live_addresses, expect);
    assert_eq!(report.segments_released, segments);
    assert_eq!(report.bytes_released, reserved);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(!report.is_clean());
    assert_driver_empty(&dev);
}

#[test]
fn drop_synchronizes_pending_cross_stream_frees_first() {
    // A block freed while another stream still uses it (spec 1.10) waits for
    // an event; teardown synchronizes it and destroys the event.
    let dev = device();
    let a = allocator(&dev, "");
    let s1 = dev.create_stream().unwrap();
    let p = a.raw_alloc(30 * MIB, S0).unwrap();
    a.record_stream(p, s1).unwrap();
    dev.hold_stream(s1).unwrap();
    a.raw_free(p).unwrap();
    assert_eq!(dev.counters().live_events, 1);
    let report = a.close();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.segments_released, 1);
    assert_driver_empty(&dev);
}

#[test]
fn drop_unmaps_and_releases_expandable_segments() {
    let dev = device();
    let a = allocator(&dev, "expandable_segments:True");
    let s1 = dev.create_stream().unwrap();
    let live = a.raw_alloc(50 * MIB, S0).unwrap();
    let freed = a.raw_alloc(30 * MIB, S0).unwrap();
    let small = a.raw_alloc(4096, s1).unwrap();
    a.raw_free(freed).unwrap();
    a.raw_free(small).unwrap();
    a.check_invariants().unwrap();
    let c = dev.counters();
    assert!(c.reserves >= 2 && c.pages_mapped > 0, "{c:?}");
    let report = a.close();
    assert_eq!(report.live_blocks, 1);
    assert_eq!(report.live_addresses, vec![live]);
    assert_eq!(report.segments_released, c.reserves - c.releases);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_driver_empty(&dev);
}

#[test]
fn drop_releases_private_pool_segments() {
    // spec 1.14: a private pool's segments are not released by empty_cache
    // while the pool is in use; teardown releases them anyway.
    const P: MempoolId = MempoolId(1, 0);
    let s1 = StreamId(1);
    let dev = device();
    dev.register_stream(s1);
    let a = allocator(&dev, "");
    a.begin_allocate_to_pool(P, PoolFilter::Stream(s1)).unwrap();
    let p = a.raw_alloc(MIB, s1).unwrap();
    a.raw_free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(dev.counters().live_allocs, 1, "the pool keeps its segment");
    drop(a);
    assert_driver_empty(&dev);
}

#[test]
fn an_empty_allocator_drops_without_touching_the_driver() {
    let dev = device();
    dev.set_call_log(true);
    let report = allocator(&dev, "").close();
    assert_eq!(report, Default::default());
    assert!(dev.call_log().is_empty());
    assert_eq!(dev.counters().forced_syncs, 0);
}

#[test]
fn the_report_lists_the_eight_lowest_live_addresses() {
    let dev = device();
    let a = allocator(&dev, "");
    let mut live: Vec<DevicePtr> = (0..20)
        .map(|i| a.raw_alloc(512 * (i % 3 + 1), S0).unwrap())
        .collect();
    a.check_invariants().unwrap();
    let report = a.close();
    live.sort();
    assert_eq!(report.live_blocks, 20);
    assert_eq!(report.live_addresses, live[..8]);
    assert_driver_empty(&dev);
}
