//! Each of PyTorch's allocation rules, driven through the allocator on the
//! simulated device. Every test names its spec section
//! (`../shared/spec/pytorch-allocator.md`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use reservoir::observe::snapshot::BlockState;
use reservoir::observe::trace::TraceAction;
use reservoir::{DevicePtr, StreamId};

use crate::common::*;

#[test]
fn small_requests_pack_into_2mib_segments() {
    // spec 1.3 (512-byte minimum), 1.4 (small pool, 2 MiB segments), 1.7 (small split rule)
    let c = Checked::default_device();
    let a = c.alloc(1);
    let b = c.alloc(1000);
    assert_eq!(b.0, a.0 + 512, "second block follows the first");
    let s = c.stats();
    assert_eq!(s.segment.get(reservoir::StatType::SmallPool).current, 1);
    assert_eq!(s.reserved_bytes.all().current, 2 * MIB as i64);
    assert_eq!(s.allocated_bytes.all().current, 512 + 1024);
    assert_eq!(s.requested_bytes.all().current, 1 + 1000);
    assert_eq!(s.inactive_split.all().current, 1);
    assert_eq!(
        s.inactive_split_bytes.all().current,
        (2 * MIB - 1536) as i64
    );
    assert_eq!(c.segment_events(), vec![("segment_alloc".into(), 2 * MIB)]);
}

#[test]
fn pool_boundary_is_one_mib_inclusive() {
    // spec 1.4: exactly 1 MiB goes to the small pool, anything above to the large pool.
    let c = Checked::default_device();
    c.alloc(MIB);
    c.alloc(MIB + 1);
    let s = c.stats();
    assert_eq!(s.allocation.get(reservoir::StatType::SmallPool).current, 1);
    assert_eq!(s.allocation.get(reservoir::StatType::LargePool).current, 1);
    assert_eq!(
        s.allocated_bytes
            .get(reservoir::StatType::LargePool)
            .current,
        (MIB + 512) as i64
    );
}

#[test]
fn segment_sizes() {
    // spec 1.4 / 6.1: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else 2 MiB-rounded.
    let c = Checked::default_device();
    c.alloc(100);
    c.alloc(10 * MIB);
    c.alloc(11 * MIB + 1);
    c.alloc(3 * MIB);
    let sizes: Vec<u64> = c.segment_events().into_iter().map(|(_, s)| s).collect();
    assert_eq!(sizes, vec![2 * MIB, 10 * MIB, 12 * MIB, 20 * MIB]);
}

#[test]
fn best_fit_breaks_ties_by_oldest_segment_then_lowest_address() {
    // spec 1.6 says ties go to the lowest address; torch 2.15 (measured on the
    // oracle, README "Spec errors found") prefers the block of the oldest
    // segment, then the lowest address inside a segment.
    let c = Checked::default_device();
    let a = c.alloc(30 * MIB);
    let b = c.alloc(30 * MIB);
    assert!(
        b < a,
        "the simulated device places segments top-down, like Linux mmap"
    );
    c.free(a);
    c.free(b);
    assert_eq!(
        c.alloc(30 * MIB),
        a,
        "oldest segment first, although its address is higher"
    );
    assert_eq!(c.stats().num_device_alloc, 2);
    // inside one segment: lowest address
    let x = c.alloc(512);
    let _y = c.alloc(512);
    let z = c.alloc(512);
    let _w = c.alloc(512);
    c.free(z);
    c.free(x);
    assert_eq!(c.alloc(512), x);
}

