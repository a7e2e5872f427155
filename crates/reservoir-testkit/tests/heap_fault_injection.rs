//! Fault injection for the MPS heap allocator (issue 44, item 2; finding
//! G3): the caching allocator's sweep (`fault_injection.rs`) over the heap
//! allocator. Every backend entry point the heap allocator calls fails,
//! one call at a time, at the N-th call (N = 1..=K, and ten more spread to
//! its last call in the workload), with a non-retryable driver error, on
//! unified and discrete memory, with frees that wait for events and under
//! watermarks (memory pressure, garbage collection, the high limit). The
//! invariant checker (`HeapAllocator::check_invariants`) runs after every
//! operation from the fault on; failed allocations must leave the in-use
//! counters as they were; failed frees must say that nothing was freed and
//! change nothing; at the end, with the fault cleared, everything is
//! freed, the cache emptied and nothing may be left reserved (the
//! allocator's counters and the device's own count of live allocations and
//! events), and dropping the allocator leaves nothing on the device.
//!
//! Prints one line past libtest's capture, which CI's log shows:
//! `fault injection (mps heap): E entry points (names) x N=1..K (+10
//! spread) x 4 modes: R runs, F faults injected, V violations, L leaks`.

use std::sync::Arc;

use reservoir::backend::{Backend, BackendError};
use reservoir::config::heap::HeapSettings;
use reservoir::error::AllocError;
use reservoir::heap::{HeapAllocator, UsageFlags};
use reservoir::sim::{SimConfig, SimDevice};
use reservoir_testkit::faults::{sweep, EntryPoint, FaultyBackend, HeapSubject, LiveCounts, Sweep};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

const SWEEP: Sweep = Sweep {
    name: "mps heap",
    seed: 0x4444,
    ops: 3000,
    k: 40,
    spread: 10,
    after_fault: 600,
    capacity: 2 * GIB,
};

fn modes() -> Vec<(&'static str, HeapSettings)> {
    let pending = HeapSettings {
        free_waits_for_events: true,
        ..HeapSettings::new(true)
    };
    // Memory pressure from 1 GiB on (the low watermark: garbage collection,
    // oversize buffers released), nothing past 1.5 GiB (the high one).
    let watermarks = HeapSettings {
        recommended_max_memory: Some(SWEEP.capacity / 2),
        high_watermark_ratio: 1.5,
        low_watermark_ratio: 1.0,
        ..HeapSettings::new(true)
    };
    vec![
        ("unified", HeapSettings::new(true)),
        ("discrete", HeapSettings::new(false)),
        ("pending-free", pending),
        ("watermarks", watermarks),
    ]
}

#[test]
fn every_entry_point_of_the_heap_allocator_failing_at_the_nth_call() {
    let report = sweep::<HeapSubject>(&SWEEP, &modes());
    report.print_and_check();
    // Every entry point the heap allocator calls on this device is
    // exercised.
    for must in [
        EntryPoint::Allocate,
        EntryPoint::Free,
        EntryPoint::MemInfo,
        EntryPoint::CheckStream,
        EntryPoint::RecordEvent,
        EntryPoint::QueryEvent,
        EntryPoint::SynchronizeEvent,
        EntryPoint::DestroyEvent,
        EntryPoint::SynchronizeStream,
        EntryPoint::HostAddress,
    ] {
        assert!(
            report.entry_points.contains(&must),
            "the workload never calls {}",
            must.name()
        );
    }
}

