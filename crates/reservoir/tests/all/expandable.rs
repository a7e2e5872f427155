//! Expandable segments (spec 1.11 and checklist 6.8).

use reservoir::snapshot::BlockState;
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
