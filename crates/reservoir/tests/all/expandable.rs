//! Expandable segments (spec 1.11 and checklist 6.8).

use reservoir::observe::snapshot::BlockState;
use reservoir::{AllocatorConfig, DevicePtr, StatType};

use crate::common::*;

fn expandable(capacity: u64) -> Checked {
    Checked::new("expandable_segments:True", capacity)
}

#[test]
fn pages_are_2mib_small_and_20mib_large() {
    // spec 1.11 / 6.8: page size 2 MiB for the small pool, 20 MiB for the
    // large pool; reserved grows in pages; segment.* stays 0.
    let c = expandable(80 * GIB);
    c.alloc(512);
    c.alloc(3 * MIB);
    assert_eq!(
        c.segment_events(),
        vec![
            ("segment_map".into(), 2 * MIB),
            ("segment_map".into(), 20 * MIB)
        ]
    );
    let s = c.stats();
    assert_eq!(s.reserved_bytes.all().current, 22 * MIB as i64);
    assert_eq!(s.segment.all().current, 0);
    assert_eq!(s.segment.all().allocated, 0);
    assert_eq!(s.num_device_alloc, 2);
    assert_eq!(
        s.reserved_bytes.get(StatType::SmallPool).current,
        2 * MIB as i64
    );
}

#[test]
fn one_segment_grows_and_packs_blocks() {
    // spec 1.11: the free tail and the next pages merge; blocks split at 512 B.
    let c = expandable(80 * GIB);
    let a = c.alloc(30 * MIB); // maps 2 pages (40 MiB), 10 MiB stays free
    let b = c.alloc(30 * MIB); // uses the 10 MiB tail + maps 1 page
    assert_eq!(b.0, a.0 + 30 * MIB);
    assert_eq!(
        c.segment_events(),
        vec![
            ("segment_map".into(), 40 * MIB),
            ("segment_map".into(), 20 * MIB)
        ]
    );
    assert_eq!(c.reserved(), 60 * MIB as i64);
    let segs = c.segments();
    assert_eq!(segs.len(), 1, "one mapped run");
    assert!(segs[0].expandable());
    assert_eq!(segs[0].total_size, 60 * MIB);
    // inactive_split excludes expandable blocks
    assert_eq!(c.stats().inactive_split.all().current, 0);
}

#[test]
fn empty_cache_unmaps_only_fully_free_pages() {
    // spec 1.11 / 6.8: unmap the pages fully inside free blocks; the snapshot
    // splits segments at unmapped holes.
    let c = expandable(80 * GIB);
    let a = c.alloc(30 * MIB);
    let b = c.alloc(30 * MIB);
    c.free(a);
    c.empty_cache();
    assert_eq!(
        c.segment_events().last().unwrap(),
        &("segment_unmap".to_string(), 20 * MIB)
    );
    assert_eq!(c.reserved(), 40 * MIB as i64);
    let segs = c.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].address, a.0 + 20 * MIB);
    let states: Vec<(u64, BlockState)> = segs[0].blocks.iter().map(|b| (b.size, b.state)).collect();
    assert_eq!(
        states,
        vec![
            (10 * MIB, BlockState::Inactive),
            (30 * MIB, BlockState::ActiveAllocated)
        ]
    );
    c.free(b);
    c.empty_cache();
    assert_eq!(c.reserved(), 0);
    assert!(c.segments().is_empty());
    let s = c.stats();
    assert_eq!(s.num_device_free, 2, "two unmap calls");
    assert_eq!(
        c.a.backend().counters().releases,
        1,
        "address range given back"
    );
}

#[test]
fn refills_holes_before_growing() {
    // spec 1.11: map at the lowest address that fits ("fill holes first").
    let c = expandable(80 * GIB);
    let a = c.alloc(40 * MIB);
    let _b = c.alloc(40 * MIB);
    c.free(a);
    c.empty_cache(); // unmaps a's two pages: a hole at the start
    let again = c.alloc(40 * MIB);
    assert_eq!(again, a, "the hole is refilled");
}

#[test]
fn base_allocation_is_refused_for_expandable_blocks() {
    // spec 1.11: getBaseAllocation throws for expandable blocks.
    let c = expandable(80 * GIB);
    let p = c.alloc(MIB);
    let err = c.a.base_allocation(p).unwrap_err().to_string();
    assert!(
        err.starts_with("Tensors allocated with expandable_segments:True cannot be shared"),
        "{err}"
    );
    assert!(c.a.base_allocation(DevicePtr(1)).is_err());
}

