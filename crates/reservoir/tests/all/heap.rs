//! The MPS heap allocator (spec section 4) on the simulated devices, with
//! the invariant checker run after every operation.

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use reservoir::backend::HostWrite;
use reservoir::config::heap::{
    strtol_base0, HeapSettings, HeapSettingsError, ENV_DEBUG, ENV_HIGH_WATERMARK_RATIO,
    ENV_LOW_WATERMARK_RATIO,
};
use reservoir::heap::*;
use reservoir::observe::callbacks::{AllocatorEvent, EventType};
use reservoir::observe::debug::DebugVerbosity;
use reservoir::observe::snapshot::BlockState;
use reservoir::sim::{Access, AsyncSimDevice, SimConfig, SimDevice};
use reservoir::{AllocError, Backend, BackendError, DevicePtr, StreamId};

use crate::common::{GIB, MIB, S0};
use crate::observe::Collect;

const KIB: u64 = 1 << 10;

/// A heap allocator whose invariants are checked after every call.
struct H<B: Backend = SimDevice> {
    a: HeapAllocator<B>,
}

impl<B: Backend> H<B> {
    fn check(&self) {
        if let Err(e) = self.a.check_invariants() {
            panic!("invariant broken: {e}");
        }
        self.a.snapshot().check_consistency().unwrap();
    }
    fn malloc(&self, size: u64) -> DevicePtr {
        let p = self.a.malloc(size, UsageFlags::PRIVATE).unwrap();
        self.check();
        p
    }
    fn try_malloc(&self, size: u64, usage: UsageFlags) -> Result<DevicePtr, AllocError> {
        let r = self.a.malloc(size, usage);
        self.check();
        r
    }
    fn free(&self, p: DevicePtr) {
        self.a.free(p).unwrap();
        self.check();
    }
    fn empty(&self) {
        self.a.empty_cache().unwrap();
        self.check();
    }
    fn heaps(&self) -> Vec<(u64, SegmentKind)> {
        self.a
            .snapshot()
            .segments
            .iter()
            .map(|s| {
                (
                    s.total_size,
                    SegmentKind(s.segment_type.as_str().to_string()),
                )
            })
            .collect()
    }
    /// Register a callback that logs every event, with the Reservoir
    /// extension that fires all five turned on.
    fn log(&self) -> Arc<Mutex<Vec<EventType>>> {
        self.a.set_all_callback_events(true);
        self.log_only()
    }
    /// Register a callback that logs the events fired (by default only
    /// `AllocationFailed`, as PyTorch).
    fn log_only(&self) -> Arc<Mutex<Vec<EventType>>> {
        let seen: Arc<Mutex<Vec<EventType>>> = Arc::default();
        let log = seen.clone();
        self.a
            .callbacks()
            .register(
                "log",
                Arc::new(move |e: &AllocatorEvent| log.lock().unwrap().push(e.event)),
            )
            .unwrap();
        seen
    }
}

#[derive(Debug, PartialEq)]
struct SegmentKind(String);

/// A message as the given era writes it: the default (c10's "KiB"/"MiB"/
/// "GiB") as written, or PyTorch 2.0-2.6's "KB"/"MB"/"GB" (the same digits
/// at the sizes these tests use).
fn units(f: SizeFormat, msg: &str) -> String {
    match f {
        SizeFormat::C10 => msg.to_string(),
        SizeFormat::Mps26 => msg
            .replace(" KiB", " KB")
            .replace(" MiB", " MB")
            .replace(" GiB", " GB"),
    }
}

const ERAS: [SizeFormat; 2] = [SizeFormat::C10, SizeFormat::Mps26];

fn sim(capacity: u64) -> SimDevice {
    SimDevice::new(SimConfig {
        capacity,
        ..SimConfig::default()
    })
}

fn heap(capacity: u64, unified: bool, f: impl FnOnce(&mut HeapSettings)) -> H {
    let mut s = HeapSettings::new(unified);
    f(&mut s);
    let h = H {
        a: HeapAllocator::new(sim(capacity), s).unwrap(),
    };
    h.check();
    h
}

fn unified() -> H {
    heap(64 * GIB, true, |_| {})
}

fn discrete() -> H {
    heap(64 * GIB, false, |_| {})
}

#[test]
fn constants_flags_and_pools_are_spec_4_1() {
    assert_eq!(
        [
            MAX_SMALL_ALLOC,
            MIN_LARGE_ALLOC,
            ROUND_LARGE,
            SMALL_HEAP,
            LARGE_HEAP
        ],
        [MIB, 10 * MIB, 2 * MIB, 8 * MIB, 32 * MIB]
    );
    assert_eq!(
        (XLARGE_HEAP_DISCRETE, XLARGE_HEAP_UNIFIED),
        (128 * MIB, GIB)
    );
    assert_eq!(MAX_SCALAR_ALLOC, 8);
    let bits = [
        UsageFlags::PRIVATE,
        UsageFlags::SMALL,
        UsageFlags::SHARED,
        UsageFlags::MANAGED,
        UsageFlags::HAZARD,
        UsageFlags::SCALAR,
    ]
    .map(|u| u.0);
    assert_eq!(bits, [0, 1, 2, 4, 8, 16]);
    let usages = PoolKind::ALL.map(|k| k.usage().0);
    assert_eq!(usages, [8, 10, 9, 11, 19]);
    let o = PoolKind::Scalar.usage().resource_options();
    assert_eq!((o.storage, o.hazard_tracked), (StorageMode::Shared, false));
    let o = PoolKind::PrivateLarge.usage().resource_options();
    assert_eq!((o.storage, o.hazard_tracked), (StorageMode::Private, true));
    let o = (UsageFlags::MANAGED | UsageFlags::SHARED).resource_options();
    assert_eq!(o.storage, StorageMode::Managed);
    assert_eq!(PoolKind::SharedSmall.to_string(), "small shared");
}

#[test]
fn pools_are_chosen_as_spec_4_2_step_3() {
    let h = unified();
    // ≤ 8 bytes on unified memory: the shared small pool, whatever the usage.
    let tiny = h.malloc(8);
    assert!(h.a.is_shared_buffer(tiny));
    let small = h.malloc(MIB);
    assert!(!h.a.is_shared_buffer(small));
    let large = h.malloc(MIB + 1);
    let shared = h.try_malloc(MIB, UsageFlags::SHARED).unwrap();
    assert!(h.a.is_shared_buffer(shared));
    let scalar = h.try_malloc(4, UsageFlags::SCALAR).unwrap();
    assert!(h.a.is_shared_buffer(scalar));
    // Three small heaps (shared small holding two buffers, private small,
    // scalar) and one large.
    let mut kinds = h.heaps();
    kinds.sort_by_key(|k| k.0);
    let small_heaps = kinds.iter().filter(|k| k.1 .0 == "small").count();
    assert_eq!(small_heaps, 3, "{kinds:?}");
    assert!(kinds.contains(&(32 * MIB, SegmentKind("large".into()))));
    let _ = large;
    // Discrete: 8 bytes stay private.
    let d = discrete();
    let p = d.malloc(8);
    assert!(!d.a.is_shared_buffer(p));
}

#[test]
fn heap_sizes_follow_spec_4_2_step_7() {
    for (unified, size, heap_size) in [
        (true, 1, SMALL_HEAP),
        (true, MIB, SMALL_HEAP),
        (true, MIB + 1, LARGE_HEAP),
        (true, 10 * MIB - 16 * KIB, LARGE_HEAP),
        (true, 10 * MIB, GIB),
        (true, 512 * MIB - 16 * KIB, GIB),
        // At XLarge/2 and above: a single-buffer heap rounded to 2 MiB.
        (true, 512 * MIB, 512 * MIB),
        (true, 600 * MIB + 1, 602 * MIB),
        (false, 10 * MIB, 128 * MIB),
        (false, 64 * MIB - 16 * KIB, 128 * MIB),
        (false, 64 * MIB, 64 * MIB),
        (false, 100 * MIB + 5, 102 * MIB),
    ] {
        let h = heap(64 * GIB, unified, |_| {});
        let p = h.malloc(size);
        assert_eq!(
            h.a.total_allocated_memory(),
            heap_size,
            "{size} on {unified}"
        );
        assert_eq!(h.a.unaligned_buffer_size(p), Some(size));
        h.free(p);
        h.empty();
        assert_eq!(h.a.total_allocated_memory(), 0);
        assert_eq!(h.a.driver_allocated_memory(), 0);
    }
}

#[test]
fn sizes_are_aligned_by_the_backend_spec_4_2_step_2() {
    let h = unified();
    let a = h.malloc(100);
    let b = h.malloc(100);
    // 16 KiB apart: the default alignment, placed first fit in one heap.
    assert_eq!(b.0 - a.0, 16 * KIB);
    let seg = &h.a.snapshot().segments[0];
    assert_eq!(seg.blocks[0].size, 16 * KIB);
    assert_eq!(seg.blocks[0].requested_size, Some(100));
    assert_eq!(h.a.current_allocated_memory(), 32 * KIB);
}

#[test]
fn single_buffer_heaps_under_memory_pressure_spec_4_2_step_7() {
    // Low limit 0.5 × 1 GiB = 512 MiB; a 10 MiB request would get a 1 GiB
    // heap, but under pressure it gets its own 10 MiB heap.
    let h = heap(64 * GIB, true, |s| {
        s.recommended_max_memory = Some(GIB);
        s.low_watermark_ratio = 0.5;
    });
    let big = h.malloc(600 * MIB);
    assert_eq!(h.a.low_watermark_value(), 0);
    h.malloc(10 * MIB);
    assert_eq!(h.a.total_allocated_memory(), 610 * MIB);
    h.free(big);
}

#[test]
fn whole_buffers_are_reused_up_to_32_mib_larger_spec_4_2_step_5() {
    let h = unified();
    let p = h.malloc(40 * MIB);
    h.free(p);
    let log = h.log();
    // 40 MiB ≤ 10 MiB + 32 MiB: reused whole.
    let q = h.malloc(10 * MIB);
    assert_eq!(q, p);
    assert_eq!(h.a.current_allocated_memory(), 40 * MIB);
    assert_eq!(h.a.unaligned_buffer_size(q), Some(10 * MIB));
    h.free(q);
    // 40 MiB > 5 MiB + 32 MiB and its 1 GiB heap has room: a new buffer.
    let r = h.malloc(5 * MIB);
    assert_ne!(r, p);
    assert_eq!(h.a.total_allocated_memory(), GIB);
    assert_eq!(
        *log.lock().unwrap(),
        [EventType::Recycled, EventType::Freed, EventType::Allocated]
    );
}