/// G3: `malloc` reusing a cached buffer asks for its retain count
/// (`query_event` of its recorded work); when that failed the buffer had
/// already left its free list, so it belonged to nothing: the invariant
/// broke and its heap stayed reserved past `empty_cache` and drop.
#[test]
fn a_failed_query_event_while_malloc_reuses_a_cached_buffer_changes_nothing() {
    let dev = Arc::new(FaultyBackend::new(SimDevice::new(SimConfig {
        capacity: 8 * GIB,
        ..SimConfig::default()
    })));
    let a = HeapAllocator::new(dev.clone(), HeapSettings::new(true)).unwrap();
    let s1 = dev.create_stream().unwrap();
    let p = a.malloc(3 * MIB, UsageFlags::PRIVATE).unwrap();
    // Work on another stream still uses the buffer when it is freed (the
    // 2.x free: back to its pool at once, still busy).
    dev.inner().hold_stream(s1).unwrap();
    a.record_use(&[p], s1).unwrap();
    a.free(p).unwrap();
    let counters = |a: &HeapAllocator<_>| {
        (
            a.stats(),
            a.total_allocated_memory(),
            a.current_allocated_memory(),
        )
    };
    let before = counters(&a);
    dev.fail_nth(EntryPoint::QueryEvent, 1);
    let err = a.malloc(3 * MIB, UsageFlags::PRIVATE).unwrap_err();
    assert_eq!(dev.injected(), 1);
    assert!(
        matches!(&err, AllocError::Backend(BackendError::Driver(m)) if m.contains("query_event")),
        "{err:?}"
    );
    a.check_invariants().unwrap();
    assert_eq!(counters(&a), before);
    // The buffer is still cached: the next request reuses it.
    dev.inner().release_stream(s1).unwrap();
    let q = a.malloc(3 * MIB, UsageFlags::PRIVATE).unwrap();
    assert_eq!(q, p);
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.total_allocated_memory(), 0);
    drop(a);
    assert_eq!(dev.live(), LiveCounts::default());
}

/// Found by the sweep: a heap released while two of its buffers were
/// still used by work (zombies) kept the available size it had when
/// released; when one zombie's work completed its range became free but
/// the heap's available size stayed stale (the invariant broke).
#[test]
fn a_released_heap_keeps_its_available_size_as_its_zombies_complete() {
    let dev = Arc::new(FaultyBackend::new(SimDevice::new(SimConfig {
        capacity: 8 * GIB,
        ..SimConfig::default()
    })));
    let a = HeapAllocator::new(dev.clone(), HeapSettings::new(true)).unwrap();
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    // One 8 MiB heap filled with eight 1 MiB buffers.
    let bufs: Vec<_> = (0..8)
        .map(|_| a.malloc(MIB, UsageFlags::PRIVATE).unwrap())
        .collect();
    assert_eq!(a.total_allocated_memory(), 8 * MIB);
    // The first and the last are used by held work.
    dev.inner().hold_stream(s1).unwrap();
    dev.inner().hold_stream(s2).unwrap();
    a.record_use(&[bufs[0]], s1).unwrap();
    a.record_use(&[bufs[7]], s2).unwrap();
    for &p in &bufs {
        a.free(p).unwrap();
    }
    // The six idle ones are released, the two busy ones become zombies:
    // the heap leaves the pool with 6 MiB free.
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.total_allocated_memory(), 0);
    // The first one's work completes: its range joins the free space.
    dev.inner().release_stream(s1).unwrap();
    a.free_inactive_buffers().unwrap();
    a.check_invariants().unwrap();
    // Then the last one's: the heap goes back to the device.
    dev.inner().release_stream(s2).unwrap();
    a.free_inactive_buffers().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(dev.live().allocations, 0);
    drop(a);
    assert_eq!(dev.live(), LiveCounts::default());
}