#[test]
fn best_fit_ties_follow_the_release() {
    // docs/replay-fidelity.md, "PyTorch releases", rule `free_block_order`:
    // the comparator of `BlockPool::blocks` changed in 2.12 and in 2.13.
    // Two whole free 2 MiB small segments of one stream, the newer one at the
    // lower address (the simulated device, like the fake driver's mmap,
    // places segments top-down). The traces are the extra goldens
    // `tie-a-2.1X` / `tie-b-2.1X` (tests/golden/extra of reservoir-replay),
    // made with each release's oracle.
    // tie-a: the older segment's block is also the older block object.
    // tie-b: the older segment is split and merged again first, so its
    // block is the newer object.
    fn tie(release: &str, resplit_older: bool) -> (DevicePtr, DevicePtr, DevicePtr) {
        let c = Checked::new(&format!("policy:pytorch-{release}"), 80 * GIB);
        let p1 = c.alloc(MIB);
        let p2 = c.alloc(MIB);
        let p3 = c.alloc(MIB);
        let p4 = c.alloc(MIB);
        assert!(p3 < p1, "the newer segment lies lower");
        c.free(p1);
        c.free(p2);
        if resplit_older {
            let p5 = c.alloc(MIB);
            assert_eq!(p5, p1);
            c.free(p5);
        }
        c.free(p3);
        c.free(p4);
        (c.alloc(MIB), p1, p3)
    }
    for (release, a_takes_older, b_takes_older) in [
        // BlockComparatorSize: (stream, size, ptr).
        ("2.11", false, false),
        // BlockComparatorRegistrationCounter: (stream, size, the Block's counter).
        ("2.12", true, false),
        // BlockComparatorSizeCounterAddress: (stream, size, the segment's counter, ptr).
        ("2.13", true, true),
        ("2.15", true, true),
    ] {
        for (resplit, takes_older) in [(false, a_takes_older), (true, b_takes_older)] {
            let (got, older, newer) = tie(release, resplit);
            let want = if takes_older { older } else { newer };
            assert_eq!(
                got, want,
                "torch {release}, re-split older segment: {resplit}"
            );
        }
    }
}

#[test]
fn best_fit_ties_follow_a_release_set_at_run_time() {
    // Rule `free_block_order` as in `best_fit_ties_follow_the_release`
    // (tie-a), but the release changes from 2.15 to 2.11 through
    // `set_config` while both tied blocks are cached: they are re-keyed
    // (the invariant checker finds each free block under the new order's
    // key) and best fit takes the lower address, as torch 2.11 does.
    let c = Checked::new("policy:pytorch-2.15", 80 * GIB);
    let p1 = c.alloc(MIB);
    let p2 = c.alloc(MIB);
    let p3 = c.alloc(MIB);
    let p4 = c.alloc(MIB);
    assert!(p3 < p1, "the newer segment lies lower");
    for p in [p1, p2, p3, p4] {
        c.free(p);
    }
    let mut config = c.a.config();
    config.torch_release = reservoir::config::TorchRelease::V2_11;
    c.a.set_config(config);
    c.check();
    assert_eq!(c.alloc(MIB), p3, "torch 2.11 takes the lowest address");
}

#[test]
fn best_fit_prefers_the_smallest_fitting_block() {
    // spec 1.6: lower_bound on size: the smallest block that fits wins.
    let c = Checked::default_device();
    let big = c.alloc(40 * MIB);
    let small = c.alloc(30 * MIB);
    c.free(big);
    c.free(small);
    assert_eq!(c.alloc(25 * MIB), small);
}

#[test]
fn free_blocks_are_never_shared_across_streams() {
    // spec 1.6: the search is keyed by stream; another stream's block never fits.
    let c = Checked::default_device();
    c.a.backend().register_stream(StreamId(1)); // streams are checked (issue 29)
    let s1 = StreamId(1);
    let p = c.alloc_on(30 * MIB, s1);
    c.free(p);
    let q = c.alloc_on(30 * MIB, S0);
    assert_ne!(p, q);
    assert_eq!(c.stats().num_device_alloc, 2);
    assert_eq!(c.reserved(), 60 * MIB as i64);
}