#[test]
fn an_idle_oversize_buffer_is_released_and_its_heap_kept_spec_4_2_step_5() {
    let h = discrete();
    let p = h.malloc(100 * MIB); // a single-buffer 100 MiB heap
    h.free(p);
    let log = h.log();
    let q = h.malloc(50 * MIB);
    // Released from its heap (kept), then placed at the same offset.
    assert_eq!(q, p);
    assert_eq!(h.a.total_allocated_memory(), 100 * MIB);
    assert_eq!(
        *log.lock().unwrap(),
        [EventType::Released, EventType::Allocated]
    );
    let seg = &h.a.snapshot().segments[0];
    assert_eq!(seg.blocks.len(), 2);
    assert_eq!(seg.blocks[1].state, BlockState::Inactive);
}

/// A discrete device where the retain counts of 2.x matter: freed buffers
/// go back at once, busy or not.
fn busy_heap(low: f64) -> H {
    heap(64 * GIB, false, |s| {
        s.free_waits_for_events = false;
        s.recommended_max_memory = Some(200 * MIB);
        s.low_watermark_ratio = low;
    })
}

#[test]
fn a_busy_oversize_buffer_under_pressure_is_released_with_its_heap_spec_4_2_step_5() {
    let h = busy_heap(0.5); // low limit 100 MiB
    let dev = h.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = h.malloc(100 * MIB);
    dev.hold_stream(s1).unwrap();
    h.a.record_use(&[p], s1).unwrap();
    h.free(p); // available at once, still busy
    assert_eq!(h.a.low_watermark_value(), 0);
    let q = h.malloc(50 * MIB);
    assert_ne!(q, p);
    // The old heap left the allocator; the device keeps it until s1 is done.
    assert_eq!(h.a.total_allocated_memory(), 50 * MIB);
    assert_eq!(h.a.driver_allocated_memory(), 150 * MIB);
    dev.release_stream(s1).unwrap();
    h.a.free_inactive_buffers().unwrap();
    h.check();
    assert_eq!(h.a.driver_allocated_memory(), 50 * MIB);
}

#[test]
fn a_busy_buffer_released_from_a_heap_keeps_its_range_until_done_spec_4_3() {
    let h = heap(64 * GIB, false, |s| s.free_waits_for_events = false);
    let dev = h.a.backend();
    let s1 = dev.create_stream().unwrap();
    // Three 9 MiB buffers in one 32 MiB heap, 5 MiB left.
    let [a, b, c] = [0; 3].map(|_| h.malloc(9 * MIB));
    dev.hold_stream(s1).unwrap();
    h.a.record_use(&[b], s1).unwrap();
    h.free(b); // 2.x: available at once, still busy
    h.empty();
    // Released from the allocator, but its range stays occupied in the
    // heap (heaps_pending_update) while s1 runs: 5 MiB available.
    let states = |h: &H| -> Vec<BlockState> {
        h.a.snapshot().segments[0]
            .blocks
            .iter()
            .map(|b| b.state)
            .collect()
    };
    use BlockState::{ActiveAllocated as A, ActivePendingFree as P, Inactive as I};
    assert_eq!(states(&h), [A, P, A, I]);
    assert_eq!(h.a.buffer_id(b), 0);
    assert_eq!(h.a.total_allocated_memory(), LARGE_HEAP);
    dev.release_stream(s1).unwrap();
    h.a.free_inactive_buffers().unwrap();
    h.check();
    assert_eq!(states(&h), [A, I, A, I]);
    // The heap's available size is 9 MiB again: the range is reused.
    assert_eq!(h.malloc(9 * MIB), b);
    assert_eq!(h.a.total_allocated_memory(), LARGE_HEAP);
    h.free(a);
    h.free(c);
}

#[test]
fn a_busy_oversize_buffer_without_pressure_is_reused_spec_4_2_step_5() {
    let h = busy_heap(0.0);
    let dev = h.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = h.malloc(100 * MIB);
    dev.hold_stream(s1).unwrap();
    h.a.record_use(&[p], s1).unwrap();
    h.free(p);
    assert_eq!(h.a.low_watermark_value(), i64::MAX);
    assert_eq!(h.malloc(50 * MIB), p);
    dev.release_stream(s1).unwrap();
}

#[test]
fn the_high_watermark_refuses_before_the_device_spec_4_4() {
    for era in ERAS {
        the_high_watermark_refuses_in(era);
    }
}

fn the_high_watermark_refuses_in(era: SizeFormat) {
    let h = heap(64 * GIB, true, |s| {
        s.recommended_max_memory = Some(GIB);
        s.high_watermark_ratio = 1.0;
        s.low_watermark_ratio = 0.0;
        s.size_format = era;
    });
    assert_eq!(h.a.high_watermark_limit(), GIB);
    h.malloc(600 * MIB);
    let e = h.try_malloc(500 * MIB, UsageFlags::PRIVATE).unwrap_err();
    assert_eq!(
        e.to_string(),
        units(
            era,
            "MPS backend out of memory (MPS allocated: 600.00 MiB, other allocations: 0 bytes, \
             max allowed: 1024.00 MiB). Tried to allocate 500.00 MiB on private pool. Use \
             PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations \
             (may cause system failure)."
        )
    );
    let oom = e.as_oom().unwrap();
    assert_eq!(
        (oom.requested, oom.alloc_size, oom.allowed),
        (500 * MIB, 500 * MIB, Some(GIB))
    );
    assert_eq!(h.a.stats().num_ooms, 1);
    // Lifting the limit lets it through.
    h.a.set_high_watermark_ratio(0.0).unwrap();
    assert_eq!(h.a.high_watermark_limit(), u64::MAX);
    h.malloc(500 * MIB);
}

#[test]
fn the_oom_text_without_high_watermark_spec_4_2_step_8() {
    for era in ERAS {
        let h = heap(GIB, true, |s| {
            s.high_watermark_ratio = 0.0;
            s.low_watermark_ratio = 0.0;
            s.size_format = era;
        });
        the_oom_text_without_high_watermark_in(h, era);
    }
}

fn the_oom_text_without_high_watermark_in(h: H, era: SizeFormat) {
    // 10 MiB of "other allocations" straight from the device.
    h.a.backend().allocate(10 * MIB, S0).unwrap();
    h.malloc(600 * MIB);
    let e = h.try_malloc(500 * MIB + 1, UsageFlags::SHARED).unwrap_err();
    assert_eq!(
        e.to_string(),
        units(
            era,
            "MPS backend out of memory (MPS allocated: 600.00 MiB, other allocations: 10.00 MiB). \
             Tried to allocate 500.02 MiB on shared pool."
        )
    );
}

/// PyTorch 2.0-2.6's own `format_size` (the `SizeFormat::Mps26` setting).
#[test]
fn format_size_2_6_is_the_old_mps_one() {
    assert_eq!(format_size_2_6(0), "0 bytes");
    assert_eq!(format_size_2_6(1024), "1024 bytes");
    assert_eq!(format_size_2_6(1536), "1.50 KB");
    assert_eq!(format_size_2_6(MIB), "1024.00 KB");
    assert_eq!(format_size_2_6(MIB + 1), "1.00 MB");
    assert_eq!(format_size_2_6(GIB + 1), "1.00 GB");
    let h = heap(64 * GIB, true, |s| s.size_format = SizeFormat::Mps26);
    assert_eq!(h.a.format_size(3 * GIB), "3.00 GB");
    assert_eq!(HeapSettings::torch_2_6(true).size_format, SizeFormat::Mps26);
}

#[test]
fn the_failure_chain_runs_in_order_spec_4_2_step_6() {
    // release_available_cached_buffers frees enough: no full flush.
    let h = heap(GIB, false, |s| {
        s.high_watermark_ratio = 0.0;
        s.low_watermark_ratio = 0.0;
    });
    let a = h.malloc(300 * MIB);
    let b = h.malloc(300 * MIB);
    h.free(a);
    h.free(b);
    let log = h.log();
    h.malloc(500 * MIB);
    assert_eq!(
        *log.lock().unwrap(),
        [
            EventType::AllocationFailed,
            EventType::Released,
            EventType::Released,
            EventType::Allocated
        ]
    );
    assert_eq!(h.a.stats().num_alloc_retries, 0);

    // Not enough in the pool: the full flush (release_cached_buffers) follows.
    let h = heap(GIB, false, |s| {
        s.high_watermark_ratio = 0.0;
        s.low_watermark_ratio = 0.0;
    });
    let a = h.malloc(300 * MIB);
    let _b = h.malloc(300 * MIB);
    let small = h.malloc(MIB);
    h.free(a);
    h.free(small);
    let log = h.log();
    h.malloc(500 * MIB);
    assert_eq!(
        *log.lock().unwrap(),
        [
            EventType::AllocationFailed,
            EventType::Released, // a, by release_available_cached_buffers
            EventType::Released, // the small buffer, by release_cached_buffers
            EventType::Allocated
        ]
    );
    let st = h.a.stats();
    assert_eq!((st.num_alloc_retries, st.num_sync_all_streams), (1, 1));
}

#[test]
fn an_allocation_failed_callback_may_free_memory_spec_4_5() {
    let h = Arc::new(heap(GIB, false, |s| {
        s.high_watermark_ratio = 0.0;
        s.low_watermark_ratio = 0.0;
    }));
    let victim = h.malloc(600 * MIB);
    let weak = Arc::downgrade(&h);
    h.a.callbacks()
        .register(
            "gc",
            Arc::new(move |e: &AllocatorEvent| {
                if e.event != EventType::AllocationFailed {
                    return;
                }
                assert!(e.ptr.is_null());
                if let Some(h) = weak.upgrade() {
                    h.a.free(victim).unwrap();
                }
            }),
        )
        .unwrap();
    // The device is full; the callback frees the victim, whose buffer the
    // retried get_free_buffer takes whole.
    assert_eq!(h.malloc(600 * MIB), victim);
    assert_eq!(h.a.stats().num_alloc_retries, 0);
}

