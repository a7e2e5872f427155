//! Private pools (spec 1.14) and checkpoints (spec 1.15).

use reservoir::caching::PoolFilter;
use reservoir::observe::snapshot::{BlockState, Segment};
use reservoir::MempoolId;
use reservoir::{Backend, StreamId};

use crate::common::*;

const P: MempoolId = MempoolId(1, 0);
const S1: StreamId = StreamId(1);

#[test]
fn pool_blocks_serve_only_the_pool() {
    // spec 1.14: routing by filter; private blocks never serve other allocations.
    let c = Checked::default_device();
    c.a.backend().register_stream(S1); // streams are checked (issue 29)
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let in_pool = c.alloc_on(30 * MIB, S1);
    let outside = c.alloc_on(30 * MIB, S0);
    c.check();
    assert_eq!(c.a.pool_segments(P).len(), 1);
    assert_eq!(c.a.pool_segments(P)[0].blocks[0].address, Some(in_pool.0));
    assert_eq!(
        c.a.pool_segments(MempoolId::DEFAULT)[0].blocks[0].address,
        Some(outside.0)
    );
    c.free(in_pool);
    c.a.end_allocate_to_pool(P).unwrap();
    let again = c.alloc_on(30 * MIB, S1);
    assert_ne!(
        again, in_pool,
        "the pool's cached block is not used outside the pool"
    );
    assert_eq!(c.stats().num_device_alloc, 3);
}

#[test]
fn pool_errors_change_nothing() {
    // spec 1.14: the error messages of begin/end/release.
    let c = Checked::default_device();
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let before = (c.flat(), c.a.pool_use_count(P));
    let e =
        c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
            .unwrap_err();
    assert_eq!(
        e.to_string(),
        "beginAllocateToPool: already recording to mempool_id"
    );
    assert_eq!((c.flat(), c.a.pool_use_count(P)), before);
    let e = c.a.end_allocate_to_pool(MempoolId(9, 9)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "endAllocatePool: not currently recording to mempool_id"
    );
    assert!(c.a.release_pool(MempoolId(9, 9)).is_err());
    assert!(c
        .a
        .begin_allocate_to_pool(MempoolId::DEFAULT, PoolFilter::Stream(S1))
        .is_err());
    c.check();
}

#[test]
fn released_pools_are_freed_by_empty_cache() {
    // spec 1.14: releasePool -> freeable; memory returned by a later empty_cache.
    let c = Checked::default_device();
    c.a.backend().register_stream(S1); // streams are checked (issue 29)
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let p = c.alloc_on(30 * MIB, S1);
    c.a.end_allocate_to_pool(P).unwrap();
    c.free(p);
    c.empty_cache();
    assert_eq!(
        c.reserved(),
        30 * MIB as i64,
        "a live pool keeps its memory"
    );
    c.a.release_pool(P).unwrap();
    assert_eq!(c.a.pool_use_count(P), 0);
    c.empty_cache();
    assert_eq!(c.reserved(), 0);
    assert!(c.a.pool_segments(P).is_empty());
    // the pool is gone: a new begin creates it afresh
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    assert_eq!(c.a.pool_use_count(P), 1);
}

#[test]
fn empty_cache_of_one_pool() {
    // spec 1.9 (N): emptyCache(mempool_id) releases only that freeable pool.
    let c = Checked::default_device();
    c.a.backend().register_stream(S1); // streams are checked (issue 29)
    c.a.backend().register_stream(StreamId(2));
    let q = MempoolId(2, 0);
    for (id, s) in [(P, S1), (q, StreamId(2))] {
        c.a.begin_allocate_to_pool(id, PoolFilter::Stream(s))
            .unwrap();
        let p = c.alloc_on(30 * MIB, s);
        c.a.end_allocate_to_pool(id).unwrap();
        c.free(p);
        c.a.release_pool(id).unwrap();
    }
    let g = c.alloc(30 * MIB);
    c.free(g);
    c.a.empty_cache_pool(P).unwrap();
    c.check();
    assert!(c.a.pool_segments(P).is_empty());
    assert_eq!(c.a.pool_segments(q).len(), 1);
    assert_eq!(
        c.reserved(),
        60 * MIB as i64,
        "the global pool and q stay cached"
    );
}