#[test]
fn large_split_remainder_rule() {
    // spec 6.2: a 22 MiB block; 20.5 MiB splits (1.5 MiB > 1 MiB left), 21.1 MiB does not.
    let c = Checked::default_device();
    let p = c.alloc(22 * MIB);
    c.free(p);
    let q = c.alloc(20 * MIB + MIB / 2);
    assert_eq!(q, p);
    let s = c.stats();
    assert_eq!(s.allocated_bytes.all().current, (20 * MIB + MIB / 2) as i64);
    assert_eq!(s.inactive_split.all().current, 1);
    assert_eq!(s.inactive_split_bytes.all().current, (MIB + MIB / 2) as i64);
    c.free(q);
    assert_eq!(c.stats().inactive_split.all().current, 0);
    // 21.1 MiB rounded to 512: 22124544 bytes, leaving 943104 < 1 MiB: no split.
    let r = c.alloc(22_124_544);
    let s = c.stats();
    assert_eq!(r, p);
    assert_eq!(
        s.allocated_bytes.all().current,
        22 * MIB as i64,
        "whole block handed out"
    );
    assert_eq!(s.requested_bytes.all().current, 22_124_544);
    assert_eq!(s.inactive_split.all().current, 0);
    assert_eq!(s.num_device_alloc, 1);
}

#[test]
fn default_oversize_blocks_are_split() {
    // spec 6.3: with max_split_size unset, a cached 1 GiB block serves a 2 MiB request.
    let c = Checked::default_device();
    let p = c.alloc(GIB);
    c.free(p);
    let q = c.alloc(2 * MIB);
    assert_eq!(q, p);
    let s = c.stats();
    assert_eq!(s.num_device_alloc, 1);
    assert_eq!(s.inactive_split_bytes.all().current, (GIB - 2 * MIB) as i64);
}

#[test]
fn max_split_size_rules() {
    // spec 1.6 oversize rules and 1.7 (no split at or above max_split_size), 1.12 oversize stats.
    let c = Checked::new("max_split_size_mb:100", 80 * GIB);
    assert_eq!(c.flat()["max_split_size"], 100 * MIB as i64);
    let p = c.alloc(200 * MIB);
    let s = c.stats();
    assert_eq!(s.oversize_segments.current, 1);
    assert_eq!(s.oversize_allocations.current, 1);
    c.free(p);
    assert_eq!(c.stats().oversize_allocations.current, 0);
    // a normal request never gets an oversize block
    let small = c.alloc(50 * MIB);
    assert_ne!(small, p);
    assert_eq!(c.stats().num_device_alloc, 2);
    // an oversize request gets one less than 20 MiB larger, whole
    let q = c.alloc(190 * MIB);
    assert_eq!(q, p);
    assert_eq!(c.allocated_now(), (50 + 200) as i64 * MIB as i64);
    c.free(q);
    // ... but not one 20 MiB or more larger
    let r = c.alloc(150 * MIB);
    assert_ne!(r, p);
    assert_eq!(c.stats().num_device_alloc, 3);
}

#[test]
fn freed_neighbours_merge() {
    // spec 1.10 free_block / try_merge_blocks and 1.12 inactive_split accounting.
    let c = Checked::default_device();
    let a = c.alloc(512);
    let b = c.alloc(512);
    let d = c.alloc(512);
    assert_eq!(c.stats().inactive_split.all().current, 1);
    c.free(b); // hole between a and d
    assert_eq!(c.stats().inactive_split.all().current, 2);
    c.free(a); // merges with b's hole
    let s = c.stats();
    assert_eq!(s.inactive_split.all().current, 2);
    assert_eq!(s.inactive_split_bytes.all().current, (2 * MIB - 512) as i64);
    c.free(d); // everything merges: one unsplit block
    let s = c.stats();
    assert_eq!(s.inactive_split.all().current, 0);
    assert_eq!(s.inactive_split_bytes.all().current, 0);
    let segs = c.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].blocks.len(), 1);
    assert_eq!(segs[0].blocks[0].state, BlockState::Inactive);
    // The merged free block keeps a stale requested_size (spec 1.7 note).
    assert_eq!(segs[0].blocks[0].requested_size, Some(512));
}

