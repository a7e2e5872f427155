//! `StreamShards`: one lock per stream (issue 16 deliverable 3). Each shard
//! is PyTorch mode for its stream (spec 1.5-1.10); what differs is stated in
//! `caching/shards.rs` and checked here.

use reservoir::caching::{StreamShards, StreamShardsError};
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocError, AllocatorConfig, Backend, DevicePtr, StreamId};

const MIB: u64 = 1 << 20;

fn shards_with_capacity(capacity: u64) -> StreamShards<SimDevice> {
    let dev = SimDevice::new(SimConfig {
        capacity,
        ..SimConfig::default()
    });
    with_streams(&dev, [1, 2, 3]);
    StreamShards::new(dev, AllocatorConfig::default()).unwrap()
}

/// Make streams `ids` known to `dev` (streams are checked, issue 29).
fn with_streams(dev: &SimDevice, ids: impl IntoIterator<Item = u64>) {
    for id in ids {
        dev.register_stream(StreamId(id));
    }
}

#[test]
fn each_stream_gets_its_own_shard_and_frees_find_their_owner() {
    let s = shards_with_capacity(1 << 30);
    let a = s.raw_alloc(MIB, StreamId(1)).unwrap();
    let b = s.raw_alloc(MIB, StreamId(2)).unwrap();
    let c = s.raw_alloc(MIB, StreamId(1)).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(s.streams(), [StreamId(1), StreamId(2)]);
    // spec 1.6: a segment serves one stream, so two streams have two segments.
    let segs = s.segments();
    assert_eq!(segs.len(), 2);
    assert!(segs.iter().any(|g| g.stream == StreamId(1)));
    // Frees from this thread whose last shard is stream 1's find stream 2's block too.
    s.raw_free(b).unwrap();
    std::thread::scope(|t| {
        t.spawn(|| s.raw_free(a).unwrap());
    });
    s.raw_free(c).unwrap();
    s.check_invariants().unwrap();
    let st = s.stats();
    assert_eq!(st.allocation.all().current, 0);
    assert_eq!(st.allocation.all().allocated, 3);
    assert_eq!(st.allocation.all().freed, 3);
    // Peaks: the sum of the shards' peaks (stream 1 had 2, stream 2 had 1).
    assert_eq!(st.allocation.all().peak, 3);
    assert_eq!(s.shard_stats()[0].1.allocation.all().peak, 2);
}

#[test]
fn a_foreign_or_double_free_is_typed_and_changes_nothing() {
    let s = shards_with_capacity(1 << 30);
    let a = s.raw_alloc(4096, StreamId(0)).unwrap();
    let _b = s.raw_alloc(4096, StreamId(3)).unwrap();
    let before = (s.stats(), s.segments());
    let foreign = DevicePtr(a.0 + 1);
    assert!(matches!(
        s.raw_free(foreign),
        Err(AllocError::InvalidPointer { ptr }) if ptr == foreign
    ));
    assert!(matches!(
        s.record_stream(foreign, StreamId(3)),
        Err(AllocError::InvalidPointer { .. })
    ));
    assert_eq!((s.stats(), s.segments()), before);
    s.raw_free(a).unwrap();
    let before = (s.stats(), s.segments());
    assert!(matches!(
        s.raw_free(a),
        Err(AllocError::InvalidPointer { .. })
    ));
    assert_eq!((s.stats(), s.segments()), before);
    s.check_invariants().unwrap();
}