#[test]
fn oom_message_names_private_pool_memory() {
    // spec 1.9: the private-pool line of the OOM message (free cached blocks of private pools).
    let c = Checked::new("", 100 * MIB);
    c.a.backend().register_stream(S1); // streams are checked (issue 29)
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let p = c.alloc_on(40 * MIB, S1);
    c.a.end_allocate_to_pool(P).unwrap();
    c.free(p);
    c.alloc(40 * MIB);
    let err = c.try_alloc(40 * MIB).unwrap_err().to_string();
    assert!(
        err.contains(
            "Of the allocated memory 80.00 MiB is allocated by PyTorch, with 40.00 MiB allocated \
             in private pools (e.g., CUDA Graphs), and 0 bytes is reserved by PyTorch but unallocated."
        ),
        "{err}"
    );
}

#[test]
fn thread_filter_routes_only_the_calling_thread() {
    // spec 1.14: use_mem_pool's filter is "calling thread".
    let c = Checked::default_device();
    c.a.begin_allocate_to_pool(P, PoolFilter::current_thread())
        .unwrap();
    let mine = c.alloc(MIB);
    let theirs =
        std::thread::scope(|s| s.spawn(|| c.a.raw_alloc(MIB, S0).unwrap()).join().unwrap());
    c.a.end_allocate_to_pool(P).unwrap();
    c.check();
    assert_eq!(c.a.pool_segments(P)[0].blocks[0].address, Some(mine.0));
    assert!(c
        .a
        .pool_segments(MempoolId::DEFAULT)
        .iter()
        .any(|s| s.blocks[0].address == Some(theirs.0)));
}