#[test]
fn stats_follow_c10_accounting() {
    // spec 1.12: increase/decrease, lifetime totals, resets.
    let c = Checked::default_device();
    let p = c.alloc(1000);
    c.free(p);
    let f = c.flat();
    for (k, v) in [
        ("allocation.all.current", 0),
        ("allocation.all.peak", 1),
        ("allocation.all.allocated", 1),
        ("allocation.all.freed", 1),
        ("active_bytes.small_pool.peak", 1024),
        ("requested_bytes.all.allocated", 1000),
        ("requested_bytes.all.freed", 1000),
        ("inactive_split.all.allocated", 1),
        ("inactive_split.all.freed", 1),
        ("segment.small_pool.current", 1),
        ("reserved_bytes.all.current", 2 * MIB as i64),
        ("num_device_alloc", 1),
        ("num_device_free", 0),
        ("max_split_size", -1),
    ] {
        assert_eq!(f[k], v, "{k}");
    }
    c.a.reset_accumulated_stats();
    let f = c.flat();
    assert_eq!(f["allocation.all.allocated"], 0);
    assert_eq!(f["num_device_alloc"], 0);
    assert_eq!(
        f["allocation.all.peak"], 1,
        "peaks survive an accumulated reset"
    );
    c.a.reset_peak_stats();
    assert_eq!(c.flat()["allocation.all.peak"], 0);
    assert_eq!(c.flat()["reserved_bytes.all.peak"], 2 * MIB as i64);
}

#[test]
fn cache_flush_and_retry_after_driver_oom() {
    // spec 1.5 step 5 / 1.9: alloc_block fails, release_cached_blocks frees the
    // other stream's cached segment, the retry succeeds.
    let c = Checked::new("", 100 * MIB);
    c.a.backend().register_stream(StreamId(1)); // streams are checked (issue 29)
    let p = c.alloc_on(60 * MIB, StreamId(1));
    c.free(p);
    c.alloc(60 * MIB);
    let s = c.stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(
        c.segment_events(),
        vec![
            ("segment_alloc".into(), 60 * MIB),
            ("segment_free".into(), 60 * MIB),
            ("segment_alloc".into(), 60 * MIB)
        ]
    );
}

#[test]
fn release_available_cached_blocks_frees_one_oversize_block() {
    // spec 1.9 release_available_cached_blocks: with max_split_size set, one
    // cached oversize block is released and the allocation retried without a
    // full flush.
    let c = Checked::new("max_split_size_mb:40", 80 * MIB);
    let p = c.alloc(60 * MIB);
    c.free(p);
    c.alloc(30 * MIB);
    let s = c.stats();
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.num_sync_all_streams, 0);
    assert_eq!(
        c.segment_events(),
        vec![
            ("segment_alloc".into(), 60 * MIB),
            ("segment_free".into(), 60 * MIB),
            ("segment_alloc".into(), 30 * MIB)
        ]
    );
}

#[test]
fn release_available_walks_down_from_the_largest() {
    // spec 1.9: no single block is large enough: release oversize blocks from
    // the largest down; if they do not add up, the full flush follows.
    let c = Checked::new("max_split_size_mb:40", 100 * MIB);
    let a = c.alloc(60 * MIB);
    c.free(a);
    c.alloc(70 * MIB);
    let s = c.stats();
    assert_eq!(
        s.num_alloc_retries, 1,
        "60 MiB released was not enough: full flush and retry"
    );
    assert_eq!(c.segment_events().len(), 3);
}