#[test]
fn out_of_memory_empties_the_other_shards_caches_first() {
    // spec 1.5: the last attempt of malloc releases every cached block
    // before failing; here the other streams' shards are emptied first.
    let s = shards_with_capacity(64 * MIB);
    let p = s.raw_alloc(40 * MIB, StreamId(1)).unwrap();
    s.raw_free(p).unwrap(); // cached in stream 1's shard
    assert_eq!(s.stats().reserved_bytes.all().current, 40 * MIB as i64);
    let q = s.raw_alloc(40 * MIB, StreamId(2)).unwrap();
    let st = s.stats();
    assert_eq!(st.num_ooms, 0, "the reclaim is not an out-of-memory error");
    assert_eq!(st.reserved_bytes.all().current, 40 * MIB as i64);
    assert_eq!(s.segments()[0].stream, StreamId(2));
    s.check_invariants().unwrap();
    // A request nothing can satisfy fails once, reported once.
    let e = s.raw_alloc(40 * MIB, StreamId(1)).unwrap_err();
    assert!(e.as_oom().is_some(), "{e}");
    assert_eq!(s.stats().num_ooms, 1);
    s.raw_free(q).unwrap();
    s.check_invariants().unwrap();
}

#[test]
fn settings_it_cannot_honour_are_refused_naming_them() {
    let mut config = AllocatorConfig::default();
    config.per_process_memory_fraction = 0.5;
    let e = StreamShards::new(SimDevice::default(), config)
        .err()
        .unwrap();
    assert_eq!(e, StreamShardsError::MemoryFraction(0.5));
    assert!(e.to_string().contains("per_process_memory_fraction 0.5"));
    let e = StreamShards::with_max_streams(SimDevice::default(), AllocatorConfig::default(), 0, 0)
        .err()
        .unwrap();
    assert_eq!(e, StreamShardsError::NoStreams);
}

#[test]
fn more_streams_than_slots_is_a_typed_error_that_changes_nothing() {
    let dev = SimDevice::default();
    with_streams(&dev, [0x7f00_dead_beef, 1, 7]);
    let s = StreamShards::with_max_streams(dev, AllocatorConfig::default(), 0, 2).unwrap();
    let big = StreamId(0x7f00_dead_beef); // a stream handle that is an address
    let a = s.raw_alloc(512, big).unwrap();
    let b = s.raw_alloc(512, StreamId(1)).unwrap();
    let before = s.stats();
    let e = s.raw_alloc(512, StreamId(7)).unwrap_err();
    assert!(
        matches!(&e, AllocError::InvalidArgument(m) if m.contains("stream 7") && m.contains("max_streams")),
        "{e}"
    );
    assert_eq!(s.stats(), before);
    s.raw_free(a).unwrap();
    s.raw_free(b).unwrap();
    assert_eq!(s.streams(), [StreamId(1), big]);
    s.check_invariants().unwrap();
}

#[test]
fn cross_stream_frees_wait_for_the_using_stream() {
    // spec 1.10: a block used on another stream is reused only after that
    // stream's work completes; the owning shard polls its events.
    let dev = SimDevice::default();
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let s = StreamShards::new(dev, AllocatorConfig::default()).unwrap();
    let p = s.raw_alloc(MIB, s1).unwrap();
    s.record_stream(p, s2).unwrap();
    s.backend().hold_stream(s2).unwrap();
    s.raw_free(p).unwrap();
    assert_eq!(s.stats().active.all().current, 1, "pending on stream 2");
    let q = s.raw_alloc(MIB, s1).unwrap();
    assert_ne!(q, p);
    s.backend().release_stream(s2).unwrap();
    let r = s.raw_alloc(MIB, s1).unwrap();
    assert_eq!(r, p);
    s.check_invariants().unwrap();
    s.empty_cache().unwrap();
    s.raw_free(q).unwrap();
    s.raw_free(r).unwrap();
    s.empty_cache().unwrap();
    assert_eq!(s.stats().reserved_bytes.all().current, 0);
    s.check_invariants().unwrap();
}