#[test]
fn turning_expandable_off_skips_expandable_blocks() {
    // spec 1.6 / 1.11: runtime toggling; existing expandable blocks are skipped.
    let c = expandable(80 * GIB);
    let p = c.alloc(30 * MIB);
    c.free(p);
    c.a.set_config(AllocatorConfig::default());
    c.check();
    let q = c.alloc(30 * MIB);
    assert_ne!(q, p);
    assert_eq!(
        c.segment_events().last().unwrap(),
        &("segment_alloc".to_string(), 30 * MIB)
    );
}

#[test]
fn out_of_memory_with_expandable_segments() {
    // spec 1.9 + 1.11: the flush unmaps free pages, then the OOM is raised.
    let c = expandable(100 * MIB);
    let _a = c.alloc(90 * MIB); // 5 pages: the whole device
    let err = c.try_alloc(20 * MIB).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("CUDA out of memory. Tried to allocate 20.00 MiB."),
        "{err}"
    );
    assert_eq!(c.stats().num_ooms, 1);
    assert_eq!(c.reserved(), 100 * MIB as i64);
}

#[test]
fn unmappable_new_segment_is_kept_through_the_flush() {
    // torch 2.15 (goldens streams-010, streams-028, huge-004, oom-004/012/020/028):
    // a segment created for a request whose pages cannot be mapped is not
    // released; the OOM flush only releases segments it unmaps, and the next
    // request of that stream maps into the kept segment (no new reservation).
    let c = expandable(100 * MIB);
    let s1 = reservoir::Backend::create_stream(c.a.backend()).unwrap();
    let a = c.alloc(90 * MIB); // 5 pages: the whole device
    let err = c.a.raw_alloc(20 * MIB, s1).unwrap_err();
    c.check();
    assert!(err.to_string().starts_with("CUDA out of memory."), "{err}");
    let n = c.a.backend().counters();
    assert_eq!((n.reserves, n.releases), (2, 0), "s1's new segment stays");
    c.free(a);
    let b = c.a.raw_alloc(20 * MIB, s1).unwrap();
    c.check();
    let n = c.a.backend().counters();
    assert_eq!(
        n.reserves, 2,
        "the kept segment is mapped, none is reserved"
    );
    assert_eq!(
        n.releases, 1,
        "the flush released stream 0's unmapped segment"
    );
    assert_eq!(c.reserved(), 20 * MIB as i64);
    c.free(b);
}

/// Issue 29 (hardening): a device of (nearly) 2^64 bytes. The address space
/// a new expandable segment reserves (spec 1.11: `cuMemAddressReserve` of
/// ceil(1.125 × totalGlobalMem / page) pages; the `reservoir` policy twice
/// the device) was computed without saturating, so `total + total / 8` and
/// the rounding to whole pages overflowed (a panic in debug builds, a wrap
/// in release) on the first growth. Now the size saturates; a reservation
/// that large cannot be made (the device's address space is far smaller),
/// which PyTorch reports as a driver error, not an OOM (see
/// `an_address_range_that_cannot_be_reserved_is_a_device_error_not_an_oom`).
/// Without expandable segments such a device simply works.
#[test]
fn a_device_of_absurd_capacity_neither_panics_nor_loses_anything() {
    use reservoir::{AllocError, BackendError};
    for capacity in [u64::MAX, u64::MAX / 2] {
        for conf in ["", "expandable_segments:True", "policy:reservoir"] {
            let c = Checked::new(conf, capacity);
            let expandable = !conf.is_empty();
            let mut live = Vec::new();
            for size in [512, 3 * MIB, 30 * MIB] {
                match c.try_alloc(size) {
                    // Without expandable segments every request is served;
                    // the `reservoir` policy gives a large request a
                    // segment of its own (a plain allocation) on a miss.
                    Ok(p) => {
                        assert!(
                            !expandable || conf == "policy:reservoir",
                            "{conf} on {capacity}: {size} B allocated"
                        );
                        live.push((p, size));
                    }
                    Err(AllocError::Backend(BackendError::OutOfMemory { requested, .. }))
                        if expandable =>
                    {
                        // The reservation asked for: at least the device,
                        // saturated at 2^64 less a page, in whole pages.
                        assert!(
                            requested >= capacity - 20 * MIB && requested % (2 * MIB) == 0,
                            "{conf} on {capacity}: reserved {requested}"
                        );
                    }
                    Err(e) => panic!("{conf} on {capacity}: {size} B: {e}"),
                }
            }
            if !expandable {
                assert_eq!(live.len(), 3, "{conf} on {capacity}");
            }
            if conf == "expandable_segments:True" {
                assert!(live.is_empty(), "{conf} on {capacity}");
            }
            assert_eq!(c.stats().num_ooms, 0, "{conf} on {capacity}");
            let sum: u64 = live.iter().map(|&(_, size)| size).sum();
            assert_eq!(c.allocated_now(), sum as i64, "{conf} on {capacity}");
            assert_eq!(c.a.backend().counters().reserves, 0, "{conf}");
            for (p, _) in live {
                c.free(p);
            }
            c.empty_cache();
            assert_eq!(c.reserved(), 0, "{conf} on {capacity}");
            assert_eq!(c.a.backend().counters().bytes_in_use, 0, "{conf}");
        }
    }
}