#[test]
fn out_of_memory_message_and_counters() {
    // spec 1.9 OOM text (torch 2.15 wording, checked against the oracle) and 6.5.
    let c = Checked::new("", 100 * MIB);
    c.alloc(60 * MIB);
    c.alloc(3 * MIB);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    c.a.attach_oom_observer(Arc::new(move |dev, size, allowed, free| {
        seen2.lock().unwrap().push((dev, size, allowed, free));
    }));
    let before = c.segments();
    let err = c.try_alloc(30 * MIB).unwrap_err();
    let oom = err.as_oom().expect("out of memory");
    assert_eq!(
        oom.message(),
        "CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total capacity of \
         100.00 MiB of which 20.00 MiB is free. Of the allocated memory 63.00 MiB is allocated \
         by PyTorch, and 17.00 MiB is reserved by PyTorch but unallocated. If reserved but \
         unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
         to avoid fragmentation.  See documentation for Memory Management  \
         (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    );
    assert_eq!(
        c.segments(),
        before,
        "nothing was freeable: state unchanged"
    );
    let s = c.stats();
    assert_eq!(s.num_ooms, 1);
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(0, 30 * MIB, 100 * MIB, 20 * MIB)]
    );
    let last = c.a.history().pop().unwrap();
    assert_eq!(last.action, TraceAction::Oom);
    assert_eq!(
        (last.addr, last.size),
        (20 * MIB, 30 * MIB),
        "oom entry: device_free, rounded size"
    );
}

#[test]
fn oom_tried_to_allocate_is_the_segment_size() {
    // spec 6.5: a 3 MiB request reports the 20 MiB segment it tried to get.
    let c = Checked::new("", 10 * MIB);
    let err = c.try_alloc(3 * MIB).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of \
             10.00 MiB of which 10.00 MiB is free. Of the allocated memory 0 bytes is allocated \
             by PyTorch, and 0 bytes is reserved by PyTorch but unallocated."
        ),
        "{err}"
    );
}

#[test]
fn exabyte_and_zero_sized_requests() {
    // spec 1.9: sizes >= 2^60 fail at once; size 0 is a null pointer and no block.
    let c = Checked::default_device();
    let err = c.try_alloc(1 << 60).unwrap_err();
    assert_eq!(
        err.to_string(),
        "CUDA out of memory. Tried to allocate more than 1EB memory."
    );
    assert_eq!(c.stats().num_ooms, 0);
    let before = c.flat();
    let p = c.try_alloc(0).unwrap();
    assert!(p.is_null());
    c.a.raw_free(DevicePtr::NULL).unwrap();
    assert_eq!(c.flat(), before);
    assert!(c.a.history().is_empty());
}

#[test]
fn garbage_collection_frees_blocks_older_than_the_mean() {
    // spec 1.8: with a fraction set, GC frees unsplit large blocks whose age
    // (large-pool searches since insertion) is at least the mean.
    let c = Checked::new("garbage_collection_threshold:0.5", 1000 * MIB);
    c.a.set_memory_fraction(0.2).unwrap(); // allowed 200 MiB, GC above 100 MiB
    let a = c.alloc(30 * MIB); // clock 1
    let b = c.alloc(30 * MIB); // clock 2
    c.free(a); // age base 2
    let cc = c.alloc(34 * MIB); // clock 3, reserved 94
    c.free(b); // base 3
    let _d = c.alloc(38 * MIB); // clock 4: 94 <= 100, no GC; reserved 132
    c.free(cc); // base 4
    c.alloc(40 * MIB); // clock 5: GC target 32; ages a=3, b=2, c=1, mean 2 -> free a, b
    let ev = c.segment_events();
    assert_eq!(
        ev,
        vec![
            ("segment_alloc".into(), 30 * MIB),
            ("segment_alloc".into(), 30 * MIB),
            ("segment_alloc".into(), 34 * MIB),
            ("segment_alloc".into(), 38 * MIB),
            ("segment_free".into(), 30 * MIB),
            ("segment_free".into(), 30 * MIB),
            ("segment_alloc".into(), 40 * MIB),
        ]
    );
    assert_eq!(c.stats().num_alloc_retries, 0);
}

