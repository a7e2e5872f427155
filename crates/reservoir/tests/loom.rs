//! loom models of every hand-off point of `StreamShards` (issue 16
//! deliverable 3): shard creation, a free from another thread into a
//! thread's shard, the out-of-memory reclaim of other shards while they
//! allocate, `empty_cache` concurrent with allocation, and history
//! settings handed to a shard being created. loom explores
//! every interleaving of the shards' locks and slots (see `src/sync.rs`);
//! each model ends by checking every shard's invariants and the counters.
//!
//! Run with `cargo test -p reservoir --features loom --test loom --release`.
#![cfg(feature = "loom")]

use std::sync::Arc;

use loom::thread;
use reservoir::caching::{HistoryConfig, StreamShards};
use reservoir::observe::trace::TraceAction;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocError, AllocatorConfig, DevicePtr, StreamId};

const MIB: u64 = 1 << 20;

/// Stack of every modelled thread: loom's own default (32 KiB) is too small
/// for an allocator call.
const STACK: usize = 4 << 20;

/// `loom::model` with the body on a thread with a [`STACK`]-byte stack.
fn model(body: impl Fn() + Send + Sync + 'static) {
    let body = Arc::new(body);
    loom::model(move || {
        let body = body.clone();
        spawn(move || body()).join().unwrap();
    });
}

/// A modelled thread with a [`STACK`]-byte stack.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new().stack_size(STACK).spawn(f).unwrap()
}

fn shards(capacity: u64, max_streams: usize) -> Arc<StreamShards<SimDevice>> {
    let dev = SimDevice::new(SimConfig {
        capacity,
        ..SimConfig::default()
    });
    // The models allocate on streams 1 to 3: streams of the device, as the
    // allocator checks (an unknown stream is refused).
    for id in 1..=3 {
        dev.register_stream(StreamId(id));
    }
    Arc::new(
        StreamShards::with_max_streams(dev, AllocatorConfig::default(), 0, max_streams).unwrap(),
    )
}

/// Every shard's invariants hold and nothing is left allocated.
fn check_all_freed(s: &StreamShards<SimDevice>) {
    s.check_invariants().unwrap();
    let st = s.stats();
    assert_eq!(st.allocation.all().current, 0);
    assert_eq!(st.allocated_bytes.all().current, 0);
    assert_eq!(
        st.allocation.all().allocated,
        st.allocation.all().freed,
        "every allocation counted once and freed once"
    );
}

#[test]
fn two_threads_create_the_same_streams_shard_once() {
    model(|| {
        let s = shards(1 << 30, 4);
        let t = {
            let s = s.clone();
            spawn(move || s.raw_alloc(4096, StreamId(1)).unwrap())
        };
        let a = s.raw_alloc(4096, StreamId(1)).unwrap();
        let b = t.join().unwrap();
        assert_ne!(a, b);
        assert_eq!(s.streams(), [StreamId(1)], "one shard for the stream");
        s.raw_free(a).unwrap();
        s.raw_free(b).unwrap();
        check_all_freed(&s);
    });
}

#[test]
fn colliding_streams_get_distinct_slots() {
    // With 2 slots, streams 0 and 2 both start at slot 0: the second to
    // arrive probes on, whichever it is.
    model(|| {
        let s = shards(1 << 30, 2);
        let t = {
            let s = s.clone();
            spawn(move || {
                let p = s.raw_alloc(512, StreamId(2)).unwrap();
                s.raw_free(p).unwrap();
            })
        };
        let p = s.raw_alloc(512, StreamId(0)).unwrap();
        s.raw_free(p).unwrap();
        t.join().unwrap();
        assert_eq!(s.streams(), [StreamId(0), StreamId(2)]);
        // A third stream has no slot left: a typed error.
        assert!(matches!(
            s.raw_alloc(512, StreamId(1)),
            Err(AllocError::InvalidArgument(_))
        ));
        check_all_freed(&s);
    });
}

#[test]
fn a_free_from_another_thread_lands_in_the_owning_shard() {
    model(|| {
        let s = shards(1 << 30, 4);
        let p = s.raw_alloc(MIB, StreamId(1)).unwrap();
        let t = {
            let s = s.clone();
            // This thread's own shard is stream 2's; p belongs to stream 1's.
            spawn(move || {
                let q = s.raw_alloc(MIB, StreamId(2)).unwrap();
                s.raw_free(DevicePtr(p.0)).unwrap();
                s.raw_free(q).unwrap();
            })
        };
        // Meanwhile the owner keeps allocating on stream 1.
        let r = s.raw_alloc(MIB, StreamId(1)).unwrap();
        s.raw_free(r).unwrap();
        t.join().unwrap();
        check_all_freed(&s);
        assert!(matches!(
            s.raw_free(p),
            Err(AllocError::InvalidPointer { .. })
        ));
    });
}