/// Found by the sweep: garbage collection empties a split heap without
/// releasing it, and `emptyCache` never visits a heap with no buffer
/// (PyTorch's behaviour, kept): dropping the allocator left that heap's
/// memory on the device for good. Now the drop releases it.
#[test]
fn dropping_the_heap_allocator_releases_the_heaps_empty_cache_keeps() {
    let dev = Arc::new(FaultyBackend::new(SimDevice::new(SimConfig {
        capacity: 64 * GIB,
        ..SimConfig::default()
    })));
    let settings = HeapSettings {
        recommended_max_memory: Some(GIB),
        high_watermark_ratio: 1.2,
        low_watermark_ratio: 0.5,
        ..HeapSettings::new(true)
    };
    let a = HeapAllocator::new(dev.clone(), settings).unwrap();
    // An extra-large 1 GiB heap (no pressure yet).
    let p = a.malloc(400 * MIB, UsageFlags::PRIVATE).unwrap();
    assert_eq!(a.total_allocated_memory(), GIB);
    a.free(p).unwrap();
    // Refused by the high watermark; the garbage collection releases the
    // buffer and keeps its split heap, empty.
    let err = a.malloc(300 * MIB, UsageFlags::PRIVATE).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err:?}");
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.total_allocated_memory(), GIB, "emptyCache keeps it");
    assert_eq!(dev.live().allocations, 1);
    drop(a);
    assert_eq!(dev.live(), LiveCounts::default());
}

/// `recordEvents` over several shared buffers: a failed `record_event`
/// for the second one left the first one's events recorded. Now a failed
/// call changes no buffer and leaves no event on the device.
#[test]
fn a_failed_record_events_changes_no_buffer() {
    let dev = Arc::new(FaultyBackend::new(SimDevice::new(SimConfig {
        capacity: 8 * GIB,
        ..SimConfig::default()
    })));
    let a = HeapAllocator::new(dev.clone(), HeapSettings::new(true)).unwrap();
    let s1 = dev.create_stream().unwrap();
    let p = a.malloc(MIB, UsageFlags::SHARED).unwrap();
    let q = a.malloc(MIB, UsageFlags::SHARED).unwrap();
    dev.inner().hold_stream(s1).unwrap();
    // Two events per buffer: the third call is the second buffer's first.
    dev.fail_nth(EntryPoint::RecordEvent, 3);
    let err = a.record_events(&[p, q], s1).unwrap_err();
    assert!(
        matches!(&err, AllocError::Backend(BackendError::Driver(_))),
        "{err:?}"
    );
    assert_eq!(dev.live().events, 0, "no event left recorded");
    assert_eq!(a.shared_buffer_ptr(p).unwrap().1, 1, "p's retain count");
    assert!(!a.wait_for_events(&[p, q]).unwrap());
    a.check_invariants().unwrap();
    // Without the fault both buffers get their events.
    assert!(a.record_events(&[p, q], s1).unwrap());
    assert_eq!(a.shared_buffer_ptr(p).unwrap().1, 2);
    dev.inner().release_stream(s1).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    drop(a);
    assert_eq!(dev.live(), LiveCounts::default());
}

/// `commit` with two freed scalars: a failed `record_event` for the second
/// one's completion handler left the first one's recorded. Now a failed
/// commit records nothing (both still wait for the next commit).
#[test]
fn a_failed_commit_records_no_handler() {
    let dev = Arc::new(FaultyBackend::new(SimDevice::new(SimConfig {
        capacity: 8 * GIB,
        ..SimConfig::default()
    })));
    let a = HeapAllocator::new(dev.clone(), HeapSettings::new(true)).unwrap();
    let p = a.malloc(64, UsageFlags::SCALAR).unwrap();
    let q = a.malloc(64, UsageFlags::SCALAR).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    let before = a.stats();
    dev.fail_nth(EntryPoint::RecordEvent, 2);
    let err = a.commit().unwrap_err();
    assert!(
        matches!(&err, AllocError::Backend(BackendError::Driver(_))),
        "{err:?}"
    );
    assert_eq!(dev.live().events, 0, "no handler left recorded");
    assert_eq!(a.stats(), before);
    a.check_invariants().unwrap();
    // The next commit brings both back.
    a.commit().unwrap();
    assert_eq!(a.stats().active.all().current, 0);
    a.empty_cache().unwrap();
    drop(a);
    assert_eq!(dev.live(), LiveCounts::default());
}