#[test]
fn garbage_collection_needs_a_fraction() {
    // spec 1.8 / issue #106660: without a memory fraction the threshold does nothing.
    let c = Checked::new("garbage_collection_threshold:0.5", 100 * MIB);
    let a = c.alloc(30 * MIB);
    c.free(a);
    c.alloc(40 * MIB);
    assert_eq!(c.segment_events().len(), 2, "no GC free");
}

#[test]
fn memory_fraction_limits_reserved_memory() {
    // spec 1.13: the limit applies before the driver is asked; 1.0 removes it.
    let c = Checked::new("", 1000 * MIB);
    c.a.set_memory_fraction(0.5).unwrap();
    assert_eq!(c.a.memory_fraction().unwrap(), 0.5);
    c.alloc(400 * MIB);
    let err = c.try_alloc(200 * MIB).unwrap_err();
    assert!(
        err.to_string()
            .contains("of which 600.00 MiB is free. 500.00 MiB allowed; Of the allocated"),
        "{err}"
    );
    assert_eq!(
        c.a.backend().counters().allocs,
        1,
        "the device was never asked"
    );
    let before = c.flat();
    assert!(c.a.set_memory_fraction(1.5).is_err());
    assert!(c.a.set_memory_fraction(-0.1).is_err());
    assert_eq!(c.flat(), before);
    assert_eq!(c.a.memory_fraction().unwrap(), 0.5);
    c.a.set_memory_fraction(1.0).unwrap();
    assert_eq!(c.a.memory_fraction().unwrap(), 1.0);
    c.alloc(200 * MIB);
}

#[test]
fn per_process_memory_fraction_from_config() {
    // spec 1.13 / 1.17: per_process_memory_fraction applies at construction.
    let c = Checked::new("per_process_memory_fraction:0.25", 400 * MIB);
    assert_eq!(c.a.memory_fraction().unwrap(), 0.25);
    assert!(c.try_alloc(101 * MIB).is_err());
}

/// The fake device of `../shared/oracle` (its `cudaMemGetInfo` total).
const ORACLE_TOTAL: u64 = 85_045_870_592;

#[test]
fn memory_fraction_getter_and_allowed_bytes_per_release() {
    // spec 1.13 (allowed = f x total; getMemoryFraction = allowed / total),
    // rule memory_fraction_rounding of ReleaseRules: torch 2.11 and 2.12
    // truncate f x total, 2.13 to 2.15 round it to the nearest byte. The
    // getter values are what each release's wheel returns on the fake device
    // (`PYTORCH_ORACLE_HOME=~/.cache/oracle-2.1X ../shared/oracle/oracle-python`,
    // plain `oracle-python` for 2.15: `torch.cuda.set_per_process_memory_fraction(f)`
    // then `torch.cuda.get_per_process_memory_fraction()`), the same in 2.11
    // and 2.12 and the same in 2.13, 2.14 and 2.15.
    let half = 1.0 / (1u64 << 17) as f64;
    // (fraction, getter in 2.11 and 2.12, getter in 2.13 to 2.15)
    let measured: [(f64, f64, f64); 13] = [
        (0.02, 0.019999999990122978, 0.02000000000188134),
        (0.3333, 0.3332999999963126, 0.3332999999963126),
        (0.5, 0.5, 0.5),
        (0.1, 0.09999999999764833, 0.09999999999764833),
        (1e-9, 9.99460637045859e-10, 9.99460637045859e-10),
        (0.999999, 0.9999989999984784, 0.9999989999984784),
        (0.7, 0.6999999999952966, 0.6999999999952966),
        (1.0 / 3.0, 0.3333333333254944, 0.3333333333372528),
        (0.123456789, 0.12345678898826692, 0.1234567890000253),
        // f x total = 648848.5 and 1946545.5: halves away from zero.
        (half, 7.629388652069782e-06, 7.629400410430218e-06),
        (3.0 * half, 2.2888177714569784e-05, 2.2888189472930216e-05),
        (0.999999999999, 0.9999999999882416, 1.0),
        (0.0, 0.0, 0.0),
    ];
    for release in ["2.11", "2.12", "2.13", "2.14", "2.15"] {
        let old = matches!(release, "2.11" | "2.12");
        let c = Checked::new(&format!("policy:pytorch-{release}"), ORACLE_TOTAL);
        for (f, get_old, get_new) in measured {
            c.a.set_memory_fraction(f).unwrap();
            c.check();
            let want = if old { get_old } else { get_new };
            let got = c.a.memory_fraction().unwrap();
            assert_eq!(got.to_bits(), want.to_bits(), "{release}: {f} -> {got}");
        }
        // At start-up (per_process_memory_fraction in the settings) the same
        // rule (PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.02 on
        // each wheel: 0.019999999990122978 in 2.11 and 2.12,
        // 0.02000000000188134 from 2.13).
        let c = Checked::new(
            &format!("policy:pytorch-{release},per_process_memory_fraction:0.02"),
            ORACLE_TOTAL,
        );
        let want: f64 = if old {
            0.019999999990122978
        } else {
            0.02000000000188134
        };
        assert_eq!(c.a.memory_fraction().unwrap().to_bits(), want.to_bits());
        c.check();
    }
    // `policy:pytorch` is 2.15.
    let c = Checked::new("", ORACLE_TOTAL);
    c.a.set_memory_fraction(0.02).unwrap();
    assert_eq!(c.a.memory_fraction().unwrap(), 0.02000000000188134);
}