#[test]
fn out_of_memory_reclaims_other_shards_while_they_allocate() {
    // 48 MiB device. Stream 1 caches a 40 MiB segment, then allocates and
    // frees 512 bytes (a 2 MiB small-pool segment, spec 1.3); stream 2
    // needs 40 MiB: it must empty stream 1's cache while stream 1 works.
    // Whatever the interleaving: no deadlock, no lost block, and 40 + 2 MiB
    // fit, so no out-of-memory error.
    model(|| {
        let s = shards(48 * MIB, 4);
        let big = s.raw_alloc(40 * MIB, StreamId(1)).unwrap();
        s.raw_free(big).unwrap();
        let t = {
            let s = s.clone();
            spawn(move || {
                let p = s.raw_alloc(512, StreamId(1)).unwrap();
                s.raw_free(p).unwrap();
            })
        };
        let q = s.raw_alloc(40 * MIB, StreamId(2)).unwrap();
        t.join().unwrap();
        assert_eq!(s.stats().num_ooms, 0);
        s.raw_free(q).unwrap();
        check_all_freed(&s);
    });
}

#[test]
fn an_out_of_memory_race_ends_in_success_or_one_reported_error() {
    // 64 MiB device: both streams want 40 MiB; stream 1's is cached
    // first. Exactly one of them can hold it at a time.
    model(|| {
        let s = shards(64 * MIB, 4);
        let warm = s.raw_alloc(40 * MIB, StreamId(1)).unwrap();
        s.raw_free(warm).unwrap();
        let t = {
            let s = s.clone();
            spawn(move || {
                let r = s.raw_alloc(40 * MIB, StreamId(1));
                if let Ok(p) = &r {
                    s.raw_free(*p).unwrap();
                }
                r.is_ok()
            })
        };
        let r = s.raw_alloc(40 * MIB, StreamId(2));
        let ok2 = r.is_ok();
        if let Ok(p) = r {
            s.raw_free(p).unwrap();
        }
        let ok1 = t.join().unwrap();
        let failures = u64::from(!ok1) + u64::from(!ok2);
        assert!(ok1 || ok2, "one of them fits");
        assert_eq!(
            s.stats().num_ooms as u64,
            failures,
            "each failure reported once"
        );
        check_all_freed(&s);
    });
}

#[test]
fn empty_cache_concurrent_with_allocation() {
    model(|| {
        let s = shards(1 << 30, 4);
        let p = s.raw_alloc(MIB, StreamId(1)).unwrap();
        s.raw_free(p).unwrap();
        let t = {
            let s = s.clone();
            spawn(move || s.empty_cache().unwrap())
        };
        let q = s.raw_alloc(MIB, StreamId(1)).unwrap();
        let r = s.raw_alloc(MIB, StreamId(2)).unwrap();
        t.join().unwrap();
        s.check_invariants().unwrap();
        // The live blocks' segments survive; only free segments went.
        assert_eq!(s.segments().len(), 2);
        s.raw_free(q).unwrap();
        s.raw_free(r).unwrap();
        s.empty_cache().unwrap();
        assert_eq!(s.stats().reserved_bytes.all().current, 0);
        check_all_freed(&s);
    });
}

#[test]
fn history_turned_on_while_a_shard_is_created_reaches_it() {
    // The history settings are handed to shards created later: whichever
    // comes first, the new stream's shard records once recording is on.
    model(|| {
        let s = shards(1 << 30, 4);
        let t = {
            let s = s.clone();
            spawn(move || {
                let p = s.raw_alloc(512, StreamId(3)).unwrap();
                s.raw_free(p).unwrap();
            })
        };
        s.record_memory_history(HistoryConfig::events_only(1000));
        t.join().unwrap();
        let p = s.raw_alloc(512, StreamId(3)).unwrap();
        let recorded = s
            .history()
            .iter()
            .any(|e| e.action == TraceAction::Alloc && e.addr == p.0);
        assert!(recorded, "the shard of stream 3 records");
        s.raw_free(p).unwrap();
        check_all_freed(&s);
    });
}