/// The callback scenario of `all_five_callbacks_fire_spec_4_5` and
/// `audit_36_only_allocation_failed_fires_by_default`: allocate, free,
/// reuse, free, empty the cache, then fail an allocation; `log` picks the
/// events logged (`H::log` or `H::log_only`).
fn callback_events(log: impl FnOnce(&H) -> Arc<Mutex<Vec<EventType>>>) -> Vec<EventType> {
    let h = heap(GIB, true, |s| {
        s.high_watermark_ratio = 0.0;
        s.low_watermark_ratio = 0.0;
        s.max_buffer_length = Some(4 * GIB);
    });
    let log = log(&h);
    let p = h.malloc(MIB);
    h.free(p);
    let q = h.malloc(MIB);
    h.free(q);
    h.empty();
    assert!(h.try_malloc(2 * GIB, UsageFlags::PRIVATE).is_err());
    let events = log.lock().unwrap().clone();
    events
}

#[test]
fn all_five_callbacks_fire_spec_4_5() {
    assert_eq!(
        callback_events(H::log),
        [
            EventType::Allocated,
            EventType::Freed,
            EventType::Recycled,
            EventType::Freed,
            EventType::Released,
            EventType::AllocationFailed
        ]
    );
}

#[test]
fn garbage_collection_stops_at_its_target_spec_4_3() {
    // Discrete: requests of 64 MiB get single-buffer heaps. Low limit
    // 0.5 × 1 GiB = 512 MiB; high watermark off.
    let h = heap(64 * GIB, false, |s| {
        s.recommended_max_memory = Some(GIB);
        s.high_watermark_ratio = 0.0;
        s.low_watermark_ratio = 0.5;
    });
    let ps: Vec<DevicePtr> = (0..9).map(|_| h.malloc(64 * MIB)).collect();
    let era = SizeFormat::C10;
    for p in ps {
        h.free(p);
    }
    // 576 MiB allocated: 64 MiB above the low limit.
    assert_eq!(h.a.driver_allocated_memory(), 576 * MIB);
    let log = h.log();
    let out: Arc<Mutex<Vec<String>>> = Arc::default();
    h.a.set_debug_verbosity(DebugVerbosity::RELEASES);
    tracing::subscriber::with_default(Collect(out.clone()), || h.malloc(200 * MIB));
    let msgs = out.lock().unwrap().clone();
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
    assert!(msgs[0].starts_with("Released buffer #"));
    assert!(msgs[1].starts_with("Released heap #"));
    assert_eq!(
        msgs[2],
        units(
            era,
            "Garbage collected 1 buffers from large private pool (total reclaimed: 64.00 MiB, #buffers: 8)"
        )
    );
    // One idle buffer (and its unsplit heap) released: the target reached,
    // GC stops although eight more are as old.
    assert_eq!(
        *log.lock().unwrap(),
        [EventType::Released, EventType::Allocated]
    );
    assert_eq!(h.a.total_allocated_memory(), 8 * 64 * MIB + 200 * MIB);
    let released = h.a.stats().segment.all().freed;
    assert_eq!(released, 1);
}

#[test]
fn empty_cache_releases_every_cached_buffer_and_empty_heap_spec_4_3() {
    let h = unified();
    let a = h.malloc(MIB);
    let b = h.malloc(MIB);
    let c = h.malloc(20 * MIB);
    h.free(a);
    h.free(c);
    h.empty();
    // b keeps its small heap; the large heap is gone.
    assert_eq!(h.a.total_allocated_memory(), SMALL_HEAP);
    assert_eq!(h.a.stats().num_sync_all_streams, 1);
    h.free(b);
    h.empty();
    assert_eq!(h.a.total_allocated_memory(), 0);
    assert_eq!(h.a.driver_allocated_memory(), 0);
}

#[test]
fn a_busy_buffer_waits_in_the_pending_set_on_the_async_device_spec_4_3() {
    // The later redesign's free path (free_waits_for_events).
    let mut settings = HeapSettings::new(true);
    settings.free_waits_for_events = true;
    let h = H {
        a: HeapAllocator::new(
            AsyncSimDevice::new(SimConfig {
                capacity: 8 * GIB,
                ..SimConfig::default()
            }),
            settings,
        )
        .unwrap(),
    };
    let dev = h.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = h.a.malloc(4 * MIB, UsageFlags::PRIVATE).unwrap();
    dev.enqueue(s1, 50_000, &[Access::write(p, 4 * MIB)])
        .unwrap();
    h.a.record_use(&[p], s1).unwrap();
    h.a.free(p).unwrap();
    h.check();
    // Pending: still active, not allocated, not reusable.
    let st = h.a.stats();
    assert_eq!(
        (st.allocation.all().current, st.active.all().current),
        (0, 1)
    );
    let blocks = &h.a.snapshot().segments[0].blocks;
    assert_eq!(blocks[0].state, BlockState::ActivePendingFree);
    let q = h.a.malloc(4 * MIB, UsageFlags::PRIVATE).unwrap();
    assert_ne!(q, p);
    h.check();
    // A free of an already pending buffer is refused.
    assert!(matches!(
        h.a.free(p),
        Err(AllocError::InvalidPointer { .. })
    ));
    dev.run_until_idle();
    h.a.free_inactive_buffers().unwrap();
    h.check();
    assert_eq!(h.a.stats().active.all().current, 1);
    assert_eq!(h.a.malloc(4 * MIB, UsageFlags::PRIVATE).unwrap(), p);
    h.check();
    dev.assert_no_races();
}

#[test]
fn wait_for_events_returns_pending_buffers_spec_4_3() {
    // The later redesign's free path: a freed shared buffer with recorded
    // work waits in the pending set until waitForEvents.
    let h = heap(64 * GIB, true, |s| s.free_waits_for_events = true);
    let dev = h.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = h.try_malloc(MIB, UsageFlags::SHARED).unwrap();
    dev.enqueue_work(s1).unwrap();
    dev.hold_stream(s1).unwrap();
    assert!(h.a.record_events(&[p], s1).unwrap());
    h.free(p);
    assert_eq!(h.a.current_allocated_memory(), 16 * KIB * 64);
    // Waited on the host (the held work is forced to completion): true,
    // and freeInactiveBuffers returns the buffer.
    assert!(h.a.wait_for_events(&[p]).unwrap());
    h.check();
    assert_eq!(h.a.current_allocated_memory(), 0);
    // Nothing left to wait for: false.
    assert!(!h.a.wait_for_events(&[p]).unwrap());
    dev.release_stream(s1).unwrap();
    // Unknown pointers record and wait for nothing.
    assert!(!h.a.wait_for_events(&[DevicePtr(0x10)]).unwrap());
    assert!(!h.a.record_events(&[DevicePtr(0x10)], s1).unwrap());
}

#[test]
fn a_freed_scalar_returns_when_its_stream_completes_spec_4_3() {
    let h = unified();
    let dev = h.a.backend();
    let s = h.try_malloc(4, UsageFlags::SCALAR).unwrap();
    dev.enqueue_work(S0).unwrap();
    dev.hold_stream(S0).unwrap();
    h.free(s);
    assert_eq!(h.a.current_allocated_memory(), 16 * KIB);
    // Committed: it now waits for the default stream's work (audit #20).
    h.a.commit().unwrap();
    h.check();
    assert_eq!(h.a.current_allocated_memory(), 16 * KIB);
    dev.release_stream(S0).unwrap();
    h.a.free_inactive_buffers().unwrap();
    h.check();
    assert_eq!(h.a.current_allocated_memory(), 0);
    // Reused by the next scalar.
    assert_eq!(h.try_malloc(8, UsageFlags::SCALAR).unwrap(), s);
}

#[test]
fn scalar_buffers_with_a_value_need_host_visible_memory() {
    let h = unified();
    let e =
        h.a.alloc_scalar_buffer_with_value(&[1, 2, 3, 4])
            .unwrap_err();
    assert!(matches!(
        e,
        AllocError::Backend(BackendError::Unsupported { what, .. }) if what.contains("host-visible")
    ));
    h.check();
    assert_eq!(h.a.total_allocated_memory(), 0);
}

/// A simulated device with host-visible memory and a 256-byte buffer
/// alignment; it keeps what the host wrote.
struct HostVisible {
    sim: SimDevice,
    writes: Mutex<Vec<(DevicePtr, Vec<u8>)>>,
}

impl Backend for HostVisible {
    fn name(&self) -> &'static str {
        "host-visible sim"
    }
    fn allocate(&self, size: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.sim.allocate(size, stream)
    }
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        Backend::free(&self.sim, ptr, size)
    }
    fn mem_info(&self) -> Result<reservoir::MemInfo, BackendError> {
        self.sim.mem_info()
    }
    fn create_stream(&self) -> Result<StreamId, BackendError> {
        self.sim.create_stream()
    }
    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.sim.check_stream(stream)
    }
    fn record_event(&self, stream: StreamId) -> Result<reservoir::EventId, BackendError> {
        self.sim.record_event(stream)
    }
    fn query_event(&self, event: reservoir::EventId) -> Result<bool, BackendError> {
        self.sim.query_event(event)
    }
    fn synchronize_event(&self, event: reservoir::EventId) -> Result<(), BackendError> {
        self.sim.synchronize_event(event)
    }
    fn destroy_event(&self, event: reservoir::EventId) -> Result<(), BackendError> {
        self.sim.destroy_event(event)
    }
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        Backend::synchronize_stream(&self.sim, stream)
    }
    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.sim.synchronize_device()
    }
    fn heap_buffer_alignment(&self) -> u64 {
        256
    }
    fn as_host_write(&self) -> Option<&dyn HostWrite> {
        Some(self)
    }
}

impl HostWrite for HostVisible {
    fn write_host(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), BackendError> {
        self.writes.lock().unwrap().push((ptr, data.to_vec()));
        Ok(())
    }
}

#[test]
fn scalar_buffers_with_a_value_on_host_visible_memory_and_backend_alignment() {
    let dev = HostVisible {
        sim: sim(GIB),
        writes: Mutex::default(),
    };
    let h = H {
        a: HeapAllocator::new(dev, HeapSettings::new(true)).unwrap(),
    };
    let s =
        h.a.alloc_scalar_buffer_with_value(&7i64.to_le_bytes())
            .unwrap();
    h.check();
    assert!(h.a.is_shared_buffer(s));
    assert_eq!(
        *h.a.backend().writes.lock().unwrap(),
        [(s, 7i64.to_le_bytes().to_vec())]
    );
    assert_eq!(h.a.current_allocated_memory(), 256);
    let t = h.a.alloc_scalar_buffer_with_value(&[1]).unwrap();
    assert_eq!(t.0 - s.0, 256, "placed at the backend's alignment");
    // Any size goes to the scalar pool, as PyTorch's (audit #37).
    let u = h.a.alloc_scalar_buffer_with_value(&[9; 300]).unwrap();
    assert!(h.a.is_shared_buffer(u));
    assert_eq!(h.a.unaligned_buffer_size(u), Some(300));
    assert_eq!(h.a.current_allocated_memory(), 256 + 256 + 512);
    h.check();
    h.free(s);
    h.free(t);
    h.free(u);
    // A 1000-byte request is 1024 bytes at 256-byte alignment.
    let p = h.malloc(1000);
    let snap = h.a.snapshot();
    let block = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.address == Some(p.0))
        .unwrap();
    assert_eq!(block.size, 1024);
    h.free(p);
}