#[test]
fn memory_fraction_allowed_byte_decides_a_request() {
    // spec 1.13 / 1.9 (alloc_block refuses a segment that would pass the
    // allowed bytes), rule memory_fraction_rounding: with the fraction
    // (k x 2 MiB - 0.3) / total, a request of exactly k x 2 MiB runs out of
    // memory in torch 2.11 and 2.12 (allowed k x 2 MiB - 1 bytes, message
    // "... 1.95 GiB allowed; ..." and "... 74.00 MiB allowed; ...") and fits
    // in 2.13 to 2.15 (allowed k x 2 MiB). Measured with
    // `torch.empty(k * 2**21, dtype=torch.uint8, device="cuda")` on each
    // release's wheel on the fake device (total 85045870592 B).
    for release in ["2.11", "2.12", "2.13", "2.14", "2.15"] {
        let fits = !matches!(release, "2.11" | "2.12");
        for (k, shown) in [(1000u64, "1.95 GiB allowed; "), (37, "74.00 MiB allowed; ")] {
            let c = Checked::new(&format!("policy:pytorch-{release}"), ORACLE_TOTAL);
            let size = k * 2 * MIB;
            let f = (size as f64 - 0.3) / ORACLE_TOTAL as f64;
            c.a.set_memory_fraction(f).unwrap();
            c.check();
            if fits {
                let p = c.alloc(size);
                assert_eq!(c.stats().reserved_bytes.all().current, size as i64);
                c.free(p);
            } else {
                let before = c.a.segments().len();
                let err = c.try_alloc(size).unwrap_err();
                assert!(err.to_string().contains(shown), "{release} {k}: {err}");
                assert_eq!(c.a.segments().len(), before, "{release} {k}");
                assert_eq!(
                    c.a.backend().counters().allocs,
                    0,
                    "{release} {k}: the device was never asked"
                );
                // One page less fits.
                let p = c.alloc(size - 2 * MIB);
                c.free(p);
            }
        }
    }
}