#[test]
fn history_and_snapshots_cover_every_shard() {
    // spec 2.2-2.5: one snapshot of the device lists every segment in
    // address order and the whole history, with one `snapshot` entry per call.
    use reservoir::caching::HistoryConfig;
    use reservoir::observe::trace::TraceAction;
    let s = shards_with_capacity(1 << 30);
    let a = s.raw_alloc(MIB, StreamId(1)).unwrap(); // shard created before recording
    s.record_memory_history(HistoryConfig::events_only(1000));
    let b = s.raw_alloc(3 * MIB, StreamId(1)).unwrap();
    let c = s.raw_alloc(512, StreamId(2)).unwrap(); // shard created while recording
    s.raw_free(b).unwrap();
    let snap = s.snapshot();
    snap.check_consistency().unwrap();
    let addrs: Vec<u64> = snap.segments.iter().map(|g| g.address).collect();
    let mut sorted = addrs.clone();
    sorted.sort_unstable();
    assert_eq!(addrs, sorted, "segments in address order");
    assert_eq!(snap.segments.len(), 3, "{addrs:x?}");
    let trace = &snap.device_traces[0];
    let allocs: Vec<u64> = trace
        .iter()
        .filter(|e| e.action == TraceAction::Alloc)
        .map(|e| e.addr)
        .collect();
    assert_eq!(allocs, [b.0, c.0], "both shards' allocations, in order");
    // Each call's `snapshot` entry shows from the next snapshot on, once.
    let snapshots = |trace: &[reservoir::observe::trace::TraceEntry]| {
        trace
            .iter()
            .filter(|e| e.action == TraceAction::Snapshot)
            .count()
    };
    assert_eq!(snapshots(trace), 0);
    assert_eq!(snapshots(&s.history()), 1, "one entry for one call");
    assert_eq!(s.history().len(), trace.len() + 1);
    assert_eq!(snapshots(&s.snapshot().device_traces[0]), 1);
    s.raw_free(a).unwrap();
    s.raw_free(c).unwrap();
    s.check_invariants().unwrap();
}

#[test]
fn reserved_peak_is_the_devices_and_other_peaks_add_up() {
    // spec 1.12: reserved_bytes grows and shrinks with driver calls only.
    // Two streams reserve 40 MiB one after the other: the device never
    // held more than 40 MiB, which the reserved peak says exactly (as one
    // CachingAllocator does); allocated_bytes' peak is the sum of the
    // shards' peaks, 80 MiB, an upper bound.
    let run =
        |alloc: &dyn Fn(u64, StreamId) -> DevicePtr, free: &dyn Fn(DevicePtr), empty: &dyn Fn()| {
            for stream in [StreamId(1), StreamId(2)] {
                let p = alloc(40 * MIB, stream);
                free(p);
                empty();
            }
        };
    let s = shards_with_capacity(1 << 30);
    run(
        &|n, st| s.raw_alloc(n, st).unwrap(),
        &|p| s.raw_free(p).unwrap(),
        &|| s.empty_cache().unwrap(),
    );
    let dev = SimDevice::default();
    with_streams(&dev, [1, 2]);
    let one = reservoir::CachingAllocator::new(dev, AllocatorConfig::default());
    run(
        &|n, st| one.raw_alloc(n, st).unwrap(),
        &|p| one.raw_free(p).unwrap(),
        &|| one.empty_cache().unwrap(),
    );
    let (sharded, single) = (s.stats(), one.stats());
    assert_eq!(
        sharded.reserved_bytes, single.reserved_bytes,
        "exact, peaks included"
    );
    assert_eq!(single.reserved_bytes.all().peak, 40 * MIB as i64);
    assert_eq!(single.allocated_bytes.all().peak, 40 * MIB as i64);
    assert_eq!(
        sharded.allocated_bytes.all().peak,
        80 * MIB as i64,
        "sum of peaks"
    );
    assert_eq!(
        sharded.allocated_bytes.all().allocated,
        single.allocated_bytes.all().allocated
    );
    s.reset_peak_stats();
    assert_eq!(s.stats().reserved_bytes.all().peak, 0);
    s.check_invariants().unwrap();
}