/// spec 1.11 ("cuMemCreate OOM → release pages created in this call, return
/// failure") and 1.9 (OOM): a growth whose pages the device cannot hold is
/// an allocation failure like a failed `cudaMalloc`: the retry chain runs
/// and the allocator raises its own out-of-memory error (PyTorch's
/// `ExpandableSegment::map` returns an empty range when `cuMemCreate` says
/// `CUDA_ERROR_OUT_OF_MEMORY`). Here the large pool's page (4 GiB) is
/// larger than the whole device (1 GiB): the range is reserved (one page,
/// 1 1/8 of the device rounded up), its page cannot be mapped.
#[test]
fn a_page_larger_than_the_device_is_an_out_of_memory_error() {
    use reservoir::AllocError;
    let c = Checked::new("expandable_segments:True,large_segment_size_mb:4096", GIB);
    let err = c.try_alloc(30 * MIB).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err:?}");
    assert!(err.to_string().starts_with("CUDA out of memory."), "{err}");
    let s = c.stats();
    assert_eq!(s.num_ooms, 1);
    assert_eq!(s.num_alloc_retries, 1, "the retry chain ran");
    assert_eq!(c.reserved(), 0);
    let n = c.a.backend().counters();
    assert_eq!(
        (n.reserves, n.failed_maps),
        (1, 2),
        "reserved; mapped, flushed, mapped"
    );
    // The small pool (2 MiB pages) still serves.
    let p = c.alloc(512);
    c.free(p);
    c.empty_cache();
    assert_eq!(c.reserved(), 0);
    assert_eq!(c.a.backend().counters().bytes_in_use, 0);
}

/// spec 1.11: the virtual range is reserved up front with
/// `cuMemAddressReserve`, which PyTorch checks with `C10_CUDA_DRIVER_CHECK`
/// (`ExpandableSegment`'s constructor): a reservation the driver refuses is
/// a driver error ("CUDA driver error: out of memory", a `c10::Error`), not
/// an `OutOfMemoryError`: no retry, no `num_ooms`, no "oom" trace entry. So
/// with `large_segment_size_mb:1000000000` (pages of about 1 PB, more than
/// the address space) the first large allocation is the device's error
/// (`AllocError::Backend`, naming the size it asked for) and nothing
/// changes; the small pool is unaffected.
#[test]
fn an_address_range_that_cannot_be_reserved_is_a_device_error_not_an_oom() {
    use reservoir::{AllocError, BackendError};
    let c = Checked::new(
        "expandable_segments:True,large_segment_size_mb:1000000000",
        80 * GIB,
    );
    let p = c.alloc(512);
    let before = c.flat();
    let err = c.try_alloc(30 * MIB).unwrap_err();
    match &err {
        AllocError::Backend(BackendError::OutOfMemory { requested, .. }) => {
            assert_eq!(*requested, 1_000_000_000 * MIB)
        }
        e => panic!("{e:?}"),
    }
    assert!(
        err.to_string().contains("1048576000000000 bytes requested"),
        "{err}"
    );
    assert_eq!(c.flat(), before, "a failed reservation changes no counter");
    assert!(
        c.a.history().iter().all(|e| e.action.as_str() != "oom"),
        "no oom trace entry"
    );
    assert_eq!(
        c.a.backend().counters().reserves,
        1,
        "the small pool's only"
    );
    c.free(p);
    c.empty_cache();
    assert_eq!(c.reserved(), 0);
}