#[test]
fn empty_cache_releases_only_whole_free_segments() {
    // spec 1.13: split segments with a live block stay reserved.
    let c = Checked::default_device();
    let s1 = c.alloc(512);
    let _s2 = c.alloc(512);
    let big = c.alloc(30 * MIB);
    let _live = c.alloc(40 * MIB);
    c.free(big);
    c.free(s1);
    c.empty_cache();
    assert_eq!(c.reserved(), (2 + 40) as i64 * MIB as i64);
    assert_eq!(
        c.segment_events().last().unwrap(),
        &("segment_free".to_string(), 30 * MIB)
    );
    assert_eq!(c.stats().num_sync_all_streams, 1);
}

#[test]
fn cache_info_and_base_allocation() {
    // spec 1.13: cacheInfo = max(device free, largest cached block); getBaseAllocation.
    let c = Checked::new("", 100 * MIB);
    let p = c.alloc(50 * MIB);
    let _q = c.alloc(40 * MIB);
    c.free(p);
    assert_eq!(c.a.cache_info().unwrap(), 50 * MIB);
    let a = c.alloc(512);
    let b = c.alloc(512);
    assert_eq!(c.a.base_allocation(b).unwrap(), (a, 2 * MIB));
    assert!(c.a.base_allocation(DevicePtr(b.0 + 1)).is_err());
}

#[test]
fn driver_failure_takes_the_retry_path() {
    // spec 1.9: a retryable driver error is treated as out-of-memory and retried after a flush.
    let c = Checked::default_device();
    c.a.backend().fail_nth_alloc(1);
    c.alloc(30 * MIB);
    assert_eq!(c.stats().num_alloc_retries, 1);
    c.a.backend().fail_allocs_above(10 * MIB);
    assert!(c.try_alloc(3 * MIB).is_err(), "20 MiB segment refused");
    c.alloc(MIB);
    c.a.backend().clear_faults();
    c.alloc(3 * MIB);
}

#[test]
fn free_memory_callbacks_run_before_the_driver() {
    // spec 1.5 step 4: callbacks run only when the cache has no fitting block.
    let c = Checked::default_device();
    let held = c.alloc(60 * MIB);
    let calls = Arc::new(AtomicU64::new(0));
    let calls2 = calls.clone();
    let mut pending = Some(held);
    c.a.add_free_memory_callback(Box::new(move || {
        calls2.fetch_add(1, Ordering::SeqCst);
        pending.take().into_iter().collect()
    }));
    let q = c.alloc(60 * MIB);
    assert_eq!(
        q, held,
        "the callback freed the held block and the cache served it"
    );
    assert_eq!(c.stats().num_device_alloc, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    c.alloc(512); // another miss: the callback runs, frees nothing
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn roundup_power2_divisions_through_the_allocator() {
    // spec 1.3: divisions round large requests to power-of-two steps.
    let c = Checked::new("roundup_power2_divisions:4", 80 * GIB);
    c.alloc(5000); // below 512*4 gate? no: 5000 > 2048 -> 5120
    c.alloc(9 * MIB); // 8 MiB..16 MiB in steps of 2 MiB -> 10 MiB
    assert_eq!(c.allocated_now(), 5120 + 10 * MIB as i64);
}

#[test]
fn segments_report_consistent_tilings() {
    // spec 6.6: per segment total_size = sum of block sizes, contiguous block
    // addresses, segments sorted by address; requested sizes of active blocks.
    let c = Checked::default_device();
    let mut live = Vec::new();
    for i in 0..40u64 {
        live.push(c.alloc(1 + i * 37_000 % (3 * MIB)));
        if i % 3 == 0 {
            c.free(live.swap_remove((i as usize * 7) % live.len()));
        }
    }
    let segs = c.segments();
    assert!(segs.windows(2).all(|w| w[0].address < w[1].address));
    for s in &segs {
        assert_eq!(s.total_size, s.blocks.iter().map(|b| b.size).sum::<u64>());
        let mut at = s.address;
        for b in &s.blocks {
            assert_eq!(b.address, Some(at));
            at += b.size;
        }
    }
    let allocated: u64 = segs
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| b.size)
        .sum();
    assert_eq!(allocated as i64, c.allocated_now());
}