#[test]
fn bad_input_is_a_typed_error_that_changes_nothing() {
    let h = unified();
    let p = h.malloc(MIB);
    let before = (h.a.stats(), h.a.snapshot());
    let same = |h: &H| assert_eq!((h.a.stats(), h.a.snapshot()), before);
    assert!(matches!(
        h.try_malloc(0, UsageFlags::PRIVATE),
        Err(AllocError::InvalidArgument(_))
    ));
    same(&h);
    let e = h.try_malloc(u64::MAX, UsageFlags::PRIVATE).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "invalid argument: Invalid buffer size: {}",
            format_size(u64::MAX)
        )
    );
    let e = h.try_malloc(64 * GIB, UsageFlags::PRIVATE).unwrap_err();
    assert!(
        e.to_string().contains("Invalid buffer size: 64.00 GiB"),
        "{e}"
    );
    same(&h);
    assert!(matches!(
        h.a.free(DevicePtr(0x1234)),
        Err(AllocError::InvalidPointer { .. })
    ));
    same(&h);
    assert!(matches!(
        h.a.set_buffer_shape(DevicePtr(8), &[1]),
        Err(AllocError::InvalidPointer { .. })
    ));
    assert!(h.a.set_high_watermark_ratio(2.5).is_err());
    assert!(h.a.set_low_watermark_ratio(1.8).is_err());
    assert!(h.a.set_low_watermark_ratio(-0.1).is_err());
    assert_eq!(h.a.watermark_ratios(), (1.7, 1.4));
    same(&h);
    h.free(p);
    assert!(matches!(
        h.a.free(p),
        Err(AllocError::InvalidPointer { .. })
    ));
    h.check();
}

#[test]
fn the_impsallocator_surface() {
    let h = unified();
    assert_eq!(h.a.recommended_max_memory(), 64 * GIB);
    let shared = h.a.shared_allocator().unwrap();
    let private = h.a.private_allocator();
    assert_eq!(private.allocate(0).unwrap(), DevicePtr::NULL);
    private.delete(DevicePtr::NULL).unwrap();
    let p = private.allocate(3 * MIB).unwrap();
    let s = shared.allocate(3 * MIB).unwrap();
    assert_eq!(
        (
            h.a.buffer_id(p),
            h.a.buffer_id(s),
            h.a.buffer_id(DevicePtr(1))
        ),
        (1, 2, 0)
    );
    assert!(h.a.is_pinned_ptr(s) && !h.a.is_pinned_ptr(p));
    assert!(h.a.is_shared_storage_supported());
    assert_eq!(h.a.unaligned_buffer_size(DevicePtr(1)), None);
    h.a.set_buffer_shape(p, &[2, 3]).unwrap();
    assert_eq!(h.a.buffer_shape(p), [2, 3]);
    assert_eq!(h.a.current_allocated_memory(), 6 * MIB);
    assert_eq!(h.a.total_allocated_memory(), 64 * MIB);
    assert_eq!(h.a.driver_allocated_memory(), 64 * MIB);
    private.delete(p).unwrap();
    h.check();
    // The shape is cleared on free; the reused buffer keeps its id.
    assert_eq!(h.a.buffer_shape(p), Vec::<i64>::new());
    let again = private.allocate(3 * MIB).unwrap();
    assert_eq!((again, h.a.buffer_id(again)), (p, 1));
    shared.delete(s).unwrap();
    // Watermark getters and setters.
    assert_eq!(h.a.low_watermark_limit(), (1.4 * (64 * GIB) as f64) as u64);
    h.a.set_high_watermark_ratio(1.0).unwrap();
    h.a.set_low_watermark_ratio(0.5).unwrap();
    assert_eq!(h.a.high_watermark_limit(), 64 * GIB);
    assert_eq!(h.a.low_watermark_limit(), 32 * GIB);
    assert_eq!(h.a.low_watermark_value(), (32 * GIB / MIB - 64) as i64);
    h.a.set_low_watermark_ratio(0.0).unwrap();
    assert_eq!(h.a.low_watermark_value(), i64::MAX);
    // A discrete device has no shared allocator.
    assert!(discrete().a.shared_allocator().is_none());
    let st = h.a.stats();
    assert_eq!(st.segment.all().current, 2);
    assert_eq!(st.reserved_bytes.all().current, (64 * MIB) as i64);
}

#[test]
fn debug_output_speaks_pytorchs_words_spec_4_5() {
    for era in ERAS {
        debug_output_in(era);
    }
}

fn debug_output_in(era: SizeFormat) {
    let out: Arc<Mutex<Vec<String>>> = Arc::default();
    let h = heap(GIB, true, |s| {
        s.debug = DebugVerbosity::from_bits(15).unwrap();
        s.high_watermark_ratio = 0.0;
        s.low_watermark_ratio = 0.0;
        s.size_format = era;
    });
    tracing::subscriber::with_default(Collect(out.clone()), || {
        h.a.private_allocator();
        let p = h.malloc(MIB);
        h.free(p);
        let p = h.malloc(MIB);
        h.free(p);
        h.empty();
    });
    let msgs = out.lock().unwrap().clone();
    let starts = [
        "Initializing private heap allocator on unified device memory of size 1024.00 MiB",
        "Allocated private heap #1 of size 8.00 MiB (#heaps: 1, current allocated: 8.00 MiB)",
        "Allocated private buffer #1 of size 1024.00 KiB at 0x",
        "Reusing private buffer #1 of size 1024.00 KiB at 0x",
        "Attempting to release cached buffers (MPS allocated: 8.00 MiB, other allocations: 0 bytes)",
        "Releasing 1 buffers from small private pool (total size: 1024.00 KiB, #buffers: 1)",
        "Released buffer #1 of size 1024.00 KiB from heap #1 (heap size: 8.00 MiB, use#: 2, retain#: 1, gc#: 0)",
        "Released heap #1 of size 8.00 MiB (current allocated: 0 bytes, retain#: 1)",
    ]
    .map(|m| units(era, m));
    assert_eq!(msgs.len(), starts.len(), "{msgs:#?}");
    for (m, s) in msgs.iter().zip(&starts) {
        assert!(m.starts_with(s.as_str()), "{m:?} should start with {s:?}");
    }
    let end = units(
        era,
        "from heap #1 (requested: 1024.00 KiB, heap: 7.00 MiB, total: 8.00 MiB)",
    );
    assert!(msgs[2].ends_with(&end), "{}", msgs[2]);
    let end = units(era, "(requested: 1024.00 KiB, use#: 2, retain#: 1)");
    assert!(msgs[3].ends_with(&end), "{}", msgs[3]);
    // LARGE_ONLY hides small-pool buffer messages (not heap messages).
    h.a.set_debug_verbosity(DebugVerbosity::from_bits(2 | 16).unwrap());
    out.lock().unwrap().clear();
    tracing::subscriber::with_default(Collect(out.clone()), || {
        h.malloc(MIB);
    });
    let msgs = out.lock().unwrap().clone();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(msgs[0].starts_with(&units(era, "Allocated private heap #2 of size 8.00 MiB")));
    // PROFILING: the watermark limits when they are set.
    out.lock().unwrap().clear();
    tracing::subscriber::with_default(Collect(out.clone()), || {
        let mut s = HeapSettings::new(true);
        s.debug = DebugVerbosity::PROFILING;
        s.size_format = era;
        let a = HeapAllocator::new(sim(GIB), s).unwrap();
        a.set_high_watermark_ratio(0.0).unwrap();
    });
    assert_eq!(
        *out.lock().unwrap(),
        [
            units(era, "High watermark memory allocation limit: 1.70 GiB"),
            units(era, "Low watermark memory allocation limit: 1.40 GiB"),
            "High watermark memory allocation limit: unlimited".to_string(),
            // Dropped: ~MPSHeapAllocatorImpl empties the cache (audit #39).
            "Attempting to release cached buffers (MPS allocated: 0 bytes, other allocations: 0 bytes)"
                .to_string(),
        ]
    );
}

#[test]
fn watermark_settings_parse_and_check_spec_4_4() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let s = HeapSettings::from_lookup(true, env(&[])).unwrap();
    assert_eq!((s.high_watermark_ratio, s.low_watermark_ratio), (1.7, 1.4));
    let s = HeapSettings::from_lookup(false, env(&[])).unwrap();
    assert_eq!(s.low_watermark_ratio, 1.0);
    let s = HeapSettings::from_lookup(
        true,
        env(&[
            (ENV_HIGH_WATERMARK_RATIO, "0"),
            (ENV_LOW_WATERMARK_RATIO, "2.0"),
        ]),
    )
    .unwrap();
    assert_eq!((s.high_watermark_ratio, s.low_watermark_ratio), (0.0, 2.0));
    let e = HeapSettings::from_lookup(true, env(&[(ENV_HIGH_WATERMARK_RATIO, "2.1")])).unwrap_err();
    assert_eq!(e, HeapSettingsError::InvalidHighWatermark(2.1));
    assert_eq!(e.to_string(), "invalid high watermark ratio 2.1");
    let e = HeapSettings::from_lookup(
        true,
        env(&[
            (ENV_HIGH_WATERMARK_RATIO, "1.2"),
            (ENV_LOW_WATERMARK_RATIO, "1.3"),
        ]),
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "invalid low watermark ratio 1.3");
    // The default low ratio (1.4) is above a high ratio of 1.2.
    let e = HeapSettings::from_lookup(true, env(&[(ENV_HIGH_WATERMARK_RATIO, "1.2")])).unwrap_err();
    assert_eq!(e, HeapSettingsError::InvalidLowWatermark(1.4));
    // strtod: text that is not a number is 0.0 (audit #28; T12 has more).
    let s = HeapSettings::from_lookup(true, env(&[(ENV_LOW_WATERMARK_RATIO, "lots")])).unwrap();
    assert_eq!(s.low_watermark_ratio, 0.0);
    assert!(HeapSettings::from_lookup(true, env(&[(ENV_HIGH_WATERMARK_RATIO, "-1")])).is_err());
    // The debug bitmask: strtol with base 0.
    for (text, value) in [
        ("15", 15),
        ("0x1f", 31),
        ("010", 8),
        ("  +7", 7),
        ("-1", -1),
        ("12abc", 12),
        ("0x", 0),
        ("abc", 0),
        ("", 0),
        ("08", 0),
        ("99999999999999999999", i64::MAX),
    ] {
        assert_eq!(strtol_base0(text), value, "{text:?}");
    }
    let s = HeapSettings::from_lookup(true, env(&[(ENV_DEBUG, "0x12")])).unwrap();
    assert_eq!(
        s.debug,
        DebugVerbosity::ALLOCATIONS | DebugVerbosity::LARGE_ONLY
    );
    // The whole value is kept (uint32_t m_debug_verbosity; audit #29).
    let s = HeapSettings::from_lookup(true, env(&[(ENV_DEBUG, "-1")])).unwrap();
    assert_eq!(s.debug.bits(), u32::MAX);
    // A heap allocator refuses bad ratios.
    let mut bad = HeapSettings::new(true);
    bad.low_watermark_ratio = 1.9;
    assert!(matches!(
        HeapAllocator::new(sim(GIB), bad),
        Err(AllocError::InvalidArgument(_))
    ));
}