#[test]
fn cross_stream_frees_wait_for_the_end_of_pool_allocation() {
    // spec 1.10 / 1.14: during capture, frees with stream uses are deferred
    // (no events); process_events is skipped until every capture ends.
    let c = Checked::default_device();
    let s2 = c.a.backend().create_stream().unwrap();
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let p = c.alloc(MIB);
    c.a.record_stream(p, s2).unwrap();
    c.free(p);
    assert_eq!(
        c.segments()[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    c.alloc(512); // still capturing: nothing processed
    assert_eq!(
        c.segments()[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    c.a.end_allocate_to_pool(P).unwrap();
    c.alloc(512); // events recorded and (s2 idle) complete at once
    assert_eq!(c.stats().active.all().current, 2);
}

#[test]
fn checkpoint_diverge_restore() {
    // spec 1.15: checkpoint, diverge, restore; the pool's segments compare
    // block by block with the checkpointed ones.
    let c = Checked::default_device();
    c.a.backend().register_stream(S1); // streams are checked (issue 29)
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let a = c.alloc_on(4 * MIB, S1);
    let b = c.alloc_on(6 * MIB, S1);
    let d = c.alloc_on(2 * MIB, S1);
    let small = c.alloc_on(4096, S1);
    c.free(b);
    let cp = c.a.checkpoint_pool(P).unwrap();
    let at_checkpoint = c.a.pool_segments(P);
    // diverge
    c.free(a);
    let e = c.alloc_on(7 * MIB, S1);
    let f = c.alloc_on(100, S1);
    assert_ne!(c.a.pool_segments(P), at_checkpoint);
    let rr = c.a.restore_pool_checkpoint(&cp).unwrap();
    c.check();
    let mut freed = rr.allocations_freed.clone();
    freed.sort();
    let mut want = vec![d, small, e, f];
    want.sort();
    assert_eq!(freed, want);
    let mut created = rr.allocations_created.clone();
    created.sort();
    let mut want = vec![a, d, small];
    want.sort();
    assert_eq!(created, want);
    let shape = |segs: &[Segment]| -> Vec<Vec<(Option<u64>, u64, BlockState)>> {
        segs.iter()
            .map(|s| {
                s.blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.state))
                    .collect()
            })
            .collect()
    };
    assert_eq!(shape(&c.a.pool_segments(P)), shape(&at_checkpoint));
    // the created allocations are owned by the caller and free normally
    for p in rr.allocations_created {
        c.free(p);
    }
    c.a.end_allocate_to_pool(P).unwrap();
}

#[test]
fn checkpoint_errors() {
    // spec 1.15: unknown and freeable pools cannot be checkpointed; a bad
    // checkpoint is refused before anything changes.
    let c = Checked::default_device();
    c.a.backend().register_stream(S1); // streams are checked (issue 29)
    assert_eq!(
        c.a.checkpoint_pool(P).unwrap_err().to_string(),
        "Could not find pool of id"
    );
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let p = c.alloc_on(MIB, S1);
    let mut cp = c.a.checkpoint_pool(P).unwrap();
    cp.segments[0].blocks[0].size += 512;
    let before = (c.flat(), c.segments());
    assert!(c.a.restore_pool_checkpoint(&cp).is_err());
    assert_eq!((c.flat(), c.segments()), before);
    c.a.end_allocate_to_pool(P).unwrap();
    c.free(p);
    c.a.release_pool(P).unwrap();
    assert_eq!(
        c.a.checkpoint_pool(P).unwrap_err().to_string(),
        "Not expected to checkpoint freeable graph"
    );
}

#[test]
fn a_pool_cannot_be_released_while_allocated_to() {
    // spec 1.14: release follows end (PyTorch would assert on the next allocation).
    let c = Checked::default_device();
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let e = c.a.release_pool(P).unwrap_err().to_string();
    assert!(e.contains("still being allocated to"), "{e}");
    assert_eq!(c.a.pool_use_count(P), 1);
    c.a.end_allocate_to_pool(P).unwrap();
    c.a.release_pool(P).unwrap();
}

#[test]
fn freeable_pools_are_released_in_torch_hash_map_order() {
    // Measured on torch 2.15 (FINDINGS.md 12): MemPools (0, 1)..(0, 6), each
    // holding one (i + 1) * 12 MiB tensor, released, the tensors freed, then
    // one empty_cache: segments are freed in `graph_pools_freeable`'s
    // ska::flat_hash_map order, 5 2 4 1 6 3, whatever the release order.
    for reversed in [false, true] {
        let c = Checked::default_device();
        let mut live = Vec::new();
        for i in 1..=6u64 {
            let id = MempoolId(0, i);
            c.a.begin_allocate_to_pool(id, PoolFilter::Stream(S0))
                .unwrap();
            live.push(c.alloc(i * 12 * MIB));
            c.a.end_allocate_to_pool(id).unwrap();
        }
        let mut order: Vec<u64> = (1..=6).collect();
        if reversed {
            order.reverse();
        }
        for &i in &order {
            c.a.release_pool(MempoolId(0, i)).unwrap();
        }
        for p in live {
            c.free(p);
        }
        let before = c.segment_events().len();
        c.empty_cache();
        let freed: Vec<u64> = c.segment_events()[before..]
            .iter()
            .map(|(action, size)| {
                assert_eq!(action, "segment_free");
                size / (12 * MIB)
            })
            .collect();
        assert_eq!(freed, vec![5, 2, 4, 1, 6, 3], "reversed = {reversed}");
    }
}

#[test]
fn deferred_frees_are_recorded_in_free_order() {
    // PyTorch walks needs_events_deferred_until_no_capture front to back: the
    // first block freed during the capture gets the first event on the stream
    // and completes first.
    let c = Checked::default_device();
    let s2 = c.a.backend().create_stream().unwrap();
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let ps: Vec<_> = (0..3).map(|_| c.alloc(MIB)).collect();
    for &p in &ps {
        c.a.record_stream(p, s2).unwrap();
        c.free(p);
    }
    c.a.end_allocate_to_pool(P).unwrap();
    c.alloc(512); // events recorded and (s2 idle) complete at once
    let completed: Vec<u64> =
        c.a.history()
            .into_iter()
            .filter(|e| e.action == reservoir::observe::trace::TraceAction::FreeCompleted)
            .map(|e| e.addr)
            .collect();
    assert_eq!(completed, ps.iter().map(|p| p.0).collect::<Vec<_>>());
}

#[test]
fn streams_recorded_during_a_capture_are_not_waited_for() {
    // PyTorch's remove_cudagraph_stream_uses: a free deferred to the end of
    // the captures drops the streams recorded while a capture was underway
    // (their work was captured, not run); earlier uses are still waited for.
    let c = Checked::default_device();
    let s2 = c.a.backend().create_stream().unwrap();
    let s3 = c.a.backend().create_stream().unwrap();
    let early = c.alloc(MIB);
    c.a.record_stream(early, s3).unwrap();
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let during = c.alloc(MIB);
    c.a.backend().hold_stream(s2).unwrap();
    c.a.backend().hold_stream(s3).unwrap();
    c.a.record_stream(during, s2).unwrap();
    c.a.record_stream(early, s2).unwrap();
    c.free(during);
    c.free(early);
    c.a.end_allocate_to_pool(P).unwrap();
    // Deferred frees: `during` needs no event and is free at once (the
    // 512 B block takes its place), `early` still waits on s3.
    let small = c.alloc(512);
    let blocks: Vec<_> = c.segments()[0]
        .blocks
        .iter()
        .map(|b| (b.address.unwrap(), b.state))
        .collect();
    assert_eq!(
        blocks[..2],
        [
            (early.0, BlockState::ActivePendingFree),
            (small.0, BlockState::ActiveAllocated)
        ]
    );
    assert_eq!(small, during);
    c.a.backend().release_stream(s3).unwrap();
    c.a.backend().release_stream(s2).unwrap();
}

#[test]
fn no_split_pools_hand_blocks_out_whole() {
    // spec 1.7 / 1.14: MemPool(no_split=True) (setNoSplit): a block of the
    // pool is never split; a second 4 MiB request gets a segment of its own
    // (upstream's test_mempool_no_split), where a plain pool splits the
    // first 20 MiB segment. In every mode a user can turn on.
    for conf in ["", "expandable_segments:True", "policy:reservoir"] {
        let c = Checked::new(conf, 80 * GIB);
        c.a.backend().register_stream(S1);
        let plain = MempoolId(2, 0);
        for pool in [P, plain] {
            c.a.begin_allocate_to_pool(pool, PoolFilter::Stream(S1))
                .unwrap();
            c.a.end_allocate_to_pool(pool).unwrap();
        }
        c.a.set_no_split(P).unwrap();
        let mut held = Vec::new();
        for pool in [P, plain] {
            c.a.begin_allocate_to_pool(pool, PoolFilter::Stream(S1))
                .unwrap();
            held.push(c.alloc_on(4 * MIB, S1));
            held.push(c.alloc_on(4 * MIB, S1));
            c.a.end_allocate_to_pool(pool).unwrap();
            c.check();
        }
        let segs = c.a.pool_segments(P);
        if conf.is_empty() {
            assert!(
                segs.len() > c.a.pool_segments(plain).len(),
                "{conf:?}: {} vs {}",
                segs.len(),
                c.a.pool_segments(plain).len()
            );
            assert!(
                segs.iter().all(|s| s.blocks.len() == 1),
                "{conf:?}: {segs:?}"
            );
        } else {
            // Expandable segments map what a request needs, so a block
            // never has a remainder to split off; the pool's blocks are
            // exactly the two allocations, as natively.
            let blocks: Vec<_> = segs.iter().flat_map(|s| &s.blocks).collect();
            assert_eq!(blocks.len(), 2, "{conf:?}: {segs:?}");
            assert!(
                blocks
                    .iter()
                    .all(|b| b.state == BlockState::ActiveAllocated),
                "{conf:?}: {segs:?}"
            );
        }
        // An unknown pool is refused and changes nothing.
        let before = c.flat();
        assert!(c.a.set_no_split(MempoolId(7, 7)).is_err());
        assert_eq!(c.flat(), before);
        for p in held {
            c.free(p);
        }
        c.check();
    }
}

#[test]
fn checkpoint_restore_expandable_segment() {
    // spec 1.15 with expandable segments: the checkpoint holds every block of
    // the segment, the trailing unmapped one too; restoring skips that one
    // (PyTorch's setSegmentStateToCheckpoint) instead of refusing the
    // checkpoint (torch's TestBlockStateAbsorption, issue 40).
    let c = Checked::new("expandable_segments:True", 80 * GIB);
    c.a.backend().register_stream(S1);
    c.a.begin_allocate_to_pool(P, PoolFilter::Stream(S1))
        .unwrap();
    let a = c.alloc_on(4 * MIB, S1);
    let b = c.alloc_on(6 * MIB, S1);
    let d = c.alloc_on(2 * MIB, S1);
    c.free(b);
    let cp = c.a.checkpoint_pool(P).unwrap();
    let at_checkpoint = c.a.pool_segments(P);
    assert!(at_checkpoint.iter().any(|s| s.expandable()));
    // diverge
    c.free(a);
    let e = c.alloc_on(7 * MIB, S1);
    assert_ne!(c.a.pool_segments(P), at_checkpoint);
    let rr = c.a.restore_pool_checkpoint(&cp).unwrap();
    c.check();
    let mut freed = rr.allocations_freed.clone();
    freed.sort();
    let mut want = vec![d, e];
    want.sort();
    assert_eq!(freed, want);
    let mut created = rr.allocations_created.clone();
    created.sort();
    let mut want = vec![a, d];
    want.sort();
    assert_eq!(created, want);
    let shape = |segs: &[Segment]| -> Vec<Vec<(Option<u64>, u64, BlockState)>> {
        segs.iter()
            .map(|s| {
                s.blocks
                    .iter()
                    .map(|b| (b.address, b.size, b.state))
                    .collect()
            })
            .collect()
    };
    assert_eq!(shape(&c.a.pool_segments(P)), shape(&at_checkpoint));
    for p in rr.allocations_created {
        c.free(p);
    }
    c.a.end_allocate_to_pool(P).unwrap();
}

#[test]
fn use_on_oom_pools_serve_allocations_that_would_oom() {
    // spec 1.5 try_mempool_fallback (MemPool(use_on_oom=True), setUseOnOOM):
    // upstream's test_mempool_limited_memory_with_allocator without the
    // allocator. An allocation outside every pool that finds no new memory
    // takes a free block of a use-on-OOM pool (never of another pool), the
    // block goes back to that pool when freed, and the pool still serves
    // its own allocations. In every mode a user can turn on.
    for conf in ["", "expandable_segments:True", "policy:reservoir"] {
        let c = Checked::new(conf, 80 * MIB);
        let (other, oom) = (MempoolId(2, 0), P);
        for pool in [other, oom] {
            c.a.begin_allocate_to_pool(pool, PoolFilter::current_thread())
                .unwrap();
            c.a.end_allocate_to_pool(pool).unwrap();
        }
        c.a.set_use_on_oom(oom, true).unwrap();
        let in_pool = |pool: MempoolId, size: u64| {
            c.a.begin_allocate_to_pool(pool, PoolFilter::current_thread())
                .unwrap();
            let p = c.alloc(size);
            c.a.end_allocate_to_pool(pool).unwrap();
            p
        };
        let a = in_pool(other, 40 * MIB);
        let b = in_pool(oom, 40 * MIB);
        assert!(
            c.try_alloc(40 * MIB).is_err(),
            "{conf:?}: the device is full"
        );
        c.free(a);
        c.free(b);
        let ooms = c.stats().num_ooms;
        let c1 = c
            .try_alloc(30 * MIB)
            .unwrap_or_else(|e| panic!("{conf:?}: {e}"));
        assert_eq!(c1, b, "{conf:?}: the use-on-OOM pool's block serves it");
        assert_eq!(c.stats().num_ooms, ooms, "{conf:?}: no OOM counted");
        assert_eq!(c.a.pool_segments(oom).len(), 1, "{conf:?}");
        assert!(
            c.try_alloc(30 * MIB).is_err(),
            "{conf:?}: the other pool's free block is never borrowed"
        );
        c.check();
        c.free(c1);
        // The block went back to its pool, which still serves its own.
        let e = in_pool(oom, 20 * MIB);
        assert_eq!(e, c1, "{conf:?}");
        c.free(e);
        // Unmarked: out of memory again; marking an unknown pool is refused
        // and changes nothing, unmarking one is accepted.
        c.a.set_use_on_oom(oom, false).unwrap();
        assert!(c.try_alloc(30 * MIB).is_err(), "{conf:?}: unmarked");
        let before = c.flat();
        let e = c.a.set_use_on_oom(MempoolId(7, 7), true).unwrap_err();
        assert!(e.to_string().contains("unknown private pool"), "{e}");
        assert_eq!(c.flat(), before);
        c.a.set_use_on_oom(MempoolId(7, 7), false).unwrap();
        // A pool allocating to itself never borrows (torch: "if already
        // trying to use a mempool, then just oom").
        c.a.set_use_on_oom(oom, true).unwrap();
        let third = MempoolId(3, 0);
        c.a.begin_allocate_to_pool(third, PoolFilter::current_thread())
            .unwrap();
        assert!(c.try_alloc(30 * MIB).is_err(), "{conf:?}: inside a pool");
        c.a.end_allocate_to_pool(third).unwrap();
        c.check();
    }
}

/// A pool allocator (`CUDAPluggableAllocator`'s alloc/free) over a range of
/// addresses of its own: counts its calls, refuses when `full`.
struct PoolSource {
    next: std::sync::atomic::AtomicU64,
    allocs: std::sync::atomic::AtomicU64,
    frees: std::sync::atomic::AtomicU64,
    full: std::sync::atomic::AtomicBool,
}

fn pool_source() -> (
    std::sync::Arc<PoolSource>,
    std::sync::Arc<reservoir::pluggable::PluggableAllocator>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;
    let src = Arc::new(PoolSource {
        next: 0x7f00_0000_0000.into(),
        allocs: 0.into(),
        frees: 0.into(),
        full: false.into(),
    });
    let (a, f) = (src.clone(), src.clone());
    let alloc: reservoir::pluggable::AllocFn = Arc::new(move |size, _device, _stream| {
        if a.full.load(SeqCst) {
            return None; // a null: out of memory
        }
        a.allocs.fetch_add(1, SeqCst);
        Some(reservoir::DevicePtr(a.next.fetch_add(size, SeqCst)))
    });
    let free: reservoir::pluggable::FreeFn = Arc::new(move |_ptr, _size, _device, _stream| {
        f.frees.fetch_add(1, SeqCst);
    });
    (
        src,
        Arc::new(reservoir::pluggable::PluggableAllocator::new(alloc, free)),
    )
}

#[test]
fn a_pool_with_its_own_allocator_caches_its_segments() {
    // spec 1.14 createOrIncrefPool(id, allocator) (MemPool(allocator=...)),
    // upstream's test_mempool_with_allocator: the pool's segments come from
    // its allocator (never expandable), Reservoir caches its blocks (two
    // 1 MiB tensors share one 2 MiB segment, a third needs another), other
    // allocations never reach it, and its segments go back to it once the
    // pool is released and emptied. In every mode a user can turn on.
    use std::sync::atomic::Ordering::SeqCst;
    for conf in ["", "expandable_segments:True", "policy:reservoir"] {
        let c = Checked::new(conf, 80 * GIB);
        let (src, alloc) = pool_source();
        c.a.create_or_incref_pool_with_allocator(P, alloc.clone())
            .unwrap();
        assert_eq!(c.a.pool_use_count(P), 1);
        assert_eq!(
            src.allocs.load(SeqCst),
            0,
            "{conf:?}: nothing allocated yet"
        );
        c.a.begin_allocate_to_pool(P, PoolFilter::current_thread())
            .unwrap();
        let x0 = c.alloc(MIB);
        assert_eq!(src.allocs.load(SeqCst), 1, "{conf:?}");
        assert!(x0.0 >= 0x7f00_0000_0000, "{conf:?}: {x0}");
        let x1 = c.alloc(MIB / 2);
        assert_eq!(c.a.pool_segments(P).len(), 1, "{conf:?}: cached");
        let x2 = c.alloc(MIB);
        assert_eq!(c.a.pool_segments(P).len(), 2, "{conf:?}");
        let big = c.alloc(30 * MIB);
        assert_eq!(src.allocs.load(SeqCst), 3, "{conf:?}");
        assert!(
            c.a.pool_segments(P)
                .iter()
                .all(|s| s.is_expandable != Some(true)),
            "{conf:?}: never an expandable segment"
        );
        // A null from the allocator is out of memory, and changes nothing.
        src.full.store(true, SeqCst);
        let before = c.flat();
        assert!(c.try_alloc(50 * MIB).is_err(), "{conf:?}");
        assert_eq!(c.flat().get("num_ooms"), Some(&(before["num_ooms"] + 1)));
        src.full.store(false, SeqCst);
        c.a.end_allocate_to_pool(P).unwrap();
        c.a.release_pool(P).unwrap(); // use_mem_pool's use
        let outside = c.alloc(MIB);
        assert!(
            outside.0 < 0x7f00_0000_0000,
            "{conf:?}: not the pool's allocator"
        );
        assert_eq!(src.allocs.load(SeqCst), 3, "{conf:?}");
        c.check();
        // A second use keeps the first allocator; a pool without one cannot take one.
        let (_, other) = pool_source();
        c.a.create_or_incref_pool_with_allocator(P, other.clone())
            .unwrap();
        assert_eq!(c.a.pool_use_count(P), 2);
        c.a.release_pool(P).unwrap();
        let plain = MempoolId(2, 0);
        c.a.begin_allocate_to_pool(plain, PoolFilter::current_thread())
            .unwrap();
        c.a.end_allocate_to_pool(plain).unwrap();
        let before = c.flat();
        let e =
            c.a.create_or_incref_pool_with_allocator(plain, other)
                .unwrap_err();
        assert!(e.to_string().contains("without an allocator"), "{e}");
        assert_eq!((c.flat(), c.a.pool_use_count(plain)), (before, 1));
        // Released and emptied: every segment back to the allocator, which
        // the pool held alive until then.
        for p in [x0, x1, x2, big, outside] {
            c.free(p);
        }
        c.a.release_pool(P).unwrap();
        let live = std::sync::Arc::strong_count(&alloc);
        assert!(live > 1, "{conf:?}: the pool holds its allocator");
        c.empty_cache();
        assert_eq!(src.frees.load(SeqCst), 3, "{conf:?}");
        assert_eq!(alloc.live(), 0, "{conf:?}");
        assert_eq!(
            std::sync::Arc::strong_count(&alloc),
            1,
            "{conf:?}: dropped with the pool"
        );
        c.check();
    }
}