#[test]
fn watermark_settings_come_from_the_environment_spec_4_4() {
    // The only test touching these variables.
    std::env::set_var(ENV_HIGH_WATERMARK_RATIO, "1.5");
    std::env::set_var(ENV_LOW_WATERMARK_RATIO, "0.25");
    std::env::set_var(ENV_DEBUG, "8");
    let s = HeapSettings::from_env(false);
    std::env::remove_var(ENV_HIGH_WATERMARK_RATIO);
    std::env::remove_var(ENV_LOW_WATERMARK_RATIO);
    std::env::remove_var(ENV_DEBUG);
    let s = s.unwrap();
    assert_eq!((s.high_watermark_ratio, s.low_watermark_ratio), (1.5, 0.25));
    assert_eq!(s.debug, DebugVerbosity::RELEASES);
}

#[derive(Clone, Debug)]
enum Op {
    Malloc(u64, u8),
    Free(usize),
    Record(usize, bool),
    Release,
    Empty,
    Poll,
    Ratio(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop_oneof![1u64..64, 1u64..(2 * MIB), (2 * MIB)..(80 * MIB), (60 * MIB)..(300 * MIB)], 0u8..4)
            .prop_map(|(s, u)| Op::Malloc(s, u)),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, hold)| Op::Record(i, hold)),
        1 => Just(Op::Release),
        1 => Just(Op::Empty),
        1 => Just(Op::Poll),
        1 => (0u8..3).prop_map(Op::Ratio),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Spec 4.2-4.4 under random operations: every invariant holds after
    /// every operation, on both free paths and both memory kinds.
    #[test]
    fn random_operations_keep_every_invariant(
        ops in proptest::collection::vec(op(), 1..60),
        unified in any::<bool>(),
        waits in any::<bool>(),
    ) {
        let h = heap(GIB, unified, |s| {
            s.free_waits_for_events = waits;
            s.recommended_max_memory = Some(GIB / 2);
        });
        let dev = h.a.backend();
        let s1 = dev.create_stream().unwrap();
        let mut live: Vec<DevicePtr> = Vec::new();
        for op in ops {
            match op {
                Op::Malloc(size, u) => {
                    let usage = [UsageFlags::PRIVATE, UsageFlags::SHARED, UsageFlags::SCALAR, UsageFlags::PRIVATE][u as usize];
                    let size = if usage == UsageFlags::SCALAR { size.min(8) } else { size };
                    match h.a.malloc(size, usage) {
                        Ok(p) => live.push(p),
                        Err(AllocError::OutOfMemory(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let p = live.swap_remove(i % live.len());
                    h.a.free(p).unwrap();
                }
                Op::Record(i, hold) if !live.is_empty() => {
                    if hold {
                        dev.hold_stream(s1).unwrap();
                    }
                    dev.enqueue_work(s1).unwrap();
                    h.a.record_use(&[live[i % live.len()]], s1).unwrap();
                }
                Op::Release => dev.release_stream(s1).unwrap(),
                Op::Empty => h.a.empty_cache().unwrap(),
                Op::Poll => h.a.free_inactive_buffers().unwrap(),
                Op::Ratio(r) => {
                    let _ = h.a.set_low_watermark_ratio([0.0, 0.5, 1.0][r as usize]);
                }
                _ => {}
            }
            if let Err(e) = h.a.check_invariants() {
                panic!("after {op:?}: {e}");
            }
        }
        dev.release_stream(s1).unwrap();
        for p in live {
            h.a.free(p).unwrap();
        }
        h.a.empty_cache().unwrap();
        h.check();
        prop_assert_eq!(h.a.current_allocated_memory(), 0);
    }
}

#[test]
fn private_and_shared_allocators_place_in_their_pools() {
    // Spec 4.1: the private front end (usage PRIVATE) and the shared one
    // (usage SHARED, pinned memory), both over one heap allocator.
    let h = unified();
    let private = h.a.private_allocator();
    let shared = h.a.shared_allocator().unwrap();
    assert_eq!(
        (private.usage(), shared.usage()),
        (UsageFlags::PRIVATE, UsageFlags::SHARED)
    );
    let p = private.allocate(2 * MIB).unwrap();
    let s = shared.allocate(2 * MIB).unwrap();
    let ps = private.allocate(64 * KIB).unwrap();
    let ss = shared.allocate(64 * KIB).unwrap();
    h.check();
    assert!(!h.a.is_shared_buffer(p) && !h.a.is_shared_buffer(ps));
    assert!(h.a.is_shared_buffer(s) && h.a.is_shared_buffer(ss));
    assert!(h.a.is_pinned_ptr(ss) && !h.a.is_pinned_ptr(ps));
    // Four pools, four heaps: 32 MiB large ones, 8 MiB small ones.
    let mut sizes: Vec<u64> = h.heaps().iter().map(|k| k.0).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [8 * MIB, 8 * MIB, 32 * MIB, 32 * MIB]);
    // A freed shared buffer is not reused by the private front end.
    shared.delete(s).unwrap();
    let p2 = private.allocate(2 * MIB).unwrap();
    assert_ne!(p2, s);
    // isSharedBuffer answers for a cached buffer too (m_allocated_buffers).
    assert!(h.a.is_shared_buffer(s));
    for (a, x) in [(&private, p), (&private, ps), (&shared, ss), (&private, p2)] {
        a.delete(x).unwrap();
        h.check();
    }
}

#[test]
fn unaligned_size_shape_and_id_follow_the_buffer() {
    // MPSAllocator.mm getUnalignedBufferSize / getBufferShape / getBufferId:
    // the requested size of the buffer in use, even when it reuses a larger
    // cached one; the shape is forgotten on free.
    let h = unified();
    let p = h.malloc(3 * MIB + 5);
    assert_eq!(h.a.unaligned_buffer_size(p), Some(3 * MIB + 5));
    h.a.set_buffer_shape(p, &[3, MIB as i64]).unwrap();
    assert_eq!(h.a.buffer_shape(p), [3, MIB as i64]);
    let id = h.a.buffer_id(p);
    assert!(id > 0);
    h.free(p);
    // A cached buffer keeps its requested size (PyTorch looks it up in
    // m_allocated_buffers, which holds cached buffers); its shape is gone.
    assert_eq!(h.a.unaligned_buffer_size(p), Some(3 * MIB + 5));
    assert!(h.a.buffer_shape(p).is_empty());
    // Reuse of the same whole buffer (spec 4.2 step 5): a new requested
    // size, the same id.
    let q = h.malloc(2 * MIB);
    assert_eq!(q, p);
    assert_eq!(h.a.unaligned_buffer_size(q), Some(2 * MIB));
    assert_eq!(h.a.buffer_id(q), id);
    assert!(h.a.buffer_shape(q).is_empty());
    h.free(q);
}

#[test]
fn shared_buffer_pointers_on_the_simulated_device() {
    // getSharedBufferPtr: {host pointer, retain count} of a shared buffer.
    // The simulated device models unified memory (host address = device
    // address).
    let h = unified();
    let s = h.try_malloc(3 * MIB, UsageFlags::SHARED).unwrap();
    let p = h.malloc(3 * MIB);
    assert_eq!(h.a.shared_buffer_ptr(s).unwrap(), (s.0, 1));
    // Work recorded for the buffer raises its retain count.
    let dev = h.a.backend();
    let s1 = dev.create_stream().unwrap();
    dev.hold_stream(s1).unwrap();
    dev.enqueue_work(s1).unwrap();
    assert!(h.a.record_events(&[s], s1).unwrap());
    assert_eq!(h.a.shared_buffer_ptr(s).unwrap(), (s.0, 2));
    dev.release_stream(s1).unwrap();
    assert_eq!(h.a.shared_buffer_ptr(s).unwrap(), (s.0, 1));
    // PyTorch's {nullptr, 0} cases are typed errors that change nothing.
    let before = (h.a.stats(), h.a.snapshot());
    let e = h.a.shared_buffer_ptr(p).unwrap_err();
    assert!(
        matches!(&e, AllocError::InvalidArgument(m) if m.contains("large private pool")),
        "{e}"
    );
    assert!(matches!(
        h.a.shared_buffer_ptr(DevicePtr(0x1234)),
        Err(AllocError::InvalidPointer { .. })
    ));
    assert_eq!(before, (h.a.stats(), h.a.snapshot()));
    // A cached buffer still answers (PyTorch's allocated-buffers map holds
    // cached buffers too); a released one does not.
    h.free(s);
    assert_eq!(h.a.shared_buffer_ptr(s).unwrap(), (s.0, 1));
    h.free(p);
    h.empty();
    assert!(matches!(
        h.a.shared_buffer_ptr(s),
        Err(AllocError::InvalidPointer { .. })
    ));
    // A backend without the host-mapping capability (it can only write).
    let no_mapping = HostVisible {
        sim: sim(GIB),
        writes: Mutex::default(),
    };
    let a = HeapAllocator::new(no_mapping, HeapSettings::new(true)).unwrap();
    let s = a.malloc(64, UsageFlags::SHARED).unwrap();
    assert!(matches!(
        a.shared_buffer_ptr(s),
        Err(AllocError::Backend(BackendError::Unsupported { .. }))
    ));
    a.check_invariants().unwrap();
}

#[test]
fn stats_resets_keep_current_values() {
    // DeviceAllocator::resetAccumulatedStats / resetPeakStats.
    let h = unified();
    let a = h.malloc(3 * MIB);
    let b = h.malloc(20 * MIB);
    h.free(b);
    let st = h.a.stats();
    assert_eq!(st.num_device_alloc, 1);
    assert_eq!(st.allocated_bytes.all().peak, (23 * MIB) as i64);
    h.a.reset_accumulated_stats();
    h.a.reset_peak_stats();
    h.check();
    let st = h.a.stats();
    assert_eq!(st.num_device_alloc, 0);
    assert_eq!(st.allocation.all().allocated, 0);
    assert_eq!(st.allocated_bytes.all().current, (3 * MIB) as i64);
    assert_eq!(st.allocated_bytes.all().peak, (3 * MIB) as i64);
    assert_eq!(st.segment.all().current, 1);
    h.free(a);
}

#[test]
fn the_history_records_buffers_and_heaps() {
    // The snapshot's device_traces (spec 2.4's actions) for the heap
    // allocator: buffers as blocks, heaps as segments.
    use reservoir::observe::trace::TraceAction as A;
    let h = heap(128 * MIB, true, |_| {});
    h.a.record_history(Some(100));
    let p = h.malloc(3 * MIB + 1);
    h.free(p);
    // 100 MiB wants a 1 GiB heap (spec 4.2 step 7) the device cannot give.
    assert!(matches!(
        h.try_malloc(100 * MIB, UsageFlags::PRIVATE),
        Err(AllocError::OutOfMemory(_))
    ));
    h.empty();
    let snap = h.a.snapshot();
    let got: Vec<(A, u64, u64)> = snap.device_traces[0]
        .iter()
        .map(|e| (e.action, e.addr, e.size))
        .collect();
    let heap_base = got[0].1;
    assert_eq!(
        got[..4],
        [
            (A::SegmentAlloc, heap_base, 32 * MIB),
            (A::Alloc, p.0, 3 * MIB + 1),
            (A::FreeRequested, p.0, 3 * MIB + 1),
            (A::FreeCompleted, p.0, 3 * MIB + 1),
        ]
    );
    // The failed request: the failure chain released the cached heap,
    // then the OOM entry (the device's free bytes, the aligned size).
    assert_eq!(got[4], (A::SegmentFree, heap_base, 32 * MIB));
    assert_eq!(got[5], (A::Oom, 128 * MIB, 100 * MIB));
    assert_eq!(got.len(), 6);
    assert!(snap.device_traces[0].iter().all(|e| e.time_us.is_some()));
    // A ring of 2 keeps the newest; None stops and forgets.
    h.a.record_history(Some(2));
    let q = h.malloc(MIB);
    assert_eq!(h.a.snapshot().device_traces[0].len(), 2);
    h.a.record_history(None);
    h.free(q);
    assert!(h.a.snapshot().device_traces.is_empty());
}

// ---------------------------------------------------------------------------
// The audit's tests (`../shared/spec/mps-audit.md`, section 2): the seed's
// 2.7-era `MPSAllocator.mm` (pytorch/pytorch 57ba412), Metal's alignment
// taken as the simulated device's 16 KiB. Where the audit's sketch used
// `record_events` on a private buffer to make it busy, `record_use` does it
// (PyTorch records no event on a private buffer, audit #31).
// ---------------------------------------------------------------------------

/// The T1 scenario: a busy 200 MiB buffer and an idle 250 MiB one, both
/// cached, the device 0.5 MiB under the low limit, then 150 MiB asked for.
fn failure_chain_scenario(log: bool) -> (H, Option<Arc<Mutex<Vec<EventType>>>>) {
    // discrete; low limit 0.5 × 1001 MiB = 500.5 MiB; device 600 MiB.
    let h = heap(600 * MIB, false, |s| {
        s.recommended_max_memory = Some(1001 * MIB);
        s.low_watermark_ratio = 0.5;
        s.high_watermark_ratio = 0.0;
    });
    let dev = h.a.backend();
    let p1 = h.malloc(200 * MIB); // a single-buffer heap of 200 MiB
    let p2 = h.malloc(250 * MIB); // a single-buffer heap of 250 MiB
    dev.allocate(50 * MIB, S0).unwrap(); // "other": the device at 500 MiB
    let s1 = dev.create_stream().unwrap();
    dev.hold_stream(s1).unwrap();
    h.a.record_use(&[p1], s1).unwrap(); // p1's retain count 2
    h.free(p1);
    h.free(p2);
    // Pressure, yet garbage collection returns at once (500 < 500.5 MiB).
    assert_eq!(h.a.low_watermark_value(), 0);
    let seen = log.then(|| h.log());
    let _q = h.malloc(150 * MIB);
    dev.release_stream(s1).unwrap();
    h.a.free_inactive_buffers().unwrap();
    h.check();
    (h, seen)
}

/// audit #15, T1: `trigger_memory_callbacks` always returns true, so the
/// second `get_free_buffer` runs without any callback registered: it
/// releases the idle oversize buffer *keeping* its heap, and the request
/// lands in that heap (before the fix: 150 MiB in a third heap).
#[test]
fn audit_t1_failure_chain_retries_get_free_buffer_without_callbacks() {
    let (h, _) = failure_chain_scenario(false);
    // Pass 1 released busy p1 with its heap; GC returned; alloc_buffer
    // failed (100 MiB free); pass 2 released idle oversize p2 keeping its
    // heap; release_available_cached_buffers: pool empty; the full flush;
    // alloc_buffer into p2's heap.
    assert_eq!(h.a.total_allocated_memory(), 250 * MIB);
    assert_eq!(h.heaps(), vec![(250 * MIB, SegmentKind("large".into()))]);
    assert_eq!(h.a.stats().num_device_alloc, 2); // no third heap
    assert_eq!(h.a.stats().num_alloc_retries, 1);
}

/// audit #15, T1b: the same with a callback registered (passed before the
/// fix too: the second pass then ran): `AllocationFailed` fires once, with
/// the lock released, before the second pass.
#[test]
fn audit_t1b_failure_chain_with_a_callback_registered() {
    let (h, log) = failure_chain_scenario(true);
    assert_eq!(h.a.total_allocated_memory(), 250 * MIB);
    assert_eq!(h.heaps(), vec![(250 * MIB, SegmentKind("large".into()))]);
    assert_eq!(h.a.stats().num_device_alloc, 2);
    assert_eq!(
        *log.unwrap().lock().unwrap(),
        [
            EventType::Released, // p1 (busy, under pressure), with its heap
            EventType::AllocationFailed,
            EventType::Released, // p2 (idle oversize), heap kept
            EventType::Allocated
        ]
    );
}

/// audit #18, T2: `format_size` by era. The default is the seed's: c10's
/// (KiB/MiB/GiB from a double); `SizeFormat::Mps26` is PyTorch 2.0-2.6's
/// own (KB/MB/GB from a float), digits included.
#[test]
fn audit_t2_format_size_by_era() {
    // PyTorch <= 2.6:
    assert_eq!(format_size_2_6(1536), "1.50 KB");
    assert_eq!(format_size_2_6(MIB), "1024.00 KB");
    assert_eq!(format_size_2_6(GIB), "1024.00 MB");
    assert_eq!(format_size_2_6(524_293_232), "500.01 MB"); // f32 rounding
    assert_eq!(format_size_2_6(17_185_237_894), "16.00 GB"); // f32 rounding
                                                             // The seed (2.7 era), c10's format_size:
    assert_eq!(format_size(0), "0 bytes");
    assert_eq!(format_size(1024), "1024 bytes");
    assert_eq!(format_size(1025), "1.00 KiB");
    assert_eq!(format_size(1536), "1.50 KiB");
    assert_eq!(format_size(MIB), "1024.00 KiB");
    assert_eq!(format_size(MIB + 1), "1.00 MiB");
    assert_eq!(format_size(GIB), "1024.00 MiB");
    assert_eq!(format_size(GIB + 1), "1.00 GiB");
    assert_eq!(format_size(524_293_232), "500.00 MiB");
    assert_eq!(format_size(17_185_237_894), "16.01 GiB");
    assert_eq!(
        format_size(524_293_232),
        reservoir::format::format_size(524_293_232)
    );
    // The allocator's own formatSize follows its setting.
    assert_eq!(unified().a.format_size(524_293_232), "500.00 MiB");
    let old = heap(64 * GIB, true, |s| s.size_format = SizeFormat::Mps26);
    assert_eq!(old.a.format_size(524_293_232), "500.01 MB");
    assert_eq!(SizeFormat::default(), SizeFormat::C10);
    assert_eq!(HeapSettings::new(true).size_format, SizeFormat::C10);
}

/// audit #8, #13, #14, #17, #22, #25, #26, T3: the high watermark blocks
/// even the reuse of a cached buffer; garbage collection keeps the split
/// heap; `emptyCache` cannot release a heap that holds no buffer.
#[test]
fn audit_t3_high_watermark_gc_and_empty_cache_keep_the_empty_split_heap() {
    let h = heap(64 * GIB, true, |s| {
        s.recommended_max_memory = Some(GIB);
        s.high_watermark_ratio = 1.2; // limit 1 288 490 188 B
        s.low_watermark_ratio = 0.5; // 512 MiB
    });
    let a = h.malloc(400 * MIB); // an extra-large 1 GiB heap (no pressure yet)
    assert_eq!(h.a.total_allocated_memory(), GIB);
    h.free(a);
    let e = h.try_malloc(300 * MIB, UsageFlags::PRIVATE).unwrap_err();
    // get_free_buffer refuses (1024 + 300 > 1228.8 MiB, no aging);
    // pressure and 300 < 400 → GC: target 512 MiB, a released, the split
    // heap kept; every alloc_buffer refuses → out of memory.
    assert_eq!(
        e.to_string(),
        "MPS backend out of memory (MPS allocated: 1024.00 MiB, other allocations: 0 bytes, \
         max allowed: 1.20 GiB). Tried to allocate 300.00 MiB on private pool. Use \
         PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations \
         (may cause system failure)."
    );
    assert_eq!(h.a.buffer_id(a), 0);
    assert_eq!(h.a.total_allocated_memory(), GIB); // the empty heap stays
    h.empty();
    assert_eq!(h.a.total_allocated_memory(), GIB); // emptyCache never visits it
    h.a.set_high_watermark_ratio(0.0).unwrap();
    let b = h.malloc(300 * MIB); // lands in the empty extra-large heap
    assert_eq!(
        (h.a.total_allocated_memory(), h.a.stats().num_device_alloc),
        (GIB, 1)
    );
    h.free(b);
    h.empty();
    assert_eq!(h.a.total_allocated_memory(), 0);
}

/// audit #9, #26, T4: the GC victim is chosen by the mean `gc_count`, in
/// (size, address) order, and GC stops at its target.
#[test]
fn audit_t4_gc_victims_are_chosen_by_mean_age_not_size() {
    let h = heap(64 * GIB, false, |s| {
        s.recommended_max_memory = Some(GIB);
        s.low_watermark_ratio = 0.5;
        s.high_watermark_ratio = 0.0;
    });
    let a = h.malloc(68 * MIB);
    let b = h.malloc(64 * MIB);
    let c = h.malloc(66 * MIB); // all single-buffer heaps (>= 64 MiB, discrete)
    h.free(a); // a.gc 0
    let x = h.malloc(70 * MIB); // aging a=1; a new 70 MiB heap
    h.free(x);
    let y = h.malloc(70 * MIB); // aging a=2, x=1; reuses x (x.gc = 0)
    assert_eq!(y, x);
    h.free(y);
    h.free(b);
    h.free(c); // a=2, x=0, b=0, c=0
    let _z = h.malloc(300 * MIB); // aging a=3, x=b=c=1; the device at 568 MiB
    let log = h.log();
    let _w = h.malloc(100 * MIB); // pressure; aging a=4, x=b=c=2; target 56, mean 2.5
                                  // (size) order: b(64, 2) skipped, c(66, 2) skipped, a(68, 4) released
                                  // with its heap; 68 >= 56: stop.
    assert_eq!(
        *log.lock().unwrap(),
        [EventType::Released, EventType::Allocated]
    );
    let mut sizes: Vec<u64> = h.heaps().iter().map(|k| k.0 / MIB).collect();
    sizes.sort();
    assert_eq!(sizes, [64, 66, 70, 100, 300]); // a's 68 MiB heap is gone
    for p in [b, c, x] {
        assert_ne!(h.a.buffer_id(p), 0); // still cached
    }
    assert_eq!(h.a.buffer_id(a), 0);
    assert_eq!(
        h.a.total_allocated_memory(),
        (64 + 66 + 70 + 300 + 100) * MIB
    );
}

/// audit #11, #14, T5: releasing an idle oversize buffer (its heap kept)
/// clears the memory pressure, so garbage collection does not run.
#[test]
fn audit_t5_an_idle_oversize_release_clears_pressure_and_skips_gc() {
    let h = heap(64 * GIB, false, |s| {
        s.recommended_max_memory = Some(GIB);
        s.low_watermark_ratio = 0.25;
        s.high_watermark_ratio = 0.0;
    });
    let a = h.malloc(200 * MIB);
    let b = h.malloc(100 * MIB); // the device at 300 > 256 MiB
    h.free(a);
    h.free(b);
    let log = h.log();
    let q = h.malloc(50 * MIB); // b (100) > 50 + 32: oversize; no heap fits; b idle
    assert_eq!(q, b); // Reservoir's first fit (on Metal: only "the same heap")
    assert_eq!(
        *log.lock().unwrap(),
        [EventType::Released, EventType::Allocated]
    );
    assert_ne!(h.a.buffer_id(a), 0); // GC did not run (it would have released a)
    assert_eq!(h.a.total_allocated_memory(), 300 * MIB);
}

/// audit #10, T6: small-pool best fit by size, and whole reuse of a buffer
/// up to 32 MiB larger than the request.
#[test]
fn audit_t6_small_pool_best_fit_and_whole_reuse() {
    let h = unified();
    let p1 = h.malloc(MIB);
    let p2 = h.malloc(64 * KIB);
    h.free(p1);
    h.free(p2);
    let q = h.malloc(20_000); // 32 KiB aligned → best fit p2
    assert_eq!((q, h.a.unaligned_buffer_size(q)), (p2, Some(20_000)));
    let r = h.malloc(70 * KIB); // 80 KiB → p1 (1 MiB <= 80 KiB + 32 MiB)
    assert_eq!(r, p1);
    assert_eq!(h.a.current_allocated_memory(), MIB + 64 * KIB);
    assert_eq!(h.a.total_allocated_memory(), SMALL_HEAP);
}

/// audit #4, #34, T7: the pool at the 8/9-byte and 1 MiB edges.
#[test]
fn audit_t7_pool_choice_at_the_edges() {
    let h = unified();
    let t8 = h.malloc(8);
    let t9 = h.malloc(9);
    let s = h.try_malloc(4, UsageFlags::SCALAR).unwrap();
    assert!(h.a.is_shared_buffer(t8) && h.a.is_pinned_ptr(t8)); // the <= 8 B quirk
    assert!(!h.a.is_shared_buffer(t9));
    assert!(h.a.is_shared_buffer(s));
    assert_eq!(h.a.total_allocated_memory(), 3 * SMALL_HEAP); // shared small, private small, scalar
    let _m = h.malloc(MIB); // still private small (the same 8 MiB heap)
    let _l = h.malloc(MIB + 1); // large: a new 32 MiB heap
    assert_eq!(h.a.total_allocated_memory(), 3 * SMALL_HEAP + LARGE_HEAP);
    let d = discrete();
    let p = d.malloc(8);
    assert!(!d.a.is_shared_buffer(p));
    assert!(d.a.shared_allocator().is_none());
}

/// audit #5, #7, T8: heap tiers under memory pressure and without.
#[test]
fn audit_t8_heap_tiers_under_pressure_and_without() {
    let new_heap = |unified: bool, pressure: bool, size: u64| -> u64 {
        let h = heap(64 * GIB, unified, |s| {
            s.recommended_max_memory = Some(GIB);
            s.low_watermark_ratio = 0.5;
        });
        let base = if pressure {
            h.malloc(600 * MIB); // a single heap; the device over 512 MiB
            600 * MIB
        } else {
            0
        };
        assert_eq!(h.a.total_allocated_memory(), base);
        h.malloc(size);
        h.a.total_allocated_memory() - base
    };
    for (unified, size, expected) in [
        (true, MIB, 8 * MIB),
        (true, MIB + 1, 32 * MIB),
        (true, 10 * MIB, 10 * MIB),
        (true, 511 * MIB, 512 * MIB),
        (true, 100 * MIB + 5, 102 * MIB),
    ] {
        assert_eq!(
            new_heap(unified, true, size),
            expected,
            "under pressure: {size}"
        );
    }
    for (unified, size, expected) in [
        (true, 10 * MIB, GIB),
        (false, 63 * MIB, 128 * MIB),
        (false, 64 * MIB, 64 * MIB),
    ] {
        assert_eq!(new_heap(unified, false, size), expected, "{size}");
    }
}

/// audit #19, T9: the default free path is the seed's 2.x `free()`: a
/// buffer with recorded work goes back at once and the next request of
/// its size reuses it (the retain count is not checked for a fit). The
/// later redesign's pending set is the `free_waits_for_events` setting.
#[test]
fn audit_t9_the_default_free_path_returns_buffers_at_once() {
    let h = unified();
    assert!(!HeapSettings::new(true).free_waits_for_events);
    let dev = h.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = h.try_malloc(4 * MIB, UsageFlags::SHARED).unwrap(); // shared large, 32 MiB heap
    dev.hold_stream(s1).unwrap();
    assert!(h.a.record_events(&[p], s1).unwrap());
    h.free(p);
    assert_eq!(h.a.current_allocated_memory(), 0);
    assert_eq!(h.try_malloc(4 * MIB, UsageFlags::SHARED).unwrap(), p);
    dev.release_stream(s1).unwrap();

    // The named setting of the later redesign: pending until the work ends.
    let h = heap(64 * GIB, true, |s| s.free_waits_for_events = true);
    let dev = h.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = h.try_malloc(4 * MIB, UsageFlags::SHARED).unwrap();
    dev.hold_stream(s1).unwrap();
    assert!(h.a.record_events(&[p], s1).unwrap());
    h.free(p);
    assert_eq!(h.a.current_allocated_memory(), 4 * MIB);
    assert_ne!(h.try_malloc(4 * MIB, UsageFlags::SHARED).unwrap(), p);
    dev.release_stream(s1).unwrap();
    h.a.free_inactive_buffers().unwrap();
    h.check();
    assert_eq!(h.a.current_allocated_memory(), 4 * MIB);
}

/// audit #31, #32, T10: `recordEvents` records only for shared buffers (in
/// use or cached) and is true if any was recorded; `waitForEvents` is true
/// only when it waited.
#[test]
fn audit_t10_record_and_wait_return_values() {
    let h = unified();
    let s1 = h.a.backend().create_stream().unwrap();
    let sp = h.try_malloc(MIB, UsageFlags::SHARED).unwrap();
    let pp = h.malloc(2 * MIB); // private large
    assert!(!h.a.record_events(&[pp], s1).unwrap()); // private: no event
    assert!(h.a.record_events(&[sp, DevicePtr(0x10)], s1).unwrap()); // any recorded
    h.free(sp);
    assert!(h.a.record_events(&[sp], s1).unwrap()); // a cached shared buffer is found
    h.check();
    assert!(!h.a.wait_for_events(&[pp]).unwrap()); // private: nothing waited
    assert!(!h.a.wait_for_events(&[sp]).unwrap()); // its work is done: nothing to wait for
    assert!(!h.a.wait_for_events(&[DevicePtr(0x10)]).unwrap());
}

/// audit #20, T11: a freed scalar waits for its completion handler on the
/// default stream's current (uncommitted) command buffer.
#[test]
fn audit_t11_a_freed_scalar_waits_for_the_next_commit() {
    let h = unified();
    let s = h.try_malloc(4, UsageFlags::SCALAR).unwrap();
    h.free(s); // the handler sits on the current command buffer
    assert_eq!(h.a.current_allocated_memory(), 16 * KIB);
    h.a.free_inactive_buffers().unwrap(); // not committed: still waiting
    assert_eq!(h.a.current_allocated_memory(), 16 * KIB);
    let t = h.try_malloc(4, UsageFlags::SCALAR).unwrap();
    assert_ne!(t, s);
    h.empty(); // COMMIT_AND_WAIT → s returned, then released; t keeps the heap
    assert_eq!(
        (h.a.current_allocated_memory(), h.a.total_allocated_memory()),
        (16 * KIB, SMALL_HEAP)
    );
    // commit() alone: the scalar comes back and is reused.
    h.free(t);
    h.a.commit().unwrap();
    h.check();
    assert_eq!(h.a.current_allocated_memory(), 0);
    assert_eq!(h.try_malloc(8, UsageFlags::SCALAR).unwrap(), t);
}

/// audit #28, #29, T12: the environment read as `strtod` / `strtol` read it.
#[test]
fn audit_t12_environment_parsing_like_strtod_and_strtol() {
    let env = |pairs: Vec<(&'static str, &'static str)>| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let high =
        |v: &'static str| HeapSettings::from_lookup(true, env(vec![(ENV_HIGH_WATERMARK_RATIO, v)]));
    for (text, ratio) in [
        ("abc", 0.0),
        ("", 0.0),
        ("1.5x", 1.5),
        ("0x1.8p0", 1.5),
        (" 1.6", 1.6),
    ] {
        let s = high(text).unwrap();
        assert_eq!(s.high_watermark_ratio, ratio, "{text:?}");
    }
    // "abc" switches the limit off.
    let a = HeapAllocator::new(sim(GIB), high("abc").unwrap()).unwrap();
    assert_eq!(a.high_watermark_limit(), u64::MAX);
    assert_eq!(
        high("nan").unwrap_err().to_string(),
        "invalid high watermark ratio nan"
    );
    assert_eq!(
        high("2.5").unwrap_err().to_string(),
        "invalid high watermark ratio 2.5"
    );
    let e =
        HeapSettings::from_lookup(true, env(vec![(ENV_LOW_WATERMARK_RATIO, "1.8")])).unwrap_err();
    assert_eq!(e.to_string(), "invalid low watermark ratio 1.8");
    let s = HeapSettings::from_lookup(
        true,
        env(vec![
            (ENV_HIGH_WATERMARK_RATIO, "0"),
            (ENV_LOW_WATERMARK_RATIO, "1.9"),
        ]),
    )
    .unwrap();
    assert_eq!((s.high_watermark_ratio, s.low_watermark_ratio), (0.0, 1.9));
    let s = HeapSettings::from_lookup(true, env(vec![(ENV_DEBUG, "0x12")])).unwrap();
    assert_eq!(
        s.debug,
        DebugVerbosity::ALLOCATIONS | DebugVerbosity::LARGE_ONLY
    );
    // DEBUG=16 or 32: "Initializing ..." and "Attempting to release ..."
    // print (PyTorch tests the whole value for non-zero), nothing else.
    for v in ["16", "32"] {
        let s = HeapSettings::from_lookup(true, env(vec![(ENV_DEBUG, v)])).unwrap();
        let out: Arc<Mutex<Vec<String>>> = Arc::default();
        tracing::subscriber::with_default(Collect(out.clone()), || {
            let a = HeapAllocator::new(sim(GIB), s).unwrap();
            a.private_allocator();
            let p = a.malloc(MIB, UsageFlags::PRIVATE).unwrap();
            a.free(p).unwrap();
            a.empty_cache().unwrap();
            // Dropping empties the cache again (one more "Attempting").
        });
        assert_eq!(
            *out.lock().unwrap(),
            [
                "Initializing private heap allocator on unified device memory of size 1024.00 MiB",
                "Attempting to release cached buffers (MPS allocated: 8.00 MiB, other allocations: 0 bytes)",
                "Attempting to release cached buffers (MPS allocated: 0 bytes, other allocations: 0 bytes)",
            ],
            "DEBUG={v}"
        );
    }
}

/// audit #5, #11, #12, #25, T13: one extra-large heap shared by four
/// buffers; the idle-oversize branch inside a split heap.
#[test]
fn audit_t13_the_idle_oversize_branch_inside_a_split_heap() {
    let h = unified();
    let ps: Vec<_> = (0..4).map(|_| h.malloc(256 * MIB)).collect(); // one full 1 GiB heap
    assert_eq!(h.a.total_allocated_memory(), GIB);
    for &p in &ps {
        h.free(p);
    }
    let q = h.malloc(10 * MIB); // a 256 (> 42) oversize; heap full; idle → one released, heap kept
    assert_eq!(h.a.total_allocated_memory(), GIB);
    assert_eq!(h.heaps().len(), 1);
    // Three 256 MiB buffers still cached; q sits where the released one was.
    assert_eq!(
        ps.iter()
            .filter(|&&p| h.a.unaligned_buffer_size(p) == Some(256 * MIB))
            .count(),
        3
    );
    assert_eq!(q, ps[0]);
    assert_eq!(h.a.current_allocated_memory(), 10 * MIB);
    h.free(q);
    h.empty();
    assert_eq!(h.a.total_allocated_memory(), 0);
}

/// audit #16, #23, T14: `release_available_cached_buffers` releases a busy
/// buffer too, its heap held on the device until the work ends.
#[test]
fn audit_t14_release_available_cached_buffers_takes_a_busy_buffer_as_a_zombie() {
    let h = heap(GIB, false, |s| {
        s.high_watermark_ratio = 0.0;
        s.low_watermark_ratio = 0.0;
    });
    let dev = h.a.backend();
    let a = h.malloc(300 * MIB);
    let b = h.malloc(300 * MIB); // two single-buffer heaps, the device at 600 MiB
    let s1 = dev.create_stream().unwrap();
    dev.hold_stream(s1).unwrap();
    h.a.record_use(&[a], s1).unwrap(); // a's retain count 2
    h.free(a);
    h.free(b);
    let _c = h.malloc(500 * MIB);
    // alloc_buffer fails (424 MiB free); get_free_buffer finds nothing of
    // 500; release_available_cached_buffers releases both 300s from the
    // largest down (a's heap leaves the allocator, its memory held); 600 >=
    // 500; alloc_buffer: 1024 - 300 held >= 500 → a new 500 MiB heap.
    assert_eq!(h.a.total_allocated_memory(), 500 * MIB);
    assert_eq!(h.a.driver_allocated_memory(), 800 * MIB); // the zombie heap
    assert_eq!(h.a.buffer_id(a), 0);
    assert_eq!(h.a.stats().num_alloc_retries, 0); // the full flush not reached
    dev.release_stream(s1).unwrap();
    h.a.free_inactive_buffers().unwrap();
    h.check();
    assert_eq!(h.a.driver_allocated_memory(), 500 * MIB);
}

/// audit #36: by default only `AllocationFailed` fires, as in PyTorch 2.x;
/// the other four events are the `all_callback_events` extension.
#[test]
fn audit_36_only_allocation_failed_fires_by_default() {
    assert_eq!(callback_events(H::log_only), [EventType::AllocationFailed]);
}

/// audit #39: dropping the allocator empties its cache (`~MPSHeapAllocatorImpl`),
/// buffers still in use keeping their heaps; a failing backend is logged,
/// not raised.
#[test]
fn audit_39_drop_empties_the_cache() {
    let dev = Arc::new(sim(GIB));
    let a = HeapAllocator::new(dev.clone(), HeapSettings::new(true)).unwrap();
    let p = a.malloc(3 * MIB, UsageFlags::PRIVATE).unwrap();
    let _kept = a.malloc(MIB, UsageFlags::PRIVATE).unwrap();
    a.free(p).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, GIB - 32 * MIB - SMALL_HEAP);
    drop(a);
    // The cached 3 MiB buffer and its 32 MiB heap went back; the small heap
    // of the buffer still in use stays.
    assert_eq!(dev.mem_info().unwrap().free, GIB - SMALL_HEAP);

    // A backend that fails to synchronise: the drop logs and goes on.
    let out: Arc<Mutex<Vec<String>>> = Arc::default();
    let a = HeapAllocator::new(FailingSync(sim(GIB)), HeapSettings::new(true)).unwrap();
    let p = a.malloc(MIB, UsageFlags::PRIVATE).unwrap();
    a.free(p).unwrap();
    tracing::subscriber::with_default(Collect(out.clone()), || drop(a));
    let msgs = out.lock().unwrap().clone();
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].starts_with("the heap allocator could not empty its cache when dropped"),
        "{msgs:?}"
    );
}

/// A simulated device whose stream synchronisation fails.
struct FailingSync(SimDevice);

impl Backend for FailingSync {
    fn name(&self) -> &'static str {
        "failing sync"
    }
    fn allocate(&self, size: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.0.allocate(size, stream)
    }
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        Backend::free(&self.0, ptr, size)
    }
    fn mem_info(&self) -> Result<reservoir::MemInfo, BackendError> {
        self.0.mem_info()
    }
    fn create_stream(&self) -> Result<StreamId, BackendError> {
        self.0.create_stream()
    }
    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.0.check_stream(stream)
    }
    fn record_event(&self, stream: StreamId) -> Result<reservoir::EventId, BackendError> {
        self.0.record_event(stream)
    }
    fn query_event(&self, event: reservoir::EventId) -> Result<bool, BackendError> {
        self.0.query_event(event)
    }
    fn synchronize_event(&self, event: reservoir::EventId) -> Result<(), BackendError> {
        self.0.synchronize_event(event)
    }
    fn destroy_event(&self, event: reservoir::EventId) -> Result<(), BackendError> {
        self.0.destroy_event(event)
    }
    fn synchronize_stream(&self, _stream: StreamId) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: "failing sync",
            what: "synchronisation",
        })
    }
    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.0.synchronize_device()
    }
}

/// audit #37: `allocScalarBufferWithValue` takes any size into the scalar
/// pool (PyTorch's), here on a backend the host can write.
#[test]
fn audit_37_scalar_buffers_with_a_value_of_any_size() {
    let dev = HostVisible {
        sim: sim(GIB),
        writes: Mutex::default(),
    };
    let h = H {
        a: HeapAllocator::new(dev, HeapSettings::new(true)).unwrap(),
    };
    let big =
        h.a.alloc_scalar_buffer_with_value(&vec![7; 2 << 20])
            .unwrap();
    h.check();
    assert!(h.a.is_shared_buffer(big));
    // A 2 MiB scalar: the scalar pool, a 32 MiB heap (createHeapBlock's tiers).
    assert_eq!(h.a.total_allocated_memory(), LARGE_HEAP);
    h.free(big);
    h.empty();
    assert_eq!(h.a.total_allocated_memory(), 0);
}
